// Deployment subcommands: build every kernel a deployment matrix names
// (deploy/matrix.h). `kforge warm` has a running server do it; `kforge
// prebuild` does it here, into a bundle directory that `kforge verify`
// checks.
#include "cli/deploy_cmds.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/credentials.h"
#include "base/ed25519.h"
#include "base/io.h"
#include "base/shutdown_signals.h"
#include "bundle/bundle.h"
#include "cli/connect_args.h"
#include "cli/flags.h"
#include "cli/progress.h"
#include "cli/worker_faults.h"
#include "deploy/matrix.h"
#include "deploy/prebuild.h"
#include "grpcpp/grpcpp.h"
#include "kforge/v1/service.grpc.pb.h"
#include "model/spec.h"

namespace kforge::cli {
namespace {

// Exit codes shared by the deployment commands.
constexpr int kExitOk = 0;
constexpr int kExitFailures = 1;  // some kernels failed; the rest were built
constexpr int kExitUsage = 2;     // bad flags or matrix, server unreachable

int UsageError(const absl::Status& s) {
  std::cerr << "kforge: " << s.message() << "\n";
  return kExitUsage;
}

// The matrix named by the only positional argument, else the default one.
absl::StatusOr<std::vector<MatrixJob>> MatrixJobsFromArgs(const ParsedArgs& args) {
  if (args.positional.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("expected at most one MATRIX file, got ",
                                                   args.positional.size(),
                                                   " arguments (see --help)"));
  }
  absl::StatusOr<v1::DeploymentMatrix> matrix =
      args.positional.empty() ? DefaultMatrix() : LoadMatrixFile(args.positional[0]);
  if (!matrix.ok()) return matrix.status();
  return ExpandMatrix(*matrix);
}

// The jobs of one spec: one Warm call. The server reports each kernel
// by arch, key and module name but, on failure, only by arch and error, so
// a call carries a single spec and every message is tied to its job.
struct SpecGroup {
  v1::KernelSpec spec;
  std::vector<const MatrixJob*> jobs;  // distinct archs
};

std::vector<SpecGroup> GroupBySpec(const std::vector<MatrixJob>& jobs) {
  std::vector<SpecGroup> groups;
  std::map<std::string, size_t> index;  // serialized spec -> group
  for (const MatrixJob& job : jobs) {
    auto [it, added] = index.emplace(job.spec.SerializeAsString(), groups.size());
    if (added) groups.push_back({job.spec, {}});
    groups[it->second].jobs.push_back(&job);
  }
  return groups;
}

std::string CallError(const grpc::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                      ": ", status.error_message());
}

struct WarmCounts {
  std::atomic<int> compiled{0};
  std::atomic<int> cached{0};
};

// Runs one Warm call and reports each of its kernels to `progress`,
// kernels the call did not report as failed with the call's status.
void WarmGroup(v1::KernelService::Stub& stub, const SpecGroup& group, absl::Time deadline,
               Progress& progress, WarmCounts& counts) {
  v1::PrebuildRequest request;
  *request.add_kernels()->mutable_spec() = group.spec;
  for (const MatrixJob* job : group.jobs) request.add_archs(job->arch);
  grpc::ClientContext context;
  if (deadline != absl::InfiniteFuture()) {
    context.set_deadline(absl::ToChronoTime(deadline));
  }
  std::unique_ptr<grpc::ClientReader<v1::PrebuildProgress>> reader = stub.Warm(&context, request);
  std::vector<bool> reported(group.jobs.size(), false);
  v1::PrebuildProgress message;
  while (reader->Read(&message)) {
    for (size_t i = 0; i < group.jobs.size(); ++i) {
      if (reported[i] || group.jobs[i]->arch != message.arch()) continue;
      reported[i] = true;
      std::string label = group.jobs[i]->label;
      if (message.state() == v1::PREBUILD_STATE_CACHED) {
        ++counts.cached;
        absl::StrAppend(&label, " (cached)");
      } else if (message.state() == v1::PREBUILD_STATE_COMPILED) {
        ++counts.compiled;
      }
      progress.Done(label, message.state() != v1::PREBUILD_STATE_FAILED, message.seconds(),
                    message.error());
      break;
    }
  }
  const grpc::Status status = reader->Finish();
  const std::string why =
      status.ok() ? "the server reported nothing for this kernel" : CallError(status);
  for (size_t i = 0; i < group.jobs.size(); ++i) {
    if (!reported[i]) progress.Done(group.jobs[i]->label, false, 0.0, why);
  }
}

