/* Reduction kernel table shared by the scalar, AVX2 and AVX-512 paths, and the
   element-wise kernel bodies of the vector paths, written once.

   Without BK_VB this header only declares the table. An ISA file defines BK_VB
   (vector bytes: 32 or 64), includes this header, defines its few
   ISA-specific primitives (see "Provided by the ISA file" below) and expands
   BK_DEFINE_TABLE(name, "isa"). The bodies use GCC/Clang vector extensions so
   the same source compiles to AVX2 or AVX-512 code; every operation is an
   exact IEEE or integer operation applied per element, which is what makes
   the paths give identical bits. */
#ifndef BRAID_REDUCE_KERN_H
#define BRAID_REDUCE_KERN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* dst[i] = srcs[0][i] op ... op srcs[nsrc-1][i] over n kernel elements;
   nsrc >= 1; dst may equal any source exactly. nt: the caller asks for
   non-temporal stores (dst is element-aligned) and calls fence afterwards;
   a set without them ignores it. */
typedef void (*braid__rk_multi)(void *dst, const void *const *srcs, int nsrc, size_t n, int nt);
typedef void (*braid__rk_fdiv)(void *dst, const void *src, size_t n, float d);
typedef void (*braid__rk_ddiv)(void *dst, const void *src, size_t n, double d);
/* Low-precision formats against an f32 accumulator array. */
typedef void (*braid__rk_lp)(void *acc, const void *src, size_t n);
typedef void (*braid__rk_lp_store)(void *dst, const void *acc, size_t n);
typedef void (*braid__rk_lp_store_div)(void *dst, const void *acc, size_t n, float d);
typedef void (*braid__rk_lp_opst)(void *dst, const void *acc, const void *src, size_t n);
typedef void (*braid__rk_lp_opst_div)(void *dst, const void *acc, const void *src, size_t n, float d);

enum { BRAID__RK_SUM, BRAID__RK_PROD, BRAID__RK_MIN, BRAID__RK_MAX, BRAID__RK_NFOP };
enum { BRAID__RK_ADD, BRAID__RK_MUL, BRAID__RK_SMIN, BRAID__RK_SMAX, BRAID__RK_UMIN, BRAID__RK_UMAX,
       BRAID__RK_NIOP };
enum { BRAID__RK_AND, BRAID__RK_OR, BRAID__RK_XOR, BRAID__RK_NBOP };
enum { BRAID__RK_F16, BRAID__RK_BF16, BRAID__RK_E4M3, BRAID__RK_E5M2, BRAID__RK_NLP };

typedef struct braid__rk_table {
  const char *name;
  braid__rk_multi f32[BRAID__RK_NFOP];
  braid__rk_multi f64[BRAID__RK_NFOP];
  braid__rk_multi c64_prod, c128_prod;
  braid__rk_multi ints[4][BRAID__RK_NIOP]; /* [8, 16, 32, 64 bits][op] */
  braid__rk_multi bits[BRAID__RK_NBOP];    /* on bytes */
  braid__rk_multi bools[BRAID__RK_NBOP];   /* inputs: non-zero is true; outputs 0/1 */
  braid__rk_fdiv f32_div;
  braid__rk_ddiv f64_div;
  braid__rk_lp lp_load[BRAID__RK_NLP];                 /* acc = widen(src) */
  braid__rk_lp lp_op[BRAID__RK_NLP][BRAID__RK_NFOP];  /* acc = acc op widen(src) */
  braid__rk_lp_store lp_store[BRAID__RK_NLP];          /* dst = narrow(acc) */
  braid__rk_lp_store_div lp_store_div[BRAID__RK_NLP];  /* dst = narrow(acc / d) */
  /* dst = narrow(acc op widen(src)) [/ d]: the last source fused with the store */
  braid__rk_lp_opst lp_opst[BRAID__RK_NLP][BRAID__RK_NFOP];
  braid__rk_lp_opst_div lp_opst_div[BRAID__RK_NLP][BRAID__RK_NFOP];
  void (*fence)(void); /* orders non-temporal stores; NULL when the set has none */
} braid__rk_table;

#ifdef BRAID_HAVE_X86_KERNELS
extern const braid__rk_table braid__rk_avx2;
extern const braid__rk_table braid__rk_avx512;
#endif

#endif /* BRAID_REDUCE_KERN_H */

#if defined(BK_VB) && !defined(BRAID_REDUCE_KERN_BODY)
#define BRAID_REDUCE_KERN_BODY

