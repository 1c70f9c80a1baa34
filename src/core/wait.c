/* The wait/progress engine (see wait.h), the registry of live communicators
   that lets a rank blocked in one communicator serve the others, and the
   spread of a fatal failure to every rank. */
#include "core/wait.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap.h"
#include "core/tag.h"
#include "core/trace.h"
#include "os/sched.h"
#include "os/time.h"

#define LIVE_CHECK_S 0.1   /* liveness and the cross-rank check, while a wait is slow */
#define STORE_CHECK_S 0.5  /* failures published in the store */
#define STORE_REPLY_S 0.5  /* bound of one store look-up from inside a wait */
#define FAIL_PUBLISH_S 2.0 /* bound of the failure's store write: a store out of reach must not hold the error */
#define MAX_SLEEP_S 0.1    /* a sleeper wakes at least this often to run the checks */
#define LEND_S 0.01 /* how long a waiting braid_sync waits for a thread it lets in to take the lock */
#define POSITION_AFTER_S 1.0 /* a collective's wait this long publishes this rank's position */
#define POSITION_GAP_MAX_S 2.0 /* ... and compares it with others' at intervals doubling up to this */
#define CROWD_SAMPLE_S 0.05  /* a waiting thread reads its run delay at most this often */
#define CROWDED_ON 0.25      /* ... and spinning stops when it waited for a CPU this share of the time */
#define CROWDED_OFF 0.05     /* ... and resumes below this share (the yields keep it above while crowded) */

/* ---------------------------------------------------------------- crowded CPUs */

atomic_int braid__crowded;

int braid__crowded_next(int crowded, double share) {
  if (share >= CROWDED_ON) return 1;
  if (share < CROWDED_OFF) return 0;
  return crowded;
}

static _Thread_local double crowd_at;      /* this thread's last sample (0: none yet) */
static _Thread_local uint64_t crowd_delay; /* its run delay then, ns */

/* With more busy processes than CPUs, a spinning rank holds a CPU that the
   rank it waits for needs: the scheduler's time slices (milliseconds) then
   set the pace of every message. Ranks cannot see each other's hosts'
   loads, but each thread can see its own run delay. */
static void crowd_sample(double now) {
  if (now - crowd_at < CROWD_SAMPLE_S) return;
  uint64_t d;
  if (braid__run_delay_ns(&d)) {
    crowd_at = INFINITY; /* the kernel does not say: never sample again in this thread */
    return;
  }
  if (crowd_at > 0 && d >= crowd_delay) {
    int was = atomic_load_explicit(&braid__crowded, memory_order_relaxed);
    int next = braid__crowded_next(was, (double)(d - crowd_delay) * 1e-9 / (now - crowd_at));
    if (next != was) atomic_store_explicit(&braid__crowded, next, memory_order_relaxed);
  }
  crowd_at = now;
  crowd_delay = d;
}

/* ---------------------------------------------------------------- live communicators */

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static braid_comm *live_head;
static atomic_int live_count;

void braid__live_add(braid_comm *c) {
  pthread_mutex_lock(&live_lock);
  c->live_next = live_head;
  live_head = c;
  atomic_fetch_add(&live_count, 1);
  pthread_mutex_unlock(&live_lock);
}

void braid__live_remove(braid_comm *c) {
  pthread_mutex_lock(&live_lock);
  for (braid_comm **p = &live_head; *p; p = &(*p)->live_next)
    if (*p == c) {
      *p = c->live_next;
      atomic_fetch_sub(&live_count, 1);
      break;
    }
  pthread_mutex_unlock(&live_lock);
}

int braid__live_contains(const braid_comm *c) {
  int found = 0;
  pthread_mutex_lock(&live_lock);
  for (braid_comm *o = live_head; o && !found; o = o->live_next) found = o == c;
  pthread_mutex_unlock(&live_lock);
  return found;
}

int braid__progress_others(braid_comm *c) {
  int busy = 0;
  pthread_mutex_lock(&live_lock);
  for (braid_comm *o = live_head; o; o = o->live_next) {
    if (o == c) continue;
    /* A communicator in use by a call (this thread's or another's) makes
       its own progress; trylock also keeps the lock order free of cycles. */
    if (pthread_mutex_trylock(&o->lock) != 0) continue;
    if (o->npending && o->be && !atomic_load(&o->failed)) {
      braid_status st = o->ops->progress(o);
      if (st == BRAID_OK && o->npending) busy++;
    }
    pthread_mutex_unlock(&o->lock);
  }
  pthread_mutex_unlock(&live_lock);
  return busy;
}

