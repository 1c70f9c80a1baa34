/* Rendezvous store: operations, blocking semantics, authentication, limits,
   hostile clients, connection retry, and the frame parser over bad input. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/store.h"
#include "bootstrap/store_proto.h"
#include "core/log.h"
#include "harness.h"
#include "os/sock.h"
#include "os/time.h"
#include "../fuzz/store_frame_driver.h"

static const uint8_t TOKEN_A[32] = {0xa1, 0xa2, 0xa3, 0xa4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
static const uint8_t TOKEN_B[32] = {0xb1, 0xb2, 0xb3, 0xb4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

static braid__store_server *start_server(const uint8_t *token) {
  char err[512];
  braid__store_server *s = NULL;
  if (braid__store_server_start("127.0.0.1", 0, token, token ? 32 : 0, &s, err, sizeof err) != BRAID_OK) {
    fprintf(stderr, "server start: %s\n", err);
    return NULL;
  }
  return s;
}

/* A server with an authentication timeout and a connection cap (0: the
   default), once its thread has picked them up. */
static braid__store_server *start_limited(const uint8_t *token, double auth_s, int max_conns, int *port) {
  braid__store_server *s = start_server(token);
  if (!s) return NULL;
  braid__store_server_set_limits(s, 0, auth_s, max_conns, 0);
  *port = braid__store_server_port(s);
  braid__sleep(0.05);
  return s;
}

static braid__store *connect_to(int port, const uint8_t *token) {
  char err[512];
  braid__store *st = NULL;
  if (braid__store_connect("127.0.0.1", port, token, token ? 32 : 0, braid__deadline(10), &st, err, sizeof err) !=
      BRAID_OK) {
    fprintf(stderr, "connect: %s\n", err);
    return NULL;
  }
  return st;
}

static int get_str(braid__store *st, const char *key, char *out, size_t cap, double timeout) {
  void *v = NULL;
  size_t n = 0;
  braid_status s = braid__store_get(st, key, &v, &n, braid__deadline(timeout));
  if (s != BRAID_OK) return -(int)s;
  if (n >= cap) n = cap - 1;
  memcpy(out, v, n);
  out[n] = 0;
  free(v);
  return 0;
}

/* ---- raw sockets speaking the protocol by hand ---- */

static int raw_connect(int port) {
  int fd = -1;
  char why[256];
  if (braid__sock_connect("127.0.0.1", port, braid__deadline(5), &fd, why, sizeof why) != 0) return -1;
  return fd;
}

static int raw_send(int fd, const void *p, size_t n) {
  return braid__sock_write_full(fd, p, n, braid__deadline(5)) == BRAID__SOCK_OK ? 0 : -1;
}

/* Reads one frame; payload malloc'd into *pl. Returns 0, or a BRAID__SOCK_* code. */
static int raw_read_frame(int fd, braid__proto_hdr *h, uint8_t **pl, double timeout) {
  uint8_t hb[BRAID__PROTO_HDR];
  *pl = NULL;
  int r = braid__sock_read_full(fd, hb, sizeof hb, braid__deadline(timeout));
  if (r != BRAID__SOCK_OK) return r;
  if (braid__proto_parse_hdr(hb, BRAID__STORE_MAX_VALUE + 64u, h) != 0) return BRAID__SOCK_ERR;
  *pl = malloc(h->len + 1);
  return braid__sock_read_full(fd, *pl, h->len, braid__deadline(timeout));
}

/* Plays the client side of a token-less handshake. */
static int raw_hello(int fd) {
  braid__proto_hdr h;
  uint8_t *pl;
  if (raw_read_frame(fd, &h, &pl, 5) != 0 || h.type != BRAID__PT_S_HELLO) return -1;
  free(pl);
  uint8_t zero[32] = {0};
  braid__buf b = {0};
  size_t at = braid__proto_begin(&b, BRAID__PT_C_HELLO, 0, 0);
  braid__proto_put_hello(&b, 0, zero, zero);
  braid__proto_end(&b, at);
  int r = raw_send(fd, b.p, b.len);
  braid__buf_free(&b);
  if (r != 0 || raw_read_frame(fd, &h, &pl, 5) != 0 || h.type != BRAID__PT_AUTH_OK) return -1;
  free(pl);
  return 0;
}

/* Waits for the server to close fd: 1 if it did within timeout. */
static int raw_closed_within(int fd, double timeout) {
  double dl = braid__deadline(timeout);
  char buf[4096];
  for (;;) {
    short rev = 0;
    int r = braid__sock_poll1(fd, POLLIN, dl, &rev);
    if (r <= 0) return 0;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0) return 1;
    if (n < 0 && errno != EINTR && errno != EAGAIN) return 1; /* reset */
  }
}

/* A raw SET frame with arbitrary key and value sizes (contents 'k' / 'v'). */
static void raw_set_frame(braid__buf *b, uint32_t seq, size_t klen, size_t vlen) {
  size_t at = braid__proto_begin(b, BRAID__PT_SET, 0, seq);
  braid__buf_u32(b, (uint32_t)klen);
  if (braid__buf_reserve(b, klen) == 0) {
    memset(b->p + b->len, 'k', klen);
    b->len += klen;
  }
  braid__buf_u32(b, (uint32_t)vlen);
  if (braid__buf_reserve(b, vlen) == 0) {
    memset(b->p + b->len, 'v', vlen);
    b->len += vlen;
  }
  braid__proto_end(b, at);
}

/* A good client still works: SET then GET. */
static int still_serves(int port, const uint8_t *token, const char *key) {
  braid__store *st = connect_to(port, token);
  BT_CHECK(st != NULL, "a good client could not connect after the bad one");
  BT_CHECK(braid__store_set(st, key, "alive", 5) == BRAID_OK, "set: %s", braid__store_error(st));
  char v[16];
  BT_CHECK(get_str(st, key, v, sizeof v, 5) == 0 && !strcmp(v, "alive"), "get: %s", braid__store_error(st));
  braid__store_close(st);
  return 0;
}

/* ------------------------------------------------------------------------ */

static int test_token_helpers(void) {
  uint8_t t[32], u[32];
  char hex[65], hex2[65];
  BT_CHECK(braid__token_generate(t) == 0, "generate");
  braid__token_format(t, hex);
  BT_CHECK(strlen(hex) == 64, "format length %zu", strlen(hex));
  BT_CHECK(braid__token_parse(hex, u) == 0 && !memcmp(t, u, 32), "roundtrip");
  for (int i = 0; hex[i]; i++) hex2[i] = (char)((hex[i] >= 'a' && hex[i] <= 'f') ? hex[i] - 32 : hex[i]);
  hex2[64] = 0;
  BT_CHECK(braid__token_parse(hex2, u) == 0 && !memcmp(t, u, 32), "upper-case hex accepted");
  uint8_t t2[32];
  BT_CHECK(braid__token_generate(t2) == 0 && memcmp(t, t2, 32) != 0, "two tokens differ");
  memcpy(hex2, hex, 65);
  hex2[10] = 'g';
  BT_CHECK(braid__token_parse(hex2, u) != 0, "non-hex digit rejected");
  BT_CHECK(braid__token_parse("abcd", u) != 0, "short rejected");
  char longer[70];
  snprintf(longer, sizeof longer, "%s00", hex);
  BT_CHECK(braid__token_parse(longer, u) != 0, "long rejected");
  BT_CHECK(braid__token_parse(NULL, u) != 0, "NULL rejected");
  BT_CHECK(braid__token_parse("", u) != 0, "empty rejected");
  return 0;
}

static int test_basic_ops(void) {
  braid__store_server *srv = start_server(TOKEN_A);
  BT_CHECK(srv, "server");
  braid__store *st = connect_to(braid__store_server_port(srv), TOKEN_A);
  BT_CHECK(st, "connect");

  const uint8_t bin[5] = {0, 1, 0, 255, 7};
  BT_CHECK(braid__store_set(st, "bin", bin, sizeof bin) == BRAID_OK, "%s", braid__store_error(st));
  void *v = NULL;
  size_t n = 0;
  BT_CHECK(braid__store_get(st, "bin", &v, &n, braid__deadline(1)) == BRAID_OK, "%s", braid__store_error(st));
  BT_CHECK(n == 5 && !memcmp(v, bin, 5), "binary value roundtrip");
  free(v);
  BT_CHECK(braid__store_set(st, "empty", NULL, 0) == BRAID_OK, "%s", braid__store_error(st));
  BT_CHECK(braid__store_get(st, "empty", &v, &n, braid__deadline(1)) == BRAID_OK && n == 0 && v, "empty value");
  free(v);
  BT_CHECK(braid__store_set(st, "bin", "xy", 2) == BRAID_OK, "overwrite");
  char s[64];
  BT_CHECK(get_str(st, "bin", s, sizeof s, 1) == 0 && !strcmp(s, "xy"), "overwritten value %s", s);

  /* ADD: missing key counts as 0; stored as decimal text. */
  int64_t r = 0;
  BT_CHECK(braid__store_add(st, "ctr", 5, &r) == BRAID_OK && r == 5, "add 5 -> %lld", (long long)r);
  BT_CHECK(braid__store_add(st, "ctr", -7, &r) == BRAID_OK && r == -2, "add -7 -> %lld", (long long)r);
  BT_CHECK(get_str(st, "ctr", s, sizeof s, 1) == 0 && !strcmp(s, "-2"), "counter text %s", s);
  BT_CHECK(braid__store_set(st, "ctr2", "40", 2) == BRAID_OK, "seed");
  BT_CHECK(braid__store_add(st, "ctr2", 2, &r) == BRAID_OK && r == 42, "seeded add -> %lld", (long long)r);
  BT_CHECK(braid__store_set(st, "big", "9223372036854775807", 19) == BRAID_OK, "seed max");
  BT_CHECK(braid__store_add(st, "big", 1, &r) == BRAID_OK && r == INT64_MIN, "wraps");
  BT_CHECK(braid__store_add(st, "bin", 1, &r) == BRAID_ERR_INVALID_ARG, "ADD on non-counter");
  BT_CHECK(strstr(braid__store_error(st), "not a decimal integer"), "msg: %s", braid__store_error(st));

  /* CAS */
  int swapped = -1;
  void *cur = NULL;
  size_t cl = 0;
  BT_CHECK(braid__store_cas(st, "lock", NULL, 0, "A", 1, &swapped, &cur, &cl) == BRAID_OK, "%s",
           braid__store_error(st));
  BT_CHECK(swapped == 1 && cl == 1 && !memcmp(cur, "A", 1), "create-if-missing swapped");
  free(cur);
  BT_CHECK(braid__store_cas(st, "lock", NULL, 0, "B", 1, &swapped, &cur, &cl) == BRAID_OK, "cas");
  BT_CHECK(swapped == 0 && cl == 1 && !memcmp(cur, "A", 1), "create-if-missing on existing: no swap, current A");
  free(cur);
  BT_CHECK(braid__store_cas(st, "lock", "Z", 1, "B", 1, &swapped, &cur, &cl) == BRAID_OK, "cas");
  BT_CHECK(swapped == 0 && cl == 1 && !memcmp(cur, "A", 1), "different expected: no swap");
  free(cur);
  BT_CHECK(braid__store_cas(st, "lock", "A", 1, "BB", 2, &swapped, &cur, &cl) == BRAID_OK, "cas");
  BT_CHECK(swapped == 1 && cl == 2 && !memcmp(cur, "BB", 2), "equal expected: swapped");
  free(cur);
  BT_CHECK(braid__store_cas(st, "nokey", "A", 1, "B", 1, &swapped, &cur, &cl) == BRAID_OK, "cas");
  BT_CHECK(swapped == 0 && cur == NULL, "expected on a missing key: no swap, no value");
  BT_CHECK(get_str(st, "lock", s, sizeof s, 1) == 0 && !strcmp(s, "BB"), "value after cas %s", s);

  /* DELETE */
  int existed = -1;
  BT_CHECK(braid__store_delete(st, "lock", &existed) == BRAID_OK && existed == 1, "delete existing");
  BT_CHECK(braid__store_delete(st, "lock", &existed) == BRAID_OK && existed == 0, "delete missing");
  BT_CHECK(braid__store_get(st, "lock", &v, &n, braid__deadline(0.05)) == BRAID_ERR_TIMEOUT, "deleted key gone");

  braid__store_close(st);
  braid__store_server_stop(srv);
  return 0;
}

