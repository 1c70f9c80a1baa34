/* hier: collectives composed of the parts' own calls. With every node
   holding L ranks, an all-reduce is the 2-D scheme of Megatron-LM and
   DeepSpeed: a node-local reduce-scatter into L shards, an all-reduce of
   shard l across nodes by the ranks with local rank l (every local rank
   sends at once, each on its own rail), and a node-local all-gather. The
   other collectives compose the same way; shapes the 2-D schemes do not
   fit (nodes of different sizes) take correct, simpler compositions. A
   part's failure fails hier with the part's sentence. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/hier/hier.h"
#include "core/dtype.h"
#include "core/reduce.h"

static const char *part_name(const hier_state *s, const braid_comm *p) {
  return p == s->intra ? "node-local" : p == s->flat ? "flat" : "between-nodes";
}

braid_status hier_sub_failed(braid_comm *c, braid_comm *sub, braid_status st) {
  hier_state *s = c->be;
  /* hier failed first (a part's wait found hier's mismatch, or another
     rank's failure in hier's place in the store): its sentence stands. */
  if (atomic_load(&c->failed)) return (braid_status)atomic_load(&c->failed);
  char text[BRAID_ERRLEN];
  pthread_mutex_lock(&sub->err_lock);
  snprintf(text, sizeof text, "%s", sub->fatal_text[0] ? sub->fatal_text : sub->last_error);
  pthread_mutex_unlock(&sub->err_lock);
  if (st == BRAID_ERR_MISMATCH)
    return braid__fail_comm(c, st, "#%llu: the ranks made different calls (found in the %s part: %s)",
                            (unsigned long long)c->seq, part_name(s, sub), text);
  /* A failed part, its library's error (a CUDA fault the part reports
     without failing), or a stage that ran short of memory midway: the
     ranks are in different places, hier fails. */
  if (braid__status_is_fatal(st) || atomic_load(&sub->failed) || st == BRAID_ERR_NO_MEMORY || st == BRAID_ERR_BACKEND)
    return braid__fail_comm(c, st, "in the %s part: %s", part_name(s, sub), text);
  /* Every rank's part refuses the same dtype or op (nccl's reductions). */
  if (st == BRAID_ERR_UNSUPPORTED) return braid__fail(c, st, "the %s part: %s", part_name(s, sub), text);
  /* A part refuses only what hier computed wrongly: the ranks now differ. */
  return braid__fail_comm(c, BRAID_ERR_INTERNAL, "the %s part refused a call: %s", part_name(s, sub), text);
}


/* AVG: the parts sum; the world size divides once at the end. */
static braid_op stage_op(braid_op op) { return op == BRAID_AVG ? BRAID_SUM : op; }

/* The composition of an all-reduce with op (AVG already turned into SUM). */
static braid_status all_reduce_parts(braid_comm *c, char *buf, size_t count, braid_dtype dt, braid_op op) {
  hier_state *s = c->be;
  size_t es = braid_dtype_size(dt);
  if (s->lsize == 1 && s->uniform) {
    PART(s->rail, braid_all_reduce(s->rail, buf, count, dt, op));
    return BRAID_OK;
  }
  if (s->uniform) {
    size_t L = (size_t)s->lsize, q = count / L, r = count % L;
    if (q) {
      char *mine = buf + (size_t)s->lrank * q * es;
      PART(s->intra, braid_reduce_scatter(s->intra, buf, mine, q, dt, op));
      PART(s->rail, braid_all_reduce(s->rail, mine, q, dt, op));
      PART(s->intra, braid_all_gather(s->intra, mine, buf, q, dt));
    }
    if (r) { /* the last count % L elements: too few to shard */
      char *tail = buf + L * q * es;
      PART(s->intra, braid_all_reduce(s->intra, tail, r, dt, op));
      PART(s->rail, braid_all_reduce(s->rail, tail, r, dt, op));
    }
    return BRAID_OK;
  }
  /* Nodes of different sizes: every local rank holds its node's result;
     the ranks with local rank l < lmin (present on every node) reduce shard
     l across nodes in parallel, and each shard's owner gives it to its
     node. */
  PART(s->intra, braid_all_reduce(s->intra, buf, count, dt, op));
  size_t S = (size_t)s->lmin;
  for (size_t l = 0; l < S; l++) {
    size_t off = l * (count / S) + (l < count % S ? l : count % S), len = count / S + (l < count % S ? 1 : 0);
    if (!len) continue;
    if ((size_t)s->lrank == l) PART(s->rail, braid_all_reduce(s->rail, buf + off * es, len, dt, op));
    PART(s->intra, braid_broadcast(s->intra, buf + off * es, len, dt, (int)l));
  }
  return BRAID_OK;
}