/* ---------------------------------------------------------------- failure spread */

/* Store value of a published failure: "<status> <origin rank> <sentence>". */
#define FAIL_KEY "fail"

static const char *reason_of(int st) {
  switch (st) {
  case BRAID_ERR_TIMEOUT: return "timeout";
  case BRAID_ERR_PEER_LOST: return "peer lost";
  case BRAID_ERR_MISMATCH: return "mismatch";
  case BRAID_ERR_ABORTED: return "aborted";
  default: return braid_status_string((braid_status)st);
  }
}

void braid__publish_failure(braid_comm *c) {
  int st = atomic_load(&c->failed);
  if (!st || c->fail_published) return;
  c->fail_published = 1;
  braid__trace_end(&c->trace_cur, (braid_status)st); /* the call in progress failed */
  braid__trace_dump(c, reason_of(st));
  char text[BRAID_ERRLEN];
  pthread_mutex_lock(&c->err_lock);
  snprintf(text, sizeof text, "%s", c->fatal_text);
  pthread_mutex_unlock(&c->err_lock);
  /* The store first: a rank that hears of the failure through the
     backend's channel may leave at once, and a third rank that then finds
     it gone looks in the store for why. (A failure that came from another
     rank is already on its way.) */
  if (c->boot) {
    char val[BRAID_ERRLEN + 32];
    int n = snprintf(val, sizeof val, "%d %d %s", st, c->rank, text);
    braid__store *store = c->boot->store;
    double op = store ? braid__store_op_timeout(store) : 0;
    if (store) braid__store_set_op_timeout(store, FAIL_PUBLISH_S);
    if (n > 0 && braid__boot_set(c->boot, FAIL_KEY, val, strlen(val)) != BRAID_OK)
      BLOG_DEBUG(BRAID_SUB_COLL, c->rank, "could not publish the failure in the store");
    if (store) braid__store_set_op_timeout(store, op);
  }
  if (c->ops->publish_failure && c->be) c->ops->publish_failure(c, (braid_status)st, text);
}

/* What survivors are told: a collective mismatch stays a mismatch (the same
   sentence on every rank); anything else is another rank's failure. */
static braid_status relay(braid_comm *c, braid_status st, int origin, const char *text) {
  char msg[BRAID_ERRLEN];
  const char *call = c->call ? c->call : "braid";
  c->fail_published = 1; /* the origin told everyone */
  braid_status out;
  if (st == BRAID_ERR_MISMATCH) {
    out = braid__fail_relayed(c, st, text);
    braid__trace_end(&c->trace_cur, out);
    braid__trace_dump(c, "mismatch");
    return out;
  }
  if (st == BRAID_ERR_ABORTED)
    snprintf(msg, sizeof msg, "%s: rank %d aborted the communicator", call, origin);
  else if (st == BRAID_ERR_PEER_LOST)
    snprintf(msg, sizeof msg, "%s: rank %d reported: %s", call, origin, text);
  else if (st == BRAID_ERR_TIMEOUT)
    snprintf(msg, sizeof msg, "%s: rank %d failed (timeout): %s", call, origin, text);
  else
    snprintf(msg, sizeof msg, "%s: rank %d failed (%s): %s", call, origin, braid_status_string(st), text);
  out = braid__fail_relayed(c, BRAID_ERR_PEER_LOST, msg);
  braid__trace_end(&c->trace_cur, out);
  braid__trace_dump(c, "peer failed");
  return out;
}

