// Test-side decoding and encoding of the storage formats, written from the format definitions in
// fp64 and sharing no code with the library: the independent truth the tests compare against.
#pragma once

#include <cstdint>

namespace reference {

enum class format { f32, bf16, f16, e4m3, e5m2 };

/// Value of an OCP FP8 code by its definition (fp64; NaN for NaN codes, +-inf for e5m2 inf).
double decode_fp8(format f, uint8_t code);
/// Largest finite value: 448 (e4m3) or 57344 (e5m2).
double fp8_max(format f);
/// Slow encoder by search over all 256 codes: the nearest finite code, ties to the even code
/// (mantissa LSB 0); beyond the largest finite value (inf included) saturates to +-max; NaN gives
/// a NaN code with the input's sign (S.1111.111 for e4m3, S.11111.10 for e5m2); -0.0 gives 0x80.
uint8_t encode_fp8_slow(format f, double x);

double bf16_to_double(uint16_t bits);
double f16_to_double(uint16_t bits);
/// Slow round-to-nearest-even encoders by the format definition (inf kept, NaN quieted).
uint16_t double_to_bf16(double x);
uint16_t double_to_f16(double x);

/// Element i of an array stored in format f, as double.
double load(const void *base, format f, int64_t i);

} // namespace reference
