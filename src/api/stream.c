/* The CUDA stream/event hooks: passed to backends with a communication stream. */
#include <pthread.h>
#include <stdlib.h>

#include "api/api.h"

bool braid_has_stream_sync(const braid_comm *c) { return c && c->ops->stream; }

/* The events braid_event_create made and braid_event_destroy has not
   destroyed, in this process (an event may serve any communicator of its
   device). An event is a pointer to CUDA: a stale or made-up handle would
   reach the driver, so every call that takes one checks it here first. A
   process holds few events at a time: a list is enough. */
static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *ev_list;
static size_t ev_n, ev_cap;

static int ev_add(uint64_t ev) {
  pthread_mutex_lock(&ev_lock);
  int ok = 1;
  if (ev_n == ev_cap) {
    size_t cap = ev_cap ? 2 * ev_cap : 16;
    uint64_t *l = realloc(ev_list, cap * sizeof *l);
    if (l) ev_list = l, ev_cap = cap;
    else ok = 0;
  }
  if (ok) ev_list[ev_n++] = ev;
  pthread_mutex_unlock(&ev_lock);
  return ok;
}

/* Index of ev in the list, or -1; with ev_lock held. */
static long ev_find(uint64_t ev) {
  for (size_t i = 0; i < ev_n; i++)
    if (ev_list[i] == ev) return (long)i;
  return -1;
}

static int ev_known(uint64_t ev) {
  pthread_mutex_lock(&ev_lock);
  int known = ev_find(ev) >= 0;
  pthread_mutex_unlock(&ev_lock);
  return known;
}

/* Takes ev out of the list: 1 if it was there. Two threads destroying the
   same event through two communicators: only one gets it. */
static int ev_take(uint64_t ev) {
  pthread_mutex_lock(&ev_lock);
  long i = ev_find(ev);
  if (i >= 0) ev_list[i] = ev_list[--ev_n];
  pthread_mutex_unlock(&ev_lock);
  return i >= 0;
}

static braid_status unknown_event(braid_comm *c, uint64_t ev) {
  return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG,
                                     "event 0x%llx is not an event braid_event_create made, or it was destroyed",
                                     (unsigned long long)ev));
}

static braid_status stream_enter(braid_comm *c, const char *call) {
  braid_status st = braid__enter(c, call);
  if (st) return st;
  if (!c->ops->stream)
    return braid__leave(c,
                        braid__fail(c, BRAID_ERR_UNSUPPORTED, "backend %s has no communication stream", c->ops->name));
  return BRAID_OK;
}

braid_status braid_event_create(braid_comm *c, uint64_t *event) {
  braid_status st = stream_enter(c, "braid_event_create");
  if (st) return st;
  if (!event) return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG, "event is NULL"));
  uint64_t ev = 0;
  st = c->ops->stream->event_create(c, &ev);
  if (!st && !ev_add(ev)) {
    c->ops->stream->event_destroy(c, ev);
    st = braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory recording the new event");
  }
  if (!st) *event = ev;
  return braid__leave(c, st);
}

braid_status braid_event_destroy(braid_comm *c, uint64_t event) {
  braid_status st = stream_enter(c, "braid_event_destroy");
  if (st) return st;
  if (!ev_take(event)) return unknown_event(c, event);
  st = c->ops->stream->event_destroy(c, event);
  if (st && !ev_add(event)) /* not destroyed: it stays usable */
    BLOG_WARN(BRAID_SUB_INIT, c->rank, "braid_event_destroy: out of memory keeping event 0x%llx after a failed destroy",
              (unsigned long long)event);
  return braid__leave(c, st);
}

braid_status braid_event_record_on_comm_stream(braid_comm *c, uint64_t event) {
  braid_status st = stream_enter(c, "braid_event_record_on_comm_stream");
  if (st) return st;
  if (!ev_known(event)) return unknown_event(c, event);
  return braid__leave(c, c->ops->stream->event_record_on_comm_stream(c, event));
}

braid_status braid_event_record_on_stream(braid_comm *c, uint64_t event, uint64_t stream) {
  braid_status st = stream_enter(c, "braid_event_record_on_stream");
  if (st) return st;
  if (!ev_known(event)) return unknown_event(c, event);
  return braid__leave(c, c->ops->stream->event_record_on_stream(c, event, stream));
}

braid_status braid_comm_stream_wait_event(braid_comm *c, uint64_t event) {
  braid_status st = stream_enter(c, "braid_comm_stream_wait_event");
  if (st) return st;
  if (!ev_known(event)) return unknown_event(c, event);
  return braid__leave(c, c->ops->stream->comm_stream_wait_event(c, event));
}

braid_status braid_stream_wait_event(braid_comm *c, uint64_t stream, uint64_t event) {
  braid_status st = stream_enter(c, "braid_stream_wait_event");
  if (st) return st;
  if (!ev_known(event)) return unknown_event(c, event);
  return braid__leave(c, c->ops->stream->stream_wait_event(c, stream, event));
}

braid_status braid_sync_comm_stream(braid_comm *c) {
  braid_status st = stream_enter(c, "braid_sync_comm_stream");
  if (st) return st;
  return braid__leave(c, c->ops->stream->sync_comm_stream(c));
}
