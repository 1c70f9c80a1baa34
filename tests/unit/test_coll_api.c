/* The calls beyond the first four collectives: braid_reduce, braid_gather,
   braid_scatter, braid_all_to_all(v), scaled-sum ops and grouped calls.
   Their argument checks and sentences (a rejected call does nothing and
   leaves the communicator usable), count 0, buffers that matter at the
   root only, the op table, misuse of groups, and the version. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static braid_comm *self_comm(void) {
  static const char *vars[] = {"BRAID_BACKEND", "BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_LOG", "BRAID_LOG_FILE"};
  for (size_t i = 0; i < BT_COUNT(vars); i++) unsetenv(vars[i]);
  braid_comm *c = NULL;
  if (braid_init(NULL, &c) != BRAID_OK) {
    fprintf(stderr, "braid_init failed: %s\n", braid_last_error(NULL));
    exit(1);
  }
  return c;
}

#define EXPECT_ERR(expr, st, needle) \
  do {                               \
    BT_CHECK_ST(expr, st, c);        \
    BT_CHECK_MSG(c, needle);         \
    BT_CHECK_MSG(c, "(rank 0)");     \
    BT_CHECK_MSG(NULL, needle);      \
  } while (0)

static int test_version(void) {
  BT_CHECK(BRAID_VERSION_MINOR == 2 && !strcmp(braid_version(), "0.2.0"), "version %s", braid_version());
  return 0;
}

static int test_null_comm(void) {
  int x = 0;
  size_t z = 0;
  braid_op op;
  struct {
    braid_status st;
    const char *name;
  } calls[] = {
      {braid_reduce(NULL, &x, &x, 1, BRAID_I32, BRAID_SUM, 0), "braid_reduce"},
      {braid_gather(NULL, &x, &x, 1, BRAID_I32, 0), "braid_gather"},
      {braid_scatter(NULL, &x, &x, 1, BRAID_I32, 0), "braid_scatter"},
      {braid_all_to_all(NULL, &x, &x, 1, BRAID_I32), "braid_all_to_all"},
      {braid_all_to_allv(NULL, &x, &z, &z, &x, &z, &z, BRAID_I32), "braid_all_to_allv"},
      {braid_op_premul_sum(NULL, &x, BRAID_I32, &op), "braid_op_premul_sum"},
      {braid_op_destroy(NULL, (braid_op)8), "braid_op_destroy"},
  };
  for (size_t i = 0; i < BT_COUNT(calls); i++)
    BT_CHECK(calls[i].st == BRAID_ERR_INVALID_ARG, "%s returned %s", calls[i].name, braid_status_string(calls[i].st));
  BT_CHECK_MSG(NULL, "braid_op_destroy: comm is NULL");
  return 0;
}

static int test_invalid_args(void) {
  braid_comm *c = self_comm();
  float f[16] = {0}, g[16] = {0};
  size_t one[1] = {2}, zero[1] = {0}, big[1] = {SIZE_MAX / 2}, three[1] = {3};
  EXPECT_ERR(braid_reduce(c, NULL, g, 4, BRAID_F32, BRAID_SUM, 0), BRAID_ERR_INVALID_ARG,
             "braid_reduce: send is NULL with count 4");
  EXPECT_ERR(braid_reduce(c, f, NULL, 4, BRAID_F32, BRAID_SUM, 0), BRAID_ERR_INVALID_ARG, "recv is NULL with count 4");
  EXPECT_ERR(braid_reduce(c, f, g, 4, BRAID_F32, BRAID_SUM, 1), BRAID_ERR_INVALID_ARG,
             "braid_reduce: root 1 out of range for world size 1");
  EXPECT_ERR(braid_reduce(c, f, g, 4, BRAID_F32, BRAID_BAND, 0), BRAID_ERR_UNSUPPORTED,
             "op band is not defined for dtype f32");
  EXPECT_ERR(braid_reduce(c, f, g, 4, BRAID_F32, (braid_op)42, 0), BRAID_ERR_INVALID_ARG, "unknown op 42");
  EXPECT_ERR(braid_reduce(c, f, f + 1, 4, BRAID_F32, BRAID_SUM, 0), BRAID_ERR_INVALID_ARG,
             "recv overlaps send but is not the in-place position");
  EXPECT_ERR(braid_reduce(c, f, g, SIZE_MAX / 2, BRAID_F32, BRAID_SUM, 0), BRAID_ERR_INVALID_ARG, "overflows");

  EXPECT_ERR(braid_gather(c, NULL, g, 2, BRAID_F32, 0), BRAID_ERR_INVALID_ARG, "braid_gather: send is NULL");
  EXPECT_ERR(braid_gather(c, f, NULL, 2, BRAID_F32, 0), BRAID_ERR_INVALID_ARG, "recv is NULL");
  EXPECT_ERR(braid_gather(c, f, g, 2, BRAID_F32, -1), BRAID_ERR_INVALID_ARG, "root -1 out of range");
  EXPECT_ERR(braid_gather(c, f + 1, f, 4, BRAID_F32, 0), BRAID_ERR_INVALID_ARG,
             "send overlaps recv but is not the in-place position recv + 0*count");
  EXPECT_ERR(braid_gather(c, f, g, 2, (braid_dtype)7, 0), BRAID_ERR_INVALID_ARG, "unknown dtype 7");

  EXPECT_ERR(braid_scatter(c, f, NULL, 2, BRAID_F32, 0), BRAID_ERR_INVALID_ARG, "braid_scatter: recv is NULL");
  EXPECT_ERR(braid_scatter(c, NULL, g, 2, BRAID_F32, 0), BRAID_ERR_INVALID_ARG, "send is NULL");
  EXPECT_ERR(braid_scatter(c, f, f + 1, 4, BRAID_F32, 0), BRAID_ERR_INVALID_ARG,
             "recv overlaps send but is not the in-place position send + 0*count");
  EXPECT_ERR(braid_scatter(c, f, g, SIZE_MAX / 2 + 1, BRAID_U8, 0), BRAID_ERR_INVALID_ARG, "overflows");

  EXPECT_ERR(braid_all_to_all(c, NULL, g, 2, BRAID_F32), BRAID_ERR_INVALID_ARG, "braid_all_to_all: send is NULL");
  EXPECT_ERR(braid_all_to_all(c, f, f + 1, 4, BRAID_F32), BRAID_ERR_INVALID_ARG, "send overlaps recv");

  EXPECT_ERR(braid_all_to_allv(c, f, NULL, zero, g, one, zero, BRAID_F32), BRAID_ERR_INVALID_ARG,
             "braid_all_to_allv: send_counts is NULL");
  EXPECT_ERR(braid_all_to_allv(c, f, one, zero, g, NULL, zero, BRAID_F32), BRAID_ERR_INVALID_ARG,
             "recv_counts is NULL");
  EXPECT_ERR(braid_all_to_allv(c, f, one, zero, g, one, NULL, BRAID_F32), BRAID_ERR_INVALID_ARG,
             "recv_displs is NULL");
  EXPECT_ERR(braid_all_to_allv(c, f, three, zero, g, one, zero, BRAID_F32), BRAID_ERR_INVALID_ARG,
             "send_counts[0] is 3 but recv_counts[0] is 2");
  EXPECT_ERR(braid_all_to_allv(c, NULL, one, zero, g, one, zero, BRAID_F32), BRAID_ERR_INVALID_ARG,
             "send is NULL with send_counts[0] = 2");
  /* Both NULL is not "in place" when there is something to send. */
  EXPECT_ERR(braid_all_to_allv(c, NULL, one, zero, NULL, zero, zero, BRAID_F32), BRAID_ERR_INVALID_ARG,
             "send is NULL with send_counts[0] = 2");
  EXPECT_ERR(braid_all_to_allv(c, f, one, big, g, one, zero, BRAID_F32), BRAID_ERR_INVALID_ARG,
             "send_displs[0] 9223372036854775807 + send_counts[0] 2 elements of f32 overflow the address space");
  EXPECT_ERR(braid_all_to_allv(c, f, one, zero, f + 1, one, zero, BRAID_F32), BRAID_ERR_INVALID_ARG,
             "send overlaps recv");
  EXPECT_ERR(braid_all_to_allv(c, f, one, zero, g, one, zero, (braid_dtype)99), BRAID_ERR_INVALID_ARG,
             "unknown dtype 99");

  /* Nothing was written and the communicator goes on. */
  for (int i = 0; i < 16; i++) BT_CHECK(g[i] == 0 && f[i] == 0, "buffers untouched by rejected calls");
  f[0] = 2, f[1] = 5;
  BT_CHECK_OK(braid_reduce(c, f, g, 2, BRAID_F32, BRAID_SUM, 0), c);
  BT_CHECK(g[0] == 2 && g[1] == 5, "one rank's reduce is a copy");
  BT_CHECK_OK(braid_all_to_allv(c, f, one, zero, g + 4, one, zero, BRAID_F32), c);
  BT_CHECK(g[4] == 2 && g[5] == 5, "one rank's all-to-allv is a copy");
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

