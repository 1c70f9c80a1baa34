/* The collectives: argument checks, the call's descriptor and sequence
   number (the cross-rank check), then the backend's native version or the
   generic algorithm. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "algos/algos.h"
#include "api/api.h"
#include "core/trace.h"
#include "core/wait.h"

static int overlaps(const void *a, size_t alen, const void *b, size_t blen) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return alen && blen && x < y + blen && y < x + alen;
}

/* Whether an unexpected message may be a stale one of an earlier call:
   some wait in c's queue, or its backend keeps them in its parts'. */
static int may_hold_stale(const braid_comm *c) { return c->check && (c->match.nunexp || c->ops->find_unexpected); }

/* Starts collective kind: every rank counts collectives alike, so (seq,
   descriptor) names the same call everywhere. A failure another rank
   published through the backend's channel stops it before it waits. */
static braid_status begin(braid_comm *c, braid__coll_kind kind, size_t count, braid_dtype dt, int32_t arg) {
  c->seq++;
  c->desc = braid__desc_make(kind, count, dt, arg);
  c->desc.flags = c->desc_flags;
  c->desc_hash = c->check ? braid__desc_hash(c->seq, &c->desc) : 0;
  if (c->fail_flag && atomic_load_explicit(c->fail_flag, memory_order_acquire) && braid__poll_remote_failure(c, 0))
    return (braid_status)atomic_load(&c->failed);
  /* A message of an earlier collective that no receive took: its sender
     was in another call (a broadcast root that did not wait learns here). */
  if (may_hold_stale(c)) {
    braid_status st = braid__coll_check_stale(c, 0, 0);
    if (st) return st;
  }
  if (c->check && c->ops->coll_start) c->ops->coll_start(c);
  braid__trace_begin(c, kind, count, dt, arg, -1);
  return BRAID_OK;
}

/* After a generic algorithm: anything of this collective still unexpected
   came from a rank in another call. A message of it may also arrive later
   (from a broadcast root that did not wait): the next collective looks
   again when it ends. */
static braid_status end_generic(braid_comm *c, braid_status st) {
  if (!st && may_hold_stale(c)) st = braid__coll_check_stale(c, 1, 1);
  c->stale_watch = 1;
  return st;
}

/* After a native collective that followed a generic one: its peers sent
   what they sent in the generic one before they entered this one, so one
   progress pass shows any message no receive took. */
static braid_status end_native(braid_comm *c, braid_status st) {
  if (!c->stale_watch) return st;
  c->stale_watch = 0;
  if (st || !c->check) return st;
  if ((st = c->ops->progress(c))) return st;
  return may_hold_stale(c) ? braid__coll_check_stale(c, 1, 1) : BRAID_OK;
}

/* The backend's own version unless BRAID_ALGO named a generic algorithm. */
static int use_native(const braid_comm *c, braid__coll_kind kind, const void *fn) {
  return fn && c->algo[kind] <= BRAID__ALGO_NATIVE;
}

/* The generic algorithm: BRAID_ALGO's, else the table's for these bytes
   (per rank's buffer or block, as the algorithms count them). */
static int generic_algo(braid_comm *c, braid__coll_kind kind, size_t bytes) {
  int a = c->algo[kind] > BRAID__ALGO_NATIVE ? c->algo[kind] : braid__algo_select(kind, bytes, c->size);
  if (c->trace_cur) c->trace_cur->algo = braid__algo_name(a);
  return a;
}

static int native(braid_comm *c, braid__coll_kind kind, const void *fn) {
  if (!use_native(c, kind, fn)) return 0;
  if (c->trace_cur) c->trace_cur->algo = "native";
  return 1;
}

static const void *native_fn(const braid_comm *c, braid__coll_kind kind) {
  const braid__backend *o = c->ops;
  switch (kind) {
    case BRAID__COLL_ALL_REDUCE: return (const void *)o->all_reduce;
    case BRAID__COLL_BROADCAST: return (const void *)o->broadcast;
    case BRAID__COLL_ALL_GATHER: return (const void *)o->all_gather;
    case BRAID__COLL_REDUCE_SCATTER: return (const void *)o->reduce_scatter;
    case BRAID__COLL_BARRIER: return (const void *)o->barrier;
    case BRAID__COLL_REDUCE: return (const void *)o->reduce;
    case BRAID__COLL_GATHER: return (const void *)o->gather;
    case BRAID__COLL_SCATTER: return (const void *)o->scatter;
    case BRAID__COLL_ALL_TO_ALL: return (const void *)o->all_to_all;
    case BRAID__COLL_ALL_TO_ALLV: return (const void *)o->all_to_allv;
    default: return NULL;
  }
}

