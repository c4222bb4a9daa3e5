#include "capi/kforge_capi.h"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/types/span.h"
#include "base/absl_compat.h"
#include "base/credentials.h"
#include "bundle/bundle.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/service.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/arch.h"
#include "model/artifact_check.h"
#include "model/decode_plan.h"
#include "model/indexer_plan.h"
#include "model/launch_plan.h"
#include "model/selector.h"
#include "model/spec.h"
#include "runtime/client_settings.h"
#include "runtime/cuda_driver.h"
#include "runtime/cuda_loader.h"
#include "runtime/dsa_indexer.h"
#include "runtime/kernel_module.h"
#include "templates/kforge/sparse_mla/common/params.h"

struct KforgeBundle {
  std::unique_ptr<kforge::BundleSource> source;
};

struct KforgeBundleWriter {
  std::unique_ptr<kforge::BundleWriter> writer;
};

struct KforgeModule {
  std::unique_ptr<kforge::KernelModule> module;
};

namespace {

using kforge::v1::KernelArtifact;
using kforge::v1::Manifest;

// Serialized inputs larger than this are refused before protobuf sees them
// (its parsers take an int size; a real manifest or cubin is well below).
constexpr size_t kMaxMessageBytes = size_t{1} << 30;

char* CopyString(std::string_view s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) throw std::bad_alloc();
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = '\0';
  return out;
}

// Runs `body` (returning absl::Status) and turns its status, or anything it
// throws, into the ABI's code + message.
template <typename Body>
int32_t Call(char** error, Body&& body) {
  if (error != nullptr) *error = nullptr;
  absl::Status status;
  try {
    status = body();
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("out of memory");
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("unexpected exception: ", e.what()));
  } catch (...) {
    status = absl::InternalError("unexpected exception");
  }
  if (!status.ok() && error != nullptr) {
    try {
      *error = CopyString(std::string_view(status.message().data(), status.message().size()));
    } catch (...) {
      *error = nullptr;
    }
  }
  return static_cast<int32_t>(status.code());
}

absl::Status Null(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(kforge::AsAbsl(what), ": NULL"));
}

absl::Status Parse(const uint8_t* data, size_t size, google::protobuf::Message* message,
                   std::string_view what) {
  if (data == nullptr && size != 0) return Null(what);
  if (size > kMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        kforge::AsAbsl(what), ": ", size, " bytes, more than the ", kMaxMessageBytes, " accepted"));
  }
  if (!message->ParseFromArray(data, static_cast<int>(size))) {
    return absl::InvalidArgumentError(absl::StrCat(
        kforge::AsAbsl(what), ": ", size, " bytes do not parse as a ", message->GetTypeName()));
  }
  return absl::OkStatus();
}

absl::Status Output(const google::protobuf::Message& message, uint8_t** out, size_t* out_size,
                    std::string_view what) {
  if (out == nullptr || out_size == nullptr) return Null(what);
  const size_t size = message.ByteSizeLong();
  uint8_t* buffer = static_cast<uint8_t*>(std::malloc(size == 0 ? 1 : size));
  if (buffer == nullptr) throw std::bad_alloc();
  if (!message.SerializeWithCachedSizesToArray(buffer)) {
    std::free(buffer);
    return absl::InternalError(absl::StrCat(kforge::AsAbsl(what), ": cannot serialize"));
  }
  *out = buffer;
  *out_size = size;
  return absl::OkStatus();
}

// A serialized spec in, `convert`'s message out (a C ABI call that maps
// one spec to another).
template <typename Convert>
int32_t ConvertSpec(const uint8_t* spec, size_t spec_size, uint8_t** out, size_t* out_size,
                    std::string_view out_name, char** error, Convert convert) {
  return Call(error, [&]() -> absl::Status {
    kforge::v1::KernelSpec s;
    if (absl::Status p = Parse(spec, spec_size, &s, "spec"); !p.ok()) return p;
    auto converted = convert(s);
    if (!converted.ok()) return converted.status();
    return Output(*converted, out, out_size, out_name);
  });
}

absl::Status OutputString(std::string_view s, char** out, std::string_view what) {
  if (out == nullptr) return Null(what);
  *out = CopyString(s);
  return absl::OkStatus();
}

absl::StatusOr<kforge::DeviceInfo> ToDevice(const KforgeDevice* device) {
  if (device == nullptr) return Null("device");
  if (device->arch == nullptr) return Null("device.arch");
  kforge::DeviceInfo info;
  info.arch = device->arch;
  info.sm_count = device->sm_count;
  info.forced_num_splits = device->forced_num_splits;
  info.max_active_clusters = device->max_active_clusters;
  return info;
}

kforge::v1::KvCacheDtype ToDtype(int32_t value) {
  return static_cast<kforge::v1::KvCacheDtype>(value);
}

