/* Scaled-sum ops (braid_op_premul_sum, as NCCL's ncclRedOpCreatePreMulSum):
   handles beyond BRAID_BXOR, one slot each in the communicator's table.
   Collectives resolve them in braid__check_red and scale the inputs before
   summing (api/coll.c) unless the backend takes them natively. */
#include <string.h>

#include "api/api.h"

/* 32 bits of the op's dtype and scalar bits: what every rank's descriptor
   must agree on. */
static uint32_t digest_of(braid_dtype dt, const unsigned char *scalar, size_t len) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)dt * 0xC2B2AE3D27D4EB4Full;
  for (size_t i = 0; i < len; i++) {
    h = (h ^ scalar[i]) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  h *= 0xBF58476D1CE4E5B9ull;
  return (uint32_t)(h >> 32);
}

braid_status braid_op_premul_sum(braid_comm *c, const void *scalar, braid_dtype dt, braid_op *op) {
  braid_status st = braid__enter(c, "braid_op_premul_sum");
  if (st) return st;
  if (!op) return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG, "op is NULL"));
  if (!scalar) return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG, "scalar is NULL"));
  BRAID__TRY(braid__check_dtype(c, dt));
  if (dt == BRAID_BOOL)
    return braid__leave(c, braid__fail(c, BRAID_ERR_UNSUPPORTED, "a scaled sum is not defined for dtype bool"));
  for (int i = 0; i < BRAID__PREMUL_MAX; i++) {
    braid__premul *p = &c->premul[i];
    if (p->used) continue;
    size_t esz = braid_dtype_size(dt);
    memset(p, 0, sizeof *p);
    memcpy(p->scalar, scalar, esz);
    p->dt = (uint8_t)dt;
    p->digest = digest_of(dt, p->scalar, esz);
    p->used = 1;
    *op = (braid_op)(BRAID__PREMUL_BASE + i);
    return braid__leave(c, BRAID_OK);
  }
  return braid__leave(c, braid__fail(c, BRAID_ERR_NO_MEMORY,
                                     "all %d scaled-sum ops of this communicator are in use (braid_op_destroy frees one)",
                                     BRAID__PREMUL_MAX));
}

braid_status braid_op_destroy(braid_comm *c, braid_op op) {
  braid_status st = braid__enter(c, "braid_op_destroy");
  if (st) return st;
  if ((unsigned)op <= (unsigned)BRAID_BXOR)
    return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG,
                                       "op %s is built in: only ops from braid_op_premul_sum are destroyed",
                                       braid_op_name(op)));
  const braid__premul *p = braid__premul_of(c, op);
  if (!p)
    return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG,
                                       "op %d is not a live op of this communicator (destroyed already?)", (int)op));
  memset(&c->premul[(unsigned)op - BRAID__PREMUL_BASE], 0, sizeof(braid__premul));
  return braid__leave(c, BRAID_OK);
}
