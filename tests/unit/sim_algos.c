/*
 * The generic algorithms of src/algos on N simulated ranks in one process,
 * without any transport: one thread per rank, each with its own
 * braid_comm, over a test double of core/p2p.h (in-memory queues under one
 * mutex, FIFO per (source, tag)). Built as its own executable from the
 * algorithm sources and the reduction kernels (tests/extra.cmake), so the
 * double replaces the core's point-to-point layer.
 *
 * The double is strict: a send completes only when a receive has taken it
 * (rendezvous; an eager mode copies at once), so an algorithm that relies
 * on buffering deadlocks here and is reported. It checks that matched
 * sends and receives agree on count, dtype and descriptor, that a send's
 * buffer is not changed while the send is in flight, that no buffer of an
 * in-flight receive overlaps another in-flight buffer, that every request
 * is freed by the end of a call, that scratch memory is used within its
 * size and one request per slot, and it can fail the k-th wait or scratch
 * request of a rank to run the error paths.
 *
 * Inputs have closed-form results (small integers in floats, wrapped
 * integers, normalized bools) computed independently here; every element
 * of every rank is compared, read-only inputs live in read-only pages,
 * outputs have guard zones.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "algos/algos.h"
#include "algos/patterns.h"
#include "core/comm.h"
#include "core/desc.h"
#include "core/p2p.h"
#include "core/reduce.h"
#include "core/tag.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SIM_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SIM_SANITIZED 1
#endif
#endif
#ifndef SIM_SANITIZED
#define SIM_SANITIZED 0
#endif

#define MAXR 16
#define INJECTED BRAID_ERR_PEER_LOST

/* ======================================================================== */
/* The test double of core/p2p.h                                             */

typedef struct sim_msg sim_msg;

typedef struct sim_req {
  braid__req base;
  int owner;
  uint64_t hash;                 /* a rendezvous send: its buffer's hash when posted */
  struct sim_req *qnext;         /* a receive on its owner's posted queue */
  struct sim_req *lnext, *lprev; /* its owner's live requests */
  sim_msg *msg;                  /* a rendezvous send still waiting in the destination's queue */
} sim_req;

struct sim_msg {
  int src;
  braid__msg_hdr h;
  const void *data;
  void *copy;    /* eager: the payload */
  sim_req *send; /* rendezvous: the send it is */
  sim_msg *next;
};

typedef struct sim_rank {
  braid_comm *c;
  pthread_cond_t cv;
  sim_req *posted;
  sim_msg *unexp;
  sim_req *live;
  int nlive;
  unsigned nwait, nscratch;
  void *scr[BRAID__NSCRATCH];
  size_t scap[BRAID__NSCRATCH], sasked[BRAID__NSCRATCH];
  int sused[BRAID__NSCRATCH];
  braid_status st;           /* the last call's status */
  const sim_req *last_recv; /* the receive posted last, while nothing was posted or freed since */
} sim_rank;

static struct sim {
  int n, eager;
  pthread_mutex_t mu;
  sim_rank rk[MAXR];
  braid_status failed; /* the world failed: every wait returns this */
  int inj_rank;
  unsigned inj_wait, inj_scratch; /* fail the k-th wait / scratch request of inj_rank (0: never) */
  int injected;
  double wait_limit_s;
  pthread_t th[MAXR];
  pthread_barrier_t go, done;
  void (*job)(int rank, void *arg);
  void *arg;
  int quit;
  uint64_t messages;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

static pthread_mutex_t problem_mu = PTHREAD_MUTEX_INITIALIZER;
static int nproblems;
static char first_problem[1024];

static void problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void problem(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&problem_mu);
  if (nproblems++ < 5) fprintf(stderr, "  double: %s\n", msg);
  if (nproblems == 1) snprintf(first_problem, sizeof first_problem, "%s", msg);
  pthread_mutex_unlock(&problem_mu);
}

static uint64_t hash_bytes(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n, w;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
  }
  for (; i < n; i++) h = (h ^ b[i]) * 0x94D049BB133111EBull;
  return h;
}

/* Status names without the core's status table (not part of this build). */
static const char *st_name(braid_status st) {
  static const char *const names[] = {"OK",       "INVALID_ARG", "UNSUPPORTED", "NO_MEMORY", "TIMEOUT", "PEER_LOST",
                                      "ABORTED",  "MISMATCH",    "BOOTSTRAP",   "SYSTEM",    "BACKEND", "INTERNAL"};
  return (unsigned)st < sizeof names / sizeof names[0] ? names[st] : "?";
}

static unsigned long long step_of(uint64_t tag) { return (unsigned long long)braid__tag_step(tag); }

static void fail_world(braid_status st) { /* S.mu held */
  if (!S.failed) S.failed = st;
  for (int r = 0; r < S.n; r++) pthread_cond_broadcast(&S.rk[r].cv);
}

static sim_req *new_req(braid_comm *c, int is_send, void *buf, size_t count, braid_dtype dt, int peer,
                        uint64_t tag) {
  sim_req *r = calloc(1, sizeof *r);
  if (!r) abort();
  r->owner = c->rank;
  r->base.is_send = (uint8_t)is_send;
  r->base.peer = peer;
  r->base.h.tag = tag;
  r->base.h.count = count;
  r->base.h.dt = (uint32_t)dt;
  r->base.h.desc = c->desc;
  r->base.buf = buf;
  r->base.bytes = count * braid_dtype_size(dt);
  sim_rank *R = &S.rk[c->rank];
  r->lnext = R->live;
  if (R->live) R->live->lprev = r;
  R->live = r;
  R->nlive++;
  return r;
}

static void free_req(sim_req *r) { /* S.mu held */
  sim_rank *R = &S.rk[r->owner];
  if (R->last_recv == r) R->last_recv = NULL;
  if (r->base.queued) {
    for (sim_req **pp = &R->posted; *pp; pp = &(*pp)->qnext)
      if (*pp == r) {
        *pp = r->qnext;
        break;
      }
  }
  if (r->msg) {
    sim_rank *D = &S.rk[r->base.peer];
    for (sim_msg **pp = &D->unexp; *pp; pp = &(*pp)->next)
      if (*pp == r->msg) {
        *pp = r->msg->next;
        break;
      }
    free(r->msg);
  }
  if (r->lprev) r->lprev->lnext = r->lnext;
  else R->live = r->lnext;
  if (r->lnext) r->lnext->lprev = r->lprev;
  R->nlive--;
  free(r);
}

/* An in-flight receive's buffer may overlap no other in-flight buffer of
   its rank, and a send's no in-flight receive's. */
static void check_overlap(const sim_req *r) {
  for (const sim_req *q = S.rk[r->owner].live; q; q = q->lnext) {
    if (q == r || q->base.done || (r->base.is_send && q->base.is_send) || !r->base.bytes || !q->base.bytes) continue;
    uintptr_t a = (uintptr_t)r->base.buf, b = (uintptr_t)q->base.buf;
    if (a < b + q->base.bytes && b < a + r->base.bytes)
      problem("rank %d: a %s at step %llu overlaps a %s at step %llu still in flight", r->owner,
              r->base.is_send ? "send" : "receive", step_of(r->base.h.tag), q->base.is_send ? "send" : "receive",
              step_of(q->base.h.tag));
  }
}

static void deliver(sim_req *rr, int src, const braid__msg_hdr *h, const void *data, const sim_req *send) {
  int ok = 1;
  if (h->count != rr->base.h.count || h->dt != rr->base.h.dt) {
    problem("rank %d -> %d step %llu: message of %llu x %s, receive of %llu x %s", src, rr->owner, step_of(h->tag),
            (unsigned long long)h->count, braid_dtype_name((braid_dtype)h->dt),
            (unsigned long long)rr->base.h.count, braid_dtype_name((braid_dtype)rr->base.h.dt));
    ok = 0;
  } else if (!braid__desc_equal(&h->desc, &rr->base.h.desc)) {
    problem("rank %d -> %d step %llu: descriptors differ", src, rr->owner, step_of(h->tag));
    ok = 0;
  }
  if (send && hash_bytes(data, send->base.bytes) != send->hash)
    problem("rank %d changed the buffer of its send to %d at step %llu while it was in flight", src, rr->owner,
            step_of(h->tag));
  if (ok && rr->base.bytes) memcpy(rr->base.buf, data, rr->base.bytes);
  rr->base.status = ok ? BRAID_OK : BRAID_ERR_MISMATCH;
  rr->base.done = 1;
  pthread_cond_signal(&S.rk[rr->owner].cv);
}

static int bad_args(braid_comm *c, int peer, braid_dtype dt, sim_req *r) {
  if (peer < 0 || peer >= S.n || !braid_dtype_size(dt) || c != S.rk[c->rank].c) {
    problem("rank %d: transfer with peer %d, dtype %d", c->rank, peer, (int)dt);
    r->base.done = 1;
    r->base.status = BRAID_ERR_INVALID_ARG;
    return 1;
  }
  return 0;
}

braid_status braid__isend(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                          braid__req **out) {
  pthread_mutex_lock(&S.mu);
  int me = c->rank;
  sim_req *r = new_req(c, 1, (void *)buf, count, dt, peer, tag);
  *out = &r->base;
  braid_status st = BRAID_OK;
  if (bad_args(c, peer, dt, r)) {
    st = BRAID_ERR_INVALID_ARG;
  } else if (S.failed) {
    r->base.done = 1;
    st = S.failed;
  } else {
    check_overlap(r);
    /* An exchange posts its send first (algos/internal.h): over a
       rendezvous transport a receive posted first lets the peer's data
       start before this rank's announcement, and across a slow link the
       two directions then run one after the other. Pairwise all-to-all
       keeps one tag for every step, so a step's receive and the next
       step's send to the same rank look alike: not checked there. */
    int a2a = c->desc.kind == BRAID__COLL_ALL_TO_ALL || c->desc.kind == BRAID__COLL_ALL_TO_ALLV;
    const sim_req *q = S.rk[me].last_recv;
    if (!a2a && q && q->base.queued && q->base.peer == peer && q->base.h.tag == tag)
      problem("rank %d: its receive from %d at step %llu was posted just before its send to %d at that step", me, peer,
              step_of(tag), peer);
    S.rk[me].last_recv = NULL;
    S.messages++;
    sim_rank *D = &S.rk[peer];
    sim_req *rr = NULL;
    for (sim_req **pp = &D->posted; *pp; pp = &(*pp)->qnext)
      if ((*pp)->base.peer == me && (*pp)->base.h.tag == tag) {
        rr = *pp;
        *pp = rr->qnext;
        rr->base.queued = 0;
        break;
      }
    if (rr) {
      deliver(rr, me, &r->base.h, buf, NULL);
      r->base.done = 1;
    } else {
      sim_msg *m = calloc(1, sizeof *m);
      if (!m) abort();
      m->src = me;
      m->h = r->base.h;
      if (S.eager) {
        m->copy = malloc(r->base.bytes ? r->base.bytes : 1);
        if (!m->copy) abort();
        if (r->base.bytes) memcpy(m->copy, buf, r->base.bytes);
        m->data = m->copy;
        r->base.done = 1;
      } else {
        m->data = buf;
        m->send = r;
        r->hash = hash_bytes(buf, r->base.bytes);
        r->msg = m;
      }
      sim_msg **pp = &D->unexp;
      while (*pp) pp = &(*pp)->next;
      *pp = m;
    }
  }
  pthread_mutex_unlock(&S.mu);
  return st;
}