typedef struct adder {
  int port;
  int id;
  int ok;
  char err[512];
} adder;

static void *add_worker(void *p) {
  adder *a = p;
  braid__store *st = connect_to(a->port, TOKEN_A);
  if (!st) return NULL;
  char key[64], val[64];
  for (int i = 0; i < 1000; i++) {
    int64_t r;
    if (braid__store_add(st, "total", 1, &r) != BRAID_OK) {
      snprintf(a->err, sizeof a->err, "add: %s", braid__store_error(st));
      goto out;
    }
    if (i % 50 == 0) {
      snprintf(key, sizeof key, "w%d/%d", a->id, i);
      snprintf(val, sizeof val, "v%d-%d", a->id, i);
      if (braid__store_set(st, key, val, strlen(val)) != BRAID_OK) goto out;
      /* Another worker's key of the same round: blocks until it exists. */
      snprintf(key, sizeof key, "w%d/%d", (a->id + 1) % 8, i);
      char got[64], want[64];
      snprintf(want, sizeof want, "v%d-%d", (a->id + 1) % 8, i);
      if (get_str(st, key, got, sizeof got, 20) != 0 || strcmp(got, want) != 0) {
        snprintf(a->err, sizeof a->err, "get %s: %s", key, braid__store_error(st));
        goto out;
      }
    }
  }
  a->ok = 1;
out:
  braid__store_close(st);
  return NULL;
}

