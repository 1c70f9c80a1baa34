/* The mpi backend under mpirun: `mpi_run MODE [app|braid]` on every rank.
   MODE: matrix (the conformance matrix, then on split children), p2p (tags
   above MPI's guaranteed MPI_TAG_UB, order per (source, tag), unexpected
   and posted receives, inline and large payloads), mismatch (ranks in
   different collectives), timeout (a rank that stalls: the others fail
   within BRAID_TIMEOUT, the stalled one hears of it), late (a peer sends
   on a communicator the receiver destroyed after a failure), comm (a communicator
   the application made), auto (braid_init(NULL) picks mpi under mpirun),
   coll (BRAID_MPI_COLL's checks and choices), route (which route auto and
   BRAID_ALGO give a call), startfail (a rank whose start fails, or never
   comes, ends the others' start with a sentence), claim (a send finished
   inside braid_destroy is freed). "app": the test calls MPI_Init_thread itself and
   braid must not finalize; "braid": braid initializes MPI. Exit 0 on
   success on every rank. */
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll_check.h"
#include "core/comm.h"
#include "harness.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Tokens on a duplicate of MPI_COMM_WORLD order the ranks' steps in the
   failure modes (the application initialized MPI there, at
   MPI_THREAD_MULTIPLE): a rank goes on when its peer has reached a point,
   however slow the machine, not after a sleep. */
static void send_token(MPI_Comm sc, int dst) {
  int t = 1;
  MPI_Send(&t, 1, MPI_INT, dst, 0, sc);
}

