#ifndef BRAID_DTYPE_H
#define BRAID_DTYPE_H

#include "braid.h"

int braid__dtype_valid(braid_dtype dt);
int braid__op_valid(braid_op op);
/* Parses "f32", "float32", "bf16", ... (case-insensitive); returns -1 if unknown. */
int braid__dtype_parse(const char *name, braid_dtype *out);
int braid__op_parse(const char *name, braid_op *out);

#endif
