/* A host-memory stand-in for libcudart and libnccl, used to test braid's
   nccl backend on machines without a GPU. "Device memory" is host memory,
   a stream is a FIFO of tasks run by one worker thread, and the ranks of a
   communicator (one per process) exchange data through a POSIX shared
   memory segment named from the ncclUniqueId. See README.md. */
#include "nccl_decl.h"
#include "nd_float.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ND_API __attribute__((visibility("default")))

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "cross-process atomics need lock-free 64-bit atomics");

/* ------------------------------------------------------------------ */
/* Environment                                                          */

static struct {
  int devices;
  int no_driver;
  int one_per_device;
  long fail_at;
  long hang_at;
  int log_fd;
} g_env;
static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;

static long env_long(const char *name, long dflt) {
  const char *s = getenv(name);
  char *end;
  long v;
  if (!s || !*s) return dflt;
  v = strtol(s, &end, 10);
  return *end ? dflt : v;
}

static void env_load(void) {
  const char *log = getenv("BRAID_NCCL_DOUBLE_LOG");
  g_env.devices = (int)env_long("BRAID_NCCL_DOUBLE_DEVICES", 1);
  if (g_env.devices < 0) g_env.devices = 0;
  g_env.no_driver = env_long("BRAID_NCCL_DOUBLE_NO_DRIVER", 0) == 1;
  g_env.one_per_device = env_long("BRAID_NCCL_DOUBLE_ONE_PER_DEVICE", 0) == 1;
  g_env.fail_at = env_long("BRAID_NCCL_DOUBLE_FAIL_AT", 0);
  g_env.hang_at = env_long("BRAID_NCCL_DOUBLE_HANG_AT", 0);
  g_env.log_fd = -1;
  if (log && *log) g_env.log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static void env_init(void) { pthread_once(&g_env_once, env_load); }

/* Rank used in log lines of calls that name no communicator. */
static _Atomic int g_log_rank = -1;

static void nd_log(int rank, const char *call, const char *fmt, ...) {
  char line[512];
  int n;
  env_init();
  if (g_env.log_fd < 0) return;
  n = snprintf(line, sizeof line, "rank=%d call=%s", rank, call);
  if (fmt && n > 0 && (size_t)n < sizeof line) {
    va_list ap;
    line[n++] = ' ';
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
  }
  if (n < 0) return;
  if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
  line[n++] = '\n';
  /* One write per line: O_APPEND keeps lines of several processes whole. */
  if (write(g_env.log_fd, line, (size_t)n) < 0) return;
}

/* Waiting on other processes: spin briefly, then nap. */
typedef struct {
  unsigned n;
} nd_backoff;

static void nd_pause(nd_backoff *b) {
  struct timespec ts = {0, 0};
  if (b->n < 64) {
    b->n++;
    sched_yield();
    return;
  }
  ts.tv_nsec = b->n < 2000 ? 50000 : 200000;
  b->n++;
  nanosleep(&ts, NULL);
}

static void *nd_aligned(size_t size) {
  void *p = NULL;
  if (posix_memalign(&p, 256, size ? (size + 255) / 256 * 256 : 256)) return NULL;
  return p;
}

/* ------------------------------------------------------------------ */
/* CUDA runtime: devices and errors                                     */

static _Thread_local cudaError_t t_cuda_last = cudaSuccess;
static _Thread_local int t_device = 0;

static cudaError_t cuda_fail(cudaError_t e) {
  t_cuda_last = e;
  return e;
}

ND_API cudaError_t cudaGetDeviceCount(int *count) {
  env_init();
  if (!count) return cuda_fail(cudaErrorInvalidValue);
  *count = 0;
  if (g_env.no_driver) return cuda_fail(cudaErrorInsufficientDriver);
  if (g_env.devices == 0) return cuda_fail(cudaErrorNoDevice);
  *count = g_env.devices;
  return cudaSuccess;
}

ND_API cudaError_t cudaSetDevice(int device) {
  env_init();
  if (g_env.no_driver) return cuda_fail(cudaErrorInsufficientDriver);
  if (g_env.devices == 0) return cuda_fail(cudaErrorNoDevice);
  if (device < 0 || device >= g_env.devices) return cuda_fail(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

ND_API cudaError_t cudaGetDevice(int *device) {
  if (!device) return cuda_fail(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

ND_API cudaError_t cudaDriverGetVersion(int *driverVersion) {
  env_init();
  if (!driverVersion) return cuda_fail(cudaErrorInvalidValue);
  *driverVersion = g_env.no_driver ? 0 : 13000;
  return cudaSuccess;
}

ND_API cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
  if (!runtimeVersion) return cuda_fail(cudaErrorInvalidValue);
  *runtimeVersion = 13000;
  return cudaSuccess;
}

ND_API const char *cudaGetErrorString(cudaError_t error) {
  switch ((int)error) {
  case 0: return "no error";
  case 1: return "invalid argument";
  case 2: return "out of memory";
  case 35: return "CUDA driver version is insufficient for CUDA runtime version";
  case 100: return "no CUDA-capable device is detected";
  case 101: return "invalid device ordinal";
  case 400: return "invalid resource handle";
  case 600: return "device not ready";
  case 719: return "unspecified launch failure";
  case 999: return "unknown error";
  default: return "unrecognized error code";
  }
}

ND_API cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_cuda_last;
  t_cuda_last = cudaSuccess;
  return e;
}

/* ------------------------------------------------------------------ */
/* Streams and events                                                   */

typedef struct nd_task {
  struct nd_task *next;
  void (*fn)(void *);
  void *arg;
} nd_task;

struct CUstream_st {
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* worker: new task or stop */
  pthread_cond_t done_cv; /* waiters: a task completed */
  nd_task *head, *tail;
  uint64_t enq, done;
  int stop;
  _Atomic int refs; /* owner + events and wait tasks that name it */
  pthread_t thread;
};

struct CUevent_st {
  pthread_mutex_t mu;
  struct CUstream_st *stream; /* NULL: never recorded */
  uint64_t target;            /* complete once stream->done >= target */
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st *g_null_stream;

static void stream_unref(struct CUstream_st *s) {
  if (atomic_fetch_sub(&s->refs, 1) != 1) return;
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->work_cv);
  pthread_cond_destroy(&s->done_cv);
  free(s);
}

static void *stream_worker(void *arg) {
  struct CUstream_st *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    nd_task *t;
    while (!s->head && !s->stop) pthread_cond_wait(&s->work_cv, &s->mu);
    if (!s->head) break;
    t = s->head;
    s->head = t->next;
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    t->fn(t->arg);
    free(t);
    pthread_mutex_lock(&s->mu);
    s->done++;
    pthread_cond_broadcast(&s->done_cv);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static struct CUstream_st *stream_new(void) {
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  atomic_init(&s->refs, 1);
  if (pthread_create(&s->thread, NULL, stream_worker, s)) {
    stream_unref(s);
    return NULL;
  }
  return s;
}

/* Stream 0 is a process-wide stream created on first use. */
static struct CUstream_st *stream_get(cudaStream_t s) {
  struct CUstream_st *r;
  if (s) return s;
  pthread_mutex_lock(&g_mu);
  if (!g_null_stream) g_null_stream = stream_new();
  r = g_null_stream;
  pthread_mutex_unlock(&g_mu);
  return r;
}

static int stream_push(struct CUstream_st *s, void (*fn)(void *), void *arg) {
  nd_task *t = malloc(sizeof *t);
  if (!t) return -1;
  t->next = NULL;
  t->fn = fn;
  t->arg = arg;
  pthread_mutex_lock(&s->mu);
  if (s->tail)
    s->tail->next = t;
  else
    s->head = t;
  s->tail = t;
  s->enq++;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

static void stream_drain(struct CUstream_st *s) {
  pthread_mutex_lock(&s->mu);
  while (s->done < s->enq) pthread_cond_wait(&s->done_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

ND_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  (void)flags;
  if (!pStream) return cuda_fail(cudaErrorInvalidValue);
  *pStream = stream_new();
  return *pStream ? cudaSuccess : cuda_fail(cudaErrorMemoryAllocation);
}

ND_API cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (!stream) return cuda_fail(cudaErrorInvalidValue);
  stream_drain(stream);
  pthread_mutex_lock(&stream->mu);
  stream->stop = 1;
  pthread_cond_signal(&stream->work_cv);
  pthread_mutex_unlock(&stream->mu);
  pthread_join(stream->thread, NULL);
  stream_unref(stream);
  return cudaSuccess;
}

ND_API cudaError_t cudaStreamQuery(cudaStream_t stream) {
  struct CUstream_st *s = stream_get(stream);
  int idle;
  if (!s) return cuda_fail(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&s->mu);
  idle = s->done == s->enq;
  pthread_mutex_unlock(&s->mu);
  return idle ? cudaSuccess : cudaErrorNotReady;
}

ND_API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  struct CUstream_st *s = stream_get(stream);
  if (!s) return cuda_fail(cudaErrorMemoryAllocation);
  stream_drain(s);
  return cudaSuccess;
}

typedef struct {
  struct CUstream_st *s;
  uint64_t target;
} wait_arg;

static void wait_task(void *p) {
  wait_arg *w = p;
  pthread_mutex_lock(&w->s->mu);
  while (w->s->done < w->target) pthread_cond_wait(&w->s->done_cv, &w->s->mu);
  pthread_mutex_unlock(&w->s->mu);
  stream_unref(w->s);
  free(w);
}

ND_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  struct CUstream_st *s = stream_get(stream);
  wait_arg *w;
  (void)flags;
  if (!s) return cuda_fail(cudaErrorMemoryAllocation);
  if (!event) return cuda_fail(cudaErrorInvalidValue);
  w = malloc(sizeof *w);
  if (!w) return cuda_fail(cudaErrorMemoryAllocation);
  /* The wait is on the event's capture now; later records don't move it. */
  pthread_mutex_lock(&event->mu);
  w->s = event->stream;
  w->target = event->target;
  if (w->s) atomic_fetch_add(&w->s->refs, 1);
  pthread_mutex_unlock(&event->mu);
  if (!w->s) {
    free(w);
    return cudaSuccess;
  }
  if (stream_push(s, wait_task, w)) {
    stream_unref(w->s);
    free(w);
    return cuda_fail(cudaErrorMemoryAllocation);
  }
  return cudaSuccess;
}

ND_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  struct CUevent_st *e;
  (void)flags;
  if (!event) return cuda_fail(cudaErrorInvalidValue);
  e = calloc(1, sizeof *e);
  if (!e) return cuda_fail(cudaErrorMemoryAllocation);
  pthread_mutex_init(&e->mu, NULL);
  *event = e;
  return cudaSuccess;
}

ND_API cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event) return cuda_fail(cudaErrorInvalidValue);
  if (event->stream) stream_unref(event->stream);
  pthread_mutex_destroy(&event->mu);
  free(event);
  return cudaSuccess;
}

