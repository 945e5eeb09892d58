// Tests of the library's scalar format codecs (src/fp8.hpp) against the format definitions: every FP8
// code, every bf16 and f16 input, 10^7 random f32 (10^6 under PAGEDATTN_TEST_REDUCED) and the boundary
// cases derived by hand. Expected values come from fp64 code written from the definitions, never from
// the library.
#include "src/fp8.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ios>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pagedattn/common.hpp"
#include "reference_formats.hpp"

namespace {

using pagedattn::data_type;
namespace detail = pagedattn::detail;

enum class fp8 { e4m3, e5m2 };
constexpr fp8 both_formats[] = { fp8::e4m3, fp8::e5m2 };

const char *name(fp8 f) {
    return f == fp8::e4m3 ? "e4m3" : "e5m2";
}
reference::format ref_format(fp8 f) {
    return f == fp8::e4m3 ? reference::format::e4m3 : reference::format::e5m2;
}
uint8_t lib_encode(fp8 f, float x) {
    return f == fp8::e4m3 ? detail::encode_e4m3(x) : detail::encode_e5m2(x);
}
float lib_decode(fp8 f, uint8_t c) {
    return f == fp8::e4m3 ? detail::decode_e4m3(c) : detail::decode_e5m2(c);
}
uint8_t ref_encode(fp8 f, float x) {
    return reference::encode_fp8_slow(ref_format(f), x);
}

// Magnitude codes by the definition: S.1111.110 / S.11110.11 are the largest finite values,
// S.1111.111 / S.11111.10 the canonical NaNs.
uint8_t max_code(fp8 f) {
    return f == fp8::e4m3 ? 0x7E : 0x7B;
}
uint8_t nan_code(fp8 f) {
    return f == fp8::e4m3 ? 0x7F : 0x7E;
}

uint32_t bits_of(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}
float float_of(uint32_t u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
}

std::string hex(uint32_t v) {
    std::ostringstream s;
    s << "0x" << std::hex << std::uppercase << v;
    return s.str();
}
std::string describe(float x) {
    std::ostringstream s;
    s << std::hexfloat << x << " (bits " << hex(bits_of(x)) << ")";
    return s.str();
}

// The OCP FP8 definition once more, written here so that the decode test shares no code with either
// the library or tests/reference_formats.cpp.
double ocp_decode(fp8 f, uint8_t code) {
    const int mantissa_bits = f == fp8::e4m3 ? 3 : 2;
    const int bias = f == fp8::e4m3 ? 7 : 15;
    const int e = (code & 0x7F) >> mantissa_bits;
    const int m = code & ((1 << mantissa_bits) - 1);
    double magnitude;
    if (f == fp8::e5m2 && e == 31) { // IEEE-style specials
        magnitude =
                m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
    } else if (f == fp8::e4m3 && e == 15 && m == 7) { // e4m3fn: no infinity, one NaN per sign
        magnitude = std::numeric_limits<double>::quiet_NaN();
    } else if (e == 0) { // subnormal: m * 2^(1 - bias - M)
        magnitude = std::ldexp(m, 1 - bias - mantissa_bits);
    } else { // (2^M + m) * 2^(e - bias - M)
        magnitude = std::ldexp((1 << mantissa_bits) + m, e - bias - mantissa_bits);
    }
    return (code & 0x80) ? -magnitude : magnitude;
}

bool reduced_run() {
    const char *v = std::getenv("PAGEDATTN_TEST_REDUCED");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

// Collects mismatches of a bulk comparison: reports the first few in full, counts the rest.
class mismatch_log {
public:
    template <typename T> void check(const std::string &what, float input, T expected, T actual) {
        if (expected == actual) return;
        if (++count_ <= 10)
            ADD_FAILURE() << what << ": input " << describe(input) << " expected " << hex(expected)
                          << " actual " << hex(actual);
    }
    void fail(const std::string &message) {
        if (++count_ <= 10) ADD_FAILURE() << message;
    }
    long count() const { return count_; }

private:
    long count_ = 0;
};

// A fast encoder, independent of the library and exact: binary search over the positive finite code
// values (increasing with the code), and the nearest-or-tie decision made on 2|x| against the sum of
// the two neighbours, both exact in fp64 (FP8 values and f32 inputs have few significant bits).
class table_encoder {
public:
    explicit table_encoder(fp8 f) : f_(f) {
        for (int c = 0; c <= max_code(f); ++c)
            values_.push_back(ocp_decode(f, static_cast<uint8_t>(c)));
    }
    uint8_t operator()(float x) const {
        const int sign = std::signbit(x) ? 0x80 : 0;
        if (std::isnan(x)) return static_cast<uint8_t>(sign | nan_code(f_));
        const double a = std::fabs(static_cast<double>(x));
        if (a >= values_.back()) return static_cast<uint8_t>(sign | max_code(f_)); // saturate
        const auto hi =
                static_cast<int>(std::upper_bound(values_.begin(), values_.end(), a) - values_.begin());
        const int lo = hi - 1; // values_[lo] <= a < values_[hi]
        const double twice = 2 * a, sum = values_[lo] + values_[hi];
        const int pick = twice < sum ? lo : twice > sum ? hi : (lo % 2 == 0 ? lo : hi);
        return static_cast<uint8_t>(sign | pick);
    }
    /// Whether |x| is exactly halfway between two finite codes.
    bool is_tie(float x) const {
        const double a = std::fabs(static_cast<double>(x));
        if (!(a < values_.back())) return false;
        const auto hi =
                static_cast<int>(std::upper_bound(values_.begin(), values_.end(), a) - values_.begin());
        return 2 * a == values_[hi - 1] + values_[hi];
    }
    const std::vector<double> &values() const { return values_; }

private:
    fp8 f_;
    std::vector<double> values_;
};

// Random f32 inputs for the FP8 encoders, four kinds in equal parts: raw bit patterns (NaN, inf, f32
// subnormals, huge), sign * 2^[-20, 20] * random mantissa, values within 3 f32 ulps of a midpoint
// between two codes of either format (where rounding decides), and tiny values up to 2^-10.
class fp8_input_generator {
public:
    explicit fp8_input_generator(uint64_t seed) : rng_(seed) {
        for (fp8 f : both_formats) {
            const table_encoder t(f);
            const std::vector<double> &v = t.values();
            for (size_t i = 0; i + 1 < v.size(); ++i)
                midpoints_.push_back(static_cast<float>((v[i] + v[i + 1]) / 2));
            // max + half an ulp (464, 61440): where saturation takes over from rounding
            midpoints_.push_back(static_cast<float>(v.back() + (v.back() - v[v.size() - 2]) / 2));
        }
    }
    float next() {
        const uint64_t r = rng_();
        const uint32_t low = static_cast<uint32_t>(r);
        const uint32_t sign = static_cast<uint32_t>(r >> 63) << 31;
        const uint32_t pick = static_cast<uint32_t>(r >> 34) & 0xFFFF;
        switch ((r >> 32) & 3) {
            case 0: return float_of(low);
            case 1: return float_of(sign | ((127 - 20 + pick % 41) << 23) | (low & 0x7FFFFF));
            case 2: {
                const uint32_t mid = bits_of(midpoints_[pick % midpoints_.size()]);
                const int offset = static_cast<int>((r >> 50) & 0xFF) % 7 - 3;
                return float_of(sign | static_cast<uint32_t>(static_cast<int64_t>(mid) + offset));
            }
            default: return float_of(sign | ((pick % (127 - 10 + 1)) << 23) | (low & 0x7FFFFF));
        }
    }

private:
    std::mt19937_64 rng_;
    std::vector<float> midpoints_;
};

// ---------------------------------------------------------------------------------------------------
// 1. Decoding every code.

TEST(Fp8Decode, EveryCodeMatchesDefinition) {
    for (fp8 f : both_formats) {
        int nan_count = 0, inf_count = 0;
        for (int c = 0; c < 256; ++c) {
            const uint8_t code = static_cast<uint8_t>(c);
            const double expected = ocp_decode(f, code);
            const float actual = lib_decode(f, code);
            const double by_reference = reference::decode_fp8(ref_format(f), code);
            SCOPED_TRACE(std::string(name(f)) + " code " + hex(code));
            if (std::isnan(expected)) {
                ++nan_count;
                EXPECT_TRUE(std::isnan(actual));
                EXPECT_TRUE(std::isnan(by_reference));
                continue;
            }
            inf_count += std::isinf(expected);
            EXPECT_EQ(static_cast<double>(actual), expected);
            EXPECT_EQ(std::signbit(actual), (c & 0x80) != 0); // -0.0 for 0x80
            EXPECT_EQ(by_reference, expected);
            EXPECT_EQ(std::signbit(by_reference), (c & 0x80) != 0);
        }
        // e4m3fn: only S.1111.111; e5m2: E = 31 with M in {1, 2, 3}, both signs.
        EXPECT_EQ(nan_count, f == fp8::e4m3 ? 2 : 6) << name(f);
        EXPECT_EQ(inf_count, f == fp8::e4m3 ? 0 : 2) << name(f);
    }
}

TEST(Fp8Decode, SpecialCodes) {
    EXPECT_TRUE(std::isnan(detail::decode_e4m3(0x7F)));
    EXPECT_TRUE(std::isnan(detail::decode_e4m3(0xFF)));
    EXPECT_FALSE(std::isnan(detail::decode_e4m3(0x7E)));
    EXPECT_FALSE(std::isnan(detail::decode_e4m3(0x78))); // e4m3fn has no inf: 0x78 = 256
    EXPECT_EQ(detail::decode_e4m3(0x78), 256.f);
    EXPECT_EQ(detail::decode_e5m2(0x7C), std::numeric_limits<float>::infinity());
    EXPECT_EQ(detail::decode_e5m2(0xFC), -std::numeric_limits<float>::infinity());
    for (uint8_t c : { 0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF })
        EXPECT_TRUE(std::isnan(detail::decode_e5m2(c))) << hex(c);
}

TEST(Fp8Decode, NamedValues) {
    EXPECT_EQ(detail::decode_e4m3(0x7E), 448.f); // 1.110b * 2^8
    EXPECT_EQ(detail::decode_e4m3(0xFE), -448.f);
    EXPECT_EQ(detail::decode_e4m3(0x01), std::ldexp(1.f, -9)); // 0.001b * 2^-6
    EXPECT_EQ(detail::decode_e4m3(0x07), std::ldexp(7.f, -9)); // largest subnormal
    EXPECT_EQ(detail::decode_e4m3(0x08), std::ldexp(1.f, -6)); // smallest normal
    EXPECT_EQ(detail::decode_e4m3(0x38), 1.f);                 // E = bias
    EXPECT_EQ(detail::decode_e5m2(0x7B), 57344.f);             // 1.11b * 2^15
    EXPECT_EQ(detail::decode_e5m2(0xFB), -57344.f);
    EXPECT_EQ(detail::decode_e5m2(0x01), std::ldexp(1.f, -16)); // 0.01b * 2^-14
    EXPECT_EQ(detail::decode_e5m2(0x04), std::ldexp(1.f, -14)); // smallest normal
    EXPECT_EQ(detail::decode_e5m2(0x3C), 1.f);
    EXPECT_EQ(detail::decode_e4m3(0x00), 0.f);
    EXPECT_TRUE(std::signbit(detail::decode_e4m3(0x80)));
    EXPECT_TRUE(std::signbit(detail::decode_e5m2(0x80)));
}

// ---------------------------------------------------------------------------------------------------
// 2. Encoding every bf16 and every f16 value.

// bf16 is the top half of an f32, so the shifted pattern is the value exactly (NaN payloads too).
float bf16_pattern_as_float(uint16_t h) {
    return float_of(static_cast<uint32_t>(h) << 16);
}
bool f16_pattern_is_nan(uint16_t h) {
    return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
}
// Every f16 value is an f32 value; NaN patterns become a NaN with the pattern's sign.
float f16_pattern_as_float(uint16_t h) {
    if (f16_pattern_is_nan(h))
        return std::copysign(std::numeric_limits<float>::quiet_NaN(), (h & 0x8000) ? -1.f : 1.f);
    return static_cast<float>(reference::f16_to_double(h));
}

void check_fp8_encoders_on(float x, mismatch_log &log) {
    for (fp8 f : both_formats) {
        const uint8_t expected = ref_encode(f, x);
        if (std::isnan(x)) { // the canonical NaN, sign kept
            const uint8_t canonical = static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | nan_code(f));
            log.check(std::string("reference NaN ") + name(f), x, canonical, expected);
            log.check(std::string("NaN ") + name(f), x, canonical, lib_encode(f, x));
        }
        log.check(std::string("encode ") + name(f), x, expected, lib_encode(f, x));
    }
}

TEST(Fp8Encode, EveryBf16InputMatchesSlowReference) {
    mismatch_log log;
    int nans = 0;
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float x = bf16_pattern_as_float(static_cast<uint16_t>(h));
        nans += std::isnan(x);
        check_fp8_encoders_on(x, log);
    }
    EXPECT_EQ(nans, 2 * 127); // 127 nonzero mantissas per sign
    EXPECT_EQ(log.count(), 0);
}

