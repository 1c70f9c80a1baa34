/* Public entry points: argument checks, serialization, sticky failure, dispatch. */
#include "core/comm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap.h"
#include "core/dtype.h"
#include "core/params.h"
#include "core/reduce.h"

static _Thread_local char tls_error[BRAID_ERRLEN];
static _Thread_local char tls_copy[BRAID_ERRLEN];

/* ---------------------------------------------------------------- errors */

braid_status braid__vfail(braid_comm *c, braid_status st, const char *fmt, va_list ap) {
  char text[BRAID_ERRLEN];
  vsnprintf(text, sizeof text, fmt, ap);
  char msg[BRAID_ERRLEN];
  if (c) {
    snprintf(msg, sizeof msg, "%s: %s (rank %d)", c->call ? c->call : "braid", text, c->rank);
    int fatal = braid__status_is_fatal(st);
    int expected = 0;
    pthread_mutex_lock(&c->err_lock);
    snprintf(c->last_error, sizeof c->last_error, "%s", msg);
    if (fatal && atomic_compare_exchange_strong(&c->failed, &expected, (int)st))
      snprintf(c->fatal_error, sizeof c->fatal_error, "%s", msg);
    pthread_mutex_unlock(&c->err_lock);
    BRAID_LOG(fatal ? BRAID_LOG_ERROR : BRAID_LOG_INFO, BRAID_SUB_COLL, c->rank, "%s [%s]", msg,
              braid_status_string(st));
  } else {
    snprintf(msg, sizeof msg, "%s", text);
    BLOG_INFO(BRAID_SUB_INIT, -1, "%s [%s]", msg, braid_status_string(st));
  }
  snprintf(tls_error, sizeof tls_error, "%s", msg);
  return st;
}

braid_status braid__fail(braid_comm *c, braid_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  braid__vfail(c, st, fmt, ap);
  va_end(ap);
  return st;
}

const char *braid_last_error(const braid_comm *comm) {
  if (!comm) return tls_error;
  braid_comm *c = (braid_comm *)comm;
  pthread_mutex_lock(&c->err_lock);
  snprintf(tls_copy, sizeof tls_copy, "%s", c->last_error);
  pthread_mutex_unlock(&c->err_lock);
  return tls_copy;
}

static void describe_count(char *out, size_t len, size_t count, braid_dtype dt) {
  snprintf(out, len, "%zu elements of %s (%zu bytes)", count, braid_dtype_name(dt), count * braid_dtype_size(dt));
}

void braid__mismatch_text(char *out, size_t len, int src, uint32_t tag, size_t msg_count, braid_dtype msg_dt,
                          size_t recv_count, braid_dtype recv_dt) {
  char got[96], want[96];
  describe_count(got, sizeof got, msg_count, msg_dt);
  describe_count(want, sizeof want, recv_count, recv_dt);
  snprintf(out, len, "message from rank %d with tag %u has %s but the receive expects %s", src, tag, got, want);
}

/* ---------------------------------------------------------------- registry */

static const braid__backend_ops *const backends[] = {&braid__self_ops, &braid__shm_ops};

const braid__backend_ops *braid__backend_find(const char *name) {
  for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++)
    if (!strcmp(backends[i]->name, name)) return backends[i];
  return NULL;
}

static char backend_names[128];
static pthread_once_t backend_names_once = PTHREAD_ONCE_INIT;

static void fill_backend_names(void) {
  size_t o = 0;
  for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]) && o < sizeof backend_names; i++) {
    int n = snprintf(backend_names + o, sizeof backend_names - o, "%s%s", i ? ", " : "", backends[i]->name);
    if (n < 0) break;
    o += (size_t)n;
  }
}

const char *braid__backend_names(void) {
  pthread_once(&backend_names_once, fill_backend_names);
  return backend_names;
}

/* ---------------------------------------------------------------- entry/exit */

static braid_status null_comm(const char *call) {
  return braid__fail(NULL, BRAID_ERR_INVALID_ARG, "%s: comm is NULL", call);
}

