/* The flight recorder: on a timeout every rank writes its last operations
   to BRAID_TRACE_FILE, braid-trace reads all of them and names the rank the
   others waited for; the timeout sentence names the collective and the
   ranks that had not entered it; SIGUSR1 dumps on demand. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static char dir[256];

static int file_has(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

/* Rank 2 stays out of the sixth collective (it waits until the others
   have timed out in it, arg counting them, then leaves). */
static int body_laggard(braid_comm *c, int rank, int n, void *arg) {
  _Atomic int *gave_up = arg;
  float x[16] = {0};
  for (int i = 0; i < 5; i++) BT_CHECK_OK(braid_all_reduce(c, x, 16, BRAID_F32, BRAID_SUM), c);
  if (rank == 2) {
    BT_CHECK(bt_await(gave_up, n - 1, 60), "the others never gave up");
    return 0;
  }
  braid_status st = braid_all_reduce(c, x, 16, BRAID_F32, BRAID_SUM);
  atomic_fetch_add(gave_up, 1);
  BT_CHECK(st == BRAID_ERR_TIMEOUT || st == BRAID_ERR_PEER_LOST, "rank %d got %s: %s", rank,
           braid_status_string(st), braid_last_error(c));
  if (st == BRAID_ERR_TIMEOUT) {
    /* The op, its number, and who never came. */
    BT_CHECK_MSG(c, "#6");
    BT_CHECK_MSG(c, "not in collective #6: rank 2");
  }
  return 0;
}

static int test_dump_and_read(void) {
  char env_file[300];
  snprintf(env_file, sizeof env_file, "BRAID_TRACE_FILE=%s/trace-%%r.jsonl", dir);
  /* hier on one node: see stop_on in test_fault.c. */
  const char *env[] = {env_file, "BRAID_TIMEOUT=0.5", "BRAID_NODE_ID=n0", NULL};
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++) {
    if (maxr[b] < 3) continue;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -f %s/trace-*.jsonl", dir);
    BT_CHECK(system(cmd) == 0, "clean up");
    bt_run_opts o = {names[b], 3, 60, env, -1};
    if (bt_run_ranks_counted(&o, body_laggard, NULL)) return 1;
    char path[300];
    for (int r = 0; r < 2; r++) {
      snprintf(path, sizeof path, "%s/trace-%d.jsonl", dir, r);
      BT_CHECK(file_has(path, "\"type\":\"header\""), "%s: rank %d wrote no dump", names[b], r);
      BT_CHECK(file_has(path, "\"seq\":6,\"op\":\"allreduce\""), "%s: rank %d's dump lacks collective #6", names[b],
               r);
      BT_CHECK(file_has(path, "\"state\":\"failed\""), "%s: rank %d's dump does not show the failed call", names[b],
               r);
    }
    /* braid-trace names rank 2 as the one the others waited for. */
    const char *bindir = getenv("BRAID_TEST_BINDIR");
    BT_CHECK(bindir != NULL, "BRAID_TEST_BINDIR unset");
    snprintf(cmd, sizeof cmd, "%s/tools/braid-trace/braid-trace %s/trace-*.jsonl > %s/report.txt 2>&1", bindir, dir,
             dir);
    BT_CHECK(system(cmd) == 0, "braid-trace failed");
    snprintf(path, sizeof path, "%s/report.txt", dir);
    BT_CHECK(file_has(path, "the others wait in collective #6; not there: rank 2 (at #5)"),
             "%s: braid-trace did not name rank 2 (see %s)", names[b], path);
  }
  return 0;
}

/* Rank 1 aborts before any rank made a call (on tcp no socket is open yet,
   so its notice must first connect); the others leave at once after it
   returned. Each still leaves its dump behind: a failing rank writes to
   the store before it tells its peers, and destroy reads it there. */
static int body_abort_then_leave(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  _Atomic int *aborted = arg;
  if (rank == 1) {
    BT_CHECK_OK(braid_abort(c), c);
    atomic_store(aborted, 1);
    return 0;
  }
  BT_CHECK(bt_await(aborted, 1, 60), "rank 1 never aborted");
  return 0;
}

static int test_dump_on_leave(void) {
  char env_file[300];
  snprintf(env_file, sizeof env_file, "BRAID_TRACE_FILE=%s/leave-%%r.jsonl", dir);
  const char *env[] = {env_file, "BRAID_NODE_ID=n0", NULL};
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++) {
    if (maxr[b] < 3) continue;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -f %s/leave-*.jsonl", dir);
    BT_CHECK(system(cmd) == 0, "clean up");
    bt_run_opts o = {names[b], 3, 60, env, -1};
    if (bt_run_ranks_counted(&o, body_abort_then_leave, NULL)) return 1;
    char path[300];
    for (int r = 0; r < 3; r += 2) {
      snprintf(path, sizeof path, "%s/leave-%d.jsonl", dir, r);
      BT_CHECK(file_has(path, "\"reason\":\"peer failed\""), "%s: rank %d left no dump after rank 1 aborted",
               names[b], r);
    }
  }
  return 0;
}

