/* A size argument with an optional K, M or G suffix (binary), for the
   stand-alone benchmarks; 0 for anything not positive. */
#ifndef BRAID_BENCH_SIZE_ARG_H
#define BRAID_BENCH_SIZE_ARG_H
#include <stddef.h>
#include <stdlib.h>

static inline size_t parse_size(const char *s) {
  char *e;
  double v = strtod(s, &e);
  if (*e == 'K' || *e == 'k') v *= 1024;
  else if (*e == 'M' || *e == 'm') v *= 1024 * 1024;
  else if (*e == 'G' || *e == 'g') v *= 1024.0 * 1024 * 1024;
  return v > 0 ? (size_t)v : 0;
}

#endif
