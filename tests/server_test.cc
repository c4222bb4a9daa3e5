// Integration tests of `kforge serve`: real server processes on loopback,
// each on a free port with its own temporary cache directory, driven through
// the generated gRPC stub (and, for health and reflection, through raw bytes
// as a stock tool would send them). Compiles use glm-5 at TP 8 on sm_90a,
// about a second each on a CPU-only machine.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kforge/v1/service.grpc.pb.h"
#include "model/cubin.h"
#include "model/spec.h"
#include "service/status_mapping.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using ::kforge::testing::Contains;

constexpr char kBinary[] = KFORGE_BINARY;
constexpr char kArch[] = "sm_90a";
// The fault hooks of `kforge compile-worker` (service/compile_pool.cc) key
// on topk; no other test spec uses this value.
constexpr uint32_t kFaultTopk = 1000;

using ::kforge::testing::ReadFileOrEmpty;
using ::kforge::testing::TempDir;

v1::AttentionSpec Glm5(int tp = 8, uint32_t topk = 2048) {
  absl::StatusOr<v1::AttentionSpec> spec = SpecFromPreset("glm-5", tp);
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->set_topk(topk);
  return *spec;
}

std::shared_ptr<grpc::Channel> Connect(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// A unary call with raw request bytes, as a client without our .proto
// (or without the health/reflection protos) makes it.
grpc::Status RawUnary(grpc::Channel* channel, const std::string& method, const std::string& request,
                      std::string* response, absl::Duration timeout = absl::Seconds(10)) {
  grpc::GenericStub stub(channel->shared_from_this());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request_buffer, &response_buffer,
                 [&done](grpc::Status s) { done.set_value(s); });
  grpc::Status status = done.get_future().get();
  if (status.ok()) {
    std::vector<grpc::Slice> slices;
    (void)response_buffer.Dump(&slices);
    response->clear();
    for (const grpc::Slice& s : slices) {
      response->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return status;
}

// grpc.health.v1.Health/Check for the whole server: the request is empty;
// the response's field 1 (status) is 1 for SERVING.
bool IsServing(grpc::Channel* channel) {
  std::string response;
  grpc::Status s =
      RawUnary(channel, "/grpc.health.v1.Health/Check", "", &response, absl::Seconds(2));
  return s.ok() && response == std::string("\x08\x01", 2);
}

// A `kforge serve` child process (testing::ServeProcess) with a stub, ready
// once health checking says SERVING.
class ServerProcess : public ::kforge::testing::ServeProcess {
 public:
  ServerProcess(const fs::path& cache_dir, const fs::path& log, std::vector<std::string> args = {},
                std::vector<std::string> env = {})
      : ServeProcess(kBinary, cache_dir, log, std::move(args), std::move(env)) {}

  // Waits for the "serving on" line and a SERVING health answer. Returns
  // false (and records a failure) if the server exits or takes too long.
  bool WaitUntilServing(absl::Duration timeout = absl::Seconds(30)) {
    const absl::Time deadline = absl::Now() + timeout;
    if (!WaitForAddress(timeout)) return false;
    channel_ = Connect(address());
    stub_ = v1::KernelService::NewStub(channel_);
    while (!IsServing(channel_.get())) {
      if (!running() || absl::Now() > deadline) {
        ADD_FAILURE() << "health never said SERVING; log:\n" << Log();
        return false;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return true;
  }

  grpc::Channel* channel() { return channel_.get(); }
  v1::KernelService::Stub& stub() { return *stub_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KernelService::Stub> stub_;
};

struct Reply {
  grpc::Status status;
  v1::GetKernelResponse response;
};

Reply GetKernel(v1::KernelService::Stub& stub, const v1::AttentionSpec& spec,
                const std::string& arch = kArch, bool lookup_only = false,
                absl::Duration timeout = absl::Seconds(120)) {
  v1::GetKernelRequest request;
  *request.mutable_kernel()->mutable_spec() = spec;
  request.set_arch(arch);
  request.set_lookup_only(lookup_only);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  Reply reply;
  reply.status = stub.GetKernel(&context, request, &reply.response);
  return reply;
}

v1::StatsResponse Stats(v1::KernelService::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::StatsResponse stats;
  grpc::Status s = stub.Stats(&context, v1::StatsRequest(), &stats);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return stats;
}

// Polls Stats until `pred` holds; false after `timeout`.
bool WaitForStats(v1::KernelService::Stub& stub,
                  const std::function<bool(const v1::StatsResponse&)>& pred,
                  absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (pred(Stats(stub))) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// Regular files under `dir` whose name starts with `key` and that are
// neither lock files nor temporaries: the stored entry for that key.
std::vector<fs::path> EntryFiles(const fs::path& dir, const std::string& key) {
  std::vector<fs::path> found;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && absl::StartsWith(name, key) && !absl::EndsWith(name, ".lock") &&
        !absl::StrContains(name, ".tmp")) {
      found.push_back(e.path());
    }
  }
  return found;
}

// Every regular file under `dir` that is not a lock file.
std::vector<fs::path> NonLockFiles(const fs::path& dir) {
  std::vector<fs::path> found;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && !absl::EndsWith(e.path().string(), ".lock")) {
      found.push_back(e.path());
    }
  }
  return found;
}

// Runs a command line; returns its exit code and combined output.
int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  output->clear();
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output->append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class ServerTest : public ::testing::Test {
 protected:
  fs::path cache_dir() const { return tmp_.path() / "cache"; }

  std::unique_ptr<ServerProcess> StartServer(std::vector<std::string> args = {},
                                             std::vector<std::string> env = {}) {
    auto server = std::make_unique<ServerProcess>(
        cache_dir(), tmp_.path() / absl::StrCat("server", ++servers_, ".log"), std::move(args),
        std::move(env));
    if (!server->WaitUntilServing()) return nullptr;
    return server;
  }

  // SIGTERM and a clean exit, so a restart finds a quiet cache directory.
  static void Stop(std::unique_ptr<ServerProcess> server) {
    server->Signal(SIGTERM);
    EXPECT_EQ(server->WaitExit(absl::Seconds(60)), 0) << server->Log();
  }

  TempDir tmp_{"kforge_server_test"};
  int servers_ = 0;
};

TEST_F(ServerTest, HitAfterMissThenDiskAfterRestart) {
  std::string cubin;
  {
    std::unique_ptr<ServerProcess> server = StartServer();
    ASSERT_NE(server, nullptr);
    Reply miss = GetKernel(server->stub(), Glm5());
    ASSERT_TRUE(miss.status.ok()) << miss.status.error_message();
    EXPECT_EQ(miss.response.source(), v1::ARTIFACT_SOURCE_COMPILED);
    cubin = miss.response.artifact().cubin();
    EXPECT_GT(cubin.size(), 1000u);
    EXPECT_EQ(miss.response.artifact().arch(), kArch);

    Reply hit = GetKernel(server->stub(), Glm5());
    ASSERT_TRUE(hit.status.ok()) << hit.status.error_message();
    EXPECT_EQ(hit.response.source(), v1::ARTIFACT_SOURCE_MEMORY);
    EXPECT_EQ(hit.response.artifact().cubin(), cubin);
    EXPECT_EQ(hit.response.artifact().key(), miss.response.artifact().key());
    const v1::StatsResponse stats = Stats(server->stub());
    EXPECT_EQ(stats.compiles(), 1u);
    EXPECT_EQ(stats.memory_hits(), 1u);
    Stop(std::move(server));
  }
  std::unique_ptr<ServerProcess> server = StartServer();
  ASSERT_NE(server, nullptr);
  Reply disk = GetKernel(server->stub(), Glm5());
  ASSERT_TRUE(disk.status.ok()) << disk.status.error_message();
  EXPECT_EQ(disk.response.source(), v1::ARTIFACT_SOURCE_DISK);
  EXPECT_EQ(disk.response.artifact().cubin(), cubin);
  const v1::StatsResponse stats = Stats(server->stub());
  EXPECT_EQ(stats.compiles(), 0u);
  EXPECT_EQ(stats.disk_hits(), 1u);
}

TEST_F(ServerTest, SixtyFourConcurrentColdRequestsCompileOnce) {
  std::unique_ptr<ServerProcess> server = StartServer({"--workers", "2"});
  ASSERT_NE(server, nullptr);
  constexpr int kRequests = 64;
  std::vector<Reply> replies(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] { replies[i] = GetKernel(server->stub(), Glm5()); });
  }
  for (std::thread& t : threads) t.join();
  int compiled = 0;
  for (const Reply& r : replies) {
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.response.artifact().cubin(), replies[0].response.artifact().cubin());
    if (r.response.source() == v1::ARTIFACT_SOURCE_COMPILED) ++compiled;
  }
  EXPECT_EQ(compiled, 1);
  const v1::StatsResponse stats = Stats(server->stub());
  EXPECT_EQ(stats.compiles(), 1u);
  EXPECT_EQ(stats.compile_failures(), 0u);
}