/* SIGUSR1 with BRAID_TRACE_SIGNAL=1: each rank dumps at its next call. */
static int body_signal(braid_comm *c, int rank, int n, void *arg) {
  (void)n, (void)arg;
  float x = 1;
  BT_CHECK_OK(braid_all_reduce(c, &x, 1, BRAID_F32, BRAID_SUM), c);
  BT_CHECK_OK(braid_broadcast(c, &x, 1, BRAID_F32, 0), c);
  raise(SIGUSR1);
  BT_CHECK_OK(braid_barrier(c), c);
  char path[300];
  snprintf(path, sizeof path, "%s/sig-%d.jsonl", dir, rank);
  BT_CHECK(file_has(path, "\"reason\":\"signal\""), "no dump on SIGUSR1");
  BT_CHECK(file_has(path, "\"op\":\"broadcast\""), "the dump lacks the broadcast");
  return 0;
}

static int test_signal_dump(void) {
  char env_file[300];
  snprintf(env_file, sizeof env_file, "BRAID_TRACE_FILE=%s/sig-%%r.jsonl", dir);
  const char *env[] = {env_file, "BRAID_TRACE_SIGNAL=1", NULL};
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++) {
    int n = maxr[b] < 2 ? maxr[b] : 2;
    bt_run_opts o = {names[b], n, 60, env, -1};
    if (bt_run_ranks_ex(&o, body_signal, NULL, NULL)) return 1;
  }
  return 0;
}

/* Rank 0's barrier cannot finish its own sync (a receive nobody sends):
   its dump shows it in that barrier (collective #1), and rank 1's timeout
   does not say rank 0 had not entered it. The dump shows the receive that
   never completed as started, and the one before it, which completed after
   it was posted, as done; braid-trace lists the first one. */
static int body_barrier_sync(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  /* hier's parts number their own collectives, and a part's barrier starts
     only after hier's sync: there the part's sentence is right to say so. */
  const int parts = !strcmp(braid_backend(c), "hier");
  int x = 0, y = 0, six = 6;
  if (rank == 0) {
    BT_CHECK_OK(braid_recv(c, &y, 1, BRAID_I32, 1, 6), c);
    BT_CHECK_OK(braid_recv(c, &x, 1, BRAID_I32, 1, 7), c);
    bt_await((_Atomic int *)arg, 1, 30); /* the message of tag 6 is sent after its receive was posted */
  } else if (rank == 1) {
    BT_CHECK_OK(braid_send(c, &six, 1, BRAID_I32, 0, 6), c);
    atomic_store((_Atomic int *)arg, 1);
  }
  braid_status st = braid_barrier(c);
  BT_CHECK(st == BRAID_ERR_TIMEOUT || st == BRAID_ERR_PEER_LOST, "rank %d got %s: %s", rank, braid_status_string(st),
           braid_last_error(c));
  if (rank == 1 && st == BRAID_ERR_TIMEOUT && !parts) {
    const char *e = braid_last_error(c);
    BT_CHECK(!strstr(e, "not in collective #1: rank 0"), "rank 1 says rank 0 was not in the barrier: %s", e);
  }
  return 0;
}

static int test_barrier_sync_dump(void) {
  char env_file[300];
  snprintf(env_file, sizeof env_file, "BRAID_TRACE_FILE=%s/bar-%%r.jsonl", dir);
  /* Long enough for a rank without call logs (tcp) to publish where it
     waits (after a second) before the other's sentence is written. */
  const char *env[] = {env_file, "BRAID_TIMEOUT=3", NULL};
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++) {
    if (maxr[b] < 2) continue;
    char path[300];
    snprintf(path, sizeof path, "%s/bar-1.jsonl", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/bar-0.jsonl", dir);
    unlink(path);
    bt_run_opts o = {names[b], 2, 60, env, -1};
    if (bt_run_ranks_counted(&o, body_barrier_sync, NULL)) return 1;
    BT_CHECK(file_has(path, "\"seq\":1,\"op\":\"barrier\""), "%s: rank 0's dump lacks the barrier it waited in",
             names[b]);
    BT_CHECK(file_has(path, "\"peer\":1,\"tag\":7,\"algo\":\"-\",\"state\":\"started\""),
             "%s: rank 0's dump does not show the receive that never completed as started", names[b]);
    BT_CHECK(file_has(path, "\"peer\":1,\"tag\":6,\"algo\":\"-\",\"state\":\"done\""),
             "%s: rank 0's dump does not show the completed receive as done", names[b]);
    char cmd[1024], report[300];
    snprintf(report, sizeof report, "%s/bar-report.txt", dir);
    snprintf(cmd, sizeof cmd, "%s/tools/braid-trace/braid-trace %s/bar-*.jsonl > %s 2>&1", getenv("BRAID_TEST_BINDIR"),
             dir, report);
    BT_CHECK(getenv("BRAID_TEST_BINDIR") && system(cmd) == 0, "braid-trace failed");
    BT_CHECK(file_has(report, "not complete: recv from rank 1 (tag 7, 1 x i32)"),
             "%s: braid-trace does not list rank 0's unfinished receive (see %s)", names[b], report);
    BT_CHECK(!file_has(report, "tag 6"), "%s: braid-trace lists the completed receive (see %s)", names[b], report);
  }
  return 0;
}

int main(int argc, char **argv) {
  snprintf(dir, sizeof dir, "/tmp/braid-trace-test-%d", (int)getpid());
  mkdir(dir, 0700);
  static const bt_case cases[] = {BT_CASE(test_dump_and_read), BT_CASE(test_signal_dump),
                                  BT_CASE(test_dump_on_leave),
                                  BT_CASE(test_barrier_sync_dump)};
  int rc = bt_main(argc, argv, cases, BT_COUNT(cases));
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) rc = 1;
  return rc;
}
