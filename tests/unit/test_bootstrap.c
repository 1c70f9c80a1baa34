/* The bootstrap layer on forked processes: rank 0 hosting the store, an
   external store, a rank that never starts (the timeout message), two jobs on
   one store, a busy store port, an unreachable store, split namespaces, and a
   world of one, which needs no store at all. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "core/comm.h"
#include "harness.h"
#include "os/sock.h"
#include "os/time.h"

/* A communicator shell: what bootstrap needs (rank, size, id, error state). */
static braid_comm *shell(int rank, int size, uint64_t id) {
  braid_comm *c = calloc(1, sizeof *c);
  if (!c) abort();
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->err_lock, NULL);
  c->rank = rank;
  c->size = size;
  c->id = id;
  c->call = "braid_init";
  return c;
}

static void shell_free(braid_comm *c) {
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->err_lock);
  free(c);
}

static const char *fake_get(void *ctx, const char *name) {
  size_t n = strlen(name);
  for (char **kv = ctx; *kv; kv++)
    if (!strncmp(*kv, name, n) && (*kv)[n] == '=') return *kv + n + 1;
  return NULL;
}

/* One job's settings, turned into a fake environment per rank. */
typedef struct job {
  int size;
  int port;
  const char *token_hex; /* NULL: none */
  const char *job_id;    /* NULL: none */
  int external;
  const char *init_timeout;
  const char *ifname;
  int skip_rank;         /* this rank never starts (-1: none) */
  int rank_offset;       /* harness rank r runs as rank r + offset (two jobs in one run) */
  const char *expect;    /* NULL: rendezvous must succeed; else the error must contain it */
} job;

static braid_status boot_rank(const job *j, int rank, braid_comm **cout) {
  char v[10][128];
  char *kv[11];
  int n = 0;
  snprintf(v[n], sizeof v[n], "BRAID_RANK=%d", rank), n++;
  snprintf(v[n], sizeof v[n], "BRAID_WORLD_SIZE=%d", j->size), n++;
  snprintf(v[n], sizeof v[n], "BRAID_STORE=127.0.0.1:%d", j->port), n++;
  if (j->token_hex) snprintf(v[n], sizeof v[n], "BRAID_TOKEN=%s", j->token_hex), n++;
  if (j->job_id) snprintf(v[n], sizeof v[n], "BRAID_JOB_ID=%s", j->job_id), n++;
  if (j->external) snprintf(v[n], sizeof v[n], "BRAID_STORE_EXTERNAL=1"), n++;
  snprintf(v[n], sizeof v[n], "BRAID_INIT_TIMEOUT=%s", j->init_timeout ? j->init_timeout : "20"), n++;
  if (j->ifname) snprintf(v[n], sizeof v[n], "BRAID_IFNAME=%s", j->ifname), n++;
  for (int i = 0; i < n; i++) kv[i] = v[i];
  kv[n] = NULL;
  braid__launch_env e;
  char err[512];
  *cout = NULL;
  braid_status st = braid__env_detect(fake_get, kv, NULL, BRAID__ENV_REQUIRE_STORE, &e, err, sizeof err);
  if (st) {
    fprintf(stderr, "detect: %s\n", err);
    return st;
  }
  braid_comm *c = shell(rank, j->size, 1);
  st = braid__bootstrap_world(c, &e, &c->boot);
  *cout = c;
  return st;
}

