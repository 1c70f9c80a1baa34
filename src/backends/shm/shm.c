/* Backend "shm": one shared-memory segment per communicator (control lines,
   small-message slots, bounded staging, point-to-point rings) and single-copy
   process_vm_readv/writev (CMA) for large data when the kernel allows it.
   See docs/SHM.md for the design and its invariants. */
#include "backends/shm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/params.h"
#include "core/reduce.h"
#include "os/time.h"

#include "bootstrap/bootstrap.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

#define SHM_MAGIC 0x62726169642d736dULL
#define SHM_DEFAULT_STAGING (8u << 20)
/* Collectives below this many bytes copy through the staging buffers: on the
   measured VM (PTI, 2 vCPUs) the page pinning of process_vm_readv/writev made
   single copy slower than L2-sized staging rounds at every size measured. */
#define SHM_CMA_MIN_DEFAULT ((size_t)256 << 20)

static shm_state *state(braid_comm *c) { return c->be; }

/* This process's shm communicators, for shm_progress_others. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static shm_state *live_head;
static _Atomic int live_count;

static void live_add(braid_comm *c, shm_state *s) {
  s->comm = c;
  pthread_mutex_lock(&live_lock);
  s->next_live = live_head;
  live_head = s;
  atomic_fetch_add(&live_count, 1);
  pthread_mutex_unlock(&live_lock);
}

static void live_remove(shm_state *s) {
  pthread_mutex_lock(&live_lock);
  for (shm_state **p = &live_head; *p; p = &(*p)->next_live)
    if (*p == s) {
      *p = s->next_live;
      atomic_fetch_sub(&live_count, 1);
      break;
    }
  pthread_mutex_unlock(&live_lock);
}

int shm_progress_others(shm_state *s) {
  int busy = 0;
  pthread_mutex_lock(&live_lock);
  for (shm_state *o = live_head; o; o = o->next_live) {
    if (o == s) continue;
    /* A communicator in use by a call (this thread's or another's) makes
       its own progress; trylock also keeps the lock order free of cycles. */
    if (pthread_mutex_trylock(&o->comm->lock) != 0) continue;
    if (o->npending && !o->in_progress && !atomic_load(&o->comm->failed)) {
      braid_status st = shm_p2p_progress(o->comm, o);
      if (st == BRAID_OK && o->npending) busy++;
    }
    pthread_mutex_unlock(&o->comm->lock);
  }
  pthread_mutex_unlock(&live_lock);
  return busy;
}

static uint64_t probe_value = 0x5eedf00dcafe1234ULL;

/* Registers this process, once, for the expedited global membarrier that
   lets wakers skip their fence (see shm_wake_fence). */
static pthread_once_t membar_once = PTHREAD_ONCE_INIT;
static int membar_ok;

static void membar_register(void) {
  long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (q < 0 || !(q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) || !(q & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED)) return;
  membar_ok = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
}

/* ---------------------------------------------------------------- futex & waiting */

static void futex_wait(_Atomic uint32_t *addr, uint32_t val, double secs) {
  struct timespec ts;
  if (secs < 0) secs = 0;
  ts.tv_sec = (time_t)secs;
  ts.tv_nsec = (long)((secs - (double)ts.tv_sec) * 1e9);
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr) { syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

void shm_wake_one(shm_state *s, int q) {
  shm_ctl *k = shm_ctl_of(s, q);
  if (atomic_load_explicit(&k->sleeping, memory_order_relaxed)) {
    atomic_fetch_add(&k->futex, 1);
    futex_wake(&k->futex);
  }
}

void shm_wake_peers(shm_state *s) {
  /* Pairs with the sleeper's barrier between announcing itself and re-checking. */
  shm_wake_fence(s);
  for (int q = 0; q < s->n; q++)
    if (q != s->me) shm_wake_one(s, q);
}

static void wake_all_hard(shm_state *s) {
  for (int q = 0; q < s->n; q++) {
    shm_ctl *k = shm_ctl_of(s, q);
    atomic_fetch_add(&k->futex, 1);
    futex_wake(&k->futex);
  }
}

void shm_publish_fail(shm_state *s, int kind, int origin, int peer) {
  uint64_t want = (uint64_t)kind << 48 | (uint64_t)(uint32_t)origin << 24 | (uint64_t)(uint32_t)(peer & 0xffffff);
  uint64_t zero = 0;
  if (atomic_compare_exchange_strong(&s->hdr->fail, &zero, want)) wake_all_hard(s);
}

/* 1 when rank q's process has exited (a zombie counts as exited). */
static int peer_dead(shm_state *s, int q) {
  if (s->pidfds[q] >= 0) {
    struct pollfd p = {.fd = s->pidfds[q], .events = POLLIN};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
  }
  if (kill(s->pids[q], 0) != 0 && errno == ESRCH) return 1;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)s->pids[q]);
  FILE *f = fopen(path, "r");
  if (!f) return 1;
  size_t got = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[got] = 0;
  const char *rp = strrchr(buf, ')');
  return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

static braid_status report_fail_flag(braid_comm *c, shm_state *s, uint64_t f, int peer, const char *what) {
  int kind = (int)(f >> 48), origin = (int)((f >> 24) & 0xffffff), dead = (int)(f & 0xffffff);
  if (kind == SHM_FAIL_DIED)
    return braid__fail(c, BRAID_ERR_PEER_LOST, "rank %d (pid %d) died during %s (this rank was waiting for rank %d: %s)",
                       dead, dead < s->n ? (int)s->pids[dead] : 0, c->call, peer, what);
  if (kind == SHM_FAIL_ABORTED)
    return braid__fail(c, BRAID_ERR_PEER_LOST,
                       "rank %d aborted the communicator during %s (this rank was waiting for rank %d: %s)", origin,
                       c->call, peer, what);
  return braid__fail(c, BRAID_ERR_PEER_LOST,
                     "rank %d failed with a fatal error during %s (this rank was waiting for rank %d: %s)", origin,
                     c->call, peer, what);
}

/* A NULL description of the awaited thing is made only for an error message:
   pending point-to-point operations change too often to describe each wait. */
#define WHAT (what ? what : (shm_p2p_describe(s, desc, sizeof desc), desc))

/* Checks that end a wait: abort, a failure published by any rank, dead or
   departed peers (every ~100 ms), the deadline. */
static braid_status wait_checks(braid_comm *c, shm_state *s, shm_wait *w, int peer, const char *what, double now) {
  char desc[192];
  if (braid__aborted(c)) {
    shm_publish_fail(s, SHM_FAIL_ABORTED, s->me, s->me);
    return braid__fail(c, BRAID_ERR_ABORTED, "aborted while waiting for rank %d: %s", peer, WHAT);
  }
  uint64_t f = atomic_load_explicit(&s->hdr->fail, memory_order_acquire);
  if (f) return report_fail_flag(c, s, f, peer, WHAT);
  if (now >= w->next_live) {
    w->next_live = now + 0.1;
    for (int q = 0; q < s->n; q++) {
      if (q == s->me) continue;
      int left = atomic_load(&shm_ctl_of(s, q)->left) != 0;
      if (left && q == peer && !w->left_seen) {
        /* It stores "left" after everything else it publishes: the caller
           looks at its condition once more before this counts. */
        w->left_seen = 1;
        w->next_live = now;
        return BRAID_OK;
      }
      if (left && q == peer)
        return braid__fail(c, BRAID_ERR_PEER_LOST,
                           "rank %d (pid %d) destroyed its communicator during %s while this rank waited for it: %s", q,
                           (int)s->pids[q], c->call, WHAT);
      if (!left && peer_dead(s, q)) {
        shm_publish_fail(s, SHM_FAIL_DIED, s->me, q);
        return braid__fail(c, BRAID_ERR_PEER_LOST, "rank %d (pid %d) died during %s (this rank was waiting for rank %d: %s)",
                           q, (int)s->pids[q], c->call, peer, WHAT);
      }
    }
  }
  if (now >= w->deadline) {
    shm_publish_fail(s, SHM_FAIL_FAILED, s->me, peer);
    return braid__fail(c, BRAID_ERR_TIMEOUT, "timed out after %g s waiting for rank %d: %s", c->timeout_s, peer, WHAT);
  }
  return BRAID_OK;
}

