/* shm: the native collectives. Small calls go through per-rank slots
   (flat exchange) or a ring of broadcast entries, larger ones through
   staging rounds or chunk streams, the largest by single copy; buffers in
   braid memory are read in place. Every call also publishes its descriptor
   digest where peers already look (slot words, phase posts, the call log),
   so ranks in different collectives fail with BRAID_ERR_MISMATCH instead of
   exchanging garbage. See docs/SHM.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/shm/shm.h"
#include "os/time.h"

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static char *slot_of(shm_state *s, int r, int parity) {
  return s->base + s->hdr->off_slots + ((size_t)r * 2 + (size_t)parity) * SHM_SLOT_BYTES;
}
static char *bring_of(shm_state *s, uint64_t b) {
  return s->base + s->hdr->off_bring + (size_t)(b % SHM_BRING) * SHM_SLOT_BYTES;
}
static _Atomic uint64_t *slot_seq(char *slot) { return (_Atomic uint64_t *)slot; }
/* Up to 56 bytes share the sequence word's cache line (one miss for the
   reader); larger payloads start on the next line: copies from a source
   8 bytes off a line ran 3-4 times slower from 4 KiB on the measured CPU
   (2 ranks, 8 KiB broadcast: 3.8 us at +8, 0.9 us at +64). */
static char *slot_data(char *slot, size_t bytes) { return slot + (bytes <= 56 ? 8 : 64); }
static char *staging_of(shm_state *s, int r) { return s->base + s->hdr->off_staging + (size_t)r * s->staging; }

/* ---------------------------------------------------------------- phase flags */

static inline uint64_t flag_of(shm_state *s, int q) {
  return atomic_load_explicit(&shm_ctl_of(s, q)->flag, memory_order_acquire);
}

void shm_post(shm_state *s) {
  atomic_store_explicit(&shm_ctl_of(s, s->me)->flag, ++s->ph, memory_order_release);
  shm_wake_peers(s);
}

static braid_status wait_flag(braid_comm *c, shm_state *s, int q, uint64_t v, const char *what) {
  SHM_WAIT_UNTIL(flag_of(s, q) >= v, q, what);
  return BRAID_OK;
}

braid_status shm_wait_all(braid_comm *c, shm_state *s, uint64_t v, const char *what) {
  for (int q = 0; q < s->n; q++) {
    if (q == s->me) continue;
    SHM_WAIT_UNTIL(flag_of(s, q) >= v, q, what);
  }
  return BRAID_OK;
}

/* ---------------------------------------------------------------- the call check */

/* Slot and ring-entry words carry a counter in the high half and the
   call's digest in the low half. */
static inline uint64_t word_of(uint64_t k, uint32_t hash) { return (k & 0x7fffffffu) << 32 | hash; }
static inline int word_is(uint64_t w, uint64_t k) { return (w >> 32) == (k & 0x7fffffffu); }
/* From ring call 2^31 on, a ring entry's word left by a call 2^31 ring
   calls earlier reads like the current one (an entry's first word is
   rewritten only by some kinds of call): the writer's 64-bit count of
   finished ring calls decides then. The flat slots need no such rule:
   every exchange rewrites every rank's slot. */
static inline int ring_wrapped(uint64_t b) { return b + 1 > 0x7fffffffu; }

/* The newest entry of rank q's call log: its sequence number, 0 if none. */
static uint64_t newest_logged(braid_comm *c, shm_state *s, int q, braid__desc *d) {
  uint64_t best = 0;
  for (uint64_t i = 0; i < SHM_DLOG; i++) {
    braid__desc x;
    uint64_t sq = atomic_load_explicit(&shm_dlog_of(s, q)[i].seq, memory_order_acquire);
    if (sq > best && shm_peer_desc(c, q, sq, &x)) {
      best = sq;
      *d = x;
    }
  }
  return best;
}

/* A digest differed or two roots claimed one broadcast: the call logs name
   a rank whose collective #seq is another call (hint first), or, when none
   logged #seq differently, the rank whose post carried a digest of another
   sequence number (it skipped or added a collective). */
static braid_status mismatch(braid_comm *c, shm_state *s, int hint) {
  braid__desc d;
  for (int i = 0; i < s->n; i++) {
    int q = hint >= 0 ? (hint + i) % s->n : i;
    if (q != s->me && shm_peer_desc(c, q, c->seq, &d) && !braid__desc_equal(&d, &c->desc))
      return braid__coll_mismatch(c, q, &d);
  }
  /* Digests agree on this call but differ: an earlier ring call that
     nobody read differed. */
  uint64_t from = s->full_seq + 1, logged = c->seq > SHM_DLOG ? c->seq - SHM_DLOG : 1;
  for (uint64_t sq = from > logged ? from : logged; sq < c->seq; sq++) { /* what the call logs still hold */
    braid__desc mine;
    if (!shm_peer_desc(c, s->me, sq, &mine)) continue;
    for (int i = 0; i < s->n; i++) {
      int q = hint >= 0 ? (hint + i) % s->n : i;
      if (q != s->me && shm_peer_desc(c, q, sq, &d) && !braid__desc_equal(&d, &mine))
        return braid__coll_mismatch_of(c, sq, &mine, q, &d, sq);
    }
  }
  int q = hint >= 0 ? hint : (s->me + 1) % s->n;
  uint64_t at = newest_logged(c, s, q, &d);
  if (at) return braid__coll_mismatch_at(c, q, &d, at);
  return braid__fail_comm(c, BRAID_ERR_MISMATCH, "rank %d is not in collective #%llu like this rank", q,
                          (unsigned long long)c->seq);
}

/* Every collective starts here (native or generic): its descriptor goes in
   the call log and its digest beside the phase flag (read by peers after
   they see a post).
   Ring calls (small broadcasts, scatters, gathers, reduces) let writers
   return without reading anything: the root of a scatter and a non-root of
   a gather both write, so if they disagree nobody would see it. Every call
   therefore compares its digest folded with a digest of the ring calls since
   the last call in which every rank compared every other's (a slot
   exchange, a staged call): ranks that disagreed on a ring call differ
   there, and each of them learns it. */
void shm_coll_start(braid_comm *c) {
  shm_state *s = c->be;
  shm_dlog_enter(c, s);
  s->chash = c->desc_hash ^ s->rdig;
  atomic_store_explicit(&s->mine->dhash, s->chash, memory_order_relaxed);
}

static void ring_fold(braid_comm *c, shm_state *s) {
  if (c->check) s->rdig = (s->rdig ^ s->chash) * 0x9e3779b1u + 1u;
}

/* Every rank compared its digest with every other's: agreed so far. */
static void all_compared(braid_comm *c, shm_state *s) {
  s->rdig = 0;
  s->full_seq = c->seq;
}

/* After the first wait for every peer's post: did each post for this call? */
static braid_status check_posts(braid_comm *c, shm_state *s) {
  if (!c->check) return BRAID_OK;
  for (int q = 0; q < s->n; q++)
    if (q != s->me && atomic_load_explicit(&shm_ctl_of(s, q)->dhash, memory_order_relaxed) != s->chash)
      return mismatch(c, s, q);
  all_compared(c, s);
  return BRAID_OK;
}

/* A receiver of a streamed broadcast: the root logged its call before its
   first chunk. */
static braid_status check_root(braid_comm *c, int root) {
  braid__desc d;
  if (c->check && shm_peer_desc(c, root, c->seq, &d) && !braid__desc_equal(&d, &c->desc))
    return braid__coll_mismatch(c, root, &d);
  return BRAID_OK;
}

/* A root of a streamed broadcast: sequence numbers of streamed broadcasts
   are claimed in increasing order, so a second root of the same call (ranks
   that disagree on the root) finds its number taken. */
static braid_status claim_stream_root(braid_comm *c, shm_state *s) {
  if (!c->check) return BRAID_OK;
  for (uint64_t v = atomic_load_explicit(&s->hdr->bclaim, memory_order_relaxed);;) {
    if (v >= c->seq) return mismatch(c, s, -1);
    if (atomic_compare_exchange_weak(&s->hdr->bclaim, &v, c->seq)) return BRAID_OK;
  }
}

/* ---------------------------------------------------------------- slices */

static void slice_of(size_t count, int n, int q, size_t *start, size_t *len) {
  size_t base = count / (size_t)n, rem = count % (size_t)n, uq = (size_t)q;
  *start = uq * base + (uq < rem ? uq : rem);
  *len = base + (uq < rem ? 1 : 0);
}

/* ---------------------------------------------------------------- flat small-message collectives */

/* The slot of this rank for the next exchange (its parity in *parity, its
   counter in *k), to be filled before flat_finish. */
static char *flat_slot(shm_state *s, int *parity, uint64_t *k) {
  *k = ++s->cseq;
  *parity = (int)(*k & 1);
  return slot_of(s, s->me, *parity);
}

/* Publishes this rank's filled slot and waits for every other rank's. */
static braid_status flat_finish(braid_comm *c, shm_state *s, uint64_t k, int parity, const char *what) {
  atomic_store_explicit(slot_seq(slot_of(s, s->me, parity)), word_of(k, s->chash), memory_order_release);
  shm_wake_peers(s);
  for (int q = 0; q < s->n; q++) {
    if (q == s->me) continue;
    _Atomic uint64_t *seq = slot_seq(slot_of(s, q, parity));
    uint64_t w;
    SHM_WAIT_UNTIL(word_is(w = atomic_load_explicit(seq, memory_order_acquire), k), q, what);
    if ((uint32_t)w != s->chash && c->check) return mismatch(c, s, q);
  }
  all_compared(c, s);
  return BRAID_OK;
}

