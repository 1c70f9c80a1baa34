/* Tagged point-to-point for the shm backend. Every ordered pair of ranks has a
   single-producer single-consumer ring in the segment. Small messages are
   copied into it at once (eager); large ones post a descriptor (address and
   length in the sender's memory) that the receiver pulls with one
   process_vm_readv (or one memcpy from its mapping of the sender's braid
   memory) and acknowledges, or, without single copy, answers with a
   clear-to-send after which the sender streams fragments through the ring.
   Progress happens in send/recv/sync and in every collective wait, so a
   symmetric exchange never deadlocks. */
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/shm/shm.h"
#include "core/reduce.h"
#include "os/time.h"

enum { REC_PAD = 1, REC_EAGER, REC_RTS, REC_ACK, REC_CTS, REC_DATA };
enum { REC_F_ZC = 1 }; /* RTS: the payload is the braid__mem_ref of the sender's buffer */
enum { S_QUEUED, S_WAIT, S_STREAM };
enum { R_POSTED, R_STREAM, R_PULL };

typedef struct shm_rec {
  uint32_t kind, tag;
  uint64_t len; /* payload bytes that follow the 64-byte header */
  uint64_t id;
  uint64_t count;
  uint32_t dt, flags; /* REC_F_* */
  uint64_t addr;  /* RTS: sender's address; DATA: offset in the message */
  uint64_t total; /* RTS: message bytes */
  uint64_t seq;   /* ring position + 1, stored last (see stamp_of) */
} shm_rec;
_Static_assert(sizeof(shm_rec) == 64, "record header is one cache line");
#define REC_BODY offsetof(shm_rec, seq)

struct shm_sendop {
  shm_sendop *next;
  uint64_t id;
  int dest, state;
  uint32_t tag;
  braid_dtype dt;
  size_t count, bytes, sent;
  const char *buf;
};

struct shm_recvop {
  shm_recvop *next;
  uint64_t id, addr; /* R_STREAM, R_PULL: the sender's message; R_PULL: its address */
  braid__mem_ref zref; /* R_PULL with zc: the braid memory that holds it */
  int src, state, zc;
  uint32_t tag;
  braid_dtype dt;
  size_t count, bytes, got;
  char *buf;
};

struct shm_umsg {
  shm_umsg *next;
  braid__mem_ref zref;
  int src, rndv, zc;
  uint32_t tag;
  braid_dtype dt;
  size_t count, bytes;
  uint64_t id, addr;
  char *data;
};

struct shm_ctrl {
  shm_ctrl *next;
  shm_rec rec;
};

static size_t rup64(size_t x) { return (x + 63) & ~(size_t)63; }

static void defer(shm_state *s, braid_status st, const char *msg) {
  if (s->deferred) return;
  s->deferred = st;
  snprintf(s->deferred_msg, sizeof s->deferred_msg, "%s", msg);
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

static int ring_put(shm_state *s, int dst, const shm_rec *h, const void *payload, size_t len) {
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
    shm_rec p = {.kind = REC_PAD, .len = contig - 64};
    head = ring_write(r, head, &p, NULL, 0, contig);
  }
  k->head = ring_write(r, head, h, payload, len, need);
  s->moved++;
  shm_wake_fence(s);
  shm_wake_one(s, dst);
  return 1;
}

static void remove_send(shm_state *s, shm_sendop **link) {
  shm_sendop *o = *link;
  *link = o->next;
  if (s->sends_tail == &o->next) s->sends_tail = link;
  free(o);
  s->npending--;
}

static void remove_recv(shm_state *s, shm_recvop **link) {
  shm_recvop *o = *link;
  *link = o->next;
  if (s->recvs_tail == &o->next) s->recvs_tail = link;
  free(o);
  s->npending--;
}

static braid_status queue_ctrl(braid_comm *c, shm_state *s, int dst, uint32_t kind, uint64_t id) {
  shm_rec h = {.kind = kind, .id = id};
  if (!s->ctrl_q[dst] && ring_put(s, dst, &h, NULL, 0)) return BRAID_OK;
  shm_ctrl *k = calloc(1, sizeof *k);
  if (!k) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory queueing a control record");
  k->rec = h;
  shm_ctrl **link = &s->ctrl_q[dst];
  while (*link) link = &(*link)->next;
  *link = k;
  return BRAID_OK;
}

