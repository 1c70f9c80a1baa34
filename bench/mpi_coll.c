/*
 * mpi_coll: the same measurement as braid-perf (same options, same table and
 * JSON, same exact-value check; the driver is tools/braid-perf/perf_core.c)
 * with MPI's collectives, so bench/compare can put the two side by side.
 *
 *   mpirun -n 2 --mca btl self,vader build/bench/mpi_coll allreduce --json --label openmpi-shm
 *
 *   allreduce       MPI_Allreduce (out of place, and MPI_IN_PLACE)
 *   broadcast       MPI_Bcast from -r
 *   allgather       MPI_Allgather (out of place, and MPI_IN_PLACE)
 *   reduce_scatter  MPI_Reduce_scatter_block (out of place, and MPI_IN_PLACE:
 *                   the block lands at the start of the buffer)
 *   sendrecv        MPI_Sendrecv to rank+1 from rank-1 (ring exchange)
 *   barrier         MPI_Barrier
 *   reduce          MPI_Reduce to -r (out of place, and MPI_IN_PLACE at the root)
 *   gather          MPI_Gather to -r (out of place, and MPI_IN_PLACE at the root)
 *   scatter         MPI_Scatter from -r (out of place, and MPI_IN_PLACE at the root)
 *   alltoall        MPI_Alltoall (out of place, and MPI_IN_PLACE)
 *   alltoallv       MPI_Alltoallv with the uneven split of perf_a2av_counts
 * Data movement uses MPI_BYTE; reductions need an MPI type and op (no f16,
 * bf16, fp8, bool or avg in MPI: those are refused with exit 2).
 *
 * --label NAME (or env BRAID_PERF_LABEL) names the backend column, e.g.
 * openmpi-shm / openmpi-tcp; default "mpi". --thread single|funneled|
 * serialized|multiple initializes MPI with MPI_Init_thread at that level
 * (default: MPI_Init).
 */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perf_core.h"

typedef struct mctx {
  MPI_Comm comm;
  int rank, size;
  char err[MPI_MAX_ERROR_STRING + 128];
  int *a2av;            /* MPI_Alltoallv's byte counts and displacements for a2av_key */
  size_t a2av_key;      /* count * element size they were made for */
  int thread;           /* thread level MPI provided */
} mctx;

/* perf_a2av_counts in bytes as MPI's ints, made once per size. */
static const int *a2av_of(mctx *m, size_t count, size_t esz) {
  const int n = m->size;
  if (!m->a2av) {
    m->a2av = malloc(4 * (size_t)n * sizeof *m->a2av);
    if (!m->a2av) return NULL;
    m->a2av_key = (size_t)-1;
  }
  if (m->a2av_key != count * esz) {
    size_t *v = malloc(4 * (size_t)n * sizeof *v);
    if (!v) return NULL;
    perf_a2av_counts(m->rank, n, count, v, v + n, v + 2 * n, v + 3 * n);
    for (int i = 0; i < 4 * n; i++) {
      if (v[i] * esz > (size_t)INT_MAX) {
        free(v);
        return NULL;
      }
      m->a2av[i] = (int)(v[i] * esz);
    }
    free(v);
    m->a2av_key = count * esz;
  }
  return m->a2av;
}

static int m_check(mctx *m, int rc, const char *call) {
  if (rc == MPI_SUCCESS) return 0;
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, s, &len);
  snprintf(m->err, sizeof m->err, "%s: %s", call, s);
  return -1;
}

static MPI_Datatype m_type(braid_dtype dt) {
  switch (dt) {
  case BRAID_F64: return MPI_DOUBLE;
  case BRAID_F32: return MPI_FLOAT;
  case BRAID_I64: return MPI_INT64_T;
  case BRAID_I32: return MPI_INT32_T;
  case BRAID_I16: return MPI_INT16_T;
  case BRAID_I8: return MPI_INT8_T;
  case BRAID_U64: return MPI_UINT64_T;
  case BRAID_U32: return MPI_UINT32_T;
  case BRAID_U16: return MPI_UINT16_T;
  case BRAID_U8: return MPI_UINT8_T;
  case BRAID_C64: return MPI_C_FLOAT_COMPLEX;
  case BRAID_C128: return MPI_C_DOUBLE_COMPLEX;
  default: return MPI_DATATYPE_NULL;
  }
}

static MPI_Op m_op(braid_op op) {
  switch (op) {
  case BRAID_SUM: return MPI_SUM;
  case BRAID_PROD: return MPI_PROD;
  case BRAID_MIN: return MPI_MIN;
  case BRAID_MAX: return MPI_MAX;
  case BRAID_BAND: return MPI_BAND;
  case BRAID_BOR: return MPI_BOR;
  case BRAID_BXOR: return MPI_BXOR;
  default: return MPI_OP_NULL;
  }
}

