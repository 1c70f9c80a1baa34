/* The public entry points' shared pieces: the backend registry, the
   serialization of calls and their argument checks. */
#ifndef BRAID_API_H
#define BRAID_API_H

#include "core/comm.h"

/* Registry of built backends; NULL if name is unknown. */
const braid__backend *braid__backend_find(const char *name);
/* Comma-separated names of the built backends (for messages and braid-info). */
const char *braid__backend_names(void);

/* Locks c for one public call; fails at once if c is failed (the status). */
braid_status braid__enter(braid_comm *c, const char *call);
/* Ends the call: a fatal result goes out to the other ranks; unlocks. */
braid_status braid__leave(braid_comm *c, braid_status st);

braid_status braid__null_comm(const char *call);
braid_status braid__check_dtype(braid_comm *c, braid_dtype dt);
braid_status braid__check_dtype_op_pair(braid_comm *c, braid_dtype dt, braid_op op);
/* bytes = count * dtype size * mult, rejecting overflow. */
braid_status braid__check_bytes(braid_comm *c, const char *what, size_t count, braid_dtype dt, size_t mult,
                                size_t *bytes);
braid_status braid__check_buf(braid_comm *c, const char *what, const void *p, size_t count);
braid_status braid__check_rank(braid_comm *c, const char *what, int r);
/* A dtype the backend cannot carry (a GPU library without bool, ...). */
braid_status braid__check_backend_dtype(braid_comm *c, braid_dtype dt);

#define BRAID__TRY(expr)                            \
  do {                                              \
    braid_status try_st_ = (expr);                  \
    if (try_st_) return braid__leave(c, try_st_);   \
  } while (0)

#endif