#define BK_LF (BK_VB / 4) /* f32 lanes per vector */

typedef float vf32 __attribute__((vector_size(BK_VB)));
typedef double vf64 __attribute__((vector_size(BK_VB)));
typedef uint8_t vu8 __attribute__((vector_size(BK_VB)));
typedef int8_t vi8 __attribute__((vector_size(BK_VB)));
typedef uint16_t vu16 __attribute__((vector_size(BK_VB)));
typedef int16_t vi16 __attribute__((vector_size(BK_VB)));
typedef uint32_t vu32 __attribute__((vector_size(BK_VB)));
typedef int32_t vi32 __attribute__((vector_size(BK_VB)));
typedef uint64_t vu64 __attribute__((vector_size(BK_VB)));
typedef int64_t vi64 __attribute__((vector_size(BK_VB)));

/* Buffers have any alignment: memcpy compiles to unaligned vector moves. */
#define BK_LDST(T)                                                                         \
  static inline T bk_ld_##T(const void *p) {                                               \
    T v;                                                                                   \
    memcpy(&v, p, sizeof v);                                                               \
    return v;                                                                              \
  }                                                                                        \
  static inline void bk_st_##T(void *p, T v) { memcpy(p, &v, sizeof v); }                  \
  static inline T bk_ldp_##T(const void *p, size_t nb) { /* partial, zero-filled */        \
    T v;                                                                                   \
    memset(&v, 0, sizeof v);                                                               \
    memcpy(&v, p, nb);                                                                     \
    return v;                                                                              \
  }                                                                                        \
  static inline void bk_stp_##T(void *p, T v, size_t nb) { memcpy(p, &v, nb); }
BK_LDST(vf32)
BK_LDST(vf64)
BK_LDST(vu8)
BK_LDST(vi8)
BK_LDST(vu16)
BK_LDST(vi16)
BK_LDST(vu32)
BK_LDST(vi32)
BK_LDST(vu64)
BK_LDST(vi64)

/* ---- Provided by the ISA file, declared here so the bodies can use them ----
   bk_ld_f16 / bk_st_f16: BK_LF binary16 values <-> f32 lanes (RNE);
   bk_ld_u16x / bk_st_u16x, bk_ld_u8x / bk_st_u8x: BK_LF 16-bit / 8-bit values
   zero-extended to / truncated from 32-bit lanes;
   bk_cmul_f32 / bk_cmul_f64: complex products, (ac - bd, ad + bc);
   bk_min_vf32 / bk_max_vf32 / bk_min_vf64 / bk_max_vf64: NaN if either
   operand is NaN, -0 below +0 (so the result never depends on the order);
   bk_stream / bk_fence: one non-temporal vector store (aligned) and sfence. */
static inline vf32 bk_ld_f16(const void *p);
static inline void bk_st_f16(void *p, vf32 v);
static inline vu32 bk_ld_u16x(const void *p);
static inline void bk_st_u16x(void *p, vu32 v);
static inline vu32 bk_ld_u8x(const void *p);
static inline void bk_st_u8x(void *p, vu32 v);
static inline vf32 bk_cmul_f32(vf32 a, vf32 b);
static inline vf64 bk_cmul_f64(vf64 a, vf64 b);
static inline vf32 bk_min_vf32(vf32 a, vf32 b);
static inline vf32 bk_max_vf32(vf32 a, vf32 b);
static inline vf64 bk_min_vf64(vf64 a, vf64 b);
static inline vf64 bk_max_vf64(vf64 a, vf64 b);
static inline void bk_stream(void *p, vu64 v);
static void bk_fence(void);

#define BK_ID(x) (x)

/* Floating point. MIN/MAX come from the ISA file (bk_min_vf32 ...). */
#define BK_FLOAT_OPS(V)                                                                    \
  static inline V bk_add_##V(V a, V b) { return a + b; }                                   \
  static inline V bk_mul_##V(V a, V b) { return a * b; }
BK_FLOAT_OPS(vf32)
BK_FLOAT_OPS(vf64)

