// The service subcommands: `kforge serve` and its first clients, `kforge get`
// and `kforge stats`. Flags are read here and passed down as Options.
#include "cli/service_cmds.h"

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/credentials.h"
#include "base/io.h"
#include "base/log.h"
#include "bundle/bundle.h"
#include "cli/connect_args.h"
#include "cli/flags.h"
#include "cli/health.h"
#include "cli/kernel_args.h"
#include "cli/worker_faults.h"
#include "compiler/compiler.h"
#include "compiler/nvrtc.h"
#include "grpcpp/grpcpp.h"
#include "kforge/v1/service.grpc.pb.h"
#include "model/artifact_check.h"
#include "model/format.h"
#include "model/selector.h"
#include "model/spec.h"
#include "runtime/cuda_driver.h"
#include "service/auth.h"
#include "service/disk_cache.h"
#include "service/redis_cache.h"
#include "service/server.h"

namespace kforge::cli {
namespace {

// Each worker is a process and a thread; far beyond any machine's cores.
constexpr long long kMaxWorkers = 4096;
// A year: longer timeouts are "never", and absl::Duration stays exact.
constexpr long long kMaxSeconds = 365LL * 24 * 3600;
constexpr absl::Duration kMaxDuration = absl::Seconds(kMaxSeconds);

// $XDG_CACHE_HOME/kforge, else ~/.cache/kforge (XDG base directory spec).
std::string DefaultCacheDir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return absl::StrCat(xdg, "/kforge");
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr && home[0] != '\0' ? home : ".", "/.cache/kforge");
}

// --redis HOST:PORT, --redis-password-file or KFORGE_REDIS_PASSWORD (the
// file wins), and the Redis timeouts, into `redis`. No --redis: no tier.
absl::Status RedisFromArgs(const ParsedArgs& args, RedisCacheOptions* redis) {
  const std::string address = args.Get("redis");
  if (address.empty()) {
    if (!args.Get("redis-password-file").empty()) {
      return absl::InvalidArgumentError("--redis-password-file needs --redis HOST:PORT");
    }
    return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--redis: got \"", address, "\", expected HOST:PORT with a port 1..65535"));
  }
  redis->host = address.substr(0, colon);
  redis->port = port;
  if (const std::string file = args.Get("redis-password-file"); !file.empty()) {
    absl::StatusOr<std::string> password = ReadCredentialFile(file, "--redis-password-file");
    if (!password.ok()) return password.status();
    redis->password = std::string(absl::StripAsciiWhitespace(*password));
  } else if (const char* env = std::getenv("KFORGE_REDIS_PASSWORD"); env != nullptr) {
    redis->password = env;
  }
  absl::StatusOr<absl::Duration> timeout =
      DurationFlag(args, "redis-timeout", absl::Milliseconds(1), absl::Minutes(10));
  if (!timeout.ok()) return timeout.status();
  // Renewed every third of it: 30 ms leaves the keeper 10 ms.
  absl::StatusOr<absl::Duration> ttl =
      DurationFlag(args, "redis-lock-ttl", absl::Milliseconds(30), absl::Hours(1));
  if (!ttl.ok()) return ttl.status();
  redis->timeout = *timeout;
  redis->lock_ttl = *ttl;
  return absl::OkStatus();
}

// Reads a non-negative integer flag into `out`, checking its bounds (INT_MAX
// for a value kept in an int, so nothing is silently truncated).
absl::Status IntFlag(const ParsedArgs& args, const std::string& name, long long min, long long max,
                     long long* out) {
  absl::StatusOr<long long> v = IntFlagInRange(args, name, min, max);
  if (!v.ok()) return v.status();
  *out = *v;
  return absl::OkStatus();
}

// A failed call as the user should read it: a server that cannot be reached
// is told apart from an error the server answered with.
int FailCall(const grpc::Status& status, grpc::Channel& channel, const std::string& address,
             const ParsedArgs& args) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    const ChannelSecurityOptions security = ClientSecurityFromArgs(args);
    const std::string explained =
        ExplainTransportError(status, security.UsesTls(), !security.tls_cert_file.empty());
    if (channel.GetState(false) != GRPC_CHANNEL_READY) {
      std::cerr << "kforge: cannot reach kforge server at " << address << ": " << explained << "\n";
    } else {
      std::cerr << "kforge: UNAVAILABLE: " << explained << "\n";
    }
    return 1;
  }
  std::cerr << "kforge: "
            << absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())) << ": "
            << status.error_message() << "\n";
  return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? 2 : 1;
}

