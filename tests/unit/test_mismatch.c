/* The cross-rank call check: ranks that disagree on a collective (its kind,
   op, dtype, count or root, or a rank that skipped one) all fail with
   BRAID_ERR_MISMATCH, promptly (not by the timeout), with a sentence that
   names both calls; the communicator stays failed. On every backend, on
   its native collectives and on the generic algorithms, at every size
   class (flat slots, staging, single copy). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/comm.h"
#include "core/p2p.h"
#include "harness.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum { K_AR, K_BC, K_AG, K_RS, K_BARRIER, K_SKIP, K_RD, K_GA, K_SC, K_A2A, K_A2AV, K_ARP };

/* One call as a rank makes it. */
typedef struct call {
  int kind;
  braid_dtype dt;
  braid_op op;
  size_t count;
  int root;
} call;

typedef struct mcase {
  const char *name;
  call normal, odd; /* what most ranks call, what the odd rank calls */
  int odd_rank;
} mcase;

/* The descriptor text the sentence must hold for a call. */
static void describe(const call *k, char *out, size_t len) {
  const char *dt = braid_dtype_name(k->dt);
  switch (k->kind) {
  case K_AR: snprintf(out, len, "braid_all_reduce(%zu x %s, %s)", k->count, dt, braid_op_name(k->op)); break;
  case K_RS: snprintf(out, len, "braid_reduce_scatter(%zu x %s, %s)", k->count, dt, braid_op_name(k->op)); break;
  case K_BC: snprintf(out, len, "braid_broadcast(root %d, %zu x %s)", k->root, k->count, dt); break;
  case K_AG: snprintf(out, len, "braid_all_gather(%zu x %s)", k->count, dt); break;
  case K_RD:
    snprintf(out, len, "braid_reduce(root %d, %zu x %s, %s)", k->root, k->count, dt, braid_op_name(k->op));
    break;
  case K_GA: snprintf(out, len, "braid_gather(root %d, %zu x %s)", k->root, k->count, dt); break;
  case K_SC: snprintf(out, len, "braid_scatter(root %d, %zu x %s)", k->root, k->count, dt); break;
  case K_A2A: snprintf(out, len, "braid_all_to_all(%zu x %s)", k->count, dt); break;
  case K_A2AV: snprintf(out, len, "braid_all_to_allv(%s)", dt); break;
  /* the scalar's digest is the library's: the text up to it */
  case K_ARP: snprintf(out, len, "braid_all_reduce(%zu x %s, premul_sum #", k->count, dt); break;
  default: snprintf(out, len, "braid_barrier()"); break;
  }
}

/* K_ARP: a scaled sum by 0.5, or by 0.25 when root is 1. */
static braid_status issue_premul(braid_comm *c, const call *k, void *buf) {
  float s = k->root ? 0.25f : 0.5f;
  braid_op op;
  braid_status st = braid_op_premul_sum(c, &s, BRAID_F32, &op);
  return st ? st : braid_all_reduce(c, buf, k->count, k->dt, op);
}

static braid_status issue_a2av(braid_comm *c, int n, const call *k, void *buf) {
  size_t *v = malloc(sizeof(size_t) * 2 * (size_t)n);
  if (!v) return BRAID_ERR_NO_MEMORY;
  for (int j = 0; j < n; j++) v[j] = k->count, v[n + j] = (size_t)j * k->count;
  braid_status st = braid_all_to_allv(c, buf, v, v + n, (char *)buf + k->count * (size_t)n * 4, v, v + n, k->dt);
  free(v);
  return st;
}

static braid_status issue(braid_comm *c, int n, const call *k, void *buf) {
  switch (k->kind) {
  case K_AR: return braid_all_reduce(c, buf, k->count, k->dt, k->op);
  case K_RS: return braid_reduce_scatter(c, buf, (char *)buf + k->count * (size_t)n * 8, k->count, k->dt, k->op);
  case K_BC: return braid_broadcast(c, buf, k->count, k->dt, k->root);
  case K_AG: return braid_all_gather(c, buf, (char *)buf + k->count * 8, k->count, k->dt);
  case K_RD: return braid_reduce(c, buf, (char *)buf + k->count * 8, k->count, k->dt, k->op, k->root);
  case K_GA: return braid_gather(c, buf, (char *)buf + k->count * 8, k->count, k->dt, k->root);
  case K_SC: return braid_scatter(c, buf, (char *)buf + k->count * (size_t)n * 8, k->count, k->dt, k->root);
  case K_A2A: return braid_all_to_all(c, buf, (char *)buf + k->count * (size_t)n * 4, k->count, k->dt);
  case K_A2AV: return issue_a2av(c, n, k, buf);
  case K_ARP: return issue_premul(c, k, buf);
  default: return braid_barrier(c);
  }
}

