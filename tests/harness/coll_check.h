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

enum { C_AR, C_BC, C_AG, C_RS };

typedef struct ccase {
  int coll;
  braid_dtype dt;
  braid_op op;
  size_t count;
  int inplace, mis;
  int mem; /* buffers from braid_mem_alloc: 0 none, 1 every rank, 2 even ranks only */
} ccase;

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

#endif
