// `kforge warm` end to end: a real `kforge serve` on loopback with its own
// cache directory, and the `kforge warm` binary run against it with small
// matrix files. Kernels are glm-5 at TP 8 on sm_90a (about a second each).
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kforge/v1/service.grpc.pb.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

using ::kforge::testing::Contains;
using ::kforge::testing::ServeProcess;
using ::kforge::testing::TempDir;

constexpr char kBinary[] = KFORGE_BINARY;

struct RunResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// Runs `kforge ARGS...` through the shell and collects its output.
RunResult RunKforge(const std::vector<std::string>& args) {
  std::string command = absl::StrCat("'", kBinary, "'");
  for (const std::string& a : args) {
    absl::StrAppend(&command, " '", absl::StrReplaceAll(a, {{"'", "'\\''"}}), "'");
  }
  absl::StrAppend(&command, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed: " << command;
    return {-1, ""};
  }
  RunResult result{-1, ""};
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) result.output.append(buf, n);
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

class WarmTest : public ::testing::Test {
 protected:
  void TearDown() override {
    stub_.reset();  // an open channel would hold the drain for its grace
    if (server_ != nullptr) {
      server_->Signal(SIGTERM);  // drains and exits 0
      EXPECT_EQ(server_->WaitExit(absl::Seconds(30)), 0);
    }
  }

  // Starts `kforge serve` on a free port, with `args` added for it.
  void StartServer(std::vector<std::string> args = {}) {
    args.insert(args.begin(), {"--workers", "2"});
    server_ = std::make_unique<ServeProcess>(kBinary, dir_.path() / "cache",
                                             dir_.path() / "server.log", std::move(args));
    ASSERT_TRUE(server_->WaitForAddress());
    address_ = server_->address();
    stub_ = v1::KernelService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  RunResult Warm(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"warm"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunKforge(argv);
  }

  std::string Matrix(const std::string& json) {
    const std::filesystem::path path = dir_.path() / absl::StrCat("matrix", ++matrices_, ".json");
    std::ofstream(path, std::ios::binary) << json;
    return path.string();
  }

  v1::StatsResponse Stats() {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::StatsResponse stats;
    const grpc::Status s = stub_->Stats(&context, v1::StatsRequest(), &stats);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return stats;
  }

  TempDir dir_{"kforge_warm_test"};
  std::unique_ptr<ServeProcess> server_;
  std::string address_;
  std::unique_ptr<v1::KernelService::Stub> stub_;
  int matrices_ = 0;
};

constexpr char kGlm5Tp8[] =
    R"({"models": [{"preset": "glm-5", "tp": [4, 8], "s_q": [1, 2]}], "archs": ["sm_90a"]})";

TEST_F(WarmTest, CompilesEveryKernelOnceThenFindsThemCached) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string matrix = Matrix(kGlm5Tp8);

  RunResult first = Warm({"--server", address_, matrix});
  EXPECT_EQ(first.exit_code, 0) << first.output;
  // Not a terminal: one plain line per kernel.
  EXPECT_TRUE(Contains(first.output, "ok")) << first.output;
  EXPECT_TRUE(Contains(first.output, "glm-5 tp4 bf16 sm_90a\n"));
  EXPECT_TRUE(Contains(first.output, "glm-5 tp8 bf16 sm_90a\n"));
  EXPECT_TRUE(Contains(first.output, "2/2 done in"));
  EXPECT_TRUE(Contains(first.output, "warm: 2 kernels, 2 compiled, 0 cached, 0 failed"));
  EXPECT_EQ(Stats().compiles(), 2u);

  RunResult second = Warm({"--server", address_, matrix});
  EXPECT_EQ(second.exit_code, 0) << second.output;
  EXPECT_TRUE(Contains(second.output, "glm-5 tp4 bf16 sm_90a (cached)"));
  EXPECT_TRUE(Contains(second.output, "glm-5 tp8 bf16 sm_90a (cached)"));
  EXPECT_TRUE(Contains(second.output, "warm: 2 kernels, 0 compiled, 2 cached, 0 failed"));
  EXPECT_EQ(Stats().compiles(), 2u);
}

TEST_F(WarmTest, FailedKernelsAreListedAndExitOne) {
  // The compile worker's crash hook (service/compile_pool.cc) fails every
  // kernel with topk 1000; the glm-5 preset kernel still builds.
  ASSERT_NO_FATAL_FAILURE(StartServer({"--test-worker-crash-topk", "1000"}));
  const std::string matrix = Matrix(R"({"models": [
      {"preset": "glm-5", "tp": [8]},
      {"name": "crashy", "tp": [8], "spec": {
         "num_q_heads": 64,
         "kv_lora_rank": 512, "rope_dim": 64, "topk": 1000,
         "page_block_size": 64, "softmax_scale": 0.0625}}],
      "archs": ["sm_90a"]})");
  RunResult run = Warm({"--server", address_, "-j", "2", matrix});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_TRUE(Contains(run.output, "FAIL")) << run.output;
  EXPECT_TRUE(Contains(run.output, "  FAIL crashy tp8 bf16 sm_90a:\n    "));
  EXPECT_TRUE(Contains(run.output, "2/2 done in"));
  EXPECT_TRUE(Contains(run.output, "warm: 2 kernels, 1 compiled, 0 cached, 1 failed"));
}

TEST_F(WarmTest, BadMatrixFailsBeforeAnyCall) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const std::string matrix =
      Matrix(R"({"models": [{"preset": "glm-6", "tp": [8]}], "archs": ["sm_90a"]})");
  RunResult run = Warm({"--server", address_, matrix});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_TRUE(Contains(run.output, absl::StrCat(matrix, ": models[0].preset")));
  EXPECT_TRUE(Contains(run.output, "\"glm-6\""));
  const v1::StatsResponse stats = Stats();
  EXPECT_EQ(stats.misses() + stats.memory_hits() + stats.disk_hits(), 0u);
}

TEST_F(WarmTest, UnreachableServerExitsTwo) {
  // A port that was free a moment ago: nothing listens there.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  const std::string address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));

  RunResult run = Warm({"--server", address, "--connect-timeout", "2", Matrix(kGlm5Tp8)});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_TRUE(Contains(run.output, absl::StrCat("cannot reach kforge server at ", address)));
}

TEST_F(WarmTest, UsageErrorsExitTwo) {
  RunResult extra = Warm({"a.json", "b.json"});
  EXPECT_EQ(extra.exit_code, 2);
  EXPECT_TRUE(Contains(extra.output, "at most one MATRIX"));
  RunResult flag = Warm({"--jobs", "many"});
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_TRUE(Contains(flag.output, "--jobs"));
  RunResult missing = Warm({(dir_.path() / "none.json").string()});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_TRUE(Contains(missing.output, "none.json"));
}

}  // namespace
}  // namespace kforge
