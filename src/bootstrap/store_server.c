/*
 * Store server: a socket-free core (key table, per-connection state machine,
 * parked GET/WAIT requests, time bounds) driven by one poll() thread.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bootstrap/auth.h"
#include "bootstrap/store.h"
#include "bootstrap/store_proto.h"
#include "core/log.h"
#include "os/sock.h"
#include "os/sock_owner.h"
#include "os/time.h"

#define DEF_FRAME_TIMEOUT 10.0
#define DEF_AUTH_TIMEOUT 5.0
#define DEF_MAX_CONNS 4096
#define DEF_MAX_HANDSHAKE 512 /* connections not authenticated yet, within DEF_MAX_CONNS */
#define ACCEPT_BATCH 64       /* connections accepted per listening socket per turn */
#define DEF_MAX_BYTES ((size_t)1 << 30)
#define ENTRY_OVERHEAD 64 /* accounted per key so many tiny keys are bounded too */
#define OUT_GATE (64u << 10) /* no new request runs while this much output is unsent */
#define MAX_LISTEN 8         /* addresses one store listens on */

/* ------------------------------------------------------------------------ */
/* Key table                                                                 */

typedef struct entry {
  struct entry *next;
  uint64_t hash;
  uint8_t *val;
  uint32_t vlen, klen;
  uint8_t key[];
} entry;

enum { K_HELLO, K_READY };

struct braid__store_conn {
  braid__store_conn *prev, *next;
  braid__store_conn *hs_prev, *hs_next; /* queue of connections in the handshake */
  int state;
  int dropped;
  int loopback;
  int parked;
  char peer[64];
  uint8_t nonce[BRAID__PROTO_NONCE];
  double opened;
  double partial_since; /* < 0: no incomplete frame buffered */
  double partial_deadline;
  double park_deadline;
  uint32_t wait_idx; /* parked WAIT: keys before this one were present (so a */
  size_t wait_off;   /* new key costs one lookup, not one per key waited for) */
  uint8_t *in;
  size_t in_off, in_len, in_cap;
  braid__buf out;
  size_t out_off;
};

struct braid__store_core {
  uint8_t *token;
  size_t token_len;
  entry **tab;
  size_t nbuckets, nentries;
  size_t total_bytes, max_total_bytes;
  double frame_timeout, auth_timeout;
  uint64_t seed;
  braid__store_conn *conns;
  braid__store_conn *hs_head, *hs_tail; /* in the handshake, oldest first */
  size_t nlive;      /* connections not dropped */
  size_t nhandshake; /* of those, the ones still in the handshake */
  int created; /* a key appeared since parked requests were last checked */
  double warn_at;        /* when the last per-connection warning was logged */
  unsigned warn_skipped; /* per-connection warnings left out since then */
};

/* Warnings about single connections (refused, dropped) are rate-limited: a
   flood of bad clients must not flood the log. At most one line per
   WARN_INTERVAL; the ones left out are counted, and the count is logged once
   the interval has passed (braid__store_core_tick). */
#define WARN_INTERVAL 1.0

static void conn_warn(braid__store_core *c, double now, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void conn_warn(braid__store_core *c, double now, const char *fmt, ...) {
  if (!braid__log_enabled(BRAID_LOG_WARN, BRAID_SUB_BOOT)) return;
  if (now - c->warn_at < WARN_INTERVAL) {
    c->warn_skipped++;
    return;
  }
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  braid__log_write(BRAID_LOG_WARN, BRAID_SUB_BOOT, -1, "%s", line);
  c->warn_at = now;
}

/* The count of warnings left out, once their interval is over (or at once:
   force, when the store stops). */
static void warn_flush(braid__store_core *c, double now, int force) {
  if (!c->warn_skipped || (!force && now - c->warn_at < WARN_INTERVAL)) return;
  BLOG_WARN(BRAID_SUB_BOOT, -1,
            "store: %u more connection%s refused or dropped in the last %.1f s (not logged one by one: at most "
            "one such line per second)",
            c->warn_skipped, c->warn_skipped == 1 ? "" : "s", now - c->warn_at);
  c->warn_at = now;
  c->warn_skipped = 0;
}

static uint64_t hash_key(const braid__store_core *c, const uint8_t *k, size_t n) {
  uint64_t h = 1469598103934665603ull ^ c->seed;
  for (size_t i = 0; i < n; i++) {
    h ^= k[i];
    h *= 1099511628211ull;
  }
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 32);
}

static entry **find_slot(braid__store_core *c, const uint8_t *k, uint32_t n, uint64_t h) {
  entry **pp = &c->tab[h & (c->nbuckets - 1)];
  for (; *pp; pp = &(*pp)->next)
    if ((*pp)->hash == h && (*pp)->klen == n && memcmp((*pp)->key, k, n) == 0) return pp;
  return pp;
}

static entry *lookup(braid__store_core *c, braid__bytes key) {
  return *find_slot(c, key.p, key.len, hash_key(c, key.p, key.len));
}

static void grow_table(braid__store_core *c) {
  size_t nb = c->nbuckets * 2;
  entry **t = calloc(nb, sizeof *t);
  if (!t) return; /* longer chains, still correct */
  for (size_t i = 0; i < c->nbuckets; i++) {
    for (entry *e = c->tab[i], *nx; e; e = nx) {
      nx = e->next;
      e->next = t[e->hash & (nb - 1)];
      t[e->hash & (nb - 1)] = e;
    }
  }
  free(c->tab);
  c->tab = t;
  c->nbuckets = nb;
}

/* Sets key to val. Returns a BRAID__PST_* status. */
static int put(braid__store_core *c, braid__bytes key, const uint8_t *val, uint32_t vlen) {
  uint64_t h = hash_key(c, key.p, key.len);
  entry **pp = find_slot(c, key.p, key.len, h);
  entry *e = *pp;
  size_t old = e ? (size_t)e->klen + e->vlen + ENTRY_OVERHEAD : 0;
  size_t add = (size_t)key.len + vlen + ENTRY_OVERHEAD;
  if (c->total_bytes - old + add > c->max_total_bytes) return BRAID__PST_FULL;
  uint8_t *v = malloc(vlen ? vlen : 1);
  if (!v) return BRAID__PST_FULL;
  if (vlen) memcpy(v, val, vlen);
  if (!e) {
    e = malloc(sizeof *e + key.len);
    if (!e) {
      free(v);
      return BRAID__PST_FULL;
    }
    e->next = NULL;
    e->hash = h;
    e->klen = key.len;
    e->val = NULL;
    e->vlen = 0;
    if (key.len) memcpy(e->key, key.p, key.len);
    *pp = e;
    c->nentries++;
    c->created = 1;
  }
  free(e->val);
  e->val = v;
  e->vlen = vlen;
  c->total_bytes = c->total_bytes - old + add;
  if (c->nentries > c->nbuckets) grow_table(c);
  return BRAID__PST_OK;
}

