/*
 * perf_core: measurement driver shared by braid-perf and the peer harnesses
 * (see perf_core.h). Definitions follow nccl-tests:
 *   time  = per-iteration time of the slowest rank for back-to-back calls
 *   algbw = bytes / time (all-gather and reduce-scatter count the whole
 *           n-rank buffer), busbw = algbw * factor, GB = 1e9 bytes.
 * The check phase after timing fills inputs with values whose reductions are
 * exact in every dtype whatever the reduction order, so #wrong counts errors.
 */
#include "perf_core.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ tables */

typedef enum { K_FLOAT, K_SINT, K_UINT, K_BOOL, K_COMPLEX } dkind;

typedef struct dtinfo {
  braid_dtype dt;
  const char *name;
  const char *alias[3]; /* braid's alias, then nccl-tests' names */
  size_t size;
  dkind kind;
  int ebits, mbits; /* floats (per lane for complex): exponent and mantissa bits */
  int fn;           /* E4M3FN: no infinity, one NaN pattern */
} dtinfo;

static const dtinfo DT[] = {
    {BRAID_F64, "f64", {"float64", "double", NULL}, 8, K_FLOAT, 11, 52, 0},
    {BRAID_F32, "f32", {"float32", "float", NULL}, 4, K_FLOAT, 8, 23, 0},
    {BRAID_F16, "f16", {"float16", "half", NULL}, 2, K_FLOAT, 5, 10, 0},
    {BRAID_BF16, "bf16", {"bfloat16", NULL, NULL}, 2, K_FLOAT, 8, 7, 0},
    {BRAID_FP8_E4M3, "fp8_e4m3", {"e4m3", "f8e4m3", NULL}, 1, K_FLOAT, 4, 3, 1},
    {BRAID_FP8_E5M2, "fp8_e5m2", {"e5m2", "f8e5m2", NULL}, 1, K_FLOAT, 5, 2, 0},
    {BRAID_I64, "i64", {"int64", NULL, NULL}, 8, K_SINT, 0, 0, 0},
    {BRAID_I32, "i32", {"int32", "int", NULL}, 4, K_SINT, 0, 0, 0},
    {BRAID_I16, "i16", {"int16", NULL, NULL}, 2, K_SINT, 0, 0, 0},
    {BRAID_I8, "i8", {"int8", "char", NULL}, 1, K_SINT, 0, 0, 0},
    {BRAID_U64, "u64", {"uint64", NULL, NULL}, 8, K_UINT, 0, 0, 0},
    {BRAID_U32, "u32", {"uint32", NULL, NULL}, 4, K_UINT, 0, 0, 0},
    {BRAID_U16, "u16", {"uint16", NULL, NULL}, 2, K_UINT, 0, 0, 0},
    {BRAID_U8, "u8", {"uint8", NULL, NULL}, 1, K_UINT, 0, 0, 0},
    {BRAID_BOOL, "bool", {"b8", NULL, NULL}, 1, K_BOOL, 0, 0, 0},
    {BRAID_C64, "c64", {"complex64", NULL, NULL}, 8, K_COMPLEX, 8, 23, 0},
    {BRAID_C128, "c128", {"complex128", NULL, NULL}, 16, K_COMPLEX, 11, 52, 0},
};
#define NDT (sizeof DT / sizeof DT[0])

static const char *const REDOP_NAMES[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor", "premulsum"};
#define NREDOP 9

static const char *const OP_NAMES[PERF_NOPS] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                                "sendrecv",  "barrier",   "reduce",    "gather",
                                                "scatter",   "alltoall",  "alltoallv"};

#define MAX_ITERS 10000000L /* cap when adapting: ~0.1 s even for 10 ns calls */
#define MIN_ITERS 3L
#define DEFAULT_WARMUP 2L

static const dtinfo *dt_find(braid_dtype dt) {
  for (size_t i = 0; i < NDT; i++)
    if (DT[i].dt == dt) return &DT[i];
  return NULL;
}

const char *perf_dtype_name(braid_dtype dt) {
  const dtinfo *d = dt_find(dt);
  return d ? d->name : "?";
}

size_t perf_dtype_size(braid_dtype dt) {
  const dtinfo *d = dt_find(dt);
  return d ? d->size : 0;
}

const char *perf_redop_name(braid_op op) {
  return (unsigned)op < NREDOP ? REDOP_NAMES[op] : "?";
}

const char *perf_op_name(perf_op op) { return (unsigned)op < PERF_NOPS ? OP_NAMES[op] : "?"; }

static int op_reduces(perf_op op) { return op == PERF_ALLREDUCE || op == PERF_REDUCE_SCATTER || op == PERF_REDUCE; }
static int op_rooted(perf_op op) {
  return op == PERF_BROADCAST || op == PERF_REDUCE || op == PERF_GATHER || op == PERF_SCATTER;
}
/* The size counts every rank's block (nccl-tests: the n-rank buffer). */
static int op_split_by_n(perf_op op) {
  return op == PERF_ALLGATHER || op == PERF_REDUCE_SCATTER || op == PERF_GATHER || op == PERF_SCATTER ||
         op == PERF_ALLTOALL || op == PERF_ALLTOALLV;
}

double perf_bus_factor(perf_op op, int nranks) {
  double n = nranks;
  switch (op) {
  case PERF_ALLREDUCE: return 2.0 * (n - 1) / n;
  case PERF_ALLGATHER:
  case PERF_REDUCE_SCATTER:
  case PERF_GATHER:
  case PERF_SCATTER:
  case PERF_ALLTOALL:
  case PERF_ALLTOALLV: return (n - 1) / n;
  default: return 1.0; /* broadcast, reduce, sendrecv */
  }
}

void perf_a2av_counts(int rank, int nranks, size_t count, size_t *sc, size_t *sd, size_t *rc, size_t *rd) {
  const int n = nranks;
  size_t so = 0, ro = 0;
  for (int j = 0; j < n; j++) {
    size_t ks = (size_t)((j - rank + n) % n), kr = (size_t)((rank - j + n) % n);
    sc[j] = 2 * count * (ks + 1) / (size_t)(n + 1);
    rc[j] = 2 * count * (kr + 1) / (size_t)(n + 1);
    sd[j] = so, rd[j] = ro;
    so += sc[j], ro += rc[j];
  }
}

const char *perf_redop_invalid(braid_dtype dt, braid_op rop) {
  const dtinfo *d = dt_find(dt);
  if (!d) return "unknown dtype";
  if ((unsigned)rop >= NREDOP) return "unknown op";
  int bitwise = rop == BRAID_BAND || rop == BRAID_BOR || rop == BRAID_BXOR;
  switch (d->kind) {
  case K_FLOAT:
    if (bitwise) return "bitwise ops (band, bor, bxor) are for integers and bool";
    return NULL;
  case K_COMPLEX:
    if (rop != BRAID_SUM && rop != BRAID_PROD && rop != BRAID_AVG && rop != PERF_PREMULSUM)
      return "complex types support sum, prod, avg and premulsum only";
    return NULL;
  case K_BOOL:
    if (rop == BRAID_AVG) return "avg is not defined on bool";
    if (rop == PERF_PREMULSUM) return "premulsum is not defined on bool";
    return NULL;
  default: return NULL;
  }
}

/* ------------------------------------------------------------------ parsing */

static int parse_size(const char *s, size_t *out) {
  if (!s || !*s || *s == '-' || *s == '+') return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s || errno) return -1;
  unsigned long long mul = 1;
  switch (*end) {
  case 'k': case 'K': mul = 1ull << 10; end++; break;
  case 'm': case 'M': mul = 1ull << 20; end++; break;
  case 'g': case 'G': mul = 1ull << 30; end++; break;
  default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return -1;
  if (v > SIZE_MAX / mul) return -1;
  *out = (size_t)(v * mul);
  return 0;
}

static int parse_long(const char *s, long lo, long hi, long *out) {
  if (!s || !*s) return -1;
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || errno || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int parse_double(const char *s, double lo, double hi, double *out) {
  if (!s || !*s) return -1;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end || errno || !(v >= lo && v <= hi)) return -1;
  *out = v;
  return 0;
}

static int dtype_parse(const char *s, braid_dtype *out) {
  for (size_t i = 0; i < NDT; i++) {
    if (!strcasecmp(s, DT[i].name)) goto found;
    for (int k = 0; k < 3; k++)
      if (DT[i].alias[k] && !strcasecmp(s, DT[i].alias[k])) goto found;
    continue;
  found:
    *out = DT[i].dt;
    return 0;
  }
  return -1;
}

static int redop_parse(const char *s, braid_op *out) {
  for (int i = 0; i < NREDOP; i++)
    if (!strcasecmp(s, REDOP_NAMES[i])) {
      *out = (braid_op)i;
      return 0;
    }
  return -1;
}

