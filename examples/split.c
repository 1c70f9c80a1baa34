/* Split the world into even and odd ranks and all-reduce within each half,
   interleaved with a world all-reduce. */
#include <braid.h>
#include <stdio.h>

int main(void) {
  braid_comm *world = NULL, *half = NULL;
  if (braid_init(NULL, &world) != BRAID_OK) {
    fprintf(stderr, "braid_init: %s\n", braid_last_error(NULL));
    return 1;
  }
  int rank = braid_rank(world);
  /* Same color -> same communicator; key orders the ranks inside it. */
  if (braid_split(world, (uint32_t)(rank % 2), (uint32_t)rank, &half) != BRAID_OK) {
    fprintf(stderr, "braid_split: %s\n", braid_last_error(world));
    return 1;
  }
  int mine = rank, all = rank;
  braid_all_reduce(half, &mine, 1, BRAID_I32, BRAID_SUM);
  braid_all_reduce(world, &all, 1, BRAID_I32, BRAID_SUM);
  braid_sync(half);
  braid_sync(world);
  printf("world rank %d -> %s rank %d of %d: half sum %d, world sum %d\n", rank, rank % 2 ? "odd" : "even",
         braid_rank(half), braid_world_size(half), mine, all);
  braid_destroy(half);
  braid_destroy(world);
  return 0;
}
