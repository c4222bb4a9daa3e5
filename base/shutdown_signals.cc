#include "base/shutdown_signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kforge {
namespace {

// The pipe the handler writes to; -1 while no ShutdownSignals is installed.
std::atomic<int> g_signal_pipe{-1};
static_assert(std::atomic<int>::is_always_lock_free, "used from a signal handler");

// Byte the destructor writes to stop the watcher; no signal has number 0.
constexpr unsigned char kQuit = 0;

extern "C" void OnShutdownSignal(int signo) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signo);
  // Nothing useful to do if the pipe is full: a signal is already pending.
  [[maybe_unused]] ssize_t n = write(g_signal_pipe.load(), &byte, 1);
  errno = saved_errno;
}

void RestoreDefaults() {
  struct sigaction action = {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  for (int signo : {SIGTERM, SIGINT}) sigaction(signo, &action, nullptr);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShutdownSignals>> ShutdownSignals::Install(
    ShutdownSignalOptions options) {
  if (g_signal_pipe.load() >= 0) {
    return absl::FailedPreconditionError("shutdown signal handlers are already installed");
  }
  int fds[2];
  // O_CLOEXEC: child processes (compile workers) must not inherit the pipe.
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  // Only the handler's end must never block; the watcher's read blocks.
  fcntl(fds[1], F_SETFL, O_NONBLOCK);
  g_signal_pipe.store(fds[1]);
  std::unique_ptr<ShutdownSignals> signals(new ShutdownSignals(std::move(options), fds[0], fds[1]));
  struct sigaction action = {};
  action.sa_handler = OnShutdownSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signo : {SIGTERM, SIGINT}) {
    if (sigaction(signo, &action, nullptr) != 0) {
      return absl::InternalError(absl::StrCat("sigaction: ", std::strerror(errno)));
    }
  }
  return signals;
}

ShutdownSignals::ShutdownSignals(ShutdownSignalOptions options, int read_fd, int write_fd)
    : options_(std::move(options)),
      read_fd_(read_fd),
      write_fd_(write_fd),
      watcher_([this] { Watch(); }) {}

ShutdownSignals::~ShutdownSignals() {
  RestoreDefaults();
  // The handler may still be running on another thread: it has loaded the
  // descriptor already, which stays open until the watcher has gone.
  g_signal_pipe.store(-1);
  const unsigned char quit = kQuit;
  while (write(write_fd_, &quit, 1) < 0 && errno == EINTR) {
  }
  watcher_.join();
  close(read_fd_);
  close(write_fd_);
}

void ShutdownSignals::Watch() {
  bool first = true;
  for (;;) {
    unsigned char byte = 0;
    const ssize_t n = read(read_fd_, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1 || byte == kQuit) {
      // Stopped by the destructor. A broken pipe cannot happen while we
      // hold both ends; if it did, say so by waking Wait as for SIGTERM.
      if (n != 1 && first) {
        signo_.store(SIGTERM);
        requested_.store(true);
        first_.Notify();
      }
      return;
    }
    const int signo = byte;
    if (!first) {
      const std::string& message = options_.second_message;
      [[maybe_unused]] ssize_t w = write(STDERR_FILENO, message.data(), message.size());
      _exit(options_.second_exit_code ? options_.second_exit_code(signo) : 1);
    }
    first = false;
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