/* The native version of kind, else the generic algorithm, on these
   buffers (a scaled sum has become BRAID_SUM of scaled inputs unless the
   backend takes the op). bytes: per rank's buffer or block. */
static braid_status dispatch(braid_comm *c, const braid__coll_args *a, const void *send, void *recv, braid_dtype dt,
                             braid_op op, size_t bytes) {
  const braid__backend *o = c->ops;
  const braid__coll_kind kind = a->kind;
  const size_t count = a->count;
  if (native(c, kind, native_fn(c, kind)) && !(o->declines && o->declines(c, kind, bytes))) {
    braid_status st;
    switch (kind) {
      case BRAID__COLL_ALL_REDUCE: st = o->all_reduce(c, recv, count, dt, op); break;
      case BRAID__COLL_BROADCAST: st = o->broadcast(c, recv, count, dt, a->root); break;
      case BRAID__COLL_ALL_GATHER: st = o->all_gather(c, send, recv, count, dt); break;
      case BRAID__COLL_REDUCE_SCATTER: st = o->reduce_scatter(c, send, recv, count, dt, op); break;
      case BRAID__COLL_BARRIER: st = o->barrier(c); break;
      case BRAID__COLL_REDUCE: st = o->reduce(c, send, recv, count, dt, op, a->root); break;
      case BRAID__COLL_GATHER: st = o->gather(c, send, recv, count, dt, a->root); break;
      case BRAID__COLL_SCATTER: st = o->scatter(c, send, recv, count, dt, a->root); break;
      case BRAID__COLL_ALL_TO_ALL: st = o->all_to_all(c, send, recv, count, dt); break;
      default:
        st = o->all_to_allv(c, send, a->send_counts, a->send_displs, recv, a->recv_counts, a->recv_displs, dt);
        break;
    }
    if (st != BRAID__DECLINED) return end_native(c, st);
  }
  int g = generic_algo(c, kind, bytes);
  braid_status st;
  if (c->check && o->before_generic && (st = o->before_generic(c))) return st;
  switch (kind) {
    case BRAID__COLL_ALL_REDUCE: st = braid__algo_all_reduce(c, g, recv, count, dt, op); break;
    case BRAID__COLL_BROADCAST: st = braid__algo_broadcast(c, g, recv, count, dt, a->root); break;
    case BRAID__COLL_ALL_GATHER: st = braid__algo_all_gather(c, g, send, recv, count, dt); break;
    case BRAID__COLL_REDUCE_SCATTER: st = braid__algo_reduce_scatter(c, g, send, recv, count, dt, op); break;
    case BRAID__COLL_BARRIER: st = braid__algo_barrier(c, g); break;
    case BRAID__COLL_REDUCE: st = braid__algo_reduce(c, g, send, recv, count, dt, op, a->root); break;
    case BRAID__COLL_GATHER: st = braid__algo_gather(c, g, send, recv, count, dt, a->root); break;
    case BRAID__COLL_SCATTER: st = braid__algo_scatter(c, g, send, recv, count, dt, a->root); break;
    case BRAID__COLL_ALL_TO_ALL: st = braid__algo_all_to_all(c, g, send, recv, count, dt); break;
    default:
      st = braid__algo_all_to_allv(c, g, send, a->send_counts, a->send_displs, recv, a->recv_counts, a->recv_displs,
                                   dt);
      break;
  }
  return end_generic(c, st);
}

/*
 * A scaled sum the backend does not take itself: every rank multiplies its
 * input by the scalar in the reduction precision (braid__scale), then the
 * collective sums. A direct dtype is scaled in the dtype, in the caller's
 * buffer for an all-reduce (its input is overwritten by the result anyway)
 * and in scratch otherwise (a send buffer is never written). F16, BF16 and
 * FP8 are scaled into f32 and summed as f32, and the result is rounded once
 * into the dtype: the rule of every low-precision reduction.
 */
