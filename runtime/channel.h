#ifndef KFORGE_RUNTIME_CHANNEL_H_
#define KFORGE_RUNTIME_CHANNEL_H_

// How every C++ client (ServiceClient, `kforge get|stats|warm`) reaches a
// kforge server: plain text, TLS, mTLS, with or without a bearer token.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace kforge {

struct ChannelSecurityOptions {
  // PEM CA certificates the server's certificate must chain to; turns TLS
  // on. With `tls` and no CA file, the system's roots are used.
  bool tls = false;
  std::string tls_ca_file;
  // A client certificate and its key (PEM), for a server that asks for one
  // (`kforge serve --tls-client-ca`).
  std::string tls_cert_file;
  std::string tls_key_file;
  // A bearer token sent as "authorization: Bearer <token>" on every call,
  // or a file holding one (the first token, base/credentials.h). Tokens are
  // only sent over TLS.
  std::string token;
  std::string token_file;

  bool UsesTls() const { return tls || !tls_ca_file.empty() || !tls_cert_file.empty(); }
};

// Channel credentials for the options. InvalidArgument names the option
// (and file) that is wrong: a cert without its key, a token without TLS, a
// file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ChannelSecurityOptions& options);

// A failed call's message with what the transport most likely means: a
// plain-text client whose connection the server closed is told that the
// server probably serves TLS; a TLS client whose handshake failed is told
// to check the server's TLS and its CA; a TLS client without a client
// certificate whose connection was closed ("Socket closed": with TLS 1.3
// the server checks the client's certificate after the handshake) is told
// that the server probably wants one (mTLS). Other failures are unchanged.
std::string ExplainTransportError(const grpc::Status& status, bool tls,
                                  bool client_certificate = false);

}  // namespace kforge

#endif  // KFORGE_RUNTIME_CHANNEL_H_
