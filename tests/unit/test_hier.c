/* Backend hier on simulated nodes (BRAID_NODE_ID per rank): 2x2, 3+1 and
   2x3 with interleaved placement run the conformance matrix (exact results,
   guards, untouched send buffers, identical bits on every rank), split,
   point-to-point inside and across nodes, the call check, and a rank killed
   on one node failing every rank on every node. The automatic choice of a
   backend picks hier for ranks on several nodes and shm for one. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll_check.h"
#include "harness.h"
#include "p2p_check.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct layout {
  const char *name;
  const char *nodes; /* node id of each rank, one letter per rank */
} layout;

static const layout layouts[] = {
    {"2x2", "aabb"},
    {"3+1", "aaab"},
    {"2x3 interleaved", "ababab"},
};

typedef struct hcase {
  const layout *lay;
  int (*body)(braid_comm *c, int rank, int n, void *arg);
  void *arg;
  const char *backend; /* NULL: hier */
} hcase;

/* Each rank names its node, then joins. */
static int join(braid_comm **c, int rank, const hcase *k) {
  char id[2] = {k->lay->nodes[rank], 0};
  setenv("BRAID_NODE_ID", id, 1);
  if (k->backend) setenv("BRAID_BACKEND", k->backend, 1);
  else unsetenv("BRAID_BACKEND");
  braid_status st = braid_init(NULL, c);
  if (st) {
    bt_report(__FILE__, __LINE__, "%s: init failed: %s", k->lay->name, braid_last_error(NULL));
    return 1;
  }
  return 0;
}

static int body_joined(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  const hcase *k = arg;
  braid_comm *c;
  if (join(&c, rank, k)) return 1;
  int rc = k->body(c, rank, n, k->arg);
  braid_destroy(c);
  return rc;
}

static int run_layout(const layout *lay, int (*body)(braid_comm *, int, int, void *), void *arg,
                      const char *const *env, const char *backend) {
  hcase k = {lay, body, arg, backend};
  bt_run_opts o = {"hier", (int)strlen(lay->nodes), 300, env, -1};
  int rc = bt_run_ranks_manual(&o, body_joined, &k, NULL);
  if (rc) fprintf(stderr, "hier layout %s failed\n", lay->name);
  return rc;
}

static int has_hier(void) {
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++)
    if (!strcmp(names[b], "hier")) return 1;
  return 0;
}

/* ---------------------------------------------------------------- conformance */

static int test_matrix(void) {
  if (!has_hier()) return 0;
  static const size_t small[] = {0, 1, 7};
  static const size_t big[] = {1000003};
  static const size_t qbig[] = {100003};
  matrix ms = {small, 3, 1, 0};
  matrix mb = {bt_quick() ? qbig : big, 1, 0, 0};
  for (size_t i = 0; i < BT_COUNT(layouts); i++)
    if (run_layout(&layouts[i], bt_coll_matrix_body, &ms, NULL, NULL) ||
        run_layout(&layouts[i], bt_coll_matrix_body, &mb, NULL, NULL))
      return 1;
  return 0;
}

/* Split: a child inside one node is shm, a child across nodes is hier. */
static int body_split(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  static const size_t counts[] = {1, 7, 5000};
  matrix m = {counts, 3, 0, 0};
  braid_comm *child = NULL;
  BT_CHECK_OK(braid_split(c, (uint32_t)(rank % 2), (uint32_t)rank, &child), c);
  BT_CHECK(child != NULL, "no child");
  if (bt_coll_matrix_body(child, braid_rank(child), braid_world_size(child), &m)) return 1;
  BT_CHECK_OK(braid_barrier(child), child);
  BT_CHECK_OK(braid_destroy(child), NULL);
  (void)n;
  return 0;
}

static int test_split(void) {
  if (!has_hier()) return 0;
  for (size_t i = 0; i < BT_COUNT(layouts); i++)
    if (run_layout(&layouts[i], body_split, NULL, NULL, NULL)) return 1;
  return 0;
}

/* ---------------------------------------------------------------- point to point */

/* Ring exchange of small and large messages, inside and across nodes, and
   every rank to every rank with several tags in order. */
