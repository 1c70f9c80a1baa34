/* Reduction kernels shared by every CPU path. Vectorized (AVX-512, AVX2+F16C)
   with a portable scalar fallback, chosen once at run time. All kernels are
   element-wise and deterministic: the same inputs give the same bits on every
   ISA path (no FMA contraction, division rather than reciprocal for AVG). */
#ifndef BRAID_REDUCE_H
#define BRAID_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"

/* OK for a meaningful pair; INVALID_ARG for an unknown dtype or op code;
   UNSUPPORTED for a pair without meaning (MIN on complex, BAND on floats). */
braid_status braid__check_dtype_op(braid_dtype dt, braid_op op);

/* dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc-1][i], combined in
   source order; for AVG the sum is then divided by avg_div. Low-precision
   types (F16, BF16, FP8) are widened to f32, combined and rounded once.
   nsrc >= 1. dst may be the same pointer as any source; no other overlap. */
void braid__reduce(void *dst, const void *const *srcs, int nsrc, size_t count, braid_dtype dt,
                   braid_op op, int avg_div);

/* Two-input shorthand: dst = a op b (AVG behaves as SUM: nothing is divided). */
void braid__reduce2(void *dst, const void *a, const void *b, size_t count, braid_dtype dt, braid_op op);

/* The products of a scaled sum (braid_op_premul_sum): dst = scalar * src
   for count elements of dt, in the reduction precision. Direct dtypes
   multiply in the dtype (integers wrap, complex numbers multiply as
   complex); F16, BF16 and FP8 are widened to f32 and multiplied there, so
   dst holds count f32 values (braid__acc_size(dt) bytes each). scalar is
   one element of dt. dst may be src for direct dtypes. Nothing for BOOL,
   which has no scaled sum. */
void braid__scale(void *dst, const void *src, size_t count, braid_dtype dt, const void *scalar);

/* Accumulators for algorithms that combine inputs one step at a time (ring,
   tree) so that low-precision partials stay in f32 between steps.
   acc_size: bytes per accumulator element (4 for F16/BF16/FP8, else the dtype size). */
size_t braid__acc_size(braid_dtype dt);
void braid__acc_load(void *acc, const void *src, size_t count, braid_dtype dt);             /* acc = widen(src) */
void braid__acc_reduce(void *acc, const void *src, size_t count, braid_dtype dt, braid_op op); /* acc = acc op widen(src) */
void braid__acc_combine(void *acc, const void *acc2, size_t count, braid_dtype dt, braid_op op); /* acc = acc op acc2 */
void braid__acc_store(void *dst, const void *acc, size_t count, braid_dtype dt, braid_op op,
                      int avg_div); /* dst = narrow(acc), divided by avg_div for AVG */

/* Divides in place by n (AVG finalization for algorithms that summed with SUM). */
void braid__reduce_avg_finalize(void *buf, size_t count, braid_dtype dt, int n);

/* Scalar conversions (round to nearest-even; NaN stays NaN). */
float braid__f16_to_f32(uint16_t h);
uint16_t braid__f32_to_f16(float f);
float braid__bf16_to_f32(uint16_t h);
uint16_t braid__f32_to_bf16(float f);
float braid__e4m3_to_f32(uint8_t v);
uint8_t braid__f32_to_e4m3(float f); /* out of range -> NaN (0x7f/0xff), as E4M3FN has no infinity */
float braid__e5m2_to_f32(uint8_t v);
uint8_t braid__f32_to_e5m2(float f); /* out of range -> +-inf */

/* Which kernel set runs: "avx512", "avx2" or "scalar". */
const char *braid__reduce_isa(void);
/* Forces a kernel set (tests and benchmarks compare them); returns 0 on
   success, -1 if this CPU or build lacks it. NULL restores the automatic choice. */
int braid__reduce_set_isa(const char *isa);

/* braid__reduce writes its output with non-temporal stores when all of its
   buffers together (sources and destination) reach this many bytes (default
   32 MiB; SIZE_MAX: never; 0: always, which tests use). Returns the previous
   value. The results are the same bits either way. */
size_t braid__reduce_set_nt_threshold(size_t bytes);

/* memcpy with non-temporal stores (where the CPU has them): for a
   destination that will not be read soon, such as the user's buffer at the
   end of a large transfer; it saves reading the destination into the cache
   first. Ordered before later stores (sfence). */
void braid__copy_stream(void *dst, const void *src, size_t n);

#endif
