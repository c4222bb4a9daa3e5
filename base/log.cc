#include "base/log.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/absl_compat.h"

namespace kforge {
namespace {

struct Settings {
  absl::Mutex mu;
  LogFormat format = LogFormat::kText;
  std::ostream* stream = nullptr;  // null: stdout for info, stderr for the rest
};

Settings& Global() {
  static Settings* settings = new Settings;  // never destroyed: logs run at exit
  return *settings;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

// A JSON string literal: quotes, backslashes and control characters escaped;
// other bytes as they are (kforge's own text is UTF-8 or ASCII).
void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

// A text field value: as it is when it is one plain word, else quoted
// with the JSON escapes (so a line stays one line whatever the value).
void AppendTextValue(std::string* out, std::string_view s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isgraph(static_cast<unsigned char>(c)) && c != '"' && c != ']';
  });
  if (plain) {
    out->append(s);
  } else {
    AppendJsonString(out, s);
  }
}

}  // namespace

absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(absl::StrCat(
      "log format: got \"", absl::CHexEscape(AsAbsl(name)), "\", expected text or json"));
}

LogField::LogField(std::string_view name, double number)
    : name(name), text(absl::StrFormat("%.6g", number)), number(true) {}
LogField::LogField(std::string_view name, long long number)
    : name(name), text(absl::StrCat(number)), number(true) {}
LogField::LogField(std::string_view name, absl::Duration d)
    : name(absl::StrCat(AsAbsl(name), "_s")),
      text(absl::StrFormat("%.6g", absl::ToDoubleSeconds(d))),
      number(true) {}

void SetLogFormat(LogFormat format) {
  Settings& s = Global();
  absl::MutexLock lock(&s.mu);
  s.format = format;
}

void SetLogStream(std::ostream* stream) {
  Settings& s = Global();
  absl::MutexLock lock(&s.mu);
  s.stream = stream;
}

std::string FormatLogLine(LogFormat format, absl::Time now, LogLevel level, std::string_view event,
                          std::string_view message, std::initializer_list<LogField> fields) {
  std::string line;
  if (format == LogFormat::kJson) {
    const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", now, absl::UTCTimeZone());
    absl::StrAppend(&line, "{\"ts\":\"", ts, "\",\"level\":\"", LevelName(level), "\",\"event\":");
    AppendJsonString(&line, event);
    if (!message.empty()) {
      line.append(",\"msg\":");
      AppendJsonString(&line, message);
    }
    for (const LogField& f : fields) {
      line.push_back(',');
      AppendJsonString(&line, f.name);
      line.push_back(':');
      if (f.number) {
        line.append(f.text);
      } else {
        AppendJsonString(&line, f.text);
      }
    }
    line.push_back('}');
    return line;
  }
  line = "kforge:";
  // The message is kept on one line: its newlines become spaces.
  if (!message.empty()) {
    line.push_back(' ');
    for (char c : message) line.push_back(c == '\n' || c == '\r' ? ' ' : c);
  } else {
    absl::StrAppend(&line, " ", AsAbsl(event));
  }
  if (fields.size() > 0) {
    line.append(" [");
    bool first = true;
    for (const LogField& f : fields) {
      if (!first) line.push_back(' ');
      first = false;
      absl::StrAppend(&line, f.name, "=");
      AppendTextValue(&line, f.text);
    }
    line.push_back(']');
  }
  return line;
}

void LogEvent(LogLevel level, std::string_view event, std::string_view message,
              std::initializer_list<LogField> fields) {
  Settings& s = Global();
  LogFormat format;
  {
    absl::MutexLock lock(&s.mu);
    format = s.format;
  }
  std::string line = FormatLogLine(format, absl::Now(), level, event, message, fields);
  line.push_back('\n');
  absl::MutexLock lock(&s.mu);
  std::ostream* out = s.stream;
  if (out == nullptr) out = level == LogLevel::kInfo ? &std::cout : &std::cerr;
  out->write(line.data(), static_cast<std::streamsize>(line.size()));
  out->flush();
}

}  // namespace kforge
