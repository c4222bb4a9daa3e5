#ifndef KFORGE_MODEL_CUBIN_H_
#define KFORGE_MODEL_CUBIN_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "kforge/v1/artifact.pb.h"

namespace kforge {

// Reads a cubin (CUDA ELF) with libelf: the SM arch from the header flags,
// each kernel entry and its registers, static shared memory, parameter bytes
// and local memory. InvalidArgument for anything that is not a CUDA ELF or is
// malformed; every length is checked, so hostile bytes are safe to pass.
// Needs no compiler, so engines can check the kernels they receive with it.
absl::StatusOr<v1::CubinInfo> InspectCubin(std::string_view bytes);

}  // namespace kforge

#endif  // KFORGE_MODEL_CUBIN_H_
