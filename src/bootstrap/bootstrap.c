/* World bootstrap over the rendezvous store, split namespaces, and the
   data-plane listener (see bootstrap.h). */
#include "bootstrap/bootstrap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/log.h"
#include "core/params.h"
#include "core/status.h"
#include "os/sock.h"
#include "os/time.h"

#define MISSING_LISTED 16 /* missing ranks named in a timeout message before "and N more" */
#define WAIT_BATCH 4096   /* keys per store wait request */


static void hostport(const char *host, int port, char *out, size_t len) {
  if (strchr(host, ':'))
    snprintf(out, len, "[%s]:%d", host, port);
  else
    snprintf(out, len, "%s:%d", host, port);
}

static const uint8_t *token_of(const braid__launch_env *e, size_t *len) {
  *len = e->has_token ? sizeof e->token : 0;
  return e->has_token ? e->token : NULL;
}

/*
 * Incarnations. braid_init may run again after braid_destroy; the keys of
 * the earlier world (registrations, goodbyes, failures, backend keys) may
 * still be in the store, so each world of a job gets a namespace of its own.
 * Every rank counts the worlds it bootstraps per store address and job
 * namespace; ranks that call braid_init equally often agree on the count
 * without talking, and it becomes part of the key prefix. A process keeps the
 * count for its lifetime (a forked child inherits it).
 */
typedef struct incarnation {
  struct incarnation *next;
  unsigned next_n;
  char key[]; /* "<host:port> <job prefix>" */
} incarnation;

static pthread_mutex_t inc_lock = PTHREAD_MUTEX_INITIALIZER;
static incarnation *incs;

/* This world's incarnation of (store, job prefix): 0, 1, 2, ... */
static unsigned take_incarnation(const char *where, const char *job_prefix) {
  char key[BRAID__ENV_HOST_MAX + 16 + BRAID__STORE_MAX_KEY / 2 + 2];
  snprintf(key, sizeof key, "%s %s", where, job_prefix);
  pthread_mutex_lock(&inc_lock);
  incarnation *i = incs;
  while (i && strcmp(i->key, key)) i = i->next;
  if (!i && (i = malloc(sizeof *i + strlen(key) + 1))) {
    i->next = incs;
    i->next_n = 0;
    memcpy(i->key, key, strlen(key) + 1);
    incs = i;
  }
  /* Out of memory: incarnation 0 again, which a later registration reports
     as a clash rather than meeting the wrong world. */
  unsigned n = i ? i->next_n++ : 0;
  pthread_mutex_unlock(&inc_lock);
  return n;
}

struct braid__boot_shared {
  atomic_int refs;
  braid__store_server *srv; /* hosted here; NULL otherwise */
  int world_rank, world_size;
};

/* How long a goodbye waits for the store's reply: the destroy timeout, or
   its default where that is 0 (a failed communicator, a failed start), so
   that a store that stopped answering holds braid_destroy for a bounded time
   yet a slow one still hears the goodbye. */
static double goodbye_bound(double timeout_s) {
  if (timeout_s > 0) return timeout_s;
  double def = 0;
  char ignored[128];
  (void)braid__param_parse_seconds(BRAID_P_DESTROY_TIMEOUT, NULL, &def, ignored, sizeof ignored);
  return def;
}

/* Drops b's reference; the last one says goodbye (goodbye_timeout >= 0) and,
   when this process hosts the store, waits for the others' goodbyes first. */
static void release(braid__boot *b, double goodbye_timeout) {
  braid__boot_shared *sh = b->shared;
  if (sh && atomic_fetch_sub(&sh->refs, 1) == 1) {
    if (goodbye_timeout >= 0 && b->store && sh->world_size > 1) {
      char key[32];
      snprintf(key, sizeof key, "exit/%d", sh->world_rank);
      braid__store_set_op_deadline(b->store, braid__now() + goodbye_bound(goodbye_timeout));
      braid_status gs = braid__store_set_prefix(b->store, b->job_prefix);
      if (!gs) gs = braid__store_set(b->store, key, "1", 1);
      if (gs == BRAID_ERR_TIMEOUT)
        BLOG_WARN(BRAID_SUB_BOOT, sh->world_rank, "left without saying goodbye: %s", braid__store_error(b->store));
      else if (gs)
        BLOG_DEBUG(BRAID_SUB_BOOT, sh->world_rank, "could not say goodbye to the store: %s",
                   braid__store_error(b->store));
      if (sh->srv && goodbye_timeout > 0) {
        char(*names)[24] = malloc(sizeof *names * (size_t)sh->world_size);
        const char **keys = malloc(sizeof *keys * (size_t)sh->world_size);
        if (names && keys) {
          for (int r = 0; r < sh->world_size; r++) {
            snprintf(names[r], sizeof names[r], "exit/%d", r);
            keys[r] = names[r];
          }
          if (braid__store_wait(b->store, keys, sh->world_size, braid__deadline(goodbye_timeout), NULL) != BRAID_OK)
            BLOG_INFO(BRAID_SUB_BOOT, sh->world_rank,
                      "stopping the store after %g s although some ranks have not left", goodbye_timeout);
        }
        free(names);
        free(keys);
      }
    }
    if (b->store) braid__store_close(b->store);
    b->store = NULL;
    if (sh->srv) braid__store_server_stop(sh->srv);
    free(sh);
  }
  if (b->store) braid__store_close(b->store);
  free(b);
}

