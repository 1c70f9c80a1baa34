#!/bin/sh
# Builds every libFuzzer target with clang and runs each for SECONDS from its
# seed corpus; fails on the first target that crashes (or fails to build).
#
#   tests/fuzz/run_all.sh SECONDS [BUILD_DIR]      (BUILD_DIR default: build-fuzz)
#
# Each corpus is copied to a temporary directory first, so what the fuzzer
# adds never lands in the tree. A crash leaves its input in BUILD_DIR/fuzz-out/.
set -eu

usage() {
  echo "usage: $0 SECONDS [BUILD_DIR]" >&2
  exit 2
}
[ $# -ge 1 ] && [ $# -le 2 ] || usage
secs=$1
case $secs in '' | *[!0-9]*) usage ;; esac
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${2:-build-fuzz}
case $build in /*) ;; *) build=$(pwd)/$build ;; esac

# Every tests/fuzz/fuzz_NAME.c is a target fuzz_NAME with its seeds in
# corpus_NAME/ (fuzz_store_frame's, the first target's, in corpus/) and its
# dictionary, if any, in NAME.dict. Lines: target corpus dictionary ("-": none).
targets=$(for f in "$here"/fuzz_*.c; do
  name=$(basename "$f" .c)
  short=${name#fuzz_}
  corpus=corpus_$short
  [ -d "$here/$corpus" ] || corpus=corpus
  dict=$short.dict
  [ -f "$here/$dict" ] || dict=-
  echo "$name $corpus $dict"
done)
[ -n "$targets" ] || { echo "no fuzz targets in $here" >&2; exit 1; }

cmake -S "$src" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBRAID_FUZZ=ON >/dev/null
names=$(echo "$targets" | awk 'NF { print $1 }')
# shellcheck disable=SC2086
cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target $names

tmp=$(mktemp -d "${TMPDIR:-/tmp}/braid-fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
out="$build/fuzz-out"
mkdir -p "$out"
failed=""
echo "$targets" | while read -r name corpus dict; do
  [ -n "$name" ] || continue
  bin=$build/tests/fuzz/$name
  if [ ! -x "$bin" ]; then
    echo "$name: not built" >&2
    exit 1
  fi
  mkdir -p "$tmp/$name"
  cp "$here/$corpus"/* "$tmp/$name/"
  set -- -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$out/$name-"
  [ "$dict" = "-" ] || set -- "$@" -dict="$here/$dict"
  echo "== $name: $secs s from $(ls "$tmp/$name" | wc -l) seeds"
  if ! "$bin" "$@" "$tmp/$name" >"$out/$name.log" 2>&1; then
    tail -n 40 "$out/$name.log" >&2
    echo "$name: FAILED (log: $out/$name.log; inputs: $out/$name-*)" >&2
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^#[0-9]+.*DONE" "$out/$name.log" | tail -n 2
  echo "$name: ok, corpus grew to $(ls "$tmp/$name" | wc -l) inputs"
done || failed=1
[ -z "$failed" ] || exit 1
echo "all fuzz targets ran $secs s without a crash"
