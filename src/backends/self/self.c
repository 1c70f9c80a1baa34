/* Backend "self": a one-rank communicator. Collectives are local copies and
   reductions; send/recv pair up within the process through the core's
   matcher (another thread may supply the send that a waiting braid_sync
   needs: waits release the lock while they sleep). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/backends.h"
#include "core/reduce.h"

/* An unreceived message: the sender's buffer until a progress pass (the
   sync that completes the send) copies it into `owned`. */
typedef struct self_umsg {
  braid__umsg base;
  struct self_umsg *next_unowned;
  const void *data;
  void *owned;
  braid__req *send; /* completes once the message is owned or received */
} self_umsg;

typedef struct self_state {
  pthread_cond_t cond;        /* signalled when a message arrives or on abort; waits on c->lock */
  self_umsg *unowned;         /* messages still in their sender's buffer */
  int slow_checks;            /* liveness checks of the current wait (warns once after ~2 s) */
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
  c->be = s;
  return BRAID_OK;
}

static braid_status self_init(braid_comm *c) {
  if (c->size != 1)
    return braid__fail(c, BRAID_ERR_INVALID_ARG, "backend self supports world size 1 only, not %d", c->size);
  return self_new(c);
}

static braid_status self_split(braid_comm *parent, braid_comm *child, const int *members, int n) {
  (void)parent, (void)members, (void)n;
  return self_new(child);
}

static void unlink_unowned(self_state *s, self_umsg *u) {
  for (self_umsg **p = &s->unowned; *p; p = &(*p)->next_unowned)
    if (*p == u) {
      *p = u->next_unowned;
      return;
    }
}

static braid_status self_isend(braid_comm *c, braid__req *r) {
  self_state *s = state(c);
  braid_status st;
  braid__req *rr = braid__match_arrival(c, 0, &r->h, &st);
  if (st) return st;
  if (rr) {
    if (r->bytes) memcpy(rr->buf, r->buf, r->bytes);
    braid__req_complete(c, rr, BRAID_OK);
    braid__req_complete(c, r, BRAID_OK);
    c->moved++;
    pthread_cond_broadcast(&s->cond);
    return BRAID_OK;
  }
  self_umsg *u = calloc(1, sizeof *u);
  if (!u) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory queueing a message");
  u->base.src = 0;
  u->base.h = r->h;
  u->base.bytes = r->bytes;
  u->data = r->buf;
  u->send = r;
  u->next_unowned = s->unowned;
  s->unowned = u;
  braid__match_unexpected(c, &u->base);
  return BRAID_OK;
}

static braid_status self_irecv(braid_comm *c, braid__req *r) {
  (void)r; /* queued on the matcher; a send completes it */
  state(c)->slow_checks = 0;
  return BRAID_OK;
}

static braid_status self_take(braid_comm *c, braid__req *r, braid__umsg *bu) {
  self_umsg *u = (self_umsg *)bu;
  if (r->bytes) memcpy(r->buf, u->owned ? u->owned : u->data, r->bytes);
  braid__req_complete(c, r, BRAID_OK);
  if (u->send) {
    unlink_unowned(state(c), u);
    braid__req_complete(c, u->send, BRAID_OK);
  }
  free(u->owned);
  c->moved++;
  return BRAID_OK;
}

static void self_release_umsg(braid_comm *c, braid__umsg *bu) {
  self_umsg *u = (self_umsg *)bu;
  if (u->send) {
    unlink_unowned(state(c), u);
    braid__req_drop(c, u->send);
  }
  free(u->owned);
}

/* Completes sends: unreceived messages get their own copy so the sender may
   reuse its buffer. */
static braid_status self_progress(braid_comm *c) {
  self_state *s = state(c);
  while (s->unowned) {
    self_umsg *u = s->unowned;
    u->owned = malloc(u->base.bytes ? u->base.bytes : 1);
    if (!u->owned)
      return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory buffering a %zu-byte message (tag %u)", u->base.bytes,
                         (unsigned)u->base.h.tag);
    if (u->base.bytes) memcpy(u->owned, u->data, u->base.bytes);
    u->data = NULL;
    s->unowned = u->next_unowned;
    braid__req_complete(c, u->send, BRAID_OK);
    u->send = NULL;
  }
  return BRAID_OK;
}

static int self_arm(braid_comm *c) {
  (void)c;
  return 1;
}

/* Sleeps on the condition, releasing c->lock so another thread's call can
   supply the message. */
static void self_sleep(braid_comm *c, double slice_s) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += (time_t)slice_s;
  ts.tv_nsec += (long)((slice_s - (double)(time_t)slice_s) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  const braid__call_fields f = braid__lend_begin(c);
  pthread_cond_timedwait(&state(c)->cond, &c->lock, &ts);
  braid__lend_end(c, &f);
}

static void self_disarm(braid_comm *c) { (void)c; }

static braid_status self_check_peers(braid_comm *c, int peer, const char *what) {
  (void)peer;
  self_state *s = state(c);
  if (++s->slow_checks == 20)
    BLOG_WARN(BRAID_SUB_P2P, c->rank,
              "%s: still waiting for %s; on a one-rank communicator only a braid_send from this process can "
              "complete it",
              c->call ? c->call : "braid", what);
  return BRAID_OK;
}

static void self_destroy(braid_comm *c, double timeout_s) {
  (void)timeout_s;
  self_state *s = state(c);
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

static braid_status self_barrier(braid_comm *c) {
  (void)c; /* the core completed this rank's operations first */
  return BRAID_OK;
}

const braid__backend braid__self_backend = {
    .name = "self",
    .caps = BRAID__CAP_SINGLE_RANK,
    .dtypes = BRAID__ALL_DTYPES,
    .req_size = sizeof(braid__req),
    .umsg_size = sizeof(self_umsg),
    .init = self_init,
    .split = self_split,
    .destroy = self_destroy,
    .abort = self_abort,
    .isend = self_isend,
    .irecv = self_irecv,
    .progress = self_progress,
    .take = self_take,
    .release_umsg = self_release_umsg,
    .arm = self_arm,
    .sleep = self_sleep,
    .disarm = self_disarm,
    .check_peers = self_check_peers,
    .barrier = self_barrier,
    .all_reduce = self_all_reduce,
    .broadcast = self_broadcast,
    .all_gather = self_all_gather,
    .reduce_scatter = self_reduce_scatter,
    .stream = NULL,
};
