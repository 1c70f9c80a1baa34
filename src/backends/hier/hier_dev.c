/* hier over a node part that keeps buffers in device memory (nccl): the
   node-local stages run on the device, on the node part's stream; the
   between-node stages run on host copies. A stage that needs the device's
   data on the host enqueues the copy and waits for the stream; the last
   copy back and the last node-local stage are left on the stream, and
   braid_sync (or an event on the communication stream) waits for them. The
   compositions are those of hier_coll.c; the rooted calls and all-to-all(v)
   go through the host over the flat part. See docs/HIER.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/hier/hier.h"
#include "core/dtype.h"
#include "core/reduce.h"

/* ---------------------------------------------------------------- the node part's stream */

/* Runs expr on the node part p with hier's call name, under p's lock. */
#define ON_NODE(c, p, expr)                 \
  do {                                      \
    pthread_mutex_lock(&(p)->lock);         \
    (p)->call = (c)->call;                  \
    st = (expr);                            \
    (p)->call = NULL;                       \
    pthread_mutex_unlock(&(p)->lock);       \
  } while (0)

/* hier's work is in flight on the node part: braid_sync waits for it. */
static void in_flight(braid_comm *c) {
  hier_state *s = c->be;
  if (!s->dev_busy && s->intra->npending) {
    s->dev_busy = 1;
    c->npending++;
  }
}

/* A copy of 0 bytes enqueues nothing but still puts the node part's
   queued sends and receives on its stream first. */
braid_status hier_dev_copy(braid_comm *c, void *dst, const void *src, size_t bytes, braid__copy_dir dir) {
  hier_state *s = c->be;
  braid_comm *p = s->intra;
  braid_status st;
  ON_NODE(c, p, p->ops->copy(p, dst, src, bytes, dir));
  if (st) return hier_sub_failed(c, p, st);
  if (bytes) in_flight(c);
  return BRAID_OK;
}

/* Host copies the stream may still read, freed once it is idle. */
typedef struct later {
  struct later *next;
  void *host;
} later;

void hier_dev_free_later(braid_comm *c, void *host) {
  hier_state *s = c->be;
  later *l = malloc(sizeof *l);
  if (!l) { /* no room to remember it: wait for the stream instead */
    if (!hier_dev_drain(c)) free(host);
    return;
  }
  l->host = host;
  l->next = s->later;
  s->later = l;
}

/* The stream has run everything enqueued: what it read can go. */
void hier_dev_idle(braid_comm *c) {
  hier_state *s = c->be;
  s->stage_busy = 0;
  while (s->later) {
    later *l = s->later;
    s->later = l->next;
    free(l->host);
    free(l);
  }
}

braid_status hier_dev_drain(braid_comm *c) {
  hier_state *s = c->be;
  braid_comm *p = s->intra;
  braid_status st;
  ON_NODE(c, p, p->ops->stream->sync_comm_stream(p));
  if (st) return hier_sub_failed(c, p, st);
  hier_dev_idle(c);
  return BRAID_OK;
}

/* Before a collective (or an event or wait on the communication stream):
   staged receives posted earlier reach the stream first, as on the node
   part, and so do the node part's queued sends and receives. */
static braid_status begin(braid_comm *c) {
  braid_status st = hier_dev_order(c, NULL, 0);
  return st ? st : hier_dev_copy(c, NULL, NULL, 0, BRAID__COPY_D2D);
}

static braid_status d2h(braid_comm *c, void *h, const void *d, size_t bytes) {
  ((hier_state *)c->be)->stage_busy = 1;
  return hier_dev_copy(c, h, d, bytes, BRAID__COPY_D2H);
}

static braid_status h2d(braid_comm *c, void *d, const void *h, size_t bytes) {
  ((hier_state *)c->be)->stage_busy = 1;
  return hier_dev_copy(c, d, h, bytes, BRAID__COPY_H2D);
}

/* Frees the staging (the stream no longer reads it). */
static void stage_release(braid_comm *c) {
  hier_state *s = c->be;
  braid_comm *p = s->intra;
  if (s->stage && s->stage_pinned) {
    pthread_mutex_lock(&p->lock);
    p->ops->host_free(p, s->stage);
    pthread_mutex_unlock(&p->lock);
  } else {
    free(s->stage);
  }
  s->stage = NULL;
  s->stage_len = 0;
}

/* Host staging of at least bytes, free for the host to write: a copy the
   last call left on the stream has run. */
static braid_status stage(braid_comm *c, size_t bytes, char **out) {
  hier_state *s = c->be;
  braid_status st;
  if (s->stage_busy && (st = hier_dev_drain(c))) return st;
  if (bytes > s->stage_len) {
    stage_release(c);
    braid_comm *p = s->intra;
    void *m = NULL;
    if (p->ops->host_alloc) {
      ON_NODE(c, p, p->ops->host_alloc(p, &m, bytes));
      if (st) m = NULL; /* pageable memory works too, only slower */
    }
    s->stage_pinned = m != NULL;
    /* Other ranks may already be in this call's stages: hier fails. */
    if (!m && !(m = malloc(bytes)))
      return braid__fail_comm(c, BRAID_ERR_NO_MEMORY, "out of memory for %zu bytes of host staging", bytes);
    s->stage = m;
    s->stage_len = bytes;
  }
  *out = s->stage;
  return BRAID_OK;
}

