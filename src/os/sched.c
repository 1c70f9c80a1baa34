#include "os/sched.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

int braid__parse_schedstat(const char *text, uint64_t *ns) {
  const char *p = text;
  for (int field = 0; field < 2; field++) {
    while (*p == ' ') p++;
    if (!isdigit((unsigned char)*p)) return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno || (*end != ' ' && *end != '\n' && *end != 0)) return -1;
    if (field == 1) *ns = (uint64_t)v;
    p = end;
  }
  return 0;
}

int braid__run_delay_ns(uint64_t *ns) {
  int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[128];
  ssize_t n;
  do n = read(fd, buf, sizeof buf - 1);
  while (n < 0 && errno == EINTR);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = 0;
  return braid__parse_schedstat(buf, ns);
}