static void free_boot(braid__boot *b) {
  if (b) release(b, -1);
}

/* Host names go into keys: keep them to one path segment. */
static void key_safe(char *s) {
  for (; *s; s++)
    if (*s == '/' || (unsigned char)*s < 0x21 || (unsigned char)*s > 0x7e) *s = '_';
}

/* This host's name as keys and registrations carry it ("?" if unknown). */
static void this_host(char host[256]) {
  if (gethostname(host, 255) != 0) snprintf(host, 256, "?");
  host[255] = 0;
  key_safe(host);
}

/* "missing rank 2" / "missing ranks 1, 5, 7" / "... and 84 more". */
static void describe_missing(const int *present, int n, char *out, size_t len) {
  int missing = 0;
  for (int r = 0; r < n; r++) missing += !present[r];
  size_t o = (size_t)snprintf(out, len, "missing rank%s", missing == 1 ? "" : "s");
  int listed = 0;
  for (int r = 0; r < n && o < len; r++) {
    if (present[r]) continue;
    if (listed == MISSING_LISTED) {
      snprintf(out + o, len - o, " and %d more", missing - listed);
      return;
    }
    int k = snprintf(out + o, len - o, "%s %d", listed ? "," : "", r);
    if (k < 0) return;
    o += (size_t)k;
    listed++;
  }
}

static int read_start_failure(braid__boot *b, int *rank, int *status, char *text, size_t len);
static int read_any_failure(braid__boot *b, int *rank, int *status, char *text, size_t len);

/* How soon a wait of the rendezvous first looks for a rank's start failure. */
#define FAILURE_POLL_S 0.1
/* How long a rank whose start failed before it registered tries to reach
   the store to say why: the store is up by then in a job that started. */
#define EARLY_TELL_S 2.0

/* Waits for every rank/<r> key, in batches the store accepts; on timeout
   present[] says who joined (later batches checked without waiting). A rank that
   could not start and said so (braid__boot_say_start_failed, before it
   registered) ends the wait at its next look: BRAID_ERR_PEER_LOST, *told set, *origin
   that rank (-1: a rank whose own rank was unknown) and its status and sentence. */
static braid_status wait_all(braid__boot *b, int n, double deadline, int *present, int *told, int *origin,
                             int *ost, char *why, size_t whylen) {
  *told = 0;
  *origin = -1;
  char(*names)[24] = malloc(sizeof *names * (size_t)(n < WAIT_BATCH ? n : WAIT_BATCH));
  const char **keys = malloc(sizeof *keys * (size_t)(n < WAIT_BATCH ? n : WAIT_BATCH));
  if (!names || !keys) {
    free(names);
    free(keys);
    return BRAID_ERR_NO_MEMORY;
  }
  braid_status result = BRAID_OK;
  for (int base = 0; base < n; base += WAIT_BATCH) {
    int m = n - base < WAIT_BATCH ? n - base : WAIT_BATCH;
    for (int i = 0; i < m; i++) {
      snprintf(names[i], sizeof names[i], "rank/%d", base + i);
      keys[i] = names[i];
    }
    braid_status s;
    /* Each poll re-sends the batch's wait: the interval doubles up to a
       cap that grows with the world, so a large job's store is not flooded. */
    double poll = FAILURE_POLL_S, cap = n > 256 ? n / 256.0 : 1.0;
    for (;;) {
      /* After one timeout, later batches are only checked. */
      double until = result == BRAID_ERR_TIMEOUT ? braid__now() : braid__now() + poll;
      poll = poll * 2 < cap ? poll * 2 : cap;
      if (until > deadline) until = deadline;
      s = braid__store_wait(b->store, keys, m, until, present + base);
      if (s != BRAID_ERR_TIMEOUT || until >= deadline || result == BRAID_ERR_TIMEOUT) break;
      int r = -1, any = 0;
      if ((read_start_failure(b, &r, ost, why, whylen) || (any = read_any_failure(b, &r, ost, why, whylen))) &&
          r != b->rank) {
        if (any && r >= 0 && r < n) {
          /* It never says goodbye in this world's namespace, which it does
             not know: said for it, a hosting rank 0 does not wait for it. */
          char key[32];
          snprintf(key, sizeof key, "exit/%d", r);
          (void)braid__store_set(b->store, key, "1", 1);
        }
        *told = 1;
        *origin = r;
        s = BRAID_ERR_PEER_LOST;
        break;
      }
    }
    if (s == BRAID_OK) {
      for (int i = 0; i < m; i++) present[base + i] = 1;
    } else if (s == BRAID_ERR_TIMEOUT) {
      result = BRAID_ERR_TIMEOUT;
    } else {
      result = s;
      break;
    }
  }
  free(names);
  free(keys);
  return result;
}

static int loopback_only_hint(const braid__launch_env *e) {
  return !e->has_token && !braid__host_is_loopback(e->store_host);
}

