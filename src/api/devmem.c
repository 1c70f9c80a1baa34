/* braid_comm_mem_alloc / braid_mem_register: communication memory and
   registration through the communicator's backend. */
#include "api/api.h"

/* A registration on a backend that needs none: a token that proves the call. */
static char no_registration;

braid_status braid_comm_mem_alloc(braid_comm *c, void **ptr, size_t size) {
  braid_status st = braid__enter(c, "braid_comm_mem_alloc");
  if (st) return st;
  if (!ptr) return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG, "ptr is NULL"));
  *ptr = NULL;
  if (!size) return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG, "size is 0"));
  if (!c->ops->mem_alloc) {
    st = braid_mem_alloc(ptr, size);
    if (st) braid__fail(c, st, "%s", braid_last_error(NULL));
    return braid__leave(c, st);
  }
  return braid__leave(c, c->ops->mem_alloc(c, ptr, size));
}

braid_status braid_comm_mem_free(braid_comm *c, void *ptr) {
  braid_status st = braid__enter(c, "braid_comm_mem_free");
  if (st) return st;
  if (!ptr) return braid__leave(c, BRAID_OK);
  if (!c->ops->mem_free) {
    st = braid_mem_free(ptr);
    if (st) braid__fail(c, st, "%s", braid_last_error(NULL));
    return braid__leave(c, st);
  }
  return braid__leave(c, c->ops->mem_free(c, ptr));
}

braid_status braid_mem_register(braid_comm *c, void *buf, size_t size, void **handle) {
  braid_status st = braid__enter(c, "braid_mem_register");
  if (st) return st;
  if (!handle) return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG, "handle is NULL"));
  *handle = NULL;
  if (!buf) return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG, "buf is NULL"));
  if (!size) return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG, "size is 0"));
  if (!c->ops->mem_register) {
    *handle = &no_registration;
    return braid__leave(c, BRAID_OK);
  }
  return braid__leave(c, c->ops->mem_register(c, buf, size, handle));
}

braid_status braid_mem_deregister(braid_comm *c, void *handle) {
  braid_status st = braid__enter(c, "braid_mem_deregister");
  if (st) return st;
  if (!handle) return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG, "handle is NULL"));
  if (!c->ops->mem_deregister)
    return braid__leave(c, handle == &no_registration
                               ? BRAID_OK
                               : braid__fail(c, BRAID_ERR_INVALID_ARG,
                                             "handle %p is not one braid_mem_register gave on backend %s", handle,
                                             c->ops->name));
  return braid__leave(c, c->ops->mem_deregister(c, handle));
}
