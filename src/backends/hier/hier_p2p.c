/* hier: point-to-point routed to the part that reaches the peer — the
   node's communicator for a rank of this node, the flat one otherwise. A
   source always reaches this rank through the same part, so messages of
   one (source, tag) stay in order; matching and the shape rule are the
   part's (its messages name hier's ranks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"

#include "backends/hier/hier.h"
#include "core/tag.h"
#include "core/wait.h"

/* The part that reaches hier rank peer, and the peer's rank there. */
static braid_comm *route(hier_state *s, int peer, int *sub_rank) {
  if (s->node_of[peer] == s->node) {
    *sub_rank = s->local_of[peer];
    return s->intra;
  }
  *sub_rank = peer;
  return s->flat;
}

/* A part's sentence becomes this call's (its ranks are already hier's). */
braid_status hier_adopt(braid_comm *c, braid_comm *sub, braid_status st) {
  /* hier failed first (the part found hier's failure in the store): its
     sentence stands. */
  if (atomic_load(&c->failed)) return (braid_status)atomic_load(&c->failed);
  char text[BRAID_ERRLEN];
  pthread_mutex_lock(&sub->err_lock);
  snprintf(text, sizeof text, "%s", sub->last_error);
  pthread_mutex_unlock(&sub->err_lock);
  /* "<call>: <sentence> (rank R)" of the part: keep the sentence. */
  char *colon = strstr(text, ": "), *tail = strrchr(text, '(');
  if (tail && tail > text && tail[-1] == ' ') tail[-1] = 0;
  const char *body = colon ? colon + 2 : text;
  if (braid__status_is_fatal(st) || atomic_load(&sub->failed)) return braid__fail_comm(c, st, "%s", body);
  return braid__fail(c, st, "%s", body);
}

static void track(braid_comm *c, hier_req *h, braid_comm *sub, braid__req *inner) {
  hier_state *s = c->be;
  h->sub = sub;
  h->inner = inner;
  h->next = s->pending;
  s->pending = h;
}

/* Completes h from its part's request once that is done; a staged receive
   first moves its host copy to the device buffer. */
static int settle(braid_comm *c, hier_req *h) {
  braid__req *in = h->inner;
  if (!in->done) return 0;
  braid_status st = in->status;
  if (h->dst && !st) {
    /* On the stream like the node part's receives; braid_sync waits for it. */
    st = hier_dev_copy(c, h->dst, h->host, h->bytes, BRAID__COPY_H2D);
    if (!st) {
      hier_dev_free_later(c, h->host);
      h->host = NULL;
    }
  }
  free(h->host);
  h->host = h->dst = NULL;
  /* The part kept the sentences for its next sync: they are hier's now. */
  if (st == BRAID_ERR_MISMATCH) braid__defer_move(c, h->sub);
  braid__req_release(h->sub, in);
  h->inner = NULL;
  braid__req_complete(c, &h->base, st);
  return 1;
}

/* Device buffers: a call on a buffer a staged receive is still to fill
   comes after it, as on the stream; crossing nodes they travel through a
   host copy of their own. */
static braid_status staging(braid_comm *c, braid_comm *sub, braid__req *r, hier_req *h) {
  hier_state *s = c->be;
  h->host = h->dst = NULL;
  h->bytes = r->h.count * braid_dtype_size((braid_dtype)r->h.dt);
  if (!s->dev) return BRAID_OK;
  braid_status st = hier_dev_order(c, r->buf, h->bytes);
  if (st || sub == s->intra) return st;
  h->host = malloc(h->bytes ? h->bytes : 1);
  if (!h->host) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for a %zu-byte host copy", h->bytes);
  return BRAID_OK;
}

static int overlaps(const hier_req *h, const char *buf, size_t bytes) {
  const char *d = h->dst;
  return !buf || (d < buf + bytes && buf < d + h->bytes);
}

braid_status hier_dev_order(braid_comm *c, const void *buf, size_t bytes) {
  hier_state *s = c->be;
  braid__waiter w;
  braid__wait_begin(&w);
  for (;;) {
    braid_status st = hier_progress(c);
    int peer = -1;
    for (hier_req *h = s->pending; h && peer < 0 && !st; h = h->next)
      if (h->dst && overlaps(h, buf, bytes)) peer = h->base.peer;
    if (!st && peer < 0) break;
    if (st || (st = braid__wait_poll(c, &w, peer, "a receive from another node the call comes after"))) return st;
  }
  braid__wait_end(c, &w);
  return BRAID_OK;
}

braid_status hier_isend(braid_comm *c, braid__req *r) {
  hier_state *s = c->be;
  int sp;
  braid_comm *sub = route(s, r->peer, &sp);
  hier_req *h = (hier_req *)r;
  braid_status st = staging(c, sub, r, h);
  const void *buf = h->host ? h->host : r->buf;
  if (!st && h->host) st = hier_dev_copy(c, h->host, r->buf, h->bytes, BRAID__COPY_D2H);
  if (!st && h->host) st = hier_dev_drain(c);
  if (st) {
    free(h->host);
    h->host = NULL;
    return st;
  }
  braid__req *in;
  sub->call = c->call;
  st = braid__post_send_as(sub, buf, r->h.count, (braid_dtype)r->h.dt, sp, r->h.tag, &r->h.desc, &in);
  sub->call = NULL;
  if (st) {
    free(h->host);
    h->host = NULL;
    return hier_adopt(c, sub, st);
  }
  track(c, h, sub, in);
  if (in->done) {
    s->pending = h->next;
    settle(c, h);
  }
  return BRAID_OK;
}