static int test_concurrent_clients(void) {
  braid__store_server *srv = start_server(TOKEN_A);
  BT_CHECK(srv, "server");
  enum { N = 8 };
  pthread_t t[N];
  adder a[N];
  for (int i = 0; i < N; i++) {
    a[i] = (adder){braid__store_server_port(srv), i, 0, ""};
    BT_CHECK(pthread_create(&t[i], NULL, add_worker, &a[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < N; i++) BT_CHECK(a[i].ok, "worker %d: %s", i, a[i].err);
  braid__store *st = connect_to(braid__store_server_port(srv), TOKEN_A);
  BT_CHECK(st, "connect");
  int64_t r = -1;
  BT_CHECK(braid__store_add(st, "total", 0, &r) == BRAID_OK && r == N * 1000, "total %lld", (long long)r);
  braid__store_close(st);
  braid__store_server_stop(srv);
  return 0;
}

typedef struct getter {
  int port;
  const char *key;
  double timeout;
  braid_status st;
  char val[64];
  char err[512];
  double elapsed;
  _Atomic int asking; /* set just before the get: a thread can start late, and the test acts only after it */
} getter;

static void *get_worker(void *p) {
  getter *g = p;
  braid__store *st = connect_to(g->port, TOKEN_A);
  if (!st) {
    g->st = BRAID_ERR_BOOTSTRAP;
    return NULL;
  }
  double t0 = braid__now();
  void *v = NULL;
  size_t n = 0;
  atomic_store(&g->asking, 1);
  g->st = braid__store_get(st, g->key, &v, &n, isinf(g->timeout) ? INFINITY : braid__deadline(g->timeout));
  g->elapsed = braid__now() - t0;
  if (g->st == BRAID_OK) {
    snprintf(g->val, sizeof g->val, "%.*s", (int)n, (char *)v);
    free(v);
  }
  snprintf(g->err, sizeof g->err, "%s", braid__store_error(st));
  braid__store_close(st);
  return NULL;
}

static int test_blocking_get(void) {
  braid__store_server *srv = start_server(TOKEN_A);
  BT_CHECK(srv, "server");
  int port = braid__store_server_port(srv);
  getter g = {port, "later", 10, BRAID_ERR_INTERNAL, "", "", 0, 0};
  pthread_t t;
  BT_CHECK(pthread_create(&t, NULL, get_worker, &g) == 0, "pthread_create");
  BT_CHECK(bt_await(&g.asking, 1, 10), "the getter never connected: %s", g.err);
  braid__sleep(0.3);
  braid__store *st = connect_to(port, TOKEN_A);
  BT_CHECK(st, "connect");
  BT_CHECK(braid__store_set(st, "later", "here", 4) == BRAID_OK, "%s", braid__store_error(st));
  pthread_join(t, NULL);
  BT_CHECK(g.st == BRAID_OK && !strcmp(g.val, "here"), "blocked get: %s (%s)", braid_status_string(g.st), g.err);
  BT_CHECK(g.elapsed >= 0.2 && g.elapsed < 5, "get returned after %.3f s", g.elapsed);
  braid__store_close(st);
  braid__store_server_stop(srv);
  return 0;
}

static int test_get_timeout(void) {
  braid__store_server *srv = start_server(TOKEN_A);
  BT_CHECK(srv, "server");
  braid__store *st = connect_to(braid__store_server_port(srv), TOKEN_A);
  BT_CHECK(st, "connect");
  double t0 = braid__now();
  void *v = NULL;
  size_t n = 0;
  braid_status s = braid__store_get(st, "never", &v, &n, braid__deadline(0.2));
  double dt = braid__now() - t0;
  BT_CHECK(s == BRAID_ERR_TIMEOUT, "got %s", braid_status_string(s));
  BT_CHECK(dt >= 0.2 && dt < 5, "timed out after %.3f s", dt);
  BT_CHECK(strstr(braid__store_error(st), "\"never\""), "message names the key: %s", braid__store_error(st));
  /* The connection stays usable after a timeout. */
  BT_CHECK(braid__store_set(st, "k", "v", 1) == BRAID_OK, "%s", braid__store_error(st));
  char buf[8];
  BT_CHECK(get_str(st, "k", buf, sizeof buf, 1) == 0 && !strcmp(buf, "v"), "after timeout");
  /* A deadline already passed answers at once. */
  t0 = braid__now();
  BT_CHECK(braid__store_get(st, "never", &v, &n, braid__now() - 1) == BRAID_ERR_TIMEOUT, "passed deadline");
  BT_CHECK(braid__now() - t0 < 1, "passed deadline answered at once");
  braid__store_close(st);
  braid__store_server_stop(srv);
  return 0;
}

typedef struct delayed_set {
  int port;
  double delay;
  const char *key;
} delayed_set;

static void *set_later(void *p) {
  delayed_set *d = p;
  braid__sleep(d->delay);
  braid__store *st = connect_to(d->port, TOKEN_A);
  if (st) {
    (void)braid__store_set(st, d->key, "1", 1);
    braid__store_close(st);
  }
  return NULL;
}

static int test_wait_keys(void) {
  braid__store_server *srv = start_server(TOKEN_A);
  BT_CHECK(srv, "server");
  int port = braid__store_server_port(srv);
  braid__store *st = connect_to(port, TOKEN_A);
  BT_CHECK(st, "connect");
  BT_CHECK(braid__store_set(st, "a", "1", 1) == BRAID_OK && braid__store_set(st, "c", "1", 1) == BRAID_OK, "set");
  const char *keys[3] = {"a", "b", "c"};
  int present[3] = {-1, -1, -1};
  double t0 = braid__now();
  braid_status s = braid__store_wait(st, keys, 3, braid__deadline(0.2), present);
  double dt = braid__now() - t0;
  BT_CHECK(s == BRAID_ERR_TIMEOUT, "got %s", braid_status_string(s));
  BT_CHECK(dt >= 0.2 && dt < 5, "after %.3f s", dt);
  BT_CHECK(present[0] == 1 && present[1] == 0 && present[2] == 1, "present %d %d %d", present[0], present[1],
           present[2]);
  BT_CHECK(strstr(braid__store_error(st), "\"b\""), "names the missing key: %s", braid__store_error(st));
  /* A check (deadline passed) answers at once. */
  t0 = braid__now();
  BT_CHECK(braid__store_wait(st, keys, 3, braid__now(), present) == BRAID_ERR_TIMEOUT && present[1] == 0, "check");
  BT_CHECK(braid__now() - t0 < 1, "check answered at once");
  /* Satisfied by a later SET from another client. */
  delayed_set d = {port, 0.15, "b"};
  pthread_t t;
  BT_CHECK(pthread_create(&t, NULL, set_later, &d) == 0, "pthread_create");
  s = braid__store_wait(st, keys, 3, braid__deadline(10), present);
  pthread_join(t, NULL);
  BT_CHECK(s == BRAID_OK, "wait: %s", braid__store_error(st));
  BT_CHECK(present[0] && present[1] && present[2], "all present");
  BT_CHECK(braid__store_wait(st, keys, 0, braid__deadline(1), NULL) == BRAID_OK, "empty list");
  braid__store_close(st);
  braid__store_server_stop(srv);
  return 0;
}

enum { NWAITERS = 64 };

typedef struct waiter {
  int port;
  int id;
  int ok;
} waiter;

/* The bootstrap pattern: publish my key, wait for everyone's, read one. */
static void *waiter_main(void *p) {
  waiter *w = p;
  braid__store *st = connect_to(w->port, TOKEN_A);
  if (!st) return NULL;
  char key[32], val[32];
  snprintf(key, sizeof key, "rank%d", w->id);
  snprintf(val, sizeof val, "addr-of-%d", w->id);
  const char *keys[NWAITERS];
  char names[NWAITERS][32];
  for (int i = 0; i < NWAITERS; i++) {
    snprintf(names[i], sizeof names[i], "rank%d", i);
    keys[i] = names[i];
  }
  int present[NWAITERS];
  char got[32], want[32];
  int peer = (w->id + 7) % NWAITERS;
  snprintf(want, sizeof want, "addr-of-%d", peer);
  if (braid__store_set(st, key, val, strlen(val)) == BRAID_OK &&
      braid__store_wait(st, keys, NWAITERS, braid__deadline(20), present) == BRAID_OK &&
      get_str(st, names[peer], got, sizeof got, 1) == 0 && !strcmp(got, want))
    w->ok = 1;
  else
    fprintf(stderr, "waiter %d: %s\n", w->id, braid__store_error(st));
  braid__store_close(st);
  return NULL;
}

static int test_many_waiters(void) {
  braid__store_server *srv = start_server(TOKEN_A);
  BT_CHECK(srv, "server");
  pthread_t t[NWAITERS];
  waiter w[NWAITERS];
  for (int i = 0; i < NWAITERS; i++) {
    w[i] = (waiter){braid__store_server_port(srv), i, 0};
    BT_CHECK(pthread_create(&t[i], NULL, waiter_main, &w[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < NWAITERS; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < NWAITERS; i++) BT_CHECK(w[i].ok, "waiter %d failed", i);
  braid__store_server_stop(srv);
  return 0;
}

static int test_namespaces(void) {
  braid__store_server *srv = start_server(NULL); /* also covers the token-less loopback mode */
  BT_CHECK(srv, "server");
  int port = braid__store_server_port(srv);
  braid__store *a = connect_to(port, NULL), *b = connect_to(port, NULL), *root = connect_to(port, NULL);
  BT_CHECK(a && b && root, "connect");
  BT_CHECK(braid__store_set_prefix(a, "job1/") == BRAID_OK && braid__store_set_prefix(b, "job2/") == BRAID_OK, "prefix");
  BT_CHECK(braid__store_set(a, "k", "A", 1) == BRAID_OK && braid__store_set(b, "k", "B", 1) == BRAID_OK, "set");
  char v[8];
  BT_CHECK(get_str(a, "k", v, sizeof v, 1) == 0 && !strcmp(v, "A"), "a sees its own");
  BT_CHECK(get_str(b, "k", v, sizeof v, 1) == 0 && !strcmp(v, "B"), "b sees its own");
  BT_CHECK(get_str(root, "job1/k", v, sizeof v, 1) == 0 && !strcmp(v, "A"), "full name");
  BT_CHECK(braid__store_set(a, "only-a", "x", 1) == BRAID_OK, "set");
  void *p;
  size_t n;
  BT_CHECK(braid__store_get(b, "only-a", &p, &n, braid__deadline(0.05)) == BRAID_ERR_TIMEOUT, "b cannot see a's key");
  int64_t r;
  BT_CHECK(braid__store_add(a, "ctr", 1, &r) == BRAID_OK && r == 1, "add a");
  BT_CHECK(braid__store_add(b, "ctr", 1, &r) == BRAID_OK && r == 1, "separate counters");
  /* A clone keeps the prefix. */
  braid__store *c = NULL;
  char err[512];
  BT_CHECK(braid__store_clone(a, braid__deadline(5), &c, err, sizeof err) == BRAID_OK, "clone: %s", err);
  BT_CHECK(get_str(c, "k", v, sizeof v, 1) == 0 && !strcmp(v, "A"), "clone sees job1/k");
  braid__store_close(c);
  braid__store_close(a);
  braid__store_close(b);
  braid__store_close(root);
  braid__store_server_stop(srv);
  return 0;
}

static int test_oversized(void) {
  braid__store_server *srv = start_server(NULL);
  BT_CHECK(srv, "server");
  int port = braid__store_server_port(srv);
  braid__store *st = connect_to(port, NULL);
  BT_CHECK(st, "connect");
  /* Client-side checks. */
  char key[BRAID__STORE_MAX_KEY + 2];
  memset(key, 'x', sizeof key - 1);
  key[sizeof key - 1] = 0; /* 1025 bytes */
  BT_CHECK(braid__store_set(st, key, "v", 1) == BRAID_ERR_INVALID_ARG, "long key");
  BT_CHECK(strstr(braid__store_error(st), "1024-byte limit"), "msg: %s", braid__store_error(st));
  key[BRAID__STORE_MAX_KEY] = 0; /* exactly 1024 */
  BT_CHECK(braid__store_set(st, key, "v", 1) == BRAID_OK, "1024-byte key: %s", braid__store_error(st));
  BT_CHECK(braid__store_set_prefix(st, "p/") == BRAID_OK, "prefix");
  BT_CHECK(braid__store_set(st, key, "v", 1) == BRAID_ERR_INVALID_ARG, "prefix + key over the limit");
  BT_CHECK(braid__store_set_prefix(st, "") == BRAID_OK, "prefix");
  size_t big = BRAID__STORE_MAX_VALUE;
  char *val = malloc(big + 1);
  BT_CHECK(val, "malloc");
  for (size_t i = 0; i <= big; i++) val[i] = (char)(i * 31);
  BT_CHECK(braid__store_set(st, "v", val, big + 1) == BRAID_ERR_INVALID_ARG, "value over 16 MiB");
  BT_CHECK(strstr(braid__store_error(st), "limit"), "msg: %s", braid__store_error(st));
  BT_CHECK(braid__store_set(st, "v", val, big) == BRAID_OK, "16 MiB value: %s", braid__store_error(st));
  void *g = NULL;
  size_t n = 0;
  BT_CHECK(braid__store_get(st, "v", &g, &n, braid__deadline(10)) == BRAID_OK, "%s", braid__store_error(st));
  BT_CHECK(n == big && !memcmp(g, val, big), "16 MiB roundtrip");
  free(g);
  free(val);
  braid__store_close(st);

  /* Server-side: a raw client sends what the library refuses to send. */
  int fd = raw_connect(port);
  BT_CHECK(fd >= 0 && raw_hello(fd) == 0, "raw handshake");
  braid__buf b = {0};
  braid__proto_hdr h;
  uint8_t *pl;
  raw_set_frame(&b, 11, 2000, 1);
  raw_set_frame(&b, 12, 10, (size_t)BRAID__STORE_MAX_VALUE + 1);
  raw_set_frame(&b, 13, 10, 3);
  BT_CHECK(!b.oom && raw_send(fd, b.p, b.len) == 0, "send");
  braid__buf_free(&b);
  BT_CHECK(raw_read_frame(fd, &h, &pl, 10) == 0, "reply");
  BT_CHECK(h.seq == 11 && h.status == BRAID__PST_TOO_LARGE, "long key: seq %u status %u", h.seq, h.status);
  free(pl);
  BT_CHECK(raw_read_frame(fd, &h, &pl, 10) == 0, "reply");
  BT_CHECK(h.seq == 12 && h.status == BRAID__PST_TOO_LARGE, "big value: seq %u status %u", h.seq, h.status);
  free(pl);
  BT_CHECK(raw_read_frame(fd, &h, &pl, 10) == 0, "reply");
  BT_CHECK(h.seq == 13 && h.status == BRAID__PST_OK, "the connection still works: status %u", h.status);
  free(pl);
  close(fd);
  braid__store_server_stop(srv);
  return 0;
}

static int test_store_full(void) {
  braid__store_server *srv = start_server(TOKEN_A);
  BT_CHECK(srv, "server");
  braid__store_server_set_limits(srv, 0, 0, 0, 1u << 20);
  braid__store *st = connect_to(braid__store_server_port(srv), TOKEN_A);
  BT_CHECK(st, "connect");
  size_t n = 600u << 10;
  char *v = calloc(1, n);
  BT_CHECK(v, "calloc");
  BT_CHECK(braid__store_set(st, "one", v, n) == BRAID_OK, "%s", braid__store_error(st));
  BT_CHECK(braid__store_set(st, "two", v, n) == BRAID_ERR_NO_MEMORY, "over the total bound");
  BT_CHECK(strstr(braid__store_error(st), "full"), "msg: %s", braid__store_error(st));
  BT_CHECK(braid__store_set(st, "one", "small", 5) == BRAID_OK, "replacing frees room");
  BT_CHECK(braid__store_set(st, "two", v, n) == BRAID_OK, "fits now: %s", braid__store_error(st));
  free(v);
  braid__store_close(st);
  braid__store_server_stop(srv);
  return 0;
}

typedef struct hammer_arg {
  int port;
  volatile int *stop;
  int rounds;
  int ok;
} hammer_arg;

static void *hammer(void *p) {
  hammer_arg *h = p;
  braid__store *st = connect_to(h->port, TOKEN_A);
  if (!st) return NULL;
  h->ok = 1;
  while (!__atomic_load_n(h->stop, __ATOMIC_ACQUIRE)) {
    int64_t r;
    if (braid__store_add(st, "hits", 1, &r) != BRAID_OK) {
      h->ok = 0;
      break;
    }
    __atomic_fetch_add(&h->rounds, 1, __ATOMIC_RELAXED);
  }
  braid__store_close(st);
  return NULL;
}

static int read_file(const char *path, char *out, size_t cap) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  ssize_t n = read(fd, out, cap - 1);
  close(fd);
  out[n > 0 ? n : 0] = 0;
  return 0;
}

/* Sends this process's log at level to a new file named after tmpl. */
static int log_to_temp(char *tmpl, const char *level) {
  int fd = mkstemp(tmpl);
  if (fd < 0) return -1;
  close(fd);
  setenv("BRAID_LOG_FILE", tmpl, 1);
  setenv("BRAID_LOG", level, 1);
  braid__log_reload();
  return 0;
}

static int test_wrong_token(void) {
  char logpath[] = "/tmp/braid_store_log_XXXXXX";
  BT_CHECK(log_to_temp(logpath, "warn") == 0, "mkstemp");

  braid__store_server *srv = start_server(TOKEN_A);
  BT_CHECK(srv, "server");
  int port = braid__store_server_port(srv);
  enum { N = 4 };
  volatile int stop = 0;
  pthread_t t[N];
  hammer_arg h[N];
  for (int i = 0; i < N; i++) {
    h[i] = (hammer_arg){port, &stop, 0, 0};
    BT_CHECK(pthread_create(&t[i], NULL, hammer, &h[i]) == 0, "pthread_create");
  }
  braid__sleep(0.1);
  char err[512];
  braid__store *bad = NULL;
  double t0 = braid__now();
  braid_status s = braid__store_connect("127.0.0.1", port, TOKEN_B, 32, braid__deadline(5), &bad, err, sizeof err);
  BT_CHECK(s == BRAID_ERR_BOOTSTRAP && !bad, "wrong token: %s", braid_status_string(s));
  BT_CHECK(braid__now() - t0 < 2, "refused at once, not retried");
  char want[128];
  snprintf(want, sizeof want, "store at 127.0.0.1:%d refused the job token (wrong BRAID_TOKEN?)", port);
  BT_CHECK(strstr(err, want), "message: %s", err);
  /* Every right-token client has had time for a round, however loaded the machine. */
  for (double end = braid__now() + 10; braid__now() < end;) {
    int all = 1;
    for (int i = 0; i < N; i++) all &= __atomic_load_n(&h[i].rounds, __ATOMIC_RELAXED) > 0;
    if (all) break;
    braid__sleep(0.01);
  }
  __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
  int64_t total = 0;
  for (int i = 0; i < N; i++) {
    pthread_join(t[i], NULL);
    BT_CHECK(h[i].ok && h[i].rounds > 0, "right-token client %d kept working (%d rounds)", i, h[i].rounds);
    total += h[i].rounds;
  }
  braid__store *st = connect_to(port, TOKEN_A);
  BT_CHECK(st, "connect");
  int64_t r = -1;
  BT_CHECK(braid__store_add(st, "hits", 0, &r) == BRAID_OK && r == total, "hits %lld vs %lld", (long long)r,
           (long long)total);
  braid__store_close(st);
  braid__store_server_stop(srv);

  char log[8192];
  BT_CHECK(read_file(logpath, log, sizeof log) == 0, "read log");
  unlink(logpath);
  const char *line = strstr(log, "wrong job token");
  BT_CHECK(line, "log lacks the refusal: %s", log);
  BT_CHECK(strstr(log, "WARN") && strstr(log, "refused connection from 127.0.0.1:"), "log names the peer: %s", log);
  BT_CHECK(!strstr(line + 1, "wrong job token"), "one line per refusal: %s", log);
  return 0;
}

/* Count of non-overlapping occurrences of needle in text. */
static int count_of(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* A flood of refused clients: at most one warning line per second, and the
   ones left out are counted in a later line, so none goes unaccounted. */
static int test_refusals_rate_limited(void) {
  char logpath[] = "/tmp/braid_store_log_XXXXXX";
  BT_CHECK(log_to_temp(logpath, "warn") == 0, "mkstemp");
  braid__store_server *srv = start_server(TOKEN_A);
  BT_CHECK(srv, "server");
  int port = braid__store_server_port(srv);
  enum { N = 200 };
  double t0 = braid__now();
  for (int i = 0; i < N; i++) {
    char err[512];
    braid__store *bad = NULL;
    BT_CHECK(braid__store_connect("127.0.0.1", port, TOKEN_B, 32, braid__deadline(5), &bad, err, sizeof err) ==
                 BRAID_ERR_BOOTSTRAP,
             "wrong token %d accepted", i);
  }
  double flood = braid__now() - t0;
  braid__sleep(1.3); /* the count of the left-out lines follows within a second */
  BT_CHECK(still_serves(port, TOKEN_A, "after-flood") == 0, "still serving");
  braid__store_server_stop(srv);
  unsetenv("BRAID_LOG_FILE");
  unsetenv("BRAID_LOG");
  braid__log_reload();
  static char log[1 << 20];
  BT_CHECK(read_file(logpath, log, sizeof log) == 0, "read log");
  unlink(logpath);
  int lines = count_of(log, "refused connection from");
  BT_CHECK(lines >= 1 && lines <= 2 + (int)flood, "%d lines for %d refusals in %.2f s:\n%.2000s", lines, N, flood,
           log);
  int counted = 0;
  for (const char *p = log; (p = strstr(p, "store: ")); p++) {
    unsigned k;
    if (sscanf(p, "store: %u more connection", &k) == 1) counted += (int)k;
  }
  BT_CHECK(lines + counted == N, "%d lines and %d counted for %d refusals:\n%.2000s", lines, counted, N, log);
  return 0;
}

/* ---- a second user: children switched to uid 65534 (nobody); needs root ---- */

typedef struct nobody {
  pid_t pid;
  int to, from; /* pipes: parent to child, child to parent */
} nobody;

static int need_root(void) {
  if (geteuid() == 0) return 0;
  printf("  (not root: cannot switch a child to another uid; skipped)\n");
  return BT_SKIP;
}

/* Forks a child that runs body(in, out) as uid 65534 and exits. Called before
   the test starts a server thread, so the child holds no lock of one. */
static int nobody_start(nobody *nb, void (*body)(int in, int out)) {
  int to[2], from[2];
  if (pipe(to) != 0 || pipe(from) != 0) return -1;
  fflush(NULL);
  nb->pid = fork();
  if (nb->pid < 0) return -1;
  if (nb->pid == 0) {
    close(to[1]);
    close(from[0]);
    if (setgid(65534) != 0 || setuid(65534) != 0) {
      dprintf(from[1], "setup failed: %s", strerror(errno));
      _exit(0);
    }
    body(to[0], from[1]);
    _exit(0);
  }
  close(to[0]);
  close(from[1]);
  nb->to = to[1];
  nb->from = from[0];
  return 0;
}

static void nobody_send_int(const nobody *nb, int v) {
  ssize_t w = write(nb->to, &v, sizeof v);
  (void)w;
}

static int read_int(int fd) {
  int v = -1;
  return read(fd, &v, sizeof v) == (ssize_t)sizeof v ? v : -1;
}

/* Collects what the child wrote and waits for it. */
static void nobody_finish(nobody *nb, char *got, size_t len) {
  close(nb->to);
  size_t n = 0;
  ssize_t k;
  while (n < len - 1 && (k = read(nb->from, got + n, len - 1 - n)) > 0) n += (size_t)k;
  got[n] = 0;
  close(nb->from);
  waitpid(nb->pid, NULL, 0);
}

/* A token-less store on both loopback addresses (no host), whose port goes
   to a child running body as uid 65534; got receives the child's report.
   NULL when something failed (err says what). */
static braid__store_server *tokenless_vs_nobody(void (*body)(int in, int out), char *got, size_t gotlen, char *err,
                                                size_t errlen) {
  nobody nb;
  if (nobody_start(&nb, body) != 0) {
    snprintf(err, errlen, "fork: %s", strerror(errno));
    return NULL;
  }
  braid__store_server *srv = NULL;
  char why[400] = "";
  if (braid__store_server_start(NULL, 0, NULL, 0, &srv, why, sizeof why) != BRAID_OK) srv = NULL;
  nobody_send_int(&nb, srv ? braid__store_server_port(srv) : -1);
  nobody_finish(&nb, got, gotlen);
  snprintf(err, errlen, "server: %s", why);
  return srv;
}

static void connect_as_nobody(int in, int out) {
  int port = read_int(in);
  char res[2048] = "";
  const char *hosts[2] = {"127.0.0.1", "::1"};
  for (int i = 0; i < 2; i++) {
    char err[512] = "";
    braid__store *st = NULL;
    braid_status r = braid__store_connect(hosts[i], port, NULL, 0, braid__deadline(i ? 1 : 5), &st, err, sizeof err);
    if (i == 1 && r == BRAID_ERR_TIMEOUT) break; /* no IPv6 loopback here */
    size_t o = strlen(res);
    snprintf(res + o, sizeof res - o, "%s%s: %s: %s", o ? "\n" : "", hosts[i], braid_status_string(r),
             r == BRAID_OK ? "connected" : err);
    if (st) braid__store_close(st);
  }
  ssize_t w = write(out, res, strlen(res));
  (void)w;
}

/* Without a token the store admits its own user only: the owner of the
   peer's socket comes from the kernel. A child switched to another uid (this
   test needs root to switch) is refused, over IPv4 and, where there is one,
   the IPv6 loopback; the store's own user gets in. */
static int test_other_user_refused(void) {
  if (need_root()) return BT_SKIP;
  char logpath[] = "/tmp/braid_store_log_XXXXXX";
  BT_CHECK(log_to_temp(logpath, "warn") == 0, "mkstemp");
  char got[2048], err[512];
  braid__store_server *srv = tokenless_vs_nobody(connect_as_nobody, got, sizeof got, err, sizeof err);
  BT_CHECK(srv, "%s", err);
  int port = braid__store_server_port(srv);
  /* The store's own user still gets in. */
  BT_CHECK(still_serves(port, NULL, "same-user") == 0, "same-uid client");
  braid__store_server_stop(srv);
  unsetenv("BRAID_LOG_FILE");
  unsetenv("BRAID_LOG");
  braid__log_reload();
  char log[8192];
  BT_CHECK(read_file(logpath, log, sizeof log) == 0, "read log");
  unlink(logpath);
  BT_CHECK(strstr(got, "127.0.0.1: bootstrap failed: ") && !strstr(got, "connected"), "other uid: %s", got);
  if (!strstr(got, "::1: ")) printf("  (no IPv6 loopback here: only IPv4 checked)\n");
  char want[200];
  snprintf(want, sizeof want, "store at 127.0.0.1:%d has no job token, so it accepts connections from the user that "
                              "started it only", port);
  BT_CHECK(strstr(got, want), "message \"%s\" lacks \"%s\"", got, want);
  BT_CHECK(strstr(log, "refused connection from 127.0.0.1:") && strstr(log, "belongs to uid 65534") &&
               strstr(log, "admits its own user (uid 0) only"),
           "log: %s", log);
  return 0;
}

/* Connects to each loopback address and, without waiting for the store's
   hello, sends a client hello and a SET, then closes at once: the socket is
   gone (or a time-wait remnant without an owner) by the time the store looks. */
static void blind_set_as_nobody(int in, int out) {
  int port = read_int(in);
  const char *hosts[2] = {"127.0.0.1", "::1"};
  int sent[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    char key[32];
    snprintf(key, sizeof key, "injected-%d", i);
    uint8_t zero[64] = {0};
    braid__buf b = {0};
    size_t at = braid__proto_begin(&b, BRAID__PT_C_HELLO, 0, 0);
    braid__proto_put_hello(&b, 0, zero, zero + 32);
    braid__proto_end(&b, at);
    at = braid__proto_begin(&b, BRAID__PT_SET, 0, 7);
    braid__buf_str(&b, key, (uint32_t)strlen(key));
    braid__buf_str(&b, "by uid 65534", 12);
    braid__proto_end(&b, at);
    for (int t = 0; t < 40; t++) {
      int fd = -1;
      char why[256];
      if (braid__sock_connect(hosts[i], port, braid__deadline(2), &fd, why, sizeof why) != 0) break;
      if (braid__sock_write_full(fd, b.p, b.len, braid__deadline(2)) == BRAID__SOCK_OK) sent[i]++;
      close(fd);
    }
    braid__buf_free(&b);
  }
  dprintf(out, "%d %d", sent[0], sent[1]);
}

/* The owner of a connection its client already closed cannot be told (the
   kernel keeps a remnant of the socket that belongs to no one, listed as
   uid 0): such a connection is refused like one of another user, also when
   the store runs as root. Another user's blind hello and SET, sent before
   the store looks and followed by a close, never reach the key table. */
static int test_closed_owner_refused(void) {
  if (need_root()) return BT_SKIP;
  char got[256], err[512];
  braid__store_server *srv = tokenless_vs_nobody(blind_set_as_nobody, got, sizeof got, err, sizeof err);
  BT_CHECK(srv, "%s", err);
  int port = braid__store_server_port(srv);
  int sent[2] = {0, 0};
  BT_CHECK(sscanf(got, "%d %d", &sent[0], &sent[1]) == 2 && sent[0] > 0, "the other user's connections: %s", got);
  if (!sent[1]) printf("  (no IPv6 loopback here: only IPv4 checked)\n");
  braid__sleep(0.5); /* the store has read whatever it admitted */
  braid__store *st = connect_to(port, NULL);
  BT_CHECK(st, "the store's own user connects");
  for (int i = 0; i < 2; i++) {
    char key[32];
    snprintf(key, sizeof key, "injected-%d", i);
    void *v = NULL;
    size_t n = 0;
    int found = -1;
    BT_CHECK(braid__store_try_get(st, key, &v, &n, &found, braid__deadline(5)) == BRAID_OK, "%s",
             braid__store_error(st));
    free(v);
    BT_CHECK(found == 0, "uid 65534 set \"%s\" in a token-less store of uid 0 (%d blind connections over %s)", key,
             sent[i], i ? "::1" : "127.0.0.1");
  }
  braid__store_close(st);
  braid__store_server_stop(srv);
  return 0;
}

#define FLOOD_S 8.0

/* Connects and closes in a loop for FLOOD_S seconds; writes how many. */
static void flood_as_nobody(int in, int out) {
  int port = read_int(in);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  long n = 0;
  for (double end = braid__now() + FLOOD_S; braid__now() < end;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) n++;
    close(fd);
  }
  dprintf(out, "%ld", n);
}

/* Another user connecting in a loop is refused each time; the store's own
   rank is still served meanwhile: the store takes a bounded number of new
   connections per turn and asks the kernel about one socket per connection
   instead of reading its whole table. */
static int test_flood_other_user(void) {
  if (need_root()) return BT_SKIP;
  nobody nb[2];
  for (int i = 0; i < 2; i++) BT_CHECK(nobody_start(&nb[i], flood_as_nobody) == 0, "fork");
  braid__store_server *srv = start_server(NULL);
  int port = srv ? braid__store_server_port(srv) : -1;
  braid__store *st = srv ? connect_to(port, NULL) : NULL;
  for (int i = 0; i < 2; i++) nobody_send_int(&nb[i], port);
  double worst = 0, t0 = braid__now();
  int gets = 0, bad = 0;
  while (st && braid__now() - t0 < FLOOD_S + 1) {
    double t = braid__now();
    void *v = NULL;
    size_t n = 0;
    int found = 0;
    if (braid__store_try_get(st, "k", &v, &n, &found, braid__deadline(60)) != BRAID_OK) bad++;
    free(v);
    worst = fmax(worst, braid__now() - t);
    gets++;
    braid__sleep(0.1);
  }
  char got[2][64];
  for (int i = 0; i < 2; i++) nobody_finish(&nb[i], got[i], sizeof got[i]);
  BT_CHECK(srv && st, "server and client");
  BT_CHECK(!bad, "%d of %d reads failed: %s", bad, gets, braid__store_error(st));
  BT_CHECK(atol(got[0]) + atol(got[1]) > 100, "the flood did not run: %s / %s", got[0], got[1]);
  /* Generous: without the bounds a read waits out the whole flood. */
  BT_CHECK(worst < 5.0, "a read took %.2f s while uid 65534 connected %s + %s times", worst, got[0], got[1]);
  braid__store_close(st);
  braid__store_server_stop(srv);
  return 0;
}

/* Strangers that connect and never authenticate cannot lock ranks out: they
   count against a small cap of their own, past which the one waiting longest
   is dropped, and a full store drops one of them for a rank that arrives. */
static int test_handshake_flood(void) {
  int port;
  /* Long enough that the store's own timeout never frees a slot here. */
  braid__store_server *srv = start_limited(TOKEN_A, 120, 64, &port);
  BT_CHECK(srv, "server");
  braid__store *early = connect_to(port, TOKEN_A);
  BT_CHECK(early, "a rank connected before the flood");
  enum { N = 200 };
  int fds[N];
  for (int i = 0; i < N; i++) {
    fds[i] = raw_connect(port);
    BT_CHECK(fds[i] >= 0, "stranger %d", i);
  }
  char err[512];
  braid__store *late = NULL;
  braid_status s = braid__store_connect("127.0.0.1", port, TOKEN_A, 32, braid__deadline(5), &late, err, sizeof err);
  BT_CHECK(s == BRAID_OK, "a rank after %d unauthenticated connections: %s", N, err);
  BT_CHECK(braid__store_set(late, "late", "1", 1) == BRAID_OK, "%s", braid__store_error(late));
  BT_CHECK(braid__store_set(early, "early", "1", 1) == BRAID_OK, "an authenticated rank was dropped: %s",
           braid__store_error(early));
  BT_CHECK(raw_closed_within(fds[0], 5), "the oldest unauthenticated connection stays");
  for (int i = 0; i < N; i++) close(fds[i]);
  braid__store_close(late);
  braid__store_close(early);
  braid__store_server_stop(srv);
  /* Default bounds: strangers hold a few hundred connections at most, far
     below the 4096 ranks may open. */
  srv = start_limited(TOKEN_A, 120, 0, &port);
  BT_CHECK(srv, "server");
  enum { M = 1200 };
  static int many[M];
  int open_ = 0;
  for (; open_ < M; open_++) {
    many[open_] = raw_connect(port);
    if (many[open_] < 0) break;
  }
  BT_CHECK(open_ == M, "only %d of %d connections opened: %s", open_, M, strerror(errno));
  BT_CHECK(raw_closed_within(many[0], 5), "the oldest of %d unauthenticated connections stays", M);
  BT_CHECK(still_serves(port, TOKEN_A, "after-many") == 0, "a rank after %d unauthenticated connections", M);
  for (int i = 0; i < open_; i++) close(many[i]);
  braid__store_server_stop(srv);
  return 0;
}

/* Fake token-less store as uid 65534: answers a hello, and reports how many
   bytes the client sent it. */
static void fake_store_as_nobody(int in, int out) {
  (void)in;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  int l = socket(AF_INET, SOCK_STREAM, 0);
  if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 4) != 0 ||
      getsockname(l, (struct sockaddr *)&a, &al) != 0) {
    int bad = -1;
    ssize_t w = write(out, &bad, sizeof bad);
    (void)w;
    return;
  }
  int port = ntohs(a.sin_port);
  ssize_t w = write(out, &port, sizeof port);
  (void)w;
  short rev = 0;
  if (braid__sock_poll1(l, POLLIN, braid__deadline(10), &rev) != 1) return;
  int c = accept(l, NULL, NULL);
  if (c < 0) return;
  uint8_t zero[32] = {0};
  braid__buf b = {0};
  size_t at = braid__proto_begin(&b, BRAID__PT_S_HELLO, 0, 0);
  braid__proto_put_hello(&b, 0, zero, NULL);
  braid__proto_end(&b, at);
  (void)braid__sock_write_full(c, b.p, b.len, braid__deadline(2));
  size_t got = 0;
  uint8_t buf[4096];
  double dl = braid__deadline(3);
  int answered = 0;
  for (;;) {
    if (braid__sock_poll1(c, POLLIN, dl, &rev) != 1) break;
    ssize_t n = recv(c, buf, sizeof buf, 0);
    if (n <= 0) break;
    got += (size_t)n;
    if (!answered && got >= BRAID__PROTO_HDR + BRAID__PROTO_CHELLO_LEN) { /* then play along */
      answered = 1;
      at = braid__proto_begin(&b, BRAID__PT_AUTH_OK, 0, 0);
      braid__buf_put(&b, zero, sizeof zero);
      braid__proto_end(&b, at);
      (void)braid__sock_write_full(c, b.p + at, b.len - at, braid__deadline(2));
    }
  }
  braid__buf_free(&b);
  dprintf(out, "got %zu bytes", got);
}

/* A client without a token trusts a store of its own user only: another
   user's process that took the port first (and speaks the protocol) is
   refused before the client sends it anything. */
static int test_client_refuses_other_users_store(void) {
  if (need_root()) return BT_SKIP;
  nobody nb;
  BT_CHECK(nobody_start(&nb, fake_store_as_nobody) == 0, "fork");
  int port = read_int(nb.from);
  char err[512] = "";
  braid__store *st = NULL;
  braid_status s = port > 0 ? braid__store_connect("127.0.0.1", port, NULL, 0, braid__deadline(4), &st, err,
                                                   sizeof err)
                            : BRAID_ERR_SYSTEM;
  if (st) {
    (void)braid__store_set(st, "secret", "s", 1);
    braid__store_close(st);
  }
  char got[256];
  nobody_finish(&nb, got, sizeof got);
  BT_CHECK(port > 0, "the fake store did not start: %s", got);
  BT_CHECK(s == BRAID_ERR_BOOTSTRAP, "connect to uid 65534's store: %s (%s); the fake store %s",
           braid_status_string(s), err, got);
  BT_CHECK(strstr(err, "belongs to uid 65534") && strstr(err, "uid 0"), "message: %s", err);
  BT_CHECK(!strcmp(got, "got 0 bytes"), "the fake store %s", got);
  return 0;
}

static int test_token_mismatch(void) {
  char err[512];
  braid__store *st = NULL;
  /* Server with a token, client without. */
  braid__store_server *srv = start_server(TOKEN_A);
  BT_CHECK(srv, "server");
  int port = braid__store_server_port(srv);
  braid_status s = braid__store_connect("127.0.0.1", port, NULL, 0, braid__deadline(5), &st, err, sizeof err);
  BT_CHECK(s == BRAID_ERR_BOOTSTRAP && !st, "no token: %s", braid_status_string(s));
  BT_CHECK(strstr(err, "requires a job token") && strstr(err, "BRAID_TOKEN"), "message: %s", err);
  BT_CHECK(still_serves(port, TOKEN_A, "k1") == 0, "serves others");
  braid__store_server_stop(srv);
  /* Server without a token, client with one. */
  srv = start_server(NULL);
  BT_CHECK(srv, "server");
  port = braid__store_server_port(srv);
  s = braid__store_connect("127.0.0.1", port, TOKEN_A, 32, braid__deadline(5), &st, err, sizeof err);
  BT_CHECK(s == BRAID_ERR_BOOTSTRAP && !st, "unexpected token: %s", braid_status_string(s));
  BT_CHECK(strstr(err, "without a job token"), "message: %s", err);
  BT_CHECK(still_serves(port, NULL, "k2") == 0, "serves others");
  braid__store_server_stop(srv);
  return 0;
}

static int test_loopback_only(void) {
  /* Without a token a non-loopback bind request still binds loopback. */
  char err[512];
  braid__store_server *srv = NULL;
  BT_CHECK(braid__store_server_start("0.0.0.0", 0, NULL, 0, &srv, err, sizeof err) == BRAID_OK, "%s", err);
  BT_CHECK(still_serves(braid__store_server_port(srv), NULL, "lo") == 0, "loopback client served");
  braid__store_server_stop(srv);
  /* The state machine refuses a non-loopback peer (a raw socket cannot fake one). */
  braid__store_core *c = braid__store_core_new(NULL, 0);
  BT_CHECK(c, "core");
  braid__store_conn *k = braid__store_core_open(c, 0, "192.0.2.1:5000", 0);
  BT_CHECK(k && braid__store_core_dropped(k), "non-loopback dropped");
  size_t n = 0;
  const uint8_t *p = braid__store_core_pending(k, &n);
  BT_CHECK(n == BRAID__PROTO_HDR && p[4] == BRAID__PT_AUTH_FAIL && p[5] == BRAID__PST_NOT_LOOPBACK,
           "answered NOT_LOOPBACK");
  braid__store_core_free(c);
  return 0;
}

/* A plain listener on addr (numeric), port 0 = any; IPv6 sockets are v6-only, so
   each holds one family. Returns the fd (port in *port), or -1 when this host
   cannot bind addr at all. */
static int occupy(const char *addr, int *port) {
  struct sockaddr_storage ss;
  socklen_t sl;
  memset(&ss, 0, sizeof ss);
  struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
  if (inet_pton(AF_INET, addr, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)*port);
    sl = sizeof *a4;
  } else if (inet_pton(AF_INET6, addr, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)*port);
    sl = sizeof *a6;
  } else {
    return -1;
  }
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  if (ss.ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 4) != 0) {
    close(fd);
    return -1;
  }
  *port = braid__sock_local_port(fd);
  return fd;
}

