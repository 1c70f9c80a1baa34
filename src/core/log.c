#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core/params.h"

static atomic_int log_level = -1; /* -1: not read yet */
static atomic_int log_subsys = BRAID_SUB_ALL;
static atomic_int log_fd = 2;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_host[64];
static char log_file[512]; /* BRAID_LOG_FILE in effect, to reopen only when it changes */

#define LOG_PATH_MAX 512

static const char *const level_names[] = {"NONE", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

static const struct {
  const char *name;
  int bit;
} subsys_names[] = {{"init", BRAID_SUB_INIT}, {"coll", BRAID_SUB_COLL}, {"p2p", BRAID_SUB_P2P},
                    {"shm", BRAID_SUB_SHM},   {"tcp", BRAID_SUB_TCP},   {"boot", BRAID_SUB_BOOT},
                    {"env", BRAID_SUB_ENV}};

static int level_of(const char *s) {
  if (!s) return -1;
  for (int i = 0; i <= BRAID_LOG_TRACE; i++)
    if (!strcasecmp(s, level_names[i])) return i;
  if (!strcasecmp(s, "warning")) return BRAID_LOG_WARN;
  if (!strcasecmp(s, "off")) return BRAID_LOG_NONE;
  return -1;
}

static void write_line(int fd, braid__log_level lvl, braid__log_subsys sub, int rank, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));

/* A logging variable whose value makes no sense falls back to its default
   and says so once per value, on stderr whatever BRAID_LOG_FILE says (the
   file may be what is wrong), unless BRAID_LOG is off. */
static void config_warning(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void config_warning(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  write_line(2, BRAID_LOG_WARN, BRAID_SUB_ENV, -1, fmt, ap);
  va_end(ap);
}

/* The last bad value warned about, per variable (guarded by log_lock). */
static char warned_level[128], warned_subsys[256], warned_file[512];

static int warn_once(char *last, size_t len, const char *value) {
  if (!strncmp(last, value, len - 1)) return 0;
  snprintf(last, len, "%s", value);
  return 1;
}

/* An unknown level means the default level (BRAID_LOG's in the parameter list). */
static int parse_level(const char *s) {
  int l = level_of(s);
  if (l >= 0) return l;
  const char *def = braid__param_default(BRAID_P_LOG);
  l = level_of(def);
  if (l < 0) l = BRAID_LOG_WARN, def = "warn"; /* only if the list's default were no level */
  if (s && warn_once(warned_level, sizeof warned_level, s))
    config_warning("BRAID_LOG=\"%s\" is not a log level (accepted: error, warn, info, debug, trace, off); "
                   "using the default, %s",
                   s, def);
  return l;
}

/* Unknown names are left out (and reported); none known at all means all. */
static int parse_subsys(const char *s, int warn) {
  if (!s || !strcasecmp(s, "all")) return BRAID_SUB_ALL;
  int mask = 0;
  char buf[256], bad[256] = "";
  snprintf(buf, sizeof buf, "%s", s);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int known = 0;
    for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
      if (!strcasecmp(tok, subsys_names[i].name)) mask |= subsys_names[i].bit, known = 1;
    if (!strcasecmp(tok, "all")) mask |= BRAID_SUB_ALL, known = 1;
    if (!known) {
      size_t o = strlen(bad);
      snprintf(bad + o, sizeof bad - o, "%s\"%s\"", o ? ", " : "", tok);
    }
  }
  if (bad[0] && warn && warn_once(warned_subsys, sizeof warned_subsys, s))
    config_warning("BRAID_LOG_SUBSYS=\"%s\": unknown subsystem %s (accepted: all, or a comma list of init, coll, "
                   "p2p, shm, tcp, boot, env); %s",
                   s, bad, mask ? "logging the others" : "logging all");
  return mask ? mask : BRAID_SUB_ALL;
}

