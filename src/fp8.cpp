#include "fp8.hpp"

#include <array>
#include <cmath>
#include <cstring>

namespace pagedattn {
namespace detail {
namespace {

// A small float format: exponent_bits, mantissa_bits, bias, and the largest finite code (the
// magnitude bits, sign excluded).
struct small_float_format {
    int mantissa_bits;
    int bias;
    uint32_t max_finite_code;
    uint32_t nan_code;
};

constexpr small_float_format e4m3_format { 3, 7, 0x7E, 0x7F };
constexpr small_float_format e5m2_format { 2, 15, 0x7B, 0x7E };

// Rounds an f32 to the format, ties to even, saturating to the largest finite value.
uint8_t encode_small_float(float x, const small_float_format &f) {
    const uint32_t bits = float_bits(x);
    const uint32_t sign = (bits >> 24) & 0x80;
    const uint32_t magnitude = bits & 0x7FFFFFFF;
    if (magnitude > 0x7F800000) return static_cast<uint8_t>(sign | f.nan_code);
    if (magnitude == 0x7F800000) return static_cast<uint8_t>(sign | f.max_finite_code);

    const int min_normal_exponent = 1 - f.bias;
    const int f32_exponent = static_cast<int>(magnitude >> 23) - 127; // -127 for f32 subnormals
    uint32_t code;
    if (f32_exponent < min_normal_exponent) {
        // Subnormal in the target: count units of 2^(min_normal_exponent - mantissa_bits). The
        // scaling by a power of two is exact, so is the split into integer and fraction.
        const float units = std::ldexp(bits_float(magnitude), f.mantissa_bits - min_normal_exponent);
        const float whole = std::floor(units);
        const float fraction = units - whole;
        code = static_cast<uint32_t>(whole);
        if (fraction > 0.5f || (fraction == 0.5f && (code & 1))) ++code; // 2^M carries into E = 1
    } else {
        const int drop = 23 - f.mantissa_bits;
        const uint32_t mantissa = magnitude & 0x7FFFFF;
        code = (static_cast<uint32_t>(f32_exponent + f.bias) << f.mantissa_bits) | (mantissa >> drop);
        const uint32_t rest = mantissa & ((1u << drop) - 1);
        const uint32_t half = 1u << (drop - 1);
        if (rest > half || (rest == half && (code & 1))) ++code; // a carry moves into the exponent
    }
    if (code > f.max_finite_code) code = f.max_finite_code;
    return static_cast<uint8_t>(sign | code);
}

float decode_small_float(uint8_t code, const small_float_format &f, bool has_infinity) {
    const bool negative = (code & 0x80) != 0;
    const uint32_t magnitude = code & 0x7Fu;
    const uint32_t exponent_field = magnitude >> f.mantissa_bits;
    const uint32_t mantissa = magnitude & ((1u << f.mantissa_bits) - 1);
    const uint32_t max_exponent_field = 0x7Fu >> f.mantissa_bits;
    float value;
    if (has_infinity && exponent_field == max_exponent_field) {
        value = mantissa == 0 ? INFINITY : NAN;
    } else if (!has_infinity && magnitude == 0x7F) {
        value = NAN;
    } else if (exponent_field == 0) {
        value = std::ldexp(static_cast<float>(mantissa), 1 - f.bias - f.mantissa_bits);
    } else {
        value = std::ldexp(static_cast<float>((1u << f.mantissa_bits) | mantissa),
                           static_cast<int>(exponent_field) - f.bias - f.mantissa_bits);
    }
    return negative ? -value : value;
}

template <bool is_e4m3> std::array<float, 256> make_decode_table() {
    std::array<float, 256> table {};
    for (int c = 0; c < 256; ++c)
        table[c] = decode_small_float(static_cast<uint8_t>(c), is_e4m3 ? e4m3_format : e5m2_format, !is_e4m3);
    return table;
}

const std::array<float, 256> e4m3_table = make_decode_table<true>();
const std::array<float, 256> e5m2_table = make_decode_table<false>();

} // namespace

uint8_t encode_e4m3(float x) {
    return encode_small_float(x, e4m3_format);
}
uint8_t encode_e5m2(float x) {
    return encode_small_float(x, e5m2_format);
}
float decode_e4m3(uint8_t code) {
    return e4m3_table[code];
}
float decode_e5m2(uint8_t code) {
    return e5m2_table[code];
}

float fp8_max(data_type dt) {
    if (dt == data_type::f8_e4m3) return 448.f;
    if (dt == data_type::f8_e5m2) return 57344.f;
    return 0.f;
}

namespace {
// In this file only, so that convert_row_from_f32's loop inlines it (a call per element cost ~4% of
// a 512-token decode) while no copy compiled with another file's ISA flags can stand in for it.
inline uint16_t round_to_bf16(float x) {
    const uint32_t bits = float_bits(x);
    if ((bits & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((bits >> 16) | 0x40);
    const uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
    return static_cast<uint16_t>((bits + rounding) >> 16);
}
} // namespace

uint16_t f32_to_bf16(float x) {
    return round_to_bf16(x);
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    const uint32_t exponent = (h >> 10) & 0x1F;
    const uint32_t mantissa = h & 0x3FF;
    if (exponent == 0x1F) return bits_float(sign | 0x7F800000 | (mantissa << 13));
    if (exponent == 0) {
        const float value = std::ldexp(static_cast<float>(mantissa), -24);
        return sign ? -value : value;
    }
    return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t f32_to_f16(float x) {
    const uint32_t bits = float_bits(x);
    const uint32_t sign = (bits >> 16) & 0x8000;
    const uint32_t magnitude = bits & 0x7FFFFFFF;
    if (magnitude > 0x7F800000) return static_cast<uint16_t>(sign | 0x7E00 | ((magnitude >> 13) & 0x3FF));
    if (magnitude >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00); // rounds past 65504
    const int exponent = static_cast<int>(magnitude >> 23) - 127;
    uint32_t code;
    if (exponent < -14) {
        // Subnormal: units of 2^-24, exact scaling then round half to even.
        const float units = std::ldexp(bits_float(magnitude), 24);
        const float whole = std::floor(units);
        const float fraction = units - whole;
        code = static_cast<uint32_t>(whole);
        if (fraction > 0.5f || (fraction == 0.5f && (code & 1))) ++code;
    } else {
        const uint32_t mantissa = magnitude & 0x7FFFFF;
        code = (static_cast<uint32_t>(exponent + 15) << 10) | (mantissa >> 13);
        const uint32_t rest = mantissa & 0x1FFF;
        if (rest > 0x1000 || (rest == 0x1000 && (code & 1))) ++code;
    }
    return static_cast<uint16_t>(sign | code);
}

float load_as_f32(const void *base, data_type dt, int64_t i) {
    switch (dt) {
        case data_type::f32: return static_cast<const float *>(base)[i];
        case data_type::bf16: return bf16_to_f32(static_cast<const uint16_t *>(base)[i]);
        case data_type::f16: return f16_to_f32(static_cast<const uint16_t *>(base)[i]);
        case data_type::f8_e4m3: return decode_e4m3(static_cast<const uint8_t *>(base)[i]);
        case data_type::f8_e5m2: return decode_e5m2(static_cast<const uint8_t *>(base)[i]);
        default: return NAN;
    }
}

void store_from_f32(void *base, data_type dt, int64_t i, float x) {
    switch (dt) {
        case data_type::f32: static_cast<float *>(base)[i] = x; break;
        case data_type::bf16: static_cast<uint16_t *>(base)[i] = f32_to_bf16(x); break;
        case data_type::f16: static_cast<uint16_t *>(base)[i] = f32_to_f16(x); break;
        case data_type::f8_e4m3: static_cast<uint8_t *>(base)[i] = encode_e4m3(x); break;
        case data_type::f8_e5m2: static_cast<uint8_t *>(base)[i] = encode_e5m2(x); break;
        default: break;
    }
}

void convert_row_to_f32(const void *src, data_type dt, int64_t n, float scale, float *dst) {
    switch (dt) {
        case data_type::f32:
            for (int64_t i = 0; i < n; ++i)
                dst[i] = static_cast<const float *>(src)[i] * scale;
            break;
        case data_type::bf16:
            for (int64_t i = 0; i < n; ++i)
                dst[i] = bf16_to_f32(static_cast<const uint16_t *>(src)[i]) * scale;
            break;
        case data_type::f16:
            for (int64_t i = 0; i < n; ++i)
                dst[i] = f16_to_f32(static_cast<const uint16_t *>(src)[i]) * scale;
            break;
        case data_type::f8_e4m3:
            for (int64_t i = 0; i < n; ++i)
                dst[i] = e4m3_table[static_cast<const uint8_t *>(src)[i]] * scale;
            break;
        case data_type::f8_e5m2:
            for (int64_t i = 0; i < n; ++i)
                dst[i] = e5m2_table[static_cast<const uint8_t *>(src)[i]] * scale;
            break;
        default: break;
    }
}

void convert_row_from_f32(const float *src, int64_t n, float scale, data_type dt, void *dst) {
    switch (dt) {
        case data_type::f8_e4m3:
            for (int64_t i = 0; i < n; ++i)
                static_cast<uint8_t *>(dst)[i] = encode_e4m3(src[i] / scale);
            break;
        case data_type::f8_e5m2:
            for (int64_t i = 0; i < n; ++i)
                static_cast<uint8_t *>(dst)[i] = encode_e5m2(src[i] / scale);
            break;
        // One loop per type rather than store_from_f32's switch per element: this converts every
        // attention output row.
        case data_type::bf16:
            for (int64_t i = 0; i < n; ++i)
                static_cast<uint16_t *>(dst)[i] = round_to_bf16(src[i]);
            break;
        case data_type::f16:
            for (int64_t i = 0; i < n; ++i)
                static_cast<uint16_t *>(dst)[i] = f32_to_f16(src[i]);
            break;
        case data_type::f32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); break;
        default: break;
    }
}

} // namespace detail
} // namespace pagedattn
