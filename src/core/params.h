/* Every environment parameter braid reads, declared once (name, type, default,
   one-line doc). braid-info prints the table; docs/ENVIRONMENT.md lists it. */
#ifndef BRAID_PARAMS_H
#define BRAID_PARAMS_H

#include <stddef.h>

#include "braid.h"

typedef enum braid__param_type { BRAID_PT_STRING, BRAID_PT_INT, BRAID_PT_SECONDS, BRAID_PT_SIZE } braid__param_type;

typedef struct braid__param {
  const char *name;
  braid__param_type type;
  const char *def; /* textual default; NULL when there is none */
  const char *doc;
} braid__param;

const braid__param *braid__param_table(size_t *n);

/* Value of an environment variable, NULL when unset or empty. */
const char *braid__env(const char *name);

/* Parse helpers: OK and *out set; OK and *out = def when unset; INVALID_ARG with
   a sentence in err (naming the variable and the bad value) when malformed. */
braid_status braid__env_int(const char *name, long def, long lo, long hi, long *out, char *err, size_t errlen);
braid_status braid__env_seconds(const char *name, double def, double *out, char *err, size_t errlen);
/* Sizes accept K/M/G suffixes (powers of 1024). */
braid_status braid__env_size(const char *name, size_t def, size_t *out, char *err, size_t errlen);

/* Same parsers for a string that did not come from the environment. */
int braid__parse_seconds(const char *s, double *out);
int braid__parse_size(const char *s, size_t *out);

#endif
