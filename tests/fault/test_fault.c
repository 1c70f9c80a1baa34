/* The fault suite, on every backend that can hold several ranks: a rank
   killed in each collective, in send/recv, during init and during split; a
   stopped rank; an abort from another thread; destroy with work pending;
   the store killed during init and after; a too small /dev/shm (shm). Each
   case checks every rank's status, the facts its sentence must give, a
   bounded time, and that nothing leaks (/dev/shm names, descriptors,
   threads). Mismatched collectives are tests/unit/test_mismatch.c. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int count_dir(const char *path) {
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

/* Descriptors and threads of this process, to compare before init and
   after destroy. */
typedef struct usage {
  int fds, threads;
} usage;

/* Descriptors, less the one braid keeps for the life of the process (the
   memfd peers probe to learn whether they may map its braid memory). */
static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[300], target[256] = "";
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(path, target, sizeof target - 1);
    if (k > 0) target[k] = 0;
    if (!strstr(target, "memfd:braid-probe")) n++;
  }
  closedir(d);
  return n;
}

static usage usage_now(void) { return (usage){count_fds(), count_dir("/proc/self/task")}; }

#define CHECK_NO_LEAK(before)                                                                                   \
  do {                                                                                                          \
    usage after_ = usage_now();                                                                                 \
    BT_CHECK(after_.fds <= (before).fds && after_.threads <= (before).threads,                                  \
             "leak: %d descriptors and %d threads before init, %d and %d after destroy", (before).fds,          \
             (before).threads, after_.fds, after_.threads);                                                     \
  } while (0)

static const char *backend_of(void) {
  const char *b = getenv("BRAID_BACKEND");
  return b ? b : "?";
}

/* ---------------------------------------------------------------- a rank killed */

enum { OP_AR, OP_BC, OP_AG, OP_RS, OP_BARRIER, OP_P2P, NOPS };
static const char *const op_names[NOPS] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier",
                                           "send/recv"};

typedef struct kill_case {
  int op, victim;
} kill_case;

static braid_status one_op(braid_comm *c, int op, int rank, int n, float *buf, size_t cnt, int it) {
  switch (op) {
  case OP_AR: return braid_all_reduce(c, buf, cnt, BRAID_F32, BRAID_SUM);
  case OP_BC: return braid_broadcast(c, buf, cnt, BRAID_F32, it % n);
  case OP_AG: return braid_all_gather(c, buf, buf + cnt, cnt, BRAID_F32);
  case OP_RS: return braid_reduce_scatter(c, buf, buf + cnt * (size_t)n, cnt, BRAID_F32, BRAID_SUM);
  case OP_BARRIER: return braid_barrier(c);
  default: {
    braid_status st = braid_recv(c, buf + cnt, cnt, BRAID_F32, (rank + n - 1) % n, 3);
    if (!st) st = braid_send(c, buf, cnt, BRAID_F32, (rank + 1) % n, 3);
    if (!st) st = braid_sync(c);
    return st;
  }
  }
}

/* Every survivor fails with PEER_LOST naming the victim within a few
   seconds (BRAID_TIMEOUT is far longer, so no timeout can pass for it).
   Calls that need nothing from the victim may still succeed for a while:
   broadcasts from other roots, neighbours of a ring that are not its
   neighbours. */
static int body_kill(braid_comm *c, int rank, int n, void *arg) {
  const kill_case *k = arg;
  size_t big = 1 << 17;
  float *buf = calloc(big * (size_t)(n + 2), sizeof(float));
  BT_CHECK(buf != NULL, "out of memory");
  double t_first_fail = 0;
  for (int it = 0; it < 200; it++) {
    if (rank == k->victim && it == 3) raise(SIGKILL);
    size_t cnt = it % 2 ? big : 3;
    double t0 = now_s();
    braid_status st = one_op(c, k->op, rank, n, buf, cnt, it);
    if (st == BRAID_OK) continue;
    BT_CHECK(st == BRAID_ERR_PEER_LOST, "%s %s: rank %d got %s: %s", backend_of(), op_names[k->op], rank,
             braid_status_string(st), braid_last_error(c));
    char want[32];
    snprintf(want, sizeof want, "rank %d", k->victim);
    BT_CHECK_MSG(c, want);
    t_first_fail = now_s() - t0;
    fprintf(stderr, "fault-time: %s kill-in-%s rank %d %.3f s\n", backend_of(), op_names[k->op], rank, t_first_fail);
    BT_CHECK(t_first_fail < 5.0, "%s %s: noticed after %.2f s", backend_of(), op_names[k->op], t_first_fail);
    /* Sticky, and said again. */
    BT_CHECK_ST(braid_barrier(c), BRAID_ERR_PEER_LOST, c);
    BT_CHECK_MSG(c, "communicator failed earlier");
    free(buf);
    return 0;
  }
  BT_CHECK(0, "%s %s: rank %d never noticed that rank %d died", backend_of(), op_names[k->op], rank, k->victim);
  return 1;
}

