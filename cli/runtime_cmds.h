#ifndef KFORGE_CLI_RUNTIME_CMDS_H_
#define KFORGE_CLI_RUNTIME_CMDS_H_

#include <string>
#include <vector>

namespace kforge::cli {

// `kforge manifest`: prints the selection manifest for a preset as JSON
// (planned locally, nothing is compiled).
int Manifest(const std::vector<std::string>& argv);
// `kforge select`: evaluates the manifest for a device and a runtime shape;
// prints the chosen variant and launch configuration, or the "nothing fits"
// report with exit code 1.
int Select(const std::vector<std::string>& argv);

}  // namespace kforge::cli

#endif  // KFORGE_CLI_RUNTIME_CMDS_H_