// The flags of `kforge serve` (KFORGE_<FLAG> too), which `kforge doctor`
// takes as well, so that one unit's settings can be checked as they are.
std::vector<FlagSpec> ServeFlags() {
  const ServerOptions defaults;
  const unsigned cores = std::thread::hardware_concurrency();
  std::vector<FlagSpec> flags = {
      {"listen", "ADDR", "address to serve on (port 0: any free port)", defaults.listen},
      {"cache-dir", "DIR", "kernel cache directory", DefaultCacheDir()},
      {"memory-cache-bytes", "SIZE", "memory tier size (bytes, or 512M, 1G, ...)",
       FormatSize(defaults.store.memory_cache_bytes)},
      {"disk-cache-bytes", "SIZE", "disk tier size (LRU eviction beyond it)",
       FormatSize(defaults.store.disk_cache_bytes)},
      {"workers", "N", "concurrent compile worker processes", absl::StrCat(cores == 0 ? 1 : cores)},
      {"queue-limit", "N",
       "compiles waiting for a busy worker; more are refused (0: no waiting queue, but idle "
       "workers take work). auto: what the workers get through in 30 s at 1 s a compile "
       "(30 per worker). A miss whose compile would wait past its deadline is refused at once "
       "whatever the limit",
       "auto"},
      {"compile-timeout", "DURATION", "a compile running longer is killed (seconds, or 90s, 2m)",
       absl::FormatDuration(defaults.store.pool.timeout)},
      {"shutdown-grace", "DURATION",
       "after SIGTERM/SIGINT, how long in-flight calls may take; then running "
       "compiles are killed and their calls answered UNAVAILABLE",
       absl::FormatDuration(defaults.shutdown_grace)},
      {"failed-compile-cache", "DURATION",
       "a compile the compiler rejected is answered with the same error for this long instead "
       "of compiled again (0: always retry)",
       absl::FormatDuration(defaults.store.failure_cache)},
      {"crashed-compile-cache", "DURATION",
       "a compile whose worker crashed or was killed at --compile-timeout is answered with the "
       "same error for this long instead of run again (0: always retry)",
       absl::FormatDuration(defaults.store.worker_failure_cache)},
      {"max-jobs-per-request", "N",
       "most kernels x archs one warm (Prebuild) call may ask for; more is refused before any "
       "work",
       absl::StrCat(defaults.service.max_prebuild_jobs)},
      {"warm-from", "DIR",
       "load a bundle (kforge prebuild --out) into the cache at start; health "
       "says NOT_SERVING until done",
       ""},
      {"trust", "PUBKEY",
       "refuse a --warm-from bundle not signed by this Ed25519 public key (PEM; kforge "
       "keygen), and serve no cache entry that came from an unsigned bundle"},
      {"trust-min-sequence", "N",
       "with --trust: refuse a bundle whose signed sequence (kforge prebuild --sequence) is "
       "below N or missing: an older bundle signed by the same key (a rollback)",
       "0"},
      {"fleet-key", "FILE",
       "the fleet's shared secret (32+ bytes; openssl rand -hex 32): every disk and Redis "
       "entry is sealed with an HMAC under it and refused without one. Needed by --redis"},
      {"tls-cert", "FILE", "serve TLS with this certificate chain (PEM)"},
      {"tls-key", "FILE", "the certificate's private key (PEM)"},
      {"tls-client-ca", "FILE", "mTLS: clients must present a certificate signed by this CA (PEM)"},
      {"auth-token-file", "FILE",
       "calls need a bearer token listed in FILE (one per line; reread on SIGHUP; needs TLS). "
       "Health checks stay open"},
      {"admin-token-file", "FILE",
       "Warm needs a token listed in FILE (admin tokens are accepted everywhere; reread on "
       "SIGHUP; needs TLS). With it alone, the read calls need an admin token too"},
      {"open-reads", "",
       "with token files: GetKernel, GetManifest, Stats and reflection answer without a token "
       "(only Warm stays closed)"},
      {"allow-readable-secrets", "",
       "a --tls-key or token file that its group or others can read is a warning instead of "
       "a refusal"},
      {"metrics-listen", "HOST:PORT",
       "serve Prometheus metrics on GET /metrics at this address (port 0: any free one)"},
      {"log-format", "FORMAT",
       "text (kforge's lines, with each event's fields after them) or json (one object per "
       "line: ts, level, event, msg and the fields: key, module, duration_s, source, ...)",
       "text"},
      {"redis", "HOST:PORT",
       "share kernels with the fleet through this Redis (between the disk tier and a "
       "compile; a key missed by many servers at once is compiled by one). Redis down or "
       "slow only costs local compiles"},
      {"redis-password-file", "FILE",
       "Redis AUTH password (one line; else the KFORGE_REDIS_PASSWORD environment variable)"},
      {"redis-timeout", "DURATION",
       "a Redis call slower than this marks Redis down until a background ping succeeds",
       absl::FormatDuration(defaults.store.redis.timeout)},
      {"redis-lock-ttl", "DURATION",
       "expiry of the fleet-wide compile lock, renewed while its holder compiles: how long a "
       "dead holder delays the others",
       absl::FormatDuration(defaults.store.redis.lock_ttl)},
      {"help", "", "show this help", "", 'h'}};
  return WithEnvironment(std::move(flags));
}

}  // namespace