#undef WHAT

void shm_wait_begin(shm_wait *w) {
  w->spins = 0;
  w->armed = 0;
  w->left_seen = 0;
  w->start = 0;
}

void shm_wait_end(shm_state *s, shm_wait *w) {
  if (w->armed) atomic_store(&shm_ctl_of(s, s->me)->sleeping, 0);
  w->armed = 0;
}

braid_status shm_wait_step(braid_comm *c, shm_state *s, shm_wait *w, int peer, const char *what) {
  w->spins++;
  if (w->spins < s->spin_limit) {
    cpu_relax();
    if (w->spins & 63) return BRAID_OK;
  }
  double now = braid__now();
  if (w->start == 0) {
    w->start = now;
    w->deadline = braid__deadline(c->timeout_s);
    w->next_live = now + 0.1;
  }
  braid_status st = wait_checks(c, s, w, peer, what, now);
  if (st) {
    shm_wait_end(s, w);
    return st;
  }
  if (s->npending && !s->in_progress) {
    st = shm_p2p_progress(c, s);
    if (st) {
      shm_wait_end(s, w);
      return st;
    }
  }
  if (w->spins < s->spin_limit) return BRAID_OK;
  /* Another communicator's transfer may be what the awaited peer waits for;
     while one is pending this rank keeps polling instead of sleeping. */
  int others = atomic_load_explicit(&live_count, memory_order_relaxed) > 1 ? shm_progress_others(s) : 0;
  if (others || now - w->start < s->yield_s) {
    sched_yield();
    return BRAID_OK;
  }
  shm_ctl *k = shm_ctl_of(s, s->me);
  if (!w->armed) {
    /* Announce, then let the caller re-check its condition before sleeping:
       a waker that missed the announcement posted before the re-check. */
    w->fval = atomic_load(&k->futex);
    atomic_store(&k->sleeping, 1);
    if (s->light_wake) {
      if (syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) != 0) {
        /* Without the barrier a wake-up could be missed: keep polling. */
        atomic_store(&k->sleeping, 0);
        sched_yield();
        return BRAID_OK;
      }
    } else {
      atomic_thread_fence(memory_order_seq_cst);
    }
    w->armed = 1;
    return BRAID_OK;
  }
  double slice = 0.1;
  if (w->deadline - now < slice) slice = w->deadline - now;
  futex_wait(&k->futex, w->fval, slice);
  atomic_store(&k->sleeping, 0);
  w->armed = 0;
  return BRAID_OK;
}

#define WAIT_UNTIL(cond, peer, what)                                 \
  do {                                                               \
    if (!(cond)) {                                                   \
      shm_wait w_;                                                   \
      shm_wait_begin(&w_);                                           \
      while (!(cond)) {                                              \
        braid_status st_ = shm_wait_step(c, s, &w_, (peer), (what)); \
        if (st_) return st_;                                         \
      }                                                              \
      shm_wait_end(s, &w_);                                          \
    }                                                                \
  } while (0)

/* ---------------------------------------------------------------- phase flags */

static inline uint64_t flag_of(shm_state *s, int q) {
  return atomic_load_explicit(&shm_ctl_of(s, q)->flag, memory_order_acquire);
}

static void post(shm_state *s) {
  atomic_store_explicit(&shm_ctl_of(s, s->me)->flag, ++s->ph, memory_order_release);
  shm_wake_peers(s);
}

static braid_status wait_flag(braid_comm *c, shm_state *s, int q, uint64_t v, const char *what) {
  WAIT_UNTIL(flag_of(s, q) >= v, q, what);
  return BRAID_OK;
}

static braid_status wait_all(braid_comm *c, shm_state *s, uint64_t v, const char *what) {
  for (int q = 0; q < s->n; q++) {
    if (q == s->me) continue;
    WAIT_UNTIL(flag_of(s, q) >= v, q, what);
  }
  return BRAID_OK;
}

/* ---------------------------------------------------------------- CMA */

static braid_status cma_error(braid_comm *c, shm_state *s, int q, int err, const char *dir) {
  if (err == ESRCH || peer_dead(s, q)) {
    shm_publish_fail(s, SHM_FAIL_DIED, s->me, q);
    return braid__fail(c, BRAID_ERR_PEER_LOST, "rank %d (pid %d) died during %s", q, (int)s->pids[q], c->call);
  }
  return braid__fail(c, BRAID_ERR_SYSTEM, "process_vm_%s from rank %d (pid %d) failed: %s", dir, q, (int)s->pids[q],
                     strerror(err));
}

static braid_status cma_xfer(braid_comm *c, shm_state *s, int q, void *local, uint64_t remote, size_t len, int write) {
  char *l = local;
  while (len) {
    size_t part = len > (1u << 30) ? (1u << 30) : len;
    struct iovec li = {l, part}, ri = {(void *)(uintptr_t)remote, part};
    ssize_t got = write ? process_vm_writev(s->pids[q], &li, 1, &ri, 1, 0) : process_vm_readv(s->pids[q], &li, 1, &ri, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return cma_error(c, s, q, errno, write ? "writev to" : "readv");
    }
    if (got == 0) return cma_error(c, s, q, EFAULT, write ? "writev to" : "readv");
    l += got;
    remote += (uint64_t)got;
    len -= (size_t)got;
  }
  return BRAID_OK;
}

braid_status shm_cma_read(braid_comm *c, shm_state *s, int q, void *local, uint64_t remote, size_t len) {
  return cma_xfer(c, s, q, local, remote, len, 0);
}

static braid_status cma_write(braid_comm *c, shm_state *s, int q, uint64_t remote, const void *local, size_t len) {
  return cma_xfer(c, s, q, (void *)local, remote, len, 1);
}

/* ---------------------------------------------------------------- segment */

typedef struct layout {
  size_t off_ctl, off_slots, off_bring, off_staging, off_rings, total;
} layout;

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static layout compute_layout(int n, size_t staging) {
  layout l;
  size_t nn = (size_t)n;
  l.off_ctl = round_up(sizeof(shm_hdr), 4096);
  l.off_slots = round_up(l.off_ctl + nn * sizeof(shm_ctl), 4096);
  l.off_bring = round_up(l.off_slots + nn * 2 * SHM_SLOT_BYTES, 4096);
  l.off_staging = round_up(l.off_bring + (size_t)SHM_BRING * SHM_SLOT_BYTES, 4096);
  l.off_rings = round_up(l.off_staging + nn * staging, 4096);
  l.total = round_up(l.off_rings + nn * nn * (sizeof(shm_ring) + SHM_RING_BYTES), 4096);
  return l;
}

static char *slot_of(shm_state *s, int r, int parity) {
  return s->base + s->hdr->off_slots + ((size_t)r * 2 + (size_t)parity) * SHM_SLOT_BYTES;
}
static char *bring_of(shm_state *s, uint64_t b) {
  return s->base + s->hdr->off_bring + (size_t)(b % SHM_BRING) * SHM_SLOT_BYTES;
}
static _Atomic uint64_t *slot_seq(char *slot) { return (_Atomic uint64_t *)slot; }
/* Up to 56 bytes share the sequence word's cache line (one miss for the
   reader); larger payloads start on the next line: copies from a source
   8 bytes off a line ran 3-4 times slower from 4 KiB on the measured CPU
   (2 ranks, 8 KiB broadcast: 3.8 us at +8, 0.9 us at +64). */
static char *slot_data(char *slot, size_t bytes) { return slot + (bytes <= 56 ? 8 : 64); }
static char *staging_of(shm_state *s, int r) { return s->base + s->hdr->off_staging + (size_t)r * s->staging; }

