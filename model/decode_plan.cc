#include "model/decode_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/absl_compat.h"
#include "model/spec.h"

namespace kforge {
namespace {

using sparse_mla::CombineParams;
using sparse_mla::DecodeParams;

absl::Status Invalid(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(AsAbsl(field), ": ", AsAbsl(why)));
}

absl::Status CheckPointers(const DecodeArgs& a) {
  struct Pointer {
    const char* name;
    uint64_t value;
  };
  for (const Pointer& p : {Pointer{"q", a.q}, Pointer{"kv", a.kv}, Pointer{"indices", a.indices},
                           Pointer{"out", a.out}}) {
    if (p.value == 0) return Invalid(p.name, "null; a device pointer is required");
  }
  return absl::OkStatus();
}

absl::Status CheckPositive(const DecodeArgs& a) {
  struct Size {
    const char* name;
    int64_t value;
  };
  for (const Size& s :
       {Size{"batch", a.batch}, Size{"s_q", a.s_q}, Size{"num_q_heads", a.num_q_heads},
        Size{"d_qk", a.d_qk}, Size{"d_v", a.d_v}, Size{"topk", a.topk},
        Size{"page_block_size", a.page_block_size}, Size{"num_kv_slots", a.num_kv_slots}}) {
    if (s.value < 1) return Invalid(s.name, absl::StrCat("got ", s.value, ", must be >= 1"));
  }
  return absl::OkStatus();
}

// The extra cache's pointers and sizes: none without one in the spec;
// with one, its pointers and the sizes compiled into the kernels.
absl::Status CheckExtraModel(const DecodeArgs& a, const v1::AttentionSpec& spec) {
  struct Pointer {
    const char* name;
    uint64_t value;
  };
  const Pointer pointers[] = {{"extra_kv", a.extra_kv},
                              {"extra_indices", a.extra_indices},
                              {"extra_topk_length", a.extra_topk_length}};
  if (!spec.has_extra_kv()) {
    for (const Pointer& p : pointers) {
      if (p.value != 0) {
        return Invalid(p.name,
                       "given, but the kernels were built without an extra KV cache (ask "
                       "kforge for a spec with extra_kv)");
      }
    }
    return absl::OkStatus();
  }
  for (const Pointer& p : {pointers[0], pointers[1]}) {
    if (p.value == 0) {
      return Invalid(p.name,
                     "null; the kernels were built with an extra KV cache (spec extra_kv), a "
                     "device pointer is required");
    }
  }
  const v1::ExtraKvCache& x = spec.extra_kv();
  if (a.extra_kv_dtype != x.kv_cache_dtype()) {
    return Invalid("extra_kv_dtype",
                   absl::StrCat("got ", KvDtypeName(a.extra_kv_dtype),
                                ", the kernels are built for ", KvDtypeName(x.kv_cache_dtype())));
  }
  struct Size {
    const char* name;
    int64_t got, built;
  };
  for (const Size& s :
       {Size{"extra_topk", a.extra_topk, x.topk()},
        Size{"extra_page_block_size", a.extra_page_block_size, x.page_block_size()}}) {
    if (s.got != s.built) {
      return Invalid(s.name, absl::StrCat("got ", s.got, ", the kernels are built for ", s.built));
    }
  }
  if (a.extra_num_kv_slots < 1) {
    return Invalid("extra_num_kv_slots",
                   absl::StrCat("got ", a.extra_num_kv_slots, ", must be >= 1"));
  }
  return absl::OkStatus();
}

// Sizes compiled into the kernels must be the model's.
absl::Status CheckModel(const DecodeArgs& a, const v1::AttentionSpec& spec) {
  if (a.kv_dtype != spec.kv_cache_dtype()) {
    return Invalid("kv_dtype",
                   absl::StrCat("got ", KvDtypeName(a.kv_dtype), ", the kernels are built for ",
                                KvDtypeName(spec.kv_cache_dtype())));
  }
  struct Size {
    const char* name;
    int64_t got, built;
  };
  const int64_t d_v = spec.kv_lora_rank();
  for (const Size& s : {Size{"num_q_heads", a.num_q_heads, spec.num_q_heads()},
                        Size{"d_qk", a.d_qk, d_v + spec.rope_dim()}, Size{"d_v", a.d_v, d_v},
                        Size{"topk", a.topk, spec.topk()},
                        Size{"page_block_size", a.page_block_size, spec.page_block_size()}}) {
    if (s.got != s.built) {
      return Invalid(s.name, absl::StrCat("got ", s.got, ", the kernels are built for ", s.built));
    }
  }
  const double built = spec.softmax_scale();
  if (!(std::abs(a.softmax_scale - built) <= kSoftmaxScaleTolerance * std::abs(built))) {
    return Invalid("softmax_scale",
                   absl::StrFormat("got %.9g, the kernels are compiled with %.9g (the "
                                   "scale is a compile-time constant: ask kforge for "
                                   "a spec with this scale)",
                                   a.softmax_scale, built));
  }
  if (a.topk_length != 0 && a.topk_length_tokens != 0 && a.topk_length_tokens != 1 &&
      a.topk_length_tokens != a.s_q) {
    return Invalid("topk_length_tokens", absl::StrCat("got ", a.topk_length_tokens,
                                                      ", must be 1 (one length per query "
                                                      "token) or s_q = ",
                                                      a.s_q, " (one per request)"));
  }
  if (a.lse != 0 && !spec.return_lse()) {
    return Invalid("lse",
                   "given, but the kernels were built without return_lse "
                   "(pass 0 or use a spec with return_lse)");
  }
  return CheckExtraModel(a, spec);
}

// a * b, or INT64_MAX when that overflows: a hostile stride then fails its
// check instead of wrapping into one that passes.
int64_t SaturatingMul(int64_t a, int64_t b) {
  int64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? INT64_MAX : product;
}

// One paged cache's arguments: the main one or the extra one.
struct CacheArgs {
  const char* name;        // "kv" or "extra_kv"
  const char* row_name;    // its row stride's field
  const char* page_name;   // its page stride's field
  const char* block_name;  // its page size's field
  uint64_t pointer;
  int64_t row_stride;  // in the cache's elements
  int64_t page_stride;
  int page_block_size;
  KvCacheLayout layout;
};

// A cache's strides step over whole records and pages, and keep every row
// on a 16-byte boundary (cp.async gathers); a page-blocked cache
// (kv_layout.h) has no row stride of its own: its data and scale rows sit at
// offsets the format fixes, and the row stride is the record the engine's
// [pages, page_block_size, record] view strides by.
absl::Status CheckCache(const CacheArgs& c) {
  const KvCacheLayout& kv = c.layout;
  if (kv.page_blocked && c.row_stride != kv.row_bytes) {
    return Invalid(c.row_name,
                   absl::StrCat("got ", c.row_stride, ", must be ", kv.row_bytes,
                                " (the record: a page-blocked cache's rows are not strided)"));
  }
  if (c.row_stride < kv.row_bytes / kv.element_bytes) {
    return Invalid(c.row_name,
                   absl::StrCat("got ", c.row_stride, ", must be >= ",
                                kv.element_bytes == 2 ? "d_qk" : "the cache record's bytes", " = ",
                                kv.row_bytes / kv.element_bytes, " (rows would overlap)"));
  }
  const int64_t page_min = SaturatingMul(c.page_block_size, c.row_stride);
  if (c.page_stride < page_min) {
    return Invalid(c.page_name,
                   absl::StrCat("got ", c.page_stride, ", must be >= ", c.block_name, " * ",
                                c.row_name, " = ", page_min, " (rows would overlap)"));
  }
  if (c.pointer % kQKvAlignBytes != 0) {
    return Invalid(c.name,
                   absl::StrFormat("0x%x is not %d-byte aligned", c.pointer, kQKvAlignBytes));
  }
  // A page-blocked cache's row stride is the record (584 for V4, not a
  // multiple of 16) and addresses nothing; its rows' offsets are.
  struct Stride {
    const char* name;
    int64_t elements;
    int align;
  };
  for (const Stride& s : {Stride{c.page_name, c.page_stride, kQKvAlignBytes},
                          Stride{c.row_name, c.row_stride, kv.page_blocked ? 1 : kQKvAlignBytes}}) {
    if ((static_cast<uint64_t>(s.elements) * kv.element_bytes) % s.align == 0) continue;
    return Invalid(s.name,
                   absl::StrFormat("got %d elements, must be a multiple of %d (%d "
                                   "bytes) so every row stays %d-byte aligned",
                                   s.elements, s.align / kv.element_bytes, s.align, s.align));
  }
  return absl::OkStatus();
}

// Rows are head-inner ([token][head][dim], any padding): each stride must
// step over at least the row or block below it, or rows would overlap.
absl::Status CheckStrides(const DecodeArgs& a, const v1::AttentionSpec& spec) {
  struct Stride {
    const char* name;
    int64_t value;
    int64_t minimum;
    const char* what;  // no allocation: this runs on every decode call
  };
  const Stride strides[] = {
      {"q_head_stride", a.q_head_stride, a.d_qk, "d_qk"},
      {"q_token_stride", a.q_token_stride, SaturatingMul(a.num_q_heads, a.q_head_stride),
       "num_q_heads * q_head_stride"},
      {"indices_stride", a.indices_stride, a.topk, "topk"},
      {"extra_indices_stride", spec.has_extra_kv() ? a.extra_indices_stride : 0,
       spec.has_extra_kv() ? a.extra_topk : 0, "extra_topk"},
      {"out_head_stride", a.out_head_stride, a.d_v, "d_v"},
      {"out_token_stride", a.out_token_stride, SaturatingMul(a.num_q_heads, a.out_head_stride),
       "num_q_heads * out_head_stride"},
  };
  if (absl::Status s =
          CheckCache({"kv", "kv_row_stride", "kv_page_stride", "page_block_size", a.kv,
                      a.kv_row_stride, a.kv_page_stride, a.page_block_size, KvLayoutOf(spec)});
      !s.ok()) {
    return s;
  }
  if (spec.has_extra_kv()) {
    if (absl::Status s =
            CheckCache({"extra_kv", "extra_kv_row_stride", "extra_kv_page_stride",
                        "extra_page_block_size", a.extra_kv, a.extra_kv_row_stride,
                        a.extra_kv_page_stride, a.extra_page_block_size, ExtraKvLayoutOf(spec)});
        !s.ok()) {
      return s;
    }
  }
  for (const Stride& s : strides) {
    if (s.value < s.minimum) {
      return Invalid(s.name, absl::StrCat("got ", s.value, ", must be >= ", s.what, " = ",
                                          s.minimum, " (rows would overlap)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckAlignment(const DecodeArgs& a) {
  // Pointers in bytes; strides in bf16 elements (q and out). The caches'
  // are CheckCache's.
  struct Rule {
    const char* name;
    uint64_t bytes;
    int align;
    bool pointer;
  };
  auto stride = [](const char* name, int64_t elements, int align) {
    return Rule{name, static_cast<uint64_t>(elements) * 2, align, false};
  };
  const Rule rules[] = {
      {"q", a.q, kQKvAlignBytes, true},
      {"out", a.out, kOutAlignBytes, true},
      {"indices", a.indices, kIndicesLseAlignBytes, true},
      {"lse", a.lse, kIndicesLseAlignBytes, true},
      {"topk_length", a.topk_length, kIndicesLseAlignBytes, true},
      {"sink", a.sink, kIndicesLseAlignBytes, true},
      {"extra_indices", a.extra_indices, kIndicesLseAlignBytes, true},
      {"extra_topk_length", a.extra_topk_length, kIndicesLseAlignBytes, true},
      stride("q_token_stride", a.q_token_stride, kQKvAlignBytes),
      stride("q_head_stride", a.q_head_stride, kQKvAlignBytes),
      stride("out_token_stride", a.out_token_stride, kOutAlignBytes),
      stride("out_head_stride", a.out_head_stride, kOutAlignBytes),
  };
  for (const Rule& r : rules) {
    if (r.bytes % r.align == 0) continue;
    if (r.pointer) {
      return Invalid(r.name, absl::StrFormat("0x%x is not %d-byte aligned", r.bytes, r.align));
    }
    return Invalid(r.name, absl::StrFormat("got %d elements, must be a multiple of %d (%d "
                                           "bytes) so every row stays %d-byte aligned",
                                           r.bytes / 2, r.align / 2, r.align, r.align));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RuntimeShape> ValidateDecodeArgs(const DecodeArgs& args,
                                                const v1::Manifest& manifest) {
  if (manifest.variants_size() == 0) {
    return absl::FailedPreconditionError("the manifest has no kernel variants");
  }
  const v1::KernelSpec& first = FirstChoice(manifest).spec();
  if (!first.has_sparse_mla_decode()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the manifest's first choice ", FirstChoice(manifest).module_name(), " is a ",
                     KindCaseName(first), " module, not a sparse_mla_decode one"));
  }
  const v1::AttentionSpec& spec = first.sparse_mla_decode();
  // In order, each only once the ones before passed (the stride checks
  // multiply sizes that must be positive and the model's first).
  absl::Status s = CheckPointers(args);
  if (s.ok()) s = CheckPositive(args);
  if (s.ok()) s = CheckModel(args, spec);
  if (s.ok()) s = CheckStrides(args, spec);
  if (s.ok()) s = CheckAlignment(args);
  if (!s.ok()) return s;
  return RuntimeShape{args.batch, args.s_q,      args.num_q_heads,
                      args.topk,  args.kv_dtype, args.page_block_size};
}

DecodeParams MakeDecodeParams(const Selection& sel, const DecodeArgs& a, uint64_t workspace) {
  const v1::AttentionSpec& spec = sel.variant->spec().sparse_mla_decode();
  DecodeParams p{};
  p.q = reinterpret_cast<const unsigned short*>(a.q);
  p.kv = reinterpret_cast<const unsigned short*>(a.kv);
  p.indices = reinterpret_cast<const int*>(a.indices);
  p.out = reinterpret_cast<unsigned short*>(a.out);
  p.lse = reinterpret_cast<float*>(a.lse);
  p.topk_length = reinterpret_cast<const int*>(a.topk_length);
  p.sink = reinterpret_cast<const float*>(a.sink);
  p.topk_length_tokens = a.topk_length_tokens > 1 ? a.topk_length_tokens : 1;
  if (spec.has_extra_kv()) {
    p.extra_kv = reinterpret_cast<const unsigned short*>(a.extra_kv);
    p.extra_indices = reinterpret_cast<const int*>(a.extra_indices);
    p.extra_topk_length = reinterpret_cast<const int*>(a.extra_topk_length);
    p.extra_kv_page_stride = a.extra_kv_page_stride;
    p.extra_kv_row_stride = a.extra_kv_row_stride;
    p.extra_num_kv_slots = a.extra_num_kv_slots;
    p.extra_indices_stride = a.extra_indices_stride;
  }
  if (sel.needs_combine) {
    const uint64_t o_accum_bytes = static_cast<uint64_t>(sel.num_splits) * sel.num_tokens *
                                   spec.num_q_heads() * spec.kv_lora_rank() * sizeof(float);
    p.o_accum = reinterpret_cast<float*>(workspace);
    p.lse_accum = reinterpret_cast<float*>(workspace + o_accum_bytes);
  }
  p.q_token_stride = a.q_token_stride;
  p.q_head_stride = a.q_head_stride;
  p.kv_page_stride = a.kv_page_stride;
  p.kv_row_stride = a.kv_row_stride;
  p.num_kv_slots = a.num_kv_slots;
  p.indices_stride = a.indices_stride;
  p.out_token_stride = a.out_token_stride;
  p.out_head_stride = a.out_head_stride;
  p.num_tokens = sel.num_tokens;
  p.num_splits = sel.num_splits;
  p.tokens_per_split = sel.tokens_per_split;
  return p;
}

CombineParams MakeCombineParams(const Selection& sel, const DecodeArgs& a, uint64_t workspace) {
  const DecodeParams main = MakeDecodeParams(sel, a, workspace);
  return CombineParams{.o_accum = main.o_accum,
                       .lse_accum = main.lse_accum,
                       .out = main.out,
                       .lse = main.lse,
                       .sink = main.sink,
                       .out_token_stride = main.out_token_stride,
                       .out_head_stride = main.out_head_stride,
                       .num_tokens = main.num_tokens,
                       .num_splits = main.num_splits,
                       .column_slices = sel.combine_column_slices,
                       .reserved = 0};
}

absl::StatusOr<DecodeLaunch> PlanDecode(const v1::Manifest& manifest, const DeviceInfo& device,
                                        const DecodeArgs& args, uint64_t workspace) {
  absl::StatusOr<RuntimeShape> shape = ValidateDecodeArgs(args, manifest);
  if (!shape.ok()) return shape.status();
  absl::StatusOr<Selection> sel = Select(manifest, device, *shape);
  if (!sel.ok()) return sel.status();
  DecodeLaunch launch;
  launch.selection = *sel;
  launch.main = MakeDecodeParams(*sel, args, workspace);
  if (sel->needs_combine) launch.combine = MakeCombineParams(*sel, args, workspace);
  return launch;
}

absl::StatusOr<uint64_t> WorkspaceBytesFor(const v1::Manifest& manifest, const DeviceInfo& device,
                                           int max_tokens) {
  if (max_tokens < 1) {
    return Invalid("max_tokens", absl::StrCat("got ", max_tokens, ", must be >= 1"));
  }
  // The split count only falls as the token count grows (the grid fills
  // the GPU), so each variant is walked up to its first count that needs
  // no combine. s_q does not change the kernel: tokens are tokens.
  uint64_t need = 0;
  for (const v1::ManifestVariant& v : manifest.variants()) {
    if (!v.spec().has_sparse_mla_decode()) continue;  // never selected for decode
    const v1::AttentionSpec& spec = v.spec().sparse_mla_decode();
    RuntimeShape shape{0,
                       1,
                       static_cast<int>(spec.num_q_heads()),
                       static_cast<int>(spec.topk()),
                       spec.kv_cache_dtype(),
                       static_cast<int>(spec.page_block_size())};
    for (shape.batch = 1; shape.batch <= max_tokens; ++shape.batch) {
      absl::StatusOr<Selection> sel = Select(manifest, device, shape);
      if (!sel.ok()) return sel.status();
      need = std::max(need, sel->workspace_bytes);
      if (!sel->needs_combine) break;
    }
  }
  return need;
}

namespace {

KvCacheLayout LayoutOf(const KvFormatInfo& kv, const v1::AttentionSpec& spec) {
  const int d_qk = static_cast<int>(spec.kv_lora_rank() + spec.rope_dim());
  return {kv.bytes_per_token(d_qk), kv.element_bytes, kv.page_blocked};
}

}  // namespace

KvCacheLayout KvLayoutOf(const v1::AttentionSpec& spec) { return LayoutOf(KvFormatOf(spec), spec); }

KvCacheLayout ExtraKvLayoutOf(const v1::AttentionSpec& spec) {
  const KvFormatInfo* kv = ExtraKvFormatOf(spec);
  return LayoutOf(kv != nullptr ? *kv : KvFormatOf(spec), spec);
}

}  // namespace kforge
