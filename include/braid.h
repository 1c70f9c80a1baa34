/*
 * braid — collective communication for C and C++.
 *
 * One communicator API (all-reduce, broadcast, all-gather, reduce-scatter,
 * reduce, gather, scatter, all-to-all(v), scaled sums, grouped calls, tagged
 * send/recv, sync, barrier, split, CUDA stream/event hooks) over several
 * backends. This is the only public header.
 *
 * Conventions
 *  - Every call returns a braid_status; on error braid_last_error() holds a
 *    sentence naming the call, the argument and the rank.
 *  - After a fatal error (peer lost, timeout, abort) a communicator is failed:
 *    every later call on it returns the same status at once, except
 *    braid_destroy.
 *  - Counts are element counts (size_t); count 0 is a valid no-op.
 *  - Collectives may complete before they return (CPU backends) or be
 *    stream-ordered (GPU backends): portable code calls braid_sync() before
 *    reading results or reusing buffers.
 */
#ifndef BRAID_H
#define BRAID_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BRAID_VERSION_MAJOR 0
#define BRAID_VERSION_MINOR 2
#define BRAID_VERSION_PATCH 0
/* Single comparable number: MAJOR*10000 + MINOR*100 + PATCH. */
#define BRAID_VERSION_CODE \
  (BRAID_VERSION_MAJOR * 10000 + BRAID_VERSION_MINOR * 100 + BRAID_VERSION_PATCH)

#if defined(_WIN32)
#define BRAID_API
#elif defined(__GNUC__)
#define BRAID_API __attribute__((visibility("default")))
#else
#define BRAID_API
#endif

typedef struct braid_comm braid_comm; /* opaque */

typedef enum braid_status {
  BRAID_OK = 0,
  BRAID_ERR_INVALID_ARG,  /* a bad argument; nothing was done */
  BRAID_ERR_UNSUPPORTED,  /* meaningless dtype/op pair, or a feature the backend lacks */
  BRAID_ERR_NO_MEMORY,
  BRAID_ERR_TIMEOUT,      /* a blocking call waited longer than the timeout (fatal) */
  BRAID_ERR_PEER_LOST,    /* another rank died or disconnected (fatal) */
  BRAID_ERR_ABORTED,      /* braid_abort() was called (fatal) */
  BRAID_ERR_MISMATCH,     /* a message's size or type differs from the receive's, or ranks
                             made different collective calls (fatal) */
  BRAID_ERR_BOOTSTRAP,    /* ranks could not find each other, or bad launcher settings */
  BRAID_ERR_SYSTEM,       /* an operating-system call failed */
  BRAID_ERR_BACKEND,      /* the underlying library (MPI, NCCL, CUDA) reported an error */
  BRAID_ERR_INTERNAL      /* a bug in braid (fatal) */
} braid_status;           /* more may be added at the end */

/* Same codes as the reference DType. */
typedef enum braid_dtype {
  BRAID_F64 = 0,
  BRAID_F32 = 1,
  BRAID_F16 = 2,      /* IEEE 754 binary16 */
  BRAID_BF16 = 3,     /* bfloat16 */
  BRAID_FP8_E4M3 = 4, /* OCP E4M3FN: no infinities, max 448, one NaN pattern */
  BRAID_FP8_E5M2 = 5, /* OCP E5M2: IEEE-like, with infinities */
  BRAID_I64 = 10,
  BRAID_I32 = 11,
  BRAID_I16 = 12,
  BRAID_I8 = 13,
  BRAID_U64 = 20,
  BRAID_U32 = 21,
  BRAID_U16 = 22,
  BRAID_U8 = 23,
  BRAID_BOOL = 30,    /* one byte; any non-zero byte is true, results are 0 or 1 */
  BRAID_C64 = 40,     /* complex of two f32 (real, imaginary) */
  BRAID_C128 = 41     /* complex of two f64 */
} braid_dtype;

/*
 * Reductions. F16/BF16/FP8 are computed in f32 and rounded once to nearest-even.
 * Integers wrap. AVG = SUM divided by the world size; on integers the wrapped
 * sum is divided with truncation toward zero. MIN/MAX propagate NaN and order
 * -0 below +0. On BOOL, SUM/MAX are OR and PROD/MIN are AND. Complex types
 * support SUM, PROD and AVG. BAND/BOR/BXOR are for integers and BOOL.
 */
typedef enum braid_op {
  BRAID_SUM,
  BRAID_PROD,
  BRAID_MIN,
  BRAID_MAX,
  BRAID_AVG,
  BRAID_BAND,
  BRAID_BOR,
  BRAID_BXOR
} braid_op;

#define BRAID_SPLIT_NONE UINT32_MAX /* color: this rank joins no new communicator */

/*
 * Configuration for braid_init. Start from BRAID_CONFIG_INIT and set what you
 * need; a field left at its default is taken from the environment, then from
 * the built-in default (precedence: field > environment > default).
 */