kforge::DecodeArgs ToDecodeArgs(const KforgeDecodeArgs& a) {
  kforge::DecodeArgs d;
  d.q = a.q;
  d.kv = a.kv;
  d.indices = a.indices;
  d.out = a.out;
  d.lse = a.lse;
  d.topk_length = a.topk_length;
  d.sink = a.sink;
  d.topk_length_tokens = a.topk_length_tokens;
  d.batch = a.batch;
  d.s_q = a.s_q;
  d.num_q_heads = a.num_q_heads;
  d.d_qk = a.d_qk;
  d.d_v = a.d_v;
  d.topk = a.topk;
  d.page_block_size = a.page_block_size;
  d.num_kv_slots = a.num_kv_slots;
  d.kv_dtype = ToDtype(a.kv_dtype);
  d.q_token_stride = a.q_token_stride;
  d.q_head_stride = a.q_head_stride;
  d.kv_page_stride = a.kv_page_stride;
  d.kv_row_stride = a.kv_row_stride;
  d.indices_stride = a.indices_stride;
  d.out_token_stride = a.out_token_stride;
  d.out_head_stride = a.out_head_stride;
  d.softmax_scale = a.softmax_scale;
  d.extra_kv = a.extra_kv;
  d.extra_indices = a.extra_indices;
  d.extra_topk_length = a.extra_topk_length;
  d.extra_topk = a.extra_topk;
  d.extra_page_block_size = a.extra_page_block_size;
  d.extra_kv_dtype = ToDtype(a.extra_kv_dtype);
  d.extra_num_kv_slots = a.extra_num_kv_slots;
  d.extra_kv_page_stride = a.extra_kv_page_stride;
  d.extra_kv_row_stride = a.extra_kv_row_stride;
  d.extra_indices_stride = a.extra_indices_stride;
  return d;
}

// A C ABI parser of an enum name (model/spec.h's ParseKvDtype and the like):
// the value into *out.
template <class Enum>
int32_t ParseEnumName(const char* name, int32_t* out, const char* out_field,
                      absl::StatusOr<Enum> (*parse)(std::string_view), char** error) {
  return Call(error, [&]() -> absl::Status {
    if (name == nullptr) return Null("name");
    if (out == nullptr) return Null(out_field);
    absl::StatusOr<Enum> value = parse(name);
    if (!value.ok()) return value.status();
    *out = static_cast<int32_t>(*value);
    return absl::OkStatus();
  });
}

// The parameter blocks this library knows (each family's runtime's
// EntryParams), for a KforgeEntryParams that names one.
const kforge::EntryParams* KnownParams(std::string_view struct_name) {
  for (absl::Span<const kforge::EntryParams> family :
       {absl::Span<const kforge::EntryParams>(kforge::kSparseMlaEntryParams),
        absl::Span<const kforge::EntryParams>(kforge::kDsaIndexerEntryParams)}) {
    for (const kforge::EntryParams& p : family) {
      if (struct_name == p.struct_name) return &p;
    }
  }
  return nullptr;
}

// The C structs as the loader's EntryParams (pointing into `expected`).
absl::StatusOr<std::vector<kforge::EntryParams>> ExpectedParams(const KforgeEntryParams* expected,
                                                                size_t count) {
  constexpr size_t kMaxRoles = 64;
  if (expected == nullptr && count != 0) return Null("expected");
  if (count == 0 || count > kMaxRoles) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected_count: ", count, ", supported 1..", kMaxRoles));
  }
  std::vector<kforge::EntryParams> out;
  for (size_t i = 0; i < count; ++i) {
    const KforgeEntryParams& e = expected[i];
    const std::string what = absl::StrCat("expected[", i, "]");
    if (!kforge::v1::EntryRole_IsValid(e.role) || e.role == kforge::v1::ENTRY_ROLE_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".role: ", e.role, " is not a kforge.v1.EntryRole"));
    }
    if (e.reserved != 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ".reserved: ", e.reserved, ", not 0"));
    }
    const auto role = static_cast<kforge::v1::EntryRole>(e.role);
    for (const kforge::EntryParams& seen : out) {
      if (seen.role == role) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ".role: ", kforge::v1::EntryRole_Name(role), " is given twice"));
      }
    }
    const kforge::EntryParams* known =
        e.struct_name != nullptr ? KnownParams(e.struct_name) : nullptr;
    uint64_t bytes = e.params_bytes;
    if (bytes == 0 && known != nullptr) bytes = known->bytes;
    if (bytes == 0 || bytes > kMaxMessageBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".params_bytes: ", e.params_bytes, ", with struct_name ",
                       e.struct_name != nullptr ? absl::StrCat("\"", e.struct_name, "\"") : "NULL",
                       ": not a size, nor a parameter block this library knows"));
    }
    out.push_back({role, static_cast<size_t>(bytes),
                   e.struct_name != nullptr ? e.struct_name : "the caller's block",
                   known != nullptr ? known->defined_in : "templates"});
  }
  return out;
}

absl::StatusOr<const kforge::KernelModule::ModuleEntry*> ModuleEntryAt(const KforgeModule* module,
                                                                       int32_t entry) {
  if (module == nullptr) return Null("module");
  const std::vector<kforge::KernelModule::ModuleEntry>& entries = module->module->entries();
  if (entry < 0 || static_cast<size_t>(entry) >= entries.size()) {
    return absl::OutOfRangeError(absl::StrCat("entry ", entry, ": ", module->module->module_name(),
                                              " lists ", entries.size(), " entries"));
  }
  return &entries[entry];
}

kforge::LaunchDims Dims(uint32_t grid_x, uint32_t grid_y, uint32_t grid_z, uint32_t block_threads,
                        uint32_t dynamic_smem_bytes, bool programmatic) {
  kforge::LaunchDims d;
  d.grid_x = grid_x;
  d.grid_y = grid_y;
  d.grid_z = grid_z;
  d.block_threads = block_threads;
  d.dynamic_smem_bytes = dynamic_smem_bytes;
  d.programmatic = programmatic;
  return d;
}

}  // namespace

