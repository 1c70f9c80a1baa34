/* The bootstrap layer on forked processes: rank 0 hosting the store, an
   external store, a rank that never starts (the timeout message), two jobs on
   one store, a busy store port, an unreachable store, split namespaces, the
   failure-spread keys (set, and a peek that a stuck or vanished store cannot
   hold up), and a world of one, which needs no store at all. A store that
   stops answering bounds init, destroy and every store request; a store
   host name that resolves to a loopback address other than 127.0.0.1 is
   served where the ranks dial it; a rank whose own setting is wrong says so,
   with its rank, and tells the others. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/store_proto.h"
#include "harness.h"
#include "os/sock.h"
#include "os/time.h"

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

/* Detects job j's environment for rank and bootstraps it. *detected says
   whether detection passed; errors leave their sentence in err. */
static braid_status boot_rank(const job *j, int rank, braid__boot **out, char *err, size_t errlen, int *detected) {
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
  *out = NULL;
  *detected = 0;
  braid_status st = braid__env_detect(fake_get, kv, NULL, BRAID__ENV_REQUIRE_STORE, &e, err, errlen);
  if (st) {
    fprintf(stderr, "detect: %s\n", err);
    return st;
  }
  *detected = 1;
  return braid__bootstrap_world(rank, j->size, &e, out, err, errlen);
}

/* Every rank: rendezvous, check the layout, exchange keys, spread a flag
   through the failure keys, split, say goodbye. */
static int body_join(braid_comm *unused, int hrank, int hsize, void *arg) {
  (void)unused, (void)hsize;
  const job *j = arg;
  int rank = hrank - j->rank_offset;
  if (rank < 0 || rank >= j->size) {
    j++; /* the second job of a two-job run */
    rank = hrank - j->rank_offset;
  }
  if (rank == j->skip_rank) return 0;
  braid__boot *b = NULL;
  char err[512] = "";
  int detected = 0;
  double t0 = braid__now();
  braid_status st = boot_rank(j, rank, &b, err, sizeof err, &detected);
  BT_CHECK(detected, "rank %d: detection failed", rank);
  if (j->expect) {
    /* A wrong setting is the caller's argument; the rest is the rendezvous'. */
    braid_status want = j->ifname ? BRAID_ERR_INVALID_ARG : BRAID_ERR_BOOTSTRAP;
    BT_CHECK(st == want, "rank %d: got %s, expected %s", rank, braid_status_string(st), braid_status_string(want));
    BT_CHECK(strstr(err, j->expect), "rank %d: \"%s\" lacks \"%s\"", rank, err, j->expect);
    /* One sentence; the caller adds the call's name and the rank. */
    BT_CHECK(strncmp(err, "braid_init", 10) && !strstr(err, "(rank "), "message framed already: %s", err);
    const char *again = strstr(err, "could not reach the store");
    BT_CHECK(!again || !strstr(again + 1, "could not reach the store"), "the message repeats itself: %s", err);
    double limit = j->init_timeout ? atof(j->init_timeout) + 2.5 : 5.0;
    BT_CHECK(braid__now() - t0 < limit, "failed after %.2f s", braid__now() - t0);
    BT_CHECK(b == NULL, "no boot state after a failure");
    return 0;
  }
  BT_CHECK(st == BRAID_OK, "rank %d: bootstrap failed: %s", rank, err);
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

  /* Failure keys: a peek sees another rank's key, and does not wait for a missing one. */
  void *val = NULL;
  size_t len = 0;
  int next = (rank + 1) % j->size;
  snprintf(key, sizeof key, "hello/%d", next);
  snprintf(want, sizeof want, "from %d", next);
  BT_CHECK(braid__boot_peek(b, key, &val, &len, 5) == 1, "peek at %s", key);
  BT_CHECK(len == strlen(want) && !memcmp(val, want, len), "peeked value of %s", key);
  free(val);
  snprintf(key, sizeof key, "flag/%d", rank);
  double t1 = braid__now();
  BT_CHECK(braid__boot_peek(b, key, &val, &len, 5) == 0 && val == NULL && len == 0, "missing key");
  BT_CHECK(braid__now() - t1 < 1, "a peek at a missing key took %.2f s", braid__now() - t1);
  BT_CHECK(braid__boot_set(b, key, "down", 4) == BRAID_OK, "boot set: %s", braid__store_error(b->store));
  BT_CHECK(braid__boot_peek(b, key, &val, &len, 5) == 1 && len == 4 && !memcmp(val, "down", 4), "own key");
  free(val);

  /* A split child: same store, its own namespace "<job prefix>c<id>/". */
  braid__boot *child = NULL;
  uint64_t id = 0x1234 + (uint64_t)(rank % 2);
  BT_CHECK(braid__bootstrap_split(b, rank / 2, (j->size + 1 - rank % 2) / 2, id, &child, err, sizeof err) ==
               BRAID_OK,
           "split: %s", err);
  BT_CHECK(child && child->store && child->store != b->store, "child has its own connection");
  snprintf(want, sizeof want, "%sc%llx/", b->job_prefix, (unsigned long long)id);
  BT_CHECK(!strcmp(child->prefix, want), "child prefix %s, expected %s", child->prefix, want);
  BT_CHECK(child->rank == rank / 2 && child->hosting == b->hosting, "child rank %d", child->rank);
  /* The parent's keys are not visible under the child's prefix. */
  BT_CHECK(braid__store_get(child->store, "hello/0", &val, &len, braid__now()) == BRAID_ERR_TIMEOUT,
           "child sees parent keys");
  BT_CHECK(braid__boot_peek(child, key, &val, &len, 5) == 0, "child peeks at the parent's %s", key);

  /* The world goes first; the child still reaches the store (rank 0 keeps hosting it). */
  braid__bootstrap_free(b, 10.0);
  snprintf(key, sizeof key, "after/%d", rank);
  BT_CHECK(braid__boot_set(child, key, "x", 1) == BRAID_OK, "child store after the world: %s",
           braid__store_error(child->store));
  BT_CHECK(braid__store_get(child->store, key, &val, &len, braid__deadline(10)) == BRAID_OK, "get");
  free(val);
  /* The last boot of the job here: rank 0 waits for everyone's goodbye. */
  braid__bootstrap_free(child, 10.0);
  braid__bootstrap_free(NULL, 1.0);
  return 0;
}

