#ifndef KFORGE_CLI_WORKER_FAULTS_H_
#define KFORGE_CLI_WORKER_FAULTS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "service/compile_pool.h"

namespace kforge::cli {

// Hidden flags of the commands that run compile workers (`serve`,
// `prebuild`) for process-level tests: --test-worker-crash-topk N and
// --test-worker-hang-topk N make a worker crash or hang on that topk
// (WorkerFaults). Not in the help; nothing in production sets them.
std::vector<FlagSpec> WorkerFaultFlags();
absl::StatusOr<WorkerFaults> WorkerFaultsFromArgs(const ParsedArgs& args);

}  // namespace kforge::cli

#endif  // KFORGE_CLI_WORKER_FAULTS_H_
