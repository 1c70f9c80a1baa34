/*
 * A rank of the multi-host tests (tests/unit/test_net.c), started by braidrun
 * inside a network namespace:
 *   matrix          the conformance matrix (tests/harness/coll_check.c) on the
 *                   world and on split children, and ring exchanges of 1 B and
 *                   64 MiB; exit 0 when every check passes
 *   loop SECONDS    all-reduces of 4 MiB until one fails; prints
 *                   "netcheck: rank R: STATUS after T s: MESSAGE" and exits 0
 *                   when one failed (the link went down), 1 when none did
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "braid.h"
#include "coll_check.h"
#include "harness.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int ring(braid_comm *c, int rank, int n, size_t cnt) {
  unsigned char *s = malloc(cnt + 1), *r = malloc(cnt + 1); /* + 1: never malloc(0) */
  BT_CHECK(s && r, "out of memory");
  for (size_t i = 0; i < cnt; i++) s[i] = (unsigned char)(rank * 31 + i * 7);
  int left = (rank + n - 1) % n;
  BT_CHECK_OK(braid_recv(c, r, cnt, BRAID_U8, left, 1), c);
  BT_CHECK_OK(braid_send(c, s, cnt, BRAID_U8, (rank + 1) % n, 1), c);
  BT_CHECK_OK(braid_sync(c), c);
  for (size_t i = 0; i < cnt; i++) BT_CHECK(r[i] == (unsigned char)(left * 31 + i * 7), "byte %zu", i);
  free(s);
  free(r);
  return 0;
}

static int matrix_all(braid_comm *c) {
  int rank = braid_rank(c), n = braid_world_size(c);
  static const size_t small[] = {0, 1, 7};
  static const size_t big[] = {1000003};
  matrix ms = {small, 3, 1, 0}, mb = {big, 1, 0, 0};
  if (bt_coll_matrix_body(c, rank, n, &ms) || bt_coll_matrix_body(c, rank, n, &mb)) return 1;
  if (ring(c, rank, n, 1) || ring(c, rank, n, 64u << 20)) return 1;
  braid_comm *child = NULL;
  BT_CHECK_OK(braid_split(c, (uint32_t)(rank % 2), (uint32_t)(n - rank), &child), c);
  if (bt_coll_matrix_body(child, braid_rank(child), braid_world_size(child), &ms)) return 1;
  BT_CHECK_OK(braid_destroy(child), NULL);
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

static int loop(braid_comm *c, double seconds) {
  size_t cnt = (4u << 20) / 4;
  float *x = calloc(cnt, 4);
  BT_CHECK(x != NULL, "out of memory");
  double t0 = now_s(), last_ok = t0;
  while (now_s() - t0 < seconds) {
    braid_status st = braid_all_reduce(c, x, cnt, BRAID_F32, BRAID_SUM);
    if (st == BRAID_OK) {
      if (last_ok == t0) { /* the test may now cut a link */
        printf("netcheck: rank %d: looping\n", braid_rank(c));
        fflush(stdout);
      }
      last_ok = now_s();
      continue;
    }
    printf("netcheck: rank %d: %s after %.2f s: %s\n", braid_rank(c), braid_status_string(st), now_s() - last_ok,
           braid_last_error(c));
    fflush(stdout);
    free(x);
    return 0;
  }
  printf("netcheck: rank %d: no failure in %.0f s\n", braid_rank(c), seconds);
  free(x);
  return 1;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "matrix";
  bt_rank = atoi(getenv("BRAID_RANK") ? getenv("BRAID_RANK") : "0");
  braid_comm *c = NULL;
  if (braid_init(NULL, &c) != BRAID_OK) {
    fprintf(stderr, "netcheck: %s\n", braid_last_error(NULL));
    return 2;
  }
  int rc = 2;
  if (!strcmp(mode, "matrix")) rc = matrix_all(c);
  else if (!strcmp(mode, "loop") && argc > 2) rc = loop(c, atof(argv[2]));
  else fprintf(stderr, "netcheck: unknown mode %s\n", mode);
  if (!rc && !strcmp(mode, "matrix")) printf("netcheck: rank %d: matrix ok\n", braid_rank(c));
  braid_destroy(c);
  return rc;
}
