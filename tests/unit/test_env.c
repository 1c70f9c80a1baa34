/* Launcher-environment detection: every convention, partial and inconsistent
   settings and their messages, config overrides, address / port-range /
   token parsing, BRAID_IFNAME lookup and data-plane port ranges. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/env.h"
#include "harness.h"
#include "os/time.h"

#define TOKEN_HEX "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF"

/* A fake environment: NULL-terminated "NAME=value" strings. */
static const char *fake_get(void *ctx, const char *name) {
  size_t n = strlen(name);
  for (const char *const *kv = ctx; *kv; kv++)
    if (!strncmp(*kv, name, n) && (*kv)[n] == '=') return *kv + n + 1;
  return NULL;
}

static char err[1024];
static braid__launch_env env;

static braid_status detect_ov(const braid__env_overrides *ov, unsigned flags, const char *const *kv) {
  err[0] = 0;
  return braid__env_detect(fake_get, (void *)kv, ov, flags, &env, err, sizeof err);
}

#define DETECT(flags, ...) detect_ov(NULL, (flags), (const char *const[]){__VA_ARGS__, NULL})
#define REQ BRAID__ENV_REQUIRE_STORE

#define EXPECT_ERR(call, want_st, needle)                                                       \
  do {                                                                                          \
    braid_status st_ = (call);                                                                  \
    BT_CHECK(st_ == (want_st), "%s gave %s, expected %s (%s)", #call, braid_status_string(st_), \
             braid_status_string(want_st), err);                                               \
    BT_CHECK(strstr(err, (needle)) != NULL, "message \"%s\" lacks \"%s\"", err, (needle));      \
  } while (0)

