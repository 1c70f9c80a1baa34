/* Launcher-environment detection (see env.h). Pure string work: no sockets. */
#include "bootstrap/env.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/params.h"
#include "core/status.h"

#define MAX_RANKS (1 << 24)

const char *braid__env_getenv(void *ctx, const char *name) {
  (void)ctx;
  return getenv(name);
}

typedef struct convention {
  const char *name;    /* braid__launch_env.convention */
  const char *label;   /* for messages: "(torchrun convention)" */
  const char *rank, *size;
  const char *lrank, *lsize; /* lsize NULL: the launcher has no such variable */
  int master_addr;     /* MASTER_ADDR/MASTER_PORT may give the store address */
} convention;

/* In the order of precedence: the first convention whose rank or size variable
   is set is the one in use (braidrun started under Slurm is still braidrun).
   Slurm counts only inside a job step started by srun: see slurm_in_step. */
static const convention conventions[] = {
    {"braidrun", "braidrun", "BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_LOCAL_RANK", "BRAID_LOCAL_SIZE", 0},
    {"torchrun", "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", 1},
    {"slurm", "Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL, 1},
    {"openmpi", "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", 1},
    {"pmi", "PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", 1},
};

/* The braidrun names, used when config fields replace the launcher variables. */
static const convention generic = {"config", "braidrun", "BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_LOCAL_RANK",
                                   "BRAID_LOCAL_SIZE", 0};

typedef struct reader {
  braid__getenv_fn fn;
  void *ctx;
} reader;

static const char *get(const reader *r, const char *name) {
  if (!name) return NULL;
  const char *v = r->fn(r->ctx, name);
  return (v && *v) ? v : NULL;
}

/* A variable of the parameter list (core/params_list.h). */
static const char *param(const reader *r, braid__param_id id) { return get(r, braid__param_name(id)); }


/* Reads an integer variable; *out unchanged and OK when unset. */
static braid_status env_int(const reader *r, const char *name, long lo, long hi, int *out, int *set, char *err,
                            size_t errlen) {
  const char *v = get(r, name);
  *set = v != NULL;
  if (!v) return BRAID_OK;
  long x;
  if (braid__parse_long(v, lo, hi, &x))
    return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "%s=\"%s\" is not an integer in [%ld, %ld]", name, v, lo, hi);
  *out = (int)x;
  return BRAID_OK;
}

/* ---------------------------------------------------------------- small parsers */

int braid__parse_hostport(const char *s, char *host, size_t hostlen, int *port) {
  if (!s || !*s) return -1;
  const char *h = s, *colon;
  size_t hlen;
  if (*s == '[') {
    const char *close = strchr(s, ']');
    if (!close || close[1] != ':') return -1;
    h = s + 1;
    hlen = (size_t)(close - h);
    colon = close + 1;
  } else {
    colon = strrchr(s, ':');
    if (!colon || memchr(s, ':', (size_t)(colon - s))) return -1; /* bare IPv6 needs brackets */
    hlen = (size_t)(colon - s);
  }
  if (hlen == 0 || hlen >= hostlen) return -1;
  long p;
  if (braid__parse_long(colon + 1, 1, 65535, &p)) return -1;
  memcpy(host, h, hlen);
  host[hlen] = 0;
  *port = (int)p;
  return 0;
}

