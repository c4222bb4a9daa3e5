// The warp-specialised pipeline of the sparse MLA main kernel (sm_90a;
// Pipeline::kWarpSpecialized and kCrossoverPair, tiling.h WarpSpecialized):
// the 64-head wgmma tiling of a staged KV format (fp8_ds_mla, V4, V4.1,
// nvfp4) with a producer warpgroup.
//
// Warps 0..3 (the S warpgroup) compute S = Q K^T for all 64 tokens of a
// tile (QkWgmma m64n64: Q is read from shared memory once a tile), mask,
// run the online softmax, write P and the rows' rescale factors, then
// O[:, 0 : d_v / 2) += P V; warps 4..7 (the PV warpgroup) only rescale
// O[:, d_v / 2 : d_v) and add their P V. Both run the shared-memory
// pipeline's phases as they are (MaskScaleRowMax, OnlineSoftmaxToP,
// RescaleO, PvWgmma, the epilogues). Warps 8..11, the producer, never
// compute: for every tile they load the tokens' records into registers
// (the formats' RegLoad, the register pipeline's seam), wait for a free
// bf16 KV tile, convert into it (RegItem, RegRope) and arrive on its `full`
// mbarrier; the MMA warps wait on `full` and arrive on the tile's `empty`
// mbarrier once their PV has read it. With two tiles the gather and the
// conversion of tile t + 1 run while tile t is computed, where the staged
// pipeline runs them in lockstep between CTA barriers (docs/KERNEL.md).
//
// The two MMA warpgroups hand P and the rows' rescale factors over through
// two more mbarriers: `p_full` (every S thread arrives once it wrote this
// tile's P and factors; the PV warps wait) and `p_empty` (every PV thread
// arrives once its wgmma read P; the S warps wait before writing the next
// tile's). Mbarriers rather than named barriers with bar.arrive, which
// order the same way but which compute-sanitizer's racecheck does not
// follow (it reported the factors' write and read as a race).
// Registers: setmaxnreg moves them from the producer and the PV warps to
// the S warps (the CTA is compiled for 384 threads, 168 each).
//
// Producer thread map: warp pw (0..3) of the producer owns tile rows
// 16 pw .. 16 pw + 15; lane (n, q) = (lane % 8, lane / 8) takes rows
// 16 pw + n and 16 pw + 8 + n, and of each, for every w in 0..3, the
// format's register unit (w, q): items 8 w + q and 8 w + 4 + q and rope
// columns 16 w + 4 q .. + 3. Eight lanes store the same item of eight rows
// (distinct swizzled chunks: no bank conflicts), and each row's 16 units
// are loaded by four lanes of one warp. A format with kWsRowLoad (fp8_ds_mla
// with power-of-two scales) loads the same items, a row's scales in one
// 16-byte load, and rope columns 16 q .. 16 q + 15 (ConvertWsRow).
#ifndef KFORGE_SPARSE_MLA_SM90_WSPATH_CUH_
#define KFORGE_SPARSE_MLA_SM90_WSPATH_CUH_

#include "kforge/common/ptx.cuh"
#include "kforge/sparse_mla/common/decode_phases.cuh"
#include "kforge/sparse_mla/common/decode_traits.cuh"
#include "kforge/sparse_mla/common/kv_format.cuh"
#include "kforge/sparse_mla/common/mma.cuh"
#include "kforge/sparse_mla/common/params.h"
#include "kforge/sparse_mla/common/tiling.h"
#include "kforge/sparse_mla/sm90/qk.cuh"

