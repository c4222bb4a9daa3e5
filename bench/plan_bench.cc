// Host time of planning one decode call, the part of SparseMlaDecode::Run
// (and of a Python plan-cache miss) that needs no GPU: PlanDecode =
// ValidateDecodeArgs + Select + both parameter blocks. Prints nanoseconds
// per call for two models at batch 1, 32 and 128 (the C++ launch bar of
// issue 11 is 5 us in all, driver launches included).
//
//   build/bench/kforge_plan_bench [ITERATIONS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "compiler/compiler.h"
#include "compiler/manifest.h"
#include "model/decode_plan.h"
#include "model/spec.h"

namespace {

kforge::DecodeArgs ArgsFor(const kforge::v1::AttentionSpec& spec, int batch) {
  kforge::DecodeArgs a;
  const int heads = static_cast<int>(spec.num_q_heads());
  const int d_v = static_cast<int>(spec.kv_lora_rank());
  const int d_qk = d_v + static_cast<int>(spec.rope_dim());
  const int pbs = static_cast<int>(spec.page_block_size());
  a.q = 0x10000000;
  a.kv = 0x20000000;
  a.indices = 0x30000000;
  a.out = 0x40000000;
  a.lse = spec.return_lse() ? 0x50000000 : 0;
  a.batch = batch;
  a.s_q = 1;
  a.num_q_heads = heads;
  a.d_qk = d_qk;
  a.d_v = d_v;
  a.topk = static_cast<int>(spec.topk());
  a.page_block_size = pbs;
  a.num_kv_slots = 1 << 20;
  a.kv_dtype = spec.kv_cache_dtype();
  a.q_head_stride = d_qk;
  a.q_token_stride = static_cast<int64_t>(heads) * d_qk;
  a.kv_row_stride = d_qk;
  a.kv_page_stride = static_cast<int64_t>(pbs) * d_qk;
  a.indices_stride = spec.topk();
  a.out_head_stride = d_v;
  a.out_token_stride = static_cast<int64_t>(heads) * d_v;
  a.softmax_scale = spec.softmax_scale();
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 200000;
  const kforge::KernelCompiler compiler;
  for (const auto& [preset, tp] : {std::pair{"deepseek-v3.2", 1}, std::pair{"glm-5", 8}}) {
    absl::StatusOr<kforge::v1::AttentionSpec> spec = kforge::SpecFromPreset(preset, tp);
    if (!spec.ok()) return 1;
    absl::StatusOr<kforge::v1::Manifest> manifest =
        kforge::BuildManifest(compiler, kforge::KernelSpecOf(*spec), "sm_90a");
    if (!manifest.ok()) {
      std::fprintf(stderr, "%s\n", std::string(manifest.status().message()).c_str());
      return 1;
    }
    const kforge::DeviceInfo device{"sm_90a", 132};
    for (int batch : {1, 32, 128}) {
      const kforge::DecodeArgs args = ArgsFor(*spec, batch);
      uint64_t sink = 0;
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iterations; ++i) {
        absl::StatusOr<kforge::DecodeLaunch> launch =
            kforge::PlanDecode(*manifest, device, args, 0x70000000);
        if (!launch.ok()) {
          std::fprintf(stderr, "%s\n", std::string(launch.status().message()).c_str());
          return 1;
        }
        sink += launch->selection.num_splits;
      }
      const double ns =
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
              .count() /
          iterations;
      std::printf("%-14s tp%d batch %3d: PlanDecode %7.0f ns/call%s\n", preset, tp, batch, ns,
                  sink == 0 ? " (?)" : "");
    }
  }
  return 0;
}
