/* tcp: the per-socket write queue (writev of header and payload, resumed by
   progress), the per-socket read machine (one recv() for many small frames,
   large payloads received straight into their buffer), what each frame does,
   the point-to-point entries of the transport contract, and progress. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "backends/tcp/tcp.h"
#include "core/dtype.h"
#include "core/wait.h"
#include "os/time.h"

/* ---------------------------------------------------------------- frames */

tcp_frame *tcp_frame_new(tcp_state *s) {
  tcp_frame *f = s->free_frames;
  if (f) s->free_frames = f->next;
  else f = malloc(sizeof *f);
  if (!f) return NULL;
  f->next = NULL;
  f->req = NULL;
  f->payload = NULL;
  f->owned = NULL;
  f->plen = f->done = 0;
  f->type = 0;
  return f;
}

void tcp_frame_free(tcp_state *s, tcp_frame *f) {
  free(f->owned);
  f->owned = NULL;
  f->next = s->free_frames;
  s->free_frames = f;
}

/* The smallest class holding len bytes (the last class when none does). */
static int ubuf_class(size_t len) {
  int k = 0;
  while (k < TCP_UBUF_CLASSES - 1 && ((size_t)1 << (k + TCP_UBUF_MIN_SHIFT)) < len) k++;
  return k;
}

/* A kept buffer of class k taken off its list, or NULL when none is. */
static char *ubuf_pop(tcp_state *s, int k) {
  char *p = s->ubuf[k];
  if (p) {
    memcpy(&s->ubuf[k], p, sizeof p);
    s->ubuf_bytes -= (size_t)1 << (k + TCP_UBUF_MIN_SHIFT);
  }
  return p;
}

char *tcp_ubuf_get(tcp_state *s, size_t len, size_t *cap) {
  *cap = 0;
  if (len < ((size_t)1 << TCP_UBUF_MIN_SHIFT)) return malloc(len ? len : 1);
  int k = ubuf_class(len);
  size_t sz = (size_t)1 << (k + TCP_UBUF_MIN_SHIFT);
  if (sz < len) return malloc(len); /* above every class */
  *cap = sz;
  char *p = ubuf_pop(s, k);
  return p ? p : malloc(sz);
}

void tcp_ubuf_put(tcp_state *s, char *p, size_t cap) {
  if (!p) return;
  if (!cap || cap > s->ubuf_keep) {
    free(p);
    return;
  }
  int k = ubuf_class(cap);
  /* A full pool makes room from the other classes, smallest first: what
     earlier traffic left there would otherwise turn away the sizes in use
     now, and each of those would be malloc'ed and freed again (a burst of
     small messages filled it, and 128 KiB payloads after it were 10x
     slower: docs/TCP.md). */
  for (int j = 0; j < TCP_UBUF_CLASSES && s->ubuf_bytes + cap > s->ubuf_keep;) {
    if (j == k || !s->ubuf[j]) j++;
    else free(ubuf_pop(s, j));
  }
  if (s->ubuf_bytes + cap > s->ubuf_keep) {
    free(p);
    return;
  }
  memcpy(p, &s->ubuf[k], sizeof p);
  s->ubuf[k] = p;
  s->ubuf_bytes += cap;
}

void tcp_ubuf_drain(tcp_state *s) {
  for (int k = 0; k < TCP_UBUF_CLASSES; k++) {
    char *p;
    while ((p = ubuf_pop(s, k))) free(p);
  }
}

braid__tcp_hdr tcp_hdr(uint64_t comm, int type) {
  braid__tcp_hdr h;
  memset(&h, 0, sizeof h);
  h.magic = BRAID_TCP_MAGIC;
  h.version = BRAID_TCP_VERSION;
  h.type = (uint8_t)type;
  h.comm = comm;
  return h;
}

static void append(tcp_conn *k, tcp_frame *f) {
  f->next = NULL;
  if (k->qtail) k->qtail->next = f;
  else k->qhead = f;
  k->qtail = f;
  if (f->type == BRAID_TCP_DATA) k->ndata++;
}

void tcp_enqueue(tcp_conn *k, tcp_frame *f, braid__tcp_hdr *h) {
  h->seq = k->seq_out++;
  f->type = h->type;
  braid__tcp_hdr_encode(h, f->hdr);
  append(k, f);
}

void tcp_queue_clear(tcp_state *s, tcp_conn *k) {
  while (k->qhead) {
    tcp_frame *f = k->qhead;
    k->qhead = f->next;
    tcp_frame_free(s, f);
  }
  k->qtail = NULL;
  k->ndata = 0;
}

static void list_add(tcp_req **head, tcp_req *r) {
  r->lprev = NULL;
  r->lnext = *head;
  if (*head) (*head)->lprev = r;
  *head = r;
}

static void list_del(tcp_req **head, tcp_req *r) {
  /* Not on the list (taken off already: a receive whose CTS failed to go
     out may have completed from frames read on that failure's path). */
  if (!r->lprev && *head != r) return;
  if (r->lprev) r->lprev->lnext = r->lnext;
  else *head = r->lnext;
  if (r->lnext) r->lnext->lprev = r->lprev;
  r->lnext = r->lprev = NULL;
}

static braid__msg_hdr msg_hdr(const braid__tcp_hdr *h) {
  braid__msg_hdr m = {h->tag, h->count, h->dt, 0, h->desc};
  return m;
}

/* ---------------------------------------------------------------- writing */

static void send_done(braid_comm *c, tcp_state *s, tcp_req *r) {
  list_del(&s->peers[r->base.peer].sends, r);
  braid__req_complete(c, &r->base, BRAID_OK);
}