/* Connects b to its store and sets b->prefix on it. Errors: one sentence in
   err, BRAID_ERR_BOOTSTRAP (or NO_MEMORY). */
static braid_status connect_store(braid__boot *b, const uint8_t *tok, size_t toklen, double deadline,
                                  const char *where, char *err, size_t errlen) {
  const braid__launch_env *env = &b->env;
  char why[512] = "";
  braid_status st =
      braid__store_connect(env->store_host, env->store_port, tok, toklen, deadline, &b->store, why, sizeof why);
  if (!st && (st = braid__store_set_prefix(b->store, b->prefix)))
    snprintf(why, sizeof why, "%s", braid__store_error(b->store));
  if (!st) {
    /* A store that takes connections but stops answering must not hold a
       start for the client's default op timeout: the requests of this start
       end by its deadline, and any later one without a bound of its own (the
       steps after the rendezvous, split children, which inherit it) waits at
       most the init timeout. */
    if (env->init_timeout_s > 0) braid__store_set_op_timeout(b->store, env->init_timeout_s);
    braid__store_set_op_deadline(b->store, deadline);
    return BRAID_OK;
  }
  /* When rank 0 hosts the store, nothing at all answering means rank 0 is the one missing. */
  int rank0_missing = st == BRAID_ERR_TIMEOUT && env->store_owner == BRAID__STORE_RANK0 && b->rank != 0;
  const char *hint = loopback_only_hint(env) ? "; without BRAID_TOKEN the store accepts loopback connections only" : "";
  if (st == BRAID_ERR_TIMEOUT) {
    /* The client's sentence says "could not reach the store at ... within";
       say it once, with the variables that gave the address, and keep its cause. */
    const char *cause = strstr(why, "(last error: ");
    return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "could not reach the store at %s (from %s) within %g s%s%s%s%s",
                       where, env->store_from, env->init_timeout_s, cause ? " " : "", cause ? cause : "",
                       rank0_missing ? "; rank 0 hosts that store and has not started it (missing rank 0)" : "", hint);
  }
  if (strstr(why, where)) /* the client's sentence names the store already */
    return braid__errf(st == BRAID_ERR_NO_MEMORY ? st : BRAID_ERR_BOOTSTRAP, err, errlen,
                       "could not connect to the store given by %s: %s%s", env->store_from, why, hint);
  return braid__errf(st == BRAID_ERR_NO_MEMORY ? st : BRAID_ERR_BOOTSTRAP, err, errlen,
                     "could not connect to the store at %s (from %s): %s%s", where, env->store_from,
                     why[0] ? why : braid_status_string(st), hint);
}

/* The world's start; early: this rank's start has failed already (early_why
   says why), and it only tells the others, when it can reach their store. */
