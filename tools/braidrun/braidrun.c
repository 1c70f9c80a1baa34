/*
 * braidrun: starts the ranks of a braid job on this machine, hosts the
 * rendezvous store, and supervises the ranks: the first failure stops the
 * job, signals reach every rank, --timeout ends a hung job. Several braidrun
 * processes (one per node) form a multi-node job around node 0's store.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/api.h"
#include "braidrun_opts.h"
#include "bootstrap/env.h"
#include "bootstrap/store.h"
#include "core/params.h"
#include "os/time.h"

extern char **environ;

#define LINE_MAX_BYTES 65536 /* longer output lines are split */
#define POLL_MS 100          /* also how often other nodes' news is checked */

/* Help, in parts around the lines that print this build's values: the backends
   built here and the BRAID_INIT_TIMEOUT default of the parameter list. */
static const char usage_head[] =
    "Usage: braidrun -n N [options] [--] PROGRAM [ARGS...]\n"
    "\n"
    "Starts N ranks of PROGRAM on this machine, hosts the rendezvous store they\n"
    "meet at, and supervises them.\n"
    "\n"
    "Options:\n"
    "  -n, --nproc N         ranks to start on this node (required)\n";
static const char usage_text[] =
    "  --timeout S           end the job after S seconds (decimals allowed): braidrun\n"
    "                        prints \"job timed out after S s; ranks still running: ...\",\n"
    "                        stops the ranks and exits with status 124\n"
    "  --grace S             seconds between SIGTERM and SIGKILL when stopping ranks\n"
    "                        (default 3)\n"
    "  --tag-output          prefix every line a rank prints with \"[RANK] \" (whole\n"
    "                        lines only: ranks' lines never interleave mid-line)\n"
    "  --port P              single node: store port (default: any free port)\n"
    "  --nnodes M            number of nodes in the job (default 1)\n"
    "  --node-rank K         this node's index, 0 to M-1 (default 0)\n"
    "  --master HOST:PORT    store address; node 0 hosts the store there, the other\n"
    "                        nodes connect to it ([ADDR]:PORT for IPv6)\n"
    "  --token-file FILE     read the job token (64 hex digits) from FILE\n"
    "  -h, --help            show this help\n"
    "\n"
    "Variables set for every rank:\n"
    "  BRAID_RANK            global rank: K*N + local rank\n"
    "  BRAID_WORLD_SIZE      M*N\n"
    "  BRAID_LOCAL_RANK      rank on this node, 0 to N-1\n"
    "  BRAID_LOCAL_SIZE      N\n"
    "  BRAID_STORE           host:port of the store\n"
    "  BRAID_STORE_EXTERNAL  1: the store is hosted by braidrun, not by rank 0\n"
    "  BRAID_TOKEN           the job token in hex (unset for a loopback-only store)\n"
    "  BRAID_JOB_ID          namespace of the job's keys in the store\n"
    "  BRAID_BACKEND         with --backend\n"
    "Everything else in braidrun's environment is passed on unchanged.\n"
    "\n"
    "Variables braidrun reads:\n"
    "  BRAID_TOKEN           with --master: the job token shared by every node\n";
static const char usage_tail[] =
    "\n"
    "Supervision:\n"
    "  When a rank exits with a non-zero code or is killed by a signal, braidrun\n"
    "  says which rank and how (\"rank 2 killed by signal 9 (Killed)\", \"rank 1\n"
    "  exited with code 3\"), sends SIGTERM to the other ranks, SIGKILL after the\n"
    "  grace period, and exits with the first failing rank's status (128+N for\n"
    "  signal N). SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to braidrun are\n"
    "  forwarded to every rank; a second SIGINT or SIGTERM kills them. Each rank\n"
    "  runs in its own process group, so whatever it starts is signalled too,\n"
    "  also after the rank itself ended, and killed once the grace period is\n"
    "  over. Should braidrun itself die, even by SIGKILL, the kernel kills every\n"
    "  rank (what a rank started is then the rank's to end).\n"
    "  Rank 0 reads braidrun's standard input unless that is a terminal; the\n"
    "  other ranks read /dev/null.\n"
    "\n"
    "Exit status: 0 when every rank exited with 0; the first failing rank's\n"
    "status; 124 after --timeout; 128+N when braidrun received signal N and no\n"
    "rank failed first; 1 or 2 for braidrun's own errors (2: bad usage); 127\n"
    "when PROGRAM cannot be started.\n"
    "\n"
    "Multi-node (like torchrun): run on each of M nodes\n"
    "  braidrun --nnodes M --node-rank K --master HOST:PORT -n N PROGRAM ...\n"
    "Node 0 hosts the store at HOST:PORT (HOST must be node 0's address); the\n"
    "others join it before starting their ranks. Every node must use the same M\n"
    "and N. A failure on any node stops the job on every node, and node 0 keeps\n"
    "the store up until every node has finished, or until a node's braidrun has\n"
    "not been heard from for 10 s (then it exits with 1).\n"
    "\n"
    "Security: the store authenticates every connection with the job token, a\n"
    "32-byte secret that never crosses the network (HMAC challenge-response).\n"
    "On one node braidrun generates a fresh token per job. A multi-node job\n"
    "needs the same token on every node: export BRAID_TOKEN (for example\n"
    "BRAID_TOKEN=$(openssl rand -hex 32)) or pass --token-file; without one\n"
    "braidrun refuses to start unless --master is a loopback address, where the\n"
    "store then accepts loopback connections only.\n";

