#include "runtime/channel.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/credentials.h"

namespace kforge {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ChannelSecurityOptions& options) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "tls_cert_file and tls_key_file (--tls-cert and --tls-key) "
        "go together");
  }
  std::string token = options.token;
  if (!options.token_file.empty()) {
    absl::StatusOr<std::vector<std::string>> tokens =
        ReadTokenFile(options.token_file, "token file");
    if (!tokens.ok()) return tokens.status();
    token = tokens->front();
  } else if (!token.empty()) {
    absl::StatusOr<std::vector<std::string>> tokens = ParseTokens(token, "token");
    if (!tokens.ok()) return tokens.status();
    token = tokens->front();
  }
  if (!options.UsesTls()) {
    if (!token.empty()) {
      return absl::InvalidArgumentError(
          "a bearer token is only sent over TLS: give the server's CA (--tls-ca, tls_ca_file)");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  if (!options.tls_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadCredentialFile(options.tls_ca_file, "--tls-ca");
    if (!ca.ok()) return ca.status();
    if (!absl::StrContains(*ca, "-----BEGIN CERTIFICATE-----")) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-ca ", options.tls_ca_file, ": no PEM certificate in it"));
    }
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadCredentialFile(options.tls_cert_file, "--tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadCredentialFile(options.tls_key_file, "--tls-key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  if (!token.empty()) {
    credentials =
        grpc::CompositeChannelCredentials(credentials, grpc::AccessTokenCredentials(token));
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
                    "give its CA with --tls-ca / tls_ca_file)");
  } else if (tls && (absl::StrContains(message, "andshake") || absl::StrContains(message, "SSL") ||
                     absl::StrContains(message, "ssl"))) {
    absl::StrAppend(&message,
                    " (the TLS handshake failed: the server may serve plain text, its certificate "
                    "may not chain to --tls-ca or name this address, or it wants a client "
                    "certificate: --tls-cert/--tls-key)");
  }
  return message;
}

}  // namespace kforge
