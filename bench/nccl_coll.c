/*
 * nccl_coll: the same measurement as braid-perf (same options, table, JSON
 * and exact-value check; tools/braid-perf/perf_core.c) calling NCCL
 * directly on one stream, so braid-perf --backend nccl can be put beside
 * NCCL itself:
 *
 *   braidrun -n 8 build/bench/nccl_coll allreduce -b 8 -e 1G -f 2
 *   braidrun -n 8 --backend nccl build/tools/braid-perf/braid-perf allreduce -b 8 -e 1G -f 2
 *
 * The ranks meet through braid on a host backend (whatever braidrun set:
 * shm on one host), which carries the ncclUniqueId and the barriers only.
 * NCCL and the CUDA runtime are opened at run time like braid's backend
 * does (BRAID_NCCL_LIB, BRAID_CUDART_LIB); device = BRAID_CUDA_DEVICE, else
 * the local rank modulo the devices. The communicator is blocking, as an
 * application's usually is; NCCL_COLL_NONBLOCKING=1 makes it non-blocking
 * (config.blocking = 0, calls completed by polling ncclCommGetAsyncError),
 * as braid's backend runs it.
 *
 *   allreduce, reduce_scatter, reduce   ncclAllReduce / ncclReduceScatter / ncclReduce
 *   broadcast, allgather                ncclBroadcast / ncclAllGather (bytes)
 *   sendrecv                            grouped ncclSend to rank+1, ncclRecv from rank-1
 *   barrier                             a one-word ncclAllReduce, waited for
 * Other ops are reported as not applicable.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "braid.h"
#include "nccl_decl.h"
#include "perf_core.h"

static struct {
#define FN(f) __typeof__(&f) f;
  FN(ncclGetUniqueId) FN(ncclCommInitRankConfig) FN(ncclCommDestroy) FN(ncclGetErrorString) FN(ncclAllReduce)
  FN(ncclReduceScatter) FN(ncclReduce) FN(ncclBroadcast) FN(ncclAllGather) FN(ncclSend) FN(ncclRecv)
  FN(ncclGroupStart) FN(ncclGroupEnd) FN(cudaSetDevice) FN(cudaGetDeviceCount) FN(cudaStreamCreateWithFlags)
  FN(cudaStreamSynchronize) FN(cudaMalloc) FN(cudaFree) FN(cudaMemcpy) FN(cudaGetErrorString)
  FN(ncclCommGetAsyncError) FN(cudaDeviceSynchronize)
#undef FN
} X;

static int load(char *err, size_t len) {
  const char *nl = getenv("BRAID_NCCL_LIB"), *cl = getenv("BRAID_CUDART_LIB");
  void *n = dlopen(nl && *nl ? nl : "libnccl.so.2", RTLD_NOW), *c = dlopen(cl && *cl ? cl : "libcudart.so", RTLD_NOW);
  if (!n || !c) {
    snprintf(err, len, "cannot open NCCL or the CUDA runtime: %s", dlerror());
    return 0;
  }
  const char *miss = NULL;
#define R(lib, f) \
  if (!miss && !(*(void **)&X.f = dlsym(lib, #f))) miss = #f;
  R(n, ncclGetUniqueId) R(n, ncclCommInitRankConfig) R(n, ncclCommDestroy) R(n, ncclGetErrorString) R(n, ncclAllReduce)
  R(n, ncclReduceScatter) R(n, ncclReduce) R(n, ncclBroadcast) R(n, ncclAllGather) R(n, ncclSend) R(n, ncclRecv)
  R(n, ncclGroupStart) R(n, ncclGroupEnd) R(c, cudaSetDevice) R(c, cudaGetDeviceCount)
  R(c, cudaStreamCreateWithFlags) R(c, cudaStreamSynchronize) R(c, cudaMalloc) R(c, cudaFree) R(c, cudaMemcpy)
  R(c, cudaGetErrorString) R(n, ncclCommGetAsyncError)
#undef R
  *(void **)&X.cudaDeviceSynchronize = dlsym(c, "cudaDeviceSynchronize"); /* optional: the test double has none */
  if (miss) snprintf(err, len, "symbol %s missing", miss);
  return !miss;
}

typedef struct nctx {
  braid_comm *host; /* bootstrap and barriers */
  void *word;       /* device word of the barrier's all-reduce */
  ncclComm_t comm;
  cudaStream_t stream;
  int rank, size;
  char err[512];
} nctx;

static int n_check(nctx *x, ncclResult_t rc, const char *call) {
  while (rc == ncclInProgress && x->comm) { /* a non-blocking communicator's call still being enqueued */
    ncclResult_t as = ncclSuccess, q = X.ncclCommGetAsyncError(x->comm, &as);
    rc = q != ncclSuccess ? q : as;
  }
  if (rc == ncclSuccess) return 0;
  snprintf(x->err, sizeof x->err, "%s: %s", call, X.ncclGetErrorString(rc));
  return 1;
}

