/* Posted receives and unexpected messages, FIFO per (source, tag) in hashed
   buckets. Both queues hold objects that begin with next/prev links. */
#include "core/match.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/comm.h"
#include "core/tag.h"

typedef struct link {
  struct link *next, *prev;
} link;

static unsigned bucket_of(int src, uint64_t tag) {
  uint64_t x = (uint64_t)(uint32_t)src * 0x9E3779B97F4A7C15ull ^ tag * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 29;
  return (unsigned)(x * 0x94D049BB133111EBull >> 56) & (BRAID__MATCH_BUCKETS - 1);
}

static void push(braid__match_bucket *b, link *e) {
  e->next = NULL;
  e->prev = b->tail;
  if (b->tail) ((link *)b->tail)->next = e;
  else b->head = e;
  b->tail = e;
}

static void unlink_from(braid__match_bucket *b, link *e) {
  if (e->prev) e->prev->next = e->next;
  else b->head = e->next;
  if (e->next) e->next->prev = e->prev;
  else b->tail = e->prev;
  e->next = e->prev = NULL;
}

static int same_shape(const braid__msg_hdr *a, const braid__msg_hdr *b) {
  return a->count == b->count && a->dt == b->dt;
}

/* Internal traffic: the descriptors must agree (the cross-rank check), and
   then the shapes, which the algorithms derive from them, agree too. */
static braid_status check_internal(braid_comm *c, int src, const braid__msg_hdr *msg, const braid__msg_hdr *recv) {
  if (!braid__desc_equal(&msg->desc, &recv->desc)) return braid__coll_mismatch(c, src, &msg->desc);
  if (!same_shape(msg, recv) && recv->desc.kind == BRAID__COLL_ALL_TO_ALLV && msg->dt == recv->dt) {
    /* All-to-allv's counts are the callers': every pair exchanges one
       message, so a count that differs from the receiver's is theirs. */
    char text[BRAID_ERRLEN];
    const char *dt = braid_dtype_name((braid_dtype)recv->dt);
    snprintf(text, sizeof text, "%s #%llu: rank %d sends %llu elements of %s to rank %d where rank %d expects %llu from it",
             braid__coll_call_name(recv->desc.kind), (unsigned long long)c->seq, braid__label(c, src),
             (unsigned long long)msg->count, dt ? dt : "?", braid__label(c, c->rank), braid__label(c, c->rank),
             (unsigned long long)recv->count);
    return braid__fail_relayed(c, BRAID_ERR_MISMATCH, text);
  }
  if (!same_shape(msg, recv))
    return braid__fail_comm(c, BRAID_ERR_INTERNAL,
                            "an internal message from rank %d has %llu elements of dtype %u where %llu of dtype %u "
                            "were expected",
                            src, (unsigned long long)msg->count, msg->dt, (unsigned long long)recv->count, recv->dt);
  return BRAID_OK;
}

static void user_mismatch_text(braid_comm *c, char *out, size_t len, int src, const braid__msg_hdr *msg,
                               const braid__msg_hdr *recv) {
  braid__mismatch_text(out, len, braid__label(c, src), (uint32_t)msg->tag, (size_t)msg->count, (braid_dtype)msg->dt,
                       (size_t)recv->count, (braid_dtype)recv->dt);
}

braid__req *braid__match_arrival(braid_comm *c, int src, const braid__msg_hdr *h, braid_status *st) {
  *st = BRAID_OK;
  braid__match_bucket *b = &c->match.posted[bucket_of(src, h->tag)];
  for (link *e = b->head; e;) {
    braid__req *r = (braid__req *)e;
    e = e->next;
    if (r->peer != src || r->h.tag != h->tag) continue;
    if (braid__tag_is_internal(h->tag)) {
      if ((*st = check_internal(c, src, h, &r->h))) return NULL;
    } else if (!same_shape(h, &r->h)) {
      /* The receive fails; the message goes on to the next receive of the
         key, or waits as unexpected for one of the right shape. */
      char msg[320];
      user_mismatch_text(c, msg, sizeof msg, src, h, &r->h);
      unlink_from(b, (link *)r);
      r->queued = 0;
      c->match.nposted--;
      if (r->posting) snprintf(c->posting_mismatch, sizeof c->posting_mismatch, "%s", msg);
      else braid__defer(c, BRAID_ERR_MISMATCH, msg);
      braid__req_complete(c, r, BRAID_ERR_MISMATCH);
      continue;
    }
    unlink_from(b, (link *)r);
    r->queued = 0;
    c->match.nposted--;
    return r;
  }
  return NULL;
}

/* The collective order list. Arrivals of later collectives come mostly in
   order, so their insertion walks back from the tail past the few later
   still; one of this or an earlier collective walks forward from the head
   instead, past the few older ones, however far other ranks ran ahead. */
