/* Algorithm names, which collective each implements, the one selection
   table (collective kind x bytes x world size), BRAID_ALGO parsing, and
   the table in words for braid-info. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "algos/internal.h"
#include "core/comm.h"

static const char *const NAMES[BRAID__ALGO_COUNT] = {
    [BRAID__ALGO_AUTO] = "auto",   [BRAID__ALGO_NATIVE] = "native", [BRAID__ALGO_RING] = "ring",
    [BRAID__ALGO_RHD] = "rhd",     [BRAID__ALGO_RD] = "rd",         [BRAID__ALGO_TREE] = "tree",
    [BRAID__ALGO_KNOMIAL] = "knomial", [BRAID__ALGO_CHAIN] = "chain", [BRAID__ALGO_BRUCK] = "bruck",
    [BRAID__ALGO_DISSEM] = "dissem", [BRAID__ALGO_LINEAR] = "linear", [BRAID__ALGO_PAIRWISE] = "pairwise",
};

#define BIT(a) (1u << (a))
/* The generic algorithms of each collective. Recursive doubling gathers
   for any world size (folded), so it is an all-gather algorithm too. */
static const unsigned GENERIC[BRAID__COLL_NKINDS] = {
    [BRAID__COLL_ALL_REDUCE] = BIT(BRAID__ALGO_RING) | BIT(BRAID__ALGO_RHD) | BIT(BRAID__ALGO_RD),
    [BRAID__COLL_BROADCAST] = BIT(BRAID__ALGO_TREE) | BIT(BRAID__ALGO_KNOMIAL) | BIT(BRAID__ALGO_CHAIN),
    [BRAID__COLL_ALL_GATHER] = BIT(BRAID__ALGO_RING) | BIT(BRAID__ALGO_BRUCK) | BIT(BRAID__ALGO_RD),
    [BRAID__COLL_REDUCE_SCATTER] = BIT(BRAID__ALGO_RING) | BIT(BRAID__ALGO_RHD),
    [BRAID__COLL_BARRIER] = BIT(BRAID__ALGO_DISSEM),
    [BRAID__COLL_REDUCE] = BIT(BRAID__ALGO_TREE) | BIT(BRAID__ALGO_CHAIN) | BIT(BRAID__ALGO_RING),
    [BRAID__COLL_GATHER] = BIT(BRAID__ALGO_TREE) | BIT(BRAID__ALGO_LINEAR),
    [BRAID__COLL_SCATTER] = BIT(BRAID__ALGO_TREE) | BIT(BRAID__ALGO_LINEAR),
    [BRAID__COLL_ALL_TO_ALL] = BIT(BRAID__ALGO_PAIRWISE) | BIT(BRAID__ALGO_BRUCK),
    [BRAID__COLL_ALL_TO_ALLV] = BIT(BRAID__ALGO_PAIRWISE),
};

const char *braid__algo_name(int algo) { return algo >= 0 && algo < BRAID__ALGO_COUNT ? NAMES[algo] : NULL; }

/* AUTO is not an implementation (it names the table), so it supports nothing. */
int braid__algo_supports(int kind, int algo) {
  if (kind <= BRAID__COLL_NONE || kind >= BRAID__COLL_NKINDS) return 0;
  if (algo == BRAID__ALGO_NATIVE) return 1;
  if (algo <= BRAID__ALGO_NATIVE || algo >= BRAID__ALGO_COUNT) return 0;
  return (GENERIC[kind] & BIT(algo)) != 0;
}

