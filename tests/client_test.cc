// ServiceClient (runtime/client.h) against a server that is down, against
// in-process fake KernelServices that misbehave on purpose (retryable
// errors, wrong kernels, slowness), and against a real `kforge serve`
// process with a local bundle copy. Good answers of the fakes are real
// kernels, compiled once for the suite (glm-5 at TP 8, about a second each).
#include "runtime/client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bundle/bundle.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kforge/v1/service.grpc.pb.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using ::google::protobuf::util::MessageDifferencer;
using ::kforge::testing::Contains;
using ::kforge::testing::Glm5Selector;
using ::kforge::testing::TempDir;

constexpr char kBinary[] = KFORGE_BINARY;
constexpr char kArch[] = "sm_90a";

// Small backoffs, so that retry tests take milliseconds.
ServiceClientOptions FastOptions(const std::string& address) {
  ServiceClientOptions options;
  options.address = address;
  options.deadline = absl::Seconds(10);
  options.max_attempts = 4;
  options.initial_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(40);
  return options;
}

std::unique_ptr<ServiceClient> MustCreate(ServiceClientOptions options) {
  absl::StatusOr<std::unique_ptr<ServiceClient>> client = ServiceClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// A KernelService whose answers the test sets, counting the calls.
class FakeService final : public v1::KernelService::Service {
 public:
  using KernelHandler = std::function<grpc::Status(
      grpc::ServerContext*, const v1::GetKernelRequest&, v1::GetKernelResponse*)>;
  using ManifestHandler = std::function<grpc::Status(const v1::GetManifestRequest&, v1::Manifest*)>;

  grpc::Status GetKernel(grpc::ServerContext* context, const v1::GetKernelRequest* request,
                         v1::GetKernelResponse* response) override {
    ++kernel_calls;
    last_kernel_request = *request;
    return on_kernel(context, *request, response);
  }
  grpc::Status GetManifest(grpc::ServerContext*, const v1::GetManifestRequest* request,
                           v1::Manifest* response) override {
    ++manifest_calls;
    last_manifest_request = *request;
    return on_manifest(*request, response);
  }

  KernelHandler on_kernel = [](grpc::ServerContext*, const v1::GetKernelRequest&,
                               v1::GetKernelResponse*) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "not set");
  };
  ManifestHandler on_manifest = [](const v1::GetManifestRequest&, v1::Manifest*) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "not set");
  };
  std::atomic<int> kernel_calls{0};
  std::atomic<int> manifest_calls{0};
  // Written by the handler thread, read after the client's call returned.
  v1::GetKernelRequest last_kernel_request;
  v1::GetManifestRequest last_manifest_request;
};

// `service` served on a free loopback port for the scope of the object.
class FakeServer {
 public:
  explicit FakeServer(FakeService* service) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.SetMaxSendMessageSize(256 << 20);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    EXPECT_GT(port_, 0);
  }
  ~FakeServer() {
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

class ClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<testing::CompiledFirstChoice> compiled = testing::CompileGlm5Tp8(kArch);
    ASSERT_TRUE(compiled.ok()) << compiled.status();
    absl::StatusOr<testing::CompiledFirstChoice> other_arch = testing::CompileGlm5Tp8("sm_120a");
    ASSERT_TRUE(other_arch.ok()) << other_arch.status();
    manifest_ = new v1::Manifest(std::move(compiled->manifest));
    artifact_ = new v1::KernelArtifact(std::move(compiled->artifact));
    other_arch_cubin_ = new std::string(other_arch->artifact.cubin());
  }
  static void TearDownTestSuite() {
    delete manifest_;
    delete artifact_;
    delete other_arch_cubin_;
  }
  void SetUp() override { ASSERT_NE(artifact_, nullptr) << "suite setup failed"; }

  static const v1::ManifestVariant& FirstChoice() {
    return manifest_->variants(manifest_->choice_order(0));
  }

  // Answers every GetKernel with `artifact` after the first `failures`
  // calls, which get `code`.
  void AnswerKernel(const v1::KernelArtifact& artifact, int failures = 0,
                    grpc::StatusCode code = grpc::StatusCode::UNAVAILABLE) {
    const int base = service_.kernel_calls.load();
    service_.on_kernel = [&, artifact, failures, code, base](grpc::ServerContext*,
                                                             const v1::GetKernelRequest&,
                                                             v1::GetKernelResponse* response) {
      if (service_.kernel_calls.load() - base <= failures) {
        return grpc::Status(code, "fake failure");
      }
      *response->mutable_artifact() = artifact;
      return grpc::Status::OK;
    };
  }

  static v1::Manifest* manifest_;
  static v1::KernelArtifact* artifact_;
  static std::string* other_arch_cubin_;
  FakeService service_;
};

