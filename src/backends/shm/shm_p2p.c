/* Point-to-point requests of the shm backend. Every ordered pair of ranks has
   a single-producer single-consumer ring in the segment. Small messages are
   copied into it at once (eager); large ones post a descriptor (address and
   length in the sender's memory) that the receiver pulls with one
   process_vm_readv (or one memcpy from its mapping of the sender's braid
   memory) and acknowledges, or, without single copy, answers with a
   clear-to-send after which the sender streams fragments through the ring,
   or vmsplices the message into a pipe of the receiver's (shm_pipe.c).
   Matching is the core's (core/match.h); this file moves records. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/shm/shm.h"

enum { REC_PAD = 1, REC_EAGER, REC_RTS, REC_ACK, REC_CTS, REC_DATA };
enum { REC_F_ZC = 1 }; /* RTS: the payload is the braid__mem_ref of the sender's buffer */
enum { REC_F_PIPE = 2 }; /* CTS: the receiver's pipes are offered (shm_ring.offer) */
enum { S_QUEUED, S_WAIT, S_STREAM };
enum { R_STREAM = 1, R_PULL };

typedef struct shm_rec {
  uint8_t kind, flags, dt, pad;
  uint32_t len;       /* payload bytes that follow the 64-byte header */
  uint64_t tag;
  uint64_t id;
  uint64_t count;
  uint64_t addr;      /* RTS: sender's address; DATA: offset in the message */
  braid__desc desc;   /* the sender's collective (internal traffic) */
  uint64_t seq;       /* ring position + 1, stored last (see stamp_of) */
} shm_rec;
_Static_assert(sizeof(shm_rec) == 64, "record header is one cache line");
#define REC_BODY offsetof(shm_rec, seq)

struct shm_ctrl {
  shm_ctrl *next;
  shm_rec rec;
};

static size_t rup64(size_t x) { return (x + 63) & ~(size_t)63; }

static braid__msg_hdr rec_hdr(const shm_rec *h) {
  braid__msg_hdr m = {h->tag, h->count, h->dt, 0, h->desc};
  return m;
}

/* ---------------------------------------------------------------- rings */

/* The stamp word of the record slot at ring position pos. A slot's stamp is
   zeroed by the producer before the record that ends there is published, so
   stale bytes from an earlier lap (a user's payload included) can never pass
   for the stamp the consumer expects. */
static _Atomic uint64_t *stamp_of(shm_ring *r, uint64_t pos) {
  return (_Atomic uint64_t *)(void *)(r->data + pos % SHM_RING_BYTES + REC_BODY);
}

/* Writes one record at head that spans span bytes, leaving a zeroed stamp
   where it ends; the caller has checked the space (span plus that line). */
static uint64_t ring_write(shm_ring *r, uint64_t head, const shm_rec *h, const void *payload, size_t len,
                           size_t span) {
  char *slot = r->data + head % SHM_RING_BYTES;
  memcpy(slot, h, REC_BODY);
  if (len) memcpy(slot + 64, payload, len);
  atomic_store_explicit(stamp_of(r, head + span), 0, memory_order_relaxed);
  atomic_store_explicit(stamp_of(r, head), head + 1, memory_order_release);
  return head + span;
}

static int ring_put(braid_comm *c, shm_state *s, int dst, const shm_rec *h, const void *payload, size_t len) {
  shm_ring *r = shm_ring_of(s, s->me, dst);
  shm_cursor *k = &s->cur[dst];
  uint64_t head = k->head;
  size_t need = 64 + rup64(len);
  size_t pos = (size_t)(head % SHM_RING_BYTES), contig = SHM_RING_BYTES - pos;
  size_t pad = contig < need ? contig : 0;
  /* One line more than the record: the zeroed stamp that follows it. */
  if (SHM_RING_BYTES - (size_t)(head - k->tail_seen) < pad + need + 64) {
    k->tail_seen = atomic_load_explicit(&r->tail, memory_order_acquire);
    if (SHM_RING_BYTES - (size_t)(head - k->tail_seen) < pad + need + 64) return 0;
  }
  if (pad) {
    shm_rec p = {.kind = REC_PAD, .len = (uint32_t)(contig - 64)};
    head = ring_write(r, head, &p, NULL, 0, contig);
  }
  k->head = ring_write(r, head, h, payload, len, need);
  c->moved++;
  shm_wake_fence(s);
  shm_wake_one(s, dst);
  return 1;
}

