/* Reduction kernels: dtype/op validation, scalar conversions, the portable
   scalar kernel set, run-time ISA dispatch and the blocked drivers that feed
   the kernels (see docs/REDUCTIONS.md for the semantics). */
#include "core/reduce.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "core/reduce_kern.h"

#ifdef BRAID_HAVE_X86_KERNELS
#include <cpuid.h>
#endif

/* ------------------------------------------------------------------------ */
/* Validation */

static size_t dt_size(braid_dtype dt) {
  switch (dt) {
    case BRAID_F64: case BRAID_I64: case BRAID_U64: case BRAID_C64: return 8;
    case BRAID_F32: case BRAID_I32: case BRAID_U32: return 4;
    case BRAID_F16: case BRAID_BF16: case BRAID_I16: case BRAID_U16: return 2;
    case BRAID_FP8_E4M3: case BRAID_FP8_E5M2: case BRAID_I8: case BRAID_U8: case BRAID_BOOL: return 1;
    case BRAID_C128: return 16;
  }
  return 0;
}

braid_status braid__check_dtype_op(braid_dtype dt, braid_op op) {
  int o = (int)op;
  if (dt_size(dt) == 0 || o < (int)BRAID_SUM || o > (int)BRAID_BXOR) return BRAID_ERR_INVALID_ARG;
  int bitwise = o >= (int)BRAID_BAND;
  switch (dt) {
    case BRAID_F64: case BRAID_F32: case BRAID_F16: case BRAID_BF16:
    case BRAID_FP8_E4M3: case BRAID_FP8_E5M2:
      return bitwise ? BRAID_ERR_UNSUPPORTED : BRAID_OK;
    case BRAID_BOOL:
      return op == BRAID_AVG ? BRAID_ERR_UNSUPPORTED : BRAID_OK;
    case BRAID_C64: case BRAID_C128:
      return (op == BRAID_SUM || op == BRAID_PROD || op == BRAID_AVG) ? BRAID_OK : BRAID_ERR_UNSUPPORTED;
    default:
      return BRAID_OK; /* integers */
  }
}

/* ------------------------------------------------------------------------ */
/* Scalar conversions. Integer-only rounding, so they do not depend on the
   floating-point environment. */

static inline uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* m (a 24-bit significand with its implicit bit) shifted right by s, ties to even. */
static inline uint32_t rne_shift(uint32_t m, uint32_t s) {
  if (s > 24) return 0; /* below half of the smallest step */
  if (s == 0) return m;
  uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
  return q + (rem > half || (rem == half && (q & 1u)));
}

float braid__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return u2f(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
  if (e == 0) return u2f(sign | f2u((float)m * 0x1p-24f)); /* exact, normal result */
  return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t braid__f32_to_f16(float f) {
  uint32_t x = f2u(f), a = x & 0x7fffffffu;
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
  if (a >= 0x38800000u) /* normal binary16 */
    return (uint16_t)(sign | (((a + 0xfffu + ((a >> 13) & 1u)) >> 13) - (112u << 10)));
  return (uint16_t)(sign | rne_shift((a & 0x7fffffu) | 0x800000u, 126u - (a >> 23)));
}

float braid__bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t braid__f32_to_bf16(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16); /* a carry into the exponent gives inf */
}

float braid__e4m3_to_f32(uint8_t v) {
  uint32_t sign = (uint32_t)(v & 0x80u) << 24, mag = v & 0x7fu;
  if (mag == 0x7f) return u2f(sign | 0x7fc00000u);
  if (mag < 8) return u2f(sign | f2u((float)mag * 0x1p-9f));
  return u2f(sign | ((mag << 20) + (120u << 23)));
}

uint8_t braid__f32_to_e4m3(float f) {
  uint32_t x = f2u(f), a = x & 0x7fffffffu, sign = (x >> 24) & 0x80u;
  if (a >= 0x7f800000u) return (uint8_t)(sign | 0x7fu); /* no infinity: inf and NaN give NaN */
  if (a >= 0x3c800000u) { /* >= 2^-6: normal E4M3 */
    uint32_t c = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
    return (uint8_t)(sign | (c > 0x7eu ? 0x7fu : c)); /* rounded above 448 -> NaN */
  }
  return (uint8_t)(sign | rne_shift((a & 0x7fffffu) | 0x800000u, 141u - (a >> 23)));
}

float braid__e5m2_to_f32(uint8_t v) {
  uint32_t sign = (uint32_t)(v & 0x80u) << 24, mag = v & 0x7fu;
  if (mag >= 0x7c) return u2f(sign | (mag == 0x7c ? 0x7f800000u : 0x7fc00000u));
  if (mag < 4) return u2f(sign | f2u((float)mag * 0x1p-16f));
  return u2f(sign | ((mag << 21) + (112u << 23)));
}

