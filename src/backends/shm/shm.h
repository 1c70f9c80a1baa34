/* Backend "shm": ranks of one host communicating through a shared-memory
   segment per communicator, with single-copy (CMA) transfers for large data.
   Internal layout shared by shm_seg.c (segment, init, split, destroy),
   shm_wait.c (sleeping, liveness, failures, the call-check log), shm_coll.c
   (collectives), shm_p2p.c (requests over per-pair rings) and shm_zc.c
   (zero copy from braid memory). */
#ifndef BRAID_SHM_H
#define BRAID_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "backends/shm/shm_a2a_pick.h"
#include "core/comm.h"
#include "core/mem.h"
#include "core/reduce.h"
#include "core/wait.h"

#define SHM_CL 64
#define SHM_SLOT_BYTES (16u << 10)             /* per rank, two of them (collective parity) */
#define SHM_SLOT_DATA (SHM_SLOT_BYTES - 64u)   /* payload of the flat small-message scheme */
#define SHM_RING_BYTES (256u << 10)            /* per ordered pair of ranks */
#define SHM_EAGER_MAX (8u << 10)               /* larger sends go by rendezvous */
#define SHM_EBUF_CACHE 16                      /* eager buffers kept for unexpected messages */
#define SHM_FRAG (64u << 10)                   /* data fragment when streaming through a ring */
#define SHM_PIPE_BYTES (256u << 10)            /* capacity asked for a pair's pipe (see shm_pipe) */
#define SHM_PIPE_MAX ((size_t)4 << 20)         /* larger messages stream through the ring (see shm_pipe) */
#define SHM_NO_PNO UINT64_MAX                  /* shm_req.pno of a message that does not cross the pipes */
#define SHM_SPLICE_AG_MIN ((size_t)64 << 10)   /* 2-rank all-gathers with blocks in this range go over pipes */
#define SHM_SPLICE_AG_MAX ((size_t)1 << 20)
#define SHM_ROTATE ((size_t)512 << 10)      /* calls staging up to this much per rank rotate (see rotate) */
#define SHM_ROTATE_REGION ((size_t)2 << 20) /* ... through this much of their region */
#define SHM_NT_MIN ((size_t)16 << 20)          /* transfers from this size copy out with streaming stores */
#define SHM_BRING 64u                          /* entries of the small-broadcast ring */
#define SHM_PREFETCH_MAX 1024u                 /* bytes of the next ring entry fetched ahead */
#define SHM_A2A_SHARED_ROUND ((size_t)2 << 20) /* ranks sharing cores: bytes a staged all-to-all round may take */
#define SHM_REDUCE_ROOT_MAX 4                  /* reduces above the slots on at most this many ranks: the root adds */
#define SHM_REDUCE_RANGE ((size_t)64 << 10)    /* ... ranges of this many bytes at a time */
#define SHM_MIN_STAGING ((size_t)64 << 10)     /* per rank: what a full /dev/shm may shrink staging to */
#define SHM_DLOG 128u                          /* collectives remembered per rank for the call check */
#define SHM_FAIL_TEXT 448

/* The failure a rank published for every other (see shm_publish_failure). */
typedef struct shm_fail {
  _Alignas(SHM_CL) _Atomic uint32_t claim; /* the first publisher takes it */
  _Atomic uint32_t ready;                  /* status, origin and text are written */
  int32_t status, origin;
  char text[SHM_FAIL_TEXT];
} shm_fail;

typedef struct shm_hdr {
  _Atomic uint64_t magic; /* written last by the creator */
  uint32_t n;
  int32_t creator_pid;
  uint64_t total, staging;
  uint64_t cma_min; /* rank 0's BRAID_SHM_CMA_MIN: every rank must pick the same paths */
  uint64_t off_ctl, off_dlog, off_slots, off_bring, off_staging, off_rings;
  _Alignas(SHM_CL) _Atomic uint32_t attached;
  _Atomic uint32_t unlinked;
  _Alignas(SHM_CL) _Atomic uint64_t bclaim; /* sequence number of the last streamed broadcast a root claimed */
  shm_fail fail;
} shm_hdr;

