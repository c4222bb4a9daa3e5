// `kforge prebuild` and `kforge verify` end to end (the kforge binary on
// small matrices: glm-5 on sm_90a, about a second a kernel with NVRTC, no
// GPU), `kforge serve --warm-from` on the bundles they write,
// and PrebuildBundle's stop.
#include "deploy/prebuild.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/io.h"
#include "base/sha256.h"
#include "bundle/bundle.h"
#include "compiler/compiler.h"
#include "compiler/key.h"
#include "compiler/manifest.h"
#include "deploy/matrix.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kforge/v1/service.grpc.pb.h"
#include "model/spec.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using ::kforge::testing::Contains;
using ::kforge::testing::ReadFileOrEmpty;
using ::kforge::testing::ServeProcess;
using ::kforge::testing::TempDir;
using ::kforge::testing::TextSection;
using ::kforge::testing::TextSections;

constexpr char kBinary[] = KFORGE_BINARY;
constexpr char kArch[] = "sm_90a";

// Two kernels and two manifests (TP 4 and 8). The s_q list is still
// accepted and adds nothing: s_q is not part of the kernel.
constexpr char kGlm5Tp8[] =
    R"({"models": [{"preset": "glm-5", "tp": [4, 8], "s_q": [1, 2]}], "archs": ["sm_90a"]})";

// ---------------------------------------------------------------------------
// The kforge binary

// A `kforge ARGS...` child process with stdout and stderr in a log file and
// `env` added to the test's environment (less its KFORGE_TEST_ hooks);
// killed at the end of its scope if still running.
class Kforge {
 public:
  Kforge(const fs::path& log, std::vector<std::string> args, std::vector<std::string> env = {})
      : log_(log) {
    args.insert(args.begin(), kBinary);
    pid_ = testing::SpawnWithLog(std::move(args), std::move(env), log);
  }
  ~Kforge() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Kforge(const Kforge&) = delete;
  Kforge& operator=(const Kforge&) = delete;

  void Signal(int signo) { kill(pid_, signo); }

  // The exit code, or -signal when killed by one; -1000 after `timeout`.
  int Wait(absl::Duration timeout = absl::Seconds(300)) {
    const absl::Time deadline = absl::Now() + timeout;
    int status = 0;
    while (pid_ > 0) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      if (absl::Now() > deadline) return -1000;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }

  // True once the log holds `needle`; false when the process ended or
  // `timeout` passed first.
  bool WaitForLog(const std::string& needle, absl::Duration timeout) {
    for (const absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;
         absl::SleepFor(absl::Milliseconds(5))) {
      if (absl::StrContains(Log(), needle)) return true;
      if (pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == pid_) pid_ = -1;
      if (pid_ <= 0) return absl::StrContains(Log(), needle);
    }
    return false;
  }

  std::string Log() const { return ReadFileOrEmpty(log_); }

 private:
  fs::path log_;
  pid_t pid_ = -1;
};

struct RunResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// grpc.health.v1.Health/Check with no service name, as raw bytes (no
// health proto here): SERVING is the response {status: 1}.
bool IsServing(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  grpc::Slice empty("");  // an empty HealthCheckRequest: a buffer of no slices is refused
  grpc::ByteBuffer request(&empty, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  if (!done.get_future().get().ok()) return false;
  std::vector<grpc::Slice> slices;
  (void)response.Dump(&slices);
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes == std::string("\x08\x01", 2);
}

v1::AttentionSpec Glm5Spec(int tp, uint32_t s_q) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("glm-5", tp);
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->set_s_q(s_q);
  return *spec;
}

