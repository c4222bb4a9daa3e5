// Compiles every preset kernel for every target arch through NVRTC and checks
// what the cubins hold. Also the NVRTC compile-time number: median and max
// seconds per module are printed and recorded as test properties.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compiler/codegen.h"
#include "compiler/compiler.h"
#include "gtest/gtest.h"
#include "kforge/v1/artifact.pb.h"
#include "kforge/v1/spec.pb.h"
#include "model/arch.h"
#include "model/spec.h"
#include "templates/kforge/sparse_mla/common/params.h"

namespace kforge {
namespace {

struct Job {
  std::string label;  // for failure messages
  v1::AttentionSpec spec;
  std::string arch;
};

struct Outcome {
  absl::StatusOr<v1::KernelArtifact> artifact = absl::UnknownError("not compiled");
};

// Runs the jobs on hardware_concurrency() threads (NVRTC is thread-safe and
// each Compile owns its program); results are in job order.
std::vector<Outcome> CompileAll(const std::vector<Job>& jobs) {
  std::vector<Outcome> outcomes(jobs.size());
  std::atomic<size_t> next{0};
  const KernelCompiler compiler;
  auto worker = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      outcomes[i].artifact = compiler.Compile(KernelSpecOf(jobs[i].spec), jobs[i].arch);
    }
  };
  const unsigned n = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n && t < jobs.size(); ++t) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  return outcomes;
}

const v1::KernelResources* FindKernel(const v1::KernelArtifact& a, const std::string& name) {
  for (const v1::KernelResources& k : a.cubin_info().kernels()) {
    if (k.name() == name) return &k;
  }
  return nullptr;
}

// Everything a served module must satisfy, whatever its spec and arch.
void ExpectGoodArtifact(const Job& job, const v1::KernelArtifact& a) {
  const std::string& where = job.label;
  EXPECT_EQ(a.arch(), job.arch) << where;
  EXPECT_EQ(a.cubin_info().arch(), job.arch) << where;
  EXPECT_FALSE(a.cubin().empty()) << where;
  EXPECT_EQ(a.main_entry(), kMainEntry) << where;
  EXPECT_EQ(a.combine_entry(), kCombineEntry) << where;
  EXPECT_EQ(a.params_bytes(), sizeof(sparse_mla::DecodeParams)) << where;
  EXPECT_EQ(a.combine_params_bytes(), sizeof(sparse_mla::CombineParams)) << where;

  // The entry list names exactly the cubin's kernels, each taking the block
  // its role says.
  std::set<std::string> listed, exported;
  for (const v1::KernelEntry& e : a.entries()) {
    listed.insert(e.name());
    const v1::KernelResources* k = FindKernel(a, e.name());
    ASSERT_NE(k, nullptr) << where << ": no " << e.name();
    EXPECT_EQ(k->param_bytes(), e.params_bytes()) << where << ": " << e.name();
    EXPECT_EQ(e.params_bytes(), e.role() == v1::ENTRY_ROLE_COMBINE
                                    ? sizeof(sparse_mla::CombineParams)
                                    : sizeof(sparse_mla::DecodeParams))
        << where << ": " << e.name();
  }
  for (const v1::KernelResources& k : a.cubin_info().kernels()) exported.insert(k.name());
  EXPECT_EQ(listed, exported) << where;
  EXPECT_EQ(static_cast<size_t>(a.entries_size()), listed.size()) << where << ": a name twice";

  const v1::KernelResources* main_k = FindKernel(a, kMainEntry);
  const v1::KernelResources* combine_k = FindKernel(a, kCombineEntry);
  ASSERT_NE(main_k, nullptr) << where << ": no " << kMainEntry;
  ASSERT_NE(combine_k, nullptr) << where << ": no " << kCombineEntry;

  EXPECT_EQ(main_k->param_bytes(), sizeof(sparse_mla::DecodeParams)) << where;
  EXPECT_EQ(combine_k->param_bytes(), sizeof(sparse_mla::CombineParams)) << where;
  // No spill: the throughput entries are held to the launch rule's
  // ctas_per_sm (three 16-head CTAs on the 227 KB parts: 168 registers).
  // nvfp4's crossover producer spilled 16 B until its e2m1 conversion moved
  // to bf16x2 arithmetic (BENCH.md, "e2m1 to bf16 in bf16 arithmetic").
  // Every entry: the cluster and small-batch entries share the main
  // kernel's code and register budget (the producer's, the S warps'), and
  // a spill there showed only in kforge inspect.
  for (const v1::KernelResources& k : a.cubin_info().kernels()) {
    EXPECT_EQ(k.local_bytes(), 0u)
        << where << ": " << k.name() << " spills (" << k.registers() << " registers)";
  }
  EXPECT_LE(main_k->registers(), 255u) << where;
  EXPECT_LE(combine_k->registers(), 255u) << where;
  // One block per SM must be launchable: the register file is 64K.
  EXPECT_LE(main_k->registers() * a.launch().block_threads(), 65536u) << where;
  // __launch_bounds__ agrees with the launch rule.
  EXPECT_EQ(main_k->max_threads(), a.launch().block_threads()) << where;
  EXPECT_EQ(combine_k->max_threads(), a.launch().combine_block_threads()) << where;
  absl::StatusOr<Arch> arch = ParseArch(job.arch);
  ASSERT_TRUE(arch.ok()) << arch.status();
  EXPECT_LE(static_cast<int>(main_k->static_smem_bytes() + a.launch().dynamic_smem_bytes()),
            arch->max_smem_per_block)
      << where;
}

