/*
 * braid-perf: nccl-tests-style benchmark of braid's collectives.
 *
 *   braidrun -n 4 braid-perf allreduce -b 8 -e 64M -f 4
 *
 * Uses only the public API: braid_init(NULL, ...) takes backend, rank and
 * world size from the environment set by the launcher. The measurement and
 * output logic is shared with the MPI and Gloo harnesses in bench/
 * (perf_core.c), so their numbers are defined identically.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "braid.h"
#include "perf_core.h"

#define SENDRECV_TAG 0x7e5du

typedef struct bctx {
  braid_comm *c;
  char err[512];
  braid_op premul[64]; /* by dtype code: the scaled sum by 2 of -o premulsum, once made */
  unsigned char have_premul[64];
  size_t *a2av, a2av_count; /* all-to-allv counts and displacements for a2av_count */
} bctx;

/* 2 in dtype dt (every braid dtype but bool has it exactly). */
static void two_in(braid_dtype dt, unsigned char *out) {
  memset(out, 0, 16);
  switch (dt) {
  case BRAID_F64: case BRAID_C128: { double v = 2; memcpy(out, &v, 8); break; }
  case BRAID_F32: case BRAID_C64: { float v = 2; memcpy(out, &v, 4); break; }
  case BRAID_F16: case BRAID_BF16: out[1] = 0x40; break;
  case BRAID_FP8_E4M3: case BRAID_FP8_E5M2: out[0] = 0x40; break;
  default: out[0] = 2; break; /* integers, little-endian */
  }
}

static int b_check(bctx *b, braid_status st);

/* The scaled sum by 2 for dt in *op (made on first use); 0 or -1. */
static int premul_of(bctx *b, braid_dtype dt, braid_op *op) {
  if ((unsigned)dt >= 64) return b_check(b, BRAID_ERR_INVALID_ARG);
  if (!b->have_premul[dt]) {
    unsigned char two[16];
    two_in(dt, two);
    if (b_check(b, braid_op_premul_sum(b->c, two, dt, &b->premul[dt]))) return -1;
    b->have_premul[dt] = 1;
  }
  *op = b->premul[dt];
  return 0;
}

/* perf_a2av_counts for count, computed once per size. */
static const size_t *a2av_of(bctx *b, size_t count) {
  int n = braid_world_size(b->c);
  if (!b->a2av) {
    b->a2av = malloc(4 * (size_t)n * sizeof *b->a2av);
    if (!b->a2av) return NULL;
    b->a2av_count = (size_t)-1;
  }
  if (b->a2av_count != count) {
    perf_a2av_counts(braid_rank(b->c), n, count, b->a2av, b->a2av + n, b->a2av + 2 * n, b->a2av + 3 * n);
    b->a2av_count = count;
  }
  return b->a2av;
}

static const char *b_last_error(void *ctx) {
  bctx *b = ctx;
  return b->err[0] ? b->err : braid_last_error(b->c);
}

static int b_check(bctx *b, braid_status st) {
  if (st == BRAID_OK) return 0;
  snprintf(b->err, sizeof b->err, "%s (%s)", braid_last_error(b->c), braid_status_string(st));
  return -1;
}

/* The backend's kind of memory: device memory on a GPU backend. */
static void *b_mem_alloc(void *ctx, size_t bytes) {
  void *p = NULL;
  return b_check(ctx, braid_comm_mem_alloc(((bctx *)ctx)->c, &p, bytes)) ? NULL : p;
}

static void b_mem_free(void *ctx, void *p) { (void)b_check(ctx, braid_comm_mem_free(((bctx *)ctx)->c, p)); }

/* A backend with a communication stream takes device memory: the checks
   copy through the CUDA runtime braid uses (BRAID_CUDART_LIB), opened here
   too so that braid-perf needs no CUDA at build time. */
enum { H2D = 1, D2H = 2 };
static int (*cuda_memcpy)(void *, const void *, size_t, int);
static int (*cuda_device_sync)(void);