/* Integers: arithmetic on unsigned lanes (wraps), comparisons signed or unsigned. */
#define BK_INT_OPS(W)                                                                      \
  static inline vu##W bk_add_u##W(vu##W a, vu##W b) { return a + b; }                      \
  static inline vu##W bk_mul_u##W(vu##W a, vu##W b) { return a * b; }                      \
  static inline vu##W bk_smin_u##W(vu##W a, vu##W b) {                                     \
    vu##W m = (vu##W)((vi##W)a < (vi##W)b);                                                \
    return (m & a) | (~m & b);                                                             \
  }                                                                                        \
  static inline vu##W bk_smax_u##W(vu##W a, vu##W b) {                                     \
    vu##W m = (vu##W)((vi##W)a > (vi##W)b);                                                \
    return (m & a) | (~m & b);                                                             \
  }                                                                                        \
  static inline vu##W bk_umin_u##W(vu##W a, vu##W b) {                                     \
    vu##W m = (vu##W)(a < b);                                                              \
    return (m & a) | (~m & b);                                                             \
  }                                                                                        \
  static inline vu##W bk_umax_u##W(vu##W a, vu##W b) {                                     \
    vu##W m = (vu##W)(a > b);                                                              \
    return (m & a) | (~m & b);                                                             \
  }
BK_INT_OPS(8)
BK_INT_OPS(16)
BK_INT_OPS(32)
BK_INT_OPS(64)

static inline vu64 bk_and_b(vu64 a, vu64 b) { return a & b; }
static inline vu64 bk_or_b(vu64 a, vu64 b) { return a | b; }
static inline vu64 bk_xor_b(vu64 a, vu64 b) { return a ^ b; }

/* BOOL: any non-zero byte is true; the accumulator holds 0/1. */
static inline vu8 bk_bnorm(vu8 a) { return (vu8)(-(vi8)(a != 0)); }
static inline vu8 bk_band(vu8 a, vu8 b) { return a & bk_bnorm(b); }
static inline vu8 bk_bor(vu8 a, vu8 b) { return a | bk_bnorm(b); }
static inline vu8 bk_bxor(vu8 a, vu8 b) { return a ^ bk_bnorm(b); }

/* ---- Conversions written with integer lanes (exact, rounding-mode independent) ---- */

static inline vf32 bk_ld_bf16(const void *p) { return (vf32)(bk_ld_u16x(p) << 16); }
static inline void bk_st_bf16(void *p, vf32 v) {
  vu32 x = (vu32)v;
  vu32 r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16; /* RNE; overflow carries into inf */
  vu32 nan = (vu32)((x & 0x7fffffffu) > 0x7f800000u);
  bk_st_u16x(p, (nan & ((x >> 16) | 0x40u)) | (~nan & r));
}

/* Small denormal codes are decoded as integer * 2^-k: exact, normal results,
   so a DAZ setting cannot change them. */
static inline vf32 bk_ld_e4m3(const void *p) {
  vu32 c = bk_ld_u8x(p), mag = c & 0x7fu, sign = (c & 0x80u) << 24;
  vu32 nrm = (mag << 20) + (120u << 23);
  vu32 sub = (vu32)(__builtin_convertvector((vi32)mag, vf32) * 0x1p-9f);
  vu32 is_nan = (vu32)(mag == 0x7fu), is_sub = (vu32)(mag < 8u);
  vu32 r = (is_nan & 0x7fc00000u) | (~is_nan & ((is_sub & sub) | (~is_sub & nrm)));
  return (vf32)(r | sign);
}
static inline vf32 bk_ld_e5m2(const void *p) {
  vu32 c = bk_ld_u8x(p), mag = c & 0x7fu, sign = (c & 0x80u) << 24;
  vu32 nrm = (mag << 21) + (112u << 23);
  vu32 sub = (vu32)(__builtin_convertvector((vi32)mag, vf32) * 0x1p-16f);
  vu32 is_inf = (vu32)(mag == 0x7cu), is_nan = (vu32)(mag > 0x7cu), is_sub = (vu32)(mag < 4u);
  vu32 r = (is_inf & 0x7f800000u) | (is_nan & 0x7fc00000u) |
           (~(is_inf | is_nan) & ((is_sub & sub) | (~is_sub & nrm)));
  return (vf32)(r | sign);
}

/* Rounds the 24-bit significand m (implicit bit set) right by s bits, ties to
   even; s is clamped to [lo, 24] so every shift is in range. */
static inline vu32 bk_rne_shift(vu32 m, vi32 s, int lo) {
  vi32 tlo = (vi32)(s < lo), thi = (vi32)(s > 24);
  s = (tlo & lo) | (thi & 24) | (~(tlo | thi) & s);
  vu32 us = (vu32)s, one = (vu32){0} + 1u;
  return (m + ((one << (us - 1u)) - 1u) + ((m >> us) & 1u)) >> us;
}

