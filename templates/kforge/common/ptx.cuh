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
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// 16-byte shared-memory load and store (addresses 16-byte aligned).
__device__ __forceinline__ void LdShared128(u32 addr, u32 (&v)[4]) {
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "r"(addr)
               : "memory");
}
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

// Two floats to packed bf16x2 (round to nearest even); lo in the low half.
__device__ __forceinline__ u32 PackBf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
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
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(desc_a), "l"(desc_b), "r"(1));
}

// Orders this thread's generic-proxy writes to shared memory (cp.async,
// st.shared) before later async-proxy reads (wgmma).
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Barrier among `threads` threads (a multiple of 32) of the block using
// hardware barrier `id` (1..15; 0 is __syncthreads).
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ float NegInf() { return __int_as_float(0xff800000); }

}  // namespace ptx
}  // namespace kforge

#endif  // KFORGE_COMMON_PTX_CUH_
