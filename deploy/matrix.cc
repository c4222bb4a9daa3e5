#include "deploy/matrix.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/absl_compat.h"
#include "base/io.h"
#include "base/json_keys.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "kforge/v1/matrix.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/arch.h"
#include "model/format.h"
#include "model/indexer_spec.h"
#include "model/spec.h"

namespace kforge {

// Generated from deploy/default_matrix.json at configure time
// (deploy/default_matrix.cc.in).
extern const char kDefaultMatrixJson[];

namespace {

using google::protobuf::RepeatedField;
using google::protobuf::Value;

// Spec models written before KernelSpec may name the sparse kind
// (DropFlatSparseKind); a tree that is not an object with a list of models
// is left for the parser to refuse.
void DropFlatSparseKinds(Value& tree) {
  if (tree.kind_case() != Value::kStructValue) return;
  auto& fields = *tree.mutable_struct_value()->mutable_fields();
  auto models = fields.find("models");
  if (models == fields.end() || models->second.kind_case() != Value::kListValue) return;
  for (Value& model : *models->second.mutable_list_value()->mutable_values()) {
    if (model.kind_case() != Value::kStructValue) continue;
    auto& model_fields = *model.mutable_struct_value()->mutable_fields();
    if (auto spec = model_fields.find("spec"); spec != model_fields.end()) {
      DropFlatSparseKind(spec->second);
    }
  }
}

// JSON -> any-JSON tree -> short names expanded (ExpandKvEnumNames: kv_dtypes,
// and a spec model's kv_cache_dtype and kv_scale_format) -> DeploymentMatrix. The
// detour through google.protobuf.Value costs one extra parse of a small file
// and keeps the message's enum fields typed.
absl::StatusOr<v1::DeploymentMatrix> ParseJson(std::string_view text) {
  if (absl::Status s = CheckNoDuplicateJsonKeys(text, /*proto_names=*/true); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid JSON: ", s.message()));
  }
  Value tree;
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(text.data(), text.size()), &tree);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON: ", std::string(status.message())));
  }
  if (absl::Status s = ExpandKvEnumNames(*v1::DeploymentMatrix::descriptor(), tree); !s.ok()) {
    return s;
  }
  DropFlatSparseKinds(tree);
  std::string json;
  // Printing a Value that was just parsed cannot fail.
  (void)google::protobuf::util::MessageToJsonString(tree, &json);
  v1::DeploymentMatrix matrix;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  status = google::protobuf::util::JsonStringToMessage(json, &matrix, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a deployment matrix: ", std::string(status.message())));
  }
  return matrix;
}

// `status` as InvalidArgument with the field path in front.
absl::Status AtPath(absl::string_view path, const absl::Status& status) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", status.message()));
}

std::string PresetNames() {
  std::vector<absl::string_view> names;
  for (const PresetInfo& p : Presets()) names.push_back(p.name);
  return absl::StrJoin(names, ", ");
}

std::string ArchNames() {
  std::vector<absl::string_view> names;
  for (const Arch& a : SupportedArchs()) names.push_back(a.name);
  return absl::StrJoin(names, ", ");
}

// Canonical arch names in SupportedArchs() order, each once.
absl::StatusOr<std::vector<std::string>> ParseArchList(
    const google::protobuf::RepeatedPtrField<std::string>& names, absl::string_view path) {
  std::vector<Arch> archs;
  for (int i = 0; i < names.size(); ++i) {
    absl::StatusOr<Arch> arch = ParseArch(names[i]);
    if (!arch.ok()) return AtPath(absl::StrCat(path, "[", i, "]"), arch.status());
    archs.push_back(*std::move(arch));
  }
  const auto order = [](const Arch& a) { return std::make_pair(a.sm_version(), a.arch_specific); };
  std::sort(archs.begin(), archs.end(),
            [&](const Arch& a, const Arch& b) { return order(a) < order(b); });
  std::vector<std::string> canonical;
  for (const Arch& a : archs) {
    if (canonical.empty() || canonical.back() != a.name) canonical.push_back(a.name);
  }
  return canonical;
}

// A spec model's spec before tp divides its heads. Its KV dtype defaults
// to bf16 (the list usually names it), and every field but the heads must
// already validate, so that a later error can be pinned on the tp or
// kv_dtypes element that caused it.
absl::StatusOr<v1::AttentionSpec> SpecModelBase(const v1::AttentionSpec& given) {
  v1::AttentionSpec base = given;
  if (base.kv_cache_dtype() == v1::KV_CACHE_DTYPE_UNSPECIFIED) {
    base.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_BF16);
  }
  if (base.num_q_heads() == 0) {
    return absl::InvalidArgumentError(
        "num_q_heads: got 0, supported the model's total head count (tp "
        "divides it)");
  }
  v1::AttentionSpec probe = base;
  probe.set_num_q_heads(1);  // checked per tp, after the division
  if (absl::Status s = ValidateSpec(probe); !s.ok()) return s;
  return base;
}