/* Every rank: rendezvous, check the layout, exchange a key, say goodbye. */
static int body_join(braid_comm *unused, int hrank, int hsize, void *arg) {
  (void)unused, (void)hsize;
  const job *j = arg;
  int rank = hrank - j->rank_offset;
  if (rank < 0 || rank >= j->size) {
    j++; /* the second job of a two-job run */
    rank = hrank - j->rank_offset;
  }
  if (rank == j->skip_rank) return 0;
  braid_comm *c = NULL;
  double t0 = braid__now();
  braid_status st = boot_rank(j, rank, &c);
  BT_CHECK(c != NULL, "rank %d: detection failed", rank);
  if (j->expect) {
    BT_CHECK(st == BRAID_ERR_BOOTSTRAP, "rank %d: got %s, expected BOOTSTRAP", rank, braid_status_string(st));
    BT_CHECK(strstr(c->last_error, j->expect), "rank %d: \"%s\" lacks \"%s\"", rank, c->last_error, j->expect);
    BT_CHECK(!strncmp(c->last_error, "braid_init: ", 12), "message names the call: %s", c->last_error);
    double limit = j->init_timeout ? atof(j->init_timeout) + 2.5 : 5.0;
    BT_CHECK(braid__now() - t0 < limit, "failed after %.2f s", braid__now() - t0);
    BT_CHECK(c->boot == NULL, "no boot state after a failure");
    shell_free(c);
    return 0;
  }
  BT_CHECK(st == BRAID_OK, "rank %d: bootstrap failed: %s", rank, c->last_error);
  braid__boot *b = c->boot;
  BT_CHECK(b && b->store && b->rank == rank && b->size == j->size, "boot state");
  BT_CHECK(b->local_size == j->size && b->local_rank >= 0 && b->local_rank < j->size, "derived local %d of %d",
           b->local_rank, b->local_size);
  BT_CHECK(b->hosting == (rank == 0 && !j->external), "rank 0 hosts unless external");

  /* Everyone publishes, everyone reads everyone: the namespace is shared by the job. */
  char key[32], want[32];
  snprintf(key, sizeof key, "hello/%d", rank);
  snprintf(want, sizeof want, "from %d", rank);
  BT_CHECK(braid__store_set(b->store, key, want, strlen(want)) == BRAID_OK, "set");
  for (int r = 0; r < j->size; r++) {
    void *val = NULL;
    size_t len = 0;
    snprintf(key, sizeof key, "hello/%d", r);
    snprintf(want, sizeof want, "from %d", r);
    BT_CHECK(braid__store_get(b->store, key, &val, &len, braid__deadline(10)) == BRAID_OK, "get %s: %s", key,
             braid__store_error(b->store));
    BT_CHECK(len == strlen(want) && !memcmp(val, want, len), "value of %s", key);
    free(val);
  }

  /* A split child: same store, its own namespace. Ranks 0..k form color 0. */
  braid_comm *child = shell(rank % 2, (j->size + 1 - rank % 2) / 2, 0x1234 + (uint64_t)(rank % 2));
  child->call = "braid_split";
  BT_CHECK(braid__bootstrap_split(c, child) == BRAID_OK, "split: %s", child->last_error);
  BT_CHECK(child->boot && child->boot->store && child->boot->store != b->store, "child has its own connection");
  BT_CHECK(strstr(child->boot->prefix, b->job_prefix) == child->boot->prefix &&
               strcmp(child->boot->prefix, b->prefix),
           "child prefix %s under %s", child->boot->prefix, b->job_prefix);
  void *val = NULL;
  size_t len = 0;
  /* The parent's keys are not visible under the child's prefix. */
  BT_CHECK(braid__store_get(child->boot->store, "hello/0", &val, &len, braid__now()) == BRAID_ERR_TIMEOUT,
           "child sees parent keys");

  /* The world goes first; the child still reaches the store (rank 0 keeps hosting it). */
  braid__bootstrap_free(c, 10.0);
  shell_free(c);
  snprintf(key, sizeof key, "after/%d", rank);
  BT_CHECK(braid__store_set(child->boot->store, key, "x", 1) == BRAID_OK, "child store after the world: %s",
           braid__store_error(child->boot->store));
  BT_CHECK(braid__store_get(child->boot->store, key, &val, &len, braid__deadline(10)) == BRAID_OK, "get");
  free(val);
  /* The last communicator of the job here: rank 0 waits for everyone's goodbye. */
  braid__bootstrap_free(child, 10.0);
  shell_free(child);
  return 0;
}

static int free_port(void) {
  int fd, port;
  char err[256];
  if (braid__listen_range("127.0.0.1", 0, 0, 0, 1, &fd, &port, err, sizeof err)) return -1;
  close(fd);
  return port;
}

static int run(job *j, int nranks, double timeout) {
  bt_run_opts o = {NULL, nranks, timeout, NULL, -1};
  return bt_run_ranks_ex(&o, body_join, j, NULL);
}