static unsigned m_placements(void *ctx, perf_op op) {
  (void)ctx;
  switch (op) {
  case PERF_ALLREDUCE:
  case PERF_ALLGATHER:
  case PERF_REDUCE_SCATTER:
  case PERF_REDUCE:
  case PERF_GATHER:
  case PERF_SCATTER:
  case PERF_ALLTOALL: return PERF_OOP | PERF_INPLACE;
  case PERF_BROADCAST: return PERF_INPLACE;
  default: return PERF_OOP;
  }
}

static const char *m_unsupported(void *ctx, perf_op op, braid_dtype dt, braid_op rop) {
  (void)ctx;
  static char why[160];
  if (op != PERF_ALLREDUCE && op != PERF_REDUCE_SCATTER && op != PERF_REDUCE) return NULL;
  if (m_type(dt) == MPI_DATATYPE_NULL) {
    snprintf(why, sizeof why, "MPI has no reduction type for %s", perf_dtype_name(dt));
    return why;
  }
  if (m_op(rop) == MPI_OP_NULL) {
    snprintf(why, sizeof why, "MPI has no %s reduction", perf_redop_name(rop));
    return why;
  }
  return NULL;
}

static int m_run(void *ctx, perf_op op, const void *send, void *recv, size_t count, braid_dtype dt, braid_op rop,
                 int root, int inplace) {
  mctx *m = ctx;
  const size_t esz = perf_dtype_size(dt);
  /* MPI counts are int; a larger -e must fail loudly, not wrap. */
  if (count > (size_t)INT_MAX / (esz ? esz : 1)) {
    snprintf(m->err, sizeof m->err, "%s of %zu bytes per rank: MPI counts are int, at most %d bytes here",
             perf_op_name(op), count * esz, INT_MAX);
    return -1;
  }
  const int c = (int)count, cb = (int)(count * esz);
  const void *in = inplace ? MPI_IN_PLACE : send;
  const int at_root = inplace && m->rank == root; /* rooted calls: in place at the root only */
  switch (op) {
  case PERF_ALLREDUCE:
    return m_check(m, MPI_Allreduce(in, recv, c, m_type(dt), m_op(rop), m->comm), "MPI_Allreduce");
  case PERF_BROADCAST: return m_check(m, MPI_Bcast(recv, cb, MPI_BYTE, root, m->comm), "MPI_Bcast");
  case PERF_ALLGATHER:
    return m_check(m, MPI_Allgather(in, cb, MPI_BYTE, recv, cb, MPI_BYTE, m->comm), "MPI_Allgather");
  case PERF_REDUCE_SCATTER:
    /* In place, MPI reads the whole input from the receive buffer. */
    if (inplace)
      return m_check(m, MPI_Reduce_scatter_block(MPI_IN_PLACE, (void *)send, c, m_type(dt), m_op(rop), m->comm),
                     "MPI_Reduce_scatter_block");
    return m_check(m, MPI_Reduce_scatter_block(send, recv, c, m_type(dt), m_op(rop), m->comm),
                   "MPI_Reduce_scatter_block");
  case PERF_SENDRECV: {
    int next = (m->rank + 1) % m->size, prev = (m->rank - 1 + m->size) % m->size;
    return m_check(m, MPI_Sendrecv(send, cb, MPI_BYTE, next, 7, recv, cb, MPI_BYTE, prev, 7, m->comm,
                                   MPI_STATUS_IGNORE),
                   "MPI_Sendrecv");
  }
  case PERF_BARRIER: return m_check(m, MPI_Barrier(m->comm), "MPI_Barrier");
  case PERF_REDUCE:
    return m_check(m, MPI_Reduce(at_root ? MPI_IN_PLACE : send, recv, c, m_type(dt), m_op(rop), root, m->comm),
                   "MPI_Reduce");
  case PERF_GATHER:
    return m_check(m, MPI_Gather(at_root ? MPI_IN_PLACE : send, cb, MPI_BYTE, recv, cb, MPI_BYTE, root, m->comm),
                   "MPI_Gather");
  case PERF_SCATTER:
    return m_check(m, MPI_Scatter(send, cb, MPI_BYTE, at_root ? MPI_IN_PLACE : recv, cb, MPI_BYTE, root, m->comm),
                   "MPI_Scatter");
  case PERF_ALLTOALL:
    return m_check(m, MPI_Alltoall(in, cb, MPI_BYTE, recv, cb, MPI_BYTE, m->comm), "MPI_Alltoall");
  case PERF_ALLTOALLV: {
    const int *v = a2av_of(m, count, esz), n = m->size;
    if (!v) {
      snprintf(m->err, sizeof m->err, "alltoallv of %zu bytes per rank: MPI counts are int", count * esz);
      return -1;
    }
    return m_check(m, MPI_Alltoallv(send, v, v + n, MPI_BYTE, recv, v + 2 * n, v + 3 * n, MPI_BYTE, m->comm),
                   "MPI_Alltoallv");
  }
  default: return -1;
  }
}

