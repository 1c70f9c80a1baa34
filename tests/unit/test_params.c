/* The parameter list: strict parsers (good and bad values, the messages),
   accessors that fall back to the list's defaults, the defaults themselves,
   and the copies of the list in the docs: the generated table in
   docs/ENVIRONMENT.md and the defaults README.md's Environment table names. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/params.h"
#include "harness.h"

/* ---------------------------------------------------------------- parsers */

static int test_parse_long(void) {
  static const struct {
    const char *s;
    long lo, hi;
    int ok;
    long want;
  } cases[] = {
      {"0", 0, 100, 1, 0},        {"100", 0, 100, 1, 100},   {"7", 0, 100, 1, 7},          {"007", 0, 100, 1, 7},
      {"-5", -5, 5, 1, -5},       {"101", 0, 100, 0, 0},     {"-1", 0, 100, 0, 0},         {" -1", 0, 100, 0, 0},
      {" 1", 0, 100, 0, 0},       {"1 ", 0, 100, 0, 0},      {"+1", 0, 100, 0, 0},         {"", 0, 100, 0, 0},
      {"1x", 0, 100, 0, 0},       {"0x10", 0, 100, 0, 0},    {"1.0", 0, 100, 0, 0},        {"-", -5, 5, 0, 0},
      {"--1", -5, 5, 0, 0},       {"- 1", -5, 5, 0, 0},      {"-6", -5, 5, 0, 0},          {"+1", -5, 5, 0, 0},
      {"99999999999999999999", 0, LONG_MAX, 0, 0},           {"9223372036854775807", 0, LONG_MAX, 1, LONG_MAX},
  };
  for (size_t i = 0; i < BT_COUNT(cases); i++) {
    long x = -12345;
    int r = braid__parse_long(cases[i].s, cases[i].lo, cases[i].hi, &x);
    BT_CHECK((r == 0) == cases[i].ok, "\"%s\" in [%ld, %ld]: %s", cases[i].s, cases[i].lo, cases[i].hi,
             r == 0 ? "accepted" : "rejected");
    if (cases[i].ok) BT_CHECK(x == cases[i].want, "\"%s\" gave %ld", cases[i].s, x);
    else BT_CHECK(x == -12345, "\"%s\": output written on failure", cases[i].s);
  }
  BT_CHECK(braid__parse_long(NULL, 0, 1, &(long){0}) == -1, "NULL");
  return 0;
}

static int test_parse_size(void) {
  static const struct {
    const char *s;
    int r; /* 0 ok, -1 malformed, -2 overflow */
    unsigned long long want;
  } cases[] = {
      {"0", 0, 0},
      {"1", 0, 1},
      {"4096", 0, 4096},
      {"64K", 0, 64ull << 10},
      {"64k", 0, 64ull << 10},
      {"8M", 0, 8ull << 20},
      {"8m", 0, 8ull << 20},
      {"8MiB", 0, 8ull << 20},
      {"8MB", 0, 8ull << 20},
      {"1G", 0, 1ull << 30},
      {"1Gi", 0, 1ull << 30},
      {"100B", 0, 100},
      {"100b", 0, 100},
      {"4294967296G", 0, 1ull << 62}, /* fits 64 bits: a range check rejects it (test_accessors) */
      {"17179869183G", 0, 17179869183ull << 30},
      {"18446744073709551615", 0, 18446744073709551615ull},
      {"-1", -1, 0},
      {" -1", -1, 0}, /* strtoull alone takes this as 2^64 - 1 */
      {" 1", -1, 0},
      {"1 ", -1, 0},
      {"1K ", -1, 0},
      {"1 K", -1, 0},
      {"+1", -1, 0},
      {"", -1, 0},
      {"K", -1, 0},
      {"1KK", -1, 0},
      {"1Ki ", -1, 0},
      {"1iB", -1, 0},
      {"1T", -1, 0},
      {"1.5M", -1, 0},
      {"0x10", -1, 0},
      {"1e3", -1, 0},
      {"18446744073709551616", -2, 0},  /* 2^64 */
      {"17179869184G", -2, 0},          /* 2^64 through the suffix */
      {"99999999999999999999999K", -2, 0},
  };
  for (size_t i = 0; i < BT_COUNT(cases); i++) {
    size_t x = 12345;
    int r = braid__parse_size(cases[i].s, &x);
    BT_CHECK(r == cases[i].r, "\"%s\" gave %d, expected %d", cases[i].s, r, cases[i].r);
    if (r == 0) BT_CHECK(x == cases[i].want, "\"%s\" gave %zu, expected %llu", cases[i].s, x, cases[i].want);
    else BT_CHECK(x == 12345, "\"%s\": output written on failure", cases[i].s);
  }
  char b[32];
  struct {
    size_t v;
    const char *s;
  } fmt[] = {{0, "0"}, {1000, "1000"}, {64 << 10, "64K"}, {1536 << 10, "1536K"}, {8 << 20, "8M"}, {1u << 30, "1G"},
             {(size_t)3 << 30, "3G"}};
  for (size_t i = 0; i < BT_COUNT(fmt); i++) {
    braid__format_size(fmt[i].v, b, sizeof b);
    BT_CHECK(!strcmp(b, fmt[i].s), "%zu formatted as %s, expected %s", fmt[i].v, b, fmt[i].s);
  }
  return 0;
}

