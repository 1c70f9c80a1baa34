/* Grouped calls (braid_group_start / braid_group_end) on every backend: a
   ring exchange of 64 MiB issued inside a group completes without deadlock;
   an irregular exchange of sends and receives and collectives share a
   group; collectives queued in a group do not run before the outermost
   braid_group_end and then run in issue order, across communicators; the
   first error is what braid_group_end returns; a communicator with calls
   in another thread's group is not destroyed under them, and a thread
   that ends inside a group drops its queue. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

static int for_backends(int minr, int maxn, double timeout, bt_body body) {
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++)
    for (int n = minr; n <= maxn && n <= maxr[b]; n++)
      if (bt_run_ranks(names[b], n, timeout, body, NULL)) {
        fprintf(stderr, "group: backend %s, %d ranks failed\n", names[b], n);
        return 1;
      }
  return 0;
}

/* Each rank receives 64 MiB from its left neighbour and sends 64 MiB to
   its right one, and all-reduces a small vector, all in one group. */
static int ring_body(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  const size_t count = (bt_quick() ? 8u : 64u) << 20;
  unsigned char *s = malloc(count), *r = malloc(count);
  BT_CHECK(s && r, "out of memory");
  for (size_t i = 0; i < count; i += 4096) s[i] = (unsigned char)(rank * 31 + (int)(i >> 12));
  memset(r, 0, count);
  int v[4] = {rank, 1, 2, 3};
  BT_CHECK_OK(braid_group_start(), NULL);
  BT_CHECK_OK(braid_recv(c, r, count, BRAID_U8, (rank + n - 1) % n, 9), c);
  BT_CHECK_OK(braid_all_reduce(c, v, 4, BRAID_I32, BRAID_SUM), c);
  BT_CHECK_OK(braid_send(c, s, count, BRAID_U8, (rank + 1) % n, 9), c);
  BT_CHECK_OK(braid_group_end(), NULL);
  BT_CHECK_OK(braid_sync(c), c);
  int left = (rank + n - 1) % n;
  for (size_t i = 0; i < count; i += 4096)
    BT_CHECK(r[i] == (unsigned char)(left * 31 + (int)(i >> 12)), "byte %zu from rank %d", i, left);
  BT_CHECK(v[0] == n * (n - 1) / 2 && v[1] == n && v[3] == 3 * n, "the grouped all-reduce");
  free(s);
  free(r);
  return 0;
}

static int test_ring_exchange_64mib(void) { return for_backends(2, bt_quick() ? 2 : 3, 300, ring_body); }

/* Rank i sends i + j + 1 ints to rank j (an uneven exchange, every pair),
   posted in a group with a reduce in the middle. */
static int irregular_body(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  int *out[16], *in[16], red = rank + 1, sum = 0;
  BT_CHECK(n <= 16, "too many ranks");
  BT_CHECK_OK(braid_group_start(), NULL);
  for (int j = 0; j < n; j++) {
    size_t so = (size_t)(rank + j + 1);
    out[j] = malloc(so * sizeof(int));
    in[j] = calloc(so, sizeof(int));
    BT_CHECK(out[j] && in[j], "out of memory");
    for (size_t k = 0; k < so; k++) out[j][k] = rank * 1000 + j * 10 + (int)k;
    BT_CHECK_OK(braid_send(c, out[j], so, BRAID_I32, j, 3), c);
    if (j == n / 2) BT_CHECK_OK(braid_reduce(c, &red, &sum, 1, BRAID_I32, BRAID_SUM, 0), c);
    BT_CHECK_OK(braid_recv(c, in[j], so, BRAID_I32, j, 3), c);
  }
  BT_CHECK_OK(braid_group_end(), NULL);
  BT_CHECK_OK(braid_sync(c), c);
  for (int j = 0; j < n; j++) {
    for (size_t k = 0; k < (size_t)(rank + j + 1); k++)
      BT_CHECK(in[j][k] == j * 1000 + rank * 10 + (int)k, "from rank %d element %zu", j, k);
    free(out[j]);
    free(in[j]);
  }
  if (rank == 0) BT_CHECK(sum == n * (n + 1) / 2, "grouped reduce %d", sum);
  return 0;
}

static int test_irregular_exchange(void) { return for_backends(1, 4, 120, irregular_body); }

/* Queued collectives wait for the outermost braid_group_end, then run in
   issue order; communicators of one group run in the order of their calls. */
