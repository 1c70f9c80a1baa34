/* tcp_xchg: the link time of a 2-rank exchange over loopback TCP with no
   library in the way. Two processes, one connection, each sends SIZE
   bytes to the other and receives SIZE at the same time (non-blocking
   sockets, spinning), TCP_NODELAY and 4 MiB socket buffers; reported: the
   time per exchange. A 2-rank all-to-all of S bytes per rank moves S/2
   each way, so `tcp_xchg S/2` is its link time.
   --a2a S: the ideal 2-process all-to-all of S bytes per rank over that
   connection: each process also copies its own S/2 block from its send to
   its receive buffer, a chunk at a time whenever the socket cannot move
   bytes, the rest after the exchange. On loopback the kernel's copies run
   on the same CPUs as that local copy, so it belongs in the reference.
   Where the socket's congestion control is a pacing one (bbr), it gets
   cubic (reno where cubic is not offered), as braid's sockets to the same
   host do (BRAID_TCP_CONGESTION=auto): BBR's pacing slows loopback
   transfers, and the reference must not be slower than braid's path.

     tcp_xchg SIZE            (K, M, G suffixes)
     tcp_xchg --a2a SIZE */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "size_arg.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static void tune(int fd) {
  int one = 1, buf = 4 << 20;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  char cc[16] = "";
  socklen_t len = sizeof cc - 1;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, &len) == 0 && strncmp(cc, "bbr", 3) == 0 &&
      setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, "cubic", 5) != 0)
    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, "reno", 4);
}

#define LOCAL_CHUNK (64u << 10)

/* One exchange: send all of out and receive all of in, interleaved; with
   local_bytes, also copy local_src to local_dst, a chunk whenever neither
   direction moved. */
static void exchange(int fd, const char *out, char *in, size_t size, const char *local_src, char *local_dst,
                     size_t local_bytes) {
  size_t sent = 0, got = 0, copied = 0;
  while (sent < size || got < size) {
    int moved = 0;
    if (sent < size) {
      ssize_t k = send(fd, out + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) sent += (size_t)k, moved = 1;
      else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) die("tcp_xchg: send");
    }
    if (got < size) {
      ssize_t k = recv(fd, in + got, size - got, MSG_DONTWAIT);
      if (k > 0) got += (size_t)k, moved = 1;
      else if (k == 0) {
        fprintf(stderr, "tcp_xchg: peer closed\n");
        exit(1);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) die("tcp_xchg: recv");
    }
    if (!moved && copied < local_bytes) {
      size_t n = local_bytes - copied < LOCAL_CHUNK ? local_bytes - copied : LOCAL_CHUNK;
      memcpy(local_dst + copied, local_src + copied, n);
      copied += n;
    }
  }
  if (copied < local_bytes) memcpy(local_dst + copied, local_src + copied, local_bytes - copied);
}

int main(int argc, char **argv) {
  int a2a = argc == 3 && !strcmp(argv[1], "--a2a");
  if ((argc != 2 && !a2a) || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    printf("usage: tcp_xchg SIZE         (bytes each way per exchange; K, M, G suffixes)\n"
           "       tcp_xchg --a2a SIZE   (an ideal 2-rank all-to-all of SIZE bytes per rank)\n");
    return argc == 2 ? 0 : 2;
  }
  size_t total = parse_size(argv[a2a ? 2 : 1]);
  size_t size = a2a ? total / 2 : total; /* bytes each way */
  if (!size) {
    fprintf(stderr, "tcp_xchg: SIZE must be a positive size%s\n", a2a ? " of at least 2 bytes" : "");
    return 2;
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0) die("tcp_xchg: socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (struct sockaddr *)&a, &al))
    die("tcp_xchg: listen");
  pid_t p = fork();
  if (p < 0) die("tcp_xchg: fork");
  int fd;
  if (p == 0) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("tcp_xchg: socket");
    tune(fd);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) die("tcp_xchg: connect");
  } else {
    fd = accept(ls, NULL, NULL);
    if (fd < 0) die("tcp_xchg: accept");
    tune(fd);
  }
  close(ls);
  /* a2a: send and receive buffers of two blocks; block 0 is the process's
     own (copied locally), block 1 the one exchanged. */
  size_t bufsize = a2a ? 2 * size : size;
  char *sendbuf = malloc(bufsize), *recvbuf = malloc(bufsize);
  if (!sendbuf || !recvbuf) die("tcp_xchg: malloc");
  memset(sendbuf, p == 0 ? 1 : 2, bufsize);
  memset(recvbuf, 0, bufsize);
  char *out = a2a ? sendbuf + size : sendbuf, *in = a2a ? recvbuf + size : recvbuf;
  int iters = (int)(1e9 / (double)size);
  if (iters > 20000) iters = 20000;
  if (iters < 5) iters = 5;
  double t0 = 0;
  for (int it = 0; it < iters + 2; it++) {
    if (it == 2) t0 = now();
    exchange(fd, out, in, size, sendbuf, recvbuf, a2a ? size : 0);
  }
  double t = (now() - t0) / iters;
  if (in[0] != (p == 0 ? 2 : 1) || in[size - 1] != in[0] || (a2a && recvbuf[size - 1] != (p == 0 ? 1 : 2))) {
    fprintf(stderr, "tcp_xchg: wrong bytes received\n");
    return 1;
  }
  close(fd);
  free(sendbuf);
  free(recvbuf);
  if (p == 0) _exit(0);
  int st;
  waitpid(p, &st, 0);
  if (a2a)
    printf("all-to-all of %zu bytes per rank (%zu each way, %zu copied locally): %.2f us\n", total, size, size,
           t * 1e6);
  else
    printf("exchange of %zu bytes each way: %.2f us, %.2f GB/s each way\n", size, t * 1e6, (double)size / t / 1e9);
  return 0;
}
