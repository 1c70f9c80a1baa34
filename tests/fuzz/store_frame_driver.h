/*
 * Feeds bytes to the store server's connection state machine without
 * sockets. Shared by the libFuzzer target (fuzz_store_frame.c) and the
 * bad-frame corpus test in tests/unit/test_store.c.
 *
 * Input: byte 0 is a mode, the rest is client data.
 *   mode bit0: the server has a job token
 *   mode bit1: no automatic handshake (the data must carry the client hello)
 *   mode bit2: the peer is not loopback
 *   mode bit3: chunked: the data is a list of [ctl u8][len u8][len bytes];
 *              ctl&3 picks one of 4 connections, (ctl>>2)&3 the action:
 *              0 feed, 1 advance the clock by len*50 ms, 2 reconnect, 3 feed byte by byte
 *   otherwise: everything goes to connection 0 at once, then the clock jumps
 *   past every time bound.
 * Every frame the server emits is checked to be well formed (abort() if not).
 */
#ifndef BRAID_STORE_FRAME_DRIVER_H
#define BRAID_STORE_FRAME_DRIVER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/auth.h"
#include "bootstrap/store_proto.h"

#define SFD_CONNS 4

typedef struct sfd_result {
  int dropped_early[SFD_CONNS]; /* dropped while its data was fed */
  int dropped[SFD_CONNS];       /* dropped by the end (time bounds included) */
  int authed[SFD_CONNS];
  int replies;                  /* request replies seen */
  int last_status;              /* status of the last reply or AUTH_FAIL */
} sfd_result;

static const uint8_t sfd_token[32] = {0x62, 0x72, 0x61, 0x69, 0x64, 0x2d, 0x66, 0x75, 0x7a, 0x7a, 0x2d,
                                      0x74, 0x6f, 0x6b, 0x65, 0x6e, 1,    2,    3,    4,    5,    6,
                                      7,    8,    9,    10,   11,   12,   13,   14,   15,   16};

typedef struct sfd_conn {
  braid__store_conn *k;
  int dead;
  uint8_t nonce[BRAID__PROTO_NONCE];
  int have_nonce;
} sfd_conn;

/* Consumes and checks what the server queued for one connection. */
static void sfd_drain(sfd_conn *sc, int idx, sfd_result *res) {
  size_t len = 0;
  const uint8_t *p = braid__store_core_pending(sc->k, &len);
  size_t off = 0;
  while (off < len) {
    braid__proto_hdr h;
    if (len - off < BRAID__PROTO_HDR) abort(); /* frames are queued whole */
    if (braid__proto_parse_hdr(p + off, BRAID__STORE_MAX_VALUE + 64u, &h) != 0) abort();
    if (len - off - BRAID__PROTO_HDR < h.len) abort();
    const uint8_t *pl = p + off + BRAID__PROTO_HDR;
    if (h.type == BRAID__PT_S_HELLO) {
      braid__proto_hello hh;
      if (braid__proto_decode_hello(pl, h.len, 0, &hh) != 0) abort();
      memcpy(sc->nonce, hh.nonce, sizeof sc->nonce);
      sc->have_nonce = 1;
    } else if (h.type == BRAID__PT_AUTH_OK) {
      if (h.len != BRAID__PROTO_MAC) abort();
      res->authed[idx] = 1;
    } else if (h.type == BRAID__PT_AUTH_FAIL) {
      res->last_status = h.status;
    } else if (h.type > BRAID__PT_REPLY && h.type <= (BRAID__PT_REPLY | BRAID__PT_WAIT)) {
      res->replies++;
      res->last_status = h.status;
    } else {
      abort();
    }
    off += BRAID__PROTO_HDR + h.len;
  }
  braid__store_core_consume(sc->k, len);
}

static void sfd_feed(braid__store_core *core, sfd_conn *sc, const uint8_t *d, size_t n, double now) {
  if (sc->dead) return;
  if (braid__store_core_feed(core, sc->k, d, n, now) != 0) sc->dead = 1;
}