int braid__parse_port_range(const char *s, int *lo, int *hi) {
  if (!s) return -1;
  char buf[32];
  if (strlen(s) >= sizeof buf) return -1;
  snprintf(buf, sizeof buf, "%s", s);
  char *dash = strchr(buf, '-');
  long a, b;
  if (dash) {
    *dash = 0;
    if (braid__parse_long(buf, 1, 65535, &a) || braid__parse_long(dash + 1, 1, 65535, &b) || a > b) return -1;
  } else {
    if (braid__parse_long(buf, 1, 65535, &a)) return -1;
    b = a;
  }
  *lo = (int)a;
  *hi = (int)b;
  return 0;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int braid__parse_token_hex(const char *hex, uint8_t out[BRAID__ENV_TOKEN_LEN]) {
  if (!hex || strlen(hex) != 2 * BRAID__ENV_TOKEN_LEN) return -1;
  for (int i = 0; i < BRAID__ENV_TOKEN_LEN; i++) {
    int a = hexval(hex[2 * i]), b = hexval(hex[2 * i + 1]);
    if (a < 0 || b < 0) return -1;
    out[i] = (uint8_t)(a << 4 | b);
  }
  return 0;
}

int braid__host_is_loopback(const char *host) {
  if (!host) return 0;
  if (!strcasecmp(host, "localhost") || !strcasecmp(host, "localhost.localdomain") ||
      !strcasecmp(host, "ip6-localhost"))
    return 1;
  struct in_addr a4;
  if (inet_pton(AF_INET, host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  struct in6_addr a6;
  if (inet_pton(AF_INET6, host, &a6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&a6)) return 1;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) return a6.s6_addr[12] == 127;
  }
  return 0;
}

/* Keys are namespaced by the job id: keep it printable and free of '/'. */
static void set_job_id(braid__launch_env *e, const char *a, const char *b) {
  char raw[BRAID__ENV_JOB_MAX];
  if (b)
    snprintf(raw, sizeof raw, "%s.%s", a, b);
  else
    snprintf(raw, sizeof raw, "%s", a);
  size_t i = 0;
  for (; raw[i]; i++) {
    char ch = raw[i];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.' ||
             ch == '-' || ch == '_' || ch == ':' || ch == '@' || ch == '+';
    e->job_id[i] = ok ? ch : '_';
  }
  e->job_id[i] = 0;
}

/* A batch script (sbatch) and an allocation's shell (salloc) carry
   SLURM_PROCID=0 and the job's SLURM_NTASKS too, yet only one process runs
   there: waiting for SLURM_NTASKS ranks would end only at the init timeout.
   srun sets SLURM_STEP_ID (SLURM_STEPID on old versions) for the tasks of a
   step; the batch and interactive steps have none. */
static int slurm_in_step(const reader *r) { return get(r, "SLURM_STEP_ID") || get(r, "SLURM_STEPID"); }

/* mpirun / mpiexec inside an allocation start their daemons with srun, so
   the ranks inherit the daemon step's SLURM_PROCID (a node index). Open MPI's
   own variables then win; PMI's when they disagree with Slurm's (srun's PMI
   plugins set both, consistently). */
static int mpi_under_slurm(const reader *r) {
  if (get(r, "OMPI_COMM_WORLD_RANK")) return 1;
  const char *pr = get(r, "PMI_RANK"), *sr = get(r, "SLURM_PROCID");
  return pr && sr && strcmp(pr, sr) != 0;
}

/* The step's task count first: SLURM_NTASKS is the job's under srun
   --preserve-env, and old versions only set SLURM_NPROCS. */
static const char *slurm_size_var(const reader *r) {
  if (get(r, "SLURM_STEP_NUM_TASKS")) return "SLURM_STEP_NUM_TASKS";
  if (!get(r, "SLURM_NTASKS") && get(r, "SLURM_NPROCS")) return "SLURM_NPROCS";
  return "SLURM_NTASKS";
}

static const char *slurm_tpn_var(const reader *r) {
  return get(r, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
}

/* Slurm has no local-size variable; the step's tasks per node ("2(x3),1") with
   SLURM_NODEID (relative to the step's nodes) give it. -1 when either is
   missing or malformed anywhere (the whole list is checked, and every count
   must fit the rank limit: a count cut down to an int would be a wrong size). */
static int slurm_local_size(const reader *r) {
  const char *tpn = get(r, slurm_tpn_var(r)), *nid = get(r, "SLURM_NODEID");
  long node;
  if (!tpn || !nid || braid__parse_long(nid, 0, MAX_RANKS, &node)) return -1;
  const char *p = tpn;
  int found = -1;
  while (*p) {
    char *end;
    if (*p < '0' || *p > '9') return -1; /* strtol would take spaces and signs */
    errno = 0;
    long tasks = strtol(p, &end, 10);
    if (errno || end == p || tasks < 1 || tasks > MAX_RANKS) return -1;
    long reps = 1;
    p = end;
    if (p[0] == '(' && p[1] == 'x') {
      if (p[2] < '0' || p[2] > '9') return -1;
      errno = 0;
      reps = strtol(p + 2, &end, 10);
      if (errno || *end != ')' || reps < 1 || reps > MAX_RANKS) return -1;
      p = end + 1;
    }
    if (found < 0 && node < reps) found = (int)tasks;
    if (found < 0) node -= reps;
    if (*p == ',' && p[1]) p++;
    else if (*p) return -1;
  }
  return found;
}

/* ---------------------------------------------------------------- detection */

static braid_status detect_store(const reader *r, const convention *cv, const braid__env_overrides *ov,
                                 unsigned flags, const char *trigger, braid__launch_env *e, char *err, size_t errlen) {
  const char *v;
  if (ov->store_addr) {
    if (braid__parse_hostport(ov->store_addr, e->store_host, sizeof e->store_host, &e->store_port))
      return braid__errf(BRAID_ERR_INVALID_ARG, err, errlen,
                  "cfg->store_addr \"%s\" is not host:port (use [addr]:port for IPv6)", ov->store_addr);
    e->store_from = "cfg->store_addr";
  } else if ((v = param(r, BRAID_P_STORE))) {
    if (braid__parse_hostport(v, e->store_host, sizeof e->store_host, &e->store_port))
      return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "BRAID_STORE=\"%s\" is not host:port (use [addr]:port for IPv6)",
                  v);
    e->store_from = "BRAID_STORE";
  } else if (cv->master_addr && (get(r, "MASTER_ADDR") || get(r, "MASTER_PORT"))) {
    const char *ma = get(r, "MASTER_ADDR"), *mp = get(r, "MASTER_PORT");
    if (!ma) return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "MASTER_PORT is set but MASTER_ADDR is missing");
    if (!mp) return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "MASTER_ADDR is set but MASTER_PORT is missing");
    long port;
    if (braid__parse_long(mp, 1, 65535, &port))
      return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "MASTER_PORT=\"%s\" is not a port number in [1, 65535]", mp);
    size_t len = strlen(ma);
    if (ma[0] == '[' && len > 2 && ma[len - 1] == ']') { /* "[::1]" */
      ma++;
      len -= 2;
    }
    if (len >= sizeof e->store_host)
      return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "MASTER_ADDR is longer than %zu characters",
                  sizeof e->store_host - 1);
    memcpy(e->store_host, ma, len);
    e->store_host[len] = 0;
    e->store_port = (int)port;
    e->store_from = "MASTER_ADDR/MASTER_PORT";
    /* Under torchrun the agent's own store already listens on MASTER_PORT. */
    const char *agent = get(r, "TORCHELASTIC_USE_AGENT_STORE");
    if (!strcmp(cv->name, "torchrun") && agent && (!strcasecmp(agent, "true") || !strcmp(agent, "1"))) {
      if (port == 65535)
        return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen,
                    "MASTER_PORT=65535 is held by torchrun's store and leaves no port above it for braid's: "
                    "set BRAID_STORE=host:port");
      e->store_port = (int)port + 1;
      e->store_from = "MASTER_ADDR/MASTER_PORT+1 (torchrun's own store holds MASTER_PORT)";
    }
  }
  if (!e->store_port) {
    e->store_owner = BRAID__STORE_NONE;
    if (e->world_size > 1 && (flags & BRAID__ENV_REQUIRE_STORE)) {
      if (!strcmp(cv->name, "braidrun"))
        return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen,
                    "%s is set but BRAID_STORE is missing (braidrun convention): set BRAID_STORE=host:port or "
                    "start the job with braidrun",
                    trigger);
      if (!strcmp(cv->name, "torchrun"))
        return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen,
                    "%s is set but MASTER_ADDR and MASTER_PORT are missing (torchrun convention): set them or "
                    "BRAID_STORE=host:port",
                    trigger);
      if (!strcmp(cv->name, "config"))
        return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen,
                    "world size %d needs a store address: set cfg->store_addr or BRAID_STORE=host:port",
                    e->world_size);
      return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen,
                  "%s is set but no store address: set BRAID_STORE or MASTER_ADDR and MASTER_PORT", trigger);
    }
    return BRAID_OK;
  }
  v = param(r, BRAID_P_STORE_EXTERNAL);
  if (v && strcmp(v, "0") && strcmp(v, "1"))
    return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "BRAID_STORE_EXTERNAL=\"%s\" is neither 0 nor 1", v);
  long external = 0;
  braid_status st = braid__param_parse_int(BRAID_P_STORE_EXTERNAL, v, 0, 1, &external, err, errlen);
  if (st) return st;
  e->store_owner = external ? BRAID__STORE_EXTERNAL : BRAID__STORE_RANK0;
  return BRAID_OK;
}

