#!/usr/bin/env python3
"""Benchmark mlx-bun against its peer on the same machine: mlx-lm 0.32.2 (same libmlx and BLAS)
for a model folder, node-llama-cpp (its prebuilt CPU binary, scripts/peers/) for a GGUF file.

    .venv/bin/python scripts/bench.py [--prompt-tokens 128 2048] [--gen-tokens 256] [--repeats 3]
                                      [--f32-matmuls auto|all|int8|none ...] [--prefill-chunk-size 2048]
                                      [--threads N] MODEL[@PROMPT/GEN]...

For each model and prompt length it runs, each in a fresh process: `mlx-bun bench`
(target/release/mlx-bun), once per `--f32-matmuls` value, and the same workload through the peer
(mlx_lm's generate_step, or node-llama-cpp's sequence evaluation with N threads, default the
machine's CPU count), then prints one table with min/median/max and the ratio mlx-bun / peer.
`MODEL@16/8` sets that model's prompt and generated tokens (a slow layout gets a short workload).
All sides measure alike: TTFT = prompt submitted → first token ready; prefill tok/s = prompt
tokens / TTFT; decode tok/s = generated tokens / time since the first token; peak RSS of the
process. Asserts nothing.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MLX_LM_SIDE = r"""
import json, resource, statistics, sys, time
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
model_path, n_prompt, n_gen, repeats, chunk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
kv = {} if sys.argv[6] == "none" else {"kv_bits": int(sys.argv[6]), "kv_group_size": 64, "quantized_kv_start": int(sys.argv[7])}
model, tok = load(model_path)
vocab = getattr(model.args, "vocab_size", None) or model.args.text_config["vocab_size"]  # wrappers (qwen3_5) keep it in text_config
prompt = mx.array([(i * 7919 + 13) % vocab for i in range(n_prompt)])
def run(n):
    t0 = time.perf_counter(); first = None; count = 0
    for token, _ in generate_step(prompt, model, max_tokens=n, sampler=lambda x: mx.argmax(x, axis=-1),
                                  prefill_step_size=chunk, **kv):
        count += 1
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    return {"ttft": first - t0, "prefill": n_prompt / (first - t0), "decode": count / (end - first) if end > first else 0.0}
run(min(8, n_gen))  # warm-up
runs = [run(n_gen) for _ in range(repeats)]
def series(k):
    v = sorted(r[k] for r in runs)
    return {"min": v[0], "median": v[len(v) // 2], "max": v[-1]}
ttft = series("ttft")
print(json.dumps({"engine": "mlx-lm", "prefill_tps": series("prefill"), "decode_tps": series("decode"),
                  "ttft_ms": {k: v * 1e3 for k, v in ttft.items()},
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


BANDWIDTH = r"""
import time
import numpy as np
a = np.ones(1 << 27, dtype=np.float64)
best = float("inf")
for _ in range(5):
    t0 = time.perf_counter()
    a.sum()
    best = min(best, time.perf_counter() - t0)
print(a.nbytes / best / 1e9)
"""


def bandwidth_gbs():
    """Streaming read bandwidth: the best of 5 sums over a 1 GiB array, in a child process (Linux
    carries a process's peak RSS into the children it starts, which would skew theirs)."""
    return float(subprocess.run([sys.executable, "-c", BANDWIDTH], check=True, capture_output=True, text=True).stdout)


def bytes_per_token(model, context):
    """What one decode step must read at least: every weight, plus the KV cache at `context`."""
    if os.path.isfile(model):
        weights = os.path.getsize(model)
        return weights, weights  # GGUF: KV shape is not in a config.json; weights dominate here
    weights = sum(os.path.getsize(os.path.join(model, f)) for f in os.listdir(model) if f.endswith(".safetensors"))
    with open(os.path.join(model, "config.json")) as f:
        c = json.load(f)
    c = c.get("text_config", c)
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads", c["num_attention_heads"])
    elem = 4 if c.get("torch_dtype") == "float32" else 2
    kv = 2 * c["num_hidden_layers"] * kv_heads * head_dim * context * elem
    return weights, weights + kv


def peer_of(model):
    return "node-llama-cpp" if model.endswith(".gguf") else "mlx-lm"


def run_json(cmd, env):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[128, 2048])
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--f32-matmuls", choices=["auto", "all", "int8", "none"], nargs="+", default=["auto"],
                    help="mlx-bun's f32Matmuls load option, one run per value (the peers compute as stored)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="node-llama-cpp's threads (MLX's CPU backend sizes its own pool)")
    ap.add_argument("--prefill-chunk-size", type=int, default=2048,
                    help="prompt tokens per prefill step, for both engines")
    ap.add_argument("--kv-bits", type=int, nargs="+", default=[None],
                    help="KV cache bits for both engines (group 64), one run per value; 0 = plain")
    ap.add_argument("--quantized-kv-start", type=int, default=0,
                    help="positions before a cache is quantized (mlx-lm's default is 5000)")
    a = ap.parse_args()
    bw = bandwidth_gbs()
    env = dict(os.environ)
    blas = f"/usr/lib/{os.uname().machine}-linux-gnu/libopenblas.so.0"
    py_env = dict(env, HF_HUB_OFFLINE="1")
    if os.path.exists(blas):
        py_env["LD_PRELOAD"] = blas  # the addon links OpenBLAS; give mlx-lm the same BLAS
    binary = os.path.join(ROOT, "target", "release", "mlx-bun")
    rows = []
    for spec in a.models:
        model, _, sizes = spec.partition("@")
        prompts, gen = a.prompt_tokens, a.gen_tokens
        if sizes:
            p, g = sizes.split("/")
            prompts, gen = [int(p)], int(g)
        for n in prompts:
            for bits in a.kv_bits:
                kv = ["--kv-bits", str(bits), "--quantized-kv-start", str(a.quantized_kv_start)] if bits else []
                ours = [run_json([binary, "bench", "--model", model, "--prompt-tokens", str(n),
                                  "--gen-tokens", str(gen), "--repeats", str(a.repeats),
                                  "--f32-matmuls", mm, "--prefill-chunk-size", str(a.prefill_chunk_size)] + kv, env)
                        for mm in a.f32_matmuls]
                if peer_of(model) == "mlx-lm":
                    ref = run_json([sys.executable, "-c", MLX_LM_SIDE, model, str(n), str(gen), str(a.repeats),
                                    str(a.prefill_chunk_size), str(bits) if bits else "none", str(a.quantized_kv_start)], py_env)
                else:
                    assert not bits, "node-llama-cpp runs here with its default KV cache only"
                    ref = run_json(["node", os.path.join(HERE, "peers", "llama-cpp.mjs"), model, str(n), str(gen),
                                    str(a.repeats), str(a.threads)], env)
                name = os.path.basename(model.rstrip("/")) + (f" kv{bits}" if bits else "")
                for mm, o in zip(a.f32_matmuls, ours):
                    rows.append((name + ("" if mm == "auto" else f" f32Matmuls {mm}"), model, n, gen, o, ref))
                print(f"done {name} prompt={n}", file=sys.stderr)
    print("| model | prompt / gen | peer | metric | mlx-bun (min/median/max) | peer (min/median/max) | ratio (median) |")
    print("|" + "---|" * 7)
    for name, model, n, gen, ours, ref in rows:
        peer = peer_of(model)
        for key, label in [("prefill_tps", "prefill tok/s"), ("decode_tps", "decode tok/s"), ("ttft_ms", "TTFT ms")]:
            o, r = ours[key], ref[key]
            fmt = lambda s: f"{s['min']:.1f} / {s['median']:.1f} / {s['max']:.1f}"
            print(f"| {name} | {n} / {gen} | {peer} | {label} | {fmt(o)} | {fmt(r)} | {o['median'] / r['median']:.2f}× |")
        print(f"| {name} | {n} / {gen} | {peer} | peak RSS MB | {ours['peak_rss_mb']:.0f} | {ref['peak_rss_mb']:.0f} | "
              f"{ours['peak_rss_mb'] / ref['peak_rss_mb']:.2f}× |")
    print(f"\nRoofline: streaming read bandwidth {bw:.1f} GB/s (numpy sum over 1 GiB, best of 5).")
    print("| model | prompt | bytes read per decode token | roofline tok/s | mlx-bun % of roofline | peer % of roofline |")
    print("|" + "---|" * 6)
    for name, model, n, gen, ours, ref in rows:
        weights, total = bytes_per_token(model, n + gen // 2)
        roof = bw * 1e9 / total
        pct = lambda s: 100 * s["decode_tps"]["median"] / roof
        print(f"| {name} | {n} | {total / 1e6:.0f} MB ({weights / 1e6:.0f} MB weights) | {roof:.1f} | {pct(ours):.1f} % | {pct(ref):.1f} % |")


if __name__ == "__main__":
    main()
