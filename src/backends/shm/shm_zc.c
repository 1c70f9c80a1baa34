/* Zero copy for the shm backend: a rank whose buffer lies in braid_mem_alloc
   memory announces it (allocation, address) for one operation, and peers
   read it in place through a read-only mapping of the owner's memfd instead
   of through staging space or process_vm_readv. Mappings are cached per
   peer; a peer's braid_mem_free count travels with each announcement, and a
   change drops the cached mappings of allocations it no longer names, so
   freed memory is not held for long. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backends/shm/shm.h"

static shm_zmap *zmaps_of(shm_state *s, int q) { return s->zmaps + (size_t)q * SHM_ZMAP_CAP; }

static void unmap_entry(shm_zmap *m) {
  if (m->local) munmap(m->local, (size_t)m->len);
  memset(m, 0, sizeof *m);
}

int shm_zc_announce(shm_state *s, const void *buf, size_t len, uint64_t key) {
  braid__mem_ref ref;
  if (!s->zc || !braid__mem_find(buf, len, &ref)) return 0;
  shm_zref *z = &shm_ctl_of(s, s->me)->zref;
  z->gen = ref.gen;
  z->base = ref.base;
  z->len = ref.len;
  z->epoch = ref.epoch;
  z->fd = ref.fd;
  z->addr = (uint64_t)(uintptr_t)buf;
  atomic_store_explicit(&z->key, key, memory_order_release);
  return 1;
}

/* A collective keeps the pointers it got for the whole call, across waits
   in which point-to-point progress maps more of the peer's memory: its
   mappings stay until it ends. */
static int held(const braid_comm *c, const shm_zmap *m) {
  return m->pin && m->pin == c->seq && c->desc.kind != BRAID__COLL_NONE;
}

braid_status shm_zc_map(braid_comm *c, shm_state *s, int q, const braid__mem_ref *ref, uint64_t addr, int hold,
                        const char **out) {
  shm_zmap *maps = zmaps_of(s, q);
  /* Free counts only grow; an older request's count (a receive taken
     late) must not drop what a newer call holds mapped. */
  if (ref->epoch > s->zepoch[q]) {
    /* The peer freed something since: keep only what it names now. */
    for (int i = 0; i < SHM_ZMAP_CAP; i++)
      if (maps[i].local && maps[i].gen != ref->gen && !held(c, &maps[i])) unmap_entry(&maps[i]);
    s->zepoch[q] = ref->epoch;
  }
  shm_zmap *hit = NULL, *victim = NULL;
  for (int i = 0; i < SHM_ZMAP_CAP; i++) {
    if (maps[i].local && maps[i].gen == ref->gen) hit = &maps[i];
    if (held(c, &maps[i])) continue;
    if (!victim || (victim->local && (!maps[i].local || maps[i].used < victim->used))) victim = &maps[i];
  }
  if (!hit) {
    /* A collective holds one or two buffers of a peer: never all the slots. */
    if (!victim)
      return braid__fail_comm(c, BRAID_ERR_INTERNAL, "all %d mappings of rank %d's braid memory are in use", SHM_ZMAP_CAP,
                              q);
    void *p = braid__mem_map_peer(s->pids[q], ref);
    if (!p) {
      int e = errno;
      /* Peers wait for this rank's part: the communicator fails for all. */
      return braid__fail_comm(c, BRAID_ERR_SYSTEM,
                         "could not map rank %d's (pid %d) braid_mem_alloc buffer of %llu bytes: %s", q,
                         (int)s->pids[q], (unsigned long long)ref->len, strerror(e));
    }
    unmap_entry(victim);
    victim->gen = ref->gen;
    victim->len = ref->len;
    victim->base = ref->base;
    victim->local = p;
    hit = victim;
  }
  hit->used = ++s->zclock;
  if (hold) hit->pin = c->seq;
  *out = hit->local + (addr - hit->base);
  return BRAID_OK;
}

braid_status shm_zc_peer(braid_comm *c, shm_state *s, int q, uint64_t key, const char **out) {
  *out = NULL;
  if (!s->zc) return BRAID_OK;
  shm_zref *z = &shm_ctl_of(s, q)->zref;
  if (atomic_load_explicit(&z->key, memory_order_acquire) != key) return BRAID_OK;
  braid__mem_ref ref = {z->gen, z->base, z->len, z->epoch, z->fd};
  return shm_zc_map(c, s, q, &ref, z->addr, 1, out);
}

int shm_zc_probe(shm_state *s, int q) {
  return braid__mem_probe_peer(s->pids[q], shm_ctl_of(s, q)->probe_fd);
}

void shm_zc_free(shm_state *s) {
  if (!s->zmaps) return;
  for (size_t i = 0; i < (size_t)s->n * SHM_ZMAP_CAP; i++) unmap_entry(&s->zmaps[i]);
}
