#ifndef BRAID_OS_TIME_H
#define BRAID_OS_TIME_H

#include <math.h>

/* Monotonic seconds. */
double braid__now(void);
/* Absolute monotonic deadline `timeout_s` from now; timeout 0 (wait forever) gives INFINITY. */
double braid__deadline(double timeout_s);
/* Sleeps for s seconds (restarted on EINTR). */
void braid__sleep(double s);

#endif