static braid_status premul(braid_comm *c, const braid__coll_args *a) {
  const int n = c->size, lp = braid__acc_size(a->dt) != braid_dtype_size(a->dt);
  const braid_dtype wdt = lp ? BRAID_F32 : a->dt;
  const size_t wsz = braid_dtype_size(wdt), count = a->count, wbytes = count * wsz;
  const size_t in = a->kind == BRAID__COLL_REDUCE_SCATTER ? count * (size_t)n : count;
  const int own = a->kind == BRAID__COLL_ALL_REDUCE && !lp;
  char *w = own ? a->recv : braid__scratch(c, BRAID__SCRATCH_PREMUL, in * wsz);
  if (!w) return BRAID_ERR_NO_MEMORY;
  braid__scale(w, a->kind == BRAID__COLL_ALL_REDUCE ? a->recv : a->send, in, a->dt, a->red.scalar);
  braid_status st;
  switch (a->kind) {
    case BRAID__COLL_ALL_REDUCE:
      st = dispatch(c, a, w, w, wdt, BRAID_SUM, wbytes);
      if (!st && lp) braid__acc_store(a->recv, w, count, a->dt, BRAID_SUM, 1);
      return st;
    case BRAID__COLL_REDUCE_SCATTER: { /* lp: in place in the f32 copy */
      char *out = lp ? w + (size_t)c->rank * wbytes : (char *)a->recv;
      st = dispatch(c, a, w, out, wdt, BRAID_SUM, wbytes);
      if (!st && lp) braid__acc_store(a->recv, out, count, a->dt, BRAID_SUM, 1);
      return st;
    }
    default: /* reduce; lp: in place in the f32 copy */
      st = dispatch(c, a, w, lp ? w : a->recv, wdt, BRAID_SUM, wbytes);
      if (!st && lp && c->rank == a->root) braid__acc_store(a->recv, w, count, a->dt, BRAID_SUM, 1);
      return st;
  }
}

static int32_t desc_arg(const braid__coll_args *a) {
  switch (a->kind) {
    case BRAID__COLL_ALL_REDUCE:
    case BRAID__COLL_REDUCE_SCATTER: return braid__desc_op_arg(a->red.op, a->red.premul, a->red.digest);
    case BRAID__COLL_REDUCE: return braid__desc_reduce_arg(a->root, a->red.op, a->red.premul, a->red.digest);
    case BRAID__COLL_BROADCAST:
    case BRAID__COLL_GATHER:
    case BRAID__COLL_SCATTER: return a->root;
    default: return 0;
  }
}

braid_status braid__coll_run(braid_comm *c, const braid__coll_args *a) {
  braid_status st;
  const int barrier = a->kind == BRAID__COLL_BARRIER;
  /* The call's number and flight-recorder entry first: a rank held in a
     barrier's own sync is seen to be in that barrier. */
  if ((st = begin(c, a->kind, a->kind == BRAID__COLL_ALL_TO_ALLV ? 0 : a->count, a->dt, desc_arg(a)))) return st;
  if (barrier) {
    /* Implies braid_sync: this rank's operations complete (and are freed)
       first; queued in a group, those issued before it, not the group's
       later ones, whose peers may send only after their own barrier. */
    st = braid__wait_idle(c, a->before);
    braid__reap(c);
    if (st) return st;
  }
  if (a->red.premul && !((c->ops->caps & BRAID__CAP_PREMUL) && use_native(c, a->kind, native_fn(c, a->kind))))
    return premul(c, a);
  st = dispatch(c, a, a->send, a->recv, a->dt, a->red.op, a->bytes);
  /* A point-to-point error found earlier (not fatal) is reported as
     braid_sync would, once the barrier is done: skipping the barrier would
     put this rank one collective behind the others. */
  if (barrier && !st && c->deferred) return braid__deferred_report(c);
  /* Resources, the OS or the library below failed inside the collective:
     the other ranks wait for this one, so the communicator fails and they
     are told (API.md). */
  if ((st == BRAID_ERR_NO_MEMORY || st == BRAID_ERR_SYSTEM || st == BRAID_ERR_BACKEND) && !atomic_load(&c->failed))
    braid__fail_promote(c, st);
  return st;
}

