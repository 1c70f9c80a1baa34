#include "os/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "os/time.h"

int braid__sock_poll_ms(double deadline) {
  if (isinf(deadline) && deadline > 0) return -1;
  double left = deadline - braid__now();
  if (left <= 0) return 0;
  double ms = ceil(left * 1000.0);
  return ms >= (double)INT_MAX ? INT_MAX : (int)ms;
}

int braid__sock_poll1(int fd, short events, double deadline, short *revents) {
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events, .revents = 0};
    int ms = braid__sock_poll_ms(deadline);
    int r = poll(&p, 1, ms);
    if (r > 0) {
      if (revents) *revents = p.revents;
      return 1;
    }
    if (r < 0 && errno != EINTR) return -1;
    /* Timed out (or interrupted): done only once the deadline really passed,
       since ms was rounded and poll may wake a little early. */
    if (r == 0 && braid__sock_poll_ms(deadline) == 0) return 0;
  }
}

int braid__sock_set_nonblock(int fd, int on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
  return fcntl(fd, F_SETFL, fl);
}

int braid__sock_set_cloexec(int fd) {
  int fl = fcntl(fd, F_GETFD);
  if (fl < 0) return -1;
  return fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
}

int braid__sock_set_nodelay(int fd) {
  int one = 1;
  return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int braid__sock_set_keepalive(int fd, int idle_s, int interval_s, int count) {
  int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) != 0) return -1;
#ifdef TCP_KEEPIDLE
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
#else
  (void)idle_s;
  (void)interval_s;
  (void)count;
#endif
  return 0;
}

int braid__sock_resolve(const char *host, int port, int passive, struct addrinfo **res) {
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : AI_ADDRCONFIG);
  char serv[16];
  snprintf(serv, sizeof serv, "%d", port);
  int r = getaddrinfo(host, serv, &hints, res);
  /* AI_ADDRCONFIG hides loopback-only setups (no configured address): retry without it. */
  if (r == EAI_NONAME && !passive && host) {
    hints.ai_flags = AI_NUMERICSERV;
    r = getaddrinfo(host, serv, &hints, res);
  }
  return r;
}

static int new_socket(int family) {
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_TCP);
  return fd;
}

int braid__sock_connect_addr(const struct sockaddr *sa, socklen_t salen, double deadline, int *fd_out) {
  int fd = new_socket(sa->sa_family);
  if (fd < 0) return errno;
  int r;
  do {
    r = connect(fd, sa, salen);
  } while (r != 0 && errno == EINTR);
  if (r != 0 && errno != EINPROGRESS) {
    int e = errno;
    close(fd);
    return e;
  }
  if (r != 0) {
    short rev = 0;
    int pr = braid__sock_poll1(fd, POLLOUT, deadline, &rev);
    if (pr <= 0) {
      int e = pr == 0 ? ETIMEDOUT : errno;
      close(fd);
      return e;
    }
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) soerr = errno;
    if (soerr != 0) {
      close(fd);
      return soerr;
    }
  }
  (void)braid__sock_set_nodelay(fd);
  *fd_out = fd;
  return 0;
}

int braid__sock_connect(const char *host, int port, double deadline, int *fd_out, char *why, size_t whylen) {
  struct addrinfo *res = NULL;
  int g = braid__sock_resolve(host, port, 0, &res);
  if (g != 0) {
    if (why) snprintf(why, whylen, "cannot resolve %s: %s", host ? host : "(null)", gai_strerror(g));
    return g < 0 ? g : -g;
  }
  int last = ECONNREFUSED;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    int fd = -1;
    last = braid__sock_connect_addr(ai->ai_addr, ai->ai_addrlen, deadline, &fd);
    if (last == 0) {
      *fd_out = fd;
      break;
    }
    if (why) {
      char a[INET6_ADDRSTRLEN + 16];
      braid__sock_addr_format(ai->ai_addr, a, sizeof a);
      snprintf(why, whylen, "connect to %s: %s", a, strerror(last));
    }
    if (braid__sock_poll_ms(deadline) == 0) break;
  }
  freeaddrinfo(res);
  return last;
}

