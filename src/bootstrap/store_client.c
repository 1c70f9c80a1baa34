/* Store client: one blocking connection, one request in flight. */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/auth.h"
#include "bootstrap/store.h"
#include "bootstrap/store_proto.h"
#include "core/log.h"
#include "os/sock.h"
#include "os/sock_owner.h"
#include "os/time.h"

#define DEF_OP_TIMEOUT 300.0
#define HANDSHAKE_CAP 30.0 /* a peer that accepts but never speaks is not a store */
#define REPLY_GRACE 2.0    /* the server answers a timed-out GET itself; allow for transit */
#define MAX_REPLY (BRAID__STORE_MAX_VALUE + 64u)

struct braid__store {
  int fd;
  int lost; /* the stream is unusable; every call returns PEER_LOST */
  char *host;
  int port;
  char hp[300]; /* "host:port" for messages */
  uint8_t *token;
  size_t token_len;
  char *prefix;
  size_t prefix_len;
  uint32_t seq;
  double op_timeout;
  double op_cap; /* absolute end of every request without a deadline of its own; INFINITY: none */
  char err[512];
};

static braid_status seterr(braid__store *st, braid_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static braid_status seterr(braid__store *st, braid_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(st->err, sizeof st->err, fmt, ap);
  va_end(ap);
  BLOG_DEBUG(BRAID_SUB_BOOT, -1, "store client: %s", st->err);
  return s;
}

/* A key for messages: printable, cut to a readable length. */
static void show_key(const char *key, char *out, size_t outlen) {
  size_t o = 0;
  for (const char *p = key; *p && o + 4 < outlen; p++) {
    if (p - key >= 120) {
      out[o++] = '.';
      out[o++] = '.';
      out[o++] = '.';
      break;
    }
    out[o++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
  }
  out[o] = 0;
}

/* ---- handshake ---------------------------------------------------------- */

enum { HS_OK = 0, HS_RETRY = 1, HS_DEADLINE = 2, HS_FAIL = -1 };

static int read_small_frame(int fd, double deadline, braid__proto_hdr *h, uint8_t *p, int *io) {
  uint8_t hb[BRAID__PROTO_HDR];
  int r = braid__sock_read_full(fd, hb, sizeof hb, deadline);
  if (r != BRAID__SOCK_OK) {
    *io = r;
    return -1;
  }
  if (braid__proto_parse_hdr(hb, BRAID__PROTO_MAX_PREAUTH, h) != 0) {
    *io = BRAID__SOCK_OK;
    return -1;
  }
  r = braid__sock_read_full(fd, p, h->len, deadline);
  if (r != BRAID__SOCK_OK) {
    *io = r;
    return -1;
  }
  return 0;
}

static int auth_fail_msg(int reason, const char *hp, char *why, size_t whylen) {
  switch (reason) {
    case BRAID__PST_BUSY:
      snprintf(why, whylen, "the store at %s has too many connections", hp);
      return HS_RETRY;
    case BRAID__PST_BAD_TOKEN:
      snprintf(why, whylen, "store at %s refused the job token (wrong BRAID_TOKEN?)", hp);
      break;
    case BRAID__PST_NO_TOKEN:
      snprintf(why, whylen, "store at %s requires a job token but this process has none (set BRAID_TOKEN)", hp);
      break;
    case BRAID__PST_UNEXPECTED_TOKEN:
      snprintf(why, whylen,
               "store at %s was started without a job token but this process has one (BRAID_TOKEN set for "
               "some processes only?)",
               hp);
      break;
    case BRAID__PST_NOT_LOOPBACK:
      snprintf(why, whylen,
               "store at %s accepts loopback connections only because it has no job token (set BRAID_TOKEN "
               "for every process)",
               hp);
      break;
    case BRAID__PST_OTHER_USER:
      snprintf(why, whylen,
               "store at %s has no job token, so it accepts connections from the user that started it only, and "
               "this process runs as another user, or its user could not be told (run every rank as one user, or "
               "set the same BRAID_TOKEN for every process)",
               hp);
      break;
    case BRAID__PST_VERSION:
      snprintf(why, whylen, "store at %s does not speak store protocol version %d (mixed braid versions?)", hp,
               BRAID__PROTO_VERSION);
      break;
    default:
      snprintf(why, whylen, "store at %s refused the connection (reason %d)", hp, reason);
      break;
  }
  return HS_FAIL;
}

/* Without a token nothing proves who runs the store, and this client is
   about to hand it its registration and the backends' settings: a
   token-less store is trusted only when the kernel shows its socket belongs
   to this process's user (its user's store on loopback; the same rule the
   store applies to its clients). Checked after the store's hello, once it has
   accepted the connection, and before anything is sent. */
static int trust_tokenless(int fd, const char *hp, char *why, size_t whylen) {
  char how[200] = "";
  uid_t owner = 0, me = geteuid();
  int r = braid__sock_peer_owner(fd, &owner, how, sizeof how);
  if (r == BRAID__OWNER_OK && owner == me) return HS_OK;
  if (r == BRAID__OWNER_OK) {
    snprintf(why, whylen,
             "store at %s has no job token and its socket belongs to uid %u, not to this process's user (uid %u); "
             "without a token only a store of one's own user is trusted (another user's process holds that port? "
             "set the same BRAID_TOKEN for every process)",
             hp, (unsigned)owner, (unsigned)me);
    return HS_FAIL;
  }
  snprintf(why, whylen,
           "store at %s has no job token, and %s; without a token only a store of this process's user (uid %u) "
           "is trusted (set the same BRAID_TOKEN for every process)",
           hp, how, (unsigned)me);
  /* A socket closed meanwhile: a store that is stopping, tried again. */
  return r == BRAID__OWNER_UNKNOWN ? HS_RETRY : HS_FAIL;
}

static int handshake(int fd, const char *hp, const uint8_t *token, size_t tlen, double deadline, char *why,
                     size_t whylen) {
  double cap = braid__now() + HANDSHAKE_CAP;
  double dl = deadline < cap ? deadline : cap;
  braid__proto_hdr h;
  uint8_t p[BRAID__PROTO_MAX_PREAUTH];
  int io = 0;
  if (read_small_frame(fd, dl, &h, p, &io) != 0) {
    if (io == BRAID__SOCK_CLOSED) {
      snprintf(why, whylen, "%s closed the connection before the handshake", hp);
      return HS_RETRY;
    }
    if (io == BRAID__SOCK_TIMEOUT) {
      if (dl < cap) return HS_DEADLINE; /* the caller's deadline ends the retries */
      snprintf(why, whylen, "no handshake from %s within %g s (is it a braid store?)", hp, HANDSHAKE_CAP);
      return HS_FAIL;
    }
    if (io == BRAID__SOCK_ERR) {
      snprintf(why, whylen, "reading from %s: %s", hp, strerror(errno));
      return HS_RETRY;
    }
    snprintf(why, whylen, "%s is not a braid store (unexpected handshake bytes)", hp);
    return HS_FAIL;
  }
  if (h.type == BRAID__PT_AUTH_FAIL) return auth_fail_msg(h.status, hp, why, whylen);
  braid__proto_hello sh;
  int r = h.type == BRAID__PT_S_HELLO ? braid__proto_decode_hello(p, h.len, 0, &sh) : -1;
  if (r == -2) {
    snprintf(why, whylen,
             "store at %s speaks store protocol version %u, this library speaks %d (mixed braid versions?)", hp,
             (unsigned)sh.version, BRAID__PROTO_VERSION);
    return HS_FAIL;
  }
  if (r != 0) {
    snprintf(why, whylen, "%s is not a braid store (unexpected handshake bytes)", hp);
    return HS_FAIL;
  }
  int server_wants = (sh.flags & BRAID__PROTO_FLAG_TOKEN) != 0;
  if (!token && !server_wants) {
    int r2 = trust_tokenless(fd, hp, why, whylen);
    if (r2 != HS_OK) return r2;
  }
  uint8_t nonce_c[BRAID__PROTO_NONCE] = {0}, mac[BRAID__PROTO_MAC] = {0};
  if (token && server_wants) {
    if (braid__random_bytes(nonce_c, sizeof nonce_c) != 0 ||
        braid__store_auth_mac(token, tlen, 0, sh.nonce, nonce_c, mac) != 0) {
      snprintf(why, whylen, "cannot compute the job-token proof for %s (libcrypto failed)", hp);
      return HS_FAIL;
    }
  }
  /* Sent even when the token settings differ, so the store logs the refusal. */
  braid__buf b = {0};
  size_t at = braid__proto_begin(&b, BRAID__PT_C_HELLO, 0, 0);
  braid__proto_put_hello(&b, token ? BRAID__PROTO_FLAG_TOKEN : 0, nonce_c, mac);
  braid__proto_end(&b, at);
  int oom = b.oom;
  r = oom ? BRAID__SOCK_ERR : braid__sock_write_full(fd, b.p, b.len, dl);
  braid__buf_free(&b);
  /* A store that refuses says why (AUTH_FAIL) before it closes; one that
     closes without a word is stopping (a world's rank 0 replacing its store
     for the next braid_init) or dropped this connection: try again. */
  if (r != BRAID__SOCK_OK) {
    if (oom) {
      snprintf(why, whylen, "store client: out of memory for the handshake with %s", hp);
      return HS_FAIL;
    }
    snprintf(why, whylen, "store at %s closed the connection during authentication", hp);
    return r == BRAID__SOCK_TIMEOUT && dl < cap ? HS_DEADLINE : HS_RETRY;
  }
  if (read_small_frame(fd, dl, &h, p, &io) != 0) {
    if (io == BRAID__SOCK_TIMEOUT) {
      if (dl < cap) return HS_DEADLINE;
      snprintf(why, whylen, "store at %s did not answer the authentication in time", hp);
      return HS_FAIL;
    }
    if (io == BRAID__SOCK_OK) { /* a frame, but not one of the protocol */
      snprintf(why, whylen, "%s is not a braid store (unexpected handshake bytes)", hp);
      return HS_FAIL;
    }
    snprintf(why, whylen, "store at %s closed the connection during authentication", hp);
    return HS_RETRY;
  }
  if (h.type == BRAID__PT_AUTH_FAIL) return auth_fail_msg(h.status, hp, why, whylen);
  if (h.type != BRAID__PT_AUTH_OK || h.len != BRAID__PROTO_MAC) {
    snprintf(why, whylen, "%s is not a braid store (unexpected handshake bytes)", hp);
    return HS_FAIL;
  }
  if (token && server_wants) {
    uint8_t want[BRAID__PROTO_MAC];
    if (braid__store_auth_mac(token, tlen, 1, sh.nonce, nonce_c, want) != 0 || !braid__ct_equal(want, p, sizeof want)) {
      snprintf(why, whylen,
               "store at %s could not prove it holds the job token (wrong BRAID_TOKEN on the store's side?)", hp);
      return HS_FAIL;
    }
  } else if (token || server_wants) {
    /* Token settings differ yet the store accepted: not a store this library trusts. */
    snprintf(why, whylen, "store at %s accepted a connection with mismatched job-token settings", hp);
    return HS_FAIL;
  }
  return HS_OK;
}

static int retryable_errno(int e) {
  if (e < 0) {
#ifdef EAI_NODATA
    if (e == EAI_NODATA) return 1;
#endif
    return e == EAI_AGAIN || e == EAI_NONAME; /* names may be registered late (containers) */
  }
  return e == ECONNREFUSED || e == ENETUNREACH || e == EHOSTUNREACH || e == ETIMEDOUT || e == ECONNRESET ||
         e == ECONNABORTED || e == EAGAIN || e == EADDRNOTAVAIL || e == EINTR;
}

/* Connects and authenticates by the deadline. gone_s > 0: the store served
   this client before, so connections refused or unreachable for gone_s
   seconds mean it is gone (PEER_LOST) rather than not started yet; a store
   that answers (busy, or closing mid-handshake) is still retried until the
   deadline. */
static braid_status open_conn(braid__store *st, double deadline, double gone_s, char *err, size_t errlen) {
  double t0 = braid__now(), backoff = 0.01;
  double gone_at = gone_s > 0 ? t0 + gone_s : INFINITY;
  char why[400] = "";
  for (;;) {
    double cap = braid__now() + 10.0; /* a silent host: retry rather than wait on one SYN */
    if (gone_at < cap) cap = fmax(gone_at, braid__now() + 0.5); /* the last try still gets its time */
    int fd = -1;
    int r = braid__sock_connect(st->host, st->port, deadline < cap ? deadline : cap, &fd, why, sizeof why);
    if (r == 0) {
      (void)braid__sock_set_keepalive(fd, 30, 10, 6);
      int hs = handshake(fd, st->hp, st->token, st->token_len, deadline, why, sizeof why);
      if (hs == HS_OK) {
        st->fd = fd;
        return BRAID_OK;
      }
      close(fd);
      /* Ran out of time mid-handshake: the previous error says more, if any. */
      if (hs == HS_DEADLINE && !why[0]) snprintf(why, sizeof why, "no handshake from %s in time", st->hp);
      if (hs == HS_FAIL) {
        snprintf(err, errlen, "%s", why);
        return BRAID_ERR_BOOTSTRAP;
      }
    } else if (!retryable_errno(r)) {
      snprintf(err, errlen, "cannot connect to the store at %s: %s", st->hp, why);
      return BRAID_ERR_BOOTSTRAP;
    } else if (braid__now() >= gone_at && braid__now() < deadline) {
      snprintf(err, errlen,
               "the store at %s is gone: it served this job before, but connections to it have failed for %g s "
               "(%s)",
               st->hp, gone_s, r > 0 ? strerror(r) : why);
      return BRAID_ERR_PEER_LOST;
    }
    double now = braid__now();
    if (now >= deadline) {
      snprintf(err, errlen, "could not reach the store at %s within %.3g s (last error: %s)", st->hp, deadline - t0,
               why);
      return BRAID_ERR_TIMEOUT;
    }
    BLOG_DEBUG(BRAID_SUB_BOOT, -1, "store client: %s; retrying in %g s", why, backoff);
    braid__sleep(fmin(backoff, fmin(deadline, gone_at) - now));
    backoff = fmin(backoff * 2, 1.0);
  }
}

static void free_store(braid__store *st) {
  if (!st) return;
  if (st->fd >= 0) close(st->fd);
  if (st->token) {
    memset(st->token, 0, st->token_len);
    free(st->token);
  }
  free(st->host);
  free(st->prefix);
  free(st);
}

static braid__store *new_store(const char *host, int port, const uint8_t *token, size_t token_len) {
  braid__store *st = calloc(1, sizeof *st);
  if (!st) return NULL;
  st->fd = -1;
  st->port = port;
  st->op_timeout = DEF_OP_TIMEOUT;
  st->op_cap = INFINITY;
  st->host = strdup(host);
  st->prefix = strdup("");
  if (token && token_len) {
    st->token = malloc(token_len);
    if (st->token) memcpy(st->token, token, token_len);
    st->token_len = token_len;
  }
  if (!st->host || !st->prefix || (token_len && token && !st->token)) {
    free_store(st);
    return NULL;
  }
  braid__sock_hostport(host, port, st->hp, sizeof st->hp);
  return st;
}

braid_status braid__store_connect(const char *host, int port, const uint8_t *token, size_t token_len,
                                  double deadline, braid__store **out, char *err, size_t errlen) {
  *out = NULL;
  if (!host || !*host || port <= 0 || port > 65535) {
    snprintf(err, errlen, "store client: bad address %s:%d (need a host and a port in 1-65535)",
             host ? host : "(null)", port);
    return BRAID_ERR_INVALID_ARG;
  }
  braid__store *st = new_store(host, port, token, token_len);
  if (!st) {
    snprintf(err, errlen, "store client: out of memory");
    return BRAID_ERR_NO_MEMORY;
  }
  braid_status s = open_conn(st, deadline, 0, err, errlen);
  if (s != BRAID_OK) {
    free_store(st);
    return s;
  }
  BLOG_DEBUG(BRAID_SUB_BOOT, -1, "store client: connected to %s", st->hp);
  *out = st;
  return BRAID_OK;
}

void braid__store_close(braid__store *st) { free_store(st); }

braid_status braid__store_clone(const braid__store *st, double deadline, braid__store **out, char *err,
                                size_t errlen) {
  *out = NULL;
  braid__store *c = new_store(st->host, st->port, st->token, st->token_len);
  if (!c) {
    snprintf(err, errlen, "store client: out of memory");
    return BRAID_ERR_NO_MEMORY;
  }
  braid_status s = open_conn(c, deadline, BRAID__STORE_GONE_S, err, errlen);
  if (s != BRAID_OK) {
    free_store(c);
    return s;
  }
  *out = c;
  (*out)->op_timeout = st->op_timeout;
  s = braid__store_set_prefix(*out, st->prefix);
  if (s != BRAID_OK) {
    snprintf(err, errlen, "%s", (*out)->err);
    braid__store_close(*out);
    *out = NULL;
  }
  return s;
}

braid_status braid__store_set_prefix(braid__store *st, const char *prefix) {
  if (!prefix) prefix = "";
  size_t n = strlen(prefix);
  if (n > BRAID__STORE_MAX_KEY)
    return seterr(st, BRAID_ERR_INVALID_ARG, "store prefix is %zu bytes, over the %d-byte key limit", n,
                  BRAID__STORE_MAX_KEY);
  char *p = strdup(prefix);
  if (!p) return seterr(st, BRAID_ERR_NO_MEMORY, "store client: out of memory");
  free(st->prefix);
  st->prefix = p;
  st->prefix_len = n;
  return BRAID_OK;
}

const char *braid__store_error(const braid__store *st) { return st ? st->err : "no store client"; }

void braid__store_set_op_timeout(braid__store *st, double timeout_s) { st->op_timeout = timeout_s; }
double braid__store_op_timeout(const braid__store *st) { return st->op_timeout; }
void braid__store_set_op_deadline(braid__store *st, double deadline) { st->op_cap = deadline; }

/* ---- requests ----------------------------------------------------------- */

static double op_deadline(const braid__store *st) {
  double d = st->op_timeout > 0 ? braid__now() + st->op_timeout : INFINITY;
  return d < st->op_cap ? d : st->op_cap;
}

/* A request without a deadline of its own got no reply in time (t0: when it
   was sent): the sentence names the store first, then the request. */
static braid_status no_answer(braid__store *st, const char *op, const char *key, double t0) {
  char k[160];
  show_key(key, k, sizeof k);
  return seterr(st, BRAID_ERR_TIMEOUT, "the store at %s did not answer within %.3g s (store %s \"%s\")", st->hp,
                braid__now() - t0, op, k);
}

static uint32_t timeout_ms(double deadline) {
  if (isinf(deadline)) return BRAID__PROTO_FOREVER;
  double left = deadline - braid__now();
  if (left <= 0) return 0;
  double ms = ceil(left * 1000.0);
  return ms >= (double)(BRAID__PROTO_FOREVER - 1) ? BRAID__PROTO_FOREVER - 1 : (uint32_t)ms;
}

static braid_status check_key(braid__store *st, const char *key) {
  if (!key) return seterr(st, BRAID_ERR_INVALID_ARG, "store key is NULL");
  size_t n = strlen(key) + st->prefix_len;
  if (n > BRAID__STORE_MAX_KEY) {
    char k[160];
    show_key(key, k, sizeof k);
    return seterr(st, BRAID_ERR_INVALID_ARG, "store key \"%s\" is %zu bytes with its prefix, over the %d-byte limit",
                  k, n, BRAID__STORE_MAX_KEY);
  }
  return BRAID_OK;
}

static braid_status check_value(braid__store *st, const char *key, const void *val, size_t len, const char *what) {
  if (!val && len) return seterr(st, BRAID_ERR_INVALID_ARG, "store %s for key \"%s\" is NULL with length %zu", what, key, len);
  if (len > BRAID__STORE_MAX_VALUE) {
    char k[160];
    show_key(key, k, sizeof k);
    return seterr(st, BRAID_ERR_INVALID_ARG, "store %s for key \"%s\" is %zu bytes, over the %u-byte limit", what,
                  k, len, (unsigned)BRAID__STORE_MAX_VALUE);
  }
  return BRAID_OK;
}

/* Appends the prefixed key as a length-prefixed string. */
static void put_key(braid__store *st, braid__buf *b, const char *key) {
  size_t n = strlen(key);
  braid__buf_u32(b, (uint32_t)(st->prefix_len + n));
  braid__buf_put(b, st->prefix, st->prefix_len);
  braid__buf_put(b, key, n);
}

static braid_status lost(braid__store *st, braid_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static braid_status lost(braid__store *st, braid_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(st->err, sizeof st->err, fmt, ap);
  va_end(ap);
  st->lost = 1;
  if (st->fd >= 0) close(st->fd);
  st->fd = -1;
  BLOG_DEBUG(BRAID_SUB_BOOT, -1, "store client: %s", st->err);
  return s;
}

static braid_status io_error(braid__store *st, int r) {
  if (r == BRAID__SOCK_CLOSED) return lost(st, BRAID_ERR_PEER_LOST, "connection to the store at %s closed", st->hp);
  if (r == BRAID__SOCK_TIMEOUT)
    return lost(st, BRAID_ERR_TIMEOUT, "the store at %s stopped responding in the middle of a message", st->hp);
  return lost(st, BRAID_ERR_PEER_LOST, "connection to the store at %s failed: %s", st->hp, strerror(errno));
}

/* Sends the frame in b (begun with seq st->seq) and reads its reply. Waits
   for the reply to start until wait_deadline (TIMEOUT then leaves the stream
   usable: the late reply is recognized by its seq and skipped). Writing the
   request and reading a reply once it has started are bounded by io_deadline,
   or by the op timeout from then when io_deadline is NAN; running out of time
   there loses the connection (the stream would be out of step). */
static braid_status transact(braid__store *st, braid__buf *b, size_t at, uint8_t type, double wait_deadline,
                             double io_deadline, braid__proto_hdr *rh, uint8_t **payload) {
  *payload = NULL;
  braid__proto_end(b, at);
  if (st->lost) return BRAID_ERR_PEER_LOST; /* st->err still says why */
  if (b->oom) return seterr(st, BRAID_ERR_NO_MEMORY, "store client: out of memory building a request");
  int r = braid__sock_write_full(st->fd, b->p, b->len, isnan(io_deadline) ? op_deadline(st) : io_deadline);
  if (r != BRAID__SOCK_OK) return io_error(st, r);
  for (;;) {
    short rev = 0;
    int pr = braid__sock_poll1(st->fd, POLLIN, wait_deadline, &rev);
    if (pr == 0) return BRAID_ERR_TIMEOUT; /* the caller words the message */
    if (pr < 0) return lost(st, BRAID_ERR_SYSTEM, "poll on the store connection failed: %s", strerror(errno));
    /* Once a reply starts, the rest follows promptly. */
    double rd = isnan(io_deadline) ? op_deadline(st) : io_deadline;
    uint8_t hb[BRAID__PROTO_HDR];
    r = braid__sock_read_full(st->fd, hb, sizeof hb, rd);
    if (r != BRAID__SOCK_OK) return io_error(st, r);
    if (braid__proto_parse_hdr(hb, MAX_REPLY, rh) != 0)
      return lost(st, BRAID_ERR_INTERNAL, "malformed reply from the store at %s", st->hp);
    uint8_t *p = malloc(rh->len ? rh->len : 1);
    if (!p) return lost(st, BRAID_ERR_NO_MEMORY, "store client: out of memory for a %u-byte reply", (unsigned)rh->len);
    r = braid__sock_read_full(st->fd, p, rh->len, rd);
    if (r != BRAID__SOCK_OK) {
      free(p);
      return io_error(st, r);
    }
    if (rh->seq != st->seq) {
      free(p); /* answer to a request given up on earlier */
      continue;
    }
    if (rh->type != (type | BRAID__PT_REPLY)) {
      free(p);
      return lost(st, BRAID_ERR_INTERNAL, "unexpected reply type %u from the store at %s", (unsigned)rh->type, st->hp);
    }
    *payload = p;
    return BRAID_OK;
  }
}

static size_t begin(braid__store *st, braid__buf *b, uint8_t type) { return braid__proto_begin(b, type, 0, ++st->seq); }

/* Maps a reply status other than OK/TIMEOUT to a braid status and message. */
static braid_status reply_error(braid__store *st, int status, const char *op, const char *key) {
  char k[160];
  show_key(key, k, sizeof k);
  switch (status) {
    case BRAID__PST_TOO_LARGE:
      return seterr(st, BRAID_ERR_INVALID_ARG, "store %s \"%s\": the store at %s rejected it as too large", op, k, st->hp);
    case BRAID__PST_FULL:
      return seterr(st, BRAID_ERR_NO_MEMORY, "store %s \"%s\": the store at %s is full", op, k, st->hp);
    case BRAID__PST_NOT_COUNTER:
      return seterr(st, BRAID_ERR_INVALID_ARG, "store %s \"%s\": the key holds a value that is not a decimal integer",
                    op, k);
    default:
      return lost(st, BRAID_ERR_INTERNAL, "store %s \"%s\": the store at %s answered status %d", op, k, st->hp, status);
  }
}

static braid_status malformed(braid__store *st, const char *op) {
  return lost(st, BRAID_ERR_INTERNAL, "malformed %s reply from the store at %s", op, st->hp);
}

braid_status braid__store_set(braid__store *st, const char *key, const void *val, size_t len) {
  braid_status s = check_key(st, key);
  if (s == BRAID_OK) s = check_value(st, key, val, len, "value");
  if (s != BRAID_OK) return s;
  braid__buf b = {0};
  size_t at = begin(st, &b, BRAID__PT_SET);
  put_key(st, &b, key);
  braid__buf_str(&b, val, (uint32_t)len);
  braid__proto_hdr h;
  uint8_t *p;
  double t0 = braid__now();
  s = transact(st, &b, at, BRAID__PT_SET, op_deadline(st), NAN, &h, &p);
  braid__buf_free(&b);
  if (s == BRAID_ERR_TIMEOUT && !st->lost) return no_answer(st, "set", key, t0);
  if (s != BRAID_OK) return s;
  free(p);
  return h.status == BRAID__PST_OK ? BRAID_OK : reply_error(st, h.status, "set", key);
}

braid_status braid__store_get(braid__store *st, const char *key, void **val, size_t *len, double deadline) {
  *val = NULL;
  *len = 0;
  braid_status s = check_key(st, key);
  if (s != BRAID_OK) return s;
  double t0 = braid__now();
  braid__buf b = {0};
  size_t at = begin(st, &b, BRAID__PT_GET);
  braid__buf_u32(&b, timeout_ms(deadline));
  put_key(st, &b, key);
  braid__proto_hdr h;
  uint8_t *p;
  s = transact(st, &b, at, BRAID__PT_GET, deadline + REPLY_GRACE, NAN, &h, &p);
  braid__buf_free(&b);
  char k[160];
  show_key(key, k, sizeof k);
  if (s == BRAID_OK && h.status == BRAID__PST_TIMEOUT) {
    free(p);
    s = BRAID_ERR_TIMEOUT;
  }
  if (s == BRAID_ERR_TIMEOUT && !st->lost)
    return seterr(st, s, "key \"%s%s\" did not appear in the store at %s within %.3g s", st->prefix, k, st->hp,
                  braid__now() - t0);
  if (s != BRAID_OK) return s;
  if (h.status != BRAID__PST_OK) {
    free(p);
    return reply_error(st, h.status, "get", key);
  }
  *val = p;
  *len = h.len;
  return BRAID_OK;
}

braid_status braid__store_try_get(braid__store *st, const char *key, void **val, size_t *len, int *found,
                                  double deadline) {
  *val = NULL;
  *len = 0;
  *found = 0;
  braid_status s = check_key(st, key);
  if (s != BRAID_OK) return s;
  double t0 = braid__now();
  braid__buf b = {0};
  size_t at = begin(st, &b, BRAID__PT_GET);
  braid__buf_u32(&b, 0); /* answered at once, present or not */
  put_key(st, &b, key);
  braid__proto_hdr h;
  uint8_t *p;
  s = transact(st, &b, at, BRAID__PT_GET, deadline, deadline, &h, &p);
  braid__buf_free(&b);
  char k[160];
  show_key(key, k, sizeof k);
  if (s == BRAID_ERR_TIMEOUT && !st->lost)
    return seterr(st, s, "store get \"%s%s\": no reply from the store at %s within %.3g s", st->prefix, k, st->hp,
                  braid__now() - t0);
  if (s != BRAID_OK) return s;
  if (h.status == BRAID__PST_TIMEOUT) {
    free(p);
    return BRAID_OK;
  }
  if (h.status != BRAID__PST_OK) {
    free(p);
    return reply_error(st, h.status, "get", key);
  }
  *val = p;
  *len = h.len;
  *found = 1;
  return BRAID_OK;
}

braid_status braid__store_add(braid__store *st, const char *key, int64_t delta, int64_t *result) {
  braid_status s = check_key(st, key);
  if (s != BRAID_OK) return s;
  braid__buf b = {0};
  size_t at = begin(st, &b, BRAID__PT_ADD);
  put_key(st, &b, key);
  braid__buf_u64(&b, (uint64_t)delta);
  braid__proto_hdr h;
  uint8_t *p;
  double t0 = braid__now();
  s = transact(st, &b, at, BRAID__PT_ADD, op_deadline(st), NAN, &h, &p);
  braid__buf_free(&b);
  if (s == BRAID_ERR_TIMEOUT && !st->lost) return no_answer(st, "add", key, t0);
  if (s != BRAID_OK) return s;
  if (h.status != BRAID__PST_OK) {
    free(p);
    return reply_error(st, h.status, "add", key);
  }
  if (h.len != 8) {
    free(p);
    return malformed(st, "add");
  }
  if (result) *result = (int64_t)braid__le64(p);
  free(p);
  return BRAID_OK;
}

braid_status braid__store_cas(braid__store *st, const char *key, const void *expected, size_t elen,
                              const void *desired, size_t dlen, int *swapped, void **cur, size_t *curlen) {
  if (swapped) *swapped = 0;
  if (cur) *cur = NULL;
  if (curlen) *curlen = 0;
  braid_status s = check_key(st, key);
  if (s == BRAID_OK && expected) s = check_value(st, key, expected, elen, "expected value");
  if (s == BRAID_OK) s = check_value(st, key, desired, dlen, "desired value");
  if (s != BRAID_OK) return s;
  braid__buf b = {0};
  size_t at = begin(st, &b, BRAID__PT_CAS);
  put_key(st, &b, key);
  braid__buf_u8(&b, expected != NULL);
  braid__buf_str(&b, expected, expected ? (uint32_t)elen : 0);
  braid__buf_str(&b, desired, (uint32_t)dlen);
  braid__proto_hdr h;
  uint8_t *p;
  double t0 = braid__now();
  s = transact(st, &b, at, BRAID__PT_CAS, op_deadline(st), NAN, &h, &p);
  braid__buf_free(&b);
  if (s == BRAID_ERR_TIMEOUT && !st->lost) return no_answer(st, "cas", key, t0);
  if (s != BRAID_OK) return s;
  if (h.status != BRAID__PST_OK) {
    free(p);
    return reply_error(st, h.status, "cas", key);
  }
  if (h.len < 6 || p[0] > 1 || p[1] > 1 || braid__le32(p + 2) != h.len - 6 || (!p[1] && h.len != 6)) {
    free(p);
    return malformed(st, "cas");
  }
  if (swapped) *swapped = p[0];
  if (cur && p[1]) {
    size_t n = h.len - 6;
    uint8_t *v = malloc(n ? n : 1);
    if (!v) {
      free(p);
      return seterr(st, BRAID_ERR_NO_MEMORY, "store client: out of memory");
    }
    memcpy(v, p + 6, n);
    *cur = v;
    if (curlen) *curlen = n;
  }
  free(p);
  return BRAID_OK;
}

braid_status braid__store_delete(braid__store *st, const char *key, int *existed) {
  if (existed) *existed = 0;
  braid_status s = check_key(st, key);
  if (s != BRAID_OK) return s;
  braid__buf b = {0};
  size_t at = begin(st, &b, BRAID__PT_DELETE);
  put_key(st, &b, key);
  braid__proto_hdr h;
  uint8_t *p;
  double t0 = braid__now();
  s = transact(st, &b, at, BRAID__PT_DELETE, op_deadline(st), NAN, &h, &p);
  braid__buf_free(&b);
  if (s == BRAID_ERR_TIMEOUT && !st->lost) return no_answer(st, "delete", key, t0);
  if (s != BRAID_OK) return s;
  if (h.status != BRAID__PST_OK) {
    free(p);
    return reply_error(st, h.status, "delete", key);
  }
  if (h.len != 1) {
    free(p);
    return malformed(st, "delete");
  }
  if (existed) *existed = p[0];
  free(p);
  return BRAID_OK;
}

braid_status braid__store_wait(braid__store *st, const char *const *keys, int n, double deadline, int *present) {
  if (n < 0 || (n > 0 && !keys) || (unsigned)n > BRAID__PROTO_MAX_WAIT_KEYS)
    return seterr(st, BRAID_ERR_INVALID_ARG, "store wait: bad key list (%d keys; at most %u)", n,
                  (unsigned)BRAID__PROTO_MAX_WAIT_KEYS);
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    braid_status s = check_key(st, keys[i]);
    if (s != BRAID_OK) return s;
    total += 4 + st->prefix_len + strlen(keys[i]);
  }
  if (total + 8 > BRAID__PROTO_MAX_PAYLOAD)
    return seterr(st, BRAID_ERR_INVALID_ARG, "store wait: %d keys make a %zu-byte request, over the limit", n, total);
  double t0 = braid__now();
  braid__buf b = {0};
  size_t at = begin(st, &b, BRAID__PT_WAIT);
  braid__buf_u32(&b, timeout_ms(deadline));
  braid__buf_u32(&b, (uint32_t)n);
  for (int i = 0; i < n; i++) put_key(st, &b, keys[i]);
  braid__proto_hdr h;
  uint8_t *p;
  braid_status s = transact(st, &b, at, BRAID__PT_WAIT, deadline + REPLY_GRACE, NAN, &h, &p);
  braid__buf_free(&b);
  if (s == BRAID_ERR_TIMEOUT && !st->lost) {
    if (present)
      for (int i = 0; i < n; i++) present[i] = 0; /* unknown: the store did not answer */
    return seterr(st, s, "store wait: no answer from the store at %s within %.3g s", st->hp, braid__now() - t0);
  }
  if (s != BRAID_OK) return s;
  if ((h.status != BRAID__PST_OK && h.status != BRAID__PST_TIMEOUT)) {
    free(p);
    return reply_error(st, h.status, "wait", n ? keys[0] : "");
  }
  if (h.len != 4 + (size_t)n || braid__le32(p) != (uint32_t)n) {
    free(p);
    return malformed(st, "wait");
  }
  int missing = 0, first = -1;
  for (int i = 0; i < n; i++) {
    if (present) present[i] = p[4 + i] != 0;
    if (!p[4 + i]) {
      missing++;
      if (first < 0) first = i;
    }
  }
  free(p);
  if (h.status == BRAID__PST_TIMEOUT) {
    char k[160];
    show_key(first >= 0 ? keys[first] : "", k, sizeof k);
    return seterr(st, BRAID_ERR_TIMEOUT,
                  "%d of %d store keys (first: \"%s%s\") did not appear in the store at %s within %.3g s", missing, n,
                  st->prefix, k, st->hp, braid__now() - t0);
  }
  return BRAID_OK;
}