TEST_F(ServerTest, FlippedByteIsDetectedRebuiltAndNeverServed) {
  std::string cubin, key;
  {
    std::unique_ptr<ServerProcess> server = StartServer();
    ASSERT_NE(server, nullptr);
    Reply r = GetKernel(server->stub(), Glm5());
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    cubin = r.response.artifact().cubin();
    key = r.response.artifact().key();
    Stop(std::move(server));
  }
  const std::vector<fs::path> entries = EntryFiles(cache_dir(), key);
  ASSERT_EQ(entries.size(), 1u) << "no single entry file for " << key;
  {
    std::string bytes = ReadFileOrEmpty(entries[0]);
    ASSERT_GT(bytes.size(), cubin.size());
    bytes[bytes.size() / 2] ^= 0x5a;
    std::ofstream(entries[0], std::ios::binary | std::ios::trunc) << bytes;
  }
  // A new server, so the memory tier cannot answer.
  std::unique_ptr<ServerProcess> server = StartServer();
  ASSERT_NE(server, nullptr);
  Reply r = GetKernel(server->stub(), Glm5());
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.response.source(), v1::ARTIFACT_SOURCE_COMPILED);
  EXPECT_EQ(r.response.artifact().cubin(), cubin);
  v1::StatsResponse stats = Stats(server->stub());
  EXPECT_EQ(stats.corrupt_entries(), 1u);
  EXPECT_EQ(stats.compiles(), 1u);
  EXPECT_EQ(stats.disk_hits(), 0u);
  // The rebuilt entry is whole again.
  Stop(std::move(server));
  server = StartServer();
  ASSERT_NE(server, nullptr);
  r = GetKernel(server->stub(), Glm5());
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.response.source(), v1::ARTIFACT_SOURCE_DISK);
  EXPECT_EQ(r.response.artifact().cubin(), cubin);
}

