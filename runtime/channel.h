#ifndef KFORGE_RUNTIME_CHANNEL_H_
#define KFORGE_RUNTIME_CHANNEL_H_

// How every C++ client (ServiceClient, `kforge get|stats|warm`) reaches a
// kforge server: plain text, TLS, mTLS, with or without a bearer token.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "runtime/client_settings.h"

namespace kforge {

// Channel credentials for the options (LoadChannelSecurity: its errors name
// the option and the file that is wrong).
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