/* Every rank publishes `bytes` from src (may be NULL when bytes is 0) in its
   slot of this exchange's parity (returned in *parity) and waits for every
   other rank's. A slot is reused two exchanges later, by when every reader
   has moved on: each exchange waits for every rank, so starting exchange k
   means every rank has finished k-2. Collectives that do not wait for every
   rank (the ring calls) therefore never use the slots. */
static braid_status flat_exchange(braid_comm *c, shm_state *s, const void *src, size_t bytes, int *parity,
                                  const char *what) {
  uint64_t k;
  char *mine = flat_slot(s, parity, &k);
  if (bytes) memcpy(slot_data(mine, bytes), src, bytes);
  braid_status st = flat_finish(c, s, k, *parity, what);
  if (st) return st;
  /* Every rank has posted this exchange, so none reads this rank's slot of
     the other parity any more: it is taken for writing now, as many lines
     as this exchange used, so that the next exchange's post does not wait
     behind the other cores' copies being invalidated. */
  shm_prefetch_lines(slot_of(s, s->me, *parity ^ 1), (size_t)(slot_data(mine, bytes) - mine) + bytes, 1);
  return BRAID_OK;
}

/* Before a call that compares no digests of its own (a generic algorithm,
   a streamed broadcast): ring calls not yet compared are, in an empty slot
   exchange. Ranks that agree on every call agree on whether one is due. */
braid_status shm_settle(braid_comm *c) {
  shm_state *s = c->be;
  int p;
  if (!c->check || !s->rdig) return BRAID_OK;
  return flat_exchange(c, s, NULL, 0, &p, "its check of the calls before this one");
}

static const void **srcs_array(shm_state *s, const void **stackbuf, int cap) {
  if (s->n <= cap) return stackbuf;
  return malloc(2 * sizeof(void *) * (size_t)s->n);
}

/* srcs: reduction inputs, one per rank; zsrc: each peer's buffer read in
   place (braid memory), NULL where the peer stages. */
#define SRCS_DECL                                                                                   \
  const void *srcs_stack_[32];                                                                      \
  const void **srcs = srcs_array(s, srcs_stack_, 16);                                               \
  if (!srcs) return braid__fail_comm(c, BRAID_ERR_NO_MEMORY, "out of memory for %d source pointers", s->n); \
  const char **zsrc = (const char **)(srcs + s->n);                                                 \
  (void)zsrc
#define SRCS_FREE \
  if (srcs != srcs_stack_) free((void *)srcs)

/* After the post that carried this operation's announcements (key): fills
   zsrc with every peer's buffer in braid memory (NULL where it has none) and
   counts the ranks, this one (zme) included, whose buffers are there. */
static braid_status zc_gather(braid_comm *c, shm_state *s, uint64_t key, int zme, const char **zsrc, int *nzc) {
  *nzc = zme;
  zsrc[s->me] = NULL;
  for (int q = 0; q < s->n; q++) {
    if (q == s->me) continue;
    braid_status st = shm_zc_peer(c, s, q, key, &zsrc[q]);
    if (st) return st;
    if (zsrc[q]) (*nzc)++;
  }
  return BRAID_OK;
}

/* ---------------------------------------------------------------- streaming */

/* Chunk of the streaming collectives (broadcast, all-gather): small enough
   that a message is split into a few pieces whose copies in and out overlap,
   large enough that per-chunk synchronization costs little; cache-resident
   either way. Pieces under 64 KiB pipeline badly between two cores (xcore_bw:
   8 GB/s with 16 KiB, 18 GB/s with 64 KiB, 23-33 GB/s with 256 KiB; 2 ranks,
   64 KiB broadcast: 7 us in four pieces, 2-4 us in one). At least two chunks
   fit in the staging space. */
static size_t stream_chunk(shm_state *s, size_t bytes) {
  size_t c = bytes / 4;
  if (c < (64u << 10)) c = 64u << 10;
  if (c > (256u << 10)) c = 256u << 10;
  if (c > s->staging / 2) c = s->staging / 2;
  return round_up(c, SHM_CL);
}

/* Slot spacing of streamed broadcasts: the largest chunk, so slots stay put
   whatever the sizes of consecutive broadcasts. */
static size_t stream_stride(shm_state *s) {
  size_t c = (size_t)256 << 10;
  return c < s->staging / 2 ? c : s->staging / 2;
}

/* Every other rank has finished streamed-broadcast chunk v-1. */
static braid_status wait_stream(braid_comm *c, shm_state *s, uint64_t v, const char *what) {
  for (int q = 0; q < s->n; q++) {
    if (q == s->me) continue;
    SHM_WAIT_UNTIL(atomic_load_explicit(&shm_ctl_of(s, q)->stream_done, memory_order_acquire) >= v, q, what);
  }
  return BRAID_OK;
}

/* Staging half h once the root of an earlier reduce has read what this
   rank staged there (red_to_root). */
static braid_status half_free(braid_comm *c, shm_state *s, int h) {
  if (s->hroot[h] < 0) return BRAID_OK;
  braid_status st = wait_flag(c, s, s->hroot[h], s->hneed[h], "the root's reduce of its input to an earlier braid_reduce");
  if (!st) s->hroot[h] = -1;
  return st;
}

/* Both staging halves free of earlier reduces' inputs. */
static braid_status halves_free(braid_comm *c, shm_state *s) {
  braid_status st = half_free(c, s, 0);
  return st ? st : half_free(c, s, 1);
}

/* Every chunk of earlier streamed broadcasts copied out. */
static braid_status streams_copied(braid_comm *c, shm_state *s) {
  return s->sseq ? wait_stream(c, s, s->sseq, "its copy of an earlier braid_broadcast") : BRAID_OK;
}

/* Before a collective writes this rank's staging: streamed broadcasts do not
   wait for their readers, and reduces do not wait for their root, so some
   may still copy from it. */
static braid_status staging_quiesce(braid_comm *c, shm_state *s) {
  braid_status st = streams_copied(c, s);
  return st ? st : halves_free(c, s);
}

/* ---------------------------------------------------------------- all-reduce */

static braid_status ar_flat(braid_comm *c, shm_state *s, void *buf, size_t count, braid_dtype dt, braid_op op) {
  size_t bytes = count * braid_dtype_size(dt);
  int p;
  braid_status st = flat_exchange(c, s, buf, bytes, &p, "its input to braid_all_reduce");
  if (st) return st;
  SRCS_DECL;
  for (int q = 0; q < s->n; q++) srcs[q] = q == s->me ? buf : slot_data(slot_of(s, q, p), bytes);
  braid__reduce(buf, srcs, s->n, count, dt, op, s->n);
  SRCS_FREE;
  return BRAID_OK;
}

/* Calls that stage at most SHM_ROTATE bytes per rank do not start where the
   last one did: they move through the first SHM_ROTATE_REGION bytes of their
   region, `used` bytes at a time. Writing again lines a peer has just read
   is slow (the writer must take them back; 2 ranks on 2 cores: all-reduce
   64 KiB 11-14 vs 4.6-5 us, all-gather 64 KiB 5.4 vs 2.1 us). 2 MiB, about
   twice a core's L2 on the measured VM, beat 1, 4 and 8 MiB (all-gather
   1 MiB in place 30 us vs 35 us over 8 MiB; reduce-scatter 256 KiB 11 vs
   13-14 us). Larger calls stay at the start, whose lines stay cached
   (moving them too made 4 MiB all-reduces 25 % slower). All ranks count
   calls alike, so they agree. Returns the n-th offset. */
static size_t rotate(uint64_t n, size_t used, size_t total, size_t room) {
  if (room > SHM_ROTATE_REGION) room = SHM_ROTATE_REGION;
  if (total > SHM_ROTATE || used == 0 || used > room) return 0;
  return (size_t)(n % (room / used)) * used;
}

/* Offset in every rank's staging of the next staging round, which uses
   `used` bytes of a call that stages `total` bytes: the halves alternate
   (see red_staging), and small calls rotate within a half. */
static size_t stage_slot(shm_state *s, size_t used, size_t total) {
  size_t half = s->staging / 2;
  uint64_t r = s->round++;
  return (size_t)(r & 1) * half + rotate(r >> 1, round_up(used, 4096), total, half);
}

/* Staging rounds: each rank copies a range of its input into its staging half
   (E), reduces its slice of the range from every rank's staging in rank order
   (R), then copies the other slices' results. The halves alternate by a round
   counter shared by all ranks; a half is rewritten two rounds later, after
   every rank has posted E of the round in between, which comes after it
   finished reading.
   A rank whose buffer is braid memory skips E and reduces into its own
   buffer; peers read its input slice and its result there instead of in
   staging (announced with the first post). Only rank r reads or writes slice
   r of any buffer until it posts the slice's result, and a buffer is read in
   place until the end barrier.
   root >= 0 makes it a reduce: in is read, only the root copies results (into
   out), and buffers are never read in place (a non-root's send buffer must
   not receive its reduced slice). Non-roots need not wait for R: the next
   round's E waits cover the reuse of a half, and the end post lets them
   rewrite staging once the root has copied out of it. */
