/* Backend "nccl": device memory through NCCL, loaded at run time.

   Every operation is enqueued on the communicator's own CUDA stream and
   returns; braid_sync waits for the stream in the core's wait engine, so
   BRAID_TIMEOUT, braid_abort and failures other ranks publish through the
   store interrupt it. The NCCL communicator is non-blocking
   (config.blocking = 0): no NCCL call can hold a thread past braid's
   deadlines, and a failed communicator is ended with ncclCommAbort.

   Completion: each enqueued unit (a batch of sends and receives, a call
   check) records an event of a ring; progress queries the oldest events
   and polls ncclCommGetAsyncError. A collective records no event of its
   own: the next event on the stream, recorded at the latest when something
   waits, completes after it, so back-to-back collectives cost the stream
   nothing beyond NCCL's own launches.

   Point to point: NCCL pairs sends and receives by call order per pair of
   ranks, not by tag. Sends and receives are queued and issued in one
   ncclGroupStart/End at the next progress (braid_sync, the next
   collective). With the call check on, a round exchanges first, per peer,
   the list of queued sends and receives (tag, dtype, count): both ranks of
   a pair see both lists, pair them in order as far as both go, and refuse
   a pair whose tag or shape differs with BRAID_ERR_MISMATCH before any data
   moves; what the other rank has not posted yet waits for a later round.

   The call check of collectives: each collective is preceded, on the
   stream, by an 8-byte max-reduction of its digest and its complement, read
   back as the collective completes; ranks that called different collectives
   get BRAID_ERR_MISMATCH at braid_sync instead of NCCL's undefined result.
   BRAID_CHECK=0 leaves both exchanges out. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "backends/backends.h"
#include "backends/nccl/nccl_lib.h"
#include "bootstrap/bootstrap.h"
#include "core/params.h"
#include "core/subcomm.h"
#include "core/wait.h"
#include "os/time.h"

#define RING 64     /* enqueued units whose completion is tracked; more wait for the oldest */
#define PEER_OPS 32 /* sends (and receives) per peer one round describes */
#define MSG_MAGIC 0x4e43434cu

typedef struct p2p_ent {
  uint32_t tag;
  uint8_t dt;
  uint8_t pad[3];
  uint64_t count;
} p2p_ent;

/* What a rank has queued with one peer: its sends, then its receives. */
typedef struct p2p_msg {
  uint32_t magic;
  uint16_t nsend, nrecv;
  uint64_t round;
  p2p_ent e[2 * PEER_OPS];
} p2p_msg;

typedef struct nccl_req {
  braid__req base;
  struct nccl_req *next;
  uint64_t serial; /* the ring unit that completes it (0: not issued) */
  int ord;         /* its place among this round's sends to (receives from) its peer; -1: not in the round */
} nccl_req;

typedef struct ring_ent {
  cudaEvent_t ev;
  uint64_t serial;
  int chk;   /* a collective's digest slot in hchk to compare when it completes; -1: none */
  uint64_t seq;
  braid__desc desc;
} ring_ent;

typedef struct nccl_state {
  const braid__nccl_api *a;
  ncclComm_t comm; /* NULL once ended */
  cudaStream_t stream;
  int device;
  ring_ent ring[RING];
  uint64_t issued, done; /* units enqueued / known complete */
  int busy;              /* 1 counted in c->npending while collectives are in flight */
  uint64_t coll_last;    /* serial of the unit that ends the last collective */
  int tail_open;         /* collectives enqueued after the last unit's event: the next event covers them */
  cudaEvent_t awaited;     /* nccl_event_sync's event */
  cudaError_t awaited_err; /* and what querying it said */
  uint32_t *dchk;        /* device: 2 words per digest slot, then the barrier's word */
  uint32_t *hchk;        /* pinned: 4 words per digest slot (digest out, result in) */
  uint64_t nchk;         /* digests so far: slot nchk % RING is next (each has a unit, so at most RING fly) */
  int chk_slot;          /* the slot of the collective being enqueued; -1: none */
  /* point to point */
  nccl_req *queued, **queued_tail; /* posted, not issued, in call order */
  nccl_req *flight;                /* issued */
  int round_open;                  /* descriptors in flight */
  uint64_t round_serial;
  p2p_msg *dmsg, *hmsg; /* device and pinned: size messages out, then size in */
  int *nsend, *nrecv;   /* this round, per peer */
  uint64_t *prounds;    /* rounds with each peer so far: the k-th round with p meets p's k-th with this rank */
  long *pids;           /* peers' pids on this host (0: elsewhere, unknown) */
  void *scratch;        /* device memory for in-place all-to-all(v) */
  size_t scratch_len;
  uint64_t *dcnt, *hcnt; /* all-to-allv's count check: size out, size in */
} nccl_state;

static nccl_state *state(braid_comm *c) { return c->be; }

/* ------------------------------------------------------------ errors */

static const char *nccl_detail(nccl_state *s) {
  const char *d = s && s->a->ncclGetLastError ? s->a->ncclGetLastError(s->comm) : NULL;
  return d && *d ? d : NULL;
}

/* A failed NCCL call: argument errors leave the communicator usable. */
static braid_status nccl_fail(braid_comm *c, const char *fn, ncclResult_t rc) {
  nccl_state *s = state(c);
  const char *d = nccl_detail(s);
  char text[400];
  snprintf(text, sizeof text, "%s failed: %s%s%s", fn, s->a->ncclGetErrorString(rc), d ? ": " : "", d ? d : "");
  if (rc == ncclInvalidArgument || rc == ncclInvalidUsage) return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s", text);
  if (rc == ncclRemoteError) return braid__fail_comm(c, BRAID_ERR_PEER_LOST, "%s (a remote rank failed)", text);
  return braid__fail_comm(c, BRAID_ERR_BACKEND, "%s", text);
}

static braid_status cuda_fail(braid_comm *c, const char *fn, cudaError_t e) {
  return braid__fail_comm(c, BRAID_ERR_BACKEND, "%s failed: %s", fn, state(c)->a->cudaGetErrorString(e));
}

/* Ends the NCCL communicator of a failed braid communicator: kernels that
   wait for a peer stop, the stream drains. */
static void end_comm(nccl_state *s) {
  if (!s->comm) return;
  s->a->ncclCommAbort(s->comm);
  s->comm = NULL;
}

/* A non-blocking communicator may answer ncclInProgress: the call is
   finished when the asynchronous error says so. Bounded by the timeout. */
static braid_status settle(braid_comm *c, const char *fn, ncclResult_t rc) {
  nccl_state *s = state(c);
  double deadline = braid__deadline(c->timeout_s);
  while (rc == ncclInProgress) {
    if (braid__aborted(c)) return braid__fail(c, BRAID_ERR_ABORTED, "aborted while %s was being enqueued", fn);
    if (braid__now() > deadline)
      return braid__fail(c, BRAID_ERR_TIMEOUT, "%s still in progress after %g s", fn, c->timeout_s);
    ncclResult_t as = ncclSuccess;
    ncclResult_t q = s->a->ncclCommGetAsyncError(s->comm, &as);
    rc = q != ncclSuccess ? q : as;
    if (rc == ncclInProgress) sched_yield();
  }
  return rc == ncclSuccess ? BRAID_OK : nccl_fail(c, fn, rc);
}

/* ------------------------------------------------------------ the ring */

static braid_status poll_async(braid_comm *c) {
  nccl_state *s = state(c);
  if (!s->comm) return BRAID_OK;
  ncclResult_t as = ncclSuccess;
  ncclResult_t rc = s->a->ncclCommGetAsyncError(s->comm, &as);
  if (rc == ncclSuccess && (as == ncclSuccess || as == ncclInProgress)) return BRAID_OK;
  return nccl_fail(c, "an operation on the stream", rc != ncclSuccess ? rc : as);
}