/* Runs a checked call now, or at braid_group_end inside a group. */
static braid_status submit(braid_comm *c, const braid__coll_args *a) {
  if (braid__group_open()) return braid__leave(c, braid__group_queue(c, a));
  return braid__leave(c, braid__coll_run(c, a));
}

/* The call's arguments, every field set but the scaled sum's scalar (read
   only when red.premul is set): a designated initializer zeroes the whole
   struct with a string store, which stood out in small calls' profiles. */
static inline void args_init(braid__coll_args *a, braid__coll_kind kind, const void *send, void *recv, size_t count,
                             braid_dtype dt, int root) {
  a->kind = kind;
  a->send = send;
  a->recv = recv;
  a->count = count;
  a->dt = dt;
  a->red.op = BRAID_SUM;
  a->red.premul = 0;
  a->red.digest = 0;
  a->root = root;
  a->bytes = 0;
  a->send_counts = a->send_displs = a->recv_counts = a->recv_displs = NULL;
  a->before = 0;
}

static braid_status bad_overlap(braid_comm *c, const char *a, const char *b, const char *where) {
  return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s overlaps %s but is not the in-place position %s", a, b, where);
}

braid_status braid_all_reduce(braid_comm *c, void *buf, size_t count, braid_dtype dt, braid_op op) {
  braid_status st = braid__enter(c, "braid_all_reduce");
  if (st) return st;
  braid__coll_args a;
  args_init(&a, BRAID__COLL_ALL_REDUCE, buf, buf, count, dt, 0);
  BRAID__TRY(braid__check_red(c, dt, op, &a.red));
  BRAID__TRY(braid__check_buf(c, "buf", buf, count));
  BRAID__TRY(braid__check_bytes(c, "buf", count, dt, 1, &a.bytes));
  if (count == 0) return braid__leave(c, BRAID_OK);
  return submit(c, &a);
}

braid_status braid_broadcast(braid_comm *c, void *buf, size_t count, braid_dtype dt, int root) {
  braid_status st = braid__enter(c, "braid_broadcast");
  if (st) return st;
  braid__coll_args a;
  args_init(&a, BRAID__COLL_BROADCAST, buf, buf, count, dt, root);
  BRAID__TRY(braid__check_dtype(c, dt));
  BRAID__TRY(braid__check_rank(c, "root", root));
  BRAID__TRY(braid__check_buf(c, "buf", buf, count));
  BRAID__TRY(braid__check_bytes(c, "buf", count, dt, 1, &a.bytes));
  if (count == 0) return braid__leave(c, BRAID_OK);
  return submit(c, &a);
}

braid_status braid_all_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt) {
  braid_status st = braid__enter(c, "braid_all_gather");
  if (st) return st;
  braid__coll_args a;
  args_init(&a, BRAID__COLL_ALL_GATHER, send, recv, count, dt, 0);
  size_t total = 0;
  BRAID__TRY(braid__check_dtype(c, dt));
  BRAID__TRY(braid__check_buf(c, "send", send, count));
  BRAID__TRY(braid__check_buf(c, "recv", recv, count));
  BRAID__TRY(braid__check_bytes(c, "send", count, dt, 1, &a.bytes));
  BRAID__TRY(braid__check_bytes(c, "recv", count, dt, (size_t)c->size, &total));
  if (count == 0) return braid__leave(c, BRAID_OK);
  const char *mine = (const char *)recv + (size_t)c->rank * a.bytes;
  if (send != mine && overlaps(send, a.bytes, recv, total)) {
    char where[48];
    snprintf(where, sizeof where, "recv + %d*count", c->rank);
    return braid__leave(c, bad_overlap(c, "send", "recv", where));
  }
  return submit(c, &a);
}