ND_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  struct CUstream_st *s = stream_get(stream), *old;
  uint64_t target;
  if (!s) return cuda_fail(cudaErrorMemoryAllocation);
  if (!event) return cuda_fail(cudaErrorInvalidValue);
  pthread_mutex_lock(&s->mu);
  target = s->enq;
  pthread_mutex_unlock(&s->mu);
  atomic_fetch_add(&s->refs, 1);
  pthread_mutex_lock(&event->mu);
  old = event->stream;
  event->stream = s;
  event->target = target;
  pthread_mutex_unlock(&event->mu);
  if (old) stream_unref(old);
  return cudaSuccess;
}

/* A test turns this on to make every later event query report a fault,
   as a kernel's illegal access makes CUDA's errors sticky. */
static atomic_int g_events_fail;
ND_API void braid_nccl_double_fail_events(int on) { atomic_store(&g_events_fail, on); }

ND_API cudaError_t cudaEventQuery(cudaEvent_t event) {
  int ready = 1;
  if (!event) return cuda_fail(cudaErrorInvalidValue);
  if (atomic_load(&g_events_fail)) return cuda_fail(cudaErrorLaunchFailure);
  pthread_mutex_lock(&event->mu);
  if (event->stream) {
    pthread_mutex_lock(&event->stream->mu);
    ready = event->stream->done >= event->target;
    pthread_mutex_unlock(&event->stream->mu);
  }
  pthread_mutex_unlock(&event->mu);
  return ready ? cudaSuccess : cudaErrorNotReady;
}

/* ------------------------------------------------------------------ */
/* Memory                                                               */

ND_API cudaError_t cudaMalloc(void **devPtr, size_t size) {
  if (!devPtr) return cuda_fail(cudaErrorInvalidValue);
  *devPtr = nd_aligned(size);
  return *devPtr ? cudaSuccess : cuda_fail(cudaErrorMemoryAllocation);
}

ND_API cudaError_t cudaFree(void *devPtr) {
  free(devPtr);
  return cudaSuccess;
}

ND_API cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaMalloc(ptr, size); }

ND_API cudaError_t cudaFreeHost(void *ptr) { return cudaFree(ptr); }

typedef struct {
  void *dst;
  const void *src;
  size_t n;
} copy_arg;

static void copy_task(void *p) {
  copy_arg *c = p;
  if (c->n) memmove(c->dst, c->src, c->n);
  free(c);
}

ND_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                   cudaStream_t stream) {
  struct CUstream_st *s = stream_get(stream);
  copy_arg *c;
  (void)kind;
  if (!s) return cuda_fail(cudaErrorMemoryAllocation);
  if (count && (!dst || !src)) return cuda_fail(cudaErrorInvalidValue);
  c = malloc(sizeof *c);
  if (!c) return cuda_fail(cudaErrorMemoryAllocation);
  c->dst = dst;
  c->src = src;
  c->n = count;
  if (stream_push(s, copy_task, c)) {
    free(c);
    return cuda_fail(cudaErrorMemoryAllocation);
  }
  return cudaSuccess;
}

ND_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  struct CUstream_st *s = stream_get(NULL);
  (void)kind;
  if (count && (!dst || !src)) return cuda_fail(cudaErrorInvalidValue);
  if (s) stream_drain(s);
  if (count) memmove(dst, src, count);
  return cudaSuccess;
}

ND_API cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData) {
  struct CUstream_st *s = stream_get(stream);
  if (!s) return cuda_fail(cudaErrorMemoryAllocation);
  if (!fn) return cuda_fail(cudaErrorInvalidValue);
  return stream_push(s, fn, userData) ? cuda_fail(cudaErrorMemoryAllocation) : cudaSuccess;
}

/* ------------------------------------------------------------------ */
/* NCCL: shared segment                                                 */

#define ND_PREFIX "/ncclD-"
#define ND_MAX_RANKS 512
#define ND_NAME_MAX 64
#define ND_LINE 64

/* Header at offset 0 of the segment. All fields start zero (ftruncate). */
typedef struct {
  _Atomic uint64_t nranks; /* first rank stores it; the others check it */
  _Atomic uint64_t joined; /* ranks attached so far */
  _Atomic uint64_t users;  /* ranks attached and not yet released */
  _Atomic uint64_t unlinked;
  _Alignas(ND_LINE) _Atomic uint64_t coll_arrive;  /* barrier of operation tasks */
  _Alignas(ND_LINE) _Atomic uint64_t split_arrive; /* barrier of ncclCommSplit */
} seg_hdr;