/* Frees the device scratch (the stream no longer reads it). */
static braid_status dscratch_release(braid_comm *c) {
  hier_state *s = c->be;
  braid_comm *p = s->intra;
  braid_status st = BRAID_OK;
  if (s->dscratch) ON_NODE(c, p, p->ops->mem_free(p, s->dscratch));
  s->dscratch = NULL;
  s->dscratch_len = 0;
  return st;
}

/* Device scratch of at least bytes; the old one is freed once the stream
   no longer reads it. */
static braid_status dscratch(braid_comm *c, size_t bytes, char **out) {
  hier_state *s = c->be;
  braid_comm *p = s->intra;
  braid_status st = BRAID_OK;
  if (bytes > s->dscratch_len) {
    if (s->dscratch && (st = hier_dev_drain(c))) return st;
    if ((st = dscratch_release(c))) return hier_sub_failed(c, p, st);
    ON_NODE(c, p, p->ops->mem_alloc(p, &s->dscratch, bytes));
    if (st) return hier_sub_failed(c, p, st);
    s->dscratch_len = bytes;
  }
  *out = s->dscratch;
  return BRAID_OK;
}

/* Staging and scratch go once the stream has run everything; a failed
   communicator's stream may still hold copies behind a stuck NCCL call
   (until the node part is aborted), so then they are left allocated, as
   the nccl backend leaves its own memory. */
void hier_dev_free(braid_comm *c) {
  hier_state *s = c->be;
  braid_comm *p = s->intra;
  if (!p) return;
  /* CUDA releases an event that work still references once it completes. */
  pthread_mutex_lock(&p->lock);
  for (int i = 0; i < s->nev; i++) p->ops->stream->event_destroy(p, s->ev[i]);
  pthread_mutex_unlock(&p->lock);
  s->nev = 0;
  if (!atomic_load(&c->failed) && !hier_dev_drain(c)) { /* idle: the drain freed the later copies */
    dscratch_release(c);
    stage_release(c);
    return;
  }
  size_t n = s->stage_len + s->dscratch_len;
  for (later *l = s->later; l; l = l->next) n++;
  if (n)
    BLOG_WARN(BRAID_SUB_INIT, c->rank, "%s: the node part's stream did not finish; %zu bytes of staging are left allocated",
              c->call ? c->call : "braid_destroy", n);
  while (s->later) { /* the records go, the copies they name stay */
    later *l = s->later;
    s->later = l->next;
    free(l);
  }
  s->stage = NULL;
  s->dscratch = NULL;
  s->stage_len = s->dscratch_len = 0;
}

/* ---------------------------------------------------------------- ops of the stages */

/* The op of hier's call as part p runs it: a scaled sum is made on p for
   the call (*made); AVG stays AVG when p's result is final (keep_avg) and
   is summed otherwise, hier dividing once at the end. */
static braid_status part_op(braid_comm *c, braid_comm *p, braid_op op, int keep_avg, braid_op *out, int *made) {
  const braid__premul *pm = braid__premul_of(c, op);
  *made = 0;
  *out = op == BRAID_AVG && !keep_avg ? BRAID_SUM : op;
  if (!pm) return BRAID_OK;
  braid_status st = braid_op_premul_sum(p, pm->scalar, (braid_dtype)pm->dt, out);
  if (st) return hier_sub_failed(c, p, st);
  *made = 1;
  return BRAID_OK;
}

static void part_op_done(braid_comm *p, braid_op op, int made) {
  if (made) braid_op_destroy(p, op);
}

/* A between-node reduction of host data across sub: an all-reduce of h
   (count elements), or with scatter a reduce-scatter of h (count * size
   elements) into out. op: the stage's op (a sum for AVG and scaled sums);
   scalar: a scaled sum's scalar still to apply (no node stage applied it);
   avg: divide by hier's size. Low-precision types travel as f32 and are
   rounded once, as everywhere in braid. */
static braid_status host_reduce(braid_comm *c, braid_comm *sub, int scatter, char *h, char *out, size_t count,
                                braid_dtype dt, braid_op op, const void *scalar, int avg) {
  size_t in = scatter ? count * (size_t)sub->size : count, es = braid_dtype_size(dt);
  int lp = braid__acc_size(dt) != es;
  braid_dtype wdt = lp ? BRAID_F32 : dt;
  size_t wes = braid_dtype_size(wdt);
  char *w = h;
  if (lp && !(w = braid__scratch(c, 2, in * wes))) return BRAID_ERR_NO_MEMORY;
  if (scalar) braid__scale(w, h, in, dt, scalar);
  else if (lp) braid__acc_load(w, h, in, dt);
  char *res = w;
  if (scatter) {
    res = lp ? w + (size_t)sub->rank * count * wes : out; /* lp: in place in the f32 copy */
    PART(sub, braid_reduce_scatter(sub, w, res, count, wdt, op));
  } else {
    PART(sub, braid_all_reduce(sub, w, count, wdt, op));
    out = h;
  }
  if (lp) braid__acc_store(out, res, count, dt, avg ? BRAID_AVG : op, avg ? c->size : 1);
  else if (avg) braid__reduce_avg_finalize(out, count, dt, c->size);
  return BRAID_OK;
}

