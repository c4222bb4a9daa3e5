#include "base/json_keys.h"

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kforge {
namespace {

struct Frame {
  bool object = false;
  bool expect_key = false;
  std::set<std::string> keys;
};

// The string starting at json[*i] == '"', unescaped as far as keys need it
// (\uXXXX below 0x80 becomes its character; other escapes stay as written).
// Leaves *i on the closing quote (or at the end of malformed input).
std::string ReadString(std::string_view json, size_t* i) {
  std::string out;
  for (++*i; *i < json.size() && json[*i] != '"'; ++*i) {
    if (json[*i] != '\\' || *i + 1 >= json.size()) {
      out.push_back(json[*i]);
      continue;
    }
    const char e = json[++*i];
    if (e == 'u' && *i + 4 < json.size()) {
      const std::string hex(json.substr(*i + 1, 4));
      const unsigned long code = std::strtoul(hex.c_str(), nullptr, 16);
      if (code > 0 && code < 0x80) {
        out.push_back(static_cast<char>(code));
        *i += 4;
        continue;
      }
    }
    out.push_back('\\');
    out.push_back(e);
  }
  return out;
}

std::string Canonical(const std::string& key, bool proto_names) {
  if (!proto_names) return key;
  std::string out;
  for (char c : key) {
    if (c != '_') out.push_back(absl::ascii_tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

}  // namespace

absl::Status CheckNoDuplicateJsonKeys(std::string_view json, bool proto_names) {
  std::vector<Frame> stack;
  int line = 1;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    switch (c) {
      case '\n':
        ++line;
        break;
      case '"': {
        const int key_line = line;
        const std::string s = ReadString(json, &i);
        if (!stack.empty() && stack.back().object && stack.back().expect_key) {
          stack.back().expect_key = false;
          if (!stack.back().keys.insert(Canonical(s, proto_names)).second) {
            return absl::InvalidArgumentError(
                absl::StrCat("line ", key_line, ": key \"", s,
                             "\" is given twice in one object (JSON parsers would silently "
                             "take the last)"));
          }
        }
        break;
      }
      case '{':
        stack.push_back({true, true, {}});
        break;
      case '[':
        stack.push_back({false, false, {}});
        break;
      case '}':
      case ']':
        if (!stack.empty()) stack.pop_back();
        break;
      case ',':
        if (!stack.empty() && stack.back().object) stack.back().expect_key = true;
        break;
      default:
        break;
    }
  }
  return absl::OkStatus();
}

}  // namespace kforge
