#!/usr/bin/env bash
# Link flags that make a shared object need no glibc newer than 2.28 (manylinux_2_28: RHEL 8,
# Ubuntu 20.04, Debian 11 and newer), built with this machine's g++ and headers (issue 43; the
# wheel does not use it yet: docs/DESIGN.md, "The wheel").
#
#   eval "$(scripts/manylinux/glibc_floor.sh)"     # sets GLIBC_FLOOR_LDFLAGS, GLIBC_FLOOR_EXE_LDFLAGS
#   g++ -shared x.o ... $GLIBC_FLOOR_LDFLAGS -o libx.so
#   g++ main.o ... $GLIBC_FLOOR_EXE_LDFLAGS -o prog       (CMake: CMAKE_SHARED_LINKER_FLAGS and
#   CMAKE_EXE_LINKER_FLAGS)
#
# 1. glibc 2.28's stub libraries (libc.so.6, libm, libpthread, libdl, librt, ld-linux: every
#    symbol at the version 2.28 had, no code) from zig (PyPI's ziglang, in a venv of its own),
#    which makes them for any glibc it is asked to target. A link against them binds each
#    reference to the version 2.28 has, or fails.
# 2. scripts/manylinux/glibc_shim.c: what glibc 2.36's headers and GCC 12's libstdc++.a call
#    that 2.28 lacks or kept in libc_nonshared.a.
# 3. libstdc++ linked in statically (-static-libstdc++, hidden by -Wl,--exclude-libs,ALL), so no
#    GLIBCXX version is needed; libgcc_s stays shared (the system's; its unwinder is the system's
#    glibc's partner).
# With -z defs, anything 2.28 lacks is a link error here, not a failed load there. What this
# machine's own shared libraries need (its libgcc_s wants glibc 2.35's _dl_find_object) is not
# checked (--allow-shlib-undefined): at run time they are the older system's own. The stubs go
# in --no-as-needed: libstdc++.a, which the driver adds last, needs ld-linux's __tls_get_addr.
#
# Everything is made under build-manylinux/ (git-ignored) once; prints the shell assignment.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(pwd)/build-manylinux/glibc-2.28
if [[ ! -f $out/shim.o || ! -f $out/lib/ld-linux-x86-64.so.2.tls-only ]]; then
  mkdir -p "$out/lib" "$out/zig-cache"
  venv=build-manylinux/venv
  [[ -x $venv/bin/python ]] || /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check 'ziglang==0.13.0' >&2
  echo 'int main(void) { return 0; }' >"$out/empty.c"
  ZIG_GLOBAL_CACHE_DIR=$out/zig-cache ZIG_LOCAL_CACHE_DIR=$out/zig-cache \
    "$venv/bin/python" -m ziglang cc -target x86_64-linux-gnu.2.28 "$out/empty.c" -o "$out/empty" >&2
  stubs=$(dirname "$(find "$out/zig-cache" -name libc.so.6 | head -1)")
  [[ -f $stubs/libc.so.6 ]] || { echo "glibc_floor: zig made no glibc 2.28 stubs" >&2; exit 1; }
  for f in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1; do
    cp "$stubs/$f" "$out/lib/$f"
    ln -sf "$f" "$out/lib/${f%%.so*}.so"  # what -lc, -lm, ... look for
  done
  # The dynamic linker's stub offers __tls_get_addr (libstdc++'s eh_globals) and nothing else: zig's
  # (like glibc 2.28-2.31's ld.so itself) also defines malloc, calloc, realloc and free, its minimal
  # allocator, and a link that binds them there (or lists ld.so before libc) gets that allocator at
  # run time on glibc < 2.32: "dl-minimal.c: realloc: Assertion `ptr == alloc_last_block' failed".
  printf 'void __tls_get_addr(void) {}\n' >"$out/ldstub.c"
  printf 'GLIBC_2.3 { global: __tls_get_addr; local: *; };\n' >"$out/ldstub.map"
  gcc -shared -nostdlib -fPIC -Wl,--version-script="$out/ldstub.map" -Wl,-soname,ld-linux-x86-64.so.2 \
    "$out/ldstub.c" -o "$out/lib/ld-linux-x86-64.so.2"
  touch "$out/lib/ld-linux-x86-64.so.2.tls-only"
fi
# (always recompiled: two small files, and an edit must not be missed)
gcc -O2 -fPIC -fvisibility=hidden -c scripts/manylinux/glibc_shim.c -o "$out/shim.o"
gcc -O2 -fPIC -fvisibility=hidden -c scripts/manylinux/glibc_start.c -o "$out/start.o"
flags="-static-libstdc++ $out/shim.o -Wl,--exclude-libs,ALL -L$out/lib -Wl,--no-as-needed"
# libc before ld.so in DT_NEEDED, as in any normal link: glibc < 2.32's ld.so exports malloc & co.,
# and the first object in the search order that defines a symbol wins, whatever its version names.
# libm and libc by path: g++'s driver moves a -lm or -lc past everything else (after -lstdc++).
flags+=" $out/lib/libm.so.6 -ldl -lpthread -lrt $out/lib/libc.so.6 $out/lib/ld-linux-x86-64.so.2 -Wl,-z,defs -Wl,--allow-shlib-undefined"
printf 'GLIBC_FLOOR_LDFLAGS=%q\n' "$flags"
# Executables also need their constructors run on glibc < 2.34 (glibc_start.c).
printf 'GLIBC_FLOOR_EXE_LDFLAGS=%q\n' "$flags $out/start.o -Wl,--wrap=__libc_start_main"