/* Locks c for one public call; fails at once if c is failed. */
static braid_status enter(braid_comm *c, const char *call) {
  if (!c) return null_comm(call);
  pthread_mutex_lock(&c->lock);
  c->call = call;
  int failed = atomic_load(&c->failed);
  if (failed) {
    /* The stored message already names the original call and the rank. */
    char msg[BRAID_ERRLEN];
    pthread_mutex_lock(&c->err_lock);
    snprintf(msg, sizeof msg, "%s: communicator failed earlier: %s", call, c->fatal_error);
    snprintf(c->last_error, sizeof c->last_error, "%s", msg);
    pthread_mutex_unlock(&c->err_lock);
    snprintf(tls_error, sizeof tls_error, "%s", msg);
    BLOG_DEBUG(BRAID_SUB_COLL, c->rank, "%s", msg);
    c->call = NULL;
    pthread_mutex_unlock(&c->lock);
    return (braid_status)failed;
  }
  return BRAID_OK;
}

static braid_status leave(braid_comm *c, braid_status st) {
  c->call = NULL;
  pthread_mutex_unlock(&c->lock);
  return st;
}

/* Checks the pieces every data call shares; returns OK or the failing status. */
static braid_status check_dtype(braid_comm *c, braid_dtype dt) {
  if (!braid__dtype_valid(dt)) return braid__fail(c, BRAID_ERR_INVALID_ARG, "unknown dtype %d", (int)dt);
  return BRAID_OK;
}

static braid_status check_dtype_op(braid_comm *c, braid_dtype dt, braid_op op) {
  braid_status st = check_dtype(c, dt);
  if (st) return st;
  if (!braid__op_valid(op)) return braid__fail(c, BRAID_ERR_INVALID_ARG, "unknown op %d", (int)op);
  st = braid__check_dtype_op(dt, op);
  if (st)
    return braid__fail(c, st, "op %s is not defined for dtype %s", braid_op_name(op), braid_dtype_name(dt));
  return BRAID_OK;
}

/* bytes = count * dtype size * mult, rejecting overflow. */
static braid_status check_bytes(braid_comm *c, const char *what, size_t count, braid_dtype dt, size_t mult,
                                size_t *bytes) {
  size_t esz = braid_dtype_size(dt);
  if (count > ((size_t)PTRDIFF_MAX / esz) / mult)
    return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s count %zu of %s overflows the address space", what, count,
                       braid_dtype_name(dt));
  *bytes = count * esz * mult;
  return BRAID_OK;
}

static braid_status check_buf(braid_comm *c, const char *what, const void *p, size_t count) {
  if (!p && count > 0) return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s is NULL with count %zu", what, count);
  return BRAID_OK;
}

static braid_status check_rank(braid_comm *c, const char *what, int r) {
  if (r < 0 || r >= c->size)
    return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s %d out of range for world size %d", what, r, c->size);
  return BRAID_OK;
}

static int overlaps(const void *a, size_t alen, const void *b, size_t blen) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return alen && blen && x < y + blen && y < x + alen;
}

#define TRY(expr)                    \
  do {                               \
    braid_status try_st_ = (expr);   \
    if (try_st_) return leave(c, try_st_); \
  } while (0)

/* Backend result: fatal errors the backend forgot to record still fail c. */
static braid_status finish(braid_comm *c, braid_status st) {
  if (st && braid__status_is_fatal(st) && !atomic_load(&c->failed))
    braid__fail(c, st, "%s", braid_status_string(st));
  return leave(c, st);
}

/* ---------------------------------------------------------------- lifecycle */

static braid_comm *comm_alloc(void) {
  braid_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->err_lock, NULL);
  atomic_init(&c->failed, 0);
  atomic_init(&c->aborted, 0);
  return c;
}

static void comm_free(braid_comm *c) {
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->err_lock);
  free(c);
}

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

