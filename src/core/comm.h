/* The communicator object and the transport contract every backend fills. */
#ifndef BRAID_COMM_H
#define BRAID_COMM_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>

#include "braid.h"
#include "core/desc.h"
#include "core/log.h"
#include "core/match.h"
#include "core/p2p.h"

/* A native collective's answer: "run the generic algorithm instead" (see
   braid__backend). Never returned to the application. */
#define BRAID__DECLINED ((braid_status)0x7fff)

typedef struct braid__backend braid__backend;

/* Directions of braid__backend.copy. */
typedef enum { BRAID__COPY_D2H, BRAID__COPY_H2D, BRAID__COPY_D2D } braid__copy_dir;

/* Optional CUDA stream hooks; NULL table: the backend has no communication stream. */
typedef struct braid__stream_ops {
  braid_status (*event_create)(braid_comm *c, uint64_t *event);
  braid_status (*event_destroy)(braid_comm *c, uint64_t event);
  braid_status (*event_record_on_comm_stream)(braid_comm *c, uint64_t event);
  braid_status (*event_record_on_stream)(braid_comm *c, uint64_t event, uint64_t stream);
  braid_status (*comm_stream_wait_event)(braid_comm *c, uint64_t event);
  braid_status (*stream_wait_event)(braid_comm *c, uint64_t stream, uint64_t event);
  braid_status (*sync_comm_stream)(braid_comm *c);
  /* The host waits, in the wait engine, until the event has completed.
     Optional: for a backend that composes this one (hier). */
  braid_status (*event_sync)(braid_comm *c, uint64_t event);
} braid__stream_ops;

/* Capabilities: what the core must know about a backend instead of testing
   its identity. */
enum {
  BRAID__CAP_NEEDS_STORE = 1 << 0, /* meets its peers through the rendezvous store */
  BRAID__CAP_SINGLE_RANK = 1 << 1, /* world size 1 only */
  BRAID__CAP_ONE_HOST = 1 << 2,    /* every rank on one host */
  BRAID__CAP_DEVICE_MEM = 1 << 3,  /* buffers are device memory */
  BRAID__CAP_PREMUL = 1 << 4,      /* native reductions take scaled-sum ops (braid__premul_of); without
                                      it the core scales the input and passes BRAID_SUM */
  BRAID__CAP_OWN_WORLD = 1 << 5,   /* init learns rank and size itself (MPI): no store, no rendezvous */
};

#define BRAID__ALL_DTYPES (~0ull) /* dtype mask bit per braid_dtype code (all codes are < 64) */

/*
 * A backend: a const table. The core has checked every argument (pointers,
 * ranges, dtype/op pair, overflow), rejected count 0 where it is a no-op,
 * holds c->lock (calls are serialized), set c->call to the public call's name,
 * and, for a collective, advanced c->seq and set c->desc. Backends report
 * failures with braid__fail(), which composes the message and marks fatal
 * statuses sticky.
 *
 * Required: init, destroy, abort, isend, irecv, progress, and the waiting
 * hooks. Point-to-point matching is the core's (core/match.h): a backend
 * hands arrivals to braid__match_arrival and unexpected messages to
 * braid__match_unexpected; take() moves an unexpected message into a
 * receive. Native collectives are optional: a NULL entry gets the generic
 * algorithm over isend/irecv (src/algos), so no NULL entry is ever called.
 */
struct braid__backend {
  const char *name;
  unsigned caps;          /* BRAID__CAP_* */
  uint64_t dtypes;        /* bit (1 << code) per dtype it can carry */
  size_t req_size;        /* its request type's size (braid__req first); >= sizeof(braid__req) */
  size_t req_clear;       /* leading bytes of a new request to zero (0: all); the rest the backend fills */
  size_t umsg_size;       /* its unexpected-message type's size (braid__umsg first) */

  /* Creates the state of a new communicator (c->rank, c->size, c->id,
     c->boot set). Collective over c's ranks. */
  braid_status (*init)(braid_comm *c);
  /* Creates child's state from parent of the same backend: members[i] is the
     parent rank of child rank i. Collective over the members only. NULL:
     init() runs on the child (its boot has the child's store namespace). */
  braid_status (*split)(braid_comm *parent, braid_comm *child, const int *members, int n);
  /* Best-effort completion of pending work within timeout_s, logging what it
     abandons, then frees the backend state. Must not block longer. */
  void (*destroy)(braid_comm *c, double timeout_s);
  /* From any thread, without c->lock: wakes every waiter so it sees the abort. */
  void (*abort)(braid_comm *c);