static int body(braid_comm *c, int rank, int n, void *arg) {
  const mcase *m = arg;
  size_t most = m->normal.count > m->odd.count ? m->normal.count : m->odd.count;
  void *buf = calloc(most * (size_t)(n + 2), 8);
  BT_CHECK(buf != NULL, "out of memory");
  /* A matching collective first: the mismatch is not the first call. A rank
     still in it when another rank finds the mismatch in the next call may
     get the error there (the communicator fails on every rank); then the
     sentence must name the later call. */
  braid_status st0 = braid_all_reduce(c, buf, 4, BRAID_F32, BRAID_SUM);
  if (st0 != BRAID_OK) {
    BT_CHECK(st0 == BRAID_ERR_MISMATCH, "%s: rank %d's matching all-reduce got %s: %s", m->name, rank,
             braid_status_string(st0), braid_last_error(c));
    const char *msg = braid_last_error(c);
    BT_CHECK(strstr(msg, " #1: ") == NULL && strstr(msg, " #") != NULL,
             "%s: rank %d's matching all-reduce failed, but not with a later call's sentence: %s", m->name, rank, msg);
    BT_CHECK_ST(braid_all_reduce(c, buf, 4, BRAID_F32, BRAID_SUM), BRAID_ERR_MISMATCH, c);
    BT_CHECK_MSG(c, "communicator failed earlier");
    free(buf);
    return 0;
  }
  const call *mine = rank == m->odd_rank ? &m->odd : &m->normal;
  double t0 = now_s();
  braid_status st = mine->kind == K_SKIP ? BRAID_OK : issue(c, n, mine, buf);
  /* A rank whose call needed nothing from the others (a broadcast root, the
     rank that skipped) learns at its next call. */
  if (st == BRAID_OK) st = braid_barrier(c);
  double dt = now_s() - t0;
  BT_CHECK(st == BRAID_ERR_MISMATCH, "%s: rank %d got %s: %s", m->name, rank, braid_status_string(st),
           braid_last_error(c));
  BT_CHECK(dt < 10.0, "%s: noticed after %.2f s", m->name, dt);
  char a[128], b[128];
  const call *skipper = m->odd.kind == K_SKIP ? &m->odd : NULL;
  describe(&m->normal, a, sizeof a);
  if (skipper) {
    /* The skipper's next call stands against the others' collective. */
    call bar = {K_BARRIER, BRAID_U8, BRAID_SUM, 0, 0};
    describe(&bar, b, sizeof b);
  } else {
    describe(&m->odd, b, sizeof b);
  }
  BT_CHECK_MSG(c, a);
  BT_CHECK_MSG(c, b);
  BT_CHECK_MSG(c, " called ");
  BT_CHECK_MSG(c, " where rank ");
  /* Failed for good, with the cause repeated. */
  BT_CHECK_ST(braid_all_reduce(c, buf, 4, BRAID_F32, BRAID_SUM), BRAID_ERR_MISMATCH, c);
  BT_CHECK_MSG(c, "communicator failed earlier");
  free(buf);
  return 0;
}