braid_status braid_init(const braid_config *cfg, braid_comm **out) {
  if (!out) return braid__fail(NULL, BRAID_ERR_INVALID_ARG, "braid_init: comm is NULL");
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
  /* The backend is looked up first: self never meets peers, so it needs no store. */
  const char *name = def.backend ? def.backend : braid__env("BRAID_BACKEND");
  const braid__backend_ops *ops = name ? braid__backend_find(name) : NULL;
  braid__env_overrides ov = {def.rank,       def.world_size, def.local_rank,    def.local_size,
                             def.store_addr, def.token_hex,  def.init_timeout_s};
  braid__launch_env env;
  unsigned flags = name && ops == &braid__self_ops ? 0 : BRAID__ENV_REQUIRE_STORE;
  braid_status st = braid__env_detect(braid__env_getenv, NULL, &ov, flags, &env, err, sizeof err);
  if (st) return init_fail(st, -1, "%s", err);
  /* No backend named: one rank needs none, ranks of one host use shared
     memory (checked after the rendezvous, which knows the hosts). */
  int by_default = !name;
  if (by_default) {
    name = env.world_size == 1 ? "self" : "shm";
    ops = braid__backend_find(name);
  }
  int rank = env.rank;
  double timeout = def.timeout_s, dtimeout = def.destroy_timeout_s;
  if (timeout < 0 && braid__env_seconds("BRAID_TIMEOUT", 300.0, &timeout, err, sizeof err))
    return init_fail(BRAID_ERR_INVALID_ARG, rank, "%s", err);
  if (dtimeout < 0 && braid__env_seconds("BRAID_DESTROY_TIMEOUT", 5.0, &dtimeout, err, sizeof err))
    return init_fail(BRAID_ERR_INVALID_ARG, rank, "%s", err);
  if (!(timeout >= 0) || !(dtimeout >= 0))
    return init_fail(BRAID_ERR_INVALID_ARG, rank, "timeouts must be finite and non-negative");
  if (!ops)
    return init_fail(BRAID_ERR_INVALID_ARG, rank, "unknown backend \"%s\" (built: %s)", name,
                     braid__backend_names());

  braid_comm *c = comm_alloc();
  if (!c) return init_fail(BRAID_ERR_NO_MEMORY, rank, "out of memory for the communicator");
  c->ops = ops;
  c->rank = rank;
  c->size = env.world_size;
  c->id = 1;
  c->timeout_s = timeout;
  c->destroy_timeout_s = dtimeout;
  if (braid__log_enabled(BRAID_LOG_INFO, BRAID_SUB_ENV)) {
    char desc[BRAID_ERRLEN];
    braid__env_describe(&env, desc, sizeof desc);
    BLOG_INFO(BRAID_SUB_ENV, c->rank, "using the %s convention: %s", env.convention, desc);
  }
  pthread_mutex_lock(&c->lock);
  c->call = "braid_init";
  /* self rejects world sizes above 1 in its init; a rendezvous would only delay that. */
  if (!(ops == &braid__self_ops && c->size > 1)) st = braid__bootstrap_world(c, &env, &c->boot);
  if (!st && by_default && c->boot && c->boot->local_size != c->size)
    st = braid__fail(c, BRAID_ERR_UNSUPPORTED,
                     "the %d ranks span several hosts (%d on this one) and no backend was named; set BRAID_BACKEND "
                     "or braid_config.backend to a backend for several hosts (built: %s)",
                     c->size, c->boot->local_size, braid__backend_names());
  if (!st) st = ops->init(c);
  c->call = NULL;
  pthread_mutex_unlock(&c->lock);
  if (st) {
    snprintf(tls_error, sizeof tls_error, "%s", c->last_error);
    braid__bootstrap_free(c, 0);
    comm_free(c);
    return st;
  }
  BLOG_INFO(BRAID_SUB_INIT, c->rank, "braid %s: backend %s, rank %d of %d, timeout %g s", braid_version(),
            ops->name, c->rank, c->size, c->timeout_s);
  *out = c;
  return BRAID_OK;
}

