#ifndef KFORGE_BASE_RELOAD_SIGNAL_H_
#define KFORGE_BASE_RELOAD_SIGNAL_H_

#include <functional>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"

namespace kforge {

// SIGHUP as "reload your configuration" (`kforge serve` rereads its token
// files). As ShutdownSignals does, the handler only writes to a self-pipe;
// `on_reload` runs on a watcher thread, once per signal (signals that come
// while it runs are merged). One instance per process at a time; the
// destructor restores SIGHUP's default disposition and joins the thread.
class ReloadSignal {
 public:
  static absl::StatusOr<std::unique_ptr<ReloadSignal>> Install(std::function<void()> on_reload);
  ~ReloadSignal();

 private:
  ReloadSignal(std::function<void()> on_reload, int read_fd, int write_fd);
  void Watch();

  const std::function<void()> on_reload_;
  const int read_fd_;
  const int write_fd_;
  std::thread watcher_;
};

}  // namespace kforge

#endif  // KFORGE_BASE_RELOAD_SIGNAL_H_
