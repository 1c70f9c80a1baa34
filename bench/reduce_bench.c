/* Reduction kernel micro-benchmark: braid__reduce against memcpy and a plain
   c[i] = a[i] + b[i] loop compiled here, at a DRAM-sized and an L2-sized
   buffer, best of N runs, single thread.

   usage: reduce_bench [--reps N] [--big BYTES] [--small BYTES] [--isa auto|all]

   "moved" counts every byte read or written ((nsrc + 1) buffers); the ratios
   compare moved bytes per second, so "vs c=a+b" for the two-input f32 sum is
   simply baseline time / braid time, against the faster of the two baseline
   builds. */
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
#define BASE_ADD_BODY                                                           \
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

/* Best time of one call: each sample repeats the call until it lasts about
   2 ms, so small buffers are timed warm in cache. */
static double best_time(const job *j, int reps) {
  run_job(j); /* warm: page faults, caches, ISA detection */
  int inner = 1;
  double t0 = now_s();
  run_job(j);
  double one = now_s() - t0;
  if (one < 2e-3) inner = (int)(2e-3 / (one > 1e-7 ? one : 1e-7)) + 1;
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    t0 = now_s();
    for (int k = 0; k < inner; k++) run_job(j);
    double t = (now_s() - t0) / inner;
    if (t < best) best = t;
  }
  return best;
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

static void row(const char *size, const char *name, const char *isa, int nsrc, size_t set, double t, size_t out_bytes,
                double moved_rate_memcpy, double moved_rate_base) {
  char setb[32];
  fmt_size(setb, sizeof setb, set);
  double moved = (double)out_bytes * (nsrc + 1) / t;
  printf("%-8s %-13s %-7s %4d %9s %10.1f %9.2f %10.2f", size, name, isa, nsrc, setb, t * 1e6,
         (double)out_bytes / t / 1e9, moved / 1e9);
  if (moved_rate_memcpy > 0)
    printf(" %9.2f", moved / moved_rate_memcpy);
  else
    printf(" %9s", "-");
  if (moved_rate_base > 0)
    printf(" %9.2f", moved / moved_rate_base);
  else
    printf(" %9s", "-");
  printf("\n");
}

int main(int argc, char **argv) {
  int reps = 10, all_isas = 1;
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
  unsigned char *src[MAXSRC], *dst = xalloc(maxb);
  for (int k = 0; k < MAXSRC; k++) src[k] = xalloc(maxb);
  memset(dst, 0, maxb);

  braid__reduce_set_isa(NULL);
  const char *auto_isa = braid__reduce_isa();
  size_t nt_default = braid__reduce_set_nt_threshold(SIZE_MAX);
  braid__reduce_set_nt_threshold(nt_default);
  printf("reduce_bench: automatic kernel set %s; best of %d; sizes are per buffer, set = all buffers touched\n",
         auto_isa, reps);
  printf("%-8s %-13s %-7s %4s %9s %10s %9s %10s %9s %9s\n", "size", "kernel", "isa", "nsrc", "set", "time us",
         "out GB/s", "moved GB/s", "vs memcpy", "vs c=a+b");

  static const char *const isas[] = {"scalar", "avx2", "avx512"};
  for (int si = 0; si < 2; si++) {
    size_t bytes = sizes[si];
    char sz[32];
    fmt_size(sz, sizeof sz, bytes);
    job j;
    memset(&j, 0, sizeof j);

    /* memcpy and the baseline loop */
    fill(src[0], bytes / 4, BRAID_F32, 0);
    fill(src[1], bytes / 4, BRAID_F32, 1);
    j.kind = 1, j.dst = dst, j.srcs[0] = src[0], j.bytes = bytes;
    double tm = best_time(&j, reps);
    double memcpy_rate = 2.0 * (double)bytes / tm;
    row(sz, "memcpy", "-", 1, 2 * bytes, tm, bytes, memcpy_rate, 0);
    j.kind = 2, j.srcs[1] = src[1], j.count = bytes / 4;
    double tb = best_time(&j, reps);
#ifdef HAVE_BASE_AVX2
    double tb2 = 0;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
      j.kind = 3;
      tb2 = best_time(&j, reps);
    }
    double base_rate = 3.0 * (double)bytes / (tb2 > 0 && tb2 < tb ? tb2 : tb);
    row(sz, "c=a+b f32", "plain", 2, 3 * bytes, tb, bytes, memcpy_rate, base_rate);
    if (tb2 > 0) row(sz, "c=a+b f32", "p-avx2", 2, 3 * bytes, tb2, bytes, memcpy_rate, base_rate);
#else
    double base_rate = 3.0 * (double)bytes / tb;
    row(sz, "c=a+b f32", "plain", 2, 3 * bytes, tb, bytes, memcpy_rate, base_rate);
#endif

    for (size_t ki = 0; ki < sizeof KERNELS / sizeof KERNELS[0]; ki++) {
      const kdef *kd = &KERNELS[ki];
      size_t count = bytes / dsize(kd->dt);
      for (int k = 0; k < kd->nsrc; k++) fill(src[k], count, kd->dt, k);
      memset(&j, 0, sizeof j);
      j.kind = 0, j.dst = dst, j.nsrc = kd->nsrc, j.count = count, j.dt = kd->dt, j.op = kd->op;
      for (int k = 0; k < kd->nsrc; k++) j.srcs[k] = src[k];
      for (int ii = 0; ii < 3; ii++) {
        int is_auto = !strcmp(isas[ii], auto_isa);
        if (!all_isas && !is_auto) continue;
        if (braid__reduce_set_isa(isas[ii]) != 0) continue;
        char isa[16];
        snprintf(isa, sizeof isa, "%s%s", isas[ii], is_auto ? "*" : "");
        size_t nt_prev = braid__reduce_set_nt_threshold(kd->no_nt ? SIZE_MAX : nt_default);
        double t = best_time(&j, reps);
        braid__reduce_set_nt_threshold(nt_prev);
        row(sz, kd->name, isa, kd->nsrc, (size_t)(kd->nsrc + 1) * bytes, t, bytes, memcpy_rate, base_rate);
      }
      braid__reduce_set_isa(NULL);
    }
  }
  printf("* = the automatic choice; plain / p-avx2 = the c[i] = a[i] + b[i] loop built for the base ISA / AVX2.\n"
         "Outputs are streamed (non-temporal stores) when the set reaches %zu MiB; no-nt = never.\n",
         nt_default >> 20);
  printf("moved GB/s = (nsrc + 1) * size / time; the ratios compare moved GB/s (vs c=a+b: the faster build).\n");
  for (int k = 0; k < MAXSRC; k++) free(src[k]);
  free(dst);
  return 0;
}
