#ifndef KFORGE_DEPLOY_PREBUILD_H_
#define KFORGE_DEPLOY_PREBUILD_H_

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "deploy/matrix.h"
#include "service/compile_pool.h"

namespace kforge {

struct PrebuildOptions {
  std::string out_dir;  // the bundle directory; created if missing
  int jobs = 1;         // compile worker processes at once
  // The kforge binary, run as `<worker_binary> compile-worker`; empty means
  // this process's own executable (CompilePoolOptions::worker_binary).
  std::string worker_binary;
  absl::Duration compile_timeout = absl::Seconds(120);  // per kernel
  WorkerFaults worker_faults;                           // tests only (CompilePoolOptions::faults)
  // An Ed25519 private key (PEM); when set, checksums.sha256 is signed each
  // time it is written (BundleWriter::Sign). "" = unsigned.
  std::string sign_key_pem;
  // When > 0, written to release.json (BundleWriter::SetSequence) before
  // the checksums, so a signature covers it; 0 leaves release.json as it is.
  uint64_t sequence = 0;
};

// What the bundle needs, known once the matrix is planned (no compile yet).
struct PrebuildPlan {
  int kernels = 0;     // distinct kernels the matrix's manifests name
  int present = 0;     // already in the bundle: not compiled again
  int to_compile = 0;  // compiled by this run
  int workers = 0;     // compile worker processes that run them
  // Jobs whose manifest cannot be planned: reported as failed at once
  // (their kernels are not known, so not counted above).
  int unplanned = 0;
};

// One kernel of the run finished: compiled and added, or failed (a matrix
// job that cannot be planned is reported the same way, seconds 0).
struct PrebuildKernelDone {
  std::string label;  // the matrix label, e.g. "glm-5 tp8 sq2 bf16 sm_90a"
  bool ok = false;
  double seconds = 0;  // this kernel's compile, worker start included
  std::string error;   // why it failed; empty when ok
};

// Both may be empty. on_done runs on the compile threads, concurrently.
struct PrebuildCallbacks {
  std::function<void(const PrebuildPlan&)> on_plan;
  std::function<void(const PrebuildKernelDone&)> on_done;
};

struct PrebuildFailure {
  std::string label;
  std::string error;
};

struct PrebuildReport {
  PrebuildPlan plan;
  int compiled = 0;                     // compiled and added by this run
  std::vector<PrebuildFailure> failed;  // in the order they finished
  // Manifests written, and the labels of those left out (and removed if an
  // earlier run had written them) because a kernel of theirs failed.
  int manifests = 0;
  std::vector<std::string> manifests_skipped;
  // `stop` was set: the kernels not yet compiled are left for the next run,
  // and neither manifests nor checksums were written (see PrebuildBundle).
  bool stopped = false;
  int not_built = 0;  // after a stop: not started, or cut short by it
  double seconds = 0;
};

// `kforge prebuild`: compiles every kernel of a deployment matrix into a
// bundle directory (runtime/bundle.h) and writes the manifests and
// checksums.
//
// What a bundle holds: for each job, BuildManifest for that spec and
// arch; the kernels are the union of those variants, each key once. That
// is one kernel per job, the same set `kforge warm` builds.
//
// Incremental: a kernel already in the directory (BundleWriter::HasKernel)
// is not compiled again. Kernels compile in `jobs` isolated worker
// processes (CompilePool); each is checked against its planned variant and
// written atomically as soon as it is done, so a killed run keeps whole
// kernels only and the next run resumes from them.
//
// Manifests and checksums.sha256 are written at the end, and only over
// whole data: a manifest only when every kernel it names is present, and
// checksums.sha256 (BundleWriter::Finish) only when the run was not
// stopped. Once `stop` is true no compile starts; running ones finish and
// their kernels are kept, and the function returns with `stopped` set and
// the previous checksums.sha256 (none for a new bundle) left as it was, so
// the directory does not verify until a run completes it.
//
// Errors: the bundle cannot be opened (another format version, not
// writable) or a file cannot be written. Kernel failures are not errors:
// they are in the report, and the rest of the bundle is finished.
absl::StatusOr<PrebuildReport> PrebuildBundle(const std::vector<MatrixJob>& jobs,
                                              const PrebuildOptions& options,
                                              const PrebuildCallbacks& callbacks,
                                              const std::atomic<bool>& stop);

}  // namespace kforge

#endif  // KFORGE_DEPLOY_PREBUILD_H_
