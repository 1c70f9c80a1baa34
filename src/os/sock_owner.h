/*
 * Who owns the other end of a TCP connection on this host, as the kernel
 * tells it (NETLINK_SOCK_DIAG, one lookup by the connection's exact
 * addresses and ports: it costs the same however many sockets the host has).
 */
#ifndef BRAID_OS_SOCK_OWNER_H
#define BRAID_OS_SOCK_OWNER_H

#include <stddef.h>
#include <sys/types.h>

enum {
  BRAID__OWNER_OK = 0,      /* *uid is the owner */
  BRAID__OWNER_UNKNOWN = 1, /* no live socket of this host is that end (closed, or another host's) */
  BRAID__OWNER_ERR = -1     /* the kernel cannot be asked */
};

/* The user owning the peer's socket of the connected TCP socket fd: the
   socket whose local end is fd's remote one and the other way round. Only a
   socket that is still open in some process counts: a closed one leaves a
   remnant (time-wait, or orphaned) that belongs to no user, which the kernel
   lists as uid 0, so it gives UNKNOWN rather than a uid. why (not for OK)
   receives a clause saying what was found, e.g. "its socket is already
   closed, so its user cannot be told". */
int braid__sock_peer_owner(int fd, uid_t *uid, char *why, size_t whylen);

#endif
