// Top-k of the indexer logits per query row, and the positions' cache
// slots (config.h, TopkParams; docs/DESIGN.md "The DSA lightning indexer").
//
// One CTA = one query row, or (sm_90+, the cluster entry) a cluster of
// kTopkClusterCtas CTAs = one row, each CTA taking a contiguous part of it;
// their histograms are summed across the cluster in distributed shared
// memory after each pass. Each logit becomes an order-preserving 32-bit key
// (larger float, larger key). The k positions with the largest keys are
// written in increasing position order; of the keys equal to the k-th, the
// ones with the smallest positions are taken (deterministic). Rows of at
// most k valid positions take them all: 0, 1, ..., len - 1, then -1.
//
// Longer rows find the k-th largest key (the threshold) with a radix select
// of 11-, 11- and 10-bit digits, one 2048-bin shared-memory histogram per
// digit. The first pass over the row counts the top digit. Where its
// boundary bin fits kTopkCandidates (the row's, cluster-wide: nearly every
// row), the second pass keeps the positions of the keys above the bin and
// copies the bin's keys (the candidates) in position order into shared
// memory, where the later digits are counted; the candidates that survive
// (above the threshold, or equal to it within the first `rem` by
// position) form a second position-ordered list, and each survivor's rank
// is its index in its list plus the positions below it in the other
// (MergeSelect): the row is read twice. A larger bin takes the general
// path: each CTA keeps what fits, counts the later digits there or over
// its part of the row again, and a last pass over the row writes each
// survivor at its rank in position order (the survivors before it in
// lower-ranked CTAs, in earlier rounds, and in the round before it: a
// block-wide scan). A digit whose bin is taken whole ends the select.
// Slots are written after the ranks from the CTA's survivors staged in
// shared memory (RowOutput::WriteSlots), so no store waits on a
// block-table load.
#ifndef KFORGE_DSA_INDEXER_TOPK_CUH_
#define KFORGE_DSA_INDEXER_TOPK_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/dsa_indexer/config.h"
#include "kforge/dsa_indexer/logits.cuh"
#include "kforge/dsa_indexer/traits.cuh"

// A phase mark of the top-k (ids in bench/topk_phases.cu, which records
// thread 0's %globaltimer at each): nothing in a module, where it is left
// undefined.
#ifndef KFORGE_TOPK_PHASE
#define KFORGE_TOPK_PHASE(id) ((void)0)
#endif

namespace kforge {
namespace dsa_indexer {

// Larger float -> larger key (-inf < finite < +inf).
__device__ __forceinline__ u32 OrderedKey(float x) {
  const u32 bits = __float_as_uint(x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// A candidate in shared memory: its key and position.
__device__ __forceinline__ unsigned long long CandidateWord(u32 key, int pos) {
  return (static_cast<unsigned long long>(key) << 32) | static_cast<u32>(pos);
}

// The top-k kernel's shared memory (config.h, TopkSmemBytes).
template <class T>
struct TopkSmem {
  unsigned long long* cand;  // [kTopkCandidates] the boundary bin's keys, position order
  int* hist;                 // [kTopkBins] this CTA's counts
  int* counters;             // [kTopkUnroll * warps] per-(load, warp) counts, then scalars
  int* excl;                 // [kTopkUnroll][threads] a round's in-warp offsets
  int* sel;                  // [kTopk] survivor positions (MergeSelect)
  int* hist_sum;             // cluster entry: [kTopkBins] the cluster's counts
  int* above_all;            // cluster entry: [kTopkClusterCtas] each CTA's keys above the bin
  static constexpr int kScalars = kTopkUnroll * (T::kTopkThreads / 32);
  __device__ int& sel_bin() const { return counters[kScalars]; }
  __device__ int& sel_rem() const { return counters[kScalars + 1]; }
  __device__ int& sel_count() const { return counters[kScalars + 2]; }
  __device__ int& round_total() const { return counters[kScalars + 3]; }
  __device__ int& above() const { return counters[kScalars + 4]; }  // this CTA's, published
};

// Inclusive sum of x over lanes 0..lane of the warp.
__device__ __forceinline__ int WarpInclusiveSum(int x, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, x, off);
    if (lane >= off) x += y;
  }
  return x;
}

// Sum of x over the block (every thread gets it); `scratch` holds one int
// per warp.
template <int kThreads>
__device__ __forceinline__ int BlockSum(int x, int* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  int total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += scratch[w];
  __syncthreads();  // scratch is free again
  return total;
}

// counters[0, kN) (in position order) become their exclusive prefix sums
// and *total their sum: warp 0 scans, (kN + 31) / 32 per lane.
template <int kN>
__device__ __forceinline__ void ExclusiveScanCounters(int* counters, int* total) {
  constexpr int kPer = (kN + 31) / 32;
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  int c[kPer];
  int sum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    c[j] = kPer * lane + j < kN ? counters[kPer * lane + j] : 0;
    sum += c[j];
  }
  int run = WarpInclusiveSum(sum, lane) - sum;
  if (lane == 31) *total = run + sum;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (kPer * lane + j < kN) counters[kPer * lane + j] = run;
    run += c[j];
  }
}

