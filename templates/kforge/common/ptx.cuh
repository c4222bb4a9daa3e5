// Thin wrappers over the PTX the sparse attention templates need: 16-byte
// asynchronous copies, ldmatrix, bf16 mma.sync and fast exp2. Written here
// instead of including cuda_bf16.h / cuda_pipeline.h so that NVRTC needs no
// toolkit headers on the serving host. Every instruction exists on sm_80 and
// later, including sm_120 (which has no wgmma).
#ifndef KFORGE_COMMON_PTX_CUH_
#define KFORGE_COMMON_PTX_CUH_

namespace kforge {
namespace ptx {

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 SmemAddr(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy that bypasses L1. src_bytes == 0 writes zeros
// (used for invalid top-k slots, so V rows of masked tokens are 0, not NaN).
__device__ __forceinline__ void CpAsync16(u32 dst, const void* src, u32 src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
// 8-byte global->shared copy (through L1: .cg takes 16 bytes only); src
// and dst 8-byte aligned. src_bytes == 0 writes zeros.
__device__ __forceinline__ void CpAsync8(u32 dst, const void* src, u32 src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
// Programmatic dependent launch (sm_90+). A kernel launched with the
// programmatic-stream-serialization attribute may be scheduled while the
// kernel before it in the stream still runs: WaitForPriorGrids blocks until
// that kernel has completed and its writes are visible, so nothing a kernel
// reads or writes in global memory may come before it; AllowDependentLaunch
// lets the next kernel (launched with the attribute) be scheduled now, to
// wait in its own WaitForPriorGrids. Without the attribute, and before
// sm_90, both are no-ops.
__device__ __forceinline__ void WaitForPriorGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// A hint to bring the 128-byte line holding p into L2: no register, nothing
// to wait for.
__device__ __forceinline__ void PrefetchL2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// 16-byte shared-memory load (address 16-byte aligned).
__device__ __forceinline__ void LdShared128(u32 addr, u32 (&v)[4]) {
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(addr)
               : "memory");
}

// 16 bytes of read-only global memory (16-byte aligned) as four words.
__device__ __forceinline__ void LdGlobal128(const void* p, u32 (&v)[4]) {
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(p));
}

// A float of read-only global memory.
__device__ __forceinline__ float LdGlobalF32(const void* p) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}

// 4-byte shared-memory store (address 4-byte aligned).
__device__ __forceinline__ void StShared32(u32 addr, u32 v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// 16-byte shared-memory store (address 16-byte aligned).
__device__ __forceinline__ void StShared128(u32 addr, u32 a, u32 b, u32 c, u32 d) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}

__device__ __forceinline__ void Ldmatrix4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void Ldmatrix2(u32 addr, u32& r0, u32& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}
__device__ __forceinline__ void Ldmatrix4Trans(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// D = A * B + D, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void MmaBf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D = A * B + D, m16n8k16, f16 inputs, fp32 accumulators.
__device__ __forceinline__ void MmaF16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
// D = A * B + D, m16n8k32, e4m3 inputs, fp32 accumulators (sm_89 and
// newer). Fragments as MmaF16's with 4 one-byte k values per register:
// a0 / a2 row g, k 4t..4t+3 / 16+4t..; a1 / a3 row g + 8; b0 / b1 column g.
__device__ __forceinline__ void MmaE4m3(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// Two floats to packed bf16x2 (round to nearest even); lo in the low half.
__device__ __forceinline__ u32 PackBf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// a * b + c on bf16x2 (round to nearest even; subnormals kept: no ftz).
__device__ __forceinline__ u32 FmaBf16x2(u32 a, u32 b, u32 c) {
  u32 r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// 2^x with ex2.approx (relative error ~2^-22); 2^-inf = +0.
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- sm_90a warpgroup MMA (only instantiated for kWgmma traits) ----

// Shared-memory matrix descriptor for a K-major bf16 operand stored as
// 8-row x 128-byte atoms with the 128-byte swizzle (chunk ^ (row & 7)),
// atoms 1024 B apart along M/N. The swizzle works on absolute address bits,
// so atoms must be 1024-byte aligned.
__device__ __forceinline__ u64 SmemDescSw128(u32 smem_addr) {
  return static_cast<u64>((smem_addr & 0x3FFFF) >> 4)  // start address
         | (static_cast<u64>(1) << 16)                 // LBO: unused here
         | (static_cast<u64>(1024 >> 4) << 32)         // SBO: 8-row step
         | (static_cast<u64>(1) << 62);                // 128-byte swizzle
}

// Descriptor for an N-major (MN-major) bf16 operand with the 128-byte
// swizzle: 8 K-rows x 64 N-columns per 1024-byte atom, K-row groups 1024 B
// apart (SBO) and 64-column groups `n_block_bytes` apart (LBO).
__device__ __forceinline__ u64 SmemDescSw128MnMajor(u32 smem_addr, u32 n_block_bytes) {
  return static_cast<u64>((smem_addr & 0x3FFFF) >> 4)                // start address
         | (static_cast<u64>((n_block_bytes & 0x3FFFF) >> 4) << 16)  // LBO: N step
         | (static_cast<u64>(1024 >> 4) << 32)                       // SBO: 8-row K step
         | (static_cast<u64>(1) << 62);                              // 128-byte swizzle
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaWait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across
// the asynchronous wgmma that owns it.
__device__ __forceinline__ void FenceOperand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// The asm operands of four n8 accumulator tiles d[j] .. d[j + 3] (16
// floats, read and written), in the order the wgmma d list takes them.
#define KFORGE_WGMMA_D4(d, j)                                                              \
  "+f"(d[(j)][0]), "+f"(d[(j)][1]), "+f"(d[(j)][2]), "+f"(d[(j)][3]), "+f"(d[(j) + 1][0]), \
      "+f"(d[(j) + 1][1]), "+f"(d[(j) + 1][2]), "+f"(d[(j) + 1][3]), "+f"(d[(j) + 2][0]),  \
      "+f"(d[(j) + 2][1]), "+f"(d[(j) + 2][2]), "+f"(d[(j) + 2][3]), "+f"(d[(j) + 3][0]),  \
      "+f"(d[(j) + 3][1]), "+f"(d[(j) + 3][2]), "+f"(d[(j) + 3][3])

// D[64 x kN] += A[64 x 16] * B[16 x kN], bf16 in, fp32 accumulate, both
// operands K-major in shared memory. d holds this thread's kN / 2 values in
// the mma.sync C-fragment order per n8 tile.
template <int kN>
__device__ __forceinline__ void WgmmaBf16(float (&d)[kN / 8][4], u64 desc_a, u64 desc_b);

template <>
__device__ __forceinline__ void WgmmaBf16<32>(float (&d)[4][4], u64 desc_a, u64 desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, "
      "1, 1, 0, 0;\n}\n"
      : KFORGE_WGMMA_D4(d, 0)
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

template <>
__device__ __forceinline__ void WgmmaBf16<64>(float (&d)[8][4], u64 desc_a, u64 desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : KFORGE_WGMMA_D4(d, 0), KFORGE_WGMMA_D4(d, 4)
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

// D[64 x kN] += A[64 x 16] * B[16 x kN], bf16 in, fp32 accumulate: A
// K-major (SmemDescSw128), B N-major (SmemDescSw128MnMajor: rows of B are
// K, 64 N-columns per 128-byte row), as P V reads V straight from the
// row-major KV tile. d as in WgmmaBf16.
template <int kN>
__device__ __forceinline__ void WgmmaBf16TransB(float (&d)[kN / 8][4], u64 desc_a, u64 desc_b);

template <>
__device__ __forceinline__ void WgmmaBf16TransB<128>(float (&d)[16][4], u64 desc_a, u64 desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, %64, %65, p, 1, 1, 0, 1;\n}\n"
      : KFORGE_WGMMA_D4(d, 0), KFORGE_WGMMA_D4(d, 4), KFORGE_WGMMA_D4(d, 8), KFORGE_WGMMA_D4(d, 12)
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

template <>
__device__ __forceinline__ void WgmmaBf16TransB<256>(float (&d)[32][4], u64 desc_a, u64 desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : KFORGE_WGMMA_D4(d, 0), KFORGE_WGMMA_D4(d, 4), KFORGE_WGMMA_D4(d, 8), KFORGE_WGMMA_D4(d, 12),
        KFORGE_WGMMA_D4(d, 16), KFORGE_WGMMA_D4(d, 20), KFORGE_WGMMA_D4(d, 24),
        KFORGE_WGMMA_D4(d, 28)
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

// D[64 x kN] (+)= A[64 x 16] * B[16 x kN], f16 in, fp32 accumulate: A from
// registers (the m16n8k16 A fragment of rows 16 w + g, w the warp of the
// warpgroup: a0 / a1 rows g / g + 8 at k 2t, 2t + 1; a2 / a3 the same rows
// at k 2t + 8, 2t + 9), B K-major in shared memory (SmemDescSw128).
// `accumulate` false overwrites d. d as in WgmmaBf16. a must not change
// until the wgmma has completed (WgmmaWait0).
template <int kN>
__device__ __forceinline__ void WgmmaF16Rs(float (&d)[kN / 8][4], const u32 (&a)[4], u64 desc_b,
                                           bool accumulate);

template <>
__device__ __forceinline__ void WgmmaF16Rs<16>(float (&d)[2][4], const u32 (&a)[4], u64 desc_b,
                                               bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7"
      "}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate ? 1 : 0));
}

template <>
__device__ __forceinline__ void WgmmaF16Rs<32>(float (&d)[4][4], const u32 (&a)[4], u64 desc_b,
                                               bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
      "}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
      : KFORGE_WGMMA_D4(d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate ? 1 : 0));
}

template <>
__device__ __forceinline__ void WgmmaF16Rs<64>(float (&d)[8][4], const u32 (&a)[4], u64 desc_b,
                                               bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31"
      "}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
      : KFORGE_WGMMA_D4(d, 0), KFORGE_WGMMA_D4(d, 4)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate ? 1 : 0));
}

template <>
__device__ __forceinline__ void WgmmaF16Rs<128>(float (&d)[16][4], const u32 (&a)[4], u64 desc_b,
                                                bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%"
      "48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
      : KFORGE_WGMMA_D4(d, 0), KFORGE_WGMMA_D4(d, 4), KFORGE_WGMMA_D4(d, 8), KFORGE_WGMMA_D4(d, 12)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate ? 1 : 0));
}

// Orders this thread's generic-proxy writes to shared memory (cp.async,
// st.shared) before later async-proxy reads (wgmma).
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The body of a wrapper of an sm_90+ instruction: the instruction there, a
// trap on older archs (the codegen emits its callers for sm_90+ only).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KFORGE_SM90_ONLY(...) __VA_ARGS__
#else
#define KFORGE_SM90_ONLY(...) __trap()
#endif

// Bulk copies (sm_90+, the TMA unit) completing on an mbarrier. A copy of
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global
// to shared memory is one instruction of one thread; the barrier's phase
// completes when its one arrival (MbarArriveExpectTx, announcing the
// bytes) and all of those bytes have landed, and MbarWait(bar, parity)
// returns once the phase of that parity (0, 1, 0, ... for its uses in
// turn) has completed, the copied bytes visible to the waiting thread.
__device__ __forceinline__ void MbarInit(u32 bar, u32 arrivals) {
  KFORGE_SM90_ONLY(
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals)
                   : "memory"));
}
// After MbarInit, before the barrier's first use by a bulk copy.
__device__ __forceinline__ void FenceMbarInit() {
  KFORGE_SM90_ONLY(asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"));
}
__device__ __forceinline__ void MbarArriveExpectTx(u32 bar, u32 bytes) {
  KFORGE_SM90_ONLY(
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                   : "memory"));
}
// One arrival (no transaction bytes) by this thread, with release
// semantics: its earlier shared-memory writes are visible to a thread that
// waits on the phase this arrival completes.
__device__ __forceinline__ void MbarArrive(u32 bar) {
  KFORGE_SM90_ONLY(asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar)
                                : "memory"));
}
// One arrival, made when all of this thread's earlier cp.async copies have
// landed (.noinc: the barrier's expected count includes it).
__device__ __forceinline__ void CpAsyncMbarArrive(u32 bar) {
  KFORGE_SM90_ONLY(asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar)
                                : "memory"));
}
// The wait loop on a phase of `parity`; SEM: the try_wait's semantics
// ("": acquire at CTA scope, the default).
#define KFORGE_MBAR_WAIT_LOOP(SEM)     \
  "{\n.reg .pred done;\n"              \
  "KFORGE_MBAR_WAIT:\n"                \
  "mbarrier.try_wait.parity" SEM       \
  ".shared::cta.b64 done, [%0], %1;\n" \
  "@!done bra KFORGE_MBAR_WAIT;\n}\n"