// Warms the groups on `parallel` concurrent calls; the server bounds the
// compiles themselves (its pool and queue).
void WarmAll(v1::KernelService::Stub& stub, const std::vector<SpecGroup>& groups, int parallel,
             absl::Time deadline, Progress& progress, WarmCounts& counts) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  const int n = std::max(1, std::min<int>(parallel, static_cast<int>(groups.size())));
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&] {
      for (size_t i; (i = next++) < groups.size();) {
        WarmGroup(stub, groups[i], deadline, progress, counts);
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

const std::vector<FlagSpec>& WarmFlags() {
  static const std::vector<FlagSpec> kFlags = {
      ServerFlag(),
      {"jobs", "N", "Warm calls in flight (one call per spec)", "4", 'j'},
      {"connect-timeout", "SECONDS", "give up when the server cannot be reached", "10"},
      {"timeout", "SECONDS", "deadline for the whole warm-up (0: none)", "3600"},
      {"help", "", "show this help", "", 'h'}};
  static const std::vector<FlagSpec> kWithSecurity = [] {
    std::vector<FlagSpec> flags = kFlags;
    flags.insert(flags.end() - 1, ClientSecurityFlags().begin(), ClientSecurityFlags().end());
    return flags;
  }();
  return kWithSecurity;
}

}  // namespace

int Warm(const std::vector<std::string>& argv) {
  absl::StatusOr<ParsedArgs> args = ParseFlags(WarmFlags(), argv);
  if (!args.ok()) return UsageError(args.status());
  if (args->Has("help")) {
    std::cout << "usage: kforge warm [--server ADDR] [-j N] [--tls-ca FILE] [--token-file FILE] "
                 "[MATRIX]\n\n"
                 "Asks a running kforge server to compile every kernel of a "
                 "deployment matrix\n(docs/MATRIX.md) into its cache: one "
                 "kernel per model, tp, kv dtype, s_q and arch.\nWithout "
                 "MATRIX, the built-in default:\n\n"
              << DefaultMatrixJson() << "\n"
              << FlagsHelp(WarmFlags());
    return kExitOk;
  }
  long long jobs = 0, connect_s = 0, timeout_s = 0;
  for (auto [name, out] : {std::pair{"jobs", &jobs}, std::pair{"connect-timeout", &connect_s},
                           std::pair{"timeout", &timeout_s}}) {
    absl::StatusOr<long long> v = ParseIntFlag(name, args->Get(name));
    if (!v.ok()) return UsageError(v.status());
    *out = *v;
  }
  absl::StatusOr<std::vector<MatrixJob>> matrix_jobs = MatrixJobsFromArgs(*args);
  if (!matrix_jobs.ok()) return UsageError(matrix_jobs.status());

  // Checked before any work is reported, so an unreachable server is one
  // clear message rather than a failure per kernel.
  const std::string address = args->Get("server");
  absl::StatusOr<std::shared_ptr<grpc::Channel>> connected = ConnectFromArgs(address, *args);
  if (!connected.ok()) return UsageError(connected.status());
  std::shared_ptr<grpc::Channel> channel = *std::move(connected);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(connect_s)))) {
    const bool tls = ClientSecurityFromArgs(*args).UsesTls();
    return UsageError(absl::UnavailableError(absl::StrCat(
        "cannot reach kforge server at ", address, " (no connection within ", connect_s, " s",
        tls ? "; with TLS: check that it serves TLS and that its certificate chains to --tls-ca"
            : "; if it serves TLS, give its CA with --tls-ca",
        ")")));
  }
  auto stub = v1::KernelService::NewStub(channel);
  const absl::Time deadline =
      timeout_s > 0 ? absl::Now() + absl::Seconds(timeout_s) : absl::InfiniteFuture();

  Progress progress(StderrProgressOptions());
  WarmCounts counts;
  progress.Start(matrix_jobs->size());
  WarmAll(*stub, GroupBySpec(*matrix_jobs), static_cast<int>(jobs), deadline, progress, counts);
  const ProgressSummary summary = progress.Finish();
  std::cout << "warm: " << summary.total << " kernels, " << counts.compiled << " compiled, "
            << counts.cached << " cached, " << summary.failures.size() << " failed\n";
  return summary.failures.empty() ? kExitOk : kExitFailures;
}