static int op_parse(const char *s, perf_op *out) {
  static const struct {
    const char *name;
    perf_op op;
  } names[] = {{"allreduce", PERF_ALLREDUCE},   {"all_reduce", PERF_ALLREDUCE},
               {"broadcast", PERF_BROADCAST},   {"bcast", PERF_BROADCAST},
               {"allgather", PERF_ALLGATHER},   {"all_gather", PERF_ALLGATHER},
               {"reduce_scatter", PERF_REDUCE_SCATTER}, {"reducescatter", PERF_REDUCE_SCATTER},
               {"sendrecv", PERF_SENDRECV},     {"barrier", PERF_BARRIER},
               {"reduce", PERF_REDUCE},         {"gather", PERF_GATHER},
               {"scatter", PERF_SCATTER},       {"alltoall", PERF_ALLTOALL},
               {"all_to_all", PERF_ALLTOALL},   {"alltoallv", PERF_ALLTOALLV},
               {"all_to_allv", PERF_ALLTOALLV}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcasecmp(s, names[i].name)) {
      *out = names[i].op;
      return 0;
    }
  return -1;
}

void perf_usage(FILE *out, const char *prog) {
  fprintf(out,
          "usage: %s OP [options]\n"
          "  OP: allreduce, broadcast, allgather, reduce_scatter, sendrecv (ring exchange),\n"
          "      barrier, reduce, gather, scatter, alltoall, alltoallv (an uneven split),\n"
          "      or all (each in turn)\n"
          "options (nccl-tests meanings):\n"
          "  -b, --minbytes N      smallest size (bytes; K, M, G suffixes = 2^10, 2^20, 2^30); default 8\n"
          "  -e, --maxbytes N      largest size; default 64M\n"
          "  -f, --stepfactor N    multiply the size by N each step; default 2\n"
          "  -i, --stepbytes N     with -f 1: add N bytes each step; default 1M\n"
          "  -n, --iters N         timed iterations per size; default: adapt so each size\n"
          "                        runs about --time seconds\n"
          "  -w, --warmup_iters N  warm-up iterations; default 2 (plus iters/10 when adapting)\n"
          "  -d, --datatype T      f32 (default), f64, f16, bf16, fp8_e4m3, fp8_e5m2, i8..i64,\n"
          "                        u8..u64, bool, c64, c128 (or float, half, int32, ...), a comma\n"
          "                        list, or all\n"
          "  -o, --op OP           sum (default), prod, min, max, avg, band, bor, bxor,\n"
          "                        premulsum (a scaled sum by 2), a comma list, or all\n"
          "  -r, --root R          root of broadcast, reduce, gather, scatter; default 0\n"
          "  -c, --check 0|1       check every element after timing; default 1\n"
          "  -R, --mem 0|1         1: buffers from the library's allocator (braid_mem_alloc,\n"
          "                        MPI_Alloc_mem) instead of the heap; default 0\n"
          "      --time S          target seconds per size when adapting; default 0.1\n"
          "      --json            one JSON object per size and placement instead of the table\n"
          "  -h, --help            this text\n"
          "Sizes are rounded down to a multiple of the element size (times the world size\n"
          "for allgather and reduce_scatter); sizes that round to 0 are skipped.\n"
          "Exit status: 0 ok, 1 wrong elements, 2 bad usage, 3 library error.\n",
          prog);
}

static int usage_error(const perf_args *a, int quiet, const char *opt, const char *val, const char *want) {
  if (!quiet) {
    if (val)
      fprintf(stderr, "%s: invalid value '%s' for %s: %s\n", a->prog, val, opt, want);
    else
      fprintf(stderr, "%s: %s: %s\n", a->prog, opt, want);
    fprintf(stderr, "usage: %s OP [options]; '%s --help' lists OPs and options.\n", a->prog, a->prog);
  }
  return PERF_EXIT_USAGE;
}

/* Splits a comma list into at most max entries, each parsed by fn. */
static int parse_list(const char *s, int (*fn)(const char *, int *), int *vals, int max, int *n) {
  char buf[256];
  if (strlen(s) >= sizeof buf) return -1;
  strcpy(buf, s);
  *n = 0;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (*n >= max) return -1;
    if (fn(tok, &vals[*n]) != 0) return -1;
    (*n)++;
  }
  return *n ? 0 : -1;
}

static int dtype_parse_int(const char *s, int *out) {
  braid_dtype d;
  if (dtype_parse(s, &d)) return -1;
  *out = (int)d;
  return 0;
}

static int redop_parse_int(const char *s, int *out) {
  braid_op o;
  if (redop_parse(s, &o)) return -1;
  *out = (int)o;
  return 0;
}

int perf_parse_args(int argc, char **argv, perf_args *a, const char *prog, int quiet) {
  memset(a, 0, sizeof *a);
  a->prog = prog;
  a->minbytes = 8;
  a->maxbytes = 64u << 20;
  a->stepbytes = 1u << 20;
  a->stepfactor = 2;
  a->warmup = -1;
  a->target_s = 0.1;
  a->ndtypes = 1;
  a->dtypes[0] = BRAID_F32;
  a->nredops = 1;
  a->redops[0] = BRAID_SUM;
  a->check = 1;
  a->ops[0] = -1;

  const char *opname = NULL;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
      if (!quiet) perf_usage(stdout, prog);
      return PERF_EXIT_OK;
    }
    if (!strcmp(arg, "--json")) {
      a->json = 1;
      continue;
    }
    if (arg[0] != '-' || !arg[1]) {
      if (opname) {
        char what[96], why[128];
        snprintf(what, sizeof what, "unexpected argument '%.60s'", arg);
        snprintf(why, sizeof why, "OP is already '%.60s' (one OP per run; 'all' runs each in turn)", opname);
        return usage_error(a, quiet, what, NULL, why);
      }
      opname = arg;
      continue;
    }
    /* Options with a value: "-b 8", "-b8", "--minbytes 8", "--minbytes=8". */
    static const struct {
      char s;
      const char *l;
    } vopts[] = {{'b', "minbytes"}, {'e', "maxbytes"}, {'f', "stepfactor"}, {'i', "stepbytes"},
                 {'n', "iters"},    {'w', "warmup_iters"}, {'d', "datatype"}, {'o', "op"},
                 {'r', "root"},     {'c', "check"},    {'R', "mem"},  {'T', "time"}};
    char key = 0;
    const char *val = NULL;
    if (arg[1] == '-') {
      const char *name = arg + 2;
      size_t len = strcspn(name, "=");
      for (size_t k = 0; k < sizeof vopts / sizeof vopts[0]; k++)
        if (strlen(vopts[k].l) == len && !strncmp(name, vopts[k].l, len)) key = vopts[k].s;
      if (key && name[len] == '=') val = name + len + 1;
    } else {
      for (size_t k = 0; k < sizeof vopts / sizeof vopts[0]; k++)
        if (arg[1] == vopts[k].s && vopts[k].s != 'T') key = vopts[k].s;
      if (key && arg[2]) val = arg + 2;
    }
    if (!key) return usage_error(a, quiet, arg, NULL, "unknown option");
    if (!val) {
      if (i + 1 >= argc) return usage_error(a, quiet, arg, NULL, "needs a value");
      val = argv[++i];
    }
    long l;
    switch (key) {
    case 'b':
      if (parse_size(val, &a->minbytes) || a->minbytes == 0)
        return usage_error(a, quiet, "-b (min bytes)", val, "expected a positive byte count such as 8, 4K, 1M");
      break;
    case 'e':
      if (parse_size(val, &a->maxbytes) || a->maxbytes == 0)
        return usage_error(a, quiet, "-e (max bytes)", val, "expected a positive byte count such as 64M");
      break;
    case 'i':
      if (parse_size(val, &a->stepbytes) || a->stepbytes == 0)
        return usage_error(a, quiet, "-i (step bytes)", val, "expected a positive byte count");
      break;
    case 'f':
      if (parse_long(val, 1, 1 << 20, &a->stepfactor))
        return usage_error(a, quiet, "-f (step factor)", val, "expected an integer >= 1");
      break;
    case 'n':
      if (parse_long(val, 1, LONG_MAX / 2, &a->iters))
        return usage_error(a, quiet, "-n (iterations)", val, "expected an integer >= 1");
      break;
    case 'w':
      if (parse_long(val, 0, LONG_MAX / 2, &a->warmup))
        return usage_error(a, quiet, "-w (warm-up iterations)", val, "expected an integer >= 0");
      break;
    case 'r':
      if (parse_long(val, 0, INT_MAX, &l))
        return usage_error(a, quiet, "-r (root)", val, "expected a rank >= 0");
      a->root = (int)l;
      break;
    case 'c':
      if (strcmp(val, "0") && strcmp(val, "1")) return usage_error(a, quiet, "-c (check)", val, "expected 0 or 1");
      a->check = val[0] == '1';
      break;
    case 'R':
      if (strcmp(val, "0") && strcmp(val, "1")) return usage_error(a, quiet, "-R (mem)", val, "expected 0 or 1");
      a->lib_mem = val[0] == '1';
      break;
    case 'T':
      if (parse_double(val, 1e-4, 3600, &a->target_s))
        return usage_error(a, quiet, "--time", val, "expected seconds between 0.0001 and 3600");
      break;
    case 'd': {
      int v[PERF_MAX_ITEMS], n = 0;
      a->all_dtypes = !strcasecmp(val, "all");
      if (!a->all_dtypes) {
        if (parse_list(val, dtype_parse_int, v, PERF_MAX_ITEMS, &n))
          return usage_error(a, quiet, "-d (datatype)", val,
                             "expected f64, f32, f16, bf16, fp8_e4m3, fp8_e5m2, i8, i16, i32, i64, u8, u16, "
                             "u32, u64, bool, c64, c128, a comma list of these, or all");
        a->ndtypes = n;
        for (int k = 0; k < n; k++) a->dtypes[k] = (braid_dtype)v[k];
      }
      break;
    }
    case 'o': {
      int v[PERF_MAX_ITEMS], n = 0;
      a->all_redops = !strcasecmp(val, "all");
      if (!a->all_redops) {
        if (parse_list(val, redop_parse_int, v, PERF_MAX_ITEMS, &n))
          return usage_error(a, quiet, "-o (op)", val,
                             "expected sum, prod, min, max, avg, band, bor, bxor, premulsum, a comma list, or all");
        a->nredops = n;
        for (int k = 0; k < n; k++) a->redops[k] = (braid_op)v[k];
      }
      break;
    }
    default: break;
    }
  }
  if (!opname)
    return usage_error(a, quiet, "OP", NULL,
                       "missing (allreduce, broadcast, allgather, reduce_scatter, sendrecv, barrier, reduce, gather, "
                       "scatter, alltoall, alltoallv or all)");
  if (!strcasecmp(opname, "all")) {
    for (int k = 0; k < PERF_NOPS; k++) a->ops[k] = k;
    a->ops[PERF_NOPS] = -1;
  } else {
    perf_op op;
    if (op_parse(opname, &op))
      return usage_error(a, quiet, "OP", opname,
                         "expected allreduce, broadcast, allgather, reduce_scatter, sendrecv, barrier, reduce, gather, "
                         "scatter, alltoall, alltoallv or all");
    a->ops[0] = (int)op;
    a->ops[1] = -1;
  }
  if (a->minbytes > a->maxbytes) {
    char v[64];
    snprintf(v, sizeof v, "%zu", a->minbytes);
    return usage_error(a, quiet, "-b (min bytes)", v, "larger than -e (max bytes)");
  }
  /* An explicitly named pair that braid.h leaves undefined is a usage error;
     with -d all / -o all such pairs are skipped. */
  if (!a->all_dtypes && !a->all_redops) {
    int any_reduce = 0;
    for (int k = 0; a->ops[k] >= 0; k++) any_reduce |= op_reduces((perf_op)a->ops[k]);
    if (any_reduce)
      for (int i = 0; i < a->ndtypes; i++)
        for (int j = 0; j < a->nredops; j++) {
          const char *why = perf_redop_invalid(a->dtypes[i], a->redops[j]);
          if (why) {
            char v[64];
            snprintf(v, sizeof v, "%s with -d %s", perf_redop_name(a->redops[j]), perf_dtype_name(a->dtypes[i]));
            return usage_error(a, quiet, "-o (op)", v, why);
          }
        }
  }
  return -1;
}

