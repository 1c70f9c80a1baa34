/* Environment parameters: the ids and table generated from the one list in
   core/params_list.h, typed accessors that fall back to the list's default,
   and the strict parsers they share. Precedence: a braid_config field (the
   caller's business) > the variable > the list's default. Empty values count
   as unset. */
#ifndef BRAID_PARAMS_H
#define BRAID_PARAMS_H

#include <stddef.h>
#include <stdio.h>

#include "braid.h"
#include "core/params_list.h"

typedef enum braid__param_type { BRAID_PT_STRING, BRAID_PT_INT, BRAID_PT_SECONDS, BRAID_PT_SIZE } braid__param_type;

typedef enum braid__param_id {
#define BRAID__PARAM_ID(id, name, type, def, doc) BRAID_P_##id,
  BRAID_PARAM_LIST(BRAID__PARAM_ID)
#undef BRAID__PARAM_ID
  BRAID_P_COUNT
} braid__param_id;

typedef struct braid__param {
  const char *name;
  braid__param_type type;
  const char *def; /* textual default; NULL when there is none */
  const char *doc;
} braid__param;

/* The list as a table, in list order (entry i has id i). */
const braid__param *braid__param_table(size_t *n);
const char *braid__param_name(braid__param_id id);
/* The list's default text (NULL when there is none). */
const char *braid__param_default(braid__param_id id);
/* "string", "int", "seconds", "size". */
const char *braid__param_type_name(braid__param_type t);

/* Value of an environment variable, NULL when unset or empty. */
const char *braid__env(const char *name);
/* The variable's value when set (non-empty), else NULL: no default. */
const char *braid__param_env(braid__param_id id);
/* The variable's value when set, else the list's default (may be NULL). */
const char *braid__param_str(braid__param_id id);

/*
 * Typed accessors: OK and *out from the variable, or from the list's default
 * when it is unset (unset without a default leaves *out as it is). A value
 * the parser rejects or outside [lo, hi] gives BRAID_ERR_INVALID_ARG and one
 * sentence in err naming the variable, the value and what is accepted:
 *   BRAID_SHM_CMA="2" is not an integer in [0, 1]
 *   BRAID_TIMEOUT="soon" is not a non-negative number of seconds
 *   BRAID_SHM_BUFFER="-1" is not a size (bytes, or with a K/M/G suffix)
 *   BRAID_SHM_BUFFER="2G" is out of range [64K, 1G]
 * Asking for the wrong type, or a default the parser or the bounds reject,
 * is a bug in braid: BRAID_ERR_INTERNAL with a sentence saying so.
 */
braid_status braid__param_int(braid__param_id id, long lo, long hi, long *out, char *err, size_t errlen);
braid_status braid__param_seconds(braid__param_id id, double *out, char *err, size_t errlen);
braid_status braid__param_size(braid__param_id id, size_t lo, size_t hi, size_t *out, char *err, size_t errlen);

/* The same for a value that came from somewhere else than getenv (a launcher
   environment read through a callback); value NULL or empty: the default. */
braid_status braid__param_parse_int(braid__param_id id, const char *value, long lo, long hi, long *out, char *err,
                                    size_t errlen);
braid_status braid__param_parse_seconds(braid__param_id id, const char *value, double *out, char *err,
                                        size_t errlen);
braid_status braid__param_parse_size(braid__param_id id, const char *value, size_t lo, size_t hi, size_t *out,
                                     char *err, size_t errlen);

/* The parameter table as Markdown (variable, type, default, meaning), the
   text docs/ENVIRONMENT.md holds between its params markers. */
void braid__param_markdown(FILE *f);

/*
 * Strict parsers. Nothing but the value: no spaces before, inside or after,
 * no '+', and '-' only where negative values are allowed.
 *  - integers: decimal digits, '-' first only when lo < 0; -1 when malformed,
 *    too large for a long, or outside [lo, hi].
 *  - seconds: a finite, non-negative decimal number ("1.5", "2e3"),
 *    optionally followed by "s"; no NaN, inf or hex.
 *  - sizes: decimal digits, then optionally K, M or G (powers of 1024, either
 *    case, "i" and "B" allowed after: "8MiB"), or "B" alone. -1 when
 *    malformed, -2 when the value does not fit a size_t.
 */
int braid__parse_long(const char *s, long lo, long hi, long *out);
int braid__parse_seconds(const char *s, double *out);
int braid__parse_size(const char *s, size_t *out);

/* "64K", "8M", "1G", or plain bytes: the largest unit that divides v. */
void braid__format_size(size_t v, char *out, size_t len);

/* Older name-based helpers, with the same parsers and messages; the default
   is the caller's. */
braid_status braid__env_int(const char *name, long def, long lo, long hi, long *out, char *err, size_t errlen);
braid_status braid__env_seconds(const char *name, double def, double *out, char *err, size_t errlen);
braid_status braid__env_size(const char *name, size_t def, size_t *out, char *err, size_t errlen);

#endif
