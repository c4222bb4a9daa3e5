// Deployment-matrix parsing (`kforge prebuild|warm MATRIX`): ParseMatrix and
// ExpandMatrix in deploy/matrix.h, over JSON with short dtype names.
//
// Properties beyond "no crash, no UB, no leak", from matrix.h's contract:
// a matrix that parses expands, twice to the same jobs; every job's spec is
// normalized (NormalizeSpec leaves it as is), its arch canonical, and no
// (spec, arch) comes twice.

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "deploy/matrix.h"
#include "fuzz/fuzz_support.h"
#include "model/arch.h"
#include "model/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kforge::fuzz::Check;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kforge::v1::DeploymentMatrix> matrix = kforge::ParseMatrix(text, "fuzz.json");
  if (!matrix.ok()) return 0;

  absl::StatusOr<std::vector<kforge::MatrixJob>> jobs = kforge::ExpandMatrix(*matrix);
  Check(jobs.ok(), absl::StrCat("a parsed matrix does not expand: ", jobs.status().ToString()));
  absl::StatusOr<std::vector<kforge::MatrixJob>> again = kforge::ExpandMatrix(*matrix);
  Check(again.ok() && again->size() == jobs->size(), "ExpandMatrix is not deterministic");
  std::set<std::pair<std::string, std::string>> seen;
  for (size_t i = 0; i < jobs->size(); ++i) {
    const kforge::MatrixJob& job = (*jobs)[i];
    const kforge::MatrixJob& other = (*again)[i];
    Check(job.label == other.label && job.arch == other.arch &&
              kforge::fuzz::SameMessage(job.spec, other.spec),
          absl::StrCat("ExpandMatrix is not deterministic at job ", i));
    absl::StatusOr<kforge::v1::KernelSpec> normalized = kforge::NormalizeKernelSpec(job.spec);
    Check(normalized.ok() && kforge::fuzz::SameMessage(*normalized, job.spec),
          absl::StrCat(job.label, ": spec is not normalized"));
    Check(!job.spec.has_sparse_mla_decode() ||
              job.spec.sparse_mla_decode().kv_cache_dtype() == job.kv_dtype,
          absl::StrCat(job.label, ": kv_dtype differs from the spec's"));
    Check(kforge::ParseArch(job.arch).ok() && kforge::CanonicalArchName(job.arch) == job.arch,
          absl::StrCat(job.label, ": arch ", job.arch, " is not canonical"));
    Check(seen.emplace(job.spec.SerializeAsString(), job.arch).second,
          absl::StrCat(job.label, ": (spec, arch) twice"));
  }
  return 0;
}
