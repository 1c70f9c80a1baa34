/* xcore_bw: the ceiling of copying between two cores through shared memory,
   the path of braid's shm backend. Process A copies a message into a ring
   of chunks in a shared mapping, process B copies each chunk out as soon as
   it is posted; with --both, each process does both at once (the all-gather
   pattern). Reported: message bytes per second moved into B's buffer.

     xcore_bw [--both] [SIZE [CHUNK [SLOTS]]]     defaults 1M 256K 8
     xcore_bw --pingpong                           round trip of one cache line
     xcore_bw --a2a SIZE                           ideal 2-process all-to-all

   --a2a is the memory time of the bytes a 2-rank all-to-all of SIZE bytes
   per rank must move, with no library in the way: each process copies its
   own half-block locally and loads the peer's half-block straight from a
   shared mapping (the single copy CMA gives), one barrier per exchange.

   Processes are pinned to CPUs 0 and 1 when the machine has them. The
   round trip tells which way a VM's two vCPUs sit: on the measured VM it is
   about 55 ns when they share a core complex and 300-350 ns when the host
   places them apart, which it does for minutes at a time; bench/compare
   records it around every run. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "size_arg.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define relax() _mm_pause()
#else
#define relax() ((void)0)
#endif

typedef struct {
  _Alignas(64) _Atomic long posted; /* chunks written by the owner of this ring */
  _Alignas(64) _Atomic long done;   /* chunks copied out by the other process */
} ring_ctl;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  (void)sched_setaffinity(0, sizeof s, &s);
}

/* Forks the second process; each is pinned to its own CPU when there are
   two. Returns 0 in the parent (CPU 0) and 1 in the child (CPU 1); the
   parent's child pid in *child. */
static int fork_pinned(pid_t *child) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  pid_t p = fork();
  if (p < 0) {
    perror("xcore_bw: fork");
    exit(1);
  }
  int me = p == 0;
  if (ncpu >= 2) pin(me);
  *child = p;
  return me;
}

/* The child ends here; the parent waits for it. */
static void join(int me, pid_t child) {
  if (me == 1) _exit(0);
  int st;
  waitpid(child, &st, 0);
}

/* Timed repetitions for size bytes: about 2 GB moved, 5 to 20000. */
static int iters_for(size_t size) {
  int iters = (int)(2e9 / (double)size);
  return iters > 20000 ? 20000 : iters < 5 ? 5 : iters;
}

/* One process: writes its message into its own ring (when it sends) and
   copies the peer's chunks out (when it receives), chunk by chunk. */
static double run(int me, int sends, int receives, size_t size, size_t chunk, long slots, char *rings[2],
                  ring_ctl *ctl[2], int iters) {
  char *src = aligned_alloc(4096, size), *dst = aligned_alloc(4096, size);
  if (!src || !dst) {
    fprintf(stderr, "xcore_bw: out of memory\n");
    exit(1);
  }
  memset(src, me + 1, size);
  memset(dst, 0, size);
  long nch = (long)((size + chunk - 1) / chunk), g = 0;
  double t0 = 0;
  for (int it = 0; it < iters + 2; it++) {
    if (it == 2) t0 = now();
    for (long k = 0; k < nch; k++, g++) {
      size_t off = (size_t)k * chunk, len = size - off < chunk ? size - off : chunk;
      size_t slot = (size_t)(g % slots) * chunk;
      if (sends) {
        while (atomic_load_explicit(&ctl[me]->done, memory_order_acquire) < g - slots + 1) relax();
        memcpy(rings[me] + slot, src + off, len);
        atomic_store_explicit(&ctl[me]->posted, g + 1, memory_order_release);
      }
      if (receives) {
        int peer = 1 - me;
        while (atomic_load_explicit(&ctl[peer]->posted, memory_order_acquire) < g + 1) relax();
        memcpy(dst + off, rings[peer] + slot, len);
        atomic_store_explicit(&ctl[peer]->done, g + 1, memory_order_release);
      }
    }
  }
  double t = (now() - t0) / iters;
  free(src);
  free(dst);
  return t;
}

/* Nanoseconds per round trip of one cache line between the two processes. */
static double pingpong(void) {
  _Atomic long *f = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (f == MAP_FAILED) {
    perror("xcore_bw: mmap");
    exit(1);
  }
  enum { N = 100000 };
  pid_t p;
  int me = fork_pinned(&p);
  double t0 = now();
  for (long i = 0; i < N; i++) {
    if (me == 0) {
      atomic_store_explicit(f, 2 * i + 1, memory_order_release);
      while (atomic_load_explicit(f, memory_order_acquire) != 2 * i + 2) relax();
    } else {
      while (atomic_load_explicit(f, memory_order_acquire) != 2 * i + 1) relax();
      atomic_store_explicit(f, 2 * i + 2, memory_order_release);
    }
  }
  double t = (now() - t0) / N * 1e9;
  join(me, p);
  return t;
}

