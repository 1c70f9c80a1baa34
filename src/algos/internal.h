/* What the collective files of src/algos share: the reduction in progress,
   block layouts, transfer helpers and the ring / halving phases that
   all-reduce reuses from reduce-scatter and all-gather. */
#ifndef BRAID_ALGOS_INTERNAL_H
#define BRAID_ALGOS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "algos/algos.h"
#include "algos/patterns.h"
#include "braid.h"
#include "core/comm.h"
#include "core/p2p.h"
#include "core/reduce.h"

enum {
  /* A pipelined ring moves a block in chunks of about this many bytes: a
     chunk stays in L2 while it is reduced, and is large enough that the
     per-message cost is small beside its copy. */
  BRAID__RING_CHUNK_BYTES = 256 << 10,
  /* At most this many chunks per block (larger blocks get larger chunks),
     which bounds the requests a ring keeps track of. */
  BRAID__RING_MAX_CHUNKS = 64,
  /* Receives posted ahead in a pipeline: the next chunks arrive while the
     current one is reduced or forwarded. */
  BRAID__WINDOW = 4,
  /* Chain chunk: the ring's size. A smaller one would fill the chain's
     n-1 stages sooner, but on tcp a chunk under the eager limit arrives
     unexpected while the sender runs ahead, and that costs far more than
     the fill (docs/PERFORMANCE.md, tcp). */
  BRAID__CHAIN_CHUNK_BYTES = 256 << 10,
  /* Sends a chain rank keeps in flight before it waits for the oldest. */
  BRAID__CHAIN_SENDS = 8,
};

/* The reduction of a call: dtype, op, and the accumulator format partial
   results travel in (f32 for f16, bf16 and fp8, the dtype itself
   otherwise; adt is its dtype on the wire). */
typedef struct braid__red {
  braid_dtype dt, adt;
  braid_op op;
  size_t esz, asz;
  int lp;   /* accumulators are wider than the dtype */
  int ndiv; /* AVG divisor: the world size */
} braid__red;

static inline braid__red braid__red_make(braid_dtype dt, braid_op op, int n) {
  braid__red R;
  R.dt = dt;
  R.op = op;
  R.esz = braid_dtype_size(dt);
  R.asz = braid__acc_size(dt);
  R.lp = R.asz != R.esz;
  R.adt = R.lp ? BRAID_F32 : dt;
  R.ndiv = n;
  return R;
}

/* dst = a op b on accumulators, dst being a or b. Both orders go through
   the same kernel, so partners that evaluate one expression get one result. */
static inline void braid__acc_op(const braid__red *R, void *dst, const void *a, const void *b, size_t count) {
  if (dst == a)
    braid__acc_combine(dst, b, count, R->dt, R->op);
  else
    braid__reduce2(dst, a, b, count, R->adt, R->op);
}

/* n blocks of a vector: all of blk elements (reduce-scatter, all-gather),
   or, blk 0, the balanced partition of count (all-reduce). */
typedef struct braid__blocks {
  size_t count;
  size_t blk;
  int n;
} braid__blocks;

static inline size_t braid__blk_off(const braid__blocks *B, int b) {
  return B->blk ? (size_t)b * B->blk : braid__part_off(B->count, B->n, b);
}
static inline size_t braid__blk_len(const braid__blocks *B, int b) {
  return B->blk ? B->blk : braid__part_len(B->count, B->n, b);
}

/* Where each of the p proxies' parts of a folded pattern starts: the
   balanced partition of count into p parts (all-reduce), or, by_rank, the
   blocks of count elements of the ranks a proxy speaks for (reduce-scatter,
   all-gather). braid__prange_off(P, p) is the vector's length. */
typedef struct braid__prange {
  size_t count;
  int n, p;
  int by_rank;
} braid__prange;

static inline size_t braid__prange_off(const braid__prange *P, int q) {
  return P->by_rank ? (size_t)braid__fold_rank(q, P->n) * P->count : braid__part_off(P->count, P->p, q);
}

static inline char *braid__at(void *p, size_t elems, size_t size) { return (char *)p + elems * size; }
static inline const char *braid__cat(const void *p, size_t elems, size_t size) {
  return (const char *)p + elems * size;
}

/* Transfers of the collective in progress at `step`. An empty transfer is
   skipped on both sides (both compute the same length), leaving *slot NULL.
   On failure *slot holds whatever the core returned, so the caller's
   cleanup frees it with the rest. */
static inline braid_status braid__algo_send(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int peer,
                                            uint64_t step, braid__req **slot) {
  braid__req *r = NULL;
  *slot = NULL;
  if (count == 0) return BRAID_OK;
  braid_status st = braid__isend(c, buf, count, dt, peer, braid__coll_tag(c, step), &r);
  *slot = r;
  return st;
}

static inline braid_status braid__algo_recv(braid_comm *c, void *buf, size_t count, braid_dtype dt, int peer,
                                            uint64_t step, braid__req **slot) {
  braid__req *r = NULL;
  *slot = NULL;
  if (count == 0) return BRAID_OK;
  braid_status st = braid__irecv(c, buf, count, dt, peer, braid__coll_tag(c, step), &r);
  *slot = r;
  return st;
}

