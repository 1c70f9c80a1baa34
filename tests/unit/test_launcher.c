/* braidrun, run as a program: the variables it sets, exit-code propagation,
   kill-on-failure, signal forwarding, ranks ending with a killed braidrun,
   --timeout, --tag-output, --backend, a two-node job on one machine, a token
   mismatch between nodes, usage errors. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/api.h"
#include "bootstrap/bootstrap.h"
#include "harness.h"
#include "os/time.h"

static char braidrun[1024], prog[1024];

static int find_binaries(void) {
  const char *dir = getenv("BRAID_TEST_BINDIR");
  if (!dir) {
    fprintf(stderr, "BRAID_TEST_BINDIR is not set (ctest sets it to the build directory)\n");
    return -1;
  }
  snprintf(braidrun, sizeof braidrun, "%s/tools/braidrun/braidrun", dir);
  snprintf(prog, sizeof prog, "%s/tests/progs/braid_testprog", dir);
  if (access(braidrun, X_OK) || access(prog, X_OK)) {
    fprintf(stderr, "missing %s or %s\n", braidrun, prog);
    return -1;
  }
  return 0;
}

/* A braidrun process with its stdout and stderr captured in files. */
typedef struct proc {
  pid_t pid;
  char out_path[64], err_path[64];
  int status;
  double elapsed;
  char out[65536], err[65536];
} proc;

static int start(proc *p, const char *const *env, const char *const *argv) {
  p->pid = 0;
  p->status = 0;
  snprintf(p->out_path, sizeof p->out_path, "/tmp/braid_launcher_out_XXXXXX");
  snprintf(p->err_path, sizeof p->err_path, "/tmp/braid_launcher_err_XXXXXX");
  int fo = mkstemp(p->out_path), fe = mkstemp(p->err_path);
  if (fo < 0 || fe < 0) return -1;
  fflush(NULL);
  p->elapsed = braid__now();
  p->pid = fork();
  if (p->pid < 0) return -1;
  if (p->pid == 0) {
    dup2(fo, 1);
    dup2(fe, 2);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    for (const char *const *e = env; e && *e; e++) putenv((char *)*e);
    execv(braidrun, (char *const *)argv);
    _exit(126);
  }
  close(fo);
  close(fe);
  return 0;
}

static void slurp(const char *path, char *buf, size_t len) {
  buf[0] = 0;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return;
  ssize_t n = read(fd, buf, len - 1);
  buf[n > 0 ? n : 0] = 0;
  close(fd);
}

/* Waits up to timeout_s (then SIGKILL); reads the output; 0 if it exited by itself. */
static int finish(proc *p, double timeout_s) {
  double end = braid__now() + timeout_s;
  int killed = 0;
  for (;;) {
    pid_t r = waitpid(p->pid, &p->status, WNOHANG);
    if (r == p->pid) break;
    if (braid__now() > end && !killed) {
      kill(p->pid, SIGKILL);
      killed = 1;
    }
    braid__sleep(0.01);
  }
  p->elapsed = braid__now() - p->elapsed;
  slurp(p->out_path, p->out, sizeof p->out);
  slurp(p->err_path, p->err, sizeof p->err);
  unlink(p->out_path);
  unlink(p->err_path);
  if (killed)
    fprintf(stderr, "braidrun did not finish within %g s\nstdout:\n%s\nstderr:\n%s\n", timeout_s, p->out, p->err);
  return killed ? -1 : 0;
}

/* Waits until the captured stdout holds n occurrences of needle. */
static int wait_output(proc *p, const char *needle, int n, double timeout_s) {
  double end = braid__now() + timeout_s;
  while (braid__now() < end) {
    slurp(p->out_path, p->out, sizeof p->out);
    int k = 0;
    for (const char *s = p->out; (s = strstr(s, needle)); s++) k++;
    if (k >= n) return 0;
    braid__sleep(0.02);
  }
  return -1;
}

static int run(proc *p, const char *const *env, const char *const *argv, double timeout_s) {
  if (start(p, env, argv)) return -1;
  return finish(p, timeout_s);
}