std::vector<fs::path> FilesIn(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

class PrebuildTest : public ::testing::Test {
 protected:
  RunResult Kf(std::vector<std::string> args, std::vector<std::string> env = {}) {
    Kforge child(dir_.path() / absl::StrCat("run", ++runs_, ".log"), std::move(args),
                 std::move(env));
    const int code = child.Wait();
    return {code, child.Log()};
  }

  RunResult Prebuild(const std::string& matrix_json, const fs::path& out,
                     std::vector<std::string> extra_args = {}) {
    std::vector<std::string> args = {"prebuild", Matrix(matrix_json), "--out", out.string(), "-j",
                                     "2"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    return Kf(std::move(args));
  }

  RunResult Verify(const fs::path& bundle) { return Kf({"verify", bundle.string()}); }

  std::string Matrix(const std::string& json) {
    const fs::path path = dir_.path() / absl::StrCat("matrix", ++runs_, ".json");
    std::ofstream(path, std::ios::binary) << json;
    return path.string();
  }

  // `kforge serve --warm-from bundle` on an empty cache directory.
  std::unique_ptr<ServeProcess> ServeFrom(const fs::path& bundle) {
    const int n = ++runs_;
    return std::make_unique<ServeProcess>(kBinary, dir_.path() / absl::StrCat("cache", n),
                                          dir_.path() / absl::StrCat("serve", n, ".log"),
                                          std::vector<std::string>{"--warm-from", bundle.string()});
  }

  // Waits for the warm-up line and a SERVING health answer.
  void WaitUntilWarm(ServeProcess& server, std::shared_ptr<grpc::Channel>* channel) {
    ASSERT_TRUE(server.WaitForAddress());
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);
    *channel =
        grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args);
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!absl::StrContains(server.Log(), "kforge: warm-up done") || !IsServing(*channel)) {
      ASSERT_TRUE(server.running()) << server.Log();
      ASSERT_LT(absl::Now(), deadline) << "never warm and SERVING:\n" << server.Log();
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  TempDir dir_{"kforge_prebuild_test"};
  int runs_ = 0;
};

v1::GetKernelResponse GetKernel(v1::KernelService::Stub& stub, int tp, uint32_t s_q,
                                grpc::Status* status) {
  v1::GetKernelRequest request;
  *request.mutable_kernel()->mutable_spec() = KernelSpecOf(Glm5Spec(tp, s_q));
  request.set_arch(kArch);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::GetKernelResponse response;
  *status = stub.GetKernel(&context, request, &response);
  return response;
}

v1::StatsResponse Stats(v1::KernelService::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::StatsResponse stats;
  const grpc::Status s = stub.Stats(&context, v1::StatsRequest(), &stats);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return stats;
}

TEST_F(PrebuildTest, BundleVerifiesAndWarmsAServerThatThenCompilesNothing) {
  const fs::path bundle = dir_.path() / "bundle";
  const RunResult built = Prebuild(kGlm5Tp8, bundle);
  ASSERT_EQ(built.exit_code, 0) << built.output;
  // Not a terminal: one plain line per kernel, then the summary.
  EXPECT_TRUE(Contains(built.output, "ok")) << built.output;
  EXPECT_TRUE(Contains(built.output, "glm-5 tp4 bf16 sm_90a\n"));
  EXPECT_TRUE(Contains(built.output, "glm-5 tp8 bf16 sm_90a\n"));
  EXPECT_TRUE(Contains(built.output,
                       "2 kernels, 2 compiled, 0 already in the bundle, 0 failed; 2 manifests"));
  EXPECT_EQ(FilesIn(bundle / "kernels").size(), 2u);
  EXPECT_EQ(FilesIn(bundle / "manifests").size(), 2u);

  const RunResult verified = Verify(bundle);
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_TRUE(Contains(verified.output, "OK, 2 kernels, 2 manifests"));

  std::unique_ptr<ServeProcess> server = ServeFrom(bundle);
  std::shared_ptr<grpc::Channel> channel;
  ASSERT_NO_FATAL_FAILURE(WaitUntilWarm(*server, &channel));
  EXPECT_TRUE(Contains(server->Log(), "2 kernels, 2 loaded, 0 already cached, 0 skipped; SERVING"));
  auto stub = v1::KernelService::NewStub(channel);
  // Every s_q of each model is served by its one kernel.
  for (int tp : {4, 8}) {
    for (uint32_t s_q : {1u, 2u}) {
      grpc::Status status;
      const v1::GetKernelResponse r = GetKernel(*stub, tp, s_q, &status);
      ASSERT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(r.source(), v1::ARTIFACT_SOURCE_MEMORY) << "tp " << tp << " s_q " << s_q;
      EXPECT_FALSE(r.artifact().cubin().empty());
    }
  }
  const v1::StatsResponse stats = Stats(*stub);
  EXPECT_EQ(stats.compiles(), 0u);
  EXPECT_EQ(stats.memory_hits(), 4u);
}

// One kernel: glm-5 TP 8.
constexpr char kGlm5Tp8Only[] =
    R"({"models": [{"preset": "glm-5", "tp": [8]}], "archs": ["sm_90a"]})";

// The offset of a byte in the middle of the first .text.<kernel> section of
// an ELF64 cubin (longer than 16 bytes), or 0.
size_t KernelCodeOffset(const std::string& elf) {
  for (const TextSection& text : TextSections(elf)) {
    if (text.size > 16) return text.offset + text.size / 2;
  }
  return 0;
}

// checksums.sha256 recomputed over the files it lists (what someone who
// tampers with an unsigned bundle does).
void RewriteChecksums(const fs::path& bundle) {
  std::istringstream in(ReadFileOrEmpty(bundle / kBundleChecksumsFile));
  std::string out, line;
  while (std::getline(in, line)) {
    const std::string path = line.substr(line.find("  ") + 2);
    out += absl::StrCat(Sha256Hex(ReadFileOrEmpty(bundle / path)), "  ", path, "\n");
  }
  std::ofstream(bundle / kBundleChecksumsFile, std::ios::binary | std::ios::trunc) << out;
}

// Finding 2 of issue 43: a kernel planted in the cache by `serve
// --warm-from` of an unsigned, tampered bundle (one byte of its code
// changed, checksums recomputed: it passes every check but the signature)
// outlived --trust. Its entry records that it came from an unsigned bundle,
// so a server with --trust neither counts it as already cached nor serves
// it, with a signed bundle or without one.
TEST_F(PrebuildTest, AKernelPlantedByAnUnsignedBundleIsNeverServedUnderTrust) {
  const fs::path signer = dir_.path() / "signer";
  const RunResult keygen = Kf({"keygen", "--out", signer.string()});
  ASSERT_EQ(keygen.exit_code, 0) << keygen.output;
  const fs::path signed_bundle = dir_.path() / "signed";
  const RunResult built =
      Prebuild(kGlm5Tp8Only, signed_bundle, {"--sign", signer.string() + ".key"});
  ASSERT_EQ(built.exit_code, 0) << built.output;

  const fs::path tampered = dir_.path() / "tampered";
  fs::copy(signed_bundle, tampered, fs::copy_options::recursive);
  fs::remove(tampered / kBundleSignatureFile);
  const std::vector<fs::path> kernels = FilesIn(tampered / "kernels");
  ASSERT_EQ(kernels.size(), 1u);
  v1::KernelArtifact genuine;
  ASSERT_TRUE(genuine.ParseFromString(ReadFileOrEmpty(kernels[0])));
  v1::KernelArtifact planted = genuine;
  const size_t at = KernelCodeOffset(planted.cubin());
  ASSERT_GT(at, 0u);
  ASSERT_LT(at, planted.cubin().size());
  (*planted.mutable_cubin())[at] ^= 0x5a;
  std::ofstream(kernels[0], std::ios::binary | std::ios::trunc) << planted.SerializeAsString();
  RewriteChecksums(tampered);
  const RunResult verified = Verify(tampered);
  ASSERT_EQ(verified.exit_code, 0) << "the tampered bundle must pass all but the signature:\n"
                                   << verified.output;

  auto plant = [&](const fs::path& cache, const std::string& name) {
    ServeProcess server(kBinary, cache, dir_.path() / (name + ".log"),
                        {"--warm-from", tampered.string()});
    std::shared_ptr<grpc::Channel> channel;
    ASSERT_NO_FATAL_FAILURE(WaitUntilWarm(server, &channel));
    EXPECT_TRUE(Contains(server.Log(), "1 kernels, 1 loaded"));
    // Without --trust an unsigned bundle is believed: that is what it asks.
    auto stub = v1::KernelService::NewStub(channel);
    grpc::Status status;
    const v1::GetKernelResponse r = GetKernel(*stub, 8, 1, &status);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(r.artifact().cubin() == planted.cubin());
  };
  const std::string pub = signer.string() + ".pub";

  // A signed warm-up with --trust on the planted cache.
  const fs::path cache = dir_.path() / "cache_warm";
  ASSERT_NO_FATAL_FAILURE(plant(cache, "plant1"));
  {
    ServeProcess server(kBinary, cache, dir_.path() / "trusted_warm.log",
                        {"--warm-from", signed_bundle.string(), "--trust", pub});
    std::shared_ptr<grpc::Channel> channel;
    ASSERT_NO_FATAL_FAILURE(WaitUntilWarm(server, &channel));
    EXPECT_TRUE(Contains(server.Log(), "1 kernels, 1 loaded, 0 already cached"));
    EXPECT_TRUE(Contains(server.Log(), "dropped untrusted artifact " + genuine.key() + " on disk"));
    auto stub = v1::KernelService::NewStub(channel);
    grpc::Status status;
    const v1::GetKernelResponse r = GetKernel(*stub, 8, 1, &status);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(r.artifact().cubin() == genuine.cubin());
    const v1::StatsResponse stats = Stats(*stub);
    EXPECT_EQ(stats.disk_untrusted_entries(), 1u);
    EXPECT_EQ(stats.compiles(), 0u);
  }

  // --trust alone on a planted cache: the entry is dropped and the kernel
  // compiled (byte for byte the bundle's: builds are reproducible).
  const fs::path cache2 = dir_.path() / "cache_request";
  ASSERT_NO_FATAL_FAILURE(plant(cache2, "plant2"));
  {
    ServeProcess server(kBinary, cache2, dir_.path() / "trusted.log", {"--trust", pub});
    ASSERT_TRUE(server.WaitForAddress());
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);
    auto stub = v1::KernelService::NewStub(
        grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args));
    grpc::Status status;
    const v1::GetKernelResponse r = GetKernel(*stub, 8, 1, &status);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(r.source(), v1::ARTIFACT_SOURCE_COMPILED);
    EXPECT_TRUE(r.artifact().cubin() == genuine.cubin());
    EXPECT_EQ(Stats(*stub).disk_untrusted_entries(), 1u);
    EXPECT_TRUE(Contains(server.Log(), "no --fleet-key"));
  }
}

