/* Collective checks shared by the backend tests (see coll_check.h). */
#include "coll_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static const char *coll_names[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter"};

const braid_dtype bt_all_dtypes[BT_NDTYPES] = {BRAID_F64, BRAID_F32, BRAID_F16, BRAID_BF16, BRAID_FP8_E4M3, BRAID_FP8_E5M2,
                                         BRAID_I64, BRAID_I32, BRAID_I16,  BRAID_I8,   BRAID_U64,      BRAID_U32,
                                         BRAID_U16, BRAID_U8,  BRAID_BOOL, BRAID_C64,  BRAID_C128};

static int is_float(braid_dtype d) { return d <= BRAID_FP8_E5M2; }
static int is_complex(braid_dtype d) { return d == BRAID_C64 || d == BRAID_C128; }
static int is_signed(braid_dtype d) { return d >= BRAID_I64 && d <= BRAID_I8; }
static int is_int(braid_dtype d) { return d >= BRAID_I64 && d <= BRAID_U8; }

int bt_op_ok(braid_dtype d, braid_op op) {
  if (is_complex(d)) return op == BRAID_SUM || op == BRAID_PROD || op == BRAID_AVG;
  if (is_float(d)) return op <= BRAID_AVG;
  if (d == BRAID_BOOL) return op != BRAID_AVG;
  return 1;
}

/* Exact small values in a binary float format (normal numbers only). */
static uint32_t enc_small(double x, int ebits, int mbits) {
  if (x == 0) return 0;
  uint32_t sign = x < 0;
  x = fabs(x);
  int e;
  double m = frexp(x, &e); /* x = m * 2^e, m in [0.5, 1) */
  int bias = (1 << (ebits - 1)) - 1;
  uint32_t be = (uint32_t)(e - 1 + bias);
  uint32_t mant = (uint32_t)((m * 2 - 1) * (double)(1u << mbits));
  return sign << (ebits + mbits) | be << mbits | mant;
}

static void encode(braid_dtype d, void *out, double re, double im, uint64_t bits, int use_bits) {
  switch (d) {
  case BRAID_F64: { double v = re; memcpy(out, &v, 8); break; }
  case BRAID_F32: { float v = (float)re; memcpy(out, &v, 4); break; }
  case BRAID_F16: { uint16_t v = (uint16_t)enc_small(re, 5, 10); memcpy(out, &v, 2); break; }
  case BRAID_BF16: { uint16_t v = (uint16_t)enc_small(re, 8, 7); memcpy(out, &v, 2); break; }
  case BRAID_FP8_E4M3: { uint8_t v = (uint8_t)enc_small(re, 4, 3); memcpy(out, &v, 1); break; }
  case BRAID_FP8_E5M2: { uint8_t v = (uint8_t)enc_small(re, 5, 2); memcpy(out, &v, 1); break; }
  case BRAID_C64: { float v[2] = {(float)re, (float)im}; memcpy(out, v, 8); break; }
  case BRAID_C128: { double v[2] = {re, im}; memcpy(out, v, 16); break; }
  default: {
    uint64_t v = use_bits ? bits : (uint64_t)(int64_t)re;
    memcpy(out, &v, braid_dtype_size(d)); /* little endian: the low bytes */
    break;
  }
  }
}

static uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

typedef struct val {
  double re, im;
  uint64_t bits;
} val;

/* Input element i of rank r for (dtype, op): small integers so every order of
   reduction is exact. */
static val input(braid_dtype d, braid_op op, int r, size_t i) {
  val v = {0, 0, 0};
  int fp8 = d == BRAID_FP8_E4M3 || d == BRAID_FP8_E5M2;
  switch (op) {
  case BRAID_AVG: v.re = (double)((i * 7 + 3) % 4); v.im = (double)(i % 3); break;
  case BRAID_SUM:
    if (d == BRAID_BOOL) v.re = (double)(((size_t)r + i) % 3);
    else v.re = fp8 ? (double)(((size_t)r + i) % 2) : (double)(((size_t)r + 2 * i) % 4);
    v.im = (double)(((size_t)r + i) % 3);
    break;
  case BRAID_PROD:
    if (d == BRAID_BOOL) v.re = (double)(((size_t)r * 2 + i) % 3);
    else if (is_complex(d)) { v.re = 1; v.im = (double)(((size_t)r + i) % 2); }
    else v.re = (double)(1 + ((size_t)r + i) % 2);
    break;
  case BRAID_MIN:
  case BRAID_MAX:
    if (d == BRAID_BOOL) v.re = (double)(((size_t)r + i) % 3);
    else v.re = (double)(((size_t)r * 5 + i * 3) % 7) - ((is_signed(d) || is_float(d)) ? 3.0 : 0.0);
    break;
  default:
    if (d == BRAID_BOOL) v.re = (double)(((size_t)r + i) % 2);
    else v.bits = mix((uint64_t)r * 1000003u + i);
    break;
  }
  if (d == BRAID_BOOL) v.bits = (uint64_t)v.re;
  return v;
}

