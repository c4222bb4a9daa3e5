// `kforge health` (the container image's HEALTHCHECK): the raw-bytes
// health messages, and the command's exit codes against a real server, a
// stopped one and a port nothing listens on.
#include <sys/wait.h>

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/health.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kforge::cli {
namespace {

using ::kforge::testing::ReadFileOrEmpty;
using ::kforge::testing::ServeProcess;
using ::kforge::testing::SpawnWithLog;
using ::kforge::testing::TempDir;
using ::kforge::testing::UnusedLoopbackPort;

constexpr char kBinary[] = KFORGE_BINARY;

TEST(HealthMessagesTest, RequestNamesTheServiceOrNothing) {
  EXPECT_EQ(EncodeHealthCheckRequest(""), "");
  EXPECT_EQ(EncodeHealthCheckRequest("a.B"), std::string("\x0a\x03", 2) + "a.B");
  const std::string long_name(200, 'x');
  // 200 = 0xc8: a two-byte length varint (0xc8 0x01).
  EXPECT_EQ(EncodeHealthCheckRequest(long_name), std::string("\x0a\xc8\x01", 3) + long_name);
}

TEST(HealthMessagesTest, DecodesEachStatus) {
  EXPECT_EQ(*DecodeHealthCheckResponse(""), 0);  // proto3: UNKNOWN is not written
  EXPECT_EQ(*DecodeHealthCheckResponse(std::string("\x08\x01", 2)), 1);
  EXPECT_EQ(*DecodeHealthCheckResponse(std::string("\x08\x02", 2)), 2);
  EXPECT_EQ(*DecodeHealthCheckResponse(std::string("\x08\x03", 2)), 3);
  EXPECT_EQ(ServingStatusName(1), "SERVING");
  EXPECT_EQ(ServingStatusName(2), "NOT_SERVING");
  EXPECT_EQ(ServingStatusName(0), "UNKNOWN");
  EXPECT_EQ(ServingStatusName(3), "SERVICE_UNKNOWN");
  EXPECT_EQ(ServingStatusName(9), "status 9");
}

TEST(HealthMessagesTest, SkipsFieldsItDoesNotKnow) {
  // field 2 varint 7, field 3 string "ab", field 4 fixed32, field 5
  // fixed64, then status SERVING: the last status wins, as in protobuf.
  const std::string bytes = std::string("\x08\x02", 2) + std::string("\x10\x07", 2) +
                            std::string("\x1a\x02", 2) + "ab" +
                            std::string("\x25\x00\x00\x00\x00", 5) + std::string("\x29", 1) +
                            std::string(8, '\0') + std::string("\x08\x01", 2);
  absl::StatusOr<int> status = DecodeHealthCheckResponse(bytes);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(*status, 1);
}

TEST(HealthMessagesTest, RefusesBytesThatAreNoResponse) {
  for (const std::string& bad : {
           std::string("\x08", 1),                      // status without its value
           std::string("\x0a\x01\x01", 3),              // status length-delimited
           std::string("\x1a\x05", 2) + "ab",           // length past the end
           std::string("\x00\x01", 2),                  // field 0
           std::string("\x13", 1),                      // wire type 3 (groups)
           std::string("\x25\x00\x00", 3),              // truncated fixed32
           std::string("\x08\xff\xff\xff\xff\x0f", 6),  // status past int range
           std::string(11, '\xff'),                     // a varint over 64 bits
       }) {
    absl::StatusOr<int> status = DecodeHealthCheckResponse(bad);
    EXPECT_FALSE(status.ok()) << "accepted " << absl::CEscape(bad);
    if (!status.ok()) {
      EXPECT_TRUE(absl::StrContains(status.status().message(), "HealthCheckResponse"))
          << status.status();
    }
  }
}

// Runs `kforge ARGS...`; returns its exit code and puts its stdout and
// stderr in *output.
int RunKforge(const TempDir& dir, std::vector<std::string> args, std::string* output) {
  static int runs = 0;
  const std::filesystem::path log = dir.path() / absl::StrCat("run", ++runs, ".log");
  args.insert(args.begin(), kBinary);
  const pid_t pid = SpawnWithLog(std::move(args), {}, log);
  if (pid <= 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  *output = ReadFileOrEmpty(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

TEST(HealthCommandTest, ExitsZeroOnlyWhileTheServerServes) {
  TempDir dir;
  ServeProcess server(kBinary, dir.path() / "cache", dir.path() / "serve.log");
  ASSERT_TRUE(server.WaitForAddress());
  const std::string address = server.address();
  std::string out;
  int code = -1;
  // Listening comes just before health says SERVING.
  for (int i = 0; i < 100 && code != 0; ++i) {
    code = RunKforge(dir, {"health", "--server", address}, &out);
    if (code != 0) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out, "SERVING\n");

  // A service the health service does not know: NOT_FOUND, unhealthy.
  EXPECT_EQ(RunKforge(dir, {"health", "--server", address, "--service", "no.such.Service"}, &out),
            1)
      << out;
  EXPECT_TRUE(absl::StrContains(out, "NOT_FOUND")) << out;

  // The server's address from KFORGE_SERVER, as the image's HEALTHCHECK
  // finds it.
  {
    const std::filesystem::path log = dir.path() / "env.log";
    const pid_t pid = SpawnWithLog({kBinary, "health"}, {"KFORGE_SERVER=" + address}, log);
    ASSERT_GT(pid, 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFileOrEmpty(log);
  }

  // Stopped (SIGTERM drains, exit 0): unhealthy, and said so.
  server.Signal(SIGTERM);
  EXPECT_EQ(server.WaitExit(absl::Seconds(60)), 0);
  EXPECT_EQ(RunKforge(dir, {"health", "--server", address, "--timeout", "2s"}, &out), 1) << out;
  EXPECT_TRUE(absl::StrContains(out, "cannot reach kforge server at " + address)) << out;
}

TEST(HealthCommandTest, NothingListeningIsUnhealthyWithinTheTimeout) {
  TempDir dir;
  const std::string address = absl::StrCat("127.0.0.1:", UnusedLoopbackPort());
  std::string out;
  const absl::Time start = absl::Now();
  EXPECT_EQ(RunKforge(dir, {"health", "--server", address, "--timeout", "1s"}, &out), 1) << out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(absl::StrContains(out, "cannot reach kforge server")) << out;
}

TEST(HealthCommandTest, BadFlagsAreUsageErrors) {
  TempDir dir;
  std::string out;
  EXPECT_EQ(RunKforge(dir, {"health", "--timeout", "0"}, &out), 2) << out;
  EXPECT_TRUE(absl::StrContains(out, "--timeout")) << out;
  EXPECT_EQ(RunKforge(dir, {"health", "extra"}, &out), 2) << out;
  EXPECT_EQ(RunKforge(dir, {"health", "--help"}, &out), 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "usage: kforge health")) << out;
}

}  // namespace
}  // namespace kforge::cli
