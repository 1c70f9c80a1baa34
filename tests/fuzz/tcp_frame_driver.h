/*
 * Feeds bytes to the tcp backend's frame layer (src/backends/tcp/tcp_frame.h)
 * as one socket's stream, without sockets: every header is decoded and
 * validated as the receiving rank does, a valid one must encode back to the
 * same bytes, and its payload goes through the payload decoders. Shared by
 * the libFuzzer target (fuzz_tcp_frame.c) and the corpus replay in
 * tests/unit/test_tcp.c.
 *
 * Input: byte 0 is a mode, the rest is the stream.
 *   mode & 3: 0 an accepted socket from its first byte (HELLO, AUTH, then
 *             data frames), 1 an accepted socket already authenticated,
 *             2 an outgoing socket (HELLO_ACK, then FAIL and BYE only)
 *   mode bit2: a small eager bound (4 KiB) instead of the largest one
 * The receiver is rank 0 of a world of 4 in communicator TFD_COMM.
 */
#ifndef BRAID_TCP_FRAME_DRIVER_H
#define BRAID_TCP_FRAME_DRIVER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/tcp/tcp_frame.h"
#include "core/dtype.h"

#define TFD_COMM 0x1234abcdULL
#define TFD_SIZE 4
#define TFD_MSGS 8

typedef struct tfd_result {
  int frames;    /* valid frames consumed */
  int refused;   /* stopped at an invalid header or payload */
  int truncated; /* stopped inside a frame */
  int bye;       /* a BYE ended the stream */
  char why[200]; /* the refusal's reason */
} tfd_result;

/* Rendezvous messages the simulated receiver has asked for (RTS seen). */
typedef struct tfd_msg {
  uint64_t id, bytes, got;
} tfd_msg;

static void tcp_frame_run(const uint8_t *data, size_t size, tfd_result *res) {
  memset(res, 0, sizeof *res);
  if (!size) return;
  int mode = data[0] & 3;
  uint64_t eager_max = (data[0] & 4) ? 4096 : (uint64_t)64 << 20;
  const uint8_t *p = data + 1;
  size_t left = size - 1;
  /* 0 wait HELLO, 1 wait AUTH, 2 data; outgoing: 3 wait HELLO_ACK, 4 FAIL/BYE */
  int state = mode == 0 ? 0 : mode == 1 ? 2 : 3;
  uint64_t seq = mode == 1 ? 2 : 0;
  tfd_msg msgs[TFD_MSGS];
  int nmsgs = 0;
  while (left) {
    if (left < BRAID_TCP_HDR) {
      res->truncated = 1;
      return;
    }
    braid__tcp_hdr h;
    braid__tcp_hdr_decode(p, &h);
    unsigned types = state == 0   ? BRAID_TCP_T(BRAID_TCP_HELLO)
                     : state == 1 ? BRAID_TCP_T(BRAID_TCP_AUTH)
                     : state == 2
                         ? BRAID_TCP_T(BRAID_TCP_EAGER) | BRAID_TCP_T(BRAID_TCP_RTS) | BRAID_TCP_T(BRAID_TCP_CTS) |
                               BRAID_TCP_T(BRAID_TCP_DATA) | BRAID_TCP_T(BRAID_TCP_FAIL) | BRAID_TCP_T(BRAID_TCP_BYE)
                     : state == 3 ? BRAID_TCP_T(BRAID_TCP_HELLO_ACK)
                                  : BRAID_TCP_T(BRAID_TCP_FAIL) | BRAID_TCP_T(BRAID_TCP_BYE);
    braid__tcp_limits lim = {TFD_COMM, seq, types, eager_max, (uint64_t)16 << 20};
    if (braid__tcp_hdr_check(&h, &lim, res->why, sizeof res->why)) {
      res->refused = 1;
      return;
    }
    /* A valid header is exactly what the encoder makes of its fields. */
    uint8_t again[BRAID_TCP_HDR];
    braid__tcp_hdr_encode(&h, again);
    if (memcmp(again, p, BRAID_TCP_HDR)) abort();
    p += BRAID_TCP_HDR;
    left -= BRAID_TCP_HDR;
    if (h.len > left) {
      res->truncated = 1;
      return;
    }
    const uint8_t *pl = p;
    size_t plen = (size_t)h.len;
    p += plen;
    left -= plen;
    seq++;
    switch (h.type) {
    case BRAID_TCP_HELLO: {
      braid__tcp_hello m;
      if (braid__tcp_hello_decode(pl, plen, TFD_SIZE, 0, &m, res->why, sizeof res->why)) {
        res->refused = 1;
        return;
      }
      uint8_t back[BRAID_TCP_HELLO_LEN];
      braid__tcp_hello_encode(&m, back);
      if (memcmp(back, pl, sizeof back)) abort();
      state = 1;
      break;
    }
    case BRAID_TCP_AUTH: state = 2; break;
    case BRAID_TCP_HELLO_ACK: state = 4; break;
    case BRAID_TCP_FAIL: {
      int st, origin;
      char text[BRAID_TCP_FAIL_TEXT + 1];
      if (braid__tcp_fail_decode(pl, plen, TFD_SIZE, &st, &origin, text, sizeof text, res->why, sizeof res->why)) {
        res->refused = 1;
        return;
      }
      for (size_t i = 0; text[i]; i++)
        if ((unsigned char)text[i] < 0x20 || (unsigned char)text[i] > 0x7e) abort();
      break;
    }
    case BRAID_TCP_RTS:
      for (int i = 0; i < nmsgs; i++)
        if (msgs[i].id == h.msgid) {
          res->refused = 1;
          return;
        }
      if (nmsgs < TFD_MSGS) {
        size_t esz = braid__dtsize((braid_dtype)h.dt);
        msgs[nmsgs++] = (tfd_msg){h.msgid, h.count * esz, 0};
      }
      break;
    case BRAID_TCP_DATA: {
      tfd_msg *m = NULL;
      for (int i = 0; i < nmsgs; i++)
        if (msgs[i].id == h.msgid) m = &msgs[i];
      if (!m || h.offset + h.len > m->bytes || m->got + h.len > m->bytes) {
        res->refused = 1;
        return;
      }
      m->got += h.len;
      break;
    }
    case BRAID_TCP_BYE:
      res->frames++;
      res->bye = 1;
      if (left) res->refused = 1; /* nothing follows a goodbye */
      return;
    default: break;
    }
    res->frames++;
  }
}

#endif
