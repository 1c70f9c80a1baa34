/* Scatter from a root: rank r receives the count elements at send + r*count
   of the root; send elsewhere is never read and at the root only read; in
   place at the root when recv == send + root*count.
 *  - tree: binomial; a rank receives the blocks of its subtree (a range of
 *    relative ranks) from its parent, keeps its own and hands each child
 *    its range; the root sends straight from send, a range that wraps past
 *    rank n-1 in two parts (small blocks: ceil(log2 n) rounds);
 *  - linear: every block straight from the root (large blocks: each byte
 *    moves once). */
#include <string.h>

#include "algos/internal.h"

enum { MAX_KIDS = 32 };

static braid_status sc_tree(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int root) {
  const int n = c->size, v = braid__rel_rank(c->rank, root, n);
  const size_t esz = braid_dtype_size(dt), bytes = count * esz;
  int kids[MAX_KIDS];
  const int nk = braid__binomial_children(v, n, kids, MAX_KIDS);
  braid__req *q[2 * MAX_KIDS + 2] = {0};
  braid_status st = BRAID_OK;
  if (v == 0) return braid__root_tree(c, 1, (void *)send, count, dt, root, kids, nk);
  const int up = braid__binomial_parent(v), parent = braid__abs_rank(up, root, n);
  if (nk == 0) return braid__algo_xfer(c, 0, recv, count, dt, parent, 0);
  const int len = braid__binomial_subtree(v, n);
  char *buf = braid__scratch(c, 0, (size_t)len * bytes);
  if (!buf) return BRAID_ERR_NO_MEMORY;
  /* From the root: the part before the wrap at step 0, the rest at step 1. */
  int head = up == 0 ? braid__range_head(v, len, root, n) : len;
  if ((st = braid__algo_recv(c, buf, (size_t)head * count, dt, parent, 0, &q[0])) ||
      (st = braid__algo_recv(c, buf + (size_t)head * bytes, (size_t)(len - head) * count, dt, parent, 1, &q[1])) ||
      (st = braid__waitall(c, q, 2)))
    goto fail;
  memcpy(recv, buf, bytes);
  for (int i = 0; i < nk; i++)
    if ((st = braid__algo_send(c, buf + (size_t)(kids[i] - v) * bytes,
                               (size_t)braid__binomial_subtree(kids[i], n) * count, dt,
                               braid__abs_rank(kids[i], root, n), 0, &q[i])))
      goto fail;
  return braid__waitall(c, q, nk);

fail:
  braid__algo_drain(c, q, 2 * MAX_KIDS + 2);
  return st;
}

static braid_status sc_linear(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int root) {
  if (c->rank != root) return braid__algo_xfer(c, 0, recv, count, dt, root, 0);
  return braid__root_linear(c, 1, (void *)send, count, dt, root);
}

braid_status braid__algo_scatter(braid_comm *c, int algo, const void *send, void *recv, size_t count,
                                 braid_dtype dt, int root) {
  const int n = c->size;
  const size_t bytes = count * braid_dtype_size(dt);
  if (algo == BRAID__ALGO_AUTO) algo = braid__algo_select(BRAID__COLL_SCATTER, bytes, n);
  if (!braid__algo_supports(BRAID__COLL_SCATTER, algo) || algo == BRAID__ALGO_NATIVE)
    return braid__algo_refuse(c, BRAID__COLL_SCATTER, algo);
  if (c->rank == root) {
    const char *mine = (const char *)send + (size_t)root * bytes;
    if (recv != mine) memcpy(recv, mine, bytes);
  }
  if (n == 1) return BRAID_OK;
  return algo == BRAID__ALGO_TREE ? sc_tree(c, send, recv, count, dt, root) : sc_linear(c, send, recv, count, dt, root);
}
