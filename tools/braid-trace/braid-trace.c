/* braid-trace: reads the flight-recorder dumps of every rank of a job (the
   JSON lines braid writes to BRAID_TRACE_FILE, or the "flight recorder:"
   lines of its log) and names, per communicator, the collective the ranks
   were in and the ranks that never entered it or are furthest behind, and
   each rank's sends and receives that had not completed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANKS 4096
#define MAX_COMMS 64
#define MAX_OPEN_P2P 4 /* unfinished sends and receives shown per rank */

typedef struct op {
  unsigned long long seq;
  char op[24], dtype[16], algo[16], state[16], redop[8];
  long long count, root;
} op;

typedef struct rankinfo {
  int present;
  char reason[64], backend[16];
  unsigned long long seq; /* collectives started when it dumped */
  op last;                /* its newest collective entry */
  int has_last;
  char open_p2p[MAX_OPEN_P2P][96]; /* its newest dump's unfinished sends and receives */
  int nopen;                       /* how many (more than shown when > MAX_OPEN_P2P) */
} rankinfo;

typedef struct comminfo {
  char id[24];
  int size;
  rankinfo *ranks;
} comminfo;

static comminfo comms[MAX_COMMS];
static int ncomms;

/* The raw text after "key": in line (NULL when absent). */
static const char *field(const char *line, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = strstr(line, pat);
  return p ? p + strlen(pat) : NULL;
}

static int get_str(const char *line, const char *key, char *out, size_t len) {
  const char *p = field(line, key);
  if (!p || *p != '"') return 0;
  p++;
  size_t o = 0;
  while (*p && *p != '"' && o + 1 < len) {
    if (*p == '\\' && p[1]) p++;
    out[o++] = *p++;
  }
  out[o] = 0;
  return 1;
}

static int get_num(const char *line, const char *key, long long *out) {
  const char *p = field(line, key);
  if (!p) return 0;
  char *end;
  *out = strtoll(p, &end, 10);
  return end != p;
}

static comminfo *comm_of(const char *id, int size) {
  for (int i = 0; i < ncomms; i++)
    if (!strcmp(comms[i].id, id)) return &comms[i];
  if (ncomms == MAX_COMMS || size <= 0 || size > MAX_RANKS) return NULL;
  comminfo *c = &comms[ncomms++];
  snprintf(c->id, sizeof c->id, "%s", id);
  c->size = size;
  c->ranks = calloc((size_t)size, sizeof *c->ranks);
  return c->ranks ? c : NULL;
}

static void take_line(const char *line) {
  char type[16], id[24];
  long long rank, size = 0;
  if (!get_str(line, "type", type, sizeof type) || !get_str(line, "comm", id, sizeof id) ||
      !get_num(line, "rank", &rank))
    return;
  if (!strcmp(type, "header")) {
    if (!get_num(line, "size", &size)) return;
    comminfo *c = comm_of(id, (int)size);
    if (!c || rank < 0 || rank >= c->size) return;
    rankinfo *r = &c->ranks[rank];
    long long seq = 0;
    r->present = 1;
    r->nopen = 0; /* a later dump of the same rank supersedes */
    get_str(line, "reason", r->reason, sizeof r->reason);
    get_str(line, "backend", r->backend, sizeof r->backend);
    if (get_num(line, "seq", &seq)) r->seq = (unsigned long long)seq;
    return;
  }
  comminfo *c = comm_of(id, 0);
  if (!c || rank < 0 || rank >= c->size) return;
  op o;
  memset(&o, 0, sizeof o);
  long long seq = 0;
  if (!get_str(line, "op", o.op, sizeof o.op) || !get_num(line, "seq", &seq)) return;
  if (seq == 0) { /* point to point: kept while not complete */
    long long peer = -1, tag = 0;
    rankinfo *r = &c->ranks[rank];
    if (!get_str(line, "state", o.state, sizeof o.state) || strcmp(o.state, "started") ||
        (strcmp(o.op, "send") && strcmp(o.op, "recv")) || !get_num(line, "peer", &peer))
      return;
    get_num(line, "tag", &tag);
    get_num(line, "count", &o.count);
    get_str(line, "dtype", o.dtype, sizeof o.dtype);
    if (r->nopen < MAX_OPEN_P2P)
      snprintf(r->open_p2p[r->nopen], sizeof r->open_p2p[0], "%s %s rank %lld (tag %lld, %lld x %s)", o.op,
               strcmp(o.op, "send") ? "from" : "to", peer, tag, o.count, o.dtype);
    r->nopen++;
    return;
  }
  o.seq = (unsigned long long)seq;
  get_str(line, "dtype", o.dtype, sizeof o.dtype);
  get_str(line, "algo", o.algo, sizeof o.algo);
  get_str(line, "state", o.state, sizeof o.state);
  get_str(line, "redop", o.redop, sizeof o.redop);
  get_num(line, "count", &o.count);
  o.root = -1;
  get_num(line, "root", &o.root);
  rankinfo *r = &c->ranks[rank];
  if (!r->has_last || o.seq >= r->last.seq) {
    r->last = o;
    r->has_last = 1;
  }
}

