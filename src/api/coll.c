/* The collectives: argument checks, the call's descriptor and sequence
   number (the cross-rank check), then the backend's native version or the
   generic algorithm. */
#include <stdint.h>

#include "algos/algos.h"
#include "api/api.h"
#include "core/wait.h"

static int overlaps(const void *a, size_t alen, const void *b, size_t blen) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return alen && blen && x < y + blen && y < x + alen;
}

/* Starts collective kind: every rank counts collectives alike, so (seq,
   descriptor) names the same call everywhere. A failure another rank
   published through the backend's channel stops it before it waits. */
static braid_status begin(braid_comm *c, braid__coll_kind kind, size_t count, braid_dtype dt, int32_t arg) {
  c->seq++;
  c->desc = braid__desc_make(kind, count, dt, arg);
  c->desc_hash = c->check ? braid__desc_hash(c->seq, &c->desc) : 0;
  if (c->fail_flag && atomic_load_explicit(c->fail_flag, memory_order_acquire) && braid__poll_remote_failure(c, 0))
    return (braid_status)atomic_load(&c->failed);
  /* A message of an earlier collective that no receive took: its sender
     was in another call (a broadcast root that did not wait learns here). */
  if (c->match.nunexp && c->check) {
    braid_status st = braid__coll_check_stale(c, 0);
    if (st) return st;
  }
  if (c->check && c->ops->coll_start) c->ops->coll_start(c);
  return BRAID_OK;
}

/* After a generic algorithm: anything of this collective still unexpected
   came from a rank in another call. A message of it may also arrive later
   (from a broadcast root that did not wait): the next collective looks
   again when it ends. */
static braid_status end_generic(braid_comm *c, braid_status st) {
  if (!st && c->match.nunexp && c->check) st = braid__coll_check_stale(c, 1);
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
  return c->match.nunexp ? braid__coll_check_stale(c, 1) : BRAID_OK;
}

/* The backend's own version unless BRAID_ALGO named a generic algorithm. */
static int use_native(const braid_comm *c, braid__coll_kind kind, const void *fn) {
  return fn && c->algo[kind] <= BRAID__ALGO_NATIVE;
}

static int generic_algo(const braid_comm *c, braid__coll_kind kind) {
  return c->algo[kind] <= BRAID__ALGO_NATIVE ? BRAID__ALGO_AUTO : c->algo[kind];
}

braid_status braid_all_reduce(braid_comm *c, void *buf, size_t count, braid_dtype dt, braid_op op) {
  braid_status st = braid__enter(c, "braid_all_reduce");
  if (st) return st;
  size_t bytes = 0;
  BRAID__TRY(braid__check_dtype_op_pair(c, dt, op));
  BRAID__TRY(braid__check_buf(c, "buf", buf, count));
  BRAID__TRY(braid__check_bytes(c, "buf", count, dt, 1, &bytes));
  if (count == 0) return braid__leave(c, BRAID_OK);
  BRAID__TRY(begin(c, BRAID__COLL_ALL_REDUCE, count, dt, (int32_t)op));
  if (use_native(c, BRAID__COLL_ALL_REDUCE, (const void *)c->ops->all_reduce))
    return braid__leave(c, end_native(c, c->ops->all_reduce(c, buf, count, dt, op)));
  st = braid__algo_all_reduce(c, generic_algo(c, BRAID__COLL_ALL_REDUCE), buf, count, dt, op);
  return braid__leave(c, end_generic(c, st));
}

braid_status braid_broadcast(braid_comm *c, void *buf, size_t count, braid_dtype dt, int root) {
  braid_status st = braid__enter(c, "braid_broadcast");
  if (st) return st;
  size_t bytes = 0;
  BRAID__TRY(braid__check_dtype(c, dt));
  BRAID__TRY(braid__check_rank(c, "root", root));
  BRAID__TRY(braid__check_buf(c, "buf", buf, count));
  BRAID__TRY(braid__check_bytes(c, "buf", count, dt, 1, &bytes));
  if (count == 0) return braid__leave(c, BRAID_OK);
  BRAID__TRY(begin(c, BRAID__COLL_BROADCAST, count, dt, root));
  if (use_native(c, BRAID__COLL_BROADCAST, (const void *)c->ops->broadcast))
    return braid__leave(c, end_native(c, c->ops->broadcast(c, buf, count, dt, root)));
  st = braid__algo_broadcast(c, generic_algo(c, BRAID__COLL_BROADCAST), buf, count, dt, root);
  return braid__leave(c, end_generic(c, st));
}