v1::Manifest* ClientTest::manifest_ = nullptr;
v1::KernelArtifact* ClientTest::artifact_ = nullptr;
std::string* ClientTest::other_arch_cubin_ = nullptr;

TEST_F(ClientTest, ServerDownIsUnavailableAfterMaxAttempts) {
  const std::string address = absl::StrCat("127.0.0.1:", ::kforge::testing::UnusedLoopbackPort());
  std::unique_ptr<ServiceClient> client = MustCreate(FastOptions(address));
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::Manifest> manifest = client->GetManifest(Glm5Selector(8), kArch);
  const absl::Duration elapsed = absl::Now() - start;
  ASSERT_FALSE(manifest.ok());
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(manifest.status().message(), address));
  EXPECT_TRUE(Contains(manifest.status().message(), "4 attempts"));
  EXPECT_TRUE(Contains(manifest.status().message(), "kforge serve"));
  EXPECT_TRUE(Contains(manifest.status().message(), "bundle"));
  EXPECT_EQ(client->rpc_attempts(), 4);
  // Waits of 20, 40, 40 ms, each jittered to 50..100%: between 50 and 100
  // ms in all, plus three refused connections.
  EXPECT_GE(elapsed, absl::Milliseconds(50));
  EXPECT_LT(elapsed, absl::Seconds(2));
}

TEST_F(ClientTest, RetriesUnavailableAndQueueFullThenSucceeds) {
  service_.on_manifest = [&](const v1::GetManifestRequest&, v1::Manifest* response) {
    if (service_.manifest_calls.load() <= 2) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting");
    }
    *response = *manifest_;
    return grpc::Status::OK;
  };
  AnswerKernel(*artifact_, 1, grpc::StatusCode::RESOURCE_EXHAUSTED);
  FakeServer server(&service_);
  std::unique_ptr<ServiceClient> client = MustCreate(FastOptions(server.address()));
  ASSERT_NE(client, nullptr);

  absl::StatusOr<v1::Manifest> manifest = client->GetManifest(Glm5Selector(8), kArch);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*manifest, *manifest_));
  EXPECT_EQ(service_.manifest_calls.load(), 3);
  EXPECT_EQ(service_.last_manifest_request.arch(), kArch);
  EXPECT_TRUE(MessageDifferencer::Equals(service_.last_manifest_request.kernel(), Glm5Selector(8)));

  absl::StatusOr<ArtifactRef> kernel = client->GetKernel(FirstChoice(), kArch);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ((*kernel)->cubin(), artifact_->cubin());
  EXPECT_EQ(service_.kernel_calls.load(), 2);
  EXPECT_TRUE(MessageDifferencer::Equals(service_.last_kernel_request.kernel().spec(),
                                         FirstChoice().spec()));
  EXPECT_EQ(service_.last_kernel_request.arch(), kArch);
  EXPECT_FALSE(service_.last_kernel_request.lookup_only());
  EXPECT_EQ(client->rpc_attempts(), 5);

  // Both answers are kept: asking again makes no RPC.
  ASSERT_TRUE(client->GetManifest(Glm5Selector(8), kArch).ok());
  absl::StatusOr<ArtifactRef> again = client->GetKernel(FirstChoice(), kArch);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), kernel->get());
  EXPECT_EQ(client->rpc_attempts(), 5);
}

TEST_F(ClientTest, OtherErrorsAreReturnedAtOnceWithTheirCode) {
  service_.on_manifest = [](const v1::GetManifestRequest&, v1::Manifest*) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "num_q_heads: got 0");
  };
  FakeServer server(&service_);
  std::unique_ptr<ServiceClient> client = MustCreate(FastOptions(server.address()));
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::Manifest> manifest = client->GetManifest(Glm5Selector(8), kArch);
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(manifest.status().message(), "num_q_heads: got 0"));
  EXPECT_TRUE(Contains(manifest.status().message(), server.address()));
  EXPECT_EQ(service_.manifest_calls.load(), 1);
}