// Logits [s, s + 4) of the row as floats, those outside [beg, end) 0
// (never counted): one 16-byte load where all four are inside (the caller
// keeps logits + s 16-byte aligned), else one load each.
__device__ __forceinline__ void LoadLogits4(const float* logits, int s, int beg, int end,
                                            float (&v)[4]) {
  if (s >= beg && s + 3 < end) {
    const float4 f = *reinterpret_cast<const float4*>(logits + s);
    v[0] = f.x;
    v[1] = f.y;
    v[2] = f.z;
    v[3] = f.w;
    return;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) v[e] = s + e >= beg && s + e < end ? logits[s + e] : 0.f;
}

// The part of a row one CTA takes: positions [beg, end), and the CTA's rank
// in the row's cluster (0 with one CTA per row). Parts are contiguous in
// rank order, so position order is (rank, position within the part).
struct RowPart {
  int beg, end;
  u32 rank;
};

// One slot of a source, read again: its key and position.
struct Slot {
  u32 key;
  int pos;
};

// The keys a CTA selects from, in position order: slots [Begin(), End())
// in rounds of kU * kTopkThreads * kV, thread t loading slots r0 + (u *
// threads + t) * kV + [0, kV) for each u < kU (slot order is position
// order). Load gives their keys; Valid(s) has bit e set where slot s + e
// is in the source (once a load of kV, not per key); At reads one slot's
// key and position again (for the few slots a pass visits, in a loop whose
// code stays small). The row's logits of the part:
struct RowSource {
  static constexpr int kU = kTopkUnroll;
  static constexpr int kV = 4;
  const float* logits;
  int beg, end;  // beg a multiple of 4
  // Slots start at beg less the row's misalignment (in floats; logits is
  // 4-byte aligned), so every load of four inside the part is 16-byte
  // aligned; the slots before beg never count.
  __device__ __forceinline__ int Begin() const {
    return beg - static_cast<int>((reinterpret_cast<unsigned long long>(logits) >> 2) & 3);
  }
  __device__ __forceinline__ int End() const { return end; }
  __device__ __forceinline__ void Load(int s, u32 (&key)[kV]) const {
    float v[kV];
    LoadLogits4(logits, s, beg, end, v);
#pragma unroll
    for (int e = 0; e < kV; ++e) key[e] = OrderedKey(v[e]);
  }
  __device__ __forceinline__ u32 Valid(int s) const {
    const int lo = min(max(beg - s, 0), kV), hi = min(max(end - s, 0), kV);
    return ((1u << hi) - 1u) & ~((1u << lo) - 1u);
  }
  __device__ __forceinline__ Slot At(int s) const { return Slot{OrderedKey(logits[s]), s}; }
};
// The candidates: n words in shared memory, in position order; a round
// covers kTopkCandidates of them (one round, whatever n: a round's cost is
// its barriers, not its loads).
struct CandidateSource {
  static constexpr int kU = 2;
  static constexpr int kV = 4;
  static_assert(kU * kV * kTopkThreads == kTopkCandidates, "the candidates in one round");
  const unsigned long long* cand;
  int n;
  __device__ __forceinline__ int Begin() const { return 0; }
  __device__ __forceinline__ int End() const { return n; }
  __device__ __forceinline__ void Load(int s, u32 (&key)[kV]) const {
#pragma unroll
    for (int e = 0; e < kV; ++e) key[e] = s + e < n ? static_cast<u32>(cand[s + e] >> 32) : 0u;
  }
  __device__ __forceinline__ u32 Valid(int s) const {
    const int hi = min(max(n - s, 0), kV);
    return (1u << hi) - 1u;
  }
  __device__ __forceinline__ Slot At(int s) const {
    const unsigned long long w = cand[s];
    return Slot{static_cast<u32>(w >> 32), static_cast<int>(static_cast<u32>(w))};
  }
};

