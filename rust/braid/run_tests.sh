#!/usr/bin/env bash
# ctest driver for the Rust crate (python/bindings.cmake):
#
#   run_tests.sh NRANKS BRAIDRUN LIBDIR TARGET_DIR [CARGO]
#
# Builds the crate's tests with `cargo test --no-run --offline` against the
# libbraid in LIBDIR (BRAID_LIB_DIR; the build script writes it as a run
# path), then runs every test executable under `braidrun -n NRANKS ...
# --test-threads=1`, so all ranks run the same tests in the same (name)
# order, and then the examples. With NRANKS 1 it also runs the doc tests. No cargo (or rustc): the
# test reports SKIPPED with exit status 77.
set -u
n=$1 braidrun=$2 libdir=$3 target=$4 cargo=${5:-cargo}
here=$(cd "$(dirname "$0")" && pwd)
skip() {
  echo "SKIPPED: $*"
  exit 77
}
cargo_path=$(command -v "$cargo" 2>/dev/null) || skip "cargo not found (Debian: apt-get install cargo rustc)"
# The rustc and rustdoc beside this cargo (Debian's /usr/bin/cargo with
# /usr/bin/rustc), not a different toolchain first on PATH; RUSTC and RUSTDOC override.
bindir=$(dirname "$cargo_path")
[ -n "${RUSTC:-}" ] || [ ! -x "$bindir/rustc" ] || export RUSTC="$bindir/rustc"
[ -n "${RUSTDOC:-}" ] || [ ! -x "$bindir/rustdoc" ] || export RUSTDOC="$bindir/rustdoc"
command -v "${RUSTC:-rustc}" >/dev/null 2>&1 || skip "rustc not found (Debian: apt-get install rustc)"
cargo=$cargo_path
export BRAID_LIB_DIR="$libdir" CARGO_TARGET_DIR="$target"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cd "$here" || exit 1
echo "$cargo: $("$cargo" --version), ${RUSTC:-rustc}: $("${RUSTC:-rustc}" --version); libbraid from $libdir"
mkdir -p "$target"
log="$target/build-n$n.log"
if ! json=$("$cargo" test --offline --no-run --message-format=json 2>"$log"); then
  cat "$log"
  echo "cargo test --no-run failed"
  exit 1
fi
executables() { grep "$1" | grep -o '"executable":"[^"]*"' | sed 's/^"executable":"//; s/"$//'; }
exes=$(printf '%s\n' "$json" | executables '"test":true')
examples=$(printf '%s\n' "$json" | executables '"kind":\["example"\]')
[ -n "$exes" ] || { cat "$log"; echo "cargo built no test executable"; exit 1; }
rc=0
for exe in $exes; do
  echo "== braidrun -n $n $exe --test-threads=1"
  "$braidrun" -n "$n" --timeout 600 --tag-output "$exe" --test-threads=1 || rc=1
done
for exe in $examples; do
  echo "== braidrun -n $n $exe"
  "$braidrun" -n "$n" --timeout 600 --tag-output "$exe" || rc=1
done
if [ "$n" = 1 ]; then
  echo "== cargo test --doc"
  "$cargo" test --offline --doc 2>&1 || rc=1
fi
exit $rc
