#include "deploy/prebuild.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bundle/bundle.h"
#include "bundle/kernel_source.h"
#include "compiler/compiler.h"
#include "compiler/manifest.h"
#include "service/compile_pool.h"

namespace kforge {
namespace {

// A job's manifest as the bundle holds it, or why it cannot be planned.
struct PlannedManifest {
  const MatrixJob* job;
  absl::StatusOr<v1::Manifest> manifest;
};

// A kernel the bundle needs: one variant of a planned manifest.
struct KernelTask {
  std::string label;
  std::string arch;
  v1::ManifestVariant variant;
};

// Each job's manifest.
std::vector<PlannedManifest> PlanManifests(const std::vector<MatrixJob>& jobs) {
  const KernelCompiler compiler;
  std::vector<PlannedManifest> planned;
  planned.reserve(jobs.size());
  for (const MatrixJob& job : jobs) {
    planned.push_back({&job, BuildManifest(compiler, job.spec, job.arch)});
  }
  return planned;
}

// The union of the planned manifests' variants, each key once, in job
// order. A kernel is labelled by the job whose own (first-choice) kernel it
// is, so progress lines read like the matrix.
std::vector<KernelTask> KernelTasks(const std::vector<PlannedManifest>& planned) {
  std::map<std::string, std::string> label_by_key;
  for (const PlannedManifest& p : planned) {
    if (!p.manifest.ok() || p.manifest->choice_order_size() == 0) continue;
    const v1::ManifestVariant& own = p.manifest->variants(p.manifest->choice_order(0));
    label_by_key.emplace(own.key(), p.job->label);
  }
  std::vector<KernelTask> tasks;
  std::set<std::string> seen;
  for (const PlannedManifest& p : planned) {
    if (!p.manifest.ok()) continue;
    for (const v1::ManifestVariant& variant : p.manifest->variants()) {
      if (!seen.insert(variant.key()).second) continue;
      auto label = label_by_key.find(variant.key());
      tasks.push_back({label != label_by_key.end() ? label->second : variant.module_name(),
                       p.manifest->arch(), variant});
    }
  }
  return tasks;
}

// Compiles `tasks` on `workers` threads, each waiting on one CompilePool
// job at a time, and adds every kernel to the bundle as soon as it is done.
class KernelBuilder {
 public:
  KernelBuilder(const PrebuildOptions& options, int workers, BundleWriter& writer,
                const PrebuildCallbacks& callbacks, const std::atomic<bool>& stop)
      : pool_(CompilePoolOptions{.workers = workers,
                                 .queue_limit = workers,
                                 .timeout = options.compile_timeout,
                                 .worker_binary = options.worker_binary,
                                 .faults = options.worker_faults}),
        workers_(workers),
        writer_(&writer),
        callbacks_(callbacks),
        stop_(stop) {}