/* ---------------------------------------------------------------- state */

typedef struct outbuf {
  int fd;     /* read end of the rank's pipe, -1 once closed */
  char *data; /* partial line */
  size_t len;
} outbuf;

typedef struct rank_proc {
  int rank; /* global */
  pid_t pid;
  int running;
  int group; /* its process group (pid) was made: what it started may outlive it */
  int status;
  outbuf out[2]; /* stdout, stderr (with --tag-output) */
} rank_proc;

typedef braidrun_opts opts;

static rank_proc *ranks;
static int nranks;
static int sig_pipe[2] = {-1, -1};
static volatile sig_atomic_t pending[NSIG];

static void msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void msg(const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n > sizeof buf - 2) n = (int)sizeof buf - 2;
  char line[2100];
  int m = snprintf(line, sizeof line, "braidrun: %.*s\n", n, buf);
  if (m > 0) {
    ssize_t w = write(2, line, (size_t)(m < (int)sizeof line ? m : (int)sizeof line - 1));
    (void)w;
  }
}

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  msg("%s (see braidrun --help)", buf);
  exit(2);
}

static void on_signal(int sig) {
  int saved = errno;
  if (sig > 0 && sig < NSIG && sig != SIGCHLD) pending[sig]++;
  char c = (char)sig;
  ssize_t w = write(sig_pipe[1], &c, 1);
  (void)w;
  errno = saved;
}

static const int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

static const char *sig_name(int sig) {
  switch (sig) {
  case SIGINT: return "SIGINT";
  case SIGTERM: return "SIGTERM";
  case SIGHUP: return "SIGHUP";
  case SIGQUIT: return "SIGQUIT";
  default: return "a signal";
  }
}

/* ---------------------------------------------------------------- options */

static void parse_opts(int argc, char **argv, opts *o) {
  char err[512];
  switch (braidrun_parse_opts(argc, argv, o, err, sizeof err)) {
  case BRAIDRUN_OPTS_HELP:
    fputs(usage_head, stdout);
    printf("  --backend NAME        set BRAID_BACKEND=NAME for every rank (built here: %s)\n",
           braid__backend_names());
    fputs(usage_text, stdout);
    printf("  BRAID_INIT_TIMEOUT    with --nnodes: seconds a node waits to join node 0's\n"
           "                        store (default %s, 0 waits forever)\n",
           braid__param_default(BRAID_P_INIT_TIMEOUT));
    fputs(usage_tail, stdout);
    exit(0);
  case BRAIDRUN_OPTS_USAGE: die_usage("%s", err);
  default: break;
  }
}

/* ---------------------------------------------------------------- program and environment */

/* PATH lookup in the parent: the child, forked from a threaded process, may only exec. */
static char *find_program(const char *prog) {
  if (strchr(prog, '/')) return strdup(prog);
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
  size_t plen = strlen(prog);
  for (const char *p = path;;) {
    const char *colon = strchr(p, ':');
    size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
    char *cand = malloc(dlen + plen + 2);
    if (!cand) return NULL;
    if (dlen)
      snprintf(cand, dlen + plen + 2, "%.*s/%s", (int)dlen, p, prog);
    else
      snprintf(cand, dlen + plen + 2, "./%s", prog);
    struct stat sb;
    if (stat(cand, &sb) == 0 && S_ISREG(sb.st_mode) && access(cand, X_OK) == 0) return cand;
    free(cand);
    if (!colon) break;
    p = colon + 1;
  }
  return NULL;
}

static const char *const our_vars[] = {"BRAID_RANK",  "BRAID_WORLD_SIZE",     "BRAID_LOCAL_RANK",
                                       "BRAID_LOCAL_SIZE", "BRAID_STORE",     "BRAID_STORE_EXTERNAL",
                                       "BRAID_TOKEN", "BRAID_JOB_ID",         "BRAID_BACKEND"};
#define NOUR (sizeof our_vars / sizeof our_vars[0])

