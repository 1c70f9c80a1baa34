/* Rank math of the generic collectives: who talks to whom at which step and
   which part of the vector moves. Pure functions of (rank, world size,
   step), no I/O and no communicator, so tests/unit/test_patterns.c checks
   them symbolically for every world size. Ranks are 0..n-1; "relative"
   ranks of rooted patterns count from the root (v = (r - root) mod n). */
#ifndef BRAID_PATTERNS_H
#define BRAID_PATTERNS_H

#include <stddef.h>

/* ------------------------------------------------------------------------ */
/* Integer helpers */

static inline int braid__mod(long long a, int n) {
  long long m = a % n;
  return (int)(m < 0 ? m + n : m);
}

static inline int braid__is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

/* Largest power of two <= n (n >= 1). */
static inline int braid__pow2_floor(int n) {
  int p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}

/* floor(log2 n) for n >= 1. */
static inline int braid__log2_floor(int n) {
  int k = 0;
  while (n >>= 1) k++;
  return k;
}

/* ceil(log2 n) for n >= 1: the rounds of the log-step patterns. */
static inline int braid__log2_ceil(int n) {
  int k = 0;
  while ((1ll << k) < n) k++;
  return k;
}

static inline size_t braid__div_ceil(size_t a, size_t b) { return a / b + (a % b != 0); }

/* ------------------------------------------------------------------------ */
/* Balanced partition: count elements into n blocks; block i has
   count / n elements, plus one for the first count % n blocks. Blocks may
   be empty (count < n). braid__part_off(count, n, n) == count. */

static inline size_t braid__part_len(size_t count, int n, int i) {
  return count / (size_t)n + ((size_t)i < count % (size_t)n);
}

static inline size_t braid__part_off(size_t count, int n, int i) {
  size_t q = count / (size_t)n, rem = count % (size_t)n, ui = (size_t)i;
  return q * ui + (ui < rem ? ui : rem);
}

/* Sub-chunking a block for pipelining: how many chunks the largest block
   (maxlen elements, >= 1) is cut into so that a chunk holds about target
   elements, at most max_chunks. Every block of a pattern uses the same
   number of chunks (the balanced partition of its own length), so sender
   and receiver agree on each chunk's size; chunks of shorter blocks may be
   empty. */
static inline size_t braid__chunk_num(size_t maxlen, size_t target, size_t max_chunks) {
  size_t k = braid__div_ceil(maxlen ? maxlen : 1, target ? target : 1);
  if (k > max_chunks) k = max_chunks;
  return k ? k : 1;
}

/* ------------------------------------------------------------------------ */
/* Ring. Reduce-scatter takes n-1 steps: at step s rank r sends block
   r-s-1 to r+1 and receives block r-s-2 from r-1, which it combines with
   its own contribution and sends on at step s+1. The block received at
   the last step (s = n-2) is block r: rank r owns the fully reduced block
   r. All-gather then circulates the owned blocks: at step s rank r sends
   block r-s (its own at s = 0, then the one it just received) and
   receives block r-s-1. */

static inline int braid__ring_next(int r, int n) { return r + 1 == n ? 0 : r + 1; }
static inline int braid__ring_prev(int r, int n) { return r == 0 ? n - 1 : r - 1; }

static inline int braid__ring_rs_send_block(int r, int n, int s) { return braid__mod((long long)r - s - 1, n); }
static inline int braid__ring_rs_recv_block(int r, int n, int s) { return braid__mod((long long)r - s - 2, n); }
static inline int braid__ring_ag_send_block(int r, int n, int s) { return braid__mod((long long)r - s, n); }
static inline int braid__ring_ag_recv_block(int r, int n, int s) { return braid__mod((long long)r - s - 1, n); }

/* ------------------------------------------------------------------------ */
/* Folding for the power-of-two patterns (recursive halving / doubling).
   p = largest power of two <= n, rem = n - p. The first 2*rem ranks pair
   up as (2i, 2i+1): 2i takes part as proxy i and speaks for both, 2i+1 is
   an "extra" that hands its data to 2i first and gets the result back at
   the end. Ranks from 2*rem on are proxies r - rem. Proxy q speaks for
   the ranks [braid__fold_rank(q), braid__fold_rank(q+1)): two ranks for
   q < rem, one otherwise, in rank order. */