  /* Point to point. isend/irecv start r (fields filled by the core; an irecv
     reaches the backend only when no unexpected message matched it and r is
     on the posted queue) and may complete it at once. progress moves what
     can move without blocking, completes requests, and adds to c->moved
     when data moved. take moves unexpected message u into receive r (r not
     queued) and frees u's payload; the core frees u. release_umsg frees the
     payload of a message nobody received (destroy). */
  braid_status (*isend)(braid_comm *c, braid__req *r);
  braid_status (*irecv)(braid_comm *c, braid__req *r);
  braid_status (*progress)(braid_comm *c);
  braid_status (*take)(braid_comm *c, braid__req *r, braid__umsg *u);
  void (*release_umsg)(braid_comm *c, braid__umsg *u);

  /* Waiting (core/wait.h). arm announces that this thread is about to sleep
     (0: cannot sleep now, yield instead); the caller re-checks its condition,
     then calls sleep (which disarms) or disarm. sleep returns after at most
     slice_s, earlier when peers post, and may release c->lock meanwhile
     (self does, so another thread can supply a message). */
  int (*arm)(braid_comm *c);
  void (*sleep)(braid_comm *c, double slice_s);
  void (*disarm)(braid_comm *c);
  /* Liveness, every ~100 ms of a wait: fails c (PEER_LOST) and returns the
     status when a peer died or left; peer is the awaited rank or -1. */
  braid_status (*check_peers)(braid_comm *c, int peer, const char *what);
  /* A failure another rank published through the backend's own channel
     (cheap: called at every collective's start): 0, or 1 with the origin's
     status, rank and sentence (without its " (rank R)"). NULL: the core's
     store key is the only channel. */
  int (*remote_failure)(braid_comm *c, braid_status *st, int *origin, char *text, size_t len);
  /* Publishes this rank's failure through the backend's channel (may be
     called from another thread for braid_abort). */
  void (*publish_failure)(braid_comm *c, braid_status st, const char *text);
  /* Where peer stands, for the cross-rank check while this rank waits in
     collective seq: 1 with peer's descriptor of seq when it entered seq;
     0 when unknown (not there yet, or the backend cannot tell). NULL: the
     core asks the store. */
  int (*peer_desc)(braid_comm *c, int peer, uint64_t seq, braid__desc *out);
  /* Without peer_desc, a wait that lasts tells the other ranks where this
     rank stands (c->seq, c->desc), and the check reads where they stand:
     through the backend's own channel when it has these two (both or
     neither; reading must be cheap, with no round trip), else through the
     store. peer_position: 1 with the collective q last told (*at) and its
     descriptor, 0 when q told nothing yet. */
  void (*publish_position)(braid_comm *c);
  int (*peer_position)(braid_comm *c, int q, uint64_t *at, braid__desc *d);

  /* Called as every collective starts (c->seq and c->desc set), before
     the native or generic code: where the backend logs calls for
     peer_desc. Optional. */
  void (*coll_start)(braid_comm *c);

  /* A composed backend whose parts hold its messages (hier): the question
     of braid__match_scan_of about c's own collectives, asked of every part
     (src: c's rank). progress: the parts may first take what arrived.
     Optional. */
  int (*find_unexpected)(braid_comm *c, uint64_t seq, int inclusive, const braid__desc *mine, int progress, int *src,
                         braid__msg_hdr *h, uint64_t *tag_seq);

  /* Native collectives (optional). */
  /* Optional: nonzero when this call of kind (bytes per rank's buffer or
     block, as the selection table counts them) should take the generic
     algorithm although a native version exists, e.g. a native version
     written only for the sizes where it beats the generic one. It must
     depend only on arguments every rank passes alike. */
  int (*declines)(const braid_comm *c, braid__coll_kind kind, size_t bytes);
  /* A native collective may also return BRAID__DECLINED, before it has
     written any buffer of the caller and only where every rank makes the
     same choice (e.g. from what an exchange of its own just showed every
     rank): the generic algorithm then runs. */
  /* Optional, with the call check on: runs before a generic algorithm, for
     a backend whose native calls defer part of their check (shm's ring
     calls) to settle it first. */
  braid_status (*before_generic)(braid_comm *c);
  braid_status (*barrier)(braid_comm *c);
  braid_status (*all_reduce)(braid_comm *c, void *buf, size_t count, braid_dtype dt, braid_op op);
  braid_status (*broadcast)(braid_comm *c, void *buf, size_t count, braid_dtype dt, int root);
  braid_status (*all_gather)(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt);
  braid_status (*reduce_scatter)(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                 braid_op op);
  /* recv significant at root only; gather's recv and scatter's send hold
     count * size elements at the root; all-to-all's both everywhere;
     all-to-allv's counts and displacements are per peer, in elements. */
  braid_status (*reduce)(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, braid_op op,
                         int root);
  braid_status (*gather)(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int root);
  braid_status (*scatter)(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int root);
  braid_status (*all_to_all)(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt);
  braid_status (*all_to_allv)(braid_comm *c, const void *send, const size_t *send_counts, const size_t *send_displs,
                              void *recv, const size_t *recv_counts, const size_t *recv_displs, braid_dtype dt);

