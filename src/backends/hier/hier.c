/* Backend "hier": nodes, sub-communicators, the waiting and failure hooks,
   and the table (see hier.h and docs/HIER.md). */
#include "backends/hier/hier.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/backends.h"
#include "bootstrap/bootstrap.h"
#include "core/params.h"
#include "core/subcomm.h"
#include "core/wait.h"
#include "os/time.h"

/* ---------------------------------------------------------------- nodes */

static void state_free(hier_state *s) {
  if (!s) return;
  free(s->node_of);
  free(s->local_of);
  free(s->rank_at);
  free(s->node_size);
  free(s->stage); /* after the node part: its stream may read it until then */
  free(s);
}

/* Every rank's node through the store: each sets its key, waits for all,
   reads them. Nodes are numbered by their lowest rank, local ranks by rank. */
static braid_status map_nodes(braid_comm *c, hier_state *s) {
  braid__store *st = c->boot->store;
  int n = c->size;
  char key[64], mine[440];
  /* The node's key, then this rank's piece size: every rank takes rank
     0's, as the pieces of a stage are calls all its ranks must make. */
  braid__node_key(mine, 400);
  snprintf(mine + strlen(mine), sizeof mine - strlen(mine), "\t%zu", s->piece);
  snprintf(key, sizeof key, "hier/node/%d", c->rank);
  /* One rank needs no store: it is its own node. */
  if (n > 1 && braid__store_set(st, key, mine, strlen(mine)))
    return braid__fail(c, BRAID_ERR_BOOTSTRAP, "could not publish this rank's node: %s", braid__store_error(st));
  char **keys = calloc((size_t)n, sizeof *keys);
  char(*names)[32] = calloc((size_t)n, sizeof *names);
  s->node_of = calloc((size_t)n, sizeof *s->node_of);
  s->local_of = calloc((size_t)n, sizeof *s->local_of);
  s->node_size = calloc((size_t)n, sizeof *s->node_size);
  braid_status rc = BRAID_OK;
  if (!keys || !names || !s->node_of || !s->local_of || !s->node_size) {
    rc = braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %d ranks' nodes", n);
    goto done;
  }
  double deadline = braid__deadline(c->boot ? c->boot->init_timeout_s : 0);
  for (int r = 0; r < n && !rc; r++) {
    snprintf(names[r], sizeof names[r], "hier/node/%d", r);
    void *v = NULL;
    size_t len = 0;
    if (n == 1) {
      len = strlen(mine);
      v = malloc(len + 1);
      if (!v) {
        rc = braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for this rank's node");
        break;
      }
      memcpy(v, mine, len + 1);
    } else {
      /* Short waits, between them a look for ranks that died while starting. */
      braid_status gs;
      while ((gs = braid__store_get(st, names[r], &v, &len, fmin(deadline, braid__now() + 0.1))) ==
                 BRAID_ERR_TIMEOUT &&
             braid__now() < deadline)
        if ((rc = braid__start_check(c, "the start of a communicator, while the ranks learnt their nodes"))) break;
      if (rc) break;
      if (gs) {
        rc = braid__fail(c, BRAID_ERR_BOOTSTRAP, "could not learn rank %d's node: %s", r, braid__store_error(st));
        break;
      }
    }
    keys[r] = malloc(len + 1);
    if (keys[r]) {
      memcpy(keys[r], v, len);
      keys[r][len] = 0;
      char *tab = strrchr(keys[r], '\t');
      if (tab) *tab++ = 0;
      if (r == 0 && tab) s->piece = (size_t)strtoull(tab, NULL, 10);
    }
    free(v);
    if (!keys[r]) rc = braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for rank %d's node", r);
  }
  if (rc) goto done;
  s->nnodes = 0;
  for (int r = 0; r < n; r++) {
    int j = -1;
    for (int q = 0; q < r && j < 0; q++)
      if (!strcmp(keys[q], keys[r])) j = s->node_of[q];
    if (j < 0) j = s->nnodes++;
    s->node_of[r] = j;
    s->local_of[r] = s->node_size[j]++;
  }
  s->node = s->node_of[c->rank];
  s->lrank = s->local_of[c->rank];
  s->lsize = s->node_size[s->node];
  s->lmin = n;
  s->uniform = 1;
  for (int j = 0; j < s->nnodes; j++) {
    if (s->node_size[j] < s->lmin) s->lmin = s->node_size[j];
    if (s->node_size[j] != s->lsize) s->uniform = 0;
  }
  if (s->uniform) {
    s->rank_at = malloc(sizeof *s->rank_at * (size_t)n);
    if (!s->rank_at) {
      rc = braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %d ranks' places", n);
      goto done;
    }
    for (int r = 0; r < n; r++) s->rank_at[s->node_of[r] * s->lsize + s->local_of[r]] = r;
  }
done:
  for (int r = 0; keys && r < n; r++) free(keys[r]);
  free(keys);
  free(names);
  return rc;
}

