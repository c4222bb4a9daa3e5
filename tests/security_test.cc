// Issue 43's findings about credentials, access and bundles, each against
// real `kforge` processes on loopback with certificates made by the openssl
// CLI (as cli_test.sh and client_test do), every wait bounded.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kforge/v1/service.grpc.pb.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

namespace fs = std::filesystem;
using ::kforge::testing::Contains;
using ::kforge::testing::HttpGet;
using ::kforge::testing::ReadFileOrEmpty;
using ::kforge::testing::ServeProcess;
using ::kforge::testing::TempDir;

constexpr char kBinary[] = KFORGE_BINARY;
constexpr char kUserToken[] = "user-token-0123456789abcdef";
constexpr char kAdminToken[] = "admin-token-0123456789abcdef";

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// `kforge ARGS` (each already shell-quoted by the caller where needed),
// killed after 60 s.
RunResult Kforge(const std::string& args) {
  RunResult result;
  const std::string command = absl::StrCat("timeout 60 ", kBinary, " ", args, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) result.output.append(buf, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

void WriteFile(const fs::path& path, const std::string& text, fs::perms mode) {
  std::ofstream(path) << text;
  fs::permissions(path, mode);
}

class SecurityTest : public ::testing::Test {
 protected:
  // One CA, a server certificate from it (valid, and one that expired a day
  // ago), another CA, and token files readable by their owner only.
  static void SetUpTestSuite() {
    pki_ = new TempDir("kforge_security_test_pki");
    const std::string make = absl::StrCat(
        "cd '", pki_->path().string(), "' && ",
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
        "-subj '/CN=kforge security test ca' -keyout ca.key -out ca.pem 2>/dev/null && ",
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
        "-subj '/CN=kforge other ca' -keyout other.key -out other.pem 2>/dev/null && ",
        "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=server "
        "-keyout server.key -out server.csr 2>/dev/null && ",
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext && ",
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 "
        "-extfile server.ext -out server.pem 2>/dev/null && ",
        // -days -1: notAfter a day before notBefore (now), i.e. expired.
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days -1 "
        "-extfile server.ext -out expired.pem 2>/dev/null && chmod 600 *.key");
    ASSERT_EQ(std::system(make.c_str()), 0) << "openssl could not make the test certificates "
                                               "(scripts/install_deps.sh installs it)";
    WriteFile(Pki("user.tokens"), absl::StrCat(kUserToken, "\n"), fs::perms::owner_read);
    WriteFile(Pki("admin.tokens"), absl::StrCat(kAdminToken, "\n"), fs::perms::owner_read);
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }

  static std::string Pki(const std::string& name) { return (pki_->path() / name).string(); }

  static std::vector<std::string> Tls() {
    return {"--tls-cert", Pki("server.pem"), "--tls-key", Pki("server.key")};
  }

  // A TLS channel trusting the test CA, sending `token` if not empty.
  static std::shared_ptr<grpc::Channel> Channel(const std::string& address,
                                                const std::string& token) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFileOrEmpty(Pki("ca.pem"));
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
    if (!token.empty()) {
      credentials =
          grpc::CompositeChannelCredentials(credentials, grpc::AccessTokenCredentials(token));
    }
    return grpc::CreateChannel(address, credentials);
  }

  static grpc::StatusCode StatsCode(const std::string& address, const std::string& token) {
    auto stub = v1::KernelService::NewStub(Channel(address, token));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::StatsResponse response;
    return stub->Stats(&context, v1::StatsRequest(), &response).error_code();
  }

  static grpc::StatusCode GetKernelCode(const std::string& address, const std::string& token) {
    auto stub = v1::KernelService::NewStub(Channel(address, token));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::GetKernelRequest request;
    *request.mutable_kernel() = testing::Glm5Selector(8);
    request.set_arch("sm_90a");
    request.set_lookup_only(true);
    v1::GetKernelResponse response;
    return stub->GetKernel(&context, request, &response).error_code();
  }

  static grpc::StatusCode WarmCode(const std::string& address, const std::string& token) {
    grpc::GenericStub stub(Channel(address, token));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::CompletionQueue cq;
    // The token check answers before any handler: an empty request will do.
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        stub.PrepareCall(&context, "/kforge.v1.KernelService/Warm", &cq);
    call->StartCall(reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    cq.Next(&tag, &ok);
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return status.error_code();
  }

  TempDir tmp_{"kforge_security_test"};
  static TempDir* pki_;
};

TempDir* SecurityTest::pki_ = nullptr;

// Finding 7: a world-readable token file or key was accepted silently.
TEST_F(SecurityTest, TokenFilesAndKeysOpenToOthersAreRefused) {
  const fs::path tokens = tmp_.path() / "tokens";
  WriteFile(tokens, absl::StrCat(kUserToken, "\n"),
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                fs::perms::others_read);
  std::vector<std::string> args = Tls();
  args.insert(args.end(), {"--auth-token-file", tokens.string()});
  {
    ServeProcess server(kBinary, tmp_.path() / "cache", tmp_.path() / "world.log", args);
    EXPECT_EQ(server.WaitExit(absl::Seconds(30)), 1);
    EXPECT_TRUE(Contains(server.Log(), absl::StrCat("--auth-token-file ", tokens.string(),
                                                    " is open to every user (mode 0644)")));
    EXPECT_TRUE(Contains(server.Log(), "chmod 600"));
  }
  fs::permissions(tokens, fs::perms::owner_read | fs::perms::group_read);
  {
    ServeProcess server(kBinary, tmp_.path() / "cache", tmp_.path() / "group.log", args);
    EXPECT_EQ(server.WaitExit(absl::Seconds(30)), 1);
    EXPECT_TRUE(Contains(server.Log(), "is open to its group (mode 0440)"));
  }
  // On purpose (a secret mounted 0644): a warning, and the server starts.
  args.push_back("--allow-readable-secrets");
  {
    ServeProcess server(kBinary, tmp_.path() / "cache", tmp_.path() / "allowed.log", args);
    ASSERT_TRUE(server.WaitForAddress());
    EXPECT_TRUE(Contains(server.Log(), "warning: --auth-token-file"));
  }
  const fs::path key = tmp_.path() / "server.key";
  fs::copy_file(Pki("server.key"), key);
  fs::permissions(key, fs::perms::owner_read | fs::perms::others_read);
  ServeProcess server(kBinary, tmp_.path() / "cache", tmp_.path() / "key.log",
                      {"--tls-cert", Pki("server.pem"), "--tls-key", key.string()});
  EXPECT_EQ(server.WaitExit(absl::Seconds(30)), 1);
  EXPECT_TRUE(Contains(server.Log(), absl::StrCat("--tls-key ", key.string(), " is open")));
}

// Finding 7: an expired certificate was served, and doctor said "tls: on".
TEST_F(SecurityTest, ExpiredCertificateIsRefusedAtStartOnReloadAndByDoctor) {
  {
    ServeProcess server(kBinary, tmp_.path() / "cache", tmp_.path() / "expired.log",
                        {"--tls-cert", Pki("expired.pem"), "--tls-key", Pki("server.key")});
    EXPECT_EQ(server.WaitExit(absl::Seconds(30)), 1);
    EXPECT_TRUE(Contains(server.Log(), absl::StrCat("--tls-cert ", Pki("expired.pem"),
                                                    ": the certificate expired on ")));
  }
  const RunResult doctor = Kforge(
      absl::StrCat("doctor --cache-dir '", (tmp_.path() / "cache").string(), "' --tls-cert '",
                   Pki("expired.pem"), "' --tls-key '", Pki("server.key"), "'"));
  EXPECT_EQ(doctor.exit_code, 1) << doctor.output;
  EXPECT_TRUE(Contains(doctor.output, "the certificate expired on")) << doctor.output;
  EXPECT_FALSE(Contains(doctor.output, "tls: on")) << doctor.output;
  const RunResult good = Kforge(
      absl::StrCat("doctor --cache-dir '", (tmp_.path() / "cache").string(), "' --tls-cert '",
                   Pki("server.pem"), "' --tls-key '", Pki("server.key"), "'"));
  EXPECT_TRUE(Contains(good.output, "tls: on (")) << good.output;
  EXPECT_TRUE(Contains(good.output, ", valid until ")) << good.output;

  // Rotated to an expired certificate: SIGHUP keeps the one in use.
  const fs::path cert = tmp_.path() / "cert.pem";
  fs::copy_file(Pki("server.pem"), cert);
  ServeProcess server(kBinary, tmp_.path() / "cache", tmp_.path() / "reload.log",
                      {"--tls-cert", cert.string(), "--tls-key", Pki("server.key")});
  ASSERT_TRUE(server.WaitForAddress());
  fs::copy_file(Pki("expired.pem"), cert, fs::copy_options::overwrite_existing);
  server.Signal(SIGHUP);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!Contains(server.Log(), "TLS files not reloaded") && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(Contains(server.Log(), "TLS files not reloaded, the old ones stay: --tls-cert"));
  EXPECT_TRUE(Contains(server.Log(), "the certificate expired on"));
  EXPECT_EQ(StatsCode(server.address(), ""), grpc::StatusCode::OK);
}

// Finding 7: with only --admin-token-file, GetKernel and Stats were open
// while the start line said "bearer tokens".
TEST_F(SecurityTest, OnlyAnAdminTokenFileClosesTheReadMethods) {
  std::vector<std::string> args = Tls();
  args.insert(args.end(), {"--admin-token-file", Pki("admin.tokens")});
  {
    ServeProcess server(kBinary, tmp_.path() / "cache", tmp_.path() / "closed.log", args);
    ASSERT_TRUE(server.WaitForAddress());
    const std::string log = server.Log();
    EXPECT_TRUE(Contains(log, "kforge: access: health (grpc.health.v1.Health): open\n")) << log;
    EXPECT_TRUE(Contains(log,
                         "kforge: access: read (GetKernel, GetManifest, Stats, reflection): an "
                         "admin token"))
        << log;
    EXPECT_TRUE(Contains(log, "kforge: access: warm (Warm, Prebuild): an admin token")) << log;
    EXPECT_EQ(GetKernelCode(server.address(), ""), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(StatsCode(server.address(), ""), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(StatsCode(server.address(), kAdminToken), grpc::StatusCode::OK);
  }
  // --open-reads opens them on purpose, and says so.
  args.push_back("--open-reads");
  ServeProcess server(kBinary, tmp_.path() / "cache", tmp_.path() / "open.log", args);
  ASSERT_TRUE(server.WaitForAddress());
  EXPECT_TRUE(Contains(server.Log(),
                       "read (GetKernel, GetManifest, Stats, reflection): open "
                       "(no token: --open-reads)"));
  EXPECT_EQ(StatsCode(server.address(), ""), grpc::StatusCode::OK);
  EXPECT_EQ(WarmCode(server.address(), ""), grpc::StatusCode::UNAUTHENTICATED);
}

// Finding 6: refusals by the token check were not counted.
TEST_F(SecurityTest, AuthFailuresAreCountedByReason) {
  std::vector<std::string> args = Tls();
  args.insert(args.end(), {"--auth-token-file", Pki("user.tokens"), "--admin-token-file",
                           Pki("admin.tokens"), "--metrics-listen", "127.0.0.1:0"});
  ServeProcess server(kBinary, tmp_.path() / "cache", tmp_.path() / "server.log", args);
  ASSERT_TRUE(server.WaitForAddress());
  const int port = MetricsPort(server);
  ASSERT_GT(port, 0) << server.Log();
  EXPECT_EQ(StatsCode(server.address(), ""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(StatsCode(server.address(), ""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(StatsCode(server.address(), "wrong-token-0123456789abcdef"),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(WarmCode(server.address(), kUserToken), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(StatsCode(server.address(), kUserToken), grpc::StatusCode::OK);
  const std::string page = HttpGet(port, "/metrics");
  EXPECT_TRUE(Contains(page, "\nkforge_auth_failures_total{reason=\"missing_token\"} 2\n")) << page;
  EXPECT_TRUE(Contains(page, "\nkforge_auth_failures_total{reason=\"unknown_token\"} 1\n")) << page;
  EXPECT_TRUE(Contains(page, "\nkforge_auth_failures_total{reason=\"not_admin\"} 1\n")) << page;
}

// Finding 10: "serving on unix:1" for --listen unix:PATH.
TEST_F(SecurityTest, UnixSocketAddressIsPrintedAsGiven) {
  const std::string socket = (tmp_.path() / "kforge.sock").string();
  ServeProcess server(kBinary, tmp_.path() / "cache", tmp_.path() / "server.log",
                      {"--listen", "unix:" + socket});
  ASSERT_TRUE(server.WaitForAddress());
  EXPECT_EQ(server.address(), "unix:" + socket) << server.Log();
}

// Finding 10: raw "E1206 ..." gRPC lines on TLS failures, and "Socket
// closed" as the only word for mTLS without a client certificate.
TEST_F(SecurityTest, CliTlsFailuresAreOneExplainedLine) {
  std::vector<std::string> args = Tls();
  args.insert(args.end(), {"--tls-client-ca", Pki("ca.pem")});
  ServeProcess server(kBinary, tmp_.path() / "cache", tmp_.path() / "server.log", args);
  ASSERT_TRUE(server.WaitForAddress());
  const std::regex grpc_line("(^|\n)[EWID][0-9]{4} ");
  const RunResult no_cert =
      Kforge(absl::StrCat("stats --server ", server.address(), " --tls-ca '", Pki("ca.pem"), "'"));
  EXPECT_EQ(no_cert.exit_code, 1) << no_cert.output;
  EXPECT_TRUE(Contains(no_cert.output, "requires a client certificate (mTLS)")) << no_cert.output;
  EXPECT_FALSE(std::regex_search(no_cert.output, grpc_line)) << no_cert.output;
  const RunResult wrong_ca = Kforge(
      absl::StrCat("stats --server ", server.address(), " --tls-ca '", Pki("other.pem"), "'"));
  EXPECT_EQ(wrong_ca.exit_code, 1) << wrong_ca.output;
  EXPECT_TRUE(Contains(wrong_ca.output, "TLS handshake failed")) << wrong_ca.output;
  EXPECT_FALSE(std::regex_search(wrong_ca.output, grpc_line)) << wrong_ca.output;
}

// Finding 10: doctor said it takes serve flags but refused
// --auth-token-file.
TEST_F(SecurityTest, DoctorTakesTheServeFlagsAndChecksTokenFiles) {
  const std::string common =
      absl::StrCat("doctor --cache-dir '", (tmp_.path() / "cache").string(), "' --tls-cert '",
                   Pki("server.pem"), "' --tls-key '", Pki("server.key"),
                   "' --metrics-listen "
                   "127.0.0.1:0 --admin-token-file '",
                   Pki("admin.tokens"), "'");
  RunResult run = Kforge(absl::StrCat(common, " --auth-token-file '", Pki("user.tokens"), "'"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Contains(run.output, "tokens: " + Pki("user.tokens") + ": 1 token\n")) << run.output;
  EXPECT_TRUE(Contains(run.output,
                       "access: read (GetKernel, GetManifest, Stats, reflection): a "
                       "user or admin token"))
      << run.output;
  const fs::path open_tokens = tmp_.path() / "open.tokens";
  WriteFile(open_tokens, absl::StrCat(kUserToken, "\n"),
            fs::perms::owner_read | fs::perms::others_read);
  run = Kforge(absl::StrCat(common, " --auth-token-file '", open_tokens.string(), "'"));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_TRUE(Contains(run.output, "is open to every user")) << run.output;
}

// Finding 8 (rollback) and finding 10 (verify's OK, stray files in a
// bundle a server warms from), with bundles made by `kforge prebuild`.
TEST_F(SecurityTest, BundlesOlderThanTheMinimumOrWithStrayFilesAreRefused) {
  const fs::path matrix = tmp_.path() / "one.json";
  std::ofstream(matrix) << R"({"models": [{"preset": "glm-5", "tp": [8]}], "archs": ["sm_90a"]})";
  const std::string signer = (tmp_.path() / "signer").string();
  ASSERT_EQ(Kforge("keygen --out '" + signer + "'").exit_code, 0);
  const fs::path current = tmp_.path() / "current";
  const fs::path older = tmp_.path() / "older";
  RunResult run = Kforge(absl::StrCat("prebuild '", matrix.string(), "' --out '", current.string(),
                                      "' --sign '", signer, ".key' --sequence 5"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  fs::copy(current, older, fs::copy_options::recursive);
  run = Kforge(absl::StrCat("prebuild '", matrix.string(), "' --out '", older.string(),
                            "' --sign '", signer, ".key' --sequence 4"));
  ASSERT_EQ(run.exit_code, 0) << run.output;

  run = Kforge(absl::StrCat("verify '", current.string(), "'"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Contains(run.output, "sequence 5, signature present but NOT checked")) << run.output;
  run = Kforge(absl::StrCat("verify --trust '", signer, ".pub' --trust-min-sequence 5 '",
                            older.string(), "'"));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_TRUE(Contains(run.output, "has sequence 4, below the required minimum 5")) << run.output;

  auto warm = [&](const fs::path& bundle, const std::string& log) {
    return std::make_unique<ServeProcess>(
        kBinary, tmp_.path() / "cache", tmp_.path() / log,
        std::vector<std::string>{"--warm-from", bundle.string(), "--trust", signer + ".pub",
                                 "--trust-min-sequence", "5"});
  };
  {
    auto server = warm(older, "older.log");
    EXPECT_EQ(server->WaitExit(absl::Seconds(30)), 1);
    EXPECT_TRUE(Contains(server->Log(), "has sequence 4, below the required minimum 5"));
  }
  {
    auto server = warm(current, "current.log");
    ASSERT_TRUE(server->WaitForAddress());
  }
  // A stray file and an unlisted link, which verify reports, stop a warm-up.
  std::ofstream(current / "kernels" / "stray.bin") << "not a kernel";
  fs::create_symlink("/etc/passwd", current / "manifests" / "linked.json");
  auto server = warm(current, "stray.log");
  EXPECT_EQ(server->WaitExit(absl::Seconds(30)), 1);
  EXPECT_TRUE(Contains(server->Log(),
                       "2 files are not listed in checksums.sha256 "
                       "(kernels/stray.bin, manifests/linked.json)"))
      << server->Log();
}

}  // namespace
}  // namespace kforge
