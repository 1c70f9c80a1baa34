/* The flight recorder: each communicator keeps its last operations (what,
   with whom, which algorithm, how it ended) in a ring, and writes them out
   as JSON lines when it fails (timeout, lost peer, mismatch, abort) and on
   SIGUSR1 when BRAID_TRACE_SIGNAL=1. tools/braid-trace reads every rank's
   dump and names the rank the others wait for.

   Recording costs a few stores per call. Clocks cost more than a small
   collective on this path, so an entry gets its times only when the
   operation waited past its spin phase (the wait engine stamps it) or
   failed: the operations a diagnosis needs. */
#ifndef BRAID_TRACE_H
#define BRAID_TRACE_H

#include <stdint.h>

#include "braid.h"

struct braid_comm;
struct braid__req;

enum {
  BRAID__TRACE_SEND = 100, /* entry kinds beyond braid__coll_kind */
  BRAID__TRACE_RECV,
  BRAID__TRACE_SYNC,
};
enum { BRAID__TRACE_STARTED = 1, BRAID__TRACE_DONE, BRAID__TRACE_FAILED };

typedef struct braid__trace_ent {
  uint64_t id;    /* entries written before it, plus one: a request finds its entry by it */
  uint64_t seq;   /* collective sequence number (0 for point-to-point) */
  uint64_t count;
  double t0, t1;  /* monotonic seconds the op started waiting and ended; 0 when it never waited */
  int32_t arg;    /* root, op, or tag (point to point) */
  int32_t peer;   /* point to point: the peer; else -1 */
  int32_t status; /* at the end */
  const char *algo; /* "native", "ring", ... (static strings); NULL: not chosen yet */
  uint8_t kind, dt, state;
} braid__trace_ent;

typedef struct braid__trace {
  uint32_t depth;
  uint32_t pos;  /* next % depth, kept so the per-call path does not divide */
  uint64_t next; /* entries written so far */
  braid__trace_ent ent[];
} braid__trace;

/* Allocates c's recorder (BRAID_TRACE_DEPTH entries; none when 0). */
void braid__trace_init(struct braid_comm *c);
void braid__trace_free(struct braid_comm *c);
/* Starts an entry for the operation c is entering (c->trace_cur). */
void braid__trace_begin(struct braid_comm *c, int kind, uint64_t count, int dt, int32_t arg, int peer);
/* Ends an entry that waited or failed (the clock is read only then). */
void braid__trace_end_slow(braid__trace_ent *e, braid_status st);
/* Ends c's current entry with st. */
static inline void braid__trace_end(braid__trace_ent **cur, braid_status st) {
  braid__trace_ent *e = *cur;
  if (!e) return;
  *cur = NULL;
  if (st || e->t0) {
    braid__trace_end_slow(e, st);
    return;
  }
  e->state = BRAID__TRACE_DONE;
}
/* braid_send / braid_recv posted a request that is not complete yet: its
   entry stays "started" until braid__trace_req_done (c->trace_cur let go). */
void braid__trace_req_posted(struct braid_comm *c, struct braid__req *r);
/* r completed: its entry, unless overwritten since, says how. */
void braid__trace_req_done(struct braid_comm *c, struct braid__req *r);
/* The wait engine: c's current operation is waiting (stamps its start). */
void braid__trace_waiting(struct braid_comm *c, double since);
/* Writes c's recorder out (reason: "timeout", "peer lost", "mismatch",
   "aborted", "signal", ...): to BRAID_TRACE_FILE, else to the log. */
void braid__trace_dump(struct braid_comm *c, const char *reason);
/* SIGUSR1 with BRAID_TRACE_SIGNAL=1 asked for a dump: done at the next call
   or wait step of each communicator (never inside the handler). */
void braid__trace_poll_signal(struct braid_comm *c);
/* Installs the SIGUSR1 handler once when BRAID_TRACE_SIGNAL=1. */
void braid__trace_install_signal(void);

#endif