static braid_status red_staging(braid_comm *c, shm_state *s, const char *in, char *out, size_t count, braid_dtype dt,
                                braid_op op, int root) {
  const int ar = root < 0;
  braid_status st = staging_quiesce(c, s);
  if (st) return st;
  size_t es = braid_dtype_size(dt), half = s->staging / 2;
  size_t per_round = half / es;
  /* Keep a round's slices L2-sized so the reduce reads cached data. */
  size_t cap = ((size_t)s->n * (256u << 10)) / es;
  if (per_round > cap) per_round = cap;
  const int gets = ar || root == s->me; /* this rank receives the result */
  SRCS_DECL;
  /* In place from braid memory only when ranks outnumber cores: there every
     copy saved is CPU time the other ranks get (4 ranks on 2 cores, 1 MiB:
     115-136 us against 181-191 us). With a core per rank, E's streaming
     copy claims the staging lines before the reduce, which beats writing
     lines the peers have just read while reading theirs (2 ranks, 1 MiB:
     70 us staged, 90 us in place). */
  uint64_t key = s->ph + 1;
  int zme = ar && s->oversub && shm_zc_announce(s, in, count * es, key), nzc = 0;
  for (size_t off = 0; off < count && !st; off += per_round) {
    size_t L = count - off < per_round ? count - off : per_round;
    size_t h = stage_slot(s, L * es, count * es);
    char *stage = staging_of(s, s->me) + h;
    if (!zme) memcpy(stage, in + off * es, L * es);
    shm_post(s);
    if ((st = shm_wait_all(c, s, s->ph, ar ? "its input to braid_all_reduce" : "its input to braid_reduce"))) break;
    if (off == 0 && (st = check_posts(c, s))) break;
    if (off == 0 && (st = zc_gather(c, s, key, zme, zsrc, &nzc))) break;
    size_t a, m;
    slice_of(L, s->n, s->me, &a, &m);
    char *mine = zme ? out + (off + a) * es : stage + a * es;
    if (m) {
      for (int q = 0; q < s->n; q++)
        srcs[q] = q == s->me ? mine : zsrc[q] ? zsrc[q] + (off + a) * es : staging_of(s, q) + h + a * es;
      braid__reduce(mine, srcs, s->n, m, dt, op, s->n);
    }
    shm_post(s);
    if (!gets) continue;
    if (m && !zme) memcpy(out + (off + a) * es, mine, m * es);
    if ((st = shm_wait_all(c, s, s->ph,
                           ar ? "its reduced slice in braid_all_reduce" : "its reduced slice in braid_reduce")))
      break;
    for (int q = 0; q < s->n; q++) {
      if (q == s->me) continue;
      size_t aq, mq;
      slice_of(L, s->n, q, &aq, &mq);
      if (mq)
        memcpy(out + (off + aq) * es, zsrc[q] ? zsrc[q] + (off + aq) * es : staging_of(s, q) + h + aq * es, mq * es);
    }
  }
  SRCS_FREE;
  if (st) return st;
  shm_post(s);
  if (ar) return shm_wait_all(c, s, s->ph, "the end of braid_all_reduce");
  return root == s->me ? BRAID_OK : wait_flag(c, s, root, s->ph, "the root's copy of the reduced slices in braid_reduce");
}

/* Reduce to the root in staging rounds where only the root reduces: the
   others copy each range of their input into staging (E), post, and go on,
   out of the call too; the root reduces its input and every peer's staged
   range straight into out (R) and posts. Against red_staging the root skips
   its own staging copy and the copy-out of the other slices, and
   back-to-back reduces overlap. A half is rewritten, in this call or any
   later one (staging_quiesce), once the root has posted the round that
   used it (hroot, hneed). The root compares every rank's logged call with
   its own before its first R, but a non-root does not learn the outcome,
   so the call counts as a ring call for the call check (see
   shm_coll_start). */
static braid_status red_to_root(braid_comm *c, shm_state *s, const char *in, char *out, size_t count, braid_dtype dt,
                                braid_op op, int root) {
  braid_status st = streams_copied(c, s);
  if (st) return st;
  size_t es = braid_dtype_size(dt);
  /* Small ranges: the root reduces one while the others stage the next. */
  size_t per_round = (s->staging / 2) / es, cap = SHM_REDUCE_RANGE / es;
  if (per_round > cap) per_round = cap;
  const int me_root = s->me == root;
  const uint64_t base = s->ph;
  SRCS_DECL;
  uint64_t i = 0;
  for (size_t off = 0; off < count && !st; off += per_round, i++) {
    size_t L = count - off < per_round ? count - off : per_round;
    int half = (int)(s->round & 1);
    size_t h = stage_slot(s, L * es, count * es);
    if (!me_root) {
      if ((st = half_free(c, s, half))) break;
      memcpy(staging_of(s, s->me) + h, in + off * es, L * es);
      shm_post(s);
      s->hroot[half] = root;
      s->hneed[half] = s->ph; /* the root's post of this round has the same number */
      continue;
    }
    if ((st = shm_wait_all(c, s, base + i + 1, "its input to braid_reduce"))) break;
    /* A non-root may be calls ahead by now: its log, not its digest. */
    for (int q = 0; q < s->n && i == 0 && !st; q++)
      if (q != s->me) st = check_root(c, q);
    if (st) break;
    for (int q = 0; q < s->n; q++) srcs[q] = q == s->me ? in + off * es : staging_of(s, q) + h;
    braid__reduce(out + off * es, srcs, s->n, L, dt, op, s->n);
    shm_post(s);
  }
  SRCS_FREE;
  if (!st) ring_fold(c, s);
  return st;
}

/* Single copy: each rank reduces its slice by reading every peer's buffer in
   L2-sized chunks (in place where it is braid memory) and writes the result
   into every peer's buffer, so each byte of each buffer is read once and
   written once. Only rank r touches slice r anywhere, so the phases need no
   synchronization: a start barrier (addresses published, inputs ready) and
   an end barrier (every write into this rank's buffer done). */
static braid_status ar_cma(braid_comm *c, shm_state *s, char *buf, size_t count, braid_dtype dt, braid_op op) {
  size_t es = braid_dtype_size(dt);
  shm_ctl *mine = shm_ctl_of(s, s->me);
  mine->addr = (uint64_t)(uintptr_t)buf;
  uint64_t key = s->ph + 1;
  int zme = shm_zc_announce(s, buf, count * es, key), nzc;
  shm_post(s);
  braid_status st = shm_wait_all(c, s, s->ph, "its buffer address in braid_all_reduce");
  if (!st) st = check_posts(c, s);
  if (st) return st;
  size_t a, m;
  slice_of(count, s->n, s->me, &a, &m);
  size_t chunk = s->tmp_each / es;
  SRCS_DECL;
  st = zc_gather(c, s, key, zme, zsrc, &nzc);
  for (size_t x = a; x < a + m && !st; x += chunk) {
    size_t len = a + m - x < chunk ? a + m - x : chunk;
    int k = 0;
    for (int q = 0; q < s->n && !st; q++) {
      if (q == s->me) {
        srcs[q] = buf + x * es;
        continue;
      }
      if (zsrc[q]) {
        srcs[q] = zsrc[q] + x * es;
        continue;
      }
      char *t = s->tmp + (size_t)k++ * s->tmp_each;
      st = shm_cma_read(c, s, q, t, shm_ctl_of(s, q)->addr + x * es, len * es);
      srcs[q] = t;
    }
    if (st) break;
    braid__reduce(buf + x * es, srcs, s->n, len, dt, op, s->n);
    for (int q = 0; q < s->n && !st; q++)
      if (q != s->me) st = shm_cma_write(c, s, q, shm_ctl_of(s, q)->addr + x * es, buf + x * es, len * es);
  }
  SRCS_FREE;
  if (st) return st;
  shm_post(s);
  return shm_wait_all(c, s, s->ph, "the end of braid_all_reduce");
}

braid_status shm_all_reduce(braid_comm *c, void *buf, size_t count, braid_dtype dt, braid_op op) {
  shm_state *s = ((shm_state *)c->be);
  if (s->n == 1) {
    const void *src = buf;
    braid__reduce(buf, &src, 1, count, dt, op, 1);
    return BRAID_OK;
  }
  size_t bytes = count * braid_dtype_size(dt);
  if (bytes <= SHM_SLOT_DATA) return ar_flat(c, s, buf, count, dt, op);
  if (s->cma && bytes >= s->cma_min) return ar_cma(c, s, buf, count, dt, op);
  return red_staging(c, s, buf, buf, count, dt, op, -1);
}

/* ---------------------------------------------------------------- broadcast */

/* Small broadcasts and scatters, and small gathers and reduces, go through a
   ring of entries shared by all roots (every rank runs the same such calls
   in the same order, so entry b serves the b-th). Nobody waits for the
   whole group: a writer copies its data into the entry and returns unless
   the ring is full, so back-to-back calls pipeline, which matters most when
   ranks outnumber cores. An entry is rewritten only once every rank has
   finished the call that used it SHM_BRING calls earlier. */
static braid_status ring_reuse(braid_comm *c, shm_state *s, uint64_t b, const char *what) {
  /* The slowest rank's count, remembered: reading the peers' counters on
     every call would pull lines they keep writing. */
  if (b < SHM_BRING || b - SHM_BRING + 1 <= s->ring_low) return BRAID_OK;
  uint64_t low = UINT64_MAX;
  for (int q = 0; q < s->n; q++) {
    if (q == s->me) continue;
    uint64_t v;
    SHM_WAIT_UNTIL((v = atomic_load_explicit(&shm_ctl_of(s, q)->bcast_done, memory_order_acquire)) >= b - SHM_BRING + 1,
                   q, what);
    if (v < low) low = v;
  }
  s->ring_low = low;
  return BRAID_OK;
}