int Serve(const std::vector<std::string>& argv) {
  std::vector<FlagSpec> flags = ServeFlags();
  for (FlagSpec& hidden : WorkerFaultFlags()) flags.push_back(std::move(hidden));
  absl::StatusOr<ParsedArgs> args = ParseFlags(flags, argv);
  if (!args.ok()) return Fail(args.status());
  if (args->Has("help") || !args->positional.empty()) {
    std::cout << "usage: kforge serve [flags]\n\n"
                 "Serves kforge.v1.KernelService over gRPC (with health "
                 "checking and reflection) until SIGTERM or SIGINT.\n\n"
              << FlagsHelp(flags);
    return args->Has("help") ? 0 : 2;
  }
  ServerOptions options;
  options.listen = args->Get("listen");
  options.store.cache_dir = args->Get("cache-dir");
  options.warm_from = args->Get("warm-from");
  options.trust_key_file = args->Get("trust");
  if (const std::string file = args->Get("fleet-key"); !file.empty()) {
    absl::StatusOr<std::string> key = ReadFleetKeyFile(file);
    if (!key.ok()) return Fail(key.status());
    options.store.trust.fleet_key = *std::move(key);
  }
  // Alone, --trust still refuses unsigned bundles' entries in the cache; a
  // key that cannot be read is a typo, not a setting.
  if (!options.trust_key_file.empty() && options.warm_from.empty()) {
    if (absl::StatusOr<std::string> pem = ReadCredentialFile(options.trust_key_file, "--trust");
        !pem.ok()) {
      return Fail(pem.status());
    }
  }
  absl::StatusOr<long long> min_sequence =
      IntFlagInRange(*args, "trust-min-sequence", 0, int64_t{1} << 53);
  if (!min_sequence.ok()) return Fail(min_sequence.status());
  if (*min_sequence > 0 && options.trust_key_file.empty()) {
    return Fail(absl::InvalidArgumentError(
        "--trust-min-sequence needs --trust: an unsigned sequence proves nothing"));
  }
  options.trust_min_sequence = static_cast<uint64_t>(*min_sequence);
  options.security.tls_cert_file = args->Get("tls-cert");
  options.security.tls_key_file = args->Get("tls-key");
  options.security.tls_client_ca_file = args->Get("tls-client-ca");
  options.security.auth_token_file = args->Get("auth-token-file");
  options.security.admin_token_file = args->Get("admin-token-file");
  options.security.open_reads = args->Has("open-reads");
  options.security.secret_file_mode =
      args->Has("allow-readable-secrets") ? SecretFileMode::kWarn : SecretFileMode::kRefuse;
  options.metrics_listen = args->Get("metrics-listen");
  const absl::StatusOr<LogFormat> log_format = ParseLogFormat(args->Get("log-format"));
  if (!log_format.ok()) return Fail(log_format.status());
  options.log_format = *log_format;
  long long workers = 0, queue_limit = kAutoQueueLimit;
  for (absl::Status s : {IntFlag(*args, "workers", 1, kMaxWorkers, &workers),
                         args->Get("queue-limit") == "auto"
                             ? absl::OkStatus()
                             : IntFlag(*args, "queue-limit", 0, INT_MAX, &queue_limit)}) {
    if (!s.ok()) return Fail(s);
  }
  const absl::StatusOr<uint64_t> memory_bytes = SizeFlag(*args, "memory-cache-bytes");
  const absl::StatusOr<uint64_t> disk_bytes = SizeFlag(*args, "disk-cache-bytes");
  const absl::StatusOr<absl::Duration> timeout =
      DurationFlag(*args, "compile-timeout", absl::Milliseconds(1), kMaxDuration);
  const absl::StatusOr<absl::Duration> grace =
      DurationFlag(*args, "shutdown-grace", absl::ZeroDuration(), kMaxDuration);
  const absl::StatusOr<absl::Duration> failure_cache =
      DurationFlag(*args, "failed-compile-cache", absl::ZeroDuration(), kMaxDuration);
  const absl::StatusOr<absl::Duration> worker_failure_cache =
      DurationFlag(*args, "crashed-compile-cache", absl::ZeroDuration(), kMaxDuration);
  for (const absl::Status& s :
       {memory_bytes.status(), disk_bytes.status(), timeout.status(), grace.status(),
        failure_cache.status(), worker_failure_cache.status()}) {
    if (!s.ok()) return Fail(s);
  }
  options.store.memory_cache_bytes = *memory_bytes;
  options.store.disk_cache_bytes = *disk_bytes;
  options.store.pool.workers = static_cast<int>(workers);
  options.store.pool.queue_limit = static_cast<int>(queue_limit);
  options.store.pool.timeout = *timeout;
  options.shutdown_grace = *grace;
  options.store.failure_cache = *failure_cache;
  options.store.worker_failure_cache = *worker_failure_cache;
  absl::StatusOr<long long> max_jobs = IntFlagInRange(*args, "max-jobs-per-request", 1, INT_MAX);
  if (!max_jobs.ok()) return Fail(max_jobs.status());
  options.service.max_prebuild_jobs = static_cast<int>(*max_jobs);
  absl::StatusOr<WorkerFaults> faults = WorkerFaultsFromArgs(*args);
  if (!faults.ok()) return Fail(faults.status());
  options.store.pool.faults = *faults;
  if (absl::Status s = RedisFromArgs(*args, &options.store.redis); !s.ok()) return Fail(s);
  return RunServer(options);
}

