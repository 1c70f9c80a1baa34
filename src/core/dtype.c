#include "core/dtype.h"

#include <stddef.h>
#include <strings.h>

typedef struct dtype_info {
  braid_dtype dt;
  size_t size;
  const char *name;
  const char *alias;
} dtype_info;

static const dtype_info dtypes[] = {
    {BRAID_F64, 8, "f64", "float64"},       {BRAID_F32, 4, "f32", "float32"},
    {BRAID_F16, 2, "f16", "float16"},       {BRAID_BF16, 2, "bf16", "bfloat16"},
    {BRAID_FP8_E4M3, 1, "fp8_e4m3", "e4m3"}, {BRAID_FP8_E5M2, 1, "fp8_e5m2", "e5m2"},
    {BRAID_I64, 8, "i64", "int64"},         {BRAID_I32, 4, "i32", "int32"},
    {BRAID_I16, 2, "i16", "int16"},         {BRAID_I8, 1, "i8", "int8"},
    {BRAID_U64, 8, "u64", "uint64"},        {BRAID_U32, 4, "u32", "uint32"},
    {BRAID_U16, 2, "u16", "uint16"},        {BRAID_U8, 1, "u8", "uint8"},
    {BRAID_BOOL, 1, "bool", "b8"},          {BRAID_C64, 8, "c64", "complex64"},
    {BRAID_C128, 16, "c128", "complex128"},
};

/* The same sizes by code, for the paths every call takes. */
const uint8_t braid__dtype_sizes[64] = {
    [BRAID_F64] = 8, [BRAID_F32] = 4, [BRAID_F16] = 2,  [BRAID_BF16] = 2,  [BRAID_FP8_E4M3] = 1, [BRAID_FP8_E5M2] = 1,
    [BRAID_I64] = 8, [BRAID_I32] = 4, [BRAID_I16] = 2,  [BRAID_I8] = 1,    [BRAID_U64] = 8,      [BRAID_U32] = 4,
    [BRAID_U16] = 2, [BRAID_U8] = 1,  [BRAID_BOOL] = 1, [BRAID_C64] = 8,   [BRAID_C128] = 16,
};

static const char *const op_names[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};

static const dtype_info *find(braid_dtype dt) {
  for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
    if (dtypes[i].dt == dt) return &dtypes[i];
  return NULL;
}

size_t braid_dtype_size(braid_dtype dt) { return braid__dtsize(dt); }

const char *braid_dtype_name(braid_dtype dt) {
  const dtype_info *d = find(dt);
  return d ? d->name : NULL;
}

const char *braid_op_name(braid_op op) {
  return braid__op_valid(op) ? op_names[op] : NULL;
}

int braid__dtype_valid(braid_dtype dt) { return braid__dtsize(dt) != 0; }

int braid__op_valid(braid_op op) { return (unsigned)op < sizeof(op_names) / sizeof(op_names[0]); }

int braid__dtype_parse(const char *name, braid_dtype *out) {
  if (!name) return -1;
  for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++) {
    if (!strcasecmp(name, dtypes[i].name) || !strcasecmp(name, dtypes[i].alias)) {
      *out = dtypes[i].dt;
      return 0;
    }
  }
  return -1;
}

int braid__op_parse(const char *name, braid_op *out) {
  if (!name) return -1;
  for (size_t i = 0; i < sizeof(op_names) / sizeof(op_names[0]); i++) {
    if (!strcasecmp(name, op_names[i])) {
      *out = (braid_op)i;
      return 0;
    }
  }
  return -1;
}