/* Seconds per ideal 2-process all-to-all of size bytes per process. */
static double a2a(size_t size) {
  size_t half = size / 2;
  char *send = mmap(NULL, 2 * size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  _Atomic long *bar = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (send == MAP_FAILED || bar == MAP_FAILED) {
    perror("xcore_bw: mmap");
    exit(1);
  }
  int iters = iters_for(size);
  pid_t p;
  int me = fork_pinned(&p);
  char *mine = send + (size_t)me * size, *peer = send + (size_t)(1 - me) * size;
  char *recv = aligned_alloc(4096, size);
  if (!recv) {
    fprintf(stderr, "xcore_bw: out of memory\n");
    exit(1);
  }
  memset(mine, me + 1, size); /* each sends from memory it wrote, as an application does */
  memset(recv, 0, size);
  double t0 = 0;
  for (long it = 0; it < iters + 2; it++) {
    if (it == 2) t0 = now();
    /* Block me of mine stays, block me of the peer's comes over. */
    memcpy(recv + (size_t)me * half, mine + (size_t)me * half, half);
    memcpy(recv + (size_t)(1 - me) * half, peer + (size_t)me * half, half);
    atomic_fetch_add_explicit(&bar[me * 16], 1, memory_order_acq_rel);
    while (atomic_load_explicit(&bar[(1 - me) * 16], memory_order_acquire) < it + 1) relax();
  }
  double t = (now() - t0) / iters;
  free(recv);
  join(me, p);
  return t;
}

int main(int argc, char **argv) {
  int both = 0, a = 1;
  if (a < argc && !strcmp(argv[a], "--pingpong")) {
    printf("round trip %.1f ns\n", pingpong());
    return 0;
  }
  if (a + 1 < argc && !strcmp(argv[a], "--a2a")) {
    size_t size = parse_size(argv[a + 1]);
    if (size < 2) {
      fprintf(stderr, "xcore_bw: --a2a SIZE must be at least 2 bytes\n");
      return 2;
    }
    double t = a2a(size);
    printf("all-to-all size %zu per process: %.2f us per exchange, %.2f GB/s per process\n", size, t * 1e6,
           (double)size / t / 1e9);
    return 0;
  }
  if (a < argc && !strcmp(argv[a], "--both")) both = 1, a++;
  if (a < argc && (!strcmp(argv[a], "-h") || !strcmp(argv[a], "--help"))) {
    printf("usage: xcore_bw [--both] [SIZE [CHUNK [SLOTS]]]   (defaults 1M 256K 8; K, M, G suffixes)\n"
           "       xcore_bw --pingpong                         (cache-line round trip between the two CPUs)\n"
           "       xcore_bw --a2a SIZE                         (ideal 2-process all-to-all of SIZE bytes each)\n");
    return 0;
  }
  size_t size = a < argc ? parse_size(argv[a++]) : (size_t)1 << 20;
  size_t chunk = a < argc ? parse_size(argv[a++]) : (size_t)256 << 10;
  long slots = a < argc ? atol(argv[a++]) : 8;
  if (size == 0 || chunk == 0 || slots < 1) {
    fprintf(stderr, "xcore_bw: SIZE and CHUNK must be positive and SLOTS at least 1\n");
    return 2;
  }
  chunk = (chunk + 63) & ~(size_t)63;
  int iters = iters_for(size);
  char *rings[2];
  ring_ctl *ctl[2];
  for (int i = 0; i < 2; i++) {
    rings[i] = mmap(NULL, chunk * (size_t)slots, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ctl[i] = mmap(NULL, sizeof(ring_ctl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rings[i] == MAP_FAILED || ctl[i] == MAP_FAILED) {
      perror("xcore_bw: mmap");
      return 1;
    }
    memset(rings[i], 0, chunk * (size_t)slots);
  }
  /* The child sends (ring 0), the parent receives and reports. */
  pid_t p;
  int me = fork_pinned(&p);
  double t = me == 1 ? run(0, 1, both, size, chunk, slots, rings, ctl, iters)
                     : run(1, both, 1, size, chunk, slots, rings, ctl, iters);
  join(me, p);
  printf("%s size %zu chunk %zu slots %ld: %.2f us per message, %.2f GB/s into each receiver\n",
         both ? "both ways" : "one way", size, chunk, slots, t * 1e6, (double)size / t / 1e9);
  return 0;
}
