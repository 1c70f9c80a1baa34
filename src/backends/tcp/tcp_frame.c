/* The tcp backend's frames: encoding, decoding and validation (see tcp_frame.h). */
#include "backends/tcp/tcp_frame.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "bootstrap/auth.h"
#include "braid.h"
#include "core/dtype.h"
#include "core/tag.h"

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

void braid__tcp_hdr_encode(const braid__tcp_hdr *h, uint8_t out[BRAID_TCP_HDR]) {
  put32(out, h->magic);
  out[4] = h->version;
  out[5] = h->type;
  out[6] = h->dt;
  out[7] = h->flags;
  put64(out + 8, h->comm);
  put64(out + 16, h->tag);
  put64(out + 24, h->seq);
  put64(out + 32, h->len);
  put64(out + 40, h->count);
  put64(out + 48, h->msgid);
  put64(out + 56, h->offset);
  put64(out + 64, h->desc.count);
  out[72] = h->desc.kind;
  out[73] = h->desc.dt;
  put16(out + 74, h->desc.flags);
  put32(out + 76, (uint32_t)h->desc.arg);
}

void braid__tcp_hdr_decode(const uint8_t in[BRAID_TCP_HDR], braid__tcp_hdr *h) {
  h->magic = get32(in);
  h->version = in[4];
  h->type = in[5];
  h->dt = in[6];
  h->flags = in[7];
  h->comm = get64(in + 8);
  h->tag = get64(in + 16);
  h->seq = get64(in + 24);
  h->len = get64(in + 32);
  h->count = get64(in + 40);
  h->msgid = get64(in + 48);
  h->offset = get64(in + 56);
  h->desc.count = get64(in + 64);
  h->desc.kind = in[72];
  h->desc.dt = in[73];
  h->desc.flags = get16(in + 74);
  h->desc.arg = (int32_t)get32(in + 76);
}

static const char *const type_names[BRAID_TCP_NTYPES] = {
    [BRAID_TCP_HELLO] = "HELLO", [BRAID_TCP_HELLO_ACK] = "HELLO_ACK",
    [BRAID_TCP_AUTH] = "AUTH",   [BRAID_TCP_EAGER] = "EAGER",
    [BRAID_TCP_RTS] = "RTS",     [BRAID_TCP_CTS] = "CTS",
    [BRAID_TCP_DATA] = "DATA",   [BRAID_TCP_FAIL] = "FAIL",
    [BRAID_TCP_BYE] = "BYE",
};

const char *braid__tcp_type_name(unsigned type) {
  return type > 0 && type < BRAID_TCP_NTYPES ? type_names[type] : "unknown";
}

#define BAD(...)                                                                                                       \
  do {                                                                                                                 \
    if (why && whylen) snprintf(why, whylen, __VA_ARGS__);                                                             \
    return -1;                                                                                                         \
  } while (0)

/* The fields a type does not use are zero; fields names the ones it uses. */
enum { F_TAG = 1, F_COUNT = 2, F_DT = 4, F_MSGID = 8, F_OFFSET = 16, F_DESC = 32 };

static int check_unused(const braid__tcp_hdr *h, unsigned used, char *why, size_t whylen) {
  const char *t = braid__tcp_type_name(h->type);
  if (!(used & F_TAG) && h->tag) BAD("tag %llu in a %s frame (must be 0)", (unsigned long long)h->tag, t);
  if (!(used & F_COUNT) && h->count) BAD("count %llu in a %s frame (must be 0)", (unsigned long long)h->count, t);
  if (!(used & F_DT) && h->dt) BAD("dt %u in a %s frame (must be 0)", h->dt, t);
  if (!(used & F_MSGID) && h->msgid) BAD("msg id %llu in a %s frame (must be 0)", (unsigned long long)h->msgid, t);
  if (!(used & F_OFFSET) && h->offset) BAD("offset %llu in a %s frame (must be 0)", (unsigned long long)h->offset, t);
  if (!(used & F_DESC) && (h->desc.count || h->desc.kind || h->desc.dt || h->desc.flags || h->desc.arg))
    BAD("descriptor (kind %u, dt %u, count %llu) in a %s frame (must be 0)", h->desc.kind, h->desc.dt,
        (unsigned long long)h->desc.count, t);
  return 0;
}