TEST_F(PrebuildTest, SecondRunCompilesNothingAndEveryRunWritesTheSameBytes) {
  const fs::path a = dir_.path() / "a";
  ASSERT_EQ(Prebuild(kGlm5Tp8, a).exit_code, 0);
  const std::string checksums = ReadFileOrEmpty(a / kBundleChecksumsFile);
  ASSERT_FALSE(checksums.empty());

  const RunResult again = Prebuild(kGlm5Tp8, a);
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_TRUE(Contains(again.output, "2 kernels, 2 already in the bundle, nothing to compile"));
  EXPECT_TRUE(Contains(again.output, "2 kernels, 0 compiled, 2 already in the bundle, 0 failed"));
  EXPECT_EQ(ReadFileOrEmpty(a / kBundleChecksumsFile), checksums);

  // Compiled again at another moment: kernels carry no compile time, so
  // every file is the same, byte for byte.
  const fs::path b = dir_.path() / "b";
  ASSERT_EQ(Prebuild(kGlm5Tp8, b).exit_code, 0);
  EXPECT_EQ(ReadFileOrEmpty(b / kBundleChecksumsFile), checksums);
  for (const char* sub : {"manifests", "kernels"}) {
    const std::vector<fs::path> files = FilesIn(a / sub);
    ASSERT_EQ(files.size(), 2u) << sub;
    for (const fs::path& file : files) {
      EXPECT_EQ(ReadFileOrEmpty(b / sub / file.filename()), ReadFileOrEmpty(file)) << file;
    }
  }
}