  const braid__stream_ops *stream;

  /* Device-memory backends, for a backend that composes them (hier):
     enqueues a copy between this communicator's memory and the host (or
     within its memory) after everything enqueued so far, complete when the
     stream is (stream->sync_comm_stream). Host memory must stay untouched
     until then. Optional. */
  braid_status (*copy)(braid_comm *c, void *dst, const void *src, size_t bytes, braid__copy_dir dir);
  /* Page-locked host memory for those copies (faster, and truly
     asynchronous). Optional. */
  braid_status (*host_alloc)(braid_comm *c, void **ptr, size_t size);
  void (*host_free)(braid_comm *c, void *ptr);

  /* Communication memory and registration (optional; NULL: host memory from
     braid_mem_alloc, registration a no-op). */
  braid_status (*mem_alloc)(braid_comm *c, void **ptr, size_t size);
  braid_status (*mem_free)(braid_comm *c, void *ptr);
  braid_status (*mem_register)(braid_comm *c, void *buf, size_t size, void **handle);
  braid_status (*mem_deregister)(braid_comm *c, void *handle);
};

#define BRAID_ERRLEN 512
#define BRAID__NSCRATCH 4
/* Scratch slot the core keeps for a call's prescaled input (scaled sums);
   the generic algorithms use slots 0 to 2. */
#define BRAID__SCRATCH_PREMUL 3

/* A scaled-sum op of a communicator (braid_op_premul_sum): op handle
   BRAID__PREMUL_BASE + slot. */
#define BRAID__PREMUL_BASE 8
#define BRAID__PREMUL_MAX 64
typedef struct braid__premul {
  uint8_t used;
  uint8_t dt;               /* braid_dtype of the op (and of its scalar) */
  uint32_t digest;          /* of dt and the scalar's bits: what the call check compares */
  unsigned char scalar[16]; /* the scalar, in dt */
} braid__premul;

struct braid_comm {
  const braid__backend *ops;
  void *be; /* backend state */
  int rank, size;
  uint64_t id;        /* unique per communicator within a job: tags, store namespaces */
  uint32_t nsplits;   /* splits made from this communicator so far */
  uint64_t seq;       /* collectives started so far, the same on every rank (split and barrier count) */
  braid__desc desc;   /* the collective in progress (kind NONE outside one) */
  braid__desc prev_desc; /* the one before (seq - 1) */
  uint32_t desc_hash; /* braid__desc_hash(seq, &desc) */
  uint16_t desc_flags; /* put in the next collective's descriptor: a backend calling into its parts makes
                          its own call's digest part of theirs */
  int check;          /* cross-rank call check on (BRAID_CHECK) */
  int stale_watch;    /* a generic collective ran: the next one looks for its unreceived messages */
  uint8_t algo[BRAID__COLL_NKINDS]; /* forced algorithm per collective (BRAID_ALGO), 0: automatic */
  double timeout_s;   /* 0: wait forever */
  double destroy_timeout_s;
  unsigned spin_limit; /* waits spin this many times before yielding (set by the backend) */
  unsigned spin_now;   /* spin_limit, or 0 while the CPUs are crowded (wait.c sets it) */
  double yield_s;      /* ... then yield this long before sleeping */
  struct braid__boot *boot;   /* rendezvous store and job layout (bootstrap/bootstrap.h) */
  struct braid_comm *parent;  /* sub-communicator: the communicator it serves (NULL for user communicators) */
  const void *cfg_handle; /* braid_config's backend handle (cfg->mpi_comm), for init; NULL: none */
  int *label_of;      /* a backend's internal part: its rank q is rank label_of[q] of the communicator the
                         user sees, which its messages name (NULL: ranks are their own labels) */
  int *world_of;      /* rank q is world rank world_of[q] (NULL: this is the world) */
  int *scope;         /* while starting: the world ranks whose death fails the start, scope[i] named
                         "rank i" (NULL: every world rank, by world rank) */
  int nscope;
  long *scope_pid;    /* their pids as learned while starting (0: not yet, or on another host) */
  int start_relayed;  /* its start failed on another rank's failure (braid__start_check): not told again */
  braid_status start_st;  /* own-world backend: this rank's start already failed so; its init only tells the others */
  double start_timeout_s; /* own-world backend: how long its start waits for the others (0: forever) */