braid_status braid_all_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt) {
  braid_status st = braid__enter(c, "braid_all_gather");
  if (st) return st;
  size_t bytes = 0, total = 0;
  BRAID__TRY(braid__check_dtype(c, dt));
  BRAID__TRY(braid__check_buf(c, "send", send, count));
  BRAID__TRY(braid__check_buf(c, "recv", recv, count));
  BRAID__TRY(braid__check_bytes(c, "send", count, dt, 1, &bytes));
  BRAID__TRY(braid__check_bytes(c, "recv", count, dt, (size_t)c->size, &total));
  if (count == 0) return braid__leave(c, BRAID_OK);
  const char *mine = (const char *)recv + (size_t)c->rank * bytes;
  if (send != mine && overlaps(send, bytes, recv, total))
    return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG,
                                       "send overlaps recv but is not the in-place position recv + %d*count", c->rank));
  BRAID__TRY(begin(c, BRAID__COLL_ALL_GATHER, count, dt, 0));
  if (use_native(c, BRAID__COLL_ALL_GATHER, (const void *)c->ops->all_gather))
    return braid__leave(c, end_native(c, c->ops->all_gather(c, send, recv, count, dt)));
  st = braid__algo_all_gather(c, generic_algo(c, BRAID__COLL_ALL_GATHER), send, recv, count, dt);
  return braid__leave(c, end_generic(c, st));
}

braid_status braid_reduce_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                  braid_op op) {
  braid_status st = braid__enter(c, "braid_reduce_scatter");
  if (st) return st;
  size_t bytes = 0, total = 0;
  BRAID__TRY(braid__check_dtype_op_pair(c, dt, op));
  BRAID__TRY(braid__check_buf(c, "send", send, count));
  BRAID__TRY(braid__check_buf(c, "recv", recv, count));
  BRAID__TRY(braid__check_bytes(c, "recv", count, dt, 1, &bytes));
  BRAID__TRY(braid__check_bytes(c, "send", count, dt, (size_t)c->size, &total));
  if (count == 0) return braid__leave(c, BRAID_OK);
  const char *mine = (const char *)send + (size_t)c->rank * bytes;
  if ((const char *)recv != mine && overlaps(send, total, recv, bytes))
    return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG,
                                       "recv overlaps send but is not the in-place position send + %d*count", c->rank));
  BRAID__TRY(begin(c, BRAID__COLL_REDUCE_SCATTER, count, dt, (int32_t)op));
  if (use_native(c, BRAID__COLL_REDUCE_SCATTER, (const void *)c->ops->reduce_scatter))
    return braid__leave(c, end_native(c, c->ops->reduce_scatter(c, send, recv, count, dt, op)));
  st = braid__algo_reduce_scatter(c, generic_algo(c, BRAID__COLL_REDUCE_SCATTER), send, recv, count, dt, op);
  return braid__leave(c, end_generic(c, st));
}

braid_status braid_barrier(braid_comm *c) {
  braid_status st = braid__enter(c, "braid_barrier");
  if (st) return st;
  /* Implies braid_sync: this rank's operations complete first. */
  BRAID__TRY(braid__wait_idle(c));
  if (c->deferred) {
    st = c->deferred;
    c->deferred = BRAID_OK;
    return braid__leave(c, braid__fail(c, st, "%s", c->deferred_msg));
  }
  BRAID__TRY(begin(c, BRAID__COLL_BARRIER, 0, BRAID_U8, 0));
  if (use_native(c, BRAID__COLL_BARRIER, (const void *)c->ops->barrier))
    return braid__leave(c, end_native(c, c->ops->barrier(c)));
  return braid__leave(c, end_generic(c, braid__algo_barrier(c, generic_algo(c, BRAID__COLL_BARRIER))));
}