/* Leaves r to pull the sender's message id at addr (inside braid memory
   zref when zref is not NULL) once this rank's own records are out (see
   progress). */
static void pull_later(shm_state *s, shm_recvop *r, uint64_t id, uint64_t addr, const braid__mem_ref *zref) {
  r->state = R_PULL;
  r->id = id;
  r->addr = addr;
  r->zc = zref != NULL;
  if (zref) r->zref = *zref;
  s->npulls++;
}

/* Copies a rendezvous message into the receive's buffer, straight from the
   sender's braid memory or by single copy, and acknowledges it. */
static braid_status pull(braid_comm *c, shm_state *s, const shm_recvop *r) {
  if (atomic_load(&shm_ctl_of(s, r->src)->left))
    return braid__fail(c, BRAID_ERR_PEER_LOST,
                       "rank %d destroyed its communicator before its %zu-byte message with tag %u was received",
                       r->src, r->bytes, r->tag);
  braid_status st;
  if (r->zc) {
    const char *from;
    if ((st = shm_zc_map(c, s, r->src, &r->zref, r->addr, &from))) return st;
    shm_copy_out(r->buf, from, r->bytes, r->bytes);
  } else if ((st = shm_cma_read(c, s, r->src, r->buf, r->addr, r->bytes))) {
    return st;
  }
  return queue_ctrl(c, s, r->src, REC_ACK, r->id);
}

/* The braid memory a rendezvous descriptor names, NULL if none (or if this
   communicator cannot map its peers' memory). Payloads start 64 bytes into
   their record, so the pointer is aligned. */
static const braid__mem_ref *rts_zref(const shm_state *s, const shm_rec *h, const char *payload) {
  return s->zc && h->kind == REC_RTS && (h->flags & REC_F_ZC) && h->len == sizeof(braid__mem_ref)
             ? (const braid__mem_ref *)(const void *)payload
             : NULL;
}

/* A message (eager payload or rendezvous descriptor) from src meets the
   posted receives; unmatched, it is queued as unexpected. */
static braid_status deliver(braid_comm *c, shm_state *s, int src, const shm_rec *h, const char *payload) {
  int rndv = h->kind == REC_RTS;
  size_t bytes = rndv ? h->total : h->len;
  for (shm_recvop **link = &s->recvs; *link;) {
    shm_recvop *r = *link;
    if (r->state != R_POSTED || r->src != src || r->tag != h->tag) {
      link = &r->next;
      continue;
    }
    if (r->count != h->count || r->dt != (braid_dtype)h->dt) {
      char msg[320];
      braid__mismatch_text(msg, sizeof msg, src, h->tag, h->count, (braid_dtype)h->dt, r->count, r->dt);
      if (r == s->just_posted) {
        /* The message was there when braid_recv was called: that call fails,
           as it does when the message was already taken from the ring. */
        s->just_posted = NULL;
        snprintf(s->posted_mismatch, sizeof s->posted_mismatch, "%s", msg);
      } else {
        defer(s, BRAID_ERR_MISMATCH, msg);
      }
      remove_recv(s, link);
      continue;
    }
    if (!rndv) {
      memcpy(r->buf, payload, bytes);
      remove_recv(s, link);
      return BRAID_OK;
    }
    /* Pulled in one copy whenever possible, independent of when the sender
       runs. Streaming through the ring (two copies that overlap only while
       both ranks are on a CPU, a hand-off per 64 KiB) lost at every size on
       the measured VM: 16 MiB ring exchange 2.7 ms pulled, 4.0 ms streamed;
       2.9 against 15 ms while the host kept the two vCPUs apart. */
    const braid__mem_ref *z = rts_zref(s, h, payload);
    if (z || s->cma) {
      pull_later(s, r, h->id, h->addr, z);
      return BRAID_OK;
    }
    r->state = R_STREAM;
    r->id = h->id;
    r->got = 0;
    return queue_ctrl(c, s, src, REC_CTS, h->id);
  }
  shm_umsg *u = calloc(1, sizeof *u);
  if (!u) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory queueing a message from rank %d", src);
  u->src = src;
  u->rndv = rndv;
  u->tag = h->tag;
  u->dt = (braid_dtype)h->dt;
  u->count = h->count;
  u->bytes = bytes;
  u->id = h->id;
  u->addr = h->addr;
  const braid__mem_ref *z = rts_zref(s, h, payload);
  if (z) {
    u->zref = *z;
    u->zc = 1;
  }
  if (!rndv && bytes) {
    u->data = malloc(bytes);
    if (!u->data) {
      free(u);
      return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory buffering a %zu-byte message from rank %d", bytes, src);
    }
    memcpy(u->data, payload, bytes);
  }
  *s->umsgs_tail = u;
  s->umsgs_tail = &u->next;
  return BRAID_OK;
}

