#ifndef KFORGE_CAPI_KFORGE_CAPI_H_
#define KFORGE_CAPI_KFORGE_CAPI_H_

/* A C ABI over kforge's model and bundle libraries (specs, presets, arch
 * rules, the selector, the decode plan, artifact checks, bundles) and its
 * kernel module loader (runtime/kernel_module.h), so that other languages
 * use these rules and that loader instead of re-implementing them. The
 * Python package binds it with ctypes (python/kforge/_capi.py): one shared
 * library serves every Python version and needs no Python headers.
 *
 * Conventions, for every function below:
 *  - The return value is an absl::StatusCode (0 = OK, 3 = INVALID_ARGUMENT,
 *    5 = NOT_FOUND, 9 = FAILED_PRECONDITION, 11 = OUT_OF_RANGE,
 *    15 = DATA_LOSS, ...).
 *  - `error` may be NULL. Otherwise *error is NULL on success and, on
 *    failure, a NUL-terminated message naming the field and the value.
 *  - Protobuf messages cross as serialized bytes of kforge.v1 messages
 *    (pointer + size); bytes that do not parse are INVALID_ARGUMENT.
 *  - Every output (bytes, strings, error messages) is allocated here and
 *    released with kforge_free. Outputs are written only on success.
 *  - Nothing throws across the ABI; NULL or hostile input gives an error.
 *    No pointer to an input is kept after a call returns.
 *  - Thread safety: free functions may be called concurrently; a bundle or
 *    bundle writer handle is used by one thread at a time; a module handle
 *    by any number of threads until it is closed. */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any change of a signature or a struct below. */
#define KFORGE_CAPI_VERSION 14

int32_t kforge_capi_version(void);

/* sizeof of a struct as this library was built, for bindings to check
 * their mirrors: "KforgeDevice", "KforgeShape", "KforgeDecodeArgs",
 * "DecodeParams", "CombineParams", "KforgeIndexerLogitsArgs",
 * "KforgeIndexerTopkArgs", "KforgeEntryParams", and the indexer's
 * parameter blocks "LogitsParams", "TopkParams" (what a loader checks an
 * entry's params_bytes against, by role). 0 for any other name. */
size_t kforge_sizeof(const char* struct_name);

void kforge_free(void* p);

/* offsetof a pointer field of a parameter block as this library was built:
 * struct "DecodeParams" (fields q, kv, indices, out, lse, o_accum,
 * lse_accum, topk_length, sink, extra_kv, extra_indices,
 * extra_topk_length) or "CombineParams" (o_accum, lse_accum,
 * out, lse, sink). SIZE_MAX for any other name. With
 * kforge_decode_pointer_modulus, lets a binding reuse one
 * kforge_plan_decode result for other pointers. */
size_t kforge_offsetof(const char* struct_name, const char* field);

/* model/decode_plan.h kDecodePointerModulus: kforge_plan_decode's result
 * for pointers that are null where another call's were and equal to them
 * modulo this value is that call's, with the pointers in the parameter
 * blocks replaced (o_accum and lse_accum move with the workspace). */
int32_t kforge_decode_pointer_modulus(void);

/* model/selector.h DeviceInfo. */
typedef struct KforgeDevice {
  const char* arch;            /* "sm_90a", "90a", ...; not NULL */
  int32_t sm_count;            /* >= 1 */
  int32_t forced_num_splits;   /* 0: the launch rule's; else 1..max_splits */
  int32_t max_active_clusters; /* clusters of the cluster entry the device
                                  runs at once (cuOccupancyMaxActiveClusters);
                                  0: none, so it is never chosen */
} KforgeDevice;

/* model/selector.h RuntimeShape. */
typedef struct KforgeShape {
  int32_t batch;
  int32_t s_q;
  int32_t num_q_heads;
  int32_t topk;
  int32_t page_block_size;
  int32_t kv_dtype; /* kforge.v1.KvCacheDtype value (1 = bf16) */
} KforgeShape;

