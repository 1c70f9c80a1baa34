/*
 * One program, several behaviours, for the braidrun tests:
 *   env               print the launcher variables
 *   exit R CODE       rank R exits with CODE after a moment; the others sleep
 *   selfkill R SIG    rank R kills itself with SIG; rank 0 reports SIGTERM and
 *                     exits; the other ranks ignore SIGTERM
 *   trap              report SIGINT/SIGTERM ("rank R got signal N") and exit 0
 *   sleep S           sleep S seconds
 *   lines N           N lines on stdout, each written in two pieces, and N on stderr
 *   boot              rendezvous through the store (bootstrap layer) and report
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "os/time.h"

static int rank;

static const char *var(const char *name) {
  const char *v = getenv(name);
  return v ? v : "(unset)";
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) {
    ssize_t w = write(1, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
    (void)w;
  }
}

static void on_signal(int sig) {
  char buf[64];
  int n = snprintf(buf, sizeof buf, "rank %d got signal %d\n", rank, sig);
  ssize_t w = write(1, buf, (size_t)n);
  (void)w;
  _exit(0);
}

static void trap_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

static void idle(double s) {
  double end = braid__now() + s;
  while (braid__now() < end) braid__sleep(0.05);
}

static int boot(void) {
  braid__launch_env e;
  char err[512];
  if (braid__env_detect(braid__env_getenv, NULL, NULL, BRAID__ENV_REQUIRE_STORE, &e, err, sizeof err)) {
    fprintf(stderr, "rank %d: %s\n", rank, err);
    return 1;
  }
  braid__boot *b = NULL;
  if (braid__bootstrap_world(e.rank, e.world_size, &e, &b, err, sizeof err)) {
    fprintf(stderr, "rank %d: %s\n", rank, err);
    return 1;
  }
  say("rank %d of %d joined (local %d of %d)\n", b->rank, b->size, b->local_rank, b->local_size);
  braid__bootstrap_free(b, 10.0);
  return 0;
}

int main(int argc, char **argv) {
  rank = atoi(var("BRAID_RANK"));
  const char *mode = argc > 1 ? argv[1] : "env";
  if (!strcmp(mode, "env")) {
    const char *tok = getenv("BRAID_TOKEN");
    say("rank=%s world=%s local=%s/%s store=%s external=%s token=%zu job=%s backend=%s\n", var("BRAID_RANK"),
        var("BRAID_WORLD_SIZE"), var("BRAID_LOCAL_RANK"), var("BRAID_LOCAL_SIZE"), var("BRAID_STORE"),
        var("BRAID_STORE_EXTERNAL"), tok ? strlen(tok) : 0, var("BRAID_JOB_ID"), var("BRAID_BACKEND"));
    return 0;
  }
  if (!strcmp(mode, "exit") && argc > 3) {
    if (rank == atoi(argv[2])) {
      idle(0.2);
      return atoi(argv[3]);
    }
    idle(30);
    return 0;
  }
  if (!strcmp(mode, "selfkill") && argc > 3) {
    if (rank == 0) trap_signals();
    else if (rank != atoi(argv[2])) signal(SIGTERM, SIG_IGN);
    say("rank %d ready\n", rank);
    if (rank == atoi(argv[2])) {
      /* BRAID_TESTPROG_GO names a file the test makes once every rank said
         ready (its handlers are in place); without it, 0.3 s. */
      const char *go = getenv("BRAID_TESTPROG_GO");
      for (int i = 0; go && i < 3000 && access(go, F_OK) != 0; i++) braid__sleep(0.01);
      idle(go ? 0.05 : 0.3);
      raise(atoi(argv[3]));
    }
    idle(30);
    return 0;
  }
  if (!strcmp(mode, "trap")) {
    trap_signals();
    say("rank %d ready\n", rank);
    idle(30);
    return 3;
  }
  if (!strcmp(mode, "sleep") && argc > 2) {
    idle(atof(argv[2]));
    return 0;
  }
  if (!strcmp(mode, "lines") && argc > 2) {
    int n = atoi(argv[2]);
    for (int i = 0; i < n; i++) {
      say("rank %d line %d part A ", rank, i);
      braid__sleep(0.001);
      say("part B\n");
      fprintf(stderr, "rank %d err %d\n", rank, i);
    }
    say("rank %d no newline at the end", rank);
    return 0;
  }
  if (!strcmp(mode, "boot")) return boot();
  fprintf(stderr, "braid_testprog: unknown mode %s\n", mode);
  return 2;
}
