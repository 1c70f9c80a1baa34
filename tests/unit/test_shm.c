/* Backend shm: every collective over dtypes, ops, counts, world sizes, in and
   out of place, unaligned buffers; bitwise-identical results; split; tagged
   point to point; dead and aborting peers; no leaked /dev/shm entries. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "backends/shm/shm.h"
#include "braid.h"
#include "coll_check.h"
#include "core/comm.h"
#include "harness.h"
#include "p2p_check.h"


static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Runs body on n shm ranks with extra environment, and checks /dev/shm is as before. */
static int run_env(int n, bt_body body, void *arg, const char *const *env, int expect_fail_rank, double timeout) {
  int before = bt_dead_shm_names(1);
  bt_run_opts o = {"shm", n, timeout, env, expect_fail_rank};
  bt_rank_result res[128];
  int rc = bt_run_ranks_ex(&o, body, arg, res);
  if (expect_fail_rank >= 0) {
    rc = 0;
    for (int r = 0; r < n; r++)
      if (r != expect_fail_rank && !(res[r].exited && res[r].code == 0)) rc = 1;
  }
  int after = bt_dead_shm_names(1);
  if (after > before) {
    fprintf(stderr, "shm test: %d /dev/shm/braid-* entries leaked by exited ranks (%d before, %d after)\n",
            after - before, before, after);
    return 1;
  }
  return rc;
}

static int run(int n, bt_body body, void *arg) { return run_env(n, body, arg, NULL, -1, bt_quick() ? 240 : 90); }

/* run_env with a fresh shared counter (at 0) as the bodies' argument. */
static int run_counted(int n, bt_body body, const char *const *env, int expect_fail_rank, double timeout) {
  _Atomic int *step = bt_shared_counter();
  BT_CHECK(step != NULL, "no shared mapping");
  int rc = run_env(n, body, (void *)step, env, expect_fail_rank, timeout);
  bt_shared_free(step);
  return rc;
}

static int test_coll_small(void) {
  static const size_t counts[] = {0, 1, 7, 1000};
  matrix m = {counts, 4, 1, 0};
  static const int sizes[] = {1, 2, 3, 4, 5, 8};
  for (size_t i = 0; i < BT_COUNT(sizes); i++) {
    if (bt_quick() && sizes[i] == 5) continue;
    if (run(sizes[i], bt_coll_matrix_body, &m)) return 1;
  }
  return 0;
}

/* Medium and large counts (staging and single-copy paths), a few dtypes. */
static int test_coll_large(void) {
  static const size_t counts[] = {5000, 70001, 1000003};
  static const size_t qcounts[] = {5000, 70001, 200003};
  matrix m = {bt_quick() ? qcounts : counts, 3, 0, 0};
  static const int sizes[] = {2, 3, 4};
  /* Staging rounds, then single copy from 64 KiB up. */
  static const char *const env[] = {"BRAID_SHM_CMA_MIN=64K", NULL};
  for (size_t i = 0; i < BT_COUNT(sizes); i++)
    if (run(sizes[i], bt_coll_matrix_body, &m) || run_env(sizes[i], bt_coll_matrix_body, &m, env, -1, 240)) return 1;
  return 0;
}

static int test_coll_large_nocma(void) {
  static const size_t counts[] = {1000003};
  static const size_t qcounts[] = {200003};
  matrix m = {bt_quick() ? qcounts : counts, 1, 0, 0};
  /* A small staging buffer forces many pipelined rounds. */
  static const char *const env[] = {"BRAID_SHM_CMA=0", "BRAID_SHM_BUFFER=96K", NULL};
  if (run_env(3, bt_coll_matrix_body, &m, env, -1, 240)) return 1;
  if (!bt_quick() && run_env(2, bt_coll_matrix_body, &m, env, -1, 240)) return 1;
  return 0;
}

/* Reduce, gather, scatter and all-to-all(v) on both sides of each size
   where shm changes path (f32): a gather or reduce block leaves the ring
   for the slots above 2032 elements at 2 ranks and 1344 at 3, and the
   slots for staging (reduce) or the generic algorithm (gather) above 4080;
   a scatter's or all-to-all's n blocks leave ring or slots above 2040 at 2
   ranks and 1360 at 3, and an all-to-all's direct reads for the generic
   exchange above 1 MiB per rank (87381 at 3 ranks). Reduce also runs many
   staging rounds, with buffers in braid memory on some ranks: reduced by the
   root alone up to 4 ranks, slice by slice on every rank at 5. Without
   single copy an all-to-all above the slots goes through staging in rounds
   of one piece per block: many rounds, and the round space reused, with the
   smallest staging. */
static int test_rooted_paths(void) {
  static const size_t counts[] = {1344, 1345, 1360, 1361, 2032, 2033, 2040, 2041, 4080, 4081, 70001};
  static const size_t big[] = {70001, 87381, 87382, 300007};
  matrix m = {counts, BT_COUNT(counts), 0, 0}, mb = {big, BT_COUNT(big), 0, 2};
  static const char *const small[] = {"BRAID_SHM_BUFFER=64K", NULL};
  static const char *const nocma[] = {"BRAID_SHM_CMA=0", NULL};
  static const char *const nocma_small[] = {"BRAID_SHM_CMA=0", "BRAID_SHM_BUFFER=64K", NULL};
  return run(2, bt_coll_matrix_more, &m) || run(3, bt_coll_matrix_more, &m) ||
         run_env(3, bt_coll_matrix_more, &mb, small, -1, 240) || run(3, bt_coll_matrix_more, &mb) ||
         run(4, bt_coll_matrix_more, &mb) || run(5, bt_coll_matrix_more, &mb) ||
         run_env(3, bt_coll_matrix_more, &m, nocma, -1, 240) ||
         run_env(4, bt_coll_matrix_more, &mb, nocma_small, -1, 240) ||
         run_env(5, bt_coll_matrix_more, &mb, nocma, -1, 240);
}

/* ---------------------------------------------------------------- braid memory */

/* Buffers from braid_mem_alloc on every rank (read in place by peers) or on
   even ranks only (mixed with staging), every collective in both placements,
   offsets inside the allocation not page aligned. */
static int body_zc(braid_comm *c, int rank, int n, void *arg) {
  const matrix *m = arg;
  static const struct {
    braid_dtype d;
    braid_op op;
  } few[] = {{BRAID_F32, BRAID_SUM}, {BRAID_BF16, BRAID_AVG}, {BRAID_U8, BRAID_MAX}};
  for (int ci = 0; ci < m->ncounts; ci++)
    for (int fi = 0; fi < (int)BT_COUNT(few); fi++)
      for (int coll = C_AR; coll <= C_RS; coll++)
        for (int ip = 0; ip < 2; ip++) {
          if (ip && coll == C_BC) continue;
          braid_op op = coll == C_BC || coll == C_AG ? BRAID_SUM : few[fi].op;
          ccase k = {coll, few[fi].d, op, m->counts[ci], ip, (ci + fi + coll) % 8, m->mem, 0, 0};
          if (bt_coll_one(c, rank, n, &k)) return 1;
        }
  return 0;
}

static int test_zc_coll(void) {
  static const size_t counts[] = {5000, 70001, 1000003};
  static const size_t qcounts[] = {5000, 70001, 200003};
  static const char *const cma[] = {"BRAID_SHM_CMA_MIN=64K", NULL};
  static const char *const off[] = {"BRAID_SHM_ZEROCOPY=0", NULL};
  static const int sizes[] = {2, 3, 4};
  for (int mem = 1; mem <= 2; mem++) {
    matrix m = {bt_quick() ? qcounts : counts, 3, 0, mem};
    for (size_t i = 0; i < BT_COUNT(sizes); i++)
      if (run(sizes[i], body_zc, &m)) return 1;
    /* Single-copy paths that read braid memory in place. */
    if (run_env(3, body_zc, &m, cma, -1, 240)) return 1;
  }
  matrix m = {qcounts, 2, 0, 1};
  return run_env(2, body_zc, &m, off, -1, 240);
}

/* Rank 0 broadcasts from braid memory: peers map its allocations, keep at
   most SHM_ZMAP_CAP of them, and drop those rank 0 has freed when it next
   announces one. Read-only shared mappings of other processes' braid memory
   are counted in /proc/self/maps. */
static int peer_mappings(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[512];
  int k = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "/memfd:braid-mem-") && strstr(line, " r--s ")) k++;
  fclose(f);
  return k;
}

static int body_zc_mappings(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  (void)n;
  enum { NB = 12, CNT = 50000 };
  float *bufs[NB] = {0}, *mine = malloc(CNT * 4);
  BT_CHECK(mine != NULL, "oom");
  for (int i = 0; i < NB; i++) {
    if (rank == 0) {
      BT_CHECK_OK(braid_mem_alloc((void **)&bufs[i], CNT * 4), NULL);
      for (int j = 0; j < CNT; j++) bufs[i][j] = (float)(i * 100000 + j);
    }
    BT_CHECK_OK(braid_broadcast(c, rank == 0 ? bufs[i] : mine, CNT, BRAID_F32, 0), c);
    if (rank != 0)
      for (int j = 0; j < CNT; j++) BT_CHECK(mine[j] == (float)(i * 100000 + j), "buffer %d element %d", i, j);
  }
  int held = rank == 0 ? 0 : peer_mappings();
  if (rank != 0) BT_CHECK(held == 8, "rank %d maps %d of rank 0's allocations, expected the cache's 8", rank, held);
  /* Free all but the last; the next broadcast from it drops the others. */
  if (rank == 0)
    for (int i = 0; i < NB - 1; i++) BT_CHECK_OK(braid_mem_free(bufs[i]), NULL);
  BT_CHECK_OK(braid_broadcast(c, rank == 0 ? bufs[NB - 1] : mine, CNT, BRAID_F32, 0), c);
  if (rank != 0) BT_CHECK(peer_mappings() == 1, "rank %d still maps %d allocations", rank, peer_mappings());
  BT_CHECK_OK(braid_barrier(c), c);
  if (rank == 0) BT_CHECK_OK(braid_mem_free(bufs[NB - 1]), NULL);
  free(mine);
  return 0;
}

static int test_zc_mappings(void) { return run(3, body_zc_mappings, NULL); }

/* Point to point from and into braid memory: eager, pulled and (beyond
   4 MiB, where heap buffers stream) large messages; expected and unexpected;
   braid memory on the sender only, the receiver only, or both. */
