/* Communicators made from another: split children and sub-communicators of
   another backend over a subset of ranks (a hierarchical backend's node-local
   and cross-node parts). */
#ifndef BRAID_SUBCOMM_H
#define BRAID_SUBCOMM_H

#include <stdint.h>

#include "core/comm.h"

/* The id of the child made by the ordinal-th split of parent with color:
   unique within a job, never 0. */
uint64_t braid__child_id(uint64_t parent, uint32_t ordinal, uint32_t color);

/* Builds a communicator of backend ops whose rank i is parent rank
   members[i]; this rank is member newrank. Collective over the members
   only; every member passes the same members, ordinal and color. A backend
   the same as the parent's uses its split hook, any other its init over the
   child's store namespace. Settings (timeouts, check, algorithms) are the
   parent's. Errors are recorded on parent too. With BRAID__SUB_LABEL the
   child names ranks the way parent does from its first sentence on (a
   backend's internal parts report the ranks the user knows, even when
   their start fails). */
enum { BRAID__SUB_LABEL = 1u << 0 };
braid_status braid__comm_sub(braid_comm *parent, const braid__backend *ops, const int *members, int n, int newrank,
                             uint32_t ordinal, uint32_t color, unsigned flags, braid_comm **out);

/* While c starts (init or split): a rank of its scope (see braid_comm.scope)
   whose process has exited on this host fails the start for this rank with
   BRAID_ERR_PEER_LOST naming it, and so does a rank whose start failed
   (braid__start_failed; a wrong setting keeps its status), instead of the
   start waiting out its deadline. Backends call it between short waits for
   their peers. */
braid_status braid__start_check(braid_comm *c, const char *during);

/* Its start failed on this rank with st: c's other ranks are told why
   (their start checks fail at once, naming this rank and the cause),
   unless the cause was a timeout, a lost peer or another rank's failure,
   which they see for themselves. */
void braid__start_failed(braid_comm *c, braid_status st);

/* Its start failed on this rank: c's last error as the others should read
   it (without the call's name and this rank's), into out. Returns its length. */
size_t braid__start_sentence(braid_comm *c, char *out, size_t len);

/* Rank origin's start failed with st, saying why: c's start fails too,
   naming it (a wrong setting keeps its status; anything else is
   BRAID_ERR_PEER_LOST), and is not told again. */
braid_status braid__start_relay(braid_comm *c, int origin, int st, const char *why);

/* braid__store_get of key in c's namespace, with a start check between
   short waits: a peer that died or failed its start ends the wait at once.
   Every failure is recorded on c; a store that fails or stays silent until
   deadline is BRAID_ERR_BOOTSTRAP, "could not learn <what>: <why>". */
braid_status braid__start_get(braid_comm *c, const char *key, void **val, size_t *len, double deadline,
                              const char *what, const char *during);

/* Frees a communicator made by braid__comm_sub or braid_init (called
   without its lock): bounded completion of pending work (timeout_s; < 0:
   its destroy timeout; 0 when it failed), the backend's state, the
   bootstrap state, the object. */
void braid__comm_release(braid_comm *c, double timeout_s);
/* The same with c->lock held (released with the object). */
void braid__comm_release_locked(braid_comm *c, double timeout_s);

/* After a backend's init: checks forced algorithms against what it has and
   joins the live communicators. */
braid_status braid__comm_start(braid_comm *c);

#endif
