#!/usr/bin/env bash
# valgrind memcheck on the self and shm tests: every forked rank runs under
# it too (the harness forks without exec). Any memory error or definite leak
# fails the run. The shm cases are the quick subset that covers the
# collectives, split, point to point and failure paths without timing bounds
# that valgrind's slowdown would break.
set -euo pipefail
build=${1:?usage: valgrind.sh BUILD_DIR}
vg=(valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite)
# valgrind does not know pidfd_open yet and says so once per call; braid then
# watches peers through /proc instead, which is what runs here.
filter() { grep -v -e 'unhandled amd64-linux syscall: 434' -e 'README_MISSING_SYSCALL_OR_IOCTL' \
  -e 'consider this a bug' -e 'valgrind.org/support/bug_reports' -e 'write your own handler' || true; }
export BRAID_TEST_QUICK=1
run() {
  echo "-- $*"
  set +e
  "${vg[@]}" "$@" 2>&1 | filter
  local rc=${PIPESTATUS[0]}
  set -e
  [ "$rc" -eq 0 ] || { echo "valgrind: $* failed ($rc)"; exit 1; }
}
run "$build/tests/test_api"
run "$build/tests/test_threads" test_concurrent_calls
run "$build/tests/test_threads" test_sync_waits_for_other_thread
for case in coll_small split p2p_ring p2p_mismatch mix pipes; do
  run "$build/tests/test_shm" "$case"
done
