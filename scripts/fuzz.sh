#!/usr/bin/env bash
# Fuzzes the loaders of untrusted input with cargo-fuzz (libFuzzer, nightly toolchain):
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]     default: 60 s each, every target in fuzz/
# A crash, a run over 1 s or over 2 GiB fails it. Each target's corpus grows under fuzz/corpus/.
#   FUZZ_SANITIZER=address|none   address (the default) also catches memory errors in unsafe code;
#                                 none builds faster (6 minutes on 2 AMD Zen 3 cores) and runs ~10x
#                                 more inputs a second (scripts/test.sh uses it)
#   FUZZ_JOBS=N                   targets fuzzed at once (default 1)
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
SANITIZER=${FUZZ_SANITIZER:-address}
JOBS=${FUZZ_JOBS:-1}
cd fuzz
cargo +nightly fuzz build -O -s "$SANITIZER"
fuzz_one() {
  local t=$1 log
  mkdir -p "corpus/$t"
  log=$(mktemp)
  if ! cargo +nightly fuzz run -O -s "$SANITIZER" "$t" "corpus/$t" -- -max_total_time="$SECONDS_EACH" -timeout=1 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    tail -60 "$log" >&2
    echo "fuzz: $t FAILED (reproducer under fuzz/artifacts/$t/)" >&2
    rm -f "$log"
    return 1
  fi
  execs=$(grep -m1 -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  rss=$(grep -m1 -oE 'stat::peak_rss_mb: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  echo "fuzz: $t ${SECONDS_EACH}s ($SANITIZER sanitizer), $execs executions, peak RSS ${rss} MB, 0 crashes"
  rm -f "$log"
}
# JOBS targets at a time; every one runs to its end, and any failure fails the script.
failed=0
for ((i = 0; i < ${#TARGETS[@]}; i += JOBS)); do
  pids=()
  for t in "${TARGETS[@]:i:JOBS}"; do fuzz_one "$t" & pids+=($!); done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
done
exit $failed
