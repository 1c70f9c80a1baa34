/*
 * braid test harness.
 *
 * Two levels:
 *  - bt_main() runs a table of test cases, each in its own forked process with
 *    a timeout, and prints "N passed, N failed" (ctest runs one binary per file).
 *  - bt_run_ranks() runs one body on N ranks as real forked processes that each
 *    call braid_init(NULL, ...) with the launcher variables set, with a per-run
 *    timeout, and reports which rank failed, where, and how (exit code, signal,
 *    timeout).
 *
 * Checks print "[rank R] file:line: ..." and make the body return 1.
 */
#ifndef BRAID_TEST_HARNESS_H
#define BRAID_TEST_HARNESS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "braid.h"

/* Rank of this process in the current bt_run_ranks run; -1 outside one. */
extern int bt_rank;

void bt_report(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define BT_CHECK(cond, ...)                                                     \
  do {                                                                          \
    if (!(cond)) {                                                              \
      bt_report(__FILE__, __LINE__, "check failed: %s", #cond);                 \
      bt_report(__FILE__, __LINE__, "  " __VA_ARGS__);                          \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

/* Expects a given status; on mismatch prints both and braid_last_error. */
#define BT_CHECK_ST(expr, want, comm)                                           \
  do {                                                                          \
    braid_status bt_st_ = (expr);                                               \
    if (bt_st_ != (want)) {                                                     \
      bt_report(__FILE__, __LINE__, "%s returned %s, expected %s; last error: %s", #expr, \
                braid_status_string(bt_st_), braid_status_string(want),         \
                braid_last_error(comm));                                        \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

#define BT_CHECK_OK(expr, comm) BT_CHECK_ST(expr, BRAID_OK, comm)

/* Expects the last error of comm (or of this thread, comm NULL) to contain needle. */
#define BT_CHECK_MSG(comm, needle)                                              \
  do {                                                                          \
    const char *bt_m_ = braid_last_error(comm);                                 \
    if (!strstr(bt_m_, (needle))) {                                             \
      bt_report(__FILE__, __LINE__, "last error \"%s\" lacks \"%s\"", bt_m_, (needle)); \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

typedef int (*bt_body)(braid_comm *c, int rank, int size, void *arg);

typedef struct bt_run_opts {
  const char *backend; /* BRAID_BACKEND for every rank; NULL: no communicator (body gets NULL) */
  int nranks;
  double timeout_s;    /* whole run; 0: 60 s */
  const char *const *env; /* extra "NAME=value" strings set in every rank, NULL-terminated; may be NULL */
  int expect_fail_rank; /* >= 0: that rank is expected to fail (harness self-tests); -1 normally */
} bt_run_opts;

/* Outcome of one rank, filled by bt_run_ranks_ex. */
typedef struct bt_rank_result {
  int exited;      /* 1: exited with code; 0: killed by signal */
  int code;        /* exit code or signal number */
  int timed_out;   /* 1 if the harness killed it at the timeout */
} bt_rank_result;

/* Like bt_run_ranks_ex, but each rank gets the launcher environment and a
   NULL communicator: the body calls braid_init itself (faults during init). */
int bt_run_ranks_manual(const bt_run_opts *opts, bt_body body, void *arg, bt_rank_result *results);

/* Runs body on every rank; returns 0 when every rank's body returned 0, else 1
   after printing which ranks failed and how. */
int bt_run_ranks(const char *backend, int nranks, double timeout_s, bt_body body, void *arg);
/* Same with options; results (array of nranks, may be NULL) receives each rank's outcome. */
int bt_run_ranks_ex(const bt_run_opts *opts, bt_body body, void *arg, bt_rank_result *results);

/*
 * A rendezvous store (token-protected, loopback, kernel-chosen port) in its
 * own forked process. bt_run_ranks_ex starts one for every run with a backend
 * and more than one rank, and gives each rank BRAID_STORE, BRAID_TOKEN,
 * BRAID_STORE_EXTERNAL=1, BRAID_JOB_ID, BRAID_LOCAL_RANK and BRAID_LOCAL_SIZE
 * (opts->env may override them), and BT_STORE_PID (the store's process). A process rather than a thread, so ranks
 * fork from a single-threaded parent: they run the body without exec.
 */
typedef struct bt_store {
  pid_t pid;
  int stop_fd; /* write end of the stop pipe; closing it stops the store */
  int port;
  char token_hex[65];
  char job_id[64];
} bt_store;

/* 0 on success; call before forking ranks. */
int bt_store_start(bt_store *s);
void bt_store_stop(bt_store *s);

/* Backends the rank tests run on, from BRAID_TEST_BACKENDS (comma list) or
   every built backend; *max_ranks[i] is the largest world size each supports
   (1 for self). Returns the count. */
int bt_backends(const char **names, int *max_ranks, int cap);

/* A case returns BT_SKIP (after printing why) when something it needs is
   missing on this machine; bt_main counts it as skipped, not failed. */
#define BT_SKIP 77

typedef struct bt_case {
  const char *name;
  int (*fn)(void); /* 0 = pass */
  double timeout_s; /* 0: 120 s */
} bt_case;

#define BT_CASE(fn) {#fn, fn, 0}
#define BT_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Runs the cases (argv[1] optionally filters by substring), each in a forked
   child with its timeout; prints one line per case and "N passed, N failed". */
int bt_main(int argc, char **argv, const bt_case *cases, size_t ncases);

/* 1 under a sanitizer (slow) or with BRAID_TEST_QUICK set: tests scale
   their sizes down. */
int bt_quick(void);

/* A free loopback port: bound, read back, released (-1 if none). */
int bt_free_port(void);

/* /dev/shm names braid-<uid>-<pid>-* whose creator, a rank this process
   forked, has exited, or (with count_self) that this process created:
   between runs, only leaks. Other tests' ranks are not counted. */
int bt_dead_shm_names(int count_self);

/* A counter shared by the ranks a run forks (a shared anonymous mapping
   made before they fork), starting at 0: tests order steps of different
   ranks by it rather than by sleeps, which a loaded machine outlasts. NULL
   if it cannot be mapped; bt_shared_free releases it after the run. */
_Atomic int *bt_shared_counter(void);
void bt_shared_free(_Atomic int *w);
/* bt_run_ranks_ex with a fresh shared counter (at 0) as the bodies' arg;
   1 (reported) when the counter cannot be mapped. */
int bt_run_ranks_counted(const bt_run_opts *opts, bt_body body, bt_rank_result *results);

/* Waits until *w >= want, polling every millisecond, for at most timeout_s
   seconds; 1 if it got there. Works across threads and across forks. */
int bt_await(_Atomic int *w, int want, double timeout_s);

/* Deterministic pseudo-random generator for test inputs. */
static inline unsigned long long bt_rand(unsigned long long *state) {
  unsigned long long x = *state += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

#endif