extern "C" {

int32_t kforge_capi_version(void) { return KFORGE_CAPI_VERSION; }

size_t kforge_sizeof(const char* struct_name) {
  if (struct_name == nullptr) return 0;
  const std::string_view name(struct_name);
  if (name == "KforgeDevice") return sizeof(KforgeDevice);
  if (name == "KforgeShape") return sizeof(KforgeShape);
  if (name == "KforgeDecodeArgs") return sizeof(KforgeDecodeArgs);
  if (name == "DecodeParams") return sizeof(kforge::sparse_mla::DecodeParams);
  if (name == "CombineParams") return sizeof(kforge::sparse_mla::CombineParams);
  if (name == "KforgeIndexerLogitsArgs") return sizeof(KforgeIndexerLogitsArgs);
  if (name == "KforgeIndexerTopkArgs") return sizeof(KforgeIndexerTopkArgs);
  if (name == "LogitsParams") return sizeof(kforge::dsa_indexer::LogitsParams);
  if (name == "TopkParams") return sizeof(kforge::dsa_indexer::TopkParams);
  if (name == "KforgeEntryParams") return sizeof(KforgeEntryParams);
  return 0;
}

void kforge_free(void* p) { std::free(p); }

size_t kforge_offsetof(const char* struct_name, const char* field) {
  if (struct_name == nullptr || field == nullptr) return SIZE_MAX;
  const std::string_view s(struct_name), f(field);
  using kforge::sparse_mla::CombineParams;
  using kforge::sparse_mla::DecodeParams;
  if (s == "DecodeParams") {
    if (f == "q") return offsetof(DecodeParams, q);
    if (f == "kv") return offsetof(DecodeParams, kv);
    if (f == "indices") return offsetof(DecodeParams, indices);
    if (f == "out") return offsetof(DecodeParams, out);
    if (f == "lse") return offsetof(DecodeParams, lse);
    if (f == "o_accum") return offsetof(DecodeParams, o_accum);
    if (f == "lse_accum") return offsetof(DecodeParams, lse_accum);
    if (f == "topk_length") return offsetof(DecodeParams, topk_length);
    if (f == "sink") return offsetof(DecodeParams, sink);
    if (f == "extra_kv") return offsetof(DecodeParams, extra_kv);
    if (f == "extra_indices") return offsetof(DecodeParams, extra_indices);
    if (f == "extra_topk_length") return offsetof(DecodeParams, extra_topk_length);
  } else if (s == "CombineParams") {
    if (f == "o_accum") return offsetof(CombineParams, o_accum);
    if (f == "lse_accum") return offsetof(CombineParams, lse_accum);
    if (f == "out") return offsetof(CombineParams, out);
    if (f == "lse") return offsetof(CombineParams, lse);
    if (f == "sink") return offsetof(CombineParams, sink);
  }
  return SIZE_MAX;
}

int32_t kforge_decode_pointer_modulus(void) { return kforge::kDecodePointerModulus; }

int32_t kforge_spec_from_preset(const char* name, int32_t tensor_parallel, int32_t kv_dtype,
                                uint8_t** spec, size_t* spec_size, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (name == nullptr) return Null("preset");
    absl::StatusOr<kforge::v1::AttentionSpec> s = kforge::SpecFromPreset(
        name, tensor_parallel, static_cast<kforge::v1::KvCacheDtype>(kv_dtype));
    if (!s.ok()) return s.status();
    return Output(*s, spec, spec_size, "spec");
  });
}

int32_t kforge_parse_kv_dtype(const char* name, int32_t* kv_dtype, char** error) {
  return ParseEnumName(name, kv_dtype, "kv_dtype", kforge::ParseKvDtype, error);
}

int32_t kforge_parse_kv_scale_format(const char* name, int32_t* kv_scale_format, char** error) {
  return ParseEnumName(name, kv_scale_format, "kv_scale_format", kforge::ParseKvScaleFormat, error);
}

int32_t kforge_validate_spec(const uint8_t* spec, size_t spec_size, char** error) {
  return Call(error, [&]() -> absl::Status {
    kforge::v1::KernelSpec s;
    if (absl::Status p = Parse(spec, spec_size, &s, "spec"); !p.ok()) return p;
    return kforge::NormalizeKernelSpec(s).status();
  });
}

int32_t kforge_normalize_spec(const uint8_t* spec, size_t spec_size, uint8_t** normalized,
                              size_t* normalized_size, char** error) {
  return ConvertSpec(spec, spec_size, normalized, normalized_size, "normalized", error,
                     kforge::NormalizeKernelSpec);
}

int32_t kforge_parse_spec(const char* text, size_t text_size, uint8_t** spec, size_t* spec_size,
                          char** error) {
  return Call(error, [&]() -> absl::Status {
    if (text == nullptr && text_size != 0) return Null("text");
    if (text_size > kMaxMessageBytes) {
      return absl::InvalidArgumentError(absl::StrCat("text: ", text_size, " bytes"));
    }
    absl::StatusOr<kforge::v1::KernelSpec> s =
        kforge::ParseSpecText(std::string_view(text == nullptr ? "" : text, text_size));
    if (!s.ok()) return s.status();
    return Output(*s, spec, spec_size, "spec");
  });
}

int32_t kforge_presets(char** names, char** error) {
  return Call(error, [&]() -> absl::Status {
    std::string text;
    for (const kforge::PresetInfo& p : kforge::Presets()) absl::StrAppend(&text, p.name, "\n");
    return OutputString(text, names, "names");
  });
}