static int del(braid__store_core *c, braid__bytes key) {
  entry **pp = find_slot(c, key.p, key.len, hash_key(c, key.p, key.len));
  entry *e = *pp;
  if (!e) return 0;
  *pp = e->next;
  c->total_bytes -= (size_t)e->klen + e->vlen + ENTRY_OVERHEAD;
  c->nentries--;
  free(e->val);
  free(e);
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Core                                                                      */

braid__store_core *braid__store_core_new(const uint8_t *token, size_t token_len) {
  braid__store_core *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->nbuckets = 256;
  c->tab = calloc(c->nbuckets, sizeof *c->tab);
  if (!c->tab) {
    free(c);
    return NULL;
  }
  if (token && token_len) {
    c->token = malloc(token_len);
    if (!c->token) {
      free(c->tab);
      free(c);
      return NULL;
    }
    memcpy(c->token, token, token_len);
    c->token_len = token_len;
  }
  c->frame_timeout = DEF_FRAME_TIMEOUT;
  c->auth_timeout = DEF_AUTH_TIMEOUT;
  c->max_total_bytes = DEF_MAX_BYTES;
  c->warn_at = -INFINITY;
  (void)braid__random_bytes(&c->seed, sizeof c->seed);
  return c;
}

void braid__store_core_limits(braid__store_core *c, double frame_timeout_s, double auth_timeout_s,
                              size_t max_total_bytes) {
  if (frame_timeout_s > 0) c->frame_timeout = frame_timeout_s;
  if (auth_timeout_s > 0) c->auth_timeout = auth_timeout_s;
  if (max_total_bytes > 0) c->max_total_bytes = max_total_bytes;
}

static void drop(braid__store_core *c, braid__store_conn *k);

void braid__store_core_close(braid__store_core *c, braid__store_conn *k) {
  drop(c, k);
  if (k->prev)
    k->prev->next = k->next;
  else
    c->conns = k->next;
  if (k->next) k->next->prev = k->prev;
  free(k->in);
  braid__buf_free(&k->out);
  free(k);
}

void braid__store_core_free(braid__store_core *c) {
  if (!c) return;
  while (c->conns) braid__store_core_close(c, c->conns);
  for (size_t i = 0; i < c->nbuckets; i++) {
    for (entry *e = c->tab[i], *nx; e; e = nx) {
      nx = e->next;
      free(e->val);
      free(e);
    }
  }
  free(c->tab);
  if (c->token) {
    memset(c->token, 0, c->token_len);
    free(c->token);
  }
  free(c);
}

/* Connections still in the handshake wait in a queue, oldest first, so the
   server can bound how many of them there are (braid__store_core_evict). */
static void hs_unlink(braid__store_core *c, braid__store_conn *k) {
  if (k->hs_prev)
    k->hs_prev->hs_next = k->hs_next;
  else
    c->hs_head = k->hs_next;
  if (k->hs_next)
    k->hs_next->hs_prev = k->hs_prev;
  else
    c->hs_tail = k->hs_prev;
  k->hs_prev = k->hs_next = NULL;
  c->nhandshake--;
}

/* Leaves the live counts; the connection is closed once its output is sent. */
static void drop(braid__store_core *c, braid__store_conn *k) {
  if (!k->dropped) {
    c->nlive--;
    if (k->state == K_HELLO) hs_unlink(c, k);
  }
  k->dropped = 1;
  k->parked = 0;
}

static void auth_fail(braid__store_core *c, braid__store_conn *k, int reason) {
  size_t at = braid__proto_begin(&k->out, BRAID__PT_AUTH_FAIL, (uint8_t)reason, 0);
  braid__proto_end(&k->out, at);
  drop(c, k);
}

size_t braid__store_core_live(const braid__store_core *c, size_t *handshaking) {
  if (handshaking) *handshaking = c->nhandshake;
  return c->nlive;
}

int braid__store_core_evict(braid__store_core *c, double now) {
  braid__store_conn *k = c->hs_head;
  if (!k) return -1;
  conn_warn(c, now,
            "store: dropped connection from %s: not authenticated after %.3f s, and a newer connection needs its "
            "place",
            k->peer, now - k->opened);
  auth_fail(c, k, BRAID__PST_BUSY);
  return 0;
}

braid__store_conn *braid__store_core_open(braid__store_core *c, int is_loopback, const char *peer, double now) {
  braid__store_conn *k = calloc(1, sizeof *k);
  if (!k) return NULL;
  snprintf(k->peer, sizeof k->peer, "%s", peer ? peer : "?");
  k->loopback = is_loopback;
  k->opened = now;
  k->partial_since = -1;
  k->state = K_HELLO;
  k->next = c->conns;
  if (c->conns) c->conns->prev = k;
  c->conns = k;
  k->hs_prev = c->hs_tail;
  if (c->hs_tail)
    c->hs_tail->hs_next = k;
  else
    c->hs_head = k;
  c->hs_tail = k;
  c->nhandshake++;
  c->nlive++;
  if (!c->token && !is_loopback) {
    conn_warn(c, now,
              "store: refused connection from %s: without a job token the store accepts loopback "
              "connections only (set BRAID_TOKEN to accept other hosts)",
              k->peer);
    auth_fail(c, k, BRAID__PST_NOT_LOOPBACK);
    return k;
  }
  if (c->token && braid__random_bytes(k->nonce, sizeof k->nonce) != 0) {
    BLOG_ERROR(BRAID_SUB_BOOT, -1, "store: no random bytes for the handshake with %s", k->peer);
    drop(c, k);
    return k;
  }
  size_t at = braid__proto_begin(&k->out, BRAID__PT_S_HELLO, 0, 0);
  braid__proto_put_hello(&k->out, c->token ? BRAID__PROTO_FLAG_TOKEN : 0, k->nonce, NULL);
  braid__proto_end(&k->out, at);
  if (k->out.oom) drop(c, k);
  return k;
}

static void on_hello(braid__store_core *c, braid__store_conn *k, const uint8_t *p, size_t len, double now) {
  braid__proto_hello h;
  int r = braid__proto_decode_hello(p, len, 1, &h);
  if (r == -1) {
    conn_warn(c, now, "store: dropped connection from %s: not a braid store client (bad hello)",
              k->peer);
    drop(c, k);
    return;
  }
  if (r == -2) {
    conn_warn(c, now,
              "store: refused connection from %s: it speaks store protocol version %u, this store speaks %u",
              k->peer, (unsigned)h.version, (unsigned)BRAID__PROTO_VERSION);
    auth_fail(c, k, BRAID__PST_VERSION);
    return;
  }
  int has = (h.flags & BRAID__PROTO_FLAG_TOKEN) != 0;
  uint8_t mac[BRAID__HMAC_LEN] = {0};
  if (c->token) {
    if (!has) {
      conn_warn(c, now,
                "store: refused connection from %s: it sent no job token (BRAID_TOKEN unset on that process?)",
                k->peer);
      auth_fail(c, k, BRAID__PST_NO_TOKEN);
      return;
    }
    uint8_t want[BRAID__HMAC_LEN];
    if (braid__store_auth_mac(c->token, c->token_len, 0, k->nonce, h.nonce, want) != 0 ||
        !braid__ct_equal(want, h.mac, sizeof want)) {
      conn_warn(c, now, "store: refused connection from %s: wrong job token", k->peer);
      auth_fail(c, k, BRAID__PST_BAD_TOKEN);
      return;
    }
    if (braid__store_auth_mac(c->token, c->token_len, 1, k->nonce, h.nonce, mac) != 0) {
      drop(c, k);
      return;
    }
  } else if (has) {
    conn_warn(c, now,
              "store: refused connection from %s: it has a job token but this store was started without one",
              k->peer);
    auth_fail(c, k, BRAID__PST_UNEXPECTED_TOKEN);
    return;
  }
  size_t at = braid__proto_begin(&k->out, BRAID__PT_AUTH_OK, 0, 0);
  braid__buf_put(&k->out, mac, sizeof mac);
  braid__proto_end(&k->out, at);
  hs_unlink(c, k);
  k->state = K_READY;
  BLOG_DEBUG(BRAID_SUB_BOOT, -1, "store: %s authenticated", k->peer);
}

static void reply_status(braid__store_conn *k, const braid__proto_hdr *h, int st) {
  size_t at = braid__proto_begin(&k->out, (uint8_t)(h->type | BRAID__PT_REPLY), (uint8_t)st, h->seq);
  braid__proto_end(&k->out, at);
}

/* Tries to answer a GET or WAIT now (final: answer TIMEOUT if not satisfiable).
   Returns 1 when answered. */
static int try_wait(braid__store_core *c, braid__store_conn *k, const braid__proto_hdr *h,
                    const braid__proto_req *q, int final) {
  if (q->type == BRAID__PT_GET) {
    entry *e = lookup(c, q->key);
    if (!e && !final) return 0;
    size_t at = braid__proto_begin(&k->out, (uint8_t)(h->type | BRAID__PT_REPLY),
                                   e ? BRAID__PST_OK : BRAID__PST_TIMEOUT, h->seq);
    if (e) braid__buf_put(&k->out, e->val, e->vlen);
    braid__proto_end(&k->out, at);
    return 1;
  }
  if (!final) {
    const uint8_t *kp = q->keys + k->wait_off;
    while (k->wait_idx < q->nkeys) {
      const uint8_t *here = kp;
      braid__bytes key;
      braid__proto_next_key(&kp, &key);
      if (!lookup(c, key)) {
        kp = here;
        break;
      }
      k->wait_idx++;
    }
    k->wait_off = (size_t)(kp - q->keys);
    if (k->wait_idx < q->nkeys) return 0;
  }
  /* WAIT: present flags go straight into the reply; retracted if not answering yet. */
  size_t at = braid__proto_begin(&k->out, (uint8_t)(h->type | BRAID__PT_REPLY), 0, h->seq);
  braid__buf_u32(&k->out, q->nkeys);
  if (braid__buf_reserve(&k->out, q->nkeys) != 0) {
    BLOG_ERROR(BRAID_SUB_BOOT, -1, "store: out of memory replying to %s; dropping it", k->peer);
    drop(c, k);
    return 1;
  }
  const uint8_t *kp = q->keys;
  int all = 1;
  for (uint32_t i = 0; i < q->nkeys; i++) {
    braid__bytes key;
    braid__proto_next_key(&kp, &key);
    int present = lookup(c, key) != NULL;
    all &= present;
    braid__buf_u8(&k->out, (uint8_t)present);
  }
  if (!all && !final) { /* a key was deleted meanwhile: start over */
    k->out.len = at;
    k->wait_idx = 0;
    k->wait_off = 0;
    return 0;
  }
  k->out.p[at + 5] = all ? BRAID__PST_OK : BRAID__PST_TIMEOUT;
  braid__proto_end(&k->out, at);
  return 1;
}

/* Runs one request. Returns 1 if it was parked (not consumed). */
static int on_request(braid__store_core *c, braid__store_conn *k, const braid__proto_hdr *h, const uint8_t *p,
                      double now) {
  braid__proto_req q;
  int st = braid__proto_decode_req(h->type, p, h->len, &q);
  if (st == BRAID__PST_BAD_REQUEST) {
    conn_warn(c, now, "store: dropped connection from %s: malformed request (type %u, %u bytes)",
              k->peer, (unsigned)h->type, (unsigned)h->len);
    reply_status(k, h, st);
    drop(c, k);
    return 0;
  }
  if (st != BRAID__PST_OK) {
    reply_status(k, h, st);
    return 0;
  }
  size_t at;
  switch (q.type) {
    case BRAID__PT_SET:
      reply_status(k, h, put(c, q.key, q.val.p, q.val.len));
      break;
    case BRAID__PT_GET:
    case BRAID__PT_WAIT:
      k->wait_idx = 0;
      k->wait_off = 0;
      if (try_wait(c, k, h, &q, q.timeout_ms == 0)) break;
      k->parked = 1;
      k->park_deadline = q.timeout_ms == BRAID__PROTO_FOREVER ? INFINITY : now + q.timeout_ms / 1000.0;
      return 1;
    case BRAID__PT_ADD: {
      entry *e = lookup(c, q.key);
      int64_t v = 0;
      if (e && braid__proto_parse_i64(e->val, e->vlen, &v) != 0) {
        reply_status(k, h, BRAID__PST_NOT_COUNTER);
        break;
      }
      v = (int64_t)((uint64_t)v + (uint64_t)q.delta);
      char dec[24];
      size_t n = braid__proto_format_i64(v, dec);
      st = put(c, q.key, (const uint8_t *)dec, (uint32_t)n);
      at = braid__proto_begin(&k->out, (uint8_t)(h->type | BRAID__PT_REPLY), (uint8_t)st, h->seq);
      if (st == BRAID__PST_OK) braid__buf_u64(&k->out, (uint64_t)v);
      braid__proto_end(&k->out, at);
      break;
    }
    case BRAID__PT_CAS: {
      entry *e = lookup(c, q.key);
      int swap = q.has_expected ? (e && e->vlen == q.expected.len &&
                                   (q.expected.len == 0 || memcmp(e->val, q.expected.p, q.expected.len) == 0))
                                : !e;
      if (swap) {
        st = put(c, q.key, q.val.p, q.val.len);
        if (st != BRAID__PST_OK) {
          reply_status(k, h, st);
          break;
        }
        e = lookup(c, q.key);
      }
      at = braid__proto_begin(&k->out, (uint8_t)(h->type | BRAID__PT_REPLY), 0, h->seq);
      braid__buf_u8(&k->out, (uint8_t)swap);
      braid__buf_u8(&k->out, e != NULL);
      if (e)
        braid__buf_str(&k->out, e->val, e->vlen);
      else
        braid__buf_u32(&k->out, 0);
      braid__proto_end(&k->out, at);
      break;
    }
    case BRAID__PT_DELETE:
      at = braid__proto_begin(&k->out, (uint8_t)(h->type | BRAID__PT_REPLY), 0, h->seq);
      braid__buf_u8(&k->out, (uint8_t)del(c, q.key));
      braid__proto_end(&k->out, at);
      break;
    default:
      break;
  }
  return 0;
}

static size_t out_pending(const braid__store_conn *k) { return k->out.len - k->out_off; }

/* Runs every complete frame in the input buffer, stopping at a parked request. */
static void process(braid__store_core *c, braid__store_conn *k, double now) {
  while (!k->dropped && !k->parked && out_pending(k) < OUT_GATE) {
    size_t avail = k->in_len - k->in_off;
    if (avail < BRAID__PROTO_HDR) break;
    braid__proto_hdr h;
    const uint8_t *p = k->in + k->in_off;
    uint32_t max = k->state == K_HELLO ? BRAID__PROTO_MAX_PREAUTH : BRAID__PROTO_MAX_PAYLOAD;
    if (braid__proto_parse_hdr(p, max, &h) != 0) {
      conn_warn(c, now,
                "store: dropped connection from %s: malformed frame header (length %u, limit %u)", k->peer,
                (unsigned)h.len, (unsigned)max);
      drop(c, k);
      break;
    }
    if (avail - BRAID__PROTO_HDR < h.len) break;
    if (k->state == K_HELLO) {
      if (h.type != BRAID__PT_C_HELLO) {
        conn_warn(c, now, "store: dropped connection from %s: request before authentication",
                  k->peer);
        drop(c, k);
        break;
      }
      on_hello(c, k, p + BRAID__PROTO_HDR, h.len, now);
    } else if (h.type < BRAID__PT_SET || h.type > BRAID__PT_WAIT) {
      conn_warn(c, now, "store: dropped connection from %s: unknown request type %u", k->peer,
                (unsigned)h.type);
      drop(c, k);
      break;
    } else if (on_request(c, k, &h, p + BRAID__PROTO_HDR, now)) {
      break; /* parked: the frame stays buffered until it is answered */
    }
    k->in_off += BRAID__PROTO_HDR + (size_t)h.len;
  }
  if (k->out.oom) {
    BLOG_ERROR(BRAID_SUB_BOOT, -1, "store: out of memory replying to %s; dropping it", k->peer);
    drop(c, k);
  }
  if (k->in_off == k->in_len) {
    k->in_off = k->in_len = 0;
    /* Give back a big buffer once it is drained. */
    if (k->in_cap > (1u << 20)) {
      free(k->in);
      k->in = NULL;
      k->in_cap = 0;
    }
  }
  /* Time bound for an incomplete frame: starts when its first byte arrives. */
  size_t avail = k->in_len - k->in_off;
  if (avail == 0 || k->parked || k->dropped) {
    k->partial_since = -1;
  } else {
    if (k->partial_since < 0) k->partial_since = now;
    double extra = 0;
    if (avail >= BRAID__PROTO_HDR) extra = braid__le32(k->in + k->in_off) / (double)(1u << 20);
    k->partial_deadline = k->partial_since + c->frame_timeout + extra;
  }
}

int braid__store_core_feed(braid__store_core *c, braid__store_conn *k, const uint8_t *data, size_t len,
                           double now) {
  if (k->dropped) return -1;
  do {
    /* Bound: one maximal frame buffered; a well-behaved client never sends
       more ahead. Fed in steps, since the bound grows once authenticated. */
    size_t cap = BRAID__PROTO_HDR + (k->state == K_HELLO ? BRAID__PROTO_MAX_PREAUTH : BRAID__PROTO_MAX_PAYLOAD);
    if (k->in_off > 0) {
      memmove(k->in, k->in + k->in_off, k->in_len - k->in_off);
      k->in_len -= k->in_off;
      k->in_off = 0;
    }
    size_t take = len < cap - k->in_len ? len : cap - k->in_len;
    if (len && take == 0) {
      conn_warn(c, now, "store: dropped connection from %s: sent more than %zu bytes ahead", k->peer,
                cap);
      drop(c, k);
      return -1;
    }
    if (k->in_len + take > k->in_cap) {
      size_t nc = k->in_cap ? k->in_cap : 4096;
      while (nc < k->in_len + take) nc *= 2;
      if (nc > cap) nc = cap;
      uint8_t *n = realloc(k->in, nc);
      if (!n) {
        BLOG_ERROR(BRAID_SUB_BOOT, -1, "store: out of memory reading from %s; dropping it", k->peer);
        drop(c, k);
        return -1;
      }
      k->in = n;
      k->in_cap = nc;
    }
    if (take) memcpy(k->in + k->in_len, data, take);
    k->in_len += take;
    data += take;
    len -= take;
    process(c, k, now);
  } while (len && !k->dropped);
  return k->dropped ? -1 : 0;
}

double braid__store_core_tick(braid__store_core *c, double now) {
  warn_flush(c, now, 0);
  double next = c->warn_skipped ? c->warn_at + WARN_INTERVAL : INFINITY;
  int created = c->created;
  c->created = 0;
  for (braid__store_conn *k = c->conns; k; k = k->next) {
    if (k->dropped) continue;
    if (k->state == K_HELLO && now >= k->opened + c->auth_timeout) {
      conn_warn(c, now, "store: dropped connection from %s: no authentication within %g s", k->peer,
                c->auth_timeout);
      drop(c, k);
      continue;
    }
    if (k->partial_since >= 0 && now >= k->partial_deadline) {
      conn_warn(c, now, "store: dropped connection from %s: incomplete frame for %.1f s", k->peer,
                now - k->partial_since);
      drop(c, k);
      continue;
    }
    if (k->parked && (created || now >= k->park_deadline)) {
      braid__proto_hdr h;
      braid__proto_req q;
      const uint8_t *p = k->in + k->in_off;
      (void)braid__proto_parse_hdr(p, BRAID__PROTO_MAX_PAYLOAD, &h);
      (void)braid__proto_decode_req(h.type, p + BRAID__PROTO_HDR, h.len, &q);
      if (try_wait(c, k, &h, &q, now >= k->park_deadline)) {
        if (k->out.oom) {
          BLOG_ERROR(BRAID_SUB_BOOT, -1, "store: out of memory replying to %s; dropping it", k->peer);
          drop(c, k);
          continue;
        }
        k->parked = 0;
        k->in_off += BRAID__PROTO_HDR + (size_t)h.len;
        process(c, k, now); /* requests sent behind it */
      }
    }
    if (k->dropped) continue;
    if (k->state == K_HELLO && k->opened + c->auth_timeout < next) next = k->opened + c->auth_timeout;
    if (k->partial_since >= 0 && k->partial_deadline < next) next = k->partial_deadline;
    if (k->parked && k->park_deadline < next) next = k->park_deadline;
  }
  /* Requests run by process() above may have created keys others wait for. */
  if (c->created) next = now;
  return next;
}

const uint8_t *braid__store_core_pending(braid__store_conn *k, size_t *len) {
  *len = out_pending(k);
  return k->out.p ? k->out.p + k->out_off : NULL;
}

void braid__store_core_consume(braid__store_conn *k, size_t n) {
  k->out_off += n;
  if (k->out_off == k->out.len) {
    k->out_off = k->out.len = 0;
    if (k->out.cap > (1u << 20)) braid__buf_free(&k->out);
  }
}

int braid__store_core_dropped(const braid__store_conn *k) { return k->dropped; }

/* Output was drained: requests held back by OUT_GATE may run now. */
static void resume(braid__store_core *c, braid__store_conn *k, double now) {
  if (!k->dropped && !k->parked && k->in_len > k->in_off) process(c, k, now);
}

/* ------------------------------------------------------------------------ */
/* Server thread                                                             */

typedef struct slot {
  int fd;
  braid__store_conn *k;
} slot;

struct braid__store_server {
  pthread_t thread;
  int lfd[MAX_LISTEN];
  int nl;
  int wake[2];
  atomic_int stop;
  int port;
  braid__store_core *core;
  slot *slots;
  size_t nslots, cap;
  struct pollfd *pfd;
  size_t pfd_cap;
  uint8_t *rbuf;
  double listen_paused_until; /* after EMFILE: accept() would fail again at once */
  double last_busy_log;
  pthread_mutex_t mu; /* guards the limits below, set from other threads */
  double lim_frame, lim_auth;
  int lim_conns;
  size_t lim_bytes;
  int lim_changed;
  int max_conns;
  uid_t uid; /* the user a token-less store admits: its own */
};

#define RBUF (256u << 10)

static void close_slot(braid__store_server *s, size_t i) {
  close(s->slots[i].fd);
  braid__store_core_close(s->core, s->slots[i].k);
  s->slots[i] = s->slots[--s->nslots];
}

/* Sends what the socket takes now. Returns -1 if the peer is gone. */
static int flush(braid__store_server *s, slot *sl, double now) {
  for (;;) {
    size_t len;
    const uint8_t *p = braid__store_core_pending(sl->k, &len);
    if (len == 0) return 0;
    size_t done = 0;
    int r = braid__sock_send_some(sl->fd, p, len, &done);
    if (r != BRAID__SOCK_OK) return -1;
    if (done == 0) return 0;
    braid__store_core_consume(sl->k, done);
    resume(s->core, sl->k, now);
  }
}

/* Answers a connection that is not accepted with AUTH_FAIL(reason) and closes it. */
static void refuse_at_once(int fd, int reason) {
  uint8_t f[BRAID__PROTO_HDR] = {0};
  f[4] = BRAID__PT_AUTH_FAIL;
  f[5] = (uint8_t)reason;
  size_t done;
  (void)braid__sock_send_some(fd, f, sizeof f, &done);
  close(fd);
}

/* Whether a token-less store admits the connection fd: its peer's socket
   must be provably its own user's (the kernel names the owner of a socket
   that is still open; a closed one's remnant belongs to no one). */
static int same_user(braid__store_server *s, int fd, const char *peer, double now) {
  char why[200] = "";
  uid_t owner = 0;
  if (braid__sock_peer_owner(fd, &owner, why, sizeof why) != BRAID__OWNER_OK) {
    conn_warn(s->core, now,
              "store: refused connection from %s: without a job token the store admits its own user (uid %u) "
              "only, and %s (set BRAID_TOKEN to admit by token instead)",
              peer, (unsigned)s->uid, why);
    return 0;
  }
  if (owner != s->uid) {
    conn_warn(s->core, now,
              "store: refused connection from %s: its socket belongs to uid %u, and without a job token the "
              "store admits its own user (uid %u) only (set BRAID_TOKEN to admit other users' processes)",
              peer, (unsigned)owner, (unsigned)s->uid);
    return 0;
  }
  return 1;
}

/* Takes at most ACCEPT_BATCH connections, so that clients already served
   get their turn however fast new connections arrive. */
static void do_accept(braid__store_server *s, int lfd, double now) {
  for (int tries = 0; tries < ACCEPT_BATCH; tries++) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        /* A connection still in the handshake gives its descriptor back
           (closed in the next turn) before ranks are kept waiting. */
        if (braid__store_core_evict(s->core, now) == 0) return;
        if (now - s->last_busy_log > 1.0) {
          BLOG_WARN(BRAID_SUB_BOOT, -1, "store: cannot accept connections: %s", strerror(errno));
          s->last_busy_log = now;
        }
        s->listen_paused_until = now + 0.1;
      }
      return;
    }
    char peer[64];
    braid__sock_addr_format((struct sockaddr *)&ss, peer, sizeof peer);
    int loopback = braid__sock_is_loopback((struct sockaddr *)&ss);
    /* Without a token any local user could reach the port: admit the
       store's own user only. */
    if (!s->core->token && loopback && !same_user(s, fd, peer, now)) {
      refuse_at_once(fd, BRAID__PST_OTHER_USER);
      continue;
    }
    /* Connections that have not authenticated yet have a small cap of their
       own, and make way for newer ones (the oldest goes), so whoever keeps
       opening connections without the token cannot take the places of ranks. */
    size_t handshaking = 0;
    size_t live = braid__store_core_live(s->core, &handshaking);
    if (live >= (size_t)s->max_conns || handshaking >= DEF_MAX_HANDSHAKE) {
      if (braid__store_core_evict(s->core, now) != 0) {
        conn_warn(s->core, now, "store: refused connection from %s: %d connections already open", peer,
                  s->max_conns);
        refuse_at_once(fd, BRAID__PST_BUSY);
        continue;
      }
    }
    if (s->nslots == s->cap) {
      size_t nc = s->cap ? s->cap * 2 : 64;
      slot *n = realloc(s->slots, nc * sizeof *n);
      if (!n) {
        close(fd);
        return;
      }
      s->slots = n;
      s->cap = nc;
    }
    (void)braid__sock_set_nodelay(fd);
    (void)braid__sock_set_keepalive(fd, 60, 10, 6); /* a vanished host must not pin a parked GET forever */
    braid__store_conn *k = braid__store_core_open(s->core, loopback, peer, now);
    if (!k) {
      close(fd);
      continue;
    }
    BLOG_DEBUG(BRAID_SUB_BOOT, -1, "store: connection from %s", peer);
    s->slots[s->nslots++] = (slot){fd, k};
  }
}

