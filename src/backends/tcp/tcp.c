/* tcp: init (split runs it on the child's namespace), destroy, abort, peer
   liveness, the failure channel, test hooks, and the backend's table. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/backends.h"
#include "backends/tcp/tcp.h"
#include "bootstrap/bootstrap.h"
#include "core/params.h"
#include "core/wait.h"
#include "os/time.h"

static braid_status read_params(braid_comm *c, tcp_state *s) {
  char err[256];
  long nsocks = 2;
  braid_status st = braid__param_int(BRAID_P_TCP_NSOCKS, 1, BRAID_TCP_MAX_SOCKS, &nsocks, err, sizeof err);
  if (!st) st = braid__param_size(BRAID_P_TCP_EAGER_MAX, 0, TCP_EAGER_LIMIT, &s->eager_max, err, sizeof err);
  if (!st) st = braid__param_size(BRAID_P_TCP_BUFFER, 0, (size_t)1 << 30, &s->sockbuf, err, sizeof err);
  if (!st) st = braid__param_size(BRAID_P_TCP_NOTSENT, 0, (size_t)1 << 30, &s->notsent, err, sizeof err);
  if (st) return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s", err);
  if ((st = tcp_congestion_params(c, s))) return st;
  s->nsocks = (int)nsocks;
  /* Unexpected payloads kept for reuse, per communicator: about what one
     peer can have in flight towards this rank, its send buffers and ours on
     every socket (the kernel doubles what SO_*BUF ask for). */
  size_t per_sock = 4 * (s->sockbuf ? s->sockbuf : (size_t)4 << 20);
  s->ubuf_keep = per_sock > TCP_UBUF_KEEP_MAX / (size_t)nsocks ? TCP_UBUF_KEEP_MAX : per_sock * (size_t)nsocks;
  /* A vanished host is noticed on idle links within about BRAID_TIMEOUT. */
  double t = c->timeout_s > 0 ? c->timeout_s : 300;
  s->ka_idle = t / 2 < 1 ? 1 : t / 2 > 7200 ? 7200 : (int)(t / 2);
  s->ka_intvl = t / 6 < 1 ? 1 : t / 6 > 600 ? 600 : (int)(t / 6);
  s->ka_cnt = 3;
  return BRAID_OK;
}

/* Spinning polls the sockets; with more ranks than cores it only delays the
   rank waited for, so waits then do not spin. They still yield the CPU for
   a while before sleeping in epoll, as shm's do: a sleep costs a wake-up
   per message, and where idle CPUs halt (VMs) that wake-up dominates
   small and mid-size calls. */
static void set_waiting(braid_comm *c) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int local = c->boot && c->boot->local_size > 0 ? c->boot->local_size : 1;
  int oversub = ncpu > 0 && local > ncpu;
  c->spin_limit = oversub ? 1 : 2048;
  c->yield_s = oversub ? 2e-3 : 0.5e-3;
}

static void state_free(tcp_state *s) {
  for (tcp_conn *k = s->conns; k; k = k->next) tcp_conn_close(s, k);
  tcp_reap(s);
  if (s->lfd >= 0) close(s->lfd);
  if (s->evfd >= 0) close(s->evfd);
  if (s->epfd >= 0) close(s->epfd);
  while (s->free_frames) {
    tcp_frame *f = s->free_frames;
    s->free_frames = f->next;
    free(f);
  }
  tcp_ubuf_drain(s);
  tcp_key_release(s);
  free(s->peers);
  free(s);
}

static braid_status tcp_init(braid_comm *c) {
  tcp_state *s = calloc(1, sizeof *s);
  if (!s) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for the tcp backend");
  s->n = c->size;
  s->me = c->rank;
  s->epfd = s->evfd = s->lfd = -1;
  s->peers = calloc((size_t)s->n, sizeof *s->peers);
  if (!s->peers) {
    free(s);
    return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %d tcp peers", c->size);
  }
  /* From here on destroy frees whatever exists. */
  c->be = s;
  braid_status st = read_params(c, s);
  if (st) return st;
  s->epfd = epoll_create1(EPOLL_CLOEXEC);
  s->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->epfd < 0 || s->evfd < 0)
    return braid__fail(c, BRAID_ERR_SYSTEM, "cannot create the tcp backend's epoll set: %s", strerror(errno));
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->tag_abort};
  if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->evfd, &ev) != 0)
    return braid__fail(c, BRAID_ERR_SYSTEM, "epoll_ctl on the abort eventfd failed: %s", strerror(errno));
  if (s->n > 1) {
    if (!c->boot || !c->boot->store)
      return braid__fail(c, BRAID_ERR_BOOTSTRAP, "the tcp backend needs the rendezvous store to connect %d ranks",
                         s->n);
    if ((st = tcp_key_setup(c, s)) || (st = tcp_listen(c, s)) || (st = tcp_addresses(c, s))) return st;
  }
  set_waiting(c);
  c->fail_flag = &s->fail_flag;
  if (s->n > 1)
    BLOG_INFO(BRAID_SUB_TCP, c->rank,
              "tcp: %d ranks, listening on %s port %d, up to %d sockets per peer, eager up to %zu bytes, socket "
              "buffers of %zu bytes requested, at most %zu bytes unsent to another host, connections authenticated "
              "with the %s",
              s->n, s->laddr, s->lport, s->nsocks, s->eager_max, s->sockbuf, s->notsent,
              c->boot->env.has_token ? "job token" : "world's generated secret");
  return BRAID_OK;
}