int32_t kforge_canonical_arch(const char* name, char** canonical, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (name == nullptr) return Null("arch");
    absl::StatusOr<kforge::Arch> arch = kforge::ParseArch(name);
    if (!arch.ok()) return arch.status();
    return OutputString(arch->name, canonical, "canonical");
  });
}

int32_t kforge_arch_for_capability(int32_t major, int32_t minor, char** arch, char** error) {
  return Call(error, [&]() -> absl::Status {
    absl::StatusOr<std::string> a = kforge::ArchForComputeCapability(major, minor);
    if (!a.ok()) return a.status();
    return OutputString(*a, arch, "arch");
  });
}

int32_t kforge_check_device_arch(const char* arch, int32_t major, int32_t minor, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (arch == nullptr) return Null("arch");
    return kforge::CheckDeviceArch(arch, major, minor);
  });
}

int32_t kforge_select(const uint8_t* manifest, size_t manifest_size, const KforgeDevice* device,
                      const KforgeShape* shape, uint8_t** plan, size_t* plan_size, char** error) {
  return Call(error, [&]() -> absl::Status {
    Manifest m;
    if (absl::Status p = Parse(manifest, manifest_size, &m, "manifest"); !p.ok()) return p;
    absl::StatusOr<kforge::DeviceInfo> d = ToDevice(device);
    if (!d.ok()) return d.status();
    if (shape == nullptr) return Null("shape");
    const kforge::RuntimeShape s{shape->batch,
                                 shape->s_q,
                                 shape->num_q_heads,
                                 shape->topk,
                                 ToDtype(shape->kv_dtype),
                                 shape->page_block_size};
    absl::StatusOr<kforge::Selection> sel = kforge::Select(m, *d, s);
    if (!sel.ok()) return sel.status();
    return Output(kforge::ToLaunchPlan(*sel), plan, plan_size, "plan");
  });
}

int32_t kforge_plan_decode(const uint8_t* manifest, size_t manifest_size,
                           const KforgeDevice* device, const KforgeDecodeArgs* args,
                           uint64_t workspace, uint8_t** plan, size_t* plan_size, char** error) {
  return Call(error, [&]() -> absl::Status {
    Manifest m;
    if (absl::Status p = Parse(manifest, manifest_size, &m, "manifest"); !p.ok()) return p;
    absl::StatusOr<kforge::DeviceInfo> d = ToDevice(device);
    if (!d.ok()) return d.status();
    if (args == nullptr) return Null("args");
    absl::StatusOr<kforge::DecodeLaunch> launch =
        kforge::PlanDecode(m, *d, ToDecodeArgs(*args), workspace);
    if (!launch.ok()) return launch.status();
    return Output(kforge::ToLaunchPlan(*launch), plan, plan_size, "plan");
  });
}

}  // extern "C"

namespace {

// An indexer launch as the LaunchPlan the bindings read (entry, grid,
// block, shared memory, the parameter block's bytes).
template <typename Params>
kforge::v1::LaunchPlan IndexerLaunchPlan(const kforge::IndexerKernelLaunch<Params>& l) {
  kforge::v1::LaunchPlan plan;
  plan.set_main_entry(l.entry);
  plan.set_grid_x(l.grid_x);
  plan.set_grid_y(l.grid_y);
  plan.set_grid_z(l.grid_z);
  plan.set_block_threads(l.block_threads);
  plan.set_dynamic_smem_bytes(l.dynamic_smem_bytes);
  plan.set_main_params(&l.params, sizeof(l.params));
  plan.set_programmatic(l.programmatic);
  return plan;
}

// Parses the module's spec and IndexerLaunch, then `plan` -> a LaunchPlan.
template <typename Plan>
absl::Status PlanIndexer(const uint8_t* spec, size_t spec_size, const uint8_t* launch,
                         size_t launch_size, uint8_t** out, size_t* out_size, Plan plan) {
  kforge::v1::KernelSpec s;
  if (absl::Status p = Parse(spec, spec_size, &s, "spec"); !p.ok()) return p;
  if (!s.has_dsa_indexer()) {
    return absl::InvalidArgumentError(absl::StrCat("spec: got a ", kforge::KindCaseName(s),
                                                   " spec, supported dsa_indexer (the module's)"));
  }
  kforge::v1::IndexerLaunch l;
  if (absl::Status p = Parse(launch, launch_size, &l, "launch"); !p.ok()) return p;
  auto planned = plan(s.dsa_indexer(), l);
  if (!planned.ok()) return planned.status();
  return Output(IndexerLaunchPlan(*planned), out, out_size, "plan");
}

}  // namespace

extern "C" {

int32_t kforge_plan_indexer_logits(const uint8_t* spec, size_t spec_size, const uint8_t* launch,
                                   size_t launch_size, const KforgeIndexerLogitsArgs* args,
                                   uint8_t** plan, size_t* plan_size, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (args == nullptr) return Null("args");
    const KforgeIndexerLogitsArgs& a = *args;
    kforge::IndexerLogitsArgs d;
    d.q = a.q;
    d.weights = a.weights;
    d.index_cache = a.index_cache;
    d.block_table = a.block_table;
    d.context_lens = a.context_lens;
    d.logits = a.logits;
    d.q_row_stride = a.q_row_stride;
    d.weights_row_stride = a.weights_row_stride;
    d.page_stride = a.page_stride;
    d.block_table_stride = a.block_table_stride;
    d.block_table_cols = a.block_table_cols;
    d.logits_stride = a.logits_stride;
    d.logits_cols = a.logits_cols;
    d.batch = a.batch;
    d.s_q = a.s_q;
    d.max_context = a.max_context;
    d.rows = a.rows;
    d.query_start = a.query_start;
    return PlanIndexer(
        spec, spec_size, launch, launch_size, plan, plan_size,
        [&](const kforge::v1::DsaIndexerSpec& s, const kforge::v1::IndexerLaunch& l) {
          return kforge::PlanIndexerLogits(s, l, d);
        });
  });
}

