/* Backend tcp: the wire format's validation, every collective over the
   generic algorithms at world sizes 1-16 (and on split children), tagged
   point to point of any size and order, size mismatches, dead, stopped and
   hostile peers, a CTS queued ahead of unstarted DATA, connections told
   apart by host, peers that leave first (a clean goodbye however their
   sockets stand), the congestion control of sockets on one host, a
   corrupt frame from an authenticated peer, IPv6, the secret drawn
   without a job token, no leaked descriptors, and 64 ranks starting at
   once. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/backends.h"
#include "braid.h"
#include "harness.h"
#include "p2p_check.h"

#if BRAID_WITH_TCP

#include "../fuzz/tcp_frame_driver.h"
#include "backends/tcp/tcp.h"
#include "bootstrap/auth.h"
#include "bootstrap/store.h"
#include "os/sock.h"
#include "coll_check.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Runs body on n tcp ranks; with expect_fail_rank >= 0 that rank may end
   any way (it was killed) and every other must pass. */
static int run_env(int n, bt_body body, void *arg, const char *const *env, int expect_fail_rank, double timeout) {
  bt_run_opts o = {"tcp", n, timeout, env, expect_fail_rank};
  bt_rank_result res[64];
  int rc = bt_run_ranks_ex(&o, body, arg, res);
  if (expect_fail_rank >= 0) {
    rc = 0;
    for (int r = 0; r < n; r++)
      if (r != expect_fail_rank && !(res[r].exited && res[r].code == 0)) rc = 1;
  }
  return rc;
}

static int run(int n, bt_body body, void *arg) { return run_env(n, body, arg, NULL, -1, bt_quick() ? 300 : 120); }

/* ---------------------------------------------------------------- the wire format */

static braid__tcp_hdr frame_of(int type) {
  braid__tcp_hdr h;
  memset(&h, 0, sizeof h);
  h.magic = BRAID_TCP_MAGIC;
  h.version = BRAID_TCP_VERSION;
  h.type = (uint8_t)type;
  h.comm = 77;
  h.seq = 5;
  switch (type) {
  case BRAID_TCP_HELLO: h.len = BRAID_TCP_HELLO_LEN; break;
  case BRAID_TCP_HELLO_ACK: h.len = BRAID_TCP_ACK_LEN; break;
  case BRAID_TCP_AUTH: h.len = BRAID_TCP_AUTH_LEN; break;
  case BRAID_TCP_EAGER:
    h.tag = 9;
    h.count = 10;
    h.dt = BRAID_F32;
    h.len = 40;
    break;
  case BRAID_TCP_RTS:
    h.tag = (1ull << 63) | 12345;
    h.count = 1 << 20;
    h.dt = BRAID_U8;
    h.msgid = 3;
    h.desc = braid__desc_make(BRAID__COLL_BROADCAST, 1 << 20, BRAID_U8, 2);
    break;
  case BRAID_TCP_CTS: h.msgid = 3; break;
  case BRAID_TCP_DATA:
    h.msgid = 3;
    h.offset = 100;
    h.len = 1000;
    break;
  case BRAID_TCP_FAIL: h.len = 20; break;
  default: break;
  }
  return h;
}

typedef struct bad_case {
  const char *name;
  int type;
  void (*mutate)(braid__tcp_hdr *h);
  const char *want;
} bad_case;

static void m_magic(braid__tcp_hdr *h) { h->magic ^= 1; }
static void m_version(braid__tcp_hdr *h) { h->version = 2; }
static void m_type0(braid__tcp_hdr *h) { h->type = 0; }
static void m_type99(braid__tcp_hdr *h) { h->type = 99; }
static void m_flags(braid__tcp_hdr *h) { h->flags = 1; }
static void m_comm(braid__tcp_hdr *h) { h->comm = 78; }
static void m_seq(braid__tcp_hdr *h) { h->seq = 6; }
static void m_dt(braid__tcp_hdr *h) { h->dt = 99; }
static void m_len(braid__tcp_hdr *h) { h->len++; }
static void m_len_huge(braid__tcp_hdr *h) { h->len = 1ull << 62; }
static void m_count_overflow(braid__tcp_hdr *h) { h->count = 1ull << 62; }
static void m_count_eager(braid__tcp_hdr *h) {
  h->count = (1 << 20) / 4 + 1;
  h->len = h->count * 4;
}
static void m_user_tag(braid__tcp_hdr *h) { h->tag = 1ull << 40; }
static void m_user_desc(braid__tcp_hdr *h) { h->desc.kind = BRAID__COLL_ALL_REDUCE; }
static void m_internal_none(braid__tcp_hdr *h) { h->desc.kind = BRAID__COLL_NONE; }
static void m_desc_dt(braid__tcp_hdr *h) { h->desc.dt = 77; }
static void m_desc_kind(braid__tcp_hdr *h) { h->desc.kind = 42; }
static void m_msgid0(braid__tcp_hdr *h) { h->msgid = 0; }
static void m_tag_unused(braid__tcp_hdr *h) { h->tag = 1; }
static void m_offset_unused(braid__tcp_hdr *h) { h->offset = 8; }
static void m_offset_overflow(braid__tcp_hdr *h) { h->offset = UINT64_MAX - 10; }
static void m_fail_short(braid__tcp_hdr *h) { h->len = 4; }
static void m_rts_len(braid__tcp_hdr *h) { h->len = 16; }
static void m_rts_empty(braid__tcp_hdr *h) { h->count = 0; }

static int test_frames(void) {
  braid__tcp_limits lim = {77, 5, ~0u, 1 << 20, 1 << 20};
  char why[200];
  for (int t = BRAID_TCP_HELLO; t < BRAID_TCP_NTYPES; t++) {
    braid__tcp_hdr h = frame_of(t), back;
    uint8_t b[BRAID_TCP_HDR], b2[BRAID_TCP_HDR];
    braid__tcp_hdr_encode(&h, b);
    BT_CHECK(!memcmp(b, "BRDT", 4), "%s: magic bytes", braid__tcp_type_name((unsigned)t));
    braid__tcp_hdr_decode(b, &back);
    braid__tcp_hdr_encode(&back, b2);
    BT_CHECK(!memcmp(b, b2, sizeof b), "%s: encode/decode round trip", braid__tcp_type_name((unsigned)t));
    BT_CHECK(braid__tcp_hdr_check(&back, &lim, why, sizeof why) == 0, "%s refused: %s",
             braid__tcp_type_name((unsigned)t), why);
    /* Not expected here: the type is refused by name. */
    braid__tcp_limits other = lim;
    other.types = ~BRAID_TCP_T(t);
    BT_CHECK(braid__tcp_hdr_check(&back, &other, why, sizeof why) && strstr(why, braid__tcp_type_name((unsigned)t)),
             "%s accepted where it is not expected (%s)", braid__tcp_type_name((unsigned)t), why);
  }
  static const bad_case bad[] = {
      {"magic", BRAID_TCP_EAGER, m_magic, "magic"},
      {"version", BRAID_TCP_EAGER, m_version, "version 2"},
      {"type 0", BRAID_TCP_EAGER, m_type0, "type 0"},
      {"type 99", BRAID_TCP_EAGER, m_type99, "type 99"},
      {"flags", BRAID_TCP_BYE, m_flags, "flags"},
      {"comm", BRAID_TCP_EAGER, m_comm, "comm id 0x4e"},
      {"seq", BRAID_TCP_CTS, m_seq, "seq 6 (expected 5)"},
      {"dt", BRAID_TCP_EAGER, m_dt, "dt 99"},
      {"eager len", BRAID_TCP_EAGER, m_len, "len 41"},
      {"eager count overflow", BRAID_TCP_EAGER, m_count_overflow, "count"},
      {"eager above the bound", BRAID_TCP_EAGER, m_count_eager, "eager bound"},
      {"user tag of 40 bits", BRAID_TCP_EAGER, m_user_tag, "tag"},
      {"user tag with a descriptor", BRAID_TCP_EAGER, m_user_desc, "descriptor"},
      {"internal tag without a kind", BRAID_TCP_RTS, m_internal_none, "descriptor kind 0"},
      {"descriptor dt", BRAID_TCP_RTS, m_desc_dt, "descriptor dt 77"},
      {"descriptor kind", BRAID_TCP_RTS, m_desc_kind, "descriptor kind 42"},
      {"rts len", BRAID_TCP_RTS, m_rts_len, "len 16"},
      {"rts empty", BRAID_TCP_RTS, m_rts_empty, "count 0"},
      {"rts msg id", BRAID_TCP_RTS, m_msgid0, "msg id 0"},
      {"cts msg id", BRAID_TCP_CTS, m_msgid0, "msg id 0"},
      {"cts tag", BRAID_TCP_CTS, m_tag_unused, "tag 1"},
      {"data len 0", BRAID_TCP_DATA, m_len_huge, "len"},
      {"data offset overflow", BRAID_TCP_DATA, m_offset_overflow, "offset"},
      {"eager offset", BRAID_TCP_EAGER, m_offset_unused, "offset 8"},
      {"hello len", BRAID_TCP_HELLO, m_len, "len 49"},
      {"hello len huge", BRAID_TCP_HELLO, m_len_huge, "len"},
      {"ack dt", BRAID_TCP_HELLO_ACK, m_dt, "dt 99"},
      {"auth len", BRAID_TCP_AUTH, m_len, "len 33"},
      {"fail short", BRAID_TCP_FAIL, m_fail_short, "len 4"},
      {"bye len", BRAID_TCP_BYE, m_len, "len 1"},
  };
  for (size_t i = 0; i < BT_COUNT(bad); i++) {
    braid__tcp_hdr h = frame_of(bad[i].type);
    bad[i].mutate(&h);
    uint8_t b[BRAID_TCP_HDR];
    braid__tcp_hdr_encode(&h, b);
    braid__tcp_hdr_decode(b, &h);
    why[0] = 0;
    BT_CHECK(braid__tcp_hdr_check(&h, &lim, why, sizeof why) != 0, "%s: accepted", bad[i].name);
    BT_CHECK(strstr(why, bad[i].want), "%s: the reason \"%s\" lacks \"%s\"", bad[i].name, why, bad[i].want);
  }
  /* Payloads. */
  braid__tcp_hello m = {1, 0, 3, 0, {0}}, got;
  for (int i = 0; i < BRAID_TCP_NONCE; i++) m.nonce[i] = (uint8_t)(i * 7);
  uint8_t pl[BRAID_TCP_HELLO_LEN];
  braid__tcp_hello_encode(&m, pl);
  BT_CHECK(braid__tcp_hello_decode(pl, sizeof pl, 4, 0, &got, why, sizeof why) == 0, "hello: %s", why);
  BT_CHECK(got.src == 1 && got.index == 3 && !memcmp(got.nonce, m.nonce, sizeof m.nonce), "hello fields");
  BT_CHECK(braid__tcp_hello_decode(pl, sizeof pl, 4, 2, &got, why, sizeof why) && strstr(why, "this is rank 2"),
           "hello for another rank: %s", why);
  BT_CHECK(braid__tcp_hello_decode(pl, sizeof pl, 1, 0, &got, why, sizeof why) && strstr(why, "world size 1"),
           "hello from beyond the world: %s", why);
  BT_CHECK(braid__tcp_hello_decode(pl, 47, 4, 0, &got, why, sizeof why), "short hello accepted");
  m.index = BRAID_TCP_MAX_SOCKS;
  braid__tcp_hello_encode(&m, pl);
  BT_CHECK(braid__tcp_hello_decode(pl, sizeof pl, 4, 0, &got, why, sizeof why) && strstr(why, "index"),
           "socket index %u accepted", m.index);
  uint8_t fb[BRAID_TCP_FAIL_MAX];
  size_t fl = braid__tcp_fail_encode(BRAID_ERR_TIMEOUT, 3, "rank 3 timed out\n\x01", fb);
  int st = 0, origin = -1;
  char text[BRAID_TCP_FAIL_TEXT + 1];
  BT_CHECK(braid__tcp_fail_decode(fb, fl, 4, &st, &origin, text, sizeof text, why, sizeof why) == 0, "fail: %s", why);
  BT_CHECK(st == BRAID_ERR_TIMEOUT && origin == 3 && !strcmp(text, "rank 3 timed out??"), "fail fields: %d %d %s", st,
           origin, text);
  BT_CHECK(braid__tcp_fail_decode(fb, fl, 3, &st, &origin, text, sizeof text, why, sizeof why) &&
               strstr(why, "origin rank 3"),
           "origin outside the world accepted");
  fb[0] = 0;
  BT_CHECK(braid__tcp_fail_decode(fb, fl, 4, &st, &origin, text, sizeof text, why, sizeof why) &&
               strstr(why, "status 0"),
           "status 0 accepted");
  char longtext[2000];
  memset(longtext, 'x', sizeof longtext - 1);
  longtext[sizeof longtext - 1] = 0;
  BT_CHECK(braid__tcp_fail_encode(BRAID_ERR_PEER_LOST, 0, longtext, fb) == BRAID_TCP_FAIL_MAX, "long sentence cut");
  /* The proof binds both nonces, the communicator and the roles. */
  uint8_t key[32] = {1, 2, 3}, n1[32] = {4}, n2[32] = {5}, a[32], b[32];
  BT_CHECK(!braid__tcp_mac(key, 32, 1, 9, 1, 0, 0, n1, n2, a) && !braid__tcp_mac(key, 32, 0, 9, 1, 0, 0, n1, n2, b),
           "mac");
  BT_CHECK(memcmp(a, b, 32), "server and client proofs are the same");
  BT_CHECK(!braid__tcp_mac(key, 32, 1, 10, 1, 0, 0, n1, n2, b) && memcmp(a, b, 32), "the comm id changes nothing");
  BT_CHECK(!braid__tcp_mac(key, 32, 1, 9, 1, 0, 0, n2, n1, b) && memcmp(a, b, 32), "the nonces' order changes nothing");
  /* Arbitrary bytes never crash the decoder and validation (ASan/UBSan). */
  unsigned long long rs = 42;
  for (int i = 0; i < (bt_quick() ? 20000 : 200000); i++) {
    uint8_t r[BRAID_TCP_HDR];
    for (int j = 0; j < BRAID_TCP_HDR; j += 8) {
      unsigned long long x = bt_rand(&rs);
      memcpy(r + j, &x, 8);
    }
    if (i & 1) memcpy(r, "BRDT\x01", 5); /* get past the first checks half the time */
    if (i & 2) r[5] = (uint8_t)(1 + i % 9);
    braid__tcp_hdr h;
    braid__tcp_hdr_decode(r, &h);
    braid__tcp_limits l2 = {h.comm, h.seq, ~0u, (uint64_t)bt_rand(&rs), 1 << 20};
    (void)braid__tcp_hdr_check(&h, &l2, why, sizeof why);
  }
  return 0;
}