static int code_of(const proc *p) {
  return WIFEXITED(p->status) ? WEXITSTATUS(p->status) : 128 + WTERMSIG(p->status);
}

#define CHECK_HAS(text, ...)                                                  \
  do {                                                                        \
    char want_[512];                                                          \
    snprintf(want_, sizeof want_, __VA_ARGS__);                               \
    BT_CHECK(strstr((text), want_), "output lacks \"%s\":\n%s", want_, (text)); \
  } while (0)

static int test_variables(void) {
  proc p;
  const char *argv[] = {braidrun, "-n", "3", prog, "env", NULL};
  BT_CHECK(run(&p, NULL, argv, 20) == 0 && code_of(&p) == 0, "exit %d: %s", code_of(&p), p.err);
  for (int r = 0; r < 3; r++) {
    CHECK_HAS(p.out, "rank=%d world=3 local=%d/3 store=127.0.0.1:", r, r);
  }
  BT_CHECK(strstr(p.out, "external=1 token=64 job=braidrun-"), "%s", p.out);
  BT_CHECK(strstr(p.out, "backend=(unset)"), "no BRAID_BACKEND without --backend: %s", p.out);
  /* --backend, and braidrun's own BRAID_RANK is not passed through. */
  const char *argv2[] = {braidrun, "--backend", "self", "-n", "1", prog, "env", NULL};
  const char *env2[] = {"BRAID_RANK=7", NULL};
  BT_CHECK(run(&p, env2, argv2, 20) == 0 && code_of(&p) == 0, "exit %d: %s", code_of(&p), p.err);
  CHECK_HAS(p.out, "rank=0 world=1 local=0/1");
  CHECK_HAS(p.out, "backend=self");
  return 0;
}

static int test_exit_code(void) {
  proc p;
  const char *argv[] = {braidrun, "-n", "3", prog, "exit", "1", "5", NULL};
  BT_CHECK(run(&p, NULL, argv, 20) == 0, "finished");
  BT_CHECK(code_of(&p) == 5, "braidrun exited %d, expected rank 1's 5; stderr: %s", code_of(&p), p.err);
  CHECK_HAS(p.err, "braidrun: rank 1 exited with code 5\n");
  BT_CHECK(p.elapsed < 5, "others stopped at once (SIGTERM): %.2f s", p.elapsed);
  /* Every rank succeeding gives 0. */
  const char *ok[] = {braidrun, "-n", "2", prog, "sleep", "0", NULL};
  BT_CHECK(run(&p, NULL, ok, 20) == 0 && code_of(&p) == 0 && !p.err[0], "exit %d: %s", code_of(&p), p.err);
  return 0;
}

