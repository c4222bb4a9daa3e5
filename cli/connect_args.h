#ifndef KFORGE_CLI_CONNECT_ARGS_H_
#define KFORGE_CLI_CONNECT_ARGS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "grpcpp/grpcpp.h"
#include "runtime/channel.h"
#include "runtime/client_settings.h"

namespace kforge::cli {

// --server ADDR (default 127.0.0.1:50051, else $KFORGE_SERVER): the one
// spelling of the address flag of every client command.
FlagSpec ServerFlag();

// --tls-ca, --tls-cert, --tls-key, --token-file: how `kforge get|stats|warm`
// reach a server that serves TLS or wants a token.
const std::vector<FlagSpec>& ClientSecurityFlags();

// The client settings of the flags above, with what they leave unset from
// the environment (ClientSettingsFromEnvironment: KFORGE_TLS_CA,
// KFORGE_TLS_CERT + KFORGE_TLS_KEY, KFORGE_TOKEN or KFORGE_TOKEN_FILE);
// errors name the flag or the variable.
absl::StatusOr<ClientSettings> ClientSettingsFromArgs(const ParsedArgs& args);

// The security part of ClientSettingsFromArgs, for describing a failed
// call (UsesTls); settings that do not resolve give the flags' own (that
// error is ConnectFromArgs').
ChannelSecurityOptions ClientSecurityFromArgs(const ParsedArgs& args);

// A channel to `address` with the security asked for and kforge's message
// size limits; errors name the flag or the variable.
absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectFromArgs(const std::string& address,
                                                               const ParsedArgs& args);

}  // namespace kforge::cli

#endif  // KFORGE_CLI_CONNECT_ARGS_H_
