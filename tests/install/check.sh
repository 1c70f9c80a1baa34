#!/usr/bin/env bash
# Installs braid into a scratch prefix and builds a consumer twice: through
# pkg-config and through find_package(braid). Also checks that the shared
# library exports only braid_* names.
set -euo pipefail
build=${1:?usage: check.sh BUILD_DIR}
prefix=$(mktemp -d)
work=$(mktemp -d)
trap 'rm -rf "$prefix" "$work"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null

cat >"$work/use.c" <<'C'
#include <braid.h>
#include <stdio.h>
int main(void) {
  braid_comm *c;
  if (braid_init(NULL, &c) != BRAID_OK) return 1;
  double x = 21;
  if (braid_all_reduce(c, &x, 1, BRAID_F64, BRAID_SUM) != BRAID_OK || x != 21) return 2;
  printf("consumer ok: braid %s, backend %s\n", braid_version(), braid_backend(c));
  return braid_destroy(c) != BRAID_OK;
}
C
libdir=$(ls -d "$prefix"/lib*/pkgconfig | head -n1)
export PKG_CONFIG_PATH="$libdir"
cc -std=c11 -Wall -Werror "$work/use.c" -o "$work/use_pc" $(pkg-config --cflags --libs braid)
LD_LIBRARY_PATH=$(dirname "$libdir") "$work/use_pc"

mkdir -p "$work/cm"
cat >"$work/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(use C)
find_package(braid REQUIRED)
add_executable(use ../use.c)
target_link_libraries(use PRIVATE braid::braid)
add_executable(use_static ../use.c)
target_link_libraries(use_static PRIVATE braid::braid_static)
CM
cmake -S "$work/cm" -B "$work/cm/b" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cm/b" >/dev/null
LD_LIBRARY_PATH=$(dirname "$libdir") "$work/cm/b/use"
"$work/cm/b/use_static"

so=$(ls "$(dirname "$libdir")"/libbraid.so.* | head -n1)
bad=$(nm -D --defined-only "$so" | awk '{print $3}' | grep -v '^braid_' | grep -v '^braid_' || true)
if [ -n "$bad" ]; then
  echo "libbraid.so exports names outside braid_*:"; echo "$bad"; exit 1
fi
internal=$(nm -D --defined-only "$so" | awk '{print $3}' | grep '^braid__' || true)
if [ -n "$internal" ]; then
  echo "libbraid.so exports internal names:"; echo "$internal"; exit 1
fi
echo "install check passed: header, libraries, braid.pc and find_package(braid) work"
