/* All-gather: rank r's count elements land at recv + r*count on every
   rank; in place when send == recv + r*count. Ring (pipelined, n-1 steps,
   for large blocks), Bruck (ceil(log2 n) steps for any n, through a rotated
   copy) and recursive doubling (log2 steps, folded for any n). */
#include <string.h>

#include "algos/internal.h"

#define AG_OVERLAP_MAX ((size_t)1 << 20)

/*
 * Units u = s*C + k (step s = 0..n-2, chunk k): chunk k of block
 * ag_recv_block(s) is received straight into its place in buf, then sent on
 * from there as unit u + C. Receives run WINDOW units ahead. Sent regions
 * are never written again, so sends are waited for only to bound how many
 * are in flight (2C), and only for units before the current one.
 */
braid_status braid__ring_ag(braid_comm *c, const braid__blocks *B, braid_dtype dt, const void *own, void *buf,
                            uint64_t step0, int own_copy) {
  enum { NSQ = 2 * BRAID__RING_MAX_CHUNKS };
  const int n = c->size, r = c->rank, next = braid__ring_next(r, n), prev = braid__ring_prev(r, n);
  const size_t esz = braid_dtype_size(dt), maxlen = braid__blk_len(B, 0);
  const size_t C = braid__chunk_num(maxlen, BRAID__RING_CHUNK_BYTES / esz, BRAID__RING_MAX_CHUNKS);
  const size_t U = (size_t)(n - 1) * C, nsq = 2 * C;
  braid__req *rq[BRAID__WINDOW] = {0}, *sq[NSQ] = {0};
  braid_status st = BRAID_OK;

  for (size_t k = 0; k < C; k++) {
    size_t bl = braid__blk_len(B, r), off = braid__part_off(bl, (int)C, (int)k);
    if ((st = braid__algo_send(c, braid__cat(own, off, esz), braid__part_len(bl, (int)C, (int)k), dt, next, step0,
                               &sq[k])))
      goto fail;
  }
  if (own_copy) memcpy(braid__at(buf, braid__blk_off(B, r), esz), own, braid__blk_len(B, r) * esz);
  for (size_t v = 0; v < U + BRAID__WINDOW; v++) {
    if (v >= BRAID__WINDOW) { /* finish unit u = v - WINDOW: forward it */
      size_t u = v - BRAID__WINDOW, s = u / C, k = u % C;
      if ((st = braid__waitall(c, &rq[u % BRAID__WINDOW], 1))) goto fail;
      if (s + 2 < (size_t)n) {
        int b = braid__ring_ag_recv_block(r, n, (int)s);
        size_t bl = braid__blk_len(B, b), off = braid__blk_off(B, b) + braid__part_off(bl, (int)C, (int)k);
        size_t idx = (u + C) % nsq;
        if ((st = braid__waitall(c, &sq[idx], 1))) goto fail;
        if ((st = braid__algo_send(c, braid__at(buf, off, esz), braid__part_len(bl, (int)C, (int)k), dt, next,
                                   step0 + s + 1, &sq[idx])))
          goto fail;
      }
    }
    if (v < U) { /* then post unit v's receive in the slot unit u freed */
      size_t sv = v / C, kv = v % C;
      int b = braid__ring_ag_recv_block(r, n, (int)sv);
      size_t bl = braid__blk_len(B, b), off = braid__blk_off(B, b) + braid__part_off(bl, (int)C, (int)kv);
      if ((st = braid__algo_recv(c, braid__at(buf, off, esz), braid__part_len(bl, (int)C, (int)kv), dt, prev,
                                 step0 + sv, &rq[v % BRAID__WINDOW])))
        goto fail;
    }
  }
  if ((st = braid__waitall(c, sq, (int)nsq))) goto fail;
  return BRAID_OK;

fail:
  braid__algo_drain(c, rq, BRAID__WINDOW);
  braid__algo_drain(c, sq, (int)nsq);
  return st;
}

static braid_status ag_ring(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int copy) {
  braid__blocks B = {count * (size_t)c->size, count, c->size};
  return braid__ring_ag(c, &B, dt, send, recv, 0, copy);
}

/* Bruck in a rotated scratch copy (slot i = block r+i), then one rotation
   into recv; slot 0 is this rank's own block, already in place or copied. */
static braid_status ag_bruck(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt) {
  const int n = c->size, r = c->rank, steps = braid__bruck_steps(n);
  const size_t bytes = count * braid_dtype_size(dt);
  char *t = braid__scratch(c, 0, (size_t)n * bytes);
  if (!t) return BRAID_ERR_NO_MEMORY;
  memcpy(t, send, bytes);
  for (int k = 0; k < steps; k++) {
    size_t d = (size_t)1 << k, nb = (size_t)braid__bruck_nblocks(n, k);
    braid_status st = braid__algo_sendrecv(c, t, nb * count, braid__bruck_send_peer(r, n, k), t + d * bytes, nb * count,
                               braid__bruck_recv_peer(r, n, k), dt, (uint64_t)k);
    if (st) return st;
  }
  /* slots 1..n-r-1 are blocks r+1..n-1, slots n-r..n-1 are blocks 0..r-1 */
  size_t nr = (size_t)(n - r);
  memcpy((char *)recv + (size_t)(r + 1) * bytes, t + bytes, (nr - 1) * bytes);
  memcpy(recv, t + nr * bytes, (size_t)r * bytes);
  return BRAID_OK;
}

