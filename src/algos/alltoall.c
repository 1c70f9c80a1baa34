/* All-to-all: block j of rank i's send (count elements at send + j*count)
   lands as block i of rank j's recv; in place when send == recv.
 *  - pairwise: n-1 steps; at step s rank r sends its block for r + s and
 *    receives the block of r - s, several steps in flight (each byte moves
 *    once; every step is a permutation, so no rank takes two blocks at
 *    once). In place the steps pair the ranks instead, and a received block
 *    waits in scratch until the block it replaces has left;
 *  - bruck: ceil(log2 n) steps through a rotated copy, each moving the
 *    blocks whose slot has that step's bit set (small blocks on many ranks:
 *    log2 n rounds instead of n-1, each block moving up to log2 n times).
 */
#include <string.h>

#include "algos/internal.h"

enum {
  /* Exchanges a pairwise rank keeps in flight: enough to overlap the
     per-message cost of one with the data of the others. */
  A2A_WINDOW = 8,
};
/* In place, received blocks wait in scratch: at most this much of it. */
#define A2A_INPLACE_SCRATCH ((size_t)32 << 20)

static braid_status a2a_pairwise(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt) {
  const int n = c->size, r = c->rank;
  const size_t esz = braid_dtype_size(dt);
  braid__req *q[2 * A2A_WINDOW] = {0};
  braid_status st = BRAID_OK;
  for (int s = 1; s < n; s++) {
    braid__req **slot = &q[2 * ((s - 1) % A2A_WINDOW)];
    if (s > A2A_WINDOW && (st = braid__waitall(c, slot, 2))) goto fail; /* step s - WINDOW */
    int to = braid__a2a_to(r, n, s), from = braid__a2a_from(r, n, s);
    if ((st = braid__algo_post_xchg(c, braid__cat(send, (size_t)to * count, esz), count, to,
                                    braid__at(recv, (size_t)from * count, esz), count, from, dt, 0, &slot[1], &slot[0])))
      goto fail;
  }
  if ((st = braid__waitall(c, q, 2 * A2A_WINDOW))) goto fail;
  return BRAID_OK;

fail:
  braid__algo_drain(c, q, 2 * A2A_WINDOW);
  return st;
}

/* Exchange k sends block p of buf to p and receives p's block into slot k %
   w of tmp; the block goes into buf once both completed (the send read the
   old one). Exchanges of one step are posted by both partners before
   either waits for a later one, so waits follow the steps in order. */
static braid_status a2a_inplace(braid_comm *c, void *buf, size_t count, braid_dtype dt) {
  const int n = c->size, r = c->rank;
  const size_t bytes = count * braid_dtype_size(dt);
  int w = A2A_WINDOW;
  while (w > 1 && (size_t)w * bytes > A2A_INPLACE_SCRATCH) w--;
  char *tmp = braid__scratch(c, 0, (size_t)w * bytes);
  if (!tmp) return BRAID_ERR_NO_MEMORY;
  braid__req *q[2 * A2A_WINDOW] = {0};
  int peer[A2A_WINDOW];
  braid_status st = BRAID_OK;
  int posted = 0, retired = 0;
  for (int s = braid__a2a_pair_first(n); s <= n; s++) {
    int p = s < n ? braid__a2a_partner(r, n, s) : -1;
    if (p == r) continue;
    /* Retire the oldest exchange when its slot is needed, every one at the end. */
    while (retired < posted && (p < 0 || posted - retired == w)) {
      int o = retired++ % w;
      if ((st = braid__waitall(c, &q[2 * o], 2))) goto fail;
      memcpy((char *)buf + (size_t)peer[o] * bytes, tmp + (size_t)o * bytes, bytes);
    }
    if (p < 0) break;
    int o = posted++ % w;
    peer[o] = p;
    if ((st = braid__algo_post_xchg(c, (char *)buf + (size_t)p * bytes, count, p, tmp + (size_t)o * bytes, count, p,
                                    dt, 0, &q[2 * o + 1], &q[2 * o])))
      goto fail;
  }
  return BRAID_OK;

fail:
  braid__algo_drain(c, q, 2 * A2A_WINDOW);
  return st;
}

/* Slot i of the rotated copy t holds this rank's block for rank r + i;
   step k packs the slots with bit k set, exchanges them, and unpacks the
   peer's into the same slots. */
static braid_status a2a_bruck(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt) {
  const int n = c->size, r = c->rank, steps = braid__log2_ceil(n);
  const size_t bytes = count * braid_dtype_size(dt), half = (size_t)(n + 1) / 2;
  char *t = braid__scratch(c, 0, (size_t)n * bytes);
  char *pk = t ? braid__scratch(c, 1, half * bytes) : NULL;
  char *up = pk ? braid__scratch(c, 2, half * bytes) : NULL;
  if (!up) return BRAID_ERR_NO_MEMORY;
  size_t nr = (size_t)(n - r);
  memcpy(t, (const char *)send + (size_t)r * bytes, nr * bytes);
  memcpy(t + nr * bytes, send, (size_t)r * bytes);
  for (int k = 0; k < steps; k++) {
    size_t m = 0;
    for (int i = 0; i < n; i++)
      if (braid__bruck_a2a_moves(i, k)) memcpy(pk + m++ * bytes, t + (size_t)i * bytes, bytes);
    braid_status st = braid__algo_sendrecv(c, pk, m * count, braid__bruck_a2a_to(r, n, k), up, m * count,
                                           braid__bruck_a2a_from(r, n, k), dt, (uint64_t)k);
    if (st) return st;
    m = 0;
    for (int i = 0; i < n; i++)
      if (braid__bruck_a2a_moves(i, k)) memcpy(t + (size_t)i * bytes, up + m++ * bytes, bytes);
  }
  for (int j = 0; j < n; j++)
    memcpy((char *)recv + (size_t)j * bytes, t + (size_t)braid__bruck_a2a_slot(r, n, j) * bytes, bytes);
  return BRAID_OK;
}

braid_status braid__algo_all_to_all(braid_comm *c, int algo, const void *send, void *recv, size_t count,
                                    braid_dtype dt) {
  const int n = c->size;
  const size_t bytes = count * braid_dtype_size(dt);
  if (algo == BRAID__ALGO_AUTO) algo = braid__algo_select(BRAID__COLL_ALL_TO_ALL, bytes, n);
  if (!braid__algo_supports(BRAID__COLL_ALL_TO_ALL, algo) || algo == BRAID__ALGO_NATIVE)
    return braid__algo_refuse(c, BRAID__COLL_ALL_TO_ALL, algo);
  if (algo == BRAID__ALGO_BRUCK && n > 1) return a2a_bruck(c, send, recv, count, dt);
  if (send == recv) return n == 1 ? BRAID_OK : a2a_inplace(c, recv, count, dt);
  memcpy((char *)recv + (size_t)c->rank * bytes, (const char *)send + (size_t)c->rank * bytes, bytes);
  return n == 1 ? BRAID_OK : a2a_pairwise(c, send, recv, count, dt);
}
