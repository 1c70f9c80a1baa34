/* The matcher's questions about unexpected internal messages, without a
   transport: which earlier collective left one behind (asked at the start
   and end of every collective) and which one of this collective disagrees
   with this rank's call. Arrivals out of collective order, removals in any
   order, other communicators' and user messages, and the wrap of the tag's
   sequence field are compared against a brute-force answer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/comm.h"
#include "core/match.h"
#include "core/tag.h"
#include "harness.h"

#define SEQ_MOD ((uint64_t)1 << BRAID__TAG_SEQ_BITS)

static braid_comm *comm_new(uint64_t id, uint64_t seq) {
  braid_comm *c = braid__comm_alloc();
  if (c) {
    c->id = id;
    c->seq = seq;
  }
  return c;
}

static braid__desc desc_of(int arg) { return braid__desc_make(BRAID__COLL_BROADCAST, 4, BRAID_F32, arg); }

/* An unexpected message of collective seq (full, unwrapped) from src. */
static braid__umsg *arrive(braid_comm *c, uint64_t comm_id, uint64_t seq, int src, int arg) {
  braid__umsg *u = calloc(1, sizeof *u);
  if (!u) return NULL;
  u->src = src;
  u->h.tag = braid__tag_internal(comm_id, seq, (uint64_t)src);
  u->h.count = 4;
  u->h.dt = BRAID_F32;
  u->h.desc = desc_of(arg);
  braid__match_unexpected(c, u);
  return u;
}

/* Takes the message of (src, tag) off the queue the way a receive does. */
static braid__umsg *take(braid_comm *c, const braid__umsg *want) {
  braid__req r;
  memset(&r, 0, sizeof r);
  r.peer = want->src;
  r.h = want->h;
  braid_status st;
  braid__umsg *u = braid__match_post(c, &r, &st);
  if (!u) braid__match_cancel(c, &r);
  return st ? NULL : u;
}

static int free_all(braid_comm *c) {
  braid__umsg *u;
  int n = 0;
  while ((u = braid__match_pop_unexpected(c))) {
    free(u);
    n++;
  }
  BT_CHECK(c->match.active == 0, "the collective order outlived its messages");
  braid__comm_free(c);
  return n;
}

static int test_stale_and_later(void) {
  braid_comm *c = comm_new(7, 10);
  BT_CHECK(c, "oom");
  int src;
  braid__msg_hdr h;
  uint64_t at;
  BT_CHECK(!braid__match_find_stale(c, 10, 1, &src, &h, &at), "nothing queued, something stale");
  /* later collectives, out of order, then this one's */
  BT_CHECK(arrive(c, 7, 15, 1, 0) && arrive(c, 7, 12, 2, 0) && arrive(c, 7, 20, 3, 0), "oom");
  braid__umsg *cur = arrive(c, 7, 10, 2, 0);
  BT_CHECK(cur, "oom");
  /* another communicator's and a user message are never this one's business */
  braid__umsg *other = arrive(c, 8, 3, 1, 0);
  braid__umsg *user = calloc(1, sizeof *user);
  BT_CHECK(other && user, "oom");
  user->src = 1;
  user->h.tag = braid__tag_user(5);
  braid__match_unexpected(c, user);
  BT_CHECK(!braid__match_find_stale(c, 10, 0, &src, &h, &at), "a later collective's message counted as stale");
  BT_CHECK(braid__match_find_stale(c, 10, 1, &src, &h, &at) && src == 2 && at == 10,
           "this collective's message not found when asked inclusively (src %d at %llu)", src,
           (unsigned long long)at);
  BT_CHECK(braid__match_find_stale(c, 13, 0, &src, &h, &at) && at == 10, "the oldest one first: at %llu",
           (unsigned long long)at);
  BT_CHECK(take(c, cur) == cur, "the receive did not take its message");
  free(cur);
  BT_CHECK(braid__match_find_stale(c, 13, 0, &src, &h, &at) && at == 12 && src == 2, "after the take: at %llu",
           (unsigned long long)at);
  BT_CHECK(!braid__match_find_stale(c, 12, 0, &src, &h, &at), "collective 12's own message is not stale at 12");
  BT_CHECK(free_all(c) == 5, "queued messages lost");
  return 0;
}

/* A message of this collective with another descriptor: found, while those
   of other collectives and with the same descriptor are not. */
static int test_foreign(void) {
  braid_comm *c = comm_new(3, 40);
  BT_CHECK(c, "oom");
  braid__desc mine = desc_of(0), theirs;
  int src = -1;
  BT_CHECK(arrive(c, 3, 39, 1, 5) && arrive(c, 3, 40, 1, 0) && arrive(c, 3, 41, 2, 5) && arrive(c, 4, 40, 2, 5),
           "oom");
  BT_CHECK(!braid__match_find_foreign(c, 40, &mine, &src, &theirs), "a foreign call reported where none is");
  BT_CHECK(arrive(c, 3, 40, 3, 9), "oom");
  BT_CHECK(braid__match_find_foreign(c, 40, &mine, &src, &theirs) && src == 3 && theirs.arg == 9,
           "the other call's message was not found (src %d)", src);
  BT_CHECK(free_all(c) == 5, "queued messages lost");
  return 0;
}

