/* braid_mem_alloc / braid_mem_free. Each allocation is a memfd mapped shared:
   a peer on the same host opens it through /proc/<pid>/fd/<fd> and maps it,
   so a backend can copy straight out of the owner's buffer. memfds have no
   name in /dev/shm (nothing can leak there, and container limits on /dev/shm
   do not apply); the memory goes when the owner and every mapping are gone. */
#include "core/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/comm.h"

typedef struct region {
  uintptr_t base;
  size_t len;
  int fd; /* -1: memfds unavailable, plain shared anonymous memory */
  uint64_t gen;
} region;

static pthread_rwlock_t reg_lock = PTHREAD_RWLOCK_INITIALIZER;
static region *regs; /* sorted by base */
static size_t nregs, capregs;
static uint64_t next_gen;
static _Atomic size_t live;          /* nregs, readable without the lock */
static _Atomic uint64_t free_epoch;  /* braid_mem_free calls so far */

static size_t find_index(uintptr_t p) {
  /* First region whose base is above p, minus one. */
  size_t lo = 0, hi = nregs;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (regs[mid].base <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo ? lo - 1 : SIZE_MAX;
}

int braid__mem_find(const void *p, size_t len, braid__mem_ref *out) {
  if (atomic_load_explicit(&live, memory_order_relaxed) == 0 || !p) return 0;
  uintptr_t a = (uintptr_t)p;
  int found = 0;
  pthread_rwlock_rdlock(&reg_lock);
  size_t i = find_index(a);
  if (i != SIZE_MAX) {
    const region *r = &regs[i];
    if (r->fd >= 0 && a - r->base <= r->len && len <= r->len - (a - r->base)) {
      out->gen = r->gen;
      out->base = (uint64_t)r->base;
      out->len = (uint64_t)r->len;
      out->fd = r->fd;
      out->epoch = atomic_load(&free_epoch);
      found = 1;
    }
  }
  pthread_rwlock_unlock(&reg_lock);
  return found;
}

static int insert(const region *r) {
  if (nregs == capregs) {
    size_t cap = capregs ? 2 * capregs : 16;
    region *n = realloc(regs, cap * sizeof *n);
    if (!n) return -1;
    regs = n;
    capregs = cap;
  }
  size_t i = nregs;
  while (i > 0 && regs[i - 1].base > r->base) {
    regs[i] = regs[i - 1];
    i--;
  }
  regs[i] = *r;
  nregs++;
  atomic_store(&live, nregs);
  return 0;
}

braid_status braid_mem_alloc(void **ptr, size_t size) {
  if (!ptr) return braid__fail_caller(BRAID_ERR_INVALID_ARG, "braid_mem_alloc: ptr is NULL");
  *ptr = NULL;
  long pg = sysconf(_SC_PAGESIZE);
  size_t page = pg > 0 ? (size_t)pg : 4096;
  if (size == 0 || size > SIZE_MAX - page || size > (size_t)LLONG_MAX - page) {
    return braid__fail_caller(BRAID_ERR_INVALID_ARG, "braid_mem_alloc: size %zu is %s", size,
                              size == 0 ? "zero" : "too large");
  }
  size_t len = (size + page - 1) / page * page;
  pthread_rwlock_wrlock(&reg_lock);
  uint64_t gen = ++next_gen;
  pthread_rwlock_unlock(&reg_lock);
  char name[64];
  snprintf(name, sizeof name, "braid-mem-%llu", (unsigned long long)gen);
  int fd = memfd_create(name, MFD_CLOEXEC);
  void *p = MAP_FAILED;
  if (fd >= 0) {
    if (ftruncate(fd, (off_t)len) != 0) {
      int e = errno;
      close(fd);
      return braid__fail_caller(e == ENOMEM || e == EFBIG ? BRAID_ERR_NO_MEMORY : BRAID_ERR_SYSTEM,
                                "braid_mem_alloc: sizing a %zu-byte memfd failed: %s", len, strerror(e));
    }
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  } else {
    /* No memfds (very old kernel or a seccomp filter): still usable memory,
       only never shared. */
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  }
  if (p == MAP_FAILED) {
    int e = errno;
    if (fd >= 0) close(fd);
    return braid__fail_caller(BRAID_ERR_NO_MEMORY, "braid_mem_alloc: mapping %zu bytes failed: %s", len,
                              strerror(e));
  }
  region r = {(uintptr_t)p, len, fd, gen};
  pthread_rwlock_wrlock(&reg_lock);
  int bad = insert(&r);
  pthread_rwlock_unlock(&reg_lock);
  if (bad) {
    munmap(p, len);
    if (fd >= 0) close(fd);
    return braid__fail_caller(BRAID_ERR_NO_MEMORY, "braid_mem_alloc: out of memory for the allocation table");
  }
  *ptr = p;
  return BRAID_OK;
}

braid_status braid_mem_free(void *ptr) {
  if (!ptr) return BRAID_OK;
  region r = {0, 0, -1, 0};
  int found = 0;
  pthread_rwlock_wrlock(&reg_lock);
  size_t i = find_index((uintptr_t)ptr);
  if (i != SIZE_MAX && regs[i].base == (uintptr_t)ptr) {
    r = regs[i];
    memmove(&regs[i], &regs[i + 1], (nregs - i - 1) * sizeof *regs);
    nregs--;
    atomic_store(&live, nregs);
    atomic_fetch_add(&free_epoch, 1);
    found = 1;
  }
  pthread_rwlock_unlock(&reg_lock);
  if (!found) {
    return braid__fail_caller(BRAID_ERR_INVALID_ARG,
                              "braid_mem_free: ptr %p was not returned by braid_mem_alloc, or was freed already", ptr);
  }
  munmap((void *)r.base, r.len);
  if (r.fd >= 0) close(r.fd);
  return BRAID_OK;
}

/* ---------------------------------------------------------------- peers */

static const uint64_t probe_value = 0x62726169646d656dULL;
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_fd = -1;

static void probe_make(void) {
  int fd = memfd_create("braid-probe", MFD_CLOEXEC);
  if (fd < 0) return;
  if (pwrite(fd, &probe_value, sizeof probe_value, 0) != (ssize_t)sizeof probe_value) {
    close(fd);
    return;
  }
  probe_fd = fd;
}

int braid__mem_probe_fd(void) {
  pthread_once(&probe_once, probe_make);
  return probe_fd;
}

uint64_t braid__mem_probe_value(void) { return probe_value; }

/* Opens descriptor fd of process pid read-only and checks that it is the
   memfd named want; -1 with errno set otherwise. */
static int open_peer_fd(pid_t pid, int fd, const char *want) {
  char path[64], link[128], self[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, fd);
  int mine = open(path, O_RDONLY | O_CLOEXEC);
  if (mine < 0) return -1;
  snprintf(self, sizeof self, "/proc/self/fd/%d", mine);
  ssize_t n = readlink(self, link, sizeof link - 1);
  size_t wl = strlen(want);
  if (n >= 0) link[n] = 0;
  /* "/memfd:NAME (deleted)": the name must match whole. */
  if (n < 0 || strncmp(link, want, wl) != 0 || (link[wl] != 0 && link[wl] != ' ')) {
    close(mine);
    errno = ESTALE;
    return -1;
  }
  return mine;
}

void *braid__mem_map_peer(pid_t pid, const braid__mem_ref *ref) {
  char want[64];
  snprintf(want, sizeof want, "/memfd:braid-mem-%llu", (unsigned long long)ref->gen);
  int fd = open_peer_fd(pid, ref->fd, want);
  if (fd < 0) return NULL;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < ref->len) {
    close(fd);
    errno = ESTALE;
    return NULL;
  }
  void *p = mmap(NULL, (size_t)ref->len, PROT_READ, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  errno = e;
  return p == MAP_FAILED ? NULL : p;
}

int braid__mem_probe_peer(pid_t pid, int fd) {
  if (fd < 0) return 0;
  int mine = open_peer_fd(pid, fd, "/memfd:braid-probe");
  if (mine < 0) return 0;
  uint64_t v = 0;
  int ok = 0;
  void *p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, mine, 0);
  if (p != MAP_FAILED) {
    memcpy(&v, p, sizeof v);
    ok = v == probe_value;
    munmap(p, 4096);
  }
  close(mine);
  return ok;
}
