#!/usr/bin/env python3
"""mlx-lm (pinned 0.32.2) as the teacher for `mlx-bun eval`.

Usage:
    .venv/bin/python scripts/mlx_lm_eval.py perplexity --model DIR --text FILE [--ctx N] > OUT.json
    .venv/bin/python scripts/mlx_lm_eval.py dump --model DIR --text FILE --out DIR
        [--ctx N] [--n N] [--top-k K] [--chunk C]

Both tokenize the text as `mlx-bun eval` does (tokenizer.encode(text), the tokenizer's special
tokens added) and cut it into consecutive windows of --ctx tokens, dropping the remainder, as
mlx_lm.perplexity's load_data does.

perplexity: mlx_lm.perplexity.eval_ppl itself on those windows (each window's first ctx-1 tokens
    forwarded at once, cross-entropy in float32 against the next tokens), printed as JSON:
    {model, text_sha256, ctx, tokens, windows, perplexity, standard_error, mlx_lm_version}.

dump: the format-1 teacher-logits dump mlx-bun's eval README defines (the same layout
    `mlx-bun eval dump` writes and `mlx-bun eval kl --reference-logits` reads):
      manifest.json  {format_version: 1, model, corpus_sha256, ctx_len, n_seqs, top_k,
                      positions_per_seq, created, notes, vocab_size}
      tokens.bin     int32 LE [n_seqs][ctx_len]
      seq-<i>.bin    per position r = 0..ctx_len-2 (the distribution over token r+1):
                     int32[top_k] indices by descending logit (ties: lower id first),
                     float16[top_k] logits, float32 full-vocab logsumexp
    vocab_size is an addition to the seed's manifest, so that a reader can refuse a candidate
    of another vocabulary. Each window is forwarded --chunk tokens at a time through an mlx-lm
    KV cache (the serving path), logits cast to float32 before the logsumexp and the top-k.
"""
import argparse
import datetime
import hashlib
import importlib.metadata as md
import io
import json
import os
import sys
from contextlib import redirect_stdout

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def windows(tokenizer, text, ctx, n=None):
    ids = list(tokenizer.encode(text))
    count = len(ids) // ctx
    if n is not None:
        count = min(count, n)
    if count == 0:
        sys.exit(f"the text has {len(ids)} tokens, fewer than one window of {ctx}")
    return [ids[i * ctx : (i + 1) * ctx] for i in range(count)], len(ids)


def perplexity(a, model, tokenizer, text):
    import mlx.core as mx
    from mlx_lm.perplexity import eval_ppl

    wins, total = windows(tokenizer, text, a.ctx)
    # eval_ppl prints its progress on stdout; the JSON is all this command prints there.
    with redirect_stdout(io.StringIO()):
        ppl, se = eval_ppl(model, mx.array(wins), batch_size=1)
    return {"model": a.model, "text_sha256": hashlib.sha256(text.encode()).hexdigest(), "ctx": a.ctx,
            "tokens": total, "windows": len(wins), "perplexity": ppl, "standard_error": se,
            "mlx_lm_version": md.version("mlx-lm")}


def dump(a, model, tokenizer, text):
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache

    wins, _ = windows(tokenizer, text, a.ctx, a.n)
    os.makedirs(a.out, exist_ok=True)
    np.asarray(wins, dtype="<i4").tofile(os.path.join(a.out, "tokens.bin"))
    vocab = None
    for s, win in enumerate(wins):
        cache = make_prompt_cache(model)
        inputs = win[:-1]
        with open(os.path.join(a.out, f"seq-{s}.bin"), "wb") as f:
            for start in range(0, len(inputs), a.chunk):
                logits = model(mx.array(inputs[start : start + a.chunk])[None], cache=cache)[0].astype(mx.float32)
                vocab = logits.shape[-1]
                lse = mx.logsumexp(logits, axis=-1)
                idx = mx.argpartition(-logits, kth=a.top_k - 1, axis=-1)[:, : a.top_k]
                vals = mx.take_along_axis(logits, idx, axis=-1)
                mx.eval(lse, idx, vals)
                idx, vals, lse = np.array(idx), np.array(vals), np.array(lse)
                # lexsort's last key is the primary one: descending logit, then ascending id.
                order = np.lexsort((idx, -vals), axis=-1)
                idx = np.take_along_axis(idx, order, axis=-1).astype("<i4")
                vals = np.take_along_axis(vals, order, axis=-1).astype("<f2")
                for r in range(idx.shape[0]):
                    f.write(idx[r].tobytes() + vals[r].tobytes() + lse[r : r + 1].astype("<f4").tobytes())
    manifest = {"format_version": 1, "model": a.model, "corpus_sha256": hashlib.sha256(text.encode()).hexdigest(),
                "ctx_len": a.ctx, "n_seqs": len(wins), "top_k": a.top_k, "positions_per_seq": a.ctx - 1,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "notes": f"teacher: mlx-lm {md.version('mlx-lm')}, chunk {a.chunk}", "vocab_size": vocab}
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("perplexity", "dump"):
        s = sub.add_parser(name)
        s.add_argument("--model", required=True)
        s.add_argument("--text", required=True)
        s.add_argument("--ctx", type=int, default=512)
    d = sub.choices["dump"]
    d.add_argument("--out", required=True)
    d.add_argument("--n", type=int, default=None, help="at most this many windows")
    d.add_argument("--top-k", type=int, default=2048)
    d.add_argument("--chunk", type=int, default=512)
    a = p.parse_args()
    if a.ctx < 2:
        sys.exit("--ctx must be at least 2")

    import mlx_lm

    model, tokenizer = mlx_lm.load(a.model)
    # Bytes as they are (no newline translation): the same text mlx-bun reads and hashes.
    with open(a.text, "rb") as f:
        text = f.read().decode("utf-8")
    result = perplexity(a, model, tokenizer, text) if a.command == "perplexity" else dump(a, model, tokenizer, text)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
