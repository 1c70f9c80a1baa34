#include "core/subcomm.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap.h"
#include "core/trace.h"
#include "core/wait.h"
#include "os/time.h"

uint64_t braid__child_id(uint64_t parent, uint32_t ordinal, uint32_t color) {
  uint64_t x = parent * 0x9E3779B97F4A7C15ull ^ ((uint64_t)ordinal << 32 | color);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return (x ^ (x >> 31)) | 1;
}

static int has_native(const braid__backend *ops, int kind) {
  switch (kind) {
  case BRAID__COLL_ALL_REDUCE: return ops->all_reduce != NULL;
  case BRAID__COLL_BROADCAST: return ops->broadcast != NULL;
  case BRAID__COLL_ALL_GATHER: return ops->all_gather != NULL;
  case BRAID__COLL_REDUCE_SCATTER: return ops->reduce_scatter != NULL;
  case BRAID__COLL_BARRIER: return ops->barrier != NULL;
  default: return 0;
  }
}

braid_status braid__comm_start(braid_comm *c) {
  for (int k = 1; k < BRAID__COLL_NKINDS; k++)
  {
    if (c->algo[k] == 1 /* BRAID__ALGO_NATIVE */ && !has_native(c->ops, k))
      return braid__fail(c, BRAID_ERR_INVALID_ARG, "BRAID_ALGO asks for a native %s but backend %s has none",
                         braid__coll_short_name(k), c->ops->name);
    /* The generic algorithms reduce and copy on the host. */
    if (c->algo[k] > 1 && (c->ops->caps & BRAID__CAP_DEVICE_MEM))
      return braid__fail(c, BRAID_ERR_INVALID_ARG,
                         "BRAID_ALGO names a generic %s algorithm, but backend %s keeps buffers in device memory and "
                         "runs only its own",
                         braid__coll_short_name(k), c->ops->name);
  }
  braid__trace_init(c);
  braid__trace_install_signal();
  braid__live_add(c);
  return BRAID_OK;
}

static braid_status label(braid_comm *child, const braid_comm *parent, const int *members) {
  int *l = malloc(sizeof *l * (size_t)child->size);
  if (!l) return braid__fail(child, BRAID_ERR_NO_MEMORY, "out of memory for %d rank labels", child->size);
  for (int i = 0; i < child->size; i++) l[i] = braid__label(parent, members[i]);
  free(child->label_of);
  child->label_of = l;
  return BRAID_OK;
}

static int world_rank(const braid_comm *c, int q) { return c->world_of ? c->world_of[q] : q; }

/* The child's world ranks, and whose death fails its start: a part of a
   backend starts within its parent's start (same scope); a split child
   within a call every rank of the parent makes. */
static braid_status scope(braid_comm *child, const braid_comm *parent, const int *members, unsigned flags) {
  int n = child->size, pn = parent->size;
  child->world_of = malloc(sizeof *child->world_of * (size_t)n);
  if (!child->world_of) return braid__fail(child, BRAID_ERR_NO_MEMORY, "out of memory for %d ranks", n);
  for (int i = 0; i < n; i++) child->world_of[i] = world_rank(parent, members[i]);
  if ((flags & BRAID__SUB_LABEL) && !parent->scope) return BRAID_OK;
  int m = (flags & BRAID__SUB_LABEL) ? parent->nscope : pn;
  child->scope = malloc(sizeof *child->scope * (size_t)m);
  if (!child->scope) return braid__fail(child, BRAID_ERR_NO_MEMORY, "out of memory for %d ranks", m);
  for (int i = 0; i < m; i++) child->scope[i] = (flags & BRAID__SUB_LABEL) ? parent->scope[i] : world_rank(parent, i);
  child->nscope = m;
  return BRAID_OK;
}