int Get(const std::vector<std::string>& argv) {
  std::vector<FlagSpec> flags = {
      ServerFlag(),
      {"arch", "ARCH", "target: sm_80 sm_86 sm_89 sm_90a sm_100a sm_103a sm_120a sm_121a"},
      {"out", "DIR", "output directory", "out", 'o'},
      {"lookup-only", "", "fail with NOT_FOUND instead of compiling on a miss"},
      {"first-answer", "",
       "on a miss, take the module as soon as its main and combine entries are compiled "
       "(partial; the server caches the whole module for later requests) (env "
       "KFORGE_FIRST_ANSWER=1)"},
      {"timeout", "SECONDS", "deadline for the call (0: none)", "600"},
      {"help", "", "show this help", "", 'h'}};
  flags.insert(flags.begin() + 1, KernelChoiceFlags().begin(), KernelChoiceFlags().end());
  flags.insert(flags.end() - 1, ClientSecurityFlags().begin(), ClientSecurityFlags().end());
  absl::StatusOr<ParsedArgs> args = ParseFlags(flags, argv);
  if (!args.ok()) return Fail(args.status());
  if (args->Has("help")) {
    std::cout << "usage: kforge get [--server ADDR] (--preset NAME [--tp N] | "
                 "--spec FILE) --arch ARCH [-o DIR] [--lookup-only]\n"
                 "                 [--first-answer]\n"
                 "                 [--tls-ca FILE [--tls-cert FILE --tls-key FILE]] "
                 "[--token-file FILE]\n\n"
                 "Fetches one kernel module from a kforge server and writes "
                 "DIR/<module>.cubin (and DIR/<module>.cubin.<i> for a module's\n"
                 "further images) and DIR/<module>.json.\n\n"
              << FlagsHelp(flags);
    return 0;
  }
  if (!args->Has("arch")) {
    return Fail(absl::InvalidArgumentError("--arch is required (e.g. --arch sm_90a)"));
  }
  absl::StatusOr<v1::KernelSelector> selector = SelectorFromArgs(*args);
  if (!selector.ok()) return Fail(selector.status());
  const std::string arch = args->Get("arch");
  absl::StatusOr<long long> timeout_s = ParseIntFlag("timeout", args->Get("timeout"));
  if (!timeout_s.ok()) return Fail(timeout_s.status());
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(*timeout_s);

  const std::string address = args->Get("server");
  absl::StatusOr<std::shared_ptr<grpc::Channel>> connected = ConnectFromArgs(address, *args);
  if (!connected.ok()) return Fail(connected.status());
  std::shared_ptr<grpc::Channel> channel = *std::move(connected);
  auto stub = v1::KernelService::NewStub(channel);
  // The answer is checked as every client checks it before its name becomes
  // a file name: the manifest's variant for this selector and arch gives the
  // key, and the kernel must be that variant (CheckArtifactForVariant: a
  // safe module name, the key, an ELF cubin for the arch with the entries).
  v1::GetManifestRequest manifest_request;
  *manifest_request.mutable_kernel() = *selector;
  manifest_request.set_arch(arch);
  v1::Manifest manifest;
  {
    grpc::ClientContext context;
    if (*timeout_s > 0) context.set_deadline(deadline);  // 0: no deadline
    grpc::Status status = stub->GetManifest(&context, manifest_request, &manifest);
    if (!status.ok()) return FailCall(status, *channel, address, *args);
  }
  if (absl::Status valid = BundleManifestPath(manifest).status(); !valid.ok()) {
    return Fail(absl::DataLossError(
        absl::StrCat("kforge server at ", address, " answered a bad manifest: ", valid.message())));
  }
  const v1::ManifestVariant& variant = FirstChoice(manifest);
  v1::GetKernelRequest request;
  *request.mutable_kernel()->mutable_spec() = variant.spec();
  request.set_arch(arch);
  request.set_lookup_only(args->Has("lookup-only"));
  // The flag, else KFORGE_FIRST_ANSWER (the clients' setting).
  absl::StatusOr<ClientSettings> settings = ClientSettingsFromArgs(*args);
  if (!settings.ok()) return Fail(settings.status());
  request.set_first_answer(args->Has("first-answer") || settings->first_answer == "1");
  v1::GetKernelResponse response;
  {
    grpc::ClientContext context;
    if (*timeout_s > 0) context.set_deadline(deadline);
    grpc::Status status = stub->GetKernel(&context, request, &response);
    if (!status.ok()) return FailCall(status, *channel, address, *args);
  }
  const v1::KernelArtifact& artifact = response.artifact();
  if (absl::Status c = CheckAnswerForVariant(variant, arch, artifact, request.first_answer());
      !c.ok()) {
    return Fail(absl::DataLossError(
        absl::StrCat("kforge server at ", address, " answered a wrong kernel: ", c.message())));
  }
  const std::string base = absl::StrCat(args->Get("out"), "/", artifact.module_name());
  if (absl::Status s = WriteArtifactFiles(base, artifact); !s.ok()) return Fail(s);
  std::cout << absl::StrFormat(
      "%s.cubin  %s  %zu bytes  source %s  %.3f s%s\n", base, artifact.arch(), CubinBytes(artifact),
      ArtifactSourceName(response.source()), response.seconds(),
      artifact.partial()
          ? absl::StrCat("  first answer: ", artifact.cubin_info().kernels_size(), " of ",
                         variant.entries_size(), " entries (the whole module follows)")
          : "");
  return 0;
}