braid_status braid_reduce_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                  braid_op op) {
  braid_status st = braid__enter(c, "braid_reduce_scatter");
  if (st) return st;
  braid__coll_args a;
  args_init(&a, BRAID__COLL_REDUCE_SCATTER, send, recv, count, dt, 0);
  size_t total = 0;
  BRAID__TRY(braid__check_red(c, dt, op, &a.red));
  BRAID__TRY(braid__check_buf(c, "send", send, count));
  BRAID__TRY(braid__check_buf(c, "recv", recv, count));
  BRAID__TRY(braid__check_bytes(c, "recv", count, dt, 1, &a.bytes));
  BRAID__TRY(braid__check_bytes(c, "send", count, dt, (size_t)c->size, &total));
  if (count == 0) return braid__leave(c, BRAID_OK);
  const char *mine = (const char *)send + (size_t)c->rank * a.bytes;
  if ((const char *)recv != mine && overlaps(send, total, recv, a.bytes)) {
    char where[48];
    snprintf(where, sizeof where, "send + %d*count", c->rank);
    return braid__leave(c, bad_overlap(c, "recv", "send", where));
  }
  return submit(c, &a);
}

braid_status braid_reduce(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, braid_op op,
                          int root) {
  braid_status st = braid__enter(c, "braid_reduce");
  if (st) return st;
  braid__coll_args a;
  args_init(&a, BRAID__COLL_REDUCE, send, recv, count, dt, root);
  BRAID__TRY(braid__check_red(c, dt, op, &a.red));
  BRAID__TRY(braid__check_rank(c, "root", root));
  BRAID__TRY(braid__check_buf(c, "send", send, count));
  BRAID__TRY(braid__check_bytes(c, "send", count, dt, 1, &a.bytes));
  if (c->rank == root) { /* recv matters at the root only */
    BRAID__TRY(braid__check_buf(c, "recv", recv, count));
    if (count && send != recv && overlaps(send, a.bytes, recv, a.bytes))
      return braid__leave(c, bad_overlap(c, "recv", "send", "send (in place: send == recv)"));
  }
  if (count == 0) return braid__leave(c, BRAID_OK);
  return submit(c, &a);
}

braid_status braid_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int root) {
  braid_status st = braid__enter(c, "braid_gather");
  if (st) return st;
  braid__coll_args a;
  args_init(&a, BRAID__COLL_GATHER, send, recv, count, dt, root);
  size_t total = 0;
  BRAID__TRY(braid__check_dtype(c, dt));
  BRAID__TRY(braid__check_rank(c, "root", root));
  BRAID__TRY(braid__check_buf(c, "send", send, count));
  BRAID__TRY(braid__check_bytes(c, "send", count, dt, 1, &a.bytes));
  if (c->rank == root) { /* recv matters at the root only */
    BRAID__TRY(braid__check_buf(c, "recv", recv, count));
    BRAID__TRY(braid__check_bytes(c, "recv", count, dt, (size_t)c->size, &total));
    const char *mine = count ? (const char *)recv + (size_t)root * a.bytes : NULL;
    if (send != mine && overlaps(send, a.bytes, recv, total)) {
      char where[48];
      snprintf(where, sizeof where, "recv + %d*count", root);
      return braid__leave(c, bad_overlap(c, "send", "recv", where));
    }
  }
  if (count == 0) return braid__leave(c, BRAID_OK);
  return submit(c, &a);
}

braid_status braid_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int root) {
  braid_status st = braid__enter(c, "braid_scatter");
  if (st) return st;
  braid__coll_args a;
  args_init(&a, BRAID__COLL_SCATTER, send, recv, count, dt, root);
  size_t total = 0;
  BRAID__TRY(braid__check_dtype(c, dt));
  BRAID__TRY(braid__check_rank(c, "root", root));
  BRAID__TRY(braid__check_buf(c, "recv", recv, count));
  BRAID__TRY(braid__check_bytes(c, "recv", count, dt, 1, &a.bytes));
  if (c->rank == root) { /* send matters at the root only */
    BRAID__TRY(braid__check_buf(c, "send", send, count));
    BRAID__TRY(braid__check_bytes(c, "send", count, dt, (size_t)c->size, &total));
    const char *mine = count ? (const char *)send + (size_t)root * a.bytes : NULL;
    if ((const char *)recv != mine && overlaps(send, total, recv, a.bytes)) {
      char where[48];
      snprintf(where, sizeof where, "send + %d*count", root);
      return braid__leave(c, bad_overlap(c, "recv", "send", where));
    }
  }
  if (count == 0) return braid__leave(c, BRAID_OK);
  return submit(c, &a);
}

