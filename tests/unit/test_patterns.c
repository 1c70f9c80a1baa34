/* The rank math of src/algos/patterns.h, simulated symbolically for every
   world size 1..64 (and every root of the rooted patterns): contributions
   and blocks are tracked as bit sets of ranks, so each check says who got
   what from whom, how often, and where. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "algos/patterns.h"
#include "harness.h"

#define MAXN 64
typedef uint64_t set64;

static set64 bit(int r) { return (set64)1 << r; }
static set64 all_of(int n) { return n == 64 ? ~(set64)0 : bit(n) - 1; }

static int test_helpers(void) {
  for (int n = 1; n <= 5000; n++) {
    int p = braid__pow2_floor(n), c = braid__log2_ceil(n), f = braid__log2_floor(n);
    BT_CHECK(p <= n && 2 * p > n && braid__is_pow2(p), "pow2_floor(%d) = %d", n, p);
    BT_CHECK((1 << f) == p, "log2_floor(%d) = %d", n, f);
    BT_CHECK((1ll << c) >= n && (c == 0 || (1ll << (c - 1)) < n), "log2_ceil(%d) = %d", n, c);
    BT_CHECK(braid__is_pow2(n) == (p == n), "is_pow2(%d)", n);
  }
  for (int n = 1; n <= 20; n++)
    for (long long a = -3 * n; a <= 3 * n; a++) {
      int m = braid__mod(a, n);
      BT_CHECK(m >= 0 && m < n && (a - m) % n == 0, "mod(%lld, %d) = %d", a, n, m);
    }
  return 0;
}

static int test_partition(void) {
  static const size_t counts[] = {0, 1, 2, 3, 7, 63, 64, 65, 100, 1000, 1000003, (size_t)1 << 40};
  for (size_t ci = 0; ci < BT_COUNT(counts); ci++)
    for (int n = 1; n <= MAXN; n++) {
      size_t count = counts[ci], q = count / (size_t)n, rem = count % (size_t)n, sum = 0;
      BT_CHECK(braid__part_off(count, n, 0) == 0 && braid__part_off(count, n, n) == count, "ends n=%d", n);
      for (int i = 0; i < n; i++) {
        size_t len = braid__part_len(count, n, i);
        BT_CHECK(len == ((size_t)i < rem ? q + 1 : q), "count %zu n %d block %d has %zu", count, n, i, len);
        BT_CHECK(braid__part_off(count, n, i) == sum, "count %zu n %d block %d offset", count, n, i);
        BT_CHECK(braid__part_off(count, n, i + 1) - braid__part_off(count, n, i) == len, "offset step");
        sum += len;
      }
      BT_CHECK(sum == count, "count %zu n %d covered %zu", count, n, sum);
    }
  /* Sub-chunking: 1..max chunks; uncapped chunks hold at most target. */
  for (size_t maxlen = 1; maxlen <= 3000; maxlen += 7)
    for (size_t target = 1; target <= 700; target = target * 3 + 1)
      for (size_t cap = 1; cap <= 64; cap *= 4) {
        size_t C = braid__chunk_num(maxlen, target, cap);
        BT_CHECK(C >= 1 && C <= cap, "chunk_num(%zu, %zu, %zu) = %zu", maxlen, target, cap, C);
        if (C < cap) BT_CHECK(braid__part_len(maxlen, (int)C, 0) <= target, "chunk over target");
        BT_CHECK(braid__div_ceil(maxlen, target) <= cap ? C == braid__div_ceil(maxlen, target) : C == cap,
                 "chunk_num(%zu, %zu, %zu) = %zu", maxlen, target, cap, C);
      }
  return 0;
}

