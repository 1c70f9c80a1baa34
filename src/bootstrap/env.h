/*
 * Launcher-environment detection: which launcher started this process, and
 * what it says about rank, world size, local rank, the rendezvous store and
 * the job token. Pure: reads variables through a getenv-like callback (tests
 * feed fake environments) and touches no sockets.
 *
 * Conventions, first match wins:
 *   braidrun  BRAID_RANK BRAID_WORLD_SIZE [BRAID_LOCAL_RANK BRAID_LOCAL_SIZE]
 *             BRAID_STORE BRAID_TOKEN
 *   torchrun  RANK WORLD_SIZE [LOCAL_RANK LOCAL_WORLD_SIZE] MASTER_ADDR MASTER_PORT
 *   slurm     SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS, SLURM_NPROCS)
 *             [SLURM_LOCALID], store from BRAID_STORE or MASTER_ADDR/MASTER_PORT;
 *             only in a task srun started (SLURM_STEP_ID or SLURM_STEPID set):
 *             a batch script or salloc shell has the variables but is one
 *             process, so there they are ignored (note says so) and detection
 *             goes on with the next convention
 *   openmpi   OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE [OMPI_COMM_WORLD_LOCAL_RANK
 *             OMPI_COMM_WORLD_LOCAL_SIZE], store as for slurm
 *   pmi       PMI_RANK PMI_SIZE [MPI_LOCALRANKID MPI_LOCALNRANKS], store as for slurm
 *   none      nothing set: world size 1
 * BRAID_STORE, BRAID_TOKEN, BRAID_JOB_ID, BRAID_INIT_TIMEOUT, BRAID_PORT_RANGE,
 * BRAID_IFNAME and BRAID_ADDR apply under every convention.
 */
#ifndef BRAID_BOOTSTRAP_ENV_H
#define BRAID_BOOTSTRAP_ENV_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"

#define BRAID__ENV_TOKEN_LEN 32 /* bytes; BRAID_TOKEN is twice as many hex digits */
#define BRAID__ENV_HOST_MAX 256
#define BRAID__ENV_JOB_MAX 128

/* Returns the value of name, or NULL when unset. Empty values count as unset. */
typedef const char *(*braid__getenv_fn)(void *ctx, const char *name);

/* The process environment (getenv), for braid__env_detect. */
const char *braid__env_getenv(void *ctx, const char *name);

typedef enum braid__store_owner {
  BRAID__STORE_NONE = 0, /* no store address: only world size 1 works */
  BRAID__STORE_RANK0,    /* rank 0 starts the server at the address, everyone connects */
  BRAID__STORE_EXTERNAL  /* already running (braidrun, the test harness): everyone connects */
} braid__store_owner;

typedef struct braid__launch_env {
  const char *convention; /* "braidrun", "torchrun", "slurm", "openmpi", "pmi", "config", "none" */
  int rank, world_size;
  int local_rank, local_size; /* -1 when the launcher does not say (derived at rendezvous) */
  braid__store_owner store_owner;
  char store_host[BRAID__ENV_HOST_MAX]; /* without brackets for IPv6 */
  int store_port;
  const char *store_from; /* the variables that gave the address, for messages */
  uint8_t token[BRAID__ENV_TOKEN_LEN];
  int has_token;
  char job_id[BRAID__ENV_JOB_MAX]; /* "" when neither BRAID_JOB_ID nor the launcher gives one */
  double init_timeout_s;           /* 0: wait forever */
  int port_lo, port_hi;            /* BRAID_PORT_RANGE; 0, 0: any free port */
  char ifname[64];                 /* BRAID_IFNAME, "" unset */
  char addr[BRAID__ENV_HOST_MAX];  /* BRAID_ADDR, "" unset */
  char note[384];                  /* why present launcher variables were ignored, for logs; "" if none */
  /* How much of the above detection read before it failed (all of it on
     success): BRAID__ENV_GOT_RANK: rank and world_size; BRAID__ENV_GOT_STORE:
     also the store, token and job id, so that only a setting of this rank's
     own (BRAID_INIT_TIMEOUT, BRAID_PORT_RANGE, BRAID_IFNAME, BRAID_ADDR) was
     wrong and the rank can still tell the others. */
  int got;
} braid__launch_env;

#define BRAID__ENV_GOT_RANK 1
#define BRAID__ENV_GOT_STORE 2

/* What braid_config sets explicitly; it takes precedence over the environment. */
typedef struct braid__env_overrides {
  int rank, world_size;       /* < 0: from the environment */
  int local_rank, local_size; /* < 0: from the environment */
  const char *store_addr;     /* "host:port"; NULL: from the environment */
  const char *token_hex;      /* 64 hex digits; NULL: from the environment */
  double init_timeout_s;      /* < 0: from the environment */
} braid__env_overrides;

#define BRAID__ENV_OVERRIDES_NONE {-1, -1, -1, -1, NULL, NULL, -1.0}

/* Flags of braid__env_detect. */
#define BRAID__ENV_REQUIRE_STORE 1u /* world size > 1 without a store address is an error */

/*
 * Fills *out from the environment (get, ctx) and the overrides (ov may be NULL).
 * Errors: BRAID_ERR_BOOTSTRAP for missing, malformed or inconsistent variables,
 * BRAID_ERR_INVALID_ARG when an override is at fault; err receives a sentence
 * naming the variable(s), e.g. "RANK is set but WORLD_SIZE is missing (torchrun
 * convention)".
 */
braid_status braid__env_detect(braid__getenv_fn get, void *ctx, const braid__env_overrides *ov, unsigned flags,
                               braid__launch_env *out, char *err, size_t errlen);

/* One-line summary for logs: "rank 1 of 4 (local 1 of 2), store 10.0.0.1:29500
   hosted by rank 0, token set, job 1234.0", then "; <note>" when there is one. */
void braid__env_describe(const braid__launch_env *e, char *buf, size_t len);

/* "host:port" or "[v6addr]:port" with port 1..65535; 0 on success, -1 if malformed. */
int braid__parse_hostport(const char *s, char *host, size_t hostlen, int *port);
/* "lo-hi" or a single port, 1 <= lo <= hi <= 65535; 0 on success, -1 if malformed. */
int braid__parse_port_range(const char *s, int *lo, int *hi);
/* 64 hex digits into 32 bytes; 0 on success, -1 if malformed. */
int braid__parse_token_hex(const char *hex, uint8_t out[BRAID__ENV_TOKEN_LEN]);
/* Whether host names this machine's loopback ("localhost", 127.x.y.z, ::1). */
int braid__host_is_loopback(const char *host);

#endif