braid_status braid_destroy(braid_comm *c) {
  if (!c) return null_comm("braid_destroy");
  pthread_mutex_lock(&c->lock);
  c->call = "braid_destroy";
  /* A failed communicator has nothing left worth waiting for. */
  double t = atomic_load(&c->failed) ? 0.0 : c->destroy_timeout_s;
  if (c->ops && c->be) c->ops->destroy(c, t);
  c->be = NULL;
  braid__bootstrap_free(c, t);
  c->call = NULL;
  pthread_mutex_unlock(&c->lock);
  comm_free(c);
  return BRAID_OK;
}

braid_status braid_abort(braid_comm *c) {
  if (!c) return null_comm("braid_abort");
  if (atomic_exchange(&c->aborted, 1)) return BRAID_OK;
  char msg[BRAID_ERRLEN];
  snprintf(msg, sizeof msg, "braid_abort: communicator aborted by the application (rank %d)", c->rank);
  int expected = 0;
  pthread_mutex_lock(&c->err_lock);
  if (atomic_compare_exchange_strong(&c->failed, &expected, (int)BRAID_ERR_ABORTED))
    snprintf(c->fatal_error, sizeof c->fatal_error, "%s", msg);
  snprintf(c->last_error, sizeof c->last_error, "%s", msg);
  pthread_mutex_unlock(&c->err_lock);
  BLOG_WARN(BRAID_SUB_INIT, c->rank, "%s", msg);
  if (c->ops && c->ops->abort) c->ops->abort(c);
  return BRAID_OK;
}

int braid_world_size(const braid_comm *c) { return c ? c->size : -1; }
int braid_rank(const braid_comm *c) { return c ? c->rank : -1; }
const char *braid_backend(const braid_comm *c) { return c ? c->ops->name : NULL; }

/* ---------------------------------------------------------------- collectives */

braid_status braid_all_reduce(braid_comm *c, void *buf, size_t count, braid_dtype dt, braid_op op) {
  braid_status st = enter(c, "braid_all_reduce");
  if (st) return st;
  size_t bytes = 0;
  TRY(check_dtype_op(c, dt, op));
  TRY(check_buf(c, "buf", buf, count));
  TRY(check_bytes(c, "buf", count, dt, 1, &bytes));
  if (count == 0) return leave(c, BRAID_OK);
  c->seq++;
  return finish(c, c->ops->all_reduce(c, buf, count, dt, op));
}

braid_status braid_broadcast(braid_comm *c, void *buf, size_t count, braid_dtype dt, int root) {
  braid_status st = enter(c, "braid_broadcast");
  if (st) return st;
  size_t bytes = 0;
  TRY(check_dtype(c, dt));
  TRY(check_rank(c, "root", root));
  TRY(check_buf(c, "buf", buf, count));
  TRY(check_bytes(c, "buf", count, dt, 1, &bytes));
  if (count == 0) return leave(c, BRAID_OK);
  c->seq++;
  return finish(c, c->ops->broadcast(c, buf, count, dt, root));
}

braid_status braid_all_gather(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt) {
  braid_status st = enter(c, "braid_all_gather");
  if (st) return st;
  size_t bytes = 0, total = 0;
  TRY(check_dtype(c, dt));
  TRY(check_buf(c, "send", send, count));
  TRY(check_buf(c, "recv", recv, count));
  TRY(check_bytes(c, "send", count, dt, 1, &bytes));
  TRY(check_bytes(c, "recv", count, dt, (size_t)c->size, &total));
  if (count == 0) return leave(c, BRAID_OK);
  const char *mine = (const char *)recv + (size_t)c->rank * bytes;
  if (send != mine && overlaps(send, bytes, recv, total))
    return leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG,
                                "send overlaps recv but is not the in-place position recv + %d*count", c->rank));
  c->seq++;
  return finish(c, c->ops->all_gather(c, send, recv, count, dt));
}

