#ifndef KFORGE_DEPLOY_MATRIX_H_
#define KFORGE_DEPLOY_MATRIX_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kforge/v1/matrix.pb.h"
#include "kforge/v1/spec.pb.h"

namespace kforge {

// Parses a deployment matrix (JSON, proto/kforge/v1/matrix.proto, described
// in docs/MATRIX.md) and validates it by expanding it. InvalidArgument whose
// message starts with `source_name` and the field path, e.g.
//   "m.json: models[1].tp[0]: tensor_parallel: got 3, supported a divisor
//    of 64 (glm-5 heads)".
absl::StatusOr<v1::DeploymentMatrix> ParseMatrix(std::string_view text,
                                                 std::string_view source_name);

// Reads and parses a matrix file; errors name the file.
absl::StatusOr<v1::DeploymentMatrix> LoadMatrixFile(const std::string& path);

// The matrix used when none is given (deploy/default_matrix.json, built
// into the binary): deepseek-v3.2 and glm-5 at TP 1/2/4/8, bf16 and fp8_ds_mla, on
// sm_80, sm_89, sm_90a, sm_100a and sm_120a. Parsed on each call;
// an error would be a defect of the shipped file (a test pins it).
absl::StatusOr<v1::DeploymentMatrix> DefaultMatrix();

// The text of deploy/default_matrix.json, for `--help` and docs.
std::string_view DefaultMatrixJson();

// One (model, tp, kv dtype, arch) combination of a matrix: the spec an
// engine running that configuration asks for, on one arch. Its manifest
// (compiler/manifest.h) and its kernel are keyed by (spec, arch). A
// model's s_q list is validated but adds no combinations: one kernel
// serves every s_q.
struct MatrixJob {
  std::string model;  // the preset, the entry's name, or "models[i]"
  uint32_t tp = 1;
  v1::KvCacheDtype kv_dtype = v1::KV_CACHE_DTYPE_UNSPECIFIED;
  std::string arch;     // canonical, e.g. "sm_90a"
  v1::KernelSpec spec;  // normalized; an attention spec has per-GPU heads
  std::string label;    // "glm-5 tp8 bf16 sm_90a"
};

// Every combination of the matrix, each (spec, arch) once (the first
// occurrence is kept). Deterministic: models in the matrix's order, then tp
// and kv dtype ascending, then archs in SupportedArchs() order.
// InvalidArgument naming the field path (without a source name) for a
// matrix that does not validate.
absl::StatusOr<std::vector<MatrixJob>> ExpandMatrix(const v1::DeploymentMatrix& matrix);

}  // namespace kforge

#endif  // KFORGE_DEPLOY_MATRIX_H_
