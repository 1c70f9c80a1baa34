/* Posted receives and unexpected messages, FIFO per (source, tag) in hashed
   buckets. Both queues hold objects that begin with next/prev links. */
#include "core/match.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/tag.h"

typedef struct link {
  struct link *next, *prev;
} link;

static unsigned bits_of(const braid__match_table *t) { return t->b ? t->bits : BRAID__MATCH_INL_BITS; }

static braid__match_bucket *buckets(braid__match_table *t) { return t->b ? t->b : t->inl; }

static uint64_t hash_of(int src, uint64_t tag) {
  uint64_t x = (uint64_t)(uint32_t)src * 0x9E3779B97F4A7C15ull ^ tag * 0xC2B2AE3D27D4EB4Full;
  x ^= x >> 29;
  return x * 0x94D049BB133111EBull;
}

static braid__match_bucket *bucket_of(braid__match_table *t, int src, uint64_t tag) {
  return &buckets(t)[hash_of(src, tag) >> (64 - bits_of(t))];
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

/* Four times the buckets once a table holds twice as many entries as
   buckets. Each old bucket's entries move in order, so every key stays
   FIFO. A table that cannot grow keeps working, only slower. */
static void maybe_grow(braid__match_table *t, size_t n, size_t (*key_src)(const link *, uint64_t *tag)) {
  unsigned bits = bits_of(t);
  if (n <= (size_t)2 << bits || bits >= 30) return;
  braid__match_bucket *nb = calloc((size_t)1 << (bits + 2), sizeof *nb);
  if (!nb) return;
  braid__match_bucket *ob = buckets(t);
  for (size_t i = 0; i < ((size_t)1 << bits); i++)
    for (link *e = ob[i].head; e;) {
      link *next = e->next;
      uint64_t tag;
      int src = (int)key_src(e, &tag);
      push(&nb[hash_of(src, tag) >> (64 - (bits + 2))], e);
      e = next;
    }
  free(t->b);
  t->b = nb;
  t->bits = bits + 2;
  t->cursor = 0;
}

/* An emptied table that grew goes back to the inline buckets, so a burst
   does not keep its memory (and its misses) for the communicator's life.
   The inline buckets were not used meanwhile: their links are stale. */
static void shrink_if_empty(braid__match_table *t, size_t n) {
  if (n || !t->b) return;
  free(t->b);
  t->b = NULL;
  t->bits = 0;
  t->cursor = 0;
  memset(t->inl, 0, sizeof t->inl);
}

static size_t umsg_key(const link *e, uint64_t *tag) {
  const braid__umsg *u = (const braid__umsg *)e;
  *tag = u->h.tag;
  return (size_t)u->src;
}

static size_t req_key(const link *e, uint64_t *tag) {
  const braid__req *r = (const braid__req *)e;
  *tag = r->h.tag;
  return (size_t)r->peer;
}

/* The first entry of any bucket, from where the last pop ended (the
   destroy pops them all; starting over each time would be quadratic). */
static link *pop_any(braid__match_table *t) {
  size_t nb = (size_t)1 << bits_of(t);
  braid__match_bucket *b = buckets(t);
  for (size_t k = 0; k < nb; k++) {
    size_t i = (t->cursor + k) & (nb - 1);
    link *e = b[i].head;
    if (!e) continue;
    unlink_from(&b[i], e);
    t->cursor = (unsigned)i;
    return e;
  }
  return NULL;
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
  braid__match_bucket *b = bucket_of(&c->match.posted, src, h->tag);
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
    shrink_if_empty(&c->match.posted, c->match.nposted);
    return r;
  }
  shrink_if_empty(&c->match.posted, c->match.nposted); /* receives failed above */
  return NULL;
}

/* The collective order, a sorted lane per source. */

static braid__match_lane *lane_at(braid__matcher *m, int i) { return m->lanes ? &m->lanes[i] : &m->lane0; }

/* The lane of src's messages: its own once the array has grown to it, else
   one it shares (still sorted, only slower to insert into). */
