#include "core/desc.h"

#include <stdio.h>

static const char *const call_names[BRAID__COLL_NKINDS] = {
    [BRAID__COLL_NONE] = "braid_send/recv",
    [BRAID__COLL_ALL_REDUCE] = "braid_all_reduce",
    [BRAID__COLL_BROADCAST] = "braid_broadcast",
    [BRAID__COLL_ALL_GATHER] = "braid_all_gather",
    [BRAID__COLL_REDUCE_SCATTER] = "braid_reduce_scatter",
    [BRAID__COLL_BARRIER] = "braid_barrier",
    [BRAID__COLL_SPLIT] = "braid_split",
};

static const char *const short_names[BRAID__COLL_NKINDS] = {
    [BRAID__COLL_NONE] = "p2p",
    [BRAID__COLL_ALL_REDUCE] = "allreduce",
    [BRAID__COLL_BROADCAST] = "broadcast",
    [BRAID__COLL_ALL_GATHER] = "allgather",
    [BRAID__COLL_REDUCE_SCATTER] = "reduce_scatter",
    [BRAID__COLL_BARRIER] = "barrier",
    [BRAID__COLL_SPLIT] = "split",
};

const char *braid__coll_call_name(int kind) {
  return kind >= 0 && kind < BRAID__COLL_NKINDS ? call_names[kind] : "an unknown collective";
}

const char *braid__coll_short_name(int kind) {
  return kind >= 0 && kind < BRAID__COLL_NKINDS ? short_names[kind] : NULL;
}

void braid__desc_format(const braid__desc *d, char *out, size_t len) {
  const char *call = braid__coll_call_name(d->kind);
  const char *dt = braid_dtype_name((braid_dtype)d->dt);
  char dts[16];
  if (!dt) {
    snprintf(dts, sizeof dts, "dtype %u", d->dt);
    dt = dts;
  }
  unsigned long long n = (unsigned long long)d->count;
  switch (d->kind) {
  case BRAID__COLL_ALL_REDUCE:
  case BRAID__COLL_REDUCE_SCATTER: {
    const char *op = braid_op_name((braid_op)d->arg);
    if (op)
      snprintf(out, len, "%s(%llu x %s, %s)", call, n, dt, op);
    else
      snprintf(out, len, "%s(%llu x %s, op %d)", call, n, dt, (int)d->arg);
    break;
  }
  case BRAID__COLL_BROADCAST:
    snprintf(out, len, "%s(root %d, %llu x %s)", call, (int)d->arg, n, dt);
    break;
  case BRAID__COLL_ALL_GATHER:
    snprintf(out, len, "%s(%llu x %s)", call, n, dt);
    break;
  case BRAID__COLL_BARRIER:
  case BRAID__COLL_SPLIT:
    snprintf(out, len, "%s()", call);
    break;
  default:
    snprintf(out, len, "%s", call);
    break;
  }
}

void braid__desc_mismatch_text(char *out, size_t len, int peer, const braid__desc *theirs, int me,
                               const braid__desc *mine) {
  char a[160], b[160];
  braid__desc_format(theirs, a, sizeof a);
  braid__desc_format(mine, b, sizeof b);
  snprintf(out, len, "rank %d called %s where rank %d called %s", peer, a, me, b);
}
