/*
 * Bootstrap of a world communicator: host or reach the rendezvous store, take
 * a namespace unique to the job, register, and wait until every rank has
 * joined. Backends find the store and the job's layout in the communicator's
 * boot. This layer knows ranks and namespaces, not communicators.
 *
 * Key layout, under "braid/<job id>/w<world size>/" for a process's first
 * world of the job at that store, "braid/<job id>/w<world size>.<n>/" for its
 * n-th later one (braid_init after braid_destroy; every rank counts alike):
 *   rank/<r>  "host=<hostname> pid=<pid> local_rank=<l>"  (registration)
 *   host/<hostname>  counter giving local rank/size when the launcher does not
 *   exit/<r>  set when rank r has freed its last communicator of the job
 *   c<id>/    prefix of a split child (its id in hex); backends add their own keys
 */
#ifndef BRAID_BOOTSTRAP_H
#define BRAID_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"
#include "bootstrap/env.h"
#include "bootstrap/store.h"

/* What a world communicator and its split children share in one process: the
   store it may host and the goodbye said when the last of them is freed. */
typedef struct braid__boot_shared braid__boot_shared;

typedef struct braid__boot {
  braid__launch_env env;               /* what the launcher said (rank/size of the world) */
  braid__store *store;          /* NULL when there is none (world size 1) */
  braid__boot_shared *shared;   /* NULL without a store */
  int hosting;                  /* this process hosts the store (rank 0 when the convention says so) */
  char prefix[BRAID__STORE_MAX_KEY / 2]; /* this communicator's namespace, already set on store */
  char job_prefix[BRAID__STORE_MAX_KEY / 2]; /* the world's namespace */
  char any_prefix[BRAID__STORE_MAX_KEY / 2]; /* the job's, whatever the world size (tell_unsized) */
  int rank, size;               /* of this communicator */
  int local_rank, local_size;   /* within this host, world communicator; known after rendezvous */
  double init_timeout_s;        /* bound of connects and rendezvous; 0: forever */
} braid__boot;

/*
 * World bootstrap for this process's rank of size (the world's, as detected
 * in env). With a store address: rank 0 starts the server when the
 * convention says it hosts it, every rank connects and registers, and all
 * wait for each other until env->init_timeout_s. Each call with a store takes
 * the next incarnation of (store address, job) in this process,
 * which names the world's namespace (above); in a later incarnation with
 * rank 0 hosting, the other ranks register only once rank 0 has, in the
 * store it started for this world. World size 1 needs no
 * rendezvous: *out gets a boot with store NULL (and env.store_owner NONE)
 * even when an address is configured, and nothing is hosted or dialled.
 * BRAID_IFNAME and BRAID_ADDR are checked here, so that a wrong interface or
 * an address that is not this host's fails at once (INVALID_ARG, naming the
 * variable) and the others are told (braid__bootstrap_tell_failed).
 *
 * Errors leave *out NULL and one sentence in err, without the call's name or
 * the rank (the caller adds those). They are BRAID_ERR_BOOTSTRAP (or
 * NO_MEMORY), a rendezvous that ran out of time included:
 *   "rendezvous timed out after 60 s: 3 of 4 ranks joined; missing rank 2"
 * (TIMEOUT is kept for calls on a live communicator, where it is fatal.)
 */
braid_status braid__bootstrap_world(int rank, int size, const braid__launch_env *env, braid__boot **out, char *err,
                                    size_t errlen);

/* A rank whose start failed before it could register tells the others,
 * within about 2 s, that it could not start and why (st, why), so that their
 * rendezvous fails now instead of at BRAID_INIT_TIMEOUT: the rest of env must
 * name a store. It is the path a wrong BRAID_IFNAME or BRAID_ADDR takes in
 * braid__bootstrap_world, for causes found before it:
 *  - rank and size known (a setting of this rank's own is malformed): to the
 *    world of size ranks, as rank;
 *  - rank < 0 (the launcher's rank variable is broken or out of range): to
 *    the world of size ranks, naming this host and pid instead;
 *  - size 0 (the launcher's size variable is broken): under a namespace of
 *    the job that does not name the size, which their rendezvous reads too.
 * It does not host a store. */
void braid__bootstrap_tell_failed(int rank, int size, const braid__launch_env *env, braid_status st,
                                  const char *why);

