#!/usr/bin/env bash
# Runs every test: Rust unit tests, then the JS suites under Node and under Bun, against real
# SmolLM2 weights and mlx-lm 0.32.2 references (scripts/fixtures.sh). Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== setup ($(date -u +%T))"
# The Python venv of the references (a minute of pip, mostly on one core) installs beside the build.
bash scripts/setup-venv.sh >/dev/null &
venv=$!
bash scripts/setup.sh
wait $venv
echo "== fixtures ($(date -u +%T))"
bash scripts/fixtures.sh
FIX=${MLX_BUN_FIXTURES:-$PWD/fixtures}
rust_tests() {
  MLX_BUN_TEST_GGUF="$FIX/home/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
  MLX_BUN_TEST_GEMMA_GGUF="$FIX/gemma-3-270m-q4_k_m.gguf" \
    cargo test --release -q -- --include-ignored
}
# Our C++ kernels compile for arm64 (macOS, Linux), whose paths this machine does not build
# (scripts/check-arm64.py: a libclang parse for aarch64, a few seconds).
if [ "$(uname -sm)" = "Linux x86_64" ]; then
  echo "== kernels parsed for arm64 ($(date -u +%T))"
  .venv/bin/python -c 'import clang.cindex' 2>/dev/null || .venv/bin/python -m pip install -q --disable-pip-version-check clang==14.0
  .venv/bin/python scripts/check-arm64.py
fi
echo "== cargo test ($(date -u +%T))"
rust_tests
# OpenBLAS picks its kernels for the CPU at hand, and a claim checked with one CPU's kernels may
# not hold with another's (a test that passed on AVX-512 machines failed on AVX2 ones). On a CPU
# with AVX-512, run the Rust tests again with the kernels AVX2 CPUs (Intel Haswell on, AMD Zen)
# get: OPENBLAS_CORETYPE picks them in Debian's OpenBLAS (~10 s, nothing rebuilt). A CPU without AVX-512 runs
# those already.
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "== cargo test with OpenBLAS's Haswell kernels ($(date -u +%T))"
  OPENBLAS_CORETYPE=Haswell rust_tests
fi
# The fuzz targets of the loaders (fuzz/: GGUF, safetensors, config, detokenizer, KV-cache file)
# for 60 s each, two at a time, built without a sanitizer and with the library's loaders alone
# (mlx-bun without its `runtime` feature) to fit CI's budget: 6 minutes of build on 2 cores (AMD
# Zen 3) instead of 10.5; the hour-long runs with AddressSanitizer are in RELIABILITY.md. The
# chat-template target is not run here: within minutes it finds renders that minijinja 3.1 does
# not charge fuel for (lazily repeated lists turned into text), which only an upstream fix ends
# (RELIABILITY.md, "Fuzzing"); CI would fail at random on them.
echo "== fuzz, 60 s a target ($(date -u +%T))"
FUZZ_SANITIZER=none FUZZ_JOBS=2 bash scripts/fuzz.sh 60 gguf safetensors config detokenize kv_file
echo "== node --test ($(date -u +%T))"
# --expose-gc reaches every test file; the session tests use it to check that sessions dropped
# without closing are reclaimed by garbage collection. Two files at a time at least (Node's default
# is one less than the cores, so one on 2 cores): a file's process leaves a fifth of the CPU idle
# (loading, spawning, JavaScript), and two keep it busy, 12.8 minutes instead of 15.4 on 2 AMD Zen 3
# cores with every test passing; no test bounds a duration under 4 seconds.
node --expose-gc --test --test-concurrency="$(node -p 'Math.max(2, require("os").availableParallelism() - 1)')" __test__/
echo "== bun test ($(date -u +%T))"
# Run once, under Node, to keep CI within its budget:
# - the parity suites (SmolLM2 and Gemma-3-270M against mlx-lm, 6 min of real-weight decoding):
#   they check numbers the Rust core computes; the JavaScript they pass through (generate()'s
#   iterator) runs under Bun in the generate and session suites;
# - the prefix-cache suite (5 min of real-weight prefill) and the server load test (64 clients of
#   a server process), the grammar, speculative and fill suites (2 min each of real-weight
#   decoding), the eval suite (the mlx-bun binary on real weights), and the quantized-KV and
#   memory-admission suites (2 min of real-weight decoding) and the prefix cache's memory check (a
#   process of its own):
#   Rust behaviour with no runtime-specific code;
# - the package test, which installs the packed tarballs with npm and with bun and runs Bun itself;
# - the `mlx-bun serve` suite (a Rust binary the runtime only spawns) and the server's tool calls
#   (HTTP behaviour of Rust); createServer's own suite (create-server.test.js) runs under both.
node_modules/.bin/bun test --timeout 600000 $(ls __test__/*.test.js | grep -v -e parity.test.js -e gemma.test.js \
  -e prefix-cache.test.js -e server-load.test.js -e package.test.js -e grammar.test.js -e /server.test.js \
  -e speculative.test.js -e fill.test.js -e eval.test.js -e kv-quant.test.js -e memory.test.js -e prefix-memory.test.js)