TEST_F(PrebuildTest, VerifyNamesADamagedKernelAndAMissingManifest) {
  const fs::path bundle = dir_.path() / "bundle";
  ASSERT_EQ(Prebuild(kGlm5Tp8, bundle).exit_code, 0);
  const fs::path kernel = FilesIn(bundle / "kernels").front();
  const std::string original = ReadFileOrEmpty(kernel);
  v1::KernelArtifact artifact;
  ASSERT_TRUE(artifact.ParseFromString(original));
  // One byte in the middle of the cubin: the file still parses.
  const size_t cubin_at = original.find(artifact.cubin());
  ASSERT_NE(cubin_at, std::string::npos);
  std::string damaged = original;
  damaged[cubin_at + artifact.cubin().size() / 2] ^= 0x5a;
  ASSERT_TRUE(WriteFileAtomic(kernel.string(), damaged).ok());

  const std::string kernel_name = absl::StrCat("kernels/", kernel.filename().string());
  RunResult run = Verify(bundle);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_TRUE(Contains(run.output, absl::StrCat(kernel_name, ": sha256 ")));
  EXPECT_TRUE(Contains(run.output, "verify: " + bundle.string() + ": 1 problem\n"));

  ASSERT_TRUE(WriteFileAtomic(kernel.string(), original).ok());
  ASSERT_EQ(Verify(bundle).exit_code, 0);
  const fs::path manifest = FilesIn(bundle / "manifests").front();
  fs::remove(manifest);
  run = Verify(bundle);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_TRUE(Contains(run.output, absl::StrCat("manifests/", manifest.filename().string(),
                                                ": listed in checksums.sha256 but missing")));
  EXPECT_TRUE(Contains(run.output, "verify: " + bundle.string() + ": 1 problem\n"));
}

