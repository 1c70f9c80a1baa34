/* A communicator used from several threads: calls are serialized inside braid,
   a blocked braid_sync lets other threads' sends through, braid_abort from any
   thread wakes every waiter. Also runs under ThreadSanitizer (make test-tsan). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "os/time.h"

static braid_comm *new_comm(double timeout_s) {
  braid_config cfg = BRAID_CONFIG_INIT;
  cfg.backend = "self";
  cfg.rank = 0;
  cfg.world_size = 1;
  cfg.timeout_s = timeout_s;
  braid_comm *c = NULL;
  if (braid_init(&cfg, &c) != BRAID_OK) {
    fprintf(stderr, "braid_init: %s\n", braid_last_error(NULL));
    exit(1);
  }
  return c;
}

typedef struct worker {
  braid_comm *c;
  int id;
  int failures;
} worker;

/* Each thread uses its own tag, so its messages pair with its own receives
   whatever the interleaving with other threads. */
static void *hammer(void *p) {
  worker *w = p;
  for (int i = 0; i < 2000; i++) {
    int v[3] = {w->id, i, -i}, got[3] = {0};
    float f[5] = {1, 2, 3, 4, (float)i};
    if (braid_send(w->c, v, 3, BRAID_I32, 0, (uint32_t)w->id) != BRAID_OK) w->failures++;
    if (braid_all_reduce(w->c, f, 5, BRAID_F32, BRAID_SUM) != BRAID_OK || f[4] != (float)i) w->failures++;
    if (braid_recv(w->c, got, 3, BRAID_I32, 0, (uint32_t)w->id) != BRAID_OK) w->failures++;
    if (braid_sync(w->c) != BRAID_OK) w->failures++;
    if (memcmp(v, got, sizeof v) != 0) w->failures++;
    /* A rejected argument from one thread does not disturb the others. */
    if (braid_broadcast(w->c, f, 1, BRAID_F32, 3) != BRAID_ERR_INVALID_ARG) w->failures++;
    (void)braid_last_error(w->c);
  }
  return NULL;
}