/* A CTS goes ahead of the DATA frames not yet started on its socket (so a
   peer's message does not wait behind this rank's), behind every frame
   begun and every control or eager frame; the frames it passes take the
   next sequence numbers, so the stream stays in order. */
static tcp_frame *queued(tcp_state *s, tcp_conn *k, int type, size_t done) {
  tcp_frame *f = tcp_frame_new(s);
  if (!f) return NULL;
  braid__tcp_hdr h = tcp_hdr(7, type);
  h.msgid = (uint64_t)type * 100 + k->seq_out;
  tcp_enqueue(k, f, &h);
  f->done = done;
  return f;
}

static int queue_is(tcp_conn *k, const int *types, int n, uint64_t first_seq) {
  int i = 0;
  for (tcp_frame *f = k->qhead; f; f = f->next, i++) {
    braid__tcp_hdr h;
    braid__tcp_hdr_decode(f->hdr, &h);
    BT_CHECK(i < n, "queue longer than %d frames", n);
    BT_CHECK(f->type == types[i] && h.type == types[i], "frame %d has type %d (header %d), expected %d", i,
             f->type, h.type, types[i]);
    BT_CHECK(h.seq == first_seq + (uint64_t)i, "frame %d has seq %llu, expected %llu", i,
             (unsigned long long)h.seq, (unsigned long long)(first_seq + (uint64_t)i));
    if (!f->next) BT_CHECK(k->qtail == f, "the tail is not the last frame");
  }
  BT_CHECK(i == n, "queue has %d frames, expected %d", i, n);
  BT_CHECK(k->seq_out == first_seq + (uint64_t)n, "next seq %llu, expected %llu", (unsigned long long)k->seq_out,
           (unsigned long long)(first_seq + (uint64_t)n));
  return 0;
}

static int urgent(tcp_state *s, tcp_conn *k) {
  tcp_frame *f = tcp_frame_new(s);
  BT_CHECK(f, "out of memory");
  braid__tcp_hdr h = tcp_hdr(7, BRAID_TCP_CTS);
  h.msgid = 4242;
  tcp_enqueue_urgent(k, f, &h);
  return 0;
}

static int test_cts_first(void) {
  tcp_state s;
  tcp_conn k;
  memset(&s, 0, sizeof s);
  memset(&k, 0, sizeof k);
  enum { D = BRAID_TCP_DATA, E = BRAID_TCP_EAGER, R = BRAID_TCP_RTS, C = BRAID_TCP_CTS };
  k.seq_out = 5;
  /* half-written DATA, an RTS not started, two DATA not started */
  BT_CHECK(queued(&s, &k, D, 100) && queued(&s, &k, R, 0) && queued(&s, &k, D, 0) && queued(&s, &k, D, 0),
           "out of memory");
  if (urgent(&s, &k)) return 1;
  if (queue_is(&k, (const int[]){D, R, C, D, D}, 5, 5)) return 1;
  BT_CHECK(k.ndata == 3, "ndata %d, expected 3", k.ndata);
  /* the passed frames kept their content */
  braid__tcp_hdr h;
  braid__tcp_hdr_decode(k.qhead->next->next->next->hdr, &h);
  BT_CHECK(h.msgid == (uint64_t)D * 100 + 7, "a renumbered frame lost its msg id (%llu)", (unsigned long long)h.msgid);
  braid__tcp_hdr_decode(k.qhead->next->next->hdr, &h);
  BT_CHECK(h.msgid == 4242, "the CTS carries msg id %llu", (unsigned long long)h.msgid);
  /* a second CTS goes behind the first */
  if (urgent(&s, &k) || queue_is(&k, (const int[]){D, R, C, C, D, D}, 6, 5)) return 1;
  tcp_queue_clear(&s, &k);

  /* nothing to pass: appended */
  k.seq_out = 0;
  BT_CHECK(queued(&s, &k, E, 0) && queued(&s, &k, D, 3), "out of memory");
  if (urgent(&s, &k) || queue_is(&k, (const int[]){E, D, C}, 3, 0)) return 1;
  tcp_queue_clear(&s, &k);
  if (urgent(&s, &k) || queue_is(&k, (const int[]){C}, 1, 3)) return 1;
  tcp_queue_clear(&s, &k);

  /* a DATA frame not started at the head is passed too, and an eager frame
     behind it renumbered */
  k.seq_out = 9;
  BT_CHECK(queued(&s, &k, D, 0) && queued(&s, &k, E, 0), "out of memory");
  if (urgent(&s, &k) || queue_is(&k, (const int[]){C, D, E}, 3, 9)) return 1;
  tcp_queue_clear(&s, &k);
  tcp_frame *f;
  while ((f = s.free_frames)) {
    s.free_frames = f->next;
    free(f);
  }
  return 0;
}

/* Ranks of one host are told apart from the others by their published
   addresses (loopback, or the same address as this rank's): those get one
   socket and no limit on unsent bytes. */
static struct sockaddr_storage ip_of(const char *host, int port) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  struct addrinfo *res = NULL;
  if (braid__sock_resolve(host, port, 1, &res) == 0 && res) memcpy(&ss, res->ai_addr, res->ai_addrlen);
  if (res) freeaddrinfo(res);
  return ss;
}

/* The pool of unexpected payload buffers: a full pool makes room for a
   class in use from the other classes, so a burst of small messages does
   not leave later large ones to malloc and free each time. */
static int test_ubuf_pool(void) {
  tcp_state s;
  memset(&s, 0, sizeof s);
  s.ubuf_keep = (size_t)64 << 10;
  size_t cap;
  char *small[16];
  for (int i = 0; i < 16; i++) {
    small[i] = tcp_ubuf_get(&s, 4096, &cap);
    BT_CHECK(small[i] && cap == 4096, "a 4096-byte buffer of %zu bytes", cap);
  }
  for (int i = 0; i < 16; i++) tcp_ubuf_put(&s, small[i], 4096);
  BT_CHECK(s.ubuf_bytes == s.ubuf_keep, "the pool holds %zu bytes, expected %zu", s.ubuf_bytes, s.ubuf_keep);
  /* a 32 KiB buffer evicts eight small ones and is kept */
  char *big = tcp_ubuf_get(&s, 20000, &cap);
  BT_CHECK(big && cap == 32768, "a 20000-byte buffer of %zu bytes", cap);
  BT_CHECK(s.ubuf_bytes == s.ubuf_keep, "taking a new class changed the pool (%zu bytes)", s.ubuf_bytes);
  tcp_ubuf_put(&s, big, cap);
  BT_CHECK(s.ubuf[3] == big, "the 32 KiB buffer was not kept");
  BT_CHECK(s.ubuf_bytes == s.ubuf_keep, "the pool holds %zu bytes after the eviction", s.ubuf_bytes);
  int left = 0;
  for (char *q = s.ubuf[0]; q; memcpy(&q, q, sizeof q)) left++;
  BT_CHECK(left == 8, "%d small buffers left, expected 8", left);
  /* a buffer larger than the whole pool is not kept, and evicts nothing */
  char *huge = tcp_ubuf_get(&s, 100000, &cap);
  BT_CHECK(huge && cap == 131072, "a 100000-byte buffer of %zu bytes", cap);
  tcp_ubuf_put(&s, huge, cap);
  BT_CHECK(s.ubuf_bytes == s.ubuf_keep, "a buffer above the pool's size changed it (%zu bytes)", s.ubuf_bytes);
  tcp_ubuf_drain(&s);
  BT_CHECK(s.ubuf_bytes == 0, "drained pool holds %zu bytes", s.ubuf_bytes);
  return 0;
}

/* ---------------------------------------------------------------- congestion control */

/* A fresh TCP socket's congestion control: what the system gives. */
static void system_congestion(char *out, size_t len) {
  snprintf(out, len, "?");
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  (void)braid__sock_congestion(fd, out, len);
  close(fd);
}

