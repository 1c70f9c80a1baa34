/* The flight recorder (see trace.h). */
#include "core/trace.h"

#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/comm.h"
#include "core/params.h"
#include "os/time.h"

static atomic_uint signal_gen;     /* SIGUSR1s received */
static pthread_once_t signal_once = PTHREAD_ONCE_INIT;

static void on_sigusr1(int sig) {
  (void)sig;
  atomic_fetch_add_explicit(&signal_gen, 1, memory_order_relaxed);
}

static void install(void) {
  long on = 0;
  char err[256];
  if (braid__param_int(BRAID_P_TRACE_SIGNAL, 0, 1, &on, err, sizeof err) || !on) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigusr1;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, NULL);
}

void braid__trace_install_signal(void) { pthread_once(&signal_once, install); }

void braid__trace_init(braid_comm *c) {
  long depth = 64;
  char err[256];
  if (braid__param_int(BRAID_P_TRACE_DEPTH, 0, 1 << 20, &depth, err, sizeof err) != BRAID_OK) {
    BLOG_WARN(BRAID_SUB_INIT, c->rank, "%s; the flight recorder keeps 64 operations", err);
    depth = 64;
  }
  c->trace_signal_seen = atomic_load_explicit(&signal_gen, memory_order_relaxed);
  if (depth == 0) return;
  c->trace = calloc(1, sizeof(braid__trace) + (size_t)depth * sizeof(braid__trace_ent));
  if (c->trace) c->trace->depth = (uint32_t)depth;
}

void braid__trace_free(braid_comm *c) {
  free(c->trace);
  c->trace = NULL;
  c->trace_cur = NULL;
}

void braid__trace_begin(braid_comm *c, int kind, uint64_t count, int dt, int32_t arg, int peer) {
  braid__trace *t = c->trace;
  if (!t) return;
  braid__trace_ent *e = &t->ent[t->pos];
  if (++t->pos == t->depth) t->pos = 0;
  e->id = ++t->next;
  e->seq = kind < BRAID__COLL_NKINDS ? c->seq : 0;
  e->count = count;
  e->t0 = e->t1 = 0;
  e->arg = arg;
  e->peer = peer;
  e->status = 0;
  e->algo = NULL;
  e->kind = (uint8_t)kind;
  e->dt = (uint8_t)dt;
  e->state = BRAID__TRACE_STARTED;
  c->trace_cur = e;
}

void braid__trace_end_slow(braid__trace_ent *e, braid_status st) {
  e->state = st ? BRAID__TRACE_FAILED : BRAID__TRACE_DONE;
  e->status = (int32_t)st;
  e->t1 = braid__now();
  if (!e->t0) e->t0 = e->t1;
}

void braid__trace_req_posted(braid_comm *c, braid__req *r) {
  if (!c->trace_cur) return;
  r->trace_id = c->trace_cur->id;
  c->trace_cur = NULL;
}

void braid__trace_req_done(braid_comm *c, braid__req *r) {
  braid__trace *t = c->trace;
  const uint64_t id = r->trace_id;
  r->trace_id = 0;
  if (!t || !id) return;
  braid__trace_ent *e = &t->ent[(id - 1) % t->depth];
  if (e->id != id) return; /* overwritten by a later operation */
  /* No clock here: a point-to-point operation's wait is its braid_sync's. */
  e->state = r->status ? BRAID__TRACE_FAILED : BRAID__TRACE_DONE;
  e->status = (int32_t)r->status;
}

void braid__trace_waiting(braid_comm *c, double since) {
  braid__trace_ent *e = c->trace_cur;
  if (e && !e->t0) e->t0 = since;
}

static const char *kind_name(int kind) {
  switch (kind) {
  case BRAID__TRACE_SEND: return "send";
  case BRAID__TRACE_RECV: return "recv";
  case BRAID__TRACE_SYNC: return "sync";
  default: {
    const char *n = braid__coll_short_name(kind);
    return n ? n : "?";
  }
  }
}

static const char *state_name(int state) {
  return state == BRAID__TRACE_STARTED ? "started" : state == BRAID__TRACE_DONE ? "done" : "failed";
}

/* Writes s as a JSON string body (quotes and control characters escaped). */
static void json_str(FILE *f, const char *s) {
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
}

