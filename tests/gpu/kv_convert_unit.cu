// The nvfp4_ds_mla conversion (kv_format.cuh E2m1ItemToBf16: bf16 bits of
// e2m1 * 2^-126, code 1 a bf16 subnormal, then two bf16x2 multiplies) on
// the GPU against the definition: every byte value in every position of an
// item, times every e4m3 scale code (kv_format.cuh E4m3ToFloat), must give
// exactly the bf16 of value * scale (an exact product: 2 significant bits
// times 4), NaN for a NaN scale code. Checks that the hardware keeps bf16
// subnormal inputs (no flush to zero) where the template relies on it.
// Then the fp8_ds_mla conversion (E4m3Item16ToBf16, fp32 multiplies, and
// E4m3Item16ToBf16<true>, one bf16x2 multiply: the power-of-two scale
// modules'): every byte value in every position of an item times every
// power of two from 2^-133 (bf16's least subnormal) to 2^127 must give the
// bf16 (round to nearest even) of value * scale, NaN for a NaN code.
// Build and run on the GPU machine (tests/gpu/run_device_suite.sh):
//   nvcc -std=c++17 -arch=sm_90a -I templates -o /tmp/kv_convert_unit \
//       tests/gpu/kv_convert_unit.cu && /tmp/kv_convert_unit
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kforge/sparse_mla/common/kv_format.cuh"

namespace ks = kforge::sparse_mla;

// Item i: scale code i / 256; its 8 bytes are i % 256 and seven others
// derived from it, so every byte value sits in every position.
__host__ __device__ inline uint32_t ItemWord(int i, int half) {
  const uint32_t b = static_cast<uint32_t>(i) & 0xFFu;
  const uint32_t w =
      b | (((b + 37u) & 0xFFu) << 8) | (((b + 91u) & 0xFFu) << 16) | (((b * 7u) & 0xFFu) << 24);
  return half == 0 ? w : ~w;
}

// Both of the template's routes: two multiplies, and (kScaleBranch, the
// crossover producer's) one where |scale| < 4.
template <bool kScaleBranch>
__global__ void Convert(uint32_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const kforge::ptx::u32 w[2] = {ItemWord(i, 0), ItemWord(i, 1)};
  kforge::ptx::u32 o[8];
  ks::E2m1ItemToBf16<kScaleBranch>(w, ks::E4m3ToFloat(static_cast<uint32_t>(i) >> 8), o);
  for (int j = 0; j < 8; ++j) out[8 * i + j] = o[j];
}

double E2m1(uint32_t code) {
  static const double kMagnitude[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8u) ? -kMagnitude[code & 7u] : kMagnitude[code & 7u];
}

double E4m3(uint32_t code) {
  const int e = (code >> 3) & 15, m = code & 7;
  if ((code & 0x7Fu) == 0x7Fu) return NAN;
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (code & 0x80u) ? -v : v;
}

// Checks one route's output against the definition; returns the count wrong.
long CheckRoute(const std::vector<uint32_t>& got, const char* route) {
  long bad = 0, values = 0;
  for (int i = 0; i < static_cast<int>(got.size() / 8); ++i) {
    const double scale = E4m3(static_cast<uint32_t>(i) >> 8);
    for (int v = 0; v < 16; ++v) {
      const uint32_t byte = (ItemWord(i, v / 8) >> (8 * ((v / 2) % 4))) & 0xFFu;
      const double want = E2m1(v % 2 == 0 ? byte & 0xFu : byte >> 4) * scale;
      const uint32_t bits = (got[8 * i + v / 2] >> (16 * (v % 2))) & 0xFFFFu;
      const uint32_t f32 = bits << 16;
      float g;
      std::memcpy(&g, &f32, sizeof g);
      const bool ok = std::isnan(want)
                          ? std::isnan(g)
                          : static_cast<double>(g) == want && std::signbit(g) == std::signbit(want);
      if (!ok && bad++ < 8) {
        std::printf("%s: item %d value %d (byte 0x%02x, scale %g): got %g (0x%04x), want %g\n",
                    route, i, v, byte, scale, g, bits, want);
      }
      ++values;
    }
  }
  std::printf("e2m1 x e4m3 scale -> bf16, %s: %ld values, %ld wrong: %s\n", route, values, bad,
              bad == 0 ? "PASS" : "FAIL");
  return bad;
}

