/* Environment parameters (see params.h): the table generated from
   params_list.h, strict parsers, and accessors that parse the list's default
   with the same parser as the variable. */
#include "core/params.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const braid__param params[] = {
#define BRAID__PARAM_ROW(id, name, type, def, doc) {name, BRAID_PT_##type, def, doc},
    BRAID_PARAM_LIST(BRAID__PARAM_ROW)
#undef BRAID__PARAM_ROW
};

_Static_assert(sizeof params / sizeof params[0] == BRAID_P_COUNT, "one table row per parameter id");

const braid__param *braid__param_table(size_t *n) {
  *n = sizeof params / sizeof params[0];
  return params;
}

static const braid__param *param(braid__param_id id) {
  return (unsigned)id < (unsigned)BRAID_P_COUNT ? &params[id] : NULL;
}

const char *braid__param_name(braid__param_id id) {
  const braid__param *p = param(id);
  return p ? p->name : "(unknown parameter)";
}

const char *braid__param_default(braid__param_id id) {
  const braid__param *p = param(id);
  return p ? p->def : NULL;
}

const char *braid__param_type_name(braid__param_type t) {
  switch (t) {
  case BRAID_PT_INT: return "int";
  case BRAID_PT_SECONDS: return "seconds";
  case BRAID_PT_SIZE: return "size";
  default: return "string";
  }
}

const char *braid__env(const char *name) {
  const char *v = getenv(name);
  return (v && *v) ? v : NULL;
}

const char *braid__param_env(braid__param_id id) {
  const braid__param *p = param(id);
  return p ? braid__env(p->name) : NULL;
}

const char *braid__param_str(braid__param_id id) {
  const braid__param *p = param(id);
  if (!p) return NULL;
  const char *v = braid__env(p->name);
  return v ? v : p->def;
}

/* ---------------------------------------------------------------- parsers */

static int is_digit(char c) { return c >= '0' && c <= '9'; }

int braid__parse_long(const char *s, long lo, long hi, long *out) {
  if (!s) return -1;
  /* strtol would skip leading spaces and take '+': only digits, '-' where negatives are allowed. */
  const char *d = s[0] == '-' && lo < 0 ? s + 1 : s;
  if (!is_digit(*d)) return -1;
  char *end = NULL;
  errno = 0;
  long x = strtol(s, &end, 10);
  if (errno || *end || x < lo || x > hi) return -1;
  *out = x;
  return 0;
}

int braid__parse_seconds(const char *s, double *out) {
  if (!s) return -1;
  /* A digit or a point first rules out spaces, signs, "nan" and "inf". */
  if (!is_digit(s[0]) && !(s[0] == '.' && is_digit(s[1]))) return -1;
  if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) return -1; /* strtod reads hex floats */
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || !isfinite(v) || v < 0) return -1;
  if (*end == 's') end++;
  if (*end) return -1;
  *out = v;
  return 0;
}

int braid__parse_size(const char *s, size_t *out) {
  if (!s || !is_digit(s[0])) return -1; /* strtoull would take " -1" as 2^64 - 1 */
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  int overflow = errno == ERANGE;
  unsigned shift = 0;
  switch (*end) {
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  default: break;
  }
  if (shift && *end == 'i') end++; /* "Ki", "Mi", "Gi" */
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return -1;
  if (overflow || v > SIZE_MAX || v > (SIZE_MAX >> shift)) return -2;
  *out = (size_t)v << shift;
  return 0;
}

void braid__format_size(size_t v, char *out, size_t len) {
  static const struct {
    unsigned shift;
    char unit;
  } units[] = {{30, 'G'}, {20, 'M'}, {10, 'K'}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    size_t u = (size_t)1 << units[i].shift;
    if (v && v % u == 0) {
      snprintf(out, len, "%zu%c", v / u, units[i].unit);
      return;
    }
  }
  snprintf(out, len, "%zu", v);
}

/* ---------------------------------------------------------------- checks with messages */

static braid_status check_int(const char *name, const char *v, long lo, long hi, long *out, char *err,
                              size_t errlen) {
  if (braid__parse_long(v, lo, hi, out) == 0) return BRAID_OK;
  snprintf(err, errlen, "%s=\"%s\" is not an integer in [%ld, %ld]", name, v, lo, hi);
  return BRAID_ERR_INVALID_ARG;
}

static braid_status check_seconds(const char *name, const char *v, double *out, char *err, size_t errlen) {
  if (braid__parse_seconds(v, out) == 0) return BRAID_OK;
  snprintf(err, errlen, "%s=\"%s\" is not a non-negative number of seconds", name, v);
  return BRAID_ERR_INVALID_ARG;
}

static braid_status check_size(const char *name, const char *v, size_t lo, size_t hi, size_t *out, char *err,
                               size_t errlen) {
  size_t x = 0;
  int r = braid__parse_size(v, &x);
  if (r == -1) {
    snprintf(err, errlen, "%s=\"%s\" is not a size (bytes, or with a K/M/G suffix)", name, v);
    return BRAID_ERR_INVALID_ARG;
  }
  if (r == -2 || x < lo || x > hi) {
    char a[32], b[32];
    braid__format_size(lo, a, sizeof a);
    braid__format_size(hi, b, sizeof b);
    snprintf(err, errlen, "%s=\"%s\" is out of range [%s, %s]", name, v, a, b);
    return BRAID_ERR_INVALID_ARG;
  }
  *out = x;
  return BRAID_OK;
}