static int body_zc_p2p(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  static const size_t sizes[] = {1, 100000, 9u << 20};
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  for (int who = 1; who <= 3; who++)
    for (size_t si = 0; si < BT_COUNT(sizes); si++)
      for (int late = 0; late < 2; late++) {
        size_t bytes = sizes[si];
        int sm = who & 1, rm = (who >> 1) & 1;
        /* Offsets inside the allocations: in-place reads must honour them. */
        unsigned char *sraw = bt_buf_alloc(sm, bytes + 64), *rraw = bt_buf_alloc(rm, bytes + 64);
        BT_CHECK(sraw && rraw, "oom");
        unsigned char *sb = sraw + 3, *rb = rraw + 5;
        for (size_t i = 0; i < bytes; i++) sb[i] = (unsigned char)(rank * 13 + i * 7 + who);
        memset(rb, 0, bytes);
        uint32_t first = (uint32_t)rank, got = UINT32_MAX;
        BT_CHECK_OK(braid_send(c, &first, 1, BRAID_U32, right, 8), c);
        BT_CHECK_OK(braid_send(c, sb, bytes, BRAID_U8, right, 9), c);
        if (late) {
          /* Both are in the ring by now; receiving the first takes the
             second out too, before its receive is posted (unexpected). */
          usleep(20000);
        }
        BT_CHECK_OK(braid_recv(c, &got, 1, BRAID_U32, left, 8), c);
        BT_CHECK_OK(braid_recv(c, rb, bytes, BRAID_U8, left, 9), c);
        BT_CHECK_OK(braid_sync(c), c);
        BT_CHECK(got == (uint32_t)left, "first message from %d reads %u", left, got);
        for (size_t i = 0; i < bytes; i++)
          BT_CHECK(rb[i] == (unsigned char)(left * 13 + i * 7 + who), "who %d size %zu late %d: byte %zu wrong", who,
                   bytes, late, i);
        BT_CHECK_OK(braid_barrier(c), c);
        bt_buf_free(sm, sraw);
        bt_buf_free(rm, rraw);
      }
  return 0;
}

static int test_zc_p2p(void) {
  static const char *const nocma[] = {"BRAID_SHM_CMA=0", NULL};
  return run(2, body_zc_p2p, NULL) || run(3, body_zc_p2p, NULL) || run_env(2, body_zc_p2p, NULL, nocma, -1, 120);
}

/* All-gather where some ranks pass their block in place and others do not,
   staged and by single copy. */
static int body_ag_mixed(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  static const size_t counts[] = {20000, 40000, 70000, 400000};
  for (size_t ci = 0; ci < BT_COUNT(counts); ci++)
    for (int pattern = 0; pattern < 2; pattern++) {
      size_t cnt = counts[ci];
      uint32_t *recv = malloc(cnt * (size_t)n * 4), *send = malloc(cnt * 4);
      BT_CHECK(recv && send, "oom");
      int inplace = (rank + pattern) % 2 == 0;
      uint32_t *src = inplace ? recv + (size_t)rank * cnt : send;
      for (size_t i = 0; i < cnt; i++) src[i] = (uint32_t)(rank * 7919 + i);
      BT_CHECK_OK(braid_all_gather(c, src, recv, cnt, BRAID_U32), c);
      BT_CHECK_OK(braid_sync(c), c);
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++)
          BT_CHECK(recv[(size_t)q * cnt + i] == (uint32_t)(q * 7919 + i), "count %zu block %d element %zu", cnt, q, i);
      free(recv);
      free(send);
    }
  return 0;
}

static int test_ag_mixed_placement(void) {
  static const char *const cma[] = {"BRAID_SHM_CMA_MIN=64K", NULL};
  return run(2, body_ag_mixed, NULL) || run(3, body_ag_mixed, NULL) || run_env(2, body_ag_mixed, NULL, cma, -1, 60) ||
         run_env(3, body_ag_mixed, NULL, cma, -1, 60);
}

static int body_sixteen(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  double t = now_s();
  float v[33];
  for (int i = 0; i < 33; i++) v[i] = (float)(rank + i);
  BT_CHECK_OK(braid_all_reduce(c, v, 33, BRAID_F32, BRAID_SUM), c);
  for (int i = 0; i < 33; i++) BT_CHECK(v[i] == (float)(n * (n - 1) / 2 + n * i), "16 ranks: element %d wrong", i);
  BT_CHECK_OK(braid_barrier(c), c);
  (void)t;
  return 0;
}

static int test_sixteen_ranks(void) { return run(16, body_sixteen, NULL); }

/* ---------------------------------------------------------------- split */

static int body_split(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  for (int pattern = 0; pattern < 3; pattern++) {
    uint32_t color = pattern == 0 ? (uint32_t)(rank % 2) : pattern == 1 ? (rank == 0 ? BRAID_SPLIT_NONE : 7u) : 3u;
    uint32_t key = pattern == 2 ? (uint32_t)(n - rank) : 0u;
    braid_comm *child = NULL;
    BT_CHECK_OK(braid_split(c, color, key, &child), c);
    if (color == BRAID_SPLIT_NONE) {
      BT_CHECK(child == NULL, "BRAID_SPLIT_NONE gave a communicator");
      /* The parent stays usable while the others also use their child. */
      for (int it = 0; it < 3; it++) {
        size_t cnt = it == 1 ? 100000 : 3;
        int32_t *b = malloc(cnt * 4);
        BT_CHECK(b != NULL, "oom");
        for (size_t i = 0; i < cnt; i++) b[i] = rank + (int32_t)i;
        BT_CHECK_OK(braid_all_reduce(c, b, cnt, BRAID_I32, BRAID_SUM), c);
        for (size_t i = 0; i < cnt; i++)
          BT_CHECK(b[i] == (int32_t)(n * (n - 1) / 2 + (int64_t)n * (int64_t)i), "parent sum wrong at %zu", i);
        free(b);
      }
      int gotp = -1;
      BT_CHECK_OK(braid_send(c, &rank, 1, BRAID_I32, (rank + 1) % n, 1), c);
      BT_CHECK_OK(braid_recv(c, &gotp, 1, BRAID_I32, (rank + n - 1) % n, 1), c);
      BT_CHECK_OK(braid_sync(c), c);
      BT_CHECK(gotp == (rank + n - 1) % n, "p2p got %d", gotp);
      continue;
    }
    BT_CHECK(child != NULL, "no child communicator");
    int cn = braid_world_size(child), cr = braid_rank(child);
    int expect_n = pattern == 0 ? (n - rank % 2 + 1) / 2 : pattern == 1 ? n - 1 : n;
    BT_CHECK(cn == expect_n, "child size %d, expected %d", cn, expect_n);
    if (pattern == 2) BT_CHECK(cr == n - 1 - rank, "reversed key: child rank %d", cr);
    /* Interleave parent and child collectives, small and large. */
    for (int it = 0; it < 3; it++) {
      size_t cnt = it == 1 ? 100000 : 3;
      int32_t *a = malloc(cnt * 4), *b = malloc(cnt * 4);
      BT_CHECK(a && b, "oom");
      for (size_t i = 0; i < cnt; i++) a[i] = b[i] = rank + (int32_t)i;
      BT_CHECK_OK(braid_all_reduce(child, a, cnt, BRAID_I32, BRAID_SUM), child);
      BT_CHECK_OK(braid_all_reduce(c, b, cnt, BRAID_I32, BRAID_SUM), c);
      int64_t csum = 0;
      for (int r = 0; r < n; r++) {
        int member = pattern == 0 ? r % 2 == rank % 2 : pattern == 1 ? r != 0 : 1;
        if (member) csum += r;
      }
      for (size_t i = 0; i < cnt; i++) {
        BT_CHECK(a[i] == (int32_t)(csum + (int64_t)cn * (int64_t)i), "child sum wrong at %zu", i);
        BT_CHECK(b[i] == (int32_t)(n * (n - 1) / 2 + (int64_t)n * (int64_t)i), "parent sum wrong at %zu", i);
      }
      free(a);
      free(b);
    }
    /* p2p on the child with the same tag as on the parent. */
    int right = (cr + 1) % cn, left = (cr + cn - 1) % cn, got = -1, gotp = -1;
    BT_CHECK_OK(braid_send(child, &cr, 1, BRAID_I32, right, 1), child);
    BT_CHECK_OK(braid_recv(child, &got, 1, BRAID_I32, left, 1), child);
    BT_CHECK_OK(braid_send(c, &rank, 1, BRAID_I32, (rank + 1) % n, 1), c);
    BT_CHECK_OK(braid_recv(c, &gotp, 1, BRAID_I32, (rank + n - 1) % n, 1), c);
    BT_CHECK_OK(braid_sync(child), child);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(got == left && gotp == (rank + n - 1) % n, "p2p got %d/%d", got, gotp);
    BT_CHECK_OK(braid_destroy(child), NULL);
  }
  return 0;
}

static int test_split(void) {
  static const int sizes[] = {2, 3, 5};
  for (size_t i = 0; i < BT_COUNT(sizes); i++)
    if (run(sizes[i], body_split, NULL)) return 1;
  return 0;
}

/* A child that one rank aborts the moment its split returns: the split
   completed on every rank, so it succeeds everywhere, however late a rank
   sees the last arrival, and the abort reaches the others in their first
   call. */
static int body_split_abort(braid_comm *c, int rank, int n, void *arg) {
  int iters = *(const int *)arg;
  for (int it = 0; it < iters; it++) {
    braid_comm *child = NULL;
    int first = it % n; /* the rank that aborts */
    BT_CHECK_OK(braid_split(c, 0, (uint32_t)((rank - first + n) % n), &child), c);
    braid_status st;
    if (rank == first) {
      BT_CHECK_OK(braid_abort(child), child);
      st = braid_barrier(child);
      BT_CHECK(st == BRAID_ERR_ABORTED, "iteration %d: the aborting rank's barrier gave %s", it,
               braid_status_string(st));
    } else {
      st = braid_barrier(child);
      BT_CHECK(st == BRAID_ERR_PEER_LOST, "iteration %d: barrier after rank 0's abort gave %s: %s", it,
               braid_status_string(st), braid_last_error(child));
      BT_CHECK_MSG(child, "rank 0 aborted the communicator");
    }
    braid_destroy(child);
    BT_CHECK_OK(braid_barrier(c), c);
  }
  return 0;
}

static int test_split_abort(void) {
  int iters = bt_quick() ? 60 : 150;
  return run(3, body_split_abort, &iters) || run(2, body_split_abort, &iters);
}

/* A start that fails on one rank alone (its transfer buffers cannot be
   allocated) while that rank stays alive: the others hear of it within a
   few seconds, not at BRAID_TIMEOUT. The failure is injected by this
   program's posix_memalign, armed on one rank for the one allocation of
   that size (three ranks: 512 KiB). */
static volatile int fail_tmp_alloc;

int posix_memalign(void **p, size_t align, size_t size) {
  static int (*real)(void **, size_t, size_t);
  if (!real) *(void **)&real = dlsym(RTLD_NEXT, "posix_memalign");
  if (fail_tmp_alloc && align == 4096 && size == (512u << 10)) {
    fail_tmp_alloc = 0;
    return ENOMEM;
  }
  return real(p, align, size);
}

typedef struct start_fail {
  _Atomic int *checked;
  int split; /* 1: braid_split fails, 0: braid_init */
} start_fail;

