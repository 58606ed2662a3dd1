#!/usr/bin/env bash
# The benchmark: mlx-bun beside mlx-lm 0.32.2 in the same run (same machine, libmlx and BLAS) on
# SmolLM2-135M (MLX 4-bit and bf16) and Gemma-3-270M (bf16), 3 repeats after a warm-up, with the
# machine's read bandwidth and each engine's share of the decode roofline. Prints tables.
#
#   bash scripts/bench.sh           the workload sized to the backend: the full one on Metal;
#                                   on MLX's CPU backend (Linux) one that ends in ~10 minutes on 2
#                                   cores, since its quantized matmul decodes ~1 token/s
#   bash scripts/bench.sh --full    prompts of 128 and 2048 tokens, 256 generated, every model
#   bash scripts/bench.sh ARGS...   scripts/bench.py ARGS on the SmolLM2 4-bit and bf16 folders
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
bash scripts/fixtures.sh >/dev/null
FIX=${MLX_BUN_FIXTURES:-$PWD/fixtures}
GGUF="$FIX/home/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$FIX/smollm2-bf16/config.json" ] || node cli/mlx-bun.js convert "$GGUF" "$FIX/smollm2-bf16" --dtype bf16 >/dev/null
bench() { .venv/bin/python scripts/bench.py "$@"; }
if [ "${1:-}" = "--full" ] || { [ $# -eq 0 ] && [ "$(uname -s)" = Darwin ]; }; then
  bench "$FIX/smollm2-q4" "$FIX/smollm2-bf16" "$FIX/gemma3-bf16"
elif [ $# -eq 0 ]; then
  bench --prompt-tokens 16 --gen-tokens 8 "$FIX/smollm2-q4"
  bench --prompt-tokens 128 --gen-tokens 64 "$FIX/smollm2-bf16"
  bench --prompt-tokens 32 --gen-tokens 16 "$FIX/gemma3-bf16"
else
  bench "$@" "$FIX/smollm2-q4" "$FIX/smollm2-bf16"
fi
