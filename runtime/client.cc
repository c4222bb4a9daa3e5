#include "runtime/client.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/absl_compat.h"
#include "bundle/bundle.h"
#include "grpcpp/grpcpp.h"
#include "kforge/v1/service.grpc.pb.h"
#include "model/spec.h"

namespace kforge {
namespace {

// A server that is down or restarting, and a full compile queue, are
// passing conditions; any other answer is final.
bool IsRetryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

absl::Status ValidateOptions(const ServiceClientOptions& o) {
  if (o.address.empty()) return absl::InvalidArgumentError("address: empty");
  if (o.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("deadline: got ", absl::FormatDuration(o.deadline), ", must be > 0"));
  }
  if (o.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts: got ", o.max_attempts, ", must be >= 1"));
  }
  if (o.initial_backoff < absl::ZeroDuration() || o.max_backoff < o.initial_backoff) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff: got initial ", absl::FormatDuration(o.initial_backoff), " and max ",
                     absl::FormatDuration(o.max_backoff), ", must be 0 <= initial <= max"));
  }
  if (o.max_message_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes: got ", o.max_message_bytes, ", must be >= 1"));
  }
  return absl::OkStatus();
}

int BackoffMillis(absl::Duration d) {
  return static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

std::shared_ptr<grpc::Channel> Connect(const ServiceClientOptions& o,
                                       std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(o.max_message_bytes);
  args.SetMaxSendMessageSize(o.max_message_bytes);
  // gRPC waits its own reconnect backoff (1 s, growing to 120 s) after a
  // failed connection and fails calls at once meanwhile; kept to ours, each
  // of our attempts after a wait really tries to connect again.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, BackoffMillis(o.initial_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, BackoffMillis(o.max_backoff));
  return grpc::CreateCustomChannel(o.address, std::move(credentials), args);
}

// The wait before retry number `retry` (1 = before the second attempt):
// initial * 2^(retry - 1), capped at max, times a random factor in
// [0.5, 1] so that clients that failed together do not retry together.
absl::Duration Backoff(const ServiceClientOptions& o, int retry) {
  absl::Duration nominal = o.initial_backoff;
  for (int i = 1; i < retry && nominal < o.max_backoff; ++i) nominal *= 2;
  nominal = std::min(nominal, o.max_backoff);
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return nominal * std::uniform_real_distribution<double>(0.5, 1.0)(rng);
}

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace

struct ServiceClient::State {
  ServiceClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::KernelService::Stub> stub;
  std::atomic<int64_t> rpc_attempts{0};

  absl::Mutex mu;
  std::map<std::string, ArtifactRef> kernels ABSL_GUARDED_BY(mu);  // by key
  // By serialized selector + '\0' + arch as asked.
  std::map<std::string, v1::Manifest> manifests ABSL_GUARDED_BY(mu);

  // Set once at Create, before any other thread sees the state; the writer
  // it points to is not thread-safe.
  absl::Mutex local_copy_mu;
  std::unique_ptr<BundleWriter> local_copy ABSL_PT_GUARDED_BY(local_copy_mu);  // null: none

  // One RPC with retries. `rpc` makes one attempt with the context given.
  absl::Status Call(std::string_view what,
                    const std::function<grpc::Status(grpc::ClientContext*)>& rpc);
  // Runs `add` on the local copy and rewrites its checksums (no-op without
  // one).
  absl::Status KeepLocalCopy(const std::function<absl::Status(BundleWriter&)>& add);
};

absl::Status ServiceClient::State::Call(
    std::string_view what, const std::function<grpc::Status(grpc::ClientContext*)>& rpc) {
  const absl::Time start = absl::Now();
  grpc::Status last;
  for (int attempt = 1; attempt <= options.max_attempts; ++attempt) {
    if (attempt > 1) absl::SleepFor(Backoff(options, attempt - 1));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options.deadline));
    ++rpc_attempts;
    last = rpc(&context);
    if (last.ok()) return absl::OkStatus();
    if (last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::DeadlineExceededError(
          absl::StrCat(AsAbsl(what), ": kforge server at ", options.address,
                       " gave no answer within ", absl::FormatDuration(options.deadline),
                       " (ServiceClientOptions::deadline; a cold compile may wait behind a full "
                       "queue): ",
                       last.error_message()));
    }
    if (!IsRetryable(last.error_code())) {
      return absl::Status(static_cast<absl::StatusCode>(last.error_code()),
                          absl::StrCat(AsAbsl(what), ": kforge server at ", options.address, ": ",
                                       last.error_message()));
    }
  }
  return absl::UnavailableError(
      absl::StrFormat("%s: no answer from kforge server at %s: %d attempts over %.1f s failed, the "
                      "last with %s: %s. Start `kforge serve --listen %s` (or point the client at "
                      "a running server), or run from a prebuilt bundle (`kforge prebuild`, "
                      "BundleSource) with no server",
                      AsAbsl(what), options.address, options.max_attempts,
                      absl::ToDoubleSeconds(absl::Now() - start), CodeName(last.error_code()),
                      ExplainTransportError(last, options.security.UsesTls(),
                                            !options.security.tls_cert_file.empty()),
                      options.address));
}