/* Where a rank's buffer for one operation lies in its braid_mem_alloc memory,
   so peers read it in place. key names the operation (see shm_zc_announce)
   and is stored last; peers read the rest after seeing the key. */
typedef struct shm_zref {
  _Alignas(SHM_CL) _Atomic uint64_t key;
  uint64_t gen, base, len, epoch; /* the allocation (braid__mem_ref) */
  uint64_t addr;                  /* the buffer's address in the owner */
  int32_t fd;
} shm_zref;

/* A peer's allocation mapped into this process. */
typedef struct shm_zmap {
  uint64_t gen, len, base, used;
  uint64_t pin; /* the collective (sequence number) reading it; 0: none */
  char *local;
} shm_zmap;

#define SHM_ZMAP_CAP 8 /* mappings kept per peer */
#define SHM_ZKEY_BCAST (1ull << 63) /* broadcast keys count streamed chunks, others phase values */

/* One entry of a rank's log of the collectives it entered: peers read it
   only when a wait goes slow (seqlock: seq is 0 while the entry changes). */
typedef struct shm_dlog {
  _Atomic uint64_t seq;
  braid__desc desc;
  uint64_t pad;
} shm_dlog;

/* One per rank: the phase flag (with the addresses and call digest it
   publishes), the sleep doorbell, rarely written identity and the
   braid-memory announcement, each in its own cache line. (The call logs
   are a region of their own, away from the lines every call touches.) */

typedef struct shm_ctl {
  _Alignas(SHM_CL) _Atomic uint64_t flag;
  _Atomic uint64_t bcast_done;  /* ring calls (small broadcasts, scatters, gathers, reduces) this rank has finished */
  _Atomic uint64_t stream_done; /* chunks of streamed broadcasts this rank has written (root) or copied out */
  uint64_t addr;                /* this rank's buffer, for peers' single copy */
  _Atomic uint32_t dhash;       /* digest of the collective its phase posts belong to */
  _Atomic uint64_t a2a_pick[2]; /* rank 0: the path of its current large all-to-all(v) call (shm_coll.c) */
  _Alignas(SHM_CL) _Atomic uint32_t futex;
  _Atomic uint32_t sleeping;
  _Alignas(SHM_CL) int32_t pid;
  _Atomic uint32_t left;   /* braid_destroy ran: exiting afterwards is not a failure */
  _Atomic uint32_t cma_ok; /* 1: could read the next rank's memory, 2: could not */
  _Atomic uint32_t membar; /* 1: registered for expedited global membarrier, 2: not */
  _Atomic uint32_t zc_ok;  /* 1: could map the next rank's braid memory, 2: could not */
  _Atomic uint32_t splice_ok; /* 1: can move messages through pipes by vmsplice, 2: cannot */
  int32_t probe_fd;        /* this process's braid-memory probe (see braid__mem_probe_fd) */
  uint64_t probe_addr;
  shm_zref zref;           /* this rank's braid-memory buffer of the current operation */
  /* Ring call b + 1 at [b % SHM_BRING] when this rank wrote entry b as its
     root; read only by readers of calls with three ranks or more. */
  _Alignas(SHM_CL) _Atomic uint64_t ring_root[SHM_BRING];
} shm_ctl;

/* Records carry their own sequence stamp, so a receiver polls the next slot
   and finds header and payload in one cache miss; only the consumer's
   position is shared, read by the producer when its cached copy says full. */