static braid_status seg_create(braid_comm *c, shm_state *s, const char *name) {
  layout l = compute_layout(s->n, s->staging);
  int fd = -1;
  for (int tries = 0; tries < 2; tries++) {
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 || errno != EEXIST) break;
    shm_unlink(name); /* left behind by a job that was killed while starting */
  }
  if (fd < 0) return braid__fail(c, BRAID_ERR_SYSTEM, "shm_open(%s) failed: %s", name, strerror(errno));
  if (ftruncate(fd, (off_t)l.total) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(name);
    return braid__fail(c, BRAID_ERR_SYSTEM, "ftruncate of the %zu-byte segment %s failed: %s", l.total, name, strerror(e));
  }
  void *p = mmap(NULL, l.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name);
    return braid__fail(c, BRAID_ERR_SYSTEM, "mmap of the %zu-byte segment %s failed: %s", l.total, name, strerror(errno));
  }
  s->base = p;
  s->total = l.total;
  s->hdr = p;
  s->hdr->n = (uint32_t)s->n;
  s->hdr->creator_pid = (int32_t)getpid();
  s->hdr->total = l.total;
  s->hdr->staging = s->staging;
  s->hdr->cma_min = s->cma_min;
  s->hdr->off_ctl = l.off_ctl;
  s->hdr->off_slots = l.off_slots;
  s->hdr->off_bring = l.off_bring;
  s->hdr->off_staging = l.off_staging;
  s->hdr->off_rings = l.off_rings;
  atomic_store_explicit(&s->hdr->magic, SHM_MAGIC, memory_order_release);
  return BRAID_OK;
}

/* Opens a segment another rank creates; waits for it to appear and be ready. */
static braid_status seg_open(braid_comm *c, shm_state *s, const char *name, double deadline) {
  double next_warn = braid__now() + 5.0;
  for (;;) {
    if (braid__aborted(c)) return braid__fail(c, BRAID_ERR_ABORTED, "aborted while opening segment %s", name);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd >= 0) {
      struct stat sb;
      if (fstat(fd, &sb) == 0 && sb.st_size >= (off_t)sizeof(shm_hdr)) {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED)
          return braid__fail(c, BRAID_ERR_SYSTEM, "mmap of segment %s failed: %s", name, strerror(errno));
        shm_hdr *h = p;
        double until = braid__now() + 1.0;
        while (atomic_load_explicit(&h->magic, memory_order_acquire) != SHM_MAGIC && braid__now() < until)
          braid__sleep(20e-6);
        int stale = atomic_load(&h->magic) != SHM_MAGIC || h->total != (uint64_t)sb.st_size ||
                    atomic_load(&h->attached) >= h->n || (kill(h->creator_pid, 0) != 0 && errno == ESRCH);
        if (!stale) {
          if (h->n != (uint32_t)s->n) {
            uint32_t hn = h->n;
            munmap(p, (size_t)sb.st_size);
            return braid__fail(c, BRAID_ERR_BOOTSTRAP,
                               "segment %s was made for %u ranks but this rank was started with world size %d", name, hn,
                               s->n);
          }
          s->base = p;
          s->total = (size_t)sb.st_size;
          s->hdr = h;
          s->staging = h->staging;
          s->cma_min = (size_t)h->cma_min;
          return BRAID_OK;
        }
        munmap(p, (size_t)sb.st_size);
      } else {
        close(fd);
      }
    }
    double now = braid__now();
    if (now >= deadline)
      return braid__fail(c, BRAID_ERR_TIMEOUT, "timed out after %g s waiting for shared-memory segment %s", c->timeout_s,
                         name);
    if (now >= next_warn) {
      BLOG_WARN(BRAID_SUB_SHM, c->rank, "%s: still waiting for shared-memory segment %s", c->call, name);
      next_warn = INFINITY;
    }
    braid__sleep(100e-6);
  }
}

static void open_pidfds(shm_state *s) {
  for (int q = 0; q < s->n; q++) {
    s->pidfds[q] = -1;
#ifdef SYS_pidfd_open
    if (q != s->me) s->pidfds[q] = (int)syscall(SYS_pidfd_open, s->pids[q], 0);
#endif
  }
}

static shm_state *state_new(int n, int me) {
  shm_state *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->n = n;
  s->me = me;
  s->pids = calloc((size_t)n, sizeof *s->pids);
  s->pidfds = calloc((size_t)n, sizeof *s->pidfds);
  s->ctrl_q = calloc((size_t)n, sizeof *s->ctrl_q);
  s->cur = calloc((size_t)n, sizeof *s->cur);
  s->zmaps = calloc((size_t)n * SHM_ZMAP_CAP, sizeof *s->zmaps);
  s->zepoch = calloc((size_t)n, sizeof *s->zepoch);
  s->sends_tail = &s->sends;
  s->recvs_tail = &s->recvs;
  s->umsgs_tail = &s->umsgs;
  for (int q = 0; q < n && s->pidfds; q++) s->pidfds[q] = -1;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  /* Oversubscribed cores: spinning only delays the rank we wait for, which
     may be queued on this very core (4 ranks on 2 cores, 16 B ring exchange:
     5.9-6.0 us yielding at once, 5-14 us after 64 spins). */
  s->oversub = ncpu > 0 && n > ncpu;
  s->spin_limit = s->oversub ? 1 : 4096;
  s->yield_s = 2e-3;
  if (!s->pids || !s->pidfds || !s->ctrl_q || !s->cur || !s->zmaps || !s->zepoch) {
    free(s->pids);
    free(s->pidfds);
    free(s->ctrl_q);
    free(s->cur);
    free(s->zmaps);
    free(s->zepoch);
    free(s);
    return NULL;
  }
  return s;
}

static void state_free(shm_state *s) {
  if (!s) return;
  shm_zc_free(s);
  if (s->base) munmap(s->base, s->total);
  for (int q = 0; q < s->n; q++)
    if (s->pidfds[q] >= 0) close(s->pidfds[q]);
  free(s->pids);
  free(s->pidfds);
  free(s->ctrl_q);
  free(s->cur);
  free(s->zmaps);
  free(s->zepoch);
  free(s->tmp);
  free(s);
}

static braid_status alloc_tmp(braid_comm *c, shm_state *s) {
  if (s->n < 2) return BRAID_OK;
  /* CMA landing space for one chunk of every peer: about 512 KiB in all, so
     the chunk is still in L2 when it is reduced. */
  size_t each = round_up((512u << 10) / (size_t)(s->n - 1), 4096);
  if (each < (32u << 10)) each = 32u << 10;
  s->tmp_each = each;
  if (posix_memalign((void **)&s->tmp, 4096, each * (size_t)(s->n - 1)) != 0) {
    s->tmp = NULL;
    return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %zu bytes of transfer buffers",
                       each * (size_t)(s->n - 1));
  }
  return BRAID_OK;
}

/* Every rank has mapped: the name goes at once so nothing can leak. Then all
   wait for each other (pids become known) under the deadline. */
static braid_status attach_and_meet(braid_comm *c, shm_state *s, const char *name, double deadline) {
  shm_ctl *me = shm_ctl_of(s, s->me);
  me->pid = (int32_t)getpid();
  me->probe_addr = (uint64_t)(uintptr_t)&probe_value;
  me->probe_fd = braid__mem_probe_fd();
  uint32_t now_attached = atomic_fetch_add(&s->hdr->attached, 1) + 1;
  if (now_attached == (uint32_t)s->n) {
    shm_unlink(name);
    atomic_store(&s->hdr->unlinked, 1);
  }
  while (atomic_load(&s->hdr->attached) < (uint32_t)s->n) {
    if (braid__aborted(c)) return braid__fail(c, BRAID_ERR_ABORTED, "aborted while waiting for ranks to attach");
    if (braid__now() >= deadline) {
      if (s->me == 0) shm_unlink(name);
      return braid__fail(c, BRAID_ERR_TIMEOUT, "timed out after %g s: %u of %d ranks attached to segment %s",
                         c->timeout_s, atomic_load(&s->hdr->attached), s->n, name);
    }
    if (s->n > 1) braid__sleep(20e-6);
  }
  for (int q = 0; q < s->n; q++) s->pids[q] = shm_ctl_of(s, q)->pid;
  open_pidfds(s);
  return BRAID_OK;
}