static inline void bk_st_e4m3(void *p, vf32 v) {
  vu32 x = (vu32)v, sign = (x >> 24) & 0x80u, a = x & 0x7fffffffu;
  vu32 nrm = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  vu32 nrm_ok = (vu32)(nrm <= 0x7eu); /* rounded above 448: no infinity, so NaN */
  nrm = (nrm_ok & nrm) | (~nrm_ok & 0x7fu);
  vu32 sub = bk_rne_shift((a & 0x7fffffu) | 0x800000u, 141 - (vi32)(a >> 23), 21);
  vu32 is_nan = (vu32)(a >= 0x7f800000u), is_nrm = (vu32)(a >= 0x3c800000u);
  vu32 is_sub = (vu32)(a > 0x3a800000u); /* at or below 2^-10 rounds to 0 */
  vu32 r = (is_nan & 0x7fu) | (~is_nan & ((is_nrm & nrm) | (~is_nrm & is_sub & sub)));
  bk_st_u8x(p, r | sign);
}
static inline void bk_st_e5m2(void *p, vf32 v) {
  vu32 x = (vu32)v, sign = (x >> 24) & 0x80u, a = x & 0x7fffffffu;
  vu32 nrm = ((a + 0xfffffu + ((a >> 21) & 1u)) >> 21) - (112u << 2);
  vu32 nrm_ok = (vu32)(nrm < 0x7cu); /* overflow, and inf itself, give inf */
  nrm = (nrm_ok & nrm) | (~nrm_ok & 0x7cu);
  vu32 sub = bk_rne_shift((a & 0x7fffffu) | 0x800000u, 134 - (vi32)(a >> 23), 22);
  vu32 is_nan = (vu32)(a > 0x7f800000u), is_nrm = (vu32)(a >= 0x38800000u);
  vu32 is_sub = (vu32)(a > 0x37000000u); /* at or below 2^-17 rounds to 0 */
  vu32 r = (is_nan & 0x7eu) | (~is_nan & ((is_nrm & nrm) | (~is_nrm & is_sub & sub)));
  bk_st_u8x(p, r | sign);
}

/* ---- Kernel generators ---- */

/* Combines nsrc sources element-wise; every source element is loaded before
   the destination element is stored, so dst may alias a source exactly.
   With nt, whole vectors from the first 64-byte boundary on are streamed
   (dst is element-aligned, so the head is whole elements). */
