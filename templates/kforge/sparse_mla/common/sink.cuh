// The attention sink (DeepSeek-V4; FlashMLA's and vLLM's attn_sink): an
// optional fp32 logit per head that joins the softmax denominator and not
// the output,
//   O = sum_k exp(s_k) V_k / (exp(sink) + sum_k exp(s_k))
//     = O_attn / (1 + exp(sink - lse)),
// lse = log(sum_k exp(s_k)) in natural log, the logits s_k already scaled.
// The lse a kernel reports stays the attention's own (without the sink), as
// vLLM's V4 reference keeps it. Applied once per (query token, head) where
// the result is final: the single-split epilogue, the cluster merge and the
// combine kernel.
#ifndef KFORGE_SPARSE_MLA_COMMON_SINK_CUH_
#define KFORGE_SPARSE_MLA_COMMON_SINK_CUH_

namespace kforge {
namespace sparse_mla {

// The factor O_attn is multiplied by: 1 without a sink; 0 where nothing was
// attended (lse -inf: O is 0 anyway) or the sink dwarfs the tokens;
// 1 / (1 + exp(sink - lse)) otherwise.
__device__ __forceinline__ float SinkFactor(const float* sink, int head, float lse) {
  if (sink == nullptr) return 1.f;
  return 1.f / (1.f + __expf(sink[head] - lse));
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_COMMON_SINK_CUH_
