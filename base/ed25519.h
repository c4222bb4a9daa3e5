#ifndef KFORGE_BASE_ED25519_H_
#define KFORGE_BASE_ED25519_H_

// Ed25519 signatures (OpenSSL libcrypto, EVP_PKEY_ED25519), the one scheme
// kforge signs bundles with. Keys are PEM as the openssl CLI writes them
// (`openssl genpkey -algorithm ed25519`: PKCS#8 "PRIVATE KEY";
// `openssl pkey -pubout`: SubjectPublicKeyInfo "PUBLIC KEY"), so that keys
// made either way work and a signature checks with
// `openssl pkeyutl -verify -rawin -pubin -inkey KEY.pub -sigfile SIG -in FILE`.

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kforge {

inline constexpr size_t kEd25519SignatureBytes = 64;

struct Ed25519KeyPair {
  std::string private_pem;
  std::string public_pem;
};

// A fresh key pair from the system's random source.
absl::StatusOr<Ed25519KeyPair> GenerateEd25519KeyPair();

// The public key of a private key, as PEM. InvalidArgument when
// `private_pem` is not an Ed25519 private key.
absl::StatusOr<std::string> Ed25519PublicKeyOf(std::string_view private_pem);

// The 64-byte signature of `message`. InvalidArgument when `private_pem`
// is not an Ed25519 private key (another type, a public key, garbage).
absl::StatusOr<std::string> Ed25519Sign(std::string_view private_pem, std::string_view message);

// OK when `signature` is `message` signed by the key of `public_pem`;
// InvalidArgument when `public_pem` is not an Ed25519 public key;
// Unauthenticated when the signature does not match.
absl::Status Ed25519Verify(std::string_view public_pem, std::string_view message,
                           std::string_view signature);

}  // namespace kforge

#endif  // KFORGE_BASE_ED25519_H_