static braid_status detect_job_id(const reader *r, const convention *cv, braid__launch_env *e, char *err,
                                  size_t errlen) {
  const char *v;
  if ((v = param(r, BRAID_P_JOB_ID)))
    set_job_id(e, v, NULL);
  else if (!strcmp(cv->name, "torchrun") && (v = get(r, "TORCHELASTIC_RUN_ID")))
    set_job_id(e, "torchrun", v);
  else if (!strcmp(cv->name, "slurm") && (v = get(r, "SLURM_JOB_ID")))
    set_job_id(e, v, get(r, "SLURM_STEP_ID") ? get(r, "SLURM_STEP_ID") : get(r, "SLURM_STEPID"));
  else if ((!strcmp(cv->name, "openmpi") || !strcmp(cv->name, "pmi")) && (v = get(r, "PMIX_NAMESPACE")))
    set_job_id(e, v, NULL);
  else if (!strcmp(cv->name, "openmpi") && (v = get(r, "OMPI_MCA_ess_base_jobid")))
    set_job_id(e, "ompi", v);
  /* A shared, long-lived store sees many jobs: only a job id keeps them apart. */
  if (e->store_owner == BRAID__STORE_EXTERNAL && !e->job_id[0])
    return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen,
                "BRAID_STORE_EXTERNAL=1 needs BRAID_JOB_ID, so that jobs sharing that store keep their keys apart");
  return BRAID_OK;
}

