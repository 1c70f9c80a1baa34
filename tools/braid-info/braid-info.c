/* braid-info: version, built backends, reduction kernels in use, and every
   environment parameter with its default and current value. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "braid.h"
#include "core/comm.h"
#include "core/params.h"
#include "core/reduce.h"

static const char *type_name(braid__param_type t) {
  switch (t) {
  case BRAID_PT_INT: return "int";
  case BRAID_PT_SECONDS: return "seconds";
  case BRAID_PT_SIZE: return "size";
  default: return "string";
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
    printf("usage: braid-info\n  Prints braid's version, the backends built in, the reduction kernels\n"
           "  chosen for this CPU, and every environment variable braid reads.\n");
    return 0;
  }
  printf("braid %s\n", braid_version());
  printf("backends: %s\n", braid__backend_names());
  printf("reduction kernels: %s\n\n", braid__reduce_isa());
  size_t n;
  const braid__param *p = braid__param_table(&n);
  printf("%-24s %-8s %-10s %-12s %s\n", "variable", "type", "default", "set to", "meaning");
  for (size_t i = 0; i < n; i++) {
    const char *v = getenv(p[i].name);
    /* The job token is a secret: say whether it is set, never print it. */
    if (v && !strcmp(p[i].name, "BRAID_TOKEN")) v = "(set)";
    printf("%-24s %-8s %-10s %-12s %s\n", p[i].name, type_name(p[i].type), p[i].def ? p[i].def : "-",
           v ? v : "-", p[i].doc);
  }
  return 0;
}
