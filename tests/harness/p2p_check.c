/* Point-to-point bodies shared by the backend tests. */
#include "p2p_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int bt_body_p2p_mismatch(braid_comm *c, int rank, int n, void *arg) {
  (void)n;
  const bt_p2p_mismatch_arg *a = arg;
  size_t base = a->count;
  double *s = malloc((base + 1) * 8), *r = calloc(base + 1, 8);
  BT_CHECK(s && r, "oom");
  for (size_t i = 0; i <= base; i++) s[i] = (double)i + 0.5;
  int go = 1;
  if (rank == 0) {
    /* Messages of one pair arrive in order: when "go" arrives, so has tag 5. */
    BT_CHECK_OK(braid_send(c, s, base, BRAID_F64, 1, 5), c);
    BT_CHECK_OK(braid_send(c, &go, 1, BRAID_I32, 1, 9), c);
    if (base * 8 <= a->sync_max) BT_CHECK_OK(braid_sync(c), c);
    /* Sent only once rank 1 has posted its receive. */
    BT_CHECK_OK(braid_recv(c, &go, 1, BRAID_I32, 1, 8), c);
    BT_CHECK_OK(braid_sync(c), c);
    BT_CHECK_OK(braid_send(c, s, base, BRAID_F64, 1, 6), c);
    BT_CHECK_OK(braid_send(c, s, base, BRAID_F64, 1, 7), c);
    BT_CHECK_OK(braid_sync(c), c);
  } else {
    BT_CHECK_OK(braid_recv(c, &go, 1, BRAID_I32, 0, 9), c);
    BT_CHECK_OK(braid_sync(c), c);
    /* Arrived before the receive: the receive fails at once, the message stays. */
    BT_CHECK_ST(braid_recv(c, r, base - 1, BRAID_F64, 0, 5), BRAID_ERR_MISMATCH, c);
    char want[200];
    snprintf(want, sizeof want,
             "message from rank 0 with tag 5 has %zu elements of f64 (%zu bytes) but the receive expects %zu "
             "elements of f64 (%zu bytes)",
             base, base * 8, base - 1, (base - 1) * 8);
    BT_CHECK_MSG(c, want);
    BT_CHECK_OK(braid_recv(c, r, base, BRAID_F64, 0, 5), c);
    BT_CHECK_OK(braid_sync(c), c);
    for (size_t i = 0; i < base; i++) BT_CHECK(r[i] == s[i], "tag 5 element %zu", i);
    /* Posted before the messages: the sync that would complete them fails,
       and names both (the second is not lost behind the first). */
    double *r7 = calloc(base + 1, 8);
    BT_CHECK(r7, "oom");
    BT_CHECK_OK(braid_recv(c, r, base + 1, BRAID_F64, 0, 6), c);
    BT_CHECK_OK(braid_recv(c, r7, base + 1, BRAID_F64, 0, 7), c);
    BT_CHECK_OK(braid_send(c, &go, 1, BRAID_I32, 0, 8), c);
    BT_CHECK_ST(braid_sync(c), BRAID_ERR_MISMATCH, c);
    BT_CHECK_MSG(c, "with tag 6 has");
    BT_CHECK_MSG(c, "; and 1 more receive(s) failed the same way, the last: ");
    BT_CHECK_MSG(c, "with tag 7 has");
    memset(r, 0, (base + 1) * 8);
    BT_CHECK_OK(braid_recv(c, r, base, BRAID_F64, 0, 6), c);
    BT_CHECK_OK(braid_recv(c, r7, base, BRAID_F64, 0, 7), c);
    BT_CHECK_OK(braid_sync(c), c);
    for (size_t i = 0; i < base; i++) BT_CHECK(r[i] == s[i] && r7[i] == s[i], "tags 6 and 7 element %zu", i);
    free(r7);
  }
  BT_CHECK_OK(braid_barrier(c), c);
  free(s);
  free(r);
  return 0;
}