int Doctor(const std::vector<std::string>& argv) {
  const unsigned cores = std::thread::hardware_concurrency();
  // Every serve flag, read as serve reads it (KFORGE_<FLAG> too), so
  // `kforge doctor` with a unit's flags or environment checks that unit's
  // settings; those about no file or service here are accepted and unused.
  const std::vector<FlagSpec> flags = ServeFlags();
  absl::StatusOr<ParsedArgs> args = ParseFlags(flags, argv);
  if (!args.ok()) return Fail(args.status());
  if (args->Has("help") || !args->positional.empty()) {
    std::cout << "usage: kforge doctor [serve flags]\n\n"
                 "Checks the cache directory, Redis, the TLS files (readable, in date, the key "
                 "matching the certificate and private to its owner), the token files, who may "
                 "call what, and the workers `kforge serve` would use, and shows the GPU and "
                 "driver if there is one. Exit 1 when something the server needs is wrong.\n\n"
              << FlagsHelp(flags);
    return args->Has("help") ? 0 : 2;
  }
  bool healthy = true;
  auto problem = [&healthy](const std::string& line) {
    std::cout << line << "\n";
    healthy = false;
  };
  std::cout << "kforge " << KforgeVersion() << ", nvrtc " << NvrtcBuildIdentity() << ", format "
            << kFormatVersion << "\n";

  const std::string dir = args->Get("cache-dir");
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    std::cout << "cache: " << dir << " does not exist yet (kforge serve creates it)\n";
  } else if (absl::StatusOr<std::unique_ptr<DiskCache>> disk = DiskCache::Open(dir, UINT64_MAX);
             !disk.ok()) {
    problem(absl::StrCat("cache: ", dir, ": ", disk.status().message()));
  } else {
    const CacheUsage usage = (*disk)->Usage();
    std::cout << absl::StrFormat("cache: %s: %d kernels, %.1f MB, writable\n", dir, usage.entries,
                                 usage.bytes / 1e6);
  }

  long long workers = 0;
  if (absl::Status s = IntFlag(*args, "workers", 1, kMaxWorkers, &workers); !s.ok()) {
    problem(absl::StrCat("workers: ", s.message()));
  } else {
    std::cout << "workers: " << workers << " compile workers on " << cores << " cores\n";
  }

  const std::string listen = args->Get("listen");
  const bool allow_readable = args->Has("allow-readable-secrets");
  // A secret file's mode, as serve would judge it.
  auto check_secret = [&](const std::string& what, const std::string& flag) {
    const absl::Status mode = CheckSecretFileMode(args->Get(flag), absl::StrCat("--", flag));
    if (mode.ok()) return;
    if (allow_readable && absl::IsFailedPrecondition(mode)) {
      std::cout << what << ": warning: " << mode.message() << "\n";
    } else {
      problem(absl::StrCat(what, ": ", mode.message()));
    }
  };
  if (args->Get("tls-cert").empty() && args->Get("tls-key").empty()) {
    std::cout << "tls: off, plain text on " << listen
              << (IsLoopbackAddress(listen) ? " (loopback only)"
                                            : " (other hosts can reach it: use --tls-cert)")
              << "\n";
  } else {
    absl::StatusOr<std::string> cert = ReadCredentialFile(args->Get("tls-cert"), "--tls-cert");
    absl::StatusOr<std::string> key = ReadCredentialFile(args->Get("tls-key"), "--tls-key");
    for (const absl::Status& s : {cert.status(), key.status()}) {
      if (!s.ok()) problem(absl::StrCat("tls: ", s.message()));
    }
    absl::StatusOr<CertificateValidity> valid =
        cert.ok() ? CheckCertificateValidNow(*cert) : cert.status();
    if (cert.ok() && !valid.ok()) {
      problem(absl::StrCat("tls: --tls-cert ", args->Get("tls-cert"), ": ",
                           valid.status().message(), " (kforge serve refuses it)"));
    }
    if (key.ok()) check_secret("tls", "tls-key");
    if (cert.ok() && key.ok()) {
      if (absl::Status match = CheckKeyMatchesCertificate(*cert, *key); !match.ok()) {
        problem(absl::StrCat("tls: --tls-cert ", args->Get("tls-cert"), ", --tls-key ",
                             args->Get("tls-key"), ": ", match.message()));
      } else if (valid.ok()) {
        std::cout << "tls: on (" << args->Get("tls-cert") << ", valid until " << valid->not_after
                  << ")\n";
      }
    }
    if (const std::string ca = args->Get("tls-client-ca"); !ca.empty()) {
      absl::StatusOr<std::string> read = ReadCredentialFile(ca, "--tls-client-ca");
      if (!read.ok()) {
        problem(absl::StrCat("tls: ", read.status().message()));
      } else {
        std::cout << "mtls: clients need a certificate from " << ca << "\n";
      }
    }
  }
  ServerSecurityOptions security;
  security.tls_cert_file = args->Get("tls-cert");
  security.auth_token_file = args->Get("auth-token-file");
  security.admin_token_file = args->Get("admin-token-file");
  security.open_reads = args->Has("open-reads");
  for (const char* flag : {"auth-token-file", "admin-token-file"}) {
    const std::string file = args->Get(flag);
    if (file.empty()) continue;
    absl::StatusOr<std::vector<std::string>> tokens = ReadTokenFile(file, absl::StrCat("--", flag));
    if (!tokens.ok()) {
      problem(absl::StrCat("tokens: ", tokens.status().message()));
      continue;
    }
    std::cout << "tokens: " << file << ": " << tokens->size() << " token"
              << (tokens->size() == 1 ? "" : "s") << "\n";
    check_secret("tokens", flag);
  }
  if (security.tokens() && !security.tls()) {
    problem("tokens: --auth-token-file and --admin-token-file need --tls-cert and --tls-key");
  }
  for (const std::string& line : AccessLines(security)) std::cout << "access: " << line << "\n";

  RedisCacheOptions redis;
  if (const std::string file = args->Get("fleet-key"); !file.empty()) {
    absl::StatusOr<std::string> key = ReadFleetKeyFile(file);
    if (key.ok()) {
      redis.trust.fleet_key = *std::move(key);
      std::cout << "fleet key: " << file << " (entries are sealed and checked with it)\n";
    } else {
      problem(absl::StrCat("fleet key: ", key.status().message()));
    }
  } else {
    std::cout << "fleet key: none (disk entries integrity-checked only; --redis refused)\n";
  }
  if (absl::Status s = RedisFromArgs(*args, &redis); !s.ok()) {
    problem(absl::StrCat("redis: ", s.message()));
  } else if (redis.host.empty()) {
    std::cout << "redis: not configured (no shared tier)\n";
  } else {
    std::string why;
    redis.log = [&why](std::string_view line) { why = std::string(line); };
    absl::StatusOr<std::unique_ptr<RedisCache>> cache = RedisCache::Create(redis);
    if (cache.ok() && (*cache)->Counters().up) {
      std::cout << "redis: " << redis.host << ":" << redis.port << " reachable\n";
    } else {
      problem(absl::StrCat("redis: ", cache.ok() ? why : cache.status().message()));
    }
  }

  absl::StatusOr<const CudaDriver*> driver = CudaDriver::Get();
  int devices = 0;
  if (!driver.ok()) {
    std::cout << "gpu: none usable (" << driver.status().message()
              << "); kforge compiles and serves without one\n";
  } else if ((*driver)->Check((*driver)->DeviceGetCount(&devices), "cuDeviceGetCount").ok()) {
    std::cout << "driver: CUDA " << (*driver)->version() / 1000 << "."
              << (*driver)->version() % 1000 / 10 << ", " << devices << " GPU(s)\n";
    for (int i = 0; i < devices; ++i) {
      CUdevice device = 0;
      char name[256] = {};
      int major = 0, minor = 0;
      const CudaDriver& d = **driver;
      if (d.DeviceGet(&device, i) != CUDA_SUCCESS ||
          d.DeviceGetName(name, sizeof(name) - 1, device) != CUDA_SUCCESS ||
          d.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device) !=
              CUDA_SUCCESS ||
          d.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device) !=
              CUDA_SUCCESS) {
        std::cout << "gpu " << i << ": cannot be queried\n";
        continue;
      }
      std::cout << "gpu " << i << ": " << name << " (sm_" << major << minor << ")\n";
    }
  }
  return healthy ? 0 : 1;
}

