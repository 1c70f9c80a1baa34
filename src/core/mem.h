/* braid_mem_alloc memory: a registry of this process's allocations (each its
   own memfd, so other processes of the host can map it) and the helpers a
   peer uses to map one. */
#ifndef BRAID_MEM_H
#define BRAID_MEM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* What a peer needs to map an allocation of this process. */
typedef struct braid__mem_ref {
  uint64_t gen;   /* allocation number in the owning process, from 1 */
  uint64_t base;  /* the owner's address of the allocation */
  uint64_t len;   /* bytes mapped */
  uint64_t epoch; /* braid_mem_free calls in the owner so far */
  int32_t fd;     /* the allocation's memfd in the owner */
} braid__mem_ref;

/* 1 and *out filled when [p, p + len) lies inside one braid_mem_alloc
   allocation that other processes can map; else 0. Cheap when the process
   has no such allocation. */
int braid__mem_find(const void *p, size_t len, braid__mem_ref *out);

/* A one-page memfd this process keeps open, holding braid__mem_probe_value()
   at offset 0, by which peers test whether they may map its memory; -1 when
   memfds are unavailable. */
int braid__mem_probe_fd(void);
uint64_t braid__mem_probe_value(void);

/* Maps read-only the whole allocation ref of process pid (through
   /proc/<pid>/fd, which needs the same permission as reading its memory),
   after checking that the descriptor still names that allocation. NULL with
   errno set on failure. Unmap with munmap(p, ref->len). */
void *braid__mem_map_peer(pid_t pid, const braid__mem_ref *ref);

/* 1 when this process can map pid's probe page and reads the probe value. */
int braid__mem_probe_peer(pid_t pid, int fd);

#endif
