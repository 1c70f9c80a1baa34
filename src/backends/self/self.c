/* Backend "self": a one-rank communicator. Collectives are local copies and
   reductions; send/recv pair up within the process (another thread may supply
   the send that a waiting braid_sync needs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/comm.h"
#include "core/reduce.h"
#include "os/time.h"

typedef struct self_msg {
  struct self_msg *next;
  uint32_t tag;
  size_t count;
  braid_dtype dt;
  const void *data; /* the sender's buffer until sync, then `owned` */
  void *owned;
} self_msg;

typedef struct self_recv {
  struct self_recv *next;
  uint32_t tag;
  size_t count;
  braid_dtype dt;
  void *buf;
} self_recv;

typedef struct self_state {
  pthread_cond_t cond; /* signalled when a message arrives or on abort; waits on c->lock */
  self_msg *msgs, **msgs_tail;   /* sent, not yet received (FIFO) */
  self_recv *recvs, **recvs_tail; /* posted, not yet matched (FIFO) */
  braid_status deferred;          /* error found while matching, reported by the next sync */
  char deferred_msg[256];
} self_state;

static self_state *state(braid_comm *c) { return c->be; }

static braid_status self_new(braid_comm *c) {
  self_state *s = calloc(1, sizeof *s);
  if (!s) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for the self backend");
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cond, &attr);
  pthread_condattr_destroy(&attr);
  s->msgs_tail = &s->msgs;
  s->recvs_tail = &s->recvs;
  c->be = s;
  return BRAID_OK;
}

static braid_status self_init(braid_comm *c) {
  if (c->size != 1)
    return braid__fail(c, BRAID_ERR_INVALID_ARG, "backend self supports world size 1 only, not %d", c->size);
  return self_new(c);
}

static braid_status self_split(braid_comm *parent, braid_comm *child, const int *members, int n) {
  (void)parent;
  (void)members;
  (void)n;
  return self_new(child);
}


static int same_shape(size_t c1, braid_dtype d1, size_t c2, braid_dtype d2) { return c1 == c2 && d1 == d2; }

static void remove_msg(self_state *s, self_msg **link) {
  self_msg *m = *link;
  *link = m->next;
  if (s->msgs_tail == &m->next) s->msgs_tail = link;
  free(m->owned);
  free(m);
}

static void remove_recv(self_state *s, self_recv **link) {
  self_recv *r = *link;
  *link = r->next;
  if (s->recvs_tail == &r->next) s->recvs_tail = link;
  free(r);
}

static braid_status self_send(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int dest, uint32_t tag) {
  (void)dest;
  self_state *s = state(c);
  /* The first posted receive of this tag takes the message; a receive of the
     wrong shape fails (reported by the next sync) and the message moves on. */
  for (self_recv **link = &s->recvs; *link;) {
    self_recv *r = *link;
    if (r->tag != tag) {
      link = &r->next;
      continue;
    }
    if (same_shape(r->count, r->dt, count, dt)) {
      memcpy(r->buf, buf, count * braid_dtype_size(dt));
      remove_recv(s, link);
      pthread_cond_broadcast(&s->cond);
      return BRAID_OK;
    }
    if (!s->deferred) {
      s->deferred = BRAID_ERR_MISMATCH;
      braid__mismatch_text(s->deferred_msg, sizeof s->deferred_msg, 0, tag, count, dt, r->count, r->dt);
    }
    remove_recv(s, link);
  }
  self_msg *m = calloc(1, sizeof *m);
  if (!m) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory queueing a message");
  m->tag = tag;
  m->count = count;
  m->dt = dt;
  m->data = buf;
  *s->msgs_tail = m;
  s->msgs_tail = &m->next;
  return BRAID_OK;
}

static braid_status self_recv_post(braid_comm *c, void *buf, size_t count, braid_dtype dt, int src, uint32_t tag) {
  (void)src;
  self_state *s = state(c);
  for (self_msg **link = &s->msgs; *link; link = &(*link)->next) {
    self_msg *m = *link;
    if (m->tag != tag) continue;
    if (!same_shape(m->count, m->dt, count, dt)) {
      /* The message stays queued for a receive of the right shape. */
      char text[256];
      braid__mismatch_text(text, sizeof text, 0, tag, m->count, m->dt, count, dt);
      return braid__fail(c, BRAID_ERR_MISMATCH, "%s", text);
    }
    memcpy(buf, m->owned ? m->owned : m->data, count * braid_dtype_size(dt));
    remove_msg(s, link);
    return BRAID_OK;
  }
  self_recv *r = calloc(1, sizeof *r);
  if (!r) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory posting a receive");
  r->tag = tag;
  r->count = count;
  r->dt = dt;
  r->buf = buf;
  *s->recvs_tail = r;
  s->recvs_tail = &r->next;
  return BRAID_OK;
}

/* Completes sends: unreceived messages get their own copy so the sender may reuse its buffer. */
static braid_status own_messages(braid_comm *c, self_state *s) {
  for (self_msg *m = s->msgs; m; m = m->next) {
    if (m->owned) continue;
    size_t bytes = m->count * braid_dtype_size(m->dt);
    m->owned = malloc(bytes);
    if (!m->owned)
      return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory buffering a %zu-byte message (tag %u)", bytes, m->tag);
    memcpy(m->owned, m->data, bytes);
    m->data = NULL;
  }
  return BRAID_OK;
}