static int run_backends(int min_ranks, int (*fn)(const char *backend, int n));

static int kill_on(const char *backend, int n) {
  static const char *const env[] = {"BRAID_TIMEOUT=100", NULL};
  for (int op = 0; op < NOPS; op++) {
    kill_case k = {op, n - 2};
    int before = bt_dead_shm_names(0);
    bt_run_opts o = {backend, n, 60, env, k.victim};
    bt_rank_result res[8];
    bt_run_ranks_ex(&o, body_kill, &k, res);
    for (int r = 0; r < n; r++)
      if (r != k.victim && !(res[r].exited && res[r].code == 0)) {
        fprintf(stderr, "kill in %s on %s: rank %d failed\n", op_names[op], backend, r);
        return 1;
      }
    BT_CHECK(res[k.victim].exited == 0 && res[k.victim].code == SIGKILL, "the victim was not killed");
    BT_CHECK(bt_dead_shm_names(0) <= before, "kill in %s on %s left /dev/shm names", op_names[op], backend);
  }
  return 0;
}

static int test_kill_in_each_call(void) { return run_backends(3, kill_on); }

/* ---------------------------------------------------------------- init and split */

/* The victim dies at a chosen point of braid_init (a thread kills the
   process after a delay): the others' init fails, naming it or the missing
   rank, well before BRAID_TIMEOUT, and leaves nothing behind. */
typedef struct init_case {
  int victim;
  int delay_us;
} init_case;

static void *kill_later(void *p) {
  usleep((useconds_t)(intptr_t)p);
  raise(SIGKILL);
  return NULL;
}

static int body_init_death(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused, (void)n;
  const init_case *k = arg;
  if (rank == k->victim) {
    pthread_t t;
    pthread_create(&t, NULL, kill_later, (void *)(intptr_t)k->delay_us);
  }
  usage before = usage_now();
  braid_comm *c = NULL;
  double t0 = now_s();
  braid_status st = braid_init(NULL, &c);
  if (st == BRAID_OK) {
    /* It got through before the victim died: a later collective fails. */
    float x = 1;
    for (int it = 0; it < 100000 && st == BRAID_OK; it++) st = braid_all_reduce(c, &x, 1, BRAID_F32, BRAID_SUM);
    if (rank != k->victim)
      BT_CHECK(st == BRAID_ERR_PEER_LOST, "after init, rank %d got %s: %s", rank, braid_status_string(st),
               braid_last_error(c));
    braid_destroy(c);
  } else {
    BT_CHECK(st == BRAID_ERR_PEER_LOST || st == BRAID_ERR_BOOTSTRAP, "init: rank %d got %s: %s", rank,
             braid_status_string(st), braid_last_error(NULL));
    char want[32];
    snprintf(want, sizeof want, "rank %d", k->victim);
    BT_CHECK_MSG(NULL, want);
  }
  fprintf(stderr, "fault-time: %s death-during-init(%d us) rank %d %.3f s\n", backend_of(), k->delay_us, rank,
          now_s() - t0);
  BT_CHECK(now_s() - t0 < 10.0, "init death noticed after %.2f s", now_s() - t0);
  CHECK_NO_LEAK(before);
  return 0;
}

static int init_death_on(const char *backend, int n) {
  /* The init timeout bounds a victim that died before it registered. */
  static const char *const env[] = {"BRAID_TIMEOUT=100", "BRAID_INIT_TIMEOUT=4", NULL};
  static const int delays[] = {0, 2000, 20000};
  for (size_t i = 0; i < BT_COUNT(delays); i++) {
    init_case k = {n - 1, delays[i]};
    int before = bt_dead_shm_names(0);
    bt_run_opts o = {backend, n, 60, env, k.victim};
    bt_rank_result res[8];
    bt_run_ranks_manual(&o, body_init_death, &k, res);
    for (int r = 0; r < n; r++)
      if (r != k.victim && !(res[r].exited && res[r].code == 0)) {
        fprintf(stderr, "death during init (%d us) on %s: rank %d failed\n", delays[i], backend, r);
        return 1;
      }
    /* A segment left by ranks killed before all attached is removed by
       the next start; none may stay once this one is over. */
    BT_CHECK(bt_dead_shm_names(0) <= before + 1, "death during init left /dev/shm names");
  }
  return 0;
}