namespace kforge {
namespace sparse_mla {

// Registers per thread after the reallocation: 208 + 160 + 136 = 504, the
// 168 x 3 the CTA starts with. The PV warps hold O's half and little else,
// but at 152 they spilled 240 bytes; 208 keeps the S warps (S, O, the
// softmax) and the producer (a tile's raw records) spill-free for
// fp8_ds_mla, main and cluster entries alike (kforge inspect: local 0).
constexpr int kWsRegsS = 208;
constexpr int kWsRegsPv = 160;
constexpr int kWsRegsProducer = 136;
// A crossover pair's producer that loads the next tile's records before
// converting this one's (T::kPairLoadAhead) holds two tiles' records of
// one row: 8 more registers, from the S warps (spill-free at 200). The
// unpaired producer of a WsRow format (F::kWsRowLoad) takes the same 8:
// at 136 fp8_ds_mla's 128-head main entry spilled 8 bytes and ran 128 x
// 128 in 212.8 us, at 144 spill-free in 204.7 (H200, BENCH.md "Issue 45:
// the fp8 producer's row in 16-byte loads").
constexpr int kWsAheadRegsS = 200;
constexpr int kWsAheadRegsProducer = 144;

// Where a producer lane's rope unit (u, q) of tile row `row` goes: rope
// columns d_v + 16 u + 4 q .. + 3, half of 16-byte chunk (d_v + 16 u) / 8 +
// q / 2.
template <class T>
__device__ __forceinline__ ptx::u32 RopeUnitAddr(ptx::u32 tile, int row, int u, int q) {
  return TileChunkAddr<T>(tile, row, (T::kDv + 16 * u) / 8 + q / 2) + 8 * (q % 2);
}

// ConvertRow's rope store into this CTA's shared memory (two 4-byte
// stores: a rope unit's two bf16x2 words).
struct StoreRopeShared {
  __device__ __forceinline__ void operator()(ptx::u32 dst, ptx::u32 a, ptx::u32 b) const {
    ptx::StShared32(dst, a);
    ptx::StShared32(dst + 4, b);
  }
};

// Converts one tile row's four register units (raw[u], u = 0..3: the
// format's RegLoad of lane (n, q)) into the bf16 KV tile: items 8 u + 4 gi +
// q through `store` (StoreChunkPair's 16-byte stores) and the rope columns
// of unit (u, q) through `store_rope` (address, two words). Both producers
// run it: WsProduce with plain shared stores, the crossover pair's with
// stores to this CTA and its peer (kInProducer: the pair's RegItem).
template <class T, bool kInProducer, class Store, class StoreRope>
__device__ __forceinline__ void ConvertRow(const typename T::Kv::RegRaw (&raw)[4], ptx::u32 tile,
                                           int row, int q, Store&& store, StoreRope&& store_rope) {
  using Kv = typename T::Kv;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
#pragma unroll
    for (int gi = 0; gi < 2; ++gi) {
      ptx::u32 out[8];
      Kv::template RegItem<kInProducer, true>(raw[u], gi, u, q, out);
      // Item 8 u + 4 gi + q: block 2 u + gi, whose parity (gi) is known here,
      // so the chunk order needs no selects where the format takes it
      // (StoreItemWith's runtime item cost fp8_ds_mla's producer 128 SEL a
      // tile).
      if constexpr (Kv::kConstChunkOrder) {
        StoreChunkPair<T>(tile, row, 2 * u + gi, 2 * q + gi, gi == 1, out, store);
      } else {
        StoreItemWith<T>(tile, row, 8 * u + 4 * gi + q, out, store);
      }
    }
    if constexpr (T::kRope != 0) {
      ptx::u32 rope[2];
      Kv::RegRope(raw[u], rope);
      store_rope(RopeUnitAddr<T>(tile, row, u, q), rope[0], rope[1]);
    }
  }
}

// ConvertRow for a format's WsRow (F::kWsRowLoad): items 8 u + 4 gi + q
// through StoreChunkPair, and lane q's rope columns 16 q .. 16 q + 15 as
// loaded, two 16-byte stores (chunks d_v / 8 + 2 q and + 1: each 8-lane
// phase stores one chunk of eight rows, no bank conflicts).
template <class T>
__device__ __forceinline__ void ConvertWsRow(const typename T::Kv::WsRow& raw, ptx::u32 tile,
                                             int row, int q) {
  using Kv = typename T::Kv;
  static_assert(Kv::kConstChunkOrder, "a WsRow format stores in the compile-time chunk order");
  // The rope first: its registers are free before the conversion's.
  if constexpr (T::kRope != 0) {
    static_assert(T::kRope == 64, "four lanes of 16 rope columns");
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint4& c = raw.rope[i];
      ptx::StShared128(TileChunkAddr<T>(tile, row, T::kDv / 8 + 2 * q + i), c.x, c.y, c.z, c.w);
    }
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) {
#pragma unroll
    for (int gi = 0; gi < 2; ++gi) {
      ptx::u32 out[8];
      Kv::WsRowItem(raw, u, gi, out);
      StoreChunkPair<T>(tile, row, 2 * u + gi, 2 * q + gi, gi == 1, out, StoreShared128{});
    }
  }
}