static int body_start_fail(braid_comm *c, int rank, int n, void *arg) {
  const start_fail *f = arg;
  braid_comm *child = NULL;
  braid_status st;
  double t0 = now_s();
  if (f->split) {
    BT_CHECK_OK(braid_barrier(c), c);
    fail_tmp_alloc = rank == 1;
    st = braid_split(c, 0, 0, &child);
  } else {
    fail_tmp_alloc = rank == 1;
    st = braid_init(NULL, &c);
  }
  const double took = now_s() - t0;
  fail_tmp_alloc = 0;
  const char *msg = braid_last_error(f->split ? c : NULL);
  if (rank == 1) {
    BT_CHECK(st == BRAID_ERR_NO_MEMORY, "the failing rank got %s: %s", braid_status_string(st), msg);
    BT_CHECK(strstr(msg, "transfer buffers"), "the failing rank said: %s", msg);
    /* Alive until every other rank has its answer. */
    BT_CHECK(bt_await(f->checked, n - 1, 60), "the other ranks did not answer");
  } else {
    BT_CHECK(st == BRAID_ERR_PEER_LOST, "rank %d got %s: %s", rank, braid_status_string(st), msg);
    BT_CHECK(strstr(msg, "rank 1 could not start"), "rank %d said: %s", rank, msg);
    BT_CHECK(took < 10, "rank %d learned after %.1f s", rank, took);
    atomic_fetch_add(f->checked, 1);
  }
  if (child) braid_destroy(child);
  if (!f->split && st == BRAID_OK) braid_destroy(c);
  return 0;
}

static int test_start_alloc_fails(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=60", "BRAID_INIT_TIMEOUT=60", NULL};
  start_fail f = {bt_shared_counter(), 1};
  int rc = run_env(3, body_start_fail, &f, env, -1, 120);
  bt_rank_result res[3];
  bt_run_opts o = {"shm", 3, 120, env, -1};
  atomic_store(f.checked, 0);
  f.split = 0;
  if (!rc) rc = bt_run_ranks_manual(&o, body_start_fail, &f, res);
  bt_shared_free(f.checked);
  return rc;
}

/* ---------------------------------------------------------------- drift */

/* Small broadcasts do not wait for the whole group, so ranks drift apart by
   many calls. Mixed with collectives that do wait (and reuse slots by
   parity) and with streamed ones, every result must still be exact. One
   rank at a time stalls now and then, so everyone is at times far behind or
   far ahead; a root also runs well past the ring's length and through
   many streamed chunks while the others sleep. Small gathers, reduces and
   scatters share the ring with broadcasts. */
static int body_drift(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  enum { BIG = 40000 };
  uint32_t *a = malloc(BIG * sizeof *a * (size_t)n), *g = malloc(BIG * sizeof *g * (size_t)n);
  BT_CHECK(a && g, "oom");
  /* The root streams several large broadcasts while the others sleep, then
     at once writes its staging for a large all-reduce: that must wait until
     the broadcasts' chunks were copied out. */
  if (rank != 0) usleep(50000);
  for (int b = 0; b < 6; b++) {
    for (size_t i = 0; i < BIG; i++) a[i] = rank == 0 ? (uint32_t)((b + 1) * 1000003u + i) : 0;
    BT_CHECK_OK(braid_broadcast(c, a, BIG, BRAID_U32, 0), c);
    for (size_t i = 0; i < BIG; i++)
      BT_CHECK(a[i] == (uint32_t)((b + 1) * 1000003u + i), "streamed broadcast %d: element %zu wrong", b, i);
  }
  for (size_t i = 0; i < BIG; i++) a[i] = (uint32_t)(rank + 1) * (uint32_t)i;
  BT_CHECK_OK(braid_all_reduce(c, a, BIG, BRAID_U32, BRAID_SUM), c);
  for (size_t i = 0; i < BIG; i++)
    BT_CHECK(a[i] == (uint32_t)(n * (n + 1) / 2) * (uint32_t)i, "all-reduce after broadcasts: element %zu wrong", i);

  uint64_t x = 0x9e3779b97f4a7c15ULL; /* same sequence on every rank */
  for (int it = 0; it < 3000; it++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    int kind = (int)((x >> 33) % 13), root = (int)((x >> 45) % (uint64_t)n);
    size_t cnt = 1 + (size_t)((x >> 20) % 900);
    if ((x >> 12) % 97 == 0) cnt = BIG; /* now and then a streamed size */
    if ((int)((x >> 50) % (uint64_t)n) == rank && (x >> 8) % 23 == 0) usleep(2000);
    if (it >= 100 && it < 300) {
      root = 0;
      if (it % 5 == 0) cnt = BIG; /* streamed broadcasts run ahead too */
    }
    if (it == 100 && rank != 0) usleep(100000); /* rank 0 runs ahead */
    if (kind < 6 || (it >= 100 && it < 300)) {
      for (size_t i = 0; i < cnt; i++) a[i] = rank == root ? (uint32_t)(it * 7919u + i) : 0xdeadbeefu;
      BT_CHECK_OK(braid_broadcast(c, a, cnt, BRAID_U32, root), c);
      for (size_t i = 0; i < cnt; i++)
        BT_CHECK(a[i] == (uint32_t)(it * 7919u + i), "iteration %d: broadcast of %zu from %d, element %zu wrong", it,
                 cnt, root, i);
    } else if (kind < 8) {
      for (size_t i = 0; i < cnt; i++) a[i] = (uint32_t)(rank + 1) * (uint32_t)(it + i);
      BT_CHECK_OK(braid_all_reduce(c, a, cnt, BRAID_U32, BRAID_SUM), c);
      uint32_t tri = (uint32_t)(n * (n + 1) / 2);
      for (size_t i = 0; i < cnt; i++)
        BT_CHECK(a[i] == tri * (uint32_t)(it + i), "iteration %d: all-reduce element %zu wrong", it, i);
    } else if (kind < 9) {
      for (size_t i = 0; i < cnt; i++) a[i] = (uint32_t)(rank * 100003 + it + i);
      BT_CHECK_OK(braid_all_gather(c, a, g, cnt, BRAID_U32), c);
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++)
          BT_CHECK(g[(size_t)q * cnt + i] == (uint32_t)(q * 100003 + it + i), "iteration %d: all-gather wrong", it);
    } else if (kind == 9) {
      BT_CHECK_OK(braid_barrier(c), c);
    } else if (kind == 10) { /* non-roots write and go on, like broadcast roots */
      for (size_t i = 0; i < cnt; i++) a[i] = (uint32_t)(rank * 100003 + it + i);
      BT_CHECK_OK(braid_gather(c, a, g, cnt, BRAID_U32, root), c);
      for (int q = 0; q < n && rank == root; q++)
        for (size_t i = 0; i < cnt; i++)
          BT_CHECK(g[(size_t)q * cnt + i] == (uint32_t)(q * 100003 + it + i), "iteration %d: gather wrong", it);
    } else if (kind == 11) {
      for (size_t i = 0; i < cnt; i++) a[i] = (uint32_t)(rank + 1) * (uint32_t)(it + i);
      BT_CHECK_OK(braid_reduce(c, a, g, cnt, BRAID_U32, BRAID_SUM, root), c);
      uint32_t tri = (uint32_t)(n * (n + 1) / 2);
      for (size_t i = 0; i < cnt && rank == root; i++)
        BT_CHECK(g[i] == tri * (uint32_t)(it + i), "iteration %d: reduce element %zu wrong", it, i);
    } else {
      size_t sc = cnt / (size_t)n + 1;
      for (size_t i = 0; i < sc * (size_t)n && rank == root; i++) g[i] = (uint32_t)(it * 31u + i);
      BT_CHECK_OK(braid_scatter(c, g, a, sc, BRAID_U32, root), c);
      for (size_t i = 0; i < sc; i++)
        BT_CHECK(a[i] == (uint32_t)(it * 31u + (size_t)rank * sc + i), "iteration %d: scatter element %zu wrong", it, i);
    }
  }
  free(a);
  free(g);
  return 0;
}

/* Non-roots of a large reduce stage their input and return before the
   root has read it. A slow root makes them run ahead into the next calls,
   which must not overwrite staging the root has yet to read: back-to-back
   reduces with other roots, staged all-reduces, all-gathers and
   reduce-scatters, streamed broadcasts. */
static int body_reduce_ahead(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  static const size_t counts[] = {5000, 40000, 70001};
  enum { MAXC = 70001 };
  uint32_t *a = malloc(MAXC * 4 * (size_t)n), *g = malloc(MAXC * 4 * (size_t)n);
  BT_CHECK(a && g, "oom");
  const uint32_t tri = (uint32_t)(n * (n + 1) / 2);
  for (int it = 0; it < 120; it++) {
    size_t cnt = counts[it % 3];
    int root = (it / 3) % n, next = it % 5;
    if (rank == root && it % 2 == 0) usleep(3000);
    for (size_t i = 0; i < cnt; i++) a[i] = (uint32_t)(rank + 1) * (uint32_t)(it + i);
    int inplace = it % 7 == 0 && rank == root;
    if (inplace) memcpy(g, a, cnt * 4);
    BT_CHECK_OK(braid_reduce(c, inplace ? g : a, rank == root ? g : NULL, cnt, BRAID_U32, BRAID_SUM, root), c);
    for (size_t i = 0; i < cnt && rank == root; i++)
      BT_CHECK(g[i] == tri * (uint32_t)(it + i), "iteration %d: reduce of %zu to %d, element %zu wrong", it, cnt, root,
               i);
    for (size_t i = 0; i < cnt; i++) a[i] = (uint32_t)(rank + 1) * (uint32_t)(it * 3 + i);
    if (next == 1) {
      BT_CHECK_OK(braid_all_reduce(c, a, cnt, BRAID_U32, BRAID_SUM), c);
      for (size_t i = 0; i < cnt; i++)
        BT_CHECK(a[i] == tri * (uint32_t)(it * 3 + i), "iteration %d: all-reduce element %zu wrong", it, i);
    } else if (next == 2) {
      int broot = (root + 1) % n;
      for (size_t i = 0; i < cnt; i++) a[i] = rank == broot ? (uint32_t)(it * 7919u + i) : 0;
      BT_CHECK_OK(braid_broadcast(c, a, cnt, BRAID_U32, broot), c);
      for (size_t i = 0; i < cnt; i++)
        BT_CHECK(a[i] == (uint32_t)(it * 7919u + i), "iteration %d: broadcast element %zu wrong", it, i);
    } else if (next == 3) {
      BT_CHECK_OK(braid_all_gather(c, a, g, cnt, BRAID_U32), c);
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++)
          BT_CHECK(g[(size_t)q * cnt + i] == (uint32_t)(q + 1) * (uint32_t)(it * 3 + i),
                   "iteration %d: all-gather block %d element %zu wrong", it, q, i);
    } else if (next == 4) {
      size_t rc = cnt / (size_t)n;
      for (size_t i = 0; i < rc * (size_t)n; i++) g[i] = (uint32_t)(rank + 1) * (uint32_t)(it + i);
      BT_CHECK_OK(braid_reduce_scatter(c, g, a, rc, BRAID_U32, BRAID_SUM), c);
      for (size_t i = 0; i < rc; i++)
        BT_CHECK(a[i] == tri * (uint32_t)(it + (size_t)rank * rc + i), "iteration %d: reduce-scatter element %zu wrong",
                 it, i);
    }
  }
  free(a);
  free(g);
  return 0;
}

