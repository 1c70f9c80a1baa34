/* Ranks on several simulated hosts: network namespaces joined by a bridge
   (tests/net/netns.sh), one braidrun per host (--nnodes, --node-rank,
   --master), traffic only on the namespaces' veth links. The conformance
   matrix across hosts on tcp and hier, the same under a 1 Gbit/s rate limit
   and under a 1 ms delay each way, and a link taken down in the middle of
   all-reduces (every rank fails within the timeout). Needs root; reports
   skipped otherwise. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static char tag[32], script[512], braidrun[512], prog[512], delayer[512];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
}

static void down(void) { sh("bash %s down %s >/dev/null 2>&1", script, tag); }

/* K hosts (optionally rate-limited); 2: namespaces cannot be made here. */
static int up(int k, const char *rate) {
  down();
  if (sh("bash %s up %s %d %s >/tmp/%s.up.log 2>&1", script, tag, k, rate ? rate : "", tag) != 0) {
    fprintf(stderr, "skipped: network namespaces cannot be made here (root and iproute2 needed; see /tmp/%s.up.log)\n",
            tag);
    return 2;
  }
  return 0;
}

typedef struct job {
  pid_t pid[8];
  char out[8][256];
} job;

/* One braidrun per host, n ranks each, PROGRAM ARGS; env: extra
   "NAME=value ..." for every rank; every host's ranks also get
   BRAID_NODE_ID=node<host> (hier tells nodes apart by host name, and the
   namespaces share one). */
static void start(job *j, int hosts, int n, const char *backend, const char *extra, const char *args) {
  static const char token[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  int port = 29000 + (int)(getpid() % 1000);
  static int jobs; /* each job's logs apart: a failed one's stay to be read, and none holds an older job's lines */
  jobs++;
  for (int h = 0; h < hosts; h++) {
    char env[256];
    snprintf(env, sizeof env, "BRAID_NODE_ID=node%d %s", h, extra ? extra : "");
    snprintf(j->out[h], sizeof j->out[h], "/tmp/%s.%s%d.host%d.log", tag, backend, jobs, h);
    unlink(j->out[h]);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "exec bash %s exec %s %d env BRAID_TOKEN=%s %s %s --nnodes %d --node-rank %d --master 10.77.0.1:%d -n %d "
             "--backend %s --timeout 240 %s %s > %s 2>&1",
             script, tag, h, token, env, braidrun, hosts, h, port, n, backend, prog, args, j->out[h]);
    pid_t p = fork();
    if (p == 0) {
      execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
      _exit(127);
    }
    j->pid[h] = p;
  }
}

/* Exit codes of every host's braidrun (-1: killed at the deadline). */
static void finish(job *j, int hosts, double timeout, int *codes) {
  double end = now_s() + timeout;
  for (int h = 0; h < hosts; h++) {
    int st = 0;
    codes[h] = -1;
    while (now_s() < end) {
      pid_t r = waitpid(j->pid[h], &st, WNOHANG);
      if (r == j->pid[h]) {
        codes[h] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        break;
      }
      usleep(20000);
    }
    if (codes[h] == -1 && waitpid(j->pid[h], &st, WNOHANG) == 0) {
      kill(j->pid[h], SIGKILL);
      waitpid(j->pid[h], &st, 0);
    }
  }
}

static int count_in(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[4096];
  int k = 0;
  while (fgets(line, sizeof line, f)) k += strstr(line, needle) != NULL;
  fclose(f);
  return k;
}

/* The longest "netcheck: rank R: STATUS after T s" delay in a host's log
   (from a rank's last good all-reduce to its error); -1 without one. */
static double max_after(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[4096];
  double worst = -1;
  while (fgets(line, sizeof line, f)) {
    const char *p = strstr(line, "netcheck: rank");
    const char *a = p ? strstr(p, " after ") : NULL;
    double t;
    if (a && sscanf(a, " after %lf s", &t) == 1 && t > worst) worst = t;
  }
  fclose(f);
  return worst;
}

static void show(const char *path) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "tail -n 30 %s >&2", path);
  sh("%s", cmd);
}

/* The matrix on H hosts of N ranks, every rank reporting success. */
static int have(const char *backend);

/* Adds a delay of ms to every packet host h sends (tests/progs/braid_netdelay
   behind an iptables NFQUEUE rule); its log is /tmp/TAG.delayH.log. */