/* The parameter, checked to be of the type the accessor reads. */
static const braid__param *typed(braid__param_id id, braid__param_type t, char *err, size_t errlen) {
  const braid__param *p = param(id);
  if (!p)
    snprintf(err, errlen, "internal error: parameter id %d is not in the parameter list", (int)id);
  else if (p->type != t)
    snprintf(err, errlen, "internal error: %s is a %s parameter, read as %s", p->name, braid__param_type_name(p->type),
             braid__param_type_name(t));
  else
    return p;
  return NULL;
}

/* A default the parser or the caller's bounds reject is braid's own bug. */
static braid_status bad_default(const braid__param *p, const char *why, char *err, size_t errlen) {
  snprintf(err, errlen, "internal error: the built-in default of %s, \"%s\", is rejected: %s", p->name, p->def, why);
  return BRAID_ERR_INTERNAL;
}

braid_status braid__param_parse_int(braid__param_id id, const char *value, long lo, long hi, long *out, char *err,
                                    size_t errlen) {
  const braid__param *p = typed(id, BRAID_PT_INT, err, errlen);
  if (!p) return BRAID_ERR_INTERNAL;
  if (value && *value) return check_int(p->name, value, lo, hi, out, err, errlen);
  if (!p->def) return BRAID_OK;
  char why[256];
  if (check_int(p->name, p->def, lo, hi, out, why, sizeof why)) return bad_default(p, why, err, errlen);
  return BRAID_OK;
}

braid_status braid__param_parse_seconds(braid__param_id id, const char *value, double *out, char *err,
                                        size_t errlen) {
  const braid__param *p = typed(id, BRAID_PT_SECONDS, err, errlen);
  if (!p) return BRAID_ERR_INTERNAL;
  if (value && *value) return check_seconds(p->name, value, out, err, errlen);
  if (!p->def) return BRAID_OK;
  char why[256];
  if (check_seconds(p->name, p->def, out, why, sizeof why)) return bad_default(p, why, err, errlen);
  return BRAID_OK;
}

braid_status braid__param_parse_size(braid__param_id id, const char *value, size_t lo, size_t hi, size_t *out,
                                     char *err, size_t errlen) {
  const braid__param *p = typed(id, BRAID_PT_SIZE, err, errlen);
  if (!p) return BRAID_ERR_INTERNAL;
  if (value && *value) return check_size(p->name, value, lo, hi, out, err, errlen);
  if (!p->def) return BRAID_OK;
  char why[256];
  if (check_size(p->name, p->def, lo, hi, out, why, sizeof why)) return bad_default(p, why, err, errlen);
  return BRAID_OK;
}

braid_status braid__param_int(braid__param_id id, long lo, long hi, long *out, char *err, size_t errlen) {
  return braid__param_parse_int(id, braid__param_env(id), lo, hi, out, err, errlen);
}

braid_status braid__param_seconds(braid__param_id id, double *out, char *err, size_t errlen) {
  return braid__param_parse_seconds(id, braid__param_env(id), out, err, errlen);
}

braid_status braid__param_size(braid__param_id id, size_t lo, size_t hi, size_t *out, char *err, size_t errlen) {
  return braid__param_parse_size(id, braid__param_env(id), lo, hi, out, err, errlen);
}

/* ---------------------------------------------------------------- Markdown */

/* Table cells: a '|' would end the cell. */
static void md_cell(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '|') fputc('\\', f);
    fputc(*s, f);
  }
}

void braid__param_markdown(FILE *f) {
  fputs("| variable | type | default | meaning |\n| --- | --- | --- | --- |\n", f);
  for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
    const braid__param *p = &params[i];
    fprintf(f, "| `%s` | %s | ", p->name, braid__param_type_name(p->type));
    if (p->def) {
      fputc('`', f);
      md_cell(f, p->def);
      fputc('`', f);
    } else {
      fputs("\xe2\x80\x94", f); /* an em dash: no default */
    }
    fputs(" | ", f);
    md_cell(f, p->doc);
    fputs(" |\n", f);
  }
}

/* ---------------------------------------------------------------- name-based helpers */

braid_status braid__env_int(const char *name, long def, long lo, long hi, long *out, char *err, size_t errlen) {
  const char *v = braid__env(name);
  if (!v) {
    *out = def;
    return BRAID_OK;
  }
  return check_int(name, v, lo, hi, out, err, errlen);
}

braid_status braid__env_seconds(const char *name, double def, double *out, char *err, size_t errlen) {
  const char *v = braid__env(name);
  if (!v) {
    *out = def;
    return BRAID_OK;
  }
  return check_seconds(name, v, out, err, errlen);
}

braid_status braid__env_size(const char *name, size_t def, size_t *out, char *err, size_t errlen) {
  const char *v = braid__env(name);
  if (!v) {
    *out = def;
    return BRAID_OK;
  }
  return check_size(name, v, 0, SIZE_MAX, out, err, errlen);
}
