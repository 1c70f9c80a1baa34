/* shm: the waiting hooks of the transport contract (futex doorbells paired
   with membarrier), peer liveness, failures published in the segment, the
   log of collectives peers read for the cross-rank check, and single copy. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "backends/shm/shm.h"

/* ---------------------------------------------------------------- futex */

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

void shm_wake_all_hard(shm_state *s) {
  for (int q = 0; q < s->n; q++) {
    shm_ctl *k = shm_ctl_of(s, q);
    atomic_fetch_add(&k->futex, 1);
    futex_wake(&k->futex);
  }
}

static pthread_once_t membar_once = PTHREAD_ONCE_INIT;
static int membar_ok;

static void membar_register(void) {
  long q = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (q < 0 || !(q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) || !(q & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED)) return;
  membar_ok = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
}

int shm_membarrier_register(void) {
  pthread_once(&membar_once, membar_register);
  return membar_ok;
}

/* ---------------------------------------------------------------- sleeping */

/* Announce, then the caller re-checks its condition before sleeping: a
   waker that missed the announcement posted before the re-check. */
int shm_arm(braid_comm *c) {
  shm_state *s = c->be;
  shm_ctl *k = shm_ctl_of(s, s->me);
  /* The doorbell's value before announcing: a wake-up after the
     announcement changes it, so the sleep returns at once. */
  s->fval = atomic_load(&k->futex);
  atomic_store(&k->sleeping, 1);
  if (s->light_wake) {
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) != 0) {
      /* Without the barrier a wake-up could be missed: keep polling. */
      atomic_store(&k->sleeping, 0);
      return 0;
    }
  } else {
    atomic_thread_fence(memory_order_seq_cst);
  }
  return 1;
}

void shm_sleep(braid_comm *c, double slice_s) {
  shm_state *s = c->be;
  shm_ctl *k = shm_ctl_of(s, s->me);
  futex_wait(&k->futex, s->fval, slice_s);
  atomic_store(&k->sleeping, 0);
}

void shm_disarm(braid_comm *c) {
  shm_state *s = c->be;
  atomic_store(&shm_ctl_of(s, s->me)->sleeping, 0);
}

/* ---------------------------------------------------------------- liveness */

int shm_peer_dead(shm_state *s, int q) {
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

braid_status shm_check_peers(braid_comm *c, int peer, const char *what) {
  shm_state *s = c->be;
  for (int q = 0; q < s->n; q++) {
    if (q == s->me) continue;
    int left = atomic_load(&shm_ctl_of(s, q)->left) != 0;
    if (left && q == peer && s->left_grace != q + 1) {
      /* It stores "left" after everything else it publishes: the caller
         looks at its condition once more before this counts. */
      s->left_grace = q + 1;
      return BRAID_OK;
    }
    /* A peer that failed before it left or died said why: that is the
       error (its failure reaches the store before it leaves). */
    const int dead = !left && shm_peer_dead(s, q);
    if (((left && q == peer) || dead) && braid__poll_remote_failure(c, 1)) return (braid_status)atomic_load(&c->failed);
    if (left && q == peer)
      return braid__fail(c, BRAID_ERR_PEER_LOST,
                         "rank %d (pid %d) destroyed its communicator during %s while this rank waited for it: %s",
                         braid__label(c, q), (int)s->pids[q], c->call, what);
    if (dead)
      return braid__fail(c, BRAID_ERR_PEER_LOST, "rank %d (pid %d) died during %s (this rank was waiting for rank %d: %s)",
                         braid__label(c, q), (int)s->pids[q], c->call, braid__label(c, peer), what);
  }
  return BRAID_OK;
}

/* ---------------------------------------------------------------- failures */

void shm_fail_publish(shm_state *s, braid_status st, int origin, const char *text) {
  shm_fail *f = &s->hdr->fail;
  uint32_t zero = 0;
  if (!atomic_compare_exchange_strong(&f->claim, &zero, 1)) return;
  f->status = (int32_t)st;
  f->origin = origin;
  snprintf(f->text, sizeof f->text, "%s", text);
  atomic_store_explicit(&f->ready, 1, memory_order_release);
  shm_wake_all_hard(s);
}

void shm_publish_failure(braid_comm *c, braid_status st, const char *text) {
  shm_state *s = c->be;
  shm_fail_publish(s, st, s->me, text);
}

int shm_remote_failure(braid_comm *c, braid_status *st, int *origin, char *text, size_t len) {
  shm_state *s = c->be;
  shm_fail *f = &s->hdr->fail;
  if (!atomic_load_explicit(&f->ready, memory_order_acquire)) return 0;
  if (f->origin == s->me) return 0; /* this rank's own: it failed already */
  *st = (braid_status)f->status;
  *origin = f->origin;
  snprintf(text, len, "%.*s", (int)sizeof f->text, f->text);
  return 1;
}

/* ---------------------------------------------------------------- the call log */

void shm_dlog_enter(braid_comm *c, shm_state *s) {
  shm_dlog *e = &s->my_dlog[c->seq % SHM_DLOG];
  atomic_store_explicit(&e->seq, 0, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  e->desc = c->desc;
  atomic_store_explicit(&e->seq, c->seq, memory_order_release);
}

int shm_peer_desc(braid_comm *c, int peer, uint64_t seq, braid__desc *out) {
  shm_state *s = c->be;
  shm_dlog *e = &shm_dlog_of(s, peer)[seq % SHM_DLOG];
  uint64_t a = atomic_load_explicit(&e->seq, memory_order_acquire);
  if (a != seq) return 0;
  braid__desc d = e->desc;
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(&e->seq, memory_order_relaxed) != seq) return 0;
  *out = d;
  return 1;
}

/* ---------------------------------------------------------------- single copy */

static braid_status cma_error(braid_comm *c, shm_state *s, int q, int err, const char *dir) {
  if (braid__poll_remote_failure(c, 0)) return (braid_status)atomic_load(&c->failed);
  if (err == ESRCH || shm_peer_dead(s, q))
    return braid__fail(c, BRAID_ERR_PEER_LOST, "rank %d (pid %d) died during %s", braid__label(c, q), (int)s->pids[q],
                       c->call);
  /* The peer waits for this transfer: the communicator fails for all. */
  return braid__fail_comm(c, BRAID_ERR_SYSTEM, "process_vm_%s from rank %d (pid %d) failed: %s", dir,
                          braid__label(c, q), (int)s->pids[q], strerror(err));
}

/* A failure published in the segment: once a peer has failed it may have
   returned and reused its buffers, so no transfer starts after it, and a
   transfer that ran across it does not count. */
static braid_status failed_meanwhile(braid_comm *c, shm_state *s) {
  if (atomic_load_explicit(&s->hdr->fail.ready, memory_order_acquire) && braid__poll_remote_failure(c, 0))
    return (braid_status)atomic_load(&c->failed);
  return BRAID_OK;
}

static braid_status cma_xfer(braid_comm *c, shm_state *s, int q, void *local, uint64_t remote, size_t len, int write) {
  braid_status st = failed_meanwhile(c, s);
  if (st) return st;
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
  return failed_meanwhile(c, s);
}

braid_status shm_cma_read(braid_comm *c, shm_state *s, int q, void *local, uint64_t remote, size_t len) {
  return cma_xfer(c, s, q, local, remote, len, 0);
}

braid_status shm_cma_write(braid_comm *c, shm_state *s, int q, uint64_t remote, const void *local, size_t len) {
  return cma_xfer(c, s, q, (void *)local, remote, len, 1);
}
