/* Job-token crypto for the store: HMAC-SHA-256 (OpenSSL libcrypto), random
   nonces, constant-time comparison. Token parse/format/generate are declared
   in bootstrap/store.h. */
#ifndef BRAID_AUTH_H
#define BRAID_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define BRAID__HMAC_LEN 32

/* Returns 0, or -1 if libcrypto failed. */
int braid__hmac_sha256(const uint8_t *key, size_t keylen, const void *msg, size_t msglen,
                       uint8_t out[BRAID__HMAC_LEN]);
/* Cryptographically strong random bytes; 0 or -1. */
int braid__random_bytes(void *buf, size_t len);
/* 1 when equal; time depends on n only. */
int braid__ct_equal(const void *a, const void *b, size_t n);
/* The store handshake MAC: HMAC(token, label || nonce_s || nonce_c), label
   "braid-store-v1 client" or "braid-store-v1 server". */
int braid__store_auth_mac(const uint8_t *token, size_t token_len, int server_side, const uint8_t nonce_s[32],
                          const uint8_t nonce_c[32], uint8_t out[BRAID__HMAC_LEN]);

#endif