/* Ring reduce-scatter then all-gather, step by step, all ranks at once. */
static int test_ring(void) {
  static set64 part[MAXN][MAXN], out[MAXN];
  static set64 have[MAXN], nhave[MAXN];
  for (int n = 1; n <= MAXN; n++) {
    for (int r = 0; r < n; r++) {
      BT_CHECK(braid__ring_prev(braid__ring_next(r, n), n) == r, "next/prev n=%d r=%d", n, r);
      for (int b = 0; b < n; b++) part[r][b] = bit(r); /* its own contribution to every block */
    }
    /* reduce-scatter */
    for (int s = 0; s + 1 < n; s++) {
      for (int r = 0; r < n; r++) {
        int t = braid__ring_next(r, n), sb = braid__ring_rs_send_block(r, n, s);
        int rb = braid__ring_rs_recv_block(t, n, s);
        BT_CHECK(rb == sb, "n=%d step %d: %d sends block %d, %d expects %d", n, s, r, sb, t, rb);
        if (s > 0)
          BT_CHECK(sb == braid__ring_rs_recv_block(r, n, s - 1),
                   "n=%d step %d: rank %d sends block %d, not the one it just reduced", n, s, r, sb);
        out[t] = part[r][sb]; /* what t receives at this step */
      }
      for (int t = 0; t < n; t++) {
        int rb = braid__ring_rs_recv_block(t, n, s);
        BT_CHECK((out[t] & part[t][rb]) == 0, "n=%d step %d: rank %d would count a contribution twice", n, s, t);
        part[t][rb] |= out[t];
      }
    }
    for (int r = 0; r < n; r++) {
      BT_CHECK(part[r][r] == all_of(n), "n=%d: rank %d's block %d has %llx", n, r, r,
               (unsigned long long)part[r][r]);
      for (int b = 0; b < n; b++)
        if (b != r) BT_CHECK(part[r][b] != all_of(n) || n == 1, "n=%d: block %d complete at rank %d too", n, b, r);
    }
    /* all-gather of the owned blocks */
    for (int r = 0; r < n; r++) have[r] = bit(r);
    for (int s = 0; s + 1 < n; s++) {
      memcpy(nhave, have, sizeof have);
      for (int r = 0; r < n; r++) {
        int t = braid__ring_next(r, n), sb = braid__ring_ag_send_block(r, n, s);
        BT_CHECK(have[r] & bit(sb), "n=%d step %d: %d sends block %d it lacks", n, s, r, sb);
        BT_CHECK(braid__ring_ag_recv_block(t, n, s) == sb, "n=%d step %d: all-gather pairing %d->%d", n, s, r, t);
        if (s > 0) BT_CHECK(sb == braid__ring_ag_recv_block(r, n, s - 1), "forwards what it received");
        BT_CHECK(!(nhave[t] & bit(sb)), "n=%d step %d: rank %d gets block %d twice", n, s, t, sb);
        nhave[t] |= bit(sb);
      }
      memcpy(have, nhave, sizeof have);
    }
    for (int r = 0; r < n; r++) BT_CHECK(have[r] == all_of(n), "n=%d: rank %d lacks blocks", n, r);
    if (n > 1) BT_CHECK(braid__ring_ag_send_block(3 % n, n, 0) == 3 % n, "all-gather starts from the owned block");
  }
  return 0;
}

static int test_fold(void) {
  for (int n = 1; n <= MAXN; n++) {
    int p = braid__pow2_floor(n), rem = n - p, seen[MAXN] = {0};
    for (int r = 0; r < n; r++) {
      int q = braid__fold_proxy(r, n), peer = braid__fold_peer(r, n);
      if (q < 0) {
        BT_CHECK(r < 2 * rem && (r & 1), "n=%d: rank %d is an extra", n, r);
        BT_CHECK(peer == r - 1 && braid__fold_proxy(peer, n) >= 0, "n=%d: extra %d's proxy", n, r);
        BT_CHECK(braid__fold_peer(peer, n) == r, "n=%d: pair %d", n, r);
      } else {
        BT_CHECK(q < p && !seen[q], "n=%d: proxy %d given twice", n, q);
        seen[q] = 1;
        BT_CHECK(braid__fold_rank(q, n) == r, "n=%d: fold_rank(%d) != %d", n, q, r);
        BT_CHECK((peer >= 0) == (q < rem), "n=%d: proxy %d folded iff below rem", n, q);
      }
    }
    int covered = 0;
    for (int q = 0; q < p; q++) {
      int lo = braid__fold_rank(q, n), hi = braid__fold_rank(q + 1, n);
      BT_CHECK(lo == covered && hi - lo == (q < rem ? 2 : 1), "n=%d: proxy %d speaks for [%d,%d)", n, q, lo, hi);
      covered = hi;
    }
    BT_CHECK(covered == n, "n=%d: proxies speak for %d ranks", n, covered);
  }
  return 0;
}