/* The cases at one count (elements; the size class follows). */
static int cases_at(size_t cnt, mcase *out) {
  int k = 0;
  call ar = {K_AR, BRAID_F32, BRAID_SUM, cnt, 0};
  call v;
  v = ar, v.op = BRAID_MAX;
  out[k++] = (mcase){"op", ar, v, 1};
  v = ar, v.dt = BRAID_I32;
  out[k++] = (mcase){"dtype", ar, v, 1};
  v = ar, v.count = cnt - 1;
  out[k++] = (mcase){"count", ar, v, 1};
  call bc = {K_BC, BRAID_F32, BRAID_SUM, cnt, 0};
  v = bc, v.root = 1;
  out[k++] = (mcase){"root", bc, v, 1};
  out[k++] = (mcase){"broadcast vs all-reduce", ar, bc, 1};
  call ag = {K_AG, BRAID_F32, BRAID_SUM, cnt, 0};
  out[k++] = (mcase){"all-gather vs all-reduce", ar, ag, 0};
  call rs = {K_RS, BRAID_F32, BRAID_SUM, cnt, 0};
  out[k++] = (mcase){"reduce-scatter vs all-reduce", ar, rs, 1};
  call bar = {K_BARRIER, BRAID_U8, BRAID_SUM, 0, 0};
  out[k++] = (mcase){"barrier vs all-reduce", ar, bar, 1};
  call skip = {K_SKIP, BRAID_U8, BRAID_SUM, 0, 0};
  out[k++] = (mcase){"skipped all-reduce", ar, skip, 1};
  call rd = {K_RD, BRAID_F32, BRAID_SUM, cnt, 0};
  v = rd, v.root = 1;
  out[k++] = (mcase){"reduce root", rd, v, 1};
  v = rd, v.op = BRAID_MAX;
  out[k++] = (mcase){"reduce op", rd, v, 0};
  call ga = {K_GA, BRAID_F32, BRAID_SUM, cnt, 0};
  out[k++] = (mcase){"reduce vs gather", rd, ga, 1};
  v = ga, v.root = 1;
  out[k++] = (mcase){"gather root", ga, v, 1};
  call sc = {K_SC, BRAID_F32, BRAID_SUM, cnt, 0};
  v = sc, v.count = cnt - 1;
  out[k++] = (mcase){"scatter count", sc, v, 1};
  out[k++] = (mcase){"scatter vs gather", ga, sc, 0};
  call a2a = {K_A2A, BRAID_F32, BRAID_SUM, cnt, 0};
  v = a2a, v.count = cnt - 1;
  out[k++] = (mcase){"all-to-all count", a2a, v, 1};
  out[k++] = (mcase){"all-to-all vs all-gather", ag, a2a, 1};
  call a2av = {K_A2AV, BRAID_F32, BRAID_SUM, cnt, 0};
  out[k++] = (mcase){"all-to-allv vs all-to-all", a2a, a2av, 1};
  call arp = {K_ARP, BRAID_F32, BRAID_SUM, cnt, 0};
  v = arp, v.root = 1;
  out[k++] = (mcase){"premul scalar", arp, v, 1};
  return k;
}

static int run_all(const char *backend, const char *const *env, const size_t *counts, int ncounts) {
  mcase cs[32];
  static const int sizes[] = {2, 3};
  for (int ci = 0; ci < ncounts; ci++) {
    int nc = cases_at(counts[ci], cs);
    for (int i = 0; i < nc; i++)
      for (size_t si = 0; si < BT_COUNT(sizes); si++) {
        bt_run_opts o = {backend, sizes[si], 60, env, -1};
        if (bt_run_ranks_ex(&o, body, &cs[i], NULL)) {
          fprintf(stderr, "mismatch case \"%s\" failed: backend %s, %d ranks, count %zu, %s\n", cs[i].name, backend,
                  sizes[si], counts[ci], env && env[0] ? env[0] : "native");
          return 1;
        }
      }
  }
  return 0;
}

static int has_backend(const char *name) {
  const char *names[8];
  int maxr[8];
  int nb = bt_backends(names, maxr, 8);
  for (int i = 0; i < nb; i++)
    if (!strcmp(names[i], name) && maxr[i] > 1) return 1;
  return 0;
}

/* 4096 floats: flat slots on shm; 20000: staging; 300000 by single copy. */
static int test_shm_native(void) {
  if (!has_backend("shm")) return 0;
  static const size_t counts[] = {16, 20000, 300000};
  static const char *const env[] = {"BRAID_TIMEOUT=60", NULL};
  static const char *const cma[] = {"BRAID_TIMEOUT=60", "BRAID_SHM_CMA_MIN=64K", NULL};
  return run_all("shm", env, counts, 3) || run_all("shm", cma, counts + 2, 1);
}