TEST_F(PrebuildTest, VerifyUsageAndNotABundleExitTwo) {
  EXPECT_EQ(Kf({"verify"}).exit_code, 2);
  const RunResult missing = Verify(dir_.path() / "none");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_TRUE(Contains(missing.output, "none is not a directory"));
  const RunResult plain = Verify(dir_.path());
  EXPECT_EQ(plain.exit_code, 2);
  EXPECT_TRUE(Contains(plain.output, "is not a kforge bundle: it has no kforge-bundle.json"));
  const RunResult no_out = Kf({"prebuild", Matrix(kGlm5Tp8)});
  EXPECT_EQ(no_out.exit_code, 2);
  EXPECT_TRUE(Contains(no_out.output, "--out DIR is required"));
}

// Four kernels compiled one at a time; the run is stopped after the first
// (and meanwhile holds the directory against a second prebuild; a killed
// run's lock goes with it, or the rerun could not start).
class InterruptedPrebuildTest : public PrebuildTest, public ::testing::WithParamInterface<int> {};

TEST_P(InterruptedPrebuildTest, LeavesNoBundleThatVerifiesAndTheNextRunCompletesIt) {
  const int signo = GetParam();
  const std::string matrix =
      Matrix(R"({"models": [{"preset": "glm-5", "tp": [1, 2, 4, 8]}], "archs": ["sm_90a"]})");
  const fs::path bundle = dir_.path() / "bundle";
  {
    Kforge run(dir_.path() / "interrupted.log",
               {"prebuild", matrix, "--out", bundle.string(), "-j", "1"});
    ASSERT_TRUE(run.WaitForLog("[1/4] ok", absl::Seconds(60))) << run.Log();
    // Meanwhile a second prebuild of the same directory is refused.
    const RunResult rival = Kf({"prebuild", matrix, "--out", bundle.string(), "-j", "1"});
    EXPECT_EQ(rival.exit_code, 2) << rival.output;
    EXPECT_TRUE(Contains(rival.output, "is being written by another kforge process"))
        << rival.output;
    run.Signal(signo);
    const int code = run.Wait(absl::Seconds(60));
    if (signo == SIGINT) {
      // The running compile finishes and is kept; no new one starts.
      EXPECT_EQ(code, 128 + SIGINT) << run.Log();
      EXPECT_TRUE(Contains(run.Log(), "stopped by SIGINT with "));
      EXPECT_FALSE(Contains(run.Log(), "[4/4]")) << run.Log();
    } else {
      EXPECT_EQ(code, -signo) << run.Log();
    }
  }
  EXPECT_FALSE(fs::exists(bundle / kBundleChecksumsFile));
  EXPECT_EQ(Verify(bundle).exit_code, 1);
  const size_t kept = FilesIn(bundle / "kernels").size();
  EXPECT_GE(kept, 1u);
  EXPECT_LT(kept, 4u);

  const RunResult rest = Kf({"prebuild", matrix, "--out", bundle.string(), "-j", "2"});
  EXPECT_EQ(rest.exit_code, 0) << rest.output;
  EXPECT_TRUE(Contains(rest.output, absl::StrCat("4 kernels, ", 4 - kept, " compiled, ", kept,
                                                 " already in the bundle, 0 failed")));
  const RunResult verified = Verify(bundle);
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_TRUE(Contains(verified.output, "OK, 4 kernels, 4 manifests"));
}

