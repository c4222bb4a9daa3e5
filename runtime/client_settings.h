#ifndef KFORGE_RUNTIME_CLIENT_SETTINGS_H_
#define KFORGE_RUNTIME_CLIENT_SETTINGS_H_

// A kforge client's settings (a server's address or a bundle directory,
// TLS, a client certificate, a bearer token, a local copy of what it
// fetched) as its caller gives them or, where the caller gives none, as
// the KFORGE_* environment variables do, so that an engine configured by
// its environment alone (a vLLM worker) reaches a secured server. The one
// rule, with its checks, for the C++ runtime (OpenKernelSourceFromEnvironment
// in runtime/client.h), the CLI's client commands (cli/connect_args.h) and
// the Python package (the C ABI's kforge_client_settings). No gRPC here, so
// that the C ABI can link it; runtime/channel.h makes gRPC credentials of
// a ChannelSecurity.

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace kforge {

// The variables, one per setting (README, "Client settings").
inline constexpr char kServerVar[] = "KFORGE_SERVER";
inline constexpr char kBundleVar[] = "KFORGE_BUNDLE";
inline constexpr char kLocalCopyDirVar[] = "KFORGE_LOCAL_COPY_DIR";
inline constexpr char kTlsCaVar[] = "KFORGE_TLS_CA";
inline constexpr char kTlsCertVar[] = "KFORGE_TLS_CERT";
inline constexpr char kTlsKeyVar[] = "KFORGE_TLS_KEY";
inline constexpr char kTokenVar[] = "KFORGE_TOKEN";
inline constexpr char kTokenFileVar[] = "KFORGE_TOKEN_FILE";
// The Ed25519 public key a bundle must be signed with (`kforge keygen`);
// the same variable as `kforge serve --trust`.
inline constexpr char kTrustVar[] = "KFORGE_TRUST";
// "1" (or "true", "yes", "on"): ask a server for first answers
// (GetKernelRequest.first_answer); "0" ("false", "no", "off"): do not.
inline constexpr char kFirstAnswerVar[] = "KFORGE_FIRST_ANSWER";

// Where a client goes when nothing names a server: `kforge serve`'s
// default --listen.
inline constexpr char kDefaultServerAddress[] = "127.0.0.1:50051";

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
  // or a file holding one (the first token, base/credentials.h); one of the
  // two. Tokens are only sent over TLS.
  std::string token;
  std::string token_file;

  // What errors call each option: the caller's flag or argument for it
  // ("--tls-ca" in the CLI, "tls_ca" in Python) or the environment variable
  // it came from (ClientSettingsFromEnvironment sets those).
  struct Names {
    std::string tls_ca_file = "tls_ca_file";
    std::string tls_cert_file = "tls_cert_file";
    std::string tls_key_file = "tls_key_file";
    std::string token = "token";
    std::string token_file = "token_file";
  };
  Names names;

  bool UsesTls() const { return tls || !tls_ca_file.empty() || !tls_cert_file.empty(); }
};

// ChannelSecurityOptions with its files read and checked: what a channel's
// credentials are made of, in any language (gRPC's SslCredentialsOptions
// and an access token).
struct ChannelSecurity {
  bool tls = false;
  std::string root_certs_pem;   // "" with tls: the system's roots
  std::string cert_chain_pem;   // "" = no client certificate
  std::string private_key_pem;  // the client certificate's key, or ""
  std::string token;            // "" = none
};

// Reads and checks the options' files. InvalidArgument (FailedPrecondition
// for a file that is not a regular file or too large, NotFound for a
// missing one) naming the option by its name in `options.names`: a
// certificate without its key or a key without its certificate, both a
// token and a token file, a token without TLS, a file that cannot be read,
// a CA or certificate file with no PEM certificate in it, a token that is
// not one, a key that is not the certificate's.
absl::StatusOr<ChannelSecurity> LoadChannelSecurity(const ChannelSecurityOptions& options);

// Every client setting; "" = not given.
struct ClientSettings {
  // A `kforge serve` address (host:port).
  std::string server;
  // A bundle directory (`kforge prebuild`) read with no server; only
  // where the caller accepts one (ClientSource::kServerOrBundle).
  std::string bundle;
  // The public key file the bundle must be signed with ("" = a bundle is
  // read signed or not, as `kforge verify` checks it).
  std::string trust;
  // A directory where a server client keeps a bundle of what it fetched,
  // to run from later with no server.
  std::string local_copy_dir;
  // Whether a server client asks for first answers: "1" / "true" / "yes" /
  // "on" or "0" / "false" / "no" / "off" (any case); ClientSettingsFrom-
  // Environment answers "1", "0" or "" (not given: the client's default).
  std::string first_answer;
  ChannelSecurityOptions security;

  // As ChannelSecurityOptions::Names.
  struct Names {
    std::string server = "address";
    std::string bundle = "bundle";
    std::string trust = "trust";
    std::string local_copy_dir = "local_copy_dir";
    std::string first_answer = "first_answer";
  };
  Names names;
};

// What the caller builds from the settings.
enum class ClientSource {
  kServer,          // a server client: KFORGE_BUNDLE is not read
  kServerOrBundle,  // a kernel source: a server or a bundle
};

// Reads one environment variable (nullptr: unset); std::getenv but in
// tests.
using GetEnv = std::function<const char*(const char* name)>;
const char* ProcessEnv(const char* name);

// The settings a client uses: what `given` says, and where it is silent the
// environment (a variable set to "" counts as unset):
//  - the source: a bundle or server in `given` (never both); else, for
//    kServerOrBundle when `given` has no server setting at all,
//    KFORGE_BUNDLE (not together with KFORGE_SERVER); else KFORGE_SERVER;
//    else kDefaultServerAddress. A bundle takes no server settings: the
//    variables below are then not read; its trust key is `given`'s, else
//    KFORGE_TRUST's (a trust key with a server is an error).
//  - local_copy_dir, tls_ca_file and first_answer: each from its variable
//    (first_answer, given or not, spelled as above, else InvalidArgument
//    naming it).
//  - the client certificate and its key from KFORGE_TLS_CERT and
//    KFORGE_TLS_KEY, and the token from KFORGE_TOKEN or KFORGE_TOKEN_FILE,
//    only when `given` has neither of the pair: a pair is never half given
//    and half from the environment.
// A setting from a variable is named by it in `names` (and so in every
// later error). Checked here, naming the setting: the pairs above (a
// certificate without its key, both a token and a token file), a token
// without TLS, a bundle or local copy path that is not a directory (a local
// copy may not exist yet). The files are read by LoadChannelSecurity.
absl::StatusOr<ClientSettings> ClientSettingsFromEnvironment(const ClientSettings& given,
                                                             ClientSource source,
                                                             const GetEnv& getenv = ProcessEnv);

}  // namespace kforge

#endif  // KFORGE_RUNTIME_CLIENT_SETTINGS_H_
