/* braid-perf, run as a program on the self backend: JSON fields, sizes,
   counts, bus-bandwidth factors, exact checks for several dtypes and ops,
   the table layout, and usage errors (exit 2 with a message). Then, in
   process, the measurement core itself (included below so its internals are
   reachable): the check patterns against braid's kernels in several
   reduction orders, its dtype tables and float codecs against braid's, and
   perf_run driven by a simulated library (call counts, wrong-element
   counts and exit status, byte counts at several ranks). Then braid-perf
   under braidrun on shm for every dtype/op pair at 3 and 4 ranks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../tools/braid-perf/perf_core.c"
#include "core/reduce.h"
#include "harness.h"

static char bin[4096];
static int have_bin;

static void find_bin(void) {
  const char *dir = getenv("BRAID_TEST_BINDIR");
  snprintf(bin, sizeof bin, "%s/tools/braid-perf/braid-perf", dir ? dir : ".");
  have_bin = access(bin, X_OK) == 0;
}

typedef struct out {
  char *text; /* stdout (and stderr when merged) */
  int status; /* exit status, or -1 */
} out;

/* Runs braid-perf ARGS on the self backend; merge: stderr into the text. */
static out run(const char *args, int merge) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd,
           "env -u BRAID_STORE -u BRAID_TOKEN BRAID_BACKEND=self BRAID_RANK=0 BRAID_WORLD_SIZE=1 '%s' %s %s", bin,
           args, merge ? "2>&1" : "2>/dev/null");
  out o = {NULL, -1};
  FILE *p = popen(cmd, "r");
  if (!p) return o;
  size_t cap = 1 << 16, len = 0;
  o.text = malloc(cap);
  for (;;) {
    if (len + 4096 + 1 > cap) o.text = realloc(o.text, cap *= 2);
    size_t k = fread(o.text + len, 1, 4096, p);
    if (!k) break;
    len += k;
  }
  o.text[len] = 0;
  int st = pclose(p);
  o.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

/* Value of "key" in one flat JSON object (string without quotes, or the raw
   number/true/false/null token); 0 if found. */
static int jfield(const char *obj, const char *key, char *val, size_t len) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(obj, pat);
  if (!p) return -1;
  p += strlen(pat);
  while (*p == ' ') p++;
  size_t n = 0;
  if (*p == '"') {
    p++;
    while (*p && *p != '"' && n + 1 < len) val[n++] = *p++;
    if (*p != '"') return -1;
  } else {
    while (*p && *p != ',' && *p != '}' && n + 1 < len) val[n++] = *p++;
  }
  val[n] = 0;
  return n ? 0 : -1;
}

static double jnum(const char *obj, const char *key) {
  char v[64];
  if (jfield(obj, key, v, sizeof v)) return NAN;
  char *end;
  double d = strtod(v, &end);
  return *end ? NAN : d;
}

static const char *const FIELDS[] = {"op",    "backend", "nranks",  "dtype", "redop", "root",  "size",
                                     "count", "inplace", "mem", "time_us", "algbw", "busbw", "wrong"};

typedef struct opspec {
  const char *name;
  int reduces;
  int split; /* size counts every rank's block */
  int placements; /* rows per size: 1 or 2 */
  const char *first_inplace; /* "true"/"false" of the first row of a size */
  double factor;  /* busbw / algbw at one rank */
} opspec;

static const opspec OPS[] = {
    {"allreduce", 1, 0, 1, "true", 0.0},      {"broadcast", 0, 0, 1, "true", 1.0},
    {"allgather", 0, 1, 2, "false", 0.0},     {"reduce_scatter", 1, 1, 2, "false", 0.0},
    {"sendrecv", 0, 0, 1, "false", 1.0},      {"barrier", 0, 0, 1, "false", 1.0},
    {"reduce", 1, 0, 2, "false", 1.0},        {"gather", 0, 1, 2, "false", 0.0},
    {"scatter", 0, 1, 2, "false", 0.0},       {"alltoall", 0, 1, 2, "false", 0.0},
    {"alltoallv", 0, 1, 1, "false", 0.0},
};

static int rooted(const char *op) {
  return !strcmp(op, "broadcast") || !strcmp(op, "reduce") || !strcmp(op, "gather") || !strcmp(op, "scatter");
}

/* Checks every JSON line of one run of op with dtype dt (element size esz)
   and redop rop over -b 8 -e 4K -f 4. */
static int check_json_run(const opspec *op, const char *dt, size_t esz, const char *rop, const char *text) {
  static const size_t req[] = {8, 32, 128, 512, 2048};
  size_t want_sizes[8], nwant = 0, prev = (size_t)-1;
  if (!strcmp(op->name, "barrier")) {
    want_sizes[nwant++] = 0;
  } else {
    for (size_t i = 0; i < BT_COUNT(req); i++) {
      size_t s = req[i] / esz * esz; /* one rank: the split unit is the element */
      if (s && s != prev) want_sizes[nwant++] = prev = s;
    }
  }
  size_t line = 0;
  const char *p = text;
  while (*p) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    char obj[1024];
    BT_CHECK(len < sizeof obj, "line too long");
    memcpy(obj, p, len);
    obj[len] = 0;
    p += len + (nl ? 1 : 0);
    if (!len) continue;
    BT_CHECK(obj[0] == '{' && obj[len - 1] == '}', "not a JSON object: %s", obj);
    char v[128];
    for (size_t f = 0; f < BT_COUNT(FIELDS); f++)
      BT_CHECK(jfield(obj, FIELDS[f], v, sizeof v) == 0, "field %s missing: %s", FIELDS[f], obj);
    size_t row = line / (size_t)op->placements, place = line % (size_t)op->placements;
    BT_CHECK(row < nwant, "%s %s: more rows than sizes: %s", op->name, dt, obj);
    jfield(obj, "op", v, sizeof v);
    BT_CHECK(!strcmp(v, op->name), "op %s: %s", v, obj);
    jfield(obj, "backend", v, sizeof v);
    BT_CHECK(!strcmp(v, "self"), "backend %s", v);
    BT_CHECK(jnum(obj, "nranks") == 1, "nranks: %s", obj);
    jfield(obj, "dtype", v, sizeof v);
    BT_CHECK(!strcmp(v, strcmp(op->name, "barrier") ? dt : "none"), "dtype: %s", obj);
    jfield(obj, "redop", v, sizeof v);
    BT_CHECK(!strcmp(v, op->reduces ? rop : "none"), "redop: %s", obj);
    BT_CHECK(jnum(obj, "root") == (rooted(op->name) ? 0 : -1), "root: %s", obj);
    BT_CHECK(jnum(obj, "size") == (double)want_sizes[row], "size (want %zu): %s", want_sizes[row], obj);
    double count = jnum(obj, "count");
    BT_CHECK(count == (strcmp(op->name, "barrier") ? (double)(want_sizes[row] / esz) : 0), "count: %s", obj);
    jfield(obj, "inplace", v, sizeof v);
    const char *want_ip = place == 0 ? op->first_inplace : "true";
    BT_CHECK(!strcmp(v, want_ip), "inplace want %s: %s", want_ip, obj);
    jfield(obj, "mem", v, sizeof v);
    BT_CHECK(!strcmp(v, "heap"), "mem want heap: %s", obj);
    double t = jnum(obj, "time_us"), alg = jnum(obj, "algbw"), bus = jnum(obj, "busbw");
    BT_CHECK(t > 0, "time_us: %s", obj);
    BT_CHECK(alg >= 0 && bus >= 0, "bandwidths: %s", obj);
    if (strcmp(op->name, "barrier")) {
      /* algbw = size / time in GB/s (6 significant digits printed). */
      double want_alg = want_sizes[row] / (t * 1e-6) / 1e9;
      BT_CHECK(fabs(alg - want_alg) <= 1e-4 * want_alg, "algbw %g, size/time %g: %s", alg, want_alg, obj);
    }
    BT_CHECK(fabs(bus - alg * op->factor) <= 1e-5 * alg, "busbw %g != algbw %g * %g: %s", bus, alg, op->factor,
             obj);
    BT_CHECK(jnum(obj, "wrong") == 0, "wrong elements: %s", obj);
    line++;
  }
  BT_CHECK(line == nwant * (size_t)op->placements, "%s %s: %zu rows, want %zu", op->name, dt, line,
           nwant * (size_t)op->placements);
  return 0;
}

