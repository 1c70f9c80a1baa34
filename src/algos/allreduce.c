/* All-reduce, in place; every rank ends with bitwise identical results.
 *  - ring: pipelined reduce-scatter then all-gather; each block is reduced
 *    at one rank and copied to the others.
 *  - rhd: Rabenseifner (recursive halving, then doubling), folded for any
 *    world size; each element is reduced at one proxy and copied. Nearest
 *    partners first (patterns.h): with consecutive ranks on one host, the
 *    halves stay on it and only quarters and less cross between hosts.
 *  - rd: recursive doubling of the whole vector (latency-first), folded;
 *    both partners of a step evaluate (lower proxy's partial) op (upper
 *    proxy's partial) with the same kernel, so NaN payloads and signed
 *    zeros agree everywhere.
 * Low-precision dtypes keep partials in f32 and round once at the end; AVG
 * divides the sum by the world size once. */
#include "algos/internal.h"

static braid_status ar_ring(braid_comm *c, void *buf, size_t count, const braid__red *R) {
  const int n = c->size, r = c->rank;
  braid__blocks B = {count, 0, n};
  char *mine = braid__at(buf, braid__blk_off(&B, r), R->esz);
  braid_status st = braid__ring_rs(c, R, &B, buf, 1, mine, 0);
  if (st) return st;
  return braid__ring_ag(c, &B, R->dt, mine, buf, (uint64_t)n - 1, 0);
}

/* Direct dtypes work in buf itself; low-precision ones in an f32 copy of
   it until each proxy stores its reduced range, then double in the dtype. */
static braid_status ar_rhd(braid_comm *c, void *buf, size_t count, const braid__red *R) {
  const int n = c->size, r = c->rank, p = braid__pow2_floor(n), L = braid__log2_floor(p);
  const int q = braid__fold_proxy(r, n), peer = braid__fold_peer(r, n);
  const size_t esz = R->esz, asz = R->asz;
  const uint64_t unfold = 1 + 2 * (uint64_t)L;
  braid__prange P = {count, n, p, 0};
  char *work = R->lp ? braid__scratch(c, 0, count * asz) : (char *)buf;
  char *tmp = work ? braid__scratch(c, 1, count * asz) : NULL;
  if (!tmp) return BRAID_ERR_NO_MEMORY;
  braid_status st = braid__rhd_reduce(c, R, &P, count, buf, work, tmp, 1, 0);
  if (st) return st;
  if (q < 0) return braid__algo_xfer(c, 0, buf, count, R->dt, peer, unfold);

  const int b = braid__brev(q, L); /* the range this proxy reduced */
  size_t o = braid__prange_off(&P, b), len = braid__prange_off(&P, b + 1) - o;
  if (R->lp || R->op == BRAID_AVG)
    braid__acc_store(braid__at(buf, o, esz), braid__at(work, o, asz), len, R->dt, R->op, R->ndiv);
  for (int i = 0; i < L; i++) {
    braid__xchg x = braid__rhd_doubling_near(q, p, i);
    size_t so = braid__prange_off(&P, x.send_lo), ro = braid__prange_off(&P, x.recv_lo);
    int pr = braid__fold_rank(x.peer, n);
    if ((st = braid__algo_sendrecv(c, braid__at(buf, so, esz), braid__prange_off(&P, x.send_hi) - so, pr,
                                   braid__at(buf, ro, esz), braid__prange_off(&P, x.recv_hi) - ro, pr, R->dt,
                                   1 + (uint64_t)L + (uint64_t)i)))
      return st;
  }
  if (peer >= 0) return braid__algo_xfer(c, 1, buf, count, R->dt, peer, unfold);
  return BRAID_OK;
}

/* The partial lives in cur (buf for direct dtypes, so no final copy); the
   peer's arrives in other. The lower proxy computes cur op other, the upper
   other op cur, into cur either way. */
static braid_status ar_rd(braid_comm *c, void *buf, size_t count, const braid__red *R) {
  const int n = c->size, r = c->rank, p = braid__pow2_floor(n), L = braid__log2_floor(p);
  const int q = braid__fold_proxy(r, n), peer = braid__fold_peer(r, n);
  const uint64_t unfold = 1 + (uint64_t)L;
  char *cur = R->lp ? braid__scratch(c, 0, count * R->asz) : (char *)buf;
  char *other = cur ? braid__scratch(c, 1, count * R->asz) : NULL;
  if (!other) return BRAID_ERR_NO_MEMORY;
  braid_status st;

  if (q < 0) {
    if ((st = braid__algo_xfer(c, 1, buf, count, R->dt, peer, 0))) return st;
    return braid__algo_xfer(c, 0, buf, count, R->dt, peer, unfold);
  }
  if (peer >= 0) { /* fold: (2i's data) op (2i+1's data) */
    if ((st = braid__algo_xfer(c, 0, other, count, R->dt, peer, 0))) return st;
    if (R->lp) {
      braid__acc_load(cur, buf, count, R->dt);
      braid__acc_reduce(cur, other, count, R->dt, R->op);
    } else {
      braid__acc_combine(cur, other, count, R->dt, R->op);
    }
  } else if (R->lp) {
    braid__acc_load(cur, buf, count, R->dt);
  }
  for (int i = 0; i < L; i++) {
    int pq = braid__rd_peer(q, i);
    int pr = braid__fold_rank(pq, n);
    if ((st = braid__algo_sendrecv(c, cur, count, pr, other, count, pr, R->adt, 1 + (uint64_t)i))) return st;
    if (q < pq)
      braid__acc_op(R, cur, cur, other, count);
    else
      braid__acc_op(R, cur, other, cur, count);
  }
  if (R->lp || R->op == BRAID_AVG) braid__acc_store(buf, cur, count, R->dt, R->op, R->ndiv);
  if (peer >= 0) return braid__algo_xfer(c, 1, buf, count, R->dt, peer, unfold);
  return BRAID_OK;
}

braid_status braid__algo_all_reduce(braid_comm *c, int algo, void *buf, size_t count, braid_dtype dt, braid_op op) {
  const int n = c->size;
  if (algo == BRAID__ALGO_AUTO) algo = braid__algo_select(BRAID__COLL_ALL_REDUCE, count * braid_dtype_size(dt), n);
  if (!braid__algo_supports(BRAID__COLL_ALL_REDUCE, algo) || algo == BRAID__ALGO_NATIVE)
    return braid__algo_refuse(c, BRAID__COLL_ALL_REDUCE, algo);
  if (n == 1) { /* nothing to combine; bool is still normalized */
    const void *src = buf;
    braid__reduce(buf, &src, 1, count, dt, op, 1);
    return BRAID_OK;
  }
  braid__red R = braid__red_make(dt, op, n);
  switch (algo) {
    case BRAID__ALGO_RING: return ar_ring(c, buf, count, &R);
    case BRAID__ALGO_RHD: return ar_rhd(c, buf, count, &R);
    default: return ar_rd(c, buf, count, &R);
  }
}