static int test_rank0_hosts(void) {
  job j = {4, free_port(), "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", NULL, 0, NULL, NULL,
           -1, 0, NULL};
  BT_CHECK(j.port > 0, "port");
  BT_CHECK(run(&j, 4, 30) == 0, "4 ranks with rank 0 hosting");
  /* No token: loopback-only store, fine on one host. */
  j.token_hex = NULL;
  j.port = free_port();
  j.size = 3;
  BT_CHECK(run(&j, 3, 30) == 0, "3 ranks, no token");
  return 0;
}

static int test_external_store(void) {
  bt_store s;
  BT_CHECK(bt_store_start(&s) == 0, "store");
  job j = {5, s.port, s.token_hex, s.job_id, 1, NULL, NULL, -1, 0, NULL};
  int rc = run(&j, 5, 30);
  bt_store_stop(&s);
  BT_CHECK(rc == 0, "5 ranks on an external store");
  return 0;
}

static int test_missing_rank_times_out(void) {
  bt_store s;
  BT_CHECK(bt_store_start(&s) == 0, "store");
  job j = {3, s.port, s.token_hex, s.job_id, 1, "1", NULL, 1, 0,
           "rendezvous timed out after 1 s: 2 of 3 ranks joined; missing rank 1"};
  int rc = run(&j, 3, 20);
  /* Many missing: listed up to 16, then counted. */
  job k = {20, s.port, s.token_hex, "another", 1, "0.5", NULL, -1, 0,
           "rendezvous timed out after 0.5 s: 1 of 20 ranks joined; missing ranks 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, "
           "11, 12, 13, 14, 15, 16 and 3 more"};
  int rc2 = run(&k, 1, 20);
  bt_store_stop(&s);
  BT_CHECK(rc == 0 && rc2 == 0, "timeouts reported");
  return 0;
}

/* Two jobs of the same size on one store at once: distinct job ids keep them apart. */
static int test_two_jobs_one_store(void) {
  bt_store s;
  BT_CHECK(bt_store_start(&s) == 0, "store");
  job j[2] = {{2, s.port, s.token_hex, "jobA", 1, NULL, NULL, -1, 0, NULL},
              {2, s.port, s.token_hex, "jobB", 1, NULL, NULL, -1, 2, NULL}};
  int rc = run(j, 4, 30);
  /* Same job id twice: the second registration of a rank is refused. */
  job d = {2, s.port, s.token_hex, "jobA", 1, "1", NULL, -1, 0, "rank 0 is already registered"};
  int rc2 = run(&d, 1, 20);
  bt_store_stop(&s);
  BT_CHECK(rc == 0, "two jobs");
  BT_CHECK(rc2 == 0, "duplicate registration");
  return 0;
}

static int test_store_port_busy(void) {
  int fd, port;
  char err[256];
  BT_CHECK(braid__listen_range("127.0.0.1", 0, 0, 0, 1, &fd, &port, err, sizeof err) == BRAID_OK, "%s", err);
  char want[160];
  snprintf(want, sizeof want, "rank 0 could not host the store at 127.0.0.1:%d (from BRAID_STORE)", port);
  job j = {2, port, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", NULL, 0, "1", NULL, -1, 0,
           want};
  int rc = run(&j, 1, 20);
  close(fd);
  BT_CHECK(rc == 0, "busy port");
  job k = j;
  k.expect = "choose another with BRAID_STORE=host:port";
  BT_CHECK(braid__listen_range("127.0.0.1", port, port, 0, 1, &fd, &port, err, sizeof err) == BRAID_OK, "%s", err);
  rc = run(&k, 1, 20);
  close(fd);
  BT_CHECK(rc == 0, "busy port hint");
  return 0;
}

static int test_store_unreachable(void) {
  char want[160];
  int port = free_port();
  snprintf(want, sizeof want, "could not reach the store at 127.0.0.1:%d (from BRAID_STORE) within 1 s", port);
  /* Rank 1 alone: rank 0, who would host, never starts. */
  job j = {2, port, NULL, NULL, 0, "1", NULL, -1, -1, want};
  BT_CHECK(run(&j, 1, 20) == 0, "unreachable store");
  j.expect = "; rank 0 hosts that store and has not started it (missing rank 0)";
  BT_CHECK(run(&j, 1, 20) == 0, "names the missing rank");
  return 0;
}

