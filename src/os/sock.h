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

/* "1.2.3.4:5" or "[::1]:5". */
void braid__sock_addr_format(const struct sockaddr *sa, char *out, size_t outlen);
/* host and port as one string, IPv6 literals bracketed. */
void braid__sock_hostport(const char *host, int port, char *out, size_t outlen);
/* Whether sa is a loopback address (127/8, ::1, or IPv4-mapped 127/8). */
int braid__sock_is_loopback(const struct sockaddr *sa);
/* Port a socket is bound to, -1 on error. */
int braid__sock_local_port(int fd);

#endif