static int test_reduce_ahead(void) {
  static const char *const nocma[] = {"BRAID_SHM_CMA=0", NULL};
  /* Without the call check no exchange settles the calls before a streamed
     broadcast: its root's own wait must cover the reduce. */
  static const char *const nocheck[] = {"BRAID_CHECK=0", NULL};
  return run(2, body_reduce_ahead, NULL) || run(3, body_reduce_ahead, NULL) || run(4, body_reduce_ahead, NULL) ||
         run_env(2, body_reduce_ahead, NULL, nocma, -1, 120) || run_env(3, body_reduce_ahead, NULL, nocheck, -1, 120);
}

static int test_drift(void) { return run(2, body_drift, NULL) || run(3, body_drift, NULL) || run(4, body_drift, NULL); }

/* ---------------------------------------------------------------- point to point */

static int body_ring(braid_comm *c, int rank, int n, void *arg) {
  size_t bytes = *(const size_t *)arg;
  unsigned char *s = malloc(bytes), *r = malloc(bytes);
  BT_CHECK(s && r, "oom");
  for (size_t i = 0; i < bytes; i++) s[i] = (unsigned char)(rank * 31 + i * 7);
  memset(r, 0, bytes);
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  BT_CHECK_OK(braid_send(c, s, bytes, BRAID_U8, right, 42), c);
  BT_CHECK_OK(braid_recv(c, r, bytes, BRAID_U8, left, 42), c);
  BT_CHECK_OK(braid_sync(c), c);
  for (size_t i = 0; i < bytes; i++)
    BT_CHECK(r[i] == (unsigned char)(left * 31 + i * 7), "ring of %zu bytes: byte %zu wrong", bytes, i);
  free(s);
  free(r);
  return 0;
}

static int test_p2p_ring(void) {
  size_t small = 1, big = bt_quick() ? (8u << 20) : (64u << 20);
  if (run(2, body_ring, &small) || run(4, body_ring, &small) || run(2, body_ring, &big) || run(3, body_ring, &big))
    return 1;
  /* Streaming through the ring: the way without single copy. */
  static const char *const env[] = {"BRAID_SHM_CMA=0", NULL};
  return run_env(2, body_ring, &big, env, -1, 120) || run_env(3, body_ring, &big, env, -1, 120);
}

static int body_alltoall_tags(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  size_t sizes[2] = {100, 300000};
  uint32_t *sb[16][2], *rb[16][2];
  for (int q = 0; q < n; q++)
    for (int k = 0; k < 2; k++) {
      sb[q][k] = malloc(sizes[k] * 4);
      rb[q][k] = calloc(sizes[k], 4);
      BT_CHECK(sb[q][k] && rb[q][k], "oom");
      for (size_t i = 0; i < sizes[k]; i++) sb[q][k][i] = (uint32_t)(rank * 1000000 + q * 1000 + k) ^ (uint32_t)i;
    }
  for (int q = 0; q < n; q++) {
    BT_CHECK_OK(braid_recv(c, rb[q][1], sizes[1], BRAID_U32, q, 101), c);
    for (int k = 0; k < 2; k++) BT_CHECK_OK(braid_send(c, sb[q][k], sizes[k], BRAID_U32, q, 100 + (uint32_t)k), c);
    BT_CHECK_OK(braid_recv(c, rb[q][0], sizes[0], BRAID_U32, q, 100), c);
  }
  BT_CHECK_OK(braid_sync(c), c);
  for (int q = 0; q < n; q++)
    for (int k = 0; k < 2; k++)
      for (size_t i = 0; i < sizes[k]; i++)
        BT_CHECK(rb[q][k][i] == ((uint32_t)(q * 1000000 + rank * 1000 + k) ^ (uint32_t)i),
                 "all-to-all: from %d size %zu element %zu wrong", q, sizes[k], i);
  for (int q = 0; q < n; q++)
    for (int k = 0; k < 2; k++) {
      free(sb[q][k]);
      free(rb[q][k]);
    }
  return 0;
}

static int test_p2p_alltoall(void) {
  static const char *const env[] = {"BRAID_SHM_CMA=0", NULL};
  return run(4, body_alltoall_tags, NULL) || run(3, body_alltoall_tags, NULL) ||
         run_env(3, body_alltoall_tags, NULL, env, -1, 120);
}

static int body_ordered(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  (void)n;
  enum { M = 3000 };
  static int32_t vals[M], got[M];
  if (rank == 0) {
    for (int i = 0; i < M; i++) {
      vals[i] = i;
      BT_CHECK_OK(braid_send(c, &vals[i], 1, BRAID_I32, 1, 7), c);
    }
    /* A few large ones on the same tag keep their place in the order. */
    BT_CHECK_OK(braid_sync(c), c);
  } else if (rank == 1) {
    for (int i = 0; i < M / 2; i++) BT_CHECK_OK(braid_recv(c, &got[i], 1, BRAID_I32, 0, 7), c);
    usleep(20000); /* the rest arrive unexpected */
    for (int i = M / 2; i < M; i++) BT_CHECK_OK(braid_recv(c, &got[i], 1, BRAID_I32, 0, 7), c);
    BT_CHECK_OK(braid_sync(c), c);
    for (int i = 0; i < M; i++) BT_CHECK(got[i] == i, "message %d arrived as %d", i, got[i]);
  }
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

static int test_p2p_ordered(void) { return run(2, body_ordered, NULL) || run(3, body_ordered, NULL); }

static int body_ring_wake(braid_comm *c, int rank, int n, void *arg);

/* Payload words placed where the next lap of the 256 KiB ring from rank 0 to
   rank 1 will put record stamps, holding the very stamp that lap will
   expect: stale ring bytes must never pass for a new record. The positions
   mirror the ring's layout (64-byte header, payload padded to 64 bytes,
   padding to the ring's end when a record does not fit). */
enum { STAMP_RING = 256 << 10, STAMP_MSGS = 400 };

static size_t stamp_fill(uint64_t *buf, uint64_t *pos, int m) {
  static const size_t lens[] = {8, 200, 8192, 4104, 8000, 64};
  size_t len = lens[m % 6], need = 64 + ((len + 63) & ~(size_t)63);
  size_t contig = STAMP_RING - (size_t)(*pos % STAMP_RING);
  if (contig < need) *pos += contig;
  uint64_t at = *pos + 64;
  for (size_t i = 0; i < len / 8; i++) {
    uint64_t a = at + 8 * i;
    buf[i] = a % 64 == 56 ? a - 56 + STAMP_RING + 1 : (uint64_t)m * 1000003u + i;
  }
  *pos += need;
  return len / 8;
}

static int body_stamps(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  braid_comm *f = NULL; /* fresh rings, written from position 0 */
  BT_CHECK_OK(braid_split(c, 0, (uint32_t)rank, &f), c);
  static uint64_t buf[1024], want[1024];
  uint64_t pos = 0;
  for (int m = 0; m < STAMP_MSGS; m++) {
    size_t cnt = stamp_fill(want, &pos, m);
    if (rank == 0) {
      memcpy(buf, want, cnt * 8);
      BT_CHECK_OK(braid_send(f, buf, cnt, BRAID_U64, 1, 5), f);
      BT_CHECK_OK(braid_sync(f), f);
    } else {
      memset(buf, 0, sizeof buf);
      BT_CHECK_OK(braid_recv(f, buf, cnt, BRAID_U64, 0, 5), f);
      BT_CHECK_OK(braid_sync(f), f);
      for (size_t i = 0; i < cnt; i++)
        BT_CHECK(buf[i] == want[i], "message %d: word %zu is %llu, expected %llu", m, i, (unsigned long long)buf[i],
                 (unsigned long long)want[i]);
    }
  }
  BT_CHECK_OK(braid_barrier(f), f);
  BT_CHECK_OK(braid_destroy(f), NULL);
  return 0;
}

/* Runs round between barriers until every rank had one under limit (a rank
   whose time is not judged passes INFINITY), at most 12 times; best is this
   rank's shortest. One fast round shows the wake-up works; more rounds keep
   a loaded machine, where any round can be slow, from failing the test. */
static int best_of_rounds(braid_comm *c, int rank, int (*round)(braid_comm *, int, int), double limit, double *best) {
  *best = 1e9;
  for (int rep = 0; rep < 12; rep++) {
    BT_CHECK_OK(braid_barrier(c), c);
    double t0 = now_s();
    if (round(c, rank, rep)) return 1;
    double dt = now_s() - t0;
    if (dt < *best) *best = dt;
    int slow = *best >= limit;
    BT_CHECK_OK(braid_all_reduce(c, &slow, 1, BRAID_I32, BRAID_MAX), c);
    if (!slow) break;
  }
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

/* A receiver that has gone to sleep (the sender waits 20 ms first) is woken
   by the message itself: a missed wake-up would cost it a 100 ms futex slice. One
   round under 80 ms shows it without timing any one round. */
static int p2p_wake_round(braid_comm *c, int rank, int rep) {
  int x = 0;
  if (rank == 0) {
    usleep(20000);
    x = rep + 1;
    BT_CHECK_OK(braid_send(c, &x, 1, BRAID_I32, 1, 9), c);
    BT_CHECK_OK(braid_sync(c), c);
    usleep(150000); /* nothing else of this rank's may wake rank 1 */
  } else if (rank == 1) {
    BT_CHECK_OK(braid_recv(c, &x, 1, BRAID_I32, 0, 9), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(x == rep + 1, "round %d received %d", rep, x);
  }
  return 0;
}

static int body_p2p_wake(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  (void)n;
  double best = 0;
  if (best_of_rounds(c, rank, p2p_wake_round, rank == 1 ? 0.08 : INFINITY, &best)) return 1;
  if (rank == 1) BT_CHECK(best < 0.08, "a 20 ms late message took at least %.0f ms in every round", best * 1e3);
  return 0;
}

/* Both ways of pairing wake-ups with sleepers: membarrier, and fences. */
static int test_p2p_stamps(void) {
  static const char *const fenced[] = {"BRAID_SHM_MEMBARRIER=0", NULL};
  return run(2, body_stamps, NULL) || run_env(2, body_stamps, NULL, fenced, -1, 120) || run(2, body_p2p_wake, NULL) ||
         run_env(2, body_p2p_wake, NULL, fenced, -1, 60) || run_env(3, body_ring_wake, NULL, fenced, -1, 60);
}

static int test_p2p_mismatch(void) {
  size_t small = 3, large = 100000;
  static const char *const env[] = {"BRAID_SHM_CMA=0", NULL};
  bt_p2p_mismatch_arg s = {small, SIZE_MAX}, l = {large, SIZE_MAX}; /* shm sends complete without their receive */
  return run(2, bt_body_p2p_mismatch, &s) || run(2, bt_body_p2p_mismatch, &l) ||
         run_env(2, bt_body_p2p_mismatch, &l, env, -1, 60);
}

/* ---------------------------------------------------------------- pipes */

/* Several large messages per pair, received in the reverse order of their
   sends, from misaligned buffers. Without single copy they cross the pair's
   pipe whole, in the order of the receiver's clear-to-sends, which is not
   the order of the sends; one of them is larger than the pipes, and the
   last too large for them, so it streams through the ring between them. */
enum { PIPE_K = 5 };
static const size_t pipe_sizes[PIPE_K] = {20001, 300001, (1u << 20) + 3, 3000017, (4u << 20) + 5};

static unsigned char pipe_byte(int from, int to, int k, size_t i) {
  return (unsigned char)(from * 61 + to * 17 + k * 5 + (int)(i % 251) + (int)(i >> 16));
}

static int body_pipe_order(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  unsigned char *sb[8][PIPE_K] = {{0}}, *rb[8][PIPE_K] = {{0}};
  BT_CHECK(n <= 8, "at most 8 ranks");
  for (int q = 0; q < n; q++)
    for (int k = 0; k < PIPE_K && q != rank; k++) {
      sb[q][k] = malloc(pipe_sizes[k] + 1);
      rb[q][k] = calloc(pipe_sizes[k] + 1, 1);
      BT_CHECK(sb[q][k] && rb[q][k], "oom");
      for (size_t i = 0; i < pipe_sizes[k]; i++) sb[q][k][i + 1] = pipe_byte(rank, q, k, i);
    }
  for (int q = 0; q < n; q++)
    for (int k = PIPE_K - 1; k >= 0 && q != rank; k--)
      BT_CHECK_OK(braid_recv(c, rb[q][k] + 1, pipe_sizes[k], BRAID_U8, q, (uint32_t)k), c);
  for (int q = 0; q < n; q++)
    for (int k = 0; k < PIPE_K && q != rank; k++)
      BT_CHECK_OK(braid_send(c, sb[q][k] + 1, pipe_sizes[k], BRAID_U8, q, (uint32_t)k), c);
  BT_CHECK_OK(braid_sync(c), c);
  for (int q = 0; q < n; q++)
    for (int k = 0; k < PIPE_K && q != rank; k++) {
      for (size_t i = 0; i < pipe_sizes[k]; i++)
        BT_CHECK(rb[q][k][i + 1] == pipe_byte(q, rank, k, i), "message %d from rank %d: byte %zu wrong", k, q, i);
      free(sb[q][k]);
      free(rb[q][k]);
    }
  /* The all-gathers that go over pipes at 2 ranks, and one either side. */
  static const size_t blocks[] = {16000, 65536, 500001, 1u << 20, (1u << 20) + 4};
  for (size_t b = 0; b < BT_COUNT(blocks); b++) {
    size_t cnt = blocks[b];
    unsigned char *in = malloc(cnt), *all = malloc(cnt * (size_t)n);
    BT_CHECK(in && all, "oom");
    for (size_t i = 0; i < cnt; i++) in[i] = pipe_byte(rank, 0, (int)b, i);
    BT_CHECK_OK(braid_all_gather(c, in, all, cnt, BRAID_U8), c);
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < cnt; i++)
        BT_CHECK(all[(size_t)q * cnt + i] == pipe_byte(q, 0, (int)b, i), "all-gather of %zu: rank %d byte %zu wrong",
                 cnt, q, i);
    free(in);
    free(all);
  }
  return 0;
}

/* Out of descriptors: rank 0 can neither make pipes (its messages from
   rank 1 stream through the ring) nor open rank 1's (its messages to
   rank 1 do too, as DATA records for receives that offered the pipes). */
static int body_pipe_nofd(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  struct rlimit was;
  int held[256], nheld = 0;
  BT_CHECK(getrlimit(RLIMIT_NOFILE, &was) == 0, "getrlimit");
  if (rank == 0) {
    int top = 0;
    DIR *d = opendir("/proc/self/fd");
    BT_CHECK(d != NULL, "no /proc/self/fd");
    for (struct dirent *e; (e = readdir(d));)
      if (atoi(e->d_name) > top) top = atoi(e->d_name);
    closedir(d);
    struct rlimit low = {(rlim_t)top + 1, was.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &low) == 0) {
      /* Fill the holes below the limit. */
      for (int f; nheld < 256 && (f = open("/dev/null", O_RDONLY)) >= 0;) held[nheld++] = f;
      BT_CHECK(nheld < 256, "descriptors did not run out");
    } else {
      /* valgrind keeps the limit to itself: the exchange runs with pipes. */
      printf("note: setrlimit(RLIMIT_NOFILE) refused (%s): the descriptor-limit variant runs unlimited\n",
             strerror(errno));
    }
  }
  int rc = body_pipe_order(c, rank, n, NULL);
  while (nheld) close(held[--nheld]);
  if (rank == 0) (void)setrlimit(RLIMIT_NOFILE, &was);
  return rc;
}

static int test_pipes(void) {
  static const char *const pipes[] = {"BRAID_SHM_CMA=0", NULL};
  static const char *const ring[] = {"BRAID_SHM_CMA=0", "BRAID_SHM_SPLICE=0", NULL};
  return run_env(2, body_pipe_order, NULL, pipes, -1, 120) || run_env(3, body_pipe_order, NULL, pipes, -1, 120) ||
         run_env(2, body_pipe_order, NULL, ring, -1, 120) || run_env(3, body_pipe_order, NULL, ring, -1, 120) ||
         run(3, body_pipe_order, NULL) || run_env(2, body_pipe_nofd, NULL, pipes, -1, 120);
}

/* A container profile that refuses process_vm_readv/writev (seccomp, as
   sandboxes without CAP_SYS_PTRACE do), and one that refuses vmsplice as
   well: shm finds out at init, says which way it copies, and every result
   is right. */
#if defined(__x86_64__)
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

static int refuse_syscalls(int also_vmsplice) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 3, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_writev, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, also_vmsplice ? SYS_vmsplice : SYS_process_vm_readv, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
  };
  struct sock_fprog prog = {(unsigned short)BT_COUNT(f), f};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