static int test_death_during_init(void) { return run_backends(3, init_death_on); }

static int body_split_death(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  if (rank == n - 1) raise(SIGKILL);
  braid_comm *child = NULL;
  double t0 = now_s();
  braid_status st = braid_split(c, (uint32_t)(rank % 2), 0, &child);
  BT_CHECK(st == BRAID_ERR_PEER_LOST, "split: rank %d got %s: %s", rank, braid_status_string(st),
           braid_last_error(c));
  char want[32];
  snprintf(want, sizeof want, "rank %d", n - 1);
  BT_CHECK_MSG(c, want);
  fprintf(stderr, "fault-time: %s death-during-split rank %d %.3f s\n", backend_of(), rank, now_s() - t0);
  BT_CHECK(now_s() - t0 < 5.0, "split noticed the death after %.2f s", now_s() - t0);
  BT_CHECK(child == NULL, "a child came out of a failed split");
  return 0;
}

static int split_death_on(const char *backend, int n) {
  static const char *const env[] = {"BRAID_TIMEOUT=100", NULL};
  bt_run_opts o = {backend, n, 60, env, n - 1};
  bt_rank_result res[8];
  bt_run_ranks_ex(&o, body_split_death, NULL, res);
  for (int r = 0; r < n - 1; r++)
    if (!(res[r].exited && res[r].code == 0)) {
      fprintf(stderr, "death during split on %s: rank %d failed\n", backend, r);
      return 1;
    }
  return 0;
}

static int test_death_during_split(void) { return run_backends(3, split_death_on); }

/* ---------------------------------------------------------------- a stopped rank */

/* Rank 1 stops (SIGSTOP) until every other rank has timed out naming it
   (arg: a shared counter of those); when it continues, its own next call
   learns that the communicator failed elsewhere. */
static int body_stop(braid_comm *c, int rank, int n, void *arg) {
  _Atomic int *gave_up = arg;
  float x[4] = {1, 2, 3, 4};
  BT_CHECK_OK(braid_all_reduce(c, x, 4, BRAID_F32, BRAID_SUM), c);
  if (rank == 1) {
    pid_t self = getpid();
    if (fork() == 0) { /* wakes it up once the others are done with it */
      bt_await(gave_up, n - 1, 60);
      kill(self, SIGCONT);
      _exit(0);
    }
    raise(SIGSTOP);
    braid_status st = braid_all_reduce(c, x, 4, BRAID_F32, BRAID_SUM);
    BT_CHECK(st != BRAID_OK, "the stopped rank's call succeeded after the others gave up");
    while (waitpid(-1, NULL, 0) > 0) {
    }
    return 0;
  }
  double t0 = now_s();
  braid_status st = braid_all_reduce(c, x, 4, BRAID_F32, BRAID_SUM);
  atomic_fetch_add(gave_up, 1);
  BT_CHECK(st == BRAID_ERR_TIMEOUT || st == BRAID_ERR_PEER_LOST, "rank %d got %s: %s", rank, braid_status_string(st),
           braid_last_error(c));
  if (st == BRAID_ERR_TIMEOUT) BT_CHECK_MSG(c, "rank 1");
  fprintf(stderr, "fault-time: %s stopped-rank(timeout 0.5) rank %d %.3f s\n", backend_of(), rank, now_s() - t0);
  BT_CHECK(now_s() - t0 < 3.0, "a 0.5 s timeout took %.2f s", now_s() - t0);
  return 0;
}

/* hier on one node here: across nodes, a rank that waits for a live rank
   which itself waits for the stopped one may time out first and name the
   rank it waited for (docs/HIER.md); a dead rank is named everywhere. */
static int stop_on(const char *backend, int n) {
  static const char *const env[] = {"BRAID_TIMEOUT=0.5", "BRAID_NODE_ID=n0", NULL};
  bt_run_opts o = {backend, n, 60, env, -1};
  _Atomic int *gave_up = bt_shared_counter();
  BT_CHECK(gave_up != NULL, "no shared mapping");
  int rc = bt_run_ranks_ex(&o, body_stop, (void *)gave_up, NULL);
  bt_shared_free(gave_up);
  return rc;
}

static int test_stopped_rank(void) { return run_backends(2, stop_on); }

/* ---------------------------------------------------------------- abort */

