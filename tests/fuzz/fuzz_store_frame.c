/* libFuzzer target: client bytes into the store server's frame parser and
   connection state machine (no sockets). See README.md. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "store_frame_driver.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  /* Dropped connections log a warning each; keep the fuzzer's output readable. */
  setenv("BRAID_LOG", "error", 1);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  sfd_result res;
  store_frame_run(data, size, &res);
  return 0;
}