// ---------------------------------------------------------------------------
// kforge prebuild

namespace {

// SIGINT/SIGTERM for `kforge prebuild`: the first stops new compiles (the
// running ones finish, their kernels are kept), the second quits at once
// with 128 + its number. Every file is written atomically, so what is on
// disk stays whole either way.
absl::StatusOr<std::unique_ptr<ShutdownSignals>> InstallPrebuildStopSignals() {
  ShutdownSignalOptions options;
  options.on_first = [](int) {
    std::cerr << "\nkforge: stopping: no new compiles; waiting for the running ones "
                 "(signal again to quit now)"
              << std::endl;
  };
  options.second_message = "\nkforge: second signal, exiting now\n";
  options.second_exit_code = [](int signo) { return 128 + signo; };
  return ShutdownSignals::Install(std::move(options));
}

std::string DefaultJobs() {
  return absl::StrCat(std::max(1u, std::thread::hardware_concurrency()));
}

std::vector<FlagSpec> WithWorkerFaultFlags(std::vector<FlagSpec> flags) {
  for (FlagSpec& hidden : WorkerFaultFlags()) flags.push_back(std::move(hidden));
  return flags;
}

const std::vector<FlagSpec>& PrebuildFlags() {
  static const std::vector<FlagSpec> kFlags = WithWorkerFaultFlags(
      {{"out", "DIR", "the bundle directory (created; an existing bundle is completed)", "", 'o'},
       {"jobs", "N", "compile worker processes at once (the default is this machine's CPU count)",
        DefaultJobs(), 'j'},
       {"compile-timeout", "SECONDS", "a kernel compiling longer is killed and fails", "120"},
       {"sign", "KEYFILE",
        "sign checksums.sha256 with this Ed25519 private key (PEM; kforge keygen) into "
        "checksums.sha256.sig"},
       {"sequence", "N",
        "write release.json with this sequence (1, 2, ...: raise it with each release), covered "
        "by the signature; servers with --trust-min-sequence refuse lower ones (rollbacks)"},
       {"help", "", "show this help", "", 'h'}});
  return kFlags;
}

void PrintPrebuildSummary(const std::string& dir, const PrebuildReport& report, int stop_signal,
                          bool signed_bundle) {
  if (!report.manifests_skipped.empty()) {
    std::cout << "prebuild: manifests not written (a kernel of theirs failed): "
              << absl::StrJoin(report.manifests_skipped, ", ") << "\n";
  }
  std::cout << "prebuild: " << dir << ": " << report.plan.kernels << " kernels, " << report.compiled
            << " compiled, " << report.plan.present << " already in the bundle, "
            << report.failed.size() << " failed";
  if (report.stopped) {
    std::cout << "; stopped by " << (stop_signal == SIGINT ? "SIGINT" : "SIGTERM") << " with "
              << report.not_built
              << " left to build: no manifests or checksums written (the "
                 "bundle is incomplete); run the same command again to "
                 "complete it\n";
    return;
  }
  std::cout << "; " << report.manifests << " manifests; " << kBundleChecksumsFile
            << (signed_bundle ? absl::StrCat(" and ", kBundleSignatureFile) : "") << " written in "
            << absl::StrFormat("%.1f", report.seconds) << " s\n";
}

int PrebuildExitCode(const PrebuildReport& report, int stop_signal) {
  if (report.stopped) return 128 + stop_signal;
  return report.failed.empty() ? kExitOk : kExitFailures;
}

}  // namespace

