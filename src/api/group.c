/* Grouped calls: braid_group_start / braid_group_end, per thread and
   nestable. Inside a group point-to-point calls post as always, and each
   collective is checked at once (a rejected call returns its error and is
   not queued) and queued; the outermost braid_group_end runs the queue in
   issue order, so the group's sends and receives progress while it runs.
   Buffers of queued calls belong to braid until braid_group_end returns.
   A communicator counts the calls queued on it in every thread's group,
   so that another thread cannot destroy it under them. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"

typedef struct gcall {
  struct gcall *next;
  braid_comm *c;
  braid__coll_args a;
  size_t arrays[]; /* all-to-allv: the four count and displacement arrays, copied */
} gcall;

static _Thread_local int depth;
static _Thread_local gcall *head, **tail; /* tail NULL: the queue is empty */
/* Threads inside a group: calls outside any group test only this. */
static atomic_int open_groups;
/* Its destructor drops the queue of a thread that ends inside a group. */
static pthread_key_t exit_key;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;

static void drop(gcall *g) {
  atomic_fetch_sub_explicit(&g->c->grouped, 1, memory_order_release);
  free(g);
}

static void thread_ended(void *unused) {
  (void)unused;
  int dropped = 0, rank = -1;
  while (head) {
    gcall *g = head;
    head = g->next;
    rank = g->c->rank;
    drop(g);
    dropped++;
  }
  tail = NULL;
  if (depth > 0) atomic_fetch_sub_explicit(&open_groups, 1, memory_order_relaxed);
  depth = 0;
  if (dropped)
    BLOG_WARN(BRAID_SUB_COLL, rank, "a thread ended inside a group (braid_group_start): %d call(s) it queued never ran",
              dropped);
}

static void make_exit_key(void) {
  if (pthread_key_create(&exit_key, thread_ended)) abort(); /* only when the process is out of keys at its first group */
}

int braid__group_open(void) { return atomic_load_explicit(&open_groups, memory_order_relaxed) && depth > 0; }

braid_status braid__group_queue(braid_comm *c, const braid__coll_args *a) {
  const size_t n = (size_t)c->size;
  const int v = a->kind == BRAID__COLL_ALL_TO_ALLV;
  gcall *g = malloc(sizeof *g + (v ? 4 * n * sizeof(size_t) : 0));
  if (!g) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory queueing the call in a group");
  g->next = NULL;
  g->c = c;
  g->a = *a;
  /* The user operations posted so far, plus one: never 0. */
  if (a->kind == BRAID__COLL_BARRIER) g->a.before = c->user_posted + 1;
  if (v) { /* in place (send == recv) the send arrays are not read: NULL, or of any length */
    const size_t *src[4] = {a->recv_counts, a->recv_displs, a->send_counts, a->send_displs};
    const size_t **dst[4] = {&g->a.recv_counts, &g->a.recv_displs, &g->a.send_counts, &g->a.send_displs};
    for (int k = 0; k < 4; k++) {
      *dst[k] = NULL;
      if (!src[k] || (k >= 2 && a->send == a->recv)) continue;
      memcpy(g->arrays + (size_t)k * n, src[k], n * sizeof(size_t));
      *dst[k] = g->arrays + (size_t)k * n;
    }
  }
  *(tail ? tail : &head) = g;
  tail = &g->next;
  atomic_fetch_add_explicit(&c->grouped, 1, memory_order_relaxed);
  return BRAID_OK;
}

braid_status braid__group_forget(braid_comm *c) {
  int mine = 0;
  for (gcall *g = head; g; g = g->next) mine += g->c == c;
  const int others = atomic_load_explicit(&c->grouped, memory_order_acquire) - mine;
  if (others > 0)
    return braid__fail_in(c, "braid_destroy", BRAID_ERR_INVALID_ARG,
                          "%d call(s) on this communicator wait in another thread's group; that thread's "
                          "braid_group_end must run them first",
                          others);
  for (gcall **pp = &head; *pp;) {
    gcall *g = *pp;
    if (g->c != c) {
      pp = &g->next;
      continue;
    }
    *pp = g->next;
    if (tail == &g->next) tail = pp == &head ? NULL : pp;
    drop(g);
  }
  if (mine)
    BLOG_WARN(BRAID_SUB_COLL, c->rank, "braid_destroy: %d call(s) queued in this thread's group never ran", mine);
  return BRAID_OK;
}

braid_status braid_group_start(void) {
  if (depth == INT32_MAX) return braid__fail_caller(BRAID_ERR_INVALID_ARG, "braid_group_start: groups nested too deep");
  if (depth++ == 0) {
    atomic_fetch_add_explicit(&open_groups, 1, memory_order_relaxed);
    pthread_once(&exit_key_once, make_exit_key);
    pthread_setspecific(exit_key, &depth); /* any non-NULL value: the destructor runs at thread exit */
  }
  return BRAID_OK;
}

braid_status braid_group_end(void) {
  if (depth == 0)
    return braid__fail_caller(BRAID_ERR_INVALID_ARG,
                              "braid_group_end: no group is open on this thread (braid_group_start)");
  if (--depth) return BRAID_OK;
  atomic_fetch_sub_explicit(&open_groups, 1, memory_order_relaxed);
  gcall *g = head;
  head = NULL;
  tail = NULL;
  braid_status first = BRAID_OK;
  char msg[BRAID_ERRLEN] = "";
  while (g) {
    gcall *next = g->next;
    braid_comm *c = g->c;
    braid_status st = braid__enter(c, braid__coll_call_name(g->a.kind));
    if (!st) st = braid__leave(c, braid__coll_run(c, &g->a));
    if (st && !first) {
      first = st;
      snprintf(msg, sizeof msg, "%s", braid_last_error(NULL));
    }
    drop(g); /* only now may another thread destroy c */
    g = next;
  }
  /* The first error is the one braid_last_error(NULL) reports. */
  if (first) braid__set_thread_error(msg);
  return first;
}