// kC CTAs per row: the cluster's histogram, summed bin by bin into every
// CTA's hist_sum (CTA r sums bins [r, r + 1) * kTopkBins / kC of all kC
// histograms and writes the sums to all of them); the histogram to scan.
// The first digit (`first`): each CTA adds its nonzero counts into every
// CTA's hist_sum (zeroed at the kernel's start, before a cluster arrival
// this waits for), so one cluster barrier and no load round trip.
template <class T, int kC>
__device__ __forceinline__ const int* MergeHistogram(const TopkSmem<T>& sm, u32 rank, bool first) {
  if constexpr (kC == 1) {
    return sm.hist;
  } else if (first) {
    ptx::ClusterWait();  // every CTA's hist_sum is zeroed (TopkMain)
    const u32 sum = ptx::SmemAddr(sm.hist_sum);
    for (int j = threadIdx.x; j < kTopkBins; j += T::kTopkThreads) {
      const int c = sm.hist[j];
      if (c != 0) {
#pragma unroll
        for (int q = 0; q < kC; ++q) {
          ptx::RedAddClusterU32(ptx::MapShared(sum + 4u * static_cast<u32>(j), q),
                                static_cast<u32>(c));
        }
      }
    }
    ptx::ClusterSync();  // every CTA's adds are in
    return sm.hist_sum;
  } else {
    constexpr int kSlice = kTopkBins / kC;
    ptx::ClusterSync();  // every CTA's counts are in
    const u32 hist = ptx::SmemAddr(sm.hist), sum = ptx::SmemAddr(sm.hist_sum);
    for (int j = threadIdx.x; j < kSlice; j += T::kTopkThreads) {
      const u32 at = 4u * (rank * kSlice + j);
      u32 total = 0;
#pragma unroll
      for (int q = 0; q < kC; ++q) total += ptx::LdClusterU32(ptx::MapShared(hist + at, q));
#pragma unroll
      for (int q = 0; q < kC; ++q) ptx::StClusterU32(ptx::MapShared(sum + at, q), total);
    }
    ptx::ClusterSync();  // every sum is in; no CTA reads a histogram any more
    return sm.hist_sum;
  }
}

// sm.hist zeroed, visible to the block.
template <class T>
__device__ __forceinline__ void ZeroHistogram(const TopkSmem<T>& sm) {
  for (int j = threadIdx.x; j < kTopkBins; j += T::kTopkThreads) sm.hist[j] = 0;
  __syncthreads();
}

// This CTA's counts of digit (key >> shift) & digit over the keys of src
// with (key & mask) == prefix, into sm.hist (zeroed first, unless the
// caller already has: `zeroed`).
template <class T, class Src>
__device__ __forceinline__ void CountDigit(const Src& src, u32 mask, u32 prefix, int shift,
                                           u32 digit, const TopkSmem<T>& sm, bool zeroed) {
  constexpr int kU = Src::kU, kV = Src::kV, kThreads = T::kTopkThreads;
  if (!zeroed) ZeroHistogram<T>(sm);
  for (int r0 = src.Begin(); r0 < src.End(); r0 += kU * kThreads * kV) {
    const auto slot = [&](int u) -> int { return r0 + (u * kThreads + threadIdx.x) * kV; };
    u32 key[kU][kV];
#pragma unroll
    for (int u = 0; u < kU; ++u) src.Load(slot(u), key[u]);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const u32 valid = src.Valid(slot(u));
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        if (((valid >> e) & 1u) != 0u && (key[u][e] & mask) == prefix) {
          atomicAdd(&sm.hist[(key[u][e] >> shift) & digit], 1);
        }
      }
    }
  }
  __syncthreads();
}

// The digit's boundary: merges the cluster's counts, then finds the bin
// where the count of larger keys first reaches rem. Thread t scans bins
// kTopkBins - 1 - (kPer t + j), j < kPer (largest first), in a block-wide
// inclusive scan. Sets sm.sel_bin (the bin), sm.sel_rem (the keys still
// wanted from it) and sm.sel_count (the keys in it, cluster-wide).
template <class T, int kC>
__device__ __forceinline__ void FindBoundary(int rem, const TopkSmem<T>& sm, u32 rank, bool first) {
  constexpr int kPer = kTopkBins / T::kTopkThreads;  // bins each thread scans
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int* hist = MergeHistogram<T, kC>(sm, rank, first);
  int c[kPer];
  int local = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    c[j] = hist[kTopkBins - 1 - (kPer * tid + j)];
    local += c[j];
  }
  int incl = WarpInclusiveSum(local, lane);
  if (lane == 31) sm.counters[warp] = incl;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < T::kTopkThreads / 32; ++w) incl += w < warp ? sm.counters[w] : 0;
  if (incl - local < rem && incl >= rem) {
    int run = incl - local;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (run < rem && run + c[j] >= rem) {
        sm.sel_bin() = kTopkBins - 1 - (kPer * tid + j);
        sm.sel_rem() = rem - run;
        sm.sel_count() = c[j];
      }
      run += c[j];
    }
  }
  __syncthreads();
}

// The radix select's running state: the digits fixed so far (prefix under
// mask), the keys still wanted among those equal to it (rem), the last
// digit's bin (this CTA's sm.hist[bin] counts its keys equal to prefix
// under mask) and this CTA's keys above it (cluster entry only).
struct Selection {
  u32 prefix, mask;
  int rem, bin;
  int above;
};