/* Proxy number of rank r, or -1 when r is an extra. */
static inline int braid__fold_proxy(int r, int n) {
  int rem = n - braid__pow2_floor(n);
  if (r < 2 * rem) return (r & 1) ? -1 : r / 2;
  return r - rem;
}

/* First rank proxy q speaks for (q in 0..p; q == p gives n). */
static inline int braid__fold_rank(int q, int n) {
  int rem = n - braid__pow2_floor(n);
  return q < rem ? 2 * q : q + rem;
}

/* The other rank of r's folded pair, or -1 when r is not folded. */
static inline int braid__fold_peer(int r, int n) {
  int rem = n - braid__pow2_floor(n);
  if (r >= 2 * rem) return -1;
  return r ^ 1;
}

/* One exchange of a power-of-two pattern among p proxies, in proxy units:
   this proxy sends the data of proxies [send_lo, send_hi) to peer and
   receives the data of [recv_lo, recv_hi). */
typedef struct braid__xchg {
  int peer;
  int send_lo, send_hi;
  int recv_lo, recv_hi;
} braid__xchg;

/* Recursive halving, step i = 0..log2(p)-1 (distance p/2, p/4, ..., 1).
   The proxy keeps the half of its current range that holds its own
   number (it receives the peer's contribution to that half) and sends the
   other half; after the last step proxy q holds range [q, q+1). */
static inline braid__xchg braid__rhd_halving(int q, int p, int i) {
  int mask = p >> (i + 1);
  int lo = q & ~(2 * mask - 1);
  braid__xchg x;
  x.peer = q ^ mask;
  if (q & mask) {
    x.recv_lo = lo + mask, x.recv_hi = lo + 2 * mask;
    x.send_lo = lo, x.send_hi = lo + mask;
  } else {
    x.recv_lo = lo, x.recv_hi = lo + mask;
    x.send_lo = lo + mask, x.send_hi = lo + 2 * mask;
  }
  return x;
}

/* Recursive doubling of ranges, step i = 0..log2(p)-1 (distance 1, 2,
   ..., p/2): the proxy holds the 2^i proxies' range that contains its own
   number, sends it, and receives the peer's equally sized range. The
   mirror of halving: step i here pairs the same proxies as halving step
   log2(p)-1-i. */
static inline braid__xchg braid__rhd_doubling(int q, int p, int i) {
  int mask = 1 << i;
  braid__xchg x;
  (void)p;
  x.peer = q ^ mask;
  x.send_lo = q & ~(mask - 1), x.send_hi = x.send_lo + mask;
  x.recv_lo = x.peer & ~(mask - 1), x.recv_hi = x.recv_lo + mask;
  return x;
}

/* The low bits bits of v in reverse order. */
static inline int braid__brev(int v, int bits) {
  int w = 0;
  for (int b = 0; b < bits; b++) w |= ((v >> b) & 1) << (bits - 1 - b);
  return w;
}

/* The same two patterns with the nearest partners first: halving at
   distance 1, 2, ..., p/2 and doubling back from p/2. Proxy q plays proxy
   brev(q) of the patterns above (flipping bit i of brev(q) flips bit
   log2(p)-1-i of q), so it ends halving with range [brev(q), brev(q)+1).
   Where consecutive ranks share a host, the large first halves stay on
   it and only quarters and less cross between hosts. */
static inline braid__xchg braid__rhd_halving_near(int q, int p, int i) {
  int L = braid__log2_floor(p);
  braid__xchg x = braid__rhd_halving(braid__brev(q, L), p, i);
  x.peer = braid__brev(x.peer, L);
  return x;
}
static inline braid__xchg braid__rhd_doubling_near(int q, int p, int i) {
  int L = braid__log2_floor(p);
  braid__xchg x = braid__rhd_doubling(braid__brev(q, L), p, i);
  x.peer = braid__brev(x.peer, L);
  return x;
}

