#ifndef KFORGE_COMPILER_NVRTC_H_
#define KFORGE_COMPILER_NVRTC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/embedded_templates.h"

namespace kforge {

struct NvrtcRequest {
  std::string source;                      // the generated instantiation unit
  std::string program_name;                // shown in diagnostics, e.g. "<module>.cu"
  std::string arch;                        // "sm_90a": compiled straight to cubin
  std::vector<std::string> extra_options;  // appended after the base options
  // The only headers the source may #include, matched by exact include name
  // (EmbeddedFile::path). An EMPTY vector means "use EmbeddedTemplates()";
  // there is no way to compile with no headers at all, and no include path on
  // disk is ever searched. The viewed strings must outlive the call.
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

// Compiles to cubin. A failed compile returns Internal with the program name,
// the options and the NVRTC log (truncated past 64 KiB) in the message. An
// empty arch, or one that yields no cubin (a virtual "compute_XX" arch),
// returns InvalidArgument. Thread-safe: each call owns its NVRTC program.
absl::StatusOr<NvrtcResult> CompileWithNvrtc(const NvrtcRequest& request);

// "13.0" from nvrtcVersion() (queried once).
std::string NvrtcVersion();

// Which build of NVRTC this process runs, for the cache key: the version
// plus the GNU build ID of the loaded libnvrtc (read from its PT_NOTE
// segment in memory), e.g. "13.0 build-id 65be0db3...". Two toolkits with
// the same major.minor but another patch or build give different strings.
// Where the library carries no build ID, the SHA-256 of its file stands in.
// Computed once per process.
std::string NvrtcBuildIdentity();

}  // namespace kforge

#endif  // KFORGE_COMPILER_NVRTC_H_