static int test_json_every_op_and_dtype(void) {
  if (!have_bin) return 0;
  static const struct {
    const char *name;
    size_t size;
  } dts[] = {{"f32", 4}, {"f16", 2}, {"bf16", 2}, {"fp8_e4m3", 1}, {"i8", 1}, {"u64", 8}, {"c64", 8}};
  for (size_t o = 0; o < BT_COUNT(OPS); o++)
    for (size_t d = 0; d < BT_COUNT(dts); d++) {
      char args[256];
      snprintf(args, sizeof args, "%s --json -b 8 -e 4K -f 4 -n 3 -w 1 -d %s", OPS[o].name, dts[d].name);
      out r = run(args, 0);
      BT_CHECK(r.status == 0, "braid-perf %s exited %d", args, r.status);
      int bad = check_json_run(&OPS[o], dts[d].name, dts[d].size, "sum", r.text);
      if (bad) fprintf(stderr, "  (braid-perf %s)\n", args);
      free(r.text);
      if (bad) return 1;
    }
  return 0;
}

/* Every reduction op on the dtypes that define it, all exact (#wrong 0). */
static int test_json_redops(void) {
  if (!have_bin) return 0;
  static const struct {
    const char *op, *dt;
    size_t size;
  } cases[] = {
      {"prod", "f32", 4},      {"min", "f16", 2},       {"max", "bf16", 2},      {"avg", "fp8_e4m3", 1},
      {"avg", "i8", 1},        {"prod", "c64", 8},      {"avg", "c128", 16},     {"band", "u64", 8},
      {"bor", "i16", 2},       {"bxor", "u8", 1},       {"sum", "bool", 1},      {"min", "bool", 1},
      {"bxor", "bool", 1},     {"max", "i64", 8},       {"prod", "fp8_e5m2", 1}, {"avg", "f64", 8},
  };
  for (size_t i = 0; i < BT_COUNT(cases); i++)
    for (int rs = 0; rs < 2; rs++) {
      char args[256];
      snprintf(args, sizeof args, "%s --json -b 8 -e 4K -f 4 -n 3 -w 1 -d %s -o %s",
               rs ? "reduce_scatter" : "allreduce", cases[i].dt, cases[i].op);
      out r = run(args, 0);
      BT_CHECK(r.status == 0, "braid-perf %s exited %d", args, r.status);
      int bad = check_json_run(&OPS[rs ? 3 : 0], cases[i].dt, cases[i].size, cases[i].op, r.text);
      if (bad) fprintf(stderr, "  (braid-perf %s)\n", args);
      free(r.text);
      if (bad) return 1;
    }
  /* Every defined pair at once; undefined pairs are skipped, not errors. */
  out r = run("all --json -d all -o all -b 8 -e 64 -f 8 -n 1 -w 0", 0);
  BT_CHECK(r.status == 0, "-d all -o all exited %d", r.status);
  BT_CHECK(strstr(r.text, "\"dtype\":\"c128\",\"redop\":\"prod\""), "c128 prod missing");
  BT_CHECK(!strstr(r.text, "\"dtype\":\"c64\",\"redop\":\"min\""), "c64 min should be skipped");
  BT_CHECK(!strstr(r.text, "\"wrong\":1") && !strstr(r.text, "\"wrong\":null"), "wrong elements");
  free(r.text);
  return 0;
}

/* The nccl-tests table: header naming backend and world size, both placement
   groups, "-" for a placement braid lacks, and the footer. */
static int test_table(void) {
  if (!have_bin) return 0;
  out r = run("allreduce -b 8 -e 1K -f 2 -n 2", 0);
  BT_CHECK(r.status == 0, "exit %d", r.status);
  const char *must[] = {"backend self, 1 rank", "# Using hosts", "out-of-place", "in-place",
                        "#wrong", "(GB/s)", "# Avg bus bandwidth", "# Wrong elements       : 0 OK",
                        "not applicable (allreduce is in place only"};
  for (size_t i = 0; i < BT_COUNT(must); i++) BT_CHECK(strstr(r.text, must[i]), "table lacks \"%s\":\n%s", must[i], r.text);
  int rows = 0;
  for (const char *p = r.text; *p;) {
    const char *nl = strchr(p, '\n');
    if (*p != '#') {
      long long size, count;
      char type[16], redop[16], dash[8];
      int root;
      BT_CHECK(sscanf(p, "%lld %lld %15s %15s %d %7s", &size, &count, type, redop, &root, dash) == 6, "row: %.100s", p);
      BT_CHECK(size == 8LL << rows && count == size / 4, "row %d size %lld count %lld", rows, size, count);
      BT_CHECK(!strcmp(type, "f32") && !strcmp(redop, "sum") && root == -1 && !strcmp(dash, "-"), "row: %.100s", p);
      rows++;
    }
    if (!nl) break;
    p = nl + 1;
  }
  BT_CHECK(rows == 8, "%d rows (8..1K by 2)", rows);
  free(r.text);
  /* No check: #wrong is N/A in the table and null in JSON. */
  r = run("broadcast -b 64 -e 64 -n 2 -c 0 --json", 0);
  BT_CHECK(r.status == 0 && strstr(r.text, "\"wrong\":null"), "-c 0: %s", r.text);
  free(r.text);
  return 0;
}

/* Without -n the iteration count adapts to the --time target. */
static int test_adaptive(void) {
  if (!have_bin) return 0;
  out r = run("allreduce --json -b 4K -e 4K --time 0.02", 0);
  BT_CHECK(r.status == 0, "exit %d", r.status);
  BT_CHECK(jnum(r.text, "size") == 4096 && jnum(r.text, "wrong") == 0, "%s", r.text);
  free(r.text);
  r = run("sendrecv --json -b 1 -e 4K -f 4 -d u8 --time 0.005", 0);
  BT_CHECK(r.status == 0 && strstr(r.text, "\"size\":1,") && strstr(r.text, "\"size\":4096,"), "%s", r.text);
  free(r.text);
  return 0;
}

