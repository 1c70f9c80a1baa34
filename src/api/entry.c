/* Serialization of public calls, sticky failure, argument checks. */
#include <stdint.h>
#include <stdio.h>

#include "api/api.h"
#include "core/dtype.h"
#include "core/reduce.h"
#include "core/wait.h"

braid_status braid__null_comm(const char *call) {
  return braid__fail_caller(BRAID_ERR_INVALID_ARG, "%s: comm is NULL", call);
}

braid_status braid__enter_failed(braid_comm *c, const char *call) {
  int failed = atomic_load(&c->failed);
  /* The stored message already names the original call and the rank. */
  char msg[BRAID_ERRLEN];
  pthread_mutex_lock(&c->err_lock);
  snprintf(msg, sizeof msg, "%s: communicator failed earlier: %s", call, c->fatal_error);
  snprintf(c->last_error, sizeof c->last_error, "%s", msg);
  pthread_mutex_unlock(&c->err_lock);
  braid__set_thread_error(msg);
  BLOG_DEBUG(BRAID_SUB_COLL, c->rank, "%s", msg);
  /* An abort from another thread is published by the next call. */
  braid__publish_failure(c);
  c->call = NULL;
  pthread_mutex_unlock(&c->lock);
  return (braid_status)failed;
}

braid_status braid__leave_slow(braid_comm *c, braid_status st) {
  if (st && braid__status_is_fatal(st) && !atomic_load(&c->failed))
    braid__fail(c, st, "%s", braid_status_string(st)); /* a fatal status the backend forgot to record */
  braid__trace_end(&c->trace_cur, st);
  if (atomic_load(&c->failed)) braid__publish_failure(c);
  if (c->desc.kind != BRAID__COLL_NONE) c->prev_desc = c->desc;
  c->desc.kind = BRAID__COLL_NONE;
  c->call = NULL;
  pthread_mutex_unlock(&c->lock);
  return st;
}

braid_status braid__bad_dtype(braid_comm *c, braid_dtype dt) {
  if (!braid__dtype_valid(dt)) return braid__fail(c, BRAID_ERR_INVALID_ARG, "unknown dtype %d", (int)dt);
  return braid__fail(c, BRAID_ERR_UNSUPPORTED, "backend %s cannot carry dtype %s", c->ops->name,
                     braid_dtype_name(dt));
}

braid_status braid__bad_op(braid_comm *c, braid_dtype dt, braid_op op) {
  if (!braid__op_valid(op)) return braid__fail(c, BRAID_ERR_INVALID_ARG, "unknown op %d", (int)op);
  return braid__fail(c, braid__check_dtype_op(dt, op), "op %s is not defined for dtype %s", braid_op_name(op),
                     braid_dtype_name(dt));
}

braid_status braid__bad_count(braid_comm *c, const char *what, const void *p, size_t count, braid_dtype dt) {
  if (!p && count > 0) return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s is NULL with count %zu", what, count);
  return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s count %zu of %s overflows the address space", what, count,
                     braid_dtype_name(dt));
}

braid_status braid__bad_rank(braid_comm *c, const char *what, int r) {
  return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s %d out of range for world size %d", what, r, c->size);
}

braid_status braid__bad_premul(braid_comm *c, braid_dtype dt, braid_op op) {
  const braid__premul *p = braid__premul_of(c, op);
  if (p)
    return braid__fail(c, BRAID_ERR_INVALID_ARG, "op %d is a scaled sum of %s, used with dtype %s", (int)op,
                       braid_dtype_name((braid_dtype)p->dt), braid_dtype_name(dt));
  return braid__fail(c, BRAID_ERR_INVALID_ARG,
                     "unknown op %d (not a braid_op, nor a live braid_op_premul_sum op of this communicator)", (int)op);
}
