/* braid-info: version, built backends, reduction kernels in use, every
   environment parameter with its default and current value, and the
   collective algorithms; --markdown prints the parameter table that
   docs/ENVIRONMENT.md holds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/algos.h"
#include "api/api.h"
#include "braid.h"
#include "core/params.h"
#include "core/reduce.h"

static void print_line(const char *line, void *arg) {
  (void)arg;
  printf("  %s\n", line);
}

/* Which collectives each backend runs natively; the others (and any that
   BRAID_ALGO names) take the generic algorithms above. */
static void print_native(void) {
  char names[256];
  snprintf(names, sizeof names, "%s", braid__backend_names());
  printf("\nnative collectives (BRAID_ALGO=op=native; the rest use the table above)\n");
  for (char *save = NULL, *name = strtok_r(names, ", ", &save); name; name = strtok_r(NULL, ", ", &save)) {
    const braid__backend *b = braid__backend_find(name);
    if (!b) continue;
    const struct {
      const void *fn;
      int kind;
    } colls[] = {{(const void *)b->all_reduce, BRAID__COLL_ALL_REDUCE},
                 {(const void *)b->broadcast, BRAID__COLL_BROADCAST},
                 {(const void *)b->all_gather, BRAID__COLL_ALL_GATHER},
                 {(const void *)b->reduce_scatter, BRAID__COLL_REDUCE_SCATTER},
                 {(const void *)b->barrier, BRAID__COLL_BARRIER},
                 {(const void *)b->reduce, BRAID__COLL_REDUCE},
                 {(const void *)b->gather, BRAID__COLL_GATHER},
                 {(const void *)b->scatter, BRAID__COLL_SCATTER},
                 {(const void *)b->all_to_all, BRAID__COLL_ALL_TO_ALL},
                 {(const void *)b->all_to_allv, BRAID__COLL_ALL_TO_ALLV}};
    printf("  %s:", name);
    int any = 0;
    for (size_t i = 0; i < sizeof colls / sizeof colls[0]; i++)
      if (colls[i].fn) printf("%s %s", any++ ? "," : "", braid__coll_short_name(colls[i].kind));
    /* Some of them only up to a size: the larger calls take the table. */
    printf("%s%s\n", any ? "" : " none", b->declines ? " (some only for small sizes)" : "");
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
    printf("usage: braid-info [--markdown]\n  Prints braid's version, the backends built in, the reduction kernels\n"
           "  chosen for this CPU, every environment variable braid reads, and the\n"
           "  collective algorithms.\n"
           "  --markdown  only the environment variables, as a Markdown table (the one\n"
           "              docs/ENVIRONMENT.md holds)\n");
    return 0;
  }
  if (argc > 1 && !strcmp(argv[1], "--markdown")) {
    braid__param_markdown(stdout);
    return 0;
  }
  if (argc > 1) {
    fprintf(stderr, "braid-info: unknown argument \"%s\" (try --help)\n", argv[1]);
    return 2;
  }
  printf("braid %s\n", braid_version());
  printf("backends: %s\n", braid__backend_names());
  printf("reduction kernels: %s\n\n", braid__reduce_isa());
  size_t n;
  const braid__param *p = braid__param_table(&n);
  printf("%-24s %-8s %-10s %-12s %s\n", "variable", "type", "default", "set to", "meaning");
  for (size_t i = 0; i < n; i++) {
    const char *v = braid__env(p[i].name);
    /* The job token is a secret: say whether it is set, never print it. */
    if (v && i == BRAID_P_TOKEN) v = "(set)";
    printf("%-24s %-8s %-10s %-12s %s\n", p[i].name, braid__param_type_name(p[i].type), p[i].def ? p[i].def : "-",
           v ? v : "-", p[i].doc);
  }
  printf("\ncollective algorithms (BRAID_ALGO=op=name,...)\n");
  braid__algo_describe(print_line, NULL);
  print_native();
  return 0;
}
