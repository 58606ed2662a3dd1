#!/usr/bin/env bash
# Packs the npm packages as they would be published, into dist/ (or $1):
#   mlx-bun-<version>.tgz                 the JavaScript package (index.js/.mjs/.d.ts, cli/)
#   mlx-bun-<triple>-<version>.tgz        @mlx-bun/<triple>: the addon and the MLX runtime it loads
# from the build `scripts/build.sh` made. The main package names every platform package in
# optionalDependencies, so npm and bun install the one that matches the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) triple=linux-x64-gnu ;;
  Linux-aarch64) triple=linux-arm64-gnu ;;
  Darwin-arm64) triple=darwin-arm64 ;;
  *) echo "unsupported platform $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac
addon=mlx-bun.$triple.node
[ -f "$addon" ] && [ -d mlx/lib ] || { echo "pack: build first (bash scripts/build.sh)" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp npm/$triple/package.json npm/$triple/README.md "$stage/"
cp "$addon" "$stage/"
cp -r mlx "$stage/"
[ -d mlx_cpu.libs ] && cp -r mlx_cpu.libs "$stage/"
# The build links a second rpath to the MLX it was built against (for the CLI and the tests);
# a published addon must find its runtime beside itself only.
if [ "$(uname -s)" = Linux ]; then
  patchelf --set-rpath '$ORIGIN/mlx/lib' "$stage/$addon"
else
  for p in $(otool -l "$stage/$addon" | awk '/LC_RPATH/ {getline; getline; print $2}'); do
    [ "$p" = @loader_path/mlx/lib ] || install_name_tool -delete_rpath "$p" "$stage/$addon"
  done
fi
(cd "$stage" && npm pack --silent --pack-destination "$out" >/dev/null)
npm pack --silent --pack-destination "$out" >/dev/null
version=$(node -p "require('./package.json').version")
echo "$out/mlx-bun-$version.tgz"
echo "$out/mlx-bun-$triple-$version.tgz"
