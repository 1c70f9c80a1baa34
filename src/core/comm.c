/* Errors of a communicator (the sentence every call leaves, sticky fatal
   failures) and the bare communicator object. */
#include "core/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/log.h"
#include "core/params.h"
#include "core/tag.h"
#include "core/trace.h"

static _Thread_local char tls_error[BRAID_ERRLEN];
static _Thread_local char tls_copy[BRAID_ERRLEN];

void braid__set_thread_error(const char *msg) { snprintf(tls_error, sizeof tls_error, "%s", msg); }

/* Records "<text> (rank R)" as c's last error; a fatal status (or `force`)
   fails c, keeping the first cause in fatal_error / fatal_text. */
static braid_status record(braid_comm *c, braid_status st, const char *text, int force) {
  char msg[BRAID_ERRLEN];
  snprintf(msg, sizeof msg, "%s (rank %d)", text, braid__label(c, c->rank));
  int fatal = force || braid__status_is_fatal(st);
  int expected = 0;
  pthread_mutex_lock(&c->err_lock);
  snprintf(c->last_error, sizeof c->last_error, "%s", msg);
  if (fatal && atomic_compare_exchange_strong(&c->failed, &expected, (int)st)) {
    snprintf(c->fatal_error, sizeof c->fatal_error, "%s", msg);
    snprintf(c->fatal_text, sizeof c->fatal_text, "%s", text);
  }
  pthread_mutex_unlock(&c->err_lock);
  BRAID_LOG(fatal ? BRAID_LOG_ERROR : BRAID_LOG_INFO, BRAID_SUB_COLL, c->rank, "%s [%s]", msg,
            braid_status_string(st));
  braid__set_thread_error(msg);
  return st;
}

/* "<call>: <text>" on c; call NULL: the call c is in. */
static braid_status vfail_in(braid_comm *c, const char *call, braid_status st, int force, const char *fmt,
                             va_list ap) {
  char text[BRAID_ERRLEN];
  vsnprintf(text, sizeof text, fmt, ap);
  if (!c) {
    BLOG_INFO(BRAID_SUB_INIT, -1, "%s [%s]", text, braid_status_string(st));
    braid__set_thread_error(text);
    return st;
  }
  if (!call) call = c->call ? c->call : "braid";
  char full[BRAID_ERRLEN];
  snprintf(full, sizeof full, "%s: %s", call, text);
  return record(c, st, full, force);
}

static braid_status vfail(braid_comm *c, braid_status st, int force, const char *fmt, va_list ap) {
  return vfail_in(c, NULL, st, force, fmt, ap);
}

braid_status braid__fail_in(braid_comm *c, const char *call, braid_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail_in(c, call, st, 0, fmt, ap);
  va_end(ap);
  return st;
}

braid_status braid__vfail(braid_comm *c, braid_status st, const char *fmt, va_list ap) {
  return vfail(c, st, 0, fmt, ap);
}

braid_status braid__fail(braid_comm *c, braid_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(c, st, 0, fmt, ap);
  va_end(ap);
  return st;
}

braid_status braid__fail_comm(braid_comm *c, braid_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(c, st, 1, fmt, ap);
  va_end(ap);
  return st;
}

braid_status braid__fail_relayed(braid_comm *c, braid_status st, const char *msg) { return record(c, st, msg, 1); }

void braid__fail_as(braid_comm *c, braid_status st, const char *text) {
  int expected = 0;
  pthread_mutex_lock(&c->err_lock);
  if (atomic_compare_exchange_strong(&c->failed, &expected, (int)st)) {
    snprintf(c->fatal_error, sizeof c->fatal_error, "%s (rank %d)", text, braid__label(c, c->rank));
    snprintf(c->fatal_text, sizeof c->fatal_text, "%s", text);
  }
  pthread_mutex_unlock(&c->err_lock);
}

size_t braid__rankless_len(const braid_comm *c, const char *msg) {
  char tail[32];
  int tl = snprintf(tail, sizeof tail, " (rank %d)", braid__label(c, c->rank));
  size_t n = strlen(msg);
  if (tl > 0 && n >= (size_t)tl && !strcmp(msg + n - (size_t)tl, tail)) n -= (size_t)tl;
  return n;
}

void braid__fail_promote(braid_comm *c, braid_status st) {
  char text[BRAID_ERRLEN];
  pthread_mutex_lock(&c->err_lock);
  snprintf(text, sizeof text, "%s", c->last_error);
  pthread_mutex_unlock(&c->err_lock);
  text[braid__rankless_len(c, text)] = 0;
  braid__fail_as(c, st, text);
}

const char *braid_last_error(const braid_comm *comm) {
  if (!comm) return tls_error;
  braid_comm *c = (braid_comm *)comm;
  pthread_mutex_lock(&c->err_lock);
  snprintf(tls_copy, sizeof tls_copy, "%s", c->last_error);
  pthread_mutex_unlock(&c->err_lock);
  return tls_copy;
}

static void describe_count(char *out, size_t len, size_t count, braid_dtype dt) {
  snprintf(out, len, "%zu elements of %s (%zu bytes)", count, braid_dtype_name(dt), count * braid_dtype_size(dt));
}

void braid__mismatch_text(char *out, size_t len, int src, uint32_t tag, size_t msg_count, braid_dtype msg_dt,
                          size_t recv_count, braid_dtype recv_dt) {
  char got[96], want[96];
  describe_count(got, sizeof got, msg_count, msg_dt);
  describe_count(want, sizeof want, recv_count, recv_dt);
  snprintf(out, len, "message from rank %d with tag %u has %s but the receive expects %s", src, tag, got, want);
}