/* ---------------------------------------------------------------- pieces */

/* A large between-node stage goes in pieces: the copies of piece k to the
   host are enqueued up to HIER_AHEAD pieces ahead, each followed by an
   event; the host waits for piece k's event alone, moves piece k between
   nodes (host) and enqueues its copies back (up), so the stream copies
   other pieces while the network carries this one. One piece: the copies
   down, a wait for the stream, the host stage, the copies up. */
typedef struct pipe_ops {
  braid_status (*down)(braid_comm *c, size_t k, void *arg); /* NULL: nothing to copy down */
  braid_status (*host)(braid_comm *c, size_t k, void *arg);
  braid_status (*up)(braid_comm *c, size_t k, void *arg); /* NULL: nothing to copy up */
  void *arg;
} pipe_ops;

#define HIER_AHEAD ((size_t)(sizeof(((hier_state *)0)->ev) / sizeof(uint64_t)))

/* Pieces of a stage over count elements, row bytes each: every rank of a
   part computes the same number (each piece is one call of the part). */
static size_t pieces(braid_comm *c, size_t count, size_t row, size_t *per) {
  hier_state *s = c->be;
  const braid__stream_ops *so = s->intra->ops->stream;
  size_t p = s->piece / row;
  *per = count;
  if (!so || !so->event_sync || !p || count / p < 2) return 1;
  *per = p;
  return (count + p - 1) / p;
}

static braid_status pipeline(braid_comm *c, size_t n, const pipe_ops *o) {
  hier_state *s = c->be;
  braid_comm *p = s->intra;
  braid_status st;
  if (n <= 1) {
    if (o->down && ((st = o->down(c, 0, o->arg)) || (st = hier_dev_drain(c)))) return st;
    if ((st = o->host(c, 0, o->arg))) return st;
    return o->up ? o->up(c, 0, o->arg) : BRAID_OK;
  }
  for (; o->down && (size_t)s->nev < HIER_AHEAD; s->nev++) {
    ON_NODE(c, p, p->ops->stream->event_create(p, &s->ev[s->nev]));
    if (st) return hier_sub_failed(c, p, st);
  }
  size_t ahead = 0;
  for (size_t k = 0; k < n; k++) {
    for (; o->down && ahead < n && ahead < k + HIER_AHEAD; ahead++) {
      if ((st = o->down(c, ahead, o->arg))) return st;
      ON_NODE(c, p, p->ops->stream->event_record_on_comm_stream(p, s->ev[ahead % HIER_AHEAD]));
      if (st) return hier_sub_failed(c, p, st);
    }
    if (o->down) {
      ON_NODE(c, p, p->ops->stream->event_sync(p, s->ev[k % HIER_AHEAD]));
      if (st) return hier_sub_failed(c, p, st);
    }
    if ((st = o->host(c, k, o->arg)) || (o->up && (st = o->up(c, k, o->arg)))) return st;
  }
  return BRAID_OK;
}

/* Piece k of total elements in pieces of per: elements [*a, *a + *len). */
static void piece_at(size_t per, size_t total, size_t k, size_t *a, size_t *len) {
  *a = k * per;
  *len = *a + per < total ? per : total - *a;
}

/* Copies elements [a, b) of the host range h, which stands for the device
   segment seg0 (n0 elements) followed by seg1, down to h or up from it. */
static braid_status copy_split(braid_comm *c, int up, char *h, char *seg0, size_t n0, char *seg1, size_t a, size_t b,
                               size_t es) {
  braid_status st = BRAID_OK;
  size_t e0 = b < n0 ? b : n0, a1 = a > n0 ? a : n0;
  if (a < e0)
    st = up ? h2d(c, seg0 + a * es, h + a * es, (e0 - a) * es) : d2h(c, h + a * es, seg0 + a * es, (e0 - a) * es);
  if (!st && a1 < b)
    st = up ? h2d(c, seg1 + (a1 - n0) * es, h + a1 * es, (b - a1) * es)
            : d2h(c, h + a1 * es, seg1 + (a1 - n0) * es, (b - a1) * es);
  return st;
}

/* ---------------------------------------------------------------- collectives */

/* A range of total elements, staged at h, for the device segments seg0
   (n0 elements) and seg1, in pieces of per: all-reduced (or broadcast from
   node root) on sub. */
typedef struct range_job {
  char *h, *seg0, *seg1;
  size_t n0, total, per, es;
  braid_comm *sub;
  braid_dtype dt;
  braid_op op;
  const void *scalar;
  int avg, root, down, up;
} range_job;