int Health(const std::vector<std::string>& argv) {
  std::vector<FlagSpec> flags = {
      ServerFlag(),
      {"service", "NAME",
       "ask about one service (e.g. kforge.v1.KernelService) instead of the whole server"},
      {"timeout", "DURATION", "give up after this long (seconds, or 500ms, 2s)", "5s"},
      {"help", "", "show this help", "", 'h'}};
  flags.insert(flags.end() - 1, ClientSecurityFlags().begin(), ClientSecurityFlags().end());
  absl::StatusOr<ParsedArgs> args = ParseFlags(flags, argv);
  if (!args.ok()) return Fail(args.status());
  if (args->Has("help") || !args->positional.empty()) {
    std::cout << "usage: kforge health [--server ADDR] [--service NAME] [--timeout DURATION]\n"
                 "                     [--tls-ca FILE [--tls-cert FILE --tls-key FILE]]\n\n"
                 "Asks a server's grpc.health.v1 health service and prints its answer "
                 "(SERVING, NOT_SERVING, ...). Exit 0 when SERVING, 1 otherwise (also when "
                 "the server cannot be reached): a container HEALTHCHECK or a probe.\n\n"
              << FlagsHelp(flags);
    return args->Has("help") ? 0 : 2;
  }
  const absl::StatusOr<absl::Duration> timeout =
      DurationFlag(*args, "timeout", absl::Milliseconds(1), kMaxDuration);
  if (!timeout.ok()) return Fail(timeout.status());
  const std::string address = args->Get("server");
  absl::StatusOr<std::shared_ptr<grpc::Channel>> connected = ConnectFromArgs(address, *args);
  if (!connected.ok()) return Fail(connected.status());
  std::shared_ptr<grpc::Channel> channel = *std::move(connected);
  int status = 0;
  const grpc::Status call = CheckHealth(*channel, args->Get("service"), *timeout, &status);
  if (!call.ok()) {
    // An invalid argument here is the server's (an unknown service is
    // NOT_FOUND): unhealthy, not a usage error.
    FailCall(call, *channel, address, *args);
    return 1;
  }
  std::cout << ServingStatusName(status) << "\n";
  return status == static_cast<int>(ServingStatus::kServing) ? 0 : 1;
}

