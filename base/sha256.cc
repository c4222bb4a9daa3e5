#include "base/sha256.h"

#include <openssl/evp.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/escaping.h"

namespace kforge {

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  // EVP_Digest fails only on allocation failure or a broken libcrypto.
  if (EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr) != 1) {
    std::fputs("kforge: EVP_Digest(SHA-256) failed\n", stderr);
    std::abort();
  }
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), size));
}

}  // namespace kforge
