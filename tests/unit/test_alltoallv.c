/* braid_all_to_allv on every backend: uneven exchanges of a
   mixture-of-experts shape (large and empty blocks, rendezvous sizes), one
   rank receiving everything, ranks with nothing to send or receive, in
   place; and count matrices the ranks disagree on, which every rank reports
   as BRAID_ERR_MISMATCH naming the pair and both counts, promptly. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coll_check.h"
#include "harness.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Elements rank i sends rank j in shape s: 0 tokens routed to experts
   (uneven, a third of the pairs empty, some of them large), 1 everything to
   rank 0, 2 rank 1 (if any) sends and receives nothing, 3 every pair
   160-320 KB (shm's staged rounds with pieces of uneven blocks). */
static size_t count_of(int s, int i, int j, int n) {
  unsigned long long st = (unsigned long long)(s * 4099 + i * 64 + j), h = bt_rand(&st);
  switch (s) {
  case 0: return h % 3 == 0 ? 0 : h % 5 == 0 ? 100000 + (size_t)(h % 300000) : (size_t)(h % 2000);
  case 1: return j == 0 ? 50000 + (size_t)i * 1000 : 0;
  case 2: return (n > 1 && (i == 1 || j == 1)) ? 0 : 3000 + (size_t)(h % 40000);
  default: return 40000 + (size_t)(h % 40000);
  }
}

static int32_t value(int i, int j, size_t k) { return (int32_t)(i * 1000003 + j * 7919 + (int)k); }

static int shapes_body(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  size_t *sc = calloc(4 * (size_t)n, sizeof(size_t)), *sd = sc + n, *rc = sd + n, *rd = rc + n;
  BT_CHECK(sc != NULL, "out of memory");
  for (int s = 0; s < 4; s++)
    for (int inplace = 0; inplace < 2; inplace++) {
      if (inplace && s == 1) continue; /* in place the counts are symmetric */
      size_t st = 0, rt = 0;
      for (int j = 0; j < n; j++) {
        sc[j] = inplace ? count_of(s, rank < j ? rank : j, rank < j ? j : rank, n) : count_of(s, rank, j, n);
        rc[j] = inplace ? sc[j] : count_of(s, j, rank, n);
        sd[n - 1 - j] = 0; /* send blocks in reverse order below */
        rd[j] = rt, rt += rc[j];
      }
      for (int j = n - 1; j >= 0; j--) sd[j] = st, st += sc[j];
      int32_t *sb = malloc((st + 1) * sizeof *sb), *rb = malloc((rt + 1) * sizeof *rb);
      BT_CHECK(sb && rb, "out of memory");
      memset(rb, 0xCD, (rt + 1) * sizeof *rb);
      int32_t *src = inplace ? rb : sb;
      for (int j = 0; j < n; j++)
        for (size_t k = 0; k < sc[j]; k++) src[(inplace ? rd[j] : sd[j]) + k] = value(rank, j, k);
      BT_CHECK_OK(braid_all_to_allv(c, src, inplace ? NULL : sc, inplace ? NULL : sd, rb, rc, rd, BRAID_I32), c);
      BT_CHECK_OK(braid_sync(c), c);
      for (int j = 0; j < n; j++)
        for (size_t k = 0; k < rc[j]; k++)
          BT_CHECK(rb[rd[j] + k] == value(j, rank, k), "shape %d inplace %d: element %zu from rank %d", s, inplace, k, j);
      BT_CHECK(rb[rt] == (int32_t)0xCDCDCDCD, "written past the end");
      free(sb);
      free(rb);
    }
  free(sc);
  return 0;
}