static braid_status read_staging_param(braid_comm *c, size_t *out) {
  char err[256];
  size_t v;
  if (braid__env_size("BRAID_SHM_BUFFER", SHM_DEFAULT_STAGING, &v, err, sizeof err))
    return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s", err);
  if (v < (64u << 10)) v = 64u << 10;
  *out = round_up(v, 4096);
  return BRAID_OK;
}

static braid_status shm_init(braid_comm *c) {
  shm_state *s = state_new(c->size, c->rank);
  if (!s) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for the shm backend");
  braid_status st = read_staging_param(c, &s->staging);
  char err[256];
  long want_cma = 1, want_membar = 1, want_zc = 1;
  if (!st && braid__env_int("BRAID_SHM_CMA", 1, 0, 1, &want_cma, err, sizeof err))
    st = braid__fail(c, BRAID_ERR_INVALID_ARG, "%s", err);
  if (!st && braid__env_int("BRAID_SHM_MEMBARRIER", 1, 0, 1, &want_membar, err, sizeof err))
    st = braid__fail(c, BRAID_ERR_INVALID_ARG, "%s", err);
  if (!st && braid__env_int("BRAID_SHM_ZEROCOPY", 1, 0, 1, &want_zc, err, sizeof err))
    st = braid__fail(c, BRAID_ERR_INVALID_ARG, "%s", err);
  if (!st && braid__env_size("BRAID_SHM_CMA_MIN", SHM_CMA_MIN_DEFAULT, &s->cma_min, err, sizeof err))
    st = braid__fail(c, BRAID_ERR_INVALID_ARG, "%s", err);
  if (st) {
    state_free(s);
    return st;
  }
  double deadline = braid__deadline(c->timeout_s);
  /* Rank 0 names the segment after its pid and the communicator id and tells
     the others through the store. Without a store (launched without one) the
     name derives from the common parent process. */
  braid__store *store = c->boot ? c->boot->store : NULL;
  char name[128], key[64];
  snprintf(key, sizeof key, "shm/%llx/seg", (unsigned long long)c->id);
  snprintf(name, sizeof name, "/braid-%u-%d-%llx", (unsigned)getuid(), (int)(store ? getpid() : getppid()),
           (unsigned long long)c->id);
  /* Sibling processes may read each other's memory under Yama ptrace_scope 1. */
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  if (c->rank == 0) {
    st = seg_create(c, s, name);
    if (!st && store && braid__store_set(store, key, name, strlen(name) + 1)) {
      st = braid__fail(c, BRAID_ERR_BOOTSTRAP, "could not publish the segment name: %s", braid__store_error(store));
      shm_unlink(name);
    }
  } else {
    if (store) {
      void *v = NULL;
      size_t vlen = 0;
      if (braid__store_get(store, key, &v, &vlen, deadline))
        st = braid__fail(c, BRAID_ERR_BOOTSTRAP, "could not learn the segment name from rank 0: %s",
                         braid__store_error(store));
      else
        snprintf(name, sizeof name, "%.*s", (int)(vlen < sizeof name ? vlen : sizeof name - 1), (char *)v);
      free(v);
    }
    if (!st) st = seg_open(c, s, name, deadline);
  }
  if (!st) st = attach_and_meet(c, s, name, deadline);
  if (!st) st = alloc_tmp(c, s);
  if (st) {
    state_free(s);
    return st;
  }
  c->be = s;
  /* Probe single copy on the next rank's known address; all must agree. */
  shm_ctl *mine = shm_ctl_of(s, s->me);
  int ok = 0;
  if (want_cma && s->n > 1) {
    int q = (s->me + 1) % s->n;
    uint64_t v = 0;
    struct iovec li = {&v, sizeof v}, ri = {(void *)(uintptr_t)shm_ctl_of(s, q)->probe_addr, sizeof v};
    errno = 0;
    ok = process_vm_readv(s->pids[q], &li, 1, &ri, 1, 0) == (ssize_t)sizeof v && v == probe_value;
    if (!ok)
      BLOG_INFO(BRAID_SUB_SHM, c->rank, "process_vm_readv of rank %d failed (%s): copying through shared memory", q,
                errno ? strerror(errno) : "wrong value");
  }
  atomic_store(&mine->cma_ok, ok ? 1u : 2u);
  /* Zero copy from braid memory: can this rank map the next rank's memfds? */
  int zok = want_zc && s->n > 1 && shm_zc_probe(s, (s->me + 1) % s->n);
  if (want_zc && s->n > 1 && !zok)
    BLOG_INFO(BRAID_SUB_SHM, c->rank, "cannot map rank %d's braid_mem_alloc memory: no zero copy",
              (s->me + 1) % s->n);
  atomic_store(&mine->zc_ok, zok ? 1u : 2u);
  if (want_membar) pthread_once(&membar_once, membar_register);
  atomic_store(&mine->membar, want_membar && membar_ok ? 1u : 2u);
  post(s);
  st = wait_all(c, s, s->ph, "its arrival in braid_init");
  if (st) {
    c->be = NULL;
    state_free(s);
    return st;
  }
  s->cma = s->n > 1;
  s->zc = s->n > 1;
  s->light_wake = 1;
  for (int q = 0; q < s->n; q++) {
    if (atomic_load(&shm_ctl_of(s, q)->cma_ok) != 1) s->cma = 0;
    if (atomic_load(&shm_ctl_of(s, q)->zc_ok) != 1) s->zc = 0;
    if (atomic_load(&shm_ctl_of(s, q)->membar) != 1) s->light_wake = 0;
  }
  live_add(c, s);
  BLOG_INFO(BRAID_SUB_SHM, c->rank,
            "shm: %d ranks, segment %zu bytes, staging %zu bytes per rank, large transfers %s, braid_mem_alloc "
            "buffers %s, wake-ups %s",
            s->n, s->total, s->staging, s->cma ? "single-copy (process_vm_readv/writev)" : "copied through shared memory",
            s->zc ? "read in place by peers (zero copy)" : "copied like other memory",
            s->light_wake ? "paired with membarrier (no fence on the sending side)" : "fenced on both sides");
  char cma_from[64] = "never (no single copy)";
  if (s->cma) snprintf(cma_from, sizeof cma_from, "from %zu bytes", s->cma_min);
  BLOG_INFO(BRAID_SUB_SHM, c->rank,
            "shm algorithms: up to %u bytes per rank flat slot exchange (broadcast: a ring, the root does not wait); "
            "above, all-reduce and reduce-scatter in staging rounds, broadcast and all-gather streamed in 64-256 KiB "
            "chunks; collectives by single copy %s; send/recv eager up to %u bytes, then %s",
            SHM_SLOT_DATA, cma_from, SHM_EAGER_MAX,
            s->cma ? "pulled by single copy" : "streamed through the pair's ring");
  return BRAID_OK;
}