static braid_status range_down(braid_comm *c, size_t k, void *arg) {
  range_job *j = arg;
  size_t a, len;
  piece_at(j->per, j->total, k, &a, &len);
  return copy_split(c, 0, j->h, j->seg0, j->n0, j->seg1, a, a + len, j->es);
}
static braid_status range_up(braid_comm *c, size_t k, void *arg) {
  range_job *j = arg;
  size_t a, len;
  piece_at(j->per, j->total, k, &a, &len);
  return copy_split(c, 1, j->h, j->seg0, j->n0, j->seg1, a, a + len, j->es);
}
static braid_status range_reduce(braid_comm *c, size_t k, void *arg) {
  range_job *j = arg;
  size_t a, len;
  piece_at(j->per, j->total, k, &a, &len);
  char *p = j->h + a * j->es;
  return host_reduce(c, j->sub, 0, p, p, len, j->dt, j->op, j->scalar, j->avg);
}
static braid_status range_bcast(braid_comm *c, size_t k, void *arg) {
  range_job *j = arg;
  size_t a, len;
  piece_at(j->per, j->total, k, &a, &len);
  PART(j->sub, braid_broadcast(j->sub, j->h + a * j->es, len, j->dt, j->root));
  return BRAID_OK;
}

/* Stages the range and runs it in pieces. */
static braid_status range_run(braid_comm *c, range_job *j, int bcast) {
  braid_status st;
  if ((st = stage(c, j->total * j->es, &j->h))) return st;
  size_t n = pieces(c, j->total, j->es, &j->per);
  pipe_ops o = {j->down ? range_down : NULL, bcast ? range_bcast : range_reduce, j->up ? range_up : NULL, j};
  return pipeline(c, n, &o);
}

/* A node-local reduction on the device: an all-reduce of recv, or with
   scatter a reduce-scatter of send into recv. */
static braid_status node_reduce(braid_comm *c, int scatter, const void *send, void *recv, size_t count, braid_dtype dt,
                                braid_op op, int keep_avg) {
  hier_state *s = c->be;
  braid_op o;
  int made;
  braid_status st = part_op(c, s->intra, op, keep_avg, &o, &made);
  if (st) return st;
  s->intra->desc_flags = (uint16_t)(c->desc_hash | 1);
  st = scatter ? braid_reduce_scatter(s->intra, send, recv, count, dt, o) : braid_all_reduce(s->intra, recv, count, dt, o);
  s->intra->desc_flags = 0;
  part_op_done(s->intra, o, made);
  if (!st) in_flight(c);
  return st ? hier_sub_failed(c, s->intra, st) : BRAID_OK;
}

/* Every node alike: the node reduce-scatters into L shards (the last
   count % L elements, too few to shard, are reduced whole), shard and tail
   cross nodes together on this rank's rail, and the node all-gathers. One
   rank per node: the rail alone. Nodes of different sizes: the node
   reduces everything, local rank l < lmin reduces shard l across nodes and
   gives it to its node. */
static braid_status dev_all_reduce(braid_comm *c, void *vbuf, size_t count, braid_dtype dt, braid_op op) {
  hier_state *s = c->be;
  char *buf = vbuf;
  size_t es = braid_dtype_size(dt);
  braid_status st;
  if ((st = begin(c))) return st;
  if (s->nnodes == 1) return node_reduce(c, 0, NULL, buf, count, dt, op, 1);
  const braid__premul *pm = braid__premul_of(c, op);
  int avg = op == BRAID_AVG;
  braid_op rop = pm || avg ? BRAID_SUM : op;
  if (s->uniform) {
    size_t L = (size_t)s->lsize, q = count / L, r = L > 1 ? count % L : 0;
    char *mine = buf + (size_t)s->lrank * q * es, *tail = buf + L * q * es;
    if (L > 1 && q && (st = node_reduce(c, 1, buf, mine, q, dt, op, 0))) return st;
    if (r && (st = node_reduce(c, 0, NULL, tail, r, dt, op, 0))) return st;
    range_job j = {.seg0 = mine, .n0 = q, .seg1 = tail, .total = q + r, .es = es, .sub = s->rail, .dt = dt,
                   .op = rop, .scalar = L > 1 || !pm ? NULL : pm->scalar, .avg = avg, .down = 1, .up = 1};
    if ((st = range_run(c, &j, 0))) return st;
    if (L > 1 && q) PART(s->intra, braid_all_gather(s->intra, mine, buf, q, dt));
    in_flight(c);
    return BRAID_OK;
  }
  if ((st = node_reduce(c, 0, NULL, buf, count, dt, op, 0))) return st;
  size_t S = (size_t)s->lmin, l = (size_t)s->lrank;
  if (l < S) {
    size_t off = l * (count / S) + (l < count % S ? l : count % S), len = count / S + (l < count % S ? 1 : 0);
    range_job j = {.seg0 = buf + off * es, .n0 = len, .total = len, .es = es, .sub = s->rail, .dt = dt, .op = rop,
                   .avg = avg, .down = 1, .up = 1};
    if (len && (st = range_run(c, &j, 0))) return st;
  }
  for (l = 0; l < S; l++) {
    size_t off = l * (count / S) + (l < count % S ? l : count % S), len = count / S + (l < count % S ? 1 : 0);
    if (len) PART(s->intra, braid_broadcast(s->intra, buf + off * es, len, dt, (int)l));
  }
  in_flight(c);
  return BRAID_OK;
}

