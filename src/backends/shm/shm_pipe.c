/* One copy without process_vm_readv: the pipes of shm_pipe. Container
   profiles that forbid process_vm_readv (no CAP_SYS_PTRACE, Yama) still
   allow vmsplice, which lends the sender's pages to a pipe without copying
   them; the receiver's read() is the one copy. The sender's pages stay
   referenced by the pipe until read, so a send completes only when the
   receiver acknowledges the whole message (shm_p2p.c). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "backends/shm/shm.h"

/* Also reopens the pipe through /proc, as a peer will. */
int shm_splice_probe(void) {
  int p[2];
  if (pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0) return 0;
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", p[1]);
  int w = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
  uint64_t v = 0x627261696470ull, back = 0;
  struct iovec io = {&v, sizeof v};
  int ok = w >= 0 && vmsplice(w, &io, 1, SPLICE_F_NONBLOCK) == (ssize_t)sizeof v &&
           read(p[0], &back, sizeof back) == (ssize_t)sizeof back && back == v;
  if (w >= 0) close(w);
  close(p[0]);
  close(p[1]);
  return ok;
}

/* Stream bytes per turn of a pipe of capacity cap, as both sides compute
   it from the offer: a page less, since a chunk that starts inside a page
   takes one slot more than its bytes. */
static size_t chunk_of(uint32_t cap) { return cap > 4096 ? cap - 4096 : cap; }

static int make_pipe(int f[2], uint64_t *ino, size_t *cap) {
  struct stat st;
  if (pipe2(f, O_NONBLOCK | O_CLOEXEC) != 0) return 0;
  if (fstat(f[1], &st) != 0) {
    close(f[0]);
    close(f[1]);
    return 0;
  }
  /* A larger pipe needs fewer turns; the kernel may refuse (a user's pipe
     memory is limited), and the default works. */
  (void)fcntl(f[1], F_SETPIPE_SZ, (int)SHM_PIPE_BYTES);
  int got = fcntl(f[1], F_GETPIPE_SZ);
  *cap = got > 0 ? (size_t)got : 4096;
  *ino = (uint64_t)st.st_ino;
  return 1;
}

/* This rank's pipes for messages from src, made on first use and offered
   in the pair's ring header; 0 when none can be made (out of descriptors),
   and the pair uses its ring. */
int shm_pipe_offer(shm_state *s, int src) {
  shm_pipe *p = &s->pipes[src];
  if (p->rd[0] >= 0) return 1;
  int a[2], b[2];
  uint64_t ia, ib;
  size_t ca, cb;
  if (!make_pipe(a, &ia, &ca)) return 0;
  if (!make_pipe(b, &ib, &cb)) {
    close(a[0]);
    close(a[1]);
    return 0;
  }
  shm_ring *r = shm_ring_of(s, src, s->me);
  r->offer.fd[0] = a[1];
  r->offer.fd[1] = b[1];
  r->offer.ino[0] = ia;
  r->offer.ino[1] = ib;
  r->offer.cap = (uint32_t)(ca < cb ? ca : cb);
  p->rd[0] = a[0];
  p->wr[0] = a[1];
  p->rd[1] = b[0];
  p->wr[1] = b[1];
  p->rchunk = chunk_of(r->offer.cap);
  return 1;
}

/* The first clear-to-send from dst decides the pair's way for good. The
   pipes are opened for reading too, so that a receiver gone away never
   raises SIGPIPE here (its death is found by the liveness checks). */
