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

/* This rank's pipe for messages from src, made on first use; *fd is -1
   when none can be made (out of descriptors), and the pair uses its ring. */
void shm_pipe_offer(shm_state *s, int src, int *fd, uint64_t *ino, size_t *cap) {
  shm_pipe *p = &s->pipes[src];
  if (p->rd < 0) {
    int f[2];
    struct stat st;
    if (pipe2(f, O_NONBLOCK | O_CLOEXEC) != 0) {
      *fd = -1;
      return;
    }
    if (fstat(f[1], &st) != 0) {
      close(f[0]);
      close(f[1]);
      *fd = -1;
      return;
    }
    /* A larger pipe lets the sender run further ahead; the kernel may
       refuse (a user's pipe memory is limited), and the default works. */
    (void)fcntl(f[1], F_SETPIPE_SZ, (int)SHM_PIPE_BYTES);
    int got = fcntl(f[1], F_GETPIPE_SZ);
    p->cap = got > 0 ? (size_t)got : 4096;
    p->rd = f[0];
    p->wr = f[1];
    p->ino = (uint64_t)st.st_ino;
  }
  *fd = p->wr;
  *ino = p->ino;
  *cap = p->cap;
}

/* The first clear-to-send from dst decides the pair's way for good. The
   pipe is opened for reading too, so that a receiver gone away never
   raises SIGPIPE here (its death is found by the liveness checks). */
void shm_pipe_open_out(braid_comm *c, shm_state *s, int dst, uint64_t fd, uint64_t ino, uint64_t cap) {
  shm_pipe *p = &s->pipes[dst];
  if (p->out != -1) return;
  p->out = -2;
  if (!s->splice || fd > INT_MAX || cap < 4096 || cap > (1u << 30)) return;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)s->pids[dst], (int)fd);
  int f = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
  struct stat st;
  if (f >= 0 && fstat(f, &st) == 0 && S_ISFIFO(st.st_mode) && (uint64_t)st.st_ino == ino) {
    p->out = f;
    p->cap = (size_t)cap;
    return;
  }
  BLOG_INFO(BRAID_SUB_SHM, c->rank, "cannot open rank %d's pipe %s (%s): its messages from here cross the ring",
            braid__label(c, dst), path, f < 0 ? strerror(errno) : "not the pipe offered");
  if (f >= 0) close(f);
}

/* A lend only where the pipe has room for a part worth a system call: a
   page-misaligned message takes a slot more than its bytes, so the lend
   may still come up short (EAGAIN), which is no error. */
#define PIPE_PART ((size_t)64 << 10)

braid_status shm_pipe_push(braid_comm *c, shm_state *s, int dst, const char *buf, size_t len, size_t *done) {
  *done = 0;
  shm_pipe *p = &s->pipes[dst];
  shm_ring *r = shm_ring_of(s, s->me, dst);
  size_t room = p->cap - (size_t)(p->lent - atomic_load_explicit(&r->unpiped, memory_order_acquire));
  size_t part = PIPE_PART < p->cap / 2 ? PIPE_PART : p->cap / 2;
  size_t want = len < room ? len : room;
  if (want < (len < part ? len : part)) return BRAID_OK;
  for (;;) {
    struct iovec io = {(void *)(uintptr_t)buf, want};
    ssize_t k = vmsplice(p->out, &io, 1, SPLICE_F_NONBLOCK);
    if (k > 0) {
      *done = (size_t)k;
      p->lent += (uint64_t)k;
      atomic_store_explicit(&r->piped, p->lent, memory_order_release);
      return BRAID_OK;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno == EAGAIN) return BRAID_OK;
    return braid__fail_comm(c, BRAID_ERR_SYSTEM, "vmsplice of a %zu-byte message to rank %d failed: %s", len,
                            braid__label(c, dst), k < 0 ? strerror(errno) : "no progress");
  }
}

/* Reads all the pipe holds of the message at once: reading in parts was
   slower, each part taking the pipe's lock again while the sender waited
   on it to lend. */
braid_status shm_pipe_pull(braid_comm *c, shm_state *s, int src, char *buf, size_t len, size_t *got) {
  *got = 0;
  shm_pipe *p = &s->pipes[src];
  shm_ring *r = shm_ring_of(s, src, s->me);
  while (*got < len) {
    size_t avail = (size_t)(atomic_load_explicit(&r->piped, memory_order_acquire) - p->got);
    if (!avail) break;
    ssize_t k = read(p->rd, buf + *got, len - *got < avail ? len - *got : avail);
    if (k > 0) {
      *got += (size_t)k;
      p->got += (uint64_t)k;
      atomic_store_explicit(&r->unpiped, p->got, memory_order_release);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    /* The sender counts bytes only once they are in the pipe: it cannot be
       empty here. */
    return braid__fail_comm(c, BRAID_ERR_SYSTEM, "reading a %zu-byte message of rank %d from its pipe failed: %s", len,
                            braid__label(c, src), k < 0 ? strerror(errno) : "end of file");
  }
  return BRAID_OK;
}

void shm_pipes_free(shm_state *s) {
  for (int q = 0; q < s->n && s->pipes; q++) {
    shm_pipe *p = &s->pipes[q];
    if (p->rd >= 0) close(p->rd);
    if (p->wr >= 0) close(p->wr);
    if (p->out >= 0) close(p->out);
  }
  free(s->pipes);
  s->pipes = NULL;
}