INSTANTIATE_TEST_SUITE_P(Signals, InterruptedPrebuildTest, ::testing::Values(SIGINT, SIGKILL),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == SIGINT ? "Sigint" : "Sigkill");
                         });

TEST_F(PrebuildTest, FailedKernelIsNamedItsManifestLeftOutAndTheRestVerifies) {
  // The compile worker's crash hook (service/compile_pool.cc) aborts on
  // topk 1000; the glm-5 kernel still builds.
  const std::string matrix = R"({"models": [
      {"preset": "glm-5", "tp": [8]},
      {"name": "crashy", "tp": [8], "spec": {
         "num_q_heads": 64,
         "kv_lora_rank": 512, "rope_dim": 64, "topk": 1000,
         "page_block_size": 64, "softmax_scale": 0.0625}}],
      "archs": ["sm_90a"]})";
  const fs::path bundle = dir_.path() / "bundle";
  const RunResult run = Prebuild(matrix, bundle, {"--test-worker-crash-topk", "1000"});
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_TRUE(Contains(run.output, "  FAIL crashy tp8 bf16 sm_90a:\n    "));
  EXPECT_TRUE(Contains(run.output, "killed by signal"));
  EXPECT_TRUE(Contains(run.output,
                       "manifests not written (a kernel of theirs failed): "
                       "crashy tp8 bf16 sm_90a\n"));
  EXPECT_TRUE(Contains(run.output,
                       "2 kernels, 1 compiled, 0 already in the bundle, 1 failed; 1 manifests"));
  const std::vector<fs::path> manifests = FilesIn(bundle / "manifests");
  ASSERT_EQ(manifests.size(), 1u);
  EXPECT_TRUE(Contains(manifests[0].filename().string(), "topk2048"));
  const RunResult verified = Verify(bundle);
  EXPECT_EQ(verified.exit_code, 0) << verified.output;

  // Without the hook, the next run builds only the failed kernel.
  const RunResult retry = Prebuild(matrix, bundle);
  EXPECT_EQ(retry.exit_code, 0) << retry.output;
  EXPECT_TRUE(Contains(retry.output,
                       "2 kernels, 1 compiled, 1 already in the bundle, 0 failed; 2 manifests"));
  EXPECT_EQ(Verify(bundle).exit_code, 0);
}

TEST_F(PrebuildTest, ServeRefusesAMissingOrUnfinishedBundle) {
  std::unique_ptr<ServeProcess> missing = ServeFrom(dir_.path() / "none");
  EXPECT_EQ(missing->WaitExit(absl::Seconds(30)), 1);
  EXPECT_TRUE(Contains(missing->Log(), "--warm-from " + (dir_.path() / "none").string()));
  EXPECT_TRUE(Contains(missing->Log(), "is not a kforge bundle"));

  // A marker but no checksums: what an interrupted prebuild leaves.
  const fs::path unfinished = dir_.path() / "unfinished";
  ASSERT_TRUE(BundleWriter::Open(unfinished.string()).ok());
  std::unique_ptr<ServeProcess> server = ServeFrom(unfinished);
  EXPECT_EQ(server->WaitExit(absl::Seconds(30)), 1);
  EXPECT_TRUE(Contains(server->Log(), "its writer never finished"));
}

// Rewrites the bundle's only kernel under another key, as a kforge with
// other templates would have named it; the bundle stays self-consistent.
void RekeyOnlyKernel(const fs::path& bundle) {
  const std::vector<fs::path> kernels = FilesIn(bundle / "kernels");
  const std::vector<fs::path> manifests = FilesIn(bundle / "manifests");
  ASSERT_EQ(kernels.size(), 1u);
  ASSERT_EQ(manifests.size(), 1u);
  v1::KernelArtifact artifact;
  ASSERT_TRUE(artifact.ParseFromString(ReadFileOrEmpty(kernels[0])));
  v1::Manifest manifest;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(ReadFileOrEmpty(manifests[0]), &manifest).ok());
  ASSERT_EQ(manifest.variants_size(), 1);
  const std::string other_key = Sha256Hex("a kernel of another kforge");
  artifact.set_key(other_key);
  manifest.mutable_variants(0)->set_key(other_key);
  absl::StatusOr<std::unique_ptr<BundleWriter>> writer = BundleWriter::Open(bundle.string());
  ASSERT_TRUE(writer.ok()) << writer.status();
  fs::remove(kernels[0]);
  ASSERT_TRUE((*writer)->AddKernel(artifact).ok());
  ASSERT_TRUE((*writer)->AddManifest(manifest).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
}