static void remove_send(shm_state *s, shm_req **link) {
  shm_req *o = *link;
  *link = o->snext;
  if (s->sends_tail == &o->snext) s->sends_tail = link;
}

static braid_status queue_rec(braid_comm *c, shm_state *s, int dst, const shm_rec *h) {
  if (!s->ctrl_q[dst] && ring_put(c, s, dst, h, NULL, 0)) return BRAID_OK;
  shm_ctrl *k = calloc(1, sizeof *k);
  if (!k) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory queueing a control record");
  k->rec = *h;
  shm_ctrl **link = &s->ctrl_q[dst];
  while (*link) link = &(*link)->next;
  *link = k;
  return BRAID_OK;
}

static braid_status queue_ctrl(braid_comm *c, shm_state *s, int dst, uint32_t kind, uint64_t id) {
  shm_rec h = {.kind = (uint8_t)kind, .id = id};
  return queue_rec(c, s, dst, &h);
}

static void add_active(shm_state *s, shm_req *r) {
  r->snext = s->active;
  s->active = r;
}

/* Leaves r to pull the sender's message id at addr (inside braid memory
   zref when zref is not NULL) once this rank's own records are out (see
   progress). */
static void pull_later(shm_state *s, shm_req *r, uint64_t id, uint64_t addr, const braid__mem_ref *zref) {
  r->state = R_PULL;
  r->id = id;
  r->addr = addr;
  r->zc = zref != NULL;
  if (zref) r->zref = *zref;
  s->npulls++;
  add_active(s, r);
}

/* Without single copy: the receiver asks for the message, offering its
   pipes where vmsplice works and the message is not too large for them,
   and the sender streams it through the pipes or the ring. */
static braid_status stream_later(braid_comm *c, shm_state *s, shm_req *r, uint64_t id) {
  int src = r->base.peer;
  r->state = R_STREAM;
  r->id = id;
  r->got = 0;
  r->pno = SHM_NO_PNO;
  add_active(s, r);
  shm_rec h = {.kind = REC_CTS, .id = id};
  if (s->splice && r->base.bytes <= SHM_PIPE_MAX && shm_pipe_offer(s, src)) {
    h.flags = REC_F_PIPE;
    r->pno = s->pipes[src].asked++;
  }
  return queue_rec(c, s, src, &h);
}

/* The sender of r's rendezvous message left before r had all of it: its
   buffer may hold something else by now. */
static braid_status sender_left(braid_comm *c, shm_req *r) {
  /* A peer that failed and left said why: that is the error to report. */
  if (braid__poll_remote_failure(c, 0)) return (braid_status)atomic_load(&c->failed);
  return braid__fail(c, BRAID_ERR_PEER_LOST,
                     "rank %d destroyed its communicator before its %zu-byte message with tag %u was received",
                     braid__label(c, r->base.peer), r->base.bytes, (unsigned)r->base.h.tag);
}

/* Reads what the pipes hold into the receives whose turn it is; a receive
   read whole is acknowledged, which frees the sender's buffer. */
