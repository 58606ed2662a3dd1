#!/usr/bin/env bash
# Fuzzes the loaders of untrusted input with cargo-fuzz (libFuzzer, nightly toolchain):
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]     default: 60 s each, every target in fuzz/
# A crash, a run over 1 s or over 2 GiB fails it. Each target's corpus grows under fuzz/corpus/.
# Needs scripts/setup.sh and scripts/fixtures.sh first (MLX, and SmolLM2's GGUF for detokenize).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(gguf safetensors config template detokenize kv_file)
FIX=${MLX_BUN_FIXTURES:-$PWD/fixtures}
export MLX_BUN_FUZZ_GGUF="$FIX/home/models/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$MLX_BUN_FUZZ_GGUF" ] || { echo "fuzz: $MLX_BUN_FUZZ_GGUF is missing (run scripts/fixtures.sh)" >&2; exit 1; }
rustup toolchain list | grep -q '^nightly' || { echo "fuzz: needs the nightly toolchain (rustup toolchain install nightly)" >&2; exit 1; }
command -v cargo-fuzz >/dev/null || cargo install -q --locked cargo-fuzz
cd fuzz
cargo +nightly fuzz build -O
for t in "${TARGETS[@]}"; do
  mkdir -p "corpus/$t"
  log=$(mktemp)
  if ! cargo +nightly fuzz run -O "$t" "corpus/$t" -- -max_total_time="$SECONDS_EACH" -timeout=1 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    tail -60 "$log" >&2
    echo "fuzz: $t FAILED (reproducer under fuzz/artifacts/$t/)" >&2
    exit 1
  fi
  execs=$(grep -m1 -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  rss=$(grep -m1 -oE 'stat::peak_rss_mb: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  echo "fuzz: $t ${SECONDS_EACH}s, $execs executions, peak RSS ${rss} MB, 0 crashes"
  rm -f "$log"
done
