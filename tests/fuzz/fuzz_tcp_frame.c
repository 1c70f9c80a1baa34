/* libFuzzer target: bytes of one socket's stream into the tcp backend's
   frame decoder, validation and payload decoders (no sockets). See
   README.md and tcp_frame_driver.h. */
#include <stddef.h>
#include <stdint.h>

#include "tcp_frame_driver.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tfd_result res;
  tcp_frame_run(data, size, &res);
  return 0;
}