static int body_p2p(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  static const size_t sizes[] = {1, 5000, 1u << 20};
  for (size_t si = 0; si < BT_COUNT(sizes); si++) {
    size_t cnt = sizes[si];
    uint32_t *s = malloc(cnt * 4), *r = malloc(cnt * 4);
    BT_CHECK(s && r, "oom");
    for (size_t i = 0; i < cnt; i++) s[i] = (uint32_t)(rank * 7919 + i);
    int right = (rank + 1) % n, left = (rank + n - 1) % n;
    BT_CHECK_OK(braid_recv(c, r, cnt, BRAID_U32, left, 5), c);
    BT_CHECK_OK(braid_send(c, s, cnt, BRAID_U32, right, 5), c);
    BT_CHECK_OK(braid_sync(c), c);
    for (size_t i = 0; i < cnt; i++) BT_CHECK(r[i] == (uint32_t)(left * 7919 + i), "size %zu element %zu", cnt, i);
    free(s);
    free(r);
  }
  int *got = calloc((size_t)n * 3, sizeof *got), *mine = malloc(sizeof *mine * (size_t)n * 3);
  BT_CHECK(got && mine, "oom");
  for (int t = 0; t < 3; t++)
    for (int q = 0; q < n; q++) {
      mine[t * n + q] = rank * 100 + q * 10 + t;
      BT_CHECK_OK(braid_recv(c, &got[t * n + q], 1, BRAID_I32, q, 9), c);
      BT_CHECK_OK(braid_send(c, &mine[t * n + q], 1, BRAID_I32, q, 9), c);
    }
  BT_CHECK_OK(braid_sync(c), c);
  for (int t = 0; t < 3; t++)
    for (int q = 0; q < n; q++)
      BT_CHECK(got[t * n + q] == q * 100 + rank * 10 + t, "message %d from rank %d out of order", t, q);
  free(got);
  free(mine);
  /* A shape mismatch names hier's ranks. */
  if (n >= 2) {
    double d[3] = {1, 2, 3};
    if (rank == 0) BT_CHECK_OK(braid_send(c, d, 3, BRAID_F64, n - 1, 11), c);
    if (rank == 0) BT_CHECK_OK(braid_sync(c), c);
    if (rank == n - 1) {
      BT_CHECK_OK(braid_barrier(c), c);
      BT_CHECK_ST(braid_recv(c, d, 2, BRAID_F64, 0, 11), BRAID_ERR_MISMATCH, c);
      BT_CHECK_MSG(c, "message from rank 0 with tag 11 has 3 elements of f64");
      BT_CHECK_OK(braid_recv(c, d, 3, BRAID_F64, 0, 11), c);
      BT_CHECK_OK(braid_sync(c), c);
    } else {
      BT_CHECK_OK(braid_barrier(c), c);
    }
  }
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

static int test_p2p(void) {
  if (!has_hier()) return 0;
  for (size_t i = 0; i < BT_COUNT(layouts); i++)
    if (run_layout(&layouts[i], body_p2p, NULL, NULL, NULL)) return 1;
  return 0;
}

/* Receives of the wrong shape between nodes: the part that carries them
   keeps the sentences, and hier's sync reports them all. */
static int test_p2p_mismatch(void) {
  if (!has_hier()) return 0;
  static const layout apart = {"1+1", "ab"};
  bt_p2p_mismatch_arg s = {3, 1u << 20}, l = {200000, 1u << 20};
  return run_layout(&apart, bt_body_p2p_mismatch, &s, NULL, NULL) ||
         run_layout(&apart, bt_body_p2p_mismatch, &l, NULL, NULL);
}

/* ---------------------------------------------------------------- failures */

/* One rank (rank 1, or with arg the last one, which then stays a while so
   the others cannot learn of it from its leaving) uses another op. */
static int body_mismatch(braid_comm *c, int rank, int n, void *arg) {
  const int odd = arg ? n - 1 : 1;
  float x[64] = {0};
  BT_CHECK_OK(braid_all_reduce(c, x, 64, BRAID_F32, BRAID_SUM), c);
  double t0 = now_s();
  braid_status st = braid_all_reduce(c, x, 64, BRAID_F32, rank == odd ? BRAID_MAX : BRAID_SUM);
  if (st == BRAID_OK) st = braid_barrier(c);
  BT_CHECK(st == BRAID_ERR_MISMATCH, "rank %d got %s: %s", rank, braid_status_string(st), braid_last_error(c));
  BT_CHECK(now_s() - t0 < 10.0, "noticed after %.2f s", now_s() - t0);
  if (arg && rank == odd) usleep(3000000);
  return 0;
}

/* The last rank makes another rooted call (another root, or reduce for
   gather). The generic algorithms' messages then wait unreceived in the
   parts' queues, or nobody sends at all while ranks wait for each other:
   every rank still returns MISMATCH, promptly. */
static int body_mismatch_rooted(braid_comm *c, int rank, int n, void *arg) {
  const int kind = *(const int *)arg, odd = rank == n - 1;
  float x[64] = {0}, y[64 * 8];
  BT_CHECK_OK(braid_all_reduce(c, x, 64, BRAID_F32, BRAID_SUM), c);
  double t0 = now_s();
  braid_status st;
  switch (kind) {
    case 0: st = braid_gather(c, x, y, 64, BRAID_F32, odd ? 1 : 0); break;
    case 1: st = braid_scatter(c, y, x, 64, BRAID_F32, odd ? 1 : 0); break;
    case 2: st = braid_reduce(c, x, y, 64, BRAID_F32, BRAID_SUM, odd ? 1 : 0); break;
    default:
      st = odd ? braid_reduce(c, x, y, 64, BRAID_F32, BRAID_SUM, 0) : braid_gather(c, x, y, 64, BRAID_F32, 0);
      break;
  }
  if (st == BRAID_OK) st = braid_barrier(c);
  BT_CHECK(st == BRAID_ERR_MISMATCH, "case %d: rank %d got %s: %s", kind, rank, braid_status_string(st),
           braid_last_error(c));
  BT_CHECK(now_s() - t0 < 10.0, "case %d: noticed after %.2f s", kind, now_s() - t0);
  return 0;
}

static int test_call_check(void) {
  if (!has_hier()) return 0;
  static const char *const env[] = {"BRAID_TIMEOUT=60", NULL};
  static int last = 1;
  if (run_layout(&layouts[0], body_mismatch, NULL, env, NULL) || run_layout(&layouts[2], body_mismatch, NULL, env, NULL) ||
      run_layout(&layouts[0], body_mismatch, &last, env, NULL) || run_layout(&layouts[1], body_mismatch, &last, env, NULL))
    return 1;
  for (int kind = 0; kind < 4; kind++)
    for (int l = 0; l < 2; l++)
      if (run_layout(&layouts[l], body_mismatch_rooted, &kind, env, NULL)) {
        fprintf(stderr, "hier: rooted mismatch %d, layout %s\n", kind, layouts[l].name);
        return 1;
      }
  return 0;
}

/* Rank 3 (on node b) dies in the middle of all-reduces: every rank on
   every node fails with PEER_LOST within a few seconds. */
static int body_kill(braid_comm *c, int rank, int n, void *arg) {
  (void)arg, (void)n;
  size_t cnt = 1 << 16;
  float *x = calloc(cnt, 4);
  BT_CHECK(x != NULL, "oom");
  for (int it = 0; it < 1000; it++) {
    if (rank == 3 && it == 3) raise(SIGKILL);
    double t0 = now_s();
    braid_status st = braid_all_reduce(c, x, it % 2 ? cnt : 5, BRAID_F32, BRAID_SUM);
    if (st == BRAID_OK) continue;
    BT_CHECK(st == BRAID_ERR_PEER_LOST, "rank %d got %s: %s", rank, braid_status_string(st), braid_last_error(c));
    BT_CHECK(now_s() - t0 < 5.0, "rank %d noticed after %.2f s", rank, now_s() - t0);
    free(x);
    return 0;
  }
  BT_CHECK(0, "rank %d never noticed", rank);
  return 1;
}

/* braid_destroy with receives nobody sends (from every other rank: in the
   node part and between nodes) waits BRAID_DESTROY_TIMEOUT (1 s here) for
   them, and the parts then share as long again, as tcp takes as long again
   to finish a frame: 2 s, not 1 s per part on top. On a child spanning the
   nodes (hier again). */
static int body_destroy_pending(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  braid_comm *child = NULL;
  BT_CHECK_OK(braid_split(c, 0, (uint32_t)rank, &child), c);
  BT_CHECK(!strcmp(braid_backend(child), "hier"), "the child is %s", braid_backend(child));
  float v[16][4];
  for (int q = 0; q < n && q < 16; q++)
    if (q != rank) BT_CHECK_OK(braid_recv(child, v[q], 4, BRAID_F32, q, 99), child);
  double t0 = now_s();
  BT_CHECK_OK(braid_destroy(child), NULL);
  const double dt = now_s() - t0;
  BT_CHECK(dt < 2.6, "braid_destroy took %.2f s with BRAID_DESTROY_TIMEOUT=1", dt);
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

static int test_destroy_budget(void) {
  if (!has_hier()) return 0;
  static const char *const env[] = {"BRAID_DESTROY_TIMEOUT=1", "BRAID_TIMEOUT=30", NULL};
  return run_layout(&layouts[0], body_destroy_pending, NULL, env, NULL) ||
         run_layout(&layouts[1], body_destroy_pending, NULL, env, NULL);
}

static int test_peer_lost(void) {
  if (!has_hier()) return 0;
  static const char *const env[] = {"BRAID_TIMEOUT=100", NULL};
  hcase k = {&layouts[0], body_kill, NULL, NULL};
  bt_run_opts o = {"hier", 4, 60, env, 3};
  bt_rank_result res[4];
  bt_run_ranks_manual(&o, body_joined, &k, res);
  for (int r = 0; r < 3; r++)
    BT_CHECK(res[r].exited && res[r].code == 0, "rank %d did not get PEER_LOST in time", r);
  return 0;
}

/* A part that waits long enough for the call check's slow path still
   names hier's call when its own wait then fails: on one node (hier runs
   its node part alone), the last rank dies 1 s into an all-reduce (the
   check looks after 0.1 s). */
static int body_late_death(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  float x[5] = {0};
  BT_CHECK_OK(braid_all_reduce(c, x, 5, BRAID_F32, BRAID_SUM), c);
  if (rank == n - 1) {
    usleep(1000000);
    raise(SIGKILL);
  }
  braid_status st = braid_all_reduce(c, x, 5, BRAID_F32, BRAID_SUM);
  const char *e = braid_last_error(c);
  BT_CHECK(st == BRAID_ERR_PEER_LOST, "rank %d got %s: %s", rank, braid_status_string(st), e);
  BT_CHECK(!strstr(e, "(null)") && !strstr(e, "braid: "), "rank %d's sentence lost the call's name: %s", rank, e);
  BT_CHECK(strstr(e, "died during braid_all_reduce"), "rank %d's sentence does not name the call: %s", rank, e);
  return 0;
}

static int test_late_death(void) {
  if (!has_hier()) return 0;
  static const layout one_node = {"one node", "aaa"};
  static const char *const env[] = {"BRAID_TIMEOUT=30", NULL};
  hcase k = {&one_node, body_late_death, NULL, "hier"};
  bt_run_opts o = {"hier", 3, 60, env, 2};
  bt_rank_result res[3];
  bt_run_ranks_manual(&o, body_joined, &k, res);
  for (int r = 0; r < 2; r++) BT_CHECK(res[r].exited && res[r].code == 0, "rank %d failed its checks", r);
  return 0;
}

/* ---------------------------------------------------------------- auto */

static int body_auto(braid_comm *c, int rank, int n, void *arg) {
  (void)rank, (void)n;
  const char *want = arg;
  BT_CHECK(!strcmp(braid_backend(c), want), "auto chose %s, expected %s", braid_backend(c), want);
  float x = 1;
  BT_CHECK_OK(braid_all_reduce(c, &x, 1, BRAID_F32, BRAID_SUM), c);
  BT_CHECK(x == (float)n, "sum %g", x);
  return 0;
}

static int test_auto(void) {
  if (!has_hier()) return 0;
  static const layout one = {"one node", "aaaa"};
  return run_layout(&layouts[0], body_auto, "hier", NULL, "auto") ||
         run_layout(&one, body_auto, "shm", NULL, "auto");
}

/* A send queued on the flat part must leave while its rank waits in
   another part's call: rank 0 sends 1 MiB to rank 2 (another node, more
   than tcp sends eagerly) and enters an all-reduce, which needs rank 2;
   rank 2 first waits for the message. */
static int body_progress(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  const size_t cnt = 1 << 18;
  int32_t *m = malloc(cnt * sizeof *m), x = rank;
  BT_CHECK(m, "malloc");
  for (size_t i = 0; i < cnt; i++) m[i] = rank == 0 ? (int32_t)i : -1;
  if (rank == 0) BT_CHECK_OK(braid_send(c, m, cnt, BRAID_I32, 2, 4), c);
  if (rank == 2) {
    BT_CHECK_OK(braid_recv(c, m, cnt, BRAID_I32, 0, 4), c);
    BT_CHECK_OK(braid_sync(c), c);
    for (size_t i = 0; i < cnt; i++) BT_CHECK(m[i] == (int32_t)i, "message [%zu] = %d", i, m[i]);
  }
  BT_CHECK_OK(braid_all_reduce(c, &x, 1, BRAID_I32, BRAID_SUM), c);
  BT_CHECK(x == n * (n - 1) / 2, "sum %d", x);
  BT_CHECK_OK(braid_sync(c), c);
  free(m);
  return 0;
}

static int test_progress(void) {
  if (!has_hier()) return 0;
  const char *env[] = {"BRAID_TIMEOUT=20", NULL};
  return run_layout(&layouts[0], body_progress, NULL, env, NULL);
}

/* A part backend hier cannot use is refused at init, naming the choices;
   nccl is a choice inside a node only. */
static int body_bad_part(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused, (void)n, (void)arg;
  char id[2] = {layouts[0].nodes[rank], 0};
  setenv("BRAID_NODE_ID", id, 1);
  setenv("BRAID_BACKEND", "hier", 1);
  braid_comm *c = NULL;
  BT_CHECK(braid_init(NULL, &c) == BRAID_ERR_INVALID_ARG, "init with BRAID_HIER_INTER=nccl succeeded");
  const char *e = braid_last_error(NULL);
  BT_CHECK(strstr(e, "BRAID_HIER_INTER=\"nccl\"") && strstr(e, "(shm, tcp)"), "sentence: %s", e);
  return 0;
}

static int test_bad_part(void) {
  if (!has_hier()) return 0;
  const char *env[] = {"BRAID_HIER_INTER=nccl", NULL};
  bt_run_opts o = {"hier", 4, 60, env, -1};
  return bt_run_ranks_manual(&o, body_bad_part, NULL, NULL);
}

/* BRAID_ALGO=<call>=native asks for hier's own call: its parts (tcp between
   nodes, which has none) pick their own, rather than the start failing. */
static int test_native_across_nodes(void) {
  if (!has_hier()) return 0;
  static const layout two = {"2x2", "aabb"};
  static const size_t counts[] = {1, 7, 5000};
  matrix m = {counts, 3, 0, 0};
  const char *env[] = {"BRAID_ALGO=allreduce=native,broadcast=native", NULL};
  return run_layout(&two, bt_coll_matrix_body, &m, env, NULL);
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      {"matrix", test_matrix, 900},
      {"split", test_split, 300},
      {"p2p", test_p2p, 300},
      {"p2p_mismatch", test_p2p_mismatch, 120},
      {"call_check", test_call_check, 300},
      {"destroy_budget", test_destroy_budget, 120},
      {"peer_lost", test_peer_lost, 120},
      {"late_death", test_late_death, 120},
      {"auto", test_auto, 120},
      {"bad_part", test_bad_part, 60},
      {"progress", test_progress, 120},
      {"native_across_nodes", test_native_across_nodes, 120},
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