void bt_put_input(braid_dtype d, braid_op op, int r, size_t i, void *out) {
  val v = input(d, op, r, i);
  encode(d, out, v.re, v.im, v.bits, d == BRAID_BOOL || (is_int(d) && op >= BRAID_BAND));
}

void bt_put_expected(braid_dtype d, braid_op op, int n, size_t i, void *out) {
  val acc = input(d, op, 0, i);
  for (int r = 1; r < n; r++) {
    val v = input(d, op, r, i);
    switch (op) {
    case BRAID_SUM: acc.re += v.re; acc.im += v.im; break;
    case BRAID_AVG: break; /* identical inputs: the average is the input */
    case BRAID_PROD:
      if (is_complex(d)) {
        double re = acc.re * v.re - acc.im * v.im, im = acc.re * v.im + acc.im * v.re;
        acc.re = re;
        acc.im = im;
      } else {
        acc.re *= v.re;
      }
      break;
    case BRAID_MIN: acc.re = fmin(acc.re, v.re); break;
    case BRAID_MAX: acc.re = fmax(acc.re, v.re); break;
    case BRAID_BAND: acc.bits &= v.bits; break;
    case BRAID_BOR: acc.bits |= v.bits; break;
    default: acc.bits ^= v.bits; break;
    }
  }
  if (d == BRAID_BOOL) {
    int t;
    if (op == BRAID_SUM || op == BRAID_MAX || op == BRAID_BOR || op == BRAID_AVG) {
      t = 0;
      for (int r = 0; r < n; r++) t |= input(d, op, r, i).re != 0;
    } else if (op == BRAID_PROD || op == BRAID_MIN || op == BRAID_BAND) {
      t = 1;
      for (int r = 0; r < n; r++) t &= input(d, op, r, i).re != 0;
    } else {
      t = 0;
      for (int r = 0; r < n; r++) t ^= input(d, op, r, i).re != 0;
    }
    uint8_t b = (uint8_t)t;
    memcpy(out, &b, 1);
    return;
  }
  encode(d, out, acc.re, acc.im, acc.bits, is_int(d) && op >= BRAID_BAND);
}

