/* tcp: the listener and its address in the store, the key that
   authenticates connections, lazy non-blocking connects, accepting, the
   handshake state machine, and what a closed socket means. */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/tcp/tcp.h"
#include "bootstrap/auth.h"
#include "bootstrap/bootstrap.h"
#include "core/params.h"
#include "core/subcomm.h"
#include "core/wait.h"
#include "os/sock.h"
#include "os/time.h"

/* ---------------------------------------------------------------- the key */

/* Without a job token, the first rank to start draws a secret and
   publishes it in the store (a loopback-only store then: only this host's
   processes read it). The world and its split children share it: one
   entry per world, found by the bootstrap state they share. */
struct tcp_keyref {
  tcp_keyref *next;
  const void *owner;
  int refs;
  uint8_t key[TCP_KEY_LEN];
};

static pthread_mutex_t secrets_lock = PTHREAD_MUTEX_INITIALIZER;
static tcp_keyref *secrets;

#define SECRET_KEY "tcp/secret"

static braid_status fetch_secret(braid_comm *c, uint8_t key[TCP_KEY_LEN]) {
  braid__boot *b = c->boot;
  /* Whichever rank comes first draws it, so no rank waits for another's
     (under hier the world is not a tcp communicator, and no world rank 0
     of tcp exists to draw it). The world's namespace holds it. */
  uint8_t mine[TCP_KEY_LEN];
  if (braid__random_bytes(mine, TCP_KEY_LEN))
    return braid__fail(c, BRAID_ERR_SYSTEM, "could not draw the tcp connection secret");
  int world = !strcmp(b->prefix, b->job_prefix), swapped = 0;
  void *cur = NULL;
  size_t len = 0;
  braid_status st = world ? BRAID_OK : braid__store_set_prefix(b->store, b->job_prefix);
  if (!st) st = braid__store_cas(b->store, SECRET_KEY, NULL, 0, mine, TCP_KEY_LEN, &swapped, &cur, &len);
  char why[256];
  snprintf(why, sizeof why, "%s", braid__store_error(b->store));
  if (!world && braid__store_set_prefix(b->store, b->prefix) && !st) st = BRAID_ERR_BOOTSTRAP;
  if (!st && !swapped && len != TCP_KEY_LEN) {
    snprintf(why, sizeof why, "it has %zu bytes instead of %d", len, TCP_KEY_LEN);
    st = BRAID_ERR_BOOTSTRAP;
  }
  if (!st) memcpy(key, swapped ? mine : (const uint8_t *)cur, TCP_KEY_LEN);
  free(cur);
  if (st) return braid__fail(c, BRAID_ERR_BOOTSTRAP, "could not agree on the tcp connection secret: %s", why);
  return BRAID_OK;
}

braid_status tcp_key_setup(braid_comm *c, tcp_state *s) {
  braid__boot *b = c->boot;
  if (s->n == 1 || !b || !b->store) return BRAID_OK; /* no one to meet */
  if (b->env.has_token) {
    memcpy(s->key, b->env.token, TCP_KEY_LEN);
    return BRAID_OK;
  }
  const void *owner = b->shared;
  pthread_mutex_lock(&secrets_lock);
  for (tcp_keyref *e = secrets; e; e = e->next)
    if (e->owner == owner) {
      e->refs++;
      memcpy(s->key, e->key, TCP_KEY_LEN);
      s->keyref = e;
      break;
    }
  pthread_mutex_unlock(&secrets_lock);
  if (s->keyref) return BRAID_OK;
  tcp_keyref *e = calloc(1, sizeof *e);
  if (!e) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for the tcp secret");
  braid_status st = fetch_secret(c, e->key);
  if (st) {
    free(e);
    return st;
  }
  memcpy(s->key, e->key, TCP_KEY_LEN);
  e->owner = owner;
  e->refs = 1;
  pthread_mutex_lock(&secrets_lock);
  e->next = secrets;
  secrets = e;
  pthread_mutex_unlock(&secrets_lock);
  s->keyref = e;
  return BRAID_OK;
}

void tcp_key_release(tcp_state *s) {
  tcp_keyref *e = s->keyref;
  s->keyref = NULL;
  if (!e) return;
  pthread_mutex_lock(&secrets_lock);
  if (--e->refs == 0) {
    for (tcp_keyref **p = &secrets; *p; p = &(*p)->next)
      if (*p == e) {
        *p = e->next;
        break;
      }
  } else {
    e = NULL;
  }
  pthread_mutex_unlock(&secrets_lock);
  free(e);
}

/* ---------------------------------------------------------------- sockets */

/* Large buffers where the system lets them be that large: a smaller forced
   size would switch off the kernel's own tuning for less. */
static long sys_limit(const char *path) {
  FILE *f = fopen(path, "r");
  long v = -1;
  if (f) {
    if (fscanf(f, "%ld", &v) != 1) v = -1;
    fclose(f);
  }
  return v;
}

static void set_buffers(const tcp_state *s, int fd) {
  static long rmax = -2, wmax = -2;
  if (!s->sockbuf) return;
  if (rmax == -2) {
    rmax = sys_limit("/proc/sys/net/core/rmem_max");
    wmax = sys_limit("/proc/sys/net/core/wmem_max");
  }
  int want = s->sockbuf > (size_t)1 << 30 ? 1 << 30 : (int)s->sockbuf;
  if (rmax < 0 || rmax >= want) (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &want, sizeof want);
  if (wmax < 0 || wmax >= want) (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof want);
}

