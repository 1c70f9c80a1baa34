/* Point-to-point bodies shared by the backend tests. */
#ifndef BRAID_TEST_P2P_CHECK_H
#define BRAID_TEST_P2P_CHECK_H

#include <stddef.h>

#include "harness.h"

typedef struct bt_p2p_mismatch_arg {
  size_t count;    /* f64 elements of the messages */
  size_t sync_max; /* rank 0 syncs after its first sends only when they are at most this many bytes (larger
                      sends of a rendezvous protocol complete when received) */
} bt_p2p_mismatch_arg;

/* Two ranks: a receive of the wrong shape fails (at once when the message
   is already here, at braid_sync when it is posted first), the message
   stays for a receive of the right shape, and the sentence names both
   sizes. */
int bt_body_p2p_mismatch(braid_comm *c, int rank, int n, void *arg);

#endif