  pthread_mutex_t lock;   /* serializes calls */
  const char *call;       /* name of the public call in progress (under lock) */
  atomic_int failed;      /* sticky fatal status, 0 while healthy */
  atomic_int aborted;     /* braid_abort() was called */
  atomic_int grouped;     /* collectives on it queued in open groups of any thread */
  int fail_published;     /* this rank's failure went out to the others */
  const _Atomic uint32_t *fail_flag; /* set by a backend whose channel has a cheap "someone failed" word */

  /* point to point (under lock) */
  braid__matcher match;
  braid__req *free_reqs;        /* request pool */
  int nfree;
  int nreqs;                    /* requests out of the pool (0 again once destroyed) */
  int releasing;                /* braid_destroy handed the unfinished requests to the backend */
  int lent;                     /* threads inside a call that let go of lock while they wait */
  _Atomic int entering;         /* threads blocked taking lock in braid__enter */
  int lendable;                 /* the call in progress lets others in while it waits (braid_sync) */
  braid__req *orphans;          /* completed while releasing: nobody else holds them */
  braid__req *pending, **pending_tail; /* user operations until braid_sync */
  uint64_t user_posted;         /* user operations posted so far (braid__req.ord) */
  int npending;                 /* requests started and not complete (user and internal) */
  uint64_t moved;               /* bumped by the backend whenever data moves */
  braid_status deferred;        /* first error found while matching, reported by braid_sync */
  char deferred_msg[320];
  int deferred_more;            /* errors found after it, before the report */
  char deferred_last[320];      /* the last of those */
  char posting_mismatch[320];   /* the shape mismatch of the receive braid_recv is posting */
  void *scratch[BRAID__NSCRATCH];
  size_t scratch_len[BRAID__NSCRATCH];

  struct braid_comm *live_next; /* this process's communicators (core/wait.c) */
  /* A part of a composed communicator (hier), outside the live list: while
     a wait of this part cannot finish, it moves the other parts' pending
     work (a send of one part may be what the peer needs before it can
     enter this part's call). Returns how many still have work. NULL: none. */
  int (*progress_siblings)(struct braid_comm *self);
  struct braid_comm *owner; /* the composed communicator (progress_siblings' context) */

  struct braid__trace *trace;          /* the flight recorder (core/trace.h); NULL when off */
  struct braid__trace_ent *trace_cur;  /* the entry of the call in progress */
  unsigned trace_signal_seen;          /* SIGUSR1 dumps answered */

  pthread_mutex_t err_lock; /* guards the messages (abort may write from another thread) */
  char last_error[BRAID_ERRLEN];
  char fatal_error[BRAID_ERRLEN]; /* message of the error that failed the communicator */
  char fatal_text[BRAID_ERRLEN];  /* the same without " (rank R)": what other ranks are told */

  braid__premul premul[BRAID__PREMUL_MAX]; /* scaled-sum ops (under lock) */
};

/* Records an error on c (or on this thread only, c NULL): message
   "<call>: <text> (rank R)", logged, and stored for braid_last_error. Fatal
   statuses (TIMEOUT, PEER_LOST, ABORTED, INTERNAL) make c failed. Returns st. */
