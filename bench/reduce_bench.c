/* Reduction kernel micro-benchmark: braid__reduce against memcpy and a plain
   c[i] = a[i] + b[i] loop compiled here, at a DRAM-sized and an L2-sized
   buffer, single thread.

   usage: reduce_bench [--reps N] [--big BYTES] [--small BYTES] [--isa auto|all]

   Each row is timed N times in a row (the state of caches and memory
   settles as in a loop of calls), and the whole table is run in 3 passes, so
   a disturbance during one pass does not decide a row; each row shows its
   best sample. "moved" counts every byte read or written ((nsrc + 1)
   buffers); the ratios compare moved bytes per second, so "vs c=a+b" for the
   two-input f32 sum is simply baseline time / braid time, against the faster
   of the two baseline builds. Not a test: nothing fails on timing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/reduce.h"

#define MAXSRC 8

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The baseline the kernels are held to: what the compiler makes of the
   obvious loop (this file is built with -O3 so it is vectorized), once for
   the base ISA and once for AVX2 where the CPU has it; the faster one counts. */
#define BASE_ADD_BODY \
  for (size_t i = 0; i < n; i++) c[i] = a[i] + b[i];
__attribute__((noinline)) static void base_add(float *restrict c, const float *restrict a, const float *restrict b,
                                               size_t n) {
  BASE_ADD_BODY
}
#if defined(__x86_64__)
#define HAVE_BASE_AVX2 1
__attribute__((noinline, target("avx2"))) static void base_add_avx2(float *restrict c, const float *restrict a,
                                                                    const float *restrict b, size_t n) {
  BASE_ADD_BODY
}
#endif

typedef struct {
  int kind; /* 0 braid, 1 memcpy, 2 baseline, 3 baseline built for AVX2 */
  void *dst;
  const void *srcs[MAXSRC];
  int nsrc;
  size_t count, bytes;
  braid_dtype dt;
  braid_op op;
} job;

static void run_job(const job *j) {
  switch (j->kind) {
    case 1: memcpy(j->dst, j->srcs[0], j->bytes); break;
    case 2: base_add((float *)j->dst, (const float *)j->srcs[0], (const float *)j->srcs[1], j->count); break;
#ifdef HAVE_BASE_AVX2
    case 3: base_add_avx2((float *)j->dst, (const float *)j->srcs[0], (const float *)j->srcs[1], j->count); break;
#endif
    default: braid__reduce(j->dst, j->srcs, j->nsrc, j->count, j->dt, j->op, j->nsrc); break;
  }
}

/* Calls per timed sample: enough for about 2 ms, so small buffers are timed
   warm in cache and the clock's resolution does not matter. */
static int calibrate(const job *j) {
  run_job(j); /* warm: page faults, caches, ISA detection */
  double t0 = now_s();
  run_job(j);
  double one = now_s() - t0;
  return one < 2e-3 ? (int)(2e-3 / (one > 1e-7 ? one : 1e-7)) + 1 : 1;
}

static void *xalloc(size_t bytes) {
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) {
    fprintf(stderr, "reduce_bench: cannot allocate %zu bytes\n", bytes);
    exit(1);
  }
  return p;
}

static size_t dsize(braid_dtype dt) {
  switch (dt) {
    case BRAID_F64: case BRAID_I64: return 8;
    case BRAID_F16: case BRAID_BF16: return 2;
    default: return 4;
  }
}

/* Ordinary finite values (no NaN or subnormal inputs). */
static void fill(void *p, size_t count, braid_dtype dt, int seed) {
  for (size_t i = 0; i < count; i++) {
    float v = 1.0f + (float)((i * 7 + (size_t)seed * 13) % 1000) * 0.001f;
    switch (dt) {
      case BRAID_F64: { double d = v; memcpy((char *)p + 8 * i, &d, 8); break; }
      case BRAID_F16: { uint16_t h = braid__f32_to_f16(v); memcpy((char *)p + 2 * i, &h, 2); break; }
      case BRAID_BF16: { uint16_t h = braid__f32_to_bf16(v); memcpy((char *)p + 2 * i, &h, 2); break; }
      case BRAID_I32: { int32_t x = (int32_t)(i * 3 + (size_t)seed); memcpy((char *)p + 4 * i, &x, 4); break; }
      default: memcpy((char *)p + 4 * i, &v, 4); break;
    }
  }
}