/* model/decode_plan.h DecodeArgs, field for field (see there for shapes,
 * strides and nullability). Pointers are device addresses. */
typedef struct KforgeDecodeArgs {
  uint64_t q;
  uint64_t kv;
  uint64_t indices;
  uint64_t out;
  uint64_t lse;         /* 0: not wanted */
  uint64_t topk_length; /* 0: every token's topk indices count */
  uint64_t sink;        /* 0: no attention sink */
  int32_t batch;
  int32_t s_q;
  int32_t num_q_heads;
  int32_t d_qk;
  int32_t d_v;
  int32_t topk;
  int32_t page_block_size;
  int32_t kv_dtype;
  int32_t topk_length_tokens; /* 1 (or 0): a length per query token; s_q: per request */
  int32_t reserved;           /* 0 */
  int64_t num_kv_slots;
  int64_t q_token_stride;
  int64_t q_head_stride;
  int64_t kv_page_stride;
  int64_t kv_row_stride;
  int64_t indices_stride;
  int64_t out_token_stride;
  int64_t out_head_stride;
  double softmax_scale;
  /* The extra KV cache (v6), for kernels built with one (spec extra_kv);
   * all 0 otherwise. */
  uint64_t extra_kv;
  uint64_t extra_indices;
  uint64_t extra_topk_length; /* 0: every token's extra_topk indices count */
  int32_t extra_topk;
  int32_t extra_page_block_size;
  int32_t extra_kv_dtype;
  int32_t extra_reserved; /* 0 */
  int64_t extra_num_kv_slots;
  int64_t extra_kv_page_stride;
  int64_t extra_kv_row_stride;
  int64_t extra_indices_stride;
} KforgeDecodeArgs;

/* ---- specs (model/spec.h) ---- */

/* The sparse MLA spec (serialized kforge.v1.AttentionSpec, the
 * KernelSpec.sparse_mla_decode case) of a preset at a tensor-parallel
 * degree. */
int32_t kforge_spec_from_preset(const char* name, int32_t tensor_parallel, int32_t kv_dtype,
                                uint8_t** spec, size_t* spec_size, char** error);
/* ParseKvDtype: a KV cache dtype name ("bf16", "fp8_ds_mla", ...; any
 * case; or a KV_CACHE_DTYPE_* name) -> its kforge.v1.KvCacheDtype value. */
int32_t kforge_parse_kv_dtype(const char* name, int32_t* kv_dtype, char** error);
/* ParseKvScaleFormat: "pow2" / "arbitrary" (any case; or a
 * KV_SCALE_FORMAT_* name) -> its kforge.v1.KvScaleFormat value. */
int32_t kforge_parse_kv_scale_format(const char* name, int32_t* kv_scale_format, char** error);
/* Validates a serialized kforge.v1.KernelSpec of any kind (its case's
 * rules: model/spec.h ValidateSpec, model/indexer_spec.h
 * ValidateIndexerSpec; since version 14, a flat AttentionSpec before). */
int32_t kforge_validate_spec(const uint8_t* spec, size_t spec_size, char** error);
/* NormalizeKernelSpec (validates first): KernelSpec in, KernelSpec out
 * (since version 14). */
int32_t kforge_normalize_spec(const uint8_t* spec, size_t spec_size, uint8_t** normalized,
                              size_t* normalized_size, char** error);
/* ParseSpecText: a spec file's text (JSON or text proto, the KernelSpec
 * form or the flat form of a sparse MLA spec) -> serialized
 * kforge.v1.KernelSpec (since version 13; AttentionSpec before); not
 * validated. */
int32_t kforge_parse_spec(const char* text, size_t text_size, uint8_t** spec, size_t* spec_size,
                          char** error);
/* The preset names, one per line. */
int32_t kforge_presets(char** names, char** error);