static int open_cudart(void) {
  const char *env = getenv("BRAID_CUDART_LIB");
  const char *names[] = {env && *env ? env : "libcudart.so", "libcudart.so.13", "libcudart.so.12"};
  for (size_t i = 0; i < (env && *env ? 1 : 3); i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    *(void **)&cuda_memcpy = dlsym(h, "cudaMemcpy");
    *(void **)&cuda_device_sync = dlsym(h, "cudaDeviceSynchronize");
    if (cuda_memcpy) return 1;
  }
  return 0;
}

/* Synchronous copies; the device synchronization also orders a pageable
   copy's DMA before the communication stream's next work. */
static int b_copy(void *ctx, void *dst, const void *src, size_t bytes, int kind) {
  bctx *b = ctx;
  int e = cuda_memcpy(dst, src, bytes, kind);
  if (!e && cuda_device_sync) e = cuda_device_sync();
  if (e) snprintf(b->err, sizeof b->err, "cudaMemcpy of %zu bytes failed (CUDA error %d)", bytes, e);
  return e != 0;
}

static int b_to_device(void *ctx, void *dev, const void *host, size_t bytes) {
  return b_copy(ctx, dev, host, bytes, H2D);
}

static int b_to_host(void *ctx, void *host, const void *dev, size_t bytes) {
  return b_copy(ctx, host, dev, bytes, D2H);
}

/* braid_all_reduce and braid_broadcast work in place only; sendrecv needs two
   buffers (a send may still read its buffer until braid_sync). */
static unsigned b_placements(void *ctx, perf_op op) {
  (void)ctx;
  switch (op) {
  case PERF_ALLREDUCE:
  case PERF_BROADCAST: return PERF_INPLACE;
  case PERF_ALLGATHER:
  case PERF_REDUCE_SCATTER:
  case PERF_REDUCE:
  case PERF_GATHER:
  case PERF_SCATTER:
  case PERF_ALLTOALL: return PERF_OOP | PERF_INPLACE;
  case PERF_SENDRECV: return PERF_OOP;
  default: return PERF_OOP; /* barrier; all-to-allv: the uneven split is not symmetric, as in place needs */
  }
}

static int b_run(void *ctx, perf_op op, const void *send, void *recv, size_t count, braid_dtype dt, braid_op rop,
                 int root, int inplace) {
  bctx *b = ctx;
  braid_comm *c = b->c;
  (void)inplace; /* placement is expressed by the pointers, as in braid.h */
  if (rop == PERF_PREMULSUM && premul_of(b, dt, &rop)) return -1;
  switch (op) {
  case PERF_ALLREDUCE: return b_check(b, braid_all_reduce(c, recv, count, dt, rop));
  case PERF_BROADCAST: return b_check(b, braid_broadcast(c, recv, count, dt, root));
  case PERF_ALLGATHER: return b_check(b, braid_all_gather(c, send, recv, count, dt));
  case PERF_REDUCE_SCATTER: return b_check(b, braid_reduce_scatter(c, send, recv, count, dt, rop));
  case PERF_SENDRECV: {
    int n = braid_world_size(c), r = braid_rank(c);
    if (b_check(b, braid_recv(c, recv, count, dt, (r - 1 + n) % n, SENDRECV_TAG))) return -1;
    if (b_check(b, braid_send(c, send, count, dt, (r + 1) % n, SENDRECV_TAG))) return -1;
    return b_check(b, braid_sync(c));
  }
  case PERF_BARRIER: return b_check(b, braid_barrier(c));
  case PERF_REDUCE: return b_check(b, braid_reduce(c, send, recv, count, dt, rop, root));
  case PERF_GATHER: return b_check(b, braid_gather(c, send, recv, count, dt, root));
  case PERF_SCATTER: return b_check(b, braid_scatter(c, send, recv, count, dt, root));
  case PERF_ALLTOALL: return b_check(b, braid_all_to_all(c, send, recv, count, dt));
  case PERF_ALLTOALLV: {
    const size_t *v = a2av_of(b, count);
    int n = braid_world_size(c);
    if (!v) {
      snprintf(b->err, sizeof b->err, "out of memory for the all-to-allv counts");
      return -1;
    }
    return b_check(b, braid_all_to_allv(c, send, v, v + n, recv, v + 2 * n, v + 3 * n, dt));
  }
  default: return -1;
  }
}

static int b_complete(void *ctx) {
  bctx *b = ctx;
  return b_check(b, braid_sync(b->c));
}