/* Reads what is available (bounded per turn for fairness). Returns -1 when the connection ends. */
static int do_read(braid__store_server *s, slot *sl, double now) {
  size_t total = 0;
  while (total < 4 * RBUF) {
    size_t got = 0;
    int r = braid__sock_recv_some(sl->fd, s->rbuf, RBUF, &got);
    if (r != BRAID__SOCK_OK) {
      if (!braid__store_core_dropped(sl->k))
        BLOG_DEBUG(BRAID_SUB_BOOT, -1, "store: connection from %s closed", sl->k->peer);
      return -1;
    }
    if (got == 0) return 0;
    total += got;
    if (braid__store_core_feed(s->core, sl->k, s->rbuf, got, now) != 0) return 0; /* flushed, then closed */
  }
  return 0;
}

static void apply_limits(braid__store_server *s) {
  pthread_mutex_lock(&s->mu);
  if (s->lim_changed) {
    braid__store_core_limits(s->core, s->lim_frame, s->lim_auth, s->lim_bytes);
    if (s->lim_conns > 0) s->max_conns = s->lim_conns;
    s->lim_changed = 0;
  }
  pthread_mutex_unlock(&s->mu);
}

static void *server_main(void *arg) {
  braid__store_server *s = arg;
  while (!atomic_load(&s->stop)) {
    double now = braid__now();
    double next = braid__store_core_tick(s->core, now);
    /* Send replies; close dropped connections once their last words are out. */
    for (size_t i = 0; i < s->nslots;) {
      slot *sl = &s->slots[i];
      int gone = flush(s, sl, now) != 0;
      if (gone || braid__store_core_dropped(sl->k)) {
        close_slot(s, i);
        continue;
      }
      i++;
    }
    size_t need = 1 + (size_t)s->nl + s->nslots;
    if (need > s->pfd_cap) {
      struct pollfd *n = realloc(s->pfd, need * sizeof *n);
      if (!n) {
        braid__sleep(0.01);
        continue;
      }
      s->pfd = n;
      s->pfd_cap = need;
    }
    size_t np = 0;
    s->pfd[np++] = (struct pollfd){s->wake[0], POLLIN, 0};
    int listening = now >= s->listen_paused_until;
    for (int i = 0; i < s->nl; i++) s->pfd[np++] = (struct pollfd){s->lfd[i], (short)(listening ? POLLIN : 0), 0};
    for (size_t i = 0; i < s->nslots; i++) {
      size_t pending;
      (void)braid__store_core_pending(s->slots[i].k, &pending);
      s->pfd[np++] = (struct pollfd){s->slots[i].fd, (short)(POLLIN | (pending ? POLLOUT : 0)), 0};
    }
    if (!listening && s->listen_paused_until < next) next = s->listen_paused_until;
    int ms = braid__sock_poll_ms(next);
    if (ms < 0 || ms > 1000) ms = 1000;
    if (s->core->created) ms = 0; /* requests run while flushing woke waiters */
    int r = poll(s->pfd, np, ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      BLOG_ERROR(BRAID_SUB_BOOT, -1, "store: poll failed: %s", strerror(errno));
      braid__sleep(0.01);
      continue;
    }
    now = braid__now();
    if (s->pfd[0].revents) {
      char junk[64];
      while (read(s->wake[0], junk, sizeof junk) > 0) {
      }
      apply_limits(s);
    }
    for (int i = 0; i < s->nl; i++)
      if (s->pfd[1 + i].revents & POLLIN) do_accept(s, s->lfd[i], now);
    /* Slots accepted just now sit past the polled range; slot i still maps to
       pfd[1 + nl + i] because removals happen only in the flush pass. */
    size_t polled = np - 1 - (size_t)s->nl;
    for (size_t i = 0; i < polled; i++) {
      short rev = s->pfd[1 + s->nl + i].revents;
      if (!rev) continue;
      slot *sl = &s->slots[i];
      if (rev & (POLLIN | POLLHUP | POLLERR)) {
        if (do_read(s, sl, now) != 0) {
          drop(s->core, sl->k); /* peer gone: the flush pass closes it */
          continue;
        }
      }
      if (rev & POLLOUT) (void)flush(s, sl, now);
    }
  }
  return NULL;
}