// Whether WsProduce (a staged format's unpaired producer) loads WsRows:
// the format's kWsRowLoad, with rope 64 (the geometry measured; with rope 0
// the 128-head main entry spilled 8 bytes).
template <class T>
__device__ __forceinline__ constexpr bool WsRowLoads() {
  if constexpr (T::kStaged) {
    return T::Kv::kWsRowLoad && T::kRope == 64;
  } else {
    return false;
  }
}

// What WsProduce holds of one row: the format's WsRow, or RegLoad's four
// units.
template <class T, bool = WsRowLoads<T>()>
struct WsRaw {
  using type = typename T::Kv::RegRaw[4];
};
template <class T>
struct WsRaw<T, true> {
  using type = typename T::Kv::WsRow;
};

// The producer warpgroup: fills the bf16 KV tiles of every tile of the work
// item in turn.
template <class T>
__device__ __forceinline__ void WsProduce(const DecodeParams& p, const DecodeWork& w,
                                          const DecodeSmem& sm, const ThreadRoles& r, ptx::u32 full,
                                          ptx::u32 empty) {
  using Kv = typename T::Kv;
  constexpr int kRows = 2;  // tile rows per lane
  const int pw = r.warp - T::kWarps, n = r.lane % 8, q = r.lane / 8;
  const KvView v = MainKv(p);
  auto slot_of = [&](int tile, int j) {
    const int pos = w.begin + tile * T::kTokenTile + 16 * pw + 8 * j + n;
    return tile < w.num_tiles && pos < w.main_end ? __ldg(w.idx_row + pos) : -1;
  };
  int slot[kRows];
#pragma unroll
  for (int j = 0; j < kRows; ++j) slot[j] = slot_of(0, j);
#pragma unroll 1
  for (int t = 0; t < w.num_tiles; ++t) {
    const int stage = t % T::kStages;
    // A format's WsRow (kWsRowLoad) or RegLoad's four units a row.
    typename WsRaw<T>::type raw[kRows];
    bool ok[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      ok[j] = v.Holds(slot[j]);
      if constexpr (WsRowLoads<T>()) {
        Kv::template WsRowLoad<T, T::kPageBlock>(v, slot[j], ok[j], q, raw[j]);
      } else {
#pragma unroll
        for (int u = 0; u < 4; ++u)
          Kv::template RegLoad<T, T::kPageBlock>(v, slot[j], ok[j], u, q, raw[j][u]);
      }
    }
    // Tile t + 2's slots (kProducerPrefetchL2), read again as `slot` next tile:
    // keeping them from here instead measured no faster (BENCH.md, "V4's
    // producer: each slot read once").
    [[maybe_unused]] int ahead[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      slot[j] = slot_of(t + 1, j);
      if constexpr (T::kProducerPrefetchL2) ahead[j] = slot_of(t + 2, j);
    }
    // The tile's previous use (t - kStages) was read by every MMA thread.
    ptx::MbarWait(empty + 8 * stage, ((t / T::kStages) & 1) ^ 1);
    const ptx::u32 tile = sm.kv_addr + stage * T::kTileBytes;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int row = 16 * pw + 8 * j + n;
      if constexpr (WsRowLoads<T>()) {
        ConvertWsRow<T>(raw[j], tile, row, q);
      } else {
        ConvertRow<T, false>(raw[j], tile, row, q, StoreShared128{}, StoreRopeShared{});
      }
      if (q == 0) sm.valid[stage * T::kTokenTile + row] = ok[j];
    }
    // wgmma reads the tile through the async proxy.
    ptx::FenceProxyAsync();
    ptx::MbarArrive(full + 8 * stage);
    // With kProducerPrefetchL2: tile t + 2's records into L2 once this
    // tile's registers are free, so its loads (after the next tile's
    // conversion) hit L2 rather than wait for DRAM (ncu, fp8 128 x 32: the
    // S warps waited on `full` for over half their samples, the producer
    // on its loads).
    if constexpr (T::kProducerPrefetchL2) {
      if (q == 0) {
#pragma unroll
        for (int j = 0; j < kRows; ++j) {
          Kv::template RegPrefetch<T, T::kPageBlock>(v, ahead[j], v.Holds(ahead[j]));
        }
      }
    }
  }
}