/*
 * The selection table. A call's vector is the buffer of all-reduce,
 * broadcast and reduce, the whole n-block vector of all-gather,
 * reduce-scatter, gather, scatter and all-to-all; a block is vector / n
 * (what one ring step, or one pairwise exchange, moves). For each collective the
 * first rule whose every condition holds wins; the last rule of each has
 * none. The thresholds are rules of thumb, not measurements:
 *  - log-step algorithms (rd, bruck, binomial/knomial trees) need
 *    ceil(log2 n) rounds against the ring's n-1 per phase, so they win while
 *    a round's latency outweighs its bytes: vectors of a few KiB;
 *  - on 2 ranks rd moves the ring's bytes in one step instead of two, at
 *    the price of reducing the whole vector on both ranks, which costs
 *    more than the second step's latency only past tens of KiB; beyond,
 *    rhd moves the same halves as the ring, each as one message instead
 *    of the ring's chunks, up to 32 MiB (it takes a vector of scratch;
 *    measured on tcp: docs/ALGORITHMS.md);
 *  - rhd moves the ring's bytes in 2 log2 p rounds, so on power-of-two
 *    worlds it wins until a ring block is large enough (tens of KiB) to
 *    amortize a step's latency; at 4 and 8 ranks, where the ring has 2(n-1)
 *    steps against 2 log2 n, for blocks under 2 MiB (measured on tcp:
 *    docs/ALGORITHMS.md); all-reduce's rhd pairs nearest ranks first, so
 *    where consecutive ranks share a host it sends fewer bytes between
 *    hosts than the ring; on non-power-of-two sizes folding sends the whole
 *    vector twice more, so the ring takes over four times sooner;
 *  - a pipelined chain broadcast costs about C + n - 2 chunk times (C
 *    chunks), a binomial tree ceil(log2 n) * C: the chain wins once
 *    C * (ceil(log2 n) - 1) > n - 2.
 */
typedef struct rule {
  uint8_t kind, algo;
  uint8_t pow2;     /* only for a power-of-two world size */
  uint8_t chain;    /* only when the chain beats the tree (above) */
  int min_ranks;    /* 0: any */
  size_t max_vec;   /* vector at most this many bytes; 0: any */
  size_t max_block; /* block under this many bytes (vector < n * max_block); 0: any */
  const char *why;
  int max_ranks;    /* 0: any */
} rule;

