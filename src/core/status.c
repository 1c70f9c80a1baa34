#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>

#include "core/status_list.h"

#define BRAID_STATUS_STR(code, text) [code] = text,
static const char *const status_text[] = {BRAID_STATUS_LIST(BRAID_STATUS_STR)};

const char *braid_status_string(braid_status st) {
  if ((unsigned)st >= sizeof(status_text) / sizeof(status_text[0]) || !status_text[st])
    return "unknown status";
  return status_text[st];
}

const char *braid_version(void) {
#define BRAID_STR2(x) #x
#define BRAID_STR(x) BRAID_STR2(x)
  return BRAID_STR(BRAID_VERSION_MAJOR) "." BRAID_STR(BRAID_VERSION_MINOR) "." BRAID_STR(BRAID_VERSION_PATCH);
}

braid_status braid__errf(braid_status st, char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return st;
}