braid_status braid_reduce_scatter(braid_comm *c, const void *send, void *recv, size_t count, braid_dtype dt,
                                  braid_op op) {
  braid_status st = enter(c, "braid_reduce_scatter");
  if (st) return st;
  size_t bytes = 0, total = 0;
  TRY(check_dtype_op(c, dt, op));
  TRY(check_buf(c, "send", send, count));
  TRY(check_buf(c, "recv", recv, count));
  TRY(check_bytes(c, "recv", count, dt, 1, &bytes));
  TRY(check_bytes(c, "send", count, dt, (size_t)c->size, &total));
  if (count == 0) return leave(c, BRAID_OK);
  const char *mine = (const char *)send + (size_t)c->rank * bytes;
  if ((const char *)recv != mine && overlaps(send, total, recv, bytes))
    return leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG,
                                "recv overlaps send but is not the in-place position send + %d*count", c->rank));
  c->seq++;
  return finish(c, c->ops->reduce_scatter(c, send, recv, count, dt, op));
}

/* ---------------------------------------------------------------- point to point */

braid_status braid_send(braid_comm *c, const void *buf, size_t count, braid_dtype dt, int dest, uint32_t tag) {
  braid_status st = enter(c, "braid_send");
  if (st) return st;
  size_t bytes = 0;
  TRY(check_dtype(c, dt));
  TRY(check_rank(c, "dest", dest));
  TRY(check_buf(c, "buf", buf, count));
  TRY(check_bytes(c, "buf", count, dt, 1, &bytes));
  if (count == 0) return leave(c, BRAID_OK);
  return finish(c, c->ops->send(c, buf, count, dt, dest, tag));
}

braid_status braid_recv(braid_comm *c, void *buf, size_t count, braid_dtype dt, int src, uint32_t tag) {
  braid_status st = enter(c, "braid_recv");
  if (st) return st;
  size_t bytes = 0;
  TRY(check_dtype(c, dt));
  TRY(check_rank(c, "src", src));
  TRY(check_buf(c, "buf", buf, count));
  TRY(check_bytes(c, "buf", count, dt, 1, &bytes));
  if (count == 0) return leave(c, BRAID_OK);
  return finish(c, c->ops->recv(c, buf, count, dt, src, tag));
}

braid_status braid_sync(braid_comm *c) {
  braid_status st = enter(c, "braid_sync");
  if (st) return st;
  return finish(c, c->ops->sync(c));
}

braid_status braid_barrier(braid_comm *c) {
  braid_status st = enter(c, "braid_barrier");
  if (st) return st;
  c->seq++;
  return finish(c, c->ops->barrier(c));
}

/* ---------------------------------------------------------------- split */

typedef struct split_entry {
  uint32_t color, key;
  int rank;
} split_entry;

