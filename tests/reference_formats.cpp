#include "reference_formats.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace reference {
namespace {

struct fp8_definition {
    int exponent_bits, mantissa_bits, bias;
    bool ieee_special; // e5m2: top exponent = inf/NaN; e4m3fn: only S.1111.111 is NaN
};

fp8_definition definition(format f) {
    return f == format::e4m3 ? fp8_definition { 4, 3, 7, false } : fp8_definition { 5, 2, 15, true };
}

// Nearest of two candidates, ties to the one whose code is even.
bool prefer(double x, double a, int code_a, double b, int code_b) {
    const double da = std::fabs(x - a), db = std::fabs(x - b);
    if (da != db) return da < db;
    return (code_a & 1) == 0 && (code_b & 1) != 0;
}

} // namespace

double decode_fp8(format f, uint8_t code) {
    const fp8_definition d = definition(f);
    const int sign = code >> 7;
    const int e = (code >> d.mantissa_bits) & ((1 << d.exponent_bits) - 1);
    const int m = code & ((1 << d.mantissa_bits) - 1);
    const int e_max = (1 << d.exponent_bits) - 1;
    double v;
    if (d.ieee_special && e == e_max) {
        v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
    } else if (!d.ieee_special && e == e_max && m == (1 << d.mantissa_bits) - 1) {
        v = std::numeric_limits<double>::quiet_NaN();
    } else if (e == 0) {
        v = m * std::pow(2.0, 1 - d.bias - d.mantissa_bits);
    } else {
        v = (1.0 + m / std::pow(2.0, d.mantissa_bits)) * std::pow(2.0, e - d.bias);
    }
    return sign ? -v : v;
}

double fp8_max(format f) {
    return f == format::e4m3 ? 448.0 : 57344.0;
}

uint8_t encode_fp8_slow(format f, double x) {
    const bool negative = std::signbit(x);
    if (std::isnan(x)) return static_cast<uint8_t>((negative ? 0x80 : 0) | (f == format::e4m3 ? 0x7F : 0x7E));
    const double a = std::fabs(x);
    int best = 0;
    double best_value = 0.0;
    for (int c = 0; c < 128; ++c) {
        const double v = decode_fp8(f, static_cast<uint8_t>(c));
        if (!std::isfinite(v)) continue;
        if (a >= fp8_max(f)) { // saturate
            if (v == fp8_max(f)) best = c;
            continue;
        }
        if (c == 0 || prefer(a, v, c, best_value, best)) {
            best = c;
            best_value = v;
        }
    }
    return static_cast<uint8_t>((negative ? 0x80 : 0) | best);
}

double bf16_to_double(uint16_t bits) {
    const int sign = bits >> 15, e = (bits >> 7) & 0xFF, m = bits & 0x7F;
    double v;
    if (e == 0xFF)
        v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else if (e == 0)
        v = m * std::pow(2.0, -133);
    else
        v = (1.0 + m / 128.0) * std::pow(2.0, e - 127);
    return sign ? -v : v;
}

double f16_to_double(uint16_t bits) {
    const int sign = bits >> 15, e = (bits >> 10) & 0x1F, m = bits & 0x3FF;
    double v;
    if (e == 0x1F)
        v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else if (e == 0)
        v = m * std::pow(2.0, -24);
    else
        v = (1.0 + m / 1024.0) * std::pow(2.0, e - 15);
    return sign ? -v : v;
}

namespace {
// Round to nearest even among the finite codes of a 16-bit format, by bisection on the ordered
// positive codes (their values increase with the code).
template <typename Decode>
uint16_t encode16(double x, Decode decode, uint16_t max_finite, uint16_t inf_code, uint16_t nan_code) {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    if (std::isnan(x)) return static_cast<uint16_t>(sign | nan_code);
    const double a = std::fabs(x);
    const double top = decode(max_finite);
    const double next = 2 * top - decode(static_cast<uint16_t>(max_finite - 1)); // the value past max
    if (a >= (top + next) / 2) {
        if (a == (top + next) / 2 && (max_finite & 1) == 0) return static_cast<uint16_t>(sign | max_finite);
        return static_cast<uint16_t>(sign | inf_code);
    }
    uint16_t lo = 0, hi = max_finite; // decode(lo) <= a <= decode(hi)
    if (a >= top) return static_cast<uint16_t>(sign | max_finite);
    while (hi - lo > 1) {
        const uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
        if (decode(mid) <= a)
            lo = mid;
        else
            hi = mid;
    }
    const uint16_t pick = prefer(a, decode(lo), lo, decode(hi), hi) ? lo : hi;
    return static_cast<uint16_t>(sign | pick);
}
} // namespace

uint16_t double_to_bf16(double x) {
    return encode16(x, bf16_to_double, 0x7F7F, 0x7F80, 0x7FC0);
}
uint16_t double_to_f16(double x) {
    return encode16(x, f16_to_double, 0x7BFF, 0x7C00, 0x7E00);
}

double load(const void *base, format f, int64_t i) {
    switch (f) {
        case format::f32: {
            float v;
            std::memcpy(&v, static_cast<const char *>(base) + 4 * i, 4);
            return v;
        }
        case format::bf16: {
            uint16_t b;
            std::memcpy(&b, static_cast<const char *>(base) + 2 * i, 2);
            return bf16_to_double(b);
        }
        case format::f16: {
            uint16_t b;
            std::memcpy(&b, static_cast<const char *>(base) + 2 * i, 2);
            return f16_to_double(b);
        }
        case format::e4m3:
        case format::e5m2: return decode_fp8(f, static_cast<const uint8_t *>(base)[i]);
    }
    return 0.0;
}

} // namespace reference
