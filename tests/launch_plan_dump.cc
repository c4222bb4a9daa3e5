// Prints the launch plans the C++ model library makes, for
// tests/python_client_test.py to compare with what the Python package gets
// through the C ABI (they must be identical, parameter bytes included).
//
// usage: launch_plan_dump MANIFEST.json < CASES
// Each line of CASES: "arch sm_count forced_num_splits batch s_q". Each
// output line is "select <LaunchPlan JSON>" or "select error <code>
// <message>", then the same for "decode": PlanDecode with the DecodeArgs of
// contiguous q [batch, s_q, heads, d_qk], a paged cache of 64 pages with a
// 64-element gap between pages, contiguous indices and out, lse when the
// model returns it, at the fixed addresses below, workspace at kWorkspace.

#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "base/io.h"
#include "google/protobuf/util/json_util.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/service.pb.h"
#include "model/decode_plan.h"
#include "model/launch_plan.h"
#include "model/selector.h"

namespace {

// Addresses the Python side uses too (python_client_test.py PlanParityTest).
constexpr uint64_t kQ = 0x10000000, kKv = 0x20000000, kIndices = 0x30000000, kOut = 0x40000000,
                   kLse = 0x50000000, kWorkspace = 0x60000000;
constexpr int kPages = 64;
constexpr int kPageGap = 64;

std::string Json(const kforge::v1::LaunchPlan& plan) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(plan, &json, options);
  return json;
}

void Print(const char* what, const absl::StatusOr<kforge::v1::LaunchPlan>& plan) {
  if (plan.ok()) {
    std::cout << what << " " << Json(*plan) << "\n";
  } else {
    std::cout << what << " error " << static_cast<int>(plan.status().code()) << " "
              << plan.status().message() << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: launch_plan_dump MANIFEST.json < CASES\n";
    return 2;
  }
  absl::StatusOr<std::string> text = kforge::ReadFile(argv[1], 1 << 20, kforge::Symlinks::kFollow);
  kforge::v1::Manifest manifest;
  if (!text.ok() || !google::protobuf::util::JsonStringToMessage(*text, &manifest).ok() ||
      manifest.variants_size() == 0) {
    std::cerr << "cannot read a manifest from " << argv[1] << "\n";
    return 2;
  }
  const kforge::v1::AttentionSpec& spec = manifest.variants(0).spec().sparse_mla_decode();
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    kforge::DeviceInfo device;
    int batch = 0, s_q = 0;
    if (!(in >> device.arch >> device.sm_count >> device.forced_num_splits >> batch >> s_q)) {
      continue;
    }
    const kforge::RuntimeShape shape{batch,
                                     s_q,
                                     static_cast<int>(spec.num_q_heads()),
                                     static_cast<int>(spec.topk()),
                                     spec.kv_cache_dtype(),
                                     static_cast<int>(spec.page_block_size())};
    absl::StatusOr<kforge::Selection> sel = kforge::Select(manifest, device, shape);
    Print("select", sel.ok() ? absl::StatusOr<kforge::v1::LaunchPlan>(kforge::ToLaunchPlan(*sel))
                             : sel.status());

    kforge::DecodeArgs a;
    const int64_t heads = spec.num_q_heads(), d_v = spec.kv_lora_rank(),
                  d_qk = d_v + spec.rope_dim(), pbs = spec.page_block_size();
    a.q = kQ;
    a.kv = kKv;
    a.indices = kIndices;
    a.out = kOut;
    a.lse = spec.return_lse() ? kLse : 0;
    a.batch = batch;
    a.s_q = s_q;
    a.num_q_heads = static_cast<int>(heads);
    a.d_qk = static_cast<int>(d_qk);
    a.d_v = static_cast<int>(d_v);
    a.topk = static_cast<int>(spec.topk());
    a.page_block_size = static_cast<int>(pbs);
    a.num_kv_slots = kPages * pbs;
    a.kv_dtype = spec.kv_cache_dtype();
    a.q_head_stride = d_qk;
    a.q_token_stride = heads * d_qk;
    a.kv_row_stride = d_qk;
    a.kv_page_stride = pbs * d_qk + kPageGap;
    a.indices_stride = spec.topk();
    a.out_head_stride = d_v;
    a.out_token_stride = heads * d_v;
    a.softmax_scale = spec.softmax_scale();
    absl::StatusOr<kforge::DecodeLaunch> launch =
        kforge::PlanDecode(manifest, device, a, kWorkspace);
    Print("decode", launch.ok()
                        ? absl::StatusOr<kforge::v1::LaunchPlan>(kforge::ToLaunchPlan(*launch))
                        : launch.status());
  }
  return 0;
}
