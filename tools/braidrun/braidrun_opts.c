/* braidrun's command-line parser (see braidrun_opts.h). */
#include "braidrun_opts.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/params.h"

static int usage(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int usage(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return BRAIDRUN_OPTS_USAGE;
}

int braidrun_parse_opts(int argc, char **argv, braidrun_opts *o, char *err, size_t errlen) {
  enum { O_BACKEND = 256, O_TIMEOUT, O_GRACE, O_TAG, O_PORT, O_NNODES, O_NODE_RANK, O_MASTER, O_TOKEN_FILE };
  static const struct option longopts[] = {
      {"nproc", required_argument, NULL, 'n'},        {"backend", required_argument, NULL, O_BACKEND},
      {"timeout", required_argument, NULL, O_TIMEOUT}, {"grace", required_argument, NULL, O_GRACE},
      {"tag-output", no_argument, NULL, O_TAG},        {"port", required_argument, NULL, O_PORT},
      {"nnodes", required_argument, NULL, O_NNODES},   {"node-rank", required_argument, NULL, O_NODE_RANK},
      {"master", required_argument, NULL, O_MASTER},   {"token-file", required_argument, NULL, O_TOKEN_FILE},
      {"help", no_argument, NULL, 'h'},                {NULL, 0, NULL, 0}};
  memset(o, 0, sizeof *o);
  o->nnodes = 1;
  o->grace = 3.0;
  o->port = -1;
  if (err && errlen) err[0] = 0;
  if (argc < 1 || !argv) return usage(err, errlen, "no PROGRAM to run");
  opterr = 0;
  optind = 0; /* GNU getopt: 0 starts a fresh scan (state of an earlier call is dropped) */
  long x = 0;
  int c;
  /* "+": options end at PROGRAM, whose own options are left alone. */
  while ((c = getopt_long(argc, argv, "+:hn:", longopts, NULL)) != -1) {
    switch (c) {
    case 'h': return BRAIDRUN_OPTS_HELP;
    case 'n':
    case O_PORT:
    case O_NNODES:
    case O_NODE_RANK: {
      const char *name = c == 'n' ? "-n" : c == O_PORT ? "--port" : c == O_NNODES ? "--nnodes" : "--node-rank";
      long lo = c == 'n' || c == O_NNODES ? 1 : 0, hi = c == O_PORT ? 65535 : 1 << 16;
      if (braid__parse_long(optarg, lo, hi, &x))
        return usage(err, errlen, "%s \"%s\" is not an integer in [%ld, %ld]", name, optarg, lo, hi);
      if (c == 'n') o->nproc = (int)x;
      else if (c == O_PORT) o->port = (int)x;
      else if (c == O_NNODES) o->nnodes = (int)x;
      else o->node_rank = (int)x;
      break;
    }
    case O_TIMEOUT:
    case O_GRACE: {
      double s = 0;
      const char *name = c == O_TIMEOUT ? "--timeout" : "--grace";
      if (braid__parse_seconds(optarg, &s)) return usage(err, errlen, "%s \"%s\" is not a number of seconds", name, optarg);
      if (c == O_TIMEOUT) o->timeout = s;
      else o->grace = s;
      break;
    }
    case O_BACKEND: o->backend = optarg; break;
    case O_TAG: o->tag = 1; break;
    case O_MASTER: o->master = optarg; break;
    case O_TOKEN_FILE: o->token_file = optarg; break;
    case ':': return usage(err, errlen, "%s needs a value", argv[optind - 1]);
    default:
      /* A long option given a value it takes none of ("--tag-output=1")
         sets optopt to its code, which is no letter to print. */
      if (optopt && !strncmp(argv[optind - 1], "--", 2))
        return usage(err, errlen, "%.*s takes no value", (int)strcspn(argv[optind - 1], "="), argv[optind - 1]);
      if (optopt) return usage(err, errlen, "unknown option -%c", optopt);
      return usage(err, errlen, "unknown option %s", argv[optind - 1]);
    }
  }
  if (optind >= argc) return usage(err, errlen, "no PROGRAM to run");
  if (!o->nproc) return usage(err, errlen, "-n N (ranks on this node) is required");
  if (o->node_rank >= o->nnodes)
    return usage(err, errlen, "--node-rank %d is not below --nnodes %d", o->node_rank, o->nnodes);
  if (o->nnodes > 1 && !o->master)
    return usage(err, errlen, "--nnodes %d needs --master HOST:PORT (node 0's store address)", o->nnodes);
  if (o->master && o->port >= 0) return usage(err, errlen, "--port and --master both give the store port; use one");
  if ((long)o->nproc * o->nnodes > (1 << 24))
    return usage(err, errlen, "%d nodes of %d ranks are too many", o->nnodes, o->nproc);
  snprintf(o->master_host, sizeof o->master_host, "127.0.0.1");
  o->master_port = o->port > 0 ? o->port : 0;
  if (o->master && braid__parse_hostport(o->master, o->master_host, sizeof o->master_host, &o->master_port))
    return usage(err, errlen, "--master \"%s\" is not HOST:PORT ([ADDR]:PORT for IPv6)", o->master);
  o->argv = argv + optind;
  return BRAIDRUN_OPTS_OK;
}