static int test_bad_ifname_fails_at_once(void) {
  job j = {2, free_port(), NULL, NULL, 0, "30", "nosuchif0", -1, 0, "interfaces here: "};
  BT_CHECK(run(&j, 1, 20) == 0, "BRAID_IFNAME");
  return 0;
}

/* World size 1 meets no one: a configured store is neither hosted nor dialled. */
static int test_world_of_one(void) {
  int busy, port;
  char err[256];
  /* Rank 0 would host on a busy port. */
  BT_CHECK(braid__listen_range("127.0.0.1", 0, 0, 0, 1, &busy, &port, err, sizeof err) == BRAID_OK, "%s", err);
  job j = {1, port, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", NULL, 0, "20", NULL, -1, 0,
           NULL};
  braid_comm *c = NULL;
  BT_CHECK(boot_rank(&j, 0, &c) == BRAID_OK, "busy store port: %s", c ? c->last_error : "detection failed");
  braid__boot *b = c->boot;
  BT_CHECK(b && !b->store && !b->shared && !b->hosting, "no store for one rank");
  BT_CHECK(b->env.store_owner == BRAID__STORE_NONE, "store owner %d", (int)b->env.store_owner);
  BT_CHECK(b->rank == 0 && b->size == 1 && b->local_rank == 0 && b->local_size == 1, "local %d of %d",
           b->local_rank, b->local_size);
  /* Split children and data-plane listeners work without a store. */
  braid_comm *child = shell(0, 1, 0x77);
  child->call = "braid_split";
  BT_CHECK(braid__bootstrap_split(c, child) == BRAID_OK, "split: %s", child->last_error);
  BT_CHECK(child->boot && !child->boot->store, "child without store");
  braid__listener l;
  BT_CHECK(braid__listen_dataplane(child->boot, 4, &l, err, sizeof err) == BRAID_OK && l.port > 0, "%s", err);
  close(l.fd);
  braid__bootstrap_free(child, 10.0);
  shell_free(child);
  braid__bootstrap_free(c, 10.0);
  shell_free(c);
  close(busy);

  /* Nothing listens where rank 0 would have hosted. */
  j.port = free_port();
  j.token_hex = NULL;
  BT_CHECK(boot_rank(&j, 0, &c) == BRAID_OK, "free port: %s", c ? c->last_error : "detection failed");
  int fd = -1;
  char why[256];
  int r = braid__sock_connect("127.0.0.1", j.port, braid__deadline(2), &fd, why, sizeof why);
  if (r == 0) close(fd);
  BT_CHECK(r == ECONNREFUSED, "something listens on %d: %s", j.port, r ? why : "accepted");
  braid__bootstrap_free(c, 10.0);
  shell_free(c);

  /* An external store that is not there: no 20 s of connect retries. */
  job k = {1, free_port(), NULL, "solo", 1, "20", NULL, -1, 0, NULL};
  double t0 = braid__now();
  BT_CHECK(boot_rank(&k, 0, &c) == BRAID_OK, "absent external store: %s", c ? c->last_error : "detection failed");
  BT_CHECK(braid__now() - t0 < 2, "took %.2f s", braid__now() - t0);
  braid__bootstrap_free(c, 10.0);
  shell_free(c);

  /* Through braid_init: torchrun variables naming a busy port, the shm backend, a split. */
  BT_CHECK(braid__listen_range("127.0.0.1", 0, 0, 0, 1, &busy, &port, err, sizeof err) == BRAID_OK, "%s", err);
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  const char *launcher_vars[] = {"BRAID_RANK", "BRAID_WORLD_SIZE", "BRAID_STORE", "BRAID_STORE_EXTERNAL",
                                 "BRAID_TOKEN", "BRAID_LOCAL_RANK", "BRAID_LOCAL_SIZE"};
  for (size_t i = 0; i < BT_COUNT(launcher_vars); i++) unsetenv(launcher_vars[i]);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", ps, 1);
  setenv("BRAID_BACKEND", "shm", 1);
  braid_comm *w = NULL, *sub = NULL;
  BT_CHECK_OK(braid_init(NULL, &w), NULL);
  float x[4] = {1, 2, 3, 4};
  BT_CHECK_OK(braid_all_reduce(w, x, 4, BRAID_F32, BRAID_SUM), w);
  BT_CHECK(x[0] == 1 && x[3] == 4, "sum over one rank");
  BT_CHECK_OK(braid_split(w, 0, 0, &sub), w);
  BT_CHECK(sub && braid_rank(sub) == 0, "split child");
  BT_CHECK_OK(braid_all_reduce(sub, x, 4, BRAID_F32, BRAID_SUM), sub);
  BT_CHECK_OK(braid_destroy(sub), NULL);
  BT_CHECK_OK(braid_destroy(w), NULL);
  close(busy);
  return 0;
}