braid_status braid_all_to_all(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt) {
  braid_status st = braid__enter(c, "braid_all_to_all");
  if (st) return st;
  braid__coll_args a;
  args_init(&a, BRAID__COLL_ALL_TO_ALL, send, recv, count, dt, 0);
  size_t total = 0;
  BRAID__TRY(braid__check_dtype(c, dt));
  BRAID__TRY(braid__check_buf(c, "send", send, count));
  BRAID__TRY(braid__check_buf(c, "recv", recv, count));
  BRAID__TRY(braid__check_bytes(c, "send", count, dt, 1, &a.bytes));
  BRAID__TRY(braid__check_bytes(c, "send", count, dt, (size_t)c->size, &total));
  if (count == 0) return braid__leave(c, BRAID_OK);
  if (send != recv && overlaps(send, total, recv, total))
    return braid__leave(c, bad_overlap(c, "send", "recv", "recv (in place: send == recv)"));
  return submit(c, &a);
}

/* One side of an all-to-allv: counts[j] elements at buf + displs[j] for
   every rank j, none of them past the address space, buf not NULL where
   something moves; *lo / *hi: the byte extent they cover (lo > hi: none). */
static braid_status check_blocks(braid_comm *c, const char *side, const void *buf, const size_t *counts,
                                 const size_t *displs, braid_dtype dt, size_t *lo, size_t *hi) {
  const size_t esz = braid_dtype_size(dt);
  *lo = SIZE_MAX, *hi = 0;
  if (!counts) return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s_counts is NULL", side);
  if (!displs) return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s_displs is NULL", side);
  for (int j = 0; j < c->size; j++) {
    if (!counts[j]) continue;
    size_t end, bytes;
    if (__builtin_add_overflow(displs[j], counts[j], &end) || __builtin_mul_overflow(end, esz, &bytes) ||
        bytes > (size_t)PTRDIFF_MAX)
      return braid__fail(c, BRAID_ERR_INVALID_ARG,
                         "%s_displs[%d] %zu + %s_counts[%d] %zu elements of %s overflow the address space", side, j,
                         displs[j], side, j, counts[j], braid_dtype_name(dt));
    if (!buf)
      return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s is NULL with %s_counts[%d] = %zu", side, side, j, counts[j]);
    if (displs[j] * esz < *lo) *lo = displs[j] * esz;
    if (bytes > *hi) *hi = bytes;
  }
  return BRAID_OK;
}

