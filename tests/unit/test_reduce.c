/* Reduction kernels against an independent element-wise reference, on every
   kernel set this CPU has (scalar, avx2, avx512). The reference decodes the
   low-precision formats from their bit fields with ldexp, emulates f32
   arithmetic in f64 (exact for + - * / of f32 operands, then one rounding),
   and rounds to the narrow formats by searching the nearest representable
   neighbours. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/reduce.h"
#include "harness.h"

/* ------------------------------------------------------------------------ */
/* Type table */

enum { K_F32, K_F64, K_LP, K_INT, K_BOOL, K_C64, K_C128 };
enum { LP_F16, LP_BF16, LP_E4M3, LP_E5M2 };

typedef struct {
  braid_dtype dt;
  const char *name;
  size_t esz;
  int kind;
  int lp;     /* LP_* for K_LP */
  int sgn;    /* signed integer */
} dtinfo;

static const dtinfo DTS[] = {
    {BRAID_F64, "f64", 8, K_F64, 0, 0},       {BRAID_F32, "f32", 4, K_F32, 0, 0},
    {BRAID_F16, "f16", 2, K_LP, LP_F16, 0},   {BRAID_BF16, "bf16", 2, K_LP, LP_BF16, 0},
    {BRAID_FP8_E4M3, "e4m3", 1, K_LP, LP_E4M3, 0}, {BRAID_FP8_E5M2, "e5m2", 1, K_LP, LP_E5M2, 0},
    {BRAID_I64, "i64", 8, K_INT, 0, 1},       {BRAID_I32, "i32", 4, K_INT, 0, 1},
    {BRAID_I16, "i16", 2, K_INT, 0, 1},       {BRAID_I8, "i8", 1, K_INT, 0, 1},
    {BRAID_U64, "u64", 8, K_INT, 0, 0},       {BRAID_U32, "u32", 4, K_INT, 0, 0},
    {BRAID_U16, "u16", 2, K_INT, 0, 0},       {BRAID_U8, "u8", 1, K_INT, 0, 0},
    {BRAID_BOOL, "bool", 1, K_BOOL, 0, 0},    {BRAID_C64, "c64", 8, K_C64, 0, 0},
    {BRAID_C128, "c128", 16, K_C128, 0, 0},
};
#define NDT (sizeof DTS / sizeof DTS[0])
static const char *const OPNAMES[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
static const char *const ISAS[] = {"scalar", "avx2", "avx512"};

static const dtinfo *dtinfo_of(braid_dtype dt) {
  for (size_t i = 0; i < NDT; i++)
    if (DTS[i].dt == dt) return &DTS[i];
  return NULL;
}

/* Expected braid__check_dtype_op result, written from the spec table. */
static braid_status expect_status(const dtinfo *d, int op) {
  if (op < 0 || op > 7) return BRAID_ERR_INVALID_ARG;
  int bitwise = op >= BRAID_BAND;
  switch (d->kind) {
    case K_F32: case K_F64: case K_LP: return bitwise ? BRAID_ERR_UNSUPPORTED : BRAID_OK;
    case K_INT: return BRAID_OK;
    case K_BOOL: return op == BRAID_AVG ? BRAID_ERR_UNSUPPORTED : BRAID_OK;
    default: return (op == BRAID_SUM || op == BRAID_PROD || op == BRAID_AVG) ? BRAID_OK : BRAID_ERR_UNSUPPORTED;
  }
}

/* ------------------------------------------------------------------------ */
/* Reference formats */

typedef struct {
  int ebits, mbits, bias;
  int fn;         /* E4M3FN: no infinity, only S.1111.111 is NaN */
  unsigned maxfin;  /* largest finite positive code */
  unsigned nanc;    /* a NaN code */
  unsigned infc;    /* +inf code (0 when none) */
} lpfmt;

static const lpfmt LPF[4] = {
    {5, 10, 15, 0, 0x7bff, 0x7e00, 0x7c00},
    {8, 7, 127, 0, 0x7f7f, 0x7fc0, 0x7f80},
    {4, 3, 7, 1, 0x7e, 0x7f, 0},
    {5, 2, 15, 0, 0x7b, 0x7e, 0x7c},
};

/* Magnitude of a code read as if the exponent continued past the top (used
   for the rounding neighbour above the largest finite value). */
static double lp_mag_ext(int f, unsigned code) {
  const lpfmt *L = &LPF[f];
  unsigned e = (code >> L->mbits) & ((1u << L->ebits) - 1u), m = code & ((1u << L->mbits) - 1u);
  if (e == 0) return ldexp((double)m, 1 - L->bias - L->mbits);
  return ldexp((double)((1u << L->mbits) + m), (int)e - L->bias - L->mbits);
}

static int lp_isnan_code(int f, unsigned code) {
  const lpfmt *L = &LPF[f];
  unsigned sbit = 1u << (L->ebits + L->mbits), mag = code & (sbit - 1u);
  unsigned emax = (1u << L->ebits) - 1u, e = mag >> L->mbits, m = mag & ((1u << L->mbits) - 1u);
  if (L->fn) return mag == (sbit - 1u);
  return e == emax && m != 0;
}

static double lp_decode(int f, unsigned code) {
  const lpfmt *L = &LPF[f];
  unsigned sbit = 1u << (L->ebits + L->mbits), mag = code & (sbit - 1u);
  unsigned emax = (1u << L->ebits) - 1u, e = mag >> L->mbits;
  double v;
  if (lp_isnan_code(f, code)) return NAN;
  if (!L->fn && e == emax)
    v = INFINITY;
  else
    v = lp_mag_ext(f, mag);
  return (code & sbit) ? -v : v;
}

/* Round x (any double) to the nearest code, ties to the even code. */
static unsigned lp_encode(int f, double x) {
  const lpfmt *L = &LPF[f];
  unsigned sbit = 1u << (L->ebits + L->mbits);
  if (isnan(x)) return L->nanc;
  unsigned sign = signbit(x) ? sbit : 0;
  double ax = fabs(x);
  unsigned over = L->fn ? (sbit - 1u) : L->infc; /* what overflow gives */
  if (isinf(ax)) return sign | over;
  unsigned lo = 0, hi = L->maxfin; /* largest code with magnitude <= ax */
  if (ax >= lp_mag_ext(f, hi)) {
    lo = hi;
  } else {
    while (hi - lo > 1) {
      unsigned mid = (lo + hi) / 2;
      if (lp_mag_ext(f, mid) <= ax) lo = mid; else hi = mid;
    }
  }
  double vlo = lp_mag_ext(f, lo), vhi = lp_mag_ext(f, lo + 1);
  unsigned c;
  if (ax == vlo) c = lo;
  else if (ax - vlo < vhi - ax) c = lo;
  else if (ax - vlo > vhi - ax) c = lo + 1;
  else c = (lo & 1u) ? lo + 1 : lo;
  if (c > L->maxfin) c = over;
  return sign | c;
}

/* ------------------------------------------------------------------------ */
/* Reference element-wise reduction */

static float ldf(const void *p) { float v; memcpy(&v, p, 4); return v; }
static double ldd(const void *p) { double v; memcpy(&v, p, 8); return v; }
static unsigned ldcode(const void *p, size_t esz) {
  if (esz == 1) return *(const unsigned char *)p;
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}
static uint64_t ldint(const void *p, const dtinfo *d) {
  uint64_t u = 0;
  memcpy(&u, p, d->esz); /* little-endian */
  if (d->sgn && d->esz < 8 && (u >> (8 * d->esz - 1)) & 1u) u |= ~0ull << (8 * d->esz);
  return u;
}

static double ref_min(double a, double b) {
  if (isnan(a) || isnan(b)) return NAN;
  if (a == b) return signbit(a) ? a : b;
  return a < b ? a : b;
}
static double ref_max(double a, double b) {
  if (isnan(a) || isnan(b)) return NAN;
  if (a == b) return signbit(a) ? b : a;
  return a > b ? a : b;
}
/* One f32 operation: exact in f64, then rounded once to f32. */
static float f32op(float a, float b, int op) {
  switch (op) {
    case BRAID_PROD: return (float)((double)a * (double)b);
    case BRAID_MIN: return (float)ref_min(a, b);
    case BRAID_MAX: return (float)ref_max(a, b);
    default: return (float)((double)a + (double)b);
  }
}
static double f64op(double a, double b, int op) {
  switch (op) {
    case BRAID_PROD: return a * b;
    case BRAID_MIN: return ref_min(a, b);
    case BRAID_MAX: return ref_max(a, b);
    default: return a + b;
  }
}

static void ref_elem(const dtinfo *d, int op, const unsigned char *const *s, int nsrc, int div, unsigned char *out) {
  switch (d->kind) {
    case K_F32: {
      float acc = ldf(s[0]);
      for (int k = 1; k < nsrc; k++) acc = f32op(acc, ldf(s[k]), op);
      if (op == BRAID_AVG) acc = (float)((double)acc / div);
      memcpy(out, &acc, 4);
      break;
    }
    case K_LP: {
      float acc = (float)lp_decode(d->lp, ldcode(s[0], d->esz));
      for (int k = 1; k < nsrc; k++) acc = f32op(acc, (float)lp_decode(d->lp, ldcode(s[k], d->esz)), op);
      if (op == BRAID_AVG) acc = (float)((double)acc / div);
      unsigned c = lp_encode(d->lp, acc);
      memcpy(out, &c, d->esz); /* little-endian low bytes */
      break;
    }
    case K_F64: {
      double acc = ldd(s[0]);
      for (int k = 1; k < nsrc; k++) acc = f64op(acc, ldd(s[k]), op);
      if (op == BRAID_AVG) acc = acc / div;
      memcpy(out, &acc, 8);
      break;
    }
    case K_INT: {
      uint64_t acc = ldint(s[0], d);
      unsigned w = (unsigned)(8 * d->esz);
      uint64_t mask = w == 64 ? ~0ull : (1ull << w) - 1u;
      for (int k = 1; k < nsrc; k++) {
        uint64_t v = ldint(s[k], d);
        switch (op) {
          case BRAID_PROD: acc *= v; break;
          case BRAID_MIN:
            if (d->sgn ? (int64_t)v < (int64_t)acc : v < acc) acc = v;
            break;
          case BRAID_MAX:
            if (d->sgn ? (int64_t)v > (int64_t)acc : v > acc) acc = v;
            break;
          case BRAID_BAND: acc &= v; break;
          case BRAID_BOR: acc |= v; break;
          case BRAID_BXOR: acc ^= v; break;
          default: acc += v; break;
        }
      }
      if (op == BRAID_AVG) {
        uint64_t t = acc & mask;
        if (d->sgn) {
          int64_t sv = (w < 64 && (t >> (w - 1)) & 1u) ? (int64_t)(t | ~mask) : (int64_t)t;
          acc = (uint64_t)(sv / (int64_t)div); /* C division truncates toward zero */
        } else {
          acc = t / (uint64_t)div;
        }
      }
      memcpy(out, &acc, d->esz);
      break;
    }
    case K_BOOL: {
      unsigned acc = s[0][0] != 0;
      for (int k = 1; k < nsrc; k++) {
        unsigned v = s[k][0] != 0;
        if (op == BRAID_SUM || op == BRAID_MAX || op == BRAID_BOR) acc |= v;
        else if (op == BRAID_BXOR) acc ^= v;
        else acc &= v;
      }
      out[0] = (unsigned char)acc;
      break;
    }
    case K_C64: {
      float re = ldf(s[0]), im = ldf(s[0] + 4);
      for (int k = 1; k < nsrc; k++) {
        float br = ldf(s[k]), bi = ldf(s[k] + 4);
        if (op == BRAID_PROD) {
          float p1 = (float)((double)re * br), p2 = (float)((double)im * bi);
          float p3 = (float)((double)re * bi), p4 = (float)((double)im * br);
          re = (float)((double)p1 - (double)p2);
          im = (float)((double)p3 + (double)p4);
        } else {
          re = (float)((double)re + br);
          im = (float)((double)im + bi);
        }
      }
      if (op == BRAID_AVG) re = (float)((double)re / div), im = (float)((double)im / div);
      memcpy(out, &re, 4);
      memcpy(out + 4, &im, 4);
      break;
    }
    default: { /* K_C128 */
      double re = ldd(s[0]), im = ldd(s[0] + 8);
      for (int k = 1; k < nsrc; k++) {
        double br = ldd(s[k]), bi = ldd(s[k] + 8);
        if (op == BRAID_PROD) {
          double p1 = re * br, p2 = im * bi, p3 = re * bi, p4 = im * br;
          re = p1 - p2;
          im = p3 + p4;
        } else {
          re += br;
          im += bi;
        }
      }
      if (op == BRAID_AVG) re /= div, im /= div;
      memcpy(out, &re, 8);
      memcpy(out + 8, &im, 8);
      break;
    }
  }
}

/* Equal bits, or both NaN. */
static int same_elem(const dtinfo *d, const unsigned char *want, const unsigned char *got) {
  switch (d->kind) {
    case K_F32: case K_C64:
      for (size_t o = 0; o < d->esz; o += 4)
        if (!(isnan(ldf(want + o)) ? isnan(ldf(got + o)) : memcmp(want + o, got + o, 4) == 0)) return 0;
      return 1;
    case K_F64: case K_C128:
      for (size_t o = 0; o < d->esz; o += 8)
        if (!(isnan(ldd(want + o)) ? isnan(ldd(got + o)) : memcmp(want + o, got + o, 8) == 0)) return 0;
      return 1;
    case K_LP:
      if (lp_isnan_code(d->lp, ldcode(want, d->esz))) return lp_isnan_code(d->lp, ldcode(got, d->esz));
      return memcmp(want, got, d->esz) == 0;
    default:
      return memcmp(want, got, d->esz) == 0;
  }
}

static void hex(char *buf, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) sprintf(buf + 2 * i, "%02x", p[n - 1 - i]);
}