static braid_status dev_broadcast(braid_comm *c, void *vbuf, size_t count, braid_dtype dt, int root) {
  hier_state *s = c->be;
  char *buf = vbuf;
  braid_status st;
  if ((st = begin(c))) return st;
  if (s->nnodes == 1) {
    PART(s->intra, braid_broadcast(s->intra, buf, count, dt, root));
    in_flight(c);
    return BRAID_OK;
  }
  int rnode = s->node_of[root], home = s->node == rnode;
  size_t es = braid_dtype_size(dt), L = (size_t)s->lsize;
  if (home) PART(s->intra, braid_broadcast(s->intra, buf, count, dt, s->local_of[root]));
  if (s->uniform && L > 1 && count >= L) {
    /* Shard l crosses on rail l, the node reassembles; local rank 0 also
       carries the last count % L elements. */
    size_t q = count / L, r = s->lrank == 0 ? count % L : 0;
    char *mine = buf + (size_t)s->lrank * q * es, *tail = buf + L * q * es;
    range_job j = {.seg0 = mine, .n0 = q, .seg1 = tail, .total = q + r, .es = es, .sub = s->rail, .dt = dt,
                   .root = rnode, .down = home, .up = !home};
    if ((st = range_run(c, &j, 1))) return st;
    if (!home) {
      PART(s->intra, braid_all_gather(s->intra, mine, buf, q, dt));
      if (count % L) PART(s->intra, braid_broadcast(s->intra, tail, count % L, dt, 0));
    }
    in_flight(c);
    return BRAID_OK;
  }
  /* Local rank 0 of every node carries it across, then each node spreads it. */
  if (s->lrank == 0) {
    range_job j = {.seg0 = buf, .n0 = count, .total = count, .es = es, .sub = s->rail0, .dt = dt, .root = rnode,
                   .down = home, .up = !home};
    if ((st = range_run(c, &j, 1))) return st;
  }
  if (!home) PART(s->intra, braid_broadcast(s->intra, buf, count, dt, 0));
  in_flight(c);
  return BRAID_OK;
}

/* The rooted calls, all-to-all(v) and the shapes the 2-D schemes do not
   fit: the device data comes to the host, the flat part runs the call
   there, and the result goes back. Send and receive ranges that overlap
   (the in-place forms) share one host range. */
typedef braid_status (*flat_call)(braid_comm *flat, const void *send, void *recv, void *arg);

static braid_status staged(braid_comm *c, const void *vsend, size_t sb, void *vrecv, size_t rb, flat_call call,
                           void *arg) {
  hier_state *s = c->be;
  const char *send = vsend;
  char *recv = vrecv, *h, *hs, *hr;
  braid_status st;
  if ((st = begin(c))) return st;
  if (s->nnodes == 1) { /* the node part's own call, on the device */
    s->intra->desc_flags = (uint16_t)(c->desc_hash | 1);
    st = call(s->intra, vsend, vrecv, arg);
    s->intra->desc_flags = 0;
    if (st) return hier_sub_failed(c, s->intra, st);
    in_flight(c);
    return BRAID_OK;
  }
  if (sb && rb && send < recv + rb && recv < send + sb) {
    const char *lo = send < recv ? send : recv;
    size_t span = (size_t)((send + sb > recv + rb ? send + sb : recv + rb) - lo);
    if ((st = stage(c, span, &h))) return st;
    hs = h + (send - lo), hr = h + (recv - lo);
  } else {
    if ((st = stage(c, sb + rb, &h))) return st;
    hs = h, hr = h + sb;
  }
  if (sb && ((st = d2h(c, hs, send, sb)) || (st = hier_dev_drain(c)))) return st;
  s->flat->desc_flags = (uint16_t)(c->desc_hash | 1);
  st = call(s->flat, sb ? hs : NULL, rb ? hr : NULL, arg);
  s->flat->desc_flags = 0;
  if (st) return hier_sub_failed(c, s->flat, st);
  if (rb && (st = h2d(c, recv, hr, rb))) return st;
  in_flight(c);
  return BRAID_OK;
}

typedef struct flat_args {
  size_t count;
  braid_dtype dt;
  braid_op op;
  int root;
  const size_t *sc, *sd, *rc, *rd;
} flat_args;

