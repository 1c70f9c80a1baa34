#include "os/sock_owner.h"

#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* TCP states as the kernel numbers them (include/net/tcp_states.h). */
enum { ST_ESTABLISHED = 1, ST_FIN_WAIT1 = 4, ST_FIN_WAIT2 = 5, ST_CLOSE_WAIT = 8 };

/* States of a connected socket that some process may still hold open. A
   time-wait or request socket is a remnant without a file, whose uid field
   the kernel fills with 0; it never counts. */
static int live_state(unsigned st) {
  return st == ST_ESTABLISHED || st == ST_FIN_WAIT1 || st == ST_FIN_WAIT2 || st == ST_CLOSE_WAIT;
}

/* Address and port of ss into a diag socket id (network byte order, as the
   kernel expects). 0, or -1 for a family other than fam. */
static int put_end(const struct sockaddr_storage *ss, int fam, __be16 *port, __be32 addr[4]) {
  if (ss->ss_family != fam) return -1;
  if (fam == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    *port = a->sin_port;
    memcpy(addr, &a->sin_addr, 4);
    return 0;
  }
  if (fam == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    *port = a->sin6_port;
    memcpy(addr, &a->sin6_addr, 16);
    return 0;
  }
  return -1;
}

static const char *state_name(unsigned st) {
  static const char *const names[] = {"?",          "ESTABLISHED", "SYN_SENT", "SYN_RECV",  "FIN_WAIT1",
                                      "FIN_WAIT2",  "TIME_WAIT",   "CLOSE",    "CLOSE_WAIT", "LAST_ACK",
                                      "LISTEN",     "CLOSING",     "NEW_SYN_RECV"};
  return st < sizeof names / sizeof names[0] ? names[st] : "?";
}

int braid__sock_peer_owner(int fd, uid_t *uid, char *why, size_t whylen) {
  struct sockaddr_storage me, peer;
  socklen_t ml = sizeof me, pl = sizeof peer;
  if (getsockname(fd, (struct sockaddr *)&me, &ml) != 0 || getpeername(fd, (struct sockaddr *)&peer, &pl) != 0) {
    int e = errno;
    snprintf(why, whylen, "its addresses cannot be read (%s), so its user cannot be told", strerror(e));
    return e == ENOTCONN ? BRAID__OWNER_UNKNOWN : BRAID__OWNER_ERR;
  }
  struct {
    struct nlmsghdr nlh;
    struct inet_diag_req_v2 r;
  } req;
  memset(&req, 0, sizeof req);
  req.nlh.nlmsg_len = sizeof req;
  req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  req.nlh.nlmsg_flags = NLM_F_REQUEST; /* one socket by its exact id, not a dump */
  req.nlh.nlmsg_seq = 1;
  req.r.sdiag_family = (uint8_t)me.ss_family;
  req.r.sdiag_protocol = IPPROTO_TCP;
  req.r.idiag_states = ~0u;
  req.r.id.idiag_cookie[0] = req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  /* The peer's socket: its local end is our remote one. */
  if (put_end(&peer, me.ss_family, &req.r.id.idiag_sport, req.r.id.idiag_src) ||
      put_end(&me, me.ss_family, &req.r.id.idiag_dport, req.r.id.idiag_dst)) {
    snprintf(why, whylen, "it is not a TCP/IP connection, so its user cannot be told");
    return BRAID__OWNER_ERR;
  }
  int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) {
    snprintf(why, whylen, "the kernel cannot be asked who owns its socket (socket(NETLINK_SOCK_DIAG): %s)",
             strerror(errno));
    return BRAID__OWNER_ERR;
  }
  /* The kernel answers while handling the request; the bound only guards
     against a kernel that never does. */
  struct timeval tv = {1, 0};
  (void)setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_nl kernel;
  memset(&kernel, 0, sizeof kernel);
  kernel.nl_family = AF_NETLINK;
  ssize_t n;
  do {
    n = sendto(nl, &req, sizeof req, 0, (struct sockaddr *)&kernel, sizeof kernel);
  } while (n < 0 && errno == EINTR);
  uint32_t buf[2048]; /* aligned for netlink headers */
  if (n == (ssize_t)sizeof req) {
    do {
      n = recv(nl, buf, sizeof buf, 0);
    } while (n < 0 && errno == EINTR);
  } else if (n >= 0) {
    n = -1;
    errno = EIO;
  }
  int e = errno;
  close(nl);
  if (n < 0) {
    snprintf(why, whylen, "the kernel cannot be asked who owns its socket (NETLINK_SOCK_DIAG: %s)", strerror(e));
    return BRAID__OWNER_ERR;
  }
  const uint8_t *p = (const uint8_t *)buf;
  for (size_t off = 0; off + NLMSG_HDRLEN <= (size_t)n;) {
    struct nlmsghdr h;
    memcpy(&h, p + off, sizeof h);
    if (h.nlmsg_len < NLMSG_HDRLEN || h.nlmsg_len > (size_t)n - off) break;
    const uint8_t *data = p + off + NLMSG_HDRLEN;
    size_t dlen = h.nlmsg_len - NLMSG_HDRLEN;
    off += NLMSG_ALIGN(h.nlmsg_len);
    if (h.nlmsg_seq != req.nlh.nlmsg_seq) continue;
    if (h.nlmsg_type == NLMSG_ERROR && dlen >= sizeof(struct nlmsgerr)) {
      struct nlmsgerr err;
      memcpy(&err, data, sizeof err);
      if (err.error == -ENOENT) {
        snprintf(why, whylen, "its socket is not among this host's open sockets (closed already?), so its user "
                              "cannot be told");
        return BRAID__OWNER_UNKNOWN;
      }
      snprintf(why, whylen, "the kernel cannot be asked who owns its socket (NETLINK_SOCK_DIAG: %s)",
               strerror(-err.error));
      return BRAID__OWNER_ERR;
    }
    if (h.nlmsg_type != SOCK_DIAG_BY_FAMILY || dlen < sizeof(struct inet_diag_msg)) continue;
    struct inet_diag_msg m;
    memcpy(&m, data, sizeof m);
    if (!live_state(m.idiag_state) || m.idiag_inode == 0 || m.id.idiag_sport != req.r.id.idiag_sport ||
        m.id.idiag_dport != req.r.id.idiag_dport) {
      snprintf(why, whylen, "its socket is already closed (what is left of it, in state %s, belongs to no "
                            "user), so its user cannot be told", state_name(m.idiag_state));
      return BRAID__OWNER_UNKNOWN;
    }
    *uid = (uid_t)m.idiag_uid;
    return BRAID__OWNER_OK;
  }
  snprintf(why, whylen, "the kernel's answer about its socket cannot be read (NETLINK_SOCK_DIAG)");
  return BRAID__OWNER_ERR;
}