/* The 27-bit field wraps: a message sent after the wrap is later, not older. */
static int test_wrap(void) {
  uint64_t base = SEQ_MOD - 2;
  braid_comm *c = comm_new(1, base);
  BT_CHECK(c, "oom");
  int src;
  braid__msg_hdr h;
  uint64_t at;
  braid__umsg *old = arrive(c, 1, base - 1, 1, 0);
  BT_CHECK(arrive(c, 1, base + 3, 1, 0) && old, "oom");
  BT_CHECK(braid__match_find_stale(c, base, 0, &src, &h, &at) && at == base - 1, "the one before: at %llu",
           (unsigned long long)at);
  BT_CHECK(take(c, old) == old, "the old message could not be taken");
  free(old);
  BT_CHECK(!braid__match_find_stale(c, base, 1, &src, &h, &at), "a message after the wrap looked older");
  c->seq = base + 4;
  BT_CHECK(braid__match_find_stale(c, base + 4, 0, &src, &h, &at) && at == 1, "past it: at %llu",
           (unsigned long long)at);
  BT_CHECK(free_all(c) == 1, "queued messages lost");
  return 0;
}

/* Random arrivals around the current collective and removals in any order,
   the current collective moving on: every answer equals a scan of what is
   queued. */
static int test_against_scan(void) {
  enum { N = 3000 };
  uint64_t seq = SEQ_MOD - 500; /* cross the wrap on the way */
  braid_comm *c = comm_new(9, seq);
  BT_CHECK(c, "oom");
  braid__umsg **live = calloc(N, sizeof *live);
  uint64_t *full = calloc(N, sizeof *full);
  BT_CHECK(live && full, "oom");
  int nlive = 0;
  uint64_t x = 88172645463325252ull;
  for (int step = 0; step < 20000; step++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int what = (int)(x % 10);
    if (what < 5 && nlive < N) {
      /* mostly the next few collectives, sometimes one just past */
      uint64_t s = what == 0 ? seq - 1 - (x >> 8) % 3 : seq + (x >> 8) % 40;
      braid__umsg *u = arrive(c, 9, s, (int)((x >> 20) % 11), 0);
      BT_CHECK(u, "oom");
      live[nlive] = u;
      full[nlive++] = s;
    } else if (what < 9 && nlive) {
      int k = (int)((x >> 16) % (uint64_t)nlive);
      /* the oldest of its key goes, which may be another message with that key */
      braid__umsg *got = take(c, live[k]);
      BT_CHECK(got != NULL, "step %d: a queued message could not be taken", step);
      int gone = -1;
      for (int i = 0; i < nlive && gone < 0; i++)
        if (live[i] == got) gone = i;
      BT_CHECK(gone >= 0 && got->src == live[k]->src && got->h.tag == live[k]->h.tag,
               "step %d: the receive took a message that was not queued under its key", step);
      free(live[gone]);
      live[gone] = live[--nlive];
      full[gone] = full[nlive];
    } else {
      seq++;
      c->seq = seq;
    }
    for (int inclusive = 0; inclusive < 2; inclusive++) {
      uint64_t want = UINT64_MAX;
      for (int i = 0; i < nlive; i++)
        if ((full[i] < seq || (inclusive && full[i] == seq)) && full[i] < want) want = full[i];
      int src;
      braid__msg_hdr h;
      uint64_t at;
      int found = braid__match_find_stale(c, seq, inclusive, &src, &h, &at);
      BT_CHECK(found == (want != UINT64_MAX), "step %d: stale %s, the scan says %s", step, found ? "found" : "not found",
               want != UINT64_MAX ? "there is one" : "none");
      if (found) BT_CHECK(at == (want & (SEQ_MOD - 1)), "step %d: at %llu, oldest %llu", step,
                          (unsigned long long)at, (unsigned long long)(want & (SEQ_MOD - 1)));
    }
  }
  free(live);
  free(full);
  BT_CHECK(free_all(c) == nlive, "queued messages lost");
  return 0;
}

/* Ranks that run ahead leave thousands of messages, each under its own key:
   the tables grow, and a key's messages stay in arrival order across the
   growth, for unexpected messages and posted receives alike. */
static braid__umsg *user_msg(braid_comm *c, int src, uint32_t tag, size_t order) {
  braid__umsg *u = calloc(1, sizeof *u);
  if (!u) return NULL;
  u->src = src;
  u->h.tag = braid__tag_user(tag);
  u->h.count = 4;
  u->h.dt = BRAID_F32;
  u->bytes = order; /* what tells same-key messages apart here */
  braid__match_unexpected(c, u);
  return u;
}