static int test_count_zero(void) {
  braid_comm *c = self_comm();
  size_t z[1] = {0};
  BT_CHECK_OK(braid_reduce(c, NULL, NULL, 0, BRAID_F32, BRAID_MAX, 0), c);
  BT_CHECK_OK(braid_gather(c, NULL, NULL, 0, BRAID_F32, 0), c);
  BT_CHECK_OK(braid_scatter(c, NULL, NULL, 0, BRAID_F32, 0), c);
  BT_CHECK_OK(braid_all_to_all(c, NULL, NULL, 0, BRAID_F32), c);
  BT_CHECK_OK(braid_all_to_allv(c, NULL, z, z, NULL, z, z, BRAID_F32), c);
  BT_CHECK_OK(braid_all_to_allv(c, NULL, NULL, NULL, NULL, z, z, BRAID_F32), c); /* in place */
  /* Unknown codes are rejected even for count 0. */
  EXPECT_ERR(braid_gather(c, NULL, NULL, 0, (braid_dtype)99, 0), BRAID_ERR_INVALID_ARG, "unknown dtype 99");
  EXPECT_ERR(braid_reduce(c, NULL, NULL, 0, BRAID_F32, BRAID_SUM, 3), BRAID_ERR_INVALID_ARG, "root 3");
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

/* recv of reduce and gather and send of scatter matter at the root only:
   NULL elsewhere is fine, and the root's are checked. */
static int root_only_body(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  float in[4] = {1, 2, 3, 4}, out[64] = {0};
  BT_CHECK_OK(braid_reduce(c, in, rank == 1 ? out : NULL, 4, BRAID_F32, BRAID_SUM, 1), c);
  BT_CHECK_OK(braid_gather(c, in, rank == 0 ? out : NULL, 4, BRAID_F32, 0), c);
  BT_CHECK_OK(braid_scatter(c, rank == n - 1 ? out : NULL, in, 4, BRAID_F32, n - 1), c);
  BT_CHECK_OK(braid_sync(c), c);
  if (rank == 0) {
    EXPECT_ERR(braid_gather(c, in, NULL, 4, BRAID_F32, 0), BRAID_ERR_INVALID_ARG, "braid_gather: recv is NULL");
    EXPECT_ERR(braid_reduce(c, in, NULL, 4, BRAID_F32, BRAID_SUM, 0), BRAID_ERR_INVALID_ARG, "recv is NULL");
  }
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

static int test_root_only_buffers(void) {
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++)
    if (maxr[b] >= 3 && bt_run_ranks(names[b], 3, 60, root_only_body, NULL)) return 1;
  return 0;
}

static int test_premul_ops(void) {
  braid_comm *c = self_comm();
  braid_op ops[70];
  float s = 0.5f;
  bool b = true;
  EXPECT_ERR(braid_op_premul_sum(c, NULL, BRAID_F32, &ops[0]), BRAID_ERR_INVALID_ARG,
             "braid_op_premul_sum: scalar is NULL");
  EXPECT_ERR(braid_op_premul_sum(c, &s, BRAID_F32, NULL), BRAID_ERR_INVALID_ARG, "op is NULL");
  EXPECT_ERR(braid_op_premul_sum(c, &b, BRAID_BOOL, &ops[0]), BRAID_ERR_UNSUPPORTED,
             "a scaled sum is not defined for dtype bool");
  EXPECT_ERR(braid_op_premul_sum(c, &s, (braid_dtype)8, &ops[0]), BRAID_ERR_INVALID_ARG, "unknown dtype 8");
  for (int i = 0; i < 64; i++) {
    BT_CHECK_OK(braid_op_premul_sum(c, &s, BRAID_F32, &ops[i]), c);
    BT_CHECK((int)ops[i] > (int)BRAID_BXOR && braid_op_name(ops[i]) == NULL, "handle %d", (int)ops[i]);
    for (int j = 0; j < i; j++) BT_CHECK(ops[i] != ops[j], "handles differ");
  }
  EXPECT_ERR(braid_op_premul_sum(c, &s, BRAID_F32, &ops[64]), BRAID_ERR_NO_MEMORY,
             "all 64 scaled-sum ops of this communicator are in use");
  float v[3] = {2, 4, -6}, w[3];
  BT_CHECK_OK(braid_all_reduce(c, v, 3, BRAID_F32, ops[5]), c);
  BT_CHECK(v[0] == 1 && v[1] == 2 && v[2] == -3, "one rank: scaled by 0.5");
  EXPECT_ERR(braid_all_reduce(c, v, 3, BRAID_F64, ops[5]), BRAID_ERR_INVALID_ARG,
             "op 13 is a scaled sum of f32, used with dtype f64");
  EXPECT_ERR(braid_op_destroy(c, BRAID_SUM), BRAID_ERR_INVALID_ARG, "op sum is built in");
  BT_CHECK_OK(braid_op_destroy(c, ops[5]), c);
  EXPECT_ERR(braid_op_destroy(c, ops[5]), BRAID_ERR_INVALID_ARG, "op 13 is not a live op of this communicator");
  EXPECT_ERR(braid_reduce(c, v, w, 3, BRAID_F32, ops[5], 0), BRAID_ERR_INVALID_ARG, "unknown op 13");
  /* the slot is free again */
  double d = 3;
  BT_CHECK_OK(braid_op_premul_sum(c, &d, BRAID_F64, &ops[65]), c);
  BT_CHECK(ops[65] == ops[5], "the freed slot is reused");
  double dv[2] = {1, -2};
  BT_CHECK_OK(braid_reduce_scatter(c, dv, dv, 2, BRAID_F64, ops[65]), c);
  BT_CHECK(dv[0] == 3 && dv[1] == -6, "reduce-scatter scaled by 3");
  /* ops belong to their communicator */
  braid_comm *child = NULL;
  BT_CHECK_OK(braid_split(c, 0, 0, &child), c);
  BT_CHECK_ST(braid_all_reduce(child, v, 3, BRAID_F32, ops[6]), BRAID_ERR_INVALID_ARG, child);
  BT_CHECK_MSG(child, "unknown op 14");
  BT_CHECK_OK(braid_destroy(child), NULL);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

static int test_group_misuse(void) {
  BT_CHECK_ST(braid_group_end(), BRAID_ERR_INVALID_ARG, NULL);
  BT_CHECK_MSG(NULL, "braid_group_end: no group is open on this thread");
  braid_comm *c = self_comm(), *child = (braid_comm *)1;
  BT_CHECK_OK(braid_group_start(), NULL);
  EXPECT_ERR(braid_split(c, 0, 0, &child), BRAID_ERR_INVALID_ARG, "braid_split: called inside a group");
  BT_CHECK(child == (braid_comm *)1, "nothing written");
  /* a rejected call inside a group returns at once and is not queued */
  float f[2] = {1, 2};
  EXPECT_ERR(braid_reduce(c, f, f, 2, BRAID_F32, BRAID_SUM, 5), BRAID_ERR_INVALID_ARG, "root 5");
  BT_CHECK_OK(braid_group_end(), NULL);
  /* a call queued on a communicator destroyed before the group ends never runs */
  braid_comm *d = self_comm();
  BT_CHECK_OK(braid_group_start(), NULL);
  BT_CHECK_OK(braid_all_reduce(d, f, 2, BRAID_F32, BRAID_SUM), d);
  BT_CHECK_OK(braid_destroy(d), NULL);
  BT_CHECK_OK(braid_all_reduce(c, f, 2, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_group_end(), NULL);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      BT_CASE(test_version),      BT_CASE(test_null_comm),         BT_CASE(test_invalid_args),
      BT_CASE(test_count_zero),   BT_CASE(test_root_only_buffers), BT_CASE(test_premul_ops),
      BT_CASE(test_group_misuse),
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