/* ---- archs (model/arch.h) ---- */

/* ParseArch's canonical name ("90a" -> "sm_90a"); FAILED_PRECONDITION for
 * a target kforge does not build for. */
int32_t kforge_canonical_arch(const char* name, char** canonical, char** error);
/* ArchForComputeCapability. */
int32_t kforge_arch_for_capability(int32_t major, int32_t minor, char** arch, char** error);
/* CheckDeviceArch: OK when a cubin for `arch` runs on compute capability
 * major.minor. */
int32_t kforge_check_device_arch(const char* arch, int32_t major, int32_t minor, char** error);

/* ---- selection and planning (model/selector.h, model/decode_plan.h) ---- */

/* Select -> a serialized kforge.v1.LaunchPlan without parameter blocks. */
int32_t kforge_select(const uint8_t* manifest, size_t manifest_size, const KforgeDevice* device,
                      const KforgeShape* shape, uint8_t** plan, size_t* plan_size, char** error);
/* PlanDecode -> a serialized LaunchPlan with main_params (and
 * combine_params when it needs a combine), for a workspace at `workspace`
 * holding plan.workspace_bytes (0 when none is needed). */
int32_t kforge_plan_decode(const uint8_t* manifest, size_t manifest_size,
                           const KforgeDevice* device, const KforgeDecodeArgs* args,
                           uint64_t workspace, uint8_t** plan, size_t* plan_size, char** error);
/* KvLayoutOf: the bytes of one token's cache record and the size of the
 * element the cache's strides count (2 for bf16, 1 for the quantised
 * records). A page-blocked record (fp8_ds_mla_v4, mxfp8_ds_mla_v41) needs
 * kv_row_stride equal to row_bytes. */
int32_t kforge_kv_layout(const uint8_t* spec, size_t spec_size, int32_t* row_bytes,
                         int32_t* element_bytes, char** error);
/* ExtraKvLayoutOf: the same for the spec's extra cache (extra_kv);
 * INVALID_ARGUMENT for a spec without one. */
int32_t kforge_extra_kv_layout(const uint8_t* spec, size_t spec_size, int32_t* row_bytes,
                               int32_t* element_bytes, char** error);
/* WorkspaceBytesFor. */
int32_t kforge_workspace_bytes_for(const uint8_t* manifest, size_t manifest_size,
                                   const KforgeDevice* device, int32_t max_tokens, uint64_t* bytes,
                                   char** error);

/* ---- artifacts (model/artifact_check.h, model/launch_plan.h) ---- */

/* CheckArtifactForVariant (variant: ManifestVariant, artifact:
 * KernelArtifact); DATA_LOSS naming the first mismatch. */
int32_t kforge_check_artifact(const uint8_t* variant, size_t variant_size, const char* arch,
                              const uint8_t* artifact, size_t artifact_size, char** error);
/* CheckAnswerForVariant: as kforge_check_artifact, and with accept_partial
 * != 0 a first answer (KernelArtifact.partial) is checked against the
 * variant's FirstAnswerVariant instead of refused. */
int32_t kforge_check_answer(const uint8_t* variant, size_t variant_size, const char* arch,
                            const uint8_t* artifact, size_t artifact_size, int32_t accept_partial,
                            char** error);
/* ManifestForArtifact: a one-variant Manifest for a compiled kernel. */
int32_t kforge_manifest_for_artifact(const uint8_t* artifact, size_t artifact_size,
                                     uint8_t** manifest, size_t* manifest_size, char** error);

/* ---- bundles (bundle/bundle.h) ---- */

/* BundleKernelPath / BundleManifestPath: a file's path in a bundle. */
int32_t kforge_bundle_kernel_path(const char* key, char** path, char** error);
int32_t kforge_bundle_manifest_path(const uint8_t* manifest, size_t manifest_size, char** path,
                                    char** error);

