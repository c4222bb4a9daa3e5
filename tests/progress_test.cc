// The progress display of the deployment commands (cli/progress.h): plain
// lines for logs, a redrawn status line for terminals, the failure summary,
// and concurrent reporting.
#include "cli/progress.h"

#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kforge::cli {
namespace {

using ::kforge::testing::Contains;

// A clock the test moves by hand.
struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::function<absl::Time()> Fn() {
    return [this] { return now; };
  }
};

ProgressOptions Options(std::ostream* out, bool tty, FakeClock& clock, int width = 200) {
  ProgressOptions options;
  options.out = out;
  options.tty = tty;
  options.width = width;
  options.now = clock.Fn();
  return options;
}

TEST(ProgressTest, LogGetsOneLinePerItem) {
  std::ostringstream out;
  FakeClock clock;
  Progress progress(Options(&out, /*tty=*/false, clock));
  progress.Start(400);
  progress.Done("glm-5 tp8 sq1 bf16 sm_90a", true, 0.613);
  progress.Done("glm-5 tp8 sq2 bf16 sm_120a", false, 1.2,
                "compile failed: error: x\nsecond line of the log");
  EXPECT_EQ(out.str(),
            "[  1/400] ok      0.61s glm-5 tp8 sq1 bf16 sm_90a\n"
            "[  2/400] FAIL    1.20s glm-5 tp8 sq2 bf16 sm_120a: "
            "compile failed: error: x\n");
  EXPECT_FALSE(Contains(out.str(), "\r"));
}

TEST(ProgressTest, TerminalRedrawsOneStatusLineWithEta) {
  std::ostringstream out;
  FakeClock clock;
  Progress progress(Options(&out, /*tty=*/true, clock));
  progress.Start(4);
  EXPECT_TRUE(Contains(out.str(), "\r[--------------------] 0/4  0:00  ETA --:--"));
  clock.now += absl::Seconds(10);
  progress.Done("kernel a", true, 10.0);
  // One of four done in 10 s: three more at the mean rate is 30 s.
  EXPECT_TRUE(Contains(out.str(), "\r[#####---------------] 1/4  0:10  ETA 0:30  kernel a\x1b[K"));
  clock.now += absl::Seconds(10);
  progress.Done("kernel b", true, 10.0);
  EXPECT_TRUE(Contains(out.str(), "2/4  0:20  ETA 0:20  kernel b"));
  // Successes only move the status line: nothing scrolls.
  EXPECT_FALSE(Contains(out.str(), "\n"));
}

TEST(ProgressTest, TerminalKeepsFailuresAboveTheStatusLine) {
  std::ostringstream out;
  FakeClock clock;
  Progress progress(Options(&out, /*tty=*/true, clock));
  progress.Start(2);
  clock.now += absl::Seconds(3);
  progress.Done("kernel a", false, 3.0, "INTERNAL: boom\nlog line");
  EXPECT_TRUE(Contains(out.str(), "\r\x1b[KFAIL kernel a: INTERNAL: boom\n"));
  EXPECT_TRUE(Contains(out.str(), "1/2  1 failed  0:03  ETA 0:03  kernel a"));
  EXPECT_FALSE(Contains(out.str(), "log line"));
}

TEST(ProgressTest, TerminalLineIsCutToTheWidth) {
  std::ostringstream out;
  FakeClock clock;
  Progress progress(Options(&out, /*tty=*/true, clock, /*width=*/40));
  progress.Start(3);
  progress.Done(std::string(100, 'x'), true, 1.0);
  // Every redraw is "\r<line>\x1b[K" with the line at most width - 1.
  for (absl::string_view part : absl::StrSplit(out.str(), '\r', absl::SkipEmpty())) {
    absl::string_view line = part.substr(0, part.find("\x1b[K"));
    EXPECT_LE(line.size(), 39u) << line;
  }
}

TEST(ProgressTest, SummaryListsEveryFailureWithItsWholeError) {
  std::ostringstream out;
  FakeClock clock;
  Progress progress(Options(&out, /*tty=*/false, clock));
  progress.Start(3);
  progress.Done("a", true, 0.1);
  progress.Done("b", false, 0.2, "INTERNAL: nvrtc\nline 2 of the log");
  clock.now += absl::Seconds(65);
  progress.Done("c", false, 0.3, "UNAVAILABLE: server gone");
  const size_t before = out.str().size();
  const ProgressSummary summary = progress.Finish();
  EXPECT_EQ(out.str().substr(before),
            "3/3 done in 1:05, 2 failed\n"
            "  FAIL b:\n    INTERNAL: nvrtc\n    line 2 of the log\n"
            "  FAIL c:\n    UNAVAILABLE: server gone\n");
  EXPECT_EQ(summary.total, 3u);
  EXPECT_EQ(summary.done, 3u);
  EXPECT_EQ(summary.elapsed, absl::Seconds(65));
  ASSERT_EQ(summary.failures.size(), 2u);
  EXPECT_EQ(summary.failures[0].label, "b");
  EXPECT_EQ(summary.failures[1].error, "UNAVAILABLE: server gone");
}

TEST(ProgressTest, TerminalFinishEndsTheStatusLine) {
  std::ostringstream out;
  FakeClock clock;
  Progress progress(Options(&out, /*tty=*/true, clock));
  progress.Start(1);
  progress.Done("a", true, 0.1);
  progress.Finish();
  EXPECT_TRUE(Contains(out.str(), "] 1/1  0:00\x1b[K\n1/1 done in 0:00, 0 failed\n"));
}

TEST(ProgressTest, ConcurrentWorkersEachGetOneWholeLine) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 100;
  std::ostringstream out;
  FakeClock clock;
  Progress progress(Options(&out, /*tty=*/false, clock));
  progress.Start(kThreads * kPerThread);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&progress, t] {
      for (int i = 0; i < kPerThread; ++i) {
        progress.Done(absl::StrCat("t", t, "-", i), i % 10 != 0, 0.01, "bad");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const ProgressSummary summary = progress.Finish();
  EXPECT_EQ(summary.done, static_cast<size_t>(kThreads * kPerThread));
  EXPECT_EQ(summary.failures.size(), static_cast<size_t>(kThreads * kPerThread / 10));
  // Each item line is whole and the counters run 1..800 without a gap.
  std::set<int> counters;
  for (absl::string_view line : absl::StrSplit(out.str(), '\n')) {
    if (!absl::StartsWith(line, "[")) continue;
    int n = 0;
    ASSERT_TRUE(
        absl::SimpleAtoi(absl::StripLeadingAsciiWhitespace(line.substr(1, line.find('/') - 1)), &n))
        << line;
    EXPECT_TRUE(Contains(line, "s t")) << line;
    counters.insert(n);
  }
  EXPECT_EQ(counters.size(), static_cast<size_t>(kThreads * kPerThread));
  EXPECT_EQ(*counters.begin(), 1);
  EXPECT_EQ(*counters.rbegin(), kThreads * kPerThread);
}

TEST(ProgressTest, ClockFormat) {
  EXPECT_EQ(FormatClock(absl::Seconds(0)), "0:00");
  EXPECT_EQ(FormatClock(absl::Seconds(59.9)), "0:59");
  EXPECT_EQ(FormatClock(absl::Seconds(723)), "12:03");
  EXPECT_EQ(FormatClock(absl::Seconds(3729)), "1:02:09");
  EXPECT_EQ(FormatClock(-absl::Seconds(5)), "0:00");
}

}  // namespace
}  // namespace kforge::cli
