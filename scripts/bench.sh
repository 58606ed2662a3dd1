#!/usr/bin/env bash
# The benchmark: mlx-bun beside its peer in the same run on every layout a user can load — mlx-lm
# 0.32.2 (same machine, libmlx and BLAS) for model folders, node-llama-cpp (its prebuilt CPU
# binary, as many threads as CPUs) for GGUF files — 3 repeats after a warm-up, with the machine's
# read bandwidth and each engine's share of the decode roofline. Prints tables (scripts/bench.py),
# then continuous batching at 8 streams beside mlx-lm's batch_generate (scripts/bench-batch.js).
#
#   bash scripts/bench.sh           the workload sized to the backend: the full one on Metal;
#                                   on MLX's CPU backend (Linux) one that ends in ~15 minutes on
#                                   2 cores, since its half-precision quantized matmul decodes
#                                   ~1 token/s (slow layouts get shorter prompts and generations)
#   bash scripts/bench.sh --full    prompts of 128 and 2048 tokens, 256 generated, every layout
#   bash scripts/bench.sh ARGS...   scripts/bench.py ARGS on the SmolLM2 4-bit and bf16 folders
#
# Layouts: SmolLM2-135M as f32, bf16 and f16 folders; MLX affine 4- and 8-bit, groups 32 and 64,
# with bf16, f16 and f32 scales (mlx_lm convert from the f32 folder), and the lossless repack of the
# Q4_1 GGUF (4-bit g32, f16 scales, 8-bit embedding); GGUF Q4_0, Q4_1 and Q8_0 (scripts/
# requant_gguf.py writes Q4_0 and Q8_0 from the Q4_1 file) and Gemma-3-270M's K-quant mix
# (Q4_K_M); Gemma-3-270M bf16. Quantized layouts also run with `--f32-matmuls all` and `int8`,
# the opt-in CPU layouts (products in f32; `int8` with x rounded to 8 bits; README "f32Matmuls").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
bash scripts/fixtures.sh >/dev/null
FIX=${MLX_BUN_FIXTURES:-$PWD/fixtures}
GGUF="$FIX/home/models/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_GGUF="$FIX/gemma-3-270m-q4_k_m.gguf"
L="$FIX/bench-layouts"
mkdir -p "$L"
export HF_HUB_OFFLINE=1
PY=.venv/bin/python
BLAS=/usr/lib/$(uname -m)-linux-gnu/libopenblas.so.0
[ -f "$BLAS" ] && export MLX_LM_PRELOAD="$BLAS"

# The peers: gguf-py (ggml's own package) writes the other GGUF block types; node-llama-cpp comes
# from scripts/peers/ (its own lockfile: its every-platform binaries are 725 MB, so it is not one
# of the package's dev dependencies), with the prebuilt binary of this platform only.
"$PY" -c 'import gguf' 2>/dev/null || "$PY" -m pip install -q --disable-pip-version-check gguf==0.19.0
if [ ! -d scripts/peers/node_modules/node-llama-cpp ]; then
  case "$(uname -s)-$(uname -m)" in
    Linux-x86_64) plat=linux-x64 ;; Linux-aarch64) plat=linux-arm64 ;;
    Darwin-arm64) plat=mac-arm64-metal ;; Darwin-x86_64) plat=mac-x64 ;;
    *) echo "bench: no node-llama-cpp binary for $(uname -sm)" >&2; exit 1 ;;
  esac
  # One `npm install --no-save`: the lockfile's versions and this platform's binary, the lockfile
  # not rewritten. npm 11's `ci` refuses this lockfile, which lists only the Linux binaries among
  # node-llama-cpp's optional dependencies (npm leaves other platforms' out when it writes one on
  # Linux).
  npm install --prefix scripts/peers --omit=optional --ignore-scripts --no-save --no-audit --no-fund "@node-llama-cpp/$plat@3.22.1" >/dev/null
fi