static int split_cmp(const void *a, const void *b) {
  const split_entry *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Mixes the parent's id, the split's ordinal and the color into the child's id. */
static uint64_t child_id(uint64_t parent, uint32_t ordinal, uint32_t color) {
  uint64_t x = parent * 0x9E3779B97F4A7C15ull ^ ((uint64_t)ordinal << 32 | color);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return (x ^ (x >> 31)) | 1; /* never 0 */
}

braid_status braid_split(braid_comm *c, uint32_t color, uint32_t key, braid_comm **out) {
  braid_status st = enter(c, "braid_split");
  if (st) return st;
  if (!out) return leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG, "out is NULL"));
  *out = NULL;
  uint32_t mine[2] = {color, key};
  uint32_t *all = malloc(sizeof(uint32_t) * 2 * (size_t)c->size);
  split_entry *ents = malloc(sizeof(split_entry) * (size_t)c->size);
  int *members = malloc(sizeof(int) * (size_t)c->size);
  braid_comm *child = NULL;
  if (!all || !ents || !members) {
    st = braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %d ranks' split entries", c->size);
    goto done;
  }
  /* Every rank learns every (color, key): the grouping is computed identically everywhere. */
  c->seq++;
  st = c->ops->all_gather(c, mine, all, 2, BRAID_U32);
  if (st) goto done;
  uint32_t ordinal = ++c->nsplits;
  if (color == BRAID_SPLIT_NONE) goto done;
  int n = 0;
  for (int r = 0; r < c->size; r++)
    if (all[2 * r] == color) ents[n++] = (split_entry){color, all[2 * r + 1], r};
  qsort(ents, (size_t)n, sizeof *ents, split_cmp);
  int newrank = -1;
  for (int i = 0; i < n; i++) {
    members[i] = ents[i].rank;
    if (ents[i].rank == c->rank) newrank = i;
  }
  child = comm_alloc();
  if (!child) {
    st = braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for the new communicator");
    goto done;
  }
  child->ops = c->ops;
  child->rank = newrank;
  child->size = n;
  child->id = child_id(c->id, ordinal, color);
  child->timeout_s = c->timeout_s;
  child->destroy_timeout_s = c->destroy_timeout_s;
  child->call = "braid_split";
  st = braid__bootstrap_split(c, child);
  if (!st) st = c->ops->split(c, child, members, n);
  child->call = NULL;
  if (st) {
    if (!atomic_load(&c->failed) && child->last_error[0]) braid__fail(c, st, "%s", child->last_error);
    braid__bootstrap_free(child, 0);
    comm_free(child);
    goto done;
  }
  BLOG_DEBUG(BRAID_SUB_INIT, c->rank, "split color %u key %u: rank %d of %d", color, key, newrank, n);
  *out = child;
done:
  free(all);
  free(ents);
  free(members);
  return finish(c, st);
}

/* ---------------------------------------------------------------- CUDA stream hooks */

bool braid_has_stream_sync(const braid_comm *c) { return c && c->ops->stream; }

static braid_status stream_enter(braid_comm *c, const char *call) {
  braid_status st = enter(c, call);
  if (st) return st;
  if (!c->ops->stream)
    return leave(c, braid__fail(c, BRAID_ERR_UNSUPPORTED, "backend %s has no communication stream", c->ops->name));
  return BRAID_OK;
}

braid_status braid_event_create(braid_comm *c, uint64_t *event) {
  braid_status st = stream_enter(c, "braid_event_create");
  if (st) return st;
  if (!event) return leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG, "event is NULL"));
  return finish(c, c->ops->stream->event_create(c, event));
}

braid_status braid_event_destroy(braid_comm *c, uint64_t event) {
  braid_status st = stream_enter(c, "braid_event_destroy");
  if (st) return st;
  return finish(c, c->ops->stream->event_destroy(c, event));
}

braid_status braid_event_record_on_comm_stream(braid_comm *c, uint64_t event) {
  braid_status st = stream_enter(c, "braid_event_record_on_comm_stream");
  if (st) return st;
  return finish(c, c->ops->stream->event_record_on_comm_stream(c, event));
}

braid_status braid_event_record_on_stream(braid_comm *c, uint64_t event, uint64_t stream) {
  braid_status st = stream_enter(c, "braid_event_record_on_stream");
  if (st) return st;
  return finish(c, c->ops->stream->event_record_on_stream(c, event, stream));
}

braid_status braid_comm_stream_wait_event(braid_comm *c, uint64_t event) {
  braid_status st = stream_enter(c, "braid_comm_stream_wait_event");
  if (st) return st;
  return finish(c, c->ops->stream->comm_stream_wait_event(c, event));
}

braid_status braid_stream_wait_event(braid_comm *c, uint64_t stream, uint64_t event) {
  braid_status st = stream_enter(c, "braid_stream_wait_event");
  if (st) return st;
  return finish(c, c->ops->stream->stream_wait_event(c, stream, event));
}

braid_status braid_sync_comm_stream(braid_comm *c) {
  braid_status st = stream_enter(c, "braid_sync_comm_stream");
  if (st) return st;
  return finish(c, c->ops->stream->sync_comm_stream(c));
}
