/* Backend "mpi": braid over an MPI library. Rank and size come from MPI
   (a duplicate of MPI_COMM_WORLD or of the communicator in cfg->mpi_comm);
   there is no braid store.

   Point to point: every braid message is a header on MPI tag HDR from its
   sender, carrying the payload or its start when that is small (the rule
   at INLINE_MAX), then the rest of the payload on tag DATA in pieces.
   braid's 64-bit tag travels in the header, so any MPI_TAG_UB works
   (MPI guarantees 32767) and order per (source, braid tag) follows from
   MPI's non-overtaking order per (source, MPI tag): each rank keeps one
   header receive posted per peer and reads each peer's headers in order;
   payloads follow on data tags (TAG_DATA, TAG_BIG0).

   Collectives either run braid's generic algorithms over that point to
   point (their messages carry the call's descriptor, so the cross-rank
   check costs nothing more), or map to MPI's non-blocking ones, completed
   in test loops of the core's wait engine (so BRAID_TIMEOUT, abort and
   failures of other ranks interrupt them). braid must not block inside
   MPI, and an MPI's non-blocking collectives can cost far more per call
   than its blocking ones (Open MPI builds a schedule each time), so
   BRAID_MPI_COLL=auto takes the generic algorithms where they measured
   faster (GENERIC_UPTO) and MPI's elsewhere. Before each of MPI's, unless
   BRAID_CHECK=0, the ranks reduce the call's digest (max of it and of its
   complement: equal on every rank or every rank sees the difference), so
   ranks in different calls get BRAID_ERR_MISMATCH instead of MPI's
   undefined behaviour.
   Reductions MPI has natively for a dtype use MPI's ops; the others (f16,
   bf16, fp8 widened to f32, bool, NaN-propagating float min/max, complex
   prod) use braid's kernels through MPI_Op_create.

   MPI calls are serialized by one process-wide lock (braid needs
   MPI_THREAD_SERIALIZED). */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algos/algos.h"
#include "backends/backends.h"
#include "core/params.h"
#include "core/reduce.h"
#include "core/subcomm.h"
#include "core/wait.h"
#include "os/time.h"

/* MPICH's mpi.h gives MPI_Testall and MPI_Testsome an access attribute sized
   by the count, which MPI_STATUSES_IGNORE (the sentinel the standard asks
   for) trips in GCC's -Wstringop-overflow. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif
static int test_all(int n, MPI_Request *rq, int *flag) { return MPI_Testall(n, rq, flag, MPI_STATUSES_IGNORE); }
/* The same, with the failed request's own error where MPI says only
   MPI_ERR_IN_STATUS (that error is what braid's sentence must name); st:
   n statuses, or NULL (then MPI's code as it is). */
static int test_all_why(int n, MPI_Request *rq, int *flag, MPI_Status *st) {
  int rc = MPI_Testall(n, rq, flag, st ? st : MPI_STATUSES_IGNORE);
  for (int i = 0; rc == MPI_ERR_IN_STATUS && st && i < n; i++)
    if (st[i].MPI_ERROR != MPI_SUCCESS && st[i].MPI_ERROR != MPI_ERR_PENDING) rc = st[i].MPI_ERROR;
  return rc;
}
static int test_some(int n, MPI_Request *rq, int *done, int *idx) {
  return MPI_Testsome(n, rq, done, idx, MPI_STATUSES_IGNORE);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

enum { TAG_HDR = 1, TAG_DATA = 2, TAG_FAIL = 3, TAG_SPLIT = 4, TAG_A2AV = 5, TAG_POS = 6 };
/* A payload past EAGER_MAX travels on a tag of its own, the next of NBIG
   from TAG_BIG0 for each such message between an ordered pair (both sides
   count them in header order). So its receive can wait until braid's
   receive is posted: an unexpected large message stays with its sender
   (MPI's rendezvous) instead of being received into a buffer of its own,
   which cost an allocation whose pages fault in, and a second copy. A
   header whose tag an older message still waits on receives that one into
   a buffer first, so MPI's order per tag matches each receive to its own
   message. */
enum { TAG_BIG0 = 16, NBIG = 256 };
/* Messages stay within the MPI's shared-memory eager limit while that
   pays: past it a message takes a rendezvous, whose handshake (it starts
   only once braid's header has been read) cost more than copying a few KiB
   twice. So a header carries a payload of up to INLINE_MAX bytes whole, or
   the first INLINE_MAX bytes of one up to EAGER_MAX, whose rest follows in
   pieces of WIRE_MAX. A larger payload follows a bare header in pieces of
   BRAID_MPI_MAX_COUNT: there MPI's single-copy rendezvous beats the
   copies. Open MPI's limit is 4 KiB with its own header; MPICH (ch4) took
   8 KiB messages eagerly but not 16 KiB. */
#if defined(MPICH_VERSION) && !defined(OPEN_MPI)
#define WIRE_MAX 8240
#else
#define WIRE_MAX 4016
#endif
#define INLINE_MAX (WIRE_MAX - sizeof(braid__msg_hdr) - sizeof(uint64_t))
#define EAGER_MAX (INLINE_MAX + 16 * 1024)
#define WINDOW 8 /* pieces of a split collective in flight at once */

typedef struct wire {
  braid__msg_hdr h;
  uint64_t bytes;
  unsigned char inl[INLINE_MAX];
} wire;
#define WIRE_HEAD offsetof(wire, inl)
_Static_assert(sizeof(wire) == WIRE_MAX, "the header's size is what the eager limit counts");

typedef struct fail_msg {
  int32_t status, origin;
  char text[BRAID_ERRLEN];
} fail_msg;

/* Where a rank whose collective waits long stands (mpi_publish_position). */
typedef struct pos_msg {
  uint64_t seq;
  braid__desc desc;
} pos_msg;

/* A request: sends keep their header; payload pieces are MPI requests. */
typedef struct mpi_req {
  braid__req base;
  struct mpi_req *anext, *aprev; /* active list: MPI requests in flight */
  MPI_Request one[2];            /* header and first piece */
  MPI_Request *more;             /* all pieces when there are more than one */
  int nmpi;
  void *tmp;                     /* receive: payload buffer taken from an unexpected message */
  int later;                     /* receive: the payload's tag while its pieces wait for the next progress */
  wire w;                        /* send: header (+ inline payload); last, left uncleared */
} mpi_req;

typedef struct mpi_umsg {
  braid__umsg base;
  void *data;          /* payload (owned) */
  MPI_Request *pieces; /* payload pieces in flight (NULL: arrived, or deferred) */
  int npieces;
  int deferred;        /* a large payload still with its sender: received when taken */
  uint64_t big;        /* which large message of its sender (its tag) */
  struct mpi_umsg *unext, *uprev; /* in flight list; deferred: its sender's list, oldest first */
} mpi_umsg;

/* A large payload nobody took, received at destroy so that its sender's
   send completes. */
typedef struct mpi_sink {
  struct mpi_sink *next;
  void *data;
  MPI_Request *pieces;
  int npieces;
} mpi_sink;

typedef struct mpi_state {
  MPI_Comm comm;
  int provided;
  wire *hdr_buf;        /* one per peer */
  MPI_Request *hdr_req; /* one per peer */
  int *idx;
  mpi_req *active;
  mpi_umsg *uflight;
  uint64_t *big_sent, *big_seen; /* large messages to / from each peer so far */
  mpi_umsg **dfr_head, **dfr_tail; /* deferred large messages of each peer */
  mpi_sink *sinks;
  int nlater; /* active receives whose pieces the next progress starts */
  MPI_Request *fail_req; /* failure notices sent, one per peer */
  int nfail_req;
  fail_msg fail_out;
  size_t max_count;
  int coll;       /* BRAID_MPI_COLL: COLL_* */
  uint32_t *chk;  /* the call check's reduction: in and out */
  uint64_t *chk64; /* all-to-allv's count check: in and out, then the pair's counts in and out */
  int abandoned;  /* MPI still holds an operation (a failed collective, an unfinished send, a
                     failure notice): its buffers and the MPI communicator stay allocated */
  /* The call check across routes: ranks whose calls differ only in size
     may take different routes, where neither sees the other's messages. */
  pos_msg pos_out;
  MPI_Request *pos_req; /* this rank's position, one per peer */
  int npos_req;
  pos_msg *pos_in;      /* the latest position each peer sent */
} mpi_state;

static mpi_state *state(braid_comm *c) { return c->be; }

/* BRAID_MPI_COLL's values, in the order of COLL_*. */
enum { COLL_AUTO, COLL_NATIVE, COLL_GENERIC, COLL_NMODES };
static const char *const COLL_NAMES[COLL_NMODES] = {"auto", "native", "generic"};

/* ------------------------------------------------------------ process-wide */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
#define LOCK() pthread_mutex_lock(&g_lock)
#define UNLOCK() pthread_mutex_unlock(&g_lock)

static int g_ready;          /* types and ops created */
static int g_we_initialized; /* braid called MPI_Init_thread */
static MPI_Datatype g_bool, g_f16, g_bf16, g_e4m3, g_e5m2;
static MPI_Op g_ops[BRAID_BXOR + 1];

static braid_dtype dtype_of(MPI_Datatype t) {
  if (t == g_bool) return BRAID_BOOL;
  if (t == MPI_FLOAT) return BRAID_F32;
  if (t == MPI_DOUBLE) return BRAID_F64;
  if (t == MPI_C_FLOAT_COMPLEX) return BRAID_C64;
  if (t == MPI_C_DOUBLE_COMPLEX) return BRAID_C128;
  if (t == MPI_INT8_T) return BRAID_I8;
  if (t == MPI_UINT8_T) return BRAID_U8;
  if (t == MPI_INT16_T) return BRAID_I16;
  if (t == MPI_UINT16_T) return BRAID_U16;
  if (t == MPI_INT32_T) return BRAID_I32;
  if (t == MPI_UINT32_T) return BRAID_U32;
  if (t == MPI_INT64_T) return BRAID_I64;
  return BRAID_U64;
}

#define KERNEL_OP(name, OP)                                                 \
  static void name(void *in, void *inout, int *len, MPI_Datatype *t) {      \
    braid__reduce2(inout, in, inout, (size_t)*len, dtype_of(*t), OP);       \
  }
KERNEL_OP(op_sum, BRAID_SUM)
KERNEL_OP(op_prod, BRAID_PROD)
KERNEL_OP(op_min, BRAID_MIN)
KERNEL_OP(op_max, BRAID_MAX)
KERNEL_OP(op_band, BRAID_BAND)
KERNEL_OP(op_bor, BRAID_BOR)
KERNEL_OP(op_bxor, BRAID_BXOR)

static int setup_types(void) {
  MPI_User_function *fn[BRAID_BXOR + 1] = {op_sum, op_prod, op_min, op_max, op_sum, op_band, op_bor, op_bxor};
  int rc = MPI_Type_contiguous(1, MPI_BYTE, &g_bool);
  if (!rc) rc = MPI_Type_contiguous(2, MPI_BYTE, &g_f16);
  if (!rc) rc = MPI_Type_contiguous(2, MPI_BYTE, &g_bf16);
  if (!rc) rc = MPI_Type_contiguous(1, MPI_BYTE, &g_e4m3);
  if (!rc) rc = MPI_Type_contiguous(1, MPI_BYTE, &g_e5m2);
  MPI_Datatype *ts[] = {&g_bool, &g_f16, &g_bf16, &g_e4m3, &g_e5m2};
  for (int i = 0; !rc && i < 5; i++) rc = MPI_Type_commit(ts[i]);
  for (int i = 0; !rc && i <= BRAID_BXOR; i++) rc = MPI_Op_create(fn[i], 1, &g_ops[i]);
  return rc;
}

static void finalize_at_exit(void) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

static void mpi_text(int rc, char *out, size_t len) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS) n = snprintf(s, sizeof s, "MPI error %d", rc);
  snprintf(out, len, "%.*s", n, s);
}