# The layouts, made once.
for d in bf16 f16; do
  [ -f "$FIX/smollm2-$d/config.json" ] || node cli/mlx-bun.js convert "$GGUF" "$FIX/smollm2-$d" --dtype "$d" >/dev/null
done
mlx_layout() { # name, then mlx_lm convert's quantization arguments
  [ -f "$L/$1/config.json" ] || LD_PRELOAD="${MLX_LM_PRELOAD:-}" "$PY" -m mlx_lm convert --hf-path "$FIX/smollm2-f32" \
    --mlx-path "$L/$1" -q "${@:2}" >/dev/null
}
mlx_layout q4-g32-bf16 --q-bits 4 --q-group-size 32 --dtype bfloat16
mlx_layout q8-g64-bf16 --q-bits 8 --q-group-size 64 --dtype bfloat16
mlx_layout q4-g64-f16 --q-bits 4 --q-group-size 64 --dtype float16
mlx_layout q4-g64-f32 --q-bits 4 --q-group-size 64 --dtype float32
for q in Q4_0 Q8_0; do
  [ -f "$L/smollm2-$q.gguf" ] || "$PY" scripts/requant_gguf.py "$GGUF" "$L/smollm2-$q.gguf" "$q"
done
[ -e "$L/smollm2-Q4_1.gguf" ] || ln -s "$GGUF" "$L/smollm2-Q4_1.gguf"
[ -e "$L/gemma3-Q4_K_M.gguf" ] || ln -s "$GEMMA_GGUF" "$L/gemma3-Q4_K_M.gguf"
[ -e "$L/smollm2-q4-g64-bf16" ] || ln -s "$FIX/smollm2-q4" "$L/smollm2-q4-g64-bf16"
[ -e "$L/smollm2-q4-g32-f16-exact" ] || ln -s "$FIX/smollm2-exact" "$L/smollm2-q4-g32-f16-exact"

bench() { "$PY" scripts/bench.py "$@"; }
DENSE=("$FIX/smollm2-f32" "$FIX/smollm2-bf16" "$FIX/smollm2-f16" "$FIX/gemma3-bf16")
QUANT=("$L/smollm2-q4-g64-bf16" "$L/q4-g32-bf16" "$L/q8-g64-bf16" "$L/q4-g64-f16" "$L/q4-g64-f32" "$L/smollm2-q4-g32-f16-exact")
GGUFS=("$L/smollm2-Q4_0.gguf" "$L/smollm2-Q4_1.gguf" "$L/smollm2-Q8_0.gguf" "$L/gemma3-Q4_K_M.gguf")
if [ "${1:-}" = "--full" ] || { [ $# -eq 0 ] && [ "$(uname -s)" = Darwin ]; }; then
  bench "${DENSE[@]}"
  bench --f32-matmuls auto all int8 -- "${QUANT[@]}" "${GGUFS[@]}"
  node scripts/bench-batch.js --model "$FIX/smollm2-bf16" --streams 1,8
elif [ $# -eq 0 ]; then
  bench "$FIX/smollm2-f32@128/32" "$FIX/smollm2-bf16@128/32" "$FIX/smollm2-f16@32/8" "$FIX/gemma3-bf16@32/16"
  bench --f32-matmuls auto all int8 -- "$L/smollm2-q4-g64-bf16@8/4" "$L/q4-g32-bf16@8/4" "$L/q8-g64-bf16@8/4" \
    "$L/q4-g64-f16@4/4" "$L/q4-g64-f32@16/8" "$L/smollm2-q4-g32-f16-exact@8/4" \
    "$L/smollm2-Q4_0.gguf@128/32" "$L/smollm2-Q4_1.gguf@128/32" "$L/smollm2-Q8_0.gguf@128/32" "$L/gemma3-Q4_K_M.gguf@64/16"
  node scripts/bench-batch.js --model "$FIX/smollm2-f32" --streams 1,8 --prompt-tokens 16 --gen-tokens 16
else
  bench "$@" "$FIX/smollm2-q4" "$FIX/smollm2-bf16"
fi
