/* Dissemination barrier: ceil(log2 n) rounds of empty messages; at round k
   rank r signals r + 2^k and waits for r - 2^k. After the last round every
   rank has heard, directly or through others, from every rank, so none can
   leave before all have arrived. */
#include "algos/internal.h"

static braid_status dissem(braid_comm *c) {
  const int n = c->size, r = c->rank, steps = braid__dissem_steps(n);
  unsigned char none = 0;
  for (int k = 0; k < steps; k++) {
    braid__req *q[2] = {0};
    uint64_t tag = braid__coll_tag(c, (uint64_t)k);
    braid_status st = braid__isend(c, &none, 0, BRAID_U8, braid__dissem_to(r, n, k), tag, &q[1]);
    if (!st) st = braid__irecv(c, &none, 0, BRAID_U8, braid__dissem_from(r, n, k), tag, &q[0]);
    if (!st) st = braid__waitall(c, q, 2);
    if (st) {
      braid__algo_drain(c, q, 2);
      return st;
    }
  }
  return BRAID_OK;
}

braid_status braid__algo_barrier(braid_comm *c, int algo) {
  if (algo == BRAID__ALGO_AUTO) algo = braid__algo_select(BRAID__COLL_BARRIER, 0, c->size);
  if (!braid__algo_supports(BRAID__COLL_BARRIER, algo) || algo == BRAID__ALGO_NATIVE)
    return braid__algo_refuse(c, BRAID__COLL_BARRIER, algo);
  return dissem(c);
}