/* This rank has finished ring call b. After the stores that came before:
   readers wait for the entry, and whichever rank writes the entry
   SHM_BRING calls later may sleep waiting for bcast_done. */
static void ring_done(braid_comm *c, shm_state *s, uint64_t b) {
  ring_fold(c, s);
  atomic_store_explicit(&shm_ctl_of(s, s->me)->bcast_done, b + 1, memory_order_release);
  shm_wake_peers(s);
}

/* Whether this ring call's root is the last ring call's too (a guess that the
   next one's is as well). */
static int ring_same_root(shm_state *s, int root) {
  int same = root == s->ring_last_root;
  s->ring_last_root = root;
  return same;
}

/* One to all: the root copies total bytes from src into the entry; every
   other rank copies len bytes from offset at of it into dst.
   Ranks that disagree on the root may write the same entry at once. A
   root marks the entry as its own (its ring_root) before writing it, and
   its word carries its digest; a reader checks the word and then, after
   copying, that no rank other than its root marked the entry: bytes of a
   second root in its copy mean that root's mark was visible first. A root
   reads nothing (a locked claim of the entry cost each call a wait for
   the last call's stores to reach the other cores); a second root learns
   of the disagreement at its next call that compares digests. */
static braid_status ring_from_root(braid_comm *c, shm_state *s, const void *src, size_t total, void *dst, size_t at,
                                   size_t len, int root, const char *call) {
  uint64_t b = s->bseq++;
  char *e = bring_of(s, b);
  if (s->me == root) {
    braid_status st = ring_reuse(c, s, b, "its copy of an earlier small broadcast or scatter");
    if (st) return st;
    if (c->check) {
      atomic_store_explicit(&shm_ctl_of(s, s->me)->ring_root[b % SHM_BRING], b + 1, memory_order_relaxed);
      atomic_thread_fence(memory_order_release); /* the mark before the bytes */
    }
    memcpy(slot_data(e, total), src, total);
    atomic_store_explicit(slot_seq(e), word_of(b + 1, s->chash), memory_order_release);
  } else {
    uint64_t w;
    if (ring_wrapped(b))
      SHM_WAIT_UNTIL(atomic_load_explicit(&shm_ctl_of(s, root)->bcast_done, memory_order_acquire) >= b + 1, root,
                     call);
    SHM_WAIT_UNTIL(word_is(w = atomic_load_explicit(slot_seq(e), memory_order_acquire), b + 1), root, call);
    if ((uint32_t)w != s->chash && c->check) return mismatch(c, s, root);
    memcpy(dst, slot_data(e, total) + at, len);
    if (c->check && s->n > 2) {
      atomic_thread_fence(memory_order_acquire); /* the bytes before the marks */
      for (int q = 0; q < s->n; q++)
        if (q != root && q != s->me &&
            atomic_load_explicit(&shm_ctl_of(s, q)->ring_root[b % SHM_BRING], memory_order_relaxed) == b + 1)
          return mismatch(c, s, q);
    }
  }
  ring_done(c, s, b);
  /* When the last two calls had one root, the next likely has it too: its
     entry's lines start on their way while the rest of this call and the
     next call's checks run, as many as this call used. The root takes them
     for writing, so its stores do not wait for the other cores' copies to
     be invalidated; a reader fetches what a root running ahead may have
     written. (With roots taking turns this would take lines from the next
     root, so nothing is fetched then.) */
  if (!ring_same_root(s, root)) return BRAID_OK;
  char *next = bring_of(s, s->bseq), *data = slot_data(next, total);
  if (s->me == root) {
    shm_prefetch_lines(next, (size_t)(data - next) + total, 1);
  } else {
    shm_prefetch_lines(next, SHM_CL, 0);
    shm_prefetch_lines(data + at, len, 0);
  }
  return BRAID_OK;
}

/* All to one: every rank has a section of the entry (a word, then its
   bytes, cache-line aligned, so writers do not share lines). */
static size_t ring_stride(size_t bytes) { return bytes <= 56 ? SHM_CL : SHM_CL + round_up(bytes, SHM_CL); }
static int ring_fits_all(const shm_state *s, size_t bytes) {
  return bytes <= SHM_SLOT_BYTES && ring_stride(bytes) <= SHM_SLOT_BYTES / (size_t)s->n;
}

#define RING_AHEAD_MAX 1024
/* Sections up to this size are taken for writing a call ahead by their
   writers (ring_to_root). */
#define RING_WRITE_AHEAD_MAX 512

/* Every rank but the root copies its bytes into its section and returns;
   the root fills from[q] with every rank's bytes (its own src) and must
   call ring_done(c, s, *bp) once it has read them. */
static braid_status ring_to_root(braid_comm *c, shm_state *s, const void *src, size_t bytes, int root,
                                 const void **from, uint64_t *bp, const char *call) {
  uint64_t b = *bp = s->bseq++;
  char *e = bring_of(s, b);
  size_t stride = ring_stride(bytes);
  int same = ring_same_root(s, root);
  if (s->me != root) {
    braid_status st = ring_reuse(c, s, b, "the root's read of an earlier small gather or reduce");
    if (st) return st;
    char *mine = e + (size_t)s->me * stride;
    memcpy(slot_data(mine, bytes), src, bytes);
    atomic_store_explicit(slot_seq(mine), word_of(b + 1, s->chash), memory_order_release);
    ring_done(c, s, b);
    /* The root read this rank's section of the next entry 63 calls ago, so
       a store into it waits until the root's copy is invalidated, and every
       later store of the rank queues behind it: the next call would run at
       the pace of one cache-line round trip. Taking the line for writing
       now overlaps that round trip with the rest of this call and the
       next one's checks. */
    if (same && bytes <= RING_WRITE_AHEAD_MAX) shm_prefetch_lines(bring_of(s, s->bseq) + (size_t)s->me * stride, stride, 1);
    return BRAID_OK;
  }
  for (int q = 0; q < s->n; q++) {
    if (q == s->me) {
      from[q] = src;
      continue;
    }
    char *sec = e + (size_t)q * stride;
    uint64_t w;
    /* A section's word may lie where an earlier call that used the entry
       with another layout left payload bytes. With the call check those
       bytes would have to hold the call's digest too; without it, data
       can look like the word, so the writer's count of finished ring
       calls decides (it counts this call once the word is written), as it
       does past the wrap. */
    if (!c->check || ring_wrapped(b))
      SHM_WAIT_UNTIL(atomic_load_explicit(&shm_ctl_of(s, q)->bcast_done, memory_order_acquire) >= b + 1, q, call);
    SHM_WAIT_UNTIL(word_is(w = atomic_load_explicit(slot_seq(sec), memory_order_acquire), b + 1), q, call);
    if ((uint32_t)w != s->chash && c->check) return mismatch(c, s, q);
    from[q] = slot_data(sec, bytes);
  }
  /* The senders return without waiting, so in a loop they run ahead: when
     the last call had this root too, the next entry's sections are likely
     written already, and their lines start on their way while this call
     reduces or copies. Above RING_AHEAD_MAX the lines fetched early are
     more often still being written, and it measured slower; so did
     fetching several calls ahead where the cores are close (the lines are
     then often still the writers'). */
  if (same && bytes <= RING_AHEAD_MAX) {
    char *next = bring_of(s, s->bseq);
    for (int q = 0; q < s->n; q++)
      if (q != s->me) shm_prefetch_lines(next + (size_t)q * stride, stride, 0);
  }
  return BRAID_OK;
}

/* Zero copy: the root's buffer is braid memory. It announces the buffer in
   place of the first chunk (key: the stream sequence number), each receiver
   copies the whole message straight from it and reports the chunk done, and
   the root returns once every receiver has (its buffer is free again). */
static braid_status bcast_zc_root(braid_comm *c, shm_state *s, uint64_t g) {
  shm_wake_peers(s);
  braid_status st = wait_stream(c, s, g + 1, "its copy of the root's buffer in braid_broadcast");
  if (st) return st;
  atomic_store_explicit(&shm_ctl_of(s, s->me)->stream_done, g + 1, memory_order_release);
  shm_wake_peers(s);
  return BRAID_OK;
}

