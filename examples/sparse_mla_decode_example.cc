// One sparse MLA decode step through kforge's C++ runtime, the way an
// inference engine would do it, checked against an fp64 CPU reference.
//
//   kforge_decode_example --server 127.0.0.1:50051 --preset glm-5 --tp 8
//   kforge_decode_example --bundle DIR --preset deepseek-v3.2 --tp 1 --batch 8
//
// Flags: --server ADDR or --bundle DIR (where kernels come from), --preset
// NAME and --tp N (the model; default glm-5 at TP 8), --batch B (requests,
// default 32), --seed S (inputs, default 1), --device N (GPU ordinal),
// --time-host N (after the check, time N more Run calls on the host: what
// one launch costs the engine's CPU; 0 = skip, the default).
// Exit status: 0 results within the error bars, 1 wrong results or a failed
// launch, 2 setup error (flags, no driver or GPU, server, bundle, ...).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bundle/bundle.h"
#include "bundle/kernel_source.h"
#include "model/selector.h"
#include "runtime/client.h"
#include "runtime/cuda_driver.h"
#include "runtime/sparse_mla_decode.h"
#include "tests/reference/sparse_mla_reference.h"

namespace kforge {
namespace {

constexpr char kUsage[] =
    "usage: kforge_decode_example (--server ADDR | --bundle DIR) [--preset NAME] "
    "[--tp N] [--batch B] [--seed S] [--device N] [--time-host N]\n";

struct Flags {
  std::string server;
  std::string bundle;
  std::string preset = "glm-5";
  int tp = 8;
  int batch = 32;
  int seed = 1;
  int device = 0;
  int time_host = 0;
};

// "--name value" or "--name=value".
absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  std::map<std::string, std::string> values;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) return absl::InvalidArgumentError("unexpected " + arg);
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      values[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      values[arg.substr(2)] = argv[++i];
    } else {
      return absl::InvalidArgumentError(arg + " needs a value");
    }
  }
  Flags f;
  for (const auto& [name, value] : values) {
    int* number = name == "tp"          ? &f.tp
                  : name == "batch"     ? &f.batch
                  : name == "seed"      ? &f.seed
                  : name == "device"    ? &f.device
                  : name == "time-host" ? &f.time_host
                                        : nullptr;
    if (number != nullptr) {
      if (!absl::SimpleAtoi(value, number)) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, ": not a number: ", value));
      }
    } else if (name == "server") {
      f.server = value;
    } else if (name == "bundle") {
      f.bundle = value;
    } else if (name == "preset") {
      f.preset = value;
    } else {
      return absl::InvalidArgumentError("unknown flag --" + name);
    }
  }
  if (f.time_host < 0) return absl::InvalidArgumentError("--time-host: must be >= 0");
  if (f.server.empty() == f.bundle.empty()) {
    return absl::InvalidArgumentError("give exactly one of --server and --bundle");
  }
  return f;
}

absl::StatusOr<std::unique_ptr<KernelSource>> OpenSource(const Flags& flags) {
  if (!flags.bundle.empty()) {
    absl::StatusOr<std::unique_ptr<BundleSource>> bundle = BundleSource::Open(flags.bundle);
    if (!bundle.ok()) return bundle.status();
    return std::unique_ptr<KernelSource>(*std::move(bundle));
  }
  ServiceClientOptions options;
  options.address = flags.server;
  absl::StatusOr<std::unique_ptr<ServiceClient>> client = ServiceClient::Create(options);
  if (!client.ok()) return client.status();
  return std::unique_ptr<KernelSource>(*std::move(client));
}

// What an engine fills from its own tensors: dense bf16 q [tokens, heads,
// d_qk], a paged bf16 KV cache [pages, page_block_size, d_qk], int32
// indices [tokens, topk], bf16 out [tokens, heads, d_v], fp32 lse [tokens,
// heads]. Strides are in elements.
DecodeArgs EngineArgs(const v1::AttentionSpec& spec, const DecodeArgs& device_tensors, int batch,
                      int num_pages) {
  DecodeArgs a;
  a.q = device_tensors.q;
  a.kv = device_tensors.kv;
  a.indices = device_tensors.indices;
  a.out = device_tensors.out;
  a.lse = device_tensors.lse;  // 0 if the engine does not need lse
  a.batch = batch;
  a.s_q = 1;
  a.num_q_heads = static_cast<int>(spec.num_q_heads());
  a.d_v = static_cast<int>(spec.kv_lora_rank());
  a.d_qk = a.d_v + static_cast<int>(spec.rope_dim());
  a.topk = static_cast<int>(spec.topk());
  a.page_block_size = static_cast<int>(spec.page_block_size());
  a.num_kv_slots = static_cast<int64_t>(num_pages) * a.page_block_size;
  a.q_head_stride = a.d_qk;
  a.q_token_stride = static_cast<int64_t>(a.num_q_heads) * a.d_qk;
  a.kv_row_stride = a.d_qk;
  a.kv_page_stride = static_cast<int64_t>(a.page_block_size) * a.d_qk;
  a.indices_stride = a.topk;
  a.out_head_stride = a.d_v;
  a.out_token_stride = static_cast<int64_t>(a.num_q_heads) * a.d_v;
  a.softmax_scale = spec.softmax_scale();  // the model's, e.g. 0.0625 for glm-5
  return a;
}

