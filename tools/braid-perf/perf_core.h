/*
 * perf_core: the measurement driver shared by braid-perf and the peer harnesses
 * in bench/ (MPI, Gloo). Everything that defines the numbers lives here once —
 * option parsing, sizes, iteration adaptation, timing, the exact-value check
 * and the nccl-tests-style table / JSON output — so a ratio between two tools
 * compares libraries, not measurement methods. A tool supplies a perf_layer:
 * the handful of calls that move data with the library under test.
 *
 * Depends on nothing but libc/libm; braid.h is included for the dtype and op
 * codes only (no braid function is called from here).
 */
#ifndef BRAID_PERF_CORE_H
#define BRAID_PERF_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "braid.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum perf_op {
  PERF_ALLREDUCE,
  PERF_BROADCAST,
  PERF_ALLGATHER,
  PERF_REDUCE_SCATTER,
  PERF_SENDRECV, /* ring exchange: send to rank+1, receive from rank-1, complete */
  PERF_BARRIER,
  PERF_REDUCE,
  PERF_GATHER,
  PERF_SCATTER,
  PERF_ALLTOALL,
  PERF_ALLTOALLV, /* the uneven split of perf_a2av_counts */
  PERF_NOPS
} perf_op;

/* -o premulsum: a scaled sum (braid_op_premul_sum, ncclRedOpCreatePreMulSum)
   by 2, which keeps every check exact; a layer without one refuses it. */
#define PERF_PREMULSUM ((braid_op)8)

#define PERF_OOP 1u     /* out-of-place placement available */
#define PERF_INPLACE 2u /* in-place placement available */

/* The library under test. Every call returns 0 on success; on failure
   last_error() says why. Buffers handed to run():
     allreduce       send -> recv (count elements); in place: send == recv
     broadcast       recv (count elements), root's data to everyone; always in place
     allgather       send (count) -> recv (count*nranks); in place: send == recv + rank*count
     reduce_scatter  send (count*nranks) -> recv (count); in place: recv == send + rank*count
     sendrecv        send (count) to rank+1, recv (count) from rank-1, completed before returning
     barrier         no buffers
     reduce          send (count) -> recv (count) at root; in place at the root: send == recv
     gather          send (count) -> recv (count*nranks) at root; in place at the root: send == recv + root*count
     scatter         send (count*nranks) at root -> recv (count); in place at the root: recv == send + root*count
     alltoall        send (count*nranks) -> recv (count*nranks); in place: send == recv
     alltoallv       send -> recv with the counts and displacements of perf_a2av_counts (out of place) */
typedef struct perf_layer {
  const char *backend; /* name in the header and in JSON ("self", "openmpi-shm", ...) */
  const char *library; /* library and version for the header */
  int rank, nranks;
  void *ctx;
  unsigned (*placements)(void *ctx, perf_op op);
  /* NULL when the layer can run this dtype/op for this collective, else a sentence. */
  const char *(*unsupported)(void *ctx, perf_op op, braid_dtype dt, braid_op rop);
  int (*run)(void *ctx, perf_op op, const void *send, void *recv, size_t count, braid_dtype dt,
             braid_op rop, int root, int inplace);
  int (*complete)(void *ctx); /* waits for everything run() started (braid_sync) */
  int (*barrier)(void *ctx);
  const char *(*last_error)(void *ctx);
  /* Optional: writes '#' lines naming the algorithm the library picks for op. */
  void (*describe)(void *ctx, perf_op op, FILE *out);
  /* In-place reduce-scatter leaves this rank's block at the start of the
     buffer (MPI_IN_PLACE, Gloo) instead of at rank*count (braid). */
  int rs_inplace_result_at_start;
  /* Optional (-R 1): the library's own allocator for communication buffers
     (braid_mem_alloc, MPI_Alloc_mem); NULL: the layer has none. */
  void *(*mem_alloc)(void *ctx, size_t bytes);
  void (*mem_free)(void *ctx, void *p);
  /* Optional: the library takes device memory (a GPU backend). Buffers
     then come from mem_alloc, and the core fills and checks host mirrors
     copied through these around each checked call and around its own
     small reductions; timed loops touch device memory only. 0 on success. */
  int (*to_device)(void *ctx, void *dev, const void *host, size_t bytes);
  int (*to_host)(void *ctx, void *host, const void *dev, size_t bytes);
} perf_layer;

#define PERF_MAX_ITEMS 32

typedef struct perf_args {
  int ops[PERF_NOPS + 1]; /* selected ops, terminated by -1 */
  size_t minbytes, maxbytes, stepbytes;
  long stepfactor;
  long iters;       /* -n; 0: adapt */
  long warmup;      /* -w; -1: default */
  double target_s;  /* per-size time when adapting */
  int ndtypes;
  braid_dtype dtypes[PERF_MAX_ITEMS];
  int all_dtypes;
  int nredops;
  braid_op redops[PERF_MAX_ITEMS];
  int all_redops;
  int root;
  int check;
  int lib_mem; /* -R 1: buffers from the layer's mem_alloc */
  int json;
  const char *prog;
} perf_args;

/* Exit codes shared by every tool built on the core. */
#define PERF_EXIT_OK 0
#define PERF_EXIT_WRONG 1 /* some element was wrong */
#define PERF_EXIT_USAGE 2 /* invalid option or value */
#define PERF_EXIT_ERROR 3 /* the library reported an error */

/* Parses argv (OP first, then options). Returns -1 to go on, else an exit
   status (help printed: 0; bad usage: 2, message printed unless quiet). */
int perf_parse_args(int argc, char **argv, perf_args *a, const char *prog, int quiet);
void perf_usage(FILE *out, const char *prog);

/* Measures everything a asks for with layer L; returns the exit status. */
int perf_run(const perf_args *a, perf_layer *L);

const char *perf_op_name(perf_op op);
const char *perf_dtype_name(braid_dtype dt);
const char *perf_redop_name(braid_op op);
size_t perf_dtype_size(braid_dtype dt);
/* nccl-tests bus-bandwidth factor for op at n ranks. */
double perf_bus_factor(perf_op op, int nranks);
/* The all-to-allv split of count elements per block on average: rank i
   sends rank j floor(2 * count * (k+1) / (n+1)) elements, k = (j - i) mod n,
   so every rank sends and receives at most count * n, and each size of
   block occurs once per rank. Counts and displacements (contiguous, in rank
   order) in elements, arrays of nranks. */
void perf_a2av_counts(int rank, int nranks, size_t count, size_t *send_counts, size_t *send_displs,
                      size_t *recv_counts, size_t *recv_displs);
/* NULL when braid.h defines rop for dt, else a sentence saying why not. */
const char *perf_redop_invalid(braid_dtype dt, braid_op rop);

#ifdef __cplusplus
}
#endif

#endif
