#!/usr/bin/env python3
"""mlx-lm (pinned 0.32.2) as the teacher for `mlx-bun eval`.

Usage:
    .venv/bin/python scripts/mlx_lm_eval.py perplexity --model DIR --text FILE [--ctx N] > OUT.json
    .venv/bin/python scripts/mlx_lm_eval.py dump --model DIR --text FILE --out DIR
        [--ctx N] [--n N] [--top-k K] [--chunk C]
    .venv/bin/python scripts/mlx_lm_eval.py kl --model DIR --reference-logits DIR
        [--chunk C] [--kv-bits B] > OUT.json

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
    vocab_size is an addition to mlx-bun's manifest, so that a reader can refuse a candidate
    of another vocabulary. Each window is forwarded --chunk tokens at a time through an mlx-lm
    KV cache (the serving path), logits cast to float32 before the logsumexp and the top-k.

kl: mlx-lm as the candidate scored against a dump, as `mlx-bun eval kl` scores ours (the same
    chunks; with --kv-bits, the cache quantized after each model call from the first on, as
    generate_step's maybe_quantize_kv_cache does with quantized_kv_start 0, group 64), printed as
    JSON: {positions, kl: {mean, p95, max}, captured_mass, top1_agreement}.
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

    wins, _ = windows(tokenizer, text, a.ctx, a.n)
    os.makedirs(a.out, exist_ok=True)
    np.asarray(wins, dtype="<i4").tofile(os.path.join(a.out, "tokens.bin"))
    vocab = None
    for s, win in enumerate(wins):
        with open(os.path.join(a.out, f"seq-{s}.bin"), "wb") as f:
            for _, logits in forward_chunks(model, win, a.chunk):
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


def forward_chunks(model, window, chunk, kv_bits=None):
    """Yields (start, float32 logits [n, V]) for window[:-1], chunk tokens a model call."""
    import mlx.core as mx
    from mlx_lm.generate import maybe_quantize_kv_cache
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    inputs = window[:-1]
    for start in range(0, len(inputs), chunk):
        logits = model(mx.array(inputs[start : start + chunk])[None], cache=cache)[0].astype(mx.float32)
        if kv_bits:
            maybe_quantize_kv_cache(cache, quantized_kv_start=0, kv_group_size=64, kv_bits=kv_bits)
        yield start, logits


def kl(a, model):
    import mlx.core as mx
    import numpy as np

    m = json.load(open(os.path.join(a.reference_logits, "manifest.json")))
    k, ctx = m["top_k"], m["ctx_len"]
    tokens = np.fromfile(os.path.join(a.reference_logits, "tokens.bin"), dtype="<i4").reshape(-1, ctx)
    kls, masses, agree = [], [], 0
    for s, window in enumerate(tokens.tolist()):
        raw = np.fromfile(os.path.join(a.reference_logits, f"seq-{s}.bin"), dtype=np.uint8).reshape(-1, k * 6 + 4)
        ids = raw[:, : 4 * k].copy().view("<i4")
        ref = raw[:, 4 * k : 6 * k].copy().view("<f2").astype(np.float32)
        ref_lse = raw[:, 6 * k :].copy().view("<f4")[:, 0]
        for start, logits in forward_chunks(model, window, a.chunk, a.kv_bits):
            lse = mx.logsumexp(logits, axis=-1)
            mx.eval(logits, lse)
            logits, lse = np.array(logits), np.array(lse)
            for r in range(logits.shape[0]):
                p = start + r
                log_p = ref[p] - ref_lse[p]
                log_q = logits[r, ids[p]] - lse[r]
                kls.append(float(np.sum(np.exp(log_p) * (log_p - log_q), dtype=np.float32)))
                masses.append(float(np.sum(np.exp(log_p), dtype=np.float32)))
                agree += int(np.argmax(logits[r]) == ids[p, 0])
    ranked = sorted(kls)
    return {"positions": len(kls), "kv_bits": a.kv_bits, "chunk": a.chunk,
            "kl": {"mean": float(np.mean(kls)), "p95": ranked[max(1, -(-95 * len(ranked) // 100)) - 1], "max": ranked[-1]},
            "captured_mass": float(np.mean(masses)), "top1_agreement": agree / len(kls)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("perplexity", "dump"):
        s = sub.add_parser(name)
        s.add_argument("--model", required=True)
        s.add_argument("--text", required=True)
        s.add_argument("--ctx", type=int, default=512)
    k = sub.add_parser("kl")
    k.add_argument("--model", required=True)
    k.add_argument("--reference-logits", required=True)
    k.add_argument("--chunk", type=int, default=256)
    k.add_argument("--kv-bits", type=int, default=None)
    d = sub.choices["dump"]
    d.add_argument("--out", required=True)
    d.add_argument("--n", type=int, default=None, help="at most this many windows")
    d.add_argument("--top-k", type=int, default=2048)
    d.add_argument("--chunk", type=int, default=256, help="positions per model call (mlx-bun eval's default)")
    a = p.parse_args()
    if a.command != "kl" and a.ctx < 2:
        sys.exit("--ctx must be at least 2")

    import mlx_lm

    model, tokenizer = mlx_lm.load(a.model)
    if a.command == "kl":
        print(json.dumps(kl(a, model), indent=2))
        return
    # Bytes as they are (no newline translation): the same text mlx-bun reads and hashes.
    with open(a.text, "rb") as f:
        text = f.read().decode("utf-8")
    result = perplexity(a, model, tokenizer, text) if a.command == "perplexity" else dump(a, model, tokenizer, text)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