/* Congestion control. BBR paces the sender at the bandwidth it estimated;
   between two processes of one host there is no link to probe, and the
   rate it settles on after a burst that filled the receiver's window
   holds back every later large message on the socket (measured in
   docs/PERFORMANCE.md). Sockets to other hosts keep the administrator's
   choice, made for the network they cross. */
static const char *const CC_MODES[] = {[TCP_CC_AUTO] = "auto", [TCP_CC_SYSTEM] = "system"};

const char *tcp_congestion_want(int mode, const char *named, int local, const char *cur) {
  if (mode == TCP_CC_NAMED) return strcmp(cur, named) ? named : NULL;
  if (mode != TCP_CC_AUTO || !local) return NULL;
  return strncmp(cur, "bbr", 3) ? NULL : "cubic";
}

braid_status tcp_congestion_params(braid_comm *c, tcp_state *s) {
  const char *v = braid__param_str(BRAID_P_TCP_CONGESTION);
  s->cc_mode = TCP_CC_NAMED;
  for (int i = 0; i < (int)(sizeof CC_MODES / sizeof *CC_MODES); i++)
    if (!strcmp(v, CC_MODES[i])) s->cc_mode = i;
  if (s->cc_mode != TCP_CC_NAMED) return BRAID_OK;
  if (strlen(v) >= sizeof s->cc_name)
    return braid__fail(c, BRAID_ERR_INVALID_ARG,
                       "BRAID_TCP_CONGESTION=\"%.40s\" is longer than any congestion control name (auto, system, or "
                       "one of the kernel's, e.g. cubic or reno)",
                       v);
  snprintf(s->cc_name, sizeof s->cc_name, "%s", v);
  /* Tried once here, so that a name the kernel refuses fails init on
     every rank instead of being ignored on each connection. */
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return BRAID_OK; /* no socket to try it on: tcp_listen reports that */
  int r = braid__sock_set_congestion(fd, s->cc_name), e = errno;
  close(fd);
  if (r == 0) return BRAID_OK;
  return braid__fail(c, BRAID_ERR_INVALID_ARG,
                     "BRAID_TCP_CONGESTION=\"%s\" was refused by the kernel (%s): use auto, system, or a name in "
                     "/proc/sys/net/ipv4/tcp_%s_congestion_control",
                     s->cc_name, strerror(e), e == EPERM ? "allowed" : "available");
}

static void set_congestion(braid_comm *c, const tcp_state *s, int fd, int q) {
  char cur[TCP_CC_LEN];
  if (s->cc_mode == TCP_CC_SYSTEM || braid__sock_congestion(fd, cur, sizeof cur) != 0) return;
  const char *want = tcp_congestion_want(s->cc_mode, s->cc_name, s->peers[q].local, cur);
  if (!want || braid__sock_set_congestion(fd, want) == 0) return;
  /* cubic may be built in but not offered to unprivileged processes;
     reno always is. */
  if (s->cc_mode == TCP_CC_AUTO && braid__sock_set_congestion(fd, "reno") == 0) return;
  BLOG_DEBUG(BRAID_SUB_TCP, c->rank, "the socket to rank %d keeps congestion control %s (%s refused: %s)",
             braid__label(c, q), cur, want, strerror(errno));
}

static void set_options(const tcp_state *s, int fd) {
  braid__sock_set_nodelay(fd);
  braid__sock_set_keepalive(fd, s->ka_idle, s->ka_intvl, s->ka_cnt);
}

/* k's new socket into the epoll set, watched as its state needs. */
static int watch_new(tcp_state *s, tcp_conn *k) {
  k->events = EPOLLIN | EPOLLRDHUP | (k->state == C_CONNECTING ? EPOLLOUT : 0);
  struct epoll_event ev = {.events = k->events, .data.ptr = k};
  return epoll_ctl(s->epfd, EPOLL_CTL_ADD, k->fd, &ev);
}

static tcp_conn *conn_new(tcp_state *s, int fd, int out, int peer, int idx, int state) {
  tcp_conn *k = calloc(1, sizeof *k);
  if (!k) return NULL;
  k->rcap = TCP_RBUF_SMALL;
  k->rbuf = malloc(k->rcap);
  if (!k->rbuf) {
    free(k);
    return NULL;
  }
  k->fd = fd;
  k->out = out;
  k->peer = peer;
  k->idx = idx;
  k->state = state;
  if (watch_new(s, k) != 0) {
    free(k->rbuf);
    free(k);
    return NULL;
  }
  k->next = s->conns;
  s->conns = k;
  return k;
}

void tcp_watch(tcp_state *s, tcp_conn *k) {
  if (k->state == C_CLOSED) return;
  uint32_t want = EPOLLIN | EPOLLRDHUP;
  /* An accepted socket in its handshake has a queue only for its goodbye. */
  int queue = (tcp_conn_ready(k) || k->state == C_IN_AUTH) && k->qhead;
  if (k->state == C_CONNECTING || k->hs_done < k->hs_len || queue) want |= EPOLLOUT;
  if (want == k->events) return;
  struct epoll_event ev = {.events = want, .data.ptr = k};
  if (epoll_ctl(s->epfd, EPOLL_CTL_MOD, k->fd, &ev) == 0) k->events = want;
}

/* The listener in the epoll set or out of it. */
static void listener_watch(tcp_state *s, int on) {
  if (s->lfd < 0 || s->listen_paused == !on) return;
  struct epoll_event ev = {.events = on ? EPOLLIN : 0, .data.ptr = &s->tag_listen};
  if (epoll_ctl(s->epfd, EPOLL_CTL_MOD, s->lfd, &ev) == 0) s->listen_paused = !on;
}