static void *abort_later(void *p) {
  usleep(200000);
  braid_abort(p);
  return NULL;
}

/* Rank 0 aborts from a second thread while its main thread waits in a
   collective the others never finish without it: rank 0 gets ABORTED, the
   others PEER_LOST naming rank 0 as the aborting rank, within a second. */
static int body_abort(braid_comm *c, int rank, int n, void *arg) {
  (void)arg, (void)n;
  float x[64] = {0};
  BT_CHECK_OK(braid_barrier(c), c);
  double t0 = now_s();
  if (rank == 0) {
    pthread_t t;
    BT_CHECK(pthread_create(&t, NULL, abort_later, c) == 0, "pthread_create");
    /* The others are in the all-reduce; rank 0 waits in a receive nobody sends. */
    BT_CHECK_OK(braid_recv(c, x, 1, BRAID_F32, 1, 99), c);
    BT_CHECK_ST(braid_sync(c), BRAID_ERR_ABORTED, c);
    pthread_join(t, NULL);
    BT_CHECK(now_s() - t0 < 2.0, "abort took %.2f s", now_s() - t0);
    return 0;
  }
  braid_status st = braid_all_reduce(c, x, 64, BRAID_F32, BRAID_SUM);
  BT_CHECK(st == BRAID_ERR_PEER_LOST, "rank %d got %s: %s", rank, braid_status_string(st), braid_last_error(c));
  BT_CHECK_MSG(c, "rank 0 aborted");
  fprintf(stderr, "fault-time: %s abort(at 0.2) rank %d %.3f s\n", backend_of(), rank, now_s() - t0);
  BT_CHECK(now_s() - t0 < 1.2 + 0.2, "the abort reached rank %d after %.2f s", rank, now_s() - t0);
  return 0;
}

static int abort_on(const char *backend, int n) {
  static const char *const env[] = {"BRAID_TIMEOUT=100", NULL};
  bt_run_opts o = {backend, n, 60, env, -1};
  return bt_run_ranks_ex(&o, body_abort, NULL, NULL);
}

static int test_abort_reaches_peers(void) { return run_backends(2, abort_on); }

/* ---------------------------------------------------------------- destroy with work pending */

/* Receives nobody sends and sends nobody receives, then destroy: it
   returns within the destroy timeout and leaks nothing. */
static int body_destroy_pending(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused, (void)arg;
  usage before = usage_now();
  braid_comm *c = NULL;
  BT_CHECK_OK(braid_init(NULL, &c), NULL);
  static float big[1 << 20];
  float x = 0;
  BT_CHECK_OK(braid_recv(c, &x, 1, BRAID_F32, (rank + 1) % n, 7), c);
  BT_CHECK_OK(braid_send(c, big, 1 << 20, BRAID_F32, (rank + 1) % n, 8), c);
  double t0 = now_s();
  BT_CHECK_OK(braid_destroy(c), NULL);
  BT_CHECK(now_s() - t0 < 0.3 + 2.0, "destroy took %.2f s with a 0.3 s destroy timeout", now_s() - t0);
  CHECK_NO_LEAK(before);
  return 0;
}

static int destroy_pending_on(const char *backend, int n) {
  static const char *const env[] = {"BRAID_DESTROY_TIMEOUT=0.3", NULL};
  bt_run_opts o = {backend, n, 60, env, -1};
  return bt_run_ranks_manual(&o, body_destroy_pending, NULL, NULL);
}

static int test_destroy_with_pending_work(void) { return run_backends(1, destroy_pending_on); }

/* ---------------------------------------------------------------- the store */

static pid_t store_pid(void) {
  const char *v = getenv("BT_STORE_PID");
  return v ? (pid_t)atoi(v) : 0;
}

/* The store dies after init: collectives go on (the data plane does not
   need it once the ranks have met); destroy is bounded. */
static int body_store_after(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  float x[8];
  for (int i = 0; i < 8; i++) x[i] = 1;
  BT_CHECK_OK(braid_all_reduce(c, x, 8, BRAID_F32, BRAID_SUM), c); /* links made while the store lives */
  BT_CHECK_OK(braid_barrier(c), c);
  if (rank == 0) BT_CHECK(store_pid() > 0 && kill(store_pid(), SIGKILL) == 0, "could not kill the store");
  BT_CHECK_OK(braid_barrier(c), c);
  for (int it = 0; it < 20; it++) {
    for (int i = 0; i < 8; i++) x[i] = 1;
    BT_CHECK_OK(braid_all_reduce(c, x, 8, BRAID_F32, BRAID_SUM), c);
    BT_CHECK(x[0] == (float)n, "sum %g", x[0]);
  }
  return 0;
}