TEST_F(ServerTest, SigkillDuringCompileLeavesNothingServableAndRestartsCleanly) {
  const v1::AttentionSpec hanging = Glm5(8, kFaultTopk);
  {
    std::unique_ptr<ServerProcess> server =
        StartServer({"--test-worker-hang-topk", absl::StrCat(kFaultTopk)});
    ASSERT_NE(server, nullptr);
    auto call = std::async(std::launch::async, [&] { return GetKernel(server->stub(), hanging); });
    ASSERT_TRUE(WaitForStats(
        server->stub(), [](const v1::StatsResponse& s) { return s.in_flight_compiles() == 1; }));
    // in_flight counts from just before the spawn: let the worker start.
    absl::SleepFor(absl::Milliseconds(300));
    server->Signal(SIGKILL);
    EXPECT_EQ(server->WaitExit(absl::Seconds(10)), -SIGKILL);
    EXPECT_FALSE(call.get().status.ok());
  }
  // The compile never finished: the cache holds no entry file at all (lock
  // files and stale temporaries are not entries).
  for (const fs::path& p : NonLockFiles(cache_dir())) {
    EXPECT_TRUE(absl::StrContains(p.filename().string(), ".tmp"))
        << "unexpected file after SIGKILL: " << p;
  }
  std::unique_ptr<ServerProcess> server = StartServer();
  ASSERT_NE(server, nullptr);
  Reply lookup = GetKernel(server->stub(), hanging, kArch, /*lookup_only=*/true);
  EXPECT_EQ(lookup.status.error_code(), grpc::StatusCode::NOT_FOUND)
      << lookup.status.error_message();
  Reply r = GetKernel(server->stub(), hanging);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.response.source(), v1::ARTIFACT_SOURCE_COMPILED);
  absl::StatusOr<v1::CubinInfo> info = InspectCubin(r.response.artifact().cubin());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->arch(), kArch);
  Reply other = GetKernel(server->stub(), Glm5());
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();
}

