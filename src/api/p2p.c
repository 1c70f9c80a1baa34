/* braid_send, braid_recv, braid_sync: non-blocking user point-to-point over
   the backend's requests, completed by braid_sync. */
#include <stdio.h>

#include "api/api.h"
#include "core/tag.h"
#include "core/trace.h"
#include "core/wait.h"

/* A request still in flight stays on the pending list until braid_sync. */
static void keep(braid_comm *c, braid__req *r) {
  r->user = 1;
  r->ord = c->user_posted++;
  if (r->done && r->status == BRAID_OK) {
    braid__req_release(c, r); /* its entry ends as the call returns */
    return;
  }
  braid__trace_req_posted(c, r);
  r->pend_next = NULL;
  *c->pending_tail = r;
  c->pending_tail = &r->pend_next;
}

braid_status braid_send(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int dest, uint32_t tag) {
  braid_status st = braid__enter(c, "braid_send");
  if (st) return st;
  size_t bytes = 0;
  BRAID__TRY(braid__check_dtype(c, dt));
  BRAID__TRY(braid__check_rank(c, "dest", dest));
  BRAID__TRY(braid__check_buf(c, "buf", buf, count));
  BRAID__TRY(braid__check_bytes(c, "buf", count, dt, 1, &bytes));
  if (count == 0) return braid__leave(c, BRAID_OK);
  braid__trace_begin(c, BRAID__TRACE_SEND, count, dt, (int32_t)tag, dest);
  braid__req *r;
  BRAID__TRY(braid__post_send(c, buf, count, dt, dest, braid__tag_user(tag), &r));
  keep(c, r);
  return braid__leave(c, BRAID_OK);
}

braid_status braid_recv(braid_comm *c, void *buf, size_t count, braid_dtype dt, int src, uint32_t tag) {
  braid_status st = braid__enter(c, "braid_recv");
  if (st) return st;
  size_t bytes = 0;
  BRAID__TRY(braid__check_dtype(c, dt));
  BRAID__TRY(braid__check_rank(c, "src", src));
  BRAID__TRY(braid__check_buf(c, "buf", buf, count));
  BRAID__TRY(braid__check_bytes(c, "buf", count, dt, 1, &bytes));
  if (count == 0) return braid__leave(c, BRAID_OK);
  braid__trace_begin(c, BRAID__TRACE_RECV, count, dt, (int32_t)tag, src);
  braid__req *r;
  c->posting_mismatch[0] = 0;
  BRAID__TRY(braid__post_recv_user(c, buf, count, dt, src, braid__tag_user(tag), &r));
  if (r->done && r->status == BRAID_ERR_MISMATCH) {
    /* The message was already here when the receive was posted: this call
       fails, as when it was found among the unexpected messages. */
    braid__req_release(c, r);
    return braid__leave(c, braid__fail(c, BRAID_ERR_MISMATCH, "%s", c->posting_mismatch));
  }
  keep(c, r);
  return braid__leave(c, BRAID_OK);
}

void braid__reap(braid_comm *c) {
  braid__req **link = &c->pending;
  while (*link) {
    braid__req *r = *link;
    if (!r->done) {
      link = &r->pend_next;
      continue;
    }
    *link = r->pend_next;
    braid__trace_req_done(c, r);
    braid__req_release(c, r);
  }
  c->pending_tail = link;
}

braid_status braid_sync(braid_comm *c) {
  braid_status st = braid__enter(c, "braid_sync");
  if (st) return st;
  braid__trace_begin(c, BRAID__TRACE_SYNC, (uint64_t)c->npending, BRAID_U8, 0, braid__pending_peer(c));
  /* Every pending operation completes first, even when a mismatch found
     earlier is waiting to be reported (as a barrier does): the caller may
     then read every other receive's buffer. */
  c->lendable = 1;
  st = braid__wait_idle(c, 0);
  c->lendable = 0;
  braid__reap(c);
  if (st) return braid__leave(c, st);
  if (c->deferred) return braid__leave(c, braid__deferred_report(c));
  return braid__leave(c, BRAID_OK);
}
