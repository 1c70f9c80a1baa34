/* Collective checks shared by the backend tests: inputs whose reduction is
   exact in every dtype (small integers), the expected results computed
   independently, and one collective run with every check (results, guard
   bytes around the output, untouched out-of-place send buffers, bitwise
   identity across ranks). */
#ifndef BRAID_TEST_COLL_CHECK_H
#define BRAID_TEST_COLL_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"

extern const braid_dtype bt_all_dtypes[17];
#define BT_NDTYPES 17

/* Whether op is defined for dtype d. */
int bt_op_ok(braid_dtype d, braid_op op);
/* Input element i of rank r for (dtype, op), and the reduction of n ranks' inputs. */
void bt_put_input(braid_dtype d, braid_op op, int r, size_t i, void *out);
void bt_put_expected(braid_dtype d, braid_op op, int n, size_t i, void *out);
uint64_t bt_fnv(const void *p, size_t len);
/* malloc, or braid_mem_alloc when braid_mem is set. */
void *bt_buf_alloc(int braid_mem, size_t bytes);
void bt_buf_free(int braid_mem, void *p);

enum {
  C_AR, C_BC, C_AG, C_RS,
  C_RD, C_GA, C_SC, C_A2A, C_A2AV, /* bt_coll_more_one */
  C_ARP, C_RSP, C_RDP              /* all-reduce, reduce-scatter, reduce with a scaled sum */
};

typedef struct ccase {
  int coll;
  braid_dtype dt;
  braid_op op;
  size_t count;
  int inplace, mis;
  int mem;  /* buffers from braid_mem_alloc: 0 none, 1 every rank, 2 even ranks only */
  int root; /* rooted collectives of bt_coll_more_one */
  int pattern; /* all-to-allv's counts (bt_a2av_count) */
} ccase;

/* The scalar of the scaled-sum checks for dtype d (one element of d):
   0.5 for floats, 3 for integers, i for complex numbers, so every result
   of the small-integer inputs stays exact. */
void bt_premul_scalar(braid_dtype d, void *out);
/* The scaled sum (bt_premul_scalar) of n ranks' SUM inputs, element i. */
void bt_put_premul_expected(braid_dtype d, int n, size_t i, void *out);
/* Elements rank i sends rank j in all-to-allv pattern p (count sets the
   scale): 0 uneven with zero-count peers, 1 everything to rank 0, 2 only
   the diagonal, 3 every count equal, 4 nothing at all. */
size_t bt_a2av_count(int p, int i, int j, int n, size_t count);
#define BT_A2AV_PATTERNS 5

/* The collectives beyond the first four (reduce, gather, scatter,
   all-to-all, all-to-allv, scaled sums) with the same checks as
   bt_coll_one; k->op of a scaled sum is the op handle. 0 on success. */
int bt_coll_more_one(braid_comm *c, int rank, int n, const ccase *k);

/* One collective with every check; 0 on success (checks print and return 1). */
int bt_coll_one(braid_comm *c, int rank, int n, const ccase *k);

typedef struct matrix {
  const size_t *counts;
  int ncounts;
  int full; /* every dtype x op; else a few */
  int mem;  /* ccase.mem */
} matrix;

/* bt_run_ranks body: the matrix of collectives (arg: a matrix). */
int bt_coll_matrix_body(braid_comm *c, int rank, int n, void *arg);
/* The same for the collectives of bt_coll_more_one: full, every dtype (and
   op where it applies) at every root, in place and out of place, every
   all-to-allv pattern and scaled sums of eight dtypes; else (large counts)
   each collective once or twice on a few dtypes. */
int bt_coll_matrix_more(braid_comm *c, int rank, int n, void *arg);
/* braid_all_to_allv with send and receive blocks interleaved in one
   buffer (valid: no element both sent and received), and a refused call
   whose blocks share an element. */
int bt_a2av_interleaved(braid_comm *c, int rank, int n, void *arg);

#endif