static int n_type(braid_dtype dt, ncclDataType_t *t) {
  switch (dt) {
  case BRAID_F64: *t = ncclFloat64; return 1;
  case BRAID_F32: *t = ncclFloat32; return 1;
  case BRAID_F16: *t = ncclFloat16; return 1;
  case BRAID_BF16: *t = ncclBfloat16; return 1;
  case BRAID_I64: *t = ncclInt64; return 1;
  case BRAID_I32: *t = ncclInt32; return 1;
  case BRAID_I8: *t = ncclInt8; return 1;
  case BRAID_U64: *t = ncclUint64; return 1;
  case BRAID_U32: *t = ncclUint32; return 1;
  case BRAID_U8: *t = ncclUint8; return 1;
  default: return 0;
  }
}

static int n_op(braid_op op, ncclRedOp_t *o) {
  switch (op) {
  case BRAID_SUM: *o = ncclSum; return 1;
  case BRAID_PROD: *o = ncclProd; return 1;
  case BRAID_MIN: *o = ncclMin; return 1;
  case BRAID_MAX: *o = ncclMax; return 1;
  case BRAID_AVG: *o = ncclAvg; return 1;
  default: return 0;
  }
}

static unsigned n_placements(void *ctx, perf_op op) {
  (void)ctx;
  switch (op) {
  case PERF_ALLREDUCE: case PERF_ALLGATHER: case PERF_REDUCE_SCATTER: case PERF_REDUCE: return PERF_OOP | PERF_INPLACE;
  case PERF_BROADCAST: return PERF_INPLACE;
  case PERF_SENDRECV: return PERF_OOP;
  default: return 0;
  }
}

static const char *n_unsupported(void *ctx, perf_op op, braid_dtype dt, braid_op rop) {
  (void)ctx;
  ncclDataType_t t;
  ncclRedOp_t o;
  int reduces = op == PERF_ALLREDUCE || op == PERF_REDUCE_SCATTER || op == PERF_REDUCE;
  if (reduces && (!n_type(dt, &t) || !n_op(rop, &o))) return "NCCL has no such dtype/op pair";
  return NULL;
}

static int n_run(void *ctx, perf_op op, const void *send, void *recv, size_t count, braid_dtype dt, braid_op rop,
                 int root, int inplace) {
  nctx *x = ctx;
  (void)inplace;
  ncclDataType_t t = ncclUint8;
  ncclRedOp_t o = ncclSum;
  size_t bytes = count * perf_dtype_size(dt);
  n_type(dt, &t);
  n_op(rop, &o);
  switch (op) {
  case PERF_ALLREDUCE: return n_check(x, X.ncclAllReduce(send, recv, count, t, o, x->comm, x->stream), "ncclAllReduce");
  case PERF_REDUCE_SCATTER:
    return n_check(x, X.ncclReduceScatter(send, recv, count, t, o, x->comm, x->stream), "ncclReduceScatter");
  case PERF_REDUCE: return n_check(x, X.ncclReduce(send, recv, count, t, o, root, x->comm, x->stream), "ncclReduce");
  case PERF_BROADCAST:
    return n_check(x, X.ncclBroadcast(send, recv, bytes, ncclUint8, root, x->comm, x->stream), "ncclBroadcast");
  case PERF_ALLGATHER:
    return n_check(x, X.ncclAllGather(send, recv, bytes, ncclUint8, x->comm, x->stream), "ncclAllGather");
  case PERF_SENDRECV: {
    ncclResult_t rc = X.ncclGroupStart();
    if (rc == ncclSuccess) rc = X.ncclSend(send, bytes, ncclUint8, (x->rank + 1) % x->size, x->comm, x->stream);
    if (rc == ncclSuccess)
      rc = X.ncclRecv(recv, bytes, ncclUint8, (x->rank - 1 + x->size) % x->size, x->comm, x->stream);
    ncclResult_t end = X.ncclGroupEnd();
    if (n_check(x, rc == ncclSuccess ? end : rc, "ncclSend/ncclRecv")) return 1;
    return n_check(x, X.cudaStreamSynchronize(x->stream) ? ncclUnhandledCudaError : ncclSuccess,
                   "cudaStreamSynchronize");
  }
  case PERF_BARRIER: /* as braid's nccl backend does it: a one-word all-reduce, waited for */
    if (n_check(x, X.ncclAllReduce(x->word, x->word, 1, ncclUint32, ncclMax, x->comm, x->stream), "ncclAllReduce"))
      return 1;
    return n_check(x, X.cudaStreamSynchronize(x->stream) ? ncclUnhandledCudaError : ncclSuccess,
                   "cudaStreamSynchronize");
  default: snprintf(x->err, sizeof x->err, "not measured here"); return 1;
  }
}

static int n_complete(void *ctx) {
  nctx *x = ctx;
  cudaError_t e = X.cudaStreamSynchronize(x->stream);
  if (e) snprintf(x->err, sizeof x->err, "cudaStreamSynchronize: %s", X.cudaGetErrorString(e));
  return e != cudaSuccess;
}

