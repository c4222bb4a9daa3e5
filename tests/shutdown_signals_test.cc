// base/shutdown_signals.h: SIGINT/SIGTERM as a notification; base/signal_pipe.h
// and base/reload_signal.h, which it shares its self-pipe with.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/reload_signal.h"
#include "base/shutdown_signals.h"
#include "base/signal_pipe.h"
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

// SIGHUP (reload) and SIGTERM (shutdown) each have their own pipe at once;
// a signal already taken is refused by name, and free again once released.
TEST(SignalPipeTest, EachSignalReachesItsOwnPipeOnly) {
  absl::Mutex mu;
  int reloads = 0;
  absl::StatusOr<std::unique_ptr<ReloadSignal>> reload = ReloadSignal::Install([&] {
    absl::MutexLock lock(&mu);
    ++reloads;
  });
  ASSERT_TRUE(reload.ok()) << reload.status();
  absl::StatusOr<std::unique_ptr<ShutdownSignals>> shutdown = ShutdownSignals::Install();
  ASSERT_TRUE(shutdown.ok()) << shutdown.status();
  absl::StatusOr<std::unique_ptr<SignalPipe>> again = SignalPipe::Install({SIGUSR1, SIGHUP}, {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("Hangup"), std::string::npos) << again.status();
  EXPECT_EQ(ReloadSignal::Install({}).status().code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_EQ(kill(getpid(), SIGHUP), 0);
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                        +[](int* n) { return *n >= 1; }, &reloads),
                                    absl::Seconds(10)));
  }
  EXPECT_EQ((*shutdown)->received(), 0);
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  EXPECT_EQ((*shutdown)->Wait(), SIGTERM);
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(reloads, 1);
  }
  reload->reset();
  // SIGUSR1 was not taken by the refused call above.
  std::atomic<int> seen{0};
  absl::StatusOr<std::unique_ptr<SignalPipe>> usr = SignalPipe::Install(
      {SIGUSR1, SIGHUP}, [&](absl::Span<const int> signos) { seen = signos.back(); });
  ASSERT_TRUE(usr.ok()) << usr.status();
  ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
  for (int i = 0; i < 1000 && seen.load() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(seen.load(), SIGUSR1);
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