void braid__defer(braid_comm *c, braid_status st, const char *msg) {
  if (c->deferred) {
    c->deferred_more++;
    snprintf(c->deferred_last, sizeof c->deferred_last, "%s", msg);
    return;
  }
  c->deferred = st;
  snprintf(c->deferred_msg, sizeof c->deferred_msg, "%s", msg);
}

void braid__defer_move(braid_comm *to, braid_comm *from) {
  if (!from->deferred) return;
  braid__defer(to, from->deferred, from->deferred_msg);
  if (from->deferred_more) {
    to->deferred_more += from->deferred_more - 1;
    braid__defer(to, from->deferred, from->deferred_last);
  }
  from->deferred = BRAID_OK;
  from->deferred_more = 0;
}

braid_status braid__deferred_report(braid_comm *c) {
  braid_status st = c->deferred;
  int more = c->deferred_more;
  c->deferred = BRAID_OK;
  c->deferred_more = 0;
  if (!more) return braid__fail(c, st, "%s", c->deferred_msg);
  return braid__fail(c, st, "%s; and %d more receive(s) failed the same way, the last: %s", c->deferred_msg, more,
                     c->deferred_last);
}

braid_status braid__coll_mismatch_of(braid_comm *c, uint64_t seq, const braid__desc *mine, int peer,
                                     const braid__desc *theirs, uint64_t their_seq) {
  if (atomic_load(&c->failed)) return (braid_status)atomic_load(&c->failed);
  char text[400], full[BRAID_ERRLEN];
  braid__desc_mismatch_text(text, sizeof text, braid__label(c, peer), theirs, braid__label(c, c->rank), mine);
  if (their_seq == seq)
    snprintf(full, sizeof full, "%s #%llu: %s", braid__coll_call_name(mine->kind), (unsigned long long)seq, text);
  else
    snprintf(full, sizeof full, "%s #%llu: %s (rank %d is at its collective #%llu: a rank skipped or added a call)",
             braid__coll_call_name(mine->kind), (unsigned long long)seq, text, braid__label(c, peer),
             (unsigned long long)their_seq);
  return record(c, BRAID_ERR_MISMATCH, full, 1);
}

braid_status braid__coll_mismatch_at(braid_comm *c, int peer, const braid__desc *theirs, uint64_t their_seq) {
  return braid__coll_mismatch_of(c, c->seq, &c->desc, peer, theirs, their_seq);
}

braid_status braid__coll_check_stale(braid_comm *c, int inclusive, int progress) {
  int src;
  braid__msg_hdr h;
  uint64_t at;
  int found = c->match.nunexp && braid__match_find_stale(c, c->seq, inclusive, &src, &h, &at);
  if (!found && c->ops->find_unexpected)
    found = c->ops->find_unexpected(c, c->seq, inclusive, NULL, progress, &src, &h, &at);
  if (!found) return BRAID_OK;
  /* at is the sequence number as the tag keeps it (wrapped): name the full
     one this rank had then. */
  uint64_t seq = c->seq - ((c->seq - at) & braid__tag_mask(BRAID__TAG_SEQ_BITS));
  const braid__desc *mine = seq == c->seq ? &c->desc : seq + 1 == c->seq ? &c->prev_desc : NULL;
  if (mine && braid__desc_equal(mine, &h.desc))
    return braid__fail_comm(c, BRAID_ERR_MISMATCH,
                            "rank %d sent a message in collective #%llu that this rank's call never received: the "
                            "ranks disagree on the calls",
                            braid__label(c, src), (unsigned long long)seq);
  if (mine) return braid__coll_mismatch_of(c, seq, mine, src, &h.desc, seq);
  char d[160];
  braid__desc_format(&h.desc, d, sizeof d);
  return braid__fail_comm(c, BRAID_ERR_MISMATCH,
                          "rank %d sent a message of %s as collective #%llu that this rank never received: the ranks "
                          "disagree on the calls",
                          braid__label(c, src), d, (unsigned long long)seq);
}

braid_status braid__coll_mismatch(braid_comm *c, int peer, const braid__desc *theirs) {
  return braid__coll_mismatch_at(c, peer, theirs, c->seq);
}

braid_comm *braid__comm_alloc(void) {
  braid_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->err_lock, NULL);
  atomic_init(&c->failed, 0);
  atomic_init(&c->aborted, 0);
  c->pending_tail = &c->pending;
  c->check = 1;
  c->spin_limit = 4096;
  c->yield_s = 2e-3;
  return c;
}

static atomic_int reqs_lost;

int braid__reqs_lost(void) { return atomic_load(&reqs_lost); }

void braid__comm_free(braid_comm *c) {
  /* Every request goes back by the end of braid_destroy; one that did not
     is a leak of braid's (the test harness fails a rank that saw one). */
  if (c->nreqs) {
    atomic_fetch_add(&reqs_lost, c->nreqs);
    BLOG_ERROR(BRAID_SUB_P2P, c->rank, "braid_destroy: %d request(s) of this %s communicator were never freed",
               c->nreqs, c->ops ? c->ops->name : "unstarted");
  }
  while (c->free_reqs) {
    braid__req *r = c->free_reqs;
    c->free_reqs = r->next;
    free(r);
  }
  for (int i = 0; i < BRAID__NSCRATCH; i++) free(c->scratch[i]);
  braid__match_free(c);
  free(c->label_of);
  free(c->world_of);
  free(c->scope);
  free(c->scope_pid);
  braid__trace_free(c);
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->err_lock);
  free(c);
}

braid_status braid__fail_caller(braid_status st, const char *fmt, ...) {
  char text[BRAID_ERRLEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  const char *r = braid__param_env(BRAID_P_RANK);
  if (r) return braid__fail(NULL, st, "%s (rank %s)", text, r);
  return braid__fail(NULL, st, "%s (pid %d)", text, (int)getpid());
}