uint64_t bt_fnv(const void *p, size_t len) {
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* ---------------------------------------------------------------- collectives */

void *bt_buf_alloc(int braid_mem, size_t bytes) {
  void *p = NULL;
  if (!braid_mem) return malloc(bytes);
  return braid_mem_alloc(&p, bytes) == BRAID_OK ? p : NULL;
}

void bt_buf_free(int braid_mem, void *p) {
  if (braid_mem) braid_mem_free(p);
  else free(p);
}

#define GUARD 64

/* One collective with checks of results, guards, send buffers and bitwise identity. */
int bt_coll_one(braid_comm *c, int rank, int n, const ccase *k) {
  size_t es = braid_dtype_size(k->dt), cnt = k->count;
  size_t in_elems = k->coll == C_RS ? cnt * (size_t)n : cnt;
  size_t out_elems = k->coll == C_AG ? cnt * (size_t)n : cnt;
  size_t big = (in_elems > out_elems ? in_elems : out_elems) * es;
  int bm = k->mem == 1 || (k->mem == 2 && rank % 2 == 0);
  unsigned char *sraw = bt_buf_alloc(bm, big + 2 * GUARD + 8), *rraw = bt_buf_alloc(bm, big + 2 * GUARD + 8);
  unsigned char *want = malloc(out_elems * es + 1), *copy = malloc(in_elems * es + 1);
  BT_CHECK(sraw && rraw && want && copy, "out of memory");
  unsigned char *sbuf = sraw + GUARD + k->mis, *rbuf = rraw + GUARD + k->mis;
  memset(sraw, 0xA5, big + 2 * GUARD + 8);
  memset(rraw, 0x5A, big + 2 * GUARD + 8);
  int root = (int)(k->count % (size_t)n);
  const char *name = coll_names[k->coll];
  braid_status st = BRAID_OK;
  void *send = sbuf, *recv = rbuf;
  size_t out_off = 0; /* where the output starts inside recv (in place) */
  switch (k->coll) {
  case C_AR:
  case C_BC:
    for (size_t i = 0; i < cnt; i++) {
      if (k->coll == C_AR) bt_put_input(k->dt, k->op, rank, i, rbuf + i * es);
      else if (rank == root) bt_put_input(k->dt, BRAID_SUM, 7, i, rbuf + i * es);
    }
    for (size_t i = 0; i < cnt; i++) {
      if (k->coll == C_AR) bt_put_expected(k->dt, k->op, n, i, want + i * es);
      else bt_put_input(k->dt, BRAID_SUM, 7, i, want + i * es);
    }
    st = k->coll == C_AR ? braid_all_reduce(c, rbuf, cnt, k->dt, k->op) : braid_broadcast(c, rbuf, cnt, k->dt, root);
    break;
  case C_AG:
    if (k->inplace) send = rbuf + (size_t)rank * cnt * es;
    for (size_t i = 0; i < cnt; i++) bt_put_input(k->dt, BRAID_SUM, rank, i, (unsigned char *)send + i * es);
    memcpy(copy, send, cnt * es);
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < cnt; i++) bt_put_input(k->dt, BRAID_SUM, q, i, want + ((size_t)q * cnt + i) * es);
    st = braid_all_gather(c, send, rbuf, cnt, k->dt);
    break;
  case C_RS:
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < cnt; i++)
        bt_put_input(k->dt, k->op, rank, (size_t)q * cnt + i, sbuf + ((size_t)q * cnt + i) * es);
    memcpy(copy, sbuf, in_elems * es);
    for (size_t i = 0; i < cnt; i++) bt_put_expected(k->dt, k->op, n, (size_t)rank * cnt + i, want + i * es);
    if (k->inplace) {
      recv = sbuf + (size_t)rank * cnt * es;
      out_off = 0;
    }
    st = braid_reduce_scatter(c, sbuf, recv, cnt, k->dt, k->op);
    break;
  }
  BT_CHECK(st == BRAID_OK, "%s %s %s count %zu: %s: %s", name, braid_dtype_name(k->dt), braid_op_name(k->op), cnt,
           braid_status_string(st), braid_last_error(c));
  BT_CHECK_OK(braid_sync(c), c);
  unsigned char *out = (unsigned char *)recv + out_off;
  for (size_t i = 0; i < out_elems; i++)
    if (memcmp(out + i * es, want + i * es, es)) {
      unsigned long long g = 0, w = 0;
      memcpy(&g, out + i * es, es < 8 ? es : 8);
      memcpy(&w, want + i * es, es < 8 ? es : 8);
      BT_CHECK(0, "%s %s %s count %zu n %d inplace %d: element %zu is 0x%llx, expected 0x%llx", name,
               braid_dtype_name(k->dt), braid_op_name(k->op), cnt, n, k->inplace, i, g, w);
    }
  /* Guards around the output and untouched out-of-place inputs. */
  if (!(k->coll == C_RS && k->inplace)) {
    unsigned char *base = rraw, *o = rbuf;
    size_t olen = out_elems * es;
    for (unsigned char *p = base; p < o; p++) BT_CHECK(*p == 0x5A, "%s: byte before the output written", name);
    for (unsigned char *p = o + olen; p < rraw + big + 2 * GUARD + 8; p++)
      BT_CHECK(*p == 0x5A, "%s: byte after the output written (%td past the end)", name, p - (o + olen));
  }
  if (k->coll == C_RS && !k->inplace) BT_CHECK(!memcmp(sbuf, copy, in_elems * es), "reduce_scatter wrote its send buffer");
  if (k->coll == C_AG && !k->inplace) BT_CHECK(!memcmp(sbuf, copy, cnt * es), "all_gather wrote its send buffer");
  /* Every rank holds the same bits. */
  if ((k->coll == C_AR || k->coll == C_BC) && n > 1) {
    uint64_t h = bt_fnv(out, out_elems * es), *hs = malloc(sizeof *hs * (size_t)n);
    BT_CHECK(hs != NULL, "out of memory");
    BT_CHECK_OK(braid_all_gather(c, &h, hs, 1, BRAID_U64), c);
    for (int q = 0; q < n; q++) BT_CHECK(hs[q] == h, "%s: rank %d's result differs from rank %d's", name, q, rank);
    free(hs);
  }
  bt_buf_free(bm, sraw);
  bt_buf_free(bm, rraw);
  free(want);
  free(copy);
  return 0;
}