// Host time of Run (argument checks, plan, launches), the GPU work queued
// and not waited for inside the timed loop; the median of 5 rounds of n.
absl::Status TimeHost(SparseMlaDecode& attention, const DecodeArgs& args, CUstream stream, int n) {
  const CudaDriver& cu = **CudaDriver::Get();
  std::vector<double> us;
  for (int round = 0; round < 6; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      if (absl::Status s = attention.Run(args, stream); !s.ok()) return s;
    }
    const auto end = std::chrono::steady_clock::now();
    if (absl::Status s = cu.Check(cu.StreamSynchronize(stream), "cuStreamSynchronize"); !s.ok()) {
      return s;
    }
    if (round > 0) {  // round 0 warms up
      us.push_back(std::chrono::duration<double, std::micro>(end - start).count() / n);
    }
  }
  std::sort(us.begin(), us.end());
  std::printf("host time per Run (batch %d, %d calls x 5 rounds): median %.1f us, min %.1f us\n",
              args.batch, n, us[us.size() / 2], us.front());
  return absl::OkStatus();
}

int SetupError(const absl::Status& status) {
  std::fprintf(stderr, "kforge_decode_example: %s\n", status.ToString().c_str());
  return 2;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "kforge_decode_example: FAIL: %s\n", status.ToString().c_str());
  return 1;
}

int Main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fputs(kUsage, stderr);
    return SetupError(flags.status());
  }
  // 1. Where kernels come from, and the model they are for.
  absl::StatusOr<std::unique_ptr<KernelSource>> source = OpenSource(*flags);
  if (!source.ok()) return SetupError(source.status());
  v1::KernelSelector model;
  model.mutable_preset()->set_name(flags->preset);
  model.mutable_preset()->set_tensor_parallel(static_cast<uint32_t>(flags->tp));

  // 2. Engine start: the runtime reads the GPU's arch and SM count and
  //    fetches the manifest; Prefetch loads every kernel variant; Reserve
  //    sizes the split-K workspace so that Run never allocates (required
  //    before CUDA-graph capture).
  absl::StatusOr<std::unique_ptr<SparseMlaDecode>> decode =
      SparseMlaDecode::Create(**source, model, flags->device);
  if (!decode.ok()) return SetupError(decode.status());
  SparseMlaDecode& attention = **decode;
  if (absl::Status s = attention.Prefetch(); !s.ok()) return SetupError(s);
  if (absl::Status s = attention.Reserve(flags->batch); !s.ok()) return SetupError(s);
  std::printf("device %d: %s, %d SMs; %d kernel variants\n", flags->device,
              attention.arch().c_str(), attention.sm_count(), attention.manifest().variants_size());

  // 3. Inputs: random q, a paged KV cache and indices with some -1 and some
  //    repeated entries, copied to the GPU (the kernels' outputs are
  //    poisoned with 0xFF bytes first, so an unwritten row shows as NaN).
  //    The driver calls need the device's context current.
  const CudaDriver& cu = **CudaDriver::Get();  // Create succeeded: loaded
  if (absl::Status s = cu.Check(cu.CtxSetCurrent(attention.context()), "cuCtxSetCurrent");
      !s.ok()) {
    return SetupError(s);
  }
  // The model's spec, from the manifest's first choice (every variant
  // serves any s_q; this example decodes one token per request).
  // (SparseMlaDecode::Create refused a manifest of another kind.)
  const v1::AttentionSpec& spec = FirstChoice(attention.manifest()).spec().sparse_mla_decode();
  const HostDecodeProblem problem = MakeRandomDecodeProblem(
      spec, {.batch = flags->batch, .s_q = 1, .seed = static_cast<uint64_t>(flags->seed)});
  absl::StatusOr<std::unique_ptr<DeviceDecodeProblem>> tensors =
      DeviceDecodeProblem::Upload(cu, problem, spec.return_lse());
  if (!tensors.ok()) return SetupError(tensors.status());
  const DecodeArgs args = EngineArgs(spec, (*tensors)->args(), flags->batch, problem.num_pages);

  // 4. One decode step on the engine's stream.
  absl::StatusOr<Selection> plan = attention.Plan(args);
  if (!plan.ok()) return Fail(plan.status());
  std::printf("%s", DescribeSelection(*plan).c_str());
  CUstream stream = nullptr;
  if (absl::Status s = cu.Check(cu.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
      !s.ok()) {
    return SetupError(s);
  }
  absl::Status run = attention.Run(args, stream);
  if (run.ok()) run = cu.Check(cu.StreamSynchronize(stream), "cuStreamSynchronize");
  if (run.ok() && flags->time_host > 0) run = TimeHost(attention, args, stream, flags->time_host);
  (void)cu.StreamDestroy(stream);
  if (!run.ok()) return Fail(run);

  // 5. Compare with the fp64 reference.
  std::vector<uint16_t> out;
  std::vector<float> lse;
  if (absl::Status s = (*tensors)->Download(&out, &lse); !s.ok()) return Fail(s);
  const DecodeErrors errors = CompareWithReference(problem, ReferenceDecode(problem), out, lse);
  std::printf("batch %d, %d heads, topk %d: %s\n", flags->batch, args.num_q_heads, args.topk,
              errors.Summary().c_str());
  return errors.pass ? 0 : 1;
}

}  // namespace
}  // namespace kforge

int main(int argc, char** argv) { return kforge::Main(argc, argv); }
