#ifndef KFORGE_SERVICE_AUTH_H_
#define KFORGE_SERVICE_AUTH_H_

// Who may ask `kforge serve`: TLS (mTLS with a client CA) and bearer tokens,
// checked by a gRPC AuthMetadataProcessor before any handler runs, so the
// handlers hold no rule about callers. The rules, each here only:
//   - grpc.health.v1.Health is open (load balancers and probes have no
//     token);
//   - Warm (and its old name Prebuild) needs an admin token when an admin
//     token file is given, else a user token when a token file is given;
//   - every other method (GetKernel, GetManifest, Stats, reflection) needs
//     a user or an admin token when any token file is given (with only an
//     admin token file, an admin token), unless open_reads opens them;
//   - a missing or unknown token is UNAUTHENTICATED; a user token on an
//     admin method is PERMISSION_DENIED.
// The server prints these rules as they apply, one line per group
// (AccessLines).
// Tokens travel only over TLS: a token file without a certificate is
// refused at start (gRPC clients will not send call credentials in plain
// text either).

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/credentials.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/server_credentials.h"

namespace kforge {

struct ServerSecurityOptions {
  // PEM files; cert and key together turn TLS on.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Clients must present a certificate signed by this CA (mTLS).
  std::string tls_client_ca_file;
  // Bearer tokens, one per line (base/credentials.h ParseTokens); reread
  // on SIGHUP.
  std::string auth_token_file;
  std::string admin_token_file;
  // With token files: the read methods (GetKernel, GetManifest, Stats,
  // reflection) answer without a token; only Warm is closed.
  bool open_reads = false;
  // A group- or world-readable --tls-key or token file: refused, or a
  // warning (base/credentials.h SecretFileMode).
  SecretFileMode secret_file_mode = SecretFileMode::kRefuse;

  bool tls() const { return !tls_cert_file.empty(); }
  bool tokens() const { return !auth_token_file.empty() || !admin_token_file.empty(); }
};

// Which group a method is in: open (health), read (user) or admin (Warm).
enum class MethodAccess { kOpen, kUser, kAdmin };
MethodAccess AccessOfMethod(absl::string_view path);  // path: "/pkg.Service/Method"

// Who may call each group under `options`, one line per group, e.g.
// "read (GetKernel, GetManifest, Stats, reflection): a user or admin token".
std::vector<std::string> AccessLines(const ServerSecurityOptions& options);

// Calls the token check refused, by reason: the fixed label values of
// kforge_auth_failures_total.
struct AuthFailureCounts {
  uint64_t missing_token = 0;  // no authorization header
  uint64_t unknown_token = 0;  // not "Bearer <a token the server accepts>"
  uint64_t not_admin = 0;      // a user token on Warm
};

class TokenAuthenticator final : public grpc::AuthMetadataProcessor {
 public:
  // Reads the token files (either may be "", not both); their modes are
  // checked as `options.secret_file_mode` says.
  static absl::StatusOr<std::shared_ptr<TokenAuthenticator>> Create(
      const ServerSecurityOptions& options);

  // Rereads both files. On any error the tokens in use stay as they were
  // and the error (naming the file) is returned.
  absl::Status Reload();
  // Tokens now accepted, user and admin.
  std::pair<size_t, size_t> counts() const;
  AuthFailureCounts failures() const;

  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  explicit TokenAuthenticator(const ServerSecurityOptions& options)
      : auth_token_file_(options.auth_token_file),
        admin_token_file_(options.admin_token_file),
        open_reads_(options.open_reads),
        secret_file_mode_(options.secret_file_mode) {}
  grpc::Status Refuse(std::atomic<uint64_t>& counter, grpc::StatusCode code, const char* message);
  const std::string auth_token_file_;
  const std::string admin_token_file_;
  const bool open_reads_;
  const SecretFileMode secret_file_mode_;
  std::atomic<uint64_t> missing_token_{0};
  std::atomic<uint64_t> unknown_token_{0};
  std::atomic<uint64_t> not_admin_{0};
  mutable absl::Mutex mu_;
  // SHA-256 of each token: a lookup's timing tells nothing about a token.
  std::set<std::string> user_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> admin_ ABSL_GUARDED_BY(mu_);
};

// The server's certificate, key and (mTLS) client CA as gRPC reads them.
// gRPC 1.51 cannot swap the credentials of a listening server, but its
// FileWatcherCertificateProvider rereads files every second. kforge reads
// and checks the files the flags name (regular files, size-capped, PEM, the
// key matching the certificate) and publishes a copy in a private directory
// (mode 0700 under $TMPDIR, removed at exit) that the provider watches;
// each publication is a new subdirectory swapped in by renaming a symbolic
// link, so gRPC never reads a key from one and a certificate from another.
// Reload (SIGHUP) publishes the files again: new handshakes use them within
// a second, connections already open keep theirs.
class ServerTlsFiles {
 public:
  static absl::StatusOr<std::unique_ptr<ServerTlsFiles>> Create(
      const ServerSecurityOptions& options);
  ~ServerTlsFiles();

  // Rereads and republishes; on any error (naming the flag and file) the
  // certificate in use stays.
  absl::Status Reload();
  std::shared_ptr<grpc::ServerCredentials> Credentials() const;

 private:
  ServerTlsFiles(ServerSecurityOptions options, std::string dir)
      : options_(std::move(options)), dir_(std::move(dir)) {}
  absl::Status Publish();

  const ServerSecurityOptions options_;
  const std::string dir_;
  absl::Mutex mu_;
  int generation_ ABSL_GUARDED_BY(mu_) = 0;
};

struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::shared_ptr<TokenAuthenticator> authenticator;  // null without token files
  std::shared_ptr<ServerTlsFiles> tls;                // null without TLS
};

// Credentials for AddListeningPort from the options: insecure, TLS or mTLS,
// with the token check attached. Errors name the flag and file; a
// certificate that is expired or not yet valid is refused (on SIGHUP too).
absl::StatusOr<ServerSecurity> MakeServerSecurity(const ServerSecurityOptions& options);

// Whether `listen` is reachable only from this host (127.0.0.0/8, ::1,
// localhost, a unix socket).
bool IsLoopbackAddress(absl::string_view listen);

}  // namespace kforge

#endif  // KFORGE_SERVICE_AUTH_H_
