#ifndef KFORGE_BASE_RELOAD_SIGNAL_H_
#define KFORGE_BASE_RELOAD_SIGNAL_H_

#include <functional>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "base/signal_pipe.h"

namespace kforge {

// SIGHUP as "reload your configuration" (`kforge serve` rereads its token
// files and TLS certificates). Through a SignalPipe, as ShutdownSignals:
// `on_reload` runs on the pipe's watcher thread, once per signal (signals
// that come while it runs are merged). One instance per process at a time;
// the destructor restores SIGHUP's default disposition and joins the thread.
class ReloadSignal {
 public:
  static absl::StatusOr<std::unique_ptr<ReloadSignal>> Install(std::function<void()> on_reload);
  ~ReloadSignal();

 private:
  explicit ReloadSignal(std::unique_ptr<SignalPipe> pipe) : pipe_(std::move(pipe)) {}
  std::unique_ptr<SignalPipe> pipe_;
};

}  // namespace kforge

#endif  // KFORGE_BASE_RELOAD_SIGNAL_H_
