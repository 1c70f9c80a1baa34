/* Backend "tcp": ranks on any hosts over TCP sockets, driven by the core's
   progress engine (epoll, no threads). Internal layout shared by
   tcp_frame.c (the wire format), tcp_conn.c (listener, addresses, lazy
   connects, the authenticated handshake, closing), tcp_io.c (per-connection
   read and write machines, messages, progress) and tcp.c (init, destroy,
   abort, failures, the table).

   Connections carry data one way: rank i sends to j only over the sockets i
   opened to j (socket 0 in order: EAGER, RTS, CTS; DATA striped over all
   of them); the sockets i accepted carry what others send to i. The other
   direction of a socket carries the handshake reply, FAIL and BYE only. */
#ifndef BRAID_TCP_H
#define BRAID_TCP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "backends/tcp/tcp_frame.h"
#include "core/comm.h"

#define TCP_CHUNK ((size_t)512 << 10)      /* payload of a DATA frame */
#define TCP_DATA_MAX ((uint64_t)16 << 20)  /* largest DATA payload a receiver accepts */
#define TCP_EAGER_LIMIT ((size_t)64 << 20) /* largest BRAID_TCP_EAGER_MAX: what any receiver accepts */
#define TCP_RBUF ((size_t)64 << 10)        /* read buffer of an authenticated incoming socket */
#define TCP_RBUF_SMALL ((size_t)1 << 10)   /* ... of a socket in its handshake or an outgoing one */
#define TCP_DIRECT_MIN ((size_t)16 << 10)  /* payload left from which recv() goes straight to its buffer */
#define TCP_HDR_READ ((size_t)1 << 10)     /* recv() size for headers after a large payload */
_Static_assert(TCP_HDR_READ > BRAID_TCP_HDR, "a header read must hold a whole header");
#define TCP_READ_BUDGET ((size_t)8 << 20)  /* bytes one socket may read per progress pass (fairness) */
#define TCP_DATA_DEPTH 2                   /* DATA frames queued per socket */
#define TCP_AUTH_TIMEOUT_S 10.0            /* an accepted socket must authenticate within this */
#define TCP_MAX_UNAUTH 64                  /* accepted sockets still in their handshake, at most */
#define TCP_ACCEPT_RETRY_S 0.1             /* after accept failed, the listener rests this long */
#define TCP_SILENT_S 0.5                   /* at the cap, a socket silent this long since accept may go */
#define TCP_REDIALS 16                     /* a socket closed before its HELLO went is dialled again at most this often */
#define TCP_KEY_LEN 32

/* Connection states. Outgoing: CONNECTING -> WAIT_ACK -> READY. Incoming:
   IN_HELLO -> IN_AUTH -> IN_READY. CLOSED: fd closed, waiting to be freed. */
enum { C_CONNECTING = 1, C_WAIT_ACK, C_READY, C_IN_HELLO, C_IN_AUTH, C_IN_READY, C_CLOSED };

/* Send states, then receive states: R_EAGER, a matched eager payload
   arriving; R_DATA, CTS sent and DATA arriving. */
enum { S_EAGER = 1, S_CTS_WAIT, S_STREAM, R_EAGER, R_DATA };

typedef struct tcp_req {
  braid__req base;
  struct tcp_req *lnext, *lprev; /* the peer's sends or rendezvous receives */
  uint64_t msgid;
  size_t off;  /* send: bytes handed to DATA frames */
  size_t done; /* send: bytes written; receive: bytes arrived */
  uint64_t seen1;  /* rendezvous receive: pieces whose DATA frame started, when at most 64 */
  uint64_t *seen;  /* ... or here (allocated) for more */
  int state;
} tcp_req;

typedef struct tcp_umsg {
  braid__umsg base;
  int rndv;
  uint64_t msgid; /* rndv: the sender's message to ask for */
  char *data;     /* eager: the payload */
  size_t cap;     /* data's size class (tcp_ubuf_get), 0: plain malloc */
} tcp_umsg;

/* A frame queued on a socket: header, then payload (the sender's buffer or
   owned). */
typedef struct tcp_frame {
  struct tcp_frame *next;
  tcp_req *req; /* EAGER: completes when written; DATA: its bytes count */
  const char *payload;
  char *owned;
  size_t plen, done; /* done: bytes of header + payload written */
  uint8_t type;
  uint8_t hdr[BRAID_TCP_HDR];
} tcp_frame;

