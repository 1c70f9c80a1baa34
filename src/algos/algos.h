/* Generic collective algorithms, written once over the core's point-to-point
   requests (core/p2p.h) and used by every backend that has no native
   version of a collective (or when BRAID_ALGO forces one). The rank math
   they follow is in algos/patterns.h; the choice by size and world size is
   one table in select.c. */
#ifndef BRAID_ALGOS_H
#define BRAID_ALGOS_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"
#include "core/desc.h"

typedef struct braid_comm braid_comm;

typedef enum braid__algo {
  BRAID__ALGO_AUTO = 0, /* the selection table */
  BRAID__ALGO_NATIVE,   /* the backend's own implementation */
  BRAID__ALGO_RING,     /* all-reduce (pipelined reduce-scatter + all-gather), all-gather, reduce-scatter,
                           reduce (ring reduce-scatter, then the blocks to the root) */
  BRAID__ALGO_RHD,      /* recursive halving-doubling: all-reduce (Rabenseifner), reduce-scatter */
  BRAID__ALGO_RD,       /* recursive doubling of whole vectors: small all-reduce, all-gather */
  BRAID__ALGO_TREE,     /* binomial tree: broadcast, reduce, gather, scatter */
  BRAID__ALGO_KNOMIAL,  /* k-nomial tree broadcast (radix 4) */
  BRAID__ALGO_CHAIN,    /* pipelined chain: broadcast, reduce */
  BRAID__ALGO_BRUCK,    /* Bruck: all-gather, all-to-all */
  BRAID__ALGO_DISSEM,   /* dissemination barrier */
  BRAID__ALGO_LINEAR,   /* gather / scatter: every block straight between its rank and the root */
  BRAID__ALGO_PAIRWISE, /* all-to-all(v): n-1 steps of one exchange each */
  BRAID__ALGO_COUNT
} braid__algo;

/* "ring", "rhd", ... ; NULL for an unknown code. */
const char *braid__algo_name(int algo);
/* 1 when algo implements collective kind (NATIVE counts for every kind). */
int braid__algo_supports(int kind, int algo);
/* The generic algorithm the table picks for kind at this size (bytes per
   rank's buffer: buf for all-reduce, broadcast and reduce, the per-rank
   block for all-gather, reduce-scatter, gather, scatter and all-to-all; 0
   for all-to-allv) and world size. Never AUTO or NATIVE. */
int braid__algo_select(int kind, size_t bytes, int nranks);
/* The vector the selection rules count for a call of kind with bytes per
   rank's buffer or block: the buffer, or all nranks blocks (saturating). */
size_t braid__algo_vector(int kind, size_t bytes, int nranks);
/* Parses BRAID_ALGO ("allreduce=ring,broadcast=tree"; op names as in
   braid__coll_short_name, algorithm names as braid__algo_name, "auto" and
   "native" allowed). out[kind] is set for each named op. 0, or -1 with a
   sentence naming the bad item in err. */
int braid__algo_parse(const char *spec, uint8_t out[BRAID__COLL_NKINDS], char *err, size_t errlen);
/* The canonical BRAID_ALGO of a parsed table: the forced collectives in
   their enum order, "" when none is forced. Spellings that parse alike
   give the same text (the ranks compare it at init). */
void braid__algo_spec(const uint8_t algo[BRAID__COLL_NKINDS], char *out, size_t len);
/* The selection table in words, one line per rule, for braid-info and the
   init log: calls emit(line, arg) for each line. */
void braid__algo_describe(void (*emit)(const char *line, void *arg), void *arg);

/* The algorithms. algo AUTO picks by the table; every other value must be
   one that braid__algo_supports for the kind (never NATIVE). Called with
   c->lock held, c->seq and c->desc set, count > 0, and arguments checked. */
braid_status braid__algo_all_reduce(braid_comm *c, int algo, void *buf, size_t count, braid_dtype dt, braid_op op);
braid_status braid__algo_broadcast(braid_comm *c, int algo, void *buf, size_t count, braid_dtype dt, int root);
braid_status braid__algo_all_gather(braid_comm *c, int algo, const void *send, void *recv, size_t count,
                                    braid_dtype dt);
braid_status braid__algo_reduce_scatter(braid_comm *c, int algo, const void *send, void *recv, size_t count,
                                        braid_dtype dt, braid_op op);
braid_status braid__algo_barrier(braid_comm *c, int algo);
/* recv is significant at the root only (in place there when send == recv). */
braid_status braid__algo_reduce(braid_comm *c, int algo, const void *send, void *recv, size_t count, braid_dtype dt,
                                braid_op op, int root);
/* Rank r's block goes to recv + r*count at the root (recv used there only;
   in place when send == recv + root*count). */
braid_status braid__algo_gather(braid_comm *c, int algo, const void *send, void *recv, size_t count, braid_dtype dt,
                                int root);
/* Rank r receives send + r*count of the root (send used there only; in
   place when recv == send + root*count). */
braid_status braid__algo_scatter(braid_comm *c, int algo, const void *send, void *recv, size_t count,
                                 braid_dtype dt, int root);
/* Block j of send goes to rank j, block i of recv comes from rank i; in
   place when send == recv. */
braid_status braid__algo_all_to_all(braid_comm *c, int algo, const void *send, void *recv, size_t count,
                                    braid_dtype dt);
/* Per-peer counts and displacements in elements; every pair exchanges one
   message (empty for a count of 0), whose size the matcher compares with
   the receiver's count. In place (send == recv) the data for rank j is
   recv_counts[j] elements at recv + recv_displs[j], and the send arrays are
   not read. */
braid_status braid__algo_all_to_allv(braid_comm *c, int algo, const void *send, const size_t *send_counts,
                                     const size_t *send_displs, void *recv, const size_t *recv_counts,
                                     const size_t *recv_displs, braid_dtype dt);

#endif
