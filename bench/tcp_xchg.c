/* tcp_xchg: the link time of a 2-rank exchange over loopback TCP with no
   library in the way. Two processes, one connection, each sends SIZE
   bytes to the other and receives SIZE at the same time (non-blocking
   sockets, spinning), TCP_NODELAY and 4 MiB socket buffers; reported: the
   time per exchange. A 2-rank all-to-all of S bytes per rank moves S/2
   each way, so `tcp_xchg S/2` is its link time.

     tcp_xchg SIZE            (K, M, G suffixes) */
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
}

/* One exchange: send all of out and receive all of in, interleaved. */
static void exchange(int fd, const char *out, char *in, size_t size) {
  size_t sent = 0, got = 0;
  while (sent < size || got < size) {
    if (sent < size) {
      ssize_t k = send(fd, out + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) sent += (size_t)k;
      else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) die("tcp_xchg: send");
    }
    if (got < size) {
      ssize_t k = recv(fd, in + got, size - got, MSG_DONTWAIT);
      if (k > 0) got += (size_t)k;
      else if (k == 0) {
        fprintf(stderr, "tcp_xchg: peer closed\n");
        exit(1);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) die("tcp_xchg: recv");
    }
  }
}

int main(int argc, char **argv) {
  if (argc != 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    printf("usage: tcp_xchg SIZE   (bytes each way per exchange; K, M, G suffixes)\n");
    return argc == 2 ? 0 : 2;
  }
  size_t size = parse_size(argv[1]);
  if (!size) {
    fprintf(stderr, "tcp_xchg: SIZE must be a positive size\n");
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
  char *out = malloc(size), *in = malloc(size);
  if (!out || !in) die("tcp_xchg: malloc");
  memset(out, p == 0 ? 1 : 2, size);
  int iters = (int)(1e9 / (double)size);
  if (iters > 20000) iters = 20000;
  if (iters < 5) iters = 5;
  double t0 = 0;
  for (int it = 0; it < iters + 2; it++) {
    if (it == 2) t0 = now();
    exchange(fd, out, in, size);
  }
  double t = (now() - t0) / iters;
  if (in[0] != (p == 0 ? 2 : 1) || in[size - 1] != in[0]) {
    fprintf(stderr, "tcp_xchg: wrong bytes received\n");
    return 1;
  }
  close(fd);
  free(out);
  free(in);
  if (p == 0) _exit(0);
  int st;
  waitpid(p, &st, 0);
  printf("exchange of %zu bytes each way: %.2f us, %.2f GB/s each way\n", size, t * 1e6, (double)size / t / 1e9);
  return 0;
}