static braid_status check_digest(braid_comm *c, ring_ent *e) {
  nccl_state *s = state(c);
  const uint32_t *mine = s->hchk + 4 * e->chk, *all = mine + 2;
  if (all[0] == mine[0] && all[1] == mine[1]) return BRAID_OK;
  char d[160];
  braid__desc_format(&e->desc, d, sizeof d);
  return braid__fail_comm(c, BRAID_ERR_MISMATCH,
                          "the ranks called different collectives at collective #%llu: this rank called %s, another "
                          "rank something else (its result is not valid)",
                          (unsigned long long)e->seq, d);
}

/* Completes what the stream has finished: ring units in order, then the
   requests and the collectives they held. */
static braid_status reap(braid_comm *c) {
  nccl_state *s = state(c);
  braid_status st = BRAID_OK;
  uint64_t before = s->done;
  while (s->done < s->issued) {
    int slot = (int)(s->done % RING);
    cudaError_t e = s->a->cudaEventQuery(s->ring[slot].ev);
    if (e == cudaErrorNotReady) break;
    if (e != cudaSuccess) return cuda_fail(c, "cudaEventQuery", e);
    s->done++;
    if (s->ring[slot].chk >= 0 && (st = check_digest(c, &s->ring[slot]))) return st;
  }
  if (s->done == before) return BRAID_OK;
  c->moved++;
  for (nccl_req **pp = &s->flight; *pp;) {
    nccl_req *r = *pp;
    if (r->serial > s->done) {
      pp = &r->next;
      continue;
    }
    *pp = r->next;
    braid__req_complete(c, &r->base, BRAID_OK);
  }
  if (s->busy && !s->tail_open && s->done >= s->coll_last) {
    s->busy = 0;
    c->npending--;
  }
  return BRAID_OK;
}

static braid_status nccl_progress(braid_comm *c);

/* Waits in the core's engine until cond(c) holds. */
static braid_status wait_until(braid_comm *c, int (*cond)(braid_comm *), const char *what) {
  if (cond(c)) return BRAID_OK;
  braid__waiter w;
  braid__wait_begin(&w);
  for (;;) {
    braid_status st = nccl_progress(c);
    if (st) {
      braid__wait_end(c, &w);
      return st;
    }
    if (cond(c)) break;
    if ((st = braid__wait_poll(c, &w, -1, what))) return st;
  }
  braid__wait_end(c, &w);
  return BRAID_OK;
}

static int ring_has_room(braid_comm *c) { return state(c)->issued - state(c)->done < RING; }
static int ring_has_room2(braid_comm *c) { return state(c)->issued - state(c)->done + 2 <= RING; }
static int stream_idle(braid_comm *c) { return !state(c)->tail_open && state(c)->done == state(c)->issued; }

/* Records the unit just enqueued; check: it ends the collective whose
   digest is in s->chk_slot. */
static braid_status ring_push(braid_comm *c, int check) {
  nccl_state *s = state(c);
  int slot = (int)(s->issued % RING);
  cudaError_t e = s->a->cudaEventRecord(s->ring[slot].ev, s->stream);
  if (e != cudaSuccess) return cuda_fail(c, "cudaEventRecord", e);
  s->ring[slot].serial = ++s->issued;
  if (s->tail_open) s->coll_last = s->issued, s->tail_open = 0; /* this event completes after them */
  s->ring[slot].chk = check ? s->chk_slot : -1;
  s->ring[slot].seq = c->seq;
  s->ring[slot].desc = c->desc;
  return BRAID_OK;
}

/* ------------------------------------------------------------ types */

static int nccl_type(braid_dtype dt, ncclDataType_t *out) {
  switch (dt) {
    case BRAID_F64: *out = ncclFloat64; return 1;
    case BRAID_F32: *out = ncclFloat32; return 1;
    case BRAID_F16: *out = ncclFloat16; return 1;
    case BRAID_BF16: *out = ncclBfloat16; return 1;
    case BRAID_FP8_E4M3: *out = ncclFloat8e4m3; return 1;
    case BRAID_FP8_E5M2: *out = ncclFloat8e5m2; return 1;
    case BRAID_I64: *out = ncclInt64; return 1;
    case BRAID_I32: *out = ncclInt32; return 1;
    case BRAID_I8: *out = ncclInt8; return 1;
    case BRAID_U64: *out = ncclUint64; return 1;
    case BRAID_U32: *out = ncclUint32; return 1;
    case BRAID_U8: *out = ncclUint8; return 1;
    default: return 0;
  }
}

/* The NCCL reduction for (dt, op): complex sums are sums of their parts
   (count doubles); a scaled sum becomes a pre-multiplied-sum op the caller
   destroys after enqueueing. */
typedef struct red {
  ncclDataType_t t;
  ncclRedOp_t op;
  size_t mult;
  int premul;
} red;

static braid_status nccl_red(braid_comm *c, braid_dtype dt, braid_op op, red *out) {
  nccl_state *s = state(c);
  out->mult = 1;
  out->premul = 0;
  braid_dtype base = dt;
  if (dt == BRAID_C64 || dt == BRAID_C128) {
    base = dt == BRAID_C64 ? BRAID_F32 : BRAID_F64;
    out->mult = 2;
  }
  const braid__premul *pm = braid__premul_of(c, op);
  if (!nccl_type(base, &out->t) || (out->mult == 2 && (pm || (op != BRAID_SUM && op != BRAID_AVG))))
    return braid__fail(c, BRAID_ERR_UNSUPPORTED,
                       "NCCL has no %s reduction of %s; on backend nccl reductions take f64, f32, f16, bf16, fp8, "
                       "i8, i32, i64, u8, u32, u64 (and complex sum or avg)",
                       pm ? "scaled-sum" : braid_op_name(op), braid_dtype_name(dt));
  if (pm) {
    ncclResult_t rc = s->a->ncclRedOpCreatePreMulSum(&out->op, (void *)pm->scalar, out->t, ncclScalarHostImmediate,
                                                     s->comm);
    if (rc != ncclSuccess) return nccl_fail(c, "ncclRedOpCreatePreMulSum", rc);
    out->premul = 1;
    return BRAID_OK;
  }
  switch (op) {
    case BRAID_SUM: out->op = ncclSum; return BRAID_OK;
    case BRAID_PROD: out->op = ncclProd; return BRAID_OK;
    case BRAID_MIN: out->op = ncclMin; return BRAID_OK;
    case BRAID_MAX: out->op = ncclMax; return BRAID_OK;
    case BRAID_AVG: out->op = ncclAvg; return BRAID_OK;
    default:
      return braid__fail(c, BRAID_ERR_UNSUPPORTED,
                         "NCCL has no %s reduction; on backend nccl reductions are sum, prod, min, max, avg and "
                         "scaled sums",
                         braid_op_name(op));
  }
}

static void red_done(braid_comm *c, red *r) {
  nccl_state *s = state(c);
  if (r->premul) s->a->ncclRedOpDestroy(r->op, s->comm); /* NCCL allows it once the enqueueing call returned */
  r->premul = 0;
}

/* ------------------------------------------------------------ point to point */

static braid_status issue_round(braid_comm *c);
static braid_status finish_round(braid_comm *c);

static braid_status nccl_isend(braid_comm *c, braid__req *br) {
  nccl_state *s = state(c);
  nccl_req *r = (nccl_req *)br;
  r->next = NULL;
  r->serial = 0;
  r->ord = -1;
  *s->queued_tail = r;
  s->queued_tail = &r->next;
  return BRAID_OK;
}

static braid_status nccl_irecv(braid_comm *c, braid__req *br) {
  braid__match_cancel(c, br); /* NCCL pairs by call order: the matcher's queue is not used */
  return nccl_isend(c, br);
}

/* Nothing ever arrives unexpected: NCCL delivers into the posted buffer. */
static braid_status nccl_take(braid_comm *c, braid__req *r, braid__umsg *u) {
  (void)r, (void)u;
  return braid__fail_comm(c, BRAID_ERR_INTERNAL, "an unexpected message on backend nccl");
}