// The crossover pair's producer (kPair: a 2-CTA cluster over two head
// groups of one query token and split, whose KV tiles are the same; the
// "crossover" of FlashMLA's fp8 decode): CTA `rank` of the pair converts
// rows 32 rank .. 32 rank + 31 of every tile, one a lane (warp pw, lane
// (n, q): row 32 rank + 8 pw + n, its units (u, q) as WsProduce's), and
// stores each into its own tile and, by StAsync, into the peer's, whose
// `full` barrier counts those bytes (kPairBytes, announced by the peer's
// producer thread 0). So each record is loaded and converted once for the
// two head groups. With one row a lane the registers also hold the next
// tile's records: a tiling with kPairLoadAhead loads them before this
// tile's conversion, the others once it is stored. The peer's MMA warps
// arrive on this CTA's `empty` too (one arrival of 32 a warp): a slot is
// refilled once both CTAs' MMA warps have read it.
template <class T>
__device__ __forceinline__ void WsProducePair(const DecodeParams& p, const DecodeWork& w,
                                              const DecodeSmem& sm, const ThreadRoles& r,
                                              ptx::u32 full, ptx::u32 empty) {
  using Kv = typename T::Kv;
  constexpr ptx::u32 kPairBytes = PairBytesPerTile(T::kShape);
  const int pw = r.warp - T::kWarps, n = r.lane % 8, q = r.lane / 8;
  const ptx::u32 peer = ptx::ClusterCtaRank() ^ 1u;
  const int row = 32 * static_cast<int>(peer ^ 1u) + 8 * pw + n;
  const bool announcer = pw == 0 && r.lane == 0;
  const KvView v = MainKv(p);
  // Shared-window offset -> the peer's distributed-shared-memory address
  // of the same offset.
  const ptx::u32 to_peer = ptx::MapShared(sm.kv_addr, peer) - sm.kv_addr;
  const ptx::u32 peer_full = ptx::MapShared(full, peer);
  auto slot_of = [&](int tile) {
    const int pos = w.begin + tile * T::kTokenTile + row;
    return tile < w.num_tiles && pos < w.main_end ? __ldg(w.idx_row + pos) : -1;
  };
  typename Kv::RegRaw raw[4];
  int slot = slot_of(0);
  bool ok = v.Holds(slot);
#pragma unroll
  for (int u = 0; u < 4; ++u) Kv::template RegLoad<T, T::kPageBlock>(v, slot, ok, u, q, raw[u]);
#pragma unroll 1
  for (int t = 0; t < w.num_tiles; ++t) {
    const int stage = t % T::kStages;
    slot = slot_of(t + 1);
    const bool next_ok = v.Holds(slot);
    typename Kv::RegRaw next[4];
    if constexpr (T::kPairLoadAhead) {
#pragma unroll
      for (int u = 0; u < 4; ++u)
        Kv::template RegLoad<T, T::kPageBlock>(v, slot, next_ok, u, q, next[u]);
    }
    // The slot's previous use (t - kStages) was read by both CTAs' MMA
    // warps.
    ptx::MbarWait(empty + 8 * stage, ((t / T::kStages) & 1) ^ 1);
    const ptx::u32 tile = sm.kv_addr + stage * T::kTileBytes;
    const ptx::u32 bar = peer_full + 8 * stage;
    // Each chunk to this CTA's tile and the same offset of the peer's.
    auto store_both = [bar, to_peer](ptx::u32 addr, ptx::u32 a, ptx::u32 b, ptx::u32 c,
                                     ptx::u32 d) {
      ptx::StShared128(addr, a, b, c, d);
      ptx::StAsync128(addr + to_peer, a, b, c, d, bar);
    };
    ConvertRow<T, true>(raw, tile, row, q, store_both,
                        [bar, to_peer](ptx::u32 dst, ptx::u32 a, ptx::u32 b) {
                          StoreRopeShared{}(dst, a, b);
                          ptx::StAsync64(dst + to_peer, a, b, bar);
                        });
    if (q == 0) {
      // sm.valid[stage * kTokenTile + row], at its offset from the KV tiles.
      const ptx::u32 flag =
          sm.kv_addr + (T::kSmemValid - T::kSmemKv) + 4 * (stage * T::kTokenTile + row);
      ptx::StShared32(flag, ok ? 1u : 0u);
      ptx::StAsync32(flag + to_peer, ok ? 1u : 0u, bar);
    }
    ptx::FenceProxyAsync();
    // The peer's bytes into this CTA's tile are counted here, by one thread.
    if (announcer) {
      ptx::MbarArriveExpectTx(full + 8 * stage, kPairBytes);
    } else {
      ptx::MbarArrive(full + 8 * stage);
    }
    if constexpr (!T::kPairLoadAhead) {
#pragma unroll
      for (int u = 0; u < 4; ++u)
        Kv::template RegLoad<T, T::kPageBlock>(v, slot, next_ok, u, q, next[u]);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) raw[u] = next[u];
    ok = next_ok;
  }
}

