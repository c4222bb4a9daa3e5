#include "cli/runtime_cmds.h"

#include <algorithm>
#include <climits>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cli/flags.h"
#include "cli/kernel_args.h"
#include "compiler/compiler.h"
#include "compiler/manifest.h"
#include "google/protobuf/util/json_util.h"
#include "model/selector.h"
#include "model/spec.h"
#include "service/kernel_store.h"

namespace kforge::cli {
namespace {

// An integer flag that must fit an int (and be >= min).
absl::StatusOr<int> IntFlag(const ParsedArgs& args, const std::string& name, int min) {
  absl::StatusOr<long long> v = IntFlagInRange(args, name, min, INT_MAX);
  if (!v.ok()) return v.status();
  return static_cast<int>(*v);
}

// The model flags (KernelChoiceFlags) followed by a command's own.
std::vector<FlagSpec> WithModelFlags(const std::vector<FlagSpec>& own) {
  std::vector<FlagSpec> flags = KernelChoiceFlags();
  flags.insert(flags.end(), own.begin(), own.end());
  return flags;
}

// --preset/--tp or --spec -> spec; --arch -> manifest.
absl::StatusOr<v1::Manifest> ManifestFromArgs(const ParsedArgs& args, v1::KernelSpec* spec_out) {
  if (!args.Has("arch")) {
    return absl::InvalidArgumentError("--arch is required (e.g. --arch sm_90a)");
  }
  absl::StatusOr<v1::KernelSelector> selector = SelectorFromArgs(args);
  if (!selector.ok()) return selector.status();
  absl::StatusOr<v1::KernelSpec> spec = KernelStore::Resolve(*selector);
  if (!spec.ok()) return spec.status();
  if (spec_out != nullptr) *spec_out = *spec;
  KernelCompiler compiler;
  return BuildManifest(compiler, *spec, args.Get("arch"));
}

}  // namespace

int Manifest(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = WithModelFlags(
      {{"arch", "ARCH", "target: sm_80 sm_86 sm_89 sm_90a sm_100a sm_103a sm_120a sm_121a"},
       {"sms", "N", "deprecated, ignored: split counts are evaluated by `kforge select`"},
       {"s-q", "N", "deprecated, ignored: one kernel serves every s_q"},
       {"help", "", "show this help", "", 'h'}});
  absl::StatusOr<ParsedArgs> args = ParseFlags(flags, argv);
  if (!args.ok()) return Fail(args.status());
  if (args->Has("help")) {
    std::cout << "usage: kforge manifest (--preset NAME [--tp N] | --spec FILE) --arch ARCH "
                 "\n\n"
                 "Prints the selection manifest (variants, what each supports, "
                 "launch rules, choice order) as JSON. Plans only; compiles "
                 "nothing.\n\n"
              << FlagsHelp(flags);
    return 0;
  }
  for (const char* ignored : {"sms", "s-q"}) {
    if (args->Has(ignored)) {
      std::cerr << "kforge: --" << ignored << " is deprecated and ignored\n";
    }
  }
  absl::StatusOr<v1::Manifest> manifest = ManifestFromArgs(*args, nullptr);
  if (!manifest.ok()) return Fail(manifest.status());
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Printing a valid message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(*manifest, &json, options);
  std::cout << json;
  return 0;
}

int Select(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = WithModelFlags(
      {{"arch", "ARCH", "arch the manifest is built for"},
       {"sms", "N", "the device's SM count"},
       {"batch", "N", "requests in the decode step"},
       WithAlias({"s-q", "N", "query tokens per request (MTP: 2..4)", "1"}, "sq"),
       {"device-arch", "ARCH", "the device's arch (default: --arch)"},
       {"clusters", "N",
        "16-CTA clusters the device runs at once (what the loaders read with "
        "cuOccupancyMaxActiveClusters: 7 on an H200); 0: no small-batch cluster entry",
        "0"},
       {"heads", "N", "shape override: query heads (default: the model's)"},
       {"topk", "N", "shape override: indices per query token"},
       WithAlias({"page-block-size", "N", "shape override: tokens per KV cache page"}, "page-size"),
       {"help", "", "show this help", "", 'h'}});
  absl::StatusOr<ParsedArgs> args = ParseFlags(flags, argv);
  if (!args.ok()) return Fail(args.status());
  if (args->Has("help")) {
    std::cout << "usage: kforge select (--preset NAME [--tp N] | --spec FILE) --arch ARCH --sms N "
                 "--batch B [--s-q S]\n\n"
                 "Builds the manifest and picks the variant and launch "
                 "configuration for a runtime shape; exit code 1 with a "
                 "\"nothing fits\" report when no variant supports it.\n\n"
              << FlagsHelp(flags);
    return 0;
  }
  for (const char* required : {"sms", "batch"}) {
    if (!args->Has(required)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--", required, " is required")));
    }
  }
  v1::KernelSpec spec;
  absl::StatusOr<v1::Manifest> manifest = ManifestFromArgs(*args, &spec);
  if (!manifest.ok()) return Fail(manifest.status());
  // Only a module with attention entries is selected among; another
  // family's (the indexer's) variant carries its own launch.
  const bool selectable = std::any_of(
      manifest->variants().begin(), manifest->variants().end(), [](const v1::ManifestVariant& v) {
        return std::any_of(v.entries().begin(), v.entries().end(), [](const v1::KernelEntry& e) {
          return e.role() == v1::ENTRY_ROLE_ATTENTION;
        });
      });
  if (!selectable) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "select: ", KindCaseName(spec),
        " has no runtime selection; its manifest's one variant carries the launch (kforge "
        "manifest)")));
  }
  DeviceInfo device;
  device.arch = args->Has("device-arch") ? args->Get("device-arch") : args->Get("arch");
  absl::StatusOr<int> sms = IntFlag(*args, "sms", 0);
  absl::StatusOr<int> batch = IntFlag(*args, "batch", 0);
  if (!sms.ok()) return Fail(sms.status());
  if (!batch.ok()) return Fail(batch.status());
  device.sm_count = *sms;
  absl::StatusOr<int> clusters = IntFlag(*args, "clusters", 0);
  if (!clusters.ok()) return Fail(clusters.status());
  device.max_active_clusters = *clusters;
  RuntimeShape shape;
  shape.batch = *batch;
  absl::StatusOr<int> s_q = IntFlag(*args, "s-q", 1);
  if (!s_q.ok()) return Fail(s_q.status());
  shape.s_q = *s_q;
  const v1::AttentionSpec& attention = spec.sparse_mla_decode();  // selectable above
  shape.num_q_heads = static_cast<int>(attention.num_q_heads());
  shape.topk = static_cast<int>(attention.topk());
  shape.kv_dtype = attention.kv_cache_dtype();
  shape.page_block_size = static_cast<int>(attention.page_block_size());
  struct Override {
    const char* flag;
    int* field;
  };
  for (const Override& o : {Override{"heads", &shape.num_q_heads}, Override{"topk", &shape.topk},
                            Override{"page-block-size", &shape.page_block_size}}) {
    if (!args->Has(o.flag)) continue;
    absl::StatusOr<int> v = IntFlag(*args, o.flag, 0);
    if (!v.ok()) return Fail(v.status());
    *o.field = *v;
  }
  absl::StatusOr<Selection> sel = kforge::Select(*manifest, device, shape);
  if (!sel.ok()) {
    if (sel.status().code() == absl::StatusCode::kNotFound) {
      std::cout << sel.status().message() << "\n";
      return 1;
    }
    return Fail(sel.status());
  }
  std::cout << DescribeSelection(*sel);
  return 0;
}

}  // namespace kforge::cli
