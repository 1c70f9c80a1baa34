/*
 * Socket helpers without rank logic: name resolution, connect with a
 * deadline, full reads/writes with a deadline (EINTR retried, EAGAIN polled),
 * socket options, address formatting. Deadlines are absolute monotonic
 * seconds (braid__now(); INFINITY waits forever). Writes use MSG_NOSIGNAL so
 * a closed peer gives EPIPE instead of SIGPIPE.
 */
#ifndef BRAID_OS_SOCK_H
#define BRAID_OS_SOCK_H

#include <netdb.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* Results of the I/O helpers. errno is set for BRAID__SOCK_ERR. */
enum {
  BRAID__SOCK_OK = 0,
  BRAID__SOCK_ERR = -1,     /* an OS error; see errno */
  BRAID__SOCK_TIMEOUT = -2, /* the deadline passed */
  BRAID__SOCK_CLOSED = -3   /* the peer closed (EOF, reset or broken pipe) */
};

/* Milliseconds until deadline for poll(): -1 for INFINITY, 0 once passed,
   rounded up so a wake-up is never early, capped at INT_MAX. */
int braid__sock_poll_ms(double deadline);
/* poll() on one fd until deadline, EINTR retried. Returns 1 ready (*revents
   set, may be NULL), 0 on timeout, -1 on error. */
int braid__sock_poll1(int fd, short events, double deadline, short *revents);

int braid__sock_set_nonblock(int fd, int on);
int braid__sock_set_cloexec(int fd);
int braid__sock_set_nodelay(int fd);
/* Dead-peer detection for long-lived idle connections (ignored where unsupported). */
int braid__sock_set_keepalive(int fd, int idle_s, int interval_s, int count);

/* getaddrinfo for host:port (host NULL with passive: wildcard). Returns 0 or
   an EAI_* code (gai_strerror). */
int braid__sock_resolve(const char *host, int port, int passive, struct addrinfo **res);
/* Non-blocking connect to one address, waiting until deadline. Returns 0 and
   *fd (non-blocking, CLOEXEC, NODELAY), else an errno value (ETIMEDOUT when
   the deadline passed). */
int braid__sock_connect_addr(const struct sockaddr *sa, socklen_t salen, double deadline, int *fd);
/* One attempt over every address host resolves to. Returns 0 and *fd, else
   the errno of the last failure (> 0); a resolution failure returns the
   EAI_* code, made negative if it is not already (glibc's are). why (may be
   NULL) receives a description of the last failure. */
int braid__sock_connect(const char *host, int port, double deadline, int *fd, char *why, size_t whylen);

/* Whole-buffer transfers; they work on blocking and non-blocking sockets. */
int braid__sock_write_full(int fd, const void *buf, size_t len, double deadline);
int braid__sock_writev_full(int fd, struct iovec *iov, int iovcnt, double deadline); /* modifies iov */
int braid__sock_read_full(int fd, void *buf, size_t len, double deadline);
/* One non-blocking step: *done bytes moved (0 when the call would block).
   Returns OK, CLOSED (EOF / reset / broken pipe) or ERR. */
int braid__sock_send_some(int fd, const void *buf, size_t len, size_t *done);
int braid__sock_recv_some(int fd, void *buf, size_t len, size_t *done);

/* Flags of braid__sock_listen. Without either IPv6 flag an IPv6 socket keeps
   the system's IPV6_V6ONLY setting. */
enum {
  BRAID__SOCK_REUSEADDR = 1 << 0,  /* SO_REUSEADDR: rebind a port whose old connections linger in TIME_WAIT */
  BRAID__SOCK_DUAL_STACK = 1 << 1, /* IPv6: accept IPv4 clients too (IPV6_V6ONLY off) */
  BRAID__SOCK_V6ONLY = 1 << 2      /* IPv6: IPv6 clients only (IPV6_V6ONLY on) */
};
/* A listening TCP socket (non-blocking, CLOEXEC) bound to sa; backlog <= 0
   means 128. Returns 0 and *fd; a positive errno value when bind or listen
   failed; minus the errno value when no socket could be created. */
int braid__sock_listen(const struct sockaddr *sa, socklen_t len, int backlog, unsigned flags, int *fd);
/* The same on a port of [lo, hi] (0 < lo <= hi): ports are tried from
   lo + start % (hi - lo + 1) on, wrapping around, and a port in use
   (EADDRINUSE) moves to the next; EADDRINUSE once every port was tried. lo = 0:
   one try at the port already in ss (0: the kernel picks). ss's port is left
   at the port last tried, so a caller can name it in an error; hi < lo gives
   EINVAL. */
int braid__sock_listen_range(struct sockaddr_storage *ss, socklen_t len, int lo, int hi, int start, int backlog,
                             unsigned flags, int *fd);

/* "1.2.3.4:5" or "[::1]:5". */
void braid__sock_addr_format(const struct sockaddr *sa, char *out, size_t outlen);
/* host and port as one string, IPv6 literals bracketed. */
void braid__sock_hostport(const char *host, int port, char *out, size_t outlen);
/* Whether sa is a loopback address (127/8, ::1, or IPv4-mapped 127/8). */
int braid__sock_is_loopback(const struct sockaddr *sa);
/* Whether two IPv4/IPv6 addresses are the same address (ports ignored; an
   IPv4-mapped IPv6 address equals its IPv4 one). */
int braid__sock_same_ip(const struct sockaddr *a, const struct sockaddr *b);
/* TCP_NOTSENT_LOWAT: bytes the kernel may hold unsent (0 leaves the
   system's default). 0 or -1 with errno. */
int braid__sock_set_notsent_lowat(int fd, size_t bytes);
/* TCP_CONGESTION: the socket's congestion control into name (at most len
   bytes, terminated), and setting it. 0 or -1 with errno (ENOENT: the
   kernel has no such algorithm; EPERM: not one this process may pick). */
int braid__sock_congestion(int fd, char *name, size_t len);
int braid__sock_set_congestion(int fd, const char *name);
/* Port of an IPv4 or IPv6 address (-1 for another family), and setting it. */
int braid__sock_addr_port(const struct sockaddr *sa);
void braid__sock_set_port(struct sockaddr_storage *ss, int port);
/* Port a socket is bound to, -1 on error. */
int braid__sock_local_port(int fd);

#endif
