/* A fixed one-way link delay for the multi-host tests on kernels without
   netem: every packet an iptables rule sends to NFQUEUE QUEUE is held here
   for DELAY_MS and then let go, in arrival order. The kernel keeps the
   packets; this program only sees their ids (no payload is copied) and
   gives each verdict when it is due.

     braid_netdelay QUEUE DELAY_MS READY_FILE

   READY_FILE is created once the queue is bound (a rule that queues to an
   unbound queue drops the packets). SIGTERM or SIGINT ends it; it then
   prints "netdelay: queue Q: N packets held, min M ms, max X ms" (the
   packets it held the whole delay). A queue that overflows drops packets,
   as a full netem queue does. */
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef SOL_NETLINK
#define SOL_NETLINK 270
#endif
#ifndef NETLINK_NO_ENOBUFS
#define NETLINK_NO_ENOBUFS 5
#endif

/* linux/netfilter.h has them, but clashes with netinet/in.h. */
#ifndef NF_ACCEPT
#define NF_DROP 0
#define NF_ACCEPT 1
#endif

#define RING (1u << 16) /* packets held at once; also the kernel queue's length */

typedef struct held {
  uint32_t id;
  double t; /* when it arrived */
} held;

static held ring[RING];
static unsigned head, tail; /* tail - head packets held */
static unsigned long long nheld;
static double min_hold = 1e9, max_hold;
static volatile sig_atomic_t stop;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *arg) {
  (void)msg, (void)arg;
  struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
  if (!ph) return 0;
  uint32_t id = ntohl(ph->packet_id);
  if (tail - head == RING) /* cannot happen: the kernel's queue is no longer */
    return nfq_set_verdict(qh, id, NF_DROP, 0, NULL);
  ring[tail % RING] = (held){id, now_s()};
  tail++;
  return 0;
}

/* Lets go every packet held for at least delay, counted in the figures
   printed at the end unless flushing; the time to the next one due (s), or
   -1. */
static double release(struct nfq_q_handle *qh, double delay, int flushing) {
  double t = now_s();
  while (head != tail) {
    held *p = &ring[head % RING];
    double hold = t - p->t;
    if (hold < delay) return delay - hold;
    nfq_set_verdict(qh, p->id, NF_ACCEPT, 0, NULL);
    head++;
    if (flushing) continue;
    if (hold < min_hold) min_hold = hold;
    if (hold > max_hold) max_hold = hold;
    nheld++;
  }
  return -1;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: braid_netdelay QUEUE DELAY_MS READY_FILE\n");
    return 2;
  }
  int qnum = atoi(argv[1]);
  double delay = atof(argv[2]) / 1e3;
  struct nfq_handle *h = nfq_open();
  if (!h) {
    perror("netdelay: nfq_open");
    return 1;
  }
  if (nfq_bind_pf(h, AF_INET) < 0) {
    perror("netdelay: nfq_bind_pf");
    return 1;
  }
  struct nfq_q_handle *qh = nfq_create_queue(h, (uint16_t)qnum, on_packet, NULL);
  if (!qh) {
    perror("netdelay: nfq_create_queue");
    return 1;
  }
  /* Ids only; a GSO packet stays one packet (no payload crosses anyway). */
  if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0 || nfq_set_queue_maxlen(qh, RING) < 0 ||
      nfq_set_queue_flags(qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO) < 0) {
    perror("netdelay: configuring the queue");
    return 1;
  }
  int fd = nfq_fd(h);
  nfnl_rcvbufsiz(nfq_nfnlh(h), 16u << 20);
  int one = 1;
  setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  FILE *ready = fopen(argv[3], "w");
  if (!ready) {
    perror("netdelay: the ready file");
    return 1;
  }
  fclose(ready);

  static char buf[1 << 16] __attribute__((aligned));
  while (!stop) {
    double next = release(qh, delay, 0);
    struct pollfd pfd = {fd, POLLIN, 0};
    double wait = next < 0 ? 0.1 : next;
    struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
    if (ppoll(&pfd, 1, &ts, NULL) < 0 && errno != EINTR) {
      perror("netdelay: ppoll");
      break;
    }
    for (;;) {
      ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n < 0) break; /* EAGAIN: read all; other errors show up again at the next poll */
      nfq_handle_packet(h, buf, (int)n);
    }
  }
  /* Whatever is still held goes now, uncounted (it was not held the
     delay): the links are being taken down. */
  release(qh, 0, 1);
  printf("netdelay: queue %d: %llu packets held, min %.3f ms, max %.3f ms\n", qnum, nheld,
         nheld ? min_hold * 1e3 : 0.0, max_hold * 1e3);
  nfq_destroy_queue(qh);
  nfq_close(h);
  return 0;
}