int bt_coll_matrix_body(braid_comm *c, int rank, int n, void *arg) {
  const matrix *m = arg;
  /* Large counts: a few (dtype, op) pairs that cover wide, narrow (f32
     accumulation) and integer kernels. */
  static const struct {
    braid_dtype d;
    braid_op op;
  } few[] = {{BRAID_F32, BRAID_SUM}, {BRAID_BF16, BRAID_AVG}, {BRAID_I32, BRAID_BXOR}, {BRAID_U8, BRAID_MAX}};
  for (int ci = 0; ci < m->ncounts; ci++) {
    if (m->full) {
      for (int di = 0; di < (int)BT_COUNT(bt_all_dtypes); di++)
        for (int op = BRAID_SUM; op <= BRAID_BXOR; op++) {
          braid_dtype d = bt_all_dtypes[di];
          if (!bt_op_ok(d, (braid_op)op)) continue;
          for (int coll = C_AR; coll <= C_RS; coll++) {
            if ((coll == C_BC || coll == C_AG) && op != BRAID_SUM) continue;
            for (int ip = 0; ip < 2; ip++) {
              if (ip && coll == C_BC) continue;
              ccase k = {coll, d, (braid_op)op, m->counts[ci], ip, (ci + di + op) % 8, m->mem, 0, 0};
              if (bt_coll_one(c, rank, n, &k)) return 1;
            }
          }
        }
      continue;
    }
    for (int fi = 0; fi < (int)BT_COUNT(few); fi++)
      for (int coll = C_AR; coll <= C_RS; coll++) {
        if ((coll == C_BC || coll == C_AG) && fi > 1) continue;
        ccase k = {coll, few[fi].d, coll == C_BC || coll == C_AG ? BRAID_SUM : few[fi].op, m->counts[ci],
                   (fi + coll) % 2, (fi * 3 + coll) % 8, m->mem, 0, 0};
        if (bt_coll_one(c, rank, n, &k)) return 1;
      }
  }
  return 0;
}


/* ---------------------------------------------------------------- the collectives beyond the first four */

void bt_premul_scalar(braid_dtype d, void *out) {
  if (is_complex(d)) encode(d, out, 0, 1, 0, 0);
  else if (is_float(d)) encode(d, out, 0.5, 0, 0, 0);
  else encode(d, out, 3, 0, 0, 0);
}

void bt_put_premul_expected(braid_dtype d, int n, size_t i, void *out) {
  double re = 0, im = 0;
  for (int r = 0; r < n; r++) {
    val v = input(d, BRAID_SUM, r, i);
    re += v.re, im += v.im;
  }
  if (is_complex(d)) encode(d, out, 0.0 - im, re, 0, 0); /* times i, a zero real part +0 */
  else if (is_float(d)) encode(d, out, re * 0.5, 0, 0, 0);
  else encode(d, out, re * 3, 0, 0, 0); /* integers wrap in the low bytes */
}

size_t bt_a2av_count(int p, int i, int j, int n, size_t count) {
  (void)n;
  switch (p) {
  case 0: { /* symmetric, so in place works too */
    uint64_t h = mix((uint64_t)(i < j ? i : j) * 1009u + (uint64_t)(i < j ? j : i));
    return h % 4 == 0 ? 0 : 1 + (size_t)(h % (count + 1));
  }
  case 1: return j == 0 ? count + (size_t)i : 0;
  case 2: return i == j ? count : 0;
  case 3: return count;
  default: return 0;
  }
}

/* A buffer with guard bytes on both sides. */
typedef struct gbuf {
  unsigned char *raw, *p;
  size_t len; /* bytes of p */
  int bm;
  unsigned char fill;
} gbuf;

static int gb_alloc(gbuf *g, int bm, size_t len, int mis, unsigned char fill) {
  g->bm = bm;
  g->len = len;
  g->fill = fill;
  g->raw = bt_buf_alloc(bm, len + 2 * GUARD + 8);
  if (!g->raw) return 1;
  memset(g->raw, fill, len + 2 * GUARD + 8);
  g->p = g->raw + GUARD + mis;
  return 0;
}

static void gb_free(gbuf *g) {
  if (g->raw) bt_buf_free(g->bm, g->raw);
  g->raw = g->p = NULL;
}

