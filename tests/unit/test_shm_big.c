/* Backend shm: a u8 all-reduce of 2^32 + 5 elements (a 4 GiB message, counts
   past 2^31 and 2^32, bounded staging) on 2 ranks; 2^31 + 5 under the
   sanitizers, whose byte loops would take minutes. Needs about 2.5x the
   message per rank free; skipped with a reason when the machine has less. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "braid.h"
#include "harness.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BIG_COUNT ((1ull << 31) + 5)
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define BIG_COUNT ((1ull << 31) + 5)
#endif
#endif
#ifndef BIG_COUNT
#define BIG_COUNT ((1ull << 32) + 5)
#endif

static int body_big(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  unsigned char *buf = malloc(BIG_COUNT);
  BT_CHECK(buf != NULL, "cannot allocate %llu bytes", (unsigned long long)BIG_COUNT);
  for (size_t i = 0; i < BIG_COUNT; i++) buf[i] = rank == 0 ? (unsigned char)(i % 3) : (unsigned char)(1 + (i >> 31));
  /* i % 3 catches elements moved by a truncated index; the step at every
     2^31 catches a block reduced with the wrong part of the other buffer. */
  BT_CHECK_OK(braid_all_reduce(c, buf, BIG_COUNT, BRAID_U8, BRAID_SUM), c);
  for (size_t i = 0; i < BIG_COUNT; i++)
    if (buf[i] != (unsigned char)(i % 3 + 1 + (i >> 31)))
      BT_CHECK(0, "element %zu is %u, expected %u", i, buf[i], (unsigned)(i % 3 + 1 + (i >> 31)));
  free(buf);
  return 0;
}

static int test_big_all_reduce(void) {
  long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  double avail = (double)pages * (double)psz;
  double need = 2.5 * (double)BIG_COUNT;
  if (pages <= 0 || avail < need) {
    printf("skipped: %.1f GiB of memory available, %.1f GiB needed for 2 ranks x %.1f GiB\n", avail / (1u << 30),
           need / (1u << 30), (double)BIG_COUNT / (1u << 30));
    return 0;
  }
  bt_run_opts o = {"shm", 2, 500, NULL, -1};
  return bt_run_ranks_ex(&o, body_big, NULL, NULL);
}

static const bt_case cases[] = {{"big_all_reduce", test_big_all_reduce, 560}};

int main(int argc, char **argv) { return bt_main(argc, argv, cases, BT_COUNT(cases)); }