/* Recursive doubling of whole vectors, step i: exchange with q ^ 2^i.
   Both partners combine (lower proxy's partial) op (upper proxy's). */
static inline int braid__rd_peer(int q, int i) { return q ^ (1 << i); }

/* ------------------------------------------------------------------------ */
/* Rooted trees over relative ranks. */

static inline int braid__rel_rank(int r, int root, int n) { return braid__mod((long long)r - root, n); }
static inline int braid__abs_rank(int v, int root, int n) { return braid__mod((long long)v + root, n); }

/* k-nomial tree (radix k >= 2): v's parent clears v's lowest non-zero
   base-k digit; the root (0) has none (-1). */
static inline int braid__knomial_parent(int v, int k) {
  if (v <= 0) return -1;
  long long m = 1;
  while ((v / m) % k == 0) m *= k;
  return (int)(v - ((v / m) % k) * m);
}

/* Size of the subtree of child v + d*w (w a power of k): the ranks
   [v + d*w, v + (d+1)*w) that exist. */
static inline long long braid__knomial_subtree(long long ch, long long w, int n) {
  return n - ch < w ? n - ch : w;
}

/* Children of v among n ranks in send order: largest subtree first, so the
   deepest part of the tree starts earliest (ties: the higher digit
   position first). Returns how many were written, at most cap
   (cap >= (k-1) * ceil(log_k n) is always enough). */
static inline int braid__knomial_children(int v, int n, int k, int *out, int cap) {
  long long m = 1; /* weight of v's lowest non-zero digit; n or more for the root */
  if (v == 0) {
    while (m < n) m *= k;
  } else {
    while ((v / m) % k == 0) m *= k;
  }
  int nc = 0;
  for (long long w = m / k; w >= 1; w /= k)
    for (int d = 1; d < k; d++) {
      long long ch = v + d * w, sz = braid__knomial_subtree(ch, w, n);
      if (ch >= n) break;
      /* insertion after every child with a subtree at least as large */
      int at = nc;
      while (at > 0) {
        long long prev = out[at - 1], pw = 1;
        while ((prev - v) % (pw * k) == 0) pw *= k; /* weight of prev's digit below v */
        if (braid__knomial_subtree(prev, pw, n) >= sz) break;
        at--;
      }
      if (at >= cap) continue;
      for (int i = (nc < cap ? nc : cap - 1); i > at; i--) out[i] = out[i - 1];
      out[at] = (int)ch;
      if (nc < cap) nc++;
    }
  return nc;
}

/* Binomial tree: the radix-2 k-nomial tree (parent = v minus its lowest
   set bit; depth ceil(log2 n)). */
static inline int braid__binomial_parent(int v) { return braid__knomial_parent(v, 2); }
static inline int braid__binomial_children(int v, int n, int *out, int cap) {
  return braid__knomial_children(v, n, 2, out, cap);
}

/* Pipelined chain root -> root+1 -> ... -> root-1, relative ranks: the
   previous and next rank in the chain, -1 at its ends. */
static inline int braid__chain_prev(int v) { return v > 0 ? v - 1 : -1; }
static inline int braid__chain_next(int v, int n) { return v + 1 < n ? v + 1 : -1; }

/* ------------------------------------------------------------------------ */
/* Bruck all-gather. Each rank keeps a rotated copy in which slot i holds
   block (r + i) mod n, starting with its own block in slot 0. Step k
   (0..ceil(log2 n)-1, distance d = 2^k) sends slots [0, nb) to r - d and
   receives the sender's slots [0, nb) from r + d into slots [d, d + nb),
   nb = min(d, n - d). After the last step slot i holds block (r + i) mod
   n for every i; the final rotation puts slot i at block position
   braid__bruck_block(r, n, i). */

static inline int braid__bruck_steps(int n) { return braid__log2_ceil(n); }
static inline int braid__bruck_send_peer(int r, int n, int k) { return braid__mod((long long)r - (1ll << k), n); }
static inline int braid__bruck_recv_peer(int r, int n, int k) { return braid__mod((long long)r + (1ll << k), n); }
static inline int braid__bruck_nblocks(int n, int k) {
  long long d = 1ll << k;
  return (int)(d < n - d ? d : n - d);
}
static inline int braid__bruck_block(int r, int n, int slot) { return braid__mod((long long)r + slot, n); }

