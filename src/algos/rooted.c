/* The root's side of gather and scatter, which mirror each other: blocks
   of the root's buffer leave (scatter) or arrive (gather) the same way. */
#include "algos/internal.h"

enum { MAX_KIDS = 32, MAXQ = 64 };

braid_status braid__root_tree(braid_comm *c, int is_send, void *buf, size_t count, braid_dtype dt, int root,
                              const int *kids, int nk) {
  const int n = c->size;
  const size_t esz = braid_dtype_size(dt);
  braid__req *q[2 * MAX_KIDS] = {0};
  braid_status st = BRAID_OK;
  if (nk > MAX_KIDS) return braid__fail(c, BRAID_ERR_INTERNAL, "binomial tree with %d children", nk);
  for (int i = 0; i < nk && !st; i++) {
    /* A child's range of relative ranks, cut where it wraps past rank n-1:
       the head at its place, the rest at the start of the buffer. */
    int len = braid__binomial_subtree(kids[i], n), head = braid__range_head(kids[i], len, root, n);
    int peer = braid__abs_rank(kids[i], root, n);
    char *at = braid__at(buf, (size_t)peer * count, esz);
    st = is_send ? braid__algo_send(c, at, (size_t)head * count, dt, peer, 0, &q[2 * i])
                 : braid__algo_recv(c, at, (size_t)head * count, dt, peer, 0, &q[2 * i]);
    if (!st)
      st = is_send ? braid__algo_send(c, buf, (size_t)(len - head) * count, dt, peer, 1, &q[2 * i + 1])
                   : braid__algo_recv(c, buf, (size_t)(len - head) * count, dt, peer, 1, &q[2 * i + 1]);
  }
  if (!st) return braid__waitall(c, q, 2 * nk);
  braid__algo_drain(c, q, 2 * MAX_KIDS);
  return st;
}

braid_status braid__root_linear(braid_comm *c, int is_send, void *buf, size_t count, braid_dtype dt, int root) {
  braid__req *q[MAXQ] = {0};
  braid_status st = BRAID_OK;
  int nq = 0;
  for (int p = 0; p < c->size && !st; p++) {
    if (p == root) continue;
    if (nq == MAXQ) { /* many ranks: the blocks go in batches */
      if ((st = braid__waitall(c, q, nq))) break;
      nq = 0;
    }
    char *at = braid__at(buf, (size_t)p * count, braid_dtype_size(dt));
    st = is_send ? braid__algo_send(c, at, count, dt, p, 0, &q[nq++]) : braid__algo_recv(c, at, count, dt, p, 0, &q[nq++]);
  }
  if (!st) return braid__waitall(c, q, nq);
  braid__algo_drain(c, q, MAXQ);
  return st;
}
