#ifndef KFORGE_CLI_SERVICE_CMDS_H_
#define KFORGE_CLI_SERVICE_CMDS_H_

#include <string>
#include <vector>

namespace kforge::cli {

// `kforge serve`: runs the gRPC kernel server until SIGTERM/SIGINT.
int Serve(const std::vector<std::string>& argv);
// `kforge get`: fetches one kernel from a server into DIR/<module>.{cubin,json}.
int Get(const std::vector<std::string>& argv);
// `kforge doctor`: checks what `kforge serve` would run with (cache
// directory, Redis, TLS files, workers) and reports the GPU and driver, if
// any; exit 1 when something the server needs is wrong.
int Doctor(const std::vector<std::string>& argv);
// `kforge stats`: prints a server's counters as JSON.
int Stats(const std::vector<std::string>& argv);
// `kforge health`: asks a server's grpc.health.v1 service; exit 0 when it
// says SERVING (the container image's HEALTHCHECK).
int Health(const std::vector<std::string>& argv);

}  // namespace kforge::cli

#endif  // KFORGE_CLI_SERVICE_CMDS_H_
