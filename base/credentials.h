#ifndef KFORGE_BASE_CREDENTIALS_H_
#define KFORGE_BASE_CREDENTIALS_H_

// Files that hold keys, certificates and bearer tokens: read one way
// (a regular file under a size cap, through OpenRegularFile) and, for token
// lists, parsed one way, by the server, the CLI and the clients alike.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kforge {

// A PEM certificate chain, a key or a token list is a few KB.
inline constexpr uint64_t kMaxCredentialFileBytes = uint64_t{1} << 20;

// The whole file at `path` (a path the user named: a symbolic link is
// followed). Errors name `what` (the flag or option) and the path, e.g.
// "--tls-cert /etc/x.pem: ... is a FIFO, not a regular file". An empty
// file is an error too.
absl::StatusOr<std::string> ReadCredentialFile(const std::string& path, const std::string& what);

// Bearer tokens, one per line: surrounding blanks are dropped, as are empty
// lines and lines starting with '#'. A token is printable ASCII without
// spaces (what an HTTP/2 header value carries), 16..4096 characters; a line
// that is not is InvalidArgument naming its number (never its text: it may
// be a secret). No token at all is InvalidArgument too.
absl::StatusOr<std::vector<std::string>> ParseTokens(const std::string& text,
                                                     const std::string& what);

// OK when `key_pem` is the private key of the first certificate in
// `cert_chain_pem`; InvalidArgument saying which does not parse or that
// they do not match (a certificate rotated without its key).
absl::Status CheckKeyMatchesCertificate(const std::string& cert_chain_pem,
                                        const std::string& key_pem);

// What may read a secret file (a private key, a token list) besides its
// owner: a group- or world-readable one is refused by default; kWarn is
// for deployments that share it on purpose (a container secret mounted
// 0644, a key readable by a service group).
enum class SecretFileMode { kRefuse, kWarn };

// OK when the file at `path` (a link is followed) gives its group and
// others no access; otherwise FailedPrecondition naming `what`, the path
// and its mode, with the chmod that fixes it. `path` must exist.
absl::Status CheckSecretFileMode(const std::string& path, const std::string& what);

// When the first certificate of `cert_chain_pem` is valid, as OpenSSL
// prints the times ("Dec  5 13:21:40 2026 GMT").
struct CertificateValidity {
  std::string not_before;
  std::string not_after;
};

// The validity of the first certificate in `cert_chain_pem` if it is valid
// now; FailedPrecondition saying it expired (and when) or is not valid yet
// (and from when); InvalidArgument when it does not parse.
absl::StatusOr<CertificateValidity> CheckCertificateValidNow(const std::string& cert_chain_pem);

// ReadCredentialFile + ParseTokens.
absl::StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& path,
                                                       const std::string& what);

}  // namespace kforge

#endif  // KFORGE_BASE_CREDENTIALS_H_