typedef struct tcp_conn {
  int fd;
  int peer; /* -1 until an incoming socket's HELLO */
  int idx;  /* socket index in the sender's set */
  int out;  /* this rank connected */
  int state;
  int bye;     /* the peer said BYE on this socket */
  int reading; /* inside tcp_read (its state must not be read again meanwhile) */
  uint32_t events;
  uint64_t seq_out, seq_in;
  char where[80]; /* the remote end, "host:port", for messages */
  /* writing: handshake bytes first, then the frame queue (only once ready) */
  uint8_t hs[BRAID_TCP_HDR + BRAID_TCP_ACK_LEN];
  size_t hs_len, hs_done;
  tcp_frame *qhead, *qtail;
  int ndata; /* DATA frames queued */
  /* reading */
  char *rbuf;
  size_t rcap, rpos, rlen;
  int in_body;                       /* header read, payload in progress */
  int bulk;                          /* the last frame's payload filled rbuf or more: read headers TCP_HDR_READ at a time */
  braid__tcp_hdr h;                  /* the frame being read */
  char *dest;                        /* where the payload goes; NULL: discarded */
  size_t left;                       /* payload bytes still to read */
  tcp_req *rr;                       /* the receive it fills */
  tcp_umsg *ru;                      /* or the unexpected message */
  uint8_t small[BRAID_TCP_FAIL_MAX]; /* handshake and FAIL payloads */
  uint8_t nonce_c[BRAID_TCP_NONCE], nonce_s[BRAID_TCP_NONCE];
  double accepted;       /* when this rank accepted it */
  double redialed;       /* an outgoing socket: when the peer first closed it before its HELLO went (0: never) */
  int redials;           /* ... and how often */
  double auth_deadline;
  struct tcp_conn *next; /* every connection of the communicator */
} tcp_conn;

typedef struct tcp_peer {
  tcp_conn *out[BRAID_TCP_MAX_SOCKS]; /* this rank's sockets to it */
  tcp_conn *in[BRAID_TCP_MAX_SOCKS];  /* its sockets to this rank (authenticated) */
  int nin;                            /* of those, open */
  int bye;                            /* it said BYE on some socket */
  int known;                          /* its address was read from the store */
  int local;                          /* on this host: loopback or this rank's own address */
  struct sockaddr_storage sa;
  socklen_t salen;
  char where[80]; /* its listener, "host:port" */
  uint64_t next_msgid;
  tcp_req *sends; /* every unfinished send to it (any state), oldest first */
  tcp_req *recvs; /* rendezvous receives from it, CTS sent */
  int nstream;    /* sends with DATA left to queue */
} tcp_peer;

typedef struct tcp_keyref tcp_keyref;

#define TCP_UBUF_MIN_SHIFT 12 /* smaller payloads: plain malloc (never trimmed) */
#define TCP_UBUF_CLASSES 15   /* 4 KiB ... 64 MiB, the eager limit's range */
#define TCP_UBUF_KEEP_MAX ((size_t)64 << 20)

/* Congestion control of the sockets a rank sends on (BRAID_TCP_CONGESTION). */
enum { TCP_CC_AUTO, TCP_CC_SYSTEM, TCP_CC_NAMED };
#define TCP_CC_LEN 16 /* the kernel's longest name, with its terminator */

