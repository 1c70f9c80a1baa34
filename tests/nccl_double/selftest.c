/* Self-test of the NCCL/CUDA test double. The parent re-executes itself
   once per rank ("child MODE RANK NRANKS ID"), so each rank reads the
   double's environment variables afresh. Exit status 0 means all passed. */
#include "nccl_decl.h"
#include "nd_float.h"

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int braid_nccl_double_ops(void);

static int g_rank = -1;
static int g_failures;

#define CHECK(cond)                                                                                                \
  do {                                                                                                             \
    if (!(cond)) {                                                                                                 \
      fprintf(stderr, "rank %d: %s:%d: CHECK failed: %s\n", g_rank, __FILE__, __LINE__, #cond);                  \
      exit(1);                                                                                                     \
    }                                                                                                              \
  } while (0)

#define NCHECK(call) CHECK((call) == ncclSuccess)
#define CCHECK(call) CHECK((call) == cudaSuccess)

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static ncclResult_t poll_async(ncclComm_t c) {
  ncclResult_t r;
  double t0 = now_s();
  for (;;) {
    NCHECK(ncclCommGetAsyncError(c, &r));
    if (r != ncclInProgress) return r;
    CHECK(now_s() - t0 < 60);
    sleep_ms(1);
  }
}

/* ---------------------------------------------------------------- */
/* Reference values and reductions                                   */

static const ncclDataType_t ALL_TYPES[] = {ncclInt8,    ncclUint8,   ncclInt32,    ncclUint32,
                                           ncclInt64,   ncclUint64,  ncclFloat16,  ncclFloat32,
                                           ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};

static size_t tsize(ncclDataType_t t) {
  switch ((int)t) {
  case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  default: return 8;
  }
}

static int is_int(ncclDataType_t t) { return t <= ncclUint64; }
static int is_signed(ncclDataType_t t) { return t == ncclInt8 || t == ncclInt32 || t == ncclInt64; }

static const nd_fmt *mini(ncclDataType_t t) {
  switch ((int)t) {
  case ncclFloat16: return &ND_HALF;
  case ncclBfloat16: return &ND_BF16;
  case ncclFloat8e4m3: return &ND_E4M3;
  case ncclFloat8e5m2: return &ND_E5M2;
  default: return NULL;
  }
}

/* The value rank r contributes at global element j (as a double). */
static double value(ncclDataType_t t, int r, size_t j) {
  static const double sv[] = {-2, -1, 1, 2, 3}, uv[] = {1, 2, 3, 4, 5}, fv[] = {-2, -1, 0.5, 2, 3};
  size_t k = (j * 7 + (size_t)r * 3) % 5;
  if (is_int(t)) return is_signed(t) ? sv[k] : uv[k];
  return fv[k];
}

static void store_d(void *buf, size_t i, ncclDataType_t t, double v) {
  switch ((int)t) {
  case ncclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
  case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  case ncclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
  case ncclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
  case ncclFloat32: ((float *)buf)[i] = (float)v; break;
  case ncclFloat64: ((double *)buf)[i] = v; break;
  case ncclFloat16: case ncclBfloat16: ((uint16_t *)buf)[i] = (uint16_t)nd_from_float((float)v, mini(t)); break;
  default: ((uint8_t *)buf)[i] = (uint8_t)nd_from_float((float)v, mini(t)); break;
  }
}

#define OP_PREMUL 5

/* The scalar of the premul-sum test: 3 for integers, 0.5 for floats. */
static double premul_scalar(ncclDataType_t t) { return is_int(t) ? 3 : 0.5; }

/* Expected reduction of element j over n ranks, written to out[i]. Integers
   wrap in their width; floats accumulate in float (double for float64) in
   rank order and round once. */
static void expect_reduce(void *out, size_t i, ncclDataType_t t, int op, int n, size_t j) {
  if (is_int(t)) {
    int bits = (int)tsize(t) * 8;
    uint64_t mask = bits == 64 ? ~0ull : ((1ull << bits) - 1), s = 0, sc = (uint64_t)(int64_t)premul_scalar(t);
    int64_t best = 0;
    uint64_t ubest = 0;
    for (int r = 0; r < n; r++) {
      double v = value(t, r, j);
      uint64_t u = (uint64_t)(int64_t)v;
      if (r == 0) {
        s = op == OP_PREMUL ? sc * u : u;
        best = (int64_t)v;
        ubest = u;
        continue;
      }
      if (op == ncclSum || op == ncclAvg) s += u;
      if (op == ncclProd) s *= u;
      if (op == OP_PREMUL) s += sc * u;
      if (op == ncclMax && (int64_t)v > best) best = (int64_t)v;
      if (op == ncclMin && (int64_t)v < best) best = (int64_t)v;
      if (op == ncclMax && u > ubest) ubest = u;
      if (op == ncclMin && u < ubest) ubest = u;
    }
    s &= mask;
    if (op == ncclMax || op == ncclMin) {
      if (is_signed(t))
        s = (uint64_t)best & mask;
      else
        s = ubest;
    }
    if (op == ncclAvg) {
      if (is_signed(t)) {
        int64_t v = (int64_t)(s << (64 - bits)) >> (64 - bits); /* sign-extend */
        s = (uint64_t)(v / n) & mask;
      } else {
        s = s / (uint64_t)n;
      }
    }
    memcpy((unsigned char *)out + i * tsize(t), &s, tsize(t)); /* little-endian */
    return;
  }
  if (t == ncclFloat64) {
    double acc = 0;
    for (int r = 0; r < n; r++) {
      double v = value(t, r, j);
      if (r == 0) acc = op == OP_PREMUL ? 0.5 * v : v;
      else if (op == ncclSum || op == ncclAvg) acc += v;
      else if (op == ncclProd) acc *= v;
      else if (op == ncclMax) acc = v > acc ? v : acc;
      else if (op == ncclMin) acc = v < acc ? v : acc;
      else acc += 0.5 * v;
    }
    if (op == ncclAvg) acc /= n;
    ((double *)out)[i] = acc;
  } else {
    float acc = 0;
    for (int r = 0; r < n; r++) {
      /* The inputs went through the datatype, so round them first. */
      unsigned char tmp[8];
      float v;
      store_d(tmp, 0, t, value(t, r, j));
      v = mini(t) ? nd_to_float(tsize(t) == 2 ? *(uint16_t *)tmp : tmp[0], mini(t)) : *(float *)tmp;
      if (r == 0) acc = op == OP_PREMUL ? 0.5f * v : v;
      else if (op == ncclSum || op == ncclAvg) acc += v;
      else if (op == ncclProd) acc *= v;
      else if (op == ncclMax) acc = v > acc ? v : acc;
      else if (op == ncclMin) acc = v < acc ? v : acc;
      else acc += 0.5f * v;
    }
    if (op == ncclAvg) acc /= (float)n;
    store_d(out, i, t, acc);
  }
}

/* ---------------------------------------------------------------- */
/* Collectives                                                       */

enum { C_ALLREDUCE, C_BROADCAST, C_REDUCE, C_ALLGATHER, C_REDUCESCATTER };

static void coll_case(ncclComm_t comm, cudaStream_t st, int kind, ncclDataType_t t, int op, size_t count,
                      int inplace, int rank, int n) {
  size_t es = tsize(t), sendn, recvn;
  int root = (int)(count % (size_t)n);
  unsigned char *sendbuf, *recvbuf, *expect, *buf = NULL;
  ncclRedOp_t rop = (ncclRedOp_t)op;
  int check_recv = 1;
  sendn = kind == C_REDUCESCATTER ? count * (size_t)n : count;
  recvn = kind == C_ALLGATHER ? count * (size_t)n : count;
  if (op == OP_PREMUL) {
    unsigned char sc[8];
    store_d(sc, 0, t, premul_scalar(t));
    NCHECK(ncclRedOpCreatePreMulSum(&rop, sc, t, ncclScalarHostImmediate, comm));
    CHECK((int)rop >= ncclNumOps);
  }
  expect = malloc(recvn * es + 1);
  if (inplace) {
    size_t big = sendn > recvn ? sendn : recvn;
    CCHECK(cudaMalloc((void **)&buf, big * es));
    sendbuf = kind == C_ALLGATHER ? buf + (size_t)rank * count * es : buf;
    recvbuf = kind == C_REDUCESCATTER ? buf + (size_t)rank * count * es : buf;
  } else {
    CCHECK(cudaMalloc((void **)&sendbuf, sendn * es));
    CCHECK(cudaMalloc((void **)&recvbuf, recvn * es));
    memset(recvbuf, 0xab, recvn * es);
  }
  for (size_t j = 0; j < sendn; j++) store_d(sendbuf, j, t, value(t, rank, j));
  if (kind == C_BROADCAST && rank != root && inplace)
    memset(buf, 0xcd, count * es); /* non-root send data must not matter */
  switch (kind) {
  case C_ALLREDUCE:
    NCHECK(ncclAllReduce(sendbuf, recvbuf, count, t, rop, comm, st));
    for (size_t i = 0; i < count; i++) expect_reduce(expect, i, t, op, n, i);
    break;
  case C_REDUCE:
    NCHECK(ncclReduce(sendbuf, recvbuf, count, t, rop, root, comm, st));
    if (rank == root)
      for (size_t i = 0; i < count; i++) expect_reduce(expect, i, t, op, n, i);
    else if (!inplace)
      memset(expect, 0xab, count * es); /* untouched on non-roots */
    else
      check_recv = 0;
    break;
  case C_BROADCAST:
    NCHECK(ncclBroadcast(sendbuf, recvbuf, count, t, root, comm, st));
    for (size_t i = 0; i < count; i++) store_d(expect, i, t, value(t, root, i));
    break;
  case C_ALLGATHER:
    NCHECK(ncclAllGather(sendbuf, recvbuf, count, t, comm, st));
    for (int r = 0; r < n; r++)
      for (size_t i = 0; i < count; i++) store_d(expect, (size_t)r * count + i, t, value(t, r, i));
    break;
  case C_REDUCESCATTER:
    NCHECK(ncclReduceScatter(sendbuf, recvbuf, count, t, rop, comm, st));
    for (size_t i = 0; i < count; i++) expect_reduce(expect, i, t, op, n, (size_t)rank * count + i);
    break;
  }
  CCHECK(cudaStreamSynchronize(st));
  CHECK(cudaStreamQuery(st) == cudaSuccess);
  CHECK(poll_async(comm) == ncclSuccess);
  if (check_recv && memcmp(recvbuf, expect, recvn * es) != 0) {
    size_t i = 0;
    while (memcmp(recvbuf + i * es, expect + i * es, es) == 0) i++;
    fprintf(stderr, "rank %d: kind %d type %d op %d count %zu inplace %d: element %zu differs\n", rank, kind, (int)t,
            op, count, inplace, i);
    exit(1);
  }
  if (op == OP_PREMUL) NCHECK(ncclRedOpDestroy(rop, comm));
  if (inplace) {
    CCHECK(cudaFree(buf));
  } else {
    CCHECK(cudaFree(sendbuf));
    CCHECK(cudaFree(recvbuf));
  }
  free(expect);
}

static void all_collectives(ncclComm_t comm, cudaStream_t st, int rank, int n) {
  static const size_t counts[] = {1, 7};
  for (size_t ti = 0; ti < sizeof ALL_TYPES / sizeof *ALL_TYPES; ti++)
    for (size_t ci = 0; ci < 2; ci++)
      for (int inplace = 0; inplace < 2; inplace++)
        for (int kind = C_ALLREDUCE; kind <= C_REDUCESCATTER; kind++) {
          int reduces = kind == C_ALLREDUCE || kind == C_REDUCE || kind == C_REDUCESCATTER;
          for (int op = 0; op <= (reduces ? OP_PREMUL : 0); op++)
            coll_case(comm, st, kind, ALL_TYPES[ti], op, counts[ci], inplace, rank, n);
        }
  /* Large odd counts: several staging chunks. */
  for (int kind = C_ALLREDUCE; kind <= C_REDUCESCATTER; kind++) {
    coll_case(comm, st, kind, ncclFloat32, ncclSum, 1000003, 0, rank, n);
    coll_case(comm, st, kind, ncclBfloat16, ncclAvg, 1000003, 1, rank, n);
  }
  coll_case(comm, st, C_ALLREDUCE, ncclInt8, ncclProd, 1000003, 1, rank, n);
  coll_case(comm, st, C_REDUCESCATTER, ncclUint64, ncclMax, 1000003, 1, rank, n);
}

/* ---------------------------------------------------------------- */
/* Point-to-point                                                    */

static size_t pair_count(int src, int dst) { return 300000 + 13 * (size_t)src + 7 * (size_t)dst; }

static int32_t pair_value(int src, int dst, size_t i) { return (int32_t)(i * 31 + (size_t)src * 1000 + (size_t)dst); }

static void p2p_tests(ncclComm_t comm, cudaStream_t st, cudaStream_t st2, int rank, int n) {
  int32_t **sb = calloc((size_t)n, sizeof *sb), **rb = calloc((size_t)n, sizeof *rb);
  /* All-to-all with distinct sizes per pair, self included, in one group. */
  NCHECK(ncclGroupStart());
  for (int p = 0; p < n; p++) {
    sb[p] = malloc(pair_count(rank, p) * 4);
    rb[p] = malloc(pair_count(p, rank) * 4);
    for (size_t i = 0; i < pair_count(rank, p); i++) sb[p][i] = pair_value(rank, p, i);
    NCHECK(ncclSend(sb[p], pair_count(rank, p), ncclInt32, p, comm, st));
    NCHECK(ncclRecv(rb[p], pair_count(p, rank), ncclInt32, p, comm, st));
  }
  NCHECK(ncclGroupEnd());
  CCHECK(cudaStreamSynchronize(st));
  CHECK(poll_async(comm) == ncclSuccess);
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < pair_count(p, rank); i++) CHECK(rb[p][i] == pair_value(p, rank, i));

  /* Ring, recv issued before send, sends and recvs on different streams of
     one group; two messages to the same peer arrive in order. */
  {
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    size_t big = 3 * 1024 * 1024 + 5, small = 1001;
    unsigned char *s1 = malloc(big), *s2 = malloc(small), *r1 = malloc(big), *r2 = malloc(small);
    for (size_t i = 0; i < big; i++) s1[i] = (unsigned char)(i * 13 + (size_t)rank);
    for (size_t i = 0; i < small; i++) s2[i] = (unsigned char)(i * 5 + (size_t)rank + 1);
    NCHECK(ncclGroupStart());
    NCHECK(ncclGroupStart()); /* nested */
    NCHECK(ncclRecv(r1, big, ncclUint8, prev, comm, st2));
    NCHECK(ncclRecv(r2, small, ncclUint8, prev, comm, st2));
    NCHECK(ncclGroupEnd());
    NCHECK(ncclSend(s1, big, ncclUint8, next, comm, st));
    NCHECK(ncclSend(s2, small, ncclUint8, next, comm, st));
    NCHECK(ncclGroupEnd());
    CCHECK(cudaStreamSynchronize(st));
    CCHECK(cudaStreamSynchronize(st2));
    for (size_t i = 0; i < big; i++) CHECK(r1[i] == (unsigned char)(i * 13 + (size_t)prev));
    for (size_t i = 0; i < small; i++) CHECK(r2[i] == (unsigned char)(i * 5 + (size_t)prev + 1));
    free(s1), free(s2), free(r1), free(r2);
  }

  /* Outside a group: a small send completes on its own. */
  if (n >= 2 && rank < 2) {
    double v[5] = {1, 2, 3, 4, 5}, w[5] = {0};
    if (rank == 0)
      NCHECK(ncclSend(v, 5, ncclFloat64, 1, comm, st));
    else
      NCHECK(ncclRecv(w, 5, ncclFloat64, 0, comm, st));
    CCHECK(cudaStreamSynchronize(st));
    if (rank == 1) CHECK(memcmp(v, w, sizeof v) == 0);
  }
  for (int p = 0; p < n; p++) free(sb[p]), free(rb[p]);
  free(sb), free(rb);
}