braid_status braid__irecv(braid_comm *c, void *buf, size_t count, braid_dtype dt, int peer, uint64_t tag,
                          braid__req **out) {
  pthread_mutex_lock(&S.mu);
  sim_rank *R = &S.rk[c->rank];
  sim_req *r = new_req(c, 0, buf, count, dt, peer, tag);
  *out = &r->base;
  R->last_recv = r;
  braid_status st = BRAID_OK;
  if (bad_args(c, peer, dt, r)) {
    st = BRAID_ERR_INVALID_ARG;
  } else if (S.failed) {
    r->base.done = 1;
    st = S.failed;
  } else {
    check_overlap(r);
    sim_msg *m = NULL;
    for (sim_msg **pp = &R->unexp; *pp; pp = &(*pp)->next)
      if ((*pp)->src == peer && (*pp)->h.tag == tag) {
        m = *pp;
        *pp = m->next;
        break;
      }
    if (m) {
      deliver(r, m->src, &m->h, m->data, m->send);
      if (m->send) {
        m->send->base.done = 1;
        m->send->msg = NULL;
        pthread_cond_signal(&S.rk[m->src].cv);
      }
      free(m->copy);
      free(m);
    } else {
      sim_req **pp = &R->posted;
      while (*pp) pp = &(*pp)->qnext;
      *pp = r;
      r->base.queued = 1;
    }
  }
  pthread_mutex_unlock(&S.mu);
  return st;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void dump_world(void) { /* S.mu held */
  for (int r = 0; r < S.n; r++) {
    fprintf(stderr, "    rank %d:", r);
    for (sim_req *q = S.rk[r].live; q; q = q->lnext)
      if (!q->base.done)
        fprintf(stderr, " %s %d step %llu (%llu x %s);", q->base.is_send ? "send to" : "recv from", q->base.peer,
                step_of(q->base.h.tag), (unsigned long long)q->base.h.count,
                braid_dtype_name((braid_dtype)q->base.h.dt));
    fprintf(stderr, "\n");
  }
}

braid_status braid__waitall(braid_comm *c, braid__req **reqs, int n) {
  pthread_mutex_lock(&S.mu);
  sim_rank *R = &S.rk[c->rank];
  if (S.inj_wait && S.inj_rank == c->rank && ++R->nwait == S.inj_wait) {
    S.injected = 1;
    fail_world(INJECTED);
  }
  double deadline = now_s() + S.wait_limit_s;
  for (;;) {
    int all = 1;
    for (int i = 0; i < n; i++)
      if (reqs[i] && !reqs[i]->done) all = 0;
    if (all || S.failed) {
      braid_status st = S.failed;
      for (int i = 0; i < n; i++)
        if (reqs[i]) {
          if (!st) st = reqs[i]->status;
          free_req((sim_req *)reqs[i]);
          reqs[i] = NULL;
        }
      pthread_mutex_unlock(&S.mu);
      return st;
    }
    if (now_s() > deadline) {
      problem("deadlock: rank %d waited %.0f s; pending:", c->rank, S.wait_limit_s);
      dump_world();
      fail_world(BRAID_ERR_TIMEOUT);
      continue;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&R->cv, &S.mu, &ts);
  }
}

int braid__test(braid_comm *c, braid__req *r) {
  (void)c;
  pthread_mutex_lock(&S.mu);
  int d = r->done;
  pthread_mutex_unlock(&S.mu);
  return d;
}

braid_status braid__req_release(braid_comm *c, braid__req *r) {
  pthread_mutex_lock(&S.mu);
  if (!r->done) problem("rank %d released a request before it completed", c->rank);
  braid_status st = r->status;
  free_req((sim_req *)r);
  pthread_mutex_unlock(&S.mu);
  return st;
}

uint64_t braid__coll_tag(const braid_comm *c, uint64_t step) { return braid__tag_internal(c->id, c->seq, step); }

void *braid__scratch(braid_comm *c, int slot, size_t bytes) {
  sim_rank *R = &S.rk[c->rank];
  if (slot < 0 || slot >= BRAID__NSCRATCH) {
    problem("rank %d: scratch slot %d", c->rank, slot);
    return NULL;
  }
  if (S.inj_scratch && S.inj_rank == c->rank && ++R->nscratch == S.inj_scratch) {
    pthread_mutex_lock(&S.mu);
    S.injected = 1;
    fail_world(INJECTED);
    pthread_mutex_unlock(&S.mu);
    return NULL;
  }
  if (R->sused[slot]) problem("rank %d asked for scratch slot %d twice in one call", c->rank, slot);
  R->sused[slot] = 1;
  if (!R->scr[slot] || bytes > R->scap[slot]) {
    free(R->scr[slot]);
    R->scr[slot] = aligned_alloc(64, (bytes + 64 + 63) / 64 * 64);
    if (!R->scr[slot]) abort();
    R->scap[slot] = bytes;
  }
  memset(R->scr[slot], 0xA5, bytes); /* nothing carries over between calls */
  memset((char *)R->scr[slot] + bytes, 0x5C, 64);
  R->sasked[slot] = bytes;
  return R->scr[slot];
}

braid_status braid__fail(braid_comm *c, braid_status st, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(c->last_error, sizeof c->last_error, "%s: %s (rank %d)", c->call ? c->call : "braid", msg, c->rank);
  return st;
}

#ifndef SIM_HAVE_DESC_C
const char *braid__coll_short_name(int kind) {
  switch (kind) {
    case BRAID__COLL_NONE: return "p2p";
    case BRAID__COLL_ALL_REDUCE: return "allreduce";
    case BRAID__COLL_BROADCAST: return "broadcast";
    case BRAID__COLL_ALL_GATHER: return "allgather";
    case BRAID__COLL_REDUCE_SCATTER: return "reduce_scatter";
    case BRAID__COLL_BARRIER: return "barrier";
    case BRAID__COLL_SPLIT: return "split";
    default: return "unknown";
  }
}
#endif

/* ------------------------------------------------------------------------ */
/* Worlds: n threads that run one job per call of world_run */

static void *rank_thread(void *p) {
  int r = (int)(intptr_t)p;
  for (;;) {
    pthread_barrier_wait(&S.go);
    if (S.quit) return NULL;
    S.job(r, S.arg);
    pthread_barrier_wait(&S.done);
  }
}

static void world_open(int n, int eager) {
  S.n = n;
  S.eager = eager;
  S.failed = BRAID_OK;
  S.quit = 0;
  S.wait_limit_s = SIM_SANITIZED ? 120 : 30;
  pthread_barrier_init(&S.go, NULL, (unsigned)n + 1);
  pthread_barrier_init(&S.done, NULL, (unsigned)n + 1);
  for (int r = 0; r < n; r++) {
    sim_rank *R = &S.rk[r];
    memset(R, 0, sizeof *R);
    pthread_cond_init(&R->cv, NULL);
    R->c = calloc(1, sizeof(braid_comm));
    if (!R->c) abort();
    R->c->rank = r;
    R->c->size = n;
    R->c->id = 0x5eed0000u + (unsigned)n;
    R->c->be = R;
    if (pthread_create(&S.th[r], NULL, rank_thread, (void *)(intptr_t)r)) abort();
  }
}

static void world_reset(void) {
  pthread_mutex_lock(&S.mu);
  int failed = S.failed != BRAID_OK;
  for (int r = 0; r < S.n; r++) {
    sim_rank *R = &S.rk[r];
    if ((R->posted || R->unexp) && !failed) problem("rank %d has messages or receives left over", r);
    while (R->unexp) {
      sim_msg *m = R->unexp;
      R->unexp = m->next;
      if (m->send) m->send->msg = NULL;
      free(m->copy);
      free(m);
    }
    while (R->live) free_req(R->live);
    R->posted = NULL;
    R->nwait = R->nscratch = 0;
  }
  S.failed = BRAID_OK;
  S.injected = 0;
  S.inj_wait = S.inj_scratch = 0;
  pthread_mutex_unlock(&S.mu);
}

static void world_run(void (*job)(int, void *), void *arg) {
  S.job = job;
  S.arg = arg;
  pthread_barrier_wait(&S.go);
  pthread_barrier_wait(&S.done);
  world_reset();
}

static void world_close(void) {
  S.quit = 1;
  pthread_barrier_wait(&S.go);
  for (int r = 0; r < S.n; r++) {
    pthread_join(S.th[r], NULL);
    sim_rank *R = &S.rk[r];
    for (int s = 0; s < BRAID__NSCRATCH; s++) free(R->scr[s]);
    pthread_cond_destroy(&R->cv);
    free(R->c);
  }
  pthread_barrier_destroy(&S.go);
  pthread_barrier_destroy(&S.done);
  S.n = 0;
}

/* ======================================================================== */
/* Buffers                                                                   */

#define GUARD 64
#define GUARD_BYTE 0xE7

/* Writable, with guard zones on both sides. */
static void *galloc(size_t bytes) {
  unsigned char *b = malloc(16 + 2 * GUARD + bytes);
  if (!b) abort();
  memcpy(b, &bytes, sizeof bytes);
  memset(b + 16, GUARD_BYTE, GUARD);
  memset(b + 16 + GUARD + bytes, GUARD_BYTE, GUARD);
  return b + 16 + GUARD;
}

static int gintact(const void *p) {
  const unsigned char *b = (const unsigned char *)p - GUARD - 16;
  size_t bytes;
  memcpy(&bytes, b, sizeof bytes);
  for (size_t i = 0; i < GUARD; i++)
    if (b[16 + i] != GUARD_BYTE || b[16 + GUARD + bytes + i] != GUARD_BYTE) return 0;
  return 1;
}

static void gfree(void *p) {
  if (p) free((unsigned char *)p - GUARD - 16);
}

/* Read-only pages holding a copy of src, ending at a page boundary with
   inaccessible pages around them: any write or overrun faults. */
static const void *ro_alloc(const void *src, size_t bytes) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE), data = (bytes + pg - 1) / pg * pg;
  if (!data) data = pg;
  unsigned char *m = mmap(NULL, data + 2 * pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) abort();
  if (mprotect(m + pg, data, PROT_READ | PROT_WRITE)) abort();
  unsigned char *p = m + pg + data - bytes;
  memcpy(p, src, bytes);
  if (mprotect(m + pg, data, PROT_READ)) abort();
  return p;
}

static void ro_free(const void *p, size_t bytes) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE), data = (bytes + pg - 1) / pg * pg;
  if (!data) data = pg;
  unsigned char *m = (unsigned char *)p + bytes - data - pg;
  munmap(m, data + 2 * pg);
}

/* ======================================================================== */
/* Data types, closed-form inputs and results                                */

enum { K_F32, K_F64, K_F16, K_BF16, K_E4M3, K_INT, K_BOOL, K_C64 };

typedef struct dtinfo {
  braid_dtype dt;
  const char *name;
  size_t esz;
  int kind;
  int sgn;
} dtinfo;

static const dtinfo DTS[] = {
    {BRAID_F32, "f32", 4, K_F32, 0},      {BRAID_F64, "f64", 8, K_F64, 0},
    {BRAID_F16, "f16", 2, K_F16, 0},      {BRAID_BF16, "bf16", 2, K_BF16, 0},
    {BRAID_FP8_E4M3, "fp8_e4m3", 1, K_E4M3, 0}, {BRAID_I32, "i32", 4, K_INT, 1},
    {BRAID_I64, "i64", 8, K_INT, 1},      {BRAID_U8, "u8", 1, K_INT, 0},
    {BRAID_BOOL, "bool", 1, K_BOOL, 0},   {BRAID_C64, "c64", 8, K_C64, 0},
};
#define NDT (sizeof DTS / sizeof DTS[0])
static const char *const OPN[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};

static const dtinfo *dtinfo_of(braid_dtype dt) {
  for (size_t i = 0; i < NDT; i++)
    if (DTS[i].dt == dt) return &DTS[i];
  abort();
}

