/*
 * Bootstrap of a world communicator: host or reach the rendezvous store, take
 * a namespace unique to the job, register, and wait until every rank has
 * joined. Backends find the store and the job's layout in c->boot.
 *
 * Key layout, under "braid/<job id>/w<world size>/":
 *   rank/<r>  "host=<hostname> pid=<pid> local_rank=<l>"  (registration)
 *   host/<hostname>  counter giving local rank/size when the launcher does not
 *   exit/<r>  set when rank r has freed its last communicator of the job
 *   c<id>/    prefix of a split child (its id in hex); backends add their own keys
 */
#ifndef BRAID_BOOTSTRAP_H
#define BRAID_BOOTSTRAP_H

#include <stddef.h>

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
  int rank, size;               /* of this communicator */
  int local_rank, local_size;   /* within this host, world communicator; known after rendezvous */
  double init_timeout_s;        /* bound of connects and rendezvous; 0: forever */
} braid__boot;

/*
 * World bootstrap, called by braid_init with c->rank/c->size/c->call set and
 * env detected. With a store address: rank 0 starts the server when the
 * convention says it hosts it, every rank connects and registers, and all
 * wait for each other until env->init_timeout_s. World size 1 needs no
 * rendezvous: *out gets a boot with store NULL (and env.store_owner NONE)
 * even when an address is configured, and nothing is hosted or dialled.
 * BRAID_IFNAME/BRAID_ADDR are checked here so a wrong interface fails at once.
 *
 * Errors are recorded on c with braid__fail and are BRAID_ERR_BOOTSTRAP,
 * including a rendezvous that ran out of time:
 *   "rendezvous timed out after 60 s: 3 of 4 ranks joined; missing rank 2"
 * (TIMEOUT is kept for calls on a live communicator, where it is fatal.)
 */
braid_status braid__bootstrap_world(braid_comm *c, const braid__launch_env *env, braid__boot **out);

/* Gives child (rank/size/id set) a clone of parent's store connection with the
   namespace "<parent prefix>c<child id>/". No store traffic besides the
   connect; a parent without boot gives a child without boot. Errors on child. */
braid_status braid__bootstrap_split(braid_comm *parent, braid_comm *child);

/* Frees c->boot (NULL is fine). When the last communicator of the job in this
   process goes, the process says goodbye (key exit/<world rank>); the one
   hosting the store keeps it up until every rank has said it or timeout_s
   passed, so slower ranks still reach it. */
void braid__bootstrap_free(braid_comm *c, double timeout_s);

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