static braid_status world_start(int rank, int size, const braid__launch_env *env, braid_status early,
                                const char *early_why, braid__boot **out, char *err, size_t errlen) {
  *out = NULL;
  if (err && errlen) err[0] = 0;
  braid__boot *b = calloc(1, sizeof *b);
  if (!b) return braid__errf(BRAID_ERR_NO_MEMORY, err, errlen, "out of memory for the bootstrap state");
  b->env = *env;
  b->rank = rank;
  b->size = size;
  b->local_rank = env->local_rank;
  b->local_size = env->local_size;
  b->init_timeout_s = env->init_timeout_s;
  char why[512];
  braid_status st = BRAID_OK;
  if (env->store_owner != BRAID__STORE_NONE && size == 1) {
    /* One rank meets no one: hosting or dialling a store would only add ways
       to fail (a busy port, an unreachable host) and delay. */
    char where[BRAID__ENV_HOST_MAX + 16];
    hostport(env->store_host, env->store_port, where, sizeof where);
    BLOG_INFO(BRAID_SUB_BOOT, rank, "world size 1: no rendezvous needed, so the store at %s (from %s) is not used",
              where, env->store_from);
    b->env.store_owner = BRAID__STORE_NONE;
  }
  if (early && b->env.store_owner == BRAID__STORE_NONE) { /* no one to tell */
    free_boot(b);
    return braid__errf(early, err, errlen, "%s", early_why);
  }
  if (b->env.store_owner == BRAID__STORE_NONE) {
    if (size > 1) {
      free_boot(b);
      return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen,
                  "world size %d needs a store address: set BRAID_STORE=host:port or start the job with braidrun",
                  size);
    }
    if (b->local_size < 0) b->local_rank = 0, b->local_size = 1;
    *out = b;
    return BRAID_OK;
  }

  b->shared = calloc(1, sizeof *b->shared);
  if (!b->shared) {
    free_boot(b);
    return braid__errf(BRAID_ERR_NO_MEMORY, err, errlen, "out of memory for the bootstrap state");
  }
  atomic_init(&b->shared->refs, 1);
  b->shared->world_rank = rank;
  b->shared->world_size = size;
  b->hosting = env->store_owner == BRAID__STORE_RANK0 && rank == 0;
  double t0 = braid__now();
  double deadline = braid__deadline(env->init_timeout_s);
  char where[BRAID__ENV_HOST_MAX + 16];
  hostport(env->store_host, env->store_port, where, sizeof where);
  size_t toklen;
  const uint8_t *tok = token_of(env, &toklen);
  /* Per job and world size: jobs that share a store (or reuse a port) never
     read each other's keys, and registration below catches a clash. A later
     world of the job in this process (braid_init after braid_destroy) adds
     its incarnation, counted per store and job: "w4.1/". */
  const char *job = env->job_id[0] ? env->job_id : "job";
  snprintf(b->job_prefix, sizeof b->job_prefix, "braid/%s/", job);
  unsigned inc = take_incarnation(where, b->job_prefix);
  /* Per job and incarnation whatever the size: where a rank that cannot
     read the world size (size 0 here) says why it cannot start. It has
     taken this incarnation too, so a later braid_init meets the others. */
  snprintf(b->any_prefix, sizeof b->any_prefix, "braid/%s/any.%u/", job, inc);
  if (size <= 0)
    snprintf(b->job_prefix, sizeof b->job_prefix, "%s", b->any_prefix);
  else if (inc > 0)
    snprintf(b->job_prefix, sizeof b->job_prefix, "braid/%s/w%d.%u/", job, size, inc);
  else
    snprintf(b->job_prefix, sizeof b->job_prefix, "braid/%s/w%d/", job, size);
  snprintf(b->prefix, sizeof b->prefix, "%s", b->job_prefix);

  if (early) {
    /* This rank will not register, so the others would wait for it until
       their deadline: when it can reach the store soon it tells them why,
       as a rank whose start fails after the rendezvous does. A rank that
       would host the store cannot (the others say rank 0 has not started
       it). Either way it has taken this world's incarnation, as the others
       did, so that a later braid_init meets them again. */
    char ignored[512];
    double soon = braid__now() + EARLY_TELL_S;
    if (!b->hosting &&
        !connect_store(b, tok, toklen, soon < deadline ? soon : deadline, where, ignored, sizeof ignored))
      braid__boot_say_start_failed(b, rank, (int)early, early_why);
    /* Its goodbye lets a hosting rank 0 stop the store without waiting for
       it; a rank that does not know its rank has none to say. */
    release(b, rank >= 0 ? 0 : -1);
    return braid__errf(early, err, errlen, "%s", early_why);
  }

  if (b->hosting) {
    /* With a token, a loopback address is bound as such, anything else on
       every interface. Without one the store listens on loopback only, and
       it is given the name: it resolves it as the ranks will and binds its
       addresses when all are loopback (a host name that /etc/hosts maps to
       127.0.1.1), else 127.0.0.1 and ::1, saying why. */
    const char *bind_host = !tok || braid__host_is_loopback(env->store_host) ? env->store_host : NULL;
    why[0] = 0;
    st = braid__store_server_start(bind_host, env->store_port, tok, toklen, &b->shared->srv, why, sizeof why);
    if (st) {
      free_boot(b);
      return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen,
                  "rank 0 could not host the store at %s (from %s): %s; if another job uses that port, choose "
                  "another with BRAID_STORE=host:port%s",
                  where, env->store_from, why[0] ? why : braid_status_string(st),
                  strstr(env->store_from, "MASTER") ? " or MASTER_PORT" : "");
    }
    BLOG_INFO(BRAID_SUB_BOOT, rank, "hosting the store at %s (%s)", where,
              tok ? "token required" : "loopback only, no token");
  }

  if ((st = connect_store(b, tok, toklen, deadline, where, err, errlen))) {
    free_boot(b);
    return st;
  }
  if (b->env.store_owner == BRAID__STORE_RANK0 && rank != 0 && inc > 0) {
    /* The store of the previous world, hosted by rank 0 too, may still be up
       for the last goodbyes, and this rank may have reached it instead of the
       one rank 0 starts now: the new world's rank 0 registers only in its new
       store, so a store that closes before rank 0's registration appears
       there was the old one, and the store is dialled again. Registering
       comes after, so nothing of this world is left in the old store. */
    for (;;) {
      void *v = NULL;
      size_t vlen = 0;
      st = braid__store_get(b->store, "rank/0", &v, &vlen, deadline);
      free(v);
      if (st == BRAID_ERR_TIMEOUT) break; /* the rendezvous below names the missing rank 0 */
      if (st != BRAID_ERR_PEER_LOST) break;
      BLOG_DEBUG(BRAID_SUB_BOOT, rank, "the store at %s closed before rank 0 registered (the previous world's); "
                 "dialling it again", where);
      braid__store_close(b->store);
      b->store = NULL;
      if ((st = connect_store(b, tok, toklen, deadline, where, err, errlen))) {
        free_boot(b);
        return st;
      }
    }
    if (st && st != BRAID_ERR_TIMEOUT) goto store_error;
  }

  char host[256];
  this_host(host);
  if (b->local_size < 0) {
    /* No launcher word on locality: count the ranks per host name. */
    char key[300];
    int64_t n = 0;
    snprintf(key, sizeof key, "host/%s", host);
    if ((st = braid__store_add(b->store, key, 1, &n))) goto store_error;
    b->local_rank = (int)(n - 1);
  }
  char rkey[32], val[400];
  snprintf(rkey, sizeof rkey, "rank/%d", rank);
  snprintf(val, sizeof val, "host=%s pid=%ld local_rank=%d", host, (long)getpid(), b->local_rank);
  int swapped = 0;
  void *cur = NULL;
  size_t curlen = 0;
  if ((st = braid__store_cas(b->store, rkey, NULL, 0, val, strlen(val), &swapped, &cur, &curlen))) goto store_error;
  if (!swapped) {
    char other[200] = "";
    if (cur) snprintf(other, sizeof other, "%.*s", (int)(curlen < 199 ? curlen : 199), (const char *)cur);
    free(cur);
    free_boot(b);
    return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen,
                "rank %d is already registered in the store at %s (%s): another job with the same store address "
                "and job id is running; give each job its own port or BRAID_JOB_ID",
                rank, where, other);
  }
  free(cur);

  int *present = calloc((size_t)size, sizeof *present);
  if (!present) {
    free_boot(b);
    return braid__errf(BRAID_ERR_NO_MEMORY, err, errlen, "out of memory for %d ranks' rendezvous", size);
  }
  int told = 0, origin = -1, ost = 0;
  st = wait_all(b, size, deadline, present, &told, &origin, &ost, why, sizeof why);
  if (st == BRAID_ERR_TIMEOUT && !told && !present[rank]) {
    /* This rank registered, so the store did not answer: no rank is missing. */
    free(present);
    goto store_error;
  }
  if (told) {
    free(present);
    /* Rank 0 keeps the store up until the others have read why. */
    release(b, BRAID__BOOT_FAILED_LINGER_S);
    if (origin < 0) /* its sentence says where it runs */
      return braid__errf(braid__boot_relayed_status(ost), err, errlen, "a rank could not start %s", why);
    return braid__errf(braid__boot_relayed_status(ost), err, errlen, "rank %d could not start: %s", origin, why);
  }
  if (st == BRAID_ERR_TIMEOUT) {
    int joined = 0;
    for (int r = 0; r < size; r++) joined += present[r];
    char missing[256];
    describe_missing(present, size, missing, sizeof missing);
    free(present);
    free_boot(b);
    char again[160] = "";
    if (inc > 0)
      snprintf(again, sizeof again,
               " (this process is at braid_init number %u of the job; ranks that called braid_init a different "
               "number of times do not meet)",
               inc + 1);
    return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen, "rendezvous timed out after %g s: %d of %d ranks joined; %s%s%s",
                env->init_timeout_s, joined, size, missing,
                loopback_only_hint(env) ? " (without BRAID_TOKEN the store accepts loopback connections only)" : "",
                again);
  }
  free(present);
  if (st) goto store_error;

  if (b->local_size < 0) {
    char key[300];
    int64_t n = 0;
    snprintf(key, sizeof key, "host/%s", host);
    if ((st = braid__store_add(b->store, key, 0, &n))) goto store_error;
    b->local_size = (int)n;
  }
  BLOG_INFO(BRAID_SUB_BOOT, rank, "rendezvous of %d ranks at %s done in %.3f s: local rank %d of %d, keys under %s",
            size, where, braid__now() - t0, b->local_rank, b->local_size, b->prefix);
  braid__store_set_op_deadline(b->store, INFINITY); /* later steps: the op timeout each */
  *out = b;
  return BRAID_OK;