static int lane_of(braid__matcher *m, int src) {
  int n = m->lanes ? m->nlanes : 1;
  if (src < n) return src;
  int cap = src + 1 > 2 * n ? src + 1 : 2 * n;
  braid__match_lane *l = calloc((size_t)cap, sizeof *l);
  if (!l) return src % n;
  memcpy(l, lane_at(m, 0), (size_t)n * sizeof *l);
  free(m->lanes);
  m->lanes = l;
  m->nlanes = cap;
  return src;
}

/* Arrivals of later collectives go at the end of their lane, past the few
   later ones still there; one of this or an earlier collective walks
   forward from the head instead, past the few older ones, however far the
   source ran ahead. */
static void seq_insert(braid_comm *c, braid__umsg *u) {
  u->lane = 0;
  uint64_t t = u->h.tag;
  if (!braid__tag_is_internal(t) || braid__tag_comm(t) != braid__tag_comm_fold(c->id)) return;
  uint64_t mask = braid__tag_mask(BRAID__TAG_SEQ_BITS), s = braid__tag_seq(t);
  uint64_t ahead = (s - c->seq) & mask;
  u->cseq = ahead < mask / 2 ? (int64_t)(c->seq + ahead) : (int64_t)c->seq - (int64_t)((c->seq - s) & mask);
  braid__matcher *m = &c->match;
  int i = lane_of(m, u->src > 0 ? u->src : 0);
  braid__match_lane *l = lane_at(m, i);
  braid__umsg *after = l->tail;
  if (u->cseq <= (int64_t)c->seq) {
    braid__umsg *before = l->head;
    after = NULL;
    while (before && before->cseq <= u->cseq) after = before, before = before->snext;
  } else {
    while (after && after->cseq > u->cseq) after = after->sprev;
  }
  if (!l->head) { /* the lane joins the non-empty ones */
    l->prev = 0;
    l->next = m->active;
    if (m->active) lane_at(m, m->active - 1)->prev = i + 1;
    m->active = i + 1;
  }
  u->sprev = after;
  u->snext = after ? after->snext : l->head;
  if (u->snext) u->snext->sprev = u;
  else l->tail = u;
  if (after) after->snext = u;
  else l->head = u;
  u->lane = i + 1;
}

static void seq_remove(braid_comm *c, braid__umsg *u) {
  if (!u->lane) return;
  braid__matcher *m = &c->match;
  braid__match_lane *l = lane_at(m, u->lane - 1);
  if (u->sprev) u->sprev->snext = u->snext;
  else l->head = u->snext;
  if (u->snext) u->snext->sprev = u->sprev;
  else l->tail = u->sprev;
  if (!l->head) {
    if (l->prev) lane_at(m, l->prev - 1)->next = l->next;
    else m->active = l->next;
    if (l->next) lane_at(m, l->next - 1)->prev = l->prev;
    l->next = l->prev = 0;
  }
  u->snext = u->sprev = NULL;
  u->lane = 0;
}

void braid__match_unexpected(braid_comm *c, braid__umsg *u) {
  push(bucket_of(&c->match.unexp, u->src, u->h.tag), (link *)u);
  c->match.nunexp++;
  maybe_grow(&c->match.unexp, c->match.nunexp, umsg_key);
  seq_insert(c, u);
}

braid__umsg *braid__match_post(braid_comm *c, braid__req *r, braid_status *st) {
  *st = BRAID_OK;
  if (c->match.nunexp) {
    braid__match_bucket *b = bucket_of(&c->match.unexp, r->peer, r->h.tag);
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
      shrink_if_empty(&c->match.unexp, c->match.nunexp);
      return u;
    }
  }
  push(bucket_of(&c->match.posted, r->peer, r->h.tag), (link *)r);
  r->queued = 1;
  c->match.nposted++;
  maybe_grow(&c->match.posted, c->match.nposted, req_key);
  return NULL;
}

void braid__match_cancel(braid_comm *c, braid__req *r) {
  if (!r->queued) return;
  unlink_from(bucket_of(&c->match.posted, r->peer, r->h.tag), (link *)r);
  r->queued = 0;
  c->match.nposted--;
  shrink_if_empty(&c->match.posted, c->match.nposted);
}