TEST(Fp8Encode, EveryF16InputMatchesSlowReference) {
    mismatch_log log;
    int nans = 0;
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float x = f16_pattern_as_float(static_cast<uint16_t>(h));
        nans += std::isnan(x);
        check_fp8_encoders_on(x, log);
    }
    EXPECT_EQ(nans, 2 * 1023);
    EXPECT_EQ(log.count(), 0);
}

// ---------------------------------------------------------------------------------------------------
// 3. Random f32 inputs.

TEST(Fp8Encode, RandomF32MatchReference) {
    const long count = reduced_run() ? 1000000 : 10000000;
    const long slow_checked = 100000; // the table encoder is checked against the slow one first
    const table_encoder table[] = { table_encoder(fp8::e4m3), table_encoder(fp8::e5m2) };
    fp8_input_generator inputs(0x8f1e5eedULL);
    mismatch_log log;
    long ties = 0;
    for (long i = 0; i < count; ++i) {
        const float x = inputs.next();
        for (fp8 f : both_formats) {
            const uint8_t expected = table[f == fp8::e4m3 ? 0 : 1](x);
            if (i < slow_checked)
                log.check(std::string("table vs slow ") + name(f), x, ref_encode(f, x), expected);
            log.check(std::string("encode ") + name(f), x, expected, lib_encode(f, x));
            ties += table[f == fp8::e4m3 ? 0 : 1].is_tie(x);
        }
    }
    EXPECT_EQ(log.count(), 0);
    EXPECT_GT(ties, count / 100) << "the generator must produce exact ties";
}