typedef struct shm_ring {
  _Alignas(SHM_CL) _Atomic uint64_t tail; /* consumer */
  /* Bytes the producer lent to the consumer's pipe, and bytes the consumer
     read from it (see shm_pipe): neither side makes a call that would find
     the pipe full or empty, which would take the pipe's lock from the other
     side's copy. */
  _Alignas(SHM_CL) _Atomic uint64_t piped;
  _Alignas(SHM_CL) _Atomic uint64_t unpiped;
  /* The consumer's pipes for the producer's messages, written before the
     clear-to-send that offers them (see shm_pipe). */
  _Alignas(SHM_CL) struct {
    int32_t fd[2];
    uint32_t cap;
    uint64_t ino[2];
  } offer;
  _Alignas(SHM_CL) char data[];
} shm_ring;

/* This rank's private cursors into the rings it writes to and reads from,
   per peer. */
typedef struct shm_cursor {
  uint64_t head;      /* next write position in the ring to the peer */
  uint64_t tail_seen; /* that ring's consumer position as last read */
  uint64_t tail;      /* next read position in the ring from the peer */
} shm_cursor;

/* A request: the core's part first, then the rings' bookkeeping. */
typedef struct shm_req {
  braid__req base;
  struct shm_req *snext; /* sends list or the active receives */
  uint64_t id;           /* send: message id; receive: the id of the sender's message it pulls or streams */
  uint64_t addr;         /* receive by pull: the sender's buffer address */
  braid__mem_ref zref;   /* receive by pull from braid memory: the allocation */
  int state, zc;
  size_t sent, got;
  uint64_t pno;          /* streamed: its place among the pair's clear-to-sends (see shm_pipe) */
} shm_req;

/* An unexpected message: its eager payload, or where to fetch it. */
typedef struct shm_umsg {
  braid__umsg base;
  braid__mem_ref zref;
  int rndv, zc;
  uint64_t id, addr;
  char *data;
  int pooled; /* data is an SHM_EAGER_MAX buffer of the state's cache */
} shm_umsg;

typedef struct shm_ctrl shm_ctrl;

/* Without single copy, a large message from q to this rank can cross
   pipes this rank made: the sender vmsplices its pages in, this rank reads
   them out, one copy instead of two through the ring. The sender opens the
   pipes through /proc on the first clear-to-send that offers them and keeps
   one way (pipes or ring) for the pair, so the byte stream needs no
   headers: messages cross whole, in the order of their clear-to-sends.
   Two pipes take the stream's chunks in turn, so that the sender lends one
   chunk while this rank reads the one before from the other pipe: each
   call holds its pipe's lock for its whole copy or lend.
   Only messages up to SHM_PIPE_MAX take the pipes: a pipe leaves the copy
   and the pages' bookkeeping to the receiver alone, which an exchange (both
   ranks receiving) repays, but a larger message to a receiver that only
   receives moved faster through the ring, where the sender's core does
   half the copying. Deciding by whether the receiver sends too failed: in
   an exchange, one side may answer before its own send is posted, and a
   pair split between the ways was slower than either. */
typedef struct shm_pipe {
  int rd[2], wr[2]; /* receiving from q: this rank's pipes (-1: none yet) */
  uint64_t got;     /* bytes read from them */
  size_t rchunk;    /* stream bytes per turn of one of them */
  int out[2];       /* sending to q: q's pipes; out[0] -1 not yet offered, -2 the ring instead */
  size_t wchunk;    /* stream bytes per turn of one of q's pipes (their capacity may differ) */
  uint64_t lent;    /* bytes lent to q's pipes */
  uint64_t asked;   /* clear-to-sends sent to q */
  uint64_t rd_turn; /* the one whose message the pipes from q carry now */
  uint64_t offered; /* clear-to-sends received from q */
  uint64_t wr_turn; /* the one whose message goes into q's pipes now */
} shm_pipe;

