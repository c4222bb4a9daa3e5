#ifndef KFORGE_CLI_PROGRESS_H_
#define KFORGE_CLI_PROGRESS_H_

#include <cstddef>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kforge::cli {

struct ProgressOptions {
  std::ostream* out = nullptr;  // where lines go; not owned, never null
  // A terminal gets one status line redrawn in place; anything else (a log
  // file, CI) gets one plain line per finished item.
  bool tty = false;
  int width = 80;  // terminal columns: the live line is cut to fit
  std::function<absl::Time()> now = [] { return absl::Now(); };
};

// Options for std::cerr: tty when stderr is a terminal, width from it.
ProgressOptions StderrProgressOptions();

struct ProgressFailure {
  std::string label;
  std::string error;
};

struct ProgressSummary {
  size_t total = 0;
  size_t done = 0;                        // finished, failed ones included
  std::vector<ProgressFailure> failures;  // in the order they finished
  absl::Duration elapsed;
};

// Reports a batch of items (kernels to build) as they finish:
//
//   tty:     [##########----------] 12/400  1 failed  0:41  ETA 22:10  glm-5 tp8 ...
//   not tty: [ 12/400] ok     0.61s glm-5 tp8 sq2 bf16 sm_90a
//            [ 13/400] FAIL   1.20s glm-5 tp8 sq2 bf16 sm_120a: <first line>
//
// A failure is also printed as a line of its own on a terminal, above the
// status line. The ETA assumes the remaining items take the mean time of
// the finished ones. Thread-safe: workers call Done concurrently.
class Progress {
 public:
  explicit Progress(ProgressOptions options);

  void Start(size_t total);
  // `seconds` is the item's own time; `error` says why it failed.
  void Done(std::string_view label, bool ok, double seconds, std::string_view error = {});
  // Ends the status line and prints the summary: counts, elapsed time and
  // every failure with its whole error.
  ProgressSummary Finish();

 private:
  void PrintItemLine(std::string_view label, bool ok, double seconds, std::string_view error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DrawStatusLine(std::string_view label) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ProgressOptions options_;
  absl::Mutex mu_;
  absl::Time start_ ABSL_GUARDED_BY(mu_);
  ProgressSummary summary_ ABSL_GUARDED_BY(mu_);
  bool status_line_shown_ ABSL_GUARDED_BY(mu_) = false;
};

// "0:41", "12:03", "1:02:09".
std::string FormatClock(absl::Duration d);

}  // namespace kforge::cli

#endif  // KFORGE_CLI_PROGRESS_H_