/* ---------------------------------------------------------------- sub-communicators */

/* The node part may keep buffers in device memory (nccl); between nodes
   hier moves host memory. */
static const braid__backend *part_backend(braid_comm *c, braid__param_id id, const char *what, braid_status *st) {
  const char *name = braid__param_str(id);
  const braid__backend *b = NULL;
  int node = id == BRAID_P_HIER_INTRA;
  if (name && !strcmp(name, "shm")) b = &braid__shm_backend;
#if BRAID_WITH_TCP
  if (name && !strcmp(name, "tcp")) b = &braid__tcp_backend;
#endif
#if BRAID_WITH_NCCL
  if (node && name && !strcmp(name, "nccl")) b = &braid__nccl_backend;
#endif
  *st = BRAID_OK;
  if (!b)
    *st = braid__fail(c, BRAID_ERR_INVALID_ARG, "%s=\"%s\" is not a backend hier can use for %s (%s)",
                      braid__param_name(id), name ? name : "", what,
                      node && BRAID_WITH_NCCL ? "shm, tcp, nccl" : "shm, tcp");
  return b;
}

/* Builds a part over members (parent ranks, in order), this rank being
   member `me`: hier progresses it itself (it leaves the live list), and its
   messages name the hier ranks. */
/* A part waiting in its own call moves the other parts' pending work:
   a send a peer needs before it joins this call may sit in another part.
   Only hier's thread uses the parts (under hier's lock); trylock skips a
   part whose own call is on the stack. */
static int progress_siblings(braid_comm *self) {
  hier_state *s = self->owner ? self->owner->be : NULL;
  if (!s) return 0;
  braid_comm *parts[3] = {s->intra, s->rail, s->flat};
  int busy = 0;
  for (int i = 0; i < 3; i++) {
    braid_comm *p = parts[i];
    if (!p || p == self || !p->npending || atomic_load(&p->failed)) continue;
    if (pthread_mutex_trylock(&p->lock) != 0) continue;
    if (!p->ops->progress(p) && p->npending) busy++;
    pthread_mutex_unlock(&p->lock);
  }
  return busy;
}

static braid_status make_part(braid_comm *c, const braid__backend *b, int *members, int n, int me, uint32_t color,
                              braid_comm **out) {
  uint32_t ordinal = ++c->nsplits;
  braid_status st = braid__comm_sub(c, b, members, n, me, ordinal, color, BRAID__SUB_LABEL, out);
  if (st) return st;
  braid__live_remove(*out);
  (*out)->owner = c;
  (*out)->progress_siblings = progress_siblings;
  return BRAID_OK;
}

