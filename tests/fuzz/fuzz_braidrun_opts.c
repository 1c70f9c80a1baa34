/*
 * libFuzzer target: braidrun's command line (braidrun_parse_opts, with the
 * --master HOST:PORT parser). See README.md.
 *
 * Input: the arguments after "braidrun", separated by 0x00 bytes (at most
 * 64; an empty input gives none). Checked: a success leaves options in
 * their ranges and a PROGRAM to run; a usage error leaves a sentence.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "braidrun_opts.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ARGS 64

/* A broken rule names itself before the crash libFuzzer records. */
static void fail(const char *what, int line) {
  fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, line, what);
  abort();
}
#define check(cond) ((cond) ? (void)0 : fail(#cond, __LINE__))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *buf = malloc(size + 1);
  if (!buf) return 0;
  memcpy(buf, data, size);
  buf[size] = 0;
  char *argv[MAX_ARGS + 2];
  int argc = 0;
  argv[argc++] = "braidrun";
  for (size_t i = 0; size && i <= size && argc <= MAX_ARGS;) {
    argv[argc++] = buf + i;
    i += strlen(buf + i) + 1;
  }
  argv[argc] = NULL;
  braidrun_opts o;
  char err[512];
  int r = braidrun_parse_opts(argc, argv, &o, err, sizeof err);
  check(memchr(err, 0, sizeof err) != NULL);
  if (r == BRAIDRUN_OPTS_USAGE) {
    check(err[0] != 0);
  } else if (r == BRAIDRUN_OPTS_OK) {
    check(o.argv && o.argv[0] && o.argv >= argv + 1 && o.argv < argv + argc);
    check(o.nproc >= 1 && o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes);
    check((long)o.nproc * o.nnodes <= (1 << 24));
    check(o.port >= -1 && o.port <= 65535 && o.master_port >= 0 && o.master_port <= 65535);
    check(!(o.master && o.port >= 0));
    check(o.nnodes == 1 || o.master);
    check(isfinite(o.timeout) && o.timeout >= 0 && isfinite(o.grace) && o.grace >= 0);
    check(memchr(o.master_host, 0, sizeof o.master_host) && o.master_host[0]);
    if (o.master) check(o.master_port >= 1);
  } else {
    check(r == BRAIDRUN_OPTS_HELP);
  }
  free(buf);
  return 0;
}