static uint64_t mix(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full ^ c * 0x165667B19E3779F9ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

/* Exact encoding of a value the format represents exactly (sign, ebits,
   mbits, bias; no infinities or NaNs needed here). */
static uint32_t enc_exact(double v, int ebits, int mbits, int bias) {
  uint32_t sign = signbit(v) ? 1u << (ebits + mbits) : 0;
  v = fabs(v);
  if (v == 0) return sign;
  int e;
  double f = frexp(v, &e); /* v = f * 2^e, f in [0.5, 1) */
  int E = e - 1 + bias;
  double m;
  if (E <= 0) {
    m = ldexp(v, bias - 1 + mbits);
    E = 0;
  } else {
    m = ldexp(f * 2 - 1, mbits);
  }
  if (m != floor(m) || E >= (1 << ebits)) {
    fprintf(stderr, "test bug: %g is not exact in a %d.%d format\n", v, ebits, mbits);
    abort();
  }
  return sign | (uint32_t)E << mbits | (uint32_t)m;
}

typedef struct val {
  double re, im;
  uint64_t u;
} val;

static void encode(const dtinfo *d, val v, void *dst) {
  switch (d->kind) {
    case K_F32: {
      float f = (float)v.re;
      memcpy(dst, &f, 4);
      break;
    }
    case K_F64: memcpy(dst, &v.re, 8); break;
    case K_F16: {
      uint16_t h = (uint16_t)enc_exact(v.re, 5, 10, 15);
      memcpy(dst, &h, 2);
      break;
    }
    case K_BF16: {
      uint16_t h = (uint16_t)enc_exact(v.re, 8, 7, 127);
      memcpy(dst, &h, 2);
      break;
    }
    case K_E4M3: *(uint8_t *)dst = (uint8_t)enc_exact(v.re, 4, 3, 7); break;
    case K_C64: {
      float f[2] = {(float)v.re, (float)v.im};
      memcpy(dst, f, 8);
      break;
    }
    default: memcpy(dst, &v.u, d->esz); break; /* little-endian low bytes */
  }
}

/* Ranges that keep every partial and final result exact in the dtype. */
static int sum_mag(const dtinfo *d) { return d->kind == K_E4M3 ? 1 : (d->kind == K_F16 || d->kind == K_BF16) ? 3 : 1000; }
static int minmax_mag(const dtinfo *d) {
  return d->kind == K_E4M3 ? 16 : (d->kind == K_F16 || d->kind == K_BF16) ? 100 : 1000000;
}

static int64_t sx(uint64_t u, size_t bytes) {
  int sh = 64 - 8 * (int)bytes;
  return (int64_t)(u << sh) >> sh;
}
static uint64_t width_mask(size_t bytes) { return bytes == 8 ? ~0ull : (1ull << (8 * bytes)) - 1; }

/* A float-like input: small integers, and for AVG a base plus a term that
   sums to zero over the ranks, so the mean is exact. */
static double gen_real(const dtinfo *d, int op, int n, int r, size_t i, uint64_t salt) {
  uint64_t h = mix(salt, (uint64_t)r, i);
  switch (op) {
    case BRAID_SUM: return (double)(int64_t)(h % (uint64_t)(2 * sum_mag(d) + 1)) - sum_mag(d);
    case BRAID_PROD: {
      double v = (h & 1) ? 1 : -1;
      if ((size_t)r == i % (size_t)n && (h & 2)) v *= 2;
      if (r == 0 && i % 7 == 3) v = 0;
      return v;
    }
    case BRAID_AVG: {
      int B = sum_mag(d);
      double base = (double)(int64_t)(mix(salt, 999, i) % (uint64_t)(2 * B + 1)) - B;
      return base + (double)(((size_t)r + i) % (size_t)n % 3) - (double)(((size_t)r + i + 1) % (size_t)n % 3);
    }
    default: return (double)(int64_t)(h % (uint64_t)(2 * minmax_mag(d) + 1)) - minmax_mag(d);
  }
}

static val gen(const dtinfo *d, int op, int n, int r, size_t i, uint64_t salt) {
  val v = {0, 0, 0};
  uint64_t h = mix(salt + 7, (uint64_t)r, i);
  switch (d->kind) {
    case K_INT: v.u = h & width_mask(d->esz); break;
    case K_BOOL: {
      static const uint8_t any[] = {0, 0, 1, 2, 0x80, 0xff}, nz[] = {1, 2, 0x80, 0xff};
      v.u = i % 4 == 0 ? nz[h % 4] : any[h % 6];
      break;
    }
    case K_C64:
      if (op == BRAID_PROD) {
        static const double ure[] = {1, 0, -1, 0}, uim[] = {0, 1, 0, -1};
        double s = ((size_t)r == i % (size_t)n && (h & 4)) ? 2 : 1;
        v.re = ure[h % 4] * s, v.im = uim[h % 4] * s;
      } else {
        v.re = gen_real(d, op, n, r, i, salt);
        v.im = gen_real(d, op, n, r, i, salt ^ 0x55);
      }
      break;
    default: v.re = gen_real(d, op, n, r, i, salt); break;
  }
  return v;
}

static val combine(const dtinfo *d, int op, val a, val b) {
  val v = a;
  if (d->kind == K_INT) {
    uint64_t m = width_mask(d->esz);
    int64_t x = sx(a.u, d->esz), y = sx(b.u, d->esz);
    switch (op) {
      case BRAID_SUM: case BRAID_AVG: v.u = (a.u + b.u) & m; break;
      case BRAID_PROD: v.u = (a.u * b.u) & m; break;
      case BRAID_MIN: v.u = d->sgn ? (x < y ? a.u : b.u) : (a.u < b.u ? a.u : b.u); break;
      case BRAID_MAX: v.u = d->sgn ? (x > y ? a.u : b.u) : (a.u > b.u ? a.u : b.u); break;
      case BRAID_BAND: v.u = a.u & b.u; break;
      case BRAID_BOR: v.u = a.u | b.u; break;
      default: v.u = a.u ^ b.u; break;
    }
  } else if (d->kind == K_BOOL) {
    uint64_t x = a.u != 0, y = b.u != 0;
    if (op == BRAID_SUM || op == BRAID_MAX || op == BRAID_BOR) v.u = x | y;
    else if (op == BRAID_BXOR) v.u = x ^ y;
    else v.u = x & y;
  } else if (op == BRAID_PROD && d->kind == K_C64) {
    v.re = a.re * b.re - a.im * b.im;
    v.im = a.re * b.im + a.im * b.re;
  } else {
    switch (op) {
      case BRAID_SUM: case BRAID_AVG: v.re = a.re + b.re, v.im = a.im + b.im; break;
      case BRAID_PROD: v.re = a.re * b.re; break;
      case BRAID_MIN: v.re = a.re < b.re ? a.re : b.re; break;
      default: v.re = a.re > b.re ? a.re : b.re; break;
    }
  }
  return v;
}

/* The reduction over ranks 0..n-1 of element i, in the dtype's bytes. */
static void expect_elem(const dtinfo *d, int op, int n, size_t i, uint64_t salt, void *dst) {
  val acc = gen(d, op, n, 0, i, salt);
  if (d->kind == K_BOOL) acc.u = acc.u != 0;
  for (int r = 1; r < n; r++) acc = combine(d, op, acc, gen(d, op, n, r, i, salt));
  if (op == BRAID_AVG) {
    if (d->kind == K_INT) {
      uint64_t m = width_mask(d->esz);
      acc.u = d->sgn ? (uint64_t)(sx(acc.u, d->esz) / n) & m : (acc.u & m) / (uint64_t)n;
    } else {
      acc.re /= n, acc.im /= n;
    }
  }
  encode(d, acc, dst);
}

/* Complex products are exact here but the sign of a zero component depends
   on the order of the factors ((x + 0i)(y + 0i) has x*0 + 0*y), so for them
   +0 and -0 compare equal. */
static int same_elem(const dtinfo *d, int op, const unsigned char *a, const unsigned char *b) {
  if (!memcmp(a, b, d->esz)) return 1;
  if (d->kind != K_C64 || op != BRAID_PROD) return 0;
  float x[2], y[2];
  memcpy(x, a, 8);
  memcpy(y, b, 8);
  return x[0] == y[0] && x[1] == y[1];
}

static int check_bytes(const char *what, int rank, const dtinfo *d, int op, const unsigned char *got,
                       const unsigned char *want, size_t count) {
  if (!memcmp(got, want, count * d->esz)) return 1;
  for (size_t i = 0; i < count; i++)
    if (!same_elem(d, op, got + i * d->esz, want + i * d->esz)) {
      char g[40] = "", w[40] = "";
      for (size_t b = d->esz; b-- > 0;) {
        snprintf(g + strlen(g), sizeof g - strlen(g), "%02x", got[i * d->esz + b]);
        snprintf(w + strlen(w), sizeof w - strlen(w), "%02x", want[i * d->esz + b]);
      }
      fprintf(stderr, "  %s: rank %d element %zu of %zu is 0x%s, expected 0x%s\n", what, rank, i, count, g, w);
      return 0;
    }
  return 1;
}

/* ======================================================================== */
/* One collective on every rank                                              */

typedef struct coll_job {
  int kind, algo;
  braid_dtype dt;
  braid_op op;
  size_t count;
  int root;
  void *buf[MAXR];
  const void *send[MAXR];
  void *recv[MAXR];
} coll_job;

/* The counts and displacements (elements) of every rank for the next
   all-to-allv job. */
static struct {
  size_t sc[MAXR][MAXR], sd[MAXR][MAXR], rc[MAXR][MAXR], rd[MAXR][MAXR];
} V;

static const char *const CALL[] = {"braid_send/recv", "braid_all_reduce", "braid_broadcast", "braid_all_gather",
                                   "braid_reduce_scatter", "braid_barrier", "braid_split", "braid_reduce",
                                   "braid_gather", "braid_scatter", "braid_all_to_all", "braid_all_to_allv"};

static void coll_rank(int r, void *arg) {
  coll_job *j = arg;
  sim_rank *R = &S.rk[r];
  braid_comm *c = R->c;
  int32_t darg = 0;
  switch (j->kind) {
    case BRAID__COLL_BROADCAST: case BRAID__COLL_GATHER: case BRAID__COLL_SCATTER: darg = j->root; break;
    case BRAID__COLL_ALL_REDUCE: case BRAID__COLL_REDUCE_SCATTER: darg = braid__desc_op_arg(j->op, 0, 0); break;
    case BRAID__COLL_REDUCE: darg = braid__desc_reduce_arg(j->root, j->op, 0, 0); break;
    default: break;
  }
  c->seq++;
  c->desc = braid__desc_make((braid__coll_kind)j->kind, j->kind == BRAID__COLL_ALL_TO_ALLV ? 0 : j->count, j->dt,
                             darg);
  c->call = CALL[j->kind];
  memset(R->sused, 0, sizeof R->sused);
  braid_status st;
  switch (j->kind) {
    case BRAID__COLL_ALL_REDUCE: st = braid__algo_all_reduce(c, j->algo, j->buf[r], j->count, j->dt, j->op); break;
    case BRAID__COLL_BROADCAST: st = braid__algo_broadcast(c, j->algo, j->buf[r], j->count, j->dt, j->root); break;
    case BRAID__COLL_ALL_GATHER: st = braid__algo_all_gather(c, j->algo, j->send[r], j->recv[r], j->count, j->dt); break;
    case BRAID__COLL_REDUCE_SCATTER:
      st = braid__algo_reduce_scatter(c, j->algo, j->send[r], j->recv[r], j->count, j->dt, j->op);
      break;
    case BRAID__COLL_REDUCE:
      st = braid__algo_reduce(c, j->algo, j->send[r], j->recv[r], j->count, j->dt, j->op, j->root);
      break;
    case BRAID__COLL_GATHER: st = braid__algo_gather(c, j->algo, j->send[r], j->recv[r], j->count, j->dt, j->root); break;
    case BRAID__COLL_SCATTER:
      st = braid__algo_scatter(c, j->algo, j->send[r], j->recv[r], j->count, j->dt, j->root);
      break;
    case BRAID__COLL_ALL_TO_ALL: st = braid__algo_all_to_all(c, j->algo, j->send[r], j->recv[r], j->count, j->dt); break;
    case BRAID__COLL_ALL_TO_ALLV:
      st = braid__algo_all_to_allv(c, j->algo, j->send[r], V.sc[r], V.sd[r], j->recv[r], V.rc[r], V.rd[r], j->dt);
      break;
    default: st = braid__algo_barrier(c, j->algo); break;
  }
  R->st = st;
  pthread_mutex_lock(&S.mu);
  if (R->nlive) problem("rank %d: %d requests still allocated after %s returned %s", r, R->nlive, c->call,
                        st_name(st));
  pthread_mutex_unlock(&S.mu);
  for (int s = 0; s < BRAID__NSCRATCH; s++) {
    if (!R->sused[s] || !R->scr[s]) continue;
    const unsigned char *e = (const unsigned char *)R->scr[s] + R->sasked[s];
    for (int b = 0; b < 64; b++)
      if (e[b] != 0x5C) {
        problem("rank %d wrote past the %zu bytes of scratch slot %d", r, R->sasked[s], s);
        break;
      }
  }
}

static const char *algo_label(int algo) { return braid__algo_name(algo) ? braid__algo_name(algo) : "?"; }

/* Runs j on the open world; 1 if every rank returned OK and the double saw
   nothing wrong. */
static int run_ok(coll_job *j, const char *what) {
  int before = nproblems;
  world_run(coll_rank, j);
  int ok = nproblems == before;
  for (int r = 0; r < S.n; r++)
    if (S.rk[r].st != BRAID_OK) {
      fprintf(stderr, "  %s: rank %d returned %s: %s\n", what, r, st_name(S.rk[r].st),
              S.rk[r].c->last_error);
      ok = 0;
    }
  if (!ok) fprintf(stderr, "  in %s\n", what);
  return ok;
}

/* ------------------------------------------------------------------------ */

static int run_allreduce(int algo, const dtinfo *d, int op, size_t count, uint64_t salt) {
  const int n = S.n;
  char what[160];
  snprintf(what, sizeof what, "all-reduce %s n=%d %zu x %s %s (%s)", algo_label(algo), n, count, d->name, OPN[op],
           S.eager ? "eager" : "rendezvous");
  coll_job j = {BRAID__COLL_ALL_REDUCE, algo, d->dt, (braid_op)op, count, 0, {0}, {0}, {0}};
  unsigned char *want = malloc(count * d->esz);
  if (!want) abort();
  for (size_t i = 0; i < count; i++) expect_elem(d, op, n, i, salt, want + i * d->esz);
  for (int r = 0; r < n; r++) {
    j.buf[r] = galloc(count * d->esz);
    for (size_t i = 0; i < count; i++) encode(d, gen(d, op, n, r, i, salt), (char *)j.buf[r] + i * d->esz);
  }
  int ok = run_ok(&j, what);
  for (int r = 0; r < n && ok; r++) {
    ok = check_bytes(what, r, d, op, j.buf[r], want, count);
    if (ok && !gintact(j.buf[r])) ok = 0, fprintf(stderr, "  %s: rank %d wrote outside buf\n", what, r);
  }
  for (int r = 0; r < n; r++) gfree(j.buf[r]);
  free(want);
  return ok;
}

static int run_broadcast(int algo, size_t count, const dtinfo *d, int root, uint64_t salt) {
  const int n = S.n;
  const size_t bytes = count * d->esz;
  char what[160];
  snprintf(what, sizeof what, "broadcast %s n=%d root %d %zu x %s", algo_label(algo), n, root, count, d->name);
  coll_job j = {BRAID__COLL_BROADCAST, algo, d->dt, BRAID_SUM, count, root, {0}, {0}, {0}};
  unsigned char *data = malloc(bytes);
  if (!data) abort();
  for (size_t i = 0; i < bytes; i++) data[i] = (unsigned char)mix(salt, (uint64_t)root, i);
  for (int r = 0; r < n; r++) {
    if (r == root) {
      j.buf[r] = (void *)ro_alloc(data, bytes); /* the root's buffer is only read */
    } else {
      j.buf[r] = galloc(bytes);
      memset(j.buf[r], 0x3C, bytes);
    }
  }
  int ok = run_ok(&j, what);
  for (int r = 0; r < n && ok; r++) {
    ok = !memcmp(j.buf[r], data, bytes);
    if (!ok) fprintf(stderr, "  %s: rank %d got other data\n", what, r);
    if (ok && r != root && !gintact(j.buf[r])) ok = 0, fprintf(stderr, "  %s: rank %d wrote outside buf\n", what, r);
  }
  for (int r = 0; r < n; r++) {
    if (r == root)
      ro_free(j.buf[r], bytes);
    else
      gfree(j.buf[r]);
  }
  free(data);
  return ok;
}

static int run_allgather(int algo, size_t count, const dtinfo *d, int inplace, uint64_t salt) {
  const int n = S.n;
  const size_t bytes = count * d->esz, total = bytes * (size_t)n;
  char what[160];
  snprintf(what, sizeof what, "all-gather %s n=%d %zu x %s %s", algo_label(algo), n, count, d->name,
           inplace ? "in place" : "out of place");
  coll_job j = {BRAID__COLL_ALL_GATHER, algo, d->dt, BRAID_SUM, count, 0, {0}, {0}, {0}};
  unsigned char *all = malloc(total);
  if (!all) abort();
  for (size_t i = 0; i < total; i++) all[i] = (unsigned char)mix(salt, 5, i);
  for (int r = 0; r < n; r++) {
    j.recv[r] = galloc(total);
    memset(j.recv[r], 0x3C, total);
    if (inplace) {
      memcpy((char *)j.recv[r] + (size_t)r * bytes, all + (size_t)r * bytes, bytes);
      j.send[r] = (char *)j.recv[r] + (size_t)r * bytes;
    } else {
      j.send[r] = ro_alloc(all + (size_t)r * bytes, bytes);
    }
  }
  int ok = run_ok(&j, what);
  for (int r = 0; r < n && ok; r++) {
    ok = !memcmp(j.recv[r], all, total);
    if (!ok) {
      size_t b = 0;
      while (!memcmp((char *)j.recv[r] + b * bytes, all + b * bytes, bytes)) b++;
      fprintf(stderr, "  %s: rank %d has a wrong block %zu\n", what, r, b);
    }
    if (ok && !gintact(j.recv[r])) ok = 0, fprintf(stderr, "  %s: rank %d wrote outside recv\n", what, r);
  }
  for (int r = 0; r < n; r++) {
    if (!inplace) ro_free(j.send[r], bytes);
    gfree(j.recv[r]);
  }
  free(all);
  return ok;
}

static int run_reduce_scatter(int algo, const dtinfo *d, int op, size_t count, int inplace, uint64_t salt) {
  const int n = S.n;
  const size_t bytes = count * d->esz, total = bytes * (size_t)n;
  char what[160];
  snprintf(what, sizeof what, "reduce-scatter %s n=%d %zu x %s %s %s (%s)", algo_label(algo), n, count, d->name,
           OPN[op], inplace ? "in place" : "out of place", S.eager ? "eager" : "rendezvous");
  coll_job j = {BRAID__COLL_REDUCE_SCATTER, algo, d->dt, (braid_op)op, count, 0, {0}, {0}, {0}};
  unsigned char *in = malloc(total), *want = malloc(total);
  if (!in || !want) abort();
  /* element i of the n*count vector: the closed form of index i */
  for (size_t i = 0; i < count * (size_t)n; i++) expect_elem(d, op, n, i, salt, want + i * d->esz);
  for (int r = 0; r < n; r++) {
    for (size_t i = 0; i < count * (size_t)n; i++) encode(d, gen(d, op, n, r, i, salt), in + i * d->esz);
    if (inplace) {
      void *b = galloc(total);
      memcpy(b, in, total);
      j.buf[r] = b;
      j.send[r] = b;
      j.recv[r] = (char *)b + (size_t)r * bytes;
    } else {
      j.send[r] = ro_alloc(in, total);
      j.recv[r] = galloc(bytes);
      memset(j.recv[r], 0x3C, bytes);
    }
  }
  int ok = run_ok(&j, what);
  for (int r = 0; r < n && ok; r++) {
    ok = check_bytes(what, r, d, op, j.recv[r], want + (size_t)r * bytes, count);
    if (ok && inplace) { /* only block r changes */
      for (size_t i = 0; i < count * (size_t)n; i++) encode(d, gen(d, op, n, r, i, salt), in + i * d->esz);
      ok = !memcmp(j.buf[r], in, (size_t)r * bytes) &&
           !memcmp((char *)j.buf[r] + (size_t)(r + 1) * bytes, in + (size_t)(r + 1) * bytes,
                   total - (size_t)(r + 1) * bytes);
      if (!ok) fprintf(stderr, "  %s: rank %d changed send outside its block\n", what, r);
    }
    if (ok && !gintact(inplace ? j.buf[r] : j.recv[r]))
      ok = 0, fprintf(stderr, "  %s: rank %d wrote outside its buffer\n", what, r);
  }
  for (int r = 0; r < n; r++) {
    if (inplace) {
      gfree(j.buf[r]);
    } else {
      ro_free(j.send[r], total);
      gfree(j.recv[r]);
    }
  }
  free(in);
  free(want);
  return ok;
}

static int run_reduce(int algo, const dtinfo *d, int op, size_t count, int root, int inplace, uint64_t salt) {
  const int n = S.n;
  const size_t bytes = count * d->esz;
  char what[160];
  snprintf(what, sizeof what, "reduce %s n=%d root %d %zu x %s %s %s (%s)", algo_label(algo), n, root, count, d->name,
           OPN[op], inplace ? "in place" : "out of place", S.eager ? "eager" : "rendezvous");
  coll_job *j = calloc(1, sizeof *j);
  unsigned char *in = malloc(bytes), *want = malloc(bytes);
  if (!j || !in || !want) abort();
  *j = (coll_job){BRAID__COLL_REDUCE, algo, d->dt, (braid_op)op, count, root, {0}, {0}, {0}};
  for (size_t i = 0; i < count; i++) expect_elem(d, op, n, i, salt, want + i * d->esz);
  for (int r = 0; r < n; r++) {
    for (size_t i = 0; i < count; i++) encode(d, gen(d, op, n, r, i, salt), in + i * d->esz);
    if (r == root && inplace) {
      j->buf[r] = galloc(bytes);
      memcpy(j->buf[r], in, bytes);
      j->send[r] = j->recv[r] = j->buf[r];
    } else {
      j->send[r] = ro_alloc(in, bytes); /* only read */
      if (r == root) {
        j->recv[r] = galloc(bytes);
        memset(j->recv[r], 0x3C, bytes);
      } /* elsewhere recv is NULL: it must not be touched */
    }
  }
  int ok = run_ok(j, what);
  if (ok) ok = check_bytes(what, root, d, op, j->recv[root], want, count);
  if (ok && !gintact(j->recv[root])) ok = 0, fprintf(stderr, "  %s: the root wrote outside recv\n", what);
  for (int r = 0; r < n; r++) {
    if (r == root && inplace) {
      gfree(j->buf[r]);
    } else {
      ro_free(j->send[r], bytes);
      if (r == root) gfree(j->recv[r]);
    }
  }
  free(in);
  free(want);
  free(j);
  return ok;
}

/* Gather (scatter: the other way round): block r of the root's buffer is
   rank r's; the rank that does not need a buffer passes NULL. */
static int run_rooted_move(int kind, int algo, size_t count, const dtinfo *d, int root, int inplace, uint64_t salt) {
  const int n = S.n, gather = kind == BRAID__COLL_GATHER;
  const size_t bytes = count * d->esz, total = bytes * (size_t)n;
  char what[160];
  snprintf(what, sizeof what, "%s %s n=%d root %d %zu x %s %s", gather ? "gather" : "scatter", algo_label(algo), n,
           root, count, d->name, inplace ? "in place" : "out of place");
  coll_job *j = calloc(1, sizeof *j);
  unsigned char *all = malloc(total + 1);
  if (!j || !all) abort();
  *j = (coll_job){kind, algo, d->dt, BRAID_SUM, count, root, {0}, {0}, {0}};
  for (size_t i = 0; i < total; i++) all[i] = (unsigned char)mix(salt, 5, i);
  for (int r = 0; r < n; r++) {
    const unsigned char *mine = all + (size_t)r * bytes;
    if (r == root) {
      j->buf[r] = galloc(total);
      if (gather) {
        memset(j->buf[r], 0x3C, total);
        j->recv[r] = j->buf[r];
        if (inplace) memcpy((char *)j->buf[r] + (size_t)r * bytes, mine, bytes);
        j->send[r] = inplace ? (const void *)((char *)j->buf[r] + (size_t)r * bytes) : ro_alloc(mine, bytes);
      } else {
        memcpy(j->buf[r], all, total);
        j->send[r] = j->buf[r];
        j->recv[r] = inplace ? (char *)j->buf[r] + (size_t)r * bytes : galloc(bytes);
        if (!inplace) memset(j->recv[r], 0x3C, bytes);
      }
    } else if (gather) {
      j->send[r] = ro_alloc(mine, bytes);
    } else {
      j->recv[r] = galloc(bytes);
      memset(j->recv[r], 0x3C, bytes);
    }
  }
  int ok = run_ok(j, what);
  for (int r = 0; r < n && ok; r++) {
    if (gather && r != root) continue;
    const void *got = gather ? j->recv[r] : j->recv[r];
    const void *exp = gather ? all : all + (size_t)r * bytes;
    ok = !memcmp(got, exp, gather ? total : bytes);
    if (!ok) fprintf(stderr, "  %s: rank %d got other data\n", what, r);
    if (ok && r == root && !gintact(j->buf[r])) ok = 0, fprintf(stderr, "  %s: the root wrote outside its buffer\n", what);
    if (ok && r == root && !gather && memcmp(j->buf[r], all, total))
      ok = 0, fprintf(stderr, "  %s: the root's send changed\n", what);
    if (ok && !gather && !(r == root && inplace) && !gintact(j->recv[r]))
      ok = 0, fprintf(stderr, "  %s: rank %d wrote outside recv\n", what, r);
  }
  for (int r = 0; r < n; r++) {
    if (r == root) {
      if (gather && !inplace) ro_free(j->send[r], bytes);
      if (!gather && !inplace) gfree(j->recv[r]);
      gfree(j->buf[r]);
    } else if (gather) {
      ro_free(j->send[r], bytes);
    } else {
      gfree(j->recv[r]);
    }
  }
  free(all);
  free(j);
  return ok;
}

/* Byte k of the block rank i sends to rank j. */
static unsigned char a2a_byte(uint64_t salt, int i, int j, size_t k) { return (unsigned char)mix(salt, (uint64_t)(i * MAXR + j), k); }

static int run_alltoall(int algo, size_t count, const dtinfo *d, int inplace, uint64_t salt) {
  const int n = S.n;
  const size_t bytes = count * d->esz, total = bytes * (size_t)n;
  char what[160];
  snprintf(what, sizeof what, "all-to-all %s n=%d %zu x %s %s (%s)", algo_label(algo), n, count, d->name,
           inplace ? "in place" : "out of place", S.eager ? "eager" : "rendezvous");
  coll_job *j = calloc(1, sizeof *j);
  unsigned char *tmp = malloc(total + 1);
  if (!j || !tmp) abort();
  *j = (coll_job){BRAID__COLL_ALL_TO_ALL, algo, d->dt, BRAID_SUM, count, 0, {0}, {0}, {0}};
  for (int r = 0; r < n; r++) {
    for (int q = 0; q < n; q++)
      for (size_t k = 0; k < bytes; k++) tmp[(size_t)q * bytes + k] = a2a_byte(salt, r, q, k);
    j->recv[r] = galloc(total);
    if (inplace) {
      memcpy(j->recv[r], tmp, total);
      j->send[r] = j->recv[r];
    } else {
      memset(j->recv[r], 0x3C, total);
      j->send[r] = ro_alloc(tmp, total);
    }
  }
  int ok = run_ok(j, what);
  for (int r = 0; r < n && ok; r++) {
    for (int q = 0; q < n && ok; q++)
      for (size_t k = 0; k < bytes && ok; k++)
        if (((unsigned char *)j->recv[r])[(size_t)q * bytes + k] != a2a_byte(salt, q, r, k))
          ok = 0, fprintf(stderr, "  %s: rank %d has a wrong block from %d\n", what, r, q);
    if (ok && !gintact(j->recv[r])) ok = 0, fprintf(stderr, "  %s: rank %d wrote outside recv\n", what, r);
  }
  for (int r = 0; r < n; r++) {
    if (!inplace) ro_free(j->send[r], total);
    gfree(j->recv[r]);
  }
  free(tmp);
  free(j);
  return ok;
}

/* All-to-allv with counts M[i][j] (rank i to rank j) of pattern pat:
   0 mixed small counts with zeros, 1 everything to rank 0, 2 only the
   diagonal, 3 larger uneven counts; symmetric in place. Blocks sit with a
   gap of one element, the send side in reverse rank order on odd patterns. */
static size_t a2av_count(int pat, int i, int j, int n, int inplace, uint64_t salt) {
  if (inplace && i > j) return a2av_count(pat, j, i, n, inplace, salt);
  uint64_t h = mix(salt, (uint64_t)i, (uint64_t)j);
  switch (pat) {
    case 0: return h % 4 == 0 ? 0 : h % 6;
    case 1: return inplace ? (i == 0 || j == 0 ? (size_t)(3 + i + j) : 0) : j == 0 ? (size_t)(3 + 2 * i) : 0;
    case 2: return i == j ? (size_t)(1 + i) : 0;
    default: return (size_t)(h % 700) + (size_t)(i == j) + (size_t)n;
  }
}

static int run_alltoallv(int pat, const dtinfo *d, int inplace, uint64_t salt) {
  const int n = S.n;
  const size_t esz = d->esz;
  char what[160];
  snprintf(what, sizeof what, "all-to-allv pairwise n=%d pattern %d %s %s (%s)", n, pat, d->name,
           inplace ? "in place" : "out of place", S.eager ? "eager" : "rendezvous");
  coll_job *j = calloc(1, sizeof *j);
  if (!j) abort();
  *j = (coll_job){BRAID__COLL_ALL_TO_ALLV, BRAID__ALGO_PAIRWISE, d->dt, BRAID_SUM, 0, 0, {0}, {0}, {0}};
  size_t slen[MAXR];
  for (int r = 0; r < n; r++) {
    size_t so = 1, ro = 1; /* a gap before every block */
    for (int q = 0; q < n; q++) {
      int qs = pat % 2 ? n - 1 - q : q;
      V.sc[r][qs] = a2av_count(pat, r, qs, n, inplace, salt);
      V.sd[r][qs] = so;
      so += V.sc[r][qs] + 1;
      V.rc[r][q] = a2av_count(pat, q, r, n, inplace, salt);
      V.rd[r][q] = ro;
      ro += V.rc[r][q] + 1;
    }
    slen[r] = so;
    unsigned char *sb = malloc(so * esz);
    if (!sb) abort();
    memset(sb, 0x77, so * esz);
    for (int q = 0; q < n; q++)
      for (size_t k = 0; k < V.sc[r][q] * esz; k++) sb[V.sd[r][q] * esz + k] = a2a_byte(salt, r, q, k);
    j->recv[r] = galloc(ro * esz);
    if (inplace) { /* the data for q sits where q's data will land */
      memset(j->recv[r], 0x3C, ro * esz);
      for (int q = 0; q < n; q++)
        for (size_t k = 0; k < V.rc[r][q] * esz; k++)
          ((unsigned char *)j->recv[r])[V.rd[r][q] * esz + k] = a2a_byte(salt, r, q, k);
      j->send[r] = j->recv[r];
    } else {
      memset(j->recv[r], 0x3C, ro * esz);
      j->send[r] = ro_alloc(sb, so * esz);
    }
    free(sb);
  }
  int ok = run_ok(j, what);
  for (int r = 0; r < n && ok; r++) {
    const unsigned char *rb = j->recv[r];
    size_t pos = 0;
    for (int q = 0; q < n && ok; q++) {
      for (; pos < V.rd[r][q] * esz && ok; pos++)
        if (rb[pos] != 0x3C) ok = 0, fprintf(stderr, "  %s: rank %d wrote a gap\n", what, r);
      for (size_t k = 0; k < V.rc[r][q] * esz && ok; k++, pos++)
        if (rb[pos] != a2a_byte(salt, q, r, k)) ok = 0, fprintf(stderr, "  %s: rank %d has a wrong block from %d\n", what, r, q);
    }
    if (ok && !gintact(j->recv[r])) ok = 0, fprintf(stderr, "  %s: rank %d wrote outside recv\n", what, r);
  }
  for (int r = 0; r < n; r++) {
    if (!inplace) ro_free(j->send[r], slen[r] * esz);
    gfree(j->recv[r]);
  }
  free(j);
  return ok;
}

/* ======================================================================== */
/* Cases                                                                     */

static const int SIZES[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])
static const int AR_ALGOS[] = {BRAID__ALGO_RING, BRAID__ALGO_RHD, BRAID__ALGO_RD, BRAID__ALGO_AUTO};
static const int BC_ALGOS[] = {BRAID__ALGO_TREE, BRAID__ALGO_KNOMIAL, BRAID__ALGO_CHAIN, BRAID__ALGO_AUTO};
static const int AG_ALGOS[] = {BRAID__ALGO_RING, BRAID__ALGO_BRUCK, BRAID__ALGO_RD, BRAID__ALGO_AUTO};
static const int RS_ALGOS[] = {BRAID__ALGO_RING, BRAID__ALGO_RHD, BRAID__ALGO_AUTO};
static const int RD_ALGOS[] = {BRAID__ALGO_TREE, BRAID__ALGO_CHAIN, BRAID__ALGO_RING, BRAID__ALGO_AUTO};
static const int GS_ALGOS[] = {BRAID__ALGO_TREE, BRAID__ALGO_LINEAR, BRAID__ALGO_AUTO};
static const int A2A_ALGOS[] = {BRAID__ALGO_PAIRWISE, BRAID__ALGO_BRUCK, BRAID__ALGO_AUTO};
#define NA(a) (sizeof(a) / sizeof((a)[0]))