/* Bytes of g outside [p, p + len) that changed, as an offset from p (0: none). */
static long gb_guard_hit(const gbuf *g) {
  size_t total = g->len + 2 * GUARD + 8;
  for (unsigned char *q = g->raw; q < g->raw + total; q++) {
    if (q >= g->p && q < g->p + g->len) continue;
    if (*q != g->fill) return q < g->p ? -(long)(g->p - q) : (long)(q - g->p) + 1;
  }
  return 0;
}

/* All-to-allv layout of rank r for pattern p: recv blocks in rank order,
   send blocks in reverse rank order, one element of gap before each. */
static void a2av_layout(int p, int r, int n, size_t count, size_t *sc, size_t *sd, size_t *rc, size_t *rd,
                        size_t *slen, size_t *rlen) {
  size_t so = 1, ro = 1;
  for (int q = 0; q < n; q++) {
    int qs = n - 1 - q;
    sc[qs] = bt_a2av_count(p, r, qs, n, count);
    sd[qs] = so;
    so += sc[qs] + 1;
    rc[q] = bt_a2av_count(p, q, r, n, count);
    rd[q] = ro;
    ro += rc[q] + 1;
  }
  *slen = so, *rlen = ro;
}

static const char *more_names[] = {"reduce", "gather", "scatter", "all_to_all", "all_to_allv", "all_reduce premul",
                                   "reduce_scatter premul", "reduce premul"};