static braid_status pipe_reads(braid_comm *c, shm_state *s) {
  for (shm_req **link = &s->active; *link;) {
    shm_req *r = *link;
    shm_pipe *p = &s->pipes[r->base.peer];
    /* Where the sender refused the pipes, nothing is ever lent to them: its
       DATA records fill the receive instead. */
    if (r->state != R_STREAM || r->pno == SHM_NO_PNO || r->pno != p->rd_turn) {
      link = &r->snext;
      continue;
    }
    size_t got;
    braid_status st = shm_pipe_pull(c, s, r->base.peer, (char *)r->base.buf + r->got, r->base.bytes - r->got, &got);
    if (st) return st;
    if (!got) {
      link = &r->snext;
      continue;
    }
    r->got += got;
    c->moved++;
    shm_wake_fence(s);
    shm_wake_one(s, r->base.peer); /* it may wait for room in the pipe */
    if (r->got < r->base.bytes) {
      link = &r->snext;
      continue;
    }
    /* Pages lent to a pipe are read as they are now: a sender that gave the
       send up may have written them since. */
    if (atomic_load(&shm_ctl_of(s, r->base.peer)->left)) return sender_left(c, r);
    *link = r->snext;
    p->rd_turn++;
    int src = r->base.peer;
    uint64_t id = r->id;
    braid__req_complete(c, &r->base, BRAID_OK);
    if ((st = queue_ctrl(c, s, src, REC_ACK, id))) return st;
  }
  return BRAID_OK;
}

/* Copies a rendezvous message into the receive's buffer, straight from the
   sender's braid memory or by single copy, and acknowledges it. */
static braid_status pull(braid_comm *c, shm_state *s, shm_req *r) {
  int src = r->base.peer;
  if (atomic_load(&shm_ctl_of(s, src)->left)) return sender_left(c, r);
  braid_status st;
  if (r->zc) {
    const char *from;
    if ((st = shm_zc_map(c, s, src, &r->zref, r->addr, 0, &from))) return st;
    shm_copy_out(r->base.buf, from, r->base.bytes, r->base.bytes);
  } else if ((st = shm_cma_read(c, s, src, r->base.buf, r->addr, r->base.bytes))) {
    return st;
  }
  /* The sender may have given the send up and reused its buffer while this
     rank copied: it says so before it returns. */
  if (atomic_load(&shm_ctl_of(s, src)->left)) return sender_left(c, r);
  c->moved++;
  return queue_ctrl(c, s, src, REC_ACK, r->id);
}

/* The braid memory a rendezvous descriptor names, NULL if none (or if this
   communicator cannot map its peers' memory). Payloads start 64 bytes into
   their record, so the pointer is aligned. */
static const braid__mem_ref *rts_zref(const shm_state *s, const shm_rec *h, const char *payload) {
  return s->zc && h->kind == REC_RTS && (h->flags & REC_F_ZC) && h->len == sizeof(braid__mem_ref)
             ? (const braid__mem_ref *)(const void *)payload
             : NULL;
}

/* An unexpected message's eager payload goes back to the cache (see ebuf). */
static void umsg_data_free(shm_state *s, shm_umsg *u) {
  if (u->pooled && u->data && s->nebuf < SHM_EBUF_CACHE) s->ebuf[s->nebuf++] = u->data;
  else free(u->data);
  u->data = NULL;
}

/* A message (eager payload or rendezvous descriptor) from src meets the
   posted receives; unmatched, it is kept as unexpected. */
static braid_status deliver(braid_comm *c, shm_state *s, int src, const shm_rec *h, const char *payload) {
  int rndv = h->kind == REC_RTS;
  braid__msg_hdr mh = rec_hdr(h);
  braid_status st;
  braid__req *br = braid__match_arrival(c, src, &mh, &st);
  if (st) return st;
  const braid__mem_ref *z = rts_zref(s, h, payload);
  if (br) {
    shm_req *r = (shm_req *)br;
    if (!rndv) {
      if (h->len) memcpy(br->buf, payload, h->len);
      braid__req_complete(c, br, BRAID_OK);
      return BRAID_OK;
    }
    /* Pulled in one copy whenever possible, independent of when the sender
       runs: streaming through the ring (two copies that overlap only while
       both ranks are on a CPU, a hand-off per 64 KiB) lost at every size
       measured (docs/SHM.md). */
    if (z || s->cma) {
      pull_later(s, r, h->id, h->addr, z);
      return BRAID_OK;
    }
    return stream_later(c, s, r, h->id);
  }
  shm_umsg *u = calloc(1, sizeof *u);
  if (!u) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory queueing a message from rank %d", src);
  u->base.src = src;
  u->base.h = mh;
  u->base.bytes = h->count * braid_dtype_size((braid_dtype)h->dt);
  u->rndv = rndv;
  u->id = h->id;
  u->addr = h->addr;
  if (z) {
    u->zref = *z;
    u->zc = 1;
  }
  if (!rndv && h->len) {
    u->pooled = h->len <= SHM_EAGER_MAX;
    u->data = !u->pooled ? malloc(h->len) : s->nebuf ? s->ebuf[--s->nebuf] : malloc(SHM_EAGER_MAX);
    if (!u->data) {
      free(u);
      return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory buffering a %u-byte message from rank %d", h->len,
                         src);
    }
    memcpy(u->data, payload, h->len);
  }
  braid__match_unexpected(c, &u->base);
  return BRAID_OK;
}