#define BK_STREAM_T(p, v) bk_stream((p), (vu64)(v))
#define BK_MULTI_LOOP(T, FIRST, OP, STORE)                                                 \
  if (nsrc == 2) {                                                                         \
    const unsigned char *s1 = (const unsigned char *)srcs[1];                              \
    for (; i + 2 * sizeof(T) <= nb; i += 2 * sizeof(T)) {                                  \
      T x0 = FIRST(bk_ld_##T(s0 + i)), x1 = FIRST(bk_ld_##T(s0 + i + sizeof(T)));          \
      T y0 = bk_ld_##T(s1 + i), y1 = bk_ld_##T(s1 + i + sizeof(T));                        \
      STORE(d + i, OP(x0, y0));                                                            \
      STORE(d + i + sizeof(T), OP(x1, y1));                                                \
    }                                                                                      \
  }                                                                                        \
  for (; i + sizeof(T) <= nb; i += sizeof(T)) {                                            \
    T acc = FIRST(bk_ld_##T(s0 + i));                                                      \
    for (int k = 1; k < nsrc; k++) acc = OP(acc, bk_ld_##T((const unsigned char *)srcs[k] + i)); \
    STORE(d + i, acc);                                                                     \
  }
#define BK_MULTI(name, T, ESZ, FIRST, OP)                                                  \
  static void name##_part(unsigned char *d, const void *const *srcs, int nsrc, size_t i, size_t r) { \
    T acc = FIRST(bk_ldp_##T((const unsigned char *)srcs[0] + i, r));                      \
    for (int k = 1; k < nsrc; k++) acc = OP(acc, bk_ldp_##T((const unsigned char *)srcs[k] + i, r)); \
    bk_stp_##T(d + i, acc, r);                                                             \
  }                                                                                        \
  static void name(void *dst, const void *const *srcs, int nsrc, size_t n, int nt) {       \
    unsigned char *d = (unsigned char *)dst;                                               \
    const unsigned char *s0 = (const unsigned char *)srcs[0];                              \
    size_t nb = n * (ESZ), i = 0;                                                          \
    if (nt) {                                                                              \
      size_t head = (size_t)(-(uintptr_t)d) & 63u;                                         \
      if (head > nb) head = nb;                                                            \
      for (size_t r; i < head; i += r) {                                                   \
        r = head - i < sizeof(T) ? head - i : sizeof(T);                                   \
        name##_part(d, srcs, nsrc, i, r);                                                  \
      }                                                                                    \
      BK_MULTI_LOOP(T, FIRST, OP, BK_STREAM_T)                                             \
    } else {                                                                               \
      BK_MULTI_LOOP(T, FIRST, OP, bk_st_##T)                                               \
    }                                                                                      \
    if (i < nb) name##_part(d, srcs, nsrc, i, nb - i);                                     \
  }

#define BK_DIV(name, T, ESZ, S)                                                            \
  static void name(void *dst, const void *src, size_t n, S dv) {                           \
    unsigned char *d = (unsigned char *)dst;                                               \
    const unsigned char *s = (const unsigned char *)src;                                   \
    size_t nb = n * (ESZ), i = 0;                                                          \
    for (; i + sizeof(T) <= nb; i += sizeof(T)) bk_st_##T(d + i, bk_ld_##T(s + i) / dv);   \
    if (i < nb) bk_stp_##T(d + i, bk_ldp_##T(s + i, nb - i) / dv, nb - i);                 \
  }

/* Low-precision format F (ESZ bytes per element) against f32 accumulators,
   BK_LF elements per step; the tail goes through zero-filled local buffers. */
#define BK_LP_LOAD(F, ESZ)                                                                 \
  static void bk_lpload_##F(void *acc, const void *src, size_t n) {                        \
    unsigned char *a = (unsigned char *)acc;                                               \
    const unsigned char *s = (const unsigned char *)src;                                   \
    size_t i = 0;                                                                          \
    for (; i + BK_LF <= n; i += BK_LF) bk_st_vf32(a + 4 * i, bk_ld_##F(s + (ESZ) * i));    \
    if (i < n) {                                                                           \
      unsigned char t_[BK_LF * (ESZ)];                                                     \
      memset(t_, 0, sizeof t_);                                                            \
      memcpy(t_, s + (ESZ) * i, (n - i) * (ESZ));                                          \
      bk_stp_vf32(a + 4 * i, bk_ld_##F(t_), (n - i) * 4);                                  \
    }                                                                                      \
  }
#define BK_LP_OP(F, ESZ, OPN)                                                              \
  static void bk_lpop_##F##_##OPN(void *acc, const void *src, size_t n) {                  \
    unsigned char *a = (unsigned char *)acc;                                               \
    const unsigned char *s = (const unsigned char *)src;                                   \
    size_t i = 0;                                                                          \
    for (; i + BK_LF <= n; i += BK_LF)                                                     \
      bk_st_vf32(a + 4 * i, bk_##OPN##_vf32(bk_ld_vf32(a + 4 * i), bk_ld_##F(s + (ESZ) * i))); \
    if (i < n) {                                                                           \
      unsigned char t_[BK_LF * (ESZ)];                                                     \
      memset(t_, 0, sizeof t_);                                                            \
      memcpy(t_, s + (ESZ) * i, (n - i) * (ESZ));                                          \
      vf32 v = bk_##OPN##_vf32(bk_ldp_vf32(a + 4 * i, (n - i) * 4), bk_ld_##F(t_));        \
      bk_stp_vf32(a + 4 * i, v, (n - i) * 4);                                              \
    }                                                                                      \
  }
#define BK_LP_STORE(F, ESZ, SUFFIX, DIVPARAM, DIVEXPR)                                     \
  static void bk_lpst##SUFFIX##_##F(void *dst, const void *acc, size_t n DIVPARAM) {       \
    unsigned char *d = (unsigned char *)dst;                                               \
    const unsigned char *a = (const unsigned char *)acc;                                   \
    size_t i = 0;                                                                          \
    for (; i + BK_LF <= n; i += BK_LF) {                                                   \
      vf32 v = bk_ld_vf32(a + 4 * i);                                                      \
      bk_st_##F(d + (ESZ) * i, DIVEXPR);                                                   \
    }                                                                                      \
    if (i < n) {                                                                           \
      unsigned char t_[BK_LF * (ESZ)];                                                     \
      vf32 v = bk_ldp_vf32(a + 4 * i, (n - i) * 4);                                        \
      bk_st_##F(t_, DIVEXPR);                                                              \
      memcpy(d + (ESZ) * i, t_, (n - i) * (ESZ));                                          \
    }                                                                                      \
  }
#define BK_LP_OPST(F, ESZ, OPN, SUFFIX, DIVPARAM, DIVEXPR)                                 \
  static void bk_lpopst##SUFFIX##_##F##_##OPN(void *dst, const void *acc, const void *src, size_t n DIVPARAM) { \
    unsigned char *d = (unsigned char *)dst;                                               \
    const unsigned char *a = (const unsigned char *)acc, *s = (const unsigned char *)src;  \
    size_t i = 0;                                                                          \
    for (; i + BK_LF <= n; i += BK_LF) {                                                   \
      vf32 v = bk_##OPN##_vf32(bk_ld_vf32(a + 4 * i), bk_ld_##F(s + (ESZ) * i));           \
      bk_st_##F(d + (ESZ) * i, DIVEXPR);                                                   \
    }                                                                                      \
    if (i < n) {                                                                           \
      unsigned char t_[BK_LF * (ESZ)];                                                     \
      memset(t_, 0, sizeof t_);                                                            \
      memcpy(t_, s + (ESZ) * i, (n - i) * (ESZ));                                          \
      vf32 v = bk_##OPN##_vf32(bk_ldp_vf32(a + 4 * i, (n - i) * 4), bk_ld_##F(t_));        \
      bk_st_##F(t_, DIVEXPR);                                                              \
      memcpy(d + (ESZ) * i, t_, (n - i) * (ESZ));                                          \
    }                                                                                      \
  }
#define BK_COMMA ,
#define BK_LP_OPST2(F, ESZ, OPN)                                                           \
  BK_LP_OPST(F, ESZ, OPN, , , v)                                                           \
  BK_LP_OPST(F, ESZ, OPN, div, BK_COMMA float dv, v / dv)
#define BK_LP_ALL(F, ESZ)                                                                  \
  BK_LP_LOAD(F, ESZ)                                                                       \
  BK_LP_OP(F, ESZ, add)                                                                    \
  BK_LP_OP(F, ESZ, mul)                                                                    \
  BK_LP_OP(F, ESZ, min)                                                                    \
  BK_LP_OP(F, ESZ, max)                                                                    \
  BK_LP_STORE(F, ESZ, , , v)                                                               \
  BK_LP_STORE(F, ESZ, div, BK_COMMA float dv, v / dv)                                      \
  BK_LP_OPST2(F, ESZ, add)                                                                 \
  BK_LP_OPST2(F, ESZ, mul)                                                                 \
  BK_LP_OPST2(F, ESZ, min)                                                                 \
  BK_LP_OPST2(F, ESZ, max)

#define BK_INT_KERNELS(W)                                                                  \
  BK_MULTI(bk_add_i##W, vu##W, W / 8, BK_ID, bk_add_u##W)                                  \
  BK_MULTI(bk_mul_i##W, vu##W, W / 8, BK_ID, bk_mul_u##W)                                  \
  BK_MULTI(bk_smin_i##W, vu##W, W / 8, BK_ID, bk_smin_u##W)                                \
  BK_MULTI(bk_smax_i##W, vu##W, W / 8, BK_ID, bk_smax_u##W)                                \
  BK_MULTI(bk_umin_i##W, vu##W, W / 8, BK_ID, bk_umin_u##W)                                \
  BK_MULTI(bk_umax_i##W, vu##W, W / 8, BK_ID, bk_umax_u##W)
#define BK_INT_ROW(W) {bk_add_i##W, bk_mul_i##W, bk_smin_i##W, bk_smax_i##W, bk_umin_i##W, bk_umax_i##W}
#define BK_LP_ROW(F) {bk_lpop_##F##_add, bk_lpop_##F##_mul, bk_lpop_##F##_min, bk_lpop_##F##_max}
#define BK_OPST_ROW(F, S) {bk_lpopst##S##_##F##_add, bk_lpopst##S##_##F##_mul, bk_lpopst##S##_##F##_min, bk_lpopst##S##_##F##_max}

#define BK_DEFINE_TABLE(TABLE, NAME)                                                       \
  BK_MULTI(bk_f32_sum, vf32, 4, BK_ID, bk_add_vf32)                                        \
  BK_MULTI(bk_f32_prod, vf32, 4, BK_ID, bk_mul_vf32)                                       \
  BK_MULTI(bk_f32_min, vf32, 4, BK_ID, bk_min_vf32)                                        \
  BK_MULTI(bk_f32_max, vf32, 4, BK_ID, bk_max_vf32)                                        \
  BK_MULTI(bk_f64_sum, vf64, 8, BK_ID, bk_add_vf64)                                        \
  BK_MULTI(bk_f64_prod, vf64, 8, BK_ID, bk_mul_vf64)                                       \
  BK_MULTI(bk_f64_min, vf64, 8, BK_ID, bk_min_vf64)                                        \
  BK_MULTI(bk_f64_max, vf64, 8, BK_ID, bk_max_vf64)                                        \
  BK_MULTI(bk_c64_prod, vf32, 8, BK_ID, bk_cmul_f32)                                       \
  BK_MULTI(bk_c128_prod, vf64, 16, BK_ID, bk_cmul_f64)                                     \
  BK_INT_KERNELS(8)                                                                        \
  BK_INT_KERNELS(16)                                                                       \
  BK_INT_KERNELS(32)                                                                       \
  BK_INT_KERNELS(64)                                                                       \
  BK_MULTI(bk_bits_and, vu64, 1, BK_ID, bk_and_b)                                          \
  BK_MULTI(bk_bits_or, vu64, 1, BK_ID, bk_or_b)                                            \
  BK_MULTI(bk_bits_xor, vu64, 1, BK_ID, bk_xor_b)                                          \
  BK_MULTI(bk_bool_and, vu8, 1, bk_bnorm, bk_band)                                         \
  BK_MULTI(bk_bool_or, vu8, 1, bk_bnorm, bk_bor)                                           \
  BK_MULTI(bk_bool_xor, vu8, 1, bk_bnorm, bk_bxor)                                         \
  BK_DIV(bk_f32_div, vf32, 4, float)                                                       \
  BK_DIV(bk_f64_div, vf64, 8, double)                                                      \
  BK_LP_ALL(f16, 2)                                                                        \
  BK_LP_ALL(bf16, 2)                                                                       \
  BK_LP_ALL(e4m3, 1)                                                                       \
  BK_LP_ALL(e5m2, 1)                                                                       \
  const braid__rk_table TABLE = {                                                          \
      .name = NAME,                                                                        \
      .f32 = {bk_f32_sum, bk_f32_prod, bk_f32_min, bk_f32_max},                            \
      .f64 = {bk_f64_sum, bk_f64_prod, bk_f64_min, bk_f64_max},                            \
      .c64_prod = bk_c64_prod,                                                             \
      .c128_prod = bk_c128_prod,                                                           \
      .ints = {BK_INT_ROW(8), BK_INT_ROW(16), BK_INT_ROW(32), BK_INT_ROW(64)},             \
      .bits = {bk_bits_and, bk_bits_or, bk_bits_xor},                                      \
      .bools = {bk_bool_and, bk_bool_or, bk_bool_xor},                                     \
      .f32_div = bk_f32_div,                                                               \
      .f64_div = bk_f64_div,                                                               \
      .lp_load = {bk_lpload_f16, bk_lpload_bf16, bk_lpload_e4m3, bk_lpload_e5m2},          \
      .lp_op = {BK_LP_ROW(f16), BK_LP_ROW(bf16), BK_LP_ROW(e4m3), BK_LP_ROW(e5m2)},        \
      .lp_store = {bk_lpst_f16, bk_lpst_bf16, bk_lpst_e4m3, bk_lpst_e5m2},                 \
      .lp_store_div = {bk_lpstdiv_f16, bk_lpstdiv_bf16, bk_lpstdiv_e4m3, bk_lpstdiv_e5m2}, \
      .lp_opst = {BK_OPST_ROW(f16, ), BK_OPST_ROW(bf16, ), BK_OPST_ROW(e4m3, ), BK_OPST_ROW(e5m2, )}, \
      .lp_opst_div = {BK_OPST_ROW(f16, div), BK_OPST_ROW(bf16, div), BK_OPST_ROW(e4m3, div),  \
                      BK_OPST_ROW(e5m2, div)},                                             \
      .fence = bk_fence,                                                                   \
  };

#endif /* BK_VB */