typedef struct KforgeBundle KforgeBundle;
/* BundleSource::Open. Close with kforge_bundle_close. */
int32_t kforge_bundle_open(const char* dir, KforgeBundle** bundle, char** error);
/* BundleSource::Open with a trust key: an Ed25519 public key (PEM file) the
 * bundle's checksums.sha256 must be signed by. */
int32_t kforge_bundle_open_trusted(const char* dir, const char* trust_key_file,
                                   KforgeBundle** bundle, char** error);
void kforge_bundle_close(KforgeBundle* bundle);
/* The bundle's index-th manifest (in checksum-list order); OUT_OF_RANGE
 * past the last. */
int32_t kforge_bundle_manifest(KforgeBundle* bundle, int32_t index, uint8_t** manifest,
                               size_t* manifest_size, char** error);
/* BundleSource::GetManifest (selector: KernelSelector). */
int32_t kforge_bundle_get_manifest(KforgeBundle* bundle, const uint8_t* selector,
                                   size_t selector_size, const char* arch, uint8_t** manifest,
                                   size_t* manifest_size, char** error);
/* BundleSource::GetKernel (variant: ManifestVariant) -> KernelArtifact. */
int32_t kforge_bundle_get_kernel(KforgeBundle* bundle, const uint8_t* variant, size_t variant_size,
                                 const char* arch, uint8_t** artifact, size_t* artifact_size,
                                 char** error);

typedef struct KforgeBundleWriter KforgeBundleWriter;
/* BundleWriter::Open; per_write_locking != 0 is BundleLocking::kPerWrite
 * (a client's local copy shared by processes), 0 kWholeRun. */
int32_t kforge_bundle_writer_open(const char* dir, int32_t per_write_locking,
                                  KforgeBundleWriter** writer, char** error);
void kforge_bundle_writer_close(KforgeBundleWriter* writer);
int32_t kforge_bundle_writer_has_kernel(KforgeBundleWriter* writer, const char* key, int32_t* has,
                                        char** error);
int32_t kforge_bundle_writer_add_kernel(KforgeBundleWriter* writer, const uint8_t* artifact,
                                        size_t artifact_size, char** error);
int32_t kforge_bundle_writer_add_manifest(KforgeBundleWriter* writer, const uint8_t* manifest,
                                          size_t manifest_size, char** error);
int32_t kforge_bundle_writer_finish(KforgeBundleWriter* writer, char** error);

/* ReadCredentialFile (base/credentials.h): a PEM certificate or key file,
 * a regular file under the size cap; errors name `what` and the path. */
int32_t kforge_read_credential_file(const char* path, const char* what, char** text, char** error);
/* ReadTokenFile: the first bearer token of a token file. */
int32_t kforge_read_token_file(const char* path, const char* what, char** token, char** error);

/* ---- client settings (runtime/client_settings.h) ---- */

/* A kforge client's settings: ClientSettingsFromEnvironment (what `given`
 * says, else the KFORGE_* environment variables, with their checks) and,
 * for a server, LoadChannelSecurity (the TLS and token files read and
 * checked). `given` is a JSON object of the settings the caller gives, by
 * the keys "address", "bundle", "trust", "local_copy_dir", "first_answer",
 * "tls_ca", "tls_cert", "tls_key", "token", "token_file" (strings; null or
 * "" = not given);
 * errors call a given setting by its key, one from the environment by its
 * variable. allow_bundle != 0: a bundle ("bundle", KFORGE_BUNDLE) may be
 * the source instead of a server. *settings: a JSON object with "server"
 * (the address; "" for a bundle), "bundle", "trust" (the bundle's signer's
 * public key file, KFORGE_TRUST; "" = none), "local_copy_dir",
 * "first_answer" ("1", "0" or "": KFORGE_FIRST_ANSWER), "tls"
 * (bool), "root_certificates", "certificate_chain", "private_key" (PEM
 * text; "" = none: with tls and no root certificates, the system's) and
 * "token" ("" = none). */