static braid_status handle(braid_comm *c, shm_state *s, int src, const shm_rec *h, const char *payload) {
  switch (h->kind) {
  case REC_EAGER:
  case REC_RTS:
    return deliver(c, s, src, h, payload);
  case REC_ACK:
  case REC_CTS:
    for (shm_sendop **link = &s->sends; *link; link = &(*link)->next) {
      shm_sendop *o = *link;
      if (o->dest != src || o->id != h->id || o->state != S_WAIT) continue;
      if (h->kind == REC_ACK) {
        remove_send(s, link);
      } else {
        o->state = S_STREAM;
        o->sent = 0;
      }
      return BRAID_OK;
    }
    return braid__fail(c, BRAID_ERR_INTERNAL, "rank %d acknowledged unknown message %llu", src,
                       (unsigned long long)h->id);
  case REC_DATA:
    for (shm_recvop **link = &s->recvs; *link; link = &(*link)->next) {
      shm_recvop *r = *link;
      if (r->state != R_STREAM || r->src != src || r->id != h->id) continue;
      shm_copy_out(r->buf + h->addr, payload, h->len, r->bytes);
      r->got += h->len;
      if (r->got == r->bytes) remove_recv(s, link);
      return BRAID_OK;
    }
    return braid__fail(c, BRAID_ERR_INTERNAL, "rank %d sent data for unknown message %llu", src,
                       (unsigned long long)h->id);
  default:
    return braid__fail(c, BRAID_ERR_INTERNAL, "corrupt record kind %u in the ring from rank %d", h->kind, src);
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
  s->moved++;
  s->cur[src].tail = tail;
  atomic_store_explicit(&r->tail, tail, memory_order_release);
  shm_wake_fence(s);
  shm_wake_one(s, src);
  return st;
}

/* Writes what waits for ring space, in order per destination. */
static void flush(shm_state *s) {
  for (int d = 0; d < s->n; d++) {
    while (s->ctrl_q[d]) {
      shm_ctrl *k = s->ctrl_q[d];
      if (!ring_put(s, d, &k->rec, NULL, 0)) break;
      s->ctrl_q[d] = k->next;
      free(k);
    }
  }
  uint64_t blocked_lo = 0; /* bit per destination < 64 whose queue stalled this pass */
  for (shm_sendop **link = &s->sends; *link;) {
    shm_sendop *o = *link;
    int bit = o->dest < 64;
    if (bit && (blocked_lo >> o->dest & 1)) {
      link = &o->next;
      continue;
    }
    if (o->state == S_QUEUED) {
      shm_rec h = {.tag = o->tag, .id = o->id, .count = o->count, .dt = (uint32_t)o->dt};
      int eager = o->bytes <= SHM_EAGER_MAX;
      h.kind = eager ? REC_EAGER : REC_RTS;
      h.len = eager ? o->bytes : 0;
      h.addr = (uint64_t)(uintptr_t)o->buf;
      h.total = o->bytes;
      /* A buffer in braid memory: the receiver copies it in place. */
      braid__mem_ref z;
      const void *payload = o->buf;
      if (!eager && s->zc && braid__mem_find(o->buf, o->bytes, &z)) {
        h.flags = REC_F_ZC;
        h.len = sizeof z;
        payload = &z;
      }
      if (!ring_put(s, o->dest, &h, payload, h.len)) {
        if (bit) blocked_lo |= 1ull << o->dest;
        link = &o->next;
        continue;
      }
      if (eager) {
        remove_send(s, link);
        continue;
      }
      o->state = S_WAIT;
    }
    if (o->state == S_STREAM) {
      while (o->sent < o->bytes) {
        size_t len = o->bytes - o->sent < SHM_FRAG ? o->bytes - o->sent : SHM_FRAG;
        shm_rec h = {.kind = REC_DATA, .len = len, .id = o->id, .addr = o->sent};
        if (!ring_put(s, o->dest, &h, o->buf + o->sent, len)) break;
        o->sent += len;
      }
      if (o->sent == o->bytes) {
        remove_send(s, link);
        continue;
      }
    }
    link = &o->next;
  }
}

/* Single-copy pulls go last, after this rank's own records (a send's
   descriptor above all) are in the rings: a pull takes as long as the copy,
   and a peer waiting for that descriptor would otherwise idle meanwhile.
   braid_send and braid_recv leave pulls to braid_sync and the waits, so a
   receive posted before a send never holds the send back. */
static braid_status progress(braid_comm *c, shm_state *s, int do_pulls) {
  s->in_progress = 1;
  braid_status st = BRAID_OK;
  for (int q = 0; q < s->n && !st; q++) st = drain(c, s, q);
  if (!st) flush(s);
  if (!st && do_pulls && s->npulls) {
    for (shm_recvop **link = &s->recvs; *link && !st;) {
      shm_recvop *r = *link;
      if (r->state != R_PULL) {
        link = &r->next;
        continue;
      }
      st = pull(c, s, r);
      s->npulls--;
      remove_recv(s, link);
    }
    if (!st) flush(s);
  }
  s->in_progress = 0;
  return st;
}

braid_status shm_p2p_progress(braid_comm *c, shm_state *s) { return progress(c, s, 1); }

/* ---------------------------------------------------------------- calls */

braid_status shm_p2p_send(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int dest, uint32_t tag) {
  shm_state *s = c->be;
  size_t bytes = count * braid_dtype_size(dt);
  /* Fast path: a small message with nothing queued ahead of it goes straight
     into the ring (the order per destination is kept: nothing is pending). */
  if (bytes <= SHM_EAGER_MAX && !s->sends && !s->ctrl_q[dest]) {
    shm_rec h = {.kind = REC_EAGER, .tag = tag, .len = bytes, .id = ++s->next_id, .count = count, .dt = (uint32_t)dt};
    if (ring_put(s, dest, &h, buf, bytes)) return BRAID_OK;
    s->next_id--;
  }
  shm_sendop *o = calloc(1, sizeof *o);
  if (!o) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory posting a send");
  o->id = ++s->next_id;
  o->dest = dest;
  o->tag = tag;
  o->dt = dt;
  o->count = count;
  o->bytes = bytes;
  o->buf = buf;
  o->state = S_QUEUED;
  *s->sends_tail = o;
  s->sends_tail = &o->next;
  s->npending++;
  return progress(c, s, 0);
}

/* Appends a pending receive; id names the sender's message it streams (R_STREAM). */
static braid_status post_recv(braid_comm *c, shm_state *s, void *buf, size_t count, braid_dtype dt, int src,
                              uint32_t tag, int state, uint64_t id, shm_recvop **out) {
  shm_recvop *r = calloc(1, sizeof *r);
  if (!r) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory posting a receive");
  r->id = id;
  r->src = src;
  r->tag = tag;
  r->dt = dt;
  r->count = count;
  r->bytes = count * braid_dtype_size(dt);
  r->buf = buf;
  r->state = state;
  *s->recvs_tail = r;
  s->recvs_tail = &r->next;
  s->npending++;
  if (out) *out = r;
  return BRAID_OK;
}

braid_status shm_p2p_recv(braid_comm *c, void *buf, size_t count, braid_dtype dt, int src, uint32_t tag) {
  shm_state *s = c->be;
  braid_status st = BRAID_OK;
  size_t bytes = count * braid_dtype_size(dt);
  /* Messages already taken from the rings come first; anything still in a
     ring is newer, and the progress after posting delivers it straight
     into buf without buffering it. */
  for (shm_umsg **link = &s->umsgs; *link; link = &(*link)->next) {
    shm_umsg *u = *link;
    if (u->src != src || u->tag != tag) continue;
    if (u->count != count || u->dt != dt) {
      char msg[320];
      braid__mismatch_text(msg, sizeof msg, src, tag, u->count, u->dt, count, dt);
      return braid__fail(c, BRAID_ERR_MISMATCH, "%s", msg);
    }
    *link = u->next;
    if (s->umsgs_tail == &u->next) s->umsgs_tail = link;
    if (!u->rndv) {
      memcpy(buf, u->data, bytes);
    } else if (u->zc || s->cma) {
      shm_recvop *r = NULL;
      st = post_recv(c, s, buf, count, dt, src, tag, R_POSTED, 0, &r);
      if (!st) pull_later(s, r, u->id, u->addr, u->zc ? &u->zref : NULL);
    } else {
      st = post_recv(c, s, buf, count, dt, src, tag, R_STREAM, u->id, NULL);
      if (!st) st = queue_ctrl(c, s, src, REC_CTS, u->id);
    }
    free(u->data);
    free(u);
    return st;
  }
  shm_recvop *r = NULL;
  st = post_recv(c, s, buf, count, dt, src, tag, R_POSTED, 0, &r);
  if (st) return st;
  s->just_posted = r;
  s->posted_mismatch[0] = 0;
  st = progress(c, s, 0);
  s->just_posted = NULL;
  if (!st && s->posted_mismatch[0]) return braid__fail(c, BRAID_ERR_MISMATCH, "%s", s->posted_mismatch);
  return st;
}

/* The rank the oldest pending operation waits for. */
static int first_peer(const shm_state *s) { return s->recvs ? s->recvs->src : s->sends ? s->sends->dest : -1; }

void shm_p2p_describe(shm_state *s, char *out, size_t len) {
  if (s->recvs) {
    shm_recvop *r = s->recvs;
    snprintf(out, len, "a message with tag %u (%zu bytes) for %d pending receive(s)", r->tag, r->bytes, s->npending);
  } else if (s->sends) {
    shm_sendop *o = s->sends;
    snprintf(out, len, "it to receive the message with tag %u (%zu bytes) of %d pending operation(s)", o->tag,
             o->bytes, s->npending);
  } else {
    snprintf(out, len, "pending operations");
  }
}

static braid_status take_deferred(braid_comm *c, shm_state *s) {
  braid_status st = s->deferred;
  s->deferred = BRAID_OK;
  return braid__fail(c, st, "%s", s->deferred_msg);
}

braid_status shm_p2p_sync(braid_comm *c, double timeout_s, int quiet) {
  shm_state *s = c->be;
  if (quiet) {
    /* braid_destroy: bounded best effort; nothing is recorded as an error. */
    double deadline = braid__now() + timeout_s;
    while (s->npending && braid__now() < deadline && !atomic_load(&s->hdr->fail) && !braid__aborted(c)) {
      if (shm_p2p_progress(c, s)) break;
      if (s->npending) sched_yield();
    }
    int ns = 0, nr = 0, nu = 0;
    for (shm_sendop *o = s->sends; o; o = o->next) ns++;
    for (shm_recvop *r = s->recvs; r; r = r->next) nr++;
    for (shm_umsg *u = s->umsgs; u; u = u->next) nu++;
    if (ns || nr)
      BLOG_WARN(BRAID_SUB_P2P, c->rank, "braid_destroy: abandoned %d send(s) and %d receive(s) after waiting %g s", ns,
                nr, timeout_s);
    if (nu) BLOG_WARN(BRAID_SUB_P2P, c->rank, "braid_destroy: dropped %d message(s) that were never received", nu);
    return BRAID_OK;
  }
  braid_status st = shm_p2p_progress(c, s);
  if (st) return st;
  if (s->deferred) return take_deferred(c, s);
  if (!s->npending) return BRAID_OK;
  shm_wait w;
  shm_wait_begin(&w);
  uint64_t seen = s->moved;
  while (s->npending) {
    st = shm_wait_step(c, s, &w, first_peer(s), NULL);
    if (!st) st = shm_p2p_progress(c, s);
    if (st) {
      shm_wait_end(s, &w);
      return st;
    }
    if (s->moved != seen) {
      /* A long transfer that keeps moving is not a stall: back to spinning
         (and the deadline counts from the last progress). */
      seen = s->moved;
      shm_wait_end(s, &w);
      shm_wait_begin(&w);
    }
  }
  shm_wait_end(s, &w);
  if (s->deferred) return take_deferred(c, s);
  return BRAID_OK;
}

void shm_p2p_free(braid_comm *c, shm_state *s) {
  (void)c;
  while (s->sends) remove_send(s, &s->sends);
  while (s->recvs) remove_recv(s, &s->recvs);
  while (s->umsgs) {
    shm_umsg *u = s->umsgs;
    s->umsgs = u->next;
    free(u->data);
    free(u);
  }
  for (int d = 0; d < s->n; d++)
    while (s->ctrl_q[d]) {
      shm_ctrl *k = s->ctrl_q[d];
      s->ctrl_q[d] = k->next;
      free(k);
    }
}