static braid_status mpi_fail(braid_comm *c, const char *fn, int rc) {
  char s[MPI_MAX_ERROR_STRING];
  mpi_text(rc, s, sizeof s);
  return braid__fail(c, BRAID_ERR_BACKEND, "%s failed: %s", fn, s);
}

/* MPI ready for braid: initialized (by the application or here), types and ops made. */
static braid_status ensure_mpi(braid_comm *c, int *provided) {
  int init = 0, fin = 0;
  MPI_Finalized(&fin);
  if (fin) return braid__fail(c, BRAID_ERR_BACKEND, "MPI was finalized already; braid cannot use it again");
  MPI_Initialized(&init);
  if (!init) {
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, provided);
    if (rc) return mpi_fail(c, "MPI_Init_thread", rc);
    g_we_initialized = 1;
    /* MPI is braid's alone: errors that MPI raises on MPI_COMM_WORLD (a
       test of several requests does) come back as codes, not an abort. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    atexit(finalize_at_exit);
  } else {
    MPI_Query_thread(provided);
  }
  if (!g_ready) {
    int rc = setup_types();
    if (rc) return mpi_fail(c, "creating braid's MPI datatypes and ops", rc);
    g_ready = 1;
  }
  return BRAID_OK;
}

/* ------------------------------------------------------------ state */

static braid_status post_hdr(braid_comm *c, int q) {
  mpi_state *s = state(c);
  int rc = MPI_Irecv(&s->hdr_buf[q], (int)sizeof(wire), MPI_BYTE, q, TAG_HDR, s->comm, &s->hdr_req[q]);
  return rc ? mpi_fail(c, "MPI_Irecv", rc) : BRAID_OK;
}

/* Waits for a request of the start (which every rank makes) until
   deadline: a rank that failed before it, or never calls braid_init, must
   not hold the others in MPI for ever. Entered and left with g_lock held;
   released while it sleeps. quiet: a failure is returned, not recorded
   (this rank's own start failure is the sentence to keep). */
static braid_status start_wait(braid_comm *c, MPI_Request *rq, double deadline, const char *fn, int quiet) {
  for (unsigned spin = 0;; spin++) {
    int flag = 0;
    int rc = MPI_Test(rq, &flag, MPI_STATUS_IGNORE);
    if (rc) return quiet ? BRAID_ERR_BACKEND : mpi_fail(c, fn, rc);
    if (flag) return BRAID_OK;
    if (braid__now() >= deadline)
      return quiet ? BRAID_ERR_TIMEOUT
                   : braid__fail(c, BRAID_ERR_TIMEOUT,
                                 "%s did not complete within BRAID_INIT_TIMEOUT (%g s): a rank of the MPI "
                                 "communicator has not called braid_init, or is stuck before it",
                                 fn, c->start_timeout_s);
    if (spin < 1000) continue;
    UNLOCK();
    braid__sleep(spin < 5000 ? 20e-6 : 1e-3);
    LOCK();
  }
}

enum { START_NV = 3 + BRAID__COLL_NKINDS };

/* What the start's non-blocking calls write into. On the heap, and left
   allocated when one of them does not complete: MPI may write it later. */
typedef struct start_buf {
  MPI_Comm dup;
  int agree[2 * START_NV + 1];
  struct {
    int st;
    char why[BRAID_ERRLEN];
  } told;
} start_buf;

/* The ranks meet: MPI duplicates base, and on the duplicate they compare
   the settings they must share and learn of a rank whose start failed
   already (own, on this rank). (Reducing on base first, so that a missing
   rank left no duplicate pending, made MPICH 4.0 assert in its collective
   scheduler after an earlier communicator had failed.) *pending: a call
   did not complete and still holds sb. A split child's start has no
   deadline (its members all entered the split). */
static braid_status meet(braid_comm *c, mpi_state *s, MPI_Comm base, braid_status own, start_buf *sb, int *pending) {
  double deadline = braid__deadline(c->start_timeout_s);
  /* The sentence as the others should read it, before c->rank changes. */
  if (own && !braid__start_sentence(c, sb->told.why, sizeof sb->told.why))
    snprintf(sb->told.why, sizeof sb->told.why, "%s", braid_status_string(own));
  sb->told.st = own;
  MPI_Comm_rank(base, &c->rank);
  MPI_Comm_size(base, &c->size);
  /* Every rank must route each call alike (a rank in MPI's collective
     while another runs braid's would wait for the timeout): the ranks
     compare their choices, and a bad value fails every rank, not one. */
  const char *mode = braid__param_str(BRAID_P_MPI_COLL);
  s->coll = -1;
  for (int i = 0; i < COLL_NMODES; i++)
    if (!strcmp(mode, COLL_NAMES[i])) s->coll = i;
  /* So must the forced algorithms and the call check (the core's
     settings, compared through the store on the other backends): each
     value beside its negation, so one MPI_MAX tells max and min. The last
     entry is 1 + the highest rank whose start failed already (0: none). */
  int *agree = sb->agree;
  /* BRAID_MPI_MAX_COUNT too: both ends of a message cut it by it. */
  int vals[START_NV] = {s->coll, c->check};
  for (int k = 0; k < BRAID__COLL_NKINDS; k++) vals[2 + k] = c->algo[k];
  vals[2 + BRAID__COLL_NKINDS] = (int)s->max_count;
  for (int i = 0; i < START_NV; i++) agree[2 * i] = vals[i], agree[2 * i + 1] = -vals[i];
  agree[2 * START_NV] = own ? c->rank + 1 : 0;
  MPI_Request rq;
  int rc = MPI_Comm_idup(base, &sb->dup, &rq);
  if (rc) return own ? own : mpi_fail(c, "MPI_Comm_idup", rc);
  braid_status st = start_wait(c, &rq, deadline, "MPI_Comm_idup", own != 0);
  if (st) return *pending = 1, own ? own : st;
  s->comm = sb->dup;
  MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
  rc = MPI_Iallreduce(MPI_IN_PLACE, agree, 2 * START_NV + 1, MPI_INT, MPI_MAX, s->comm, &rq);
  if (rc) return own ? own : mpi_fail(c, "MPI_Iallreduce", rc);
  st = start_wait(c, &rq, deadline, "MPI_Iallreduce", own != 0);
  if (st) return *pending = 1, own ? own : st;
  if (agree[2 * START_NV]) {
    /* The failed rank's sentence, from it to all: the others fail naming
       it, as a store relays a start failure on the other backends. */
    int origin = agree[2 * START_NV] - 1;
    rc = MPI_Ibcast(&sb->told, (int)sizeof sb->told, MPI_BYTE, origin, s->comm, &rq);
    if (!rc && (st = start_wait(c, &rq, deadline, "MPI_Ibcast", own != 0))) *pending = 1;
    if (own) return own; /* its own sentence stands */
    if (rc) return mpi_fail(c, "MPI_Ibcast", rc);
    if (st) return st;
    sb->told.why[sizeof sb->told.why - 1] = 0;
    return braid__start_relay(c, origin, sb->told.st, sb->told.why);
  }
  int algo_differs = 0;
  for (int k = 0; k < BRAID__COLL_NKINDS; k++) algo_differs |= agree[4 + 2 * k] != -agree[5 + 2 * k];
  if (s->coll < 0)
    return braid__fail(c, BRAID_ERR_INVALID_ARG, "BRAID_MPI_COLL is \"%s\": expected auto, native or generic", mode);
  if (agree[0] != -agree[1])
    return braid__fail(c, BRAID_ERR_INVALID_ARG,
                       "BRAID_MPI_COLL differs between ranks (%s here): every rank must choose alike", mode);
  if (algo_differs) {
    char algo[400];
    braid__algo_spec(c->algo, algo, sizeof algo);
    return braid__fail(c, BRAID_ERR_INVALID_ARG,
                       "BRAID_ALGO differs between ranks (\"%s\" here): every rank must set it alike", algo);
  }
  if (agree[2] != -agree[3])
    return braid__fail(c, BRAID_ERR_INVALID_ARG,
                       "BRAID_CHECK differs between ranks (%d here): every rank must set it alike", c->check);
  const int mc = 2 * (2 + BRAID__COLL_NKINDS);
  if (agree[mc] != -agree[mc + 1])
    return braid__fail(c, BRAID_ERR_INVALID_ARG,
                       "BRAID_MPI_MAX_COUNT differs between ranks (%zu here): every rank must set it alike",
                       s->max_count);
  return BRAID_OK;
}

static braid_status state_new(braid_comm *c, MPI_Comm base, int provided) {
  mpi_state *s = calloc(1, sizeof *s);
  if (!s) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for the mpi backend");
  c->be = s;
  s->comm = MPI_COMM_NULL;
  s->provided = provided;
  /* A failure of this rank's start before here (its settings) still goes
     through the meeting, which tells the others why. */
  braid_status own = c->start_st;
  char err[BRAID_ERRLEN];
  if (!own && braid__param_size(BRAID_P_MPI_MAX_COUNT, 1, INT_MAX, &s->max_count, err, sizeof err))
    own = braid__fail(c, BRAID_ERR_INVALID_ARG, "%s", err);
  start_buf *sb = calloc(1, sizeof *sb);
  if (!sb) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for the mpi backend");
  int pending = 0;
  braid_status st = meet(c, s, base, own, sb, &pending);
  if (pending) s->abandoned = 1; /* the communicator (if made) and sb stay with MPI's call */
  else free(sb);
  if (st) return st;
  s->hdr_buf = malloc(sizeof(wire) * (size_t)c->size);
  s->hdr_req = malloc(sizeof(MPI_Request) * (size_t)c->size);
  /* Before any failure return: destroy reads every entry. */
  if (s->hdr_req)
    for (int q = 0; q < c->size; q++) s->hdr_req[q] = MPI_REQUEST_NULL;
  s->idx = malloc(sizeof(int) * (size_t)c->size);
  s->chk = malloc(4 * sizeof(uint32_t));
  s->chk64 = malloc(4 * sizeof(uint64_t));
  s->pos_req = malloc(sizeof(MPI_Request) * (size_t)c->size);
  s->pos_in = calloc((size_t)c->size, sizeof(pos_msg));
  s->big_sent = calloc(2 * (size_t)c->size, sizeof(uint64_t));
  s->dfr_head = calloc(2 * (size_t)c->size, sizeof(mpi_umsg *));
  if (s->big_sent) s->big_seen = s->big_sent + c->size;
  if (s->dfr_head) s->dfr_tail = s->dfr_head + c->size;
  if (!s->hdr_buf || !s->hdr_req || !s->idx || !s->chk || !s->chk64 || !s->big_sent || !s->dfr_head || !s->pos_req ||
      !s->pos_in)
    return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %d peers' header buffers", c->size);
  for (int q = 0; q < c->size; q++) {
    st = post_hdr(c, q);
    if (st) return st;
  }
  c->spin_limit = 1024;
  c->yield_s = 1e-3;
  if (provided < MPI_THREAD_SERIALIZED)
    BLOG_WARN(BRAID_SUB_INIT, c->rank,
              "MPI provides thread level %d, below MPI_THREAD_SERIALIZED: call braid only from the thread that "
              "calls MPI",
              provided);
  return BRAID_OK;
}

static braid_status mpi_init(braid_comm *c) {
  LOCK();
  int provided = 0;
  braid_status st = ensure_mpi(c, &provided);
  MPI_Comm base = MPI_COMM_WORLD;
  if (!st && c->cfg_handle) {
    base = *(const MPI_Comm *)c->cfg_handle;
    if (base == MPI_COMM_NULL) st = braid__fail(c, BRAID_ERR_INVALID_ARG, "cfg->mpi_comm is MPI_COMM_NULL");
  }
  if (!st) st = state_new(c, base, provided);
  UNLOCK();
  if (!st)
    BLOG_INFO(BRAID_SUB_INIT, c->rank, "mpi: rank %d of %d, MPI %s by %s, thread level %d", c->rank, c->size,
              g_we_initialized ? "initialized" : "given", g_we_initialized ? "braid" : "the application", provided);
  return st;
}

static braid_status mpi_split(braid_comm *parent, braid_comm *child, const int *members, int n) {
  mpi_state *ps = state(parent);
  LOCK();
  MPI_Group pg, g;
  MPI_Comm nc = MPI_COMM_NULL;
  int rc = MPI_Comm_group(ps->comm, &pg);
  if (!rc) rc = MPI_Group_incl(pg, n, members, &g);
  /* Collective over the members only (ranks that chose BRAID_SPLIT_NONE,
     MPI_UNDEFINED in MPI_Comm_split terms, are not waited for); every
     member proved present in the split's all-gather. */
  if (!rc) rc = MPI_Comm_create_group(ps->comm, g, TAG_SPLIT, &nc);
  braid_status st = rc ? mpi_fail(child, "MPI_Comm_create_group", rc) : BRAID_OK;
  if (!st) st = state_new(child, nc, ps->provided);
  if (nc != MPI_COMM_NULL) MPI_Comm_free(&nc);
  MPI_Group_free(&g);
  MPI_Group_free(&pg);
  UNLOCK();
  return st;
}

/* ------------------------------------------------------------ point to point */

static void active_add(mpi_state *s, mpi_req *r) {
  r->aprev = NULL;
  r->anext = s->active;
  if (s->active) s->active->aprev = r;
  s->active = r;
}
static void active_del(mpi_state *s, mpi_req *r) {
  if (r->aprev) r->aprev->anext = r->anext;
  else s->active = r->anext;
  if (r->anext) r->anext->aprev = r->aprev;
  r->anext = r->aprev = NULL;
}

/* How many of a message's first bytes its header carries (the rule above). */
static size_t head_bytes(size_t bytes) { return bytes <= INLINE_MAX ? bytes : bytes <= EAGER_MAX ? INLINE_MAX : 0; }

static int big_tag(uint64_t k) { return TAG_BIG0 + (int)(k % NBIG); }

/* Starts the pieces of a message of total bytes at msg (send or receive)
   from/to peer on tag: all but its header's part. */
static int start_pieces(mpi_state *s, int is_send, void *msg, size_t total, int peer, int tag, MPI_Request *first,
                        MPI_Request **more, int *n) {
  size_t head = head_bytes(total), bytes = total - head;
  char *buf = (char *)msg + head;
  size_t pc = head && WIRE_MAX < s->max_count ? WIRE_MAX : s->max_count;
  size_t np = (bytes + pc - 1) / pc;
  MPI_Request *rq = first;
  *more = NULL;
  if (np > 1) {
    rq = *more = malloc(sizeof(MPI_Request) * np);
    if (!rq) return MPI_ERR_NO_MEM;
  }
  *n = (int)np;
  for (size_t i = 0; i < np; i++) {
    size_t off = i * pc, len = bytes - off < pc ? bytes - off : pc;
    int rc = is_send ? MPI_Isend(buf + off, (int)len, MPI_BYTE, peer, tag, s->comm, &rq[i])
                     : MPI_Irecv(buf + off, (int)len, MPI_BYTE, peer, tag, s->comm, &rq[i]);
    if (rc) {
      *n = (int)i;
      return rc;
    }
  }
  return MPI_SUCCESS;
}

static braid_status mpi_isend(braid_comm *c, braid__req *br) {
  mpi_state *s = state(c);
  mpi_req *r = (mpi_req *)br;
  r->w.h = br->h;
  r->w.bytes = br->bytes;
  r->more = NULL;
  r->tmp = NULL;
  r->one[0] = r->one[1] = MPI_REQUEST_NULL;
  size_t head = head_bytes(br->bytes);
  int inl = head == br->bytes;
  if (head) memcpy(r->w.inl, br->buf, head);
  LOCK();
  int rc = MPI_Isend(&r->w, (int)(WIRE_HEAD + head), MPI_BYTE, br->peer, TAG_HDR, s->comm, &r->one[0]);
  r->nmpi = 0;
  if (!rc && !inl)
    rc = start_pieces(s, 1, br->buf, br->bytes, br->peer, head ? TAG_DATA : big_tag(s->big_sent[br->peer]++),
                      &r->one[1], &r->more, &r->nmpi);
  /* A small message usually leaves inside MPI_Isend (eager): done now,
     without a later test of it. */
  int sent = 0;
  if (!rc && inl) rc = MPI_Test(&r->one[0], &sent, MPI_STATUS_IGNORE);
  UNLOCK();
  if (rc) {
    active_add(s, r);
    return mpi_fail(c, "MPI_Isend", rc);
  }
  if (sent) braid__req_complete(c, br, BRAID_OK);
  else active_add(s, r);
  return BRAID_OK;
}

static braid_status mpi_irecv(braid_comm *c, braid__req *br) {
  (void)c, (void)br; /* queued on the matcher; a header completes it */
  return BRAID_OK;
}

static void free_pieces_list(MPI_Request *more) { free(more); }

static void uflight_add(mpi_state *s, mpi_umsg *u) {
  u->uprev = NULL;
  u->unext = s->uflight;
  if (s->uflight) s->uflight->uprev = u;
  s->uflight = u;
}

static void uflight_del(mpi_state *s, mpi_umsg *u) {
  if (u->uprev) u->uprev->unext = u->unext;
  else s->uflight = u->unext;
  if (u->unext) u->unext->uprev = u->uprev;
  u->unext = u->uprev = NULL;
}

static void dfr_add(mpi_state *s, mpi_umsg *u) {
  int q = u->base.src;
  u->unext = NULL;
  u->uprev = s->dfr_tail[q];
  if (u->uprev) u->uprev->unext = u;
  else s->dfr_head[q] = u;
  s->dfr_tail[q] = u;
}

static void dfr_del(mpi_state *s, mpi_umsg *u) {
  int q = u->base.src;
  if (u->uprev) u->uprev->unext = u->unext;
  else s->dfr_head[q] = u->unext;
  if (u->unext) u->unext->uprev = u->uprev;
  else s->dfr_tail[q] = u->uprev;
  u->unext = u->uprev = NULL;
}

/* Receives the pieces of a message of bytes from q on tag into a new
   buffer (its first head bytes, from the header, are the caller's). 0, or
   an MPI error code; then nothing is left to free, except what pieces that
   started may still write into, which stays with MPI. */
static int buffer_pieces(mpi_state *s, size_t bytes, int q, int tag, void **data, MPI_Request **pieces, int *n) {
  MPI_Request first = MPI_REQUEST_NULL;
  *pieces = NULL;
  *n = 0;
  if (!(*data = malloc(bytes ? bytes : 1))) return MPI_ERR_NO_MEM;
  int rc = start_pieces(s, 0, *data, bytes, q, tag, &first, pieces, n);
  if (!rc && !*pieces) {
    if ((*pieces = malloc(sizeof(MPI_Request)))) **pieces = first;
    else rc = MPI_ERR_NO_MEM;
  }
  if (rc && (*n || first != MPI_REQUEST_NULL)) {
    s->abandoned = 1;
  } else if (rc) {
    free(*pieces);
    free(*data);
    *pieces = NULL;
    *data = NULL;
  }
  return rc;
}

/* A deferred message is received into a buffer of its own after all. */
static int undefer(mpi_state *s, mpi_umsg *u) {
  dfr_del(s, u);
  u->deferred = 0;
  int rc = buffer_pieces(s, u->base.bytes, u->base.src, big_tag(u->big), &u->data, &u->pieces, &u->npieces);
  if (u->pieces) uflight_add(s, u);
  return rc;
}

/* One header from q: match it and start its payload. */
static braid_status on_header(braid_comm *c, int q) {
  mpi_state *s = state(c);
  wire *w = &s->hdr_buf[q];
  braid_status st = BRAID_OK;
  braid__req *br = braid__match_arrival(c, q, &w->h, &st);
  size_t head = head_bytes(w->bytes);
  int inl = head == w->bytes, large = !inl && !head, tag = TAG_DATA;
  uint64_t k = 0;
  if (large) tag = big_tag(k = s->big_seen[q]++);
  if (st) {
    /* c failed (collective mismatch): the payload is left to MPI. */
    return st;
  }
  /* The message that waits on this tag already goes first. */
  while (large && s->dfr_head[q] && s->dfr_head[q]->big + NBIG <= k) {
    int rc = undefer(s, s->dfr_head[q]);
    if (rc) return mpi_fail(c, "MPI_Irecv", rc);
  }
  if (br) {
    mpi_req *r = (mpi_req *)br;
    if (head) memcpy(br->buf, w->inl, head);
    if (inl) {
      braid__req_complete(c, br, BRAID_OK);
    } else {
      r->more = NULL;
      r->tmp = NULL;
      r->one[0] = MPI_REQUEST_NULL;
      int rc = start_pieces(s, 0, br->buf, w->bytes, q, tag, &r->one[1], &r->more, &r->nmpi);
      active_add(s, r);
      if (rc) return mpi_fail(c, "MPI_Irecv", rc);
    }
  } else {
    mpi_umsg *u = calloc(1, sizeof *u);
    if (!u)
      return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory queueing a message from rank %d", q);
    u->base.src = q;
    u->base.h = w->h;
    u->base.bytes = w->bytes;
    int rc = 0;
    if (large) {
      u->deferred = 1;
      u->big = k;
      dfr_add(s, u);
    } else if (inl) {
      if (!(u->data = malloc(head ? head : 1))) rc = MPI_ERR_NO_MEM;
      else memcpy(u->data, w->inl, head);
    } else if (!(rc = buffer_pieces(s, w->bytes, q, tag, &u->data, &u->pieces, &u->npieces))) {
      memcpy(u->data, w->inl, head);
      uflight_add(s, u);
    }
    if (rc) {
      free(u);
      return rc == MPI_ERR_NO_MEM ? braid__fail(c, BRAID_ERR_NO_MEMORY,
                                                "out of memory buffering a %llu-byte message from rank %d",
                                                (unsigned long long)w->bytes, q)
                                  : mpi_fail(c, "MPI_Irecv", rc);
    }
    braid__match_unexpected(c, &u->base);
  }
  c->moved++;
  return BRAID_OK;
}

static braid_status mpi_take(braid_comm *c, braid__req *br, braid__umsg *bu) {
  mpi_state *s = state(c);
  mpi_umsg *u = (mpi_umsg *)bu;
  mpi_req *r = (mpi_req *)br;
  if (u->deferred) {
    /* Straight into the receive's buffer (its shape is the message's), by
       the next progress: MPI may copy the whole payload inside MPI_Irecv
       (Open MPI's single copy does), and a rank that copied before posting
       its own sends kept its peer waiting for them: a 2-rank exchange of
       16 MiB took the two copies one after the other. */
    r->one[0] = r->one[1] = MPI_REQUEST_NULL;
    r->more = NULL;
    r->tmp = NULL;
    r->nmpi = 0;
    r->later = big_tag(u->big);
    LOCK();
    dfr_del(s, u);
    active_add(s, r);
    s->nlater++;
    UNLOCK();
    return BRAID_OK;
  }
  if (!u->pieces) {
    if (br->bytes) memcpy(br->buf, u->data, br->bytes);
    free(u->data);
    braid__req_complete(c, br, BRAID_OK);
    c->moved++;
    return BRAID_OK;
  }
  /* Payload still arriving into u's buffer: r takes the buffer and pieces. */
  LOCK();
  uflight_del(s, u);
  UNLOCK();
  r->one[0] = r->one[1] = MPI_REQUEST_NULL;
  r->more = u->pieces;
  r->nmpi = u->npieces;
  r->tmp = u->data;
  active_add(s, r);
  return BRAID_OK;
}

static void mpi_release_umsg(braid_comm *c, braid__umsg *bu) {
  mpi_state *s = state(c);
  mpi_umsg *u = (mpi_umsg *)bu;
  if (u->deferred) {
    /* Nobody took it: its sender still waits for the payload to go, so
       destroy receives it (unless c failed, when MPI keeps what is left). */
    LOCK();
    dfr_del(s, u);
    mpi_sink *k = atomic_load(&c->failed) ? NULL : calloc(1, sizeof *k);
    if (k && buffer_pieces(s, u->base.bytes, u->base.src, big_tag(u->big), &k->data, &k->pieces, &k->npieces)) {
      free(k);
      k = NULL;
    }
    if (k) {
      k->next = s->sinks;
      s->sinks = k;
    }
    UNLOCK();
    return;
  }
  if (u->pieces) {
    LOCK();
    for (int i = 0; i < u->npieces; i++)
      if (u->pieces[i] != MPI_REQUEST_NULL) {
        MPI_Cancel(&u->pieces[i]);
        MPI_Request_free(&u->pieces[i]);
      }
    uflight_del(s, u);
    UNLOCK();
    free(u->pieces);
  }
  free(u->data);
}

static int req_done(mpi_req *r) {
  int flag = 0;
  if (r->later) return 0;
  if (r->one[0] != MPI_REQUEST_NULL) {
    MPI_Test(&r->one[0], &flag, MPI_STATUS_IGNORE);
    if (!flag) return 0;
  }
  if (r->nmpi) {
    MPI_Request *rq = r->more ? r->more : &r->one[1];
    test_all(r->nmpi, rq, &flag);
    if (!flag) return 0;
  }
  return 1;
}

static braid_status mpi_progress(braid_comm *c) {
  mpi_state *s = state(c);
  braid_status st = BRAID_OK;
  LOCK();
  /* Before any header: a header on the same tag posts its receive after. */
  for (mpi_req *r = s->active; s->nlater && r; r = r->anext) {
    if (!r->later) continue;
    int rc = start_pieces(s, 0, r->base.buf, r->base.bytes, r->base.peer, r->later, &r->one[1], &r->more, &r->nmpi);
    r->later = 0;
    s->nlater--;
    if (rc) {
      UNLOCK();
      return mpi_fail(c, "MPI_Irecv", rc);
    }
  }
  /* The headers are read once per pass (the caller likely waits for one
     of them; later ones wait for the next pass). An MPI may progress inside
     MPI_Testsome only when nothing was complete, without looking again
     (Open MPI does): a header that arrived during that progress shows in a
     second test, not a whole pass later. */
  int n = 0;
  int rc = test_some(c->size, s->hdr_req, &n, s->idx);
  if (!rc && n == 0) rc = test_some(c->size, s->hdr_req, &n, s->idx);
  if (rc) {
    UNLOCK();
    return mpi_fail(c, "MPI_Testsome", rc);
  }
  /* Lowest peer first is as good as any: order only matters per peer. */
  for (int i = 0; n != MPI_UNDEFINED && i < n && !st; i++) {
    int q = s->idx[i];
    st = on_header(c, q);
    if (!st) st = post_hdr(c, q);
  }
  for (mpi_umsg *u = s->uflight, *un; u; u = un) {
    un = u->unext;
    int flag = 0;
    test_all(u->npieces, u->pieces, &flag);
    if (flag) {
      free(u->pieces);
      u->pieces = NULL;
      uflight_del(s, u);
      c->moved++;
    }
  }
  for (mpi_req *r = s->active, *rn; r; r = rn) {
    rn = r->anext;
    if (!req_done(r)) continue;
    active_del(s, r);
    free_pieces_list(r->more);
    r->more = NULL;
    r->nmpi = 0;
    if (r->tmp) {
      if (r->base.bytes) memcpy(r->base.buf, r->tmp, r->base.bytes);
      free(r->tmp);
      r->tmp = NULL;
    }
    braid__req_complete(c, &r->base, BRAID_OK);
    c->moved++;
  }
  UNLOCK();
  return st;
}

/* ------------------------------------------------------------ waiting, failures */

static int mpi_arm(braid_comm *c) {
  (void)c;
  return 1;
}

/* MPI has no wake-up to sleep on: a short nap keeps a waiting rank cheap. */
static void mpi_sleep(braid_comm *c, double slice_s) {
  (void)c;
  double t = slice_s < 20e-6 ? slice_s : 20e-6;
  struct timespec ts = {0, (long)(t * 1e9)};
  nanosleep(&ts, NULL);
}

static void mpi_disarm(braid_comm *c) { (void)c; }

/* MPI reports lost peers as errors of the calls, or the launcher ends the
   job: nothing to check here. */
static braid_status mpi_check_peers(braid_comm *c, int peer, const char *what) {
  (void)c, (void)peer, (void)what;
  return BRAID_OK;
}

/* Positions for the core's call check (under BRAID_MPI_COLL=auto ranks
   whose calls differ only in size may take different routes, and where
   braid's route receives first nothing reaches the ranks in MPI's call
   check): sent to every peer on TAG_POS, at most one set in flight (they
   are tiny and eager, so an earlier set has normally completed). */
static void mpi_publish_position(braid_comm *c) {
  mpi_state *s = state(c);
  if (!s || !s->pos_req) return;
  LOCK();
  if (s->npos_req > 0) {
    int flag = 0;
    test_all(s->npos_req, s->pos_req, &flag);
    if (flag) s->npos_req = 0;
  }
  if (!s->npos_req) {
    s->pos_out.seq = c->seq;
    s->pos_out.desc = c->desc;
    for (int q = 0; q < c->size; q++)
      if (q != c->rank && MPI_Isend(&s->pos_out, (int)sizeof s->pos_out, MPI_BYTE, q, TAG_POS, s->comm,
                                    &s->pos_req[s->npos_req]) == MPI_SUCCESS)
        s->npos_req++;
  }
  UNLOCK();
}

/* What arrived is read first; the latest position of each peer is kept. */
static int mpi_peer_position(braid_comm *c, int q, uint64_t *at, braid__desc *d) {
  mpi_state *s = state(c);
  if (!s || !s->pos_in) return 0;
  LOCK();
  for (int flag = 1; flag;) {
    MPI_Status ms;
    MPI_Iprobe(MPI_ANY_SOURCE, TAG_POS, s->comm, &flag, &ms);
    if (flag)
      MPI_Recv(&s->pos_in[ms.MPI_SOURCE], (int)sizeof(pos_msg), MPI_BYTE, ms.MPI_SOURCE, TAG_POS, s->comm,
               MPI_STATUS_IGNORE);
  }
  UNLOCK();
  if (!s->pos_in[q].seq) return 0;
  *at = s->pos_in[q].seq;
  *d = s->pos_in[q].desc;
  return 1;
}

static int mpi_remote_failure(braid_comm *c, braid_status *st, int *origin, char *text, size_t len) {
  mpi_state *s = state(c);
  int flag = 0;
  MPI_Status ms;
  LOCK();
  MPI_Iprobe(MPI_ANY_SOURCE, TAG_FAIL, s->comm, &flag, &ms);
  if (flag) {
    fail_msg m;
    memset(&m, 0, sizeof m);
    MPI_Recv(&m, (int)sizeof m, MPI_BYTE, ms.MPI_SOURCE, TAG_FAIL, s->comm, MPI_STATUS_IGNORE);
    m.text[sizeof m.text - 1] = 0;
    *st = (braid_status)m.status;
    *origin = m.origin;
    snprintf(text, len, "%s", m.text);
  }
  UNLOCK();
  return flag;
}

static void mpi_publish_failure(braid_comm *c, braid_status st, const char *text) {
  mpi_state *s = state(c);
  if (!s) return;
  LOCK();
  if (!s->nfail_req) {
    s->fail_out.status = (int32_t)st;
    s->fail_out.origin = c->rank;
    snprintf(s->fail_out.text, sizeof s->fail_out.text, "%s", text);
    if (!s->fail_req) s->fail_req = malloc(sizeof *s->fail_req * (size_t)c->size);
    for (int q = 0; q < c->size && s->fail_req; q++) {
      if (q == c->rank) continue;
      if (MPI_Isend(&s->fail_out, (int)sizeof s->fail_out, MPI_BYTE, q, TAG_FAIL, s->comm,
                    &s->fail_req[s->nfail_req]) == MPI_SUCCESS)
        s->nfail_req++;
    }
    if (!s->nfail_req) s->nfail_req = -1;
  }
  UNLOCK();
}

static void mpi_abort(braid_comm *c) { (void)c; /* waiters nap at most 20 us and see the flag */ }

static void mpi_destroy(braid_comm *c, double timeout_s) {
  mpi_state *s = state(c);
  if (!s) return;
  double deadline = braid__now() + timeout_s;
  /* Headers that arrived go through the matcher once more: the large
     payloads nobody will take are received (mpi_release_umsg), so that
     their senders' sends complete. A large send of this rank's gets as
     long again for a late receive to claim it (test mpi_claim_2): MPI reads
     its buffer until then, and braid_destroy takes at most twice the
     destroy timeout (API.md). */
  int look = !atomic_load(&c->failed);
  LOCK();
  while ((look || s->active || s->sinks) && braid__now() < deadline) {
    look = 0;
    UNLOCK();
    mpi_progress(c);
    braid__match_drop_unexpected(c);
    LOCK();
    for (mpi_sink **p = &s->sinks, *k; (k = *p);) {
      int flag = 0;
      test_all(k->npieces, k->pieces, &flag);
      if (!flag) {
        p = &k->next;
        continue;
      }
      *p = k->next;
      free(k->pieces);
      free(k->data);
      free(k);
    }
  }
  /* Messages still in flight on a freed communicator meet the next
     communicator creation that reserves or reuses its MPI context id (with
     Open MPI, the MPI_Comm_idup of the next braid_init then never
     completes). So MPI keeps it where this rank still sends (unfinished
     sends, failure notices), and wherever the communicator failed: a peer
     that has not heard of the failure yet may still send to this rank. */
  if (s->active || s->sinks || s->nfail_req || atomic_load(&c->failed)) s->abandoned = 1;
  for (mpi_sink *k = s->sinks; k; k = k->next) /* the buffers stay with MPI */
    for (int i = 0; i < k->npieces; i++)
      if (k->pieces[i] != MPI_REQUEST_NULL) {
        MPI_Cancel(&k->pieces[i]);
        MPI_Request_free(&k->pieces[i]);
      }
  for (mpi_req *r = s->active, *rn; r; r = rn) {
    rn = r->anext;
    MPI_Request *rq = r->more ? r->more : &r->one[1];
    if (r->one[0] != MPI_REQUEST_NULL) MPI_Request_free(&r->one[0]);
    for (int i = 0; i < r->nmpi; i++)
      if (rq[i] != MPI_REQUEST_NULL) {
        if (!r->base.is_send) MPI_Cancel(&rq[i]);
        MPI_Request_free(&rq[i]);
      }
    free(r->more);
    free(r->tmp);
    active_del(s, r);
    braid__req_drop(c, &r->base);
  }
  if (s->hdr_req)
    for (int q = 0; q < c->size; q++)
      if (s->hdr_req[q] != MPI_REQUEST_NULL) {
        MPI_Cancel(&s->hdr_req[q]);
        MPI_Wait(&s->hdr_req[q], MPI_STATUS_IGNORE);
      }
  for (int i = 0; i < s->nfail_req; i++) MPI_Request_free(&s->fail_req[i]);
  if (s->npos_req > 0) {
    int flag = 0;
    test_all(s->npos_req, s->pos_req, &flag);
    if (!flag) s->abandoned = 1; /* a position still going out reads pos_out */
    for (int i = 0; !flag && i < s->npos_req; i++) MPI_Request_free(&s->pos_req[i]);
  }
  if (s->comm != MPI_COMM_NULL) {
    /* Failure notices and positions nobody read. */
    static const int tags[] = {TAG_FAIL, TAG_POS};
    for (int t = 0; t < 2; t++)
      for (int flag = 1; flag;) {
        MPI_Status ms;
        MPI_Iprobe(MPI_ANY_SOURCE, tags[t], s->comm, &flag, &ms);
        if (flag) {
          fail_msg m; /* a position is smaller */
          MPI_Recv(&m, (int)sizeof m, MPI_BYTE, ms.MPI_SOURCE, tags[t], s->comm, MPI_STATUS_IGNORE);
        }
      }
    if (!s->abandoned) MPI_Comm_free(&s->comm);
  }
  UNLOCK();
  if (s->abandoned) {
    BLOG_WARN(BRAID_SUB_INIT, c->rank,
              "braid_destroy: MPI still holds operations of this failed communicator; its MPI communicator "
              "and buffers are left allocated");
    /* MPI may still write a collective's result into the core's scratch
       and read failure notices from the state: both stay with MPI. */
    for (int i = 0; i < BRAID__NSCRATCH; i++) c->scratch[i] = NULL;
    c->be = NULL;
    return;
  }
  free(s->chk);
  free(s->chk64);
  free(s->pos_req);
  free(s->pos_in);
  free(s->fail_req);
  free(s->hdr_buf);
  free(s->hdr_req);
  free(s->idx);
  free(s->big_sent);
  free(s->dfr_head);
  free(s);
  c->be = NULL;
}

/* ------------------------------------------------------------ collectives */

/* Waits for n MPI requests in the core's engine. */
static braid_status wait_mpi(braid_comm *c, MPI_Request *rq, int n, const char *what) {
  braid__waiter w;
  braid__wait_begin(&w);
  /* Statuses only to name an error: on the stack for the usual few. */
  MPI_Status few[8], *why = n <= 8 ? few : malloc(sizeof *why * (size_t)n);
  for (;;) {
    int flag = 0;
    LOCK();
    int rc = test_all_why(n, rq, &flag, why);
    UNLOCK();
    if (rc) {
      braid__wait_end(c, &w);
      state(c)->abandoned = 1;
      if (why != few) free(why);
      return mpi_fail(c, what, rc);
    }
    if (flag) break;
    /* A peer's send of a large payload completes only once this rank has
       read its header and posted the payload's receive: headers keep
       being read while a collective waits, pending work of this rank or
       not (the engine progresses only when there is some). */
    braid_status st = mpi_progress(c);
    if (!st) st = braid__wait_poll(c, &w, -1, what);
    else braid__wait_end(c, &w);
    if (st) {
      state(c)->abandoned = 1;
      if (why != few) free(why);
      return st;
    }
  }
  braid__wait_end(c, &w);
  if (why != few) free(why);
  return BRAID_OK;
}

/* The cross-rank call check: every rank learns whether all ranks made the same call. */
static braid_status precheck(braid_comm *c) {
  if (!c->check) return BRAID_OK;
  mpi_state *s = state(c);
  uint32_t *mine = s->chk, *all = s->chk + 2;
  mine[0] = c->desc_hash;
  mine[1] = ~c->desc_hash;
  MPI_Request rq;
  LOCK();
  int rc = MPI_Iallreduce(mine, all, 2, MPI_UINT32_T, MPI_MAX, s->comm, &rq);
  UNLOCK();
  if (rc) return mpi_fail(c, "MPI_Iallreduce", rc);
  braid_status st = wait_mpi(c, &rq, 1, "the other ranks to enter the collective");
  if (st || (all[0] == mine[0] && all[1] == mine[1])) return st;
  /* Someone differs: every rank is here; learn who and what. */
  /* Both buffers on the heap, this rank's entry last: a wait that gives up
     leaves them to MPI, which may still use them. */
  struct call_id {
    braid__desc d;
    uint64_t seq;
  } *others = malloc(sizeof *others * ((size_t)c->size + 1));
  if (!others) return braid__fail_comm(c, BRAID_ERR_MISMATCH, "the ranks called different collectives");
  struct call_id *me = &others[c->size];
  me->d = c->desc;
  me->seq = c->seq;
  LOCK();
  rc = MPI_Iallgather(me, (int)sizeof *me, MPI_BYTE, others, (int)sizeof *me, MPI_BYTE, s->comm, &rq);
  UNLOCK();
  if (rc) {
    free(others);
    return mpi_fail(c, "MPI_Iallgather", rc);
  }
  st = wait_mpi(c, &rq, 1, "the other ranks' calls");
  if (st) return st; /* the gather stays MPI's (the state is abandoned): so do its buffers */
  int q = 0;
  while (q < c->size && others[q].seq == c->seq && braid__desc_equal(&others[q].d, &c->desc)) q++;
  st = q < c->size ? braid__coll_mismatch_at(c, q, &others[q].d, others[q].seq)
                   : braid__fail_comm(c, BRAID_ERR_MISMATCH, "the ranks called different collectives");
  free(others);
  return st;
}

/* MPI's type for dt, or MPI_DATATYPE_NULL for the ones reduced in f32. */
static MPI_Datatype native_type(braid_dtype dt) {
  switch (dt) {
  case BRAID_F64: return MPI_DOUBLE;
  case BRAID_F32: return MPI_FLOAT;
  case BRAID_I8: return MPI_INT8_T;
  case BRAID_U8: return MPI_UINT8_T;
  case BRAID_I16: return MPI_INT16_T;
  case BRAID_U16: return MPI_UINT16_T;
  case BRAID_I32: return MPI_INT32_T;
  case BRAID_U32: return MPI_UINT32_T;
  case BRAID_I64: return MPI_INT64_T;
  case BRAID_U64: return MPI_UINT64_T;
  case BRAID_C64: return MPI_C_FLOAT_COMPLEX;
  case BRAID_C128: return MPI_C_DOUBLE_COMPLEX;
  case BRAID_BOOL: return g_bool;
  default: return MPI_DATATYPE_NULL;
  }
}

static int is_float(braid_dtype dt) {
  return dt == BRAID_F64 || dt == BRAID_F32 || dt == BRAID_C64 || dt == BRAID_C128;
}

/* MPI's op for (type of dt, op): MPI's own where its result is braid's
   (integers; float sums and products), braid's kernels otherwise. AVG sums. */
static MPI_Op mpi_op(braid_dtype dt, braid_op op) {
  if (dt == BRAID_BOOL) return g_ops[op];
  if (op == BRAID_MIN || op == BRAID_MAX) {
    if (is_float(dt)) return g_ops[op];
    return op == BRAID_MIN ? MPI_MIN : MPI_MAX;
  }
  if (op == BRAID_PROD && (dt == BRAID_C64 || dt == BRAID_C128)) return g_ops[op];
  switch (op) {
  case BRAID_SUM:
  case BRAID_AVG: return MPI_SUM;
  case BRAID_PROD: return MPI_PROD;
  case BRAID_BAND: return MPI_BAND;
  case BRAID_BOR: return MPI_BOR;
  default: return MPI_BXOR;
  }
}

/* BOOL results are 0 or 1, as braid's kernels make them (MPI calls no op
   on a single rank's input). */
static void bool_norm(void *buf, size_t count, braid_dtype dt) {
  if (dt != BRAID_BOOL) return;
  unsigned char *b = buf;
  for (size_t i = 0; i < count; i++) b[i] = b[i] != 0;
}

/* Elements per MPI call for elements of es bytes. */
static size_t piece_elems(mpi_state *s, size_t es) {
  size_t n = s->max_count / es;
  return n ? n : 1;
}

typedef int (*piece_fn)(braid_comm *c, void *arg, size_t off, size_t len, MPI_Request *rq);

/* Runs a collective in pieces [off, off+len) of at most per elements,
   WINDOW in flight. */
static braid_status run_pieces(braid_comm *c, size_t count, size_t per, piece_fn fn, void *arg, const char *what) {
  MPI_Request rq[WINDOW];
  size_t np = (count + per - 1) / per;
  if (!np) np = 1;
  for (size_t i = 0; i < np; i++) {
    size_t off = i * per, len = count - off < per ? count - off : per;
    if (i >= WINDOW) {
      braid_status st = wait_mpi(c, &rq[i % WINDOW], 1, what);
      if (st) return st;
    }
    LOCK();
    int rc = fn(c, arg, off, len, &rq[i % WINDOW]);
    UNLOCK();
    if (rc) {
      if (i) state(c)->abandoned = 1; /* the pieces posted before stay MPI's */
      return mpi_fail(c, what, rc);
    }
  }
  size_t live = np < WINDOW ? np : WINDOW;
  MPI_Request tail[WINDOW];
  for (size_t k = 0; k < live; k++) tail[k] = rq[(np - live + k) % WINDOW];
  return wait_mpi(c, tail, (int)live, what);
}

typedef struct red_arg {
  const void *send;
  void *recv;
  size_t es; /* bytes per element of t */
  MPI_Datatype t;
  MPI_Op op;
  int root;
  size_t count; /* per-rank block (reduce-scatter) */
} red_arg;

static int piece_allreduce(braid_comm *c, void *a_, size_t off, size_t len, MPI_Request *rq) {
  red_arg *a = a_;
  char *b = (char *)a->recv + off * a->es;
  return MPI_Iallreduce(MPI_IN_PLACE, b, (int)len, a->t, a->op, state(c)->comm, rq);
}

static int piece_reduce(braid_comm *c, void *a_, size_t off, size_t len, MPI_Request *rq) {
  red_arg *a = a_;
  const char *sb = (const char *)a->send + off * a->es;
  char *rb = a->recv ? (char *)a->recv + off * a->es : NULL;
  if (c->rank == a->root && a->send == a->recv)
    return MPI_Ireduce(MPI_IN_PLACE, rb, (int)len, a->t, a->op, a->root, state(c)->comm, rq);
  return MPI_Ireduce(sb, rb, (int)len, a->t, a->op, a->root, state(c)->comm, rq);
}

static int piece_bcast(braid_comm *c, void *a_, size_t off, size_t len, MPI_Request *rq) {
  red_arg *a = a_;
  return MPI_Ibcast((char *)a->recv + off, (int)len, MPI_BYTE, a->root, state(c)->comm, rq);
}

/* f16, bf16, fp8: widened into f32 scratch, reduced there, rounded once. */
static int wide(braid_dtype dt) { return native_type(dt) == MPI_DATATYPE_NULL; }

static braid_status mpi_all_reduce(braid_comm *c, void *buf, size_t count, braid_dtype dt, braid_op op) {
  braid_status st = precheck(c);
  if (st) return st;
  red_arg a = {buf, buf, braid_dtype_size(dt), native_type(dt), MPI_OP_NULL, 0, count};
  if (wide(dt)) {
    a.recv = braid__scratch(c, 0, count * 4);
    if (!a.recv) return BRAID_ERR_NO_MEMORY;
    braid__acc_load(a.recv, buf, count, dt);
    a.t = MPI_FLOAT;
    a.es = 4;
  }
  a.op = mpi_op(wide(dt) ? BRAID_F32 : dt, op);
  st = run_pieces(c, count, piece_elems(state(c), a.es), piece_allreduce, &a, "MPI_Iallreduce");
  if (st) return st;
  if (wide(dt)) braid__acc_store(buf, a.recv, count, dt, op, op == BRAID_AVG ? c->size : 1);
  else if (op == BRAID_AVG) braid__reduce_avg_finalize(buf, count, dt, c->size);
  bool_norm(buf, count, dt);
  return BRAID_OK;
}

static braid_status reduce_common(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                  braid_op op, int root) {
  red_arg a = {send, recv, braid_dtype_size(dt), native_type(dt), MPI_OP_NULL, root, count};
  int me = c->rank == root;
  if (wide(dt)) {
    void *ws = braid__scratch(c, 0, count * 4), *wr = me ? braid__scratch(c, 1, count * 4) : NULL;
    if (!ws || (me && !wr)) return BRAID_ERR_NO_MEMORY;
    braid__acc_load(ws, send, count, dt);
    a.send = ws;
    a.recv = wr;
    a.t = MPI_FLOAT;
    a.es = 4;
  }
  a.op = mpi_op(wide(dt) ? BRAID_F32 : dt, op);
  braid_status st = run_pieces(c, count, piece_elems(state(c), a.es), piece_reduce, &a, "MPI_Ireduce");
  if (st || !me) return st;
  if (wide(dt)) braid__acc_store(recv, a.recv, count, dt, op, op == BRAID_AVG ? c->size : 1);
  else if (op == BRAID_AVG) braid__reduce_avg_finalize(recv, count, dt, c->size);
  bool_norm(recv, count, dt);
  return BRAID_OK;
}

static braid_status mpi_reduce(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                               braid_op op, int root) {
  braid_status st = precheck(c);
  return st ? st : reduce_common(c, send, recv, count, dt, op, root);
}

static int piece_rsb(braid_comm *c, void *a_, size_t off, size_t len, MPI_Request *rq) {
  red_arg *a = a_;
  (void)off;
  return MPI_Ireduce_scatter_block(a->send, a->recv, (int)len, a->t, a->op, state(c)->comm, rq);
}

static braid_status mpi_reduce_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                       braid_op op) {
  braid_status st = precheck(c);
  if (st) return st;
  size_t es = braid_dtype_size(dt), wes = wide(dt) ? 4 : es;
  if (count > piece_elems(state(c), wes)) {
    /* Blocks above one MPI call: one reduce per block, rooted at its owner. */
    for (int r = 0; r < c->size && !st; r++) {
      void *out = r == c->rank ? recv : NULL;
      const char *in = (const char *)send + (size_t)r * count * es;
      if (out && out == in) {
        /* In place: the block is read and written at once, so through scratch. */
        void *t = braid__scratch(c, 2, count * es);
        if (!t) return BRAID_ERR_NO_MEMORY;
        memcpy(t, in, count * es);
        in = t;
      }
      st = reduce_common(c, in, out, count, dt, op, r);
    }
    return st;
  }
  red_arg a = {send, recv, wes, native_type(dt), MPI_OP_NULL, 0, count};
  void *out = recv;
  if (wide(dt)) {
    void *ws = braid__scratch(c, 0, count * 4 * (size_t)c->size);
    out = braid__scratch(c, 1, count * 4);
    if (!ws || !out) return BRAID_ERR_NO_MEMORY;
    braid__acc_load(ws, send, count * (size_t)c->size, dt);
    a.send = ws;
    a.t = MPI_FLOAT;
  } else if ((const char *)recv >= (const char *)send &&
             (const char *)recv < (const char *)send + count * es * (size_t)c->size) {
    out = braid__scratch(c, 1, count * es); /* MPI forbids overlapping buffers */
    if (!out) return BRAID_ERR_NO_MEMORY;
  }
  a.recv = out;
  a.op = mpi_op(wide(dt) ? BRAID_F32 : dt, op);
  st = run_pieces(c, count, count ? count : 1, piece_rsb, &a, "MPI_Ireduce_scatter_block");
  if (st) return st;
  if (wide(dt)) braid__acc_store(recv, out, count, dt, op, op == BRAID_AVG ? c->size : 1);
  else {
    if (out != recv) memcpy(recv, out, count * es);
    if (op == BRAID_AVG) braid__reduce_avg_finalize(recv, count, dt, c->size);
    bool_norm(recv, count, dt);
  }
  return BRAID_OK;
}