static braid_status handle(braid_comm *c, shm_state *s, int src, const shm_rec *h, const char *payload) {
  switch (h->kind) {
  case REC_EAGER:
  case REC_RTS:
    return deliver(c, s, src, h, payload);
  case REC_ACK:
  case REC_CTS:
    for (shm_req **link = &s->sends; *link; link = &(*link)->snext) {
      shm_req *o = *link;
      if (o->base.peer != src || o->id != h->id || o->state != S_WAIT) continue;
      if (h->kind == REC_ACK) {
        remove_send(s, link);
        braid__req_complete(c, &o->base, BRAID_OK);
      } else {
        o->state = S_STREAM;
        o->sent = 0;
        o->pno = SHM_NO_PNO;
        if (h->flags & REC_F_PIPE) {
          o->pno = s->pipes[src].offered++;
          shm_pipe_open_out(c, s, src);
        }
      }
      return BRAID_OK;
    }
    return braid__fail_comm(c, BRAID_ERR_INTERNAL, "rank %d acknowledged unknown message %llu", src,
                            (unsigned long long)h->id);
  case REC_DATA:
    for (shm_req **link = &s->active; *link; link = &(*link)->snext) {
      shm_req *r = *link;
      if (r->state != R_STREAM || r->base.peer != src || r->id != h->id) continue;
      shm_copy_out((char *)r->base.buf + h->addr, payload, h->len, r->base.bytes);
      r->got += h->len;
      if (r->got == r->base.bytes) {
        *link = r->snext;
        braid__req_complete(c, &r->base, BRAID_OK);
      }
      return BRAID_OK;
    }
    return braid__fail_comm(c, BRAID_ERR_INTERNAL, "rank %d sent data for unknown message %llu", src,
                            (unsigned long long)h->id);
  default:
    return braid__fail_comm(c, BRAID_ERR_INTERNAL, "corrupt record kind %u in the ring from rank %d", h->kind, src);
  }
}

static braid_status drain(braid_comm *c, shm_state *s, int src) {
  shm_ring *r = shm_ring_of(s, src, s->me);
  uint64_t tail = s->cur[src].tail, start = tail;
  braid_status st = BRAID_OK;
  while (!st && atomic_load_explicit(stamp_of(r, tail), memory_order_acquire) == tail + 1) {
    const char *p = r->data + tail % SHM_RING_BYTES;
    shm_rec h;
    memcpy(&h, p, sizeof h);
    if (h.kind != REC_PAD) st = handle(c, s, src, &h, p + 64);
    tail += 64 + rup64(h.len);
  }
  if (tail == start) return st;
  c->moved++;
  s->cur[src].tail = tail;
  atomic_store_explicit(&r->tail, tail, memory_order_release);
  shm_wake_fence(s);
  shm_wake_one(s, src);
  return st;
}

/* Lends as much of o's message to dst's pipe as it takes, when o's turn
   has come; the whole message lent, o waits for the acknowledgement. */
