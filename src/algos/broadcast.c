/* Broadcast from any root; the root's buffer is only read.
 *  - tree: binomial, ceil(log2 n) rounds of whole messages (small data);
 *  - knomial: radix 4, ceil(log4 n) rounds with up to 3 sends per round
 *    (small data on many ranks: fewer rounds for the latency);
 *  - chain: root -> root+1 -> ... in chunks, each rank forwarding a chunk
 *    as soon as it arrives (large data: every link busy, n-2 chunks of
 *    fill). */
#include "algos/internal.h"

enum { KNOMIAL_RADIX = 4, MAX_CHILDREN = 3 * 32 };

static braid_status bcast_tree(braid_comm *c, void *buf, size_t count, braid_dtype dt, int root, int radix) {
  const int n = c->size, v = braid__rel_rank(c->rank, root, n);
  int kids[MAX_CHILDREN];
  braid__req *q[MAX_CHILDREN] = {0};
  braid_status st = BRAID_OK;
  int parent = braid__knomial_parent(v, radix);
  int nk = braid__knomial_children(v, n, radix, kids, MAX_CHILDREN);
  if (parent >= 0) {
    if ((st = braid__algo_recv(c, buf, count, dt, braid__abs_rank(parent, root, n), 0, &q[0])) ||
        (st = braid__waitall(c, q, 1)))
      goto fail;
  }
  for (int i = 0; i < nk; i++)
    if ((st = braid__algo_send(c, buf, count, dt, braid__abs_rank(kids[i], root, n), 0, &q[i]))) goto fail;
  if ((st = braid__waitall(c, q, nk))) goto fail;
  return BRAID_OK;

fail:
  braid__algo_drain(c, q, MAX_CHILDREN);
  return st;
}

/* Receives run WINDOW chunks ahead; a rank keeps CHAIN_SENDS sends in
   flight and then waits for the oldest, which the chain's acyclic order
   makes safe (the last rank never waits for a send). */
static braid_status bcast_chain(braid_comm *c, void *buf, size_t count, braid_dtype dt, int root) {
  const int n = c->size, v = braid__rel_rank(c->rank, root, n);
  const int pv = braid__chain_prev(v), nv = braid__chain_next(v, n);
  const int prev = pv < 0 ? -1 : braid__abs_rank(pv, root, n), next = nv < 0 ? -1 : braid__abs_rank(nv, root, n);
  const size_t esz = braid_dtype_size(dt);
  size_t chunk = BRAID__CHAIN_CHUNK_BYTES / esz;
  if (!chunk) chunk = 1;
  const size_t C = braid__div_ceil(count, chunk);
  braid__req *rq[BRAID__WINDOW] = {0}, *sq[BRAID__CHAIN_SENDS] = {0};
  braid_status st = BRAID_OK;

  for (size_t k = 0; k < C + BRAID__WINDOW; k++) {
    if (k >= BRAID__WINDOW) { /* forward chunk j = k - WINDOW once it is here */
      size_t j = k - BRAID__WINDOW, len = j + 1 < C ? chunk : count - j * chunk;
      if (prev >= 0 && (st = braid__waitall(c, &rq[j % BRAID__WINDOW], 1))) goto fail;
      if (next >= 0) {
        braid__req **s = &sq[j % BRAID__CHAIN_SENDS];
        if ((st = braid__waitall(c, s, 1))) goto fail;
        if ((st = braid__algo_send(c, braid__at(buf, j * chunk, esz), len, dt, next, 0, s))) goto fail;
      }
    }
    if (prev >= 0 && k < C) { /* then post chunk k's receive in the slot chunk j freed */
      size_t len = k + 1 < C ? chunk : count - k * chunk;
      if ((st = braid__algo_recv(c, braid__at(buf, k * chunk, esz), len, dt, prev, 0, &rq[k % BRAID__WINDOW])))
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

braid_status braid__algo_broadcast(braid_comm *c, int algo, void *buf, size_t count, braid_dtype dt, int root) {
  const int n = c->size;
  if (algo == BRAID__ALGO_AUTO) algo = braid__algo_select(BRAID__COLL_BROADCAST, count * braid_dtype_size(dt), n);
  if (!braid__algo_supports(BRAID__COLL_BROADCAST, algo) || algo == BRAID__ALGO_NATIVE)
    return braid__algo_refuse(c, BRAID__COLL_BROADCAST, algo);
  if (n == 1) return BRAID_OK;
  switch (algo) {
    case BRAID__ALGO_TREE: return bcast_tree(c, buf, count, dt, root, 2);
    case BRAID__ALGO_KNOMIAL: return bcast_tree(c, buf, count, dt, root, KNOMIAL_RADIX);
    default: return bcast_chain(c, buf, count, dt, root);
  }
}