#define EXPECT_OK(call)                                                                         \
  do {                                                                                          \
    braid_status st_ = (call);                                                                  \
    BT_CHECK(st_ == BRAID_OK, "%s gave %s: %s", #call, braid_status_string(st_), err);          \
  } while (0)

static int test_nothing_set(void) {
  EXPECT_OK(DETECT(REQ, NULL));
  BT_CHECK(!strcmp(env.convention, "none"), "convention %s", env.convention);
  BT_CHECK(env.rank == 0 && env.world_size == 1, "rank %d of %d", env.rank, env.world_size);
  BT_CHECK(env.store_owner == BRAID__STORE_NONE && !env.has_token && !env.job_id[0], "no store, token, job");
  BT_CHECK(env.init_timeout_s == 60.0, "default init timeout %g", env.init_timeout_s);
  BT_CHECK(env.port_lo == 0 && env.port_hi == 0 && !env.ifname[0] && !env.addr[0], "no data-plane settings");
  /* Empty values count as unset. */
  EXPECT_OK(DETECT(REQ, "BRAID_RANK=", "RANK="));
  BT_CHECK(!strcmp(env.convention, "none"), "empty variables: %s", env.convention);
  return 0;
}

static int test_braidrun(void) {
  EXPECT_OK(DETECT(REQ, "BRAID_RANK=1", "BRAID_WORLD_SIZE=4", "BRAID_LOCAL_RANK=1", "BRAID_LOCAL_SIZE=2",
                   "BRAID_STORE=127.0.0.1:29400", "BRAID_TOKEN=" TOKEN_HEX));
  BT_CHECK(!strcmp(env.convention, "braidrun"), "convention %s", env.convention);
  BT_CHECK(env.rank == 1 && env.world_size == 4 && env.local_rank == 1 && env.local_size == 2, "layout");
  BT_CHECK(!strcmp(env.store_host, "127.0.0.1") && env.store_port == 29400, "store %s:%d", env.store_host,
           env.store_port);
  BT_CHECK(env.store_owner == BRAID__STORE_RANK0, "rank 0 hosts without BRAID_STORE_EXTERNAL");
  BT_CHECK(env.has_token && env.token[0] == 0x00 && env.token[1] == 0x11 && env.token[31] == 0xff, "token bytes");
  EXPECT_OK(DETECT(REQ, "BRAID_RANK=0", "BRAID_WORLD_SIZE=2", "BRAID_STORE=[::1]:5", "BRAID_STORE_EXTERNAL=1",
                   "BRAID_JOB_ID=job/42 x"));
  BT_CHECK(env.store_owner == BRAID__STORE_EXTERNAL, "external store");
  BT_CHECK(!strcmp(env.store_host, "::1") && env.store_port == 5, "v6 store %s:%d", env.store_host, env.store_port);
  BT_CHECK(!strcmp(env.job_id, "job_42_x"), "job id made key-safe: %s", env.job_id);
  BT_CHECK(env.local_rank == -1 && env.local_size == -1, "local layout unknown");
  char d[512];
  braid__env_describe(&env, d, sizeof d);
  BT_CHECK(strstr(d, "rank 0 of 2") && strstr(d, "[::1]:5") && strstr(d, "the launcher") && strstr(d, "job_42_x"),
           "describe: %s", d);
  return 0;
}

static int test_braidrun_errors(void) {
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=1"), BRAID_ERR_BOOTSTRAP,
             "BRAID_RANK is set but BRAID_WORLD_SIZE is missing (braidrun convention)");
  EXPECT_ERR(DETECT(REQ, "BRAID_WORLD_SIZE=2"), BRAID_ERR_BOOTSTRAP,
             "BRAID_WORLD_SIZE is set but BRAID_RANK is missing (braidrun convention)");
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=5", "BRAID_WORLD_SIZE=4", "BRAID_STORE=h:1"), BRAID_ERR_BOOTSTRAP,
             "BRAID_RANK=5 is not below BRAID_WORLD_SIZE=4");
  BT_CHECK(strstr(err, "rank 5 out of range for world size 4"), "%s", err);
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=x1", "BRAID_WORLD_SIZE=4"), BRAID_ERR_BOOTSTRAP, "BRAID_RANK=\"x1\"");
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=0", "BRAID_WORLD_SIZE=0"), BRAID_ERR_BOOTSTRAP,
             "BRAID_WORLD_SIZE=\"0\" is not an integer in [1, ");
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=-1", "BRAID_WORLD_SIZE=2"), BRAID_ERR_BOOTSTRAP, "BRAID_RANK=\"-1\"");
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=1", "BRAID_WORLD_SIZE=2"), BRAID_ERR_BOOTSTRAP,
             "BRAID_RANK is set but BRAID_STORE is missing (braidrun convention)");
  /* Without the requirement (the self backend), world size > 1 is not this layer's business. */
  EXPECT_OK(DETECT(0, "BRAID_RANK=1", "BRAID_WORLD_SIZE=2"));
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=1", "BRAID_WORLD_SIZE=2", "BRAID_STORE=h:1", "BRAID_LOCAL_RANK=0"),
             BRAID_ERR_BOOTSTRAP, "BRAID_LOCAL_RANK is set but BRAID_LOCAL_SIZE is missing (braidrun convention)");
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=1", "BRAID_WORLD_SIZE=2", "BRAID_STORE=h:1", "BRAID_LOCAL_SIZE=2"),
             BRAID_ERR_BOOTSTRAP, "BRAID_LOCAL_SIZE is set but BRAID_LOCAL_RANK is missing (braidrun convention)");
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=1", "BRAID_WORLD_SIZE=4", "BRAID_STORE=h:1", "BRAID_LOCAL_RANK=2",
                    "BRAID_LOCAL_SIZE=2"),
             BRAID_ERR_BOOTSTRAP, "BRAID_LOCAL_RANK=2 is not below BRAID_LOCAL_SIZE=2");
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=1", "BRAID_WORLD_SIZE=4", "BRAID_STORE=h:1", "BRAID_LOCAL_RANK=0",
                    "BRAID_LOCAL_SIZE=8"),
             BRAID_ERR_BOOTSTRAP, "BRAID_LOCAL_SIZE=8 is larger than the world size 4");
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=0", "BRAID_WORLD_SIZE=2", "BRAID_STORE=h"), BRAID_ERR_BOOTSTRAP,
             "BRAID_STORE=\"h\" is not host:port");
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=0", "BRAID_WORLD_SIZE=2", "BRAID_STORE=h:1", "BRAID_TOKEN=abc"),
             BRAID_ERR_BOOTSTRAP, "BRAID_TOKEN is not 64 hex digits");
  BT_CHECK(!strstr(err, "abc"), "the token value is never echoed: %s", err);
  EXPECT_ERR(DETECT(REQ, "BRAID_TOKEN=" TOKEN_HEX "0"), BRAID_ERR_BOOTSTRAP, "BRAID_TOKEN is not 64 hex digits");
  EXPECT_ERR(DETECT(REQ, "BRAID_TOKEN=zz112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF"),
             BRAID_ERR_BOOTSTRAP, "BRAID_TOKEN is not 64 hex digits");
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=0", "BRAID_WORLD_SIZE=2", "BRAID_STORE=h:1", "BRAID_STORE_EXTERNAL=1"),
             BRAID_ERR_BOOTSTRAP, "BRAID_STORE_EXTERNAL=1 needs BRAID_JOB_ID");
  EXPECT_ERR(DETECT(REQ, "BRAID_RANK=0", "BRAID_WORLD_SIZE=2", "BRAID_STORE=h:1", "BRAID_STORE_EXTERNAL=yes"),
             BRAID_ERR_BOOTSTRAP, "BRAID_STORE_EXTERNAL=\"yes\" is neither 0 nor 1");
  return 0;
}