/* The bits of the ranks proxy q speaks for (its data after folding). */
static set64 folded(int q, int n) {
  set64 s = 0;
  for (int r = braid__fold_rank(q, n); r < braid__fold_rank(q + 1, n); r++) s |= bit(r);
  return s;
}

static int own_part(int near, int q, int L) { return near ? braid__brev(q, L) : q; }

/* Halving and doubling, farthest partners first (near 0: reduce-scatter's,
   proxy q ends with range q) or nearest first (near 1: all-reduce's, proxy
   q ends with range brev(q)). */
static int check_halving_doubling(int near) {
  static set64 acc[MAXN][MAXN], old[MAXN][MAXN];
  static set64 have[MAXN], oldh[MAXN];
  braid__xchg (*halving)(int, int, int) = near ? braid__rhd_halving_near : braid__rhd_halving;
  braid__xchg (*doubling)(int, int, int) = near ? braid__rhd_doubling_near : braid__rhd_doubling;
  for (int n = 1; n <= MAXN; n++) {
    int p = braid__pow2_floor(n), L = braid__log2_floor(p);
    for (int q = 0; q < p; q++)
      for (int j = 0; j < p; j++) acc[q][j] = folded(q, n);
    /* halving: every proxy's range halves around its own number */
    int lo[MAXN], hi[MAXN];
    for (int q = 0; q < p; q++) lo[q] = 0, hi[q] = p;
    for (int i = 0; i < L; i++) {
      memcpy(old, acc, sizeof acc);
      for (int q = 0; q < p; q++) {
        braid__xchg x = halving(q, p, i), y = halving(x.peer, p, i);
        BT_CHECK(y.peer == q, "n=%d step %d: %d pairs with %d, which pairs with %d", n, i, q, x.peer, y.peer);
        BT_CHECK(y.send_lo == x.recv_lo && y.send_hi == x.recv_hi && y.recv_lo == x.send_lo &&
                     y.recv_hi == x.send_hi,
                 "n=%d step %d: ranges of %d and %d do not pair", n, i, q, x.peer);
        BT_CHECK(x.recv_lo == lo[q] || x.recv_hi == hi[q], "not a half of the current range");
        BT_CHECK(own_part(near, q, L) >= x.recv_lo && own_part(near, q, L) < x.recv_hi && x.recv_hi - x.recv_lo == (hi[q] - lo[q]) / 2,
                 "n=%d step %d: proxy %d keeps [%d,%d)", n, i, q, x.recv_lo, x.recv_hi);
        BT_CHECK(x.send_lo >= lo[q] && x.send_hi <= hi[q] && x.send_hi - x.send_lo == x.recv_hi - x.recv_lo,
                 "send range");
        BT_CHECK(doubling(q, p, L - 1 - i).peer == x.peer, "doubling mirrors halving");
        BT_CHECK(x.peer == (q ^ (near ? 1 << i : p >> (i + 1))), "n=%d step %d: %d's partner %d", n, i, q, x.peer);
        for (int j = x.recv_lo; j < x.recv_hi; j++) {
          BT_CHECK(!(acc[q][j] & old[x.peer][j]), "n=%d step %d: part %d counted twice at proxy %d", n, i, j, q);
          acc[q][j] |= old[x.peer][j];
        }
        lo[q] = x.recv_lo, hi[q] = x.recv_hi;
      }
    }
    for (int q = 0; q < p; q++) {
      BT_CHECK(lo[q] == own_part(near, q, L) && hi[q] == own_part(near, q, L) + 1, "n=%d: proxy %d ends with [%d,%d)", n, q, lo[q], hi[q]);
      BT_CHECK(acc[q][own_part(near, q, L)] == all_of(n), "n=%d: proxy %d's part lacks ranks: %llx", n, q,
               (unsigned long long)acc[q][own_part(near, q, L)]);
    }
    /* doubling: the final parts spread to every proxy */
    for (int q = 0; q < p; q++) have[q] = bit(own_part(near, q, L));
    for (int i = 0; i < L; i++) {
      memcpy(oldh, have, sizeof have);
      for (int q = 0; q < p; q++) {
        braid__xchg x = doubling(q, p, i), y = doubling(x.peer, p, i);
        set64 mine = 0, theirs = 0;
        for (int j = x.send_lo; j < x.send_hi; j++) mine |= bit(j);
        for (int j = x.recv_lo; j < x.recv_hi; j++) theirs |= bit(j);
        BT_CHECK(y.peer == q && mine == oldh[q] && theirs == oldh[x.peer] && !(mine & theirs),
                 "n=%d doubling step %d: proxy %d", n, i, q);
        BT_CHECK(y.send_lo == x.recv_lo && y.send_hi == x.recv_hi, "doubling pairing");
        have[q] |= theirs;
      }
    }
    for (int q = 0; q < p; q++) BT_CHECK(have[q] == all_of(p), "n=%d: proxy %d misses parts", n, q);
    if (near) continue;
    /* recursive doubling of whole vectors */
    set64 whole[MAXN], prev[MAXN];
    for (int q = 0; q < p; q++) whole[q] = folded(q, n);
    for (int i = 0; i < L; i++) {
      memcpy(prev, whole, sizeof whole);
      for (int q = 0; q < p; q++) {
        int pq = braid__rd_peer(q, i);
        BT_CHECK(pq < p && braid__rd_peer(pq, i) == q && !(prev[q] & prev[pq]), "n=%d rd step %d: %d", n, i, q);
        whole[q] = prev[q] | prev[pq];
      }
    }
    for (int q = 0; q < p; q++) BT_CHECK(whole[q] == all_of(n), "n=%d: rd proxy %d incomplete", n, q);
  }
  return 0;
}