int Prebuild(const std::vector<std::string>& argv) {
  absl::StatusOr<ParsedArgs> args = ParseFlags(PrebuildFlags(), argv);
  if (!args.ok()) return UsageError(args.status());
  if (args->Has("help")) {
    std::cout << "usage: kforge prebuild [MATRIX] --out DIR [-j N] [--sign KEYFILE]\n\n"
                 "Compiles every kernel of a deployment matrix (docs/MATRIX.md) "
                 "into a bundle\ndirectory that engines and `kforge serve "
                 "--warm-from` read with no compiler:\nkernels named by their "
                 "cache key, manifests, checksums. Kernels already in\nDIR are "
                 "not compiled again. Without MATRIX, the built-in default:\n\n"
              << DefaultMatrixJson() << "\n"
              << FlagsHelp(PrebuildFlags());
    return kExitOk;
  }
  PrebuildOptions options;
  options.out_dir = args->Get("out");
  if (options.out_dir.empty()) {
    return UsageError(
        absl::InvalidArgumentError("--out DIR is required: the bundle directory to write"));
  }
  long long jobs = 0, timeout_s = 0;
  for (auto [name, out] : {std::pair{"jobs", &jobs}, std::pair{"compile-timeout", &timeout_s}}) {
    absl::StatusOr<long long> v = IntFlagInRange(*args, name, 1, 100000);
    if (!v.ok()) return UsageError(v.status());
    *out = *v;
  }
  options.jobs = static_cast<int>(jobs);
  options.compile_timeout = absl::Seconds(timeout_s);
  absl::StatusOr<WorkerFaults> faults = WorkerFaultsFromArgs(*args);
  if (!faults.ok()) return UsageError(faults.status());
  options.worker_faults = *faults;
  if (args->Has("sign")) {
    // Checked before any compile: a wrong key is found in a second, not
    // after the whole matrix.
    absl::StatusOr<std::string> key = ReadCredentialFile(args->Get("sign"), "--sign");
    if (!key.ok()) return UsageError(key.status());
    if (absl::Status s = Ed25519PublicKeyOf(*key).status(); !s.ok()) {
      return UsageError(absl::InvalidArgumentError(
          absl::StrCat("--sign ", args->Get("sign"), ": ", s.message())));
    }
    options.sign_key_pem = *std::move(key);
  }
  if (args->Has("sequence")) {
    absl::StatusOr<long long> sequence = IntFlagInRange(*args, "sequence", 1, int64_t{1} << 53);
    if (!sequence.ok()) return UsageError(sequence.status());
    options.sequence = static_cast<uint64_t>(*sequence);
  }
  absl::StatusOr<std::vector<MatrixJob>> matrix_jobs = MatrixJobsFromArgs(*args);
  if (!matrix_jobs.ok()) return UsageError(matrix_jobs.status());

  absl::StatusOr<std::unique_ptr<ShutdownSignals>> signals = InstallPrebuildStopSignals();
  if (!signals.ok()) {
    std::cerr << "kforge: cannot install signal handlers: " << signals.status().message() << "\n";
    return kExitFailures;
  }
  Progress progress(StderrProgressOptions());
  bool progress_started = false;
  PrebuildCallbacks callbacks;
  callbacks.on_plan = [&](const PrebuildPlan& plan) {
    std::cout << "prebuild: " << options.out_dir << ": " << plan.kernels << " kernels, "
              << plan.present << " already in the bundle, ";
    if (plan.to_compile == 0) {
      std::cout << "nothing to compile" << std::endl;
    } else {
      std::cout << plan.to_compile << " to compile with " << plan.workers
                << (plan.workers == 1 ? " worker process" : " worker processes") << std::endl;
    }
    const int items = plan.to_compile + plan.unplanned;
    if (items > 0) {
      progress.Start(static_cast<size_t>(items));
      progress_started = true;
    }
  };
  callbacks.on_done = [&](const PrebuildKernelDone& done) {
    progress.Done(done.label, done.ok, done.seconds, done.error);
  };
  absl::StatusOr<PrebuildReport> report =
      PrebuildBundle(*matrix_jobs, options, callbacks, (*signals)->requested());
  if (progress_started) progress.Finish();
  if (!report.ok()) {
    std::cerr << "kforge: prebuild " << options.out_dir << ": " << report.status().message()
              << "\n";
    // Refused before any work (another format, not a directory) is a usage
    // error; a write that failed midway is not.
    return absl::IsFailedPrecondition(report.status()) || absl::IsInvalidArgument(report.status())
               ? kExitUsage
               : kExitFailures;
  }
  PrintPrebuildSummary(options.out_dir, *report, (*signals)->received(),
                       !options.sign_key_pem.empty());
  return PrebuildExitCode(*report, (*signals)->received());
}

