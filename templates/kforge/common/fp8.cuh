// fp8 e4m3 (e4m3fn: 1 sign, 4 exponent bits with bias 7, 3 mantissa bits;
// no infinities, 0x7f / 0xff are NaN, max 448, min subnormal 2^-9) and fp4
// e2m1 to wider types, two codes at a time.
//
// sm_89 and newer convert in hardware (cvt.rn.f16x2.e4m3x2, PTX ISA 7.8);
// sm_80 / sm_86 have no fp8 conversion, so there the bits are rearranged in
// integer registers. Both produce f16x2 bits: every e4m3 value is exact in
// fp16 (fp16 has 10 mantissa bits and reaches 2^-24). The software path
// returns the value times 2^-8 (its exponent keeps e4m3's bias 7 inside
// fp16's bias 15); E4m3Half2 tells the caller which factor to fold into its
// scale. The software half is plain C++ (KFORGE_HD) so a host test checks
// it against CUDA's reference conversion for all 256 codes.
#ifndef KFORGE_COMMON_FP8_CUH_
#define KFORGE_COMMON_FP8_CUH_

#ifndef KFORGE_HD
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KFORGE_HD __host__ __device__
#else
#define KFORGE_HD
#endif
#endif

namespace kforge {
namespace fp8 {

// Two e4m3 codes (bits 0-7 and 8-15 of `pair`) as f16x2 bits (low code in
// the low half) of value * 2^-8, exact for every code: sign to bit 15, the
// 7 exponent+mantissa bits to bits 13..7, so an e4m3 subnormal becomes an
// fp16 subnormal of the same scaled value; NaN codes become fp16 NaN.
KFORGE_HD inline unsigned int E4m3x2ToHalf2BitsSoft(unsigned int pair) {
  const unsigned int t = (pair & 0xFFu) | ((pair & 0xFF00u) << 8);
  const unsigned int mag = t & 0x007F007Fu;
  // 1 in a lane's bit 0 exactly when its magnitude is 0x7f (0x7f + 1 is the
  // only sum that reaches bit 7; no carry crosses lanes).
  const unsigned int nan = ((mag + 0x00010001u) >> 7) & 0x00010001u;
  return ((t & 0x00800080u) << 8) | (mag << 7) | (nan * 0x7FFFu);
}

// The factor the software path's halves are short of (2^8).
constexpr float kSoftHalfFactor = 256.f;

// Two e2m1 (fp4: sign, 2 exponent bits with bias 1, 1 mantissa bit; the
// magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6) codes, the low nibble of `byte`
// and then its high nibble, as bf16x2 bits (low nibble in the low half) of
// value * 2^-126, exact: the 3 magnitude bits go to bf16 bits 8..6 as they
// are (exponent field 0..3, the mantissa's top bit), which is the value
// scaled by 2^-126 for the subnormal code 1 (0.5, the bf16 subnormal
// 2^-127) and the normal ones alike; the sign to bit 15. One multiply of
// the byte places the high nibble 12 bits above the low one, where the same
// two shifts take both halves to their places.
KFORGE_HD inline unsigned int E2m1x2ToBf16x2Bits(unsigned int byte) {
  const unsigned int t = byte * 0x1001u;
  return ((t << 6) & 0x01C001C0u) | ((t << 12) & 0x80008000u);
}

// The power of two E2m1x2ToBf16x2Bits's halves are short of.
constexpr int kE2m1Bf16Exp = 126;

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Four e4m3 codes (bytes 0..3 of `w`) as two f16x2 words: h01 holds codes
// 0 (low half) and 1, h23 codes 2 and 3; each half is the value divided by
// kE4m3HalfFactor. Hardware conversion where the arch has it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
constexpr float kE4m3HalfFactor = 1.f;
__device__ __forceinline__ void E4m3x4ToHalf2(unsigned int w, unsigned int& h01,
                                              unsigned int& h23) {
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, lo;\ncvt.rn.f16x2.e4m3x2 %1, hi;\n}\n"
      : "=r"(h01), "=r"(h23)
      : "r"(w));
}
#else
constexpr float kE4m3HalfFactor = kSoftHalfFactor;
__device__ __forceinline__ void E4m3x4ToHalf2(unsigned int w, unsigned int& h01,
                                              unsigned int& h23) {
  h01 = E4m3x2ToHalf2BitsSoft(w & 0xFFFFu);
  h23 = E4m3x2ToHalf2BitsSoft(w >> 16);
}
#endif

// f16x2 bits to two floats (exact; fp16 subnormals included).
__device__ __forceinline__ void Half2ToFloat2(unsigned int h, float& lo, float& hi) {
  asm("{\n.reg .f16 l, h;\nmov.b32 {l, h}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, h;\n}\n"
      : "=f"(lo), "=f"(hi)
      : "r"(h));
}

#endif  // __CUDACC__ || __CUDACC_RTC__

}  // namespace fp8
}  // namespace kforge

#endif  // KFORGE_COMMON_FP8_CUH_