static int body_profile(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  int also_vmsplice = *(const int *)arg;
  BT_CHECK(refuse_syscalls(also_vmsplice), "could not install the seccomp filter: %s", strerror(errno));
  braid_comm *c = NULL;
  BT_CHECK_OK(braid_init(NULL, &c), NULL);
  char path[160], line[1024];
  snprintf(path, sizeof path, "%s/r%d.log", getenv("BT_PROFILE_DIR"), (int)getpid());
  FILE *f = fopen(path, "r");
  BT_CHECK(f != NULL, "no log at %s", path);
  int said = 0;
  const char *want = also_vmsplice ? "large transfers copied through shared memory, braid_mem_alloc"
                                   : "large transfers copied through shared memory, large messages read from pipes";
  while (fgets(line, sizeof line, f)) said |= strstr(line, want) != NULL;
  fclose(f);
  BT_CHECK(said, "rank %d's log at %s does not say \"%s\"", rank, path, want);
  int rc = body_pipe_order(c, rank, n, NULL);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return rc;
}

static int test_container_profile(void) {
  char dir[] = "/tmp/braid-profile-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  char dvar[128], lvar[160];
  snprintf(dvar, sizeof dvar, "BT_PROFILE_DIR=%s", dir);
  snprintf(lvar, sizeof lvar, "BRAID_LOG_FILE=%s/r%%p.log", dir);
  const char *env[] = {dvar, "BRAID_LOG=info", lvar, NULL};
  int rc = 0;
  for (int also = 0; also < 2 && !rc; also++)
    for (int n = 2; n <= 3 && !rc; n++) {
      int before = bt_dead_shm_names(1);
      bt_run_opts o = {"shm", n, 120, env, -1};
      rc = bt_run_ranks_manual(&o, body_profile, &also, NULL);
      if (!rc && bt_dead_shm_names(1) > before) {
        fprintf(stderr, "container profile: /dev/shm entries leaked\n");
        rc = 1;
      }
    }
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    char f[300];
    if (e->d_name[0] == '.') continue;
    snprintf(f, sizeof f, "%s/%s", dir, e->d_name);
    unlink(f);
  }
  if (d) closedir(d);
  rmdir(dir);
  return rc;
}
#else
static int test_container_profile(void) {
  printf("SKIP: the seccomp filter of this test is written for x86-64\n");
  return BT_SKIP;
}
#endif

/* ---------------------------------------------------------------- failures */

typedef struct kill_case {
  int what; /* 0 all-reduce, 1 broadcast, 2 recv, 3 abort */
  int victim;
  int mem;  /* buffers from braid_mem_alloc (read in place by peers) */
  int big;  /* recv: 512 KiB messages (run without single copy: through pipes) */
} kill_case;

static int body_kill(braid_comm *c, int rank, int n, void *arg) {
  const kill_case *k = arg;
  size_t cnt = 1 << 18;
  float *buf = bt_buf_alloc(k->mem, cnt * 4);
  BT_CHECK(buf != NULL, "oom");
  memset(buf, 0, cnt * 4);
  for (int it = 0;; it++) {
    if (rank == k->victim && it == 3) {
      if (k->what == 3) {
        braid_abort(c);
        usleep(300000);
        _exit(0);
      }
      raise(SIGKILL);
    }
    double t0 = now_s();
    braid_status st;
    if (k->what == 0 || k->what == 3) st = braid_all_reduce(c, buf, it % 2 ? cnt : 3, BRAID_F32, BRAID_SUM);
    else if (k->what == 1) st = braid_broadcast(c, buf, it % 2 ? cnt : 3, BRAID_F32, (it + 1) % n);
    else {
      /* Large enough to go by rendezvous: the receiver reads the sender's buffer. */
      size_t m = k->mem || k->big ? cnt / 2 : 4;
      st = braid_recv(c, buf + cnt / 2, m, BRAID_F32, (rank + n - 1) % n, 3);
      if (!st) st = braid_send(c, buf, m, BRAID_F32, (rank + 1) % n, 3);
      if (!st) st = braid_sync(c);
    }
    double dt = now_s() - t0;
    if (st == BRAID_OK) {
      /* Broadcasts wait only for the root (and a root for ring space), so
         they may succeed until the victim's turn as root; the ring exchange
         needs the neighbours, so it fails by its second round. */
      int last_ok = k->what == 1 ? 3 + (k->victim + 2 * n - 4) % n - 1 : k->what == 2 ? 4 : 2;
      BT_CHECK(it <= last_ok, "rank %d: iteration %d succeeded after the victim left", rank, it);
      continue;
    }
    BT_CHECK(st == BRAID_ERR_PEER_LOST, "rank %d: got %s, expected PEER_LOST: %s", rank, braid_status_string(st),
             braid_last_error(c));
    char want[64];
    snprintf(want, sizeof want, "rank %d", k->victim);
    BT_CHECK_MSG(c, want);
    BT_CHECK(dt < 5.0, "noticed after %.2f s", dt);
    /* Sticky. */
    BT_CHECK_ST(braid_barrier(c), BRAID_ERR_PEER_LOST, c);
    break;
  }
  bt_buf_free(k->mem, buf);
  return 0;
}