static int test_shm_generic(void) {
  if (!has_backend("shm")) return 0;
  static const size_t counts[] = {16, 300000};
  static const char *const env[] = {
      "BRAID_ALGO=allreduce=ring,broadcast=tree,allgather=ring,reduce_scatter=ring,barrier=dissem",
      "BRAID_TIMEOUT=60", NULL};
  static const char *const env2[] = {"BRAID_ALGO=allreduce=rd,broadcast=chain,allgather=bruck,reduce_scatter=rhd",
                                     "BRAID_TIMEOUT=60", NULL};
  return run_all("shm", env, counts, 2) || run_all("shm", env2, counts, 1);
}

/* tcp has no native collectives: the automatic choice, then other
   algorithms; 16 floats go eager, 300000 (above BRAID_TCP_EAGER_MAX) by
   rendezvous. */
static int test_tcp(void) {
  if (!has_backend("tcp")) return 0;
  static const size_t counts[] = {16, 300000};
  static const char *const env[] = {"BRAID_TIMEOUT=60", NULL};
  static const char *const env2[] = {"BRAID_ALGO=allreduce=rd,broadcast=chain,allgather=bruck,reduce_scatter=rhd",
                                     "BRAID_TIMEOUT=60", NULL};
  return run_all("tcp", env, counts, 2) || run_all("tcp", env2, counts, 1);
}

/* Rooted calls at 4 ranks where the last rank differs: its messages go
   to a rank that expects none, which may have finished the call (and be
   waiting in the next) when they arrive, or nobody sends at all while
   ranks wait for each other. */
static int test_rooted_last_rank(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=60", NULL};
  static const char *const wanted[] = {"reduce root", "reduce vs gather", "gather root", "scatter count"};
  static const char *const backends[] = {"tcp", "shm"};
  mcase cs[32];
  const int nc = cases_at(16, cs);
  for (size_t b = 0; b < BT_COUNT(backends); b++) {
    if (!has_backend(backends[b])) continue;
    for (int i = 0; i < nc; i++)
      for (size_t w = 0; w < BT_COUNT(wanted); w++) {
        if (strcmp(cs[i].name, wanted[w])) continue;
        mcase m = cs[i];
        m.odd_rank = 3;
        bt_run_opts o = {backends[b], 4, 60, env, -1};
        if (bt_run_ranks_ex(&o, body, &m, NULL)) {
          fprintf(stderr, "mismatch case \"%s\" with rank 3 odd failed: backend %s\n", m.name, backends[b]);
          return 1;
        }
      }
  }
  return 0;
}

/* With the check off the calls still meet where they can (no false alarm
   on matching calls), and matching calls pass with it on at one rank. */
static int body_ok(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  float v[64];
  for (int i = 0; i < 64; i++) v[i] = (float)(rank + i);
  for (int it = 0; it < 50; it++) {
    BT_CHECK_OK(braid_all_reduce(c, v, 64, BRAID_F32, BRAID_MAX), c);
    BT_CHECK_OK(braid_broadcast(c, v, 64, BRAID_F32, it % n), c);
    BT_CHECK_OK(braid_barrier(c), c);
  }
  return 0;
}

static int test_matching_calls_pass(void) {
  static const char *const off[] = {"BRAID_CHECK=0", NULL};
  const char *names[8];
  int maxr[8];
  int nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++) {
    int n = maxr[b] < 3 ? maxr[b] : 3;
    if (bt_run_ranks(names[b], n, 60, body_ok, NULL)) return 1;
    bt_run_opts o = {names[b], n, 60, off, -1};
    if (bt_run_ranks_ex(&o, body_ok, NULL, NULL)) return 1;
  }
  return 0;
}

/* Two ranks take themselves for the root of one small shm broadcast, and
   the third reads the entry after the second of them wrote it last: the
   word it polls is its own root's, so only that root's mark can tell it
   another rank wrote the entry too. It fails on this call, naming the
   other root's call; the roots learn at their next call.
   The order (root 1 writes, root 0 writes, rank 2 reads, then root 1 goes
   on) is held by a word the forked ranks share, not by sleeps: on a loaded
   machine a rank can be late by any amount. */