typedef struct {
  int64_t color, key;
} split_slot;

/* One per (src, dst): a byte ring of messages, each an 8-byte length then
   the payload padded to 8 bytes. */
typedef struct {
  _Alignas(ND_LINE) _Atomic uint64_t head; /* bytes written by src */
  _Alignas(ND_LINE) _Atomic uint64_t tail; /* bytes consumed by dst */
} mbox_hdr;

typedef struct {
  size_t split_off, slot_off, slot_size, mbox_off, mbox_stride, mbox_cap, total;
} seg_layout;

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static seg_layout layout_for(int n) {
  seg_layout l;
  size_t nn = (size_t)n * (size_t)n, cap;
  l.split_off = round_up(sizeof(seg_hdr), 4096);
  l.slot_off = round_up(l.split_off + (size_t)n * sizeof(split_slot), 4096);
  l.slot_size = (size_t)1 << 20;
  if ((size_t)n * l.slot_size > ((size_t)64 << 20)) l.slot_size = round_up(((size_t)64 << 20) / (size_t)n, 4096);
  if (l.slot_size < ((size_t)64 << 10)) l.slot_size = (size_t)64 << 10;
  l.mbox_off = l.slot_off + (size_t)n * l.slot_size;
  cap = ((size_t)16 << 20) / nn;
  if (cap > ((size_t)256 << 10)) cap = (size_t)256 << 10;
  if (cap < 4096) cap = 4096;
  l.mbox_cap = cap / 4096 * 4096;
  l.mbox_stride = round_up(sizeof(mbox_hdr), 4096) + l.mbox_cap;
  l.total = l.mbox_off + nn * l.mbox_stride;
  return l;
}

/* ------------------------------------------------------------------ */
/* NCCL: communicators                                                  */

typedef struct {
  int used;
  ncclDataType_t dtype;
  union {
    int64_t i;
    uint64_t u;
    float f;
    double d;
  } scalar;
} premul_op;

typedef struct reg_handle {
  struct reg_handle *next;
  void *buff;
  size_t size;
} reg_handle;

struct ncclComm {
  pthread_mutex_t mu;
  _Atomic int refs; /* user handle + queued tasks */
  char name[ND_NAME_MAX];
  int rank, nranks, blocking;
  unsigned char *seg;
  seg_layout lay;
  _Atomic int aborted;
  _Atomic int finalizing;
  _Atomic int outstanding;  /* queued stream tasks not yet finished */
  _Atomic int async_err;    /* sticky error */
  _Atomic int poll_pending; /* report ncclInProgress once after a non-blocking enqueue */
  uint64_t tickets_issued;  /* under mu */
  _Atomic uint64_t tickets_done;
  uint64_t barriers;    /* only touched by the task holding the ticket */
  uint64_t split_count; /* under mu */
  char last_error[256]; /* under mu */
  premul_op *premul;    /* under mu */
  int npremul;
  reg_handle *regs; /* under mu */
};

static _Atomic long g_ops_issued;
static _Atomic int g_ops_completed;
static char g_last_error[256];
static _Thread_local char t_error_copy[256];

static void comm_set_error(struct ncclComm *c, ncclResult_t r, const char *fmt, ...) {
  va_list ap;
  int expected = ncclSuccess;
  if (r != ncclSuccess) atomic_compare_exchange_strong(&c->async_err, &expected, (int)r);
  pthread_mutex_lock(&c->mu);
  va_start(ap, fmt);
  vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
  va_end(ap);
  pthread_mutex_unlock(&c->mu);
}

static void global_set_error(const char *msg) {
  pthread_mutex_lock(&g_mu);
  snprintf(g_last_error, sizeof g_last_error, "%s", msg);
  pthread_mutex_unlock(&g_mu);
}

static seg_hdr *hdr_of(struct ncclComm *c) { return (seg_hdr *)(void *)c->seg; }

static int comm_aborted(struct ncclComm *c) { return atomic_load_explicit(&c->aborted, memory_order_acquire); }

static void comm_unref(struct ncclComm *c) {
  reg_handle *r;
  if (atomic_fetch_sub(&c->refs, 1) != 1) return;
  if (c->seg) {
    seg_hdr *h = hdr_of(c);
    /* The last user unlinks a segment not yet unlinked at full join. */
    if (atomic_fetch_sub(&h->users, 1) == 1 && !atomic_exchange(&h->unlinked, 1)) shm_unlink(c->name);
    munmap(c->seg, c->lay.total);
  }
  while ((r = c->regs)) {
    c->regs = r->next;
    free(r);
  }
  free(c->premul);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static int comm_joined(struct ncclComm *c) {
  return atomic_load_explicit(&hdr_of(c)->joined, memory_order_acquire) >= (uint64_t)c->nranks;
}

/* Attaches to the named segment as rank/nranks. */
static ncclResult_t comm_create(const char *name, int nranks, int rank, int blocking, struct ncclComm **out) {
  struct ncclComm *c;
  seg_hdr *h;
  uint64_t expect = 0;
  int fd;
  *out = NULL;
  c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  pthread_mutex_init(&c->mu, NULL);
  atomic_init(&c->refs, 1);
  snprintf(c->name, sizeof c->name, "%s", name);
  c->rank = rank;
  c->nranks = nranks;
  c->blocking = blocking;
  c->lay = layout_for(nranks);
  /* Every rank creates-or-opens and sizes it the same: arrival order is free. */
  fd = shm_open(name, O_RDWR | O_CREAT, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)c->lay.total) != 0) {
    if (fd >= 0) close(fd);
    global_set_error("cannot create the shared segment");
    pthread_mutex_destroy(&c->mu);
    free(c);
    return ncclSystemError;
  }
  c->seg = mmap(NULL, c->lay.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (c->seg == MAP_FAILED) {
    c->seg = NULL;
    global_set_error("cannot map the shared segment");
    pthread_mutex_destroy(&c->mu);
    free(c);
    return ncclSystemError;
  }
  h = hdr_of(c);
  atomic_fetch_add(&h->users, 1);
  if (!atomic_compare_exchange_strong(&h->nranks, &expect, (uint64_t)nranks) && expect != (uint64_t)nranks) {
    global_set_error("ranks disagree on the number of ranks");
    comm_unref(c);
    return ncclInvalidUsage;
  }
  /* Nobody opens the name once all have joined, so unlink it right away:
     nothing is left behind even if a process dies later. */
  if (atomic_fetch_add(&h->joined, 1) + 1 == (uint64_t)nranks && !atomic_exchange(&h->unlinked, 1))
    shm_unlink(name);
  *out = c;
  return ncclSuccess;
}