static void written(braid_comm *c, tcp_state *s, tcp_conn *k, tcp_frame *f) {
  tcp_req *r = f->req;
  if (f->type == BRAID_TCP_DATA) k->ndata--;
  if (r && f->type == BRAID_TCP_EAGER) {
    send_done(c, s, r);
  } else if (r && f->type == BRAID_TCP_DATA) {
    r->done += f->plen;
    if (r->done == r->base.bytes) send_done(c, s, r);
  }
  tcp_frame_free(s, f);
}

#define IOV_MAX_USED 64

/* Writes queued frames until the queue is empty or the socket is full: 0,
   or the errno of a failed write. */
static int write_queue(braid_comm *c, tcp_state *s, tcp_conn *k) {
  while (k->qhead) {
    struct iovec iov[IOV_MAX_USED];
    int n = 0;
    size_t want = 0;
    for (tcp_frame *f = k->qhead; f && n + 2 <= IOV_MAX_USED; f = f->next) {
      if (f->done < BRAID_TCP_HDR) {
        iov[n].iov_base = f->hdr + f->done;
        iov[n].iov_len = BRAID_TCP_HDR - f->done;
        want += iov[n++].iov_len;
      }
      size_t pd = f->done > BRAID_TCP_HDR ? f->done - BRAID_TCP_HDR : 0;
      if (f->plen > pd) {
        iov[n].iov_base = (void *)(f->payload + pd);
        iov[n].iov_len = f->plen - pd;
        want += iov[n++].iov_len;
      }
    }
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = iov;
    mh.msg_iovlen = (size_t)n;
    ssize_t w = sendmsg(k->fd, &mh, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return errno;
    }
    c->moved++;
    size_t left = (size_t)w;
    while (left && k->qhead) {
      tcp_frame *f = k->qhead;
      size_t rest = BRAID_TCP_HDR + f->plen - f->done;
      size_t take = left < rest ? left : rest;
      f->done += take;
      left -= take;
      if (f->done == BRAID_TCP_HDR + f->plen) {
        k->qhead = f->next;
        if (!k->qhead) k->qtail = NULL;
        written(c, s, k, f);
      }
    }
    if ((size_t)w < want) break; /* the socket is full */
  }
  return 0;
}

