/*
 * Wire protocol of the rendezvous store. All integers little-endian.
 *
 * Frame: 12-byte header, then `len` payload bytes.
 *   u32 len | u8 type | u8 status | u16 reserved (0) | u32 seq
 * seq is chosen by the client and echoed in the reply, so a reply that
 * arrives after the client gave up on its request is recognized and skipped.
 *
 * Handshake (every connection, with or without a token):
 *   server -> S_HELLO  "BRDS" u16 version u16 flags(bit0: token required) nonce_s[32]
 *   client -> C_HELLO  "BRDS" u16 version u16 flags(bit0: has token)      nonce_c[32] mac_c[32]
 *   server -> AUTH_OK  mac_s[32]          or AUTH_FAIL (status = reason), then closes
 *   mac_c = HMAC-SHA-256(token, "braid-store-v1 client" || nonce_s || nonce_c)
 *   mac_s = HMAC-SHA-256(token, "braid-store-v1 server" || nonce_s || nonce_c)
 * Without a token nonces and macs are zero. The token never crosses the wire.
 *
 * Requests (reply type = request type | 0x80, status = BRAID__PST_*):
 *   SET    u32 klen key u32 vlen val                        -> (empty)
 *   GET    u32 timeout_ms u32 klen key                      -> val | TIMEOUT
 *   ADD    u32 klen key i64 delta                           -> i64 new value
 *   CAS    u32 klen key u8 has_exp u32 elen exp u32 dlen des -> u8 swapped u8 has_cur u32 clen cur
 *   DELETE u32 klen key                                     -> u8 existed
 *   WAIT   u32 timeout_ms u32 n n*(u32 klen key)            -> u32 n n*u8 present (OK or TIMEOUT)
 * timeout_ms 0xffffffff waits forever; 0 answers at once (WAIT then is a check).
 * ADD counters are stored as decimal ASCII ("-42"), so GET returns readable
 * text and SET "5" followed by ADD works; arithmetic wraps like int64.
 */
#ifndef BRAID_STORE_PROTO_H
#define BRAID_STORE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "bootstrap/store.h"

#define BRAID__PROTO_MAGIC "BRDS"
#define BRAID__PROTO_VERSION 1
#define BRAID__PROTO_HDR 12
#define BRAID__PROTO_NONCE 32
#define BRAID__PROTO_MAC 32
#define BRAID__PROTO_HELLO_LEN (4 + 2 + 2 + BRAID__PROTO_NONCE)
#define BRAID__PROTO_CHELLO_LEN (BRAID__PROTO_HELLO_LEN + BRAID__PROTO_MAC)
/* Largest payload before authentication (hellos), and after it (a CAS with two full values). */
#define BRAID__PROTO_MAX_PREAUTH 256u
#define BRAID__PROTO_MAX_PAYLOAD (2u * BRAID__STORE_MAX_VALUE + BRAID__STORE_MAX_KEY + 64u)
#define BRAID__PROTO_MAX_WAIT_KEYS 65536u
#define BRAID__PROTO_FOREVER 0xffffffffu
#define BRAID__PROTO_FLAG_TOKEN 1u

enum {
  BRAID__PT_SET = 1,
  BRAID__PT_GET = 2,
  BRAID__PT_ADD = 3,
  BRAID__PT_CAS = 4,
  BRAID__PT_DELETE = 5,
  BRAID__PT_WAIT = 6,
  BRAID__PT_S_HELLO = 0x10,
  BRAID__PT_C_HELLO = 0x11,
  BRAID__PT_AUTH_OK = 0x12,
  BRAID__PT_AUTH_FAIL = 0x13,
  BRAID__PT_REPLY = 0x80
};

/* Reply statuses. */
enum {
  BRAID__PST_OK = 0,
  BRAID__PST_TIMEOUT = 1,
  BRAID__PST_TOO_LARGE = 2,   /* key or value over the limits */
  BRAID__PST_FULL = 3,        /* the store's total size bound is reached */
  BRAID__PST_BAD_REQUEST = 4, /* malformed payload (the server also drops the connection) */
  BRAID__PST_NOT_COUNTER = 5, /* ADD on a value that is not a decimal int64 */
  /* AUTH_FAIL reasons */
  BRAID__PST_BAD_TOKEN = 16,
  BRAID__PST_NO_TOKEN = 17,
  BRAID__PST_UNEXPECTED_TOKEN = 18,
  BRAID__PST_VERSION = 19,
  BRAID__PST_NOT_LOOPBACK = 20,
  BRAID__PST_BUSY = 21,      /* too many connections */
  BRAID__PST_OTHER_USER = 22 /* token-less store: the peer's socket belongs to another user, or to no one */
};

typedef struct braid__proto_hdr {
  uint32_t len;
  uint8_t type, status;
  uint16_t reserved;
  uint32_t seq;
} braid__proto_hdr;

typedef struct braid__bytes {
  const uint8_t *p;
  uint32_t len;
} braid__bytes;