static int test_usage_errors(void) {
  if (!have_bin) return 0;
  static const struct {
    const char *args, *needle;
  } cases[] = {
      {"", "OP: missing"},
      {"alltoallw", "invalid value 'alltoallw' for OP"},
      {"reduce -o premulsum -d bool", "premulsum is not defined on bool"},
      {"allreduce -b abc", "invalid value 'abc' for -b"},
      {"allreduce -b 8 -e 1Q", "invalid value '1Q' for -e"},
      {"allreduce -b 1M -e 1K", "larger than -e"},
      {"allreduce -f 0", "invalid value '0' for -f"},
      {"allreduce -n 0", "invalid value '0' for -n"},
      {"allreduce -w -1", "invalid value '-1' for -w"},
      {"allreduce -d f12", "invalid value 'f12' for -d"},
      {"allreduce -o mean", "invalid value 'mean' for -o"},
      {"allreduce -o band -d f32", "bitwise ops"},
      {"reduce_scatter -o max -d c64", "complex types support"},
      {"allreduce -c 2", "invalid value '2' for -c"},
      {"allreduce -R 2", "invalid value '2' for -R"},
      {"broadcast -r 1 -n 1", "invalid value '1' for -r"},
      {"allreduce --bogus", "--bogus: unknown option"},
      {"allreduce -n", "-n: needs a value"},
      {"allreduce sum", "unexpected argument 'sum': OP is already 'allreduce'"},
      {"allreduce --json=1", "--json=1: unknown option"},
  };
  for (size_t i = 0; i < BT_COUNT(cases); i++) {
    out r = run(cases[i].args, 1);
    BT_CHECK(r.status == 2, "braid-perf %s: exit %d, want 2", cases[i].args, r.status);
    BT_CHECK(strstr(r.text, cases[i].needle), "braid-perf %s: message lacks \"%s\": %s", cases[i].args,
             cases[i].needle, r.text);
    /* Every usage error ends with the synopsis and where the full list is. */
    BT_CHECK(strstr(r.text, "usage: braid-perf OP [options]; 'braid-perf --help' lists"),
             "braid-perf %s: no usage sentence: %s", cases[i].args, r.text);
    BT_CHECK(!strchr(r.text, '{') && !strstr(r.text, "# Using hosts"), "braid-perf %s: ran anyway: %s",
             cases[i].args, r.text);
    free(r.text);
  }
  out r = run("--help", 0);
  BT_CHECK(r.status == 0 && strstr(r.text, "usage: braid-perf OP"), "--help: %d", r.status);
  free(r.text);
  return 0;
}

/* Two ranks under braidrun on the shm backend, when both are built: the bus
   factors at n = 2 (all-reduce 1, all-gather and reduce-scatter 1/2, others 1)
   and exact results for a low-precision type. */
static int test_two_ranks(void) {
  if (!have_bin) return 0;
  char braidrun[4200];
  snprintf(braidrun, sizeof braidrun, "%s", bin);
  char *slash = strstr(braidrun, "/tools/braid-perf/braid-perf");
  if (!slash) return 0;
  strcpy(slash, "/tools/braidrun/braidrun");
  int no_shm = 1;
  {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "env BRAID_BACKEND=shm BRAID_RANK=0 BRAID_WORLD_SIZE=1 '%s' barrier -n 1 2>&1", bin);
    FILE *p = popen(cmd, "r");
    char buf[4096] = {0};
    size_t k = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
    buf[k] = 0;
    if (p) pclose(p);
    no_shm = !p || strstr(buf, "unknown backend") != NULL;
  }
  if (no_shm || access(braidrun, X_OK) != 0) {
    printf("  (braidrun or the shm backend not built: skipped)\n");
    return 0;
  }
  static const struct {
    const char *op;
    double factor;
  } ops[] = {{"allreduce", 1.0}, {"allgather", 0.5}, {"reduce_scatter", 0.5}, {"broadcast", 1.0}, {"sendrecv", 1.0}};
  /* Heap buffers, then braid_mem_alloc buffers (-R 1) up to sizes that peers read in place. */
  for (size_t i = 0; i < 2 * BT_COUNT(ops); i++) {
    int lib = i >= BT_COUNT(ops);
    char cmd[9000];
    snprintf(cmd, sizeof cmd,
             "env -u BRAID_STORE -u BRAID_TOKEN '%s' -n 2 --backend shm --timeout 60 -- '%s' %s --json -b 8 -e %s "
             "-f 4 -n 3 -w 1 -d bf16 -r 1 -R %d 2>&1",
             braidrun, bin, ops[i % BT_COUNT(ops)].op, lib ? "1M" : "4K", lib);
    FILE *p = popen(cmd, "r");
    BT_CHECK(p, "popen");
    char line[1024];
    int rows = 0;
    const double factor = ops[i % BT_COUNT(ops)].factor;
    const char *name = ops[i % BT_COUNT(ops)].op;
    while (fgets(line, sizeof line, p)) {
      if (line[0] != '{') continue;
      double alg = jnum(line, "algbw"), bus = jnum(line, "busbw");
      char mem[32];
      BT_CHECK(jnum(line, "nranks") == 2, "%s", line);
      BT_CHECK(jnum(line, "wrong") == 0, "%s", line);
      BT_CHECK(fabs(bus - alg * factor) <= 1e-5 * alg + 1e-12, "busbw factor %g: %s", factor, line);
      BT_CHECK(jfield(line, "mem", mem, sizeof mem) == 0 && !strcmp(mem, lib ? "library" : "heap"), "mem: %s", line);
      rows++;
    }
    int st = pclose(p);
    BT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "braidrun %s -R %d exited %d", name, lib, st);
    BT_CHECK(rows > 0, "%s: no JSON rows", name);
  }
  return 0;
}

/* ================================================================ in process */

/* Names, sizes and the defined (dtype, op) pairs agree with braid's own
   tables, for every code braid knows: "-d" takes every braid dtype by name. */
static int test_core_tables(void) {
  int nbraid = 0;
  for (int code = 0; code < 64; code++) {
    braid_dtype dt = (braid_dtype)code;
    size_t want = braid_dtype_size(dt);
    BT_CHECK(perf_dtype_size(dt) == want, "dtype %d: size %zu, braid says %zu", code, perf_dtype_size(dt), want);
    if (!want) continue;
    nbraid++;
    BT_CHECK(!strcmp(perf_dtype_name(dt), braid_dtype_name(dt)), "dtype %d: %s, braid says %s", code,
             perf_dtype_name(dt), braid_dtype_name(dt));
    braid_dtype back = BRAID_F64;
    BT_CHECK(dtype_parse(braid_dtype_name(dt), &back) == 0 && back == dt, "-d %s not parsed", braid_dtype_name(dt));
    /* premulsum (the last) is not a braid_op code: braid_op_premul_sum makes it for every dtype but bool */
    BT_CHECK(!perf_redop_invalid(dt, PERF_PREMULSUM) == (dt != BRAID_BOOL), "%s premulsum", braid_dtype_name(dt));
    for (int op = 0; op < NREDOP - 1; op++) {
      int braid_ok = braid__check_dtype_op(dt, (braid_op)op) == BRAID_OK;
      const char *why = perf_redop_invalid(dt, (braid_op)op);
      BT_CHECK(braid_ok == (why == NULL), "%s %s: braid %s it, braid-perf says %s", braid_dtype_name(dt),
               braid_op_name((braid_op)op), braid_ok ? "defines" : "refuses", why ? why : "defined");
    }
  }
  BT_CHECK(nbraid == (int)NDT, "braid has %d dtypes, braid-perf knows %d", nbraid, (int)NDT);
  for (int op = 0; op < NREDOP - 1; op++)
    BT_CHECK(!strcmp(perf_redop_name((braid_op)op), braid_op_name((braid_op)op)), "op %d name", op);
  BT_CHECK(braid_op_name((braid_op)(NREDOP - 1)) == NULL, "braid has more reduction ops than braid-perf knows");
  BT_CHECK(PERF_PREMULSUM == (braid_op)(NREDOP - 1) && !strcmp(perf_redop_name(PERF_PREMULSUM), "premulsum"),
           "premulsum");
  return 0;
}

