#ifndef KFORGE_BASE_SHUTDOWN_SIGNALS_H_
#define KFORGE_BASE_SHUTDOWN_SIGNALS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/types/span.h"
#include "base/signal_pipe.h"

namespace kforge {

struct ShutdownSignalOptions {
  // Runs on the watcher thread (not in signal context) at the first SIGINT
  // or SIGTERM, before Wait returns. May be empty.
  std::function<void(int signo)> on_first;
  // The second signal means "now": this goes to stderr and the process
  // _exits with second_exit_code(signo), waiting for nothing.
  std::string second_message = "kforge: second signal, exiting now\n";
  std::function<int(int signo)> second_exit_code = [](int) { return 1; };
};

// SIGINT and SIGTERM turned into a notification, the one scheme of every
// long-running command (`kforge serve`, `kforge prebuild`), through a
// SignalPipe: nothing but write(2) runs in signal context, the rest on the
// pipe's watcher thread. One instance per process at a time; its destructor
// restores the default dispositions.
class ShutdownSignals {
 public:
  static absl::StatusOr<std::unique_ptr<ShutdownSignals>> Install(
      ShutdownSignalOptions options = {});
  ~ShutdownSignals();

  // Blocks until the first signal; returns its number.
  int Wait();
  // The first signal's number, 0 until one came.
  int received() const { return signo_.load(); }
  // True from the first signal on (for loops that poll a stop flag).
  const std::atomic<bool>& requested() const { return requested_; }

 private:
  explicit ShutdownSignals(ShutdownSignalOptions options) : options_(std::move(options)) {}
  // On the pipe's watcher thread.
  void OnSignals(absl::Span<const int> signos);

  const ShutdownSignalOptions options_;
  bool first_seen_ = false;  // the watcher thread's own
  std::atomic<int> signo_{0};
  std::atomic<bool> requested_{false};
  absl::Notification first_;
  // Last: destroyed (its watcher joined) before what OnSignals uses.
  std::unique_ptr<SignalPipe> pipe_;
};

}  // namespace kforge

#endif  // KFORGE_BASE_SHUTDOWN_SIGNALS_H_
