/*
 * libFuzzer target: launcher-environment detection (braid__env_detect) over
 * a fake environment built from the input. See README.md.
 *
 * Input: byte 0 holds flags, then records up to the end:
 *   [name u8][value bytes up to a 0x00 byte or the end]
 * name picks one of the variables below (modulo their count); a later record
 * for the same name replaces the earlier value; an empty value is unset, as
 * for getenv. flags bit0: BRAID__ENV_REQUIRE_STORE; bit1: braid_config
 * overrides, whose numbers come from the pseudo-variables cfg.* (decimal
 * text, unset = not overridden).
 *
 * Checked on success: the rank fits the world, the local pair is consistent,
 * the store address and its owner agree, an external store has a job id,
 * numbers are in range and strings terminated. On failure: a sentence, and
 * never the job token's value (the token is a secret) unless another
 * variable holds the same text.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/env.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const names[] = {
    "BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_LOCAL_RANK", "BRAID_LOCAL_SIZE", "BRAID_STORE",
    "BRAID_STORE_EXTERNAL", "BRAID_TOKEN", "BRAID_JOB_ID", "BRAID_INIT_TIMEOUT", "BRAID_PORT_RANGE",
    "BRAID_IFNAME", "BRAID_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS",
    "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_JOB_ID",
    "SLURM_NODEID", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid",
    "PMIX_NAMESPACE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    /* braid_config fields (flags bit1) */
    "cfg.rank", "cfg.world_size", "cfg.local_rank", "cfg.local_size", "cfg.store_addr", "cfg.token_hex",
    "cfg.init_timeout_s"};
#define NNAMES (sizeof names / sizeof names[0])
#define VALUE_MAX 512

typedef struct fake_env {
  char value[NNAMES][VALUE_MAX];
  int set[NNAMES];
} fake_env;

static const char *fake_get(void *ctx, const char *name) {
  fake_env *f = ctx;
  for (size_t i = 0; i < NNAMES; i++)
    if (!strcmp(names[i], name)) return f->set[i] ? f->value[i] : NULL;
  return NULL;
}

static const char *cfg(const fake_env *f, const char *name) {
  for (size_t i = 0; i < NNAMES; i++)
    if (!strcmp(names[i], name)) return f->set[i] ? f->value[i] : NULL;
  return NULL;
}

static int cfg_int(const fake_env *f, const char *name) {
  const char *v = cfg(f, name);
  return v ? atoi(v) : -1;
}

/* A broken rule names itself before the crash libFuzzer records. */
static void fail(const char *what, int line) {
  fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, line, what);
  abort();
}
#define check(cond) ((cond) ? (void)0 : fail(#cond, __LINE__))

static int terminated(const char *s, size_t cap) { return memchr(s, 0, cap) != NULL; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static fake_env f;
  memset(f.set, 0, sizeof f.set);
  if (size == 0) return 0;
  unsigned flags = data[0];
  size_t i = 1;
  while (i < size) {
    size_t idx = data[i++] % NNAMES;
    size_t n = 0;
    while (i < size && data[i] != 0) {
      if (n + 1 < VALUE_MAX) f.value[idx][n++] = (char)data[i];
      i++;
    }
    i++; /* the 0x00 */
    f.value[idx][n] = 0;
    f.set[idx] = n > 0; /* getenv's empty string counts as unset for braid */
  }
  braid__env_overrides ov = BRAID__ENV_OVERRIDES_NONE;
  if (flags & 2) {
    ov.rank = cfg_int(&f, "cfg.rank");
    ov.world_size = cfg_int(&f, "cfg.world_size");
    ov.local_rank = cfg_int(&f, "cfg.local_rank");
    ov.local_size = cfg_int(&f, "cfg.local_size");
    ov.store_addr = cfg(&f, "cfg.store_addr");
    ov.token_hex = cfg(&f, "cfg.token_hex");
    const char *t = cfg(&f, "cfg.init_timeout_s");
    ov.init_timeout_s = t ? strtod(t, NULL) : -1.0;
  }
  braid__launch_env e;
  char err[512];
  braid_status st = braid__env_detect(fake_get, &f, &ov, (flags & 1) ? BRAID__ENV_REQUIRE_STORE : 0, &e, err,
                                      sizeof err);
  check(terminated(err, sizeof err));
  if (st != BRAID_OK) {
    check(err[0] != 0);
    /* A token-like value (16 or more hex digits) cannot be message text by chance. */
    const char *tok = cfg(&f, "BRAID_TOKEN");
    if (tok && strlen(tok) >= 16 && strspn(tok, "0123456789abcdefABCDEF") == strlen(tok) && strstr(err, tok)) {
      /* Only acceptable when another variable carries the same text. */
      int elsewhere = 0;
      for (size_t k = 0; k < NNAMES; k++)
        if (f.set[k] && strcmp(names[k], "BRAID_TOKEN") && strstr(f.value[k], tok)) elsewhere = 1;
      check(elsewhere);
    }
    return 0;
  }
  check(e.convention != NULL);
  check(e.world_size >= 1 && e.rank >= 0 && e.rank < e.world_size);
  check(e.local_size == -1 || (e.local_size >= 1 && e.local_size <= e.world_size));
  if (e.local_size == -1) check(e.local_rank == -1);
  else check(e.local_rank >= 0 && e.local_rank < e.local_size);
  check(terminated(e.store_host, sizeof e.store_host) && terminated(e.job_id, sizeof e.job_id));
  check(terminated(e.ifname, sizeof e.ifname) && terminated(e.addr, sizeof e.addr));
  check(terminated(e.note, sizeof e.note));
  if (e.store_owner == BRAID__STORE_NONE) {
    check(!(flags & 1) || e.world_size == 1);
  } else {
    check(e.store_port >= 1 && e.store_port <= 65535 && e.store_host[0] && e.store_from);
    check(e.store_owner == BRAID__STORE_RANK0 || e.store_owner == BRAID__STORE_EXTERNAL);
  }
  if (e.store_owner == BRAID__STORE_EXTERNAL) check(e.job_id[0] != 0);
  for (const char *p = e.job_id; *p; p++) check(*p != '/' && (unsigned char)*p > 0x20 && (unsigned char)*p < 0x7f);
  check(isfinite(e.init_timeout_s) && e.init_timeout_s >= 0);
  check((e.port_lo == 0 && e.port_hi == 0) || (e.port_lo >= 1 && e.port_lo <= e.port_hi && e.port_hi <= 65535));
  check(!(e.ifname[0] && e.addr[0]));
  char desc[1024];
  braid__env_describe(&e, desc, sizeof desc);
  check(terminated(desc, sizeof desc));
  return 0;
}