static float dec_f16(uint32_t v) { return braid__f16_to_f32((uint16_t)v); }
static float dec_bf16(uint32_t v) { return braid__bf16_to_f32((uint16_t)v); }
static float dec_e4m3(uint32_t v) { return braid__e4m3_to_f32((uint8_t)v); }
static float dec_e5m2(uint32_t v) { return braid__e5m2_to_f32((uint8_t)v); }
static uint32_t enc_f16(float f) { return braid__f32_to_f16(f); }
static uint32_t enc_bf16(float f) { return braid__f32_to_bf16(f); }
static uint32_t enc_e4m3(float f) { return braid__f32_to_e4m3(f); }
static uint32_t enc_e5m2(float f) { return braid__f32_to_e5m2(f); }

/* The check's own f16/bf16/fp8 codec (expected values are rounded with it)
   agrees with braid's conversions: every bit pattern decodes to the same
   value, and f32 inputs (every representable value, every midpoint between
   neighbours, the floats just around those, random bit patterns) round to
   the same pattern. */
static int test_core_small_floats(void) {
  static const struct {
    braid_dtype dt;
    float (*dec)(uint32_t);
    uint32_t (*enc)(float);
  } F[] = {{BRAID_F16, dec_f16, enc_f16},
           {BRAID_BF16, dec_bf16, enc_bf16},
           {BRAID_FP8_E4M3, dec_e4m3, enc_e4m3},
           {BRAID_FP8_E5M2, dec_e5m2, enc_e5m2}};
  for (size_t i = 0; i < BT_COUNT(F); i++) {
    const dtinfo *d = dt_find(F[i].dt);
    const uint32_t npat = 1u << (8 * d->size);
    for (uint32_t v = 0; v < npat; v++) {
      double mine = mf_decode(v, d->ebits, d->mbits, d->fn);
      float theirs = F[i].dec(v);
      BT_CHECK((isnan(mine) && isnan(theirs)) || (mine == (double)theirs && !signbit(mine) == !signbit(theirs)),
               "%s pattern 0x%x: braid-perf %g, braid %g", d->name, v, mine, (double)theirs);
    }
    unsigned long long rng = 0x5eed0000u + i;
    for (uint32_t v = 0; v < npat + 200000u; v++) {
      float xs[4];
      int nx = 0;
      if (v < npat) {
        float x = F[i].dec(v), y = F[i].dec(v + 1 < npat ? v + 1 : v);
        if (isnan(x) || isinf(x)) continue;
        xs[nx++] = x;
        if (!isnan(y) && !isinf(y) && signbit(x) == signbit(y)) {
          float mid = (float)(((double)x + (double)y) / 2); /* exact: narrow types have far fewer bits */
          xs[nx++] = mid;
          xs[nx++] = nextafterf(mid, INFINITY);
          xs[nx++] = nextafterf(mid, -INFINITY);
        }
      } else {
        uint32_t bits = (uint32_t)bt_rand(&rng);
        memcpy(&xs[0], &bits, 4);
        if (isnan(xs[0])) continue;
        nx = 1;
      }
      for (int k = 0; k < nx; k++) {
        uint32_t mine = mf_encode(xs[k], d->ebits, d->mbits, d->fn), theirs = F[i].enc(xs[k]);
        double dm = mf_decode(mine, d->ebits, d->mbits, d->fn), dt = mf_decode(theirs, d->ebits, d->mbits, d->fn);
        BT_CHECK(mine == theirs || (isnan(dm) && isnan(dt)), "%s of %a: braid-perf 0x%x (%g), braid 0x%x (%g)",
                 d->name, (double)xs[k], mine, dm, theirs, dt);
      }
    }
  }
  return 0;
}

/* One reduction of in[0..n-1] (G elements each) into res, the way some
   implementation might do it: kind 0 braid's one-pass kernel in rank order,
   1 the same in a shuffled order, 2 a chain of two-input steps rounded to the
   dtype after every step (a ring), 3 a binary tree of such steps, 4 braid's
   f32 accumulators in a shuffled order. */
static void reduce_as(int kind, unsigned char *res, unsigned char *in, unsigned char *tmp, unsigned char *acc,
                      const int *perm, int n, size_t G, braid_dtype dt, braid_op rop) {
  const size_t bytes = G * perf_dtype_size(dt);
  if (rop == PERF_PREMULSUM) { /* the sum, times 2 in the reduction precision (exact) */
    unsigned char two[16] = {0};
    const dtinfo *d = dt_find(dt);
    if (d->kind == K_COMPLEX) fstore(dt_find(d->size == 8 ? BRAID_F32 : BRAID_F64), two, 2);
    else if (d->kind == K_FLOAT) fstore(d, two, 2);
    else istore(&(pattern){.d = d}, two, 2);
    reduce_as(kind, res, in, tmp, acc, perm, n, G, dt, BRAID_SUM);
    if (braid__acc_size(dt) == perf_dtype_size(dt)) {
      braid__scale(res, res, G, dt, two);
    } else {
      braid__scale(acc, res, G, dt, two);
      braid__acc_store(res, acc, G, dt, BRAID_SUM, 1);
    }
    return;
  }
  const void *srcs[128];
  switch (kind) {
  case 0:
  case 1:
    for (int r = 0; r < n; r++) srcs[r] = in + (size_t)(kind ? perm[r] : r) * bytes;
    braid__reduce(res, srcs, n, G, dt, rop, n);
    return;
  case 2:
    srcs[0] = in + (size_t)perm[0] * bytes;
    braid__reduce(res, srcs, 1, G, dt, rop, 1); /* a copy, with bool normalized to 0/1 */
    for (int r = 1; r < n; r++) braid__reduce2(res, res, in + (size_t)perm[r] * bytes, G, dt, rop);
    break;
  case 3:
    for (int r = 0; r < n; r++) {
      srcs[0] = in + (size_t)perm[r] * bytes;
      braid__reduce(tmp + (size_t)r * bytes, srcs, 1, G, dt, rop, 1);
    }
    for (int step = 1; step < n; step *= 2)
      for (int r = 0; r + step < n; r += 2 * step)
        braid__reduce2(tmp + (size_t)r * bytes, tmp + (size_t)r * bytes, tmp + (size_t)(r + step) * bytes, G, dt,
                       rop);
    memcpy(res, tmp, bytes);
    break;
  default:
    braid__acc_load(acc, in + (size_t)perm[0] * bytes, G, dt);
    for (int r = 1; r < n; r++) braid__acc_reduce(acc, in + (size_t)perm[r] * bytes, G, dt, rop);
    braid__acc_store(res, acc, G, dt, rop, n);
    return;
  }
  if (rop == BRAID_AVG) braid__reduce_avg_finalize(res, G, dt, n); /* two-input steps only summed */
}