static void nccl_release_umsg(braid_comm *c, braid__umsg *u) { (void)c, (void)u; }

static void requeue_tail(nccl_state *s) {
  s->queued_tail = &s->queued;
  while (*s->queued_tail) s->queued_tail = &(*s->queued_tail)->next;
}

static braid_status p2p_buffers(braid_comm *c) {
  nccl_state *s = state(c);
  if (s->dmsg) return BRAID_OK;
  size_t bytes = 2 * (size_t)c->size * sizeof(p2p_msg);
  cudaError_t e = s->a->cudaMalloc((void **)&s->dmsg, bytes);
  if (e != cudaSuccess) return cuda_fail(c, "cudaMalloc of the send/receive descriptors", e);
  e = s->a->cudaMallocHost((void **)&s->hmsg, bytes);
  if (e != cudaSuccess) return cuda_fail(c, "cudaMallocHost of the send/receive descriptors", e);
  return BRAID_OK;
}

/* One group of ncclSend/ncclRecv for the queued requests that are in the
   round (all of them when there is no round), as one ring unit. */
static braid_status issue_data(braid_comm *c, int all) {
  nccl_state *s = state(c);
  const braid__nccl_api *a = s->a;
  int any = 0;
  for (nccl_req *r = s->queued; r && !any; r = r->next) any = all || r->ord >= 0;
  if (!any) return BRAID_OK;
  ncclResult_t rc = a->ncclGroupStart();
  for (nccl_req *r = s->queued; r && rc == ncclSuccess; r = r->next) {
    if (!all && r->ord < 0) continue;
    if (r->base.is_send) rc = a->ncclSend(r->base.buf, r->base.bytes, ncclUint8, r->base.peer, s->comm, s->stream);
    else rc = a->ncclRecv(r->base.buf, r->base.bytes, ncclUint8, r->base.peer, s->comm, s->stream);
  }
  ncclResult_t end = a->ncclGroupEnd();
  if (rc == ncclSuccess) rc = end;
  braid_status st = settle(c, "ncclSend/ncclRecv", rc);
  if (!st) st = ring_push(c, 0);
  if (st) return st;
  nccl_req **pp = &s->queued;
  while (*pp) {
    nccl_req *r = *pp;
    if (!all && r->ord < 0) {
      pp = &r->next;
      continue;
    }
    *pp = r->next;
    r->serial = s->issued;
    r->next = s->flight;
    s->flight = r;
  }
  requeue_tail(s);
  return BRAID_OK;
}

static void put_ent(p2p_ent *e, const nccl_req *r) {
  memset(e, 0, sizeof *e);
  e->tag = (uint32_t)r->base.h.tag;
  e->dt = (uint8_t)r->base.h.dt;
  e->count = r->base.h.count;
}

/* Round, first half: each rank tells each peer it has queued work with
   what it has queued with it. */
static braid_status issue_round(braid_comm *c) {
  nccl_state *s = state(c);
  const braid__nccl_api *a = s->a;
  braid_status st = p2p_buffers(c);
  if (st) return st;
  const int n = c->size;
  memset(s->nsend, 0, sizeof *s->nsend * (size_t)n);
  memset(s->nrecv, 0, sizeof *s->nrecv * (size_t)n);
  p2p_msg *out = s->hmsg;
  for (nccl_req *r = s->queued; r; r = r->next) {
    int p = r->base.peer, *k = r->base.is_send ? &s->nsend[p] : &s->nrecv[p];
    r->ord = *k < PEER_OPS ? (*k)++ : -1;
  }
  for (int p = 0; p < n; p++) {
    memset(&out[p], 0, offsetof(p2p_msg, e));
    out[p].magic = MSG_MAGIC;
    out[p].nsend = (uint16_t)s->nsend[p];
    out[p].nrecv = (uint16_t)s->nrecv[p];
    out[p].round = s->prounds[p];
  }
  for (nccl_req *r = s->queued; r; r = r->next)
    if (r->ord >= 0) {
      int p = r->base.peer;
      put_ent(&out[p].e[r->base.is_send ? r->ord : out[p].nsend + r->ord], r);
    }
  size_t bytes = (size_t)n * sizeof(p2p_msg);
  cudaError_t e = a->cudaMemcpyAsync(s->dmsg, s->hmsg, bytes, cudaMemcpyHostToDevice, s->stream);
  if (e != cudaSuccess) return cuda_fail(c, "cudaMemcpyAsync", e);
  ncclResult_t rc = a->ncclGroupStart();
  for (int p = 0; p < n && rc == ncclSuccess; p++) {
    if (!s->nsend[p] && !s->nrecv[p]) continue;
    rc = a->ncclSend(&s->dmsg[p], sizeof(p2p_msg), ncclUint8, p, s->comm, s->stream);
    if (rc == ncclSuccess) rc = a->ncclRecv(&s->dmsg[n + p], sizeof(p2p_msg), ncclUint8, p, s->comm, s->stream);
  }
  ncclResult_t end = a->ncclGroupEnd();
  if (rc == ncclSuccess) rc = end;
  if ((st = settle(c, "ncclSend/ncclRecv of the send/receive descriptors", rc))) return st;
  e = a->cudaMemcpyAsync(s->hmsg + n, s->dmsg + n, bytes, cudaMemcpyDeviceToHost, s->stream);
  if (e != cudaSuccess) return cuda_fail(c, "cudaMemcpyAsync", e);
  if ((st = ring_push(c, 0))) return st;
  s->round_serial = s->issued;
  s->round_open = 1;
  return BRAID_OK;
}

static braid_status p2p_mismatch(braid_comm *c, const nccl_req *r, const p2p_ent *t) {
  char text[320];
  const int p = braid__label(c, r->base.peer);
  if (r->base.is_send)
    snprintf(text, sizeof text,
             "the send to rank %d with tag %u (%llu elements of %s) meets its receive of tag %u, %llu elements of "
             "%s (on backend nccl sends and receives between two ranks pair up in call order)",
             p, (unsigned)r->base.h.tag, (unsigned long long)r->base.h.count, braid_dtype_name(r->base.h.dt),
             (unsigned)t->tag, (unsigned long long)t->count, braid_dtype_name((braid_dtype)t->dt));
  else if (t->tag != (uint32_t)r->base.h.tag)
    snprintf(text, sizeof text,
             "the receive from rank %d with tag %u meets a message with tag %u (on backend nccl sends and receives "
             "between two ranks pair up in call order)",
             p, (unsigned)r->base.h.tag, (unsigned)t->tag);
  else
    braid__mismatch_text(text, sizeof text, p, t->tag, (size_t)t->count, (braid_dtype)t->dt, r->base.h.count,
                         (braid_dtype)r->base.h.dt);
  return braid__fail_comm(c, BRAID_ERR_MISMATCH, "%s", text);
}

/* Round, second half: pair this rank's queue with each peer's in order as
   far as both go, refuse differences, and issue the pairs. */
static braid_status finish_round(braid_comm *c) {
  nccl_state *s = state(c);
  const int n = c->size;
  const p2p_msg *in = s->hmsg + n;
  for (int p = 0; p < n; p++) {
    if (!s->nsend[p] && !s->nrecv[p]) continue;
    if (in[p].magic != MSG_MAGIC || in[p].round != s->prounds[p] || in[p].nsend > PEER_OPS ||
        in[p].nrecv > PEER_OPS)
      return braid__fail_comm(c, BRAID_ERR_MISMATCH,
                              "rank %d answered this rank's send/receive descriptors with something else (it was in "
                              "another operation: a collective or a different round)",
                              braid__label(c, p));
  }
  for (int p = 0; p < n; p++)
    if (s->nsend[p] || s->nrecv[p]) s->prounds[p]++;
  for (nccl_req *r = s->queued; r; r = r->next) {
    if (r->ord < 0) continue;
    const p2p_msg *m = &in[r->base.peer];
    int lim = r->base.is_send ? m->nrecv : m->nsend;
    if (r->ord >= lim) { /* the peer has not posted its side yet */
      r->ord = -1;
      continue;
    }
    const p2p_ent *t = &m->e[r->base.is_send ? m->nsend + r->ord : r->ord];
    if (t->tag != (uint32_t)r->base.h.tag || t->count != r->base.h.count || t->dt != r->base.h.dt)
      return p2p_mismatch(c, r, t);
  }
  s->round_open = 0;
  return issue_data(c, 0);
}

