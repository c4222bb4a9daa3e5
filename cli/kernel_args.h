#ifndef KFORGE_CLI_KERNEL_ARGS_H_
#define KFORGE_CLI_KERNEL_ARGS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "kforge/v1/service.pb.h"

namespace kforge::cli {

// --preset NAME, --tp N, --spec FILE: how a subcommand names a kernel.
const std::vector<FlagSpec>& KernelChoiceFlags();

// Exactly one of --preset (with --tp) or --spec; a spec file is read and
// parsed here, a preset is left for whoever resolves the selector (the
// server resolves presets itself).
absl::StatusOr<v1::KernelSelector> SelectorFromArgs(const ParsedArgs& args);

}  // namespace kforge::cli

#endif  // KFORGE_CLI_KERNEL_ARGS_H_