/* Mismatched send/recv sizes: the receiver's comm reports ncclInvalidUsage
   and nothing past its buffer is written. */
static void mismatch_test(ncclComm_t world, cudaStream_t st, int rank) {
  ncclComm_t c;
  int32_t sbuf[100], rbuf[60];
  NCHECK(ncclCommSplit(world, 0, 0, &c, NULL));
  for (int i = 0; i < 100; i++) sbuf[i] = i + 1;
  for (int i = 0; i < 60; i++) rbuf[i] = -7;
  if (rank == 0) NCHECK(ncclSend(sbuf, 100, ncclInt32, 1, c, st));
  if (rank == 1) NCHECK(ncclRecv(rbuf, 50, ncclInt32, 0, c, st));
  CCHECK(cudaStreamSynchronize(st));
  if (rank == 1) {
    ncclResult_t r;
    NCHECK(ncclCommGetAsyncError(c, &r));
    CHECK(r == ncclInvalidUsage);
    CHECK(strstr(ncclGetLastError(c), "expected") != NULL);
    for (int i = 0; i < 50; i++) CHECK(rbuf[i] == i + 1);
    for (int i = 50; i < 60; i++) CHECK(rbuf[i] == -7);
  } else {
    CHECK(poll_async(c) == ncclSuccess);
  }
  /* Receive larger than the send. */
  for (int i = 0; i < 60; i++) rbuf[i] = -7;
  if (rank == 1) NCHECK(ncclSend(sbuf, 10, ncclInt32, 0, c, st));
  if (rank == 0) NCHECK(ncclRecv(rbuf, 20, ncclInt32, 1, c, st));
  CCHECK(cudaStreamSynchronize(st));
  if (rank == 0) {
    ncclResult_t r;
    NCHECK(ncclCommGetAsyncError(c, &r));
    CHECK(r == ncclInvalidUsage);
    for (int i = 0; i < 10; i++) CHECK(rbuf[i] == i + 1);
    for (int i = 20; i < 60; i++) CHECK(rbuf[i] == -7);
  }
  NCHECK(ncclCommDestroy(c));
}

