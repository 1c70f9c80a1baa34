/* shm: the segment (layout, creation, attaching), init, split, destroy,
   abort, and the backend's table. See docs/SHM.md for the design. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "backends/backends.h"
#include "backends/shm/shm.h"
#include "bootstrap/bootstrap.h"
#include "core/params.h"
#include "core/subcomm.h"
#include "os/time.h"

#define SHM_MAGIC 0x62726169642d736eULL /* changes with the layout */

static uint64_t probe_value = 0x5eedf00dcafe1234ULL;

typedef struct layout {
  size_t off_ctl, off_dlog, off_slots, off_bring, off_staging, off_rings, total;
} layout;

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static layout compute_layout(int n, size_t staging) {
  layout l;
  size_t nn = (size_t)n;
  l.off_ctl = round_up(sizeof(shm_hdr), 4096);
  l.off_dlog = round_up(l.off_ctl + nn * sizeof(shm_ctl), 4096);
  l.off_slots = round_up(l.off_dlog + nn * SHM_DLOG * sizeof(shm_dlog), 4096);
  l.off_bring = round_up(l.off_slots + nn * 2 * SHM_SLOT_BYTES, 4096);
  l.off_staging = round_up(l.off_bring + (size_t)SHM_BRING * SHM_SLOT_BYTES, 4096);
  l.off_rings = round_up(l.off_staging + nn * staging, 4096);
  l.total = round_up(l.off_rings + nn * nn * (sizeof(shm_ring) + SHM_RING_BYTES), 4096);
  return l;
}

/* Removes segments of this user whose creator has exited: a job that died
   before every rank attached (the name goes only when all have) leaves its
   segment behind, and the next start on the host cleans it up. */
static void remove_stale(void) {
  DIR *d = opendir("/dev/shm");
  if (!d) return;
  unsigned me = (unsigned)getuid();
  struct dirent *e;
  while ((e = readdir(d))) {
    unsigned uid;
    int pid;
    if (sscanf(e->d_name, "braid-%u-%d-", &uid, &pid) != 2 || uid != me || pid <= 0) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    char name[300];
    snprintf(name, sizeof name, "/%s", e->d_name);
    if (shm_unlink(name) == 0) BLOG_INFO(BRAID_SUB_SHM, -1, "removed %s, left by a job whose pid %d exited", name, pid);
  }
  closedir(d);
}

static int reserve(int fd, size_t total) {
  int e;
  do e = posix_fallocate(fd, 0, (off_t)total);
  while (e == EINTR);
  return e;
}

/* Creates the segment with its pages reserved, so a full /dev/shm fails
   here instead of as SIGBUS in the middle of a collective. When the
   filesystem cannot hold the requested staging, staging shrinks by halves
   down to SHM_MIN_STAGING (peers read the size from the header). */
static braid_status seg_create(braid_comm *c, shm_state *s, const char *name) {
  remove_stale();
  int fd = -1;
  for (int tries = 0; tries < 2; tries++) {
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0 || errno != EEXIST) break;
    shm_unlink(name); /* left behind by a job that was killed while starting */
  }
  if (fd < 0) return braid__fail(c, BRAID_ERR_SYSTEM, "shm_open(%s) failed: %s", name, strerror(errno));
  size_t want = s->staging;
  layout l = compute_layout(s->n, s->staging);
  int e = 0;
  for (;;) {
    l = compute_layout(s->n, s->staging);
    if (ftruncate(fd, (off_t)l.total) != 0) {
      e = errno;
      close(fd);
      shm_unlink(name);
      return braid__fail(c, BRAID_ERR_SYSTEM, "ftruncate of the %zu-byte segment %s failed: %s", l.total, name,
                         strerror(e));
    }
    if ((e = reserve(fd, l.total)) == 0) break;
    if ((e != ENOSPC && e != ENOMEM && e != EFBIG) || s->staging <= SHM_MIN_STAGING) break;
    s->staging = s->staging / 2 / 4096 * 4096;
    if (s->staging < SHM_MIN_STAGING) s->staging = SHM_MIN_STAGING;
    if (ftruncate(fd, 0) != 0) break; /* give the reservation back before trying less */
  }
  if (e) {
    struct statvfs vs;
    size_t avail = fstatvfs(fd, &vs) == 0 ? (size_t)vs.f_bavail * vs.f_frsize : 0;
    close(fd);
    shm_unlink(name);
    if (e == ENOSPC || e == ENOMEM || e == EFBIG)
      return braid__fail(c, BRAID_ERR_NO_MEMORY,
                         "the shared-memory segment of %d ranks needs %zu bytes even with the smallest staging "
                         "(BRAID_SHM_BUFFER=%zuK per rank) but /dev/shm has %zu bytes free: give /dev/shm more room "
                         "(docker run --shm-size=..., or a larger tmpfs) or run fewer ranks per host",
                         s->n, l.total, (size_t)SHM_MIN_STAGING >> 10, avail);
    return braid__fail(c, BRAID_ERR_SYSTEM, "reserving the %zu-byte segment %s failed: %s", l.total, name,
                       strerror(e));
  }
  if (s->staging < want)
    BLOG_WARN(BRAID_SUB_SHM, c->rank,
              "/dev/shm cannot hold %zu bytes of staging per rank for %d ranks: using %zu (large collectives take "
              "more rounds; give /dev/shm more room, e.g. docker run --shm-size, to restore BRAID_SHM_BUFFER)",
              want, s->n, s->staging);
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
  s->hdr->off_dlog = l.off_dlog;
  s->hdr->off_slots = l.off_slots;
  s->hdr->off_bring = l.off_bring;
  s->hdr->off_staging = l.off_staging;
  s->hdr->off_rings = l.off_rings;
  atomic_store_explicit(&s->hdr->magic, SHM_MAGIC, memory_order_release);
  return BRAID_OK;
}

