#include "service/auth.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/credentials.h"
#include "base/sha256.h"
#include "grpcpp/security/server_credentials.h"

namespace kforge {
namespace {

constexpr absl::string_view kHealthPrefix = "/grpc.health.v1.Health/";
constexpr absl::string_view kWarmMethod = "/kforge.v1.KernelService/Warm";
constexpr absl::string_view kPrebuildMethod = "/kforge.v1.KernelService/Prebuild";
constexpr absl::string_view kBearer = "bearer ";

absl::StatusOr<std::set<std::string>> HashedTokens(const std::string& path,
                                                   const std::string& flag) {
  std::set<std::string> hashed;
  if (path.empty()) return hashed;
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokenFile(path, flag);
  if (!tokens.ok()) return tokens.status();
  for (const std::string& t : *tokens) hashed.insert(Sha256Hex(t));
  return hashed;
}

absl::string_view Find(const grpc::AuthMetadataProcessor::InputMetadata& md,
                       absl::string_view key) {
  auto it = md.find(grpc::string_ref(key.data(), key.size()));
  if (it == md.end()) return {};
  return absl::string_view(it->second.data(), it->second.size());
}

}  // namespace

MethodAccess AccessOfMethod(absl::string_view path) {
  if (absl::StartsWith(path, kHealthPrefix)) return MethodAccess::kOpen;
  if (path == kWarmMethod || path == kPrebuildMethod) return MethodAccess::kAdmin;
  return MethodAccess::kUser;
}

absl::StatusOr<std::shared_ptr<TokenAuthenticator>> TokenAuthenticator::Create(
    std::string auth_token_file, std::string admin_token_file) {
  std::shared_ptr<TokenAuthenticator> a(
      new TokenAuthenticator(std::move(auth_token_file), std::move(admin_token_file)));
  if (absl::Status s = a->Reload(); !s.ok()) return s;
  return a;
}

absl::Status TokenAuthenticator::Reload() {
  absl::StatusOr<std::set<std::string>> user = HashedTokens(auth_token_file_, "--auth-token-file");
  if (!user.ok()) return user.status();
  absl::StatusOr<std::set<std::string>> admin =
      HashedTokens(admin_token_file_, "--admin-token-file");
  if (!admin.ok()) return admin.status();
  absl::MutexLock lock(&mu_);
  user_ = *std::move(user);
  admin_ = *std::move(admin);
  return absl::OkStatus();
}

std::pair<size_t, size_t> TokenAuthenticator::counts() const {
  absl::MutexLock lock(&mu_);
  return {user_.size(), admin_.size()};
}

grpc::Status TokenAuthenticator::Process(const InputMetadata& auth_metadata, grpc::AuthContext*,
                                         OutputMetadata* consumed_auth_metadata, OutputMetadata*) {
  const absl::string_view path = Find(auth_metadata, ":path");
  // No path: nothing to decide by; refuse rather than guess.
  const MethodAccess access = path.empty() ? MethodAccess::kAdmin : AccessOfMethod(path);
  if (access == MethodAccess::kOpen) return grpc::Status::OK;
  const absl::string_view header = Find(auth_metadata, "authorization");
  // The token never reaches a handler or a log.
  if (!header.empty()) consumed_auth_metadata->emplace("authorization", std::string(header));
  const bool admin_method = access == MethodAccess::kAdmin;
  bool needs_token = false;
  bool user_ok = false;
  bool admin_ok = false;
  {
    absl::MutexLock lock(&mu_);
    needs_token = admin_method ? !admin_.empty() || !user_.empty() : !user_.empty();
    if (!needs_token) return grpc::Status::OK;
    if (header.size() > kBearer.size() &&
        absl::EqualsIgnoreCase(header.substr(0, kBearer.size()), kBearer)) {
      const std::string hashed =
          Sha256Hex(std::string(absl::StripAsciiWhitespace(header.substr(kBearer.size()))));
      admin_ok = admin_.count(hashed) > 0;
      user_ok = admin_ok || user_.count(hashed) > 0;
    }
    if (admin_method && admin_.empty()) admin_ok = user_ok;  // no admin tokens: users may warm
  }
  if (header.empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this kforge server needs a bearer token (authorization: Bearer ...): "
                        "give the client one (kforge --token-file FILE or KFORGE_TOKEN)");
  }
  if (!user_ok) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the bearer token is not one this kforge server accepts");
  }
  if (admin_method && !admin_ok) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "Warm needs an admin token (the server's --admin-token-file)");
  }
  return grpc::Status::OK;
}

absl::StatusOr<ServerSecurity> MakeServerSecurity(const ServerSecurityOptions& options) {
  ServerSecurity security;
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!options.tls()) {
    if (!options.tls_client_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    }
    if (options.tokens()) {
      return absl::InvalidArgumentError(
          "--auth-token-file and --admin-token-file need --tls-cert and --tls-key: bearer "
          "tokens sent in plain text can be read by anyone on the path");
    }
    security.credentials = grpc::InsecureServerCredentials();
    return security;
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  absl::StatusOr<std::string> cert = ReadCredentialFile(options.tls_cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadCredentialFile(options.tls_key_file, "--tls-key");
  if (!key.ok()) return key.status();
  if (!absl::StrContains(*cert, "-----BEGIN CERTIFICATE-----")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-cert ", options.tls_cert_file, ": no PEM certificate in it"));
  }
  if (!absl::StrContains(*key, "PRIVATE KEY-----")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key ", options.tls_key_file, ": no PEM private key in it"));
  }
  pair.cert_chain = *std::move(cert);
  pair.private_key = *std::move(key);
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca_file.empty()) {
    absl::StatusOr<std::string> ca =
        ReadCredentialFile(options.tls_client_ca_file, "--tls-client-ca");
    if (!ca.ok()) return ca.status();
    if (!absl::StrContains(*ca, "-----BEGIN CERTIFICATE-----")) {
      return absl::InvalidArgumentError(absl::StrCat("--tls-client-ca ", options.tls_client_ca_file,
                                                     ": no PEM certificate in it"));
    }
    ssl.pem_root_certs = *std::move(ca);
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  security.credentials = grpc::SslServerCredentials(ssl);
  if (options.tokens()) {
    absl::StatusOr<std::shared_ptr<TokenAuthenticator>> auth =
        TokenAuthenticator::Create(options.auth_token_file, options.admin_token_file);
    if (!auth.ok()) return auth.status();
    security.authenticator = *std::move(auth);
    security.credentials->SetAuthMetadataProcessor(security.authenticator);
  }
  return security;
}

bool IsLoopbackAddress(absl::string_view listen) {
  if (absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:")) return true;
  if (absl::StartsWith(listen, "ipv4:")) listen.remove_prefix(5);
  if (absl::StartsWith(listen, "ipv6:")) listen.remove_prefix(5);
  const size_t colon = listen.rfind(':');
  absl::string_view host = colon == absl::string_view::npos ? listen : listen.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

}  // namespace kforge