static void split_test(ncclComm_t world, cudaStream_t st, int rank, int n) {
  ncclComm_t c;
  int color = (n > 2 && rank == n - 1) ? NCCL_SPLIT_NOCOLOR : rank % 2;
  int32_t v = rank, sum = 0, members = 0;
  NCHECK(ncclCommSplit(world, color, -rank, &c, NULL));
  if (color == NCCL_SPLIT_NOCOLOR) {
    CHECK(c == NULL);
    return;
  }
  CHECK(c != NULL);
  for (int r = 0; r < n; r++)
    if (!(n > 2 && r == n - 1) && r % 2 == color) sum += r, members++;
  NCHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, c, st));
  CCHECK(cudaStreamSynchronize(st));
  CHECK(v == sum);
  /* key = -rank: the highest old rank comes first. */
  {
    int32_t mine = rank, *all = malloc(sizeof *all * (size_t)members);
    NCHECK(ncclAllGather(&mine, all, 1, ncclInt32, c, st));
    CCHECK(cudaStreamSynchronize(st));
    for (int i = 1; i < members; i++) CHECK(all[i] < all[i - 1]);
    free(all);
  }
  NCHECK(ncclCommFinalize(c));
  NCHECK(ncclCommDestroy(c));
}

/* ---------------------------------------------------------------- */
/* Streams and events (no communicator)                              */

