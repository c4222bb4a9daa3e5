// The software e4m3 conversion (templates/kforge/common/fp8.cuh), which
// sm_80 / sm_86 kernels use in place of cvt.rn.f16x2.e4m3x2, against the
// e4m3fn definition and against CUDA's own conversion (cuda_fp8.h's host
// path, NVIDIA's emulation of that instruction): every code, in both lanes
// of a pair.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"
#include "templates/kforge/common/fp8.cuh"

#if __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>
#define KFORGE_HAVE_CUDA_FP8 1
#endif

namespace kforge {
namespace {

// IEEE fp16 bits to double (every fp16 value is exact in double).
double HalfToDouble(uint16_t h) {
  const int sign = h >> 15;
  const int exp = (h >> 10) & 0x1F;
  const int man = h & 0x3FF;
  double v;
  if (exp == 0x1F) {
    v = man == 0 ? INFINITY : NAN;
  } else if (exp == 0) {
    v = std::ldexp(man, -24);
  } else {
    v = std::ldexp(1024 + man, exp - 25);
  }
  return sign ? -v : v;
}

// bf16 bits to double: the top half of an fp32 (exact, subnormals included).
double Bf16ToDouble(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// e4m3fn by its definition: bias 7, 3 mantissa bits, subnormals, no
// infinities, S.1111.111 is NaN.
double E4m3Definition(int code) {
  const int sign = code >> 7;
  const int exp = (code >> 3) & 0xF;
  const int man = code & 7;
  if (exp == 0xF && man == 7) return NAN;
  const double v = exp == 0 ? std::ldexp(man, -9) : std::ldexp(8 + man, exp - 10);
  return sign ? -v : v;
}

// The software path's value of `code` in lane `lane` of a pair whose other
// lane holds `other`.
double Soft(int code, int lane, int other) {
  const unsigned pair = lane == 0 ? (code | other << 8) : (other | code << 8);
  const unsigned h2 = fp8::E4m3x2ToHalf2BitsSoft(pair);
  const uint16_t h = static_cast<uint16_t>(lane == 0 ? h2 & 0xFFFF : h2 >> 16);
  return HalfToDouble(h) * fp8::kSoftHalfFactor;
}

void ExpectSame(double got, double want, int code) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << "code 0x" << std::hex << code;
    return;
  }
  EXPECT_EQ(got, want) << "code 0x" << std::hex << code;
  EXPECT_EQ(std::signbit(got), std::signbit(want)) << "code 0x" << std::hex << code;
}

// e2m1 by its definition (OCP MX fp4): bias 1, 1 mantissa bit, code 1 the
// subnormal 0.5.
double E2m1Definition(int code) {
  static const double kMagnitude[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double v = kMagnitude[code & 7];
  return code & 8 ? -v : v;
}

TEST(Fp8Test, E2m1MatchesTheDefinitionForEveryByte) {
  const double factor = std::ldexp(1.0, fp8::kE2m1Bf16Exp);
  for (int byte = 0; byte < 256; ++byte) {
    const unsigned b2 = fp8::E2m1x2ToBf16x2Bits(byte);
    const double lo = Bf16ToDouble(static_cast<uint16_t>(b2 & 0xFFFF)) * factor;
    const double hi = Bf16ToDouble(static_cast<uint16_t>(b2 >> 16)) * factor;
    ExpectSame(lo, E2m1Definition(byte & 0xF), byte);
    ExpectSame(hi, E2m1Definition(byte >> 4), byte);
  }
  // Anchors: the low nibble is the first value; 6 and -0.5 (a subnormal).
  const unsigned b2 = fp8::E2m1x2ToBf16x2Bits(0x97);  // high 0x9 = -0.5, low 0x7 = 6
  EXPECT_EQ(b2 & 0xFFFF, 0x01C0u);
  EXPECT_EQ(b2 >> 16, 0x8040u);
  EXPECT_EQ(Bf16ToDouble(b2 & 0xFFFF) * factor, 6.0);
  EXPECT_EQ(Bf16ToDouble(b2 >> 16) * factor, -0.5);
}

TEST(Fp8Test, SoftwareE4m3MatchesTheDefinitionForEveryCodeAndPair) {
  for (int code = 0; code < 256; ++code) {
    for (int other = 0; other < 256; ++other) {
      ExpectSame(Soft(code, 0, other), E4m3Definition(code), code);
      ExpectSame(Soft(code, 1, other), E4m3Definition(code), code);
    }
  }
  // Anchors: the largest finite value, the smallest subnormal, one, NaN.
  EXPECT_EQ(Soft(0x7E, 0, 0), 448.0);
  EXPECT_EQ(Soft(0xFE, 1, 0), -448.0);
  EXPECT_EQ(Soft(0x01, 0, 0), std::ldexp(1.0, -9));
  EXPECT_EQ(Soft(0x38, 0, 0), 1.0);
  EXPECT_TRUE(std::isnan(Soft(0x7F, 0, 0)));
  EXPECT_TRUE(std::isnan(Soft(0xFF, 1, 0)));
}

TEST(Fp8Test, SoftwareE4m3MatchesCudaConversionForEveryCode) {
#ifdef KFORGE_HAVE_CUDA_FP8
  for (int code = 0; code < 256; ++code) {
    const __half_raw ref =
        __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
    ExpectSame(Soft(code, 0, 0x55), HalfToDouble(ref.x), code);
    ExpectSame(Soft(code, 1, 0xAA), HalfToDouble(ref.x), code);
  }
#else
  GTEST_SKIP() << "cuda_fp8.h not found";
#endif
}

}  // namespace
}  // namespace kforge