static braid_status f_all_gather(braid_comm *f, const void *s, void *r, void *a) {
  flat_args *x = a;
  return braid_all_gather(f, s, r, x->count, x->dt);
}
static braid_status f_reduce_scatter(braid_comm *f, const void *s, void *r, void *a) {
  flat_args *x = a;
  return braid_reduce_scatter(f, s, r, x->count, x->dt, x->op);
}
static braid_status f_reduce(braid_comm *f, const void *s, void *r, void *a) {
  flat_args *x = a;
  return braid_reduce(f, s, r, x->count, x->dt, x->op, x->root);
}
static braid_status f_gather(braid_comm *f, const void *s, void *r, void *a) {
  flat_args *x = a;
  return braid_gather(f, s, r, x->count, x->dt, x->root);
}
static braid_status f_scatter(braid_comm *f, const void *s, void *r, void *a) {
  flat_args *x = a;
  return braid_scatter(f, s, r, x->count, x->dt, x->root);
}
static braid_status f_all_to_all(braid_comm *f, const void *s, void *r, void *a) {
  flat_args *x = a;
  return braid_all_to_all(f, s, r, x->count, x->dt);
}
static braid_status f_all_to_allv(braid_comm *f, const void *s, void *r, void *a) {
  flat_args *x = a;
  return braid_all_to_allv(f, s, x->sc, x->sd, r, x->rc, x->rd, x->dt);
}

/* A reduction through the flat part (the node part on one node): its op
   made there for the call. */
static braid_status staged_red(braid_comm *c, const void *send, size_t sb, void *recv, size_t rb, flat_call call,
                               flat_args *x) {
  hier_state *s = c->be;
  braid_comm *p = s->nnodes == 1 ? s->intra : s->flat;
  int made;
  braid_op user = x->op;
  braid_status st = part_op(c, p, user, 1, &x->op, &made);
  if (st) return st;
  st = staged(c, send, sb, recv, rb, call, x);
  part_op_done(p, x->op, made);
  x->op = user;
  return st;
}

/* A rail stage over the N nodes' blocks of count elements, in pieces of
   per: piece k is elements [a, b) of every block, staged at h + N * a
   (node j's part at + j * (b - a)), and of the rank's own block, at
   one + a on the device and own + a on the host. Device block j is at
   base + at[j] blocks (at NULL: j blocks). */
typedef struct block_job {
  char *h, *own, *one, *base;
  const int *at;
  size_t N, count, per, es;
  braid_comm *sub;
  braid_dtype dt;
  braid_op op;
  const void *scalar;
  int avg;
} block_job;

static char *block_at(const block_job *j, size_t i, size_t a) {
  return j->base + ((j->at ? (size_t)j->at[i] : i) * j->count + a) * j->es;
}
/* Copies piece k of every node's block between device and host. */
static braid_status blocks_copy(braid_comm *c, const block_job *j, size_t k, int up) {
  size_t a, len;
  piece_at(j->per, j->count, k, &a, &len);
  char *h = j->h + j->N * a * j->es;
  braid_status st = BRAID_OK;
  if (len == j->count && !j->at) /* the whole blocks, contiguous on both sides */
    return up ? h2d(c, j->base, h, j->N * len * j->es) : d2h(c, h, j->base, j->N * len * j->es);
  for (size_t i = 0; i < j->N && !st; i++) {
    char *d = block_at(j, i, a), *p = h + i * len * j->es;
    st = up ? h2d(c, d, p, len * j->es) : d2h(c, p, d, len * j->es);
  }
  return st;
}

static braid_status ag_down(braid_comm *c, size_t k, void *arg) {
  block_job *j = arg;
  size_t a, len;
  piece_at(j->per, j->count, k, &a, &len);
  return d2h(c, j->own + a * j->es, j->one + a * j->es, len * j->es);
}
static braid_status ag_host(braid_comm *c, size_t k, void *arg) {
  block_job *j = arg;
  size_t a, len;
  piece_at(j->per, j->count, k, &a, &len);
  PART(j->sub, braid_all_gather(j->sub, j->own + a * j->es, j->h + j->N * a * j->es, len, j->dt));
  return BRAID_OK;
}
static braid_status ag_up(braid_comm *c, size_t k, void *arg) { return blocks_copy(c, arg, k, 1); }

static braid_status rs_down(braid_comm *c, size_t k, void *arg) { return blocks_copy(c, arg, k, 0); }
static braid_status rs_host(braid_comm *c, size_t k, void *arg) {
  block_job *j = arg;
  size_t a, len;
  piece_at(j->per, j->count, k, &a, &len);
  return host_reduce(c, j->sub, 1, j->h + j->N * a * j->es, j->own + a * j->es, len, j->dt, j->op, j->scalar, j->avg);
}
static braid_status rs_up(braid_comm *c, size_t k, void *arg) {
  block_job *j = arg;
  size_t a, len;
  piece_at(j->per, j->count, k, &a, &len);
  return h2d(c, j->one + a * j->es, j->own + a * j->es, len * j->es);
}

/* Stages the blocks and the rank's own block, and runs the pieces. */
static braid_status blocks_run(braid_comm *c, block_job *j, int gather) {
  char *h = NULL;
  braid_status st = stage(c, j->count * j->es * (j->N + 1), &h);
  if (st) return st;
  j->h = h;
  j->own = h + j->N * j->count * j->es;
  size_t n = pieces(c, j->count, j->N * j->es, &j->per);
  pipe_ops o = {gather ? ag_down : rs_down, gather ? ag_host : rs_host, gather ? ag_up : rs_up, j};
  return pipeline(c, n, &o);
}

