#ifndef BRAID_OS_SCHED_H
#define BRAID_OS_SCHED_H

#include <stdint.h>

/* The calling thread's run delay: nanoseconds it has spent runnable but
   waiting for a CPU (the second field of /proc/thread-self/schedstat).
   0 on success, -1 where the kernel does not say. */
int braid__run_delay_ns(uint64_t *ns);
/* Parses the text of a schedstat file ("<on-CPU ns> <run delay ns>
   <slices>"): 0 and *ns set, or -1. */
int braid__parse_schedstat(const char *text, uint64_t *ns);

#endif
