/*
 * braidrun's command line: options and the --master address, parsed without
 * printing or exiting, so the launcher, its tests and a fuzz target
 * (tests/fuzz/fuzz_braidrun_opts.c) share one parser.
 */
#ifndef BRAID_BRAIDRUN_OPTS_H
#define BRAID_BRAIDRUN_OPTS_H

#include <stddef.h>

#include "bootstrap/env.h"

typedef struct braidrun_opts {
  int nproc, nnodes, node_rank, port, tag;
  double timeout, grace;
  const char *backend, *master, *token_file;
  char master_host[BRAID__ENV_HOST_MAX]; /* from --master, without brackets; "127.0.0.1" without it */
  int master_port;                       /* from --master, else --port when > 0, else 0 (any) */
  char **argv;                           /* PROGRAM ARGS... (NULL-terminated, points into argv) */
} braidrun_opts;

enum {
  BRAIDRUN_OPTS_OK = 0,
  BRAIDRUN_OPTS_HELP = 1, /* -h / --help: print the help and exit 0 */
  BRAIDRUN_OPTS_USAGE = 2 /* bad usage: err holds the sentence; exit 2 */
};

/* Parses argv (argv[argc] must be NULL) into *o. Options end at PROGRAM,
   whose own options are left alone. Uses getopt_long, so it is not
   reentrant; it resets getopt's state itself and may be called repeatedly. */
int braidrun_parse_opts(int argc, char **argv, braidrun_opts *o, char *err, size_t errlen);

#endif