braid_status shm_broadcast(braid_comm *c, void *vbuf, size_t count, braid_dtype dt, int root) {
  shm_state *s = ((shm_state *)c->be);
  if (s->n == 1) return BRAID_OK;
  char *buf = vbuf;
  size_t bytes = count * braid_dtype_size(dt);
  if (bytes <= SHM_SLOT_DATA)
    return ring_from_root(c, s, buf, bytes, buf, 0, bytes, root, "the root's data in braid_broadcast");
  braid_status st;
  if (s->cma && bytes >= s->cma_min) {
    shm_ctl_of(s, s->me)->addr = (uint64_t)(uintptr_t)buf;
    uint64_t key = s->ph + 1;
    if (s->me == root) shm_zc_announce(s, buf, bytes, key);
    shm_post(s);
    if ((st = shm_wait_all(c, s, s->ph, "its arrival in braid_broadcast")) || (st = check_posts(c, s))) return st;
    if (s->me != root) {
      const char *z;
      if ((st = shm_zc_peer(c, s, root, key, &z))) return st;
      if (z) shm_copy_out(buf, z, bytes, bytes);
      else if ((st = shm_cma_read(c, s, root, buf, shm_ctl_of(s, root)->addr, bytes))) return st;
    }
    shm_post(s);
    return shm_wait_all(c, s, s->ph, "the end of braid_broadcast");
  }
  /* Staging: the root streams the message through its staging space in
     chunks, the others copy each chunk out as soon as it is written. Chunks
     are numbered across calls and sit in fixed slots, so the root may run
     ahead into later broadcasts while the others still copy: it reuses a slot
     once every rank is past the chunk it held, and any other collective
     that writes staging first waits for all chunks to be copied out
     (staging_quiesce). No end barrier. A root buffer in braid memory takes
     the place of the first chunk instead (bcast_zc_root). */
  if ((st = shm_settle(c))) return st;
  size_t C = stream_chunk(s, bytes), stride = stream_stride(s), K = s->staging / stride;
  shm_ctl *rc = shm_ctl_of(s, root);
  uint64_t zkey = SHM_ZKEY_BCAST | (s->sseq + 1);
  if (s->me == root && (st = claim_stream_root(c, s))) return st;
  if (s->me == root && shm_zc_announce(s, buf, bytes, zkey)) return bcast_zc_root(c, s, s->sseq++);
  /* Its own chunks pace a root; a reduce's root may still read its staging. */
  if (s->me == root && (st = halves_free(c, s))) return st;
  for (size_t off = 0; off < bytes; off += C) {
    size_t L = bytes - off < C ? bytes - off : C;
    uint64_t g = s->sseq++;
    char *slot = staging_of(s, root) + (size_t)(g % K) * stride;
    if (s->me == root) {
      if (g >= K && (st = wait_stream(c, s, g - K + 1, "its copy of an earlier chunk of braid_broadcast"))) return st;
      memcpy(slot, buf + off, L);
    } else {
      SHM_WAIT_UNTIL(atomic_load_explicit(&rc->stream_done, memory_order_acquire) >= g + 1 ||
                     (off == 0 && atomic_load_explicit(&rc->zref.key, memory_order_acquire) == zkey),
                 root, "the root's data in braid_broadcast");
      if (off == 0 && (st = check_root(c, root))) return st;
      /* stream_done passes g only after this rank is done if the root
         announced its buffer instead of streaming. */
      if (off == 0 && atomic_load_explicit(&rc->stream_done, memory_order_acquire) < g + 1) {
        const char *z;
        if ((st = shm_zc_peer(c, s, root, zkey, &z))) return st;
        if (!z) return braid__fail(c, BRAID_ERR_INTERNAL, "rank %d announced a buffer this rank cannot use", root);
        shm_copy_out(buf, z, bytes, bytes);
        off = bytes; /* the whole message came in one piece */
      } else {
        shm_copy_out(buf + off, slot, L, bytes);
      }
    }
    atomic_store_explicit(&shm_ctl_of(s, s->me)->stream_done, g + 1, memory_order_release);
    shm_wake_peers(s);
  }
  return BRAID_OK;
}

/* ---------------------------------------------------------------- all-gather */

/* Every rank copies every peer's block straight from its buffer: in place
   where the peer's buffer is braid memory, else by single copy. The
   announcement post has been made and waited for; ends with a barrier, after
   which the peers' buffers are no longer read. */
static braid_status ag_direct(braid_comm *c, shm_state *s, const void *send, char *recv, size_t bytes,
                              const char **zsrc) {
  braid_status st = BRAID_OK;
  char *mine = recv + (size_t)s->me * bytes;
  if (send != mine) shm_copy_out(mine, send, bytes, bytes * (size_t)s->n);
  for (int i = 1; i < s->n && !st; i++) {
    int q = (s->me + i) % s->n; /* spread the readers over the sources */
    if (zsrc[q]) shm_copy_out(recv + (size_t)q * bytes, zsrc[q], bytes, bytes * (size_t)s->n);
    else st = shm_cma_read(c, s, q, recv + (size_t)q * bytes, shm_ctl_of(s, q)->addr, bytes);
  }
  if (st) return st;
  shm_post(s);
  return shm_wait_all(c, s, s->ph, "the end of braid_all_gather");
}

braid_status shm_all_gather(braid_comm *c, const void *send, void *vrecv, size_t count, braid_dtype dt) {
  shm_state *s = ((shm_state *)c->be);
  size_t es = braid_dtype_size(dt), bytes = count * es;
  char *recv = vrecv;
  char *mine = recv + (size_t)s->me * bytes;
  if (s->n == 1) {
    if (send != mine) memcpy(mine, send, bytes);
    return BRAID_OK;
  }
  braid_status st;
  if (bytes <= SHM_SLOT_DATA) {
    int p;
    if ((st = flat_exchange(c, s, send, bytes, &p, "its input to braid_all_gather"))) return st;
    for (int q = 0; q < s->n; q++)
      if (q != s->me) memcpy(recv + (size_t)q * bytes, slot_data(slot_of(s, q, p), bytes), bytes);
    if (send != mine) memcpy(mine, send, bytes);
    return BRAID_OK;
  }
  /* Each rank announces, with its first post, its braid memory (and, for
     single copy, its send address). Blocks in braid memory are read in
     place; when every block is, nothing is staged. Single copy serves only
     the largest blocks: staging that moves through its space (see rotate)
     beat fetching by process_vm_readv at every size measured (2 ranks in
     place: 64 KiB 2.1 vs 4.3-5.0 us, 1 MiB 37-43 vs 41-52 us, 4 MiB 118-142
     vs 167-207 us). */
  size_t pulled = bytes * (size_t)(s->n - 1);
  int cma_all = s->cma && pulled >= s->cma_min;
  uint64_t key = s->ph + 1;
  int zme = shm_zc_announce(s, send, bytes, key), nzc = 0;
  SRCS_DECL;
  if (cma_all) {
    shm_ctl_of(s, s->me)->addr = (uint64_t)(uintptr_t)send;
    shm_post(s);
    st = shm_wait_all(c, s, s->ph, "its input address in braid_all_gather");
    if (!st) st = check_posts(c, s);
    if (!st) st = zc_gather(c, s, key, zme, zsrc, &nzc);
    if (!st) st = ag_direct(c, s, send, recv, bytes, zsrc);
    SRCS_FREE;
    return st;
  }
  /* Staging: every rank streams its block through its own staging space in
     chunks; chunk j of every rank is copied out before anyone posts j as
     done (the second post of the step), and a slot is rewritten only after
     every rank has posted the chunk it held as done. Small calls start at
     a new place each time (see rotate). Blocks in braid memory are read in
     place instead. */
  if ((st = staging_quiesce(c, s))) {
    SRCS_FREE;
    return st;
  }
  size_t C = stream_chunk(s, bytes);
  if (C > bytes) C = round_up(bytes, 4096); /* one chunk: rotate by what it uses */
  size_t K = s->staging / C, nch = (bytes + C - 1) / C;
  uint64_t base = s->ph, r = rotate(s->agseq++, nch * C, bytes, K * C) / C;
  int known = 0; /* zsrc filled, from the first post on */
  for (size_t j = 0, off = 0; off < bytes && !st; j++, off += C) {
    size_t L = bytes - off < C ? bytes - off : C;
    size_t so = ((r + j) % K) * C;
    if (!zme) {
      if (j >= K && (st = shm_wait_all(c, s, base + 2 * (j - K) + 2, "its copy of an earlier chunk of braid_all_gather")))
        break;
      memcpy(staging_of(s, s->me) + so, (const char *)send + off, L);
    }
    shm_post(s);
    if (!known) {
      /* The first post carried the announcements. */
      if ((st = shm_wait_all(c, s, base + 1, "its input to braid_all_gather")) || (st = check_posts(c, s))) break;
      if ((st = zc_gather(c, s, key, zme, zsrc, &nzc))) break;
      known = 1;
      if (nzc == s->n) {
        st = ag_direct(c, s, send, recv, bytes, zsrc);
        SRCS_FREE;
        return st;
      }
    }
    if (send != mine) shm_copy_out(mine + off, (const char *)send + off, L, bytes * (size_t)s->n);
    for (int i = 1; i < s->n && !st; i++) {
      int q = (s->me + i) % s->n; /* spread the readers over the sources */
      if ((st = wait_flag(c, s, q, base + 2 * j + 1, "its input to braid_all_gather"))) break;
      const char *from = zsrc[q] ? zsrc[q] + off : staging_of(s, q) + so;
      shm_copy_out(recv + (size_t)q * bytes + off, from, L, bytes * (size_t)s->n);
    }
    if (!st) shm_post(s);
  }
  SRCS_FREE;
  if (st) return st;
  shm_post(s);
  return shm_wait_all(c, s, s->ph, "the end of braid_all_gather");
}

/* ---------------------------------------------------------------- reduce-scatter */