// ---------------------------------------------------------------------------------------------------
// 4. Boundary cases, expected codes derived by hand from the format definitions.

// x is exactly halfway between the neighbouring codes lo and hi; `tie` is the even one of them.
struct tie_case {
    float x;
    uint8_t lo, hi, tie;
};

template <size_t n> void check_ties(fp8 f, const tie_case (&cases)[n]) {
    for (const tie_case &t : cases) {
        SCOPED_TRACE(std::string(name(f)) + " tie at " + describe(t.x));
        // The table itself: x is the midpoint of lo and hi, and hi follows lo.
        EXPECT_EQ(2.0 * t.x, ocp_decode(f, t.lo) + ocp_decode(f, t.hi));
        EXPECT_EQ(t.hi, t.lo + 1);
        EXPECT_EQ(lib_encode(f, t.x), t.tie);
        EXPECT_EQ(lib_encode(f, -t.x), t.tie | 0x80);
        // One f32 ulp either side of the midpoint is no tie.
        EXPECT_EQ(lib_encode(f, std::nextafter(t.x, INFINITY)), t.hi);
        EXPECT_EQ(lib_encode(f, std::nextafter(t.x, 0.f)), t.lo);
        EXPECT_EQ(lib_encode(f, -std::nextafter(t.x, INFINITY)), t.hi | 0x80);
    }
}

TEST(Fp8Boundary, E4m3TiesInEveryBinadeGoToEven) {
    // Code values in binade 2^e step by 2^e/8 (0x0.2p), so midpoints sit at odd multiples of 0x0.1p:
    // 1.0001b between m = 0 and 1 (to m = 0), 1.0011b between m = 1 and 2 (to m = 2) and 1.1111b between
    // m = 7 and the next binade (to its m = 0). Subnormals are m * 2^-9.
    // clang-format off
    const tie_case cases[] = {
        {0x1p-10f, 0x00, 0x01, 0x00},   // 0.5 * 2^-9: between 0 and the smallest subnormal, to 0
        {0x1.8p-9f, 0x01, 0x02, 0x02},  // 1.5 * 2^-9
        {0x1.4p-8f, 0x02, 0x03, 0x02},  // 2.5 * 2^-9
        {0x1.Cp-8f, 0x03, 0x04, 0x04},  // 3.5 * 2^-9
        {0x1.2p-7f, 0x04, 0x05, 0x04},  // 4.5 * 2^-9
        {0x1.Ep-7f, 0x07, 0x08, 0x08},  // 7.5 * 2^-9: the largest subnormal rounds up into 2^-6
        {0x1.1p-6f, 0x08, 0x09, 0x08}, {0x1.3p-6f, 0x09, 0x0A, 0x0A}, {0x1.Fp-6f, 0x0F, 0x10, 0x10},  // 2^-6
        {0x1.1p-5f, 0x10, 0x11, 0x10}, {0x1.3p-5f, 0x11, 0x12, 0x12}, {0x1.Fp-5f, 0x17, 0x18, 0x18},  // 2^-5
        {0x1.1p-4f, 0x18, 0x19, 0x18}, {0x1.3p-4f, 0x19, 0x1A, 0x1A}, {0x1.Fp-4f, 0x1F, 0x20, 0x20},  // 2^-4
        {0x1.1p-3f, 0x20, 0x21, 0x20}, {0x1.3p-3f, 0x21, 0x22, 0x22}, {0x1.Fp-3f, 0x27, 0x28, 0x28},  // 2^-3
        {0x1.1p-2f, 0x28, 0x29, 0x28}, {0x1.3p-2f, 0x29, 0x2A, 0x2A}, {0x1.Fp-2f, 0x2F, 0x30, 0x30},  // 2^-2
        {0x1.1p-1f, 0x30, 0x31, 0x30}, {0x1.3p-1f, 0x31, 0x32, 0x32}, {0x1.Fp-1f, 0x37, 0x38, 0x38},  // 2^-1
        {0x1.1p0f, 0x38, 0x39, 0x38}, {0x1.3p0f, 0x39, 0x3A, 0x3A}, {0x1.Fp0f, 0x3F, 0x40, 0x40},  // 2^0
        {0x1.1p1f, 0x40, 0x41, 0x40}, {0x1.3p1f, 0x41, 0x42, 0x42}, {0x1.Fp1f, 0x47, 0x48, 0x48},  // 2^1
        {0x1.1p2f, 0x48, 0x49, 0x48}, {0x1.3p2f, 0x49, 0x4A, 0x4A}, {0x1.Fp2f, 0x4F, 0x50, 0x50},  // 2^2
        {0x1.1p3f, 0x50, 0x51, 0x50}, {0x1.3p3f, 0x51, 0x52, 0x52}, {0x1.Fp3f, 0x57, 0x58, 0x58},  // 2^3
        {0x1.1p4f, 0x58, 0x59, 0x58}, {0x1.3p4f, 0x59, 0x5A, 0x5A}, {0x1.Fp4f, 0x5F, 0x60, 0x60},  // 2^4
        {0x1.1p5f, 0x60, 0x61, 0x60}, {0x1.3p5f, 0x61, 0x62, 0x62}, {0x1.Fp5f, 0x67, 0x68, 0x68},  // 2^5
        {0x1.1p6f, 0x68, 0x69, 0x68}, {0x1.3p6f, 0x69, 0x6A, 0x6A}, {0x1.Fp6f, 0x6F, 0x70, 0x70},  // 2^6
        {0x1.1p7f, 0x70, 0x71, 0x70}, {0x1.3p7f, 0x71, 0x72, 0x72}, {0x1.Fp7f, 0x77, 0x78, 0x78},  // 2^7
        {0x1.1p8f, 0x78, 0x79, 0x78}, {0x1.3p8f, 0x79, 0x7A, 0x7A}, {0x1.Bp8f, 0x7D, 0x7E, 0x7E},  // 2^8
    };
    // clang-format on
    check_ties(fp8::e4m3, cases);
}

