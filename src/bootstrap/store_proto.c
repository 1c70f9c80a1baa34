#include "bootstrap/store_proto.h"

#include <stdlib.h>
#include <string.h>

void braid__buf_free(braid__buf *b) {
  free(b->p);
  b->p = NULL;
  b->len = b->cap = 0;
  b->oom = 0;
}

int braid__buf_reserve(braid__buf *b, size_t extra) {
  if (b->oom) return -1;
  if (extra <= b->cap - b->len) return 0;
  if (extra > SIZE_MAX / 2 - b->len) {
    b->oom = 1;
    return -1;
  }
  size_t cap = b->cap ? b->cap : 256;
  while (cap - b->len < extra) cap *= 2;
  uint8_t *p = realloc(b->p, cap);
  if (!p) {
    b->oom = 1;
    return -1;
  }
  b->p = p;
  b->cap = cap;
  return 0;
}

void braid__buf_put(braid__buf *b, const void *p, size_t n) {
  if (n == 0 || braid__buf_reserve(b, n) != 0) return;
  memcpy(b->p + b->len, p, n);
  b->len += n;
}

void braid__buf_u8(braid__buf *b, uint8_t v) { braid__buf_put(b, &v, 1); }

void braid__buf_u16(braid__buf *b, uint16_t v) {
  uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
  braid__buf_put(b, x, 2);
}

void braid__buf_u32(braid__buf *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  braid__buf_put(b, x, 4);
}

void braid__buf_u64(braid__buf *b, uint64_t v) {
  braid__buf_u32(b, (uint32_t)v);
  braid__buf_u32(b, (uint32_t)(v >> 32));
}

void braid__buf_str(braid__buf *b, const void *p, uint32_t n) {
  braid__buf_u32(b, n);
  braid__buf_put(b, p, n);
}

size_t braid__proto_begin(braid__buf *b, uint8_t type, uint8_t status, uint32_t seq) {
  size_t at = b->len;
  braid__buf_u32(b, 0);
  braid__buf_u8(b, type);
  braid__buf_u8(b, status);
  braid__buf_u16(b, 0);
  braid__buf_u32(b, seq);
  return at;
}

void braid__proto_end(braid__buf *b, size_t at) {
  if (b->oom || b->len < at + BRAID__PROTO_HDR) return;
  uint32_t n = (uint32_t)(b->len - at - BRAID__PROTO_HDR);
  uint8_t *p = b->p + at;
  p[0] = (uint8_t)n;
  p[1] = (uint8_t)(n >> 8);
  p[2] = (uint8_t)(n >> 16);
  p[3] = (uint8_t)(n >> 24);
}

int braid__proto_parse_hdr(const uint8_t *p, uint32_t max_payload, braid__proto_hdr *h) {
  h->len = braid__le32(p);
  h->type = p[4];
  h->status = p[5];
  h->reserved = braid__le16(p + 6);
  h->seq = braid__le32(p + 8);
  if (h->reserved != 0 || h->len > max_payload) return -1;
  return 0;
}

/* Bounds-checked reader over a payload. */
typedef struct rd {
  const uint8_t *p;
  size_t left;
  int bad;
} rd;

static uint32_t rd_u32(rd *r) {
  if (r->bad || r->left < 4) {
    r->bad = 1;
    return 0;
  }
  uint32_t v = braid__le32(r->p);
  r->p += 4;
  r->left -= 4;
  return v;
}

static uint8_t rd_u8(rd *r) {
  if (r->bad || r->left < 1) {
    r->bad = 1;
    return 0;
  }
  uint8_t v = r->p[0];
  r->p++;
  r->left--;
  return v;
}

/* A length-prefixed byte string; *over set when its length exceeds max (the
   bytes must still be present, so an oversized field never hides a truncation). */
static braid__bytes rd_str(rd *r, uint32_t max, int *over) {
  braid__bytes s = {NULL, 0};
  uint32_t n = rd_u32(r);
  if (r->bad) return s;
  if (n > r->left) {
    r->bad = 1;
    return s;
  }
  if (n > max) *over = 1;
  s.p = r->p;
  s.len = n;
  r->p += n;
  r->left -= n;
  return s;
}