braid_status shm_reduce_scatter(braid_comm *c, const void *vsend, void *vrecv, size_t count, braid_dtype dt,
                                       braid_op op) {
  shm_state *s = ((shm_state *)c->be);
  const char *send = vsend;
  char *recv = vrecv;
  size_t es = braid_dtype_size(dt), bytes = count * es;
  if (s->n == 1) {
    braid__reduce(recv, (const void *const *)&send, 1, count, dt, op, 1);
    return BRAID_OK;
  }
  braid_status st = BRAID_OK;
  SRCS_DECL;
  if (bytes * (size_t)s->n <= SHM_SLOT_DATA) {
    int p;
    st = flat_exchange(c, s, send, bytes * (size_t)s->n, &p, "its input to braid_reduce_scatter");
    if (!st) {
      for (int q = 0; q < s->n; q++)
        srcs[q] = (q == s->me ? send : slot_data(slot_of(s, q, p), bytes * (size_t)s->n)) + (size_t)s->me * bytes;
      braid__reduce(recv, srcs, s->n, count, dt, op, s->n);
    }
    SRCS_FREE;
    return st;
  }
  uint64_t key = s->ph + 1;
  int zme = shm_zc_announce(s, send, bytes * (size_t)s->n, key), nzc;
  if (s->cma && bytes * (size_t)s->n >= s->cma_min) {
    shm_ctl_of(s, s->me)->addr = (uint64_t)(uintptr_t)send;
    shm_post(s);
    if ((st = shm_wait_all(c, s, s->ph, "its input address in braid_reduce_scatter")) || (st = check_posts(c, s)) ||
        (st = zc_gather(c, s, key, zme, zsrc, &nzc))) {
      SRCS_FREE;
      return st;
    }
    size_t chunk = s->tmp_each / es;
    for (size_t x = 0; x < count && !st; x += chunk) {
      size_t len = count - x < chunk ? count - x : chunk;
      int k = 0;
      for (int q = 0; q < s->n && !st; q++) {
        size_t at = ((size_t)s->me * count + x) * es; /* piece me of q's input */
        if (q == s->me || zsrc[q]) {
          srcs[q] = (q == s->me ? send : zsrc[q]) + at;
          continue;
        }
        char *t = s->tmp + (size_t)k++ * s->tmp_each;
        st = shm_cma_read(c, s, q, t, shm_ctl_of(s, q)->addr + at, len * es);
        srcs[q] = t;
      }
      if (!st) braid__reduce(recv + x * es, srcs, s->n, len, dt, op, s->n);
    }
    SRCS_FREE;
    if (st) return st;
    shm_post(s);
    return shm_wait_all(c, s, s->ph, "the end of braid_reduce_scatter");
  }
  /* Staging rounds over the chunk dimension: each rank stages its n pieces of
     the round, then reduces its own piece from every rank's staging. An input
     in braid memory is read in place instead (announced with the first post). */
  if ((st = staging_quiesce(c, s))) {
    SRCS_FREE;
    return st;
  }
  size_t half = s->staging / 2;
  size_t per_round = half / (es * (size_t)s->n);
  if (per_round == 0) per_round = 1; /* staging is at least 64 KiB, es at most 16: never reached for n <= 2048 */
  for (size_t off = 0; off < count && !st; off += per_round) {
    size_t L = count - off < per_round ? count - off : per_round;
    size_t h = stage_slot(s, L * es * (size_t)s->n, count * es * (size_t)s->n);
    char *stage = staging_of(s, s->me) + h;
    if (!zme)
      for (int q = 0; q < s->n; q++) memcpy(stage + (size_t)q * L * es, send + ((size_t)q * count + off) * es, L * es);
    shm_post(s);
    if ((st = shm_wait_all(c, s, s->ph, "its input to braid_reduce_scatter"))) break;
    if (off == 0 && (st = check_posts(c, s))) break;
    if (off == 0 && (st = zc_gather(c, s, key, zme, zsrc, &nzc))) break;
    for (int q = 0; q < s->n; q++) {
      if (q == s->me ? zme : zsrc[q] != NULL)
        srcs[q] = (q == s->me ? send : zsrc[q]) + ((size_t)s->me * count + off) * es;
      else
        srcs[q] = staging_of(s, q) + h + (size_t)s->me * L * es;
    }
    braid__reduce(recv + off * es, srcs, s->n, L, dt, op, s->n);
  }
  SRCS_FREE;
  if (st) return st;
  shm_post(s);
  return shm_wait_all(c, s, s->ph, "the end of braid_reduce_scatter");
}

/* ---------------------------------------------------------------- rooted calls and all-to-all */

/* Small reduce, gather and scatter go through the ring: non-roots of a
   reduce or gather (the root of a scatter) write and return, so
   back-to-back calls pipeline. Reduce and gather blocks too large for a
   section of every rank in one entry, but within a slot, take the slot
   exchange; all-to-all always does (every rank needs every other's data).
   The generic algorithms over point-to-point cost a message per block plus
   a handshake, several microseconds where these take a fraction of one.
   Reduce stages at every larger size, where every rank reduces a slice in
   parallel. Larger gathers, scatters and all-to-alls take the generic
   algorithms over shm's point-to-point path (shm_declines). */

/* The inputs of a small reduce or gather, at the root: every rank's bytes
   in from[] (this rank's: src), from ring sections when they fit (*ring set;
   the root calls ring_done(c, s, *b) once it has read them), else from the
   slots. Non-roots only hand theirs over. */
static braid_status small_to_root(braid_comm *c, shm_state *s, const void *src, size_t bytes, int root,
                                  const void **from, uint64_t *b, int *ring, const char *call) {
  if ((*ring = ring_fits_all(s, bytes))) return ring_to_root(c, s, src, bytes, root, from, b, call);
  int p;
  braid_status st = flat_exchange(c, s, src, bytes, &p, call);
  for (int q = 0; q < s->n && !st; q++) from[q] = q == s->me ? src : slot_data(slot_of(s, q, p), bytes);
  return st;
}

braid_status shm_reduce(braid_comm *c, const void *vsend, void *vrecv, size_t count, braid_dtype dt, braid_op op,
                        int root) {
  shm_state *s = c->be;
  const char *send = vsend;
  char *recv = vrecv;
  if (s->n == 1) {
    braid__reduce(recv, (const void *const *)&send, 1, count, dt, op, 1);
    return BRAID_OK;
  }
  size_t bytes = count * braid_dtype_size(dt);
  /* Up to 4 ranks (measured) the root alone reduces; with more, spreading
     the slices over every rank's core keeps the root from doing n - 1
     additions per element. */
  if (bytes > SHM_SLOT_DATA && s->n <= SHM_REDUCE_ROOT_MAX)
    return red_to_root(c, s, send, s->me == root ? recv : NULL, count, dt, op, root);
  if (bytes > SHM_SLOT_DATA) return red_staging(c, s, send, s->me == root ? recv : NULL, count, dt, op, root);
  SRCS_DECL;
  uint64_t b = 0;
  int ring;
  braid_status st = small_to_root(c, s, send, bytes, root, srcs, &b, &ring, "its input to braid_reduce");
  if (!st && s->me == root) {
    braid__reduce(recv, srcs, s->n, count, dt, op, s->n);
    if (ring) ring_done(c, s, b);
  }
  SRCS_FREE;
  return st;
}

braid_status shm_gather(braid_comm *c, const void *send, void *vrecv, size_t count, braid_dtype dt, int root) {
  shm_state *s = c->be;
  size_t bytes = count * braid_dtype_size(dt);
  char *recv = vrecv;
  if (s->n == 1) {
    if (send != recv) memcpy(recv, send, bytes);
    return BRAID_OK;
  }
  SRCS_DECL;
  uint64_t b = 0;
  int ring;
  braid_status st = small_to_root(c, s, send, bytes, root, srcs, &b, &ring, "its input to braid_gather");
  if (!st && s->me == root) {
    for (int q = 0; q < s->n; q++)
      if (srcs[q] != recv + (size_t)q * bytes) memcpy(recv + (size_t)q * bytes, srcs[q], bytes);
    if (ring) ring_done(c, s, b);
  }
  SRCS_FREE;
  return st;
}

braid_status shm_scatter(braid_comm *c, const void *vsend, void *recv, size_t count, braid_dtype dt, int root) {
  shm_state *s = c->be;
  size_t bytes = count * braid_dtype_size(dt), mine = (size_t)s->me * bytes;
  const char *send = vsend;
  if (s->me == root && send + mine != (const char *)recv) memcpy(recv, send + mine, bytes);
  if (s->n == 1) return BRAID_OK;
  return ring_from_root(c, s, send, bytes * (size_t)s->n, recv, mine, bytes, root, "the root's data in braid_scatter");
}

/* The largest piece per block a staged round can take, 0 when staging
   cannot hold two rounds of one cache line per rank (thousands of ranks):
   those calls stay with the generic exchange. */
static size_t a2a_piece_max(const shm_state *s) { return s->staging / 2 / (size_t)s->n / SHM_CL * SHM_CL; }

/* Where an all-to-all(v) block lies: with counts (elements, times es), or
   uniform blocks of `uni` bytes at q * uni. */
typedef struct {
  const size_t *sc, *sd, *rc, *rd;
  size_t es, uni;
} a2a_plan;

static void plan_send(const a2a_plan *pl, int t, size_t *off, size_t *len) {
  *off = pl->uni ? (size_t)t * pl->uni : pl->sd[t] * pl->es;
  *len = pl->uni ? pl->uni : pl->sc[t] * pl->es;
}

static void plan_recv(const a2a_plan *pl, int q, size_t *off, size_t *len) {
  *off = pl->uni ? (size_t)q * pl->uni : pl->rd[q] * pl->es;
  *len = pl->uni ? pl->uni : pl->rc[q] * pl->es;
}