/* The store dies while the ranks meet: every init fails within the init
   timeout with a sentence naming the store, and nothing is left behind. */
static int body_store_during(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused, (void)n, (void)arg;
  if (rank == 0) BT_CHECK(store_pid() > 0 && kill(store_pid(), SIGKILL) == 0, "could not kill the store");
  else usleep(100000);
  usage before = usage_now();
  braid_comm *c = NULL;
  double t0 = now_s();
  braid_status st = braid_init(NULL, &c);
  BT_CHECK(st == BRAID_ERR_BOOTSTRAP, "rank %d: init with a dead store gave %s: %s", rank, braid_status_string(st),
           braid_last_error(NULL));
  BT_CHECK_MSG(NULL, "store");
  BT_CHECK(now_s() - t0 < 4.0 + 1.0, "init took %.2f s with a 3 s init timeout", now_s() - t0);
  CHECK_NO_LEAK(before);
  return 0;
}

static int store_on(const char *backend, int n) {
  static const char *const after[] = {"BRAID_DESTROY_TIMEOUT=1", NULL};
  static const char *const during[] = {"BRAID_INIT_TIMEOUT=3", NULL};
  bt_run_opts a = {backend, n, 60, after, -1};
  bt_run_opts d = {backend, n, 60, during, -1};
  return bt_run_ranks_ex(&a, body_store_after, NULL, NULL) || bt_run_ranks_manual(&d, body_store_during, NULL, NULL);
}

static int test_store_killed(void) { return run_backends(2, store_on); }

/* ---------------------------------------------------------------- a small /dev/shm (shm) */

/* Eight ranks gather 8 MiB each (64 MiB in all) through a 64 MiB /dev/shm,
   as in a container with Docker's default: staging shrinks to fit, every
   page is reserved at init, and the results are right. */
static int body_small_shm(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  size_t cnt = (8u << 20) / 4;
  uint32_t *send = malloc(cnt * 4), *recv = malloc(cnt * 4 * (size_t)n);
  BT_CHECK(send && recv, "out of memory");
  for (size_t i = 0; i < cnt; i++) send[i] = (uint32_t)(rank * 1000003u + i);
  BT_CHECK_OK(braid_all_gather(c, send, recv, cnt, BRAID_U32), c);
  BT_CHECK_OK(braid_sync(c), c);
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < cnt; i += 997)
      BT_CHECK(recv[(size_t)q * cnt + i] == (uint32_t)(q * 1000003u + i), "block %d element %zu", q, i);
  float x[1024];
  for (int i = 0; i < 1024; i++) x[i] = 1;
  BT_CHECK_OK(braid_all_reduce(c, x, 1024, BRAID_F32, BRAID_SUM), c);
  BT_CHECK(x[7] == (float)n, "sum %g", x[7]);
  free(send);
  free(recv);
  return 0;
}

/* With /dev/shm too small for even the smallest staging, init fails with
   BRAID_ERR_NO_MEMORY and says what to do, on every rank, without a signal. */
static int body_tiny_shm(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused, (void)n, (void)arg;
  braid_comm *c = NULL;
  braid_status st = braid_init(NULL, &c);
  if (rank == 0) {
    BT_CHECK(st == BRAID_ERR_NO_MEMORY, "rank 0: init in a tiny /dev/shm gave %s: %s", braid_status_string(st),
             braid_last_error(NULL));
    BT_CHECK_MSG(NULL, "--shm-size");
    BT_CHECK_MSG(NULL, "BRAID_SHM_BUFFER");
  } else {
    /* The others learn that rank 0 gave up: its failure, or its exit. */
    BT_CHECK(st != BRAID_OK, "rank %d: init succeeded without a segment", rank);
  }
  if (c) braid_destroy(c);
  return 0;
}

/* In a child with a private mount namespace holding a tmpfs of size_mb on
   /dev/shm; 2: the namespace cannot be made here (not root). */
static int in_small_shm(int size_mb, int (*fn)(void)) {
  pid_t p = fork();
  if (p == 0) {
    char opts[32];
    snprintf(opts, sizeof opts, "size=%dm", size_mb);
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", 0, opts) != 0) {
      fprintf(stderr, "skipped: a private /dev/shm needs a mount namespace (root): %s\n", strerror(errno));
      _exit(2);
    }
    _exit(fn() ? 1 : 0);
  }
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

static int small_case(void) {
  bt_run_opts o = {"shm", 8, 240, NULL, -1};
  return bt_run_ranks_ex(&o, body_small_shm, NULL, NULL);
}