int Stats(const std::vector<std::string>& argv) {
  std::vector<FlagSpec> flags = {ServerFlag(), {"help", "", "show this help", "", 'h'}};
  flags.insert(flags.end() - 1, ClientSecurityFlags().begin(), ClientSecurityFlags().end());
  absl::StatusOr<ParsedArgs> args = ParseFlags(flags, argv);
  if (!args.ok()) return Fail(args.status());
  if (args->Has("help")) {
    std::cout << "usage: kforge stats [--server ADDR] [--tls-ca FILE [--tls-cert FILE --tls-key "
                 "FILE]] [--token-file FILE]\n\n"
                 "Prints a kforge server's counters (cache hits per tier, "
                 "misses, compiles, queue) as JSON.\n\n"
              << FlagsHelp(flags);
    return 0;
  }
  const std::string address = args->Get("server");
  absl::StatusOr<std::shared_ptr<grpc::Channel>> connected = ConnectFromArgs(address, *args);
  if (!connected.ok()) return Fail(connected.status());
  std::shared_ptr<grpc::Channel> channel = *std::move(connected);
  auto stub = v1::KernelService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::StatsResponse response;
  grpc::Status status = stub->Stats(&context, v1::StatsRequest(), &response);
  if (!status.ok()) return FailCall(status, *channel, address, *args);
  // Counters as JSON numbers (protobuf's JSON prints a uint64 as a string,
  // which jq and dashboards then have to convert), in field order.
  const google::protobuf::Descriptor* descriptor = response.GetDescriptor();
  const google::protobuf::Reflection* reflection = response.GetReflection();
  std::vector<std::string> lines;
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    // StatsResponse holds uint64 counters only; a field of another type
    // would need its own printing here.
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_UINT64) continue;
    lines.push_back(
        absl::StrCat("  \"", field->name(), "\": ", reflection->GetUInt64(response, field)));
  }
  std::cout << "{\n" << absl::StrJoin(lines, ",\n") << "\n}\n";
  return 0;
}

}  // namespace kforge::cli
