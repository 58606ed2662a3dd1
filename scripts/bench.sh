#!/usr/bin/env bash
# The benchmark: SmolLM2-135M as MLX 4-bit and bf16, prompts of 128 and 2048 tokens, 256 generated
# tokens, 3 repeats after a warm-up, mlx-bun beside mlx-lm 0.32.2 in the same run. Prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
bash scripts/fixtures.sh >/dev/null
FIX=${MLX_BUN_FIXTURES:-$PWD/fixtures}
GGUF="$FIX/home/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$FIX/smollm2-bf16/config.json" ] || node cli/mlx-bun.js convert "$GGUF" "$FIX/smollm2-bf16" --dtype bf16 >/dev/null
.venv/bin/python scripts/bench.py "$@" "$FIX/smollm2-q4" "$FIX/smollm2-bf16"
