#!/usr/bin/env bash
# Builds the addon (release) and lays it out as it ships: mlx-bun.<triple>.node with the MLX
# runtime beside it (mlx/lib/libmlx.*, and on Linux the wheel's mlx_cpu.libs/), plus the CLI binary.
set -euo pipefail
cd "$(dirname "$0")/.."
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) triple=linux-x64-gnu ;;
  Linux-aarch64) triple=linux-arm64-gnu ;;
  Darwin-arm64) triple=darwin-arm64 ;;
  *) echo "unsupported platform $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac
# One build, both targets: the addon is the cdylib, the CLI the binary. Take the addon's file, by
# name, from cargo's report.
lib=$(cargo build --release -q --message-format=json-render-diagnostics | node -e '
  let addon
  for (const line of require("fs").readFileSync(0, "utf8").split("\n")) {
    const m = line.startsWith("{") ? JSON.parse(line) : null
    if (m && m.reason === "compiler-artifact" && m.target.name === "mlx_bun" && m.target.kind.includes("cdylib"))
      addon = m.filenames.find((f) => /\.(so|dylib)$/.test(f))
  }
  if (!addon) process.exit(1)
  console.log(addon)')
# Replace by rename: processes that have the old addon mapped keep a valid file (cp over it raises SIGBUS).
cp "$lib" mlx-bun.$triple.node.tmp && mv -f mlx-bun.$triple.node.tmp mlx-bun.$triple.node
prefix=${MLX_PREFIX:-.mlx/mlx-cpu/mlx}
# The runtime beside the addon, each file replaced only when it differs, by rename (as above):
# a test process may have it loaded while a build runs.
place() { # SRC DEST
  cmp -s "$1" "$2" && return
  mkdir -p "$(dirname "$2")"
  cp "$1" "$2.tmp" && mv -f "$2.tmp" "$2"
}
for f in "$prefix"/lib/libmlx.* "$prefix"/lib/mlx.metallib; do
  [ -f "$f" ] && place "$f" "mlx/lib/$(basename "$f")"
done
if [ -d "$prefix"/../mlx_cpu.libs ]; then
  for f in "$prefix"/../mlx_cpu.libs/*; do place "$f" "mlx_cpu.libs/$(basename "$f")"; done
fi
echo "built mlx-bun.$triple.node"
