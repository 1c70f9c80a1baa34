/* Reduce-scatter: send holds count*n elements, rank r gets the reduction of
   everyone's block r. Ring (pipelined, bandwidth-optimal, n-1 steps) and
   recursive halving with folding (log2 steps, for small blocks). Both
   reduce every block in one place, in the accumulator format, and round
   once when the block is stored. The send buffer is only read; in place
   (recv == send + r*count) only block r is written, at the end. */
#include "algos/internal.h"

/* Chunk k of block b in a ring that cuts every block into C chunks:
   offset from the block's start and length. */
static void ring_chunk(const braid__blocks *B, size_t C, int b, size_t k, size_t *off, size_t *len) {
  size_t bl = braid__blk_len(B, b);
  *off = braid__part_off(bl, (int)C, (int)k);
  *len = braid__part_len(bl, (int)C, (int)k);
}

/*
 * Units u = s*C + k (step s = 0..n-2, chunk k) run in order. Unit u
 * receives chunk k of block rs_recv_block(s) from prev, combines it with
 * this rank's contribution, and sends the result on as unit u + C (step
 * s+1). Receives are posted WINDOW units ahead, so the next chunks arrive
 * while this one is reduced, and a chunk leaves as soon as it is reduced.
 *
 * Where partials live:
 *  - in place (writable local, direct dtype): received chunks land in
 *    WINDOW slots and are combined into local, which the next send reads;
 *  - otherwise in nb block buffers of the accumulator format, one per step
 *    in rotation (step s in buffer (s+1) % nb; buffer 0 also holds the
 *    widened step-0 data of low-precision dtypes), chunk k at k * cmax
 *    whatever the block's length; chunks are received straight into them
 *    and combined with local there.
 * A buffer chunk receives again only after the unit that used it was
 * processed (nb*C >= WINDOW) and the send that read it completed.
 *
 * A rank waits only for receives, and for sends whose matching receive the
 * peer posts while it works on a unit earlier than the waiting rank's
 * current one. By induction over the units no cycle of waits can form,
 * even when a send completes only once it is matched.
 */
typedef struct rs_state {
  braid_comm *c;
  const braid__red *R;
  const braid__blocks *B;
  size_t C, cmax, nb, bufsz;
  int inplace, prev;
  char *acc;
  uint64_t step0;
  braid__req **rq, **sq;
} rs_state;

static braid_status rs_post_recv(const rs_state *g, size_t v) {
  const braid__red *R = g->R;
  size_t sv = v / g->C, kv = v % g->C, off, len;
  int rb = braid__ring_rs_recv_block(g->c->rank, g->c->size, (int)sv);
  ring_chunk(g->B, g->C, rb, kv, &off, &len);
  void *dst;
  if (g->inplace) {
    dst = g->acc + (v % BRAID__WINDOW) * g->cmax * R->asz;
  } else {
    size_t b = (sv + 1) % g->nb;
    braid_status st = braid__waitall(g->c, &g->sq[b * g->C + kv], 1);
    if (st) return st;
    dst = g->acc + b * g->bufsz + kv * g->cmax * R->asz;
  }
  return braid__algo_recv(g->c, dst, len, R->adt, g->prev, g->step0 + sv, &g->rq[v % BRAID__WINDOW]);
}