typedef struct tcp_state {
  int n, me;
  int nsocks;
  size_t eager_max, sockbuf;
  size_t notsent; /* TCP_NOTSENT_LOWAT of sockets to other hosts (0: none) */
  int cc_mode;    /* BRAID_TCP_CONGESTION: TCP_CC_AUTO, _SYSTEM or _NAMED (cc_name) */
  char cc_name[TCP_CC_LEN];
  int ka_idle, ka_intvl, ka_cnt; /* keepalive, from BRAID_TIMEOUT */
  int epfd, evfd, lfd;           /* epoll set, abort eventfd, listener (-1 for one rank) */
  char laddr[64];
  struct sockaddr_storage lsa; /* laddr parsed (family 0 if it did not parse) */
  int lport;
  uint8_t key[TCP_KEY_LEN];
  tcp_keyref *keyref; /* the world's generated secret, shared with its children */
  tcp_peer *peers;
  tcp_conn *conns; /* every connection, open or closed */
  int nclosed;     /* closed ones to free */
  int nunauth;     /* accepted sockets in their handshake */
  /* The listener leaves the epoll set while TCP_MAX_UNAUTH sockets are in
     their handshake, or for a while after accept failed (out of
     descriptors, say): connections wait in the kernel's backlog. */
  int listen_paused;
  double accept_retry;      /* accept failed: not again before this */
  double accept_warn_next;  /* rate limit of that warning */
  int nstream;     /* peers with DATA to queue */
  tcp_frame *free_frames;
  /* Payload buffers of unexpected messages kept for reuse, one list per
     power-of-two class (linked through their first bytes). Freeing each one
     let glibc trim the heap top and fault the pages in again on the next
     burst (a root running ahead leaves many such messages in flight). */
  char *ubuf[TCP_UBUF_CLASSES];
  size_t ubuf_bytes, ubuf_keep; /* kept, and at most that much */
  /* failures */
  braid_status err;           /* the first failure progress found */
  _Atomic uint32_t fail_flag; /* a FAIL frame arrived */
  int fail_status, fail_origin;
  char fail_text[BRAID_TCP_FAIL_TEXT + 1];
  uint64_t desc_seq;  /* the collective whose descriptor this rank published */
  int sweeping;       /* inside tcp_sweep */
  double refuse_next; /* rate limit of the refused-connection warning */
  int refused;        /* refused since the last warning */
  /* the epoll tags of the listener and the eventfd */
  char tag_listen, tag_abort;
} tcp_state;

static inline int tcp_conn_ready(const tcp_conn *k) { return k->state == C_READY || k->state == C_IN_READY; }
/* An accepted socket in its handshake (counted in nunauth). */
static inline int tcp_in_handshake(const tcp_conn *k) { return k->state == C_IN_HELLO || k->state == C_IN_AUTH; }

/* tcp_conn.c */
/* Listener and address publication, every peer's address, the shared secret. */
braid_status tcp_listen(braid_comm *c, tcp_state *s);
braid_status tcp_addresses(braid_comm *c, tcp_state *s);
braid_status tcp_key_setup(braid_comm *c, tcp_state *s);
void tcp_key_release(tcp_state *s);
/* BRAID_TCP_CONGESTION read and, when it names an algorithm, tried on a
   socket (an error naming the variable when the kernel refuses it). */
braid_status tcp_congestion_params(braid_comm *c, tcp_state *s);
/* What a socket that sends to a peer (local: on this host) should run
   instead of cur, its congestion control now; NULL to keep cur. */
const char *tcp_congestion_want(int mode, const char *named, int local, const char *cur);
/* The outgoing socket idx to q, opened (non-blocking connect) if needed. */
braid_status tcp_out_conn(braid_comm *c, tcp_state *s, int q, int idx, tcp_conn **out);
/* Accepts what the listener has. */
braid_status tcp_accept(braid_comm *c, tcp_state *s);
/* The outgoing socket's connect finished (EPOLLOUT while CONNECTING). */
braid_status tcp_connected(braid_comm *c, tcp_state *s, tcp_conn *k);
/* A handshake frame whose payload is in k->small. */
braid_status tcp_handshake(braid_comm *c, tcp_state *s, tcp_conn *k);
/* The socket ended (EOF: err 0, else an errno): closes it and decides
   whether that fails the communicator. */