/* The check data is exact whatever the reduction order and whatever the
   intermediate rounding: for every dtype, every op braid defines on it and
   world sizes 1 to 100, five different reductions of the check inputs all
   match the expected values; and the check is not vacuous: an unreduced
   input, or the right result one element off, is caught. */
static int test_core_check_any_order(void) {
  static const int NS[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 100};
  unsigned long long rng = 12345;
  for (size_t di = 0; di < NDT; di++)
    for (int o = 0; o < NREDOP; o++) {
      const dtinfo *d = &DT[di];
      const braid_op rop = (braid_op)o;
      if (perf_redop_invalid(d->dt, rop)) continue;
      for (size_t ni = 0; ni < BT_COUNT(NS); ni++) {
        const int n = NS[ni];
        const size_t G = n <= 9 ? 2048 : 1024, esz = d->size, bytes = G * esz;
        unsigned char *in = malloc((size_t)n * bytes), *tmp = malloc((size_t)n * bytes), *res = malloc(bytes);
        unsigned char *acc = malloc(G * braid__acc_size(d->dt));
        int perm[128];
        BT_CHECK(in && tmp && res && acc, "out of memory");
        pattern p;
        pattern_init(&p, d->dt, rop, n);
        for (int r = 0; r < n; r++)
          for (size_t g = 0; g < G; g++) red_in(&p, r, g, in + (size_t)r * bytes + g * esz);
        for (int kind = 0; kind < 5; kind++) {
          for (int r = 0; r < n; r++) perm[r] = r;
          for (int r = n - 1; r > 0; r--) { /* Fisher-Yates */
            int k = (int)(bt_rand(&rng) % (unsigned long long)(r + 1)), t = perm[r];
            perm[r] = perm[k];
            perm[k] = t;
          }
          reduce_as(kind, res, in, tmp, acc, perm, n, G, d->dt, rop);
          long bad = 0;
          size_t first = G;
          for (size_t g = 0; g < G; g++)
            if (red_wrong(&p, g, res + g * esz)) {
              bad++;
              if (first == G) first = g;
            }
          BT_CHECK(bad == 0, "%s %s at %d ranks, reduction kind %d: %ld of %zu elements differ (first %zu)",
                   d->name, perf_redop_name(rop), n, kind, bad, G, first);
        }
        if (n >= 2) {
          long unreduced = 0, shifted = 0;
          for (size_t g = 0; g < G; g++) unreduced += red_wrong(&p, g, in + g * esz);
          for (size_t g = 0; g + 1 < G; g++) shifted += red_wrong(&p, g, res + (g + 1) * esz);
          BT_CHECK(unreduced > 0, "%s %s at %d ranks: rank 0's input passes as the result", d->name,
                   perf_redop_name(rop), n);
          /* Only the float AVG fallback (sum 0 everywhere) has one result for
             every element; it still catches a missing or extra contribution. */
          int uniform = rop == BRAID_AVG && p.avg_mode == 0 && d->kind != K_SINT && d->kind != K_UINT;
          BT_CHECK(uniform || shifted > 0, "%s %s at %d ranks: a result one element off passes", d->name,
                   perf_redop_name(rop), n);
        }
        pattern_free(&p);
        free(in);
        free(tmp);
        free(res);
        free(acc);
      }
    }
  return 0;
}

/* ---------------------------------------------------------- simulated library */

/* Rank `rank` of a world of n, in one process: the other ranks' inputs are
   the check patterns, generated where a real library would receive them. */
typedef struct mock {
  int rank, n;
  unsigned places;
  long calls;    /* calls of the operation under test */
  int corrupt;   /* the operation under test gets this many result elements wrong */
  int fail;      /* the operation under test fails */
  long sleep_us; /* each call of the operation under test lasts at least this long */
} mock;

/* The core's own calls: MAX of the times, SUM of #wrong, broadcast of the
   iteration count, all-gather of the host lines (80 bytes a rank). */
static int mock_internal(perf_op op, size_t count, braid_dtype dt) {
  return (op == PERF_ALLREDUCE && count == 1 && (dt == BRAID_F64 || dt == BRAID_I64)) ||
         (op == PERF_BROADCAST && count == 1 && dt == BRAID_I64) ||
         (op == PERF_ALLGATHER && count == 80 && dt == BRAID_U8);
}

static unsigned mock_placements(void *ctx, perf_op op) {
  (void)op;
  return ((mock *)ctx)->places;
}

static int mock_run(void *ctx, perf_op op, const void *send, void *recv, size_t count, braid_dtype dt, braid_op rop,
                    int root, int inplace) {
  mock *m = ctx;
  const int n = m->n, me = m->rank;
  const size_t esz = perf_dtype_size(dt);
  (void)inplace;
  if (mock_internal(op, count, dt)) {
    if (op == PERF_ALLGATHER)
      for (int r = 0; r < n; r++)
        if (r != me) memcpy((char *)recv + (size_t)r * count, (char *)recv + (size_t)me * count, count);
    return 0; /* in place: the other ranks add 0 and agree on the rest */
  }
  m->calls++;
  if (m->fail) return -1;
  if (m->sleep_us > 0) {
    double until = now_s() + (double)m->sleep_us * 1e-6;
    while (now_s() < until) usleep(100);
  }
  const dtinfo *d = dt_find(dt);
  unsigned char *res = recv;
  size_t nres = count;
  switch (op) {
  case PERF_ALLREDUCE:
  case PERF_REDUCE_SCATTER: {
    pattern p;
    pattern_init(&p, dt, rop, n);
    const size_t base = op == PERF_REDUCE_SCATTER ? (size_t)me * count : 0; /* first element of the result */
    unsigned char *others = malloc((size_t)n * count * esz + 1);
    const void *srcs[128];
    if (!others) return -1;
    for (int r = 0; r < n; r++) {
      if (r == me) {
        srcs[r] = (const unsigned char *)send + base * esz;
        continue;
      }
      for (size_t j = 0; j < count; j++) red_in(&p, r, base + j, others + ((size_t)r * count + j) * esz);
      srcs[r] = others + (size_t)r * count * esz;
    }
    braid__reduce(recv, srcs, n, count, dt, rop, n);
    free(others);
    pattern_free(&p);
    break;
  }
  case PERF_ALLGATHER:
    for (int r = 0; r < n; r++) {
      unsigned char *blk = res + (size_t)r * count * esz;
      if (r == me) {
        if (blk != send) memcpy(blk, send, count * esz);
      } else {
        for (size_t j = 0; j < count; j++) mv_in(d, r, j, blk + j * esz);
      }
    }
    nres = count * (size_t)n;
    break;
  case PERF_BROADCAST:
    if (me != root)
      for (size_t j = 0; j < count; j++) mv_in(d, root, j, res + j * esz);
    break;
  case PERF_SENDRECV: {
    int prev = (me - 1 + n) % n;
    if (prev == me) memcpy(recv, send, count * esz);
    else
      for (size_t j = 0; j < count; j++) mv_in(d, prev, j, res + j * esz);
    break;
  }
  default: nres = 0; break;
  }
  for (int k = 0; k < m->corrupt && (size_t)k < nres; k++) res[(size_t)k * esz] ^= 1; /* lowest bit of element k */
  return 0;
}