static braid_status make_parts(braid_comm *c, hier_state *s) {
  braid_status st;
  const braid__backend *intra = part_backend(c, BRAID_P_HIER_INTRA, "ranks of one node", &st);
  if (st) return st;
  const braid__backend *inter = part_backend(c, BRAID_P_HIER_INTER, "ranks on different nodes", &st);
  if (st) return st;
  int n = c->size, *m = malloc(sizeof *m * (size_t)n);
  if (!m) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for %d ranks", n);
  int k = 0;
  for (int r = 0; r < n; r++)
    if (s->node_of[r] == s->node) m[k++] = r;
  st = make_part(c, intra, m, k, s->lrank, (uint32_t)s->node, &s->intra);
  if (!st && s->nnodes > 1) {
    /* The rail of local rank l: the rank with local rank l on every node
       that has one, in node order. */
    int me = -1;
    k = 0;
    for (int j = 0; j < s->nnodes; j++)
      for (int r = 0; r < n; r++)
        if (s->node_of[r] == j && s->local_of[r] == s->lrank) {
          if (r == c->rank) me = k;
          m[k++] = r;
        }
    st = make_part(c, inter, m, k, me, (uint32_t)s->lrank, &s->rail);
    if (!st && s->lrank == 0) s->rail0 = s->rail;
  }
  if (!st && s->nnodes > 1) {
    for (int r = 0; r < n; r++) m[r] = r;
    st = make_part(c, inter, m, n, c->rank, 0xffffffffu, &s->flat);
  }
  free(m);
  return st;
}

/* Each part leaves the state before its release, whose waits move the
   parts still there. The parts share one timeout: after hier's own drain
   they have as long again between them, as a tcp communicator has to
   finish the frame it was writing. */
static void free_parts(hier_state *s, double timeout_s) {
  braid_comm **slots[3] = {&s->flat, &s->rail, &s->intra};
  const double deadline = braid__now() + timeout_s;
  s->rail0 = NULL;
  for (int i = 0; i < 3; i++) {
    braid_comm *p = *slots[i];
    *slots[i] = NULL;
    const double left = deadline - braid__now();
    if (p) braid__comm_release(p, left > 0 ? left : 0);
  }
}

braid_status hier_init(braid_comm *c) {
  if (c->size > 1 && (!c->boot || !c->boot->store))
    return braid__fail(c, BRAID_ERR_BOOTSTRAP, "backend hier needs the rendezvous store (BRAID_STORE or braidrun)");
  hier_state *s = calloc(1, sizeof *s);
  if (!s) return braid__fail(c, BRAID_ERR_NO_MEMORY, "out of memory for the hier backend");
  char err[256];
  braid_status st = braid__param_size(BRAID_P_HIER_PIECE, 0, (size_t)1 << 40, &s->piece, err, sizeof err);
  if (st && c->rank == 0) {
    free(s);
    return braid__fail(c, BRAID_ERR_INVALID_ARG, "%s", err);
  }
  if (st) /* only rank 0's value is used */
    BLOG_WARN(BRAID_SUB_INIT, c->rank, "%s (ignored: rank 0's value counts)", err);
  st = map_nodes(c, s);
  if (!st) st = make_parts(c, s);
  if (!st && (s->intra->ops->caps & BRAID__CAP_DEVICE_MEM)) {
    /* Device buffers: the table that stages them through the host. */
    s->dev = 1;
    c->ops = &braid__hier_dev_backend;
  }
  if (st) {
    free_parts(s, 0);
    state_free(s);
    return st;
  }
  c->be = s;
  /* Waits at this level (routed point-to-point) poll the parts: a short
     spin, then short sleeps (hier_sleep). */
  c->spin_limit = 256;
  c->yield_s = 1e-3;
  BLOG_INFO(BRAID_SUB_INIT, c->rank,
            "hier: %d node(s), this rank is local rank %d of %d on node %d (%s); inside a node %s, between nodes %s",
            s->nnodes, s->lrank, s->lsize, s->node, s->uniform ? "every node alike" : "nodes of different sizes",
            s->intra->ops->name, s->flat ? s->flat->ops->name : "-");
  return BRAID_OK;
}

/* A child inside one node is a plain communicator of the node backend; one
   that spans nodes is hier again. */
braid_status hier_split(braid_comm *parent, braid_comm *child, const int *members, int n) {
  hier_state *ps = parent->be;
  int one_node = 1;
  for (int i = 1; i < n; i++) one_node &= ps->node_of[members[i]] == ps->node_of[members[0]];
  if (!one_node) return hier_init(child);
  braid_status st;
  const braid__backend *intra = part_backend(child, BRAID_P_HIER_INTRA, "ranks of one node", &st);
  if (st) return st;
  child->ops = intra;
  return intra->init(child);
}