// The per-GPU spec of a model at one tensor-parallel degree.
absl::StatusOr<v1::AttentionSpec> SpecAtTp(const v1::ModelEntry& model,
                                           const v1::AttentionSpec& base, uint32_t tp) {
  if (model.has_preset()) {
    return SpecFromPreset(model.preset(), static_cast<int>(tp));
  }
  if (tp == 0 || base.num_q_heads() % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel: got ", tp,
                                                   ", supported a divisor of ", base.num_q_heads(),
                                                   " (the spec's num_q_heads)"));
  }
  v1::AttentionSpec spec = base;
  spec.set_num_q_heads(base.num_q_heads() / tp);
  return NormalizeSpec(spec);
}

// The sorted distinct values of a list field (`fallback` when it is empty).
// Each is checked by applying it to `valid`, a spec that validates, so an
// error names the element: "models[0].s_q[1]: s_q: got 5, supported 1..4".
template <typename T>
absl::StatusOr<std::vector<T>> CheckedValues(
    const RepeatedField<T>& values, T fallback, absl::string_view path,
    const v1::AttentionSpec& valid, const std::function<void(v1::AttentionSpec&, T)>& apply) {
  std::vector<T> out;
  for (int i = 0; i < values.size(); ++i) {
    v1::AttentionSpec probe = valid;
    apply(probe, values[i]);
    if (absl::Status s = ValidateSpec(probe); !s.ok()) {
      return AtPath(absl::StrCat(path, "[", i, "]"), s);
    }
    out.push_back(values[i]);
  }
  if (out.empty()) out.push_back(fallback);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Collects the jobs of a matrix, each (spec, arch) once.
class Expansion {
 public:
  void Add(MatrixJob job) {
    if (seen_.insert({job.spec.SerializeAsString(), job.arch}).second) {
      jobs_.push_back(std::move(job));
    }
  }
  std::vector<MatrixJob> Take() { return std::move(jobs_); }

 private:
  std::set<std::pair<std::string, std::string>> seen_;
  std::vector<MatrixJob> jobs_;
};

// One per-GPU spec (a tp of a model) and what it is expanded over.
struct TpSpec {
  uint32_t tp;
  v1::AttentionSpec spec;
};

absl::StatusOr<std::vector<TpSpec>> ModelTpSpecs(const v1::ModelEntry& model,
                                                 absl::string_view path, v1::AttentionSpec* base) {
  switch (model.model_case()) {
    case v1::ModelEntry::kPreset: {
      absl::StatusOr<v1::AttentionSpec> s = SpecFromPreset(model.preset(), 1);
      if (!s.ok()) return AtPath(absl::StrCat(path, ".preset"), s.status());
      *base = *std::move(s);
      break;
    }
    case v1::ModelEntry::kSpec: {
      absl::StatusOr<v1::AttentionSpec> s = SpecModelBase(model.spec());
      if (!s.ok()) return AtPath(absl::StrCat(path, ".spec"), s.status());
      *base = *std::move(s);
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(path, ": names no model; give \"preset\" (",
                                                     PresetNames(), ") or \"spec\""));
  }
  std::vector<TpSpec> out;
  for (int i = 0; i < model.tp_size(); ++i) {
    absl::StatusOr<v1::AttentionSpec> s = SpecAtTp(model, *base, model.tp(i));
    if (!s.ok()) return AtPath(absl::StrCat(path, ".tp[", i, "]"), s.status());
    out.push_back({model.tp(i), *std::move(s)});
  }
  if (out.empty()) {
    absl::StatusOr<v1::AttentionSpec> s = SpecAtTp(model, *base, 1);
    if (!s.ok()) return AtPath(absl::StrCat(path, ".tp (default [1])"), s.status());
    out.push_back({1, *std::move(s)});
  }
  std::sort(out.begin(), out.end(), [](const TpSpec& a, const TpSpec& b) { return a.tp < b.tp; });
  out.erase(std::unique(out.begin(), out.end(),
                        [](const TpSpec& a, const TpSpec& b) { return a.tp == b.tp; }),
            out.end());
  return out;
}

absl::Status ExpandModel(const v1::ModelEntry& model, int index,
                         const std::vector<std::string>& matrix_archs, Expansion& expansion) {
  const std::string path = absl::StrCat("models[", index, "]");
  v1::AttentionSpec base;
  absl::StatusOr<std::vector<TpSpec>> tp_specs = ModelTpSpecs(model, path, &base);
  if (!tp_specs.ok()) return tp_specs.status();
  // Any tp spec validates; dtypes and s_q values are checked against it.
  // s_q values are only checked: s_q is not part of the kernel (one kernel
  // serves every s_q), so they add no jobs. The field stays so that
  // matrices written for kforge 0.1 still load.
  const v1::AttentionSpec& valid = tp_specs->front().spec;
  // fp8_ds_mla takes a preset's scale format; a spec model must name its own.
  const PresetInfo* preset = model.has_preset() ? FindPreset(model.preset()) : nullptr;
  const v1::KvScaleFormat default_scale =
      preset != nullptr ? preset->kv_scale_format : v1::KV_SCALE_FORMAT_UNSPECIFIED;
  auto with_dtype = [default_scale](const v1::AttentionSpec& s, int d) {
    return SpecWithKvDtype(s, static_cast<v1::KvCacheDtype>(d), default_scale);
  };
  absl::StatusOr<std::vector<int>> dtypes =
      CheckedValues<int>(model.kv_dtypes(), base.kv_cache_dtype(), absl::StrCat(path, ".kv_dtypes"),
                         valid, [&](v1::AttentionSpec& s, int d) { s = with_dtype(s, d); });
  if (!dtypes.ok()) return dtypes.status();
  if (absl::Status s =
          CheckedValues<uint32_t>(model.s_q(), 1, absl::StrCat(path, ".s_q"), valid,
                                  [](v1::AttentionSpec& s, uint32_t v) { s.set_s_q(v); })
              .status();
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<std::string>> archs =
      ParseArchList(model.archs(), absl::StrCat(path, ".archs"));
  if (!archs.ok()) return archs.status();
  if (archs->empty()) *archs = matrix_archs;
  if (archs->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ".archs: empty and the matrix names no archs; supported ", ArchNames()));
  }
  const std::string name = model.has_preset()     ? model.preset()
                           : model.name().empty() ? path
                                                  : model.name();
  bool attention = model.kinds().empty();
  bool indexer = false;
  for (int i = 0; i < model.kinds_size(); ++i) {
    if (model.kinds(i) == v1::ATTENTION_KIND_SPARSE_MLA_DECODE) {
      attention = true;
    } else if (model.kinds(i) == v1::ATTENTION_KIND_DSA_INDEXER && model.has_preset()) {
      indexer = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ".kinds[", i, "]: got ", v1::AttentionKind_Name(model.kinds(i)),
          ", supported ATTENTION_KIND_SPARSE_MLA_DECODE, or ATTENTION_KIND_DSA_INDEXER for a "
          "preset"));
    }
  }
  for (const TpSpec& tp : attention ? *tp_specs : std::vector<TpSpec>{}) {
    for (int dtype : *dtypes) {
      MatrixJob job;
      job.model = name;
      job.tp = tp.tp;
      job.kv_dtype = static_cast<v1::KvCacheDtype>(dtype);
      job.spec = KernelSpecOf(with_dtype(tp.spec, dtype));
      for (const std::string& arch : *archs) {
        job.arch = arch;
        job.label = absl::StrCat(name, " tp", tp.tp, " ", KvDtypeName(job.kv_dtype), " ", arch);
        expansion.Add(job);
      }
    }
  }
  if (indexer) {
    absl::StatusOr<v1::DsaIndexerSpec> spec = IndexerSpecFromPreset(model.preset(), 1);
    if (!spec.ok()) return AtPath(absl::StrCat(path, ".kinds"), spec.status());
    for (const std::string& arch : *archs) {
      MatrixJob job;
      job.model = name;
      job.spec = KernelSpecOf(*spec);
      job.arch = arch;
      job.label = absl::StrCat(name, " dsa-indexer ", arch);
      expansion.Add(job);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<MatrixJob>> ExpandMatrix(const v1::DeploymentMatrix& matrix) {
  if (matrix.models().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("models: empty; name at least one (presets: ", PresetNames(), ")"));
  }
  absl::StatusOr<std::vector<std::string>> archs = ParseArchList(matrix.archs(), "archs");
  if (!archs.ok()) return archs.status();
  Expansion expansion;
  for (int i = 0; i < matrix.models_size(); ++i) {
    absl::Status s = ExpandModel(matrix.models(i), i, *archs, expansion);
    if (!s.ok()) return s;
  }
  return expansion.Take();
}

absl::StatusOr<v1::DeploymentMatrix> ParseMatrix(std::string_view text,
                                                 std::string_view source_name) {
  absl::StatusOr<v1::DeploymentMatrix> matrix = ParseJson(text);
  absl::Status status = matrix.status();
  if (status.ok()) status = ExpandMatrix(*matrix).status();
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(AsAbsl(source_name), ": ", status.message()));
  }
  return matrix;
}

absl::StatusOr<v1::DeploymentMatrix> LoadMatrixFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path, kMaxMatrixFileBytes, Symlinks::kFollow);
  if (!text.ok()) return text.status();
  return ParseMatrix(*text, path);
}

std::string_view DefaultMatrixJson() { return kDefaultMatrixJson; }

absl::StatusOr<v1::DeploymentMatrix> DefaultMatrix() {
  return ParseMatrix(DefaultMatrixJson(), "default_matrix.json");
}

}  // namespace kforge