static int run(job *j, int nranks, double timeout) {
  bt_run_opts o = {NULL, nranks, timeout, NULL, -1};
  return bt_run_ranks_ex(&o, body_join, j, NULL);
}

static int test_rank0_hosts(void) {
  job j = {4, bt_free_port(), "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", NULL, 0, NULL, NULL,
           -1, 0, NULL};
  BT_CHECK(j.port > 0, "port");
  BT_CHECK(run(&j, 4, 30) == 0, "4 ranks with rank 0 hosting");
  /* No token: loopback-only store, fine on one host. */
  j.token_hex = NULL;
  j.port = bt_free_port();
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
  int port = bt_free_port();
  snprintf(want, sizeof want, "could not reach the store at 127.0.0.1:%d (from BRAID_STORE) within 1 s", port);
  /* Rank 1 alone: rank 0, who would host, never starts. */
  job j = {2, port, NULL, NULL, 0, "1", NULL, -1, -1, want};
  BT_CHECK(run(&j, 1, 20) == 0, "unreachable store");
  j.expect = "; rank 0 hosts that store and has not started it (missing rank 0)";
  BT_CHECK(run(&j, 1, 20) == 0, "names the missing rank");
  return 0;
}

static int test_bad_ifname_fails_at_once(void) {
  job j = {2, bt_free_port(), NULL, NULL, 0, "30", "nosuchif0", -1, 0, "interfaces here: "};
  BT_CHECK(run(&j, 1, 20) == 0, "BRAID_IFNAME");
  /* Rank 1, whose store (rank 0's) never comes: it tries to tell the
     others for 2 s at most, not for the 30 s of BRAID_INIT_TIMEOUT. */
  j.rank_offset = -1;
  double t0 = braid__now();
  BT_CHECK(run(&j, 1, 20) == 0, "BRAID_IFNAME on rank 1");
  BT_CHECK(braid__now() - t0 < 5.0, "rank 1 failed after %.2f s", braid__now() - t0);
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
  braid__boot *b = NULL;
  int detected = 0;
  BT_CHECK(boot_rank(&j, 0, &b, err, sizeof err, &detected) == BRAID_OK, "busy store port: %s", err);
  BT_CHECK(b && !b->store && !b->shared && !b->hosting, "no store for one rank");
  BT_CHECK(b->env.store_owner == BRAID__STORE_NONE, "store owner %d", (int)b->env.store_owner);
  BT_CHECK(b->rank == 0 && b->size == 1 && b->local_rank == 0 && b->local_size == 1, "local %d of %d",
           b->local_rank, b->local_size);
  /* No one to tell or hear from. */
  void *val = NULL;
  size_t len = 0;
  BT_CHECK(braid__boot_set(b, "fail", "x", 1) == BRAID_OK, "set without a store");
  BT_CHECK(braid__boot_peek(b, "fail", &val, &len, 1) == 0 && !val, "peek without a store");
  /* Split children and data-plane listeners work without a store. */
  braid__boot *child = NULL;
  BT_CHECK(braid__bootstrap_split(b, 0, 1, 0x77, &child, err, sizeof err) == BRAID_OK, "split: %s", err);
  BT_CHECK(child && !child->store, "child without store");
  braid__listener l;
  BT_CHECK(braid__listen_dataplane(child, 4, &l, err, sizeof err) == BRAID_OK && l.port > 0, "%s", err);
  close(l.fd);
  braid__bootstrap_free(child, 10.0);
  braid__bootstrap_free(b, 10.0);
  close(busy);
  /* No parent, no child. */
  braid__boot sentinel;
  child = &sentinel;
  BT_CHECK(braid__bootstrap_split(NULL, 0, 1, 1, &child, err, sizeof err) == BRAID_OK && !child, "NULL parent");

  /* Nothing listens where rank 0 would have hosted. */
  j.port = bt_free_port();
  j.token_hex = NULL;
  BT_CHECK(boot_rank(&j, 0, &b, err, sizeof err, &detected) == BRAID_OK, "free port: %s", err);
  int fd = -1;
  char why[256];
  int r = braid__sock_connect("127.0.0.1", j.port, braid__deadline(2), &fd, why, sizeof why);
  if (r == 0) close(fd);
  BT_CHECK(r == ECONNREFUSED, "something listens on %d: %s", j.port, r ? why : "accepted");
  braid__bootstrap_free(b, 10.0);

  /* An external store that is not there: no 20 s of connect retries. */
  job k = {1, bt_free_port(), NULL, "solo", 1, "20", NULL, -1, 0, NULL};
  double t0 = braid__now();
  BT_CHECK(boot_rank(&k, 0, &b, err, sizeof err, &detected) == BRAID_OK, "absent external store: %s", err);
  BT_CHECK(braid__now() - t0 < 2, "took %.2f s", braid__now() - t0);
  braid__bootstrap_free(b, 10.0);

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

/* braid__boot_peek is bounded by its reply timeout whatever the store does:
   stopped (SIGSTOP: the connection is up, nothing answers) or gone. */
static int test_peek_stuck_store(void) {
  bt_store s;
  BT_CHECK(bt_store_start(&s) == 0, "store");
  uint8_t tok[BRAID__TOKEN_LEN];
  BT_CHECK(braid__token_parse(s.token_hex, tok) == 0, "token");
  braid__boot *b = calloc(1, sizeof *b);
  BT_CHECK(b, "calloc");
  char err[512] = "";
  BT_CHECK(braid__store_connect("127.0.0.1", s.port, tok, sizeof tok, braid__deadline(10), &b->store, err,
                                sizeof err) == BRAID_OK,
           "connect: %s", err);
  snprintf(b->prefix, sizeof b->prefix, "peektest/");
  BT_CHECK(braid__store_set_prefix(b->store, b->prefix) == BRAID_OK, "prefix");
  void *val = NULL;
  size_t len = 0;
  BT_CHECK(braid__boot_set(b, "fail", "3 1 boom", 8) == BRAID_OK, "set: %s", braid__store_error(b->store));
  BT_CHECK(braid__boot_peek(b, "fail", &val, &len, 5) == 1 && len == 8 && !memcmp(val, "3 1 boom", 8), "peek");
  free(val);

  /* Stuck: each peek gives up at its reply timeout. */
  /* Wait until it has really stopped: kill() returns before the signal lands. */
  int ws = 0;
  BT_CHECK(kill(s.pid, SIGSTOP) == 0 && waitpid(s.pid, &ws, WUNTRACED) == s.pid && WIFSTOPPED(ws), "SIGSTOP");
  int rc = 0;
  double worst = 0;
  for (int i = 0; i < 3 && !rc; i++) {
    double t0 = braid__now();
    rc = braid__boot_peek(b, "fail", &val, &len, 0.3) != -1;
    double dt = braid__now() - t0;
    if (dt > worst) worst = dt;
  }
  kill(s.pid, SIGCONT);
  BT_CHECK(!rc, "a peek at a stopped store did not give -1");
  /* Bounded by the reply timeout: the slack is for a loaded machine. */
  BT_CHECK(worst < 0.3 + 2.0, "a peek at a stopped store took %.3f s (reply timeout 0.3 s)", worst);
  /* Once the store answers again the connection still works: late replies are skipped. */
  BT_CHECK(braid__boot_peek(b, "fail", &val, &len, 5) == 1 && len == 8 && !memcmp(val, "3 1 boom", 8),
           "peek after the store resumed: %s", braid__store_error(b->store));
  free(val);
  BT_CHECK(braid__boot_peek(b, "other", &val, &len, 5) == 0, "missing key after the store resumed");

  /* Gone: -1 at once, and set fails instead of waiting. */
  bt_store_stop(&s);
  double t0 = braid__now();
  int got = braid__boot_peek(b, "fail", &val, &len, 2);
  if (got == 1) free(val);
  BT_CHECK(got == -1, "peek at a stopped store gave %d", got);
  BT_CHECK(braid__boot_peek(b, "fail", &val, &len, 2) == -1, "peek again");
  BT_CHECK(braid__boot_set(b, "fail", "x", 1) != BRAID_OK, "set on a vanished store");
  BT_CHECK(braid__now() - t0 < 2.5, "took %.2f s", braid__now() - t0);
  braid__bootstrap_free(b, 1.0);
  return 0;
}

/* Slurm's tasks per node with a count past the rank limit (found by
   fuzz_env_detect): the local size is left to the rendezvous, never a count
   cut down to an int (which could be negative or larger than the world). */
static int test_slurm_tasks_per_node_bounds(void) {
  static const char *const bad[] = {"2,10,600112233445566", "2,10,600112233445566deeff", "2(x99999999999999999999)",
                                    "2,10,6 ", "2,10,+6", "2,"};
  for (size_t i = 0; i < BT_COUNT(bad); i++) {
    char tpn[96];
    snprintf(tpn, sizeof tpn, "SLURM_STEP_TASKS_PER_NODE=%s", bad[i]);
    char *kv[] = {"SLURM_PROCID=5", "SLURM_STEP_NUM_TASKS=6", "SLURM_LOCALID=1", "SLURM_STEP_ID=0",
                  "SLURM_NODEID=2", tpn, NULL};
    braid__launch_env e;
    char err[512];
    BT_CHECK(braid__env_detect(fake_get, kv, NULL, 0, &e, err, sizeof err) == BRAID_OK, "%s: %s", tpn, err);
    BT_CHECK(e.local_size == -1 && e.local_rank == -1, "%s: local %d of %d", tpn, e.local_rank, e.local_size);
  }
  char *good[] = {"SLURM_PROCID=5", "SLURM_STEP_NUM_TASKS=6", "SLURM_LOCALID=1", "SLURM_STEP_ID=0",
                  "SLURM_NODEID=2", "SLURM_STEP_TASKS_PER_NODE=2,1,3", NULL};
  braid__launch_env e;
  char err[512];
  BT_CHECK(braid__env_detect(fake_get, good, NULL, 0, &e, err, sizeof err) == BRAID_OK, "%s", err);
  BT_CHECK(e.local_size == 3 && e.local_rank == 1, "local %d of %d", e.local_rank, e.local_size);
  return 0;
}

static int occurrences(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* A split needs a store connection of its own; when the store that served
   the world is gone, the split fails within seconds and names the store,
   instead of retrying a refused connection until the init timeout. The
   store is ended by its process dying (the ranks hold its stop pipe too). */
static int body_split_store_gone(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  const bt_store *s = arg;
  char v[64];
  snprintf(v, sizeof v, "%d", rank);
  setenv("BRAID_RANK", v, 1);
  setenv("BRAID_LOCAL_RANK", v, 1);
  snprintf(v, sizeof v, "%d", n);
  setenv("BRAID_WORLD_SIZE", v, 1);
  setenv("BRAID_LOCAL_SIZE", v, 1);
  snprintf(v, sizeof v, "127.0.0.1:%d", s->port);
  setenv("BRAID_STORE", v, 1);
  setenv("BRAID_STORE_EXTERNAL", "1", 1);
  setenv("BRAID_TOKEN", s->token_hex, 1);
  setenv("BRAID_JOB_ID", s->job_id, 1);
  setenv("BRAID_BACKEND", "shm", 1);
  unsetenv("BRAID_INIT_TIMEOUT"); /* the default, 60 s, bounded the old retries */
  braid_comm *c = NULL, *sub = NULL;
  BT_CHECK_OK(braid_init(NULL, &c), NULL);
  BT_CHECK_OK(braid_barrier(c), c);
  if (rank == 0) {
    BT_CHECK(kill(s->pid, SIGKILL) == 0, "kill the store");
    /* Gone once its port refuses connections. */
    int refused = 0;
    for (double until = braid__now() + 5; !refused && braid__now() < until;) {
      int fd = -1;
      char why[256];
      int r = braid__sock_connect("127.0.0.1", s->port, braid__deadline(1), &fd, why, sizeof why);
      if (r == 0) close(fd);
      refused = r == ECONNREFUSED;
      if (!refused) braid__sleep(0.02);
    }
    BT_CHECK(refused, "the store's port still answers");
  }
  BT_CHECK_OK(braid_barrier(c), c);
  double t0 = braid__now();
  braid_status st = braid_split(c, 0, (uint32_t)rank, &sub);
  double dt = braid__now() - t0;
  const char *m = braid_last_error(c);
  BT_CHECK(st != BRAID_OK && sub == NULL, "split without a store: %s", braid_status_string(st));
  BT_CHECK(dt < 5, "split failed after %.2f s: %s", dt, m);
  char where[64];
  snprintf(where, sizeof where, "127.0.0.1:%d", s->port);
  BT_CHECK(strstr(m, where) && strstr(m, "gone"), "message lacks the store %s: %s", where, m);
  BT_CHECK(occurrences(m, "braid_split") == 1 && occurrences(m, "(rank ") == 1, "message repeats itself: %s", m);
  BT_CHECK(!strncmp(m, "braid_split: ", 13), "message names its call first: %s", m);
  t0 = braid__now();
  braid_destroy(c);
  BT_CHECK(braid__now() - t0 < 5, "destroy took %.2f s", braid__now() - t0);
  return 0;
}

static int test_split_store_gone(void) {
  bt_store s;
  BT_CHECK(bt_store_start(&s) == 0, "store");
  bt_run_opts o = {NULL, 2, 30, NULL, -1};
  int rc = bt_run_ranks_ex(&o, body_split_store_gone, &s, NULL);
  bt_store_stop(&s);
  BT_CHECK(rc == 0, "split with its store gone");
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
  /* Ranks the launcher places on different hosts: the hierarchical backend. */
  BT_CHECK_OK(st, NULL);
  BT_CHECK(!strcmp(braid_backend(c), "hier"), "default backend on several hosts: %s", braid_backend(c));
  int x = rank + 1;
  BT_CHECK_OK(braid_all_reduce(c, &x, 1, BRAID_I32, BRAID_SUM), c);
  BT_CHECK(x == n * (n + 1) / 2, "sum %d", x);
  BT_CHECK_OK(braid_destroy(c), NULL);
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

/* Launcher variables of rank of n, as braidrun's: the store at host:port,
   external with s's token and a job id of its own when s is given, else
   hosted by rank 0 without a token. */
static void rank_env(int rank, int n, const char *host, int port, const bt_store *s, const char *job_id) {
  char v[300];
  snprintf(v, sizeof v, "%d", rank);
  setenv("BRAID_RANK", v, 1);
  snprintf(v, sizeof v, "%d", n);
  setenv("BRAID_WORLD_SIZE", v, 1);
  snprintf(v, sizeof v, "%s:%d", host, s ? s->port : port);
  setenv("BRAID_STORE", v, 1);
  if (s) {
    setenv("BRAID_STORE_EXTERNAL", "1", 1);
    setenv("BRAID_TOKEN", s->token_hex, 1);
    snprintf(v, sizeof v, "%s-%s", s->job_id, job_id);
    setenv("BRAID_JOB_ID", v, 1);
  } else {
    unsetenv("BRAID_STORE_EXTERNAL");
    unsetenv("BRAID_TOKEN");
    unsetenv("BRAID_JOB_ID");
  }
  unsetenv("BRAID_LOCAL_RANK");
  unsetenv("BRAID_LOCAL_SIZE");
}

/* A store that proves it holds the token and then answers nothing: a store
   host that stopped, or was cut off, once its clients were connected. Serves
   listener lfd until killed. */
static void mute_store(int lfd, const uint8_t tok[BRAID__TOKEN_LEN]) {
  braid__store_core *core = braid__store_core_new(tok, BRAID__TOKEN_LEN);
  for (;;) {
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0 || !core) continue;
    braid__store_conn *k = braid__store_core_open(core, 1, "client", braid__now());
    size_t n = 0;
    const uint8_t *out = braid__store_core_pending(k, &n);
    if (braid__sock_write_full(fd, out, n, braid__deadline(5)) != BRAID__SOCK_OK) continue;
    braid__store_core_consume(k, n);
    uint8_t hello[BRAID__PROTO_HDR + BRAID__PROTO_CHELLO_LEN];
    if (braid__sock_read_full(fd, hello, sizeof hello, braid__deadline(5)) != BRAID__SOCK_OK ||
        braid__store_core_feed(core, k, hello, sizeof hello, braid__now()) != 0)
      continue;
    out = braid__store_core_pending(k, &n); /* AUTH_OK; then silence, the connection left open */
    (void)braid__sock_write_full(fd, out, n, braid__deadline(5));
  }
}

/* braid_init at a store that authenticates and then never answers ends by
   BRAID_INIT_TIMEOUT, not by the store client's default op timeout, and
   says which store did not answer; with the local rank given (the
   registration's CAS) and derived (its ADD first). */
static int test_init_mute_store(void) {
  uint8_t tok[BRAID__TOKEN_LEN];
  for (int i = 0; i < BRAID__TOKEN_LEN; i++) tok[i] = (uint8_t)(i * 7 + 1);
  int lfd = -1, port = 0;
  char err[256];
  BT_CHECK(braid__listen_range("127.0.0.1", 0, 0, 0, 16, &lfd, &port, err, sizeof err) == BRAID_OK, "%s", err);
  BT_CHECK(fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) & ~O_NONBLOCK) == 0, "blocking listener");
  fflush(NULL);
  pid_t pid = fork();
  BT_CHECK(pid >= 0, "fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with the case, even when it is killed at its timeout */
    mute_store(lfd, tok);
    _exit(0);
  }
  close(lfd);
  bt_store fake = {.pid = pid, .port = port};
  braid__token_format(tok, fake.token_hex);
  snprintf(fake.job_id, sizeof fake.job_id, "mute");
  int rc = 0;
  for (int derive = 0; derive < 2 && !rc; derive++) {
    rank_env(1, 2, "127.0.0.1", 0, &fake, derive ? "derived" : "given");
    if (!derive) {
      setenv("BRAID_LOCAL_RANK", "1", 1);
      setenv("BRAID_LOCAL_SIZE", "2", 1);
    }
    setenv("BRAID_INIT_TIMEOUT", "2", 1);
    setenv("BRAID_BACKEND", "shm", 1);
    braid_comm *c = NULL;
    double t0 = braid__now();
    braid_status st = braid_init(NULL, &c);
    double dt = braid__now() - t0;
    const char *m = braid_last_error(NULL);
    char want[96];
    snprintf(want, sizeof want, "braid_init: the store at 127.0.0.1:%d", port);
    printf("local rank %s: %s after %.2f s: %s\n", derive ? "derived" : "given", braid_status_string(st), dt, m);
    if (st != BRAID_ERR_BOOTSTRAP || !strstr(m, want) || !strstr(m, "did not answer") || !strstr(m, "(rank 1)") ||
        dt > 15) {
      bt_report(__FILE__, __LINE__, "expected BRAID_ERR_BOOTSTRAP within 15 s naming the store and rank 1");
      rc = 1;
    }
    if (!st) braid_destroy(c);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return rc;
}

/* Stops s's process (SIGSTOP: its connections stay up, nothing answers)
   and waits until it has stopped. */
static int stop_store(const bt_store *s) {
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)s->pid);
  if (kill(s->pid, SIGSTOP) != 0) return -1;
  for (int i = 0; i < 5000; i++) {
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    if (p && (p[2] == 'T' || p[2] == 't')) return 0;
    usleep(1000);
  }
  return -1;
}