absl::Status ServiceClient::State::KeepLocalCopy(
    const std::function<absl::Status(BundleWriter&)>& add) {
  if (local_copy == nullptr) return absl::OkStatus();
  absl::MutexLock lock(&local_copy_mu);
  absl::Status s = add(*local_copy);
  if (s.ok()) s = local_copy->Finish();
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("cannot keep the local copy in ", local_copy->dir(),
                                             ": ", s.message()));
}

absl::StatusOr<std::unique_ptr<ServiceClient>> ServiceClient::Create(ServiceClientOptions options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(options.security);
  if (!credentials.ok()) return credentials.status();
  auto state = std::make_unique<State>();
  if (!options.local_copy_dir.empty()) {
    absl::StatusOr<std::unique_ptr<BundleWriter>> writer =
        BundleWriter::Open(options.local_copy_dir, BundleLocking::kPerWrite);
    if (!writer.ok()) return writer.status();
    state->local_copy = *std::move(writer);
  }
  state->channel = Connect(options, *std::move(credentials));
  state->stub = v1::KernelService::NewStub(state->channel);
  state->options = std::move(options);
  return std::unique_ptr<ServiceClient>(new ServiceClient(std::move(state)));
}

namespace {

ServiceClientOptions WithSettings(const ClientSettings& settings, ServiceClientOptions options) {
  options.address = settings.server;
  options.local_copy_dir = settings.local_copy_dir;
  options.security = settings.security;
  if (!settings.first_answer.empty()) options.first_answer = settings.first_answer == "1";
  return options;
}

}  // namespace

absl::StatusOr<ServiceClientOptions> ServiceClientOptionsFromEnvironment(
    const ClientSettings& given, ServiceClientOptions options) {
  absl::StatusOr<ClientSettings> settings =
      ClientSettingsFromEnvironment(given, ClientSource::kServer);
  if (!settings.ok()) return settings.status();
  return WithSettings(*settings, std::move(options));
}

absl::StatusOr<std::unique_ptr<KernelSource>> OpenKernelSourceFromEnvironment(
    const ClientSettings& given, ServiceClientOptions options) {
  absl::StatusOr<ClientSettings> settings =
      ClientSettingsFromEnvironment(given, ClientSource::kServerOrBundle);
  if (!settings.ok()) return settings.status();
  if (!settings->bundle.empty()) {
    absl::StatusOr<std::unique_ptr<BundleSource>> bundle =
        BundleSource::Open(settings->bundle, settings->trust);
    if (!bundle.ok()) {
      return absl::Status(bundle.status().code(),
                          absl::StrCat(settings->names.bundle, ": ", bundle.status().message()));
    }
    return std::unique_ptr<KernelSource>(*std::move(bundle));
  }
  absl::StatusOr<std::unique_ptr<ServiceClient>> client =
      ServiceClient::Create(WithSettings(*settings, std::move(options)));
  if (!client.ok()) return client.status();
  return std::unique_ptr<KernelSource>(*std::move(client));
}