static void seq_insert(braid_comm *c, braid__umsg *u) {
  u->in_seq = 0;
  uint64_t t = u->h.tag;
  if (!braid__tag_is_internal(t) || braid__tag_comm(t) != braid__tag_comm_fold(c->id)) return;
  uint64_t mask = braid__tag_mask(BRAID__TAG_SEQ_BITS), s = braid__tag_seq(t);
  uint64_t ahead = (s - c->seq) & mask;
  u->cseq = ahead < mask / 2 ? (int64_t)(c->seq + ahead) : (int64_t)c->seq - (int64_t)((c->seq - s) & mask);
  braid__matcher *m = &c->match;
  braid__umsg *after = m->stail;
  if (u->cseq <= (int64_t)c->seq) {
    braid__umsg *before = m->shead;
    after = NULL;
    while (before && before->cseq <= u->cseq) after = before, before = before->snext;
  } else {
    while (after && after->cseq > u->cseq) after = after->sprev;
  }
  u->sprev = after;
  u->snext = after ? after->snext : m->shead;
  if (u->snext) u->snext->sprev = u;
  else m->stail = u;
  if (after) after->snext = u;
  else m->shead = u;
  u->in_seq = 1;
}

static void seq_remove(braid_comm *c, braid__umsg *u) {
  if (!u->in_seq) return;
  braid__matcher *m = &c->match;
  if (u->sprev) u->sprev->snext = u->snext;
  else m->shead = u->snext;
  if (u->snext) u->snext->sprev = u->sprev;
  else m->stail = u->sprev;
  u->snext = u->sprev = NULL;
  u->in_seq = 0;
}

void braid__match_unexpected(braid_comm *c, braid__umsg *u) {
  push(&c->match.unexp[bucket_of(u->src, u->h.tag)], (link *)u);
  c->match.nunexp++;
  seq_insert(c, u);
}

braid__umsg *braid__match_post(braid_comm *c, braid__req *r, braid_status *st) {
  *st = BRAID_OK;
  if (c->match.nunexp) {
    braid__match_bucket *b = &c->match.unexp[bucket_of(r->peer, r->h.tag)];
    for (link *e = b->head; e; e = e->next) {
      braid__umsg *u = (braid__umsg *)e;
      if (u->src != r->peer || u->h.tag != r->h.tag) continue;
      if (braid__tag_is_internal(r->h.tag)) {
        if ((*st = check_internal(c, u->src, &u->h, &r->h))) return NULL;
      } else if (!same_shape(&u->h, &r->h)) {
        char msg[320];
        user_mismatch_text(c, msg, sizeof msg, u->src, &u->h, &r->h);
        *st = braid__fail(c, BRAID_ERR_MISMATCH, "%s", msg);
        return NULL;
      }
      unlink_from(b, e);
      c->match.nunexp--;
      seq_remove(c, u);
      return u;
    }
  }
  push(&c->match.posted[bucket_of(r->peer, r->h.tag)], (link *)r);
  r->queued = 1;
  c->match.nposted++;
  return NULL;
}

void braid__match_cancel(braid_comm *c, braid__req *r) {
  if (!r->queued) return;
  unlink_from(&c->match.posted[bucket_of(r->peer, r->h.tag)], (link *)r);
  r->queued = 0;
  c->match.nposted--;
}

int braid__match_find_foreign(braid_comm *c, uint64_t seq, const braid__desc *mine, int *src, braid__desc *theirs) {
  for (braid__umsg *u = c->match.shead; u; u = u->snext) {
    if (!braid__tag_in_coll(u->h.tag, c->id, seq)) {
      if (u->cseq > (int64_t)seq) break; /* later collectives only from here */
      continue;
    }
    if (braid__desc_equal(&u->h.desc, mine)) continue;
    *src = u->src;
    *theirs = u->h.desc;
    return 1;
  }
  return 0;
}

int braid__match_find_stale(braid_comm *c, uint64_t seq, int inclusive, int *src, braid__msg_hdr *h,
                            uint64_t *tag_seq) {
  const braid__umsg *u = c->match.shead; /* the oldest collective's */
  if (!u || u->cseq > (int64_t)seq || (u->cseq == (int64_t)seq && !inclusive)) return 0;
  *src = u->src;
  *h = u->h;
  *tag_seq = braid__tag_seq(u->h.tag);
  return 1;
}

braid__umsg *braid__match_pop_unexpected(braid_comm *c) {
  for (int i = 0; i < BRAID__MATCH_BUCKETS && c->match.nunexp; i++) {
    link *e = c->match.unexp[i].head;
    if (!e) continue;
    unlink_from(&c->match.unexp[i], e);
    c->match.nunexp--;
    seq_remove(c, (braid__umsg *)e);
    return (braid__umsg *)e;
  }
  return NULL;
}

void braid__match_drop_unexpected(braid_comm *c) {
  braid__umsg *u;
  while ((u = braid__match_pop_unexpected(c))) {
    if (c->ops->release_umsg) c->ops->release_umsg(c, u);
    free(u);
  }
}

braid__req *braid__match_pop_posted(braid_comm *c) {
  for (int i = 0; i < BRAID__MATCH_BUCKETS && c->match.nposted; i++) {
    link *e = c->match.posted[i].head;
    if (!e) continue;
    unlink_from(&c->match.posted[i], e);
    c->match.nposted--;
    ((braid__req *)e)->queued = 0;
    return (braid__req *)e;
  }
  return NULL;
}