static int is_our_var(const char *kv) {
  for (size_t i = 0; i < NOUR; i++) {
    size_t n = strlen(our_vars[i]);
    if (!strncmp(kv, our_vars[i], n) && kv[n] == '=') return 1;
  }
  return 0;
}

/* environ without our variables, then ours for this rank. */
static char **rank_env(const opts *o, int rank, int local, const char *store, const char *token_hex,
                       const char *job_id) {
  size_t n = 0;
  while (environ[n]) n++;
  char **env = calloc(n + NOUR + 1, sizeof *env);
  if (!env) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (!is_our_var(environ[i])) env[k++] = environ[i];
  char buf[512];
  size_t first = k;
#define ADD(...) (snprintf(buf, sizeof buf, __VA_ARGS__), env[k++] = strdup(buf))
  ADD("BRAID_RANK=%d", rank);
  ADD("BRAID_WORLD_SIZE=%d", o->nproc * o->nnodes);
  ADD("BRAID_LOCAL_RANK=%d", local);
  ADD("BRAID_LOCAL_SIZE=%d", o->nproc);
  ADD("BRAID_STORE=%s", store);
  ADD("BRAID_STORE_EXTERNAL=1");
  ADD("BRAID_JOB_ID=%s", job_id);
  if (token_hex) ADD("BRAID_TOKEN=%s", token_hex);
  if (o->backend) ADD("BRAID_BACKEND=%s", o->backend);
#undef ADD
  env[k] = NULL;
  for (size_t i = first; i < k; i++)
    if (!env[i]) return NULL;
  return env;
}

/* ---------------------------------------------------------------- ranks */

