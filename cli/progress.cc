#include "cli/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace kforge::cli {
namespace {

constexpr int kBarCells = 20;
// Clears from the cursor to the end of the line (ECMA-48 "EL"), so a
// shorter status line leaves nothing of a longer one behind.
constexpr char kClearToEol[] = "\x1b[K";

absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

absl::string_view FirstLine(std::string_view text) {
  return AsAbsl(text.substr(0, text.find('\n')));
}

}  // namespace

std::string FormatClock(absl::Duration d) {
  const int64_t total = absl::ToInt64Seconds(d < absl::ZeroDuration() ? absl::ZeroDuration() : d);
  const int64_t h = total / 3600, m = total / 60 % 60, s = total % 60;
  if (h > 0) return absl::StrFormat("%d:%02d:%02d", h, m, s);
  return absl::StrFormat("%d:%02d", m, s);
}

ProgressOptions StderrProgressOptions() {
  ProgressOptions options;
  options.out = &std::cerr;
  options.tty = isatty(STDERR_FILENO) == 1;
  winsize size{};
  if (options.tty && ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    options.width = size.ws_col;
  }
  return options;
}

Progress::Progress(ProgressOptions options) : options_(std::move(options)) {}

void Progress::Start(size_t total) {
  absl::MutexLock lock(&mu_);
  start_ = options_.now();
  summary_ = ProgressSummary();
  summary_.total = total;
  if (options_.tty) DrawStatusLine("");
}

void Progress::Done(std::string_view label, bool ok, double seconds, std::string_view error) {
  absl::MutexLock lock(&mu_);
  ++summary_.done;
  if (!ok) summary_.failures.push_back({std::string(label), std::string(error)});
  if (!options_.tty) {
    PrintItemLine(label, ok, seconds, error);
    return;
  }
  // A failure stays on screen as a line of its own; successes only move
  // the status line.
  if (!ok) {
    *options_.out << "\r" << kClearToEol << "FAIL " << AsAbsl(label) << ": " << FirstLine(error)
                  << "\n";
  }
  DrawStatusLine(label);
}

void Progress::PrintItemLine(std::string_view label, bool ok, double seconds,
                             std::string_view error) {
  const int digits = static_cast<int>(absl::StrCat(summary_.total).size());
  *options_.out << absl::StrFormat("[%*d/%d] %-4s %7.2fs %s", digits, summary_.done, summary_.total,
                                   ok ? "ok" : "FAIL", seconds, AsAbsl(label));
  if (!ok) *options_.out << ": " << FirstLine(error);
  *options_.out << "\n" << std::flush;
}

void Progress::DrawStatusLine(std::string_view label) {
  const absl::Duration elapsed = options_.now() - start_;
  const size_t total = summary_.total;
  const size_t done = summary_.done;
  const int filled =
      total == 0 ? kBarCells : static_cast<int>(std::min(done, total) * kBarCells / total);
  std::string line = absl::StrCat("[", std::string(filled, '#'),
                                  std::string(kBarCells - filled, '-'), "] ", done, "/", total);
  if (!summary_.failures.empty()) {
    absl::StrAppend(&line, "  ", summary_.failures.size(), " failed");
  }
  absl::StrAppend(&line, "  ", FormatClock(elapsed));
  if (done == 0) {
    absl::StrAppend(&line, "  ETA --:--");
  } else if (done < total) {
    // Mean time per finished item times the items left.
    const absl::Duration eta =
        elapsed / static_cast<double>(done) * static_cast<double>(total - done);
    absl::StrAppend(&line, "  ETA ", FormatClock(eta));
  }
  if (!label.empty()) absl::StrAppend(&line, "  ", AsAbsl(label));
  // One column short of the width: writing the last column makes some
  // terminals wrap, and "\r" would then redraw only the wrapped part.
  const size_t fit = options_.width > 1 ? options_.width - 1 : 1;
  if (line.size() > fit) line.resize(fit);
  *options_.out << "\r" << line << kClearToEol << std::flush;
  status_line_shown_ = true;
}

ProgressSummary Progress::Finish() {
  absl::MutexLock lock(&mu_);
  summary_.elapsed = options_.now() - start_;
  std::ostream& out = *options_.out;
  if (status_line_shown_) {
    DrawStatusLine("");
    out << "\n";
    status_line_shown_ = false;
  }
  out << absl::StrFormat("%d/%d done in %s, %d failed\n", summary_.done, summary_.total,
                         FormatClock(summary_.elapsed), summary_.failures.size());
  for (const ProgressFailure& f : summary_.failures) {
    // The whole error (an NVRTC log has its root cause first), indented
    // under the item it belongs to.
    out << "  FAIL " << f.label << ":\n    " << absl::StrReplaceAll(f.error, {{"\n", "\n    "}})
        << "\n";
  }
  out << std::flush;
  return summary_;
}

}  // namespace kforge::cli
