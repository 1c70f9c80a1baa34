/* Tags of point-to-point messages. User tags are the 32-bit braid_send/recv
   tags. Internal tags (collective algorithms) set the top bit, so they never
   meet a user tag, and carry a fold of the communicator id (transports that
   share links between communicators keep them apart), the collective's
   sequence number and the step within it. The collective's kind, dtype,
   count and root/op travel beside the tag in the message's descriptor
   (core/desc.h): a rank in another collective is then reported as a
   mismatch instead of never being matched. Sequence number and step wrap;
   matching is FIFO per (source, tag), so a wrapped step inside one
   collective still pairs sends and receives in posting order. */
#ifndef BRAID_TAG_H
#define BRAID_TAG_H

#include <stdint.h>

#define BRAID__TAG_INTERNAL (1ull << 63)
#define BRAID__TAG_COMM_BITS 16
#define BRAID__TAG_SEQ_BITS 27
#define BRAID__TAG_STEP_BITS 20
#define BRAID__TAG_STEP_SHIFT 0
#define BRAID__TAG_SEQ_SHIFT BRAID__TAG_STEP_BITS
#define BRAID__TAG_COMM_SHIFT (BRAID__TAG_SEQ_SHIFT + BRAID__TAG_SEQ_BITS)

_Static_assert(BRAID__TAG_COMM_SHIFT + BRAID__TAG_COMM_BITS == 63, "internal tag fields fill 63 bits");

static inline uint64_t braid__tag_mask(int bits) { return (1ull << bits) - 1; }

static inline uint64_t braid__tag_user(uint32_t tag) { return tag; }
static inline int braid__tag_is_internal(uint64_t tag) { return (tag & BRAID__TAG_INTERNAL) != 0; }

/* Folds a 64-bit communicator id into the tag's field. */
static inline uint64_t braid__tag_comm_fold(uint64_t id) {
  uint64_t x = id ^ (id >> 16) ^ (id >> 32) ^ (id >> 48);
  return x & braid__tag_mask(BRAID__TAG_COMM_BITS);
}

static inline uint64_t braid__tag_internal(uint64_t comm_id, uint64_t seq, uint64_t step) {
  return BRAID__TAG_INTERNAL | braid__tag_comm_fold(comm_id) << BRAID__TAG_COMM_SHIFT |
         (seq & braid__tag_mask(BRAID__TAG_SEQ_BITS)) << BRAID__TAG_SEQ_SHIFT |
         (step & braid__tag_mask(BRAID__TAG_STEP_BITS)) << BRAID__TAG_STEP_SHIFT;
}

static inline uint64_t braid__tag_seq(uint64_t tag) {
  return (tag >> BRAID__TAG_SEQ_SHIFT) & braid__tag_mask(BRAID__TAG_SEQ_BITS);
}
static inline uint64_t braid__tag_step(uint64_t tag) {
  return (tag >> BRAID__TAG_STEP_SHIFT) & braid__tag_mask(BRAID__TAG_STEP_BITS);
}
static inline uint64_t braid__tag_comm(uint64_t tag) {
  return (tag >> BRAID__TAG_COMM_SHIFT) & braid__tag_mask(BRAID__TAG_COMM_BITS);
}
/* Whether an internal tag belongs to collective seq of communicator comm_id. */
static inline int braid__tag_in_coll(uint64_t tag, uint64_t comm_id, uint64_t seq) {
  return braid__tag_is_internal(tag) && braid__tag_comm(tag) == braid__tag_comm_fold(comm_id) &&
         braid__tag_seq(tag) == (seq & braid__tag_mask(BRAID__TAG_SEQ_BITS));
}

#endif