typedef struct {
  int ms;
  volatile int *flag;
  int value;
} host_arg;

static void host_fn(void *p) {
  host_arg *a = p;
  sleep_ms(a->ms);
  if (a->flag) *a->flag = a->value;
}

static void stream_tests(void) {
  cudaStream_t a, b;
  cudaEvent_t ev, never;
  volatile int flag = 0;
  int copy = 0;
  host_arg slow = {150, &flag, 42}, slower = {400, NULL, 0};
  CCHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CCHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  CCHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CCHECK(cudaEventCreateWithFlags(&never, cudaEventDisableTiming));
  CHECK(cudaEventQuery(never) == cudaSuccess);
  CCHECK(cudaEventRecord(ev, a)); /* idle stream: complete at once */
  CHECK(cudaEventQuery(ev) == cudaSuccess);
  CCHECK(cudaLaunchHostFunc(a, host_fn, &slow));
  CCHECK(cudaEventRecord(ev, a));
  CHECK(cudaEventQuery(ev) == cudaErrorNotReady);
  CHECK(cudaStreamQuery(a) == cudaErrorNotReady);
  CCHECK(cudaStreamWaitEvent(b, ev, 0));
  CCHECK(cudaMemcpyAsync(&copy, (const void *)&flag, sizeof copy, cudaMemcpyDeviceToDevice, b));
  /* A later record must not extend the wait already enqueued. */
  CCHECK(cudaLaunchHostFunc(a, host_fn, &slower));
  CCHECK(cudaEventRecord(ev, a));
  CCHECK(cudaStreamSynchronize(b));
  CHECK(copy == 42);
  CHECK(cudaStreamQuery(a) == cudaErrorNotReady);
  CHECK(cudaEventQuery(ev) == cudaErrorNotReady);
  CCHECK(cudaStreamSynchronize(a));
  CHECK(cudaEventQuery(ev) == cudaSuccess);
  /* The NULL stream works like any other; cudaMemcpy waits for it. */
  flag = 0;
  slow.value = 7;
  CCHECK(cudaLaunchHostFunc(NULL, host_fn, &slow));
  CCHECK(cudaMemcpy(&copy, (const void *)&flag, sizeof copy, cudaMemcpyDefault));
  CHECK(copy == 7);
  CHECK(cudaStreamQuery(NULL) == cudaSuccess);
  /* Destroying a busy stream waits for its work. */
  flag = 0;
  CCHECK(cudaLaunchHostFunc(a, host_fn, &slow));
  CCHECK(cudaEventRecord(ev, a));
  CCHECK(cudaStreamDestroy(a));
  CHECK(flag == 7);
  CHECK(cudaEventQuery(ev) == cudaSuccess); /* its stream is gone */
  CCHECK(cudaEventDestroy(ev));
  CCHECK(cudaEventDestroy(never));
  CCHECK(cudaStreamDestroy(b));
}

