#include "base/sha256.h"

#include <openssl/evp.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace kforge {

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(),
                 nullptr) != 1 ||
      length != 32) {
    // Only a libcrypto without its default provider gets here. A key made
    // of anything else would name the wrong kernel, so stop.
    std::fprintf(stderr, "kforge: OpenSSL's SHA-256 failed\n");
    std::abort();
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex(2 * length, '\0');
  for (unsigned int i = 0; i < length; ++i) {
    hex[2 * i] = kHex[digest[i] >> 4];
    hex[2 * i + 1] = kHex[digest[i] & 0xf];
  }
  return hex;
}

}  // namespace kforge