/* Reads what a socket still holds, so closing it ends with a FIN rather
   than a reset that could overtake the goodbye. Bounded. */
static void drain_socket(int fd) {
  char buf[16384];
  for (int i = 0; i < 64; i++) {
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0 && !(n < 0 && errno == EINTR)) break;
  }
}

static void tcp_destroy(braid_comm *c, double timeout_s) {
  tcp_state *s = c->be;
  if (!s) return;
  /* A failure another rank sent while this one made no call is read now,
     and reported and recorded like any other. */
  if (!atomic_load(&c->failed)) {
    (void)tcp_progress(c);
    if (atomic_load(&s->fail_flag)) braid__poll_remote_failure(c, 0);
  }
  c->fail_flag = NULL;
  /* The core completed what it could; what is still queued here (the
     goodbyes, behind any frame half written) gets the same time. */
  tcp_goodbye(c, s, braid__now() + (timeout_s > 0 ? timeout_s : 0));
  for (tcp_conn *k = s->conns; k; k = k->next)
    if (k->fd >= 0) drain_socket(k->fd);
  for (tcp_conn *k = s->conns; k; k = k->next) tcp_conn_close(s, k);
  tcp_reap(s);
  tcp_drop_all(c, s);
  /* Messages that arrived during the progress and goodbyes above, after
     the core emptied the queue: nobody takes them now. */
  braid__match_drop_unexpected(c);
  state_free(s);
  c->be = NULL;
}

static void tcp_abort(braid_comm *c) {
  tcp_state *s = c->be;
  if (!s) return;
  /* The eventfd stays readable: every sleep from now on returns at once. */
  uint64_t one = 1;
  ssize_t w = write(s->evfd, &one, sizeof one);
  (void)w;
}

/* The cross-rank call check (core/wait.c) asks where a peer stands while
   a collective's wait is slow. Nothing travels for it on the fast path: a
   rank whose wait in a collective lasts one liveness period publishes the
   collective's sequence number and descriptor in the store, once per
   collective, and peers read it there. */
#define DESC_KEY "tcp/desc/%d"
#define DESC_REPLY_S 0.5        /* bound of that store write: a wait must not hang on an unreachable store */

static void publish_desc(braid_comm *c, tcp_state *s) {
  braid__store *store = c->boot ? c->boot->store : NULL;
  if (c->desc.kind == BRAID__COLL_NONE || s->desc_seq == c->seq || !store) return;
  s->desc_seq = c->seq;
  char key[32], val[96];
  snprintf(key, sizeof key, DESC_KEY, s->me);
  snprintf(val, sizeof val, "%llu %u %u %llu %d %u", (unsigned long long)c->seq, c->desc.kind, c->desc.dt,
           (unsigned long long)c->desc.count, (int)c->desc.arg, c->desc.flags);
  double op = braid__store_op_timeout(store);
  braid__store_set_op_timeout(store, DESC_REPLY_S);
  if (braid__store_set(store, key, val, strlen(val)))
    BLOG_DEBUG(BRAID_SUB_TCP, c->rank, "could not publish this rank's collective in the store: %s",
               braid__store_error(store));
  braid__store_set_op_timeout(store, op);
}

static int tcp_peer_desc(braid_comm *c, int peer, uint64_t seq, braid__desc *out) {
  char key[32], val[96];
  void *v = NULL;
  size_t len = 0;
  snprintf(key, sizeof key, DESC_KEY, peer);
  if (!c->boot || braid__boot_peek(c->boot, key, &v, &len, 0.5) != 1) return 0;
  snprintf(val, sizeof val, "%.*s", (int)(len < sizeof val ? len : sizeof val - 1), (const char *)v);
  free(v);
  unsigned long long pseq, count;
  unsigned kind, dt, flags;
  int arg;
  if (sscanf(val, "%llu %u %u %llu %d %u", &pseq, &kind, &dt, &count, &arg, &flags) != 6 || pseq != seq) return 0;
  *out = braid__desc_make((braid__coll_kind)kind, (size_t)count, (braid_dtype)dt, arg);
  out->flags = (uint16_t)flags;
  return 1;
}

