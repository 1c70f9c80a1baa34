/* AVX-512 (F, BW, VL, DQ) + F16C reduction kernels. The bodies are in
   reduce_kern.h; this file supplies the primitives that need intrinsics. */
#include <immintrin.h>

#define BK_VB 64
#include "reduce_kern.h"

/* MIN/MAX: the instructions return the second operand for NaN or equal
   inputs, so both operand orders are combined. For min, the OR of two equal
   values is the value, of +-0 is -0, and of a NaN with anything is a NaN; for
   max the AND gives +0 for +-0, and unordered lanes are set to all ones (a
   NaN). */
static inline vf32 bk_min_vf32(vf32 a, vf32 b) {
  __m512 x = (__m512)a, y = (__m512)b;
  return (vf32)_mm512_or_ps(_mm512_min_ps(x, y), _mm512_min_ps(y, x));
}
static inline vf32 bk_max_vf32(vf32 a, vf32 b) {
  __m512 x = (__m512)a, y = (__m512)b;
  __m512 m = _mm512_and_ps(_mm512_max_ps(x, y), _mm512_max_ps(y, x));
  __mmask16 u = _mm512_cmp_ps_mask(x, y, _CMP_UNORD_Q);
  return (vf32)_mm512_mask_blend_epi32(u, _mm512_castps_si512(m), _mm512_set1_epi32(-1));
}
static inline vf64 bk_min_vf64(vf64 a, vf64 b) {
  __m512d x = (__m512d)a, y = (__m512d)b;
  return (vf64)_mm512_or_pd(_mm512_min_pd(x, y), _mm512_min_pd(y, x));
}
static inline vf64 bk_max_vf64(vf64 a, vf64 b) {
  __m512d x = (__m512d)a, y = (__m512d)b;
  __m512d m = _mm512_and_pd(_mm512_max_pd(x, y), _mm512_max_pd(y, x));
  __mmask8 u = _mm512_cmp_pd_mask(x, y, _CMP_UNORD_Q);
  return (vf64)_mm512_mask_blend_epi64(u, _mm512_castpd_si512(m), _mm512_set1_epi64(-1));
}

static inline vf32 bk_ld_f16(const void *p) {
  return (vf32)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline void bk_st_f16(void *p, vf32 v) {
  _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph((__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline vu32 bk_ld_u16x(const void *p) {
  return (vu32)_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
}
static inline void bk_st_u16x(void *p, vu32 v) {
  _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16((__m512i)v));
}
static inline vu32 bk_ld_u8x(const void *p) {
  return (vu32)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
static inline void bk_st_u8x(void *p, vu32 v) {
  _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8((__m512i)v));
}

/* (ar*br - ai*bi, ar*bi + ai*br) per pair: the sum everywhere, then the
   difference in the even (real) lanes, the same operations as AVX2 addsub. */
static inline vf32 bk_cmul_f32(vf32 a, vf32 b) {
  __m512 ar = _mm512_moveldup_ps((__m512)a), ai = _mm512_movehdup_ps((__m512)a);
  __m512 bs = _mm512_permute_ps((__m512)b, 0xb1);
  __m512 t1 = _mm512_mul_ps(ar, (__m512)b), t2 = _mm512_mul_ps(ai, bs);
  return (vf32)_mm512_mask_sub_ps(_mm512_add_ps(t1, t2), 0x5555, t1, t2);
}
static inline vf64 bk_cmul_f64(vf64 a, vf64 b) {
  __m512d ar = _mm512_movedup_pd((__m512d)a), ai = _mm512_permute_pd((__m512d)a, 0xff);
  __m512d bs = _mm512_permute_pd((__m512d)b, 0x55);
  __m512d t1 = _mm512_mul_pd(ar, (__m512d)b), t2 = _mm512_mul_pd(ai, bs);
  return (vf64)_mm512_mask_sub_pd(_mm512_add_pd(t1, t2), 0x55, t1, t2);
}

/* Aligned 64-byte non-temporal store: no read-for-ownership of the line. */
static inline void bk_stream(void *p, vu64 v) { _mm512_stream_si512(p, (__m512i)v); }
static void bk_fence(void) { _mm_sfence(); }

BK_DEFINE_TABLE(braid__rk_avx512, "avx512")