static braid_status pipe_push(braid_comm *c, shm_state *s, shm_req *o) {
  int dst = o->base.peer;
  shm_pipe *p = &s->pipes[dst];
  if (o->pno != p->wr_turn) return BRAID_OK;
  size_t done;
  braid_status st = shm_pipe_push(c, s, dst, (const char *)o->base.buf + o->sent, o->base.bytes - o->sent, &done);
  if (st || !done) return st;
  o->sent += done;
  c->moved++;
  shm_wake_fence(s);
  shm_wake_one(s, dst);
  if (o->sent == o->base.bytes) {
    o->state = S_WAIT;
    p->wr_turn++;
  }
  return BRAID_OK;
}

/* Writes what waits for ring space, in order per destination. */
static braid_status flush(braid_comm *c, shm_state *s) {
  for (int d = 0; d < s->n; d++) {
    while (s->ctrl_q[d]) {
      shm_ctrl *k = s->ctrl_q[d];
      if (!ring_put(c, s, d, &k->rec, NULL, 0)) break;
      s->ctrl_q[d] = k->next;
      free(k);
    }
  }
  /* A destination whose first queued send found its ring full takes no
     later send this pass: a smaller one that fits would overtake it. The
     pass number marks them (never 0, the value of one not yet stalled). */
  if (++s->pass == 0) {
    memset(s->stalled, 0, sizeof *s->stalled * (size_t)s->n);
    s->pass = 1;
  }
  for (shm_req **link = &s->sends; *link;) {
    shm_req *o = *link;
    int dest = o->base.peer;
    if (s->stalled[dest] == s->pass) {
      link = &o->snext;
      continue;
    }
    if (o->state == S_QUEUED) {
      shm_rec h = {.tag = o->base.h.tag, .id = o->id, .count = o->base.h.count, .dt = (uint8_t)o->base.h.dt,
                   .desc = o->base.h.desc};
      int eager = o->base.bytes <= SHM_EAGER_MAX;
      h.kind = eager ? REC_EAGER : REC_RTS;
      h.len = eager ? (uint32_t)o->base.bytes : 0;
      h.addr = (uint64_t)(uintptr_t)o->base.buf;
      /* A buffer in braid memory: the receiver copies it in place. */
      braid__mem_ref z;
      const void *payload = o->base.buf;
      if (!eager && s->zc && braid__mem_find(o->base.buf, o->base.bytes, &z)) {
        h.flags = REC_F_ZC;
        h.len = sizeof z;
        payload = &z;
      }
      if (!ring_put(c, s, dest, &h, payload, h.len)) {
        s->stalled[dest] = s->pass;
        link = &o->snext;
        continue;
      }
      if (eager) {
        remove_send(s, link);
        braid__req_complete(c, &o->base, BRAID_OK);
        continue;
      }
      o->state = S_WAIT;
    }
    if (o->state == S_STREAM && o->pno != SHM_NO_PNO && s->pipes[dest].out[0] >= 0) {
      braid_status st = pipe_push(c, s, o);
      if (st) return st;
    } else if (o->state == S_STREAM) {
      while (o->sent < o->base.bytes) {
        size_t len = o->base.bytes - o->sent < SHM_FRAG ? o->base.bytes - o->sent : SHM_FRAG;
        shm_rec h = {.kind = REC_DATA, .len = (uint32_t)len, .id = o->id, .addr = o->sent};
        if (!ring_put(c, s, dest, &h, (const char *)o->base.buf + o->sent, len)) break;
        o->sent += len;
      }
      if (o->sent == o->base.bytes) {
        remove_send(s, link);
        braid__req_complete(c, &o->base, BRAID_OK);
        continue;
      }
    }
    link = &o->snext;
  }
  return BRAID_OK;
}

/* Single-copy pulls go last, after this rank's own records (a send's
   descriptor above all) are in the rings: a pull takes as long as the copy,
   and a peer waiting for that descriptor would otherwise idle meanwhile.
   Posting a send or a receive leaves pulls to the waits, so a receive
   posted before a send never holds the send back. */