// The producer of a direct format (bf16): every tile's rows copied straight
// into a free bf16 KV tile with cp.async (GatherKvTile; kThreadsPerRow threads a
// row, 16 rows a pass), nothing held in registers. Each producer thread
// arrives on the tile's `full` twice: once plainly after writing its rows'
// validity flags, once (cp.async.mbarrier.arrive.noinc) when its copies have
// landed; the MMA warps' wait then sees both.
template <class T>
__device__ __forceinline__ void WsCopy(const DecodeParams& p, const DecodeWork& w,
                                       const DecodeSmem& sm, const ThreadRoles& r, ptx::u32 full,
                                       ptx::u32 empty) {
  constexpr int kRowsPerPass = T::kLandWarps * 32 / kThreadsPerRow;
  const int tid = (r.warp - T::kWarps) * 32 + r.lane;
  const int row0 = tid / kThreadsPerRow, sub = tid % kThreadsPerRow;
  TileSlots<T, kRowsPerPass> slots;
#pragma unroll 1
  for (int t = 0; t < w.num_tiles; ++t) {
    const int stage = t % T::kStages;
    slots.Load(w, row0, t);
    ptx::MbarWait(empty + 8 * stage, ((t / T::kStages) & 1) ^ 1);
    GatherKvTile(p, slots, sm, row0, sub, stage);
    ptx::CpAsyncCommit();
    ptx::CpAsyncMbarArrive(full + 8 * stage);
    ptx::MbarArrive(full + 8 * stage);
  }
}

// Whether the crossover pair's producer loads ahead (a staged format's
// kPairLoadAhead, from the tuning table; a direct format runs no pair).
template <class T, bool kPair>
__device__ __forceinline__ constexpr bool PairLoadsAhead() {
  if constexpr (kPair) {
    return T::kPairLoadAhead;
  } else {
    return false;
  }
}