static void server_free(braid__store_server *s) {
  for (size_t i = 0; i < s->nslots; i++) close(s->slots[i].fd);
  for (int i = 0; i < s->nl; i++) close(s->lfd[i]);
  if (s->wake[0] >= 0) close(s->wake[0]);
  if (s->wake[1] >= 0) close(s->wake[1]);
  braid__store_core_free(s->core);
  pthread_mutex_destroy(&s->mu);
  free(s->slots);
  free(s->pfd);
  free(s->rbuf);
  free(s);
}

/* Whether every address host resolves to is loopback. */
static int host_is_loopback(const char *host) {
  struct addrinfo *res = NULL;
  if (braid__sock_resolve(host, 0, 1, &res) != 0) return 0;
  int all = 1;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) all &= braid__sock_is_loopback(ai->ai_addr);
  freeaddrinfo(res);
  return all;
}

/* The addresses a store listens on, all with one port. */
typedef struct bind_list {
  struct sockaddr_storage addr[MAX_LISTEN];
  socklen_t len[MAX_LISTEN];
  int n;
} bind_list;

static void bind_add(bind_list *l, const struct sockaddr *sa, socklen_t len) {
  for (int i = 0; i < l->n; i++)
    if (l->len[i] == len && !memcmp(&l->addr[i], sa, len)) return;
  if (l->n == MAX_LISTEN) return;
  memset(&l->addr[l->n], 0, sizeof l->addr[l->n]);
  memcpy(&l->addr[l->n], sa, len);
  l->len[l->n++] = len;
}

