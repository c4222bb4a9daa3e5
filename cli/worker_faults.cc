#include "cli/worker_faults.h"

#include <cstdint>
#include <utility>

namespace kforge::cli {

std::vector<FlagSpec> WorkerFaultFlags() {
  return {{"test-worker-crash-topk", "N", "tests: a worker aborts on this topk", "", 0, false,
           /*hidden=*/true},
          {"test-worker-hang-topk", "N", "tests: a worker hangs on this topk", "", 0, false,
           /*hidden=*/true},
          {"test-worker-fail-topk", "N", "tests: a worker reports a compile error on this topk", "",
           0, false, /*hidden=*/true}};
}

absl::StatusOr<WorkerFaults> WorkerFaultsFromArgs(const ParsedArgs& args) {
  WorkerFaults faults;
  for (auto [name, out] : {std::pair{"test-worker-crash-topk", &faults.crash_topk},
                           std::pair{"test-worker-hang-topk", &faults.hang_topk},
                           std::pair{"test-worker-fail-topk", &faults.fail_topk}}) {
    if (!args.Has(name)) continue;
    absl::StatusOr<long long> v = IntFlagInRange(args, name, 1, UINT32_MAX);
    if (!v.ok()) return v.status();
    *out = static_cast<uint32_t>(*v);
  }
  return faults;
}

}  // namespace kforge::cli