/* ------------------------------------------------------------------------ */
/* Dissemination barrier: at step k (0..ceil(log2 n)-1) rank r sends to
   r + 2^k and receives from r - 2^k; after the last step every rank has
   heard, directly or through others, from every rank. */

static inline int braid__dissem_steps(int n) { return braid__log2_ceil(n); }
static inline int braid__dissem_to(int r, int n, int k) { return braid__mod((long long)r + (1ll << k), n); }
static inline int braid__dissem_from(int r, int n, int k) { return braid__mod((long long)r - (1ll << k), n); }

/* ------------------------------------------------------------------------ */
/* Binomial subtrees for rooted gather, scatter and reduce. The subtree of
   relative rank v is the contiguous range [v, v + braid__binomial_subtree(v,
   n)): v's lowest set bit wide (the whole world for the root), cut at n.
   Its children v + 2^k (2^k below that bit) split the rest of the range
   into the ranges of their own subtrees, so a node can keep its subtree's
   blocks in one buffer in relative order, child c's at offset c - v. */

static inline int braid__binomial_subtree(int v, int n) {
  if (v <= 0) return n;
  long long w = (long long)v & -(long long)v;
  return (int)(n - v < w ? n - v : w);
}

/* A relative range [v, v + len) of a rooted pattern as absolute ranks: it
   starts at rank braid__abs_rank(v, root, n) and runs for the returned
   number of ranks before it wraps past rank n-1; the rest (len minus that)
   continues from rank 0. Transfers with the root are cut there, so the root
   sends and receives straight from and into its rank-ordered buffer. */
static inline int braid__range_head(int v, int len, int root, int n) {
  int a = braid__abs_rank(v, root, n);
  return n - a < len ? n - a : len;
}

/* ------------------------------------------------------------------------ */
/* All-to-all. Pairwise exchange: at step s (1..n-1) rank r sends its block
   for r + s and receives the block of r - s; every step is a permutation,
   so no rank receives from two peers at once. In place the block sent and
   the block received at a step must be the same one, so the steps pair the
   ranks instead: with a power of two, r and r ^ s at step s (1..n-1);
   otherwise r and s - r at step s (0..n-1), a rank whose partner is itself
   sitting that step out. Every pair meets exactly once either way. */

static inline int braid__a2a_to(int r, int n, int s) { return braid__mod((long long)r + s, n); }
static inline int braid__a2a_from(int r, int n, int s) { return braid__mod((long long)r - s, n); }

/* Steps of the in-place pairing: s runs from braid__a2a_pair_first(n) to n-1. */
static inline int braid__a2a_pair_first(int n) { return braid__is_pow2(n) ? 1 : 0; }
static inline int braid__a2a_partner(int r, int n, int s) {
  return braid__is_pow2(n) ? r ^ s : braid__mod((long long)s - r, n);
}

/* Bruck all-to-all. Rank r first rotates its blocks so slot i holds its
   block for rank r + i. At step k (0..ceil(log2 n)-1, distance 2^k) it
   sends every slot whose index has bit k set to r + 2^k and receives the
   same slots from r - 2^k. A block for r + i moves by exactly i in all, so
   it ends at its destination in slot i, which then holds the block of rank
   r - i: block j of the result is slot (r - j) mod n. */

static inline int braid__bruck_a2a_to(int r, int n, int k) { return braid__mod((long long)r + (1ll << k), n); }
static inline int braid__bruck_a2a_from(int r, int n, int k) { return braid__mod((long long)r - (1ll << k), n); }
static inline int braid__bruck_a2a_moves(int slot, int k) { return (slot >> k) & 1; }
/* Slots that move at step k (how many blocks a step sends). */
static inline int braid__bruck_a2a_nmove(int n, int k) {
  int c = 0;
  for (int i = 0; i < n; i++) c += braid__bruck_a2a_moves(i, k);
  return c;
}
static inline int braid__bruck_a2a_slot(int r, int n, int j) { return braid__mod((long long)r - j, n); }

#endif