static int mock_ok(void *ctx) {
  (void)ctx;
  return 0;
}

static const char *mock_error(void *ctx) {
  (void)ctx;
  return "mock failure";
}

static perf_layer mock_layer(mock *m, const char *backend) {
  perf_layer L = {.backend = backend, .library = "mock 1.0", .rank = m->rank, .nranks = m->n, .ctx = m,
                  .placements = mock_placements, .unsupported = NULL, .run = mock_run, .complete = mock_ok,
                  .barrier = mock_ok, .last_error = mock_error, .describe = NULL, .rs_inplace_result_at_start = 0};
  return L;
}

/* Parses "OP options" as braid-perf would and runs the core with L; returns
   its stdout (caller frees) and sets *rc to its exit status. */
static char *run_core(const char *args, perf_layer *L, int *rc) {
  char buf[512];
  snprintf(buf, sizeof buf, "braid-perf %s", args);
  char *argv[64];
  int argc = 0;
  char *save = NULL;
  for (char *t = strtok_r(buf, " ", &save); t && argc < 63; t = strtok_r(NULL, " ", &save)) argv[argc++] = t;
  argv[argc] = NULL;
  perf_args a;
  *rc = perf_parse_args(argc, argv, &a, "braid-perf", 0);
  if (*rc >= 0) return strdup("");
  fflush(stdout);
  FILE *tmp = tmpfile();
  if (!tmp) return NULL;
  int saved = dup(1);
  dup2(fileno(tmp), 1);
  *rc = perf_run(&a, L);
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  fseek(tmp, 0, SEEK_END);
  long len = ftell(tmp);
  rewind(tmp);
  char *text = malloc((size_t)len + 1);
  size_t got = text ? fread(text, 1, (size_t)len, tmp) : 0;
  if (text) text[got] = 0;
  fclose(tmp);
  return text;
}

/* Counts JSON lines of text and checks field key of each equals want. */
static int json_rows(const char *text, const char *key, double want, int *rows) {
  *rows = 0;
  for (const char *p = text; (p = strchr(p, '{')) != NULL; p++) {
    BT_CHECK(jnum(p, key) == want, "%s: want %g in %.300s", key, want, p);
    (*rows)++;
  }
  return 0;
}

/* With -n and -w the operation runs exactly warm-up + iterations (+1 when
   checking) times per size and placement. */
static int test_core_call_counts(void) {
  mock m = {0, 1, PERF_OOP | PERF_INPLACE, 0, 0, 0, 0};
  perf_layer L = mock_layer(&m, "mock");
  int rc, rows;
  char *t = run_core("allreduce --json -b 64 -e 64 -n 7 -w 3", &L, &rc);
  BT_CHECK(rc == 0 && m.calls == 2 * (3 + 7 + 1), "exit %d, %ld calls, want 22", rc, m.calls);
  BT_CHECK(json_rows(t, "wrong", 0, &rows) == 0 && rows == 2, "%d rows: %s", rows, t);
  BT_CHECK(json_rows(t, "count", 16, &rows) == 0 && rows == 2, "count: %s", t);
  free(t);
  m.calls = 0;
  t = run_core("reduce_scatter --json -b 64 -e 256 -n 5 -w 0 -c 0", &L, &rc);
  BT_CHECK(rc == 0 && m.calls == 3 * 2 * 5, "-c 0: exit %d, %ld calls, want 30", rc, m.calls);
  BT_CHECK(strstr(t, "\"wrong\":null") && !strstr(t, "\"wrong\":0"), "-c 0: %s", t);
  free(t);
  m.calls = 0;
  t = run_core("barrier --json -n 5 -w 2", &L, &rc);
  BT_CHECK(rc == 0 && m.calls == 7, "barrier: exit %d, %ld calls, want 7", rc, m.calls);
  BT_CHECK(json_rows(t, "size", 0, &rows) == 0 && rows == 1, "barrier rows: %s", t);
  free(t);
  return 0;
}

/* Without -n the count follows --time: with calls of at least 2 ms and a
   0.02 s target, one probe call, then 3..10 timed calls (never more: each
   lasts 2 ms or longer), one extra warm-up call and the check. */
static int test_core_adaptive(void) {
  mock m = {0, 1, PERF_INPLACE, 0, 0, 0, 2000};
  perf_layer L = mock_layer(&m, "mock");
  int rc;
  char *t = run_core("allreduce -b 64 -e 64 -w 0 --time 0.02", &L, &rc);
  BT_CHECK(rc == 0, "exit %d", rc);
  BT_CHECK(m.calls >= 1 + 3 + 1 + 1 && m.calls <= 1 + 10 + 1 + 1, "%ld calls, want 6..13", m.calls);
  BT_CHECK(strstr(t, "iters: adaptive (~0.02 s per size)"), "header: %s", t);
  free(t);
  return 0;
}

/* Wrong elements are counted one by one, in the rows, the footer and the
   exit status, for every operation, whatever the dtype. */
static int test_core_wrong(void) {
  static const char *const ops[] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "sendrecv"};
  mock m = {0, 1, PERF_OOP | PERF_INPLACE, 0, 3, 0, 0};
  perf_layer L = mock_layer(&m, "mock");
  int rc, rows;
  for (size_t i = 0; i < BT_COUNT(ops); i++) {
    char args[128];
    snprintf(args, sizeof args, "%s --json -b 64 -e 256 -n 1 -w 0", ops[i]);
    char *t = run_core(args, &L, &rc);
    BT_CHECK(rc == PERF_EXIT_WRONG, "%s: exit %d, want %d", ops[i], rc, PERF_EXIT_WRONG);
    BT_CHECK(json_rows(t, "wrong", 3, &rows) == 0 && rows == 6, "%s: %d rows: %s", ops[i], rows, t);
    free(t);
    snprintf(args, sizeof args, "%s -b 64 -e 256 -n 1 -w 0", ops[i]);
    t = run_core(args, &L, &rc);
    BT_CHECK(rc == PERF_EXIT_WRONG && strstr(t, "# Wrong elements       : 18 FAILED"), "%s table: %s", ops[i], t);
    free(t);
  }
  static const char *const dts[] = {"bf16", "fp8_e4m3", "fp8_e5m2", "bool", "c128", "i8", "u64"};
  m.corrupt = 1;
  for (size_t i = 0; i < BT_COUNT(dts); i++) {
    char args[128];
    snprintf(args, sizeof args, "allreduce --json -b 64 -e 64 -n 1 -w 0 -d %s -o %s", dts[i],
             strcmp(dts[i], "bool") ? "avg" : "max");
    char *t = run_core(args, &L, &rc);
    BT_CHECK(rc == PERF_EXIT_WRONG && json_rows(t, "wrong", 1, &rows) == 0 && rows == 2, "%s: exit %d: %s", dts[i],
             rc, t);
    free(t);
  }
  /* Not checked: nothing counted, exit 0. */
  char *t = run_core("allreduce --json -b 64 -e 64 -n 1 -w 0 -c 0", &L, &rc);
  BT_CHECK(rc == 0 && strstr(t, "\"wrong\":null"), "-c 0: exit %d: %s", rc, t);
  free(t);
  return 0;
}