TEST(Fp8Boundary, E5m2TiesInEveryBinadeGoToEven) {
    // Code values in binade 2^e step by 2^e/4 (0x0.4p), midpoints at 1.001b, 1.011b, 1.101b, 1.111b
    // (0x1.2p, 0x1.6p, 0x1.Ap, 0x1.Ep); the even codes have m = 0 or 2. Subnormals are m * 2^-16. In the
    // top binade 1.101b * 2^15 = 53248 lies between 0x7A and the largest finite 0x7B: to 0x7A.
    // clang-format off
    const tie_case cases[] = {
        {0x1p-17f, 0x00, 0x01, 0x00},   // 0.5 * 2^-16: to 0
        {0x1.8p-16f, 0x01, 0x02, 0x02}, // 1.5 * 2^-16
        {0x1.4p-15f, 0x02, 0x03, 0x02}, // 2.5 * 2^-16
        {0x1.Cp-15f, 0x03, 0x04, 0x04}, // 3.5 * 2^-16: the largest subnormal rounds up into 2^-14
        {0x1.2p-14f, 0x04, 0x05, 0x04}, {0x1.6p-14f, 0x05, 0x06, 0x06},  // 2^-14
        {0x1.Ap-14f, 0x06, 0x07, 0x06}, {0x1.Ep-14f, 0x07, 0x08, 0x08},
        {0x1.2p-13f, 0x08, 0x09, 0x08}, {0x1.6p-13f, 0x09, 0x0A, 0x0A},  // 2^-13
        {0x1.Ap-13f, 0x0A, 0x0B, 0x0A}, {0x1.Ep-13f, 0x0B, 0x0C, 0x0C},
        {0x1.2p-12f, 0x0C, 0x0D, 0x0C}, {0x1.6p-12f, 0x0D, 0x0E, 0x0E},  // 2^-12
        {0x1.Ap-12f, 0x0E, 0x0F, 0x0E}, {0x1.Ep-12f, 0x0F, 0x10, 0x10},
        {0x1.2p-11f, 0x10, 0x11, 0x10}, {0x1.6p-11f, 0x11, 0x12, 0x12},  // 2^-11
        {0x1.Ap-11f, 0x12, 0x13, 0x12}, {0x1.Ep-11f, 0x13, 0x14, 0x14},
        {0x1.2p-10f, 0x14, 0x15, 0x14}, {0x1.6p-10f, 0x15, 0x16, 0x16},  // 2^-10
        {0x1.Ap-10f, 0x16, 0x17, 0x16}, {0x1.Ep-10f, 0x17, 0x18, 0x18},
        {0x1.2p-9f, 0x18, 0x19, 0x18}, {0x1.6p-9f, 0x19, 0x1A, 0x1A},  // 2^-9
        {0x1.Ap-9f, 0x1A, 0x1B, 0x1A}, {0x1.Ep-9f, 0x1B, 0x1C, 0x1C},
        {0x1.2p-8f, 0x1C, 0x1D, 0x1C}, {0x1.6p-8f, 0x1D, 0x1E, 0x1E},  // 2^-8
        {0x1.Ap-8f, 0x1E, 0x1F, 0x1E}, {0x1.Ep-8f, 0x1F, 0x20, 0x20},
        {0x1.2p-7f, 0x20, 0x21, 0x20}, {0x1.6p-7f, 0x21, 0x22, 0x22},  // 2^-7
        {0x1.Ap-7f, 0x22, 0x23, 0x22}, {0x1.Ep-7f, 0x23, 0x24, 0x24},
        {0x1.2p-6f, 0x24, 0x25, 0x24}, {0x1.6p-6f, 0x25, 0x26, 0x26},  // 2^-6
        {0x1.Ap-6f, 0x26, 0x27, 0x26}, {0x1.Ep-6f, 0x27, 0x28, 0x28},
        {0x1.2p-5f, 0x28, 0x29, 0x28}, {0x1.6p-5f, 0x29, 0x2A, 0x2A},  // 2^-5
        {0x1.Ap-5f, 0x2A, 0x2B, 0x2A}, {0x1.Ep-5f, 0x2B, 0x2C, 0x2C},
        {0x1.2p-4f, 0x2C, 0x2D, 0x2C}, {0x1.6p-4f, 0x2D, 0x2E, 0x2E},  // 2^-4
        {0x1.Ap-4f, 0x2E, 0x2F, 0x2E}, {0x1.Ep-4f, 0x2F, 0x30, 0x30},
        {0x1.2p-3f, 0x30, 0x31, 0x30}, {0x1.6p-3f, 0x31, 0x32, 0x32},  // 2^-3
        {0x1.Ap-3f, 0x32, 0x33, 0x32}, {0x1.Ep-3f, 0x33, 0x34, 0x34},
        {0x1.2p-2f, 0x34, 0x35, 0x34}, {0x1.6p-2f, 0x35, 0x36, 0x36},  // 2^-2
        {0x1.Ap-2f, 0x36, 0x37, 0x36}, {0x1.Ep-2f, 0x37, 0x38, 0x38},
        {0x1.2p-1f, 0x38, 0x39, 0x38}, {0x1.6p-1f, 0x39, 0x3A, 0x3A},  // 2^-1
        {0x1.Ap-1f, 0x3A, 0x3B, 0x3A}, {0x1.Ep-1f, 0x3B, 0x3C, 0x3C},
        {0x1.2p0f, 0x3C, 0x3D, 0x3C}, {0x1.6p0f, 0x3D, 0x3E, 0x3E},  // 2^0
        {0x1.Ap0f, 0x3E, 0x3F, 0x3E}, {0x1.Ep0f, 0x3F, 0x40, 0x40},
        {0x1.2p1f, 0x40, 0x41, 0x40}, {0x1.6p1f, 0x41, 0x42, 0x42},  // 2^1
        {0x1.Ap1f, 0x42, 0x43, 0x42}, {0x1.Ep1f, 0x43, 0x44, 0x44},
        {0x1.2p2f, 0x44, 0x45, 0x44}, {0x1.6p2f, 0x45, 0x46, 0x46},  // 2^2
        {0x1.Ap2f, 0x46, 0x47, 0x46}, {0x1.Ep2f, 0x47, 0x48, 0x48},
        {0x1.2p3f, 0x48, 0x49, 0x48}, {0x1.6p3f, 0x49, 0x4A, 0x4A},  // 2^3
        {0x1.Ap3f, 0x4A, 0x4B, 0x4A}, {0x1.Ep3f, 0x4B, 0x4C, 0x4C},
        {0x1.2p4f, 0x4C, 0x4D, 0x4C}, {0x1.6p4f, 0x4D, 0x4E, 0x4E},  // 2^4
        {0x1.Ap4f, 0x4E, 0x4F, 0x4E}, {0x1.Ep4f, 0x4F, 0x50, 0x50},
        {0x1.2p5f, 0x50, 0x51, 0x50}, {0x1.6p5f, 0x51, 0x52, 0x52},  // 2^5
        {0x1.Ap5f, 0x52, 0x53, 0x52}, {0x1.Ep5f, 0x53, 0x54, 0x54},
        {0x1.2p6f, 0x54, 0x55, 0x54}, {0x1.6p6f, 0x55, 0x56, 0x56},  // 2^6
        {0x1.Ap6f, 0x56, 0x57, 0x56}, {0x1.Ep6f, 0x57, 0x58, 0x58},
        {0x1.2p7f, 0x58, 0x59, 0x58}, {0x1.6p7f, 0x59, 0x5A, 0x5A},  // 2^7
        {0x1.Ap7f, 0x5A, 0x5B, 0x5A}, {0x1.Ep7f, 0x5B, 0x5C, 0x5C},
        {0x1.2p8f, 0x5C, 0x5D, 0x5C}, {0x1.6p8f, 0x5D, 0x5E, 0x5E},  // 2^8
        {0x1.Ap8f, 0x5E, 0x5F, 0x5E}, {0x1.Ep8f, 0x5F, 0x60, 0x60},
        {0x1.2p9f, 0x60, 0x61, 0x60}, {0x1.6p9f, 0x61, 0x62, 0x62},  // 2^9
        {0x1.Ap9f, 0x62, 0x63, 0x62}, {0x1.Ep9f, 0x63, 0x64, 0x64},
        {0x1.2p10f, 0x64, 0x65, 0x64}, {0x1.6p10f, 0x65, 0x66, 0x66},  // 2^10
        {0x1.Ap10f, 0x66, 0x67, 0x66}, {0x1.Ep10f, 0x67, 0x68, 0x68},
        {0x1.2p11f, 0x68, 0x69, 0x68}, {0x1.6p11f, 0x69, 0x6A, 0x6A},  // 2^11
        {0x1.Ap11f, 0x6A, 0x6B, 0x6A}, {0x1.Ep11f, 0x6B, 0x6C, 0x6C},
        {0x1.2p12f, 0x6C, 0x6D, 0x6C}, {0x1.6p12f, 0x6D, 0x6E, 0x6E},  // 2^12
        {0x1.Ap12f, 0x6E, 0x6F, 0x6E}, {0x1.Ep12f, 0x6F, 0x70, 0x70},
        {0x1.2p13f, 0x70, 0x71, 0x70}, {0x1.6p13f, 0x71, 0x72, 0x72},  // 2^13
        {0x1.Ap13f, 0x72, 0x73, 0x72}, {0x1.Ep13f, 0x73, 0x74, 0x74},
        {0x1.2p14f, 0x74, 0x75, 0x74}, {0x1.6p14f, 0x75, 0x76, 0x76},  // 2^14
        {0x1.Ap14f, 0x76, 0x77, 0x76}, {0x1.Ep14f, 0x77, 0x78, 0x78},
        {0x1.2p15f, 0x78, 0x79, 0x78}, {0x1.6p15f, 0x79, 0x7A, 0x7A},  // 2^15
        {0x1.Ap15f, 0x7A, 0x7B, 0x7A},
    };
    // clang-format on
    check_ties(fp8::e5m2, cases);
}