/* A decoded request; pointers alias the payload. */
typedef struct braid__proto_req {
  uint8_t type;
  uint32_t timeout_ms;   /* GET, WAIT */
  braid__bytes key;      /* all but WAIT */
  braid__bytes val;      /* SET value, CAS desired */
  int has_expected;      /* CAS */
  braid__bytes expected; /* CAS */
  int64_t delta;         /* ADD */
  uint32_t nkeys;        /* WAIT */
  const uint8_t *keys;   /* WAIT: nkeys * (u32 klen, key), validated */
  size_t keys_len;
} braid__proto_req;

typedef struct braid__proto_hello {
  uint16_t version, flags;
  uint8_t nonce[BRAID__PROTO_NONCE];
  uint8_t mac[BRAID__PROTO_MAC]; /* client hello only */
} braid__proto_hello;

static inline uint16_t braid__le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t braid__le32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t braid__le64(const uint8_t *p) {
  return (uint64_t)braid__le32(p) | ((uint64_t)braid__le32(p + 4) << 32);
}

/* Growable output buffer. */
typedef struct braid__buf {
  uint8_t *p;
  size_t len, cap;
  int oom; /* an append failed; the contents are incomplete */
} braid__buf;

void braid__buf_free(braid__buf *b);
int braid__buf_reserve(braid__buf *b, size_t extra);
void braid__buf_put(braid__buf *b, const void *p, size_t n);
void braid__buf_u8(braid__buf *b, uint8_t v);
void braid__buf_u16(braid__buf *b, uint16_t v);
void braid__buf_u32(braid__buf *b, uint32_t v);
void braid__buf_u64(braid__buf *b, uint64_t v);
void braid__buf_str(braid__buf *b, const void *p, uint32_t n); /* u32 length, bytes */
/* Starts a frame; braid__proto_end fills in its length. Returns the header offset. */
size_t braid__proto_begin(braid__buf *b, uint8_t type, uint8_t status, uint32_t seq);
void braid__proto_end(braid__buf *b, size_t at);

/* Parses a header from at least BRAID__PROTO_HDR bytes. Returns 0, or -1 when
   reserved bits are set or len exceeds max_payload. */
int braid__proto_parse_hdr(const uint8_t *p, uint32_t max_payload, braid__proto_hdr *h);
/* Validates and decodes a request payload; returns a BRAID__PST_* status
   (TOO_LARGE for keys/values over the limits, BAD_REQUEST when malformed). */
int braid__proto_decode_req(uint8_t type, const uint8_t *p, size_t len, braid__proto_req *r);
/* Next key of a validated WAIT key list. */
void braid__proto_next_key(const uint8_t **p, braid__bytes *key);
/* Hello payloads: magic, version and length checked. Returns 0, -1 (bad
   magic or length), or -2 (version differs; h->version holds the peer's). */
int braid__proto_decode_hello(const uint8_t *p, size_t len, int client, braid__proto_hello *h);
void braid__proto_put_hello(braid__buf *b, uint16_t flags, const uint8_t nonce[BRAID__PROTO_NONCE],
                            const uint8_t *mac /* NULL: server hello */);

/* Decimal int64 counter values. */
int braid__proto_parse_i64(const uint8_t *p, size_t len, int64_t *out);
size_t braid__proto_format_i64(int64_t v, char out[24]);

/* ---- Socket-free server core (the server thread, the fuzzer and parser tests use it) ---- */

typedef struct braid__store_core braid__store_core;
typedef struct braid__store_conn braid__store_conn;

/* token NULL/0: no authentication (connections must then be loopback). */
braid__store_core *braid__store_core_new(const uint8_t *token, size_t token_len);
void braid__store_core_free(braid__store_core *c);
/* A new connection at time now; its server hello is queued for output. */
braid__store_conn *braid__store_core_open(braid__store_core *c, int is_loopback, const char *peer, double now);
/* Feeds received bytes and runs every complete request. Returns 0 while the
   connection lives, -1 once the server dropped it (then call close). */
int braid__store_core_feed(braid__store_core *c, braid__store_conn *k, const uint8_t *data, size_t len,
                           double now);
/* Answers parked requests whose keys appeared or whose deadline passed, and
   marks connections over their time bounds for dropping. Returns when it next
   needs to run (INFINITY: only after more input). */
double braid__store_core_tick(braid__store_core *c, double now);
/* Output waiting for the peer; consume advances it. */
const uint8_t *braid__store_core_pending(braid__store_conn *k, size_t *len);
void braid__store_core_consume(braid__store_conn *k, size_t n);
int braid__store_core_dropped(const braid__store_conn *k);
void braid__store_core_close(braid__store_core *c, braid__store_conn *k);
/* Connections not dropped; *handshaking (may be NULL): how many of them
   have not authenticated yet. */
size_t braid__store_core_live(const braid__store_core *c, size_t *handshaking);
/* Drops the connection that has spent longest in the handshake, answering it
   BUSY (its client retries). 0, or -1 when none is in the handshake. */
int braid__store_core_evict(braid__store_core *c, double now);
/* Overrides the bounds (values <= 0 keep the current one). */
void braid__store_core_limits(braid__store_core *c, double frame_timeout_s, double auth_timeout_s,
                              size_t max_total_bytes);

#endif