int bt_coll_more_one(braid_comm *c, int rank, int n, const ccase *k) {
  const size_t es = braid_dtype_size(k->dt), cnt = k->count;
  const int root = k->root, isroot = rank == root, ip = k->inplace;
  const int bm = k->mem == 1 || (k->mem == 2 && rank % 2 == 0);
  const char *name = more_names[k->coll - C_RD];
  size_t sl = 0, rl = 0; /* elements of the send and receive buffers */
  size_t *sc = NULL, *sd = NULL, *rc = NULL, *rd = NULL;
  switch (k->coll) {
  case C_RD: case C_RDP: sl = cnt, rl = isroot ? cnt : 0; break;
  case C_ARP: rl = cnt; break;
  case C_RSP: sl = cnt * (size_t)n, rl = cnt; break;
  case C_GA: sl = cnt, rl = isroot ? cnt * (size_t)n : 0; break;
  case C_SC: sl = isroot ? cnt * (size_t)n : 0, rl = cnt; break;
  case C_A2A: sl = rl = cnt * (size_t)n; break;
  default:
    sc = calloc(4 * (size_t)n, sizeof *sc);
    BT_CHECK(sc != NULL, "out of memory");
    sd = sc + n, rc = sd + n, rd = rc + n;
    a2av_layout(k->pattern, rank, n, cnt, sc, sd, rc, rd, &sl, &rl);
    break;
  }
  /* In place the input lives in the receive buffer (gather, all-to-all(v),
     reduce at the root) or the output in the send buffer (scatter at the
     root, reduce-scatter): one buffer then. */
  int one_recv = ip && ((k->coll == C_RD || k->coll == C_RDP) ? isroot : k->coll == C_GA ? isroot
                        : k->coll == C_A2A || k->coll == C_A2AV);
  int one_send = ip && ((k->coll == C_SC && isroot) || k->coll == C_RSP);
  gbuf S = {0}, R = {0};
  size_t outl = k->coll == C_SC && one_send ? sl : rl; /* elements of the result checked */
  unsigned char *want = malloc(outl * es + 1), *copy = malloc(sl * es + 1);
  BT_CHECK(want && copy, "out of memory");
  if (sl && !one_recv && !one_send) BT_CHECK(!gb_alloc(&S, bm, sl * es, k->mis, 0xA5), "out of memory");
  if (one_send) BT_CHECK(!gb_alloc(&R, bm, sl * es, k->mis, 0xA5), "out of memory");
  else if (rl) BT_CHECK(!gb_alloc(&R, bm, rl * es, k->mis, 0x5A), "out of memory");
  const void *send = S.p;
  void *recv = R.p, *out = R.p; /* out: where the result is checked */
  unsigned char *in = one_recv || one_send ? R.p : S.p;
  /* Inputs and expected results. */
  switch (k->coll) {
  case C_RD: case C_RDP:
    for (size_t i = 0; i < cnt; i++)
      bt_put_input(k->dt, k->coll == C_RD ? k->op : BRAID_SUM, rank, i, in + i * es);
    for (size_t i = 0; i < rl; i++) {
      if (k->coll == C_RD) bt_put_expected(k->dt, k->op, n, i, want + i * es);
      else bt_put_premul_expected(k->dt, n, i, want + i * es);
    }
    send = in;
    break;
  case C_ARP:
    for (size_t i = 0; i < cnt; i++) {
      bt_put_input(k->dt, BRAID_SUM, rank, i, R.p + i * es);
      bt_put_premul_expected(k->dt, n, i, want + i * es);
    }
    break;
  case C_RSP:
    for (size_t i = 0; i < sl; i++) bt_put_input(k->dt, BRAID_SUM, rank, i, in + i * es);
    for (size_t i = 0; i < cnt; i++) bt_put_premul_expected(k->dt, n, (size_t)rank * cnt + i, want + i * es);
    send = in;
    if (one_send) recv = out = R.p + (size_t)rank * cnt * es;
    break;
  case C_GA:
    if (one_recv) send = R.p + (size_t)root * cnt * es;
    for (size_t i = 0; i < cnt; i++) bt_put_input(k->dt, BRAID_SUM, rank, i, (unsigned char *)send + i * es);
    for (int q = 0; q < n && rl; q++)
      for (size_t i = 0; i < cnt; i++) bt_put_input(k->dt, BRAID_SUM, q, i, want + ((size_t)q * cnt + i) * es);
    break;
  case C_SC:
    if (one_send) send = R.p, recv = R.p + (size_t)root * cnt * es, out = R.p;
    for (int q = 0; q < n && isroot; q++)
      for (size_t i = 0; i < cnt; i++)
        bt_put_input(k->dt, BRAID_SUM, q, i, (unsigned char *)send + ((size_t)q * cnt + i) * es);
    if (one_send) /* the root's block stays in place: the whole buffer keeps its bytes */
      memcpy(want, send, outl * es);
    else
      for (size_t i = 0; i < cnt; i++) bt_put_input(k->dt, BRAID_SUM, rank, i, want + i * es);
    break;
  case C_A2A:
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < cnt; i++) {
        bt_put_input(k->dt, BRAID_SUM, rank * n + q, i, in + ((size_t)q * cnt + i) * es);
        bt_put_input(k->dt, BRAID_SUM, q * n + rank, i, want + ((size_t)q * cnt + i) * es);
      }
    send = in;
    break;
  default: /* all-to-allv; gaps keep their fill */
    for (int q = 0; q < n; q++) { /* in place the data for q sits where q's data lands */
      size_t c0 = one_recv ? rc[q] : sc[q], d0 = one_recv ? rd[q] : sd[q];
      for (size_t i = 0; i < c0; i++) bt_put_input(k->dt, BRAID_SUM, rank * n + q, i, in + (d0 + i) * es);
    }
    memset(want, 0x5A, rl * es);
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < rc[q]; i++) bt_put_input(k->dt, BRAID_SUM, q * n + rank, i, want + (rd[q] + i) * es);
    send = in;
    break;
  }
  if (S.raw) memcpy(copy, S.p, sl * es);
  braid_status st;
  switch (k->coll) {
  case C_RD: case C_RDP: st = braid_reduce(c, send, isroot ? recv : NULL, cnt, k->dt, k->op, root); break;
  case C_ARP: st = braid_all_reduce(c, recv, cnt, k->dt, k->op); break;
  case C_RSP: st = braid_reduce_scatter(c, send, recv, cnt, k->dt, k->op); break;
  case C_GA: st = braid_gather(c, send, isroot ? recv : NULL, cnt, k->dt, root); break;
  case C_SC: st = braid_scatter(c, isroot ? send : NULL, recv, cnt, k->dt, root); break;
  case C_A2A: st = braid_all_to_all(c, send, recv, cnt, k->dt); break;
  default:
    st = braid_all_to_allv(c, send, one_recv ? NULL : sc, one_recv ? NULL : sd, recv, rc, rd, k->dt);
    break;
  }
  BT_CHECK(st == BRAID_OK, "%s %s count %zu root %d inplace %d: %s: %s", name, braid_dtype_name(k->dt), cnt, root, ip,
           braid_status_string(st), braid_last_error(c));
  BT_CHECK_OK(braid_sync(c), c);
  if (out)
    for (size_t i = 0; i < outl; i++)
      if (memcmp((unsigned char *)out + i * es, want + i * es, es)) {
        unsigned long long g = 0, w = 0;
        memcpy(&g, (unsigned char *)out + i * es, es < 8 ? es : 8);
        memcpy(&w, want + i * es, es < 8 ? es : 8);
        BT_CHECK(0, "%s %s count %zu n %d root %d inplace %d pattern %d: element %zu is 0x%llx, expected 0x%llx",
                 name, braid_dtype_name(k->dt), cnt, n, root, ip, k->pattern, i, g, w);
      }
  long hit;
  if (R.raw) BT_CHECK(!(hit = gb_guard_hit(&R)), "%s: byte %ld of the receive side's guard written", name, hit);
  if (S.raw) {
    BT_CHECK(!(hit = gb_guard_hit(&S)), "%s: byte %ld of the send side's guard written", name, hit);
    BT_CHECK(!memcmp(S.p, copy, sl * es), "%s wrote its send buffer", name);
  }
  gb_free(&S);
  gb_free(&R);
  free(want);
  free(copy);
  free(sc);
  return 0;
}