/* Starts one rank; returns 0, or the errno that made exec fail. */
static int spawn(rank_proc *rp, const char *path, char **argv, char **envp, int tag, int stdin_fd, int devnull) {
  int outp[2] = {-1, -1}, errp[2] = {-1, -1}, ex[2];
  if (tag && (pipe2(outp, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0)) return errno;
  if (pipe2(ex, O_CLOEXEC) != 0) return errno;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return errno;
  if (pid == 0) {
    /* Async-signal-safe calls only: the parent has a store thread. */
    /* A rank must not outlive braidrun, even one killed by SIGKILL (which it
       cannot forward): the kernel kills the rank when braidrun's main thread,
       the one forking here, dies. The signal survives execve. braidrun may
       have died before prctl: then the rank has been reparented already. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
      int e = errno;
      ssize_t w = write(ex[1], &e, sizeof e);
      (void)w;
      _exit(127);
    }
    if (getppid() != parent) _exit(127);
    setpgid(0, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    for (size_t i = 0; i < sizeof forwarded_signals / sizeof forwarded_signals[0]; i++)
      sigaction(forwarded_signals[i], &sa, NULL);
    sigaction(SIGCHLD, &sa, NULL);
    sigaction(SIGPIPE, &sa, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (stdin_fd >= 0 && stdin_fd != 0) dup2(stdin_fd, 0);
    if (stdin_fd < 0) dup2(devnull, 0);
    if (tag) {
      dup2(outp[1], 1);
      dup2(errp[1], 2);
    }
    execve(path, argv, envp);
    int e = errno;
    ssize_t w = write(ex[1], &e, sizeof e);
    (void)w;
    _exit(127);
  }
  setpgid(pid, pid); /* also here, so no signal can find the child outside its group */
  rp->pid = pid;
  rp->running = 1;
  rp->group = 1;
  close(ex[1]);
  if (tag) {
    close(outp[1]);
    close(errp[1]);
    rp->out[0].fd = outp[0];
    rp->out[1].fd = errp[0];
    fcntl(outp[0], F_SETFL, O_NONBLOCK);
    fcntl(errp[0], F_SETFL, O_NONBLOCK);
  }
  int e = 0;
  ssize_t n;
  do {
    n = read(ex[0], &e, sizeof e);
  } while (n < 0 && errno == EINTR);
  close(ex[0]);
  if (n != (ssize_t)sizeof e) return 0;
  /* exec failed: the child is exiting already. */
  while (waitpid(pid, &rp->status, 0) < 0 && errno == EINTR) {
  }
  rp->running = 0;
  return e;
}

/* A rank and what it started; once the rank is reaped, what it started
   still (its group; never the bare pid, which another process may have). */
static void signal_rank(rank_proc *rp, int sig) {
  if (rp->running) {
    if (kill(-rp->pid, sig) != 0) kill(rp->pid, sig);
  } else if (rp->group && kill(-rp->pid, sig) != 0) {
    rp->group = 0; /* empty */
  }
}

/* Whether some rank's process group still has a process in it. */
static int groups_alive(void) {
  int n = 0;
  for (int i = 0; i < nranks; i++)
    if (ranks[i].group) {
      if (kill(-ranks[i].pid, 0) == 0) n++;
      else ranks[i].group = 0;
    }
  return n;
}

static void signal_all(int sig) {
  for (int i = 0; i < nranks; i++) signal_rank(&ranks[i], sig);
}

static int count_running(void) {
  int n = 0;
  for (int i = 0; i < nranks; i++) n += ranks[i].running;
  return n;
}

static void list_running(char *out, size_t len) {
  size_t o = 0;
  out[0] = 0;
  for (int i = 0; i < nranks && o < len; i++) {
    if (!ranks[i].running) continue;
    int k = snprintf(out + o, len - o, "%s%d", o ? " " : "", ranks[i].rank);
    if (k < 0) break;
    o += (size_t)k;
  }
}

static void describe(int status, char *out, size_t len) {
  if (WIFSIGNALED(status))
    snprintf(out, len, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else
    snprintf(out, len, "exited with code %d", WEXITSTATUS(status));
}

static int exit_code_of(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

/* ---------------------------------------------------------------- tagged output */

static void write_all(int fd, struct iovec *iov, int n) {
  while (n > 0) {
    ssize_t w = writev(fd, iov, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return; /* our own output is gone; keep supervising */
    }
    while (n > 0 && (size_t)w >= iov->iov_len) {
      w -= (ssize_t)iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0) {
      iov->iov_base = (char *)iov->iov_base + w;
      iov->iov_len -= (size_t)w;
    }
  }
}

static void emit_line(int rank, int stream, const char *p, size_t len) {
  char tag[24];
  int t = snprintf(tag, sizeof tag, "[%d] ", rank);
  struct iovec iov[3] = {{tag, (size_t)t}, {(void *)p, len}, {"\n", 1}};
  write_all(stream == 0 ? 1 : 2, iov, 3);
}

/* Reads what is available; emits whole lines. Returns 0 at EOF. */
static int pump(rank_proc *rp, int stream) {
  outbuf *b = &rp->out[stream];
  if (b->fd < 0) return 0;
  if (!b->data && !(b->data = malloc(LINE_MAX_BYTES))) return 1;
  for (;;) {
    ssize_t n = read(b->fd, b->data + b->len, LINE_MAX_BYTES - b->len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return 1; /* EAGAIN: more later */
    if (n == 0) {
      if (b->len) emit_line(rp->rank, stream, b->data, b->len);
      b->len = 0;
      close(b->fd);
      b->fd = -1;
      free(b->data);
      b->data = NULL;
      return 0;
    }
    size_t start = 0, end = b->len + (size_t)n;
    for (size_t i = b->len; i < end; i++) {
      if (b->data[i] != '\n') continue;
      emit_line(rp->rank, stream, b->data + start, i - start);
      start = i + 1;
    }
    memmove(b->data, b->data + start, end - start);
    b->len = end - start;
    if (b->len == LINE_MAX_BYTES) { /* an endless line: pass it on in pieces */
      emit_line(rp->rank, stream, b->data, b->len);
      b->len = 0;
    }
  }
}

/* ---------------------------------------------------------------- multi-node control */

typedef struct control {
  braid__store *st; /* NULL on a single node */
  int nnodes, node;
  double next_poll;
  double next_beat; /* nodes but 0: when to say next that this braidrun lives */
  int lost;
} control;

/* Every node's braidrun but node 0's counts beat/K up every BEAT_S while it
   runs and sets fin/K when it ends; node 0, keeping the store up for the
   others, takes a node whose count stood still for NODE_LOST_S as gone
   (its host, or its braidrun, died: its ranks died with it). */
#define BEAT_S 1.0
#define NODE_LOST_S 10.0

/* what ("beat" or "fin") of this node, counted up (a failure shows as
   silence); node 0 keeps none. */
static void node_says(control *cc, const char *what) {
  if (!cc->st || cc->node == 0) return;
  char key[32];
  snprintf(key, sizeof key, "%s/%d", what, cc->node);
  int64_t v;
  (void)braid__store_add(cc->st, key, 1, &v);
  cc->next_beat = braid__now() + BEAT_S;
}

/* Node 0: the first node that joined and went silent without finishing
   (its number), else -1. last[k], seen[k]: the count and when it moved. */
static int silent_node(control *cc, int64_t *last, double *seen) {
  const double now = braid__now();
  for (int k = 1; k < cc->nnodes; k++) {
    char key[32];
    int64_t b = 0, f = 0;
    snprintf(key, sizeof key, "fin/%d", k);
    if (braid__store_add(cc->st, key, 0, &f) != BRAID_OK || f) continue;
    snprintf(key, sizeof key, "beat/%d", k);
    if (braid__store_add(cc->st, key, 0, &b) != BRAID_OK || !b) continue; /* never joined */
    if (b != last[k] || !seen[k]) {
      last[k] = b;
      seen[k] = now;
    } else if (now - seen[k] >= NODE_LOST_S) {
      return k;
    }
  }
  return -1;
}

/* First failure on any node wins; the value is "<exit code> <message>". */
static void publish_failure(control *cc, int code, const char *what) {
  if (!cc->st) return;
  char val[600];
  int n = snprintf(val, sizeof val, "%d node %d: %s", code, cc->node, what);
  int swapped = 0;
  if (braid__store_cas(cc->st, "failure", NULL, 0, val, (size_t)(n < (int)sizeof val ? n : (int)sizeof val - 1),
                       &swapped, NULL, NULL) == BRAID_OK &&
      swapped) {
    int64_t v;
    braid__store_add(cc->st, "failures", 1, &v);
  }
}

/* Another node's failure: 1 and *code, *what set. */
static int remote_failure(control *cc, int *code, char *what, size_t len) {
  if (!cc->st || cc->lost) return 0;
  int64_t v = 0;
  if (braid__store_add(cc->st, "failures", 0, &v) != BRAID_OK) {
    cc->lost = 1;
    *code = 1;
    snprintf(what, len, "lost contact with the store (%s)", braid__store_error(cc->st));
    return 1;
  }
  if (v <= 0) return 0;
  void *val = NULL;
  size_t vlen = 0;
  if (braid__store_get(cc->st, "failure", &val, &vlen, braid__deadline(5)) != BRAID_OK) return 0;
  char buf[600];
  snprintf(buf, sizeof buf, "%.*s", (int)(vlen < sizeof buf - 1 ? vlen : sizeof buf - 1), (const char *)val);
  free(val);
  char *sp = strchr(buf, ' ');
  *code = atoi(buf);
  snprintf(what, len, "%s", sp ? sp + 1 : buf);
  return 1;
}

/* ---------------------------------------------------------------- main */

static int read_token_file(const char *path, uint8_t tok[BRAID__TOKEN_LEN]) {
  FILE *f = fopen(path, "r");
  if (!f) {
    msg("cannot read the token file %s: %s", path, strerror(errno));
    return -1;
  }
  char buf[256] = "";
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = 0;
  if (braid__parse_token_hex(buf, tok)) {
    msg("the token file %s does not hold 64 hex digits", path);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  opts o;
  parse_opts(argc, argv, &o);
  /* Static, so early error exits don't count as leaks under LeakSanitizer. */
  static char *path;
  path = find_program(o.argv[0]);
  if (!path) {
    msg("%s: command not found", o.argv[0]);
    return 127;
  }

  /* The job token. */
  uint8_t tok[BRAID__TOKEN_LEN];
  int have_token = 0;
  const char *master_host = o.master_host;
  int master_port = o.master_port;
  int loopback = braid__host_is_loopback(master_host);
  if (o.token_file) {
    if (read_token_file(o.token_file, tok)) return 1;
    have_token = 1;
  } else if (o.master) {
    const char *t = braid__param_str(BRAID_P_TOKEN);
    if (t) {
      if (braid__parse_token_hex(t, tok)) {
        msg("BRAID_TOKEN is not 64 hex digits");
        return 1;
      }
      have_token = 1;
    }
  } else {
    if (braid__token_generate(tok) != 0) {
      msg("cannot generate a job token (no random source)");
      return 1;
    }
    have_token = 1;
  }
  if (!have_token) {
    if (!loopback) {
      msg("a multi-node job needs a job token shared by every node: set BRAID_TOKEN to the same 64 hex digits "
          "on each node (e.g. export BRAID_TOKEN=$(openssl rand -hex 32)) or pass --token-file");
      return 1;
    }
    msg("no job token (BRAID_TOKEN or --token-file): the store accepts loopback connections only, which "
        "suffices because --master %s is a loopback address",
        o.master);
  }
  char token_hex[2 * BRAID__TOKEN_LEN + 1];
  if (have_token) braid__token_format(tok, token_hex);

  /* Signals: handlers write to a pipe the main loop polls. The store thread
     is started with them blocked, so they arrive on this thread. */
  if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    msg("pipe: %s", strerror(errno));
    return 1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof forwarded_signals / sizeof forwarded_signals[0]; i++)
    sigaction(forwarded_signals[i], &sa, NULL);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  sigset_t block, old;
  sigemptyset(&block);
  for (size_t i = 0; i < sizeof forwarded_signals / sizeof forwarded_signals[0]; i++)
    sigaddset(&block, forwarded_signals[i]);
  sigaddset(&block, SIGCHLD);

  char err[1024] = "";
  braid__store_server *server = NULL;
  control cc = {NULL, o.nnodes, o.node_rank, 0, 0, 0};
  char store_addr[BRAID__ENV_HOST_MAX + 16];
  char job_id[64];
  double init_timeout = 0;
  if (braid__param_seconds(BRAID_P_INIT_TIMEOUT, &init_timeout, err, sizeof err)) {
    msg("%s", err);
    return 1;
  }

  if (o.node_rank == 0) {
    /* Host the store: loopback unless other nodes must reach it. */
    const char *bind_host = !o.master ? "127.0.0.1" : (loopback ? master_host : NULL);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    braid_status st =
        braid__store_server_start(bind_host, master_port, have_token ? tok : NULL, have_token ? sizeof tok : 0,
                                  &server, err, sizeof err);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (st) {
      msg("cannot host the store: %s%s", err,
          o.master || o.port > 0 ? "; if another job uses that port, choose another" : "");
      return 1;
    }
    master_port = braid__store_server_port(server);
    uint8_t jid[BRAID__TOKEN_LEN];
    braid__token_generate(jid);
    snprintf(job_id, sizeof job_id, "braidrun-%02x%02x%02x%02x%02x%02x%02x%02x", jid[0], jid[1], jid[2], jid[3],
             jid[4], jid[5], jid[6], jid[7]);
  }
  if (strchr(master_host, ':'))
    snprintf(store_addr, sizeof store_addr, "[%s]:%d", master_host, master_port);
  else
    snprintf(store_addr, sizeof store_addr, "%s:%d", master_host, master_port);

  if (o.nnodes > 1) {
    /* Nodes agree on the job through the store before any rank starts. */
    braid_status st = braid__store_connect(master_host, master_port, have_token ? tok : NULL,
                                           have_token ? sizeof tok : 0, braid__deadline(init_timeout), &cc.st, err,
                                           sizeof err);
    if (st) {
      msg("could not join the job at %s: %s", store_addr, err);
      if (server) braid__store_server_stop(server);
      return 1;
    }
    braid__store_set_op_timeout(cc.st, 10);
    braid__store_set_prefix(cc.st, "braidrun/");
    char shape[160];
    int swapped = 0;
    void *cur = NULL;
    size_t curlen = 0;
    if (o.node_rank == 0) {
      snprintf(shape, sizeof shape, "%d %d %s", o.nnodes, o.nproc, job_id);
      st = braid__store_set(cc.st, "job", shape, strlen(shape));
    } else {
      st = braid__store_get(cc.st, "job", &cur, &curlen, braid__deadline(init_timeout));
      if (st == BRAID_OK) {
        snprintf(shape, sizeof shape, "%.*s", (int)(curlen < sizeof shape - 1 ? curlen : sizeof shape - 1),
                 (char *)cur);
        free(cur);
        cur = NULL;
        int m = 0, n = 0;
        if (sscanf(shape, "%d %d %63s", &m, &n, job_id) != 3) {
          msg("the store at %s does not describe a braidrun job", store_addr);
          return 1;
        }
        if (m != o.nnodes || n != o.nproc) {
          msg("node 0 runs --nnodes %d -n %d, but this node was started with --nnodes %d -n %d", m, n, o.nnodes,
              o.nproc);
          return 1;
        }
      }
    }
    char key[32], me[300], host[256] = "?";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    snprintf(key, sizeof key, "node/%d", o.node_rank);
    snprintf(me, sizeof me, "braidrun pid %ld on %s", (long)getpid(), host);
    if (st == BRAID_OK) st = braid__store_cas(cc.st, key, NULL, 0, me, strlen(me), &swapped, &cur, &curlen);
    if (st) {
      msg("could not join the job at %s: %s", store_addr, braid__store_error(cc.st));
      if (server) braid__store_server_stop(server);
      return 1;
    }
    if (!swapped) {
      msg("node rank %d is already taken by %.*s", o.node_rank, (int)curlen, cur ? (char *)cur : "another braidrun");
      free(cur);
      if (server) braid__store_server_stop(server);
      return 1;
    }
    free(cur);
    /* The first beat before the count: node 0 never waits for a node it
       has not heard from. */
    node_says(&cc, "beat");
    int64_t joined;
    if (braid__store_add(cc.st, "joined", 1, &joined) != BRAID_OK) {
      msg("could not join the job at %s: %s", store_addr, braid__store_error(cc.st));
      if (server) braid__store_server_stop(server);
      return 1;
    }
  }

  /* Start the ranks. */
  nranks = o.nproc;
  ranks = calloc((size_t)nranks, sizeof *ranks);
  struct pollfd *pf = calloc(1 + 2 * (size_t)nranks, sizeof *pf);
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (!ranks || !pf || devnull < 0) {
    msg("cannot set up the ranks: %s", strerror(errno));
    return 1;
  }
  int exit_code = -1; /* first failure's status */
  int stopping = 0, forwarded = 0, timed_out = 0;
  double kill_at = INFINITY;
  double t0 = braid__now();
  double end_at = o.timeout > 0 ? t0 + o.timeout : INFINITY;
  for (int i = 0; i < nranks; i++) {
    rank_proc *rp = &ranks[i];
    rp->rank = o.node_rank * o.nproc + i;
    rp->out[0].fd = rp->out[1].fd = -1;
    char **envp = rank_env(&o, rp->rank, i, store_addr, have_token ? token_hex : NULL, job_id);
    if (!envp) {
      msg("out of memory");
      exit_code = 1;
      break;
    }
    /* Only rank 0 gets stdin, and not a terminal: a rank in its own process
       group reading the terminal would be stopped. */
    int in = (rp->rank == 0 && !isatty(0)) ? 0 : -1;
    int e = spawn(rp, path, o.argv, envp, o.tag, in, devnull);
    for (size_t k = 0; envp[k]; k++)
      if (is_our_var(envp[k])) free(envp[k]);
    free(envp);
    if (e) {
      msg("cannot start rank %d: %s: %s", rp->rank, path, strerror(e));
      exit_code = 127;
      break;
    }
  }
  if (exit_code >= 0) {
    char what[256];
    snprintf(what, sizeof what, "could not start this node's ranks");
    publish_failure(&cc, exit_code, what);
    signal_all(SIGKILL);
    stopping = 1;
  }

  /* Supervise. */
  double drain_until = INFINITY;
  for (;;) {
    /* A reaped rank's group is signalled only while something is in it:
       an empty group's number may go to another process. */
    (void)groups_alive();
    /* Reap. */
    for (int i = 0; i < nranks; i++) {
      rank_proc *rp = &ranks[i];
      if (!rp->running) continue;
      int status;
      pid_t r = waitpid(rp->pid, &status, WNOHANG);
      if (r != rp->pid) continue;
      rp->running = 0;
      rp->status = status;
      int code = exit_code_of(status);
      if (code == 0 || stopping || forwarded) continue;
      char how[128];
      describe(status, how, sizeof how);
      msg("rank %d %s", rp->rank, how);
      /* 126/127: what the dynamic loader or an interpreter exits with when the
         program never started (its own message, if any, is just above). */
      if (WIFEXITED(status) && code == 127)
        msg("rank %d: exit code 127 means %s could not start: a shared library it needs was not found (e.g. "
            "libbraid.so.0 outside the loader's path: link with -Wl,-rpath,LIBDIR or set LD_LIBRARY_PATH), or "
            "its interpreter is missing",
            rp->rank, o.argv[0]);
      else if (WIFEXITED(status) && code == 126)
        msg("rank %d: exit code 126 means %s could not be executed: no execute permission, or not a program "
            "this system can run",
            rp->rank, o.argv[0]);
      exit_code = code;
      char what[200];
      snprintf(what, sizeof what, "rank %d %s", rp->rank, how);
      publish_failure(&cc, code, what);
      if (count_running()) msg("stopping the other ranks (SIGTERM, then SIGKILL after %g s)", o.grace);
      signal_all(SIGTERM);
      stopping = 1;
      kill_at = braid__now() + o.grace;
    }
    int running = count_running();
    int open_pipes = 0;
    for (int i = 0; i < nranks; i++) open_pipes += (ranks[i].out[0].fd >= 0) + (ranks[i].out[1].fd >= 0);
    if (!running) {
      /* Output still buffered in pipes (or held by a rank's leftover children). */
      if (!open_pipes) break;
      if (drain_until == INFINITY) drain_until = braid__now() + 1.0;
      if (braid__now() >= drain_until) break;
    }

    double now = braid__now();
    double wake = now + POLL_MS / 1000.0;
    if (!stopping && end_at < wake) wake = end_at;
    if (stopping && kill_at < wake) wake = kill_at;
    size_t np = 0;
    pf[np++] = (struct pollfd){sig_pipe[0], POLLIN, 0};
    for (int i = 0; i < nranks; i++)
      for (int s = 0; s < 2; s++)
        if (ranks[i].out[s].fd >= 0) pf[np++] = (struct pollfd){ranks[i].out[s].fd, POLLIN, 0};
    int ms = wake <= now ? 0 : (int)ceil((wake - now) * 1000.0);
    poll(pf, (nfds_t)np, ms);

    char drain[64];
    while (read(sig_pipe[0], drain, sizeof drain) > 0) {
    }
    for (size_t i = 0; i < sizeof forwarded_signals / sizeof forwarded_signals[0]; i++) {
      int sig = forwarded_signals[i];
      if (!pending[sig]) continue;
      pending[sig] = 0;
      if (forwarded && (sig == SIGINT || sig == SIGTERM)) {
        msg("got %s again; killing every rank", sig_name(sig));
        signal_all(SIGKILL);
        continue;
      }
      if (!forwarded) msg("got %s; forwarding it to every rank", sig_name(sig));
      signal_all(sig);
      if (!forwarded) {
        char what[64];
        snprintf(what, sizeof what, "braidrun received %s", sig_name(sig));
        publish_failure(&cc, 128 + sig, what);
      }
      forwarded = forwarded ? forwarded : sig;
    }
    for (int i = 0; i < nranks; i++)
      for (int s = 0; s < 2; s++) pump(&ranks[i], s);

    now = braid__now();
    if (!stopping && !forwarded && now >= end_at && count_running()) {
      char list[1024];
      list_running(list, sizeof list);
      msg("job timed out after %g s; ranks still running: %s", o.timeout, list);
      char what[1100];
      snprintf(what, sizeof what, "job timed out after %g s", o.timeout);
      publish_failure(&cc, 124, what);
      timed_out = 1;
      signal_all(SIGTERM);
      stopping = 1;
      kill_at = now + o.grace;
    }
    if (stopping && now >= kill_at && count_running()) {
      char list[1024];
      list_running(list, sizeof list);
      msg("ranks %s did not stop within %g s of SIGTERM; sending SIGKILL", list, o.grace);
      signal_all(SIGKILL);
      kill_at = INFINITY;
    }
    if (cc.st && now >= cc.next_beat) node_says(&cc, "beat");
    if (cc.st && !stopping && !forwarded && now >= cc.next_poll) {
      cc.next_poll = now + 0.2;
      int code;
      char what[600];
      if (remote_failure(&cc, &code, what, sizeof what)) {
        if (count_running()) msg("stopping this node's ranks: %s", what);
        exit_code = code;
        signal_all(SIGTERM);
        stopping = 1;
        kill_at = now + o.grace;
      }
    }
  }

  /* A stopped job leaves nothing its ranks started: what survived SIGTERM
     gets the rest of the grace period, then SIGKILL. */
  if (stopping || forwarded) {
    const double until = isfinite(kill_at) ? kill_at : braid__now() + o.grace;
    while (groups_alive() && braid__now() < until && !pending[SIGINT] && !pending[SIGTERM]) {
      if (cc.st && braid__now() >= cc.next_beat) node_says(&cc, "beat");
      braid__sleep(0.05);
    }
    if (groups_alive()) signal_all(SIGKILL);
  }
  int code = timed_out ? 124 : exit_code >= 0 ? exit_code : forwarded ? 128 + forwarded : 0;
  if (cc.st) {
    int64_t done = 0, joined = 0;
    node_says(&cc, "fin");
    if (braid__store_add(cc.st, "done", 1, &done) == BRAID_OK && server) {
      /* The store lives here: keep it up while the ranks of nodes that joined
         may still use it (a node that never joined has no ranks to wait for). */
      double until = code ? braid__now() + o.grace + 2.0 : (o.timeout > 0 ? end_at : INFINITY);
      double note_at = braid__now() + 5.0;
      int64_t *last = calloc((size_t)o.nnodes, sizeof *last);
      double *seen = calloc((size_t)o.nnodes, sizeof *seen);
      while (braid__now() < until) {
        if (braid__store_add(cc.st, "joined", 0, &joined) != BRAID_OK || done >= joined) break;
        int gone = last && seen ? silent_node(&cc, last, seen) : -1;
        if (gone > 0) {
          msg("node %d's braidrun has not been heard from for %g s (its host or braidrun died, and its ranks with "
              "it): the job did not finish there",
              gone, NODE_LOST_S);
          if (!code) code = 1;
          break;
        }
        int fcode;
        char what[600];
        if (!code && remote_failure(&cc, &fcode, what, sizeof what)) {
          code = fcode;
          until = braid__now() + o.grace + 2.0;
        }
        if (pending[SIGINT] || pending[SIGTERM]) break;
        if (braid__now() >= note_at) {
          msg("this node's ranks are done; keeping the store up until the other %lld node(s) finish",
              (long long)(joined - done));
          note_at = INFINITY;
        }
        braid__sleep(0.1);
        if (braid__store_add(cc.st, "done", 0, &done) != BRAID_OK) break;
      }
      free(last);
      free(seen);
    }
    braid__store_close(cc.st);
  }
  if (server) braid__store_server_stop(server);
  free(path);
  free(ranks);
  free(pf);
  close(devnull);
  return code;
}
