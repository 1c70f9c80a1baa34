/* All-to-allv: rank i's send_counts[j] elements at send + send_displs[j]
   land at recv + recv_displs[i] of rank j, which expects recv_counts[i] of
   them. Every pair exchanges exactly one message, empty for a count of 0:
   its size is the sender's count, and the matcher fails the receive whose
   count differs (BRAID_ERR_MISMATCH naming both ranks and both counts), so
   a disagreement is found without an extra round.
 *  - pairwise: n-1 steps; at step s rank r sends to r + s and receives from
 *    r - s, several steps in flight. Each step is a permutation, so however
 *    uneven the counts, no rank has two senders at once (no hot spot).
 *    In place (send == recv) the steps pair the ranks, and a received block
 *    waits in scratch until the block it replaces has left.
 */
#include <string.h>

#include "algos/internal.h"

enum { A2AV_WINDOW = 8 };
#define A2AV_INPLACE_SCRATCH ((size_t)32 << 20)

/* The address of element displ of buf; buf itself when nothing moves (buf
   may then be NULL, and no offset is applied to it). */
static char *at(const void *buf, size_t displ, size_t count, size_t esz) {
  static char none;
  if (!count) return buf ? (char *)buf : &none;
  return (char *)buf + displ * esz;
}

static braid_status exchange(braid_comm *c, void *rbuf, size_t rcount, int from, const void *sbuf, size_t scount,
                             int to, braid_dtype dt, braid__req **q) {
  /* Empty blocks are sent too (braid__algo_post_xchg skips them), so that
     counts the two sides disagree on fail as a mismatch; the send goes
     first, for braid__algo_post_xchg's reasons. */
  uint64_t tag = braid__coll_tag(c, 0);
  braid_status st = braid__isend(c, sbuf, scount, dt, to, tag, &q[1]);
  return st ? st : braid__irecv(c, rbuf, rcount, dt, from, tag, &q[0]);
}

static braid_status a2av_pairwise(braid_comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                                  void *recv, const size_t *rcounts, const size_t *rdispls, braid_dtype dt) {
  const int n = c->size, r = c->rank;
  const size_t esz = braid_dtype_size(dt);
  braid__req *q[2 * A2AV_WINDOW] = {0};
  braid_status st = BRAID_OK;
  for (int s = 1; s < n; s++) {
    braid__req **slot = &q[2 * ((s - 1) % A2AV_WINDOW)];
    if (s > A2AV_WINDOW && (st = braid__waitall(c, slot, 2))) goto fail;
    int to = braid__a2a_to(r, n, s), from = braid__a2a_from(r, n, s);
    if ((st = exchange(c, at(recv, rdispls[from], rcounts[from], esz), rcounts[from], from,
                       at(send, sdispls[to], scounts[to], esz), scounts[to], to, dt, slot)))
      goto fail;
  }
  if ((st = braid__waitall(c, q, 2 * A2AV_WINDOW))) goto fail;
  return BRAID_OK;

fail:
  braid__algo_drain(c, q, 2 * A2AV_WINDOW);
  return st;
}

/* As a2a_inplace (alltoall.c), with blocks of their own sizes: the data for
   partner p is recv_counts[p] elements at recv + recv_displs[p], replaced
   by what p sends. */
static braid_status a2av_inplace(braid_comm *c, void *buf, const size_t *rcounts, const size_t *rdispls,
                                 braid_dtype dt) {
  const int n = c->size, r = c->rank;
  const size_t esz = braid_dtype_size(dt);
  size_t most = 0;
  for (int p = 0; p < n; p++)
    if (p != r && rcounts[p] > most) most = rcounts[p];
  const size_t sbytes = most * esz;
  int w = A2AV_WINDOW;
  while (w > 1 && (size_t)w * sbytes > A2AV_INPLACE_SCRATCH) w--;
  char *tmp = braid__scratch(c, 0, (size_t)w * sbytes + 1);
  if (!tmp) return BRAID_ERR_NO_MEMORY;
  braid__req *q[2 * A2AV_WINDOW] = {0};
  int peer[A2AV_WINDOW];
  braid_status st = BRAID_OK;
  int posted = 0, retired = 0;
  for (int s = braid__a2a_pair_first(n); s <= n; s++) {
    int p = s < n ? braid__a2a_partner(r, n, s) : -1;
    if (p == r) continue;
    while (retired < posted && (p < 0 || posted - retired == w)) {
      int o = retired++ % w, b = peer[o];
      if ((st = braid__waitall(c, &q[2 * o], 2))) goto fail;
      if (rcounts[b]) memcpy((char *)buf + rdispls[b] * esz, tmp + (size_t)o * sbytes, rcounts[b] * esz);
    }
    if (p < 0) break;
    int o = posted++ % w;
    peer[o] = p;
    char *blk = at(buf, rdispls[p], rcounts[p], esz);
    if ((st = exchange(c, tmp + (size_t)o * sbytes, rcounts[p], p, blk, rcounts[p], p, dt, &q[2 * o]))) goto fail;
  }
  return BRAID_OK;

fail:
  braid__algo_drain(c, q, 2 * A2AV_WINDOW);
  return st;
}

braid_status braid__algo_all_to_allv(braid_comm *c, int algo, const void *send, const size_t *send_counts,
                                     const size_t *send_displs, void *recv, const size_t *recv_counts,
                                     const size_t *recv_displs, braid_dtype dt) {
  const int n = c->size, r = c->rank;
  if (algo == BRAID__ALGO_AUTO) algo = braid__algo_select(BRAID__COLL_ALL_TO_ALLV, 0, n);
  if (!braid__algo_supports(BRAID__COLL_ALL_TO_ALLV, algo) || algo == BRAID__ALGO_NATIVE)
    return braid__algo_refuse(c, BRAID__COLL_ALL_TO_ALLV, algo);
  if (send == recv) return n == 1 ? BRAID_OK : a2av_inplace(c, recv, recv_counts, recv_displs, dt);
  const size_t esz = braid_dtype_size(dt);
  if (recv_counts[r])
    memcpy((char *)recv + recv_displs[r] * esz, (const char *)send + send_displs[r] * esz, recv_counts[r] * esz);
  return n == 1 ? BRAID_OK : a2av_pairwise(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, dt);
}