__device__ __forceinline__ void MbarWait(u32 bar, u32 parity) {
  KFORGE_SM90_ONLY(asm volatile(KFORGE_MBAR_WAIT_LOOP("")::"r"(bar), "r"(parity) : "memory"));
}
// PrefetchL2 for `bytes` bytes from p (both multiples of 16; sm_90+, the
// TMA unit): one instruction for a whole record.
__device__ __forceinline__ void BulkPrefetchL2(const void* p, u32 bytes) {
  KFORGE_SM90_ONLY(asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes)
                                : "memory"));
}
__device__ __forceinline__ void BulkCopyToShared(u32 dst, const void* src, u32 bytes, u32 bar) {
  KFORGE_SM90_ONLY(asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory"));
}

// A float of shared memory.
__device__ __forceinline__ float LdSharedF32(u32 addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

// Barrier among `threads` threads (a multiple of 32) of the block using
// hardware barrier `id` (1..15; 0 is __syncthreads).
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Warpgroup register reallocation (sm_90a): every warp of the warpgroup
// executes the same one. Dec gives registers back to the CTA's pool, Inc
// waits until the pool has them.
template <int kRegs>
__device__ __forceinline__ void SetMaxNRegDec() {
  KFORGE_SM90_ONLY(asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs)));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxNRegInc() {
  KFORGE_SM90_ONLY(asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs)));
}