TEST_F(ClientTest, WrongKernelIsDataLossAndNeverKept) {
  FakeServer server(&service_);
  std::unique_ptr<ServiceClient> client = MustCreate(FastOptions(server.address()));
  ASSERT_NE(client, nullptr);
  v1::KernelArtifact wrong_key = *artifact_;
  wrong_key.set_key(std::string(64, 'f'));
  v1::KernelArtifact garbage_cubin = *artifact_;
  garbage_cubin.set_cubin(
      "\x7f"
      "ELF but not really");
  v1::KernelArtifact other_arch_cubin = *artifact_;
  other_arch_cubin.set_cubin(*other_arch_cubin_);
  const std::pair<const v1::KernelArtifact*, const char*> cases[] = {
      {&wrong_key, "key: expected"},
      {&garbage_cubin, "cubin is unreadable"},
      {&other_arch_cubin, "cubin arch: expected \"sm_90a\", got \"sm_120a\""}};
  int calls = 0;
  for (const auto& [answer, expected] : cases) {
    AnswerKernel(*answer);
    for (int i = 0; i < 2; ++i) {  // a refused answer is asked for again
      absl::StatusOr<ArtifactRef> kernel = client->GetKernel(FirstChoice(), kArch);
      ASSERT_FALSE(kernel.ok()) << expected;
      EXPECT_EQ(kernel.status().code(), absl::StatusCode::kDataLoss);
      EXPECT_TRUE(Contains(kernel.status().message(), expected));
      EXPECT_TRUE(Contains(kernel.status().message(), server.address()));
      EXPECT_EQ(service_.kernel_calls.load(), ++calls);
    }
  }
  AnswerKernel(*artifact_);
  ASSERT_TRUE(client->GetKernel(FirstChoice(), kArch).ok());
  ASSERT_TRUE(client->GetKernel(FirstChoice(), kArch).ok());
  EXPECT_EQ(service_.kernel_calls.load(), calls + 1);
}

// A first answer (partial) is taken only by a client that asked for one,
// and never kept: asking again reaches the server, whose whole module is
// then kept.
TEST_F(ClientTest, FirstAnswersOnlyWhenAskedAndNeverKept) {
  FakeServer server(&service_);
  v1::KernelArtifact partial = *artifact_;
  partial.set_partial(true);
  AnswerKernel(partial);
  std::unique_ptr<ServiceClient> plain = MustCreate(FastOptions(server.address()));
  ASSERT_NE(plain, nullptr);
  absl::StatusOr<ArtifactRef> refused = plain->GetKernel(FirstChoice(), kArch);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(refused.status().message(), "first answer")) << refused.status();
  EXPECT_FALSE(service_.last_kernel_request.first_answer());

  ServiceClientOptions options = FastOptions(server.address());
  options.first_answer = true;
  std::unique_ptr<ServiceClient> client = MustCreate(options);
  ASSERT_NE(client, nullptr);
  const int before = service_.kernel_calls.load();
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<ArtifactRef> first = client->GetKernel(FirstChoice(), kArch);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_TRUE((*first)->partial());
    EXPECT_TRUE(service_.last_kernel_request.first_answer());
  }
  EXPECT_EQ(service_.kernel_calls.load(), before + 2);
  AnswerKernel(*artifact_);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<ArtifactRef> whole = client->GetKernel(FirstChoice(), kArch);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_FALSE((*whole)->partial());
  }
  EXPECT_EQ(service_.kernel_calls.load(), before + 3);
}

// A variant and kernel that agree on a module name or key that is not a
// file name ("../../x"): refused, whatever else matches, so that the name
// never reaches a path (local copies, `kforge get -o`).
TEST_F(ClientTest, NamesThatAreNotFileNamesAreDataLoss) {
  FakeServer server(&service_);
  std::unique_ptr<ServiceClient> client = MustCreate(FastOptions(server.address()));
  ASSERT_NE(client, nullptr);
  for (const char* field : {"module_name", "key"}) {
    for (const char* name : {"../../escape", "a/b", ".hidden", ""}) {
      v1::ManifestVariant variant = FirstChoice();
      v1::KernelArtifact artifact = *artifact_;
      if (std::string(field) == "module_name") {
        variant.set_module_name(name);
        artifact.set_module_name(name);
      } else {
        variant.set_key(name);
        artifact.set_key(name);
      }
      AnswerKernel(artifact);
      absl::StatusOr<ArtifactRef> kernel = client->GetKernel(variant, kArch);
      ASSERT_FALSE(kernel.ok()) << field << " " << name;
      EXPECT_EQ(kernel.status().code(), absl::StatusCode::kDataLoss);
      EXPECT_TRUE(Contains(kernel.status().message(), absl::StrCat(field, ": got \"")));
    }
  }
}