static int tiny_case(void) {
  static const char *const env[] = {"BRAID_INIT_TIMEOUT=10", "BRAID_TIMEOUT=10", NULL};
  bt_run_opts o = {"shm", 8, 120, env, -1};
  return bt_run_ranks_manual(&o, body_tiny_shm, NULL, NULL);
}

/* A split whose child cannot start on one rank, which stays alive: /dev/shm
   is filled after init, so the child's rank 0 cannot make its segment. The
   other ranks' splits fail within a few seconds with its sentence, instead
   of waiting out BRAID_TIMEOUT for the segment. */
#define FILL_PATH "/dev/shm/braid-test-fill"

static void fill_dev_shm(void) {
  int fd = open(FILL_PATH, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return;
  off_t at = 0;
  for (off_t step = 1 << 20; step >= 4096; step /= 16)
    while (posix_fallocate(fd, at, step) == 0) at += step;
  close(fd);
}

static int body_split_start_fail(braid_comm *c, int rank, int n, void *arg) {
  _Atomic int *done = arg; /* ranks other than 0 that have checked their split */
  if (rank == 0) fill_dev_shm();
  BT_CHECK_OK(braid_barrier(c), c);
  double t0 = now_s();
  braid_comm *child = NULL;
  braid_status st = braid_split(c, 0, 0, &child);
  double t = now_s() - t0;
  if (rank == 0) {
    BT_CHECK(st == BRAID_ERR_NO_MEMORY && !child, "rank 0: split in a full /dev/shm gave %s: %s",
             braid_status_string(st), braid_last_error(c));
    BT_CHECK_MSG(c, "--shm-size");
    bt_await(done, n - 1, 60); /* alive while the others look */
    unlink(FILL_PATH);
  } else {
    atomic_fetch_add(done, 1);
    BT_CHECK(st == BRAID_ERR_PEER_LOST && !child, "rank %d: split gave %s: %s", rank, braid_status_string(st),
             braid_last_error(c));
    BT_CHECK_MSG(c, "rank 0 could not start: ");
    BT_CHECK_MSG(c, "--shm-size");
    fprintf(stderr, "fault-time: shm split-start-failure rank %d %.3f s\n", rank, t);
    BT_CHECK(t < 4.0, "rank %d's split failed after %.2f s", rank, t);
  }
  return 0;
}

static int split_fail_case(void) {
  static const char *const env[] = {"BRAID_SHM_BUFFER=64K", "BRAID_TIMEOUT=60", NULL};
  bt_run_opts o = {"shm", 3, 120, env, -1};
  _Atomic int *done = bt_shared_counter();
  BT_CHECK(done != NULL, "no shared mapping");
  int rc = bt_run_ranks_ex(&o, body_split_start_fail, (void *)done, NULL);
  bt_shared_free(done);
  return rc;
}

static int test_small_dev_shm(void) {
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8), have = 0;
  for (int b = 0; b < nb; b++) have |= !strcmp(names[b], "shm");
  if (!have) return 0;
  int rc = in_small_shm(64, small_case);
  if (rc == 2) return BT_SKIP;
  if (rc) return 1;
  if (in_small_shm(8, tiny_case)) return 1;
  return in_small_shm(16, split_fail_case) != 0;
}

/* ---------------------------------------------------------------- bad size parameters */

/* A negative, huge or overflowing BRAID_SHM_BUFFER is refused at init with
   a sentence naming the variable (it once became 2^64-1 or wrapped). */
static int body_bad_size(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused, (void)rank, (void)n, (void)arg;
  braid_comm *c = NULL;
  double t0 = now_s();
  braid_status st = braid_init(NULL, &c);
  BT_CHECK(st != BRAID_OK, "init accepted BRAID_SHM_BUFFER=\"%s\"", getenv("BRAID_SHM_BUFFER"));
  if (st == BRAID_ERR_INVALID_ARG) BT_CHECK_MSG(NULL, "BRAID_SHM_BUFFER");
  BT_CHECK(now_s() - t0 < 8.0, "the refusal took %.2f s", now_s() - t0);
  return 0;
}

