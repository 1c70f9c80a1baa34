/* The backends this build has, filtered by the CMake BRAID_WITH_<NAME> options. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "backends/backends.h"

static const braid__backend *const backends[] = {
#if BRAID_WITH_SELF
    &braid__self_backend,
#endif
#if BRAID_WITH_SHM
    &braid__shm_backend,
#endif
#if BRAID_WITH_TCP
    &braid__tcp_backend,
#endif
#if BRAID_WITH_HIER
    &braid__hier_backend,
#endif
#if BRAID_WITH_MPI
    &braid__mpi_backend,
#endif
#if BRAID_WITH_NCCL
    &braid__nccl_backend,
#endif
    NULL,
};

const braid__backend *braid__backend_find(const char *name) {
  for (size_t i = 0; backends[i]; i++)
    if (!strcmp(backends[i]->name, name)) return backends[i];
  return NULL;
}

static char backend_names[128];
static pthread_once_t backend_names_once = PTHREAD_ONCE_INIT;

static void fill_backend_names(void) {
  size_t o = 0;
  for (size_t i = 0; backends[i] && o < sizeof backend_names; i++) {
    int n = snprintf(backend_names + o, sizeof backend_names - o, "%s%s", i ? ", " : "", backends[i]->name);
    if (n < 0) break;
    o += (size_t)n;
  }
}

const char *braid__backend_names(void) {
  pthread_once(&backend_names_once, fill_backend_names);
  return backend_names;
}