/* Frees what an error path leaves in flight. The communicator is failed by
   then, so the wait returns at once; its status is the one already held. */
static inline void braid__algo_drain(braid_comm *c, braid__req **reqs, int n) {
  for (int i = 0; i < n; i++)
    if (reqs[i]) {
      (void)braid__waitall(c, reqs, n);
      return;
    }
}

/* The failure of a call with an algorithm the kind does not have (the
   caller's bug: the core passes only what braid__algo_supports accepts). */
braid_status braid__algo_refuse(braid_comm *c, int kind, int algo);

/* Pipelined ring reduce-scatter (reduce_scatter.c). local holds this
   rank's contribution to the blocks of B (dtype); the fully reduced block
   r, divided by the world size for AVG, is written to out. writable: local
   is the caller's own buffer and may hold partial results (direct dtypes
   only; out must then be local's block r). Uses steps step0..step0+n-2.
   n >= 2. */
braid_status braid__ring_rs(braid_comm *c, const braid__red *R, const braid__blocks *B, const void *local,
                            int writable, void *out, uint64_t step0);

/* Recursive halving with folding (reduce_scatter.c). An extra hands local
   (total elements, dtype) to its proxy and returns. A proxy q returns with
   the reduction of all n ranks' range [off(b), off(b+1)) in accumulator
   format at the same offset of work (not divided for AVG), where b is q,
   or brev(q) with near set (nearest partners first, patterns.h). work ==
   local means local is the caller's writable buffer of a direct dtype and
   holds the partials itself. tmp: total * asz bytes. Uses steps step0
   (folding) and step0+1..step0+log2(p) (halving). n >= 2. */
braid_status braid__rhd_reduce(braid_comm *c, const braid__red *R, const braid__prange *P, size_t total,
                               const void *local, void *work, void *tmp, int near, uint64_t step0);

/* Pipelined ring all-gather (allgather.c): block r of B is sent from own,
   every other block is received into buf at its place. Block r of buf is
   the caller's business, except that with own_copy set own is copied there
   once its sends are under way (the copy overlaps the transfer). Uses steps
   step0..step0+n-2. n >= 2. */
braid_status braid__ring_ag(braid_comm *c, const braid__blocks *B, braid_dtype dt, const void *own, void *buf,
                            uint64_t step0, int own_copy);

/* The root of a gather (is_send 0: receives) or scatter (1: sends), whose
   buffer holds block p at p*count. tree: the binomial children kids (their
   relative ranks), each with its subtree's range of blocks; linear: every
   other rank's block. Complete before returning. */
braid_status braid__root_tree(braid_comm *c, int is_send, void *buf, size_t count, braid_dtype dt, int root,
                              const int *kids, int nk);
braid_status braid__root_linear(braid_comm *c, int is_send, void *buf, size_t count, braid_dtype dt, int root);

/* One transfer with peer (is_send: send buf, else receive into it),
   complete before returning. */
static inline braid_status braid__algo_xfer(braid_comm *c, int is_send, void *buf, size_t count, braid_dtype dt,
                                            int peer, uint64_t step) {
  braid__req *q = NULL;
  braid_status st = is_send ? braid__algo_send(c, buf, count, dt, peer, step, &q)
                            : braid__algo_recv(c, buf, count, dt, peer, step, &q);
  if (!st) return braid__waitall(c, &q, 1);
  braid__algo_drain(c, &q, 1);
  return st;
}

/* Posts one exchange: sbuf to rank `to` (slot *sq) and rbuf from rank
   `from` (*rq), on the same step. The send goes first: over a rendezvous
   transport (tcp above its eager size) both ranks' announcements then
   leave before either's go-ahead, and the two directions stream at once.
   With the receive first, a rank that comes late answers the early rank's
   announcement before making its own; the early rank starts streaming,
   and its go-ahead for the late rank's message waits behind its own data,
   so on a slow link the two directions run one after the other
   (docs/ALGORITHMS.md has the measurements). */
static inline braid_status braid__algo_post_xchg(braid_comm *c, const void *sbuf, size_t scount, int to, void *rbuf,
                                                 size_t rcount, int from, braid_dtype dt, uint64_t step,
                                                 braid__req **sq, braid__req **rq) {
  braid_status st = braid__algo_send(c, sbuf, scount, dt, to, step, sq);
  return st ? st : braid__algo_recv(c, rbuf, rcount, dt, from, step, rq);
}

/* One exchange, posted as above, then both complete. */
static inline braid_status braid__algo_sendrecv(braid_comm *c, const void *sbuf, size_t scount, int to, void *rbuf,
                                                size_t rcount, int from, braid_dtype dt, uint64_t step) {
  braid__req *q[2] = {0};
  braid_status st = braid__algo_post_xchg(c, sbuf, scount, to, rbuf, rcount, from, dt, step, &q[1], &q[0]);
  if (!st) return braid__waitall(c, q, 2);
  braid__algo_drain(c, q, 2);
  return st;
}

#endif