/* Waits until every rank has joined; 0, or -1 if aborted. */
static int comm_wait_joined(struct ncclComm *c) {
  nd_backoff b = {0};
  while (!comm_joined(c)) {
    if (comm_aborted(c)) return -1;
    nd_pause(&b);
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* NCCL: reductions                                                     */

static size_t dtype_size(ncclDataType_t t) {
  switch ((int)t) {
  case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  default: return 0;
  }
}

typedef struct {
  int op; /* ncclSum..ncclAvg, or -1 for premul-sum */
  union {
    int64_t i;
    uint64_t u;
    float f;
    double d;
  } scalar;
} red_op;

#define INT_REDUCE(T, UT)                                                                                          \
  do {                                                                                                             \
    T *d = dst;                                                                                                    \
    for (size_t i = 0; i < n; i++) {                                                                               \
      T acc = ((const T *)src[0])[i];                                                                              \
      UT s;                                                                                                        \
      switch (op->op) {                                                                                            \
      case ncclSum: case ncclAvg:                                                                                  \
        s = (UT)acc;                                                                                               \
        for (int r = 1; r < nr; r++) s = (UT)(s + (UT)((const T *)src[r])[i]);                                     \
        acc = (T)s;                                                                                                \
        if (op->op == ncclAvg) acc = (T)(acc / (T)nr);                                                             \
        break;                                                                                                     \
      case ncclProd:                                                                                               \
        s = (UT)acc;                                                                                               \
        for (int r = 1; r < nr; r++) s = (UT)(s * (UT)((const T *)src[r])[i]);                                     \
        acc = (T)s;                                                                                                \
        break;                                                                                                     \
      case ncclMax:                                                                                                \
        for (int r = 1; r < nr; r++)                                                                               \
          if (((const T *)src[r])[i] > acc) acc = ((const T *)src[r])[i];                                          \
        break;                                                                                                     \
      case ncclMin:                                                                                                \
        for (int r = 1; r < nr; r++)                                                                               \
          if (((const T *)src[r])[i] < acc) acc = ((const T *)src[r])[i];                                          \
        break;                                                                                                     \
      default:                                                                                                     \
        s = 0;                                                                                                     \
        for (int r = 0; r < nr; r++) s = (UT)(s + (UT)((UT)op->scalar.u * (UT)((const T *)src[r])[i]));           \
        acc = (T)s;                                                                                                \
        break;                                                                                                     \
      }                                                                                                            \
      d[i] = acc;                                                                                                  \
    }                                                                                                              \
  } while (0)

/* F: accumulation type; LOAD(p, i) and STORE(p, i, v) convert. */
#define FLOAT_REDUCE(F, LOAD, STORE, SCALAR)                                                                       \
  do {                                                                                                             \
    for (size_t i = 0; i < n; i++) {                                                                               \
      F acc = LOAD(src[0], i), x;                                                                                  \
      switch (op->op) {                                                                                            \
      case ncclSum: case ncclAvg:                                                                                  \
        for (int r = 1; r < nr; r++) acc += LOAD(src[r], i);                                                       \
        if (op->op == ncclAvg) acc = acc / (F)nr;                                                                  \
        break;                                                                                                     \
      case ncclProd:                                                                                               \
        for (int r = 1; r < nr; r++) acc *= LOAD(src[r], i);                                                       \
        break;                                                                                                     \
      case ncclMax:                                                                                                \
        for (int r = 1; r < nr; r++) {                                                                             \
          x = LOAD(src[r], i);                                                                                     \
          if (x > acc) acc = x;                                                                                    \
        }                                                                                                          \
        break;                                                                                                     \
      case ncclMin:                                                                                                \
        for (int r = 1; r < nr; r++) {                                                                             \
          x = LOAD(src[r], i);                                                                                     \
          if (x < acc) acc = x;                                                                                    \
        }                                                                                                          \
        break;                                                                                                     \
      default:                                                                                                     \
        acc = (F)(SCALAR) * acc;                                                                                   \
        for (int r = 1; r < nr; r++) acc += (F)(SCALAR) * LOAD(src[r], i);                                         \
        break;                                                                                                     \
      }                                                                                                            \
      STORE(dst, i, acc);                                                                                          \
    }                                                                                                              \
  } while (0)

#define LD_F32(p, i) (((const float *)(p))[i])
#define ST_F32(p, i, v) (((float *)(p))[i] = (v))
#define LD_F64(p, i) (((const double *)(p))[i])
#define ST_F64(p, i, v) (((double *)(p))[i] = (v))
#define LD_F16(p, i) nd_to_float(((const uint16_t *)(p))[i], &ND_HALF)
#define ST_F16(p, i, v) (((uint16_t *)(p))[i] = (uint16_t)nd_from_float((v), &ND_HALF))
#define LD_BF16(p, i) nd_to_float(((const uint16_t *)(p))[i], &ND_BF16)
#define ST_BF16(p, i, v) (((uint16_t *)(p))[i] = (uint16_t)nd_from_float((v), &ND_BF16))
#define LD_E4M3(p, i) nd_to_float(((const uint8_t *)(p))[i], &ND_E4M3)
#define ST_E4M3(p, i, v) (((uint8_t *)(p))[i] = (uint8_t)nd_from_float((v), &ND_E4M3))
#define LD_E5M2(p, i) nd_to_float(((const uint8_t *)(p))[i], &ND_E5M2)
#define ST_E5M2(p, i, v) (((uint8_t *)(p))[i] = (uint8_t)nd_from_float((v), &ND_E5M2))

/* dst[i] = op over r of src[r][i]; dst may alias src[k] (elementwise). */
static void reduce(void *dst, const void *const *src, int nr, size_t n, ncclDataType_t dt, const red_op *op) {
  switch ((int)dt) {
  case ncclInt8: INT_REDUCE(int8_t, uint8_t); break;
  case ncclUint8: INT_REDUCE(uint8_t, uint8_t); break;
  case ncclInt32: INT_REDUCE(int32_t, uint32_t); break;
  case ncclUint32: INT_REDUCE(uint32_t, uint32_t); break;
  case ncclInt64: INT_REDUCE(int64_t, uint64_t); break;
  case ncclUint64: INT_REDUCE(uint64_t, uint64_t); break;
  case ncclFloat32: FLOAT_REDUCE(float, LD_F32, ST_F32, op->scalar.f); break;
  case ncclFloat64: FLOAT_REDUCE(double, LD_F64, ST_F64, op->scalar.d); break;
  case ncclFloat16: FLOAT_REDUCE(float, LD_F16, ST_F16, op->scalar.f); break;
  case ncclBfloat16: FLOAT_REDUCE(float, LD_BF16, ST_BF16, op->scalar.f); break;
  case ncclFloat8e4m3: FLOAT_REDUCE(float, LD_E4M3, ST_E4M3, op->scalar.f); break;
  case ncclFloat8e5m2: FLOAT_REDUCE(float, LD_E5M2, ST_E5M2, op->scalar.f); break;
  default: break;
  }
}

/* ------------------------------------------------------------------ */
/* NCCL: operations                                                     */

enum { K_ALLREDUCE, K_BROADCAST, K_REDUCE, K_ALLGATHER, K_REDUCESCATTER, K_SEND, K_RECV };

typedef struct {
  int kind;
  struct ncclComm *comm;
  struct CUstream_st *stream;
  const void *send;
  void *recv;
  size_t count;
  ncclDataType_t dtype;
  red_op op;
  int root; /* or peer */
  /* p2p progress */
  int hdr_done, done;
  uint64_t len, off;
} nd_op;

/* One group's work on one communicator; run by the last of its per-stream
   tasks to start, the others wait for it. */
typedef struct {
  struct ncclComm *comm;
  nd_op *ops;
  int nops;
  int nparts;
  int arrived;        /* under comm->mu */
  _Atomic int done;
  _Atomic int refs;
  uint64_t ticket;
  long opno;
} nd_exec;

typedef struct {
  nd_exec *ex;
} part_arg;

static int coll_barrier(struct ncclComm *c) {
  seg_hdr *h = hdr_of(c);
  uint64_t target = ++c->barriers * (uint64_t)c->nranks;
  nd_backoff b = {0};
  atomic_fetch_add(&h->coll_arrive, 1);
  while (atomic_load_explicit(&h->coll_arrive, memory_order_acquire) < target) {
    if (comm_aborted(c)) return -1;
    nd_pause(&b);
  }
  return 0;
}

static unsigned char *slot_of(struct ncclComm *c, int r) { return c->seg + c->lay.slot_off + (size_t)r * c->lay.slot_size; }

/* Runs one collective through the staging slots; -1 if aborted. */
static int run_coll(struct ncclComm *c, nd_op *o) {
  int me = c->rank, n = c->nranks;
  size_t es = dtype_size(o->dtype), per, off, k;
  const unsigned char *send = o->send;
  unsigned char *recv = o->recv;
  const void *srcs[ND_MAX_RANKS];
  per = c->lay.slot_size / es;
  if (o->kind == K_REDUCESCATTER) per = c->lay.slot_size / (es * (size_t)n);
  for (off = 0; off < o->count; off += k) {
    k = o->count - off < per ? o->count - off : per;
    switch (o->kind) {
    case K_ALLREDUCE:
    case K_REDUCE:
      memcpy(slot_of(c, me), send + off * es, k * es);
      if (coll_barrier(c)) return -1;
      if (o->kind == K_ALLREDUCE || me == o->root) {
        for (int r = 0; r < n; r++) srcs[r] = slot_of(c, r);
        reduce(recv + off * es, srcs, n, k, o->dtype, &o->op);
      }
      break;
    case K_BROADCAST:
      if (me == o->root) memcpy(slot_of(c, me), send + off * es, k * es);
      if (coll_barrier(c)) return -1;
      memcpy(recv + off * es, slot_of(c, o->root), k * es);
      break;
    case K_ALLGATHER:
      memcpy(slot_of(c, me), send + off * es, k * es);
      if (coll_barrier(c)) return -1;
      for (int r = 0; r < n; r++) memcpy(recv + ((size_t)r * o->count + off) * es, slot_of(c, r), k * es);
      break;
    case K_REDUCESCATTER:
      for (int r = 0; r < n; r++) memcpy(slot_of(c, me) + (size_t)r * k * es, send + ((size_t)r * o->count + off) * es, k * es);
      if (coll_barrier(c)) return -1;
      for (int r = 0; r < n; r++) srcs[r] = slot_of(c, r) + (size_t)me * k * es;
      reduce(recv + off * es, srcs, n, k, o->dtype, &o->op);
      break;
    default:
      break;
    }
    /* Slots are reused by the next chunk only once everyone has read them. */
    if (coll_barrier(c)) return -1;
  }
  return 0;
}

static unsigned char *mbox_of(struct ncclComm *c, int src, int dst, mbox_hdr **h) {
  unsigned char *base = c->seg + c->lay.mbox_off + ((size_t)src * (size_t)c->nranks + (size_t)dst) * c->lay.mbox_stride;
  *h = (mbox_hdr *)(void *)base;
  return base + round_up(sizeof(mbox_hdr), 4096);
}

/* Moves as much of a send as the ring allows; returns bytes moved. */
static size_t p2p_send_step(struct ncclComm *c, nd_op *o) {
  mbox_hdr *h;
  unsigned char *ring = mbox_of(c, c->rank, o->root, &h);
  uint64_t cap = c->lay.mbox_cap, head = atomic_load_explicit(&h->head, memory_order_relaxed);
  uint64_t tail = atomic_load_explicit(&h->tail, memory_order_acquire), moved = 0;
  uint64_t padded = round_up(o->len, 8);
  if (!o->hdr_done) {
    if (cap - (head - tail) < 8) return 0;
    memcpy(ring + head % cap, &o->len, 8);
    head += 8;
    moved += 8;
    o->hdr_done = 1;
  }
  while (o->off < padded) {
    uint64_t space = cap - (head - tail), contig = cap - head % cap, k = padded - o->off;
    if (k > space) k = space;
    if (k > contig) k = contig;
    if (!k) break;
    if (o->off < o->len) {
      uint64_t real = o->len - o->off < k ? o->len - o->off : k;
      memcpy(ring + head % cap, (const unsigned char *)o->send + o->off, real);
    }
    head += k;
    o->off += k;
    moved += k;
  }
  if (moved) atomic_store_explicit(&h->head, head, memory_order_release);
  if (o->off == padded) o->done = 1;
  return moved;
}

static size_t p2p_recv_step(struct ncclComm *c, nd_op *o) {
  mbox_hdr *h;
  unsigned char *ring = mbox_of(c, o->root, c->rank, &h);
  uint64_t cap = c->lay.mbox_cap, tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
  uint64_t head = atomic_load_explicit(&h->head, memory_order_acquire), moved = 0, mine = o->count * dtype_size(o->dtype);
  uint64_t padded, keep;
  if (!o->hdr_done) {
    if (head - tail < 8) return 0;
    memcpy(&o->len, ring + tail % cap, 8);
    tail += 8;
    moved += 8;
    o->hdr_done = 1;
    if (o->len != mine)
      comm_set_error(c, ncclInvalidUsage, "rank %d received %llu bytes from rank %d but expected %llu", c->rank,
                     (unsigned long long)o->len, o->root, (unsigned long long)mine);
  }
  padded = round_up(o->len, 8);
  keep = o->len < mine ? o->len : mine; /* never write past the receive buffer */
  while (o->off < padded) {
    uint64_t avail = head - tail, contig = cap - tail % cap, k = padded - o->off;
    if (k > avail) k = avail;
    if (k > contig) k = contig;
    if (!k) break;
    if (o->off < keep) {
      uint64_t real = keep - o->off < k ? keep - o->off : k;
      memcpy((unsigned char *)o->recv + o->off, ring + tail % cap, real);
    }
    tail += k;
    o->off += k;
    moved += k;
  }
  if (moved) atomic_store_explicit(&h->tail, tail, memory_order_release);
  if (o->off == padded) o->done = 1;
  return moved;
}

/* Progresses all sends and receives of a group together, each peer's in
   issue order; -1 if aborted. */
static int run_p2p(struct ncclComm *c, nd_op *ops, int nops) {
  int n = c->nranks, left = 0;
  unsigned char *busy = calloc((size_t)n * 2, 1);
  nd_backoff b = {0};
  if (!busy) return -1;
  for (int i = 0; i < nops; i++)
    if (ops[i].kind == K_SEND || ops[i].kind == K_RECV) {
      ops[i].len = ops[i].count * dtype_size(ops[i].dtype);
      left++;
    }
  while (left) {
    size_t moved = 0;
    memset(busy, 0, (size_t)n * 2);
    for (int i = 0; i < nops; i++) {
      nd_op *o = &ops[i];
      unsigned char *flag;
      if (o->kind != K_SEND && o->kind != K_RECV) continue;
      if (o->done) continue;
      flag = &busy[(size_t)o->root * 2 + (o->kind == K_RECV)];
      if (*flag) continue;
      moved += o->kind == K_SEND ? p2p_send_step(c, o) : p2p_recv_step(c, o);
      if (o->done)
        left--;
      else
        *flag = 1;
    }
    if (!left) break;
    if (moved) {
      b.n = 0;
      continue;
    }
    if (comm_aborted(c)) {
      free(busy);
      return -1;
    }
    nd_pause(&b);
  }
  free(busy);
  return 0;
}

static void exec_unref(nd_exec *ex) {
  if (atomic_fetch_sub(&ex->refs, 1) != 1) return;
  free(ex->ops);
  free(ex);
}

static void exec_run(nd_exec *ex) {
  struct ncclComm *c = ex->comm;
  nd_backoff b = {0};
  int ok = 1;
  if (comm_aborted(c)) return;
  /* Operations of a communicator run in issue order, one at a time. */
  while (atomic_load_explicit(&c->tickets_done, memory_order_acquire) != ex->ticket) {
    if (comm_aborted(c)) return;
    nd_pause(&b);
  }
  if (g_env.fail_at > 0 && ex->opno == g_env.fail_at) {
    comm_set_error(c, ncclSystemError, "injected failure at operation %ld", ex->opno);
    ok = 0;
  } else if (g_env.hang_at > 0 && ex->opno == g_env.hang_at) {
    ok = 0;
  }
  if (!ok) {
    b.n = 0;
    while (!comm_aborted(c)) nd_pause(&b);
    return;
  }
  if (comm_wait_joined(c)) return;
  for (int i = 0; i < ex->nops; i++)
    if (ex->ops[i].kind != K_SEND && ex->ops[i].kind != K_RECV)
      if (run_coll(c, &ex->ops[i])) return;
  if (run_p2p(c, ex->ops, ex->nops)) return;
  atomic_fetch_add(&g_ops_completed, 1);
  atomic_store_explicit(&c->tickets_done, ex->ticket + 1, memory_order_release);
}

static void part_task(void *p) {
  part_arg *a = p;
  nd_exec *ex = a->ex;
  struct ncclComm *c = ex->comm;
  int last;
  free(a);
  pthread_mutex_lock(&c->mu);
  last = ++ex->arrived == ex->nparts;
  pthread_mutex_unlock(&c->mu);
  if (last) {
    exec_run(ex);
    atomic_store_explicit(&ex->done, 1, memory_order_release);
  } else {
    nd_backoff b = {0};
    while (!atomic_load_explicit(&ex->done, memory_order_acquire) && !comm_aborted(c)) nd_pause(&b);
  }
  exec_unref(ex);
  atomic_fetch_sub(&c->outstanding, 1);
  comm_unref(c);
}

/* ------------------------------------------------------------------ */
/* NCCL: groups                                                         */

static _Thread_local int t_group_depth;
static _Thread_local nd_op *t_ops;
static _Thread_local int t_nops, t_capops;

static int comm_order(const void *a, const void *b) {
  const struct ncclComm *x = *(struct ncclComm *const *)a, *y = *(struct ncclComm *const *)b;
  int r = strcmp(x->name, y->name);
  if (r) return r;
  return x == y ? 0 : (x < y ? -1 : 1);
}

/* Enqueues the collected operations: per communicator (in an order every
   rank agrees on) one exec, with one task on each stream it uses. */
static ncclResult_t group_flush(int *nonblocking) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm **comms = NULL;
  int ncomms = 0;
  *nonblocking = 0;
  if (!t_nops) return ncclSuccess;
  env_init();
  comms = malloc(sizeof *comms * (size_t)t_nops);
  if (!comms) res = ncclSystemError;
  for (int i = 0; comms && i < t_nops; i++) {
    int seen = 0;
    for (int j = 0; j < ncomms; j++) seen |= comms[j] == t_ops[i].comm;
    if (!seen) comms[ncomms++] = t_ops[i].comm;
  }
  if (comms) qsort(comms, (size_t)ncomms, sizeof *comms, comm_order);
  for (int ci = 0; ci < ncomms && res == ncclSuccess; ci++) {
    struct ncclComm *c = comms[ci];
    nd_exec *ex = calloc(1, sizeof *ex);
    struct CUstream_st **streams = malloc(sizeof *streams * (size_t)t_nops);
    int nstreams = 0;
    if (ex) ex->ops = malloc(sizeof *ex->ops * (size_t)t_nops);
    if (!ex || !ex->ops || !streams) {
      if (ex) free(ex->ops);
      free(ex);
      free(streams);
      res = ncclSystemError;
      break;
    }
    ex->comm = c;
    for (int i = 0; i < t_nops; i++) {
      int seen = 0;
      if (t_ops[i].comm != c) continue;
      ex->ops[ex->nops++] = t_ops[i];
      for (int j = 0; j < nstreams; j++) seen |= streams[j] == t_ops[i].stream;
      if (!seen) streams[nstreams++] = t_ops[i].stream;
    }
    ex->nparts = nstreams;
    atomic_init(&ex->refs, nstreams);
    ex->opno = atomic_fetch_add(&g_ops_issued, 1) + 1;
    pthread_mutex_lock(&c->mu);
    ex->ticket = c->tickets_issued++;
    pthread_mutex_unlock(&c->mu);
    for (int j = 0; j < nstreams; j++) {
      part_arg *a = malloc(sizeof *a);
      atomic_fetch_add(&c->refs, 1);
      atomic_fetch_add(&c->outstanding, 1);
      if (!a) abort(); /* a half-enqueued exec cannot be undone */
      a->ex = ex;
      if (stream_push(streams[j], part_task, a)) abort();
    }
    free(streams);
    if (!c->blocking) {
      atomic_store(&c->poll_pending, 1);
      *nonblocking = 1;
    }
  }
  free(comms);
  t_nops = 0;
  if (t_capops > 64) {
    free(t_ops);
    t_ops = NULL;
    t_capops = 0;
  }
  return res;
}

static ncclResult_t add_op(const nd_op *o) {
  ncclResult_t r;
  int nb;
  if (t_nops == t_capops) {
    int cap = t_capops ? t_capops * 2 : 16;
    nd_op *p = realloc(t_ops, sizeof *p * (size_t)cap);
    if (!p) return ncclSystemError;
    t_ops = p;
    t_capops = cap;
  }
  t_ops[t_nops++] = *o;
  if (t_group_depth) return ncclSuccess;
  /* Outside a group each call is its own group. */
  r = group_flush(&nb);
  if (r == ncclSuccess && nb) return ncclInProgress;
  return r;
}

ND_API ncclResult_t ncclGroupStart(void) {
  nd_log(atomic_load(&g_log_rank), "ncclGroupStart", NULL);
  t_group_depth++;
  return ncclSuccess;
}

ND_API ncclResult_t ncclGroupEnd(void) {
  ncclResult_t r;
  int nb;
  nd_log(atomic_load(&g_log_rank), "ncclGroupEnd", NULL);
  if (t_group_depth <= 0) return ncclInvalidUsage;
  if (--t_group_depth) return ncclSuccess;
  r = group_flush(&nb);
  if (r == ncclSuccess && nb) return ncclInProgress;
  return r;
}

/* ------------------------------------------------------------------ */
/* NCCL: API                                                            */

ND_API int braid_nccl_double_ops(void) { return atomic_load(&g_ops_completed); }

ND_API ncclResult_t ncclGetVersion(int *version) {
  nd_log(atomic_load(&g_log_rank), "ncclGetVersion", NULL);
  if (!version) return ncclInvalidArgument;
  *version = 22800;
  return ncclSuccess;
}

ND_API const char *ncclGetErrorString(ncclResult_t result) {
  switch ((int)result) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
  case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

ND_API const char *ncclGetLastError(ncclComm_t comm) {
  if (comm) {
    pthread_mutex_lock(&comm->mu);
    snprintf(t_error_copy, sizeof t_error_copy, "%s", comm->last_error);
    pthread_mutex_unlock(&comm->mu);
  } else {
    pthread_mutex_lock(&g_mu);
    snprintf(t_error_copy, sizeof t_error_copy, "%s", g_last_error);
    pthread_mutex_unlock(&g_mu);
  }
  return t_error_copy;
}

ND_API ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
  static _Atomic unsigned counter;
  struct timespec ts;
  uint64_t rnd[2] = {0, 0};
  int fd;
  nd_log(atomic_load(&g_log_rank), "ncclGetUniqueId", NULL);
  if (!uniqueId) return ncclInvalidArgument;
  clock_gettime(CLOCK_REALTIME, &ts);
  fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, rnd, sizeof rnd) < 0) rnd[0] = 0;
    close(fd);
  }
  memset(uniqueId, 0, sizeof *uniqueId);
  snprintf(uniqueId->internal, sizeof uniqueId->internal, ND_PREFIX "%x-%llx-%x-%016llx%016llx", (unsigned)getpid(),
           (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec,
           atomic_fetch_add(&counter, 1), (unsigned long long)rnd[0], (unsigned long long)rnd[1]);
  return ncclSuccess;
}