/* The boot of a split child (rank of size, id child_id): a clone of parent's
   store connection with the namespace "<job prefix>c<child id in hex>/". No
   store traffic besides the connect; a parent without a store gives a child
   without one, and a NULL parent a NULL child. Errors as above. */
braid_status braid__bootstrap_split(const braid__boot *parent, int rank, int size, uint64_t child_id,
                                    braid__boot **out, char *err, size_t errlen);

/* Frees b (NULL is fine). When the last boot of the job in this process goes,
   the process says goodbye (key exit/<world rank>); the one hosting the store
   keeps it up until every rank has said it or timeout_s passed, so slower
   ranks still reach it. */
void braid__bootstrap_free(braid__boot *b, double timeout_s);

/*
 * Failure spread (the core's wait engine). braid__boot_set sets key, under
 * b->prefix, to val (waiting for the reply as long as any store write does).
 * braid__boot_peek reads key without waiting for it to appear: 1 and *val
 * (malloc'd) when it exists, 0 when it does not, -1 when the store cannot be
 * asked (gone, or no reply within reply_timeout_s); it never blocks longer,
 * even on a stuck store. Without a store (world size 1) there is no one to
 * tell or hear from: set stores nothing and returns OK, peek returns 0.
 */
braid_status braid__boot_set(braid__boot *b, const char *key, const void *val, size_t len);
int braid__boot_peek(braid__boot *b, const char *key, void **val, size_t *len, double reply_timeout_s);

/* A rank whose start failed (braid_init, or a split child) tells the
   communicator's other ranks why, so that their starts fail at once instead
   of at their deadlines: key start/failed of b's namespace holds "<status>
   <rank> <sentence>" (rank as the communicator names it), and the first
   cause written stays. braid__boot_start_failure reads it without waiting
   (1 when there is one); a child's boot also reads the world's (a
   backend's parts start within the world's init). */
void braid__boot_say_start_failed(braid__boot *b, int rank, int status, const char *text);
int braid__boot_start_failure(braid__boot *b, int *rank, int *status, char *text, size_t len);

/* The status the other ranks take for a start failure relayed to them: a
   wrong setting or build (BRAID_ERR_INVALID_ARG, BRAID_ERR_UNSUPPORTED) is
   wrong for every rank alike; any other cause is their peer lost. */
braid_status braid__boot_relayed_status(int status);

/* After a failed start, how long a rank hosting the store keeps it up for
   the others to read why and leave (braid__bootstrap_free's timeout). */
#define BRAID__BOOT_FAILED_LINGER_S 5.0

/* The pid world rank w registered (rank/<w> in the world's namespace), read
   without waiting; 0 when it has not registered yet, runs on another host or
   the store cannot say.
   Usable from a child's boot as well (ranks are the world's). */
long braid__boot_world_pid(braid__boot *b, int w);

/*
 * Data-plane listener: a listening, non-blocking, CLOEXEC TCP socket for a
 * backend's connections, and the address peers should dial.
 *  - BRAID_ADDR: bind and advertise that address.
 *  - BRAID_IFNAME: bind and advertise the interface's address (IPv4 first).
 *  - otherwise: advertise the address of the route toward the store (loopback
 *    when the store is local, then bound to loopback), bind the wildcard.
 *  - BRAID_PORT_RANGE: ports tried in turn from an offset by local rank,
 *    EADDRINUSE moves to the next; otherwise the kernel picks one.
 */
typedef struct braid__listener {
  int fd;
  int port;
  char addr[64]; /* numeric address to advertise, without brackets */
} braid__listener;

braid_status braid__listen_dataplane(const braid__boot *b, int backlog, braid__listener *out, char *err,
                                     size_t errlen);

/* Lower layers of the above, also used by tests. */
/* Binds bind_addr (numeric; NULL: IPv4 wildcard) on a port in [lo, hi] (lo = hi = 0: any),
   starting at lo + start_offset % span. */
braid_status braid__listen_range(const char *bind_addr, int lo, int hi, int start_offset, int backlog, int *fd,
                                 int *port, char *err, size_t errlen);
/* Numeric address of interface ifname (IPv4 preferred); an unknown name gives
   BRAID_ERR_BOOTSTRAP listing the interfaces that exist. */
braid_status braid__iface_addr(const char *ifname, char *addr, size_t addrlen, char *err, size_t errlen);

#endif