static braid_status detect_dataplane(const reader *r, const braid__env_overrides *ov, braid__launch_env *e, char *err,
                                     size_t errlen) {
  const char *v;
  if (ov->init_timeout_s >= 0) {
    if (!isfinite(ov->init_timeout_s))
      return braid__errf(BRAID_ERR_INVALID_ARG, err, errlen, "cfg->init_timeout_s must be finite and non-negative");
    e->init_timeout_s = ov->init_timeout_s;
  } else if (ov->init_timeout_s != ov->init_timeout_s) { /* NaN */
    return braid__errf(BRAID_ERR_INVALID_ARG, err, errlen, "cfg->init_timeout_s must be finite and non-negative");
  } else {
    braid_status st = braid__param_parse_seconds(BRAID_P_INIT_TIMEOUT, param(r, BRAID_P_INIT_TIMEOUT),
                                                 &e->init_timeout_s, err, errlen);
    if (st) return st == BRAID_ERR_INVALID_ARG ? BRAID_ERR_BOOTSTRAP : st; /* the launcher's setting is at fault */
  }
  if ((v = param(r, BRAID_P_PORT_RANGE)) && braid__parse_port_range(v, &e->port_lo, &e->port_hi))
    return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen,
                "BRAID_PORT_RANGE=\"%s\" is not a port range like 29500-29600 (ports 1 to 65535, low first)", v);
  const char *ifname = param(r, BRAID_P_IFNAME), *addr = param(r, BRAID_P_ADDR);
  if (ifname && addr)
    return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen,
                "BRAID_IFNAME=\"%s\" and BRAID_ADDR=\"%s\" are both set; set only one", ifname, addr);
  if (ifname) {
    if (strlen(ifname) >= sizeof e->ifname)
      return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "BRAID_IFNAME=\"%s\" is too long for an interface name",
                  ifname);
    snprintf(e->ifname, sizeof e->ifname, "%s", ifname);
  }
  if (addr) {
    struct in6_addr a;
    if (strlen(addr) >= sizeof e->addr ||
        (inet_pton(AF_INET, addr, &a) != 1 && inet_pton(AF_INET6, addr, &a) != 1))
      return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "BRAID_ADDR=\"%s\" is not a numeric IPv4 or IPv6 address",
                  addr);
    snprintf(e->addr, sizeof e->addr, "%s", addr);
  }
  return BRAID_OK;
}