/* All-to-all(v) through staging, in rounds. In round j
   every rank copies piece j (L bytes at j * L) of each block it sends into
   its staging (the piece for rank t at t * L of the round's space), posts,
   copies piece j of its own blocks out of every peer's staging, and posts
   again; a round's space is rewritten only after every rank posted it
   copied, and the last round's second post is the end barrier. Two copies,
   no system call, every rank copying at once (single copy paid a
   process_vm_readv per peer, the generic pairwise exchange a handshake and
   a system call per message: docs/PERFORMANCE.md). In place works:
   piece j of every block is staged before piece j of any is overwritten.
   most: the largest block of any rank, the same on every rank. check: the
   first post carries the call check (else the caller checked already) and
   the announcement of a send buffer in braid memory, which peers then read
   in place instead of this rank's staging (uniform blocks only: readers
   find their block at me * uni; not in place, where the buffer changes
   while peers read). */
static braid_status a2a_staged(braid_comm *c, shm_state *s, const char *send, char *recv, const a2a_plan *pl,
                               size_t most, int check, const char *what) {
  braid_status st = staging_quiesce(c, s);
  if (st) return st;
  const int n = s->n, me = s->me;
  /* Pieces of at least 64 KiB (smaller ones pipeline badly between cores;
     see stream_chunk), at most what lets staging hold two rounds
     (a2a_piece_max). Ranks that share cores wait for each other in every
     round, and each such wait may cost a trip through the scheduler: there
     rounds take up to SHM_A2A_SHARED_ROUND, fewer and larger. */
  size_t cap = a2a_piece_max(s), L = stream_chunk(s, most * (size_t)n) / (size_t)n / SHM_CL * SHM_CL;
  if (L < ((size_t)64 << 10)) L = (size_t)64 << 10;
  if (s->oversub && L < SHM_A2A_SHARED_ROUND / (size_t)n) L = SHM_A2A_SHARED_ROUND / (size_t)n / SHM_CL * SHM_CL;
  if (L > cap) L = cap;
  if (round_up(most, SHM_CL) < L) L = round_up(most, SHM_CL);
  size_t R = L * (size_t)n, K = s->staging / R; /* at least 2 */
  uint64_t base = s->ph, key = base + 1;
  int zme = check && pl->uni && send != recv && shm_zc_announce(s, send, pl->uni * (size_t)n, key), nzc = 0;
  SRCS_DECL;
  for (int q = 0; q < n; q++) zsrc[q] = NULL;
  size_t so0, sl0, ro0, rl0;
  plan_send(pl, me, &so0, &sl0);
  plan_recv(pl, me, &ro0, &rl0);
  for (size_t j = 0, off = 0; off < most && !st; j++, off += L) {
    size_t so = (j % K) * R;
    if (j >= K && (st = shm_wait_all(c, s, base + 2 * (j - K) + 2, what))) break;
    char *stage = staging_of(s, me) + so;
    for (int t = 0; t < n && !zme; t++) {
      size_t at, len;
      plan_send(pl, t, &at, &len);
      if (t != me && len > off) memcpy(stage + (size_t)t * L, send + at + off, len - off < L ? len - off : L);
    }
    shm_post(s);
    /* This rank's own block while the peers stage their first pieces. */
    if (j == 0 && send != recv && rl0) memcpy(recv + ro0, send + so0, rl0);
    if (j == 0 && check &&
        ((st = shm_wait_all(c, s, key, what)) || (st = check_posts(c, s)) || (st = zc_gather(c, s, key, zme, zsrc, &nzc))))
      break;
    if (nzc == n) {
      /* Every buffer is braid memory: each rank copies its whole blocks out
         in place, and one more post ends the call. */
      for (int i = 1; i < n; i++) {
        int q = (me + i) % n;
        shm_copy_out(recv + (size_t)q * pl->uni, zsrc[q] + (size_t)me * pl->uni, pl->uni, most);
      }
      shm_post(s);
      break;
    }
    for (int i = 1; i < n && !st; i++) {
      int q = (me + i) % n; /* spread the readers over the sources */
      size_t at, len;
      plan_recv(pl, q, &at, &len);
      if (len <= off) continue;
      if ((st = wait_flag(c, s, q, base + 2 * j + 1, what))) break;
      const char *from = zsrc[q] ? zsrc[q] + (size_t)me * pl->uni + off : staging_of(s, q) + so + (size_t)me * L;
      shm_copy_out(recv + at + off, from, len - off < L ? len - off : L, most);
    }
    if (!st) shm_post(s);
  }
  SRCS_FREE;
  return st ? st : shm_wait_all(c, s, s->ph, what);
}

/* Rank q's all-to-allv header in its slot of parity p: total or NOFIT,
   then its n counts; for a total, its blocks follow. */
static const uint64_t *a2av_head(shm_state *s, int q, int p) {
  return (const uint64_t *)(const void *)slot_data(slot_of(s, q, p), SHM_SLOT_DATA);
}
#define A2AV_NOFIT UINT64_MAX
#define A2AV_HEAD(n) (8 * (1 + (size_t)(n))) /* bytes before a fitting rank's blocks */
/* A rank whose blocks do not fit follows its counts with its n
   displacements and its send buffer's address (for single copy). */
#define A2AV_DISPL(n, j) (1 + (size_t)(n) + (size_t)(j))
#define A2AV_ADDR(n) (1 + 2 * (size_t)(n))
#define A2AV_WORDS(n) (2 + 2 * (size_t)(n))

/* This rank's block in the slot of q, whose blocks fit: packed in rank order
   after q's header. */
static const char *a2av_slot_block(shm_state *s, int q, int p, size_t es) {
  const uint64_t *qh = a2av_head(s, q, p);
  size_t off = A2AV_HEAD(s->n);
  for (int j = 0; j < s->me; j++) off += (size_t)qh[1 + j] * es;
  return (const char *)qh + off;
}

/* All-to-all(v) by single copy: every rank's send buffer is where its
   peers find it (the address in its control line, or, for all-to-allv,
   in its header with its displacements), and each rank reads its block
   out of every peer's with a process_vm_readv; the end barrier keeps the
   buffers as they are until all have read. In place the incoming blocks
   land in scratch first and overwrite the buffer after that barrier.
   check: one post announces the buffers and carries the call check (an
   all-to-allv's header exchange already did both: from = the header's
   parity). */
static braid_status a2a_direct(braid_comm *c, shm_state *s, const char *send, char *recv, const a2a_plan *pl,
                               int from, const char *what) {
  const int n = s->n, me = s->me, inplace = send == recv;
  braid_status st = BRAID_OK;
  if (from < 0) {
    shm_ctl_of(s, me)->addr = (uint64_t)(uintptr_t)send;
    shm_post(s);
    if ((st = shm_wait_all(c, s, s->ph, what)) || (st = check_posts(c, s))) return st;
  }
  size_t need = 0, at, len;
  for (int q = 0; q < n && inplace; q++)
    if (q != me) plan_recv(pl, q, &at, &len), need += len;
  char *land = NULL;
  if (need && !(land = braid__scratch(c, 0, need))) return (braid_status)atomic_load(&c->failed);
  size_t so, sl;
  plan_send(pl, me, &so, &sl);
  plan_recv(pl, me, &at, &len);
  if (!inplace && len) memcpy(recv + at, send + so, len);
  size_t put = 0;
  for (int i = 1; i < n; i++) {
    const int q = (me + i) % n; /* spread the readers over the sources */
    plan_recv(pl, q, &at, &len);
    if (!len) continue;
    char *to = inplace ? land + put : recv + at;
    put += len;
    if (from < 0) {
      st = shm_cma_read(c, s, q, to, shm_ctl_of(s, q)->addr + (uint64_t)me * pl->uni, len);
    } else {
      const uint64_t *qh = a2av_head(s, q, from);
      if (qh[0] != A2AV_NOFIT) /* its blocks are in its slot */
        memcpy(to, a2av_slot_block(s, q, from, pl->es), len);
      else
        st = shm_cma_read(c, s, q, to, qh[A2AV_ADDR(n)] + qh[A2AV_DISPL(n, me)] * pl->es, len);
    }
    if (st) return st;
  }
  shm_post(s);
  if ((st = shm_wait_all(c, s, s->ph, what))) return st;
  put = 0;
  for (int i = 1; i < n && inplace; i++) {
    const int q = (me + i) % n;
    plan_recv(pl, q, &at, &len);
    if (len) memcpy(recv + at, land + put, len);
    put += len;
  }
  return BRAID_OK;
}

/* Rank 0 chooses (shm_a2a_pick.h) and posts the choice of its large call
   k of a kind in its control line as (k + 1) << 32 | path (1: single
   copy) as it enters the call; the others take that path whatever class
   their own call falls in (in place may differ by rank), so all run the
   same protocol. BRAID_SHM_A2A fixes the choice (rank 0's value counts). */
int shm_a2a_mode(const char *m) {
  static const char *const names[] = {"auto", "staged", "single"};
  for (int i = 0; i < 3; i++)
    if (!strcmp(m, names[i])) return i;
  return -1;
}

/* 1 when this large call of kind v (0 all-to-all, 1 all-to-allv) takes
   single copy. */