/* ---------------------------------------------------------------- */
/* Modes                                                             */

static ncclComm_t init_comm(ncclUniqueId id, int rank, int n, int blocking) {
  ncclComm_t c;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blocking;
  if (blocking) {
    NCHECK(ncclCommInitRankConfig(&c, n, id, rank, &cfg));
  } else {
    CHECK(ncclCommInitRankConfig(&c, n, id, rank, &cfg) == ncclInProgress);
    CHECK(poll_async(c) == ncclSuccess);
  }
  return c;
}

static void mode_local(void) {
  int n = -1, v;
  void *p, *h;
  ncclUniqueId id;
  ncclComm_t c;
  ncclRedOp_t op;
  float sc = 2;
  CCHECK(cudaGetDeviceCount(&n));
  CHECK(n == 2);
  CHECK(cudaSetDevice(2) == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaSuccess);
  CCHECK(cudaSetDevice(1));
  CCHECK(cudaGetDevice(&v));
  CHECK(v == 1);
  CCHECK(cudaDriverGetVersion(&v));
  CHECK(v == 13000);
  CCHECK(cudaRuntimeGetVersion(&v));
  CHECK(v == 13000);
  CHECK(strcmp(cudaGetErrorString(cudaErrorNoDevice), "no CUDA-capable device is detected") == 0);
  NCHECK(ncclGetVersion(&v));
  CHECK(v == 22800);
  CHECK(strcmp(ncclGetErrorString(ncclInProgress), "NCCL operation in progress") == 0);
  CCHECK(cudaMalloc(&p, 1000));
  CHECK(((uintptr_t)p & 255) == 0);
  CCHECK(cudaFree(p));
  CCHECK(cudaFree(NULL));
  CCHECK(cudaMallocHost(&p, 10));
  CCHECK(cudaFreeHost(p));
  CCHECK(cudaFreeHost(NULL));
  NCHECK(ncclMemAlloc(&p, 77));
  CHECK(((uintptr_t)p & 255) == 0);
  NCHECK(ncclMemFree(p));
  /* Converters. */
  CHECK(nd_from_float(1.0f, &ND_HALF) == 0x3c00);
  CHECK(nd_from_float(65520.0f, &ND_HALF) == 0x7c00);
  CHECK(nd_from_float(1.0f + 1.0f / 2048, &ND_HALF) == 0x3c00); /* tie to even */
  CHECK(nd_from_float(1.0f + 3.0f / 2048, &ND_HALF) == 0x3c02);
  CHECK(nd_from_float(1.0f, &ND_BF16) == 0x3f80);
  CHECK(nd_from_float(1.0f, &ND_E4M3) == 0x38);
  CHECK(nd_from_float(448.0f, &ND_E4M3) == 0x7e);
  CHECK(nd_from_float(1000.0f, &ND_E4M3) == 0x7e);
  CHECK(nd_from_float(1.0f, &ND_E5M2) == 0x3c);
  CHECK(nd_to_float(0x0001, &ND_HALF) == 5.9604644775390625e-08f);
  CHECK(nd_to_float(0x01, &ND_E4M3) == 0.001953125f);
  stream_tests();
  /* Argument validation. */
  NCHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRankConfig(&c, 0, id, 0, NULL) == ncclInvalidArgument);
  CHECK(ncclCommInitRankConfig(&c, 2, id, 2, NULL) == ncclInvalidArgument);
  CHECK(ncclCommInitRankConfig(&c, 2, id, -1, NULL) == ncclInvalidArgument);
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
  /* A single-rank communicator. */
  NCHECK(ncclCommInitRankConfig(&c, 1, id, 0, NULL));
  {
    float x[3] = {1, 2, 3}, y[3];
    CHECK(ncclAllReduce(x, y, 3, (ncclDataType_t)12, ncclSum, c, NULL) == ncclInvalidArgument);
    CHECK(ncclAllReduce(x, y, 3, ncclFloat32, (ncclRedOp_t)5, c, NULL) == ncclInvalidArgument);
    CHECK(ncclBroadcast(x, y, 3, ncclFloat32, 1, c, NULL) == ncclInvalidArgument);
    CHECK(ncclSend(x, 3, ncclFloat32, 1, c, NULL) == ncclInvalidArgument);
    NCHECK(ncclRedOpCreatePreMulSum(&op, &sc, ncclFloat32, ncclScalarHostImmediate, c));
    CHECK(op == (ncclRedOp_t)ncclNumOps);
    CHECK(ncclAllReduce(x, y, 3, ncclFloat64, op, c, NULL) == ncclInvalidArgument); /* wrong type */
    NCHECK(ncclAllReduce(x, y, 3, ncclFloat32, op, c, NULL));
    NCHECK(ncclRedOpDestroy(op, c));
    CHECK(ncclRedOpDestroy(op, c) == ncclInvalidArgument);
    CCHECK(cudaStreamSynchronize(NULL));
    CHECK(y[0] == 2 && y[1] == 4 && y[2] == 6);
    /* Send to self, in a group. */
    NCHECK(ncclGroupStart());
    NCHECK(ncclSend(x, 3, ncclFloat32, 0, c, NULL));
    NCHECK(ncclRecv(y, 3, ncclFloat32, 0, c, NULL));
    NCHECK(ncclGroupEnd());
    CCHECK(cudaStreamSynchronize(NULL));
    CHECK(y[0] == 1 && y[1] == 2 && y[2] == 3);
    CHECK(braid_nccl_double_ops() == 2);
  }
  NCHECK(ncclCommRegister(c, &v, sizeof v, &h));
  NCHECK(ncclCommDeregister(c, h));
  CHECK(ncclCommDeregister(c, h) == ncclInvalidArgument);
  NCHECK(ncclCommRegister(c, &v, sizeof v, &h)); /* freed by destroy */
  CHECK(strcmp(ncclGetLastError(c), "ncclCommDeregister: unknown handle") == 0);
  NCHECK(ncclCommFinalize(c));
  NCHECK(ncclCommDestroy(c));
}