/* Rail l gathers local rank l's blocks of every node on the host; on the
   device the node gathers the rails' results, block (node j, local l) at
   scratch[l * N + j], and each block moves to its rank's place. */
static braid_status dev_all_gather(braid_comm *c, const void *send, void *vrecv, size_t count, braid_dtype dt) {
  hier_state *s = c->be;
  char *recv = vrecv, *d = NULL;
  size_t es = braid_dtype_size(dt), bytes = count * es;
  braid_status st;
  if ((st = begin(c))) return st;
  if (s->nnodes == 1) {
    PART(s->intra, braid_all_gather(s->intra, send, recv, count, dt));
    in_flight(c);
    return BRAID_OK;
  }
  flat_args x = {.count = count, .dt = dt};
  if (!s->uniform) return staged(c, send, bytes, recv, bytes * (size_t)c->size, f_all_gather, &x);
  size_t N = (size_t)s->nnodes, L = (size_t)s->lsize;
  if (L > 1 && (st = dscratch(c, bytes * N * L, &d))) return st;
  char *mine = L > 1 ? d + (size_t)s->lrank * N * bytes : NULL;
  block_job j = {.one = (char *)send, .base = L > 1 ? mine : recv, .at = L > 1 ? NULL : s->rank_at, .N = N,
                 .count = count, .es = es, .sub = s->rail, .dt = dt};
  if ((st = blocks_run(c, &j, 1))) return st;
  if (L > 1) {
    PART(s->intra, braid_all_gather(s->intra, mine, d, count * N, dt));
    for (size_t l = 0; l < L; l++)
      for (size_t i = 0; i < N; i++)
        if ((st = hier_dev_copy(c, recv + (size_t)s->rank_at[i * L + l] * bytes, d + (l * N + i) * bytes, bytes,
                                BRAID__COPY_D2D)))
          return st;
  }
  in_flight(c);
  return BRAID_OK;
}

/* The blocks in (local rank, node) order on the device; the node
   reduce-scatters local rank l the node's partial of every node's block l;
   rail l reduces block (node j, l) to node j on the host. The send buffer
   is only read. */
static braid_status dev_reduce_scatter(braid_comm *c, const void *vsend, void *recv, size_t count, braid_dtype dt,
                                       braid_op op) {
  hier_state *s = c->be;
  const char *send = vsend;
  char *d, *part = NULL;
  size_t es = braid_dtype_size(dt), bytes = count * es;
  braid_status st;
  if ((st = begin(c))) return st;
  if (s->nnodes == 1) return node_reduce(c, 1, send, recv, count, dt, op, 1);
  flat_args x = {.count = count, .dt = dt, .op = op};
  if (!s->uniform) return staged_red(c, send, bytes * (size_t)c->size, recv, bytes, f_reduce_scatter, &x);
  size_t N = (size_t)s->nnodes, L = (size_t)s->lsize;
  const braid__premul *pm = braid__premul_of(c, op);
  int avg = op == BRAID_AVG;
  if (L > 1) {
    if ((st = dscratch(c, bytes * N * (L + 1), &d))) return st;
    part = d + N * L * bytes;
    for (size_t l = 0; l < L; l++)
      for (size_t i = 0; i < N; i++)
        if ((st = hier_dev_copy(c, d + (l * N + i) * bytes, send + (size_t)s->rank_at[i * L + l] * bytes, bytes,
                                BRAID__COPY_D2D)))
          return st;
    if ((st = node_reduce(c, 1, d, part, count * N, dt, op, 0))) return st;
  }
  block_job j = {.one = recv, .base = L > 1 ? part : (char *)send, .at = L > 1 ? NULL : s->rank_at, .N = N,
                 .count = count, .es = es, .sub = s->rail, .dt = dt, .op = pm || avg ? BRAID_SUM : op,
                 .scalar = L == 1 && pm ? pm->scalar : NULL, .avg = avg};
  if ((st = blocks_run(c, &j, 0))) return st;
  in_flight(c);
  return BRAID_OK;
}

static braid_status dev_reduce(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                               braid_op op, int root) {
  size_t bytes = count * braid_dtype_size(dt);
  flat_args x = {.count = count, .dt = dt, .op = op, .root = root};
  return staged_red(c, send, bytes, recv, c->rank == root ? bytes : 0, f_reduce, &x);
}

static braid_status dev_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int root) {
  size_t bytes = count * braid_dtype_size(dt);
  flat_args x = {.count = count, .dt = dt, .root = root};
  return staged(c, send, bytes, recv, c->rank == root ? bytes * (size_t)c->size : 0, f_gather, &x);
}

static braid_status dev_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int root) {
  size_t bytes = count * braid_dtype_size(dt);
  flat_args x = {.count = count, .dt = dt, .root = root};
  return staged(c, send, c->rank == root ? bytes * (size_t)c->size : 0, recv, bytes, f_scatter, &x);
}