static braid_status shm_split(braid_comm *parent, braid_comm *child, const int *members, int n) {
  shm_state *ps = state(parent);
  shm_state *s = state_new(n, child->rank);
  if (!s) return braid__fail(child, BRAID_ERR_NO_MEMORY, "out of memory for the shm backend");
  s->staging = ps->staging;
  s->cma_min = ps->cma_min;
  char name[128];
  /* The creator's pid plus the child id make a name no other live job uses. */
  snprintf(name, sizeof name, "/braid-%u-%d-%llx", (unsigned)getuid(), (int)ps->pids[members[0]],
           (unsigned long long)child->id);
  double deadline = braid__deadline(child->timeout_s);
  braid_status st = child->rank == 0 ? seg_create(child, s, name) : seg_open(child, s, name, deadline);
  if (!st) st = attach_and_meet(child, s, name, deadline);
  if (!st) st = alloc_tmp(child, s);
  if (st) {
    state_free(s);
    return st;
  }
  child->be = s;
  post(s);
  st = wait_all(child, s, s->ph, "its arrival in braid_split");
  if (st) {
    child->be = NULL;
    state_free(s);
    return st;
  }
  s->cma = ps->cma && n > 1;
  s->zc = ps->zc && n > 1;
  s->light_wake = ps->light_wake;
  live_add(child, s);
  return BRAID_OK;
}

static void shm_destroy(braid_comm *c, double timeout_s) {
  shm_state *s = state(c);
  if (!s) return;
  live_remove(s);
  shm_p2p_sync(c, timeout_s, 1);
  shm_p2p_free(c, s);
  atomic_store(&shm_ctl_of(s, s->me)->left, 1);
  shm_wake_peers(s);
  state_free(s);
  c->be = NULL;
}

static void shm_abort(braid_comm *c) {
  shm_state *s = state(c);
  if (!s) return;
  shm_publish_fail(s, SHM_FAIL_ABORTED, s->me, s->me);
  wake_all_hard(s);
}

/* ---------------------------------------------------------------- slices */

static void slice_of(size_t count, int n, int q, size_t *start, size_t *len) {
  size_t base = count / (size_t)n, rem = count % (size_t)n, uq = (size_t)q;
  *start = uq * base + (uq < rem ? uq : rem);
  *len = base + (uq < rem ? 1 : 0);
}

/* ---------------------------------------------------------------- flat small-message collectives */

/* Every rank publishes `bytes` from src (may be NULL when bytes is 0) in its
   slot of this exchange's parity (returned in *parity) and waits for every
   other rank's. A slot is reused two exchanges later, by when every reader
   has moved on: each exchange waits for every rank, so starting exchange k
   means every rank has finished k-2. Collectives that do not wait for every
   rank (small broadcasts) therefore never use the slots. */
static braid_status flat_exchange(braid_comm *c, shm_state *s, const void *src, size_t bytes, int *parity,
                                  const char *what) {
  uint64_t k = ++s->cseq;
  *parity = (int)(k & 1);
  char *mine = slot_of(s, s->me, *parity);
  if (bytes) memcpy(slot_data(mine, bytes), src, bytes);
  atomic_store_explicit(slot_seq(mine), k, memory_order_release);
  shm_wake_peers(s);
  for (int q = 0; q < s->n; q++) {
    if (q == s->me) continue;
    _Atomic uint64_t *seq = slot_seq(slot_of(s, q, *parity));
    WAIT_UNTIL(atomic_load_explicit(seq, memory_order_acquire) == k, q, what);
  }
  return BRAID_OK;
}

static const void **srcs_array(shm_state *s, const void **stackbuf, int cap) {
  if (s->n <= cap) return stackbuf;
  return malloc(2 * sizeof(void *) * (size_t)s->n);
}

/* srcs: reduction inputs, one per rank; zsrc: each peer's buffer read in
   place (braid memory), NULL where the peer stages. */
#define SRCS_DECL                                                                                   \
  const void *srcs_stack_[32];                                                                      \
  const void **srcs = srcs_array(s, srcs_stack_, 16);                                               \
  if (!srcs) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %d source pointers", s->n); \
  const char **zsrc = (const char **)(srcs + s->n);                                                 \
  (void)zsrc
#define SRCS_FREE \
  if (srcs != srcs_stack_) free((void *)srcs)

/* After the post that carried this operation's announcements (key): fills
   zsrc with every peer's buffer in braid memory (NULL where it has none) and
   counts the ranks, this one (zme) included, whose buffers are there. */
static braid_status zc_gather(braid_comm *c, shm_state *s, uint64_t key, int zme, const char **zsrc, int *nzc) {
  *nzc = zme;
  zsrc[s->me] = NULL;
  for (int q = 0; q < s->n; q++) {
    if (q == s->me) continue;
    braid_status st = shm_zc_peer(c, s, q, key, &zsrc[q]);
    if (st) return st;
    if (zsrc[q]) (*nzc)++;
  }
  return BRAID_OK;
}

/* ---------------------------------------------------------------- streaming */

/* Chunk of the streaming collectives (broadcast, all-gather): small enough
   that a message is split into a few pieces whose copies in and out overlap,
   large enough that per-chunk synchronization costs little; cache-resident
   either way. Pieces under 64 KiB pipeline badly between two cores (xcore_bw:
   8 GB/s with 16 KiB, 18 GB/s with 64 KiB, 23-33 GB/s with 256 KiB; 2 ranks,
   64 KiB broadcast: 7 us in four pieces, 2-4 us in one). At least two chunks
   fit in the staging space. */
static size_t stream_chunk(shm_state *s, size_t bytes) {
  size_t c = bytes / 4;
  if (c < (64u << 10)) c = 64u << 10;
  if (c > (256u << 10)) c = 256u << 10;
  if (c > s->staging / 2) c = s->staging / 2;
  return round_up(c, SHM_CL);
}

/* Slot spacing of streamed broadcasts: the largest chunk, so slots stay put
   whatever the sizes of consecutive broadcasts. */
static size_t stream_stride(shm_state *s) {
  size_t c = (size_t)256 << 10;
  return c < s->staging / 2 ? c : s->staging / 2;
}

/* Every other rank has finished streamed-broadcast chunk v-1. */
static braid_status wait_stream(braid_comm *c, shm_state *s, uint64_t v, const char *what) {
  for (int q = 0; q < s->n; q++) {
    if (q == s->me) continue;
    WAIT_UNTIL(atomic_load_explicit(&shm_ctl_of(s, q)->stream_done, memory_order_acquire) >= v, q, what);
  }
  return BRAID_OK;
}

/* Before a collective writes this rank's staging: streamed broadcasts do not
   wait for their readers, so some may still copy from it. */
static braid_status staging_quiesce(braid_comm *c, shm_state *s) {
  return s->sseq ? wait_stream(c, s, s->sseq, "its copy of an earlier braid_broadcast") : BRAID_OK;
}

/* ---------------------------------------------------------------- all-reduce */

static braid_status ar_flat(braid_comm *c, shm_state *s, void *buf, size_t count, braid_dtype dt, braid_op op) {
  size_t bytes = count * braid_dtype_size(dt);
  int p;
  braid_status st = flat_exchange(c, s, buf, bytes, &p, "its input to braid_all_reduce");
  if (st) return st;
  SRCS_DECL;
  for (int q = 0; q < s->n; q++) srcs[q] = q == s->me ? buf : slot_data(slot_of(s, q, p), bytes);
  braid__reduce(buf, srcs, s->n, count, dt, op, s->n);
  SRCS_FREE;
  return BRAID_OK;
}

/* Calls that stage at most SHM_ROTATE bytes per rank do not start where the
   last one did: they move through the first SHM_ROTATE_REGION bytes of their
   region, `used` bytes at a time. Writing again lines a peer has just read
   is slow (the writer must take them back; 2 ranks on 2 cores: all-reduce
   64 KiB 11-14 vs 4.6-5 us, all-gather 64 KiB 5.4 vs 2.1 us). 2 MiB, about
   twice a core's L2 on the measured VM, beat 1, 4 and 8 MiB (all-gather
   1 MiB in place 30 us vs 35 us over 8 MiB; reduce-scatter 256 KiB 11 vs
   13-14 us). Larger calls stay at the start, whose lines stay cached
   (moving them too made 4 MiB all-reduces 25 % slower). All ranks count
   calls alike, so they agree. Returns the n-th offset. */
static size_t rotate(uint64_t n, size_t used, size_t total, size_t room) {
  if (room > SHM_ROTATE_REGION) room = SHM_ROTATE_REGION;
  if (total > SHM_ROTATE || used == 0 || used > room) return 0;
  return (size_t)(n % (room / used)) * used;
}