// Each job's artifact once ExpectGoodArtifact held, null where the compile
// failed (reported as a failure with its error). Module names are unique
// across the jobs.
std::vector<const v1::KernelArtifact*> GoodArtifacts(const std::vector<Job>& jobs,
                                                     const std::vector<Outcome>& outcomes) {
  std::vector<const v1::KernelArtifact*> good(jobs.size(), nullptr);
  std::set<std::string> names;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const absl::StatusOr<v1::KernelArtifact>& a = outcomes[i].artifact;
    if (!a.ok()) {
      ADD_FAILURE() << jobs[i].label << ": " << a.status().ToString().substr(0, 4000);
      continue;
    }
    ExpectGoodArtifact(jobs[i], *a);
    EXPECT_TRUE(names.insert(a->module_name()).second)
        << jobs[i].label << ": duplicate module name " << a->module_name();
    good[i] = &*a;
  }
  return good;
}
// The pointers point into `outcomes`: a temporary would leave them dangling.
std::vector<const v1::KernelArtifact*> GoodArtifacts(const std::vector<Job>&,
                                                     std::vector<Outcome>&&) = delete;

v1::AttentionSpec Preset(const std::string& name, int tp) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset(name, tp);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::AttentionSpec();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// {deepseek-v3.2, glm-5} x tp {1, 2, 4, 8} x 5 archs = 40 (the default
// deployment matrix; s_q is not part of a kernel).
TEST(CompileMatrix, PresetsOnEveryTarget) {
  std::vector<Job> jobs;
  for (const char* preset : {"deepseek-v3.2", "glm-5"}) {
    for (int tp : {1, 2, 4, 8}) {
      for (const char* arch : {"sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a"}) {
        jobs.push_back({absl::StrCat(preset, " tp", tp, " ", arch), Preset(preset, tp), arch});
      }
    }
  }
  ASSERT_EQ(jobs.size(), 40u);

  const auto start = std::chrono::steady_clock::now();
  const std::vector<Outcome> outcomes = CompileAll(jobs);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::set<std::string> keys;
  std::vector<double> seconds;
  const std::vector<const v1::KernelArtifact*> good = GoodArtifacts(jobs, outcomes);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const v1::KernelArtifact* a = good[i];
    if (a == nullptr) continue;
    EXPECT_TRUE(keys.insert(a->key()).second) << jobs[i].label << ": duplicate key " << a->key();
    seconds.push_back(a->compile_seconds());
  }
  ASSERT_FALSE(seconds.empty());
  const double median = Median(seconds);
  const double max = *std::max_element(seconds.begin(), seconds.end());
  // The "NVRTC compile time per kernel" number; reported, never asserted
  // (it depends on the machine and its load).
  RecordProperty("modules", static_cast<int>(seconds.size()));
  RecordProperty("threads", static_cast<int>(std::thread::hardware_concurrency()));
  RecordProperty("compile_seconds_median", absl::StrFormat("%.3f", median));
  RecordProperty("compile_seconds_max", absl::StrFormat("%.3f", max));
  RecordProperty("wall_seconds", absl::StrFormat("%.1f", wall));
  std::printf(
      "NVRTC compile time per kernel over %zu modules on %u threads: "
      "median %.3f s, max %.3f s (wall %.1f s)\n",
      seconds.size(), std::thread::hardware_concurrency(), median, max, wall);
}