store_error:
  snprintf(why, sizeof why, "%s", b->store ? braid__store_error(b->store) : "");
  double bound = b->store ? braid__store_op_timeout(b->store) : 0;
  free_boot(b);
  if (st == BRAID_ERR_TIMEOUT)
    return braid__errf(BRAID_ERR_BOOTSTRAP, err, errlen,
                       "the store at %s (from %s) did not answer within %g s during the rendezvous", where,
                       env->store_from, bound);
  return braid__errf(st == BRAID_ERR_NO_MEMORY ? st : BRAID_ERR_BOOTSTRAP, err, errlen,
              "lost the store at %s during rendezvous: %s", where, why[0] ? why : braid_status_string(st));
}

/* A listener's failure on BRAID_ADDR names the variable. */
static void name_addr(const char *addr, char *err, size_t errlen) {
  char why[384];
  snprintf(why, sizeof why, "%s", err);
  snprintf(err, errlen, "BRAID_ADDR=\"%s\": %s", addr, why);
}

braid_status braid__bootstrap_world(int rank, int size, const braid__launch_env *env, braid__boot **out, char *err,
                                    size_t errlen) {
  /* A wrong interface name, or an address that is not this host's, fails
     now, not when a backend first listens (the others are told). */
  braid_status early = BRAID_OK;
  char early_why[512] = "";
  if (env->ifname[0]) {
    char a[64];
    early = braid__iface_addr(env->ifname, a, sizeof a, early_why, sizeof early_why);
  } else if (env->addr[0]) {
    int fd = -1, port = 0;
    early = braid__listen_range(env->addr, 0, 0, 0, 1, &fd, &port, early_why, sizeof early_why);
    if (!early) close(fd);
    else name_addr(env->addr, early_why, sizeof early_why);
    if (early == BRAID_ERR_BOOTSTRAP) early = BRAID_ERR_INVALID_ARG; /* not this host's: a wrong setting */
  }
  return world_start(rank, size, env, early, early_why, out, err, errlen);
}

