/* Public API: lifecycle, argument checks and their messages, the self backend
   for every call, sticky failure, timeouts, logging. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "harness.h"
#include "os/time.h"

static const braid_dtype all_dtypes[] = {BRAID_F64, BRAID_F32, BRAID_F16, BRAID_BF16, BRAID_FP8_E4M3,
                                         BRAID_FP8_E5M2, BRAID_I64, BRAID_I32, BRAID_I16, BRAID_I8,
                                         BRAID_U64, BRAID_U32, BRAID_U16, BRAID_U8, BRAID_BOOL,
                                         BRAID_C64, BRAID_C128};
static const size_t all_sizes[] = {8, 4, 2, 2, 1, 1, 8, 4, 2, 1, 8, 4, 2, 1, 1, 8, 16};

static void clear_env(void) {
  const char *vars[] = {"BRAID_BACKEND", "BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_TIMEOUT",
                        "BRAID_DESTROY_TIMEOUT", "BRAID_LOG", "BRAID_LOG_FILE", "BRAID_LOG_SUBSYS"};
  for (size_t i = 0; i < BT_COUNT(vars); i++) unsetenv(vars[i]);
}

static braid_comm *self_comm(void) {
  clear_env();
  braid_comm *c = NULL;
  if (braid_init(NULL, &c) != BRAID_OK) {
    fprintf(stderr, "braid_init failed: %s\n", braid_last_error(NULL));
    exit(1);
  }
  return c;
}

static int test_version_and_names(void) {
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", BRAID_VERSION_MAJOR, BRAID_VERSION_MINOR, BRAID_VERSION_PATCH);
  BT_CHECK(!strcmp(braid_version(), want), "version %s", braid_version());
  for (size_t i = 0; i < BT_COUNT(all_dtypes); i++) {
    BT_CHECK(braid_dtype_size(all_dtypes[i]) == all_sizes[i], "dtype %d", (int)all_dtypes[i]);
    BT_CHECK(braid_dtype_name(all_dtypes[i]) != NULL, "dtype %d has no name", (int)all_dtypes[i]);
  }
  int unknown[] = {-1, 6, 9, 14, 24, 31, 42, 1000};
  for (size_t i = 0; i < BT_COUNT(unknown); i++) {
    BT_CHECK(braid_dtype_size((braid_dtype)unknown[i]) == 0, "code %d", unknown[i]);
    BT_CHECK(braid_dtype_name((braid_dtype)unknown[i]) == NULL, "code %d", unknown[i]);
  }
  BT_CHECK(!strcmp(braid_op_name(BRAID_BXOR), "bxor"), "op name");
  BT_CHECK(braid_op_name((braid_op)8) == NULL, "op 8");
  for (int s = BRAID_OK; s <= BRAID_ERR_INTERNAL; s++) {
    const char *t = braid_status_string((braid_status)s);
    BT_CHECK(t && *t && strcmp(t, "unknown status"), "status %d", s);
  }
  BT_CHECK(!strcmp(braid_status_string((braid_status)999), "unknown status"), "unknown status");
  BT_CHECK(braid_world_size(NULL) == -1 && braid_rank(NULL) == -1 && braid_backend(NULL) == NULL, "NULL comm");
  return 0;
}

static int test_init_defaults(void) {
  braid_comm *c = self_comm();
  BT_CHECK(braid_world_size(c) == 1 && braid_rank(c) == 0, "size/rank");
  BT_CHECK(!strcmp(braid_backend(c), "self"), "backend %s", braid_backend(c));
  BT_CHECK(!braid_has_stream_sync(c), "self has no stream");
  BT_CHECK(braid_last_error(c)[0] == 0, "fresh comm has no error");
  BT_CHECK_OK(braid_destroy(c), NULL);

  braid_config cfg = BRAID_CONFIG_INIT;
  cfg.backend = "self";
  cfg.timeout_s = 2.5;
  BT_CHECK_OK(braid_init(&cfg, &c), NULL);
  BT_CHECK(braid_world_size(c) == 1, "size");
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

static int test_init_errors(void) {
  clear_env();
  braid_comm *c = (braid_comm *)0x1;
  BT_CHECK_ST(braid_init(NULL, NULL), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "braid_init");

  setenv("BRAID_BACKEND", "carrier-pigeon", 1);
  BT_CHECK_ST(braid_init(NULL, &c), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK(c == NULL, "*comm cleared on failure");
  BT_CHECK_MSG(NULL, "unknown backend \"carrier-pigeon\"");
  BT_CHECK_MSG(NULL, "self");
  unsetenv("BRAID_BACKEND");

  setenv("BRAID_WORLD_SIZE", "4", 1);
  setenv("BRAID_RANK", "2", 1);
  /* No backend named and several ranks: shm, which needs the store. */
  BT_CHECK_ST(braid_init(NULL, &c), BRAID_ERR_BOOTSTRAP, NULL);
  BT_CHECK_MSG(NULL, "BRAID_STORE is missing");
  setenv("BRAID_BACKEND", "self", 1);
  BT_CHECK_ST(braid_init(NULL, &c), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "world size 1 only");
  BT_CHECK_MSG(NULL, "(rank 2)");

  setenv("BRAID_RANK", "4", 1);
  BT_CHECK_ST(braid_init(NULL, &c), BRAID_ERR_BOOTSTRAP, NULL);
  BT_CHECK_MSG(NULL, "rank 4 out of range for world size 4");

  setenv("BRAID_RANK", "x1", 1);
  BT_CHECK_ST(braid_init(NULL, &c), BRAID_ERR_BOOTSTRAP, NULL);
  BT_CHECK_MSG(NULL, "BRAID_RANK=\"x1\"");
  unsetenv("BRAID_RANK");
  unsetenv("BRAID_WORLD_SIZE");

  setenv("BRAID_TIMEOUT", "soon", 1);
  BT_CHECK_ST(braid_init(NULL, &c), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "BRAID_TIMEOUT=\"soon\"");
  setenv("BRAID_TIMEOUT", "-1", 1);
  BT_CHECK_ST(braid_init(NULL, &c), BRAID_ERR_INVALID_ARG, NULL);
  unsetenv("BRAID_TIMEOUT");

  braid_config cfg = BRAID_CONFIG_INIT;
  cfg.struct_size = 3;
  BT_CHECK_ST(braid_init(&cfg, &c), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "struct_size");
  cfg = (braid_config)BRAID_CONFIG_INIT;
  cfg.rank = 1;
  cfg.world_size = 1;
  BT_CHECK_ST(braid_init(&cfg, &c), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "rank 1 out of range for world size 1");
  cfg = (braid_config)BRAID_CONFIG_INIT;
  cfg.timeout_s = NAN;
  BT_CHECK_ST(braid_init(&cfg, &c), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "braid_config.timeout_s");
  /* An infinite destroy timeout would let braid_destroy hang. */
  cfg = (braid_config)BRAID_CONFIG_INIT;
  cfg.destroy_timeout_s = INFINITY;
  BT_CHECK_ST(braid_init(&cfg, &c), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "destroy timeout inf (braid_config.destroy_timeout_s");
  return 0;
}