/* Low-precision types go through the stages as f32 and are rounded once
   at the end, as braid's reductions are everywhere (the inter-node bytes
   double for f16/bf16); AVG sums and divides once by the world size. */
braid_status hier_all_reduce(braid_comm *c, void *vbuf, size_t count, braid_dtype dt, braid_op op) {
  hier_state *s = c->be;
  char *buf = vbuf;
  if (s->nnodes == 1) {
    PART(s->intra, braid_all_reduce(s->intra, buf, count, dt, op));
    return BRAID_OK;
  }
  braid_op sop = stage_op(op);
  if (braid__acc_size(dt) != braid_dtype_size(dt)) {
    char *w = braid__scratch(c, 2, count * braid__acc_size(dt));
    if (!w) return BRAID_ERR_NO_MEMORY;
    braid__acc_load(w, buf, count, dt);
    braid_status st = all_reduce_parts(c, w, count, BRAID_F32, sop);
    if (st) return st;
    braid__acc_store(buf, w, count, dt, op, op == BRAID_AVG ? c->size : 1);
    return BRAID_OK;
  }
  braid_status st = all_reduce_parts(c, buf, count, dt, sop);
  if (!st && op == BRAID_AVG) braid__reduce_avg_finalize(buf, count, dt, c->size);
  return st;
}

braid_status hier_broadcast(braid_comm *c, void *vbuf, size_t count, braid_dtype dt, int root) {
  hier_state *s = c->be;
  char *buf = vbuf;
  if (s->nnodes == 1) {
    PART(s->intra, braid_broadcast(s->intra, buf, count, dt, root));
    return BRAID_OK;
  }
  int rnode = s->node_of[root], rlocal = s->local_of[root];
  size_t es = braid_dtype_size(dt), L = (size_t)s->lsize;
  /* Every rank of the root's node gets the data first. */
  if (s->node == rnode) PART(s->intra, braid_broadcast(s->intra, buf, count, dt, rlocal));
  if (s->uniform && L > 1 && count >= L) {
    /* Large and even: shard l crosses on rail l, the node reassembles. */
    size_t q = count / L, r = count % L;
    char *mine = buf + (size_t)s->lrank * q * es;
    PART(s->rail, braid_broadcast(s->rail, mine, q, dt, rnode));
    if (r && s->lrank == 0) PART(s->rail, braid_broadcast(s->rail, buf + L * q * es, r, dt, rnode));
    if (s->node != rnode) {
      PART(s->intra, braid_all_gather(s->intra, mine, buf, q, dt));
      if (r) PART(s->intra, braid_broadcast(s->intra, buf + L * q * es, r, dt, 0));
    }
    return BRAID_OK;
  }
  /* Local rank 0 of every node carries it across (rail 0 holds every node's
     local rank 0, in node order), then each node spreads it. */
  if (s->lrank == 0) PART(s->rail0, braid_broadcast(s->rail0, buf, count, dt, rnode));
  if (s->node != rnode) PART(s->intra, braid_broadcast(s->intra, buf, count, dt, 0));
  return BRAID_OK;
}