typedef struct shm_state {
  char *base;
  size_t total;
  shm_hdr *hdr;
  shm_ctl *mine;       /* this rank's control lines */
  shm_dlog *my_dlog;   /* this rank's call log */
  int n, me;
  int cma;             /* all ranks agreed on single-copy */
  int oversub;         /* more ranks than online CPUs */
  int light_wake;      /* all ranks registered for membarrier (see shm_wake_fence) */
  int zc;              /* all ranks can map each other's braid_mem_alloc memory */
  int splice;          /* no single copy, and all ranks can vmsplice (see shm_pipe) */
  uint32_t fval;       /* this rank's doorbell value when it armed a sleep */
  int left_grace;      /* peer + 1 whose departure a wait has noticed once (see shm_check_peers) */
  shm_zmap *zmaps;     /* SHM_ZMAP_CAP per peer */
  uint64_t *zepoch;    /* per peer: its braid_mem_free count when last seen */
  uint64_t zclock;     /* use counter for evicting mappings */
  size_t staging;      /* bytes per rank */
  size_t cma_min;      /* collectives of at least this many bytes use single copy */
  pid_t *pids;
  int *pidfds;         /* -1 where pidfd_open is unavailable */
  uint64_t ph;         /* my phase flag value */
  int ring_last_root;  /* root of the last one-to-all ring call (-1: none yet) */
  uint64_t cseq;       /* flat exchanges run (slot parity) */
  uint64_t bseq;       /* ring calls run (small broadcasts, scatters, gathers, reduces: the ring entry) */
  /* Buffers for unexpected eager payloads, kept: a malloc/free of a few KiB
     at the top of the heap made glibc grow and trim it by sbrk on every
     message, with a TLB shootdown each time. */
  char *ebuf[SHM_EBUF_CACHE];
  int nebuf;
  uint64_t ring_low;   /* every other rank had finished this many ring calls when last read */
  uint32_t chash;      /* this call's digest as shm compares it: c->desc_hash folded with rdig */
  uint32_t rdig;       /* digest of the ring calls since the last call that compared every rank's digest */
  uint64_t full_seq;   /* that call's sequence number */
  uint64_t sseq;       /* chunks of streamed broadcasts run (staging slot) */
  uint64_t round;      /* staging rounds run (staging-half parity) */
  uint64_t agseq;      /* staged all-gathers run (see rotate) */
  /* Per staging half: a reduce's root (-1: none) still to post hneed before
     this rank rewrites the half (see red_to_root). */
  int hroot[2];
  uint64_t hneed[2];
  char *tmp;           /* CMA landing buffers, n-1 of tmp_each bytes */
  size_t tmp_each;
  /* point to point */
  shm_req *sends, **sends_tail; /* queued, waiting for an acknowledgement, or streaming */
  shm_req *active;              /* matched receives that pull or stream their message */
  int npulls;                   /* of those, receives waiting to pull by single copy */
  shm_ctrl **ctrl_q;            /* per destination: control records waiting for ring space */
  /* Rank 0: timings of the two paths of large all-to-all(v) calls, per
     kind and class (of rank 0's calls; shm_coll.c, a2a_choose). */
  shm_a2a_class a2a[2][SHM_A2A_CLASSES];
  uint64_t a2a_calls[2]; /* large calls of each kind so far */
  int a2a_mode;          /* rank 0: BRAID_SHM_A2A, 0 auto, 1 staged, 2 single copy */
  uint32_t *stalled;            /* per destination: the send pass in which its queue last found its ring full */
  uint32_t pass;                /* send passes (flush) so far */
  shm_cursor *cur;              /* per peer */
  shm_pipe *pipes;              /* per peer */
  uint64_t next_id;
} shm_state;

static inline shm_ctl *shm_ctl_of(shm_state *s, int r) {
  return (shm_ctl *)(s->base + s->hdr->off_ctl) + r;
}
static inline shm_dlog *shm_dlog_of(shm_state *s, int r) {
  return (shm_dlog *)(s->base + s->hdr->off_dlog) + (size_t)r * SHM_DLOG;
}
static inline shm_ring *shm_ring_of(shm_state *s, int src, int dst) {
  return (shm_ring *)(s->base + s->hdr->off_rings +
                      ((size_t)src * (size_t)s->n + (size_t)dst) * (sizeof(shm_ring) + SHM_RING_BYTES));
}

