/* Statuses inside braid: composing the sentence that goes with one. */
#ifndef BRAID_STATUS_H
#define BRAID_STATUS_H

#include <stddef.h>

#include "braid.h"

/* Writes one sentence into err (when err and errlen are set) and returns st. */
braid_status braid__errf(braid_status st, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