/* Moves point-to-point work on; flush: issue what is queued now. */
static braid_status p2p_step(braid_comm *c) {
  nccl_state *s = state(c);
  braid_status st = BRAID_OK;
  if (s->round_open && s->done >= s->round_serial && ring_has_room(c)) st = finish_round(c);
  if (!st && !s->round_open && s->queued && s->issued - s->done + 2 <= RING)
    st = c->check ? issue_round(c) : issue_data(c, 1);
  return st;
}

static braid_status nccl_progress(braid_comm *c) {
  nccl_state *s = state(c);
  if (atomic_load(&c->failed)) {
    end_comm(s);
    return (braid_status)atomic_load(&c->failed);
  }
  braid_status st = reap(c);
  if (!st && s->tail_open && ring_has_room(c)) st = ring_push(c, 0); /* something waits: mark the stream's end */
  if (!st) st = poll_async(c);
  if (!st && (s->queued || s->round_open)) st = p2p_step(c);
  if (!st && s->issued != s->done) st = reap(c);
  if (st) end_comm(s);
  return st;
}

/* Before a collective: this rank's sends and receives go first on the
   stream, in call order (a round waits for the peers' descriptors). */
static int p2p_flushed(braid_comm *c) { return !state(c)->queued && !state(c)->round_open; }
static braid_status flush_p2p(braid_comm *c) {
  if (p2p_flushed(c)) return BRAID_OK;
  braid_status st = nccl_progress(c);
  if (st) return st;
  return wait_until(c, p2p_flushed, "the peers' sends and receives");
}

/* ------------------------------------------------------------ waiting */

static int nccl_arm(braid_comm *c) {
  (void)c;
  return 1;
}

/* CUDA has no wake-up to sleep on that also sees peers: a short nap. */
static void nccl_sleep(braid_comm *c, double slice_s) {
  (void)c;
  double t = slice_s < 20e-6 ? slice_s : 20e-6;
  struct timespec ts = {0, (long)(t * 1e9)};
  nanosleep(&ts, NULL);
}

static void nccl_disarm(braid_comm *c) { (void)c; }

static int world_rank(const braid_comm *c, int q) { return c->world_of ? c->world_of[q] : q; }

static braid_status nccl_check_peers(braid_comm *c, int peer, const char *what) {
  nccl_state *s = state(c);
  (void)what;
  if (!c->boot || !c->boot->store || !s->pids) return BRAID_OK;
  for (int i = 0; i < c->size; i++) {
    int q = peer >= 0 ? peer : i;
    if (q != c->rank) {
      if (!s->pids[q]) s->pids[q] = braid__boot_world_pid(c->boot, world_rank(c, q));
      if (s->pids[q] > 0 && kill((pid_t)s->pids[q], 0) != 0 && errno == ESRCH) {
        /* A rank that saw a death first, published it and then ended
           normally is gone too: its sentence names the rank that died. */
        if (braid__poll_remote_failure(c, 1)) {
          end_comm(s);
          return (braid_status)atomic_load(&c->failed);
        }
        braid_status st = braid__fail(c, BRAID_ERR_PEER_LOST, "rank %d (pid %ld) died", braid__label(c, q),
                                      s->pids[q]);
        end_comm(s);
        return st;
      }
    }
    if (peer >= 0) break;
  }
  return BRAID_OK;
}

static void nccl_abort(braid_comm *c) {
  (void)c; /* waiters nap at most 20 us and see the flag; the call that returns ends the NCCL communicator */
}

/* ------------------------------------------------------------ init and destroy */

static void state_free(nccl_state *s) {
  const braid__nccl_api *a = s->a;
  for (int i = 0; i < RING; i++)
    if (s->ring[i].ev) a->cudaEventDestroy(s->ring[i].ev);
  if (s->stream) a->cudaStreamDestroy(s->stream);
  if (s->dchk) a->cudaFree(s->dchk);
  if (s->hchk) a->cudaFreeHost(s->hchk);
  if (s->dmsg) a->cudaFree(s->dmsg);
  if (s->hmsg) a->cudaFreeHost(s->hmsg);
  if (s->scratch) a->cudaFree(s->scratch);
  if (s->dcnt) a->cudaFree(s->dcnt);
  if (s->hcnt) a->cudaFreeHost(s->hcnt);
  free(s->nsend);
  free(s->nrecv);
  free(s->pids);
  free(s->prounds);
  free(s);
}

/* The unique id: rank 0 makes it, the others read it from the store in
   short waits, between them a look for ranks that died while starting. */
static braid_status share_id(braid_comm *c, ncclUniqueId *id) {
  nccl_state *s = state(c);
  if (c->rank == 0) {
    ncclResult_t rc = s->a->ncclGetUniqueId(id);
    if (rc != ncclSuccess) return nccl_fail(c, "ncclGetUniqueId", rc);
    if (c->size == 1) return BRAID_OK;
    braid_status st = braid__boot_set(c->boot, "nccl/id", id, sizeof *id);
    return st ? braid__fail(c, BRAID_ERR_BOOTSTRAP, "could not publish the NCCL unique id: %s",
                            braid__store_error(c->boot->store))
              : BRAID_OK;
  }
  braid__store *store = c->boot->store;
  double deadline = braid__deadline(c->boot->init_timeout_s);
  void *v = NULL;
  size_t len = 0;
  braid_status gs;
  while ((gs = braid__store_get(store, "nccl/id", &v, &len, braid__now() + 0.1 < deadline ? braid__now() + 0.1
                                                                                            : deadline)) ==
             BRAID_ERR_TIMEOUT &&
         braid__now() < deadline) {
    braid_status st = braid__start_check(c, "the start of a communicator, while the ranks waited for rank 0's NCCL id");
    if (st) return st;
  }
  if (gs || len != sizeof *id) {
    free(v);
    return braid__fail(c, BRAID_ERR_BOOTSTRAP, "could not learn rank 0's NCCL unique id: %s",
                       gs ? braid__store_error(store) : "wrong size");
  }
  memcpy(id, v, sizeof *id);
  free(v);
  return BRAID_OK;
}

static int comm_ready(braid_comm *c) {
  nccl_state *s = state(c);
  ncclResult_t as = ncclSuccess;
  return s->a->ncclCommGetAsyncError(s->comm, &as) != ncclSuccess || as != ncclInProgress;
}

static braid_status pick_device(braid_comm *c, int *dev) {
  nccl_state *s = state(c);
  char err[BRAID_ERRLEN];
  long d = -1;
  if (braid__param_str(BRAID_P_CUDA_DEVICE)) {
    if (braid__param_int(BRAID_P_CUDA_DEVICE, 0, s->a->device_count - 1, &d, err, sizeof err))
      return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s (%d CUDA devices are visible)", err, s->a->device_count);
  } else {
    int local = c->boot ? c->boot->local_rank : 0;
    d = local < 0 ? 0 : local % s->a->device_count;
  }
  *dev = (int)d;
  return BRAID_OK;
}

