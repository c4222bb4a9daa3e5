// The CLI's flag parsing: sizes with suffixes, durations with fractions,
// and values from the environment.
#include "cli/flags.h"

#include <stdlib.h>

#include "gtest/gtest.h"

namespace kforge::cli {
namespace {

ParsedArgs One(const std::string& name, const std::string& value) {
  ParsedArgs args;
  args.values[name] = {value};
  return args;
}

TEST(FlagsTest, SizesTakeBinarySuffixes) {
  const std::pair<std::string, uint64_t> good[] = {{"0", 0},
                                                   {"1000", 1000},
                                                   {"64K", 64ull << 10},
                                                   {"512M", 512ull << 20},
                                                   {"20G", 20ull << 30},
                                                   {"20GiB", 20ull << 30},
                                                   {"2TB", 2ull << 40},
                                                   {"1g", 1ull << 30}};
  for (const auto& [text, bytes] : good) {
    absl::StatusOr<uint64_t> v = SizeFlag(One("disk-cache-bytes", text), "disk-cache-bytes");
    ASSERT_TRUE(v.ok()) << text << ": " << v.status();
    EXPECT_EQ(*v, bytes) << text;
    EXPECT_EQ(*SizeFlag(One("x", FormatSize(bytes)), "x"), bytes) << FormatSize(bytes);
  }
  EXPECT_EQ(FormatSize(1ull << 30), "1G");
  EXPECT_EQ(FormatSize(1536ull << 20), "1536M");
  for (const char* bad : {"", "G", "20X", "-1", "1.5G", "20 G", "99999999999T", "0x10"}) {
    absl::StatusOr<uint64_t> v = SizeFlag(One("disk-cache-bytes", bad), "disk-cache-bytes");
    EXPECT_TRUE(absl::IsInvalidArgument(v.status())) << bad;
    EXPECT_NE(v.status().message().find("--disk-cache-bytes: got '"), std::string::npos);
  }
}

TEST(FlagsTest, DurationsTakeFractionsAndUnits) {
  const std::pair<std::string, absl::Duration> good[] = {
      {"30", absl::Seconds(30)},         {"0.5", absl::Milliseconds(500)},
      {"0.5s", absl::Milliseconds(500)}, {"250ms", absl::Milliseconds(250)},
      {"2m", absl::Minutes(2)},          {"1h30m", absl::Minutes(90)}};
  for (const auto& [text, d] : good) {
    absl::StatusOr<absl::Duration> v =
        DurationFlag(One("t", text), "t", absl::ZeroDuration(), absl::Hours(2));
    ASSERT_TRUE(v.ok()) << text << ": " << v.status();
    EXPECT_EQ(*v, d) << text;
  }
  for (const char* bad : {"", "s", "1x", "-1s", "3h"}) {
    absl::StatusOr<absl::Duration> v =
        DurationFlag(One("t", bad), "t", absl::ZeroDuration(), absl::Hours(2));
    EXPECT_TRUE(absl::IsInvalidArgument(v.status())) << bad;
    EXPECT_NE(v.status().message().find("--t: got "), std::string::npos) << v.status();
  }
}

TEST(FlagsTest, EnvironmentStandsInForAnAbsentFlag) {
  const std::vector<FlagSpec> specs = WithEnvironment(
      {{"cache-dir", "DIR", "", "/default"}, {"verbose", "", ""}, {"help", "", ""}});
  EXPECT_EQ(specs[0].env, "KFORGE_CACHE_DIR");
  EXPECT_EQ(specs[2].env, "");
  setenv("KFORGE_CACHE_DIR", "/from/env", 1);
  setenv("KFORGE_VERBOSE", "true", 1);
  absl::StatusOr<ParsedArgs> args = ParseFlags(specs, {});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->Get("cache-dir"), "/from/env");
  EXPECT_TRUE(args->Has("verbose"));
  args = ParseFlags(specs, {"--cache-dir", "/from/flag"});
  ASSERT_TRUE(args.ok());
  EXPECT_EQ(args->Get("cache-dir"), "/from/flag");
  setenv("KFORGE_VERBOSE", "yes", 1);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseFlags(specs, {}).status()));
  unsetenv("KFORGE_CACHE_DIR");
  unsetenv("KFORGE_VERBOSE");
  args = ParseFlags(specs, {});
  ASSERT_TRUE(args.ok());
  EXPECT_EQ(args->Get("cache-dir"), "/default");
  EXPECT_FALSE(args->Has("verbose"));
}

}  // namespace
}  // namespace kforge::cli
