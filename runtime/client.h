#ifndef KFORGE_RUNTIME_CLIENT_H_
#define KFORGE_RUNTIME_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bundle/kernel_source.h"
#include "kforge/v1/service.pb.h"
#include "runtime/channel.h"
#include "runtime/client_settings.h"

namespace kforge {

struct ServiceClientOptions {
  // A `kforge serve` address (the CLI's default).
  std::string address = "127.0.0.1:50051";
  // Deadline of each RPC attempt. A cold compile takes about a second on the
  // server, but waits behind others in its compile queue; two minutes covers
  // an engine fleet starting at once without hiding a server that hangs.
  absl::Duration deadline = absl::Seconds(120);
  // RPC attempts in all (>= 1). UNAVAILABLE (server down or restarting) and
  // RESOURCE_EXHAUSTED (compile queue full) are retried; nothing else is.
  int max_attempts = 5;
  // Wait before the second attempt; it doubles for each further one, up to
  // max_backoff, and every wait is jittered down to half of it (at random)
  // so that many clients do not retry in step. With the defaults, five
  // attempts span at most 0.1 + 0.2 + 0.4 + 0.8 = 1.5 s of waiting.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // "" keeps no copy. Otherwise every manifest and kernel fetched is also
  // written to this bundle directory (BundleWriter, checksums rewritten
  // after each), so that the engine can later run from it with no server
  // through BundleSource. A fetch whose copy cannot be written fails.
  std::string local_copy_dir;
  // Cubins are megabytes; gRPC's default limit is 4 MB. Same bound as the
  // server's.
  int max_message_bytes = 256 << 20;
  // TLS (tls_ca_file), a client certificate (mTLS) and a bearer token
  // (token or token_file); plain text by default.
  ChannelSecurityOptions security;
  // Ask for first answers (GetKernelRequest.first_answer): on a server's
  // miss, a kernel comes back as soon as its main and combine entries are
  // compiled (KernelArtifact.partial: correct for every shape, the small-
  // batch and cluster paths left out). A first answer is neither kept in
  // memory nor copied to local_copy_dir, so asking for the key again gets
  // the whole module once the server has cached it.
  bool first_answer = false;
};

// A KernelSource backed by a `kforge serve` process (kforge.v1.KernelService
// over gRPC). Keeps what it fetched in memory (kernels by key, manifests by
// selector and arch), so asking again makes no RPC; answers that fail
// CheckArtifactForVariant are DataLoss and never kept. Thread-safe.
class ServiceClient : public KernelSource {
 public:
  // InvalidArgument for bad options; errors of BundleWriter::Open for the
  // local copy. Connects lazily: a server that is down fails the first call,
  // not Create.
  static absl::StatusOr<std::unique_ptr<ServiceClient>> Create(ServiceClientOptions options);
  ~ServiceClient() override;

  absl::StatusOr<v1::Manifest> GetManifest(const v1::KernelSelector& kernel,
                                           std::string_view arch) override;
  // Asks for KernelSelector{spec = variant.spec()} on `arch` (with
  // options().first_answer, the answer may be a first answer).
  absl::StatusOr<ArtifactRef> GetKernel(const v1::ManifestVariant& variant,
                                        std::string_view arch) override;

  // RPC attempts made so far, retries included (calls answered from memory
  // make none).
  int64_t rpc_attempts() const;

  const ServiceClientOptions& options() const;

 private:
  struct State;
  explicit ServiceClient(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// For an engine configured by its environment (README, "Client
// settings"): `options` with its address, local copy and security taken
// from ClientSettingsFromEnvironment(given, kServer): what `given` says,
// else KFORGE_SERVER, KFORGE_LOCAL_COPY_DIR, KFORGE_TLS_CA, KFORGE_TLS_CERT
// + KFORGE_TLS_KEY, KFORGE_TOKEN or KFORGE_TOKEN_FILE (and first_answer
// from KFORGE_FIRST_ANSWER where either sets it); the address
// defaults to kDefaultServerAddress. `options`' own address, local_copy_dir
// and security are not read; its deadline, retries and message size are
// kept. Errors name the setting or variable that is wrong.
absl::StatusOr<ServiceClientOptions> ServiceClientOptionsFromEnvironment(
    const ClientSettings& given = {}, ServiceClientOptions options = {});

// The kernel source such an engine reads from, as the Python package's
// kforge.default_source(): the bundle `given` or KFORGE_BUNDLE names
// (BundleSource, refused unless signed by the trust key `given` or
// KFORGE_TRUST names, when one does), else a ServiceClient with the settings above
// (ClientSettingsFromEnvironment(given, kServerOrBundle) has the rule).
absl::StatusOr<std::unique_ptr<KernelSource>> OpenKernelSourceFromEnvironment(
    const ClientSettings& given = {}, ServiceClientOptions options = {});

}  // namespace kforge

#endif  // KFORGE_RUNTIME_CLIENT_H_