/* Expects braid__store_server_start to refuse because want_addr is taken. */
static int start_refused(const char *host, int port, const uint8_t *token, const char *want_addr) {
  char err[512] = "";
  braid__store_server *srv = NULL;
  braid_status s = braid__store_server_start(host, port, token, token ? 32 : 0, &srv, err, sizeof err);
  if (srv) braid__store_server_stop(srv);
  BT_CHECK(s == BRAID_ERR_BOOTSTRAP && !srv, "host %s port %d %s token: started although %s is taken (%s)",
           host ? host : "(any)", port, token ? "with" : "without", want_addr, braid_status_string(s));
  char want[128];
  snprintf(want, sizeof want, "cannot listen on %s: %s", want_addr, strerror(EADDRINUSE));
  BT_CHECK(strstr(err, want), "message \"%s\" lacks \"%s\"", err, want);
  return 0;
}

/* The store binds the address it was asked for or fails: it never moves to
   another address or family, whose clients would reach another process. */
static int test_bind_no_fallback(void) {
  int six = 0, p6 = 0;
  int probe = occupy("::1", &p6);
  if (probe >= 0) six = 1, close(probe);
  char where[64];

  /* No token: 127.0.0.1 taken by someone else must not leave the store on ::1 alone. */
  int p = 0;
  int busy = occupy("127.0.0.1", &p);
  BT_CHECK(busy >= 0, "occupy 127.0.0.1");
  snprintf(where, sizeof where, "127.0.0.1:%d", p);
  BT_CHECK(start_refused(NULL, p, NULL, where) == 0, "no host, no token");
  BT_CHECK(start_refused("0.0.0.0", p, NULL, where) == 0, "non-loopback host, no token");
  BT_CHECK(start_refused("127.0.0.1", p, NULL, where) == 0, "127.0.0.1, no token");
  BT_CHECK(start_refused("127.0.0.1", p, TOKEN_A, where) == 0, "127.0.0.1 with a token");
  close(busy);

  if (six) {
    /* The IPv6 loopback side taken: the token-less store serves both loopbacks, so it fails too. */
    p = 0;
    busy = occupy("::1", &p);
    BT_CHECK(busy >= 0, "occupy ::1");
    snprintf(where, sizeof where, "[::1]:%d", p);
    BT_CHECK(start_refused(NULL, p, NULL, where) == 0, "::1 taken, no token");
    BT_CHECK(start_refused("::1", p, TOKEN_A, where) == 0, "::1 with a token");
    close(busy);
    /* With a token and no host: every interface. IPv6-only [::] taken must not
       leave the store on IPv4 alone. */
    p = 0;
    busy = occupy("::", &p);
    BT_CHECK(busy >= 0, "occupy [::]");
    snprintf(where, sizeof where, "[::]:%d (every interface)", p);
    BT_CHECK(start_refused(NULL, p, TOKEN_A, where) == 0, "[::] taken, token");
    close(busy);
  } else {
    printf("  (no IPv6 loopback here: the IPv6 cases are skipped)\n");
  }
  p = 0;
  busy = occupy("0.0.0.0", &p);
  BT_CHECK(busy >= 0, "occupy 0.0.0.0");
  snprintf(where, sizeof where, "%s:%d (every interface)", six ? "[::]" : "0.0.0.0", p);
  BT_CHECK(start_refused(NULL, p, TOKEN_A, where) == 0, "0.0.0.0 taken, token");
  close(busy);

  /* Port 0 finds a port free on both loopbacks, and both serve. */
  char err[512];
  braid__store_server *srv = NULL;
  BT_CHECK(braid__store_server_start(NULL, 0, NULL, 0, &srv, err, sizeof err) == BRAID_OK, "%s", err);
  int port = braid__store_server_port(srv);
  BT_CHECK(still_serves(port, NULL, "v4") == 0, "IPv4 loopback client");
  if (six) {
    braid__store *st = NULL;
    BT_CHECK(braid__store_connect("::1", port, NULL, 0, braid__deadline(5), &st, err, sizeof err) == BRAID_OK,
             "IPv6 loopback client: %s", err);
    BT_CHECK(braid__store_set(st, "v6", "x", 1) == BRAID_OK, "%s", braid__store_error(st));
    braid__store_close(st);
  }
  braid__store_server_stop(srv);
  return 0;
}

