/* Reduce to a root: recv at the root gets the reduction of every rank's
   send; recv elsewhere is never touched, and send is only read.
 *  - tree: binomial; a rank combines its children's partials, smallest
 *    subtree first, with its own input and hands the result to its parent
 *    (ceil(log2 n) rounds of whole vectors: small data);
 *  - chain: relative ranks n-1 -> n-2 -> ... -> 0 (the root) in chunks,
 *    each rank combining a chunk with its own and passing it on at once
 *    (large data: every link busy, one vector per link);
 *  - ring: ring reduce-scatter (every rank reduces one block), then each
 *    block straight to the root (large data: the reduction work is spread).
 * Partials of F16, BF16 and FP8 travel as f32 and the root rounds once;
 * AVG divides once, at the end. */
#include <string.h>

#include "algos/internal.h"

enum { MAX_KIDS = 32 };

/* acc = acc op a message of a child: its raw input (a leaf's, in the
   dtype) or a partial in the accumulator format. */
static void absorb(const braid__red *R, void *acc, const void *msg, int raw, size_t count) {
  if (raw)
    braid__acc_reduce(acc, msg, count, R->dt, R->op);
  else
    braid__acc_combine(acc, msg, count, R->dt, R->op);
}

static braid_status red_tree(braid_comm *c, const braid__red *R, const void *send, void *recv, size_t count,
                             int root) {
  const int n = c->size, v = braid__rel_rank(c->rank, root, n);
  int kids[MAX_KIDS];
  const int nk = braid__binomial_children(v, n, kids, MAX_KIDS);
  const int parent = v ? braid__abs_rank(braid__binomial_parent(v), root, n) : -1;
  if (nk == 0) return braid__algo_xfer(c, 1, (void *)send, count, R->dt, parent, 0); /* a leaf */
  const size_t abytes = count * R->asz;
  /* The partial: the root's recv itself for a direct dtype, else scratch. */
  char *acc = v == 0 && !R->lp ? (char *)recv : braid__scratch(c, 0, abytes);
  char *tmp = acc ? braid__scratch(c, 1, 2 * abytes) : NULL;
  if (!tmp) return BRAID_ERR_NO_MEMORY;
  braid__req *q[2] = {0};
  braid_status st = BRAID_OK;
  /* A root out of place takes its first child's vector straight into recv
     and combines send into it there: one pass over memory fewer. */
  const int direct = acc == recv && send != recv;
  /* Children in the order they finish (smallest subtree first); the next
     one's receive is posted before the current one is combined. */
  for (int i = 0; i <= nk; i++) {
    if (i < nk) {
      int kid = kids[nk - 1 - i], raw = braid__binomial_subtree(kid, n) == 1;
      if ((st = braid__algo_recv(c, i == 0 && direct ? acc : tmp + (size_t)(i % 2) * abytes, count,
                                 raw ? R->dt : R->adt, braid__abs_rank(kid, root, n), 0, &q[i % 2])))
        goto fail;
    }
    if (i == 0) continue;
    int k = i - 1, raw = braid__binomial_subtree(kids[nk - 1 - k], n) == 1;
    const char *msg = k == 0 && direct ? acc : tmp + (size_t)(k % 2) * abytes;
    if ((st = braid__waitall(c, &q[k % 2], 1))) goto fail;
    if (k > 0) {
      absorb(R, acc, msg, raw, count);
    } else if (R->lp) {
      braid__acc_load(acc, send, count, R->dt);
      absorb(R, acc, msg, raw, count);
    } else {
      braid__reduce2(acc, send, msg, count, R->dt, R->op);
    }
  }
  if (parent >= 0) return braid__algo_xfer(c, 1, acc, count, R->adt, parent, 0);
  if (R->lp || R->op == BRAID_AVG) braid__acc_store(recv, acc, count, R->dt, R->op, R->ndiv);
  return BRAID_OK;

fail:
  braid__algo_drain(c, q, 2);
  return st;
}

/*
 * Chunk j lives in slot j % NS (accumulator format) from its receive until
 * its send completes. Receives run WINDOW chunks ahead and at most
 * CHAIN_SENDS sends are in flight, so when chunk k's receive is posted the
 * send of the slot's previous chunk, k - NS, has been waited for. A rank
 * waits only for its upstream neighbour's data and for its downstream
 * neighbour's receives, which that neighbour posts before it waits on its
 * own sends: the root, which sends nothing, ends every chain of waits.
 */