typedef struct braid_config {
  size_t struct_size;       /* sizeof(braid_config) at compile time; set by BRAID_CONFIG_INIT */
  const char *backend;      /* NULL: BRAID_BACKEND, else (or "auto") "self" for one rank, "mpi" under mpirun
                               without a store, "shm" when all ranks share a node, "hier" when they do not */
  int rank;                 /* -1: BRAID_RANK, else 0 */
  int world_size;           /* -1: BRAID_WORLD_SIZE, else 1 */
  double timeout_s;         /* < 0: BRAID_TIMEOUT, else 300; 0 waits forever */
  double destroy_timeout_s; /* < 0: BRAID_DESTROY_TIMEOUT, else 5: bound of destroy's final sync */
  const char *store_addr;   /* "host:port" of the rendezvous store; NULL: BRAID_STORE or the launcher's */
  const char *token_hex;    /* job token, 64 hex digits; NULL: BRAID_TOKEN, else none (loopback only) */
  int local_rank;           /* -1: BRAID_LOCAL_RANK or the launcher's, else derived at rendezvous */
  int local_size;           /* -1: BRAID_LOCAL_SIZE or the launcher's (set with local_rank) */
  double init_timeout_s;    /* < 0: BRAID_INIT_TIMEOUT, else 60: bound of the rendezvous; 0 waits forever */
  /* Fields are only ever added here, at the end: a program built against an
     older braid.h passes a smaller struct_size and gets the defaults. */
  const void *mpi_comm;     /* backend mpi: the address of an MPI_Comm the application made (braid
                               duplicates it; rank and size are MPI's); NULL: MPI_COMM_WORLD */
} braid_config;

#define BRAID_CONFIG_INIT {sizeof(braid_config), NULL, -1, -1, -1.0, -1.0, NULL, NULL, -1, -1, -1.0, NULL}

BRAID_API const char *braid_version(void); /* "MAJOR.MINOR.PATCH" of the library in use */
BRAID_API size_t braid_dtype_size(braid_dtype dtype); /* 0 for an unknown code */
BRAID_API const char *braid_dtype_name(braid_dtype dtype); /* "f32", ...; NULL if unknown */
BRAID_API const char *braid_op_name(braid_op op);          /* "sum", ...; NULL if unknown */
BRAID_API const char *braid_status_string(braid_status st);
/* Last error message on comm; comm NULL: this thread's last error. Never NULL.
   The string stays valid until this thread's next call to braid_last_error. */
BRAID_API const char *braid_last_error(const braid_comm *comm);

BRAID_API braid_status braid_init(const braid_config *cfg, braid_comm **comm); /* cfg NULL: from the environment */
BRAID_API braid_status braid_destroy(braid_comm *comm);
/* Fails the communicator: every blocked or later call returns BRAID_ERR_ABORTED.
   Safe from any thread at any time. The other ranks' calls then fail with
   BRAID_ERR_PEER_LOST naming this rank. Release the communicator with
   braid_destroy. */
BRAID_API braid_status braid_abort(braid_comm *comm);
BRAID_API int braid_world_size(const braid_comm *comm); /* -1 if comm is NULL */
BRAID_API int braid_rank(const braid_comm *comm);       /* -1 if comm is NULL */
BRAID_API const char *braid_backend(const braid_comm *comm); /* "self", "shm", "tcp", ...; NULL if comm is NULL */

/* In place: buf holds count elements on every rank. */
BRAID_API braid_status braid_all_reduce(braid_comm *c, void *buf, size_t count, braid_dtype dt, braid_op op);
BRAID_API braid_status braid_broadcast(braid_comm *c, void *buf, size_t count, braid_dtype dt, int root);
/* Rank r's count elements land at recv + r*count; in place when send == recv + rank*count. */
BRAID_API braid_status braid_all_gather(braid_comm *c, const void *send, void *recv, size_t count,
                                        braid_dtype dt);
/* send holds count*world_size elements; rank r receives reduced chunk r;
   in place when recv == send + rank*count. */
BRAID_API braid_status braid_reduce_scatter(braid_comm *c, const void *send, void *recv, size_t count,
                                            braid_dtype dt, braid_op op);
/* Reduction to root: recv (count elements) is significant at the root only;
   in place at the root when send == recv. */
BRAID_API braid_status braid_reduce(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                    braid_op op, int root);
/* Rank r's count elements land at recv + r*count on the root; recv (count *
   world_size elements) is significant at the root only; in place at the root
   when send == recv + root*count. */
BRAID_API braid_status braid_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                    int root);
/* Rank r receives the count elements at send + r*count of the root; send
   (count * world_size elements) is significant at the root only; in place at
   the root when recv == send + root*count. */
BRAID_API braid_status braid_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                     int root);
/* send and recv hold count * world_size elements: block j of rank i lands
   as block i of rank j. In place when send == recv. */
BRAID_API braid_status braid_all_to_all(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt);
/* Per-peer counts and displacements, in elements: send_counts[j] elements at
   send + send_displs[j] go to rank j and land at recv + recv_displs[i] of
   rank j, which must expect exactly that many (recv_counts[i]); a
   disagreement is BRAID_ERR_MISMATCH naming both ranks and counts. Always a
   collective, even when every count of this rank is 0. In place when send ==
   recv: the data for rank j is recv_counts[j] elements at recv +
   recv_displs[j], and send_counts / send_displs are not read (may be NULL). */