static braid_status tcp_check_peers(braid_comm *c, int peer, const char *what) {
  tcp_state *s = c->be;
  if (s->err) return s->err;
  publish_desc(c, s);
  if (peer >= 0 && peer < s->n && peer != s->me && tcp_peer_gone(s, peer) && tcp_pending_with(c, s, peer))
    return tcp_fail_gone(c, s, peer, what);
  return BRAID_OK;
}

static int tcp_remote_failure(braid_comm *c, braid_status *st, int *origin, char *text, size_t len) {
  tcp_state *s = c->be;
  if (!atomic_load_explicit(&s->fail_flag, memory_order_acquire)) return 0;
  *st = (braid_status)s->fail_status;
  *origin = s->fail_origin;
  snprintf(text, len, "%s", s->fail_text);
  return 1;
}

static void tcp_publish_failure(braid_comm *c, braid_status st, const char *text) {
  tcp_say_fail(c, c->be, (int)st, c->rank, text);
}

/* ---------------------------------------------------------------- test hooks */

int braid__tcp_test_listener(braid_comm *c, char *addr, size_t len) {
  pthread_mutex_lock(&c->lock);
  tcp_state *s = c->be;
  int port = s && s->lfd >= 0 ? s->lport : -1;
  if (addr && len) snprintf(addr, len, "%s", s ? s->laddr : "");
  pthread_mutex_unlock(&c->lock);
  return port;
}

braid_status braid__tcp_test_raw(braid_comm *c, int peer, void *bytes, size_t len, int patch) {
  pthread_mutex_lock(&c->lock);
  c->call = "braid__tcp_test_raw";
  tcp_state *s = c->be;
  tcp_conn *k = NULL;
  braid_status st = tcp_out_conn(c, s, peer, 0, &k);
  double deadline = braid__now() + (c->timeout_s > 0 ? c->timeout_s : 30);
  while (!st && (!tcp_conn_ready(k) || k->qhead || k->hs_done < k->hs_len)) {
    if (braid__now() > deadline) {
      st = braid__fail(c, BRAID_ERR_TIMEOUT, "test hook: socket 0 to rank %d did not become idle", peer);
      break;
    }
    st = tcp_progress(c);
    k = s->peers[peer].out[0];
    if (!k) st = st ? st : braid__fail(c, BRAID_ERR_PEER_LOST, "test hook: socket 0 to rank %d closed", peer);
    if (!st) tcp_sleep(c, 0.001);
  }
  if (!st) {
    uint8_t *b = bytes;
    if (patch && len >= BRAID_TCP_HDR) {
      for (int i = 0; i < 8; i++) {
        b[8 + i] = (uint8_t)(c->id >> (8 * i));
        b[24 + i] = (uint8_t)(k->seq_out >> (8 * i));
      }
      k->seq_out++;
    }
    size_t done = 0;
    while (done < len) {
      ssize_t w = send(k->fd, b + done, len - done, MSG_NOSIGNAL);
      if (w > 0) {
        done += (size_t)w;
      } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
        struct pollfd p = {.fd = k->fd, .events = POLLOUT};
        poll(&p, 1, 100);
      } else {
        st = braid__fail(c, BRAID_ERR_PEER_LOST, "test hook: writing to rank %d failed: %s", peer,
                         strerror(w < 0 ? errno : EPIPE));
        break;
      }
    }
  }
  c->call = NULL;
  pthread_mutex_unlock(&c->lock);
  return st;
}

const braid__backend braid__tcp_backend = {
    .name = "tcp",
    .caps = BRAID__CAP_NEEDS_STORE,
    .dtypes = BRAID__ALL_DTYPES,
    .req_size = sizeof(tcp_req),
    .umsg_size = sizeof(tcp_umsg),
    .init = tcp_init,
    .split = NULL,
    .destroy = tcp_destroy,
    .abort = tcp_abort,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .progress = tcp_progress,
    .take = tcp_take,
    .release_umsg = tcp_release_umsg,
    .arm = tcp_arm,
    .sleep = tcp_sleep,
    .disarm = tcp_disarm,
    .check_peers = tcp_check_peers,
    .remote_failure = tcp_remote_failure,
    .publish_failure = tcp_publish_failure,
    .peer_desc = tcp_peer_desc,
    .coll_start = NULL,
    .stream = NULL,
};