static int order_body(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  braid_comm *child = NULL;
  BT_CHECK_OK(braid_split(c, 0, (uint32_t)(n - rank), &child), c);
  double x[2] = {rank + 1.0, 1}, y = rank == 0 ? 7 : 0, z = 1;
  BT_CHECK_OK(braid_group_start(), NULL);
  BT_CHECK_OK(braid_group_start(), NULL);
  BT_CHECK_OK(braid_all_reduce(c, x, 2, BRAID_F64, BRAID_SUM), c);
  BT_CHECK_OK(braid_broadcast(child, &y, 1, BRAID_F64, n - 1), child); /* child rank n-1 is rank 0 */
  BT_CHECK_OK(braid_group_end(), NULL);
  BT_CHECK(x[0] == rank + 1.0 && x[1] == 1 && y == (rank == 0 ? 7 : 0), "ran before the outermost group end");
  /* issue order decides: the broadcast takes the sum, then all-reduce */
  BT_CHECK_OK(braid_broadcast(c, x, 2, BRAID_F64, n - 1), c);
  BT_CHECK_OK(braid_all_reduce(child, &z, 1, BRAID_F64, BRAID_SUM), child);
  BT_CHECK_OK(braid_barrier(c), c);
  BT_CHECK_OK(braid_group_end(), NULL);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(x[0] == n * (n + 1) / 2.0 && x[1] == n, "x = %g %g", x[0], x[1]);
  BT_CHECK(y == 7 && z == n, "y %g z %g", y, z);
  BT_CHECK_OK(braid_destroy(child), NULL);
  return 0;
}

static int test_order(void) { return for_backends(1, 4, 120, order_body); }

/* The first error wins: a queued call on a communicator aborted before the
   group ends fails, the later call on another communicator still runs. */