// This CTA's keys in the bins above the selection's last digit (sm.hist
// holds its own counts of that digit): above the threshold whatever the
// later digits are. Added to s.above (cluster entry: SurvivorsBefore).
template <class T>
__device__ __forceinline__ void CountAbove(Selection& s, const TopkSmem<T>& sm) {
  int mine = 0;
  for (int j = threadIdx.x; j < kTopkBins; j += T::kTopkThreads) {
    mine += j > s.bin ? sm.hist[j] : 0;
  }
  s.above += BlockSum<T::kTopkThreads>(mine, sm.counters);
}

// Counts one digit over src and fixes it; true when its bin is taken whole
// (every key equal to the new prefix survives: the select ends).
// kCountAbove (cluster entry): keep s.above; the first digit skips it and
// its two barriers, since only the general path needs it
// (SelectLargest counts it there).
// The first digit's histogram is zeroed before the kernel's prior-grid
// wait (TopkMain), off the critical path.
template <class T, int kC, class Src, bool kCountAbove = true>
__device__ __forceinline__ bool NextDigit(const Src& src, int pass, Selection& s,
                                          const TopkSmem<T>& sm, u32 rank) {
  const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
  const u32 digit = pass == 2 ? 1023u : 2047u;
  CountDigit<T>(src, s.mask, s.prefix, shift, digit, sm, /*zeroed=*/pass == 0);
  KFORGE_TOPK_PHASE(10 + 2 * pass);
  FindBoundary<T, kC>(s.rem, sm, rank, pass == 0);
  KFORGE_TOPK_PHASE(11 + 2 * pass);
  s.bin = sm.sel_bin();
  s.prefix |= static_cast<u32>(s.bin) << shift;
  s.mask |= digit << shift;
  const bool whole = sm.sel_count() == sm.sel_rem();
  s.rem = sm.sel_rem();
  // No barrier is needed after the reads of sel_* above: they are
  // rewritten only by the next digit's FindBoundary, which every thread
  // reaches through CountDigit's barriers (so after its reads here), and
  // the position-ordered pass that may come next writes only excl, sel,
  // the candidates and counters below the scalars. FindBoundary's
  // reads of sm.hist are done before its first barrier, so the next
  // CountDigit may zero it at once.
  if constexpr (kC > 1 && kCountAbove) CountAbove<T>(s, sm);
  return whole;
}

// One pass over src in position order. A key is "equal" in [lo, hi], and
// "above" past hi where kAbove (else of no class); visit(key, pos,
// is_above, gt, eq) sees each key of a nonzero class with the counts gt
// and eq of each class before it, from `before` (those of earlier CTAs of
// the cluster) on; returns the counts through the end of src. Counts are
// packed above << 16 | equal (a round holds at most 2^14 keys); a thread
// keeps its keys' classes as two bit masks between the scan and the
// visits. Every visit is done (and visible to the block) when it returns.
struct Before {
  int gt, eq;
};
template <class T, bool kAbove, class Src, class Visit>
__device__ __forceinline__ Before ScanInPositionOrder(const Src& src, Before before,
                                                      const TopkSmem<T>& sm, u32 lo, u32 hi,
                                                      Visit visit) {
  constexpr int kU = Src::kU, kV = Src::kV, kThreads = T::kTopkThreads;
  constexpr int kWarpsT = kThreads / 32;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int r0 = src.Begin(); r0 < src.End(); r0 += kU * kThreads * kV) {
    static_assert(kU * kV <= 32, "a thread's classes fit one bit mask each");
    static_assert(kU <= kTopkUnroll, "a thread's offsets fit sm.excl");
    // Load u's first slot: thread t's loads are kThreads * kV apart.
    const auto slot = [&](int u) { return r0 + (u * kThreads + tid) * kV; };
    u32 key[kU][kV];
    u32 above = 0, equal = 0;  // bit u * kV + e: the key's class
    u32 count[kU];             // load u's keys above << 8 | equal
#pragma unroll
    for (int u = 0; u < kU; ++u) src.Load(slot(u), key[u]);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      u32 a = 0, q = 0;  // this load's classes, bit e
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        a |= static_cast<u32>(key[u][e] > hi) << e;
        q |= static_cast<u32>(key[u][e] >= lo) << e;
      }
      const u32 valid = src.Valid(slot(u));
      q &= valid & ~a;
      a = kAbove ? a & valid : 0u;
      above |= a << (u * kV);
      equal |= q << (u * kV);
      count[u] = (static_cast<u32>(__popc(a)) << 8) | static_cast<u32>(__popc(q));
    }
    // In-warp scans of two loads at once (four 8-bit fields: a warp's
    // counts of a class in one load are at most 32 * kV), each exclusive
    // offset and warp total stored as above << 16 | equal.
    static_assert(32 * kV < 256, "a warp's counts of a load fit 8 bits");
    const auto widen = [](u32 v) { return static_cast<int>(((v >> 8) << 16) | (v & 0xffu)); };
