// The engine-side CUDA runtime: arch compatibility, driver errors, argument
// validation and parameter filling run everywhere (no GPU, no driver); one
// decode against the fp64 reference runs where a driver and a GPU exist and
// is skipped elsewhere.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "bundle/kernel_source.h"
#include "compiler/codegen.h"
#include "compiler/compiler.h"
#include "compiler/manifest.h"
#include "gtest/gtest.h"
#include "model/launch.h"
#include "model/launch_plan.h"
#include "model/selector.h"
#include "model/spec.h"
#include "runtime/cuda_driver.h"
#include "runtime/cuda_loader.h"
#include "runtime/kernel_module.h"
#include "runtime/sparse_mla_decode.h"
#include "templates/kforge/sparse_mla/common/kv_layout.h"
#include "templates/kforge/sparse_mla/common/params.h"
#include "templates/kforge/sparse_mla/common/tiling.h"
#include "tests/reference/sparse_mla_reference.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

using ::kforge::testing::Contains;

// Serves manifests and kernels straight from the compiler (no server, no
// bundle), counting calls.
class CompilingSource : public KernelSource {
 public:
  absl::StatusOr<v1::Manifest> GetManifest(const v1::KernelSelector& kernel,
                                           std::string_view arch) override {
    ++manifest_calls;
    absl::StatusOr<v1::KernelSpec> spec = SpecOfSelector(kernel);
    if (!spec.ok()) return spec.status();
    return BuildManifest(compiler_, *spec, arch);
  }
  absl::StatusOr<ArtifactRef> GetKernel(const v1::ManifestVariant& variant,
                                        std::string_view arch) override {
    ++kernel_calls;
    absl::StatusOr<CompilePlan> plan = compiler_.Plan(variant.spec(), arch);
    if (!plan.ok()) return plan.status();
    // With first_answer, what a server answers a first-answer client on a
    // miss: the module's main and combine entries (where it has more).
    std::optional<v1::KernelArtifact> first;
    absl::StatusOr<v1::KernelArtifact> artifact = compiler_.Build(
        *plan, first_answer ? KernelCompiler::FirstAnswerSink(
                                  [&first](v1::KernelArtifact a) { first = std::move(a); })
                            : nullptr);
    if (!artifact.ok()) return artifact.status();
    if (first.has_value()) {
      ++first_answers;
      return std::make_shared<const v1::KernelArtifact>(*std::move(first));
    }
    return std::make_shared<const v1::KernelArtifact>(*std::move(artifact));
  }

  bool first_answer = false;
  std::atomic<int> manifest_calls{0};
  std::atomic<int> kernel_calls{0};
  std::atomic<int> first_answers{0};

 private:
  KernelCompiler compiler_;
};

v1::KernelSelector Glm5Tp8Selector() {
  v1::KernelSelector selector;
  selector.mutable_preset()->set_name("glm-5");
  selector.mutable_preset()->set_tensor_parallel(8);
  return selector;
}

v1::Manifest ManifestFor(const v1::AttentionSpec& spec, const std::string& arch) {
  absl::StatusOr<v1::Manifest> m = BuildManifest(KernelCompiler(), KernelSpecOf(spec), arch);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : v1::Manifest();
}

v1::AttentionSpec Glm5Tp8() {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("glm-5", 8);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::AttentionSpec();
}

// Valid args for glm-5 at TP 8 (8 heads, d_qk 576, d_v 512, topk 2048,
// page 64, scale 1/16): dense strides, distinct aligned fake pointers.
DecodeArgs ValidArgs(int batch = 4) {
  DecodeArgs a;
  a.q = 0x10000000;
  a.kv = 0x20000000;
  a.indices = 0x30000000;
  a.out = 0x40000000;
  a.lse = 0x50000000;
  a.batch = batch;
  a.s_q = 1;
  a.num_q_heads = 8;
  a.d_qk = 576;
  a.d_v = 512;
  a.topk = 2048;
  a.page_block_size = 64;
  a.num_kv_slots = 100 * 64;
  a.q_head_stride = 576;
  a.q_token_stride = 8 * 576;
  a.kv_row_stride = 576;
  a.kv_page_stride = 64 * 576;
  a.indices_stride = 2048;
  a.out_head_stride = 512;
  a.out_token_stride = 8 * 512;
  a.softmax_scale = 0.0625;
  return a;
}

TEST(CheckDeviceArch, FollowsNvidiaCubinCompatibility) {
  struct Case {
    const char* arch;
    int major, minor;
    bool runs;
  };
  const Case cases[] = {
      // Plain SASS: same major, minor >= the cubin's; never across majors.
      {"sm_80", 8, 0, true},
      {"sm_80", 8, 6, true},
      {"sm_80", 8, 9, true},
      {"sm_80", 9, 0, false},
      {"sm_80", 7, 5, false},
      {"sm_86", 8, 0, false},
      {"sm_86", 8, 9, true},
      {"sm_89", 8, 6, false},
      {"sm_90", 9, 0, true},
      {"sm_120", 12, 1, true},
      {"sm_120", 10, 0, false},
      // Arch-specific: exactly that compute capability.
      {"sm_90a", 9, 0, true},
      {"sm_90a", 8, 9, false},
      {"sm_90a", 10, 0, false},
      {"sm_100a", 10, 0, true},
      {"sm_100a", 10, 3, false},
      {"sm_120a", 12, 0, true},
      {"sm_120a", 12, 1, false},
      {"sm_121a", 12, 1, true},
      // Family-specific: the family's later members too.
      {"sm_100f", 10, 0, true},
      {"sm_100f", 10, 3, true},
      {"sm_100f", 12, 0, false},
  };
  for (const Case& c : cases) {
    const absl::Status s = CheckDeviceArch(c.arch, c.major, c.minor);
    EXPECT_EQ(s.ok(), c.runs) << c.arch << " on " << c.major << "." << c.minor << ": " << s;
    if (!c.runs) {
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    }
  }
}

TEST(CheckDeviceArch, MessageNamesBothAndTheArchToAskFor) {
  const absl::Status s = CheckDeviceArch("sm_90a", 8, 9);
  EXPECT_TRUE(Contains(s.message(),
                       "kernel built for sm_90a cannot run on a compute capability 8.9 "
                       "device"));
  EXPECT_TRUE(Contains(s.message(), "built for sm_89"));
}

TEST(CheckDeviceArch, MalformedArchIsInvalidArgument) {
  for (const char* arch : {"", "sm_9", "sm_1200", "sm_90x", "sm_a", "sm_-90"}) {
    EXPECT_EQ(CheckDeviceArch(arch, 9, 0).code(), absl::StatusCode::kInvalidArgument)
        << "\"" << arch << "\"";
  }
}

// ParseArch's spellings, as everywhere else in kforge.
TEST(CheckDeviceArch, TakesEverySpellingParseArchTakes) {
  for (const char* arch : {"90a", "SM_90A", " sm_90a "}) {
    EXPECT_TRUE(CheckDeviceArch(arch, 9, 0).ok()) << "\"" << arch << "\"";
  }
}