/* While ranks meet (before pidfds exist): a rank whose process exited
   fails the start for everyone waiting, naming it, instead of the wait
   running to the deadline. ranks: which to look at (-1: every other). */
static braid_status startup_check(braid_comm *c, shm_state *s, int which, const char *during) {
  /* The job's own record first: it names every rank gone, so a rank that
     ended after its own start failed on a death does not hide that death. */
  braid_status st = braid__start_check(c, during);
  if (st) return st;
  for (int q = which < 0 ? 0 : which; q < (which < 0 ? s->n : which + 1); q++) {
    if (q == s->me) continue;
    int32_t pid = s->hdr ? shm_ctl_of(s, q)->pid : 0;
    if (!pid) pid = (int32_t)s->pids[q];
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
      return braid__fail(c, BRAID_ERR_PEER_LOST, "rank %d (pid %d) died during %s", braid__label(c, q), (int)pid,
                         during);
  }
  return BRAID_OK;
}

/* Sleeps between looks at a condition other processes change: short at
   first (ranks usually meet within a millisecond), then up to 1 ms, so a
   long wait costs little CPU. */
static void backoff(double *d) {
  braid__sleep(*d);
  *d = *d * 2 > 1e-3 ? 1e-3 : *d * 2;
}

/* Opens a segment another rank creates; waits for it to appear and be ready. */
static braid_status seg_open(braid_comm *c, shm_state *s, const char *name, double deadline) {
  double next_warn = braid__now() + 5.0, next_check = braid__now() + 0.1, pause = 20e-6;
  for (;;) {
    if (braid__aborted(c)) return braid__fail(c, BRAID_ERR_ABORTED, "aborted while opening segment %s", name);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd >= 0) {
      struct stat sb;
      /* Mapped only once the creator reserved every page: reading a hole
         of a full tmpfs is a SIGBUS, and a creator that finds no room
         shrinks the file and removes it. */
      if (fstat(fd, &sb) == 0 && sb.st_size >= (off_t)sizeof(shm_hdr) && (off_t)sb.st_blocks * 512 >= sb.st_size) {
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
    if (now >= next_check) {
      next_check = now + 0.1;
      braid_status st = startup_check(c, s, 0, "the start of a communicator, before it created the shared-memory segment");
      if (st) return st;
    }
    backoff(&pause);
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

static void state_free(shm_state *s) {
  if (!s) return;
  shm_zc_free(s);
  shm_pipes_free(s);
  if (s->base) munmap(s->base, s->total);
  for (int q = 0; q < s->n && s->pidfds; q++)
    if (s->pidfds[q] >= 0) close(s->pidfds[q]);
  free(s->pids);
  free(s->pidfds);
  free(s->ctrl_q);
  free(s->stalled);
  free(s->cur);
  free(s->zmaps);
  free(s->zepoch);
  free(s->tmp);
  free(s);
}

static shm_state *state_new(int n, int me) {
  shm_state *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->n = n;
  s->me = me;
  s->pids = calloc((size_t)n, sizeof *s->pids);
  s->pidfds = calloc((size_t)n, sizeof *s->pidfds);
  s->ctrl_q = calloc((size_t)n, sizeof *s->ctrl_q);
  s->stalled = calloc((size_t)n, sizeof *s->stalled);
  s->cur = calloc((size_t)n, sizeof *s->cur);
  s->zmaps = calloc((size_t)n * SHM_ZMAP_CAP, sizeof *s->zmaps);
  s->zepoch = calloc((size_t)n, sizeof *s->zepoch);
  s->pipes = calloc((size_t)n, sizeof *s->pipes);
  s->sends_tail = &s->sends;
  s->ring_last_root = -1;
  s->hroot[0] = s->hroot[1] = -1;
  for (int q = 0; q < n && s->pidfds; q++) s->pidfds[q] = -1;
  for (int q = 0; q < n && s->pipes; q++)
    for (int i = 0; i < 2; i++) s->pipes[q].rd[i] = s->pipes[q].wr[i] = s->pipes[q].out[i] = -1;
  if (!s->pids || !s->pidfds || !s->ctrl_q || !s->stalled || !s->cur || !s->zmaps || !s->zepoch || !s->pipes) {
    state_free(s);
    return NULL;
  }
  return s;
}

/* Oversubscribed cores: spinning only delays the rank waited for, which may
   be queued on this very core (docs/SHM.md: yielding at once won there).
   What counts is every rank of the job on this host, not only this
   communicator's (a backend's node-local part is smaller than the host's
   share of the job). */
static void set_waiting(braid_comm *c, shm_state *s) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int here = c->boot && c->boot->local_size > s->n ? c->boot->local_size : s->n;
  s->oversub = ncpu > 0 && here > ncpu;
  c->spin_limit = s->oversub ? 1 : 4096;
  c->yield_s = 2e-3;
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

/* A communicator exists once every rank posted its arrival. A rank that
   went on may fail or abort it before this one sees the last post: that
   failure stays recorded (the first call reports it) but does not undo a
   start that completed on every rank. */
static braid_status wait_arrivals(braid_comm *c, shm_state *s, const char *what) {
  braid_status st = shm_wait_all(c, s, s->ph, what);
  for (int q = 0; st && q < s->n; q++)
    if (atomic_load_explicit(&shm_ctl_of(s, q)->flag, memory_order_acquire) < s->ph) return st;
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
  double next_check = braid__now() + 0.1, pause = 20e-6;
  while (atomic_load(&s->hdr->attached) < (uint32_t)s->n) {
    if (braid__aborted(c)) return braid__fail(c, BRAID_ERR_ABORTED, "aborted while waiting for ranks to attach");
    double now = braid__now();
    if (now >= deadline) {
      if (s->me == 0) shm_unlink(name);
      return braid__fail(c, BRAID_ERR_TIMEOUT, "timed out after %g s: %u of %d ranks attached to segment %s",
                         c->timeout_s, atomic_load(&s->hdr->attached), s->n, name);
    }
    if (now >= next_check) {
      next_check = now + 0.1;
      braid_status st = startup_check(c, s, -1, "the start of a communicator, before every rank attached");
      if (st) {
        /* The start fails on every rank: the name of a segment some rank
           will never map goes now, not at a later start. */
        shm_unlink(name);
        return st;
      }
    }
    backoff(&pause);
  }
  for (int q = 0; q < s->n; q++) s->pids[q] = shm_ctl_of(s, q)->pid;
  open_pidfds(s);
  s->mine = shm_ctl_of(s, s->me);
  s->my_dlog = shm_dlog_of(s, s->me);
  return BRAID_OK;
}

typedef struct shm_params {
  size_t staging, cma_min;
  int a2a;
  long cma, membar, zc, splice;
} shm_params;

static braid_status read_params(braid_comm *c, shm_params *p) {
  char err[256];
  braid_status st = braid__param_size(BRAID_P_SHM_BUFFER, SHM_MIN_STAGING, (size_t)1 << 40, &p->staging, err, sizeof err);
  if (!st) st = braid__param_int(BRAID_P_SHM_CMA, 0, 1, &p->cma, err, sizeof err);
  if (!st) st = braid__param_int(BRAID_P_SHM_MEMBARRIER, 0, 1, &p->membar, err, sizeof err);
  if (!st) st = braid__param_int(BRAID_P_SHM_ZEROCOPY, 0, 1, &p->zc, err, sizeof err);
  if (!st) st = braid__param_int(BRAID_P_SHM_SPLICE, 0, 1, &p->splice, err, sizeof err);
  if (!st) st = braid__param_size(BRAID_P_SHM_CMA_MIN, 0, SIZE_MAX, &p->cma_min, err, sizeof err);
  if (st) return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s", err);
  if ((p->a2a = shm_a2a_mode(braid__param_str(BRAID_P_SHM_A2A))) < 0)
    return braid__fail(c, BRAID_ERR_INVALID_ARG, "BRAID_SHM_A2A=\"%s\" is not auto, staged or single",
                       braid__param_str(BRAID_P_SHM_A2A));
  p->staging = round_up(p->staging, 4096);
  return BRAID_OK;
}

static void log_setup(braid_comm *c, const shm_state *s) {
  BLOG_INFO(BRAID_SUB_SHM, c->rank,
            "shm: %d ranks, segment %zu bytes, staging %zu bytes per rank, large transfers %s, braid_mem_alloc "
            "buffers %s, wake-ups %s",
            s->n, s->total, s->staging,
            s->cma      ? "single-copy (process_vm_readv/writev)"
            : s->splice ? "copied through shared memory, large messages read from pipes (vmsplice)"
                        : "copied through shared memory",
            s->zc ? "read in place by peers (zero copy)" : "copied like other memory",
            s->light_wake ? "paired with membarrier (no fence on the sending side)" : "fenced on both sides");
  char cma_from[64] = "never (no single copy)";
  if (s->cma) snprintf(cma_from, sizeof cma_from, "from %zu bytes", s->cma_min);
  BLOG_INFO(BRAID_SUB_SHM, c->rank,
            "shm algorithms: up to %u bytes per rank flat slot exchange (broadcast: a ring, the root does not wait); "
            "above, all-reduce and reduce-scatter in staging rounds, broadcast and all-gather streamed in 64-256 KiB "
            "chunks; collectives by single copy %s; send/recv eager up to %u bytes, then %s",
            SHM_SLOT_DATA, cma_from, SHM_EAGER_MAX,
            s->cma ? "pulled by single copy" : s->splice ? "read from a pipe the sender vmsplices into"
                                                         : "streamed through the pair's ring");
}

static braid_status shm_init(braid_comm *c) {
  shm_state *s = state_new(c->size, c->rank);
  if (!s) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for the shm backend");
  shm_params prm;
  braid_status st = read_params(c, &prm);
  /* Whatever can fail on one rank alone comes before the segment: once
     attached, the others wait for this rank's arrival in the segment. */
  if (!st) st = alloc_tmp(c, s);
  if (st) {
    state_free(s);
    return st;
  }
  s->staging = prm.staging;
  s->cma_min = prm.cma_min;
  s->a2a_mode = prm.a2a;
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
      st = braid__start_get(c, key, &v, &vlen, deadline, "the segment name from rank 0",
                            "the start of a communicator, while rank 0 created the shared-memory segment");
      if (!st) snprintf(name, sizeof name, "%.*s", (int)(vlen < sizeof name ? vlen : sizeof name - 1), (char *)v);
      free(v);
    }
    if (!st) st = seg_open(c, s, name, deadline);
  }
  if (!st) st = attach_and_meet(c, s, name, deadline);
  if (st) {
    state_free(s);
    return st;
  }
  c->be = s;
  set_waiting(c, s);
  /* Probe single copy on the next rank's known address; all must agree. */
  shm_ctl *mine = shm_ctl_of(s, s->me);
  int ok = 0;
  if (prm.cma && s->n > 1) {
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
  int zok = prm.zc && s->n > 1 && shm_zc_probe(s, (s->me + 1) % s->n);
  if (prm.zc && s->n > 1 && !zok)
    BLOG_INFO(BRAID_SUB_SHM, c->rank, "cannot map rank %d's braid_mem_alloc memory: no zero copy",
              (s->me + 1) % s->n);
  atomic_store(&mine->zc_ok, zok ? 1u : 2u);
  atomic_store(&mine->membar, prm.membar && shm_membarrier_register() ? 1u : 2u);
  int sok = prm.splice && s->n > 1 && shm_splice_probe();
  if (prm.splice && s->n > 1 && !sok)
    BLOG_INFO(BRAID_SUB_SHM, c->rank, "vmsplice into a pipe failed: no pipes for large messages");
  atomic_store(&mine->splice_ok, sok ? 1u : 2u);
  shm_post(s);
  st = wait_arrivals(c, s, "its arrival in braid_init");
  if (st) {
    c->be = NULL;
    state_free(s);
    return st;
  }
  s->cma = s->n > 1;
  s->zc = s->n > 1;
  s->light_wake = 1;
  s->splice = s->n > 1;
  for (int q = 0; q < s->n; q++) {
    if (atomic_load(&shm_ctl_of(s, q)->splice_ok) != 1) s->splice = 0;
    if (atomic_load(&shm_ctl_of(s, q)->cma_ok) != 1) s->cma = 0;
    if (atomic_load(&shm_ctl_of(s, q)->zc_ok) != 1) s->zc = 0;
    if (atomic_load(&shm_ctl_of(s, q)->membar) != 1) s->light_wake = 0;
  }
  if (s->cma) s->splice = 0;
  c->fail_flag = &s->hdr->fail.ready;
  log_setup(c, s);
  return BRAID_OK;
}

static braid_status shm_split(braid_comm *parent, braid_comm *child, const int *members, int n) {
  shm_state *ps = parent->be;
  shm_state *s = state_new(n, child->rank);
  if (!s) return braid__fail(child, BRAID_ERR_NO_MEMORY, "out of memory for the shm backend");
  s->staging = ps->staging;
  s->cma_min = ps->cma_min;
  s->a2a_mode = ps->a2a_mode;
  for (int i = 0; i < n; i++) s->pids[i] = ps->pids[members[i]];
  char name[128];
  /* The creator's pid plus the child id make a name no other live job uses. */
  snprintf(name, sizeof name, "/braid-%u-%d-%llx", (unsigned)getuid(), (int)ps->pids[members[0]],
           (unsigned long long)child->id);
  double deadline = braid__deadline(child->timeout_s);
  /* As in shm_init: what one rank alone can fail comes before attaching. */
  braid_status st = alloc_tmp(child, s);
  if (!st) st = child->rank == 0 ? seg_create(child, s, name) : seg_open(child, s, name, deadline);
  if (!st) st = attach_and_meet(child, s, name, deadline);
  if (st) {
    state_free(s);
    return st;
  }
  child->be = s;
  set_waiting(child, s);
  shm_post(s);
  st = wait_arrivals(child, s, "its arrival in braid_split");
  if (st) {
    child->be = NULL;
    state_free(s);
    return st;
  }
  s->cma = ps->cma && n > 1;
  s->zc = ps->zc && n > 1;
  s->splice = ps->splice && n > 1;
  s->light_wake = ps->light_wake;
  child->fail_flag = &s->hdr->fail.ready;
  return BRAID_OK;
}

static void shm_destroy(braid_comm *c, double timeout_s) {
  (void)timeout_s; /* the core completed what it could */
  shm_state *s = c->be;
  if (!s) return;
  c->fail_flag = NULL;
  shm_p2p_free(c, s);
  atomic_store(&shm_ctl_of(s, s->me)->left, 1);
  shm_wake_peers(s);
  state_free(s);
  c->be = NULL;
}

static void shm_abort(braid_comm *c) {
  shm_state *s = c->be;
  if (!s) return;
  shm_fail_publish(s, BRAID_ERR_ABORTED, s->me, "braid_abort: communicator aborted by the application");
  shm_wake_all_hard(s);
}

const braid__backend braid__shm_backend = {
    .name = "shm",
    .caps = BRAID__CAP_NEEDS_STORE | BRAID__CAP_ONE_HOST,
    .dtypes = BRAID__ALL_DTYPES,
    .req_size = sizeof(shm_req),
    .umsg_size = sizeof(shm_umsg),
    .init = shm_init,
    .split = shm_split,
    .destroy = shm_destroy,
    .abort = shm_abort,
    .isend = shm_isend,
    .irecv = shm_irecv,
    .progress = shm_progress,
    .take = shm_take,
    .release_umsg = shm_release_umsg,
    .arm = shm_arm,
    .sleep = shm_sleep,
    .disarm = shm_disarm,
    .check_peers = shm_check_peers,
    .remote_failure = shm_remote_failure,
    .publish_failure = shm_publish_failure,
    .peer_desc = shm_peer_desc,
    .coll_start = shm_coll_start,
    .barrier = shm_barrier,
    .all_reduce = shm_all_reduce,
    .broadcast = shm_broadcast,
    .all_gather = shm_all_gather,
    .reduce_scatter = shm_reduce_scatter,
    .declines = shm_declines,
    .before_generic = shm_settle,
    .reduce = shm_reduce,
    .gather = shm_gather,
    .scatter = shm_scatter,
    .all_to_all = shm_all_to_all,
    .all_to_allv = shm_all_to_allv,
    .stream = NULL,
};