static void mode_coll(ncclUniqueId id, int rank, int n) {
  ncclComm_t c = init_comm(id, rank, n, 1);
  cudaStream_t st, st2;
  CCHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CCHECK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
  all_collectives(c, st, rank, n);
  p2p_tests(c, st, st2, rank, n);
  split_test(c, st, rank, n);
  mismatch_test(c, st, rank);
  CHECK(poll_async(c) == ncclSuccess);
  CHECK(strcmp(ncclGetLastError(c), "") == 0);
  NCHECK(ncclCommFinalize(c));
  NCHECK(ncclCommDestroy(c));
  CCHECK(cudaStreamDestroy(st));
  CCHECK(cudaStreamDestroy(st2));
}

/* Rank 0 runs with BRAID_NCCL_DOUBLE_FAIL_AT=2. */
static void mode_fail(ncclUniqueId id, int rank, int n) {
  ncclComm_t c = init_comm(id, rank, n, 1);
  cudaStream_t st;
  float x = 1;
  double t0;
  CCHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  NCHECK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, c, st));
  CCHECK(cudaStreamSynchronize(st));
  CHECK(x == (float)n);
  NCHECK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, c, st));
  NCHECK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, c, st)); /* queued behind */
  if (rank == 0) {
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < 10000 && r == ncclSuccess; i++) {
      NCHECK(ncclCommGetAsyncError(c, &r));
      if (r == ncclSuccess) sleep_ms(1);
    }
    CHECK(r == ncclSystemError);
    CHECK(strstr(ncclGetLastError(c), "injected failure at operation 2") != NULL);
  } else {
    ncclResult_t r;
    sleep_ms(300);
    NCHECK(ncclCommGetAsyncError(c, &r));
    CHECK(r == ncclSuccess); /* a dead or failed peer is not detected */
  }
  CHECK(cudaStreamQuery(st) == cudaErrorNotReady);
  t0 = now_s();
  NCHECK(ncclCommAbort(c));
  CHECK(now_s() - t0 < 1);
  CCHECK(cudaStreamSynchronize(st));
  CHECK(cudaStreamQuery(st) == cudaSuccess);
  CHECK(braid_nccl_double_ops() == 1);
  CCHECK(cudaStreamDestroy(st));
}