/* No backend named: shared memory when every rank is on this host; ranks
   that say they are on different hosts get a clear error, not shm's wait
   for a segment that never appears. */
typedef struct {
  const bt_store *s;
  int local_size;
} default_case;

static int body_default_backend(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  const default_case *d = arg;
  char v[64];
  unsetenv("BRAID_BACKEND");
  snprintf(v, sizeof v, "%d", rank);
  setenv("BRAID_RANK", v, 1);
  snprintf(v, sizeof v, "%d", n);
  setenv("BRAID_WORLD_SIZE", v, 1);
  snprintf(v, sizeof v, "127.0.0.1:%d", d->s->port);
  setenv("BRAID_STORE", v, 1);
  setenv("BRAID_STORE_EXTERNAL", "1", 1);
  setenv("BRAID_TOKEN", d->s->token_hex, 1);
  snprintf(v, sizeof v, "%s-%d", d->s->job_id, d->local_size);
  setenv("BRAID_JOB_ID", v, 1);
  snprintf(v, sizeof v, "%d", d->local_size == n ? rank : 0);
  setenv("BRAID_LOCAL_RANK", v, 1);
  snprintf(v, sizeof v, "%d", d->local_size);
  setenv("BRAID_LOCAL_SIZE", v, 1);
  braid_comm *c = NULL;
  braid_status st = braid_init(NULL, &c);
  if (d->local_size == n) {
    BT_CHECK_OK(st, NULL);
    BT_CHECK(!strcmp(braid_backend(c), "shm"), "default backend %s", braid_backend(c));
    int x = rank + 1;
    BT_CHECK_OK(braid_all_reduce(c, &x, 1, BRAID_I32, BRAID_SUM), c);
    BT_CHECK(x == n * (n + 1) / 2, "sum %d", x);
    BT_CHECK_OK(braid_destroy(c), NULL);
    return 0;
  }
  BT_CHECK(st == BRAID_ERR_UNSUPPORTED && c == NULL, "several hosts: %s", braid_status_string(st));
  BT_CHECK(strstr(braid_last_error(NULL), "span several hosts (1 on this one) and no backend was named") &&
               strstr(braid_last_error(NULL), "BRAID_BACKEND") && strstr(braid_last_error(NULL), "(rank "),
           "message: %s", braid_last_error(NULL));
  return 0;
}

static int test_default_backend(void) {
  bt_store s;
  BT_CHECK(bt_store_start(&s) == 0, "store");
  default_case one = {&s, 3}, many = {&s, 1};
  bt_run_opts o = {NULL, 3, 30, NULL, -1};
  int rc = bt_run_ranks_ex(&o, body_default_backend, &one, NULL);
  o.nranks = 2;
  if (!rc) rc = bt_run_ranks_ex(&o, body_default_backend, &many, NULL);
  bt_store_stop(&s);
  BT_CHECK(rc == 0, "default backend runs");
  return 0;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      BT_CASE(test_rank0_hosts),        BT_CASE(test_external_store),  BT_CASE(test_missing_rank_times_out),
      BT_CASE(test_two_jobs_one_store), BT_CASE(test_store_port_busy), BT_CASE(test_store_unreachable),
      BT_CASE(test_bad_ifname_fails_at_once), BT_CASE(test_world_of_one), BT_CASE(test_default_backend),
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