TEST_F(ClientTest, DeadlineIsNotRetried) {
  service_.on_kernel = [](grpc::ServerContext* context, const v1::GetKernelRequest&,
                          v1::GetKernelResponse*) {
    const absl::Time until = absl::Now() + absl::Seconds(5);
    while (!context->IsCancelled() && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "too late");
  };
  FakeServer server(&service_);
  ServiceClientOptions options = FastOptions(server.address());
  options.deadline = absl::Milliseconds(200);
  std::unique_ptr<ServiceClient> client = MustCreate(options);
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<ArtifactRef> kernel = client->GetKernel(FirstChoice(), kArch);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(kernel.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(kernel.status().message(), "200ms"));
  EXPECT_EQ(service_.kernel_calls.load(), 1);
  EXPECT_EQ(client->rpc_attempts(), 1);
  EXPECT_LT(elapsed, absl::Seconds(2));
}

TEST_F(ClientTest, CreateRefusesBadOptions) {
  ServiceClientOptions options;
  options.max_attempts = 0;
  absl::StatusOr<std::unique_ptr<ServiceClient>> client = ServiceClient::Create(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(client.status().message(), "max_attempts: got 0"));
  options = ServiceClientOptions();
  options.max_backoff = absl::Milliseconds(1);
  EXPECT_EQ(ServiceClient::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  // Defaults as documented.
  const ServiceClientOptions defaults;
  EXPECT_EQ(defaults.address, "127.0.0.1:50051");
  EXPECT_EQ(defaults.deadline, absl::Seconds(120));
  EXPECT_EQ(defaults.max_attempts, 5);
  EXPECT_EQ(defaults.max_message_bytes, 256 << 20);
}

v1::StatsResponse ServerStats(const std::string& address) {
  auto stub =
      v1::KernelService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::StatsResponse stats;
  grpc::Status s = stub->Stats(&context, v1::StatsRequest(), &stats);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return stats;
}

// The C++ client's transport security against a real `kforge serve` with
// TLS and a token file (certificates made with the openssl CLI, as
// cli_test.sh does): the right CA and token work, a wrong token is
// UNAUTHENTICATED, and a plain-text client is told the server speaks TLS.
TEST_F(ClientTest, TlsAndTokensAgainstARealServer) {
  TempDir tmp("kforge_client_tls_test");
  const std::string pki = (tmp.path() / "pki").string();
  fs::create_directories(pki);
  const std::string make = absl::StrCat(
      "cd '", pki, "' && ",
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj '/CN=kforge client test ca' -keyout ca.key -out ca.pem 2>/dev/null && ",
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=server "
      "-keyout server.key -out server.csr 2>/dev/null && ",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext && ",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 "
      "-extfile server.ext -out server.pem 2>/dev/null");
  ASSERT_EQ(std::system(make.c_str()), 0) << "openssl could not make the test certificates "
                                             "(scripts/install_deps.sh installs it)";
  const std::string token = "client-test-token-0123456789abcdef";
  const fs::path tokens = tmp.path() / "tokens";
  {
    std::ofstream out(tokens);
    out << token << "\n";
    ASSERT_TRUE(out.good());
  }
  // kforge serve refuses a token file its group or others can read.
  fs::permissions(tokens, fs::perms::owner_read | fs::perms::owner_write);

  testing::ServeProcess server(kBinary, tmp.path() / "cache", tmp.path() / "server.log",
                               {"--tls-cert", pki + "/server.pem", "--tls-key", pki + "/server.key",
                                "--auth-token-file", tokens.string()});
  ASSERT_TRUE(server.WaitForAddress());

  ServiceClientOptions good = FastOptions(server.address());
  good.security.tls_ca_file = pki + "/ca.pem";
  good.security.token = token;
  std::unique_ptr<ServiceClient> client = MustCreate(good);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::Manifest> manifest = client->GetManifest(Glm5Selector(8), kArch);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*manifest, *manifest_)) << manifest->DebugString();

  ServiceClientOptions wrong = good;
  wrong.security.token = "not-the-token-0123456789abcdef";
  std::unique_ptr<ServiceClient> stranger = MustCreate(wrong);
  ASSERT_NE(stranger, nullptr);
  absl::StatusOr<v1::Manifest> refused = stranger->GetManifest(Glm5Selector(8), kArch);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << refused.status();

  std::unique_ptr<ServiceClient> plain = MustCreate(FastOptions(server.address()));
  ASSERT_NE(plain, nullptr);
  absl::StatusOr<v1::Manifest> clear = plain->GetManifest(Glm5Selector(8), kArch);
  ASSERT_FALSE(clear.ok());
  EXPECT_TRUE(Contains(clear.status().message(), "TLS")) << clear.status();
}

