/* The harness itself: a failing rank, a crashing rank and a hanging rank are
   each reported as such, and a healthy multi-rank run passes. */
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

static int body_ok(braid_comm *c, int rank, int size, void *arg) {
  (void)arg;
  BT_CHECK(c == NULL, "no communicator in these runs");
  BT_CHECK(rank >= 0 && rank < size && bt_rank == rank, "rank %d of %d", rank, size);
  return 0;
}

static int body_rank2_fails(braid_comm *c, int rank, int size, void *arg) {
  (void)c, (void)size, (void)arg;
  BT_CHECK(rank != 2, "rank 2 fails on purpose");
  return 0;
}

static int body_rank1_crashes(braid_comm *c, int rank, int size, void *arg) {
  (void)c, (void)size, (void)arg;
  if (rank == 1) raise(SIGKILL);
  return 0;
}

static int body_rank0_hangs(braid_comm *c, int rank, int size, void *arg) {
  (void)c, (void)size, (void)arg;
  if (rank == 0) pause();
  return 0;
}

static int test_all_ranks_pass(void) {
  bt_rank_result res[4];
  bt_run_opts o = {NULL, 4, 10, NULL, -1};
  BT_CHECK(bt_run_ranks_ex(&o, body_ok, NULL, res) == 0, "healthy run reported failure");
  for (int r = 0; r < 4; r++) BT_CHECK(res[r].exited && res[r].code == 0 && !res[r].timed_out, "rank %d", r);
  return 0;
}

static int test_failing_rank_reported(void) {
  bt_rank_result res[4];
  bt_run_opts o = {NULL, 4, 10, NULL, 2};
  BT_CHECK(bt_run_ranks_ex(&o, body_rank2_fails, NULL, res) == 1, "failure not reported");
  for (int r = 0; r < 4; r++) {
    int want = r == 2 ? 1 : 0;
    BT_CHECK(res[r].exited && res[r].code == want, "rank %d: exited %d code %d", r, res[r].exited, res[r].code);
  }
  return 0;
}

static int test_crashing_rank_reported(void) {
  bt_rank_result res[3];
  bt_run_opts o = {NULL, 3, 10, NULL, 1};
  BT_CHECK(bt_run_ranks_ex(&o, body_rank1_crashes, NULL, res) == 1, "crash not reported");
  BT_CHECK(!res[1].exited && res[1].code == SIGKILL, "rank 1: exited %d code %d", res[1].exited, res[1].code);
  BT_CHECK(res[0].exited && res[0].code == 0 && res[2].exited && res[2].code == 0, "others passed");
  return 0;
}

static int test_hanging_rank_killed(void) {
  bt_rank_result res[2];
  bt_run_opts o = {NULL, 2, 3.0, NULL, 0}; /* long enough for rank 1 on a loaded machine */
  BT_CHECK(bt_run_ranks_ex(&o, body_rank0_hangs, NULL, res) == 1, "hang not reported");
  BT_CHECK(res[0].timed_out, "rank 0 should be marked timed out");
  BT_CHECK(!res[1].timed_out && res[1].code == 0, "rank 1 finished");
  return 0;
}

static int body_self(braid_comm *c, int rank, int size, void *arg) {
  (void)arg;
  BT_CHECK(c && braid_rank(c) == rank && braid_world_size(c) == size, "comm matches the harness");
  float x = 2.5f;
  BT_CHECK_OK(braid_all_reduce(c, &x, 1, BRAID_F32, BRAID_SUM), c);
  BT_CHECK(x == 2.5f * (float)size, "sum over %d ranks gave %g", size, (double)x);
  return 0;
}

/* Every built backend runs the same body through the harness. */
static int test_backends_through_harness(void) {
  const char *names[16];
  int maxr[16];
  int n = bt_backends(names, maxr, 16);
  BT_CHECK(n >= 1, "no backend to test");
  for (int i = 0; i < n; i++) {
    int sizes[] = {1, 2, 4};
    for (size_t s = 0; s < BT_COUNT(sizes); s++) {
      if (sizes[s] > maxr[i]) continue;
      BT_CHECK(bt_run_ranks(names[i], sizes[s], 30, body_self, NULL) == 0, "%s x%d", names[i], sizes[s]);
    }
  }
  return 0;
}

static const bt_case cases[] = {
    BT_CASE(test_all_ranks_pass),      BT_CASE(test_failing_rank_reported), BT_CASE(test_crashing_rank_reported),
    BT_CASE(test_hanging_rank_killed), BT_CASE(test_backends_through_harness),
};

int main(int argc, char **argv) { return bt_main(argc, argv, cases, BT_COUNT(cases)); }