braid_status tcp_conn_lost(braid_comm *c, tcp_state *s, tcp_conn *k, int err);
/* A stranger's socket broke the rules: logged (rate-limited) and closed. */
void tcp_refuse(braid_comm *c, tcp_state *s, tcp_conn *k, const char *why);
void tcp_conn_close(tcp_state *s, tcp_conn *k);
/* Frees closed connections (after an event batch, when nothing points at them). */
void tcp_reap(tcp_state *s);
/* Closes accepted sockets past their authentication deadline. */
braid_status tcp_expire(braid_comm *c, tcp_state *s);
/* Updates the socket's epoll interest to what it waits for. */
void tcp_watch(tcp_state *s, tcp_conn *k);
/* Peer q destroyed its communicator and nothing more can come from it. */
int tcp_peer_gone(const tcp_state *s, int q);
/* This rank has a send to q or a receive from q not complete. */
int tcp_pending_with(braid_comm *c, tcp_state *s, int q);
/* "rank 2 (10.0.0.2:41234)". */
void tcp_peer_name(const braid_comm *c, const tcp_state *s, int q, char *out, size_t len);
/* Fails c because q is gone while this rank waits for it. */
braid_status tcp_fail_gone(braid_comm *c, tcp_state *s, int q, const char *what);
/* Before a lost socket fails the communicator: reads what every other
   socket holds, since a FAIL frame there says why the peer left. 1 when c
   failed meanwhile (with that cause, relayed), else 0. */
int tcp_sweep(braid_comm *c, tcp_state *s);

/* tcp_io.c */
tcp_frame *tcp_frame_new(tcp_state *s);
void tcp_frame_free(tcp_state *s, tcp_frame *f);
/* Drops every frame queued on k. */
void tcp_queue_clear(tcp_state *s, tcp_conn *k);
/* A payload buffer of at least len bytes; *cap is what tcp_ubuf_put needs. */
char *tcp_ubuf_get(tcp_state *s, size_t len, size_t *cap);
void tcp_ubuf_put(tcp_state *s, char *p, size_t cap);
void tcp_ubuf_drain(tcp_state *s);
/* Encodes h with the socket's next sequence number into f and queues it. */
void tcp_enqueue(tcp_conn *k, tcp_frame *f, braid__tcp_hdr *h);
/* Sockets this rank stripes large messages over to q: one to a rank on
   this host, whose bytes one socket moves as fast as the CPUs copy them. */
static inline int tcp_nsocks(const tcp_state *s, int q) { return s->peers[q].local ? 1 : s->nsocks; }
/* Queues a control frame ahead of the DATA frames not yet started (the
   frames behind it are renumbered). */
void tcp_enqueue_urgent(tcp_conn *k, tcp_frame *f, braid__tcp_hdr *h);
/* Writes what the socket can take now. */
braid_status tcp_flush(braid_comm *c, tcp_state *s, tcp_conn *k);
/* Reads what the socket has (bounded per call). */
braid_status tcp_read(braid_comm *c, tcp_state *s, tcp_conn *k);
/* A header with the communicator id and the fields of a frame type. */
braid__tcp_hdr tcp_hdr(uint64_t comm, int type);
/* Sends a FAIL frame (origin's status and sentence) on every
   authenticated socket whose queue is idle, without waiting. */
void tcp_say_fail(braid_comm *c, tcp_state *s, int st, int origin, const char *text);
/* Leaving: closes the listener and the sockets still in their handshake,
   queues BYE on the others and writes until every queue is empty, a peer
   closed its end, or the deadline passes. */
void tcp_goodbye(braid_comm *c, tcp_state *s, double deadline);
/* Queues DATA of the streaming sends to q on its ready sockets. */
braid_status tcp_feed(braid_comm *c, tcp_state *s, int q);
/* Drops every request the peers' lists hold (destroy). */
void tcp_drop_all(braid_comm *c, tcp_state *s);

braid_status tcp_isend(braid_comm *c, braid__req *r);
braid_status tcp_irecv(braid_comm *c, braid__req *r);
braid_status tcp_progress(braid_comm *c);
braid_status tcp_take(braid_comm *c, braid__req *r, braid__umsg *u);
void tcp_release_umsg(braid_comm *c, braid__umsg *u);
int tcp_arm(braid_comm *c);
void tcp_sleep(braid_comm *c, double slice_s);
void tcp_disarm(braid_comm *c);

/* Test hooks (tests/unit/test_tcp.c). The address and port of this rank's
   listener (-1 without one). */
int braid__tcp_test_listener(braid_comm *c, char *addr, size_t len);
/* Writes len raw bytes on this rank's authenticated socket 0 to peer
   (connecting first, within the communicator's timeout), as if they were its
   next frame; patch != 0 first sets the frame's comm id and seq fields to
   what the peer expects, so a test can corrupt one other field. */
braid_status braid__tcp_test_raw(braid_comm *c, int peer, void *bytes, size_t len, int patch);

#endif