static int test_parse_seconds(void) {
  static const struct {
    const char *s;
    int ok;
    double want;
  } cases[] = {
      {"0", 1, 0},      {"300", 1, 300},  {"1.5", 1, 1.5},  {"0.001", 1, 0.001}, {".5", 1, 0.5},    {"2s", 1, 2},
      {"2e3", 1, 2000}, {"1.5s", 1, 1.5}, {"-1", 0, 0},     {"-0", 0, 0},        {"+1", 0, 0},      {" 1", 0, 0},
      {"1 ", 0, 0},     {"1 s", 0, 0},    {"1ss", 0, 0},    {"s", 0, 0},         {"", 0, 0},        {".", 0, 0},
      {"nan", 0, 0},    {"NaN", 0, 0},    {"inf", 0, 0},    {"infinity", 0, 0},  {"1e999", 0, 0},   {"0x10", 0, 0},
      {"0x1p3", 0, 0},  {"1e", 0, 0},     {"soon", 0, 0},   {"1,5", 0, 0},       {"1e-999", 0, 0},  {"5m", 0, 0},
  };
  for (size_t i = 0; i < BT_COUNT(cases); i++) {
    double x = -7;
    int r = braid__parse_seconds(cases[i].s, &x);
    BT_CHECK((r == 0) == cases[i].ok, "\"%s\" %s", cases[i].s, r == 0 ? "accepted" : "rejected");
    if (cases[i].ok) BT_CHECK(x == cases[i].want, "\"%s\" gave %g", cases[i].s, x);
    else BT_CHECK(x == -7, "\"%s\": output written on failure", cases[i].s);
  }
  return 0;
}

/* ---------------------------------------------------------------- accessors */

static char err[512];

