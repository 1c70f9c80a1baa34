/* Requests: the point-to-point currency between the core, the algorithms
   and the transports. A backend's request embeds braid__req as its first
   member (backend->req_size bytes in all); the core allocates, matches,
   waits for and frees them. */
#ifndef BRAID_P2P_H
#define BRAID_P2P_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"
#include "core/desc.h"

typedef struct braid__req braid__req;

/* What a message says about itself; the matcher compares it with the
   receive's. desc is the sender's collective (kind NONE for user traffic). */
typedef struct braid__msg_hdr {
  uint64_t tag;
  uint64_t count;
  uint32_t dt;
  uint32_t reserved;
  braid__desc desc;
} braid__msg_hdr;

struct braid__req {
  braid__req *next, *prev; /* matcher queue, then the backend's lists */
  braid__req *pend_next;   /* the communicator's pending user operations */
  uint8_t is_send;
  uint8_t done;            /* set by the backend (or the matcher) when complete */
  uint8_t user;            /* braid_send/braid_recv: completed by braid_sync */
  uint8_t queued;          /* on the matcher's posted queue */
  uint8_t posting;         /* inside braid_recv: a shape mismatch found now fails that call */
  braid_status status;     /* at completion: OK, or MISMATCH for a receive */
  int peer;
  braid__msg_hdr h;        /* tag, count, dtype, descriptor */
  void *buf;               /* const for sends */
  size_t bytes;
  uint64_t ord;            /* user operations: the communicator's count of them when this one was posted */
  uint64_t trace_id;       /* user operations: its flight-recorder entry's id (0: none), ended at completion */
};

typedef struct braid_comm braid_comm;

/* Internal point-to-point for the algorithms (src/algos): the request carries
   the current collective's descriptor. *out must be waited for with
   braid__waitall; on failure *out is NULL. count 0 is allowed (an empty
   message). */
braid_status braid__isend(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                          braid__req **out);
braid_status braid__irecv(braid_comm *c, void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                          braid__req **out);
/* The same for any tag (user traffic: kind NONE descriptor). */
braid_status braid__post_send(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                              braid__req **out);
braid_status braid__post_recv(braid_comm *c, void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                              braid__req **out);
/* The same with an explicit descriptor for internal traffic (a backend that
   routes its requests through a sub-communicator keeps its own call's). */
braid_status braid__post_send_as(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int peer,
                                 uint64_t tag, const braid__desc *desc, braid__req **out);
braid_status braid__post_recv_as(braid_comm *c, void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                                 const braid__desc *desc, int posting, braid__req **out);
/* braid_recv: a shape mismatch with a message that arrives while the
   receive is being posted completes it at once with MISMATCH, the sentence
   in c->posting_mismatch (the call fails instead of the next sync). */
braid_status braid__post_recv_user(braid_comm *c, void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                                   braid__req **out);
/* Progresses until every non-NULL reqs[i] is complete, freeing each and
   setting it to NULL. On a fatal error the array is cleared too: completed
   requests are freed, unfinished ones stay with the backend until the
   communicator is destroyed (it is failed, so nothing progresses them and
   no buffer they name is written again). */
braid_status braid__waitall(braid_comm *c, braid__req **reqs, int n);
/* One progress pass; 1 if r is complete (r stays allocated). */
int braid__test(braid_comm *c, braid__req *r);
/* Frees a completed request; its status is returned. */
braid_status braid__req_release(braid_comm *c, braid__req *r);

/* Backends: marks r complete with status st (once) and counts it off
   c->npending. */
void braid__req_complete(braid_comm *c, braid__req *r, braid_status st);
/* Backends: frees a request the backend still held when the communicator
   is destroyed (pending work abandoned). */
void braid__req_drop(braid_comm *c, braid__req *r);

/* For a backend that posted r on a communicator it routes through and
   lets go of it before that communicator is destroyed: freed now if
   complete, else with that communicator's unfinished work. */
void braid__req_abandon(braid_comm *c, braid__req *r);

/* The internal tag of step `step` of the collective in progress on c. */
uint64_t braid__coll_tag(const braid_comm *c, uint64_t step);

/* Scratch memory owned by c, reused across calls: slot 0..3, at least bytes,
   64-byte aligned; NULL (and c failed with NO_MEMORY) when it cannot grow. */
void *braid__scratch(braid_comm *c, int slot, size_t bytes);

#endif
