#include "compiler/nvrtc.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

using ::kforge::testing::TextSection;
using ::kforge::testing::TextSections;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::StartsWith;

// Our own header, so these tests do not depend on the real templates. Its
// include name mimics the embedded layout.
constexpr char kHeaderPath[] = "kforge/test/scale.cuh";
constexpr char kHeader[] = R"(
#pragma once
namespace kforge_test {
template <int kFactor>
__device__ __forceinline__ float Scale(float x) { return x * kFactor; }
}  // namespace kforge_test
)";

constexpr char kKernel[] = R"(
#include "kforge/test/scale.cuh"
extern "C" __global__ void kforge_test_scale(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = kforge_test::Scale<3>(x[i]);
}
)";

NvrtcRequest Request(std::string source, std::string arch) {
  NvrtcRequest request;
  request.source = std::move(source);
  request.program_name = "nvrtc_test.cu";
  request.arch = std::move(arch);
  request.headers = {{kHeaderPath, kHeader}};
  return request;
}

class NvrtcArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(NvrtcArchTest, CompilesHeaderKernelToCubin) {
  const std::string arch = GetParam();
  absl::StatusOr<NvrtcResult> result = CompileWithNvrtc(Request(kKernel, arch));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->cubin, StartsWith("\177ELF"));
  EXPECT_GT(result->cubin.size(), 64u);
  EXPECT_THAT(result->options, Contains("-no-cache"));
  EXPECT_THAT(result->options, Contains(absl::StrCat("--gpu-architecture=", arch)));
  EXPECT_EQ(result->options, BaseNvrtcOptions(arch));
  EXPECT_GT(result->seconds, 0);
  // The entry point is extern "C", so its name appears unmangled.
  EXPECT_THAT(result->cubin, HasSubstr("kforge_test_scale"));
}

INSTANTIATE_TEST_SUITE_P(Archs, NvrtcArchTest, ::testing::Values("sm_80", "sm_90a", "sm_120a"));

TEST(NvrtcTest, BaseOptionsHaveNoIncludePath) {
  for (const std::string& option : BaseNvrtcOptions("sm_90a")) {
    EXPECT_THAT(option, Not(StartsWith("-I")));
    EXPECT_THAT(option, Not(StartsWith("--include-path")));
    EXPECT_THAT(option, Not(HasSubstr("/")));
  }
}

TEST(NvrtcTest, ExtraOptionsFollowBaseOptions) {
  NvrtcRequest request = Request(kKernel, "sm_90a");
  request.extra_options = {"-lineinfo"};
  absl::StatusOr<NvrtcResult> result = CompileWithNvrtc(request);
  ASSERT_TRUE(result.ok()) << result.status();
  std::vector<std::string> expected = BaseNvrtcOptions("sm_90a");
  expected.push_back("-lineinfo");
  EXPECT_EQ(result->options, expected);
}

TEST(NvrtcTest, SyntaxErrorReturnsInternalWithLogAndOptions) {
  absl::StatusOr<NvrtcResult> result = CompileWithNvrtc(
      Request("extern \"C\" __global__ void broken(float* x) { x[0] = 1.f }\n", "sm_90a"));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  const std::string message(result.status().message());
  EXPECT_THAT(message, HasSubstr("nvrtc_test.cu"));
  EXPECT_THAT(message, HasSubstr("expected a \";\""));  // NVRTC's own text
  for (const std::string& option : BaseNvrtcOptions("sm_90a")) {
    EXPECT_THAT(message, HasSubstr(option));
  }
}

TEST(NvrtcTest, HugeLogIsTruncatedAndSaysSo) {
  // NVRTC stops after 100 errors; each of these names a 1000-character
  // undeclared identifier twice (message and source line): ~200 KB of log.
  std::string source = "extern \"C\" __global__ void k(int* x) {\n";
  const std::string padding(1000, 'y');
  for (int i = 0; i < 200; ++i) {
    absl::StrAppend(&source, "x[0] = ", padding, i, ";\n");
  }
  source += "}\n";
  absl::StatusOr<NvrtcResult> result = CompileWithNvrtc(Request(source, "sm_90a"));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  const std::string message(result.status().message());
  EXPECT_THAT(message, HasSubstr("NVRTC log truncated"));
  EXPECT_THAT(message, HasSubstr("Error limit reached"));  // the tail is kept
  EXPECT_LT(message.size(), 70u * 1024);
}