void braid__bootstrap_tell_failed(int rank, int size, const braid__launch_env *env, braid_status st,
                                  const char *why) {
  char host[256], text[640];
  if (rank < 0) {
    this_host(host);
    snprintf(text, sizeof text, "(its rank is unknown; host %s, pid %ld): %s", host, (long)getpid(), why);
  } else {
    snprintf(text, sizeof text, "%s", why);
  }
  braid__boot *b = NULL;
  char ignored[512];
  (void)world_start(rank, size, env, st ? st : BRAID_ERR_BOOTSTRAP, text, &b, ignored, sizeof ignored);
}

braid_status braid__bootstrap_split(const braid__boot *parent, int rank, int size, uint64_t child_id,
                                    braid__boot **out, char *err, size_t errlen) {
  *out = NULL;
  if (err && errlen) err[0] = 0;
  if (!parent) return BRAID_OK;
  braid__boot *b = calloc(1, sizeof *b);
  if (!b) return braid__errf(BRAID_ERR_NO_MEMORY, err, errlen, "out of memory for the bootstrap state");
  b->env = parent->env;
  b->rank = rank;
  b->size = size;
  b->local_rank = parent->local_rank;
  b->local_size = parent->local_size;
  b->init_timeout_s = parent->init_timeout_s;
  snprintf(b->job_prefix, sizeof b->job_prefix, "%s", parent->job_prefix);
  /* Child ids are unique within a job, so the namespace stays flat. */
  snprintf(b->prefix, sizeof b->prefix, "%sc%llx/", parent->job_prefix, (unsigned long long)child_id);
  if (parent->shared) { /* the hosted store outlives the world while children remain */
    atomic_fetch_add(&parent->shared->refs, 1);
    b->shared = parent->shared;
    b->hosting = parent->hosting;
  }
  if (parent->store) {
    char why[512] = "";
    braid_status st =
        braid__store_clone(parent->store, braid__deadline(parent->init_timeout_s), &b->store, why, sizeof why);
    if (!st) st = braid__store_set_prefix(b->store, b->prefix);
    if (st) {
      if (b->store && !why[0]) snprintf(why, sizeof why, "%s", braid__store_error(b->store));
      free_boot(b);
      char where[BRAID__ENV_HOST_MAX + 16];
      hostport(parent->env.store_host, parent->env.store_port, where, sizeof where);
      /* Name the store once: the client's sentence usually does already. */
      int named = strstr(why, where) != NULL;
      return braid__errf(st == BRAID_ERR_NO_MEMORY ? st : BRAID_ERR_BOOTSTRAP, err, errlen,
                  "could not open a store connection%s%s for the new communicator: %s", named ? "" : " to ",
                  named ? "" : where, why[0] ? why : braid_status_string(st));
    }
  }
  *out = b;
  return BRAID_OK;
}

void braid__bootstrap_free(braid__boot *b, double timeout_s) {
  if (b) release(b, timeout_s);
}

/* ---------------------------------------------------------------- failure spread */

braid_status braid__boot_set(braid__boot *b, const char *key, const void *val, size_t len) {
  if (!b || !b->store) return BRAID_OK; /* one rank: no one to tell */
  return braid__store_set(b->store, key, val, len);
}

int braid__boot_peek(braid__boot *b, const char *key, void **val, size_t *len, double reply_timeout_s) {
  *val = NULL;
  *len = 0;
  if (!b || !b->store) return 0; /* one rank: no one else can have set it */
  int found = 0;
  double deadline = braid__now() + (reply_timeout_s > 0 ? reply_timeout_s : 0);
  if (braid__store_try_get(b->store, key, val, len, &found, deadline) != BRAID_OK) return -1;
  return found;
}

/* The world's namespace for one request of a child's boot: 1 when the
   prefix was switched (switch back with to_own), 0 when it already was the
   world's, -1 when the switch failed. */
static int to_world(braid__boot *b) {
  if (!strcmp(b->prefix, b->job_prefix)) return 0;
  return braid__store_set_prefix(b->store, b->job_prefix) ? -1 : 1;
}

static void to_own(braid__boot *b, int switched) {
  if (switched > 0) braid__store_set_prefix(b->store, b->prefix);
}

#define START_FAILED_KEY "start/failed"

braid_status braid__boot_relayed_status(int status) {
  return status == BRAID_ERR_INVALID_ARG || status == BRAID_ERR_UNSUPPORTED ? (braid_status)status
                                                                             : BRAID_ERR_PEER_LOST;
}

void braid__boot_say_start_failed(braid__boot *b, int rank, int status, const char *text) {
  if (!b || !b->store) return;
  char val[640];
  int n = snprintf(val, sizeof val, "%d %d %s", status, rank, text);
  size_t len = n < 0 ? 0 : (size_t)n < sizeof val ? (size_t)n : sizeof val - 1;
  int swapped = 0;
  void *cur = NULL;
  size_t curlen = 0;
  /* The first cause stays: later ones are mostly its consequences. */
  (void)braid__store_cas(b->store, START_FAILED_KEY, NULL, 0, val, len, &swapped, &cur, &curlen);
  free(cur);
}