/* Waits for fd to be ready after EAGAIN; maps the outcome to a result code. */
static int wait_ready(int fd, short events, double deadline) {
  short rev = 0;
  int r = braid__sock_poll1(fd, events, deadline, &rev);
  if (r == 0) return BRAID__SOCK_TIMEOUT;
  if (r < 0) return BRAID__SOCK_ERR;
  return BRAID__SOCK_OK; /* errors/hangups surface in the next send/recv */
}

static int is_closed_errno(int e) { return e == EPIPE || e == ECONNRESET || e == ENOTCONN || e == ECONNABORTED; }

int braid__sock_send_some(int fd, const void *buf, size_t len, size_t *done) {
  *done = 0;
  for (;;) {
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      *done = (size_t)n;
      return BRAID__SOCK_OK;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return BRAID__SOCK_OK;
    return is_closed_errno(errno) ? BRAID__SOCK_CLOSED : BRAID__SOCK_ERR;
  }
}

int braid__sock_recv_some(int fd, void *buf, size_t len, size_t *done) {
  *done = 0;
  for (;;) {
    ssize_t n = recv(fd, buf, len, MSG_DONTWAIT);
    if (n > 0) {
      *done = (size_t)n;
      return BRAID__SOCK_OK;
    }
    if (n == 0) return len ? BRAID__SOCK_CLOSED : BRAID__SOCK_OK;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return BRAID__SOCK_OK;
    return is_closed_errno(errno) ? BRAID__SOCK_CLOSED : BRAID__SOCK_ERR;
  }
}

int braid__sock_writev_full(int fd, struct iovec *iov, int iovcnt, double deadline) {
  while (iovcnt > 0) {
    if (iov->iov_len == 0) {
      iov++;
      iovcnt--;
      continue;
    }
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = iov;
    mh.msg_iovlen = (size_t)iovcnt;
    ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        int w = wait_ready(fd, POLLOUT, deadline);
        if (w != BRAID__SOCK_OK) return w;
        continue;
      }
      return is_closed_errno(errno) ? BRAID__SOCK_CLOSED : BRAID__SOCK_ERR;
    }
    size_t left = (size_t)n;
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      iov++;
      iovcnt--;
    }
    if (iovcnt > 0) {
      iov->iov_base = (char *)iov->iov_base + left;
      iov->iov_len -= left;
    }
  }
  return BRAID__SOCK_OK;
}

int braid__sock_write_full(int fd, const void *buf, size_t len, double deadline) {
  struct iovec iov = {(void *)buf, len};
  return braid__sock_writev_full(fd, &iov, 1, deadline);
}

int braid__sock_read_full(int fd, void *buf, size_t len, double deadline) {
  char *p = buf;
  while (len > 0) {
    size_t got = 0;
    int r = braid__sock_recv_some(fd, p, len, &got);
    if (r != BRAID__SOCK_OK) return r;
    if (got == 0) {
      int w = wait_ready(fd, POLLIN, deadline);
      if (w != BRAID__SOCK_OK) return w;
      continue;
    }
    p += got;
    len -= got;
  }
  return BRAID__SOCK_OK;
}

int braid__sock_listen(const struct sockaddr *sa, socklen_t len, int backlog, unsigned flags, int *fd_out) {
  int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
  if (fd < 0) return -errno;
  int one = 1, zero = 0;
  if (flags & BRAID__SOCK_REUSEADDR) (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (sa->sa_family == AF_INET6 && (flags & (BRAID__SOCK_DUAL_STACK | BRAID__SOCK_V6ONLY)))
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, (flags & BRAID__SOCK_V6ONLY) ? &one : &zero, sizeof one);
  if (bind(fd, sa, len) != 0 || listen(fd, backlog > 0 ? backlog : 128) != 0) {
    int e = errno;
    close(fd);
    return e;
  }
  *fd_out = fd;
  return 0;
}