static int add_delay(int h, int ms) {
  char log[256];
  snprintf(log, sizeof log, "/tmp/%s.delay%d.log", tag, h);
  if (sh("bash %s delay %s %d %d %s %s >/tmp/%s.delay.log 2>&1", script, tag, h, ms, delayer, log, tag) != 0) {
    fprintf(stderr, "host %d: the delay could not be set up:\n", h);
    sh("cat /tmp/%s.delay.log %s >&2", tag, log);
    return 1;
  }
  return 0;
}

/* What host h's delay helper held (after down()): packets, and the
   shortest hold in ms; 0 packets when it printed nothing. */
static void delay_counts(int h, unsigned long long *n, double *min_ms) {
  char path[256], line[512];
  snprintf(path, sizeof path, "/tmp/%s.delay%d.log", tag, h);
  *n = 0;
  *min_ms = 0;
  FILE *f = fopen(path, "r");
  if (!f) return;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "netdelay: queue %*d: %llu packets held, min %lf", n, min_ms) == 2) break;
  fclose(f);
}

static int matrix_on(int hosts, int n, const char *backend, const char *rate, int delay_ms) {
  if (!have(backend)) return 0;
  int rc = up(hosts, rate);
  if (rc) return rc == 2 ? BT_SKIP : 1;
  for (int h = 0; h < hosts && delay_ms; h++)
    if (add_delay(h, delay_ms)) {
      down();
      return 1;
    }
  job j;
  start(&j, hosts, n, backend, "BRAID_TIMEOUT=120", "matrix");
  int codes[8];
  finish(&j, hosts, 600, codes);
  int bad = 0;
  for (int h = 0; h < hosts; h++) {
    int ok = count_in(j.out[h], "matrix ok");
    if (codes[h] != 0 || ok != n) {
      fprintf(stderr, "%s, %d hosts x %d ranks%s%s: host %d exited %d with %d ranks ok\n", backend, hosts, n,
              rate ? " at " : "", rate ? rate : "", h, codes[h], ok);
      show(j.out[h]);
      bad = 1;
    }
  }
  down();
  /* The delay was on the path: every host's helper held the job's packets
     for at least the delay. */
  for (int h = 0; h < hosts && delay_ms; h++) {
    unsigned long long held;
    double min_ms;
    delay_counts(h, &held, &min_ms);
    BT_CHECK(held >= 100 && min_ms >= delay_ms, "%s: host %d's delay held %llu packets, the shortest %.3f ms (want "
             ">= 100 packets, >= %d ms)", backend, h, held, min_ms, delay_ms);
    printf("  %s: host %d's link held %llu packets for %.3f ms or more\n", backend, h, held, min_ms);
  }
  return bad;
}

static int test_tcp_across_hosts(void) { return matrix_on(2, 2, "tcp", NULL, 0); }
static int test_tcp_three_hosts(void) { return matrix_on(3, 1, "tcp", NULL, 0); }
static int test_hier_across_hosts(void) { return matrix_on(2, 2, "hier", NULL, 0); }
static int test_rate_limited(void) {
  int rc = matrix_on(2, 2, "tcp", "1gbit", 0);
  return rc ? rc : matrix_on(2, 2, "hier", "1gbit", 0);
}

/* Host 1's link goes down while every rank is in all-reduces: every rank
   (on both hosts) fails within BRAID_TIMEOUT plus the checks' period. */
static int link_down_on(const char *backend) {
  if (!have(backend)) return 0;
  int rc = up(2, NULL);
  if (rc) return rc == 2 ? BT_SKIP : 1;
  job j;
  /* A rank reports within BRAID_TIMEOUT plus a check's period, well before
     host 1's braidrun stops its ranks for want of the store (10 s). */
  start(&j, 2, 2, backend, "BRAID_TIMEOUT=2", "loop 60");
  /* Cut only once every rank is in its all-reduce loop. */
  for (double end = now_s() + 60; now_s() < end; usleep(20000))
    if (count_in(j.out[0], ": looping") + count_in(j.out[1], ": looping") == 4) break;
  usleep(200000);
  sh("bash %s link %s 1 down", script, tag);
  /* The hosts cannot talk any more: each rank reports on its own, and host
     0's braidrun waits for a node it cannot hear from until it is killed. */
  int codes[8];
  finish(&j, 2, 30, codes);
  int failed = 0;
  double took = 0;
  for (int h = 0; h < 2; h++) {
    failed += count_in(j.out[h], "netcheck: rank") - count_in(j.out[h], "no failure") -
              count_in(j.out[h], ": looping");
    double t = max_after(j.out[h]);
    if (t > took) took = t;
  }
  down();
  BT_CHECK(failed == 4, "%s: %d of 4 ranks reported the failure (see %s, %s)", backend, failed, j.out[0], j.out[1]);
  BT_CHECK(took < 2 + 15, "%s: a rank took %.1f s after its last good all-reduce to report the failure (see %s, %s)",
           backend, took, j.out[0], j.out[1]);
  printf("  %s: every rank reported the lost link within %.1f s of its last good all-reduce\n", backend, took);
  return 0;
}