static void fmt_size(char *buf, size_t n, size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
    snprintf(buf, n, "%zu MiB", bytes >> 20);
  else
    snprintf(buf, n, "%zu KiB", bytes >> 10);
}

typedef struct {
  const char *name;
  braid_dtype dt;
  braid_op op;
  int nsrc;
  int no_nt; /* non-temporal stores disabled */
} kdef;

static const kdef KERNELS[] = {
    {"f32 sum", BRAID_F32, BRAID_SUM, 2, 0},     {"f32 sum no-nt", BRAID_F32, BRAID_SUM, 2, 1},
    {"f16 sum", BRAID_F16, BRAID_SUM, 2, 0},     {"bf16 sum", BRAID_BF16, BRAID_SUM, 2, 0},
    {"f64 sum", BRAID_F64, BRAID_SUM, 2, 0},     {"i32 sum", BRAID_I32, BRAID_SUM, 2, 0},
    {"f32 max", BRAID_F32, BRAID_MAX, 2, 0},     {"f32 sum x8", BRAID_F32, BRAID_SUM, 8, 0},
};

/* One line of the table. */
typedef struct {
  const char *name;
  char isa[16];
  const char *set_isa; /* kernel set to force; NULL: not a braid row */
  size_t nt;           /* streaming threshold during the row */
  int nsrc;            /* for the moved-bytes count (memcpy: 1) */
  job j;
  int inner;
  double best;
} rowdef;

enum { MAXROWS = 40, NBUF = 16, PASSES = 3 };

static void print_row(const char *size, const rowdef *r, size_t bytes, double memcpy_rate, double base_rate) {
  char setb[32];
  double t = r->best;
  fmt_size(setb, sizeof setb, (size_t)(r->nsrc + 1) * bytes);
  double moved = (double)bytes * (r->nsrc + 1) / t;
  printf("%-8s %-13s %-7s %4d %9s %10.1f %9.2f %10.2f %9.2f", size, r->name, r->isa, r->nsrc, setb, t * 1e6,
         (double)bytes / t / 1e9, moved / 1e9, moved / memcpy_rate);
  if (r->j.kind == 1)
    printf(" %9s\n", "-");
  else
    printf(" %9.2f\n", moved / base_rate);
}

static void apply(const rowdef *r) {
  if (!r->set_isa) return;
  braid__reduce_set_isa(r->set_isa);
  braid__reduce_set_nt_threshold(r->nt);
}

