#include "service/auth.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/credentials.h"
#include "base/io.h"
#include "base/log.h"
#include "base/sha256.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace kforge {
namespace {

constexpr absl::string_view kHealthPrefix = "/grpc.health.v1.Health/";
constexpr absl::string_view kWarmMethod = "/kforge.v1.KernelService/Warm";
constexpr absl::string_view kPrebuildMethod = "/kforge.v1.KernelService/Prebuild";
constexpr absl::string_view kBearer = "bearer ";

// A secret file's mode as `mode` says: an error, or a warning in the log.
absl::Status CheckSecret(const std::string& path, const std::string& flag, SecretFileMode mode) {
  absl::Status s = CheckSecretFileMode(path, flag);
  if (!absl::IsFailedPrecondition(s)) return s;
  if (mode == SecretFileMode::kRefuse) {
    return absl::FailedPreconditionError(
        absl::StrCat(s.message(), " (or pass --allow-readable-secrets)"));
  }
  LogEvent(LogLevel::kWarning, "secret_file_mode", absl::StrCat("warning: ", s.message()),
           {{"file", path}});
  return absl::OkStatus();
}

absl::StatusOr<std::set<std::string>> HashedTokens(const std::string& path, const std::string& flag,
                                                   SecretFileMode mode) {
  std::set<std::string> hashed;
  if (path.empty()) return hashed;
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokenFile(path, flag);
  if (!tokens.ok()) return tokens.status();
  if (absl::Status s = CheckSecret(path, flag, mode); !s.ok()) return s;
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

std::vector<std::string> AccessLines(const ServerSecurityOptions& options) {
  const bool user = !options.auth_token_file.empty();
  const bool admin = !options.admin_token_file.empty();
  const std::string reads =
      !options.tokens() || options.open_reads
          ? absl::StrCat("open (no token", options.tokens() ? ": --open-reads" : "", ")")
      : user && admin ? "a user or admin token"
      : user          ? "a user token (--auth-token-file)"
                      : "an admin token (--admin-token-file; no user tokens are configured)";
  const std::string warm = !options.tokens() ? "open (no token)"
                           : admin           ? "an admin token (--admin-token-file)"
                                             : "a user token (no admin tokens are configured)";
  return {"health (grpc.health.v1.Health): open",
          absl::StrCat("read (GetKernel, GetManifest, Stats, reflection): ", reads),
          absl::StrCat("warm (Warm, Prebuild): ", warm)};
}

absl::StatusOr<std::shared_ptr<TokenAuthenticator>> TokenAuthenticator::Create(
    const ServerSecurityOptions& options) {
  std::shared_ptr<TokenAuthenticator> a(new TokenAuthenticator(options));
  if (absl::Status s = a->Reload(); !s.ok()) return s;
  return a;
}

absl::Status TokenAuthenticator::Reload() {
  absl::StatusOr<std::set<std::string>> user =
      HashedTokens(auth_token_file_, "--auth-token-file", secret_file_mode_);
  if (!user.ok()) return user.status();
  absl::StatusOr<std::set<std::string>> admin =
      HashedTokens(admin_token_file_, "--admin-token-file", secret_file_mode_);
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

AuthFailureCounts TokenAuthenticator::failures() const {
  return {missing_token_.load(), unknown_token_.load(), not_admin_.load()};
}

grpc::Status TokenAuthenticator::Refuse(std::atomic<uint64_t>& counter, grpc::StatusCode code,
                                        const char* message) {
  counter.fetch_add(1, std::memory_order_relaxed);
  return grpc::Status(code, message);
}

grpc::Status TokenAuthenticator::Process(const InputMetadata& auth_metadata, grpc::AuthContext*,
                                         OutputMetadata* consumed_auth_metadata, OutputMetadata*) {
  const absl::string_view path = Find(auth_metadata, ":path");
  // No path: nothing to decide by; refuse rather than guess.
  const MethodAccess access = path.empty() ? MethodAccess::kAdmin : AccessOfMethod(path);
  if (access == MethodAccess::kOpen) return grpc::Status::OK;
  if (access == MethodAccess::kUser && open_reads_) return grpc::Status::OK;
  const absl::string_view header = Find(auth_metadata, "authorization");
  // The token never reaches a handler or a log.
  if (!header.empty()) consumed_auth_metadata->emplace("authorization", std::string(header));
  const bool admin_method = access == MethodAccess::kAdmin;
  bool user_ok = false;
  bool admin_ok = false;
  {
    absl::MutexLock lock(&mu_);
    // Token files hold a token each (ParseTokens): every method but the
    // open ones needs one here.
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
    return Refuse(missing_token_, grpc::StatusCode::UNAUTHENTICATED,
                  "this kforge server needs a bearer token (authorization: Bearer ...): "
                  "give the client one (kforge --token-file FILE or KFORGE_TOKEN)");
  }
  if (!user_ok) {
    return Refuse(unknown_token_, grpc::StatusCode::UNAUTHENTICATED,
                  "the bearer token is not one this kforge server accepts");
  }
  if (admin_method && !admin_ok) {
    return Refuse(not_admin_, grpc::StatusCode::PERMISSION_DENIED,
                  "Warm needs an admin token (the server's --admin-token-file)");
  }
  return grpc::Status::OK;
}

namespace {

constexpr char kPublishedKey[] = "current/key.pem";
constexpr char kPublishedCert[] = "current/cert.pem";
constexpr char kPublishedCa[] = "current/ca.pem";
// How often gRPC rereads the published files: a reload is served within it.
constexpr unsigned int kTlsRefreshSeconds = 1;

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& flag,
                                    const char* marker, const char* what) {
  absl::StatusOr<std::string> text = ReadCredentialFile(path, flag);
  if (!text.ok()) return text.status();
  if (!absl::StrContains(*text, marker)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": no PEM ", what, " in it"));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerTlsFiles>> ServerTlsFiles::Create(
    const ServerSecurityOptions& options) {
  std::error_code ec;
  std::string pattern = (std::filesystem::temp_directory_path(ec) / "kforge-tls-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot make a private directory for TLS files (",
                                            pattern, "): ", std::strerror(errno)));
  }
  std::unique_ptr<ServerTlsFiles> files(new ServerTlsFiles(options, pattern));
  if (absl::Status s = files->Publish(); !s.ok()) return s;
  return files;
}

ServerTlsFiles::~ServerTlsFiles() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

absl::Status ServerTlsFiles::Reload() { return Publish(); }

absl::Status ServerTlsFiles::Publish() {
  absl::StatusOr<std::string> cert =
      ReadPem(options_.tls_cert_file, "--tls-cert", "-----BEGIN CERTIFICATE-----", "certificate");
  if (!cert.ok()) return cert.status();
  if (absl::StatusOr<CertificateValidity> valid = CheckCertificateValidNow(*cert); !valid.ok()) {
    return absl::Status(valid.status().code(), absl::StrCat("--tls-cert ", options_.tls_cert_file,
                                                            ": ", valid.status().message()));
  }
  absl::StatusOr<std::string> key =
      ReadPem(options_.tls_key_file, "--tls-key", "PRIVATE KEY-----", "private key");
  if (!key.ok()) return key.status();
  if (absl::Status s = CheckSecret(options_.tls_key_file, "--tls-key", options_.secret_file_mode);
      !s.ok()) {
    return s;
  }
  if (absl::Status match = CheckKeyMatchesCertificate(*cert, *key); !match.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-cert ", options_.tls_cert_file,
                                                   ", --tls-key ", options_.tls_key_file, ": ",
                                                   match.message()));
  }
  std::string ca;
  if (!options_.tls_client_ca_file.empty()) {
    absl::StatusOr<std::string> read = ReadPem(options_.tls_client_ca_file, "--tls-client-ca",
                                               "-----BEGIN CERTIFICATE-----", "certificate");
    if (!read.ok()) return read.status();
    ca = *std::move(read);
  }
  absl::MutexLock lock(&mu_);
  const int next = generation_ + 1;
  const std::string sub = absl::StrCat("g", next);
  const std::string path = absl::StrCat(dir_, "/", sub);
  std::error_code ec;
  std::filesystem::create_directory(path, ec);
  absl::Status written = ec ? absl::InternalError(absl::StrCat(path, ": ", ec.message()))
                            : WriteFileAtomic(path + "/key.pem", *key);
  if (written.ok()) written = WriteFileAtomic(path + "/cert.pem", *cert);
  if (written.ok() && !ca.empty()) written = WriteFileAtomic(path + "/ca.pem", ca);
  const std::string link = absl::StrCat(dir_, "/current.new");
  std::filesystem::remove(link, ec);
  if (written.ok() && symlink(sub.c_str(), link.c_str()) != 0) {
    written = absl::InternalError(absl::StrCat("symlink ", link, ": ", std::strerror(errno)));
  }
  if (written.ok() && rename(link.c_str(), absl::StrCat(dir_, "/current").c_str()) != 0) {
    written = absl::InternalError(absl::StrCat("rename ", link, ": ", std::strerror(errno)));
  }
  if (!written.ok()) {
    std::filesystem::remove_all(path, ec);
    return written;
  }
  // The one before the previous: gRPC may still be reading the previous.
  std::filesystem::remove_all(absl::StrCat(dir_, "/g", generation_ - 1), ec);
  generation_ = next;
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> ServerTlsFiles::Credentials() const {
  const bool mtls = !options_.tls_client_ca_file.empty();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      absl::StrCat(dir_, "/", kPublishedKey), absl::StrCat(dir_, "/", kPublishedCert),
      mtls ? absl::StrCat(dir_, "/", kPublishedCa) : "", kTlsRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (mtls) {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(tls);
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
  absl::StatusOr<std::unique_ptr<ServerTlsFiles>> tls = ServerTlsFiles::Create(options);
  if (!tls.ok()) return tls.status();
  security.tls = *std::move(tls);
  security.credentials = security.tls->Credentials();
  if (options.tokens()) {
    absl::StatusOr<std::shared_ptr<TokenAuthenticator>> auth = TokenAuthenticator::Create(options);
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