BRAID_API braid_status braid_all_to_allv(braid_comm *c, const void *send, const size_t *send_counts,
                                         const size_t *send_displs, void *recv, const size_t *recv_counts,
                                         const size_t *recv_displs, braid_dtype dt);

/* A scaled sum, as NCCL's ncclRedOpCreatePreMulSum: *op (a handle beyond
   BRAID_BXOR, valid on c only, with dtype dt only) makes a reduction compute
   sum over ranks of scalar * x, the scalar (one element of dt, the same bits
   on every rank) applied in the reduction precision before the sum: in the
   dtype for full-precision types (integers wrap, complex multiply), in f32
   for f16, bf16 and fp8, rounded once at the end. Not for bool. Up to 64 live
   ops per communicator; braid_op_destroy frees one. */
BRAID_API braid_status braid_op_premul_sum(braid_comm *c, const void *scalar, braid_dtype dt, braid_op *op);
BRAID_API braid_status braid_op_destroy(braid_comm *c, braid_op op);

/* Grouped calls, per thread and nestable, as ncclGroupStart/End. Inside a
   group point-to-point calls post as always and collectives are checked and
   queued; the outermost braid_group_end runs them in issue order while the
   group's sends and receives progress, and returns the first error. Buffers
   of queued calls must not be touched until braid_group_end returns. */
BRAID_API braid_status braid_group_start(void);
BRAID_API braid_status braid_group_end(void);

/* Non-blocking: buffers may be reused / read after braid_sync or braid_barrier.
   Messages of one (source, tag) pair arrive in the order sent. */
BRAID_API braid_status braid_send(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int dest,
                                  uint32_t tag);
BRAID_API braid_status braid_recv(braid_comm *c, void *buf, size_t count, braid_dtype dt, int src,
                                  uint32_t tag);
/* Completes every pending operation of this rank on c. */
BRAID_API braid_status braid_sync(braid_comm *c);
/* Implies braid_sync, then waits until every rank has reached the barrier. */
BRAID_API braid_status braid_barrier(braid_comm *c);
/* Collective. Same color -> same new communicator, ranked by (key, old rank);
   color BRAID_SPLIT_NONE -> *out = NULL. */
BRAID_API braid_status braid_split(braid_comm *c, uint32_t color, uint32_t key, braid_comm **out);

/* Host memory for communication buffers, like ncclMemAlloc. It is ordinary
   read/write memory that any backend accepts, but every process of this host
   can map it: the shm backend's peers copy straight out of such a buffer
   (one copy, no staging, no page pinning) instead of through shared staging
   space. Not tied to a communicator; thread-safe. The size is rounded up to
   whole pages; pages are zero-filled on first touch. */
BRAID_API braid_status braid_mem_alloc(void **ptr, size_t size);
/* ptr must be a pointer braid_mem_alloc returned (NULL is a no-op), and no
   operation may still use it. */
BRAID_API braid_status braid_mem_free(void *ptr);

/* Communication memory that suits c's backend: on nccl, device memory from
   ncclMemAlloc (the allocation NCCL's zero-copy and NVLink SHARP paths
   want; the current CUDA device's); on the others, braid_mem_alloc's. Free
   it with braid_comm_mem_free on a communicator of the same backend. */
BRAID_API braid_status braid_comm_mem_alloc(braid_comm *c, void **ptr, size_t size);
BRAID_API braid_status braid_comm_mem_free(braid_comm *c, void *ptr);
/* Registers size bytes at buf with c for its zero-copy paths (on nccl
   ncclCommRegister; elsewhere nothing to do and *handle is a token) until
   braid_mem_deregister(c, *handle). Optional: unregistered buffers work. */
BRAID_API braid_status braid_mem_register(braid_comm *c, void *buf, size_t size, void **handle);
BRAID_API braid_status braid_mem_deregister(braid_comm *c, void *handle);

/* CUDA stream/event synchronization for compute/communication overlap.
   Backends without a communication stream return false / BRAID_ERR_UNSUPPORTED.
   Events and streams are opaque handles (cudaEvent_t / cudaStream_t values).
   An event handle braid_event_create did not make, or one destroyed, is
   BRAID_ERR_INVALID_ARG; a stream handle must be a live stream (or 0). */
BRAID_API bool braid_has_stream_sync(const braid_comm *c);
BRAID_API braid_status braid_event_create(braid_comm *c, uint64_t *event); /* timing disabled */
BRAID_API braid_status braid_event_destroy(braid_comm *c, uint64_t event);
BRAID_API braid_status braid_event_record_on_comm_stream(braid_comm *c, uint64_t event);
BRAID_API braid_status braid_event_record_on_stream(braid_comm *c, uint64_t event, uint64_t stream);
BRAID_API braid_status braid_comm_stream_wait_event(braid_comm *c, uint64_t event);
BRAID_API braid_status braid_stream_wait_event(braid_comm *c, uint64_t stream, uint64_t event);
BRAID_API braid_status braid_sync_comm_stream(braid_comm *c);

#ifdef __cplusplus
}
#endif

#endif /* BRAID_H */