/* A paused listener back in the set, once there is room and any rest
   after a failed accept is over. */
static void listener_resume(tcp_state *s, double now) {
  if (s->listen_paused && s->nunauth < TCP_MAX_UNAUTH && now >= s->accept_retry) listener_watch(s, 1);
}

/* A socket left its handshake: a paused listener may take the next. */
static void unauth_done(tcp_state *s) {
  s->nunauth--;
  if (s->listen_paused) listener_resume(s, braid__now());
}

void tcp_conn_close(tcp_state *s, tcp_conn *k) {
  if (k->state == C_CLOSED) return;
  if (k->fd >= 0) {
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, k->fd, NULL);
    close(k->fd);
    k->fd = -1;
  }
  if (tcp_in_handshake(k)) unauth_done(s);
  if (k->peer >= 0) {
    tcp_peer *p = &s->peers[k->peer];
    if (k->out && p->out[k->idx] == k) p->out[k->idx] = NULL;
    if (!k->out && k->state == C_IN_READY && p->in[k->idx] == k) {
      p->in[k->idx] = NULL;
      p->nin--;
    }
  }
  k->state = C_CLOSED;
  tcp_queue_clear(s, k);
  if (k->ru) {
    tcp_ubuf_put(s, k->ru->data, k->ru->cap);
    free(k->ru);
    k->ru = NULL;
  }
  k->rr = NULL;
  free(k->rbuf);
  k->rbuf = NULL;
  k->rcap = k->rpos = k->rlen = 0;
  s->nclosed++;
}

void tcp_reap(tcp_state *s) {
  if (!s->nclosed) return;
  for (tcp_conn **p = &s->conns; *p;) {
    tcp_conn *k = *p;
    if (k->state != C_CLOSED) {
      p = &k->next;
      continue;
    }
    *p = k->next;
    free(k);
  }
  s->nclosed = 0;
}

/* ---------------------------------------------------------------- names */

void tcp_peer_name(const braid_comm *c, const tcp_state *s, int q, char *out, size_t len) {
  const tcp_peer *p = &s->peers[q];
  const char *where = p->known ? p->where : NULL;
  for (int i = 0; !where && i < BRAID_TCP_MAX_SOCKS; i++)
    if (p->in[i]) where = p->in[i]->where;
  for (int i = 0; !where && i < BRAID_TCP_MAX_SOCKS; i++)
    if (p->out[i]) where = p->out[i]->where;
  snprintf(out, len, "rank %d (%s)", braid__label(c, q), where ? where : "address not known here");
}

/* ---------------------------------------------------------------- the listener */

#define ADDR_KEY "tcp/addr/%d"

braid_status tcp_listen(braid_comm *c, tcp_state *s) {
  braid__listener l;
  char err[384];
  braid_status st = braid__listen_dataplane(c->boot, 1024, &l, err, sizeof err);
  if (st) return braid__fail(c, st, "%s", err);
  s->lfd = l.fd;
  s->lport = l.port;
  snprintf(s->laddr, sizeof s->laddr, "%s", l.addr);
  struct addrinfo *res = NULL;
  if (braid__sock_resolve(s->laddr, s->lport, 1, &res) == 0 && res && res->ai_addrlen <= sizeof s->lsa)
    memcpy(&s->lsa, res->ai_addr, res->ai_addrlen);
  if (res) freeaddrinfo(res);
  /* Accepted sockets inherit the listener's buffer sizes (and the window
     scale follows the receive buffer at the handshake). */
  set_buffers(s, s->lfd);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->tag_listen};
  if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->lfd, &ev) != 0)
    return braid__fail(c, BRAID_ERR_SYSTEM, "epoll_ctl on the tcp listener failed: %s", strerror(errno));
  char key[32], val[96];
  snprintf(key, sizeof key, ADDR_KEY, s->me);
  snprintf(val, sizeof val, "%s %d", s->laddr, s->lport);
  if (braid__store_set(c->boot->store, key, val, strlen(val)))
    return braid__fail(c, BRAID_ERR_BOOTSTRAP, "could not publish this rank's tcp address: %s",
                       braid__store_error(c->boot->store));
  return BRAID_OK;
}

/* Peer q's listener from its published "host port" (numeric). */
static braid_status parse_addr(braid_comm *c, tcp_state *s, int q, const char *val) {
  tcp_peer *p = &s->peers[q];
  char host[80], ps[16];
  int port = 0, used = 0;
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  if (sscanf(val, "%79s %d%n", host, &port, &used) != 2 || val[used] || port <= 0 || port > 65535 ||
      (snprintf(ps, sizeof ps, "%d", port), getaddrinfo(host, ps, &hints, &res)) != 0 || !res ||
      res->ai_addrlen > sizeof p->sa) {
    if (res) freeaddrinfo(res);
    return braid__fail(c, BRAID_ERR_BOOTSTRAP, "rank %d published a malformed tcp address \"%.80s\"",
                       braid__label(c, q), val);
  }
  memcpy(&p->sa, res->ai_addr, res->ai_addrlen);
  p->salen = (socklen_t)res->ai_addrlen;
  freeaddrinfo(res);
  braid__sock_hostport(host, port, p->where, sizeof p->where);
  p->known = 1;
  /* Ranks of one host publish the same address (or loopback): the kernel
     carries their bytes over loopback. */
  p->local = braid__sock_is_loopback((struct sockaddr *)&p->sa) ||
             braid__sock_same_ip((struct sockaddr *)&p->sa, (struct sockaddr *)&s->lsa);
  return BRAID_OK;
}