static int test_kill_peer(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=100", NULL};
  for (int mem = 0; mem < 2; mem++)
    for (int what = 0; what < 4; what++) {
      if (mem && what == 3) continue;
      kill_case k = {what, what == 2 ? 1 : 2, mem, 0};
      int before = bt_dead_shm_names(1);
      if (run_env(4, body_kill, &k, env, k.victim, 60)) {
        fprintf(stderr, "kill test %d (braid memory: %d) failed\n", what, mem);
        return 1;
      }
      BT_CHECK(bt_dead_shm_names(1) <= before, "kill test %d left /dev/shm entries", what);
    }
  /* A peer killed while messages cross the pipes: the sender to it finds
     the pipe full, its receiver an empty one. */
  static const char *const pipes[] = {"BRAID_TIMEOUT=100", "BRAID_SHM_CMA=0", NULL};
  kill_case k = {2, 1, 0, 1};
  return run_env(4, body_kill, &k, pipes, k.victim, 60);
}

static int body_timeout(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  _Atomic int *timed_out = arg; /* shared by the forked ranks */
  int x = 0;
  if (rank == 0) {
    double t0 = now_s();
    BT_CHECK_OK(braid_recv(c, &x, 1, BRAID_I32, 1, 77), c);
    braid_status st = braid_sync(c);
    atomic_store(timed_out, 1);
    BT_CHECK(st == BRAID_ERR_TIMEOUT, "sync: %s: %s", braid_status_string(st), braid_last_error(c));
    BT_CHECK_MSG(c, "rank 1");
    BT_CHECK_MSG(c, "tag 77");
    BT_CHECK(now_s() - t0 < 3.0, "timeout took %.2f s", now_s() - t0);
  } else {
    /* The timed-out rank fails the communicator for everyone. This rank
       enters only after rank 0's wait ran out (a word both share, not a
       sleep: on a loaded machine rank 0 can start late), so its own
       barrier cannot run out first. */
    (void)bt_await(timed_out, 1, 10);
    braid_status st = braid_barrier(c);
    BT_CHECK(st == BRAID_ERR_PEER_LOST || st == BRAID_ERR_TIMEOUT, "barrier: %s", braid_status_string(st));
  }
  return 0;
}

static int test_timeout(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=0.5", NULL};
  _Atomic int *timed_out = bt_shared_counter();
  BT_CHECK(timed_out, "cannot map a shared counter");
  int rc = run_env(2, body_timeout, (void *)timed_out, env, -1, 30);
  bt_shared_free(timed_out);
  return rc;
}

/* ---------------------------------------------------------------- found in review */

/* A root waiting for space in the small-broadcast ring must be woken by the
   receivers of the broadcast it waits on, whichever rank rooted that one.
   Without the wake-up it sleeps out a 100 ms futex slice; one round under 80
   ms shows the wake-up works without timing any single round. */
static int ring_wake_round(braid_comm *c, int rank, int rep) {
  (void)rep;
  int x = 0;
  if (rank == 2) usleep(10000);
  for (int b = 0; b < 64; b++) BT_CHECK_OK(braid_broadcast(c, &x, 1, BRAID_I32, 0), c);
  BT_CHECK_OK(braid_broadcast(c, &x, 1, BRAID_I32, 1), c);
  return 0;
}

static int body_ring_wake(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  (void)n;
  double best = 0;
  if (best_of_rounds(c, rank, ring_wake_round, 0.08, &best)) return 1;
  BT_CHECK(best < 0.08, "rank %d: 65 broadcasts took at least %.0f ms in every round", rank, best * 1e3);
  return 0;
}

static int test_ring_wake(void) { return run(3, body_ring_wake, NULL); }

/* A wrong-shaped receive of a message that was already in the ring fails at
   once, as when the message had been taken from the ring before. */