typedef struct {
  const bt_store *s;
  _Atomic int *w;
} stuck_case;

/* Called by every rank once it is ready: rank 0 then stops the store, and
   each returns 0 once it has stopped. */
static int stuck_sync(const stuck_case *k, int rank, int n) {
  atomic_fetch_add(k->w, 1);
  if (rank == 0) {
    BT_CHECK(bt_await(k->w, n, 30), "the other rank did not get ready");
    BT_CHECK(stop_store(k->s) == 0, "the store did not stop");
    atomic_fetch_add(k->w, 1);
  }
  BT_CHECK(bt_await(k->w, n + 1, 30), "the store was not stopped");
  return 0;
}

/* Runs body on two ranks that meet at a store of their own (stuck_case);
   the store resumes and stops after the run. */
static int run_stuck(bt_body body, const char *what) {
  bt_store s;
  BT_CHECK(bt_store_start(&s) == 0, "store");
  stuck_case k = {&s, bt_shared_counter()};
  BT_CHECK(k.w, "shared counter");
  bt_run_opts o = {NULL, 2, 40, NULL, -1};
  int rc = bt_run_ranks_ex(&o, body, &k, NULL);
  kill(s.pid, SIGCONT);
  bt_store_stop(&s);
  bt_shared_free(k.w);
  BT_CHECK(rc == 0, "%s with the store stopped", what);
  return 0;
}