void hier_destroy(braid_comm *c, double timeout_s) {
  hier_state *s = c->be;
  if (!s) return;
  if (s->dev) hier_dev_free(c);
  /* A failed hier leaves its parts' unfinished requests behind, naming
     buffers its calls no longer own: the parts fail too, so their release
     abandons that work instead of sending from those buffers. */
  int failed = atomic_load(&c->failed);
  braid_comm *parts[3] = {s->flat, s->rail, s->intra};
  for (int i = 0; i < 3 && failed; i++) {
    int healthy = 0;
    if (parts[i]) atomic_compare_exchange_strong(&parts[i]->failed, &healthy, failed);
  }
  hier_p2p_let_go(c);
  free_parts(s, timeout_s);
  /* After the parts: their last sends may read staged host copies. */
  hier_p2p_free(c);
  state_free(s);
  c->be = NULL;
}

void hier_abort(braid_comm *c) {
  hier_state *s = c->be;
  if (!s) return;
  braid_comm *parts[3] = {s->intra, s->rail, s->flat};
  for (int i = 0; i < 3; i++)
    if (parts[i]) braid_abort(parts[i]);
}

/* ---------------------------------------------------------------- waiting and failures */

int hier_arm(braid_comm *c) {
  (void)c;
  return 1;
}

/* Sleeps briefly: the parts' own wake-ups (a futex, an epoll set) cannot be
   waited for together, so the wait polls them between short naps. */
void hier_sleep(braid_comm *c, double slice_s) {
  hier_progress(c);
  double nap = slice_s < 200e-6 ? slice_s : 200e-6;
  if (nap > 0) braid__sleep(nap);
}

void hier_disarm(braid_comm *c) { (void)c; }

braid_status hier_check_peers(braid_comm *c, int peer, const char *what) {
  (void)peer;
  hier_state *s = c->be;
  braid_comm *parts[2] = {s->intra, s->flat};
  for (int i = 0; i < 2; i++) {
    braid_comm *p = parts[i];
    if (!p) continue;
    pthread_mutex_lock(&p->lock);
    braid_status st = atomic_load(&p->failed) ? (braid_status)atomic_load(&p->failed)
                                              : p->ops->check_peers(p, -1, what);
    pthread_mutex_unlock(&p->lock);
    if (st) return hier_sub_failed(c, p, st);
  }
  return BRAID_OK;
}

/* A failure another rank published in a part, in hier's rank numbers. */
int hier_remote_failure(braid_comm *c, braid_status *st, int *origin, char *text, size_t len) {
  hier_state *s = c->be;
  braid_comm *parts[3] = {s->intra, s->rail, s->flat};
  for (int i = 0; i < 3; i++) {
    braid_comm *p = parts[i];
    if (!p || !p->ops->remote_failure || !p->be) continue;
    int o;
    if (p->ops->remote_failure(p, st, &o, text, len)) {
      *origin = braid__label(p, o);
      return 1;
    }
  }
  return 0;
}

/* This rank's failure goes out through every part's channel, so ranks
   blocked in a part's call (on this node or another) stop at once, and
   each part fails with it. A rank that reaches this one only through a part
   it has not heard on (not yet connected, or a node-mate of a rank that
   heard it) finds it in hier's place in the store, which every part's
   wait reads too (braid__poll_remote_failure). */
void hier_publish_failure(braid_comm *c, braid_status st, const char *text) {
  hier_state *s = c->be;
  braid_comm *parts[3] = {s->intra, s->rail, s->flat};
  for (int i = 0; i < 3; i++) {
    braid_comm *p = parts[i];
    if (!p || !p->be) continue;
    braid__fail_as(p, st, text);
    p->fail_published = 1;
    if (p->ops->publish_failure) p->ops->publish_failure(p, st, text);
  }
}

const braid__backend braid__hier_backend = {
    .name = "hier",
    .caps = BRAID__CAP_NEEDS_STORE,
    .dtypes = BRAID__ALL_DTYPES,
    HIER_SHARED_OPS,
    .barrier = hier_barrier,
    .all_reduce = hier_all_reduce,
    .broadcast = hier_broadcast,
    .all_gather = hier_all_gather,
    .reduce_scatter = hier_reduce_scatter,
    .stream = NULL,
};