static int body_mismatch_waiting(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  (void)n;
  double v[3] = {1, 2, 3}, r[3] = {0};
  if (rank == 0) {
    usleep(20000);
    BT_CHECK_OK(braid_send(c, v, 3, BRAID_F64, 1, 5), c);
    BT_CHECK_OK(braid_barrier(c), c);
  } else {
    BT_CHECK_OK(braid_barrier(c), c); /* the message sits in the ring, undrained */
    BT_CHECK_ST(braid_recv(c, r, 2, BRAID_F64, 0, 5), BRAID_ERR_MISMATCH, c);
    BT_CHECK_MSG(c, "tag 5");
    BT_CHECK_OK(braid_recv(c, r, 3, BRAID_F64, 0, 5), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(r[0] == 1 && r[2] == 3, "message intact after the mismatch");
  }
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

static int test_mismatch_waiting(void) { return run(2, body_mismatch_waiting, NULL); }

/* A sender waiting in a collective of another communicator still streams the
   message it owes: rank 1 cannot go on before it has it, and rank 2 waits for
   rank 1 before it joins rank 0's collective. */
static int body_cross_comm(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  (void)n;
  braid_comm *sub = NULL;
  BT_CHECK_OK(braid_split(c, rank == 1 ? BRAID_SPLIT_NONE : 0, 0, &sub), c);
  size_t cnt = 1 << 18; /* 1 MiB: above eager, below single copy */
  float *big = calloc(cnt, 4);
  BT_CHECK(big, "oom");
  int tok = 7, x = 1;
  if (rank == 0) {
    for (size_t i = 0; i < cnt; i++) big[i] = (float)(i % 1000);
    BT_CHECK_OK(braid_send(c, big, cnt, BRAID_F32, 1, 1), c);
    BT_CHECK_OK(braid_all_reduce(sub, &x, 1, BRAID_I32, BRAID_SUM), sub);
    BT_CHECK_OK(braid_sync(c), c);
  } else if (rank == 1) {
    BT_CHECK_OK(braid_recv(c, big, cnt, BRAID_F32, 0, 1), c);
    BT_CHECK_OK(braid_sync(c), c);
    for (size_t i = 0; i < cnt; i++) BT_CHECK(big[i] == (float)(i % 1000), "element %zu", i);
    BT_CHECK_OK(braid_send(c, &tok, 1, BRAID_I32, 2, 2), c);
    BT_CHECK_OK(braid_sync(c), c);
  } else {
    BT_CHECK_OK(braid_recv(c, &tok, 1, BRAID_I32, 1, 2), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK_OK(braid_all_reduce(sub, &x, 1, BRAID_I32, BRAID_SUM), sub);
  }
  if (rank != 1) BT_CHECK(x == 2, "sum over the sub-communicator %d", x);
  if (sub) BT_CHECK_OK(braid_destroy(sub), NULL);
  free(big);
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

static int test_cross_comm(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=5", NULL};
  return run_env(3, body_cross_comm, NULL, env, -1, 60);
}

/* Random mix of every collective across every size path, unaligned
   buffers, random roots and stalls; every result checked. */
static int body_mix(braid_comm *c, int rank, int n, void *arg) {
  int iters = *(const int *)arg;
  enum { BIG = 300000 };
  unsigned char *a = malloc(BIG * 4 * (size_t)n + 64), *g = malloc(BIG * 4 * (size_t)n + 64);
  BT_CHECK(a && g, "oom");
  uint64_t x = 0x1234567ULL;
  for (int it = 0; it < iters; it++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    int kind = (int)((x >> 33) % 15), root = (int)((x >> 45) % (uint64_t)n), sz = (int)((x >> 20) % 8);
    size_t cnt = sz < 4 ? 1 + (size_t)((x >> 24) % 1000)
                        : sz < 7 ? 4000 + (size_t)((x >> 24) % 60000) : 100000 + (size_t)((x >> 24) % (BIG - 100000));
    size_t off = (size_t)((x >> 40) % 3);
    unsigned char *A = a + off, *G = g + off;
    uint32_t v, want;
    if ((int)((x >> 50) % (uint64_t)n) == rank && (x >> 8) % 13 == 0) usleep(3000);
    if (kind < 6) {
      for (size_t i = 0; i < cnt; i++) {
        v = rank == root ? (uint32_t)(it * 7919u + i) : 0xdeadbeefu;
        memcpy(A + 4 * i, &v, 4);
      }
      BT_CHECK_OK(braid_broadcast(c, A, cnt, BRAID_U32, root), c);
      for (size_t i = 0; i < cnt; i++) {
        memcpy(&v, A + 4 * i, 4);
        BT_CHECK(v == (uint32_t)(it * 7919u + i), "iteration %d: broadcast of %zu from %d, element %zu", it, cnt, root,
                 i);
      }
    } else if (kind < 8) {
      for (size_t i = 0; i < cnt; i++) {
        v = (uint32_t)(rank + 1) * (uint32_t)(it + i);
        memcpy(A + 4 * i, &v, 4);
      }
      BT_CHECK_OK(braid_all_reduce(c, A, cnt, BRAID_U32, BRAID_SUM), c);
      for (size_t i = 0; i < cnt; i++) {
        memcpy(&v, A + 4 * i, 4);
        want = (uint32_t)(n * (n + 1) / 2) * (uint32_t)(it + i);
        BT_CHECK(v == want, "iteration %d: all-reduce of %zu, element %zu", it, cnt, i);
      }
    } else if (kind < 10) {
      for (size_t i = 0; i < cnt; i++) {
        v = (uint32_t)(rank * 100003 + it + i);
        memcpy(A + 4 * i, &v, 4);
      }
      BT_CHECK_OK(braid_all_gather(c, A, G, cnt, BRAID_U32), c);
      for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++) {
          memcpy(&v, G + 4 * ((size_t)q * cnt + i), 4);
          BT_CHECK(v == (uint32_t)(q * 100003 + it + i), "iteration %d: all-gather of %zu, block %d", it, cnt, q);
        }
    } else if (kind < 11) {
      size_t rc = cnt / (size_t)n + 1;
      for (size_t i = 0; i < rc * (size_t)n; i++) {
        v = (uint32_t)(rank + 1) * (uint32_t)(it + i);
        memcpy(G + 4 * i, &v, 4);
      }
      BT_CHECK_OK(braid_reduce_scatter(c, G, A, rc, BRAID_U32, BRAID_SUM), c);
      for (size_t i = 0; i < rc; i++) {
        memcpy(&v, A + 4 * i, 4);
        want = (uint32_t)(n * (n + 1) / 2) * (uint32_t)(it + (size_t)rank * rc + i);
        BT_CHECK(v == want, "iteration %d: reduce-scatter of %zu, element %zu", it, rc, i);
      }
    } else if (kind == 11) {
      BT_CHECK_OK(braid_barrier(c), c);
    } else if (kind == 12) {
      for (size_t i = 0; i < cnt; i++) {
        v = (uint32_t)(rank * 100003 + it + i);
        memcpy(A + 4 * i, &v, 4);
      }
      BT_CHECK_OK(braid_gather(c, A, G, cnt, BRAID_U32, root), c);
      for (int q = 0; q < n && rank == root; q++)
        for (size_t i = 0; i < cnt; i++) {
          memcpy(&v, G + 4 * ((size_t)q * cnt + i), 4);
          BT_CHECK(v == (uint32_t)(q * 100003 + it + i), "iteration %d: gather of %zu to %d, block %d", it, cnt, root,
                   q);
        }
    } else if (kind == 13) {
      for (size_t i = 0; i < cnt; i++) {
        v = (uint32_t)(rank + 1) * (uint32_t)(it + i);
        memcpy(A + 4 * i, &v, 4);
      }
      BT_CHECK_OK(braid_reduce(c, A, G, cnt, BRAID_U32, BRAID_SUM, root), c);
      for (size_t i = 0; i < cnt && rank == root; i++) {
        memcpy(&v, G + 4 * i, 4);
        want = (uint32_t)(n * (n + 1) / 2) * (uint32_t)(it + i);
        BT_CHECK(v == want, "iteration %d: reduce of %zu to %d, element %zu", it, cnt, root, i);
      }
    } else {
      size_t sc = cnt / (size_t)n + 1;
      for (size_t i = 0; i < sc * (size_t)n && rank == root; i++) {
        v = (uint32_t)(it * 31u + i);
        memcpy(G + 4 * i, &v, 4);
      }
      BT_CHECK_OK(braid_scatter(c, G, A, sc, BRAID_U32, root), c);
      for (size_t i = 0; i < sc; i++) {
        memcpy(&v, A + 4 * i, 4);
        BT_CHECK(v == (uint32_t)(it * 31u + (size_t)rank * sc + i), "iteration %d: scatter of %zu from %d, element %zu",
                 it, sc, root, i);
      }
    }
  }
  free(a);
  free(g);
  return 0;
}

static int test_mix(void) {
  int it = bt_quick() ? 150 : 400;
  static const char *const small[] = {"BRAID_SHM_BUFFER=64K", NULL};
  /* Small calls move through staging (rotate in shm.c) and wrap around it
     often in 1 MiB, between calls of every other size. */
  static const char *const mid[] = {"BRAID_SHM_BUFFER=1M", "BRAID_SHM_CMA=0", NULL};
  return run(3, body_mix, &it) || run_env(4, body_mix, &it, small, -1, 240) || run_env(2, body_mix, &it, mid, -1, 240);
}

/* A receive of braid memory taken late, inside a later all-gather's wait,
   carries the sender's older free count: it must not drop the mapping the
   all-gather reads (which crashed, or read another allocation mapped at
   the same address). arg: a shared word, 1 once rank 1 is about to enter. */
#define ZC_MSG ((size_t)64 << 10)
#define ZC_BLK ((size_t)4 << 20)

static int body_zc_late_receive(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  _Atomic int *step = arg;
  char *recv = malloc(2 * ZC_BLK);
  BT_CHECK(recv != NULL, "out of memory");
  if (rank == 1) {
    char *a, *b, *x;
    BT_CHECK_OK(braid_mem_alloc((void **)&a, ZC_MSG), c);
    BT_CHECK_OK(braid_mem_alloc((void **)&b, ZC_BLK), c);
    BT_CHECK_OK(braid_mem_alloc((void **)&x, 4096), c);
    memset(a, 0x11, ZC_MSG);
    memset(b, 0x22, ZC_BLK);
    BT_CHECK_OK(braid_send(c, a, ZC_MSG, BRAID_U8, 0, 7), c);
    BT_CHECK_OK(braid_mem_free(x), c); /* the free count moves on */
    atomic_store(step, 1);
    BT_CHECK_OK(braid_all_gather(c, b, recv, ZC_BLK, BRAID_U8), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK_OK(braid_mem_free(a), c);
    BT_CHECK_OK(braid_mem_free(b), c);
    free(recv);
    return 0;
  }
  char *msg = malloc(ZC_MSG), *send = malloc(ZC_BLK);
  BT_CHECK(msg && send, "out of memory");
  memset(send, 0x33, ZC_BLK);
  BT_CHECK(bt_await(step, 1, 30), "rank 1 never got to its all-gather");
  usleep(50000); /* rank 1 announces its block before this rank maps it */
  BT_CHECK_OK(braid_recv(c, msg, ZC_MSG, BRAID_U8, 1, 7), c);
  BT_CHECK_OK(braid_all_gather(c, send, recv, ZC_BLK, BRAID_U8), c);
  BT_CHECK_OK(braid_sync(c), c);
  for (size_t i = 0; i < ZC_BLK; i++) BT_CHECK((unsigned char)recv[ZC_BLK + i] == 0x22, "rank 1's block, byte %zu", i);
  for (size_t i = 0; i < ZC_MSG; i++) BT_CHECK((unsigned char)msg[i] == 0x11, "the message, byte %zu", i);
  free(msg);
  free(send);
  free(recv);
  return 0;
}

/* A collective keeps its pointers into a peer's braid memory across its
   waits, in which point-to-point progress maps more of that peer's
   allocations (more than the cache keeps per peer): the collective's
   mappings must outlive the call. Rank 1 sends from SHM_ZMAP_CAP separate
   allocations and enters the collective from one more; rank 0 posts the
   receives and enters late (the order makes the pulls land inside its
   staged all-gather and reduce-scatter rounds; the result is checked in
   any order). */
static int body_zc_held(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  _Atomic int *sent = arg;
  enum { NMSG = SHM_ZMAP_CAP, MSG = 64 << 10 };
  const size_t ag = (size_t)1 << 20, rs = (size_t)1 << 18;
  char *bufs[NMSG] = {0}, *in = NULL;
  char *out = malloc(2 * ag);
  float *rout = malloc(rs * sizeof(float));
  BT_CHECK(out && rout, "out of memory");
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < NMSG; i++) {
      if (rank == 1) {
        BT_CHECK_OK(braid_mem_alloc((void **)&bufs[i], MSG), c);
        memset(bufs[i], 'a' + i, MSG);
        BT_CHECK_OK(braid_send(c, bufs[i], MSG, BRAID_U8, 0, (uint32_t)(round * NMSG + i)), c);
      } else {
        bufs[i] = calloc(1, MSG);
        BT_CHECK(bufs[i], "out of memory");
        BT_CHECK_OK(braid_recv(c, bufs[i], MSG, BRAID_U8, 1, (uint32_t)(round * NMSG + i)), c);
      }
    }
    const size_t inb = round == 0 ? ag : 2 * rs * sizeof(float);
    if (rank == 1) BT_CHECK_OK(braid_mem_alloc((void **)&in, inb), c);
    else in = malloc(inb);
    BT_CHECK(in, "out of memory");
    if (round == 0) {
      memset(in, 0x11 * (rank + 1), ag);
    } else {
      float *f = (float *)(void *)in;
      for (size_t i = 0; i < 2 * rs; i++) f[i] = (float)(rank + 1) * (float)(i % 97);
    }
    if (rank == 1) {
      atomic_store(sent, round + 1);
    } else {
      BT_CHECK(bt_await(sent, round + 1, 30), "rank 1 never sent");
      struct timespec ts = {0, 100 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    if (round == 0) {
      BT_CHECK_OK(braid_all_gather(c, in, out, ag, BRAID_U8), c);
      for (size_t i = 0; i < 2 * ag; i++)
        BT_CHECK(out[i] == (char)(i < ag ? 0x11 : 0x22), "all-gather byte %zu is %d", i, out[i]);
    } else {
      BT_CHECK_OK(braid_reduce_scatter(c, in, rout, rs, BRAID_F32, BRAID_SUM), c);
      for (size_t i = 0; i < rs; i++) {
        float want = 3.0f * (float)((i + (size_t)rank * rs) % 97);
        BT_CHECK(rout[i] == want, "reduce-scatter [%zu] = %g, want %g", i, rout[i], want);
      }
    }
    BT_CHECK_OK(braid_sync(c), c);
    for (int i = 0; i < NMSG; i++) {
      if (rank == 0) BT_CHECK(bufs[i][0] == 'a' + i && bufs[i][MSG - 1] == 'a' + i, "message %d", i);
      if (rank == 1) BT_CHECK_OK(braid_mem_free(bufs[i]), c);
      else free(bufs[i]);
    }
    if (rank == 1) BT_CHECK_OK(braid_mem_free(in), c);
    else free(in);
    BT_CHECK_OK(braid_barrier(c), c);
  }
  free(out);
  free(rout);
  return 0;
}

static int test_zc_held(void) {
  /* Small staging: the reduce-scatter runs in rounds. */
  static const char *const env[] = {"BRAID_SHM_BUFFER=64K", NULL};
  bt_run_opts o = {"shm", 2, 60, env, -1};
  return bt_run_ranks_counted(&o, body_zc_held, NULL);
}

static int test_zc_late_receive(void) {
  static const char *const env[] = {"BRAID_SHM_CMA=0", NULL};
  return run_counted(2, body_zc_late_receive, env, -1, 60);
}

/* A send lent to the receiver's pipe and given up by the sender's destroy:
   the sender may write its buffer again at once, so the receive, read
   later, fails naming the sender instead of returning those bytes. */
#define PIPE_LEN ((size_t)200 << 10)

static int body_pipe_abandoned(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  _Atomic int *step = arg;
  unsigned char *buf = malloc(PIPE_LEN);
  BT_CHECK(buf != NULL, "out of memory");
  if (rank == 1) {
    memset(buf, 0x11, PIPE_LEN);
    BT_CHECK_OK(braid_send(c, buf, PIPE_LEN, BRAID_U8, 0, 5), c);
    atomic_store(step, 1);
    BT_CHECK(bt_await(step, 2, 30), "rank 0 never posted its receive");
    BT_CHECK_OK(braid_destroy(c), NULL); /* gives the send up after BRAID_DESTROY_TIMEOUT */
    memset(buf, 0xEE, PIPE_LEN);
    atomic_store(step, 3);
    BT_CHECK(bt_await(step, 4, 30), "rank 0 never finished");
    _exit(0); /* its communicator is gone */
  }
  memset(buf, 0, PIPE_LEN);
  BT_CHECK(bt_await(step, 1, 30), "rank 1 never sent");
  BT_CHECK_OK(braid_recv(c, buf, PIPE_LEN, BRAID_U8, 1, 5), c);
  atomic_store(step, 2);
  BT_CHECK(bt_await(step, 3, 30), "rank 1 never left");
  braid_status st = braid_sync(c);
  atomic_store(step, 4);
  BT_CHECK(st == BRAID_ERR_PEER_LOST, "the receive got %s: %s", braid_status_string(st), braid_last_error(c));
  BT_CHECK_MSG(c, "rank 1 destroyed its communicator before its 204800-byte message");
  free(buf);
  return 0;
}

static int test_pipe_abandoned(void) {
  static const char *const env[] = {"BRAID_SHM_CMA=0", "BRAID_DESTROY_TIMEOUT=0.2", NULL};
  return run_counted(2, body_pipe_abandoned, env, 1, 60);
}

/* Without the call check a section word of a small gather is only the
   call's number: bytes an earlier broadcast left where rank 1's word now
   lies (entry 0 again, SHM_BRING = 64 ring calls later; rank 1's section
   starts 64 bytes in) must not pass for it while rank 1 is late. */
static int body_ring_stale(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  _Atomic int *step = arg;
  int32_t big[64];
  for (int i = 0; i < 64; i++) big[i] = rank == 0 ? 1000 + i : 0;
  /* The payload starts 64 bytes in: its first 8 bytes read as 65 << 32, the word of ring call 64. */
  if (rank == 0) big[0] = 0, big[1] = 65;
  BT_CHECK_OK(braid_broadcast(c, big, 64, BRAID_I32, 0), c); /* ring call 0 */
  for (int i = 1; i < 64; i++) {
    int32_t v = i;
    BT_CHECK_OK(braid_broadcast(c, &v, 1, BRAID_I32, 0), c);
  }
  if (rank == 0) atomic_store(step, 1);
  if (rank == 1) {
    BT_CHECK(bt_await(step, 1, 30), "rank 0 never got to the gather");
    usleep(100000); /* rank 0 waits in the gather */
  }
  int32_t mine = 111 * (rank + 1), all[2] = {-1, -1};
  BT_CHECK_OK(braid_gather(c, &mine, all, 1, BRAID_I32, 0), c); /* ring call 64 */
  if (rank == 0) BT_CHECK(all[0] == 111 && all[1] == 222, "the gather gave {%d, %d}", all[0], all[1]);
  return 0;
}

static int test_ring_stale_word(void) {
  static const char *const env[] = {"BRAID_CHECK=0", NULL};
  return run_counted(2, body_ring_stale, env, -1, 60);
}

/* Ring call 2^31: entry 0's first word, last written by a broadcast
   2^31 ring calls earlier (small reduces rooted at rank 0 never write it),
   holds the same 31-bit count as this call's. The ranks run real calls,
   then advance their ring counters as 2^31 - 192 such reduces would have
   (nothing else of the state depends on them), run the last 64 for real
   and broadcast from a late root: the readers must get the new value,
   with the call check (not a false mismatch) and without (not the old
   value). */
static int body_ring_wrap(braid_comm *c, int rank, int n, void *arg) {
  _Atomic int *step = arg;
  shm_state *s = c->be;
  int32_t v = rank == 1 ? 111 : -1, x = rank, sum = 0;
  BT_CHECK_OK(braid_broadcast(c, &v, 1, BRAID_I32, 1), c); /* ring call 0: entry 0 */
  BT_CHECK(v == 111, "the first broadcast gave %d", v);
  for (int i = 0; i < 127; i++) BT_CHECK_OK(braid_reduce(c, &x, &sum, 1, BRAID_I32, BRAID_SUM, 0), c);
  BT_CHECK_OK(braid_barrier(c), c);
  const uint64_t jump = ((uint64_t)1 << 31) - 192;
  s->bseq += jump;
  atomic_fetch_add(&s->mine->bcast_done, jump);
  BT_CHECK_OK(braid_barrier(c), c);
  while (s->bseq < ((uint64_t)1 << 31)) BT_CHECK_OK(braid_reduce(c, &x, &sum, 1, BRAID_I32, BRAID_SUM, 0), c);
  v = rank == 1 ? 222 : -1;
  if (rank == 1) {
    BT_CHECK(bt_await(step, n - 1, 30), "the readers never got to the broadcast");
    usleep(100000); /* the readers wait in it */
  } else {
    atomic_fetch_add(step, 1);
  }
  BT_CHECK_OK(braid_broadcast(c, &v, 1, BRAID_I32, 1), c); /* ring call 2^31: entry 0 */
  BT_CHECK(v == 222, "the broadcast of ring call 2^31 gave %d", v);
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

static int test_ring_wrap(void) {
  static const char *const off[] = {"BRAID_CHECK=0", NULL}, *const on[] = {"BRAID_CHECK=1", NULL};
  return run_counted(3, body_ring_wrap, off, -1, 60) || run_counted(3, body_ring_wrap, on, -1, 60);
}

/* Messages of one (source, tag) stay in order when the ring to their
   destination fills, for every destination rank, past 64 too: rank 0
   queues 32 eager messages of 8 KiB (the last does not fit the ring) and
   then one of 4 bytes, which would fit, to the last rank, which drains
   nothing until all are issued. */
static int body_order_last(braid_comm *c, int rank, int n, void *arg) {
  _Atomic int *issued = arg;
  enum { NB = 32, BIG = 2048 };
  const int dst = n - 1;
  float *b = calloc(NB * BIG, sizeof *b), one = rank == 0 ? -1.0f : 0.0f;
  BT_CHECK(b != NULL, "out of memory");
  if (rank == 0) {
    for (int i = 0; i < NB * BIG; i++) b[i] = (float)i;
    for (int i = 0; i < NB; i++) BT_CHECK_OK(braid_send(c, b + i * BIG, BIG, BRAID_F32, dst, 1), c);
    BT_CHECK_OK(braid_send(c, &one, 1, BRAID_F32, dst, 1), c);
    atomic_store(issued, 1);
    BT_CHECK_OK(braid_sync(c), c);
  } else if (rank == dst) {
    BT_CHECK(bt_await(issued, 1, 60), "rank 0 never issued its sends");
    for (int i = 0; i < NB; i++) BT_CHECK_OK(braid_recv(c, b + i * BIG, BIG, BRAID_F32, 0, 1), c);
    BT_CHECK_OK(braid_recv(c, &one, 1, BRAID_F32, 0, 1), c);
    BT_CHECK_OK(braid_sync(c), c);
    for (int i = 0; i < NB * BIG; i++) BT_CHECK(b[i] == (float)i, "element %d of the large messages is %g", i, (double)b[i]);
    BT_CHECK(one == -1.0f, "the small message holds %g", (double)one);
  }
  free(b);
  return 0;
}

static int test_order_many_ranks(void) {
  static const char *const env[] = {"BRAID_SHM_BUFFER=64K", NULL};
  static const int sizes[] = {2, 64, 65};
  for (size_t i = 0; i < BT_COUNT(sizes); i++)
    if (run_counted(sizes[i], body_order_last, env, -1, 240)) return 1;
  return 0;
}

/* Large all-to-alls (above the slots) by each path (BRAID_SHM_A2A: staged
   rounds, single copy, or rank 0 timing both, whose first calls of a size
   class, out of place and in place apart, take them in turn and the later
   ones the one found faster): out of place and in place, ten calls of each
   size and kind, every element checked. */
static int body_a2a_paths(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  static const size_t counts[] = {20000, 70000, 300000}; /* i32 per block */
  for (size_t z = 0; z < BT_COUNT(counts); z++) {
    const size_t cnt = counts[z], total = cnt * (size_t)n;
    int32_t *snd = malloc(total * sizeof *snd), *rcv = malloc(total * sizeof *rcv);
    BT_CHECK(snd && rcv, "out of memory");
    for (int it = 0; it < 20; it++) {
      /* From the 10th call the ranks choose in place differently, which
         each may: they must still take one path. */
      const int inplace = it < 10 ? it & 1 : (rank + it) & 1;
      for (int j = 0; j < n; j++)
        for (size_t k = 0; k < cnt; k++) snd[(size_t)j * cnt + k] = (int32_t)(rank * 7919 + j * 104729 + (int)k + it);
      if (inplace) memcpy(rcv, snd, total * sizeof *snd);
      else memset(rcv, 0xCD, total * sizeof *rcv);
      BT_CHECK_OK(braid_all_to_all(c, inplace ? rcv : snd, rcv, cnt, BRAID_I32), c);
      BT_CHECK_OK(braid_sync(c), c);
      for (int j = 0; j < n; j++)
        for (size_t k = 0; k < cnt; k++)
          if (rcv[(size_t)j * cnt + k] != (int32_t)(j * 7919 + rank * 104729 + (int)k + it))
            BT_CHECK(0, "count %zu call %d: element %zu from rank %d", cnt, it, k, j);
    }
    free(snd);
    free(rcv);
  }
  return 0;
}

static int test_a2a_paths(void) {
  static const char *const staged[] = {"BRAID_SHM_A2A=staged", NULL}, *const single[] = {"BRAID_SHM_A2A=single", NULL},
                           *const autom[] = {"BRAID_SHM_A2A=auto", NULL};
  const char *const *envs[] = {staged, single, autom};
  for (int e = 0; e < 3; e++)
    for (int n = 2; n <= 3; n++)
      if (run_env(n, body_a2a_paths, NULL, envs[e], -1, 120)) {
        fprintf(stderr, "all-to-all with %s, %d ranks failed\n", envs[e][0], n);
        return 1;
      }
  /* A value that is not one: braid_init says so. */
  static const char *const bad[] = {"BRAID_SHM_A2A=fastest", NULL};
  bt_rank_result res[2];
  bt_run_opts o = {"shm", 2, 60, bad, -1};
  int rc = bt_run_ranks_ex(&o, body_a2a_paths, NULL, res);
  BT_CHECK(rc != 0, "braid_init accepted BRAID_SHM_A2A=fastest");
  return 0;
}

static const bt_case cases[] = {
    {"coll_small", test_coll_small, 400},  {"coll_large", test_coll_large, 400},
    {"coll_large_nocma", test_coll_large_nocma, 400}, {"rooted_paths", test_rooted_paths, 400},
    {"sixteen_ranks", test_sixteen_ranks, 120}, {"split", test_split, 120},
    {"split_abort", test_split_abort, 120},
    {"p2p_ring", test_p2p_ring, 200},     {"p2p_alltoall", test_p2p_alltoall, 120},
    {"p2p_ordered", test_p2p_ordered, 120}, {"p2p_mismatch", test_p2p_mismatch, 120},
    {"p2p_stamps", test_p2p_stamps, 200},
    {"kill_peer", test_kill_peer, 200},   {"timeout", test_timeout, 60},
    {"drift", test_drift, 200},           {"reduce_ahead", test_reduce_ahead, 200},           {"ring_wake", test_ring_wake, 60},
    {"mismatch_waiting", test_mismatch_waiting, 60}, {"cross_comm", test_cross_comm, 90},
    {"mix", test_mix, 400},
    {"zc_coll", test_zc_coll, 400},       {"zc_mappings", test_zc_mappings, 60},
    {"zc_p2p", test_zc_p2p, 120},         {"ag_mixed_placement", test_ag_mixed_placement, 60},
    {"pipes", test_pipes, 300},           {"container_profile", test_container_profile, 200},
    {"zc_late_receive", test_zc_late_receive, 60}, {"pipe_abandoned", test_pipe_abandoned, 60},
    {"ring_stale_word", test_ring_stale_word, 60}, {"start_alloc_fails", test_start_alloc_fails, 300},
    {"ring_wrap", test_ring_wrap, 120},  {"order_many_ranks", test_order_many_ranks, 300},
    {"a2a_paths", test_a2a_paths, 300},   {"zc_held", test_zc_held, 120},
};

int main(int argc, char **argv) { return bt_main(argc, argv, cases, BT_COUNT(cases)); }