int braid__match_find_foreign(braid_comm *c, uint64_t seq, const braid__desc *mine, int *src, braid__desc *theirs) {
  braid__matcher *m = &c->match;
  for (int i = m->active; i; i = lane_at(m, i - 1)->next)
    for (braid__umsg *u = lane_at(m, i - 1)->head; u; u = u->snext) {
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
  braid__matcher *m = &c->match;
  const braid__umsg *u = NULL; /* the oldest collective's: the least of the lanes' heads */
  for (int i = m->active; i; i = lane_at(m, i - 1)->next) {
    const braid__umsg *head = lane_at(m, i - 1)->head;
    if (!u || head->cseq < u->cseq) u = head;
  }
  if (!u || u->cseq > (int64_t)seq || (u->cseq == (int64_t)seq && !inclusive)) return 0;
  *src = u->src;
  *h = u->h;
  *tag_seq = braid__tag_seq(u->h.tag);
  return 1;
}

int braid__match_scan_of(braid_comm *c, uint64_t comm_id, uint64_t seq, int inclusive, const braid__desc *mine,
                         int *src, braid__msg_hdr *h, uint64_t *tag_seq) {
  if (!c->match.nunexp) return 0;
  braid__match_table *t = &c->match.unexp;
  braid__match_bucket *b = buckets(t);
  const size_t nb = (size_t)1 << bits_of(t);
  const uint64_t fold = braid__tag_comm_fold(comm_id), mask = braid__tag_mask(BRAID__TAG_SEQ_BITS);
  const braid__umsg *found = NULL;
  uint64_t most = 0; /* how far behind seq the oldest found is */
  for (size_t i = 0; i < nb && !(found && mine); i++)
    for (const link *e = b[i].head; e && !(found && mine); e = e->next) {
      const braid__umsg *u = (const braid__umsg *)e;
      const uint64_t tag = u->h.tag;
      if (!braid__tag_is_internal(tag) || braid__tag_comm(tag) != fold) continue;
      const uint64_t ahead = (braid__tag_seq(tag) - seq) & mask, behind = (seq - braid__tag_seq(tag)) & mask;
      if (mine) {
        if (ahead || braid__desc_equal(&u->h.desc, mine)) continue;
      } else if (ahead < mask / 2 && !(ahead == 0 && inclusive)) {
        continue; /* this collective or a later one */
      }
      if (found && (ahead ? behind : 0) <= most) continue;
      found = u;
      most = ahead ? behind : 0;
    }
  if (!found) return 0;
  *src = found->src;
  *h = found->h;
  *tag_seq = braid__tag_seq(found->h.tag);
  return 1;
}

braid__umsg *braid__match_pop_unexpected(braid_comm *c) {
  if (!c->match.nunexp) return NULL;
  braid__umsg *u = (braid__umsg *)pop_any(&c->match.unexp);
  if (!u) return NULL;
  c->match.nunexp--;
  seq_remove(c, u);
  return u;
}

void braid__match_drop_unexpected(braid_comm *c) {
  braid__umsg *u;
  while ((u = braid__match_pop_unexpected(c))) {
    if (c->ops->release_umsg) c->ops->release_umsg(c, u);
    free(u);
  }
}

void braid__match_free(braid_comm *c) {
  free(c->match.lanes);
  free(c->match.posted.b);
  free(c->match.unexp.b);
  c->match.lanes = NULL;
  c->match.nlanes = 0;
  c->match.posted.b = c->match.unexp.b = NULL;
}

braid__req *braid__match_pop_posted(braid_comm *c) {
  if (!c->match.nposted) return NULL;
  braid__req *r = (braid__req *)pop_any(&c->match.posted);
  if (!r) return NULL;
  c->match.nposted--;
  r->queued = 0;
  return r;
}

int braid__match_posted_from(braid_comm *c, int src) {
  if (!c->match.nposted) return 0;
  braid__match_table *t = &c->match.posted;
  size_t nb = (size_t)1 << bits_of(t);
  for (size_t i = 0; i < nb; i++)
    for (const braid__req *r = buckets(t)[i].head; r; r = r->next)
      if (r->peer == src) return 1;
  return 0;
}
