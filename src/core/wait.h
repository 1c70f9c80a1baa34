/* The one wait/progress engine. A caller that waits for a condition polls
   it and calls braid__wait_poll between polls: a bounded spin with pause,
   then every ~64 spins the checks (abort, failures other ranks published,
   peer liveness every ~100 ms, the cross-rank call check, the deadline),
   progress of this communicator's pending transfers and of the process's
   other communicators, then sched_yield, then sleep through the backend's
   arm/sleep hooks. The deadline (c->timeout_s) restarts whenever data moves
   (c->moved). */
#ifndef BRAID_WAIT_H
#define BRAID_WAIT_H

#include <stdint.h>

#include "core/comm.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define braid__cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define braid__cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define braid__cpu_relax() ((void)0)
#endif

typedef struct braid__waiter {
  unsigned spins;
  int armed;
  int left_seen;        /* backends: the awaited peer announced it left; one more look */
  int pos_published;    /* this rank told the store which collective it waits in */
  unsigned probe;       /* the next rank whose position that check reads, when the awaited one is unknown */
  double probe_gap, probe_next; /* that check's interval (doubling to POSITION_GAP_MAX_S) and next time */
  uint64_t moved;       /* c->moved when the deadline was last restarted */
  double start, deadline, next_live, next_remote, next_check;
} braid__waiter;

static inline void braid__wait_begin(braid__waiter *w) {
  w->spins = 0;
  w->armed = 0;
  w->left_seen = 0;
  w->pos_published = 0;
  w->probe = 0;
  w->probe_gap = w->probe_next = 0;
  w->start = 0;
}
/* Set while this process's waiting threads spend much of their time
   runnable but without a CPU (more busy processes than CPUs: the job's
   own ranks, or other work on the host): spinning then only delays the
   rank being waited for, so waits skip it and go on to yield and sleep
   (c->spin_now is 0 then). */
extern atomic_int braid__crowded;
/* The next crowded state after a sample in which a waiting thread was
   kept from a CPU for share (0-1) of the time, from the state before. */
int braid__crowded_next(int crowded, double share);

/* The slow part: every 64 spins, and every call after the spin phase. */
braid_status braid__wait_slow(braid_comm *c, braid__waiter *w, int peer, const char *what);
static inline braid_status braid__wait_poll(braid_comm *c, braid__waiter *w, int peer, const char *what) {
  w->spins++;
  if (w->spins < c->spin_now) {
    braid__cpu_relax();
    if (w->spins & 63) return BRAID_OK;
  }
  return braid__wait_slow(c, w, peer, what);
}
/* After the condition became true (disarms a pending sleep). */
static inline void braid__wait_end(braid_comm *c, braid__waiter *w) {
  if (w->armed && c->ops->disarm) c->ops->disarm(c);
  w->armed = 0;
}

/* Waits until every request of reqs (NULL entries skipped) is complete;
   peer and what describe the wait for messages (-1 / NULL: the oldest
   pending operation). */
braid_status braid__wait_reqs(braid_comm *c, braid__req *const *reqs, int n);
/* Waits until c has no pending operation (braid_sync; before 0), or only
   for the user operations posted while c->user_posted was below
   before - 1 (a barrier queued in a group: not the group's later sends
   and receives). */
braid_status braid__wait_idle(braid_comm *c, uint64_t before);

/* Describes the oldest pending point-to-point operation of c, for messages. */
void braid__describe_pending(braid_comm *c, char *out, size_t len);
/* The rank the oldest pending operation waits for, -1 if none. */
int braid__pending_peer(braid_comm *c);

/* Live communicators of this process: progress in one serves the others. */
void braid__live_add(braid_comm *c);
void braid__live_remove(braid_comm *c);
/* Whether c is a live communicator of this process (braid_destroy refuses
   anything else, such as a communicator destroyed already). */
int braid__live_contains(const braid_comm *c);
/* Progresses the other live communicators whose locks are free; returns how
   many still have transfers pending. */
int braid__progress_others(braid_comm *c);

/* Failure spread: publishes c's fatal error (once) to every rank through
   the backend's channel and the store; and reads one another rank
   published (1 and c failed with it). */
void braid__publish_failure(braid_comm *c);
int braid__poll_remote_failure(braid_comm *c, int use_store);

#endif