/* Both ranks have a communicator; rank 0 stops the store; both destroy. */
static int body_destroy_stuck(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  const stuck_case *k = arg;
  rank_env(rank, n, "127.0.0.1", 0, k->s, "destroy");
  setenv("BRAID_BACKEND", "shm", 1);
  setenv("BRAID_DESTROY_TIMEOUT", "1", 1);
  braid_comm *c = NULL;
  BT_CHECK_OK(braid_init(NULL, &c), NULL);
  BT_CHECK_OK(braid_barrier(c), c);
  if (stuck_sync(k, rank, n)) return 1;
  double t0 = braid__now();
  braid_status st = braid_destroy(c);
  double dt = braid__now() - t0;
  printf("[rank %d] braid_destroy with the store stopped: %s after %.2f s\n", rank, braid_status_string(st), dt);
  BT_CHECK(st == BRAID_OK, "braid_destroy: %s", braid_status_string(st));
  /* BRAID_DESTROY_TIMEOUT=1: the bound is for a loaded machine. */
  BT_CHECK(dt < 15, "braid_destroy took %.2f s with the store stopped", dt);
  return 0;
}

/* braid_destroy's goodbye to a store that stopped answering is bounded by
   the destroy timeout. */
static int test_destroy_stuck_store(void) { return run_stuck(body_destroy_stuck, "destroy"); }