// ---------------------------------------------------------------------------
// kforge verify

namespace {

// Files under DIR/sub whose name ends in `suffix`.
int CountFiles(const std::string& dir, const char* sub, const char* suffix) {
  int n = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(std::filesystem::path(dir) / sub, ec), end;
       !ec && it != end; it.increment(ec)) {
    n += it->path().filename().string().ends_with(suffix);
  }
  return n;
}

}  // namespace

int Verify(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = {
      {"trust", "PUBKEY",
       "also require checksums.sha256.sig, a valid signature by this Ed25519 public key (PEM)"},
      {"trust-min-sequence", "N",
       "with --trust: also require a signed sequence (release.json) of at least N", "0"},
      {"help", "", "show this help", "", 'h'}};
  absl::StatusOr<ParsedArgs> args = ParseFlags(flags, argv);
  if (!args.ok()) return UsageError(args.status());
  if (args->Has("help")) {
    std::cout << "usage: kforge verify [--trust PUBKEY [--trust-min-sequence N]] DIR\n\n"
                 "Checks a bundle written by `kforge prebuild`: format version, "
                 "every checksum,\nfiles missing or not listed, every kernel "
                 "against its name and its manifests.\nPrints each problem as "
                 "\"path: message\". Exit 0 clean, 1 problems, 2 not a bundle.\n\n"
              << FlagsHelp(flags);
    return kExitOk;
  }
  if (args->positional.size() != 1) {
    return UsageError(absl::InvalidArgumentError(absl::StrCat(
        "expected one bundle DIR, got ", args->positional.size(), " arguments (see --help)")));
  }
  const std::string& dir = args->positional[0];
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return UsageError(absl::NotFoundError(absl::StrCat(dir, " is not a directory")));
  }
  if (!std::filesystem::exists(std::filesystem::path(dir) / kBundleMarkerFile, ec)) {
    return UsageError(absl::FailedPreconditionError(
        absl::StrCat(dir, " is not a kforge bundle: it has no ", kBundleMarkerFile,
                     " (`kforge prebuild --out ", dir, "` writes one)")));
  }
  if (args->Has("trust")) {
    // A key that cannot be used is a usage error, not a problem of the bundle.
    absl::StatusOr<std::string> key = ReadCredentialFile(args->Get("trust"), "--trust");
    if (!key.ok()) return UsageError(key.status());
  }
  absl::StatusOr<long long> min_sequence =
      IntFlagInRange(*args, "trust-min-sequence", 0, int64_t{1} << 53);
  if (!min_sequence.ok()) return UsageError(min_sequence.status());
  if (*min_sequence > 0 && !args->Has("trust")) {
    return UsageError(absl::InvalidArgumentError(
        "--trust-min-sequence needs --trust: an unsigned sequence proves nothing"));
  }
  const std::vector<BundleProblem> problems =
      VerifyBundle(dir, args->Get("trust"), static_cast<uint64_t>(*min_sequence));
  for (const BundleProblem& p : problems) std::cout << p.path << ": " << p.message << "\n";
  if (!problems.empty()) {
    std::cout << "verify: " << dir << ": " << problems.size()
              << (problems.size() == 1 ? " problem" : " problems") << "\n";
    return kExitFailures;
  }
  // What OK covers: a signature that is present but was not checked is
  // said, so that "OK" is never read as "signed and checked".
  std::string signature = "unsigned";
  if (args->Has("trust")) {
    signature = "signed by the trusted key";
  } else if (std::filesystem::exists(std::filesystem::path(dir) / kBundleSignatureFile, ec)) {
    signature = absl::StrCat("signature present but NOT checked (give --trust PUBKEY to check ",
                             kBundleSignatureFile, ")");
  }
  std::string sequence = "no sequence";
  if (absl::StatusOr<std::string> text = ReadFile(
          (std::filesystem::path(dir) / kBundleChecksumsFile).string(), kMaxChecksumsFileBytes);
      text.ok()) {
    if (absl::StatusOr<std::optional<uint64_t>> seq = ReadBundleSequence(dir, *text);
        seq.ok() && seq->has_value()) {
      sequence = absl::StrCat("sequence ", **seq);
    }
  }
  std::cout << "verify: " << dir << ": OK, " << CountFiles(dir, "kernels", ".kfa") << " kernels, "
            << CountFiles(dir, "manifests", ".json") << " manifests, " << sequence << ", "
            << signature << "\n";
  return kExitOk;
}