int braid__poll_remote_failure(braid_comm *c, int use_store) {
  if (atomic_load(&c->failed)) return 1;
  char text[BRAID_ERRLEN];
  braid_status st;
  int origin;
  if (c->ops->remote_failure && c->be && c->ops->remote_failure(c, &st, &origin, text, sizeof text)) {
    relay(c, st, braid__label(c, origin), text);
    return 1;
  }
  if (!use_store) return 0;
  void *v = NULL;
  size_t len = 0;
  if (!c->boot || braid__boot_peek(c->boot, FAIL_KEY, &v, &len, STORE_REPLY_S) != 1) {
    /* A part of a composed communicator: the whole's failure, which its
       origin published where this part's ranks may not hear it (the origin
       is on another node, or heard it from another rank itself). */
    braid_comm *o = c->owner;
    if (!o || !braid__poll_remote_failure(o, 1)) return 0;
    char otext[BRAID_ERRLEN];
    pthread_mutex_lock(&o->err_lock);
    snprintf(otext, sizeof otext, "%s", o->fatal_text);
    pthread_mutex_unlock(&o->err_lock);
    braid__fail_as(c, (braid_status)atomic_load(&o->failed), otext);
    c->fail_published = 1;
    return 1;
  }
  char buf[BRAID_ERRLEN + 32];
  snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), (const char *)v);
  free(v);
  int code = 0, off = 0;
  origin = -1;
  if (sscanf(buf, "%d %d %n", &code, &origin, &off) < 2 || code <= 0 || origin == c->rank) return 0;
  relay(c, (braid_status)code, braid__label(c, origin), buf + off);
  return 1;
}

/* ---------------------------------------------------------------- describing waits */

int braid__pending_peer(braid_comm *c) {
  for (braid__req *r = c->pending; r; r = r->pend_next)
    if (!r->done) return r->peer;
  return -1;
}

void braid__describe_pending(braid_comm *c, char *out, size_t len) {
  if (c->desc.kind != BRAID__COLL_NONE) {
    char d[160];
    braid__desc_format(&c->desc, d, sizeof d);
    snprintf(out, len, "its part of %s (collective #%llu)", d, (unsigned long long)c->seq);
    return;
  }
  int nrecv = 0, nsend = 0;
  braid__req *first = NULL;
  for (braid__req *r = c->pending; r; r = r->pend_next) {
    if (r->done) continue;
    if (!first) first = r;
    if (r->is_send) nsend++;
    else nrecv++;
  }
  if (!first)
    snprintf(out, len, "pending operations");
  else if (!first->is_send)
    snprintf(out, len, "%d pending receive(s) (first: tag %u, %zu bytes)", nrecv, (unsigned)first->h.tag,
             first->bytes);
  else
    snprintf(out, len, "it to receive the message with tag %u (%zu bytes) of %d pending operation(s)",
             (unsigned)first->h.tag, first->bytes, nrecv + nsend);
}

/* ---------------------------------------------------------------- the engine */


#define WHAT (what ? what : (braid__describe_pending(c, desc, sizeof desc), desc))

static braid_status fail_published(braid_comm *c, braid_status st) {
  braid__publish_failure(c);
  return st;
}

/* The cross-rank call check while this rank waits inside a collective:
   another rank's descriptor of this collective, learned from the backend
   or from an early message of it, that differs from this rank's. */
static braid_status cross_check(braid_comm *c, int peer) {
  if (!c->check || c->desc.kind == BRAID__COLL_NONE) return BRAID_OK;
  braid__desc d;
  if (c->ops->peer_desc) {
    for (int q = peer >= 0 ? peer : 0; q < (peer >= 0 ? peer + 1 : c->size); q++) {
      if (q == c->rank) continue;
      if (c->ops->peer_desc(c, q, c->seq, &d) && !braid__desc_equal(&d, &c->desc))
        return braid__coll_mismatch(c, q, &d);
    }
  }
  int src;
  if (braid__match_find_foreign(c, c->seq, &c->desc, &src, &d)) return braid__coll_mismatch(c, src, &d);
  /* A message of an earlier collective that arrived after this one began
     (its sender was in another call and went on). */
  braid_status st = braid__coll_check_stale(c, 0, 1);
  if (st) return st;
  braid__msg_hdr h;
  uint64_t at;
  /* (the stale check just above let the parts take what arrived) */
  if (c->ops->find_unexpected && c->ops->find_unexpected(c, c->seq, 0, &c->desc, 0, &src, &h, &at))
    return braid__coll_mismatch(c, src, &h.desc);
  /* A part of a composed communicator, waiting inside the whole's call:
     a message of the whole's earlier collective that nobody took. The
     whole fails, and with it its parts, this one included. */
  braid_comm *o = c->owner;
  if (o && o->check && o->desc.kind != BRAID__COLL_NONE && (st = braid__coll_check_stale(o, 0, 1))) {
    braid__publish_failure(o);
    return atomic_load(&c->failed) ? (braid_status)atomic_load(&c->failed) : st;
  }
  return BRAID_OK;
}

