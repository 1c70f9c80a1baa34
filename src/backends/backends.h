/* Every backend's table, for the registry (src/api/registry.c) and for
   backends that compose others. */
#ifndef BRAID_BACKENDS_H
#define BRAID_BACKENDS_H

#include "core/comm.h"

#ifndef BRAID_WITH_SELF
#define BRAID_WITH_SELF 1
#endif
#ifndef BRAID_WITH_SHM
#define BRAID_WITH_SHM 1
#endif
#ifndef BRAID_WITH_TCP
#define BRAID_WITH_TCP 1
#endif

extern const braid__backend braid__self_backend;
extern const braid__backend braid__shm_backend;
extern const braid__backend braid__tcp_backend;
extern const braid__backend braid__hier_backend;
extern const braid__backend braid__mpi_backend;
extern const braid__backend braid__nccl_backend;

#ifndef BRAID_WITH_MPI
#define BRAID_WITH_MPI 0
#endif

#ifndef BRAID_WITH_NCCL
#define BRAID_WITH_NCCL 0
#endif

#ifndef BRAID_WITH_HIER
#define BRAID_WITH_HIER 1
#endif

/* The node this process runs on, as hier and the automatic choice of a
   backend count nodes: BRAID_NODE_ID, else host name and boot id. */
void braid__node_key(char *out, size_t len);

#endif