static braid_status nccl_init(braid_comm *c) {
  char err[BRAID_ERRLEN];
  braid_status st;
  const braid__nccl_api *a = braid__nccl_load(&st, err, sizeof err);
  if (!a) return braid__fail(c, st, "backend nccl cannot run here: %s", err);
  nccl_state *s = calloc(1, sizeof *s);
  if (!s) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for the nccl state");
  s->a = a;
  s->queued_tail = &s->queued;
  s->chk_slot = -1;
  c->be = s;
  s->nsend = calloc((size_t)c->size, sizeof *s->nsend);
  s->nrecv = calloc((size_t)c->size, sizeof *s->nrecv);
  s->pids = calloc((size_t)c->size, sizeof *s->pids);
  s->prounds = calloc((size_t)c->size, sizeof *s->prounds);
  if (!s->nsend || !s->nrecv || !s->pids || !s->prounds) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %d ranks", c->size);
  if ((st = pick_device(c, &s->device))) return st;
  cudaError_t e = a->cudaSetDevice(s->device);
  if (e != cudaSuccess) return cuda_fail(c, "cudaSetDevice", e);
  if ((e = a->cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess)
    return cuda_fail(c, "cudaStreamCreateWithFlags", e);
  for (int i = 0; i < RING; i++)
    if ((e = a->cudaEventCreateWithFlags(&s->ring[i].ev, cudaEventDisableTiming)) != cudaSuccess)
      return cuda_fail(c, "cudaEventCreateWithFlags", e);
  if ((e = a->cudaMalloc((void **)&s->dchk, (RING * 2 + 2) * sizeof(uint32_t))) != cudaSuccess)
    return cuda_fail(c, "cudaMalloc", e);
  if ((e = a->cudaMallocHost((void **)&s->hchk, RING * 4 * sizeof(uint32_t))) != cudaSuccess)
    return cuda_fail(c, "cudaMallocHost", e);
  ncclUniqueId id;
  if ((st = share_id(c, &id))) return st;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t rc = a->ncclCommInitRankConfig(&s->comm, c->size, id, c->rank, &cfg);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    s->comm = NULL;
    return nccl_fail(c, "ncclCommInitRankConfig", rc);
  }
  /* Bounded like the rendezvous; a rank that died while starting fails it. */
  double deadline = braid__deadline(c->boot && c->boot->init_timeout_s > 0 ? c->boot->init_timeout_s : c->timeout_s);
  double next_check = braid__now() + 0.1;
  while (!comm_ready(c)) {
    if (braid__now() > deadline) {
      end_comm(s);
      return braid__fail(c, BRAID_ERR_BOOTSTRAP, "ncclCommInitRankConfig did not finish within %g s",
                         c->boot ? c->boot->init_timeout_s : c->timeout_s);
    }
    if (braid__now() > next_check) {
      next_check = braid__now() + 0.1;
      if ((st = braid__start_check(c, "ncclCommInitRankConfig"))) {
        end_comm(s);
        return st;
      }
    }
    braid__sleep(50e-6);
  }
  ncclResult_t as = ncclSuccess;
  rc = a->ncclCommGetAsyncError(s->comm, &as);
  if (rc == ncclSuccess) rc = as;
  if (rc != ncclSuccess) {
    /* The usual cause of NCCL's refusal: more ranks on a host than GPUs. */
    int shared = rc == ncclInvalidUsage && c->boot && c->boot->local_size > a->device_count;
    const char *why = nccl_detail(s);
    st = shared ? braid__fail(c, BRAID_ERR_INVALID_ARG,
                              "ncclCommInitRankConfig refused the communicator: %d ranks on this host share %d GPU(s), "
                              "and NCCL needs a GPU of its own for each rank (start at most one rank per GPU); NCCL "
                              "says: %s",
                              c->boot->local_size, a->device_count,
                              why ? why : a->ncclGetErrorString(rc))
                : nccl_fail(c, "ncclCommInitRankConfig", rc);
    end_comm(s);
    return st;
  }
  c->spin_limit = 2000;
  BLOG_INFO(BRAID_SUB_INIT, c->rank, "nccl: rank %d of %d on CUDA device %d, NCCL %d (%s), runtime %s", c->rank,
            c->size, s->device, a->nccl_version, a->nccl_path, a->cudart_path);
  return BRAID_OK;
}

static void nccl_destroy(braid_comm *c, double timeout_s) {
  nccl_state *s = state(c);
  if (!s) return;
  double deadline = braid__now() + timeout_s;
  if (s->comm && !atomic_load(&c->failed)) {
    while ((s->queued || s->round_open || !stream_idle(c)) && braid__now() < deadline) {
      if (nccl_progress(c)) break;
      sched_yield();
    }
  }
  int unfinished = !stream_idle(c) || s->queued;
  if (s->comm && !unfinished && !atomic_load(&c->failed)) {
    ncclResult_t rc = s->a->ncclCommFinalize(s->comm);
    while (rc == ncclInProgress && braid__now() < deadline) {
      ncclResult_t as = ncclSuccess;
      rc = s->a->ncclCommGetAsyncError(s->comm, &as);
      if (rc == ncclSuccess) rc = as;
      if (rc == ncclInProgress) sched_yield();
    }
    if (rc == ncclSuccess) {
      s->a->ncclCommDestroy(s->comm);
      s->comm = NULL;
    }
  }
  if (s->comm && unfinished)
    BLOG_WARN(BRAID_SUB_INIT, c->rank, "braid_destroy: operations on the stream did not finish within %g s; the "
              "NCCL communicator is aborted", timeout_s);
  end_comm(s); /* anything still running stops here, so the stream can be freed */
  /* Bounded: a stream still held up (by an event of a user stream that never
     completes) keeps its memory, since cudaFree would wait for it. */
  double until = braid__now() + timeout_s + 1.0;
  int idle = stream_idle(c);
  while (!idle && braid__now() < until) {
    cudaError_t e = s->a->cudaStreamQuery(s->stream);
    idle = e != cudaErrorNotReady;
    if (!idle) braid__sleep(1e-3);
  }
  if (!idle) {
    BLOG_WARN(BRAID_SUB_INIT, c->rank, "braid_destroy: the communication stream is still busy; its device memory "
              "is left allocated");
    s->dchk = NULL, s->dmsg = NULL, s->scratch = NULL, s->dcnt = NULL;
    s->hchk = NULL, s->hmsg = NULL, s->hcnt = NULL;
  }
  for (nccl_req *r = s->flight, *rn; r; r = rn) {
    rn = r->next;
    braid__req_drop(c, &r->base);
  }
  for (nccl_req *r = s->queued, *rn; r; r = rn) {
    rn = r->next;
    braid__req_drop(c, &r->base);
  }
  if (s->busy) c->npending--;
  state_free(s);
  c->be = NULL;
}

/* ------------------------------------------------------------ collectives */

/* Work enqueued after the last unit: the next unit covers it, and
   braid_sync waits for it. */
static void tail_pending(braid_comm *c) {
  nccl_state *s = state(c);
  s->tail_open = 1;
  if (!s->busy) {
    s->busy = 1;
    c->npending++;
  }
}

/* Before enqueueing collective work: failures, queued point to point, room
   in the ring, and (with the check) the digest reduction. */
static braid_status coll_begin(braid_comm *c) {
  nccl_state *s = state(c);
  braid_status st = flush_p2p(c);
  if (!st) st = wait_until(c, ring_has_room2, "the stream's earlier operations");
  s->chk_slot = -1;
  if (st || !c->check) return st;
  int slot = (int)(s->nchk++ % RING);
  s->chk_slot = slot;
  uint32_t *h = s->hchk + 4 * slot;
  h[0] = c->desc_hash;
  h[1] = ~c->desc_hash;
  cudaError_t e = s->a->cudaMemcpyAsync(s->dchk + 2 * slot, h, 2 * sizeof(uint32_t), cudaMemcpyHostToDevice, s->stream);
  if (e != cudaSuccess) return cuda_fail(c, "cudaMemcpyAsync", e);
  ncclResult_t rc = s->a->ncclAllReduce(s->dchk + 2 * slot, s->dchk + 2 * slot, 2, ncclUint32, ncclMax, s->comm,
                                        s->stream);
  if ((st = settle(c, "ncclAllReduce of the call check", rc))) return st;
  e = s->a->cudaMemcpyAsync(h + 2, s->dchk + 2 * slot, 2 * sizeof(uint32_t), cudaMemcpyDeviceToHost, s->stream);
  if (e != cudaSuccess) return cuda_fail(c, "cudaMemcpyAsync", e);
  /* A unit of its own: the check answers even when the collective itself
     cannot complete (ranks in different calls often hang in NCCL). */
  return ring_push(c, 1);
}