int32_t kforge_client_settings(const char* given, int32_t allow_bundle, char** settings,
                               char** error);

/* VerifyBundle: *problems problems, listed in *report one per line as
 * "<path>\t<message>" (empty when the bundle is good). */
int32_t kforge_verify_bundle(const char* dir, int32_t* problems, char** report, char** error);

/* ---- the DSA indexer (model/indexer_plan.h) ---- */

/* IndexerLogitsArgs, field for field (see there). */
typedef struct KforgeIndexerLogitsArgs {
  uint64_t q;
  uint64_t weights;
  uint64_t index_cache;
  uint64_t block_table;
  uint64_t context_lens;
  uint64_t logits;
  int64_t q_row_stride;
  int64_t weights_row_stride;
  int64_t page_stride;
  int64_t block_table_stride;
  int64_t block_table_cols;
  int64_t logits_stride;
  int64_t logits_cols;
  int32_t batch;
  int32_t s_q;
  int32_t max_context;
  int32_t rows;         /* prefill's query rows; 0 or batch * s_q in decode */
  uint64_t query_start; /* prefill: int32 [batch + 1]; 0: decode */
} KforgeIndexerLogitsArgs;

/* IndexerTopkArgs, field for field. */
typedef struct KforgeIndexerTopkArgs {
  uint64_t logits;
  uint64_t context_lens;
  uint64_t indices;
  uint64_t block_table; /* 0: no slots */
  uint64_t slots;       /* 0 exactly when block_table is 0 */
  int64_t logits_stride;
  int64_t indices_stride;
  int64_t block_table_stride;
  int64_t slots_stride;
  int32_t batch;
  int32_t s_q;
  int32_t slot_page_size;
  int32_t max_context;
  uint64_t query_start; /* as KforgeIndexerLogitsArgs' */
  int32_t rows;
  int32_t reserved; /* 0 */
} KforgeIndexerTopkArgs;

/* PlanIndexerLogits / PlanIndexerTopk for a module's spec (a serialized
 * kforge.v1.KernelSpec of the dsa_indexer case, since version 14) and its
 * IndexerLaunch (serialized kforge.v1 messages): the launch as a
 * serialized LaunchPlan (main_entry, grid_x/y/z, block_threads,
 * dynamic_smem_bytes, main_params = the parameter block). */
int32_t kforge_plan_indexer_logits(const uint8_t* spec, size_t spec_size, const uint8_t* launch,
                                   size_t launch_size, const KforgeIndexerLogitsArgs* args,
                                   uint8_t** plan, size_t* plan_size, char** error);
int32_t kforge_plan_indexer_topk(const uint8_t* spec, size_t spec_size, const uint8_t* launch,
                                 size_t launch_size, const KforgeIndexerTopkArgs* args,
                                 uint8_t** plan, size_t* plan_size, char** error);

/* ---- kernel modules (runtime/kernel_module.h) ----
 *
 * One artifact's cubin loaded with the CUDA Driver API, whatever its
 * family: the driver (libcuda.so.1) is loaded at run time by the first
 * kforge_module_load or kforge_cuda_driver_version, never linked, so this
 * library loads and everything above works on a machine without one. The
 * cubin is loaded as a context-independent CUlibrary; launches run in the
 * stream's context (for stream NULL, the calling thread's current one). */

/* CudaDriver::Get: the driver's CUDA version (12040 = 12.4);
 * FAILED_PRECONDITION without a usable driver (none installed, older than
 * CUDA 12.0, no device), saying which. */
int32_t kforge_cuda_driver_version(int32_t* version, char** error);

/* What the caller passes to the entries of one role (EntryParams). */
typedef struct KforgeEntryParams {
  int32_t role;            /* kforge.v1.EntryRole value (not UNSPECIFIED) */
  int32_t reserved;        /* 0 */
  uint64_t params_bytes;   /* sizeof the by-value block; 0: kforge_sizeof(struct_name) */
  const char* struct_name; /* its name, for messages; NULL: none (then params_bytes) */
} KforgeEntryParams;