static int error_body(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  (void)n;
  braid_comm *mine = NULL;
  BT_CHECK_OK(braid_split(c, (uint32_t)rank, 0, &mine), c); /* one rank each */
  float two = 2, v[2] = {1, 2}, w[1] = {5};
  braid_op op;
  BT_CHECK_OK(braid_op_premul_sum(c, &two, BRAID_F32, &op), c);
  BT_CHECK_OK(braid_group_start(), NULL);
  BT_CHECK_OK(braid_all_reduce(mine, w, 1, BRAID_F32, BRAID_SUM), mine);
  BT_CHECK_OK(braid_all_reduce(c, v, 2, BRAID_F32, op), c);
  BT_CHECK_OK(braid_abort(mine), NULL);
  BT_CHECK_ST(braid_group_end(), BRAID_ERR_ABORTED, NULL);
  BT_CHECK_MSG(NULL, "braid_all_reduce: communicator failed earlier");
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(v[0] == 2.0f * (float)n && v[1] == 4.0f * (float)n, "the call after the failed one ran: %g", v[0]);
  BT_CHECK_OK(braid_destroy(mine), NULL);
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

static int test_first_error(void) { return for_backends(1, 3, 120, error_body); }

/* In place, all-to-allv's send arrays are not read, inside a group as
   outside: here they are one element long, right before a page that
   cannot be read. */
static int inplace_a2av_body(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  long pg = sysconf(_SC_PAGESIZE);
  char *m = mmap(NULL, (size_t)pg * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  BT_CHECK(m != MAP_FAILED, "mmap");
  BT_CHECK(mprotect(m + pg, (size_t)pg, PROT_NONE) == 0, "mprotect");
  size_t *one = (size_t *)(m + pg) - 1;
  *one = 1;
  size_t counts[16], displs[16];
  int buf[16];
  for (int q = 0; q < n; q++) {
    counts[q] = 1;
    displs[q] = (size_t)q;
    buf[q] = rank * 10 + q; /* the block for rank q */
  }
  BT_CHECK_OK(braid_group_start(), NULL);
  BT_CHECK_OK(braid_all_to_allv(c, buf, one, one, buf, counts, displs, BRAID_I32), c);
  BT_CHECK_OK(braid_group_end(), NULL);
  BT_CHECK_OK(braid_sync(c), c);
  for (int q = 0; q < n; q++) BT_CHECK(buf[q] == q * 10 + rank, "block from rank %d: %d", q, buf[q]);
  munmap(m, (size_t)pg * 2);
  return 0;
}

static int test_in_place_alltoallv(void) { return for_backends(1, 3, 120, inplace_a2av_body); }

/* A barrier queued in a group covers the sends and receives issued
   before it, not the group's later ones: rank 0's later receive is sent
   only after rank 1's own barrier, which would never come if rank 0's
   barrier waited for it. The earlier receive is complete when
   braid_group_end returns. */
static int barrier_body(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  int32_t early = -1, late = -1, v = 5;
  if (rank == 0) {
    BT_CHECK_OK(braid_group_start(), NULL);
    BT_CHECK_OK(braid_recv(c, &early, 1, BRAID_I32, 1, 5), c);
    BT_CHECK_OK(braid_barrier(c), c);
    BT_CHECK_OK(braid_recv(c, &late, 1, BRAID_I32, 1, 7), c);
    BT_CHECK_OK(braid_group_end(), NULL);
    BT_CHECK(early == 5, "the receive issued before the barrier holds %d after braid_group_end", early);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(late == 7, "the receive issued after the barrier holds %d", late);
  } else {
    if (rank == 1) BT_CHECK_OK(braid_send(c, &v, 1, BRAID_I32, 0, 5), c);
    BT_CHECK_OK(braid_group_start(), NULL);
    BT_CHECK_OK(braid_barrier(c), c);
    BT_CHECK_OK(braid_group_end(), NULL);
    v = 7;
    if (rank == 1) BT_CHECK_OK(braid_send(c, &v, 1, BRAID_I32, 0, 7), c);
    BT_CHECK_OK(braid_sync(c), c);
  }
  (void)n;
  return 0;
}

static int test_barrier_before_later_receive(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=30", NULL};
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++)
    for (int n = 2; n <= 3 && n <= maxr[b]; n++) {
      bt_run_opts o = {names[b], n, 60, env, -1};
      if (bt_run_ranks_ex(&o, barrier_body, NULL, NULL)) {
        fprintf(stderr, "group: barrier, backend %s, %d ranks failed\n", names[b], n);
        return 1;
      }
    }
  return 0;
}

/* A second thread queues an all-reduce on a child communicator in its
   group and ends the group when told (`run`), or ends without ending it. */
typedef struct {
  braid_comm *child;
  float v[3];
  int run;
  braid_status queued, ended;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stage; /* 1: queued; 2: the main thread's destroy was tried */
} grouper;

static void *grouper_main(void *arg) {
  grouper *g = arg;
  g->queued = braid_group_start();
  if (!g->queued) g->queued = braid_all_reduce(g->child, g->v, 3, BRAID_F32, BRAID_SUM);
  pthread_mutex_lock(&g->mu);
  g->stage = 1;
  pthread_cond_broadcast(&g->cv);
  while (g->run && g->stage < 2) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  if (g->run) g->ended = braid_group_end();
  return NULL;
}

static int other_thread_body(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  for (int run = 1; run >= 0; run--) {
    grouper g = {.run = run, .v = {1, 2, (float)rank}, .ended = -1};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    BT_CHECK_OK(braid_split(c, 0, (uint32_t)rank, &g.child), c);
    pthread_t t;
    BT_CHECK(pthread_create(&t, NULL, grouper_main, &g) == 0, "pthread_create");
    pthread_mutex_lock(&g.mu);
    while (g.stage < 1) pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    BT_CHECK_OK(g.queued, g.child);
    if (run) {
      /* Refused while the call waits in the other thread's group; the
         communicator still works afterwards. */
      BT_CHECK_ST(braid_destroy(g.child), BRAID_ERR_INVALID_ARG, NULL);
      BT_CHECK_MSG(NULL, "braid_destroy: 1 call(s) on this communicator wait in another thread's group");
      BT_CHECK_MSG(g.child, "braid_destroy: 1 call(s) on this communicator wait in another thread's group");
      pthread_mutex_lock(&g.mu);
      g.stage = 2;
      pthread_cond_broadcast(&g.cv);
      pthread_mutex_unlock(&g.mu);
    }
    BT_CHECK(pthread_join(t, NULL) == 0, "pthread_join");
    if (run) {
      BT_CHECK_OK(g.ended, g.child);
      BT_CHECK_OK(braid_sync(g.child), g.child);
      const float s3 = (float)(n * (n - 1) / 2);
      BT_CHECK(g.v[0] == (float)n && g.v[1] == 2.0f * (float)n && g.v[2] == s3, "all-reduce after the group: %g %g %g",
               g.v[0], g.v[1], g.v[2]);
    } else {
      /* The thread ended inside its group: the call never ran. */
      BT_CHECK(g.v[0] == 1.0f && g.v[2] == (float)rank, "a dropped call ran: %g", g.v[0]);
    }
    float w = 1;
    BT_CHECK_OK(braid_all_reduce(g.child, &w, 1, BRAID_F32, BRAID_SUM), g.child);
    BT_CHECK(w == (float)n, "all-reduce on the child: %g", w);
    BT_CHECK_OK(braid_destroy(g.child), NULL);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
  }
  return 0;
}

static int test_destroy_from_other_thread(void) { return for_backends(1, 3, 120, other_thread_body); }

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      {"ring_exchange_64mib", test_ring_exchange_64mib, 600},
      BT_CASE(test_irregular_exchange),
      BT_CASE(test_order),
      BT_CASE(test_first_error),
      BT_CASE(test_in_place_alltoallv),
      BT_CASE(test_barrier_before_later_receive),
      BT_CASE(test_destroy_from_other_thread),
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
