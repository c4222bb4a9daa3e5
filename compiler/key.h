#ifndef KFORGE_COMPILER_KEY_H_
#define KFORGE_COMPILER_KEY_H_

#include <string>
#include <string_view>
#include <vector>

#include "base/sha256.h"
#include "kforge/v1/spec.pb.h"
#include "model/format.h"

namespace kforge {

// SHA-256 over (path, contents) of every embedded template header.
const std::string& TemplateDigest();

struct KeyInputs {
  v1::KernelSpec spec;  // normalized
  std::string template_digest;
  std::string nvrtc_version;  // NvrtcBuildIdentity(): version and build
  std::vector<std::string> options;
  std::string arch;
  // CompilePlan::programs, each as its entry names joined by ','.
  std::vector<std::string> programs;
  // PlanOptions::max_smem_per_block: 0 for the arch's own tiling, else the
  // shared-memory budget the tiling was chosen for.
  int max_smem_per_block = 0;
  // PlanOptions::tiling as "head_tile,token_tile,stages,warps"; empty when
  // the planner chose the tiling.
  std::string tiling_request;
  // The small-batch launch rule's floor past a count of query tokens
  // (LaunchRule.min_tiles_max_tokens, min_tiles_per_split_past) as
  // "max_tokens,past"; empty where the rule has none. An artifact with it
  // must not share a key with one planned before it existed, which a cache
  // would otherwise go on serving.
  std::string small_batch_floor;
  int format_version = kFormatVersion;
};

// Hex SHA-256 over a canonical, field-by-field encoding of the inputs (not
// protobuf wire bytes, which are not guaranteed canonical). Identical inputs
// give identical keys on any machine.
std::string ComputeCacheKey(const KeyInputs& inputs);

}  // namespace kforge

#endif  // KFORGE_COMPILER_KEY_H_