#define KIB ((size_t)1024)
static const rule TABLE[] = {
    {BRAID__COLL_ALL_REDUCE, BRAID__ALGO_RD, 0, 0, 0, 64 * KIB, 0, "one exchange of the whole vector: the ring's bytes in one step", 2},
    {BRAID__COLL_ALL_REDUCE, BRAID__ALGO_RD, 0, 0, 0, 4 * KIB, 0, "log2 n rounds of the whole vector: latency first", 0},
    {BRAID__COLL_ALL_REDUCE, BRAID__ALGO_RHD, 0, 0, 0, 32 * KIB * KIB, 0, "the ring's two half-vector steps, each one message", 2},
    {BRAID__COLL_ALL_REDUCE, BRAID__ALGO_RHD, 1, 0, 4, 0, 2048 * KIB, "2 log2 n rounds against the ring's 2(n-1)", 8},
    {BRAID__COLL_ALL_REDUCE, BRAID__ALGO_RHD, 1, 0, 0, 0, 32 * KIB, "2 log2 n rounds moving the ring's bytes", 0},
    {BRAID__COLL_ALL_REDUCE, BRAID__ALGO_RHD, 0, 0, 0, 0, 8 * KIB, "folding costs two more whole-vector transfers", 0},
    {BRAID__COLL_ALL_REDUCE, BRAID__ALGO_RING, 0, 0, 0, 0, 0, "2(n-1) pipelined steps, bandwidth-optimal", 0},
    {BRAID__COLL_BROADCAST, BRAID__ALGO_CHAIN, 0, 1, 0, 0, 0, "chunks flow down the chain while later ones follow", 0},
    {BRAID__COLL_BROADCAST, BRAID__ALGO_KNOMIAL, 0, 0, 8, 16 * KIB, 0, "ceil(log4 n) rounds of up to 3 overlapping sends", 0},
    {BRAID__COLL_BROADCAST, BRAID__ALGO_TREE, 0, 0, 0, 0, 0, "binomial: ceil(log2 n) rounds of whole messages", 0},
    {BRAID__COLL_ALL_GATHER, BRAID__ALGO_RD, 0, 0, 0, 0, 0, "one exchange of whole blocks: nothing to pipeline", 2},
    {BRAID__COLL_ALL_GATHER, BRAID__ALGO_RD, 1, 0, 0, 64 * KIB, 0, "log2 n rounds received in place", 0},
    {BRAID__COLL_ALL_GATHER, BRAID__ALGO_BRUCK, 0, 0, 0, 64 * KIB, 0, "ceil(log2 n) rounds through a rotated copy", 0},
    {BRAID__COLL_ALL_GATHER, BRAID__ALGO_RING, 0, 0, 0, 0, 0, "n-1 pipelined steps, bandwidth-optimal", 0},
    {BRAID__COLL_REDUCE_SCATTER, BRAID__ALGO_RHD, 1, 0, 0, 0, 32 * KIB, "log2 n halving rounds moving the ring's bytes", 0},
    {BRAID__COLL_REDUCE_SCATTER, BRAID__ALGO_RHD, 0, 0, 0, 0, 8 * KIB, "folding costs a whole-vector transfer more", 0},
    {BRAID__COLL_REDUCE_SCATTER, BRAID__ALGO_RING, 0, 0, 0, 0, 0, "n-1 pipelined steps, bandwidth-optimal", 0},
    {BRAID__COLL_BARRIER, BRAID__ALGO_DISSEM, 0, 0, 0, 0, 0, "ceil(log2 n) rounds of empty messages", 0},
    {BRAID__COLL_REDUCE, BRAID__ALGO_TREE, 0, 0, 0, 256 * KIB, 0, "binomial: ceil(log2 n) rounds of whole vectors", 0},
    {BRAID__COLL_REDUCE, BRAID__ALGO_TREE, 0, 0, 0, 0, 0, "one whole-vector message: nothing to pipeline", 2},
    {BRAID__COLL_REDUCE, BRAID__ALGO_RING, 0, 0, 3, 0, 0, "ring reduce-scatter, then the blocks to the root", 0},
    {BRAID__COLL_REDUCE, BRAID__ALGO_CHAIN, 0, 0, 0, 0, 0, "chunks combined along a chain to the root", 0},
    {BRAID__COLL_GATHER, BRAID__ALGO_TREE, 0, 0, 8, 16 * KIB, 0, "binomial: ceil(log2 n) rounds instead of n-1 messages", 0},
    {BRAID__COLL_GATHER, BRAID__ALGO_LINEAR, 0, 0, 0, 0, 0, "every block straight to the root, moved once", 0},
    {BRAID__COLL_SCATTER, BRAID__ALGO_TREE, 0, 0, 4, 16 * KIB, 0, "binomial: the root sends ceil(log2 n) messages instead of n-1", 0},
    {BRAID__COLL_SCATTER, BRAID__ALGO_LINEAR, 0, 0, 0, 0, 0, "every block straight from the root, moved once", 0},
    {BRAID__COLL_ALL_TO_ALL, BRAID__ALGO_BRUCK, 0, 0, 8, 0, 256, "ceil(log2 n) rounds of packed blocks", 0},
    {BRAID__COLL_ALL_TO_ALL, BRAID__ALGO_PAIRWISE, 0, 0, 0, 0, 0, "n-1 exchanges, each block moved once", 0},
    {BRAID__COLL_ALL_TO_ALLV, BRAID__ALGO_PAIRWISE, 0, 0, 0, 0, 0, "n-1 exchanges, one sender per rank per step", 0},
};
#define NRULES (sizeof TABLE / sizeof TABLE[0])

static size_t mul_sat(size_t a, size_t b) { return b && a > SIZE_MAX / b ? SIZE_MAX : a * b; }

static int chain_wins(size_t vec, int n) {
  size_t chunks = braid__div_ceil(vec, BRAID__CHAIN_CHUNK_BYTES);
  int depth = braid__log2_ceil(n);
  return depth > 1 && mul_sat(chunks, (size_t)(depth - 1)) > (size_t)(n - 2);
}

static int rule_holds(const rule *t, size_t vec, int n) {
  if (t->pow2 && !braid__is_pow2(n)) return 0;
  if (t->min_ranks && n < t->min_ranks) return 0;
  if (t->max_ranks && n > t->max_ranks) return 0;
  if (t->max_vec && vec > t->max_vec) return 0;
  if (t->max_block && vec >= mul_sat((size_t)n, t->max_block)) return 0;
  if (t->chain && !chain_wins(vec, n)) return 0;
  return 1;
}