/* The start failure recorded in the store's current namespace. */
static int read_start_failure(braid__boot *b, int *rank, int *status, char *text, size_t len) {
  void *v = NULL;
  size_t vlen = 0;
  int found = 0, got = 0;
  if (braid__store_try_get(b->store, START_FAILED_KEY, &v, &vlen, &found, braid__now() + 1.0) == BRAID_OK && found) {
    char buf[640];
    snprintf(buf, sizeof buf, "%.*s", (int)(vlen < sizeof buf ? vlen : sizeof buf - 1), (const char *)v);
    int off = 0;
    if (sscanf(buf, "%d %d %n", status, rank, &off) == 2 && off > 0) {
      snprintf(text, len, "%s", buf + off);
      got = 1;
    }
  }
  free(v);
  return got;
}

/* The start failure of a rank that did not know the world size. */
static int read_any_failure(braid__boot *b, int *rank, int *status, char *text, size_t len) {
  if (!b->any_prefix[0] || braid__store_set_prefix(b->store, b->any_prefix) != BRAID_OK) return 0;
  int got = read_start_failure(b, rank, status, text, len);
  braid__store_set_prefix(b->store, b->prefix);
  return got;
}

int braid__boot_start_failure(braid__boot *b, int *rank, int *status, char *text, size_t len) {
  if (!b || !b->store) return 0;
  if (read_start_failure(b, rank, status, text, len)) return 1;
  /* A backend's part starts within the world's init: the world's failure
     ends its start too. */
  int sw = to_world(b);
  if (sw <= 0) return 0;
  int got = read_start_failure(b, rank, status, text, len);
  to_own(b, sw);
  return got;
}

long braid__boot_world_pid(braid__boot *b, int w) {
  if (!b || !b->store) return 0;
  int sw = to_world(b);
  if (sw < 0) return 0;
  char key[32];
  snprintf(key, sizeof key, "rank/%d", w);
  void *v = NULL;
  size_t len = 0;
  int found = 0;
  long pid = 0;
  if (braid__store_try_get(b->store, key, &v, &len, &found, braid__now() + 1.0) == BRAID_OK && found) {
    char buf[400], host[256], theirs[256] = "";
    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), (const char *)v);
    this_host(host);
    const char *p = strstr(buf, "pid=");
    /* A pid means something only on the host that gave it. */
    if (sscanf(buf, "host=%255s", theirs) == 1 && !strcmp(theirs, host)) pid = p ? strtol(p + 4, NULL, 10) : 0;
  }
  free(v);
  to_own(b, sw);
  return pid > 0 ? pid : 0;
}

/* ---------------------------------------------------------------- data-plane listener */

braid_status braid__iface_addr(const char *ifname, char *addr, size_t addrlen, char *err, size_t errlen) {
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) {
    snprintf(err, errlen, "BRAID_IFNAME=\"%s\": cannot list the network interfaces: %s", ifname, strerror(errno));
    return BRAID_ERR_SYSTEM;
  }
  int found = 0, have4 = 0, have6 = 0;
  char a4[INET6_ADDRSTRLEN] = "", a6[INET6_ADDRSTRLEN] = "";
  for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_name || strcmp(i->ifa_name, ifname)) continue;
    found = 1;
    if (!i->ifa_addr) continue;
    if (i->ifa_addr->sa_family == AF_INET && !have4) {
      inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, a4, sizeof a4);
      have4 = 1;
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const struct in6_addr *x = &((struct sockaddr_in6 *)(void *)i->ifa_addr)->sin6_addr;
      /* Link-local addresses need a scope id peers cannot use as is. */
      if (IN6_IS_ADDR_LINKLOCAL(x) || have6) continue;
      inet_ntop(AF_INET6, x, a6, sizeof a6);
      have6 = 1;
    }
  }
  if (!found) {
    /* List the names that do exist, once each. */
    char names[512] = "";
    size_t o = 0;
    for (struct ifaddrs *i = ifs; i && o < sizeof names; i = i->ifa_next) {
      if (!i->ifa_name) continue;
      int dup = 0;
      for (struct ifaddrs *j = ifs; j != i; j = j->ifa_next)
        if (j->ifa_name && !strcmp(j->ifa_name, i->ifa_name)) dup = 1;
      if (dup) continue;
      int k = snprintf(names + o, sizeof names - o, "%s%s", o ? ", " : "", i->ifa_name);
      if (k < 0) break;
      o += (size_t)k;
    }
    freeifaddrs(ifs);
    snprintf(err, errlen, "BRAID_IFNAME=\"%s\" names no network interface; interfaces here: %s", ifname,
             names[0] ? names : "(none)");
    return BRAID_ERR_INVALID_ARG;
  }
  freeifaddrs(ifs);
  if (!have4 && !have6) {
    snprintf(err, errlen, "BRAID_IFNAME=\"%s\" has no IPv4 or global IPv6 address", ifname);
    return BRAID_ERR_BOOTSTRAP;
  }
  snprintf(addr, addrlen, "%s", have4 ? a4 : a6);
  return BRAID_OK;
}

