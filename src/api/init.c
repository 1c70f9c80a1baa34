/* braid_init, braid_destroy, braid_abort and the accessors. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/algos.h"
#include "api/api.h"
#include "backends/backends.h"
#include "bootstrap/bootstrap.h"
#include "core/params.h"
#include "core/subcomm.h"
#include "core/wait.h"
#include "os/time.h"

static braid_status init_fail(braid_status st, int rank, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static braid_status init_fail(braid_status st, int rank, const char *fmt, ...) {
  char text[BRAID_ERRLEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (rank >= 0) return braid__fail(NULL, st, "braid_init: %s (rank %d)", text, rank);
  return braid__fail(NULL, st, "braid_init: %s", text);
}

/* The settings every communicator of the job shares, from the environment. */
static braid_status read_settings(braid_comm *c, const braid_config *def) {
  char err[BRAID_ERRLEN];
  double timeout = def->timeout_s, dtimeout = def->destroy_timeout_s;
  if (timeout < 0 && braid__param_seconds(BRAID_P_TIMEOUT, &timeout, err, sizeof err))
    return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s", err);
  if (dtimeout < 0 && braid__param_seconds(BRAID_P_DESTROY_TIMEOUT, &dtimeout, err, sizeof err))
    return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s", err);
  /* An infinite destroy timeout would let destroy hang; "forever" is 0 where it exists. */
  if (!isfinite(timeout) || timeout < 0)
    return braid__fail(c, BRAID_ERR_INVALID_ARG,
                       "timeout %g (braid_config.timeout_s or BRAID_TIMEOUT) must be finite and >= 0 (0 waits forever)",
                       timeout);
  if (!isfinite(dtimeout) || dtimeout < 0)
    return braid__fail(c, BRAID_ERR_INVALID_ARG,
                       "destroy timeout %g (braid_config.destroy_timeout_s or BRAID_DESTROY_TIMEOUT) must be finite "
                       "and >= 0",
                       dtimeout);
  long check = 1;
  if (braid__param_int(BRAID_P_CHECK, 0, 1, &check, err, sizeof err))
    return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s", err);
  const char *algo = braid__param_str(BRAID_P_ALGO);
  if (algo && braid__algo_parse(algo, c->algo, err, sizeof err))
    return braid__fail(c, BRAID_ERR_INVALID_ARG, "BRAID_ALGO=\"%s\": %s", algo, err);
  c->timeout_s = timeout;
  c->destroy_timeout_s = dtimeout;
  c->check = (int)check;
  return BRAID_OK;
}

/* How many nodes the ranks are on, as hier counts them: each rank adds its
   node to the store once (the first rank of a node counts it), then waits
   for every rank to have done so. */