/* A non-loopback IPv4 address of this host, or "" when it has none. */
static void outside_addr(char *out, size_t len) {
  out[0] = 0;
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs) != 0) return;
  for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || braid__sock_is_loopback(i->ifa_addr)) continue;
    inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, out, (socklen_t)len);
    break;
  }
  freeifaddrs(ifs);
}

/* Without a token the store listens on loopback only, whatever it is asked,
   and says so in the log. */
static int test_no_token_says_so(void) {
  char logpath[] = "/tmp/braid_store_log_XXXXXX";
  BT_CHECK(log_to_temp(logpath, "info") == 0, "mkstemp");
  char err[512];
  braid__store_server *srv = NULL;
  BT_CHECK(braid__store_server_start("0.0.0.0", 0, NULL, 0, &srv, err, sizeof err) == BRAID_OK, "%s", err);
  int port = braid__store_server_port(srv);
  char ext[INET_ADDRSTRLEN];
  outside_addr(ext, sizeof ext);
  if (ext[0]) {
    /* Not bound there at all: the connection is refused by the kernel. */
    int fd = -1;
    char why[256];
    int r = braid__sock_connect(ext, port, braid__deadline(2), &fd, why, sizeof why);
    if (r == 0) close(fd);
    BT_CHECK(r == ECONNREFUSED, "connect to %s:%d: %s", ext, port, r ? why : "accepted");
  } else {
    printf("  (no non-loopback IPv4 address here)\n");
  }
  braid__store_server_stop(srv);
  unsetenv("BRAID_LOG_FILE");
  unsetenv("BRAID_LOG");
  braid__log_reload();
  char log[8192];
  BT_CHECK(read_file(logpath, log, sizeof log) == 0, "read log");
  unlink(logpath);
  BT_CHECK(strstr(log, "no job token, so listening on loopback only instead of 0.0.0.0"), "log: %s", log);
  char want[128];
  snprintf(want, sizeof want, "store: listening on 127.0.0.1:%d", port);
  BT_CHECK(strstr(log, want) && strstr(log, "no job token, so loopback clients only"), "log: %s", log);
  return 0;
}