static int b_barrier(void *ctx) {
  bctx *b = ctx;
  return b_check(b, braid_barrier(b->c));
}

/* Settings of the backend's own variables (BRAID_<BACKEND>_*), which steer
   its choices; nothing else from the environment (BRAID_TOKEN is a secret). */
static void print_backend_settings(const char *be, FILE *out) {
  char prefix[64];
  int len = snprintf(prefix, sizeof prefix, "BRAID_%s_", be);
  if (len <= 0 || (size_t)len >= sizeof prefix) return;
  for (char *p = prefix; *p; p++)
    if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
  int any = 0;
  for (char **e = environ; *e; e++)
    if (!strncmp(*e, prefix, (size_t)len)) {
      fprintf(out, "%s %s", any ? "" : "# settings:", *e);
      any = 1;
    }
  fprintf(out, "%s\n", any ? "" : "# settings: defaults (no BRAID_ variables of this backend set)");
}

static void b_describe(void *ctx, perf_op op, FILE *out) {
  bctx *b = ctx;
  (void)op;
  const char *be = braid_backend(b->c);
  if (!strcmp(be, "self")) {
    fprintf(out, "# algorithm: backend self is one rank: local copy / single-input reduction, no communication\n");
    return;
  }
  /* braid.h has no query for the algorithm or transfer path a backend picks
     per size; the backend's log (BRAID_LOG=info) names what it set up. */
  fprintf(out, "# algorithm: not reported (braid's API does not expose the choice backend %s makes per size;\n"
               "#   BRAID_LOG=info logs what the backend set up at init)\n", be);
  print_backend_settings(be, out);
}

int main(int argc, char **argv) {
  /* Usage errors are printed by rank 0 only (every rank parses the same argv);
     under mpirun the launcher's rank variable says which rank this is. */
  static const char *const rank_vars[] = {"BRAID_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  int quiet = 0;
  for (size_t i = 0; i < sizeof rank_vars / sizeof rank_vars[0]; i++) {
    const char *v = getenv(rank_vars[i]);
    if (v && *v) {
      quiet = strcmp(v, "0") != 0;
      break;
    }
  }
  perf_args a;
  int rc = perf_parse_args(argc, argv, &a, "braid-perf", quiet);
  if (rc >= 0) return rc;

  braid_comm *c = NULL;
  braid_status st = braid_init(NULL, &c);
  if (st != BRAID_OK) {
    /* The message already names the call, e.g. "braid_init: unknown backend ...". */
    fprintf(stderr, "braid-perf: %s (%s)\n", braid_last_error(NULL), braid_status_string(st));
    return PERF_EXIT_ERROR;
  }
  bctx b;
  memset(&b, 0, sizeof b);
  b.c = c;
  char lib[64];
  snprintf(lib, sizeof lib, "braid %s", braid_version());
  perf_layer L = {
      .backend = braid_backend(c),
      .library = lib,
      .rank = braid_rank(c),
      .nranks = braid_world_size(c),
      .ctx = &b,
      .placements = b_placements,
      .unsupported = NULL,
      .run = b_run,
      .complete = b_complete,
      .barrier = b_barrier,
      .last_error = b_last_error,
      .describe = b_describe,
      .rs_inplace_result_at_start = 0,
      .mem_alloc = b_mem_alloc,
      .mem_free = b_mem_free,
  };
  if (braid_has_stream_sync(c)) {
    if (!open_cudart()) {
      fprintf(stderr, "braid-perf: backend %s takes device memory, but the CUDA runtime (BRAID_CUDART_LIB or "
                      "libcudart.so) cannot be opened here: %s\n", braid_backend(c), dlerror());
      braid_destroy(c);
      return PERF_EXIT_ERROR;
    }
    L.to_device = b_to_device;
    L.to_host = b_to_host;
  }
  rc = perf_run(&a, &L);
  free(b.a2av);
  st = braid_destroy(c);
  if (st != BRAID_OK && rc == PERF_EXIT_OK) {
    fprintf(stderr, "braid-perf: %s\n", braid_last_error(NULL));
    rc = PERF_EXIT_ERROR;
  }
  return rc;
}