static int body_two_roots(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  _Atomic int *step = arg;
  float v[16];
  for (int i = 0; i < 16; i++) v[i] = (float)(rank * 100 + i);
  BT_CHECK_OK(braid_barrier(c), c);
  if (rank == 0) BT_CHECK(bt_await(step, 1, 30), "root 1 never wrote the entry");
  if (rank == 2) BT_CHECK(bt_await(step, 2, 30), "root 0 never wrote the entry");
  braid_status st = braid_broadcast(c, v, 16, BRAID_F32, rank == 1 ? 1 : 0);
  atomic_fetch_add(step, 1); /* a root returns once its bytes are in the entry */
  /* Nothing root 1 could learn may reach the reader first. */
  if (rank == 1) BT_CHECK(bt_await(step, 3, 30), "the reader never returned");
  if (rank == 2) {
    BT_CHECK(st == BRAID_ERR_MISMATCH, "the reader got %s: %s", braid_status_string(st), braid_last_error(c));
    BT_CHECK_MSG(c, "braid_broadcast(root 1");
    BT_CHECK_MSG(c, "braid_broadcast(root 0");
  }
  if (st == BRAID_OK) st = braid_barrier(c);
  BT_CHECK(st == BRAID_ERR_MISMATCH, "rank %d got %s: %s", rank, braid_status_string(st), braid_last_error(c));
  return 0;
}

static int test_shm_two_roots(void) {
  if (!has_backend("shm")) return 0;
  static const char *const env[] = {"BRAID_TIMEOUT=60", NULL};
  bt_run_opts o = {"shm", 3, 60, env, -1};
  _Atomic int *step = bt_shared_counter();
  BT_CHECK(step, "cannot map a shared counter");
  int rc = bt_run_ranks_ex(&o, body_two_roots, (void *)step, NULL);
  bt_shared_free(step);
  return rc;
}

/* A point-to-point mismatch is not fatal: a barrier that finds it waiting
   still takes part in the barrier, then reports it as braid_sync would;
   the ranks stay in step and the next collective works. A barrier, like
   braid_sync, frees the user operations it completed. */