braid_status tcp_flush(braid_comm *c, tcp_state *s, tcp_conn *k) {
  if (k->state == C_CLOSED || k->state == C_CONNECTING) return BRAID_OK;
  while (k->hs_done < k->hs_len) {
    ssize_t w = send(k->fd, k->hs + k->hs_done, k->hs_len - k->hs_done, MSG_NOSIGNAL);
    if (w > 0) {
      k->hs_done += (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return tcp_conn_lost(c, s, k, w < 0 ? errno : EPIPE);
  }
  if (k->hs_done < k->hs_len || !tcp_conn_ready(k)) {
    tcp_watch(s, k);
    return BRAID_OK;
  }
  int err = write_queue(c, s, k);
  if (err) return tcp_conn_lost(c, s, k, err);
  tcp_watch(s, k);
  return BRAID_OK;
}

/* ---------------------------------------------------------------- sending */

/* The request is forgotten by every queue (its send failed to start). */
static void forget_send(tcp_state *s, tcp_req *r) {
  tcp_peer *p = &s->peers[r->base.peer];
  list_del(&p->sends, r);
  for (int i = 0; i < BRAID_TCP_MAX_SOCKS; i++) {
    tcp_conn *k = p->out[i];
    if (!k) continue;
    for (tcp_frame **link = &k->qhead, *prev = NULL; *link;) {
      tcp_frame *f = *link;
      if (f->req != r) {
        prev = f;
        link = &f->next;
        continue;
      }
      if (f->done) { /* partly written: it stays, detached */
        f->req = NULL;
        prev = f;
        link = &f->next;
        continue;
      }
      *link = f->next;
      if (k->qtail == f) k->qtail = prev;
      if (f->type == BRAID_TCP_DATA) k->ndata--;
      tcp_frame_free(s, f);
    }
  }
}

static braid__tcp_hdr message_hdr(const braid_comm *c, const tcp_req *r, int type) {
  braid__tcp_hdr h = tcp_hdr(c->id, type);
  h.tag = r->base.h.tag;
  h.count = r->base.h.count;
  h.dt = (uint8_t)r->base.h.dt;
  h.desc = r->base.h.desc;
  return h;
}

/* A message to this rank itself: delivered now (kept as a copy when no
   receive waits), so the send completes at once. */
static braid_status self_send(braid_comm *c, tcp_state *s, tcp_req *r) {
  braid_status st;
  braid__req *rr = braid__match_arrival(c, s->me, &r->base.h, &st);
  if (st) return st;
  if (rr) {
    if (r->base.bytes) memcpy(rr->buf, r->base.buf, r->base.bytes);
    braid__req_complete(c, rr, BRAID_OK);
  } else {
    tcp_umsg *u = calloc(1, sizeof *u);
    size_t cap;
    char *data = tcp_ubuf_get(s, r->base.bytes, &cap);
    if (!u || !data) {
      free(u);
      tcp_ubuf_put(s, data, cap);
      return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory buffering a %zu-byte message to this rank",
                         r->base.bytes);
    }
    if (r->base.bytes) memcpy(data, r->base.buf, r->base.bytes);
    u->base.src = s->me;
    u->base.h = r->base.h;
    u->base.bytes = r->base.bytes;
    u->data = data;
    u->cap = cap;
    braid__match_unexpected(c, &u->base);
  }
  braid__req_complete(c, &r->base, BRAID_OK);
  c->moved++;
  return BRAID_OK;
}

braid_status tcp_isend(braid_comm *c, braid__req *br) {
  tcp_state *s = c->be;
  tcp_req *r = (tcp_req *)br;
  int q = br->peer;
  if (q == s->me) return self_send(c, s, r);
  tcp_peer *p = &s->peers[q];
  if (p->bye) {
    char what[128];
    snprintf(what, sizeof what, "its receive of this rank's %zu-byte message with tag %u", br->bytes,
             (unsigned)br->h.tag);
    return tcp_fail_gone(c, s, q, what);
  }
  tcp_conn *k;
  braid_status st = tcp_out_conn(c, s, q, 0, &k);
  if (st) return st;
  list_add(&p->sends, r);
  if (br->bytes <= s->eager_max) {
    r->state = S_EAGER;
    braid__tcp_hdr h = message_hdr(c, r, BRAID_TCP_EAGER);
    h.len = br->bytes;
    if (tcp_conn_ready(k) && !k->qhead && k->hs_done == k->hs_len) {
      /* Nothing queued ahead on an idle socket: written now, in one call. */
      h.seq = k->seq_out++;
      uint8_t hb[BRAID_TCP_HDR];
      braid__tcp_hdr_encode(&h, hb);
      struct iovec iov[2] = {{hb, sizeof hb}, {br->buf, br->bytes}};
      struct msghdr mh;
      memset(&mh, 0, sizeof mh);
      mh.msg_iov = iov;
      mh.msg_iovlen = br->bytes ? 2 : 1;
      ssize_t w;
      do {
        w = sendmsg(k->fd, &mh, MSG_NOSIGNAL);
      } while (w < 0 && errno == EINTR);
      if (w == (ssize_t)(sizeof hb + br->bytes)) {
        c->moved++;
        send_done(c, s, r);
        return BRAID_OK;
      }
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        /* With r still on the peer's list the loss fails the communicator. */
        st = tcp_conn_lost(c, s, k, errno);
        forget_send(s, r);
        return st ? st
                  : braid__fail(c, BRAID_ERR_INTERNAL, "a lost connection to rank %d went unreported",
                                braid__label(c, q));
      }
      tcp_frame *f = tcp_frame_new(s);
      if (!f) {
        forget_send(s, r);
        return braid__fail_comm(c, BRAID_ERR_NO_MEMORY, "out of memory queueing a message");
      }
      memcpy(f->hdr, hb, sizeof hb);
      f->type = BRAID_TCP_EAGER;
      f->req = r;
      f->payload = br->buf;
      f->plen = br->bytes;
      f->done = w > 0 ? (size_t)w : 0;
      if (w > 0) c->moved++;
      append(k, f);
      tcp_watch(s, k);
      return BRAID_OK;
    }
    tcp_frame *f = tcp_frame_new(s);
    if (!f) {
      forget_send(s, r);
      return braid__fail_comm(c, BRAID_ERR_NO_MEMORY, "out of memory queueing a message");
    }
    f->req = r;
    f->payload = br->buf;
    f->plen = br->bytes;
    tcp_enqueue(k, f, &h);
  } else {
    r->state = S_CTS_WAIT;
    r->msgid = ++p->next_msgid;
    braid__tcp_hdr h = message_hdr(c, r, BRAID_TCP_RTS);
    h.msgid = r->msgid;
    tcp_frame *f = tcp_frame_new(s);
    if (!f) {
      forget_send(s, r);
      return braid__fail_comm(c, BRAID_ERR_NO_MEMORY, "out of memory queueing a message");
    }
    tcp_enqueue(k, f, &h);
    /* The other sockets of the set connect while the go-ahead travels. */
    for (int i = 1; i < tcp_nsocks(s, q) && !st; i++) {
      tcp_conn *kk;
      st = tcp_out_conn(c, s, q, i, &kk);
    }
  }
  if (!st) st = tcp_flush(c, s, k);
  if (st) {
    forget_send(s, r);
    return st;
  }
  return BRAID_OK;
}

/* Queues DATA frames of the streaming sends to q, oldest message first, on
   every ready socket of the set that has fewer than TCP_DATA_DEPTH queued:
   the sockets that drain faster carry more. */
braid_status tcp_feed(braid_comm *c, tcp_state *s, int q) {
  tcp_peer *p = &s->peers[q];
  braid_status st = BRAID_OK;
  for (int i = 0; i < tcp_nsocks(s, q) && p->nstream && !st; i++) {
    tcp_conn *k = p->out[i];
    if (!k && !p->bye) st = tcp_out_conn(c, s, q, i, &k);
    if (st || !k || k->state != C_READY) continue;
    int added = 0;
    while (k->ndata < TCP_DATA_DEPTH && p->nstream) {
      tcp_req *r = NULL;
      for (tcp_req *x = p->sends; x; x = x->lnext)
        if (x->state == S_STREAM && x->off < x->base.bytes && (!r || x->msgid < r->msgid)) r = x;
      if (!r) break;
      size_t len = r->base.bytes - r->off < TCP_CHUNK ? r->base.bytes - r->off : TCP_CHUNK;
      tcp_frame *f = tcp_frame_new(s);
      if (!f) return braid__fail_comm(c, BRAID_ERR_NO_MEMORY, "out of memory queueing data");
      braid__tcp_hdr h = tcp_hdr(c->id, BRAID_TCP_DATA);
      h.msgid = r->msgid;
      h.offset = r->off;
      h.len = len;
      f->req = r;
      f->payload = (const char *)r->base.buf + r->off;
      f->plen = len;
      tcp_enqueue(k, f, &h);
      r->off += len;
      if (r->off == r->base.bytes && --p->nstream == 0) s->nstream--;
      added = 1;
    }
    if (added) st = tcp_flush(c, s, k);
  }
  return st;
}