static int test_halving_doubling(void) { return check_halving_doubling(0) || check_halving_doubling(1); }

static int subtree_size(int v, int n, int k) {
  int kids[256], nk = braid__knomial_children(v, n, k, kids, 256), s = 1;
  for (int i = 0; i < nk; i++) s += subtree_size(kids[i], n, k);
  return s;
}

static int test_trees(void) {
  static const int radix[] = {2, 3, 4, 8};
  for (size_t ki = 0; ki < BT_COUNT(radix); ki++)
    for (int n = 1; n <= MAXN; n++)
      for (int root = 0; root < n; root++) {
        int k = radix[ki], depth_max = 0;
        for (long long m = 1; m < n; m *= k) depth_max++;
        /* breadth-first from the root in absolute ranks */
        int reached[MAXN] = {0}, depth[MAXN] = {0}, queue[MAXN], qh = 0, qt = 0;
        queue[qt++] = root;
        reached[root] = 1;
        BT_CHECK(braid__knomial_parent(braid__rel_rank(root, root, n), k) == -1, "the root has no parent");
        while (qh < qt) {
          int a = queue[qh++], v = braid__rel_rank(a, root, n), kids[256];
          int nk = braid__knomial_children(v, n, k, kids, 256);
          BT_CHECK(nk <= (k - 1) * depth_max, "n=%d k=%d: %d has %d children", n, k, v, nk);
          int last = n + 1;
          for (int i = 0; i < nk; i++) {
            int ch = braid__abs_rank(kids[i], root, n);
            BT_CHECK(kids[i] > v && kids[i] < n, "n=%d k=%d root=%d: child %d of %d", n, k, root, kids[i], v);
            BT_CHECK(braid__abs_rank(braid__knomial_parent(kids[i], k), root, n) == a,
                     "n=%d k=%d root=%d: the parent of %d is not %d", n, k, root, ch, a);
            BT_CHECK(!reached[ch], "n=%d k=%d root=%d: rank %d reached twice", n, k, root, ch);
            int sz = subtree_size(kids[i], n, k);
            BT_CHECK(sz <= last, "n=%d k=%d: children of %d not largest subtree first", n, k, v);
            last = sz;
            reached[ch] = 1;
            depth[ch] = depth[a] + 1;
            BT_CHECK(depth[ch] <= depth_max, "n=%d k=%d: depth %d over ceil(log_k n) = %d", n, k, depth[ch],
                     depth_max);
            queue[qt++] = ch;
          }
        }
        BT_CHECK(qt == n, "n=%d k=%d root=%d: the tree reaches %d ranks", n, k, root, qt);
        for (int r = 0; r < n; r++) {
          if (r == root) continue;
          int v = braid__rel_rank(r, root, n), par = braid__knomial_parent(v, k), kids[256], found = 0;
          int nk = braid__knomial_children(par, n, k, kids, 256);
          for (int i = 0; i < nk; i++) found += kids[i] == v;
          BT_CHECK(found == 1, "n=%d k=%d: %d is not among its parent %d's children", n, k, v, par);
        }
      }
  /* a cap truncates the list to its first entries */
  for (int n = 1; n <= MAXN; n++) {
    int all[256], part[3], na = braid__knomial_children(0, n, 4, all, 256);
    int np = braid__knomial_children(0, n, 4, part, 3);
    BT_CHECK(np == (na < 3 ? na : 3) && !memcmp(all, part, sizeof(int) * (size_t)np), "n=%d: capped children", n);
  }
  for (int n = 1; n <= MAXN; n++)
    for (int v = 0; v < n; v++) {
      int a[256], b[256], na = braid__binomial_children(v, n, a, 256), nb = braid__knomial_children(v, n, 2, b, 256);
      BT_CHECK(na == nb && !memcmp(a, b, sizeof(int) * (size_t)na) &&
                   braid__binomial_parent(v) == braid__knomial_parent(v, 2),
               "binomial is radix 2");
    }
  /* relative ranks from any root */
  for (int n = 1; n <= MAXN; n++)
    for (int root = 0; root < n; root++) {
      int hit[MAXN] = {0};
      for (int r = 0; r < n; r++) {
        int v = braid__rel_rank(r, root, n);
        BT_CHECK(v >= 0 && v < n && braid__abs_rank(v, root, n) == r && !hit[v]++, "rel/abs n=%d root=%d", n, root);
      }
    }
  return 0;
}