/* After the rendezvous a store request without a deadline of its own (the
   settings' comparison, a backend's address, a split's) waits at most the
   init timeout, on the world's connection and on a split child's. */
static int body_requests_bounded(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  const stuck_case *k = arg;
  job j = {n, k->s->port, k->s->token_hex, k->s->job_id, 1, "2", NULL, -1, 0, NULL};
  braid__boot *b = NULL, *child = NULL;
  char err[512] = "";
  int detected = 0;
  BT_CHECK(boot_rank(&j, rank, &b, err, sizeof err, &detected) == BRAID_OK, "rendezvous: %s", err);
  BT_CHECK(braid__bootstrap_split(b, rank, n, 0x55, &child, err, sizeof err) == BRAID_OK, "split: %s", err);
  if (stuck_sync(k, rank, n)) return 1;
  char where[64];
  snprintf(where, sizeof where, "the store at 127.0.0.1:%d did not answer", k->s->port);
  braid__boot *boots[2] = {b, child};
  for (int i = 0; i < 2; i++) {
    double t0 = braid__now();
    braid_status st = braid__store_set(boots[i]->store, "late", "x", 1);
    double dt = braid__now() - t0;
    const char *m = braid__store_error(boots[i]->store);
    BT_CHECK(st == BRAID_ERR_TIMEOUT, "%s: a set at a stopped store gave %s", i ? "child" : "world",
             braid_status_string(st));
    BT_CHECK(strstr(m, where), "message lacks \"%s\": %s", where, m);
    /* BRAID_INIT_TIMEOUT=2: the bound is for a loaded machine. */
    BT_CHECK(dt < 15, "a set at a stopped store took %.2f s", dt);
  }
  double t0 = braid__now();
  braid__bootstrap_free(child, 1.0);
  braid__bootstrap_free(b, 1.0);
  BT_CHECK(braid__now() - t0 < 15, "freeing took %.2f s", braid__now() - t0);
  return 0;
}

