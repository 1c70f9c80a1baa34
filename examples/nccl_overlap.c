/* Gradient all-reduce overlapped with compute on a GPU (backend nccl), as a
   data-parallel trainer does it: the compute stream records "gradient
   ready", the communication stream waits for that event, all-reduces, and
   the compute stream waits for the result before it reads it. The host
   never blocks until it wants the numbers.

     braidrun -n 2 --backend nccl ./example_nccl_overlap

   Built when CMake finds the CUDA toolkit; each rank uses the GPU of its
   local rank (BRAID_CUDA_DEVICE overrides). */
#include <braid.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define N (1 << 20)

int main(void) {
  braid_comm *comm = NULL;
  if (braid_init(NULL, &comm) != BRAID_OK) {
    fprintf(stderr, "braid_init: %s\n", braid_last_error(NULL));
    return 1;
  }
  int rank = braid_rank(comm), size = braid_world_size(comm);
  float *grad = NULL, *host = malloc(N * sizeof(float));
  cudaStream_t compute;
  uint64_t ready = 0, reduced = 0;
  int bad = 0;
  /* braid_init made the rank's device current; ncclMemAlloc memory on it. */
  if (!host || braid_comm_mem_alloc(comm, (void **)&grad, N * sizeof(float)) != BRAID_OK ||
      cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) != cudaSuccess ||
      braid_event_create(comm, &ready) != BRAID_OK || braid_event_create(comm, &reduced) != BRAID_OK) {
    fprintf(stderr, "rank %d: setup failed: %s\n", rank, braid_last_error(comm));
    return 1;
  }
  for (int i = 0; i < N; i++) host[i] = (float)(rank + 1);
  /* "Backward pass": the gradient is written on the compute stream. */
  cudaMemcpyAsync(grad, host, N * sizeof(float), cudaMemcpyHostToDevice, compute);
  braid_event_record_on_stream(comm, ready, (uint64_t)(uintptr_t)compute);
  braid_comm_stream_wait_event(comm, ready);           /* communication waits for the gradient */
  braid_all_reduce(comm, grad, N, BRAID_F32, BRAID_AVG); /* enqueued; returns at once */
  braid_event_record_on_comm_stream(comm, reduced);
  braid_stream_wait_event(comm, (uint64_t)(uintptr_t)compute, reduced); /* "optimizer step" waits */
  cudaMemcpyAsync(host, grad, N * sizeof(float), cudaMemcpyDeviceToHost, compute);
  cudaStreamSynchronize(compute);
  if (braid_sync(comm) != BRAID_OK) { /* errors of the enqueued work surface here */
    fprintf(stderr, "rank %d: %s\n", rank, braid_last_error(comm));
    return 1;
  }
  const float want = (float)(size + 1) / 2;
  for (int i = 0; i < N; i++) bad += host[i] != want;
  printf("rank %d: averaged gradient %g (%s)\n", rank, host[0], bad ? "WRONG" : "ok");
  braid_event_destroy(comm, ready);
  braid_event_destroy(comm, reduced);
  braid_comm_mem_free(comm, grad);
  cudaStreamDestroy(compute);
  free(host);
  braid_destroy(comm);
  return bad != 0;
}