static int test_growth(void) {
  enum { N = 6000, NSRC = 5 };
  braid_comm *c = comm_new(5, 0);
  BT_CHECK(c, "oom");
  braid__umsg **all = calloc(N, sizeof *all);
  BT_CHECK(all, "oom");
  /* sources far apart: source s is s * 1000 collectives ahead; between
     them, before and after each growth, messages under one user key */
  size_t nsame = 0;
  for (int i = 0; i < N; i++) {
    int src = i % NSRC;
    if (i % 500 == 0) BT_CHECK(user_msg(c, 1, 7, ++nsame), "oom");
    BT_CHECK((all[i] = arrive(c, 5, (uint64_t)(src * 1000 + i / NSRC), src, 0)), "oom");
  }
  BT_CHECK(c->match.unexp.b && c->match.unexp.bits > 8, "the unexpected table did not grow (%zu queued)",
           c->match.nunexp);
  braid__umsg want = {0};
  want.src = 1;
  want.h.tag = braid__tag_user(7);
  want.h.count = 4;
  want.h.dt = BRAID_F32;
  for (size_t k = 1; k <= nsame; k++) {
    braid__umsg *u = take(c, &want);
    BT_CHECK(u && u->bytes == k, "same-key message %zu came out as %zu", k, u ? u->bytes : 0);
    free(u);
  }
  int src;
  braid__msg_hdr h;
  uint64_t at;
  BT_CHECK(braid__match_find_stale(c, 1, 0, &src, &h, &at) && at == 0 && src == 0,
           "the oldest collective's message not found first (src %d at %llu)", src, (unsigned long long)at);
  /* every message under its own key, in an order unlike the arrivals' */
  for (int k = 0; k < N; k++) {
    int i = (int)(((uint64_t)k * 7919) % N);
    braid__umsg *u = take(c, all[i]);
    BT_CHECK(u == all[i], "message %d not found under its key after the growth", i);
    free(u);
  }
  free(all);
  BT_CHECK(c->match.nunexp == 0 && c->match.active == 0, "entries left: %zu", c->match.nunexp);
  BT_CHECK(c->match.unexp.b == NULL, "the emptied unexpected table kept its grown buckets");
  /* back on the inline buckets, usable again: the key of the first message
     (queued there before the growth) too */
  for (size_t k = 101; k <= 103; k++) BT_CHECK(user_msg(c, 1, 7, k), "oom");
  for (size_t k = 101; k <= 103; k++) {
    braid__umsg *u = take(c, &want);
    BT_CHECK(u && u->bytes == k, "after the shrink, message %zu came out as %zu", k, u ? u->bytes : 0);
    free(u);
  }

  /* posted receives: the same, matched by arrivals */
  enum { NR = 3000 };
  braid__req *r = calloc(NR + 2, sizeof *r);
  BT_CHECK(r, "oom");
  braid_status st;
  for (int i = 0; i < NR + 2; i++) {
    r[i].peer = i < NR ? i % 3 : 2;
    r[i].h.tag = braid__tag_user(i < NR ? (uint32_t)i : 5);
    r[i].h.count = 4;
    r[i].h.dt = BRAID_F32;
    BT_CHECK(braid__match_post(c, &r[i], &st) == NULL && !st && r[i].queued, "receive %d not queued", i);
  }
  BT_CHECK(c->match.posted.b && c->match.posted.bits > 8, "the posted table did not grow");
  BT_CHECK(braid__match_posted_from(c, 2) && !braid__match_posted_from(c, 3), "posted_from is wrong");
  /* three receives share source 2's tag 5: they complete in posting order */
  braid__req *const same[3] = {&r[5], &r[NR], &r[NR + 1]};
  for (int k = 0; k < 3; k++) {
    braid__msg_hdr m = r[5].h;
    braid__req *got = braid__match_arrival(c, 2, &m, &st);
    BT_CHECK(!st && got == same[k], "arrival %d of source 2's tag 5 matched receive %td", k, got ? got - r : -1);
  }
  for (int k = 0; k < NR; k++) {
    int i = (int)(((uint64_t)k * 2039) % NR);
    if (i == 5) continue;
    braid__msg_hdr m = r[i].h;
    braid__req *got = braid__match_arrival(c, r[i].peer, &m, &st);
    BT_CHECK(!st && got == &r[i], "arrival %d matched receive %td", i, got ? got - r : -1);
  }
  BT_CHECK(c->match.nposted == 0 && braid__match_pop_posted(c) == NULL, "receives left: %zu", c->match.nposted);
  BT_CHECK(c->match.posted.b == NULL, "the emptied posted table kept its grown buckets");
  free(r);
  braid__comm_free(c);
  return 0;
}

int main(int argc, char **argv) {
  static const bt_case cases[] = {
      BT_CASE(test_stale_and_later),
      BT_CASE(test_foreign),
      BT_CASE(test_wrap),
      BT_CASE(test_against_scan),
      BT_CASE(test_growth),
  };
  return bt_main(argc, argv, cases, BT_COUNT(cases));
}