static int test_link_down(void) {
  int rc = link_down_on("tcp");
  return rc ? rc : link_down_on("hier");
}

/* A 1 ms delay each way on every host's link (netem's "delay 1ms" on each
   host, which many kernels lack; here the delay helper, which needs
   libnetfilter-queue at build time and iptables at run time). */
static int test_delay(void) {
  if (access(delayer, X_OK) != 0) {
    fprintf(stderr, "skipped: %s was not built (install libnetfilter-queue-dev and reconfigure)\n", delayer);
    return BT_SKIP;
  }
  if (sh("command -v iptables-legacy >/dev/null 2>&1 || command -v iptables >/dev/null 2>&1") != 0) {
    fprintf(stderr, "skipped: the delay needs iptables (Debian package iptables)\n");
    return BT_SKIP;
  }
  int rc = matrix_on(2, 2, "tcp", NULL, 1);
  return rc ? rc : matrix_on(2, 2, "hier", NULL, 1);
}

/* Namespaces a killed run left behind (its tag names its pid, which is
   gone): removed, with the processes inside them, before this run. */
static void remove_stale(void) {
  FILE *f = popen("ip netns list 2>/dev/null", "r");
  if (!f) return;
  char line[256];
  int stale[64], ns = 0;
  while (fgets(line, sizeof line, f)) {
    int pid = 0, k = 0;
    if (sscanf(line, "bt%d-%n", &pid, &k) != 1 || k == 0 || pid <= 0 || pid == (int)getpid()) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    int seen = 0;
    for (int i = 0; i < ns; i++) seen |= stale[i] == pid;
    if (!seen && ns < 64) stale[ns++] = pid;
  }
  pclose(f);
  for (int i = 0; i < ns; i++) sh("bash %s down bt%d >/dev/null 2>&1", script, stale[i]);
}

static int have(const char *backend) {
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++)
    if (!strcmp(names[b], backend)) return 1;
  return 0;
}

int main(int argc, char **argv) {
  const char *bindir = getenv("BRAID_TEST_BINDIR");
  const char *srcdir = getenv("BRAID_TEST_SRCDIR");
  if (!bindir || !srcdir) {
    fprintf(stderr, "test_net: BRAID_TEST_BINDIR and BRAID_TEST_SRCDIR must be set (ctest sets them)\n");
    return 1;
  }
  snprintf(tag, sizeof tag, "bt%d", (int)getpid());
  snprintf(script, sizeof script, "%s/tests/net/netns.sh", srcdir);
  snprintf(braidrun, sizeof braidrun, "%s/tools/braidrun/braidrun", bindir);
  snprintf(prog, sizeof prog, "%s/tests/progs/braid_netcheck", bindir);
  snprintf(delayer, sizeof delayer, "%s/tests/progs/braid_netdelay", bindir);
  if (!have("tcp")) {
    printf("test_net: the tcp backend is not built; nothing to test\n");
    return 0;
  }
  remove_stale();
  static const bt_case cases[] = {
      {"tcp_across_hosts", test_tcp_across_hosts, 700},
      {"tcp_three_hosts", test_tcp_three_hosts, 700},
      {"hier_across_hosts", test_hier_across_hosts, 700},
      {"rate_limited", test_rate_limited, 1300},
      {"link_down", test_link_down, 300},
      {"delay", test_delay, 700},
  };
  int rc = bt_main(argc, argv, cases, BT_COUNT(cases));
  down();
  return rc;
}