static braid_status count_nodes(braid_comm *c, int *nnodes) {
  braid__store *st = c->boot->store;
  char key[400], node[300];
  braid__node_key(node, sizeof node);
  uint64_t h = 1469598103934665603ull;
  for (const char *p = node; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  snprintf(key, sizeof key, "auto/node/%016llx", (unsigned long long)h);
  int64_t k = 0, n = 0;
  braid_status rc = braid__store_add(st, key, 1, &k);
  if (!rc && k == 1) rc = braid__store_add(st, "auto/nodes", 1, &n);
  snprintf(key, sizeof key, "auto/in/%d", c->rank);
  if (!rc) rc = braid__store_set(st, key, "1", 1);
  char(*names)[32] = malloc(sizeof *names * (size_t)c->size);
  const char **keys = malloc(sizeof *keys * (size_t)c->size);
  if (!rc && (!names || !keys)) rc = BRAID_ERR_NO_MEMORY;
  for (int r = 0; !rc && r < c->size; r++) {
    snprintf(names[r], sizeof names[r], "auto/in/%d", r);
    keys[r] = names[r];
  }
  if (!rc) rc = braid__store_wait(st, keys, c->size, braid__deadline(c->boot->init_timeout_s), NULL);
  free(names);
  free(keys);
  if (!rc) rc = braid__store_add(st, "auto/nodes", 0, &n);
  if (rc)
    return braid__fail(c, rc == BRAID_ERR_NO_MEMORY ? rc : BRAID_ERR_BOOTSTRAP,
                       "could not count the nodes to choose a backend: %s", braid__store_error(st));
  *nnodes = (int)n;
  return BRAID_OK;
}

/* BRAID_BACKEND unset and several ranks: shm when they share a node, hier
   when they do not. */
static braid_status choose_auto(braid_comm *c, const braid__backend **ops) {
  /* The launcher's word on locality decides, unless BRAID_NODE_ID says
     which node each rank is on. */
  int nnodes = c->boot->local_size == c->size ? 1 : 2;
  if (braid__param_str(BRAID_P_NODE_ID)) {
    braid_status st = count_nodes(c, &nnodes);
    if (st) return st;
  }
  const char *name = nnodes == 1 ? "shm" : "hier";
  const braid__backend *b = braid__backend_find(name);
  if (!b)
    return braid__fail(c, BRAID_ERR_UNSUPPORTED,
                       "the %d ranks are on %s and no backend was named, but backend %s is not built (built: "
                       "%s); set BRAID_BACKEND",
                       c->size, nnodes == 1 ? "one node" : "several nodes", name, braid__backend_names());
  BLOG_INFO(BRAID_SUB_INIT, c->rank, "backend chosen automatically: %s (%d ranks %s; BRAID_BACKEND unset)", name,
            c->size, nnodes == 1 ? "on one node" : "on several nodes");
  *ops = b;
  c->ops = b;
  return BRAID_OK;
}

/* One "NAME=value" line of settings text s: the value, or NULL. */
static const char *setting_of(const char *s, const char *name, size_t *vlen) {
  size_t nl = strlen(name);
  for (const char *p = s; *p;) {
    const char *e = strchr(p, '\n');
    size_t ll = e ? (size_t)(e - p) : strlen(p);
    if (ll > nl && !strncmp(p, name, nl) && p[nl] == '=') {
      *vlen = ll - nl - 1;
      return p + nl + 1;
    }
    if (!e) break;
    p = e + 1;
  }
  return NULL;
}

/* The settings every rank must share: a rank on another backend, or that
   forces other algorithms, skips the call check the others make or
   composes hier of other parts, would meet the others only at the
   deadline. The first rank here publishes its settings; each other rank
   compares its own, and one that differs fails its start, which every
   rank then learns (braid__start_failed). */
static braid_status agree_settings(braid_comm *c, const braid__backend *ops) {
  braid__store *store = c->boot ? c->boot->store : NULL;
  if (!store || c->size < 2) return BRAID_OK;
  char algo[400], mine[700];
  braid__algo_spec(c->algo, algo, sizeof algo);
  int n = snprintf(mine, sizeof mine, "%d\nBRAID_BACKEND=%s\nBRAID_ALGO=%s\nBRAID_CHECK=%d\n", c->rank, ops->name,
                   algo, c->check);
  if (!strcmp(ops->name, "hier") && n > 0 && (size_t)n < sizeof mine)
    snprintf(mine + n, sizeof mine - (size_t)n, "BRAID_HIER_INTRA=%s\nBRAID_HIER_INTER=%s\n",
             braid__param_str(BRAID_P_HIER_INTRA), braid__param_str(BRAID_P_HIER_INTER));
  int swapped = 0;
  void *cur = NULL;
  size_t curlen = 0;
  if (braid__store_cas(store, "settings", NULL, 0, mine, strlen(mine), &swapped, &cur, &curlen)) {
    free(cur);
    return braid__fail(c, BRAID_ERR_BOOTSTRAP, "could not compare the ranks' settings in the store: %s",
                       braid__store_error(store));
  }
  char theirs[700];
  snprintf(theirs, sizeof theirs, "%.*s", (int)(curlen < sizeof theirs ? curlen : sizeof theirs - 1),
           cur ? (const char *)cur : "");
  free(cur);
  if (swapped) return BRAID_OK;
  int who = atoi(theirs);
  static const char *const names[] = {"BRAID_BACKEND", "BRAID_ALGO", "BRAID_CHECK", "BRAID_HIER_INTRA",
                                      "BRAID_HIER_INTER"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    size_t ml = 0, tl = 0;
    const char *m = setting_of(strchr(mine, '\n') + 1, names[i], &ml);
    const char *t = setting_of(strchr(theirs, '\n') ? strchr(theirs, '\n') + 1 : "", names[i], &tl);
    if (!m && !t) continue;
    if (m && t && ml == tl && !memcmp(m, t, ml)) continue;
    return braid__fail(c, BRAID_ERR_INVALID_ARG,
                       "%s differs between ranks: \"%.*s\" here, \"%.*s\" on rank %d; every rank must set it alike",
                       names[i], (int)ml, m ? m : "", (int)tl, t ? t : "", who);
  }
  return BRAID_OK;
}

/* A rank whose environment does not read meets no one. When enough of it
   reads to reach the others' store, it tells them why, so that they fail now
   instead of at BRAID_INIT_TIMEOUT (braid__bootstrap_tell_failed). failed is
   what the failed detection read: when only a setting of this rank's own was
   wrong, to its world as its rank. When its own rank or the world size cannot
   be read (a launcher's variable broken or out of range on this rank), and
   the rest reads with that value supplied (so it was the fault): without a
   rank, to the world of its size; without a size, under a namespace of the
   job that does not name one. */
static void tell_unstarted(const braid__env_overrides *ov, unsigned flags, const braid__launch_env *failed,
                           braid_status st, const char *why) {
  if (failed->got == BRAID__ENV_GOT_STORE) {
    if (failed->world_size > 1 && failed->store_owner != BRAID__STORE_NONE)
      braid__bootstrap_tell_failed(failed->rank, failed->world_size, failed, st, why);
    return;
  }
  braid__env_overrides o = *ov;
  braid__launch_env env;
  char err[BRAID_ERRLEN];
  if (ov->rank < 0) { /* not given by the application */
    o.rank = 0;
    if (braid__env_detect(braid__env_getenv, NULL, &o, flags, &env, err, sizeof err) == BRAID_OK) {
      if (env.world_size > 1 && env.store_owner != BRAID__STORE_NONE)
        braid__bootstrap_tell_failed(-1, env.world_size, &env, st, why);
      return;
    }
    o.rank = ov->rank;
  }
  if (ov->world_size >= 0) return;
  o.world_size = INT_MAX; /* admits any rank */
  if (braid__env_detect(braid__env_getenv, NULL, &o, flags, &env, err, sizeof err) == BRAID_OK &&
      env.store_owner != BRAID__STORE_NONE)
    braid__bootstrap_tell_failed(env.rank, 0, &env, st, why);
}

braid_status braid_init(const braid_config *cfg, braid_comm **out) {
  if (!out) return braid__fail_caller(BRAID_ERR_INVALID_ARG, "braid_init: comm is NULL");
  *out = NULL;
  braid__log_reload(); /* the application may have set BRAID_LOG* since the last init */
  braid_config def = BRAID_CONFIG_INIT;
  if (cfg) {
    if (cfg->struct_size < offsetof(braid_config, destroy_timeout_s) + sizeof(double) ||
        cfg->struct_size > sizeof(braid_config))
      return init_fail(BRAID_ERR_INVALID_ARG, -1,
                       "cfg->struct_size %zu is not a braid_config size; start from BRAID_CONFIG_INIT",
                       cfg->struct_size);
    memcpy(&def, cfg, cfg->struct_size);
  }
  char err[BRAID_ERRLEN];
  /* The backend is looked up first: a one-rank backend never meets peers,
     so it needs no store. "auto" (the default) decides after the rendezvous. */
  const char *name = def.backend ? def.backend : braid__param_str(BRAID_P_BACKEND);
  int by_default = !name || !strcmp(name, "auto");
  const braid__backend *ops = by_default ? NULL : braid__backend_find(name);
  braid__env_overrides ov = {def.rank,       def.world_size, def.local_rank,    def.local_size,
                             def.store_addr, def.token_hex,  def.init_timeout_s};
  braid__launch_env env;
  unsigned flags = ops && !(ops->caps & BRAID__CAP_NEEDS_STORE) ? 0 : BRAID__ENV_REQUIRE_STORE;
  braid_status st;
  /* Started by mpirun (Open MPI's or PMI's variables) with no store: the mpi
     backend when it was built. */
  const braid__backend *mpi = braid__backend_find("mpi");
  if (by_default && mpi && !braid__env_detect(braid__env_getenv, NULL, &ov, 0, &env, err, sizeof err) &&
      env.world_size > 1 && env.store_owner == BRAID__STORE_NONE &&
      (!strcmp(env.convention, "openmpi") || !strcmp(env.convention, "pmi"))) {
    by_default = 0;
    ops = mpi;
    flags = 0;
  }
  st = braid__env_detect(braid__env_getenv, NULL, &ov, flags, &env, err, sizeof err);
  if (st) {
    tell_unstarted(&ov, flags, &env, st, err);
    return init_fail(st, env.got ? env.rank : -1, "%s", err); /* the rank, when it was read */
  }
  if (by_default) {
    name = env.world_size == 1 ? "self" : "shm";
    ops = braid__backend_find(name);
  }
  int rank = env.rank;
  /* A backend this build lacks. With a store and other ranks, this rank
     still meets them and fails after the rendezvous, so that they learn
     why it cannot start instead of waiting for it. */
  char missing[BRAID_ERRLEN] = "";
  braid_status missing_st = BRAID_OK;
  if (!ops && !strcmp(name, "mpi")) {
    missing_st = BRAID_ERR_UNSUPPORTED;
    snprintf(missing, sizeof missing,
             "backend mpi was not built: no MPI was found when braid was configured (Debian: apt-get install "
             "libopenmpi-dev openmpi-bin, then configure again) (built: %s)",
             braid__backend_names());
  } else if (!ops) {
    missing_st = BRAID_ERR_INVALID_ARG;
    snprintf(missing, sizeof missing, "unknown backend \"%s\" (built: %s)", name, braid__backend_names());
  }
  if (!ops && (env.world_size < 2 || env.store_owner == BRAID__STORE_NONE))
    return init_fail(missing_st, rank, "%s", missing);

  braid_comm *c = braid__comm_alloc();
  if (!c) return init_fail(BRAID_ERR_NO_MEMORY, rank, "out of memory for the communicator");
  c->ops = ops;
  c->rank = rank;
  c->size = env.world_size;
  c->id = 1;
  if (braid__log_enabled(BRAID_LOG_INFO, BRAID_SUB_ENV)) {
    char desc[BRAID_ERRLEN];
    braid__env_describe(&env, desc, sizeof desc);
    BLOG_INFO(BRAID_SUB_ENV, c->rank, "using the %s convention: %s", env.convention, desc);
  }
  pthread_mutex_lock(&c->lock);
  c->call = "braid_init";
  /* A one-rank backend in a larger world is refused after the rendezvous,
     as a backend this build lacks is, so that the others learn why; at
     once when there is no store to meet at. */
  int one_rank_only = ops && (ops->caps & BRAID__CAP_SINGLE_RANK) && c->size > 1;
  if (ops && (ops->caps & BRAID__CAP_OWN_WORLD)) {
    /* Rank and size are the backend's (init sets them); no store. */
    c->cfg_handle = def.mpi_comm;
    c->start_timeout_s = env.init_timeout_s;
  } else if (!one_rank_only || env.store_owner != BRAID__STORE_NONE) {
    st = braid__bootstrap_world(c->rank, c->size, &env, &c->boot, err, sizeof err);
    if (st) braid__fail(c, st, "%s", err);
  }
  if (!st && !ops) st = braid__fail(c, missing_st, "%s", missing);
  if (!st && one_rank_only)
    st = braid__fail(c, BRAID_ERR_INVALID_ARG, "backend %s supports world size 1 only, not %d", ops->name, c->size);
  /* Read after the rendezvous: a bad value then fails the other ranks'
     starts at once with this rank's sentence (braid__start_failed). */
  if (!st) st = read_settings(c, &def);
  if (!st && by_default && c->size > 1 && c->boot) st = choose_auto(c, &ops);
  if (!st && (ops->caps & BRAID__CAP_ONE_HOST) && c->boot && c->boot->local_size != c->size)
    st = braid__fail(c, BRAID_ERR_UNSUPPORTED,
                     "backend %s connects ranks of one host, but the %d ranks span several hosts (%d on this one)",
                     ops->name, c->size, c->boot->local_size);
  if (!st) st = agree_settings(c, ops);
  if (!st) {
    st = ops->init(c);
  } else if (ops && (ops->caps & BRAID__CAP_OWN_WORLD)) {
    /* No store to tell the others through: the backend starts anyway and
       its rendezvous carries this rank's failure to them. */
    c->start_st = st;
    ops->init(c);
  }
  if (!st) st = braid__comm_start(c);
  if (st) braid__start_failed(c, st);
  c->call = NULL;
  pthread_mutex_unlock(&c->lock);
  if (st) {
    braid__set_thread_error(c->last_error);
    if (c->be) ops->destroy(c, 0);
    c->be = NULL;
    /* A store this rank hosts stays up a little for the others to read why
       the start failed (they leave within a start check's 0.1 s), unless
       they timed out or died. */
    braid__bootstrap_free(c->boot,
                          st == BRAID_ERR_TIMEOUT || st == BRAID_ERR_PEER_LOST ? 0 : BRAID__BOOT_FAILED_LINGER_S);
    braid__comm_free(c);
    return st;
  }
  BLOG_INFO(BRAID_SUB_INIT, c->rank, "braid %s: backend %s, rank %d of %d, timeout %g s, call check %s",
            braid_version(), ops->name, c->rank, c->size, c->timeout_s, c->check ? "on" : "off");
  *out = c;
  return BRAID_OK;
}

braid_status braid_destroy(braid_comm *c) {
  if (!c) return braid__null_comm("braid_destroy");
  /* Checked without touching *c: after a first braid_destroy it is freed. */
  if (!braid__live_contains(c))
    return braid__fail_caller(BRAID_ERR_INVALID_ARG,
                              "braid_destroy: comm %p is not a live communicator of this process (destroyed already?)",
                              (void *)c);
  /* Under the lock: no call queues itself on c, or lets go of it, meanwhile. */
  pthread_mutex_lock(&c->lock);
  braid_status st = braid__group_forget(c);
  if (!st && c->lent)
    st = braid__fail_in(c, "braid_destroy", BRAID_ERR_INVALID_ARG,
                        "%d call(s) on this communicator wait in other threads (they let this call in while they "
                        "wait); destroy it after they return (braid_abort makes them return at once)",
                        c->lent);
  if (st) {
    pthread_mutex_unlock(&c->lock);
    return st;
  }
  braid__comm_release_locked(c, -1);
  return BRAID_OK;
}

braid_status braid_abort(braid_comm *c) {
  if (!c) return braid__null_comm("braid_abort");
  if (atomic_exchange(&c->aborted, 1)) return BRAID_OK;
  char text[BRAID_ERRLEN], msg[BRAID_ERRLEN];
  snprintf(text, sizeof text, "braid_abort: communicator aborted by the application");
  snprintf(msg, sizeof msg, "%s (rank %d)", text, c->rank);
  int expected = 0;
  pthread_mutex_lock(&c->err_lock);
  if (atomic_compare_exchange_strong(&c->failed, &expected, (int)BRAID_ERR_ABORTED)) {
    snprintf(c->fatal_error, sizeof c->fatal_error, "%s", msg);
    snprintf(c->fatal_text, sizeof c->fatal_text, "%s", text);
  }
  /* last_error is left to the call the abort interrupts (it says where the
     abort met it); later calls repeat fatal_error. */
  pthread_mutex_unlock(&c->err_lock);
  BLOG_WARN(BRAID_SUB_INIT, c->rank, "%s", msg);
  if (c->ops && c->ops->abort) c->ops->abort(c);
  /* The other ranks hear of it at once when no call holds the communicator;
     otherwise the call the abort wakes tells them as it returns. */
  if (pthread_mutex_trylock(&c->lock) == 0) {
    braid__publish_failure(c);
    pthread_mutex_unlock(&c->lock);
  }
  return BRAID_OK;
}

int braid_world_size(const braid_comm *c) { return c ? c->size : -1; }
int braid_rank(const braid_comm *c) { return c ? c->rank : -1; }
const char *braid_backend(const braid_comm *c) { return c ? c->ops->name : NULL; }