static int m_complete(void *ctx) {
  (void)ctx; /* blocking calls: nothing is pending */
  return 0;
}

static int m_barrier(void *ctx) {
  mctx *m = ctx;
  return m_check(m, MPI_Barrier(m->comm), "MPI_Barrier");
}

static const char *m_last_error(void *ctx) { return ((mctx *)ctx)->err; }

static void *m_mem_alloc(void *ctx, size_t bytes) {
  void *p = NULL;
  if (bytes > (size_t)INT_MAX) {
    snprintf(((mctx *)ctx)->err, sizeof ((mctx *)ctx)->err, "MPI_Alloc_mem: %zu bytes exceed MPI_Aint here", bytes);
    return NULL;
  }
  return m_check(ctx, MPI_Alloc_mem((MPI_Aint)bytes, MPI_INFO_NULL, &p), "MPI_Alloc_mem") ? NULL : p;
}

static void m_mem_free(void *ctx, void *p) { (void)m_check(ctx, MPI_Free_mem(p), "MPI_Free_mem"); }

static void m_describe(void *ctx, perf_op op, FILE *out) {
  (void)op;
  const char *btl = getenv("OMPI_MCA_btl"), *pml = getenv("OMPI_MCA_pml");
  fprintf(out, "# algorithm: chosen inside MPI (Open MPI: coll/tuned decision rules), not reported\n");
  if (btl || pml) fprintf(out, "# transport: pml %s, btl %s\n", pml ? pml : "(default)", btl ? btl : "(default)");
  fprintf(out, "# MPI thread level provided: %d\n", ((mctx *)ctx)->thread);
}

/* --thread LEVEL: the thread level to ask MPI for (default: MPI_Init, which
   gives MPI_THREAD_SINGLE). braid asks for MPI_THREAD_SERIALIZED, and an MPI
   may charge every call for a level above SINGLE, so comparing like with
   like needs the raw calls at braid's level too. -1: not asked for. */
static int thread_level(int argc, char **argv) {
  static const char *const names[] = {"single", "funneled", "serialized", "multiple"};
  static const int levels[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED, MPI_THREAD_MULTIPLE};
  for (int i = 1; i < argc; i++) {
    const char *v = !strcmp(argv[i], "--thread") && i + 1 < argc ? argv[i + 1]
                    : !strncmp(argv[i], "--thread=", 9)          ? argv[i] + 9
                                                                 : NULL;
    if (!v) continue;
    for (int k = 0; k < 4; k++)
      if (!strcmp(v, names[k])) return levels[k];
    fprintf(stderr, "mpi_coll: --thread: '%s' is not single, funneled, serialized or multiple\n", v);
    exit(2);
  }
  return -1;
}

int main(int argc, char **argv) {
  int provided = MPI_THREAD_SINGLE, level = thread_level(argc, argv);
  if (level >= 0) MPI_Init_thread(&argc, &argv, level, &provided);
  else MPI_Init(&argc, &argv);
  mctx m = {MPI_COMM_WORLD, 0, 1, {0}, NULL, 0, provided};
  MPI_Comm_rank(m.comm, &m.rank);
  MPI_Comm_size(m.comm, &m.size);
  MPI_Comm_set_errhandler(m.comm, MPI_ERRORS_RETURN);

  /* --label NAME is ours; everything else goes to the shared parser. */
  const char *label = getenv("BRAID_PERF_LABEL");
  char **av = calloc((size_t)argc + 1, sizeof *av);
  int ac = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--label") && i + 1 < argc) label = argv[++i];
    else if (!strncmp(argv[i], "--label=", 8)) label = argv[i] + 8;
    else if (!strcmp(argv[i], "--thread") && i + 1 < argc) i++;
    else if (!strncmp(argv[i], "--thread=", 9)) continue;
    else av[ac++] = argv[i];
  }
  perf_args a;
  int rc = perf_parse_args(ac, av, &a, "mpi_coll", m.rank != 0);
  if (rc < 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    lib[strcspn(lib, "\n,")] = 0;
    perf_layer L = {
        .backend = label && *label ? label : "mpi",
        .library = lib,
        .rank = m.rank,
        .nranks = m.size,
        .ctx = &m,
        .placements = m_placements,
        .unsupported = m_unsupported,
        .run = m_run,
        .complete = m_complete,
        .barrier = m_barrier,
        .last_error = m_last_error,
        .describe = m_describe,
        .rs_inplace_result_at_start = 1,
        .mem_alloc = m_mem_alloc,
        .mem_free = m_mem_free,
    };
    rc = perf_run(&a, &L);
  }
  free(av);
  free(m.a2av);
  MPI_Finalize();
  return rc;
}
