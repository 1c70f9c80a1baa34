/*
 * The tcp backend's wire format: one fixed 80-byte little-endian header per
 * frame, then len payload bytes. Pure functions (no sockets, no state): the
 * encoder, the decoder, the field-by-field validation every received header
 * goes through, and the handshake and failure payloads. The libFuzzer target
 * tests/fuzz/fuzz_tcp_frame.c drives them with arbitrary bytes.
 *
 * Header layout (offsets in bytes):
 *    0 magic "BRDT"   4 version   5 type   6 dt   7 flags (0)
 *    8 comm id       16 tag      24 seq (per connection and direction)
 *   32 len (payload bytes)       40 count (elements)
 *   48 msg id (rendezvous)       56 offset (DATA)
 *   64 descriptor (braid__desc: count u64, kind u8, dt u8, flags u16, arg i32)
 * A field a type does not use must be zero.
 */
#ifndef BRAID_TCP_FRAME_H
#define BRAID_TCP_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "core/desc.h"

#define BRAID_TCP_MAGIC 0x54445242u /* "BRDT" read as a little-endian u32 */
#define BRAID_TCP_VERSION 1
#define BRAID_TCP_HDR 80
#define BRAID_TCP_NONCE 32
#define BRAID_TCP_MAC 32
#define BRAID_TCP_HELLO_LEN 48 /* src u32, dst u32, socket index u32, reserved u32, nonce_c */
#define BRAID_TCP_ACK_LEN 64   /* nonce_s, mac_s */
#define BRAID_TCP_AUTH_LEN 32  /* mac_c */
#define BRAID_TCP_FAIL_TEXT 480
#define BRAID_TCP_FAIL_MIN 8 /* status i32, origin rank i32, then the sentence */
#define BRAID_TCP_FAIL_MAX (BRAID_TCP_FAIL_MIN + BRAID_TCP_FAIL_TEXT)
#define BRAID_TCP_MAX_SOCKS 16

enum {
  BRAID_TCP_HELLO = 1, /* connector: who it is and its challenge */
  BRAID_TCP_HELLO_ACK, /* acceptor: its challenge and its proof */
  BRAID_TCP_AUTH,      /* connector: its proof */
  BRAID_TCP_EAGER,     /* a whole message */
  BRAID_TCP_RTS,       /* a large message announced */
  BRAID_TCP_CTS,       /* the receiver's go-ahead for a rendezvous message */
  BRAID_TCP_DATA,      /* a piece of a rendezvous message */
  BRAID_TCP_FAIL,      /* the sender's communicator failed: status, origin, sentence */
  BRAID_TCP_BYE,       /* the sender destroyed its communicator */
  BRAID_TCP_NTYPES
};

#define BRAID_TCP_T(type) (1u << (type))

typedef struct braid__tcp_hdr {
  uint32_t magic;
  uint8_t version, type, dt, flags;
  uint64_t comm, tag, seq, len, count, msgid, offset;
  braid__desc desc;
} braid__tcp_hdr;

/* What the receiving end expects of the next header on one connection. */
typedef struct braid__tcp_limits {
  uint64_t comm;      /* the communicator's id */
  uint64_t seq;       /* the sequence number the frame must carry */
  unsigned types;     /* BRAID_TCP_T(type) per type allowed now */
  uint64_t eager_max; /* EAGER payload bound */
  uint64_t data_max;  /* DATA payload bound */
} braid__tcp_limits;

void braid__tcp_hdr_encode(const braid__tcp_hdr *h, uint8_t out[BRAID_TCP_HDR]);
void braid__tcp_hdr_decode(const uint8_t in[BRAID_TCP_HDR], braid__tcp_hdr *h);

/* 0 when every field is valid for its type under lim; else -1 and why gets
   "<field> <value>" (e.g. "seq 7 (expected 5)", "dt 99"). A DATA frame's
   offset + len against its message and the msg id of CTS and DATA are the
   caller's to check (they need the connection's state). */
int braid__tcp_hdr_check(const braid__tcp_hdr *h, const braid__tcp_limits *lim, char *why, size_t whylen);

/* "HELLO", "EAGER", ... or "unknown". */
const char *braid__tcp_type_name(unsigned type);

typedef struct braid__tcp_hello {
  uint32_t src, dst, index, reserved;
  uint8_t nonce[BRAID_TCP_NONCE];
} braid__tcp_hello;

void braid__tcp_hello_encode(const braid__tcp_hello *m, uint8_t out[BRAID_TCP_HELLO_LEN]);
/* 0, or -1 with why: src, dst, index and reserved are checked against size
   (the acceptor's world), me (its rank) and BRAID_TCP_MAX_SOCKS. */
int braid__tcp_hello_decode(const uint8_t *p, size_t len, int size, int me, braid__tcp_hello *m, char *why,
                            size_t whylen);

/* FAIL payload; the sentence is cut to BRAID_TCP_FAIL_TEXT bytes. Returns the
   payload length. */
size_t braid__tcp_fail_encode(int status, int origin, const char *text, uint8_t out[BRAID_TCP_FAIL_MAX]);
/* 0, or -1 with why: status must be a fatal-capable braid_status (1 ..
   BRAID_ERR_INTERNAL), origin a rank of a world of size. The sentence is
   copied with bytes outside printable ASCII replaced by '?'. */
int braid__tcp_fail_decode(const uint8_t *p, size_t len, int size, int *status, int *origin, char *text, size_t textlen,
                           char *why, size_t whylen);

/* The handshake proof: HMAC-SHA-256(key, label || comm || src || dst ||
   index || nonce_c || nonce_s), label "braid-tcp-v1 server" (server != 0)
   or "braid-tcp-v1 client"; integers little-endian (comm u64, the rest
   u32). src is the connecting rank, dst the accepting one. 0, or -1 when
   libcrypto failed. */
int braid__tcp_mac(const uint8_t *key, size_t keylen, int server, uint64_t comm, uint32_t src, uint32_t dst,
                   uint32_t index, const uint8_t nonce_c[BRAID_TCP_NONCE], const uint8_t nonce_s[BRAID_TCP_NONCE],
                   uint8_t out[BRAID_TCP_MAC]);

#endif