static int test_requests_after_rendezvous_bounded(void) { return run_stuck(body_requests_bounded, "store requests"); }

#define LOOPHOST "braid-test-loophost"

static int body_loophost(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  rank_env(rank, n, LOOPHOST, *(const int *)arg, NULL, NULL);
  setenv("BRAID_BACKEND", "shm", 1);
  setenv("BRAID_INIT_TIMEOUT", "10", 1);
  braid_comm *c = NULL;
  BT_CHECK_OK(braid_init(NULL, &c), NULL);
  int x = rank + 1;
  BT_CHECK_OK(braid_all_reduce(c, &x, 1, BRAID_I32, BRAID_SUM), c);
  BT_CHECK(x == n * (n + 1) / 2, "sum %d", x);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

/* A single-host job without a token whose store host name resolves to a
   loopback address other than 127.0.0.1 (Debian's /etc/hosts maps the host
   name to 127.0.1.1; MASTER_ADDR=$(hostname) is common): rank 0's store
   listens where the ranks dial. A private mount namespace gives this
   process such an /etc/hosts. */
static int test_store_name_on_other_loopback(void) {
  if (geteuid() != 0) {
    printf("skipped: needs root for a private mount namespace with its own /etc/hosts\n");
    return BT_SKIP;
  }
  if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
    printf("skipped: no private mount namespace here: %s\n", strerror(errno));
    return BT_SKIP;
  }
  char hosts[64];
  snprintf(hosts, sizeof hosts, "/tmp/braid-test-hosts-%d", (int)getpid());
  FILE *f = fopen(hosts, "w");
  BT_CHECK(f, "%s: %s", hosts, strerror(errno));
  fprintf(f, "127.0.0.1 localhost\n::1 localhost ip6-localhost\n127.0.1.1 " LOOPHOST "\n");
  fclose(f);
  if (mount(hosts, "/etc/hosts", NULL, MS_BIND, NULL) != 0) {
    printf("skipped: cannot mount over /etc/hosts: %s\n", strerror(errno));
    unlink(hosts);
    return BT_SKIP;
  }
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
  int g = getaddrinfo(LOOPHOST, NULL, &hints, &res);
  int resolved = !g && res && ((struct sockaddr_in *)(void *)res->ai_addr)->sin_addr.s_addr == htonl(0x7f000101);
  if (res) freeaddrinfo(res);
  int rc = BT_SKIP;
  if (!resolved) {
    printf("skipped: " LOOPHOST " does not resolve through /etc/hosts to 127.0.1.1 here\n");
  } else {
    int port = bt_free_port();
    bt_run_opts o = {NULL, 2, 40, NULL, -1};
    rc = bt_run_ranks_ex(&o, body_loophost, &port, NULL);
    if (rc) bt_report(__FILE__, __LINE__, "two ranks at a store named " LOOPHOST " (127.0.1.1), no token");
  }
  umount("/etc/hosts");
  unlink(hosts);
  return rc;
}