static braid_status mpi_broadcast(braid_comm *c, void *buf, size_t count, braid_dtype dt, int root) {
  braid_status st = precheck(c);
  if (st) return st;
  red_arg a = {buf, buf, 1, MPI_BYTE, MPI_OP_NULL, root, 0};
  return run_pieces(c, count * braid_dtype_size(dt), state(c)->max_count, piece_bcast, &a, "MPI_Ibcast");
}

/* Block-structured collectives (all-gather, gather, scatter, all-to-all):
   blocks of B bytes per rank, in pieces of at most max_count bytes, each
   piece of every block through a type that strides by B. */
typedef struct blk_arg {
  int kind;
  const char *send;
  char *recv;
  size_t block;
  int root;
  int send_in_place, recv_in_place;
} blk_arg;

static int piece_blk(braid_comm *c, void *a_, size_t off, size_t len, MPI_Request *rq) {
  blk_arg *a = a_;
  MPI_Comm comm = state(c)->comm;
  MPI_Datatype t = MPI_BYTE, raw;
  int n = (int)len;
  if (len != a->block) {
    int rc = MPI_Type_contiguous((int)len, MPI_BYTE, &raw);
    if (!rc) rc = MPI_Type_create_resized(raw, 0, (MPI_Aint)a->block, &t);
    if (!rc) rc = MPI_Type_commit(&t);
    if (rc) return rc;
    MPI_Type_free(&raw);
    n = 1;
  }
  /* Each piece of a block goes to the same offset of its block in the
     strided buffer (count n of t, extent block) or the contiguous one
     (len bytes). */
  const char *s = a->send ? a->send + off : NULL;
  char *r = a->recv ? a->recv + off : NULL;
  int rc;
  switch (a->kind) {
  case BRAID__COLL_ALL_GATHER:
    rc = MPI_Iallgather(a->send_in_place ? MPI_IN_PLACE : s, (int)len, MPI_BYTE, r, n, t, comm, rq);
    break;
  case BRAID__COLL_GATHER:
    rc = MPI_Igather(a->send_in_place ? MPI_IN_PLACE : s, (int)len, MPI_BYTE, r, n, t, a->root, comm, rq);
    break;
  case BRAID__COLL_SCATTER:
    rc = MPI_Iscatter(s, n, t, a->recv_in_place ? MPI_IN_PLACE : r, (int)len, MPI_BYTE, a->root, comm, rq);
    break;
  default:
    rc = MPI_Ialltoall(s, n, t, r, n, t, comm, rq);
    break;
  }
  if (t != MPI_BYTE) MPI_Type_free(&t); /* freed when the operation ends */
  return rc;
}