#pragma unroll
    for (int u = 0; u < kU; u += 2) {
      const u32 c = u + 1 < kU ? (count[u] << 16) | count[u + 1] : count[u] << 16;
      const u32 incl = static_cast<u32>(WarpInclusiveSum(static_cast<int>(c), lane));
      sm.excl[u * kThreads + tid] = widen((incl - c) >> 16);  // read back after the barriers
      if (lane == 31) sm.counters[u * kWarpsT + warp] = widen(incl >> 16);
      if (u + 1 < kU) {
        sm.excl[(u + 1) * kThreads + tid] = widen((incl - c) & 0xffffu);
        if (lane == 31) sm.counters[(u + 1) * kWarpsT + warp] = widen(incl & 0xffffu);
      }
    }
    __syncthreads();
    ExclusiveScanCounters<kU * kWarpsT>(sm.counters, &sm.round_total());
    __syncthreads();
    // The visits: a loop over the thread's keys of a class (a few a
    // round), not unrolled over all kU * kV (straight-line code run once a
    // round kept the warps waiting on instruction fetch).
    for (u32 m = above | equal; m != 0u; m &= m - 1u) {
      const int i = __ffs(static_cast<int>(m)) - 1;
      const int u = i / kV;
      const int packed = sm.counters[u * kWarpsT + warp] + sm.excl[u * kThreads + tid];
      const u32 before_i = ((1u << i) - 1u) & ~((1u << (u * kV)) - 1u);  // u's keys before it
      const Slot at = src.At(slot(u) + i % kV);
      visit(at.key, at.pos, ((above >> i) & 1u) != 0u,
            before.gt + (packed >> 16) + __popc(above & before_i),
            before.eq + (packed & 0xffff) + __popc(equal & before_i));
    }
    before.gt += sm.round_total() >> 16;
    before.eq += sm.round_total() & 0xffff;
    __syncthreads();  // counters are rewritten by the next round
  }
  return before;
}

// This CTA's keys equal to the selection's prefix under its mask, in
// position order: the i-th goes to put(i, word).
template <class T, class Src, class Put>
__device__ __forceinline__ void KeepCandidates(const Src& src, const Selection& s,
                                               const TopkSmem<T>& sm, Put put) {
  ScanInPositionOrder<T, false>(
      src, Before{0, 0}, sm, s.prefix, s.prefix | ~s.mask,
      [&](u32 key, int pos, bool, int, int eq) { put(eq, CandidateWord(key, pos)); });
}

// The later digits over src (the candidates, or the row's keys of the
// boundary bin); the selection at the threshold.
template <class T, int kC, class Src>
__device__ __forceinline__ void FinishSelect(const Src& src, Selection& s, const TopkSmem<T>& sm,
                                             u32 rank) {
  for (int pass = 1; pass < 3; ++pass) {
    if (NextDigit<T, kC>(src, pass, s, sm, rank)) break;
  }
}