static void sfd_open(braid__store_core *core, sfd_conn *sc, int idx, int mode, double now, sfd_result *res) {
  memset(sc, 0, sizeof *sc);
  sc->k = braid__store_core_open(core, !(mode & 4), "fuzz", now);
  if (!sc->k) abort();
  sc->dead = braid__store_core_dropped(sc->k);
  sfd_drain(sc, idx, res);
  if ((mode & 2) || sc->dead || !sc->have_nonce) return;
  /* A valid client hello, so the data reaches request parsing. */
  uint8_t nonce_c[BRAID__PROTO_NONCE] = {7}, mac[BRAID__PROTO_MAC] = {0};
  if (mode & 1) braid__store_auth_mac(sfd_token, sizeof sfd_token, 0, sc->nonce, nonce_c, mac);
  braid__buf b = {0};
  size_t at = braid__proto_begin(&b, BRAID__PT_C_HELLO, 0, 0);
  braid__proto_put_hello(&b, (mode & 1) ? BRAID__PROTO_FLAG_TOKEN : 0, nonce_c, mac);
  braid__proto_end(&b, at);
  sfd_feed(core, sc, b.p, b.len, now);
  braid__buf_free(&b);
  sfd_drain(sc, idx, res);
}

static void sfd_settle(braid__store_core *core, sfd_conn *sc, sfd_result *res, double now) {
  (void)braid__store_core_tick(core, now);
  for (int i = 0; i < SFD_CONNS; i++) {
    sfd_drain(&sc[i], i, res);
    if (braid__store_core_dropped(sc[i].k)) sc[i].dead = 1;
  }
}

static void store_frame_run(const uint8_t *data, size_t size, sfd_result *res) {
  memset(res, 0, sizeof *res);
  res->last_status = -1;
  if (size < 1) return;
  int mode = data[0];
  data++;
  size--;
  braid__store_core *core = braid__store_core_new((mode & 1) ? sfd_token : NULL, (mode & 1) ? sizeof sfd_token : 0);
  if (!core) abort();
  /* Small total bound so the full-store path is reachable with short inputs. */
  braid__store_core_limits(core, 10.0, 5.0, 64u << 10);
  double now = 1000.0;
  sfd_conn sc[SFD_CONNS];
  for (int i = 0; i < SFD_CONNS; i++) sfd_open(core, &sc[i], i, mode, now, res);
  if (!(mode & 8)) {
    sfd_feed(core, &sc[0], data, size, now);
    sfd_settle(core, sc, res, now + 0.001);
    res->dropped_early[0] = sc[0].dead;
    sfd_settle(core, sc, res, now + 3600.0);
  } else {
    size_t off = 0;
    while (off + 2 <= size) {
      int ctl = data[off], n = data[off + 1];
      off += 2;
      if ((size_t)n > size - off) n = (int)(size - off);
      int c = ctl & 3, act = (ctl >> 2) & 3;
      if (act == 0) {
        sfd_feed(core, &sc[c], data + off, (size_t)n, now);
      } else if (act == 1) {
        now += n * 0.05;
      } else if (act == 2) {
        braid__store_core_close(core, sc[c].k);
        sfd_open(core, &sc[c], c, mode, now, res);
      } else {
        for (int j = 0; j < n; j++) sfd_feed(core, &sc[c], data + off + j, 1, now);
      }
      if (act != 1) off += (size_t)n;
      sfd_settle(core, sc, res, now);
    }
    for (int i = 0; i < SFD_CONNS; i++) res->dropped_early[i] = sc[i].dead;
    sfd_settle(core, sc, res, now + 3600.0);
  }
  for (int i = 0; i < SFD_CONNS; i++) res->dropped[i] = sc[i].dead;
  braid__store_core_free(core);
}

#endif
