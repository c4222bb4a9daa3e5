#ifndef KFORGE_BASE_LOG_H_
#define KFORGE_BASE_LOG_H_

// The server's log: one line per event, as text (the default, for people:
// the lines kforge has always printed, with the event's fields after them)
// or JSON (one object per line, for log pipelines: a UTC timestamp, the
// level, the event name, the message and the fields), chosen once at
// start-up (`kforge serve --log-format`). Lines are written whole (one
// write under a lock), so concurrent events never interleave. Info goes to
// stdout, warnings and errors to stderr (as before), unless a stream is set.
//
//   text: kforge: compiled sparse_mla_decode_h8_.. in 1.2 s [key=ab12..
//         module=sparse_mla_decode_h8_.. duration_s=1.2]   (one line)
//   json: {"ts":"2026-12-01T07:50:00.123Z","level":"info","event":"compile",
//          "msg":"compiled ...","key":"ab12..","duration_s":1.2}

#include <initializer_list>
#include <ostream>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kforge {

enum class LogFormat { kText, kJson };
enum class LogLevel { kInfo, kWarning, kError };

// "text" or "json"; InvalidArgument naming both otherwise.
absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name);

// One field of an event: a string, or a number (JSON number, no quotes).
struct LogField {
  LogField(std::string_view name, std::string_view text) : name(name), text(text) {}
  LogField(std::string_view name, const char* text) : name(name), text(text) {}
  LogField(std::string_view name, const std::string& text) : name(name), text(text) {}
  LogField(std::string_view name, double number);
  LogField(std::string_view name, long long number);
  LogField(std::string_view name, int number) : LogField(name, static_cast<long long>(number)) {}
  LogField(std::string_view name, absl::Duration d);  // as "<name>_s" seconds
  std::string name;
  std::string text;
  bool number = false;
};

// Process-wide settings: the format (text until set) and the stream (until
// set: stdout for info, stderr for the rest; tests point it elsewhere;
// nullptr goes back to the split). Set them before any thread logs.
void SetLogFormat(LogFormat format);
void SetLogStream(std::ostream* stream);

// Writes one event line. `message` is what a person reads (text: after the
// event name; json: "msg"); fields follow in the order given.
void LogEvent(LogLevel level, std::string_view event, std::string_view message,
              std::initializer_list<LogField> fields = {});

// The line LogEvent writes, at `now`, without the newline (tests).
std::string FormatLogLine(LogFormat format, absl::Time now, LogLevel level, std::string_view event,
                          std::string_view message, std::initializer_list<LogField> fields);

}  // namespace kforge

#endif  // KFORGE_BASE_LOG_H_