static int config_blocking(const ncclConfig_t *config, int dflt) {
  if (!config || config->blocking == NCCL_CONFIG_UNDEF_INT) return dflt;
  return config->blocking != 0;
}

ND_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                           ncclConfig_t *config) {
  char name[ND_NAME_MAX];
  struct ncclComm *c;
  ncclResult_t r;
  int blocking = config_blocking(config, 1);
  env_init();
  nd_log(rank, "ncclCommInitRankConfig", "nranks=%d blocking=%d", nranks, blocking);
  if (!comm || nranks < 1 || nranks > ND_MAX_RANKS || rank < 0 || rank >= nranks) {
    global_set_error("invalid arguments to ncclCommInitRankConfig");
    return ncclInvalidArgument;
  }
  *comm = NULL;
  if (config && config->magic != 0xcafebeef) {
    global_set_error("config not initialised with NCCL_CONFIG_INITIALIZER");
    return ncclInvalidArgument;
  }
  memcpy(name, commId.internal, sizeof name);
  name[sizeof name - 1] = 0;
  if (strncmp(name, ND_PREFIX, strlen(ND_PREFIX)) != 0 || strlen(name) < strlen(ND_PREFIX) + 8) {
    global_set_error("unique id was not made by ncclGetUniqueId");
    return ncclInvalidArgument;
  }
  r = comm_create(name, nranks, rank, blocking, &c);
  if (r != ncclSuccess) return r;
  atomic_store(&g_log_rank, rank);
  *comm = c;
  if (g_env.one_per_device && nranks > g_env.devices) { /* as NCCL refuses two ranks on one GPU */
    pthread_mutex_lock(&c->mu);
    snprintf(c->last_error, sizeof c->last_error, "Duplicate GPU detected : rank %d and another rank both on the "
             "test double's device", rank);
    pthread_mutex_unlock(&c->mu);
    atomic_store(&c->async_err, ncclInvalidUsage);
    return blocking ? ncclInvalidUsage : ncclInProgress;
  }
  if (!blocking) return ncclInProgress;
  comm_wait_joined(c);
  return ncclSuccess;
}