TEST_F(PrebuildTest, ServeSkipsAKernelItWouldNotBuildAndStillServes) {
  const fs::path bundle = dir_.path() / "bundle";
  ASSERT_EQ(Prebuild(R"({"models": [{"preset": "glm-5", "tp": [8]}], "archs": ["sm_90a"]})", bundle)
                .exit_code,
            0);
  ASSERT_NO_FATAL_FAILURE(RekeyOnlyKernel(bundle));
  const RunResult verified = Verify(bundle);
  ASSERT_EQ(verified.exit_code, 0) << verified.output;

  std::unique_ptr<ServeProcess> server = ServeFrom(bundle);
  std::shared_ptr<grpc::Channel> channel;
  ASSERT_NO_FATAL_FAILURE(WaitUntilWarm(*server, &channel));
  EXPECT_TRUE(Contains(server->Log(), "kforge: warm-up skipped sparse_mla_decode_h8_"));
  EXPECT_TRUE(Contains(server->Log(), "built by another kforge"));
  EXPECT_TRUE(Contains(server->Log(), "1 kernels, 0 loaded, 0 already cached, 1 skipped; SERVING"));
  // The kernel is compiled on demand instead.
  auto stub = v1::KernelService::NewStub(channel);
  grpc::Status status;
  const v1::GetKernelResponse r = GetKernel(*stub, 8, 1, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(r.source(), v1::ARTIFACT_SOURCE_COMPILED);
}

// ---------------------------------------------------------------------------
// PrebuildBundle in this process

TEST(PrebuildBundle, StoppedBeforeTheFirstCompileWritesNoChecksums) {
  TempDir dir("kforge_prebuild_stop");
  absl::StatusOr<v1::DeploymentMatrix> matrix = ParseMatrix(kGlm5Tp8, "m.json");
  ASSERT_TRUE(matrix.ok()) << matrix.status();
  absl::StatusOr<std::vector<MatrixJob>> jobs = ExpandMatrix(*matrix);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  PrebuildOptions options;
  options.out_dir = (dir.path() / "bundle").string();
  options.worker_binary = kBinary;
  PrebuildPlan plan;
  int done = 0;
  PrebuildCallbacks callbacks;
  callbacks.on_plan = [&](const PrebuildPlan& p) { plan = p; };
  callbacks.on_done = [&](const PrebuildKernelDone&) { ++done; };
  const std::atomic<bool> stop{true};
  absl::StatusOr<PrebuildReport> report = PrebuildBundle(*jobs, options, callbacks, stop);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(plan.kernels, 2);
  EXPECT_EQ(plan.to_compile, 2);
  EXPECT_TRUE(report->stopped);
  EXPECT_EQ(report->not_built, 2);
  EXPECT_EQ(report->compiled, 0);
  EXPECT_EQ(done, 0);
  EXPECT_EQ(report->manifests, 0);
  EXPECT_TRUE(fs::exists(dir.path() / "bundle" / kBundleMarkerFile));
  EXPECT_FALSE(fs::exists(dir.path() / "bundle" / kBundleChecksumsFile));
}

TEST(PrebuildBundle, AnotherBundleFormatIsRefused) {
  TempDir dir("kforge_prebuild_format");
  std::ofstream(dir.path() / kBundleMarkerFile)
      << R"({"format": "kforge-bundle", "format_version": 99})";
  PrebuildOptions options;
  options.out_dir = dir.path().string();
  const std::atomic<bool> stop{false};
  absl::StatusOr<PrebuildReport> report = PrebuildBundle({}, options, {}, stop);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(report.status().message(), "format version 99"));
}

}  // namespace
}  // namespace kforge