static int test_bad_size_parameters(void) {
  static const char *const values[] = {"BRAID_SHM_BUFFER= -1", "BRAID_SHM_BUFFER=-1", "BRAID_SHM_BUFFER=4294967296G",
                                       "BRAID_SHM_BUFFER=17179869184G", "BRAID_SHM_BUFFER=0", "BRAID_SHM_BUFFER=1 M"};
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8), have = 0;
  for (int b = 0; b < nb; b++) have |= !strcmp(names[b], "shm");
  if (!have) return 0;
  for (size_t i = 0; i < BT_COUNT(values); i++) {
    const char *env[] = {values[i], "BRAID_INIT_TIMEOUT=5", "BRAID_TIMEOUT=5", NULL};
    bt_run_opts o = {"shm", 2, 60, env, -1};
    if (bt_run_ranks_manual(&o, body_bad_size, NULL, NULL)) {
      fprintf(stderr, "%s was not refused cleanly\n", values[i]);
      return 1;
    }
  }
  return 0;
}

/* ---------------------------------------------------------------- a rank whose start fails */

/* One rank's braid_init fails and the rank stays alive, as an application
   that catches the error does: every other rank's init fails within a few
   seconds with that rank's reason, instead of waiting out BRAID_TIMEOUT
   for a rank that will never come (nor die). A setting every rank must
   share, set on one rank only, fails every rank with INVALID_ARG naming
   it, whichever rank was first to compare. */
typedef struct start_case {
  int victim;
  const char *name, *value; /* what the victim alone sets */
  const char *want;         /* in every rank's sentence */
  int shared;               /* a setting ranks compare: any rank may be the one that finds the difference */
  int host_port;            /* > 0: rank 0 hosts the store there (it must outlive its own failure) */
  int unranked;             /* the victim cannot read its own rank: its status is BOOTSTRAP, the others' PEER_LOST */
  int unsized;              /* the same for the world size, but the others can name the victim */
} start_case;

/* Ranks of the current run whose init has returned (shared across its forks). */
static _Atomic int *start_done;

static int body_start_fail(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  const start_case *k = arg;
  if (k->host_port > 0) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", k->host_port);
    setenv("BRAID_STORE", addr, 1);
    setenv("BRAID_STORE_EXTERNAL", "0", 1);
  }
  char saved[64] = "";
  const char *was = getenv(k->name);
  if (was) snprintf(saved, sizeof saved, "%s", was);
  if (rank == k->victim) setenv(k->name, k->value, 1);
  usage before = usage_now();
  double t0 = now_s();
  braid_comm *c = NULL;
  braid_status st = braid_init(NULL, &c);
  double t = now_s() - t0;
  atomic_fetch_add(start_done, 1);
  braid_status want = !k->unranked && !k->unsized ? BRAID_ERR_INVALID_ARG
                      : rank == k->victim          ? BRAID_ERR_BOOTSTRAP
                                                   : BRAID_ERR_PEER_LOST;
  BT_CHECK(st == want && !c, "%s, %s=%s on rank %d: rank %d got %s: %s", backend_of(), k->name, k->value, k->victim,
           rank, braid_status_string(st), braid_last_error(NULL));
  BT_CHECK_MSG(NULL, k->want);
  if (rank != k->victim && !k->shared) {
    char who[64];
    if (k->unranked)
      snprintf(who, sizeof who, "a rank could not start (its rank is unknown; host ");
    else
      snprintf(who, sizeof who, "rank %d could not start: ", k->victim);
    BT_CHECK_MSG(NULL, who);
  }
  fprintf(stderr, "fault-time: %s start-failure(%s on rank %d%s) rank %d %.3f s\n", backend_of(), k->name,
          k->victim, k->host_port > 0 ? ", rank 0 hosts the store" : "", rank, t);
  BT_CHECK(t < 4.0, "%s: rank %d's init failed after %.2f s", backend_of(), rank, t);
  /* Alive (not dead to the others' pid checks) until they are done. */
  BT_CHECK(bt_await(start_done, n, 60), "rank %d: not every rank's init returned", rank);
  CHECK_NO_LEAK(before);
  /* Its variable fixed, every rank starts the next world: the rank that
     told without knowing its rank or the world size counted this one too. */
  if (k->unranked || k->unsized) {
    if (rank == k->victim) {
      if (was) setenv(k->name, saved, 1);
      else unsetenv(k->name);
    }
    BT_CHECK_OK(braid_init(NULL, &c), NULL);
    int v = 1;
    BT_CHECK_OK(braid_all_reduce(c, &v, 1, BRAID_I32, BRAID_SUM), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(v == n, "%s: sum %d in the world after the failed start, want %d", backend_of(), v, n);
    BT_CHECK_OK(braid_destroy(c), NULL);
  }
  return 0;
}

