/* The CUDA stream/event hooks: passed to backends with a communication stream. */
#include "api/api.h"

bool braid_has_stream_sync(const braid_comm *c) { return c && c->ops->stream; }

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
  return braid__leave(c, c->ops->stream->event_create(c, event));
}

braid_status braid_event_destroy(braid_comm *c, uint64_t event) {
  braid_status st = stream_enter(c, "braid_event_destroy");
  if (st) return st;
  return braid__leave(c, c->ops->stream->event_destroy(c, event));
}

braid_status braid_event_record_on_comm_stream(braid_comm *c, uint64_t event) {
  braid_status st = stream_enter(c, "braid_event_record_on_comm_stream");
  if (st) return st;
  return braid__leave(c, c->ops->stream->event_record_on_comm_stream(c, event));
}

braid_status braid_event_record_on_stream(braid_comm *c, uint64_t event, uint64_t stream) {
  braid_status st = stream_enter(c, "braid_event_record_on_stream");
  if (st) return st;
  return braid__leave(c, c->ops->stream->event_record_on_stream(c, event, stream));
}

braid_status braid_comm_stream_wait_event(braid_comm *c, uint64_t event) {
  braid_status st = stream_enter(c, "braid_comm_stream_wait_event");
  if (st) return st;
  return braid__leave(c, c->ops->stream->comm_stream_wait_event(c, event));
}

braid_status braid_stream_wait_event(braid_comm *c, uint64_t stream, uint64_t event) {
  braid_status st = stream_enter(c, "braid_stream_wait_event");
  if (st) return st;
  return braid__leave(c, c->ops->stream->stream_wait_event(c, stream, event));
}

braid_status braid_sync_comm_stream(braid_comm *c) {
  braid_status st = stream_enter(c, "braid_sync_comm_stream");
  if (st) return st;
  return braid__leave(c, c->ops->stream->sync_comm_stream(c));
}