static int body_p2p_then_barrier(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  float x[3] = {1, 2, 3};
  int ready = 1;
  if (rank == 1) { /* the receive is posted before the message comes: its wait finds the mismatch */
    BT_CHECK_OK(braid_recv(c, x, 2, BRAID_F32, 0, 5), c);
    BT_CHECK_OK(braid_send(c, &ready, 1, BRAID_I32, 0, 6), c);
  }
  if (rank == 0) {
    BT_CHECK_OK(braid_recv(c, &ready, 1, BRAID_I32, 1, 6), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK_OK(braid_send(c, x, 3, BRAID_F32, 1, 5), c);
  }
  braid_status st = braid_barrier(c);
  if (rank == 1) {
    BT_CHECK(st == BRAID_ERR_MISMATCH, "rank 1's barrier got %s: %s", braid_status_string(st), braid_last_error(c));
    BT_CHECK_MSG(c, "tag 5 has 3 elements");
  } else {
    BT_CHECK(st == BRAID_OK, "rank %d's barrier got %s: %s", rank, braid_status_string(st), braid_last_error(c));
  }
  float v = 1;
  BT_CHECK_OK(braid_all_reduce(c, &v, 1, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(v == (float)n, "sum %g after the barrier, want %d", v, n);
  /* Only barriers between exchanges: nothing stays allocated. */
  static char b[4096];
  for (int it = 0; it < 200; it++) {
    BT_CHECK_OK(braid_send(c, b, sizeof b, BRAID_U8, (rank + 1) % n, 1), c);
    BT_CHECK_OK(braid_recv(c, b, sizeof b, BRAID_U8, (rank + n - 1) % n, 1), c);
    BT_CHECK_OK(braid_barrier(c), c);
  }
  int kept = 0;
  for (braid__req *r = c->pending; r; r = r->pend_next) kept++;
  BT_CHECK(kept == 0, "%d completed operations still held after 200 barriers", kept);
  return 0;
}

static int test_p2p_mismatch_then_barrier(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=60", NULL};
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++) {
    if (maxr[b] < 2) continue;
    bt_run_opts o = {names[b], maxr[b] < 3 ? maxr[b] : 3, 60, env, -1};
    if (bt_run_ranks_ex(&o, body_p2p_then_barrier, NULL, NULL)) {
      fprintf(stderr, "backend %s failed\n", names[b]);
      return 1;
    }
  }
  return 0;
}

/* A mismatch found before braid_sync (here while posting another receive)
   is reported by that sync only after it has completed every other
   pending operation, as braid_sync promises. Rank 1 sends the last two
   messages only once rank 0 is about to sync. */
static int body_sync_after_mismatch(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  _Atomic int *step = arg;
  enum { BIG = 1 << 20 };
  char *big = calloc(BIG, 1);
  BT_CHECK(big != NULL, "out of memory");
  double a[3] = {1, 2, 3};
  int32_t small = 0, w = 1;
  /* tcp connects on first use, and the waits below make no progress. */
  if (rank < 2) {
    BT_CHECK_OK(braid_send(c, &w, 1, BRAID_I32, 1 - rank, 9), c);
    BT_CHECK_OK(braid_recv(c, &w, 1, BRAID_I32, 1 - rank, 9), c);
    BT_CHECK_OK(braid_sync(c), c);
  }
  if (rank == 0) {
    BT_CHECK_OK(braid_recv(c, a, 2, BRAID_F64, 1, 1), c); /* 2 elements where 3 come */
    BT_CHECK_OK(braid_recv(c, big, BIG, BRAID_U8, 1, 2), c);
    atomic_store(step, 1);
    BT_CHECK(bt_await(step, 2, 60), "rank 1 never sent the first message");
    BT_CHECK_OK(braid_recv(c, &small, 1, BRAID_I32, 1, 4), c); /* its progress meets the mismatch */
    atomic_store(step, 3);
    braid_status st = braid_sync(c);
    BT_CHECK(st == BRAID_ERR_MISMATCH, "sync got %s: %s", braid_status_string(st), braid_last_error(c));
    BT_CHECK_MSG(c, "tag 1 has 3 elements");
    BT_CHECK(big[0] == 9 && big[BIG - 1] == 9 && small == 44, "the other receives were not complete after the sync");
    BT_CHECK_OK(braid_recv(c, a, 3, BRAID_F64, 1, 1), c); /* the message was kept */
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(a[0] == 7 && a[2] == 9, "the kept message holds %g %g", a[0], a[2]);
  } else if (rank == 1) {
    BT_CHECK(bt_await(step, 1, 60), "rank 0 never posted its receives");
    a[0] = 7, a[1] = 8, a[2] = 9;
    BT_CHECK_OK(braid_send(c, a, 3, BRAID_F64, 0, 1), c);
    BT_CHECK_OK(braid_sync(c), c);
    atomic_store(step, 2);
    BT_CHECK(bt_await(step, 3, 60), "rank 0 never got to its sync");
    memset(big, 9, BIG);
    small = 44;
    BT_CHECK_OK(braid_send(c, big, BIG, BRAID_U8, 0, 2), c);
    BT_CHECK_OK(braid_send(c, &small, 1, BRAID_I32, 0, 4), c);
    BT_CHECK_OK(braid_sync(c), c);
  }
  free(big);
  return 0;
}

static int test_sync_after_mismatch(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=60", NULL};
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  _Atomic int *step = bt_shared_counter();
  BT_CHECK(step, "cannot map a shared counter");
  int rc = 0;
  for (int b = 0; b < nb && !rc; b++) {
    if (maxr[b] < 2) continue;
    atomic_store(step, 0);
    bt_run_opts o = {names[b], 2, 60, env, -1};
    if ((rc = bt_run_ranks_ex(&o, body_sync_after_mismatch, (void *)step, NULL)))
      fprintf(stderr, "backend %s failed\n", names[b]);
  }
  bt_shared_free(step);
  return rc;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      {"shm_native", test_shm_native, 600},
      {"shm_generic", test_shm_generic, 600},
      {"tcp", test_tcp, 600},
      BT_CASE(test_matching_calls_pass),
      BT_CASE(test_shm_two_roots),
      BT_CASE(test_p2p_mismatch_then_barrier),
      BT_CASE(test_sync_after_mismatch),
      BT_CASE(test_rooted_last_rank),
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
