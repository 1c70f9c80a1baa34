/* Backend "hier": ranks grouped by node; a fast communicator inside each
   node (shm, or nccl for device memory), "rails" between nodes (the ranks with the same local rank on
   every node, over tcp), and one flat communicator of every rank (tcp,
   connected lazily) for point-to-point between nodes and for the shapes the
   two-level schemes do not cover. The collectives are compositions of the
   sub-communicators' own calls (hier_coll.c); point-to-point is routed to
   the sub-communicator that reaches the peer (hier_p2p.c). Over a
   device-memory node part the compositions stage through the host
   (hier_dev.c). */
#ifndef BRAID_HIER_H
#define BRAID_HIER_H

#include "core/comm.h"

typedef struct hier_state {
  int nnodes;      /* nodes of the communicator */
  int node;        /* this rank's node (nodes ordered by their lowest rank) */
  int lrank, lsize; /* this rank's place within its node */
  int lmin;        /* the smallest node's rank count */
  int uniform;     /* every node holds lsize ranks */
  int *node_of;    /* per rank: its node */
  int *local_of;   /* per rank: its local rank */
  int *rank_at;    /* node j, local rank l (uniform only): the rank, at j * lsize + l */
  int *node_size;  /* per node */
  braid_comm *intra; /* the ranks of this node */
  braid_comm *rail;  /* the ranks with this local rank on every node that has one (NULL with one node) */
  braid_comm *rail0; /* local rank 0 of every node (== rail on local rank 0; NULL elsewhere or with one node) */
  braid_comm *flat;  /* every rank, between nodes (NULL with one node) */
  struct hier_req *pending; /* routed requests not yet complete */
  /* A node part that keeps buffers in device memory (nccl): the other
     parts move host memory, so data crosses nodes through host staging
     (hier_dev.c). */
  int dev;
  int dev_busy;     /* counted in c->npending while the node part has hier's work in flight */
  int stage_busy;   /* a copy to or from stage may still run on the node part's stream */
  char *stage;      /* host staging: page-locked where the node part offers it */
  int stage_pinned;
  size_t stage_len;
  void *dscratch;   /* device scratch, from the node part's allocator */
  size_t dscratch_len;
  struct later *later; /* host copies to free once the stream is idle */
  size_t piece;     /* bytes a pipelined between-node stage moves at a time (0: all at once) */
  uint64_t ev[4];   /* the node part's events marking staged pieces (made on first use) */
  int nev;
} hier_state;

/* hier_coll.c */
braid_status hier_all_reduce(braid_comm *c, void *buf, size_t count, braid_dtype dt, braid_op op);
braid_status hier_broadcast(braid_comm *c, void *buf, size_t count, braid_dtype dt, int root);
braid_status hier_all_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt);
braid_status hier_reduce_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                 braid_op op);
braid_status hier_barrier(braid_comm *c);
/* A sub-communicator call failed: fail c with its sentence (the sub's own
   failure has already gone out to its ranks). */
braid_status hier_sub_failed(braid_comm *c, braid_comm *sub, braid_status st);

/* hier.c, shared with the device-memory table */
braid_status hier_init(braid_comm *c);
braid_status hier_split(braid_comm *parent, braid_comm *child, const int *members, int n);
void hier_destroy(braid_comm *c, double timeout_s);
void hier_abort(braid_comm *c);
int hier_arm(braid_comm *c);
void hier_sleep(braid_comm *c, double slice_s);
void hier_disarm(braid_comm *c);
braid_status hier_check_peers(braid_comm *c, int peer, const char *what);
int hier_remote_failure(braid_comm *c, braid_status *st, int *origin, char *text, size_t len);
void hier_publish_failure(braid_comm *c, braid_status st, const char *text);

/* The entries both of hier's tables share. */
#define HIER_SHARED_OPS                                                                                           \
  .req_size = sizeof(hier_req), .umsg_size = sizeof(braid__umsg), .init = hier_init, .split = hier_split,         \
  .destroy = hier_destroy, .abort = hier_abort, .isend = hier_isend, .irecv = hier_irecv,                         \
  .progress = hier_progress, .take = hier_take, .find_unexpected = hier_find_unexpected, .arm = hier_arm,          \
  .sleep = hier_sleep, .disarm = hier_disarm,                                                                     \
  .check_peers = hier_check_peers, .remote_failure = hier_remote_failure, .publish_failure = hier_publish_failure

/* hier_dev.c: the table of hier over a device-memory node part, and what
   the shared code asks of it */
extern const braid__backend braid__hier_dev_backend;
/* Enqueues a copy on the node part's stream (hier's work is then in flight). */
braid_status hier_dev_copy(braid_comm *c, void *dst, const void *src, size_t bytes, braid__copy_dir dir);
/* Waits until the node part's stream has run everything enqueued so far. */
braid_status hier_dev_drain(braid_comm *c);
/* Frees the staging memory (before the parts are released). */
void hier_dev_free(braid_comm *c);
/* Frees host once the stream no longer reads it. */
void hier_dev_free_later(braid_comm *c, void *host);
/* The stream is idle: frees what waited for it. */
void hier_dev_idle(braid_comm *c);
/* Waits until the staged receives into [buf, buf + bytes) (buf NULL: all)
   have their copies to the device on the stream (hier_p2p.c). */
braid_status hier_dev_order(braid_comm *c, const void *buf, size_t bytes);

/* Runs a part's call with the collective's digest in its descriptor, so
   ranks of hier that made different calls fail the part's check; a failure
   fails hier (c) and returns. */
#define PART(sub, call)                                           \
  do {                                                            \
    (sub)->desc_flags = (uint16_t)(c->desc_hash | 1);             \
    braid_status st_ = (call);                                    \
    (sub)->desc_flags = 0;                                        \
    if (st_) return hier_sub_failed(c, (sub), st_);               \
  } while (0)

/* hier_p2p.c */
/* A part's refusal of hier's own call (a user argument): its sentence, the
   same status. */
braid_status hier_adopt(braid_comm *c, braid_comm *sub, braid_status st);
typedef struct hier_req {
  braid__req base;
  struct hier_req *next;
  braid_comm *sub;   /* where it was routed */
  braid__req *inner; /* its request there */
  void *host;        /* device buffers between nodes: the host copy the part sends or receives */
  void *dst;         /* a staged receive's device buffer */
  size_t bytes;
} hier_req;

braid_status hier_isend(braid_comm *c, braid__req *r);
braid_status hier_irecv(braid_comm *c, braid__req *r);
braid_status hier_progress(braid_comm *c);
braid_status hier_take(braid_comm *c, braid__req *r, braid__umsg *u);
/* The backend's find_unexpected: hier's messages wait in its parts' queues. */
int hier_find_unexpected(braid_comm *c, uint64_t seq, int inclusive, const braid__desc *mine, int progress, int *src,
                         braid__msg_hdr *h, uint64_t *tag_seq);
/* Before the parts are released: the parts' requests under hier's pending
   ones go to the parts (freed now if complete, else with the parts). */
void hier_p2p_let_go(braid_comm *c);
void hier_p2p_free(braid_comm *c);

#endif