static int test_garbage_dropped(void) {
  braid__store_server *srv = start_server(NULL);
  BT_CHECK(srv, "server");
  int port = braid__store_server_port(srv);
  unsigned long long rs = 12345;
  /* Random bytes before authentication. */
  for (int round = 0; round < 5; round++) {
    int fd = raw_connect(port);
    BT_CHECK(fd >= 0, "connect");
    uint8_t junk[300];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)bt_rand(&rs);
    (void)raw_send(fd, junk, sizeof junk);
    BT_CHECK(raw_closed_within(fd, 3), "random bytes: dropped");
    close(fd);
  }
  /* Bad magic in the hello. */
  int fd = raw_connect(port);
  BT_CHECK(fd >= 0, "connect");
  {
    uint8_t f[BRAID__PROTO_HDR + BRAID__PROTO_CHELLO_LEN] = {0};
    f[0] = BRAID__PROTO_CHELLO_LEN;
    f[4] = BRAID__PT_C_HELLO;
    memcpy(f + BRAID__PROTO_HDR, "HTTP", 4);
    (void)raw_send(fd, f, sizeof f);
  }
  BT_CHECK(raw_closed_within(fd, 3), "bad magic: dropped");
  close(fd);
  /* After authentication: a huge length, reserved bits, an unknown type, an
     inner length past the frame, and a frame cut short by a disconnect. */
  const uint32_t lens[] = {0xfffffff0u, BRAID__PROTO_MAX_PAYLOAD + 1};
  for (int i = 0; i < 5; i++) {
    fd = raw_connect(port);
    BT_CHECK(fd >= 0 && raw_hello(fd) == 0, "raw handshake");
    uint8_t f[BRAID__PROTO_HDR + 16] = {0};
    size_t n = BRAID__PROTO_HDR;
    f[4] = BRAID__PT_SET;
    if (i < 2) {
      uint32_t L = lens[i];
      f[0] = (uint8_t)L, f[1] = (uint8_t)(L >> 8), f[2] = (uint8_t)(L >> 16), f[3] = (uint8_t)(L >> 24);
    } else if (i == 2) {
      f[6] = 1; /* reserved */
    } else if (i == 3) {
      f[4] = 99;
    } else {
      f[0] = 8; /* SET whose key length claims 1000 bytes of an 8-byte payload */
      f[BRAID__PROTO_HDR] = 0xe8, f[BRAID__PROTO_HDR + 1] = 3;
      n += 8;
    }
    (void)raw_send(fd, f, n);
    BT_CHECK(raw_closed_within(fd, 3), "bad frame %d: dropped", i);
    close(fd);
  }
  fd = raw_connect(port);
  BT_CHECK(fd >= 0 && raw_hello(fd) == 0, "raw handshake");
  {
    uint8_t f[BRAID__PROTO_HDR + 4] = {100, 0, 0, 0, BRAID__PT_SET};
    (void)raw_send(fd, f, sizeof f); /* truncated: promises 100 bytes, sends 4, leaves */
  }
  close(fd);
  BT_CHECK(still_serves(port, NULL, "after-garbage") == 0, "still serving");
  braid__store_server_stop(srv);
  return 0;
}