TEST_F(ServerTest, CrashingWorkerFailsOnlyItsRequest) {
  std::unique_ptr<ServerProcess> server =
      StartServer({"--workers", "2", "--test-worker-crash-topk", absl::StrCat(kFaultTopk)});
  ASSERT_NE(server, nullptr);
  auto crashing = std::async(std::launch::async,
                             [&] { return GetKernel(server->stub(), Glm5(8, kFaultTopk)); });
  auto good = std::async(std::launch::async, [&] { return GetKernel(server->stub(), Glm5()); });
  Reply crashed = crashing.get();
  EXPECT_EQ(crashed.status.error_code(), grpc::StatusCode::INTERNAL)
      << crashed.status.error_message();
  EXPECT_FALSE(crashed.status.error_message().empty());
  Reply ok = good.get();
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_TRUE(server->running());
  EXPECT_TRUE(IsServing(server->channel()));
  Reply again = GetKernel(server->stub(), Glm5());
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.response.source(), v1::ARTIFACT_SOURCE_MEMORY);
  const v1::StatsResponse stats = Stats(server->stub());
  EXPECT_EQ(stats.compile_failures(), 1u);
  EXPECT_EQ(stats.compiles(), 2u);  // attempts: the crashed one and the good one
}

TEST_F(ServerTest, FullQueueIsResourceExhaustedAtOnce) {
  std::unique_ptr<ServerProcess> server =
      StartServer({"--workers", "1", "--queue-limit", "1", "--test-worker-hang-topk",
                   absl::StrCat(kFaultTopk)});
  ASSERT_NE(server, nullptr);
  // One job hangs in the only worker, a second waits in the queue.
  auto running = std::async(std::launch::async,
                            [&] { return GetKernel(server->stub(), Glm5(8, kFaultTopk)); });
  ASSERT_TRUE(WaitForStats(server->stub(),
                           [](const v1::StatsResponse& s) { return s.in_flight_compiles() == 1; }));
  auto queued = std::async(std::launch::async,
                           [&] { return GetKernel(server->stub(), Glm5(4, kFaultTopk)); });
  ASSERT_TRUE(WaitForStats(server->stub(),
                           [](const v1::StatsResponse& s) { return s.queue_depth() == 1; }));
  const absl::Time start = absl::Now();
  Reply rejected = GetKernel(server->stub(), Glm5(2, kFaultTopk));
  EXPECT_EQ(rejected.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << rejected.status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(Stats(server->stub()).rejected_queue_full(), 1u);
  // Cache hits and cheap calls are not held up by the full queue.
  EXPECT_TRUE(IsServing(server->channel()));
  server->Signal(SIGKILL);
  EXPECT_FALSE(running.get().status.ok());
  EXPECT_FALSE(queued.get().status.ok());
}

TEST_F(ServerTest, DeadlineIsHonouredWhileACompileHangs) {
  std::unique_ptr<ServerProcess> server =
      StartServer({"--test-worker-hang-topk", absl::StrCat(kFaultTopk)});
  ASSERT_NE(server, nullptr);
  const absl::Time start = absl::Now();
  Reply r = GetKernel(server->stub(), Glm5(8, kFaultTopk), kArch, false, absl::Milliseconds(1500));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << r.status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  Reply other = GetKernel(server->stub(), Glm5());
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();
  server->Signal(SIGKILL);
}

TEST_F(ServerTest, ErrorsCarryTheirCanonicalCodes) {
  std::unique_ptr<ServerProcess> server = StartServer();
  ASSERT_NE(server, nullptr);

  v1::AttentionSpec bad = Glm5();
  bad.set_num_q_heads(0);
  Reply r = GetKernel(server->stub(), bad);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(r.status.error_message(), "num_q_heads"));

  bad = Glm5();
  bad.clear_rope_dim();
  r = GetKernel(server->stub(), bad);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(r.status.error_message(), "rope_dim"));

  v1::GetKernelRequest request;
  request.mutable_kernel()->mutable_preset()->set_name("glm-5");
  request.mutable_kernel()->mutable_preset()->set_tensor_parallel(3);
  request.set_arch(kArch);
  {
    grpc::ClientContext context;
    v1::GetKernelResponse response;
    grpc::Status s = server->stub().GetKernel(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(Contains(s.error_message(), "tensor_parallel"));
  }

  r = GetKernel(server->stub(), Glm5(), "sm_99");
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(Contains(r.status.error_message(), "sm_99"));

  r = GetKernel(server->stub(), Glm5(), kArch, /*lookup_only=*/true);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);

  const v1::StatsResponse stats = Stats(server->stub());
  EXPECT_EQ(stats.compiles(), 0u);
}

