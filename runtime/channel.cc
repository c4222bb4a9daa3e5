#include "runtime/channel.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kforge {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ChannelSecurityOptions& options) {
  absl::StatusOr<ChannelSecurity> security = LoadChannelSecurity(options);
  if (!security.ok()) return security.status();
  if (!security->tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = std::move(security->root_certs_pem);
  ssl.pem_cert_chain = std::move(security->cert_chain_pem);
  ssl.pem_private_key = std::move(security->private_key_pem);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  if (!security->token.empty()) {
    credentials = grpc::CompositeChannelCredentials(credentials,
                                                    grpc::AccessTokenCredentials(security->token));
  }
  return credentials;
}

std::string ExplainTransportError(const grpc::Status& status, bool tls, bool client_certificate) {
  std::string message = status.error_message();
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return message;
  const bool closed =
      !absl::StrContains(message, "Connection refused") &&
      (absl::StrContains(message, "Socket closed") ||
       absl::StrContains(message, "Connection reset") ||
       absl::StrContains(message, "Broken pipe") || absl::StrContains(message, "EOF"));
  if (tls && !client_certificate && closed) {
    absl::StrAppend(&message,
                    " (the server closed the TLS connection: it probably requires a client "
                    "certificate (mTLS); give one from the CA it trusts with "
                    "--tls-cert/--tls-key / tls_cert_file, tls_key_file)");
  } else if (!tls && closed) {
    absl::StrAppend(&message,
                    " (the server closed a plain-text connection: it probably serves TLS; "
                    "give its CA with --tls-ca / tls_ca_file or KFORGE_TLS_CA)");
  } else if (tls && (absl::StrContains(message, "andshake") || absl::StrContains(message, "SSL") ||
                     absl::StrContains(message, "ssl"))) {
    absl::StrAppend(&message,
                    " (the TLS handshake failed: the server may serve plain text, its certificate "
                    "may not chain to --tls-ca or name this address, or it wants a client "
                    "certificate: --tls-cert/--tls-key or KFORGE_TLS_CERT/KFORGE_TLS_KEY)");
  }
  return message;
}

}  // namespace kforge