static int test_slow_loris(void) {
  braid__store_server *srv = start_server(NULL);
  BT_CHECK(srv, "server");
  /* Limits of 2 s: a server held by either slow client would keep the good
     client waiting that long, far above the bound below, which leaves room
     for a loaded machine. */
  braid__store_server_set_limits(srv, 2.0, 2.0, 0, 0);
  int port = braid__store_server_port(srv);
  braid__sleep(0.05); /* the server thread picks the limits up */
  int silent = raw_connect(port); /* never authenticates */
  int partial = raw_connect(port);
  BT_CHECK(silent >= 0 && partial >= 0 && raw_hello(partial) == 0, "raw connections");
  uint8_t f[5] = {20, 0, 0, 0, BRAID__PT_SET};
  BT_CHECK(raw_send(partial, f, sizeof f) == 0, "partial header");
  /* Meanwhile a good client gets prompt answers. */
  braid__store *st = connect_to(port, NULL);
  BT_CHECK(st, "connect");
  double worst = 0;
  for (int i = 0; i < 20; i++) {
    double t0 = braid__now();
    int64_t r;
    BT_CHECK(braid__store_add(st, "n", 1, &r) == BRAID_OK && r == i + 1, "%s", braid__store_error(st));
    worst = fmax(worst, braid__now() - t0);
    braid__sleep(0.01);
  }
  BT_CHECK(worst < 1.0, "a request took %.3f s", worst);
  double t0 = braid__now();
  BT_CHECK(raw_closed_within(silent, 10), "unauthenticated connection dropped");
  BT_CHECK(raw_closed_within(partial, 10), "stalled partial frame dropped");
  BT_CHECK(braid__now() - t0 < 2.0 + 3, "dropped within the bound (%.2f s)", braid__now() - t0);
  close(silent);
  close(partial);
  int64_t r;
  BT_CHECK(braid__store_add(st, "n", 1, &r) == BRAID_OK && r == 21, "good client unaffected");
  braid__store_close(st);
  braid__store_server_stop(srv);
  return 0;
}

static int test_max_connections(void) {
  int port;
  braid__store_server *srv = start_limited(NULL, 0, 2, &port);
  BT_CHECK(srv, "server");
  braid__store *a = connect_to(port, NULL), *b = connect_to(port, NULL);
  BT_CHECK(a && b, "two connections");
  char err[512];
  braid__store *c = NULL;
  double t0 = braid__now();
  braid_status s = braid__store_connect("127.0.0.1", port, NULL, 0, braid__deadline(0.3), &c, err, sizeof err);
  BT_CHECK(s == BRAID_ERR_TIMEOUT && !c, "third refused until the deadline: %s", braid_status_string(s));
  BT_CHECK(strstr(err, "too many connections"), "message: %s", err);
  BT_CHECK(braid__now() - t0 < 3, "bounded");
  braid__store_close(b);
  BT_CHECK(braid__store_connect("127.0.0.1", port, NULL, 0, braid__deadline(5), &c, err, sizeof err) == BRAID_OK,
           "a slot freed: %s", err);
  BT_CHECK(braid__store_set(c, "x", "1", 1) == BRAID_OK, "%s", braid__store_error(c));
  braid__store_close(a);
  braid__store_close(c);
  braid__store_server_stop(srv);
  return 0;
}

static int test_stop_while_blocked(void) {
  braid__store_server *srv = start_server(TOKEN_A);
  BT_CHECK(srv, "server");
  braid__store *idle = connect_to(braid__store_server_port(srv), TOKEN_A);
  BT_CHECK(idle, "connect");
  getter g = {braid__store_server_port(srv), "never", INFINITY, BRAID_ERR_INTERNAL, "", "", 0, 0};
  pthread_t t;
  BT_CHECK(pthread_create(&t, NULL, get_worker, &g) == 0, "pthread_create");
  BT_CHECK(bt_await(&g.asking, 1, 10), "the getter never connected: %s", g.err);
  braid__sleep(0.3);
  double t0 = braid__now();
  braid__store_server_stop(srv);
  pthread_join(t, NULL);
  double dt = braid__now() - t0;
  BT_CHECK(g.st == BRAID_ERR_PEER_LOST, "got %s: %s", braid_status_string(g.st), g.err);
  BT_CHECK(strstr(g.err, "connection to the store at 127.0.0.1:") && strstr(g.err, "closed"), "message: %s", g.err);
  BT_CHECK(dt < 2, "noticed after %.3f s", dt);
  /* A client idle during the stop finds out at its next call, and every call after. */
  t0 = braid__now();
  BT_CHECK(braid__store_set(idle, "k", "v", 1) == BRAID_ERR_PEER_LOST, "idle client: %s", braid__store_error(idle));
  BT_CHECK(strstr(braid__store_error(idle), "closed"), "message: %s", braid__store_error(idle));
  int64_t r;
  BT_CHECK(braid__store_add(idle, "k", 1, &r) == BRAID_ERR_PEER_LOST, "stays lost");
  BT_CHECK(braid__now() - t0 < 2, "promptly");
  braid__store_close(idle);
  return 0;
}

typedef struct late_server {
  int port;
  double delay;
  braid__store_server *srv;
} late_server;

static void *start_later(void *p) {
  late_server *l = p;
  braid__sleep(l->delay);
  char err[512];
  if (braid__store_server_start("127.0.0.1", l->port, TOKEN_A, 32, &l->srv, err, sizeof err) != BRAID_OK)
    fprintf(stderr, "late server: %s\n", err);
  return NULL;
}

static int test_connect_retry(void) {
  int port = bt_free_port();
  BT_CHECK(port > 0, "free port");
  late_server l = {port, 0.3, NULL};
  pthread_t t;
  double t0 = braid__now(); /* before the thread, whose 0.3 s may start at once */
  BT_CHECK(pthread_create(&t, NULL, start_later, &l) == 0, "pthread_create");
  braid__store *st = NULL;
  char err[512];
  braid_status s = braid__store_connect("127.0.0.1", port, TOKEN_A, 32, braid__deadline(10), &st, err, sizeof err);
  double dt = braid__now() - t0;
  pthread_join(t, NULL);
  BT_CHECK(l.srv, "late server started");
  BT_CHECK(s == BRAID_OK, "connect: %s", err);
  BT_CHECK(dt >= 0.25 && dt < 5, "connected after %.3f s", dt);
  BT_CHECK(braid__store_set(st, "k", "v", 1) == BRAID_OK, "%s", braid__store_error(st));
  braid__store_close(st);
  braid__store_server_stop(l.srv);
  return 0;
}

static int test_connect_unreachable(void) {
  int port = bt_free_port();
  BT_CHECK(port > 0, "free port");
  braid__store *st = NULL;
  char err[512];
  double t0 = braid__now();
  braid_status s = braid__store_connect("127.0.0.1", port, TOKEN_A, 32, braid__deadline(0.3), &st, err, sizeof err);
  double dt = braid__now() - t0;
  BT_CHECK(s == BRAID_ERR_TIMEOUT && !st, "got %s", braid_status_string(s));
  BT_CHECK(dt >= 0.3 && dt < 2, "gave up after %.3f s", dt);
  char want[64];
  snprintf(want, sizeof want, "127.0.0.1:%d", port);
  BT_CHECK(strstr(err, "could not reach the store at") && strstr(err, want), "message: %s", err);
  BT_CHECK(strstr(err, "refused"), "names the last error: %s", err);
  /* Bad arguments are not retried. */
  BT_CHECK(braid__store_connect("127.0.0.1", 0, NULL, 0, braid__deadline(1), &st, err, sizeof err) ==
               BRAID_ERR_INVALID_ARG,
           "port 0");
  return 0;
}