uint8_t braid__f32_to_e5m2(float f) {
  uint32_t x = f2u(f), a = x & 0x7fffffffu, sign = (x >> 24) & 0x80u;
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7eu);
  if (a >= 0x38800000u) { /* >= 2^-14: normal E5M2 (inf lands here too) */
    uint32_t c = ((a + 0xfffffu + ((a >> 21) & 1u)) >> 21) - (112u << 2);
    return (uint8_t)(sign | (c >= 0x7cu ? 0x7cu : c));
  }
  return (uint8_t)(sign | rne_shift((a & 0x7fffffu) | 0x800000u, 134u - (a >> 23)));
}

/* ------------------------------------------------------------------------ */
/* Scalar kernel set: the portable fallback and the reference the vector sets
   must match bit for bit (NaN payloads aside). */

typedef struct {
  float re, im;
} sc_c64;
typedef struct {
  double re, im;
} sc_c128;

#define SC_LDST(N, T)                                                                      \
  static inline T sc_ld_##N(const void *p) {                                               \
    T v;                                                                                   \
    memcpy(&v, p, sizeof v);                                                               \
    return v;                                                                              \
  }                                                                                        \
  static inline void sc_st_##N(void *p, T v) { memcpy(p, &v, sizeof v); }
SC_LDST(f32, float)
SC_LDST(f64, double)
SC_LDST(c64, sc_c64)
SC_LDST(c128, sc_c128)
SC_LDST(u8, uint8_t)
SC_LDST(u16, uint16_t)
SC_LDST(u32, uint32_t)
SC_LDST(u64, uint64_t)
SC_LDST(i8, int8_t)
SC_LDST(i16, int16_t)
SC_LDST(i32, int32_t)
SC_LDST(i64, int64_t)

/* Same rules as the vector bodies: NaN if either is NaN, -0 below +0. */
#define SC_FLOAT_OPS(N, T, U)                                                              \
  static inline T sc_add_##N(T a, T b) { return a + b; }                                   \
  static inline T sc_mul_##N(T a, T b) { return a * b; }                                   \
  static inline T sc_min_##N(T a, T b) {                                                   \
    if (a < b) return a;                                                                   \
    if (b < a) return b;                                                                   \
    U ia, ib;                                                                              \
    memcpy(&ia, &a, sizeof a);                                                             \
    memcpy(&ib, &b, sizeof b);                                                             \
    ia |= ib; /* equal: +-0 gives -0; unordered: stays a NaN */                            \
    memcpy(&a, &ia, sizeof a);                                                             \
    return a;                                                                              \
  }                                                                                        \
  static inline T sc_max_##N(T a, T b) {                                                   \
    if (a > b) return a;                                                                   \
    if (b > a) return b;                                                                   \
    if (a != b) return a + b; /* unordered: a NaN */                                       \
    U ia, ib;                                                                              \
    memcpy(&ia, &a, sizeof a);                                                             \
    memcpy(&ib, &b, sizeof b);                                                             \
    ia &= ib; /* +-0 gives +0 */                                                           \
    memcpy(&a, &ia, sizeof a);                                                             \
    return a;                                                                              \
  }
SC_FLOAT_OPS(f32, float, uint32_t)
SC_FLOAT_OPS(f64, double, uint64_t)

/* Complex product as (ac - bd, ad + bc); -ffp-contract=off keeps it unfused. */
static inline sc_c64 sc_cmul_c64(sc_c64 x, sc_c64 y) {
  sc_c64 r = {x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re};
  return r;
}
static inline sc_c128 sc_cmul_c128(sc_c128 x, sc_c128 y) {
  sc_c128 r = {x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re};
  return r;
}

/* Unsigned arithmetic (0u + / 1u * avoid int promotion overflow), so wrapping is defined. */
#define SC_INT_OPS(W)                                                                      \
  static inline uint##W##_t sc_add_u##W(uint##W##_t a, uint##W##_t b) { return (uint##W##_t)(0u + a + b); } \
  static inline uint##W##_t sc_mul_u##W(uint##W##_t a, uint##W##_t b) { return (uint##W##_t)(1u * a * b); } \
  static inline uint##W##_t sc_min_u##W(uint##W##_t a, uint##W##_t b) { return a < b ? a : b; } \
  static inline uint##W##_t sc_max_u##W(uint##W##_t a, uint##W##_t b) { return a > b ? a : b; } \
  static inline int##W##_t sc_min_i##W(int##W##_t a, int##W##_t b) { return a < b ? a : b; }   \
  static inline int##W##_t sc_max_i##W(int##W##_t a, int##W##_t b) { return a > b ? a : b; }
SC_INT_OPS(8)
SC_INT_OPS(16)
SC_INT_OPS(32)
SC_INT_OPS(64)

static inline uint8_t sc_and_u8(uint8_t a, uint8_t b) { return a & b; }
static inline uint8_t sc_or_u8(uint8_t a, uint8_t b) { return a | b; }
static inline uint8_t sc_xor_u8(uint8_t a, uint8_t b) { return a ^ b; }
static inline uint8_t sc_bnorm(uint8_t a) { return a != 0; }
static inline uint8_t sc_band(uint8_t a, uint8_t b) { return a & (b != 0); }
static inline uint8_t sc_bor(uint8_t a, uint8_t b) { return a | (b != 0); }
static inline uint8_t sc_bxor(uint8_t a, uint8_t b) { return a ^ (b != 0); }
#define SC_ID(x) (x)