/* Large enough for several pipeline chunks per block at 2 and 3 ranks. */
#define BIG (SIM_SANITIZED ? (size_t)300007 : (size_t)1000003)

#define CHECK(cond, ...)                                    \
  do {                                                      \
    if (!(cond)) {                                          \
      fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);      \
      fprintf(stderr, __VA_ARGS__);                         \
      fprintf(stderr, "\n");                                \
      return 1;                                             \
    }                                                       \
  } while (0)

/* Counts: 1, 7, one below the world size (empty blocks), and a mid size
   that is a multiple of nothing here (per rank for the block collectives). */
#define MID 4099
#define MID_BLOCK 517
static int small_counts(int n, size_t mid, size_t *out) {
  int k = 0;
  out[k++] = 1;
  out[k++] = 7;
  if (n > 2 && (size_t)(n - 1) != 7) out[k++] = (size_t)n - 1;
  out[k++] = mid;
  return k;
}

/* Sanitized builds run every algorithm, world size and count, on fewer
   ops, and the mid count on a direct, a widened and an integer dtype. */
static int op_in_scope(int op) {
  return !SIM_SANITIZED || op == BRAID_SUM || op == BRAID_AVG || op == BRAID_MAX || op == BRAID_BXOR;
}
static int mid_in_scope(size_t count, const dtinfo *d) {
  return !SIM_SANITIZED || (count != MID && count != MID_BLOCK) || d->dt == BRAID_F32 || d->dt == BRAID_BF16 ||
         d->dt == BRAID_I32;
}

