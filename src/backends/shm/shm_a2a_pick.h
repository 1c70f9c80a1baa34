/* How rank 0 picks the path of a large shm all-to-all(v): staged rounds or
   single copy, per class of calls (see shm_coll.c, a2a_large). The rules
   alone, without the segment, so that they are tested by themselves.

   Which path is faster depends on the host (each won by up to 2x on
   different starts of one VM: docs/PERFORMANCE.md) and on the call: in
   place, single copy lands the blocks in scratch first, while staged rounds
   skip the rank's own block. So a class is a size (128 KiB and less, then
   by 2x) and in place or not. A class's first calls take the two paths in
   turn; the first of each path is not timed (it pays first touches of
   scratch and page tables). Then the faster one, and the other again at
   the 8th, 16th, 32nd, ... call and every A2A_RETRY-th after. */
#ifndef BRAID_SHM_A2A_PICK_H
#define BRAID_SHM_A2A_PICK_H

#include <stddef.h>
#include <stdint.h>

#define SHM_A2A_SIZES 16                    /* size classes */
#define SHM_A2A_CLASSES (2 * SHM_A2A_SIZES) /* each size out of place and in place */
#define SHM_A2A_TRY 8                       /* calls of a class that alternate */
#define SHM_A2A_RETRY 256

typedef struct shm_a2a_class {
  uint64_t calls;
  double time[2]; /* estimated seconds per call: [0] staged, [1] single copy */
  int seen[2];    /* calls timed of each path, up to 2 (the first is not counted) */
} shm_a2a_class;

static inline int shm_a2a_class_of(size_t most, int inplace) {
  int k = 0;
  while (k < SHM_A2A_SIZES - 1 && most >= ((size_t)128 << 10) << k) k++;
  return k + (inplace ? SHM_A2A_SIZES : 0);
}

/* The path of a class's next call, 1 for single copy; mode: 0 automatic,
   1 staged, 2 single copy (BRAID_SHM_A2A). */
static inline int shm_a2a_next(const shm_a2a_class *t, int mode) {
  if (mode) return mode == 2;
  if (t->calls < SHM_A2A_TRY || t->seen[0] < 2 || t->seen[1] < 2) return (int)(t->calls & 1);
  const int best = t->time[1] < t->time[0];
  const int retry = (t->calls & (t->calls - 1)) == 0 || t->calls % SHM_A2A_RETRY == 0;
  return retry ? !best : best;
}

/* A call of the class took `direct`'s path and dt seconds. An estimate
   falls to a faster call at once and rises by a quarter of a slower one's
   excess: a call the scheduler or an interrupt slowed moves it little. */
static inline void shm_a2a_record(shm_a2a_class *t, int direct, double dt) {
  int *seen = &t->seen[direct];
  double *est = &t->time[direct];
  if (*seen == 1 || (*seen > 1 && dt < *est)) *est = dt;
  else if (*seen > 1) *est = 0.75 * *est + 0.25 * dt;
  if (*seen < 2) (*seen)++;
  t->calls++;
}

#endif