/* BRAID_TRACE_FILE with %h (host), %p (pid) and %r (rank) expanded. */
static FILE *open_dump(const braid_comm *c) {
  const char *pattern = braid__param_str(BRAID_P_TRACE_FILE);
  if (!pattern) return NULL;
  char path[512], host[128] = "?";
  gethostname(host, sizeof host - 1);
  size_t o = 0;
  for (const char *p = pattern; *p && o + 1 < sizeof path; p++) {
    int n = -1;
    if (p[0] == '%' && p[1] == 'h') n = snprintf(path + o, sizeof path - o, "%s", host);
    else if (p[0] == '%' && p[1] == 'p') n = snprintf(path + o, sizeof path - o, "%ld", (long)getpid());
    else if (p[0] == '%' && p[1] == 'r') n = snprintf(path + o, sizeof path - o, "%d", c->rank);
    if (n < 0) {
      path[o++] = *p;
      continue;
    }
    o += (size_t)n < sizeof path - o ? (size_t)n : sizeof path - o - 1;
    p++;
  }
  path[o] = 0;
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    BLOG_WARN(BRAID_SUB_INIT, c->rank, "cannot open BRAID_TRACE_FILE \"%s\"; the flight recorder goes to the log",
              path);
    return NULL;
  }
  FILE *f = fdopen(fd, "a");
  if (!f) close(fd);
  return f;
}

void braid__trace_dump(braid_comm *c, const char *reason) {
  braid__trace *t = c->trace;
  if (!t) return;
  FILE *f = open_dump(c);
  char *buf = NULL;
  size_t blen = 0;
  FILE *out = f ? f : open_memstream(&buf, &blen);
  if (!out) return;
  /* Point-to-point operations that completed since braid_sync last looked. */
  for (braid__req *r = c->pending; r; r = r->pend_next)
    if (r->done && r->trace_id) braid__trace_req_done(c, r);
  char err[BRAID_ERRLEN];
  pthread_mutex_lock(&c->err_lock);
  snprintf(err, sizeof err, "%s", atomic_load(&c->failed) ? c->fatal_error : "");
  pthread_mutex_unlock(&c->err_lock);
  fprintf(out, "{\"type\":\"header\",\"rank\":%d,\"size\":%d,\"backend\":\"%s\",\"comm\":\"%llx\",\"pid\":%ld,"
               "\"seq\":%llu,\"reason\":\"",
          c->rank, c->size, c->ops->name, (unsigned long long)c->id, (long)getpid(), (unsigned long long)c->seq);
  json_str(out, reason);
  fprintf(out, "\",\"time\":%.6f,\"error\":\"", braid__now());
  json_str(out, err);
  fprintf(out, "\"}\n");
  uint64_t first = t->next > t->depth ? t->next - t->depth : 0;
  for (uint64_t i = first; i < t->next; i++) {
    const braid__trace_ent *e = &t->ent[i % t->depth];
    fprintf(out, "{\"type\":\"op\",\"rank\":%d,\"comm\":\"%llx\",\"seq\":%llu,\"op\":\"%s\",\"dtype\":\"%s\","
                 "\"count\":%llu,",
            c->rank, (unsigned long long)c->id, (unsigned long long)e->seq, kind_name(e->kind),
            braid_dtype_name((braid_dtype)e->dt) ? braid_dtype_name((braid_dtype)e->dt) : "?",
            (unsigned long long)e->count);
    if (e->kind == BRAID__COLL_BROADCAST) fprintf(out, "\"root\":%d,", (int)e->arg);
    if (e->kind == BRAID__COLL_ALL_REDUCE || e->kind == BRAID__COLL_REDUCE_SCATTER)
      fprintf(out, "\"redop\":\"%s\",", braid_op_name((braid_op)e->arg) ? braid_op_name((braid_op)e->arg) : "?");
    if (e->kind >= BRAID__TRACE_SEND) fprintf(out, "\"peer\":%d,\"tag\":%u,", (int)e->peer, (unsigned)e->arg);
    const char *algo = e->algo;
    fprintf(out, "\"algo\":\"%s\",\"state\":\"%s\",\"status\":\"%s\",\"t0\":%.6f,\"t1\":%.6f}\n", algo ? algo : "-",
            state_name(e->state), braid_status_string((braid_status)e->status), e->t0, e->t1);
  }
  if (f) {
    fclose(f);
    return;
  }
  fclose(out);
  /* To the log, one line per record, whatever the level. */
  for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
    BLOG_ERROR(BRAID_SUB_COLL, c->rank, "flight recorder: %s", line);
  free(buf);
}

void braid__trace_poll_signal(braid_comm *c) {
  unsigned g = atomic_load_explicit(&signal_gen, memory_order_relaxed);
  if (g == c->trace_signal_seen) return;
  c->trace_signal_seen = g;
  braid__trace_dump(c, "signal");
}