typedef struct span {
  size_t lo, hi;
  int rank;
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The received blocks may not overlap each other: one pass when the
   displacements grow with the rank (the usual layout), else sorted. */
static braid_status recv_overlap(braid_comm *c, int a, int b) {
  return braid__fail(c, BRAID_ERR_INVALID_ARG, "recv_displs put the blocks from ranks %d and %d on the same elements",
                     a < b ? a : b, a < b ? b : a);
}

static braid_status check_recv_disjoint(braid_comm *c, const size_t *counts, const size_t *displs) {
  const int n = c->size;
  size_t end = 0;
  int prev = -1, j;
  for (j = 0; j < n; j++) {
    if (!counts[j]) continue;
    if (prev >= 0 && displs[j] < end) {
      if (displs[j] >= displs[prev]) return recv_overlap(c, prev, j);
      break; /* out of order: sort */
    }
    end = displs[j] + counts[j], prev = j;
  }
  if (j == n) return BRAID_OK;
  span *s = malloc(sizeof *s * (size_t)n);
  if (!s) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory checking %d ranks' recv_displs", n);
  int m = 0;
  for (j = 0; j < n; j++)
    if (counts[j]) s[m++] = (span){displs[j], displs[j] + counts[j], j};
  qsort(s, (size_t)m, sizeof *s, span_cmp);
  for (int i = 1; i < m; i++)
    if (s[i].lo < s[i - 1].hi) {
      int a = s[i - 1].rank, b = s[i].rank;
      free(s);
      return recv_overlap(c, a, b);
    }
  free(s);
  return BRAID_OK;
}

/* The spans of send and recv blocks meet: interleaved blocks of one
   buffer are fine as long as no element is both sent and received. One
   sorted sweep over both sides' blocks, remembering how far each side
   reaches so far, finds the first element they share. */
static braid_status check_blocks_apart(braid_comm *c, const void *send, const size_t *send_counts,
                                       const size_t *send_displs, const void *recv, const size_t *recv_counts,
                                       const size_t *recv_displs, braid_dtype dt) {
  const int n = c->size;
  const size_t esz = braid_dtype_size(dt);
  span *s = malloc(sizeof *s * 2 * (size_t)n);
  if (!s) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory checking %d ranks' send_displs", n);
  const uintptr_t base[2] = {(uintptr_t)send, (uintptr_t)recv};
  const size_t *counts[2] = {send_counts, recv_counts}, *displs[2] = {send_displs, recv_displs};
  int m = 0;
  for (int side = 0; side < 2; side++) /* rank j: j for its send block, n + j for its receive block */
    for (int j = 0; j < n; j++)
      if (counts[side][j])
        s[m++] = (span){base[side] + displs[side][j] * esz, base[side] + (displs[side][j] + counts[side][j]) * esz,
                        side * n + j};
  qsort(s, (size_t)m, sizeof *s, span_cmp);
  size_t reach[2] = {0, 0};
  int who[2] = {-1, -1};
  for (int i = 0; i < m; i++) {
    const int side = s[i].rank >= n, other = !side;
    if (who[other] >= 0 && s[i].lo < reach[other]) {
      const int sj = side ? who[other] : s[i].rank, rj = (side ? s[i].rank : who[other]) - n;
      free(s);
      return braid__fail(c, BRAID_ERR_INVALID_ARG,
                         "the send block for rank %d and the recv block from rank %d share elements (send overlaps "
                         "recv; in place: send == recv)",
                         sj, rj);
    }
    if (s[i].hi > reach[side]) reach[side] = s[i].hi, who[side] = s[i].rank;
  }
  free(s);
  return BRAID_OK;
}

braid_status braid_all_to_allv(braid_comm *c, const void *send, const size_t *send_counts, const size_t *send_displs,
                               void *recv, const size_t *recv_counts, const size_t *recv_displs, braid_dtype dt) {
  braid_status st = braid__enter(c, "braid_all_to_allv");
  if (st) return st;
  braid__coll_args a;
  args_init(&a, BRAID__COLL_ALL_TO_ALLV, send, recv, 0, dt, 0);
  a.send_counts = send_counts;
  a.send_displs = send_displs;
  a.recv_counts = recv_counts;
  a.recv_displs = recv_displs;
  /* Both NULL with send counts given is a rank that receives nothing but
     may send: its send side is checked (a NULL buffer with a count is an
     error here, not a mismatch on the peers). */
  const int inplace = send == recv && (send != NULL || !send_counts), r = c->rank;
  size_t slo, shi, rlo, rhi;
  BRAID__TRY(braid__check_dtype(c, dt));
  BRAID__TRY(check_blocks(c, "recv", recv, recv_counts, recv_displs, dt, &rlo, &rhi));
  BRAID__TRY(check_recv_disjoint(c, recv_counts, recv_displs));
  if (!inplace) { /* in place (send == recv) the send arrays are not read */
    BRAID__TRY(check_blocks(c, "send", send, send_counts, send_displs, dt, &slo, &shi));
    if (send_counts[r] != recv_counts[r])
      return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG,
                                         "send_counts[%d] is %zu but recv_counts[%d] is %zu: the block rank %d keeps "
                                         "is one block",
                                         r, send_counts[r], r, recv_counts[r], r));
    if (slo < shi && rlo < rhi && overlaps((const char *)send + slo, shi - slo, (const char *)recv + rlo, rhi - rlo))
      BRAID__TRY(check_blocks_apart(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, dt));
  }
  /* Never a no-op: other ranks may send to this one whatever its counts,
     and every pair exchanges its message. */
  return submit(c, &a);
}

braid_status braid_barrier(braid_comm *c) {
  braid_status st = braid__enter(c, "braid_barrier");
  if (st) return st;
  braid__coll_args a;
  args_init(&a, BRAID__COLL_BARRIER, NULL, NULL, 0, BRAID_U8, 0);
  return submit(c, &a);
}