/* The congestion control of this rank's socket to its right neighbour
   matches what arg says: "auto" (not a pacing one, bbr, on this host; else
   the system's), "system" (the system's) or a name. */
static int body_congestion(braid_comm *c, int rank, int n, void *arg) {
  const char *want = arg;
  /* Above the eager limit: the send completes only once the receiver's
     go-ahead came back, so its socket exists by then (a small send may
     still be queued in the core when braid_sync returns). */
  enum { N = 100000 };
  static float x[N], y[N];
  for (int i = 0; i < N; i++) x[i] = (float)(rank * N + i), y[i] = -1;
  const int from = (rank + n - 1) % n;
  BT_CHECK(braid_recv(c, y, N, BRAID_F32, from, 5) == BRAID_OK &&
               braid_send(c, x, N, BRAID_F32, (rank + 1) % n, 5) == BRAID_OK && braid_sync(c) == BRAID_OK,
           "ring exchange: %s", braid_last_error(c));
  for (int i = 0; i < N; i++)
    BT_CHECK(y[i] == (float)(from * N + i), "rank %d: element %d is %g", rank, i, (double)y[i]);
  tcp_state *s = c->be;
  tcp_conn *k = s->peers[(rank + 1) % n].out[0];
  BT_CHECK(k && k->fd >= 0, "rank %d has no socket to its neighbour after sending to it", rank);
  char cur[TCP_CC_LEN], sys[TCP_CC_LEN];
  BT_CHECK(braid__sock_congestion(k->fd, cur, sizeof cur) == 0, "TCP_CONGESTION: %s", strerror(errno));
  /* No rank leaves (closing its sockets) before every rank has looked. */
  BT_CHECK(braid_barrier(c) == BRAID_OK, "barrier: %s", braid_last_error(c));
  system_congestion(sys, sizeof sys);
  if (!strcmp(want, "auto")) {
    if (!strncmp(sys, "bbr", 3))
      BT_CHECK(!strcmp(cur, "cubic") || !strcmp(cur, "reno"), "auto with system %s on loopback: %s", sys, cur);
    else
      BT_CHECK(!strcmp(cur, sys), "auto with system %s on loopback changed it to %s", sys, cur);
  } else {
    BT_CHECK(!strcmp(cur, strcmp(want, "system") ? want : sys), "BRAID_TCP_CONGESTION=%s: the socket runs %s", want,
             cur);
  }
  return 0;
}

static int body_congestion_refused(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused, (void)rank, (void)n, (void)arg;
  braid_comm *c = NULL;
  BT_CHECK(braid_init(NULL, &c) == BRAID_ERR_INVALID_ARG, "init with BRAID_TCP_CONGESTION=no-such-cc succeeded");
  const char *e = braid_last_error(NULL);
  BT_CHECK(strstr(e, "BRAID_TCP_CONGESTION=\"no-such-cc\"") && strstr(e, "refused"), "sentence: %s", e);
  return 0;
}

static int test_congestion(void) {
  /* The rule alone: only a pacing algorithm on this host is replaced. */
  BT_CHECK(!strcmp(tcp_congestion_want(TCP_CC_AUTO, "", 1, "bbr"), "cubic"), "auto, local, bbr");
  BT_CHECK(!tcp_congestion_want(TCP_CC_AUTO, "", 0, "bbr"), "auto, another host, bbr");
  BT_CHECK(!tcp_congestion_want(TCP_CC_AUTO, "", 1, "cubic"), "auto, local, cubic");
  BT_CHECK(!tcp_congestion_want(TCP_CC_SYSTEM, "", 1, "bbr"), "system, local, bbr");
  BT_CHECK(!strcmp(tcp_congestion_want(TCP_CC_NAMED, "reno", 0, "bbr"), "reno"), "named, another host");
  BT_CHECK(!tcp_congestion_want(TCP_CC_NAMED, "reno", 1, "reno"), "named, already");
  /* On sockets: every kernel has reno and lets every process pick it. */
  const char *const reno[] = {"BRAID_TCP_CONGESTION=reno", NULL}, *const sys[] = {"BRAID_TCP_CONGESTION=system", NULL};
  if (run(2, body_congestion, "auto") || run_env(3, body_congestion, "reno", reno, -1, 60) ||
      run_env(2, body_congestion, "system", sys, -1, 60))
    return 1;
  const char *const bad[] = {"BRAID_TCP_CONGESTION=no-such-cc", NULL};
  bt_run_opts o = {"tcp", 2, 60, bad, -1};
  return bt_run_ranks_manual(&o, body_congestion_refused, NULL, NULL);
}

static int test_same_ip(void) {
  static const struct {
    const char *a, *b;
    int same;
  } cases[] = {
      {"127.0.0.1", "127.0.0.1", 1},  {"10.77.0.1", "10.77.0.1", 1}, {"10.77.0.1", "10.77.0.2", 0},
      {"10.77.0.1", "::ffff:10.77.0.1", 1}, {"::1", "::1", 1},       {"::1", "127.0.0.1", 0},
      {"fe80::1", "fe80::2", 0},      {"2001:db8::5", "2001:db8::5", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct sockaddr_storage a = ip_of(cases[i].a, 1000), b = ip_of(cases[i].b, 2000);
    BT_CHECK(a.ss_family && b.ss_family, "%s or %s did not parse", cases[i].a, cases[i].b);
    BT_CHECK(braid__sock_same_ip((struct sockaddr *)&a, (struct sockaddr *)&b) == cases[i].same &&
                 braid__sock_same_ip((struct sockaddr *)&b, (struct sockaddr *)&a) == cases[i].same,
             "%s and %s: same address should be %d", cases[i].a, cases[i].b, cases[i].same);
  }
  struct sockaddr_storage none;
  memset(&none, 0, sizeof none);
  struct sockaddr_storage lo = ip_of("127.0.0.1", 1);
  BT_CHECK(!braid__sock_same_ip((struct sockaddr *)&none, (struct sockaddr *)&none) &&
               !braid__sock_same_ip((struct sockaddr *)&lo, (struct sockaddr *)&none),
           "an address that did not parse equals nothing");
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  BT_CHECK(fd >= 0, "socket: %s", strerror(errno));
  BT_CHECK(braid__sock_set_notsent_lowat(fd, 0) == 0, "a limit of 0 must leave the socket as it is");
  int v = 0;
  socklen_t vl = sizeof v;
  BT_CHECK(braid__sock_set_notsent_lowat(fd, 65536) == 0 &&
               getsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, &vl) == 0 && v == 65536,
           "TCP_NOTSENT_LOWAT reads back %d (%s)", v, strerror(errno));
  close(fd);
  return 0;
}

/* The fuzz target's seeds through its driver: the valid streams pass whole,
   the broken ones stop where they break. */
static int test_fuzz_corpus(void) {
  const char *src = getenv("BRAID_TEST_SRCDIR");
  BT_CHECK(src, "BRAID_TEST_SRCDIR is not set (ctest sets it)");
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus_tcp_frame", src);
  DIR *d = opendir(dir);
  BT_CHECK(d, "cannot open %s", dir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    BT_CHECK(f, "cannot open %s", path);
    uint8_t buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    tfd_result r;
    tcp_frame_run(buf, len, &r);
    if (strstr(e->d_name, "truncated"))
      BT_CHECK(r.truncated && !r.refused, "%s: truncated %d refused %d", e->d_name, r.truncated, r.refused);
    else if (strstr(e->d_name, "absurd") || strstr(e->d_name, "wrong"))
      BT_CHECK(r.refused && !r.frames, "%s: refused %d after %d frames", e->d_name, r.refused, r.frames);
    else
      BT_CHECK(!r.refused && !r.truncated && r.frames >= 2, "%s: %d frames, refused %d (%s), truncated %d", e->d_name,
               r.frames, r.refused, r.why, r.truncated);
    n++;
  }
  closedir(d);
  BT_CHECK(n >= 6, "only %d seeds in %s", n, dir);
  return 0;
}

/* ---------------------------------------------------------------- collectives */

static int test_coll_small(void) {
  static const size_t counts[] = {0, 1, 7, 1000};
  matrix m = {counts, 4, 1, 0};
  static const int sizes[] = {1, 2, 3, 5, 8};
  for (size_t i = 0; i < BT_COUNT(sizes); i++) {
    if (bt_quick() && sizes[i] > 3) continue;
    if (run(sizes[i], bt_coll_matrix_body, &m)) return 1;
  }
  return 0;
}

/* Every world size up to 16 (4 to 16 ranks share these 2 cores). */
static int test_coll_sizes(void) {
  static const size_t counts[] = {1, 33, 5000};
  matrix m = {counts, 3, 0, 0};
  for (int n = 1; n <= 16; n++) {
    if (bt_quick() && n != 4 && n != 7 && n != 16) continue;
    if (run(n, bt_coll_matrix_body, &m)) {
      fprintf(stderr, "tcp collectives failed on %d ranks\n", n);
      return 1;
    }
  }
  return 0;
}

/* Rendezvous messages striped over the sockets of a peer, with the default
   eager bound and a small one (every ring chunk then goes by rendezvous). */
static int test_coll_large(void) {
  static const size_t counts[] = {70001, 1000003};
  static const size_t qcounts[] = {70001, 200003};
  matrix m = {bt_quick() ? qcounts : counts, 2, 0, 0};
  static const char *const small[] = {"BRAID_TCP_EAGER_MAX=16K", NULL};
  static const int sizes[] = {2, 3, 4};
  for (size_t i = 0; i < BT_COUNT(sizes); i++) {
    if (bt_quick() && sizes[i] == 4) continue;
    if (run(sizes[i], bt_coll_matrix_body, &m)) return 1;
  }
  return run_env(3, bt_coll_matrix_body, &m, small, -1, 300);
}