static int test_chain(void) {
  for (int n = 1; n <= MAXN; n++)
    for (int root = 0; root < n; root++) {
      int seen[MAXN] = {0}, v = 0, hops = 0;
      BT_CHECK(braid__chain_prev(0) == -1, "the root has no predecessor");
      for (;;) {
        int r = braid__abs_rank(v, root, n);
        BT_CHECK(!seen[r], "n=%d root=%d: rank %d visited twice", n, root, r);
        seen[r] = 1;
        int nv = braid__chain_next(v, n);
        if (nv < 0) break;
        BT_CHECK(braid__chain_prev(nv) == v, "prev(next(%d))", v);
        v = nv;
        hops++;
      }
      BT_CHECK(hops == n - 1, "n=%d root=%d: chain of %d hops", n, root, hops);
    }
  return 0;
}

static int test_bruck(void) {
  static int slot[MAXN][MAXN], nslot[MAXN][MAXN];
  for (int n = 1; n <= MAXN; n++) {
    for (int r = 0; r < n; r++)
      for (int i = 0; i < n; i++) slot[r][i] = i ? -1 : r;
    int steps = braid__bruck_steps(n);
    BT_CHECK(steps == braid__log2_ceil(n), "n=%d: %d steps", n, steps);
    for (int k = 0; k < steps; k++) {
      memcpy(nslot, slot, sizeof slot);
      int d = 1 << k, nb = braid__bruck_nblocks(n, k);
      BT_CHECK(nb >= 1 && nb <= d && d + nb <= n, "n=%d step %d: %d blocks", n, k, nb);
      for (int r = 0; r < n; r++) {
        int from = braid__bruck_recv_peer(r, n, k), to = braid__bruck_send_peer(r, n, k);
        BT_CHECK(braid__bruck_send_peer(from, n, k) == r && braid__bruck_recv_peer(to, n, k) == r,
                 "n=%d step %d: bruck pairing of %d", n, k, r);
        for (int j = 0; j < nb; j++) {
          BT_CHECK(slot[from][j] >= 0, "n=%d step %d: %d sends slot %d it lacks", n, k, from, j);
          BT_CHECK(slot[r][d + j] < 0, "n=%d step %d: %d gets slot %d twice", n, k, r, d + j);
          BT_CHECK(slot[from][j] == braid__bruck_block(r, n, d + j), "n=%d step %d: block lands in the wrong slot", n,
                   k);
          nslot[r][d + j] = slot[from][j];
        }
      }
      memcpy(slot, nslot, sizeof slot);
    }
    for (int r = 0; r < n; r++) {
      set64 got = 0;
      for (int i = 0; i < n; i++) {
        BT_CHECK(slot[r][i] == braid__bruck_block(r, n, i), "n=%d: rank %d slot %d", n, r, i);
        got |= bit(braid__bruck_block(r, n, i));
      }
      BT_CHECK(got == all_of(n), "n=%d: rotation of rank %d misses blocks", n, r);
    }
  }
  return 0;
}

