/* Broadcast from memory allocated with braid_mem_alloc. Any backend takes it
   like other memory; on the shm backend the other ranks copy the root's
   buffer in place instead of through shared staging space.
   Run: braidrun -n 4 ./example_broadcast_mem */
#include <braid.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                   \
  do {                                                                                \
    braid_status st_ = (call);                                                        \
    if (st_ != BRAID_OK) {                                                            \
      fprintf(stderr, "%s failed: %s\n", #call, braid_last_error(comm));             \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

int main(void) {
  braid_comm *comm = NULL;
  CHECK(braid_init(NULL, &comm));
  int rank = braid_rank(comm), size = braid_world_size(comm);

  enum { N = 4 << 20 }; /* 16 MiB of floats */
  float *w = NULL;
  CHECK(braid_mem_alloc((void **)&w, N * sizeof *w)); /* zero-filled, page-aligned */
  if (rank == 0)
    for (int i = 0; i < N; i++) w[i] = (float)(i % 1000);
  CHECK(braid_broadcast(comm, w, N, BRAID_F32, 0));
  CHECK(braid_sync(comm)); /* results may be read, and the buffer reused, after sync */

  int wrong = 0;
  for (int i = 0; i < N; i++) wrong += w[i] != (float)(i % 1000);
  printf("rank %d of %d (backend %s): broadcast of %d floats from braid memory, %d wrong\n", rank, size,
         braid_backend(comm), N, wrong);
  CHECK(braid_mem_free(w));
  CHECK(braid_destroy(comm));
  return wrong != 0;
}
