#include "base/shutdown_signals.h"

#include <signal.h>
#include <unistd.h>

#include <utility>

namespace kforge {

absl::StatusOr<std::unique_ptr<ShutdownSignals>> ShutdownSignals::Install(
    ShutdownSignalOptions options) {
  std::unique_ptr<ShutdownSignals> signals(new ShutdownSignals(std::move(options)));
  ShutdownSignals* raw = signals.get();
  absl::StatusOr<std::unique_ptr<SignalPipe>> pipe = SignalPipe::Install(
      {SIGTERM, SIGINT}, [raw](absl::Span<const int> signos) { raw->OnSignals(signos); });
  if (!pipe.ok()) return pipe.status();
  signals->pipe_ = *std::move(pipe);
  return signals;
}

ShutdownSignals::~ShutdownSignals() = default;

void ShutdownSignals::OnSignals(absl::Span<const int> signos) {
  for (const int signo : signos) {
    if (first_seen_) {
      const std::string& message = options_.second_message;
      [[maybe_unused]] ssize_t w = write(STDERR_FILENO, message.data(), message.size());
      _exit(options_.second_exit_code ? options_.second_exit_code(signo) : 1);
    }
    first_seen_ = true;
    signo_.store(signo);
    requested_.store(true);
    if (options_.on_first) options_.on_first(signo);
    first_.Notify();
  }
}

int ShutdownSignals::Wait() {
  first_.WaitForNotification();
  return signo_.load();
}

}  // namespace kforge
