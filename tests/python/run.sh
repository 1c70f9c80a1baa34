#!/usr/bin/env bash
# ctest driver for the Python tests and examples (python/bindings.cmake):
#
#   run.sh NRANKS BRAIDRUN PYTHON MODULES ARGS...
#
# Checks that PYTHON exists and imports every module of the comma list
# MODULES, then runs `braidrun -n NRANKS PYTHON ARGS...`. A missing
# interpreter or module is reported as SKIPPED with the Debian package that
# brings it, and exit status 77 (the test's SKIP_RETURN_CODE).
set -u
n=$1 braidrun=$2 py=$3 modules=$4
shift 4
skip() {
  echo "SKIPPED: $*"
  exit 77
}
[ -x "$py" ] || skip "$py not found (Debian: apt-get install python3)"
IFS=, read -r -a mods <<<"$modules"
for m in "${mods[@]}"; do
  [ -n "$m" ] || continue
  if ! err=$("$py" -c "import $m" 2>&1); then
    case $m in
      numpy) pkg=python3-numpy ;;
      pytest) pkg=python3-pytest ;;
      torch) pkg=python3-torch ;;
      *) pkg="a package providing $m" ;;
    esac
    skip "$py cannot import $m (Debian: apt-get install $pkg): ${err##*$'\n'}"
  fi
done
[ -x "$braidrun" ] || { echo "braidrun not found at $braidrun"; exit 1; }
# BT_BRAIDRUN_ARGS: more braidrun options (e.g. --backend nccl; braidrun does
# not pass an inherited BRAID_BACKEND on).
read -r -a extra <<<"${BT_BRAIDRUN_ARGS:-}"
echo "braid library: ${BRAID_LIBRARY:-(search)}; running: braidrun -n $n ${extra[*]} $py $*"
exec "$braidrun" -n "$n" --timeout 900 --tag-output "${extra[@]}" "$py" "$@"