static braid_status progress(braid_comm *c, shm_state *s, int do_pulls) {
  braid_status st = BRAID_OK;
  for (int q = 0; q < s->n && !st; q++) st = drain(c, s, q);
  if (!st) st = flush(c, s);
  if (!st && do_pulls && s->splice && s->active) st = pipe_reads(c, s);
  if (!st && do_pulls && s->npulls) {
    for (shm_req **link = &s->active; *link && !st;) {
      shm_req *r = *link;
      if (r->state != R_PULL) {
        link = &r->snext;
        continue;
      }
      st = pull(c, s, r);
      s->npulls--;
      *link = r->snext;
      braid__req_complete(c, &r->base, st ? st : BRAID_OK);
    }
    if (!st) st = flush(c, s);
  }
  return st;
}

braid_status shm_progress(braid_comm *c) { return progress(c, c->be, 1); }

/* ---------------------------------------------------------------- the contract */

braid_status shm_isend(braid_comm *c, braid__req *br) {
  shm_state *s = c->be;
  shm_req *o = (shm_req *)br;
  o->id = ++s->next_id;
  /* Fast path: a small message with nothing queued ahead of it goes straight
     into the ring (the order per destination is kept: nothing is pending). */
  if (br->bytes <= SHM_EAGER_MAX && !s->sends && !s->ctrl_q[br->peer]) {
    shm_rec h = {.kind = REC_EAGER, .dt = (uint8_t)br->h.dt, .len = (uint32_t)br->bytes, .tag = br->h.tag,
                 .id = o->id, .count = br->h.count, .desc = br->h.desc};
    if (ring_put(c, s, br->peer, &h, br->buf, br->bytes)) {
      braid__req_complete(c, br, BRAID_OK);
      return BRAID_OK;
    }
  }
  o->state = S_QUEUED;
  o->snext = NULL;
  *s->sends_tail = o;
  s->sends_tail = &o->snext;
  /* Queued, the request is this backend's until it completes or the
     communicator goes: a failure this pass finds fails the communicator
     (sticky) and reaches the caller's wait, and the caller must not free
     the request as it would a refused one. */
  (void)progress(c, s, 0);
  return BRAID_OK;
}

/* The receive is on the matcher's queue: anything still in a ring is newer
   than the unexpected messages it was checked against, and this pass
   delivers it straight into the buffer. */
braid_status shm_irecv(braid_comm *c, braid__req *r) {
  (void)r;
  /* As in shm_isend: the posted receive may already be in this backend's
     hands when the pass fails, so the failure travels through the
     communicator and the request, not this return. */
  (void)progress(c, c->be, 0);
  return BRAID_OK;
}

braid_status shm_take(braid_comm *c, braid__req *br, braid__umsg *bu) {
  shm_state *s = c->be;
  shm_umsg *u = (shm_umsg *)bu;
  shm_req *r = (shm_req *)br;
  braid_status st = BRAID_OK;
  if (!u->rndv) {
    if (br->bytes) memcpy(br->buf, u->data, br->bytes);
    braid__req_complete(c, br, BRAID_OK);
  } else if (u->zc || s->cma) {
    pull_later(s, r, u->id, u->addr, u->zc ? &u->zref : NULL);
  } else {
    st = stream_later(c, s, r, u->id);
  }
  umsg_data_free(s, u);
  return st;
}

void shm_release_umsg(braid_comm *c, braid__umsg *bu) {
  umsg_data_free(c->be, (shm_umsg *)bu);
}

void shm_p2p_free(braid_comm *c, shm_state *s) {
  while (s->nebuf) free(s->ebuf[--s->nebuf]);
  while (s->sends) {
    shm_req *o = s->sends;
    s->sends = o->snext;
    braid__req_drop(c, &o->base);
  }
  s->sends_tail = &s->sends;
  while (s->active) {
    shm_req *r = s->active;
    s->active = r->snext;
    braid__req_drop(c, &r->base);
  }
  s->npulls = 0;
  for (int d = 0; d < s->n; d++)
    while (s->ctrl_q[d]) {
      shm_ctrl *k = s->ctrl_q[d];
      s->ctrl_q[d] = k->next;
      free(k);
    }
}
