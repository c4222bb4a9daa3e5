#include "compiler/nvrtc.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kforge {
namespace {

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

TEST(NvrtcTest, VersionIsMajorDotMinor) {
  EXPECT_THAT(NvrtcVersion(), MatchesRegex("^[0-9]+\\.[0-9]+$"));
}

}  // namespace
}  // namespace kforge