/* As rank 0 of 2 to 5 ranks: sizes, counts and bus factors per operation
   (all-gather and reduce-scatter count the whole n-rank buffer), the check
   of the other ranks' blocks, and the root. */
static int test_core_many_ranks(void) {
  for (int n = 2; n <= 5; n++) {
    mock m = {0, n, PERF_OOP | PERF_INPLACE, 0, 0, 0, 0};
    perf_layer L = mock_layer(&m, "mock");
    const double nn = n;
    const struct {
      const char *args;
      size_t size, count;
      double factor;
    } c[] = {
        {"allreduce -b 100 -e 100 -d f32", 100, 25, 2 * (nn - 1) / nn},
        {"allreduce -b 100 -e 100 -d bf16 -o avg", 100, 50, 2 * (nn - 1) / nn},
        {"allreduce -b 100 -e 100 -d fp8_e5m2 -o prod", 100, 100, 2 * (nn - 1) / nn},
        {"allreduce -b 100 -e 100 -d c64 -o sum", 96, 12, 2 * (nn - 1) / nn},
        {"reduce_scatter -b 100 -e 100 -d f32", 100 / (4 * (size_t)n) * 4 * (size_t)n, 100 / (4 * (size_t)n),
         (nn - 1) / nn},
        {"reduce_scatter -b 100 -e 100 -d i16 -o min", 100 / (2 * (size_t)n) * 2 * (size_t)n, 100 / (2 * (size_t)n),
         (nn - 1) / nn},
        {"allgather -b 100 -e 100 -d f32", 100 / (4 * (size_t)n) * 4 * (size_t)n, 100 / (4 * (size_t)n),
         (nn - 1) / nn},
        {"broadcast -b 100 -e 100 -d u8", 100, 100, 1},
        {"sendrecv -b 100 -e 100 -d f64", 96, 12, 1},
    };
    for (size_t i = 0; i < BT_COUNT(c); i++) {
      char args[256];
      snprintf(args, sizeof args, "%s --json -n 2 -w 0 -r %d", c[i].args, n - 1);
      int rc, rows = 0;
      char *t = run_core(args, &L, &rc);
      BT_CHECK(rc == 0, "%d ranks, %s: exit %d", n, args, rc);
      for (const char *p = t; (p = strchr(p, '{')) != NULL; p++, rows++) {
        double tu = jnum(p, "time_us"), alg = jnum(p, "algbw"), bus = jnum(p, "busbw");
        BT_CHECK(jnum(p, "nranks") == n && jnum(p, "wrong") == 0, "%s: %.300s", args, p);
        BT_CHECK(jnum(p, "size") == (double)c[i].size && jnum(p, "count") == (double)c[i].count,
                 "%d ranks, %s: want size %zu count %zu: %.300s", n, args, c[i].size, c[i].count, p);
        BT_CHECK(jnum(p, "root") == (strstr(args, "broadcast") ? n - 1 : -1), "root: %.300s", p);
        BT_CHECK(fabs(alg - (double)c[i].size / (tu * 1e-6) / 1e9) <= 1e-4 * alg, "algbw: %.300s", p);
        /* Both figures are printed to 6 significant digits. */
        BT_CHECK(fabs(bus - alg * c[i].factor) <= 1e-5 * bus, "busbw factor %g: %.300s", c[i].factor, p);
      }
      BT_CHECK(rows == 2, "%d ranks, %s: %d rows: %s", n, args, rows, t);
      free(t);
    }
    /* A root beyond the world is a usage error. */
    char args[64];
    snprintf(args, sizeof args, "broadcast --json -n 1 -r %d", n);
    int rc;
    char *t = run_core(args, &L, &rc);
    BT_CHECK(rc == PERF_EXIT_USAGE && !strchr(t, '{'), "-r %d at %d ranks: exit %d", n, n, rc);
    free(t);
  }
  return 0;
}

/* A failing library call ends the run with exit 3 and a sentence naming the
   rank, backend, operation and the library's message. */
static int test_core_library_error(void) {
  FILE *err = tmpfile();
  BT_CHECK(err, "tmpfile");
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  BT_CHECK(pid >= 0, "fork");
  if (pid == 0) {
    dup2(fileno(err), 2);
    mock m = {0, 1, PERF_INPLACE, 0, 0, 1, 0};
    perf_layer L = mock_layer(&m, "mock");
    int rc;
    free(run_core("allreduce -b 64 -e 64 -n 1", &L, &rc));
    _exit(100 + rc); /* not reached: the failure exits */
  }
  int st = 0;
  waitpid(pid, &st, 0);
  char msg[512] = {0};
  rewind(err);
  size_t k = fread(msg, 1, sizeof msg - 1, err);
  msg[k] = 0;
  fclose(err);
  BT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == PERF_EXIT_ERROR, "status %d, want exit 3", st);
  BT_CHECK(strstr(msg, "braid-perf (rank 0, mock): allreduce failed: mock failure"), "message: %s", msg);
  return 0;
}

/* -R 1 with a layer that has no allocator of its own is a usage error;
   with one, every buffer comes from it and goes back to it. */
static int alloc_calls, free_calls;
static void *mock_alloc(void *ctx, size_t bytes) {
  (void)ctx;
  alloc_calls++;
  return calloc(1, bytes);
}
static void mock_free(void *ctx, void *p) {
  (void)ctx;
  free_calls++;
  free(p);
}

static int test_core_lib_mem(void) {
  mock m = {0, 1, PERF_INPLACE | PERF_OOP, 0, 0, 0, 0};
  perf_layer L = mock_layer(&m, "mock");
  int rc;
  free(run_core("allgather -b 64 -e 4K -n 2 -R 1", &L, &rc));
  BT_CHECK(rc == PERF_EXIT_USAGE, "no allocator: exit %d, want 2", rc);
  L.mem_alloc = mock_alloc;
  L.mem_free = mock_free;
  char *o = run_core("allgather -b 64 -e 4K -n 2 -R 1", &L, &rc);
  BT_CHECK(rc == PERF_EXIT_OK && o && strstr(o, "buffers: library allocator"), "exit %d: %s", rc, o ? o : "");
  BT_CHECK(alloc_calls == 2 && free_calls == 2, "%d allocations, %d frees, want 2 and 2", alloc_calls, free_calls);
  free(o);
  return 0;
}