static int n_barrier(void *ctx) {
  nctx *x = ctx;
  if (n_complete(ctx)) return 1;
  braid_status st = braid_barrier(x->host);
  if (st) snprintf(x->err, sizeof x->err, "%s", braid_last_error(x->host));
  return st != BRAID_OK;
}

static const char *n_last_error(void *ctx) { return ((nctx *)ctx)->err; }

static void *n_mem_alloc(void *ctx, size_t bytes) {
  void *p = NULL;
  cudaError_t e = X.cudaMalloc(&p, bytes);
  if (e) snprintf(((nctx *)ctx)->err, sizeof ((nctx *)ctx)->err, "cudaMalloc: %s", X.cudaGetErrorString(e));
  return e ? NULL : p;
}

static void n_mem_free(void *ctx, void *p) {
  (void)ctx;
  X.cudaFree(p);
}

/* Synchronous copies, then the whole device: cudaMemcpy from pageable memory
   may return before its DMA is done, and nothing else orders it before work
   on the non-blocking stream. */
static int n_copy(void *ctx, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k) {
  cudaError_t e = X.cudaMemcpy(dst, src, bytes, k);
  if (e == cudaSuccess && X.cudaDeviceSynchronize) e = X.cudaDeviceSynchronize();
  if (e) snprintf(((nctx *)ctx)->err, sizeof ((nctx *)ctx)->err, "cudaMemcpy: %s", X.cudaGetErrorString(e));
  return e != cudaSuccess;
}
static int n_to_device(void *ctx, void *d, const void *h, size_t b) { return n_copy(ctx, d, h, b, cudaMemcpyHostToDevice); }
static int n_to_host(void *ctx, void *h, const void *d, size_t b) { return n_copy(ctx, h, d, b, cudaMemcpyDeviceToHost); }

int main(int argc, char **argv) {
  const char *rv = getenv("BRAID_RANK");
  perf_args a;
  int rc = perf_parse_args(argc, argv, &a, "nccl_coll", rv && strcmp(rv, "0") != 0);
  if (rc >= 0) return rc;
  nctx x;
  memset(&x, 0, sizeof x);
  if (!load(x.err, sizeof x.err)) {
    fprintf(stderr, "nccl_coll: %s\n", x.err);
    return PERF_EXIT_ERROR;
  }
  if (braid_init(NULL, &x.host) != BRAID_OK) {
    fprintf(stderr, "nccl_coll: %s\n", braid_last_error(NULL));
    return PERF_EXIT_ERROR;
  }
  x.rank = braid_rank(x.host);
  x.size = braid_world_size(x.host);
  int ndev = 0;
  const char *dv = getenv("BRAID_CUDA_DEVICE"), *lr = getenv("BRAID_LOCAL_RANK");
  if (X.cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    fprintf(stderr, "nccl_coll (rank %d): no CUDA device\n", x.rank);
    return PERF_EXIT_ERROR;
  }
  X.cudaSetDevice(dv ? atoi(dv) : (lr ? atoi(lr) : 0) % ndev);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER; /* blocking: as an application calls NCCL */
  const char *nb = getenv("NCCL_COLL_NONBLOCKING");
  if (nb && *nb == '1') cfg.blocking = 0;
  if (x.rank == 0 && n_check(&x, X.ncclGetUniqueId(&id), "ncclGetUniqueId")) {
    fprintf(stderr, "nccl_coll: %s\n", x.err);
    return PERF_EXIT_ERROR;
  }
  if (braid_broadcast(x.host, &id, sizeof id, BRAID_U8, 0) || braid_sync(x.host) ||
      n_check(&x, X.ncclCommInitRankConfig(&x.comm, x.size, id, x.rank, &cfg), "ncclCommInitRankConfig") ||
      X.cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking) != cudaSuccess ||
      X.cudaMalloc(&x.word, 64) != cudaSuccess) {
    fprintf(stderr, "nccl_coll (rank %d): %s%s\n", x.rank, x.err, x.err[0] ? "" : braid_last_error(x.host));
    return PERF_EXIT_ERROR;
  }
  perf_layer L = {
      .backend = "nccl-direct",
      .library = "NCCL (called directly)",
      .rank = x.rank,
      .nranks = x.size,
      .ctx = &x,
      .placements = n_placements,
      .unsupported = n_unsupported,
      .run = n_run,
      .complete = n_complete,
      .barrier = n_barrier,
      .last_error = n_last_error,
      .rs_inplace_result_at_start = 0,
      .mem_alloc = n_mem_alloc,
      .mem_free = n_mem_free,
      .to_device = n_to_device,
      .to_host = n_to_host,
  };
  rc = perf_run(&a, &L);
  X.cudaFree(x.word);
  X.ncclCommDestroy(x.comm);
  braid_destroy(x.host);
  return rc;
}