static int test_dissemination(void) {
  for (int n = 1; n <= MAXN; n++) {
    set64 know[MAXN], old[MAXN];
    int steps = braid__dissem_steps(n);
    BT_CHECK(steps == braid__log2_ceil(n), "n=%d: %d rounds", n, steps);
    for (int r = 0; r < n; r++) know[r] = bit(r);
    for (int k = 0; k < steps; k++) {
      memcpy(old, know, sizeof know);
      for (int r = 0; r < n; r++) {
        int to = braid__dissem_to(r, n, k);
        BT_CHECK(braid__dissem_from(to, n, k) == r, "n=%d round %d: %d -> %d not expected", n, k, r, to);
        know[to] |= old[r];
      }
    }
    for (int r = 0; r < n; r++) BT_CHECK(know[r] == all_of(n), "n=%d: rank %d has heard from %llx", n, r,
                                         (unsigned long long)know[r]);
    /* one round fewer leaves some rank uninformed: the count is tight */
    if (n > 1) {
      for (int r = 0; r < n; r++) know[r] = bit(r);
      for (int k = 0; k + 1 < steps; k++) {
        memcpy(old, know, sizeof know);
        for (int r = 0; r < n; r++) know[braid__dissem_to(r, n, k)] |= old[r];
      }
      int short_of = 0;
      for (int r = 0; r < n; r++) short_of += know[r] != all_of(n);
      BT_CHECK(short_of > 0, "n=%d: %d rounds would do", n, steps - 1);
    }
  }
  return 0;
}

/* Binomial subtrees as contiguous relative ranges: gather collects each
   subtree's blocks at its top, scatter hands them down, reduce combines
   them; every rank's block must travel up exactly once and land at its
   offset, and the root's transfers cut at the wrap must cover each range. */
static int test_subtrees(void) {
  for (int n = 1; n <= MAXN; n++) {
    BT_CHECK(braid__binomial_subtree(0, n) == n, "n=%d: the root's subtree is everything", n);
    for (int v = 0; v < n; v++) {
      int sz = braid__binomial_subtree(v, n);
      BT_CHECK(sz >= 1 && v + sz <= n && sz == subtree_size(v, n, 2), "n=%d: subtree of %d is %d", n, v, sz);
      /* the children's ranges tile [v + 1, v + sz) in order of their offsets */
      int kids[256], nk = braid__binomial_children(v, n, kids, 256);
      set64 cover = bit(v);
      for (int i = 0; i < nk; i++) {
        int c = kids[i], cs = braid__binomial_subtree(c, n);
        BT_CHECK(c > v && c + cs <= v + sz, "n=%d: child %d of %d leaves its range", n, c, v);
        for (int u = c; u < c + cs; u++) {
          BT_CHECK(!(cover & bit(u)), "n=%d: rank %d in two children's ranges of %d", n, u, v);
          cover |= bit(u);
        }
      }
      set64 want = 0;
      for (int u = v; u < v + sz; u++) want |= bit(u);
      BT_CHECK(cover == want, "n=%d: children of %d do not tile its range", n, v);
    }
    /* gather up the tree: every block reaches the root once */
    static set64 held[MAXN];
    for (int v = 0; v < n; v++) held[v] = bit(v);
    for (int v = n - 1; v > 0; v--) { /* children have larger numbers than their parents */
      int par = braid__binomial_parent(v);
      BT_CHECK(!(held[par] & held[v]), "n=%d: blocks of %d reach %d twice", n, v, par);
      held[par] |= held[v];
    }
    BT_CHECK(held[0] == all_of(n), "n=%d: the root gathers %llx", n, (unsigned long long)held[0]);
    /* the root's cut at the wrap */
    for (int root = 0; root < n; root++)
      for (int v = 1; v < n; v++) {
        int len = braid__binomial_subtree(v, n), head = braid__range_head(v, len, root, n);
        int a = braid__abs_rank(v, root, n);
        BT_CHECK(head >= 1 && head <= len && a + head <= n, "n=%d root %d: head of %d", n, root, v);
        if (head < len) BT_CHECK(a + head == n && braid__abs_rank(v + head, root, n) == 0, "the rest starts at 0");
      }
  }
  return 0;
}