braid_status braid__fail(braid_comm *c, braid_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
braid_status braid__vfail(braid_comm *c, braid_status st, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
/* An error of call on c that does not own c->call (another thread's call
   may hold it): recorded as c's last error, not fatal. */
braid_status braid__fail_in(braid_comm *c, const char *call, braid_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Same as braid__fail, but c is failed whatever st is (a collective mismatch
   leaves the ranks in different places: the communicator cannot go on). */
braid_status braid__fail_comm(braid_comm *c, braid_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fails c with a message that is already whole (another rank's sentence,
   published to this one): only " (rank R)" is added when it lacks one. */
braid_status braid__fail_relayed(braid_comm *c, braid_status st, const char *msg);
/* Fails c with another communicator's failure (text: its sentence without
   the rank), quietly: a composed backend's part, when the whole fails. */
void braid__fail_as(braid_comm *c, braid_status st, const char *text);
/* Fails c with st and the sentence its last error already holds. */
void braid__fail_promote(braid_comm *c, braid_status st);
/* msg's length without the " (rank R)" that c's sentences end with. */
size_t braid__rankless_len(const braid_comm *c, const char *msg);

/* braid__fail(NULL, ...) for calls that have no communicator, naming the
   caller after the sentence: " (rank R)" from BRAID_RANK, else " (pid P)"
   (not the default rank 0). */
braid_status braid__fail_caller(braid_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The calling thread's last error (braid_last_error(NULL)). */
void braid__set_thread_error(const char *msg);

/* The rank number messages use for rank q of c. */
static inline int braid__label(const braid_comm *c, int q) {
  return c->label_of && q >= 0 && q < c->size ? c->label_of[q] : q;
}

/* The scaled-sum op behind handle op on c; NULL for a builtin op, a handle
   out of range or a destroyed op. */
static inline const braid__premul *braid__premul_of(const braid_comm *c, braid_op op) {
  unsigned slot = (unsigned)op - BRAID__PREMUL_BASE;
  if ((unsigned)op < BRAID__PREMUL_BASE || slot >= BRAID__PREMUL_MAX || !c->premul[slot].used) return NULL;
  return &c->premul[slot];
}

/* A call that lets go of c->lock while it waits (self's sleep, a
   braid_sync letting other threads in): the calls let in set and clear the
   per-call fields as they enter and leave, so the waiting call keeps its
   own and puts them back when it holds the lock again. lent also keeps
   braid_destroy from a call let in from freeing c under the waiting one. */
typedef struct braid__call_fields {
  const char *call;
  struct braid__trace_ent *trace_cur;
  braid__desc desc;
  int lendable;
} braid__call_fields;

static inline braid__call_fields braid__lend_begin(braid_comm *c) {
  braid__call_fields f = {c->call, c->trace_cur, c->desc, c->lendable};
  c->lent++;
  c->lendable = 0; /* a call let in lends only if it is a braid_sync itself */
  return f;
}

static inline void braid__lend_end(braid_comm *c, const braid__call_fields *f) {
  c->lent--;
  c->call = f->call;
  c->trace_cur = f->trace_cur;
  c->desc = f->desc;
  c->lendable = f->lendable;
}

static inline int braid__aborted(const braid_comm *c) {
  return atomic_load_explicit(&((braid_comm *)c)->aborted, memory_order_acquire);
}

static inline int braid__status_is_fatal(braid_status st) {
  return st == BRAID_ERR_TIMEOUT || st == BRAID_ERR_PEER_LOST || st == BRAID_ERR_ABORTED || st == BRAID_ERR_INTERNAL;
}

/* The sentence every backend uses when a message and its receive differ:
   "message from rank R with tag T has N elements of f32 (B bytes) but the receive expects ...". */
void braid__mismatch_text(char *out, size_t len, int src, uint32_t tag, size_t msg_count, braid_dtype msg_dt,
                          size_t recv_count, braid_dtype recv_dt);

/* Keeps an error found while progressing (reported by the next braid_sync:
   the first in full, the number of later ones and the last). */
void braid__defer(braid_comm *c, braid_status st, const char *msg);
/* Moves what a part kept for its next sync to the whole (hier). */
void braid__defer_move(braid_comm *to, braid_comm *from);
/* Reports what was kept, the first error and how many more (the last
   named), on c as the current call's error, and forgets it. */
braid_status braid__deferred_report(braid_comm *c);

/* Fails c with BRAID_ERR_MISMATCH because rank peer is in another collective
   (theirs) than this rank's current one; the sentence names both calls. */
braid_status braid__coll_mismatch(braid_comm *c, int peer, const braid__desc *theirs);
/* The same when peer is in collective their_seq while this rank is in c->seq. */
braid_status braid__coll_mismatch_at(braid_comm *c, int peer, const braid__desc *theirs, uint64_t their_seq);
/* The same about this rank's collective seq, which it called as mine. */
braid_status braid__coll_mismatch_of(braid_comm *c, uint64_t seq, const braid__desc *mine, int peer,
                                     const braid__desc *theirs, uint64_t their_seq);
/* Messages of collectives this rank has finished (before seq, or up to it
   when inclusive) that no receive took: the sender was in another call.
   Fails c with the mismatch and returns it; OK when there are none.
   progress: a composed backend's parts may first take what arrived. */
braid_status braid__coll_check_stale(braid_comm *c, int inclusive, int progress);

/* Allocation and release of the bare object (api/ and the sub-communicator helper). */
braid_comm *braid__comm_alloc(void);
void braid__comm_free(braid_comm *c);
/* Requests this process's destroyed communicators never freed (0). */
int braid__reqs_lost(void);

#endif