/* After enqueueing: the unit joins the ring and braid_sync waits for it. */
static braid_status coll_end(braid_comm *c, const char *fn, ncclResult_t rc) {
  braid_status st = settle(c, fn, rc);
  if (st) return st;
  tail_pending(c);
  return BRAID_OK;
}

/* The three reductions: the op made (a scaled sum is created for the call
   and destroyed once it is enqueued), then the call on the stream. */
typedef enum { RED_ALL, RED_ROOT, RED_SCATTER } red_kind;

static braid_status reduction(braid_comm *c, red_kind k, const void *send, void *recv, size_t count, braid_dtype dt,
                              braid_op op, int root) {
  nccl_state *s = state(c);
  red r;
  braid_status st = nccl_red(c, dt, op, &r);
  if (!st) st = coll_begin(c);
  if (st) {
    red_done(c, &r);
    return st;
  }
  const size_t n = count * r.mult;
  ncclResult_t rc;
  const char *fn;
  switch (k) {
    case RED_ALL: rc = s->a->ncclAllReduce(send, recv, n, r.t, r.op, s->comm, s->stream), fn = "ncclAllReduce"; break;
    case RED_ROOT: rc = s->a->ncclReduce(send, recv, n, r.t, r.op, root, s->comm, s->stream), fn = "ncclReduce"; break;
    default:
      rc = s->a->ncclReduceScatter(send, recv, n, r.t, r.op, s->comm, s->stream), fn = "ncclReduceScatter";
      break;
  }
  red_done(c, &r);
  return coll_end(c, fn, rc);
}

static braid_status nccl_all_reduce(braid_comm *c, void *buf, size_t count, braid_dtype dt, braid_op op) {
  return reduction(c, RED_ALL, buf, buf, count, dt, op, 0);
}

static braid_status nccl_reduce(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                braid_op op, int root) {
  return reduction(c, RED_ROOT, send, recv, count, dt, op, root);
}

static braid_status nccl_reduce_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                        braid_op op) {
  return reduction(c, RED_SCATTER, send, recv, count, dt, op, 0);
}

/* Data movement without arithmetic carries any dtype as bytes. */
static braid_status nccl_broadcast(braid_comm *c, void *buf, size_t count, braid_dtype dt, int root) {
  nccl_state *s = state(c);
  braid_status st = coll_begin(c);
  if (st) return st;
  ncclResult_t rc =
      s->a->ncclBroadcast(buf, buf, count * braid_dtype_size(dt), ncclUint8, root, s->comm, s->stream);
  return coll_end(c, "ncclBroadcast", rc);
}

static braid_status nccl_all_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt) {
  nccl_state *s = state(c);
  braid_status st = coll_begin(c);
  if (st) return st;
  ncclResult_t rc = s->a->ncclAllGather(send, recv, count * braid_dtype_size(dt), ncclUint8, s->comm, s->stream);
  return coll_end(c, "ncclAllGather", rc);
}

static braid_status scratch(braid_comm *c, size_t bytes, char **out) {
  nccl_state *s = state(c);
  if (s->scratch_len < bytes) {
    if (s->scratch) {
      /* The stream may still read the old one. */
      braid_status st = wait_until(c, stream_idle, "the stream before it frees scratch memory");
      if (st) return st;
      s->a->cudaFree(s->scratch);
      s->scratch = NULL;
      s->scratch_len = 0;
    }
    cudaError_t e = s->a->cudaMalloc(&s->scratch, bytes);
    if (e != cudaSuccess) return cuda_fail(c, "cudaMalloc of scratch memory", e);
    s->scratch_len = bytes;
  }
  *out = s->scratch;
  return BRAID_OK;
}

static braid_status copy_d2d(braid_comm *c, void *dst, const void *src, size_t bytes) {
  nccl_state *s = state(c);
  if (dst == src || !bytes) return BRAID_OK;
  cudaError_t e = s->a->cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s->stream);
  return e != cudaSuccess ? cuda_fail(c, "cudaMemcpyAsync", e) : BRAID_OK;
}

/* The copy hook: after the queued sends and receives, on the stream; a
   later event (the next wait's) covers it. */
static braid_status nccl_copy(braid_comm *c, void *dst, const void *src, size_t bytes, braid__copy_dir dir) {
  nccl_state *s = state(c);
  braid_status st = flush_p2p(c);
  if (st || !bytes) return st;
  static const enum cudaMemcpyKind kind[] = {cudaMemcpyDeviceToHost, cudaMemcpyHostToDevice,
                                             cudaMemcpyDeviceToDevice};
  cudaError_t e = s->a->cudaMemcpyAsync(dst, src, bytes, kind[dir], s->stream);
  if (e != cudaSuccess) return cuda_fail(c, "cudaMemcpyAsync", e);
  tail_pending(c);
  return BRAID_OK;
}

/* Gather, scatter and all-to-all(v) are groups of sends and receives, as
   NCCL documents them (its own versions exist only in recent releases). */
typedef struct xfer {
  const void *sbuf;
  void *rbuf;
  size_t sbytes, rbytes;
} xfer;

static braid_status group_xfer(braid_comm *c, const char *fn, xfer (*at)(void *arg, int q), void *arg) {
  nccl_state *s = state(c);
  const braid__nccl_api *a = s->a;
  ncclResult_t rc = a->ncclGroupStart();
  for (int q = 0; q < c->size && rc == ncclSuccess; q++) {
    xfer x = at(arg, q);
    if (q == c->rank) continue;
    if (x.sbytes) rc = a->ncclSend(x.sbuf, x.sbytes, ncclUint8, q, s->comm, s->stream);
    if (rc == ncclSuccess && x.rbytes) rc = a->ncclRecv(x.rbuf, x.rbytes, ncclUint8, q, s->comm, s->stream);
  }
  ncclResult_t end = a->ncclGroupEnd();
  return coll_end(c, fn, rc == ncclSuccess ? end : rc);
}

typedef struct blk_arg {
  const char *send;
  char *recv;
  size_t bytes;
  int root, rank, kind; /* 0 gather, 1 scatter, 2 all-to-all */
} blk_arg;

static xfer blk_at(void *arg, int q) {
  blk_arg *b = arg;
  xfer x = {NULL, NULL, 0, 0};
  if (b->kind == 2) {
    x.sbuf = b->send + (size_t)q * b->bytes;
    x.rbuf = b->recv + (size_t)q * b->bytes;
    x.sbytes = x.rbytes = b->bytes;
  } else if (b->kind == 0) { /* gather: everyone sends to the root, which receives from all */
    if (b->rank == b->root) x.rbuf = b->recv + (size_t)q * b->bytes, x.rbytes = b->bytes;
    else if (q == b->root) x.sbuf = b->send, x.sbytes = b->bytes;
  } else {
    if (b->rank == b->root) x.sbuf = b->send + (size_t)q * b->bytes, x.sbytes = b->bytes;
    else if (q == b->root) x.rbuf = b->recv, x.rbytes = b->bytes;
  }
  return x;
}