static int test_shapes(void) {
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++)
    for (int n = 1; n <= (maxr[b] < 6 ? maxr[b] : 6); n++) {
      if (bt_quick() && n != 1 && n != 4) continue;
      if (bt_run_ranks(names[b], n, 300, shapes_body, NULL)) {
        fprintf(stderr, "alltoallv: backend %s, %d ranks failed\n", names[b], n);
        return 1;
      }
    }
  /* shm without single copy stages the blocks in rounds (a small staging
     space: many rounds, each round's space reused). */
  static const char *const nocma[] = {"BRAID_SHM_CMA=0", "BRAID_SHM_BUFFER=64K", NULL};
  for (int n = 2; n <= 5; n++) {
    bt_run_opts o = {"shm", n, 300, nocma, -1};
    if ((!bt_quick() || n == 3) && bt_run_ranks_ex(&o, shapes_body, NULL, NULL)) {
      fprintf(stderr, "alltoallv: backend shm without single copy, %d ranks failed\n", n);
      return 1;
    }
  }
  /* Each path of blocks above the slots alone (by default rank 0 times both). */
  static const char *const staged[] = {"BRAID_SHM_A2A=staged", NULL}, *const single[] = {"BRAID_SHM_A2A=single", NULL};
  const char *const *paths[] = {staged, single};
  for (int m = 0; m < 2; m++)
    for (int n = 2; n <= 4; n++) {
      bt_run_opts o = {"shm", n, 300, paths[m], -1};
      if ((!bt_quick() || n == 3) && bt_run_ranks_ex(&o, shapes_body, NULL, NULL)) {
        fprintf(stderr, "alltoallv: backend shm with %s, %d ranks failed\n", paths[m][0], n);
        return 1;
      }
    }
  return 0;
}

static int test_interleaved(void) {
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++)
    for (int n = 2; n <= 4 && n <= maxr[b]; n++) {
      if (bt_quick() && n != 3) continue;
      if (bt_run_ranks(names[b], n, 120, bt_a2av_interleaved, NULL)) {
        fprintf(stderr, "alltoallv interleaved: backend %s, %d ranks failed\n", names[b], n);
        return 1;
      }
    }
  return 0;
}

/* Rank `liar` sends `says` elements to rank 0, which expects `expects`. */
typedef struct lie {
  size_t says, expects;
  int liar;
} lie;

static int mismatch_body(braid_comm *c, int rank, int n, void *arg) {
  const lie *l = arg;
  size_t sc[8], sd[8], rc[8], rd[8];
  float buf[256] = {0}, out[256];
  for (int j = 0; j < n; j++) {
    sc[j] = rc[j] = 10, sd[j] = rd[j] = (size_t)j * 20;
    if (rank == l->liar && j == 0) sc[j] = l->says;
    if (rank == 0 && j == l->liar) rc[j] = l->expects;
  }
  double t0 = now_s();
  braid_status st = braid_all_to_allv(c, buf, sc, sd, out, rc, rd, BRAID_F32);
  if (st == BRAID_OK) st = braid_barrier(c); /* a rank that waited for nothing learns at its next call */
  BT_CHECK(now_s() - t0 < 10, "noticed after %.1f s", now_s() - t0);
  /* Rank 0 finds the mismatch; the others learn it from its failure notice,
     or, on tcp and hier, may find rank 0 gone instead (a failed
     communicator takes no new connections): an error either way. */
  BT_CHECK(st == BRAID_ERR_MISMATCH || (rank != 0 && st == BRAID_ERR_PEER_LOST), "rank %d got %s: %s", rank,
           braid_status_string(st), braid_last_error(c));
  if (st == BRAID_ERR_PEER_LOST) return 0;
  char want[200];
  BT_CHECK_MSG(c, "braid_all_to_allv");
  snprintf(want, sizeof want, "rank %d sends %zu elements of f32 to rank 0 where rank 0 expects %zu from it",
           l->liar, l->says, l->expects);
  BT_CHECK_MSG(c, want);
  BT_CHECK_ST(braid_all_to_allv(c, buf, sc, sd, out, rc, rd, BRAID_F32), BRAID_ERR_MISMATCH, c);
  BT_CHECK_MSG(c, "communicator failed earlier");
  return 0;
}

static int test_mismatched_counts(void) {
  static const lie lies[] = {{12, 10, 1}, {0, 5, 2}, {5, 0, 1}};
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++)
    for (size_t i = 0; i < BT_COUNT(lies); i++)
      for (int n = 2; n <= 4 && n <= maxr[b]; n++) {
        if (lies[i].liar >= n) continue;
        static const char *const env[] = {"BRAID_TIMEOUT=60", NULL};
        bt_run_opts o = {names[b], n, 60, env, -1};
        if (bt_run_ranks_ex(&o, mismatch_body, (void *)&lies[i], NULL)) {
          fprintf(stderr, "alltoallv mismatch (rank %d says %zu, rank 0 expects %zu): backend %s, %d ranks failed\n",
                  lies[i].liar, lies[i].says, lies[i].expects, names[b], n);
          return 1;
        }
      }
  return 0;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      {"shapes", test_shapes, 900},
      {"mismatched_counts", test_mismatched_counts, 600},
      {"interleaved", test_interleaved, 600},
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
