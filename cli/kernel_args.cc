#include "cli/kernel_args.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "model/indexer_spec.h"
#include "model/spec.h"

namespace kforge::cli {

const std::vector<FlagSpec>& KernelChoiceFlags() {
  static const std::vector<FlagSpec> kFlags = {
      {"preset", "NAME", "model preset: deepseek-v3.2 or glm-5"},
      {"tp", "N", "tensor-parallel degree (divides the preset's heads)", "1"},
      {"spec", "FILE", "a spec file, JSON or text proto (instead of --preset; docs/USAGE.md)"},
      {"kv-dtype", "DTYPE",
       "KV cache dtype: bf16, fp8_ds_mla, fp8_ds_mla_v4, mxfp8_ds_mla_v41 or nvfp4_ds_mla "
       "(fp8_ds_mla: a preset brings its scale format, a spec file must set kv_scale_format; "
       "the V4 records need kv_lora_rank 512 with rope_dim 0)"},
      {"kind", "KIND",
       "which kernel of the preset: sparse-mla (the attention) or dsa-indexer (its DSA "
       "lightning indexer: logits + top-k); default sparse-mla"},
  };
  return kFlags;
}

absl::StatusOr<v1::KernelSelector> SelectorFromArgs(const ParsedArgs& args) {
  if (args.Has("spec") == args.Has("preset")) {
    return absl::InvalidArgumentError(
        "give exactly one of --preset NAME (with --tp N) or --spec FILE");
  }
  v1::KernelSelector selector;
  v1::KvCacheDtype kv_dtype = v1::KV_CACHE_DTYPE_UNSPECIFIED;
  if (args.Has("kv-dtype")) {
    absl::StatusOr<v1::KvCacheDtype> d = ParseKvDtype(args.Get("kv-dtype"));
    if (!d.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-dtype: ", absl::StripPrefix(d.status().message(), "kv dtype: ")));
    }
    kv_dtype = *d;
  }
  absl::StatusOr<v1::AttentionKind> kind =
      args.Has("kind") ? ParseAttentionKind(args.Get("kind"))
                       : absl::StatusOr<v1::AttentionKind>(v1::ATTENTION_KIND_SPARSE_MLA_DECODE);
  if (!kind.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kind: ", absl::StripPrefix(kind.status().message(), "kind: ")));
  }
  if (args.Has("spec") && args.Has("kind")) {
    return absl::InvalidArgumentError("--kind names a preset's kernel; a spec file has its own");
  }
  if (args.Has("spec")) {
    absl::StatusOr<v1::KernelSpec> file = LoadKernelSpecFile(args.Get("spec"));
    if (!file.ok()) return file.status();
    if (kv_dtype != v1::KV_CACHE_DTYPE_UNSPECIFIED && !file->has_sparse_mla_decode()) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-dtype: a ", KindCaseName(*file),
                                                     " spec has no KV cache dtype to replace"));
    }
    *selector.mutable_spec() = *std::move(file);
    if (kv_dtype != v1::KV_CACHE_DTYPE_UNSPECIFIED) {
      *selector.mutable_spec()->mutable_sparse_mla_decode() = SpecWithKvDtype(
          selector.spec().sparse_mla_decode(), kv_dtype, v1::KV_SCALE_FORMAT_UNSPECIFIED);
    }
    return selector;
  }
  selector.mutable_preset()->set_kv_cache_dtype(kv_dtype);
  // Sparse MLA stays unset, so its selectors are the bytes they always were.
  if (*kind == v1::ATTENTION_KIND_DSA_INDEXER) selector.mutable_preset()->set_kind(*kind);
  absl::StatusOr<long long> tp = ParseIntFlag("tp", args.Get("tp"));
  if (!tp.ok()) return tp.status();
  if (*tp > 0xffffffffLL) return absl::InvalidArgumentError("--tp: too large");
  selector.mutable_preset()->set_name(args.Get("preset"));
  selector.mutable_preset()->set_tensor_parallel(static_cast<uint32_t>(*tp));
  return selector;
}

}  // namespace kforge::cli