/* ------------------------------------------------------------------ small floats */

/* Round-to-nearest-even encoding of x into a float with E exponent and M
   mantissa bits (IEEE layout; fn: E4M3FN, where the all-ones pattern is the
   only NaN and there is no infinity, so overflow gives NaN as in braid). */
static uint32_t mf_encode(double x, int E, int M, int fn) {
  const int bias = (1 << (E - 1)) - 1;
  const uint32_t emax_field = (1u << E) - 1, mmask = (1u << M) - 1;
  const uint32_t sign = signbit(x) ? 1u << (E + M) : 0;
  const uint32_t nan = fn ? (sign | (emax_field << M) | mmask) : ((emax_field << M) | (1u << (M - 1)));
  const uint32_t inf = fn ? nan : (sign | (emax_field << M));
  if (isnan(x)) return nan;
  double a = fabs(x);
  if (isinf(a)) return inf;
  if (a == 0) return sign;
  int e;
  (void)frexp(a, &e);
  int ue = e - 1; /* a in [2^ue, 2^(ue+1)) */
  const int emin = 1 - bias;
  if (ue < emin) { /* subnormal: units of 2^(emin-M); a carry to 2^M is the smallest normal */
    double q = nearbyint(ldexp(a, M - emin));
    return sign | (uint32_t)q;
  }
  uint32_t q = (uint32_t)nearbyint(ldexp(a, M - ue)); /* in [2^M, 2^(M+1)] */
  if (q == (2u << M)) {
    q >>= 1;
    ue++;
  }
  long ef = (long)ue + bias;
  if (fn) {
    if (ef > (long)emax_field || (ef == (long)emax_field && (q & mmask) == mmask)) return nan;
  } else if (ef >= (long)emax_field) {
    return inf;
  }
  return sign | ((uint32_t)ef << M) | (q & mmask);
}

static double mf_decode(uint32_t v, int E, int M, int fn) {
  const int bias = (1 << (E - 1)) - 1;
  const uint32_t emax_field = (1u << E) - 1, mmask = (1u << M) - 1;
  uint32_t s = (v >> (E + M)) & 1, ef = (v >> M) & emax_field, mf = v & mmask;
  double r;
  if (fn && ef == emax_field && mf == mmask) return NAN;
  if (!fn && ef == emax_field) r = mf ? NAN : INFINITY;
  else if (ef == 0) r = ldexp((double)mf, 1 - bias - M);
  else r = ldexp((double)(mf | (1u << M)), (int)ef - bias - M);
  return s ? -r : r;
}

/* Stores the real value x (or one complex lane) in dtype d at p. */
static void fstore(const dtinfo *d, void *p, double x) {
  if (d->mbits == 52) {
    memcpy(p, &x, 8);
  } else if (d->mbits == 23) {
    float f = (float)x;
    memcpy(p, &f, 4);
  } else if (d->size == 2) {
    uint16_t h = (uint16_t)mf_encode(x, d->ebits, d->mbits, d->fn);
    memcpy(p, &h, 2);
  } else {
    *(uint8_t *)p = (uint8_t)mf_encode(x, d->ebits, d->mbits, d->fn);
  }
}

static double fload(const dtinfo *d, const void *p) {
  if (d->mbits == 52) {
    double x;
    memcpy(&x, p, 8);
    return x;
  }
  if (d->mbits == 23) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  if (d->size == 2) {
    uint16_t h;
    memcpy(&h, p, 2);
    return mf_decode(h, d->ebits, d->mbits, d->fn);
  }
  return mf_decode(*(const uint8_t *)p, d->ebits, d->mbits, d->fn);
}

/* The value x becomes after a round trip through d (the dtype's rounding). */
static double fround(const dtinfo *d, double x) {
  unsigned char tmp[8];
  fstore(d, tmp, x);
  return fload(d, tmp);
}

/* ------------------------------------------------------------------ check patterns */

typedef struct pattern {
  const dtinfo *d;
  const dtinfo *lane; /* complex: the real dtype of one lane; else d */
  braid_op rop;
  int n;
  int premul;             /* -o premulsum: the SUM pattern, results times 2 */
  /* floats */
  long sum_vmax;          /* SUM: per-rank values 0..vmax; 0: one contributor per element */
  int avg_mode;           /* 2: w + spike n*u; 3: w on every rank or +v and -v; 1: one contributor of
                             value n; 0: +v and -v */
  long avg_wmax, avg_umax;
  /* integers */
  int bits;
  uint64_t mask;
  /* 8- and 16-bit floats: decode table of every bit pattern and encode table
     of the small integers the patterns use (the check is per element). */
  double *dec;
  uint16_t *enc;
} pattern;

#define ENC_LIM 4096