ServiceClient::ServiceClient(std::unique_ptr<State> state) : state_(std::move(state)) {}
ServiceClient::~ServiceClient() = default;

int64_t ServiceClient::rpc_attempts() const { return state_->rpc_attempts.load(); }

const ServiceClientOptions& ServiceClient::options() const { return state_->options; }

absl::StatusOr<v1::Manifest> ServiceClient::GetManifest(const v1::KernelSelector& kernel,
                                                        std::string_view arch) {
  State& s = *state_;
  std::string memo_key = kernel.SerializeAsString();
  memo_key.push_back('\0');
  memo_key.append(arch);
  {
    absl::MutexLock lock(&s.mu);
    auto hit = s.manifests.find(memo_key);
    if (hit != s.manifests.end()) return hit->second;
  }
  v1::GetManifestRequest request;
  *request.mutable_kernel() = kernel;
  request.set_arch(std::string(arch));
  v1::Manifest manifest;
  absl::Status called = s.Call("GetManifest", [&](grpc::ClientContext* context) {
    manifest.Clear();
    return s.stub->GetManifest(context, request, &manifest);
  });
  if (!called.ok()) return called;
  // BundleManifestPath checks what using a manifest relies on: a variant
  // and an in-range first choice.
  absl::Status valid = BundleManifestPath(manifest).status();
  if (!valid.ok()) {
    return absl::DataLossError(absl::StrCat("kforge server at ", s.options.address,
                                            " answered a bad manifest: ", valid.message()));
  }
  if (absl::Status c = s.KeepLocalCopy([&](BundleWriter& w) { return w.AddManifest(manifest); });
      !c.ok()) {
    return c;
  }
  absl::MutexLock lock(&s.mu);
  return s.manifests.emplace(std::move(memo_key), std::move(manifest)).first->second;
}

absl::StatusOr<ArtifactRef> ServiceClient::GetKernel(const v1::ManifestVariant& variant,
                                                     std::string_view arch) {
  State& s = *state_;
  {
    absl::MutexLock lock(&s.mu);
    auto hit = s.kernels.find(variant.key());
    if (hit != s.kernels.end()) return hit->second;
  }
  v1::GetKernelRequest request;
  *request.mutable_kernel()->mutable_spec() = variant.spec();
  request.set_arch(std::string(arch));
  request.set_first_answer(s.options.first_answer);
  v1::GetKernelResponse response;
  absl::Status called =
      s.Call(absl::StrCat("GetKernel ", variant.module_name()), [&](grpc::ClientContext* context) {
        response.Clear();
        return s.stub->GetKernel(context, request, &response);
      });
  if (!called.ok()) return called;
  if (absl::Status c =
          CheckAnswerForVariant(variant, arch, response.artifact(), s.options.first_answer);
      !c.ok()) {
    return absl::DataLossError(absl::StrCat("kforge server at ", s.options.address,
                                            " answered a wrong kernel: ", c.message()));
  }
  auto artifact =
      std::make_shared<const v1::KernelArtifact>(std::move(*response.mutable_artifact()));
  // Asked again, the key gets the whole module once the server has it.
  if (artifact->partial()) return ArtifactRef(artifact);
  if (absl::Status c = s.KeepLocalCopy([&](BundleWriter& w) { return w.AddKernel(*artifact); });
      !c.ok()) {
    return c;
  }
  absl::MutexLock lock(&s.mu);
  return s.kernels.emplace(variant.key(), std::move(artifact)).first->second;
}

}  // namespace kforge
