#include "cli/flags.h"

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kforge::cli {
namespace {

const FlagSpec* Find(const std::vector<FlagSpec>& specs, const std::string& name, char short_name) {
  for (const FlagSpec& s : specs) {
    if ((!name.empty() && (s.name == name || (!s.alias.empty() && s.alias == name))) ||
        (short_name != 0 && s.short_name == short_name)) {
      return &s;
    }
  }
  return nullptr;
}

}  // namespace

FlagSpec WithAlias(FlagSpec spec, std::string alias) {
  spec.alias = std::move(alias);
  return spec;
}

std::vector<FlagSpec> WithEnvironment(std::vector<FlagSpec> specs) {
  for (FlagSpec& spec : specs) {
    if (spec.hidden || spec.name == "help") continue;
    spec.env = "KFORGE_" + spec.name;
    for (char& c : spec.env)
      c = c == '-' ? '_' : absl::ascii_toupper(static_cast<unsigned char>(c));
  }
  return specs;
}

absl::StatusOr<ParsedArgs> ParseFlags(const std::vector<FlagSpec>& specs,
                                      const std::vector<std::string>& args) {
  ParsedArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 2 || a[0] != '-') {
      out.positional.push_back(a);
      continue;
    }
    std::string name;
    std::string value;
    bool has_value = false;
    const FlagSpec* spec = nullptr;
    if (a[1] == '-') {
      name = a.substr(2);
      const size_t eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      spec = Find(specs, name, 0);
    } else if (a.size() == 2) {
      spec = Find(specs, "", a[1]);
    }
    if (spec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a, " (see --help)"));
    }
    if (spec->value_name.empty()) {
      if (has_value) {
        return absl::InvalidArgumentError(absl::StrCat("--", spec->name, " takes no value"));
      }
      value = "true";
    } else if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", spec->name, " needs a value (", spec->value_name, ")"));
      }
      value = args[++i];
    }
    auto& slot = out.values[spec->name];
    if (!spec->repeated) slot.clear();
    slot.push_back(value);
  }
  for (const FlagSpec& s : specs) {
    if (s.env.empty() || out.Has(s.name)) continue;
    // An empty variable counts as unset, as a flag cannot be given empty.
    const char* value = std::getenv(s.env.c_str());
    if (value == nullptr || value[0] == '\0') continue;
    if (s.value_name.empty() && std::string_view(value) != "true" &&
        std::string_view(value) != "false") {
      return absl::InvalidArgumentError(
          absl::StrCat(s.env, " (for --", s.name, "): got '", value, "', expected true or false"));
    }
    if (!s.value_name.empty() || std::string_view(value) == "true") {
      out.values[s.name].push_back(value);
    }
  }
  for (const FlagSpec& s : specs) {
    if (!s.default_value.empty() && !out.Has(s.name)) {
      out.values[s.name].push_back(s.default_value);
    }
  }
  return out;
}

std::string FlagsHelp(const std::vector<FlagSpec>& specs) {
  std::string out;
  for (const FlagSpec& s : specs) {
    if (s.hidden) continue;
    std::string left = absl::StrCat("  --", s.name);
    if (s.short_name) left = absl::StrCat("  -", std::string(1, s.short_name), ", --", s.name);
    if (!s.value_name.empty()) absl::StrAppend(&left, " ", s.value_name);
    absl::StrAppendFormat(&out, "%-34s %s", left, s.help);
    if (!s.default_value.empty()) absl::StrAppend(&out, " (default ", s.default_value, ")");
    if (!s.alias.empty()) absl::StrAppend(&out, " (old spelling --", s.alias, " still accepted)");
    if (!s.env.empty()) absl::StrAppend(&out, " (env ", s.env, ")");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

absl::StatusOr<long long> ParseIntFlag(const std::string& name, const std::string& value) {
  long long v = 0;
  if (!absl::SimpleAtoi(value, &v) || v < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": got '", value, "', expected a non-negative integer"));
  }
  return v;
}

absl::StatusOr<long long> IntFlagInRange(const ParsedArgs& args, const std::string& name,
                                         long long min, long long max) {
  absl::StatusOr<long long> v = ParseIntFlag(name, args.Get(name));
  if (!v.ok()) return v.status();
  if (*v < min || *v > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, ": got ", *v, ", expected ",
        max == LLONG_MAX ? absl::StrCat("at least ", min) : absl::StrCat(min, "..", max)));
  }
  return v;
}

absl::StatusOr<uint64_t> SizeFlag(const ParsedArgs& args, const std::string& name) {
  const std::string value = args.Get(name);
  std::string_view number = value;
  for (std::string_view unit : {"iB", "B"}) {
    if (number.size() > unit.size() &&
        absl::EndsWith(absl::string_view(number.data(), number.size()),
                       absl::string_view(unit.data(), unit.size()))) {
      number.remove_suffix(unit.size());
      break;
    }
  }
  int shift = 0;
  if (!number.empty()) {
    switch (absl::ascii_toupper(static_cast<unsigned char>(number.back()))) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      case 'T':
        shift = 40;
        break;
      default:
        break;
    }
  }
  if (shift != 0) number.remove_suffix(1);
  uint64_t v = 0;
  if (number.empty() || number.find_first_not_of("0123456789") != std::string_view::npos ||
      !absl::SimpleAtoi(absl::string_view(number.data(), number.size()), &v) ||
      v > (UINT64_MAX >> shift)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, ": got '", value, "', expected bytes, or with K, M, G or T (e.g. 20G)"));
  }
  return v << shift;
}

std::string FormatSize(uint64_t bytes) {
  constexpr const char* kUnits[] = {"T", "G", "M", "K"};
  for (int i = 0; i < 4; ++i) {
    const int shift = 40 - 10 * i;
    if (bytes != 0 && bytes % (uint64_t{1} << shift) == 0) {
      return absl::StrCat(bytes >> shift, kUnits[i]);
    }
  }
  return absl::StrCat(bytes);
}

absl::StatusOr<absl::Duration> DurationFlag(const ParsedArgs& args, const std::string& name,
                                            absl::Duration min, absl::Duration max) {
  const std::string value = args.Get(name);
  absl::Duration d;
  double seconds = 0;
  const bool plain = !value.empty() &&
                     value.find_first_not_of("0123456789.") == std::string::npos &&
                     absl::SimpleAtod(value, &seconds);
  if (plain) d = absl::Seconds(seconds);
  if (!plain && !absl::ParseDuration(value, &d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": got '", value,
                     "', expected seconds or a duration (0.5s, 250ms, 2m, 1h30m)"));
  }
  if (d < min || d > max) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": got ", absl::FormatDuration(d),
                                                   ", expected ", absl::FormatDuration(min), "..",
                                                   absl::FormatDuration(max)));
  }
  return d;
}

int Fail(const absl::Status& s) {
  std::cerr << "kforge: " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace kforge::cli