static int test_concurrent_calls(void) {
  braid_comm *c = new_comm(30);
  enum { N = 4 };
  pthread_t t[N];
  worker w[N];
  for (int i = 0; i < N; i++) {
    w[i] = (worker){c, i + 1, 0};
    BT_CHECK(pthread_create(&t[i], NULL, hammer, &w[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < N; i++) BT_CHECK(w[i].failures == 0, "thread %d saw %d failures", i, w[i].failures);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

typedef struct late_sender {
  braid_comm *c;
  double delay;
  int value;
  braid_status st;
} late_sender;

static void *send_later(void *p) {
  late_sender *s = p;
  braid__sleep(s->delay);
  s->st = braid_send(s->c, &s->value, 1, BRAID_I32, 0, 77);
  return NULL;
}

static int test_sync_waits_for_other_thread(void) {
  braid_comm *c = new_comm(30);
  int got = 0;
  late_sender s = {c, 0.1, 4242, BRAID_ERR_INTERNAL};
  BT_CHECK_OK(braid_recv(c, &got, 1, BRAID_I32, 0, 77), c);
  pthread_t t;
  BT_CHECK(pthread_create(&t, NULL, send_later, &s) == 0, "pthread_create");
  BT_CHECK_OK(braid_sync(c), c);
  pthread_join(t, NULL);
  BT_CHECK(s.st == BRAID_OK, "send from the other thread: %s", braid_status_string(s.st));
  BT_CHECK(got == 4242, "got %d", got);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

/* Another thread's call, let in while braid_sync waits, leaves the waiting
   call's name (and flight-recorder entry) in place: the timeout names
   braid_sync. */
static int test_waiting_call_keeps_its_name(void) {
  braid_comm *c = new_comm(0.6);
  int got = 0;
  late_sender s = {c, 0.1, 5, BRAID_ERR_INTERNAL};
  BT_CHECK_OK(braid_recv(c, &got, 1, BRAID_I32, 0, 78), c); /* the other thread sends on tag 77 */
  pthread_t t;
  BT_CHECK(pthread_create(&t, NULL, send_later, &s) == 0, "pthread_create");
  BT_CHECK_ST(braid_sync(c), BRAID_ERR_TIMEOUT, c);
  pthread_join(t, NULL);
  BT_CHECK(s.st == BRAID_OK, "send from the other thread: %s", braid_status_string(s.st));
  BT_CHECK_MSG(c, "braid_sync: timed out");
  braid_destroy(c);
  return 0;
}

/* braid_destroy from the thread a waiting braid_sync let in is refused
   (freeing c would pull it from under the wait) and leaves c intact; the
   send then completes the wait and destroy works. */
typedef struct waiter {
  braid_comm *c;
  braid_status st;
  _Atomic int started;
} waiter;

static void *sync_now(void *p) {
  waiter *w = p;
  atomic_store(&w->started, 1);
  w->st = braid_sync(w->c);
  return NULL;
}

static int test_destroy_under_waiter(void) {
  braid_comm *c = new_comm(30);
  int got = 0;
  BT_CHECK_OK(braid_recv(c, &got, 1, BRAID_I32, 0, 8), c);
  waiter w = {c, BRAID_ERR_INTERNAL, 0};
  pthread_t t;
  BT_CHECK(pthread_create(&t, NULL, sync_now, &w) == 0, "pthread_create");
  while (!atomic_load(&w.started)) braid__sleep(0.001);
  braid__sleep(0.2); /* asleep in its wait by now */
  BT_CHECK_ST(braid_destroy(c), BRAID_ERR_INVALID_ARG, NULL);
  const char *e = braid_last_error(NULL);
  BT_CHECK(strstr(e, "braid_destroy: 1 call(s) on this communicator wait in other threads"), "message: %s", e);
  BT_CHECK(strstr(e, "(rank 0)") && !strstr(e, "(rank 0) ("), "the rank named once: %s", e);
  BT_CHECK_MSG(c, "braid_destroy: 1 call(s) on this communicator wait in other threads"); /* the comm's too */
  int v = 99;
  BT_CHECK_OK(braid_send(c, &v, 1, BRAID_I32, 0, 8), c);
  pthread_join(t, NULL);
  BT_CHECK(w.st == BRAID_OK, "the waiting sync: %s", braid_status_string(w.st));
  BT_CHECK(got == 99, "got %d", got);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

typedef struct aborter {
  braid_comm *c;
  double delay;
} aborter;

static void *abort_later(void *p) {
  aborter *a = p;
  braid__sleep(a->delay);
  braid_abort(a->c);
  return NULL;
}

static int test_abort_wakes_waiter(void) {
  braid_comm *c = new_comm(300); /* far beyond the test's own timeout */
  int got = 0;
  BT_CHECK_OK(braid_recv(c, &got, 1, BRAID_I32, 0, 5), c);
  aborter a = {c, 0.1};
  pthread_t t;
  BT_CHECK(pthread_create(&t, NULL, abort_later, &a) == 0, "pthread_create");
  double t0 = braid__now();
  BT_CHECK_ST(braid_sync(c), BRAID_ERR_ABORTED, c);
  double took = braid__now() - t0;
  pthread_join(t, NULL);
  BT_CHECK(took < 10, "abort took %.3f s to reach the waiter", took);
  BT_CHECK_MSG(c, "braid_sync");
  /* Sticky from every thread. */
  BT_CHECK_ST(braid_barrier(c), BRAID_ERR_ABORTED, c);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

/* Abort racing with busy callers: every call returns OK or ABORTED, nothing hangs. */
static void *busy(void *p) {
  worker *w = p;
  for (int i = 0; i < 100000; i++) {
    float f = 1;
    braid_status st = braid_all_reduce(w->c, &f, 1, BRAID_F32, BRAID_MAX);
    if (st == BRAID_ERR_ABORTED) return NULL;
    if (st != BRAID_OK) w->failures++;
  }
  return NULL;
}

static int test_abort_races_callers(void) {
  braid_comm *c = new_comm(30);
  enum { N = 3 };
  pthread_t t[N];
  worker w[N];
  for (int i = 0; i < N; i++) {
    w[i] = (worker){c, i, 0};
    BT_CHECK(pthread_create(&t[i], NULL, busy, &w[i]) == 0, "pthread_create");
  }
  braid__sleep(0.02);
  BT_CHECK_OK(braid_abort(c), c);
  for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < N; i++) BT_CHECK(w[i].failures == 0, "thread %d: unexpected statuses", i);
  float f = 0;
  BT_CHECK_ST(braid_all_reduce(c, &f, 1, BRAID_F32, BRAID_SUM), BRAID_ERR_ABORTED, c);
  BT_CHECK_OK(braid_destroy(c), NULL);
  return 0;
}

/* shm: two threads per process, each on its own communicator (the world and
   a split of it), one streaming large messages and one running collectives.
   A rank waiting in one communicator moves the other's transfers when that
   one is idle, so both communicators' locks and states are touched from both
   threads; ThreadSanitizer checks the locking. */
typedef struct shm_pair {
  braid_comm *c;
  int rank, n, p2p, failures;
  int mem; /* buffers from braid_mem_alloc, read in place by the peer */
} shm_pair;

static float *pair_alloc(const shm_pair *w, size_t cnt) {
  void *p = NULL;
  if (!w->mem) return calloc(cnt, sizeof(float));
  return braid_mem_alloc(&p, cnt * sizeof(float)) == BRAID_OK ? p : NULL; /* zero-filled */
}

static void pair_free(const shm_pair *w, float *p) {
  if (w->mem) braid_mem_free(p);
  else free(p);
}

/* Allocates and frees braid memory while the communicators look buffers up. */
static void *churn(void *p) {
  int *stop = p, bad = 0;
  while (!__atomic_load_n(stop, __ATOMIC_ACQUIRE)) {
    void *a = NULL;
    if (braid_mem_alloc(&a, 5000) != BRAID_OK || braid_mem_free(a) != BRAID_OK) bad++;
  }
  return (void *)(intptr_t)bad;
}

static void *shm_side(void *p) {
  shm_pair *w = p;
  size_t cnt = 40000;
  float *buf = pair_alloc(w, cnt), *in = pair_alloc(w, cnt);
  if (!buf || !in) {
    w->failures++;
    pair_free(w, buf);
    pair_free(w, in);
    return NULL;
  }
  for (int i = 0; i < 40; i++) {
    if (w->p2p) {
      for (size_t k = 0; k < cnt; k++) buf[k] = (float)(w->rank * 1000 + i);
      int right = (w->rank + 1) % w->n, left = (w->rank + w->n - 1) % w->n;
      if (braid_send(w->c, buf, cnt, BRAID_F32, right, 9) || braid_recv(w->c, in, cnt, BRAID_F32, left, 9) ||
          braid_sync(w->c) || in[cnt - 1] != (float)(left * 1000 + i))
        w->failures++;
    } else {
      for (size_t k = 0; k < cnt; k++) buf[k] = (float)(w->rank + i);
      float want = (float)(w->n * (w->n - 1) / 2 + w->n * i);
      if (braid_all_reduce(w->c, buf, cnt, BRAID_F32, BRAID_SUM) || buf[0] != want || buf[cnt - 1] != want)
        w->failures++;
    }
  }
  pair_free(w, buf);
  pair_free(w, in);
  return NULL;
}

static int body_shm_two_threads(braid_comm *c, int rank, int n, void *arg) {
  int mem = *(const int *)arg, stop = 0;
  braid_comm *dup = NULL;
  BT_CHECK_OK(braid_split(c, 0, rank, &dup), c);
  shm_pair a = {c, rank, n, 1, 0, mem}, b = {dup, rank, n, 0, 0, mem};
  pthread_t ta, tb, tc;
  BT_CHECK(pthread_create(&ta, NULL, shm_side, &a) == 0 && pthread_create(&tb, NULL, shm_side, &b) == 0, "threads");
  if (mem) BT_CHECK(pthread_create(&tc, NULL, churn, &stop) == 0, "thread");
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  void *churn_bad = NULL;
  if (mem) {
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    pthread_join(tc, &churn_bad);
  }
  BT_CHECK(a.failures == 0 && b.failures == 0, "rank %d: %d send/recv and %d all-reduce failures: %s", rank,
           a.failures, b.failures, braid_last_error(NULL));
  BT_CHECK(churn_bad == NULL, "rank %d: braid_mem_alloc/free failed beside the communicators", rank);
  BT_CHECK_OK(braid_destroy(dup), NULL);
  return 0;
}

static int test_shm_two_threads(void) {
  int heap = 0, mem = 1;
  return bt_run_ranks("shm", 2, 120, body_shm_two_threads, &heap) ||
         bt_run_ranks("shm", 2, 120, body_shm_two_threads, &mem);
}

/* A thread waits in braid_sync for a message its peer sends only after it
   got one that another thread of this rank sends meanwhile: the sync lets
   that send in (on every backend), and both complete. */
typedef struct other_sender {
  braid_comm *c;
  _Atomic int *in_sync;
  braid_status st;
} other_sender;

static void *send_tag2(void *p) {
  other_sender *o = p;
  while (!atomic_load(o->in_sync)) braid__sleep(0.001);
  braid__sleep(0.05); /* the sync waits by now (if not, the send goes first: also right) */
  static int v = 42;
  o->st = braid_send(o->c, &v, 1, BRAID_I32, 1, 2);
  return NULL;
}

static int body_sync_lets_others_in(braid_comm *c, int rank, int n, void *arg) {
  (void)n, (void)arg;
  if (rank == 0) {
    int got = 0;
    _Atomic int in_sync = 0;
    other_sender o = {c, &in_sync, BRAID_ERR_INTERNAL};
    BT_CHECK_OK(braid_recv(c, &got, 1, BRAID_I32, 1, 1), c);
    pthread_t t;
    BT_CHECK(pthread_create(&t, NULL, send_tag2, &o) == 0, "pthread_create");
    atomic_store(&in_sync, 1);
    braid_status st = braid_sync(c);
    pthread_join(t, NULL);
    BT_CHECK(st == BRAID_OK, "the waiting sync got %s: %s", braid_status_string(st), braid_last_error(c));
    BT_CHECK(o.st == BRAID_OK, "the other thread's send got %s", braid_status_string(o.st));
    BT_CHECK(got == 7, "got %d", got);
    BT_CHECK_OK(braid_sync(c), c); /* the other thread's send, if still pending */
  } else if (rank == 1) {
    int v = 0, seven = 7;
    BT_CHECK_OK(braid_recv(c, &v, 1, BRAID_I32, 0, 2), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK(v == 42, "rank 1 got %d", v);
    BT_CHECK_OK(braid_send(c, &seven, 1, BRAID_I32, 0, 1), c);
    BT_CHECK_OK(braid_sync(c), c);
  }
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

/* body on 2 ranks of every backend that has them (hier: one node). */
static int on_every_backend(bt_body body) {
  static const char *const env[] = {"BRAID_TIMEOUT=20", "BRAID_NODE_ID=n0", NULL};
  const char *names[8];
  int maxr[8], nb = bt_backends(names, maxr, 8);
  for (int b = 0; b < nb; b++) {
    if (maxr[b] < 2) continue;
    bt_run_opts o = {names[b], 2, 60, env, -1};
    if (bt_run_ranks_ex(&o, body, NULL, NULL)) {
      fprintf(stderr, "backend %s\n", names[b]);
      return 1;
    }
  }
  return 0;
}

static int test_sync_lets_others_in(void) { return on_every_backend(body_sync_lets_others_in); }

/* Two collectives let in, one after the other, while a third thread waits
   in braid_sync: each runs whole (a collective never lends the lock, though
   the sync that let it in does), so the two sums pair up with the peer's
   two calls in one order or the other. */
typedef struct coll_thread {
  braid_comm *c;
  _Atomic int *in_sync;
  double delay;
  int v;
  braid_status st;
} coll_thread;

static void *all_reduce_later(void *p) {
  coll_thread *t = p;
  while (!atomic_load(t->in_sync)) braid__sleep(0.001);
  braid__sleep(t->delay);
  t->st = braid_all_reduce(t->c, &t->v, 1, BRAID_I32, BRAID_SUM);
  return NULL;
}

static int body_collectives_let_in(braid_comm *c, int rank, int n, void *arg) {
  (void)n, (void)arg;
  if (rank == 0) {
    int got = 0;
    _Atomic int in_sync = 0;
    coll_thread b = {c, &in_sync, 0.05, 1, BRAID_ERR_INTERNAL}, d = {c, &in_sync, 0.3, 100, BRAID_ERR_INTERNAL};
    BT_CHECK_OK(braid_recv(c, &got, 1, BRAID_I32, 1, 1), c);
    pthread_t tb, td;
    BT_CHECK(pthread_create(&tb, NULL, all_reduce_later, &b) == 0, "pthread_create");
    BT_CHECK(pthread_create(&td, NULL, all_reduce_later, &d) == 0, "pthread_create");
    atomic_store(&in_sync, 1);
    braid_status st = braid_sync(c);
    pthread_join(tb, NULL);
    pthread_join(td, NULL);
    BT_CHECK(st == BRAID_OK && b.st == BRAID_OK && d.st == BRAID_OK, "sync %s, all-reduces %s and %s: %s",
             braid_status_string(st), braid_status_string(b.st), braid_status_string(d.st), braid_last_error(c));
    BT_CHECK((b.v == 11 && d.v == 1100) || (b.v == 1001 && d.v == 110),
             "the all-reduces interleaved: %d and %d (want 11 and 1100, or 1001 and 110)", b.v, d.v);
    BT_CHECK(got == 7, "got %d", got);
  } else if (rank == 1) {
    int v = 10, w = 1000, seven = 7;
    braid__sleep(1.0);
    BT_CHECK_OK(braid_all_reduce(c, &v, 1, BRAID_I32, BRAID_SUM), c);
    BT_CHECK_OK(braid_all_reduce(c, &w, 1, BRAID_I32, BRAID_SUM), c);
    BT_CHECK_OK(braid_send(c, &seven, 1, BRAID_I32, 0, 1), c);
    BT_CHECK_OK(braid_sync(c), c);
  }
  BT_CHECK_OK(braid_barrier(c), c);
  return 0;
}

static int test_collectives_let_in(void) { return on_every_backend(body_collectives_let_in); }

static const bt_case cases[] = {
    BT_CASE(test_concurrent_calls),
    BT_CASE(test_sync_waits_for_other_thread),
    BT_CASE(test_waiting_call_keeps_its_name),
    BT_CASE(test_sync_lets_others_in),
    BT_CASE(test_collectives_let_in),
    BT_CASE(test_abort_wakes_waiter),
    BT_CASE(test_destroy_under_waiter),
    BT_CASE(test_abort_races_callers),
    BT_CASE(test_shm_two_threads),
};

int main(int argc, char **argv) { return bt_main(argc, argv, cases, BT_COUNT(cases)); }
