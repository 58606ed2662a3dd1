"""Our C++ kernels (crates/mlx-sys/kernels/) must compile on arm64, for macOS (the main platform)
and Linux, though only their x86_64 paths run here: this parses their translation unit for
aarch64 with libclang (Debian's libclang 14, the one bindgen uses, through the `clang` Python
bindings of the same version), once as Linux and once with __APPLE__ defined (macOS's branches),
and fails on any error located in our files. An x86_64-only function used outside its guard went
unnoticed this way once (`has_fma`).

The host has no arm64 C library or libstdc++ headers, so the x86_64 ones stand in (with an empty
gnu/stubs-32.h); the errors those cause inside system and MLX headers are not ours and are not
reported. Usage: .venv/bin/python scripts/check-arm64.py  (scripts/test.sh runs it)
"""
import glob
import os
import re
import sys
import tempfile

import clang.cindex as ci

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OURS = os.path.join(ROOT, "crates", "mlx-sys")
TU = os.path.join(OURS, "kernels", "affine_rows.cpp")


def newest(pattern):
    """The path matching `pattern` with the highest version (numbers compared as numbers: 12 > 9)."""
    found = sorted(glob.glob(pattern), key=lambda p: [int(t) if i % 2 else t for i, t in enumerate(re.split(r"(\d+)", p))])
    if not found:
        sys.exit(f"check-arm64: nothing matches {pattern} (run scripts/setup.sh)")
    return found[-1]


def main(stubs):
    ci.Config.set_library_file(newest("/usr/lib/*-linux-gnu/libclang-14.so.1"))
    cargo = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
    mlx_c = newest(os.path.join(cargo, "registry/src/*/mlx-sys-0.7.0/src/mlx-c"))
    os.makedirs(os.path.join(stubs, "gnu"))
    open(os.path.join(stubs, "gnu", "stubs-32.h"), "w").close()
    system = [newest("/usr/lib/llvm-14/lib/clang/*/include"), stubs, newest("/usr/include/c++/[0-9]*"),
              newest("/usr/include/x86_64-linux-gnu/c++/[0-9]*"), "/usr/include", "/usr/include/x86_64-linux-gnu"]
    # As build.rs compiles it (`cpp` there): C++20, mlx-c's and MLX's headers, the format shim.
    args = ["-x", "c++", "-std=c++20", "-target", "aarch64-linux-gnu", "-nostdinc", "-nostdinc++",
            "-I", mlx_c, "-I", os.path.join(ROOT, ".mlx/mlx-cpu/mlx/include"),
            "-include", os.path.join(OURS, "compat", "std_format_shim.h")]
    args += [a for p in system for a in ("-isystem", p)]
    failed = False
    for name, extra in [("Linux arm64", []), ("macOS arm64 (__APPLE__)", ["-D__APPLE__"])]:
        tu = ci.Index.create().parse(TU, args=args + extra)
        ours = [d for d in tu.diagnostics if d.severity >= ci.Diagnostic.Error and d.location.file
                and os.path.abspath(d.location.file.name).startswith(OURS)]
        # The parse reached our code: the builders' entry points are declared.
        entry = [c for top in tu.cursor.get_children() for c in [top, *top.get_children()]
                 if c.kind == ci.CursorKind.FUNCTION_DECL and c.spelling == "mlx_bun_affine_rows_matmul"]
        for d in ours:
            print(f"check-arm64: {name}: {d.location.file}:{d.location.line}: {d.spelling}")
        if not entry:
            print(f"check-arm64: {name}: the parse did not reach mlx_bun_affine_rows_matmul")
        failed |= bool(ours) or not entry
        print(f"check-arm64: {name}: {len(ours)} errors in our kernels")
    return 1 if failed else 0


with tempfile.TemporaryDirectory() as stubs:
    code = main(stubs)
sys.exit(code)