/* Offset in every rank's staging of the next staging round, which uses
   `used` bytes of a call that stages `total` bytes: the halves alternate
   (see ar_staging), and small calls rotate within a half. */
static size_t stage_slot(shm_state *s, size_t used, size_t total) {
  size_t half = s->staging / 2;
  uint64_t r = s->round++;
  return (size_t)(r & 1) * half + rotate(r >> 1, round_up(used, 4096), total, half);
}

/* Staging rounds: each rank copies a range of its input into its staging half
   (E), reduces its slice of the range from every rank's staging in rank order
   (R), then copies the other slices' results. The halves alternate by a round
   counter shared by all ranks; a half is rewritten two rounds later, after
   every rank has posted E of the round in between, which comes after it
   finished reading.
   A rank whose buffer is braid memory skips E and reduces into its own
   buffer; peers read its input slice and its result there instead of in
   staging (announced with the first post). Only rank r reads or writes slice
   r of any buffer until it posts the slice's result, and a buffer is read in
   place until the end barrier. */
static braid_status ar_staging(braid_comm *c, shm_state *s, char *buf, size_t count, braid_dtype dt, braid_op op) {
  braid_status st = staging_quiesce(c, s);
  if (st) return st;
  size_t es = braid_dtype_size(dt), half = s->staging / 2;
  size_t per_round = half / es;
  /* Keep a round's slices L2-sized so the reduce reads cached data. */
  size_t cap = ((size_t)s->n * (256u << 10)) / es;
  if (per_round > cap) per_round = cap;
  SRCS_DECL;
  /* In place from braid memory only when ranks outnumber cores: there every
     copy saved is CPU time the other ranks get (4 ranks on 2 cores, 1 MiB:
     115-136 us against 181-191 us). With a core per rank, E's streaming
     copy claims the staging lines before the reduce, which beats writing
     lines the peers have just read while reading theirs (2 ranks, 1 MiB:
     70 us staged, 90 us in place). */
  uint64_t key = s->ph + 1;
  int zme = s->oversub && shm_zc_announce(s, buf, count * es, key), nzc = 0;
  for (size_t off = 0; off < count && !st; off += per_round) {
    size_t L = count - off < per_round ? count - off : per_round;
    size_t h = stage_slot(s, L * es, count * es);
    char *stage = staging_of(s, s->me) + h;
    if (!zme) memcpy(stage, buf + off * es, L * es);
    post(s);
    if ((st = wait_all(c, s, s->ph, "its input to braid_all_reduce"))) break;
    if (off == 0 && (st = zc_gather(c, s, key, zme, zsrc, &nzc))) break;
    size_t a, m;
    slice_of(L, s->n, s->me, &a, &m);
    char *mine = zme ? buf + (off + a) * es : stage + a * es;
    if (m) {
      for (int q = 0; q < s->n; q++)
        srcs[q] = q == s->me ? mine : zsrc[q] ? zsrc[q] + (off + a) * es : staging_of(s, q) + h + a * es;
      braid__reduce(mine, srcs, s->n, m, dt, op, s->n);
    }
    post(s);
    if (m && !zme) memcpy(buf + (off + a) * es, mine, m * es);
    if ((st = wait_all(c, s, s->ph, "its reduced slice in braid_all_reduce"))) break;
    for (int q = 0; q < s->n; q++) {
      if (q == s->me) continue;
      size_t aq, mq;
      slice_of(L, s->n, q, &aq, &mq);
      if (mq)
        memcpy(buf + (off + aq) * es, zsrc[q] ? zsrc[q] + (off + aq) * es : staging_of(s, q) + h + aq * es, mq * es);
    }
  }
  SRCS_FREE;
  if (st) return st;
  post(s);
  return wait_all(c, s, s->ph, "the end of braid_all_reduce");
}

/* Single copy: each rank reduces its slice by reading every peer's buffer in
   L2-sized chunks (in place where it is braid memory) and writes the result
   into every peer's buffer, so each byte of each buffer is read once and
   written once. Only rank r touches slice r anywhere, so the phases need no
   synchronization: a start barrier (addresses published, inputs ready) and
   an end barrier (every write into this rank's buffer done). */
static braid_status ar_cma(braid_comm *c, shm_state *s, char *buf, size_t count, braid_dtype dt, braid_op op) {
  size_t es = braid_dtype_size(dt);
  shm_ctl *mine = shm_ctl_of(s, s->me);
  mine->addr = (uint64_t)(uintptr_t)buf;
  uint64_t key = s->ph + 1;
  int zme = shm_zc_announce(s, buf, count * es, key), nzc;
  post(s);
  braid_status st = wait_all(c, s, s->ph, "its buffer address in braid_all_reduce");
  if (st) return st;
  size_t a, m;
  slice_of(count, s->n, s->me, &a, &m);
  size_t chunk = s->tmp_each / es;
  SRCS_DECL;
  st = zc_gather(c, s, key, zme, zsrc, &nzc);
  for (size_t x = a; x < a + m && !st; x += chunk) {
    size_t len = a + m - x < chunk ? a + m - x : chunk;
    int k = 0;
    for (int q = 0; q < s->n && !st; q++) {
      if (q == s->me) {
        srcs[q] = buf + x * es;
        continue;
      }
      if (zsrc[q]) {
        srcs[q] = zsrc[q] + x * es;
        continue;
      }
      char *t = s->tmp + (size_t)k++ * s->tmp_each;
      st = shm_cma_read(c, s, q, t, shm_ctl_of(s, q)->addr + x * es, len * es);
      srcs[q] = t;
    }
    if (st) break;
    braid__reduce(buf + x * es, srcs, s->n, len, dt, op, s->n);
    for (int q = 0; q < s->n && !st; q++)
      if (q != s->me) st = cma_write(c, s, q, shm_ctl_of(s, q)->addr + x * es, buf + x * es, len * es);
  }
  SRCS_FREE;
  if (st) return st;
  post(s);
  return wait_all(c, s, s->ph, "the end of braid_all_reduce");
}

static braid_status shm_all_reduce(braid_comm *c, void *buf, size_t count, braid_dtype dt, braid_op op) {
  shm_state *s = state(c);
  if (s->n == 1) {
    const void *src = buf;
    braid__reduce(buf, &src, 1, count, dt, op, 1);
    return BRAID_OK;
  }
  size_t bytes = count * braid_dtype_size(dt);
  if (bytes <= SHM_SLOT_DATA) return ar_flat(c, s, buf, count, dt, op);
  if (s->cma && bytes >= s->cma_min) return ar_cma(c, s, buf, count, dt, op);
  return ar_staging(c, s, buf, count, dt, op);
}

/* ---------------------------------------------------------------- broadcast */

/* Small broadcasts go through a ring of entries shared by all roots (every
   rank runs the same broadcasts in the same order, so entry b serves the
   b-th). Nobody waits for the whole group: the root copies its data into
   the entry and returns unless the ring is full, so back-to-back broadcasts
   pipeline, which matters most when ranks outnumber cores. */
static braid_status bcast_small(braid_comm *c, shm_state *s, char *buf, size_t bytes, int root) {
  uint64_t b = s->bseq++;
  char *e = bring_of(s, b);
  if (s->me == root) {
    for (int q = 0; q < s->n; q++) {
      if (q == s->me || b < SHM_BRING) continue;
      WAIT_UNTIL(atomic_load_explicit(&shm_ctl_of(s, q)->bcast_done, memory_order_acquire) >= b - SHM_BRING + 1, q,
                 "its copy of an earlier braid_broadcast");
    }
    memcpy(slot_data(e, bytes), buf, bytes);
    atomic_store_explicit(slot_seq(e), b + 1, memory_order_release);
  } else {
    WAIT_UNTIL(atomic_load_explicit(slot_seq(e), memory_order_acquire) == b + 1, root, "the root's data in braid_broadcast");
    memcpy(buf, slot_data(e, bytes), bytes);
  }
  atomic_store_explicit(&shm_ctl_of(s, s->me)->bcast_done, b + 1, memory_order_release);
  /* After both stores: receivers wait for the entry, and whichever rank is
     root 64 broadcasts later may sleep waiting for bcast_done. */
  shm_wake_peers(s);
  return BRAID_OK;
}

