#!/usr/bin/env bash
# Prepares a fresh Linux (Debian/Ubuntu, glibc >= 2.35) or macOS arm64 machine and builds the addon:
#   system packages (libclang for bindgen, OpenBLAS), the prebuilt MLX from PyPI, the mlx-c sources
#   (inside the published mlx-sys crate, via cargo), npm dev dependencies, then `scripts/build.sh`.
# Idempotent: each step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
MLX_VERSION=0.32.2   # must equal the MLX release mlx-c 0.7.0 is written against

if [ "$(uname -s)" = Linux ]; then
  need=()
  for p in libclang1-14 libclang-common-14-dev libopenblas0-pthread patchelf; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
  fi
  WHEEL_PKG=mlx-cpu; PLATFORM="manylinux_2_35_$(uname -m)"
else
  WHEEL_PKG=mlx-metal; PLATFORM=macosx_14_0_arm64
fi

if [ ! -f .mlx/mlx-cpu/mlx/include/mlx/mlx.h ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --platform "$PLATFORM" \
    "$WHEEL_PKG==$MLX_VERSION" -d .mlx/wheels
  rm -rf .mlx/mlx-cpu
  python3 -m zipfile -e .mlx/wheels/"${WHEEL_PKG//-/_}-$MLX_VERSION"-*.whl .mlx/mlx-cpu
fi

cargo fetch --manifest-path crates/mlx-sys/upstream/Cargo.toml -q
# Installs when any dev dependency of package.json is missing (bun, the HTTP clients the server
# tests use, TypeScript).
node -e "for (const d of Object.keys(require('./package.json').devDependencies)) require('fs').statSync('node_modules/' + d + '/package.json')" 2>/dev/null \
  || npm install --no-audit --no-fund --loglevel=error
bash scripts/build.sh
