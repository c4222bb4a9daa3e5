// base/log.h: the two line formats, escaping, fields, whole lines under
// concurrency.
#include "base/log.h"

#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace kforge {
namespace {

const absl::Time kAt = absl::FromUnixMillis(1764575400123);  // 2025-12-01T07:50:00.123Z

// Text is the lines kforge has always printed ("kforge: <message>", which
// scripts grep for), with the event's fields after them.
TEST(LogTest, TextLineIsTheMessageThenTheFields) {
  EXPECT_EQ(FormatLogLine(LogFormat::kText, kAt, LogLevel::kInfo, "compile", "compiled",
                          {{"key", "ab12"}, {"duration", absl::Milliseconds(1500)}, {"n", 3}}),
            "kforge: compiled [key=ab12 duration_s=1.5 n=3]");
  EXPECT_EQ(FormatLogLine(LogFormat::kText, kAt, LogLevel::kError, "stop", "", {}), "kforge: stop");
  // A value with spaces or quotes is quoted; a message stays on one line.
  EXPECT_EQ(FormatLogLine(LogFormat::kText, kAt, LogLevel::kWarning, "e", "two\nlines",
                          {{"why", "a \"b\" c"}, {"empty", ""}}),
            "kforge: two lines [why=\"a \\\"b\\\" c\" empty=\"\"]");
}

TEST(LogTest, JsonLineIsOneObjectWithNumbersUnquoted) {
  EXPECT_EQ(FormatLogLine(LogFormat::kJson, kAt, LogLevel::kInfo, "compile", "compiled",
                          {{"key", "ab12"}, {"duration", absl::Seconds(2)}, {"bytes", 12345}}),
            "{\"ts\":\"2025-12-01T07:50:00.123Z\",\"level\":\"info\",\"event\":\"compile\","
            "\"msg\":\"compiled\",\"key\":\"ab12\",\"duration_s\":2,\"bytes\":12345}");
  // Quotes, backslashes, newlines and control bytes are escaped: a hostile
  // module name or message cannot break the line or the object.
  EXPECT_EQ(FormatLogLine(LogFormat::kJson, kAt, LogLevel::kWarning, "corrupt", "a\"b\\c\nd",
                          {{"module", std::string("x\x01y\x7f")}}),
            "{\"ts\":\"2025-12-01T07:50:00.123Z\",\"level\":\"warning\",\"event\":\"corrupt\","
            "\"msg\":\"a\\\"b\\\\c\\nd\",\"module\":\"x\\u0001y\\u007f\"}");
}

TEST(LogTest, ParseLogFormat) {
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  absl::StatusOr<LogFormat> bad = ParseLogFormat("xml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "log format: got \"xml\", expected text or json");
}

TEST(LogTest, ConcurrentEventsAreWholeLines) {
  std::ostringstream out;
  SetLogStream(&out);
  SetLogFormat(LogFormat::kJson);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        LogEvent(LogLevel::kInfo, "tick", std::string(100, static_cast<char>('a' + t)), {{"i", i}});
      }
    });
  }
  for (std::thread& t : threads) t.join();
  SetLogStream(nullptr);
  SetLogFormat(LogFormat::kText);
  const std::vector<std::string> lines = absl::StrSplit(out.str(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1600u);
  for (const std::string& line : lines) {
    ASSERT_EQ(line.front(), '{') << line;
    ASSERT_EQ(line.back(), '}') << line;
    ASSERT_NE(line.find("\"event\":\"tick\""), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace kforge