int32_t kforge_plan_indexer_topk(const uint8_t* spec, size_t spec_size, const uint8_t* launch,
                                 size_t launch_size, const KforgeIndexerTopkArgs* args,
                                 uint8_t** plan, size_t* plan_size, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (args == nullptr) return Null("args");
    const KforgeIndexerTopkArgs& a = *args;
    kforge::IndexerTopkArgs d;
    d.logits = a.logits;
    d.context_lens = a.context_lens;
    d.indices = a.indices;
    d.block_table = a.block_table;
    d.slots = a.slots;
    d.logits_stride = a.logits_stride;
    d.indices_stride = a.indices_stride;
    d.block_table_stride = a.block_table_stride;
    d.slots_stride = a.slots_stride;
    d.batch = a.batch;
    d.s_q = a.s_q;
    d.slot_page_size = a.slot_page_size;
    d.max_context = a.max_context;
    d.query_start = a.query_start;
    d.rows = a.rows;
    return PlanIndexer(
        spec, spec_size, launch, launch_size, plan, plan_size,
        [&](const kforge::v1::DsaIndexerSpec& s, const kforge::v1::IndexerLaunch& l) {
          return kforge::PlanIndexerTopk(s, l, d);
        });
  });
}

}  // extern "C"

namespace {

// kforge_kv_layout / kforge_extra_kv_layout: `layout_of` of a valid spec.
int32_t KvLayoutCall(const uint8_t* spec, size_t spec_size, int32_t* row_bytes,
                     int32_t* element_bytes, char** error, bool extra) {
  return Call(error, [&]() -> absl::Status {
    kforge::v1::AttentionSpec s;
    if (absl::Status p = Parse(spec, spec_size, &s, "spec"); !p.ok()) return p;
    if (row_bytes == nullptr) return Null("row_bytes");
    if (element_bytes == nullptr) return Null("element_bytes");
    if (absl::Status v = kforge::ValidateSpec(s); !v.ok()) return v;
    if (extra && !s.has_extra_kv()) {
      return absl::InvalidArgumentError("extra_kv: unset; the spec has no extra KV cache");
    }
    const kforge::KvCacheLayout layout = extra ? kforge::ExtraKvLayoutOf(s) : kforge::KvLayoutOf(s);
    *row_bytes = layout.row_bytes;
    *element_bytes = layout.element_bytes;
    return absl::OkStatus();
  });
}

}  // namespace

extern "C" {

int32_t kforge_kv_layout(const uint8_t* spec, size_t spec_size, int32_t* row_bytes,
                         int32_t* element_bytes, char** error) {
  return KvLayoutCall(spec, spec_size, row_bytes, element_bytes, error, false);
}

int32_t kforge_extra_kv_layout(const uint8_t* spec, size_t spec_size, int32_t* row_bytes,
                               int32_t* element_bytes, char** error) {
  return KvLayoutCall(spec, spec_size, row_bytes, element_bytes, error, true);
}

int32_t kforge_workspace_bytes_for(const uint8_t* manifest, size_t manifest_size,
                                   const KforgeDevice* device, int32_t max_tokens, uint64_t* bytes,
                                   char** error) {
  return Call(error, [&]() -> absl::Status {
    Manifest m;
    if (absl::Status p = Parse(manifest, manifest_size, &m, "manifest"); !p.ok()) return p;
    absl::StatusOr<kforge::DeviceInfo> d = ToDevice(device);
    if (!d.ok()) return d.status();
    if (bytes == nullptr) return Null("bytes");
    absl::StatusOr<uint64_t> need = kforge::WorkspaceBytesFor(m, *d, max_tokens);
    if (!need.ok()) return need.status();
    *bytes = *need;
    return absl::OkStatus();
  });
}

int32_t kforge_check_artifact(const uint8_t* variant, size_t variant_size, const char* arch,
                              const uint8_t* artifact, size_t artifact_size, char** error) {
  return kforge_check_answer(variant, variant_size, arch, artifact, artifact_size, 0, error);
}

int32_t kforge_check_answer(const uint8_t* variant, size_t variant_size, const char* arch,
                            const uint8_t* artifact, size_t artifact_size, int32_t accept_partial,
                            char** error) {
  return Call(error, [&]() -> absl::Status {
    kforge::v1::ManifestVariant v;
    KernelArtifact a;
    if (absl::Status p = Parse(variant, variant_size, &v, "variant"); !p.ok()) return p;
    if (absl::Status p = Parse(artifact, artifact_size, &a, "artifact"); !p.ok()) return p;
    if (arch == nullptr) return Null("arch");
    return kforge::CheckAnswerForVariant(v, arch, a, accept_partial != 0);
  });
}

int32_t kforge_manifest_for_artifact(const uint8_t* artifact, size_t artifact_size,
                                     uint8_t** manifest, size_t* manifest_size, char** error) {
  return Call(error, [&]() -> absl::Status {
    KernelArtifact a;
    if (absl::Status p = Parse(artifact, artifact_size, &a, "artifact"); !p.ok()) return p;
    absl::StatusOr<Manifest> m = kforge::ManifestForArtifact(a);
    if (!m.ok()) return m.status();
    return Output(*m, manifest, manifest_size, "manifest");
  });
}

int32_t kforge_bundle_kernel_path(const char* key, char** path, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (key == nullptr) return Null("key");
    return OutputString(kforge::BundleKernelPath(key), path, "path");
  });
}