// fp8_ds_mla: item i holds 16 codes from byte i % 256 (ItemWord's four
// words, E4m3ItemWords), scale 2^E4m3ScaleExponent(i).
constexpr int kPow2Scales = 261;
__host__ __device__ inline uint4 E4m3ItemWords(int i) {
  return make_uint4(ItemWord(i, 0), ItemWord(i, 1), ~ItemWord(i + 1, 0), ItemWord(i + 7, 0));
}
__host__ __device__ inline int E4m3ScaleExponent(int i) { return i / 256 - 133; }

template <bool kPow2>
__global__ void ConvertE4m3(uint32_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint4 d = E4m3ItemWords(i);
  const float scale = ldexpf(1.f, E4m3ScaleExponent(i));
  kforge::ptx::u32 o[8];
  ks::E4m3Item16ToBf16<kPow2>(d, scale, o);
  for (int j = 0; j < 8; ++j) out[8 * i + j] = o[j];
}

// bf16 bits (round to nearest even) of an exactly representable float.
uint32_t Bf16Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  if (std::isnan(f)) return 0x7FC0u;
  return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}

long CheckE4m3Route(const std::vector<uint32_t>& got, const char* route) {
  long bad = 0, values = 0;
  for (int i = 0; i < static_cast<int>(got.size() / 8); ++i) {
    const uint4 d = E4m3ItemWords(i);
    const uint32_t w[4] = {d.x, d.y, d.z, d.w};
    const double scale = std::ldexp(1.0, E4m3ScaleExponent(i));
    for (int v = 0; v < 16; ++v) {
      const uint32_t byte = (w[v / 4] >> (8 * (v % 4))) & 0xFFu;
      // value * scale has at most 4 significant bits: exact as a float
      // whenever it is at least 2^-149 (here >= 2^-142) and in range.
      const double want = E4m3(byte) * scale;
      const uint32_t bits = (got[8 * i + v / 2] >> (16 * (v % 2))) & 0xFFFFu;
      const uint32_t want_bits = Bf16Bits(static_cast<float>(want));
      const bool ok =
          std::isnan(want) ? (bits & 0x7F80u) == 0x7F80u && (bits & 0x7Fu) != 0 : bits == want_bits;
      if (!ok && bad++ < 8) {
        std::printf("%s: item %d value %d (byte 0x%02x, scale 2^%d): got 0x%04x, want 0x%04x\n",
                    route, i, v, byte, E4m3ScaleExponent(i), bits, want_bits);
      }
      ++values;
    }
  }
  std::printf("e4m3 x power-of-two scale -> bf16, %s: %ld values, %ld wrong: %s\n", route, values,
              bad, bad == 0 ? "PASS" : "FAIL");
  return bad;
}

// Runs `kernel` over `items` items (8 output words each) and copies its
// output into `out`; false (and the error printed) on a CUDA failure.
bool Run(void (*kernel)(uint32_t*, int), int items, std::vector<uint32_t>& out) {
  out.assign(8 * static_cast<size_t>(items), 0u);
  uint32_t* d = nullptr;
  cudaError_t e = cudaMalloc(&d, sizeof(uint32_t) * out.size());
  if (e == cudaSuccess) {
    kernel<<<(items + 127) / 128, 128>>>(d, items);
    e = cudaMemcpy(out.data(), d, out.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost);
    cudaFree(d);
  }
  if (e != cudaSuccess) std::printf("FAIL: %s\n", cudaGetErrorString(e));
  return e == cudaSuccess;
}

int main() {
  constexpr int kItems = 256 * 256;
  constexpr int kE4m3Items = 256 * kPow2Scales;
  std::vector<uint32_t> two, branch, fp32, pow2;
  if (!Run(Convert<false>, kItems, two) || !Run(Convert<true>, kItems, branch) ||
      !Run(ConvertE4m3<false>, kE4m3Items, fp32) || !Run(ConvertE4m3<true>, kE4m3Items, pow2)) {
    return 2;
  }
  const long bad = CheckRoute(two, "two multiplies") + CheckRoute(branch, "scale branch") +
                   CheckE4m3Route(fp32, "fp32 multiplies") +
                   CheckE4m3Route(pow2, "bf16x2 multiply (pow2)");
  return bad == 0 ? 0 : 1;
}
