/* Backend "shm": ranks of one host communicating through a shared-memory
   segment per communicator, with single-copy (CMA) transfers for large data.
   Internal layout shared by shm.c (segment, waiting, collectives) and
   shm_p2p.c (tagged send/recv). */
#ifndef BRAID_SHM_H
#define BRAID_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "core/comm.h"
#include "core/mem.h"
#include "core/reduce.h"

#define SHM_CL 64
#define SHM_SLOT_BYTES (16u << 10)             /* per rank, two of them (collective parity) */
#define SHM_SLOT_DATA (SHM_SLOT_BYTES - 64u)   /* payload of the flat small-message scheme */
#define SHM_RING_BYTES (256u << 10)            /* per ordered pair of ranks */
#define SHM_EAGER_MAX (8u << 10)               /* larger sends go by rendezvous */
#define SHM_FRAG (64u << 10)                   /* data fragment when streaming through a ring */
#define SHM_ROTATE ((size_t)512 << 10)      /* calls staging up to this much per rank rotate (see rotate) */
#define SHM_ROTATE_REGION ((size_t)2 << 20) /* ... through this much of their region */
#define SHM_NT_MIN ((size_t)16 << 20)          /* transfers from this size copy out with streaming stores */
#define SHM_BRING 64u                          /* entries of the small-broadcast ring */

/* Failure kinds published in the segment so every rank stops waiting. */
enum { SHM_FAIL_DIED = 1, SHM_FAIL_ABORTED = 2, SHM_FAIL_FAILED = 3 };

typedef struct shm_hdr {
  _Atomic uint64_t magic; /* written last by the creator */
  uint32_t n;
  int32_t creator_pid;
  uint64_t total, staging;
  uint64_t cma_min; /* rank 0's BRAID_SHM_CMA_MIN: every rank must pick the same paths */
  uint64_t off_ctl, off_slots, off_bring, off_staging, off_rings;
  _Alignas(SHM_CL) _Atomic uint32_t attached;
  _Atomic uint32_t unlinked;
  _Alignas(SHM_CL) _Atomic uint64_t fail; /* kind << 48 | origin << 24 | peer */
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
  char *local;
} shm_zmap;

#define SHM_ZMAP_CAP 8 /* mappings kept per peer */
#define SHM_ZKEY_BCAST (1ull << 63) /* broadcast keys count streamed chunks, others phase values */

/* One per rank: the phase flag (with the addresses it publishes), the sleep
   doorbell, rarely written identity, and the braid-memory announcement, each
   in its own cache line. */
typedef struct shm_ctl {
  _Alignas(SHM_CL) _Atomic uint64_t flag;
  _Atomic uint64_t bcast_done;  /* small broadcasts this rank has finished */
  _Atomic uint64_t stream_done; /* chunks of streamed broadcasts this rank has written (root) or copied out */
  uint64_t addr;                /* this rank's buffer, for peers' single copy */
  _Alignas(SHM_CL) _Atomic uint32_t futex;
  _Atomic uint32_t sleeping;
  _Alignas(SHM_CL) int32_t pid;
  _Atomic uint32_t left;   /* braid_destroy ran: exiting afterwards is not a failure */
  _Atomic uint32_t cma_ok; /* 1: could read the next rank's memory, 2: could not */
  _Atomic uint32_t membar; /* 1: registered for expedited global membarrier, 2: not */
  _Atomic uint32_t zc_ok;  /* 1: could map the next rank's braid memory, 2: could not */
  int32_t probe_fd;        /* this process's braid-memory probe (see braid__mem_probe_fd) */
  uint64_t probe_addr;
  shm_zref zref;           /* this rank's braid-memory buffer of the current operation */
} shm_ctl;

/* Records carry their own sequence stamp, so a receiver polls the next slot
   and finds header and payload in one cache miss; only the consumer's
   position is shared, read by the producer when its cached copy says full. */
typedef struct shm_ring {
  _Alignas(SHM_CL) _Atomic uint64_t tail; /* consumer */
  _Alignas(SHM_CL) char data[];
} shm_ring;

/* This rank's private cursors into the rings it writes to and reads from,
   per peer. */
typedef struct shm_cursor {
  uint64_t head;      /* next write position in the ring to the peer */
  uint64_t tail_seen; /* that ring's consumer position as last read */
  uint64_t tail;      /* next read position in the ring from the peer */
} shm_cursor;

typedef struct shm_sendop shm_sendop;
typedef struct shm_recvop shm_recvop;
typedef struct shm_umsg shm_umsg;
typedef struct shm_ctrl shm_ctrl;

