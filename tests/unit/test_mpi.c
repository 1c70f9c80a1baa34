/* The mpi backend from the outside, without a launcher: it is in the
   registry exactly when CMake found an MPI; without one, braid_init names
   the package to install; braid_config's mpi_comm field keeps the struct's
   rule (a program built against the older, shorter struct still works).
   Runs under mpiexec are in tests/mpi. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "backends/backends.h"
#include "harness.h"

static int test_registry(void) {
  const char *names = braid__backend_names();
  int listed = strstr(names, "mpi") != NULL;
  BT_CHECK(listed == BRAID_WITH_MPI, "backends \"%s\" with BRAID_WITH_MPI=%d", names, BRAID_WITH_MPI);
  if (BRAID_WITH_MPI) {
    const braid__backend *b = braid__backend_find("mpi");
    BT_CHECK(b && (b->caps & BRAID__CAP_OWN_WORLD) && !(b->caps & BRAID__CAP_NEEDS_STORE), "mpi caps");
    /* Every collective is MPI's own. */
    BT_CHECK(b->all_reduce && b->broadcast && b->all_gather && b->reduce_scatter && b->reduce && b->gather &&
                 b->scatter && b->all_to_all && b->all_to_allv && b->barrier,
             "a native collective is missing");
  }
  return 0;
}

static int test_not_built(void) {
  if (BRAID_WITH_MPI) return 0;
  braid_config cfg = BRAID_CONFIG_INIT;
  cfg.backend = "mpi";
  braid_comm *c = NULL;
  BT_CHECK_ST(braid_init(&cfg, &c), BRAID_ERR_UNSUPPORTED, NULL);
  BT_CHECK(c == NULL, "a communicator came back");
  BT_CHECK_MSG(NULL, "backend mpi was not built");
  BT_CHECK_MSG(NULL, "libopenmpi-dev");
  return 0;
}

static int test_config_layout(void) {
  braid_config cfg = BRAID_CONFIG_INIT;
  BT_CHECK(cfg.mpi_comm == NULL, "mpi_comm defaults to NULL");
  BT_CHECK(offsetof(braid_config, mpi_comm) >= offsetof(braid_config, init_timeout_s) + sizeof(double),
           "mpi_comm is after every older field");
  /* A program built before mpi_comm existed: its struct_size ends at
     init_timeout_s, and braid_init still takes it. */
  cfg.struct_size = offsetof(braid_config, init_timeout_s) + sizeof(double);
  cfg.backend = "self";
  braid_comm *c = NULL;
  BT_CHECK_OK(braid_init(&cfg, &c), NULL);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      {"registry", test_registry, 30},
      {"not_built", test_not_built, 30},
      {"config_layout", test_config_layout, 30},
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