static int start_fail_on(const char *backend, int n) {
  static const char *const env[] = {"BRAID_TIMEOUT=100", "BRAID_INIT_TIMEOUT=100", NULL};
  const char *own = !strcmp(backend, "tcp") ? "BRAID_TCP_NSOCKS" : "BRAID_SHM_BUFFER";
  const char *bad = !strcmp(backend, "tcp") ? "0" : "-1";
  const char *other = !strcmp(backend, "tcp") ? "shm" : "tcp";
  start_done = bt_shared_counter();
  BT_CHECK(start_done != NULL, "no shared mapping");
  for (int i = 0; i < 13; i++) {
    start_case k = {i % 2 ? 0 : n - 1, "BRAID_ALGO", "allreduce=ring", "BRAID_ALGO differs between ranks", 1, 0, 0, 0};
    if (i >= 2) {
      k.name = own;
      k.value = bad;
      k.want = own;
      k.shared = 0;
    }
    if (i == 4) { /* a core setting, read before the backend starts */
      k.name = "BRAID_CHECK";
      k.value = "2";
      k.want = "BRAID_CHECK=\"2\"";
    }
    if (i == 5) { /* another backend */
      k = (start_case){n - 1, "BRAID_BACKEND", other, "BRAID_BACKEND differs between ranks", 1, 0, 0, 0};
    }
    if (i == 6) { /* a backend this build lacks */
      k = (start_case){n - 1, "BRAID_BACKEND", "nosuch", "unknown backend \"nosuch\"", 0, 0, 0, 0};
    }
    /* Found before the rank registers: it tells the others without meeting
       them (9: through the store rank 0 hosts, which then lingers for it). */
    if (i == 7 || i == 9) {
      k = (start_case){n - 1, "BRAID_IFNAME", "nosuchif0", "BRAID_IFNAME=\"nosuchif0\" names no network interface",
                       0, 0, 0, 0};
    }
    if (i == 8) { /* a one-rank backend */
      k = (start_case){n - 1, "BRAID_BACKEND", "self", "backend self supports world size 1 only", 0, 0, 0, 0};
    }
    if (i == 10) { /* its launcher's rank variable broken: it tells the others without a rank */
      k = (start_case){n - 1, "BRAID_RANK", "two", "BRAID_RANK=\"two\" is not an integer", 0, 0, 1, 0};
    }
    /* Its launcher's size variable broken: it tells the others without
       knowing the world they share (12: rank 0 hosts their store). */
    if (i == 11 || i == 12) {
      k = (start_case){i == 11 ? n - 1 : 1, "BRAID_WORLD_SIZE", "three", "BRAID_WORLD_SIZE=\"three\" is not an integer",
                       0, 0, 0, 1};
    }
    if (k.victim == 0 || i == 9 || i == 12) k.host_port = bt_free_port();
    atomic_store(start_done, 0);
    int before = bt_dead_shm_names(0);
    bt_run_opts o = {backend, n, 60, env, -1};
    if (bt_run_ranks_manual(&o, body_start_fail, &k, NULL)) {
      fprintf(stderr, "start failure (%s=%s on rank %d) on %s: failed\n", k.name, k.value, k.victim, backend);
      bt_shared_free(start_done);
      return 1;
    }
    BT_CHECK(bt_dead_shm_names(0) <= before, "a failed start on %s left /dev/shm names", backend);
  }
  bt_shared_free(start_done);
  return 0;
}

static int test_start_failure_reaches_peers(void) { return run_backends(3, start_fail_on); }

/* ---------------------------------------------------------------- running on every backend */

static int run_backends(int min_ranks, int (*fn)(const char *backend, int n)) {
  const char *names[8];
  int maxr[8];
  int nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++) {
    int n = min_ranks > 3 ? min_ranks : 3;
    if (maxr[b] < min_ranks) continue;
    if (maxr[b] < n) n = maxr[b];
    if (fn(names[b], n)) {
      fprintf(stderr, "fault case failed on backend %s with %d ranks\n", names[b], n);
      return 1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      {"kill_in_each_call", test_kill_in_each_call, 600},
      {"death_during_init", test_death_during_init, 300},
      {"death_during_split", test_death_during_split, 120},
      {"stopped_rank", test_stopped_rank, 120},
      {"abort_reaches_peers", test_abort_reaches_peers, 120},
      {"destroy_with_pending_work", test_destroy_with_pending_work, 120},
      {"store_killed", test_store_killed, 120},
      {"small_dev_shm", test_small_dev_shm, 300},
      BT_CASE(test_bad_size_parameters),
      {"start_failure_reaches_peers", test_start_failure_reaches_peers, 240},
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
