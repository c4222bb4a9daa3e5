#include "base/reload_signal.h"

#include <signal.h>

#include <utility>

namespace kforge {

absl::StatusOr<std::unique_ptr<ReloadSignal>> ReloadSignal::Install(
    std::function<void()> on_reload) {
  absl::StatusOr<std::unique_ptr<SignalPipe>> pipe =
      SignalPipe::Install({SIGHUP}, [on_reload = std::move(on_reload)](absl::Span<const int>) {
        if (on_reload) on_reload();
      });
  if (!pipe.ok()) return pipe.status();
  return std::unique_ptr<ReloadSignal>(new ReloadSignal(*std::move(pipe)));
}

ReloadSignal::~ReloadSignal() = default;

}  // namespace kforge
