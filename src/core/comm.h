/* The communicator object and the backend contract. */
#ifndef BRAID_COMM_H
#define BRAID_COMM_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>

#include "braid.h"
#include "core/log.h"

typedef struct braid__backend_ops braid__backend_ops;

/* Optional CUDA stream hooks; NULL table: the backend has no communication stream. */
typedef struct braid__stream_ops {
  braid_status (*event_create)(braid_comm *c, uint64_t *event);
  braid_status (*event_destroy)(braid_comm *c, uint64_t event);
  braid_status (*event_record_on_comm_stream)(braid_comm *c, uint64_t event);
  braid_status (*event_record_on_stream)(braid_comm *c, uint64_t event, uint64_t stream);
  braid_status (*comm_stream_wait_event)(braid_comm *c, uint64_t event);
  braid_status (*stream_wait_event)(braid_comm *c, uint64_t stream, uint64_t event);
  braid_status (*sync_comm_stream)(braid_comm *c);
} braid__stream_ops;

/*
 * A backend: a const table. The core has already checked every argument
 * (pointers, ranges, dtype/op pair, overflow), rejected count 0 where it is a
 * no-op, holds c->lock (calls are serialized), and set c->call to the public
 * call's name. Backends report failures with braid__fail(), which composes
 * the message and marks fatal statuses sticky. Blocking waits honour
 * c->timeout_s and braid__aborted(c).
 */
struct braid__backend_ops {
  const char *name;
  /* Creates the state of a new world communicator (c->rank, c->size set). */
  braid_status (*init)(braid_comm *c);
  /* Creates child's state from parent: members[i] is the parent rank of child
     rank i; child->rank/size set. Collective over the members only. */
  braid_status (*split)(braid_comm *parent, braid_comm *child, const int *members, int n);
  /* Best-effort completion of pending work within timeout_s, logging what it
     abandons, then frees the backend state. Must not block longer. */
  void (*destroy)(braid_comm *c, double timeout_s);
  /* From any thread, without c->lock: wakes every waiter so it sees the abort. */
  void (*abort)(braid_comm *c);

  /* Non-blocking point-to-point; completed by sync. */
  braid_status (*send)(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int dest, uint32_t tag);
  braid_status (*recv)(braid_comm *c, void *buf, size_t count, braid_dtype dt, int src, uint32_t tag);
  braid_status (*sync)(braid_comm *c);
  braid_status (*barrier)(braid_comm *c);

  braid_status (*all_reduce)(braid_comm *c, void *buf, size_t count, braid_dtype dt, braid_op op);
  braid_status (*broadcast)(braid_comm *c, void *buf, size_t count, braid_dtype dt, int root);
  braid_status (*all_gather)(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt);
  braid_status (*reduce_scatter)(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                 braid_op op);

  const braid__stream_ops *stream;
};

#define BRAID_ERRLEN 512

struct braid_comm {
  const braid__backend_ops *ops;
  void *be; /* backend state */
  int rank, size;
  uint64_t id;        /* unique per communicator within a job: tags, store namespaces */
  uint32_t nsplits;   /* splits made from this communicator so far */
  uint64_t seq;       /* collectives issued so far (same on every rank) */
  double timeout_s;   /* 0: wait forever */
  double destroy_timeout_s;
  struct braid__boot *boot; /* rendezvous store and job layout (bootstrap/bootstrap.h) */

  pthread_mutex_t lock;   /* serializes calls */
  const char *call;       /* name of the public call in progress (under lock) */
  atomic_int failed;      /* sticky fatal status, 0 while healthy */
  atomic_int aborted;     /* braid_abort() was called */

  pthread_mutex_t err_lock; /* guards the messages (abort may write from another thread) */
  char last_error[BRAID_ERRLEN];
  char fatal_error[BRAID_ERRLEN]; /* message of the error that failed the communicator */
};

/* Records an error on c (or on this thread only, c NULL): message
   "<call>: <text> (rank R)", logged, and stored for braid_last_error. Fatal
   statuses (TIMEOUT, PEER_LOST, ABORTED) make c failed. Returns st. */
braid_status braid__fail(braid_comm *c, braid_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
braid_status braid__vfail(braid_comm *c, braid_status st, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

static inline int braid__aborted(const braid_comm *c) {
  return atomic_load_explicit(&((braid_comm *)c)->aborted, memory_order_acquire);
}

static inline int braid__status_is_fatal(braid_status st) {
  return st == BRAID_ERR_TIMEOUT || st == BRAID_ERR_PEER_LOST || st == BRAID_ERR_ABORTED;
}

/* The sentence every backend uses when a message and its receive differ:
   "message from rank R with tag T has N elements of f32 (B bytes) but the receive expects ...". */
void braid__mismatch_text(char *out, size_t len, int src, uint32_t tag, size_t msg_count, braid_dtype msg_dt,
                          size_t recv_count, braid_dtype recv_dt);

/* Registry of built backends; NULL if name is unknown. */
const braid__backend_ops *braid__backend_find(const char *name);
/* Comma-separated names of the built backends (for messages). */
const char *braid__backend_names(void);

extern const braid__backend_ops braid__self_ops;
extern const braid__backend_ops braid__shm_ops;

#endif
