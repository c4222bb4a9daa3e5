#ifndef KFORGE_CLI_FLAGS_H_
#define KFORGE_CLI_FLAGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kforge::cli {

// One flag a subcommand accepts.
struct FlagSpec {
  FlagSpec(std::string name, std::string value_name, std::string help,
           std::string default_value = "", char short_name = 0, bool repeated = false,
           bool hidden = false)
      : name(std::move(name)),
        value_name(std::move(value_name)),
        help(std::move(help)),
        default_value(std::move(default_value)),
        short_name(short_name),
        repeated(repeated),
        hidden(hidden) {}
  std::string name;        // without dashes, e.g. "arch"
  std::string value_name;  // empty for a boolean switch
  std::string help;
  std::string default_value;  // shown in help; applied when absent
  char short_name = 0;        // e.g. 'o' for -o
  bool repeated = false;      // may be given several times
  bool hidden = false;        // left out of the help (test hooks)
  // An older spelling still accepted (stored under `name`, noted in help),
  // kept for one release after a rename so scripts keep working.
  std::string alias;
  // An environment variable that gives the value when the flag is absent
  // (before the default), e.g. KFORGE_SERVER; "" = none.
  std::string env;
};

// `spec` with `alias` as its deprecated second spelling.
FlagSpec WithAlias(FlagSpec spec, std::string alias);

// Every visible flag of `specs` but --help also read from KFORGE_<NAME>
// (upper case, '-' as '_': --cache-dir from KFORGE_CACHE_DIR), for
// commands run as services (containers, systemd units).
std::vector<FlagSpec> WithEnvironment(std::vector<FlagSpec> specs);

struct ParsedArgs {
  std::map<std::string, std::vector<std::string>> values;
  std::vector<std::string> positional;
  bool Has(const std::string& name) const { return values.count(name) > 0; }
  std::string Get(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() || it->second.empty() ? "" : it->second.back();
  }
  std::vector<std::string> GetAll(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? std::vector<std::string>{} : it->second;
  }
};

// Parses `--name value`, `--name=value`, `-o value` and boolean `--name`.
// Unknown flags and missing values are InvalidArgument naming the flag.
absl::StatusOr<ParsedArgs> ParseFlags(const std::vector<FlagSpec>& specs,
                                      const std::vector<std::string>& args);

// Help text for a subcommand's flags.
std::string FlagsHelp(const std::vector<FlagSpec>& specs);

// Parses a non-negative integer flag value, naming the flag on error.
absl::StatusOr<long long> ParseIntFlag(const std::string& name, const std::string& value);

// The value of integer flag `name` in args, which must lie in [min, max];
// InvalidArgument naming the flag, the value and the range otherwise.
absl::StatusOr<long long> IntFlagInRange(const ParsedArgs& args, const std::string& name,
                                         long long min, long long max);

// The byte size of flag `name`: a number of bytes or one with a binary
// suffix K, M, G or T (optionally followed by "B" or "iB"): "20G" is
// 20 * 2^30. InvalidArgument naming the flag otherwise.
absl::StatusOr<uint64_t> SizeFlag(const ParsedArgs& args, const std::string& name);
// `bytes` as SizeFlag reads it, with the largest suffix that is exact
// ("1G", "1536M", "1000").
std::string FormatSize(uint64_t bytes);

// The duration of flag `name`: plain seconds ("30", "0.5") or with units
// ("0.5s", "250ms", "2m", "1h30m"), within [min, max]; InvalidArgument
// naming the flag, the value and the range otherwise.
absl::StatusOr<absl::Duration> DurationFlag(const ParsedArgs& args, const std::string& name,
                                            absl::Duration min, absl::Duration max);

// Prints "kforge: <message>" to stderr and returns the exit code: 2 for bad
// input (InvalidArgument), 1 for anything else.
int Fail(const absl::Status& s);

}  // namespace kforge::cli

#endif  // KFORGE_CLI_FLAGS_H_