int braid__proto_decode_req(uint8_t type, const uint8_t *p, size_t len, braid__proto_req *q) {
  memset(q, 0, sizeof *q);
  q->type = type;
  rd r = {p, len, 0};
  int over = 0;
  switch (type) {
    case BRAID__PT_SET:
      q->key = rd_str(&r, BRAID__STORE_MAX_KEY, &over);
      q->val = rd_str(&r, BRAID__STORE_MAX_VALUE, &over);
      break;
    case BRAID__PT_GET:
      q->timeout_ms = rd_u32(&r);
      q->key = rd_str(&r, BRAID__STORE_MAX_KEY, &over);
      break;
    case BRAID__PT_ADD:
      q->key = rd_str(&r, BRAID__STORE_MAX_KEY, &over);
      if (r.left < 8) {
        r.bad = 1;
      } else if (!r.bad) {
        q->delta = (int64_t)braid__le64(r.p);
        r.p += 8;
        r.left -= 8;
      }
      break;
    case BRAID__PT_CAS: {
      q->key = rd_str(&r, BRAID__STORE_MAX_KEY, &over);
      uint8_t has = rd_u8(&r);
      if (has > 1) r.bad = 1;
      q->has_expected = has;
      q->expected = rd_str(&r, BRAID__STORE_MAX_VALUE, &over);
      q->val = rd_str(&r, BRAID__STORE_MAX_VALUE, &over);
      if (!has && q->expected.len) r.bad = 1;
      break;
    }
    case BRAID__PT_DELETE:
      q->key = rd_str(&r, BRAID__STORE_MAX_KEY, &over);
      break;
    case BRAID__PT_WAIT:
      q->timeout_ms = rd_u32(&r);
      q->nkeys = rd_u32(&r);
      if (q->nkeys > BRAID__PROTO_MAX_WAIT_KEYS) r.bad = 1;
      q->keys = r.p;
      for (uint32_t i = 0; i < q->nkeys && !r.bad; i++) (void)rd_str(&r, BRAID__STORE_MAX_KEY, &over);
      q->keys_len = r.bad ? 0 : (size_t)(r.p - q->keys);
      break;
    default:
      return BRAID__PST_BAD_REQUEST;
  }
  if (r.bad || r.left != 0) return BRAID__PST_BAD_REQUEST;
  return over ? BRAID__PST_TOO_LARGE : BRAID__PST_OK;
}

void braid__proto_next_key(const uint8_t **p, braid__bytes *key) {
  key->len = braid__le32(*p);
  key->p = *p + 4;
  *p += 4 + (size_t)key->len;
}

int braid__proto_decode_hello(const uint8_t *p, size_t len, int client, braid__proto_hello *h) {
  memset(h, 0, sizeof *h);
  size_t want = client ? BRAID__PROTO_CHELLO_LEN : BRAID__PROTO_HELLO_LEN;
  if (len < 6 || memcmp(p, BRAID__PROTO_MAGIC, 4) != 0) return -1;
  h->version = braid__le16(p + 4);
  if (h->version != BRAID__PROTO_VERSION) return -2; /* later versions may change the layout */
  if (len != want) return -1;
  h->flags = braid__le16(p + 6);
  memcpy(h->nonce, p + 8, BRAID__PROTO_NONCE);
  if (client) memcpy(h->mac, p + 8 + BRAID__PROTO_NONCE, BRAID__PROTO_MAC);
  return 0;
}

void braid__proto_put_hello(braid__buf *b, uint16_t flags, const uint8_t nonce[BRAID__PROTO_NONCE],
                            const uint8_t *mac) {
  braid__buf_put(b, BRAID__PROTO_MAGIC, 4);
  braid__buf_u16(b, BRAID__PROTO_VERSION);
  braid__buf_u16(b, flags);
  braid__buf_put(b, nonce, BRAID__PROTO_NONCE);
  if (mac) braid__buf_put(b, mac, BRAID__PROTO_MAC);
}

int braid__proto_parse_i64(const uint8_t *p, size_t len, int64_t *out) {
  size_t i = 0;
  int neg = 0;
  if (len == 0 || len > 20) return -1;
  if (p[0] == '-' || p[0] == '+') {
    neg = p[0] == '-';
    i = 1;
    if (len == 1) return -1;
  }
  uint64_t v = 0;
  uint64_t lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (; i < len; i++) {
    if (p[i] < '0' || p[i] > '9') return -1;
    uint64_t d = (uint64_t)(p[i] - '0');
    if (v > (lim - d) / 10) return -1;
    v = v * 10 + d;
  }
  /* Two's complement conversion without signed overflow. */
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return 0;
}

size_t braid__proto_format_i64(int64_t v, char out[24]) {
  char tmp[24];
  size_t n = 0;
  uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  do {
    tmp[n++] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  size_t o = 0;
  if (v < 0) out[o++] = '-';
  while (n) out[o++] = tmp[--n];
  out[o] = 0;
  return o;
}