braid_status braid__start_check(braid_comm *c, const char *during) {
  if (!c->boot || !c->boot->store) return BRAID_OK;
  int n = c->scope ? c->nscope : c->boot->env.world_size, self = world_rank(c, c->rank);
  int origin = -1, ost = 0;
  char why[BRAID_ERRLEN];
  if (braid__boot_start_failure(c->boot, &origin, &ost, why, sizeof why) && origin != braid__label(c, c->rank))
    return braid__start_relay(c, origin, ost, why);
  if (n <= 0) return BRAID_OK;
  if (!c->scope_pid && !(c->scope_pid = calloc((size_t)n, sizeof *c->scope_pid))) return BRAID_OK;
  /* Every rank found gone is named: a rank whose own start failed on a
     death may have ended before this one looks, and the first death is
     the one that explains the others. */
  char who[160] = "";
  size_t len = 0;
  int dead = 0;
  for (int i = 0; i < n; i++) {
    int w = c->scope ? c->scope[i] : i;
    if (w == self) continue;
    if (!c->scope_pid[i]) c->scope_pid[i] = braid__boot_world_pid(c->boot, w);
    long pid = c->scope_pid[i];
    if (!(pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH)) continue;
    if (dead < 4 && len < sizeof who) {
      int k = snprintf(who + len, sizeof who - len, "%srank %d (pid %ld)", dead ? ", " : "", i, pid);
      if (k > 0) len += (size_t)k;
    }
    dead++;
  }
  if (!dead) return BRAID_OK;
  return braid__fail(c, BRAID_ERR_PEER_LOST, "%s%s %s during %s", who, dead > 4 ? " and others" : "",
                     dead > 1 ? "are gone (died or ended)" : "died", during);
}

size_t braid__start_sentence(braid_comm *c, char *out, size_t len) {
  char text[BRAID_ERRLEN];
  pthread_mutex_lock(&c->err_lock);
  snprintf(text, sizeof text, "%s", c->last_error);
  pthread_mutex_unlock(&c->err_lock);
  /* The sentence without "<call>: " and " (rank R)": the reader adds its own. */
  char *t = text;
  size_t k = c->call ? strlen(c->call) : 0;
  if (k && !strncmp(t, c->call, k) && t[k] == ':' && t[k + 1] == ' ') t += k + 2;
  t[braid__rankless_len(c, t)] = 0;
  int w = snprintf(out, len, "%s", t);
  return w > 0 ? (size_t)w : 0;
}

braid_status braid__start_relay(braid_comm *c, int origin, int st, const char *why) {
  c->start_relayed = 1;
  return braid__fail(c, braid__boot_relayed_status(st), "rank %d could not start: %s", origin, why);
}

void braid__start_failed(braid_comm *c, braid_status st) {
  /* Timeouts and lost peers are the others' to see for themselves. */
  if (!c->boot || !c->boot->store || c->start_relayed || st == BRAID_ERR_TIMEOUT || st == BRAID_ERR_PEER_LOST)
    return;
  char text[BRAID_ERRLEN];
  braid__start_sentence(c, text, sizeof text);
  braid__boot_say_start_failed(c->boot, braid__label(c, c->rank), (int)st, text[0] ? text : braid_status_string(st));
}

braid_status braid__start_get(braid_comm *c, const char *key, void **val, size_t *len, double deadline,
                              const char *what, const char *during) {
  braid__store *store = c->boot->store;
  braid_status st;
  while ((st = braid__store_get(store, key, val, len, fmin(deadline, braid__now() + 0.1))) == BRAID_ERR_TIMEOUT &&
         braid__now() < deadline) {
    braid_status dead = braid__start_check(c, during);
    if (dead) return dead;
  }
  if (st) return braid__fail(c, BRAID_ERR_BOOTSTRAP, "could not learn %s: %s", what, braid__store_error(store));
  return BRAID_OK;
}