// Every midpoint between consecutive finite codes, whatever the table above lists.
TEST(Fp8Boundary, EveryMidpointGoesToEvenCode) {
    for (fp8 f : both_formats) {
        for (int c = 0; c < max_code(f); ++c) {
            const double mid =
                    (ocp_decode(f, static_cast<uint8_t>(c)) + ocp_decode(f, static_cast<uint8_t>(c + 1))) / 2;
            const float x = static_cast<float>(mid);
            ASSERT_EQ(static_cast<double>(x), mid); // exact in f32
            const int even = c % 2 == 0 ? c : c + 1;
            EXPECT_EQ(lib_encode(f, x), even) << name(f) << " " << describe(x);
            EXPECT_EQ(lib_encode(f, -x), even | 0x80) << name(f) << " " << describe(x);
        }
    }
}

TEST(Fp8Boundary, E4m3Saturation) {
    const float max = std::numeric_limits<float>::max();
    EXPECT_EQ(detail::encode_e4m3(448.f), 0x7E); // largest finite: S.1111.110
    EXPECT_EQ(detail::encode_e4m3(-448.f), 0xFE);
    EXPECT_EQ(detail::encode_e4m3(std::nextafter(448.f, 0.f)), 0x7E);
    EXPECT_EQ(detail::encode_e4m3(std::nextafter(448.f, INFINITY)), 0x7E);
    EXPECT_EQ(detail::encode_e4m3(464.f), 0x7E); // 448 + half ulp: no 512 to round to, saturates
    EXPECT_EQ(detail::encode_e4m3(-464.f), 0xFE);
    EXPECT_EQ(detail::encode_e4m3(std::nextafter(464.f, INFINITY)), 0x7E);
    EXPECT_EQ(detail::encode_e4m3(480.f), 0x7E); // would be the NaN pattern S.1111.111
    EXPECT_EQ(detail::encode_e4m3(512.f), 0x7E);
    EXPECT_EQ(detail::encode_e4m3(1e6f), 0x7E);
    EXPECT_EQ(detail::encode_e4m3(max), 0x7E);
    EXPECT_EQ(detail::encode_e4m3(-max), 0xFE);
    EXPECT_EQ(detail::encode_e4m3(INFINITY), 0x7E); // e4m3fn has no inf
    EXPECT_EQ(detail::encode_e4m3(-INFINITY), 0xFE);
    EXPECT_EQ(detail::encode_e4m3(416.f), 0x7D); // 1.101b * 2^8
    EXPECT_EQ(detail::encode_e4m3(256.f), 0x78); // 1.000b * 2^8: E = 15 is finite in e4m3fn
}

