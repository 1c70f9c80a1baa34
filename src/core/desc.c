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
    [BRAID__COLL_REDUCE] = "braid_reduce",
    [BRAID__COLL_GATHER] = "braid_gather",
    [BRAID__COLL_SCATTER] = "braid_scatter",
    [BRAID__COLL_ALL_TO_ALL] = "braid_all_to_all",
    [BRAID__COLL_ALL_TO_ALLV] = "braid_all_to_allv",
};

static const char *const short_names[BRAID__COLL_NKINDS] = {
    [BRAID__COLL_NONE] = "p2p",
    [BRAID__COLL_ALL_REDUCE] = "allreduce",
    [BRAID__COLL_BROADCAST] = "broadcast",
    [BRAID__COLL_ALL_GATHER] = "allgather",
    [BRAID__COLL_REDUCE_SCATTER] = "reduce_scatter",
    [BRAID__COLL_BARRIER] = "barrier",
    [BRAID__COLL_SPLIT] = "split",
    [BRAID__COLL_REDUCE] = "reduce",
    [BRAID__COLL_GATHER] = "gather",
    [BRAID__COLL_SCATTER] = "scatter",
    [BRAID__COLL_ALL_TO_ALL] = "alltoall",
    [BRAID__COLL_ALL_TO_ALLV] = "alltoallv",
};

const char *braid__coll_call_name(int kind) {
  return kind >= 0 && kind < BRAID__COLL_NKINDS ? call_names[kind] : "an unknown collective";
}

const char *braid__coll_short_name(int kind) {
  return kind >= 0 && kind < BRAID__COLL_NKINDS ? short_names[kind] : NULL;
}

/* The op of a reduction's arg: "sum", ..., or "premul_sum #1a2b3c4d" with
   the digest bits the descriptor keeps (hexd digits). */
static void red_name(uint32_t op, uint32_t digest, int hexd, char *out, size_t len) {
  if (op & BRAID__DESC_PREMUL) {
    snprintf(out, len, "premul_sum #%0*x", hexd, (unsigned)digest);
    return;
  }
  const char *name = braid_op_name((braid_op)op);
  if (name)
    snprintf(out, len, "%s", name);
  else
    snprintf(out, len, "op %u", (unsigned)op);
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
    char op[40];
    red_name((uint32_t)d->arg, (uint32_t)d->arg & 0x7fffffffu, 8, op, sizeof op);
    snprintf(out, len, "%s(%llu x %s, %s)", call, n, dt, op);
    break;
  }
  case BRAID__COLL_REDUCE: {
    uint32_t a = (uint32_t)d->arg, root, digest;
    int hexd;
    if (!(a & BRAID__DESC_PREMUL)) {
      root = a & 0xffffffu, digest = 0, hexd = 0;
    } else if (a & 0x40000000u) {
      root = (a >> 6) & 0xffffffu, digest = a & 0x3fu, hexd = 2;
    } else {
      root = (a >> 18) & 0xfffu, digest = a & 0x3ffffu, hexd = 5;
    }
    char op[40];
    red_name(a & BRAID__DESC_PREMUL ? a : a >> 24, digest, hexd, op, sizeof op);
    snprintf(out, len, "%s(root %u, %llu x %s, %s)", call, root, n, dt, op);
    break;
  }
  case BRAID__COLL_BROADCAST:
  case BRAID__COLL_GATHER:
  case BRAID__COLL_SCATTER:
    snprintf(out, len, "%s(root %d, %llu x %s)", call, (int)d->arg, n, dt);
    break;
  case BRAID__COLL_ALL_GATHER:
  case BRAID__COLL_ALL_TO_ALL:
    snprintf(out, len, "%s(%llu x %s)", call, n, dt);
    break;
  case BRAID__COLL_ALL_TO_ALLV:
    snprintf(out, len, "%s(%s)", call, dt);
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