void tcp_enqueue_urgent(tcp_conn *k, tcp_frame *f, braid__tcp_hdr *h) {
  tcp_frame **at = &k->qhead;
  while (*at && ((*at)->done || (*at)->type != BRAID_TCP_DATA)) at = &(*at)->next;
  if (!*at) {
    tcp_enqueue(k, f, h);
    return;
  }
  /* Frames not started have sent no byte of their header yet, so they can
     take the next numbers. */
  braid__tcp_hdr d;
  braid__tcp_hdr_decode((*at)->hdr, &d);
  h->seq = d.seq;
  for (tcp_frame *x = *at; x; x = x->next) {
    braid__tcp_hdr_decode(x->hdr, &d);
    d.seq++;
    braid__tcp_hdr_encode(&d, x->hdr);
  }
  k->seq_out++;
  f->type = h->type;
  braid__tcp_hdr_encode(h, f->hdr);
  f->next = *at;
  *at = f;
}

/* Queues a CTS for q's message msgid on this rank's socket 0 to q, ahead of
   this rank's own DATA there: the peer's message should not wait for ours. */
static braid_status send_cts(braid_comm *c, tcp_state *s, int q, uint64_t msgid) {
  tcp_conn *k;
  braid_status st = tcp_out_conn(c, s, q, 0, &k);
  if (st) return st;
  tcp_frame *f = tcp_frame_new(s);
  if (!f) return braid__fail_comm(c, BRAID_ERR_NO_MEMORY, "out of memory queueing a control frame");
  braid__tcp_hdr h = tcp_hdr(c->id, BRAID_TCP_CTS);
  h.msgid = msgid;
  tcp_enqueue_urgent(k, f, &h);
  return tcp_flush(c, s, k);
}

/* A receive leaves q's list (complete, dropped or abandoned). */
static void recv_off_list(tcp_state *s, int q, tcp_req *r) {
  list_del(&s->peers[q].recvs, r);
  free(r->seen);
  r->seen = NULL;
}

/* Receive r takes q's rendezvous message msgid: it waits for the DATA on
   q's list and q is told to go ahead. */
static braid_status start_rndv(braid_comm *c, tcp_state *s, int q, tcp_req *r, uint64_t msgid) {
  tcp_peer *p = &s->peers[q];
  for (tcp_req *x = p->recvs; x; x = x->lnext)
    if (x->msgid == msgid) {
      char name[112];
      tcp_peer_name(c, s, q, name, sizeof name);
      return braid__fail(c, BRAID_ERR_PEER_LOST, "%s sent a corrupt frame: msg id %llu (already in use)", name,
                         (unsigned long long)msgid);
    }
  size_t pieces = (r->base.bytes + TCP_CHUNK - 1) / TCP_CHUNK;
  r->seen1 = 0;
  r->seen = pieces > 64 ? calloc((pieces + 63) / 64, sizeof *r->seen) : NULL;
  if (pieces > 64 && !r->seen)
    return braid__fail_comm(c, BRAID_ERR_NO_MEMORY, "out of memory for a %zu-byte message from rank %d",
                            r->base.bytes, braid__label(c, q));
  r->msgid = msgid;
  r->state = R_DATA;
  r->done = 0;
  list_add(&p->recvs, r);
  if (p->bye) return tcp_fail_gone(c, s, q, NULL);
  return send_cts(c, s, q, msgid);
}

/* The receive is on the matcher's queue. What already arrived on the
   sockets is newer than the unexpected messages it was checked against:
   one progress pass delivers it now (straight into the buffer, or as the
   shape mismatch of the receive being posted). */
braid_status tcp_irecv(braid_comm *c, braid__req *r) {
  tcp_state *s = c->be;
  int q = r->peer;
  if (q != s->me && tcp_peer_gone(s, q)) {
    char what[128];
    snprintf(what, sizeof what, "a %zu-byte message with tag %u", r->bytes, (unsigned)r->h.tag);
    return tcp_fail_gone(c, s, q, what);
  }
  braid_status st = tcp_progress(c);
  /* Once a frame took r, r is this backend's until it completes or the
     communicator goes: the failure (sticky) is then the next wait's. */
  return st && r->queued ? st : BRAID_OK;
}

braid_status tcp_take(braid_comm *c, braid__req *br, braid__umsg *bu) {
  tcp_state *s = c->be;
  tcp_umsg *u = (tcp_umsg *)bu;
  tcp_req *r = (tcp_req *)br;
  if (!u->rndv) {
    if (br->bytes) memcpy(br->buf, u->data, br->bytes);
    tcp_ubuf_put(s, u->data, u->cap);
    u->data = NULL;
    braid__req_complete(c, br, BRAID_OK);
    c->moved++;
    return BRAID_OK;
  }
  braid_status st = start_rndv(c, s, u->base.src, r, u->msgid);
  if (st && r->state == R_DATA) recv_off_list(s, u->base.src, r); /* the core abandons r */
  return st;
}

void tcp_release_umsg(braid_comm *c, braid__umsg *bu) {
  tcp_umsg *u = (tcp_umsg *)bu;
  tcp_ubuf_put(c->be, u->data, u->cap);
  u->data = NULL;
}