// No toolkit include path leaks in: the CUDA runtime header is not reachable
// even though the toolkit is installed on this machine.
TEST(NvrtcTest, ToolkitHeadersAreNotReachable) {
  for (const char* include : {"<cuda_runtime.h>", "<cuda_bf16.h>", "<cuda/std/cstdint>",
                              "<stdint.h>", "\"kforge/test/missing.cuh\""}) {
    absl::StatusOr<NvrtcResult> result =
        CompileWithNvrtc(Request(absl::StrCat("#include ", include, "\n", kKernel), "sm_90a"));
    ASSERT_FALSE(result.ok()) << include;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(std::string(result.status().message()), HasSubstr("could not open source file"))
        << include;
  }
}

// NVRTC would otherwise search the program's own directory for quoted
// includes: a file there must not be picked up.
TEST(NvrtcTest, ProgramDirectoryIsNotSearched) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "nvrtc_test_srcdir";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "stray.cuh") << "#define KFORGE_STRAY 1\n";
  NvrtcRequest request = Request(absl::StrCat("#include \"stray.cuh\"\n", kKernel), "sm_90a");
  request.program_name = (dir / "program.cu").string();
  absl::StatusOr<NvrtcResult> result = CompileWithNvrtc(request);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("could not open source file \"stray.cuh\""));
}

TEST(NvrtcTest, VirtualArchIsRejected) {
  absl::StatusOr<NvrtcResult> result = CompileWithNvrtc(Request(kKernel, "compute_90"));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()),
              AllOf(HasSubstr("compute_90"), HasSubstr("no cubin")));
}

TEST(NvrtcTest, EmptyArchIsRejected) {
  absl::StatusOr<NvrtcResult> result = CompileWithNvrtc(Request(kKernel, ""));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
}

// NVRTC is thread-safe for distinct programs; each call owns its own.
TEST(NvrtcTest, ConcurrentCompilesSucceed) {
  const std::vector<std::string> archs = {"sm_80", "sm_90a", "sm_120a", "sm_90a"};
  std::vector<absl::StatusOr<NvrtcResult>> results(archs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < archs.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = CompileWithNvrtc(Request(kKernel, archs[i])); });
  }
  for (std::thread& thread : threads) thread.join();
  for (size_t i = 0; i < archs.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << archs[i] << ": " << results[i].status();
    EXPECT_THAT(results[i]->cubin, StartsWith("\177ELF"));
  }
  // Same input, same bytes: NVRTC output is deterministic.
  EXPECT_EQ(results[1]->cubin, results[3]->cubin);
}

// Three entries with enough work for ptxas to take a while: each its own
// loop nest, so a parallel ptxas has something to share out.
constexpr char kThreeKernels[] = R"(
template <int kN>
__device__ __forceinline__ float Poly(float x) {
  float y = 0.f;
#pragma unroll
  for (int i = 0; i < kN; ++i) y = y * x + 1.f / (i + 1);
  return y;
}
extern "C" __global__ void kforge_a(float* x, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = Poly<24>(x[i]);
}
extern "C" __global__ void kforge_b(float* x, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = Poly<40>(x[i]) * x[n - 1 - i];
}
extern "C" __global__ void kforge_c(double* x, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = sqrt(x[i]) + Poly<16>(float(x[i]));
}
)";

// Every entry's machine code: its .text.<entry> section's bytes.
std::map<std::string, std::string> EntryCode(const std::string& cubin) {
  std::map<std::string, std::string> out;
  for (const TextSection& text : TextSections(cubin)) {
    out[text.name] = cubin.substr(text.offset, text.size);
  }
  return out;
}

// The base options run ptxas on several threads: the machine code must be
// what one thread makes, and the cubin the same every time (bundles are
// compared byte for byte across hosts).
TEST(NvrtcTest, ParallelPtxasKeepsMachineCodeAndIsReproducible) {
  for (const char* arch : {"sm_80", "sm_90a", "sm_120a"}) {
    absl::StatusOr<NvrtcResult> a = CompileWithNvrtc(Request(kThreeKernels, arch));
    absl::StatusOr<NvrtcResult> b = CompileWithNvrtc(Request(kThreeKernels, arch));
    NvrtcRequest one_thread = Request(kThreeKernels, arch);
    one_thread.extra_options = {"--ptxas-options=--split-compile=1"};
    absl::StatusOr<NvrtcResult> c = CompileWithNvrtc(one_thread);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << arch;
    EXPECT_EQ(a->cubin, b->cubin) << arch;
    const std::map<std::string, std::string> code = EntryCode(a->cubin);
    EXPECT_EQ(code.size(), 3u) << arch;
    EXPECT_EQ(code, EntryCode(c->cubin)) << arch;
  }
}

TEST(NvrtcTest, VersionIsMajorDotMinor) {
  EXPECT_THAT(NvrtcVersion(), MatchesRegex("^[0-9]+\\.[0-9]+$"));
}

}  // namespace
}  // namespace kforge