static braid_status nccl_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int root) {
  size_t bytes = count * braid_dtype_size(dt);
  blk_arg b = {send, recv, bytes, root, c->rank, 0};
  braid_status st = coll_begin(c);
  if (!st && c->rank == root) st = copy_d2d(c, (char *)recv + (size_t)root * bytes, send, bytes);
  return st ? st : group_xfer(c, "ncclSend/ncclRecv (gather)", blk_at, &b);
}

static braid_status nccl_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                 int root) {
  size_t bytes = count * braid_dtype_size(dt);
  blk_arg b = {send, recv, bytes, root, c->rank, 1};
  braid_status st = coll_begin(c);
  if (!st && c->rank == root) st = copy_d2d(c, recv, (const char *)send + (size_t)root * bytes, bytes);
  return st ? st : group_xfer(c, "ncclSend/ncclRecv (scatter)", blk_at, &b);
}

static braid_status nccl_all_to_all(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt) {
  size_t bytes = count * braid_dtype_size(dt), total = bytes * (size_t)c->size;
  braid_status st = coll_begin(c);
  char *tmp = NULL;
  if (!st && send == recv && c->size > 1) { /* in place: the outgoing blocks are copied first */
    st = scratch(c, total, &tmp);
    if (!st) st = copy_d2d(c, tmp, send, total);
    send = tmp;
  }
  if (st) return st;
  const size_t me = (size_t)c->rank * bytes;
  if ((st = copy_d2d(c, (char *)recv + me, (const char *)send + me, bytes))) return st;
  blk_arg b = {send, recv, bytes, 0, c->rank, 2};
  return group_xfer(c, "ncclSend/ncclRecv (all-to-all)", blk_at, &b);
}

typedef struct v_arg {
  const char *send;
  char *recv;
  const size_t *sc, *sd, *rc, *rd;
  size_t es;
} v_arg;

static xfer v_at(void *arg, int q) {
  v_arg *v = arg;
  xfer x = {v->send + v->sd[q] * v->es, v->recv + v->rd[q] * v->es, v->sc[q] * v->es, v->rc[q] * v->es};
  return x;
}

/* All-to-allv's counts, checked before any data moves (NCCL would pair
   differently sized transfers): each rank sends each peer the count it
   sends it, and compares what it hears with what it expects. */
static braid_status check_counts(braid_comm *c, const size_t *sc, const size_t *rc) {
  nccl_state *s = state(c);
  const braid__nccl_api *a = s->a;
  const int n = c->size;
  cudaError_t e;
  if (!s->dcnt) {
    if ((e = a->cudaMalloc((void **)&s->dcnt, 2 * (size_t)n * sizeof(uint64_t))) != cudaSuccess)
      return cuda_fail(c, "cudaMalloc", e);
    if ((e = a->cudaMallocHost((void **)&s->hcnt, 2 * (size_t)n * sizeof(uint64_t))) != cudaSuccess)
      return cuda_fail(c, "cudaMallocHost", e);
  }
  braid_status st = wait_until(c, stream_idle, "the stream before all-to-allv's count check");
  if (st) return st;
  for (int q = 0; q < n; q++) s->hcnt[q] = sc[q];
  size_t half = (size_t)n * sizeof(uint64_t);
  if ((e = a->cudaMemcpyAsync(s->dcnt, s->hcnt, half, cudaMemcpyHostToDevice, s->stream)) != cudaSuccess)
    return cuda_fail(c, "cudaMemcpyAsync", e);
  ncclResult_t r = a->ncclGroupStart();
  for (int q = 0; q < n && r == ncclSuccess; q++) {
    r = a->ncclSend(s->dcnt + q, sizeof(uint64_t), ncclUint8, q, s->comm, s->stream);
    if (r == ncclSuccess) r = a->ncclRecv(s->dcnt + n + q, sizeof(uint64_t), ncclUint8, q, s->comm, s->stream);
  }
  ncclResult_t end = a->ncclGroupEnd();
  if ((st = settle(c, "ncclSend/ncclRecv of all-to-allv's counts", r == ncclSuccess ? end : r))) return st;
  if ((e = a->cudaMemcpyAsync(s->hcnt + n, s->dcnt + n, half, cudaMemcpyDeviceToHost, s->stream)) != cudaSuccess)
    return cuda_fail(c, "cudaMemcpyAsync", e);
  if ((st = ring_push(c, 0))) return st;
  if ((st = wait_until(c, stream_idle, "the other ranks' all-to-allv counts"))) return st;
  for (int q = 0; q < n; q++)
    if (s->hcnt[n + q] != rc[q])
      return braid__fail_comm(c, BRAID_ERR_MISMATCH,
                              "all-to-allv: rank %d sends this rank %llu elements but recv_counts[%d] is %zu",
                              braid__label(c, q), (unsigned long long)s->hcnt[n + q], q, rc[q]);
  return BRAID_OK;
}

static braid_status nccl_all_to_allv(braid_comm *c, const void *send, const size_t *send_counts,
                                     const size_t *send_displs, void *recv, const size_t *recv_counts,
                                     const size_t *recv_displs, braid_dtype dt) {
  const size_t es = braid_dtype_size(dt);
  const int n = c->size, inplace = send == recv;
  if (inplace) send_counts = recv_counts, send_displs = recv_displs;
  braid_status st = coll_begin(c);
  if (!st && c->check) st = check_counts(c, send_counts, recv_counts);
  if (st) return st;
  size_t *sd = NULL;
  if (inplace && n > 1) { /* the outgoing blocks, packed into scratch */
    size_t total = 0;
    for (int q = 0; q < n; q++) total += recv_counts[q] * es;
    sd = malloc(sizeof *sd * (size_t)n);
    char *tmp = NULL;
    if (!sd) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %d displacements", n);
    st = scratch(c, total ? total : 1, &tmp);
    size_t off = 0;
    for (int q = 0; q < n && !st; q++) {
      sd[q] = off / es;
      if (q != c->rank) st = copy_d2d(c, tmp + off, (const char *)recv + recv_displs[q] * es, recv_counts[q] * es);
      off += recv_counts[q] * es;
    }
    send = tmp;
    send_displs = sd;
  }
  if (!st && !inplace)
    st = copy_d2d(c, (char *)recv + recv_displs[c->rank] * es, (const char *)send + send_displs[c->rank] * es,
                  recv_counts[c->rank] * es);
  v_arg v = {send, recv, send_counts, send_displs, recv_counts, recv_displs, es};
  if (!st) st = group_xfer(c, "ncclSend/ncclRecv (all-to-allv)", v_at, &v);
  free(sd);
  return st;
}

/* A barrier is an all-reduce every rank joins, waited for. */
static braid_status nccl_barrier(braid_comm *c) {
  nccl_state *s = state(c);
  braid_status st = coll_begin(c);
  if (st) return st;
  uint32_t *word = s->dchk + 2 * RING;
  ncclResult_t rc = s->a->ncclAllReduce(word, word, 1, ncclUint32, ncclMax, s->comm, s->stream);
  st = coll_end(c, "ncclAllReduce (barrier)", rc);
  return st ? st : wait_until(c, stream_idle, "the other ranks to enter the barrier");
}

/* ------------------------------------------------------------ streams and events */

static braid_status ev_fail(braid_comm *c, const char *fn, cudaError_t e) {
  return braid__fail(c, e == cudaErrorInvalidValue ? BRAID_ERR_INVALID_ARG : BRAID_ERR_BACKEND, "%s failed: %s", fn,
                     state(c)->a->cudaGetErrorString(e));
}

static braid_status nccl_event_create(braid_comm *c, uint64_t *event) {
  cudaEvent_t ev = NULL;
  cudaError_t e = state(c)->a->cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) return ev_fail(c, "cudaEventCreateWithFlags", e);
  *event = (uint64_t)(uintptr_t)ev;
  return BRAID_OK;
}