TEST(Fp8Boundary, E5m2Saturation) {
    const float max = std::numeric_limits<float>::max();
    EXPECT_EQ(detail::encode_e5m2(57344.f), 0x7B); // largest finite: S.11110.11
    EXPECT_EQ(detail::encode_e5m2(-57344.f), 0xFB);
    EXPECT_EQ(detail::encode_e5m2(std::nextafter(57344.f, INFINITY)), 0x7B);
    EXPECT_EQ(detail::encode_e5m2(61440.f), 0x7B); // 57344 + half ulp: would round to inf, saturates
    EXPECT_EQ(detail::encode_e5m2(-61440.f), 0xFB);
    EXPECT_EQ(detail::encode_e5m2(std::nextafter(61440.f, INFINITY)), 0x7B);
    EXPECT_EQ(detail::encode_e5m2(65536.f), 0x7B); // 2^16 = the inf encoding's exponent
    EXPECT_EQ(detail::encode_e5m2(1e30f), 0x7B);
    EXPECT_EQ(detail::encode_e5m2(max), 0x7B);
    EXPECT_EQ(detail::encode_e5m2(-max), 0xFB);
    EXPECT_EQ(detail::encode_e5m2(INFINITY), 0x7B); // inf saturates too
    EXPECT_EQ(detail::encode_e5m2(-INFINITY), 0xFB);
    EXPECT_EQ(detail::encode_e5m2(49152.f), 0x7A); // 1.10b * 2^15
}

TEST(Fp8Boundary, ZerosAndNaNs) {
    const float qnan = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(detail::encode_e4m3(0.f), 0x00);
    EXPECT_EQ(detail::encode_e4m3(-0.f), 0x80);
    EXPECT_EQ(detail::encode_e5m2(0.f), 0x00);
    EXPECT_EQ(detail::encode_e5m2(-0.f), 0x80);
    // NaN: the canonical S.1111.111 (e4m3) and S.11111.10 (e5m2), the input's sign kept, any payload.
    EXPECT_EQ(detail::encode_e4m3(qnan), 0x7F);
    EXPECT_EQ(detail::encode_e4m3(-qnan), 0xFF);
    EXPECT_EQ(detail::encode_e5m2(qnan), 0x7E);
    EXPECT_EQ(detail::encode_e5m2(-qnan), 0xFE);
    EXPECT_EQ(detail::encode_e4m3(float_of(0x7F800001)), 0x7F); // signalling, smallest payload
    EXPECT_EQ(detail::encode_e5m2(float_of(0x7F800001)), 0x7E);
    EXPECT_EQ(detail::encode_e4m3(float_of(0xFFFFFFFF)), 0xFF); // negative, all payload bits
    EXPECT_EQ(detail::encode_e5m2(float_of(0xFFFFFFFF)), 0xFE);
    EXPECT_EQ(detail::encode_e4m3(float_of(0xFFC00000)), 0xFF);
    EXPECT_EQ(detail::encode_e5m2(float_of(0x7FC00000)), 0x7E);
}

TEST(Fp8Boundary, SmallestSubnormals) {
    // e4m3: smallest subnormal 2^-9 (0x01); half of it is a tie between 0 and 0x01, to the even 0.
    EXPECT_EQ(detail::encode_e4m3(0x1p-9f), 0x01);
    EXPECT_EQ(detail::encode_e4m3(0x1p-10f), 0x00);
    EXPECT_EQ(detail::encode_e4m3(-0x1p-10f), 0x80);
    EXPECT_EQ(detail::encode_e4m3(std::nextafter(0x1p-10f, 1.f)), 0x01);
    EXPECT_EQ(detail::encode_e4m3(-std::nextafter(0x1p-10f, 1.f)), 0x81);
    EXPECT_EQ(detail::encode_e4m3(std::nextafter(0x1p-10f, 0.f)), 0x00);
    EXPECT_EQ(detail::encode_e4m3(0x1.Cp-7f), 0x07); // 7 * 2^-9: the largest subnormal
    // e5m2: smallest subnormal 2^-16 (0x01), half of it to 0.
    EXPECT_EQ(detail::encode_e5m2(0x1p-16f), 0x01);
    EXPECT_EQ(detail::encode_e5m2(0x1p-17f), 0x00);
    EXPECT_EQ(detail::encode_e5m2(-0x1p-17f), 0x80);
    EXPECT_EQ(detail::encode_e5m2(std::nextafter(0x1p-17f, 1.f)), 0x01);
    EXPECT_EQ(detail::encode_e5m2(std::nextafter(0x1p-17f, 0.f)), 0x00);
    EXPECT_EQ(detail::encode_e5m2(0x1.8p-15f), 0x03); // 3 * 2^-16: the largest subnormal
}

TEST(Fp8Boundary, F32SubnormalInputs) {
    const float tiniest = std::numeric_limits<float>::denorm_min(); // 2^-149
    const float largest_subnormal = float_of(0x007FFFFF);
    const float min_normal = std::numeric_limits<float>::min(); // 2^-126
    // All far below half the smallest FP8 subnormal: to a zero of the input's sign.
    for (float x : { tiniest, largest_subnormal, min_normal, float_of(0x00400000) }) {
        EXPECT_EQ(detail::encode_e4m3(x), 0x00) << describe(x);
        EXPECT_EQ(detail::encode_e4m3(-x), 0x80) << describe(x);
        EXPECT_EQ(detail::encode_e5m2(x), 0x00) << describe(x);
        EXPECT_EQ(detail::encode_e5m2(-x), 0x80) << describe(x);
    }
}

TEST(Fp8Boundary, JustBelowSmallestNormalRoundsUp) {
    // e4m3: between the largest subnormal 7 * 2^-9 (0x07) and 2^-6 (0x08) the midpoint 7.5 * 2^-9 goes
    // to the even 0x08, and so does everything above it.
    EXPECT_EQ(detail::encode_e4m3(0x1p-6f), 0x08);
    EXPECT_EQ(detail::encode_e4m3(std::nextafter(0x1p-6f, 0.f)), 0x08);
    EXPECT_EQ(detail::encode_e4m3(std::nextafter(0x1.Ep-7f, 1.f)), 0x08);
    EXPECT_EQ(detail::encode_e4m3(0x1.Ep-7f), 0x08);
    EXPECT_EQ(detail::encode_e4m3(-0x1.Ep-7f), 0x88);
    EXPECT_EQ(detail::encode_e4m3(std::nextafter(0x1.Ep-7f, 0.f)), 0x07);
    // e5m2: between 3 * 2^-16 (0x03) and 2^-14 (0x04), midpoint 3.5 * 2^-16.
    EXPECT_EQ(detail::encode_e5m2(0x1p-14f), 0x04);
    EXPECT_EQ(detail::encode_e5m2(std::nextafter(0x1p-14f, 0.f)), 0x04);
    EXPECT_EQ(detail::encode_e5m2(0x1.Cp-15f), 0x04);
    EXPECT_EQ(detail::encode_e5m2(-0x1.Cp-15f), 0x84);
    EXPECT_EQ(detail::encode_e5m2(std::nextafter(0x1.Cp-15f, 0.f)), 0x03);
}