int bt_coll_matrix_more(braid_comm *c, int rank, int n, void *arg) {
  const matrix *m = arg;
  static const braid_dtype pm_dts[] = {BRAID_F32, BRAID_F64, BRAID_F16, BRAID_BF16, BRAID_FP8_E4M3, BRAID_I32,
                                       BRAID_U8, BRAID_C64};
  braid_op pm[BT_COUNT(pm_dts)];
  for (size_t i = 0; i < BT_COUNT(pm_dts); i++) {
    unsigned char s[16];
    bt_premul_scalar(pm_dts[i], s);
    BT_CHECK_OK(braid_op_premul_sum(c, s, pm_dts[i], &pm[i]), c);
  }
  for (int ci = 0; ci < m->ncounts; ci++) {
    size_t cnt = m->counts[ci];
    if (!m->full) {
      /* Large counts: each collective once or twice, on a direct, a widened
         and an integer dtype, the placements and roots spread over them, on
         a few world sizes only (a power of two and two odd ones, wrapping
         trees and chains differently) to keep the run time sane. */
      if (n != 2 && n != 3 && n != 7) continue;
      const ccase few[] = {
          {C_RD, BRAID_F32, BRAID_SUM, cnt, 0, 1, m->mem, n - 1, 0},
          {C_RD, BRAID_BF16, BRAID_AVG, cnt, 1, 2, m->mem, 0, 0},
          {C_RD, BRAID_I32, BRAID_BXOR, cnt, 0, 0, m->mem, n / 2, 0},
          {C_GA, BRAID_F32, BRAID_SUM, cnt, 1, 3, m->mem, n - 1, 0},
          {C_SC, BRAID_U8, BRAID_SUM, cnt, 0, 5, m->mem, 0, 0},
          {C_SC, BRAID_F32, BRAID_SUM, cnt, 1, 0, m->mem, n / 2, 0},
          {C_A2A, BRAID_F32, BRAID_SUM, cnt, 0, 4, m->mem, 0, 0},
          {C_A2A, BRAID_U8, BRAID_SUM, cnt, 1, 1, m->mem, 0, 0},
          {C_A2AV, BRAID_F32, BRAID_SUM, cnt, 1, 2, m->mem, 0, 0},
          {C_A2AV, BRAID_BF16, BRAID_SUM, cnt, 0, 0, m->mem, 0, 1},
          {C_ARP, BRAID_F32, pm[0], cnt, 0, 6, m->mem, 0, 0},
          {C_RSP, BRAID_BF16, pm[3], cnt, 1, 0, m->mem, 0, 0},
          {C_RDP, BRAID_F16, pm[2], cnt, 0, 1, m->mem, 1 % n, 0},
      };
      for (size_t i = 0; i < BT_COUNT(few); i++)
        if (bt_coll_more_one(c, rank, n, &few[i])) return 1;
      continue;
    }
    for (int di = 0; di < (int)BT_COUNT(bt_all_dtypes); di++) {
      braid_dtype d = bt_all_dtypes[di];
      for (int root = 0; root < n; root++)
        for (int ip = 0; ip < 2; ip++) {
          int mis = (ci + di + root + ip) % 8;
          /* reduce: every op on the rotating root, SUM on every root */
          for (int op = BRAID_SUM; op <= BRAID_BXOR; op++) {
            if (!bt_op_ok(d, (braid_op)op) || (op != BRAID_SUM && root != (int)((cnt + (size_t)op) % (size_t)n)))
              continue;
            ccase k = {C_RD, d, (braid_op)op, cnt, ip, mis, m->mem, root, 0};
            if (bt_coll_more_one(c, rank, n, &k)) return 1;
          }
          for (int coll = C_GA; coll <= C_SC; coll++) {
            ccase k = {coll, d, BRAID_SUM, cnt, ip, mis, m->mem, root, 0};
            if (bt_coll_more_one(c, rank, n, &k)) return 1;
          }
        }
      for (int ip = 0; ip < 2; ip++) {
        ccase k = {C_A2A, d, BRAID_SUM, cnt, ip, (ci + di + ip) % 8, m->mem, 0, 0};
        if (bt_coll_more_one(c, rank, n, &k)) return 1;
        for (int p = 0; p < BT_A2AV_PATTERNS; p++) {
          if (p == 1 && ip) continue; /* in place needs symmetric counts */
          ccase v = {C_A2AV, d, BRAID_SUM, cnt, ip, (ci + di + p) % 8, m->mem, 0, p};
          if (bt_coll_more_one(c, rank, n, &v)) return 1;
        }
      }
    }
    for (size_t i = 0; i < BT_COUNT(pm_dts); i++)
      for (int coll = C_ARP; coll <= C_RDP; coll++)
        for (int ip = 0; ip < 2; ip++) {
          if (coll == C_ARP && ip) continue;
          ccase k = {coll, pm_dts[i], pm[i], cnt, ip, (ci + (int)i) % 8, m->mem, (int)((cnt + i) % (size_t)n), 0};
          if (bt_coll_more_one(c, rank, n, &k)) return 1;
        }
  }
  for (size_t i = 0; i < BT_COUNT(pm_dts); i++) BT_CHECK_OK(braid_op_destroy(c, pm[i]), c);
  return 0;
}

