/* Which node a process runs on (backends/backends.h). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backends/backends.h"
#include "core/params.h"

/* This rank's node: BRAID_NODE_ID, else the host name and the boot id (two
   containers of one host name on different machines differ by boot id). */
void braid__node_key(char *out, size_t len) {
  const char *id = braid__param_str(BRAID_P_NODE_ID);
  if (id) {
    snprintf(out, len, "id:%s", id);
    return;
  }
  char host[256] = "?", boot[64] = "";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = 0;
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
    fclose(f);
    boot[strcspn(boot, "\n")] = 0;
  }
  snprintf(out, len, "host:%s/%s", host, boot);
}

