// base/shutdown_signals.h: SIGINT/SIGTERM as a notification.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <utility>

#include "base/shutdown_signals.h"
#include "gtest/gtest.h"

namespace kforge {
namespace {

TEST(ShutdownSignalsTest, FirstSignalWakesWaitAndRunsTheCallback) {
  std::atomic<int> seen{0};
  ShutdownSignalOptions options;
  options.on_first = [&](int signo) { seen = signo; };
  absl::StatusOr<std::unique_ptr<ShutdownSignals>> signals =
      ShutdownSignals::Install(std::move(options));
  ASSERT_TRUE(signals.ok()) << signals.status();
  EXPECT_EQ((*signals)->received(), 0);
  EXPECT_FALSE((*signals)->requested().load());
  // Only one scheme at a time.
  EXPECT_EQ(ShutdownSignals::Install().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  EXPECT_EQ((*signals)->Wait(), SIGTERM);
  EXPECT_EQ(seen.load(), SIGTERM);
  EXPECT_TRUE((*signals)->requested().load());
  signals->reset();
  // Uninstalled: a new one may be installed.
  EXPECT_TRUE(ShutdownSignals::Install().ok());
}

TEST(ShutdownSignalsDeathTest, SecondSignalExitsAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ShutdownSignalOptions options;
        options.second_message = "second one\n";
        options.second_exit_code = [](int signo) { return 100 + signo; };
        auto signals = ShutdownSignals::Install(std::move(options));
        if (!signals.ok()) _exit(1);
        kill(getpid(), SIGINT);
        (*signals)->Wait();
        kill(getpid(), SIGINT);
        for (;;) pause();
      },
      ::testing::ExitedWithCode(100 + SIGINT), "second one");
}

}  // namespace
}  // namespace kforge