static int test_kill_on_failure(void) {
  proc p;
  /* Rank 2 dies by SIGKILL; rank 0 leaves on SIGTERM; rank 1 ignores SIGTERM and needs SIGKILL. */
  const char *argv[] = {braidrun, "-n", "3", "--grace", "1", prog, "selfkill", "2", "9", NULL};
  /* Rank 2 dies once every rank has its handlers (said ready), however late
     a loaded machine starts them. */
  char go[64], goenv[96];
  snprintf(go, sizeof go, "/tmp/braid_launcher_go_%d", (int)getpid());
  snprintf(goenv, sizeof goenv, "BRAID_TESTPROG_GO=%s", go);
  unlink(go);
  const char *env[] = {goenv, NULL};
  BT_CHECK(start(&p, env, argv) == 0, "start");
  int ready = wait_output(&p, "ready", 3, 15);
  int gofd = open(go, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  if (gofd >= 0) close(gofd);
  int done = finish(&p, 20);
  unlink(go);
  BT_CHECK(ready == 0, "ranks ready: %s", p.out);
  BT_CHECK(gofd >= 0, "cannot create %s", go);
  BT_CHECK(done == 0, "finished");
  BT_CHECK(code_of(&p) == 137, "exit %d, expected 128+9; stderr: %s", code_of(&p), p.err);
  CHECK_HAS(p.err, "braidrun: rank 2 killed by signal 9 (Killed)\n");
  CHECK_HAS(p.err, "braidrun: stopping the other ranks (SIGTERM, then SIGKILL after 1 s)");
  CHECK_HAS(p.out, "rank 0 got signal 15");
  CHECK_HAS(p.err, "braidrun: ranks 1 did not stop within 1 s of SIGTERM; sending SIGKILL");
  /* At least the grace; well under rank 1's 30 s, so SIGKILL ended it. */
  BT_CHECK(p.elapsed >= 1.0 && p.elapsed < 15, "grace respected: %.2f s", p.elapsed);
  return 0;
}

/* Whether pid is gone (or a zombie nobody has reaped yet). */
static int gone(long pid) {
  char path[64], st[256] = "";
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  slurp(path, st, sizeof st);
  const char *e = strrchr(st, ')');
  return !st[0] || (e && e[1] == ' ' && e[2] == 'Z');
}

/* What a rank started goes with the job, also when the rank itself has
   ended: rank 1 starts a sleep in the background and fails at once. */
static int test_leftover_children(void) {
  char dir[] = "/tmp/braid_launcher_left_XXXXXX";
  BT_CHECK(mkdtemp(dir), "mkdtemp");
  char script[512];
  snprintf(script, sizeof script,
           "sleep 60 & echo $! > %s/pid.$BRAID_RANK; if [ \"$BRAID_RANK\" = 1 ]; then exit 3; fi; wait", dir);
  const char *argv[] = {braidrun, "-n", "2", "--grace", "1", "/bin/sh", "-c", script, NULL};
  proc p;
  BT_CHECK(run(&p, NULL, argv, 30) == 0, "finished");
  BT_CHECK(code_of(&p) == 3, "exit %d, expected 3; stderr: %s", code_of(&p), p.err);
  int checked = 0;
  for (int r = 0; r < 2; r++) {
    char path[600], txt[32];
    snprintf(path, sizeof path, "%s/pid.%d", dir, r);
    slurp(path, txt, sizeof txt);
    unlink(path);
    long pid = atol(txt);
    if (pid <= 0) continue; /* rank 0 was stopped before it started one */
    double end = braid__now() + 5;
    while (!gone(pid) && braid__now() < end) braid__sleep(0.02);
    if (!gone(pid)) kill((pid_t)pid, SIGKILL);
    BT_CHECK(gone(pid), "rank %d's background process %ld outlived the job", r, pid);
    checked += r == 1;
  }
  rmdir(dir);
  BT_CHECK(checked == 1, "rank 1 wrote no pid");
  return 0;
}

static int test_signal_forwarding(void) {
  int sigs[] = {SIGINT, SIGTERM};
  for (int i = 0; i < 2; i++) {
    proc p;
    const char *argv[] = {braidrun, "-n", "3", prog, "trap", NULL};
    BT_CHECK(start(&p, NULL, argv) == 0, "start");
    BT_CHECK(wait_output(&p, "ready", 3, 15) == 0, "ranks ready: %s", p.out);
    kill(p.pid, sigs[i]);
    BT_CHECK(finish(&p, 15) == 0, "finished");
    for (int r = 0; r < 3; r++) CHECK_HAS(p.out, "rank %d got signal %d", r, sigs[i]);
    BT_CHECK(code_of(&p) == 128 + sigs[i], "exit %d; stderr: %s", code_of(&p), p.err);
    CHECK_HAS(p.err, "braidrun: got %s; forwarding it to every rank", sigs[i] == SIGINT ? "SIGINT" : "SIGTERM");
  }
  return 0;
}

/* Children of parent whose command name is comm (after their exec), from /proc. */
static int children_named(pid_t parent, const char *comm, pid_t *out, int cap) {
  DIR *d = opendir("/proc");
  if (!d) return -1;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)) && n < cap) {
    char *end;
    long pid = strtol(de->d_name, &end, 10);
    if (*end || pid <= 0) continue;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0) continue;
    ssize_t k = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (k <= 0) continue;
    buf[k] = 0;
    /* "pid (comm) state ppid ...": comm may hold spaces and parentheses. */
    char *open_paren = strchr(buf, '('), *close_paren = strrchr(buf, ')');
    char state;
    int ppid;
    if (!open_paren || !close_paren || sscanf(close_paren + 1, " %c %d", &state, &ppid) != 2) continue;
    *close_paren = 0;
    if (ppid == parent && !strcmp(open_paren + 1, comm)) out[n++] = (pid_t)pid;
  }
  closedir(d);
  return n;
}

