/* Backend "hier": ranks grouped by node; a fast communicator inside each
   node (shm), "rails" between nodes (the ranks with the same local rank on
   every node, over tcp), and one flat communicator of every rank (tcp,
   connected lazily) for point-to-point between nodes and for the shapes the
   two-level schemes do not cover. The collectives are compositions of the
   sub-communicators' own calls (hier_coll.c); point-to-point is routed to
   the sub-communicator that reaches the peer (hier_p2p.c). */
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

/* hier_p2p.c */
typedef struct hier_req {
  braid__req base;
  struct hier_req *next;
  braid_comm *sub;   /* where it was routed */
  braid__req *inner; /* its request there */
} hier_req;

braid_status hier_isend(braid_comm *c, braid__req *r);
braid_status hier_irecv(braid_comm *c, braid__req *r);
braid_status hier_progress(braid_comm *c);
braid_status hier_take(braid_comm *c, braid__req *r, braid__umsg *u);
void hier_p2p_free(braid_comm *c);

#endif