static uint64_t mix64(uint64_t x) { /* splitmix64 finalizer */
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t hash2(int r, uint64_t k) { return mix64(((uint64_t)(unsigned)r << 40) ^ (k * 0x2545f4914f6cdd1dull)); }

static void pattern_init(pattern *p, braid_dtype dt, braid_op rop, int n) {
  memset(p, 0, sizeof *p);
  if (rop == PERF_PREMULSUM) p->premul = 1, rop = BRAID_SUM;
  p->d = dt_find(dt);
  p->lane = p->d;
  if (p->d->kind == K_COMPLEX) p->lane = dt_find(p->d->size == 8 ? BRAID_F32 : BRAID_F64);
  p->rop = rop;
  p->n = n;
  p->bits = (int)(p->d->size * 8);
  p->mask = p->bits >= 64 ? ~0ull : ((1ull << p->bits) - 1);
  if (p->d->kind == K_FLOAT || p->d->kind == K_COMPLEX) {
    /* Every integer up to 2^(mbits+1) is exact; partial sums of any subset of
       ranks stay within that bound, so the result is the same in any order. */
    double big = ldexp(1.0, p->lane->mbits + 1);
    double k = floor(big / n);
    p->sum_vmax = k >= 3 ? 3 : (long)k;
    if (k >= 2) {
      p->avg_mode = 2;
      p->avg_wmax = 1;
      p->avg_umax = k - 1 >= 3 ? 3 : (long)k - 1;
    } else if (k >= 1) {
      p->avg_mode = 3;
      p->avg_wmax = 1;
    } else {
      p->avg_mode = fround(p->lane, n) == n ? 1 : 0;
    }
  }
  if (p->d->kind == K_FLOAT && p->d->size <= 2) {
    size_t ndec = (size_t)1 << (8 * p->d->size);
    p->dec = malloc(ndec * sizeof *p->dec);
    p->enc = malloc((2 * ENC_LIM + 1) * sizeof *p->enc);
    if (!p->dec || !p->enc) {
      free(p->dec);
      free(p->enc);
      p->dec = NULL;
      p->enc = NULL;
      return;
    }
    for (size_t v = 0; v < ndec; v++) p->dec[v] = mf_decode((uint32_t)v, p->d->ebits, p->d->mbits, p->d->fn);
    for (int v = -ENC_LIM; v <= ENC_LIM; v++)
      p->enc[v + ENC_LIM] = (uint16_t)mf_encode(v, p->d->ebits, p->d->mbits, p->d->fn);
  }
}

static void pattern_free(pattern *p) {
  free(p->dec);
  free(p->enc);
  p->dec = NULL;
  p->enc = NULL;
}

/* fstore / fload / fround of a real dtype, through the tables when present. */
static void pstore(const pattern *p, void *dst, double x) {
  if (p->enc && x >= -ENC_LIM && x <= ENC_LIM && x == (double)(int)x) {
    uint16_t v = p->enc[(int)x + ENC_LIM];
    if (p->d->size == 1) *(uint8_t *)dst = (uint8_t)v;
    else memcpy(dst, &v, 2);
    return;
  }
  fstore(p->d, dst, x);
}

static double pload(const pattern *p, const void *src) {
  if (p->dec) {
    if (p->d->size == 1) return p->dec[*(const uint8_t *)src];
    uint16_t v;
    memcpy(&v, src, 2);
    return p->dec[v];
  }
  return fload(p->d, src);
}

static double pround(const pattern *p, double x) {
  unsigned char tmp[8];
  pstore(p, tmp, x);
  return pload(p, tmp);
}

/* The rank holding element x's extreme value (MIN/MAX) or its lone input. */
static int pick_rank(const pattern *p, uint64_t x) { return (int)(mix64(x ^ 0x5ca1ab1eull) % (uint64_t)p->n); }

/* Real input of rank r for lane index x (element g of a real type, or
   2g + part of a complex one). Every pattern makes the result vary from
   element to element at any world size, so a misplaced block is caught. */
static double fval(const pattern *p, int r, uint64_t x) {
  const int n = p->n;
  switch (p->rop) {
  case BRAID_SUM:
    if (p->sum_vmax > 0) return (double)(hash2(r, x) % (uint64_t)(p->sum_vmax + 1));
    return r == pick_rank(p, x) ? (double)(1 + x % 3) : 0.0; /* one contributor: sums are 0 or it */
  case BRAID_AVG:
    if (p->avg_mode == 2) {
      double w = (double)(x % (uint64_t)(p->avg_wmax + 1));
      double u = (double)((x / 2) % (uint64_t)(p->avg_umax + 1));
      return w + ((uint64_t)r == x % (uint64_t)n ? n * u : 0.0);
    }
    if (p->avg_mode == 1) return ((uint64_t)r == x % (uint64_t)n && (x / (uint64_t)n) % 2) ? (double)n : 0.0;
    /* Only n itself fits (3), or not even n (0): +v and -v on two ranks, so
       every partial sum is 0 or +-v and the average 0, which still shows a
       lost or doubled input; in mode 3 every third element is w on every
       rank (sum n*w) so the results vary along the buffer. */
    if (p->avg_mode == 3 && x % 3 == 0) return (double)((x / 3) % 2);
    if ((uint64_t)r == x % (uint64_t)n) return (double)(1 + (x / (uint64_t)n) % 3);
    if ((uint64_t)r == (x + 1) % (uint64_t)n) return -(double)(1 + (x / (uint64_t)n) % 3);
    return 0.0;
  case BRAID_PROD: {
    double f = (uint64_t)r == x % (uint64_t)n ? 2.0 : 1.0;
    if (x % 5 == 3 && (uint64_t)r == (x / 5) % (uint64_t)n) f = -f;
    if (x % 11 == 7 && (uint64_t)r == (x / 11) % (uint64_t)n) f = 0.0;
    return f;
  }
  default: { /* MIN, MAX: one rank holds base in [-4, 4], the others lie 1..3 beyond it (|v| <= 7: exact in fp8) */
    double base = (double)((x * 7) % 9) - 4.0;
    if (r == pick_rank(p, x)) return base;
    double off = (double)(1 + hash2(r, x) % 3);
    return p->rop == BRAID_MIN ? base + off : base - off;
  }
  }
}

/* Complex PROD input: 1 or 2, times i on one rank for odd elements;
   every partial product is 2^a * i^b, exact. */
static void cprod_val(const pattern *p, int r, uint64_t g, double *re, double *im) {
  double a = (uint64_t)r == g % (uint64_t)p->n ? 2.0 : 1.0;
  if ((g & 1) && (uint64_t)r == (g / 3) % (uint64_t)p->n) {
    *re = 0;
    *im = a;
  } else {
    *re = a;
    *im = 0;
  }
}

static uint64_t ival(const pattern *p, int r, uint64_t g) {
  const int sgn = p->d->kind == K_SINT;
  const int hs = p->bits - 4;
  const uint64_t h = hash2(r, g);
  int64_t v;
  switch (p->rop) {
  case BRAID_SUM:
  case BRAID_AVG: /* small values and high bits, so sums carry into the top and wrap */
    v = (int64_t)(h % 7) - (sgn ? 3 : 0);
    v += (int64_t)((h >> 8) % 3) * ((int64_t)1 << hs);
    break;
  case BRAID_PROD: { /* odd factors +-1, +-3 (unsigned 1, 3, 5, 7): products wrap but never
                        vanish, whatever the world size; one zero now and then */
    static const int64_t sf[4] = {1, -1, 3, -3};
    v = sgn ? sf[h % 4] : (int64_t)(2 * (h % 4) + 1);
    if (g % 17 == 5 && (uint64_t)r == (g / 17) % (uint64_t)p->n) v = 0;
    break;
  }
  case BRAID_MIN:
  case BRAID_MAX: {
    /* One rank holds base; the others lie beyond it by 1..3, half of them
       also by 2^hs, so comparisons must look at the high bits. Bounds: signed
       |v| <= 2^(hs+1) + 8, unsigned 1 <= v < 2^(hs+2) + 18, no wrap. */
    int64_t hi = (int64_t)(g % 3) + (sgn ? -1 : 1);
    int64_t base = (int64_t)((g * 7) % 11) - (sgn ? 5 : -4) + hi * ((int64_t)1 << hs);
    if (r == pick_rank(p, g)) {
      v = base;
    } else {
      int64_t off = 1 + (int64_t)(h % 3) + (int64_t)((h >> 8) & 1) * ((int64_t)1 << hs);
      v = p->rop == BRAID_MIN ? base + off : base - off;
    }
    break;
  }
  default: {
    if (p->rop == BRAID_BXOR) return h & p->mask;
    /* One rank holds t; the others t with random bits added (BAND) or
       removed (BOR), so the result is t at any world size. */
    const uint64_t t = mix64(g ^ 0xb175ull);
    if (r == pick_rank(p, g)) return t & p->mask;
    return (p->rop == BRAID_BAND ? t | h : t & h) & p->mask;
  }
  }
  return (uint64_t)v & p->mask;
}

static int64_t sext(uint64_t v, int bits) {
  if (bits >= 64) return (int64_t)v;
  uint64_t m = 1ull << (bits - 1);
  return (int64_t)((v ^ m) - m);
}

static void istore(const pattern *p, void *dst, uint64_t v) {
  switch (p->d->size) {
  case 1: { uint8_t x = (uint8_t)v; memcpy(dst, &x, 1); break; }
  case 2: { uint16_t x = (uint16_t)v; memcpy(dst, &x, 2); break; }
  case 4: { uint32_t x = (uint32_t)v; memcpy(dst, &x, 4); break; }
  default: memcpy(dst, &v, 8); break;
  }
}

static uint64_t iload(const pattern *p, const void *src) {
  switch (p->d->size) {
  case 1: { uint8_t x; memcpy(&x, src, 1); return x; }
  case 2: { uint16_t x; memcpy(&x, src, 2); return x; }
  case 4: { uint32_t x; memcpy(&x, src, 4); return x; }
  default: { uint64_t x; memcpy(&x, src, 8); return x; }
  }
}

/* BOOL: OR-like ops see at most one true input per element, AND-like ops at
   most one false one, so both results occur; true inputs use several
   non-zero bytes because any non-zero byte is true. */
static int bool_truth(const pattern *p, int r, uint64_t g) {
  uint64_t sel = g % (uint64_t)(p->n + 1);
  switch (p->rop) {
  case BRAID_SUM: case BRAID_MAX: case BRAID_BOR: return (uint64_t)r == sel;
  case BRAID_PROD: case BRAID_MIN: case BRAID_BAND: return (uint64_t)r != sel;
  default: return (int)(hash2(r, g) & 1);
  }
}

/* Writes rank r's input element g for a reduction. */
static void red_in(const pattern *p, int r, uint64_t g, void *dst) {
  switch (p->d->kind) {
  case K_FLOAT: pstore(p, dst, fval(p, r, g)); break;
  case K_COMPLEX: {
    double re, im;
    if (p->rop == BRAID_PROD) {
      cprod_val(p, r, g, &re, &im);
    } else {
      re = fval(p, r, 2 * g);
      im = fval(p, r, 2 * g + 1);
    }
    fstore(p->lane, dst, re);
    fstore(p->lane, (char *)dst + p->lane->size, im);
    break;
  }
  case K_BOOL: {
    static const uint8_t truthy[4] = {1, 2, 0x80, 0xff};
    *(uint8_t *)dst = bool_truth(p, r, g) ? truthy[(g + (uint64_t)r) % 4] : 0;
    break;
  }
  default: istore(p, dst, ival(p, r, g)); break;
  }
}

static double fcombine(const pattern *p, uint64_t x) {
  double acc = fval(p, 0, x);
  for (int r = 1; r < p->n; r++) {
    double v = fval(p, r, x);
    switch (p->rop) {
    case BRAID_PROD: acc *= v; break;
    case BRAID_MIN: acc = v < acc ? v : acc; break;
    case BRAID_MAX: acc = v > acc ? v : acc; break;
    default: acc += v; break;
    }
  }
  if (p->rop == BRAID_AVG) acc /= p->n;
  return acc;
}

/* 1 when the reduced element g at got is wrong. */
static int red_wrong(const pattern *p, uint64_t g, const void *got) {
  switch (p->d->kind) {
  case K_FLOAT: {
    double want = pround(p, fcombine(p, g) * (p->premul ? 2 : 1));
    return !(pload(p, got) == want);
  }
  case K_COMPLEX: {
    double wre, wim;
    if (p->rop == BRAID_PROD) {
      cprod_val(p, 0, g, &wre, &wim);
      for (int r = 1; r < p->n; r++) {
        double re, im;
        cprod_val(p, r, g, &re, &im);
        double t = wre * re - wim * im;
        wim = wre * im + wim * re;
        wre = t;
      }
    } else {
      wre = fcombine(p, 2 * g) * (p->premul ? 2 : 1);
      wim = fcombine(p, 2 * g + 1) * (p->premul ? 2 : 1);
    }
    wre = fround(p->lane, wre);
    wim = fround(p->lane, wim);
    return !(fload(p->lane, got) == wre && fload(p->lane, (const char *)got + p->lane->size) == wim);
  }
  case K_BOOL: {
    int acc = bool_truth(p, 0, g);
    for (int r = 1; r < p->n; r++) {
      int t = bool_truth(p, r, g);
      switch (p->rop) {
      case BRAID_SUM: case BRAID_MAX: case BRAID_BOR: acc |= t; break;
      case BRAID_BXOR: acc ^= t; break;
      default: acc &= t; break;
      }
    }
    return *(const uint8_t *)got != (uint8_t)acc;
  }
  default: {
    const int sgn = p->d->kind == K_SINT;
    uint64_t acc = ival(p, 0, g);
    for (int r = 1; r < p->n; r++) {
      uint64_t v = ival(p, r, g);
      switch (p->rop) {
      case BRAID_SUM: case BRAID_AVG: acc += v; break;
      case BRAID_PROD: acc *= v; break;
      case BRAID_MIN:
        if (sgn ? sext(v, p->bits) < sext(acc, p->bits) : v < acc) acc = v;
        break;
      case BRAID_MAX:
        if (sgn ? sext(v, p->bits) > sext(acc, p->bits) : v > acc) acc = v;
        break;
      case BRAID_BAND: acc &= v; break;
      case BRAID_BOR: acc |= v; break;
      default: acc ^= v; break;
      }
      acc &= p->mask;
    }
    if (p->premul) acc = (acc * 2) & p->mask;
    if (p->rop == BRAID_AVG) /* the wrapped sum, divided with truncation toward zero */
      acc = sgn ? (uint64_t)(sext(acc, p->bits) / p->n) : acc / (uint64_t)p->n;
    return iload(p, got) != (acc & p->mask);
  }
  }
}

/* Data-movement pattern: arbitrary bytes per (rank, element) so misplaced
   blocks are caught; bool stays 0/1. */
static void mv_in(const dtinfo *d, int r, uint64_t g, void *dst) {
  unsigned char *o = dst;
  if (d->kind == K_BOOL) {
    o[0] = (unsigned char)(hash2(r, g) & 1);
    return;
  }
  for (size_t b = 0; b < d->size; b += 8) {
    uint64_t h = hash2(r + 1, g * 2 + b / 8);
    size_t len = d->size - b < 8 ? d->size - b : 8;
    memcpy(o + b, &h, len);
  }
}

static int mv_wrong(const dtinfo *d, int r, uint64_t g, const void *got) {
  unsigned char want[16];
  mv_in(d, r, g, want);
  return memcmp(want, got, d->size) != 0;
}

/* ------------------------------------------------------------------ timing */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct job {
  perf_layer *L;
  perf_op op;
  braid_dtype dt;
  braid_op rop;
  int root;
  size_t count; /* elements per rank (see perf_layer) */
  int inplace;
  unsigned char *sbuf, *rbuf; /* what the checks fill and read (host mirrors of device buffers) */
  const void *send;
  void *recv;
  unsigned char *dsbuf, *drbuf; /* device buffers (L->to_device), else NULL */
  size_t span;                  /* bytes of each buffer a checked call may touch */
} job;

/* Device memory: a small buffer for the core's own reductions of host values. */
static void *g_dev_scalar;

static const char *g_prog = "braid-perf";

static void fail_exit(perf_layer *L, const char *what) {
  fprintf(stderr, "%s (rank %d, %s): %s failed: %s\n", g_prog, L->rank, L->backend, what, L->last_error(L->ctx));
  fflush(stderr);
  exit(PERF_EXIT_ERROR);
}

static void run1(const job *J) {
  if (J->L->run(J->L->ctx, J->op, J->send, J->recv, J->count, J->dt, J->rop, J->root, J->inplace))
    fail_exit(J->L, perf_op_name(J->op));
}

static void complete(perf_layer *L) {
  if (L->complete(L->ctx)) fail_exit(L, "completion (sync)");
}

/* One collective on an 8-byte host value, through device memory when the
   library takes only that. */
static void host_coll(perf_layer *L, perf_op op, void *v, braid_dtype dt, braid_op rop, const char *what) {
  void *p = v;
  if (L->to_device) {
    p = g_dev_scalar;
    if (L->to_device(L->ctx, p, v, 8)) fail_exit(L, what);
  }
  if (L->run(L->ctx, op, p, p, 1, dt, rop, 0, 1)) fail_exit(L, what);
  complete(L);
  if (L->to_device && L->to_host(L->ctx, v, p, 8)) fail_exit(L, what);
}

static double max_over_ranks(perf_layer *L, double v) {
  host_coll(L, PERF_ALLREDUCE, &v, BRAID_F64, BRAID_MAX, "all-reduce MAX of the times");
  return v;
}

static int64_t sum_over_ranks(perf_layer *L, int64_t v) {
  host_coll(L, PERF_ALLREDUCE, &v, BRAID_I64, BRAID_SUM, "all-reduce SUM of #wrong");
  return v;
}

static int64_t bcast_from0(perf_layer *L, int64_t v) {
  host_coll(L, PERF_BROADCAST, &v, BRAID_I64, BRAID_SUM, "broadcast of the iteration count");
  return v;
}

/* A checked call: with device buffers the filled mirrors go over first
   and the results come back after. */
static void run_checked(const job *J) {
  perf_layer *L = J->L;
  if (J->dsbuf && (L->to_device(L->ctx, J->dsbuf, J->sbuf, J->span) ||
                   L->to_device(L->ctx, J->drbuf, J->rbuf, J->span)))
    fail_exit(L, "copy to the device");
  run1(J);
  complete(L);
  if (J->dsbuf && (L->to_host(L->ctx, J->sbuf, J->dsbuf, J->span) || L->to_host(L->ctx, J->rbuf, J->drbuf, J->span)))
    fail_exit(L, "copy from the device");
}

/* Per-iteration seconds of the slowest rank over iters back-to-back calls. */
static double timed_loop(const job *J, long iters) {
  perf_layer *L = J->L;
  if (L->barrier(L->ctx)) fail_exit(L, "barrier");
  double t0 = now_s();
  for (long i = 0; i < iters; i++) run1(J);
  complete(L);
  double dt = (now_s() - t0) / (double)iters;
  return max_over_ranks(L, dt);
}

static double measure(const perf_args *a, const job *J) {
  long warm = a->warmup >= 0 ? a->warmup : DEFAULT_WARMUP;
  for (long i = 0; i < warm; i++) run1(J);
  complete(J->L);
  long iters = a->iters;
  if (iters <= 0) {
    /* Probe with 1, 4, 16, ... calls until a loop lasts a tenth of the target;
       every rank sees the same MAX-reduced time, so all leave together. */
    double probe = 0;
    for (long k = 1;; k *= 4) {
      probe = timed_loop(J, k);
      if (probe * (double)k >= a->target_s / 10 || k * 4 > MAX_ITERS) break;
    }
    double want = a->target_s / (probe > 1e-10 ? probe : 1e-10);
    iters = want > (double)MAX_ITERS ? MAX_ITERS : (long)want;
    if (iters < MIN_ITERS) iters = MIN_ITERS;
    iters = (long)bcast_from0(J->L, iters); /* rank 0's choice for everyone */
    long extra = iters / 10 > 0 ? iters / 10 : 1;
    for (long i = 0; i < extra; i++) run1(J);
    complete(J->L);
  }
  return timed_loop(J, iters);
}

/* ------------------------------------------------------------------ check */

static const unsigned char SENTINEL = 0xa5;

/* Fills the inputs for J, runs it once and returns this rank's wrong elements. */
static int64_t check_once(const job *J) {
  perf_layer *L = J->L;
  const dtinfo *d = dt_find(J->dt);
  const size_t esz = d->size, c = J->count;
  const int n = L->nranks, me = L->rank;
  pattern p;
  pattern_init(&p, J->dt, J->rop, n);
  int64_t bad = 0;
  switch (J->op) {
  case PERF_ALLREDUCE: {
    unsigned char *in = J->inplace ? J->rbuf : J->sbuf;
    for (size_t j = 0; j < c; j++) red_in(&p, me, j, in + j * esz);
    if (!J->inplace) memset(J->rbuf, SENTINEL, c * esz);
    if (L->barrier(L->ctx)) fail_exit(L, "barrier");
    run_checked(J);
    for (size_t j = 0; j < c; j++) bad += red_wrong(&p, j, J->rbuf + j * esz);
    break;
  }
  case PERF_REDUCE_SCATTER: {
    for (size_t g = 0; g < c * (size_t)n; g++) red_in(&p, me, g, J->sbuf + g * esz);
    unsigned char *out = J->rbuf;
    if (J->inplace) out = L->rs_inplace_result_at_start ? J->sbuf : J->sbuf + (size_t)me * c * esz;
    else memset(J->rbuf, SENTINEL, c * esz);
    if (L->barrier(L->ctx)) fail_exit(L, "barrier");
    run_checked(J);
    for (size_t j = 0; j < c; j++) bad += red_wrong(&p, (uint64_t)me * c + j, out + j * esz);
    break;
  }
  case PERF_BROADCAST:
    if (me == J->root)
      for (size_t j = 0; j < c; j++) mv_in(d, me, j, J->rbuf + j * esz);
    else
      memset(J->rbuf, SENTINEL, c * esz);
    if (L->barrier(L->ctx)) fail_exit(L, "barrier");
    run_checked(J);
    for (size_t j = 0; j < c; j++) bad += mv_wrong(d, J->root, j, J->rbuf + j * esz);
    break;
  case PERF_ALLGATHER: {
    memset(J->rbuf, SENTINEL, c * (size_t)n * esz);
    unsigned char *in = J->inplace ? J->rbuf + (size_t)me * c * esz : J->sbuf;
    for (size_t j = 0; j < c; j++) mv_in(d, me, j, in + j * esz);
    if (L->barrier(L->ctx)) fail_exit(L, "barrier");
    run_checked(J);
    for (int r = 0; r < n; r++)
      for (size_t j = 0; j < c; j++) bad += mv_wrong(d, r, j, J->rbuf + ((size_t)r * c + j) * esz);
    break;
  }
  case PERF_SENDRECV: {
    for (size_t j = 0; j < c; j++) mv_in(d, me, j, J->sbuf + j * esz);
    memset(J->rbuf, SENTINEL, c * esz);
    if (L->barrier(L->ctx)) fail_exit(L, "barrier");
    run_checked(J);
    int prev = (me - 1 + n) % n;
    for (size_t j = 0; j < c; j++) bad += mv_wrong(d, prev, j, J->rbuf + j * esz);
    break;
  }
  case PERF_REDUCE: {
    const int root = me == J->root;
    unsigned char *in = J->inplace && root ? J->rbuf : J->sbuf;
    for (size_t j = 0; j < c; j++) red_in(&p, me, j, in + j * esz);
    if (root && !J->inplace) memset(J->rbuf, SENTINEL, c * esz);
    if (L->barrier(L->ctx)) fail_exit(L, "barrier");
    run_checked(J);
    for (size_t j = 0; root && j < c; j++) bad += red_wrong(&p, j, J->rbuf + j * esz);
    break;
  }
  case PERF_GATHER: {
    const int root = me == J->root;
    if (root) memset(J->rbuf, SENTINEL, c * (size_t)n * esz);
    unsigned char *in = J->inplace && root ? J->rbuf + (size_t)me * c * esz : J->sbuf;
    for (size_t j = 0; j < c; j++) mv_in(d, me, j, in + j * esz);
    if (L->barrier(L->ctx)) fail_exit(L, "barrier");
    run_checked(J);
    for (int r = 0; root && r < n; r++)
      for (size_t j = 0; j < c; j++) bad += mv_wrong(d, r, j, J->rbuf + ((size_t)r * c + j) * esz);
    break;
  }
  case PERF_SCATTER: {
    const int root = me == J->root;
    for (int q = 0; root && q < n; q++)
      for (size_t j = 0; j < c; j++) mv_in(d, q, j, J->sbuf + ((size_t)q * c + j) * esz);
    unsigned char *out = J->inplace && root ? J->sbuf + (size_t)me * c * esz : J->rbuf;
    if (out == J->rbuf) memset(J->rbuf, SENTINEL, c * esz);
    if (L->barrier(L->ctx)) fail_exit(L, "barrier");
    run_checked(J);
    for (size_t j = 0; j < c; j++) bad += mv_wrong(d, me, j, out + j * esz);
    break;
  }
  case PERF_ALLTOALL: {
    unsigned char *in = J->inplace ? J->rbuf : J->sbuf;
    for (int q = 0; q < n; q++)
      for (size_t j = 0; j < c; j++) mv_in(d, me, (uint64_t)q * c + j, in + ((size_t)q * c + j) * esz);
    if (!J->inplace) memset(J->rbuf, SENTINEL, c * (size_t)n * esz);
    if (L->barrier(L->ctx)) fail_exit(L, "barrier");
    run_checked(J);
    for (int q = 0; q < n; q++)
      for (size_t j = 0; j < c; j++) bad += mv_wrong(d, q, (uint64_t)me * c + j, J->rbuf + ((size_t)q * c + j) * esz);
    break;
  }
  case PERF_ALLTOALLV: {
    size_t *v = malloc(4 * (size_t)n * sizeof *v);
    if (!v) fail_exit(L, "the all-to-allv check (out of memory)");
    size_t *sc = v, *sd = v + n, *rc = v + 2 * n, *rd = v + 3 * n;
    perf_a2av_counts(me, n, c, sc, sd, rc, rd);
    for (int q = 0; q < n; q++)
      for (size_t k = 0; k < sc[q]; k++) mv_in(d, me, ((uint64_t)q << 32) + k, J->sbuf + (sd[q] + k) * esz);
    memset(J->rbuf, SENTINEL, (rd[n - 1] + rc[n - 1]) * esz);
    if (L->barrier(L->ctx)) fail_exit(L, "barrier");
    run_checked(J);
    for (int q = 0; q < n; q++)
      for (size_t k = 0; k < rc[q]; k++) bad += mv_wrong(d, q, ((uint64_t)me << 32) + k, J->rbuf + (rd[q] + k) * esz);
    free(v);
    break;
  }
  default: break;
  }
  pattern_free(&p);
  return bad;
}

/* ------------------------------------------------------------------ output */

typedef struct result {
  int have;
  double time_s, algbw, busbw;
  int64_t wrong; /* -1: not checked */
} result;

static void fmt_time(char *out, size_t len, double us) {
  if (us >= 10000.0) snprintf(out, len, "%7.0f", us);
  else if (us >= 100.0) snprintf(out, len, "%7.1f", us);
  else snprintf(out, len, "%7.2f", us);
}

static void print_table_header(const perf_args *a, perf_layer *L, perf_op op, const char *hosts, size_t hostlen) {
  printf("# %s: %s, backend %s, %d rank%s, %s\n", a->prog, perf_op_name(op), L->backend, L->nranks,
         L->nranks == 1 ? "" : "s", L->library);
  if (op != PERF_BARRIER) {
    if (a->stepfactor > 1)
      printf("#  minBytes %zu maxBytes %zu step: %ld(factor)", a->minbytes, a->maxbytes, a->stepfactor);
    else
      printf("#  minBytes %zu maxBytes %zu step: %zu(bytes)", a->minbytes, a->maxbytes, a->stepbytes);
  } else {
    printf("# ");
  }
  printf(" warmup iters: %ld", a->warmup >= 0 ? a->warmup : DEFAULT_WARMUP);
  if (a->iters > 0) printf(" iters: %ld", a->iters);
  else printf(" iters: adaptive (~%g s per size)", a->target_s);
  printf(" validation: %d", a->check);
  if (L->to_device) printf(" buffers: device memory (library allocator)");
  else if (a->lib_mem) printf(" buffers: library allocator");
  printf("\n#\n");
  printf("# Using hosts\n");
  for (int r = 0; r < L->nranks; r++) printf("#  Rank %2d %s\n", r, hosts + (size_t)r * hostlen);
  printf("#\n");
  if (L->describe) L->describe(L->ctx, op, stdout);
  else printf("# algorithm: not reported by backend %s\n", L->backend);
  printf("#\n");
  printf("%-52s%-33s%s\n", "#", "            out-of-place", "              in-place");
  printf("#%11s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
  for (int k = 0; k < 2; k++) printf("  %7s  %6s  %6s  %6s", "time", "algbw", "busbw", "#wrong");
  printf("\n#%11s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
  printf("  %7s  %6s  %6s  %6s", "(us)", "(GB/s)", "(GB/s)", "");
  printf("  %7s  %6s  %6s\n", "(us)", "(GB/s)", "(GB/s)");
}

static void print_row(const perf_args *a, perf_op op, braid_dtype dt, braid_op rop, size_t bytes, size_t count,
                      const result res[2]) {
  const int reduces = op_reduces(op);
  printf("%12zu  %12zu  %8s  %6s  %6d", bytes, count, op == PERF_BARRIER ? "none" : perf_dtype_name(dt),
         reduces ? perf_redop_name(rop) : "none", op_rooted(op) ? a->root : -1);
  for (int k = 0; k < 2; k++) {
    if (!res[k].have) {
      printf("  %7s  %6s  %6s  %6s", "-", "-", "-", "-");
      continue;
    }
    char t[32], w[32];
    fmt_time(t, sizeof t, res[k].time_s * 1e6);
    if (res[k].wrong < 0) snprintf(w, sizeof w, "N/A");
    else snprintf(w, sizeof w, "%lld", (long long)res[k].wrong);
    printf("  %7s  %6.2f  %6.2f  %6s", t, res[k].algbw, res[k].busbw, w);
  }
  printf("\n");
  fflush(stdout);
}

/* s as a JSON string: the backend name may be a user's --label. */
static void json_string(char *out, size_t len, const char *s) {
  size_t o = 0;
  if (len < 3) {
    if (len) out[0] = 0;
    return;
  }
  out[o++] = '"';
  for (; *s && o + 8 < len; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') {
      out[o++] = '\\';
      out[o++] = (char)ch;
    } else if (ch < 0x20) {
      o += (size_t)snprintf(out + o, len - o, "\\u%04x", ch);
    } else {
      out[o++] = (char)ch;
    }
  }
  out[o++] = '"';
  out[o] = 0;
}

static void print_json(perf_layer *L, const perf_args *a, perf_op op, braid_dtype dt, braid_op rop, size_t bytes,
                       size_t count, int inplace, const result *r) {
  char wrong[32];
  if (r->wrong < 0) snprintf(wrong, sizeof wrong, "null");
  else snprintf(wrong, sizeof wrong, "%lld", (long long)r->wrong);
  char backend[256];
  json_string(backend, sizeof backend, L->backend);
  printf("{\"op\":\"%s\",\"backend\":%s,\"nranks\":%d,\"dtype\":\"%s\",\"redop\":\"%s\",\"root\":%d,"
         "\"size\":%zu,\"count\":%zu,\"inplace\":%s,\"mem\":\"%s\",\"time_us\":%.6g,\"algbw\":%.6g,\"busbw\":%.6g,"
         "\"wrong\":%s}\n",
         perf_op_name(op), backend, L->nranks, op == PERF_BARRIER ? "none" : perf_dtype_name(dt),
         op_reduces(op) ? perf_redop_name(rop) : "none", op_rooted(op) ? a->root : -1, bytes, count,
         inplace ? "true" : "false", L->to_device ? "device" : a->lib_mem ? "library" : "heap", r->time_s * 1e6, r->algbw, r->busbw, wrong);
  fflush(stdout);
}

/* ------------------------------------------------------------------ driver */

/* Host buffers: the library's (-R 1) or the heap's; with device buffers
   the host ones are mirrors from the heap. */
static void buf_free(const perf_args *a, perf_layer *L, void *p) {
  if (!p) return;
  if (a->lib_mem && !L->to_device) L->mem_free(L->ctx, p);
  else free(p);
}

static void dev_free(perf_layer *L, void *p) {
  if (p) L->mem_free(L->ctx, p);
}

typedef struct totals {
  int64_t wrong;
  double busbw_sum;
  long rows;
} totals;

/* Runs every size of one (op, dtype, redop) combination. */
/* Where a host-mirror pointer points in the device buffers. */
static const unsigned char *to_dev_ptr(const job *J, const void *p) {
  const unsigned char *q = p;
  if (q >= J->sbuf && q < J->sbuf + J->span) return J->dsbuf + (q - J->sbuf);
  return J->drbuf + (q - J->rbuf);
}

static void run_combo(const perf_args *a, perf_layer *L, perf_op op, braid_dtype dt, braid_op rop,
                      unsigned char *sbuf, unsigned char *rbuf, unsigned char *dsbuf, unsigned char *drbuf,
                      size_t bufbytes, totals *tot) {
  const int n = L->nranks;
  const size_t esz = perf_dtype_size(dt);
  const unsigned places = L->placements(L->ctx, op);
  const double factor = perf_bus_factor(op, n);
  size_t prev = (size_t)-1;
  for (size_t want = a->minbytes; want <= a->maxbytes;) {
    size_t unit = esz * (op_split_by_n(op) ? (size_t)n : 1);
    size_t bytes = op == PERF_BARRIER ? 0 : want / unit * unit;
    size_t count = op == PERF_BARRIER ? 0 : bytes / unit; /* per-rank element count */
    int skip = (op != PERF_BARRIER && bytes == 0) || bytes == prev;
    if (!skip) {
      prev = bytes;
      result res[2];
      memset(res, 0, sizeof res);
      for (int k = 0; k < 2; k++) {
        int inplace = k == 1;
        if (op == PERF_BARRIER ? inplace : !(places & (inplace ? PERF_INPLACE : PERF_OOP))) continue;
        job J = {L, op, dt, rop, a->root, count, inplace, sbuf, rbuf, NULL, NULL, dsbuf, drbuf, 0};
        size_t span = count * (size_t)n * esz + esz * (size_t)n; /* the most any op touches */
        J.span = span < bufbytes ? span : bufbytes;
        switch (op) {
        case PERF_ALLREDUCE: J.send = inplace ? rbuf : sbuf; J.recv = rbuf; break;
        case PERF_BROADCAST: J.send = rbuf; J.recv = rbuf; break;
        case PERF_ALLGATHER: J.send = inplace ? rbuf + (size_t)L->rank * count * esz : sbuf; J.recv = rbuf; break;
        case PERF_REDUCE_SCATTER:
          J.send = sbuf;
          J.recv = inplace ? sbuf + (size_t)L->rank * count * esz : rbuf;
          break;
        case PERF_SENDRECV: J.send = sbuf; J.recv = rbuf; break;
        /* rooted: in place at the root only */
        case PERF_REDUCE: J.send = inplace && L->rank == a->root ? rbuf : sbuf; J.recv = rbuf; break;
        case PERF_GATHER:
          J.send = inplace && L->rank == a->root ? rbuf + (size_t)a->root * count * esz : sbuf;
          J.recv = rbuf;
          break;
        case PERF_SCATTER:
          J.send = sbuf;
          J.recv = inplace && L->rank == a->root ? sbuf + (size_t)a->root * count * esz : rbuf;
          break;
        case PERF_ALLTOALL: J.send = inplace ? rbuf : sbuf; J.recv = rbuf; break;
        case PERF_ALLTOALLV: J.send = sbuf; J.recv = rbuf; break;
        default: break;
        }
        if (dsbuf) {
          J.send = to_dev_ptr(&J, J.send);
          J.recv = (void *)to_dev_ptr(&J, J.recv);
        }
        /* Timed loops run on zeros: in-place reductions would otherwise grow
           the values call after call (overflow, NaN, denormal slow paths). */
        if (bytes) {
          memset(sbuf, 0, bytes);
          memset(rbuf, 0, bytes);
          if (dsbuf && (L->to_device(L->ctx, dsbuf, sbuf, bytes) || L->to_device(L->ctx, drbuf, rbuf, bytes)))
            fail_exit(L, "copy to the device");
        }
        double t = measure(a, &J);
        res[k].have = 1;
        res[k].time_s = t;
        res[k].algbw = t > 0 ? (double)bytes / t / 1e9 : 0;
        res[k].busbw = res[k].algbw * factor;
        res[k].wrong = -1;
        if (a->check) {
          int64_t bad = op == PERF_BARRIER ? 0 : check_once(&J);
          res[k].wrong = sum_over_ranks(L, bad);
          tot->wrong += res[k].wrong;
        }
        tot->busbw_sum += res[k].busbw;
        tot->rows++;
        if (L->rank == 0 && a->json) print_json(L, a, op, dt, rop, bytes, count, inplace, &res[k]);
      }
      if (L->rank == 0 && !a->json) print_row(a, op, dt, rop, bytes, count, res);
    }
    if (op == PERF_BARRIER) break;
    if (a->stepfactor > 1) {
      if (want > a->maxbytes / (size_t)a->stepfactor) break;
      want *= (size_t)a->stepfactor;
    } else {
      if (want > a->maxbytes - a->stepbytes) break;
      want += a->stepbytes;
    }
  }
}

int perf_run(const perf_args *a, perf_layer *L) {
  const int n = L->nranks;
  g_prog = a->prog;
  if (a->root < 0 || a->root >= n) {
    if (L->rank == 0)
      fprintf(stderr,
              "%s: invalid value '%d' for -r (root): world size is %d, so the root must be 0..%d\n"
              "usage: %s OP [options]; '%s --help' lists OPs and options.\n",
              a->prog, a->root, n, n - 1, a->prog, a->prog);
    return PERF_EXIT_USAGE;
  }
  /* Which (dtype, redop) pairs run: explicit ones were validated by the parser. */
  braid_dtype dts[NDT];
  int ndt = 0;
  if (a->all_dtypes)
    for (size_t i = 0; i < NDT; i++) dts[ndt++] = DT[i].dt;
  else
    for (int i = 0; i < a->ndtypes; i++) dts[ndt++] = a->dtypes[i];
  braid_op rops[NREDOP];
  int nrop = 0;
  if (a->all_redops)
    for (int i = 0; i < NREDOP; i++) rops[nrop++] = (braid_op)i;
  else
    for (int i = 0; i < a->nredops; i++) rops[nrop++] = a->redops[i];

  /* A single explicitly named op whose dtype/op pair the library cannot run
     is a usage error; with OP all, -d all or -o all such pairs are skipped. */
  if (L->unsupported && !a->all_dtypes && !a->all_redops && a->ops[1] < 0)
    for (int i = 0; i < ndt; i++)
      for (int j = 0; j < nrop; j++) {
        const char *why = L->unsupported(L->ctx, (perf_op)a->ops[0], dts[i], rops[j]);
        if (why) {
          if (L->rank == 0) fprintf(stderr, "%s: %s\n", a->prog, why);
          return PERF_EXIT_USAGE;
        }
      }

  /* One pair of page-aligned buffers of the largest size serves every op. */
  size_t maxesz = 0;
  for (int i = 0; i < ndt; i++)
    if (perf_dtype_size(dts[i]) > maxesz) maxesz = perf_dtype_size(dts[i]);
  int data_ops = 0;
  for (int k = 0; a->ops[k] >= 0; k++) data_ops += a->ops[k] != PERF_BARRIER;
  size_t bufbytes = (data_ops ? a->maxbytes : 0) + maxesz * (size_t)n + 4096; /* barrier alone moves nothing */
  if (a->lib_mem && !L->mem_alloc) {
    if (L->rank == 0)
      fprintf(stderr, "%s: invalid value '1' for -R (mem): %s has no allocator of its own\n", a->prog, L->library);
    return PERF_EXIT_USAGE;
  }
  unsigned char *sbuf = NULL, *rbuf = NULL, *dsbuf = NULL, *drbuf = NULL;
  if (L->to_device) {
    /* Device buffers from the library, host mirrors for the checks. */
    dsbuf = L->mem_alloc(L->ctx, bufbytes);
    drbuf = dsbuf ? L->mem_alloc(L->ctx, bufbytes) : NULL;
    g_dev_scalar = drbuf ? L->mem_alloc(L->ctx, (size_t)n * 80 + 64) : NULL;
    if (!g_dev_scalar) {
      fprintf(stderr, "%s (rank %d): out of device memory for two buffers of %zu bytes: %s\n", a->prog, L->rank,
              bufbytes, L->last_error(L->ctx));
      return PERF_EXIT_ERROR;
    }
  }
  if (a->lib_mem && !L->to_device) {
    sbuf = L->mem_alloc(L->ctx, bufbytes);
    rbuf = sbuf ? L->mem_alloc(L->ctx, bufbytes) : NULL;
  } else if (posix_memalign((void **)&sbuf, 4096, bufbytes) || posix_memalign((void **)&rbuf, 4096, bufbytes)) {
    rbuf = NULL;
  }
  if (!sbuf || !rbuf) {
    fprintf(stderr, "%s (rank %d): out of memory for two buffers of %zu bytes%s%s\n", a->prog, L->rank, bufbytes,
            a->lib_mem ? ": " : "", a->lib_mem ? L->last_error(L->ctx) : "");
    buf_free(a, L, sbuf);
    return PERF_EXIT_ERROR;
  }
  memset(sbuf, 0, bufbytes);
  memset(rbuf, 0, bufbytes);
  if (dsbuf && (L->to_device(L->ctx, dsbuf, sbuf, bufbytes) || L->to_device(L->ctx, drbuf, rbuf, bufbytes)))
    fail_exit(L, "copy to the device");

  /* Host and pid of every rank, for the header (nccl-tests prints the same). */
  enum { HOSTLEN = 80 };
  char *hosts = calloc((size_t)n, HOSTLEN);
  char mine[HOSTLEN] = {0};
  char hn[64] = "?";
  gethostname(hn, sizeof hn);
  hn[sizeof hn - 1] = 0;
  snprintf(mine, sizeof mine, "Pid %6ld on %s", (long)getpid(), hn);
  if (!hosts) {
    fprintf(stderr, "%s (rank %d): out of memory\n", a->prog, L->rank);
    buf_free(a, L, sbuf);
    buf_free(a, L, rbuf);
    return PERF_EXIT_ERROR;
  }
  if (!a->json) {
    memcpy(hosts + (size_t)L->rank * HOSTLEN, mine, HOSTLEN);
    char *hb = L->to_device ? g_dev_scalar : hosts;
    if (L->to_device && L->to_device(L->ctx, hb + (size_t)L->rank * HOSTLEN, mine, HOSTLEN))
      fail_exit(L, "copy to the device");
    if (L->run(L->ctx, PERF_ALLGATHER, hb + (size_t)L->rank * HOSTLEN, hb, HOSTLEN, BRAID_U8, BRAID_SUM, 0, 1))
      fail_exit(L, "all-gather of host names");
    complete(L);
    if (L->to_device && L->to_host(L->ctx, hosts, hb, (size_t)n * HOSTLEN)) fail_exit(L, "copy from the device");
  }

  int64_t wrong_all = 0;
  for (int oi = 0; a->ops[oi] >= 0; oi++) {
    perf_op op = (perf_op)a->ops[oi];
    totals tot = {0, 0, 0};
    if (L->rank == 0 && !a->json) print_table_header(a, L, op, hosts, HOSTLEN);
    int ran = 0;
    for (int i = 0; i < ndt; i++) {
      /* Data movement ignores the reduction op; barrier ignores the dtype too. */
      int nr = op_reduces(op) ? nrop : 1;
      for (int j = 0; j < nr; j++) {
        braid_dtype dt = dts[i];
        braid_op rop = rops[j];
        if (op_reduces(op) && perf_redop_invalid(dt, rop)) continue;
        const char *why = L->unsupported ? L->unsupported(L->ctx, op, dt, rop) : NULL;
        if (why) {
          if (L->rank == 0 && !a->json) printf("# skipped %s %s: %s\n", perf_dtype_name(dt), perf_redop_name(rop), why);
          continue;
        }
        run_combo(a, L, op, dt, rop, sbuf, rbuf, dsbuf, drbuf, bufbytes, &tot);
        ran = 1;
      }
      if (op == PERF_BARRIER && ran) break;
    }
    const int has_oop = L->placements(L->ctx, op) & PERF_OOP, has_ip = L->placements(L->ctx, op) & PERF_INPLACE;
    if (L->rank == 0 && !a->json) {
      if (op != PERF_BARRIER && !has_oop)
        printf("# out-of-place: not applicable (%s is in place only in %s)\n", perf_op_name(op), L->backend);
      if (op != PERF_BARRIER && !has_ip)
        printf("# in-place: not applicable (%s is out of place only in %s)\n", perf_op_name(op), L->backend);
      if (a->check) printf("# Wrong elements       : %lld %s\n", (long long)tot.wrong, tot.wrong ? "FAILED" : "OK");
      else printf("# Wrong elements       : not checked (-c 0)\n");
      printf("# Avg bus bandwidth    : %g\n#\n", tot.rows ? tot.busbw_sum / (double)tot.rows : 0.0);
      fflush(stdout);
    }
    wrong_all += tot.wrong;
  }
  free(hosts);
  dev_free(L, dsbuf);
  dev_free(L, drbuf);
  dev_free(L, g_dev_scalar);
  buf_free(a, L, sbuf);
  buf_free(a, L, rbuf);
  return wrong_all ? PERF_EXIT_WRONG : PERF_EXIT_OK;
}
