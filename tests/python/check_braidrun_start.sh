#!/usr/bin/env bash
# braidrun reports a rank that cannot start (exit 126/127) as such:
#   check_braidrun_start.sh BRAIDRUN LIBDIR INCLUDEDIR [launcher-only]
# 1. a rank whose program exits 127 / 126;
# 2. a program linked with libbraid but without a run path, started without
#    LD_LIBRARY_PATH: the dynamic loader cannot find libbraid.so.0 (skipped
#    when libbraid is installed where the loader finds it anyway).
set -u
braidrun=$1 libdir=$2 incdir=$3 only=${4:-}
fail() {
  echo "FAIL: $*"
  exit 1
}
expect() { # code, regex, command...
  local code=$1 re=$2
  shift 2
  out=$("$@" 2>&1)
  got=$?
  echo "$out"
  [ "$got" = "$code" ] || fail "exit status $got, expected $code"
  printf '%s\n' "$out" | grep -Eq "$re" || fail "no line matching: $re"
}
expect 127 "^braidrun: rank [01]: exit code 127 means /bin/sh could not start: a shared library it needs was not found" \
  "$braidrun" -n 2 /bin/sh -c 'exit 127'
expect 126 "^braidrun: rank 0: exit code 126 means /bin/sh could not be executed" "$braidrun" -n 1 /bin/sh -c 'exit 126'

if [ "$only" = launcher-only ]; then
  echo "part 2 skipped (a sanitizer build's libbraid needs the sanitizer runtime)"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '#include <braid.h>\n#include <stdio.h>\nint main(void){ puts(braid_version()); return 0; }\n' >"$work/v.c"
cc=${CC:-cc}
command -v "$cc" >/dev/null 2>&1 || { echo "no C compiler: part 2 skipped"; exit 0; }
"$cc" -I"$incdir" "$work/v.c" -o "$work/v" -L"$libdir" -lbraid || fail "cannot build the consumer"
if env -u LD_LIBRARY_PATH "$work/v" >/dev/null 2>&1; then
  echo "libbraid.so.0 is on the loader's path here: part 2 skipped"
  exit 0
fi
expect 127 "exit code 127 means .*/v could not start: a shared library it needs was not found \(e\.g\. libbraid\.so\.0" \
  env -u LD_LIBRARY_PATH "$braidrun" -n 2 "$work/v"
printf '%s\n' "$out" | grep -q "libbraid.so.0: cannot open shared object file" || fail "the loader's own message is missing"
LD_LIBRARY_PATH=$libdir "$braidrun" -n 2 "$work/v" >/dev/null || fail "with LD_LIBRARY_PATH the program does not start"
echo "braidrun reports ranks that cannot start"
