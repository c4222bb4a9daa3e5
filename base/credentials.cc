#include "base/credentials.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/io.h"

namespace kforge {
namespace {

constexpr size_t kMinTokenChars = 16;
constexpr size_t kMaxTokenChars = 4096;

bool IsTokenChar(char c) { return c > ' ' && c < 0x7f; }

}  // namespace

absl::StatusOr<std::string> ReadCredentialFile(const std::string& path, const std::string& what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty path"));
  absl::StatusOr<std::string> text = ReadFile(path, kMaxCredentialFileBytes, Symlinks::kFollow);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat(what, ": ", text.status().message()));
  }
  if (text->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": the file is empty"));
  }
  return text;
}

absl::StatusOr<std::vector<std::string>> ParseTokens(const std::string& text,
                                                     const std::string& what) {
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    bool printable = true;
    for (char c : line) printable = printable && IsTokenChar(c);
    if (!printable || line.size() < kMinTokenChars || line.size() > kMaxTokenChars) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": line ", line_number, ": a token is ", kMinTokenChars, "..", kMaxTokenChars,
          " printable ASCII characters without spaces (e.g. `openssl rand -hex 32`)"));
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": no token (one per line; '#' starts a comment)"));
  }
  return tokens;
}

absl::StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& path,
                                                       const std::string& what) {
  absl::StatusOr<std::string> text = ReadCredentialFile(path, what);
  if (!text.ok()) return text.status();
  return ParseTokens(*text, absl::StrCat(what, " ", path));
}

}  // namespace kforge