static void *abort_thread(void *p) {
  NCHECK(ncclCommAbort((ncclComm_t)p));
  return NULL;
}

/* Every rank runs with BRAID_NCCL_DOUBLE_HANG_AT=2. */
static void mode_hang(ncclUniqueId id, int rank, int n) {
  ncclComm_t c = init_comm(id, rank, n, 1);
  cudaStream_t st, st2;
  pthread_t th;
  float x = 1;
  ncclResult_t r;
  (void)rank;
  CCHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CCHECK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
  NCHECK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, c, st));
  CCHECK(cudaStreamSynchronize(st));
  CHECK(x == (float)n);
  NCHECK(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, c, st)); /* hangs */
  NCHECK(ncclBroadcast(&x, &x, 1, ncclFloat32, 0, c, st2));      /* waits for it */
  sleep_ms(300);
  CHECK(cudaStreamQuery(st) == cudaErrorNotReady);
  CHECK(cudaStreamQuery(st2) == cudaErrorNotReady);
  NCHECK(ncclCommGetAsyncError(c, &r));
  CHECK(r == ncclSuccess);
  CHECK(pthread_create(&th, NULL, abort_thread, c) == 0);
  CHECK(pthread_join(th, NULL) == 0);
  CCHECK(cudaStreamSynchronize(st));
  CCHECK(cudaStreamSynchronize(st2));
  CHECK(braid_nccl_double_ops() == 1);
  CCHECK(cudaStreamDestroy(st));
  CCHECK(cudaStreamDestroy(st2));
}

/* Non-blocking communicators; BRAID_NCCL_DOUBLE_LOG is set. */
static void mode_nb(ncclUniqueId id, int rank, int n) {
  ncclComm_t c = init_comm(id, rank, n, 0), child;
  cudaStream_t st;
  int64_t v = rank + 1;
  ncclResult_t r;
  CCHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  NCHECK(ncclGroupStart());
  NCHECK(ncclAllReduce(&v, &v, 1, ncclInt64, ncclSum, c, st));
  CHECK(ncclGroupEnd() == ncclInProgress);
  CHECK(poll_async(c) == ncclSuccess);
  CCHECK(cudaStreamSynchronize(st));
  CHECK(v == (int64_t)n * (n + 1) / 2);
  r = ncclCommSplit(c, 0, rank, &child, NULL); /* inherits non-blocking */
  CHECK(r == ncclInProgress && child);
  CHECK(poll_async(child) == ncclSuccess);
  r = ncclAllReduce(&v, &v, 1, ncclInt64, ncclMax, child, st);
  CHECK(r == ncclInProgress || r == ncclSuccess);
  CHECK(poll_async(child) == ncclSuccess);
  CHECK(ncclCommFinalize(child) == ncclInProgress);
  CHECK(poll_async(child) == ncclSuccess);
  CHECK(cudaStreamQuery(st) == cudaSuccess);
  CHECK(v == (int64_t)n * (n + 1) / 2);
  NCHECK(ncclCommDestroy(child));
  CHECK(ncclCommFinalize(c) == ncclInProgress);
  CHECK(poll_async(c) == ncclSuccess);
  NCHECK(ncclCommDestroy(c));
  CHECK(braid_nccl_double_ops() == 2);
  CCHECK(cudaStreamDestroy(st));
}