braid_status braid__comm_sub(braid_comm *parent, const braid__backend *ops, const int *members, int n, int newrank,
                             uint32_t ordinal, uint32_t color, unsigned flags, braid_comm **out) {
  *out = NULL;
  if ((ops->caps & BRAID__CAP_SINGLE_RANK) && n > 1)
    return braid__fail(parent, BRAID_ERR_UNSUPPORTED, "backend %s cannot hold %d ranks", ops->name, n);
  braid_comm *child = braid__comm_alloc();
  if (!child) return braid__fail(parent, BRAID_ERR_NO_MEMORY, "out of memory for the new communicator");
  child->ops = ops;
  child->rank = newrank;
  child->size = n;
  child->id = braid__child_id(parent->id, ordinal, color);
  child->timeout_s = parent->timeout_s;
  child->destroy_timeout_s = parent->destroy_timeout_s;
  child->check = parent->check;
  for (int k = 0; k < BRAID__COLL_NKINDS; k++) {
    child->algo[k] = parent->algo[k];
    /* A part of a composite backend (hier's node and rail) asked for the
       composite's own "native" call, which the part's backend may lack:
       there the part picks its own algorithm. */
    if ((flags & BRAID__SUB_LABEL) && child->algo[k] == 1 /* BRAID__ALGO_NATIVE */ && !has_native(ops, k))
      child->algo[k] = 0;
  }
  child->call = parent->call;
  braid_status st = (flags & BRAID__SUB_LABEL) ? label(child, parent, members) : BRAID_OK;
  if (!st) st = scope(child, parent, members, flags);
  if (!st && parent->boot) {
    char err[BRAID_ERRLEN] = "";
    st = braid__bootstrap_split(parent->boot, newrank, n, child->id, &child->boot, err, sizeof err);
    if (st) braid__fail(child, st, "%s", err);
  }
  if (!st) st = (ops == parent->ops && ops->split) ? ops->split(parent, child, members, n) : ops->init(child);
  if (!st) st = braid__comm_start(child);
  if (st) {
    braid__start_failed(child, st);
    if (!atomic_load(&parent->failed) && braid__status_is_fatal(st)) {
      /* The parent fails with it (the other ranks went on with their
         children): the child's cause, not just the status, is what every
         rank is told. */
      const char *t = atomic_load(&child->failed) ? child->fatal_text : "";
      size_t k = parent->call ? strlen(parent->call) : 0;
      if (k && !strncmp(t, parent->call, k) && t[k] == ':' && t[k + 1] == ' ') t += k + 2;
      braid__fail(parent, st, "the new communicator could not start: %s", t[0] ? t : braid_status_string(st));
    } else if (!atomic_load(&parent->failed) && child->last_error[0]) {
      /* The child's sentence already names the call and this rank. */
      pthread_mutex_lock(&parent->err_lock);
      snprintf(parent->last_error, sizeof parent->last_error, "%s", child->last_error);
      pthread_mutex_unlock(&parent->err_lock);
      braid__set_thread_error(child->last_error);
    }
    if (child->be) child->ops->destroy(child, 0);
    child->be = NULL;
    braid__bootstrap_free(child->boot, 0);
    braid__comm_free(child);
    return st;
  }
  child->call = NULL;
  *out = child;
  return BRAID_OK;
}

/* Bounded best effort: progress until nothing is pending or time is up. */
static void drain(braid_comm *c, double timeout_s) {
  double deadline = braid__now() + timeout_s;
  while (c->npending && !atomic_load(&c->failed) && !braid__aborted(c) && braid__now() < deadline) {
    if (c->ops->progress(c)) break;
    if (c->npending) sched_yield();
  }
  int ns = 0, nr = 0, nu = (int)c->match.nunexp;
  for (braid__req *r = c->pending; r; r = r->pend_next)
    if (!r->done) {
      if (r->is_send) ns++;
      else nr++;
    }
  if (ns || nr)
    BLOG_WARN(BRAID_SUB_P2P, c->rank,
              "braid_destroy: abandoned %d unfinished send(s) and %d unfinished receive(s) after waiting %g s", ns, nr,
              timeout_s);
  if (nu) BLOG_WARN(BRAID_SUB_P2P, c->rank, "braid_destroy: dropped %d message(s) that were never received", nu);
}

void braid__comm_release(braid_comm *c, double timeout_s) {
  pthread_mutex_lock(&c->lock);
  braid__comm_release_locked(c, timeout_s);
}

void braid__comm_release_locked(braid_comm *c, double timeout_s) {
  c->call = "braid_destroy";
  if (timeout_s < 0) timeout_s = c->destroy_timeout_s;
  if (atomic_load(&c->failed)) timeout_s = 0;
  braid__live_remove(c);
  /* A rank that made no call since another rank failed still leaves its
     flight recorder behind (braid-trace wants every rank's). The store is
     asked too: a failing rank writes there before it tells its peers, and
     its message through the backend may still be on its way. */
  if (c->be && !atomic_load(&c->failed)) braid__poll_remote_failure(c, c->size > 1);
  if (c->be) {
    drain(c, timeout_s);
    /* Completed user operations go now; the rest belong to the backend or
       the matcher and are dropped by them below. */
    while (c->pending) {
      braid__req *r = c->pending;
      c->pending = r->pend_next;
      if (r->done) braid__req_release(c, r);
    }
    c->pending_tail = &c->pending;
    braid__req *r;
    while ((r = braid__match_pop_posted(c))) braid__req_drop(c, r);
    braid__match_drop_unexpected(c);
    c->releasing = 1;
    c->ops->destroy(c, timeout_s);
    c->be = NULL;
    while (c->orphans) {
      r = c->orphans;
      c->orphans = r->pend_next;
      braid__req_release(c, r);
    }
  }
  braid__bootstrap_free(c->boot, timeout_s);
  c->boot = NULL;
  c->call = NULL;
  pthread_mutex_unlock(&c->lock);
  braid__comm_free(c);
}