// ---------------------------------------------------------------------------
// kforge keygen

int Keygen(const std::vector<std::string>& argv) {
  const std::vector<FlagSpec> flags = {
      {"out", "PREFIX", "write PREFIX.key (private, mode 0600) and PREFIX.pub (public)", "", 'o'},
      {"help", "", "show this help", "", 'h'}};
  absl::StatusOr<ParsedArgs> args = ParseFlags(flags, argv);
  if (!args.ok()) return UsageError(args.status());
  if (args->Has("help")) {
    std::cout << "usage: kforge keygen --out PREFIX\n\n"
                 "Makes an Ed25519 key pair for signing bundles: `kforge prebuild --sign "
                 "PREFIX.key`,\nthen `kforge serve --warm-from DIR --trust PREFIX.pub` (and the "
                 "clients' bundle mode)\nrefuse a bundle that key did not sign. PEM, as openssl "
                 "writes them.\n\n"
              << FlagsHelp(flags);
    return kExitOk;
  }
  const std::string prefix = args->Get("out");
  if (prefix.empty() || !args->positional.empty()) {
    return UsageError(absl::InvalidArgumentError("--out PREFIX is required (and nothing else)"));
  }
  const std::string private_path = prefix + ".key";
  const std::string public_path = prefix + ".pub";
  std::error_code ec;
  for (const std::string& path : {private_path, public_path}) {
    if (std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
      return UsageError(absl::AlreadyExistsError(
          absl::StrCat(path, " exists: kforge keygen never overwrites a key")));
    }
  }
  absl::StatusOr<Ed25519KeyPair> pair = GenerateEd25519KeyPair();
  if (!pair.ok()) return UsageError(pair.status());
  // The private key is created 0600 and exclusively: never readable by
  // others, not even for a moment, and never written through a link.
  const int fd =
      open(private_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return UsageError(ErrnoStatus(errno, "cannot create", private_path));
  absl::Status s = WriteAll(fd, pair->private_pem, private_path);
  if (s.ok() && fsync(fd) != 0) s = ErrnoStatus(errno, "fsync", private_path);
  close(fd);
  if (s.ok()) s = WriteFileAtomic(public_path, pair->public_pem);
  if (!s.ok()) {
    std::filesystem::remove(private_path, ec);
    return UsageError(s);
  }
  std::cout << "keygen: " << private_path << " (private: keep it secret), " << public_path
            << " (public: give it to --trust)\n";
  return kExitOk;
}

}  // namespace kforge::cli