static int valid(const dtinfo *d, int op) { return braid__check_dtype_op(d->dt, (braid_op)op) == BRAID_OK; }

/* AUTO only dispatches to the table's choice: a direct and a widened
   dtype show that it reaches the right algorithm with the right data. */
static int auto_in_scope(int algo, const dtinfo *d, int op) {
  return algo != BRAID__ALGO_AUTO || (op == BRAID_SUM && d->dt == BRAID_F32) || (op == BRAID_AVG && d->dt == BRAID_BF16);
}

static int sim_allreduce(void) {
  for (size_t si = 0; si < NSIZES; si++) {
    int n = SIZES[si];
    size_t counts[4];
    int nc = small_counts(n, MID, counts);
    world_open(n, 0);
    for (size_t ai = 0; ai < NA(AR_ALGOS); ai++)
      for (int ci = 0; ci < nc; ci++)
        for (size_t di = 0; di < NDT; di++)
          for (int op = 0; op < 8; op++) {
            if (!valid(&DTS[di], op) || !op_in_scope(op) || !auto_in_scope(AR_ALGOS[ai], &DTS[di], op) ||
                !mid_in_scope(counts[ci], &DTS[di]))
              continue;
            if (counts[ci] == MID && op != BRAID_SUM && op != BRAID_AVG && op != BRAID_BXOR) continue;
            if (!run_allreduce(AR_ALGOS[ai], &DTS[di], op, counts[ci], (uint64_t)(ci * 131 + op))) {
              world_close();
              return 1;
            }
          }
    world_close();
  }
  return 0;
}

/* Sends complete at once: other interleavings of the same algorithms. */
static int sim_eager(void) {
  static const int ns[] = {2, 3, 5, 8, 9};
  for (size_t si = 0; si < NA(ns); si++) {
    world_open(ns[si], 1);
    for (size_t ai = 0; ai < 3; ai++)
      for (size_t ci = 0; ci < 3; ci++) {
        size_t count = ci == 0 ? 7 : ci == 1 ? 4099 : (size_t)ns[si] - 1;
        if (!run_allreduce(AR_ALGOS[ai], dtinfo_of(BRAID_F32), BRAID_SUM, count, 3) ||
            !run_allreduce(AR_ALGOS[ai], dtinfo_of(BRAID_BF16), BRAID_AVG, count, 4) ||
            !run_reduce_scatter(RS_ALGOS[ai % 2], dtinfo_of(BRAID_I32), BRAID_SUM, count, (int)ci & 1, 5) ||
            !run_allgather(AG_ALGOS[ai], count, dtinfo_of(BRAID_U8), (int)ci & 1, 6) ||
            !run_broadcast(BC_ALGOS[ai], count, dtinfo_of(BRAID_F64), ns[si] - 1, 7) ||
            !run_reduce(RD_ALGOS[ai], dtinfo_of(BRAID_BF16), BRAID_AVG, count, ns[si] / 2, (int)ci & 1, 8) ||
            !run_rooted_move(BRAID__COLL_GATHER, GS_ALGOS[ai % 2], count, dtinfo_of(BRAID_U8), 1, (int)ci & 1, 9) ||
            !run_rooted_move(BRAID__COLL_SCATTER, GS_ALGOS[ai % 2], count, dtinfo_of(BRAID_U8), 0, (int)ci & 1, 10) ||
            !run_alltoall(A2A_ALGOS[ai % 2], count, dtinfo_of(BRAID_F32), (int)ci & 1, 11) ||
            !run_alltoallv((int)ai, dtinfo_of(BRAID_U8), (int)ci & 1, 12)) {
          world_close();
          return 1;
        }
      }
    world_close();
  }
  return 0;
}

/* Multi-chunk pipelines (blocks of several ring chunks at 2 and 3 ranks),
   and a large vector on a non-power-of-two world for the folded paths. */