/* Where this rank's position in the collectives goes, for ranks that
   cannot read each other's call logs: the backend's channel, else the
   store ("pos/<rank>": the collective it waits in and that call's
   descriptor). */
static int positions_known(const braid_comm *c) {
  return !c->ops->peer_desc && (c->ops->publish_position || c->boot);
}

static void publish_position(braid_comm *c) {
  if (c->ops->publish_position) {
    c->ops->publish_position(c);
    return;
  }
  char key[32], val[96];
  const braid__desc *d = &c->desc;
  snprintf(key, sizeof key, "pos/%d", c->rank);
  snprintf(val, sizeof val, "%llu %u %llu %u %u %ld", (unsigned long long)c->seq, (unsigned)d->kind,
           (unsigned long long)d->count, (unsigned)d->dt, (unsigned)d->flags, (long)d->arg);
  braid__boot_set(c->boot, key, val, strlen(val));
}

/* The position rank q published: 1 with the collective it waits in (*at)
   and, when has_desc is set, that call's descriptor; 0 when it published
   none; -1 when the store does not answer. */
static int peer_position(braid_comm *c, int q, uint64_t *at, braid__desc *d, int *has_desc) {
  *at = 0;
  *has_desc = 0;
  if (c->ops->peer_position) {
    int r = c->ops->peer_position(c, q, at, d);
    *has_desc = r == 1;
    return r;
  }
  char key[32];
  void *v = NULL;
  size_t len = 0;
  snprintf(key, sizeof key, "pos/%d", q);
  int r = braid__boot_peek(c->boot, key, &v, &len, STORE_REPLY_S);
  if (r == 1) {
    char buf[96];
    unsigned long long seq = 0, count = 0;
    unsigned kind = 0, dt = 0, flags = 0;
    long arg = 0;
    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), (const char *)v);
    int got = sscanf(buf, "%llu %u %llu %u %u %ld", &seq, &kind, &count, &dt, &flags, &arg);
    *at = seq;
    if (got == 6) {
      *d = braid__desc_make((braid__coll_kind)kind, (size_t)count, (braid_dtype)dt, (int32_t)arg);
      d->flags = (uint16_t)flags;
      *has_desc = 1;
    }
  }
  free(v);
  return r;
}

/* Whether rank q has entered this rank's current collective: from the
   backend's call log, else from the position q published; -1 when
   unknown. *at: the collective q is known to be in (0: none). */
static int entered(braid_comm *c, int q, uint64_t *at) {
  braid__desc d;
  int has;
  *at = 0;
  if (c->ops->peer_desc) return c->ops->peer_desc(c, q, c->seq, &d);
  if (!positions_known(c)) return -1;
  if (peer_position(c, q, at, &d, &has) < 0) return -1;
  return *at >= c->seq;
}

/* Whether q waits in this collective with another call. */
static braid_status position_differs(braid_comm *c, int q) {
  uint64_t at;
  braid__desc d;
  int has;
  if (peer_position(c, q, &at, &d, &has) == 1 && has && at == c->seq && !braid__desc_equal(&d, &c->desc))
    return braid__coll_mismatch(c, q, &d);
  return BRAID_OK;
}

/* The check without call logs, once this rank's wait has published its
   position: another rank waits in this collective with another call.
   Finds what no message shows: ranks waiting for each other's messages
   because they disagree on a root, or (mpi) take different routes. */
static braid_status position_check(braid_comm *c, braid__waiter *w, int peer, double now) {
  if (!c->check || !w->pos_published || c->size < 2 || now < w->probe_next) return BRAID_OK;
  braid_status st;
  if (c->ops->peer_position) { /* read locally: every rank, every check */
    for (int q = 0; q < c->size; q++)
      if (q != c->rank && (st = position_differs(c, q))) return st;
    return BRAID_OK;
  }
  /* A store round trip each: the awaited rank, else one rank per check in
     turn; a rank that waits long for a slow one asks ever more rarely
     (many ranks may be waiting). */
  w->probe_gap = w->probe_gap ? w->probe_gap * 2 : LIVE_CHECK_S;
  if (w->probe_gap > POSITION_GAP_MAX_S) w->probe_gap = POSITION_GAP_MAX_S;
  w->probe_next = now + w->probe_gap;
  int q = peer;
  if (q < 0 || q == c->rank) {
    q = (int)(w->probe++ % (unsigned)c->size);
    if (q == c->rank) q = (q + 1) % c->size;
  }
  return position_differs(c, q);
}

