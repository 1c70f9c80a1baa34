#!/usr/bin/env bash
# The Python package installs offline and finds its libbraid without help:
#   check_install.sh BUILD_DIR PYTHON
# 1. `cmake --install` + python/install.py (what `make install` runs) into a
#    scratch prefix: `import braid` loads that prefix's libbraid with neither
#    BRAID_LIBRARY nor LD_LIBRARY_PATH.
# 2. `pip install --no-index ./python` (a copy of it) into a scratch prefix,
#    when pip is installed: no network, no compiler.
set -u
build=$1 py=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
skip() {
  echo "SKIPPED: $*"
  exit 77
}
fail() {
  echo "FAIL: $*"
  exit 1
}
[ -x "$py" ] || skip "$py not found (Debian: apt-get install python3)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
"${CMAKE:-cmake}" --install "$build" --prefix "$prefix" >/dev/null || fail "cmake --install"
"$py" "$src/python/install.py" --build "$build" --prefix "$prefix" || fail "python/install.py"
site=$(ls -d "$prefix"/lib/python3*/site-packages | head -n1)
check='
import os, sys, braid
want = sys.argv[1]
assert os.path.realpath(braid.library_path()).startswith(os.path.realpath(want)), (braid.library_path(), want)
assert braid.__file__.startswith(sys.argv[2]), braid.__file__
with braid.init() as c:
    b = bytearray(b"\x01\x02")
    c.all_reduce(b, "sum", dtype="u8")
    c.sync()
    assert bytes(b) == b"\x01\x02" and c.backend == "self"
print("import braid from", os.path.dirname(braid.__file__), "loads", braid.library_path())
'
(cd "$work" && env -u BRAID_LIBRARY -u LD_LIBRARY_PATH -u BRAID_RANK -u BRAID_WORLD_SIZE -u BRAID_STORE \
  PYTHONPATH="$site" PYTHONDONTWRITEBYTECODE=1 "$py" -c "$check" "$prefix/lib" "$site") ||
  fail "the package installed by python/install.py does not load $prefix's libbraid"

if ! "$py" -m pip --version >/dev/null 2>&1; then
  echo "pip is not installed (Debian: python3-pip): the pip part is skipped"
  exit 0
fi
cp -r "$src/python" "$work/pysrc"
rm -rf "$work/pysrc/build" "$work/pysrc"/*.egg-info "$work/pysrc/braid/_install_config.py"
"$py" -m pip install -q --no-index --no-deps --target "$work/pip" "$work/pysrc" 2>&1 | grep -v -e "^WARNING: Running pip as the 'root' user" -e "^DEPRECATION" || true
[ -f "$work/pip/braid/__init__.py" ] || fail "pip install --no-index ./python installed nothing"
(cd "$work" && env -u LD_LIBRARY_PATH -u BRAID_RANK -u BRAID_WORLD_SIZE -u BRAID_STORE BRAID_LIBRARY="$prefix/lib" \
  PYTHONPATH="$work/pip" PYTHONDONTWRITEBYTECODE=1 "$py" -c "$check" "$prefix/lib" "$work/pip") ||
  fail "the package installed by pip does not work"
echo "python package install check passed"