TEST_F(ClientTest, RealServerWithLocalCopyThenOfflineFromTheBundle) {
  TempDir tmp("kforge_client_test");
  const fs::path copy = tmp.path() / "copy";
  auto server = std::make_unique<testing::ServeProcess>(kBinary, tmp.path() / "cache",
                                                        tmp.path() / "server.log",
                                                        std::vector<std::string>{"--workers", "2"});
  ASSERT_TRUE(server->WaitForAddress());
  ServiceClientOptions options;
  options.address = server->address();
  options.local_copy_dir = copy.string();
  std::unique_ptr<ServiceClient> client = MustCreate(options);
  ASSERT_NE(client, nullptr);

  absl::StatusOr<v1::Manifest> manifest = client->GetManifest(Glm5Selector(8), kArch);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*manifest, *manifest_)) << manifest->DebugString();
  const v1::ManifestVariant& first = FirstChoice();
  absl::StatusOr<ArtifactRef> kernel = client->GetKernel(first, kArch);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  EXPECT_EQ((*kernel)->key(), artifact_->key());
  EXPECT_EQ(client->rpc_attempts(), 2);
  const v1::StatsResponse before = ServerStats(server->address());
  EXPECT_EQ(before.compiles(), 1u);

  // From memory: no RPC, nothing new on the server.
  ASSERT_TRUE(client->GetManifest(Glm5Selector(8), kArch).ok());
  absl::StatusOr<ArtifactRef> again = client->GetKernel(first, kArch);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), kernel->get());
  EXPECT_EQ(client->rpc_attempts(), 2);
  const v1::StatsResponse after = ServerStats(server->address());
  EXPECT_EQ(after.memory_hits(), before.memory_hits());
  EXPECT_EQ(after.misses(), before.misses());

  // Engine start: every variant, so the copy is a complete bundle.
  absl::Status prefetched = PrefetchKernels(*client, *manifest, kArch);
  ASSERT_TRUE(prefetched.ok()) << prefetched;
  EXPECT_EQ(ServerStats(server->address()).compiles(),
            static_cast<uint64_t>(manifest->variants_size()));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->WaitExit(absl::Seconds(60)), 0);
  server.reset();

  EXPECT_EQ(testing::ReadFileOrEmpty(copy / kBundleMarkerFile).empty(), false);
  std::vector<BundleProblem> problems = VerifyBundle(copy.string());
  for (const BundleProblem& p : problems) ADD_FAILURE() << p.path << ": " << p.message;
  absl::StatusOr<std::unique_ptr<BundleSource>> bundle = BundleSource::Open(copy.string());
  ASSERT_TRUE(bundle.ok()) << bundle.status();
  absl::StatusOr<v1::Manifest> offline = (*bundle)->GetManifest(Glm5Selector(8), kArch);
  ASSERT_TRUE(offline.ok()) << offline.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*offline, *manifest));
  for (const v1::ManifestVariant& variant : manifest->variants()) {
    absl::StatusOr<ArtifactRef> fetched = client->GetKernel(variant, kArch);  // memory
    absl::StatusOr<ArtifactRef> local = (*bundle)->GetKernel(variant, kArch);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    ASSERT_TRUE(local.ok()) << local.status();
    EXPECT_EQ((*local)->SerializeAsString(), (*fetched)->SerializeAsString())
        << variant.module_name();
  }
  EXPECT_EQ(client->rpc_attempts(), 2 + manifest->variants_size() - 1);
}

}  // namespace
}  // namespace kforge