/* braidrun killed by SIGKILL cannot forward anything: the ranks' parent-death
   signal ends them. The test process adopts the orphans (subreaper) so it can
   reap them and tell a dead rank from a live one. */
static int test_braidrun_killed(void) {
  BT_CHECK(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0, "PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
  proc p;
  const char *argv[] = {braidrun, "-n", "3", prog, "sleep", "30", NULL};
  BT_CHECK(start(&p, NULL, argv) == 0, "start");
  pid_t rk[8];
  int n = 0;
  double until = braid__now() + 15;
  while ((n = children_named(p.pid, "braid_testprog", rk, 8)) < 3 && braid__now() < until) braid__sleep(0.02);
  if (n < 3) kill(p.pid, SIGKILL);
  BT_CHECK(n == 3, "found %d of 3 running ranks of braidrun %ld", n, (long)p.pid);
  BT_CHECK(kill(p.pid, SIGKILL) == 0, "kill braidrun");
  BT_CHECK(finish(&p, 10) == 0 && WIFSIGNALED(p.status) && WTERMSIG(p.status) == SIGKILL, "braidrun killed");
  double t0 = braid__now();
  int alive = 3;
  while (alive && braid__now() - t0 < 2.0) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    alive = 0;
    for (int i = 0; i < 3; i++) alive += kill(rk[i], 0) == 0;
    if (alive) braid__sleep(0.01);
  }
  double dt = braid__now() - t0;
  for (int i = 0; i < 3; i++) { /* leave nothing behind should the check fail */
    if (kill(rk[i], SIGKILL) == 0) waitpid(rk[i], NULL, 0);
  }
  BT_CHECK(!alive, "%d of 3 ranks still ran %.1f s after braidrun was killed", alive, dt);
  return 0;
}

static int test_timeout(void) {
  proc p;
  const char *argv[] = {braidrun, "-n", "2", "--timeout", "1", "--grace", "1", prog, "sleep", "30", NULL};
  BT_CHECK(run(&p, NULL, argv, 20) == 0, "finished");
  BT_CHECK(code_of(&p) == 124, "exit %d; stderr: %s", code_of(&p), p.err);
  CHECK_HAS(p.err, "braidrun: job timed out after 1 s; ranks still running: 0 1\n");
  BT_CHECK(p.elapsed >= 1.0 && p.elapsed < 5, "took %.2f s", p.elapsed);
  return 0;
}

