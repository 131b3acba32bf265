#!/usr/bin/env bash
# Builds libfuse's passthrough_hp example, the FUSE ceiling of the mount benchmarks (a FUSE
# file system that does nothing but pass each call to a directory), from a libfuse source
# tree or repository (3.18 or later for FUSE over io_uring: `-o io_uring`), once, into
# ~/.cache/calm/libfuse; prints the binary's path. Installs meson, ninja, g++ and liburing's
# headers when missing.
#   passthrough-hp.sh LIBFUSE   (e.g. a clone of https://github.com/libfuse/libfuse)
set -euo pipefail
src=$(realpath "${1:?a libfuse source tree or repository}")
out=${XDG_CACHE_HOME:-$HOME/.cache}/calm/libfuse
binary=$out/build/example/passthrough_hp
if [ -x "$binary" ]; then echo "$binary"; exit 0; fi
need=()
for p in meson ninja-build g++ liburing-dev pkg-config; do
    dpkg -s "$p" > /dev/null 2>&1 || need+=("$p")
done
[ ${#need[@]} -eq 0 ] || apt-get install -y --no-install-recommends "${need[@]}" >&2
rm -rf "$out"; mkdir -p "$out/src"
if [ -f "$src/meson.build" ]; then
    cp -a "$src/." "$out/src"
else
    # A repository (bare or not): its HEAD.
    git --git-dir="$(git -C "$src" rev-parse --absolute-git-dir)" archive HEAD | tar -x -C "$out/src"
fi
meson setup "$out/build" "$out/src" -Dexamples=true -Dtests=false -Dutils=false \
    -Duseroot=false -Dinitscriptdir= >&2
ninja -C "$out/build" example/passthrough_hp >&2
echo "$binary"