/* BRAID_LOG_FILE may contain %h (host) and %p (pid) so each rank gets its own file. */
static int open_log_file(const char *pattern, char *path) {
  size_t o = 0;
  for (const char *p = pattern; *p && o + 1 < LOG_PATH_MAX; p++) {
    if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
      int n = p[1] == 'h' ? snprintf(path + o, LOG_PATH_MAX - o, "%s", log_host)
                          : snprintf(path + o, LOG_PATH_MAX - o, "%ld", (long)getpid());
      if (n < 0) break;
      o += (size_t)n < LOG_PATH_MAX - o ? (size_t)n : LOG_PATH_MAX - o - 1;
      p++;
    } else {
      path[o++] = *p;
    }
  }
  path[o] = 0;
  return open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

void braid__log_reload(void) {
  pthread_mutex_lock(&log_lock);
  if (gethostname(log_host, sizeof log_host - 1) != 0) snprintf(log_host, sizeof log_host, "?");
  int level = parse_level(braid__param_str(BRAID_P_LOG));
  int quiet = level == BRAID_LOG_NONE;
  const char *file = braid__param_str(BRAID_P_LOG_FILE);
  if (strcmp(file ? file : "", log_file) != 0) {
    int old = atomic_load(&log_fd);
    int fd = 2;
    if (file) {
      char path[LOG_PATH_MAX];
      int f = open_log_file(file, path);
      if (f >= 0)
        fd = f;
      else if (!quiet && warn_once(warned_file, sizeof warned_file, file))
        config_warning("BRAID_LOG_FILE=\"%s\": cannot open %s for appending: %s (accepted: a file this process "
                       "may create or append to, %%h = host, %%p = pid); logging to stderr",
                       file, path, strerror(errno));
    }
    atomic_store(&log_fd, fd);
    if (old > 2 && old != fd) close(old);
    snprintf(log_file, sizeof log_file, "%s", file ? file : "");
  }
  atomic_store(&log_subsys, parse_subsys(braid__param_str(BRAID_P_LOG_SUBSYS), !quiet));
  atomic_store(&log_level, level);
  pthread_mutex_unlock(&log_lock);
}

int braid__log_enabled(braid__log_level lvl, braid__log_subsys sub) {
  int cur = atomic_load_explicit(&log_level, memory_order_relaxed);
  if (cur < 0) {
    braid__log_reload();
    cur = atomic_load(&log_level);
  }
  return (int)lvl <= cur && (atomic_load_explicit(&log_subsys, memory_order_relaxed) & (int)sub);
}

static const char *subsys_name(braid__log_subsys sub) {
  for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
    if (subsys_names[i].bit == (int)sub) return subsys_names[i].name;
  return "braid";
}

void braid__log_vwrite(braid__log_level lvl, braid__log_subsys sub, int rank, const char *fmt, va_list ap) {
  write_line(atomic_load(&log_fd), lvl, sub, rank, fmt, ap);
}

static void write_line(int fd, braid__log_level lvl, braid__log_subsys sub, int rank, const char *fmt, va_list ap) {
  char line[2048];
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  localtime_r(&tv.tv_sec, &tm);
  char rk[16];
  if (rank >= 0)
    snprintf(rk, sizeof rk, "%d", rank);
  else
    snprintf(rk, sizeof rk, "-");
  int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%06ld %s:%ld [%s] %s %s: ", tm.tm_hour, tm.tm_min,
                   tm.tm_sec, (long)tv.tv_usec, log_host, (long)getpid(), rk, subsys_name(sub),
                   level_names[lvl]);
  if (n < 0) return;
  if ((size_t)n < sizeof line) {
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    if (m > 0) n += m;
  }
  if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
  line[n++] = '\n';
  /* One write per line keeps lines of different processes from interleaving. */
  ssize_t w = write(fd, line, (size_t)n);
  (void)w;
}

void braid__log_write(braid__log_level lvl, braid__log_subsys sub, int rank, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  braid__log_vwrite(lvl, sub, rank, fmt, ap);
  va_end(ap);
}