/* Zero copy: the root's buffer is braid memory. It announces the buffer in
   place of the first chunk (key: the stream sequence number), each receiver
   copies the whole message straight from it and reports the chunk done, and
   the root returns once every receiver has (its buffer is free again). */
static braid_status bcast_zc_root(braid_comm *c, shm_state *s, uint64_t g) {
  shm_wake_peers(s);
  braid_status st = wait_stream(c, s, g + 1, "its copy of the root's buffer in braid_broadcast");
  if (st) return st;
  atomic_store_explicit(&shm_ctl_of(s, s->me)->stream_done, g + 1, memory_order_release);
  shm_wake_peers(s);
  return BRAID_OK;
}

static braid_status shm_broadcast(braid_comm *c, void *vbuf, size_t count, braid_dtype dt, int root) {
  shm_state *s = state(c);
  if (s->n == 1) return BRAID_OK;
  char *buf = vbuf;
  size_t bytes = count * braid_dtype_size(dt);
  if (bytes <= SHM_SLOT_DATA) return bcast_small(c, s, buf, bytes, root);
  braid_status st;
  if (s->cma && bytes >= s->cma_min) {
    shm_ctl_of(s, s->me)->addr = (uint64_t)(uintptr_t)buf;
    uint64_t key = s->ph + 1;
    if (s->me == root) shm_zc_announce(s, buf, bytes, key);
    post(s);
    if ((st = wait_all(c, s, s->ph, "its arrival in braid_broadcast"))) return st;
    if (s->me != root) {
      const char *z;
      if ((st = shm_zc_peer(c, s, root, key, &z))) return st;
      if (z) shm_copy_out(buf, z, bytes, bytes);
      else if ((st = shm_cma_read(c, s, root, buf, shm_ctl_of(s, root)->addr, bytes))) return st;
    }
    post(s);
    return wait_all(c, s, s->ph, "the end of braid_broadcast");
  }
  /* Staging: the root streams the message through its staging space in
     chunks, the others copy each chunk out as soon as it is written. Chunks
     are numbered across calls and sit in fixed slots, so the root may run
     ahead into later broadcasts while the others still copy: it reuses a slot
     once every rank is past the chunk it held, and any other collective
     that writes staging first waits for all chunks to be copied out
     (staging_quiesce). No end barrier. A root buffer in braid memory takes
     the place of the first chunk instead (bcast_zc_root). */
  size_t C = stream_chunk(s, bytes), stride = stream_stride(s), K = s->staging / stride;
  shm_ctl *rc = shm_ctl_of(s, root);
  uint64_t zkey = SHM_ZKEY_BCAST | (s->sseq + 1);
  if (s->me == root && shm_zc_announce(s, buf, bytes, zkey)) return bcast_zc_root(c, s, s->sseq++);
  for (size_t off = 0; off < bytes; off += C) {
    size_t L = bytes - off < C ? bytes - off : C;
    uint64_t g = s->sseq++;
    char *slot = staging_of(s, root) + (size_t)(g % K) * stride;
    if (s->me == root) {
      if (g >= K && (st = wait_stream(c, s, g - K + 1, "its copy of an earlier chunk of braid_broadcast"))) return st;
      memcpy(slot, buf + off, L);
    } else {
      WAIT_UNTIL(atomic_load_explicit(&rc->stream_done, memory_order_acquire) >= g + 1 ||
                     (off == 0 && atomic_load_explicit(&rc->zref.key, memory_order_acquire) == zkey),
                 root, "the root's data in braid_broadcast");
      /* stream_done passes g only after this rank is done if the root
         announced its buffer instead of streaming. */
      if (off == 0 && atomic_load_explicit(&rc->stream_done, memory_order_acquire) < g + 1) {
        const char *z;
        if ((st = shm_zc_peer(c, s, root, zkey, &z))) return st;
        if (!z) return braid__fail(c, BRAID_ERR_INTERNAL, "rank %d announced a buffer this rank cannot use", root);
        shm_copy_out(buf, z, bytes, bytes);
        off = bytes; /* the whole message came in one piece */
      } else {
        shm_copy_out(buf + off, slot, L, bytes);
      }
    }
    atomic_store_explicit(&shm_ctl_of(s, s->me)->stream_done, g + 1, memory_order_release);
    shm_wake_peers(s);
  }
  return BRAID_OK;
}

/* ---------------------------------------------------------------- all-gather */

/* Every rank copies every peer's block straight from its buffer: in place
   where the peer's buffer is braid memory, else by single copy. The
   announcement post has been made and waited for; ends with a barrier, after
   which the peers' buffers are no longer read. */
static braid_status ag_direct(braid_comm *c, shm_state *s, const void *send, char *recv, size_t bytes,
                              const char **zsrc) {
  braid_status st = BRAID_OK;
  char *mine = recv + (size_t)s->me * bytes;
  if (send != mine) shm_copy_out(mine, send, bytes, bytes * (size_t)s->n);
  for (int i = 1; i < s->n && !st; i++) {
    int q = (s->me + i) % s->n; /* spread the readers over the sources */
    if (zsrc[q]) shm_copy_out(recv + (size_t)q * bytes, zsrc[q], bytes, bytes * (size_t)s->n);
    else st = shm_cma_read(c, s, q, recv + (size_t)q * bytes, shm_ctl_of(s, q)->addr, bytes);
  }
  if (st) return st;
  post(s);
  return wait_all(c, s, s->ph, "the end of braid_all_gather");
}