/*
 * Recursive doubling with folding: an extra (rank 2i+1 < 2*rem) hands its
 * block to its proxy 2i and receives everything else at the end; the p
 * proxies double the contiguous ranges of blocks they speak for, straight
 * in recv.
 */
static braid_status ag_rd(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int copy) {
  const int n = c->size, r = c->rank, p = braid__pow2_floor(n), L = braid__log2_floor(p);
  const int q = braid__fold_proxy(r, n), peer = braid__fold_peer(r, n);
  const size_t esz = braid_dtype_size(dt), total = count * (size_t)n;
  const uint64_t last = 1 + (uint64_t)L;
  braid__prange P = {count, n, p, 1};
  braid__req *rq[2] = {0};
  braid_status st;

  /* copy: the own block goes to its place while the first transfer runs.
     A rank that is neither an extra nor a proxy for one sends exactly its
     own block in the first exchange, so that exchange sends from send. */
  char *mine = braid__at(recv, (size_t)r * count, esz);
  if (q < 0) {
    if ((st = braid__algo_send(c, send, count, dt, peer, 0, &rq[0]))) goto fail;
    if (copy) memcpy(mine, send, count * esz);
    if ((st = braid__waitall(c, rq, 1))) goto fail;
    /* the result except this rank's own block, which is in place */
    size_t own = (size_t)r * count;
    if ((st = braid__algo_recv(c, recv, own, dt, peer, last, &rq[0])) ||
        (st = braid__algo_recv(c, braid__at(recv, own + count, esz), total - own - count, dt, peer, last,
                               &rq[1])) ||
        (st = braid__waitall(c, rq, 2)))
      goto fail;
    return BRAID_OK;
  }
  if (peer >= 0) {
    if ((st = braid__algo_recv(c, braid__at(recv, (size_t)peer * count, esz), count, dt, peer, 0, &rq[0])))
      goto fail;
    if (copy) memcpy(mine, send, count * esz), copy = 0;
    if ((st = braid__waitall(c, rq, 1))) goto fail;
  }
  for (int i = 0; i < L; i++) {
    braid__xchg x = braid__rhd_doubling(q, p, i);
    size_t so = braid__prange_off(&P, x.send_lo), ro = braid__prange_off(&P, x.recv_lo);
    size_t sn = braid__prange_off(&P, x.send_hi) - so;
    int pr = braid__fold_rank(x.peer, n);
    /* Exactly the own block goes from send, also when it was copied
       already: the copy's lines are dirty in this core's cache, and a peer
       reading them there (single copy) measured slower than reading send. */
    const void *src = send != mine && so == (size_t)r * count && sn == count ? send : braid__cat(recv, so, esz);
    if ((st = braid__algo_post_xchg(c, src, sn, pr, braid__at(recv, ro, esz), braid__prange_off(&P, x.recv_hi) - ro,
                                    pr, dt, 1 + (uint64_t)i, &rq[1], &rq[0])))
      goto fail;
    if (copy) memcpy(mine, send, count * esz), copy = 0;
    if ((st = braid__waitall(c, rq, 2))) goto fail;
  }
  if (peer >= 0) {
    size_t theirs = (size_t)peer * count;
    if ((st = braid__algo_send(c, recv, theirs, dt, peer, last, &rq[0])) ||
        (st = braid__algo_send(c, braid__cat(recv, theirs + count, esz), total - theirs - count, dt, peer, last,
                               &rq[1])) ||
        (st = braid__waitall(c, rq, 2)))
      goto fail;
  }
  return BRAID_OK;

fail:
  braid__algo_drain(c, rq, 2);
  return st;
}

braid_status braid__algo_all_gather(braid_comm *c, int algo, const void *send, void *recv, size_t count,
                                    braid_dtype dt) {
  const int n = c->size;
  const size_t bytes = count * braid_dtype_size(dt);
  if (algo == BRAID__ALGO_AUTO) algo = braid__algo_select(BRAID__COLL_ALL_GATHER, bytes, n);
  if (!braid__algo_supports(BRAID__COLL_ALL_GATHER, algo) || algo == BRAID__ALGO_NATIVE)
    return braid__algo_refuse(c, BRAID__COLL_ALL_GATHER, algo);
  char *mine = (char *)recv + (size_t)c->rank * bytes;
  /* Ring and recursive doubling copy an out-of-place own block of up to
     AG_OVERLAP_MAX bytes themselves, while their first transfer runs;
     larger ones are copied first, which measured faster (the copy and the
     transfer then compete for memory bandwidth). */
  int overlap = send != mine && n > 1 && algo != BRAID__ALGO_BRUCK && bytes <= AG_OVERLAP_MAX;
  if (send != mine && !overlap) memcpy(mine, send, bytes);
  if (n == 1) return BRAID_OK;
  switch (algo) {
    case BRAID__ALGO_RING: return ag_ring(c, send, recv, count, dt, overlap);
    case BRAID__ALGO_BRUCK: return ag_bruck(c, send, recv, count, dt);
    default: return ag_rd(c, send, recv, count, dt, overlap);
  }
}