static int count_recvs(const self_state *s) {
  int n = 0;
  for (const self_recv *r = s->recvs; r; r = r->next) n++;
  return n;
}

/* Waits (releasing c->lock) until every posted receive is matched, the
   deadline passes or the communicator is aborted. */
static braid_status wait_recvs(braid_comm *c, self_state *s, double timeout_s, int *timed_out) {
  double deadline = braid__deadline(timeout_s);
  double warn_at = braid__now() + 2.0;
  *timed_out = 0;
  while (s->recvs) {
    if (braid__aborted(c)) return BRAID_ERR_ABORTED;
    double now = braid__now();
    if (now >= deadline) {
      *timed_out = 1;
      return BRAID_ERR_TIMEOUT;
    }
    if (now >= warn_at) {
      BLOG_WARN(BRAID_SUB_P2P, c->rank,
                "%s: still waiting for %d receive(s) (first: tag %u); on a one-rank communicator only a "
                "braid_send from this process can complete them",
                c->call, count_recvs(s), s->recvs->tag);
      warn_at = INFINITY;
    }
    /* Bounded slices keep the deadline and abort checks live. */
    double until = now + 0.05;
    if (until > deadline) until = deadline;
    if (until > warn_at) until = warn_at;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double add = until - now;
    ts.tv_sec += (time_t)add;
    ts.tv_nsec += (long)((add - (double)(time_t)add) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->cond, &c->lock, &ts);
  }
  return BRAID_OK;
}

static braid_status self_sync(braid_comm *c) {
  self_state *s = state(c);
  braid_status st = own_messages(c, s);
  if (st) return st;
  if (s->deferred) {
    st = s->deferred;
    s->deferred = BRAID_OK;
    return braid__fail(c, st, "%s", s->deferred_msg);
  }
  int timed_out;
  st = wait_recvs(c, s, c->timeout_s, &timed_out);
  if (st == BRAID_ERR_ABORTED) return braid__fail(c, st, "aborted while waiting for %d receive(s)", count_recvs(s));
  if (st == BRAID_ERR_TIMEOUT)
    return braid__fail(c, st, "timed out after %g s waiting for %d receive(s) (first: tag %u, %zu elements)",
                       c->timeout_s, count_recvs(s), s->recvs->tag, s->recvs->count);
  if (s->deferred) { /* a send that arrived while we waited had the wrong shape */
    st = s->deferred;
    s->deferred = BRAID_OK;
    return braid__fail(c, st, "%s", s->deferred_msg);
  }
  return BRAID_OK;
}

static braid_status self_barrier(braid_comm *c) { return self_sync(c); }

static void self_destroy(braid_comm *c, double timeout_s) {
  self_state *s = state(c);
  int timed_out = 0;
  if (s->recvs && !atomic_load(&c->failed)) wait_recvs(c, s, timeout_s > 0 ? timeout_s : 1e-9, &timed_out);
  int nr = count_recvs(s), nm = 0;
  for (self_msg *m = s->msgs; m; m = m->next) nm++;
  if (nr)
    BLOG_WARN(BRAID_SUB_P2P, c->rank, "braid_destroy: abandoned %d unmatched receive(s) after waiting %g s", nr,
              atomic_load(&c->failed) ? 0.0 : timeout_s);
  if (nm) BLOG_WARN(BRAID_SUB_P2P, c->rank, "braid_destroy: dropped %d message(s) that were never received", nm);
  while (s->recvs) remove_recv(s, &s->recvs);
  while (s->msgs) remove_msg(s, &s->msgs);
  pthread_cond_destroy(&s->cond);
  free(s);
}

static void self_abort(braid_comm *c) {
  /* Taking the lock orders the wake-up after a waiter's abort check: it is
     either not yet checking or already asleep on the condition. */
  pthread_mutex_lock(&c->lock);
  if (c->be) pthread_cond_broadcast(&state(c)->cond);
  pthread_mutex_unlock(&c->lock);
}

static braid_status self_all_reduce(braid_comm *c, void *buf, size_t count, braid_dtype dt, braid_op op) {
  (void)c;
  const void *src = buf;
  /* One input still goes through the kernel: BOOL results become 0/1. */
  braid__reduce(buf, &src, 1, count, dt, op, 1);
  return BRAID_OK;
}

static braid_status self_broadcast(braid_comm *c, void *buf, size_t count, braid_dtype dt, int root) {
  (void)c, (void)buf, (void)count, (void)dt, (void)root;
  return BRAID_OK;
}

static braid_status self_all_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt) {
  (void)c;
  if (send != recv) memcpy(recv, send, count * braid_dtype_size(dt));
  return BRAID_OK;
}

static braid_status self_reduce_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                        braid_op op) {
  (void)c;
  braid__reduce(recv, &send, 1, count, dt, op, 1);
  return BRAID_OK;
}

const braid__backend_ops braid__self_ops = {
    .name = "self",
    .init = self_init,
    .split = self_split,
    .destroy = self_destroy,
    .abort = self_abort,
    .send = self_send,
    .recv = self_recv_post,
    .sync = self_sync,
    .barrier = self_barrier,
    .all_reduce = self_all_reduce,
    .broadcast = self_broadcast,
    .all_gather = self_all_gather,
    .reduce_scatter = self_reduce_scatter,
    .stream = NULL,
};