/* Pairwise all-to-all: each ordered pair exchanges exactly once, each step
   is a permutation (nobody receives twice in a step), and the in-place
   pairing is symmetric. */
static int test_alltoall_pairwise(void) {
  static int got[MAXN][MAXN];
  for (int n = 1; n <= MAXN; n++) {
    memset(got, 0, sizeof got);
    for (int s = 1; s < n; s++) {
      int hit[MAXN] = {0};
      for (int r = 0; r < n; r++) {
        int to = braid__a2a_to(r, n, s);
        BT_CHECK(to != r && braid__a2a_from(to, n, s) == r, "n=%d step %d: %d -> %d unmatched", n, s, r, to);
        BT_CHECK(!hit[to]++, "n=%d step %d: %d receives twice", n, s, to);
        got[to][r]++;
      }
    }
    for (int r = 0; r < n; r++)
      for (int q = 0; q < n; q++)
        BT_CHECK(got[r][q] == (r != q), "n=%d: %d got %d blocks from %d", n, r, got[r][q], q);
    memset(got, 0, sizeof got);
    for (int s = braid__a2a_pair_first(n); s < n; s++)
      for (int r = 0; r < n; r++) {
        int p = braid__a2a_partner(r, n, s);
        BT_CHECK(p >= 0 && p < n && braid__a2a_partner(p, n, s) == r, "n=%d step %d: pairing of %d", n, s, r);
        if (p != r) got[r][p]++;
      }
    for (int r = 0; r < n; r++)
      for (int q = 0; q < n; q++)
        BT_CHECK(got[r][q] == (r != q), "n=%d: in place, %d met %d %d times", n, r, q, got[r][q]);
  }
  return 0;
}

/* Bruck all-to-all: blocks tracked as (source, destination) through the
   steps end where the final slot rule says. */
static int test_bruck_alltoall(void) {
  static int src[MAXN][MAXN], dst[MAXN][MAXN], nsrc[MAXN][MAXN], ndst[MAXN][MAXN];
  for (int n = 1; n <= MAXN; n++) {
    for (int r = 0; r < n; r++)
      for (int i = 0; i < n; i++) src[r][i] = r, dst[r][i] = braid__mod((long long)r + i, n);
    for (int k = 0; k < braid__log2_ceil(n); k++) {
      memcpy(nsrc, src, sizeof src);
      memcpy(ndst, dst, sizeof dst);
      int moved = 0;
      for (int i = 0; i < n; i++) moved += braid__bruck_a2a_moves(i, k);
      BT_CHECK(moved == braid__bruck_a2a_nmove(n, k) && moved >= 1, "n=%d step %d: %d move", n, k, moved);
      for (int r = 0; r < n; r++) {
        int from = braid__bruck_a2a_from(r, n, k);
        BT_CHECK(braid__bruck_a2a_to(from, n, k) == r, "n=%d step %d: pairing of %d", n, k, r);
        for (int i = 0; i < n; i++)
          if (braid__bruck_a2a_moves(i, k)) nsrc[r][i] = src[from][i], ndst[r][i] = dst[from][i];
      }
      memcpy(src, nsrc, sizeof src);
      memcpy(dst, ndst, sizeof dst);
    }
    for (int r = 0; r < n; r++)
      for (int j = 0; j < n; j++) {
        int i = braid__bruck_a2a_slot(r, n, j);
        BT_CHECK(dst[r][i] == r && src[r][i] == j, "n=%d: rank %d slot %d holds %d->%d, wanted %d->%d", n, r, i,
                 src[r][i], dst[r][i], j, r);
      }
  }
  return 0;
}

static const bt_case cases[] = {
    BT_CASE(test_helpers), BT_CASE(test_partition), BT_CASE(test_ring),  BT_CASE(test_fold),
    BT_CASE(test_halving_doubling), BT_CASE(test_trees), BT_CASE(test_chain), BT_CASE(test_bruck),
    BT_CASE(test_dissemination), BT_CASE(test_subtrees), BT_CASE(test_alltoall_pairwise),
    BT_CASE(test_bruck_alltoall),
};

int main(int argc, char **argv) { return bt_main(argc, argv, cases, BT_COUNT(cases)); }