static braid_status run_blocks(braid_comm *c, blk_arg *a, const char *what) {
  mpi_state *s = state(c);
  return run_pieces(c, a->block, s->max_count, piece_blk, a, what);
}

static braid_status mpi_all_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt) {
  braid_status st = precheck(c);
  if (st) return st;
  size_t b = count * braid_dtype_size(dt);
  blk_arg a = {BRAID__COLL_ALL_GATHER, send, recv, b, 0, send == (char *)recv + (size_t)c->rank * b, 0};
  return run_blocks(c, &a, "MPI_Iallgather");
}

static braid_status mpi_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int root) {
  braid_status st = precheck(c);
  if (st) return st;
  size_t b = count * braid_dtype_size(dt);
  int me = c->rank == root;
  blk_arg a = {BRAID__COLL_GATHER, send, me ? recv : NULL, b, root,
               me && send == (char *)recv + (size_t)root * b, 0};
  return run_blocks(c, &a, "MPI_Igather");
}

static braid_status mpi_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int root) {
  braid_status st = precheck(c);
  if (st) return st;
  size_t b = count * braid_dtype_size(dt);
  int me = c->rank == root;
  blk_arg a = {BRAID__COLL_SCATTER, me ? send : NULL, recv, b, root, 0,
               me && recv == (const char *)send + (size_t)root * b};
  return run_blocks(c, &a, "MPI_Iscatter");
}

