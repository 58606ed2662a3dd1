#!/usr/bin/env bash
# Builds the addon (release) and lays it out as it ships: mlx-bun.<triple>.node with the MLX
# runtime beside it (mlx/lib/libmlx.*, and on Linux the wheel's mlx_cpu.libs/), plus the CLI binary.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
cargo build --release -q --no-default-features --features cli --bin mlx-bun
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) triple=linux-x64-gnu; lib=libmlx_bun.so ;;
  Linux-aarch64) triple=linux-arm64-gnu; lib=libmlx_bun.so ;;
  Darwin-arm64) triple=darwin-arm64; lib=libmlx_bun.dylib ;;
  *) echo "unsupported platform $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac
# Replace by rename: processes that have the old addon mapped keep a valid file (cp over it raises SIGBUS).
cp target/release/$lib mlx-bun.$triple.node.tmp && mv -f mlx-bun.$triple.node.tmp mlx-bun.$triple.node
prefix=${MLX_PREFIX:-.mlx/mlx-cpu/mlx}
mkdir -p mlx/lib
cp "$prefix"/lib/libmlx.* mlx/lib/
[ -f "$prefix"/lib/mlx.metallib ] && cp "$prefix"/lib/mlx.metallib mlx/lib/
[ -d "$prefix"/../mlx_cpu.libs ] && rm -rf mlx_cpu.libs && cp -r "$prefix"/../mlx_cpu.libs .
echo "built mlx-bun.$triple.node"