ND_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  int e;
  nd_log(comm ? comm->rank : -1, "ncclCommGetAsyncError", NULL);
  if (!comm || !asyncError) return ncclInvalidArgument;
  e = atomic_load(&comm->async_err);
  if (e != ncclSuccess)
    *asyncError = (ncclResult_t)e;
  else if (!comm_joined(comm) || atomic_exchange(&comm->poll_pending, 0) ||
           (atomic_load(&comm->finalizing) && atomic_load(&comm->outstanding) > 0))
    *asyncError = ncclInProgress;
  else
    *asyncError = ncclSuccess;
  return ncclSuccess;
}

ND_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  nd_backoff b = {0};
  nd_log(comm ? comm->rank : -1, "ncclCommFinalize", NULL);
  if (!comm) return ncclInvalidArgument;
  atomic_store(&comm->finalizing, 1);
  if (!comm->blocking) {
    atomic_store(&comm->poll_pending, 1);
    return ncclInProgress;
  }
  while (atomic_load(&comm->outstanding) > 0 && !comm_aborted(comm)) nd_pause(&b);
  return ncclSuccess;
}

ND_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  nd_backoff b = {0};
  nd_log(comm ? comm->rank : -1, "ncclCommDestroy", NULL);
  if (!comm) return ncclInvalidArgument;
  /* Like NCCL, destroying an unfinalized communicator finalizes it first. */
  atomic_store(&comm->finalizing, 1);
  while (atomic_load(&comm->outstanding) > 0 && !comm_aborted(comm)) nd_pause(&b);
  comm_unref(comm);
  return ncclSuccess;
}