typedef struct {
  int port;
  const char *bad; /* "NAME=value" for rank 1 only */
  const char *backend;
} bad_setting;

/* Rank 1 alone has a wrong setting of its own: its error names the variable
   and its rank, and rank 0 learns why at once instead of after its 30 s. */
static int body_bad_setting(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  const bad_setting *k = arg;
  rank_env(rank, n, "127.0.0.1", k->port, NULL, NULL);
  setenv("BRAID_BACKEND", k->backend, 1);
  setenv("BRAID_INIT_TIMEOUT", "30", 1);
  char name[64];
  snprintf(name, sizeof name, "%.*s", (int)(strchr(k->bad, '=') - k->bad), k->bad);
  if (rank == 1) setenv(name, strchr(k->bad, '=') + 1, 1);
  braid_comm *c = NULL;
  double t0 = braid__now();
  braid_status st = braid_init(NULL, &c);
  double dt = braid__now() - t0;
  const char *m = braid_last_error(NULL);
  printf("[rank %d] %s: %s after %.2f s: %s\n", rank, k->bad, braid_status_string(st), dt, m);
  BT_CHECK(st != BRAID_OK, "braid_init succeeded");
  BT_CHECK(strstr(m, name), "message lacks %s: %s", name, m);
  if (rank == 1) {
    BT_CHECK(strstr(m, "(rank 1)"), "message lacks the rank: %s", m);
  } else {
    BT_CHECK(strstr(m, "rank 1 could not start"), "message lacks the cause: %s", m);
    BT_CHECK(dt < 15, "rank 0 failed after %.2f s (BRAID_INIT_TIMEOUT=30)", dt);
  }
  return 0;
}