static int sim_big(void) {
  static const int ns[] = {2, 3, 7};
  for (size_t si = 0; si < NA(ns) - SIM_SANITIZED; si++) {
    int n = ns[si];
    size_t blk = BIG / (size_t)n + 1;
    world_open(n, 0);
    for (size_t ai = 0; ai < 3; ai++) {
      int lead = ai == 0; /* the ring: the pipelined one */
      if (!run_allreduce(AR_ALGOS[ai], dtinfo_of(BRAID_F32), BRAID_SUM, BIG, 11) ||
          (lead && !run_allreduce(AR_ALGOS[ai], dtinfo_of(BRAID_BF16), BRAID_SUM, BIG, 12)) ||
          (lead && n < 7 && !run_allreduce(AR_ALGOS[ai], dtinfo_of(BRAID_I32), BRAID_AVG, BIG, 13)) ||
          (ai < 2 && n < 7 && !run_reduce_scatter(RS_ALGOS[ai], dtinfo_of(BRAID_F32), BRAID_SUM, blk, 0, 14)) ||
          (lead && n == 2 && !run_reduce_scatter(RS_ALGOS[ai], dtinfo_of(BRAID_F16), BRAID_AVG, blk, 1, 15)) ||
          (n < 7 && !run_allgather(AG_ALGOS[ai], blk, dtinfo_of(BRAID_F32), (int)ai & 1, 16)) ||
          !run_broadcast(BC_ALGOS[ai], BIG, dtinfo_of(BRAID_F32), n / 2, 17) ||
          !run_reduce(RD_ALGOS[ai], dtinfo_of(BRAID_F32), BRAID_SUM, BIG, n - 1, (int)ai & 1, 18) ||
          (ai > 0 && n < 7 && !run_reduce(RD_ALGOS[ai], dtinfo_of(BRAID_BF16), BRAID_AVG, BIG, 0, 1, 19)) ||
          (ai < 2 && !run_rooted_move(BRAID__COLL_GATHER, GS_ALGOS[ai], blk, dtinfo_of(BRAID_F32), 1, 0, 20)) ||
          (ai < 2 && !run_rooted_move(BRAID__COLL_SCATTER, GS_ALGOS[ai], blk, dtinfo_of(BRAID_F32), 0, 1, 21)) ||
          (ai < 2 && n < 7 && !run_alltoall(A2A_ALGOS[ai], blk, dtinfo_of(BRAID_F32), (int)ai & 1, 22))) {
        world_close();
        return 1;
      }
    }
    world_close();
  }
  return 0;
}

static int sim_broadcast(void) {
  for (size_t si = 0; si < NSIZES; si++) {
    int n = SIZES[si];
    size_t counts[4];
    int nc = small_counts(n, MID, counts);
    world_open(n, 0);
    for (size_t ai = 0; ai < NA(BC_ALGOS); ai++)
      for (int ci = 0; ci < nc; ci++)
        for (int root = 0; root < n; root++)
          for (size_t di = 0; di < 3; di++) {
            static const braid_dtype dts[] = {BRAID_U8, BRAID_F32, BRAID_C64};
            if (BC_ALGOS[ai] == BRAID__ALGO_AUTO && di != 1) continue;
            if (!run_broadcast(BC_ALGOS[ai], counts[ci], dtinfo_of(dts[di]), root, (uint64_t)(root + ci))) {
              world_close();
              return 1;
            }
          }
    world_close();
  }
  return 0;
}

static int sim_allgather(void) {
  for (size_t si = 0; si < NSIZES; si++) {
    int n = SIZES[si];
    size_t counts[4];
    int nc = small_counts(n, MID_BLOCK, counts);
    world_open(n, 0);
    for (size_t ai = 0; ai < NA(AG_ALGOS); ai++)
      for (int ci = 0; ci < nc; ci++)
        for (int inplace = 0; inplace < 2; inplace++)
          for (size_t di = 0; di < 4; di++) {
            static const braid_dtype dts[] = {BRAID_U8, BRAID_BF16, BRAID_F32, BRAID_C64};
            if (AG_ALGOS[ai] == BRAID__ALGO_AUTO && di != 2) continue;
            if (!run_allgather(AG_ALGOS[ai], counts[ci], dtinfo_of(dts[di]), inplace, (uint64_t)ci)) {
              world_close();
              return 1;
            }
          }
    world_close();
  }
  return 0;
}

static int sim_reduce_scatter(void) {
  for (size_t si = 0; si < NSIZES; si++) {
    int n = SIZES[si];
    size_t counts[4];
    int nc = small_counts(n, MID_BLOCK, counts);
    world_open(n, 0);
    for (size_t ai = 0; ai < NA(RS_ALGOS); ai++)
      for (int ci = 0; ci < nc; ci++)
        for (int inplace = 0; inplace < 2; inplace++)
          for (size_t di = 0; di < NDT; di++)
            for (int op = 0; op < 8; op++) {
              if (!valid(&DTS[di], op) || !op_in_scope(op) || !auto_in_scope(RS_ALGOS[ai], &DTS[di], op) ||
                  !mid_in_scope(counts[ci], &DTS[di]))
                continue;
              if (counts[ci] == MID_BLOCK && op != BRAID_SUM && op != BRAID_AVG && op != BRAID_MAX) continue;
              /* in place changes only where blocks live: direct and widened dtypes suffice */
              if (inplace && ((op != BRAID_SUM && op != BRAID_AVG) ||
                              (DTS[di].kind != K_F32 && DTS[di].kind != K_BF16 && DTS[di].dt != BRAID_I32)))
                continue;
              if (!run_reduce_scatter(RS_ALGOS[ai], &DTS[di], op, counts[ci], inplace,
                                      (uint64_t)(ci * 17 + op + inplace))) {
                world_close();
                return 1;
              }
            }
    world_close();
  }
  return 0;
}

/* Every root, in place and out of place; the full dtype x op matrix at the
   small counts, a direct, a widened and an integer dtype at the mid count. */
static int sim_reduce(void) {
  for (size_t si = 0; si < NSIZES; si++) {
    int n = SIZES[si];
    size_t counts[4];
    int nc = small_counts(n, MID, counts);
    world_open(n, 0);
    for (size_t ai = 0; ai < NA(RD_ALGOS); ai++)
      for (int ci = 0; ci < nc; ci++)
        for (size_t di = 0; di < NDT; di++)
          for (int op = 0; op < 8; op++) {
            if (!valid(&DTS[di], op) || !op_in_scope(op) || !auto_in_scope(RD_ALGOS[ai], &DTS[di], op) ||
                !mid_in_scope(counts[ci], &DTS[di]))
              continue;
            if (counts[ci] == MID && ((op != BRAID_SUM && op != BRAID_AVG && op != BRAID_MAX) ||
                                      (DTS[di].dt != BRAID_F32 && DTS[di].dt != BRAID_BF16 && DTS[di].dt != BRAID_I32)))
              continue;
            for (int root = 0; root < n; root++) {
              /* every root for a direct and a widened pair, one (rotating) for the rest */
              int full = (DTS[di].dt == BRAID_F32 && op == BRAID_SUM) || (DTS[di].dt == BRAID_BF16 && op == BRAID_AVG);
              if (!full && root != (ci * 3 + op + (int)di) % n) continue;
              int inplace = (int)((root + ci + (int)di) % 2);
              if (!run_reduce(RD_ALGOS[ai], &DTS[di], op, counts[ci], root, inplace,
                              (uint64_t)(ci * 37 + op + root))) {
                world_close();
                return 1;
              }
            }
          }
    world_close();
  }
  return 0;
}

static int sim_gather_scatter(void) {
  static const braid_dtype dts[] = {BRAID_U8, BRAID_F32, BRAID_C64};
  for (size_t si = 0; si < NSIZES; si++) {
    int n = SIZES[si];
    size_t counts[4];
    int nc = small_counts(n, MID_BLOCK, counts);
    world_open(n, 0);
    for (int kind = BRAID__COLL_GATHER; kind <= BRAID__COLL_SCATTER; kind++)
      for (size_t ai = 0; ai < NA(GS_ALGOS); ai++)
        for (int ci = 0; ci < nc; ci++)
          for (int root = 0; root < n; root++)
            for (int inplace = 0; inplace < 2; inplace++)
              for (size_t di = 0; di < NA(dts); di++) {
                if (GS_ALGOS[ai] == BRAID__ALGO_AUTO && di != 1) continue;
                if (!run_rooted_move(kind, GS_ALGOS[ai], counts[ci], dtinfo_of(dts[di]), root, inplace,
                                     (uint64_t)(root * 7 + ci))) {
                  world_close();
                  return 1;
                }
              }
    world_close();
  }
  return 0;
}

static int sim_alltoall(void) {
  static const braid_dtype dts[] = {BRAID_U8, BRAID_BF16, BRAID_F32, BRAID_C64};
  for (size_t si = 0; si < NSIZES; si++) {
    int n = SIZES[si];
    size_t counts[4];
    int nc = small_counts(n, MID_BLOCK, counts);
    world_open(n, 0);
    for (size_t ai = 0; ai < NA(A2A_ALGOS); ai++)
      for (int ci = 0; ci < nc; ci++)
        for (int inplace = 0; inplace < 2; inplace++)
          for (size_t di = 0; di < NA(dts); di++) {
            if (A2A_ALGOS[ai] == BRAID__ALGO_AUTO && di != 2) continue;
            if (!run_alltoall(A2A_ALGOS[ai], counts[ci], dtinfo_of(dts[di]), inplace, (uint64_t)(ci * 3 + di))) {
              world_close();
              return 1;
            }
          }
    for (int pat = 0; pat < 4; pat++)
      for (int inplace = 0; inplace < 2; inplace++)
        for (int di = 0; di < 2; di++)
          if (!run_alltoallv(pat, dtinfo_of(di ? BRAID_F32 : BRAID_U8), inplace, (uint64_t)(pat * 5 + di))) {
            world_close();
            return 1;
          }
    world_close();
  }
  return 0;
}

/* Random bit patterns (NaNs with rank-dependent payloads, signed zeros,
   infinities): every rank must hold the same bits, whatever they are. */
static int sim_identity(void) {
  static const braid_dtype dts[] = {BRAID_F32, BRAID_F64, BRAID_F16, BRAID_BF16, BRAID_C64};
  static const int ops[] = {BRAID_SUM, BRAID_PROD, BRAID_MIN, BRAID_MAX, BRAID_AVG};
  const size_t count = 1000;
  for (size_t si = 1; si < NSIZES; si++) {
    int n = SIZES[si];
    world_open(n, 0);
    for (size_t ai = 0; ai < 3; ai++)
      for (size_t di = 0; di < NA(dts); di++)
        for (size_t oi = 0; oi < NA(ops); oi++) {
          const dtinfo *d = dtinfo_of(dts[di]);
          if (!valid(d, ops[oi])) continue;
          coll_job j = {BRAID__COLL_ALL_REDUCE, AR_ALGOS[ai], d->dt, (braid_op)ops[oi], count, 0, {0}, {0}, {0}};
          for (int r = 0; r < n; r++) {
            unsigned char *b = j.buf[r] = galloc(count * d->esz);
            for (size_t i = 0; i < count * d->esz; i++) {
              uint64_t h = mix(99, (uint64_t)r, i);
              b[i] = (unsigned char)h;
            }
            /* mostly specials: exponent bits all ones or all zeros */
            for (size_t i = 0; i < count; i++) {
              uint64_t h = mix(98, (uint64_t)r, i);
              unsigned char *e = b + i * d->esz;
              size_t top = d->esz == 8 && d->kind == K_C64 ? 3 : d->esz - 1;
              if (h % 3 == 0) e[top] |= 0x7f, e[top - (top > 0)] |= 0xf0; /* NaN/inf-ish */
              if (h % 3 == 1) memset(e, 0, d->esz), e[top] = (unsigned char)((h >> 8) & 0x80); /* +-0 */
            }
          }
          char what[160];
          snprintf(what, sizeof what, "identity %s n=%d %s %s", algo_label(AR_ALGOS[ai]), n, d->name, OPN[ops[oi]]);
          int ok = run_ok(&j, what);
          for (int r = 1; r < n && ok; r++) {
            ok = !memcmp(j.buf[r], j.buf[0], count * d->esz);
            if (!ok) check_bytes(what, r, d, -1, j.buf[r], j.buf[0], count);
          }
          for (int r = 0; r < n; r++) gfree(j.buf[r]);
          if (!ok) {
            world_close();
            return 1;
          }
        }
    world_close();
  }
  return 0;
}

/* f16 1 + 2^-11 + 2^-11 is 0x3c01 when rounded once (0x3c00 if the sum is
   rounded after each step with 1 first), wherever the 1 sits. */