braid_status braid__ring_rs(braid_comm *c, const braid__red *R, const braid__blocks *B, const void *local,
                            int writable, void *out, uint64_t step0) {
  enum { MAXREQ = 2 * BRAID__RING_MAX_CHUNKS + BRAID__WINDOW };
  const int n = c->size, r = c->rank, next = braid__ring_next(r, n);
  const size_t maxlen = braid__blk_len(B, 0);
  braid__req *rq[BRAID__WINDOW] = {0}, *sq[MAXREQ] = {0};
  rs_state g = {c, R, B, 0, 0, 0, 0, writable && !R->lp, braid__ring_prev(r, n), NULL, step0, rq, sq};
  g.C = braid__chunk_num(maxlen, BRAID__RING_CHUNK_BYTES / R->asz, BRAID__RING_MAX_CHUNKS);
  g.cmax = braid__part_len(maxlen, (int)g.C, 0);
  g.bufsz = g.C * g.cmax * R->asz;
  g.nb = 2 + BRAID__WINDOW / g.C;
  if (g.nb > (size_t)n) g.nb = (size_t)n;
  const size_t C = g.C, U = (size_t)(n - 1) * C, nsq = g.nb * C;
  g.acc = braid__scratch(c, 0, g.inplace ? BRAID__WINDOW * g.cmax * R->asz : g.nb * g.bufsz);
  if (!g.acc) return BRAID_ERR_NO_MEMORY;

  braid_status st = BRAID_OK;
  size_t off, len;
  /* Step 0: this rank's own contribution to block r-1. */
  int b0 = braid__ring_rs_send_block(r, n, 0);
  for (size_t k = 0; k < C; k++) {
    ring_chunk(B, C, b0, k, &off, &len);
    const void *src = braid__cat(local, braid__blk_off(B, b0) + off, R->esz);
    if (R->lp && len) {
      char *a = g.acc + k * g.cmax * R->asz;
      braid__acc_load(a, src, len, R->dt);
      src = a;
    }
    if ((st = braid__algo_send(c, src, len, R->adt, next, step0, &sq[k]))) goto fail;
  }
  for (size_t v = 0; v < U && v < BRAID__WINDOW; v++)
    if ((st = rs_post_recv(&g, v))) goto fail;

  for (size_t u = 0; u < U; u++) {
    const size_t s = u / C, k = u % C;
    const int last = s == (size_t)n - 2, rb = braid__ring_rs_recv_block(r, n, (int)s);
    if ((st = braid__waitall(c, &rq[u % BRAID__WINDOW], 1))) goto fail;
    ring_chunk(B, C, rb, k, &off, &len);
    /* an empty chunk (of a short block): nothing came and nothing goes on */
    if (len) {
      const char *mine = braid__cat(local, braid__blk_off(B, rb) + off, R->esz);
      const void *fwd;
      if (g.inplace) {
        char *lp = (char *)mine;
        const char *slot = g.acc + (u % BRAID__WINDOW) * g.cmax * R->asz;
        if (last) {
          const void *srcs[2] = {lp, slot};
          braid__reduce(lp, srcs, 2, len, R->dt, R->op, R->ndiv);
        } else {
          braid__acc_combine(lp, slot, len, R->dt, R->op);
        }
        fwd = lp;
      } else {
        char *a = g.acc + ((s + 1) % g.nb) * g.bufsz + k * g.cmax * R->asz;
        if (last && !R->lp) {
          const void *srcs[2] = {a, mine};
          braid__reduce(braid__at(out, off, R->esz), srcs, 2, len, R->dt, R->op, R->ndiv);
        } else {
          braid__acc_reduce(a, mine, len, R->dt, R->op);
          if (last) braid__acc_store(braid__at(out, off, R->esz), a, len, R->dt, R->op, R->ndiv);
        }
        fwd = a;
      }
      if (!last) {
        size_t idx = ((s + 1) % g.nb) * C + k;
        if ((st = braid__waitall(c, &sq[idx], 1))) goto fail;
        if ((st = braid__algo_send(c, fwd, len, R->adt, next, step0 + s + 1, &sq[idx]))) goto fail;
      }
    }
    if (u + BRAID__WINDOW < U && (st = rs_post_recv(&g, u + BRAID__WINDOW))) goto fail;
  }
  if ((st = braid__waitall(c, sq, (int)nsq))) goto fail;
  return BRAID_OK;

fail:
  braid__algo_drain(c, rq, BRAID__WINDOW);
  braid__algo_drain(c, sq, (int)nsq);
  return st;
}

/*
 * Until a proxy holds partials of its own (folding, or the first halving
 * step), its data is local in the dtype: the half it sends is local itself
 * (widened first for low-precision dtypes) and the peer's half is received
 * straight into work and combined with local there. From then on partials
 * are in work: the peer's half arrives in tmp and is combined into work.
 * Every element is reduced at exactly one proxy per step, so the operand
 * order does not have to match between ranks.
 */