static int test_bad_setting_told(void) {
  static const struct {
    const char *bad, *backend;
  } cases[] = {{"BRAID_ADDR=10.0.0.x", "shm"},
               {"BRAID_PORT_RANGE=50-40", "shm"},
               {"BRAID_INIT_TIMEOUT=soon", "shm"},
               /* well formed, but not an address of this host (TEST-NET-1) */
               {"BRAID_ADDR=192.0.2.1", "tcp"}};
  for (size_t i = 0; i < BT_COUNT(cases); i++) {
    bad_setting k = {bt_free_port(), cases[i].bad, cases[i].backend};
    bt_run_opts o = {NULL, 2, 40, NULL, -1};
    BT_CHECK(bt_run_ranks_ex(&o, body_bad_setting, &k, NULL) == 0, "%s on rank 1", cases[i].bad);
  }
  return 0;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      BT_CASE(test_rank0_hosts),        BT_CASE(test_external_store),  BT_CASE(test_missing_rank_times_out),
      BT_CASE(test_two_jobs_one_store), BT_CASE(test_store_port_busy), BT_CASE(test_store_unreachable),
      BT_CASE(test_bad_ifname_fails_at_once), BT_CASE(test_world_of_one), BT_CASE(test_peek_stuck_store),
      BT_CASE(test_default_backend), BT_CASE(test_split_store_gone), BT_CASE(test_slurm_tasks_per_node_bounds),
      {"test_init_mute_store", test_init_mute_store, 60}, {"test_destroy_stuck_store", test_destroy_stuck_store, 60},
      {"test_requests_after_rendezvous_bounded", test_requests_after_rendezvous_bounded, 60},
      {"test_store_name_on_other_loopback", test_store_name_on_other_loopback, 60},
      {"test_bad_setting_told", test_bad_setting_told, 120},
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
