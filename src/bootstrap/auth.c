#include "bootstrap/auth.h"

#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <string.h>
#include <sys/random.h>

#include "bootstrap/store.h"

int braid__hmac_sha256(const uint8_t *key, size_t keylen, const void *msg, size_t msglen,
                       uint8_t out[BRAID__HMAC_LEN]) {
  unsigned int outlen = 0;
  if (keylen > 0x7fffffff) return -1;
  if (!HMAC(EVP_sha256(), key, (int)keylen, msg, msglen, out, &outlen) || outlen != BRAID__HMAC_LEN) return -1;
  return 0;
}

int braid__random_bytes(void *buf, size_t len) {
  if (len <= 0x7fffffff && RAND_bytes(buf, (int)len) == 1) return 0;
  /* The kernel's generator as a fallback. */
  unsigned char *p = buf;
  while (len > 0) {
    ssize_t n = getrandom(p, len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int braid__ct_equal(const void *a, const void *b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

int braid__store_auth_mac(const uint8_t *token, size_t token_len, int server_side, const uint8_t nonce_s[32],
                          const uint8_t nonce_c[32], uint8_t out[BRAID__HMAC_LEN]) {
  static const char client_label[] = "braid-store-v1 client";
  static const char server_label[] = "braid-store-v1 server";
  uint8_t msg[sizeof client_label - 1 + 64];
  size_t ll = sizeof client_label - 1;
  memcpy(msg, server_side ? server_label : client_label, ll);
  memcpy(msg + ll, nonce_s, 32);
  memcpy(msg + ll + 32, nonce_c, 32);
  return braid__hmac_sha256(token, token_len, msg, sizeof msg, out);
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int braid__token_parse(const char *hex, uint8_t out[BRAID__TOKEN_LEN]) {
  if (!hex || strlen(hex) != 2 * BRAID__TOKEN_LEN) return -1;
  uint8_t tmp[BRAID__TOKEN_LEN];
  for (int i = 0; i < BRAID__TOKEN_LEN; i++) {
    int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return -1;
    tmp[i] = (uint8_t)(hi << 4 | lo);
  }
  memcpy(out, tmp, sizeof tmp);
  OPENSSL_cleanse(tmp, sizeof tmp);
  return 0;
}

void braid__token_format(const uint8_t tok[BRAID__TOKEN_LEN], char hex[2 * BRAID__TOKEN_LEN + 1]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < BRAID__TOKEN_LEN; i++) {
    hex[2 * i] = digits[tok[i] >> 4];
    hex[2 * i + 1] = digits[tok[i] & 15];
  }
  hex[2 * BRAID__TOKEN_LEN] = 0;
}

int braid__token_generate(uint8_t out[BRAID__TOKEN_LEN]) { return braid__random_bytes(out, BRAID__TOKEN_LEN); }