ND_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  nd_log(comm ? comm->rank : -1, "ncclCommAbort", NULL);
  if (!comm) return ncclSuccess;
  /* Queued and stuck tasks see the flag within a nap and complete without
     doing their work; the last of them frees the communicator. */
  atomic_store_explicit(&comm->aborted, 1, memory_order_release);
  comm_unref(comm);
  return ncclSuccess;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static int split_barrier(struct ncclComm *c, uint64_t target) {
  seg_hdr *h = hdr_of(c);
  nd_backoff b = {0};
  atomic_fetch_add(&h->split_arrive, 1);
  while (atomic_load_explicit(&h->split_arrive, memory_order_acquire) < target) {
    if (comm_aborted(c)) return -1;
    nd_pause(&b);
  }
  return 0;
}

ND_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  split_slot *slots;
  split_slot mine;
  uint64_t k, h;
  int n, newrank = 0, newn = 0, blocking;
  char name[ND_NAME_MAX];
  struct ncclComm *c;
  ncclResult_t r;
  nd_log(comm ? comm->rank : -1, "ncclCommSplit", "color=%d key=%d", color, key);
  if (!comm || !newcomm || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) return ncclInvalidArgument;
  if (config && config->magic != 0xcafebeef) return ncclInvalidArgument;
  *newcomm = NULL;
  blocking = config_blocking(config, comm->blocking);
  n = comm->nranks;
  if (comm_wait_joined(comm)) return ncclInvalidUsage;
  pthread_mutex_lock(&comm->mu);
  k = ++comm->split_count;
  pthread_mutex_unlock(&comm->mu);
  /* Exchanged through the parent's segment, outside its streams, so the
     split does not depend on how operations were enqueued. */
  slots = (split_slot *)(void *)(comm->seg + comm->lay.split_off);
  slots[comm->rank].color = color;
  slots[comm->rank].key = key;
  if (split_barrier(comm, (2 * k - 1) * (uint64_t)n)) return ncclInvalidUsage;
  mine = slots[comm->rank];
  for (int r2 = 0; r2 < n; r2++) {
    split_slot s = slots[r2];
    if (s.color != color) continue;
    newn++;
    if (s.key < mine.key || (s.key == mine.key && r2 < comm->rank)) newrank++;
  }
  if (split_barrier(comm, 2 * k * (uint64_t)n)) return ncclInvalidUsage;
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  h = fnv1a(1469598103934665603ull, comm->name, strlen(comm->name));
  h = fnv1a(h, &k, sizeof k);
  h = fnv1a(h, &color, sizeof color);
  snprintf(name, sizeof name, ND_PREFIX "s%016llx", (unsigned long long)h);
  r = comm_create(name, newn, newrank, blocking, &c);
  if (r != ncclSuccess) return r;
  *newcomm = c;
  if (!blocking) return ncclInProgress;
  comm_wait_joined(c);
  return ncclSuccess;
}

ND_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle) {
  reg_handle *r;
  nd_log(comm ? comm->rank : -1, "ncclCommRegister", "size=%zu", size);
  if (!comm || !handle) return ncclInvalidArgument;
  r = malloc(sizeof *r);
  if (!r) return ncclSystemError;
  r->buff = buff;
  r->size = size;
  pthread_mutex_lock(&comm->mu);
  r->next = comm->regs;
  comm->regs = r;
  pthread_mutex_unlock(&comm->mu);
  *handle = r;
  return ncclSuccess;
}

ND_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
  reg_handle **pp;
  nd_log(comm ? comm->rank : -1, "ncclCommDeregister", NULL);
  if (!comm) return ncclInvalidArgument;
  pthread_mutex_lock(&comm->mu);
  for (pp = &comm->regs; *pp; pp = &(*pp)->next)
    if (*pp == handle) {
      reg_handle *r = *pp;
      *pp = r->next;
      pthread_mutex_unlock(&comm->mu);
      free(r);
      return ncclSuccess;
    }
  pthread_mutex_unlock(&comm->mu);
  comm_set_error(comm, ncclSuccess, "ncclCommDeregister: unknown handle");
  return ncclInvalidArgument;
}