braid_status hier_irecv(braid_comm *c, braid__req *r) {
  hier_state *s = c->be;
  /* Matching happens in the part; hier's own queue stays empty. */
  braid__match_cancel(c, r);
  int sp;
  braid_comm *sub = route(s, r->peer, &sp);
  hier_req *h = (hier_req *)r;
  braid_status st = staging(c, sub, r, h);
  if (st) return st;
  if (h->host) h->dst = r->buf;
  braid__req *in;
  sub->call = c->call;
  sub->posting_mismatch[0] = 0;
  st = braid__post_recv_as(sub, h->host ? h->host : r->buf, r->h.count, (braid_dtype)r->h.dt, sp, r->h.tag,
                           &r->h.desc, r->posting, &in);
  sub->call = NULL;
  if (st) {
    free(h->host);
    h->host = h->dst = NULL;
    return hier_adopt(c, sub, st);
  }
  track(c, h, sub, in);
  if (in->done) {
    if (in->status == BRAID_ERR_MISMATCH && r->posting)
      snprintf(c->posting_mismatch, sizeof c->posting_mismatch, "%s", sub->posting_mismatch);
    s->pending = h->next;
    settle(c, h);
  }
  return BRAID_OK;
}

/* Progresses part p under hier's call name; a part inside its own call
   (hier's check looks from within a part's wait) keeps that call's name. */
static braid_status part_progress(braid_comm *c, braid_comm *p) {
  const char *was = p->call;
  if (!was) p->call = c->call;
  braid_status st = p->ops->progress(p);
  p->call = was;
  return st;
}

braid_status hier_progress(braid_comm *c) {
  hier_state *s = c->be;
  braid_comm *parts[2] = {s->intra, s->flat};
  for (int i = 0; i < 2; i++) {
    braid_comm *p = parts[i];
    if (!p || !p->npending) continue;
    uint64_t moved = p->moved;
    braid_status st = part_progress(c, p);
    if (p->moved != moved) c->moved++;
    if (st) return hier_adopt(c, p, st);
  }
  for (hier_req **link = &s->pending; *link;) {
    hier_req *h = *link;
    if (h->inner->done) {
      *link = h->next;
      settle(c, h);
    } else {
      link = &h->next;
    }
  }
  /* The node part's stream has finished hier's collectives and copies. */
  if (s->dev_busy && !s->intra->npending) {
    s->dev_busy = 0;
    c->npending--;
    hier_dev_idle(c);
  }
  return BRAID_OK;
}

/* hier rank of the peer that is rank q of part p (c's size n). */
static int hier_rank_of(hier_state *s, const braid_comm *p, int n, int q) {
  if (p != s->intra) return q; /* the flat part holds every rank in hier's order */
  for (int r = 0; r < n && q >= 0; r++)
    if (s->node_of[r] == s->node && s->local_of[r] == q) return r;
  return q;
}

int hier_find_unexpected(braid_comm *c, uint64_t seq, int inclusive, const braid__desc *mine, int progress, int *src,
                         braid__msg_hdr *h, uint64_t *tag_seq) {
  hier_state *s = c->be;
  braid_comm *parts[2] = {s->intra, s->flat};
  const uint64_t mask = braid__tag_mask(BRAID__TAG_SEQ_BITS);
  int found = 0;
  uint64_t most = 0;
  for (int i = 0; i < 2 && !(found && mine); i++) {
    braid_comm *p = parts[i];
    if (!p) continue;
    /* hier_progress passes over a part with nothing pending, where a
       message of another call may still have arrived; a part's failure
       shows when hier next uses it. */
    if (progress && !atomic_load(&p->failed)) (void)part_progress(c, p);
    int q;
    braid__msg_hdr ph;
    uint64_t at;
    if (!braid__match_scan_of(p, c->id, seq, inclusive, mine, &q, &ph, &at)) continue;
    const uint64_t behind = (seq - at) & mask;
    if (found && behind <= most) continue;
    found = 1;
    most = behind;
    *src = hier_rank_of(s, p, c->size, q);
    *h = ph;
    *tag_seq = at;
  }
  return found;
}

braid_status hier_take(braid_comm *c, braid__req *r, braid__umsg *u) {
  (void)r, (void)u;
  return braid__fail_comm(c, BRAID_ERR_INTERNAL, "hier holds no unexpected messages of its own");
}

void hier_p2p_let_go(braid_comm *c) {
  hier_state *s = c->be;
  for (hier_req *h = s->pending; h; h = h->next)
    if (h->inner) {
      braid__req_abandon(h->sub, h->inner);
      h->inner = NULL;
    }
}

void hier_p2p_free(braid_comm *c) {
  hier_state *s = c->be;
  /* The parts drop their own requests as they are released. */
  while (s->pending) {
    hier_req *h = s->pending;
    s->pending = h->next;
    free(h->host);
    braid__req_drop(c, &h->base);
  }
}