/* A message's tag, element type, size and descriptor (EAGER and RTS). */
static int check_message(const braid__tcp_hdr *h, uint64_t *bytes, char *why, size_t whylen) {
  size_t esz = braid__dtsize((braid_dtype)h->dt);
  if (!esz) BAD("dt %u (not a dtype)", h->dt);
  uint64_t b;
  if (__builtin_mul_overflow(h->count, (uint64_t)esz, &b) || b > (uint64_t)PTRDIFF_MAX)
    BAD("count %llu (times %zu bytes per element overflows)", (unsigned long long)h->count, esz);
  *bytes = b;
  const braid__desc *d = &h->desc;
  if (braid__tag_is_internal(h->tag)) {
    if (d->kind == BRAID__COLL_NONE || d->kind >= BRAID__COLL_NKINDS)
      BAD("descriptor kind %u with internal tag 0x%llx", d->kind, (unsigned long long)h->tag);
    if (!braid__dtsize((braid_dtype)d->dt)) BAD("descriptor dt %u (not a dtype)", d->dt);
  } else {
    if (h->tag > UINT32_MAX) BAD("tag 0x%llx (a user tag has 32 bits)", (unsigned long long)h->tag);
    if (d->count || d->kind || d->dt || d->flags || d->arg)
      BAD("descriptor kind %u with user tag %llu (must be empty)", d->kind, (unsigned long long)h->tag);
  }
  return 0;
}

int braid__tcp_hdr_check(const braid__tcp_hdr *h, const braid__tcp_limits *lim, char *why, size_t whylen) {
  if (h->magic != BRAID_TCP_MAGIC) BAD("magic 0x%08x (expected 0x%08x, \"BRDT\")", h->magic, BRAID_TCP_MAGIC);
  if (h->version != BRAID_TCP_VERSION) BAD("version %u (this rank speaks %u)", h->version, BRAID_TCP_VERSION);
  if (h->type == 0 || h->type >= BRAID_TCP_NTYPES) BAD("type %u (unknown)", h->type);
  if (!(lim->types & BRAID_TCP_T(h->type)))
    BAD("type %u (%s, not expected here)", h->type, braid__tcp_type_name(h->type));
  if (h->flags) BAD("flags 0x%02x (must be 0)", h->flags);
  if (h->comm != lim->comm)
    BAD("comm id 0x%llx (expected 0x%llx)", (unsigned long long)h->comm, (unsigned long long)lim->comm);
  if (h->seq != lim->seq) BAD("seq %llu (expected %llu)", (unsigned long long)h->seq, (unsigned long long)lim->seq);
  const char *t = braid__tcp_type_name(h->type);
  uint64_t bytes = 0;
  switch (h->type) {
  case BRAID_TCP_HELLO:
  case BRAID_TCP_HELLO_ACK:
  case BRAID_TCP_AUTH: {
    uint64_t want = h->type == BRAID_TCP_HELLO       ? BRAID_TCP_HELLO_LEN
                    : h->type == BRAID_TCP_HELLO_ACK ? BRAID_TCP_ACK_LEN
                                                     : BRAID_TCP_AUTH_LEN;
    if (h->len != want)
      BAD("len %llu in a %s frame (expected %llu)", (unsigned long long)h->len, t, (unsigned long long)want);
    return check_unused(h, 0, why, whylen);
  }
  case BRAID_TCP_EAGER:
    if (check_message(h, &bytes, why, whylen)) return -1;
    if (bytes > lim->eager_max)
      BAD("count %llu (%llu bytes, above the eager bound of %llu)", (unsigned long long)h->count,
          (unsigned long long)bytes, (unsigned long long)lim->eager_max);
    if (h->len != bytes)
      BAD("len %llu in an EAGER frame of %llu elements of %s (expected %llu)", (unsigned long long)h->len,
          (unsigned long long)h->count, braid_dtype_name((braid_dtype)h->dt), (unsigned long long)bytes);
    return check_unused(h, F_TAG | F_COUNT | F_DT | F_DESC, why, whylen);
  case BRAID_TCP_RTS:
    if (check_message(h, &bytes, why, whylen)) return -1;
    if (!bytes) BAD("count %llu in an RTS frame (a rendezvous message is not empty)", (unsigned long long)h->count);
    if (h->len) BAD("len %llu in an RTS frame (must be 0)", (unsigned long long)h->len);
    if (!h->msgid) BAD("msg id 0 in an RTS frame");
    return check_unused(h, F_TAG | F_COUNT | F_DT | F_DESC | F_MSGID, why, whylen);
  case BRAID_TCP_CTS:
    if (h->len) BAD("len %llu in a CTS frame (must be 0)", (unsigned long long)h->len);
    if (!h->msgid) BAD("msg id 0 in a CTS frame");
    return check_unused(h, F_MSGID, why, whylen);
  case BRAID_TCP_DATA: {
    if (!h->len || h->len > lim->data_max)
      BAD("len %llu in a DATA frame (expected 1 to %llu)", (unsigned long long)h->len,
          (unsigned long long)lim->data_max);
    if (!h->msgid) BAD("msg id 0 in a DATA frame");
    uint64_t end;
    if (__builtin_add_overflow(h->offset, h->len, &end) || end > (uint64_t)PTRDIFF_MAX)
      BAD("offset %llu (plus len %llu overflows)", (unsigned long long)h->offset, (unsigned long long)h->len);
    return check_unused(h, F_MSGID | F_OFFSET, why, whylen);
  }
  case BRAID_TCP_FAIL:
    if (h->len < BRAID_TCP_FAIL_MIN || h->len > BRAID_TCP_FAIL_MAX)
      BAD("len %llu in a FAIL frame (expected %d to %d)", (unsigned long long)h->len, BRAID_TCP_FAIL_MIN,
          BRAID_TCP_FAIL_MAX);
    return check_unused(h, 0, why, whylen);
  case BRAID_TCP_BYE:
    if (h->len) BAD("len %llu in a BYE frame (must be 0)", (unsigned long long)h->len);
    return check_unused(h, 0, why, whylen);
  default: BAD("type %u (unknown)", h->type);
  }
}