TEST(Fp8Boundary, OrdinaryValues) {
    EXPECT_EQ(detail::encode_e4m3(1.f), 0x38);   // E = bias = 7
    EXPECT_EQ(detail::encode_e4m3(-1.5f), 0xBC); // 1.100b
    EXPECT_EQ(detail::encode_e4m3(0.1f), 0x1D);  // 0.1 = 1.6 * 2^-4: 1.101b (1.625) is nearest
    EXPECT_EQ(detail::encode_e5m2(1.f), 0x3C);   // E = bias = 15
    EXPECT_EQ(detail::encode_e5m2(-1.5f), 0xBE); // 1.10b
    EXPECT_EQ(detail::encode_e5m2(0.1f), 0x2E);  // 1.6 * 2^-4: 1.10b (1.5) is nearest
}

// ---------------------------------------------------------------------------------------------------
// 5. Round trips.

TEST(Fp8RoundTrip, EveryFiniteCode) {
    for (fp8 f : both_formats) {
        for (int c = 0; c < 256; ++c) {
            const uint8_t code = static_cast<uint8_t>(c);
            if (!std::isfinite(ocp_decode(f, code))) continue;
            const float v = lib_decode(f, code);
            EXPECT_EQ(lib_encode(f, v), code) << name(f) << " code " << hex(code);
            EXPECT_EQ(bits_of(lib_decode(f, lib_encode(f, v))), bits_of(v))
                    << name(f) << " code " << hex(code);
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// 6. bf16 and f16.

bool bf16_is_nan(uint16_t h) {
    return (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0;
}

// Both 16-bit encoders on x against the fp64 reference; NaN only needs to stay NaN.
void check_half_encoders_on(float x, mismatch_log &log) {
    const uint16_t bf16 = detail::f32_to_bf16(x), f16 = detail::f32_to_f16(x);
    if (std::isnan(x)) {
        if (!bf16_is_nan(bf16)) log.fail("f32_to_bf16 of NaN " + describe(x) + " gave " + hex(bf16));
        if (!f16_pattern_is_nan(f16)) log.fail("f32_to_f16 of NaN " + describe(x) + " gave " + hex(f16));
        return;
    }
    log.check("f32_to_bf16", x, reference::double_to_bf16(x), bf16);
    log.check("f32_to_f16", x, reference::double_to_f16(x), f16);
}

TEST(Half, Bf16DecodeEveryPattern) {
    mismatch_log log;
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float actual = detail::bf16_to_f32(static_cast<uint16_t>(h));
        const double expected = reference::bf16_to_double(static_cast<uint16_t>(h));
        if (std::isnan(expected) != std::isnan(actual) ||
            (!std::isnan(expected) &&
             (static_cast<double>(actual) != expected || std::signbit(actual) != std::signbit(expected))))
            log.fail("bf16_to_f32(" + hex(h) + ") = " + describe(actual));
    }
    EXPECT_EQ(log.count(), 0);
}

TEST(Half, F16DecodeEveryPattern) {
    mismatch_log log;
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float actual = detail::f16_to_f32(static_cast<uint16_t>(h));
        const double expected = reference::f16_to_double(static_cast<uint16_t>(h));
        if (std::isnan(expected) != std::isnan(actual) ||
            (!std::isnan(expected) &&
             (static_cast<double>(actual) != expected || std::signbit(actual) != std::signbit(expected))))
            log.fail("f16_to_f32(" + hex(h) + ") = " + describe(actual));
    }
    EXPECT_EQ(log.count(), 0);
}

// Every bf16 and f16 value, the midpoint between each and the next pattern, and one f32 ulp either
// side of that midpoint, through both 16-bit encoders.
TEST(Half, EncodeEveryHalfValueAndMidpoint) {
    mismatch_log log;
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const uint16_t code = static_cast<uint16_t>(h);
        const float b = bf16_pattern_as_float(code), f = f16_pattern_as_float(code);
        check_half_encoders_on(b, log);
        check_half_encoders_on(f, log);
        if (!std::isnan(b)) log.check("bf16 identity", b, code, detail::f32_to_bf16(b));
        if (!std::isnan(f)) log.check("f16 identity", f, code, detail::f32_to_f16(f));
        // Midpoints of finite neighbours in the same sign (the magnitude increases with the code).
        if ((h & 0x7FFF) < 0x7F7F) {
            const float mid = float_of((static_cast<uint32_t>(h) << 16) | 0x8000);
            for (float x : { mid, std::nextafter(mid, 0.f), std::nextafter(mid, 2 * mid) })
                check_half_encoders_on(x, log);
        }
        if ((h & 0x7FFF) < 0x7BFF) {
            const double lo = reference::f16_to_double(code),
                         hi = reference::f16_to_double(static_cast<uint16_t>(h + 1));
            const float mid = static_cast<float>((lo + hi) / 2);
            if (static_cast<double>(mid) != (lo + hi) / 2) log.fail("f16 midpoint not exact at " + hex(h));
            for (float x : { mid, std::nextafter(mid, 0.f), std::nextafter(mid, 2 * mid) })
                check_half_encoders_on(x, log);
        }
    }
    // Past the largest finite f16 (65504): the midpoint to the next binade rounds to inf (ties to even).
    for (float x : { 65519.f, 65520.f, 65536.f, 1e30f })
        check_half_encoders_on(x, log);
    // NaNs whose payload sits only in the bits the 16-bit formats drop must not become inf.
    for (uint32_t nan_bits : { 0x7F800001u, 0xFF800001u, 0x7F801FFFu, 0x7FC00000u }) {
        EXPECT_TRUE(bf16_is_nan(detail::f32_to_bf16(float_of(nan_bits)))) << hex(nan_bits);
        EXPECT_TRUE(f16_pattern_is_nan(detail::f32_to_f16(float_of(nan_bits)))) << hex(nan_bits);
    }
    EXPECT_EQ(detail::f32_to_f16(65519.f), 0x7BFF);
    EXPECT_EQ(detail::f32_to_f16(65520.f), 0x7C00);
    EXPECT_EQ(detail::f32_to_f16(-INFINITY), 0xFC00);
    EXPECT_EQ(detail::f32_to_bf16(-INFINITY), 0xFF80);
    EXPECT_EQ(detail::f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80); // rounds past the top
    EXPECT_EQ(log.count(), 0);
}

TEST(Half, RandomF32MatchReference) {
    const long count = 1000000;
    std::mt19937_64 rng(0xbf16f16ULL);
    mismatch_log log;
    for (long i = 0; i < count; ++i) {
        const uint64_t r = rng();
        const uint32_t low = static_cast<uint32_t>(r);
        const uint32_t sign = static_cast<uint32_t>(r >> 63) << 31;
        const uint32_t pick = static_cast<uint32_t>(r >> 34) & 0xFFFF;
        float x;
        switch ((r >> 32) & 3) {
            case 0: x = float_of(low); break; // any pattern
            case 1:
                x = float_of(sign | ((127 - 26 + pick % 44) << 23) | (low & 0x7FFFFF));
                break;                                                            // f16 range
            case 2: x = float_of(sign | ((pick & 0x7F7F) << 16) | 0x8000); break; // bf16 midpoint
            default: {                                                            // near an f16 midpoint
                const uint16_t h = static_cast<uint16_t>(pick % 0x7BFF);
                const double mid = (reference::f16_to_double(h) +
                                    reference::f16_to_double(static_cast<uint16_t>(h + 1))) /
                                   2;
                const int offset = static_cast<int>((r >> 50) & 0xFF) % 5 - 2;
                x = float_of(sign | static_cast<uint32_t>(
                                            static_cast<int64_t>(bits_of(static_cast<float>(mid))) + offset));
            }
        }
        check_half_encoders_on(x, log);
    }
    EXPECT_EQ(log.count(), 0);
}

// ---------------------------------------------------------------------------------------------------
// 7. Element access by data type.

TEST(Storage, LoadAsF32ByElement) {
    const float f32[] = { 1.5f, -0.25f, 3e-5f, 448.f };
    const uint16_t b16[] = { 0x3FC0, 0xBE80, 0x0001, 0x7F80 }; // 1.5, -0.25, bf16 subnormal, inf
    const uint16_t h16[] = { 0x3E00, 0xB400, 0x0001, 0x7BFF }; // 1.5, -0.25, 2^-24, 65504
    const uint8_t e4m3[] = { 0x3C, 0xA8, 0x01, 0x7E };         // 1.5, -0.25, 2^-9, 448
    const uint8_t e5m2[] = { 0x3E, 0xB4, 0x01, 0x7B };         // 1.5, -0.25, 2^-16, 57344
    for (int64_t i = 0; i < 4; ++i) {
        EXPECT_EQ(bits_of(detail::load_as_f32(f32, data_type::f32, i)), bits_of(f32[i])) << i;
        EXPECT_EQ(bits_of(detail::load_as_f32(b16, data_type::bf16, i)), bits_of(detail::bf16_to_f32(b16[i])))
                << i;
        EXPECT_EQ(detail::load_as_f32(b16, data_type::bf16, i), reference::bf16_to_double(b16[i])) << i;
        EXPECT_EQ(detail::load_as_f32(h16, data_type::f16, i), reference::f16_to_double(h16[i])) << i;
        EXPECT_EQ(detail::load_as_f32(e4m3, data_type::f8_e4m3, i), ocp_decode(fp8::e4m3, e4m3[i])) << i;
        EXPECT_EQ(detail::load_as_f32(e5m2, data_type::f8_e5m2, i), ocp_decode(fp8::e5m2, e5m2[i])) << i;
    }
    EXPECT_EQ(detail::load_as_f32(f32, data_type::f32, 3), 448.f);
    EXPECT_EQ(detail::load_as_f32(e4m3, data_type::f8_e4m3, 1), -0.25f);
    EXPECT_EQ(detail::load_as_f32(e5m2, data_type::f8_e5m2, 3), 57344.f);
    EXPECT_EQ(detail::load_as_f32(h16, data_type::f16, 3), 65504.f);
    EXPECT_EQ(detail::load_as_f32(b16, data_type::bf16, 0), 1.5f);
}

TEST(Storage, StoreFromF32ByElement) {
    const float values[] = { 1.5f, -0.1f, 500.f, 0x1p-10f, std::numeric_limits<float>::quiet_NaN() };
    constexpr int n = 5;
    for (int i = 0; i < n; ++i) {
        const float x = values[i];
        SCOPED_TRACE(describe(x));
        // Each array is filled with a sentinel: a store touches exactly element i.
        float f32[n];
        uint16_t b16[n], h16[n];
        uint8_t e4m3[n], e5m2[n];
        std::fill(f32, f32 + n, 7.f);
        std::fill(b16, b16 + n, uint16_t { 0xABCD });
        std::fill(h16, h16 + n, uint16_t { 0xABCD });
        std::fill(e4m3, e4m3 + n, uint8_t { 0x5A });
        std::fill(e5m2, e5m2 + n, uint8_t { 0x5A });
        detail::store_from_f32(f32, data_type::f32, i, x);
        detail::store_from_f32(b16, data_type::bf16, i, x);
        detail::store_from_f32(h16, data_type::f16, i, x);
        detail::store_from_f32(e4m3, data_type::f8_e4m3, i, x);
        detail::store_from_f32(e5m2, data_type::f8_e5m2, i, x);
        for (int j = 0; j < n; ++j) {
            if (j != i) {
                EXPECT_EQ(f32[j], 7.f);
                EXPECT_EQ(b16[j], 0xABCD);
                EXPECT_EQ(h16[j], 0xABCD);
                EXPECT_EQ(e4m3[j], 0x5A);
                EXPECT_EQ(e5m2[j], 0x5A);
                continue;
            }
            EXPECT_EQ(bits_of(f32[j]), bits_of(x));
            EXPECT_EQ(b16[j], detail::f32_to_bf16(x));
            EXPECT_EQ(h16[j], detail::f32_to_f16(x));
            EXPECT_EQ(e4m3[j], detail::encode_e4m3(x));
            EXPECT_EQ(e5m2[j], detail::encode_e5m2(x));
            EXPECT_EQ(e4m3[j], ref_encode(fp8::e4m3, x));
            EXPECT_EQ(e5m2[j], ref_encode(fp8::e5m2, x));
        }
    }
    // By hand: 500 saturates to 448 in e4m3; in e5m2 it is past the midpoint 480 of 448 and 512, so 2^9
    // (E = 24, 0x60).
    uint8_t bytes[3] = { 0, 0, 0 };
    detail::store_from_f32(bytes, data_type::f8_e4m3, 2, 500.f);
    EXPECT_EQ(bytes[2], 0x7E);
    detail::store_from_f32(bytes, data_type::f8_e5m2, 1, 500.f);
    EXPECT_EQ(bytes[1], 0x60);
    EXPECT_EQ(bytes[0], 0x00);
}

TEST(Storage, Fp8Max) {
    EXPECT_EQ(detail::fp8_max(data_type::f8_e4m3), 448.f);
    EXPECT_EQ(detail::fp8_max(data_type::f8_e5m2), 57344.f);
    EXPECT_EQ(detail::fp8_max(data_type::f32), 0.f);
    EXPECT_EQ(detail::fp8_max(data_type::bf16), 0.f);
    EXPECT_TRUE(detail::is_fp8(data_type::f8_e4m3));
    EXPECT_TRUE(detail::is_fp8(data_type::f8_e5m2));
    EXPECT_FALSE(detail::is_fp8(data_type::f16));
}

} // namespace
