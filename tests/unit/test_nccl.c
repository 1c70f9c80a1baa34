/* The nccl backend. Without a GPU (CI) it runs against the host-memory test
   double of NCCL and the CUDA runtime (tests/nccl_double), which checks the
   backend's own logic: loading, bootstrap, every call on "device" buffers,
   grouped sends and receives and their pairing check, stream/event
   ordering, the call check, asynchronous errors, timeouts, abort, split
   and memory. With BRAID_TEST_NCCL_REAL=1 the same cases run on the real
   libraries and GPU (cases that inject failures into the double are
   skipped there); without one, the GPU case says why it skipped. */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <sys/mount.h>
#include <unistd.h>

#include "backends/nccl/nccl_decl.h"
#include "core/reduce.h"
#include "harness.h"

/* ---------------------------------------------------------------- libraries */

static int real_mode(void) {
  const char *v = getenv("BRAID_TEST_NCCL_REAL");
  return v && *v == '1';
}

static const char *double_path(void) {
  static char p[4096];
  const char *bin = getenv("BRAID_TEST_BINDIR");
  snprintf(p, sizeof p, "%s/tests/nccl_double/libbraid_nccl_double.so", bin ? bin : ".");
  return p;
}

static char env_nccl[4200], env_cudart[4200];

/* The library pair every rank uses (braid opens them by these names). */
static int libs_ready(void) {
  if (real_mode()) {
    snprintf(env_nccl, sizeof env_nccl, "BRAID_NCCL_LIB=%s", getenv("BRAID_NCCL_LIB") ? getenv("BRAID_NCCL_LIB") : "libnccl.so.2");
    snprintf(env_cudart, sizeof env_cudart, "BRAID_CUDART_LIB=%s",
             getenv("BRAID_CUDART_LIB") ? getenv("BRAID_CUDART_LIB") : "libcudart.so");
    return 1;
  }
  if (access(double_path(), R_OK) != 0) {
    printf("  skipped: the NCCL test double %s was not built\n", double_path());
    return 0;
  }
  snprintf(env_nccl, sizeof env_nccl, "BRAID_NCCL_LIB=%s", double_path());
  snprintf(env_cudart, sizeof env_cudart, "BRAID_CUDART_LIB=%s", double_path());
  return 1;
}

/* The CUDA calls the tests make themselves, from the library braid opens. */
static struct {
  cudaError_t (*malloc_)(void **, size_t);
  cudaError_t (*free_)(void *);
  cudaError_t (*memcpy_)(void *, const void *, size_t, enum cudaMemcpyKind);
  cudaError_t (*stream_create)(cudaStream_t *, unsigned);
  cudaError_t (*stream_destroy)(cudaStream_t);
  cudaError_t (*stream_sync)(cudaStream_t);
  cudaError_t (*host_func)(cudaStream_t, cudaHostFn_t, void *);
  cudaError_t (*memcpy_async)(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
  cudaError_t (*device_count)(int *);
} cu;

static int cu_load(void) {
  const char *path = strchr(env_cudart, '=') + 1;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) return 0;
  *(void **)&cu.malloc_ = dlsym(h, "cudaMalloc");
  *(void **)&cu.free_ = dlsym(h, "cudaFree");
  *(void **)&cu.memcpy_ = dlsym(h, "cudaMemcpy");
  *(void **)&cu.stream_create = dlsym(h, "cudaStreamCreateWithFlags");
  *(void **)&cu.stream_destroy = dlsym(h, "cudaStreamDestroy");
  *(void **)&cu.stream_sync = dlsym(h, "cudaStreamSynchronize");
  *(void **)&cu.host_func = dlsym(h, "cudaLaunchHostFunc");
  *(void **)&cu.memcpy_async = dlsym(h, "cudaMemcpyAsync");
  *(void **)&cu.device_count = dlsym(h, "cudaGetDeviceCount");
  return cu.malloc_ && cu.free_ && cu.memcpy_ && cu.stream_create && cu.stream_destroy && cu.stream_sync &&
         cu.host_func && cu.memcpy_async && cu.device_count;
}

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  return cu.malloc_(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}
/* A copy from pageable memory may return before it lands, and the
   communication stream does not wait for the default stream: the copy is
   finished before braid reads the buffer, as docs/NCCL.md asks of callers. */