static braid_status nccl_event_destroy(braid_comm *c, uint64_t event) {
  if (!event) return braid__fail(c, BRAID_ERR_INVALID_ARG, "event is 0 (not an event braid_event_create made)");
  cudaError_t e = state(c)->a->cudaEventDestroy((cudaEvent_t)(uintptr_t)event);
  return e != cudaSuccess ? ev_fail(c, "cudaEventDestroy", e) : BRAID_OK;
}

/* Operations braid has queued (sends and receives) reach the stream first,
   so the event covers every call made before it. */
static braid_status nccl_event_record_on_comm_stream(braid_comm *c, uint64_t event) {
  if (!event) return braid__fail(c, BRAID_ERR_INVALID_ARG, "event is 0 (not an event braid_event_create made)");
  braid_status st = flush_p2p(c);
  if (st) return st;
  cudaError_t e = state(c)->a->cudaEventRecord((cudaEvent_t)(uintptr_t)event, state(c)->stream);
  return e != cudaSuccess ? ev_fail(c, "cudaEventRecord", e) : BRAID_OK;
}

static braid_status nccl_event_record_on_stream(braid_comm *c, uint64_t event, uint64_t stream) {
  if (!event) return braid__fail(c, BRAID_ERR_INVALID_ARG, "event is 0 (not an event braid_event_create made)");
  cudaError_t e = state(c)->a->cudaEventRecord((cudaEvent_t)(uintptr_t)event, (cudaStream_t)(uintptr_t)stream);
  return e != cudaSuccess ? ev_fail(c, "cudaEventRecord", e) : BRAID_OK;
}

/* Sends and receives queued before this call wait for the event too: they
   are issued first, after the wait. */
static braid_status nccl_comm_stream_wait_event(braid_comm *c, uint64_t event) {
  if (!event) return braid__fail(c, BRAID_ERR_INVALID_ARG, "event is 0 (not an event braid_event_create made)");
  cudaError_t e = state(c)->a->cudaStreamWaitEvent(state(c)->stream, (cudaEvent_t)(uintptr_t)event, 0);
  return e != cudaSuccess ? ev_fail(c, "cudaStreamWaitEvent", e) : BRAID_OK;
}

static braid_status nccl_stream_wait_event(braid_comm *c, uint64_t stream, uint64_t event) {
  if (!event) return braid__fail(c, BRAID_ERR_INVALID_ARG, "event is 0 (not an event braid_event_create made)");
  cudaError_t e = state(c)->a->cudaStreamWaitEvent((cudaStream_t)(uintptr_t)stream, (cudaEvent_t)(uintptr_t)event, 0);
  return e != cudaSuccess ? ev_fail(c, "cudaStreamWaitEvent", e) : BRAID_OK;
}

/* Waits for everything on the communication stream, braid's queued sends
   and receives included, in the wait engine (timeout, abort, peers). */
static braid_status nccl_sync_comm_stream(braid_comm *c) {
  braid_status st = flush_p2p(c);
  if (!st) st = wait_until(c, stream_idle, "the communication stream");
  return st;
}

/* The event hier waits for on the host; cudaEventQuery's error, if any. */
static int awaited_done(braid_comm *c) {
  nccl_state *s = state(c);
  cudaError_t e = s->a->cudaEventQuery(s->awaited);
  if (e == cudaErrorNotReady) return 0;
  s->awaited_err = e;
  return 1;
}

static braid_status nccl_event_sync(braid_comm *c, uint64_t event) {
  nccl_state *s = state(c);
  if (!event) return braid__fail(c, BRAID_ERR_INVALID_ARG, "event is 0 (not an event braid_event_create made)");
  s->awaited = (cudaEvent_t)(uintptr_t)event;
  s->awaited_err = cudaSuccess;
  braid_status st = wait_until(c, awaited_done, "a copy on the communication stream");
  s->awaited = NULL;
  /* A query that fails reports the stream's sticky error: the communicator fails. */
  if (!st && s->awaited_err != cudaSuccess) st = cuda_fail(c, "cudaEventQuery", s->awaited_err);
  return st;
}

static const braid__stream_ops nccl_stream_ops = {
    .event_create = nccl_event_create,
    .event_destroy = nccl_event_destroy,
    .event_record_on_comm_stream = nccl_event_record_on_comm_stream,
    .event_record_on_stream = nccl_event_record_on_stream,
    .comm_stream_wait_event = nccl_comm_stream_wait_event,
    .stream_wait_event = nccl_stream_wait_event,
    .sync_comm_stream = nccl_sync_comm_stream,
    .event_sync = nccl_event_sync,
};

/* ------------------------------------------------------------ memory */

static braid_status nccl_host_alloc(braid_comm *c, void **ptr, size_t size) {
  cudaError_t e = state(c)->a->cudaMallocHost(ptr, size);
  if (e == cudaSuccess) return BRAID_OK;
  *ptr = NULL;
  return braid__fail(c, BRAID_ERR_NO_MEMORY, "cudaMallocHost of %zu bytes failed: %s", size,
                     state(c)->a->cudaGetErrorString(e));
}

static void nccl_host_free(braid_comm *c, void *ptr) { state(c)->a->cudaFreeHost(ptr); }

static braid_status nccl_mem_alloc(braid_comm *c, void **ptr, size_t size) {
  ncclResult_t rc = state(c)->a->ncclMemAlloc(ptr, size);
  if (rc != ncclSuccess) {
    *ptr = NULL;
    braid_status st = nccl_fail(c, "ncclMemAlloc", rc);
    return st == BRAID_ERR_BACKEND ? BRAID_ERR_NO_MEMORY : st;
  }
  return BRAID_OK;
}

static braid_status nccl_mem_free(braid_comm *c, void *ptr) {
  ncclResult_t rc = state(c)->a->ncclMemFree(ptr);
  return rc != ncclSuccess ? nccl_fail(c, "ncclMemFree", rc) : BRAID_OK;
}

static braid_status nccl_mem_register(braid_comm *c, void *buf, size_t size, void **handle) {
  nccl_state *s = state(c);
  ncclResult_t rc = s->a->ncclCommRegister(s->comm, buf, size, handle);
  return rc != ncclSuccess ? nccl_fail(c, "ncclCommRegister", rc) : BRAID_OK;
}

static braid_status nccl_mem_deregister(braid_comm *c, void *handle) {
  nccl_state *s = state(c);
  ncclResult_t rc = s->a->ncclCommDeregister(s->comm, handle);
  return rc != ncclSuccess ? nccl_fail(c, "ncclCommDeregister", rc) : BRAID_OK;
}

const braid__backend braid__nccl_backend = {
    .name = "nccl",
    .caps = BRAID__CAP_NEEDS_STORE | BRAID__CAP_DEVICE_MEM | BRAID__CAP_PREMUL,
    .dtypes = BRAID__ALL_DTYPES,
    .req_size = sizeof(nccl_req),
    .umsg_size = sizeof(braid__umsg),
    .init = nccl_init,
    .split = NULL, /* init over the child's store namespace: ncclCommSplit would make ranks outside the new
                      communicators wait in it too */
    .destroy = nccl_destroy,
    .abort = nccl_abort,
    .isend = nccl_isend,
    .irecv = nccl_irecv,
    .progress = nccl_progress,
    .take = nccl_take,
    .release_umsg = nccl_release_umsg,
    .arm = nccl_arm,
    .sleep = nccl_sleep,
    .disarm = nccl_disarm,
    .check_peers = nccl_check_peers,
    .barrier = nccl_barrier,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .reduce = nccl_reduce,
    .gather = nccl_gather,
    .scatter = nccl_scatter,
    .all_to_all = nccl_all_to_all,
    .all_to_allv = nccl_all_to_allv,
    .stream = &nccl_stream_ops,
    .copy = nccl_copy,
    .host_alloc = nccl_host_alloc,
    .host_free = nccl_host_free,
    .mem_alloc = nccl_mem_alloc,
    .mem_free = nccl_mem_free,
    .mem_register = nccl_mem_register,
    .mem_deregister = nccl_mem_deregister,
};
