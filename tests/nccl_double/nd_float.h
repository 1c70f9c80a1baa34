/* Conversions between float and the 16- and 8-bit floating-point formats
   NCCL supports, rounding to nearest-even. Shared by the NCCL test double
   and its self-test. */
#ifndef ND_FLOAT_H
#define ND_FLOAT_H

#include <math.h>
#include <stdint.h>

typedef struct {
  int ebits, mbits, bias;
  int fn;  /* e4m3fn style: no infinities, only S.1111.111 is NaN */
  int sat; /* out-of-range values saturate to the largest finite value */
} nd_fmt;

/* half and bfloat16 overflow to infinity; the fp8 formats saturate like
   CUDA's __nv_fp8 constructors (__NV_SATFINITE). */
static const nd_fmt ND_HALF = {5, 10, 15, 0, 0};
static const nd_fmt ND_BF16 = {8, 7, 127, 0, 0};
static const nd_fmt ND_E4M3 = {4, 3, 7, 1, 1};
static const nd_fmt ND_E5M2 = {5, 2, 15, 0, 1};

static inline double nd_fmt_max(const nd_fmt *f) {
  int emax_field = (1 << f->ebits) - 1;
  if (f->fn) return ldexp((double)((1 << (f->mbits + 1)) - 2), emax_field - f->bias - f->mbits);
  return ldexp((double)((1 << (f->mbits + 1)) - 1), emax_field - 1 - f->bias - f->mbits);
}

static inline uint32_t nd_fmt_maxbits(const nd_fmt *f) {
  int emax_field = (1 << f->ebits) - 1;
  if (f->fn) return ((uint32_t)emax_field << f->mbits) | (uint32_t)((1 << f->mbits) - 2);
  return ((uint32_t)(emax_field - 1) << f->mbits) | (uint32_t)((1 << f->mbits) - 1);
}

static inline float nd_to_float(uint32_t bits, const nd_fmt *f) {
  int sign = (bits >> (f->ebits + f->mbits)) & 1;
  int emax_field = (1 << f->ebits) - 1;
  int ef = (int)((bits >> f->mbits) & (uint32_t)emax_field);
  int mf = (int)(bits & (uint32_t)((1 << f->mbits) - 1));
  double v;
  if (!f->fn && ef == emax_field) {
    if (mf) return NAN;
    return sign ? -INFINITY : INFINITY;
  }
  if (f->fn && ef == emax_field && mf == (1 << f->mbits) - 1) return NAN;
  if (ef == 0)
    v = ldexp((double)mf, 1 - f->bias - f->mbits);
  else
    v = ldexp((double)(mf + (1 << f->mbits)), ef - f->bias - f->mbits);
  return (float)(sign ? -v : v);
}

static inline uint32_t nd_from_float(float x, const nd_fmt *f) {
  uint32_t sbit = 1u << (f->ebits + f->mbits);
  uint32_t sign = signbit(x) ? sbit : 0;
  int emax_field = (1 << f->ebits) - 1;
  int emin = 1 - f->bias;
  double a, q, v;
  int e, E;
  if (isnan(x)) {
    if (f->fn) return sign | ((uint32_t)emax_field << f->mbits) | (uint32_t)((1 << f->mbits) - 1);
    return sign | ((uint32_t)emax_field << f->mbits) | (1u << (f->mbits - 1));
  }
  a = fabs((double)x);
  if (isinf(a)) {
    if (f->sat || f->fn) return sign | nd_fmt_maxbits(f);
    return sign | ((uint32_t)emax_field << f->mbits);
  }
  if (a == 0) return sign;
  (void)frexp(a, &E);
  e = E - 1;
  if (e < emin) e = emin;
  q = ldexp(1.0, e - f->mbits);
  v = nearbyint(a / q) * q; /* default rounding mode: nearest, ties to even */
  if (v > nd_fmt_max(f)) {
    if (f->sat) return sign | nd_fmt_maxbits(f);
    if (f->fn) return sign | ((uint32_t)emax_field << f->mbits) | (uint32_t)((1 << f->mbits) - 1);
    return sign | ((uint32_t)emax_field << f->mbits);
  }
  if (v == 0) return sign;
  (void)frexp(v, &E);
  e = E - 1;
  if (e < emin) return sign | (uint32_t)(v / ldexp(1.0, emin - f->mbits));
  return sign | ((uint32_t)(e + f->bias) << f->mbits) |
         ((uint32_t)(v / ldexp(1.0, e - f->mbits)) - (1u << f->mbits));
}

#endif