int32_t kforge_bundle_manifest_path(const uint8_t* manifest, size_t manifest_size, char** path,
                                    char** error) {
  return Call(error, [&]() -> absl::Status {
    Manifest m;
    if (absl::Status p = Parse(manifest, manifest_size, &m, "manifest"); !p.ok()) return p;
    absl::StatusOr<std::string> rel = kforge::BundleManifestPath(m);
    if (!rel.ok()) return rel.status();
    return OutputString(*rel, path, "path");
  });
}

int32_t kforge_bundle_open(const char* dir, KforgeBundle** bundle, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (dir == nullptr) return Null("dir");
    if (bundle == nullptr) return Null("bundle");
    absl::StatusOr<std::unique_ptr<kforge::BundleSource>> source = kforge::BundleSource::Open(dir);
    if (!source.ok()) return source.status();
    *bundle = new KforgeBundle{*std::move(source)};
    return absl::OkStatus();
  });
}

int32_t kforge_bundle_open_trusted(const char* dir, const char* trust_key_file,
                                   KforgeBundle** bundle, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (dir == nullptr) return Null("dir");
    if (trust_key_file == nullptr) return Null("trust_key_file");
    if (bundle == nullptr) return Null("bundle");
    absl::StatusOr<std::unique_ptr<kforge::BundleSource>> source =
        kforge::BundleSource::Open(dir, trust_key_file);
    if (!source.ok()) return source.status();
    *bundle = new KforgeBundle{*std::move(source)};
    return absl::OkStatus();
  });
}

int32_t kforge_read_credential_file(const char* path, const char* what, char** text, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (path == nullptr) return Null("path");
    if (what == nullptr) return Null("what");
    absl::StatusOr<std::string> read = kforge::ReadCredentialFile(path, what);
    if (!read.ok()) return read.status();
    return OutputString(*read, text, "text");
  });
}

int32_t kforge_read_token_file(const char* path, const char* what, char** token, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (path == nullptr) return Null("path");
    if (what == nullptr) return Null("what");
    absl::StatusOr<std::vector<std::string>> tokens = kforge::ReadTokenFile(path, what);
    if (!tokens.ok()) return tokens.status();
    return OutputString(tokens->front(), token, "token");
  });
}

int32_t kforge_client_settings(const char* given, int32_t allow_bundle, char** settings,
                               char** error) {
  return Call(error, [&]() -> absl::Status {
    if (given == nullptr) return Null("given");
    google::protobuf::Struct object;
    const std::string_view text(given);
    if (text.size() > kMaxMessageBytes ||
        !google::protobuf::util::JsonStringToMessage(
             google::protobuf::StringPiece(text.data(), text.size()), &object)
             .ok()) {
      return absl::InvalidArgumentError("given: not a JSON object");
    }
    kforge::ClientSettings in;
    kforge::ChannelSecurityOptions& security = in.security;
    // Each key, the field it gives and the name errors use for it.
    const std::pair<const char*, std::pair<std::string*, std::string*>> kKeys[] = {
        {"address", {&in.server, &in.names.server}},
        {"bundle", {&in.bundle, &in.names.bundle}},
        {"trust", {&in.trust, &in.names.trust}},
        {"local_copy_dir", {&in.local_copy_dir, &in.names.local_copy_dir}},
        {"first_answer", {&in.first_answer, &in.names.first_answer}},
        {"tls_ca", {&security.tls_ca_file, &security.names.tls_ca_file}},
        {"tls_cert", {&security.tls_cert_file, &security.names.tls_cert_file}},
        {"tls_key", {&security.tls_key_file, &security.names.tls_key_file}},
        {"token", {&security.token, &security.names.token}},
        {"token_file", {&security.token_file, &security.names.token_file}}};
    // Errors call every setting by its key, a given one or one that says
    // how to give it ("set KFORGE_TLS_CA (or give tls_ca)").
    for (const auto& [key, field] : kKeys) *field.second = key;
    for (const auto& [key, value] : object.fields()) {
      const auto* known = std::find_if(std::begin(kKeys), std::end(kKeys),
                                       [&](const auto& k) { return key == k.first; });
      if (known == std::end(kKeys)) {
        return absl::InvalidArgumentError(absl::StrCat("given: unknown setting '", key, "'"));
      }
      if (value.has_null_value()) continue;
      if (!value.has_string_value()) {
        return absl::InvalidArgumentError(absl::StrCat("given: ", key, ": expected a string"));
      }
      *known->second.first = value.string_value();
    }
    absl::StatusOr<kforge::ClientSettings> resolved = kforge::ClientSettingsFromEnvironment(
        in,
        allow_bundle != 0 ? kforge::ClientSource::kServerOrBundle : kforge::ClientSource::kServer);
    if (!resolved.ok()) return resolved.status();
    google::protobuf::Struct out;
    auto& fields = *out.mutable_fields();
    fields["server"].set_string_value(resolved->server);  // "" for a bundle
    fields["bundle"].set_string_value(resolved->bundle);
    fields["trust"].set_string_value(resolved->trust);  // "" for a server
    fields["local_copy_dir"].set_string_value(resolved->local_copy_dir);
    fields["first_answer"].set_string_value(resolved->first_answer);  // "1", "0" or ""
    kforge::ChannelSecurity loaded;
    if (resolved->bundle.empty()) {
      absl::StatusOr<kforge::ChannelSecurity> read =
          kforge::LoadChannelSecurity(resolved->security);
      if (!read.ok()) return read.status();
      loaded = *std::move(read);
    }
    fields["tls"].set_bool_value(loaded.tls);
    fields["root_certificates"].set_string_value(loaded.root_certs_pem);
    fields["certificate_chain"].set_string_value(loaded.cert_chain_pem);
    fields["private_key"].set_string_value(loaded.private_key_pem);
    fields["token"].set_string_value(loaded.token);
    std::string json;
    if (!google::protobuf::util::MessageToJsonString(out, &json).ok()) {
      return absl::InternalError("settings: cannot print as JSON");
    }
    return OutputString(json, settings, "settings");
  });
}

