#include "cli/connect_args.h"

#include <cstdlib>
#include <utility>

#include "grpc/support/log.h"

namespace kforge::cli {
namespace {

// Same bound as the server's: cubins are megabytes, gRPC's default is 4 MB.
constexpr int kMaxMessageBytes = 256 << 20;

// The flags' own settings, named by their flags.
ClientSettings GivenSettings(const ParsedArgs& args) {
  ClientSettings given;
  // The flag, else KFORGE_SERVER, else the default: ServerFlag's env and
  // default, the same order as ClientSettingsFromEnvironment's.
  given.server = args.Get("server");
  given.names.server = "--server";
  ChannelSecurityOptions& security = given.security;
  security.tls_ca_file = args.Get("tls-ca");
  security.tls_cert_file = args.Get("tls-cert");
  security.tls_key_file = args.Get("tls-key");
  security.token_file = args.Get("token-file");
  security.names.tls_ca_file = "--tls-ca";
  security.names.tls_cert_file = "--tls-cert";
  security.names.tls_key_file = "--tls-key";
  security.names.token_file = "--token-file";
  return given;
}

// gRPC's own log lines ("E1206 13:20:00.1 ssl_transport_security.cc:1420]
// Handshake failed ...") are dropped: the command says what failed in its
// own words. GRPC_VERBOSITY or GRPC_TRACE set asks for them back.
void DropGrpcLog(gpr_log_func_args*) {}

void QuietGrpcLog() {
  if (std::getenv("GRPC_VERBOSITY") != nullptr || std::getenv("GRPC_TRACE") != nullptr) return;
  gpr_set_log_function(DropGrpcLog);
}

}  // namespace

FlagSpec ServerFlag() {
  FlagSpec flag("server", "ADDR", "kforge server address", kDefaultServerAddress);
  flag.env = kServerVar;
  return flag;
}

const std::vector<FlagSpec>& ClientSecurityFlags() {
  static const std::vector<FlagSpec> kFlags = {
      {"tls-ca", "FILE",
       "connect with TLS; the server's certificate must chain to this PEM CA (env "
       "KFORGE_TLS_CA)"},
      {"tls-cert", "FILE",
       "client certificate (PEM) for a server that wants one (mTLS), with --tls-key (env "
       "KFORGE_TLS_CERT)"},
      {"tls-key", "FILE", "the client certificate's private key (PEM) (env KFORGE_TLS_KEY)"},
      {"token-file", "FILE",
       "send the bearer token in FILE (its first token); needs TLS (env KFORGE_TOKEN_FILE, or "
       "the token itself in KFORGE_TOKEN)"}};
  return kFlags;
}

absl::StatusOr<ClientSettings> ClientSettingsFromArgs(const ParsedArgs& args) {
  return ClientSettingsFromEnvironment(GivenSettings(args), ClientSource::kServer);
}

ChannelSecurityOptions ClientSecurityFromArgs(const ParsedArgs& args) {
  absl::StatusOr<ClientSettings> settings = ClientSettingsFromArgs(args);
  return settings.ok() ? settings->security : GivenSettings(args).security;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectFromArgs(const std::string& address,
                                                               const ParsedArgs& args) {
  QuietGrpcLog();
  absl::StatusOr<ClientSettings> settings = ClientSettingsFromArgs(args);
  if (!settings.ok()) return settings.status();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(settings->security);
  if (!credentials.ok()) return credentials.status();
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  channel_args.SetMaxSendMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(address, *std::move(credentials), channel_args);
}

}  // namespace kforge::cli
