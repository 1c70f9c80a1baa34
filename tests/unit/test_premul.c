/* Scaled sums (braid_op_premul_sum) against an f64 reference: every rank's
   input times the scalar, summed, for f32, f16 and bf16, through
   all-reduce, reduce-scatter and reduce, on every backend, with the native
   collectives and each generic algorithm. The inputs are exact in the dtype
   and their scaled sums exact in f32, so the f32 result is the reference
   itself and the f16 / bf16 results are the reference rounded once (ties
   to even); a product or partial sum rounded to the dtype on the way would
   show in some element. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* x rounded to nearest (ties to even) in a binary format with E exponent
   and M mantissa bits, as bits; x is finite and in range. */
static uint32_t enc_rne(double x, int E, int M) {
  const int bias = (1 << (E - 1)) - 1;
  uint32_t sign = signbit(x) ? 1u << (E + M) : 0;
  double a = fabs(x);
  if (a == 0) return sign;
  int e;
  (void)frexp(a, &e);
  int ue = e - 1;
  if (ue < 1 - bias) return sign | (uint32_t)nearbyint(ldexp(a, M - (1 - bias))); /* subnormal */
  uint32_t q = (uint32_t)nearbyint(ldexp(a, M - ue));
  if (q == (2u << M)) q >>= 1, ue++;
  return sign | (uint32_t)(ue + bias) << M | (q & ((1u << M) - 1));
}

static double dec(braid_dtype dt, const unsigned char *p) {
  if (dt == BRAID_F32) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p, 2);
  int E = dt == BRAID_F16 ? 5 : 8, M = dt == BRAID_F16 ? 10 : 7, bias = (1 << (E - 1)) - 1;
  int ef = (h >> M) & ((1 << E) - 1), mf = h & ((1 << M) - 1);
  double v = ef ? ldexp(mf | (1 << M), ef - bias - M) : ldexp(mf, 1 - bias - M);
  return h >> 15 ? -v : v;
}

static void enc(braid_dtype dt, double x, unsigned char *p) {
  if (dt == BRAID_F32) {
    float f = (float)x;
    memcpy(p, &f, 4);
    return;
  }
  uint16_t h = (uint16_t)(dt == BRAID_F16 ? enc_rne(x, 5, 10) : enc_rne(x, 8, 7));
  memcpy(p, &h, 2);
}

/* Input element i of rank r: k * 2^e with |k| < 128 and e in -3..3, exact
   in every dtype here. */
static double xin(int r, size_t i) {
  unsigned long long s = (unsigned long long)r * 1000003u + i + 7;
  unsigned long long h = bt_rand(&s);
  return ldexp((double)((int64_t)(h % 255) - 127), (int)((h >> 16) % 7) - 3);
}

static const double SCALARS[] = {0.75, 3, -0.5, 0x1p-10, 5};

typedef struct pcase {
  int coll; /* 0 all-reduce, 1 reduce-scatter, 2 reduce */
  braid_dtype dt;
  size_t count;
} pcase;

static int one(braid_comm *c, int rank, int n, const pcase *k, double scalar) {
  const size_t es = braid_dtype_size(k->dt), cnt = k->count, in = k->coll == 1 ? cnt * (size_t)n : cnt;
  const int root = n - 1;
  unsigned char s[4], *buf = malloc(in * es + 1), *out = malloc(cnt * es + 1);
  BT_CHECK(buf && out, "out of memory");
  enc(k->dt, scalar, s);
  BT_CHECK(dec(k->dt, s) == scalar, "test bug: scalar %g not exact", scalar);
  braid_op op;
  BT_CHECK_OK(braid_op_premul_sum(c, s, k->dt, &op), c);
  for (size_t i = 0; i < in; i++) enc(k->dt, xin(rank, i), buf + i * es);
  memset(out, 0xEE, cnt * es);
  braid_status st = k->coll == 0   ? braid_all_reduce(c, buf, cnt, k->dt, op)
                    : k->coll == 1 ? braid_reduce_scatter(c, buf, out, cnt, k->dt, op)
                                   : braid_reduce(c, buf, out, cnt, k->dt, op, root);
  BT_CHECK(st == BRAID_OK, "%s", braid_last_error(c));
  BT_CHECK_OK(braid_sync(c), c);
  const unsigned char *got = k->coll == 0 ? buf : out;
  if (k->coll != 2 || rank == root)
    for (size_t i = 0; i < cnt; i++) {
      size_t g = k->coll == 1 ? (size_t)rank * cnt + i : i;
      /* exact in f64 (and in f32); from the first term, so an all -0 sum stays -0 */
      double ref = scalar * xin(0, g);
      for (int r = 1; r < n; r++) ref += scalar * xin(r, g);
      unsigned char want[4];
      enc(k->dt, ref, want);
      BT_CHECK(!memcmp(got + i * es, want, es), "%s %s n=%d scalar %g: element %zu is %.9g, the reference %.9g rounds to %.9g",
               k->coll == 0 ? "all-reduce" : k->coll == 1 ? "reduce-scatter" : "reduce", braid_dtype_name(k->dt), n,
               scalar, i, dec(k->dt, got + i * es), ref, dec(k->dt, want));
    }
  BT_CHECK_OK(braid_op_destroy(c, op), c);
  free(buf);
  free(out);
  return 0;
}

static int body(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  static const braid_dtype dts[] = {BRAID_F32, BRAID_F16, BRAID_BF16};
  static const size_t counts[] = {1, 1000, 70001};
  for (size_t ci = 0; ci < BT_COUNT(counts); ci++)
    for (size_t di = 0; di < BT_COUNT(dts); di++)
      for (int coll = 0; coll < 3; coll++) {
        pcase k = {coll, dts[di], counts[ci]};
        if (one(c, rank, n, &k, SCALARS[(ci + di + (size_t)coll) % BT_COUNT(SCALARS)])) return 1;
      }
  return 0;
}

static int test_exact_vs_f64(void) {
  static const char *const rounds[] = {
      NULL,
      "BRAID_ALGO=allreduce=ring,reduce_scatter=ring,reduce=tree",
      "BRAID_ALGO=allreduce=rhd,reduce_scatter=rhd,reduce=chain",
      "BRAID_ALGO=allreduce=rd,reduce_scatter=ring,reduce=ring",
  };
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++)
    for (size_t ri = 0; ri < BT_COUNT(rounds); ri++)
      for (int n = 1; n <= (maxr[b] < 5 ? maxr[b] : 5); n++) {
        if (bt_quick() && n != 1 && n != 3) continue;
        const char *env[] = {rounds[ri], NULL};
        bt_run_opts o = {names[b], n, 300, rounds[ri] ? env : NULL, -1};
        if (bt_run_ranks_ex(&o, body, NULL, NULL)) {
          fprintf(stderr, "premul: backend %s, %d ranks, %s failed\n", names[b], n, rounds[ri] ? rounds[ri] : "native");
          return 1;
        }
      }
  return 0;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {{"exact_vs_f64", test_exact_vs_f64, 1200}};
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