static int sim_rounded_once(void) {
  const size_t count = 5;
  world_open(3, 0);
  for (int one = 0; one < 3; one++) {
    for (size_t ai = 0; ai < NA(AR_ALGOS); ai++) {
      coll_job j = {BRAID__COLL_ALL_REDUCE, AR_ALGOS[ai], BRAID_F16, BRAID_SUM, count, 0, {0}, {0}, {0}};
      for (int r = 0; r < 3; r++) {
        uint16_t *b = j.buf[r] = galloc(count * 2);
        for (size_t i = 0; i < count; i++) b[i] = r == one ? 0x3c00 : 0x1000;
      }
      int ok = run_ok(&j, "f16 rounded once (all-reduce)");
      for (int r = 0; r < 3 && ok; r++)
        for (size_t i = 0; i < count && ok; i++) {
          uint16_t v = ((uint16_t *)j.buf[r])[i];
          if (v != 0x3c01) ok = 0, fprintf(stderr, "  all-reduce %s: rank %d got 0x%04x\n", algo_label(j.algo), r, v);
        }
      for (int r = 0; r < 3; r++) gfree(j.buf[r]);
      CHECK(ok, "all-reduce %s, 1.0 on rank %d", algo_label(AR_ALGOS[ai]), one);
    }
    for (size_t ai = 0; ai < NA(RS_ALGOS); ai++) {
      coll_job j = {BRAID__COLL_REDUCE_SCATTER, RS_ALGOS[ai], BRAID_F16, BRAID_SUM, count, 0, {0}, {0}, {0}};
      for (int r = 0; r < 3; r++) {
        uint16_t *b = j.buf[r] = galloc(3 * count * 2);
        for (size_t i = 0; i < 3 * count; i++) b[i] = r == one ? 0x3c00 : 0x1000;
        j.send[r] = b;
        j.recv[r] = galloc(count * 2);
      }
      int ok = run_ok(&j, "f16 rounded once (reduce-scatter)");
      for (int r = 0; r < 3 && ok; r++)
        for (size_t i = 0; i < count && ok; i++) {
          uint16_t v = ((uint16_t *)j.recv[r])[i];
          if (v != 0x3c01) ok = 0, fprintf(stderr, "  reduce-scatter %s: rank %d got 0x%04x\n", algo_label(j.algo), r, v);
        }
      for (int r = 0; r < 3; r++) gfree(j.buf[r]), gfree(j.recv[r]);
      CHECK(ok, "reduce-scatter %s, 1.0 on rank %d", algo_label(RS_ALGOS[ai]), one);
    }
  }
  world_close();
  return 0;
}

/* Nobody leaves before everybody arrived: late arrivals are staggered. */
static atomic_int arrived[MAXR];
static atomic_int early;

static void barrier_rank(int r, void *arg) {
  (void)arg;
  usleep((useconds_t)((S.n - r) * 300 + (r % 3) * 100));
  atomic_store(&arrived[r], 1);
  coll_job j = {BRAID__COLL_BARRIER, BRAID__ALGO_AUTO, BRAID_U8, BRAID_SUM, 0, 0, {0}, {0}, {0}};
  coll_rank(r, &j);
  for (int k = 0; k < S.n; k++)
    if (!atomic_load(&arrived[k])) atomic_store(&early, 1);
}

static int sim_barrier(void) {
  for (size_t si = 0; si < NSIZES; si++) {
    int n = SIZES[si];
    world_open(n, si & 1);
    for (int rep = 0; rep < 5; rep++) {
      for (int r = 0; r < n; r++) atomic_store(&arrived[r], 0);
      atomic_store(&early, 0);
      int before = nproblems;
      world_run(barrier_rank, NULL);
      for (int r = 0; r < n; r++) CHECK(S.rk[r].st == BRAID_OK, "barrier n=%d: rank %d returned %d", n, r, S.rk[r].st);
      CHECK(!atomic_load(&early), "barrier n=%d: a rank left before all arrived", n);
      CHECK(nproblems == before, "barrier n=%d: %s", n, first_problem);
    }
    /* explicit algorithm */
    coll_job j = {BRAID__COLL_BARRIER, BRAID__ALGO_DISSEM, BRAID_U8, BRAID_SUM, 0, 0, {0}, {0}, {0}};
    CHECK(run_ok(&j, "barrier dissem"), "barrier n=%d", n);
    world_close();
  }
  return 0;
}

/* The k-th wait (or scratch request) of one rank fails: every rank returns
   OK or that status (NO_MEMORY for the rank whose scratch failed), nothing
   hangs and no request is left allocated. */
static int failure_run(coll_job *j, int rank, unsigned k, int scratch, int *hit) {
  const int n = S.n;
  pthread_mutex_lock(&S.mu);
  S.inj_rank = rank;
  if (scratch)
    S.inj_scratch = k;
  else
    S.inj_wait = k;
  pthread_mutex_unlock(&S.mu);
  int before = nproblems;
  S.job = coll_rank;
  S.arg = j;
  pthread_barrier_wait(&S.go);
  pthread_barrier_wait(&S.done);
  *hit = S.injected;
  world_reset();
  CHECK(nproblems == before, "failure injection: %s", first_problem);
  for (int r = 0; r < n; r++) {
    braid_status st = S.rk[r].st, inj = scratch && r == rank ? BRAID_ERR_NO_MEMORY : INJECTED;
    if (!*hit) CHECK(st == BRAID_OK, "rank %d returned %s without a failure", r, st_name(st));
    else CHECK(st == BRAID_OK || st == inj, "rank %d returned %s, not %s", r, st_name(st),
               st_name(inj));
    if (*hit && scratch && r == rank) CHECK(st == inj, "the rank without scratch returned %s", st_name(st));
  }
  return 0;
}

static int sim_failures(void) {
  static const int ns[] = {2, 3, 5, 8};
  for (size_t si = 0; si < NA(ns); si++) {
    int n = ns[si];
    world_open(n, si & 1);
    for (int kind = BRAID__COLL_ALL_REDUCE; kind < BRAID__COLL_NKINDS; kind++)
      for (int algo = BRAID__ALGO_RING; algo < BRAID__ALGO_COUNT; algo++) {
        if (kind == BRAID__COLL_SPLIT || !braid__algo_supports(kind, algo)) continue;
        const dtinfo *d = dtinfo_of(kind == BRAID__COLL_ALL_REDUCE || kind == BRAID__COLL_REDUCE ? BRAID_BF16 : BRAID_F32);
        size_t count = kind == BRAID__COLL_BARRIER ? 0 : 3001;
        coll_job j = {kind, algo, d->dt, BRAID_SUM, count, n - 1, {0}, {0}, {0}};
        for (int r = 0; r < n; r++)
          for (int q = 0; q < n; q++) { /* all-to-allv: uneven, with an empty pair */
            V.sc[r][q] = V.rc[q][r] = (r + q) % 3 ? count / (size_t)(1 + (r + q) % 3) : 0;
            V.sd[r][q] = V.rd[r][q] = (size_t)q * count;
          }
        for (int r = 0; r < n; r++) {
          j.buf[r] = galloc(count * (size_t)n * d->esz + 1);
          memset(j.buf[r], 0, count * (size_t)n * d->esz);
          j.send[r] = j.buf[r];
          j.recv[r] = galloc(count * (size_t)n * d->esz + 1);
        }
        int rc = 0;
        for (int scratch = 0; scratch < 2 && !rc; scratch++)
          for (int rank = 0; rank < n && !rc; rank += n - 1 > 0 ? n - 1 : 1) {
            for (unsigned k = 1; !rc; k++) {
              int hit = 0;
              rc = failure_run(&j, rank, k, scratch, &hit);
              if (rc) fprintf(stderr, "  %s %s n=%d: %s %u of rank %d failed\n", braid__coll_short_name(kind),
                              algo_label(algo), n, scratch ? "scratch request" : "wait", k, rank);
              if (!hit) break;
            }
          }
        for (int r = 0; r < n; r++) gfree(j.buf[r]), gfree(j.recv[r]);
        if (rc) {
          world_close();
          return 1;
        }
      }
    world_close();
  }
  return 0;
}