TEST_F(ServerTest, HealthAndReflectionAnswer) {
  std::unique_ptr<ServerProcess> server = StartServer();
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(IsServing(server->channel()));

  // grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo, a bidi
  // stream, spoken in raw bytes as grpcurl would.
  grpc::GenericStub stub(Connect(server->address()));
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto step = [&cq](int tag) {
    void* got = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&got, &ok));
    EXPECT_EQ(got, reinterpret_cast<void*>(static_cast<intptr_t>(tag)));
    return ok;
  };
  auto tag = [](int t) { return reinterpret_cast<void*>(static_cast<intptr_t>(t)); };
  auto exchange = [&](const std::string& request) {
    grpc::Slice slice(request);
    grpc::ByteBuffer out(&slice, 1);
    call->Write(out, tag(2));
    EXPECT_TRUE(step(2));
    grpc::ByteBuffer in;
    call->Read(&in, tag(3));
    EXPECT_TRUE(step(3));
    std::vector<grpc::Slice> slices;
    (void)in.Dump(&slices);
    std::string bytes;
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    return bytes;
  };
  // Length-delimited field as bytes (short payloads: one-byte length).
  auto field = [](int number, const std::string& payload) {
    return std::string(1, static_cast<char>(number << 3 | 2)) +
           std::string(1, static_cast<char>(payload.size())) + payload;
  };
  call->StartCall(tag(1));
  ASSERT_TRUE(step(1));

  // list_services (field 7) -> list_services_response (6) { service (1)
  // { name (1) } }.
  google::protobuf::UnknownFieldSet response;
  ASSERT_TRUE(response.ParseFromString(exchange(field(7, ""))));
  std::vector<std::string> services;
  for (int i = 0; i < response.field_count(); ++i) {
    if (response.field(i).number() != 6) continue;
    google::protobuf::UnknownFieldSet list;
    ASSERT_TRUE(list.ParseFromString(response.field(i).length_delimited()));
    for (int j = 0; j < list.field_count(); ++j) {
      google::protobuf::UnknownFieldSet service;
      ASSERT_TRUE(service.ParseFromString(list.field(j).length_delimited()));
      services.push_back(service.field(0).length_delimited());
    }
  }
  EXPECT_NE(std::find(services.begin(), services.end(), "kforge.v1.KernelService"), services.end())
      << "services: " << absl::StrJoin(services, ", ");
  EXPECT_NE(std::find(services.begin(), services.end(), "grpc.health.v1.Health"), services.end());

  // file_containing_symbol (4) -> file_descriptor_response (4) {
  // file_descriptor_proto (1) }: the descriptor a stock tool decodes with.
  response.Clear();
  ASSERT_TRUE(response.ParseFromString(exchange(field(4, "kforge.v1.KernelService"))));
  bool found = false;
  for (int i = 0; i < response.field_count(); ++i) {
    if (response.field(i).number() != 4) continue;
    google::protobuf::UnknownFieldSet files;
    ASSERT_TRUE(files.ParseFromString(response.field(i).length_delimited()));
    for (int j = 0; j < files.field_count(); ++j) {
      google::protobuf::FileDescriptorProto file;
      ASSERT_TRUE(file.ParseFromString(files.field(j).length_delimited()));
      if (file.name() != "kforge/v1/service.proto") continue;
      ASSERT_GE(file.service_size(), 1);
      EXPECT_EQ(file.service(0).name(), "KernelService");
      found = true;
    }
  }
  EXPECT_TRUE(found) << "no descriptor for kforge/v1/service.proto";

  call->WritesDone(tag(4));
  EXPECT_TRUE(step(4));
  grpc::Status status;
  call->Finish(&status, tag(5));
  EXPECT_TRUE(step(5));
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(ServerTest, PrebuildStreamsOneMessagePerKernelInCompletionOrder) {
  std::unique_ptr<ServerProcess> server = StartServer({"--workers", "2"});
  ASSERT_NE(server, nullptr);
  v1::PrebuildRequest request;
  for (int tp : {8, 4}) {
    v1::PresetRef* preset = request.add_kernels()->mutable_preset();
    preset->set_name("glm-5");
    preset->set_tensor_parallel(tp);
  }
  request.add_archs(kArch);
  request.add_archs("sm_99");
  // Warm, or its deprecated name Prebuild (same handler, one release).
  bool old_name = false;
  auto prebuild = [&](const v1::PrebuildRequest& req, std::vector<v1::PrebuildProgress>* out) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    std::unique_ptr<grpc::ClientReader<v1::PrebuildProgress>> reader =
        old_name ? server->stub().Prebuild(&context, req) : server->stub().Warm(&context, req);
    v1::PrebuildProgress progress;
    while (reader->Read(&progress)) out->push_back(progress);
    return reader->Finish();
  };
  std::vector<v1::PrebuildProgress> messages;
  grpc::Status s = prebuild(request, &messages);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(messages.size(), 4u);
  for (size_t i = 0; i < messages.size(); ++i) {
    const v1::PrebuildProgress& m = messages[i];
    EXPECT_EQ(m.done(), i + 1);
    EXPECT_EQ(m.total(), 4u);
    if (m.arch() == kArch) {
      EXPECT_EQ(m.state(), v1::PREBUILD_STATE_COMPILED) << m.error();
      EXPECT_EQ(m.key().size(), 64u);
      EXPECT_FALSE(m.module_name().empty());
    } else {
      EXPECT_EQ(m.state(), v1::PREBUILD_STATE_FAILED);
      EXPECT_TRUE(Contains(m.error(), "sm_99"));
    }
  }
  EXPECT_EQ(Stats(server->stub()).compiles(), 2u);

  // Built already: the same kernels now come from the cache, through the
  // old name too.
  request.clear_archs();
  request.add_archs(kArch);
  messages.clear();
  old_name = true;
  s = prebuild(request, &messages);
  old_name = false;
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(messages.size(), 2u);
  for (const v1::PrebuildProgress& m : messages) {
    EXPECT_EQ(m.state(), v1::PREBUILD_STATE_CACHED);
  }

  // A bad selector fails the whole call before any work, naming it.
  request.mutable_kernels(1)->mutable_preset()->set_tensor_parallel(3);
  messages.clear();
  s = prebuild(request, &messages);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(s.error_message(), "kernels[1]"));
  EXPECT_TRUE(messages.empty());
}