// An MMA warp's wait for a tile's `full` barrier. A tile written by
// cp.async (a direct format) or partly by the pair's peer (StAsync, whose
// bytes the barrier's transaction count covers): to wgmma's async proxy on
// this side.
template <class T, bool kPair>
__device__ __forceinline__ void WaitFull(ptx::u32 full, ptx::u32 parity) {
  ptx::MbarWait(full, parity);
  if constexpr (!T::kStaged || kPair) ptx::FenceProxyAsync();
}

// An MMA thread is done reading a tile: it arrives on its `empty` barrier;
// in the pair each warp also arrives (32 at once, after all its lanes) on
// the peer's, whose producer writes rows of this CTA's tile.
template <bool kPair>
__device__ __forceinline__ void ReleaseTile(ptx::u32 empty) {
  ptx::MbarArrive(empty);
  if constexpr (kPair) {
    __syncwarp();
    if (threadIdx.x % 32 == 0)
      ptx::MbarArriveRemote(ptx::MapShared(empty, ptx::ClusterCtaRank() ^ 1u), 32);
  }
}

// E: the entry (DecodeEntry), its pipeline and epilogue. E::kPair
// (Pipeline::kCrossoverPair): the crossover pair (WsProducePair), launched
// as clusters of 2 CTAs along the head groups (__cluster_dims__(2, 1, 1)).
template <class T, class E>
__device__ __forceinline__ void DecodeWarpSpecialized(const DecodeParams& p) {
  constexpr bool kPair = E::kPair;
  static_assert(T::kWarpSpecialized && T::kWgmma && T::kWarps == 8 && T::kLandWarps == 4 &&
                    T::kTokenTile == 64 && T::kExtraTopk == 0,
                "the warp-specialised pipeline: tiling.h WarpSpecialized, one cache");
  static_assert(!kPair || (PairCovers(T::kShape) && E::kEpilogue == Epilogue::kSplit),
                "the crossover pair: tiling.h PairCovers, no split cluster");
  // The pair's producer holding the next tile's records, or the unpaired
  // one loading WsRows: 8 more producer registers (from the S warps).
  constexpr bool kAhead = PairLoadsAhead<T, kPair>() || (!kPair && WsRowLoads<T>());
  using Qk = QkWgmma<T>;
  extern __shared__ __align__(128) unsigned char smem[];
  const DecodeSmem sm = CarveDecodeSmem<T>(smem);
  DecodeWork w = MakeDecodeWork<T>(p);
  const ThreadRoles r = MakeThreadRoles<T>();
  Qk::CheckSmemBase(sm.q_addr);
  // tiling.h's bar region: full[kStages], empty[kStages], p_full, p_empty.
  const ptx::u32 full = ptx::SmemAddr(smem + T::kSmemBar);
  const ptx::u32 empty = full + 8 * T::kStages;
  const ptx::u32 p_full = empty + 8 * T::kStages, p_empty = p_full + 8;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < T::kStages; ++s) {
      // A direct format's producer arrives twice a tile (WsCopy).
      ptx::MbarInit(full + 8 * s, (T::kStaged ? 1 : 2) * T::kLandWarps * 32);
      // The pair's peer MMA warps arrive too.
      ptx::MbarInit(empty + 8 * s, (kPair ? 2 : 1) * T::kWarps * 32);
    }
    ptx::MbarInit(p_full, T::kWarps / 2 * 32);  // a warpgroup's threads
    ptx::MbarInit(p_empty, T::kWarps / 2 * 32);
    ptx::FenceMbarInit();
  }
  // The barriers are initialised for everyone (the pair: both CTAs').
  if constexpr (kPair) {
    if (ptx::ClusterNumCtas() != 2 || gridDim.x % 2 != 0) __trap();
    ptx::ClusterSync();
  } else {
    __syncthreads();
  }

  BeginDecode<T, E>(p, w);
  // Only the MMA warps copy Q and wait for it (the S warps read it): the
  // producer's first gather starts at once and flies while Q lands.
  if (r.mma) {
    LoadQ<T, T::kWarps * 32 / kThreadsPerRow>(p, w, sm, r);
    ptx::CpAsyncCommit();
    ptx::CpAsyncWait<0>();
    // Q to wgmma's async proxy, then to the other MMA warps (named barrier
    // 1: the S warpgroup's row-max barriers 1 + wm are unused, kWarpsN 1).
    ptx::FenceProxyAsync();
    ptx::NamedBarrier(1, T::kWarps * 32);
  }

  const PvPhase<T> pv(r);
  RowStats<T> stats;  // the S warps' (PublishRowStats reads no other's)
  stats.Init();
  if (!r.mma) {
    ptx::SetMaxNRegDec<kAhead ? kWsAheadRegsProducer : kWsRegsProducer>();
    if constexpr (kPair) {
      WsProducePair<T>(p, w, sm, r, full, empty);
    } else if constexpr (T::kStaged) {
      WsProduce<T>(p, w, sm, r, full, empty);
    } else {
      WsCopy<T>(p, w, sm, r, full, empty);
      // The last tiles' copies landed before the epilogue overlays them.
      ptx::CpAsyncWait<0>();
    }
    OAccum<T> none;
    FinishDecode<T, E, false>(p, w, sm, r, pv, none, stats);
    // The pair: no CTA leaves while the other may still arrive on its
    // barriers.
    if constexpr (kPair) ptx::ClusterSync();
    return;
  }
  OAccum<T> o;
  ZeroO<T>(o);
  if (r.wn > 0) {
    // The PV warpgroup.
    ptx::SetMaxNRegDec<kWsRegsPv>();
#pragma unroll 1
    for (int t = 0; t < w.num_tiles; ++t) {
      const int stage = t % T::kStages;
      ptx::MbarWait(p_full, t & 1);
      // Already ordered through the S warps' wait and p_full; waited on
      // here too so this warpgroup's reads of the tile rest on the
      // producer's own release, not only on that chain.
      WaitFull<T, kPair>(full + 8 * stage, (t / T::kStages) & 1);
      RescaleO<T>(o, pv, sm);
      pv.Accumulate(o, sm, sm.kv_addr + stage * T::kTileBytes);
      ReleaseTile<kPair>(empty + 8 * stage);
      ptx::MbarArrive(p_empty);
    }
    FinishDecode<T, E>(p, w, sm, r, pv, o, stats);
    if constexpr (kPair) ptx::ClusterSync();
    return;
  }
  // The S warpgroup.
  ptx::SetMaxNRegInc<kAhead ? kWsAheadRegsS : kWsRegsS>();
  const Qk qk(sm, r);