static void bind_add_numeric(bind_list *l, const char *numeric) {
  struct sockaddr_in a4;
  struct sockaddr_in6 a6;
  memset(&a4, 0, sizeof a4);
  memset(&a6, 0, sizeof a6);
  if (inet_pton(AF_INET, numeric, &a4.sin_addr) == 1) {
    a4.sin_family = AF_INET;
    bind_add(l, (struct sockaddr *)&a4, sizeof a4);
  } else if (inet_pton(AF_INET6, numeric, &a6.sin6_addr) == 1) {
    a6.sin6_family = AF_INET6;
    bind_add(l, (struct sockaddr *)&a6, sizeof a6);
  }
}

/* This host cannot bind the address at all (not one of its addresses, or the
   family is off): skipped. A port someone else holds is not such a case. */
static int addr_unavailable(int e) { return e == EADDRNOTAVAIL || e == EAFNOSUPPORT || e == EPROTONOSUPPORT; }

/* Returns 0 and *fd, or an errno value (also when no socket could be made:
   a family the host lacks is skipped like an address it lacks). IPv6 sockets
   serve IPv6 only unless dual_stack, so each address of a list is its own. */
static int bind_listen(const struct sockaddr *sa, socklen_t len, int dual_stack, int *fd_out) {
  unsigned flags = BRAID__SOCK_REUSEADDR | (dual_stack ? BRAID__SOCK_DUAL_STACK : BRAID__SOCK_V6ONLY);
  int e = braid__sock_listen(sa, len, 1024, flags, fd_out);
  return e < 0 ? -e : e;
}

