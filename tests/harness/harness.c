#include "harness.h"

#include "api/api.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/store.h"

int bt_rank = -1;
static int manual_init; /* bt_run_ranks_manual: bodies call braid_init themselves */

/* Every rank this process forked: /dev/shm names are counted only for
   them, so a test that kills ranks beside this one is not taken for a leak
   here. */
static pid_t *forked;
static size_t nforked, capforked;

static void note_forked(pid_t p) {
  if (nforked == capforked) {
    size_t cap = capforked ? 2 * capforked : 256;
    pid_t *np = realloc(forked, cap * sizeof *np);
    if (!np) return; /* uncounted: a leak of this rank would go unseen, never a false alarm */
    forked = np;
    capforked = cap;
  }
  forked[nforked++] = p;
}

static int was_forked(pid_t p) {
  for (size_t i = 0; i < nforked; i++)
    if (forked[i] == p) return 1;
  return 0;
}

void bt_report(const char *file, int line, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char full[sizeof msg + 256];
  if (bt_rank >= 0)
    snprintf(full, sizeof full, "[rank %d] %s:%d: %s\n", bt_rank, file, line, msg);
  else
    snprintf(full, sizeof full, "%s:%d: %s\n", file, line, msg);
  fputs(full, stderr);
  fflush(stderr);
  /* bt_main repeats these lines under its summary, where a long log's end
     shows them. */
  const char *notes = getenv("BT_NOTES");
  int fd = notes ? open(notes, O_WRONLY | O_APPEND | O_CLOEXEC) : -1;
  if (fd >= 0) {
    ssize_t w = write(fd, full, strlen(full));
    (void)w;
    close(fd);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void describe_status(char *out, size_t len, int status) {
  if (WIFEXITED(status))
    snprintf(out, len, "exited with code %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    snprintf(out, len, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else
    snprintf(out, len, "ended with wait status %d", status);
}

/* Waits for every pid until the deadline; kills the rest after it.
   status[i] receives each wait status, timed_out[i] whether we killed it. */
static void reap_all(pid_t *pids, int n, double deadline, int *status, int *timed_out) {
  int left = n;
  for (int i = 0; i < n; i++) timed_out[i] = 0;
  while (left > 0) {
    int progressed = 0;
    for (int i = 0; i < n; i++) {
      if (!pids[i]) continue;
      int st;
      pid_t r = waitpid(pids[i], &st, WNOHANG);
      if (r == pids[i]) {
        status[i] = st;
        pids[i] = 0;
        left--;
        progressed = 1;
      }
    }
    if (left == 0) break;
    if (now_s() >= deadline) {
      for (int i = 0; i < n; i++) {
        if (!pids[i]) continue;
        kill(pids[i], SIGKILL);
        int st = 0;
        while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {
        }
        status[i] = st;
        timed_out[i] = 1;
        pids[i] = 0;
      }
      break;
    }
    if (!progressed) usleep(2000);
  }
}

static void set_env_int(const char *name, int v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%d", v);
  setenv(name, buf, 1);
}

/* The store process stops when its stop pipe closes, also when the parent dies. */
int bt_store_start(bt_store *sp) {
  static int runs;
  uint8_t tok[BRAID__TOKEN_LEN];
  if (braid__token_generate(tok) != 0) {
    fprintf(stderr, "harness: cannot generate a job token\n");
    return -1;
  }
  braid__token_format(tok, sp->token_hex);
  snprintf(sp->job_id, sizeof sp->job_id, "harness.%ld.%d", (long)getpid(), ++runs);
  int portp[2], stopp[2];
  if (pipe2(portp, O_CLOEXEC) != 0) return -1;
  if (pipe2(stopp, O_CLOEXEC) != 0) {
    close(portp[0]);
    close(portp[1]);
    return -1;
  }
  fflush(NULL);
  pid_t p = fork();
  if (p < 0) {
    perror("harness: fork");
    return -1;
  }
  if (p == 0) {
    close(portp[0]);
    close(stopp[1]);
    braid__store_server *srv = NULL;
    char err[512];
    int port = -1;
    if (braid__store_server_start("127.0.0.1", 0, tok, sizeof tok, &srv, err, sizeof err) == BRAID_OK)
      port = braid__store_server_port(srv);
    else
      fprintf(stderr, "harness: cannot start the store: %s\n", err);
    ssize_t w;
    do {
      w = write(portp[1], &port, sizeof port);
    } while (w < 0 && errno == EINTR);
    close(portp[1]);
    if (port < 0) _exit(1);
    char b;
    while (read(stopp[0], &b, 1) < 0 && errno == EINTR) {
    }
    braid__store_server_stop(srv);
    _exit(0);
  }
  close(portp[1]);
  close(stopp[0]);
  sp->pid = p;
  sp->stop_fd = stopp[1];
  sp->port = -1;
  ssize_t n;
  do {
    n = read(portp[0], &sp->port, sizeof sp->port);
  } while (n < 0 && errno == EINTR);
  close(portp[0]);
  if (n != (ssize_t)sizeof sp->port || sp->port <= 0) {
    close(sp->stop_fd);
    waitpid(p, NULL, 0);
    return -1;
  }
  return 0;
}

void bt_store_stop(bt_store *sp) {
  close(sp->stop_fd);
  int st, timed_out;
  reap_all(&sp->pid, 1, now_s() + 10.0, &st, &timed_out);
}

static int rank_main(const bt_run_opts *o, int rank, bt_body body, void *arg, const bt_store *sp) {
  bt_rank = rank;
  if (!o->backend) return body(NULL, rank, o->nranks, arg) ? 1 : 0; /* harness self-tests */
  setenv("BRAID_BACKEND", o->backend, 1);
  /* hier runs as two simulated nodes with interleaved ranks, so every test
     goes through its composition; a test's own BRAID_NODE_ID wins. */
  if (!strcmp(o->backend, "hier") && o->nranks > 1) {
    char node[16];
    snprintf(node, sizeof node, "node%d", rank % 2);
    setenv("BRAID_NODE_ID", node, 1);
  }
  set_env_int("BRAID_RANK", rank);
  set_env_int("BRAID_WORLD_SIZE", o->nranks);
  if (sp) {
    char addr[64];
    close(sp->stop_fd); /* only the parent may stop the store */
    snprintf(addr, sizeof addr, "127.0.0.1:%d", sp->port);
    setenv("BRAID_STORE", addr, 1);
    setenv("BRAID_STORE_EXTERNAL", "1", 1);
    setenv("BRAID_TOKEN", sp->token_hex, 1);
    setenv("BRAID_JOB_ID", sp->job_id, 1);
    set_env_int("BRAID_LOCAL_RANK", rank);
    set_env_int("BRAID_LOCAL_SIZE", o->nranks);
    set_env_int("BT_STORE_PID", (int)sp->pid); /* fault tests kill it */
  }
  for (const char *const *e = o->env; e && *e; e++) putenv((char *)*e);
  if (manual_init) return body(NULL, rank, o->nranks, arg) ? 1 : 0;
  braid_comm *c = NULL;
  braid_status st = braid_init(NULL, &c);
  if (st != BRAID_OK) {
    bt_report(__FILE__, __LINE__, "braid_init failed: %s: %s", braid_status_string(st), braid_last_error(NULL));
    return 2;
  }
  int rc = body(c, rank, o->nranks, arg);
  st = braid_destroy(c);
  if (st != BRAID_OK) {
    bt_report(__FILE__, __LINE__, "braid_destroy failed: %s", braid_status_string(st));
    return rc ? rc : 3;
  }
  return rc ? 1 : 0;
}

int bt_run_ranks_ex(const bt_run_opts *o, bt_body body, void *arg, bt_rank_result *results) {
  int n = o->nranks;
  double timeout = o->timeout_s > 0 ? o->timeout_s : 60.0;
  pid_t *pids = calloc((size_t)n, sizeof *pids);
  int *status = calloc((size_t)n, sizeof *status);
  int *timed_out = calloc((size_t)n, sizeof *timed_out);
  if (!pids || !status || !timed_out) {
    fprintf(stderr, "harness: out of memory\n");
    exit(99);
  }
  /* Multi-rank runs with a communicator meet through a real store. */
  bt_store store, *sp = NULL;
  if (o->backend && n > 1) {
    if (bt_store_start(&store) != 0) {
      fprintf(stderr, "harness: could not start the rendezvous store\n");
      exit(99);
    }
    sp = &store;
  }
  fflush(NULL);
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    if (p < 0) {
      perror("harness: fork");
      for (int i = 0; i < r; i++) kill(pids[i], SIGKILL);
      exit(99);
    }
    if (p == 0) {
      /* The parent's bookkeeping is no business of a rank (and would show
         as a leak under valgrind). */
      free(pids);
      free(status);
      free(timed_out);
      free(forked);
      forked = NULL;
      nforked = capforked = 0;
      int rc = rank_main(o, r, body, arg, sp);
      if (braid__reqs_lost()) {
        bt_report(__FILE__, __LINE__, "rank %d: %d request(s) of destroyed communicators were never freed", r,
                  braid__reqs_lost());
        if (!rc) rc = 4;
      }
      fflush(NULL);
      _exit(rc);
    }
    pids[r] = p;
    note_forked(p);
  }
  reap_all(pids, n, now_s() + timeout, status, timed_out);
  if (sp) bt_store_stop(sp);
  int failed = 0;
  for (int r = 0; r < n; r++) {
    int ok = !timed_out[r] && WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0;
    if (results) {
      results[r].exited = WIFEXITED(status[r]);
      results[r].code = WIFEXITED(status[r]) ? WEXITSTATUS(status[r]) : WTERMSIG(status[r]);
      results[r].timed_out = timed_out[r];
    }
    if (ok) continue;
    failed = 1;
    if (r == o->expect_fail_rank) continue;
    char how[128];
    if (timed_out[r])
      snprintf(how, sizeof how, "did not finish within %g s and was killed", timeout);
    else
      describe_status(how, sizeof how, status[r]);
    fprintf(stderr, "harness: %s backend, %d ranks: rank %d %s\n", o->backend ? o->backend : "no", n, r, how);
  }
  free(pids);
  free(status);
  free(timed_out);
  return failed;
}

int bt_run_ranks_manual(const bt_run_opts *o, bt_body body, void *arg, bt_rank_result *results) {
  manual_init = 1;
  int rc = bt_run_ranks_ex(o, body, arg, results);
  manual_init = 0;
  return rc;
}

int bt_run_ranks(const char *backend, int nranks, double timeout_s, bt_body body, void *arg) {
  bt_run_opts o = {backend, nranks, timeout_s, NULL, -1};
  return bt_run_ranks_ex(&o, body, arg, NULL);
}

int bt_backends(const char **names, int *max_ranks, int cap) {
  /* The registry's names, in its order: "self, shm, ...". */
  static char built[256];
  snprintf(built, sizeof built, "%s", braid__backend_names());
  const char *want = getenv("BRAID_TEST_BACKENDS");
  int n = 0;
  for (char *save = NULL, *name = strtok_r(built, ", ", &save); name && n < cap; name = strtok_r(NULL, ", ", &save)) {
    if (want && *want) {
      /* Exact item match in the comma list. */
      size_t len = strlen(name);
      const char *p = want;
      int found = 0;
      while ((p = strstr(p, name))) {
        if ((p == want || p[-1] == ',') && (p[len] == 0 || p[len] == ',')) found = 1;
        p += len;
      }
      if (!found) continue;
    }
    const braid__backend *be = braid__backend_find(name);
    /* A backend whose world is its own (mpi) runs under its launcher, not
       on forked ranks: tests/mpi. */
    if (be && (be->caps & BRAID__CAP_OWN_WORLD)) continue;
    /* Buffers in device memory (nccl): the host-memory tests cannot use
       it; tests/unit/test_nccl.c covers it. */
    if (be && (be->caps & BRAID__CAP_DEVICE_MEM)) continue;
    names[n] = name;
    max_ranks[n] = be && (be->caps & BRAID__CAP_SINGLE_RANK) ? 1 : 16;
    n++;
  }
  return n;
}

/* The failed checks' lines of every failed case, printed again at the end. */
static void note_failure(char *sum, size_t len, const char *name, const char *notes) {
  size_t at = strlen(sum);
  if (at + 1 >= len) return;
  snprintf(sum + at, len - at, "FAILED %s\n", name);
  int fd = notes ? open(notes, O_RDONLY | O_CLOEXEC) : -1;
  if (fd < 0) return;
  char buf[2048];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  buf[n > 0 ? n : 0] = 0;
  at = strlen(sum);
  if (at + 1 < len) snprintf(sum + at, len - at, "%s", buf);
}

int bt_main(int argc, char **argv, const bt_case *cases, size_t ncases) {
  const char *filter = argc > 1 ? argv[1] : NULL;
  int passed = 0, failed = 0, skipped = 0;
  char notes[64] = "/tmp/bt_notes_XXXXXX", summary[8192] = "";
  int nfd = mkstemp(notes);
  if (nfd >= 0) {
    close(nfd);
    setenv("BT_NOTES", notes, 1);
  }
  for (size_t i = 0; i < ncases; i++) {
    if (filter && !strstr(cases[i].name, filter)) {
      skipped++;
      continue;
    }
    int noted = nfd >= 0 && truncate(notes, 0) == 0; /* else the lines above still say it */
    double timeout = cases[i].timeout_s > 0 ? cases[i].timeout_s : 120.0;
    double t0 = now_s();
    fflush(NULL);
    pid_t p = fork();
    if (p < 0) {
      perror("fork");
      if (nfd >= 0) unlink(notes);
      return 99;
    }
    if (p == 0) {
      int rc = cases[i].fn();
      fflush(NULL);
      _exit(rc == BT_SKIP ? BT_SKIP : rc ? 1 : 0);
    }
    int status = 0, timed_out = 0;
    reap_all(&p, 1, t0 + timeout, &status, &timed_out);
    double dt = now_s() - t0;
    if (!timed_out && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      printf("ok   %-40s %8.3f s\n", cases[i].name, dt);
      passed++;
    } else if (!timed_out && WIFEXITED(status) && WEXITSTATUS(status) == BT_SKIP) {
      printf("skip %-40s %8.3f s  (reason above)\n", cases[i].name, dt);
      skipped++;
    } else {
      char how[128];
      if (timed_out)
        snprintf(how, sizeof how, "timed out after %g s", timeout);
      else
        describe_status(how, sizeof how, status);
      printf("FAIL %-40s %8.3f s  (%s)\n", cases[i].name, dt, how);
      note_failure(summary, sizeof summary, cases[i].name, noted ? notes : NULL);
      failed++;
    }
    fflush(stdout);
  }
  if (nfd >= 0) {
    unlink(notes);
    unsetenv("BT_NOTES");
  }
  if (failed) printf("---- failed checks\n%s----\n", summary);
  if (skipped)
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  else
    printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define BT_SANITIZED 1
#endif
#endif
#ifndef BT_SANITIZED
#define BT_SANITIZED 0
#endif

int bt_quick(void) { return BT_SANITIZED || getenv("BRAID_TEST_QUICK") != NULL; }

/* A port below the kernel's ephemeral range: a port that bind(0) handed out
   could be taken again by any socket that connects or listens on port 0 in
   a concurrent test before the caller binds it; ports below that range are
   only ever taken by name. A random start keeps concurrent tests apart. */
int bt_free_port(void) {
  int eph_lo = 32768, fd = -1, port = -1;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d", &eph_lo) != 1) eph_lo = 32768;
    fclose(f);
  }
  int hi = eph_lo - 1, lo = hi - 8000 > 10000 ? hi - 8000 : 10000;
  char err[256];
  if (hi > lo) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned start = (unsigned)getpid() * 2654435761u ^ (unsigned)ts.tv_nsec;
    /* every address: callers may listen on the wildcard */
    if (braid__listen_range(NULL, lo, hi, (int)(start % (unsigned)(hi - lo + 1)), 1, &fd, &port, err, sizeof err) ==
        BRAID_OK) {
      close(fd);
      return port;
    }
  }
  if (braid__listen_range("127.0.0.1", 0, 0, 0, 1, &fd, &port, err, sizeof err) != BRAID_OK) return -1;
  close(fd);
  return port;
}

int bt_dead_shm_names(int count_self) {
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    unsigned uid;
    int pid;
    if (sscanf(e->d_name, "braid-%u-%d-", &uid, &pid) != 2 || pid <= 0) continue;
    if ((count_self && pid == (int)getpid()) || (was_forked(pid) && kill(pid, 0) != 0 && errno == ESRCH)) n++;
  }
  closedir(d);
  return n;
}

_Atomic int *bt_shared_counter(void) {
  _Atomic int *w = mmap(NULL, sizeof *w, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (w == MAP_FAILED) return NULL;
  atomic_init(w, 0);
  return w;
}

void bt_shared_free(_Atomic int *w) {
  if (w) munmap((void *)w, sizeof *w);
}

int bt_run_ranks_counted(const bt_run_opts *opts, bt_body body, bt_rank_result *results) {
  _Atomic int *w = bt_shared_counter();
  if (!w) {
    bt_report(__FILE__, __LINE__, "no shared mapping for the ranks' counter");
    return 1;
  }
  int rc = bt_run_ranks_ex(opts, body, (void *)w, results);
  bt_shared_free(w);
  return rc;
}

int bt_await(_Atomic int *w, int want, double timeout_s) {
  double end = now_s() + timeout_s;
  struct timespec tick = {0, 1000000L};
  while (atomic_load(w) < want) {
    if (now_s() >= end) return 0;
    nanosleep(&tick, NULL);
  }
  return 1;
}
