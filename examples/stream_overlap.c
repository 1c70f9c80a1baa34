/* Compute/communication overlap with CUDA events, as a GPU trainer would use it:
   record "gradient ready" on the compute stream, make the communication stream
   wait for it, all-reduce there, and make the compute stream wait for the
   result. On backends without a communication stream the hooks report
   BRAID_ERR_UNSUPPORTED and the program falls back to braid_sync. This one
   runs on any backend with host memory; examples/nccl_overlap.c is the same
   on a GPU with device memory and real streams. */
#include <braid.h>
#include <stdio.h>

int main(void) {
  braid_comm *comm = NULL;
  if (braid_init(NULL, &comm) != BRAID_OK) {
    fprintf(stderr, "braid_init: %s\n", braid_last_error(NULL));
    return 1;
  }
  float grad[256] = {0};
  uint64_t compute_stream = 0; /* a cudaStream_t in a real program; 0 = legacy default stream */
  if (braid_has_stream_sync(comm)) {
    uint64_t ready, done;
    braid_event_create(comm, &ready);
    braid_event_create(comm, &done);
    braid_event_record_on_stream(comm, ready, compute_stream);
    braid_comm_stream_wait_event(comm, ready);
    braid_all_reduce(comm, grad, 256, BRAID_F32, BRAID_AVG); /* device memory on GPU backends */
    braid_event_record_on_comm_stream(comm, done);
    braid_stream_wait_event(comm, compute_stream, done);
    braid_sync_comm_stream(comm);
    braid_event_destroy(comm, ready);
    braid_event_destroy(comm, done);
    printf("overlapped on the %s communication stream\n", braid_backend(comm));
  } else {
    braid_all_reduce(comm, grad, 256, BRAID_F32, BRAID_AVG);
    braid_sync(comm);
    printf("backend %s has no communication stream: synchronous all-reduce\n", braid_backend(comm));
  }
  braid_destroy(comm);
  return 0;
}
