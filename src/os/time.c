#include "os/time.h"

#include <errno.h>
#include <time.h>

double braid__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double braid__deadline(double timeout_s) {
  if (timeout_s <= 0) return INFINITY;
  return braid__now() + timeout_s;
}

void braid__sleep(double s) {
  if (s <= 0) return;
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