braid_status braid__rhd_reduce(braid_comm *c, const braid__red *R, const braid__prange *P, size_t total,
                               const void *local, void *work, void *tmp, int near, uint64_t step0) {
  const int n = c->size, r = c->rank, p = P->p, L = braid__log2_floor(p);
  const int q = braid__fold_proxy(r, n), peer = braid__fold_peer(r, n);
  const size_t esz = R->esz, asz = R->asz;
  int have = work == local; /* partials are in work */
  braid_status st;

  if (q < 0) return braid__algo_xfer(c, 1, (void *)local, total, R->dt, peer, step0);
  if (peer >= 0) {
    if (have) { /* local is the writable work vector: mine op extra's */
      if ((st = braid__algo_xfer(c, 0, tmp, total, R->dt, peer, step0))) return st;
      braid__acc_combine(work, tmp, total, R->dt, R->op);
    } else if (!R->lp) { /* extra's op mine, received in place */
      if ((st = braid__algo_xfer(c, 0, work, total, R->dt, peer, step0))) return st;
      braid__acc_reduce(work, local, total, R->dt, R->op);
    } else { /* widen(mine) op widen(extra's) */
      if ((st = braid__algo_xfer(c, 0, tmp, total, R->dt, peer, step0))) return st;
      braid__acc_load(work, local, total, R->dt);
      braid__acc_reduce(work, tmp, total, R->dt, R->op);
    }
    have = 1;
  }
  for (int i = 0; i < L; i++) {
    braid__xchg x = near ? braid__rhd_halving_near(q, p, i) : braid__rhd_halving(q, p, i);
    size_t so = braid__prange_off(P, x.send_lo), sl = braid__prange_off(P, x.send_hi) - so;
    size_t ro = braid__prange_off(P, x.recv_lo), rl = braid__prange_off(P, x.recv_hi) - ro;
    int pr = braid__fold_rank(x.peer, n);
    char *wr = braid__at(work, ro, asz);
    const void *sbuf;
    void *rbuf;
    if (have) {
      sbuf = braid__at(work, so, asz);
      rbuf = tmp;
    } else {
      sbuf = braid__cat(local, so, esz);
      if (R->lp) {
        braid__acc_load(braid__at(work, so, asz), sbuf, sl, R->dt);
        sbuf = braid__at(work, so, asz);
      }
      rbuf = wr;
    }
    if ((st = braid__algo_sendrecv(c, sbuf, sl, pr, rbuf, rl, pr, R->adt, step0 + 1 + (uint64_t)i))) return st;
    if (have)
      braid__acc_combine(wr, tmp, rl, R->dt, R->op);
    else
      braid__acc_reduce(wr, braid__cat(local, ro, esz), rl, R->dt, R->op);
    have = 1;
  }
  return BRAID_OK;
}

static braid_status rs_ring(braid_comm *c, const void *send, void *recv, size_t count, const braid__red *R) {
  braid__blocks B = {count * (size_t)c->size, count, c->size};
  return braid__ring_rs(c, R, &B, send, 0, recv, 0);
}

/* Proxies end holding the blocks of the ranks they speak for; an extra's
   block is stored in the dtype and sent to it. */
static braid_status rs_rhd(braid_comm *c, const void *send, void *recv, size_t count, const braid__red *R) {
  const int n = c->size, r = c->rank, p = braid__pow2_floor(n), L = braid__log2_floor(p);
  const size_t total = count * (size_t)n, asz = R->asz;
  braid__prange P = {count, n, p, 1};
  char *work = braid__scratch(c, 0, total * asz);
  char *tmp = work ? braid__scratch(c, 1, total * asz) : NULL;
  if (!tmp) return BRAID_ERR_NO_MEMORY;
  braid_status st = braid__rhd_reduce(c, R, &P, total, send, work, tmp, 0, 0);
  if (st) return st;
  const int peer = braid__fold_peer(r, n);
  const uint64_t last = 1 + (uint64_t)L;
  if (braid__fold_proxy(r, n) < 0) return braid__algo_xfer(c, 0, recv, count, R->dt, peer, last);
  braid__req *q = NULL;
  if (peer >= 0) {
    char *w = braid__at(work, (size_t)peer * count, asz);
    void *out = w;
    if (R->lp) {
      out = tmp;
      braid__acc_store(out, w, count, R->dt, R->op, R->ndiv);
    } else if (R->op == BRAID_AVG) {
      braid__acc_store(w, w, count, R->dt, R->op, R->ndiv);
    }
    if ((st = braid__algo_send(c, out, count, R->dt, peer, last, &q))) {
      braid__algo_drain(c, &q, 1);
      return st;
    }
  }
  braid__acc_store(recv, braid__at(work, (size_t)r * count, asz), count, R->dt, R->op, R->ndiv);
  return braid__waitall(c, &q, 1);
}

braid_status braid__algo_reduce_scatter(braid_comm *c, int algo, const void *send, void *recv, size_t count,
                                        braid_dtype dt, braid_op op) {
  const int n = c->size;
  if (algo == BRAID__ALGO_AUTO)
    algo = braid__algo_select(BRAID__COLL_REDUCE_SCATTER, count * braid_dtype_size(dt), n);
  if (!braid__algo_supports(BRAID__COLL_REDUCE_SCATTER, algo) || algo == BRAID__ALGO_NATIVE)
    return braid__algo_refuse(c, BRAID__COLL_REDUCE_SCATTER, algo);
  if (n == 1) { /* a copy (bool normalized), nothing when in place */
    braid__reduce(recv, &send, 1, count, dt, op, 1);
    return BRAID_OK;
  }
  braid__red R = braid__red_make(dt, op, n);
  return algo == BRAID__ALGO_RING ? rs_ring(c, send, recv, count, &R) : rs_rhd(c, send, recv, count, &R);
}
