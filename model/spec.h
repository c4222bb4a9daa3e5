#ifndef KFORGE_MODEL_SPEC_H_
#define KFORGE_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/struct.pb.h"
#include "kforge/v1/service.pb.h"
#include "kforge/v1/spec.pb.h"

namespace kforge {

// Checks every field of a sparse MLA spec. Returns InvalidArgument whose
// message names the field, the value given and what is supported, e.g.
//   "num_q_heads: got 0, supported 1..128".
// (The DSA indexer's: model/indexer_spec.h.)
absl::Status ValidateSpec(const v1::AttentionSpec& spec);

// Returns the canonical form of a valid spec (fields that cannot influence
// the kernel are cleared) so that equal kernels have equal specs. Calls
// ValidateSpec first.
absl::StatusOr<v1::AttentionSpec> NormalizeSpec(const v1::AttentionSpec& spec);

// One row per KV cache dtype kforge builds kernels for: the one table of
// their names, geometry, record sizes and device types. ValidateSpec admits
// exactly these dtypes, the codegen names `device_type` in the
// instantiation unit, and the decode plan checks a cache against the sizes.
// The byte layouts are in templates/kforge/sparse_mla/common/kv_layout.h (the *Sizes
// structs whose functions these point at) and docs/DESIGN.md.
struct KvFormatInfo {
  v1::KvCacheDtype dtype;
  const char* name;         // "bf16", "fp8_ds_mla", ...: KvDtypeName's spelling
  const char* device_type;  // templates/kforge/sparse_mla/common/kv_format.cuh type
  // The spec names how the scales were written (kv_scale_format), and the
  // device type takes it as its template argument (kScalePow2).
  bool takes_scale_format;
  // Records are page-blocked (kv_layout.h): kv_row_stride must be the record.
  bool page_blocked;
  // The geometry the record exists for; null: any.
  bool (*supports)(int kv_lora_rank, int rope_dim);
  const char* geometry;  // `supports` in words, for errors
  int (*bytes_per_token)(int d_qk);
  int (*staging_bytes_per_token)(int d_qk);  // 0: gathered straight into the tile
  int element_bytes;                         // what the cache's strides count
  // Which pipeline a format prefers is measured, per GPU: compiler/tuning.h.
};

// Every row, bf16 first.
const std::vector<KvFormatInfo>& KvFormats();

// The row of `dtype`, or null for a dtype kforge does not build.
const KvFormatInfo* FindKvFormat(v1::KvCacheDtype dtype);

// The row of a spec's cache dtype; bf16's for a dtype kforge does not build
// (which ValidateSpec refuses first).
const KvFormatInfo& KvFormatOf(const v1::AttentionSpec& spec);

// The row of a spec's extra cache dtype (extra_kv); null for a spec
// without an extra cache, bf16's for a dtype kforge does not build.
const KvFormatInfo* ExtraKvFormatOf(const v1::AttentionSpec& spec);

// The one spelling of a KV cache dtype wherever kforge prints one (module
// names, manifests, selections, matrices, flags): KvFormats()'s names
// ("bf16", "fp8_ds_mla", ...); the enum name (or number) for any other value.
std::string KvDtypeName(v1::KvCacheDtype dtype);

// Parses a KV cache dtype: a KvFormats() name (any case), or the enum's
// own names (KV_CACHE_DTYPE_BF16, ...). InvalidArgument listing the names
// otherwise.
absl::StatusOr<v1::KvCacheDtype> ParseKvDtype(std::string_view name);

// The short spelling of a KV scale format: the enum's name without
// KV_SCALE_FORMAT_, in lower case ("pow2", "arbitrary"); the enum name (or
// number) for UNSPECIFIED and values the enum does not name.
std::string KvScaleFormatName(v1::KvScaleFormat format);

// Parses a KV scale format: a short name (any case) or the enum's own
// names (KV_SCALE_FORMAT_POW2, ...). InvalidArgument listing them otherwise.
absl::StatusOr<v1::KvScaleFormat> ParseKvScaleFormat(std::string_view name);

// Spec files and matrices spell a KvCacheDtype or KvScaleFormat field
// either way ParseKvDtype / ParseKvScaleFormat take; protobuf's parsers
// take the enum names only. Rewrites `tree`, the JSON of a `message`
// (AttentionSpec, DeploymentMatrix, ...), so that every string in such a
// field, at any depth (extra_kv, models[].spec) and under either spelling
// of the key, is its enum name. Keys `message` does not have and values of
// other types are left for protobuf's parser to refuse. A name that is
// neither is InvalidArgument naming the field's path as written
// ("models[0].spec.extra_kv.kv_cache_dtype"), the value and the names.
absl::Status ExpandKvEnumNames(const google::protobuf::Descriptor& message,
                               google::protobuf::Value& tree);

struct PresetInfo {
  std::string name;
  int total_heads;
  int kv_lora_rank;
  int rope_dim;
  int topk;
  float softmax_scale;
  // How the model writes an fp8_ds_mla cache's scales.
  v1::KvScaleFormat kv_scale_format;
};

// The model presets of docs/DESIGN.md ("deepseek-v3.2", "glm-5").
const std::vector<PresetInfo>& Presets();

// Builds a spec from a preset: heads = preset heads / tensor_parallel, a
// `kv_dtype` cache (unspecified = bf16; fp8_ds_mla takes the preset's scale
// format), page_block_size 64, return_lse = true. InvalidArgument for an
// unknown preset or a degree that does not divide the heads.
absl::StatusOr<v1::AttentionSpec> SpecFromPreset(
    std::string_view name, int64_t tensor_parallel,
    v1::KvCacheDtype kv_dtype = v1::KV_CACHE_DTYPE_BF16);

// The spec a KernelSelector names: its spec as given, or the preset's
// (PresetRef.kind: the attention at its tensor-parallel degree and KV cache
// dtype, or the model's indexer). Not normalized; InvalidArgument for an
// empty selector or a bad preset.
absl::StatusOr<v1::KernelSpec> SpecOfSelector(const v1::KernelSelector& selector);

// The preset named `name`, or null.
const PresetInfo* FindPreset(std::string_view name);

// `spec` with a `kv_dtype` cache: bf16 clears kv_scale_format; fp8_ds_mla
// keeps the spec's scale format, or takes `default_scale_format` when the
// spec has none (a preset's; UNSPECIFIED leaves validation to name the
// missing field). Does not validate.
v1::AttentionSpec SpecWithKvDtype(const v1::AttentionSpec& spec, v1::KvCacheDtype kv_dtype,
                                  v1::KvScaleFormat default_scale_format);

// Spec files and matrices written before KernelSpec named the kind beside
// a sparse MLA spec's fields (`"kind": "ATTENTION_KIND_SPARSE_MLA_DECODE"`);
// AttentionSpec has no such field now. Removes exactly that key from the
// JSON tree of such a spec, so it reads as the spec it was; any other kind
// stays for the parser to refuse.
void DropFlatSparseKind(google::protobuf::Value& spec_tree);

// Parses a sparse MLA spec (AttentionSpec) given as JSON or as text proto
// (chosen by content: a leading '{' means JSON). Unknown fields are errors
// (one naming a kind or the indexer's fields says how to write a KernelSpec). kv_cache_dtype and
// kv_scale_format (the spec's and extra_kv's) take the short names too
// ("fp8_ds_mla", "pow2": ExpandKvEnumNames), as JSON strings, and in text
// proto as identifiers or strings. Does not validate.
absl::StatusOr<v1::AttentionSpec> ParseSpec(std::string_view text);

// Reads and parses a spec file; errors name the file.
absl::StatusOr<v1::AttentionSpec> LoadSpecFile(const std::string& path);

// A spec of any kind (KernelSpec) given as JSON or text proto:
// `{"sparse_mla_decode": {...}}`, `dsa_indexer { ... }`. A text whose top
// level names no case of KernelSpec is the flat form: a sparse MLA spec's
// fields (ParseSpec). The one parser of spec files: the CLI's --spec and,
// through the C ABI, Python use it. Does not validate.
absl::StatusOr<v1::KernelSpec> ParseSpecText(std::string_view text);

// Reads and parses a spec file (ParseSpecText); errors name the file.
absl::StatusOr<v1::KernelSpec> LoadKernelSpecFile(const std::string& path);

// A KernelSpec of one case.
v1::KernelSpec KernelSpecOf(const v1::AttentionSpec& spec);
v1::KernelSpec KernelSpecOf(const v1::DsaIndexerSpec& spec);

// The user-facing name of a spec's case (CLI --kind, PresetRef.kind,
// matrix kinds); ATTENTION_KIND_UNSPECIFIED when no case is set. The one
// place a case and an AttentionKind meet.
v1::AttentionKind KindOf(const v1::KernelSpec& spec);

// The name of a spec's case as the proto spells it ("sparse_mla_decode",
// "dsa_indexer"), "none" when unset: for errors.
std::string KindCaseName(const v1::KernelSpec& spec);

// NormalizeSpec for a spec of any kind: the case's own validation and
// normalization (NormalizeSpec, NormalizeIndexerSpec). InvalidArgument
// naming `kind` when no case is set.
absl::StatusOr<v1::KernelSpec> NormalizeKernelSpec(const v1::KernelSpec& spec);

}  // namespace kforge

#endif  // KFORGE_MODEL_SPEC_H_
