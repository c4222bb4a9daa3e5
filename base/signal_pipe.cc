#include "base/signal_pipe.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kforge {
namespace {

// For each signal number, the write end of its SignalPipe plus one; 0 while
// none is installed (zero-initialized, so no constructor runs before a
// handler may read it).
std::atomic<int> g_pipe_plus_one[NSIG];
static_assert(std::atomic<int>::is_always_lock_free, "used from a signal handler");

// The byte the destructor writes to stop the watcher; no signal has number 0.
constexpr unsigned char kQuit = 0;

extern "C" void OnSignal(int signo) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signo);
  // A full pipe already holds pending signals: nothing useful to do.
  [[maybe_unused]] ssize_t n = write(g_pipe_plus_one[signo].load() - 1, &byte, 1);
  errno = saved_errno;
}

absl::Status SetDisposition(const std::vector<int>& signos, void (*handler)(int)) {
  struct sigaction action = {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signo : signos) {
    if (sigaction(signo, &action, nullptr) != 0) {
      return absl::InternalError(
          absl::StrCat("sigaction(", strsignal(signo), "): ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SignalPipe>> SignalPipe::Install(std::vector<int> signos,
                                                                Handler on_signals) {
  for (int signo : signos) {
    // A byte carries the number; 0 is the quit byte.
    if (signo <= 0 || signo >= NSIG || signo > 255) {
      return absl::InvalidArgumentError(absl::StrCat("signal ", signo, " out of range"));
    }
    if (g_pipe_plus_one[signo].load() != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a handler for signal ", signo, " (", strsignal(signo), ") is already installed"));
    }
  }
  int fds[2];
  // O_CLOEXEC: child processes (compile workers) must not inherit the pipe.
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  // Only the handler's end must never block; the watcher's read blocks.
  fcntl(fds[1], F_SETFL, O_NONBLOCK);
  for (int signo : signos) g_pipe_plus_one[signo].store(fds[1] + 1);
  std::unique_ptr<SignalPipe> pipe(
      new SignalPipe(std::move(signos), std::move(on_signals), fds[0], fds[1]));
  if (absl::Status s = SetDisposition(pipe->signos_, OnSignal); !s.ok()) return s;
  return pipe;
}

SignalPipe::SignalPipe(std::vector<int> signos, Handler on_signals, int read_fd, int write_fd)
    : signos_(std::move(signos)),
      on_signals_(std::move(on_signals)),
      read_fd_(read_fd),
      write_fd_(write_fd),
      watcher_([this] { Watch(); }) {}

SignalPipe::~SignalPipe() {
  (void)SetDisposition(signos_, SIG_DFL);
  // A handler may still be running on another thread: it has loaded the
  // descriptor already, which stays open until the watcher has gone.
  for (int signo : signos_) g_pipe_plus_one[signo].store(0);
  const unsigned char quit = kQuit;
  while (write(write_fd_, &quit, 1) < 0 && errno == EINTR) {
  }
  watcher_.join();
  close(read_fd_);
  close(write_fd_);
}

void SignalPipe::Watch() {
  for (;;) {
    unsigned char bytes[64];
    const ssize_t n = read(read_fd_, bytes, sizeof bytes);
    if (n < 0 && errno == EINTR) continue;
    // A broken pipe cannot happen while this object holds both ends.
    if (n <= 0) return;
    std::vector<int> signos;
    for (ssize_t i = 0; i < n; ++i) {
      if (bytes[i] == kQuit) break;
      signos.push_back(bytes[i]);
    }
    if (!signos.empty() && on_signals_) on_signals_(signos);
    if (signos.size() < static_cast<size_t>(n)) return;  // the quit byte
  }
}

}  // namespace kforge
