#ifndef KFORGE_BASE_SIGNAL_PIPE_H_
#define KFORGE_BASE_SIGNAL_PIPE_H_

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kforge {

// Signals turned into calls on an ordinary thread, the self-pipe scheme of
// ShutdownSignals and ReloadSignal: the handler only write(2)s the signal's
// number into a pipe, and a watcher thread reads the pipe and calls
// `on_signals` with the numbers it read at once, in order (several signals
// that came while it was busy arrive together). Nothing else runs in signal
// context. A signal belongs to one SignalPipe at a time; the destructor
// restores the signals' default dispositions, stops the watcher and joins it.
class SignalPipe {
 public:
  using Handler = std::function<void(absl::Span<const int> signos)>;

  // FailedPrecondition when one of `signos` already has a SignalPipe.
  static absl::StatusOr<std::unique_ptr<SignalPipe>> Install(std::vector<int> signos,
                                                             Handler on_signals);
  ~SignalPipe();

  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

 private:
  SignalPipe(std::vector<int> signos, Handler on_signals, int read_fd, int write_fd);
  void Watch();

  const std::vector<int> signos_;
  const Handler on_signals_;
  const int read_fd_;
  const int write_fd_;
  std::thread watcher_;
};

}  // namespace kforge

#endif  // KFORGE_BASE_SIGNAL_PIPE_H_