static void describe(const op *o, char *out, size_t len) {
  if (o->root >= 0)
    snprintf(out, len, "#%llu %s(root %lld, %lld x %s) [%s, %s]", o->seq, o->op, o->root, o->count, o->dtype,
             o->algo, o->state);
  else if (o->redop[0])
    snprintf(out, len, "#%llu %s(%lld x %s, %s) [%s, %s]", o->seq, o->op, o->count, o->dtype, o->redop, o->algo,
             o->state);
  else
    snprintf(out, len, "#%llu %s(%lld x %s) [%s, %s]", o->seq, o->op, o->count, o->dtype, o->algo, o->state);
}

static void report(const comminfo *c) {
  unsigned long long top = 0;
  int dumped = 0;
  const char *backend = "?";
  for (int r = 0; r < c->size; r++) {
    const rankinfo *ri = &c->ranks[r];
    if (!ri->present) continue;
    dumped++;
    backend = ri->backend;
    unsigned long long at = ri->has_last ? ri->last.seq : 0;
    if (at > top) top = at;
  }
  printf("communicator %s (%s, %d ranks, dumps from %d):\n", c->id, backend, c->size, dumped);
  for (int r = 0; r < c->size; r++) {
    const rankinfo *ri = &c->ranks[r];
    char d[160] = "no collective";
    if (!ri->present) {
      printf("  rank %d: no dump (the process died, or its dump went elsewhere)\n", r);
      continue;
    }
    if (ri->has_last) describe(&ri->last, d, sizeof d);
    printf("  rank %d: %s; dumped because: %s\n", r, d, ri->reason);
    if (ri->nopen) {
      printf("    not complete:");
      for (int k = 0; k < ri->nopen && k < MAX_OPEN_P2P; k++) printf("%s %s", k ? "," : "", ri->open_p2p[k]);
      if (ri->nopen > MAX_OPEN_P2P) printf(" and %d more", ri->nopen - MAX_OPEN_P2P);
      printf("\n");
    }
  }
  if (!top) return;
  /* The collective the furthest rank is in: who has not reached it? */
  int behind = 0;
  unsigned long long lowest = top;
  for (int r = 0; r < c->size; r++) {
    const rankinfo *ri = &c->ranks[r];
    unsigned long long at = ri->present && ri->has_last ? ri->last.seq : 0;
    if (ri->present && at < lowest) lowest = at;
    if (ri->present && at < top) behind++;
  }
  if (!behind && dumped == c->size) {
    printf("  every rank reached collective #%llu\n", top);
    return;
  }
  printf("  the others wait in collective #%llu; not there:", top);
  for (int r = 0; r < c->size; r++) {
    const rankinfo *ri = &c->ranks[r];
    unsigned long long at = ri->present && ri->has_last ? ri->last.seq : 0;
    if (ri->present && at < top) printf(" rank %d (at #%llu)", r, at);
    if (!ri->present) printf(" rank %d (no dump)", r);
  }
  printf("\n  furthest behind: #%llu\n", lowest);
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    printf("usage: braid-trace FILE...\n"
           "  Reads flight-recorder dumps (BRAID_TRACE_FILE files, or logs with \"flight recorder:\" lines)\n"
           "  of every rank and names, per communicator, the collective the ranks were in and the ranks\n"
           "  that never entered it or are furthest behind.\n");
    return argc < 2 ? 2 : 0;
  }
  char line[8192];
  for (int i = 1; i < argc; i++) {
    FILE *f = fopen(argv[i], "r");
    if (!f) {
      fprintf(stderr, "braid-trace: cannot open %s\n", argv[i]);
      return 2;
    }
    while (fgets(line, sizeof line, f)) {
      const char *j = strchr(line, '{');
      if (j) take_line(j);
    }
    fclose(f);
  }
  if (!ncomms) {
    fprintf(stderr, "braid-trace: no flight-recorder records in the files given\n");
    return 1;
  }
  for (int i = 0; i < ncomms; i++) report(&comms[i]);
  return 0;
}
