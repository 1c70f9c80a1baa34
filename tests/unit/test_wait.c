/* The wait engine's rule for crowded CPUs: reading a thread's run delay
   (schedstat parsing, and a delay that grows while more threads spin than
   there are CPUs) and the state's hysteresis. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "core/wait.h"
#include "harness.h"
#include "os/sched.h"
#include "os/time.h"

static int test_parse(void) {
  static const struct {
    const char *text;
    int ok;
    uint64_t want;
  } cases[] = {
      {"2987615 0 1\n", 1, 0},
      {"123 456 7\n", 1, 456},
      {"123 18446744073709551615 7", 1, UINT64_MAX},
      {"5 6", 1, 6},
      {"", 0, 0},
      {"123\n", 0, 0},
      {"123 x 7\n", 0, 0},
      {"123 -4 7\n", 0, 0},
      {"123 4x 7\n", 0, 0},
      {"123 18446744073709551616 7\n", 0, 0},
      {"abc 4 7\n", 0, 0},
  };
  for (size_t i = 0; i < BT_COUNT(cases); i++) {
    uint64_t ns = 42;
    int r = braid__parse_schedstat(cases[i].text, &ns);
    BT_CHECK((r == 0) == cases[i].ok, "\"%s\": %s", cases[i].text, r ? "rejected" : "accepted");
    if (cases[i].ok) BT_CHECK(ns == cases[i].want, "\"%s\" gave %llu", cases[i].text, (unsigned long long)ns);
  }
  return 0;
}

static int test_hysteresis(void) {
  /* On at a quarter of the time, off below a twentieth, kept in between
     (the yields of crowded ranks keep their own share in that band). */
  BT_CHECK(braid__crowded_next(0, 0.5) == 1 && braid__crowded_next(0, 0.25) == 1, "a crowded sample turns it on");
  BT_CHECK(braid__crowded_next(0, 0.2) == 0 && braid__crowded_next(0, 0.0) == 0, "a light one leaves it off");
  BT_CHECK(braid__crowded_next(1, 0.2) == 1 && braid__crowded_next(1, 0.05) == 1, "in between: kept on");
  BT_CHECK(braid__crowded_next(1, 0.049) == 0 && braid__crowded_next(1, 0.0) == 0, "a quiet sample turns it off");
  BT_CHECK(atomic_load(&braid__crowded) == 0, "off until a wait finds the CPUs crowded");
  return 0;
}

static atomic_int stop;
static void *spin(void *arg) {
  uint64_t *grew = arg, before = 0, after = 0;
  if (braid__run_delay_ns(&before)) {
    *grew = UINT64_MAX; /* not readable: the caller skips */
    return NULL;
  }
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
  }
  braid__run_delay_ns(&after);
  *grew = after - before;
  return NULL;
}

/* Four spinning threads on one CPU for a fifth of a second: the scheduler
   must have kept some of them waiting. */
static int test_run_delay_grows(void) {
  uint64_t ns;
  if (braid__run_delay_ns(&ns)) {
    fprintf(stderr, "skipped: this kernel has no /proc/thread-self/schedstat\n");
    return BT_SKIP;
  }
  cpu_set_t allowed, one;
  BT_CHECK(sched_getaffinity(0, sizeof allowed, &allowed) == 0, "sched_getaffinity");
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) cpu++;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  BT_CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "pinning to CPU %d", cpu);
  enum { n = 4 };
  pthread_t th[n];
  uint64_t grew[n] = {0}, total = 0;
  for (int i = 0; i < n; i++) BT_CHECK(pthread_create(&th[i], NULL, spin, &grew[i]) == 0, "thread %d", i);
  braid__sleep(0.2);
  atomic_store(&stop, 1);
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < n; i++) {
    BT_CHECK(grew[i] != UINT64_MAX, "thread %d could not read its run delay", i);
    total += grew[i];
  }
  BT_CHECK(total > 0, "%d threads spun on one CPU and none waited for it", n);
  return 0;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {BT_CASE(test_parse), BT_CASE(test_hysteresis), BT_CASE(test_run_delay_grows)};
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
