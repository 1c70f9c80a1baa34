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
  BRAID__COLL_NKINDS
} braid__coll_kind;

/* 16 bytes, the same layout on every rank and on the wire (little-endian hosts). */
typedef struct braid__desc {
  uint64_t count; /* elements per rank (the per-rank block for all-gather and reduce-scatter) */
  uint8_t kind;   /* braid__coll_kind */
  uint8_t dt;     /* braid_dtype */
  uint16_t flags; /* 0; reserved */
  int32_t arg;    /* root for broadcast, braid_op for reductions, else 0 */
} braid__desc;

static inline braid__desc braid__desc_make(braid__coll_kind kind, size_t count, braid_dtype dt, int32_t arg) {
  braid__desc d = {(uint64_t)count, (uint8_t)kind, (uint8_t)dt, 0, arg};
  return d;
}

static inline int braid__desc_equal(const braid__desc *a, const braid__desc *b) {
  return a->count == b->count && a->kind == b->kind && a->dt == b->dt && a->arg == b->arg;
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
