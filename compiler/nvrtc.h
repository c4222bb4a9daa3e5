#ifndef KFORGE_COMPILER_NVRTC_H_
#define KFORGE_COMPILER_NVRTC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/embedded_templates.h"

namespace kforge {

struct NvrtcRequest {
  std::string source;        // the generated instantiation unit
  std::string program_name;  // shown in diagnostics, e.g. "<module>.cu"
  std::string arch;          // "sm_90a": compiled straight to cubin
  std::vector<std::string> extra_options;
  // Headers the source may #include; defaults to EmbeddedTemplates().
  std::vector<EmbeddedFile> headers;
};

struct NvrtcResult {
  std::string cubin;
  std::string log;                   // may be non-empty on success (warnings)
  std::vector<std::string> options;  // exactly what NVRTC was given
  double seconds = 0;
};

// The options every kforge compile uses for `arch` (before extra_options).
// Always contains -no-cache so NVRTC 13 does not silently reuse the
// driver's compute cache.
std::vector<std::string> BaseNvrtcOptions(const std::string& arch);

// Compiles to cubin. Failure returns Internal with the NVRTC log, the options
// and the program name in the message.
absl::StatusOr<NvrtcResult> CompileWithNvrtc(const NvrtcRequest& request);

// "13.0" from nvrtcVersion().
std::string NvrtcVersion();

}  // namespace kforge

#endif  // KFORGE_COMPILER_NVRTC_H_
