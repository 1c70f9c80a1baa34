/* The public entry points' shared pieces: the backend registry, the
   serialization of calls and their argument checks. */
#ifndef BRAID_API_H
#define BRAID_API_H

#include <stddef.h>
#include <string.h>

#include "core/comm.h"
#include "core/dtype.h"
#include "core/reduce.h"
#include "core/trace.h"

braid_status braid__null_comm(const char *call);

/* Registry of built backends; NULL if name is unknown. */
const braid__backend *braid__backend_find(const char *name);
/* Comma-separated names of the built backends (for messages and braid-info). */
const char *braid__backend_names(void);

/* Frees the completed user operations (braid_sync, braid_barrier). */
void braid__reap(braid_comm *c);

/* The slow halves of braid__enter / braid__leave (a failed communicator,
   an error to spread). */
braid_status braid__enter_failed(braid_comm *c, const char *call);
braid_status braid__leave_slow(braid_comm *c, braid_status st);

/* Locks c for one public call; fails at once if c is failed (the status). */
static inline braid_status braid__enter(braid_comm *c, const char *call) {
  if (!c) return braid__null_comm(call);
  if (pthread_mutex_trylock(&c->lock)) {
    /* Counted, so that a braid_sync waiting in another thread lets this call in. */
    atomic_fetch_add_explicit(&c->entering, 1, memory_order_relaxed);
    pthread_mutex_lock(&c->lock);
    atomic_fetch_sub_explicit(&c->entering, 1, memory_order_relaxed);
  }
  c->call = call;
  if (atomic_load_explicit(&c->failed, memory_order_relaxed)) return braid__enter_failed(c, call);
  braid__trace_poll_signal(c);
  return BRAID_OK;
}

/* Ends the call: a fatal result goes out to the other ranks; unlocks. */
static inline braid_status braid__leave(braid_comm *c, braid_status st) {
  if (st || atomic_load_explicit(&c->failed, memory_order_relaxed)) return braid__leave_slow(c, st);
  braid__trace_end(&c->trace_cur, BRAID_OK);
  if (c->desc.kind != BRAID__COLL_NONE) c->prev_desc = c->desc;
  c->desc.kind = BRAID__COLL_NONE;
  c->call = NULL;
  pthread_mutex_unlock(&c->lock);
  return st;
}

/* Argument checks: inline fast paths, the sentences out of line. */
braid_status braid__bad_dtype(braid_comm *c, braid_dtype dt);
braid_status braid__bad_op(braid_comm *c, braid_dtype dt, braid_op op);
braid_status braid__bad_count(braid_comm *c, const char *what, const void *p, size_t count, braid_dtype dt);
braid_status braid__bad_rank(braid_comm *c, const char *what, int r);

/* A dtype braid knows and the backend can carry. */
static inline braid_status braid__check_dtype(braid_comm *c, braid_dtype dt) {
  if (braid__dtsize(dt) && ((c->ops->dtypes >> (unsigned)dt) & 1)) return BRAID_OK;
  return braid__bad_dtype(c, dt);
}

/* The above, and an op defined for the dtype. */
static inline braid_status braid__check_dtype_op_pair(braid_comm *c, braid_dtype dt, braid_op op) {
  braid_status st = braid__check_dtype(c, dt);
  if (st) return st;
  if ((unsigned)op <= (unsigned)BRAID_BXOR && braid__check_dtype_op(dt, op) == BRAID_OK) return BRAID_OK;
  return braid__bad_op(c, dt, op);
}

/* A buffer not NULL unless it is empty. */
static inline braid_status braid__check_buf(braid_comm *c, const char *what, const void *p, size_t count) {
  if (p || !count) return BRAID_OK;
  return braid__bad_count(c, what, p, count, BRAID_U8);
}

/* bytes = count * dtype size * mult (world-size buffers), rejecting overflow. */
static inline braid_status braid__check_bytes(braid_comm *c, const char *what, size_t count, braid_dtype dt,
                                              size_t mult, size_t *bytes) {
  size_t b;
  if (!__builtin_mul_overflow(count, braid__dtsize(dt) * mult, &b) && b <= (size_t)PTRDIFF_MAX) {
    *bytes = b;
    return BRAID_OK;
  }
  return braid__bad_count(c, what, (const void *)1, count, dt);
}

static inline braid_status braid__check_rank(braid_comm *c, const char *what, int r) {
  if (r >= 0 && r < c->size) return BRAID_OK;
  return braid__bad_rank(c, what, r);
}

/* A reduction op resolved for one call: a builtin braid_op, or a scaled
   sum of this communicator with its scalar copied (a call queued in a group
   keeps it even if the op is destroyed before braid_group_end). */
typedef struct braid__redop {
  braid_op op; /* as the caller passed it */
  int premul;
  uint32_t digest;
  unsigned char scalar[16];
} braid__redop;

braid_status braid__bad_premul(braid_comm *c, braid_dtype dt, braid_op op);

/* The dtype/op check for reductions, scaled sums included. */
static inline braid_status braid__check_red(braid_comm *c, braid_dtype dt, braid_op op, braid__redop *out) {
  out->op = op;
  out->premul = 0;
  if ((unsigned)op <= (unsigned)BRAID_BXOR) return braid__check_dtype_op_pair(c, dt, op);
  braid_status st = braid__check_dtype(c, dt);
  if (st) return st;
  const braid__premul *p = braid__premul_of(c, op);
  if (!p || p->dt != (uint8_t)dt) return braid__bad_premul(c, dt, op);
  out->premul = 1;
  out->digest = p->digest;
  memcpy(out->scalar, p->scalar, sizeof out->scalar);
  return BRAID_OK;
}

/* One collective call with its arguments checked: what runs at once, or
   at braid_group_end when the call was made inside a group. */
typedef struct braid__coll_args {
  braid__coll_kind kind;
  const void *send;
  void *recv; /* all-reduce and broadcast: the buffer */
  size_t count;
  braid_dtype dt;
  braid__redop red;
  int root;
  size_t bytes; /* per rank's buffer or block, for the selection table */
  const size_t *send_counts, *send_displs, *recv_counts, *recv_displs; /* all-to-allv */
  uint64_t before; /* a barrier queued in a group: its sync covers the user operations numbered below this (0: all) */
} braid__coll_args;

/* Runs a checked call on c (locked; braid__enter done): the call's
   descriptor and sequence number, then the native or generic version. */
braid_status braid__coll_run(braid_comm *c, const braid__coll_args *a);

/* Grouped calls (api/group.c). Inside a group on this thread. */
int braid__group_open(void);
/* Queues a checked call for braid_group_end (copies what a needs). */
braid_status braid__group_queue(braid_comm *c, const braid__coll_args *a);
/* Drops this thread's queued calls on c (braid_destroy); refuses while
   another thread's group holds calls on it. */
braid_status braid__group_forget(braid_comm *c);

#define BRAID__TRY(expr)                            \
  do {                                              \
    braid_status try_st_ = (expr);                  \
    if (try_st_) return braid__leave(c, try_st_);   \
  } while (0)

#endif
