/* The one message matcher: posted receives and unexpected messages, each
   kept FIFO per (source, tag) in hashed buckets, with the shape rule of
   docs/API.md. Every backend hands its arrivals here. */
#ifndef BRAID_MATCH_H
#define BRAID_MATCH_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"
#include "core/p2p.h"

struct braid_comm;

/* An unexpected message; a backend's own type embeds it first
   (backend->umsg_size bytes) to keep the payload or how to fetch it. */
typedef struct braid__umsg {
  struct braid__umsg *next, *prev;
  int src;
  braid__msg_hdr h;
  size_t bytes; /* payload bytes (h.count elements of h.dt) */
  /* this communicator's internal messages, also in collective order */
  struct braid__umsg *snext, *sprev;
  int64_t cseq; /* the collective's sequence number, unwrapped */
  int lane;     /* its lane + 1 in that order; 0: not there */
} braid__umsg;

#define BRAID__MATCH_INL_BITS 8 /* the inline buckets: 1 << this */

typedef struct braid__match_bucket {
  void *head, *tail;
} braid__match_bucket;

/* Buckets hashed by (source, tag). The table grows with the queue: ranks
   that run ahead leave one message per collective, each under its own key,
   and a bucket shared by thousands would make every receive walk them. */
typedef struct braid__match_table {
  braid__match_bucket *b; /* NULL: inl */
  unsigned bits;          /* log2 of the bucket count; 0: inl's */
  unsigned cursor;        /* where the destroy's pops go on */
  braid__match_bucket inl[1u << BRAID__MATCH_INL_BITS];
} braid__match_table;

/* One source's unexpected internal messages, sorted by collective. */
typedef struct braid__match_lane {
  braid__umsg *head, *tail;
  int next, prev; /* the other non-empty lanes (index + 1; 0: none) */
} braid__match_lane;

typedef struct braid__matcher {
  braid__match_table posted, unexp;
  size_t nposted, nunexp;
  /* The unexpected internal messages of this communicator in collective
     order, a lane per source: every call asks whether one of an earlier
     collective is left, and ranks running ahead leave thousands of later
     ones, so neither the answer nor an arrival may need a walk past them.
     Each source sends its collectives in order, so its arrivals go at the
     end of its lane; one lane for all would make every arrival walk past
     the other sources' run-ahead. lanes is grown to the sources seen; until
     then (or if it cannot grow) sources share lane0 or lanes[src % n]. */
  braid__match_lane lane0;
  braid__match_lane *lanes;
  int nlanes;
  int active; /* first non-empty lane + 1; 0: none */
} braid__matcher;

/* An arrival from src. Returns the posted receive it completes, taken off
   the queue (the backend delivers into it), or NULL: the backend then keeps
   the message with braid__match_unexpected. Receives of another shape met
   first are completed with BRAID_ERR_MISMATCH (the sentence is deferred to
   braid_sync) and the message moves on. Internal traffic whose descriptor
   differs from the receive's is a collective mismatch: the communicator
   fails, *st is set and NULL returned (the backend drops the message). */
braid__req *braid__match_arrival(struct braid_comm *c, int src, const braid__msg_hdr *h, braid_status *st);
void braid__match_unexpected(struct braid_comm *c, braid__umsg *u);

/* A new receive r. Returns the unexpected message it takes, off the queue
   (the caller hands both to backend->take), or NULL after queueing r on
   the posted queue. When the oldest unexpected message of r's (source, tag)
   has another shape, *st is set and r is not queued: MISMATCH for user
   traffic (the message stays for a receive of the right shape; the sentence
   is recorded on c), or a collective mismatch (c failed). */
braid__umsg *braid__match_post(struct braid_comm *c, braid__req *r, braid_status *st);

/* Takes r off the posted queue (abandoned receives). */
void braid__match_cancel(struct braid_comm *c, braid__req *r);

/* The first unexpected internal message of collective seq of this
   communicator whose descriptor differs from mine: 1 with its source and
   descriptor (the check while a wait goes slow), else 0. */
int braid__match_find_foreign(struct braid_comm *c, uint64_t seq, const braid__desc *mine, int *src,
                              braid__desc *theirs);

/* An unexpected internal message of this communicator from a collective
   before seq (or up to seq when inclusive), in wrapped tag arithmetic: 1
   with its source, header and tag sequence number, else 0. */
int braid__match_find_stale(struct braid_comm *c, uint64_t seq, int inclusive, int *src, braid__msg_hdr *h,
                            uint64_t *tag_seq);

/* The same two questions about the internal messages of another
   communicator (comm_id) that wait in c's queue, as a composed backend's
   parts hold its messages: with mine, one of collective seq whose
   descriptor differs from mine (the first found); without, the oldest of a
   collective before seq (or up to seq when inclusive). A walk of the whole
   queue. 1 with its source (c's rank), header and tag sequence number. */
int braid__match_scan_of(struct braid_comm *c, uint64_t comm_id, uint64_t seq, int inclusive, const braid__desc *mine,
                         int *src, braid__msg_hdr *h, uint64_t *tag_seq);

/* Destroy: takes every queued entry off, one at a time; NULL when empty. */
braid__umsg *braid__match_pop_unexpected(struct braid_comm *c);
/* Destroy: every unexpected message off, released by the backend and freed. */
void braid__match_drop_unexpected(struct braid_comm *c);
/* Frees the matcher's own memory (the queues must be empty). */
void braid__match_free(struct braid_comm *c);
braid__req *braid__match_pop_posted(struct braid_comm *c);
/* Whether a receive from src is posted. */
int braid__match_posted_from(struct braid_comm *c, int src);

#endif
