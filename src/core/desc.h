/* The descriptor of a collective call: what every rank of a communicator
   must agree on for the call to mean anything. It travels with the data the
   algorithms already exchange (message headers, shared-memory slots), so the
   cross-rank call check costs no extra round. */
#ifndef BRAID_DESC_H
#define BRAID_DESC_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"

typedef enum braid__coll_kind {
  BRAID__COLL_NONE = 0, /* user point-to-point traffic */
  BRAID__COLL_ALL_REDUCE,
  BRAID__COLL_BROADCAST,
  BRAID__COLL_ALL_GATHER,
  BRAID__COLL_REDUCE_SCATTER,
  BRAID__COLL_BARRIER,
  BRAID__COLL_SPLIT,
  BRAID__COLL_REDUCE,
  BRAID__COLL_GATHER,
  BRAID__COLL_SCATTER,
  BRAID__COLL_ALL_TO_ALL,
  BRAID__COLL_ALL_TO_ALLV, /* count 0: the per-peer counts differ by rank; the messages check them */
  BRAID__COLL_NKINDS
} braid__coll_kind;

/* 16 bytes, the same layout on every rank and on the wire (little-endian hosts). */
typedef struct braid__desc {
  uint64_t count; /* elements per rank (the per-rank block for all-gather and reduce-scatter) */
  uint8_t kind;   /* braid__coll_kind */
  uint8_t dt;     /* braid_dtype */
  uint16_t flags; /* 0, or the digest of the call a backend makes this one for (hier's parts) */
  int32_t arg;    /* root for broadcast, gather, scatter; the reduction (below) for all-reduce,
                     reduce-scatter and reduce (with its root); else 0 */
} braid__desc;

static inline braid__desc braid__desc_make(braid__coll_kind kind, size_t count, braid_dtype dt, int32_t arg) {
  braid__desc d = {(uint64_t)count, (uint8_t)kind, (uint8_t)dt, 0, arg};
  return d;
}

static inline int braid__desc_equal(const braid__desc *a, const braid__desc *b) {
  return a->count == b->count && a->kind == b->kind && a->dt == b->dt && a->arg == b->arg && a->flags == b->flags;
}

/* A 32-bit digest of (seq, descriptor); never 0 so it can mark "published".
   Every field changes it; it runs on every collective, so it is one
   multiply-xorshift round. */
static inline uint32_t braid__desc_hash(uint64_t seq, const braid__desc *d) {
  uint64_t x = seq * 0x9E3779B97F4A7C15ull ^ d->count * 0xC2B2AE3D27D4EB4Full ^
               ((uint64_t)d->kind << 56 | (uint64_t)d->dt << 48 | (uint64_t)d->flags << 32 | (uint32_t)d->arg);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  uint32_t h = (uint32_t)(x >> 32);
  return h ? h : 1;
}

/*
 * The reduction in a descriptor's arg. All-reduce and reduce-scatter carry
 * the braid_op (0..7), or for a scaled sum (braid_op_premul_sum) the top bit
 * and 31 bits of a digest of its dtype and scalar, so ranks with different
 * scalars disagree. Reduce carries its root too: the root in the low 24 bits
 * (world sizes stay below 2^24) and the op above it; a scaled sum sets the
 * top bit and keeps 18 bits of the digest beside a root below 4096, 6 bits
 * beside a larger one (bit 30 set).
 */
#define BRAID__DESC_PREMUL 0x80000000u

static inline int32_t braid__desc_op_arg(braid_op op, int premul, uint32_t digest) {
  return premul ? (int32_t)(BRAID__DESC_PREMUL | (digest & 0x7fffffffu)) : (int32_t)op;
}

static inline int32_t braid__desc_reduce_arg(int root, braid_op op, int premul, uint32_t digest) {
  uint32_t r = (uint32_t)root;
  if (!premul) return (int32_t)((r & 0xffffffu) | (uint32_t)op << 24);
  if (r < 4096) return (int32_t)(BRAID__DESC_PREMUL | r << 18 | (digest & 0x3ffffu));
  return (int32_t)(BRAID__DESC_PREMUL | 0x40000000u | (r & 0xffffffu) << 6 | (digest & 0x3fu));
}

/* "braid_all_reduce", ... ("braid_send/recv" for BRAID__COLL_NONE). */
const char *braid__coll_call_name(int kind);
/* Short op name for BRAID_ALGO and braid-info: "allreduce", "broadcast", ... */
const char *braid__coll_short_name(int kind);

/* "braid_broadcast(root 0, 4096 x f32)", "braid_all_reduce(4096 x f32, sum)". */
void braid__desc_format(const braid__desc *d, char *out, size_t len);

/* "rank 2 called braid_broadcast(root 0, 4096 x f32) where rank 0 called
   braid_all_reduce(4096 x f32, sum)". */
void braid__desc_mismatch_text(char *out, size_t len, int peer, const braid__desc *theirs, int me,
                               const braid__desc *mine);

#endif