void kforge_bundle_close(KforgeBundle* bundle) { delete bundle; }

int32_t kforge_bundle_manifest(KforgeBundle* bundle, int32_t index, uint8_t** manifest,
                               size_t* manifest_size, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (bundle == nullptr) return Null("bundle");
    const std::vector<Manifest>& all = bundle->source->manifests();
    if (index < 0 || static_cast<size_t>(index) >= all.size()) {
      return absl::OutOfRangeError(
          absl::StrCat("manifest index ", index, ": the bundle holds ", all.size()));
    }
    return Output(all[index], manifest, manifest_size, "manifest");
  });
}

int32_t kforge_bundle_get_manifest(KforgeBundle* bundle, const uint8_t* selector,
                                   size_t selector_size, const char* arch, uint8_t** manifest,
                                   size_t* manifest_size, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (bundle == nullptr) return Null("bundle");
    kforge::v1::KernelSelector sel;
    if (absl::Status p = Parse(selector, selector_size, &sel, "selector"); !p.ok()) return p;
    if (arch == nullptr) return Null("arch");
    absl::StatusOr<Manifest> m = bundle->source->GetManifest(sel, arch);
    if (!m.ok()) return m.status();
    return Output(*m, manifest, manifest_size, "manifest");
  });
}

int32_t kforge_bundle_get_kernel(KforgeBundle* bundle, const uint8_t* variant, size_t variant_size,
                                 const char* arch, uint8_t** artifact, size_t* artifact_size,
                                 char** error) {
  return Call(error, [&]() -> absl::Status {
    if (bundle == nullptr) return Null("bundle");
    kforge::v1::ManifestVariant v;
    if (absl::Status p = Parse(variant, variant_size, &v, "variant"); !p.ok()) return p;
    if (arch == nullptr) return Null("arch");
    absl::StatusOr<kforge::ArtifactRef> a = bundle->source->GetKernel(v, arch);
    if (!a.ok()) return a.status();
    return Output(**a, artifact, artifact_size, "artifact");
  });
}

int32_t kforge_bundle_writer_open(const char* dir, int32_t per_write_locking,
                                  KforgeBundleWriter** writer, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (dir == nullptr) return Null("dir");
    if (writer == nullptr) return Null("writer");
    absl::StatusOr<std::unique_ptr<kforge::BundleWriter>> w =
        kforge::BundleWriter::Open(dir, per_write_locking != 0 ? kforge::BundleLocking::kPerWrite
                                                               : kforge::BundleLocking::kWholeRun);
    if (!w.ok()) return w.status();
    *writer = new KforgeBundleWriter{*std::move(w)};
    return absl::OkStatus();
  });
}

void kforge_bundle_writer_close(KforgeBundleWriter* writer) { delete writer; }

int32_t kforge_bundle_writer_has_kernel(KforgeBundleWriter* writer, const char* key, int32_t* has,
                                        char** error) {
  return Call(error, [&]() -> absl::Status {
    if (writer == nullptr) return Null("writer");
    if (key == nullptr) return Null("key");
    if (has == nullptr) return Null("has");
    *has = writer->writer->HasKernel(key) ? 1 : 0;
    return absl::OkStatus();
  });
}

int32_t kforge_bundle_writer_add_kernel(KforgeBundleWriter* writer, const uint8_t* artifact,
                                        size_t artifact_size, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (writer == nullptr) return Null("writer");
    KernelArtifact a;
    if (absl::Status p = Parse(artifact, artifact_size, &a, "artifact"); !p.ok()) return p;
    return writer->writer->AddKernel(a);
  });
}

int32_t kforge_bundle_writer_add_manifest(KforgeBundleWriter* writer, const uint8_t* manifest,
                                          size_t manifest_size, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (writer == nullptr) return Null("writer");
    Manifest m;
    if (absl::Status p = Parse(manifest, manifest_size, &m, "manifest"); !p.ok()) return p;
    return writer->writer->AddManifest(m);
  });
}

int32_t kforge_bundle_writer_finish(KforgeBundleWriter* writer, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (writer == nullptr) return Null("writer");
    return writer->writer->Finish();
  });
}

int32_t kforge_verify_bundle(const char* dir, int32_t* problems, char** report, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (dir == nullptr) return Null("dir");
    if (problems == nullptr) return Null("problems");
    if (report == nullptr) return Null("report");
    std::string text;
    const std::vector<kforge::BundleProblem> found = kforge::VerifyBundle(dir);
    for (const kforge::BundleProblem& p : found) {
      // One line each: tabs and newlines inside a message become spaces.
      absl::StrAppend(&text, p.path, "\t",
                      absl::StrReplaceAll(p.message, {{"\n", " "}, {"\t", " "}}), "\n");
    }
    *report = CopyString(text);
    *problems = static_cast<int32_t>(found.size());
    return absl::OkStatus();
  });
}