static void listen_error(const struct sockaddr_storage *ss, int e, char *err, size_t errlen) {
  char a[INET6_ADDRSTRLEN + 16];
  braid__sock_addr_format((const struct sockaddr *)ss, a, sizeof a);
  snprintf(err, errlen, "cannot listen on %s: %s%s", a, strerror(e),
           e == EADDRINUSE ? " (another process holds that address and port)" : "");
}

/* Listens on every address of l with one port; port 0 picks one free on all of
   them. A busy address fails the whole start: moving to another address or
   family would leave clients of the requested one talking to whoever holds it. */
static int listen_list(braid__store_server *s, bind_list *l, int port, char *err, size_t errlen) {
  for (int attempt = 0; attempt < (port ? 1 : 16); attempt++) {
    int p = port, retry = 0, last = EADDRNOTAVAIL, last_i = 0;
    s->nl = 0;
    for (int i = 0; i < l->n; i++) {
      braid__sock_set_port(&l->addr[i], p);
      int fd = -1;
      int e = bind_listen((struct sockaddr *)&l->addr[i], l->len[i], 0, &fd);
      if (e == 0) {
        s->lfd[s->nl++] = fd;
        if (!p) p = braid__sock_local_port(fd);
        continue;
      }
      last = e;
      last_i = i;
      if (addr_unavailable(e)) continue;
      if (e == EADDRINUSE && !port && s->nl) { /* the kernel's pick is taken in another family */
        retry = 1;
        break;
      }
      listen_error(&l->addr[i], e, err, errlen);
      return -1;
    }
    if (retry) {
      while (s->nl) close(s->lfd[--s->nl]);
      continue;
    }
    if (!s->nl) {
      if (l->n) {
        braid__sock_set_port(&l->addr[last_i], p);
        listen_error(&l->addr[last_i], last, err, errlen);
      } else {
        snprintf(err, errlen, "no address to listen on");
      }
      return -1;
    }
    return 0;
  }
  snprintf(err, errlen, "no port free on every loopback address after 16 tries");
  return -1;
}