// Latent widths and NoPE variants other than the presets'.
TEST(CompileMatrix, OtherLatentWidthsAndNoPe) {
  std::vector<Job> jobs;
  for (const char* arch : {"sm_90a", "sm_120a"}) {
    for (int rank : {64, 256, 512}) {
      for (int rope : {0, 64}) {
        if (rank == 512 && rope == 64) continue;  // the presets
        v1::AttentionSpec spec = Preset("glm-5", 4);
        spec.set_kv_lora_rank(rank);
        spec.set_rope_dim(rope);
        jobs.push_back({absl::StrCat("rank ", rank, " rope ", rope, " ", arch), spec, arch});
      }
    }
  }
  const std::vector<Outcome> outcomes = CompileAll(jobs);
  GoodArtifacts(jobs, outcomes);
}

// Head counts that are not a preset's: one padded tile, uneven groups, and
// every head tile (16/32/48/64) on sm_90a.
TEST(CompileMatrix, OddHeadCounts) {
  std::vector<Job> jobs;
  for (const char* arch : {"sm_90a", "sm_86"}) {
    for (int heads : {1, 3, 24, 40, 48, 80, 100, 128}) {
      v1::AttentionSpec spec = Preset("deepseek-v3.2", 1);
      spec.set_num_q_heads(heads);
      jobs.push_back({absl::StrCat("heads ", heads, " ", arch), spec, arch});
    }
  }
  const std::vector<Outcome> outcomes = CompileAll(jobs);
  const std::vector<const v1::KernelArtifact*> good = GoodArtifacts(jobs, outcomes);
  std::set<uint32_t> sm90_tiles;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (good[i] != nullptr && jobs[i].arch == "sm_90a") {
      sm90_tiles.insert(good[i]->tiling().head_tile());
    }
  }
  EXPECT_EQ(sm90_tiles, (std::set<uint32_t>{16, 32, 48, 64}));
}

// fp8_ds_mla: both presets (deepseek-v3.2 with pow2 scales, glm-5 with
// arbitrary ones) x tp {1, 2, 4, 8} on every arch (sm_80/86 convert e4m3 in
// software), plus NoPE and odd head counts. Prints each module's tiling and
// resources.
TEST(CompileMatrix, Fp8DsMlaOnEveryArch) {
  std::vector<Job> jobs;
  const char* archs[] = {"sm_80",   "sm_86",   "sm_89",   "sm_90a",
                         "sm_100a", "sm_103a", "sm_120a", "sm_121a"};
  for (const char* preset : {"deepseek-v3.2", "glm-5"}) {
    for (int tp : {1, 2, 4, 8}) {
      for (const char* arch : archs) {
        // The preset brings its scale convention (model/spec.cc).
        const v1::AttentionSpec spec = *SpecFromPreset(preset, tp, v1::KV_CACHE_DTYPE_FP8_DS_MLA);
        jobs.push_back({absl::StrCat("fp8 ", preset, " tp", tp, " ", arch), spec, arch});
      }
    }
  }
  for (const char* arch : {"sm_86", "sm_90a"}) {
    for (int heads : {3, 48, 80}) {
      v1::AttentionSpec spec = Preset("glm-5", 1);
      spec.set_num_q_heads(heads);
      spec.set_rope_dim(heads == 3 ? 0 : 64);
      spec.set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
      spec.set_kv_scale_format(v1::KV_SCALE_FORMAT_ARBITRARY);
      jobs.push_back(
          {absl::StrCat("fp8 heads ", heads, " rope ", spec.rope_dim(), " ", arch), spec, arch});
    }
  }
  // NoPE with power-of-two scales on the warp-specialised tilings (64 and
  // 128 heads): the producer's WsRow route is the rope-64 geometry's only
  // (with rope 0 it spilled 8 bytes at 128 heads).
  for (int heads : {64, 128}) {
    v1::AttentionSpec spec = *SpecFromPreset("deepseek-v3.2", 1, v1::KV_CACHE_DTYPE_FP8_DS_MLA);
    spec.set_num_q_heads(heads);
    spec.set_rope_dim(0);
    jobs.push_back({absl::StrCat("fp8 pow2 heads ", heads, " rope 0 sm_90a"), spec, "sm_90a"});
  }
  const std::vector<Outcome> outcomes = CompileAll(jobs);
  const std::vector<const v1::KernelArtifact*> good = GoodArtifacts(jobs, outcomes);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const v1::KernelArtifact* a = good[i];
    if (a == nullptr) continue;
    const v1::KernelResources* main_k = FindKernel(*a, kMainEntry);
    const v1::KernelTiling& t = a->tiling();
    std::printf(
        "%-34s head_tile %2u x%u groups, token_tile %2u, stages %u, warps %2u%s, smem %6u B, "
        "%3u regs, %u B local\n",
        jobs[i].label.c_str(), t.head_tile(), t.num_head_groups(), t.token_tile(), t.stages(),
        t.warps(), t.wgmma() ? " wgmma" : "", a->launch().dynamic_smem_bytes(),
        main_k ? main_k->registers() : 0u, main_k ? main_k->local_bytes() : 0u);
  }
}