size_t braid__algo_vector(int kind, size_t bytes, int nranks) {
  int per_block = kind == BRAID__COLL_ALL_GATHER || kind == BRAID__COLL_REDUCE_SCATTER || kind == BRAID__COLL_GATHER ||
                  kind == BRAID__COLL_SCATTER || kind == BRAID__COLL_ALL_TO_ALL;
  return per_block ? mul_sat(bytes, (size_t)(nranks < 1 ? 1 : nranks)) : bytes;
}

int braid__algo_select(int kind, size_t bytes, int nranks) {
  int n = nranks < 1 ? 1 : nranks;
  size_t vec = braid__algo_vector(kind, bytes, n);
  for (size_t i = 0; i < NRULES; i++)
    if (TABLE[i].kind == kind && rule_holds(&TABLE[i], vec, n)) return TABLE[i].algo;
  return -1; /* no generic algorithm: split, user traffic, unknown kinds */
}

static void fmt_bytes(char *out, size_t len, size_t b) {
  if (b % (KIB * KIB) == 0)
    snprintf(out, len, "%zu MiB", b / (KIB * KIB));
  else if (b % KIB == 0)
    snprintf(out, len, "%zu KiB", b / KIB);
  else
    snprintf(out, len, "%zu B", b);
}

/* Appends to a line without overflowing it. */
static void add(char *line, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add(char *line, size_t len, const char *fmt, ...) {
  size_t used = strlen(line);
  if (used + 1 >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + used, len - used, fmt, ap);
  va_end(ap);
}

void braid__algo_describe(void (*emit)(const char *line, void *arg), void *arg) {
  for (size_t i = 0; i < NRULES; i++) {
    const rule *t = &TABLE[i];
    char line[256] = "", b[32];
    const char *sep = " if ";
    int first = i == 0 || TABLE[i - 1].kind != t->kind;
    add(line, sizeof line, "%s: %s", braid__coll_short_name(t->kind), NAMES[t->algo]);
    if (t->pow2) add(line, sizeof line, "%sthe world size is a power of two", sep), sep = " and ";
    if (t->min_ranks) add(line, sizeof line, "%sthe world size is %d or more", sep, t->min_ranks), sep = " and ";
    if (t->max_ranks) add(line, sizeof line, "%sthe world size is at most %d", sep, t->max_ranks), sep = " and ";
    if (t->max_vec) {
      fmt_bytes(b, sizeof b, t->max_vec);
      add(line, sizeof line, "%sthe vector is at most %s", sep, b), sep = " and ";
    }
    if (t->max_block) {
      fmt_bytes(b, sizeof b, t->max_block);
      add(line, sizeof line, "%sa block (vector / n) is under %s", sep, b), sep = " and ";
    }
    if (t->chain) {
      fmt_bytes(b, sizeof b, BRAID__CHAIN_CHUNK_BYTES);
      add(line, sizeof line, "%sceil(vector / %s) * (ceil(log2 n) - 1) > n - 2", sep, b), sep = " and ";
    }
    if (!first && sep[1] == 'i') add(line, sizeof line, " otherwise");
    add(line, sizeof line, " (%s)", t->why);
    emit(line, arg);
  }
}

braid_status braid__algo_refuse(braid_comm *c, int kind, int algo) {
  const char *name = braid__algo_name(algo);
  return braid__fail(c, BRAID_ERR_INTERNAL, "%s has no generic algorithm %s%s%d%s", braid__coll_short_name(kind),
                     name ? name : "", name ? " (code " : "code ", algo, name ? ")" : "");
}

/* ------------------------------------------------------------------------ */
/* BRAID_ALGO */

/* Case-insensitive comparison that ignores '_' and '-', so all_reduce,
   all-reduce and AllReduce name allreduce. */
static int same_name(const char *a, size_t alen, const char *b) {
  size_t i = 0;
  if (!b) return 0;
  for (;;) {
    while (i < alen && (a[i] == '_' || a[i] == '-')) i++;
    while (*b == '_' || *b == '-') b++;
    if (i == alen || !*b) return i == alen && !*b;
    if (tolower((unsigned char)a[i]) != tolower((unsigned char)*b)) return 0;
    i++, b++;
  }
}

static void trim(const char **s, size_t *len) {
  while (*len && isspace((unsigned char)**s)) (*s)++, (*len)--;
  while (*len && isspace((unsigned char)(*s)[*len - 1])) (*len)--;
}

static int parse_error(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int parse_error(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

static void list_ops(char *out, size_t len) {
  out[0] = 0;
  for (int k = BRAID__COLL_NONE + 1; k < BRAID__COLL_NKINDS; k++)
    if (GENERIC[k]) add(out, len, "%s%s", out[0] ? ", " : "", braid__coll_short_name(k));
}

static void list_algos(char *out, size_t len, int kind) {
  snprintf(out, len, "auto, native");
  for (int a = BRAID__ALGO_NATIVE + 1; a < BRAID__ALGO_COUNT; a++)
    if (GENERIC[kind] & BIT(a)) add(out, len, ", %s", NAMES[a]);
}

int braid__algo_parse(const char *spec, uint8_t out[BRAID__COLL_NKINDS], char *err, size_t errlen) {
  uint8_t res[BRAID__COLL_NKINDS], seen[BRAID__COLL_NKINDS] = {0};
  char valid[160];
  memcpy(res, out, sizeof res);
  if (err && errlen) err[0] = 0;
  for (const char *p = spec; p && *p;) {
    const char *end = strchr(p, ',');
    const char *item = p;
    size_t ilen = end ? (size_t)(end - p) : strlen(p);
    p = end ? end + 1 : p + ilen;
    trim(&item, &ilen);
    if (!ilen) continue; /* "a=b,,c=d" and a trailing comma are harmless */
    const char *eq = memchr(item, '=', ilen);
    int il = (int)ilen;
    if (!eq)
      return parse_error(err, errlen, "item \"%.*s\" has no '=': expected collective=algorithm, e.g. allreduce=ring",
                         il, item);
    const char *op = item, *al = eq + 1;
    size_t oplen = (size_t)(eq - item), allen = ilen - oplen - 1;
    trim(&op, &oplen);
    trim(&al, &allen);
    int kind = -1;
    for (int k = BRAID__COLL_NONE; k < BRAID__COLL_NKINDS && kind < 0; k++)
      if (same_name(op, oplen, braid__coll_short_name(k))) kind = k;
    if (kind < 0 || !GENERIC[kind]) {
      list_ops(valid, sizeof valid);
      if (kind >= 0)
        return parse_error(err, errlen, "item \"%.*s\": %s has no algorithms to choose from (valid: %s)", il, item,
                           braid__coll_short_name(kind), valid);
      return parse_error(err, errlen, "item \"%.*s\": unknown collective \"%.*s\" (valid: %s)", il, item, (int)oplen,
                         op, valid);
    }
    if (seen[kind])
      return parse_error(err, errlen, "item \"%.*s\": %s is named twice", il, item, braid__coll_short_name(kind));
    int algo = -1;
    for (int a = 0; a < BRAID__ALGO_COUNT && algo < 0; a++)
      if (same_name(al, allen, NAMES[a])) algo = a;
    list_algos(valid, sizeof valid, kind);
    if (algo < 0)
      return parse_error(err, errlen, "item \"%.*s\": unknown algorithm \"%.*s\" (valid for %s: %s)", il, item,
                         (int)allen, al, braid__coll_short_name(kind), valid);
    if (algo != BRAID__ALGO_AUTO && !braid__algo_supports(kind, algo))
      return parse_error(err, errlen, "item \"%.*s\": %s is not an algorithm of %s (valid for %s: %s)", il, item,
                         NAMES[algo], braid__coll_short_name(kind), braid__coll_short_name(kind), valid);
    seen[kind] = 1;
    res[kind] = (uint8_t)algo;
  }
  memcpy(out, res, sizeof res);
  return 0;
}

void braid__algo_spec(const uint8_t algo[BRAID__COLL_NKINDS], char *out, size_t len) {
  size_t at = 0;
  if (len) out[0] = 0;
  for (int k = BRAID__COLL_NONE + 1; k < BRAID__COLL_NKINDS && at < len; k++) {
    if (algo[k] == BRAID__ALGO_AUTO) continue;
    int w = snprintf(out + at, len - at, "%s%s=%s", at ? "," : "", braid__coll_short_name(k), NAMES[algo[k]]);
    if (w > 0) at += (size_t)w;
  }
}