#define TABLE_KEY "tcp/addrs"
#define WAIT_BATCH 4096 /* keys per store wait request */

/* Every rank learns every listener at init, so the data plane never needs
   the store again (it may go away once the ranks have met): all wait for
   every address (a missing rank is named), rank 0 reads them and publishes
   one table, the others read the table. */
braid_status tcp_addresses(braid_comm *c, tcp_state *s) {
  braid__store *store = c->boot->store;
  double deadline = braid__deadline(c->boot->init_timeout_s);
  int n = s->n;
  char(*names)[24] = malloc(sizeof *names * (size_t)n);
  const char **keys = malloc(sizeof *keys * (size_t)n);
  int *present = calloc((size_t)n, sizeof *present);
  char *table = NULL;
  braid_status st = BRAID_OK;
  if (!names || !keys || !present) {
    st = braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %d ranks' addresses", n);
    goto done;
  }
  for (int q = 0; q < n; q++) {
    snprintf(names[q], sizeof names[q], ADDR_KEY, q);
    keys[q] = names[q];
  }
  for (int base = 0; base < n && !st; base += WAIT_BATCH) {
    int m = n - base < WAIT_BATCH ? n - base : WAIT_BATCH;
    /* Short waits, between them a look for ranks that died while starting. */
    while ((st = braid__store_wait(store, keys + base, m, fmin(deadline, braid__now() + 0.1), present + base)) ==
               BRAID_ERR_TIMEOUT &&
           braid__now() < deadline)
      if ((st = braid__start_check(c, "the start of a communicator, while the ranks exchanged addresses"))) goto done;
    if (!st)
      for (int i = 0; i < m; i++) present[base + i] = 1;
  }
  if (st == BRAID_ERR_TIMEOUT) {
    char missing[200];
    size_t o = 0;
    int k = 0;
    for (int q = 0; q < n && o + 16 < sizeof missing; q++)
      if (!present[q]) {
        int w = snprintf(missing + o, sizeof missing - o, "%s%d", k++ ? ", " : "", braid__label(c, q));
        if (w > 0) o += (size_t)w;
      }
    st = braid__fail(c, BRAID_ERR_BOOTSTRAP, "%d rank(s) did not publish a tcp address within %g s: missing rank%s %s",
                     k, c->boot->init_timeout_s, k == 1 ? "" : "s", missing);
    goto done;
  }
  if (st) goto store_error;
  size_t len = 0;
  if (s->me == 0) {
    size_t cap = (size_t)n * 96;
    table = malloc(cap);
    if (!table) {
      st = braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %d ranks' addresses", n);
      goto done;
    }
    for (int q = 0; q < n && !st; q++) {
      void *v = NULL;
      size_t vl = 0;
      if ((st = braid__store_get(store, keys[q], &v, &vl, deadline))) break;
      int w = snprintf(table + len, cap - len, "%.*s\n", (int)(vl < 80 ? vl : 80), (const char *)v);
      free(v);
      len += w > 0 ? (size_t)w : 0;
    }
    if (!st) st = braid__store_set(store, TABLE_KEY, table, len);
  } else {
    st = braid__store_get(store, TABLE_KEY, (void **)&table, &len, deadline);
  }
  if (st == BRAID_ERR_TIMEOUT) {
    st = braid__fail(c, BRAID_ERR_BOOTSTRAP, "rank %d did not publish the table of tcp addresses within %g s",
                     braid__label(c, 0), c->boot->init_timeout_s);
    goto done;
  }
  if (st) goto store_error;
  /* One "host port" line per rank, in rank order. */
  size_t at = 0;
  for (int q = 0; q < n && !st; q++) {
    char line[96];
    size_t e = at;
    while (e < len && table[e] != '\n') e++;
    if (e == len) {
      st = braid__fail(c, BRAID_ERR_BOOTSTRAP, "the table of tcp addresses ends at rank %d of %d", q, n);
      break;
    }
    snprintf(line, sizeof line, "%.*s", (int)(e - at), table + at);
    at = e + 1;
    if (q != s->me) st = parse_addr(c, s, q, line);
  }
  goto done;
store_error:
  st = braid__fail(c, BRAID_ERR_BOOTSTRAP, "could not exchange tcp addresses through the store: %s",
                   braid__store_error(store));
done:
  free(names);
  free(keys);
  free(present);
  free(table);
  return st;
}

/* A non-blocking connect to q's listener: *fd, and *r, connect's result
   (0: connected, else in progress). */