void braid__tcp_hello_encode(const braid__tcp_hello *m, uint8_t out[BRAID_TCP_HELLO_LEN]) {
  put32(out, m->src);
  put32(out + 4, m->dst);
  put32(out + 8, m->index);
  put32(out + 12, m->reserved);
  memcpy(out + 16, m->nonce, BRAID_TCP_NONCE);
}

int braid__tcp_hello_decode(const uint8_t *p, size_t len, int size, int me, braid__tcp_hello *m, char *why,
                            size_t whylen) {
  if (len != BRAID_TCP_HELLO_LEN) BAD("HELLO payload of %zu bytes (expected %d)", len, BRAID_TCP_HELLO_LEN);
  m->src = get32(p);
  m->dst = get32(p + 4);
  m->index = get32(p + 8);
  m->reserved = get32(p + 12);
  memcpy(m->nonce, p + 16, BRAID_TCP_NONCE);
  if (m->dst != (uint32_t)me) BAD("HELLO for rank %u (this is rank %d)", m->dst, me);
  if (m->src >= (uint32_t)size || m->src == (uint32_t)me)
    BAD("HELLO from rank %u (world size %d, this is rank %d)", m->src, size, me);
  if (m->index >= BRAID_TCP_MAX_SOCKS) BAD("HELLO socket index %u (at most %d sockets)", m->index, BRAID_TCP_MAX_SOCKS);
  if (m->reserved) BAD("HELLO reserved word %u (must be 0)", m->reserved);
  return 0;
}

size_t braid__tcp_fail_encode(int status, int origin, const char *text, uint8_t out[BRAID_TCP_FAIL_MAX]) {
  put32(out, (uint32_t)status);
  put32(out + 4, (uint32_t)origin);
  size_t n = text ? strlen(text) : 0;
  if (n > BRAID_TCP_FAIL_TEXT) n = BRAID_TCP_FAIL_TEXT;
  if (n) memcpy(out + BRAID_TCP_FAIL_MIN, text, n);
  return BRAID_TCP_FAIL_MIN + n;
}

int braid__tcp_fail_decode(const uint8_t *p, size_t len, int size, int *status, int *origin, char *text, size_t textlen,
                           char *why, size_t whylen) {
  if (len < BRAID_TCP_FAIL_MIN || len > BRAID_TCP_FAIL_MAX) BAD("FAIL payload of %zu bytes", len);
  int32_t st = (int32_t)get32(p), org = (int32_t)get32(p + 4);
  if (st <= 0 || st > (int32_t)BRAID_ERR_INTERNAL) BAD("FAIL status %d (not a braid error)", (int)st);
  if (org < 0 || org >= size) BAD("FAIL origin rank %d (world size %d)", (int)org, size);
  *status = st;
  *origin = org;
  if (textlen) {
    size_t n = len - BRAID_TCP_FAIL_MIN;
    if (n > textlen - 1) n = textlen - 1;
    for (size_t i = 0; i < n; i++) {
      uint8_t ch = p[BRAID_TCP_FAIL_MIN + i];
      text[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    text[n] = 0;
  }
  return 0;
}

int braid__tcp_mac(const uint8_t *key, size_t keylen, int server, uint64_t comm, uint32_t src, uint32_t dst,
                   uint32_t index, const uint8_t nonce_c[BRAID_TCP_NONCE], const uint8_t nonce_s[BRAID_TCP_NONCE],
                   uint8_t out[BRAID_TCP_MAC]) {
  static const char client_label[] = "braid-tcp-v1 client";
  static const char server_label[] = "braid-tcp-v1 server";
  _Static_assert(sizeof client_label == sizeof server_label, "labels of one length");
  uint8_t msg[sizeof client_label - 1 + 8 + 12 + 2 * BRAID_TCP_NONCE];
  size_t o = sizeof client_label - 1;
  memcpy(msg, server ? server_label : client_label, o);
  put64(msg + o, comm);
  put32(msg + o + 8, src);
  put32(msg + o + 12, dst);
  put32(msg + o + 16, index);
  memcpy(msg + o + 20, nonce_c, BRAID_TCP_NONCE);
  memcpy(msg + o + 20 + BRAID_TCP_NONCE, nonce_s, BRAID_TCP_NONCE);
  return braid__hmac_sha256(key, keylen, msg, sizeof msg, out);
}
