/* AVX2 + F16C reduction kernels (built with -mavx2 -mf16c). The bodies are in
   reduce_kern.h; this file supplies the primitives that need intrinsics. */
#include <immintrin.h>

#define BK_VB 32
#include "reduce_kern.h"

/* MIN/MAX: the instructions return the second operand for NaN or equal
   inputs, so both operand orders are combined. For min, the OR of two equal
   values is the value, of +-0 is -0, and of a NaN with anything is a NaN; for
   max the AND gives +0 for +-0, and unordered lanes are set to all ones (a
   NaN). */
static inline vf32 bk_min_vf32(vf32 a, vf32 b) {
  __m256 x = (__m256)a, y = (__m256)b;
  return (vf32)_mm256_or_ps(_mm256_min_ps(x, y), _mm256_min_ps(y, x));
}
static inline vf32 bk_max_vf32(vf32 a, vf32 b) {
  __m256 x = (__m256)a, y = (__m256)b;
  __m256 m = _mm256_and_ps(_mm256_max_ps(x, y), _mm256_max_ps(y, x));
  return (vf32)_mm256_or_ps(m, _mm256_cmp_ps(x, y, _CMP_UNORD_Q));
}
static inline vf64 bk_min_vf64(vf64 a, vf64 b) {
  __m256d x = (__m256d)a, y = (__m256d)b;
  return (vf64)_mm256_or_pd(_mm256_min_pd(x, y), _mm256_min_pd(y, x));
}
static inline vf64 bk_max_vf64(vf64 a, vf64 b) {
  __m256d x = (__m256d)a, y = (__m256d)b;
  __m256d m = _mm256_and_pd(_mm256_max_pd(x, y), _mm256_max_pd(y, x));
  return (vf64)_mm256_or_pd(m, _mm256_cmp_pd(x, y, _CMP_UNORD_Q));
}

static inline vf32 bk_ld_f16(const void *p) {
  return (vf32)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline void bk_st_f16(void *p, vf32 v) {
  _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline vu32 bk_ld_u16x(const void *p) {
  return (vu32)_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline void bk_st_u16x(void *p, vu32 v) {
  /* packus works per 128-bit lane: gather quadwords 0 and 2 */
  __m256i x = _mm256_packus_epi32((__m256i)v, (__m256i)v);
  x = _mm256_permute4x64_epi64(x, 0x08);
  _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(x));
}
static inline vu32 bk_ld_u8x(const void *p) {
  return (vu32)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline void bk_st_u8x(void *p, vu32 v) {
  __m256i x = _mm256_packus_epi32((__m256i)v, (__m256i)v);
  x = _mm256_packus_epi16(x, x);
  x = _mm256_permutevar8x32_epi32(x, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
  _mm_storel_epi64((__m128i *)p, _mm256_castsi256_si128(x));
}

/* (ar*br - ai*bi, ar*bi + ai*br) per pair; addsub subtracts in even lanes. */
static inline vf32 bk_cmul_f32(vf32 a, vf32 b) {
  __m256 ar = _mm256_moveldup_ps((__m256)a), ai = _mm256_movehdup_ps((__m256)a);
  __m256 bs = _mm256_permute_ps((__m256)b, 0xb1);
  return (vf32)_mm256_addsub_ps(_mm256_mul_ps(ar, (__m256)b), _mm256_mul_ps(ai, bs));
}
static inline vf64 bk_cmul_f64(vf64 a, vf64 b) {
  __m256d ar = _mm256_movedup_pd((__m256d)a), ai = _mm256_permute_pd((__m256d)a, 0xf);
  __m256d bs = _mm256_permute_pd((__m256d)b, 0x5);
  return (vf64)_mm256_addsub_pd(_mm256_mul_pd(ar, (__m256d)b), _mm256_mul_pd(ai, bs));
}

/* Aligned 32-byte non-temporal store: no read-for-ownership of the line. */
static inline void bk_stream(void *p, vu64 v) { _mm256_stream_si256((__m256i *)p, (__m256i)v); }
static void bk_fence(void) { _mm_sfence(); }

BK_DEFINE_TABLE(braid__rk_avx2, "avx2")
