/* All-reduce a vector on every rank and check the result.
   Run: braidrun -n 4 ./example_allreduce   (or ./example_allreduce alone: one rank) */
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
  CHECK(braid_init(NULL, &comm)); /* rank, size and backend come from the launcher */
  int rank = braid_rank(comm), size = braid_world_size(comm);

  enum { N = 1000 };
  float *x = malloc(N * sizeof *x);
  for (int i = 0; i < N; i++) x[i] = (float)(rank + i);
  CHECK(braid_all_reduce(comm, x, N, BRAID_F32, BRAID_SUM));
  CHECK(braid_sync(comm)); /* portable code syncs before reading results */

  /* sum over ranks of (r + i) = size*i + size*(size-1)/2 */
  int wrong = 0;
  for (int i = 0; i < N; i++) wrong += x[i] != (float)size * (float)i + (float)(size * (size - 1) / 2);
  printf("rank %d of %d (backend %s): all-reduce of %d floats, %d wrong\n", rank, size, braid_backend(comm), N,
         wrong);
  free(x);
  CHECK(braid_destroy(comm));
  return wrong != 0;
}