static braid_status shm_all_gather(braid_comm *c, const void *send, void *vrecv, size_t count, braid_dtype dt) {
  shm_state *s = state(c);
  size_t es = braid_dtype_size(dt), bytes = count * es;
  char *recv = vrecv;
  char *mine = recv + (size_t)s->me * bytes;
  if (s->n == 1) {
    if (send != mine) memcpy(mine, send, bytes);
    return BRAID_OK;
  }
  braid_status st;
  if (bytes <= SHM_SLOT_DATA) {
    int p;
    if ((st = flat_exchange(c, s, send, bytes, &p, "its input to braid_all_gather"))) return st;
    for (int q = 0; q < s->n; q++)
      if (q != s->me) memcpy(recv + (size_t)q * bytes, slot_data(slot_of(s, q, p), bytes), bytes);
    if (send != mine) memcpy(mine, send, bytes);
    return BRAID_OK;
  }
  /* Each rank announces, with its first post, its braid memory (and, for
     single copy, its send address). Blocks in braid memory are read in
     place; when every block is, nothing is staged. Single copy serves only
     the largest blocks: staging that moves through its space (see rotate)
     beat fetching by process_vm_readv at every size measured (2 ranks in
     place: 64 KiB 2.1 vs 4.3-5.0 us, 1 MiB 37-43 vs 41-52 us, 4 MiB 118-142
     vs 167-207 us). */
  size_t pulled = bytes * (size_t)(s->n - 1);
  int cma_all = s->cma && pulled >= s->cma_min;
  uint64_t key = s->ph + 1;
  int zme = shm_zc_announce(s, send, bytes, key), nzc = 0;
  SRCS_DECL;
  if (cma_all) {
    shm_ctl_of(s, s->me)->addr = (uint64_t)(uintptr_t)send;
    post(s);
    st = wait_all(c, s, s->ph, "its input address in braid_all_gather");
    if (!st) st = zc_gather(c, s, key, zme, zsrc, &nzc);
    if (!st) st = ag_direct(c, s, send, recv, bytes, zsrc);
    SRCS_FREE;
    return st;
  }
  /* Staging: every rank streams its block through its own staging space in
     chunks; chunk j of every rank is copied out before anyone posts j as
     done (the second post of the step), and a slot is rewritten only after
     every rank has posted the chunk it held as done. Small calls start at
     a new place each time (see rotate). Blocks in braid memory are read in
     place instead. */
  if ((st = staging_quiesce(c, s))) {
    SRCS_FREE;
    return st;
  }
  size_t C = stream_chunk(s, bytes);
  if (C > bytes) C = round_up(bytes, 4096); /* one chunk: rotate by what it uses */
  size_t K = s->staging / C, nch = (bytes + C - 1) / C;
  uint64_t base = s->ph, r = rotate(s->agseq++, nch * C, bytes, K * C) / C;
  int known = 0; /* zsrc filled, from the first post on */
  for (size_t j = 0, off = 0; off < bytes && !st; j++, off += C) {
    size_t L = bytes - off < C ? bytes - off : C;
    size_t so = ((r + j) % K) * C;
    if (!zme) {
      if (j >= K && (st = wait_all(c, s, base + 2 * (j - K) + 2, "its copy of an earlier chunk of braid_all_gather")))
        break;
      memcpy(staging_of(s, s->me) + so, (const char *)send + off, L);
    }
    post(s);
    if (!known) {
      /* The first post carried the announcements. */
      if ((st = wait_all(c, s, base + 1, "its input to braid_all_gather"))) break;
      if ((st = zc_gather(c, s, key, zme, zsrc, &nzc))) break;
      known = 1;
      if (nzc == s->n) {
        st = ag_direct(c, s, send, recv, bytes, zsrc);
        SRCS_FREE;
        return st;
      }
    }
    if (send != mine) shm_copy_out(mine + off, (const char *)send + off, L, bytes * (size_t)s->n);
    for (int i = 1; i < s->n && !st; i++) {
      int q = (s->me + i) % s->n; /* spread the readers over the sources */
      if ((st = wait_flag(c, s, q, base + 2 * j + 1, "its input to braid_all_gather"))) break;
      const char *from = zsrc[q] ? zsrc[q] + off : staging_of(s, q) + so;
      shm_copy_out(recv + (size_t)q * bytes + off, from, L, bytes * (size_t)s->n);
    }
    if (!st) post(s);
  }
  SRCS_FREE;
  if (st) return st;
  post(s);
  return wait_all(c, s, s->ph, "the end of braid_all_gather");
}

/* ---------------------------------------------------------------- reduce-scatter */

static braid_status shm_reduce_scatter(braid_comm *c, const void *vsend, void *vrecv, size_t count, braid_dtype dt,
                                       braid_op op) {
  shm_state *s = state(c);
  const char *send = vsend;
  char *recv = vrecv;
  size_t es = braid_dtype_size(dt), bytes = count * es;
  if (s->n == 1) {
    braid__reduce(recv, (const void *const *)&send, 1, count, dt, op, 1);
    return BRAID_OK;
  }
  braid_status st = BRAID_OK;
  SRCS_DECL;
  if (bytes * (size_t)s->n <= SHM_SLOT_DATA) {
    int p;
    st = flat_exchange(c, s, send, bytes * (size_t)s->n, &p, "its input to braid_reduce_scatter");
    if (!st) {
      for (int q = 0; q < s->n; q++)
        srcs[q] = (q == s->me ? send : slot_data(slot_of(s, q, p), bytes * (size_t)s->n)) + (size_t)s->me * bytes;
      braid__reduce(recv, srcs, s->n, count, dt, op, s->n);
    }
    SRCS_FREE;
    return st;
  }
  uint64_t key = s->ph + 1;
  int zme = shm_zc_announce(s, send, bytes * (size_t)s->n, key), nzc;
  if (s->cma && bytes * (size_t)s->n >= s->cma_min) {
    shm_ctl_of(s, s->me)->addr = (uint64_t)(uintptr_t)send;
    post(s);
    if ((st = wait_all(c, s, s->ph, "its input address in braid_reduce_scatter")) ||
        (st = zc_gather(c, s, key, zme, zsrc, &nzc))) {
      SRCS_FREE;
      return st;
    }
    size_t chunk = s->tmp_each / es;
    for (size_t x = 0; x < count && !st; x += chunk) {
      size_t len = count - x < chunk ? count - x : chunk;
      int k = 0;
      for (int q = 0; q < s->n && !st; q++) {
        size_t at = ((size_t)s->me * count + x) * es; /* piece me of q's input */
        if (q == s->me || zsrc[q]) {
          srcs[q] = (q == s->me ? send : zsrc[q]) + at;
          continue;
        }
        char *t = s->tmp + (size_t)k++ * s->tmp_each;
        st = shm_cma_read(c, s, q, t, shm_ctl_of(s, q)->addr + at, len * es);
        srcs[q] = t;
      }
      if (!st) braid__reduce(recv + x * es, srcs, s->n, len, dt, op, s->n);
    }
    SRCS_FREE;
    if (st) return st;
    post(s);
    return wait_all(c, s, s->ph, "the end of braid_reduce_scatter");
  }
  /* Staging rounds over the chunk dimension: each rank stages its n pieces of
     the round, then reduces its own piece from every rank's staging. An input
     in braid memory is read in place instead (announced with the first post). */
  if ((st = staging_quiesce(c, s))) {
    SRCS_FREE;
    return st;
  }
  size_t half = s->staging / 2;
  size_t per_round = half / (es * (size_t)s->n);
  if (per_round == 0) per_round = 1; /* staging is at least 64 KiB, es at most 16: never reached for n <= 2048 */
  for (size_t off = 0; off < count && !st; off += per_round) {
    size_t L = count - off < per_round ? count - off : per_round;
    size_t h = stage_slot(s, L * es * (size_t)s->n, count * es * (size_t)s->n);
    char *stage = staging_of(s, s->me) + h;
    if (!zme)
      for (int q = 0; q < s->n; q++) memcpy(stage + (size_t)q * L * es, send + ((size_t)q * count + off) * es, L * es);
    post(s);
    if ((st = wait_all(c, s, s->ph, "its input to braid_reduce_scatter"))) break;
    if (off == 0 && (st = zc_gather(c, s, key, zme, zsrc, &nzc))) break;
    for (int q = 0; q < s->n; q++) {
      if (q == s->me ? zme : zsrc[q] != NULL)
        srcs[q] = (q == s->me ? send : zsrc[q]) + ((size_t)s->me * count + off) * es;
      else
        srcs[q] = staging_of(s, q) + h + (size_t)s->me * L * es;
    }
    braid__reduce(recv + off * es, srcs, s->n, L, dt, op, s->n);
  }
  SRCS_FREE;
  if (st) return st;
  post(s);
  return wait_all(c, s, s->ph, "the end of braid_reduce_scatter");
}

/* ---------------------------------------------------------------- sync & barrier */

static braid_status shm_sync(braid_comm *c) { return shm_p2p_sync(c, c->timeout_s, 0); }

static braid_status shm_barrier(braid_comm *c) {
  shm_state *s = state(c);
  braid_status st = shm_p2p_sync(c, c->timeout_s, 0);
  if (st) return st;
  if (s->n == 1) return BRAID_OK;
  int p;
  return flat_exchange(c, s, NULL, 0, &p, "its arrival at braid_barrier");
}

const braid__backend_ops braid__shm_ops = {
    .name = "shm",
    .init = shm_init,
    .split = shm_split,
    .destroy = shm_destroy,
    .abort = shm_abort,
    .send = shm_p2p_send,
    .recv = shm_p2p_recv,
    .sync = shm_sync,
    .barrier = shm_barrier,
    .all_reduce = shm_all_reduce,
    .broadcast = shm_broadcast,
    .all_gather = shm_all_gather,
    .reduce_scatter = shm_reduce_scatter,
    .stream = NULL,
};