/* "; not in collective #42: ranks 2, 5 (at #41)" for a timeout inside a
   collective, naming who the others wait for. */
static void describe_absent(braid_comm *c, char *out, size_t len) {
  out[0] = 0;
  if (c->desc.kind == BRAID__COLL_NONE) return;
  size_t o = 0;
  int k = 0;
  for (int q = 0; q < c->size && o + 48 < len; q++) {
    uint64_t at;
    if (q == c->rank || entered(c, q, &at) != 0) continue;
    int lq = braid__label(c, q);
    int n = k++ == 0 ? snprintf(out + o, len - o, "; not in collective #%llu: rank %d", (unsigned long long)c->seq, lq)
                     : snprintf(out + o, len - o, ", %d", lq);
    if (n > 0) o += (size_t)n;
    if (at && o + 32 < len) {
      n = snprintf(out + o, len - o, " (waiting in #%llu)", (unsigned long long)at);
      if (n > 0) o += (size_t)n;
    }
  }
}

static braid_status checks(braid_comm *c, braid__waiter *w, int peer, const char *what, double now) {
  char desc[192];
  braid_status st;
  if (braid__aborted(c)) {
    if (peer < 0) /* a backend's collective that cannot tell which rank it waits for */
      st = braid__fail(c, BRAID_ERR_ABORTED, "aborted while waiting for %s", WHAT);
    else
      st = braid__fail(c, BRAID_ERR_ABORTED, "aborted while waiting for rank %d: %s", braid__label(c, peer), WHAT);
    return fail_published(c, st);
  }
  int failed = atomic_load(&c->failed);
  if (failed) return (braid_status)failed;
  if (braid__poll_remote_failure(c, now >= w->next_remote)) return (braid_status)atomic_load(&c->failed);
  if (now >= w->next_remote) w->next_remote = now + STORE_CHECK_S;
  if (now >= w->next_live) {
    w->next_live = now + LIVE_CHECK_S;
    /* A wait this long is worth a store round trip: ranks whose backends
       cannot read each other's call logs learn where this one is. */
    if (!w->pos_published && now - w->start > POSITION_AFTER_S && c->desc.kind != BRAID__COLL_NONE &&
        positions_known(c)) {
      w->pos_published = 1;
      publish_position(c);
    }
    if ((st = c->ops->check_peers(c, peer, WHAT))) return fail_published(c, st);
    if ((st = cross_check(c, peer))) return fail_published(c, st);
    if ((st = position_check(c, w, peer, now))) return fail_published(c, st);
  }
  if (now >= w->deadline) {
    char who[256];
    describe_absent(c, who, sizeof who);
    if (peer < 0) /* a backend's collective that cannot tell which rank it waits for */
      st = braid__fail(c, BRAID_ERR_TIMEOUT, "timed out after %g s waiting for %s%s", c->timeout_s, WHAT, who);
    else
      st = braid__fail(c, BRAID_ERR_TIMEOUT, "timed out after %g s waiting for rank %d: %s%s", c->timeout_s,
                       braid__label(c, peer), WHAT, who);
    return fail_published(c, st);
  }
  return BRAID_OK;
}

#undef WHAT

/* A braid_sync that waits lets calls of other threads in (one may send
   what the awaited peer needs first, as under MPI_THREAD_MULTIPLE): it lets
   go of the lock until one of them has taken it, and takes it back after
   them. A collective never lends: another thread's calls would interleave
   with its protocol. */
static void lend(braid_comm *c, braid__waiter *w) {
  if (w->armed) {
    c->ops->disarm(c);
    w->armed = 0;
  }
  const int was = atomic_load_explicit(&c->entering, memory_order_relaxed);
  const braid__call_fields f = braid__lend_begin(c);
  pthread_mutex_unlock(&c->lock);
  const double until = braid__now() + LEND_S;
  while (atomic_load_explicit(&c->entering, memory_order_relaxed) >= was && braid__now() < until) sched_yield();
  pthread_mutex_lock(&c->lock);
  braid__lend_end(c, &f);
}