#pragma unroll 1
  for (int t = 0; t < w.num_tiles; ++t) {
    const int stage = t % T::kStages;
    WaitFull<T, kPair>(full + 8 * stage, (t / T::kStages) & 1);
    const ptx::u32 k_tile = sm.kv_addr + stage * T::kTileBytes;
    float s[T::kSM][T::kSN][4];
    qk.Start(s, k_tile);
    qk.Finish(s);
    float mx[T::kSM][2];
    MaskScaleRowMax<T>(s, sm.valid + stage * T::kTokenTile, sm, r, mx);
    if (t > 0) ptx::MbarWait(p_empty, (t - 1) & 1);
    // The quad lanes' reads of the last tile's factors (RescaleO) before
    // lane 0's write of this tile's.
    __syncwarp();
    OnlineSoftmaxToP<T>(s, mx, stats, sm, r);
    // P to wgmma's async proxy, the factors to the quad lanes that read
    // them (RescaleO), both to the PV warps.
    ptx::FenceProxyAsync();
    __syncwarp();
    ptx::MbarArrive(p_full);
    RescaleO<T>(o, pv, sm);
    pv.Accumulate(o, sm, k_tile);
    ReleaseTile<kPair>(empty + 8 * stage);
  }
  FinishDecode<T, E>(p, w, sm, r, pv, o, stats);
  if constexpr (kPair) ptx::ClusterSync();
}

}  // namespace sparse_mla
}  // namespace kforge

#endif  // KFORGE_SPARSE_MLA_SM90_WSPATH_CUH_