static braid_status mpi_all_to_all(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt) {
  braid_status st = precheck(c);
  if (st) return st;
  size_t b = count * braid_dtype_size(dt);
  if (send == recv) {
    void *t = braid__scratch(c, 0, b * (size_t)c->size);
    if (!t) return BRAID_ERR_NO_MEMORY;
    memcpy(t, send, b * (size_t)c->size);
    send = t;
  }
  blk_arg a = {BRAID__COLL_ALL_TO_ALL, send, recv, b, 0, 0, 0};
  return run_blocks(c, &a, "MPI_Ialltoall");
}

/* All-to-allv: the counts are checked pairwise first (an all-to-all of what
   each rank sends, compared with what each expects, the first bad pair
   agreed on by a max-reduction), then the blocks move by MPI_Isend/Irecv
   in pieces, which takes any size. */
static braid_status mpi_all_to_allv(braid_comm *c, const void *send, const size_t *send_counts,
                                    const size_t *send_displs, void *recv, const size_t *recv_counts,
                                    const size_t *recv_displs, braid_dtype dt) {
  braid_status st = precheck(c);
  if (st) return st;
  if (send == recv) { /* in place: each block goes out from where its reply lands */
    send_counts = recv_counts;
    send_displs = recv_displs;
  }
  mpi_state *s = state(c);
  int n = c->size;
  size_t es = braid_dtype_size(dt);
  uint64_t *told = malloc(sizeof(uint64_t) * 2 * (size_t)n);
  if (!told) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %d ranks' counts", n);
  for (int q = 0; q < n; q++) told[q] = send_counts[q];
  MPI_Request rq;
  LOCK();
  int rc = MPI_Ialltoall(told, 1, MPI_UINT64_T, told + n, 1, MPI_UINT64_T, s->comm, &rq);
  UNLOCK();
  if (rc) {
    free(told);
    return mpi_fail(c, "MPI_Ialltoall", rc);
  }
  if ((st = wait_mpi(c, &rq, 1, "the other ranks' all-to-allv counts"))) return st; /* told stays MPI's */
  /* Encoded pair (sender + 1) << 32 | receiver, and counts: the largest wins. */
  uint64_t *bad = s->chk64, *worst = s->chk64 + 1;
  bad[0] = 0;
  for (int q = 0; q < n; q++)
    if (told[n + q] != recv_counts[q] && !bad[0]) {
      bad[0] = (uint64_t)(q + 1) << 32 | (uint32_t)c->rank;
    }
  LOCK();
  rc = MPI_Iallreduce(bad, worst, 1, MPI_UINT64_T, MPI_MAX, s->comm, &rq);
  UNLOCK();
  if (rc) {
    free(told);
    return mpi_fail(c, "MPI_Iallreduce", rc);
  }
  if ((st = wait_mpi(c, &rq, 1, "the other ranks' count check"))) {
    free(told);
    return st;
  }
  if (worst[0]) {
    /* The receiving rank of the pair tells every rank both counts. */
    int from = (int)(worst[0] >> 32) - 1, to = (int)(uint32_t)worst[0];
    uint64_t *pair = s->chk64 + 2;
    pair[0] = c->rank == to ? told[n + from] : 0;
    pair[1] = c->rank == to ? recv_counts[from] : 0;
    free(told);
    LOCK();
    rc = MPI_Iallreduce(MPI_IN_PLACE, pair, 2, MPI_UINT64_T, MPI_MAX, s->comm, &rq);
    UNLOCK();
    if (rc) return mpi_fail(c, "MPI_Iallreduce", rc);
    if ((st = wait_mpi(c, &rq, 1, "the other ranks' count check"))) return st;
    return braid__fail_comm(c, BRAID_ERR_MISMATCH,
                            "rank %d sends %llu elements of %s to rank %d where rank %d expects %llu from it",
                            braid__label(c, from), (unsigned long long)pair[0], braid_dtype_name(dt),
                            braid__label(c, to), braid__label(c, to), (unsigned long long)pair[1]);
  }
  free(told);
  /* In place (send == recv): blocks are read from a copy. */
  if (send == recv) {
    size_t end = 0;
    for (int q = 0; q < n; q++)
      if (send_counts[q] && (send_displs[q] + send_counts[q]) * es > end) end = (send_displs[q] + send_counts[q]) * es;
    void *t = braid__scratch(c, 0, end ? end : 1);
    if (!t) return BRAID_ERR_NO_MEMORY;
    memcpy(t, send, end);
    send = t;
  }
  size_t cap = 0;
  for (int q = 0; q < n; q++)
    cap += (send_counts[q] * es + s->max_count - 1) / s->max_count + (recv_counts[q] * es + s->max_count - 1) / s->max_count;
  MPI_Request *rqs = malloc(sizeof(MPI_Request) * (cap ? cap : 1));
  if (!rqs) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %zu requests", cap);
  int k = 0;
  rc = 0;
  LOCK();
  for (int i = 1; i <= n && !rc; i++) {
    int to = (c->rank + i) % n, from = (c->rank - i % n + n) % n;
    for (size_t off = 0; off < recv_counts[from] * es && !rc; off += s->max_count) {
      size_t b = recv_counts[from] * es - off;
      rc = MPI_Irecv((char *)recv + recv_displs[from] * es + off, (int)(b < s->max_count ? b : s->max_count),
                     MPI_BYTE, from, TAG_A2AV, s->comm, &rqs[k++]);
    }
    for (size_t off = 0; off < send_counts[to] * es && !rc; off += s->max_count) {
      size_t b = send_counts[to] * es - off;
      rc = MPI_Isend((const char *)send + send_displs[to] * es + off, (int)(b < s->max_count ? b : s->max_count),
                     MPI_BYTE, to, TAG_A2AV, s->comm, &rqs[k++]);
    }
  }
  UNLOCK();
  /* Blocks posted before a failed post stay MPI's, as after a wait that gives up. */
  if (rc && k > 1) s->abandoned = 1;
  st = rc ? mpi_fail(c, "MPI_Isend/MPI_Irecv", rc) : wait_mpi(c, rqs, k, "all-to-allv blocks");
  free(rqs);
  return st;
}

