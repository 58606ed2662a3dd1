#!/usr/bin/env python3
"""mlx-lm's side of scripts/bench-batch.js: the same workload through `batch_generate`.

    .venv/bin/python scripts/bench_batch_mlx_lm.py MODEL PROMPT_TOKENS GEN_TOKENS STREAMS...

Prints one JSON line per stream count: {"streams", "tokens", "seconds", "tok_s"} where seconds
is the wall time from submitting every prompt to the last token (EOS does not stop generation).
"""
import json
import sys
import time

import mlx.core as mx
from mlx_lm import batch_generate, load


class NoStop:
    """The loaded tokenizer without end-of-sequence ids, so every row makes all its tokens."""

    eos_token_ids = []

    def decode(self, ids):
        return ""


def main():
    model_path, n_prompt, n_gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    streams = [int(s) for s in sys.argv[4:]]
    model, _ = load(model_path)
    vocab = getattr(model.args, "vocab_size", None) or model.args.text_config["vocab_size"]  # wrappers (qwen3_5) keep it in text_config
    prompts = [[(i * 7919 + 13 + 101 * s) % vocab for i in range(n_prompt)] for s in range(max(streams))]
    batch_generate(model, NoStop(), prompts[:2], max_tokens=4)  # warm-up
    for n in streams:
        t0 = time.perf_counter()
        r = batch_generate(model, NoStop(), prompts[:n], max_tokens=n_gen, return_token_ids=True)
        dt = time.perf_counter() - t0
        tokens = sum(len(t) for t in r.token_ids)
        print(json.dumps({"streams": n, "tokens": tokens, "seconds": dt, "tok_s": tokens / dt}), flush=True)
    mx.clear_cache()


if __name__ == "__main__":
    main()