static int body_split(braid_comm *c, int rank, int n, void *arg) {
  const matrix *m = arg;
  for (int pattern = 0; pattern < 2; pattern++) {
    uint32_t color = pattern == 0 ? (uint32_t)(rank % 2) : rank == 0 ? BRAID_SPLIT_NONE : 7u;
    braid_comm *child = NULL;
    BT_CHECK_OK(braid_split(c, color, (uint32_t)(n - rank), &child), c);
    if (color == BRAID_SPLIT_NONE) {
      BT_CHECK(child == NULL, "BRAID_SPLIT_NONE gave a communicator");
    } else {
      BT_CHECK(child != NULL, "no child");
      int cn = braid_world_size(child), cr = braid_rank(child);
      if (bt_coll_matrix_body(child, cr, cn, (void *)m)) return 1;
      /* The same tag on child and parent stays apart. */
      int right = (cr + 1) % cn, left = (cr + cn - 1) % cn, got = -1;
      BT_CHECK_OK(braid_send(child, &cr, 1, BRAID_I32, right, 1), child);
      BT_CHECK_OK(braid_recv(child, &got, 1, BRAID_I32, left, 1), child);
      BT_CHECK_OK(braid_sync(child), child);
      BT_CHECK(got == left, "child p2p got %d", got);
    }
    int gotp = -1;
    BT_CHECK_OK(braid_send(c, &rank, 1, BRAID_I32, (rank + 1) % n, 1), c);
    BT_CHECK_OK(braid_recv(c, &gotp, 1, BRAID_I32, (rank + n - 1) % n, 1), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(gotp == (rank + n - 1) % n, "parent p2p got %d", gotp);
    if (child) BT_CHECK_OK(braid_destroy(child), NULL);
    BT_CHECK_OK(braid_barrier(c), c);
  }
  return 0;
}

static int test_split(void) {
  static const size_t counts[] = {1, 7, 70001};
  matrix m = {counts, 3, 0, 0};
  static const int sizes[] = {2, 3, 5};
  for (size_t i = 0; i < BT_COUNT(sizes); i++)
    if (run(sizes[i], body_split, &m)) return 1;
  return 0;
}

/* ---------------------------------------------------------------- point to point */

static unsigned char pattern_byte(int from, int msg, size_t i) {
  return (unsigned char)(from * 131 + msg * 17 + i * 7);
}

/* Ring exchange of 1 byte and of 64 MiB (striped over the peer's sockets). */
static int body_ring(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  size_t sizes[] = {1, bt_quick() ? (size_t)8 << 20 : (size_t)64 << 20};
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  for (size_t si = 0; si < BT_COUNT(sizes); si++) {
    size_t bytes = sizes[si];
    unsigned char *s = malloc(bytes), *r = malloc(bytes);
    BT_CHECK(s && r, "oom");
    for (size_t i = 0; i < bytes; i++) s[i] = pattern_byte(rank, (int)si, i);
    memset(r, 0, bytes);
    double t0 = now_s();
    BT_CHECK_OK(braid_recv(c, r, bytes, BRAID_U8, left, 4), c);
    BT_CHECK_OK(braid_send(c, s, bytes, BRAID_U8, right, 4), c);
    BT_CHECK_OK(braid_sync(c), c);
    double dt = now_s() - t0;
    for (size_t i = 0; i < bytes; i++)
      BT_CHECK(r[i] == pattern_byte(left, (int)si, i), "%zu bytes: byte %zu from rank %d wrong", bytes, i, left);
    if (rank == 0 && bytes > 1)
      printf("  ring of %d ranks, %zu MiB each way: %.3f s (%.2f GB/s per rank)\n", n, bytes >> 20, dt,
             (double)bytes / dt / 1e9);
    free(s);
    free(r);
    BT_CHECK_OK(braid_barrier(c), c);
  }
  return 0;
}

static int test_p2p_ring(void) {
  static const char *const one[] = {"BRAID_TCP_NSOCKS=1", NULL};
  static const char *const four[] = {"BRAID_TCP_NSOCKS=4", NULL};
  return run(2, body_ring, NULL) || run(3, body_ring, NULL) || run_env(2, body_ring, NULL, one, -1, 120) ||
         run_env(3, body_ring, NULL, four, -1, 120);
}

/* Many messages on one tag, eager and rendezvous mixed, arrive in posting
   order: sent before their receives (unexpected) and after (posted first),
   both ways at once; then unexpected again, into buffers kept from the
   first round (sizes on both sides of their power-of-two classes). */
#define NMSG 60
static size_t msg_size(int i) {
  static const size_t edge[] = {4095, 4096, 4097, 8191, 8192, 8193, 16384};
  if (i % 3 == 0) return 40000 + (size_t)i * 1000;
  if (i % 3 == 1 && i % 2 == 0) return edge[(size_t)(i / 6) % (sizeof edge / sizeof edge[0])];
  return (size_t)(i * 37) % 5000 + 1;
}

static int body_ordered(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  int peer = 1 - rank;
  unsigned char *s[NMSG], *r[NMSG];
  for (int i = 0; i < NMSG; i++) {
    s[i] = malloc(msg_size(i));
    r[i] = calloc(1, msg_size(i));
    BT_CHECK(s[i] && r[i], "oom");
    for (size_t j = 0; j < msg_size(i); j++) s[i][j] = pattern_byte(rank, i, j);
  }
  for (int phase = 0; phase < 3; phase++) {
    if (phase != 1) {
      /* Senders first: everything is unexpected when the receives come. */
      for (int i = 0; i < NMSG; i++) BT_CHECK_OK(braid_send(c, s[i], msg_size(i), BRAID_U8, peer, 3), c);
      usleep(50000);
      for (int i = 0; i < NMSG; i++) BT_CHECK_OK(braid_recv(c, r[i], msg_size(i), BRAID_U8, peer, 3), c);
    } else {
      for (int i = 0; i < NMSG; i++) BT_CHECK_OK(braid_recv(c, r[i], msg_size(i), BRAID_U8, peer, 3), c);
      usleep(50000);
      for (int i = 0; i < NMSG; i++) BT_CHECK_OK(braid_send(c, s[i], msg_size(i), BRAID_U8, peer, 3), c);
    }
    BT_CHECK_OK(braid_sync(c), c);
    for (int i = 0; i < NMSG; i++) {
      for (size_t j = 0; j < msg_size(i); j++)
        BT_CHECK(r[i][j] == pattern_byte(peer, i, j), "phase %d: message %d (%zu bytes) byte %zu out of order or wrong",
                 phase, i, msg_size(i), j);
      memset(r[i], 0, msg_size(i));
    }
    BT_CHECK_OK(braid_barrier(c), c);
  }
  for (int i = 0; i < NMSG; i++) {
    free(s[i]);
    free(r[i]);
  }
  return 0;
}

/* The large messages go as rendezvous (DATA frames) with a 16 KiB eager
   limit and as EAGER frames with the default one; from 64 KiB either kind
   switches the reader to reading headers in 1 KiB pieces, and the small
   frames behind switch it back. */
static int test_p2p_ordered(void) {
  static const char *const small[] = {"BRAID_TCP_EAGER_MAX=16K", NULL};
  static const char *const one[] = {"BRAID_TCP_EAGER_MAX=16K", "BRAID_TCP_NSOCKS=1", NULL};
  return run_env(2, body_ordered, NULL, small, -1, 120) || run_env(2, body_ordered, NULL, one, -1, 120) ||
         run_env(2, body_ordered, NULL, NULL, -1, 120);
}

/* The same sentences as on shm (test_shm's p2p_mismatch). */
/* A wrong-shaped receive of a message that already sits in the socket fails
   at once, as when the message had been read before. */
static int body_mismatch_waiting(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  (void)n;
  double v[3] = {1, 2, 3}, r[3] = {0};
  if (rank == 0) {
    BT_CHECK_OK(braid_send(c, v, 3, BRAID_F64, 1, 5), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK_OK(braid_barrier(c), c);
  } else {
    BT_CHECK_OK(braid_barrier(c), c); /* the message was written before rank 0 entered it */
    BT_CHECK_ST(braid_recv(c, r, 2, BRAID_F64, 0, 5), BRAID_ERR_MISMATCH, c);
    BT_CHECK_MSG(c, "tag 5");
    BT_CHECK_OK(braid_recv(c, r, 3, BRAID_F64, 0, 5), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(r[0] == 1 && r[2] == 3, "message intact after the mismatch");
  }
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

static int test_p2p_mismatch(void) {
  size_t small = 3, large = 200000;
  /* A send above 1 MiB waits for its receive (rendezvous) before braid_sync returns. */
  bt_p2p_mismatch_arg s = {small, 1u << 20}, l = {large, 1u << 20};
  return run(2, bt_body_p2p_mismatch, &s) || run(2, bt_body_p2p_mismatch, &l) || run(2, body_mismatch_waiting, NULL);
}

/* Messages to this rank itself, eager and large, before and after the receive. */
static int body_self(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  size_t big = 3u << 20;
  unsigned char *s = malloc(big), *r = calloc(1, big);
  BT_CHECK(s && r, "oom");
  for (size_t i = 0; i < big; i++) s[i] = pattern_byte(rank, 1, i);
  int x = 41, y = 0;
  BT_CHECK_OK(braid_send(c, &x, 1, BRAID_I32, rank, 2), c);
  BT_CHECK_OK(braid_recv(c, &y, 1, BRAID_I32, rank, 2), c);
  BT_CHECK_OK(braid_recv(c, r, big, BRAID_U8, rank, 3), c);
  BT_CHECK_OK(braid_send(c, s, big, BRAID_U8, rank, 3), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(y == 41 && !memcmp(s, r, big), "self messages wrong");
  free(s);
  free(r);
  return 0;
}

static int test_p2p_self(void) { return run(1, body_self, NULL) || run(2, body_self, NULL); }

/* ---------------------------------------------------------------- failures */

typedef struct kill_case {
  int what; /* 0 all-reduce, 1 broadcast, 2 recv */
  int victim;
} kill_case;

static int body_kill(braid_comm *c, int rank, int n, void *arg) {
  const kill_case *k = arg;
  size_t cnt = 1 << 18;
  float *buf = calloc(cnt, 4);
  BT_CHECK(buf != NULL, "oom");
  for (int it = 0;; it++) {
    if (rank == k->victim && it == 3) raise(SIGKILL);
    double t0 = now_s();
    braid_status st;
    if (k->what == 0) {
      st = braid_all_reduce(c, buf, it % 2 ? cnt : 3, BRAID_F32, BRAID_SUM);
    } else if (k->what == 1) {
      st = braid_broadcast(c, buf, it % 2 ? cnt : 3, BRAID_F32, (it + 1) % n);
    } else {
      st = braid_recv(c, buf + cnt / 2, cnt / 2, BRAID_F32, (rank + n - 1) % n, 3);
      if (!st) st = braid_send(c, buf, cnt / 2, BRAID_F32, (rank + 1) % n, 3);
      if (!st) st = braid_sync(c);
    }
    double dt = now_s() - t0;
    if (st == BRAID_OK) {
      /* A broadcast waits only for the ranks above it in the tree, so it may
         succeed until the victim's turn as root; the ring exchange needs
         the neighbours, so it fails by its second round. */
      int last_ok = k->what == 1 ? 3 + (k->victim + 2 * n - 4) % n - 1 : k->what == 2 ? 4 : 2;
      BT_CHECK(it <= last_ok, "rank %d: iteration %d succeeded after the victim died", rank, it);
      continue;
    }
    BT_CHECK(st == BRAID_ERR_PEER_LOST, "rank %d: got %s, expected PEER_LOST: %s", rank, braid_status_string(st),
             braid_last_error(c));
    char want[64];
    snprintf(want, sizeof want, "rank %d", k->victim);
    BT_CHECK_MSG(c, want);
    BT_CHECK(dt < 5.0, "noticed after %.2f s", dt);
    BT_CHECK_ST(braid_barrier(c), BRAID_ERR_PEER_LOST, c);
    break;
  }
  free(buf);
  return 0;
}

static int test_kill_peer(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=100", NULL};
  for (int what = 0; what < 3; what++) {
    kill_case k = {what, what == 2 ? 1 : 2};
    if (run_env(4, body_kill, &k, env, k.victim, 60)) {
      fprintf(stderr, "kill test %d failed\n", what);
      return 1;
    }
  }
  return 0;
}

/* A stopped peer (SIGSTOP) says nothing and closes nothing: the wait ends
   with BRAID_ERR_TIMEOUT after BRAID_TIMEOUT without progress. */
static int body_stopped(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  int32_t pids[2] = {0}, me = (int32_t)getpid();
  BT_CHECK(n == 2, "two ranks");
  BT_CHECK_OK(braid_all_gather(c, &me, pids, 1, BRAID_I32), c);
  if (rank == 1) {
    raise(SIGSTOP);
    braid_status st = braid_barrier(c);
    BT_CHECK(st == BRAID_ERR_PEER_LOST || st == BRAID_ERR_TIMEOUT, "after SIGCONT: %s", braid_status_string(st));
    return 0;
  }
  usleep(100000);
  int x = 0;
  double t0 = now_s();
  BT_CHECK_OK(braid_recv(c, &x, 1, BRAID_I32, 1, 77), c);
  braid_status st = braid_sync(c);
  double dt = now_s() - t0;
  kill(pids[1], SIGCONT);
  BT_CHECK(st == BRAID_ERR_TIMEOUT, "got %s: %s", braid_status_string(st), braid_last_error(c));
  BT_CHECK_MSG(c, "rank 1");
  BT_CHECK_MSG(c, "tag 77");
  BT_CHECK(dt >= 0.9 && dt < 3.0, "timed out after %.2f s with BRAID_TIMEOUT=1", dt);
  return 0;
}

static int test_stopped_peer(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=1", NULL};
  return run_env(2, body_stopped, NULL, env, -1, 60);
}

/* ---------------------------------------------------------------- leaving */

/* A rank that destroys its communicator right after its last exchange
   leaves cleanly for a peer still inside a call: mostly rank 1's
   rendezvous send to rank 0 opens a second socket that rank 0 may leave
   before its handshake ends; every fourth round rank 0's last data to
   rank 1 still fills small socket buffers when it leaves. Rank 1 then
   waits for rank 2, which sends late. */
static int body_leave(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  size_t big = (size_t)2 << 20;
  char *buf = calloc(big, 1);
  BT_CHECK(buf != NULL, "oom");
  for (int round = 0; round < 32; round++) {
    braid_comm *k = NULL;
    BT_CHECK_OK(braid_split(c, 0, 0, &k), c);
    size_t len = round % 4 ? 20000 : big;
    int from = round % 4 ? 1 : 0, to = 1 - from;
    if (rank == to) {
      BT_CHECK_OK(braid_recv(k, buf, len, BRAID_U8, from, 1), k);
      BT_CHECK_OK(braid_sync(k), k);
    }
    if (rank == from) {
      memset(buf, round, len);
      BT_CHECK_OK(braid_send(k, buf, len, BRAID_U8, to, 1), k);
      BT_CHECK_OK(braid_sync(k), k);
    }
    if (rank == 1) {
      int32_t x = 0;
      BT_CHECK_OK(braid_recv(k, &x, 1, BRAID_I32, 2, 2), k);
      BT_CHECK_OK(braid_sync(k), k);
      BT_CHECK(x == round, "round %d: got %d from rank 2", round, x);
      if (rank == to)
        for (size_t i = 0; i < len; i += 4093) BT_CHECK(buf[i] == (char)round, "round %d: byte %zu", round, i);
    }
    if (rank == 2) {
      usleep(20000);
      int32_t x = round;
      BT_CHECK_OK(braid_send(k, &x, 1, BRAID_I32, 1, 2), k);
      BT_CHECK_OK(braid_sync(k), k);
    }
    BT_CHECK_OK(braid_destroy(k), NULL);
  }
  free(buf);
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

/* Rank 0 leaves with sends rank 1 has not read yet: destroy abandons them
   after BRAID_DESTROY_TIMEOUT, finishes the frame it was writing (within
   as long again), drops the rest and says goodbye in sequence, so rank 1,
   reading late, learns that rank 0 left rather than that it vanished. */
static int body_leave_abandoned(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  _Atomic int *leaving = arg;
  static char buf[64 << 10];
  char x = 1;
  if (rank == 0) {
    BT_CHECK_OK(braid_send(c, &x, 1, BRAID_U8, 1, 4), c); /* the socket to rank 1 is up */
    BT_CHECK_OK(braid_sync(c), c);
    for (int i = 0; i < 64; i++) BT_CHECK_OK(braid_send(c, buf, sizeof buf, BRAID_U8, 1, 5), c);
    atomic_store(leaving, 1);
    return 0; /* the harness destroys the communicator */
  }
  BT_CHECK_OK(braid_recv(c, &x, 1, BRAID_U8, 0, 4), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(bt_await(leaving, 1, 60), "rank 0 never got to braid_destroy");
  /* Past rank 0's destroy timeout (2 s) from its start, well within twice it. */
  usleep(2500000);
  braid_status st = braid_recv(c, &x, 1, BRAID_U8, 0, 6);
  if (st == BRAID_OK) st = braid_sync(c);
  BT_CHECK(st == BRAID_ERR_PEER_LOST, "got %s: %s", braid_status_string(st), braid_last_error(c));
  BT_CHECK_MSG(c, "destroyed its communicator");
  return 0;
}

static int test_leave(void) {
  static const char *const env[] = {"BRAID_TCP_EAGER_MAX=16K", "BRAID_TCP_BUFFER=16K", "BRAID_TIMEOUT=30", NULL};
  static const char *const abandon[] = {"BRAID_TCP_EAGER_MAX=64K", "BRAID_TCP_BUFFER=16K", "BRAID_DESTROY_TIMEOUT=2",
                                        "BRAID_TIMEOUT=30", NULL};
  if (run_env(3, body_leave, NULL, env, -1, 120)) return 1;
  _Atomic int *leaving = bt_shared_counter();
  BT_CHECK(leaving != NULL, "no shared mapping");
  int rc = run_env(2, body_leave_abandoned, (void *)leaving, abandon, -1, 60);
  bt_shared_free(leaving);
  return rc;
}

/* ---------------------------------------------------------------- strangers */

static int dial(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int write_all(int fd, const void *p, size_t len) {
  const char *b = p;
  while (len) {
    ssize_t w = send(fd, b, len, MSG_NOSIGNAL);
    if (w <= 0) return -1;
    b += w;
    len -= (size_t)w;
  }
  return 0;
}

/* 1 when the other end closed fd within secs (what it sent first is skipped). */
static int poll_ms(double end) {
  double left = end - now_s();
  return left <= 0 ? 0 : left > 0.1 ? 100 : (int)(left * 1000) + 1;
}

static int closed_by_peer(int fd, double secs) {
  double end = now_s() + secs;
  char buf[512];
  while (now_s() < end) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, poll_ms(end)) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return 1;
  }
  return 0;
}

static int read_full(int fd, void *p, size_t len, double secs) {
  char *b = p;
  double end = now_s() + secs;
  while (len && now_s() < end) {
    struct pollfd q = {fd, POLLIN, 0};
    if (poll(&q, 1, poll_ms(end)) <= 0) continue;
    ssize_t n = recv(fd, b, len, 0);
    if (n <= 0) return -1;
    b += n;
    len -= (size_t)n;
  }
  return len ? -1 : 0;
}

static int body_strangers(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  (void)arg;
  int32_t port = rank == 0 ? braid__tcp_test_listener(c, NULL, 0) : 0;
  BT_CHECK_OK(braid_broadcast(c, &port, 1, BRAID_I32, 0), c);
  BT_CHECK(port > 0, "rank 0 has no listener");
  int32_t done = 0;
  if (rank == 0) {
    /* Waiting here, rank 0 accepts and refuses the strangers. */
    BT_CHECK_OK(braid_recv(c, &done, 1, BRAID_I32, 1, 99), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(done == 1, "done %d", done);
  } else {
    uint8_t b[BRAID_TCP_HDR + BRAID_TCP_ACK_LEN];
    /* Garbage. */
    int g = dial(port);
    BT_CHECK(g >= 0, "connect");
    unsigned long long rs = 7;
    uint8_t junk[300];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)bt_rand(&rs);
    BT_CHECK(write_all(g, junk, sizeof junk) == 0, "write");
    /* A valid magic with an absurd length. */
    int a = dial(port);
    BT_CHECK(a >= 0, "connect");
    braid__tcp_hdr h = tcp_hdr(c->id, BRAID_TCP_HELLO);
    h.len = 1ull << 60;
    braid__tcp_hdr_encode(&h, b);
    BT_CHECK(write_all(a, b, BRAID_TCP_HDR) == 0, "write");
    /* A whole handshake with the wrong token. */
    int w = dial(port);
    BT_CHECK(w >= 0, "connect");
    braid__tcp_hello m = {1, 0, 9, 0, {0}};
    for (int i = 0; i < BRAID_TCP_NONCE; i++) m.nonce[i] = (uint8_t)(i + 1);
    h = tcp_hdr(c->id, BRAID_TCP_HELLO);
    h.len = BRAID_TCP_HELLO_LEN;
    braid__tcp_hdr_encode(&h, b);
    braid__tcp_hello_encode(&m, b + BRAID_TCP_HDR);
    BT_CHECK(write_all(w, b, BRAID_TCP_HDR + BRAID_TCP_HELLO_LEN) == 0, "write");
    BT_CHECK(read_full(w, b, BRAID_TCP_HDR + BRAID_TCP_ACK_LEN, 5) == 0, "no HELLO_ACK for a well-formed HELLO");
    /* The acceptor proved the job token (the one the harness gave every rank). */
    uint8_t tok[32], mac[32];
    BT_CHECK(braid__token_parse(getenv("BRAID_TOKEN"), tok) == 0, "BRAID_TOKEN");
    BT_CHECK(!braid__tcp_mac(tok, 32, 1, c->id, 1, 0, 9, m.nonce, b + BRAID_TCP_HDR, mac), "mac");
    BT_CHECK(!memcmp(mac, b + BRAID_TCP_HDR + BRAID_TCP_NONCE, 32), "the acceptor's proof does not check out");
    uint8_t wrong[32];
    memset(wrong, 0x42, sizeof wrong);
    BT_CHECK(!braid__tcp_mac(wrong, 32, 0, c->id, 1, 0, 9, m.nonce, b + BRAID_TCP_HDR, mac), "mac");
    h = tcp_hdr(c->id, BRAID_TCP_AUTH);
    h.len = BRAID_TCP_AUTH_LEN;
    h.seq = 1;
    braid__tcp_hdr_encode(&h, b);
    memcpy(b + BRAID_TCP_HDR, mac, 32);
    BT_CHECK(write_all(w, b, BRAID_TCP_HDR + BRAID_TCP_AUTH_LEN) == 0, "write");
    BT_CHECK(closed_by_peer(g, 5), "the garbage connection was not closed");
    BT_CHECK(closed_by_peer(a, 5), "the absurd length was not refused");
    BT_CHECK(closed_by_peer(w, 5), "the wrong token was not refused");
    close(g);
    close(a);
    close(w);
    /* A crowd that never speaks: past the bound, the oldest are closed. */
    int crowd[TCP_MAX_UNAUTH + 8], shut = 0;
    for (int i = 0; i < TCP_MAX_UNAUTH + 8; i++) {
      crowd[i] = dial(port);
      BT_CHECK(crowd[i] >= 0, "connect %d", i);
    }
    for (int i = 0; i < 8; i++) shut += closed_by_peer(crowd[i], 3);
    BT_CHECK(shut == 8, "only %d of the 8 oldest of %d silent connections were closed", shut, TCP_MAX_UNAUTH + 8);
    /* This rank's first socket to rank 0 gets in past the crowd. */
    done = 1;
    BT_CHECK_OK(braid_send(c, &done, 1, BRAID_I32, 0, 99), c);
    BT_CHECK_OK(braid_sync(c), c);
    for (int i = 0; i < TCP_MAX_UNAUTH + 8; i++) close(crowd[i]);
  }
  /* The job goes on. */
  float v[1000];
  for (int i = 0; i < 1000; i++) v[i] = (float)(rank + i);
  BT_CHECK_OK(braid_all_reduce(c, v, 1000, BRAID_F32, BRAID_SUM), c);
  for (int i = 0; i < 1000; i++) BT_CHECK(v[i] == (float)(1 + 2 * i), "sum after the strangers, element %d", i);
  return 0;
}

static int test_strangers(void) { return run(2, body_strangers, NULL); }

/* An authenticated peer that sends a corrupt frame fails the communicator,
   with a sentence naming it and the field. */
typedef struct corrupt_case {
  const char *name;
  int kind; /* 0 dt, 1 len, 2 type, 3 DATA of an unknown message, 4 seq, 5 comm id */
  const char *want;
} corrupt_case;

static int body_corrupt(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  const corrupt_case *k = arg;
  int32_t x = 0;
  BT_CHECK_OK(braid_all_reduce(c, &x, 1, BRAID_I32, BRAID_SUM), c); /* sockets both ways */
  if (rank == 0) {
    char v[4];
    BT_CHECK_OK(braid_recv(c, v, 4, BRAID_U8, 1, 7), c);
    BT_CHECK_OK(braid_send(c, &x, 1, BRAID_I32, 1, 8), c); /* the frame comes once rank 0 waits for it */
    braid_status st = braid_sync(c);
    BT_CHECK(st == BRAID_ERR_PEER_LOST, "%s: got %s: %s", k->name, braid_status_string(st), braid_last_error(c));
    BT_CHECK_MSG(c, "rank 1 (");
    BT_CHECK_MSG(c, "sent a corrupt frame");
    BT_CHECK_MSG(c, k->want);
    return 0;
  }
  uint8_t b[BRAID_TCP_HDR + 100];
  memset(b, 'z', sizeof b);
  braid__tcp_hdr h = tcp_hdr(c->id, BRAID_TCP_EAGER);
  h.tag = 7;
  h.count = 4;
  h.dt = BRAID_U8;
  h.len = 4;
  int patch = 1;
  switch (k->kind) {
  case 0: h.dt = 99; break;
  case 1: h.len = 5; break;
  case 2: h.type = 77; break;
  case 3:
    h = tcp_hdr(c->id, BRAID_TCP_DATA);
    h.msgid = 12345;
    h.len = 100;
    break;
  case 4:
    h.seq = 999;
    patch = 0;
    break;
  case 5:
    h.comm = c->id + 1;
    patch = 0;
    break;
  }
  braid__tcp_hdr_encode(&h, b);
  BT_CHECK_OK(braid_recv(c, &x, 1, BRAID_I32, 0, 8), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK_OK(braid__tcp_test_raw(c, 0, b, BRAID_TCP_HDR + (size_t)h.len % 100, patch), c);
  /* Rank 0 fails and tells this rank. */
  braid_status st = braid_barrier(c);
  BT_CHECK(st == BRAID_ERR_PEER_LOST, "%s: rank 1 got %s: %s", k->name, braid_status_string(st), braid_last_error(c));
  return 0;
}

static int test_corrupt_frame(void) {
  static const corrupt_case cases[] = {
      {"dt", 0, "dt 99"},    {"len", 1, "len 5"},       {"type", 2, "type 77"}, {"unknown message", 3, "msg id 12345"},
      {"seq", 4, "seq 999"}, {"comm id", 5, "comm id"},
  };
  static const char *const env[] = {"BRAID_TIMEOUT=20", NULL};
  for (size_t i = 0; i < BT_COUNT(cases); i++)
    if (run_env(2, body_corrupt, (void *)&cases[i], env, -1, 60)) {
      fprintf(stderr, "corrupt frame case \"%s\" failed\n", cases[i].name);
      return 1;
    }
  return 0;
}

/* An authenticated peer's own socket to rank 0 (index idx of rank 1's set),
   handshake done with the communicator's key; -1 on failure. */
static int hostile_conn(braid_comm *c, int idx) {
  tcp_state *s = c->be;
  tcp_peer *p = &s->peers[0];
  int fd = socket(p->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&p->sa, p->salen) != 0) return -1;
  braid__tcp_hello m = {1, 0, (uint32_t)idx, 0, {0}};
  for (int i = 0; i < BRAID_TCP_NONCE; i++) m.nonce[i] = (uint8_t)(i * 7 + idx);
  uint8_t b[BRAID_TCP_HDR + BRAID_TCP_HELLO_LEN + BRAID_TCP_ACK_LEN];
  braid__tcp_hdr h = tcp_hdr(c->id, BRAID_TCP_HELLO);
  h.len = BRAID_TCP_HELLO_LEN;
  braid__tcp_hdr_encode(&h, b);
  braid__tcp_hello_encode(&m, b + BRAID_TCP_HDR);
  if (write_all(fd, b, BRAID_TCP_HDR + BRAID_TCP_HELLO_LEN) || read_full(fd, b, BRAID_TCP_HDR + BRAID_TCP_ACK_LEN, 5))
    return -1;
  uint8_t mac[32];
  if (braid__tcp_mac(s->key, TCP_KEY_LEN, 0, c->id, 1, 0, (uint32_t)idx, m.nonce, b + BRAID_TCP_HDR, mac)) return -1;
  h = tcp_hdr(c->id, BRAID_TCP_AUTH);
  h.seq = 1;
  h.len = BRAID_TCP_AUTH_LEN;
  braid__tcp_hdr_encode(&h, b);
  memcpy(b + BRAID_TCP_HDR, mac, 32);
  return write_all(fd, b, BRAID_TCP_HDR + BRAID_TCP_AUTH_LEN) ? -1 : fd;
}

static int send_frame(int fd, braid__tcp_hdr *h, const void *payload, size_t len) {
  uint8_t b[BRAID_TCP_HDR];
  braid__tcp_hdr_encode(h, b);
  return write_all(fd, b, sizeof b) || (len && write_all(fd, payload, len));
}

/* DATA frames of a rendezvous message that its sender would never cut that
   way: a piece twice (which would once complete the receive with a piece
   never written, or write into the buffer after the receive had returned),
   a piece that starts off the pieces' grid, a piece cut short. The receive
   fails naming the frame, and its buffer is not written once it returned. */
typedef struct data_case {
  const char *name;
  uint64_t off[2], len[2]; /* two DATA frames */
  const char *want;
} data_case;

#define HOSTILE_BYTES (2 * TCP_CHUNK + 100)

static int body_hostile_data(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  const data_case *k = arg;
  int32_t x = 0;
  BT_CHECK_OK(braid_all_reduce(c, &x, 1, BRAID_I32, BRAID_SUM), c);
  if (rank == 0) {
    unsigned char *buf = malloc(HOSTILE_BYTES), *seen = malloc(HOSTILE_BYTES);
    BT_CHECK(buf && seen, "out of memory");
    memset(buf, 0x11, HOSTILE_BYTES);
    BT_CHECK_OK(braid_recv(c, buf, HOSTILE_BYTES, BRAID_U8, 1, 5), c);
    braid_status st = braid_sync(c);
    BT_CHECK(st == BRAID_ERR_PEER_LOST, "%s: got %s: %s", k->name, braid_status_string(st), braid_last_error(c));
    BT_CHECK_MSG(c, "rank 1 (");
    BT_CHECK_MSG(c, "sent a corrupt frame");
    BT_CHECK_MSG(c, k->want);
    memcpy(seen, buf, HOSTILE_BYTES);
    usleep(300000); /* rank 1 writes on */
    BT_CHECK(!memcmp(seen, buf, HOSTILE_BYTES), "%s: the buffer changed after the receive returned", k->name);
    free(buf);
    free(seen);
    return 0;
  }
  int fd = hostile_conn(c, 1);
  BT_CHECK(fd >= 0, "could not join rank 0 as rank 1's socket 1");
  braid__tcp_hdr h = tcp_hdr(c->id, BRAID_TCP_RTS);
  h.seq = 2;
  h.tag = 5;
  h.count = HOSTILE_BYTES;
  h.dt = BRAID_U8;
  h.msgid = 777;
  BT_CHECK(!send_frame(fd, &h, NULL, 0), "RTS");
  static char z[TCP_CHUNK];
  memset(z, 'z', sizeof z);
  for (int i = 0; i < 2; i++) {
    h = tcp_hdr(c->id, BRAID_TCP_DATA);
    h.seq = 3 + (uint64_t)i;
    h.msgid = 777;
    h.offset = k->off[i];
    h.len = k->len[i];
    if (send_frame(fd, &h, z, k->len[i])) break; /* rank 0 may have closed it already */
  }
  BT_CHECK(closed_by_peer(fd, 10), "%s: rank 0 kept the socket open", k->name);
  close(fd);
  _exit(0); /* its own communicator would read rank 0's go-ahead for a message it never sent */
}

static int test_hostile_data(void) {
  static const data_case cases[] = {
      {"a piece twice", {0, 0}, {TCP_CHUNK, TCP_CHUNK}, "offset 0 again"},
      {"the last piece twice", {2 * TCP_CHUNK, 2 * TCP_CHUNK}, {100, 100}, "again"},
      {"off the grid", {0, 100}, {TCP_CHUNK, TCP_CHUNK}, "offset 100 (not the start of a"},
      {"cut short", {0, TCP_CHUNK}, {TCP_CHUNK, TCP_CHUNK / 2}, "len 262144 at offset 524288"},
      {"past the end", {0, 3 * TCP_CHUNK}, {TCP_CHUNK, 100}, "offset 1572864"},
  };
  static const char *const env[] = {"BRAID_TIMEOUT=20", NULL};
  for (size_t i = 0; i < BT_COUNT(cases); i++)
    if (run_env(2, body_hostile_data, (void *)&cases[i], env, 1, 60)) {
      fprintf(stderr, "hostile DATA case \"%s\" failed\n", cases[i].name);
      return 1;
    }
  return 0;
}

/* A stranger that trickles bytes into rank 0's listener (reconnecting when
   it is closed) moves no message: rank 0's wait still times out. */
static int body_trickle(braid_comm *c, int rank, int n, void *arg) {
  (void)n, (void)arg;
  int32_t port = rank == 0 ? braid__tcp_test_listener(c, NULL, 0) : 0;
  BT_CHECK_OK(braid_broadcast(c, &port, 1, BRAID_I32, 0), c);
  _Atomic int *over = arg;
  if (rank == 0) {
    char v[4];
    double t0 = now_s();
    BT_CHECK_OK(braid_recv(c, v, 4, BRAID_U8, 1, 9), c);
    braid_status st = braid_sync(c);
    double dt = now_s() - t0;
    atomic_store(over, 1);
    BT_CHECK(st == BRAID_ERR_TIMEOUT, "got %s: %s", braid_status_string(st), braid_last_error(c));
    BT_CHECK(dt < 2 + 2.0, "a 2 s timeout took %.1f s while a stranger trickled bytes", dt);
    return 0;
  }
  uint8_t b[BRAID_TCP_HDR];
  braid__tcp_hdr h = tcp_hdr(c->id, BRAID_TCP_HELLO);
  h.len = BRAID_TCP_HELLO_LEN;
  braid__tcp_hdr_encode(&h, b);
  int fd = -1;
  size_t at = 0;
  for (double end = now_s() + 15; !atomic_load(over) && now_s() < end; usleep(100000)) {
    if (fd < 0 || at == sizeof b) {
      if (fd >= 0) close(fd);
      fd = dial(port);
      at = 0;
    }
    if (fd >= 0 && send(fd, b + at, 1, MSG_NOSIGNAL) == 1) at++;
    else if (fd >= 0) {
      close(fd);
      fd = -1;
    }
  }
  if (fd >= 0) close(fd);
  BT_CHECK(atomic_load(over), "rank 0's wait did not end");
  return 0;
}

static int test_stranger_bytes_are_no_progress(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=2", NULL};
  _Atomic int *over = bt_shared_counter();
  BT_CHECK(over != NULL, "no shared mapping");
  int rc = run_env(2, body_trickle, (void *)over, env, -1, 60);
  bt_shared_free(over);
  return rc;
}

/* Lowers this process's descriptor limit to `limit` (the old one in *old)
   and opens /dev/null until none is left: how many it opened into fds[],
   or -1. */
static int exhaust_fds(struct rlimit *old, rlim_t limit, int *fds, int max) {
  struct rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, old) != 0) return -1;
  lim = *old;
  lim.rlim_cur = limit;
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) return -1;
  int nf = 0;
  while (nf < max && (fds[nf] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) nf++;
  return nf;
}

/* Out of descriptors when a receive takes a rendezvous message and must
   open its first socket to the sender: the communicator fails on both
   ranks, naming the reason (a message half taken cannot be put back). */
static int body_no_fds(braid_comm *c, int rank, int n, void *arg) {
  (void)n, (void)arg;
  static char big[TCP_CHUNK];
  char v[4] = "abc";
  if (rank == 1) {
    BT_CHECK_OK(braid_send(c, big, sizeof big, BRAID_U8, 0, 5), c); /* its RTS */
    BT_CHECK_OK(braid_send(c, v, 4, BRAID_U8, 0, 7), c);
    braid_status st = braid_sync(c);
    BT_CHECK(st == BRAID_ERR_PEER_LOST, "rank 1 got %s: %s", braid_status_string(st), braid_last_error(c));
    BT_CHECK_MSG(c, "rank 0 failed");
    BT_CHECK_MSG(c, "Too many open files");
    return 0;
  }
  /* The small message came after the RTS, which now waits unexpected; rank
     0 has sent nothing to rank 1, so it has no socket to it yet. */
  BT_CHECK_OK(braid_recv(c, v, 4, BRAID_U8, 1, 7), c);
  BT_CHECK_OK(braid_sync(c), c);
  struct rlimit old;
  static int fds[1024];
  int nf = exhaust_fds(&old, 512, fds, 1024);
  BT_CHECK(nf >= 0, "getrlimit or setrlimit");
  braid_status st = braid_recv(c, big, sizeof big, BRAID_U8, 1, 5);
  while (nf) close(fds[--nf]);
  setrlimit(RLIMIT_NOFILE, &old);
  BT_CHECK(st == BRAID_ERR_SYSTEM, "got %s: %s", braid_status_string(st), braid_last_error(c));
  BT_CHECK_MSG(c, "socket() for a connection to rank 1 failed: Too many open files");
  st = braid_recv(c, big, sizeof big, BRAID_U8, 1, 5);
  BT_CHECK(st == BRAID_ERR_SYSTEM, "the retried receive got %s: %s", braid_status_string(st), braid_last_error(c));
  BT_CHECK_MSG(c, "communicator failed earlier");
  return 0;
}

static int test_descriptors_exhausted(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=20", NULL};
  return run_env(2, body_no_fds, NULL, env, -1, 60);
}

/* Out of descriptors when a peer's first connection comes: it waits in the
   backlog, one warning (not one per progress pass) says why, and once a
   thread of the rank has freed descriptors the message arrives. */
typedef struct {
  int *fds;
  int nf;
} fd_fill;

static void *free_fds_later(void *arg) {
  fd_fill *f = arg;
  usleep(1000000);
  while (f->nf) close(f->fds[--f->nf]);
  return NULL;
}

static int body_accept_fails(braid_comm *c, int rank, int n, void *arg) {
  (void)n, (void)arg;
  char v[4] = "abc";
  if (rank == 0) {
    usleep(300000); /* rank 1 is out of descriptors by then */
    BT_CHECK_OK(braid_send(c, v, 4, BRAID_U8, 1, 7), c);
    BT_CHECK_OK(braid_sync(c), c);
    return 0;
  }
  struct rlimit old;
  static int fds[1024];
  fd_fill f = {fds, exhaust_fds(&old, 256, fds, 1024)};
  BT_CHECK(f.nf >= 0, "getrlimit or setrlimit");
  pthread_t t;
  BT_CHECK(pthread_create(&t, NULL, free_fds_later, &f) == 0, "pthread_create");
  char got[4] = {0};
  braid_status st = braid_recv(c, got, 4, BRAID_U8, 0, 7);
  if (!st) st = braid_sync(c);
  pthread_join(t, NULL);
  setrlimit(RLIMIT_NOFILE, &old);
  BT_CHECK_OK(st, c);
  BT_CHECK(!memcmp(got, "abc", 4), "received %.4s", got);
  return 0;
}

static int test_accept_fails(void) {
  char dir[64], logenv[128], cmd[160];
  snprintf(dir, sizeof dir, "/tmp/braid-accept-%d", (int)getpid());
  BT_CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
  snprintf(logenv, sizeof logenv, "BRAID_LOG_FILE=%s/log-%%p", dir);
  /* info: the log file opens at init, before the descriptors run out */
  const char *env[] = {"BRAID_TIMEOUT=20", "BRAID_LOG=info", logenv, NULL};
  int rc = run_env(2, body_accept_fails, NULL, env, -1, 60);
  int warnings = 0;
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) {
    char path[256], line[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = e->d_name[0] == '.' ? NULL : fopen(path, "r");
    while (f && fgets(line, sizeof line, f)) warnings += strstr(line, "accept on the tcp listener failed") != NULL;
    if (f) fclose(f);
  }
  if (d) closedir(d);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  BT_CHECK(system(cmd) == 0, "rm");
  BT_CHECK(!rc, "the message did not arrive once descriptors were free");
  BT_CHECK(warnings == 1, "%d warnings of the failed accept (one expected, for a second of failures)", warnings);
  return 0;
}

/* More than TCP_MAX_UNAUTH ranks make first contact with rank 0 at once:
   the ones past the cap wait in the backlog; no rank's socket is closed
   in its handshake. */
static int body_first_contacts(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  BT_CHECK_OK(braid_barrier(c), c);
  if (rank) {
    int32_t v = rank;
    BT_CHECK_OK(braid_send(c, &v, 1, BRAID_I32, 0, 3), c);
    BT_CHECK_OK(braid_sync(c), c);
  } else {
    usleep(500000); /* every other rank's connection waits in the backlog meanwhile */
    int32_t v[TCP_MAX_UNAUTH + 36] = {0};
    for (int q = 1; q < n; q++) BT_CHECK_OK(braid_recv(c, &v[q], 1, BRAID_I32, q, 3), c);
    BT_CHECK_OK(braid_sync(c), c);
    for (int q = 1; q < n; q++) BT_CHECK(v[q] == q, "from rank %d: %d", q, v[q]);
  }
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

static int test_first_contacts(void) {
  static const char *const env[] = {"BRAID_INIT_TIMEOUT=120", "BRAID_TIMEOUT=60", NULL};
  bt_run_opts o = {"tcp", TCP_MAX_UNAUTH + 36, 200, env, -1};
  return bt_run_ranks_ex(&o, body_first_contacts, NULL, NULL);
}

/* Rank 1 sends (which connects) and computes outside braid, so its HELLO
   waits; meanwhile more silent strangers than TCP_MAX_UNAUTH crowd rank
   0's listener, which closes the silent sockets to make room, rank 1's
   among them. Rank 1 connects again when it is back and the message
   arrives. */
static int body_redial(braid_comm *c, int rank, int n, void *arg) {
  (void)n, (void)arg;
  int32_t v = 42;
  if (rank == 1) {
    BT_CHECK_OK(braid_send(c, &v, 1, BRAID_I32, 0, 7), c);
    sleep(3);
    BT_CHECK_OK(braid_sync(c), c);
    return 0;
  }
  const int port = braid__tcp_test_listener(c, NULL, 0);
  BT_CHECK(port > 0, "rank 0 has no listener");
  usleep(500000); /* rank 1's socket is first in the backlog */
  enum { STRANGERS = TCP_MAX_UNAUTH + 6 };
  int fds[STRANGERS];
  for (int i = 0; i < STRANGERS; i++) BT_CHECK((fds[i] = dial(port)) >= 0, "stranger %d could not connect", i);
  int32_t got = 0;
  BT_CHECK_OK(braid_recv(c, &got, 1, BRAID_I32, 1, 7), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(got == 42, "got %d", got);
  for (int i = 0; i < STRANGERS; i++) close(fds[i]);
  return 0;
}

static int test_redial(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=20", NULL};
  return run_env(2, body_redial, NULL, env, -1, 60);
}

/* Rank 0 accepts rank 1's first socket in one progress pass, then spends
   longer than the handshake's 10 s outside braid: the socket is a peer's,
   whose HELLO and proof wait unread, not a silent stranger's to close. */
static int body_handshake_read_late(braid_comm *c, int rank, int n, void *arg) {
  (void)n, (void)arg;
  int32_t a = 0, b = 0;
  if (rank == 1) {
    int32_t v1 = 11, v2 = 22;
    BT_CHECK_OK(braid_send(c, &v1, 1, BRAID_I32, 0, 9), c);
    BT_CHECK_OK(braid_send(c, &v2, 1, BRAID_I32, 0, 5), c);
    BT_CHECK_OK(braid_sync(c), c);
    return 0;
  }
  usleep(300000);                                        /* rank 1's connection waits in the backlog */
  BT_CHECK_OK(braid_recv(c, &a, 1, BRAID_I32, 1, 5), c); /* one progress pass: the accept */
  sleep(11);
  BT_CHECK_OK(braid_recv(c, &b, 1, BRAID_I32, 1, 9), c);
  BT_CHECK_OK(braid_sync(c), c);
  BT_CHECK(a == 22 && b == 11, "received %d and %d", a, b);
  return 0;
}

static int test_handshake_read_late(void) {
  static const char *const env[] = {"BRAID_TIMEOUT=30", NULL};
  return run_env(2, body_handshake_read_late, NULL, env, -1, 60);
}

/* ---------------------------------------------------------------- IPv6 */

static int have_ipv6_loopback(void) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct sockaddr_in6 a;
  memset(&a, 0, sizeof a);
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

static int body_ipv6(braid_comm *c, int rank, int n, void *arg) {
  char addr[64];
  int port = braid__tcp_test_listener(c, addr, sizeof addr);
  BT_CHECK(port > 0 && !strcmp(addr, "::1"), "rank %d listens on %s port %d", rank, addr, port);
  if (body_ring(c, rank, n, arg)) return 1;
  static const size_t counts[] = {7, 70001};
  matrix m = {counts, 2, 0, 0};
  return bt_coll_matrix_body(c, rank, n, &m);
}

static int test_ipv6(void) {
  if (!have_ipv6_loopback()) {
    printf("  skipped: this host has no IPv6 loopback (::1 cannot be bound)\n");
    return 0;
  }
  static const char *const env[] = {"BRAID_ADDR=::1", NULL};
  return run_env(3, body_ipv6, NULL, env, -1, 120);
}

/* ---------------------------------------------------------------- without a token */

/* A store without a token (loopback only) in its own process: ranks then
   authenticate with the secret the first rank to start draws. */
typedef struct plain_store {
  pid_t pid;
  int stop_fd, port;
} plain_store;

static int plain_store_start(plain_store *sp) {
  int portp[2], stopp[2];
  if (pipe2(portp, O_CLOEXEC) || pipe2(stopp, O_CLOEXEC)) return -1;
  fflush(NULL);
  pid_t p = fork();
  if (p < 0) return -1;
  if (p == 0) {
    close(portp[0]);
    close(stopp[1]);
    braid__store_server *srv = NULL;
    char err[256];
    int port = -1;
    if (braid__store_server_start("127.0.0.1", 0, NULL, 0, &srv, err, sizeof err) == BRAID_OK)
      port = braid__store_server_port(srv);
    if (write(portp[1], &port, sizeof port) != (ssize_t)sizeof port || port < 0) _exit(1);
    char b;
    while (read(stopp[0], &b, 1) < 0 && errno == EINTR) {
    }
    braid__store_server_stop(srv);
    _exit(0);
  }
  close(portp[1]);
  close(stopp[0]);
  sp->pid = p;
  sp->stop_fd = stopp[1];
  ssize_t r = read(portp[0], &sp->port, sizeof sp->port);
  close(portp[0]);
  return r == (ssize_t)sizeof sp->port && sp->port > 0 ? 0 : -1;
}

static void plain_store_stop(plain_store *sp) {
  close(sp->stop_fd);
  waitpid(sp->pid, NULL, 0);
}

static int body_no_token(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  BT_CHECK(getenv("BRAID_TOKEN") == NULL || !getenv("BRAID_TOKEN")[0], "a token is set");
  tcp_state *s = c->be;
  BT_CHECK(s->keyref != NULL, "rank %d authenticates without the world's drawn secret", rank);
  static const size_t counts[] = {1, 70001};
  matrix m = {counts, 2, 0, 0};
  if (bt_coll_matrix_body(c, rank, n, &m)) return 1;
  /* Children reuse the world's secret. */
  braid_comm *child = NULL;
  BT_CHECK_OK(braid_split(c, (uint32_t)(rank % 2), 0, &child), c);
  BT_CHECK(child && ((tcp_state *)child->be)->keyref == s->keyref, "the child has its own secret");
  if (bt_coll_matrix_body(child, braid_rank(child), braid_world_size(child), &m)) return 1;
  BT_CHECK_OK(braid_destroy(child), NULL);
  return 0;
}

/* hier's between-node parts are tcp communicators under a world that is
   not one: they draw and share the secret too (their start once waited
   for a tcp world's rank 0 that does not exist). */
static int body_hier_no_token(braid_comm *c, int rank, int n, void *arg) {
  (void)arg;
  BT_CHECK(!strcmp(braid_backend(c), "hier"), "backend %s", braid_backend(c));
  static const size_t counts[] = {1, 70001};
  matrix m = {counts, 2, 0, 0};
  return bt_coll_matrix_body(c, rank, n, &m);
}

static int test_no_token(void) {
  plain_store ps;
  BT_CHECK(plain_store_start(&ps) == 0, "cannot start a store without a token");
  char store[64];
  snprintf(store, sizeof store, "BRAID_STORE=127.0.0.1:%d", ps.port);
  const char *env[] = {store, "BRAID_TOKEN=", NULL};
  int rc = run_env(4, body_no_token, NULL, env, -1, 120);
  if (!rc) {
    /* Two simulated nodes (the harness's BRAID_NODE_ID for hier). */
    bt_run_opts o = {"hier", 4, 120, env, -1};
    rc = bt_run_ranks_ex(&o, body_hier_no_token, NULL, NULL);
  }
  plain_store_stop(&ps);
  return rc;
}

/* ---------------------------------------------------------------- descriptors */

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (readdir(d)) n++;
  closedir(d);
  return n - 3; /* ".", ".." and the directory's own */
}

/* One rank in this process (no store): init, every kind of call, destroy. */
static int test_fd_one_rank(void) {
  setenv("BRAID_BACKEND", "tcp", 1);
  setenv("BRAID_RANK", "0", 1);
  setenv("BRAID_WORLD_SIZE", "1", 1);
  unsetenv("BRAID_STORE");
  unsetenv("MASTER_ADDR");
  int before = count_fds();
  for (int round = 0; round < 2; round++) {
    braid_comm *c = NULL;
    BT_CHECK_OK(braid_init(NULL, &c), NULL);
    BT_CHECK(!strcmp(braid_backend(c), "tcp"), "backend %s", braid_backend(c));
    matrix m = {(const size_t[]){1, 1000}, 2, 0, 0};
    if (bt_coll_matrix_body(c, 0, 1, &m)) return 1;
    if (body_self(c, 0, 1, NULL)) return 1;
    braid_comm *child = NULL;
    BT_CHECK_OK(braid_split(c, 0, 0, &child), c);
    BT_CHECK_OK(braid_barrier(child), child);
    BT_CHECK_OK(braid_destroy(child), NULL);
    BT_CHECK_OK(braid_destroy(c), NULL);
    int after = count_fds();
    BT_CHECK(after == before, "round %d: %d descriptors before init, %d after destroy", round, before, after);
  }
  return 0;
}

typedef struct fd_arg {
  bt_store *store;
} fd_arg;

/* Several ranks that call braid_init themselves, twice, each time with
   collectives, large messages (several sockets per peer) and a split. */
static int body_fd(braid_comm *unused, int rank, int n, void *arg) {
  (void)unused;
  const fd_arg *fa = arg;
  char v[128];
  setenv("BRAID_BACKEND", "tcp", 1);
  snprintf(v, sizeof v, "%d", rank);
  setenv("BRAID_RANK", v, 1);
  setenv("BRAID_LOCAL_RANK", v, 1);
  snprintf(v, sizeof v, "%d", n);
  setenv("BRAID_WORLD_SIZE", v, 1);
  setenv("BRAID_LOCAL_SIZE", v, 1);
  snprintf(v, sizeof v, "127.0.0.1:%d", fa->store->port);
  setenv("BRAID_STORE", v, 1);
  setenv("BRAID_STORE_EXTERNAL", "1", 1);
  setenv("BRAID_TOKEN", fa->store->token_hex, 1);
  setenv("BRAID_TCP_NSOCKS", "3", 1);
  for (int round = 0; round < 2; round++) {
    snprintf(v, sizeof v, "%s.fd%d", fa->store->job_id, round);
    setenv("BRAID_JOB_ID", v, 1);
    int before = count_fds();
    braid_comm *c = NULL;
    BT_CHECK_OK(braid_init(NULL, &c), NULL);
    if (body_ring(c, rank, n, NULL)) return 1;
    matrix m = {(const size_t[]){7, 300001}, 2, 0, 0};
    if (bt_coll_matrix_body(c, rank, n, &m)) return 1;
    braid_comm *child = NULL;
    BT_CHECK_OK(braid_split(c, (uint32_t)(rank % 2), 0, &child), c);
    if (bt_coll_matrix_body(child, braid_rank(child), braid_world_size(child), &m)) return 1;
    BT_CHECK_OK(braid_destroy(child), NULL);
    BT_CHECK_OK(braid_barrier(c), c);
    BT_CHECK_OK(braid_destroy(c), NULL);
    int after = count_fds();
    BT_CHECK(after == before, "round %d: %d descriptors before braid_init, %d after braid_destroy", round, before,
             after);
  }
  return 0;
}

static int test_fd_leak(void) {
  if (test_fd_one_rank()) return 1;
  bt_store st;
  BT_CHECK(bt_store_start(&st) == 0, "cannot start the store");
  fd_arg fa = {&st};
  bt_run_opts o = {NULL, 3, 180, NULL, -1};
  int rc = bt_run_ranks_ex(&o, body_fd, &fa, NULL);
  bt_store_stop(&st);
  return rc;
}

/* ---------------------------------------------------------------- 64 ranks */

static int body_many(braid_comm *c, int rank, int n, void *arg) {
  /* arg: when the ranks were launched (a monotonic clock every process shares) */
  double t0 = now_s(), launched = *(const double *)arg;
  BT_CHECK_OK(braid_barrier(c), c);
  double t1 = now_s();
  int32_t v = rank;
  BT_CHECK_OK(braid_all_reduce(c, &v, 1, BRAID_I32, BRAID_SUM), c);
  BT_CHECK(v == n * (n - 1) / 2, "sum %d", v);
  if (rank == 0)
    printf("  %d ranks: launch to the end of braid_init on rank 0 %.3f s, first barrier %.3f s, then an all-reduce "
           "%.3f s\n",
           n, t0 - launched, t1 - t0, now_s() - t1);
  return 0;
}

static int test_many_ranks(void) {
  static const char *const env[] = {"BRAID_INIT_TIMEOUT=120", "BRAID_TIMEOUT=120", NULL};
  double t0 = now_s();
  int rc = run_env(64, body_many, &t0, env, -1, 240);
  printf("  64 ranks started, met, passed a barrier and left in %.2f s\n", now_s() - t0);
  return rc;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      {"frames", test_frames, 60},
      {"fuzz_corpus", test_fuzz_corpus, 30},
      {"cts_first", test_cts_first, 30},
      {"same_ip", test_same_ip, 30},
      {"ubuf_pool", test_ubuf_pool, 30},
      {"congestion", test_congestion, 120},
      {"coll_small", test_coll_small, 300},
      {"coll_sizes", test_coll_sizes, 400},
      {"coll_large", test_coll_large, 400},
      {"split", test_split, 200},
      {"p2p_ring", test_p2p_ring, 300},
      {"p2p_ordered", test_p2p_ordered, 200},
      {"p2p_mismatch", test_p2p_mismatch, 120},
      {"p2p_self", test_p2p_self, 60},
      {"kill_peer", test_kill_peer, 200},
      {"stopped_peer", test_stopped_peer, 60},
      {"leave", test_leave, 150},
      {"strangers", test_strangers, 120},
      {"corrupt_frame", test_corrupt_frame, 200},
      {"hostile_data", test_hostile_data, 200},
      {"stranger_bytes_are_no_progress", test_stranger_bytes_are_no_progress, 60},
      {"descriptors_exhausted", test_descriptors_exhausted, 60},
      {"accept_fails", test_accept_fails, 90},
      {"first_contacts", test_first_contacts, 300},
      {"redial", test_redial, 90},
      {"handshake_read_late", test_handshake_read_late, 90},
      {"ipv6", test_ipv6, 200},
      {"no_token", test_no_token, 200},
      {"fd_leak", test_fd_leak, 300},
      {"many_ranks", test_many_ranks, 300},
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}

#else

int main(void) {
  printf("skipped: the tcp backend is not built (BRAID_WITH_TCP=OFF)\n");
  return 0;
}

#endif