static braid_status mpi_barrier(braid_comm *c) {
  if (c->check) return precheck(c); /* a reduction every rank joins is a barrier */
  MPI_Request rq;
  LOCK();
  int rc = MPI_Ibarrier(state(c)->comm, &rq);
  UNLOCK();
  if (rc) return mpi_fail(c, "MPI_Ibarrier", rc);
  return wait_mpi(c, &rq, 1, "the other ranks to enter the barrier");
}

/* BRAID_MPI_COLL=auto: braid's algorithms for a call whose vector (a
   call's buffer, or all n blocks, as the selection table counts it) is at
   most upto bytes, or at any size on 2 ranks where pair is set; MPI's
   non-blocking collective beyond. From interleaved runs of both against
   Open MPI over shared memory at 2 and 4 ranks (docs/MPI.md): braid's won
   every small call (MPI's non-blocking collectives pay for a schedule per
   call) and, where there is no upto, every size measured; the rest is
   where Open MPI's own algorithms won. */
#define KIB ((size_t)1024)
static const struct {
  size_t upto;
  uint8_t pair;
} GENERIC_UPTO[BRAID__COLL_NKINDS] = {
    [BRAID__COLL_ALL_REDUCE] = {16 * KIB, 1},  [BRAID__COLL_BROADCAST] = {256 * KIB, 1},
    [BRAID__COLL_ALL_GATHER] = {64 * KIB, 1},  [BRAID__COLL_REDUCE_SCATTER] = {SIZE_MAX, 1},
    [BRAID__COLL_BARRIER] = {SIZE_MAX, 1},     [BRAID__COLL_REDUCE] = {SIZE_MAX, 1},
    [BRAID__COLL_GATHER] = {16 * KIB, 0},      [BRAID__COLL_SCATTER] = {256 * KIB, 0},
    [BRAID__COLL_ALL_TO_ALL] = {256 * KIB, 1},
};