TEST(ArchForComputeCapability, MapsEverySupportedDevice) {
  struct Row {
    int major, minor;
    const char* arch;
  };
  for (const Row& r : {Row{8, 0, "sm_80"}, Row{8, 6, "sm_86"}, Row{8, 9, "sm_89"},
                       Row{9, 0, "sm_90a"}, Row{10, 0, "sm_100a"}, Row{10, 3, "sm_103a"},
                       Row{12, 0, "sm_120a"}, Row{12, 1, "sm_121a"}}) {
    absl::StatusOr<std::string> arch = ArchForComputeCapability(r.major, r.minor);
    ASSERT_TRUE(arch.ok()) << arch.status();
    EXPECT_EQ(*arch, r.arch);
    // What kforge builds for a device must run on it.
    EXPECT_TRUE(CheckDeviceArch(*arch, r.major, r.minor).ok()) << *arch;
  }
  for (auto [major, minor] :
       {std::pair{7, 5}, std::pair{8, 7}, std::pair{10, 1}, std::pair{11, 0}}) {
    absl::StatusOr<std::string> arch = ArchForComputeCapability(major, minor);
    EXPECT_EQ(arch.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(
        Contains(arch.status().message(), absl::StrCat("compute capability ", major, ".", minor)));
  }
}

TEST(CudaErrorToStatus, NamesTheCallAndTheErrorWithACodeByCause) {
  EXPECT_TRUE(CudaErrorToStatus(CUDA_SUCCESS, "cuInit(0)", nullptr, nullptr).ok());
  const absl::Status oom = CudaErrorToStatus(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc(64 bytes)",
                                             "CUDA_ERROR_OUT_OF_MEMORY", "out of memory");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(oom.message(), "cuMemAlloc(64 bytes): CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
  struct Case {
    CUresult result;
    absl::StatusCode code;
  };
  for (const Case& c : {Case{CUDA_ERROR_NO_BINARY_FOR_GPU, absl::StatusCode::kFailedPrecondition},
                        Case{CUDA_ERROR_NO_DEVICE, absl::StatusCode::kFailedPrecondition},
                        Case{CUDA_ERROR_STUB_LIBRARY, absl::StatusCode::kFailedPrecondition},
                        Case{CUDA_ERROR_INVALID_VALUE, absl::StatusCode::kInvalidArgument},
                        Case{CUDA_ERROR_INVALID_IMAGE, absl::StatusCode::kDataLoss},
                        Case{CUDA_ERROR_LAUNCH_FAILED, absl::StatusCode::kInternal}}) {
    EXPECT_EQ(CudaErrorToStatus(c.result, "call", "NAME", "desc").code(), c.code)
        << static_cast<int>(c.result);
  }
  // The driver may not know a code (newer than itself).
  EXPECT_EQ(CudaErrorToStatus(static_cast<CUresult>(12345), "cuFoo", nullptr, nullptr).message(),
            "cuFoo: CUresult 12345 (unknown error)");
}

TEST(CudaDriver, MissingLibraryIsAClearFailedPrecondition) {
  absl::StatusOr<std::unique_ptr<const CudaDriver>> driver =
      CudaDriver::Load("libkforge_no_such_driver.so.1");
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(driver.status().message(),
                       "no CUDA driver (libkforge_no_such_driver.so.1 not found): kforge's "
                       "runtime needs an NVIDIA driver; the compile service does not"));
}

TEST(CheckParamSizes, AcceptsMatchingBlocksAndNamesAMismatch) {
  v1::KernelArtifact a;
  a.set_module_name("m");
  a.set_main_entry("main");
  a.set_combine_entry("combine");
  a.set_params_bytes(sizeof(sparse_mla::DecodeParams));
  a.set_combine_params_bytes(sizeof(sparse_mla::CombineParams));
  v1::KernelResources* main = a.mutable_cubin_info()->add_kernels();
  main->set_name("main");
  main->set_param_bytes(sizeof(sparse_mla::DecodeParams));
  v1::KernelResources* combine = a.mutable_cubin_info()->add_kernels();
  combine->set_name("combine");
  combine->set_param_bytes(sizeof(sparse_mla::CombineParams));
  for (const auto& [name, role, bytes] :
       {std::tuple{"main", v1::ENTRY_ROLE_ATTENTION, sizeof(sparse_mla::DecodeParams)},
        std::tuple{"combine", v1::ENTRY_ROLE_COMBINE, sizeof(sparse_mla::CombineParams)}}) {
    v1::KernelEntry* e = a.add_entries();
    e->set_name(name);
    e->set_role(role);
    e->set_params_bytes(bytes);
  }
  EXPECT_TRUE(CheckParamSizes(a).ok()) << CheckParamSizes(a);

  v1::KernelArtifact bad = a;
  bad.mutable_cubin_info()->mutable_kernels(1)->set_param_bytes(8);
  EXPECT_EQ(CheckParamSizes(bad).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(CheckParamSizes(bad).message(), "combine in m takes 8 parameter bytes"));

  bad = a;
  bad.set_params_bytes(sizeof(sparse_mla::DecodeParams) + 8);
  EXPECT_TRUE(Contains(CheckParamSizes(bad).message(), "params_bytes"));

  bad = a;
  bad.mutable_cubin_info()->mutable_kernels(0)->set_name("other");
  EXPECT_EQ(CheckParamSizes(bad).code(), absl::StatusCode::kDataLoss);

  // The entry list: its recorded block, a role this runtime does not
  // launch, and an artifact from before entries were listed.
  bad = a;
  bad.mutable_entries(0)->set_params_bytes(8);
  EXPECT_EQ(CheckParamSizes(bad).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(CheckParamSizes(bad).message(), "entries[main].params_bytes = 8"))
      << CheckParamSizes(bad);
  bad = a;
  bad.mutable_entries(1)->set_role(v1::ENTRY_ROLE_INDEXER_TOPK);
  EXPECT_EQ(CheckParamSizes(bad).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(CheckParamSizes(bad).message(), "role ENTRY_ROLE_INDEXER_TOPK"))
      << CheckParamSizes(bad);
  bad = a;
  bad.clear_entries();
  bad.set_format_version(2);
  EXPECT_EQ(CheckParamSizes(bad).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(CheckParamSizes(bad).message(), "lists no entries (format 2"))
      << CheckParamSizes(bad);
}

TEST(KernelModule, ChecksEveryListedEntryAgainstItsRoleBeforeLoading) {
  // A module of two roles, checked against what one family passes: no
  // driver is needed to refuse it.
  constexpr EntryParams kExpected[] = {{v1::ENTRY_ROLE_INDEXER_LOGITS, 24, "A", "a.h"},
                                       {v1::ENTRY_ROLE_INDEXER_TOPK, 40, "B", "b.h"}};
  v1::KernelArtifact a;
  a.set_module_name("m");
  for (const auto& [name, role, bytes] : {std::tuple{"x", v1::ENTRY_ROLE_INDEXER_LOGITS, 24},
                                          std::tuple{"y", v1::ENTRY_ROLE_INDEXER_TOPK, 40}}) {
    v1::KernelEntry* e = a.add_entries();
    e->set_name(name);
    e->set_role(role);
    e->set_params_bytes(bytes);
    v1::KernelResources* k = a.mutable_cubin_info()->add_kernels();
    k->set_name(name);
    k->set_param_bytes(bytes);
  }
  EXPECT_TRUE(CheckEntryParams(a, kExpected).ok()) << CheckEntryParams(a, kExpected);
  v1::KernelArtifact bad = a;
  bad.mutable_cubin_info()->mutable_kernels(1)->set_param_bytes(48);
  absl::Status s = KernelModule::Load(bad, kExpected, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Contains(s.message(),
                       "y in m takes 48 parameter bytes but this runtime passes "
                       "sizeof(B) = 40: kernel and runtime were built from "
                       "different b.h"))
      << s;
  // Not loaded without a cubin, whatever the machine.
  EXPECT_EQ(KernelModule::Load(a, kExpected, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Another family's module: a role outside the expected ones.
  EXPECT_EQ(KernelModule::Load(a, absl::MakeConstSpan(kExpected, 1), 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ValidateDecodeArgs, ValidArgsGiveTheShape) {
  const v1::Manifest m = ManifestFor(Glm5Tp8(), "sm_90a");
  DecodeArgs args = ValidArgs(3);
  args.s_q = 2;
  absl::StatusOr<RuntimeShape> shape = ValidateDecodeArgs(args, m);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->batch, 3);
  EXPECT_EQ(shape->s_q, 2);
  EXPECT_EQ(shape->num_q_heads, 8);
  EXPECT_EQ(shape->topk, 2048);
  EXPECT_EQ(shape->page_block_size, 64);
  EXPECT_EQ(shape->kv_dtype, v1::KV_CACHE_DTYPE_BF16);
  // lse is optional.
  args.lse = 0;
  EXPECT_TRUE(ValidateDecodeArgs(args, m).ok());
}

TEST(ValidateDecodeArgs, EachBadFieldIsNamedWithItsValue) {
  const v1::Manifest m = ManifestFor(Glm5Tp8(), "sm_90a");
  struct Case {
    std::function<void(DecodeArgs&)> change;
    const char* message_start;
  };
  const Case cases[] = {
      {[](DecodeArgs& a) { a.q = 0; }, "q: null"},
      {[](DecodeArgs& a) { a.kv = 0; }, "kv: null"},
      {[](DecodeArgs& a) { a.indices = 0; }, "indices: null"},
      {[](DecodeArgs& a) { a.out = 0; }, "out: null"},
      {[](DecodeArgs& a) { a.batch = 0; }, "batch: got 0, must be >= 1"},
      {[](DecodeArgs& a) { a.s_q = -1; }, "s_q: got -1"},
      {[](DecodeArgs& a) { a.num_kv_slots = 0; }, "num_kv_slots: got 0"},
      {[](DecodeArgs& a) { a.num_q_heads = 16; },
       "num_q_heads: got 16, the kernels are built for 8"},
      {[](DecodeArgs& a) { a.d_qk = 512; }, "d_qk: got 512, the kernels are built for 576"},
      {[](DecodeArgs& a) { a.d_v = 256; }, "d_v: got 256, the kernels are built for 512"},
      {[](DecodeArgs& a) { a.topk = 1024; }, "topk: got 1024, the kernels are built for 2048"},
      {[](DecodeArgs& a) { a.page_block_size = 16; }, "page_block_size: got 16"},
      {[](DecodeArgs& a) { a.kv_dtype = v1::KV_CACHE_DTYPE_FP8_DS_MLA; },
       "kv_dtype: got fp8_ds_mla, the kernels are built for bf16"},
      // 576^-0.5, the classic mistake (docs/DESIGN.md).
      {[](DecodeArgs& a) { a.softmax_scale = 1 / std::sqrt(576.0); },
       "softmax_scale: got 0.0416666667, the kernels are compiled with 0.0625"},
      {[](DecodeArgs& a) { a.s_q = 0; }, "s_q: got 0, must be >= 1"},
      {[](DecodeArgs& a) { a.q_head_stride = 512; },
       "q_head_stride: got 512, must be >= d_qk = 576"},
      {[](DecodeArgs& a) { a.q_token_stride = 576; },
       "q_token_stride: got 576, must be >= num_q_heads * q_head_stride = 4608"},
      {[](DecodeArgs& a) { a.kv_row_stride = 568; }, "kv_row_stride: got 568"},
      {[](DecodeArgs& a) { a.kv_page_stride = 63 * 576; },
       "kv_page_stride: got 36288, must be >= page_block_size * kv_row_stride = 36864"},
      {[](DecodeArgs& a) { a.indices_stride = 2047; }, "indices_stride: got 2047"},
      {[](DecodeArgs& a) { a.out_head_stride = 500; }, "out_head_stride: got 500"},
      {[](DecodeArgs& a) { a.out_token_stride = 512; }, "out_token_stride: got 512"},
      {[](DecodeArgs& a) { a.q += 8; }, "q: 0x10000008 is not 16-byte aligned"},
      {[](DecodeArgs& a) { a.kv += 4; }, "kv: 0x20000004 is not 16-byte aligned"},
      {[](DecodeArgs& a) { a.out += 2; }, "out: 0x40000002 is not 4-byte aligned"},
      {[](DecodeArgs& a) { a.indices += 2; }, "indices: 0x30000002 is not 4-byte"},
      {[](DecodeArgs& a) { a.lse += 2; }, "lse: 0x50000002 is not 4-byte"},
      {[](DecodeArgs& a) { a.topk_length = 0x60000002; }, "topk_length: 0x60000002 is not 4-byte"},
      {[](DecodeArgs& a) { a.sink = 0x60000001; }, "sink: 0x60000001 is not 4-byte"},
      // One length per token (1) or per request (s_q) only.
      {[](DecodeArgs& a) {
         a.topk_length = 0x60000000;
         a.topk_length_tokens = 3;
       },
       "topk_length_tokens: got 3, must be 1 (one length per query token) or s_q = 1"},
      {[](DecodeArgs& a) {
         a.q_head_stride = 580;
         a.q_token_stride = 8 * 580;
       },
       "q_head_stride: got 580 elements, must be a multiple of 8 (16 bytes)"},
      {[](DecodeArgs& a) { a.q_token_stride = 8 * 576 + 4; }, "q_token_stride: got 4612 elements"},
      {[](DecodeArgs& a) {
         a.kv_row_stride = 580;
         a.kv_page_stride = 64 * 580;
       },
       "kv_row_stride: got 580 elements"},
      {[](DecodeArgs& a) { a.kv_page_stride = 64 * 576 + 2; },
       "kv_page_stride: got 36866 elements"},
      {[](DecodeArgs& a) {
         a.out_head_stride = 513;
         a.out_token_stride = 8 * 513;
       },
       "out_head_stride: got 513 elements, must be a multiple of 2 (4 bytes)"},
      {[](DecodeArgs& a) { a.out_token_stride = 8 * 512 + 1; },
       "out_token_stride: got 4097 elements"},
  };
  ASSERT_TRUE(ValidateDecodeArgs(ValidArgs(), m).ok());
  for (const Case& c : cases) {
    DecodeArgs args = ValidArgs();
    c.change(args);
    const absl::Status s = ValidateDecodeArgs(args, m).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message_start << ": " << s;
    EXPECT_TRUE(absl::StartsWith(s.message(), c.message_start))
        << "\"" << s.message() << "\" does not start with \"" << c.message_start << "\"";
  }
}

TEST(ValidateDecodeArgs, ScaleIsComparedWithRelativeTolerance) {
  const v1::Manifest m = ManifestFor(Glm5Tp8(), "sm_90a");
  DecodeArgs args = ValidArgs();
  args.softmax_scale = 0.0625 * (1 + 5e-7);
  EXPECT_TRUE(ValidateDecodeArgs(args, m).ok());
  args.softmax_scale = 0.0625 * (1 - 2e-6);
  EXPECT_TRUE(Contains(ValidateDecodeArgs(args, m).status().message(), "softmax_scale"));
  args.softmax_scale = std::nan("");
  EXPECT_FALSE(ValidateDecodeArgs(args, m).ok());
}

TEST(ValidateDecodeArgs, LseNeedsKernelsBuiltWithIt) {
  v1::AttentionSpec spec = Glm5Tp8();
  spec.set_return_lse(false);
  const v1::Manifest m = ManifestFor(spec, "sm_90a");
  EXPECT_TRUE(absl::StartsWith(ValidateDecodeArgs(ValidArgs(), m).status().message(),
                               "lse: given, but the kernels were built without return_lse"));
  DecodeArgs args = ValidArgs();
  args.lse = 0;
  EXPECT_TRUE(ValidateDecodeArgs(args, m).ok());
}

// One kernel serves every s_q: MTP and many query tokens per request alike.
TEST(ValidateDecodeArgs, AnySqIsValid) {
  for (int s_q : {1, 2, 4, 5, 16}) {
    DecodeArgs a = ValidArgs();
    a.s_q = s_q;
    absl::StatusOr<RuntimeShape> shape = ValidateDecodeArgs(a, ManifestFor(Glm5Tp8(), "sm_90a"));
    ASSERT_TRUE(shape.ok()) << shape.status();
    EXPECT_EQ(shape->s_q, s_q);
  }
}

// fp8_ds_mla: the uint8 cache's strides count bytes and must step over a
// whole 656-byte record, 16-byte aligned (KvLayoutOf).
TEST(ValidateDecodeArgs, Fp8CacheStridesAreBytesOverWholeRecords) {
  absl::StatusOr<v1::AttentionSpec> spec =
      SpecFromPreset("glm-5", 8, v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const KvCacheLayout layout = KvLayoutOf(*spec);
  EXPECT_EQ(layout.row_bytes, 656);
  EXPECT_EQ(layout.element_bytes, 1);
  const v1::Manifest m = ManifestFor(*spec, "sm_90a");
  DecodeArgs a = ValidArgs();
  a.kv_dtype = v1::KV_CACHE_DTYPE_FP8_DS_MLA;
  a.kv_row_stride = 656;
  a.kv_page_stride = 64 * 656 + 64;  // a gap between pages, as vLLM may leave
  EXPECT_TRUE(ValidateDecodeArgs(a, m).ok()) << ValidateDecodeArgs(a, m).status();
  a.kv_row_stride = 576;  // a bf16 row's element count is not a record
  EXPECT_TRUE(absl::StartsWith(ValidateDecodeArgs(a, m).status().message(),
                               "kv_row_stride: got 576, must be >= the cache record's bytes = 656"))
      << ValidateDecodeArgs(a, m).status();
  a.kv_row_stride = 664;
  a.kv_page_stride = 64 * 664;
  EXPECT_TRUE(absl::StartsWith(ValidateDecodeArgs(a, m).status().message(),
                               "kv_row_stride: got 664 elements, must be a multiple of 16"))
      << ValidateDecodeArgs(a, m).status();
  // A bf16 cache handed to fp8 kernels is named.
  a = ValidArgs();
  EXPECT_TRUE(absl::StartsWith(ValidateDecodeArgs(a, m).status().message(),
                               "kv_dtype: got bf16, the kernels are built for fp8_ds_mla"))
      << ValidateDecodeArgs(a, m).status();
}

// The page-blocked records (V4 584 B, V4.1 528 B): the row stride is the
// record exactly (584 is no multiple of 16, and no row is strided by it);
// the page stride steps over page_block_size records, 16-byte aligned.
TEST(ValidateDecodeArgs, PageBlockedCachesTakeTheRecordAsRowStride) {
  for (const auto& [dtype, record] : {std::pair{v1::KV_CACHE_DTYPE_FP8_DS_MLA_V4, 584},
                                      std::pair{v1::KV_CACHE_DTYPE_MXFP8_DS_MLA_V41, 528}}) {
    absl::StatusOr<v1::AttentionSpec> preset = SpecFromPreset("glm-5", 8);
    ASSERT_TRUE(preset.ok()) << preset.status();
    v1::AttentionSpec spec = SpecWithKvDtype(*preset, dtype, v1::KV_SCALE_FORMAT_UNSPECIFIED);
    spec.set_rope_dim(0);
    ASSERT_TRUE(ValidateSpec(spec).ok()) << ValidateSpec(spec);
    const KvCacheLayout layout = KvLayoutOf(spec);
    EXPECT_EQ(layout.row_bytes, record);
    EXPECT_EQ(layout.element_bytes, 1);
    EXPECT_TRUE(layout.page_blocked);
    const v1::Manifest m = ManifestFor(spec, "sm_90a");
    DecodeArgs a = ValidArgs();
    a.d_qk = 512;
    a.q_head_stride = 512;
    a.q_token_stride = a.num_q_heads * 512;
    a.kv_dtype = dtype;
    a.kv_row_stride = record;
    a.kv_page_stride = (64 * record + 575) / 576 * 576;  // vLLM's page, rounded up
    EXPECT_TRUE(ValidateDecodeArgs(a, m).ok()) << ValidateDecodeArgs(a, m).status();
    a.kv_row_stride = record + 16;
    EXPECT_TRUE(absl::StartsWith(
        ValidateDecodeArgs(a, m).status().message(),
        absl::StrCat("kv_row_stride: got ", record + 16, ", must be ", record, " (the record")))
        << ValidateDecodeArgs(a, m).status();
    a.kv_row_stride = record;
    a.kv_page_stride = 64 * record - 16;
    EXPECT_TRUE(
        absl::StartsWith(ValidateDecodeArgs(a, m).status().message(), "kv_page_stride: got"))
        << ValidateDecodeArgs(a, m).status();
    a.kv_page_stride = 64 * record + 8;
    EXPECT_TRUE(
        absl::StartsWith(ValidateDecodeArgs(a, m).status().message(), "kv_page_stride: got"))
        << ValidateDecodeArgs(a, m).status();
  }
}

// glm-5 TP8 with an extra cache: V3.2-style fp8_ds_mla records (pow2),
// 128 extra indices per token, pages of 16.
v1::AttentionSpec Glm5Tp8WithExtraCache() {
  v1::AttentionSpec spec = Glm5Tp8();
  v1::ExtraKvCache* x = spec.mutable_extra_kv();
  x->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_FP8_DS_MLA);
  x->set_kv_scale_format(v1::KV_SCALE_FORMAT_POW2);
  x->set_topk(128);
  x->set_page_block_size(16);
  EXPECT_TRUE(ValidateSpec(spec).ok()) << ValidateSpec(spec);
  return spec;
}

DecodeArgs ValidArgsWithExtraCache(int batch = 4) {
  DecodeArgs a = ValidArgs(batch);
  a.extra_kv = 0x60000000;
  a.extra_indices = 0x68000000;
  a.extra_topk = 128;
  a.extra_page_block_size = 16;
  a.extra_num_kv_slots = 50 * 16;
  a.extra_kv_dtype = v1::KV_CACHE_DTYPE_FP8_DS_MLA;
  a.extra_kv_row_stride = 656;
  a.extra_kv_page_stride = 16 * 656 + 64;
  a.extra_indices_stride = 136;
  return a;
}

TEST(ValidateDecodeArgs, ExtraCacheArgsAreCheckedAgainstItsSpec) {
  const v1::Manifest with = ManifestFor(Glm5Tp8WithExtraCache(), "sm_90a");
  EXPECT_TRUE(ValidateDecodeArgs(ValidArgsWithExtraCache(), with).ok())
      << ValidateDecodeArgs(ValidArgsWithExtraCache(), with).status();
  struct Case {
    std::function<void(DecodeArgs&)> change;
    const char* message_start;
  };
  const Case cases[] = {
      {[](DecodeArgs& a) { a.extra_kv = 0; }, "extra_kv: null; the kernels were built with"},
      {[](DecodeArgs& a) { a.extra_indices = 0; }, "extra_indices: null"},
      {[](DecodeArgs& a) { a.extra_kv_dtype = v1::KV_CACHE_DTYPE_BF16; },
       "extra_kv_dtype: got bf16, the kernels are built for fp8_ds_mla"},
      {[](DecodeArgs& a) { a.extra_topk = 64; },
       "extra_topk: got 64, the kernels are built for 128"},
      {[](DecodeArgs& a) { a.extra_page_block_size = 64; },
       "extra_page_block_size: got 64, the kernels are built for 16"},
      {[](DecodeArgs& a) { a.extra_num_kv_slots = 0; }, "extra_num_kv_slots: got 0"},
      {[](DecodeArgs& a) { a.extra_kv_row_stride = 600; },
       "extra_kv_row_stride: got 600, must be >= the cache record's bytes = 656"},
      {[](DecodeArgs& a) {
         a.extra_kv_row_stride = 664;
         a.extra_kv_page_stride = 16 * 672;
       },
       "extra_kv_row_stride: got 664 elements, must be a multiple of 16"},
      {[](DecodeArgs& a) { a.extra_kv_page_stride = 15 * 656; },
       "extra_kv_page_stride: got 9840, must be >= extra_page_block_size * "
       "extra_kv_row_stride = 10496"},
      {[](DecodeArgs& a) { a.extra_kv = 0x60000008; }, "extra_kv: 0x60000008 is not 16-byte"},
      {[](DecodeArgs& a) { a.extra_indices = 0x68000002; }, "extra_indices: 0x68000002 is not"},
      {[](DecodeArgs& a) { a.extra_topk_length = 0x6c000001; },
       "extra_topk_length: 0x6c000001 is not"},
      {[](DecodeArgs& a) { a.extra_indices_stride = 127; },
       "extra_indices_stride: got 127, must be >= extra_topk = 128"},
  };
  for (const Case& c : cases) {
    DecodeArgs a = ValidArgsWithExtraCache();
    c.change(a);
    const absl::Status s = ValidateDecodeArgs(a, with).status();
    EXPECT_TRUE(absl::StartsWith(s.message(), c.message_start))
        << "want \"" << c.message_start << "\", got " << s;
  }
  // Kernels built without an extra cache refuse one, naming the field.
  const v1::Manifest without = ManifestFor(Glm5Tp8(), "sm_90a");
  for (auto set : {+[](DecodeArgs& a) { a.extra_kv = 0x60000000; },
                   +[](DecodeArgs& a) { a.extra_indices = 0x68000000; },
                   +[](DecodeArgs& a) { a.extra_topk_length = 0x6c000000; }}) {
    DecodeArgs a = ValidArgs();
    set(a);
    const absl::Status s = ValidateDecodeArgs(a, without).status();
    EXPECT_TRUE(absl::StrContains(s.message(),
                                  "given, but the kernels were built without an extra KV cache"))
        << s;
  }
}

TEST(ValidateDecodeArgs, EmptyManifestIsFailedPrecondition) {
  EXPECT_EQ(ValidateDecodeArgs(ValidArgs(), v1::Manifest()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// `split_count_fn(spec, rule, splits)` for a spec of `topk` keys and a rule
// of `tile`-key tiles.
int ForTopkAndTile(int (*split_count_fn)(const v1::AttentionSpec&, const v1::LaunchRule&, int),
                   int topk, int tile, int splits) {
  v1::AttentionSpec spec;
  spec.set_topk(topk);
  v1::LaunchRule rule;
  rule.set_split_granularity_tokens(tile);
  return split_count_fn(spec, rule, splits);
}

int TokensPerSplitFor(int topk, int tile, int splits) {
  return ForTopkAndTile(&TokensPerSplit, topk, tile, splits);
}

TEST(TokensPerSplit, CoversTopkInWholeTiles) {
  EXPECT_EQ(TokensPerSplitFor(2048, 64, 1), 2048);
  EXPECT_EQ(TokensPerSplitFor(2048, 64, 8), 256);
  EXPECT_EQ(TokensPerSplitFor(2048, 64, 3), 704);  // ceil(2048 / 3) = 683 -> 11 tiles
  EXPECT_EQ(TokensPerSplitFor(2049, 64, 2), 1088);
  EXPECT_EQ(TokensPerSplitFor(63, 32, 2), 32);
  EXPECT_EQ(TokensPerSplitFor(1, 32, 1), 32);
}

int SplitsHoldingKeysFor(int topk, int tile, int splits) {
  return ForTopkAndTile(&SplitsHoldingKeys, topk, tile, splits);
}

TEST(SplitsHoldingKeys, DropsTheSplitsWholeTilesLeaveEmpty) {
  EXPECT_EQ(SplitsHoldingKeysFor(1152, 64, 16), 9);   // 18 tiles: 2 a split
  EXPECT_EQ(SplitsHoldingKeysFor(1152, 64, 18), 18);  // one each
  EXPECT_EQ(SplitsHoldingKeysFor(2048, 64, 12), 11);  // 3 a split: 11 hold keys
  EXPECT_EQ(SplitsHoldingKeysFor(2048, 64, 16), 16);
  EXPECT_EQ(SplitsHoldingKeysFor(2048, 64, 64), 32);  // never more than the tiles
  EXPECT_EQ(SplitsHoldingKeysFor(2049, 64, 17), 17);
  EXPECT_EQ(SplitsHoldingKeysFor(63, 32, 1), 1);
  for (int splits = 1; splits <= 40; ++splits) {
    const int held = SplitsHoldingKeysFor(1152, 64, splits);
    EXPECT_LE(held, splits);
    // The same keys a split, and every split holds some.
    EXPECT_EQ(TokensPerSplitFor(1152, 64, held), TokensPerSplitFor(1152, 64, std::min(splits, 18)));
    EXPECT_LT(static_cast<long long>(held - 1) * TokensPerSplitFor(1152, 64, held), 1152);
  }
}

// Args with padded strides, so a field copied from the wrong stride shows.
DecodeArgs PaddedArgs(int batch) {
  DecodeArgs a = ValidArgs(batch);
  a.q_head_stride = 584;
  a.q_token_stride = 8 * 584 + 8;
  a.kv_row_stride = 640;
  a.kv_page_stride = 64 * 640 + 64;
  a.indices_stride = 2052;
  a.out_head_stride = 520;
  a.out_token_stride = 8 * 520 + 2;
  return a;
}

// What SparseMlaDecode::Plan does on a 132-SM H200.
// forced_num_splits 0: the rule's split count; the H200's 7 clusters.
absl::StatusOr<Selection> PlanOnH200(const v1::Manifest& m, const DecodeArgs& args,
                                     int forced_num_splits = 0) {
  absl::StatusOr<RuntimeShape> shape = ValidateDecodeArgs(args, m);
  if (!shape.ok()) return shape.status();
  return Select(m, DeviceInfo{"sm_90a", 132, forced_num_splits, 7}, *shape);
}

TEST(MakeDecodeParams, ClusterLaunchHasNoWorkspaceOrCombine) {
  const v1::Manifest m = ManifestFor(Glm5Tp8(), "sm_90a");
  const DecodeArgs args = PaddedArgs(2);
  absl::StatusOr<Selection> sel = PlanOnH200(m, args);
  ASSERT_TRUE(sel.ok()) << sel.status();
  ASSERT_TRUE(sel->cluster);
  EXPECT_FALSE(sel->needs_combine);
  EXPECT_EQ(sel->workspace_bytes, 0u);
  const sparse_mla::DecodeParams p = MakeDecodeParams(*sel, args, 0x70000000);
  EXPECT_EQ(p.o_accum, nullptr);
  EXPECT_EQ(p.lse_accum, nullptr);
  EXPECT_EQ(p.num_splits, sparse_mla::kClusterSplits);
  EXPECT_EQ(p.tokens_per_split, 2048 / sparse_mla::kClusterSplits);
  EXPECT_EQ(reinterpret_cast<CUdeviceptr>(p.out), args.out);
  // The plan a binding launches names the cluster entry.
  const v1::LaunchPlan plan = ToLaunchPlan(*sel);
  EXPECT_TRUE(plan.cluster());
  EXPECT_EQ(plan.main_entry(), kClusterEntry);
  EXPECT_EQ(plan.grid_y(), static_cast<uint32_t>(sparse_mla::kClusterSplits));
}

TEST(MakeDecodeParams, ExtraCacheFieldsAndTheKeySpanSplit) {
  const v1::Manifest m = ManifestFor(Glm5Tp8WithExtraCache(), "sm_90a");
  DecodeArgs args = ValidArgsWithExtraCache(64);
  args.extra_topk_length = 0x6c000000;
  absl::StatusOr<Selection> sel = PlanOnH200(m, args, 3);
  ASSERT_TRUE(sel.ok()) << sel.status();
  const sparse_mla::DecodeParams p = MakeDecodeParams(*sel, args, 0x70000000);
  EXPECT_EQ(reinterpret_cast<uint64_t>(p.extra_kv), args.extra_kv);
  EXPECT_EQ(reinterpret_cast<uint64_t>(p.extra_indices), args.extra_indices);
  EXPECT_EQ(reinterpret_cast<uint64_t>(p.extra_topk_length), args.extra_topk_length);
  EXPECT_EQ(p.extra_kv_page_stride, args.extra_kv_page_stride);
  EXPECT_EQ(p.extra_kv_row_stride, args.extra_kv_row_stride);
  EXPECT_EQ(p.extra_num_kv_slots, args.extra_num_kv_slots);
  EXPECT_EQ(p.extra_indices_stride, args.extra_indices_stride);
  // Three splits cover the 2048 top-k keys and the 128 extra ones, whole
  // tiles each: KeySpan(2048, 128, tile).
  const int tile = static_cast<int>(sel->launch->split_granularity_tokens());
  const int keys = sparse_mla::KeySpan(2048, 128, tile);
  EXPECT_EQ(keys, 2048 + 128);  // 2048 is whole tiles already
  EXPECT_GE(3 * p.tokens_per_split, keys);
  EXPECT_EQ(p.tokens_per_split % tile, 0);
  EXPECT_LT(2 * p.tokens_per_split, keys);
  // The most splits: one tile each over the span.
  EXPECT_EQ(MaxSplits(m.variants(0).spec().sparse_mla_decode(), m.variants(0).launch()),
            (keys + static_cast<int>(m.variants(0).launch().split_granularity_tokens()) - 1) /
                static_cast<int>(m.variants(0).launch().split_granularity_tokens()));
  // Without one, the extra fields stay null.
  const v1::Manifest plain = ManifestFor(Glm5Tp8(), "sm_90a");
  absl::StatusOr<Selection> plain_sel = PlanOnH200(plain, ValidArgs(64));
  ASSERT_TRUE(plain_sel.ok()) << plain_sel.status();
  const sparse_mla::DecodeParams q = MakeDecodeParams(*plain_sel, ValidArgs(64), 0);
  EXPECT_EQ(q.extra_kv, nullptr);
  EXPECT_EQ(q.extra_indices, nullptr);
  EXPECT_EQ(q.extra_num_kv_slots, 0);
}

TEST(KeySpan, PadsTheTopkListToWholeTilesOnlyBeforeAnExtraList) {
  EXPECT_EQ(sparse_mla::KeySpan(2048, 0, 64), 2048);
  EXPECT_EQ(sparse_mla::KeySpan(63, 0, 64), 63);
  EXPECT_EQ(sparse_mla::MainKeySpan(63, 1, 64), 64);
  EXPECT_EQ(sparse_mla::KeySpan(63, 1, 64), 65);
  EXPECT_EQ(sparse_mla::KeySpan(1000, 100, 32), 1024 + 100);
  // Staging rows of a pipeline: direct (0) only when every cache is.
  EXPECT_EQ(sparse_mla::PipelineStagingBytes(0, 1152, 0, 0), 0);
  EXPECT_EQ(sparse_mla::PipelineStagingBytes(0, 1152, 0, 1152), 0);
  EXPECT_EQ(sparse_mla::PipelineStagingBytes(656, 656, 0, 0), 656);
  EXPECT_EQ(sparse_mla::PipelineStagingBytes(656, 656, 0, 1152), 1152);
  EXPECT_EQ(sparse_mla::PipelineStagingBytes(0, 1152, 352, 352), 1152);
  EXPECT_EQ(sparse_mla::PipelineStagingBytes(592, 584, 352, 352), 592);
}

TEST(MakeDecodeParams, SplitLaunchUsesTheWorkspaceLayout) {
  const v1::Manifest m = ManifestFor(Glm5Tp8(), "sm_90a");
  DecodeArgs args = PaddedArgs(2);
  args.topk_length = 0x60000000;
  args.sink = 0x68000000;
  // 8 heads, 2 tokens, 16 splits forced (the rule itself would take the
  // cluster entry, which needs no workspace: the next test).
  absl::StatusOr<Selection> sel = PlanOnH200(m, args, 16);
  ASSERT_TRUE(sel.ok()) << sel.status();
  ASSERT_EQ(sel->num_splits, 16);
  ASSERT_TRUE(sel->needs_combine);

  const CUdeviceptr ws = 0x70000000;
  const sparse_mla::DecodeParams p = MakeDecodeParams(*sel, args, ws);
  EXPECT_EQ(reinterpret_cast<CUdeviceptr>(p.q), args.q);
  EXPECT_EQ(reinterpret_cast<CUdeviceptr>(p.kv), args.kv);
  EXPECT_EQ(reinterpret_cast<CUdeviceptr>(p.indices), args.indices);
  EXPECT_EQ(reinterpret_cast<CUdeviceptr>(p.out), args.out);
  EXPECT_EQ(reinterpret_cast<CUdeviceptr>(p.lse), args.lse);
  EXPECT_EQ(reinterpret_cast<CUdeviceptr>(p.topk_length), args.topk_length);
  EXPECT_EQ(reinterpret_cast<CUdeviceptr>(p.sink), args.sink);
  EXPECT_EQ(p.topk_length_tokens, 1);
  // o_accum [splits, tokens, heads, 512] fp32, then lse_accum [splits,
  // tokens, heads] fp32, ending exactly at the selection's workspace size.
  const uint64_t rows = static_cast<uint64_t>(sel->num_splits) * 2 * 8;
  EXPECT_EQ(reinterpret_cast<CUdeviceptr>(p.o_accum), ws);
  EXPECT_EQ(reinterpret_cast<CUdeviceptr>(p.lse_accum), ws + rows * 512 * 4);
  EXPECT_EQ(ws + rows * 512 * 4 + rows * 4, ws + sel->workspace_bytes);
  EXPECT_EQ(p.q_token_stride, 8 * 584 + 8);
  EXPECT_EQ(p.q_head_stride, 584);
  EXPECT_EQ(p.kv_page_stride, 64 * 640 + 64);
  EXPECT_EQ(p.kv_row_stride, 640);
  EXPECT_EQ(p.num_kv_slots, 6400);
  EXPECT_EQ(p.indices_stride, 2052);
  EXPECT_EQ(p.out_token_stride, 8 * 520 + 2);
  EXPECT_EQ(p.out_head_stride, 520);
  EXPECT_EQ(p.num_tokens, 2);
  EXPECT_EQ(p.num_splits, sel->num_splits);
  const int tile = static_cast<int>(sel->variant->tiling().token_tile());
  EXPECT_EQ(p.tokens_per_split, TokensPerSplitFor(2048, tile, sel->num_splits));
  EXPECT_EQ(p.tokens_per_split % tile, 0);
  EXPECT_GE(p.tokens_per_split * sel->num_splits, 2048);
  EXPECT_LT(p.tokens_per_split * (sel->num_splits - 1), 2048);  // no empty split

  const sparse_mla::CombineParams c = MakeCombineParams(*sel, args, ws);
  EXPECT_EQ(c.o_accum, p.o_accum);
  EXPECT_EQ(c.lse_accum, p.lse_accum);
  EXPECT_EQ(c.out, p.out);
  EXPECT_EQ(c.lse, p.lse);
  EXPECT_EQ(c.sink, p.sink);  // the combine finishes O, so it adds the sink
  EXPECT_EQ(c.out_token_stride, p.out_token_stride);
  EXPECT_EQ(c.out_head_stride, p.out_head_stride);
  EXPECT_EQ(c.num_tokens, 2);
  EXPECT_EQ(c.num_splits, sel->num_splits);

  const LaunchDims main = MainLaunchDims(*sel);
  EXPECT_EQ(main.grid_x, sel->grid_x);
  EXPECT_EQ(main.grid_y, static_cast<uint32_t>(sel->num_splits));
  EXPECT_EQ(main.grid_z, 2u);
  EXPECT_EQ(main.block_threads, sel->block_threads);
  EXPECT_EQ(main.dynamic_smem_bytes, sel->dynamic_smem_bytes);
  const LaunchDims combine = CombineLaunchDims(*sel);
  EXPECT_EQ(combine.grid_x, 2u);
  EXPECT_EQ(combine.grid_y, sel->combine_grid_y);
  EXPECT_EQ(combine.grid_z, 1u);
  EXPECT_EQ(combine.block_threads, sel->combine_block_threads);
  EXPECT_EQ(combine.dynamic_smem_bytes, 0u);
}

TEST(MakeDecodeParams, SingleSplitHasNoWorkspace) {
  const v1::Manifest m = ManifestFor(Glm5Tp8(), "sm_90a");
  const DecodeArgs args = PaddedArgs(512);
  absl::StatusOr<Selection> sel = PlanOnH200(m, args);
  ASSERT_TRUE(sel.ok()) << sel.status();
  ASSERT_EQ(sel->num_splits, 1);
  const sparse_mla::DecodeParams p = MakeDecodeParams(*sel, args, 0x70000000);
  EXPECT_EQ(p.o_accum, nullptr);
  EXPECT_EQ(p.lse_accum, nullptr);
  EXPECT_EQ(p.num_splits, 1);
  EXPECT_EQ(p.num_tokens, 512);
  EXPECT_EQ(p.tokens_per_split, 2048);
}

TEST(SparseMlaDecode, WithoutADriverCreateIsAClearFailedPrecondition) {
  if (CudaDriver::Get().ok()) {
    GTEST_SKIP() << "a CUDA driver is present; this checks machines without one";
  }
  CompilingSource source;
  absl::StatusOr<std::unique_ptr<SparseMlaDecode>> decode =
      SparseMlaDecode::Create(source, Glm5Tp8Selector(), 0);
  ASSERT_FALSE(decode.ok());
  EXPECT_EQ(decode.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(decode.status().message(),
                       "no CUDA driver (libcuda.so.1 not found): kforge's runtime needs an "
                       "NVIDIA driver; the compile service does not"));
  EXPECT_EQ(source.manifest_calls, 0);  // nothing fetched for a machine that cannot run it
  EXPECT_EQ(CudaKernelModule::Load(v1::KernelArtifact(), 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// ---- The host reference the GPU checks rely on -----------------------------

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(1.0f + 1.0f / 256), 0x3F80);  // halfway: to even
  EXPECT_EQ(FloatToBf16(1.0f + 3.0f / 256), 0x3F82);  // halfway: to even (up)
  EXPECT_EQ(FloatToBf16(-2.5f), 0xC020);
  EXPECT_EQ(Bf16ToFloat(0xC020), -2.5f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(0xFFFF)));  // the poison pattern
}

// A small model: 2 heads, topk 8, page 64, scale 1/16.
v1::AttentionSpec SmallSpec() {
  v1::AttentionSpec spec = testing::DeepseekTp1Spec();
  spec.set_num_q_heads(2);
  spec.set_topk(8);
  spec.set_softmax_scale(0.0625f);
  return spec;
}

TEST(MakeRandomDecodeProblem, LaysOutPaddedTensorsWithAllKindsOfIndices) {
  const HostDecodeProblem p =
      MakeRandomDecodeProblem(SmallSpec(), {.batch = 64, .s_q = 2, .row_padding = 8});
  const DecodeArgs& a = p.args;
  EXPECT_EQ(a.q_head_stride, 584);
  EXPECT_EQ(a.q_token_stride, 2 * 584 + 8);
  EXPECT_EQ(a.kv_page_stride, 64 * 584 + 8);
  EXPECT_EQ(a.indices_stride, 16);
  EXPECT_EQ(a.out_token_stride, 2 * 520 + 8);
  EXPECT_EQ(p.q.size(), 128u * a.q_token_stride);
  EXPECT_EQ(p.out_elements(), 128u * a.out_token_stride);
  EXPECT_EQ(Bf16ToFloat(p.q[576]), 100.0f);  // padding after a q row
  EXPECT_TRUE(ValidateDecodeArgs(
                  [&] {
                    DecodeArgs with_pointers = a;
                    with_pointers.q = with_pointers.kv = with_pointers.indices = 0x1000;
                    with_pointers.out = with_pointers.lse = 0x1000;
                    return with_pointers;
                  }(),
                  ManifestFor(SmallSpec(), "sm_90a"))
                  .ok());
  int negative = 0, past_end = 0, repeats = 0;
  for (int64_t t = 0; t < 128; ++t) {
    const int32_t* row = &p.indices[t * a.indices_stride];
    for (int i = 0; i < a.topk; ++i) {
      negative += row[i] < 0;
      past_end += row[i] >= a.num_kv_slots;
      repeats += row[i] >= 0 && std::count(row, row + i, row[i]) > 0;
    }
  }
  EXPECT_GT(negative, 0);
  EXPECT_GT(past_end, 0);
  EXPECT_GT(repeats, 0);
}

TEST(ReferenceDecode, ZeroQueryAveragesValidRowsCountingRepeats) {
  HostDecodeProblem p = MakeRandomDecodeProblem(SmallSpec(), {.batch = 2});
  const DecodeArgs& a = p.args;
  std::fill(p.q.begin(), p.q.end(), 0);  // every score 0: uniform weights
  const int32_t past_end = static_cast<int32_t>(a.num_kv_slots);
  const std::vector<int32_t> token0 = {3, 40, 40, -1, past_end, -1, -1, -1};
  const std::vector<int32_t> token1 = {-1, past_end, -1, -1, -1, -1, -1, -1};
  std::copy(token0.begin(), token0.end(), p.indices.begin());
  std::copy(token1.begin(), token1.end(), p.indices.begin() + a.indices_stride);
  const DecodeReference ref = ReferenceDecode(p);
  auto v = [&](int64_t slot, int d) {
    return static_cast<double>(
        Bf16ToFloat(p.kv[slot / 64 * a.kv_page_stride + slot % 64 * a.kv_row_stride + d]));
  };
  for (int h = 0; h < 2; ++h) {
    EXPECT_NEAR(ref.lse[h], std::log(3.0), 1e-12);  // slot 40 counts twice
    for (int d : {0, 100, 511}) {
      EXPECT_NEAR(ref.out[h * 512 + d], (v(3, d) + 2 * v(40, d)) / 3, 1e-12) << d;
    }
    // No valid index: out 0 and lse -inf, as the kernels write.
    EXPECT_EQ(ref.lse[2 + h], -std::numeric_limits<double>::infinity());
    EXPECT_EQ(ref.out[(2 + h) * 512 + 7], 0.0);
  }
}

TEST(ReferenceDecode, TopkLengthCutsTheListAndTheSinkOnlyScalesOut) {
  HostDecodeProblem p = MakeRandomDecodeProblem(SmallSpec(), {.batch = 2});
  const DecodeArgs& a = p.args;
  std::fill(p.q.begin(), p.q.end(), 0);  // every score 0: uniform weights
  const std::vector<int32_t> token0 = {3, 40, 40, 7, 9, 11, 13, 15};
  std::copy(token0.begin(), token0.end(), p.indices.begin());
  std::copy(token0.begin(), token0.end(), p.indices.begin() + a.indices_stride);
  p.args.topk_length_tokens = 1;
  p.topk_length = {2, -5};  // token 0: {3, 40}; token 1: nothing
  p.sink = {std::log(2.0f), -std::numeric_limits<float>::infinity()};
  const DecodeReference ref = ReferenceDecode(p);
  auto v = [&](int64_t slot, int d) {
    return static_cast<double>(
        Bf16ToFloat(p.kv[slot / 64 * a.kv_page_stride + slot % 64 * a.kv_row_stride + d]));
  };
  // lse = log 2 for both heads; head 0's sink log 2 halves out, head 1's
  // -inf sink changes nothing.
  EXPECT_NEAR(ref.lse[0], std::log(2.0), 1e-12);
  EXPECT_NEAR(ref.lse[1], std::log(2.0), 1e-12);
  for (int d : {0, 511}) {
    EXPECT_NEAR(ref.out[d], (v(3, d) + v(40, d)) / 4, 1e-7) << d;
    EXPECT_NEAR(ref.out[512 + d], (v(3, d) + v(40, d)) / 2, 1e-12) << d;
  }
  EXPECT_EQ(ref.lse[2], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(ref.out[2 * 512 + 3], 0.0);
}

// The extra cache's rows join the top-k rows in one softmax: with every
// score 0, token 0's weights are uniform over both lists' valid entries.
TEST(ReferenceDecode, ExtraCacheJoinsTheSoftmaxAndHasItsOwnLength) {
  v1::AttentionSpec spec = SmallSpec();
  v1::ExtraKvCache* x = spec.mutable_extra_kv();
  x->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_BF16);
  x->set_topk(4);
  x->set_page_block_size(16);
  HostDecodeProblem p = MakeRandomDecodeProblem(spec, {.batch = 2, .topk_length = 1});
  const DecodeArgs& a = p.args;
  ASSERT_EQ(a.extra_topk, 4);
  ASSERT_EQ(a.extra_num_kv_slots, 16);
  ASSERT_EQ(p.extra_indices.size(), 2u * 4);
  std::fill(p.q.begin(), p.q.end(), 0);
  const std::vector<int32_t> main_list = {3, 40, -1, 7, 9, 11, 13, 15};
  const std::vector<int32_t> extra_list = {5, 99, 5, -1};  // 99: past the extra cache
  for (int t = 0; t < 2; ++t) {
    std::copy(main_list.begin(), main_list.end(), p.indices.begin() + t * a.indices_stride);
    std::copy(extra_list.begin(), extra_list.end(),
              p.extra_indices.begin() + t * a.extra_indices_stride);
  }
  p.topk_length = {3, 0};        // token 0: {3, 40}; token 1: none
  p.extra_topk_length = {4, 1};  // token 0: {5, 5}; token 1: {5}
  p.sink.clear();
  const DecodeReference ref = ReferenceDecode(p);
  auto v = [&](int64_t slot, int d) {
    return static_cast<double>(
        Bf16ToFloat(p.kv[slot / 64 * a.kv_page_stride + slot % 64 * a.kv_row_stride + d]));
  };
  auto xv = [&](int64_t slot, int d) {
    return static_cast<double>(Bf16ToFloat(
        p.extra_kv[slot / 16 * a.extra_kv_page_stride + slot % 16 * a.extra_kv_row_stride + d]));
  };
  EXPECT_NEAR(ref.lse[0], std::log(4.0), 1e-12);  // 3, 40, 5, 5
  EXPECT_NEAR(ref.lse[2], 0.0, 1e-12);            // token 1: 5 alone
  for (int d : {0, 300, 511}) {
    EXPECT_NEAR(ref.out[d], (v(3, d) + v(40, d) + 2 * xv(5, d)) / 4, 1e-12) << d;
    EXPECT_NEAR(ref.out[2 * 512 + d], xv(5, d), 1e-12) << d;
  }
}

// The reference rounded to what a perfect kernel would write.
void RoundReference(const HostDecodeProblem& p, const DecodeReference& ref,
                    std::vector<uint16_t>* out, std::vector<float>* lse) {
  const DecodeArgs& a = p.args;
  out->assign(p.out_elements(), 0xFFFF);
  lse->resize(ref.lse.size());
  for (size_t row = 0; row < ref.lse.size(); ++row) {
    const int64_t t = row / a.num_q_heads, h = row % a.num_q_heads;
    for (int d = 0; d < a.d_v; ++d) {
      (*out)[t * a.out_token_stride + h * a.out_head_stride + d] =
          FloatToBf16(static_cast<float>(ref.out[row * a.d_v + d]));
    }
    (*lse)[row] = static_cast<float>(ref.lse[row]);
  }
}

TEST(CompareWithReference, PassesAPerfectResultAndCatchesEachKindOfError) {
  HostDecodeProblem p =
      MakeRandomDecodeProblem(SmallSpec(), {.batch = 3, .row_padding = 8, .seed = 5});
  std::fill(p.indices.begin(), p.indices.begin() + 8, -1);  // token 0: lse -inf
  const DecodeReference ref = ReferenceDecode(p);
  std::vector<uint16_t> out;
  std::vector<float> lse;
  RoundReference(p, ref, &out, &lse);
  const DecodeErrors good = CompareWithReference(p, ref, out, lse);
  EXPECT_TRUE(good.pass) << good.Summary();
  EXPECT_GT(good.out_ref_max, 0);
  EXPECT_TRUE(CompareWithReference(p, ref, out, {}).pass);  // lse not asked for

  const int64_t where = p.args.out_token_stride + 5;  // token 1, head 0, col 5
  std::vector<uint16_t> wrong = out;
  wrong[where] = FloatToBf16(Bf16ToFloat(out[where]) + 0.05f * good.out_ref_max);
  EXPECT_FALSE(CompareWithReference(p, ref, wrong, lse).pass);
  wrong = out;
  wrong[where] = 0xFFFF;  // a row the kernel never wrote
  EXPECT_FALSE(CompareWithReference(p, ref, wrong, lse).pass);
  std::vector<float> wrong_lse = lse;
  wrong_lse[3] += 2e-3f;
  EXPECT_FALSE(CompareWithReference(p, ref, out, wrong_lse).pass);
  wrong_lse = lse;
  wrong_lse[0] = 0.0f;  // finite where the reference says -inf
  EXPECT_FALSE(CompareWithReference(p, ref, out, wrong_lse).pass);
}

// ---- GPU: one real decode against the fp64 reference ----------------------

class SparseMlaDecodeGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<const CudaDriver*> driver = CudaDriver::Get();
    if (!driver.ok()) GTEST_SKIP() << "no GPU to run on: " << driver.status();
    cu_ = *driver;
    int count = 0;
    if (cu_->DeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
      GTEST_SKIP() << "the CUDA driver sees no device";
    }
  }

  // Uploads a random problem, runs it, checks it against the reference.
  void RunAndCheck(SparseMlaDecode& decode, const v1::AttentionSpec& spec,
                   const RandomProblemOptions& options, bool with_lse, CUstream stream) {
    SCOPED_TRACE(absl::StrCat("batch ", options.batch, ", s_q ", options.s_q, ", padding ",
                              options.row_padding, ", lse ", with_lse));
    const HostDecodeProblem problem = MakeRandomDecodeProblem(spec, options);
    absl::StatusOr<std::unique_ptr<DeviceDecodeProblem>> device =
        DeviceDecodeProblem::Upload(*cu_, problem, with_lse);
    ASSERT_TRUE(device.ok()) << device.status();
    absl::StatusOr<Selection> sel = decode.Plan((*device)->args());
    ASSERT_TRUE(sel.ok()) << sel.status();
    ASSERT_TRUE(decode.Run((*device)->args(), stream).ok());
    ASSERT_EQ(cu_->StreamSynchronize(stream), CUDA_SUCCESS);
    std::vector<uint16_t> out;
    std::vector<float> lse;
    ASSERT_TRUE((*device)->Download(&out, &lse).ok());
    const DecodeErrors errors = CompareWithReference(problem, ReferenceDecode(problem), out, lse);
    EXPECT_TRUE(errors.pass) << "splits " << sel->num_splits << ": " << errors.Summary();
    splits_seen_.push_back(sel->num_splits);
  }

  // Small enough to compile and check in seconds: 16 heads, topk 512.
  static v1::AttentionSpec SmallSpec() {
    v1::AttentionSpec spec = testing::DeepseekTp1Spec();
    spec.set_num_q_heads(16);
    spec.set_topk(512);
    spec.set_softmax_scale(0.0625f);
    return spec;
  }

  // decode_ for `spec`'s model from source_, its context current, and a
  // stream_ of that context.
  void StartDecode(const v1::AttentionSpec& spec) {
    v1::KernelSelector model;
    *model.mutable_spec() = KernelSpecOf(spec);
    absl::StatusOr<std::unique_ptr<SparseMlaDecode>> decode =
        SparseMlaDecode::Create(source_, model, 0);
    ASSERT_TRUE(decode.ok()) << decode.status();
    decode_ = *std::move(decode);
    ASSERT_EQ(cu_->CtxSetCurrent(decode_->context()), CUDA_SUCCESS);
    ASSERT_EQ(cu_->StreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }

  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cu_->StreamDestroy(stream_), CUDA_SUCCESS);
    }
  }

  const CudaDriver* cu_ = nullptr;
  CompilingSource source_;
  std::unique_ptr<SparseMlaDecode> decode_;
  CUstream stream_ = nullptr;
  std::vector<int> splits_seen_;
};

TEST_F(SparseMlaDecodeGpu, MatchesTheReference) {
  v1::AttentionSpec spec = SmallSpec();
  ASSERT_NO_FATAL_FAILURE(StartDecode(spec));
  SparseMlaDecode& d = *decode_;
  CUstream stream = stream_;

  // Few tokens: split top-k plus combine; many: one split. Padded strides
  // and no lse on the second.
  RunAndCheck(d, spec, {.batch = 2, .s_q = 1, .seed = 1}, true, stream);
  RunAndCheck(d, spec, {.batch = 200, .s_q = 1, .row_padding = 8, .seed = 2}, false, stream);
  // MTP (s_q 2) runs on the same kernel: nothing more is fetched.
  spec.set_s_q(2);
  RunAndCheck(d, spec, {.batch = 3, .s_q = 2, .row_padding = 16, .seed = 3}, true, stream);
  EXPECT_EQ(source_.kernel_calls, 1);  // one kernel serves s_q 1 and 2
  ASSERT_EQ(splits_seen_.size(), 3u);
  EXPECT_GT(splits_seen_[0], 1);
  EXPECT_EQ(splits_seen_[1], 1);

  // Reserve covers every later call: Run must not grow the workspace.
  ASSERT_TRUE(d.Reserve(64).ok());
  const uint64_t reserved = d.workspace_bytes();
  EXPECT_GT(reserved, 0u);
  spec.set_s_q(1);
  RunAndCheck(d, spec, {.batch = 1, .s_q = 1, .seed = 4}, true, stream);
  EXPECT_EQ(d.workspace_bytes(), reserved);
}

// A first answer (only the main and combine entries) runs every shape: the
// runtime plans it as the module it is, never naming an entry it lacks,
// and reserves for those plans.
TEST_F(SparseMlaDecodeGpu, AFirstAnswerRunsAsTheModuleItIs) {
  source_.first_answer = true;
  v1::AttentionSpec spec = SmallSpec();
  ASSERT_NO_FATAL_FAILURE(StartDecode(spec));
  SparseMlaDecode& d = *decode_;
  ASSERT_TRUE(d.Prefetch().ok());
  EXPECT_EQ(source_.first_answers, 1);
  const v1::ManifestVariant& full = FirstChoice(d.manifest());
  ASSERT_FALSE(full.small_batch().entry().empty()) << "a module with more than a first answer";
  for (int batch : {1, 2, 5, 200}) {
    RunAndCheck(d, spec, {.batch = batch, .s_q = 1, .seed = static_cast<uint64_t>(20 + batch)},
                batch < 100, stream_);
  }
  HostDecodeProblem problem = MakeRandomDecodeProblem(spec, {.batch = 2, .s_q = 1, .seed = 30});
  absl::StatusOr<std::unique_ptr<DeviceDecodeProblem>> device =
      DeviceDecodeProblem::Upload(*cu_, problem, true);
  ASSERT_TRUE(device.ok()) << device.status();
  absl::StatusOr<Selection> sel = d.Plan((*device)->args());
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_FALSE(sel->small_batch);
  EXPECT_EQ(*sel->main_entry, full.main_entry());
  EXPECT_EQ(source_.kernel_calls, 1);
  ASSERT_TRUE(d.Reserve(64).ok());
  const uint64_t reserved = d.workspace_bytes();
  RunAndCheck(d, spec, {.batch = 3, .s_q = 1, .seed = 31}, true, stream_);
  EXPECT_EQ(d.workspace_bytes(), reserved);

  // A source still answering first answers: nothing replaced.
  EXPECT_TRUE(d.HoldsFirstAnswer());
  absl::StatusOr<int> replaced = d.Refresh();
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(*replaced, 0);
  EXPECT_TRUE(d.HoldsFirstAnswer());
  // Once it has the whole module: loaded in the first answer's place and
  // planned as the manifest has it (its small-batch entry at 2 tokens),
  // with the workspace Reserve asked for; a second Refresh asks nothing.
  source_.first_answer = false;
  replaced = d.Refresh();
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(*replaced, 1);
  EXPECT_FALSE(d.HoldsFirstAnswer());
  const int calls = source_.kernel_calls;
  replaced = d.Refresh();
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(*replaced, 0);
  EXPECT_EQ(source_.kernel_calls, calls);
  sel = d.Plan((*device)->args());
  ASSERT_TRUE(sel.ok()) << sel.status();
  EXPECT_TRUE(sel->small_batch);
  const uint64_t whole = d.workspace_bytes();
  for (int batch : {1, 2, 5, 64}) {
    RunAndCheck(d, spec, {.batch = batch, .s_q = 1, .seed = static_cast<uint64_t>(40 + batch)},
                true, stream_);
  }
  EXPECT_EQ(d.workspace_bytes(), whole);  // Refresh sized it for Reserve's 64 tokens
}

// Per-token and per-request top-k lengths and an attention sink, through
// the split + combine path (few tokens) and the single-split one (many).
TEST_F(SparseMlaDecodeGpu, HonoursTopkLengthAndSink) {
  v1::AttentionSpec spec = SmallSpec();
  ASSERT_NO_FATAL_FAILURE(StartDecode(spec));
  SparseMlaDecode& d = *decode_;
  RunAndCheck(d, spec, {.batch = 2, .seed = 11, .topk_length = 1, .sink = true}, true, stream_);
  RunAndCheck(d, spec, {.batch = 200, .row_padding = 8, .seed = 12, .topk_length = 1}, true,
              stream_);
  RunAndCheck(d, spec, {.batch = 200, .seed = 13, .sink = true}, true, stream_);
  spec.set_s_q(2);
  RunAndCheck(d, spec, {.batch = 3, .s_q = 2, .seed = 14, .topk_length = 2, .sink = true}, true,
              stream_);
  ASSERT_EQ(splits_seen_.size(), 4u);
  EXPECT_GT(splits_seen_[0], 1);
  EXPECT_EQ(splits_seen_[1], 1);
}

// A second (extra) KV cache in the same softmax (spec extra_kv): bf16 with
// its own page size and top-k, with and without lengths and a sink,
// through split + combine (few tokens) and one split (many).
TEST_F(SparseMlaDecodeGpu, AttendsTheExtraCacheInTheSameSoftmax) {
  v1::AttentionSpec spec = SmallSpec();
  v1::ExtraKvCache* x = spec.mutable_extra_kv();
  x->set_kv_cache_dtype(v1::KV_CACHE_DTYPE_BF16);
  x->set_topk(128);
  x->set_page_block_size(32);
  ASSERT_NO_FATAL_FAILURE(StartDecode(spec));
  SparseMlaDecode& d = *decode_;
  RunAndCheck(d, spec, {.batch = 2, .seed = 21}, true, stream_);
  RunAndCheck(d, spec, {.batch = 2, .row_padding = 8, .seed = 22, .topk_length = 1, .sink = true},
              true, stream_);
  RunAndCheck(d, spec, {.batch = 200, .seed = 23, .topk_length = 1}, true, stream_);
  spec.set_s_q(2);
  RunAndCheck(d, spec, {.batch = 3, .s_q = 2, .seed = 24, .topk_length = 2}, false, stream_);
  ASSERT_EQ(splits_seen_.size(), 4u);
  EXPECT_GT(splits_seen_[0], 1);
}

// What an engine does before serving: prefetch, reserve, capture a decode
// step in a CUDA graph, replay it. The replay must compute the step again
// (outputs re-poisoned in between), and a Run that would have to grow the
// workspace during capture must refuse instead of breaking the capture.
TEST_F(SparseMlaDecodeGpu, CapturedGraphReplaysAndCaptureNeverAllocates) {
  v1::AttentionSpec spec = SmallSpec();
  ASSERT_NO_FATAL_FAILURE(StartDecode(spec));
  SparseMlaDecode& d = *decode_;
  CUstream stream = stream_;
  const HostDecodeProblem problem =
      MakeRandomDecodeProblem(spec, {.batch = 2, .s_q = 1, .seed = 7});
  absl::StatusOr<std::unique_ptr<DeviceDecodeProblem>> device =
      DeviceDecodeProblem::Upload(*cu_, problem, /*with_lse=*/true);
  ASSERT_TRUE(device.ok()) << device.status();
  const DecodeArgs& args = (*device)->args();
  absl::StatusOr<Selection> sel = d.Plan(args);
  ASSERT_TRUE(sel.ok()) << sel.status();
  ASSERT_TRUE(sel->needs_combine) << "the case must exercise the workspace";

  // Global capture mode, as PyTorch's graph capture uses by default: any
  // unsafe call (an allocation, a module load) during capture would fail.
  ASSERT_TRUE(d.Prefetch().ok());
  // Nothing reserved yet: the call needs workspace, so it must refuse.
  ASSERT_EQ(cu_->StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  const absl::Status refused = d.Run(args, stream);
  CUgraph graph = nullptr;
  ASSERT_EQ(cu_->StreamEndCapture(stream, &graph), CUDA_SUCCESS);
  if (graph != nullptr) cu_->GraphDestroy(graph);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(testing::Contains(refused.message(), "Reserve")) << refused;
  EXPECT_EQ(d.workspace_bytes(), 0u);

  ASSERT_TRUE(d.Reserve(64).ok());
  ASSERT_EQ(cu_->StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  const absl::Status captured = d.Run(args, stream);
  ASSERT_EQ(cu_->StreamEndCapture(stream, &graph), CUDA_SUCCESS);
  ASSERT_TRUE(captured.ok()) << captured;
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cu_->GraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  const DecodeReference reference = ReferenceDecode(problem);
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE(absl::StrCat("replay ", replay));
    // Capture launches nothing; before each replay the outputs are NaN.
    if (replay > 0) {
      ASSERT_EQ(cu_->MemsetD8(args.out, 0xFF,
                              static_cast<size_t>(args.out_token_stride) * args.batch * 2),
                CUDA_SUCCESS);
      ASSERT_EQ(cu_->MemsetD8(args.lse, 0xFF, sizeof(float) * args.batch * args.num_q_heads),
                CUDA_SUCCESS);
    }
    ASSERT_EQ(cu_->GraphLaunch(exec, stream), CUDA_SUCCESS);
    ASSERT_EQ(cu_->StreamSynchronize(stream), CUDA_SUCCESS);
    std::vector<uint16_t> out;
    std::vector<float> lse;
    ASSERT_TRUE((*device)->Download(&out, &lse).ok());
    const DecodeErrors errors = CompareWithReference(problem, reference, out, lse);
    EXPECT_TRUE(errors.pass) << errors.Summary();
  }
  EXPECT_EQ(cu_->GraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cu_->GraphDestroy(graph), CUDA_SUCCESS);
}

}  // namespace
}  // namespace kforge