static braid_status dev_all_to_all(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt) {
  size_t all = count * braid_dtype_size(dt) * (size_t)c->size;
  flat_args x = {.count = count, .dt = dt};
  return staged(c, send, all, recv, all, f_all_to_all, &x);
}

/* The extent of per-peer blocks, in bytes. */
static size_t extent(const braid_comm *c, const size_t *counts, const size_t *displs, size_t es) {
  size_t end = 0;
  for (int q = 0; q < c->size; q++)
    if (counts[q] && displs[q] + counts[q] > end) end = displs[q] + counts[q];
  return end * es;
}

static braid_status dev_all_to_allv(braid_comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                                    const size_t *rc, const size_t *rd, braid_dtype dt) {
  size_t es = braid_dtype_size(dt);
  flat_args x = {.dt = dt, .sc = sc, .sd = sd, .rc = rc, .rd = rd};
  size_t rb = extent(c, rc, rd, es);
  /* In place (no send counts): the receive layout is the send layout. */
  return staged(c, send, sc ? extent(c, sc, sd, es) : rb, recv, rb, f_all_to_allv, &x);
}

static braid_status dev_barrier(braid_comm *c) {
  braid_status st = begin(c);
  if (!st) st = hier_barrier(c);
  in_flight(c);
  return st;
}

/* ---------------------------------------------------------------- streams and memory: the node part's */

#define NODE_HOOK(ret_expr)                                 \
  hier_state *s = c->be;                                    \
  braid_comm *p = s->intra;                                 \
  braid_status st;                                          \
  ON_NODE(c, p, ret_expr);                                  \
  return st ? hier_adopt(c, p, st) : BRAID_OK

static braid_status dev_event_create(braid_comm *c, uint64_t *ev) { NODE_HOOK(p->ops->stream->event_create(p, ev)); }
static braid_status dev_event_destroy(braid_comm *c, uint64_t ev) { NODE_HOOK(p->ops->stream->event_destroy(p, ev)); }
static braid_status dev_record_comm(braid_comm *c, uint64_t ev) {
  braid_status first = hier_dev_order(c, NULL, 0); /* the event covers earlier receives */
  if (first) return first;
  NODE_HOOK(p->ops->stream->event_record_on_comm_stream(p, ev));
}
static braid_status dev_record(braid_comm *c, uint64_t ev, uint64_t stream) {
  NODE_HOOK(p->ops->stream->event_record_on_stream(p, ev, stream));
}
static braid_status dev_comm_wait(braid_comm *c, uint64_t ev) {
  NODE_HOOK(p->ops->stream->comm_stream_wait_event(p, ev));
}
static braid_status dev_stream_wait(braid_comm *c, uint64_t stream, uint64_t ev) {
  NODE_HOOK(p->ops->stream->stream_wait_event(p, stream, ev));
}
static braid_status dev_sync_stream(braid_comm *c) {
  braid_status first = hier_dev_order(c, NULL, 0);
  if (first) return first;
  NODE_HOOK(p->ops->stream->sync_comm_stream(p));
}

static const braid__stream_ops dev_stream_ops = {
    .event_create = dev_event_create,
    .event_destroy = dev_event_destroy,
    .event_record_on_comm_stream = dev_record_comm,
    .event_record_on_stream = dev_record,
    .comm_stream_wait_event = dev_comm_wait,
    .stream_wait_event = dev_stream_wait,
    .sync_comm_stream = dev_sync_stream,
};

static braid_status dev_mem_alloc(braid_comm *c, void **ptr, size_t size) { NODE_HOOK(p->ops->mem_alloc(p, ptr, size)); }
static braid_status dev_mem_free(braid_comm *c, void *ptr) { NODE_HOOK(p->ops->mem_free(p, ptr)); }
static braid_status dev_mem_register(braid_comm *c, void *buf, size_t size, void **handle) {
  NODE_HOOK(p->ops->mem_register(p, buf, size, handle));
}
static braid_status dev_mem_deregister(braid_comm *c, void *handle) { NODE_HOOK(p->ops->mem_deregister(p, handle)); }

const braid__backend braid__hier_dev_backend = {
    .name = "hier",
    .caps = BRAID__CAP_NEEDS_STORE | BRAID__CAP_DEVICE_MEM | BRAID__CAP_PREMUL,
    .dtypes = BRAID__ALL_DTYPES,
    HIER_SHARED_OPS,
    .barrier = dev_barrier,
    .all_reduce = dev_all_reduce,
    .broadcast = dev_broadcast,
    .all_gather = dev_all_gather,
    .reduce_scatter = dev_reduce_scatter,
    .reduce = dev_reduce,
    .gather = dev_gather,
    .scatter = dev_scatter,
    .all_to_all = dev_all_to_all,
    .all_to_allv = dev_all_to_allv,
    .stream = &dev_stream_ops,
    .copy = NULL,
    .mem_alloc = dev_mem_alloc,
    .mem_free = dev_mem_free,
    .mem_register = dev_mem_register,
    .mem_deregister = dev_mem_deregister,
};