void tcp_drop_all(braid_comm *c, tcp_state *s) {
  for (int q = 0; q < s->n; q++) {
    tcp_peer *p = &s->peers[q];
    while (p->sends) {
      tcp_req *r = p->sends;
      list_del(&p->sends, r);
      braid__req_drop(c, &r->base);
    }
    while (p->recvs) {
      tcp_req *r = p->recvs;
      recv_off_list(s, q, r);
      braid__req_drop(c, &r->base);
    }
    p->nstream = 0;
  }
  s->nstream = 0;
}

void tcp_say_fail(braid_comm *c, tcp_state *s, int st, int origin, const char *text) {
  for (tcp_conn *k = s->conns; k; k = k->next) {
    /* A frame queued may be half written, and nothing can interrupt it. */
    if (!tcp_conn_ready(k) || k->hs_done < k->hs_len || k->qhead) continue;
    uint8_t buf[BRAID_TCP_HDR + BRAID_TCP_FAIL_MAX];
    braid__tcp_hdr h = tcp_hdr(c->id, BRAID_TCP_FAIL);
    size_t plen = braid__tcp_fail_encode(st, origin, text, buf + BRAID_TCP_HDR);
    h.len = plen;
    h.seq = k->seq_out++;
    braid__tcp_hdr_encode(&h, buf);
    ssize_t w;
    do {
      w = send(k->fd, buf, BRAID_TCP_HDR + plen, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (w < 0 && errno == EINTR);
    if (w == (ssize_t)(BRAID_TCP_HDR + plen)) continue;
    /* The rest waits in the queue, so nothing can follow a partial frame. */
    tcp_frame *f = tcp_frame_new(s);
    char *own = malloc(plen);
    if (!f || !own) {
      if (f) tcp_frame_free(s, f);
      free(own);
      continue;
    }
    memcpy(f->hdr, buf, BRAID_TCP_HDR);
    memcpy(own, buf + BRAID_TCP_HDR, plen);
    f->owned = own;
    f->payload = own;
    f->plen = plen;
    f->type = BRAID_TCP_FAIL;
    f->done = w > 0 ? (size_t)w : 0;
    append(k, f);
    tcp_watch(s, k);
  }
}

/* Reads and drops what a leaving rank's socket holds: 0, or -1 once the
   other end closed it. */
static int discard_input(tcp_conn *k) {
  char buf[16384];
  for (int i = 0; i < 64; i++) {
    ssize_t n = recv(k->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
  }
  return 0;
}

/* Queues BYE on k. Frames not started belong to requests the core
   abandoned and go (BYE takes the first one's sequence number); a frame
   half written is finished first, since nothing can follow part of a
   frame. */
static void queue_bye(braid_comm *c, tcp_state *s, tcp_conn *k) {
  tcp_frame *keep = k->qhead && k->qhead->done ? k->qhead : NULL;
  tcp_frame *drop = keep ? keep->next : k->qhead;
  if (drop) {
    braid__tcp_hdr first;
    braid__tcp_hdr_decode(drop->hdr, &first);
    k->seq_out = first.seq;
  }
  while (drop) {
    tcp_frame *f = drop;
    drop = f->next;
    tcp_frame_free(s, f);
  }
  k->qhead = k->qtail = keep;
  k->ndata = 0;
  if (keep) {
    keep->next = NULL;
    keep->req = NULL; /* its request is dropped with the others */
    if (keep->type == BRAID_TCP_DATA) k->ndata = 1;
  }
  tcp_frame *f = tcp_frame_new(s);
  if (!f) return;
  braid__tcp_hdr h = tcp_hdr(c->id, BRAID_TCP_BYE);
  tcp_enqueue(k, f, &h);
}

void tcp_goodbye(braid_comm *c, tcp_state *s, double deadline) {
  /* Connections that start now would only be cut short. */
  if (s->lfd >= 0) {
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->lfd, NULL);
    close(s->lfd);
    s->lfd = -1;
  }
  /* BYE goes wherever the other end reads frames: on the authenticated
     sockets, and on accepted ones whose handshake reply went out (the
     connector counts those ready once it sent its proof, which this rank
     may never read). The rest close now: the other end of a socket in its
     handshake takes its loss quietly. */
  int failed = atomic_load(&c->failed) != 0;
  for (tcp_conn *k = s->conns; k; k = k->next) {
    if (k->state == C_CLOSED) continue;
    /* After a failure the caller had its requests back and may have freed
       their buffers: a frame half written from one cannot be finished, so
       that socket closes (its peer has the failure already, or learns it
       from the loss). */
    tcp_frame *h = k->qhead;
    int stranded = failed && h && h->done && h->plen && !h->owned;
    if (!stranded && (tcp_conn_ready(k) || k->state == C_IN_AUTH) && k->hs_done == k->hs_len) {
      queue_bye(c, s, k);
      continue;
    }
    (void)discard_input(k); /* unread bytes would turn the close into a reset */
    tcp_conn_close(s, k);
  }
  for (;;) {
    int waiting = 0;
    for (tcp_conn *k = s->conns; k; k = k->next) {
      if (k->state == C_CLOSED || !k->qhead) continue;
      if (write_queue(c, s, k)) tcp_conn_close(s, k); /* no one reads it any more */
      else if (k->qhead) waiting = 1;
      tcp_watch(s, k);
    }
    double left = deadline - braid__now();
    if (!waiting || left <= 0) return;
    /* A peer that is slow to read gets until the deadline; what peers send
       meanwhile is dropped, so ranks leaving at once cannot wait on each
       other's full buffers. */
    struct epoll_event ev[64];
    int n = epoll_wait(s->epfd, ev, 64, left > 0.1 ? 100 : (int)ceil(left * 1000.0));
    for (int i = 0; i < n; i++) {
      void *tag = ev[i].data.ptr;
      if (tag == &s->tag_abort) return;
      tcp_conn *k = tag;
      if (k->state != C_CLOSED && (ev[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && discard_input(k))
        tcp_conn_close(s, k);
    }
  }
}

/* ---------------------------------------------------------------- reading */

static unsigned allowed(const tcp_conn *k) {
  if (k->bye) return 0; /* nothing follows a goodbye */
  switch (k->state) {
  case C_WAIT_ACK: return BRAID_TCP_T(BRAID_TCP_HELLO_ACK);
  case C_READY: return BRAID_TCP_T(BRAID_TCP_FAIL) | BRAID_TCP_T(BRAID_TCP_BYE);
  case C_IN_HELLO: return BRAID_TCP_T(BRAID_TCP_HELLO);
  case C_IN_AUTH: return BRAID_TCP_T(BRAID_TCP_AUTH);
  case C_IN_READY:
    return BRAID_TCP_T(BRAID_TCP_EAGER) | BRAID_TCP_T(BRAID_TCP_RTS) | BRAID_TCP_T(BRAID_TCP_CTS) |
           BRAID_TCP_T(BRAID_TCP_DATA) | BRAID_TCP_T(BRAID_TCP_FAIL) | BRAID_TCP_T(BRAID_TCP_BYE);
  default: return 0;
  }
}

/* A frame that breaks the rules: a stranger's socket is closed; an
   authenticated peer's fails the communicator. */
static braid_status corrupt(braid_comm *c, tcp_state *s, tcp_conn *k, const char *why) {
  if (tcp_in_handshake(k)) {
    tcp_refuse(c, s, k, why);
    return BRAID_OK;
  }
  if (k->state == C_WAIT_ACK)
    return braid__fail(c, BRAID_ERR_PEER_LOST,
                       "the process at rank %d's address %s answered the handshake with a corrupt frame: %s",
                       braid__label(c, k->peer), k->where, why);
  char name[112];
  tcp_peer_name(c, s, k->peer, name, sizeof name);
  return braid__fail(c, BRAID_ERR_PEER_LOST, "%s sent a corrupt frame: %s", name, why);
}

static braid_status corruptf(braid_comm *c, tcp_state *s, tcp_conn *k, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static braid_status corruptf(braid_comm *c, tcp_state *s, tcp_conn *k, const char *fmt, ...) {
  char why[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  return corrupt(c, s, k, why);
}

static braid_status eager_begin(braid_comm *c, tcp_state *s, tcp_conn *k) {
  braid__msg_hdr mh = msg_hdr(&k->h);
  braid_status st;
  braid__req *br = braid__match_arrival(c, k->peer, &mh, &st);
  if (st) return st;
  if (br) {
    if (br->bytes != k->h.len)
      return braid__fail_comm(c, BRAID_ERR_INTERNAL, "a %llu-byte message from rank %d matched a %zu-byte receive",
                              (unsigned long long)k->h.len, braid__label(c, k->peer), br->bytes);
    tcp_req *r = (tcp_req *)br;
    r->state = R_EAGER;
    r->msgid = 0;
    list_add(&s->peers[k->peer].recvs, r); /* held here until its payload is in */
    k->rr = r;
    k->dest = br->buf;
    return BRAID_OK;
  }
  tcp_umsg *u = calloc(1, sizeof *u);
  size_t cap;
  char *data = tcp_ubuf_get(s, k->h.len, &cap);
  if (!u || !data) {
    free(u);
    tcp_ubuf_put(s, data, cap);
    return braid__fail_comm(c, BRAID_ERR_NO_MEMORY, "out of memory buffering a %llu-byte message from rank %d",
                            (unsigned long long)k->h.len, braid__label(c, k->peer));
  }
  u->base.src = k->peer;
  u->base.h = mh;
  u->base.bytes = k->h.len;
  u->data = data;
  u->cap = cap;
  k->ru = u;
  k->dest = data;
  return BRAID_OK;
}

static braid_status eager_done(braid_comm *c, tcp_state *s, tcp_conn *k) {
  if (k->rr) {
    tcp_req *r = k->rr;
    k->rr = NULL;
    list_del(&s->peers[k->peer].recvs, r);
    braid__req_complete(c, &r->base, BRAID_OK);
    return BRAID_OK;
  }
  tcp_umsg *u = k->ru;
  k->ru = NULL;
  /* A receive posted while the payload was arriving takes it now. */
  braid_status st;
  braid__req *br = braid__match_arrival(c, u->base.src, &u->base.h, &st);
  if (st || br) {
    if (br) {
      if (u->base.bytes) memcpy(br->buf, u->data, u->base.bytes);
      braid__req_complete(c, br, BRAID_OK);
    }
    tcp_ubuf_put(s, u->data, u->cap);
    free(u);
    return st;
  }
  braid__match_unexpected(c, &u->base);
  return BRAID_OK;
}

static braid_status rts(braid_comm *c, tcp_state *s, tcp_conn *k) {
  braid__msg_hdr mh = msg_hdr(&k->h);
  braid_status st;
  braid__req *br = braid__match_arrival(c, k->peer, &mh, &st);
  if (st) return st;
  if (br) return start_rndv(c, s, k->peer, (tcp_req *)br, k->h.msgid);
  tcp_umsg *u = calloc(1, sizeof *u);
  if (!u)
    return braid__fail_comm(c, BRAID_ERR_NO_MEMORY, "out of memory queueing a message from rank %d",
                            braid__label(c, k->peer));
  u->base.src = k->peer;
  u->base.h = mh;
  u->base.bytes = (size_t)(k->h.count * braid__dtsize((braid_dtype)k->h.dt));
  u->rndv = 1;
  u->msgid = k->h.msgid;
  braid__match_unexpected(c, &u->base);
  return BRAID_OK;
}

static braid_status cts(braid_comm *c, tcp_state *s, tcp_conn *k) {
  tcp_peer *p = &s->peers[k->peer];
  for (tcp_req *r = p->sends; r; r = r->lnext) {
    if (r->state != S_CTS_WAIT || r->msgid != k->h.msgid) continue;
    r->state = S_STREAM;
    r->off = r->done = 0;
    if (p->nstream++ == 0) s->nstream++;
    return tcp_feed(c, s, k->peer);
  }
  return corruptf(c, s, k, "msg id %llu in a CTS frame (no message of that id waits for one)",
                  (unsigned long long)k->h.msgid);
}

static braid_status data_begin(braid_comm *c, tcp_state *s, tcp_conn *k) {
  tcp_peer *p = &s->peers[k->peer];
  for (tcp_req *r = p->recvs; r; r = r->lnext) {
    if (r->state != R_DATA || r->msgid != k->h.msgid) continue;
    /* Senders cut a message into TCP_CHUNK pieces and send each once: any
       other cut, or a piece again, is not theirs. With each piece accepted
       once and whole, the receive completes only after every frame it
       accepted has ended, and nothing arrives in its buffer once it is the
       caller's again. */
    uint64_t off = k->h.offset, len = k->h.len;
    if (off >= r->base.bytes || off % TCP_CHUNK)
      return corruptf(c, s, k, "offset %llu (not the start of a %zu-byte piece of the %zu-byte message)",
                      (unsigned long long)off, (size_t)TCP_CHUNK, r->base.bytes);
    if (len != (r->base.bytes - off < TCP_CHUNK ? r->base.bytes - off : TCP_CHUNK))
      return corruptf(c, s, k, "len %llu at offset %llu of the %zu-byte message", (unsigned long long)len,
                      (unsigned long long)off, r->base.bytes);
    size_t piece = (size_t)(off / TCP_CHUNK);
    uint64_t *word = r->seen ? &r->seen[piece / 64] : &r->seen1, bit = (uint64_t)1 << (piece % 64);
    if (*word & bit)
      return corruptf(c, s, k, "offset %llu again (that piece of the %zu-byte message came already)",
                      (unsigned long long)off, r->base.bytes);
    *word |= bit;
    k->rr = r;
    k->dest = (char *)r->base.buf + k->h.offset;
    return BRAID_OK;
  }
  return corruptf(c, s, k, "msg id %llu in a DATA frame (no receive waits for that message)",
                  (unsigned long long)k->h.msgid);
}

static braid_status data_done(braid_comm *c, tcp_state *s, tcp_conn *k) {
  tcp_req *r = k->rr;
  k->rr = NULL;
  r->done += k->h.len;
  if (r->done == r->base.bytes) {
    recv_off_list(s, k->peer, r);
    braid__req_complete(c, &r->base, BRAID_OK);
  }
  return BRAID_OK;
}

static braid_status fail_frame(braid_comm *c, tcp_state *s, tcp_conn *k) {
  int st, origin;
  char text[BRAID_TCP_FAIL_TEXT + 1], why[128];
  if (braid__tcp_fail_decode(k->small, k->h.len, s->n, &st, &origin, text, sizeof text, why, sizeof why))
    return corrupt(c, s, k, why);
  if (origin == s->me || atomic_load(&s->fail_flag)) return BRAID_OK;
  s->fail_status = st;
  s->fail_origin = origin;
  snprintf(s->fail_text, sizeof s->fail_text, "%s", text);
  atomic_store_explicit(&s->fail_flag, 1, memory_order_release);
  BLOG_DEBUG(BRAID_SUB_TCP, c->rank, "rank %d (from rank %d's socket) reported a failure: %s", origin, k->peer, text);
  /* Passed on once to every peer this rank is connected to: the origin
     reaches only the peers it has sockets with. */
  tcp_say_fail(c, s, st, origin, s->fail_text);
  return BRAID_OK;
}

/* The payload of the current frame is in. */
static braid_status body_done(braid_comm *c, tcp_state *s, tcp_conn *k) {
  k->in_body = 0;
  switch (k->h.type) {
  case BRAID_TCP_HELLO:
  case BRAID_TCP_HELLO_ACK:
  case BRAID_TCP_AUTH: return tcp_handshake(c, s, k);
  case BRAID_TCP_FAIL: return fail_frame(c, s, k);
  case BRAID_TCP_EAGER: return eager_done(c, s, k);
  case BRAID_TCP_DATA: return data_done(c, s, k);
  default: return BRAID_OK;
  }
}

static braid_status header(braid_comm *c, tcp_state *s, tcp_conn *k) {
  braid__tcp_limits lim = {c->id, k->seq_in, allowed(k), TCP_EAGER_LIMIT, TCP_DATA_MAX};
  char why[200];
  if (braid__tcp_hdr_check(&k->h, &lim, why, sizeof why)) return corrupt(c, s, k, why);
  k->seq_in++;
  k->left = (size_t)k->h.len;
  if (k->left) k->bulk = k->left >= k->rcap; /* frames without payload (RTS, CTS) keep the guess */
  k->dest = NULL;
  k->rr = NULL;
  k->ru = NULL;
  braid_status st = BRAID_OK;
  switch (k->h.type) {
  case BRAID_TCP_HELLO:
  case BRAID_TCP_HELLO_ACK:
  case BRAID_TCP_AUTH:
  case BRAID_TCP_FAIL: k->dest = (char *)k->small; break; /* the check bounded len by sizeof small */
  case BRAID_TCP_BYE:
    k->bye = 1;
    if (k->peer >= 0) s->peers[k->peer].bye = 1;
    break;
  case BRAID_TCP_EAGER: st = eager_begin(c, s, k); break;
  case BRAID_TCP_RTS: st = rts(c, s, k); break;
  case BRAID_TCP_CTS: st = cts(c, s, k); break;
  case BRAID_TCP_DATA: st = data_begin(c, s, k); break;
  default: break;
  }
  if (st || k->state == C_CLOSED) return st;
  if (!k->left) return body_done(c, s, k);
  k->in_body = 1;
  return BRAID_OK;
}

static braid_status read_loop(braid_comm *c, tcp_state *s, tcp_conn *k) {
  size_t budget = TCP_READ_BUDGET;
  int drained = 0; /* a read came back short: the socket was empty, epoll says when it is not */
  braid_status st;
  while (k->state != C_CLOSED) {
    size_t avail = k->rlen - k->rpos;
    if (!k->in_body && avail >= BRAID_TCP_HDR) {
      braid__tcp_hdr_decode((const uint8_t *)k->rbuf + k->rpos, &k->h);
      k->rpos += BRAID_TCP_HDR;
      if ((st = header(c, s, k))) return st;
      continue;
    }
    if (k->in_body && avail) {
      size_t take = avail < k->left ? avail : k->left;
      if (k->dest) {
        memcpy(k->dest, k->rbuf + k->rpos, take);
        k->dest += take;
      }
      k->rpos += take;
      k->left -= take;
      if (!k->left && (st = body_done(c, s, k))) return st;
      continue;
    }
    /* More bytes are needed. */
    if (!budget || drained) return BRAID_OK;
    ssize_t n;
    int direct = k->in_body && k->dest && k->left >= TCP_DIRECT_MIN;
    if (k->rpos) {
      memmove(k->rbuf, k->rbuf + k->rpos, avail);
      k->rlen = avail;
      k->rpos = 0;
    }
    /* After a payload of rbuf's size or more the next one is likely as
       large: reading headers in small pieces lets it go straight to its
       buffer instead of through rbuf (a second copy of up to rcap bytes,
       which costs more than a recv). Outside a body rlen < HDR here. */
    size_t cap = !k->in_body && k->bulk ? TCP_HDR_READ : k->rcap;
    size_t want = direct ? k->left : cap - k->rlen;
    if (direct) n = recv(k->fd, k->dest, want, 0);
    else n = recv(k->fd, k->rbuf + k->rlen, want, 0);
    if (n > 0) {
      /* A stranger's bytes are no progress: they must not hold off a timeout. */
      if (tcp_conn_ready(k)) c->moved++;
      drained = (size_t)n < want;
      budget = (size_t)n >= budget ? 0 : budget - (size_t)n;
      if (!direct) {
        k->rlen += (size_t)n;
        continue;
      }
      k->dest += n;
      k->left -= (size_t)n;
      if (!k->left && (st = body_done(c, s, k))) return st;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return BRAID_OK;
    return tcp_conn_lost(c, s, k, n < 0 ? errno : 0);
  }
  return BRAID_OK;
}

braid_status tcp_read(braid_comm *c, tcp_state *s, tcp_conn *k) {
  if (k->reading || k->state == C_CLOSED) return BRAID_OK;
  k->reading = 1;
  braid_status st = read_loop(c, s, k);
  k->reading = 0;
  return st;
}

/* ---------------------------------------------------------------- progress and waiting */

braid_status tcp_progress(braid_comm *c) {
  tcp_state *s = c->be;
  int failed = atomic_load(&c->failed);
  if (failed) return (braid_status)failed;
  struct epoll_event ev[64];
  int n = epoll_wait(s->epfd, ev, 64, 0);
  braid_status st = BRAID_OK;
  for (int i = 0; i < n && !st; i++) {
    void *tag = ev[i].data.ptr;
    uint32_t e = ev[i].events;
    if (tag == &s->tag_abort) continue;
    if (tag == &s->tag_listen) {
      st = tcp_accept(c, s);
      continue;
    }
    tcp_conn *k = tag;
    if (k->state == C_CLOSED) continue;
    if (k->state == C_CONNECTING) {
      if (e & (EPOLLOUT | EPOLLERR | EPOLLHUP)) st = tcp_connected(c, s, k);
      continue;
    }
    if (e & EPOLLOUT) st = tcp_flush(c, s, k);
    if (!st && k->state != C_CLOSED && (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) st = tcp_read(c, s, k);
  }
  for (int q = 0; q < s->n && s->nstream && !st; q++)
    if (s->peers[q].nstream) st = tcp_feed(c, s, q);
  if (!st) st = tcp_expire(c, s);
  tcp_reap(s);
  if (st && !s->err) s->err = st;
  return st;
}

int tcp_arm(braid_comm *c) {
  (void)c;
  return 1;
}

/* Every socket, the listener and the abort eventfd are in the set: any
   arrival, room to write where frames wait, or an abort ends the sleep. */
void tcp_sleep(braid_comm *c, double slice_s) {
  tcp_state *s = c->be;
  struct epoll_event ev;
  int ms = slice_s > 0 ? (int)ceil(slice_s * 1000.0) : 0;
  (void)epoll_wait(s->epfd, &ev, 1, ms);
}

void tcp_disarm(braid_comm *c) { (void)c; }