// Thread-block clusters (sm_90+; the codegen emits cluster entries for
// those archs only, so the fallbacks trap rather than compile to nothing).
// ClusterSync: every thread of every CTA of the cluster arrives (release:
// its earlier shared-memory writes become visible cluster-wide) and waits
// (acquire); it also guarantees every CTA of the cluster is running.
__device__ __forceinline__ void ClusterSync() {
  KFORGE_SM90_ONLY(
      asm volatile("barrier.cluster.arrive.release.aligned;\n"
                   "barrier.cluster.wait.acquire.aligned;\n" ::
                       : "memory"));
}
// ClusterSync in two halves, for work between them: every thread arrives
// (release), later waits (acquire); a thread waits before it arrives again.
__device__ __forceinline__ void ClusterArrive() {
  KFORGE_SM90_ONLY(asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"));
}
__device__ __forceinline__ void ClusterWait() {
  KFORGE_SM90_ONLY(asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"));
}
// This CTA's rank in its cluster.
__device__ __forceinline__ u32 ClusterCtaRank() {
  u32 r = 0;
  KFORGE_SM90_ONLY(asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r)));
  return r;
}
// CTAs in this CTA's cluster.
__device__ __forceinline__ u32 ClusterNumCtas() {
  u32 r = 0;
  KFORGE_SM90_ONLY(asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r)));
  return r;
}
// The address in CTA `rank`'s shared memory (distributed shared memory) of
// the same offset as this CTA's shared-window address `addr`.
__device__ __forceinline__ u32 MapShared(u32 addr, u32 rank) {
  u32 r = 0;
  KFORGE_SM90_ONLY(asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                                : "=r"(r)
                                : "r"(addr), "r"(rank)));
  return r;
}
// Loads from a MapShared address.
__device__ __forceinline__ float LdCluster(u32 addr) {
  float v = 0.f;
  KFORGE_SM90_ONLY(asm volatile("ld.shared::cluster.f32 %0, [%1];\n"
                                : "=f"(v)
                                : "r"(addr)
                                : "memory"));
  return v;
}
__device__ __forceinline__ float2 LdCluster2(u32 addr) {
  float2 v = make_float2(0.f, 0.f);
  KFORGE_SM90_ONLY(asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n"
                                : "=f"(v.x), "=f"(v.y)
                                : "r"(addr)
                                : "memory"));
  return v;
}

