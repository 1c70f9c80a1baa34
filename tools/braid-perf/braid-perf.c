/*
 * braid-perf: nccl-tests-style benchmark of braid's collectives.
 *
 *   braidrun -n 4 braid-perf allreduce -b 8 -e 64M -f 4
 *
 * Uses only the public API: braid_init(NULL, ...) takes backend, rank and
 * world size from the environment set by the launcher. The measurement and
 * output logic is shared with the MPI and Gloo harnesses in bench/
 * (perf_core.c), so their numbers are defined identically.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "braid.h"
#include "perf_core.h"

#define SENDRECV_TAG 0x7e5du

typedef struct bctx {
  braid_comm *c;
  char err[512];
} bctx;

static const char *b_last_error(void *ctx) {
  bctx *b = ctx;
  return b->err[0] ? b->err : braid_last_error(b->c);
}

static int b_check(bctx *b, braid_status st) {
  if (st == BRAID_OK) return 0;
  snprintf(b->err, sizeof b->err, "%s (%s)", braid_last_error(b->c), braid_status_string(st));
  return -1;
}

static void *b_mem_alloc(void *ctx, size_t bytes) {
  void *p = NULL;
  return b_check(ctx, braid_mem_alloc(&p, bytes)) ? NULL : p;
}

static void b_mem_free(void *ctx, void *p) { (void)b_check(ctx, braid_mem_free(p)); }

/* braid_all_reduce and braid_broadcast work in place only; sendrecv needs two
   buffers (a send may still read its buffer until braid_sync). */
static unsigned b_placements(void *ctx, perf_op op) {
  (void)ctx;
  switch (op) {
  case PERF_ALLREDUCE:
  case PERF_BROADCAST: return PERF_INPLACE;
  case PERF_ALLGATHER:
  case PERF_REDUCE_SCATTER: return PERF_OOP | PERF_INPLACE;
  case PERF_SENDRECV: return PERF_OOP;
  default: return PERF_OOP;
  }
}

static int b_run(void *ctx, perf_op op, const void *send, void *recv, size_t count, braid_dtype dt, braid_op rop,
                 int root, int inplace) {
  bctx *b = ctx;
  braid_comm *c = b->c;
  (void)inplace; /* placement is expressed by the pointers, as in braid.h */
  switch (op) {
  case PERF_ALLREDUCE: return b_check(b, braid_all_reduce(c, recv, count, dt, rop));
  case PERF_BROADCAST: return b_check(b, braid_broadcast(c, recv, count, dt, root));
  case PERF_ALLGATHER: return b_check(b, braid_all_gather(c, send, recv, count, dt));
  case PERF_REDUCE_SCATTER: return b_check(b, braid_reduce_scatter(c, send, recv, count, dt, rop));
  case PERF_SENDRECV: {
    int n = braid_world_size(c), r = braid_rank(c);
    if (b_check(b, braid_recv(c, recv, count, dt, (r - 1 + n) % n, SENDRECV_TAG))) return -1;
    if (b_check(b, braid_send(c, send, count, dt, (r + 1) % n, SENDRECV_TAG))) return -1;
    return b_check(b, braid_sync(c));
  }
  case PERF_BARRIER: return b_check(b, braid_barrier(c));
  default: return -1;
  }
}

static int b_complete(void *ctx) {
  bctx *b = ctx;
  return b_check(b, braid_sync(b->c));
}

static int b_barrier(void *ctx) {
  bctx *b = ctx;
  return b_check(b, braid_barrier(b->c));
}

/* Settings of the backend's own variables (BRAID_<BACKEND>_*), which steer
   its choices; nothing else from the environment (BRAID_TOKEN is a secret). */
static void print_backend_settings(const char *be, FILE *out) {
  char prefix[64];
  int len = snprintf(prefix, sizeof prefix, "BRAID_%s_", be);
  if (len <= 0 || (size_t)len >= sizeof prefix) return;
  for (char *p = prefix; *p; p++)
    if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
  int any = 0;
  for (char **e = environ; *e; e++)
    if (!strncmp(*e, prefix, (size_t)len)) {
      fprintf(out, "%s %s", any ? "" : "# settings:", *e);
      any = 1;
    }
  fprintf(out, "%s\n", any ? "" : "# settings: defaults (no BRAID_ variables of this backend set)");
}

static void b_describe(void *ctx, perf_op op, FILE *out) {
  bctx *b = ctx;
  (void)op;
  const char *be = braid_backend(b->c);
  if (!strcmp(be, "self")) {
    fprintf(out, "# algorithm: backend self is one rank: local copy / single-input reduction, no communication\n");
    return;
  }
  /* braid.h has no query for the algorithm or transfer path a backend picks
     per size; the backend's log (BRAID_LOG=info) names what it set up. */
  fprintf(out, "# algorithm: not reported (braid's API does not expose the choice backend %s makes per size;\n"
               "#   BRAID_LOG=info logs what the backend set up at init)\n", be);
  print_backend_settings(be, out);
}

int main(int argc, char **argv) {
  /* Usage errors are printed by rank 0 only (every rank parses the same argv);
     under mpirun the launcher's rank variable says which rank this is. */
  static const char *const rank_vars[] = {"BRAID_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  int quiet = 0;
  for (size_t i = 0; i < sizeof rank_vars / sizeof rank_vars[0]; i++) {
    const char *v = getenv(rank_vars[i]);
    if (v && *v) {
      quiet = strcmp(v, "0") != 0;
      break;
    }
  }
  perf_args a;
  int rc = perf_parse_args(argc, argv, &a, "braid-perf", quiet);
  if (rc >= 0) return rc;

  braid_comm *c = NULL;
  braid_status st = braid_init(NULL, &c);
  if (st != BRAID_OK) {
    /* The message already names the call, e.g. "braid_init: unknown backend ...". */
    fprintf(stderr, "braid-perf: %s (%s)\n", braid_last_error(NULL), braid_status_string(st));
    return PERF_EXIT_ERROR;
  }
  bctx b = {c, {0}};
  char lib[64];
  snprintf(lib, sizeof lib, "braid %s", braid_version());
  perf_layer L = {
      .backend = braid_backend(c),
      .library = lib,
      .rank = braid_rank(c),
      .nranks = braid_world_size(c),
      .ctx = &b,
      .placements = b_placements,
      .unsupported = NULL,
      .run = b_run,
      .complete = b_complete,
      .barrier = b_barrier,
      .last_error = b_last_error,
      .describe = b_describe,
      .rs_inplace_result_at_start = 0,
      .mem_alloc = b_mem_alloc,
      .mem_free = b_mem_free,
  };
  rc = perf_run(&a, &L);
  st = braid_destroy(c);
  if (st != BRAID_OK && rc == PERF_EXIT_OK) {
    fprintf(stderr, "braid-perf: %s\n", braid_last_error(NULL));
    rc = PERF_EXIT_ERROR;
  }
  return rc;
}
