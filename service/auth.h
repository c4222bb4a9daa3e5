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
//     a user or an admin token when a token file is given;
//   - a missing or unknown token is UNAUTHENTICATED; a user token on an
//     admin method is PERMISSION_DENIED.
// Tokens travel only over TLS: a token file without a certificate is
// refused at start (gRPC clients will not send call credentials in plain
// text either).

#include <memory>
#include <set>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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

  bool tls() const { return !tls_cert_file.empty(); }
  bool tokens() const { return !auth_token_file.empty() || !admin_token_file.empty(); }
};

// Which tokens a method needs.
enum class MethodAccess { kOpen, kUser, kAdmin };
MethodAccess AccessOfMethod(absl::string_view path);  // path: "/pkg.Service/Method"

class TokenAuthenticator final : public grpc::AuthMetadataProcessor {
 public:
  // Reads the token files (either may be "", not both).
  static absl::StatusOr<std::shared_ptr<TokenAuthenticator>> Create(std::string auth_token_file,
                                                                    std::string admin_token_file);

  // Rereads both files. On any error the tokens in use stay as they were
  // and the error (naming the file) is returned.
  absl::Status Reload();
  // Tokens now accepted, user and admin.
  std::pair<size_t, size_t> counts() const;

  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  TokenAuthenticator(std::string auth_token_file, std::string admin_token_file)
      : auth_token_file_(std::move(auth_token_file)),
        admin_token_file_(std::move(admin_token_file)) {}
  const std::string auth_token_file_;
  const std::string admin_token_file_;
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
// with the token check attached. Errors name the flag and file.
absl::StatusOr<ServerSecurity> MakeServerSecurity(const ServerSecurityOptions& options);

// Whether `listen` is reachable only from this host (127.0.0.0/8, ::1,
// localhost, a unix socket).
bool IsLoopbackAddress(absl::string_view listen);

}  // namespace kforge

#endif  // KFORGE_SERVICE_AUTH_H_
