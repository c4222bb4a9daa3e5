#ifndef KFORGE_BASE_SHA256_H_
#define KFORGE_BASE_SHA256_H_

#include <string>
#include <string_view>

namespace kforge {

// Lower-case hex SHA-256 of `data` (OpenSSL's libcrypto).
std::string Sha256Hex(std::string_view data);

// The 32 raw bytes of HMAC-SHA256(key, data) (RFC 2104; libcrypto).
std::string HmacSha256(std::string_view key, std::string_view data);

// True when `a` and `b` are equal, in time that depends on their lengths
// only (a MAC compared byte by byte would tell a forger how much is right).
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace kforge

#endif  // KFORGE_BASE_SHA256_H_