/* Whether this call takes braid's generic algorithm (the same answer on
   every rank: the mode is agreed at init, the rest are the call's
   arguments). All-to-allv stays MPI's: its count check is a collective
   of its own before the pairwise exchange; so does a collective that
   BRAID_ALGO names "native". */
static int mpi_declines(const braid_comm *c, braid__coll_kind kind, size_t bytes) {
  const mpi_state *s = c->be;
  if (kind == BRAID__COLL_ALL_TO_ALLV || s->coll == COLL_NATIVE || c->algo[kind] == BRAID__ALGO_NATIVE) return 0;
  if (s->coll == COLL_GENERIC) return 1;
  if (c->size == 2 && GENERIC_UPTO[kind].pair) return 1;
  return braid__algo_vector(kind, bytes, c->size) <= GENERIC_UPTO[kind].upto;
}

const braid__backend braid__mpi_backend = {
    .name = "mpi",
    .caps = BRAID__CAP_OWN_WORLD,
    .dtypes = BRAID__ALL_DTYPES,
    .req_size = sizeof(mpi_req),
    .req_clear = offsetof(mpi_req, w.inl),
    .umsg_size = sizeof(mpi_umsg),
    .init = mpi_init,
    .split = mpi_split,
    .destroy = mpi_destroy,
    .abort = mpi_abort,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .progress = mpi_progress,
    .take = mpi_take,
    .release_umsg = mpi_release_umsg,
    .arm = mpi_arm,
    .sleep = mpi_sleep,
    .disarm = mpi_disarm,
    .check_peers = mpi_check_peers,
    .publish_position = mpi_publish_position,
    .peer_position = mpi_peer_position,
    .remote_failure = mpi_remote_failure,
    .publish_failure = mpi_publish_failure,
    .declines = mpi_declines,
    .barrier = mpi_barrier,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .reduce = mpi_reduce,
    .gather = mpi_gather,
    .scatter = mpi_scatter,
    .all_to_all = mpi_all_to_all,
    .all_to_allv = mpi_all_to_allv,
    .stream = NULL,
};
