/* braid_split: every rank learns every (color, key) through an all-gather,
   groups identically, and the members of each color build a child. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algos/algos.h"
#include "api/api.h"
#include "bootstrap/bootstrap.h"
#include "core/subcomm.h"
#include "core/wait.h"
#include "os/time.h"

typedef struct split_entry {
  uint32_t color, key;
  int rank;
} split_entry;

static int split_cmp(const void *a, const void *b) {
  const split_entry *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

/* The (color, key) exchange of a backend whose collectives take device
   memory and complete later (nccl): through the store, in short waits
   between which the engine's checks run (abort, failures, dead peers). */
static braid_status store_all_gather(braid_comm *c, const uint32_t mine[2], uint32_t *all) {
  braid__store *store = c->boot ? c->boot->store : NULL;
  if (!store) { /* one rank */
    all[0] = mine[0], all[1] = mine[1];
    return BRAID_OK;
  }
  char key[64];
  snprintf(key, sizeof key, "split/%u/%d", c->nsplits + 1, c->rank);
  if (braid__store_set(store, key, mine, 2 * sizeof(uint32_t)))
    return braid__fail(c, BRAID_ERR_BOOTSTRAP, "could not publish this rank's color and key: %s",
                       braid__store_error(store));
  braid__waiter w;
  braid__wait_begin(&w);
  for (int r = 0; r < c->size; r++) {
    snprintf(key, sizeof key, "split/%u/%d", c->nsplits + 1, r);
    void *v = NULL;
    size_t len = 0;
    braid_status gs;
    while ((gs = braid__store_get(store, key, &v, &len, braid__now() + 0.05)) == BRAID_ERR_TIMEOUT) {
      braid_status st = braid__wait_slow(c, &w, r, "the other ranks' colors and keys");
      if (st) return st;
    }
    if (gs || len != 2 * sizeof(uint32_t)) {
      free(v);
      return braid__fail(c, BRAID_ERR_BOOTSTRAP, "could not learn rank %d's color and key: %s", r,
                         gs ? braid__store_error(store) : "wrong size");
    }
    memcpy(all + 2 * r, v, 2 * sizeof(uint32_t));
    free(v);
  }
  braid__wait_end(c, &w);
  return BRAID_OK;
}

braid_status braid_split(braid_comm *c, uint32_t color, uint32_t key, braid_comm **out) {
  braid_status st = braid__enter(c, "braid_split");
  if (st) return st;
  if (!out) return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG, "out is NULL"));
  /* Its result is needed at once, which a queued call cannot give. */
  if (braid__group_open())
    return braid__leave(c, braid__fail(c, BRAID_ERR_INVALID_ARG,
                                       "called inside a group (braid_group_start); split after braid_group_end"));
  *out = NULL;
  uint32_t mine[2] = {color, key};
  uint32_t *all = malloc(sizeof(uint32_t) * 2 * (size_t)c->size);
  split_entry *ents = malloc(sizeof(split_entry) * (size_t)c->size);
  int *members = malloc(sizeof(int) * (size_t)c->size);
  if (!all || !ents || !members) {
    st = braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %d ranks' split entries", c->size);
    goto done;
  }
  /* A collective of its own kind, so a rank splitting while another
     all-gathers is a mismatch, not a silent exchange. */
  c->seq++;
  c->desc = braid__desc_make(BRAID__COLL_SPLIT, 2, BRAID_U32, 0);
  c->desc_hash = c->check ? braid__desc_hash(c->seq, &c->desc) : 0;
  if (c->check && c->ops->coll_start) c->ops->coll_start(c);
  if (c->ops->caps & BRAID__CAP_DEVICE_MEM)
    st = store_all_gather(c, mine, all);
  else if (c->ops->all_gather && c->algo[BRAID__COLL_ALL_GATHER] <= BRAID__ALGO_NATIVE)
    st = c->ops->all_gather(c, mine, all, 2, BRAID_U32);
  else
    st = braid__algo_all_gather(c, BRAID__ALGO_AUTO, mine, all, 2, BRAID_U32);
  c->prev_desc = c->desc;
  c->desc.kind = BRAID__COLL_NONE;
  if (st) goto done;
  uint32_t ordinal = ++c->nsplits;
  if (color == BRAID_SPLIT_NONE) goto done;
  int n = 0;
  for (int r = 0; r < c->size; r++)
    if (all[2 * r] == color) ents[n++] = (split_entry){color, all[2 * r + 1], r};
  qsort(ents, (size_t)n, sizeof *ents, split_cmp);
  int newrank = -1;
  for (int i = 0; i < n; i++) {
    members[i] = ents[i].rank;
    if (ents[i].rank == c->rank) newrank = i;
  }
  st = braid__comm_sub(c, c->ops, members, n, newrank, ordinal, color, 0, out);
  if (!st) BLOG_DEBUG(BRAID_SUB_INIT, c->rank, "split color %u key %u: rank %d of %d", color, key, newrank, n);
done:
  free(all);
  free(ents);
  free(members);
  return braid__leave(c, st);
}