/* A waker publishes, fences, then reads the peer's sleeping flag; a sleeper
   sets the flag, fences, then re-checks. When every rank registered for
   membarrier, the sleeper's side (rare: it is about to sleep) forces the
   barrier on every CPU and the waker's side needs none, which keeps a full
   fence (a wait for its stores to reach the peer) off every send. */
static inline void shm_wake_fence(const shm_state *s) {
  if (s->light_wake) atomic_signal_fence(memory_order_seq_cst);
  else atomic_thread_fence(memory_order_seq_cst);
}

/* Asks for p's line in a state ready for writing. x86's PREFETCHW is a hint
   (a no-op where unsupported) that compilers emit only when told the target
   has it. */
static inline void shm_prefetch_write(const void *p) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
#else
  __builtin_prefetch(p, 1, 3);
#endif
}

/* The lines of [p, p + len), at most SHM_PREFETCH_MAX bytes, for writing
   or for reading. */
static inline void shm_prefetch_lines(const char *p, size_t len, int write) {
  if (len > SHM_PREFETCH_MAX) len = SHM_PREFETCH_MAX;
  for (size_t off = 0; off < len; off += SHM_CL) {
    if (write) shm_prefetch_write(p + off);
    else __builtin_prefetch(p + off, 0, 3);
  }
}

/* Copies len bytes of a transfer of total bytes out of shared memory; large
   transfers bypass the cache (see SHM_NT_MIN). */
static inline void shm_copy_out(void *dst, const void *src, size_t len, size_t total) {
  if (total >= SHM_NT_MIN) braid__copy_stream(dst, src, len);
  else memcpy(dst, src, len);
}

/* Waits, inside a function with braid_comm *c in scope, until cond holds;
   the core's engine spins, runs the checks, and sleeps through the hooks
   below. Returns the failure from the enclosing function. */
#define SHM_WAIT_UNTIL(cond, peer, what)                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      braid__waiter w_;                                               \
      braid__wait_begin(&w_);                                         \
      while (!(cond)) {                                               \
        braid_status st_ = braid__wait_poll(c, &w_, (peer), (what));  \
        if (st_) return st_;                                          \
      }                                                               \
      braid__wait_end(c, &w_);                                        \
    }                                                                 \
  } while (0)

/* BRAID_SHM_A2A's value as s->a2a_mode (-1: not a value). */
int shm_a2a_mode(const char *m);

/* shm_wait.c: the waiting hooks of the transport contract. */
int shm_arm(braid_comm *c);
void shm_sleep(braid_comm *c, double slice_s);
void shm_disarm(braid_comm *c);
braid_status shm_check_peers(braid_comm *c, int peer, const char *what);
int shm_remote_failure(braid_comm *c, braid_status *st, int *origin, char *text, size_t len);
void shm_publish_failure(braid_comm *c, braid_status st, const char *text);
int shm_peer_desc(braid_comm *c, int peer, uint64_t seq, braid__desc *out);
/* Logs the collective this rank enters (c->seq, c->desc) for peers' checks. */
void shm_dlog_enter(braid_comm *c, shm_state *s);
/* Publishes a failure in the segment (first publisher wins) and wakes every rank. */
void shm_fail_publish(shm_state *s, braid_status st, int origin, const char *text);
/* After publishing something: wakes every peer that announced it sleeps. */
void shm_wake_peers(shm_state *s);
void shm_wake_one(shm_state *s, int q);
void shm_wake_all_hard(shm_state *s);
/* 1 when rank q's process has exited (a zombie counts as exited). */
int shm_peer_dead(shm_state *s, int q);
/* Registers this process, once, for expedited membarrier; 1 if it worked. */
int shm_membarrier_register(void);