// 32-bit loads, stores and adds, and 64-bit stores, at MapShared
// addresses (the adds are atomic cluster-wide).
__device__ __forceinline__ u32 LdClusterU32(u32 addr) {
  u32 v = 0;
  KFORGE_SM90_ONLY(asm volatile("ld.shared::cluster.u32 %0, [%1];\n"
                                : "=r"(v)
                                : "r"(addr)
                                : "memory"));
  return v;
}
__device__ __forceinline__ void StClusterU32(u32 addr, u32 v) {
  KFORGE_SM90_ONLY(asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(addr), "r"(v)
                                : "memory"));
}
__device__ __forceinline__ void StClusterU64(u32 addr, unsigned long long v) {
  KFORGE_SM90_ONLY(asm volatile("st.shared::cluster.u64 [%0], %1;\n" ::"r"(addr), "l"(v)
                                : "memory"));
}
__device__ __forceinline__ void RedAddClusterU32(u32 addr, u32 v) {
  KFORGE_SM90_ONLY(asm volatile("red.shared::cluster.add.u32 [%0], %1;\n" ::"r"(addr), "r"(v)
                                : "memory"));
}
__device__ __forceinline__ u32 AtomAddClusterU32(u32 addr, u32 v) {
  u32 old = 0;
  KFORGE_SM90_ONLY(asm volatile("atom.shared::cluster.add.u32 %0, [%1], %2;\n"
                                : "=r"(old)
                                : "r"(addr), "r"(v)
                                : "memory"));
  return old;
}