/* Every interface: one dual-stack IPv6 socket, or IPv4 where IPv6 is off. */
static int listen_wildcard(braid__store_server *s, int port, char *err, size_t errlen) {
  struct sockaddr_in6 a6;
  memset(&a6, 0, sizeof a6);
  a6.sin6_family = AF_INET6;
  a6.sin6_addr = in6addr_any;
  a6.sin6_port = htons((uint16_t)port);
  int e = bind_listen((struct sockaddr *)&a6, sizeof a6, 1, &s->lfd[0]);
  if (e == 0) {
    s->nl = 1;
    return 0;
  }
  if (!addr_unavailable(e)) {
    snprintf(err, errlen, "cannot listen on [::]:%d (every interface): %s%s", port, strerror(e),
             e == EADDRINUSE ? " (another process holds that port)" : "");
    return -1;
  }
  struct sockaddr_in a4;
  memset(&a4, 0, sizeof a4);
  a4.sin_family = AF_INET;
  a4.sin_addr.s_addr = htonl(INADDR_ANY);
  a4.sin_port = htons((uint16_t)port);
  e = bind_listen((struct sockaddr *)&a4, sizeof a4, 0, &s->lfd[0]);
  if (e) {
    snprintf(err, errlen, "cannot listen on 0.0.0.0:%d (every interface): %s%s", port, strerror(e),
             e == EADDRINUSE ? " (another process holds that port)" : "");
    return -1;
  }
  s->nl = 1;
  return 0;
}