/* Every call with a NULL communicator. */
static int test_null_comm(void) {
  int x = 0;
  uint64_t ev;
  braid_comm *out;
  struct {
    braid_status st;
    const char *name;
  } calls[] = {
      {braid_all_reduce(NULL, &x, 1, BRAID_I32, BRAID_SUM), "braid_all_reduce"},
      {braid_broadcast(NULL, &x, 1, BRAID_I32, 0), "braid_broadcast"},
      {braid_all_gather(NULL, &x, &x, 1, BRAID_I32), "braid_all_gather"},
      {braid_reduce_scatter(NULL, &x, &x, 1, BRAID_I32, BRAID_SUM), "braid_reduce_scatter"},
      {braid_send(NULL, &x, 1, BRAID_I32, 0, 0), "braid_send"},
      {braid_recv(NULL, &x, 1, BRAID_I32, 0, 0), "braid_recv"},
      {braid_sync(NULL), "braid_sync"},
      {braid_barrier(NULL), "braid_barrier"},
      {braid_split(NULL, 0, 0, &out), "braid_split"},
      {braid_destroy(NULL), "braid_destroy"},
      {braid_abort(NULL), "braid_abort"},
      {braid_event_create(NULL, &ev), "braid_event_create"},
      {braid_sync_comm_stream(NULL), "braid_sync_comm_stream"},
  };
  for (size_t i = 0; i < BT_COUNT(calls); i++) {
    BT_CHECK(calls[i].st == BRAID_ERR_INVALID_ARG, "%s returned %s", calls[i].name,
             braid_status_string(calls[i].st));
  }
  /* The thread's last error names the last call. */
  BT_CHECK_MSG(NULL, "braid_sync_comm_stream: comm is NULL");
  /* It names the caller: the launcher's rank, else the pid. */
  char pid[32];
  snprintf(pid, sizeof pid, "(pid %d)", (int)getpid());
  BT_CHECK_MSG(NULL, pid);
  setenv("BRAID_RANK", "3", 1);
  BT_CHECK_ST(braid_barrier(NULL), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "braid_barrier: comm is NULL (rank 3)");
  BT_CHECK_ST(braid_group_end(), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "no group is open on this thread (braid_group_start) (rank 3)");
  unsetenv("BRAID_RANK");
  BT_CHECK(!braid_has_stream_sync(NULL), "NULL has no stream");
  return 0;
}

#define EXPECT_ERR(expr, st, needle)   \
  do {                                 \
    BT_CHECK_ST(expr, st, c);          \
    BT_CHECK_MSG(c, needle);           \
    BT_CHECK_MSG(c, "(rank 0)");       \
    BT_CHECK_MSG(NULL, needle);        \
  } while (0)