static braid_status red_chain(braid_comm *c, const braid__red *R, const void *send, void *recv, size_t count,
                              int root) {
  enum { NS = BRAID__WINDOW + BRAID__CHAIN_SENDS };
  const int n = c->size, v = braid__rel_rank(c->rank, root, n);
  const int from = v + 1 < n ? braid__abs_rank(v + 1, root, n) : -1, to = v ? braid__abs_rank(v - 1, root, n) : -1;
  size_t chunk = BRAID__CHAIN_CHUNK_BYTES / R->asz;
  if (!chunk) chunk = 1;
  const size_t C = braid__div_ceil(count, chunk), sbytes = chunk * R->asz;
  /* The head of a direct dtype sends straight from its input. */
  char *slots = NULL;
  if (from >= 0 || R->lp) {
    slots = braid__scratch(c, 0, NS * sbytes);
    if (!slots) return BRAID_ERR_NO_MEMORY;
  }
  braid__req *rq[BRAID__WINDOW] = {0}, *sq[BRAID__CHAIN_SENDS] = {0};
  braid_status st = BRAID_OK;

  for (size_t k = 0; k < C + BRAID__WINDOW; k++) {
    if (k >= BRAID__WINDOW) { /* chunk j: combine, then pass on or store */
      size_t j = k - BRAID__WINDOW, off = j * chunk, len = j + 1 < C ? chunk : count - off;
      char *slot = slots ? slots + (j % NS) * sbytes : NULL;
      const char *mine = braid__cat(send, off, R->esz);
      if (from >= 0 && (st = braid__waitall(c, &rq[j % BRAID__WINDOW], 1))) goto fail;
      if (to < 0) { /* the root: (upstream partial) op (own input), rounded and divided once */
        if (R->lp) {
          braid__acc_reduce(slot, mine, len, R->dt, R->op);
          braid__acc_store(braid__at(recv, off, R->esz), slot, len, R->dt, R->op, R->ndiv);
        } else {
          const void *srcs[2] = {slot, mine};
          braid__reduce(braid__at(recv, off, R->esz), srcs, 2, len, R->dt, R->op, R->ndiv);
        }
      } else {
        if (from >= 0)
          braid__acc_reduce(slot, mine, len, R->dt, R->op);
        else if (R->lp)
          braid__acc_load(slot, mine, len, R->dt);
        braid__req **s = &sq[j % BRAID__CHAIN_SENDS];
        if ((st = braid__waitall(c, s, 1))) goto fail;
        if ((st = braid__algo_send(c, slot ? slot : mine, len, R->adt, to, 0, s))) goto fail;
      }
    }
    if (from >= 0 && k < C) { /* then chunk k's receive, in a slot whose last send completed */
      size_t len = k + 1 < C ? chunk : count - k * chunk;
      if ((st = braid__algo_recv(c, slots + (k % NS) * sbytes, len, R->adt, from, 0, &rq[k % BRAID__WINDOW])))
        goto fail;
    }
  }
  if ((st = braid__waitall(c, sq, BRAID__CHAIN_SENDS))) goto fail;
  return BRAID_OK;

fail:
  braid__algo_drain(c, rq, BRAID__WINDOW);
  braid__algo_drain(c, sq, BRAID__CHAIN_SENDS);
  return st;
}

/* Ring reduce-scatter over the balanced partition of count, then the
   blocks to the root (step n-1). The root's own block is reduced in place
   in recv; in place with a direct dtype its input is recv itself, which the
   ring may use for partials since every block but its own is overwritten
   by the gather. */
static braid_status red_ring(braid_comm *c, const braid__red *R, const void *send, void *recv, size_t count,
                             int root) {
  const int n = c->size, r = c->rank;
  const uint64_t last = (uint64_t)n - 1;
  braid__blocks B = {count, 0, n};
  const size_t off = braid__blk_off(&B, r), len = braid__blk_len(&B, r);
  braid_status st;
  if (r != root) {
    char *out = braid__scratch(c, 1, len * R->esz + 1);
    if (!out) return BRAID_ERR_NO_MEMORY;
    if ((st = braid__ring_rs(c, R, &B, send, 0, out, 0))) return st;
    return braid__algo_xfer(c, 1, out, len, R->dt, root, last);
  }
  int writable = send == recv && !R->lp;
  if ((st = braid__ring_rs(c, R, &B, send, writable, braid__at(recv, off, R->esz), 0))) return st;
  enum { MAXQ = 64 };
  braid__req *q[MAXQ] = {0};
  int nq = 0;
  for (int p = 0; p < n; p++) {
    if (p == root) continue;
    if (nq == MAXQ) { /* many ranks: the blocks arrive in batches */
      if ((st = braid__waitall(c, q, nq))) goto fail;
      nq = 0;
    }
    if ((st = braid__algo_recv(c, braid__at(recv, braid__blk_off(&B, p), R->esz), braid__blk_len(&B, p), R->dt, p,
                               last, &q[nq++])))
      goto fail;
  }
  if ((st = braid__waitall(c, q, nq))) goto fail;
  return BRAID_OK;

fail:
  braid__algo_drain(c, q, MAXQ);
  return st;
}

braid_status braid__algo_reduce(braid_comm *c, int algo, const void *send, void *recv, size_t count, braid_dtype dt,
                                braid_op op, int root) {
  const int n = c->size;
  if (algo == BRAID__ALGO_AUTO) algo = braid__algo_select(BRAID__COLL_REDUCE, count * braid_dtype_size(dt), n);
  if (!braid__algo_supports(BRAID__COLL_REDUCE, algo) || algo == BRAID__ALGO_NATIVE)
    return braid__algo_refuse(c, BRAID__COLL_REDUCE, algo);
  if (n == 1) { /* nothing to combine; bool is still normalized */
    braid__reduce(recv, &send, 1, count, dt, op, 1);
    return BRAID_OK;
  }
  braid__red R = braid__red_make(dt, op, n);
  switch (algo) {
    case BRAID__ALGO_TREE: return red_tree(c, &R, send, recv, count, root);
    case BRAID__ALGO_CHAIN: return red_chain(c, &R, send, recv, count, root);
    default: return red_ring(c, &R, send, recv, count, root);
  }
}
