/* Requests: allocation from a per-communicator pool, the internal
   point-to-point calls the algorithms use, and scratch memory. */
#include "core/p2p.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/tag.h"
#include "core/wait.h"

#define REQ_POOL_MAX 256

static braid__req *req_get(braid_comm *c) {
  braid__req *r = c->free_reqs;
  if (r) {
    c->free_reqs = r->next;
    c->nfree--;
  } else {
    r = malloc(c->ops->req_size);
    if (!r) return NULL;
  }
  c->nreqs++;
  memset(r, 0, c->ops->req_clear ? c->ops->req_clear : c->ops->req_size);
  return r;
}

static void req_put(braid_comm *c, braid__req *r) {
  c->nreqs--;
  if (c->nfree >= REQ_POOL_MAX) {
    free(r);
    return;
  }
  r->next = c->free_reqs;
  c->free_reqs = r;
  c->nfree++;
}

void braid__req_complete(braid_comm *c, braid__req *r, braid_status st) {
  if (r->done) return;
  r->done = 1;
  r->status = st;
  c->npending--;
  /* A backend's progress inside braid_destroy finished it after the core
     let go of the unfinished ones: freed once the backend is gone. */
  if (c->releasing) r->pend_next = c->orphans, c->orphans = r;
}

void braid__req_drop(braid_comm *c, braid__req *r) {
  if (!r->done) c->npending--;
  braid__match_cancel(c, r);
  req_put(c, r);
}

void braid__req_abandon(braid_comm *c, braid__req *r) {
  if (r->done) {
    req_put(c, r);
    return;
  }
  /* On the pending list, braid_destroy frees it when it completes there
     and leaves it to the backend when it does not. */
  r->pend_next = NULL;
  *c->pending_tail = r;
  c->pending_tail = &r->pend_next;
}

braid_status braid__req_release(braid_comm *c, braid__req *r) {
  braid_status st = r->status;
  req_put(c, r);
  return st;
}

static braid__req *req_new(braid_comm *c, int is_send, void *buf, size_t count, braid_dtype dt, int peer,
                           uint64_t tag, const braid__desc *desc) {
  braid__req *r = req_get(c);
  if (!r) {
    braid__fail_comm(c, BRAID_ERR_NO_MEMORY, "out of memory for a %s request", is_send ? "send" : "receive");
    return NULL;
  }
  r->is_send = (uint8_t)is_send;
  r->peer = peer;
  r->h.tag = tag;
  r->h.count = count;
  r->h.dt = (uint32_t)dt;
  if (braid__tag_is_internal(tag)) r->h.desc = desc ? *desc : c->desc;
  r->buf = buf;
  r->bytes = count * braid_dtype_size(dt);
  c->npending++;
  return r;
}

/* Undoes req_new after the backend refused the request (it keeps no reference). */
static void req_abandon(braid_comm *c, braid__req *r) {
  braid__match_cancel(c, r);
  if (!r->done) c->npending--;
  req_put(c, r);
}

braid_status braid__post_send_as(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int peer,
                                 uint64_t tag, const braid__desc *desc, braid__req **out) {
  *out = NULL;
  braid__req *r = req_new(c, 1, (void *)buf, count, dt, peer, tag, desc);
  if (!r) return BRAID_ERR_NO_MEMORY;
  braid_status st = c->ops->isend(c, r);
  if (st) {
    req_abandon(c, r);
    return st;
  }
  *out = r;
  return BRAID_OK;
}

braid_status braid__post_recv_as(braid_comm *c, void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                                 const braid__desc *desc, int posting, braid__req **out) {
  *out = NULL;
  braid__req *r = req_new(c, 0, buf, count, dt, peer, tag, desc);
  if (!r) return BRAID_ERR_NO_MEMORY;
  r->posting = (uint8_t)posting;
  braid_status st;
  braid__umsg *u = braid__match_post(c, r, &st);
  if (st) {
    req_abandon(c, r);
    return st;
  }
  if (u) {
    st = c->ops->take(c, r, u);
    free(u);
  } else {
    st = c->ops->irecv(c, r);
  }
  r->posting = 0;
  if (st) {
    req_abandon(c, r);
    return st;
  }
  *out = r;
  return BRAID_OK;
}

braid_status braid__post_send(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                              braid__req **out) {
  return braid__post_send_as(c, buf, count, dt, peer, tag, NULL, out);
}

braid_status braid__post_recv(braid_comm *c, void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                              braid__req **out) {
  return braid__post_recv_as(c, buf, count, dt, peer, tag, NULL, 0, out);
}

braid_status braid__post_recv_user(braid_comm *c, void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                                   braid__req **out) {
  return braid__post_recv_as(c, buf, count, dt, peer, tag, NULL, 1, out);
}

braid_status braid__isend(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                          braid__req **out) {
  return braid__post_send(c, buf, count, dt, peer, tag, out);
}

braid_status braid__irecv(braid_comm *c, void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                          braid__req **out) {
  return braid__post_recv(c, buf, count, dt, peer, tag, out);
}

braid_status braid__waitall(braid_comm *c, braid__req **reqs, int n) {
  braid_status st = braid__wait_reqs(c, reqs, n);
  for (int i = 0; i < n; i++) {
    braid__req *r = reqs[i];
    if (!r) continue;
    reqs[i] = NULL;
    /* After a failure, a request still in flight stays with the backend
       (or the matcher) until the communicator is destroyed. */
    if (!r->done) continue;
    braid_status rs = braid__req_release(c, r);
    if (!st && rs) st = rs;
  }
  return st;
}

int braid__test(braid_comm *c, braid__req *r) {
  if (!r->done && !atomic_load(&c->failed)) c->ops->progress(c);
  return r->done;
}

uint64_t braid__coll_tag(const braid_comm *c, uint64_t step) { return braid__tag_internal(c->id, c->seq, step); }

void *braid__scratch(braid_comm *c, int slot, size_t bytes) {
  if (slot < 0 || slot >= BRAID__NSCRATCH) {
    braid__fail_comm(c, BRAID_ERR_INTERNAL, "scratch slot %d out of range", slot);
    return NULL;
  }
  if (c->scratch_len[slot] >= bytes && c->scratch[slot]) return c->scratch[slot];
  size_t want = (bytes + 4095) & ~(size_t)4095;
  if (want < bytes) want = bytes;
  void *p = NULL;
  if (posix_memalign(&p, 64, want ? want : 64) != 0) {
    braid__fail_comm(c, BRAID_ERR_NO_MEMORY, "out of memory for %zu bytes of scratch space", bytes);
    return NULL;
  }
  free(c->scratch[slot]);
  c->scratch[slot] = p;
  c->scratch_len[slot] = want;
  return p;
}