braid_status braid__wait_slow(braid_comm *c, braid__waiter *w, int peer, const char *what) {
  if (c->lendable && atomic_load_explicit(&c->entering, memory_order_relaxed)) lend(c, w);
  double now = braid__now();
  if (w->start == 0) {
    w->start = now;
    braid__trace_waiting(c, now);
    w->deadline = braid__deadline(c->timeout_s);
    w->next_live = now + LIVE_CHECK_S;
    w->next_remote = now + STORE_CHECK_S;
    w->moved = c->moved;
  } else if (c->moved != w->moved) {
    /* Data moved: not a stall. Back to spinning; the deadline restarts. */
    w->moved = c->moved;
    w->deadline = braid__deadline(c->timeout_s);
    w->spins = 0;
    w->start = now;
  }
  braid__trace_poll_signal(c);
  braid_status st = checks(c, w, peer, what, now);
  if (!st && c->npending) {
    st = c->ops->progress(c);
    if (st) fail_published(c, st);
  }
  if (st) {
    braid__wait_end(c, w);
    return st;
  }
  crowd_sample(now);
  unsigned spin = atomic_load_explicit(&braid__crowded, memory_order_relaxed) ? 0 : c->spin_limit;
  if (c->spin_now != spin) c->spin_now = spin;
  if (w->spins < c->spin_now) return BRAID_OK;
  /* Another communicator's transfer may be what the awaited peer waits
     for; while one is pending this rank keeps polling instead of sleeping. */
  int others = atomic_load_explicit(&live_count, memory_order_relaxed) > 1 ? braid__progress_others(c) : 0;
  if (c->progress_siblings) others += c->progress_siblings(c);
  if (others || now - w->start < c->yield_s) {
    sched_yield();
    return BRAID_OK;
  }
  if (!w->armed) {
    /* Announce, then let the caller re-check its condition before sleeping:
       a waker that missed the announcement posted before the re-check. */
    if (!c->ops->arm(c)) {
      sched_yield();
      return BRAID_OK;
    }
    w->armed = 1;
    return BRAID_OK;
  }
  double slice = MAX_SLEEP_S;
  if (w->deadline - now < slice) slice = w->deadline - now;
  if (w->next_live - now < slice) slice = w->next_live - now;
  if (slice < 0) slice = 0;
  c->ops->sleep(c, slice);
  w->armed = 0;
  return BRAID_OK;
}

static int reqs_done(braid__req *const *reqs, int n, int *peer) {
  for (int i = 0; i < n; i++)
    if (reqs[i] && !reqs[i]->done) {
      *peer = reqs[i]->peer;
      return 0;
    }
  return 1;
}

braid_status braid__wait_reqs(braid_comm *c, braid__req *const *reqs, int n) {
  int failed = atomic_load(&c->failed);
  if (failed) return (braid_status)failed;
  int peer = -1;
  if (reqs_done(reqs, n, &peer)) return BRAID_OK;
  braid_status st = c->ops->progress(c);
  if (st) return fail_published(c, st);
  braid__waiter w;
  braid__wait_begin(&w);
  while (!reqs_done(reqs, n, &peer)) {
    if ((st = braid__wait_poll(c, &w, peer, NULL))) return st;
    if ((st = c->ops->progress(c))) {
      braid__wait_end(c, &w);
      return fail_published(c, st);
    }
  }
  braid__wait_end(c, &w);
  return BRAID_OK;
}

/* Whether what braid__wait_idle waits for is still in flight (every
   pending operation, or the user operations numbered below before - 1),
   and a peer it waits for. */
static int busy(braid_comm *c, uint64_t before, int *peer) {
  if (!before) {
    if (!c->npending) return 0;
    *peer = braid__pending_peer(c);
    return 1;
  }
  for (const braid__req *r = c->pending; r; r = r->pend_next)
    if (!r->done && r->ord + 1 < before) {
      *peer = r->peer;
      return 1;
    }
  return 0;
}

braid_status braid__wait_idle(braid_comm *c, uint64_t before) {
  int failed = atomic_load(&c->failed), peer = -1;
  if (failed) return (braid_status)failed;
  braid_status st = c->npending ? c->ops->progress(c) : BRAID_OK;
  if (st) return fail_published(c, st);
  if (!busy(c, before, &peer)) return BRAID_OK;
  braid__waiter w;
  braid__wait_begin(&w);
  while (busy(c, before, &peer)) {
    if ((st = braid__wait_poll(c, &w, peer, NULL))) return st;
    if ((st = c->ops->progress(c))) {
      braid__wait_end(c, &w);
      return fail_published(c, st);
    }
  }
  braid__wait_end(c, &w);
  return BRAID_OK;
}