static void mode_nodev(int no_driver) {
  int n = 5;
  CHECK(cudaGetDeviceCount(&n) == (no_driver ? cudaErrorInsufficientDriver : cudaErrorNoDevice));
  CHECK(n == 0);
}

static int child_main(char **argv) {
  const char *mode = argv[2];
  int rank = atoi(argv[3]), n = atoi(argv[4]);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  for (size_t i = 0; i < sizeof id.internal && argv[5][2 * i] && argv[5][2 * i + 1]; i++) {
    unsigned x;
    sscanf(argv[5] + 2 * i, "%2x", &x);
    id.internal[i] = (char)x;
  }
  g_rank = rank;
  alarm(600);
  if (!strcmp(mode, "local")) mode_local();
  else if (!strcmp(mode, "nodev")) mode_nodev(0);
  else if (!strcmp(mode, "nodriver")) mode_nodev(1);
  else if (!strcmp(mode, "coll")) mode_coll(id, rank, n);
  else if (!strcmp(mode, "fail")) mode_fail(id, rank, n);
  else if (!strcmp(mode, "hang")) mode_hang(id, rank, n);
  else if (!strcmp(mode, "nb")) mode_nb(id, rank, n);
  else return 2;
  return 0;
}

/* ---------------------------------------------------------------- */
/* Parent                                                            */

static void run(const char *mode, int n, const char *env0, const char *env_all) {
  ncclUniqueId id;
  char hex[2 * sizeof id.internal + 1], rs[16], ns[16];
  pid_t pids[16];
  double t0 = now_s();
  int before = g_failures;
  NCHECK(ncclGetUniqueId(&id));
  for (size_t i = 0; i < sizeof id.internal; i++) sprintf(hex + 2 * i, "%02x", (unsigned char)id.internal[i]);
  snprintf(ns, sizeof ns, "%d", n);
  for (int r = 0; r < n; r++) {
    pids[r] = fork();
    CHECK(pids[r] >= 0);
    if (pids[r] == 0) {
      char *args[] = {"nccl_double_selftest", "child", (char *)mode, rs, ns, hex, NULL};
      snprintf(rs, sizeof rs, "%d", r);
      if (env_all) putenv((char *)env_all);
      if (env0 && r == 0) putenv((char *)env0);
      execv("/proc/self/exe", args);
      _exit(127);
    }
  }
  for (int r = 0; r < n; r++) {
    int status;
    CHECK(waitpid(pids[r], &status, 0) == pids[r]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "FAIL: mode %s n=%d rank %d: status 0x%x\n", mode, n, r, status);
      g_failures++;
    }
  }
  printf("%-8s n=%d %s (%.1fs)\n", mode, n, g_failures > before ? "FAILED" : "ok", now_s() - t0);
  fflush(stdout);
}

static int count_lines(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  char line[1024];
  int k = 0;
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (strstr(line, needle)) k++;
  fclose(f);
  return k;
}

int main(int argc, char **argv) {
  static char logenv[256];
  char logpath[200];
  DIR *d;
  struct dirent *e;
  if (argc >= 6 && !strcmp(argv[1], "child")) return child_main(argv);
  snprintf(logpath, sizeof logpath, "/tmp/nccl_double_selftest.%d.log", (int)getpid());
  unlink(logpath);
  snprintf(logenv, sizeof logenv, "BRAID_NCCL_DOUBLE_LOG=%s", logpath);
  run("local", 1, NULL, "BRAID_NCCL_DOUBLE_DEVICES=2");
  run("nodev", 1, NULL, "BRAID_NCCL_DOUBLE_DEVICES=0");
  run("nodriver", 1, NULL, "BRAID_NCCL_DOUBLE_NO_DRIVER=1");
  run("nb", 3, NULL, logenv);
  run("fail", 2, "BRAID_NCCL_DOUBLE_FAIL_AT=2", NULL);
  run("hang", 2, NULL, "BRAID_NCCL_DOUBLE_HANG_AT=2");
  for (int n = 2; n <= 4; n++) run("coll", n, NULL, NULL);
  if (count_lines(logpath, "call=ncclCommInitRankConfig nranks=3 blocking=0") != 3 ||
      count_lines(logpath, "call=ncclAllReduce count=1 datatype=4 op=0") != 3 ||
      count_lines(logpath, "rank=2 call=ncclGroupEnd") != 1 || count_lines(logpath, "call=ncclCommSplit color=0") != 3) {
    fprintf(stderr, "FAIL: unexpected log %s\n", logpath);
    g_failures++;
  } else {
    unlink(logpath);
  }
  d = opendir("/dev/shm");
  while (d && (e = readdir(d)))
    if (!strncmp(e->d_name, "ncclD-", 6)) {
      fprintf(stderr, "FAIL: left behind /dev/shm/%s\n", e->d_name);
      g_failures++;
    }
  if (d) closedir(d);
  printf("%s\n", g_failures ? "FAILED" : "PASSED");
  return g_failures ? 1 : 0;
}