void shm_pipe_open_out(braid_comm *c, shm_state *s, int dst) {
  shm_pipe *p = &s->pipes[dst];
  if (p->out[0] != -1) return;
  p->out[0] = -2;
  shm_ring *r = shm_ring_of(s, s->me, dst);
  uint32_t cap = r->offer.cap;
  if (!s->splice || cap < 4096 || cap > (1u << 30)) return;
  int f[2] = {-1, -1};
  char path[64];
  const char *why = NULL;
  for (int i = 0; i < 2 && !why; i++) {
    struct stat st;
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)s->pids[dst], (int)r->offer.fd[i]);
    f[i] = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (f[i] < 0) why = strerror(errno);
    else if (fstat(f[i], &st) != 0 || !S_ISFIFO(st.st_mode) || (uint64_t)st.st_ino != r->offer.ino[i])
      why = "not the pipe offered";
  }
  if (!why) {
    p->out[0] = f[0];
    p->out[1] = f[1];
    p->wchunk = chunk_of(cap);
    return;
  }
  BLOG_INFO(BRAID_SUB_SHM, c->rank, "cannot open rank %d's pipe %s (%s): its messages from here cross the ring",
            braid__label(c, dst), path, why);
  for (int i = 0; i < 2; i++)
    if (f[i] >= 0) close(f[i]);
}

/* Lends what the turn of the pipes allows: the pipe of chunk k takes it
   once chunk k - 2, its last, is read. */
braid_status shm_pipe_push(braid_comm *c, shm_state *s, int dst, const char *buf, size_t len, size_t *done) {
  *done = 0;
  shm_pipe *p = &s->pipes[dst];
  shm_ring *r = shm_ring_of(s, s->me, dst);
  const uint64_t C = p->wchunk;
  uint64_t read = atomic_load_explicit(&r->unpiped, memory_order_acquire);
  while (*done < len) {
    uint64_t k = p->lent / C;
    if (k >= 2 && read < (k - 1) * C) break;
    size_t want = (size_t)((k + 1) * C - p->lent);
    if (want > len - *done) want = len - *done;
    struct iovec io = {(void *)(uintptr_t)(buf + *done), want};
    ssize_t n = vmsplice(p->out[k & 1], &io, 1, SPLICE_F_NONBLOCK);
    if (n > 0) {
      *done += (size_t)n;
      p->lent += (uint64_t)n;
      atomic_store_explicit(&r->piped, p->lent, memory_order_release);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    return braid__fail_comm(c, BRAID_ERR_SYSTEM, "vmsplice of a %zu-byte message to rank %d failed: %s", len,
                            braid__label(c, dst), n < 0 ? strerror(errno) : "no progress");
  }
  return BRAID_OK;
}

/* Reads what was lent of the message, chunk by chunk from the pipe of each. */
braid_status shm_pipe_pull(braid_comm *c, shm_state *s, int src, char *buf, size_t len, size_t *got) {
  *got = 0;
  shm_pipe *p = &s->pipes[src];
  shm_ring *r = shm_ring_of(s, src, s->me);
  const uint64_t C = p->rchunk;
  uint64_t lent = atomic_load_explicit(&r->piped, memory_order_acquire);
  while (*got < len && lent > p->got) {
    uint64_t k = p->got / C, end = (k + 1) * C < lent ? (k + 1) * C : lent;
    size_t want = (size_t)(end - p->got);
    if (want > len - *got) want = len - *got;
    ssize_t n = read(p->rd[k & 1], buf + *got, want);
    if (n > 0) {
      *got += (size_t)n;
      p->got += (uint64_t)n;
      atomic_store_explicit(&r->unpiped, p->got, memory_order_release);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    /* The sender counts bytes only once they are in the pipe: it cannot be
       empty here. */
    return braid__fail_comm(c, BRAID_ERR_SYSTEM, "reading a %zu-byte message of rank %d from its pipe failed: %s", len,
                            braid__label(c, src), n < 0 ? strerror(errno) : "end of file");
  }
  return BRAID_OK;
}

void shm_pipes_free(shm_state *s) {
  for (int q = 0; q < s->n && s->pipes; q++) {
    shm_pipe *p = &s->pipes[q];
    for (int i = 0; i < 2; i++) {
      if (p->rd[i] >= 0) close(p->rd[i]);
      if (p->wr[i] >= 0) close(p->wr[i]);
      if (p->out[i] >= 0) close(p->out[i]);
    }
  }
  free(s->pipes);
  s->pipes = NULL;
}