typedef struct shm_state {
  char *base;
  size_t total;
  shm_hdr *hdr;
  int n, me;
  int cma;             /* all ranks agreed on single-copy */
  int oversub;         /* more ranks than online CPUs */
  int light_wake;      /* all ranks registered for membarrier (see shm_wake_fence) */
  int zc;              /* all ranks can map each other's braid_mem_alloc memory */
  shm_zmap *zmaps;     /* SHM_ZMAP_CAP per peer */
  uint64_t *zepoch;    /* per peer: its braid_mem_free count when last seen */
  uint64_t zclock;     /* use counter for evicting mappings */
  size_t staging;      /* bytes per rank */
  size_t cma_min;      /* collectives of at least this many bytes use single copy */
  pid_t *pids;
  int *pidfds;         /* -1 where pidfd_open is unavailable */
  uint64_t ph;         /* my phase flag value */
  uint64_t cseq;       /* flat exchanges run (slot parity) */
  uint64_t bseq;       /* small broadcasts run (ring entry) */
  uint64_t sseq;       /* chunks of streamed broadcasts run (staging slot) */
  uint64_t round;      /* staging rounds run (staging-half parity) */
  uint64_t agseq;      /* staged all-gathers run (see rotate) */
  unsigned spin_limit;
  double yield_s;
  char *tmp;           /* CMA landing buffers, n-1 of tmp_each bytes */
  size_t tmp_each;
  /* point to point */
  shm_sendop *sends, **sends_tail;
  shm_recvop *recvs, **recvs_tail;
  shm_umsg *umsgs, **umsgs_tail;
  shm_ctrl **ctrl_q;   /* per destination: control records waiting for ring space */
  shm_cursor *cur;     /* per peer */
  uint64_t next_id;
  int npending;        /* unfinished sends + receives */
  int npulls;          /* receives waiting to pull their message by single copy */
  uint64_t moved;      /* records written to or taken from the rings */
  int in_progress;
  braid_status deferred;
  char deferred_msg[320];
  shm_recvop *just_posted;   /* the receive the running braid_recv posted */
  char posted_mismatch[320]; /* its shape mismatch, found during that call */
  braid_comm *comm;          /* for progress on behalf of other communicators */
  struct shm_state *next_live; /* this process's shm communicators (see shm_progress_others) */
} shm_state;

static inline shm_ctl *shm_ctl_of(shm_state *s, int r) {
  return (shm_ctl *)(s->base + s->hdr->off_ctl) + r;
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

/* Copies len bytes of a transfer of total bytes out of shared memory; large
   transfers bypass the cache (see SHM_NT_MIN). */
static inline void shm_copy_out(void *dst, const void *src, size_t len, size_t total) {
  if (total >= SHM_NT_MIN) braid__copy_stream(dst, src, len);
  else memcpy(dst, src, len);
}

/* Waiting: spin with pause, then yield, then sleep on this rank's futex. */
typedef struct shm_wait {
  unsigned spins;
  int armed;
  int left_seen; /* the awaited peer has destroyed its communicator; one more look */
  uint32_t fval;
  double start, deadline, next_live;
} shm_wait;

void shm_wait_begin(shm_wait *w);
/* One step of a wait for peer; what describes the awaited thing in error
   messages (NULL: the oldest pending point-to-point operation). */
braid_status shm_wait_step(braid_comm *c, shm_state *s, shm_wait *w, int peer, const char *what);
void shm_wait_end(shm_state *s, shm_wait *w);
/* Moves point-to-point work of this process's other shm communicators
   whose locks are free (a sender waiting in one communicator may owe data
   to a receiver in another); returns how many still have work pending. */
int shm_progress_others(shm_state *s);
/* After publishing something: wakes every peer that announced it sleeps. */
void shm_wake_peers(shm_state *s);
void shm_wake_one(shm_state *s, int q);

/* Single-copy transfers; fail with PEER_LOST when the peer is gone. */
braid_status shm_cma_read(braid_comm *c, shm_state *s, int q, void *local, uint64_t remote, size_t len);

/* Publishes a failure in the segment and wakes every rank (SHM_FAIL_*). */
void shm_publish_fail(shm_state *s, int kind, int origin, int peer);

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
   rank q's address addr inside ref. */
braid_status shm_zc_map(braid_comm *c, shm_state *s, int q, const braid__mem_ref *ref, uint64_t addr,
                        const char **out);
/* Probes (at init) whether this rank may map rank q's braid memory. */
int shm_zc_probe(shm_state *s, int q);
void shm_zc_free(shm_state *s);

/* shm_p2p.c */
braid_status shm_p2p_send(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int dest, uint32_t tag);
braid_status shm_p2p_recv(braid_comm *c, void *buf, size_t count, braid_dtype dt, int src, uint32_t tag);
braid_status shm_p2p_sync(braid_comm *c, double timeout_s, int quiet);
/* Describes the oldest pending operation, for error messages. */
void shm_p2p_describe(shm_state *s, char *out, size_t len);
/* Moves whatever can move without waiting; only fatal errors are returned,
   others are kept for the next sync. */
braid_status shm_p2p_progress(braid_comm *c, shm_state *s);
void shm_p2p_free(braid_comm *c, shm_state *s);

#endif