// The sum of the u32 at shared address `addr` over the cluster's CTAs of
// rank below `rank`, in every thread: lane q of each warp loads CTA q's
// (the loads in flight together, not one round trip after another).
template <int kC>
__device__ __forceinline__ int SumOverLowerCtas(u32 addr, u32 rank) {
  static_assert(kC <= 32, "a lane per CTA");
  const u32 lane = threadIdx.x % 32;
  int v = lane < rank ? static_cast<int>(ptx::LdClusterU32(ptx::MapShared(addr, lane))) : 0;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Publishes this CTA's counts and reads the lower-ranked CTAs'. The caller
// keeps the cluster running (a final ClusterSync) until every CTA has read.
template <class T, int kC>
__device__ __forceinline__ Before SurvivorsBefore(const Selection& s, const TopkSmem<T>& sm,
                                                  u32 rank) {
  Before before{0, 0};
  if constexpr (kC > 1) {
    if (threadIdx.x == 0) sm.above() = s.above;
    ptx::ClusterSync();  // every CTA's above is in
    before.gt = SumOverLowerCtas<kC>(ptx::SmemAddr(&sm.above()), rank);
    before.eq = SumOverLowerCtas<kC>(ptx::SmemAddr(sm.hist + s.bin), rank);
  }
  return before;
}

// A row's outputs: positions by rank into `indices`; with a block table,
// their cache slots into `slots` (table[pos / page] * page + pos % page, -1
// kept).
struct RowOutput {
  int* indices;
  int* slots;        // null: no slots
  const int* table;  // the request's row of the slot cache's block table; null: all -1
  int page;

  // slots[first + i] for i < n, position pos(i): each thread's table loads
  // go out together, then its stores (a store between them would hold each
  // load behind the one before).
  template <int kThreads, class Pos>
  __device__ __forceinline__ void WriteSlots(int first, int n, Pos pos) const {
    constexpr int kBatch = 4;
    for (int i0 = 0; i0 < n; i0 += kBatch * kThreads) {
      int v[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = i0 + u * kThreads + static_cast<int>(threadIdx.x);
        const int ps = i < n ? pos(i) : -1;
        v[u] = ps < 0 || table == nullptr ? -1 : __ldg(table + ps / page) * page + ps % page;
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = i0 + u * kThreads + static_cast<int>(threadIdx.x);
        if (i < n) slots[first + i] = v[u];
      }
    }
  }
};

// The last pass over the part: each survivor's position at its rank in
// position order, gt + min(eq, rem) with gt and eq the keys above and
// equal to the threshold before it (`before`: those of the lower-ranked
// CTAs of the cluster). This CTA's survivors take the consecutive ranks
// from gt + min(eq, rem) of `before`; with slots, their positions are kept
// in the (now free) candidate words and their slots written after the
// pass, whose visits would otherwise wait on one table load after another.
static_assert(2 * kTopkCandidates >= kMaxTopk,
              "a CTA's survivors staged as ints in the candidates");
template <class T>
__device__ __forceinline__ void WriteSurvivors(const RowSource& src, const Selection& s,
                                               Before before, const TopkSmem<T>& sm,
                                               const RowOutput& out) {
  // The rank of a survivor with gt above and eq equal before it; of the
  // CTA's first survivor, and (from the pass's counts) one past its last.
  const auto rank_of = [&](int gt, int eq) { return gt + min(eq, s.rem); };
  const int first = rank_of(before.gt, before.eq);
  int* staged = reinterpret_cast<int*>(sm.cand);  // kTopkCandidates * 2 >= kMaxTopk ints
  const Before after =
      ScanInPositionOrder<T, true>(src, before, sm, s.prefix, s.prefix | ~s.mask,
                                   [&](u32, int pos, bool is_above, int gt, int eq) {
                                     // Above the threshold, or equal to it within the first rem.
                                     if (is_above || eq < s.rem) {
                                       const int rank = rank_of(gt, eq);
                                       out.indices[rank] = pos;
                                       if (out.slots != nullptr) staged[rank - first] = pos;
                                     }
                                   });
  if (out.slots != nullptr) {
    const int n = rank_of(after.gt, after.eq) - first;
    out.WriteSlots<T::kTopkThreads>(first, n, [&](int i) { return staged[i]; });
  }
}

// Positions below x in the ascending a[0, n).
__device__ __forceinline__ int CountBelow(const int* a, int n, int x) {
  int lo = 0;
  while (n > 0) {
    const int half = n / 2;
    if (a[lo + half] < x) {
      lo += half + 1;
      n -= half + 1;
    } else {
      n = half;
    }
  }
  return lo;
}

// The top digit's boundary bin of the whole row fits one CTA's candidates.
// One pass over the part keeps the positions of its keys above the bin
// (sm.sel, position order) and gives the bin's keys to every CTA of the
// cluster (the candidates, in position order: CTA r's at the bin's keys
// the lower-ranked CTAs hold); each CTA then finds the threshold alone
// and lists the candidates that survive after its own keys above (sm.sel,
// position order). The survivors of the part are the two lists merged: an
// output rank is a position's index in its list plus the positions below
// it in the other one (and the keys above in the lower-ranked CTAs), so
// the row is read twice, not a third time to write them. `whole`: the bin
// survives whole (no later digit).
template <class T, int kC>
__device__ __forceinline__ void MergeSelect(const RowSource& row, const RowPart part, bool whole,
                                            Selection& s, const TopkSmem<T>& sm,
                                            const RowOutput& out) {
  const int total = sm.sel_count();  // the bin's keys, cluster-wide
  int offset = 0;                    // the bin's keys in lower-ranked parts
  if constexpr (kC > 1) offset = SumOverLowerCtas<kC>(ptx::SmemAddr(sm.hist + s.bin), part.rank);
  const u32 cand = ptx::SmemAddr(sm.cand);
  const Before kept = ScanInPositionOrder<T, true>(
      row, Before{0, 0}, sm, s.prefix, s.prefix | ~s.mask,
      [&](u32 key, int pos, bool is_above, int gt, int eq) {
        if (is_above) {
          sm.sel[gt] = pos;
        } else if constexpr (kC == 1) {
          sm.cand[eq] = CandidateWord(key, pos);
        } else {
#pragma unroll
          for (int q = 0; q < kC; ++q)
            ptx::StClusterU64(ptx::MapShared(cand + 8u * (offset + eq), q),
                              CandidateWord(key, pos));
        }
      });
  const int n_above = kept.gt;  // this CTA's keys above the bin
  KFORGE_TOPK_PHASE(20);
  int above_lower = 0;  // the lower-ranked CTAs'
  if constexpr (kC > 1) {
    if (threadIdx.x < kC) {
      ptx::StClusterU32(ptx::MapShared(ptx::SmemAddr(sm.above_all + part.rank), threadIdx.x),
                        static_cast<u32>(n_above));
    }
    ptx::ClusterSync();  // every CTA holds every candidate and every CTA's count above
    for (u32 q = 0; q < part.rank; ++q) above_lower += sm.above_all[q];
  }
  const CandidateSource cands{sm.cand, total};
  KFORGE_TOPK_PHASE(21);
  if (!whole) FinishSelect<T, 1>(cands, s, sm, 0);
  // The candidates above the threshold, or equal to it within the first
  // rem: b[0, n_b), position order (the row's, not only the part's).
  int* b = sm.sel + n_above;
  const Before bc =
      ScanInPositionOrder<T, true>(cands, Before{0, 0}, sm, s.prefix, s.prefix | ~s.mask,
                                   [&](u32, int pos, bool is_above, int gt, int eq) {
                                     if (is_above || eq < s.rem) b[gt + min(eq, s.rem)] = pos;
                                   });
  const int n_b = bc.gt + min(bc.eq, s.rem);
  KFORGE_TOPK_PHASE(22);
  // This CTA's survivors take consecutive ranks from `first`: its keys
  // above the bin and the surviving candidates inside its part.
  const int b_lo = kC == 1 ? 0 : CountBelow(b, n_b, part.beg);
  const int b_hi = kC == 1 ? n_b : CountBelow(b, n_b, part.end);
  const int first = above_lower + b_lo;
  const int n = n_above + (b_hi - b_lo);
  int* staged = reinterpret_cast<int*>(sm.cand);  // free after the scan's last barrier
  // Ranks: each a lower bound of the position in the other list. One CTA
  // a row: up to kQ outputs a thread at once, by halving steps (the same
  // steps in every thread, so a thread's searches' loads go out together;
  // a slot past n loads nothing): H200 1 x 32768 2.3 -> 1.7 us. The
  // cluster's parts (a few hundred outputs a CTA) keep one search a
  // thread: the batched one measured 0.9 us slower there (BENCH.md).
  if constexpr (kC == 1) {
    constexpr int kQ = 4;
    const int top = 1 << (31 - __clz(max(n_b, n_above) | 1));
    for (int i0 = threadIdx.x; i0 < n; i0 += kQ * T::kTopkThreads) {
      int pos[kQ], base[kQ], lo[kQ], na[kQ];
      const int* a[kQ];
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        const int i = i0 + q * T::kTopkThreads;
        lo[q] = 0;
        na[q] = 0;  // no search past n
        if (i >= n) continue;
        if (i < n_above) {
          pos[q] = sm.sel[i];
          base[q] = i - b_lo;
          a[q] = b;
          na[q] = n_b;
        } else {
          const int j = b_lo + i - n_above;
          pos[q] = b[j];
          base[q] = j - b_lo;
          a[q] = sm.sel;
          na[q] = n_above;
        }
      }
      for (int step = top; step > 0; step >>= 1) {
#pragma unroll
        for (int q = 0; q < kQ; ++q) {
          if (lo[q] + step <= na[q] && a[q][lo[q] + step - 1] < pos[q]) lo[q] += step;
        }
      }
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        if (i0 + q * T::kTopkThreads < n) {
          const int rank = base[q] + lo[q];
          out.indices[first + rank] = pos[q];
          if (out.slots != nullptr) staged[rank] = pos[q];
        }
      }
    }
  } else {
    for (int i = threadIdx.x; i < n; i += T::kTopkThreads) {
      int pos, rank;  // rank from first
      if (i < n_above) {
        pos = sm.sel[i];
        rank = i + CountBelow(b, n_b, pos) - b_lo;
      } else {
        const int j = b_lo + i - n_above;
        pos = b[j];
        rank = j - b_lo + CountBelow(sm.sel, n_above, pos);
      }
      out.indices[first + rank] = pos;
      if (out.slots != nullptr) staged[rank] = pos;
    }
  }
  KFORGE_TOPK_PHASE(23);
  if (out.slots != nullptr) {
    __syncthreads();
    out.WriteSlots<T::kTopkThreads>(first, n, [&](int i) { return staged[i]; });
  }
}

