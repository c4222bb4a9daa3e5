#include "cli/kernel_args.h"

#include "absl/status/status.h"
#include "model/spec.h"

namespace kforge::cli {

const std::vector<FlagSpec>& KernelChoiceFlags() {
  static const std::vector<FlagSpec> kFlags = {
      {"preset", "NAME", "model preset: deepseek-v3.2 or glm-5"},
      {"tp", "N", "tensor-parallel degree (divides the preset's heads)", "1"},
      {"spec", "FILE", "full AttentionSpec as JSON or text proto (instead of --preset)"},
  };
  return kFlags;
}

absl::StatusOr<v1::KernelSelector> SelectorFromArgs(const ParsedArgs& args) {
  if (args.Has("spec") == args.Has("preset")) {
    return absl::InvalidArgumentError(
        "give exactly one of --preset NAME (with --tp N) or --spec FILE");
  }
  v1::KernelSelector selector;
  if (args.Has("spec")) {
    absl::StatusOr<v1::AttentionSpec> spec = LoadSpecFile(args.Get("spec"));
    if (!spec.ok()) return spec.status();
    *selector.mutable_spec() = *std::move(spec);
    return selector;
  }
  absl::StatusOr<long long> tp = ParseIntFlag("tp", args.Get("tp"));
  if (!tp.ok()) return tp.status();
  if (*tp > 0xffffffffLL) return absl::InvalidArgumentError("--tp: too large");
  selector.mutable_preset()->set_name(args.Get("preset"));
  selector.mutable_preset()->set_tensor_parallel(static_cast<uint32_t>(*tp));
  return selector;
}

}  // namespace kforge::cli