static int32_t a2av_value(int i, int j, size_t k) { return (int32_t)(i * 1000003 + j * 7919 + (int)k); }

/* Send and receive blocks interleaved in one buffer (send block j at
   slot 2j, the block from rank j at slot 2j + 1): the spans meet but no
   element is both sent and received, so the call is valid. Small blocks
   and rendezvous-sized ones; the send blocks must come back unchanged. */
int bt_a2av_interleaved(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  static const size_t sizes[] = {7, 3000, 70000};
  size_t sc[16], sd[16], rc[16], rd[16];
  for (size_t z = 0; z < BT_COUNT(sizes); z++) {
    const size_t b = sizes[z], total = 2 * (size_t)n * b;
    int32_t *buf = malloc((total + 1) * sizeof *buf);
    BT_CHECK(buf != NULL, "out of memory");
    for (size_t k = 0; k <= total; k++) buf[k] = -1;
    for (int j = 0; j < n; j++) {
      sc[j] = rc[j] = b, sd[j] = 2 * (size_t)j * b, rd[j] = sd[j];
      for (size_t k = 0; k < b; k++) buf[sd[j] + k] = a2av_value(rank, j, k);
    }
    BT_CHECK_OK(braid_all_to_allv(c, buf, sc, sd, buf + b, rc, rd, BRAID_I32), c);
    BT_CHECK_OK(braid_sync(c), c);
    for (int j = 0; j < n; j++)
      for (size_t k = 0; k < b; k++) {
        BT_CHECK(buf[sd[j] + k] == a2av_value(rank, j, k), "block size %zu: send element %zu for rank %d changed", b, k, j);
        BT_CHECK(buf[b + rd[j] + k] == a2av_value(j, rank, k), "block size %zu: element %zu from rank %d", b, k, j);
      }
    BT_CHECK(buf[total] == -1, "written past the end");
    /* The block from rank 0 one element later reaches into the send
       block for rank 1: refused before anything moves, on every rank. */
    rd[0] = 1;
    if (n > 1) {
      BT_CHECK_ST(braid_all_to_allv(c, buf, sc, sd, buf + b, rc, rd, BRAID_I32), BRAID_ERR_INVALID_ARG, c);
      BT_CHECK_MSG(c, "the send block for rank 1 and the recv block from rank 0 share elements");
      for (int j = 0; j < n; j++)
        for (size_t k = 0; k < b; k++) BT_CHECK(buf[sd[j] + k] == a2av_value(rank, j, k), "refused call wrote");
    }
    free(buf);
  }
  return 0;
}