// The issue-15 records (DeepSeek-V4 584 B, V4.1 528 B, nvfp4 352 B) on
// every arch, at 64 heads x topk 1152 (DeepSeek-V4.1's shape, the one no
// sm_120 kernel served) and 16 heads: NVRTC builds them, no local memory.
TEST(CompileMatrix, NewRecordsOnEveryArch) {
  std::vector<Job> jobs;
  const char* archs[] = {"sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a", "sm_121a"};
  for (const auto& [dtype, rope] : {std::pair{v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4, 0},
                                    std::pair{v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41, 0},
                                    std::pair{v1::KV_CACHE_DTYPE_NVFP4_DS_MLA, 64}}) {
    for (int heads : {64, 16}) {
      for (const char* arch : archs) {
        v1::AttentionSpec spec = Preset("glm-5", 64 / heads);
        spec.set_kv_cache_dtype(dtype);
        spec.set_rope_dim(rope);
        spec.set_topk(1152);
        jobs.push_back({absl::StrCat(KvDtypeName(dtype), " heads ", heads, " ", arch), spec, arch});
        // With an extra cache of the same record (DeepSeek-V4's sliding
        // window: 128 more keys, pages of 64).
        if (heads == 16) {
          v1::ExtraKvCache* x = spec.mutable_extra_kv();
          x->set_kv_cache_dtype(dtype);
          x->set_topk(128);
          x->set_page_block_size(64);
          jobs.push_back(
              {absl::StrCat(KvDtypeName(dtype), " heads ", heads, " + extra ", arch), spec, arch});
        }
      }
    }
    // 128 heads on sm_90a: two head groups, the crossover pairs.
    v1::AttentionSpec spec = Preset("deepseek-v3.2", 1);
    spec.set_kv_cache_dtype(dtype);
    spec.set_kv_scale_format(v1::KV_SCALE_FORMAT_UNSPECIFIED);
    spec.set_rope_dim(rope);
    jobs.push_back({absl::StrCat(KvDtypeName(dtype), " heads 128 sm_90a"), spec, "sm_90a"});
  }
  const std::vector<Outcome> outcomes = CompileAll(jobs);
  const std::vector<const v1::KernelArtifact*> good = GoodArtifacts(jobs, outcomes);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const v1::KernelArtifact* a = good[i];
    if (a == nullptr) continue;
    const v1::KernelResources* main_k = FindKernel(*a, kMainEntry);
    ASSERT_NE(main_k, nullptr) << jobs[i].label;
    const v1::KernelTiling& t = a->tiling();
    EXPECT_EQ(t.crossover(), a->spec().sparse_mla_decode().num_q_heads() == 128) << jobs[i].label;
    // No entry spills.
    for (const v1::KernelResources& k : a->cubin_info().kernels()) {
      EXPECT_EQ(k.local_bytes(), 0u) << jobs[i].label << ": " << k.name() << " spills";
    }
    std::printf("%-36s head_tile %2u, token_tile %2u, warps %u%s, smem %6u B, %3u regs\n",
                jobs[i].label.c_str(), t.head_tile(), t.token_tile(), t.warps(),
                t.wgmma() ? " wgmma" : "", a->launch().dynamic_smem_bytes(), main_k->registers());
  }
}

}  // namespace
}  // namespace kforge
