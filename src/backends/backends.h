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

extern const braid__backend braid__self_backend;
extern const braid__backend braid__shm_backend;

#endif