static int test_tag_output(void) {
  proc p;
  const char *argv[] = {braidrun, "-n", "3", "--tag-output", prog, "lines", "20", NULL};
  BT_CHECK(run(&p, NULL, argv, 20) == 0 && code_of(&p) == 0, "exit %d: %s", code_of(&p), p.err);
  int seen[3] = {0, 0, 0};
  char *save = NULL;
  for (char *line = strtok_r(p.out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    int r, i, r2;
    char tail[64] = "";
    if (sscanf(line, "[%d] rank %d line %d part A %63[^\n]", &r, &r2, &i, tail) == 4) {
      BT_CHECK(r == r2 && !strcmp(tail, "part B") && r >= 0 && r < 3, "torn or mislabelled line \"%s\"", line);
      seen[r]++;
    } else {
      BT_CHECK(sscanf(line, "[%d] rank %d no newline at the end", &r, &r2) == 2 && r == r2, "stray line \"%s\"",
               line);
    }
  }
  for (int r = 0; r < 3; r++) BT_CHECK(seen[r] == 20, "rank %d: %d of 20 lines", r, seen[r]);
  for (int r = 0; r < 3; r++) CHECK_HAS(p.err, "[%d] rank %d err 19\n", r, r);
  return 0;
}

static int test_single_node_rendezvous(void) {
  proc p;
  const char *argv[] = {braidrun, "-n", "4", prog, "boot", NULL};
  BT_CHECK(run(&p, NULL, argv, 30) == 0 && code_of(&p) == 0, "exit %d: %s", code_of(&p), p.err);
  for (int r = 0; r < 4; r++) CHECK_HAS(p.out, "rank %d of 4 joined (local %d of 4)", r, r);
  return 0;
}

/* A multi-node job on this host: a free port for node 0's store, and the
   token every node shares. */
#define JOB_TOKEN "BRAID_TOKEN=00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

static int new_master(char *master, size_t len) {
  int port = bt_free_port();
  BT_CHECK(port > 0, "port");
  snprintf(master, len, "127.0.0.1:%d", port);
  return 0;
}

static int test_two_nodes(void) {
  char master[64];
  if (new_master(master, sizeof master)) return 1;
  const char *env[] = {JOB_TOKEN, NULL};
  const char *a0[] = {braidrun, "--nnodes", "2", "--node-rank", "0", "--master", master, "-n", "2", "--tag-output",
                      prog, "boot", NULL};
  const char *a1[] = {braidrun, "--nnodes", "2", "--node-rank", "1", "--master", master, "-n", "2", "--tag-output",
                      prog, "boot", NULL};
  proc p0, p1;
  BT_CHECK(start(&p0, env, a0) == 0, "node 0");
  braid__sleep(0.2);
  BT_CHECK(start(&p1, env, a1) == 0, "node 1");
  int f0 = finish(&p0, 30), f1 = finish(&p1, 30);
  BT_CHECK(f0 == 0 && f1 == 0, "both finished (node 0 exit %d: %s)", code_of(&p0), p0.err);
  BT_CHECK(code_of(&p0) == 0, "node 0 exit %d: %s", code_of(&p0), p0.err);
  BT_CHECK(code_of(&p1) == 0, "node 1 exit %d: %s", code_of(&p1), p1.err);
  for (int r = 0; r < 2; r++) CHECK_HAS(p0.out, "[%d] rank %d of 4 joined (local %d of 2)", r, r, r);
  for (int r = 2; r < 4; r++) CHECK_HAS(p1.out, "[%d] rank %d of 4 joined (local %d of 2)", r, r, r - 2);

  /* A failure on node 1 stops node 0's ranks too. */
  if (new_master(master, sizeof master)) return 1;
  const char *b0[] = {braidrun, "--nnodes", "2", "--node-rank", "0", "--master", master, "-n", "1", prog, "trap",
                      NULL};
  const char *b1[] = {braidrun, "--nnodes", "2", "--node-rank", "1", "--master", master, "-n", "1", prog, "exit",
                      "1", "7", NULL};
  BT_CHECK(start(&p0, env, b0) == 0, "node 0");
  /* Node 0's rank traps SIGTERM before node 1 (whose rank fails 0.2 s after it starts) begins. */
  BT_CHECK(wait_output(&p0, "ready", 1, 15) == 0, "node 0's rank ready: %s", p0.out);
  BT_CHECK(start(&p1, env, b1) == 0, "node 1");
  f0 = finish(&p0, 30), f1 = finish(&p1, 30);
  BT_CHECK(f0 == 0 && f1 == 0, "both finished (node 0 exit %d: %s)", code_of(&p0), p0.err);
  BT_CHECK(code_of(&p1) == 7 && code_of(&p0) == 7, "exit codes %d and %d\n%s\n%s", code_of(&p0), code_of(&p1),
           p0.err, p1.err);
  CHECK_HAS(p1.err, "braidrun: rank 1 exited with code 7");
  CHECK_HAS(p0.err, "braidrun: stopping this node's ranks: node 1: rank 1 exited with code 7");
  CHECK_HAS(p0.out, "rank 0 got signal 15");
  return 0;
}

/* Node 1's braidrun dies (SIGKILL) while node 0, whose ranks are done,
   keeps the store up for it: node 0 says so and ends, instead of waiting
   for a node that can no longer finish. */
static int test_node_lost(void) {
  char master[64];
  if (new_master(master, sizeof master)) return 1;
  const char *env[] = {JOB_TOKEN, NULL};
  const char *a0[] = {braidrun, "--nnodes", "2", "--node-rank", "0", "--master", master, "-n", "1", prog, "sleep",
                      "2", NULL}; /* still running when node 1 joins */
  const char *a1[] = {braidrun, "--nnodes", "2", "--node-rank", "1", "--master", master, "-n", "1", prog, "trap",
                      NULL};
  proc p0, p1;
  BT_CHECK(start(&p0, env, a0) == 0, "node 0");
  braid__sleep(0.2);
  BT_CHECK(start(&p1, env, a1) == 0, "node 1");
  BT_CHECK(wait_output(&p1, "ready", 1, 15) == 0, "node 1's rank ready: %s", p1.out);
  double t0 = braid__now();
  kill(p1.pid, SIGKILL);
  finish(&p1, 10);
  int f0 = finish(&p0, 40);
  const double dt = braid__now() - t0;
  BT_CHECK(f0 == 0, "node 0 did not end after node 1's braidrun died");
  BT_CHECK(code_of(&p0) == 1, "node 0 exit %d: %s", code_of(&p0), p0.err);
  CHECK_HAS(p0.err, "braidrun: node 1's braidrun has not been heard from for 10 s");
  BT_CHECK(dt < 25, "node 0 ended %.1f s after node 1's braidrun died", dt);
  return 0;
}

static int test_token_mismatch(void) {
  char master[64];
  if (new_master(master, sizeof master)) return 1;
  const char *e0[] = {JOB_TOKEN, "BRAID_INIT_TIMEOUT=2", NULL};
  const char *e1[] = {"BRAID_TOKEN=ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100",
                      "BRAID_INIT_TIMEOUT=2", NULL};
  const char *a0[] = {braidrun, "--nnodes", "2", "--node-rank", "0", "--master", master, "-n", "1", prog, "boot",
                      NULL};
  const char *a1[] = {braidrun, "--nnodes", "2", "--node-rank", "1", "--master", master, "-n", "1", prog, "boot",
                      NULL};
  proc p0, p1;
  BT_CHECK(start(&p0, e0, a0) == 0, "node 0");
  braid__sleep(0.2);
  BT_CHECK(start(&p1, e1, a1) == 0, "node 1");
  int f1 = finish(&p1, 30), f0 = finish(&p0, 30);
  BT_CHECK(f0 == 0 && f1 == 0, "both finished (node 0 exit %d: %s)", code_of(&p0), p0.err);
  BT_CHECK(code_of(&p1) == 1, "node 1 exit %d: %s", code_of(&p1), p1.err);
  CHECK_HAS(p1.err, "braidrun: could not join the job at %s: store at %s refused the job token", master, master);
  BT_CHECK(!strstr(p1.out, "joined"), "node 1 started no rank: %s", p1.out);
  BT_CHECK(code_of(&p0) != 0, "node 0's rank cannot complete the rendezvous");
  CHECK_HAS(p0.err, "rendezvous timed out after 2 s: 1 of 2 ranks joined; missing rank 1");
  return 0;
}

static int test_usage(void) {
  proc p;
  const char *help[] = {braidrun, "--help", NULL};
  BT_CHECK(run(&p, NULL, help, 10) == 0 && code_of(&p) == 0, "--help exit %d", code_of(&p));
  const char *documented[] = {"--nproc",        "--backend",    "--timeout",        "--grace",    "--tag-output",
                              "--port",         "--nnodes",     "--node-rank",      "--master",   "--token-file",
                              "BRAID_RANK",     "BRAID_WORLD_SIZE", "BRAID_LOCAL_RANK", "BRAID_LOCAL_SIZE",
                              "BRAID_STORE",    "BRAID_TOKEN",  "BRAID_BACKEND",    "BRAID_JOB_ID", "SIGINT",
                              "Exit status",    "BRAID_INIT_TIMEOUT", "K*N + local rank", "rank 2 killed by signal 9",
                              "sends SIGTERM to the other ranks, SIGKILL after the", "status 124",
                              "node 0 hosts the store"};
  for (size_t i = 0; i < BT_COUNT(documented); i++) CHECK_HAS(p.out, "%s", documented[i]);
  /* The backends named are the ones built. */
  CHECK_HAS(p.out, "--backend NAME        set BRAID_BACKEND=NAME for every rank (built here: %s)\n",
            braid__backend_names());

  const char *tmo[] = {braidrun, "-n", "1", prog, "sleep", "0", NULL};
  const char *badtmo[] = {"BRAID_INIT_TIMEOUT=soon", NULL};
  BT_CHECK(run(&p, badtmo, tmo, 10) == 0 && code_of(&p) == 1, "bad BRAID_INIT_TIMEOUT: exit %d", code_of(&p));
  CHECK_HAS(p.err, "braidrun: BRAID_INIT_TIMEOUT=\"soon\" is not a non-negative number of seconds");

  const char *non[] = {braidrun, prog, NULL};
  BT_CHECK(run(&p, NULL, non, 10) == 0 && code_of(&p) == 2, "no -n: exit %d", code_of(&p));
  CHECK_HAS(p.err, "braidrun: -n N (ranks on this node) is required");
  const char *bad[] = {braidrun, "-n", "2", "--bogus", prog, NULL};
  BT_CHECK(run(&p, NULL, bad, 10) == 0 && code_of(&p) == 2, "unknown option: exit %d", code_of(&p));
  CHECK_HAS(p.err, "unknown option --bogus");
  const char *flagval[] = {braidrun, "--tag-output=1", "-n", "1", prog, NULL};
  BT_CHECK(run(&p, NULL, flagval, 10) == 0 && code_of(&p) == 2, "a value for a flag: exit %d", code_of(&p));
  CHECK_HAS(p.err, "braidrun: --tag-output takes no value");
  const char *missing[] = {braidrun, "-n", "1", "/nonexistent/braid-prog", NULL};
  BT_CHECK(run(&p, NULL, missing, 10) == 0 && code_of(&p) == 127, "missing program: exit %d", code_of(&p));
  const char *nf[] = {braidrun, "-n", "1", "braid-no-such-command", NULL};
  BT_CHECK(run(&p, NULL, nf, 10) == 0 && code_of(&p) == 127, "not found: exit %d", code_of(&p));
  CHECK_HAS(p.err, "braidrun: braid-no-such-command: command not found");
  /* A remote master without a shared token is refused. */
  const char *notok[] = {braidrun, "--nnodes", "2", "--master", "192.0.2.1:29500", "-n", "1", prog, NULL};
  const char *noenv[] = {"BRAID_TOKEN=", NULL};
  BT_CHECK(run(&p, noenv, notok, 10) == 0 && code_of(&p) == 1, "no token: exit %d", code_of(&p));
  CHECK_HAS(p.err, "a multi-node job needs a job token shared by every node");
  const char *nomaster[] = {braidrun, "--nnodes", "2", "-n", "1", prog, NULL};
  BT_CHECK(run(&p, NULL, nomaster, 10) == 0 && code_of(&p) == 2, "no master: exit %d", code_of(&p));
  CHECK_HAS(p.err, "--nnodes 2 needs --master HOST:PORT");
  return 0;
}

int main(int argc, char **argv) {
  if (find_binaries()) return 1;
  unsetenv("BRAID_TOKEN");
  unsetenv("BRAID_INIT_TIMEOUT");
  static const bt_case cases[] = {
      BT_CASE(test_variables),     BT_CASE(test_exit_code),   BT_CASE(test_kill_on_failure),
      BT_CASE(test_leftover_children),
      BT_CASE(test_signal_forwarding), BT_CASE(test_braidrun_killed), BT_CASE(test_timeout),
      BT_CASE(test_tag_output),
      BT_CASE(test_single_node_rendezvous), BT_CASE(test_two_nodes), BT_CASE(test_node_lost),
      BT_CASE(test_token_mismatch),
      BT_CASE(test_usage),
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