int main(int argc, char **argv) {
  int reps = 5, all_isas = 1;
  size_t sizes[2] = {64u << 20, 256u << 10};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--big") && i + 1 < argc)
      sizes[0] = (size_t)strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--small") && i + 1 < argc)
      sizes[1] = (size_t)strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--isa") && i + 1 < argc)
      all_isas = !strcmp(argv[++i], "all");
    else {
      fprintf(stderr, "usage: %s [--reps N] [--big BYTES] [--small BYTES] [--isa auto|all]\n", argv[0]);
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  size_t maxb = sizes[0] > sizes[1] ? sizes[0] : sizes[1];
  /* inputs: 8 f32 (sum, max, 8 sources), then 2 each of f16, bf16, f64, i32 */
  unsigned char *buf[NBUF], *dst = xalloc(maxb);
  for (int k = 0; k < NBUF; k++) buf[k] = xalloc(maxb);
  memset(dst, 0, maxb);

  braid__reduce_set_isa(NULL);
  const char *auto_isa = braid__reduce_isa();
  size_t nt_default = braid__reduce_set_nt_threshold(SIZE_MAX);
  braid__reduce_set_nt_threshold(nt_default);
  printf("reduce_bench: automatic kernel set %s; best of %d passes x %d runs; sizes are per buffer, "
         "set = all buffers touched\n",
         auto_isa, PASSES, reps);
  printf("%-8s %-13s %-7s %4s %9s %10s %9s %10s %9s %9s\n", "size", "kernel", "isa", "nsrc", "set", "time us",
         "out GB/s", "moved GB/s", "vs memcpy", "vs c=a+b");

  static const char *const isas[] = {"scalar", "avx2", "avx512"};
  static const braid_dtype other[4] = {BRAID_F16, BRAID_BF16, BRAID_F64, BRAID_I32};
  static rowdef rows[MAXROWS];
  for (int si = 0; si < 2; si++) {
    size_t bytes = sizes[si];
    char sz[32];
    fmt_size(sz, sizeof sz, bytes);
    for (int k = 0; k < 8; k++) fill(buf[k], bytes / 4, BRAID_F32, k);
    for (int o = 0; o < 4; o++)
      for (int k = 0; k < 2; k++) fill(buf[8 + 2 * o + k], bytes / dsize(other[o]), other[o], k);

    int nrows = 0;
    memset(rows, 0, sizeof rows);
    rowdef *r = &rows[nrows++];
    r->name = "memcpy", strcpy(r->isa, "-"), r->nsrc = 1;
    r->j.kind = 1, r->j.dst = dst, r->j.srcs[0] = buf[0], r->j.bytes = bytes;
    r = &rows[nrows++];
    r->name = "c=a+b f32", strcpy(r->isa, "plain"), r->nsrc = 2;
    r->j.kind = 2, r->j.dst = dst, r->j.srcs[0] = buf[0], r->j.srcs[1] = buf[1], r->j.count = bytes / 4;
#ifdef HAVE_BASE_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
      rows[nrows] = rows[nrows - 1];
      r = &rows[nrows++];
      strcpy(r->isa, "p-avx2"), r->j.kind = 3;
    }
#endif
    for (size_t ki = 0; ki < sizeof KERNELS / sizeof KERNELS[0]; ki++) {
      const kdef *kd = &KERNELS[ki];
      int first = 0; /* the dtype's first input buffer */
      for (int o = 0; o < 4; o++)
        if (kd->dt == other[o]) first = 8 + 2 * o;
      for (int ii = 0; ii < 3 && nrows < MAXROWS; ii++) {
        int is_auto = !strcmp(isas[ii], auto_isa);
        if (!all_isas && !is_auto) continue;
        if (braid__reduce_set_isa(isas[ii]) != 0) continue;
        r = &rows[nrows++];
        r->name = kd->name, r->set_isa = isas[ii], r->nsrc = kd->nsrc;
        snprintf(r->isa, sizeof r->isa, "%s%s", isas[ii], is_auto ? "*" : "");
        r->nt = kd->no_nt ? SIZE_MAX : nt_default;
        r->j.kind = 0, r->j.dst = dst, r->j.nsrc = kd->nsrc, r->j.count = bytes / dsize(kd->dt);
        r->j.dt = kd->dt, r->j.op = kd->op;
        for (int k = 0; k < kd->nsrc; k++) r->j.srcs[k] = buf[first + k];
      }
    }

    for (int i = 0; i < nrows; i++) {
      apply(&rows[i]);
      rows[i].inner = calibrate(&rows[i].j);
      rows[i].best = 1e30;
    }
    for (int pass = 0; pass < PASSES; pass++)
      for (int i = 0; i < nrows; i++) {
        r = &rows[i];
        apply(r);
        for (int rep = 0; rep < reps; rep++) {
          double t0 = now_s();
          for (int k = 0; k < r->inner; k++) run_job(&r->j);
          double t = (now_s() - t0) / r->inner;
          if (t < r->best) r->best = t;
        }
      }
    braid__reduce_set_isa(NULL);
    braid__reduce_set_nt_threshold(nt_default);

    double memcpy_rate = 2.0 * (double)bytes / rows[0].best;
    double tb = rows[1].best;
    if (rows[2].j.kind == 3 && rows[2].best < tb) tb = rows[2].best;
    double base_rate = 3.0 * (double)bytes / tb;
    for (int i = 0; i < nrows; i++) print_row(sz, &rows[i], bytes, memcpy_rate, base_rate);
  }
  printf("* = the automatic choice; plain / p-avx2 = the c[i] = a[i] + b[i] loop built for the base ISA / AVX2.\n"
         "Outputs are streamed (non-temporal stores) when the set reaches %zu MiB; no-nt = never.\n"
         "moved GB/s = (nsrc + 1) * size / time; the ratios compare moved GB/s (vs c=a+b: the faster build).\n",
         nt_default >> 20);
  for (int k = 0; k < NBUF; k++) free(buf[k]);
  free(dst);
  return 0;
}
