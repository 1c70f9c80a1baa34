/* The rules by which rank 0 picks the path of a large shm all-to-all(v)
   (backends/shm/shm_a2a_pick.h), without a segment: classes by size and
   in place apart; the first calls alternate and the first of each path is
   not timed; the faster path is taken, the other tried again at calls 8,
   16, 32, ... and every 256th; a slow outlier moves an estimate little, a
   faster call sets it; BRAID_SHM_A2A's fixed modes. */
#include <stdint.h>
#include <string.h>

#include "backends/shm/shm_a2a_pick.h"
#include "harness.h"

static int test_classes(void) {
  BT_CHECK(shm_a2a_class_of(8 << 10, 0) == 0, "8 KiB: class %d", shm_a2a_class_of(8 << 10, 0));
  BT_CHECK(shm_a2a_class_of((128 << 10) - 1, 0) == 0, "just under 128 KiB");
  BT_CHECK(shm_a2a_class_of(128 << 10, 0) == 1, "128 KiB: class %d", shm_a2a_class_of(128 << 10, 0));
  BT_CHECK(shm_a2a_class_of(1 << 20, 0) == 4, "1 MiB: class %d", shm_a2a_class_of(1 << 20, 0));
  BT_CHECK(shm_a2a_class_of(SIZE_MAX, 0) == SHM_A2A_SIZES - 1, "the largest size");
  /* In place: the same size, a class of its own. */
  BT_CHECK(shm_a2a_class_of(1 << 20, 1) == 4 + SHM_A2A_SIZES, "1 MiB in place: class %d",
           shm_a2a_class_of(1 << 20, 1));
  BT_CHECK(shm_a2a_class_of(SIZE_MAX, 1) == SHM_A2A_CLASSES - 1, "the last class is the largest in place");
  return 0;
}

/* Runs `calls` calls of one class whose paths take t_staged and t_single
   seconds (the first call of each path `first` times as long); counts how
   many took single copy. */
static int run_class(shm_a2a_class *t, int calls, double t_staged, double t_single, double first, int *singles) {
  int took[2] = {0, 0};
  *singles = 0;
  for (int i = 0; i < calls; i++) {
    const int d = shm_a2a_next(t, 0);
    const double dt = (d ? t_single : t_staged) * (took[d] ? 1 : first);
    took[d]++;
    *singles += d;
    shm_a2a_record(t, d, dt);
  }
  return 0;
}

static int test_alternate_then_faster(void) {
  shm_a2a_class t;
  memset(&t, 0, sizeof t);
  /* The first calls alternate, staged first. */
  for (int i = 0; i < SHM_A2A_TRY; i++) {
    const int d = shm_a2a_next(&t, 0);
    BT_CHECK(d == (i & 1), "call %d took %s", i, d ? "single copy" : "staged rounds");
    shm_a2a_record(&t, d, d ? 1e-3 : 2e-3);
  }
  /* Then single copy (faster), except at the 8th call, which tries staged. */
  BT_CHECK(t.calls == SHM_A2A_TRY && shm_a2a_next(&t, 0) == 0, "call 8 retries the other path");
  shm_a2a_record(&t, 0, 2e-3);
  for (uint64_t k = SHM_A2A_TRY + 1; k < 600; k++) {
    const int d = shm_a2a_next(&t, 0);
    const int retry = (k & (k - 1)) == 0 || k % SHM_A2A_RETRY == 0;
    BT_CHECK(d == !retry, "call %llu took %s", (unsigned long long)k, d ? "single copy" : "staged rounds");
    shm_a2a_record(&t, d, d ? 1e-3 : 2e-3);
  }
  return 0;
}

/* A first call ten times as slow (first touches) does not decide. */
static int test_first_call_not_timed(void) {
  shm_a2a_class t;
  memset(&t, 0, sizeof t);
  int singles;
  run_class(&t, 100, 2e-3, 1e-3, 10, &singles);
  BT_CHECK(t.time[1] == 1e-3 && t.time[0] == 2e-3, "estimates %g / %g", t.time[0], t.time[1]);
  BT_CHECK(singles >= 90, "single copy (twice as fast) took %d of 100 calls", singles);
  memset(&t, 0, sizeof t);
  run_class(&t, 100, 1e-3, 2e-3, 10, &singles);
  BT_CHECK(singles <= 10, "single copy (twice as slow) took %d of 100 calls", singles);
  return 0;
}

/* One slow call moves an estimate by a quarter of its excess; a faster
   one sets it. A path that got slower is left after a few calls. */
static int test_estimates(void) {
  shm_a2a_class t;
  memset(&t, 0, sizeof t);
  shm_a2a_record(&t, 1, 5.0); /* not timed */
  BT_CHECK(t.seen[1] == 1 && t.time[1] == 0, "the first call counted: %g", t.time[1]);
  shm_a2a_record(&t, 1, 1.0);
  shm_a2a_record(&t, 1, 5.0);
  BT_CHECK(t.time[1] == 2.0, "after a slow call: %g", t.time[1]);
  shm_a2a_record(&t, 1, 0.5);
  BT_CHECK(t.time[1] == 0.5, "after a fast call: %g", t.time[1]);
  /* Single copy was chosen at 1 ms; it now takes 4 ms against staged's 2. */
  memset(&t, 0, sizeof t);
  int singles;
  run_class(&t, 100, 2e-3, 1e-3, 1, &singles);
  int switched = 0;
  for (int i = 0; i < 20 && !switched; i++) {
    const int d = shm_a2a_next(&t, 0);
    shm_a2a_record(&t, d, d ? 4e-3 : 2e-3);
    switched = t.time[1] > t.time[0];
  }
  BT_CHECK(switched, "single copy still preferred at %g s against %g", t.time[1], t.time[0]);
  BT_CHECK(shm_a2a_next(&t, 0) == 0 || (t.calls & (t.calls - 1)) == 0, "staged is taken once single copy slowed");
  return 0;
}

static int test_fixed_modes(void) {
  shm_a2a_class t;
  memset(&t, 0, sizeof t);
  for (int i = 0; i < 40; i++) {
    BT_CHECK(shm_a2a_next(&t, 1) == 0, "BRAID_SHM_A2A=staged took single copy at call %d", i);
    BT_CHECK(shm_a2a_next(&t, 2) == 1, "BRAID_SHM_A2A=single took staged rounds at call %d", i);
    shm_a2a_record(&t, i & 1, 1e-3);
  }
  return 0;
}

static const bt_case cases[] = {BT_CASE(test_classes), BT_CASE(test_alternate_then_faster),
                                BT_CASE(test_first_call_not_timed), BT_CASE(test_estimates),
                                BT_CASE(test_fixed_modes)};

int main(int argc, char **argv) { return bt_main(argc, argv, cases, BT_COUNT(cases)); }