/* The pipes of shm_pipe (shm_pipe.c). */
int shm_splice_probe(void);
int shm_pipe_offer(shm_state *s, int src);
void shm_pipe_open_out(braid_comm *c, shm_state *s, int dst);
braid_status shm_pipe_push(braid_comm *c, shm_state *s, int dst, const char *buf, size_t len, size_t *done);
braid_status shm_pipe_pull(braid_comm *c, shm_state *s, int src, char *buf, size_t len, size_t *got);
void shm_pipes_free(shm_state *s);

/* Single-copy transfers; fail with PEER_LOST when the peer is gone. */
braid_status shm_cma_read(braid_comm *c, shm_state *s, int q, void *local, uint64_t remote, size_t len);
braid_status shm_cma_write(braid_comm *c, shm_state *s, int q, uint64_t remote, const void *local, size_t len);

/* shm_coll.c: the native collectives (the descriptor check included). */
void shm_coll_start(braid_comm *c);
braid_status shm_barrier(braid_comm *c);
braid_status shm_reduce(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, braid_op op,
                        int root);
braid_status shm_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int root);
braid_status shm_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt, int root);
braid_status shm_all_to_all(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt);
braid_status shm_all_to_allv(braid_comm *c, const void *send, const size_t *send_counts, const size_t *send_displs,
                             void *recv, const size_t *recv_counts, const size_t *recv_displs, braid_dtype dt);
int shm_declines(const braid_comm *c, braid__coll_kind kind, size_t bytes);
braid_status shm_settle(braid_comm *c);
braid_status shm_all_reduce(braid_comm *c, void *buf, size_t count, braid_dtype dt, braid_op op);
braid_status shm_broadcast(braid_comm *c, void *buf, size_t count, braid_dtype dt, int root);
braid_status shm_all_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt);
braid_status shm_reduce_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                braid_op op);
/* The phase flag: post() advances this rank's, wait_all() waits for every peer's. */
void shm_post(shm_state *s);
braid_status shm_wait_all(braid_comm *c, shm_state *s, uint64_t v, const char *what);

/* shm_zc.c: zero copy from braid_mem_alloc memory. */
/* Tells peers, for the operation key, where [buf, buf + len) lies in this
   rank's braid memory; 1 if it does (and zero copy is on), else 0 and peers
   see no announcement for key. Call before the post peers wait for. */
int shm_zc_announce(shm_state *s, const void *buf, size_t len, uint64_t key);
/* *out: this process's address of the buffer rank q announced for key, or
   NULL when it announced none. Fails (and fails the communicator for every
   rank) only when the announced memory cannot be mapped. */
braid_status shm_zc_peer(braid_comm *c, shm_state *s, int q, uint64_t key, const char **out);
/* Same for an allocation named in a message: *out is the local address of
   rank q's address addr inside ref. hold: the caller (a collective, as
   shm_zc_peer is) keeps *out until its call ends, and the mapping stays
   that long; otherwise *out is good until the next mapping of q's memory. */
braid_status shm_zc_map(braid_comm *c, shm_state *s, int q, const braid__mem_ref *ref, uint64_t addr, int hold,
                        const char **out);
/* Probes (at init) whether this rank may map rank q's braid memory. */
int shm_zc_probe(shm_state *s, int q);
void shm_zc_free(shm_state *s);

/* shm_p2p.c: requests over the per-pair rings (the transport contract). */
braid_status shm_isend(braid_comm *c, braid__req *r);
braid_status shm_irecv(braid_comm *c, braid__req *r);
braid_status shm_progress(braid_comm *c);
braid_status shm_take(braid_comm *c, braid__req *r, braid__umsg *u);
void shm_release_umsg(braid_comm *c, braid__umsg *u);
/* Drops every request and control record the rings' bookkeeping holds. */
void shm_p2p_free(braid_comm *c, shm_state *s);

#endif