braid_status braid__env_detect(braid__getenv_fn fn, void *ctx, const braid__env_overrides *ovp, unsigned flags,
                               braid__launch_env *e, char *err, size_t errlen) {
  static const braid__env_overrides none = BRAID__ENV_OVERRIDES_NONE;
  const braid__env_overrides *ov = ovp ? ovp : &none;
  reader rd = {fn ? fn : braid__env_getenv, ctx};
  const reader *r = &rd;
  braid_status st;
  memset(e, 0, sizeof *e);
  e->local_rank = e->local_size = -1;
  if (err && errlen) err[0] = 0;
  /* Without a launcher: the defaults of BRAID_RANK and BRAID_WORLD_SIZE
     (not read where the application gives the value). */
  long def_rank = 0, def_size = 1;
  if ((ov->rank < 0 && (st = braid__param_parse_int(BRAID_P_RANK, NULL, 0, MAX_RANKS - 1, &def_rank, err, errlen))) ||
      (ov->world_size < 0 &&
       (st = braid__param_parse_int(BRAID_P_WORLD_SIZE, NULL, 1, MAX_RANKS, &def_size, err, errlen))))
    return st;
  e->rank = (int)def_rank;
  e->world_size = (int)def_size;

  int cfg_rank = ov->rank >= 0, cfg_size = ov->world_size >= 0;
  if (cfg_size && ov->world_size < 1)
    return braid__errf(BRAID_ERR_INVALID_ARG, err, errlen, "world size %d must be at least 1", ov->world_size);

  const convention *cv = NULL;
  if (cfg_rank && cfg_size) {
    cv = &generic; /* the application said it all; launcher variables do not apply */
  } else {
    for (size_t i = 0; i < sizeof conventions / sizeof conventions[0] && !cv; i++) {
      const convention *k = &conventions[i];
      int slurm = !strcmp(k->name, "slurm");
      if (!get(r, k->rank) && !get(r, k->size) && !(slurm && get(r, "SLURM_STEP_NUM_TASKS"))) continue;
      if (slurm && !slurm_in_step(r)) {
        const char *sv = slurm_size_var(r), *pid = get(r, "SLURM_PROCID"), *nt = get(r, sv);
        char set[160];
        if (pid && nt)
          snprintf(set, sizeof set, "SLURM_PROCID=%.16s and %s=%.16s are", pid, sv, nt);
        else
          snprintf(set, sizeof set, "%s=%.16s is", pid ? "SLURM_PROCID" : sv, pid ? pid : nt);
        snprintf(e->note, sizeof e->note,
                 "Slurm variables ignored: %s set but SLURM_STEP_ID is not, so this process runs in a batch "
                 "script or an allocation's shell, not as a task started by srun; start the ranks with srun",
                 set);
        continue;
      }
      if (slurm && mpi_under_slurm(r)) {
        snprintf(e->note, sizeof e->note,
                 "Slurm variables ignored: this process was started by an MPI launcher inside a Slurm step "
                 "(its rank differs from SLURM_PROCID, which numbers the launcher's daemons)");
        continue;
      }
      cv = k;
    }
  }
  e->convention = cv ? cv->name : "none";
  const char *trigger = NULL; /* the variable that selected the convention, for messages */
  int is_slurm = cv && !strcmp(cv->name, "slurm");
  const char *size_var = is_slurm ? slurm_size_var(r) : cv ? cv->size : NULL;

  if (cv && cv != &generic) {
    int have_rank = 0, have_size = 0;
    if (!cfg_rank && (st = env_int(r, cv->rank, 0, MAX_RANKS - 1, &e->rank, &have_rank, err, errlen))) return st;
    if (!cfg_size && (st = env_int(r, size_var, 1, MAX_RANKS, &e->world_size, &have_size, err, errlen)))
      return st;
    trigger = get(r, cv->rank) ? cv->rank : size_var;
    if (!cfg_rank && !have_rank)
      return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "%s is set but %s is missing (%s convention)", size_var,
                  cv->rank, cv->label);
    if (!cfg_size && !have_size) {
      if (is_slurm)
        return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen,
                    "%s is set but SLURM_STEP_NUM_TASKS and SLURM_NTASKS are missing (Slurm convention)", cv->rank);
      return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "%s is set but %s is missing (%s convention)", cv->rank,
                  size_var, cv->label);
    }
  }
  if (cfg_rank) e->rank = ov->rank;
  if (cfg_size) e->world_size = ov->world_size;
  if (!trigger) trigger = cv ? cv->rank : "BRAID_RANK";

  if (e->rank >= e->world_size) {
    if (cfg_rank || cfg_size)
      return braid__errf(BRAID_ERR_INVALID_ARG, err, errlen, "rank %d out of range for world size %d (%s)", e->rank,
                  e->world_size,
                  cfg_rank && cfg_size ? "cfg->rank, cfg->world_size"
                                       : (cfg_rank ? "cfg->rank against the environment's world size"
                                                   : "the environment's rank against cfg->world_size"));
    return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "rank %d out of range for world size %d: %s=%d is not below %s=%d",
                e->rank, e->world_size, cv->rank, e->rank, size_var, e->world_size);
  }

  e->got = BRAID__ENV_GOT_RANK;

  /* Local rank and size: a pair (Slurm has no size variable; it is derived). */
  const convention *lc = cv ? cv : &generic;
  int have_lr = 0, have_ls = 0;
  if ((st = env_int(r, lc->lrank, 0, MAX_RANKS - 1, &e->local_rank, &have_lr, err, errlen))) return st;
  if (lc->lsize) {
    if ((st = env_int(r, lc->lsize, 1, MAX_RANKS, &e->local_size, &have_ls, err, errlen))) return st;
    if (have_lr && !have_ls)
      return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "%s is set but %s is missing (%s convention)", lc->lrank,
                  lc->lsize, lc->label);
    if (have_ls && !have_lr)
      return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "%s is set but %s is missing (%s convention)", lc->lsize,
                  lc->lrank, lc->label);
  } else if (have_lr) {
    e->local_size = slurm_local_size(r);
  }
  if (ov->local_rank >= 0) e->local_rank = ov->local_rank;
  if (ov->local_size >= 0) e->local_size = ov->local_size;
  if ((ov->local_rank >= 0) != (ov->local_size >= 0) && !(have_lr && have_ls))
    return braid__errf(BRAID_ERR_INVALID_ARG, err, errlen, "cfg->local_rank and cfg->local_size must be set together");
  if (e->local_size >= 0 || e->local_rank >= 0) {
    int from_cfg = ov->local_rank >= 0 || ov->local_size >= 0;
    braid_status bad = from_cfg ? BRAID_ERR_INVALID_ARG : BRAID_ERR_BOOTSTRAP;
    const char *lr = from_cfg ? "cfg->local_rank" : lc->lrank;
    const char *ls = from_cfg ? "cfg->local_size" : (lc->lsize ? lc->lsize : slurm_tpn_var(r));
    if (e->local_size == 0 && from_cfg)
      return braid__errf(bad, err, errlen, "cfg->local_size 0 must be at least 1");
    if (e->local_size > 0 && e->local_rank >= e->local_size)
      return braid__errf(bad, err, errlen, "%s=%d is not below %s=%d", lr, e->local_rank, ls, e->local_size);
    if (e->local_size > e->world_size)
      return braid__errf(bad, err, errlen, "%s=%d is larger than the world size %d", ls, e->local_size, e->world_size);
    if (e->local_size < 0) e->local_rank = -1; /* half a pair is no use: derive both at rendezvous */
  }

  if ((st = detect_store(r, lc, ov, flags, trigger, e, err, errlen))) return st;

  const char *tok;
  if (ov->token_hex) {
    if (braid__parse_token_hex(ov->token_hex, e->token))
      return braid__errf(BRAID_ERR_INVALID_ARG, err, errlen, "cfg->token_hex is not %d hex digits", 2 * BRAID__ENV_TOKEN_LEN);
    e->has_token = 1;
  } else if ((tok = param(r, BRAID_P_TOKEN))) {
    /* Never echo the value: it is a secret. */
    if (braid__parse_token_hex(tok, e->token))
      return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "BRAID_TOKEN is not %d hex digits", 2 * BRAID__ENV_TOKEN_LEN);
    e->has_token = 1;
  }

  if ((st = detect_job_id(r, lc, e, err, errlen))) return st;
  e->got = BRAID__ENV_GOT_STORE;
  return detect_dataplane(r, ov, e, err, errlen);
}

void braid__env_describe(const braid__launch_env *e, char *buf, size_t len) {
  char local[64] = "";
  if (e->local_size > 0) snprintf(local, sizeof local, " (local %d of %d)", e->local_rank, e->local_size);
  char store[BRAID__ENV_HOST_MAX + 128];
  if (e->store_owner == BRAID__STORE_NONE)
    snprintf(store, sizeof store, "no store");
  else
    snprintf(store, sizeof store, "store %s%s%s:%d from %s, hosted by %s", strchr(e->store_host, ':') ? "[" : "",
             e->store_host, strchr(e->store_host, ':') ? "]" : "", e->store_port, e->store_from,
             e->store_owner == BRAID__STORE_EXTERNAL ? "the launcher" : "rank 0");
  snprintf(buf, len, "rank %d of %d%s, %s, %s%s%s%s%s", e->rank, e->world_size, local, store,
           e->has_token ? "token set" : "no token", e->job_id[0] ? ", job " : "", e->job_id, e->note[0] ? "; " : "",
           e->note);
}