/* Local address of the route toward host:port (a UDP connect sends nothing). */
static int route_addr(const char *host, int port, char *addr, size_t addrlen, char *why, size_t whylen) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  int g = getaddrinfo(host, ps, &hints, &res);
  if (g) {
    snprintf(why, whylen, "cannot resolve %s: %s", host, gai_strerror(g));
    return -1;
  }
  int rc = -1;
  for (struct addrinfo *ai = res; ai && rc; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 && getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
      const void *src = ss.ss_family == AF_INET ? (const void *)&((struct sockaddr_in *)&ss)->sin_addr
                                                : (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr;
      if (inet_ntop(ss.ss_family, src, addr, (socklen_t)addrlen)) rc = 0;
    } else {
      snprintf(why, whylen, "no route to %s: %s", host, strerror(errno));
    }
    close(fd);
  }
  freeaddrinfo(res);
  return rc;
}

braid_status braid__listen_range(const char *bind_addr, int lo, int hi, int start_offset, int backlog, int *fd_out,
                                 int *port_out, char *err, size_t errlen) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  socklen_t sl;
  const char *shown = bind_addr ? bind_addr : "0.0.0.0";
  struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
  if (!bind_addr || inet_pton(AF_INET, bind_addr, &s4->sin_addr) == 1) {
    s4->sin_family = AF_INET;
    if (!bind_addr) s4->sin_addr.s_addr = htonl(INADDR_ANY);
    sl = sizeof *s4;
  } else if (inet_pton(AF_INET6, bind_addr, &s6->sin6_addr) == 1) {
    s6->sin6_family = AF_INET6;
    sl = sizeof *s6;
  } else {
    snprintf(err, errlen, "cannot listen on \"%s\": not a numeric IPv4 or IPv6 address", bind_addr);
    return BRAID_ERR_INVALID_ARG;
  }
  unsigned flags = BRAID__SOCK_REUSEADDR;
  if (ss.ss_family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED(&s6->sin6_addr))
    flags |= BRAID__SOCK_DUAL_STACK; /* "::" serves IPv4 too */
  int ranged = lo > 0;
  int fd = -1;
  int e = braid__sock_listen_range(&ss, sl, lo, hi, start_offset, backlog, flags, &fd);
  if (e == 0) {
    int port = braid__sock_local_port(fd);
    if (port < 0) {
      snprintf(err, errlen, "getsockname on the listener at %s: %s", shown, strerror(errno));
      close(fd);
      return BRAID_ERR_SYSTEM;
    }
    *port_out = port;
    *fd_out = fd;
    return BRAID_OK;
  }
  if (e < 0) {
    snprintf(err, errlen, "cannot create a socket to listen on %s: %s", shown, strerror(-e));
    return BRAID_ERR_SYSTEM;
  }
  if (e == EADDRINUSE && ranged) {
    snprintf(err, errlen, "no free port in BRAID_PORT_RANGE=%d-%d on %s: all %d ports are in use", lo, hi, shown,
             hi - lo + 1);
    return BRAID_ERR_BOOTSTRAP;
  }
  if (ranged)
    snprintf(err, errlen, "cannot listen on %s port %d (BRAID_PORT_RANGE=%d-%d): %s", shown,
             braid__sock_addr_port((struct sockaddr *)&ss), lo, hi, strerror(e));
  else
    snprintf(err, errlen, "cannot listen on %s: %s", shown, strerror(e));
  return e == EADDRNOTAVAIL ? BRAID_ERR_BOOTSTRAP : BRAID_ERR_SYSTEM;
}

braid_status braid__listen_dataplane(const braid__boot *b, int backlog, braid__listener *out, char *err,
                                     size_t errlen) {
  out->fd = -1;
  out->port = 0;
  out->addr[0] = 0;
  const braid__launch_env *e = &b->env;
  const char *bind_addr = NULL;
  braid_status st;
  if (e->addr[0]) {
    snprintf(out->addr, sizeof out->addr, "%s", e->addr);
    bind_addr = out->addr;
  } else if (e->ifname[0]) {
    if ((st = braid__iface_addr(e->ifname, out->addr, sizeof out->addr, err, errlen))) return st;
    bind_addr = out->addr;
  } else if (b->store) {
    char why[256] = "";
    if (route_addr(e->store_host, e->store_port, out->addr, sizeof out->addr, why, sizeof why)) {
      snprintf(err, errlen, "cannot tell which local address reaches the store host %s (%s); set BRAID_ADDR or "
                            "BRAID_IFNAME", e->store_host, why);
      return BRAID_ERR_BOOTSTRAP;
    }
    if (braid__host_is_loopback(out->addr))
      bind_addr = out->addr; /* a single-host job: nothing outside needs to reach us */
    else
      bind_addr = strchr(out->addr, ':') ? "::" : NULL;
  } else {
    snprintf(out->addr, sizeof out->addr, "127.0.0.1");
    bind_addr = out->addr;
  }
  int offset = b->local_rank >= 0 ? b->local_rank : b->rank;
  st = braid__listen_range(bind_addr, e->port_lo, e->port_hi, offset, backlog, &out->fd, &out->port, err, errlen);
  if (st && e->addr[0]) name_addr(e->addr, err, errlen);
  return st;
}