static int test_invalid_args(void) {
  braid_comm *c = self_comm();
  float f[8] = {0};
  float g[8] = {0};
  braid_comm *child = NULL;
  EXPECT_ERR(braid_all_reduce(c, NULL, 4, BRAID_F32, BRAID_SUM), BRAID_ERR_INVALID_ARG,
             "braid_all_reduce: buf is NULL with count 4");
  EXPECT_ERR(braid_all_reduce(c, f, 4, (braid_dtype)7, BRAID_SUM), BRAID_ERR_INVALID_ARG,
             "braid_all_reduce: unknown dtype 7");
  EXPECT_ERR(braid_all_reduce(c, f, 4, BRAID_F32, (braid_op)42), BRAID_ERR_INVALID_ARG,
             "braid_all_reduce: unknown op 42");
  EXPECT_ERR(braid_all_reduce(c, f, 4, BRAID_C64, BRAID_MIN), BRAID_ERR_UNSUPPORTED,
             "op min is not defined for dtype c64");
  EXPECT_ERR(braid_all_reduce(c, f, 4, BRAID_F32, BRAID_BAND), BRAID_ERR_UNSUPPORTED,
             "op band is not defined for dtype f32");
  EXPECT_ERR(braid_all_reduce(c, f, SIZE_MAX / 2, BRAID_F32, BRAID_SUM), BRAID_ERR_INVALID_ARG, "overflows");
  /* Unknown codes are rejected even for count 0. */
  EXPECT_ERR(braid_all_reduce(c, NULL, 0, (braid_dtype)99, BRAID_SUM), BRAID_ERR_INVALID_ARG, "unknown dtype 99");

  EXPECT_ERR(braid_broadcast(c, f, 4, BRAID_F32, 7), BRAID_ERR_INVALID_ARG,
             "braid_broadcast: root 7 out of range for world size 1 (rank 0)");
  EXPECT_ERR(braid_broadcast(c, f, 4, BRAID_F32, -1), BRAID_ERR_INVALID_ARG, "root -1 out of range");
  EXPECT_ERR(braid_broadcast(c, NULL, 1, BRAID_F32, 0), BRAID_ERR_INVALID_ARG, "buf is NULL");

  EXPECT_ERR(braid_all_gather(c, NULL, g, 2, BRAID_F32), BRAID_ERR_INVALID_ARG, "send is NULL");
  EXPECT_ERR(braid_all_gather(c, f, NULL, 2, BRAID_F32), BRAID_ERR_INVALID_ARG, "recv is NULL");
  EXPECT_ERR(braid_all_gather(c, f + 1, f, 4, BRAID_F32), BRAID_ERR_INVALID_ARG, "overlaps");
  EXPECT_ERR(braid_all_gather(c, f, g, SIZE_MAX / 2 + 1, BRAID_U8), BRAID_ERR_INVALID_ARG, "overflows");

  EXPECT_ERR(braid_reduce_scatter(c, f, g, 2, BRAID_F32, BRAID_BXOR), BRAID_ERR_UNSUPPORTED, "bxor");
  EXPECT_ERR(braid_reduce_scatter(c, f, f + 1, 4, BRAID_F32, BRAID_SUM), BRAID_ERR_INVALID_ARG, "overlaps");
  EXPECT_ERR(braid_reduce_scatter(c, NULL, g, 1, BRAID_F32, BRAID_SUM), BRAID_ERR_INVALID_ARG, "send is NULL");

  EXPECT_ERR(braid_send(c, f, 1, BRAID_F32, 1, 0), BRAID_ERR_INVALID_ARG,
             "braid_send: dest 1 out of range for world size 1");
  EXPECT_ERR(braid_send(c, NULL, 1, BRAID_F32, 0, 0), BRAID_ERR_INVALID_ARG, "buf is NULL");
  EXPECT_ERR(braid_send(c, f, 1, (braid_dtype)-3, 0, 0), BRAID_ERR_INVALID_ARG, "unknown dtype -3");
  EXPECT_ERR(braid_recv(c, f, 1, BRAID_F32, -2, 0), BRAID_ERR_INVALID_ARG,
             "braid_recv: src -2 out of range for world size 1");
  EXPECT_ERR(braid_recv(c, f, SIZE_MAX, BRAID_U16, 0, 0), BRAID_ERR_INVALID_ARG, "overflows");

  EXPECT_ERR(braid_split(c, 0, 0, NULL), BRAID_ERR_INVALID_ARG, "braid_split: out is NULL");
  uint64_t ev = 0;
  EXPECT_ERR(braid_event_create(c, &ev), BRAID_ERR_UNSUPPORTED, "backend self has no communication stream");
  EXPECT_ERR(braid_event_destroy(c, 1), BRAID_ERR_UNSUPPORTED, "braid_event_destroy");
  EXPECT_ERR(braid_event_record_on_comm_stream(c, 1), BRAID_ERR_UNSUPPORTED, "braid_event_record_on_comm_stream");
  EXPECT_ERR(braid_event_record_on_stream(c, 1, 2), BRAID_ERR_UNSUPPORTED, "braid_event_record_on_stream");
  EXPECT_ERR(braid_comm_stream_wait_event(c, 1), BRAID_ERR_UNSUPPORTED, "braid_comm_stream_wait_event");
  EXPECT_ERR(braid_stream_wait_event(c, 1, 2), BRAID_ERR_UNSUPPORTED, "braid_stream_wait_event");
  EXPECT_ERR(braid_sync_comm_stream(c), BRAID_ERR_UNSUPPORTED, "braid_sync_comm_stream");

  /* None of these is fatal: the communicator still works, buffers untouched. */
  f[0] = 3;
  BT_CHECK_OK(braid_all_reduce(c, f, 1, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_split(c, 1, 0, &child), c);
  BT_CHECK(child != NULL, "split after errors");
  BT_CHECK_OK(braid_destroy(child), NULL);
  for (int i = 0; i < 8; i++) BT_CHECK(g[i] == 0, "recv untouched by rejected calls");
  BT_CHECK(f[0] == 3, "value");
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

static int test_count_zero(void) {
  braid_comm *c = self_comm();
  BT_CHECK_OK(braid_all_reduce(c, NULL, 0, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_broadcast(c, NULL, 0, BRAID_F32, 0), c);
  BT_CHECK_OK(braid_all_gather(c, NULL, NULL, 0, BRAID_F32), c);
  BT_CHECK_OK(braid_reduce_scatter(c, NULL, NULL, 0, BRAID_F32, BRAID_MAX), c);
  BT_CHECK_OK(braid_send(c, NULL, 0, BRAID_F32, 0, 1), c);
  BT_CHECK_OK(braid_recv(c, NULL, 0, BRAID_F32, 0, 1), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK_OK(braid_barrier(c), c);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

/* Self collectives: every dtype and op. One rank's result is its input (BOOL normalized). */
static int test_self_collectives(void) {
  braid_comm *c = self_comm();
  unsigned long long seed = 7;
  for (size_t d = 0; d < BT_COUNT(all_dtypes); d++) {
    braid_dtype dt = all_dtypes[d];
    size_t esz = all_sizes[d], n = 37;
    unsigned char in[37 * 16], buf[37 * 16 + 16], recv[37 * 16 + 16];
    for (size_t i = 0; i < n * esz; i++) in[i] = (unsigned char)(bt_rand(&seed) & 0x3f); /* no NaN patterns */
    if (dt == BRAID_BOOL)
      for (size_t i = 0; i < n; i++) in[i] &= 1;
    for (int op = BRAID_SUM; op <= BRAID_BXOR; op++) {
      memcpy(buf, in, n * esz);
      braid_status st = braid_all_reduce(c, buf, n, dt, (braid_op)op);
      if (st == BRAID_ERR_UNSUPPORTED) continue;
      BT_CHECK(st == BRAID_OK, "all_reduce %s %s: %s", braid_dtype_name(dt), braid_op_name((braid_op)op),
               braid_last_error(c));
      BT_CHECK(!memcmp(buf, in, n * esz), "all_reduce %s %s changed data", braid_dtype_name(dt),
               braid_op_name((braid_op)op));
      memset(recv, 0xAB, sizeof recv);
      BT_CHECK_OK(braid_reduce_scatter(c, in, recv, n, dt, (braid_op)op), c);
      BT_CHECK(!memcmp(recv, in, n * esz), "reduce_scatter %s", braid_dtype_name(dt));
      BT_CHECK(recv[n * esz] == 0xAB, "reduce_scatter wrote past the end");
    }
    memcpy(buf, in, n * esz);
    BT_CHECK_OK(braid_broadcast(c, buf, n, dt, 0), c);
    BT_CHECK(!memcmp(buf, in, n * esz), "broadcast");
    memset(recv, 0xCD, sizeof recv);
    BT_CHECK_OK(braid_all_gather(c, in, recv, n, dt), c);
    BT_CHECK(!memcmp(recv, in, n * esz) && recv[n * esz] == 0xCD, "all_gather");
    /* In place. */
    BT_CHECK_OK(braid_all_gather(c, recv, recv, n, dt), c);
    BT_CHECK(!memcmp(recv, in, n * esz), "all_gather in place");
    BT_CHECK_OK(braid_reduce_scatter(c, recv, recv, n, dt, BRAID_SUM), c);
  }
  /* BOOL: any non-zero byte is true; results are 0 or 1. */
  unsigned char b[4] = {0, 2, 255, 1};
  BT_CHECK_OK(braid_all_reduce(c, b, 4, BRAID_BOOL, BRAID_MAX), c);
  BT_CHECK(b[0] == 0 && b[1] == 1 && b[2] == 1 && b[3] == 1, "bool normalized: %d %d %d %d", b[0], b[1], b[2], b[3]);
  /* Unaligned buffers work. */
  unsigned char raw[64];
  float v[3] = {1.5f, -2.0f, 1e30f};
  memcpy(raw + 1, v, sizeof v);
  BT_CHECK_OK(braid_all_reduce(c, raw + 1, 3, BRAID_F32, BRAID_AVG), c);
  BT_CHECK(!memcmp(raw + 1, v, sizeof v), "unaligned avg");
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK_OK(braid_barrier(c), c);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

static int test_self_send_recv(void) {
  braid_comm *c = self_comm();
  int a[4] = {1, 2, 3, 4}, b[4] = {0};
  /* Send first, then receive. */
  BT_CHECK_OK(braid_send(c, a, 4, BRAID_I32, 0, 9), c);
  BT_CHECK_OK(braid_recv(c, b, 4, BRAID_I32, 0, 9), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(!memcmp(a, b, sizeof a), "send then recv");
  /* Receive first, then send. */
  memset(b, 0, sizeof b);
  BT_CHECK_OK(braid_recv(c, b, 4, BRAID_I32, 0, 10), c);
  BT_CHECK_OK(braid_send(c, a, 4, BRAID_I32, 0, 10), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(!memcmp(a, b, sizeof a), "recv then send");
  /* Order within a tag; tags independent. The send buffer is reusable after sync. */
  int v = 0;
  for (int i = 0; i < 5; i++) {
    v = 100 + i;
    BT_CHECK_OK(braid_send(c, &v, 1, BRAID_I32, 0, 3), c);
    BT_CHECK_OK(braid_sync(c), c); /* completes the send: a copy is kept */
  }
  int other = 77, got_other = 0;
  BT_CHECK_OK(braid_send(c, &other, 1, BRAID_I32, 0, 4), c);
  BT_CHECK_OK(braid_recv(c, &got_other, 1, BRAID_I32, 0, 4), c);
  BT_CHECK(got_other == 77, "tag 4");
  for (int i = 0; i < 5; i++) {
    int got = -1;
    BT_CHECK_OK(braid_recv(c, &got, 1, BRAID_I32, 0, 3), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(got == 100 + i, "message %d arrived as %d", i, got);
  }
  /* Size mismatch: the receive fails naming both sizes; the message is not lost. */
  double d[3] = {1, 2, 3}, r2[2] = {0}, r3[3] = {0};
  BT_CHECK_OK(braid_send(c, d, 3, BRAID_F64, 0, 5), c);
  BT_CHECK_ST(braid_recv(c, r2, 2, BRAID_F64, 0, 5), BRAID_ERR_MISMATCH, c);
  BT_CHECK_MSG(c, "3 elements of f64 (24 bytes)");
  BT_CHECK_MSG(c, "2 elements of f64 (16 bytes)");
  BT_CHECK(r2[0] == 0 && r2[1] == 0, "failed receive wrote nothing");
  BT_CHECK_OK(braid_recv(c, r3, 3, BRAID_F64, 0, 5), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(r3[0] == 1 && r3[2] == 3, "message delivered to the right receive");
  /* Receive posted first with the wrong size: reported by sync, message kept. */
  BT_CHECK_OK(braid_recv(c, r2, 2, BRAID_F64, 0, 6), c);
  BT_CHECK_OK(braid_send(c, d, 3, BRAID_F64, 0, 6), c);
  BT_CHECK_ST(braid_sync(c), BRAID_ERR_MISMATCH, c);
  BT_CHECK_MSG(c, "braid_sync: message from rank 0 with tag 6 has 3 elements of f64 (24 bytes)");
  memset(r3, 0, sizeof r3);
  BT_CHECK_OK(braid_recv(c, r3, 3, BRAID_F64, 0, 6), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(r3[1] == 2, "kept message");
  /* Same bytes, other dtype: a mismatch too. */
  float f2[2] = {0};
  BT_CHECK_OK(braid_send(c, d, 1, BRAID_F64, 0, 8), c);
  BT_CHECK_ST(braid_recv(c, f2, 2, BRAID_F32, 0, 8), BRAID_ERR_MISMATCH, c);
  BT_CHECK_OK(braid_recv(c, r2, 1, BRAID_F64, 0, 8), c);
  /* A large message. */
  size_t n = 1 << 20;
  unsigned char *big = malloc(n), *big2 = calloc(1, n);
  BT_CHECK(big && big2, "malloc");
  for (size_t i = 0; i < n; i++) big[i] = (unsigned char)(i * 31);
  BT_CHECK_OK(braid_send(c, big, n, BRAID_U8, 0, 0xFFFFFFFFu), c);
  BT_CHECK_OK(braid_recv(c, big2, n, BRAID_U8, 0, 0xFFFFFFFFu), c);
  BT_CHECK_OK(braid_barrier(c), c);
  BT_CHECK(!memcmp(big, big2, n), "1 MiB message");
  free(big);
  free(big2);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

static int test_split(void) {
  braid_comm *c = self_comm();
  braid_comm *none = (braid_comm *)0x1, *a = NULL, *b = NULL;
  BT_CHECK_OK(braid_split(c, BRAID_SPLIT_NONE, 0, &none), c);
  BT_CHECK(none == NULL, "BRAID_SPLIT_NONE gives NULL");
  BT_CHECK_OK(braid_split(c, 5, 99, &a), c);
  BT_CHECK(a && braid_world_size(a) == 1 && braid_rank(a) == 0, "child shape");
  BT_CHECK(!strcmp(braid_backend(a), "self"), "child backend");
  BT_CHECK_OK(braid_split(a, 0, 0, &b), a);
  BT_CHECK(b != NULL, "nested split");
  /* Parent and children interleaved: messages stay in their own communicator. */
  int x = 1, y = 2, z = 3, rx = 0, ry = 0, rz = 0;
  BT_CHECK_OK(braid_send(c, &x, 1, BRAID_I32, 0, 1), c);
  BT_CHECK_OK(braid_send(a, &y, 1, BRAID_I32, 0, 1), a);
  BT_CHECK_OK(braid_send(b, &z, 1, BRAID_I32, 0, 1), b);
  BT_CHECK_OK(braid_recv(b, &rz, 1, BRAID_I32, 0, 1), b);
  BT_CHECK_OK(braid_recv(c, &rx, 1, BRAID_I32, 0, 1), c);
  BT_CHECK_OK(braid_recv(a, &ry, 1, BRAID_I32, 0, 1), a);
  BT_CHECK(rx == 1 && ry == 2 && rz == 3, "got %d %d %d", rx, ry, rz);
  float f = 2.0f;
  BT_CHECK_OK(braid_all_reduce(a, &f, 1, BRAID_F32, BRAID_PROD), a);
  BT_CHECK_OK(braid_all_reduce(c, &f, 1, BRAID_F32, BRAID_PROD), c);
  BT_CHECK(f == 2.0f, "value");
  /* The parent may go first; children stay usable. */
  BT_CHECK_OK(braid_destroy(c), NULL);
  BT_CHECK_OK(braid_barrier(b), b);
  BT_CHECK_OK(braid_destroy(b), NULL);
  BT_CHECK_OK(braid_destroy(a), NULL);
  return 0;
}

static int test_abort_is_sticky(void) {
  braid_comm *c = self_comm();
  float f = 1;
  BT_CHECK_OK(braid_abort(c), c);
  BT_CHECK_OK(braid_abort(c), c); /* idempotent */
  BT_CHECK_ST(braid_all_reduce(c, &f, 1, BRAID_F32, BRAID_SUM), BRAID_ERR_ABORTED, c);
  BT_CHECK_MSG(c, "braid_all_reduce: communicator failed earlier: braid_abort");
  BT_CHECK_MSG(c, "aborted by the application");
  BT_CHECK_ST(braid_sync(c), BRAID_ERR_ABORTED, c);
  BT_CHECK_ST(braid_send(c, &f, 1, BRAID_F32, 0, 0), BRAID_ERR_ABORTED, c);
  braid_comm *child = NULL;
  BT_CHECK_ST(braid_split(c, 0, 0, &child), BRAID_ERR_ABORTED, c);
  BT_CHECK(child == NULL, "no child");
  /* Even a bad argument reports the failure first. */
  BT_CHECK_ST(braid_broadcast(c, &f, 1, BRAID_F32, 9), BRAID_ERR_ABORTED, c);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

static int test_timeout(void) {
  clear_env();
  setenv("BRAID_TIMEOUT", "0.2", 1);
  braid_comm *c = NULL;
  BT_CHECK_OK(braid_init(NULL, &c), NULL);
  int x = 0;
  BT_CHECK_OK(braid_recv(c, &x, 1, BRAID_I32, 0, 42), c);
  double t0 = braid__now();
  BT_CHECK_ST(braid_sync(c), BRAID_ERR_TIMEOUT, c);
  double waited = braid__now() - t0;
  BT_CHECK(waited >= 0.19 && waited < 30, "waited %.3f s", waited);
  BT_CHECK_MSG(c, "braid_sync: timed out after 0.2 s waiting for rank 0: 1 pending receive(s) (first: tag 42");
  /* Fatal: every later call fails at once with the same status. */
  BT_CHECK_ST(braid_all_reduce(c, &x, 1, BRAID_I32, BRAID_SUM), BRAID_ERR_TIMEOUT, c);
  BT_CHECK_MSG(c, "timed out after 0.2 s");
  BT_CHECK_OK(braid_destroy(c), NULL);
  unsetenv("BRAID_TIMEOUT");

  /* The config field wins over the environment. */
  setenv("BRAID_TIMEOUT", "1000", 1);
  braid_config cfg = BRAID_CONFIG_INIT;
  cfg.timeout_s = 0.1;
  BT_CHECK_OK(braid_init(&cfg, &c), NULL);
  BT_CHECK_OK(braid_recv(c, &x, 1, BRAID_I32, 0, 1), c);
  t0 = braid__now();
  BT_CHECK_ST(braid_sync(c), BRAID_ERR_TIMEOUT, c);
  BT_CHECK(braid__now() - t0 < 30, "config timeout honoured");
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

static int test_destroy_pending_bounded(void) {
  clear_env();
  setenv("BRAID_DESTROY_TIMEOUT", "0.3", 1);
  char path[] = "/tmp/braid-test-log-XXXXXX";
  int fd = mkstemp(path);
  BT_CHECK(fd >= 0, "mkstemp");
  close(fd);
  setenv("BRAID_LOG_FILE", path, 1);
  braid_comm *c = NULL;
  BT_CHECK_OK(braid_init(NULL, &c), NULL);
  int x = 0, y = 5;
  BT_CHECK_OK(braid_recv(c, &x, 1, BRAID_I32, 0, 1), c);
  BT_CHECK_OK(braid_send(c, &y, 1, BRAID_I32, 0, 2), c);
  double t0 = braid__now();
  BT_CHECK_OK(braid_destroy(c), NULL);
  double took = braid__now() - t0;
  BT_CHECK(took >= 0.29 && took < 30, "destroy took %.3f s", took);
  FILE *f = fopen(path, "r");
  char buf[4096] = {0};
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f) fclose(f);
  unlink(path);
  buf[n] = 0;
  BT_CHECK(strstr(buf, "abandoned 0 unfinished send(s) and 1 unfinished receive(s)"), "log: %s", buf);
  BT_CHECK(strstr(buf, "dropped 1 message(s)"), "log: %s", buf);
  BT_CHECK(strstr(buf, "[0] p2p WARN"), "log prefix: %s", buf);
  return 0;
}

static int test_logging(void) {
  clear_env();
  char path[] = "/tmp/braid-test-log-XXXXXX";
  int fd = mkstemp(path);
  BT_CHECK(fd >= 0, "mkstemp");
  close(fd);
  setenv("BRAID_LOG_FILE", path, 1);
  /* Default level: nothing is written for a healthy run or a rejected argument. */
  braid_comm *c = NULL;
  BT_CHECK_OK(braid_init(NULL, &c), NULL);
  BT_CHECK_ST(braid_broadcast(c, NULL, 1, BRAID_F32, 0), BRAID_ERR_INVALID_ARG, c);
  BT_CHECK_OK(braid_destroy(c), NULL);
  FILE *f = fopen(path, "r");
  BT_CHECK(f, "open log");
  BT_CHECK(fgetc(f) == EOF, "default level wrote something");
  fclose(f);
  /* info: init says what it chose, with host:pid [rank] subsystem. */
  setenv("BRAID_LOG", "info", 1);
  BT_CHECK_OK(braid_init(NULL, &c), NULL);
  BT_CHECK_OK(braid_destroy(c), NULL);
  f = fopen(path, "r");
  char buf[4096] = {0};
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char host[64] = {0}, want[160];
  gethostname(host, sizeof host - 1);
  snprintf(want, sizeof want, "%s:%ld [0] init INFO: braid %s: backend self, rank 0 of 1", host, (long)getpid(),
           braid_version());
  BT_CHECK(strstr(buf, want), "log lacks \"%s\": %s", want, buf);
  /* Subsystem filter: only p2p selected, init lines disappear. */
  BT_CHECK(truncate(path, 0) == 0, "truncate");
  setenv("BRAID_LOG_SUBSYS", "p2p", 1);
  BT_CHECK_OK(braid_init(NULL, &c), NULL);
  BT_CHECK_OK(braid_destroy(c), NULL);
  f = fopen(path, "r");
  BT_CHECK(fgetc(f) == EOF, "subsystem filter ignored");
  fclose(f);
  unlink(path);
  return 0;
}

/* Occurrences of needle in the file at path (its first 64 KiB). */
static int count_in_file(const char *path, const char *needle) {
  static char buf[65536];
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  int k = 0;
  for (const char *p = buf; (p = strstr(p, needle)); p += strlen(needle)) k++;
  return k;
}

/* Logging variables with values that make no sense: one warning each on
   stderr, naming the variable, the value and what is accepted, then the
   default; braid_init again with the same values does not repeat it. */
static int test_bad_log_settings(void) {
  clear_env();
  char errpath[] = "/tmp/braid-test-stderr-XXXXXX";
  int fd = mkstemp(errpath);
  BT_CHECK(fd >= 0, "mkstemp");
  fflush(stderr);
  int saved = dup(2);
  BT_CHECK(saved >= 0 && dup2(fd, 2) == 2, "redirect stderr");
  close(fd);
  setenv("BRAID_LOG", "verbose", 1);
  setenv("BRAID_LOG_FILE", "/nonexistent-braid-dir/run-%p.log", 1);
  setenv("BRAID_LOG_SUBSYS", "coll,bootstrap", 1);
  braid_comm *c = NULL;
  int ok = 1;
  for (int i = 0; i < 2 && ok; i++) {
    ok = braid_init(NULL, &c) == BRAID_OK;
    if (ok) {
      /* The default level, warn, is in effect: a rejected argument (info) prints nothing. */
      ok = braid_broadcast(c, NULL, 1, BRAID_F32, 0) == BRAID_ERR_INVALID_ARG;
      braid_destroy(c);
    }
  }
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  clear_env();
  braid__log_reload();
  BT_CHECK(ok, "braid_init with bad logging settings: %s", braid_last_error(NULL));
  int level = count_in_file(errpath, "env WARN: BRAID_LOG=\"verbose\" is not a log level (accepted: error, warn, "
                                     "info, debug, trace, off); using the default, warn");
  char want[256];
  snprintf(want, sizeof want,
           "env WARN: BRAID_LOG_FILE=\"/nonexistent-braid-dir/run-%%p.log\": cannot open "
           "/nonexistent-braid-dir/run-%ld.log for appending: %s (accepted: a file this process may create or "
           "append to, %%h = host, %%p = pid); logging to stderr",
           (long)getpid(), strerror(ENOENT));
  int file = count_in_file(errpath, want);
  int subsys = count_in_file(errpath, "env WARN: BRAID_LOG_SUBSYS=\"coll,bootstrap\": unknown subsystem "
                                      "\"bootstrap\" (accepted: all, or a comma list of init, coll, p2p, shm, tcp, "
                                      "boot, env); logging the others");
  int lines = count_in_file(errpath, "\n");
  char text[4096] = "";
  FILE *f = fopen(errpath, "r");
  if (f) {
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
  }
  unlink(errpath);
  BT_CHECK(level == 1 && file == 1 && subsys == 1 && lines == 3,
           "warnings (level %d, file %d, subsystems %d, %d lines in all):\n%s", level, file, subsys, lines, text);
  return 0;
}

/* braid_mem_alloc / braid_mem_free: argument errors with their messages,
   zero-filled page-rounded memory, many allocations, use with a backend
   (self), a mapping the rest of the host could open, no reuse after free. */
static int test_mem_alloc(void) {
  clear_env();
  void *p = (void *)1;
  BT_CHECK_ST(braid_mem_alloc(NULL, 64), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "braid_mem_alloc: ptr is NULL");
  BT_CHECK_ST(braid_mem_alloc(&p, 0), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "braid_mem_alloc: size 0 is zero");
  BT_CHECK(p == NULL, "a failed allocation leaves *ptr NULL");
  BT_CHECK_ST(braid_mem_alloc(&p, SIZE_MAX), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "too large");
  BT_CHECK_OK(braid_mem_free(NULL), NULL);
  int local = 0;
  BT_CHECK_ST(braid_mem_free(&local), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "was not returned by braid_mem_alloc");

  enum { NA = 40 };
  unsigned char *a[NA];
  long page = sysconf(_SC_PAGESIZE);
  for (int i = 0; i < NA; i++) {
    size_t sz = (size_t)(i * 3001 + 1);
    BT_CHECK_OK(braid_mem_alloc((void **)&a[i], sz), NULL);
    BT_CHECK(((uintptr_t)a[i] % (uintptr_t)page) == 0, "allocation %d not page aligned", i);
    /* Zero-filled and writable to the end of the last page. */
    size_t rounded = (sz + (size_t)page - 1) / (size_t)page * (size_t)page;
    for (size_t j = 0; j < rounded; j += 97) BT_CHECK(a[i][j] == 0, "allocation %d byte %zu not zero", i, j);
    memset(a[i], i, rounded);
  }
  for (int i = 0; i < NA; i++) BT_CHECK(a[i][0] == (unsigned char)i, "allocation %d overwritten", i);
  /* Freed out of order; an interior pointer or a second free is refused. */
  for (int i = 1; i < NA; i += 2) BT_CHECK_OK(braid_mem_free(a[i]), NULL);
  BT_CHECK_ST(braid_mem_free(a[2] + 1), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_ST(braid_mem_free(a[1]), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "or was freed already");
  for (int i = 0; i < NA; i += 2) BT_CHECK(a[i][1] == (unsigned char)i, "allocation %d changed by frees", i);

  /* Any backend takes it like ordinary memory. */
  braid_comm *c = self_comm();
  float *f;
  BT_CHECK_OK(braid_mem_alloc((void **)&f, 1000 * sizeof(float)), NULL);
  for (int i = 0; i < 1000; i++) f[i] = (float)i;
  BT_CHECK_OK(braid_all_reduce(c, f, 1000, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_sync(c), c);
  for (int i = 0; i < 1000; i++) BT_CHECK(f[i] == (float)i, "element %d", i);
  BT_CHECK_OK(braid_destroy(c), NULL);

  /* Another process of the host can open it: it is a memfd named after the allocation. */
  int found = 0;
  char path[64], link[128];
  for (int fd = 0; fd < 1024 && !found; fd++) {
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n > 0) {
      link[n] = 0;
      found = strstr(link, "memfd:braid-mem-") != NULL;
    }
  }
  BT_CHECK(found, "no memfd behind braid_mem_alloc memory");
  BT_CHECK_OK(braid_mem_free(f), NULL);
  for (int i = 0; i < NA; i += 2) BT_CHECK_OK(braid_mem_free(a[i]), NULL);
  return 0;
}

static const bt_case cases[] = {
    BT_CASE(test_version_and_names), BT_CASE(test_init_defaults),   BT_CASE(test_init_errors),
    BT_CASE(test_null_comm),         BT_CASE(test_invalid_args),    BT_CASE(test_count_zero),
    BT_CASE(test_self_collectives),  BT_CASE(test_self_send_recv),  BT_CASE(test_split),
    BT_CASE(test_abort_is_sticky),   BT_CASE(test_timeout),         BT_CASE(test_destroy_pending_bounded),
    BT_CASE(test_logging),           BT_CASE(test_bad_log_settings), BT_CASE(test_mem_alloc),
};

int main(int argc, char **argv) { return bt_main(argc, argv, cases, BT_COUNT(cases)); }