#define EXPECT_ERR(call, want_st, needle)                                                                     \
  do {                                                                                                        \
    err[0] = 0;                                                                                               \
    braid_status st_ = (call);                                                                                \
    BT_CHECK(st_ == (want_st), "%s gave %s (%s)", #call, braid_status_string(st_), err);                      \
    BT_CHECK(!strcmp(err, (needle)), "%s: message \"%s\", expected \"%s\"", #call, err, (needle));            \
  } while (0)

#define EXPECT_OK(call)                                                                                       \
  do {                                                                                                        \
    err[0] = 0;                                                                                               \
    braid_status st_ = (call);                                                                                \
    BT_CHECK(st_ == BRAID_OK, "%s gave %s: %s", #call, braid_status_string(st_), err);                        \
  } while (0)

static int test_accessors(void) {
  size_t sz = 0;
  long l = 0;
  double d = 0;
  const size_t lo = 64 << 10, hi = 1u << 30;

  /* Unset and empty: the list's default, parsed by the same parser. */
  unsetenv("BRAID_SHM_BUFFER");
  EXPECT_OK(braid__param_size(BRAID_P_SHM_BUFFER, lo, hi, &sz, err, sizeof err));
  BT_CHECK(sz == (size_t)8 << 20, "default staging %zu", sz);
  setenv("BRAID_SHM_BUFFER", "", 1);
  sz = 0;
  EXPECT_OK(braid__param_size(BRAID_P_SHM_BUFFER, lo, hi, &sz, err, sizeof err));
  BT_CHECK(sz == (size_t)8 << 20, "empty value: default %zu", sz);
  setenv("BRAID_SHM_BUFFER", "16M", 1);
  EXPECT_OK(braid__param_size(BRAID_P_SHM_BUFFER, lo, hi, &sz, err, sizeof err));
  BT_CHECK(sz == (size_t)16 << 20, "16M gave %zu", sz);

  /* The messages: variable, value, what is accepted. */
  setenv("BRAID_SHM_BUFFER", "-1", 1);
  EXPECT_ERR(braid__param_size(BRAID_P_SHM_BUFFER, lo, hi, &sz, err, sizeof err), BRAID_ERR_INVALID_ARG,
             "BRAID_SHM_BUFFER=\"-1\" is not a size (bytes, or with a K/M/G suffix)");
  setenv("BRAID_SHM_BUFFER", " -1", 1);
  EXPECT_ERR(braid__param_size(BRAID_P_SHM_BUFFER, lo, hi, &sz, err, sizeof err), BRAID_ERR_INVALID_ARG,
             "BRAID_SHM_BUFFER=\" -1\" is not a size (bytes, or with a K/M/G suffix)");
  setenv("BRAID_SHM_BUFFER", "2G", 1);
  EXPECT_ERR(braid__param_size(BRAID_P_SHM_BUFFER, lo, hi, &sz, err, sizeof err), BRAID_ERR_INVALID_ARG,
             "BRAID_SHM_BUFFER=\"2G\" is out of range [64K, 1G]");
  setenv("BRAID_SHM_BUFFER", "4294967296G", 1);
  EXPECT_ERR(braid__param_size(BRAID_P_SHM_BUFFER, lo, hi, &sz, err, sizeof err), BRAID_ERR_INVALID_ARG,
             "BRAID_SHM_BUFFER=\"4294967296G\" is out of range [64K, 1G]");
  setenv("BRAID_SHM_BUFFER", "17179869184G", 1);
  EXPECT_ERR(braid__param_size(BRAID_P_SHM_BUFFER, lo, hi, &sz, err, sizeof err), BRAID_ERR_INVALID_ARG,
             "BRAID_SHM_BUFFER=\"17179869184G\" is out of range [64K, 1G]");
  setenv("BRAID_SHM_BUFFER", "1K", 1);
  EXPECT_ERR(braid__param_size(BRAID_P_SHM_BUFFER, lo, hi, &sz, err, sizeof err), BRAID_ERR_INVALID_ARG,
             "BRAID_SHM_BUFFER=\"1K\" is out of range [64K, 1G]");
  BT_CHECK(sz == (size_t)16 << 20, "output kept on errors: %zu", sz);

  setenv("BRAID_CHECK", "0", 1);
  EXPECT_OK(braid__param_int(BRAID_P_CHECK, 0, 1, &l, err, sizeof err));
  BT_CHECK(l == 0, "BRAID_CHECK=0 gave %ld", l);
  unsetenv("BRAID_CHECK");
  EXPECT_OK(braid__param_int(BRAID_P_CHECK, 0, 1, &l, err, sizeof err));
  BT_CHECK(l == 1, "BRAID_CHECK default %ld", l);
  const char *bad_ints[] = {"2", "-1", " 1", "1 ", "+1", "yes", "0x1"};
  for (size_t i = 0; i < BT_COUNT(bad_ints); i++) {
    char want[128];
    snprintf(want, sizeof want, "BRAID_CHECK=\"%s\" is not an integer in [0, 1]", bad_ints[i]);
    setenv("BRAID_CHECK", bad_ints[i], 1);
    EXPECT_ERR(braid__param_int(BRAID_P_CHECK, 0, 1, &l, err, sizeof err), BRAID_ERR_INVALID_ARG, want);
  }

  unsetenv("BRAID_TIMEOUT");
  EXPECT_OK(braid__param_seconds(BRAID_P_TIMEOUT, &d, err, sizeof err));
  BT_CHECK(d == 300, "BRAID_TIMEOUT default %g", d);
  setenv("BRAID_TIMEOUT", "0.25", 1);
  EXPECT_OK(braid__param_seconds(BRAID_P_TIMEOUT, &d, err, sizeof err));
  BT_CHECK(d == 0.25, "0.25 gave %g", d);
  const char *bad_secs[] = {"nan", "inf", "-1", " 1", "1 ", "soon"};
  for (size_t i = 0; i < BT_COUNT(bad_secs); i++) {
    char want[128];
    snprintf(want, sizeof want, "BRAID_TIMEOUT=\"%s\" is not a non-negative number of seconds", bad_secs[i]);
    setenv("BRAID_TIMEOUT", bad_secs[i], 1);
    EXPECT_ERR(braid__param_seconds(BRAID_P_TIMEOUT, &d, err, sizeof err), BRAID_ERR_INVALID_ARG, want);
  }

  /* Values from elsewhere (a launcher environment read through a callback). */
  EXPECT_OK(braid__param_parse_seconds(BRAID_P_INIT_TIMEOUT, NULL, &d, err, sizeof err));
  BT_CHECK(d == 60, "BRAID_INIT_TIMEOUT default %g", d);
  EXPECT_OK(braid__param_parse_seconds(BRAID_P_INIT_TIMEOUT, "", &d, err, sizeof err));
  BT_CHECK(d == 60, "empty: default %g", d);
  EXPECT_ERR(braid__param_parse_seconds(BRAID_P_INIT_TIMEOUT, "soon", &d, err, sizeof err), BRAID_ERR_INVALID_ARG,
             "BRAID_INIT_TIMEOUT=\"soon\" is not a non-negative number of seconds");
  /* No default: unset leaves the output alone. */
  l = 42;
  EXPECT_OK(braid__param_parse_int(BRAID_P_LOCAL_RANK, NULL, 0, 10, &l, err, sizeof err));
  BT_CHECK(l == 42, "no default: output %ld", l);

  /* Bugs in braid: the wrong type, a default the caller's bounds exclude. */
  err[0] = 0;
  BT_CHECK(braid__param_int(BRAID_P_TIMEOUT, 0, 1, &l, err, sizeof err) == BRAID_ERR_INTERNAL &&
               strstr(err, "BRAID_TIMEOUT is a seconds parameter, read as int"),
           "wrong type: %s", err);
  unsetenv("BRAID_SHM_BUFFER");
  err[0] = 0;
  BT_CHECK(braid__param_size(BRAID_P_SHM_BUFFER, 1, 1024, &sz, err, sizeof err) == BRAID_ERR_INTERNAL &&
               strstr(err, "built-in default of BRAID_SHM_BUFFER, \"8M\", is rejected"),
           "default out of bounds: %s", err);

  /* Strings: the value, else the default (which may be NULL). */
  unsetenv("BRAID_LOG");
  BT_CHECK(!strcmp(braid__param_str(BRAID_P_LOG), "warn"), "BRAID_LOG default");
  setenv("BRAID_LOG", "", 1);
  BT_CHECK(!strcmp(braid__param_str(BRAID_P_LOG), "warn"), "empty BRAID_LOG");
  BT_CHECK(braid__param_env(BRAID_P_LOG) == NULL, "param_env ignores the default");
  setenv("BRAID_LOG", "debug", 1);
  BT_CHECK(!strcmp(braid__param_str(BRAID_P_LOG), "debug") && !strcmp(braid__param_env(BRAID_P_LOG), "debug"),
           "BRAID_LOG set");
  unsetenv("BRAID_BACKEND");
  unsetenv("BRAID_ALGO");
  BT_CHECK(braid__param_str(BRAID_P_BACKEND) == NULL && braid__param_str(BRAID_P_ALGO) == NULL,
           "no default: automatic");
  BT_CHECK(!strcmp(braid__param_name(BRAID_P_SHM_BUFFER), "BRAID_SHM_BUFFER"), "name");
  return 0;
}

/* The name-based helpers share the parsers and messages. */
static int test_env_helpers(void) {
  size_t sz = 0;
  long l = 0;
  double d = 0;
  unsetenv("BRAID_TEST_X");
  EXPECT_OK(braid__env_size("BRAID_TEST_X", 77, &sz, err, sizeof err));
  BT_CHECK(sz == 77, "default %zu", sz);
  setenv("BRAID_TEST_X", " -1", 1);
  EXPECT_ERR(braid__env_size("BRAID_TEST_X", 77, &sz, err, sizeof err), BRAID_ERR_INVALID_ARG,
             "BRAID_TEST_X=\" -1\" is not a size (bytes, or with a K/M/G suffix)");
  setenv("BRAID_TEST_X", "17179869184G", 1);
  BT_CHECK(braid__env_size("BRAID_TEST_X", 77, &sz, err, sizeof err) == BRAID_ERR_INVALID_ARG &&
               strstr(err, "is out of range"),
           "overflow: %s", err);
  setenv("BRAID_TEST_X", "1 ", 1);
  EXPECT_ERR(braid__env_int("BRAID_TEST_X", 1, 0, 1, &l, err, sizeof err), BRAID_ERR_INVALID_ARG,
             "BRAID_TEST_X=\"1 \" is not an integer in [0, 1]");
  setenv("BRAID_TEST_X", "nan", 1);
  EXPECT_ERR(braid__env_seconds("BRAID_TEST_X", 1, &d, err, sizeof err), BRAID_ERR_INVALID_ARG,
             "BRAID_TEST_X=\"nan\" is not a non-negative number of seconds");
  return 0;
}

/* ---------------------------------------------------------------- the list */

static const struct {
  const char *id, *name;
} ids[] = {
#define ROW(id, name, type, def, doc) {#id, name},
    BRAID_PARAM_LIST(ROW)
#undef ROW
};

static int test_list(void) {
  size_t n;
  const braid__param *p = braid__param_table(&n);
  BT_CHECK(n == BRAID_P_COUNT && n == BT_COUNT(ids), "%zu rows, %d ids", n, (int)BRAID_P_COUNT);
  for (size_t i = 0; i < n; i++) {
    char want[64];
    snprintf(want, sizeof want, "BRAID_%s", ids[i].id);
    BT_CHECK(!strcmp(p[i].name, want), "row %zu: %s is named %s", i, ids[i].id, p[i].name);
    BT_CHECK(!strcmp(braid__param_name((braid__param_id)i), p[i].name), "id %zu", i);
    BT_CHECK(p[i].doc && p[i].doc[0] && !strchr(p[i].doc, '\n'), "%s: one-line doc", p[i].name);
    BT_CHECK(!p[i].def || p[i].def[0], "%s: an empty default (write NULL)", p[i].name);
    for (size_t j = 0; j < i; j++) BT_CHECK(strcmp(p[i].name, p[j].name), "%s listed twice", p[i].name);
    /* Every numeric default parses with its type's parser. */
    if (!p[i].def) continue;
    long l;
    double d;
    size_t sz;
    int r = 0;
    switch (p[i].type) {
    case BRAID_PT_INT: r = braid__parse_long(p[i].def, LONG_MIN, LONG_MAX, &l); break;
    case BRAID_PT_SECONDS: r = braid__parse_seconds(p[i].def, &d); break;
    case BRAID_PT_SIZE: r = braid__parse_size(p[i].def, &sz); break;
    default: break;
    }
    BT_CHECK(r == 0, "%s: default \"%s\" is not a valid %s", p[i].name, p[i].def, braid__param_type_name(p[i].type));
  }
  /* The defaults call sites rely on. */
  long l = 0;
  size_t sz = 0;
  double d = 0;
  unsetenv("BRAID_SHM_CMA_MIN");
  unsetenv("BRAID_DESTROY_TIMEOUT");
  unsetenv("BRAID_RANK");
  unsetenv("BRAID_WORLD_SIZE");
  EXPECT_OK(braid__param_size(BRAID_P_SHM_CMA_MIN, 0, SIZE_MAX, &sz, err, sizeof err));
  BT_CHECK(sz == (size_t)256 << 20, "BRAID_SHM_CMA_MIN default %zu", sz);
  EXPECT_OK(braid__param_seconds(BRAID_P_DESTROY_TIMEOUT, &d, err, sizeof err));
  BT_CHECK(d == 5, "BRAID_DESTROY_TIMEOUT default %g", d);
  EXPECT_OK(braid__param_int(BRAID_P_RANK, 0, 100, &l, err, sizeof err));
  BT_CHECK(l == 0, "BRAID_RANK default %ld", l);
  EXPECT_OK(braid__param_int(BRAID_P_WORLD_SIZE, 1, 100, &l, err, sizeof err));
  BT_CHECK(l == 1, "BRAID_WORLD_SIZE default %ld", l);
  const char *ints[] = {"BRAID_SHM_CMA", "BRAID_SHM_ZEROCOPY", "BRAID_SHM_MEMBARRIER", "BRAID_STORE_EXTERNAL"};
  for (size_t i = 0; i < BT_COUNT(ints); i++) {
    size_t k = 0;
    while (k < n && strcmp(p[k].name, ints[i])) k++;
    BT_CHECK(k < n && p[k].type == BRAID_PT_INT && p[k].def, "%s is an int with a default", ints[i]);
    unsetenv(ints[i]);
    EXPECT_OK(braid__param_int((braid__param_id)k, 0, 1, &l, err, sizeof err));
  }
  return 0;
}

/* ---------------------------------------------------------------- the docs */

static char *read_source(const char *rel) {
  const char *dir = getenv("BRAID_TEST_SRCDIR");
  if (!dir) {
    fprintf(stderr, "BRAID_TEST_SRCDIR is not set (ctest sets it to the source directory)\n");
    return NULL;
  }
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, rel);
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", path);
    return NULL;
  }
  size_t cap = 1 << 16, len = 0, got;
  char *buf = malloc(cap);
  while (buf && (got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
    len += got;
    if (len + 1 < cap) continue;
    char *more = realloc(buf, cap *= 2);
    if (!more) free(buf);
    buf = more;
  }
  fclose(f);
  if (buf) buf[len] = 0;
  return buf;
}

static int test_environment_md(void) {
  char *doc = read_source("docs/ENVIRONMENT.md");
  BT_CHECK(doc, "docs/ENVIRONMENT.md");
  static const char begin[] = "<!-- params:begin -->\n", end[] = "<!-- params:end -->";
  char *a = strstr(doc, begin);
  BT_CHECK(a, "docs/ENVIRONMENT.md has no \"%s\" line", "<!-- params:begin -->");
  a += strlen(begin);
  char *b = strstr(a, end);
  BT_CHECK(b, "docs/ENVIRONMENT.md has no \"%s\" after the begin marker", end);
  BT_CHECK(!strstr(b + 1, begin), "a second params table");
  *b = 0;
  char *gen = NULL;
  size_t genlen = 0;
  FILE *f = open_memstream(&gen, &genlen);
  BT_CHECK(f, "open_memstream");
  braid__param_markdown(f);
  fclose(f);
  if (strcmp(a, gen)) {
    /* Name the first line that differs. */
    const char *x = a, *y = gen;
    int line = 1;
    for (; *x && *x == *y; x++, y++)
      if (*x == '\n') line++;
    while (x > a && x[-1] != '\n') x--, y--; /* from the start of that line */
    bt_report(__FILE__, __LINE__, "docs/ENVIRONMENT.md differs from `braid-info --markdown` at table line %d:", line);
    bt_report(__FILE__, __LINE__, "  doc:       %.*s", (int)strcspn(x, "\n"), x);
    bt_report(__FILE__, __LINE__, "  generated: %.*s", (int)strcspn(y, "\n"), y);
    bt_report(__FILE__, __LINE__, "  (replace the text between the params markers with `braid-info --markdown`)");
    free(gen);
    free(doc);
    return 1;
  }
  free(gen);
  free(doc);
  return 0;
}

/* Trims spaces and backticks around s in place. */
static char *trim(char *s) {
  while (*s == ' ' || *s == '`') s++;
  char *e = s + strlen(s);
  while (e > s && (e[-1] == ' ' || e[-1] == '`')) *--e = 0;
  return s;
}

/* Every README row "| `BRAID_X`[, `BRAID_Y`] | default[, default] | ..." names
   variables of the list and, where the list has a default, that default.
   Without one the README describes the behaviour in words. */
static int test_readme_defaults(void) {
  char *doc = read_source("README.md");
  BT_CHECK(doc, "README.md");
  size_t n;
  const braid__param *p = braid__param_table(&n);
  int rows = 0, checked = 0;
  for (char *line = strtok(doc, "\n"); line; line = strtok(NULL, "\n")) {
    if (strncmp(line, "| `BRAID_", 9)) continue;
    char *c1 = line + 1, *bar = strchr(c1, '|');
    BT_CHECK(bar, "README row \"%s\"", line);
    *bar = 0;
    char *c2 = bar + 1, *bar2 = strchr(c2, '|');
    BT_CHECK(bar2, "README row without a default column: \"%s\"", line);
    *bar2 = 0;
    /* The variables of the row, then the defaults (one per variable, or one for all). */
    const braid__param *vars[8];
    int nv = 0;
    for (char *q = strstr(c1, "`BRAID_"); q && nv < 8; q = strstr(q, "`BRAID_")) {
      char name[64];
      size_t k = strcspn(q + 1, "`");
      BT_CHECK(k < sizeof name, "README name too long");
      memcpy(name, q + 1, k);
      name[k] = 0;
      size_t i = 0;
      while (i < n && strcmp(p[i].name, name)) i++;
      BT_CHECK(i < n, "README.md names %s, which is not in the parameter list", name);
      vars[nv++] = &p[i];
      q += k + 2;
    }
    char whole[512];
    snprintf(whole, sizeof whole, "%s", c2);
    char *parts[8];
    int np = 0;
    for (char *save = NULL, *t = strtok_r(c2, ",", &save); t && np < 8; t = strtok_r(NULL, ",", &save))
      parts[np++] = trim(t);
    rows++;
    for (int v = 0; v < nv; v++) {
      if (!vars[v]->def) continue;
      /* One variable: the whole cell; several: one comma-separated value each. */
      BT_CHECK(nv == 1 || np == nv, "README row of %s: %d defaults for %d variables", vars[v]->name, np, nv);
      const char *cell = nv == 1 ? trim(whole) : parts[v];
      BT_CHECK(!strcmp(cell, vars[v]->def), "README.md gives %s the default \"%s\"; the parameter list has \"%s\"",
               vars[v]->name, cell, vars[v]->def);
      checked++;
    }
  }
  free(doc);
  BT_CHECK(rows >= 5 && checked >= 5, "only %d README rows (%d defaults) found: has the table's format changed?",
           rows, checked);
  return 0;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      BT_CASE(test_parse_long), BT_CASE(test_parse_size),     BT_CASE(test_parse_seconds),
      BT_CASE(test_accessors),  BT_CASE(test_env_helpers),    BT_CASE(test_list),
      BT_CASE(test_environment_md), BT_CASE(test_readme_defaults),
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
