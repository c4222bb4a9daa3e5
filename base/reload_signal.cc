#include "base/reload_signal.h"

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

std::atomic<int> g_reload_pipe{-1};
static_assert(std::atomic<int>::is_always_lock_free, "used from a signal handler");

constexpr unsigned char kReload = 1;
constexpr unsigned char kQuit = 0;

extern "C" void OnReloadSignal(int) {
  const int saved_errno = errno;
  const unsigned char byte = kReload;
  // A full pipe already holds a pending reload.
  [[maybe_unused]] ssize_t n = write(g_reload_pipe.load(), &byte, 1);
  errno = saved_errno;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReloadSignal>> ReloadSignal::Install(
    std::function<void()> on_reload) {
  if (g_reload_pipe.load() >= 0) {
    return absl::FailedPreconditionError("the SIGHUP handler is already installed");
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  fcntl(fds[1], F_SETFL, O_NONBLOCK);
  g_reload_pipe.store(fds[1]);
  std::unique_ptr<ReloadSignal> signal(new ReloadSignal(std::move(on_reload), fds[0], fds[1]));
  struct sigaction action = {};
  action.sa_handler = OnReloadSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (sigaction(SIGHUP, &action, nullptr) != 0) {
    return absl::InternalError(absl::StrCat("sigaction(SIGHUP): ", std::strerror(errno)));
  }
  return signal;
}

ReloadSignal::ReloadSignal(std::function<void()> on_reload, int read_fd, int write_fd)
    : on_reload_(std::move(on_reload)),
      read_fd_(read_fd),
      write_fd_(write_fd),
      watcher_([this] { Watch(); }) {}

ReloadSignal::~ReloadSignal() {
  struct sigaction action = {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(SIGHUP, &action, nullptr);
  g_reload_pipe.store(-1);
  const unsigned char quit = kQuit;
  while (write(write_fd_, &quit, 1) < 0 && errno == EINTR) {
  }
  watcher_.join();
  close(read_fd_);
  close(write_fd_);
}

void ReloadSignal::Watch() {
  for (;;) {
    unsigned char bytes[64];
    const ssize_t n = read(read_fd_, bytes, sizeof bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    // Several bytes read at once are one reload; a quit byte among them ends.
    bool quit = false;
    for (ssize_t i = 0; i < n; ++i) quit = quit || bytes[i] == kQuit;
    if (quit) return;
    if (on_reload_) on_reload_();
  }
}

}  // namespace kforge
