#include "core/params.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const braid__param params[] = {
    {"BRAID_BACKEND", BRAID_PT_STRING, "auto", "backend of braid_init(NULL): self for one rank, shm on one host"},
    {"BRAID_RANK", BRAID_PT_INT, "0", "this process's rank in the job"},
    {"BRAID_WORLD_SIZE", BRAID_PT_INT, "1", "number of ranks in the job"},
    {"BRAID_LOCAL_RANK", BRAID_PT_INT, NULL,
     "this process's rank among the job's ranks on its host (set with BRAID_LOCAL_SIZE; else derived)"},
    {"BRAID_LOCAL_SIZE", BRAID_PT_INT, NULL, "number of the job's ranks on this host (set with BRAID_LOCAL_RANK)"},
    {"BRAID_STORE", BRAID_PT_STRING, NULL,
     "host:port ([addr]:port for IPv6) of the rendezvous store; overrides MASTER_ADDR/MASTER_PORT"},
    {"BRAID_STORE_EXTERNAL", BRAID_PT_INT, "0",
     "1: the store at BRAID_STORE is already running (braidrun); 0: rank 0 starts it"},
    {"BRAID_TOKEN", BRAID_PT_STRING, NULL,
     "job secret, 64 hex digits, authenticating every store connection; unset: loopback-only store"},
    {"BRAID_JOB_ID", BRAID_PT_STRING, NULL,
     "namespace of the job's store keys (default: the launcher's job id); required with BRAID_STORE_EXTERNAL=1"},
    {"BRAID_INIT_TIMEOUT", BRAID_PT_SECONDS, "60",
     "seconds braid_init waits for the store and for every rank to join (0 = forever)"},
    {"BRAID_PORT_RANGE", BRAID_PT_STRING, NULL,
     "ports for data-plane listeners, e.g. 29500-29600 (busy ports are skipped); unset: any free port"},
    {"BRAID_IFNAME", BRAID_PT_STRING, NULL, "network interface whose address data-plane listeners use, e.g. eth0"},
    {"BRAID_ADDR", BRAID_PT_STRING, NULL, "numeric address data-plane listeners bind and advertise"},
    {"BRAID_TIMEOUT", BRAID_PT_SECONDS, "300",
     "seconds a blocking call may wait without progress before BRAID_ERR_TIMEOUT (decimals allowed; 0 = forever)"},
    {"BRAID_DESTROY_TIMEOUT", BRAID_PT_SECONDS, "5",
     "seconds braid_destroy spends completing pending operations before abandoning them"},
    {"BRAID_LOG", BRAID_PT_STRING, "warn", "log level: error, warn, info, debug, trace (or off)"},
    {"BRAID_LOG_SUBSYS", BRAID_PT_STRING, "all",
     "comma list of subsystems to log: init, coll, p2p, shm, tcp, boot, env"},
    {"BRAID_LOG_FILE", BRAID_PT_STRING, NULL,
     "append log lines to this file instead of stderr; %h = host, %p = pid"},
    {"BRAID_SHM_BUFFER", BRAID_PT_SIZE, "8M",
     "shm backend: shared staging bytes per rank (K/M/G suffix); bounds memory for large operations"},
    {"BRAID_SHM_CMA", BRAID_PT_INT, "1",
     "shm backend: 1 uses single-copy process_vm_readv/writev when the kernel allows it, 0 copies through shared memory"},
    {"BRAID_SHM_CMA_MIN", BRAID_PT_SIZE, "256M",
     "shm backend: collectives of at least this many bytes use single copy (when available; messages above 8 KiB always do)"},
    {"BRAID_SHM_ZEROCOPY", BRAID_PT_INT, "1",
     "shm backend: 1 lets peers read braid_mem_alloc buffers in place when the kernel allows it, 0 copies them "
     "like other memory"},
    {"BRAID_SHM_MEMBARRIER", BRAID_PT_INT, "1",
     "shm backend: 1 pairs wake-ups with membarrier when the kernel allows it (no fence per send), 0 fences both sides"},
};

const braid__param *braid__param_table(size_t *n) {
  *n = sizeof(params) / sizeof(params[0]);
  return params;
}

const char *braid__env(const char *name) {
  const char *v = getenv(name);
  return (v && *v) ? v : NULL;
}

int braid__parse_seconds(const char *s, double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || !isfinite(v) || v < 0) return -1;
  while (*end == ' ') end++;
  if (*end == 's' && end[1] == 0) end++;
  if (*end) return -1;
  *out = v;
  return 0;
}

int braid__parse_size(const char *s, size_t *out) {
  char *end = NULL;
  errno = 0;
  if (*s == '-') return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return -1;
  unsigned shift = 0;
  switch (*end) {
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  default: break;
  }
  if (shift && *end == 'i') end++; /* accept "Ki", "Mi", "Gi" */
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return -1;
  if (shift && v > (~0ull >> shift)) return -1;
  *out = (size_t)(v << shift);
  return 0;
}

braid_status braid__env_int(const char *name, long def, long lo, long hi, long *out, char *err, size_t errlen) {
  const char *v = braid__env(name);
  if (!v) {
    *out = def;
    return BRAID_OK;
  }
  char *end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi) {
    snprintf(err, errlen, "%s=\"%s\" is not an integer in [%ld, %ld]", name, v, lo, hi);
    return BRAID_ERR_INVALID_ARG;
  }
  *out = x;
  return BRAID_OK;
}

braid_status braid__env_seconds(const char *name, double def, double *out, char *err, size_t errlen) {
  const char *v = braid__env(name);
  if (!v) {
    *out = def;
    return BRAID_OK;
  }
  if (braid__parse_seconds(v, out) != 0) {
    snprintf(err, errlen, "%s=\"%s\" is not a non-negative number of seconds", name, v);
    return BRAID_ERR_INVALID_ARG;
  }
  return BRAID_OK;
}

braid_status braid__env_size(const char *name, size_t def, size_t *out, char *err, size_t errlen) {
  const char *v = braid__env(name);
  if (!v) {
    *out = def;
    return BRAID_OK;
  }
  if (braid__parse_size(v, out) != 0) {
    snprintf(err, errlen, "%s=\"%s\" is not a size (bytes, or with a K/M/G suffix)", name, v);
    return BRAID_ERR_INVALID_ARG;
  }
  return BRAID_OK;
}