static int h2d(void *d, const void *h, size_t n) {
  return cu.memcpy_(d, h, n, cudaMemcpyHostToDevice) == cudaSuccess && cu.stream_sync(NULL) == cudaSuccess;
}
static int d2h(void *h, const void *d, size_t n) { return cu.memcpy_(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess; }

/* Runs body on n ranks of backend nccl with the libraries and extra
   variables (NULL-terminated); manual: the body calls braid_init. */
static int run_env(int n, double timeout, const char *const *extra, bt_body body, void *arg, int manual,
                   bt_rank_result *res) {
  const char *env[16];
  int k = 0;
  env[k++] = env_nccl;
  env[k++] = env_cudart;
  for (int i = 0; extra && extra[i] && k < 15; i++) env[k++] = extra[i];
  env[k] = NULL;
  bt_run_opts o = {"nccl", n, timeout, env, -1};
  return manual ? bt_run_ranks_manual(&o, body, arg, res) : bt_run_ranks_ex(&o, body, arg, res);
}

/* GPUs visible, counted in a child: the CUDA runtime must not be initialized
   in the process that forks the ranks. */
static int gpus(void) {
  static int count = -1;
  if (count >= 0) return count;
  pid_t p = fork();
  if (p == 0) {
    int k = 0;
    _exit(cu_load() && cu.device_count(&k) == cudaSuccess ? (k > 100 ? 100 : k) : 0);
  }
  int ws = 0;
  count = p > 0 && waitpid(p, &ws, 0) == p && WIFEXITED(ws) ? WEXITSTATUS(ws) : 0;
  return count;
}

/* On the real libraries NCCL wants one GPU per rank: a case runs with as
   many ranks as it asks for and the machine has GPUs (at least one). */
static int fit(int n) {
  if (!real_mode()) return n;
  int g = gpus();
  return g < 1 ? 1 : g < n ? g : n;
}

/* A case that needs n ranks skips, saying why, where the GPUs are fewer. */
static int too_few_gpus(int n) {
  if (!real_mode() || gpus() >= n) return 0;
  printf("  skipped: this case needs %d ranks, one per GPU, and %d GPU(s) are visible\n", n, gpus());
  return 1;
}

/* Cases that inject failures through the test double skip on the real libraries. */
static int injects_failures(void) {
  if (!real_mode()) return 0;
  printf("  skipped on the real libraries: the case injects failures through the test double\n");
  return 1;
}

/* Every body first loads the CUDA calls it makes (after the fork). */
#define NEED_CUDA() BT_CHECK(cu_load(), "could not open %s", strchr(env_cudart, '=') + 1)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---------------------------------------------------------------- refusals at init */

static int body_init_refused(braid_comm *c, int rank, int n, void *arg) {
  (void)c, (void)rank, (void)n;
  const char *want = arg;
  braid_comm *comm = NULL;
  braid_status st = braid_init(NULL, &comm);
  BT_CHECK(st == BRAID_ERR_UNSUPPORTED, "braid_init gave %s: %s", braid_status_string(st), braid_last_error(NULL));
  BT_CHECK(comm == NULL, "a communicator came out of a refused init");
  BT_CHECK_MSG(NULL, want);
  BT_CHECK_MSG(NULL, "braid_init");
  BT_CHECK_MSG(NULL, "(rank 0)");
  return 0;
}

/* Library, driver, device: each missing piece is named. */
static int test_missing_pieces(void) {
  if (!libs_ready()) return BT_SKIP;
  bt_run_opts o = {"nccl", 1, 30, NULL, -1};
  const char *env1[] = {"BRAID_NCCL_LIB=/nonexistent/libnccl.so.2", env_cudart, NULL};
  o.env = env1;
  if (bt_run_ranks_manual(&o, body_init_refused, "library missing: NCCL", NULL)) return 1;
  const char *env2[] = {env_nccl, "BRAID_CUDART_LIB=/nonexistent/libcudart.so", NULL};
  o.env = env2;
  if (bt_run_ranks_manual(&o, body_init_refused, "library missing: the CUDA runtime", NULL)) return 1;
  if (real_mode()) return 0;
  const char *env3[] = {env_nccl, env_cudart, "BRAID_NCCL_DOUBLE_DEVICES=0", NULL};
  o.env = env3;
  if (bt_run_ranks_manual(&o, body_init_refused, "device missing", NULL)) return 1;
  const char *env4[] = {env_nccl, env_cudart, "BRAID_NCCL_DOUBLE_NO_DRIVER=1", NULL};
  o.env = env4;
  return bt_run_ranks_manual(&o, body_init_refused, "driver", NULL);
}

/* The toolkit's real libraries on a machine without a GPU: refused with the
   reason, never a crash. */
static int test_real_libraries_without_gpu(void) {
  const char *nccl = "/usr/local/cuda/lib64/libnccl.so.2", *rt = "/usr/local/cuda/lib64/libcudart.so";
  if (access(nccl, R_OK) || access(rt, R_OK)) {
    printf("  skipped: no CUDA toolkit libraries under /usr/local/cuda/lib64\n");
    return BT_SKIP;
  }
  static char e1[300], e2[300];
  snprintf(e1, sizeof e1, "BRAID_NCCL_LIB=%s", nccl);
  snprintf(e2, sizeof e2, "BRAID_CUDART_LIB=%s", rt);
  snprintf(env_cudart, sizeof env_cudart, "%s", e2);
  if (!cu_load()) {
    printf("  skipped: %s cannot be opened here\n", rt);
    return BT_SKIP;
  }
  int ndev = 0;
  if (cu.device_count(&ndev) == cudaSuccess && ndev > 0) {
    printf("  skipped: this machine has a GPU (the GPU cases run with BRAID_TEST_NCCL_REAL=1)\n");
    return BT_SKIP;
  }
  const char *env[] = {e1, e2, NULL};
  bt_run_opts o = {"nccl", 1, 30, env, -1};
  /* No driver on a machine without a GPU; a driver without a device elsewhere. */
  return bt_run_ranks_manual(&o, body_init_refused, "missing", NULL);
}

static int body_algo_refused(braid_comm *c, int rank, int n, void *arg) {
  (void)c, (void)rank, (void)n, (void)arg;
  braid_comm *comm = NULL;
  braid_status st = braid_init(NULL, &comm);
  BT_CHECK(st == BRAID_ERR_INVALID_ARG, "braid_init gave %s: %s", braid_status_string(st), braid_last_error(NULL));
  BT_CHECK_MSG(NULL, "device memory");
  return 0;
}

static int test_generic_algorithms_refused(void) {
  if (!libs_ready()) return BT_SKIP;
  const char *extra[] = {"BRAID_ALGO=allreduce=ring", NULL};
  return run_env(fit(2), 30, extra, body_algo_refused, NULL, 1, NULL);
}

/* ---------------------------------------------------------------- collectives */

static float fin(int r, size_t i) { return (float)((r + 1) * (int)(i % 13) - 5); }

static int body_collectives(braid_comm *c, int rank, int n, void *arg) {
  const char *backend = arg ? arg : "nccl";
  NEED_CUDA();
  BT_CHECK(!strcmp(braid_backend(c), backend), "backend %s, want %s", braid_backend(c), backend);
  BT_CHECK(braid_has_stream_sync(c), "nccl has a communication stream");
  const size_t counts[] = {1, 7, 100003};
  for (size_t ci = 0; ci < BT_COUNT(counts); ci++) {
    const size_t cnt = counts[ci], tot = cnt * (size_t)n;
    float *h = malloc(sizeof(float) * tot), *g = malloc(sizeof(float) * tot);
    float *d = dev_alloc(sizeof(float) * tot), *d2 = dev_alloc(sizeof(float) * tot);
    BT_CHECK(h && g && d && d2, "allocation");
    /* all-reduce: sum, max, avg (f32) */
    const braid_op ops[] = {BRAID_SUM, BRAID_MAX, BRAID_MIN, BRAID_AVG, BRAID_PROD};
    for (size_t oi = 0; oi < BT_COUNT(ops); oi++) {
      for (size_t i = 0; i < cnt; i++) h[i] = fin(rank, i);
      BT_CHECK(h2d(d, h, cnt * 4), "h2d");
      BT_CHECK_OK(braid_all_reduce(c, d, cnt, BRAID_F32, ops[oi]), c);
      BT_CHECK_OK(braid_sync(c), c);
      BT_CHECK(d2h(g, d, cnt * 4), "d2h");
      for (size_t i = 0; i < cnt; i++) {
        double want = ops[oi] == BRAID_PROD ? 1 : ops[oi] == BRAID_MAX ? -1e30 : ops[oi] == BRAID_MIN ? 1e30 : 0;
        for (int r = 0; r < n; r++) {
          double x = fin(r, i);
          if (ops[oi] == BRAID_PROD) want *= x;
          else if (ops[oi] == BRAID_MAX) want = x > want ? x : want;
          else if (ops[oi] == BRAID_MIN) want = x < want ? x : want;
          else want += x;
        }
        if (ops[oi] == BRAID_AVG) want /= n;
        BT_CHECK(fabs(g[i] - want) <= 1e-5 * fabs(want) + 1e-6, "all-reduce %s count %zu [%zu]: %g, want %g",
                 braid_op_name(ops[oi]), cnt, i, g[i], want);
      }
    }
    /* broadcast of a dtype NCCL lacks (u16 travels as bytes), root n-1 */
    uint16_t *hs = (uint16_t *)h, *gs = (uint16_t *)g;
    for (size_t i = 0; i < cnt; i++) hs[i] = (uint16_t)(rank == n - 1 ? i * 3 + 1 : 0);
    BT_CHECK(h2d(d, hs, cnt * 2), "h2d");
    BT_CHECK_OK(braid_broadcast(c, d, cnt, BRAID_U16, n - 1), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(d2h(gs, d, cnt * 2), "d2h");
    for (size_t i = 0; i < cnt; i++) BT_CHECK(gs[i] == (uint16_t)(i * 3 + 1), "broadcast [%zu] = %u", i, gs[i]);
    /* all-gather out of place and in place */
    for (int inplace = 0; inplace < 2; inplace++) {
      for (size_t i = 0; i < cnt; i++) h[i] = fin(rank, i);
      const float *src = inplace ? d2 + (size_t)rank * cnt : d;
      BT_CHECK(h2d((void *)src, h, cnt * 4), "h2d");
      BT_CHECK_OK(braid_all_gather(c, src, d2, cnt, BRAID_F32), c);
      BT_CHECK_OK(braid_sync(c), c);
      BT_CHECK(d2h(g, d2, tot * 4), "d2h");
      for (int r = 0; r < n; r++)
        for (size_t i = 0; i < cnt; i++)
          BT_CHECK(g[(size_t)r * cnt + i] == fin(r, i), "all-gather (in place %d) block %d [%zu]", inplace, r, i);
    }
    /* reduce-scatter: rank r gets reduced block r (not r+1) */
    for (size_t i = 0; i < tot; i++) h[i] = fin(rank, i);
    BT_CHECK(h2d(d, h, tot * 4), "h2d");
    BT_CHECK_OK(braid_reduce_scatter(c, d, d2, cnt, BRAID_F32, BRAID_SUM), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(d2h(g, d2, cnt * 4), "d2h");
    for (size_t i = 0; i < cnt; i++) {
      double want = 0;
      for (int r = 0; r < n; r++) want += fin(r, (size_t)rank * cnt + i);
      BT_CHECK(g[i] == (float)want, "reduce-scatter [%zu]: %g, want %g", i, g[i], want);
    }
    BT_CHECK(d2h(g, d, tot * 4), "d2h");
    for (size_t i = 0; i < tot; i++) BT_CHECK(g[i] == fin(rank, i), "reduce-scatter wrote its send buffer");
    /* reduce to root 0 */
    for (size_t i = 0; i < cnt; i++) h[i] = fin(rank, i);
    BT_CHECK(h2d(d, h, cnt * 4), "h2d");
    BT_CHECK_OK(braid_reduce(c, d, d2, cnt, BRAID_F32, BRAID_SUM, 0), c);
    BT_CHECK_OK(braid_sync(c), c);
    if (rank == 0) {
      BT_CHECK(d2h(g, d2, cnt * 4), "d2h");
      for (size_t i = 0; i < cnt; i++) {
        double want = 0;
        for (int r = 0; r < n; r++) want += fin(r, i);
        BT_CHECK(g[i] == (float)want, "reduce [%zu]", i);
      }
    }
    /* gather to root n-1, scatter from root 0 */
    BT_CHECK_OK(braid_gather(c, d, d2, cnt, BRAID_F32, n - 1), c);
    BT_CHECK_OK(braid_sync(c), c);
    if (rank == n - 1) {
      BT_CHECK(d2h(g, d2, tot * 4), "d2h");
      for (int r = 0; r < n; r++)
        for (size_t i = 0; i < cnt; i++) BT_CHECK(g[(size_t)r * cnt + i] == fin(r, i), "gather %d [%zu]", r, i);
    }
    for (size_t i = 0; i < tot; i++) h[i] = (float)(i * 2 + 1);
    if (rank == 0) BT_CHECK(h2d(d2, h, tot * 4), "h2d");
    BT_CHECK_OK(braid_scatter(c, d2, d, cnt, BRAID_F32, 0), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(d2h(g, d, cnt * 4), "d2h");
    for (size_t i = 0; i < cnt; i++) BT_CHECK(g[i] == (float)(((size_t)rank * cnt + i) * 2 + 1), "scatter [%zu]", i);
    /* all-to-all, out of place and in place: block j of rank i lands as block i of rank j */
    for (int inplace = 0; inplace < 2; inplace++) {
      for (int j = 0; j < n; j++)
        for (size_t i = 0; i < cnt; i++) h[(size_t)j * cnt + i] = (float)(rank * 1000 + j * 10) + (float)(i % 10);
      BT_CHECK(h2d(d, h, tot * 4), "h2d");
      float *out = inplace ? d : d2;
      BT_CHECK_OK(braid_all_to_all(c, d, out, cnt, BRAID_F32), c);
      BT_CHECK_OK(braid_sync(c), c);
      BT_CHECK(d2h(g, out, tot * 4), "d2h");
      for (int j = 0; j < n; j++)
        for (size_t i = 0; i < cnt; i++)
          BT_CHECK(g[(size_t)j * cnt + i] == (float)(j * 1000 + rank * 10) + (float)(i % 10),
                   "all-to-all (in place %d) block %d [%zu]", inplace, j, i);
    }
    free(h);
    free(g);
    cu.free_(d);
    cu.free_(d2);
  }
  /* all-to-allv: rank i sends j+1 elements to rank j */
  size_t sc[8], sd[8], rc[8], rd[8], so = 0, ro = 0;
  for (int j = 0; j < n; j++) {
    sc[j] = (size_t)j + 1, sd[j] = so, so += sc[j];
    rc[j] = (size_t)rank + 1, rd[j] = ro, ro += rc[j];
  }
  int32_t hv[64], gv[64];
  for (size_t i = 0; i < so; i++) hv[i] = rank * 100 + (int32_t)i;
  int32_t *dv = dev_alloc(so * 4), *dw = dev_alloc(ro * 4);
  BT_CHECK(dv && dw && h2d(dv, hv, so * 4), "h2d");
  BT_CHECK_OK(braid_all_to_allv(c, dv, sc, sd, dw, rc, rd, BRAID_I32), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(d2h(gv, dw, ro * 4), "d2h");
  for (int j = 0; j < n; j++)
    for (size_t k = 0; k < rc[j]; k++) {
      /* rank j's block for me starts at its displacement sum_{q<rank}(q+1) */
      int32_t want = j * 100 + (int32_t)((size_t)rank * (size_t)(rank + 1) / 2 + k);
      BT_CHECK(gv[rd[j] + k] == want, "all-to-allv from %d [%zu]: %d, want %d", j, k, gv[rd[j] + k], want);
    }
  cu.free_(dv);
  cu.free_(dw);
  /* complex sum (pairs of f32), integers, scaled sum */
  float cz[4] = {1.5f, -2.0f, (float)rank, 1.0f}, cg[4];
  float *dz = dev_alloc(sizeof cz);
  BT_CHECK(dz && h2d(dz, cz, sizeof cz), "h2d");
  BT_CHECK_OK(braid_all_reduce(c, dz, 2, BRAID_C64, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(d2h(cg, dz, sizeof cg), "d2h");
  BT_CHECK(cg[0] == 1.5f * n && cg[1] == -2.0f * n && cg[2] == (float)(n * (n - 1) / 2) && cg[3] == (float)n,
           "complex sum: %g %g %g %g", cg[0], cg[1], cg[2], cg[3]);
  float scalar = 0.5f;
  braid_op pm;
  BT_CHECK_OK(braid_op_premul_sum(c, &scalar, BRAID_F32, &pm), c);
  float px[3] = {2, 4, (float)rank * 2}, pg[3];
  BT_CHECK(h2d(dz, px, sizeof px), "h2d");
  BT_CHECK_OK(braid_all_reduce(c, dz, 3, BRAID_F32, pm), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(d2h(pg, dz, sizeof pg), "d2h");
  BT_CHECK(pg[0] == (float)n && pg[1] == 2.0f * n && pg[2] == (float)(n * (n - 1) / 2), "scaled sum: %g %g %g",
           pg[0], pg[1], pg[2]);
  BT_CHECK_OK(braid_op_destroy(c, pm), c);
  int64_t iv[2] = {rank, -rank}, ig[2];
  BT_CHECK(h2d(dz, iv, sizeof iv), "h2d");
  BT_CHECK_OK(braid_all_reduce(c, dz, 2, BRAID_I64, BRAID_MAX), c);
  BT_CHECK_OK(braid_barrier(c), c); /* implies the sync */
  BT_CHECK(d2h(ig, dz, sizeof ig), "d2h");
  BT_CHECK(ig[0] == n - 1 && ig[1] == 0, "i64 max: %lld %lld", (long long)ig[0], (long long)ig[1]);
  cu.free_(dz);
  return 0;
}

static int test_collectives(void) {
  if (!libs_ready()) return BT_SKIP;
  for (int n = 1; n <= fit(4); n++)
    if (run_env(n, 120, NULL, body_collectives, NULL, 0, NULL)) return 1;
  return 0;
}

/* Reductions NCCL lacks are refused, naming them, and nothing runs. */
static int body_refusals(braid_comm *c, int rank, int n, void *arg) {
  (void)rank, (void)n, (void)arg;
  NEED_CUDA();
  void *d = dev_alloc(64);
  BT_CHECK(d, "cudaMalloc");
  BT_CHECK_ST(braid_all_reduce(c, d, 4, BRAID_I16, BRAID_SUM), BRAID_ERR_UNSUPPORTED, c);
  BT_CHECK_MSG(c, "i16");
  BT_CHECK_MSG(c, "braid_all_reduce");
  BT_CHECK_ST(braid_all_reduce(c, d, 4, BRAID_I32, BRAID_BXOR), BRAID_ERR_UNSUPPORTED, c);
  BT_CHECK_MSG(c, "bxor");
  BT_CHECK_ST(braid_reduce_scatter(c, d, (char *)d + 32, 1, BRAID_BOOL, BRAID_MAX), BRAID_ERR_UNSUPPORTED, c);
  BT_CHECK_ST(braid_all_reduce(c, d, 2, BRAID_C64, BRAID_PROD), BRAID_ERR_UNSUPPORTED, c);
  BT_CHECK_MSG(c, "c64");
  /* The communicator is still good. */
  BT_CHECK_OK(braid_all_reduce(c, d, 4, BRAID_I32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  cu.free_(d);
  return 0;
}

static int test_unsupported_reductions(void) {
  if (!libs_ready()) return BT_SKIP;
  return run_env(fit(2), 60, NULL, body_refusals, NULL, 0, NULL);
}

/* ---------------------------------------------------------------- send / receive */

static int body_p2p(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  NEED_CUDA();
  const size_t big = bt_quick() ? 200000 : 3000000;
  const int right = (rank + 1) % n, left = (rank + n - 1) % n;
  /* Three messages to each neighbour, different tags and sizes, both ways at once. */
  size_t cnt[3] = {5, big, 1};
  int32_t *sd[3], *rd[3];
  for (int k = 0; k < 3; k++) {
    int32_t *h = malloc(cnt[k] * 4);
    BT_CHECK(h, "malloc");
    for (size_t i = 0; i < cnt[k]; i++) h[i] = rank * 1000000 + k * 100000 + (int32_t)(i % 100000);
    sd[k] = dev_alloc(cnt[k] * 4);
    rd[k] = dev_alloc(cnt[k] * 4);
    BT_CHECK(sd[k] && rd[k] && h2d(sd[k], h, cnt[k] * 4), "h2d");
    free(h);
  }
  for (int k = 0; k < 3; k++) {
    BT_CHECK_OK(braid_send(c, sd[k], cnt[k], BRAID_I32, right, 10u + (uint32_t)k), c);
    BT_CHECK_OK(braid_recv(c, rd[k], cnt[k], BRAID_I32, left, 10u + (uint32_t)k), c);
  }
  BT_CHECK_OK(braid_sync(c), c);
  for (int k = 0; k < 3; k++) {
    int32_t *g = malloc(cnt[k] * 4);
    BT_CHECK(g && d2h(g, rd[k], cnt[k] * 4), "d2h");
    for (size_t i = 0; i < cnt[k]; i++)
      BT_CHECK(g[i] == left * 1000000 + k * 100000 + (int32_t)(i % 100000), "message %d from %d [%zu]: %d", k, left,
               i, g[i]);
    free(g);
  }
  /* A receive posted before its send exists on the peer: rank 0 receives
     two messages in one sync, rank 1 sends them in two syncs. */
  if (n >= 2 && rank < 2) {
    if (rank == 0) {
      BT_CHECK_OK(braid_recv(c, rd[0], 5, BRAID_I32, 1, 1), c);
      BT_CHECK_OK(braid_recv(c, rd[2], 1, BRAID_I32, 1, 2), c);
      BT_CHECK_OK(braid_sync(c), c);
      int32_t g[5], g1;
      BT_CHECK(d2h(g, rd[0], 20) && d2h(&g1, rd[2], 4), "d2h");
      BT_CHECK(g[4] == 1000000 + 4 && g1 == 1000000 + 200000, "split sends: %d %d", g[4], g1);
    } else {
      BT_CHECK_OK(braid_send(c, sd[0], 5, BRAID_I32, 0, 1), c);
      BT_CHECK_OK(braid_sync(c), c);
      BT_CHECK_OK(braid_send(c, sd[2], 1, BRAID_I32, 0, 2), c);
      BT_CHECK_OK(braid_sync(c), c);
    }
  }
  /* Point to point before a collective: the stream keeps the call order. */
  BT_CHECK_OK(braid_send(c, sd[0], 5, BRAID_I32, right, 7), c);
  BT_CHECK_OK(braid_recv(c, rd[0], 5, BRAID_I32, left, 7), c);
  BT_CHECK_OK(braid_all_reduce(c, sd[2], 1, BRAID_I32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  for (int k = 0; k < 3; k++) {
    cu.free_(sd[k]);
    cu.free_(rd[k]);
  }
  return 0;
}

static int test_send_recv(void) {
  if (!libs_ready()) return BT_SKIP;
  for (int n = 1; n <= fit(3); n++)
    if (run_env(n, 120, NULL, body_p2p, NULL, 0, NULL)) return 1;
  return 0;
}

/* A send and its receive that differ in size or tag: both ranks get
   BRAID_ERR_MISMATCH before any data moves; the receive buffer is untouched. */
static int body_p2p_mismatch(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  NEED_CUDA();
  const int by_tag = *(const int *)arg;
  float h[16], g[16];
  for (int i = 0; i < 16; i++) h[i] = 42.0f;
  float *d = dev_alloc(sizeof h);
  BT_CHECK(d && h2d(d, h, sizeof h), "h2d");
  if (rank == 0) BT_CHECK_OK(braid_send(c, d, 10, BRAID_F32, 1, 5), c);
  else BT_CHECK_OK(braid_recv(c, d, by_tag ? 10 : 12, BRAID_F32, 0, by_tag ? 6 : 5), c);
  BT_CHECK_ST(braid_sync(c), BRAID_ERR_MISMATCH, c);
  BT_CHECK_MSG(c, "rank");
  BT_CHECK_MSG(c, by_tag ? "tag 6" : "12");
  if (rank == 1) {
    BT_CHECK(d2h(g, d, sizeof g), "d2h");
    for (int i = 0; i < 16; i++) BT_CHECK(g[i] == 42.0f, "receive buffer written [%d]", i);
  }
  /* The communicator is failed: later calls say so at once. */
  BT_CHECK_ST(braid_all_reduce(c, d, 1, BRAID_F32, BRAID_SUM), BRAID_ERR_MISMATCH, c);
  return 0;
}

static int test_send_recv_mismatch(void) {
  if (!libs_ready() || too_few_gpus(2)) return BT_SKIP;
  int by_tag = 0;
  if (run_env(2, 60, NULL, body_p2p_mismatch, &by_tag, 0, NULL)) return 1;
  by_tag = 1;
  return run_env(2, 60, NULL, body_p2p_mismatch, &by_tag, 0, NULL);
}

/* Ranks in different collectives: BRAID_ERR_MISMATCH from the call check. */
static int body_coll_mismatch(braid_comm *c, int rank, int n, void *arg) {
  (void)n, (void)arg;
  NEED_CUDA();
  float *d = dev_alloc(64 * 4);
  BT_CHECK(d, "cudaMalloc");
  BT_CHECK_OK(braid_all_reduce(c, d, 4, BRAID_F32, BRAID_SUM), c);
  if (rank == 0) BT_CHECK_OK(braid_all_reduce(c, d, 8, BRAID_F32, BRAID_SUM), c);
  else BT_CHECK_OK(braid_broadcast(c, d, 8, BRAID_F32, 0), c);
  double t0 = now_s();
  BT_CHECK_ST(braid_sync(c), BRAID_ERR_MISMATCH, c);
  BT_CHECK_MSG(c, "collective #2");
  BT_CHECK(now_s() - t0 < 10, "the mismatch took %.1f s", now_s() - t0);
  return 0;
}

static int test_collective_mismatch(void) {
  if (!libs_ready()) return BT_SKIP;
  if (real_mode()) { /* NCCL itself may hang or fault on differing calls */
    printf("  skipped on the real libraries: NCCL's behaviour with differing collectives is undefined\n");
    return BT_SKIP;
  }
  const char *extra[] = {"BRAID_TIMEOUT=20", NULL};
  return run_env(2, 60, extra, body_coll_mismatch, NULL, 0, NULL);
}

/* ---------------------------------------------------------------- streams and events */

/* "Compute" on the user's stream: late (a host function that sleeps), then
   the gradient is written by a copy on the same stream. */
static void late(void *p) {
  (void)p;
  struct timespec ts = {0, 100 * 1000 * 1000};
  nanosleep(&ts, NULL);
}

static int body_stream_events(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  NEED_CUDA();
  const size_t cnt = 1000;
  float *d = dev_alloc(cnt * 4);
  float zero[1000] = {0};
  BT_CHECK(d && h2d(d, zero, sizeof zero), "h2d");
  cudaStream_t user;
  BT_CHECK(cu.stream_create(&user, cudaStreamNonBlocking) == cudaSuccess, "cudaStreamCreateWithFlags");
  uint64_t ready = 0, done = 0;
  BT_CHECK_OK(braid_event_create(c, &ready), c);
  BT_CHECK_OK(braid_event_create(c, &done), c);
  float grad[1000], seen[1000];
  for (size_t i = 0; i < cnt; i++) grad[i] = (float)(rank + 1);
  BT_CHECK(cu.host_func(user, late, NULL) == cudaSuccess, "cudaLaunchHostFunc");
  BT_CHECK(cu.memcpy_async(d, grad, sizeof grad, cudaMemcpyHostToDevice, user) == cudaSuccess, "cudaMemcpyAsync");
  /* gradient ready -> comm stream waits -> all-reduce -> compute stream waits */
  BT_CHECK_OK(braid_event_record_on_stream(c, ready, (uint64_t)(uintptr_t)user), c);
  BT_CHECK_OK(braid_comm_stream_wait_event(c, ready), c);
  BT_CHECK_OK(braid_all_reduce(c, d, cnt, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_event_record_on_comm_stream(c, done), c);
  BT_CHECK_OK(braid_stream_wait_event(c, (uint64_t)(uintptr_t)user, done), c);
  BT_CHECK(cu.memcpy_async(seen, d, sizeof seen, cudaMemcpyDeviceToHost, user) == cudaSuccess, "cudaMemcpyAsync");
  BT_CHECK(cu.stream_sync(user) == cudaSuccess, "cudaStreamSynchronize");
  const float want = (float)(n * (n + 1) / 2);
  for (size_t i = 0; i < cnt; i++)
    BT_CHECK(seen[i] == want, "the compute stream saw [%zu] = %g after the all-reduce, want %g", i, seen[i], want);
  BT_CHECK_OK(braid_sync_comm_stream(c), c);
  float g[1000];
  BT_CHECK(d2h(g, d, sizeof g), "d2h");
  for (size_t i = 0; i < cnt; i++) BT_CHECK(g[i] == want, "[%zu] = %g", i, g[i]);
  BT_CHECK_ST(braid_event_destroy(c, 0), BRAID_ERR_INVALID_ARG, c);
  /* A handle braid did not make never reaches CUDA. */
  uint64_t made_up = ready ^ 0x5a5a0;
  BT_CHECK_ST(braid_event_record_on_comm_stream(c, made_up), BRAID_ERR_INVALID_ARG, c);
  BT_CHECK_MSG(c, "braid_event_record_on_comm_stream: event 0x");
  BT_CHECK_MSG(c, "is not an event braid_event_create made");
  BT_CHECK_ST(braid_stream_wait_event(c, (uint64_t)(uintptr_t)user, made_up), BRAID_ERR_INVALID_ARG, c);
  BT_CHECK_OK(braid_event_destroy(c, ready), c);
  /* Nor does one already destroyed. */
  BT_CHECK_ST(braid_event_destroy(c, ready), BRAID_ERR_INVALID_ARG, c);
  BT_CHECK_MSG(c, "or it was destroyed");
  BT_CHECK_ST(braid_event_record_on_stream(c, ready, (uint64_t)(uintptr_t)user), BRAID_ERR_INVALID_ARG, c);
  BT_CHECK_ST(braid_comm_stream_wait_event(c, ready), BRAID_ERR_INVALID_ARG, c);
  BT_CHECK_OK(braid_event_destroy(c, done), c);
  /* The communicator still works after the refusals. */
  BT_CHECK_OK(braid_all_reduce(c, d, cnt, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync_comm_stream(c), c);
  cu.stream_destroy(user);
  cu.free_(d);
  return 0;
}

static int test_stream_events(void) {
  if (!libs_ready()) return BT_SKIP;
  for (int n = 1; n <= fit(2); n++)
    if (run_env(n, 60, NULL, body_stream_events, NULL, 0, NULL)) return 1;
  return 0;
}

/* Grouped calls: collectives queued and enqueued at the group's end, with
   the group's sends and receives; in-place rooted calls; all-to-allv in place. */
static int body_group(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  NEED_CUDA();
  float a[4], b[4], g[4];
  for (int i = 0; i < 4; i++) a[i] = (float)(rank + i), b[i] = 1;
  float *da = dev_alloc(sizeof a), *db = dev_alloc(sizeof b), *dm = dev_alloc(16 * sizeof(float));
  BT_CHECK(da && db && dm && h2d(da, a, sizeof a) && h2d(db, b, sizeof b), "h2d");
  BT_CHECK_OK(braid_group_start(), NULL);
  BT_CHECK_OK(braid_all_reduce(c, da, 4, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_send(c, db, 4, BRAID_F32, (rank + 1) % n, 3), c);
  BT_CHECK_OK(braid_recv(c, dm, 4, BRAID_F32, (rank + n - 1) % n, 3), c);
  BT_CHECK_OK(braid_all_reduce(c, db, 4, BRAID_F32, BRAID_MAX), c);
  BT_CHECK_OK(braid_group_end(), NULL);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(d2h(g, da, sizeof g), "d2h");
  for (int i = 0; i < 4; i++) BT_CHECK(g[i] == (float)(n * (n - 1) / 2 + n * i), "grouped all-reduce [%d] %g", i, g[i]);
  BT_CHECK(d2h(g, dm, sizeof g) && g[0] == 1, "grouped receive");
  /* reduce and gather in place at the root */
  for (int i = 0; i < 4; i++) a[i] = (float)(rank + 1);
  BT_CHECK(h2d(da, a, sizeof a), "h2d");
  BT_CHECK_OK(braid_reduce(c, da, da, 4, BRAID_F32, BRAID_SUM, 0), c);
  BT_CHECK_OK(braid_sync(c), c);
  if (rank == 0) {
    BT_CHECK(d2h(g, da, sizeof g), "d2h");
    BT_CHECK(g[3] == (float)(n * (n + 1) / 2), "in-place reduce %g", g[3]);
  }
  float one = (float)rank;
  BT_CHECK(h2d(dm + rank, &one, sizeof one), "h2d");
  BT_CHECK_OK(braid_gather(c, dm + rank, dm, 1, BRAID_F32, n - 1), c);
  BT_CHECK_OK(braid_sync(c), c);
  if (rank == n - 1) {
    float gg[16];
    BT_CHECK(d2h(gg, dm, (size_t)n * sizeof(float)), "d2h");
    for (int r = 0; r < n; r++) BT_CHECK(gg[r] == (float)r, "in-place gather [%d] %g", r, gg[r]);
  }
  /* all-to-allv in place: one element to every rank */
  size_t cnt[4], dsp[4];
  float v[4], w[4];
  for (int j = 0; j < n; j++) cnt[j] = 1, dsp[j] = (size_t)j, v[j] = (float)(rank * 10 + j);
  BT_CHECK(h2d(dm, v, (size_t)n * sizeof(float)), "h2d");
  BT_CHECK_OK(braid_all_to_allv(c, dm, NULL, NULL, dm, cnt, dsp, BRAID_F32), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(d2h(w, dm, (size_t)n * sizeof(float)), "d2h");
  for (int j = 0; j < n; j++) BT_CHECK(w[j] == (float)(j * 10 + rank), "all-to-allv in place [%d] %g", j, w[j]);
  cu.free_(da);
  cu.free_(db);
  cu.free_(dm);
  return 0;
}

static int test_group_and_in_place(void) {
  if (!libs_ready()) return BT_SKIP;
  for (int n = fit(2); n <= fit(4); n++)
    if (run_env(n, 60, NULL, body_group, NULL, 0, NULL)) return 1;
  return 0;
}

/* ---------------------------------------------------------------- split, memory */

static int body_split(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  NEED_CUDA();
  braid_comm *child = NULL;
  if (n == 1) { /* one GPU: a split that keeps the only rank */
    BT_CHECK_OK(braid_split(c, 7, 0, &child), c);
    BT_CHECK(child && braid_world_size(child) == 1 && !strcmp(braid_backend(child), "nccl"), "child of one");
    int32_t v = 5, g = 0, *d = dev_alloc(4);
    BT_CHECK(d && h2d(d, &v, 4), "h2d");
    BT_CHECK_OK(braid_all_reduce(child, d, 1, BRAID_I32, BRAID_SUM), child);
    BT_CHECK_OK(braid_sync(child), child);
    BT_CHECK(d2h(&g, d, 4) && g == 5, "child all-reduce %d", g);
    cu.free_(d);
    BT_CHECK_OK(braid_destroy(child), NULL);
    BT_CHECK_OK(braid_split(c, BRAID_SPLIT_NONE, 0, &child), c);
    BT_CHECK(child == NULL, "BRAID_SPLIT_NONE gave a communicator");
    return 0;
  }
  uint32_t color = rank == n - 1 ? BRAID_SPLIT_NONE : (uint32_t)(rank % 2);
  BT_CHECK_OK(braid_split(c, color, (uint32_t)(n - rank), &child), c);
  if (color == BRAID_SPLIT_NONE) {
    BT_CHECK(child == NULL, "BRAID_SPLIT_NONE gave a communicator");
  } else {
    BT_CHECK(child && !strcmp(braid_backend(child), "nccl"), "child");
    int32_t v = rank, g = 0;
    int32_t *d = dev_alloc(4);
    BT_CHECK(d && h2d(d, &v, 4), "h2d");
    BT_CHECK_OK(braid_all_reduce(child, d, 1, BRAID_I32, BRAID_SUM), child);
    BT_CHECK_OK(braid_sync(child), child);
    BT_CHECK(d2h(&g, d, 4), "d2h");
    int32_t want = 0;
    for (int r = 0; r < n - 1; r++)
      if (r % 2 == rank % 2) want += r;
    BT_CHECK(g == want, "child all-reduce %d, want %d", g, want);
    /* keys descend: the highest old rank is rank 0 */
    BT_CHECK(braid_rank(child) == (braid_world_size(child) - 1 - (rank / 2)), "child rank %d", braid_rank(child));
    cu.free_(d);
    BT_CHECK_OK(braid_destroy(child), NULL);
  }
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

static int test_split(void) {
  if (!libs_ready()) return BT_SKIP;
  return run_env(fit(5), 60, NULL, body_split, NULL, 0, NULL);
}

static int body_memory(braid_comm *c, int rank, int n, void *arg) {
  (void)arg, (void)n;
  NEED_CUDA();
  float *buf = NULL;
  BT_CHECK_OK(braid_comm_mem_alloc(c, (void **)&buf, 4096), c);
  BT_CHECK(buf, "no buffer");
  void *h = NULL;
  BT_CHECK_OK(braid_mem_register(c, buf, 4096, &h), c);
  float v[4] = {1, 2, 3, (float)rank}, g[4];
  BT_CHECK(h2d(buf, v, sizeof v), "h2d");
  BT_CHECK_OK(braid_all_reduce(c, buf, 4, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(d2h(g, buf, sizeof g), "d2h");
  BT_CHECK(g[0] == (float)n && g[3] == (float)(n * (n - 1) / 2), "all-reduce in ncclMemAlloc memory");
  BT_CHECK_OK(braid_mem_deregister(c, h), c);
  BT_CHECK_ST(braid_mem_register(c, NULL, 16, &h), BRAID_ERR_INVALID_ARG, c);
  BT_CHECK_MSG(c, "buf is NULL");
  BT_CHECK_OK(braid_comm_mem_free(c, buf), c);
  return 0;
}

static int test_memory(void) {
  if (!libs_ready()) return BT_SKIP;
  return run_env(fit(2), 60, NULL, body_memory, NULL, 0, NULL);
}

/* ---------------------------------------------------------------- failures */

/* An operation fails asynchronously on rank 1 (injected): rank 1's sync
   names NCCL's error, rank 0 (waiting for it inside NCCL) hears of it. */
static int body_async_error(braid_comm *c, int rank, int n, void *arg) {
  (void)n, (void)arg;
  NEED_CUDA();
  float *d = dev_alloc(64);
  BT_CHECK(d, "cudaMalloc");
  double t0 = now_s();
  braid_status st = BRAID_OK;
  for (int k = 0; k < 4 && !st; k++) {
    st = braid_all_reduce(c, d, 4, BRAID_F32, BRAID_SUM);
    if (!st) st = braid_sync(c);
  }
  double dt = now_s() - t0;
  if (rank == 1) {
    BT_CHECK(st == BRAID_ERR_BACKEND, "rank 1: %s: %s", braid_status_string(st), braid_last_error(c));
    BT_CHECK_MSG(c, "injected failure");
  } else {
    BT_CHECK(st == BRAID_ERR_PEER_LOST, "rank 0: %s: %s", braid_status_string(st), braid_last_error(c));
    BT_CHECK_MSG(c, "rank 1");
  }
  BT_CHECK(dt < 5, "the failure took %.2f s to arrive", dt);
  return 0;
}

/* A stalled operation (injected: it never completes) on one rank: every
   rank returns within about BRAID_TIMEOUT, naming the wait. */
static int body_hang(braid_comm *c, int rank, int n, void *arg) {
  (void)n, (void)arg;
  NEED_CUDA();
  float *d = dev_alloc(64);
  BT_CHECK(d, "cudaMalloc");
  double t0 = now_s();
  braid_status st = braid_all_reduce(c, d, 4, BRAID_F32, BRAID_SUM);
  if (!st) st = braid_sync(c);
  double dt = now_s() - t0;
  BT_CHECK(st == BRAID_ERR_TIMEOUT || st == BRAID_ERR_PEER_LOST, "rank %d: %s: %s", rank, braid_status_string(st),
           braid_last_error(c));
  BT_CHECK(dt < 8, "rank %d returned after %.2f s", rank, dt);
  double t1 = now_s();
  BT_CHECK_OK(braid_destroy(c), NULL);
  BT_CHECK(now_s() - t1 < 3, "destroy of the failed communicator took %.2f s", now_s() - t1);
  return 0;
}

/* Bodies that run braid_init themselves set the double's injection on one rank only. */
static int init_with_injection(braid_comm **c, int rank) {
  const char *fr = getenv("BT_NCCL_FAIL_RANK"), *hr = getenv("BT_NCCL_HANG_RANK");
  /* Operation 3: past the digest and data of the first collective. */
  if (fr && atoi(fr) == rank) setenv("BRAID_NCCL_DOUBLE_FAIL_AT", "3", 1);
  if (hr && atoi(hr) == rank) setenv("BRAID_NCCL_DOUBLE_HANG_AT", "2", 1);
  return braid_init(NULL, c) == BRAID_OK;
}

static int body_async_error_manual(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  braid_comm *c = NULL;
  BT_CHECK(init_with_injection(&c, rank), "braid_init: %s", braid_last_error(NULL));
  int r = body_async_error(c, rank, n, arg);
  braid_destroy(c);
  return r;
}

static int body_hang_manual(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  braid_comm *c = NULL;
  BT_CHECK(init_with_injection(&c, rank), "braid_init: %s", braid_last_error(NULL));
  return body_hang(c, rank, n, arg);
}

static int test_async_error_run(void) {
  if (!libs_ready() || injects_failures()) return BT_SKIP;
  const char *extra[] = {"BRAID_TIMEOUT=30", "BT_NCCL_FAIL_RANK=1", NULL};
  return run_env(2, 60, extra, body_async_error_manual, NULL, 1, NULL);
}

static int test_stall_run(void) {
  if (!libs_ready() || injects_failures()) return BT_SKIP;
  const char *extra[] = {"BRAID_TIMEOUT=2", "BT_NCCL_HANG_RANK=0", NULL};
  return run_env(2, 60, extra, body_hang_manual, NULL, 1, NULL);
}

/* A rank killed while the others wait in a collective: PEER_LOST naming it. */
static int body_killed(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  NEED_CUDA();
  float *d = dev_alloc(64);
  BT_CHECK(d, "cudaMalloc");
  BT_CHECK_OK(braid_all_reduce(c, d, 4, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  if (rank == n - 1) raise(SIGKILL);
  double t0 = now_s();
  braid_status st = braid_all_reduce(c, d, 4, BRAID_F32, BRAID_SUM);
  if (!st) st = braid_sync(c);
  BT_CHECK(st == BRAID_ERR_PEER_LOST, "rank %d: %s: %s", rank, braid_status_string(st), braid_last_error(c));
  char want[32];
  snprintf(want, sizeof want, "rank %d", n - 1);
  BT_CHECK_MSG(c, want);
  BT_CHECK(now_s() - t0 < 5, "the death took %.2f s to notice", now_s() - t0);
  return 0;
}

static int test_killed_rank(void) {
  if (!libs_ready() || too_few_gpus(3)) return BT_SKIP;
  bt_rank_result res[3];
  const char *env[] = {env_nccl, env_cudart, "BRAID_TIMEOUT=60", NULL};
  bt_run_opts o = {"nccl", 3, 60, env, 2};
  bt_run_ranks_ex(&o, body_killed, NULL, res);
  for (int r = 0; r < 2; r++) BT_CHECK(res[r].exited && res[r].code == 0, "rank %d failed", r);
  return 0;
}

/* braid_abort from another thread while braid_sync waits: ABORTED at once
   here, PEER_LOST naming this rank on the others. */
static void *abort_later(void *p) {
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
  braid_abort(p);
  return NULL;
}

static int body_abort(braid_comm *c, int rank, int n, void *arg) {
  (void)n, (void)arg;
  NEED_CUDA();
  float *d = dev_alloc(64);
  BT_CHECK(d, "cudaMalloc");
  double t0 = now_s();
  braid_status st;
  if (rank == 0) {
    /* rank 0 waits for a message rank 1 never sends */
    pthread_t t;
    pthread_create(&t, NULL, abort_later, c);
    BT_CHECK_OK(braid_recv(c, d, 4, BRAID_F32, 1, 9), c);
    st = braid_sync(c);
    pthread_join(t, NULL);
    BT_CHECK(st == BRAID_ERR_ABORTED, "rank 0: %s: %s", braid_status_string(st), braid_last_error(c));
    /* Alive a while, so rank 1 hears of the abort, not of a dead process. */
    struct timespec ts = {1, 500 * 1000 * 1000};
    nanosleep(&ts, NULL);
  } else {
    st = braid_all_reduce(c, d, 4, BRAID_F32, BRAID_SUM);
    if (!st) st = braid_sync(c);
    BT_CHECK(st == BRAID_ERR_PEER_LOST, "rank 1: %s: %s", braid_status_string(st), braid_last_error(c));
    BT_CHECK_MSG(c, "rank 0");
    BT_CHECK_MSG(c, "abort");
  }
  BT_CHECK(now_s() - t0 < 5, "rank %d: %.2f s", rank, now_s() - t0);
  return 0;
}

static int test_abort(void) {
  if (!libs_ready() || too_few_gpus(2)) return BT_SKIP;
  const char *extra[] = {"BRAID_TIMEOUT=60", NULL};
  return run_env(2, 60, extra, body_abort, NULL, 0, NULL);
}

/* Nothing of the double's or braid's stays in /dev/shm after the runs. */
static int no_leaks_body(void) {
  const char *extra[] = {"BRAID_TIMEOUT=2", "BT_NCCL_HANG_RANK=0", NULL};
  if (run_env(2, 60, extra, body_hang_manual, NULL, 1, NULL)) return 1;
  FILE *p = popen("ls /dev/shm 2>/dev/null | grep -c '^ncclD-' || true", "r");
  int k = -1;
  BT_CHECK(p && fscanf(p, "%d", &k) == 1, "could not list /dev/shm");
  pclose(p);
  BT_CHECK(k == 0, "%d ncclD-* names left in /dev/shm", k);
  BT_CHECK(bt_dead_shm_names(0) == 0, "braid names left in /dev/shm");
  return 0;
}

static int test_no_leaks(void) {
  if (!libs_ready() || injects_failures()) return BT_SKIP;
  /* Other tests running beside this one make names of their own: where a
     mount namespace can be made (root), the runs get a /dev/shm of their own. */
  pid_t pid = fork();
  BT_CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) == 0 && mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=256m") == 0)
      _exit(no_leaks_body() ? 1 : 0);
    _exit(3);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 3) return no_leaks_body();
  BT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the runs in a private /dev/shm failed (status %#x)", st);
  return 0;
}

/* ---------------------------------------------------------------- a real GPU */

/* Two processes on one GPU: NCCL either serves them or refuses at init
   (2.28 refuses); braid must pass on either outcome within the deadline,
   never hang, and a refusal must say why and what to do. The test double
   refuses as NCCL does when asked to (arg: the refusal is required). */
static int body_shared_gpu(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  const int must_refuse = *(const int *)arg;
  braid_comm *c = NULL;
  braid_status st = braid_init(NULL, &c);
  if (st == BRAID_OK) {
    BT_CHECK(!must_refuse, "two ranks on one device were accepted");
    int rc = body_collectives(c, rank, n, NULL);
    if (!rc) printf("  rank %d: NCCL accepted two ranks on one GPU; the collectives were right\n", rank);
    BT_CHECK_OK(braid_destroy(c), NULL);
    return rc;
  }
  const char *m = braid_last_error(NULL);
  printf("  rank %d: %s: %s\n", rank, braid_status_string(st), m);
  BT_CHECK(c == NULL, "a communicator came out of a failed init");
  BT_CHECK(st == BRAID_ERR_INVALID_ARG, "refused with %s", braid_status_string(st));
  BT_CHECK_MSG(NULL, "braid_init");
  BT_CHECK_MSG(NULL, "2 ranks on this host share 1 GPU(s)");
  BT_CHECK_MSG(NULL, "Duplicate GPU");
  return 0;
}

static int test_gpu_shared(void) {
  if (!libs_ready()) return BT_SKIP;
  if (real_mode() && gpus() < 1) {
    printf("  skipped: no CUDA device is visible\n");
    return BT_SKIP;
  }
  int must_refuse = !real_mode();
  const char *extra[] = {"BRAID_TIMEOUT=30", "BRAID_CUDA_DEVICE=0", "BRAID_NCCL_DOUBLE_DEVICES=1",
                         "BRAID_NCCL_DOUBLE_ONE_PER_DEVICE=1", NULL};
  return run_env(2, 90, extra, body_shared_gpu, &must_refuse, 1, NULL);
}

/* ---------------------------------------------------------------- hier over nccl */

/* f16 through hier's stages (f32 between nodes, rounded once), AVG and a
   scaled sum, at counts the pieces split unevenly. */
static int body_hier_f16(braid_comm *c, int rank, int n) {
  const size_t cnt = 3001, tot = cnt * (size_t)n;
  uint16_t *hv = malloc(tot * 2), *hg = malloc(tot * 2), *d = dev_alloc(tot * 2), *d2 = dev_alloc(cnt * 2);
  BT_CHECK(hv && hg && d && d2, "allocation");
  uint16_t half = braid__f32_to_f16(0.5f);
  braid_op ops[3] = {BRAID_SUM, BRAID_AVG, 0};
  BT_CHECK_OK(braid_op_premul_sum(c, &half, BRAID_F16, &ops[2]), c);
  for (int k = 0; k < 3; k++) {
    for (size_t i = 0; i < tot; i++) hv[i] = braid__f32_to_f16((float)(rank + 1 + (int)(i % 5)));
    BT_CHECK(h2d(d, hv, cnt * 2), "h2d");
    BT_CHECK_OK(braid_all_reduce(c, d, cnt, BRAID_F16, ops[k]), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(d2h(hg, d, cnt * 2), "d2h");
    for (size_t i = 0; i < cnt; i++) {
      float want = (float)(n * (n + 1) / 2 + n * (int)(i % 5));
      want = k == 1 ? want / (float)n : k == 2 ? want * 0.5f : want;
      BT_CHECK(braid__f16_to_f32(hg[i]) == want, "f16 all-reduce op %d [%zu]: %g, want %g", k, i,
               braid__f16_to_f32(hg[i]), want);
    }
    BT_CHECK(h2d(d, hv, tot * 2), "h2d");
    BT_CHECK_OK(braid_reduce_scatter(c, d, d2, cnt, BRAID_F16, ops[k]), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(d2h(hg, d2, cnt * 2), "d2h");
    for (size_t i = 0; i < cnt; i++) {
      float want = (float)(n * (n + 1) / 2 + n * (int)(((size_t)rank * cnt + i) % 5));
      want = k == 1 ? want / (float)n : k == 2 ? want * 0.5f : want;
      BT_CHECK(braid__f16_to_f32(hg[i]) == want, "f16 reduce-scatter op %d [%zu]: %g, want %g", k, i,
               braid__f16_to_f32(hg[i]), want);
    }
  }
  BT_CHECK_OK(braid_op_destroy(c, ops[2]), c);
  cu.free_(d);
  cu.free_(d2);
  free(hv);
  free(hg);
  return 0;
}

/* Simulated nodes (BRAID_NODE_ID, one letter per rank): nccl inside each
   node, tcp between nodes through host copies. Every call, send/receive
   across nodes, stream ordering, grouped calls, and split. */
static int body_hier(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  const char *nodes = arg;
  char id[2] = {nodes[rank], 0};
  setenv("BRAID_NODE_ID", id, 1);
  setenv("BRAID_BACKEND", "hier", 1);
  /* Every rank of a stage must cut it into the same pieces: rank 0's size counts. */
  if (rank > 0 && getenv("BRAID_HIER_PIECE")) setenv("BRAID_HIER_PIECE", "2999", 1);
  braid_comm *c = NULL;
  BT_CHECK(braid_init(NULL, &c) == BRAID_OK, "%s: init: %s", nodes, braid_last_error(NULL));
  int rc = body_collectives(c, rank, n, "hier");
  if (!rc) rc = body_hier_f16(c, rank, n);
  if (!rc) rc = body_p2p(c, rank, n, NULL);
  if (!rc) rc = body_stream_events(c, rank, n, NULL);
  if (!rc) rc = body_group(c, rank, n, NULL);
  if (!rc) { /* a child inside one node is nccl; one across nodes is hier again */
    braid_comm *node = NULL, *across = NULL;
    int lrank = 0, nodes_seen = 0;
    for (int r = 0; r < rank; r++) lrank += nodes[r] == nodes[rank];
    for (int r = 0; r < n; r++) nodes_seen += strchr(nodes, nodes[r]) == nodes + r;
    BT_CHECK_OK(braid_split(c, (uint32_t)nodes[rank], 0, &node), c);
    BT_CHECK_OK(braid_split(c, (uint32_t)lrank, 0, &across), c);
    BT_CHECK(!strcmp(braid_backend(node), "nccl"), "node child is %s", braid_backend(node));
    int spans = braid_world_size(across) > 1;
    BT_CHECK(!strcmp(braid_backend(across), spans ? "hier" : "nccl"), "child across nodes is %s",
             braid_backend(across));
    BT_CHECK(!spans || braid_world_size(across) <= nodes_seen, "child across nodes has %d ranks",
             braid_world_size(across));
    int32_t v = rank + 1, g = 0, *d = dev_alloc(4);
    BT_CHECK(d && h2d(d, &v, 4), "h2d");
    BT_CHECK_OK(braid_all_reduce(across, d, 1, BRAID_I32, BRAID_SUM), across);
    BT_CHECK_OK(braid_sync(across), across);
    int32_t want = 0;
    for (int r = 0; r < n; r++) {
      int lr = 0;
      for (int q = 0; q < r; q++) lr += nodes[q] == nodes[r];
      if (lr == lrank) want += r + 1;
    }
    BT_CHECK(d2h(&g, d, 4) && g == want, "all-reduce across nodes: %d, want %d", g, want);
    cu.free_(d);
    BT_CHECK_OK(braid_destroy(across), NULL);
    BT_CHECK_OK(braid_destroy(node), NULL);
  }
  BT_CHECK_OK(braid_destroy(c), NULL);
  return rc;
}

/* hier keeps the node part's order: a receive from another node lands
   before a later collective reads its buffer, and queued node-local sends
   and receives go out before a call that starts on the host (a scatter). */
static int body_hier_order(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused, (void)arg;
  NEED_CUDA();
  static const char nodes[] = "aabb";
  char id[2] = {nodes[rank], 0};
  setenv("BRAID_NODE_ID", id, 1);
  setenv("BRAID_BACKEND", "hier", 1);
  braid_comm *c = NULL;
  BT_CHECK(braid_init(NULL, &c) == BRAID_OK, "init: %s", braid_last_error(NULL));
  float v[4] = {(float)(rank + 1), 1, 1, 1}, g[4];
  float *d = dev_alloc(sizeof v), *e = dev_alloc(64 * sizeof(float));
  BT_CHECK(d && e && h2d(d, v, sizeof v), "h2d");
  if (rank == 0) BT_CHECK_OK(braid_recv(c, d, 4, BRAID_F32, 2, 9), c); /* from the other node */
  if (rank == 2) {
    usleep(200000);
    BT_CHECK_OK(braid_send(c, d, 4, BRAID_F32, 0, 9), c);
  }
  BT_CHECK_OK(braid_all_reduce(c, d, 4, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(d2h(g, d, sizeof g), "d2h");
  /* rank 0 holds rank 2's 3 when the sum starts: 3 + 2 + 3 + 4 */
  BT_CHECK(g[0] == 12 && g[1] == (float)n, "all-reduce after a receive: %g %g, want 12 %d", g[0], g[1], n);
  float blocks[4] = {10, 11, 12, 13}, one = 0;
  if (rank == 0) BT_CHECK(h2d(e, blocks, sizeof blocks), "h2d");
  if (rank == 1) BT_CHECK_OK(braid_send(c, d, 4, BRAID_F32, 0, 5), c);
  if (rank == 0) BT_CHECK_OK(braid_recv(c, e + 8, 4, BRAID_F32, 1, 5), c);
  BT_CHECK_OK(braid_scatter(c, e, e + 32, 1, BRAID_F32, 0), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(d2h(&one, e + 32, sizeof one) && one == blocks[rank], "scatter after queued sends: %g", one);
  if (rank == 0) BT_CHECK(d2h(g, e + 8, sizeof g) && g[0] == 12, "node-local receive: %g", g[0]);
  /* f16 through the stages (f32 between nodes), AVG and a scaled sum */
  uint16_t hv[7], hg[7], *dh = dev_alloc(sizeof hv);
  float half = 0.5f;
  uint16_t hhalf = braid__f32_to_f16(half);
  braid_op ops[3] = {BRAID_SUM, BRAID_AVG, 0};
  BT_CHECK_OK(braid_op_premul_sum(c, &hhalf, BRAID_F16, &ops[2]), c);
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < 7; i++) hv[i] = braid__f32_to_f16((float)(rank + 1 + i));
    BT_CHECK(dh && h2d(dh, hv, sizeof hv), "h2d");
    BT_CHECK_OK(braid_all_reduce(c, dh, 7, BRAID_F16, ops[k]), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(d2h(hg, dh, sizeof hg), "d2h");
    for (int i = 0; i < 7; i++) {
      float want = (float)(n * (n + 1) / 2 + n * i);
      want = k == 1 ? want / n : k == 2 ? want * half : want;
      BT_CHECK(braid__f16_to_f32(hg[i]) == want, "f16 all-reduce op %d [%d]: %g, want %g", k, i,
               braid__f16_to_f32(hg[i]), want);
    }
  }
  BT_CHECK_OK(braid_op_destroy(c, ops[2]), c);
  cu.free_(dh);
  cu.free_(d);
  cu.free_(e);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

static int test_hier(void) {
  if (!libs_ready()) return BT_SKIP;
  /* On the real libraries every rank of a node needs a GPU of its own. */
  static const char *const layouts[] = {"ab", "aabb", "aaab", "abab"};
  /* The second time the between-node stages go in pieces of 1000 bytes, an
     uneven last piece included, so the pieces' copies overlap. */
  static const char *const plain[] = {"BRAID_HIER_INTRA=nccl", "BRAID_HIER_INTER=tcp", NULL};
  static const char *const pieces[] = {"BRAID_HIER_INTRA=nccl", "BRAID_HIER_INTER=tcp", "BRAID_HIER_PIECE=1000", NULL};
  int ran = 0;
  for (size_t i = 0; i < 2 * BT_COUNT(layouts); i++) {
    int in_pieces = i >= BT_COUNT(layouts);
    const char *layout = layouts[i % BT_COUNT(layouts)];
    int n = (int)strlen(layout), biggest = 0;
    for (int r = 0; r < n; r++) {
      int k = 0;
      for (int q = 0; q < n; q++) k += layout[q] == layout[r];
      biggest = k > biggest ? k : biggest;
    }
    if (real_mode() && gpus() < biggest) continue;
    double t0 = now_s();
    /* one call per list: the compiler sees where each ends */
    if (in_pieces ? run_env(n, 240, pieces, body_hier, (void *)layout, 1, NULL)
                  : run_env(n, 240, plain, body_hier, (void *)layout, 1, NULL))
      return 1;
    printf("  layout %s%s: %.2f s\n", layout, in_pieces ? " in pieces" : "", now_s() - t0);
    ran++;
  }
  if (!real_mode() || gpus() >= 2) {
    static const char *const timed[] = {"BRAID_HIER_INTRA=nccl", "BRAID_TIMEOUT=20", NULL};
    double t0 = now_s();
    if (run_env(4, 120, timed, body_hier_order, NULL, 1, NULL)) return 1;
    printf("  order across parts: %.2f s\n", now_s() - t0);
  }
  return ran ? 0 : BT_SKIP;
}

/* A rank killed on node b: every rank on both nodes gets PEER_LOST naming it. */
typedef struct hk_arg {
  const char *nodes;  /* each rank's node id */
  _Atomic int *synced; /* shared by the forked ranks: how many survivors finished the first sync */
} hk_arg;

static int body_hier_killed(braid_comm *unused, int rank, int n, void *arg_) {
  (void)unused;
  NEED_CUDA();
  const hk_arg *arg = arg_;
  char id[2] = {arg->nodes[rank], 0};
  setenv("BRAID_NODE_ID", id, 1);
  setenv("BRAID_BACKEND", "hier", 1);
  braid_comm *c = NULL;
  BT_CHECK(braid_init(NULL, &c) == BRAID_OK, "init: %s", braid_last_error(NULL));
  /* An all-gather first: device scratch exists when the rank dies, and the
     survivors' destroy must not free it under the stuck stream. */
  const size_t cnt = 1 << 16;
  float *sd = dev_alloc(cnt * 4), *rd = dev_alloc(cnt * 4 * (size_t)n);
  BT_CHECK(sd && rd, "cudaMalloc");
  BT_CHECK_OK(braid_all_gather(c, sd, rd, cnt, BRAID_F32), c);
  BT_CHECK_OK(braid_sync(c), c);
  /* The victim dies only once the others are out of the first sync: one
     still waiting in it could see the death first and fail the call this
     test expects to succeed. */
  if (rank != n - 1) {
    atomic_fetch_add(arg->synced, 1);
  } else {
    (void)bt_await(arg->synced, n - 1, 30);
    raise(SIGKILL);
  }
  braid_status st = braid_all_gather(c, sd, rd, cnt, BRAID_F32);
  if (!st) st = braid_sync(c);
  BT_CHECK(st == BRAID_ERR_PEER_LOST, "rank %d: %s: %s", rank, braid_status_string(st), braid_last_error(c));
  braid_destroy(c);
  struct timespec ts = {0, 300 * 1000 * 1000}; /* the stream's abandoned copies end meanwhile */
  nanosleep(&ts, NULL);
  return 0;
}

static int test_hier_killed(void) {
  if (!libs_ready() || injects_failures()) return BT_SKIP;
  bt_rank_result res[4];
  const char *env[] = {env_nccl, env_cudart, "BRAID_TIMEOUT=60", "BRAID_HIER_INTRA=nccl", NULL};
  bt_run_opts o = {"nccl", 4, 60, env, 3};
  _Atomic int *synced = bt_shared_counter();
  BT_CHECK(synced, "cannot map a shared counter");
  hk_arg arg = {"aabb", synced};
  bt_run_ranks_manual(&o, body_hier_killed, &arg, res);
  bt_shared_free(synced);
  for (int r = 0; r < 3; r++) BT_CHECK(res[r].exited && res[r].code == 0, "rank %d failed", r);
  return 0;
}

/* A CUDA fault while hier waits for a piece's copy (the stream's errors
   are sticky): the rank fails with the node part's sentence as a backend
   error, and the other node's rank learns it instead of waiting. */
static int body_hier_event_fault(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused, (void)arg;
  NEED_CUDA();
  char id[2] = {(char)('a' + rank), 0};
  setenv("BRAID_NODE_ID", id, 1);
  setenv("BRAID_BACKEND", "hier", 1);
  braid_comm *c = NULL;
  BT_CHECK(braid_init(NULL, &c) == BRAID_OK, "init: %s", braid_last_error(NULL));
  const size_t cnt = 100003;
  float *d = dev_alloc(cnt * 4);
  BT_CHECK(d, "cudaMalloc");
  /* One call first, waited for: nothing is left on the stream to look at,
     so the fault shows where hier waits for the first piece. */
  BT_CHECK_OK(braid_all_reduce(c, d, cnt, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  /* Rank 0's fault must come after every rank's sync returned: a rank
     still waiting in it would rightly learn of the failure there. */
  BT_CHECK_OK(braid_barrier(c), c);
  if (rank == 0) {
    struct timespec pause = {0, 100 * 1000 * 1000}; /* the others leave the barrier's last wait */
    nanosleep(&pause, NULL);
    void *lib = dlopen(double_path(), RTLD_NOW | RTLD_NOLOAD);
    void (*fail_events)(int) = lib ? (void (*)(int))dlsym(lib, "braid_nccl_double_fail_events") : NULL;
    BT_CHECK(fail_events, "the test double's fault switch: %s", dlerror());
    fail_events(1);
  }
  double t0 = now_s();
  braid_status st = braid_all_reduce(c, d, cnt, BRAID_F32, BRAID_SUM);
  if (!st) st = braid_sync(c);
  const char *msg = braid_last_error(c);
  if (rank == 0) {
    BT_CHECK(st == BRAID_ERR_BACKEND, "rank 0: %s: %s", braid_status_string(st), msg);
    BT_CHECK(strstr(msg, "node-local part") && strstr(msg, "cudaEventQuery failed: unspecified launch failure"),
             "rank 0's sentence: %s", msg);
  } else {
    BT_CHECK(st == BRAID_ERR_PEER_LOST && strstr(msg, "rank 0"), "rank %d: %s: %s", rank, braid_status_string(st),
             msg);
  }
  BT_CHECK(now_s() - t0 < 10, "rank %d took %.1f s to fail", rank, now_s() - t0);
  (void)n;
  braid_destroy(c);
  return 0;
}

static int test_hier_event_fault(void) {
  if (!libs_ready() || injects_failures()) return BT_SKIP;
  static const char *const extra[] = {"BRAID_HIER_INTRA=nccl", "BRAID_HIER_PIECE=1000", "BRAID_TIMEOUT=30", NULL};
  return run_env(2, 60, extra, body_hier_event_fault, NULL, 1, NULL);
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      BT_CASE(test_missing_pieces),      BT_CASE(test_real_libraries_without_gpu),
      BT_CASE(test_generic_algorithms_refused), {"test_collectives", test_collectives, 300},
      BT_CASE(test_unsupported_reductions), {"test_send_recv", test_send_recv, 300},
      BT_CASE(test_send_recv_mismatch),  BT_CASE(test_collective_mismatch),
      BT_CASE(test_stream_events),       BT_CASE(test_group_and_in_place), BT_CASE(test_split),
      BT_CASE(test_memory),              BT_CASE(test_async_error_run),
      BT_CASE(test_stall_run),           BT_CASE(test_killed_rank),
      BT_CASE(test_abort),               BT_CASE(test_no_leaks),
      BT_CASE(test_gpu_shared),          {"test_hier", test_hier, 900},
      BT_CASE(test_hier_killed),         BT_CASE(test_hier_event_fault),
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