TEST_F(ServerTest, CancelledPrebuildStartsNoMoreKernels) {
  std::unique_ptr<ServerProcess> server = StartServer({"--workers", "2"});
  ASSERT_NE(server, nullptr);
  v1::PrebuildRequest request;
  const std::vector<uint32_t> topks = {2048, 1024, 512, 256, 128, 4096, 8192, 3072};
  for (uint32_t topk : topks) *request.add_kernels()->mutable_spec() = Glm5(8, topk);
  request.add_archs(kArch);
  {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::PrebuildProgress>> reader =
        server->stub().Prebuild(&context, request);
    v1::PrebuildProgress first;
    ASSERT_TRUE(reader->Read(&first));
    EXPECT_EQ(first.done(), 1u);
    EXPECT_EQ(first.total(), topks.size());
    context.TryCancel();
    v1::PrebuildProgress rest;
    while (reader->Read(&rest)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // Kernels already started finish (others may want them); no new ones.
  ASSERT_TRUE(WaitForStats(server->stub(), [](const v1::StatsResponse& s) {
    return s.in_flight_compiles() == 0 && s.queue_depth() == 0;
  }));
  absl::SleepFor(absl::Milliseconds(500));
  const v1::StatsResponse stats = Stats(server->stub());
  EXPECT_LT(stats.compiles(), topks.size()) << stats.DebugString();
  std::cerr << "compiles after cancel: " << stats.compiles() << "\n";
  EXPECT_TRUE(IsServing(server->channel()));
  Reply r = GetKernel(server->stub(), Glm5());
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
}

TEST_F(ServerTest, ManifestIsServed) {
  std::unique_ptr<ServerProcess> server = StartServer();
  ASSERT_NE(server, nullptr);
  v1::GetManifestRequest request;
  request.mutable_kernel()->mutable_preset()->set_name("glm-5");
  request.mutable_kernel()->mutable_preset()->set_tensor_parallel(8);
  request.set_arch(kArch);
  grpc::ClientContext context;
  v1::Manifest manifest;
  grpc::Status s = server->stub().GetManifest(&context, request, &manifest);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(manifest.arch(), kArch);
  EXPECT_GE(manifest.variants_size(), 1);

  request.set_arch("sm_99");
  grpc::ClientContext context2;
  s = server->stub().GetManifest(&context2, request, &manifest);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ServerTest, SigtermFinishesTheInFlightCallThenExitsZero) {
  std::unique_ptr<ServerProcess> server = StartServer();
  ASSERT_NE(server, nullptr);
  auto call = std::async(std::launch::async, [&] { return GetKernel(server->stub(), Glm5()); });
  ASSERT_TRUE(WaitForStats(server->stub(),
                           [](const v1::StatsResponse& s) { return s.in_flight_compiles() == 1; }));
  server->Signal(SIGTERM);
  Reply r = call.get();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.response.source(), v1::ARTIFACT_SOURCE_COMPILED);
  EXPECT_GT(r.response.artifact().cubin().size(), 1000u);
  EXPECT_EQ(server->WaitExit(absl::Seconds(60)), 0);
  EXPECT_TRUE(Contains(server->Log(), "SIGTERM"));
}

// A call stuck on a hung compile does not hold shutdown until the compile
// timeout (120 s): once the grace period is over the compile is killed, the
// call ends and the server exits 0.
TEST_F(ServerTest, SigtermAbandonsAHungCompileAfterTheGracePeriod) {
  std::unique_ptr<ServerProcess> server =
      StartServer({"--shutdown-grace", "1", "--test-worker-hang-topk", absl::StrCat(kFaultTopk)});
  ASSERT_NE(server, nullptr);
  auto call = std::async(std::launch::async, [&] {
    return GetKernel(server->stub(), Glm5(8, kFaultTopk), kArch, false, absl::Seconds(60));
  });
  ASSERT_TRUE(WaitForStats(server->stub(),
                           [](const v1::StatsResponse& s) { return s.in_flight_compiles() == 1; }));
  const absl::Time start = absl::Now();
  server->Signal(SIGTERM);
  Reply r = call.get();
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_EQ(server->WaitExit(absl::Seconds(30)), 0) << server->Log();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(Contains(server->Log(), "grace period over: abandoning running compiles"))
      << server->Log();
}

TEST_F(ServerTest, PortInUseFailsClearly) {
  std::unique_ptr<ServerProcess> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::string output;
  const int rc = RunCommand(absl::StrCat(kBinary, " serve --listen ", server->address(),
                                         " --cache-dir ", (tmp_.path() / "other").string()),
                            &output);
  EXPECT_EQ(rc, 1) << output;
  EXPECT_TRUE(Contains(output, absl::StrCat("cannot listen on ", server->address())));
}

TEST_F(ServerTest, CliGetAndStats) {
  std::unique_ptr<ServerProcess> server = StartServer();
  ASSERT_NE(server, nullptr);
  const fs::path out = tmp_.path() / "out";
  const std::string get = absl::StrCat(kBinary, " get --server ", server->address(),
                                       " --preset glm-5 --tp 8 --arch sm_90a -o ", out.string());
  std::string output;
  ASSERT_EQ(RunCommand(get, &output), 0) << output;
  EXPECT_TRUE(Contains(output, "source compiled"));
  ASSERT_EQ(RunCommand(get, &output), 0) << output;
  EXPECT_TRUE(Contains(output, "source memory"));

  Reply r = GetKernel(server->stub(), Glm5());
  ASSERT_TRUE(r.status.ok());
  const std::string module = r.response.artifact().module_name();
  EXPECT_EQ(ReadFileOrEmpty(out / (module + ".cubin")), r.response.artifact().cubin());
  EXPECT_TRUE(Contains(ReadFileOrEmpty(out / (module + ".json")),
                       absl::StrCat("\"module_name\": \"", module, "\"")));

  ASSERT_EQ(RunCommand(absl::StrCat(kBinary, " stats --server ", server->address()), &output), 0)
      << output;
  EXPECT_TRUE(Contains(output, "\"compiles\": \"1\""));
  EXPECT_TRUE(Contains(output, "\"memory_hits\": \"2\""));

  EXPECT_EQ(RunCommand(absl::StrCat(get, " --lookup-only --tp 4"), &output), 1);
  EXPECT_TRUE(Contains(output, "NOT_FOUND"));

  // A server that is gone.
  const std::string address = server->address();
  Stop(std::move(server));
  EXPECT_EQ(RunCommand(absl::StrCat(kBinary, " stats --server ", address), &output), 1);
  EXPECT_TRUE(
      Contains(output, absl::StrCat("kforge: cannot reach kforge server at ", address, ": ")));
}

// A compile log far beyond what a client accepts in the status trailer
// reaches a stock client as INTERNAL, cut and saying so, instead of a
// transport error. Served in-process by a stand-in service.
TEST(ToGrpcStatusTest, LongMessagesAreTruncatedAndStillDelivered) {
  std::string log;
  for (int i = 0; log.size() < 200 * 1024; ++i) {
    absl::StrAppend(&log, "kforge_unit.cu(", i, "): error: identifier \"x", i, "\" is undefined\n");
  }
  class LongError final : public v1::KernelService::CallbackService {
   public:
    explicit LongError(std::string log) : log_(std::move(log)) {}
    grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context, const v1::StatsRequest*,
                                    v1::StatsResponse*) override {
      grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
      reactor->Finish(ToGrpcStatus(absl::InternalError(log_)));
      return reactor;
    }

   private:
    std::string log_;
  };
  LongError service(log);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = v1::KernelService::NewStub(Connect(absl::StrCat("127.0.0.1:", port)));
  grpc::ClientContext context;
  v1::StatsResponse response;
  grpc::Status s = stub->Stats(&context, v1::StatsRequest(), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL) << s.error_message();
  EXPECT_TRUE(absl::StartsWith(s.error_message(), "kforge_unit.cu(0): error:"));
  EXPECT_TRUE(Contains(s.error_message(), "message truncated"));
  EXPECT_LE(s.error_message().size(), kMaxStatusMessageBytes);
  server->Shutdown();
}

TEST(ToGrpcStatusTest, KeepsTheCanonicalCode) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  for (int code = 1; code <= 16; ++code) {
    const absl::Status in(static_cast<absl::StatusCode>(code), "why");
    const grpc::Status out = ToGrpcStatus(in);
    EXPECT_EQ(static_cast<int>(out.error_code()), code);
    EXPECT_EQ(out.error_message(), "why");
  }
}

}  // namespace
}  // namespace kforge
