#ifndef KFORGE_BASE_SHA256_H_
#define KFORGE_BASE_SHA256_H_

#include <string>
#include <string_view>

namespace kforge {

// Lower-case hex SHA-256 of `data` (OpenSSL's libcrypto).
std::string Sha256Hex(std::string_view data);

}  // namespace kforge

#endif  // KFORGE_BASE_SHA256_H_
