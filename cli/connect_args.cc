#include "cli/connect_args.h"

#include <cstdlib>

#include "grpc/support/log.h"

namespace kforge::cli {
namespace {

// Same bound as the server's: cubins are megabytes, gRPC's default is 4 MB.
constexpr int kMaxMessageBytes = 256 << 20;

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
  FlagSpec flag("server", "ADDR", "kforge server address", "127.0.0.1:50051");
  flag.env = "KFORGE_SERVER";
  return flag;
}

const std::vector<FlagSpec>& ClientSecurityFlags() {
  static const std::vector<FlagSpec> kFlags = {
      {"tls-ca", "FILE", "connect with TLS; the server's certificate must chain to this PEM CA"},
      {"tls-cert", "FILE", "client certificate (PEM) for a server that wants one (mTLS)"},
      {"tls-key", "FILE", "the client certificate's private key (PEM)"},
      {"token-file", "FILE",
       "send the bearer token in FILE (its first token); default: $KFORGE_TOKEN. Needs TLS"}};
  return kFlags;
}

ChannelSecurityOptions ClientSecurityFromArgs(const ParsedArgs& args) {
  ChannelSecurityOptions options;
  options.tls_ca_file = args.Get("tls-ca");
  options.tls_cert_file = args.Get("tls-cert");
  options.tls_key_file = args.Get("tls-key");
  options.token_file = args.Get("token-file");
  if (options.token_file.empty()) {
    const char* env = std::getenv("KFORGE_TOKEN");
    if (env != nullptr) options.token = env;
  }
  return options;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectFromArgs(const std::string& address,
                                                               const ParsedArgs& args) {
  QuietGrpcLog();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(ClientSecurityFromArgs(args));
  if (!credentials.ok()) return credentials.status();
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  channel_args.SetMaxSendMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(address, *std::move(credentials), channel_args);
}

}  // namespace kforge::cli
