/* Pass a token around the ring with tagged send/recv: every rank sends to its
   right neighbour and receives from its left one, then syncs. Symmetric
   exchanges never deadlock because send and recv are non-blocking. */
#include <braid.h>
#include <stdint.h>
#include <stdio.h>

int main(void) {
  braid_comm *comm = NULL;
  if (braid_init(NULL, &comm) != BRAID_OK) {
    fprintf(stderr, "braid_init: %s\n", braid_last_error(NULL));
    return 1;
  }
  int rank = braid_rank(comm), size = braid_world_size(comm);
  int right = (rank + 1) % size, left = (rank + size - 1) % size;
  int64_t out = 1000 + rank, in = -1;
  const uint32_t tag = 7;
  if (braid_send(comm, &out, 1, BRAID_I64, right, tag) || braid_recv(comm, &in, 1, BRAID_I64, left, tag) ||
      braid_sync(comm)) {
    fprintf(stderr, "ring: %s\n", braid_last_error(comm));
    return 1;
  }
  printf("rank %d received %lld from rank %d\n", rank, (long long)in, left);
  braid_destroy(comm);
  return in != 1000 + left;
}