/* ------------------------------------------------------------------------ */
/* Random inputs */

static unsigned long long g_rng = 12345;
static uint64_t rnd(void) { return bt_rand(&g_rng); }

static float rnd_f32(void) {
  static const uint32_t sp[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 1u,
                                0x80000001u, 0x7f7fffffu, 0x3f800000u, 0xbf800000u, 0x00800000u};
  uint64_t r = rnd();
  float f;
  uint32_t u;
  switch (r % 16) {
    case 0: u = (uint32_t)(r >> 8); memcpy(&f, &u, 4); return f;
    case 1: u = sp[(r >> 8) % (sizeof sp / sizeof sp[0])]; memcpy(&f, &u, 4); return f;
    default: return (float)ldexp((double)((int64_t)((r >> 8) % 2000001) - 1000000) / 1000.0, (int)((r >> 40) % 41) - 20);
  }
}
static double rnd_f64(void) {
  uint64_t r = rnd();
  double f;
  switch (r % 16) {
    case 0: { uint64_t u = rnd(); memcpy(&f, &u, 8); return f; }
    case 1: return (double)rnd_f32();
    default: return ldexp((double)((int64_t)((r >> 8) % 2000001) - 1000000) / 1000.0, (int)((r >> 40) % 41) - 20);
  }
}
static void fill_rand(const dtinfo *d, unsigned char *p, size_t count, int raw_bits) {
  for (size_t i = 0; i < count; i++) {
    unsigned char *e = p + i * d->esz;
    if (raw_bits || d->kind == K_LP || d->kind == K_INT) {
      for (size_t b = 0; b < d->esz; b += 8) {
        uint64_t r = rnd();
        memcpy(e + b, &r, d->esz - b < 8 ? d->esz - b : 8);
      }
      if (d->kind == K_INT && rnd() % 4 == 0) { /* small values too */
        uint64_t r = rnd() % 7 - 3;
        memcpy(e, &r, d->esz);
      }
    } else if (d->kind == K_BOOL) {
      uint64_t r = rnd();
      e[0] = (r & 1) ? 0 : (unsigned char)(r >> 8);
    } else if (d->kind == K_F32 || d->kind == K_C64) {
      for (size_t o = 0; o < d->esz; o += 4) {
        float f = rnd_f32();
        memcpy(e + o, &f, 4);
      }
    } else {
      for (size_t o = 0; o < d->esz; o += 8) {
        double f = rnd_f64();
        memcpy(e + o, &f, 8);
      }
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Checked call: guard bytes around dst, untouched sources, element compare */

#define GUARD 32
#define MAXS 24

typedef struct {
  unsigned char *mem[MAXS + 1];
  unsigned char *ptr[MAXS + 1]; /* [0..nsrc-1] sources, [MAXS] dst */
  unsigned char *orig[MAXS];    /* copies of the sources */
} bufs;

static void bufs_free(bufs *b) {
  for (int i = 0; i <= MAXS; i++) free(b->mem[i]);
  for (int i = 0; i < MAXS; i++) free(b->orig[i]);
}

/* mode 0: out of place; mode 1: dst == srcs[0]; mode 2: dst == srcs[1]; mode 3: dst == srcs[nsrc-1] */
static int run_check(const dtinfo *d, int op, int nsrc, size_t count, int mode, int div, unsigned seed,
                     int raw_bits, const char *isa) {
  bufs b;
  memset(&b, 0, sizeof b);
  size_t bytes = count * d->esz;
  int rc = 1;
  for (int k = 0; k <= nsrc; k++) {
    int slot = k == nsrc ? MAXS : k;
    size_t off = (seed + 3u * (unsigned)k) % 8u; /* misaligned by 0..7 bytes */
    b.mem[slot] = malloc(bytes + 2 * GUARD + 8);
    if (!b.mem[slot]) goto out;
    memset(b.mem[slot], 0xA5, bytes + 2 * GUARD + 8);
    b.ptr[slot] = b.mem[slot] + GUARD + off;
    if (k < nsrc) {
      fill_rand(d, b.ptr[slot], count, raw_bits);
      b.orig[k] = malloc(bytes + 1);
      if (!b.orig[k]) goto out;
      memcpy(b.orig[k], b.ptr[slot], bytes);
    }
  }
  unsigned char *dst = b.ptr[MAXS];
  unsigned char *dmem = b.mem[MAXS];
  if (mode >= 1) {
    int which = mode == 1 ? 0 : mode == 2 ? 1 : nsrc - 1;
    dst = b.ptr[which];
    dmem = b.mem[which];
  }
  const void *srcs[MAXS] = {NULL};
  for (int k = 0; k < nsrc; k++) srcs[k] = b.ptr[k];
  braid__reduce(dst, srcs, nsrc, count, d->dt, (braid_op)op, div);

  for (unsigned char *p = dmem; p < dst; p++)
    if (*p != 0xA5) {
      bt_report(__FILE__, __LINE__, "%s %s %s nsrc=%d count=%zu mode=%d: byte before dst changed", isa, d->name,
                OPNAMES[op], nsrc, count, mode);
      goto out;
    }
  for (size_t g = 0; g < GUARD; g++)
    if (dst[bytes + g] != 0xA5) {
      bt_report(__FILE__, __LINE__, "%s %s %s nsrc=%d count=%zu mode=%d: guard byte %zu after dst changed", isa,
                d->name, OPNAMES[op], nsrc, count, mode, g);
      goto out;
    }
  for (int k = 0; k < nsrc; k++)
    if (b.ptr[k] != dst && memcmp(b.ptr[k], b.orig[k], bytes) != 0) {
      bt_report(__FILE__, __LINE__, "%s %s %s: source %d changed", isa, d->name, OPNAMES[op], k);
      goto out;
    }
  for (size_t i = 0; i < count; i++) {
    const unsigned char *es[MAXS] = {NULL};
    unsigned char want[16];
    for (int k = 0; k < nsrc; k++) es[k] = b.orig[k] + i * d->esz;
    ref_elem(d, op, es, nsrc, div, want);
    if (!same_elem(d, want, dst + i * d->esz)) {
      char hw[40], hg[40], hi[MAXS][40];
      hex(hw, want, d->esz);
      hex(hg, dst + i * d->esz, d->esz);
      bt_report(__FILE__, __LINE__, "%s %s %s nsrc=%d count=%zu mode=%d div=%d: element %zu: want %s got %s", isa,
                d->name, OPNAMES[op], nsrc, count, mode, div, i, hw, hg);
      for (int k = 0; k < nsrc && k < 5; k++) {
        hex(hi[k], es[k], d->esz);
        bt_report(__FILE__, __LINE__, "  input %d: %s", k, hi[k]);
      }
      goto out;
    }
  }
  rc = 0;
out:
  bufs_free(&b);
  return rc;
}

/* Every valid op of the dtypes of one kind, on every kernel set. */
static int sweep_kind(int kind) {
  static const size_t counts[] = {0, 1, 7, 31, 64, 1000, 4099};
  static const int nsrcs[] = {2, 3, 5};
  unsigned seed = 0;
  for (size_t di = 0; di < NDT; di++) {
    const dtinfo *d = &DTS[di];
    if (d->kind != kind) continue;
    for (int op = 0; op < 8; op++) {
      if (braid__check_dtype_op(d->dt, (braid_op)op) != BRAID_OK) continue;
      for (int is = 0; is < 3; is++) {
        if (braid__reduce_set_isa(ISAS[is]) != 0) continue;
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
          for (size_t ni = 0; ni < sizeof nsrcs / sizeof nsrcs[0]; ni++) {
            int nsrc = nsrcs[ni];
            /* the largest count gets every aliasing mode, the others rotate through them */
            for (int mode = 0; mode < 4; mode++) {
              if (counts[ci] != 4099 && mode != (int)((ci + ni) % 4)) continue;
              int div = nsrc + (int)(seed % 3);
              seed++;
              if (run_check(d, op, nsrc, counts[ci], mode, div, seed, 0, ISAS[is])) return 1;
            }
          }
      }
    }
  }
  braid__reduce_set_isa(NULL);
  return 0;
}

static int test_sweep_f32_f64(void) { return sweep_kind(K_F32) || sweep_kind(K_F64); }
static int test_sweep_lowprec(void) { return sweep_kind(K_LP); }
static int test_sweep_int(void) { return sweep_kind(K_INT); }
static int test_sweep_bool_complex(void) { return sweep_kind(K_BOOL) || sweep_kind(K_C64) || sweep_kind(K_C128); }

/* Many sources (folded in groups inside the library) and raw bit patterns. */
static int test_many_sources_raw_bits(void) {
  unsigned seed = 77;
  for (size_t di = 0; di < NDT; di++) {
    const dtinfo *d = &DTS[di];
    for (int op = 0; op < 8; op++) {
      if (braid__check_dtype_op(d->dt, (braid_op)op) != BRAID_OK) continue;
      for (int is = 0; is < 3; is++) {
        if (braid__reduce_set_isa(ISAS[is]) != 0) continue;
        if (run_check(d, op, 20, 1500, 3, 20, seed++, 0, ISAS[is])) return 1;
        if (run_check(d, op, 17, 33, 0, 5, seed++, 1, ISAS[is])) return 1;
        if (run_check(d, op, 1, 301, 1, 3, seed++, 1, ISAS[is])) return 1;
        if (run_check(d, op, 1, 77, 0, 2, seed++, 0, ISAS[is])) return 1;
      }
    }
  }
  braid__reduce_set_isa(NULL);
  return 0;
}

/* Non-temporal output path: forced on for every size (threshold 0), then
   once at the default threshold with buffers big enough to reach it. */
static int test_nontemporal(void) {
  size_t prev = braid__reduce_set_nt_threshold(0);
  BT_CHECK(prev == (size_t)32 << 20, "default threshold %zu", prev);
  unsigned seed = 5;
  for (size_t di = 0; di < NDT; di++) {
    const dtinfo *d = &DTS[di];
    for (int op = 0; op < 8; op++) {
      if (braid__check_dtype_op(d->dt, (braid_op)op) != BRAID_OK) continue;
      for (int is = 0; is < 3; is++) {
        if (braid__reduce_set_isa(ISAS[is]) != 0) continue;
        if (run_check(d, op, 2, 1201, (int)(seed % 4), 2, seed, 0, ISAS[is])) return 1;
        seed++;
        if (run_check(d, op, 3, 70, (int)(seed % 4), 3, seed, 0, ISAS[is])) return 1;
        seed++;
        if (run_check(d, op, 1, 1100, 1, 4, seed++, 0, ISAS[is])) return 1;
        if (run_check(d, op, 18, 199, 3, 18, seed++, 1, ISAS[is])) return 1;
      }
    }
  }
  BT_CHECK(braid__reduce_set_nt_threshold(prev) == 0, "threshold not returned");
  for (int is = 0; is < 3; is++) {
    if (braid__reduce_set_isa(ISAS[is]) != 0) continue;
    if (run_check(dtinfo_of(BRAID_F32), BRAID_SUM, 2, (size_t)3 << 20, 0, 1, 9, 0, ISAS[is])) return 1;
  }
  braid__reduce_set_isa(NULL);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Validation table */

static int test_check_dtype_op(void) {
  for (int code = -2; code < 50; code++) {
    const dtinfo *d = dtinfo_of((braid_dtype)code);
    for (int op = -2; op < 10; op++) {
      braid_status want = d ? expect_status(d, op) : BRAID_ERR_INVALID_ARG;
      braid_status got = braid__check_dtype_op((braid_dtype)code, (braid_op)op);
      BT_CHECK(got == want, "dtype %d op %d: got %d want %d", code, op, (int)got, (int)want);
    }
  }
  BT_CHECK(braid__check_dtype_op((braid_dtype)99, BRAID_SUM) == BRAID_ERR_INVALID_ARG, "dtype 99");
  BT_CHECK(braid__check_dtype_op((braid_dtype)6, BRAID_SUM) == BRAID_ERR_INVALID_ARG, "dtype 6");
  BT_CHECK(braid__check_dtype_op(BRAID_F32, (braid_op)8) == BRAID_ERR_INVALID_ARG, "op 8");
  BT_CHECK(braid__check_dtype_op(BRAID_BOOL, BRAID_AVG) == BRAID_ERR_UNSUPPORTED, "bool avg");
  BT_CHECK(braid__check_dtype_op(BRAID_C64, BRAID_MIN) == BRAID_ERR_UNSUPPORTED, "c64 min");
  BT_CHECK(braid__check_dtype_op(BRAID_F32, BRAID_BXOR) == BRAID_ERR_UNSUPPORTED, "f32 bxor");
  BT_CHECK(braid__check_dtype_op(BRAID_U8, BRAID_BXOR) == BRAID_OK, "u8 bxor");
  BT_CHECK(braid__acc_size(BRAID_F16) == 4 && braid__acc_size(BRAID_FP8_E4M3) == 4 &&
               braid__acc_size(BRAID_C128) == 16 && braid__acc_size(BRAID_I8) == 1 &&
               braid__acc_size((braid_dtype)6) == 0,
           "acc sizes");
  /* invalid or unsupported pairs leave dst alone */
  unsigned char dst[16], a[16], b[16];
  memset(dst, 0x5a, sizeof dst);
  memset(a, 1, sizeof a);
  memset(b, 2, sizeof b);
  const void *s[2] = {a, b};
  braid__reduce(dst, s, 2, 4, BRAID_F32, BRAID_BAND, 1);
  braid__reduce(dst, s, 2, 4, (braid_dtype)7, BRAID_SUM, 1);
  braid__reduce(dst, s, 2, 4, BRAID_C64, BRAID_MAX, 1);
  braid__reduce(dst, s, 2, 4, BRAID_BOOL, BRAID_AVG, 2);
  braid__reduce(dst, s, 0, 4, BRAID_F32, BRAID_SUM, 1);
  for (size_t i = 0; i < sizeof dst; i++) BT_CHECK(dst[i] == 0x5a, "dst byte %zu changed", i);
  return 0;
}

static int test_isa_selection(void) {
  BT_CHECK(braid__reduce_set_isa("scalar") == 0, "scalar always available");
  BT_CHECK(strcmp(braid__reduce_isa(), "scalar") == 0, "isa is %s", braid__reduce_isa());
  BT_CHECK(braid__reduce_set_isa("sse9") == -1, "unknown isa accepted");
  BT_CHECK(strcmp(braid__reduce_isa(), "scalar") == 0, "a failed set changed the isa");
  BT_CHECK(braid__reduce_set_isa(NULL) == 0, "reset");
  const char *a = braid__reduce_isa();
  BT_CHECK(!strcmp(a, "scalar") || !strcmp(a, "avx2") || !strcmp(a, "avx512"), "auto isa %s", a);
  for (int i = 0; i < 3; i++)
    if (braid__reduce_set_isa(ISAS[i]) == 0) {
      BT_CHECK(strcmp(braid__reduce_isa(), ISAS[i]) == 0, "forced %s, got %s", ISAS[i], braid__reduce_isa());
      printf("    kernel set available: %s\n", ISAS[i]);
    }
  braid__reduce_set_isa(NULL);
  printf("    automatic choice: %s\n", braid__reduce_isa());
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Conversions */

static int test_decode_exhaustive(void) {
  for (unsigned c = 0; c < 65536; c++) {
    float want = (float)lp_decode(LP_F16, c), got = braid__f16_to_f32((uint16_t)c);
    BT_CHECK(isnan(want) ? isnan(got) : memcmp(&want, &got, 4) == 0, "f16 %04x: %a vs %a", c, want, got);
    want = (float)lp_decode(LP_BF16, c), got = braid__bf16_to_f32((uint16_t)c);
    BT_CHECK(isnan(want) ? isnan(got) : memcmp(&want, &got, 4) == 0, "bf16 %04x", c);
  }
  for (unsigned c = 0; c < 256; c++) {
    float want = (float)lp_decode(LP_E4M3, c), got = braid__e4m3_to_f32((uint8_t)c);
    BT_CHECK(isnan(want) ? isnan(got) : memcmp(&want, &got, 4) == 0, "e4m3 %02x: %a vs %a", c, want, got);
    want = (float)lp_decode(LP_E5M2, c), got = braid__e5m2_to_f32((uint8_t)c);
    BT_CHECK(isnan(want) ? isnan(got) : memcmp(&want, &got, 4) == 0, "e5m2 %02x: %a vs %a", c, want, got);
  }
  /* spot values from the format definitions */
  BT_CHECK(braid__f16_to_f32(0x7bff) == 65504.0f && braid__f16_to_f32(0x0001) == 0x1p-24f, "f16 spots");
  BT_CHECK(braid__e4m3_to_f32(0x7e) == 448.0f && braid__e4m3_to_f32(0x01) == 0x1p-9f, "e4m3 spots");
  BT_CHECK(isnan(braid__e4m3_to_f32(0x7f)) && isnan(braid__e4m3_to_f32(0xff)), "e4m3 NaN");
  BT_CHECK(braid__e4m3_to_f32(0x78) == 256.0f, "e4m3 exponent 15 is finite");
  BT_CHECK(braid__e5m2_to_f32(0x7b) == 57344.0f && isinf(braid__e5m2_to_f32(0x7c)), "e5m2 spots");
  BT_CHECK(braid__e5m2_to_f32(0x01) == 0x1p-16f, "e5m2 subnormal");
  /* the vector decoders (through acc_load) agree on every code */
  static const braid_dtype lpd[4] = {BRAID_F16, BRAID_BF16, BRAID_FP8_E4M3, BRAID_FP8_E5M2};
  static uint16_t codes[65536 + 8];
  static float out[65536 + 8];
  for (int is = 0; is < 3; is++) {
    if (braid__reduce_set_isa(ISAS[is]) != 0) continue;
    for (int f = 0; f < 4; f++) {
      unsigned n = f < 2 ? 65536u : 256u;
      unsigned char *cb = (unsigned char *)codes + 1; /* misaligned */
      for (unsigned c = 0; c < n; c++) {
        if (f < 2) { uint16_t v = (uint16_t)c; memcpy(cb + 2 * c, &v, 2); }
        else cb[c] = (unsigned char)c;
      }
      braid__acc_load(out, cb, n, lpd[f]);
      for (unsigned c = 0; c < n; c++) {
        float want = (float)lp_decode(f, c);
        BT_CHECK(isnan(want) ? isnan(out[c]) : memcmp(&want, &out[c], 4) == 0, "%s: format %d code %x", ISAS[is],
                 f, c);
      }
    }
  }
  braid__reduce_set_isa(NULL);
  return 0;
}

static unsigned lib_encode(int f, float x) {
  switch (f) {
    case LP_F16: return braid__f32_to_f16(x);
    case LP_BF16: return braid__f32_to_bf16(x);
    case LP_E4M3: return braid__f32_to_e4m3(x);
    default: return braid__f32_to_e5m2(x);
  }
}

/* Inputs that exercise rounding: every representable value, every midpoint
   between neighbours (ties), one f32 ulp either side, and random floats. */
static size_t encode_inputs(int f, float *v, size_t cap) {
  size_t n = 0;
  unsigned maxc = LPF[f].maxfin;
  for (unsigned c = 0; c <= maxc + 1 && n + 8 <= cap; c++) {
    double lo = lp_mag_ext(f, c), hi = lp_mag_ext(f, c + 1), mid = (lo + hi) / 2;
    float m = (float)mid; /* exact: one more bit than the format */
    v[n++] = (float)lo;
    v[n++] = m;
    v[n++] = nextafterf(m, 0.0f);
    v[n++] = nextafterf(m, INFINITY);
    v[n++] = -m;
    v[n++] = -(float)lo;
  }
  static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, FLT_MAX, -FLT_MAX, FLT_MIN, 0x1p-149f, 1e30f};
  for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) v[n++] = sp[i];
  while (n < cap) {
    uint64_t r = rnd();
    float x;
    if (r & 1) {
      uint32_t u = (uint32_t)(r >> 16);
      memcpy(&x, &u, 4);
    } else { /* near the format's range */
      int emin = f == LP_BF16 ? -140 : f == LP_F16 ? -28 : f == LP_E4M3 ? -12 : -20;
      int span = f == LP_BF16 ? 270 : 48;
      x = (float)ldexp((double)((r >> 8) & 0xffffff) / 0x1p24, emin + (int)((r >> 40) % (unsigned)span));
      if (r & 2) x = -x;
    }
    v[n++] = x;
  }
  return n;
}

static int test_encode_rounding(void) {
  enum { CAP = 500000 };
  float *v = malloc(CAP * sizeof(float));
  unsigned char *o = malloc(CAP * 2 + 8);
  float *acc = malloc(CAP * sizeof(float) + 8);
  BT_CHECK(v && o && acc, "malloc");
  static const braid_dtype lpd[4] = {BRAID_F16, BRAID_BF16, BRAID_FP8_E4M3, BRAID_FP8_E5M2};
  for (int f = 0; f < 4; f++) {
    size_t n = encode_inputs(f, v, CAP);
    size_t esz = f < 2 ? 2 : 1;
    for (size_t i = 0; i < n; i++) {
      unsigned want = lp_encode(f, v[i]), got = lib_encode(f, v[i]);
      int ok = lp_isnan_code(f, want) ? lp_isnan_code(f, got) : got == want;
      BT_CHECK(ok, "format %d: %a -> %x, want %x", f, v[i], got, want);
    }
    /* the vector encoders, through acc_store, on misaligned buffers */
    for (int is = 0; is < 3; is++) {
      if (braid__reduce_set_isa(ISAS[is]) != 0) continue;
      unsigned char *ob = o + 1;
      memcpy((unsigned char *)acc + 2, v, n * 4);
      braid__acc_store(ob, (unsigned char *)acc + 2, n, lpd[f], BRAID_SUM, 1);
      for (size_t i = 0; i < n; i++) {
        unsigned want = lp_encode(f, v[i]), got = ldcode(ob + i * esz, esz);
        int ok = lp_isnan_code(f, want) ? lp_isnan_code(f, got) : got == want;
        BT_CHECK(ok, "%s format %d: %a -> %x, want %x", ISAS[is], f, v[i], got, want);
      }
    }
  }
  braid__reduce_set_isa(NULL);
  /* named cases */
  BT_CHECK(braid__f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "f16 tie down to even");
  BT_CHECK(braid__f32_to_f16(1.0f + 0x1p-10f + 0x1p-11f) == 0x3c02, "f16 tie up to even");
  BT_CHECK(braid__f32_to_f16(65504.0f) == 0x7bff && braid__f32_to_f16(65519.0f) == 0x7bff, "f16 largest finite");
  BT_CHECK(braid__f32_to_f16(65520.0f) == 0x7c00 && braid__f32_to_f16(-1e6f) == 0xfc00, "f16 overflow to inf");
  BT_CHECK(braid__f32_to_f16(0x1p-25f) == 0 && braid__f32_to_f16(0x1.000002p-25f) == 1, "f16 smallest subnormal");
  BT_CHECK(braid__f32_to_f16(0x1.8p-24f) == 2 && braid__f32_to_f16(0x1p-14f - 0x1p-25f) == 0x400, "f16 subnormal ties");
  BT_CHECK((braid__f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (braid__f32_to_f16(NAN) & 0x3ff), "f16 NaN");
  BT_CHECK(braid__f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80 && braid__f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f) == 0x3f82,
           "bf16 ties");
  BT_CHECK(braid__f32_to_bf16(FLT_MAX) == 0x7f80, "bf16 overflow to inf");
  BT_CHECK(braid__f32_to_bf16(0x1p-133f) == 0x0001 && braid__f32_to_bf16(0x1p-134f) == 0, "bf16 subnormals");
  uint16_t bn = braid__f32_to_bf16(NAN);
  BT_CHECK((bn & 0x7f80) == 0x7f80 && (bn & 0x7f), "bf16 NaN");
  BT_CHECK(braid__f32_to_e4m3(448.0f) == 0x7e && braid__f32_to_e4m3(464.0f) == 0x7e, "e4m3 448, tie to 448");
  BT_CHECK(braid__f32_to_e4m3(464.5f) == 0x7f && braid__f32_to_e4m3(-500.0f) == 0xff, "e4m3 overflow to NaN");
  BT_CHECK(braid__f32_to_e4m3(INFINITY) == 0x7f && braid__f32_to_e4m3(-INFINITY) == 0xff, "e4m3 inf to NaN");
  BT_CHECK((braid__f32_to_e4m3(NAN) & 0x7f) == 0x7f, "e4m3 NaN");
  BT_CHECK(braid__f32_to_e4m3(0x1p-10f) == 0 && braid__f32_to_e4m3(0x1.8p-9f) == 2 &&
               braid__f32_to_e4m3(0x1.000002p-10f) == 1 && braid__f32_to_e4m3(0x1.ep-7f) == 0x08,
           "e4m3 subnormals");
  BT_CHECK(braid__f32_to_e5m2(57344.0f) == 0x7b && braid__f32_to_e5m2(61440.0f) == 0x7c &&
               braid__f32_to_e5m2(61439.0f) == 0x7b && braid__f32_to_e5m2(-1e9f) == 0xfc,
           "e5m2 largest finite and overflow to inf");
  uint8_t en = braid__f32_to_e5m2(NAN);
  BT_CHECK((en & 0x7c) == 0x7c && (en & 3), "e5m2 NaN");
  BT_CHECK(braid__f32_to_e5m2(0x1p-17f) == 0 && braid__f32_to_e5m2(0x1.8p-16f) == 2 &&
               braid__f32_to_e5m2(0x1.000002p-17f) == 1,
           "e5m2 subnormals");
  free(v);
  free(o);
  free(acc);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Named edge cases, on every kernel set */

static int reduce_n(void *dst, const void *a, const void *b, const void *c, int nsrc, size_t count,
                    braid_dtype dt, braid_op op, int div) {
  const void *s[3] = {a, b, c};
  braid__reduce(dst, s, nsrc, count, dt, op, div);
  return 0;
}

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static uint64_t dbits(double f) { uint64_t u; memcpy(&u, &f, 8); return u; }

static int edge_f32(const char *isa) {
  /* lanes: several cases at once, padded to cross a vector and a tail */
  enum { N = 19 };
  float a[N], b[N], r[N];
  for (int op = BRAID_SUM; op <= BRAID_MAX; op++) {
    for (int sw = 0; sw < 2; sw++) { /* both operand orders */
      float x[N] = {NAN, 1.0f, -0.0f, -0.0f, 0.0f, INFINITY, INFINITY, 0x1p-149f, 0x1p-126f, 3.0f,
                    -INFINITY, 0x1p-100f, 2.0f, NAN, 5.0f, -0.0f, 0.0f, 1.0f, -2.0f};
      float y[N] = {1.0f, NAN, 0.0f, -0.0f, 0.0f, -INFINITY, 1.0f, 0x1p-149f, -0x1p-149f, 3.0f,
                    7.0f, 0x1p-40f, NAN, -NAN, 5.0f, -0.0f, -0.0f, -1.0f, 4.0f};
      memcpy(sw ? b : a, x, sizeof x);
      memcpy(sw ? a : b, y, sizeof y);
      reduce_n(r, a, b, NULL, 2, N, BRAID_F32, (braid_op)op, 1);
      for (int i = 0; i < N; i++) {
        int xn = isnan(x[i]) || isnan(y[i]);
        if (xn) BT_CHECK(isnan(r[i]), "%s f32 op %d lane %d: NaN must propagate", isa, op, i);
      }
      if (op == BRAID_MIN) {
        BT_CHECK(fbits(r[2]) == 0x80000000u && fbits(r[16]) == 0x80000000u, "%s min(-0,+0) = -0", isa);
        BT_CHECK(fbits(r[3]) == 0x80000000u && fbits(r[4]) == 0, "%s min of equal zeros", isa);
        BT_CHECK(r[5] == -INFINITY && r[10] == -INFINITY, "%s min with -inf", isa);
        BT_CHECK(fbits(r[8]) == 0x80000001u, "%s min subnormal", isa);
      } else if (op == BRAID_MAX) {
        BT_CHECK(fbits(r[2]) == 0 && fbits(r[16]) == 0, "%s max(-0,+0) = +0", isa);
        BT_CHECK(fbits(r[3]) == 0x80000000u, "%s max(-0,-0) = -0", isa);
        BT_CHECK(r[5] == INFINITY && r[6] == INFINITY, "%s max with inf", isa);
      } else if (op == BRAID_SUM) {
        BT_CHECK(isnan(r[5]), "%s inf + -inf = NaN", isa);
        BT_CHECK(r[6] == INFINITY, "%s inf + 1 = inf", isa);
        BT_CHECK(fbits(r[3]) == 0x80000000u && fbits(r[2]) == 0 && fbits(r[15]) == 0x80000000u, "%s signed zero sums", isa);
        BT_CHECK(fbits(r[7]) == 2u, "%s subnormal sum not flushed: %08x", isa, fbits(r[7]));
        BT_CHECK(r[8] == 0x1p-126f - 0x1p-149f, "%s subnormal result not flushed", isa);
        BT_CHECK(fbits(r[17]) == 0, "%s 1 + -1 = +0", isa);
      } else {
        BT_CHECK(r[11] == 0x1p-140f && fbits(r[11]) == 0x00000200u, "%s subnormal product not flushed", isa);
        BT_CHECK(fbits(r[2]) == 0x80000000u, "%s -0 * +0 = -0", isa);
        BT_CHECK(r[18] == -8.0f, "%s -2 * 4", isa);
      }
    }
  }
  /* f64 the same way, a few lanes */
  double da[9] = {NAN, -0.0, 0.0, INFINITY, 0x1p-1074, 5.0, 0x1p-1000, -0.0, 1.0};
  double db[9] = {2.0, 0.0, -0.0, -INFINITY, 0x1p-1074, NAN, 0x1p-60, -0.0, 2.0};
  double dr[9];
  reduce_n(dr, da, db, NULL, 2, 9, BRAID_F64, BRAID_MIN, 1);
  BT_CHECK(isnan(dr[0]) && isnan(dr[5]) && dbits(dr[1]) == dbits(-0.0) && dbits(dr[2]) == dbits(-0.0), "%s f64 min", isa);
  reduce_n(dr, da, db, NULL, 2, 9, BRAID_F64, BRAID_MAX, 1);
  BT_CHECK(isnan(dr[0]) && isnan(dr[5]) && dbits(dr[1]) == 0 && dbits(dr[2]) == 0 && dr[3] == INFINITY, "%s f64 max", isa);
  reduce_n(dr, da, db, NULL, 2, 9, BRAID_F64, BRAID_SUM, 1);
  BT_CHECK(isnan(dr[0]) && isnan(dr[3]) && dbits(dr[4]) == 2 && dbits(dr[7]) == dbits(-0.0), "%s f64 sum", isa);
  reduce_n(dr, da, db, NULL, 2, 9, BRAID_F64, BRAID_PROD, 1);
  BT_CHECK(dr[6] == 0x1p-1060 && dr[8] == 2.0, "%s f64 subnormal product", isa);
  /* AVG divides (true division, not a reciprocal multiply) */
  float xs[64], zs[64], avg[64];
  int found = 0;
  for (int i = 0; i < 64; i++) {
    xs[i] = (float)(1.0 + (double)(i + 1) * 0.0137);
    zs[i] = 0.0f;
    if (xs[i] / 3.0f != xs[i] * (1.0f / 3.0f)) found++;
  }
  BT_CHECK(found > 0, "no value tells division from reciprocal");
  reduce_n(avg, xs, zs, NULL, 2, 64, BRAID_F32, BRAID_AVG, 3);
  for (int i = 0; i < 64; i++) BT_CHECK(fbits(avg[i]) == fbits(xs[i] / 3.0f), "%s avg lane %d", isa, i);
  double xd[8], zd[8], ad[8];
  for (int i = 0; i < 8; i++) xd[i] = 1.0 + i * 0.1, zd[i] = 0.0;
  reduce_n(ad, xd, zd, NULL, 2, 8, BRAID_F64, BRAID_AVG, 3);
  for (int i = 0; i < 8; i++) BT_CHECK(dbits(ad[i]) == dbits(xd[i] / 3.0), "%s f64 avg lane %d", isa, i);
  return 0;
}

static int edge_lowprec(const char *isa) {
  /* f16: ties to even, largest finite, overflow, subnormals, single rounding */
  uint16_t a[12] = {0x3c00, 0x3c01, 0x7bff, 0x7bff, 0x7bff, 0x0001, 0x03ff, 0x8000, 0x7e00, 0x7c00, 0x8000, 0x0200};
  uint16_t b[12] = {0x1000, 0x1000, 0x0000, 0x4c00, 0x4800, 0x0001, 0x0001, 0x8000, 0x3c00, 0xfc00, 0x0000, 0x0200};
  uint16_t r[12];
  reduce_n(r, a, b, NULL, 2, 12, BRAID_F16, BRAID_SUM, 1);
  BT_CHECK(r[0] == 0x3c00, "%s f16 1 + 2^-11 ties to 1: %04x", isa, r[0]);
  BT_CHECK(r[1] == 0x3c02, "%s f16 tie rounds up to even: %04x", isa, r[1]);
  BT_CHECK(r[2] == 0x7bff && r[4] == 0x7bff, "%s f16 largest finite", isa);
  BT_CHECK(r[3] == 0x7c00, "%s f16 65504 + 16 overflows to inf: %04x", isa, r[3]);
  BT_CHECK(r[5] == 0x0002 && r[6] == 0x0400, "%s f16 subnormal sums", isa);
  BT_CHECK(r[7] == 0x8000 && r[10] == 0x0000, "%s f16 signed zeros", isa);
  BT_CHECK((r[8] & 0x7c00) == 0x7c00 && (r[8] & 0x3ff), "%s f16 NaN propagates", isa);
  BT_CHECK((r[9] & 0x7c00) == 0x7c00 && (r[9] & 0x3ff), "%s f16 inf + -inf = NaN", isa);
  reduce_n(r, a, b, NULL, 2, 12, BRAID_F16, BRAID_MIN, 1);
  BT_CHECK(r[7] == 0x8000 && r[10] == 0x8000 && (r[8] & 0x3ff) && (r[8] & 0x7c00) == 0x7c00, "%s f16 min", isa);
  reduce_n(r, b, a, NULL, 2, 12, BRAID_F16, BRAID_MAX, 1);
  BT_CHECK(r[10] == 0x0000 && r[9] == 0x7c00 && (r[8] & 0x3ff), "%s f16 max", isa);
  reduce_n(r, a, b, NULL, 2, 12, BRAID_F16, BRAID_PROD, 1);
  BT_CHECK(r[11] == 0x0000, "%s f16 2^-15 * 2^-15 underflows to 0: %04x", isa, r[11]);

  /* single rounding: 1 + 2^-11 + 2^-11 is 1 + 2^-10 exactly; rounding after
     each step would give 1.0 */
  uint16_t one[3] = {0x3c00, 0x3c00, 0x3c00}, tiny[3] = {0x1000, 0x1000, 0x1000};
  reduce_n(r, one, tiny, tiny, 3, 3, BRAID_F16, BRAID_SUM, 1);
  BT_CHECK(r[0] == 0x3c01 && r[2] == 0x3c01, "%s f16 rounded once: %04x", isa, r[0]);
  reduce_n(r, tiny, one, tiny, 3, 3, BRAID_F16, BRAID_SUM, 1);
  BT_CHECK(r[0] == 0x3c01, "%s f16 rounded once (order 2): %04x", isa, r[0]);
  float acc[3];
  braid__acc_load(acc, one, 3, BRAID_F16);
  braid__acc_reduce(acc, tiny, 3, BRAID_F16, BRAID_SUM);
  braid__acc_reduce(acc, tiny, 3, BRAID_F16, BRAID_SUM);
  braid__acc_store(r, acc, 3, BRAID_F16, BRAID_SUM, 1);
  BT_CHECK(r[0] == 0x3c01, "%s f16 acc keeps f32 partials: %04x", isa, r[0]);
  uint16_t bone[3] = {0x3f80, 0x3f80, 0x3f80}, btiny[3] = {0x3b80, 0x3b80, 0x3b80}; /* 1, 2^-8 */
  reduce_n(r, bone, btiny, btiny, 3, 3, BRAID_BF16, BRAID_SUM, 1);
  BT_CHECK(r[0] == 0x3f81, "%s bf16 rounded once: %04x", isa, r[0]);
  reduce_n(r, bone, btiny, NULL, 2, 3, BRAID_BF16, BRAID_SUM, 1);
  BT_CHECK(r[0] == 0x3f80, "%s bf16 tie to even: %04x", isa, r[0]);
  uint16_t bmax[2] = {0x7f7f, 0x0001}, bsub[2] = {0x7f7f, 0x0001};
  reduce_n(r, bmax, bsub, NULL, 2, 2, BRAID_BF16, BRAID_SUM, 1);
  BT_CHECK(r[0] == 0x7f80 && r[1] == 0x0002, "%s bf16 overflow to inf, subnormal sum: %04x %04x", isa, r[0], r[1]);

  /* E4M3: 448 + 32 = 480 -> NaN; 448 + 16 = 464 ties to 448; subnormals */
  uint8_t ea[6] = {0x7e, 0x7e, 0x7e, 0x01, 0x07, 0x81};
  uint8_t eb[6] = {0x60, 0x58, 0x50, 0x01, 0x01, 0x00};
  uint8_t er[6];
  reduce_n(er, ea, eb, NULL, 2, 6, BRAID_FP8_E4M3, BRAID_SUM, 1);
  BT_CHECK(er[0] == 0x7f, "%s e4m3 448 + 32 -> NaN: %02x", isa, er[0]);
  BT_CHECK(er[1] == 0x7e && er[2] == 0x7e, "%s e4m3 rounds back to 448", isa);
  BT_CHECK(er[3] == 0x02 && er[4] == 0x08, "%s e4m3 subnormal sums", isa);
  BT_CHECK(er[5] == 0x81, "%s e4m3 -2^-9 + 0", isa);
  uint8_t en1[2] = {0xfe, 0x7f}, en2[2] = {0xe0, 0x01};
  reduce_n(er, en1, en2, NULL, 2, 2, BRAID_FP8_E4M3, BRAID_SUM, 1);
  BT_CHECK(er[0] == 0xff && (er[1] & 0x7f) == 0x7f, "%s e4m3 negative overflow, NaN input", isa);
  reduce_n(er, en1, en2, NULL, 2, 2, BRAID_FP8_E4M3, BRAID_MAX, 1);
  BT_CHECK(er[0] == 0xe0 && (er[1] & 0x7f) == 0x7f, "%s e4m3 max", isa);
  /* E5M2: 57344 * 2 -> inf; 57344 + 4096 ties to inf; + 2048 stays */
  uint8_t fa[5] = {0x7b, 0x7b, 0x7b, 0x01, 0x03}, fb[5] = {0x7b, 0x6c, 0x68, 0x01, 0x01}, fr[5];
  reduce_n(fr, fa, fb, NULL, 2, 5, BRAID_FP8_E5M2, BRAID_SUM, 1);
  BT_CHECK(fr[0] == 0x7c && fr[1] == 0x7c && fr[2] == 0x7b, "%s e5m2 overflow: %02x %02x %02x", isa, fr[0], fr[1], fr[2]);
  BT_CHECK(fr[3] == 0x02 && fr[4] == 0x04, "%s e5m2 subnormal sums", isa);
  /* single rounding through FP8: 1 + 1/16 + 1/16 = 1.125 exactly (E4M3 step at 1 is 1/8) */
  uint8_t e1[1] = {0x38}, e16[1] = {0x18};
  reduce_n(er, e1, e16, e16, 3, 1, BRAID_FP8_E4M3, BRAID_SUM, 1);
  BT_CHECK(er[0] == 0x39, "%s e4m3 rounded once: %02x", isa, er[0]);
  /* AVG on a low-precision type divides before the single rounding */
  uint16_t h3[1] = {0x4200}, h0[1] = {0x0000}; /* 3 + 0 */
  reduce_n(r, h3, h0, NULL, 2, 1, BRAID_F16, BRAID_AVG, 2);
  BT_CHECK(r[0] == 0x3e00, "%s f16 avg 1.5: %04x", isa, r[0]);
  return 0;
}

#define INT_EDGE(T, DT, MAXV, MINV)                                                        \
  do {                                                                                     \
    T a[5] = {MAXV, MINV, (T)-3, (T)3, (T)-1};                                             \
    T b[5] = {(T)1, (T)-1, (T)0, (T)0, (T)1};                                              \
    T r[5];                                                                                \
    reduce_n(r, a, b, NULL, 2, 5, DT, BRAID_SUM, 1);                                       \
    BT_CHECK(r[0] == MINV && r[1] == MAXV, "%s %s wraps", isa, #T);                        \
    reduce_n(r, a, b, NULL, 2, 5, DT, BRAID_AVG, 2);                                       \
    BT_CHECK(r[2] == (T)-1 && r[3] == (T)1 && r[0] == (T)(MINV / 2), "%s %s avg truncates toward zero", isa, #T); \
    reduce_n(r, a, b, NULL, 2, 5, DT, BRAID_PROD, 1);                                      \
    BT_CHECK(r[1] == MINV && r[4] == (T)-1, "%s %s MIN * -1 wraps to MIN", isa, #T);       \
    reduce_n(r, a, b, NULL, 2, 5, DT, BRAID_MIN, 1);                                       \
    BT_CHECK(r[1] == MINV && r[4] == (T)-1 && r[2] == (T)-3, "%s %s signed min", isa, #T); \
    reduce_n(r, a, b, NULL, 2, 5, DT, BRAID_MAX, 1);                                       \
    BT_CHECK(r[0] == MAXV && r[1] == (T)-1 && r[4] == (T)1, "%s %s signed max", isa, #T);  \
  } while (0)
#define UINT_EDGE(T, DT, MAXV)                                                             \
  do {                                                                                     \
    T a[4] = {MAXV, MAXV, (T)7, (T)1};                                                     \
    T b[4] = {(T)1, MAXV, (T)0, MAXV};                                                     \
    T r[4];                                                                                \
    reduce_n(r, a, b, NULL, 2, 4, DT, BRAID_SUM, 1);                                       \
    BT_CHECK(r[0] == 0 && r[1] == (T)(MAXV - 1), "%s %s wraps", isa, #T);                  \
    reduce_n(r, a, b, NULL, 2, 4, DT, BRAID_PROD, 1);                                      \
    BT_CHECK(r[1] == 1 && r[3] == MAXV, "%s %s product wraps", isa, #T);                   \
    reduce_n(r, a, b, NULL, 2, 4, DT, BRAID_AVG, 2);                                       \
    BT_CHECK(r[0] == 0 && r[2] == 3 && r[1] == (T)(MAXV - 1) / 2, "%s %s avg of the wrapped sum", isa, #T); \
    reduce_n(r, a, b, NULL, 2, 4, DT, BRAID_MIN, 1);                                       \
    BT_CHECK(r[0] == 1 && r[3] == 1, "%s %s unsigned min", isa, #T);                       \
    reduce_n(r, a, b, NULL, 2, 4, DT, BRAID_MAX, 1);                                       \
    BT_CHECK(r[3] == MAXV && r[2] == 7, "%s %s unsigned max", isa, #T);                    \
  } while (0)

static int edge_int(const char *isa) {
  INT_EDGE(int8_t, BRAID_I8, INT8_MAX, INT8_MIN);
  INT_EDGE(int16_t, BRAID_I16, INT16_MAX, INT16_MIN);
  INT_EDGE(int32_t, BRAID_I32, INT32_MAX, INT32_MIN);
  INT_EDGE(int64_t, BRAID_I64, INT64_MAX, INT64_MIN);
  UINT_EDGE(uint8_t, BRAID_U8, UINT8_MAX);
  UINT_EDGE(uint16_t, BRAID_U16, UINT16_MAX);
  UINT_EDGE(uint32_t, BRAID_U32, UINT32_MAX);
  UINT_EDGE(uint64_t, BRAID_U64, UINT64_MAX);
  int8_t p[2] = {16, 100}, q[2] = {16, 100}, pr[2];
  reduce_n(pr, p, q, NULL, 2, 2, BRAID_I8, BRAID_PROD, 1);
  BT_CHECK(pr[0] == 0 && pr[1] == 16, "%s i8 products wrap", isa);
  reduce_n(pr, p, q, NULL, 2, 2, BRAID_I8, BRAID_AVG, 2);
  BT_CHECK(pr[1] == -28, "%s i8 (100 + 100) wraps to -56, / 2 = -28: %d", isa, pr[1]);
  int64_t big[1] = {INT64_MIN}, m1[1] = {-1}, br[1];
  reduce_n(br, big, m1, NULL, 2, 1, BRAID_I64, BRAID_PROD, 1);
  BT_CHECK(br[0] == INT64_MIN, "%s INT64_MIN * -1", isa);
  /* bitwise */
  uint16_t x[3] = {0xf0f0, 0x1234, 0xffff}, y[3] = {0x0ff0, 0x00ff, 0x0000}, z[3];
  reduce_n(z, x, y, NULL, 2, 3, BRAID_U16, BRAID_BAND, 1);
  BT_CHECK(z[0] == 0x00f0 && z[1] == 0x0034 && z[2] == 0, "%s band", isa);
  reduce_n(z, x, y, NULL, 2, 3, BRAID_U16, BRAID_BOR, 1);
  BT_CHECK(z[0] == 0xfff0 && z[1] == 0x12ff && z[2] == 0xffff, "%s bor", isa);
  reduce_n(z, x, y, NULL, 2, 3, BRAID_U16, BRAID_BXOR, 1);
  BT_CHECK(z[0] == 0xff00 && z[1] == 0x12cb && z[2] == 0xffff, "%s bxor", isa);
  return 0;
}

static int edge_bool(const char *isa) {
  uint8_t a[4] = {2, 0, 0x80, 0}, b[4] = {1, 7, 0xff, 0}, r[4];
  static const int ops[] = {BRAID_SUM, BRAID_MAX, BRAID_BOR, BRAID_PROD, BRAID_MIN, BRAID_BAND, BRAID_BXOR};
  static const uint8_t want[7][4] = {{1, 1, 1, 0}, {1, 1, 1, 0}, {1, 1, 1, 0}, {1, 0, 1, 0},
                                     {1, 0, 1, 0}, {1, 0, 1, 0}, {0, 1, 0, 0}};
  for (int i = 0; i < 7; i++) {
    reduce_n(r, a, b, NULL, 2, 4, BRAID_BOOL, (braid_op)ops[i], 1);
    BT_CHECK(memcmp(r, want[i], 4) == 0, "%s bool op %d: %d %d %d %d", isa, ops[i], r[0], r[1], r[2], r[3]);
  }
  reduce_n(r, a, NULL, NULL, 1, 4, BRAID_BOOL, BRAID_SUM, 1);
  BT_CHECK(r[0] == 1 && r[1] == 0 && r[2] == 1 && r[3] == 0, "%s bool copy normalizes", isa);
  return 0;
}

static int edge_complex(const char *isa) {
  float a[4] = {1, 2, 0.5f, -1}, b[4] = {3, 4, 2, 2}, r[4];
  reduce_n(r, a, b, NULL, 2, 2, BRAID_C64, BRAID_PROD, 1);
  BT_CHECK(r[0] == -5 && r[1] == 10 && r[2] == 3 && r[3] == -1, "%s c64 prod", isa);
  reduce_n(r, a, b, NULL, 2, 2, BRAID_C64, BRAID_AVG, 2);
  BT_CHECK(r[0] == 2 && r[1] == 3 && r[2] == 1.25f && r[3] == 0.5f, "%s c64 avg", isa);
  /* (1+e)(1-e) rounds to 1 in f32, so re = 1*1 rounded - 1*1 = +0; a fused
     multiply-add would keep the exact product and give -e^2 */
  float e = 0x1p-13f;
  float x[2] = {1 + e, 1}, y[2] = {1 - e, 1}, z[2];
  reduce_n(z, x, y, NULL, 2, 1, BRAID_C64, BRAID_PROD, 1);
  BT_CHECK(fbits(z[0]) == 0 && z[1] == 2.0f, "%s c64 product not fused: %a %a", isa, z[0], z[1]);
  double de = 0x1p-30;
  double dx[2] = {1 + de, 1}, dy[2] = {1 - de, 1}, dz[2];
  reduce_n(dz, dx, dy, NULL, 2, 1, BRAID_C128, BRAID_PROD, 1);
  BT_CHECK(dbits(dz[0]) == 0 && dz[1] == 2.0, "%s c128 product not fused: %a %a", isa, dz[0], dz[1]);
  double ca[4] = {1, 2, 0.5, -1}, cb[4] = {3, 4, 2, 2}, cr[4];
  reduce_n(cr, ca, cb, NULL, 2, 2, BRAID_C128, BRAID_PROD, 1);
  BT_CHECK(cr[0] == -5 && cr[1] == 10 && cr[2] == 3 && cr[3] == -1, "%s c128 prod", isa);
  return 0;
}

static int test_edge_cases(void) {
  for (int is = 0; is < 3; is++) {
    if (braid__reduce_set_isa(ISAS[is]) != 0) continue;
    if (edge_f32(ISAS[is]) || edge_lowprec(ISAS[is]) || edge_int(ISAS[is]) || edge_bool(ISAS[is]) ||
        edge_complex(ISAS[is]))
      return 1;
  }
  braid__reduce_set_isa(NULL);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Accumulator API, reduce2, avg_finalize */

static int test_acc_chain(void) {
  enum { N = 777 };
  for (int is = 0; is < 3; is++) {
    if (braid__reduce_set_isa(ISAS[is]) != 0) continue;
    for (size_t di = 0; di < NDT; di++) {
      const dtinfo *d = &DTS[di];
      size_t asz = braid__acc_size(d->dt);
      BT_CHECK(asz == (d->kind == K_LP ? 4 : d->esz), "acc size of %s", d->name);
      unsigned char *s[3], *want = malloc(N * d->esz), *got = malloc(N * d->esz + 1), *got2 = malloc(N * d->esz);
      unsigned char *acc = malloc(N * asz + 3), *acc2 = malloc(N * asz);
      BT_CHECK(want && got && got2 && acc && acc2, "malloc");
      for (int k = 0; k < 3; k++) {
        s[k] = malloc(N * d->esz);
        BT_CHECK(s[k], "malloc");
        fill_rand(d, s[k], N, k == 2);
      }
      const void *cs[3] = {s[0], s[1], s[2]};
      for (int op = 0; op < 8; op++) {
        if (braid__check_dtype_op(d->dt, (braid_op)op) != BRAID_OK) continue;
        braid__reduce(want, cs, 3, N, d->dt, (braid_op)op, 3);
        unsigned char *a = acc + 3; /* misaligned accumulator */
        braid__acc_load(a, s[0], N, d->dt);
        braid__acc_reduce(a, s[1], N, d->dt, (braid_op)op);
        braid__acc_reduce(a, s[2], N, d->dt, (braid_op)op);
        braid__acc_store(got + 1, a, N, d->dt, (braid_op)op, 3);
        /* the same through combine: (s0 op s1) op (s2) */
        braid__acc_load(a, s[0], N, d->dt);
        braid__acc_reduce(a, s[1], N, d->dt, (braid_op)op);
        braid__acc_load(acc2, s[2], N, d->dt);
        braid__acc_combine(a, acc2, N, d->dt, (braid_op)op);
        braid__acc_store(got2, a, N, d->dt, (braid_op)op, 3);
        for (size_t i = 0; i < N; i++) {
          BT_CHECK(same_elem(d, want + i * d->esz, got + 1 + i * d->esz), "%s %s %s acc chain element %zu", ISAS[is],
                   d->name, OPNAMES[op], i);
          BT_CHECK(same_elem(d, want + i * d->esz, got2 + i * d->esz), "%s %s %s acc combine element %zu",
                   ISAS[is], d->name, OPNAMES[op], i);
        }
        /* reduce2: AVG is SUM */
        braid__reduce2(got, s[0], s[1], N, d->dt, (braid_op)op);
        braid__reduce(want, cs, 2, N, d->dt, op == BRAID_AVG ? BRAID_SUM : (braid_op)op, 1);
        for (size_t i = 0; i < N; i++)
          BT_CHECK(same_elem(d, want + i * d->esz, got + i * d->esz), "%s %s %s reduce2 element %zu", ISAS[is],
                   d->name, OPNAMES[op], i);
        /* avg_finalize after a SUM: exact for full-precision types (the same
           sum and division), a second rounding for the narrow ones */
        if (op == BRAID_AVG) {
          braid__reduce(got, cs, 3, N, d->dt, BRAID_SUM, 1);
          braid__reduce_avg_finalize(got, N, d->dt, 3);
          if (d->kind == K_LP) {
            braid__reduce(want, cs, 3, N, d->dt, BRAID_SUM, 1);
            for (size_t i = 0; i < N; i++) {
              unsigned c = ldcode(want + i * d->esz, d->esz);
              c = lp_encode(d->lp, (float)(lp_decode(d->lp, c) / 3.0));
              memcpy(want + i * d->esz, &c, d->esz);
            }
          } else {
            braid__reduce(want, cs, 3, N, d->dt, BRAID_AVG, 3);
          }
          for (size_t i = 0; i < N; i++)
            BT_CHECK(same_elem(d, want + i * d->esz, got + i * d->esz), "%s %s avg_finalize element %zu", ISAS[is],
                     d->name, i);
        }
      }
      for (int k = 0; k < 3; k++) free(s[k]);
      free(want);
      free(got);
      free(got2);
      free(acc);
      free(acc2);
    }
  }
  braid__reduce_set_isa(NULL);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Cross-ISA: random bit patterns, every pair, the vector sets against scalar */

/* The streaming copy equals memcpy for every head/tail alignment and length,
   and writes nothing outside the destination. */
static int test_copy_stream(void) {
  enum { CAP = 3000 };
  unsigned char *src = malloc(CAP + 64), *dst = malloc(CAP + 128), *ref = malloc(CAP + 128);
  BT_CHECK(src && dst && ref, "oom");
  for (size_t i = 0; i < CAP + 64; i++) src[i] = (unsigned char)(i * 131 + 7);
  static const size_t lens[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 2047, 2999};
  for (size_t so = 0; so < 32; so++)
    for (size_t d = 0; d < 32; d++)
      for (size_t k = 0; k < BT_COUNT(lens); k++) {
        size_t n = lens[k];
        memset(dst, 0xa5, CAP + 128);
        memset(ref, 0xa5, CAP + 128);
        braid__copy_stream(dst + 32 + d, src + so, n);
        memcpy(ref + 32 + d, src + so, n);
        BT_CHECK(!memcmp(dst, ref, CAP + 128), "copy of %zu bytes, source offset %zu, destination offset %zu", n,
                 so, d);
      }
  free(src);
  free(dst);
  free(ref);
  return 0;
}

static int test_cross_isa_bits(void) {
  enum { N = 2053 };
  int have[3] = {1, braid__reduce_set_isa("avx2") == 0, braid__reduce_set_isa("avx512") == 0};
  if (!have[1] && !have[2]) {
    printf("    no vector kernel set on this machine\n");
    braid__reduce_set_isa(NULL);
    return 0;
  }
  for (size_t di = 0; di < NDT; di++) {
    const dtinfo *d = &DTS[di];
    unsigned char *s[4], *ref = malloc(N * d->esz), *got = malloc(N * d->esz);
    BT_CHECK(ref && got, "malloc");
    for (int k = 0; k < 4; k++) {
      s[k] = malloc(N * d->esz);
      BT_CHECK(s[k], "malloc");
      fill_rand(d, s[k], N, 1);
    }
    const void *cs[4] = {s[0], s[1], s[2], s[3]};
    for (int op = 0; op < 8; op++) {
      if (braid__check_dtype_op(d->dt, (braid_op)op) != BRAID_OK) continue;
      for (int nsrc = 2; nsrc <= 4; nsrc += 2) {
        braid__reduce_set_isa("scalar");
        braid__reduce(ref, cs, nsrc, N, d->dt, (braid_op)op, nsrc);
        for (int is = 1; is < 3; is++) {
          if (!have[is]) continue;
          braid__reduce_set_isa(ISAS[is]);
          memset(got, 0, N * d->esz);
          braid__reduce(got, cs, nsrc, N, d->dt, (braid_op)op, nsrc);
          for (size_t i = 0; i < N; i++)
            BT_CHECK(same_elem(d, ref + i * d->esz, got + i * d->esz), "%s vs scalar: %s %s nsrc=%d element %zu",
                     ISAS[is], d->name, OPNAMES[op], nsrc, i);
        }
      }
    }
    for (int k = 0; k < 4; k++) free(s[k]);
    free(ref);
    free(got);
  }
  braid__reduce_set_isa(NULL);
  return 0;
}

static const bt_case cases[] = {
    BT_CASE(test_check_dtype_op),
    BT_CASE(test_isa_selection),
    BT_CASE(test_decode_exhaustive),
    BT_CASE(test_encode_rounding),
    BT_CASE(test_edge_cases),
    BT_CASE(test_sweep_f32_f64),
    BT_CASE(test_sweep_lowprec),
    BT_CASE(test_sweep_int),
    BT_CASE(test_sweep_bool_complex),
    BT_CASE(test_many_sources_raw_bits),
    BT_CASE(test_nontemporal),
    BT_CASE(test_acc_chain),
    BT_CASE(test_cross_isa_bits),
    BT_CASE(test_copy_stream),
};

int main(int argc, char **argv) { return bt_main(argc, argv, cases, BT_COUNT(cases)); }