// The crossover pair (wspath.cuh) across two CTAs of a cluster, on
// MapShared addresses in the peer's shared memory:
// StAsync*: a store that, once it has landed, completes its bytes on the
// peer's mbarrier `bar`, so the peer's wait on that barrier (a plain
// MbarWait: the transaction count, as for a bulk copy) sees the bytes.
__device__ __forceinline__ void StAsync128(u32 addr, u32 a, u32 b, u32 c, u32 d, u32 bar) {
  KFORGE_SM90_ONLY(asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, "
      "[%5];\n" ::"r"(addr),
      "r"(a), "r"(b), "r"(c), "r"(d), "r"(bar)
      : "memory"));
}
__device__ __forceinline__ void StAsync64(u32 addr, u32 a, u32 b, u32 bar) {
  KFORGE_SM90_ONLY(
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, "
                   "[%3];\n" ::"r"(addr),
                   "r"(a), "r"(b), "r"(bar)
                   : "memory"));
}
__device__ __forceinline__ void StAsync32(u32 addr, u32 v, u32 bar) {
  KFORGE_SM90_ONLY(asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr),
      "r"(v), "r"(bar)
      : "memory"));
}
// `count` arrivals on the peer's mbarrier at `bar`, with mbarrier.arrive's
// default semantics (release at CTA scope), as CUTLASS's consumers release
// a multicast TMA's slot: the arriving warp's reads of the slot are done
// (wgmma waited) before it arrives. Without release and acquire at
// cluster scope (`.release.cluster` here, `.acquire.cluster` on the
// waits) the pairs ran 4.5-10% faster (H100, BENCH.md "Crossover pairs at
// CTA scope").
__device__ __forceinline__ void MbarArriveRemote(u32 bar, u32 count) {
  KFORGE_SM90_ONLY(
      asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count)
                   : "memory"));
}

__device__ __forceinline__ float NegInf() { return __int_as_float(0xff800000); }

}  // namespace ptx
}  // namespace kforge

#endif  // KFORGE_COMMON_PTX_CUH_