static int test_torchrun(void) {
  EXPECT_OK(DETECT(REQ, "RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=10.0.0.1",
                   "MASTER_PORT=29500", "TORCHELASTIC_RUN_ID=abc"));
  BT_CHECK(!strcmp(env.convention, "torchrun"), "convention %s", env.convention);
  BT_CHECK(env.rank == 3 && env.world_size == 4 && env.local_rank == 1 && env.local_size == 2, "layout");
  BT_CHECK(!strcmp(env.store_host, "10.0.0.1") && env.store_port == 29500, "store %s:%d", env.store_host,
           env.store_port);
  BT_CHECK(env.store_owner == BRAID__STORE_RANK0 && !strcmp(env.store_from, "MASTER_ADDR/MASTER_PORT"), "owner");
  BT_CHECK(!strcmp(env.job_id, "torchrun.abc"), "job %s", env.job_id);
  /* Real torchrun's agent already listens on MASTER_PORT: braid's store takes the next port. */
  EXPECT_OK(DETECT(REQ, "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=[::1]", "MASTER_PORT=29500",
                   "TORCHELASTIC_USE_AGENT_STORE=True"));
  BT_CHECK(!strcmp(env.store_host, "::1") && env.store_port == 29501, "agent store: %s:%d", env.store_host,
           env.store_port);
  /* BRAID_STORE wins over MASTER_ADDR/MASTER_PORT. */
  EXPECT_OK(DETECT(REQ, "RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500",
                   "BRAID_STORE=10.0.0.2:7000"));
  BT_CHECK(!strcmp(env.store_host, "10.0.0.2") && env.store_port == 7000, "BRAID_STORE wins");
  /* World size 1 needs no store. */
  EXPECT_OK(DETECT(REQ, "RANK=0", "WORLD_SIZE=1"));
  BT_CHECK(env.store_owner == BRAID__STORE_NONE, "no store");

  EXPECT_ERR(DETECT(REQ, "RANK=0"), BRAID_ERR_BOOTSTRAP, "RANK is set but WORLD_SIZE is missing (torchrun convention)");
  EXPECT_ERR(DETECT(REQ, "WORLD_SIZE=2"), BRAID_ERR_BOOTSTRAP,
             "WORLD_SIZE is set but RANK is missing (torchrun convention)");
  EXPECT_ERR(DETECT(REQ, "RANK=1", "WORLD_SIZE=2"), BRAID_ERR_BOOTSTRAP,
             "RANK is set but MASTER_ADDR and MASTER_PORT are missing (torchrun convention)");
  EXPECT_ERR(DETECT(REQ, "RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h"), BRAID_ERR_BOOTSTRAP,
             "MASTER_ADDR is set but MASTER_PORT is missing");
  EXPECT_ERR(DETECT(REQ, "RANK=1", "WORLD_SIZE=2", "MASTER_PORT=5"), BRAID_ERR_BOOTSTRAP,
             "MASTER_PORT is set but MASTER_ADDR is missing");
  EXPECT_ERR(DETECT(REQ, "RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=99999"), BRAID_ERR_BOOTSTRAP,
             "MASTER_PORT=\"99999\" is not a port number");
  EXPECT_ERR(DETECT(REQ, "RANK=2", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=5"), BRAID_ERR_BOOTSTRAP,
             "RANK=2 is not below WORLD_SIZE=2");
  EXPECT_ERR(DETECT(REQ, "RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=5", "LOCAL_RANK=0"),
             BRAID_ERR_BOOTSTRAP, "LOCAL_RANK is set but LOCAL_WORLD_SIZE is missing (torchrun convention)");
  return 0;
}

static int test_slurm(void) {
  /* A task srun started: SLURM_STEP_ID is set. */
  EXPECT_OK(DETECT(REQ, "SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1", "SLURM_TASKS_PER_NODE=2(x2),3,1",
                   "SLURM_NODEID=2", "BRAID_STORE=node1:29500", "SLURM_JOB_ID=77", "SLURM_STEP_ID=0"));
  BT_CHECK(!strcmp(env.convention, "slurm"), "convention %s", env.convention);
  BT_CHECK(env.rank == 5 && env.world_size == 8 && env.local_rank == 1 && env.local_size == 3,
           "layout %d/%d local %d/%d", env.rank, env.world_size, env.local_rank, env.local_size);
  BT_CHECK(!strcmp(env.store_host, "node1") && env.store_port == 29500, "store");
  BT_CHECK(!strcmp(env.job_id, "77.0"), "job %s", env.job_id);
  BT_CHECK(!env.note[0], "no note: %s", env.note);
  /* The step's own counts win over the job's (a step smaller than the job,
     or srun --preserve-env, which keeps the job's SLURM_NTASKS). */
  EXPECT_OK(DETECT(REQ, "SLURM_PROCID=2", "SLURM_NTASKS=16", "SLURM_STEP_NUM_TASKS=4", "SLURM_LOCALID=0",
                   "SLURM_TASKS_PER_NODE=16", "SLURM_STEP_TASKS_PER_NODE=2(x2)", "SLURM_NODEID=1",
                   "SLURM_STEP_ID=3", "SLURM_JOB_ID=77", "BRAID_STORE=h:1"));
  BT_CHECK(env.rank == 2 && env.world_size == 4 && env.local_rank == 0 && env.local_size == 2,
           "step layout %d/%d local %d/%d", env.rank, env.world_size, env.local_rank, env.local_size);
  BT_CHECK(!strcmp(env.job_id, "77.3"), "job %s", env.job_id);
  /* MASTER_ADDR/MASTER_PORT work too; old versions set SLURM_STEPID and SLURM_NPROCS only; no
     SLURM_TASKS_PER_NODE leaves the local size to the rendezvous. */
  EXPECT_OK(DETECT(REQ, "SLURM_PROCID=0", "SLURM_NPROCS=2", "SLURM_LOCALID=0", "MASTER_ADDR=n0", "MASTER_PORT=9",
                   "SLURM_STEPID=1", "SLURM_JOB_ID=5"));
  BT_CHECK(!strcmp(env.convention, "slurm"), "SLURM_STEPID marks a step too: %s", env.convention);
  BT_CHECK(env.world_size == 2 && env.local_size == -1 && env.local_rank == -1, "old SLURM_NPROCS");
  BT_CHECK(!strcmp(env.store_host, "n0") && env.store_port == 9, "MASTER_ADDR store");
  BT_CHECK(!strcmp(env.job_id, "5.1"), "job %s", env.job_id);

  EXPECT_ERR(DETECT(REQ, "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_STEP_ID=0"), BRAID_ERR_BOOTSTRAP,
             "SLURM_PROCID is set but no store address: set BRAID_STORE or MASTER_ADDR and MASTER_PORT");
  EXPECT_ERR(DETECT(REQ, "SLURM_PROCID=0", "SLURM_STEP_ID=0"), BRAID_ERR_BOOTSTRAP,
             "SLURM_PROCID is set but SLURM_STEP_NUM_TASKS and SLURM_NTASKS are missing (Slurm convention)");
  EXPECT_ERR(DETECT(REQ, "SLURM_STEP_NUM_TASKS=2", "SLURM_STEP_ID=0"), BRAID_ERR_BOOTSTRAP,
             "SLURM_STEP_NUM_TASKS is set but SLURM_PROCID is missing (Slurm convention)");
  EXPECT_ERR(DETECT(REQ, "SLURM_PROCID=4", "SLURM_NTASKS=4", "BRAID_STORE=h:1", "SLURM_STEP_ID=0"),
             BRAID_ERR_BOOTSTRAP, "SLURM_PROCID=4 is not below SLURM_NTASKS=4");
  EXPECT_ERR(DETECT(REQ, "SLURM_PROCID=4", "SLURM_NTASKS=8", "SLURM_STEP_NUM_TASKS=4", "BRAID_STORE=h:1",
                    "SLURM_STEP_ID=0"),
             BRAID_ERR_BOOTSTRAP, "SLURM_PROCID=4 is not below SLURM_STEP_NUM_TASKS=4");
  EXPECT_ERR(DETECT(REQ, "SLURM_PROCID=3", "SLURM_STEP_NUM_TASKS=4", "SLURM_LOCALID=3", "SLURM_NODEID=0",
                    "SLURM_STEP_TASKS_PER_NODE=2(x2)", "BRAID_STORE=h:1", "SLURM_STEP_ID=0"),
             BRAID_ERR_BOOTSTRAP, "SLURM_LOCALID=3 is not below SLURM_STEP_TASKS_PER_NODE=2");
  return 0;
}

/* A batch script (sbatch) or an allocation's shell (salloc) carries Slurm's
   variables but is a single process, not a task of an srun step. */
static int test_slurm_batch_step(void) {
  EXPECT_OK(DETECT(REQ, "SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=0", "SLURM_NODEID=0",
                   "SLURM_TASKS_PER_NODE=4", "SLURM_JOB_ID=77", "MASTER_ADDR=n0", "MASTER_PORT=9"));
  BT_CHECK(!strcmp(env.convention, "none") && env.rank == 0 && env.world_size == 1, "%s: rank %d of %d",
           env.convention, env.rank, env.world_size);
  BT_CHECK(strstr(env.note, "Slurm variables ignored: SLURM_PROCID=0 and SLURM_NTASKS=4 are set but "
                            "SLURM_STEP_ID is not") &&
               strstr(env.note, "start the ranks with srun"),
           "note: %s", env.note);
  char d[1024];
  braid__env_describe(&env, d, sizeof d);
  BT_CHECK(strstr(d, "rank 0 of 1") && strstr(d, "; Slurm variables ignored: "), "describe: %s", d);
  /* Partial settings there are not this process's launcher either: no error. */
  EXPECT_OK(DETECT(REQ, "SLURM_NTASKS=4", "SLURM_JOB_ID=77"));
  BT_CHECK(env.world_size == 1 && strstr(env.note, "SLURM_NTASKS=4 is set but SLURM_STEP_ID is not"), "salloc: %s",
           env.note);
  EXPECT_OK(DETECT(REQ, "SLURM_PROCID=0"));
  BT_CHECK(env.world_size == 1 && strstr(env.note, "SLURM_PROCID=0 is set"), "%s", env.note);
  /* Detection goes on with the next convention: mpirun inside a batch script. */
  EXPECT_OK(DETECT(REQ, "SLURM_PROCID=0", "SLURM_NTASKS=4", "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=4",
                   "BRAID_STORE=h:1"));
  BT_CHECK(!strcmp(env.convention, "openmpi") && env.rank == 1 && env.world_size == 4, "%s: rank %d of %d",
           env.convention, env.rank, env.world_size);
  /* mpirun / mpiexec in an allocation start their daemons with srun: the
     ranks carry the daemon step's Slurm variables (a node index). */
  EXPECT_OK(DETECT(REQ, "SLURM_PROCID=1", "SLURM_STEP_NUM_TASKS=2", "SLURM_STEP_ID=0", "OMPI_COMM_WORLD_RANK=5",
                   "OMPI_COMM_WORLD_SIZE=8", "BRAID_STORE=h:1"));
  BT_CHECK(!strcmp(env.convention, "openmpi") && env.rank == 5 && env.world_size == 8, "under Slurm: %s %d of %d",
           env.convention, env.rank, env.world_size);
  BT_CHECK(strstr(env.note, "started by an MPI launcher inside a Slurm step"), "note: %s", env.note);
  EXPECT_OK(DETECT(REQ, "SLURM_PROCID=0", "SLURM_STEP_NUM_TASKS=2", "SLURM_STEP_ID=0", "PMI_RANK=3", "PMI_SIZE=4",
                   "BRAID_STORE=h:1"));
  BT_CHECK(!strcmp(env.convention, "pmi") && env.rank == 3 && env.world_size == 4, "hydra under Slurm: %s",
           env.convention);
  /* srun's PMI plugins set PMI_RANK too, equal to SLURM_PROCID: Slurm stays. */
  EXPECT_OK(DETECT(REQ, "SLURM_PROCID=1", "SLURM_STEP_NUM_TASKS=2", "SLURM_STEP_ID=0", "PMI_RANK=1", "PMI_SIZE=2",
                   "BRAID_STORE=h:1"));
  BT_CHECK(!strcmp(env.convention, "slurm") && env.rank == 1 && !env.note[0], "srun --mpi=pmi2: %s",
           env.convention);
  return 0;
}

static int test_openmpi_pmi(void) {
  EXPECT_OK(DETECT(REQ, "OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=3", "OMPI_COMM_WORLD_LOCAL_RANK=0",
                   "OMPI_COMM_WORLD_LOCAL_SIZE=1", "MASTER_ADDR=h", "MASTER_PORT=5", "PMIX_NAMESPACE=ns@1"));
  BT_CHECK(!strcmp(env.convention, "openmpi"), "convention %s", env.convention);
  BT_CHECK(env.rank == 2 && env.world_size == 3 && env.local_rank == 0 && env.local_size == 1, "layout");
  BT_CHECK(!strcmp(env.job_id, "ns@1"), "job %s", env.job_id);
  EXPECT_ERR(DETECT(REQ, "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2"), BRAID_ERR_BOOTSTRAP,
             "OMPI_COMM_WORLD_RANK is set but no store address: set BRAID_STORE or MASTER_ADDR and MASTER_PORT");
  EXPECT_ERR(DETECT(REQ, "OMPI_COMM_WORLD_RANK=0"), BRAID_ERR_BOOTSTRAP,
             "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is missing (Open MPI convention)");

  EXPECT_OK(DETECT(REQ, "PMI_RANK=1", "PMI_SIZE=2", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=2", "BRAID_STORE=h:1"));
  BT_CHECK(!strcmp(env.convention, "pmi"), "convention %s", env.convention);
  BT_CHECK(env.rank == 1 && env.world_size == 2 && env.local_rank == 1 && env.local_size == 2, "layout");
  EXPECT_ERR(DETECT(REQ, "PMI_SIZE=2"), BRAID_ERR_BOOTSTRAP,
             "PMI_SIZE is set but PMI_RANK is missing (PMI convention)");
  EXPECT_ERR(DETECT(REQ, "PMI_RANK=0", "PMI_SIZE=2"), BRAID_ERR_BOOTSTRAP,
             "PMI_RANK is set but no store address: set BRAID_STORE or MASTER_ADDR and MASTER_PORT");
  return 0;
}

/* The first convention present wins, in the documented order. */
static int test_precedence(void) {
  EXPECT_OK(DETECT(REQ, "SLURM_PROCID=1", "SLURM_NTASKS=2", "RANK=0", "WORLD_SIZE=1", "BRAID_RANK=0",
                   "BRAID_WORLD_SIZE=1"));
  BT_CHECK(!strcmp(env.convention, "braidrun") && env.world_size == 1, "braidrun first: %s", env.convention);
  EXPECT_OK(DETECT(REQ, "SLURM_PROCID=1", "SLURM_NTASKS=2", "RANK=0", "WORLD_SIZE=1", "PMI_RANK=1", "PMI_SIZE=2"));
  BT_CHECK(!strcmp(env.convention, "torchrun"), "torchrun before Slurm: %s", env.convention);
  EXPECT_OK(DETECT(REQ, "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1", "PMI_RANK=1", "PMI_SIZE=2"));
  BT_CHECK(!strcmp(env.convention, "openmpi"), "Open MPI before PMI: %s", env.convention);
  return 0;
}

static int test_overrides(void) {
  braid__env_overrides ov = BRAID__ENV_OVERRIDES_NONE;
  ov.rank = 1;
  ov.world_size = 2;
  ov.store_addr = "127.0.0.1:7";
  ov.token_hex = TOKEN_HEX;
  ov.init_timeout_s = 3;
  /* Config rank and size replace the launcher's, so a broken RANK does not matter. */
  EXPECT_OK(detect_ov(&ov, REQ, (const char *const[]){"RANK=zz", "BRAID_INIT_TIMEOUT=9", NULL}));
  BT_CHECK(!strcmp(env.convention, "config") && env.rank == 1 && env.world_size == 2, "config convention");
  BT_CHECK(env.store_port == 7 && env.has_token && env.init_timeout_s == 3, "config store/token/timeout");
  /* Field by field: config rank, environment world size. */
  ov = (braid__env_overrides)BRAID__ENV_OVERRIDES_NONE;
  ov.rank = 3;
  EXPECT_ERR(detect_ov(&ov, REQ, (const char *const[]){"BRAID_WORLD_SIZE=2", "BRAID_STORE=h:1", NULL}),
             BRAID_ERR_INVALID_ARG, "rank 3 out of range for world size 2");
  ov.rank = 1;
  EXPECT_OK(detect_ov(&ov, REQ, (const char *const[]){"BRAID_WORLD_SIZE=2", "BRAID_STORE=h:1", NULL}));
  BT_CHECK(env.rank == 1 && env.world_size == 2, "mixed");
  ov = (braid__env_overrides)BRAID__ENV_OVERRIDES_NONE;
  ov.rank = 1;
  ov.world_size = 1;
  EXPECT_ERR(detect_ov(&ov, REQ, (const char *const[]){NULL}), BRAID_ERR_INVALID_ARG,
             "rank 1 out of range for world size 1");
  ov.rank = 0;
  ov.world_size = 0;
  EXPECT_ERR(detect_ov(&ov, REQ, (const char *const[]){NULL}), BRAID_ERR_INVALID_ARG,
             "world size 0 must be at least 1");
  ov.world_size = 2;
  EXPECT_ERR(detect_ov(&ov, REQ, (const char *const[]){NULL}), BRAID_ERR_BOOTSTRAP,
             "world size 2 needs a store address: set cfg->store_addr or BRAID_STORE");
  ov.store_addr = "nope";
  EXPECT_ERR(detect_ov(&ov, REQ, (const char *const[]){NULL}), BRAID_ERR_INVALID_ARG,
             "cfg->store_addr \"nope\" is not host:port");
  ov.store_addr = "h:1";
  ov.token_hex = "12";
  EXPECT_ERR(detect_ov(&ov, REQ, (const char *const[]){NULL}), BRAID_ERR_INVALID_ARG,
             "cfg->token_hex is not 64 hex digits");
  ov.token_hex = NULL;
  ov.local_rank = 0;
  EXPECT_ERR(detect_ov(&ov, REQ, (const char *const[]){NULL}), BRAID_ERR_INVALID_ARG,
             "cfg->local_rank and cfg->local_size must be set together");
  ov.local_size = 2;
  EXPECT_OK(detect_ov(&ov, REQ, (const char *const[]){NULL}));
  BT_CHECK(env.local_rank == 0 && env.local_size == 2, "config local layout");
  return 0;
}

static int test_dataplane_vars(void) {
  EXPECT_OK(DETECT(REQ, "BRAID_PORT_RANGE=29500-29600", "BRAID_IFNAME=lo", "BRAID_INIT_TIMEOUT=1.5"));
  BT_CHECK(env.port_lo == 29500 && env.port_hi == 29600, "range %d-%d", env.port_lo, env.port_hi);
  BT_CHECK(!strcmp(env.ifname, "lo") && env.init_timeout_s == 1.5, "ifname, timeout");
  EXPECT_OK(DETECT(REQ, "BRAID_PORT_RANGE=4000", "BRAID_ADDR=::1"));
  BT_CHECK(env.port_lo == 4000 && env.port_hi == 4000 && !strcmp(env.addr, "::1"), "single port, v6 addr");
  EXPECT_ERR(DETECT(REQ, "BRAID_PORT_RANGE=29600-29500"), BRAID_ERR_BOOTSTRAP,
             "BRAID_PORT_RANGE=\"29600-29500\" is not a port range like 29500-29600");
  EXPECT_ERR(DETECT(REQ, "BRAID_IFNAME=lo", "BRAID_ADDR=127.0.0.1"), BRAID_ERR_BOOTSTRAP,
             "BRAID_IFNAME=\"lo\" and BRAID_ADDR=\"127.0.0.1\" are both set; set only one");
  EXPECT_ERR(DETECT(REQ, "BRAID_ADDR=myhost"), BRAID_ERR_BOOTSTRAP,
             "BRAID_ADDR=\"myhost\" is not a numeric IPv4 or IPv6 address");
  EXPECT_ERR(DETECT(REQ, "BRAID_INIT_TIMEOUT=soon"), BRAID_ERR_BOOTSTRAP,
             "BRAID_INIT_TIMEOUT=\"soon\" is not a non-negative number of seconds");
  return 0;
}

static int test_parsers(void) {
  char h[64];
  int p = 0;
  BT_CHECK(!braid__parse_hostport("example.org:29500", h, sizeof h, &p) && !strcmp(h, "example.org") && p == 29500,
           "name");
  BT_CHECK(!braid__parse_hostport("[fe80::1%eth0]:1", h, sizeof h, &p) && !strcmp(h, "fe80::1%eth0") && p == 1,
           "v6 with scope");
  BT_CHECK(!braid__parse_hostport("10.1.2.3:65535", h, sizeof h, &p) && p == 65535, "max port");
  const char *bad[] = {"", "h", "h:", ":5", "h:0", "h:65536", "h:12x", "::1:5", "[::1]5", "[::1]:", "[]:5", "h:-1"};
  for (size_t i = 0; i < BT_COUNT(bad); i++)
    BT_CHECK(braid__parse_hostport(bad[i], h, sizeof h, &p) == -1, "\"%s\" accepted", bad[i]);
  BT_CHECK(braid__parse_hostport("averyveryverylonghostname:1", h, 8, &p) == -1, "host longer than the buffer");

  int lo, hi;
  BT_CHECK(!braid__parse_port_range("29500-29600", &lo, &hi) && lo == 29500 && hi == 29600, "range");
  BT_CHECK(!braid__parse_port_range("7", &lo, &hi) && lo == 7 && hi == 7, "single");
  const char *badr[] = {"", "0-5", "5-4", "a-b", "1-70000", "-5", "5-", "1-2-3", "1 - 2"};
  for (size_t i = 0; i < BT_COUNT(badr); i++)
    BT_CHECK(braid__parse_port_range(badr[i], &lo, &hi) == -1, "\"%s\" accepted", badr[i]);

  uint8_t tok[BRAID__ENV_TOKEN_LEN];
  BT_CHECK(!braid__parse_token_hex(TOKEN_HEX, tok) && tok[15] == 0xff && tok[16] == 0x00, "token");
  BT_CHECK(braid__parse_token_hex("xy", tok) == -1, "short token");

  const char *loop[] = {"localhost", "127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"};
  for (size_t i = 0; i < BT_COUNT(loop); i++) BT_CHECK(braid__host_is_loopback(loop[i]), "%s is loopback", loop[i]);
  const char *notloop[] = {"10.0.0.1", "::", "0.0.0.0", "example.org", "128.0.0.1"};
  for (size_t i = 0; i < BT_COUNT(notloop); i++)
    BT_CHECK(!braid__host_is_loopback(notloop[i]), "%s is not loopback", notloop[i]);
  return 0;
}

static int test_ifname(void) {
  char a[64], e[512];
  BT_CHECK(braid__iface_addr("lo", a, sizeof a, e, sizeof e) == BRAID_OK, "lo: %s", e);
  BT_CHECK(!strcmp(a, "127.0.0.1"), "lo is %s", a);
  BT_CHECK(braid__iface_addr("nosuchif0", a, sizeof a, e, sizeof e) == BRAID_ERR_INVALID_ARG, "unknown name");
  BT_CHECK(strstr(e, "BRAID_IFNAME=\"nosuchif0\" names no network interface; interfaces here: "), "%s", e);
  BT_CHECK(strstr(e, "lo"), "lists lo: %s", e);
  return 0;
}

/* A free loopback port whose successor is free too. */
static int two_free_ports(void) {
  for (int tries = 0; tries < 50; tries++) {
    int fd, port;
    char e[256];
    if (braid__listen_range("127.0.0.1", 0, 0, 0, 1, &fd, &port, e, sizeof e)) return -1;
    close(fd);
    if (port >= 65535) continue;
    int fd2, port2;
    if (braid__listen_range("127.0.0.1", port + 1, port + 1, 0, 1, &fd2, &port2, e, sizeof e) == BRAID_OK) {
      close(fd2);
      return port;
    }
  }
  return -1;
}

static int test_port_range(void) {
  char e[512];
  int p = two_free_ports();
  BT_CHECK(p > 0, "found two free ports");
  int busy, got, fd;
  BT_CHECK(braid__listen_range("127.0.0.1", p, p, 0, 4, &busy, &got, e, sizeof e) == BRAID_OK && got == p, "%s", e);
  /* The first port is taken: the next one is used. */
  BT_CHECK(braid__listen_range("127.0.0.1", p, p + 1, 0, 4, &fd, &got, e, sizeof e) == BRAID_OK, "%s", e);
  BT_CHECK(got == p + 1, "got port %d, expected %d", got, p + 1);
  close(fd);
  /* The start offset (local rank) spreads ranks over the range. */
  BT_CHECK(braid__listen_range("127.0.0.1", p, p + 1, 1, 4, &fd, &got, e, sizeof e) == BRAID_OK && got == p + 1,
           "offset 1 gave %d", got);
  close(fd);
  /* Exhausted. */
  BT_CHECK(braid__listen_range("127.0.0.1", p, p, 0, 4, &fd, &got, e, sizeof e) == BRAID_ERR_BOOTSTRAP, "full");
  char want[128];
  snprintf(want, sizeof want, "no free port in BRAID_PORT_RANGE=%d-%d on 127.0.0.1: all 1 ports are in use", p, p);
  BT_CHECK(strstr(e, want), "message \"%s\"", e);
  close(busy);

  /* Through the bootstrap state: BRAID_ADDR and the range are honoured. */
  braid__boot b;
  memset(&b, 0, sizeof b);
  snprintf(b.env.addr, sizeof b.env.addr, "127.0.0.1");
  b.env.port_lo = p;
  b.env.port_hi = p + 1;
  b.local_rank = 0;
  braid__listener l;
  BT_CHECK(braid__listen_dataplane(&b, 4, &l, e, sizeof e) == BRAID_OK, "%s", e);
  BT_CHECK(!strcmp(l.addr, "127.0.0.1") && (l.port == p || l.port == p + 1) && l.fd >= 0, "listener %s:%d", l.addr,
           l.port);
  close(l.fd);
  /* No store, no settings: loopback, any port. */
  memset(&b, 0, sizeof b);
  BT_CHECK(braid__listen_dataplane(&b, 4, &l, e, sizeof e) == BRAID_OK && !strcmp(l.addr, "127.0.0.1") && l.port > 0,
           "%s", e);
  close(l.fd);
  snprintf(b.env.ifname, sizeof b.env.ifname, "nosuchif0");
  BT_CHECK(braid__listen_dataplane(&b, 4, &l, e, sizeof e) == BRAID_ERR_INVALID_ARG && strstr(e, "interfaces here"),
           "%s", e);
  return 0;
}

/* Through braid_init: BRAID_LOG=info names the convention; detection errors surface. */
/* Stops logging to the file and returns what it holds (then removes it). */
static int take_log(const char *path, char *buf, size_t cap) {
  unsetenv("BRAID_LOG_FILE");
  unsetenv("BRAID_LOG");
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = 0;
  fclose(f);
  unlink(path);
  return 0;
}

static int test_init_logs_convention(void) {
  char path[] = "/tmp/braid_test_env_XXXXXX";
  int fd = mkstemp(path);
  BT_CHECK(fd >= 0, "mkstemp");
  close(fd);
  setenv("BRAID_LOG", "info", 1);
  setenv("BRAID_LOG_FILE", path, 1);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  braid_comm *c = NULL;
  BT_CHECK_OK(braid_init(NULL, &c), NULL);
  BT_CHECK_OK(braid_destroy(c), NULL);
  char buf[8192];
  BT_CHECK(take_log(path, buf, sizeof buf) == 0, "log file %s", path);
  BT_CHECK(strstr(buf, "using the torchrun convention: rank 0 of 1"), "log: %s", buf);

  setenv("WORLD_SIZE", "x", 1);
  BT_CHECK_ST(braid_init(NULL, &c), BRAID_ERR_BOOTSTRAP, NULL);
  BT_CHECK_MSG(NULL, "braid_init: WORLD_SIZE=\"x\" is not an integer");
  unsetenv("RANK");
  unsetenv("WORLD_SIZE");
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_STEP_ID", "0", 1);
  BT_CHECK_ST(braid_init(NULL, &c), BRAID_ERR_BOOTSTRAP, NULL);
  BT_CHECK_MSG(NULL, "SLURM_PROCID is set but SLURM_STEP_NUM_TASKS and SLURM_NTASKS are missing (Slurm convention)");
  unsetenv("SLURM_STEP_ID");
  unsetenv("SLURM_PROCID");
  return 0;
}

/* Through braid_init in a Slurm batch script (no srun): one process that
   neither waits for SLURM_NTASKS ranks nor hosts a store, and says why. */
static int test_init_slurm_batch_step(void) {
  char path[] = "/tmp/braid_test_env_XXXXXX";
  int fd = mkstemp(path);
  BT_CHECK(fd >= 0, "mkstemp");
  close(fd);
  int port, lfd;
  char e[256];
  BT_CHECK(braid__listen_range("127.0.0.1", 0, 0, 0, 1, &lfd, &port, e, sizeof e) == BRAID_OK, "%s", e);
  close(lfd);
  char store[64];
  snprintf(store, sizeof store, "127.0.0.1:%d", port);
  setenv("BRAID_LOG", "info", 1);
  setenv("BRAID_LOG_FILE", path, 1);
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_JOB_ID", "77", 1);
  setenv("BRAID_STORE", store, 1);
  setenv("BRAID_BACKEND", "shm", 1);
  setenv("BRAID_INIT_TIMEOUT", "3", 1); /* bounds the wait should one happen */
  braid_comm *c = NULL;
  double t0 = braid__now();
  BT_CHECK_OK(braid_init(NULL, &c), NULL);
  double dt = braid__now() - t0;
  BT_CHECK(braid_rank(c) == 0 && braid_world_size(c) == 1, "rank %d of %d", braid_rank(c), braid_world_size(c));
  BT_CHECK_OK(braid_destroy(c), NULL);
  BT_CHECK(dt < 2, "braid_init took %.2f s", dt);
  char buf[8192];
  BT_CHECK(take_log(path, buf, sizeof buf) == 0, "log file %s", path);
  BT_CHECK(strstr(buf, "using the none convention: rank 0 of 1") &&
               strstr(buf, "Slurm variables ignored: SLURM_PROCID=0 and SLURM_NTASKS=4 are set but SLURM_STEP_ID is "
                           "not, so this process runs in a batch script"),
           "log: %s", buf);
  return 0;
}

int main(int argc, char **argv) {
  /* The real environment must not leak into braid_init-level cases. */
  const char *vars[] = {"BRAID_RANK", "BRAID_WORLD_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                        "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_ID", "SLURM_STEPID",
                        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "BRAID_STORE", "BRAID_STORE_EXTERNAL", "BRAID_TOKEN", "BRAID_BACKEND",
                        "BRAID_INIT_TIMEOUT"};
  for (size_t i = 0; i < BT_COUNT(vars); i++) unsetenv(vars[i]);
  static const bt_case cases[] = {
      BT_CASE(test_nothing_set), BT_CASE(test_braidrun),    BT_CASE(test_braidrun_errors),
      BT_CASE(test_torchrun),    BT_CASE(test_slurm),       BT_CASE(test_openmpi_pmi),
      BT_CASE(test_precedence),  BT_CASE(test_overrides),   BT_CASE(test_dataplane_vars),
      BT_CASE(test_parsers),     BT_CASE(test_ifname),      BT_CASE(test_port_range),
      BT_CASE(test_init_logs_convention), BT_CASE(test_slurm_batch_step), BT_CASE(test_init_slurm_batch_step),
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
