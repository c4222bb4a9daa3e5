// The main kernel's two products for one KV tile, S = Q K^T (QkPhase) and
// O += P V (PvPhase), each with one implementation per MMA instruction,
// picked by the traits' Mma (common/tiling.h): mma.sync in sm80/, wgmma in
// sm90/. An arch with a new instruction adds its pair in its own folder
// and a case here (sm100/README.md).
//
// S: both implementations produce this warp's (kSM * 16) x (kSN * 8) block
// of S (rows of the head tile, columns of the KV tile; warp position wm,
// wn) in the mma.sync m16n8 C-fragment layout, unscaled, so the softmax
// phases are shared. Q (resident) and K (one pipeline stage) are bf16 in
// the 128-byte-swizzled column blocks of decode_traits.cuh.
// Start(s, k_tile) begins the product and Finish(s) completes it: wgmma
// runs asynchronously in between (kAsync; the caller issues the next
// tile's gather there), mma.sync does all the work in Start.
// CheckSmemBase(q_addr) is called once, before anything is written to
// shared memory. (What the S phase needs of a KV tile's writers is
// PublishSmem's, decode_traits.cuh.)
//
// O: V is the first d_v columns of the stage's bf16 KV tile (no second
// load). Each implementation says how P is laid out in sm.p (PIndex,
// written by OnlineSoftmaxToP) and which output element each accumulator
// register holds: o[mi][ni][2 h + c] is row Row(mi, h), column Col(ni) + c,
// in the m16n8 C-fragment order, so RescaleO and the epilogues are shared.
#ifndef KFORGE_SPARSE_MLA_COMMON_MMA_CUH_
#define KFORGE_SPARSE_MLA_COMMON_MMA_CUH_

#include "kforge/sparse_mla/common/decode_traits.cuh"
#include "kforge/sparse_mla/sm80/pv.cuh"
#include "kforge/sparse_mla/sm80/qk.cuh"
#include "kforge/sparse_mla/sm90/pv.cuh"
#include "kforge/sparse_mla/sm90/qk.cuh"

namespace kforge {
namespace sparse_mla {

// The S = Q K^T implementation of a traits type.
template <class T>
using QkPhase = typename Choose<T::kMma == Mma::kWgmma, QkWgmma<T>, QkMmaSync<T>>::type;

// The O = P V implementation of a traits type.
template <class T>
using PvPhase = typename Choose<T::kMma == Mma::kWgmma, PvWgmma<T>, PvMmaSync<T>>::type;

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_COMMON_MMA_CUH_
