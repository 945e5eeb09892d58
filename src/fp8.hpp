// Scalar conversions between f32 and the storage types: the library's one definition of FP8,
// bf16 and f16. Kernels call these (or vectorize them bit-exactly); nothing re-derives a format.
//
// FP8 formats (OCP 8-bit floating point, 2023):
//   f8_e4m3 (e4m3fn): S.EEEE.MMM, bias 7. Subnormals when E = 0 (m * 2^-9). No infinity; S.1111.111
//     is NaN, so the largest finite value is S.1111.110 = 448.
//   f8_e5m2: S.EEEEE.MM, bias 15, IEEE-style: E = 31 holds inf (M = 0) and NaN (M != 0); the
//     largest finite value is 57344; subnormals m * 2^-16.
// Encoding from f32 rounds to nearest, ties to even, and saturates: every value beyond the largest
// finite (including the ones that would round up past it, and +-inf) becomes +-max finite. NaN
// becomes the canonical NaN with the input's sign: S.1111.111 (e4m3), S.11111.10 (e5m2).
// bf16 and f16 encoders also round to nearest even; they keep inf and turn NaN into a quiet NaN.
#pragma once

#include <cstdint>
#include <cstring>

#include "pagedattn/common.hpp"

namespace pagedattn {
namespace detail {

uint8_t encode_e4m3(float x);
uint8_t encode_e5m2(float x);
float decode_e4m3(uint8_t code);
float decode_e5m2(uint8_t code);

/// 448 for f8_e4m3, 57344 for f8_e5m2, 0 for other types.
float fp8_max(data_type dt);
constexpr bool is_fp8(data_type dt) {
    return dt == data_type::f8_e4m3 || dt == data_type::f8_e5m2;
}

inline uint32_t float_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}
inline float bits_float(uint32_t u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
}

inline float bf16_to_f32(uint16_t h) {
    return bits_float(static_cast<uint32_t>(h) << 16);
}
uint16_t f32_to_bf16(float x);
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float x);

/// Element i (not byte i) of an array of type dt, as f32. dt: f32, bf16, f16, f8_e4m3, f8_e5m2.
float load_as_f32(const void *base, data_type dt, int64_t i);
/// Stores x at element i of an array of type dt, with the encoders above.
void store_from_f32(void *base, data_type dt, int64_t i, float x);

/// Converts n elements of type dt to f32, multiplying by `scale` (the dequantization of a cache row).
void convert_row_to_f32(const void *src, data_type dt, int64_t n, float scale, float *dst);
/// Converts n f32 values to type dt (FP8: encodes x / scale, an f32 division, so that every
/// implementation produces the same bytes).
void convert_row_from_f32(const float *src, int64_t n, float scale, data_type dt, void *dst);

} // namespace detail
} // namespace pagedattn