int32_t kforge_cuda_driver_version(int32_t* version, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (version == nullptr) return Null("version");
    absl::StatusOr<const kforge::CudaDriver*> cu = kforge::CudaDriver::Get();
    if (!cu.ok()) return cu.status();
    *version = (*cu)->version();
    return absl::OkStatus();
  });
}

int32_t kforge_module_load(const uint8_t* artifact, size_t artifact_size,
                           const KforgeEntryParams* expected, size_t expected_count,
                           int32_t device_ordinal, KforgeModule** module, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (module == nullptr) return Null("module");
    KernelArtifact a;
    if (absl::Status p = Parse(artifact, artifact_size, &a, "artifact"); !p.ok()) return p;
    absl::StatusOr<std::vector<kforge::EntryParams>> want =
        ExpectedParams(expected, expected_count);
    if (!want.ok()) return want.status();
    if (device_ordinal < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("device_ordinal: ", device_ordinal, ", not a CUDA device ordinal"));
    }
    absl::StatusOr<std::unique_ptr<kforge::KernelModule>> loaded =
        kforge::KernelModule::LoadOnOrdinal(a, *want, device_ordinal);
    if (!loaded.ok()) return loaded.status();
    *module = new KforgeModule{*std::move(loaded)};
    return absl::OkStatus();
  });
}

void kforge_module_close(KforgeModule* module) { delete module; }

int32_t kforge_module_entry(const KforgeModule* module, const char* name, int32_t* index,
                            uint64_t* params_bytes, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (module == nullptr) return Null("module");
    if (name == nullptr) return Null("name");
    if (index == nullptr) return Null("index");
    absl::StatusOr<size_t> i = module->module->EntryIndex(name);
    if (!i.ok()) return i.status();
    *index = static_cast<int32_t>(*i);
    if (params_bytes != nullptr) *params_bytes = module->module->entries()[*i].params_bytes;
    return absl::OkStatus();
  });
}

int32_t kforge_module_load_into_current_context(const KforgeModule* module, char** error) {
  return Call(error, [&]() -> absl::Status {
    if (module == nullptr) return Null("module");
    return module->module->LoadIntoCurrentContext();
  });
}

int32_t kforge_module_set_max_dynamic_smem(const KforgeModule* module, int32_t entry,
                                           uint32_t bytes, char** error) {
  return Call(error, [&]() -> absl::Status {
    absl::StatusOr<const kforge::KernelModule::ModuleEntry*> e = ModuleEntryAt(module, entry);
    if (!e.ok()) return e.status();
    const kforge::KernelModule& m = *module->module;
    return m.SetMaxDynamicSmem((*e)->kernel, (*e)->name, bytes, m.device());
  });
}

int32_t kforge_module_allow_non_portable_cluster(const KforgeModule* module, int32_t entry,
                                                 char** error) {
  return Call(error, [&]() -> absl::Status {
    absl::StatusOr<const kforge::KernelModule::ModuleEntry*> e = ModuleEntryAt(module, entry);
    if (!e.ok()) return e.status();
    const kforge::KernelModule& m = *module->module;
    return m.AllowNonPortableCluster((*e)->kernel, (*e)->name, m.device());
  });
}

int32_t kforge_module_max_active_clusters(const KforgeModule* module, int32_t entry,
                                          uint32_t grid_x, uint32_t grid_y, uint32_t grid_z,
                                          uint32_t block_threads, uint32_t dynamic_smem_bytes,
                                          int32_t* clusters, char** error) {
  return Call(error, [&]() -> absl::Status {
    absl::StatusOr<const kforge::KernelModule::ModuleEntry*> e = ModuleEntryAt(module, entry);
    if (!e.ok()) return e.status();
    if (clusters == nullptr) return Null("clusters");
    absl::StatusOr<int> n = module->module->MaxActiveClusters(
        (*e)->kernel, (*e)->name,
        Dims(grid_x, grid_y, grid_z, block_threads, dynamic_smem_bytes, false));
    if (!n.ok()) return n.status();
    *clusters = *n;
    return absl::OkStatus();
  });
}

int32_t kforge_module_launch(const KforgeModule* module, int32_t entry, const void* params,
                             size_t params_size, uint32_t grid_x, uint32_t grid_y, uint32_t grid_z,
                             uint32_t block_threads, uint32_t dynamic_smem_bytes, void* stream,
                             int32_t programmatic, char** error) {
  return Call(error, [&]() -> absl::Status {
    absl::StatusOr<const kforge::KernelModule::ModuleEntry*> e = ModuleEntryAt(module, entry);
    if (!e.ok()) return e.status();
    if (params == nullptr) return Null("params");
    if (params_size != (*e)->params_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("params_size: ", params_size, " bytes, but ", (*e)->name, " in ",
                       module->module->module_name(), " takes ", (*e)->params_bytes));
    }
    // cuLaunchKernel copies the block before it returns; it is never written.
    return module->module->Launch(
        (*e)->kernel, (*e)->name, const_cast<void*>(params),
        Dims(grid_x, grid_y, grid_z, block_threads, dynamic_smem_bytes, programmatic != 0),
        static_cast<CUstream>(stream));
  });
}

}  // extern "C"