/* An algorithm the collective does not have is refused before anything moves. */
static int sim_refuse(void) {
  world_open(2, 0);
  static const struct {
    int kind, algo;
  } bad[] = {{BRAID__COLL_ALL_REDUCE, BRAID__ALGO_TREE},  {BRAID__COLL_ALL_REDUCE, BRAID__ALGO_NATIVE},
             {BRAID__COLL_BROADCAST, BRAID__ALGO_RING},   {BRAID__COLL_ALL_GATHER, BRAID__ALGO_RHD},
             {BRAID__COLL_REDUCE_SCATTER, BRAID__ALGO_RD}, {BRAID__COLL_BARRIER, BRAID__ALGO_CHAIN},
             {BRAID__COLL_ALL_REDUCE, 99},                {BRAID__COLL_REDUCE, BRAID__ALGO_RHD},
             {BRAID__COLL_GATHER, BRAID__ALGO_RING},       {BRAID__COLL_SCATTER, BRAID__ALGO_CHAIN},
             {BRAID__COLL_ALL_TO_ALL, BRAID__ALGO_RING},   {BRAID__COLL_ALL_TO_ALLV, BRAID__ALGO_BRUCK},
             {BRAID__COLL_REDUCE, BRAID__ALGO_NATIVE}};
  for (size_t i = 0; i < NA(bad); i++) {
    float a[4] = {0}, b[8] = {0};
    size_t cnt[2] = {2, 2}, dsp[2] = {0, 2};
    coll_job j = {bad[i].kind, bad[i].algo, BRAID_F32, BRAID_SUM, 4, 0, {a, a}, {a, a}, {b, b}};
    uint64_t sent = S.messages;
    int before = nproblems;
    /* one rank is enough: nothing may be sent */
    braid_comm *c = S.rk[0].c;
    c->call = "braid_test";
    braid_status st;
    switch (j.kind) {
      case BRAID__COLL_ALL_REDUCE: st = braid__algo_all_reduce(c, j.algo, a, 4, BRAID_F32, BRAID_SUM); break;
      case BRAID__COLL_BROADCAST: st = braid__algo_broadcast(c, j.algo, a, 4, BRAID_F32, 0); break;
      case BRAID__COLL_ALL_GATHER: st = braid__algo_all_gather(c, j.algo, a, b, 4, BRAID_F32); break;
      case BRAID__COLL_REDUCE_SCATTER: st = braid__algo_reduce_scatter(c, j.algo, b, a, 4, BRAID_F32, BRAID_SUM); break;
      case BRAID__COLL_REDUCE: st = braid__algo_reduce(c, j.algo, a, b, 4, BRAID_F32, BRAID_SUM, 0); break;
      case BRAID__COLL_GATHER: st = braid__algo_gather(c, j.algo, a, b, 4, BRAID_F32, 0); break;
      case BRAID__COLL_SCATTER: st = braid__algo_scatter(c, j.algo, b, a, 4, BRAID_F32, 0); break;
      case BRAID__COLL_ALL_TO_ALL: st = braid__algo_all_to_all(c, j.algo, a, b, 2, BRAID_F32); break;
      case BRAID__COLL_ALL_TO_ALLV: st = braid__algo_all_to_allv(c, j.algo, a, cnt, dsp, b, cnt, dsp, BRAID_F32); break;
      default: st = braid__algo_barrier(c, j.algo); break;
    }
    CHECK(st == BRAID_ERR_INTERNAL && S.messages == sent && nproblems == before, "kind %d algo %d: %s", j.kind,
          j.algo, st_name(st));
    CHECK(strstr(c->last_error, braid__coll_short_name(j.kind)) != NULL, "message \"%s\"", c->last_error);
  }
  world_close();
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Selection table, BRAID_ALGO, braid-info lines                             */

static char lines[64][256];
static int nlines;
static void collect(const char *line, void *arg) {
  (void)arg;
  if (nlines < 64) snprintf(lines[nlines++], sizeof lines[0], "%s", line);
}

static int sim_select(void) {
  /* names and the support matrix */
  CHECK(braid__algo_name(BRAID__ALGO_COUNT) == NULL && braid__algo_name(-1) == NULL, "unknown codes have no name");
  for (int a = 0; a < BRAID__ALGO_COUNT; a++) CHECK(braid__algo_name(a) && *braid__algo_name(a), "algo %d name", a);
  static const char *const support[BRAID__COLL_NKINDS] = {
      [BRAID__COLL_ALL_REDUCE] = "ring rhd rd", [BRAID__COLL_BROADCAST] = "tree knomial chain",
      [BRAID__COLL_ALL_GATHER] = "ring rd bruck", [BRAID__COLL_REDUCE_SCATTER] = "ring rhd",
      [BRAID__COLL_BARRIER] = "dissem", [BRAID__COLL_REDUCE] = "tree chain ring",
      [BRAID__COLL_GATHER] = "tree linear", [BRAID__COLL_SCATTER] = "tree linear",
      [BRAID__COLL_ALL_TO_ALL] = "pairwise bruck", [BRAID__COLL_ALL_TO_ALLV] = "pairwise"};
  for (int k = -1; k <= BRAID__COLL_NKINDS; k++)
    for (int a = -1; a <= BRAID__ALGO_COUNT; a++) {
      int want = 0;
      if (k > BRAID__COLL_NONE && k < BRAID__COLL_NKINDS && a == BRAID__ALGO_NATIVE) want = 1;
      if (k > BRAID__COLL_NONE && k < BRAID__COLL_NKINDS && a > BRAID__ALGO_NATIVE && a < BRAID__ALGO_COUNT &&
          support[k]) {
        char w[32];
        snprintf(w, sizeof w, " %s ", braid__algo_name(a));
        char s[64];
        snprintf(s, sizeof s, " %s ", support[k]);
        want = strstr(s, w) != NULL;
      }
      CHECK(braid__algo_supports(k, a) == want, "supports(%d, %d) should be %d", k, a, want);
    }
  /* the table picks a supported generic algorithm everywhere */
  for (int k = BRAID__COLL_ALL_REDUCE; k < BRAID__COLL_NKINDS; k++)
    for (int n = 1; n <= 1024 && k != BRAID__COLL_SPLIT; n = n < 20 ? n + 1 : n * 2)
      for (size_t bytes = 0; bytes < ((size_t)1 << 34); bytes = bytes ? bytes * 2 : 1) {
        int a = braid__algo_select(k, bytes, n);
        CHECK(a > BRAID__ALGO_NATIVE && braid__algo_supports(k, a), "select(%d, %zu, %d) = %d", k, bytes, n, a);
      }
  CHECK(braid__algo_select(BRAID__COLL_SPLIT, 64, 4) < 0 && braid__algo_select(BRAID__COLL_NONE, 64, 4) < 0,
        "kinds without generic algorithms");
  /* the documented defaults */
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 4096, 8) == BRAID__ALGO_RD, "small all-reduce: rd");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 64 << 10, 8) == BRAID__ALGO_RHD, "mid all-reduce: rhd");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 64 << 20, 8) == BRAID__ALGO_RING, "large all-reduce: ring");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 256 << 10, 4) == BRAID__ALGO_RHD, "from 4 ranks, rhd longer");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 4 << 20, 4) == BRAID__ALGO_RHD, "4 ranks, 1 MiB blocks: rhd");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 8 << 20, 4) == BRAID__ALGO_RING, "2 MiB blocks: ring");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 8 << 20, 8) == BRAID__ALGO_RHD, "8 ranks, 1 MiB blocks: rhd");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 64 << 10, 2) == BRAID__ALGO_RD, "2 ranks: rd longer");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 8 << 10, 3) == BRAID__ALGO_RHD, "3 ranks: rd only while small");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 256 << 10, 2) == BRAID__ALGO_RHD, "2 ranks: rhd after rd");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 32 << 20, 2) == BRAID__ALGO_RHD, "2 ranks: rhd to 32 MiB");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, (32 << 20) + 4, 2) == BRAID__ALGO_RING, "2 ranks: then ring");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 256 << 10, 3) == BRAID__ALGO_RING, "3 ranks: ring");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 512 << 10, 8) == BRAID__ALGO_RHD, "8 ranks, 64 KiB blocks: rhd");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 1 << 20, 16) == BRAID__ALGO_RING, "16 ranks, 64 KiB blocks: ring");
  CHECK(braid__algo_select(BRAID__COLL_ALL_REDUCE, 64 << 10, 6) == BRAID__ALGO_RING, "non-power-of-two: ring sooner");
  CHECK(braid__algo_select(BRAID__COLL_BROADCAST, 1024, 4) == BRAID__ALGO_TREE, "small broadcast: tree");
  CHECK(braid__algo_select(BRAID__COLL_BROADCAST, 1024, 16) == BRAID__ALGO_KNOMIAL, "small, many ranks: knomial");
  CHECK(braid__algo_select(BRAID__COLL_BROADCAST, 64 << 20, 16) == BRAID__ALGO_CHAIN, "large broadcast: chain");
  CHECK(braid__algo_select(BRAID__COLL_REDUCE, 1 << 20, 2) == BRAID__ALGO_TREE, "large reduce, 2 ranks: tree");
  CHECK(braid__algo_select(BRAID__COLL_REDUCE, 1 << 20, 3) == BRAID__ALGO_RING, "large reduce, 3 ranks: ring");
  CHECK(braid__algo_select(BRAID__COLL_ALL_GATHER, 64, 6) == BRAID__ALGO_BRUCK, "small all-gather: bruck");
  CHECK(braid__algo_select(BRAID__COLL_ALL_GATHER, 64, 8) == BRAID__ALGO_RD, "small all-gather, 2^k: rd");
  CHECK(braid__algo_select(BRAID__COLL_ALL_GATHER, 1 << 20, 6) == BRAID__ALGO_RING, "large all-gather: ring");
  CHECK(braid__algo_select(BRAID__COLL_ALL_GATHER, 64 << 20, 2) == BRAID__ALGO_RD, "large all-gather, 2 ranks: rd");
  CHECK(braid__algo_select(BRAID__COLL_ALL_GATHER, 64 << 20, 4) == BRAID__ALGO_RING, "large all-gather, 4 ranks: ring");
  CHECK(braid__algo_select(BRAID__COLL_REDUCE_SCATTER, 1024, 8) == BRAID__ALGO_RHD, "small reduce-scatter: rhd");
  CHECK(braid__algo_select(BRAID__COLL_REDUCE_SCATTER, 1 << 20, 8) == BRAID__ALGO_RING, "large reduce-scatter");
  CHECK(braid__algo_select(BRAID__COLL_BARRIER, 0, 5) == BRAID__ALGO_DISSEM, "barrier");
  CHECK(braid__algo_select(BRAID__COLL_REDUCE, 1024, 4) == BRAID__ALGO_TREE, "small reduce: tree");
  CHECK(braid__algo_select(BRAID__COLL_REDUCE, 256 << 10, 8) == BRAID__ALGO_TREE, "256 KiB reduce: tree");
  CHECK(braid__algo_select(BRAID__COLL_REDUCE, (256 << 10) + 4, 8) == BRAID__ALGO_RING, "above 256 KiB: ring");
  CHECK(braid__algo_select(BRAID__COLL_GATHER, 1 << 20, 4) == BRAID__ALGO_LINEAR, "large gather: linear");
  CHECK(braid__algo_select(BRAID__COLL_SCATTER, 1 << 20, 4) == BRAID__ALGO_LINEAR, "large scatter: linear");
  CHECK(braid__algo_select(BRAID__COLL_SCATTER, 4096, 4) == BRAID__ALGO_TREE, "small scatter, 4 ranks: tree");
  CHECK(braid__algo_select(BRAID__COLL_SCATTER, 4096, 3) == BRAID__ALGO_LINEAR, "small scatter, 3 ranks: linear");
  CHECK(braid__algo_select(BRAID__COLL_GATHER, 4096, 4) == BRAID__ALGO_LINEAR, "small gather, 4 ranks: linear");
  CHECK(braid__algo_select(BRAID__COLL_ALL_TO_ALL, 1 << 20, 16) == BRAID__ALGO_PAIRWISE, "large all-to-all: pairwise");
  CHECK(braid__algo_select(BRAID__COLL_ALL_TO_ALL, 16, 16) == BRAID__ALGO_BRUCK, "small blocks, many ranks: bruck");
  CHECK(braid__algo_select(BRAID__COLL_ALL_TO_ALLV, 0, 7) == BRAID__ALGO_PAIRWISE, "all-to-allv: pairwise");

  /* BRAID_ALGO */
  uint8_t out[BRAID__COLL_NKINDS];
  char err[256], spec[256];
  memset(out, 0, sizeof out);
  CHECK(braid__algo_parse("allreduce=ring,broadcast=tree", out, err, sizeof err) == 0, "%s", err);
  CHECK(out[BRAID__COLL_ALL_REDUCE] == BRAID__ALGO_RING && out[BRAID__COLL_BROADCAST] == BRAID__ALGO_TREE &&
            out[BRAID__COLL_ALL_GATHER] == 0,
        "parsed values");
  snprintf(spec, sizeof spec, " %s = BRUCK , %s=native,, %s=dissem,%s=rhd,allreduce=auto ",
           braid__coll_short_name(BRAID__COLL_ALL_GATHER), braid__coll_short_name(BRAID__COLL_BROADCAST),
           braid__coll_short_name(BRAID__COLL_BARRIER), braid__coll_short_name(BRAID__COLL_REDUCE_SCATTER));
  CHECK(braid__algo_parse(spec, out, err, sizeof err) == 0, "\"%s\": %s", spec, err);
  CHECK(out[BRAID__COLL_ALL_GATHER] == BRAID__ALGO_BRUCK && out[BRAID__COLL_BROADCAST] == BRAID__ALGO_NATIVE &&
            out[BRAID__COLL_BARRIER] == BRAID__ALGO_DISSEM && out[BRAID__COLL_REDUCE_SCATTER] == BRAID__ALGO_RHD &&
            out[BRAID__COLL_ALL_REDUCE] == BRAID__ALGO_AUTO,
        "parsed values of \"%s\"", spec);
  CHECK(braid__algo_parse("", out, err, sizeof err) == 0 && braid__algo_parse(NULL, out, err, sizeof err) == 0,
        "empty spec");
  CHECK(braid__algo_parse("all_reduce=RD", out, err, sizeof err) == 0 && out[BRAID__COLL_ALL_REDUCE] == BRAID__ALGO_RD,
        "spelling with _ and case");
  static const struct {
    const char *spec, *needles[3];
  } bad[] = {
      {"allreduce", {"\"allreduce\"", "no '='", NULL}},
      {"allreduce=ring,allreduce=rd", {"allreduce=rd", "twice", NULL}},
      {"allreduce=tree", {"allreduce=tree", "tree is not an algorithm of allreduce", "auto, native, ring, rhd, rd"}},
      {"allreduce=fast", {"allreduce=fast", "unknown algorithm \"fast\"", "auto, native, ring, rhd, rd"}},
      {"broadcast=ring", {"broadcast=ring", "tree, knomial, chain", NULL}},
      {"alltoall=ring", {"alltoall=ring", "ring is not an algorithm of alltoall", "auto, native, bruck, pairwise"}},
      {"alltoallw=ring", {"alltoallw=ring", "unknown collective \"alltoallw\"", "allreduce, broadcast"}},
      {"allreduce=", {"unknown algorithm \"\"", NULL, NULL}},
      {"allreduce=ring,=ring", {"\"=ring\"", "unknown collective \"\"", NULL}},
      {"split=native", {"split=native", "no algorithms to choose", "allreduce, broadcast"}},
  };
  for (size_t i = 0; i < NA(bad); i++) {
    uint8_t keep[BRAID__COLL_NKINDS];
    memset(out, 7, sizeof out);
    memcpy(keep, out, sizeof out);
    CHECK(braid__algo_parse(bad[i].spec, out, err, sizeof err) == -1, "\"%s\" accepted", bad[i].spec);
    CHECK(!memcmp(out, keep, sizeof out), "\"%s\": out changed on error", bad[i].spec);
    for (int k = 0; k < 3 && bad[i].needles[k]; k++)
      CHECK(strstr(err, bad[i].needles[k]), "\"%s\": \"%s\" lacks \"%s\"", bad[i].spec, err, bad[i].needles[k]);
  }
  CHECK(braid__algo_parse("x", out, NULL, 0) == -1, "no error buffer");

  /* the table in words: one line per rule, every collective named */
  nlines = 0;
  braid__algo_describe(collect, NULL);
  CHECK(nlines >= 5, "%d lines", nlines);
  for (int k = BRAID__COLL_ALL_REDUCE; k < BRAID__COLL_NKINDS; k++) {
    if (k == BRAID__COLL_SPLIT) continue;
    int found = 0;
    for (int l = 0; l < nlines; l++) found |= !strncmp(lines[l], braid__coll_short_name(k), strlen(braid__coll_short_name(k)));
    CHECK(found, "no line for %s", braid__coll_short_name(k));
  }
  for (int l = 0; l < nlines; l++) printf("    %s\n", lines[l]);
  return 0;
}

/* ======================================================================== */

typedef struct sim_case {
  const char *name;
  int (*fn)(void);
} sim_case;

#define CASE(f) {#f, f}
static const sim_case CASES[] = {
    CASE(sim_select),   CASE(sim_refuse),        CASE(sim_allreduce), CASE(sim_identity), CASE(sim_rounded_once),
    CASE(sim_broadcast), CASE(sim_allgather),    CASE(sim_reduce_scatter), CASE(sim_barrier), CASE(sim_eager),
    CASE(sim_reduce),   CASE(sim_gather_scatter), CASE(sim_alltoall), CASE(sim_big),      CASE(sim_failures),
};

int main(int argc, char **argv) {
  int failed = 0, passed = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (size_t i = 0; i < NA(CASES); i++) {
    if (argc > 1 && !strstr(CASES[i].name, argv[1])) continue;
    double t0 = now_s();
    int before = nproblems;
    int rc = CASES[i].fn();
    if (!rc && nproblems != before) rc = 1;
    printf("%-4s %-40s %8.3f s\n", rc ? "FAIL" : "ok", CASES[i].name, now_s() - t0);
    if (rc) failed++;
    else passed++;
  }
  printf("%d passed, %d failed (%llu messages)\n", passed, failed, (unsigned long long)S.messages);
  return failed ? 1 : 0;
}
