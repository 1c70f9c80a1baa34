/* braid-perf, run as a program on the self backend: JSON fields, sizes,
   counts, bus-bandwidth factors, exact checks for several dtypes and ops,
   the table layout, and usage errors (exit 2 with a message). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

static const char *const FIELDS[] = {"op",   "backend", "nranks", "dtype",   "redop", "root",  "size",
                                     "count", "inplace", "time_us", "algbw", "busbw", "wrong"};

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
};

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
    BT_CHECK(jnum(obj, "root") == (strcmp(op->name, "broadcast") ? -1 : 0), "root: %s", obj);
    BT_CHECK(jnum(obj, "size") == (double)want_sizes[row], "size (want %zu): %s", want_sizes[row], obj);
    double count = jnum(obj, "count");
    BT_CHECK(count == (strcmp(op->name, "barrier") ? (double)(want_sizes[row] / esz) : 0), "count: %s", obj);
    jfield(obj, "inplace", v, sizeof v);
    const char *want_ip = place == 0 ? op->first_inplace : "true";
    BT_CHECK(!strcmp(v, want_ip), "inplace want %s: %s", want_ip, obj);
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
      {"alltoall", "invalid value 'alltoall' for OP"},
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
      {"broadcast -r 1 -n 1", "invalid value '1' for -r"},
      {"allreduce --bogus", "--bogus: unknown option"},
      {"allreduce -n", "-n: needs a value"},
  };
  for (size_t i = 0; i < BT_COUNT(cases); i++) {
    out r = run(cases[i].args, 1);
    BT_CHECK(r.status == 2, "braid-perf %s: exit %d, want 2", cases[i].args, r.status);
    BT_CHECK(strstr(r.text, cases[i].needle), "braid-perf %s: message lacks \"%s\": %s", cases[i].args,
             cases[i].needle, r.text);
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
  for (size_t i = 0; i < BT_COUNT(ops); i++) {
    char cmd[9000];
    snprintf(cmd, sizeof cmd,
             "env -u BRAID_STORE -u BRAID_TOKEN '%s' -n 2 --backend shm --timeout 60 -- '%s' %s --json -b 8 -e 4K "
             "-f 4 -n 3 -w 1 -d bf16 -r 1 2>&1",
             braidrun, bin, ops[i].op);
    FILE *p = popen(cmd, "r");
    BT_CHECK(p, "popen");
    char line[1024];
    int rows = 0;
    while (fgets(line, sizeof line, p)) {
      if (line[0] != '{') continue;
      double alg = jnum(line, "algbw"), bus = jnum(line, "busbw");
      BT_CHECK(jnum(line, "nranks") == 2, "%s", line);
      BT_CHECK(jnum(line, "wrong") == 0, "%s", line);
      BT_CHECK(fabs(bus - alg * ops[i].factor) <= 1e-5 * alg + 1e-12, "busbw factor %g: %s", ops[i].factor, line);
      rows++;
    }
    int st = pclose(p);
    BT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "braidrun %s exited %d", ops[i].op, st);
    BT_CHECK(rows > 0, "%s: no JSON rows", ops[i].op);
  }
  return 0;
}

static const bt_case cases[] = {
    BT_CASE(test_json_every_op_and_dtype), BT_CASE(test_json_redops), BT_CASE(test_table),
    BT_CASE(test_adaptive),                BT_CASE(test_usage_errors), BT_CASE(test_two_ranks),
};

int main(int argc, char **argv) {
  find_bin();
  if (!have_bin) printf("braid-perf not built (%s): nothing to test\n", bin);
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