void braid__sock_set_port(struct sockaddr_storage *ss, int port) {
  if (ss->ss_family == AF_INET)
    ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
  else if (ss->ss_family == AF_INET6)
    ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
}

int braid__sock_addr_port(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) return ntohs(((const struct sockaddr_in *)sa)->sin_port);
  if (sa->sa_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
  return -1;
}

int braid__sock_listen_range(struct sockaddr_storage *ss, socklen_t len, int lo, int hi, int start, int backlog,
                             unsigned flags, int *fd) {
  if (lo <= 0) return braid__sock_listen((struct sockaddr *)ss, len, backlog, flags, fd);
  int span = hi - lo + 1;
  if (span <= 0) return EINVAL;
  int first = (start < 0 ? 0 : start) % span;
  int e = EADDRINUSE;
  for (int i = 0; i < span; i++) {
    braid__sock_set_port(ss, lo + (first + i) % span);
    e = braid__sock_listen((struct sockaddr *)ss, len, backlog, flags, fd);
    if (e != EADDRINUSE) return e; /* bound, or a failure another port would not cure */
  }
  return e;
}

void braid__sock_addr_format(const struct sockaddr *sa, char *out, size_t outlen) {
  char a[INET6_ADDRSTRLEN];
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &s4->sin_addr, a, sizeof a);
    snprintf(out, outlen, "%s:%u", a, (unsigned)ntohs(s4->sin_port));
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof a);
    snprintf(out, outlen, "[%s]:%u", a, (unsigned)ntohs(s6->sin6_port));
  } else {
    snprintf(out, outlen, "(address family %d)", (int)sa->sa_family);
  }
}

void braid__sock_hostport(const char *host, int port, char *out, size_t outlen) {
  if (!host) host = "*";
  if (strchr(host, ':') && host[0] != '[')
    snprintf(out, outlen, "[%s]:%d", host, port);
  else
    snprintf(out, outlen, "%s:%d", host, port);
}

int braid__sock_is_loopback(const struct sockaddr *sa) {
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
    return (ntohl(s4->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
    if (IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr)) return 1;
    if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) return s6->sin6_addr.s6_addr[12] == 127;
  }
  return 0;
}

/* The address part of an IPv4 or IPv6 address (v4-mapped IPv6 as IPv4):
   its length, 0 for another family. */
static size_t ip_bytes(const struct sockaddr *sa, const unsigned char **p) {
  if (sa->sa_family == AF_INET) {
    *p = (const unsigned char *)&((const struct sockaddr_in *)sa)->sin_addr;
    return 4;
  }
  if (sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    *p = a->s6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a)) {
      *p += 12;
      return 4;
    }
    return 16;
  }
  return 0;
}

int braid__sock_same_ip(const struct sockaddr *a, const struct sockaddr *b) {
  const unsigned char *pa = NULL, *pb = NULL;
  size_t la = ip_bytes(a, &pa), lb = ip_bytes(b, &pb);
  return la && la == lb && memcmp(pa, pb, la) == 0;
}

int braid__sock_set_notsent_lowat(int fd, size_t bytes) {
  if (!bytes) return 0;
  int v = bytes > (size_t)INT_MAX ? INT_MAX : (int)bytes;
  return setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, sizeof v);
}

int braid__sock_congestion(int fd, char *name, size_t len) {
  if (!len) return 0;
  /* The kernel copies at most n bytes of the name, terminated or not. */
  socklen_t n = (socklen_t)(len - 1);
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &n) != 0) {
    name[0] = 0;
    return -1;
  }
  name[n] = 0; /* n <= len - 1: the kernel never reports more than it was given */
  return 0;
}

int braid__sock_set_congestion(int fd, const char *name) {
  return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)strlen(name));
}

int braid__sock_local_port(int fd) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) return -1;
  return braid__sock_addr_port((struct sockaddr *)&ss);
}