#define SC_MULTI(name, N, T, FIRST, OP)                                                    \
  static void name(void *dst, const void *const *srcs, int nsrc, size_t n, int nt) {       \
    unsigned char *d = (unsigned char *)dst;                                               \
    const unsigned char *s0 = (const unsigned char *)srcs[0];                              \
    (void)nt; /* plain C has no non-temporal store */                                      \
    if (nsrc == 2) {                                                                       \
      const unsigned char *s1 = (const unsigned char *)srcs[1];                            \
      for (size_t i = 0; i < n; i++) {                                                     \
        T a = FIRST(sc_ld_##N(s0 + i * sizeof(T))), b = sc_ld_##N(s1 + i * sizeof(T));     \
        sc_st_##N(d + i * sizeof(T), OP(a, b));                                            \
      }                                                                                    \
      return;                                                                              \
    }                                                                                      \
    for (size_t i = 0; i < n; i++) {                                                       \
      T acc = FIRST(sc_ld_##N(s0 + i * sizeof(T)));                                        \
      for (int k = 1; k < nsrc; k++)                                                       \
        acc = OP(acc, sc_ld_##N((const unsigned char *)srcs[k] + i * sizeof(T)));          \
      sc_st_##N(d + i * sizeof(T), acc);                                                   \
    }                                                                                      \
  }

SC_MULTI(sc_f32_sum, f32, float, SC_ID, sc_add_f32)
SC_MULTI(sc_f32_prod, f32, float, SC_ID, sc_mul_f32)
SC_MULTI(sc_f32_min, f32, float, SC_ID, sc_min_f32)
SC_MULTI(sc_f32_max, f32, float, SC_ID, sc_max_f32)
SC_MULTI(sc_f64_sum, f64, double, SC_ID, sc_add_f64)
SC_MULTI(sc_f64_prod, f64, double, SC_ID, sc_mul_f64)
SC_MULTI(sc_f64_min, f64, double, SC_ID, sc_min_f64)
SC_MULTI(sc_f64_max, f64, double, SC_ID, sc_max_f64)
SC_MULTI(sc_c64_prod, c64, sc_c64, SC_ID, sc_cmul_c64)
SC_MULTI(sc_c128_prod, c128, sc_c128, SC_ID, sc_cmul_c128)
#define SC_INT_KERNELS(W)                                                                  \
  SC_MULTI(sc_add_k##W, u##W, uint##W##_t, SC_ID, sc_add_u##W)                             \
  SC_MULTI(sc_mul_k##W, u##W, uint##W##_t, SC_ID, sc_mul_u##W)                             \
  SC_MULTI(sc_smin_k##W, i##W, int##W##_t, SC_ID, sc_min_i##W)                             \
  SC_MULTI(sc_smax_k##W, i##W, int##W##_t, SC_ID, sc_max_i##W)                             \
  SC_MULTI(sc_umin_k##W, u##W, uint##W##_t, SC_ID, sc_min_u##W)                            \
  SC_MULTI(sc_umax_k##W, u##W, uint##W##_t, SC_ID, sc_max_u##W)
SC_INT_KERNELS(8)
SC_INT_KERNELS(16)
SC_INT_KERNELS(32)
SC_INT_KERNELS(64)
SC_MULTI(sc_bits_and, u8, uint8_t, SC_ID, sc_and_u8)
SC_MULTI(sc_bits_or, u8, uint8_t, SC_ID, sc_or_u8)
SC_MULTI(sc_bits_xor, u8, uint8_t, SC_ID, sc_xor_u8)
SC_MULTI(sc_bool_and, u8, uint8_t, sc_bnorm, sc_band)
SC_MULTI(sc_bool_or, u8, uint8_t, sc_bnorm, sc_bor)
SC_MULTI(sc_bool_xor, u8, uint8_t, sc_bnorm, sc_bxor)

static void sc_f32_div(void *dst, const void *src, size_t n, float d) {
  for (size_t i = 0; i < n; i++)
    sc_st_f32((unsigned char *)dst + 4 * i, sc_ld_f32((const unsigned char *)src + 4 * i) / d);
}
static void sc_f64_div(void *dst, const void *src, size_t n, double d) {
  for (size_t i = 0; i < n; i++)
    sc_st_f64((unsigned char *)dst + 8 * i, sc_ld_f64((const unsigned char *)src + 8 * i) / d);
}

static inline float sc_dec_f16(const void *p) { return braid__f16_to_f32(sc_ld_u16(p)); }
static inline float sc_dec_bf16(const void *p) { return braid__bf16_to_f32(sc_ld_u16(p)); }
static inline float sc_dec_e4m3(const void *p) { return braid__e4m3_to_f32(sc_ld_u8(p)); }
static inline float sc_dec_e5m2(const void *p) { return braid__e5m2_to_f32(sc_ld_u8(p)); }
static inline void sc_enc_f16(void *p, float v) { sc_st_u16(p, braid__f32_to_f16(v)); }
static inline void sc_enc_bf16(void *p, float v) { sc_st_u16(p, braid__f32_to_bf16(v)); }
static inline void sc_enc_e4m3(void *p, float v) { sc_st_u8(p, braid__f32_to_e4m3(v)); }
static inline void sc_enc_e5m2(void *p, float v) { sc_st_u8(p, braid__f32_to_e5m2(v)); }

#define SC_LP_OP(F, ESZ, OPN)                                                              \
  static void sc_lpop_##F##_##OPN(void *acc, const void *src, size_t n) {                  \
    unsigned char *a = (unsigned char *)acc;                                               \
    const unsigned char *s = (const unsigned char *)src;                                   \
    for (size_t i = 0; i < n; i++)                                                         \
      sc_st_f32(a + 4 * i, sc_##OPN##_f32(sc_ld_f32(a + 4 * i), sc_dec_##F(s + (ESZ) * i)));  \
  }
#define SC_LP_OPST(F, ESZ, OPN)                                                            \
  static void sc_lpopst_##F##_##OPN(void *dst, const void *acc, const void *src, size_t n) { \
    for (size_t i = 0; i < n; i++) {                                                       \
      float v = sc_##OPN##_f32(sc_ld_f32((const unsigned char *)acc + 4 * i),              \
                               sc_dec_##F((const unsigned char *)src + (ESZ) * i));        \
      sc_enc_##F((unsigned char *)dst + (ESZ) * i, v);                                     \
    }                                                                                      \
  }                                                                                        \
  static void sc_lpopstdiv_##F##_##OPN(void *dst, const void *acc, const void *src, size_t n, float d) { \
    for (size_t i = 0; i < n; i++) {                                                       \
      float v = sc_##OPN##_f32(sc_ld_f32((const unsigned char *)acc + 4 * i),              \
                               sc_dec_##F((const unsigned char *)src + (ESZ) * i));        \
      sc_enc_##F((unsigned char *)dst + (ESZ) * i, v / d);                                 \
    }                                                                                      \
  }
#define SC_LP_ALL(F, ESZ)                                                                  \
  static void sc_lpload_##F(void *acc, const void *src, size_t n) {                        \
    for (size_t i = 0; i < n; i++)                                                         \
      sc_st_f32((unsigned char *)acc + 4 * i, sc_dec_##F((const unsigned char *)src + (ESZ) * i)); \
  }                                                                                        \
  SC_LP_OP(F, ESZ, add)                                                                    \
  SC_LP_OP(F, ESZ, mul)                                                                    \
  SC_LP_OP(F, ESZ, min)                                                                    \
  SC_LP_OP(F, ESZ, max)                                                                    \
  static void sc_lpst_##F(void *dst, const void *acc, size_t n) {                          \
    for (size_t i = 0; i < n; i++)                                                         \
      sc_enc_##F((unsigned char *)dst + (ESZ) * i, sc_ld_f32((const unsigned char *)acc + 4 * i)); \
  }                                                                                        \
  static void sc_lpstdiv_##F(void *dst, const void *acc, size_t n, float d) {              \
    for (size_t i = 0; i < n; i++)                                                         \
      sc_enc_##F((unsigned char *)dst + (ESZ) * i, sc_ld_f32((const unsigned char *)acc + 4 * i) / d); \
  }                                                                                        \
  SC_LP_OPST(F, ESZ, add)                                                                  \
  SC_LP_OPST(F, ESZ, mul)                                                                  \
  SC_LP_OPST(F, ESZ, min)                                                                  \
  SC_LP_OPST(F, ESZ, max)
SC_LP_ALL(f16, 2)
SC_LP_ALL(bf16, 2)
SC_LP_ALL(e4m3, 1)
SC_LP_ALL(e5m2, 1)

#define SC_INT_ROW(W) {sc_add_k##W, sc_mul_k##W, sc_smin_k##W, sc_smax_k##W, sc_umin_k##W, sc_umax_k##W}
#define SC_LP_ROW(F) {sc_lpop_##F##_add, sc_lpop_##F##_mul, sc_lpop_##F##_min, sc_lpop_##F##_max}
#define SC_OPST_ROW(F, S) {sc_lpopst##S##_##F##_add, sc_lpopst##S##_##F##_mul, sc_lpopst##S##_##F##_min, sc_lpopst##S##_##F##_max}

static const braid__rk_table rk_scalar = {
    .name = "scalar",
    .f32 = {sc_f32_sum, sc_f32_prod, sc_f32_min, sc_f32_max},
    .f64 = {sc_f64_sum, sc_f64_prod, sc_f64_min, sc_f64_max},
    .c64_prod = sc_c64_prod,
    .c128_prod = sc_c128_prod,
    .ints = {SC_INT_ROW(8), SC_INT_ROW(16), SC_INT_ROW(32), SC_INT_ROW(64)},
    .bits = {sc_bits_and, sc_bits_or, sc_bits_xor},
    .bools = {sc_bool_and, sc_bool_or, sc_bool_xor},
    .f32_div = sc_f32_div,
    .f64_div = sc_f64_div,
    .lp_load = {sc_lpload_f16, sc_lpload_bf16, sc_lpload_e4m3, sc_lpload_e5m2},
    .lp_op = {SC_LP_ROW(f16), SC_LP_ROW(bf16), SC_LP_ROW(e4m3), SC_LP_ROW(e5m2)},
    .lp_store = {sc_lpst_f16, sc_lpst_bf16, sc_lpst_e4m3, sc_lpst_e5m2},
    .lp_store_div = {sc_lpstdiv_f16, sc_lpstdiv_bf16, sc_lpstdiv_e4m3, sc_lpstdiv_e5m2},
    .lp_opst = {SC_OPST_ROW(f16, ), SC_OPST_ROW(bf16, ), SC_OPST_ROW(e4m3, ), SC_OPST_ROW(e5m2, )},
    .lp_opst_div = {SC_OPST_ROW(f16, div), SC_OPST_ROW(bf16, div), SC_OPST_ROW(e4m3, div), SC_OPST_ROW(e5m2, div)},
    .fence = NULL,
};

/* ------------------------------------------------------------------------ */
/* ISA dispatch: detected once, overridable by braid__reduce_set_isa. */

#ifdef BRAID_HAVE_X86_KERNELS
static int cpu_has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C); /* Clang's builtin lacks "f16c" */
}
static int cpu_avx2(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && cpu_has_f16c();
}
static int cpu_avx512(void) {
  /* The AVX-512 file also uses DQ (64-bit multiplies), present on every
     AVX-512 CPU with BW and VL. */
  return cpu_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
#endif

static const braid__rk_table *g_auto = &rk_scalar;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const braid__rk_table *_Atomic g_forced;

static void detect(void) {
#ifdef BRAID_HAVE_X86_KERNELS
  if (cpu_avx512())
    g_auto = &braid__rk_avx512;
  else if (cpu_avx2())
    g_auto = &braid__rk_avx2;
#endif
}

static const braid__rk_table *rk(void) {
  const braid__rk_table *t = atomic_load_explicit(&g_forced, memory_order_acquire);
  if (t) return t;
  pthread_once(&g_once, detect);
  return g_auto;
}

const char *braid__reduce_isa(void) { return rk()->name; }

int braid__reduce_set_isa(const char *isa) {
  const braid__rk_table *t = NULL;
  if (isa == NULL || strcmp(isa, "auto") == 0) {
    t = NULL;
  } else if (strcmp(isa, "scalar") == 0) {
    t = &rk_scalar;
#ifdef BRAID_HAVE_X86_KERNELS
  } else if (strcmp(isa, "avx2") == 0 && cpu_avx2()) {
    t = &braid__rk_avx2;
  } else if (strcmp(isa, "avx512") == 0 && cpu_avx512()) {
    t = &braid__rk_avx512;
#endif
  } else {
    return -1;
  }
  atomic_store_explicit(&g_forced, t, memory_order_release);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Drivers */

static int lp_format(braid_dtype dt) {
  switch (dt) {
    case BRAID_F16: return BRAID__RK_F16;
    case BRAID_BF16: return BRAID__RK_BF16;
    case BRAID_FP8_E4M3: return BRAID__RK_E4M3;
    case BRAID_FP8_E5M2: return BRAID__RK_E5M2;
    default: return -1;
  }
}
static size_t lp_size(int f) { return f <= BRAID__RK_BF16 ? 2 : 1; }

static int float_op(braid_op op) {
  switch (op) {
    case BRAID_PROD: return BRAID__RK_PROD;
    case BRAID_MIN: return BRAID__RK_MIN;
    case BRAID_MAX: return BRAID__RK_MAX;
    default: return BRAID__RK_SUM; /* SUM, AVG */
  }
}

/* A full-precision kernel and its element: n dtype elements are n * mult
   kernel elements of esz bytes. */
typedef struct {
  braid__rk_multi k;
  size_t esz, mult;
} fullk;

static fullk full_kernel(const braid__rk_table *t, braid_dtype dt, braid_op op) {
  fullk r = {NULL, dt_size(dt), 1};
  int fo = float_op(op);
  int b = op == BRAID_BAND ? BRAID__RK_AND : op == BRAID_BOR ? BRAID__RK_OR : BRAID__RK_XOR;
  switch (dt) {
    case BRAID_F32: r.k = t->f32[fo]; return r;
    case BRAID_F64: r.k = t->f64[fo]; return r;
    case BRAID_C64:
      if (op == BRAID_PROD) { r.k = t->c64_prod; return r; }
      r.k = t->f32[BRAID__RK_SUM], r.esz = 4, r.mult = 2;
      return r;
    case BRAID_C128:
      if (op == BRAID_PROD) { r.k = t->c128_prod; return r; }
      r.k = t->f64[BRAID__RK_SUM], r.esz = 8, r.mult = 2;
      return r;
    case BRAID_BOOL:
      if (op == BRAID_SUM || op == BRAID_MAX || op == BRAID_BOR) b = BRAID__RK_OR;
      else if (op == BRAID_PROD || op == BRAID_MIN || op == BRAID_BAND) b = BRAID__RK_AND;
      r.k = t->bools[b];
      return r;
    default: break;
  }
  /* integers */
  if (op >= BRAID_BAND) {
    r.k = t->bits[b], r.mult = r.esz, r.esz = 1;
    return r;
  }
  int w = r.esz == 1 ? 0 : r.esz == 2 ? 1 : r.esz == 4 ? 2 : 3;
  int sgn = dt == BRAID_I8 || dt == BRAID_I16 || dt == BRAID_I32 || dt == BRAID_I64;
  int k = BRAID__RK_ADD;
  if (op == BRAID_PROD) k = BRAID__RK_MUL;
  else if (op == BRAID_MIN) k = sgn ? BRAID__RK_SMIN : BRAID__RK_UMIN;
  else if (op == BRAID_MAX) k = sgn ? BRAID__RK_SMAX : BRAID__RK_UMAX;
  r.k = t->ints[w][k];
  return r;
}

/* Integer AVG: the wrapped sum divided with C (truncating) division. d >= 1,
   so no quotient overflows. */
static void int_div(void *dst, const void *src, size_t n, braid_dtype dt, int d) {
  unsigned char *o = (unsigned char *)dst;
  const unsigned char *s = (const unsigned char *)src;
/* D: a type that holds both the element and d (narrow types divide as int). */
#define INT_DIV_CASE(DT, N, T, D)                                                          \
  case DT:                                                                                 \
    for (size_t i = 0; i < n; i++)                                                         \
      sc_st_##N(o + i * sizeof(T), (T)((D)sc_ld_##N(s + i * sizeof(T)) / (D)d));           \
    break;
  switch (dt) {
    INT_DIV_CASE(BRAID_I8, i8, int8_t, int)
    INT_DIV_CASE(BRAID_I16, i16, int16_t, int)
    INT_DIV_CASE(BRAID_I32, i32, int32_t, int32_t)
    INT_DIV_CASE(BRAID_I64, i64, int64_t, int64_t)
    INT_DIV_CASE(BRAID_U8, u8, uint8_t, int)
    INT_DIV_CASE(BRAID_U16, u16, uint16_t, int)
    INT_DIV_CASE(BRAID_U32, u32, uint32_t, uint32_t)
    INT_DIV_CASE(BRAID_U64, u64, uint64_t, uint64_t)
    default: break;
  }
#undef INT_DIV_CASE
}

/* dst = src / d for a full-precision dtype (n dtype elements); BOOL has no AVG. */
static void full_div(const braid__rk_table *t, void *dst, const void *src, size_t n, braid_dtype dt, int d) {
  switch (dt) {
    case BRAID_F32: t->f32_div(dst, src, n, (float)d); break;
    case BRAID_C64: t->f32_div(dst, src, 2 * n, (float)d); break;
    case BRAID_F64: t->f64_div(dst, src, n, (double)d); break;
    case BRAID_C128: t->f64_div(dst, src, 2 * n, (double)d); break;
    case BRAID_BOOL: break;
    default: int_div(dst, src, n, dt, d); break;
  }
}

enum {
  MAXP = 16,  /* sources per kernel call; more are folded in groups */
  BLK = 8192, /* bytes per block: stays in L1 between passes */
  LPB = 1024  /* low-precision elements per block (4 KiB of f32) */
};

/* Outputs go through non-temporal stores when every buffer of the call
   together (sources and destination) exceeds this: such a result cannot
   still be in cache when the call returns, so skipping the read-for-ownership
   saves a quarter of the memory traffic. 32 MiB is a typical per-die last
   level cache; sysconf reports the whole package (or the host's, in a VM). */
#define NT_DEFAULT ((size_t)32 << 20)
static _Atomic size_t g_nt_threshold = NT_DEFAULT;

void braid__copy_stream(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
  char *d = dst;
  const char *s = src;
  /* Stores must be 16-byte aligned; the head goes through memcpy. */
  size_t head = (size_t)(-(uintptr_t)d & 15u);
  if (head > n) head = n;
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  size_t body = n & ~(size_t)63;
  for (size_t i = 0; i < body; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(s + i)), b = _mm_loadu_si128((const __m128i *)(s + i + 16));
    __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 32)), f = _mm_loadu_si128((const __m128i *)(s + i + 48));
    _mm_stream_si128((__m128i *)(d + i), a);
    _mm_stream_si128((__m128i *)(d + i + 16), b);
    _mm_stream_si128((__m128i *)(d + i + 32), e);
    _mm_stream_si128((__m128i *)(d + i + 48), f);
  }
  _mm_sfence();
  memcpy(d + body, s + body, n - body);
#else
  memcpy(dst, src, n);
#endif
}

size_t braid__reduce_set_nt_threshold(size_t bytes) {
  return atomic_exchange_explicit(&g_nt_threshold, bytes, memory_order_relaxed);
}

static int use_nt(const braid__rk_table *t, size_t nsrc, size_t bytes) {
  return t->fence && (nsrc + 1) * bytes >= atomic_load_explicit(&g_nt_threshold, memory_order_relaxed);
}

static void reduce_full(const braid__rk_table *t, void *dst, const void *const *srcs, int nsrc, size_t count,
                        braid_dtype dt, braid_op op, int avg_div) {
  fullk fk = full_kernel(t, dt, op);
  size_t esz = dt_size(dt), n = count * fk.mult;
  int avg = op == BRAID_AVG;
  if (nsrc <= MAXP && !avg) {
    /* Streamed straight from the registers: a blocked copy would send the
       non-temporal stores in bursts, which drains slower. */
    int nt = (uintptr_t)dst % fk.esz == 0 && use_nt(t, (size_t)nsrc, count * esz);
    fk.k(dst, srcs, nsrc, n, nt);
    if (nt) t->fence();
    return;
  }
  /* Blocked: the AVG division and the folding of many sources run on data
     still in L1. Every block reads all of its sources before anything is
     written to dst, which keeps in-place exact. */
  _Alignas(64) unsigned char tmp[BLK];
  const void *p[MAXP];
  size_t blk = BLK / esz; /* dtype elements per block */
  for (size_t off = 0; off < count; off += blk) {
    size_t m = count - off < blk ? count - off : blk, bo = off * esz;
    unsigned char *d = (unsigned char *)dst + bo;
    if (nsrc <= MAXP) {
      for (int k = 0; k < nsrc; k++) p[k] = (const unsigned char *)srcs[k] + bo;
      fk.k(d, p, nsrc, m * fk.mult, 0);
    } else {
      int j = 0, q = 0, first = 1;
      while (nsrc - j > (first ? MAXP : MAXP - 1)) {
        q = 0;
        if (!first) p[q++] = tmp;
        while (q < MAXP) p[q++] = (const unsigned char *)srcs[j++] + bo;
        fk.k(tmp, p, MAXP, m * fk.mult, 0);
        first = 0;
      }
      q = 0;
      p[q++] = tmp;
      while (j < nsrc) p[q++] = (const unsigned char *)srcs[j++] + bo;
      fk.k(d, p, q, m * fk.mult, 0);
    }
    if (avg) full_div(t, d, d, m, dt, avg_div);
  }
}

/* F16/BF16/FP8: widen into an f32 block, combine there, round once when the
   last source is combined and stored. */
static void reduce_lp(const braid__rk_table *t, int f, void *dst, const void *const *srcs, int nsrc,
                      size_t count, braid_op op, int avg_div) {
  _Alignas(64) float tmp[LPB];
  size_t esz = lp_size(f);
  int fo = float_op(op), avg = op == BRAID_AVG;
  float dv = (float)avg_div;
  for (size_t off = 0; off < count; off += LPB) {
    size_t m = count - off < LPB ? count - off : LPB, bo = off * esz;
    unsigned char *d = (unsigned char *)dst + bo;
    t->lp_load[f](tmp, (const unsigned char *)srcs[0] + bo, m);
    if (nsrc == 1) {
      if (avg)
        t->lp_store_div[f](d, tmp, m, dv);
      else
        t->lp_store[f](d, tmp, m);
    } else {
      for (int k = 1; k < nsrc - 1; k++) t->lp_op[f][fo](tmp, (const unsigned char *)srcs[k] + bo, m);
      const unsigned char *last = (const unsigned char *)srcs[nsrc - 1] + bo;
      if (avg)
        t->lp_opst_div[f][fo](d, tmp, last, m, dv);
      else
        t->lp_opst[f][fo](d, tmp, last, m);
    }
  }
}

void braid__reduce(void *dst, const void *const *srcs, int nsrc, size_t count, braid_dtype dt, braid_op op,
                   int avg_div) {
  if (braid__check_dtype_op(dt, op) != BRAID_OK || nsrc < 1 || count == 0) return;
  if (avg_div < 1) avg_div = 1;
  /* One input and nothing to divide: the result is the input, bit for bit
     (bool still goes through the kernel, which normalizes it to 0/1). */
  if (nsrc == 1 && avg_div == 1 && dt != BRAID_BOOL) {
    if (dst != srcs[0]) memmove(dst, srcs[0], count * braid_dtype_size(dt));
    return;
  }
  const braid__rk_table *t = rk();
  int f = lp_format(dt);
  if (f >= 0)
    reduce_lp(t, f, dst, srcs, nsrc, count, op, avg_div);
  else
    reduce_full(t, dst, srcs, nsrc, count, dt, op, avg_div);
}

void braid__reduce2(void *dst, const void *a, const void *b, size_t count, braid_dtype dt, braid_op op) {
  const void *s[2] = {a, b};
  braid__reduce(dst, s, 2, count, dt, op == BRAID_AVG ? BRAID_SUM : op, 1);
}

void braid__scale(void *dst, const void *src, size_t count, braid_dtype dt, const void *scalar) {
  if (braid__check_dtype_op(dt, BRAID_PROD) != BRAID_OK || dt == BRAID_BOOL || count == 0) return;
  const braid__rk_table *t = rk();
  int f = lp_format(dt);
  /* The scalar repeated over one block: the products run through the
     vectorized PROD kernels, one block at a time. */
  _Alignas(64) unsigned char rep[BLK];
  if (f >= 0) {
    float s;
    t->lp_load[f](&s, scalar, 1);
    for (size_t i = 0; i < BLK / 4; i++) memcpy(rep + 4 * i, &s, 4);
    const size_t esz = lp_size(f), blk = BLK / 4;
    for (size_t off = 0; off < count; off += blk) {
      size_t m = count - off < blk ? count - off : blk;
      float *d = (float *)dst + off;
      t->lp_load[f](d, (const unsigned char *)src + off * esz, m);
      const void *p[2] = {d, rep};
      t->f32[BRAID__RK_PROD](d, p, 2, m, 0);
    }
    return;
  }
  fullk fk = full_kernel(t, dt, BRAID_PROD);
  const size_t esz = dt_size(dt), blk = BLK / esz;
  for (size_t i = 0; i < blk; i++) memcpy(rep + i * esz, scalar, esz);
  for (size_t off = 0; off < count; off += blk) {
    size_t m = count - off < blk ? count - off : blk;
    const void *p[2] = {(const unsigned char *)src + off * esz, rep};
    fk.k((unsigned char *)dst + off * esz, p, 2, m * fk.mult, 0);
  }
}

/* ------------------------------------------------------------------------ */
/* Accumulators */

size_t braid__acc_size(braid_dtype dt) { return lp_format(dt) >= 0 ? 4 : dt_size(dt); }

void braid__acc_load(void *acc, const void *src, size_t count, braid_dtype dt) {
  if (dt_size(dt) == 0 || count == 0) return;
  const braid__rk_table *t = rk();
  int f = lp_format(dt);
  if (f >= 0) {
    t->lp_load[f](acc, src, count);
  } else if (dt == BRAID_BOOL) {
    const void *s[1] = {src};
    t->bools[BRAID__RK_OR](acc, s, 1, count, 0); /* normalize to 0/1 */
  } else {
    memmove(acc, src, count * dt_size(dt));
  }
}

void braid__acc_reduce(void *acc, const void *src, size_t count, braid_dtype dt, braid_op op) {
  if (braid__check_dtype_op(dt, op) != BRAID_OK || count == 0) return;
  const braid__rk_table *t = rk();
  int f = lp_format(dt);
  if (f >= 0) {
    t->lp_op[f][float_op(op)](acc, src, count);
    return;
  }
  fullk fk = full_kernel(t, dt, op == BRAID_AVG ? BRAID_SUM : op);
  const void *s[2] = {acc, src};
  fk.k(acc, s, 2, count * fk.mult, 0);
}

void braid__acc_combine(void *acc, const void *acc2, size_t count, braid_dtype dt, braid_op op) {
  if (braid__check_dtype_op(dt, op) != BRAID_OK || count == 0) return;
  const braid__rk_table *t = rk();
  if (lp_format(dt) >= 0) {
    const void *s[2] = {acc, acc2};
    t->f32[float_op(op)](acc, s, 2, count, 0);
    return;
  }
  braid__acc_reduce(acc, acc2, count, dt, op);
}

void braid__acc_store(void *dst, const void *acc, size_t count, braid_dtype dt, braid_op op, int avg_div) {
  if (braid__check_dtype_op(dt, op) != BRAID_OK || count == 0) return;
  if (avg_div < 1) avg_div = 1;
  const braid__rk_table *t = rk();
  int f = lp_format(dt);
  if (f >= 0) {
    if (op == BRAID_AVG)
      t->lp_store_div[f](dst, acc, count, (float)avg_div);
    else
      t->lp_store[f](dst, acc, count);
  } else if (op == BRAID_AVG) {
    full_div(t, dst, acc, count, dt, avg_div);
  } else if (dt == BRAID_BOOL) {
    const void *s[1] = {acc};
    t->bools[BRAID__RK_OR](dst, s, 1, count, 0);
  } else {
    memmove(dst, acc, count * dt_size(dt));
  }
}

void braid__reduce_avg_finalize(void *buf, size_t count, braid_dtype dt, int n) {
  if (braid__check_dtype_op(dt, BRAID_AVG) != BRAID_OK || count == 0) return;
  if (n < 1) n = 1;
  const braid__rk_table *t = rk();
  int f = lp_format(dt);
  if (f < 0) {
    full_div(t, buf, buf, count, dt, n);
    return;
  }
  _Alignas(64) float tmp[LPB];
  size_t esz = lp_size(f);
  for (size_t off = 0; off < count; off += LPB) {
    size_t m = count - off < LPB ? count - off : LPB;
    unsigned char *p = (unsigned char *)buf + off * esz;
    t->lp_load[f](tmp, p, m);
    t->lp_store_div[f](p, tmp, m, (float)n);
  }
}
