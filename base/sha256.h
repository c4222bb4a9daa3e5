#ifndef KFORGE_BASE_SHA256_H_
#define KFORGE_BASE_SHA256_H_

#include <string>
#include <string_view>

namespace kforge {

// Lower-case hex SHA-256 of `data` (64 characters), from OpenSSL's libcrypto.
// Cache keys and bundle checksums are made of it: the output for a given
// input must never change.
std::string Sha256Hex(std::string_view data);

}  // namespace kforge

#endif  // KFORGE_BASE_SHA256_H_