ND_API ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
  nd_log(atomic_load(&g_log_rank), "ncclMemAlloc", "size=%zu", size);
  if (!ptr) return ncclInvalidArgument;
  *ptr = nd_aligned(size);
  return *ptr ? ncclSuccess : ncclSystemError;
}

ND_API ncclResult_t ncclMemFree(void *ptr) {
  nd_log(atomic_load(&g_log_rank), "ncclMemFree", NULL);
  free(ptr);
  return ncclSuccess;
}

ND_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                                             ncclScalarResidence_t residence, ncclComm_t comm) {
  premul_op p;
  int slot;
  nd_log(comm ? comm->rank : -1, "ncclRedOpCreatePreMulSum", "datatype=%d", (int)datatype);
  if (!op || !scalar || !comm || dtype_size(datatype) == 0) return ncclInvalidArgument;
  if (residence != ncclScalarHostImmediate) return ncclInvalidArgument; /* device scalars: not modelled */
  memset(&p, 0, sizeof p);
  p.used = 1;
  p.dtype = datatype;
  switch ((int)datatype) {
  case ncclInt8: p.scalar.i = *(const int8_t *)scalar; break;
  case ncclUint8: p.scalar.u = *(const uint8_t *)scalar; break;
  case ncclInt32: p.scalar.i = *(const int32_t *)scalar; break;
  case ncclUint32: p.scalar.u = *(const uint32_t *)scalar; break;
  case ncclInt64: p.scalar.i = *(const int64_t *)scalar; break;
  case ncclUint64: p.scalar.u = *(const uint64_t *)scalar; break;
  case ncclFloat16: p.scalar.f = nd_to_float(*(const uint16_t *)scalar, &ND_HALF); break;
  case ncclBfloat16: p.scalar.f = nd_to_float(*(const uint16_t *)scalar, &ND_BF16); break;
  case ncclFloat8e4m3: p.scalar.f = nd_to_float(*(const uint8_t *)scalar, &ND_E4M3); break;
  case ncclFloat8e5m2: p.scalar.f = nd_to_float(*(const uint8_t *)scalar, &ND_E5M2); break;
  case ncclFloat32: p.scalar.f = *(const float *)scalar; break;
  case ncclFloat64: p.scalar.d = *(const double *)scalar; break;
  default: break;
  }
  pthread_mutex_lock(&comm->mu);
  for (slot = 0; slot < comm->npremul && comm->premul[slot].used; slot++) {
  }
  if (slot == comm->npremul) {
    premul_op *q = realloc(comm->premul, sizeof *q * (size_t)(comm->npremul + 1));
    if (!q) {
      pthread_mutex_unlock(&comm->mu);
      return ncclSystemError;
    }
    comm->premul = q;
    comm->npremul++;
  }
  comm->premul[slot] = p;
  pthread_mutex_unlock(&comm->mu);
  *op = (ncclRedOp_t)(ncclNumOps + slot);
  return ncclSuccess;
}

ND_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  int slot = (int)op - (int)ncclNumOps;
  ncclResult_t r = ncclInvalidArgument;
  nd_log(comm ? comm->rank : -1, "ncclRedOpDestroy", "op=%d", (int)op);
  if (!comm) return ncclInvalidArgument;
  pthread_mutex_lock(&comm->mu);
  if (slot >= 0 && slot < comm->npremul && comm->premul[slot].used) {
    comm->premul[slot].used = 0;
    r = ncclSuccess;
  }
  pthread_mutex_unlock(&comm->mu);
  return r;
}

/* Resolves op for datatype on comm; the premul scalar is copied so that
   destroying the op after enqueueing is harmless. */
static ncclResult_t resolve_op(ncclComm_t comm, ncclRedOp_t op, ncclDataType_t dt, red_op *out) {
  int slot = (int)op - (int)ncclNumOps;
  ncclResult_t r = ncclInvalidArgument;
  memset(out, 0, sizeof *out);
  if ((int)op >= 0 && (int)op < (int)ncclNumOps) {
    out->op = (int)op;
    return ncclSuccess;
  }
  pthread_mutex_lock(&comm->mu);
  if (slot >= 0 && slot < comm->npremul && comm->premul[slot].used && comm->premul[slot].dtype == dt) {
    out->op = -1;
    memcpy(&out->scalar, &comm->premul[slot].scalar, sizeof out->scalar);
    r = ncclSuccess;
  }
  pthread_mutex_unlock(&comm->mu);
  return r;
}

static ncclResult_t bad_arg(ncclComm_t comm, const char *what) {
  if (comm) comm_set_error(comm, ncclSuccess, "%s", what);
  global_set_error(what);
  return ncclInvalidArgument;
}

static ncclResult_t enqueue(int kind, const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                            int root, ncclComm_t comm, cudaStream_t stream) {
  nd_op o;
  memset(&o, 0, sizeof o);
  if (!comm) return bad_arg(NULL, "NULL communicator");
  if (dtype_size(dt) == 0) return bad_arg(comm, "invalid datatype");
  if (kind == K_ALLREDUCE || kind == K_REDUCE || kind == K_REDUCESCATTER) {
    if (resolve_op(comm, op, dt, &o.op) != ncclSuccess) return bad_arg(comm, "invalid reduction operation");
  }
  if ((kind == K_BROADCAST || kind == K_REDUCE || kind == K_SEND || kind == K_RECV) &&
      (root < 0 || root >= comm->nranks))
    return bad_arg(comm, kind == K_SEND || kind == K_RECV ? "invalid peer" : "invalid root");
  if (count) {
    int needs_send = kind != K_RECV && !(kind == K_BROADCAST && root != comm->rank);
    int needs_recv = kind != K_SEND && !(kind == K_REDUCE && root != comm->rank);
    if ((needs_send && !send) || (needs_recv && !recv)) return bad_arg(comm, "NULL buffer");
  }
  o.stream = stream_get(stream);
  if (!o.stream) return ncclSystemError;
  o.kind = kind;
  o.comm = comm;
  o.send = send;
  o.recv = recv;
  o.count = count;
  o.dtype = dt;
  o.root = root;
  return add_op(&o);
}

ND_API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  nd_log(comm ? comm->rank : -1, "ncclReduce", "count=%zu datatype=%d op=%d root=%d", count, (int)datatype, (int)op,
         root);
  return enqueue(K_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ND_API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  int root, ncclComm_t comm, cudaStream_t stream) {
  nd_log(comm ? comm->rank : -1, "ncclBroadcast", "count=%zu datatype=%d root=%d", count, (int)datatype, root);
  return enqueue(K_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ND_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  nd_log(comm ? comm->rank : -1, "ncclAllReduce", "count=%zu datatype=%d op=%d", count, (int)datatype, (int)op);
  return enqueue(K_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ND_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  nd_log(comm ? comm->rank : -1, "ncclReduceScatter", "count=%zu datatype=%d op=%d", recvcount, (int)datatype,
         (int)op);
  return enqueue(K_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

ND_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream) {
  nd_log(comm ? comm->rank : -1, "ncclAllGather", "count=%zu datatype=%d", sendcount, (int)datatype);
  return enqueue(K_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

ND_API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
  nd_log(comm ? comm->rank : -1, "ncclSend", "peer=%d count=%zu datatype=%d", peer, count, (int)datatype);
  return enqueue(K_SEND, sendbuff, NULL, count, datatype, ncclSum, peer, comm, stream);
}

ND_API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
  nd_log(comm ? comm->rank : -1, "ncclRecv", "peer=%d count=%zu datatype=%d", peer, count, (int)datatype);
  return enqueue(K_RECV, NULL, recvbuff, count, datatype, ncclSum, peer, comm, stream);
}