// The kTopk largest keys of a row longer than kTopk, written to out by
// rank in position order (module notes).
template <class T, int kC>
__device__ __forceinline__ void SelectLargest(const float* logits, const RowPart part,
                                              const TopkSmem<T>& sm, const RowOutput& out) {
  const RowSource row{logits, part.beg, part.end};
  Selection s{0u, 0u, T::kTopk, 0, 0};
  const bool whole = NextDigit<T, kC, RowSource, false>(row, 0, s, sm, part.rank);
  if (sm.sel_count() <= kTopkCandidates) {  // the row's boundary bin fits one CTA
    MergeSelect<T, kC>(row, part, whole, s, sm, out);
    return;
  }
  if constexpr (kC > 1) CountAbove<T>(s, sm);  // the first digit's, for SurvivorsBefore
  if (!whole) {
    // Each CTA keeps its own share of the bin when it fits, else reads its
    // part again for each later digit; the cluster merges every digit.
    const int mine = sm.hist[s.bin];
    KeepCandidates<T>(row, s, sm, [&](int i, unsigned long long w) {
      if (i < kTopkCandidates) sm.cand[i] = w;
    });
    if (mine <= kTopkCandidates) {
      FinishSelect<T, kC>(CandidateSource{sm.cand, mine}, s, sm, part.rank);
    } else {
      FinishSelect<T, kC>(row, s, sm, part.rank);
    }
  }
  // One more pass writes the survivors (the CTAs read each other's counts
  // for them first).
  const Before before = SurvivorsBefore<T, kC>(s, sm, part.rank);
  WriteSurvivors<T>(row, s, before, sm, out);
  if constexpr (kC > 1) ptx::ClusterSync();  // no CTA reads another's counts any more
}

