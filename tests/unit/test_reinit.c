/* braid_init again after braid_destroy in the same processes: under an
   external store that still holds the earlier worlds' keys, and with rank 0
   hosting the store, where the previous world's store may still be up for
   the last goodbyes while the other ranks dial again. 1, 2 and 4 ranks,
   three worlds each, with a split in every world. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "harness.h"
#include "os/time.h"

#define ROUNDS 3

typedef struct reinit_case {
  int port;
  const char *token_hex; /* NULL: a loopback-only store without a token */
  const char *job_id;    /* NULL: none (rank 0 hosts) */
  int external;
  int host_lags;         /* rank 0 destroys late, so the others dial the old store first */
} reinit_case;

static void set_int(const char *name, int v) {
  char b[32];
  snprintf(b, sizeof b, "%d", v);
  setenv(name, b, 1);
}

static int body_reinit(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  const reinit_case *rc = arg;
  char v[64];
  set_int("BRAID_RANK", rank);
  set_int("BRAID_WORLD_SIZE", n);
  setenv("BRAID_BACKEND", n == 1 ? "self" : "shm", 1);
  snprintf(v, sizeof v, "127.0.0.1:%d", rc->port);
  setenv("BRAID_STORE", v, 1);
  setenv("BRAID_STORE_EXTERNAL", rc->external ? "1" : "0", 1);
  if (rc->token_hex)
    setenv("BRAID_TOKEN", rc->token_hex, 1);
  else
    unsetenv("BRAID_TOKEN");
  if (rc->job_id)
    setenv("BRAID_JOB_ID", rc->job_id, 1);
  else
    unsetenv("BRAID_JOB_ID");
  unsetenv("BRAID_LOCAL_RANK"); /* derived through the store's host counter, per world */
  unsetenv("BRAID_LOCAL_SIZE");
  setenv("BRAID_INIT_TIMEOUT", "20", 1);
  for (int round = 0; round < ROUNDS; round++) {
    braid_comm *c = NULL, *half = NULL;
    BT_CHECK_OK(braid_init(NULL, &c), NULL);
    BT_CHECK(braid_rank(c) == rank && braid_world_size(c) == n, "world %d: rank %d of %d", round, braid_rank(c),
             braid_world_size(c));
    int x = rank + 1 + round;
    BT_CHECK_OK(braid_all_reduce(c, &x, 1, BRAID_I32, BRAID_SUM), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(x == n * (n + 1) / 2 + n * round, "world %d: sum %d", round, x);
    BT_CHECK_OK(braid_split(c, (uint32_t)(rank % 2), 0, &half), c);
    int y = 1;
    BT_CHECK_OK(braid_all_reduce(half, &y, 1, BRAID_I32, BRAID_SUM), half);
    BT_CHECK_OK(braid_sync(half), half);
    BT_CHECK(y == braid_world_size(half), "world %d: split sum %d of %d", round, y, braid_world_size(half));
    BT_CHECK_OK(braid_destroy(half), NULL);
    BT_CHECK_OK(braid_barrier(c), c);
    if (rc->host_lags && rank == 0) braid__sleep(0.5);
    BT_CHECK_OK(braid_destroy(c), NULL);
  }
  return 0;
}

static int run(const reinit_case *rc, int n) {
  bt_run_opts o = {NULL, n, 60, NULL, -1};
  return bt_run_ranks_ex(&o, body_reinit, (void *)rc, NULL);
}

/* braidrun's way: a store outside the ranks, keeping every world's keys. */
static int test_external_store(void) {
  bt_store s;
  BT_CHECK(bt_store_start(&s) == 0, "store");
  int rc = 0;
  const int sizes[] = {1, 2, 4};
  for (int i = 0; i < 3 && !rc; i++) {
    char job[96];
    snprintf(job, sizeof job, "%s-%d", s.job_id, sizes[i]);
    reinit_case c = {s.port, s.token_hex, job, 1, 0};
    rc = run(&c, sizes[i]);
    if (rc) fprintf(stderr, "external store, %d ranks failed\n", sizes[i]);
  }
  bt_store_stop(&s);
  BT_CHECK(rc == 0, "re-initialization under an external store");
  return 0;
}

/* Rank 0 hosts: every world starts a store of its own at the same address. */
static int test_rank0_hosts(void) {
  const int sizes[] = {1, 2, 4};
  for (int i = 0; i < 3; i++) {
    reinit_case c = {bt_free_port(), "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", NULL, 0, 0};
    BT_CHECK(c.port > 0, "port");
    BT_CHECK(run(&c, sizes[i]) == 0, "rank 0 hosting, with a token, %d ranks", sizes[i]);
    c.port = bt_free_port();
    c.token_hex = NULL;
    BT_CHECK(run(&c, sizes[i]) == 0, "rank 0 hosting, no token, %d ranks", sizes[i]);
  }
  return 0;
}

/* The others are back in braid_init while rank 0 still runs the previous
   world: they reach its old store, which closes under them, and dial again. */
static int test_rank0_hosts_late(void) {
  const int sizes[] = {2, 4};
  for (int i = 0; i < 2; i++) {
    reinit_case c = {bt_free_port(), "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", NULL, 0, 1};
    BT_CHECK(c.port > 0, "port");
    BT_CHECK(run(&c, sizes[i]) == 0, "rank 0 hosting and late, %d ranks", sizes[i]);
  }
  return 0;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      {"external_store", test_external_store, 120},
      {"rank0_hosts", test_rank0_hosts, 120},
      {"rank0_hosts_late", test_rank0_hosts_late, 120},
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
