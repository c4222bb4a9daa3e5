// Spec parsing: JSON and text-proto AttentionSpec (`--spec FILE`), validation
// and normalization, and KV dtype and scale-format names (ParseSpec,
// NormalizeSpec, ParseKvDtype, ParseKvScaleFormat in model/spec.h).
//
// Properties beyond "no crash, no UB, no leak":
//   - a spec that parses reads back equal from its own JSON and text-format
//     printing (kforge writes specs as JSON into artifact descriptions and
//     manifests, which users feed back as --spec);
//   - NormalizeSpec is idempotent and keeps a spec valid;
//   - a dtype or scale-format name that parses prints (KvDtypeName,
//     KvScaleFormatName) as a name that parses to the same value.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_support.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "kforge/v1/spec.pb.h"
#include "model/spec.h"

namespace {

using kforge::fuzz::Check;

void CheckReadsBack(const kforge::v1::AttentionSpec& spec, const std::string& printed,
                    const char* how) {
  absl::StatusOr<kforge::v1::AttentionSpec> again = kforge::ParseSpec(printed);
  Check(again.ok(), absl::StrCat("spec printed as ", how,
                                 " does not parse: ", again.status().ToString(), "\n", printed));
  Check(kforge::fuzz::SameMessage(spec, *again),
        absl::StrCat("spec printed as ", how, " reads back different: {", spec.ShortDebugString(),
                     "} vs {", again->ShortDebugString(), "}"));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  if (absl::StatusOr<kforge::v1::KvCacheDtype> dtype = kforge::ParseKvDtype(text); dtype.ok()) {
    absl::StatusOr<kforge::v1::KvCacheDtype> again =
        kforge::ParseKvDtype(kforge::KvDtypeName(*dtype));
    Check(again.ok() && *again == *dtype,
          absl::StrCat("kv dtype ", kforge::KvDtypeName(*dtype), " does not read back"));
  }

  if (absl::StatusOr<kforge::v1::KvScaleFormat> format = kforge::ParseKvScaleFormat(text);
      format.ok()) {
    absl::StatusOr<kforge::v1::KvScaleFormat> again =
        kforge::ParseKvScaleFormat(kforge::KvScaleFormatName(*format));
    Check(again.ok() && *again == *format,
          absl::StrCat("kv scale format ", kforge::KvScaleFormatName(*format),
                       " does not read back"));
  }

  // Either form of a spec file: a KernelSpec with its case set prints as
  // JSON that reads back the same.
  if (absl::StatusOr<kforge::v1::KernelSpec> any = kforge::ParseSpecText(text);
      any.ok() && any->kind_case() != kforge::v1::KernelSpec::KIND_NOT_SET) {
    std::string printed;
    Check(google::protobuf::util::MessageToJsonString(*any, &printed).ok(),
          "a parsed KernelSpec does not print as JSON");
    absl::StatusOr<kforge::v1::KernelSpec> again = kforge::ParseSpecText(printed);
    Check(again.ok() && kforge::fuzz::SameMessage(*any, *again),
          absl::StrCat("a KernelSpec printed as JSON reads back different: ", printed));
  }

  absl::StatusOr<kforge::v1::AttentionSpec> spec = kforge::ParseSpec(text);
  if (!spec.ok()) return 0;

  std::string json;
  Check(google::protobuf::util::MessageToJsonString(*spec, &json).ok(),
        "a parsed spec does not print as JSON");
  CheckReadsBack(*spec, json, "JSON");
  std::string proto_text;
  Check(google::protobuf::TextFormat::PrintToString(*spec, &proto_text),
        "a parsed spec does not print as text proto");
  // An all-default spec prints as nothing, which ParseSpec refuses as empty.
  if (!proto_text.empty()) CheckReadsBack(*spec, proto_text, "text proto");

  absl::StatusOr<kforge::v1::AttentionSpec> normalized = kforge::NormalizeSpec(*spec);
  if (!normalized.ok()) return 0;
  absl::StatusOr<kforge::v1::AttentionSpec> twice = kforge::NormalizeSpec(*normalized);
  Check(twice.ok(),
        absl::StrCat("a normalized spec does not validate: ", twice.status().ToString()));
  Check(kforge::fuzz::SameMessage(*normalized, *twice), "NormalizeSpec is not idempotent");
  return 0;
}