// kC CTAs per row (1, or kTopkClusterCtas in the cluster entry, whose
// grid is rows * kC CTAs in clusters of kC along x).
template <class T, int kC = 1>
__device__ __forceinline__ void TopkMain(const TopkParams& p) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kK = T::kTopk;
  TopkSmem<T> sm;
  sm.cand = reinterpret_cast<unsigned long long*>(smem);
  sm.hist = reinterpret_cast<int*>(sm.cand + kTopkCandidates);
  sm.counters = sm.hist + kTopkBins;
  sm.excl = sm.counters + kTopkCounters;
  sm.sel = sm.excl + kTopkUnroll * T::kTopkThreads;
  sm.hist_sum = sm.sel + kK;
  sm.above_all = sm.hist_sum + kTopkBins;
  const int tid = threadIdx.x;
  const int row = static_cast<int>(blockIdx.x) / kC;
  const u32 rank = kC == 1 ? 0u : ptx::ClusterCtaRank();
  if (row >= p.rows) return;  // a grid past the rows (a launch not this build's)

  KFORGE_TOPK_PHASE(0);
  // The first digit's histogram, zeroed while the logits kernel finishes
  // (shared memory only: nothing global comes before the wait).
  ZeroHistogram<T>(sm);
  if constexpr (kC > 1) {
    // The cluster's first-digit sums, zeroed before any CTA adds to them
    // (MergeHistogram waits for this arrival).
    for (int j = tid; j < kTopkBins; j += T::kTopkThreads) sm.hist_sum[j] = 0;
    ptx::ClusterArrive();
  }
  ptx::WaitForPriorGrids();
  ptx::AllowDependentLaunch();  // the next kernel waits for this grid in turn
  KFORGE_TOPK_PHASE(1);
  const QueryRow qr = LocateRow(p, row);
  const int b = qr.b;
  const int len = min(qr.len, p.max_context);
  const float* logits = p.logits + static_cast<long long>(row) * p.logits_stride;
  RowOutput out;
  out.indices = p.indices + static_cast<long long>(row) * p.indices_stride;
  out.slots = p.slots != nullptr ? p.slots + static_cast<long long>(row) * p.slots_stride : nullptr;
  out.table = p.block_table != nullptr && b >= 0
                  ? p.block_table + static_cast<long long>(b) * p.block_table_stride
                  : nullptr;
  out.page = p.slot_page_size;

  KFORGE_TOPK_PHASE(2);
  if (len <= kK) {
    if constexpr (kC > 1) ptx::ClusterWait();  // the start's arrival, matched
    if (rank != 0) return;  // the whole row is the rank-0 CTA's (no cluster traffic)
    for (int j = tid; j < kK; j += T::kTopkThreads) out.indices[j] = j < len ? j : -1;
    if (out.slots != nullptr) {
      out.WriteSlots<T::kTopkThreads>(0, kK, [&](int j) { return j < len ? j : -1; });
    }
  } else {
    // Parts of a multiple of 4 positions keep 16-byte loads aligned.
    const int chunk = ((len + kC - 1) / kC + 3) & ~3;
    const RowPart part{min(len, static_cast<int>(rank) * chunk),
                       min(len, static_cast<int>(rank + 1) * chunk), rank};
    SelectLargest<T, kC>(logits, part, sm, out);
  }
  KFORGE_TOPK_PHASE(30);
}

}  // namespace dsa_indexer
}  // namespace kforge

#endif  // KFORGE_DSA_INDEXER_TOPK_CUH_
