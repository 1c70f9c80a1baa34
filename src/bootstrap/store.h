/*
 * Rendezvous key-value store: a TCP server (one thread, poll-based) and a
 * blocking client. Every connection is authenticated with the job token by an
 * HMAC-SHA-256 challenge-response; without a token the server binds and
 * accepts loopback only. Keys are strings, values are bytes; every length is
 * bounded (BRAID__STORE_MAX_KEY, BRAID__STORE_MAX_VALUE).
 *
 * A client is used by one thread at a time. Errors return a status and write
 * a sentence to the client's error buffer (braid__store_error).
 */
#ifndef BRAID_STORE_H
#define BRAID_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "braid.h"

#define BRAID__STORE_MAX_KEY 1024
#define BRAID__STORE_MAX_VALUE (16u << 20)
#define BRAID__TOKEN_LEN 32

typedef struct braid__store_server braid__store_server;
typedef struct braid__store braid__store;

/* Starts a server thread listening on every address host resolves to
   ("127.0.0.1", "localhost": 127.0.0.1 and ::1, "::", a name; NULL: all
   interfaces, dual-stack where IPv6 is on). Without a token (NULL) it listens
   on loopback only whatever host says: host's loopback addresses, else
   127.0.0.1 and ::1; it logs that. port 0 picks a port free on every address.
   An address already in use fails the start (BRAID_ERR_BOOTSTRAP, naming
   address and port): the store never moves to another address or family,
   where clients of the requested one would reach someone else's process. */
braid_status braid__store_server_start(const char *host, int port, const uint8_t *token, size_t token_len,
                                       braid__store_server **out, char *err, size_t errlen);
int braid__store_server_port(const braid__store_server *s);
/* Stops the thread, closes every connection, frees everything. */
void braid__store_server_stop(braid__store_server *s);
/* Bounds of a running server; a value <= 0 keeps the current one. Defaults: an
   incomplete frame must complete within 10 s (plus 1 s per MiB it declares),
   authentication within 5 s of connecting; at most 4096 connections and 1 GiB
   stored (keys + values + 64 bytes per key; past it SET fails with
   BRAID_ERR_NO_MEMORY). */
void braid__store_server_set_limits(braid__store_server *s, double frame_timeout_s, double auth_timeout_s,
                                    int max_conns, size_t max_bytes);

/* Connects and authenticates, retrying refused/unreachable connections with
   backoff until the absolute monotonic deadline (INFINITY: forever). */
braid_status braid__store_connect(const char *host, int port, const uint8_t *token, size_t token_len,
                                  double deadline, braid__store **out, char *err, size_t errlen);
void braid__store_close(braid__store *st);
/* A second connection with the same address, token and prefix (split children).
   st reached the store before, so a store that now refuses connections (or
   cannot be reached) is gone, not late: after BRAID__STORE_GONE_S seconds of
   such failures the clone fails with BRAID_ERR_PEER_LOST ("the store at
   host:port is gone: ..."), whatever the deadline; a store that answers is
   retried until the deadline as in braid__store_connect. */
#define BRAID__STORE_GONE_S 2.0
braid_status braid__store_clone(const braid__store *st, double deadline, braid__store **out, char *err,
                                size_t errlen);
/* Prefix prepended to every key of this client (namespaces: jobs, split communicators). */
braid_status braid__store_set_prefix(braid__store *st, const char *prefix);
const char *braid__store_error(const braid__store *st);
/* How long SET, ADD, CAS and DELETE (which take no deadline) wait for their
   reply: default 300 s; 0 waits forever. A request that gets none in time
   fails with BRAID_ERR_TIMEOUT, "the store at host:port did not answer within
   N s (store set "key")", and the connection stays usable. */
void braid__store_set_op_timeout(braid__store *st, double timeout_s);
double braid__store_op_timeout(const braid__store *st);
/* An absolute monotonic time by which those requests end as well, whatever
   the op timeout says (a start's deadline); INFINITY (the default) removes it.
   Clones do not inherit it. */
void braid__store_set_op_deadline(braid__store *st, double deadline);

braid_status braid__store_set(braid__store *st, const char *key, const void *val, size_t len);
/* Blocks until key exists or the deadline passes (BRAID_ERR_TIMEOUT). *val is malloc'd; free it. */
braid_status braid__store_get(braid__store *st, const char *key, void **val, size_t *len, double deadline);
/* Whether key exists now, without waiting for it: OK with *found 1 and *val
   (malloc'd) or *found 0. The whole exchange ends by the absolute deadline
   even when the store is stuck: TIMEOUT when no reply came by then. The
   connection stays usable when the reply had not begun (it is skipped when
   it comes); a request or reply stalled halfway closes it (later calls:
   PEER_LOST). */
braid_status braid__store_try_get(braid__store *st, const char *key, void **val, size_t *len, int *found,
                                  double deadline);
/* Atomic counter: adds delta (a missing key counts as 0) and returns the new value.
   The value is stored as decimal text ("42"), so GET reads it and SET "5" seeds
   it; arithmetic wraps like int64. ADD on a non-decimal value: INVALID_ARG. */
braid_status braid__store_add(braid__store *st, const char *key, int64_t delta, int64_t *result);
/* Sets key to desired if its value equals expected (expected NULL: only if the key is missing).
   *swapped says whether it did; the value after the operation (desired when
   swapped) is returned in *cur (malloc'd; NULL when the key is missing; cur may be NULL). */
braid_status braid__store_cas(braid__store *st, const char *key, const void *expected, size_t elen,
                              const void *desired, size_t dlen, int *swapped, void **cur, size_t *curlen);
braid_status braid__store_delete(braid__store *st, const char *key, int *existed);
/* Blocks until every key exists or the deadline passes; on timeout *present
   (array of n, may be NULL) says which keys exist. */
braid_status braid__store_wait(braid__store *st, const char *const *keys, int n, double deadline, int *present);

/* Token helpers: BRAID_TOKEN is 64 hex digits (32 bytes). */
int braid__token_parse(const char *hex, uint8_t out[BRAID__TOKEN_LEN]);
void braid__token_format(const uint8_t tok[BRAID__TOKEN_LEN], char hex[2 * BRAID__TOKEN_LEN + 1]);
int braid__token_generate(uint8_t out[BRAID__TOKEN_LEN]);

#endif