static int test_address_families(void) {
  char err[512];
  braid__store_server *srv = NULL;
  /* With a token and no host: every interface, IPv4 clients included. */
  BT_CHECK(braid__store_server_start(NULL, 0, TOKEN_A, 32, &srv, err, sizeof err) == BRAID_OK, "%s", err);
  BT_CHECK(still_serves(braid__store_server_port(srv), TOKEN_A, "any") == 0, "IPv4 client of a wildcard server");
  braid__store_server_stop(srv);
  srv = NULL;
  if (braid__store_server_start("::1", 0, TOKEN_A, 32, &srv, err, sizeof err) != BRAID_OK) {
    printf("  (no IPv6 loopback here: %s)\n", err);
    return 0;
  }
  braid__store *st = NULL;
  BT_CHECK(braid__store_connect("::1", braid__store_server_port(srv), TOKEN_A, 32, braid__deadline(5), &st, err,
                                sizeof err) == BRAID_OK,
           "%s", err);
  BT_CHECK(braid__store_set(st, "k6", "v", 1) == BRAID_OK, "%s", braid__store_error(st));
  braid__store_close(st);
  braid__store_server_stop(srv);
  return 0;
}

/* ---- the fuzz driver over hand-made bad frames (runs under gcc in CI) ---- */

typedef struct corpus_case {
  const char *name;
  uint8_t mode;
  uint8_t data[96];
  size_t len;
  int want_dropped; /* 1 dropped, 0 alive, -1 either */
} corpus_case;

#define HDR(len, type) (uint8_t)(len), 0, 0, 0, (uint8_t)(type), 0, 0, 0, 1, 0, 0, 0

static int test_parser_corpus(void) {
  setenv("BRAID_LOG", "error", 1); /* every dropped connection would log a warning */
  braid__log_reload();
  static const corpus_case cases[] = {
      {"valid SET", 0, {HDR(10, 1), 1, 0, 0, 0, 'k', 1, 0, 0, 0, 'v'}, 22, 0},
      {"valid GET (parked)", 0, {HDR(9, 2), 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 'k'}, 21, 0},
      {"truncated header", 0, {10, 0, 0}, 3, 1},
      {"truncated payload", 0, {HDR(10, 1), 1, 0, 0}, 15, 1},
      {"length 0xffffffff", 0, {0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 1, 0, 0, 0}, 12, 1},
      {"length just over the limit", 0, {0x41, 0x04, 0x00, 0x02, 1, 0, 0, 0, 1, 0, 0, 0}, 12, 1},
      {"reserved bits", 0, {10, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0}, 12, 1},
      {"unknown type", 0, {HDR(0, 77)}, 12, 1},
      {"hello after auth", 0, {HDR(0, 0x11)}, 12, 1},
      {"inner length past the end", 0, {HDR(5, 1), 0xff, 0xff, 0, 0, 'k'}, 17, 1},
      {"trailing bytes", 0, {HDR(11, 1), 1, 0, 0, 0, 'k', 1, 0, 0, 0, 'v', 'x'}, 23, 1},
      {"WAIT with too many keys", 0, {HDR(8, 6), 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, 20, 1},
      {"CAS bad flag", 0, {HDR(14, 4), 1, 0, 0, 0, 'k', 7, 0, 0, 0, 0, 0, 0, 0, 0}, 26, 1},
      {"ADD short delta", 0, {HDR(8, 3), 1, 0, 0, 0, 'k', 1, 2, 3}, 20, 1},
      /* Raw handshakes (mode bit1). */
      {"bad magic", 2, {HDR(72, 0x11), 'B', 'A', 'D', '!', 1, 0}, 84, 1},
      {"bad version", 2, {HDR(72, 0x11), 'B', 'R', 'D', 'S', 9, 0}, 84, 1},
      {"hello cut short", 2, {HDR(72, 0x11), 'B', 'R', 'D', 'S', 1, 0}, 40, 1},
      {"hello with a wrong length", 2, {HDR(70, 0x11), 'B', 'R', 'D', 'S', 1, 0}, 82, 1},
      {"request before hello", 2, {HDR(0, 1)}, 12, 1},
      {"hello too long", 2, {HDR(255, 0x11), 'B', 'R', 'D', 'S'}, 16, 1},
      {"preauth length over bound", 2, {0x00, 0x10, 0, 0, 0x11, 0, 0, 0, 0, 0, 0, 0}, 12, 1},
      {"no token but server has one", 3, {0}, 0, 1}, /* nothing sent: the auth bound drops it */
      {"non-loopback without token", 4, {0}, 0, 1},
  };
  for (size_t i = 0; i < BT_COUNT(cases); i++) {
    uint8_t in[100];
    in[0] = cases[i].mode;
    memcpy(in + 1, cases[i].data, cases[i].len);
    sfd_result r;
    store_frame_run(in, cases[i].len + 1, &r);
    if (cases[i].want_dropped >= 0)
      BT_CHECK(r.dropped[0] == cases[i].want_dropped, "%s: dropped=%d", cases[i].name, r.dropped[0]);
  }
  /* Specific outcomes. */
  sfd_result r;
  uint8_t in[100] = {2, HDR(72, 0x11), 'B', 'R', 'D', 'S', 9, 0};
  store_frame_run(in, 85, &r);
  BT_CHECK(r.dropped_early[0] && r.last_status == BRAID__PST_VERSION, "bad version answered VERSION (%d)",
           r.last_status);
  uint8_t tr[] = {0, HDR(10, 1), 1, 0, 0};
  store_frame_run(tr, sizeof tr, &r);
  BT_CHECK(!r.dropped_early[0] && r.dropped[0], "a truncated frame waits, then the time bound drops it");
  uint8_t past[] = {0, HDR(12, 1), 0x01, 0x08, 0, 0, 'k', 'k', 'k', 'k', 'k', 'k', 'k', 'k'};
  store_frame_run(past, sizeof past, &r); /* key length 2049 in a 12-byte payload */
  BT_CHECK(r.dropped_early[0] && r.last_status == BRAID__PST_BAD_REQUEST, "inner length past the payload");
  uint8_t ok[] = {0, HDR(10, 1), 1, 0, 0, 0, 'k', 1, 0, 0, 0, 'v', HDR(5, 5), 1, 0, 0, 0, 'k'};
  store_frame_run(ok, sizeof ok, &r);
  BT_CHECK(!r.dropped[0] && r.replies == 2 && r.last_status == BRAID__PST_OK && r.authed[0], "good frames answered");
  /* Token mode: the driver's automatic handshake authenticates. */
  ok[0] = 1;
  store_frame_run(ok, sizeof ok, &r);
  BT_CHECK(r.authed[0] && r.replies == 2, "token handshake in the driver");

  /* Random inputs in every mode: no crash, every emitted frame well formed. */
  unsigned long long rs = 42;
  uint8_t buf[600];
  for (int it = 0; it < 3000; it++) {
    size_t n = 1 + (size_t)(bt_rand(&rs) % sizeof buf);
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)bt_rand(&rs);
    buf[0] &= 15;
    if (it % 3 == 0 && n > 13) { /* plausible header so parsing goes deeper */
      buf[1] = (uint8_t)(n - 13);
      buf[2] = buf[3] = buf[4] = 0;
      buf[5] = (uint8_t)(1 + bt_rand(&rs) % 6);
      buf[6] = buf[7] = 0;
      buf[0] &= ~(uint8_t)0x0a;
    }
    store_frame_run(buf, n, &r);
  }
  return 0;
}

static int test_proto_helpers(void) {
  int64_t v;
  const char *good[] = {"0", "-1", "9223372036854775807", "-9223372036854775808", "+5"};
  const int64_t want[] = {0, -1, INT64_MAX, INT64_MIN, 5};
  for (int i = 0; i < 5; i++)
    BT_CHECK(braid__proto_parse_i64((const uint8_t *)good[i], strlen(good[i]), &v) == 0 && v == want[i], "%s",
             good[i]);
  const char *bad[] = {"", "-", "9223372036854775808", "1x", " 1", "-9223372036854775809", "123456789012345678901"};
  for (int i = 0; i < 7; i++)
    BT_CHECK(braid__proto_parse_i64((const uint8_t *)bad[i], strlen(bad[i]), &v) != 0, "\"%s\" rejected", bad[i]);
  char out[24];
  braid__proto_format_i64(INT64_MIN, out);
  BT_CHECK(!strcmp(out, "-9223372036854775808"), "%s", out);
  braid__proto_format_i64(0, out);
  BT_CHECK(!strcmp(out, "0"), "%s", out);
  return 0;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      {"token_helpers", test_token_helpers, 30},
      {"proto_helpers", test_proto_helpers, 30},
      {"basic_ops", test_basic_ops, 60},
      {"concurrent_clients", test_concurrent_clients, 90},
      {"blocking_get", test_blocking_get, 30},
      {"get_timeout", test_get_timeout, 30},
      {"wait_keys", test_wait_keys, 30},
      {"many_waiters", test_many_waiters, 60},
      {"namespaces", test_namespaces, 30},
      {"oversized", test_oversized, 90},
      {"store_full", test_store_full, 30},
      {"wrong_token", test_wrong_token, 30},
      {"token_mismatch", test_token_mismatch, 30},
      {"refusals_rate_limited", test_refusals_rate_limited, 30},
      {"other_user_refused", test_other_user_refused, 30},
      {"closed_owner_refused", test_closed_owner_refused, 30},
      {"flood_other_user", test_flood_other_user, 60},
      {"handshake_flood", test_handshake_flood, 60},
      {"client_refuses_other_users_store", test_client_refuses_other_users_store, 30},
      {"loopback_only", test_loopback_only, 30},
      {"bind_no_fallback", test_bind_no_fallback, 30},
      {"no_token_says_so", test_no_token_says_so, 30},
      {"garbage_dropped", test_garbage_dropped, 30},
      {"slow_loris", test_slow_loris, 30},
      {"max_connections", test_max_connections, 30},
      {"stop_while_blocked", test_stop_while_blocked, 30},
      {"connect_retry", test_connect_retry, 30},
      {"connect_unreachable", test_connect_unreachable, 30},
      {"address_families", test_address_families, 30},
      {"parser_corpus", test_parser_corpus, 120},
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