  // Adds the keys built to `built` and their counts and failures to
  // `report`.
  void Run(const std::vector<KernelTask>& tasks, std::set<std::string>& built,
           PrebuildReport& report) ABSL_LOCKS_EXCLUDED(report_mu_) {
    {
      absl::MutexLock lock(&report_mu_);
      built_ = &built;
      report_ = &report;
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < workers_; ++t) {
      threads.emplace_back([&] {
        // The stop check comes first: once set, no further task is taken.
        for (size_t i; !stop_.load() && (i = next_++) < tasks.size();) {
          Finished(tasks[i], Build(tasks[i]));
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }

 private:
  struct Outcome {
    absl::Status status;
    double seconds = 0;
  };

  Outcome Build(const KernelTask& task) {
    const absl::Time start = absl::Now();
    absl::Status status = CompileAndAdd(task);
    return {std::move(status), absl::ToDoubleSeconds(absl::Now() - start)};
  }

  absl::Status CompileAndAdd(const KernelTask& task) {
    v1::CompileJob job;
    *job.mutable_spec() = task.variant.spec();
    job.set_arch(task.arch);
    absl::StatusOr<CompileFuture> future = pool_.Submit(std::move(job));
    if (!future.ok()) return future.status();
    const absl::StatusOr<v1::KernelArtifact>& artifact = future->get();
    if (!artifact.ok()) return artifact.status();
    // The worker is another binary (--worker-binary or a replaced file): a
    // kernel that is not the planned one would make the manifest lie.
    if (absl::Status s = CheckArtifactForVariant(task.variant, task.arch, *artifact); !s.ok()) {
      return absl::InternalError(
          absl::StrCat("the compile worker built another kernel than planned: ", s.message()));
    }
    // compile_seconds is the only field that depends on the host and the
    // moment (NVRTC's cubin is deterministic): cleared, the same matrix
    // gives byte-identical kernel files and checksums on any machine.
    v1::KernelArtifact stored = *artifact;
    stored.clear_compile_seconds();
    absl::MutexLock lock(&writer_mu_);
    return writer_->AddKernel(stored);
  }

  void Finished(const KernelTask& task, const Outcome& outcome) ABSL_LOCKS_EXCLUDED(report_mu_) {
    PrebuildKernelDone done{task.label, outcome.status.ok(), outcome.seconds,
                            std::string(outcome.status.message())};
    {
      absl::MutexLock lock(&report_mu_);
      if (outcome.status.ok()) {
        ++report_->compiled;
        built_->insert(task.variant.key());
      } else if (stop_.load()) {
        // Cut short by the stop (a terminal's Ctrl-C also reaches the
        // workers): left for the next run, not a kernel failure.
        return;
      } else {
        report_->failed.push_back({task.label, done.error});
      }
    }
    if (callbacks_.on_done) callbacks_.on_done(done);
  }

  CompilePool pool_;
  const int workers_;
  absl::Mutex writer_mu_;
  BundleWriter* const writer_ ABSL_PT_GUARDED_BY(writer_mu_);  // not thread-safe
  const PrebuildCallbacks& callbacks_;
  const std::atomic<bool>& stop_;
  std::atomic<size_t> next_{0};
  absl::Mutex report_mu_;
  // Run's out-parameters, filled in as kernels finish.
  std::set<std::string>* built_ ABSL_PT_GUARDED_BY(report_mu_) = nullptr;
  PrebuildReport* report_ ABSL_PT_GUARDED_BY(report_mu_) = nullptr;
};

// Writes each planned manifest whose kernels are all in the bundle; removes
// the file of one that is not (an earlier run may have written it), so the
// bundle never lists a variant it lacks.
absl::Status WriteManifests(const std::vector<PlannedManifest>& planned,
                            const std::set<std::string>& present, BundleWriter& writer,
                            PrebuildReport& report) {
  for (const PlannedManifest& p : planned) {
    if (!p.manifest.ok()) continue;
    const bool complete =
        std::all_of(p.manifest->variants().begin(), p.manifest->variants().end(),
                    [&](const v1::ManifestVariant& v) { return present.count(v.key()) > 0; });
    if (complete) {
      if (absl::Status s = writer.AddManifest(*p.manifest); !s.ok()) return s;
      ++report.manifests;
      continue;
    }
    report.manifests_skipped.push_back(p.job->label);
    absl::StatusOr<std::string> path = BundleManifestPath(*p.manifest);
    if (!path.ok()) return path.status();
    std::error_code ec;
    std::filesystem::remove(std::filesystem::path(writer.dir()) / *path, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot remove the stale manifest ", writer.dir(),
                                              "/", *path, ": ", ec.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PrebuildReport> PrebuildBundle(const std::vector<MatrixJob>& jobs,
                                              const PrebuildOptions& options,
                                              const PrebuildCallbacks& callbacks,
                                              const std::atomic<bool>& stop) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<BundleWriter>> writer = BundleWriter::Open(options.out_dir);
  if (!writer.ok()) return writer.status();

  const std::vector<PlannedManifest> planned = PlanManifests(jobs);
  const std::vector<KernelTask> tasks = KernelTasks(planned);
  std::set<std::string> present;  // keys of the kernels now in the bundle
  std::vector<KernelTask> to_compile;
  for (const KernelTask& task : tasks) {
    if ((*writer)->HasKernel(task.variant.key())) {
      present.insert(task.variant.key());
    } else {
      to_compile.push_back(task);
    }
  }
  PrebuildReport report;
  report.plan.kernels = static_cast<int>(tasks.size());
  report.plan.present = static_cast<int>(present.size());
  report.plan.to_compile = static_cast<int>(to_compile.size());
  report.plan.workers = std::clamp(options.jobs, 1, std::max(1, report.plan.to_compile));
  if (to_compile.empty()) report.plan.workers = 0;
  for (const PlannedManifest& p : planned) report.plan.unplanned += !p.manifest.ok();
  if (callbacks.on_plan) callbacks.on_plan(report.plan);

  for (const PlannedManifest& p : planned) {
    if (p.manifest.ok()) continue;
    const std::string error(p.manifest.status().message());
    report.failed.push_back({p.job->label, error});
    if (callbacks.on_done) callbacks.on_done({p.job->label, false, 0, error});
  }
  const int failed_to_plan = static_cast<int>(report.failed.size());
  if (!to_compile.empty()) {
    KernelBuilder(options, report.plan.workers, **writer, callbacks, stop)
        .Run(to_compile, present, report);
  }
  const int failed_to_compile = static_cast<int>(report.failed.size()) - failed_to_plan;
  report.not_built = report.plan.to_compile - report.compiled - failed_to_compile;
  // A stop that came after the last kernel leaves nothing to resume: the
  // bundle is finished as usual.
  report.stopped = stop.load() && report.not_built > 0;
  if (!report.stopped) {
    if (absl::Status s = WriteManifests(planned, present, **writer, report); !s.ok()) {
      return s;
    }
    if (options.sequence > 0) {
      if (absl::Status s = (*writer)->SetSequence(options.sequence); !s.ok()) return s;
    }
    if (absl::Status s = (*writer)->Finish(); !s.ok()) return s;
    if (!options.sign_key_pem.empty()) {
      if (absl::Status s = (*writer)->Sign(options.sign_key_pem); !s.ok()) return s;
    }
  }
  report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return report;
}

}  // namespace kforge