static braid_status a2a_choose(braid_comm *c, shm_state *s, int v, size_t most, int inplace, int *direct) {
  const uint32_t k1 = (uint32_t)++s->a2a_calls[v];
  if (s->me == 0) {
    *direct = shm_a2a_next(&s->a2a[v][shm_a2a_class_of(most, inplace)], s->a2a_mode);
    atomic_store_explicit(&s->mine->a2a_pick[v], (uint64_t)k1 << 32 | (uint64_t)*direct, memory_order_release);
    return BRAID_OK;
  }
  _Atomic uint64_t *w = &shm_ctl_of(s, 0)->a2a_pick[v];
  uint64_t x;
  SHM_WAIT_UNTIL((uint32_t)((x = atomic_load_explicit(w, memory_order_acquire)) >> 32) == k1, 0,
                 "rank 0's choice of a path for the call");
  *direct = (int)(x & 1);
  return BRAID_OK;
}

/* Rank 0, after a large call of kind v that took `direct` from t0. */
static void a2a_learn(shm_state *s, int v, size_t most, int inplace, int direct, double t0) {
  if (s->me != 0) return;
  shm_a2a_record(&s->a2a[v][shm_a2a_class_of(most, inplace)], direct, braid__now() - t0);
}

/* The large path of an all-to-all(v) (plan pl, largest block most): staged
   rounds, or single copy where it works and rank 0 chose it. */
static braid_status a2a_large(braid_comm *c, shm_state *s, const char *send, char *recv, const a2a_plan *pl,
                              size_t most, int check, int from, const char *what) {
  const int v = !pl->uni, timed = s->cma && (!v || from >= 0), inplace = send == recv;
  int direct = 0;
  braid_status st = timed ? a2a_choose(c, s, v, most, inplace, &direct) : BRAID_OK;
  if (st) return st;
  const double t0 = s->me == 0 ? braid__now() : 0;
  st = direct ? a2a_direct(c, s, send, recv, pl, from, what) : a2a_staged(c, s, send, recv, pl, most, check, what);
  if (!st && timed) a2a_learn(s, v, most, inplace, direct, t0);
  return st;
}

/* In place (send == recv) works too: this rank's blocks went into its slot
   before any is overwritten, and its own block stays where it is. */
braid_status shm_all_to_all(braid_comm *c, const void *vsend, void *vrecv, size_t count, braid_dtype dt) {
  shm_state *s = c->be;
  size_t bytes = count * braid_dtype_size(dt), total = bytes * (size_t)s->n;
  const char *send = vsend;
  char *recv = vrecv;
  if (s->n > 1 && total > SHM_SLOT_DATA) {
    a2a_plan pl = {NULL, NULL, NULL, NULL, 1, bytes};
    return a2a_large(c, s, send, recv, &pl, bytes, 1, -1, "its part of braid_all_to_all");
  }
  int p = 0;
  braid_status st = s->n == 1 ? BRAID_OK : flat_exchange(c, s, send, total, &p, "its input to braid_all_to_all");
  if (st) return st;
  for (int q = 0; q < s->n; q++) {
    size_t at = (size_t)q * bytes, mine = (size_t)s->me * bytes;
    if (q == s->me) {
      if (send != recv) memcpy(recv + at, send + at, bytes);
    } else {
      memcpy(recv + at, slot_data(slot_of(s, q, p), total) + mine, bytes);
    }
  }
  return BRAID_OK;
}

/* Counts sent to this rank against the ones it expects, pair by pair. */
static braid_status a2av_check(braid_comm *c, shm_state *s, int p, const size_t *rcounts, braid_dtype dt) {
  for (int q = 0; q < s->n; q++) {
    const uint64_t *qh = a2av_head(s, q, p);
    if (q != s->me && qh[1 + s->me] != rcounts[q])
      return braid__fail_comm(c, BRAID_ERR_MISMATCH,
                              "rank %d sends %llu elements of %s to rank %d where rank %d expects %zu from it",
                              braid__label(c, q), (unsigned long long)qh[1 + s->me], braid_dtype_name(dt),
                              braid__label(c, s->me), braid__label(c, s->me), rcounts[q]);
  }
  return BRAID_OK;
}

/* All-to-allv through the slots when every rank's blocks fit in one: each
   rank publishes a header (its total, or "does not fit"), its n counts and
   its blocks packed in peer order. Only after the exchange do the ranks
   know whether all fit (their counts differ). When one does not, every rank
   sees it, and every rank's counts are in the headers, so the largest block
   decides alike on every rank between the large paths (a2a_large) and
   the generic exchange (see shm_declines). Counts are checked pair by
   pair against the receivers' recv_counts. */
braid_status shm_all_to_allv(braid_comm *c, const void *vsend, const size_t *scounts, const size_t *sdispls, void *vrecv,
                             const size_t *rcounts, const size_t *rdispls, braid_dtype dt) {
  shm_state *s = c->be;
  const int n = s->n, me = s->me, inplace = vsend == vrecv;
  const size_t es = braid_dtype_size(dt);
  const size_t *sc = inplace ? rcounts : scounts, *sd = inplace ? rdispls : sdispls;
  const char *send = vsend;
  char *recv = vrecv;
  if (n == 1) {
    if (!inplace && sc[0]) memcpy(recv + rdispls[0] * es, send + sd[0] * es, sc[0] * es);
    return BRAID_OK;
  }
  const size_t head = A2AV_HEAD(n);
  /* Whether a header can describe the send buffer (the same on every rank). */
  const int direct = s->cma && 8 * A2AV_WORDS(n) <= SHM_SLOT_DATA;
  size_t total = 0;
  int fits = head <= SHM_SLOT_DATA;
  for (int j = 0; j < n && fits; j++) {
    if (sc[j] > (SHM_SLOT_DATA - head - total) / es) fits = 0;
    else total += sc[j] * es;
  }
  int p;
  uint64_t k;
  char *d = slot_data(flat_slot(s, &p, &k), SHM_SLOT_DATA);
  uint64_t *hd = (uint64_t *)(void *)d;
  hd[0] = fits ? total : A2AV_NOFIT;
  if (head <= SHM_SLOT_DATA)
    for (int j = 0; j < n; j++) hd[1 + j] = sc[j];
  if (fits) {
    char *at = d + head;
    for (int j = 0; j < n; j++) {
      if (sc[j]) memcpy(at, send + sd[j] * es, sc[j] * es);
      at += sc[j] * es;
    }
  } else if (direct) {
    for (int j = 0; j < n; j++) hd[A2AV_DISPL(n, j)] = sd[j];
    hd[A2AV_ADDR(n)] = (uint64_t)(uintptr_t)send;
  }
  braid_status st = flat_finish(c, s, k, p, "its input to braid_all_to_allv");
  if (st) return st;
  int all_fit = 1;
  for (int q = 0; q < n; q++)
    if (a2av_head(s, q, p)[0] == A2AV_NOFIT) all_fit = 0;
  if (!all_fit) {
    if (head > SHM_SLOT_DATA) return BRAID__DECLINED;
    size_t big = 0;
    for (int q = 0; q < n; q++) {
      const uint64_t *qh = a2av_head(s, q, p);
      for (int j = 0; j < n; j++)
        if (q != j && (size_t)qh[1 + j] * es > big) big = (size_t)qh[1 + j] * es;
    }
    if (big <= SHM_EAGER_MAX || !a2a_piece_max(s)) return BRAID__DECLINED;
    if ((st = a2av_check(c, s, p, rcounts, dt))) return st;
    a2a_plan pl = {sc, sd, rcounts, rdispls, es, 0};
    return a2a_large(c, s, send, recv, &pl, big, 0, direct ? p : -1, "its part of braid_all_to_allv");
  }
  if ((st = a2av_check(c, s, p, rcounts, dt))) return st;
  for (int q = 0; q < n; q++) {
    if (!rcounts[q]) continue;
    if (q == me) {
      if (!inplace) memcpy(recv + rdispls[me] * es, send + sd[me] * es, rcounts[me] * es);
      continue;
    }
    memcpy(recv + rdispls[q] * es, a2av_slot_block(s, q, p, es), rcounts[q] * es);
  }
  return BRAID_OK;
}

/* Which calls shm leaves to the generic algorithms: gathers and scatters
   too large for the slots or the ring, all-to-alls above the slots whose
   blocks go eagerly (or that staging cannot take), and mid-size 2-rank
   all-gathers when pipes carry the messages (one copy, against two through
   staging; docs/SHM.md has the measured range). bytes is per rank's
   block. */
int shm_declines(const braid_comm *c, braid__coll_kind kind, size_t bytes) {
  const shm_state *s = c->be;
  switch (kind) {
    case BRAID__COLL_GATHER: return bytes > SHM_SLOT_DATA;
    case BRAID__COLL_SCATTER: return bytes > SHM_SLOT_DATA / (size_t)s->n;
    case BRAID__COLL_ALL_TO_ALL:
      /* Blocks that go eagerly are exchanged faster than staged rounds,
         whose barriers they do not wait for. */
      return bytes > SHM_SLOT_DATA / (size_t)s->n && (bytes <= SHM_EAGER_MAX || !a2a_piece_max(s));
    case BRAID__COLL_ALL_GATHER:
      return s->splice && s->n == 2 && bytes >= SHM_SPLICE_AG_MIN && bytes <= SHM_SPLICE_AG_MAX;
    default: return 0;
  }
}

/* ---------------------------------------------------------------- barrier */

/* The core completed this rank's point-to-point operations first. */
braid_status shm_barrier(braid_comm *c) {
  shm_state *s = c->be;
  if (s->n == 1) return BRAID_OK;
  int p;
  return flat_exchange(c, s, NULL, 0, &p, "its arrival at braid_barrier");
}