static braid_status dial(braid_comm *c, tcp_state *s, int q, int *fd, int *r) {
  tcp_peer *p = &s->peers[q];
  *fd = socket(p->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (*fd < 0)
    return braid__fail_comm(c, BRAID_ERR_SYSTEM, "socket() for a connection to rank %d failed: %s",
                            braid__label(c, q), strerror(errno));
  set_buffers(s, *fd);
  set_options(s, *fd);
  set_congestion(c, s, *fd, q);
  /* Across a link slower than the CPUs, what the kernel holds unsent leaves
     before a CTS queued now; on this host the bytes leave as fast as the
     peer reads, and the limit would only add wake-ups. */
  if (!p->local) (void)braid__sock_set_notsent_lowat(*fd, s->notsent);
  do {
    *r = connect(*fd, (struct sockaddr *)&p->sa, p->salen);
  } while (*r != 0 && errno == EINTR);
  if (*r != 0 && errno != EINPROGRESS) {
    int e = errno;
    close(*fd);
    *fd = -1;
    return braid__fail_comm(c, BRAID_ERR_PEER_LOST, "could not connect to rank %d at %s: %s", braid__label(c, q),
                            p->where, strerror(e));
  }
  return BRAID_OK;
}

braid_status tcp_out_conn(braid_comm *c, tcp_state *s, int q, int idx, tcp_conn **out) {
  tcp_peer *p = &s->peers[q];
  *out = p->out[idx];
  if (*out) return BRAID_OK;
  /* Each failure here fails the communicator: the caller may have queued
     frames for q already (a rendezvous's RTS, a receive's go-ahead), which
     could not be taken back without a gap in the socket's sequence, and a
     rank without a connection to q cannot keep to the protocol with it. */
  if (!p->known) return braid__fail_comm(c, BRAID_ERR_INTERNAL, "no tcp address for rank %d", braid__label(c, q));
  int fd, r;
  braid_status st = dial(c, s, q, &fd, &r);
  if (st) return st;
  tcp_conn *k = conn_new(s, fd, 1, q, idx, C_CONNECTING);
  if (!k) {
    close(fd);
    return braid__fail_comm(c, BRAID_ERR_NO_MEMORY, "out of memory for a connection to rank %d", braid__label(c, q));
  }
  snprintf(k->where, sizeof k->where, "%s", p->where);
  k->seq_out = 2; /* HELLO and AUTH are 0 and 1 */
  p->out[idx] = k;
  *out = k;
  if (r == 0) return tcp_connected(c, s, k);
  return BRAID_OK;
}

/* ---------------------------------------------------------------- the handshake */

static void put_hs(tcp_conn *k, uint64_t comm, int type, uint64_t seq, const uint8_t *payload, size_t len) {
  braid__tcp_hdr h = tcp_hdr(comm, type);
  h.seq = seq;
  h.len = len;
  braid__tcp_hdr_encode(&h, k->hs);
  memcpy(k->hs + BRAID_TCP_HDR, payload, len);
  k->hs_len = BRAID_TCP_HDR + len;
  k->hs_done = 0;
}

braid_status tcp_connected(braid_comm *c, tcp_state *s, tcp_conn *k) {
  int err = 0;
  socklen_t el = sizeof err;
  if (getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
  /* A refused or reset connect often means the peer failed and left: the
     lost-socket path looks for the failure it published before blaming it. */
  if (err) return tcp_conn_lost(c, s, k, err);
  /* Closed by the peer before this rank's HELLO went (crowded: see
     may_redial): lost while still connecting. */
  char b;
  ssize_t r = recv(k->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r == 0 || (r < 0 && errno == ECONNRESET)) return tcp_conn_lost(c, s, k, r ? ECONNRESET : 0);
  braid__tcp_hello m = {(uint32_t)s->me, (uint32_t)k->peer, (uint32_t)k->idx, 0, {0}};
  if (braid__random_bytes(m.nonce, sizeof m.nonce))
    return braid__fail_comm(c, BRAID_ERR_SYSTEM, "could not draw a handshake nonce");
  memcpy(k->nonce_c, m.nonce, sizeof m.nonce);
  uint8_t pl[BRAID_TCP_HELLO_LEN];
  braid__tcp_hello_encode(&m, pl);
  put_hs(k, c->id, BRAID_TCP_HELLO, 0, pl, sizeof pl);
  k->state = C_WAIT_ACK;
  return tcp_flush(c, s, k);
}

#define TCP_CROWDED "too many connections in their handshake at once (the longest silent one is closed)"

/* At the cap: the socket in its handshake that has been silent longest,
   for TCP_SILENT_S at least, else NULL. A peer sends its HELLO as soon as
   it is connected, and one read at accept takes it, so a silent one is a
   stranger's; one that spoke may be a peer's mid-handshake and stays. */
static tcp_conn *silent_victim(tcp_state *s, double now) {
  tcp_conn *old = NULL;
  for (tcp_conn *k = s->conns; k; k = k->next)
    if (k->state == C_IN_HELLO && k->rlen == 0 && k->accepted + TCP_SILENT_S <= now &&
        (!old || k->accepted < old->accepted))
      old = k;
  return old;
}

/* At the cap: closes the socket silent longest, once a last read shows it
   still has said nothing (a HELLO that came since makes it a speaker). 1:
   there is room now; 0: none is silent (or *st: the read failed c). */
static int make_room(braid_comm *c, tcp_state *s, double now, braid_status *st) {
  *st = BRAID_OK;
  for (tcp_conn *old; (old = silent_victim(s, now));) {
    if ((*st = tcp_read(c, s, old))) return 0;
    if (old->state == C_IN_HELLO && old->rlen == 0) tcp_refuse(c, s, old, TCP_CROWDED);
    if (s->nunauth < TCP_MAX_UNAUTH) return 1;
  }
  return 0;
}

braid_status tcp_accept(braid_comm *c, tcp_state *s) {
  for (int i = 0; i < 64; i++) {
    /* At the cap the rest wait in the backlog while handshakes end, or
       until a silent one can go (tcp_expire makes that room). */
    if (s->nunauth >= TCP_MAX_UNAUTH) {
      braid_status st;
      if (!make_room(c, s, braid__now(), &st)) {
        if (!st) listener_watch(s, 0);
        return st;
      }
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return BRAID_OK;
      /* Out of descriptors, say: the connection waits in the backlog, and
         the listener, still readable, rests a while instead of waking
         every wait at once. */
      const int e = errno;
      const double now = braid__now();
      if (now >= s->accept_warn_next) {
        BLOG_WARN(BRAID_SUB_TCP, c->rank,
                  "%s: accept on the tcp listener failed: %s (connections wait; tried again every %g s)",
                  c->call ? c->call : "braid", strerror(e), TCP_ACCEPT_RETRY_S);
        s->accept_warn_next = now + 10.0;
      }
      s->accept_retry = now + TCP_ACCEPT_RETRY_S;
      listener_watch(s, 0);
      return BRAID_OK;
    }
    char where[80];
    braid__sock_addr_format((struct sockaddr *)&ss, where, sizeof where);
    set_options(s, fd);
    tcp_conn *k = conn_new(s, fd, 0, -1, 0, C_IN_HELLO);
    if (!k) {
      close(fd);
      continue;
    }
    snprintf(k->where, sizeof k->where, "%s", where);
    k->accepted = braid__now();
    k->auth_deadline = k->accepted + TCP_AUTH_TIMEOUT_S;
    s->nunauth++;
    /* A peer's HELLO is often in already. */
    braid_status st = tcp_read(c, s, k);
    if (st) return st;
  }
  return BRAID_OK;
}

static braid_status hello(braid_comm *c, tcp_state *s, tcp_conn *k) {
  braid__tcp_hello m;
  char why[160];
  if (braid__tcp_hello_decode(k->small, BRAID_TCP_HELLO_LEN, s->n, s->me, &m, why, sizeof why)) {
    tcp_refuse(c, s, k, why);
    return BRAID_OK;
  }
  tcp_peer *p = &s->peers[m.src];
  if (p->in[m.index]) {
    snprintf(why, sizeof why, "rank %u already has socket %u open to this rank", m.src, m.index);
    tcp_refuse(c, s, k, why);
    return BRAID_OK;
  }
  k->peer = (int)m.src;
  k->idx = (int)m.index;
  /* The peer spoke: its proof is due within the time from now (this rank
     may have read the HELLO long after it came). */
  k->auth_deadline = braid__now() + TCP_AUTH_TIMEOUT_S;
  memcpy(k->nonce_c, m.nonce, sizeof m.nonce);
  uint8_t pl[BRAID_TCP_ACK_LEN];
  if (braid__random_bytes(k->nonce_s, sizeof k->nonce_s) ||
      braid__tcp_mac(s->key, TCP_KEY_LEN, 1, c->id, m.src, m.dst, m.index, k->nonce_c, k->nonce_s,
                     pl + BRAID_TCP_NONCE))
    return braid__fail(c, BRAID_ERR_SYSTEM, "could not compute a handshake proof (libcrypto)");
  memcpy(pl, k->nonce_s, BRAID_TCP_NONCE);
  put_hs(k, c->id, BRAID_TCP_HELLO_ACK, 0, pl, sizeof pl);
  k->seq_out = 1;
  k->state = C_IN_AUTH;
  return tcp_flush(c, s, k);
}

static braid_status auth(braid_comm *c, tcp_state *s, tcp_conn *k) {
  uint8_t want[BRAID_TCP_MAC];
  if (braid__tcp_mac(s->key, TCP_KEY_LEN, 0, c->id, (uint32_t)k->peer, (uint32_t)s->me, (uint32_t)k->idx, k->nonce_c,
                     k->nonce_s, want))
    return braid__fail(c, BRAID_ERR_SYSTEM, "could not compute a handshake proof (libcrypto)");
  if (!braid__ct_equal(want, k->small, BRAID_TCP_MAC)) {
    char why[96];
    snprintf(why, sizeof why, "wrong proof of the job token (claimed to be rank %d)", braid__label(c, k->peer));
    k->peer = -1;
    tcp_refuse(c, s, k, why);
    return BRAID_OK;
  }
  tcp_peer *p = &s->peers[k->peer];
  if (p->in[k->idx]) { /* another socket won the slot meanwhile */
    k->peer = -1;
    tcp_refuse(c, s, k, "a second authenticated socket with the same index");
    return BRAID_OK;
  }
  /* Authenticated: data frames may already follow in the buffer. */
  char *nb = malloc(TCP_RBUF);
  if (!nb) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for a read buffer");
  memcpy(nb, k->rbuf + k->rpos, k->rlen - k->rpos);
  k->rlen -= k->rpos;
  k->rpos = 0;
  free(k->rbuf);
  k->rbuf = nb;
  k->rcap = TCP_RBUF;
  k->state = C_IN_READY;
  unauth_done(s);
  p->in[k->idx] = k;
  p->nin++;
  BLOG_DEBUG(BRAID_SUB_TCP, c->rank, "rank %d's socket %d from %s authenticated", k->peer, k->idx, k->where);
  return BRAID_OK;
}

static braid_status hello_ack(braid_comm *c, tcp_state *s, tcp_conn *k) {
  uint8_t want[BRAID_TCP_MAC];
  memcpy(k->nonce_s, k->small, BRAID_TCP_NONCE);
  if (braid__tcp_mac(s->key, TCP_KEY_LEN, 1, c->id, (uint32_t)s->me, (uint32_t)k->peer, (uint32_t)k->idx, k->nonce_c,
                     k->nonce_s, want))
    return braid__fail(c, BRAID_ERR_SYSTEM, "could not compute a handshake proof (libcrypto)");
  if (!braid__ct_equal(want, k->small + BRAID_TCP_NONCE, BRAID_TCP_MAC))
    return braid__fail(c, BRAID_ERR_PEER_LOST,
                       "the process at rank %d's address %s did not prove the job token: another job's process, or a "
                       "rank started with another BRAID_TOKEN",
                       braid__label(c, k->peer), k->where);
  uint8_t mac[BRAID_TCP_MAC];
  if (braid__tcp_mac(s->key, TCP_KEY_LEN, 0, c->id, (uint32_t)s->me, (uint32_t)k->peer, (uint32_t)k->idx, k->nonce_c,
                     k->nonce_s, mac))
    return braid__fail(c, BRAID_ERR_SYSTEM, "could not compute a handshake proof (libcrypto)");
  put_hs(k, c->id, BRAID_TCP_AUTH, 1, mac, sizeof mac);
  k->state = C_READY;
  braid_status st = tcp_flush(c, s, k);
  if (!st && s->peers[k->peer].nstream) st = tcp_feed(c, s, k->peer);
  return st;
}

braid_status tcp_handshake(braid_comm *c, tcp_state *s, tcp_conn *k) {
  switch (k->h.type) {
  case BRAID_TCP_HELLO: return hello(c, s, k);
  case BRAID_TCP_AUTH: return auth(c, s, k);
  case BRAID_TCP_HELLO_ACK: return hello_ack(c, s, k);
  default: return braid__fail(c, BRAID_ERR_INTERNAL, "frame type %u is not a handshake frame", k->h.type);
  }
}

/* ---------------------------------------------------------------- strangers */

void tcp_refuse(braid_comm *c, tcp_state *s, tcp_conn *k, const char *why) {
  double now = braid__now();
  if (now >= s->refuse_next) {
    if (s->refused)
      BLOG_WARN(BRAID_SUB_TCP, c->rank, "tcp: refused a connection from %s: %s (and %d more since the last warning)",
                k->where, why, s->refused);
    else BLOG_WARN(BRAID_SUB_TCP, c->rank, "tcp: refused a connection from %s: %s", k->where, why);
    s->refuse_next = now + 10.0;
    s->refused = 0;
  } else {
    s->refused++;
    BLOG_DEBUG(BRAID_SUB_TCP, c->rank, "tcp: refused a connection from %s: %s", k->where, why);
  }
  if (k->fd >= 0) tcp_conn_close(s, k);
}

braid_status tcp_expire(braid_comm *c, tcp_state *s) {
  const double now = braid__now();
  if (s->listen_paused && now >= s->accept_retry && s->nunauth >= TCP_MAX_UNAUTH) {
    /* Paused at the cap: a connection waiting in the backlog may take the
       place of a silent one (closing it resumes the listener). */
    struct pollfd pl = {.fd = s->lfd, .events = POLLIN};
    braid_status st = BRAID_OK;
    if (poll(&pl, 1, 0) > 0) (void)make_room(c, s, now, &st);
    if (st) return st;
  }
  listener_resume(s, now);
  if (!s->nunauth) return BRAID_OK;
  for (tcp_conn *k = s->conns; k; k = k->next) {
    if (!tcp_in_handshake(k) || now < k->auth_deadline) continue;
    /* What it sent may wait unread (this rank was away from braid, or the
       last pass took fewer events than were ready): read it first. */
    braid_status st = tcp_read(c, s, k);
    if (st) return st;
    if (tcp_in_handshake(k) && now >= k->auth_deadline)
      tcp_refuse(c, s, k, "no complete handshake within 10 s");
  }
  return BRAID_OK;
}

/* ---------------------------------------------------------------- closed sockets */

int tcp_peer_gone(const tcp_state *s, int q) {
  const tcp_peer *p = &s->peers[q];
  if (!p->bye || p->nin) return 0;
  /* q says goodbye on every socket it has with this rank, after whatever
     else it sent there (a FAIL saying why it leaves): until each of them
     has, something may still come. */
  for (int i = 0; i < BRAID_TCP_MAX_SOCKS; i++)
    if (p->out[i] && !p->out[i]->bye) return 0;
  /* A socket of q's still in its handshake may carry data q counted as
     sent (it writes once this rank's HELLO_ACK is in). */
  for (const tcp_conn *k = s->conns; k; k = k->next)
    if (k->state == C_IN_AUTH && k->peer == q) return 0;
  return 1;
}

int tcp_pending_with(braid_comm *c, tcp_state *s, int q) {
  tcp_peer *p = &s->peers[q];
  if (p->sends || p->recvs) return 1;
  return braid__match_posted_from(c, q);
}

int tcp_sweep(braid_comm *c, tcp_state *s) {
  if (!s->sweeping) {
    s->sweeping = 1;
    for (tcp_conn *k = s->conns; k && !atomic_load(&c->failed); k = k->next)
      if (tcp_conn_ready(k)) (void)tcp_read(c, s, k);
    s->sweeping = 0;
  }
  if (atomic_load(&c->failed)) return 1;
  /* The origin also published its failure in the store, where a rank with
     no socket path to it finds it. */
  return braid__poll_remote_failure(c, 1);
}

braid_status tcp_fail_gone(braid_comm *c, tcp_state *s, int q, const char *what) {
  /* A peer that failed and left said why: that is the error to report. */
  if (tcp_sweep(c, s)) return (braid_status)atomic_load(&c->failed);
  char name[112], desc[192];
  tcp_peer_name(c, s, q, name, sizeof name);
  if (!what) {
    braid__describe_pending(c, desc, sizeof desc);
    what = desc;
  }
  return braid__fail(c, BRAID_ERR_PEER_LOST,
                     "%s destroyed its communicator during %s while this rank waited for it: %s", name,
                     c->call ? c->call : "braid", what);
}

/* A socket of this rank's that q closed before this rank's HELLO went,
   with frames queued: a rank holding TCP_MAX_UNAUTH sockets in their
   handshake closes one that said nothing, and this rank's HELLO leaves
   only at its next progress pass, so a rank that sent and then computed
   may be taken for a stranger. Nothing crossed that socket yet, so it is
   dialled again (the same index, queue and sequence), up to TCP_REDIALS
   times within the timeout since the first such close. A close after the
   HELLO (a refusal), a refused connect, a goodbye or a published failure
   end it as before. */
static int may_redial(const braid_comm *c, const tcp_state *s, const tcp_conn *k, int err) {
  if (k->state != C_CONNECTING || !k->qhead || (err && err != ECONNRESET)) return 0;
  if (s->peers[k->peer].bye || atomic_load(&c->failed) || k->redials >= TCP_REDIALS) return 0;
  return !k->redialed || c->timeout_s <= 0 || braid__now() - k->redialed < c->timeout_s;
}

static braid_status redial(braid_comm *c, tcp_state *s, tcp_conn *k) {
  BLOG_INFO(BRAID_SUB_TCP, c->rank,
            "rank %d closed socket %d of this rank's before its handshake ended (crowded by other connections?): "
            "connecting again",
            braid__label(c, k->peer), k->idx);
  int fd, r;
  braid_status st = dial(c, s, k->peer, &fd, &r);
  if (st) {
    tcp_conn_close(s, k);
    return st;
  }
  epoll_ctl(s->epfd, EPOLL_CTL_DEL, k->fd, NULL);
  close(k->fd);
  k->fd = fd;
  if (!k->redialed) k->redialed = braid__now();
  k->redials++;
  k->state = C_CONNECTING;
  k->hs_len = k->hs_done = 0;
  k->rpos = k->rlen = 0;
  k->in_body = 0;
  k->seq_in = 0;
  if (watch_new(s, k) != 0) {
    int e = errno;
    tcp_conn_close(s, k);
    return braid__fail_comm(c, BRAID_ERR_SYSTEM, "could not watch a new socket to rank %d: %s",
                            braid__label(c, k->peer), strerror(e));
  }
  if (r == 0) return tcp_connected(c, s, k);
  return BRAID_OK;
}

braid_status tcp_conn_lost(braid_comm *c, tcp_state *s, tcp_conn *k, int err) {
  if (tcp_in_handshake(k)) {
    BLOG_DEBUG(BRAID_SUB_TCP, c->rank, "an unauthenticated connection from %s closed", k->where);
    tcp_conn_close(s, k);
    return BRAID_OK;
  }
  int q = k->peer;
  if (k->state == C_CONNECTING || k->state == C_WAIT_ACK) {
    int queued = k->qhead != NULL;
    if (may_redial(c, s, k, err)) {
      /* What the sweep reads may say q left or failed: then no redial. */
      if (tcp_sweep(c, s)) {
        tcp_conn_close(s, k);
        return (braid_status)atomic_load(&c->failed);
      }
      if (may_redial(c, s, k, err)) return redial(c, s, k);
    }
    tcp_conn_close(s, k);
    /* Nothing crosses a socket before its handshake ends, and a peer that
       leaves closes those still in theirs without a goodbye: one with
       nothing waiting to go lost nothing. Whether the peer left or died its
       other sockets tell, and a later need connects again. */
    if (!queued) {
      BLOG_DEBUG(BRAID_SUB_TCP, c->rank, "socket %d to rank %d closed during its handshake (%s)", k->idx,
                 braid__label(c, q), err ? strerror(err) : "end of file");
      return BRAID_OK;
    }
    if (tcp_sweep(c, s)) return (braid_status)atomic_load(&c->failed);
    return braid__fail(c, BRAID_ERR_PEER_LOST, "could not connect to rank %d at %s: %s", braid__label(c, q), k->where,
                       err ? strerror(err) : "the connection closed during the handshake");
  }
  if (err && !k->reading) {
    /* A failed write may come before the last frames the peer sent (its
       FAIL and BYE): those are read first; reading ends the socket too. */
    braid_status st = tcp_read(c, s, k);
    if (k->state == C_CLOSED || st) return st;
  }
  int bye = k->bye, out = k->out, queued = k->qhead != NULL;
  char name[112];
  tcp_peer_name(c, s, q, name, sizeof name);
  tcp_conn_close(s, k);
  if (!bye) {
    if (tcp_sweep(c, s)) return (braid_status)atomic_load(&c->failed);
    char desc[192];
    braid__describe_pending(c, desc, sizeof desc);
    if (!err)
      return braid__fail(c, BRAID_ERR_PEER_LOST,
                         "%s closed its connection without a goodbye during %s (its process died or ended without "
                         "braid_destroy); this rank was waiting for %s",
                         name, c->call ? c->call : "braid", desc);
    return braid__fail(c, BRAID_ERR_PEER_LOST,
                       "%s: the connection failed during %s (%s: its process died, or the network between the ranks "
                       "failed); this rank was waiting for %s",
                       name, c->call ? c->call : "braid", strerror(err), desc);
  }
  /* It said goodbye: a failure only for what this rank still exchanges with it. */
  if ((out && (queued || s->peers[q].sends)) || (tcp_peer_gone(s, q) && tcp_pending_with(c, s, q)))
    return tcp_fail_gone(c, s, q, NULL);
  return BRAID_OK;
}
