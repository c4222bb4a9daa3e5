#include "model/arch.h"

#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kforge {
namespace {

using ::kforge::testing::Contains;

struct ArchCase {
  std::string input;
  std::string name;
  int major;
  int minor;
  bool arch_specific;
  int smem;
};

// Stable test names for ctest (the default prints raw bytes, pointers too).
void PrintTo(const ArchCase& c, std::ostream* os) { *os << '"' << c.input << '"'; }

class ParseArchTest : public ::testing::TestWithParam<ArchCase> {};

TEST_P(ParseArchTest, ParsesToCanonical) {
  const ArchCase& c = GetParam();
  absl::StatusOr<Arch> arch = ParseArch(c.input);
  ASSERT_TRUE(arch.ok()) << arch.status();
  EXPECT_EQ(arch->name, c.name);
  EXPECT_EQ(arch->major, c.major);
  EXPECT_EQ(arch->minor, c.minor);
  EXPECT_EQ(arch->arch_specific, c.arch_specific);
  EXPECT_EQ(arch->max_smem_per_block, c.smem);
  EXPECT_EQ(arch->sm_version(), c.major * 10 + c.minor);
}

INSTANTIATE_TEST_SUITE_P(Forms, ParseArchTest,
                         ::testing::Values(ArchCase{"sm_80", "sm_80", 8, 0, false, 166912},
                                           ArchCase{"80", "sm_80", 8, 0, false, 166912},
                                           ArchCase{"sm_86", "sm_86", 8, 6, false, 101376},
                                           ArchCase{"sm_89", "sm_89", 8, 9, false, 101376},
                                           ArchCase{"sm_90a", "sm_90a", 9, 0, true, 232448},
                                           ArchCase{"90a", "sm_90a", 9, 0, true, 232448},
                                           ArchCase{"SM_90A", "sm_90a", 9, 0, true, 232448},
                                           ArchCase{"Sm_90a", "sm_90a", 9, 0, true, 232448},
                                           ArchCase{" sm_90a\n", "sm_90a", 9, 0, true, 232448},
                                           ArchCase{"sm_90", "sm_90", 9, 0, false, 232448},
                                           ArchCase{"90", "sm_90", 9, 0, false, 232448},
                                           ArchCase{"sm_100a", "sm_100a", 10, 0, true, 232448},
                                           ArchCase{"100A", "sm_100a", 10, 0, true, 232448},
                                           ArchCase{"sm_100", "sm_100", 10, 0, false, 232448},
                                           ArchCase{"sm_103a", "sm_103a", 10, 3, true, 232448},
                                           ArchCase{"sm_103", "sm_103", 10, 3, false, 232448},
                                           ArchCase{"sm_120a", "sm_120a", 12, 0, true, 101376},
                                           ArchCase{"120a", "sm_120a", 12, 0, true, 101376},
                                           ArchCase{"sm_120", "sm_120", 12, 0, false, 101376},
                                           ArchCase{"sm_121a", "sm_121a", 12, 1, true, 101376},
                                           ArchCase{"sm_121", "sm_121", 12, 1, false, 101376}),
                         [](const ::testing::TestParamInfo<ArchCase>& info) {
                           std::string name = absl::StrCat(info.index, "_", info.param.input);
                           for (char& c : name) {
                             if (!absl::ascii_isalnum(c)) c = '_';
                           }
                           return name;
                         });

TEST(ArchTest, SupportedArchsAreCanonicalSortedAndUnique) {
  const std::vector<Arch>& archs = SupportedArchs();
  ASSERT_EQ(archs.size(), 13u);
  std::set<std::string> names;
  for (size_t i = 0; i < archs.size(); ++i) {
    const Arch& arch = archs[i];
    EXPECT_TRUE(names.insert(arch.name).second) << arch.name;
    // Each supported name parses back to itself.
    absl::StatusOr<Arch> parsed = ParseArch(arch.name);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->name, arch.name);
    EXPECT_GT(arch.max_smem_per_block, 0);
    if (i > 0) {
      const Arch& prev = archs[i - 1];
      EXPECT_TRUE(
          prev.sm_version() < arch.sm_version() ||
          (prev.sm_version() == arch.sm_version() && !prev.arch_specific && arch.arch_specific))
          << prev.name << " before " << arch.name;
    }
  }
}

TEST(ArchTest, SmemLimits) {
  EXPECT_EQ(ParseArch("sm_80")->max_smem_per_block, 163 * 1024);
  EXPECT_EQ(ParseArch("sm_86")->max_smem_per_block, 99 * 1024);
  EXPECT_EQ(ParseArch("sm_89")->max_smem_per_block, 99 * 1024);
  EXPECT_EQ(ParseArch("sm_90a")->max_smem_per_block, 227 * 1024);
  EXPECT_EQ(ParseArch("sm_100a")->max_smem_per_block, 227 * 1024);
  EXPECT_EQ(ParseArch("sm_120a")->max_smem_per_block, 99 * 1024);
  EXPECT_EQ(ParseArch("sm_121a")->max_smem_per_block, 99 * 1024);
}

class UnknownArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UnknownArchTest, FailedPreconditionNamesInputAndSupported) {
  absl::StatusOr<Arch> arch = ParseArch(GetParam());
  ASSERT_FALSE(arch.ok());
  EXPECT_EQ(arch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(arch.status().message(), absl::StrCat("\"", GetParam(), "\"")));
  EXPECT_TRUE(Contains(arch.status().message(), "sm_80"));
  EXPECT_TRUE(Contains(arch.status().message(), "sm_90a"));
  EXPECT_TRUE(Contains(arch.status().message(), "sm_121a"));
}

INSTANTIATE_TEST_SUITE_P(Bad, UnknownArchTest,
                         ::testing::Values("", "sm_75", "sm_70", "sm_80a", "sm_89a", "sm_110a",
                                           "sm_", "a", "compute_90a", "sm90a", "sm_9 0a", "sm_90aa",
                                           "hopper"));

}  // namespace
}  // namespace kforge
