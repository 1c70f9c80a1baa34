#ifndef BRAID_DTYPE_H
#define BRAID_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"

/* Element size by dtype code (0: not a dtype); codes are below 64. */
extern const uint8_t braid__dtype_sizes[64];
static inline size_t braid__dtsize(braid_dtype dt) {
  return (unsigned)dt < 64 ? braid__dtype_sizes[(unsigned)dt] : 0;
}

int braid__dtype_valid(braid_dtype dt);
int braid__op_valid(braid_op op);
/* Parses "f32", "float32", "bf16", ... (case-insensitive); returns -1 if unknown. */
int braid__dtype_parse(const char *name, braid_dtype *out);
int braid__op_parse(const char *name, braid_op *out);

#endif