/* The backend name is a JSON string even when a label has quotes in it. */
static int test_core_json_string(void) {
  mock m = {0, 1, PERF_INPLACE, 0, 0, 0, 0};
  perf_layer L = mock_layer(&m, "a\"b\\c\td");
  int rc;
  char *t = run_core("barrier --json -n 1", &L, &rc);
  BT_CHECK(rc == 0 && strstr(t, "\"backend\":\"a\\\"b\\\\c\\u0009d\","), "%s", t);
  free(t);
  return 0;
}

/* ---------------------------------------------------------- several ranks on shm */

static int braidrun_path(char *path, size_t len) {
  snprintf(path, len, "%s", bin);
  char *slash = strstr(path, "/tools/braid-perf/braid-perf");
  if (!slash) return -1;
  strcpy(slash, "/tools/braidrun/braidrun");
  return access(path, X_OK);
}

static int shm_built(void) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "env BRAID_BACKEND=shm BRAID_RANK=0 BRAID_WORLD_SIZE=1 '%s' barrier -n 1 2>&1", bin);
  FILE *p = popen(cmd, "r");
  if (!p) return 0;
  char buf[4096];
  size_t k = fread(buf, 1, sizeof buf - 1, p);
  buf[k] = 0;
  pclose(p);
  return strstr(buf, "unknown backend") == NULL;
}

/* Runs cmd and returns its stdout (caller frees); *status: exit status or -1. */
static char *run_shell(const char *cmd, int *status) {
  FILE *p = popen(cmd, "r");
  *status = -1;
  if (!p) return NULL;
  size_t cap = 1 << 16, len = 0;
  char *text = malloc(cap);
  for (;;) {
    if (len + 4096 + 1 > cap) text = realloc(text, cap *= 2);
    size_t k = fread(text + len, 1, 4096, p);
    if (!k) break;
    len += k;
  }
  text[len] = 0;
  int st = pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return text;
}

/* Every dtype/op pair braid defines (premulsum included), every operation, at 3 and 4 ranks on
   shm with a small staging buffer so the larger sizes take several rounds:
   all exact (#wrong 0), every pair present. */
static int test_shm_every_pair(void) {
  char braidrun[4200];
  if (!have_bin || braidrun_path(braidrun, sizeof braidrun) != 0 || !shm_built()) {
    printf("  (braidrun or the shm backend not built: skipped)\n");
    return 0;
  }
  int want = 0; /* (op, dtype, redop) combinations */
  for (size_t di = 0; di < NDT; di++)
    for (int o = 0; o < NREDOP; o++) want += 3 * !perf_redop_invalid(DT[di].dt, (braid_op)o);
  /* broadcast, allgather, sendrecv, gather, scatter, alltoall, alltoallv per dtype; barrier */
  want += 7 * (int)NDT + 1;
  for (int n = 3; n <= 4; n++) {
    char cmd[9000];
    snprintf(cmd, sizeof cmd,
             "env -u BRAID_STORE -u BRAID_TOKEN BRAID_SHM_BUFFER=64K '%s' -n %d --backend shm --timeout 120 -- '%s' "
             "all --json -d all -o all -b 16 -e 128K -f 8 -n 1 -w 0 2>&1",
             braidrun, n, bin);
    int st;
    char *t = run_shell(cmd, &st);
    BT_CHECK(t && st == 0, "%d ranks: exit %d: %.2000s", n, st, t ? t : "");
    static char seen[32768];
    snprintf(seen, sizeof seen, "|");
    int combos = 0, rows = 0;
    double largest = 0;
    for (char *p = t; (p = strchr(p, '{')) != NULL; p++, rows++) {
      char op[32], dt[32], rop[32], key[128];
      BT_CHECK(jfield(p, "op", op, sizeof op) == 0 && jfield(p, "dtype", dt, sizeof dt) == 0 &&
                   jfield(p, "redop", rop, sizeof rop) == 0,
               "row: %.300s", p);
      BT_CHECK(jnum(p, "nranks") == n && jnum(p, "wrong") == 0, "%d ranks: %.300s", n, p);
      if (jnum(p, "size") > largest) largest = jnum(p, "size");
      snprintf(key, sizeof key, "|%s %s %s|", op, dt, rop);
      if (!strstr(seen, key) && strlen(seen) + strlen(key) < sizeof seen) {
        strcat(seen, key + 1);
        combos++;
      }
    }
    BT_CHECK(combos == want, "%d ranks: %d (op, dtype, redop) combinations in %d rows, want %d", n, combos, rows,
             want);
    BT_CHECK(largest >= 64 * 1024, "largest size %g: no multi-round transfer", largest);
    free(t);
  }
  return 0;
}

/* The table header on shm: backend, world size, every rank's host, the
   backend's settings from the environment, and never the job token. */
static int test_shm_header(void) {
  char braidrun[4200];
  if (!have_bin || braidrun_path(braidrun, sizeof braidrun) != 0 || !shm_built()) {
    printf("  (braidrun or the shm backend not built: skipped)\n");
    return 0;
  }
  char cmd[9000];
  snprintf(cmd, sizeof cmd,
           "env -u BRAID_STORE -u BRAID_TOKEN BRAID_SHM_BUFFER=64K BRAID_SHM_CMA=0 '%s' -n 2 --backend shm "
           "--timeout 60 -- '%s' allreduce -b 8 -e 64 -n 1 -w 0 2>&1",
           braidrun, bin);
  int st;
  char *t = run_shell(cmd, &st);
  BT_CHECK(t && st == 0, "exit %d: %s", st, t ? t : "");
  const char *must[] = {"backend shm, 2 ranks", "#  Rank  0 Pid", "#  Rank  1 Pid", "# algorithm: not reported",
                        "# settings: ", "BRAID_SHM_BUFFER=64K", "BRAID_SHM_CMA=0", "# Avg bus bandwidth"};
  for (size_t i = 0; i < BT_COUNT(must); i++) BT_CHECK(strstr(t, must[i]), "header lacks \"%s\":\n%s", must[i], t);
  BT_CHECK(!strstr(t, "BRAID_TOKEN") && !strstr(t, "BRAID_STORE"), "header shows launcher variables:\n%s", t);
  free(t);
  return 0;
}

static const bt_case cases[] = {
    BT_CASE(test_json_every_op_and_dtype), BT_CASE(test_json_redops),      BT_CASE(test_table),
    BT_CASE(test_adaptive),                BT_CASE(test_usage_errors),     BT_CASE(test_two_ranks),
    BT_CASE(test_core_tables),             BT_CASE(test_core_small_floats), BT_CASE(test_core_check_any_order),
    BT_CASE(test_core_call_counts),        BT_CASE(test_core_adaptive),    BT_CASE(test_core_wrong),
    BT_CASE(test_core_many_ranks),         BT_CASE(test_core_library_error), BT_CASE(test_core_json_string),
    {"test_shm_every_pair", test_shm_every_pair, 400}, BT_CASE(test_shm_header),       BT_CASE(test_core_lib_mem),
};

int main(int argc, char **argv) {
  find_bin();
  if (!have_bin) printf("braid-perf not built (%s): nothing to test\n", bin);
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