typedef struct KforgeModule KforgeModule;

/* KernelModule::LoadOnOrdinal: `artifact` (a serialized KernelArtifact with
 * its cubin) for the CUDA device of ordinal `device_ordinal`, each listed
 * entry checked to take the block `expected` gives for its role before
 * anything is loaded (FAILED_PRECONDITION for an artifact without entries,
 * a role outside `expected`, another block size; DATA_LOSS for a listed
 * entry cubin_info lacks; INVALID_ARGUMENT for no cubin); then the driver
 * (FAILED_PRECONDITION "loading kforge kernels needs the CUDA driver ..."
 * without one) and the device's compute capability against artifact.arch.
 * Close with kforge_module_close. */
int32_t kforge_module_load(const uint8_t* artifact, size_t artifact_size,
                           const KforgeEntryParams* expected, size_t expected_count,
                           int32_t device_ordinal, KforgeModule** module, char** error);
void kforge_module_close(KforgeModule* module);
/* The index of the entry named `name` (its place in the artifact's
 * entries), which the calls below take (OUT_OF_RANGE for another), and
 * the block size it takes; FAILED_PRECONDITION when the artifact lists no
 * such entry. params_bytes may be NULL. */
int32_t kforge_module_entry(const KforgeModule* module, const char* name, int32_t* index,
                            uint64_t* params_bytes, char** error);
/* KernelModule::LoadIntoCurrentContext: loads every entry into the calling
 * thread's current context (e.g. PyTorch's), so a first launch there, say
 * inside a CUDA graph capture, does not load it lazily; an error without a
 * current context. */
int32_t kforge_module_load_into_current_context(const KforgeModule* module, char** error);
/* Opts the entry into `bytes` of dynamic shared memory on the module's
 * device (a kernel needs it above 48 KB). */
int32_t kforge_module_set_max_dynamic_smem(const KforgeModule* module, int32_t entry,
                                           uint32_t bytes, char** error);
/* Lets the entry launch clusters past the portable 8 CTAs on the module's
 * device (its cluster size is compiled in); an error where the device
 * refuses (then none of its clusters launch). */
int32_t kforge_module_allow_non_portable_cluster(const KforgeModule* module, int32_t entry,
                                                 char** error);
/* cuOccupancyMaxActiveClusters of the entry for a launch of one cluster
 * (grid = the cluster, block threads, dynamic smem): *clusters 0 where the
 * driver cannot say. Resolves the entry in the calling thread's current
 * context (e.g. the one PyTorch made current); an error without one. */
int32_t kforge_module_max_active_clusters(const KforgeModule* module, int32_t entry,
                                          uint32_t grid_x, uint32_t grid_y, uint32_t grid_z,
                                          uint32_t block_threads, uint32_t dynamic_smem_bytes,
                                          int32_t* clusters, char** error);
/* Enqueues the entry with one by-value parameter block (`params`,
 * `params_size` bytes: the size the entry takes, else INVALID_ARGUMENT
 * before anything is launched) on `stream` (a CUstream / cudaStream_t;
 * NULL: the legacy default stream), in the stream's context, so a launch
 * on a capturing stream is captured. programmatic != 0: cuLaunchKernelEx
 * with programmatic stream serialization; else cuLaunchKernel. The block
 * is copied before the call returns. */
int32_t kforge_module_launch(const KforgeModule* module, int32_t entry, const void* params,
                             size_t params_size, uint32_t grid_x, uint32_t grid_y, uint32_t grid_z,
                             uint32_t block_threads, uint32_t dynamic_smem_bytes, void* stream,
                             int32_t programmatic, char** error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KFORGE_CAPI_KFORGE_CAPI_H_ */