/* "127.0.0.1:5, [::1]:5" */
static void listening_on(const braid__store_server *s, char *out, size_t len) {
  size_t o = 0;
  out[0] = 0;
  for (int i = 0; i < s->nl && o < len; i++) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char a[INET6_ADDRSTRLEN + 16] = "?";
    if (getsockname(s->lfd[i], (struct sockaddr *)&ss, &sl) == 0)
      braid__sock_addr_format((struct sockaddr *)&ss, a, sizeof a);
    int k = snprintf(out + o, len - o, "%s%s", i ? ", " : "", a);
    if (k < 0) break;
    o += (size_t)k;
  }
}

braid_status braid__store_server_start(const char *host, int port, const uint8_t *token, size_t token_len,
                                       braid__store_server **out, char *err, size_t errlen) {
  *out = NULL;
  if (port < 0 || port > 65535) {
    snprintf(err, errlen, "store server: port %d is out of range (0-65535)", port);
    return BRAID_ERR_INVALID_ARG;
  }
  if (token && token_len == 0) token = NULL;
  braid__store_server *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "store server: out of memory");
    return BRAID_ERR_NO_MEMORY;
  }
  s->wake[0] = s->wake[1] = -1;
  s->max_conns = DEF_MAX_CONNS;
  s->uid = geteuid();
  pthread_mutex_init(&s->mu, NULL);
  s->core = braid__store_core_new(token, token_len);
  s->rbuf = malloc(RBUF);
  if (!s->core || !s->rbuf) {
    server_free(s);
    snprintf(err, errlen, "store server: out of memory");
    return BRAID_ERR_NO_MEMORY;
  }
  if (pipe2(s->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
    snprintf(err, errlen, "store server: pipe: %s", strerror(errno));
    server_free(s);
    return BRAID_ERR_SYSTEM;
  }
  char why[400] = "";
  int rc;
  if (token && !host) {
    rc = listen_wildcard(s, port, why, sizeof why);
  } else if (token || (host && host_is_loopback(host))) {
    /* Every address of the name ("localhost": both loopbacks); none may be someone else's. */
    bind_list l = {.n = 0};
    struct addrinfo *res = NULL;
    int g = braid__sock_resolve(host, 0, 1, &res);
    if (g != 0) {
      snprintf(err, errlen, "store server: cannot listen on %s: %s", host, gai_strerror(g));
      server_free(s);
      return BRAID_ERR_BOOTSTRAP;
    }
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next)
      if (ai->ai_family == AF_INET || ai->ai_family == AF_INET6) bind_add(&l, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(res);
    rc = listen_list(s, &l, port, why, sizeof why);
  } else {
    /* Without a token anyone who can reach the port could join: loopback only. */
    if (host)
      BLOG_WARN(BRAID_SUB_BOOT, -1,
                "store: no job token, so listening on loopback only instead of %s (set BRAID_TOKEN to accept "
                "other hosts)",
                host);
    bind_list l = {.n = 0};
    bind_add_numeric(&l, "127.0.0.1");
    bind_add_numeric(&l, "::1");
    rc = listen_list(s, &l, port, why, sizeof why);
  }
  if (rc != 0) {
    snprintf(err, errlen, "store server: %s", why);
    server_free(s);
    return BRAID_ERR_BOOTSTRAP;
  }
  s->port = braid__sock_local_port(s->lfd[0]);
  char on[400];
  listening_on(s, on, sizeof on);
  if (token)
    BLOG_INFO(BRAID_SUB_BOOT, -1, "store: listening on %s (job token required)", on);
  else
    BLOG_INFO(BRAID_SUB_BOOT, -1, "store: listening on %s; no job token, so loopback clients only", on);
  int e = pthread_create(&s->thread, NULL, server_main, s);
  if (e != 0) {
    snprintf(err, errlen, "store server: cannot start its thread: %s", strerror(e));
    server_free(s);
    return BRAID_ERR_SYSTEM;
  }
  *out = s;
  return BRAID_OK;
}

int braid__store_server_port(const braid__store_server *s) { return s ? s->port : -1; }

static void wake(braid__store_server *s) {
  char b = 1;
  ssize_t n;
  do {
    n = write(s->wake[1], &b, 1);
  } while (n < 0 && errno == EINTR);
}

void braid__store_server_set_limits(braid__store_server *s, double frame_timeout_s, double auth_timeout_s,
                                    int max_conns, size_t max_bytes) {
  pthread_mutex_lock(&s->mu);
  s->lim_frame = frame_timeout_s;
  s->lim_auth = auth_timeout_s;
  s->lim_conns = max_conns;
  s->lim_bytes = max_bytes;
  s->lim_changed = 1;
  pthread_mutex_unlock(&s->mu);
  wake(s);
}

void braid__store_server_stop(braid__store_server *s) {
  if (!s) return;
  atomic_store(&s->stop, 1);
  wake(s);
  pthread_join(s->thread, NULL);
  warn_flush(s->core, braid__now(), 1);
  server_free(s);
}
