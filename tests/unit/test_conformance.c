/* The generic collective algorithms (src/algos) on every backend's
   point-to-point path: BRAID_ALGO forces each algorithm in turn, and the
   conformance matrix (dtypes x ops x counts {0, 1, 7, 1000003} x world sizes
   1-9 x roots x in place / out of place, all-to-allv count patterns and
   scaled sums, and again on split children) must give the exact results,
   untouched guards and send buffers, and bitwise-identical results on every
   rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/algos.h"
#include "coll_check.h"
#include "core/desc.h"
#include "harness.h"


static const int kinds[] = {BRAID__COLL_ALL_REDUCE, BRAID__COLL_BROADCAST, BRAID__COLL_ALL_GATHER,
                            BRAID__COLL_REDUCE_SCATTER, BRAID__COLL_BARRIER,  BRAID__COLL_REDUCE,
                            BRAID__COLL_GATHER,     BRAID__COLL_SCATTER,   BRAID__COLL_ALL_TO_ALL,
                            BRAID__COLL_ALL_TO_ALLV};

/* The generic algorithms of kind, in code order. */
static int algos_of(int kind, int *out) {
  int n = 0;
  for (int a = BRAID__ALGO_NATIVE + 1; a < BRAID__ALGO_COUNT; a++)
    if (braid__algo_supports(kind, a)) out[n++] = a;
  return n;
}

/* BRAID_ALGO for the i-th round: algorithm i (wrapping) of every collective. */
static int round_spec(int i, char *spec, size_t len) {
  size_t o = 0;
  int rounds = 0;
  spec[0] = 0;
  for (size_t k = 0; k < BT_COUNT(kinds); k++) {
    int list[BRAID__ALGO_COUNT];
    int n = algos_of(kinds[k], list);
    if (!n) continue;
    if (n > rounds) rounds = n;
    int w = snprintf(spec + o, len - o, "%s%s=%s", o ? "," : "", braid__coll_short_name(kinds[k]),
                     braid__algo_name(list[i % n]));
    if (w > 0) o += (size_t)w;
  }
  return rounds;
}

typedef struct conf {
  matrix m;
  int split; /* also on the children of a split by parity */
} conf;

static int body(braid_comm *c, int rank, int n, void *arg) {
  const conf *k = arg;
  if (bt_coll_matrix_body(c, rank, n, (void *)&k->m)) return 1;
  if (bt_coll_matrix_more(c, rank, n, (void *)&k->m)) return 1;
  BT_CHECK_OK(braid_barrier(c), c);
  if (!k->split) return 0;
  braid_comm *child = NULL;
  /* Reversed keys: the child's ranks run opposite to the parent's. */
  BT_CHECK_OK(braid_split(c, (uint32_t)(rank % 2), (uint32_t)(n - rank), &child), c);
  BT_CHECK(child != NULL, "no child");
  int cn = braid_world_size(child), cr = braid_rank(child);
  BT_CHECK(cn == (n + 1 - rank % 2) / 2, "child size %d", cn);
  if (bt_coll_matrix_body(child, cr, cn, (void *)&k->m)) return 1;
  if (bt_coll_matrix_more(child, cr, cn, (void *)&k->m)) return 1;
  BT_CHECK_OK(braid_barrier(child), child);
  BT_CHECK_OK(braid_destroy(child), NULL);
  return 0;
}

/* Runs the matrix on every multi-rank backend with every round of forced
   algorithms, for the world sizes given. */
static int run_rounds(const conf *k, const int *sizes, int nsizes) {
  const char *names[8];
  int maxr[8];
  int nb = bt_backends(names, maxr, 8);
  char spec[256], envalgo[300];
  int rounds = round_spec(0, spec, sizeof spec);
  for (int b = 0; b < nb; b++)
    for (int i = 0; i < rounds; i++) {
      round_spec(i, spec, sizeof spec);
      snprintf(envalgo, sizeof envalgo, "BRAID_ALGO=%s", spec);
      const char *env[] = {envalgo, NULL};
      for (int si = 0; si < nsizes; si++) {
        if (sizes[si] > maxr[b]) continue;
        bt_run_opts o = {names[b], sizes[si], bt_quick() ? 600 : 300, env, -1};
        if (bt_run_ranks_ex(&o, body, (void *)k, NULL)) {
          fprintf(stderr, "conformance: backend %s, %d ranks, %s failed\n", names[b], sizes[si], envalgo);
          return 1;
        }
      }
    }
  return 0;
}

static int test_small_counts(void) {
  static const size_t counts[] = {0, 1, 7};
  conf k = {{counts, 3, 1, 0}, 0};
  static const int sizes[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  static const int qsizes[] = {1, 2, 3, 5, 8};
  return bt_quick() ? run_rounds(&k, qsizes, 5) : run_rounds(&k, sizes, 9);
}

static int test_large_count(void) {
  static const size_t counts[] = {1000003};
  static const size_t qcounts[] = {100003};
  conf k = {{bt_quick() ? qcounts : counts, 1, 0, 0}, 0};
  static const int sizes[] = {1, 2, 3, 4, 5, 7, 9};
  static const int qsizes[] = {2, 3};
  return bt_quick() ? run_rounds(&k, qsizes, 2) : run_rounds(&k, sizes, 7);
}

static int test_split_children(void) {
  static const size_t counts[] = {1, 7, 5000};
  conf k = {{counts, 3, 0, 0}, 1};
  static const int sizes[] = {3, 4, 5, 9};
  return run_rounds(&k, sizes, bt_quick() ? 2 : 4);
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      {"small_counts", test_small_counts, 1200},
      {"large_count", test_large_count, 1200},
      {"split_children", test_split_children, 600},
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