braid_status hier_all_gather(braid_comm *c, const void *send, void *vrecv, size_t count, braid_dtype dt) {
  hier_state *s = c->be;
  char *recv = vrecv;
  size_t es = braid_dtype_size(dt), bytes = count * es;
  if (s->nnodes == 1) {
    /* One node: intra ranks are hier ranks in order. */
    PART(s->intra, braid_all_gather(s->intra, send, recv, count, dt));
    return BRAID_OK;
  }
  if (!s->uniform) {
    PART(s->flat, braid_all_gather(s->flat, send, recv, count, dt));
    return BRAID_OK;
  }
  /* Rail l gathers local rank l's blocks of every node; the node then
     gathers the rails' results: block (node j, local l) lands at
     scratch[(l * N + j)], then in its rank's place. */
  size_t N = (size_t)s->nnodes, L = (size_t)s->lsize;
  char *scratch = braid__scratch(c, 0, bytes * N * L);
  if (!scratch) return BRAID_ERR_NO_MEMORY;
  char *rail_out = scratch + (size_t)s->lrank * N * bytes;
  PART(s->rail, braid_all_gather(s->rail, send, rail_out, count, dt));
  PART(s->intra, braid_all_gather(s->intra, rail_out, scratch, count * N, dt));
  for (size_t l = 0; l < L; l++)
    for (size_t j = 0; j < N; j++) {
      int r = s->rank_at[j * L + l];
      char *dst = recv + (size_t)r * bytes;
      const char *src = scratch + (l * N + j) * bytes;
      if (dst != src) memcpy(dst, src, bytes);
    }
  return BRAID_OK;
}

braid_status hier_reduce_scatter(braid_comm *c, const void *vsend, void *recv, size_t count, braid_dtype dt,
                                 braid_op op) {
  hier_state *s = c->be;
  const char *send = vsend;
  size_t es = braid_dtype_size(dt), bytes = count * es;
  if (s->nnodes == 1) {
    PART(s->intra, braid_reduce_scatter(s->intra, send, recv, count, dt, op));
    return BRAID_OK;
  }
  if (!s->uniform) {
    PART(s->flat, braid_reduce_scatter(s->flat, send, recv, count, dt, op));
    return BRAID_OK;
  }
  /* The blocks in (local rank, node) order; the node reduces each local
     rank's N blocks to it, then rail l reduces block (node j, local l) to
     node j. The send buffer is only read. Low-precision types travel as
     f32 and are rounded once (see hier_all_reduce). */
  size_t N = (size_t)s->nnodes, L = (size_t)s->lsize;
  int lp = braid__acc_size(dt) != es;
  braid_dtype wdt = lp ? BRAID_F32 : dt;
  size_t wb = count * braid__acc_size(dt);
  char *perm = braid__scratch(c, 0, wb * N * L);
  char *part = braid__scratch(c, 1, wb * N);
  char *out = lp ? braid__scratch(c, 2, wb) : recv;
  if (!perm || !part || !out) return BRAID_ERR_NO_MEMORY;
  for (size_t l = 0; l < L; l++)
    for (size_t j = 0; j < N; j++) {
      const char *from = send + (size_t)s->rank_at[j * L + l] * bytes;
      if (lp) braid__acc_load(perm + (l * N + j) * wb, from, count, dt);
      else memcpy(perm + (l * N + j) * wb, from, bytes);
    }
  braid_op sop = stage_op(op);
  PART(s->intra, braid_reduce_scatter(s->intra, perm, part, count * N, wdt, sop));
  PART(s->rail, braid_reduce_scatter(s->rail, part, out, count, wdt, sop));
  if (lp) braid__acc_store(recv, out, count, dt, op, op == BRAID_AVG ? c->size : 1);
  else if (op == BRAID_AVG) braid__reduce_avg_finalize(recv, count, dt, c->size);
  return BRAID_OK;
}

braid_status hier_barrier(braid_comm *c) {
  hier_state *s = c->be;
  PART(s->intra, braid_barrier(s->intra));
  if (s->nnodes == 1) return BRAID_OK;
  if (s->rail0) PART(s->rail0, braid_barrier(s->rail0));
  PART(s->intra, braid_barrier(s->intra));
  return BRAID_OK;
}