static int await_token(MPI_Comm sc, int src, double limit_s) {
  int t = 0, done = 0;
  MPI_Request r;
  MPI_Irecv(&t, 1, MPI_INT, src, 0, sc, &r);
  double t0 = now_s();
  const struct timespec ms = {0, 1000000};
  while (MPI_Test(&r, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && now_s() - t0 < limit_s)
    nanosleep(&ms, NULL);
  if (!done) {
    MPI_Cancel(&r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
  }
  BT_CHECK(done, "no word from rank %d in %.0f s", src, limit_s);
  return 0;
}

static int open_comm(braid_comm **c, double timeout_s, const MPI_Comm *mc) {
  braid_config cfg = BRAID_CONFIG_INIT;
  cfg.backend = "mpi";
  cfg.timeout_s = timeout_s;
  cfg.mpi_comm = mc;
  BT_CHECK_OK(braid_init(&cfg, c), NULL);
  BT_CHECK(!strcmp(braid_backend(*c), "mpi"), "backend %s", braid_backend(*c));
  return 0;
}

static int mode_matrix(void) {
  braid_comm *c;
  if (open_comm(&c, 120, NULL)) return 1;
  int rank = braid_rank(c), n = braid_world_size(c);
  int mr, ms;
  MPI_Comm_rank(MPI_COMM_WORLD, &mr);
  MPI_Comm_size(MPI_COMM_WORLD, &ms);
  BT_CHECK(rank == mr && n == ms, "braid rank %d of %d, MPI rank %d of %d", rank, n, mr, ms);
  static const size_t counts[] = {1, 7, 1000};
  matrix m = {counts, 3, 1, 0};
  if (bt_coll_matrix_body(c, rank, n, &m) || bt_coll_matrix_more(c, rank, n, &m)) return 1;
  static const size_t big[] = {100003};
  matrix mb = {big, 1, 0, 0};
  if (bt_coll_matrix_body(c, rank, n, &mb) || bt_coll_matrix_more(c, rank, n, &mb)) return 1;
  /* braid_mem buffers too */
  matrix mm = {counts + 1, 1, 0, 1};
  if (bt_coll_matrix_body(c, rank, n, &mm)) return 1;
  BT_CHECK_OK(braid_barrier(c), c);
  braid_comm *child = NULL;
  BT_CHECK_OK(braid_split(c, (uint32_t)(rank % 2), (uint32_t)(n - rank), &child), c);
  BT_CHECK(child != NULL, "no child");
  int cn = braid_world_size(child), cr = braid_rank(child);
  BT_CHECK(cn == (n + 1 - rank % 2) / 2, "child size %d", cn);
  matrix mc = {counts, 3, 0, 0};
  if (bt_coll_matrix_body(child, cr, cn, &mc) || bt_coll_matrix_more(child, cr, cn, &mc)) return 1;
  BT_CHECK_OK(braid_destroy(child), NULL);
  /* BRAID_SPLIT_NONE: no communicator for this rank, the others go on. */
  child = (braid_comm *)1;
  BT_CHECK_OK(braid_split(c, rank == 0 ? BRAID_SPLIT_NONE : 5, 0, &child), c);
  if (rank == 0) {
    BT_CHECK(child == NULL, "SPLIT_NONE gave a communicator");
  } else {
    BT_CHECK(child && braid_world_size(child) == n - 1 && braid_rank(child) == rank - 1, "split without rank 0");
    int v = 1;
    BT_CHECK_OK(braid_all_reduce(child, &v, 1, BRAID_I32, BRAID_SUM), child);
    BT_CHECK_OK(braid_sync(child), child);
    BT_CHECK(v == n - 1, "sum %d", v);
    BT_CHECK_OK(braid_destroy(child), NULL);
  }
  BT_CHECK_OK(braid_barrier(c), c);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

/* Large messages (past the eager pieces) from rank 0 to rank n-1 that
   arrive before their receives: they stay with the sender until received,
   straight into the receive's buffer. More of them than the backend has
   tags for such messages (256), on a few user tags, received in reverse
   tag order: each must still match its own receive, in sending order. A
   token sent after them tells the receiver they all arrived. */
enum { LARGE = 6250, NLARGE = 300 };
static size_t large_count(int j) { return LARGE + (size_t)(j % 3); }
static int p2p_large(braid_comm *c, int rank, int n) {
  static const uint32_t tags[] = {3, 0x80000000u, 12345};
  enum { NT = 3 };
  size_t total = 0;
  for (int j = 0; j < NLARGE; j++) total += large_count(j);
  uint32_t *buf = malloc(sizeof(uint32_t) * total);
  BT_CHECK(buf, "out of memory");
  uint32_t token = 0;
  if (rank == 0) {
    size_t o = 0;
    for (int j = 0; j < NLARGE; j++) {
      for (size_t i = 0; i < large_count(j); i++) buf[o + i] = (uint32_t)j << 20 ^ (uint32_t)i;
      BT_CHECK_OK(braid_send(c, buf + o, large_count(j), BRAID_U32, n - 1, tags[j % NT]), c);
      o += large_count(j);
    }
    token = 1;
    BT_CHECK_OK(braid_send(c, &token, 1, BRAID_U32, n - 1, 4), c);
    BT_CHECK_OK(braid_sync(c), c);
  } else if (rank == n - 1) {
    BT_CHECK_OK(braid_recv(c, &token, 1, BRAID_U32, 0, 4), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(token == 1, "token %u", token);
    memset(buf, 0, sizeof(uint32_t) * total);
    for (int t = NT - 1; t >= 0; t--) {
      size_t o = 0;
      for (int j = 0; j < NLARGE; j++) {
        if (j % NT == t) BT_CHECK_OK(braid_recv(c, buf + o, large_count(j), BRAID_U32, 0, tags[t]), c);
        o += large_count(j);
      }
    }
    BT_CHECK_OK(braid_sync(c), c);
    size_t o = 0;
    for (int j = 0; j < NLARGE; j++) {
      for (size_t i = 0; i < large_count(j); i++)
        BT_CHECK(buf[o + i] == ((uint32_t)j << 20 ^ (uint32_t)i), "large message %d element %zu: %x", j, i,
                 buf[o + i]);
      o += large_count(j);
    }
  }
  free(buf);
  return 0;
}

/* Tags above 32767 (MPI's guaranteed MPI_TAG_UB) and at the top of braid's
   range; several messages per (source, tag) received in reverse tag order,
   so they wait as unexpected messages, and must come out in sending order. */
static int mode_p2p(void) {
  braid_comm *c;
  if (open_comm(&c, 60, NULL)) return 1;
  int rank = braid_rank(c), n = braid_world_size(c);
  static const uint32_t tags[] = {0, 32767, 32768, 0x7fffffffu, 0xffffffffu};
  enum { NT = 5, PER = 7 };
  /* Elements of u32 around the backend's split of a message: all in the
     header (up to 3968 bytes with Open MPI, 8192 with MPICH), the header
     and one short piece, the header and eager-sized pieces (a rest up to
     16 KiB). Such a send completes before its receive is posted; a larger
     one waits for it (below). */
  static const size_t sizes[] = {1, 300, 992, 993, 2048, 2049, 5000};
  size_t total = 0;
  for (int k = 0; k < PER; k++) total += sizes[k];
  uint32_t *out = malloc(sizeof(uint32_t) * total * NT * (size_t)n);
  uint32_t *in = malloc(sizeof(uint32_t) * total * NT * (size_t)n);
  BT_CHECK(out && in, "out of memory");
  for (int to = 0; to < n; to++) {
    size_t o = (size_t)to * total * NT;
    for (int k = 0; k < PER; k++)
      for (int t = 0; t < NT; t++) {
        for (size_t i = 0; i < sizes[k]; i++)
          out[o + i] = (uint32_t)rank << 24 ^ (uint32_t)to << 16 ^ (uint32_t)t << 12 ^ (uint32_t)k << 8 ^ (uint32_t)i;
        BT_CHECK_OK(braid_send(c, out + o, sizes[k], BRAID_U32, to, tags[t]), c);
        o += sizes[k];
      }
  }
  /* Let everything arrive unexpected, then receive in reverse tag order. */
  BT_CHECK_OK(braid_barrier(c), c);
  for (int from = 0; from < n; from++) {
    size_t o = (size_t)from * total * NT;
    for (int t = NT - 1; t >= 0; t--)
      for (int k = 0; k < PER; k++) {
        BT_CHECK_OK(braid_recv(c, in + o, sizes[k], BRAID_U32, from, tags[t]), c);
        o += sizes[k];
      }
  }
  BT_CHECK_OK(braid_sync(c), c);
  for (int from = 0; from < n; from++) {
    size_t o = (size_t)from * total * NT;
    for (int t = NT - 1; t >= 0; t--)
      for (int k = 0; k < PER; k++) {
        for (size_t i = 0; i < sizes[k]; i++) {
          uint32_t want =
              (uint32_t)from << 24 ^ (uint32_t)rank << 16 ^ (uint32_t)t << 12 ^ (uint32_t)k << 8 ^ (uint32_t)i;
          BT_CHECK(in[o + i] == want, "from %d tag %u message %d element %zu: %x, want %x", from, tags[t], k, i,
                   in[o + i], want);
        }
        o += sizes[k];
      }
  }
  /* Receives posted before the sends (a ring), large and small. */
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  for (size_t cnt = 1; cnt <= 1u << 20; cnt <<= 5) {
    memset(in, 0, sizeof(uint32_t) * (cnt < total ? cnt : total));
    uint32_t *rb = malloc(sizeof(uint32_t) * cnt), *sb = malloc(sizeof(uint32_t) * cnt);
    BT_CHECK(rb && sb, "out of memory");
    for (size_t i = 0; i < cnt; i++) sb[i] = (uint32_t)(rank * 1000003u + i);
    BT_CHECK_OK(braid_recv(c, rb, cnt, BRAID_U32, left, 0xfffffff0u), c);
    BT_CHECK_OK(braid_send(c, sb, cnt, BRAID_U32, right, 0xfffffff0u), c);
    BT_CHECK_OK(braid_sync(c), c);
    for (size_t i = 0; i < cnt; i++)
      BT_CHECK(rb[i] == (uint32_t)(left * 1000003u + i), "ring %zu element %zu", cnt, i);
    free(rb);
    free(sb);
  }
  if (n > 1 && p2p_large(c, rank, n)) return 1;
  /* A receive of another shape is a mismatch naming both sizes. */
  uint32_t one = 7;
  double two[2];
  BT_CHECK_OK(braid_send(c, &one, 1, BRAID_U32, right, 9), c);
  BT_CHECK_OK(braid_barrier(c), c);
  braid_status st = braid_recv(c, two, 2, BRAID_F64, left, 9);
  if (st == BRAID_OK) st = braid_sync(c);
  BT_CHECK(st == BRAID_ERR_MISMATCH, "shape mismatch gave %s", braid_status_string(st));
  BT_CHECK_MSG(c, "1 elements of u32");
  uint32_t got = 0;
  BT_CHECK_OK(braid_recv(c, &got, 1, BRAID_U32, left, 9), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(got == 7, "got %u", got);
  free(out);
  free(in);
  /* A large message nobody receives (the token after it shows it
     arrived): the receiver's destroy takes it, so the sender's ends
     without waiting out BRAID_DESTROY_TIMEOUT (5 s). */
  uint32_t *lost = calloc(LARGE, sizeof(uint32_t));
  BT_CHECK(lost, "out of memory");
  if (n > 1 && rank == 0) {
    BT_CHECK_OK(braid_send(c, lost, LARGE, BRAID_U32, n - 1, 77), c);
    BT_CHECK_OK(braid_send(c, &one, 1, BRAID_U32, n - 1, 78), c);
  } else if (n > 1 && rank == n - 1) {
    BT_CHECK_OK(braid_recv(c, &got, 1, BRAID_U32, 0, 78), c);
    BT_CHECK_OK(braid_sync(c), c);
  }
  double t0 = now_s();
  BT_CHECK_OK(braid_destroy(c), NULL);
  BT_CHECK(now_s() - t0 < 4, "braid_destroy took %.1f s", now_s() - t0);
  free(lost);
  return 0;
}

static int mode_mismatch(void) {
  braid_comm *c;
  if (open_comm(&c, 60, NULL)) return 1;
  int rank = braid_rank(c), n = braid_world_size(c);
  float buf[16] = {0};
  braid_status st = rank == n - 1 ? braid_broadcast(c, buf, 16, BRAID_F32, 0)
                                  : braid_all_reduce(c, buf, 16, BRAID_F32, BRAID_SUM);
  if (n == 1) {
    BT_CHECK_OK(st, c);
  } else {
    BT_CHECK(st == BRAID_ERR_MISMATCH, "kind mismatch gave %s: %s", braid_status_string(st), braid_last_error(c));
    BT_CHECK_MSG(c, "braid_broadcast(root 0, 16 x f32)");
    BT_CHECK_MSG(c, "braid_all_reduce(16 x f32, sum)");
  }
  BT_CHECK_OK(braid_destroy(c), NULL);
  /* The same call with different counts. */
  if (open_comm(&c, 60, NULL)) return 1;
  st = braid_all_reduce(c, buf, rank == 0 ? 8 : 16, BRAID_F32, BRAID_SUM);
  if (n > 1) {
    BT_CHECK(st == BRAID_ERR_MISMATCH, "count mismatch gave %s", braid_status_string(st));
    BT_CHECK_MSG(c, "8 x f32");
  }
  BT_CHECK_OK(braid_destroy(c), NULL);
  /* Counts that differ only in size: under auto rank 0's small call takes
     braid's route and the others' large one MPI's (from 3 ranks), where
     neither sees the other's messages; still a mismatch on every rank,
     found by the slow wait's exchange of calls, long before the timeout. */
  if (open_comm(&c, 60, NULL)) return 1;
  {
    enum { FEW = 1000, MANY = 10000 };
    float *v = calloc(MANY, sizeof *v);
    BT_CHECK(v != NULL, "out of memory");
    double t0 = now_s();
    st = braid_all_reduce(c, v, rank == 0 ? FEW : MANY, BRAID_F32, BRAID_SUM);
    if (n > 1) {
      BT_CHECK(st == BRAID_ERR_MISMATCH, "sizes on two routes gave %s: %s", braid_status_string(st),
               braid_last_error(c));
      BT_CHECK_MSG(c, "1000 x f32");
      BT_CHECK_MSG(c, "10000 x f32");
      BT_CHECK(now_s() - t0 < 10, "the mismatch took %.1f s", now_s() - t0);
    } else {
      BT_CHECK_OK(st, c);
    }
    free(v);
  }
  BT_CHECK_OK(braid_destroy(c), NULL);
  /* All-to-allv counts two ranks disagree on. */
  if (open_comm(&c, 60, NULL)) return 1;
  size_t *sc = calloc((size_t)n, sizeof(size_t)), *sd = calloc((size_t)n, sizeof(size_t));
  size_t *rc = calloc((size_t)n, sizeof(size_t)), *rd = calloc((size_t)n, sizeof(size_t));
  float *sbuf = calloc((size_t)n * 4, sizeof(float)), *rbuf = calloc((size_t)n * 4, sizeof(float));
  BT_CHECK(sc && sd && rc && rd && sbuf && rbuf, "out of memory");
  for (int q = 0; q < n; q++) sc[q] = rc[q] = 2, sd[q] = rd[q] = (size_t)q * 4;
  if (rank == 0 && n > 1) rc[1] = 3;
  st = braid_all_to_allv(c, sbuf, sc, sd, rbuf, rc, rd, BRAID_F32);
  if (st == BRAID_OK) st = braid_sync(c);
  if (n > 1) {
    BT_CHECK(st == BRAID_ERR_MISMATCH, "all-to-allv counts gave %s", braid_status_string(st));
    BT_CHECK_MSG(c, "rank 1 sends 2 elements of f32 to rank 0 where rank 0 expects 3 from it");
  } else {
    BT_CHECK_OK(st, c);
  }
  free(sc), free(sd), free(rc), free(rd), free(sbuf), free(rbuf);
  BT_CHECK_OK(braid_destroy(c), NULL);
  /* One rank in a call MPI carries (all-to-allv always is), the others in
     one braid's algorithms carry under BRAID_MPI_COLL=auto or generic:
     every rank still reports the mismatch. */
  if (open_comm(&c, 60, NULL)) return 1;
  size_t one[64] = {0}, offs[64] = {0};
  for (int q = 0; q < n && q < 64; q++) one[q] = 1, offs[q] = (size_t)q;
  float a2a_s[64] = {0}, a2a_r[64] = {0};
  st = rank == 0 ? braid_all_to_allv(c, a2a_s, one, offs, a2a_r, one, offs, BRAID_F32)
                 : braid_all_reduce(c, buf, 16, BRAID_F32, BRAID_SUM);
  if (st == BRAID_OK) st = braid_sync(c);
  if (n > 1) {
    BT_CHECK(st == BRAID_ERR_MISMATCH, "all-to-allv against all-reduce gave %s: %s", braid_status_string(st),
             braid_last_error(c));
    BT_CHECK_MSG(c, "braid_all_reduce(16 x f32, sum)");
  } else {
    BT_CHECK_OK(st, c);
  }
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

/* The route each call took, read back from the flight recorder, whose
   "algo" is "native" for MPI's collective and the generic algorithm's name
   for braid's: auto's choice by size and world size, and BRAID_ALGO's
   "native" winning over it. */
static int route_of(const char *dump, int seq, const char *op, char *algo, size_t len) {
  char key[64];
  snprintf(key, sizeof key, "\"seq\":%d,\"op\":\"%s\"", seq, op);
  const char *line = strstr(dump, key);
  const char *a = line ? strstr(line, "\"algo\":\"") : NULL;
  const char *eol = line ? strchr(line, '\n') : NULL;
  if (!a || (eol && a > eol)) return -1;
  a += strlen("\"algo\":\"");
  size_t k = strcspn(a, "\"");
  snprintf(algo, len, "%.*s", (int)k, a);
  return 0;
}

static int mode_route(void) {
  char path[128];
  snprintf(path, sizeof path, "/tmp/braid-mpi-route-%d.jsonl", (int)getpid());
  unlink(path);
  setenv("BRAID_TRACE_FILE", path, 1);
  setenv("BRAID_TRACE_SIGNAL", "1", 1);
  setenv("BRAID_ALGO", "broadcast=native", 1);
  braid_comm *c;
  if (open_comm(&c, 60, NULL)) return 1;
  int n = braid_world_size(c);
  static float v[1 << 20]; /* 4 MiB: past auto's 16 KiB for all-reduce */
  BT_CHECK_OK(braid_all_reduce(c, v, 8, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_all_reduce(c, v, 1 << 20, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_broadcast(c, v, 8, BRAID_F32, 0), c);
  raise(SIGUSR1);
  BT_CHECK_OK(braid_barrier(c), c); /* dumps at this call */
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK_OK(braid_destroy(c), NULL);
  unsetenv("BRAID_TRACE_FILE");
  unsetenv("BRAID_TRACE_SIGNAL");
  unsetenv("BRAID_ALGO");
  FILE *f = fopen(path, "r");
  BT_CHECK(f != NULL, "no flight-recorder dump at %s", path);
  static char dump[1 << 16];
  size_t got = fread(dump, 1, sizeof dump - 1, f);
  dump[got] = 0;
  fclose(f);
  unlink(path);
  char a[32];
  BT_CHECK(route_of(dump, 1, "allreduce", a, sizeof a) == 0 && strcmp(a, "native") != 0,
           "a 32-byte all-reduce took route %s, want braid's", a);
  BT_CHECK(route_of(dump, 2, "allreduce", a, sizeof a) == 0 && (n == 2) == (strcmp(a, "native") != 0),
           "a 4 MiB all-reduce on %d ranks took route %s", n, a);
  BT_CHECK(route_of(dump, 3, "broadcast", a, sizeof a) == 0 && !strcmp(a, "native"),
           "BRAID_ALGO=broadcast=native took route %s", a);
  return 0;
}

/* BRAID_MPI_COLL: a value braid does not know, and ranks that choose
   differently, fail braid_init on every rank with a sentence naming the
   variable (a rank that chose alone would wait in another kind of call). */
static int mode_coll(void) {
  int wr, wn;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &wn);
  braid_config cfg = BRAID_CONFIG_INIT;
  cfg.backend = "mpi";
  cfg.timeout_s = 30;
  braid_comm *c = NULL;
  setenv("BRAID_MPI_COLL", wr == 0 ? "fastest" : "auto", 1);
  braid_status st = braid_init(&cfg, &c);
  if (wn > 1 || wr == 0) {
    BT_CHECK(st == BRAID_ERR_INVALID_ARG && !c, "unknown BRAID_MPI_COLL on rank 0 gave %s",
             braid_status_string(st));
    BT_CHECK(strstr(braid_last_error(NULL), "BRAID_MPI_COLL") != NULL, "sentence: %s", braid_last_error(NULL));
  }
  if (wr == 0) BT_CHECK(strstr(braid_last_error(NULL), "\"fastest\"") != NULL, "sentence: %s", braid_last_error(NULL));
  if (c) braid_destroy(c);
  c = NULL;
  if (wn > 1) {
    /* Settings every rank must share, set differently by rank: each a
       refusal on every rank naming the variable. Spellings of BRAID_ALGO
       that parse alike agree. */
    static const struct {
      const char *name, *last, *others, *want;
    } differ[] = {
        {"BRAID_MPI_COLL", "native", "generic", "BRAID_MPI_COLL differs between ranks"},
        {"BRAID_ALGO", "allreduce=ring", "allreduce = rhd", "BRAID_ALGO differs between ranks"},
        {"BRAID_CHECK", "0", "1", "BRAID_CHECK differs between ranks"},
        {"BRAID_ALGO", "allreduce=ring", " allreduce=ring,", NULL},
    };
    for (size_t i = 0; i < sizeof differ / sizeof differ[0]; i++) {
      setenv(differ[i].name, wr == wn - 1 ? differ[i].last : differ[i].others, 1);
      st = braid_init(&cfg, &c);
      if (!differ[i].want) {
        BT_CHECK(st == BRAID_OK, "%s=\"%s\" against \"%s\" gave %s: %s", differ[i].name, differ[i].last,
                 differ[i].others, braid_status_string(st), braid_last_error(NULL));
      } else {
        BT_CHECK(st == BRAID_ERR_INVALID_ARG && !c, "%s differing gave %s", differ[i].name, braid_status_string(st));
        BT_CHECK(strstr(braid_last_error(NULL), differ[i].want) != NULL, "sentence: %s", braid_last_error(NULL));
      }
      if (c) braid_destroy(c);
      c = NULL;
      unsetenv(differ[i].name);
    }
  }
  /* Each choice works, and reads back the same sums. */
  static const char *const modes[] = {"native", "generic", "auto"};
  for (int m = 0; m < 3; m++) {
    setenv("BRAID_MPI_COLL", modes[m], 1);
    BT_CHECK_OK(braid_init(&cfg, &c), NULL);
    static float big[1 << 16];
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) big[i] = (float)(wr + (int)(i % 7));
    BT_CHECK_OK(braid_all_reduce(c, big, sizeof big / sizeof big[0], BRAID_F32, BRAID_SUM), c);
    BT_CHECK_OK(braid_sync(c), c);
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
      float want = (float)(wn * (wn - 1) / 2 + wn * (int)(i % 7));
      if (big[i] != want) {
        BT_CHECK(0, "%s: element %zu is %g, want %g", modes[m], i, (double)big[i], (double)want);
        break;
      }
    }
    if (bt_a2av_interleaved(c, wr, wn, NULL)) return 1;
    BT_CHECK_OK(braid_destroy(c), NULL);
  }
  unsetenv("BRAID_MPI_COLL");
  return 0;
}

/* The last rank stalls past the others' deadline: they fail with TIMEOUT
   in about BRAID_TIMEOUT, not in MPI's unbounded wait; it then hears of it. */
static int mode_timeout(void) {
  braid_comm *c;
  const double tmo = 2.0;
  MPI_Comm sc;
  MPI_Comm_dup(MPI_COMM_WORLD, &sc);
  if (open_comm(&c, tmo, NULL)) return 1;
  int rank = braid_rank(c), n = braid_world_size(c);
  if (n < 2) return braid_destroy(c) != BRAID_OK;
  int v = 1;
  BT_CHECK_OK(braid_all_reduce(c, &v, 1, BRAID_I32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  v = 1;
  if (rank == n - 1) {
    /* Enters only after every other rank has given up on it. */
    for (int r = 0; r < n - 1; r++)
      if (await_token(sc, r, 60)) return 1;
    double t0 = now_s();
    braid_status st = braid_all_reduce(c, &v, 1, BRAID_I32, BRAID_SUM);
    if (st == BRAID_OK) st = braid_sync(c);
    /* Over braid's own algorithms the others may have sent their parts
       before they timed out: the late rank's sum is then whole, and its
       next call learns of the failure. */
    if (st == BRAID_OK) {
      BT_CHECK(v == n, "late rank's sum %d, want %d", v, n);
      st = braid_all_reduce(c, &v, 1, BRAID_I32, BRAID_SUM);
      if (st == BRAID_OK) st = braid_sync(c);
    }
    BT_CHECK(st == BRAID_ERR_PEER_LOST || st == BRAID_ERR_TIMEOUT, "late rank got %s", braid_status_string(st));
    BT_CHECK(now_s() - t0 < tmo + 1.0, "late rank took %.1f s", now_s() - t0);
    BT_CHECK_MSG(c, "timed out");
  } else {
    double t0 = now_s();
    braid_status st = braid_all_reduce(c, &v, 1, BRAID_I32, BRAID_SUM);
    if (st == BRAID_OK) st = braid_sync(c);
    double dt = now_s() - t0;
    send_token(sc, n - 1);
    BT_CHECK(st == BRAID_ERR_TIMEOUT || st == BRAID_ERR_PEER_LOST, "waiting rank got %s: %s",
             braid_status_string(st), braid_last_error(c));
    BT_CHECK(dt > tmo * 0.9 && dt < tmo + 1.5, "failed after %.2f s with BRAID_TIMEOUT %g", dt, tmo);
    if (st == BRAID_ERR_TIMEOUT) {
      /* The ranks that waited told each other where they stand; the
         late one told nothing, so the sentence names it. */
      char absent[64];
      snprintf(absent, sizeof absent, "not in collective #2: rank %d", n - 1);
      BT_CHECK_MSG(c, absent);
    }
    /* Point-to-point waits are bounded too. */
  }
  braid_destroy(c);
  /* A receive whose sender never sends: bounded by the timeout. */
  if (open_comm(&c, tmo, NULL)) return 1;
  int x;
  double t0 = now_s();
  braid_status st = braid_recv(c, &x, 1, BRAID_I32, (rank + 1) % n, 77);
  if (st == BRAID_OK) st = braid_sync(c);
  double dt = now_s() - t0;
  BT_CHECK(st == BRAID_ERR_TIMEOUT || st == BRAID_ERR_PEER_LOST, "receive without a sender gave %s",
           braid_status_string(st));
  BT_CHECK(dt < tmo + 1.5, "receive failed after %.2f s", dt);
  braid_destroy(c);
  MPI_Comm_free(&sc);
  return 0;
}

/* A peer that has not heard of a failure yet still sends on the failed
   communicator: rank 1 times out first and tells the others; rank 0 hears
   of it and destroys its communicator at once; only then does rank 2 send
   to rank 0. The next communicator must start and work on every rank. */
static int mode_late(void) {
  braid_comm *c;
  MPI_Comm sc;
  MPI_Comm_dup(MPI_COMM_WORLD, &sc);
  if (open_comm(&c, 1.0, NULL)) return 1;
  int rank = braid_rank(c), n = braid_world_size(c);
  if (n < 3) return braid_destroy(c) != BRAID_OK;
  /* Earlier traffic on every pair, as a failed collective has had. */
  int x = 0;
  for (int i = 0; i < 3; i++) BT_CHECK_OK(braid_all_reduce(c, &x, 1, BRAID_I32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  braid_status st = BRAID_OK;
  if (rank == 0) {
    /* Waits only once rank 1 has timed out and told the others: it is
       told, not timed out itself. */
    if (await_token(sc, 1, 60)) return 1;
    st = braid_recv(c, &x, 1, BRAID_I32, 2, 9);
    if (st == BRAID_OK) st = braid_sync(c);
    BT_CHECK(st == BRAID_ERR_PEER_LOST, "rank 0 got %s: %s", braid_status_string(st), braid_last_error(c));
  } else if (rank == 1) {
    st = braid_recv(c, &x, 1, BRAID_I32, 2, 9);
    if (st == BRAID_OK) st = braid_sync(c);
    send_token(sc, 0);
    BT_CHECK(st == BRAID_ERR_TIMEOUT, "rank 1 got %s: %s", braid_status_string(st), braid_last_error(c));
  } else if (rank == 2) {
    /* Sends only after rank 0 heard of the failure and destroyed. */
    if (await_token(sc, 0, 60)) return 1;
    x = 42;
    /* A small send completes once MPI has it, notice read or not; a
       failure can only be the one rank 1 announced. */
    st = braid_send(c, &x, 1, BRAID_I32, 0, 9);
    if (st == BRAID_OK) st = braid_sync(c);
    BT_CHECK(st == BRAID_OK || st == BRAID_ERR_PEER_LOST, "late sender got %s: %s", braid_status_string(st),
             braid_last_error(c));
  }
  braid_destroy(c);
  if (rank == 0) send_token(sc, 2);
  MPI_Comm_free(&sc);
  if (open_comm(&c, 30, NULL)) return 1;
  int v = rank + 1;
  BT_CHECK_OK(braid_all_reduce(c, &v, 1, BRAID_I32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(v == n * (n + 1) / 2, "sum %d after the failed communicator, want %d", v, n * (n + 1) / 2);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

/* A send still unfinished when its rank's braid_destroy gave up draining
   completes inside the backend's own bounded wait (the peer posts its
   receive then): the data arrives whole, and the request is freed
   (main checks that no request was lost). */
static int mode_claim(void) {
  MPI_Comm sc;
  MPI_Comm_dup(MPI_COMM_WORLD, &sc);
  braid_config cfg = BRAID_CONFIG_INIT;
  cfg.backend = "mpi";
  cfg.timeout_s = 60;
  cfg.destroy_timeout_s = 1.0;
  braid_comm *c;
  BT_CHECK_OK(braid_init(&cfg, &c), NULL);
  int rank = braid_rank(c), n = braid_world_size(c);
  enum { N = 1 << 20 }; /* 4 MiB: the payload waits for the receive */
  int32_t *buf = malloc(N * sizeof *buf);
  BT_CHECK(buf != NULL, "out of memory");
  if (rank == 1) {
    for (int i = 0; i < N; i++) buf[i] = i ^ 0x5a5a;
    BT_CHECK_OK(braid_send(c, buf, N, BRAID_I32, 0, 5), c);
    send_token(sc, 0);
    double t0 = now_s();
    BT_CHECK_OK(braid_destroy(c), NULL);
    BT_CHECK(now_s() - t0 < 10, "braid_destroy took %.1f s", now_s() - t0);
  } else if (rank == 0 && n > 1) {
    if (await_token(sc, 1, 60)) return 1;
    /* Past rank 1's drain (1 s), inside its backend's wait (1 s more). */
    const struct timespec wait = {1, 500000000};
    nanosleep(&wait, NULL);
    memset(buf, 0, N * sizeof *buf);
    BT_CHECK_OK(braid_recv(c, buf, N, BRAID_I32, 1, 5), c);
    BT_CHECK_OK(braid_sync(c), c);
    for (int i = 0; i < N; i++)
      if (buf[i] != (i ^ 0x5a5a)) BT_CHECK(0, "element %d is %d", i, buf[i]);
    BT_CHECK_OK(braid_destroy(c), NULL);
  } else {
    BT_CHECK_OK(braid_destroy(c), NULL);
  }
  free(buf);
  MPI_Comm_free(&sc);
  return 0;
}

/* A communicator the application made: braid's ranks are the ones in it. */
static int mode_comm(void) {
  int wr, wn;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &wn);
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, wr % 2, -wr, &half);
  int hr, hn;
  MPI_Comm_rank(half, &hr);
  MPI_Comm_size(half, &hn);
  braid_comm *c;
  if (open_comm(&c, 60, &half)) return 1;
  BT_CHECK(braid_rank(c) == hr && braid_world_size(c) == hn, "braid %d of %d, MPI %d of %d", braid_rank(c),
           braid_world_size(c), hr, hn);
  int64_t v = wr;
  BT_CHECK_OK(braid_all_reduce(c, &v, 1, BRAID_I64, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  int64_t want = 0;
  for (int q = wr % 2; q < wn; q += 2) want += q;
  BT_CHECK(v == want, "sum %lld, want %lld", (long long)v, (long long)want);
  BT_CHECK_OK(braid_destroy(c), NULL);
  /* braid freed only its duplicate: the application's communicator works. */
  int s = 1, t = 0;
  MPI_Allreduce(&s, &t, 1, MPI_INT, MPI_SUM, half);
  BT_CHECK(t == hn, "application's communicator after braid_destroy: %d", t);
  MPI_Comm_free(&half);
  return 0;
}

/* braid_init(NULL) under mpirun without a store: the mpi backend. */
static int mode_auto(void) {
  unsetenv("BRAID_BACKEND");
  braid_comm *c;
  BT_CHECK_OK(braid_init(NULL, &c), NULL);
  BT_CHECK(!strcmp(braid_backend(c), "mpi"), "automatic backend %s", braid_backend(c));
  int v = 1;
  BT_CHECK_OK(braid_all_reduce(c, &v, 1, BRAID_I32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(v == braid_world_size(c), "sum %d", v);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

/* A rank whose braid_init fails before the ranks meet in MPI (a bad core
   or backend setting on that rank alone) still meets them, and every other
   rank fails at once naming it and its reason, instead of waiting in MPI
   for a rank that will not come. A rank that never calls braid_init ends
   the others' start after BRAID_INIT_TIMEOUT. MPI stays usable after. */
static int mode_startfail(void) {
  int wr, wn;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &wn);
  braid_config cfg = BRAID_CONFIG_INIT;
  cfg.backend = "mpi";
  static const struct {
    const char *name, *value, *want;
    braid_status st;
  } bad[] = {
      {"BRAID_TIMEOUT", "soon", "BRAID_TIMEOUT", BRAID_ERR_INVALID_ARG},
      {"BRAID_ALGO", "allreduce=fastest", "BRAID_ALGO=\"allreduce=fastest\"", BRAID_ERR_INVALID_ARG},
      {"BRAID_MPI_MAX_COUNT", "0", "BRAID_MPI_MAX_COUNT", BRAID_ERR_INVALID_ARG},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    for (int victim = 0; victim < wn; victim += wn > 1 ? wn - 1 : 1) {
      if (wr == victim) setenv(bad[i].name, bad[i].value, 1);
      braid_comm *c = NULL;
      double t0 = now_s();
      braid_status st = braid_init(&cfg, &c);
      double dt = now_s() - t0;
      const char *e = braid_last_error(NULL);
      BT_CHECK(st == bad[i].st && !c, "%s=\"%s\" on rank %d gave %s on rank %d: %s", bad[i].name, bad[i].value,
               victim, braid_status_string(st), wr, e);
      BT_CHECK(strstr(e, bad[i].want) != NULL, "sentence on rank %d: %s", wr, e);
      if (wr != victim) {
        char who[64];
        snprintf(who, sizeof who, "rank %d could not start: ", victim);
        BT_CHECK(strstr(e, who) != NULL, "sentence on rank %d does not name rank %d: %s", wr, victim, e);
        BT_CHECK(dt < 2.0, "rank %d took %.2f s to learn of rank %d's failure", wr, dt, victim);
        fprintf(stderr, "fault-time: mpi start failure of rank %d (%s) reached rank %d in %.4f s\n", victim,
                bad[i].name, wr, dt);
      }
      if (c) braid_destroy(c);
      unsetenv(bad[i].name);
    }
  }
  /* The last rank does not come: the others' start ends after
     BRAID_INIT_TIMEOUT, saying so, on a communicator of the test's (the
     duplicate MPI could not finish stays pending on it). */
  if (wn > 1) {
    MPI_Comm mc;
    MPI_Comm_dup(MPI_COMM_WORLD, &mc);
    if (wr != wn - 1) {
      setenv("BRAID_INIT_TIMEOUT", "1", 1);
      cfg.mpi_comm = &mc;
      braid_comm *c = NULL;
      double t0 = now_s();
      braid_status st = braid_init(&cfg, &c);
      double dt = now_s() - t0;
      const char *e = braid_last_error(NULL);
      BT_CHECK(st == BRAID_ERR_TIMEOUT && !c, "a missing rank gave %s: %s", braid_status_string(st), e);
      BT_CHECK(strstr(e, "BRAID_INIT_TIMEOUT") && strstr(e, "has not called braid_init"), "sentence: %s", e);
      BT_CHECK(dt >= 0.9 && dt < 5.0, "the start ended after %.2f s with BRAID_INIT_TIMEOUT=1", dt);
      cfg.mpi_comm = NULL;
      unsetenv("BRAID_INIT_TIMEOUT");
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  /* And a start of the whole job works after all that. */
  braid_comm *c = NULL;
  BT_CHECK_OK(braid_init(&cfg, &c), NULL);
  int v = 1;
  BT_CHECK_OK(braid_all_reduce(c, &v, 1, BRAID_I32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(v == wn, "sum %d after the failed starts", v);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

/* BRAID_MPI_MAX_COUNT cuts messages at both ends: ranks that disagree fail
   every start, naming it, instead of mixing pieces. */
static int mode_agree(void) {
  int wr;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  if (wr == 0) setenv("BRAID_MPI_MAX_COUNT", "4096", 1);
  braid_config cfg = BRAID_CONFIG_INIT;
  cfg.backend = "mpi";
  cfg.timeout_s = 30;
  braid_comm *c = NULL;
  BT_CHECK_ST(braid_init(&cfg, &c), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "BRAID_MPI_MAX_COUNT differs between ranks");
  unsetenv("BRAID_MPI_MAX_COUNT");
  BT_CHECK_OK(braid_init(&cfg, &c), NULL);
  int v = 1;
  BT_CHECK_OK(braid_all_reduce(c, &v, 1, BRAID_I32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  int n = braid_world_size(c);
  BT_CHECK(v == n, "sum %d after the refused start, want %d", v, n);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

/* An error MPI itself finds (BRAID_CHECK=0, native route: a broadcast
   whose ranks disagree on the size) comes back as braid's sentence with
   MPI's own error, fails the communicator, and reaches the other ranks at
   their next call; it never aborts the job, also where braid initialized
   MPI (whose MPI_COMM_WORLD handler would be fatal). */
static int mode_mpierr(void) {
  braid_comm *c;
  if (open_comm(&c, 20, NULL)) return 1;
  int rank = braid_rank(c);
  char b[128] = {0};
  braid_status st = braid_broadcast(c, b, rank == 0 ? 100 : 50, BRAID_U8, 0);
  if (rank != 0) {
    BT_CHECK(st == BRAID_ERR_BACKEND, "truncated broadcast gave %s: %s", braid_status_string(st), braid_last_error(c));
    BT_CHECK_MSG(c, "braid_broadcast: MPI_Ibcast failed: ");
    /* The request's own error, not MPI's pointer to the statuses. */
    BT_CHECK(!strstr(braid_last_error(c), "MPI_ERR_IN_STATUS") && !strstr(braid_last_error(c), "MPI_ERROR field"),
             "the sentence names no error of its own: %s", braid_last_error(c));
#ifdef OPEN_MPI
    BT_CHECK_MSG(c, "MPI_ERR_TRUNCATE");
#endif
  }
  float f[4] = {0};
  st = braid_all_reduce(c, f, 4, BRAID_F32, BRAID_SUM);
  BT_CHECK(st != BRAID_OK, "rank %d: the all-reduce after the failure succeeded", rank);
  if (rank == 0) BT_CHECK_MSG(c, "rank 1 failed");
  braid_destroy(c);
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "matrix";
  int app = argc > 2 && !strcmp(argv[2], "app");
  if (!strcmp(mode, "comm")) app = 1;
  if (app) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  }
  int rc;
  if (!strcmp(mode, "matrix")) rc = mode_matrix();
  else if (!strcmp(mode, "p2p")) rc = mode_p2p();
  else if (!strcmp(mode, "mismatch")) rc = mode_mismatch();
  else if (!strcmp(mode, "timeout")) rc = mode_timeout();
  else if (!strcmp(mode, "late")) rc = mode_late();
  else if (!strcmp(mode, "comm")) rc = mode_comm();
  else if (!strcmp(mode, "auto")) rc = mode_auto();
  else if (!strcmp(mode, "coll")) rc = mode_coll();
  else if (!strcmp(mode, "route")) rc = mode_route();
  else if (!strcmp(mode, "startfail")) rc = mode_startfail();
  else if (!strcmp(mode, "agree")) rc = mode_agree();
  else if (!strcmp(mode, "claim")) rc = mode_claim();
  else if (!strcmp(mode, "mpierr")) rc = mode_mpierr();
  else {
    fprintf(stderr, "mpi_run: unknown mode %s\n", mode);
    rc = 2;
  }
  if (braid__reqs_lost()) {
    fprintf(stderr, "mpi_run: %d request(s) of destroyed communicators were never freed\n", braid__reqs_lost());
    if (!rc) rc = 1;
  }
  if (app) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) {
      fprintf(stderr, "mpi_run: braid finalized an MPI the application initialized\n");
      rc = 1;
    } else {
      MPI_Finalize();
    }
  } else if (!rc) {
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
      fprintf(stderr, "mpi_run: braid did not initialize MPI\n");
      rc = 1;
    }
  }
  if (rc) fprintf(stderr, "mpi_run %s: FAILED\n", mode);
  return rc;
}
