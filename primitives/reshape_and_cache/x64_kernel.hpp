// The x64 reshape_and_cache kernel, written once over an f32 vector type (avx2_f32, avx512_f32) and
// instantiated by the thin per-ISA files avx2.cpp and avx512.cpp. It writes the same bytes as
// ref:any for every input (the codec of src/fp8.hpp, vectorised bit-exactly):
//   - FP8 caches take bf16/f16 rows without an f32 copy (the per-token amax from their bits, the
//     conversion inside the encoder); other rows are converted to f32 into a stack buffer, the amax
//     taken on the way;
//   - FP8: q = fp8(x / scale), a true f32 division, saturated to +-max (+-inf too), NaN to the
//     canonical NaN with its sign; rounded by an FP addition that drops exactly the format's excess
//     mantissa bits, then vcvtps2ph, exact there, into f16 bits that hold the code
//     (fp8_grid_f16), 32 values per store (encode_fp8_divided, one template over
//     both codecs); x64:avx2 takes bf16 words' codes from the addition's bits instead
//     (fp8_biased_code32); whole groups of finite bf16 rows with per-token scales need neither the
//     saturation nor the NaN step (words_known), and x64:avx2 encodes whole groups of bf16 rows
//     without the division, by per-row thresholds on their bits (fp8_threshold_bounds);
//   - bf16: integer round-to-nearest-even, NaN quieted (bits >> 16 | 0x40); f16: vcvtps2ph in
//     nearest-even mode, whose NaN (sign | 0x7E00 | payload >> 13) and overflow (>= 65520 to inf)
//     match f32_to_f16; f32: stored as is, with a signalling NaN quieted like the reference's
//     multiplication by the unit scale does; bf16 into bf16 and f16 into f16: copied, NaNs quieted
//     (copy_16bit_quieting_nan).
// Plain rows are stored with vector stores. For the packed layout, 16 tokens that fill a 16-token
// group are encoded together (16-bit rows to FP8: in passes, amaxes, scales, codes) and
// written in the layout's order (K by a transpose in registers) with non-temporal stores;
// other tokens are encoded into a small buffer and scattered with the offsets of
// src/cache_layout.hpp.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#include <tbb/task_arena.h>

#include "reshape_and_cache_internal.hpp"
#include "src/cache_desc.hpp"
#include "src/cache_layout.hpp"
#include "src/error.hpp"
#include "src/fp8.hpp"
#include "src/parallel.hpp"
#include "src/x64/f32_vectors.hpp"

namespace pagedattn {
namespace detail {
// Hidden, like the paged_attention kernels: internal, called directly rather than through the PLT.
#pragma GCC visibility push(hidden)
namespace x64_rac {

// The FP8 formats of src/fp8.cpp as compile-time constants: mantissa bits and NaN code (magnitude
// bits).
template <bool is_e4m3> struct fp8_format {
    static constexpr int mantissa_bits = is_e4m3 ? 3 : 2;
    static constexpr int nan_code = is_e4m3 ? 0x7F : 0x7E;
    static constexpr int largest_code = is_e4m3 ? 0x7E : 0x7B; // the largest finite value's
    static constexpr int drop = 23 - mantissa_bits;            // f32 mantissa bits below the format's
    static constexpr int exponent_bias = is_e4m3 ? 7 : 15;
    // The largest finite value in the f16 domain of the encoder (e4m3 times 2^-8).
    static constexpr float max_f16_domain = is_e4m3 ? 448.f / 256.f : 57344.f;
};

// What the encoder knows of 16-bit input words beyond their signs: nothing, that they are bf16, or
// that they are finite bf16 values at most the amax their per-token scale came from. Then |x| /
// scale is at most the format's largest finite value, up to the division's rounding, which the
// grid rounds back to it: no clamp and no NaN to make canonical.
enum class words_known { any, bf16, bf16_within_scale };

// The threshold encoder of whole groups of bf16 rows (x64:avx2).
// A bf16 magnitude is (1 + m/128) 2^(e - 127), m its 7 mantissa bits, e its exponent field; by a
// scale s = ms 2^es (ms in [1, 2)) its quotient is q(m) 2^(e - 128 - es) with q(m) = (128 + m) /
// (64 ms), in (1, 4). Where the codes are normal, a factor of 2 adds 2^mantissa_bits to the code, so
//   code = f(m) + 2^mantissa_bits (e - 128 - es),
// f(m) the code of q(m). f steps up by one at each boundary between two codes that q(m) passes, and
// m in [0, 127] spans less than one binade: f(m) = f(0) + the number of thresholds (at most
// 2^mantissa_bits) at most m. The thresholds keep the division's two roundings exactly: q rounds in
// f32, then to the nearest code, ties to the even one. So code c + 1 is reached where q is at least
// the midpoint M of codes c, c + 1 less half an f32 ulp (that value rounds to M, a tie that even
// c + 1 wins), or, for odd c + 1, above M plus half an ulp; i.e. where 128 + m is at least (above)
// that bound times 64 ms: a product of 25 and 24 bits, exact in f64 and never an integer (the
// bound's last bit is 2^-24 of its binade), so the threshold is its ceiling either way. The
// thresholds depend on ms alone, and per-token scales of bf16 rows have 128 ms: their thresholds are
// made at compile time (fp8_threshold_table), in groups of 8 mantissas; per 32 values the codes are
// then two byte look-ups by m >> 3 (the group's first code, the threshold within it), a compare
// and adds: no division and no f32 lanes (x64:avx2 on Zen 3, 16 rows of 128 in L1, TSC cycles
// per 32 codes: e4m3 16.8 by the division, 15.4 by per-row plans of f64 ceilings and a compare per
// threshold, 10.6 by the table; e5m2 17.0, 11.9, 10.0). Other scales (per-tensor, per-head: one
// for the group's rows) have their thresholds made once per group. Rows with values beyond their
// scale (not per-token scales) get codes clamped at the largest; where a value's exponent is so
// large that the byte arithmetic would wrap (NaN and infinity among them), or below the row's
// lowest exponent (whose code would not be normal), the division path redoes the row. Zeros and
// bf16 subnormals are code 0 (with their sign) where the scale is at least 2^(-126 +
// exponent_bias + mantissa_bits), else the whole row takes the division path. Checked against the
// division path for every finite bf16 amax and every bf16 value of either sign up to it (1.1e9
// values per format), and for every bf16 word by 20000 scales (1.3e9), bit for bit.
template <bool is_e4m3> struct fp8_threshold_bounds {
    static constexpr int count = 2 << fp8_format<is_e4m3>::mantissa_bits;
    // Bound i, between the codes of 1.0 plus i and plus i + 1 (values in [1, 4)), in units of q.
    double bound[count];
    constexpr fp8_threshold_bounds() : bound() {
        constexpr int m = fp8_format<is_e4m3>::mantissa_bits, steps = 1 << m;
        for (int i = 0; i < count; ++i) {
            const int binade = i >> m; // 0: [1, 2), 1: [2, 4)
            const double unit = binade ? 2.0 : 1.0, step = unit / steps;
            const double midpoint = unit + (i % steps) * step + step / 2;      // in the same binade
            const double half_ulp = unit / 16777216.0;                         // 2^-24 of the binade: f32's
            bound[i] = i % 2 == 1 ? midpoint - half_ulp : midpoint + half_ulp; // (i + 1 even: even code)
        }
    }
};
template <bool is_e4m3> constexpr fp8_threshold_bounds<is_e4m3> fp8_threshold_bounds_of {};

// The thresholds of a scale significand ms, as fp8_codes32_by_thresholds reads them: per group h
// of 8 mantissas (m >> 3) the bounds that 8h crosses, and the threshold less one that a later m of
// the group may pass (thresholds lie at least 7 apart: at most one per group), else 127.
template <bool is_e4m3>
constexpr void fp8_threshold_groups(double ms, int8_t (&crossed)[16], int8_t (&next_above)[16]) {
    constexpr int count = fp8_threshold_bounds<is_e4m3>::count;
    // Bound i times 64 ms (exact, never an integer) rounded up, less 129, as bytes saturated
    int above[count] = {};
    for (int i = 0; i < count; ++i) {
        const int t = static_cast<int>(fp8_threshold_bounds_of<is_e4m3>.bound[i] * 64.0 * ms) + 1 - 129;
        above[i] = t < -128 ? -128 : t > 127 ? 127 : t;
    }
    int before = 0;
    for (int h = 0; h < 16; ++h) {
        while (before < count && above[before] < 8 * h)
            ++before;
        crossed[h] = static_cast<int8_t>(before);
        next_above[h] = static_cast<int8_t>(before < count ? above[before] : 127);
    }
}

// fp8_threshold_groups of the 128 scale significands that per-token scales of bf16 rows have (amax
// / 448 and amax / 57344 share them: 57344 is 448 x 2^7), made at compile time. A scale's slot is
// its significand's top 8 fraction bits; a slot holds one significand or none. (Other scales,
// per-tensor and per-head ones, have theirs made as a group of rows is encoded.)
template <bool is_e4m3> struct fp8_threshold_table {
    uint32_t fraction[256]; // the 23 fraction bits of the slot's significand; all ones: none
    alignas(16) int8_t crossed[256][16];
    alignas(16) int8_t next_above[256][16];
    static constexpr uint32_t slot(uint32_t fraction) { return fraction >> 15; }
    constexpr bool holds(uint32_t f) const { return fraction[slot(f)] == f; }
    constexpr fp8_threshold_table() : fraction(), crossed(), next_above() {
        for (auto &f : fraction)
            f = 0xFFFFFFFF;
        for (int k = 0; k < 128; ++k) {
            float ms = (1.f + k / 128.f) / 448.f * 256.f; // rounded as at run time, then scaled exactly
            if (ms < 1.f) ms *= 2.f;
            const auto bits = static_cast<uint32_t>((ms - 1.f) * 8388608.f);
            const uint32_t s = slot(bits);
            if (fraction[s] != 0xFFFFFFFF)
                throw "two significands in one slot"; // (not constant: fails to compile)
            fraction[s] = bits;
            fp8_threshold_groups<is_e4m3>(ms, crossed[s], next_above[s]);
        }
    }
};
template <bool is_e4m3> constexpr fp8_threshold_table<is_e4m3> fp8_threshold_table_of {};
// fp8_threshold_groups at run time: not inlined, where GCC 12 warned of writes past the arrays that
// its loop bounds rule out (-Wstringop-overflow); once per group of rows with a per-tensor or
// per-head scale.
template <bool is_e4m3>
__attribute__((noinline)) void fp8_threshold_groups_of(uint32_t fraction, int8_t (&crossed)[16],
                                                       int8_t (&next_above)[16]) {
    fp8_threshold_groups<is_e4m3>(1.0 + fraction * 0x1p-23, crossed, next_above);
}

// Per-ISA encoders over the f32 vector type; specialised below.
template <typename V> struct codec;

// The steps of the rounding onto the FP8 grid that fp8_grid_f16 and fp8_biased_code32 share (below):
// |y| clamped at the largest finite value unless within_range (a NaN passes, the min's second
// operand), the exponent bits of its grid (its own, floored at 2^-14, f16's smallest normal), and
// the bits of the addend c = 2^(E + 23 - mantissa_bits) for that exponent E.
template <typename C, bool is_e4m3, bool within_range> auto fp8_grid_clamped(typename C::reg magnitude) {
    return within_range ? magnitude : C::min(C::set1(fp8_format<is_e4m3>::max_f16_domain), magnitude);
}
template <typename C> auto fp8_grid_exponent(typename C::reg clamped) {
    return C::max_bits(C::and_bits(C::bits(clamped), C::set1i(0x7F800000)), C::set1i(0x38800000));
}
template <typename C, bool is_e4m3, typename Bits> auto fp8_grid_addend(Bits exponent) {
    return C::add_bits(exponent, C::set1i(fp8_format<is_e4m3>::drop << 23));
}

// The magnitude of y rounded onto the FP8 grid, as f16 bits, for one codec's vector of values. y is
// the value in the f16 domain (x / scale times 2^-8 for e4m3, whose codes then are the f16 bits
// >> 7; x / scale for e5m2, the top byte of f16). The rounding is the FP addition's own (to nearest
// even: MXCSR's default, which the division assumes too): adding c = 2^(E + 23 - mantissa_bits), E
// the exponent of |y| but at least the smallest normal's, keeps exactly the format's mantissa bits,
// subnormals included, and subtracting c is exact. The rounded value is exact in f16, so vcvtps2ph
// only changes the format. |y| is clamped at the largest finite value (+inf saturates); a NaN passes
// the min (its second operand) and the arithmetic as a NaN, whose f16 code lies above the format's
// NaN code.
template <typename C, bool is_e4m3, bool is_magnitude = false, bool within_range = false>
auto fp8_grid_f16(typename C::reg y) {
    const auto magnitude = is_magnitude ? y : C::from_bits(C::and_bits(C::bits(y), C::set1i(0x7FFFFFFF)));
    const auto clamped = fp8_grid_clamped<C, is_e4m3, within_range>(magnitude);
    const auto c = C::from_bits(fp8_grid_addend<C, is_e4m3>(fp8_grid_exponent<C>(clamped)));
    return C::to_f16(C::sub(C::add(clamped, c), c));
}

// fp8_grid_f16's rounding, then the code taken from the sum's bits instead of through f16: the FP8
// code of |y| (y >= 0, or NaN) plus fp8_code_bias, as a 32-bit integer. The addition t = y + c
// leaves in t's bits minus c's the multiple of the grid's step (2^(E - mantissa_bits)) that y rounds
// to: 2^mantissa_bits plus the code's mantissa for a normal code, a carry into the next binade
// included, the code itself for a subnormal one (E floored at -14). Adding (E + 14) << mantissa_bits
// gives the code's exponent and mantissa fields at once: integer operations in place of vcvtps2ph,
// the subtraction and the shuffles that gathered the f16 halves (x64:avx2 on Zen 3, a whole group in
// cache: 93 -> 87 ns per (token, kv head), e4m3). (E + 127) << mantissa_bits, the exponent bits
// shifted down, is added instead: the caller subtracts the bias, 113 << mantissa_bits, once per 16
// codes after packing them to 16 bits rather than once per 8 here (2 operations fewer per 32 codes).
// A NaN's exponent is held to 2^15's, so that c stays finite and t's NaN bits give a 32-bit code above
// every finite one.
template <bool is_e4m3> constexpr int fp8_code_bias = 113 << fp8_format<is_e4m3>::mantissa_bits;
template <typename C, bool is_e4m3, bool within_range = false> auto fp8_biased_code32(typename C::reg y) {
    using F = fp8_format<is_e4m3>;
    const auto clamped = fp8_grid_clamped<C, is_e4m3, within_range>(y);
    auto exponent = fp8_grid_exponent<C>(clamped);
    if (!within_range) exponent = C::min_bits(exponent, C::set1i(0x47000000));
    const auto c = fp8_grid_addend<C, is_e4m3>(exponent);
    const auto t = C::bits(C::add(clamped, C::from_bits(c)));
    return C::add_bits(C::sub_bits(t, c), C::template srli_bits<F::drop>(exponent));
}

// A bf16 or f16 value's bits as f32 (exact). A template on the vector type, as everything compiled
// with an ISA's flags here: one inline copy would serve every ISA file's callers.
template <typename V> float bits_16bit_to_f32(uint16_t bits, data_type dt) {
    if (dt == data_type::f16) return _cvtsh_ss(bits);
    const uint32_t f = static_cast<uint32_t>(bits) << 16;
    float x;
    std::memcpy(&x, &f, sizeof x);
    return x;
}

// The largest finite |x| of n bf16 or f16 values (n a multiple of 8), 0 if none: a signed max over
// the magnitude bits plus an offset that makes exactly the non-finite ones negative (the magnitude
// order of finite values is their bits' order). W: __m256i or __m512i, the widest whole loads.
template <typename V, typename W> float amax_16bit_by(const void *src, data_type dt, dim n) {
    constexpr dim lanes = sizeof(W) / 2;
    const auto *in = static_cast<const uint16_t *>(src);
    const short offset = static_cast<short>(0x8000 - (dt == data_type::bf16 ? 0x7F80 : 0x7C00));
    __m128i m = _mm_set1_epi16(offset); // |x| = 0
    dim i = 0;
    if constexpr (lanes == 32) {
#if defined(__AVX512BW__)
        const __m512i magnitude = _mm512_set1_epi16(0x7FFF), shift = _mm512_set1_epi16(offset);
        __m512i best = shift;
        for (; i + 32 <= n; i += 32)
            best = _mm512_max_epi16(
                    best, _mm512_add_epi16(_mm512_and_si512(_mm512_loadu_si512(in + i), magnitude), shift));
        const __m256i half =
                _mm256_max_epi16(_mm512_castsi512_si256(best), _mm512_extracti64x4_epi64(best, 1));
        m = _mm_max_epi16(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
#endif
    }
    const __m256i magnitude = _mm256_set1_epi16(0x7FFF), shift = _mm256_set1_epi16(offset);
    __m256i best = shift;
    for (; i + 16 <= n; i += 16) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(in + i));
        best = _mm256_max_epi16(best, _mm256_add_epi16(_mm256_and_si256(x, magnitude), shift));
    }
    m = _mm_max_epi16(m, _mm_max_epi16(_mm256_castsi256_si128(best), _mm256_extracti128_si256(best, 1)));
    if (i < n) {
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i *>(in + i));
        m = _mm_max_epi16(m, _mm_add_epi16(_mm_and_si128(x, _mm256_castsi256_si128(magnitude)),
                                           _mm256_castsi256_si128(shift)));
    }
    m = _mm_max_epi16(m, _mm_srli_si128(m, 8));
    m = _mm_max_epi16(m, _mm_srli_si128(m, 4));
    m = _mm_max_epi16(m, _mm_srli_si128(m, 2));
    return bits_16bit_to_f32<V>(static_cast<uint16_t>(_mm_extract_epi16(m, 0) - offset), dt);
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// Each codec extends its vector type (set1, mul, the 16-bit loads) with the encoders.
template <> struct codec<avx512_f32> : avx512_f32 {
    using reg = __m512;
    using ireg = __m512i;
    static ireg bits(reg x) { return _mm512_castps_si512(x); }
    static ireg set1i(int x) { return _mm512_set1_epi32(x); }
    static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
    /// |x| where x is finite, else 0.
    static reg abs_finite(reg x) {
        const ireg m = _mm512_and_si512(bits(x), set1i(0x7FFFFFFF));
        return _mm512_castsi512_ps(_mm512_maskz_mov_epi32(_mm512_cmplt_epi32_mask(m, set1i(0x7F800000)), m));
    }
    // The integer and f16 steps of fp8_grid_f16 (on 32-bit lanes).
    static reg from_bits(ireg x) { return _mm512_castsi512_ps(x); }
    static ireg and_bits(ireg a, ireg b) { return _mm512_and_si512(a, b); }
    static ireg max_bits(ireg a, ireg b) { return _mm512_max_epi32(a, b); }
    static ireg add_bits(ireg a, ireg b) { return _mm512_add_epi32(a, b); }
    static reg min(reg a, reg b) { return _mm512_min_ps(a, b); }
    static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
    static __m256i to_f16(reg x) { return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    /// The FP8 codes of 32 f16-domain values, q(0) and q(1) (see codec<avx2_f32>::fp8_codes32).
    template <bool is_e4m3, bool within_range = false, typename Quotients>
    static __m256i fp8_codes32(Quotients q) {
        const reg y0 = q(0), y1 = q(1);
        const __mmask32 negative = _mm512_kunpackw(_mm512_cmplt_epi32_mask(bits(y1), _mm512_setzero_si512()),
                                                   _mm512_cmplt_epi32_mask(bits(y0), _mm512_setzero_si512()));
        return fp8_codes32<is_e4m3, within_range>([&](dim k) { return k == 0 ? y0 : y1; }, negative);
    }
    /// As above with the signs given: bit i set where value i is negative.
    template <bool is_e4m3, bool within_range = false, typename Quotients>
    static __m256i fp8_codes32(Quotients q, __mmask32 negative) {
        using F = fp8_format<is_e4m3>;
        const reg y0 = q(0), y1 = q(1);
        // (the grid's halves named first: clang's _mm512_inserti64x4 is a macro, and a template
        // argument list's comma would split its arguments)
        const __m256i low = fp8_grid_f16<codec, is_e4m3, false, within_range>(y0),
                      high = fp8_grid_f16<codec, is_e4m3, false, within_range>(y1);
        const ireg h = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
        // NaNs' f16 codes lie above the NaN code, finite ones at or below the largest finite code.
        const __m256i codes = _mm512_cvtepi16_epi8(_mm512_srli_epi16(h, is_e4m3 ? 7 : 8));
        const __m256i magnitudes =
                within_range ? codes
                             : _mm256_min_epu8(codes, _mm256_set1_epi8(static_cast<char>(F::nan_code)));
        // magnitudes <= 0x7F: adding the sign bit sets it (one masked operation)
        return _mm256_mask_add_epi8(magnitudes, negative, magnitudes,
                                    _mm256_set1_epi8(static_cast<char>(0x80)));
    }
    /// The FP8 codes of 32 bf16 values at p divided by `divisor` (then by 256 where then_by_256).
    /// Unpacking the magnitudes' words with zeros makes them f32 without a shift, per 128-bit lane
    /// L: elements 8L .. 8L + 3 in the first vector, 8L + 4 .. 8L + 7 in the second; packing the two
    /// vectors' codes per lane and a shuffle of 32-bit groups restores the order. Per 32 values 2
    /// vector operations fewer than widening, shifting and taking |x| of each vector, and 2 of the
    /// shifts and shuffles (two pipes on Zen 5) become unpacks (four pipes): ~12% less time.
    /// within_scale: the words are words_known::bf16_within_scale.
    template <bool is_e4m3, bool then_by_256, bool within_scale>
    static __m256i fp8_codes32_bf16(const char *p, reg divisor) {
        using F = fp8_format<is_e4m3>;
        const ireg raw = _mm512_loadu_si512(p);
        const __mmask32 negative = _mm512_movepi16_mask(raw);
        const ireg magnitude = _mm512_and_si512(raw, _mm512_set1_epi16(0x7FFF));
        auto grid = [&](ireg words) {
            reg q = div(_mm512_castsi512_ps(words), divisor);
            if (then_by_256) q = mul(q, set1(1.f / 256.f));
            return _mm256_srli_epi16(fp8_grid_f16<codec, is_e4m3, true, within_scale>(q), is_e4m3 ? 7 : 8);
        };
        const __m256i low = grid(_mm512_unpacklo_epi16(_mm512_setzero_si512(), magnitude)),
                      high = grid(_mm512_unpackhi_epi16(_mm512_setzero_si512(), magnitude));
        // Per lane: low's 8 codes (elements 0-3, 8-11 of the lane's 16), high's (4-7, 12-15).
        const __m256i ordered = _mm256_shuffle_epi32(_mm256_packus_epi16(low, high), _MM_SHUFFLE(3, 1, 2, 0));
        const __m256i magnitudes =
                within_scale ? ordered
                             : _mm256_min_epu8(ordered, _mm256_set1_epi8(static_cast<char>(F::nan_code)));
        return _mm256_mask_add_epi8(magnitudes, negative, magnitudes,
                                    _mm256_set1_epi8(static_cast<char>(0x80)));
    }
    // The signs of 32 bf16 or f16 values: their top bits, one mask operation. A quotient by a
    // positive scale has its dividend's sign (zeros, infinities and NaNs included).
    static constexpr bool signs_from_16bit = true;
    static constexpr bool has_threshold_encoder = false; // (x64:avx2's only, so far)
    static __mmask32 signs_16bit(const char *p) { return _mm512_movepi16_mask(_mm512_loadu_si512(p)); }
    // The amax of a bf16 or f16 row on its bits, the widest loads first.
    static float amax_16bit(const void *src, data_type dt, dim n) {
        return amax_16bit_by<avx512_f32, __m512i>(src, dt, n);
    }
    /// amax_16bit of 16 rows `stride` bytes apart into out[16], the rows' horizontal reductions
    /// done together: a tree of 128- and 64-bit shuffles and maxima halves the words per row and
    /// doubles the rows per register at each level (~20 operations a row instead of a serial
    /// chain of ~30 each).
    /// Returns whether all the rows' values are finite (their keys' least one non-negative).
    static bool amax_16bit_rows(const char *src, dim stride, data_type dt, dim n, float *out) {
        const short offset = static_cast<short>(0x8000 - (dt == data_type::bf16 ? 0x7F80 : 0x7C00));
        const __m512i magnitude = _mm512_set1_epi16(0x7FFF), shift = _mm512_set1_epi16(offset);
        auto key = [&](__m512i x) { return _mm512_add_epi16(_mm512_and_si512(x, magnitude), shift); };
        __m512i m[16], least = shift;
        for (int j = 0; j < 16; ++j) { // each row's 32 lanes of maxima (the shift: |x| = 0)
            const auto *in = reinterpret_cast<const uint16_t *>(src + j * stride);
            __m512i best = shift, second = shift; // two chains, two loads per iteration
            dim i = 0;
            auto take = [&](__m512i &chain, __m512i k) {
                chain = _mm512_max_epi16(chain, k);
                least = _mm512_min_epi16(least, k);
            };
            for (; i + 64 <= n; i += 64) {
                take(best, key(_mm512_loadu_si512(in + i)));
                take(second, key(_mm512_loadu_si512(in + i + 32)));
            }
            best = _mm512_max_epi16(best, second);
            if (i + 32 <= n) take(best, key(_mm512_loadu_si512(in + i))), i += 32;
            if (i < n) // masked-off lanes load 0, whose key is the shift
                take(best,
                     key(_mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << (n - i)) - 1), in + i)));
            m[j] = best;
        }
        for (int j = 0; j < 8; ++j) // rows 2j, 2j + 1: 16 words each, in 256-bit halves
            m[j] = _mm512_max_epi16(_mm512_shuffle_i64x2(m[2 * j], m[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_i64x2(m[2 * j], m[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
        for (int j = 0; j < 4; ++j) // rows 4j .. 4j + 3: 8 words each, one per 128-bit lane
            m[j] = _mm512_max_epi16(_mm512_shuffle_i64x2(m[2 * j], m[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_i64x2(m[2 * j], m[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
        alignas(32) float maxima[16];
        for (int j = 0; j < 2; ++j) {
            // Lane k: row 8j + k in its low 64 bits, row 8j + 4 + k in its high 64 bits, 4 words
            // each; then word 0 of each 64 bits their maximum.
            __m512i v = _mm512_max_epi16(_mm512_unpacklo_epi64(m[2 * j], m[2 * j + 1]),
                                         _mm512_unpackhi_epi64(m[2 * j], m[2 * j + 1]));
            v = _mm512_max_epi16(v, _mm512_srli_epi64(v, 32));
            v = _mm512_max_epi16(v, _mm512_srli_epi64(v, 16));
            // Rows 8j + (0, 4, 1, 5, 2, 6, 3, 7), back to their bits.
            const __m128i bits = _mm_sub_epi16(_mm512_cvtepi64_epi16(v), _mm_set1_epi16(offset));
            const __m256 values =
                    dt == data_type::f16
                            ? _mm256_cvtph_ps(bits)
                            : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
            _mm256_store_ps(maxima + 8 * j, values);
        }
        for (int j = 0; j < 2; ++j)
            for (int k = 0; k < 4; ++k) {
                out[8 * j + k] = maxima[8 * j + 2 * k];
                out[8 * j + 4 + k] = maxima[8 * j + 2 * k + 1];
            }
        return _mm512_movepi16_mask(least) == 0;
    }
    static void store_bf16(void *dst, reg x) {
        const ireg b = bits(x);
        const ireg lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), set1i(1));
        const ireg rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, set1i(0x7FFF)), lsb), 16);
        const ireg quiet = _mm512_or_si512(_mm512_srli_epi32(b, 16), set1i(0x40));
        const __mmask16 nan =
                _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, set1i(0x7FFFFFFF)), set1i(0x7F800000));
        _mm256_storeu_si256(static_cast<__m256i *>(dst),
                            _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet)));
    }
    static void store_f16(void *dst, reg x) {
        _mm256_storeu_si256(static_cast<__m256i *>(dst),
                            _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    static void store_f32(void *dst, reg x) {
        const ireg b = bits(x);
        const __mmask16 nan =
                _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, set1i(0x7FFFFFFF)), set1i(0x7F800000));
        _mm512_storeu_si512(dst, _mm512_mask_mov_epi32(b, nan, _mm512_or_si512(b, set1i(0x00400000))));
    }
};
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
template <> struct codec<avx2_f32> : avx2_f32 {
    using reg = __m256;
    using ireg = __m256i;
    static ireg bits(reg x) { return _mm256_castps_si256(x); }
    static ireg set1i(int x) { return _mm256_set1_epi32(x); }
    static reg abs_finite(reg x) {
        const ireg m = _mm256_and_si256(bits(x), set1i(0x7FFFFFFF));
        return _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(set1i(0x7F800000), m), m));
    }
    static ireg select(ireg mask, ireg a, ireg b) { return _mm256_blendv_epi8(b, a, mask); }
    // The integer and f16 steps of fp8_grid_f16 (on 32-bit lanes).
    static reg from_bits(ireg x) { return _mm256_castsi256_ps(x); }
    static ireg and_bits(ireg a, ireg b) { return _mm256_and_si256(a, b); }
    static ireg max_bits(ireg a, ireg b) { return _mm256_max_epi32(a, b); }
    static ireg add_bits(ireg a, ireg b) { return _mm256_add_epi32(a, b); }
    // and those of fp8_biased_code32
    static ireg min_bits(ireg a, ireg b) { return _mm256_min_epi32(a, b); }
    static ireg sub_bits(ireg a, ireg b) { return _mm256_sub_epi32(a, b); }
    template <int n> static ireg srli_bits(ireg a) { return _mm256_srli_epi32(a, n); }
    static reg min(reg a, reg b) { return _mm256_min_ps(a, b); }
    static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
    static __m128i to_f16(reg x) { return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static ireg set1_byte(int x) { return _mm256_set1_epi8(static_cast<char>(x)); }
    static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
    // The FP8 codes of 32 f16-domain values (see fp8_grid_f16), q(0) .. q(3), 32 bytes in order.
    // within_range: |q| at most the largest finite value up to a rounding, no NaN (words_known).
    template <bool is_e4m3, bool within_range = false, typename Quotients>
    static ireg fp8_codes32(Quotients q) {
        using F = fp8_format<is_e4m3>;
        const reg y0 = q(0), y1 = q(1), y2 = q(2), y3 = q(3);
        auto grid = [](reg y) { return fp8_grid_f16<codec, is_e4m3, false, within_range>(y); };
        const __m128i grid_y0 = grid(y0), grid_y1 = grid(y1), grid_y2 = grid(y2), grid_y3 = grid(y3);
        constexpr int shift = is_e4m3 ? 7 : 8;
        const ireg low = _mm256_srli_epi16(_mm256_set_m128i(grid_y1, grid_y0), shift);
        const ireg high = _mm256_srli_epi16(_mm256_set_m128i(grid_y3, grid_y2), shift);
        // packus leaves the 64-bit quarters as y0 y2 y1 y3. Finite codes lie at or below the largest
        // finite code, NaNs' f16 codes above the NaN code: the min makes them canonical.
        const ireg codes = _mm256_permute4x64_epi64(_mm256_packus_epi16(low, high), 0xD8);
        const ireg magnitudes = within_range ? codes : _mm256_min_epu8(codes, set1_byte(F::nan_code));
        // Signed saturation keeps the signs through both packs, which leave 32-bit quarters as the
        // low halves of y0 y1 y2 y3, then their high halves.
        const ireg signs =
                _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(bits(y0), bits(y1)),
                                                               _mm256_packs_epi32(bits(y2), bits(y3))),
                                            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        return _mm256_or_si256(magnitudes, _mm256_and_si256(signs, set1_byte(0x80)));
    }
    /// The FP8 codes of 32 bf16 values at p divided by `divisor` (then by 256 where then_by_256): the
    /// magnitudes' words unpacked with zeros into f32 (per 128-bit lane L of a 16-value load:
    /// elements 8L .. 8L + 3, then 8L + 4 .. 8L + 7), their codes by fp8_biased_code32, packed per lane
    /// with the signs beside them and put in order by one 64-bit permute.
    template <bool is_e4m3, bool then_by_256, bool within_scale>
    static ireg fp8_codes32_bf16(const char *p, reg divisor) {
        using F = fp8_format<is_e4m3>;
        const ireg a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)),
                   b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + 32));
        const ireg magnitude = _mm256_set1_epi16(0x7FFF), zero = _mm256_setzero_si256();
        const ireg magnitude_a = _mm256_and_si256(a, magnitude), magnitude_b = _mm256_and_si256(b, magnitude);
        auto code = [&](ireg words) {
            reg q = div(_mm256_castsi256_ps(words), divisor);
            if (then_by_256) q = mul(q, set1(1.f / 256.f));
            return fp8_biased_code32<codec, is_e4m3, within_scale>(q);
        };
        // Per lane L: a's elements 8L .. 8L + 7, then b's (the codes are at most 0x7E, or above for a
        // NaN, which the packs saturate to 0xFF; with the bias they are below 0x7FFF).
        const ireg bias = _mm256_set1_epi16(fp8_code_bias<is_e4m3>);
        auto codes16 = [&](ireg magnitudes) {
            return _mm256_sub_epi16(_mm256_packs_epi32(code(_mm256_unpacklo_epi16(zero, magnitudes)),
                                                       code(_mm256_unpackhi_epi16(zero, magnitudes))),
                                    bias);
        };
        const ireg codes = _mm256_packus_epi16(codes16(magnitude_a), codes16(magnitude_b));
        const ireg magnitudes = within_scale ? codes : _mm256_min_epu8(codes, set1_byte(F::nan_code));
        return with_signs_in_order(magnitudes, a, b);
    }
    /// 32 codes' magnitudes as packed from the 16-value loads a and b (per 128-bit lane: a's 8, then
    /// b's) with the words' signs, in the words' order. Signed saturation leaves each word's sign in
    /// bit 7 of its byte, in the same order as the magnitudes; one 64-bit permute restores the words'.
    static ireg with_signs_in_order(ireg magnitudes, ireg a, ireg b) {
        const ireg signs = _mm256_and_si256(_mm256_packs_epi16(a, b), set1_byte(0x80));
        return _mm256_permute4x64_epi64(_mm256_or_si256(magnitudes, signs), 0xD8);
    }
    // The amax of a bf16 or f16 row on its bits, the widest loads first.
    static float amax_16bit(const void *src, data_type dt, dim n) {
        return amax_16bit_by<avx2_f32, __m256i>(src, dt, n);
    }
    /// One row's plan for fp8_codes32_by_thresholds (see fp8_threshold_bounds), in each 128-bit lane,
    /// indexed by a mantissa's group m >> 3: the code of the group's first mantissa (8 (m >> 3)) less
    /// 2^mantissa_bits (128 + es) (mod 256); the threshold less one that a later mantissa of the
    /// group may pass (at most one does: they lie at least 7 apart), else 127. In every byte the
    /// lowest exponent field whose whole binade codes normally, and the highest whose codes stay
    /// below 256 before the clamp (rows not known within their scale); whether the row may take it.
    template <bool is_e4m3> struct fp8_thresholds {
        ireg first_code, next_above, lowest_exponent, highest_exponent;
        bool usable;
    };
    /// Whether fp8_threshold_table holds the thresholds of `scale` (for the tests).
    template <bool is_e4m3> static bool fp8_threshold_table_holds(float scale) {
        uint32_t bits;
        std::memcpy(&bits, &scale, sizeof bits);
        return fp8_threshold_table_of<is_e4m3>.holds(bits & 0x007FFFFF);
    }
    static constexpr bool has_threshold_encoder = true;
    template <bool is_e4m3> static void fp8_threshold_plan(float scale, fp8_thresholds<is_e4m3> &plan) {
        using F = fp8_format<is_e4m3>;
        constexpr auto &table = fp8_threshold_table_of<is_e4m3>;
        uint32_t bits;
        std::memcpy(&bits, &scale, sizeof bits);
        const int es = static_cast<int>(bits >> 23 & 0xFF) - 127;
        const uint32_t fraction = bits & 0x007FFFFF, slot = table.slot(fraction);
        auto row = [&](const int8_t *bytes) {
            return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(bytes)));
        };
        const int code_of_one = F::exponent_bias << F::mantissa_bits, steps = 1 << F::mantissa_bits;
        const ireg constant = set1_byte((code_of_one - steps * (128 + es)) & 0xFF);
        if (table.holds(fraction)) {
            plan.first_code = _mm256_add_epi8(row(table.crossed[slot]), constant);
            plan.next_above = row(table.next_above[slot]);
        } else {
            int8_t crossed[16], next_above[16];
            fp8_threshold_groups_of<is_e4m3>(fraction, crossed, next_above);
            plan.first_code = _mm256_add_epi8(row(crossed), constant);
            plan.next_above = row(next_above);
        }
        plan.lowest_exponent = set1_byte(std::max(1, 129 - F::exponent_bias + es));
        // Codes up to 255 (the bounds crossed: at most 2 x steps) before the clamp at the largest
        const int highest = 128 + es + (255 - code_of_one - 2 * steps) / steps;
        plan.highest_exponent = set1_byte(std::min(254, highest));
        // (scales whose 2^8 multiple overflows take the division path, which divides by themselves)
        plan.usable = es >= -126 + F::exponent_bias + F::mantissa_bits && scale * 256.f <= FLT_MAX;
    }
    /// The FP8 codes of 32 bf16 values at p by their row's plan into dst; correct if every value is
    /// 0, a bf16 subnormal or at least the plan's lowest exponent, which the returned bytes say
    /// (all zero). Checked once a row rather than per 32: the division path then redoes the row.
    /// Values not known to be within their scale (`within_scale` false) are clamped at the largest
    /// code, and must also be at most the plan's highest exponent (NaN and infinity are not).
    template <bool is_e4m3, bool within_scale = true>
    static ireg fp8_codes32_by_thresholds(const char *p, const fp8_thresholds<is_e4m3> &plan, char *dst) {
        constexpr int mantissa_bits = fp8_format<is_e4m3>::mantissa_bits;
        const ireg a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)),
                   b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + 32));
        const ireg mantissa = _mm256_set1_epi16(0x7F), magnitude = _mm256_set1_epi16(0x7FFF);
        // Bytes, per 128-bit lane L: a's words 8L .. 8L + 7, then b's (as fp8_codes32_bf16's codes)
        const ireg mantissas =
                _mm256_packus_epi16(_mm256_and_si256(a, mantissa), _mm256_and_si256(b, mantissa));
        const ireg exponents = _mm256_packus_epi16(_mm256_srli_epi16(_mm256_and_si256(a, magnitude), 7),
                                                   _mm256_srli_epi16(_mm256_and_si256(b, magnitude), 7));
        const ireg tiny = _mm256_cmpeq_epi8(exponents, _mm256_setzero_si256()); // zeros, subnormals
        ireg scaled = exponents; // times 2^mantissa_bits, mod 256
        for (int k = 0; k < mantissa_bits; ++k)
            scaled = _mm256_add_epi8(scaled, scaled);
        const ireg group = _mm256_and_si256(_mm256_srli_epi16(mantissas, 3), set1_byte(0x0F));
        ireg codes =
                _mm256_sub_epi8(_mm256_add_epi8(scaled, _mm256_shuffle_epi8(plan.first_code, group)),
                                _mm256_cmpgt_epi8(mantissas, _mm256_shuffle_epi8(plan.next_above, group)));
        ireg outside = _mm256_subs_epu8(plan.lowest_exponent, _mm256_max_epu8(exponents, tiny)); // below it
        if constexpr (!within_scale) {
            codes = _mm256_min_epu8(codes, set1_byte(fp8_format<is_e4m3>::largest_code));
            outside = _mm256_or_si256(outside, _mm256_subs_epu8(exponents, plan.highest_exponent));
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst),
                            with_signs_in_order(_mm256_andnot_si256(tiny, codes), a, b));
        return outside;
    }
    static constexpr bool signs_from_16bit = false; // no mask registers: signs from the quotients
    /// amax_16bit of 16 rows `stride` bytes apart into out[16]; whether all their values are
    /// finite. Each word's magnitude is the larger of its signed maximum (from 0: the positive
    /// words') and its unsigned one without the sign (the negative words' largest magnitude, or
    /// else the positive maximum again): 2 maxima per vector instead of a mask, a key and 2 maxima.
    /// The rows' horizontal maxima are then taken together, in a tree of 128-bit, 64-bit, 32-bit
    /// and 16-bit steps that halves the words per row and doubles the rows per register at each
    /// (~3 operations a row instead of ~14). A non-finite value shows as a magnitude at or above
    /// infinity's; such a group (rare) is redone row by row, where the keys leave them out.
    static bool amax_16bit_rows(const char *src, dim stride, data_type dt, dim n, float *out) {
        __m256i m[16];
        const __m256i magnitude = _mm256_set1_epi16(0x7FFF);
        for (int j = 0; j < 16; ++j) {
            const auto *in = reinterpret_cast<const uint16_t *>(src + j * stride);
            __m256i positive = _mm256_setzero_si256(), unsigned_max = _mm256_setzero_si256();
            auto take = [&](__m256i x) {
                positive = _mm256_max_epi16(positive, x);
                unsigned_max = _mm256_max_epu16(unsigned_max, x);
            };
            dim i = 0;
#pragma GCC unroll 4
            for (; i + 16 <= n; i += 16)
                take(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(in + i)));
            if (i < n) // 8 words left (n a multiple of 8), the upper half zeros (|x| = 0)
                take(_mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(in + i))));
            m[j] = _mm256_max_epi16(positive, _mm256_and_si256(unsigned_max, magnitude));
        }
        for (int j = 0; j < 8; ++j) // lane L: row 2j + L's 8 words
            m[j] = _mm256_max_epi16(_mm256_permute2x128_si256(m[2 * j], m[2 * j + 1], 0x20),
                                    _mm256_permute2x128_si256(m[2 * j], m[2 * j + 1], 0x31));
        for (int j = 0; j < 4; ++j) // lane L: rows 4j + L, 4j + 2 + L, 4 words each
            m[j] = _mm256_max_epi16(_mm256_unpacklo_epi64(m[2 * j], m[2 * j + 1]),
                                    _mm256_unpackhi_epi64(m[2 * j], m[2 * j + 1]));
        alignas(32) uint32_t units[16]; // row 8j + 2k + L in unit 8j + 4L + k, its maximum in the low word
        for (int j = 0; j < 2; ++j) {   // lane L: rows 8j + L, + 2, + 4, + 6, 2 words each
            const __m256 a = _mm256_castsi256_ps(m[2 * j]), b = _mm256_castsi256_ps(m[2 * j + 1]);
            const __m256i w =
                    _mm256_max_epi16(_mm256_castps_si256(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))),
                                     _mm256_castps_si256(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))));
            _mm256_store_si256(reinterpret_cast<__m256i *>(units + 8 * j),
                               _mm256_max_epi16(w, _mm256_srli_epi32(w, 16)));
        }
        const uint32_t infinity = dt == data_type::bf16 ? 0x7F80 : 0x7C00;
        bool finite = true;
        for (int u = 0; u < 16; ++u) {
            const uint32_t bits = units[u] & 0xFFFF;
            finite = finite && bits < infinity;
            const int row = u / 8 * 8 + 2 * (u % 4) + u % 8 / 4;
            out[row] = bits_16bit_to_f32<avx2_f32>(static_cast<uint16_t>(bits), dt);
        }
        if (finite) return true;
        for (int j = 0; j < 16; ++j)
            out[j] = amax_16bit(src + j * stride, dt, n);
        return false;
    }
    // The low 16 bits of each lane (values in [0, 65535]), as 8 packed 16-bit values.
    static __m128i narrow16(ireg x) {
        return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    }
    static void store_bf16(void *dst, reg x) {
        const ireg b = bits(x);
        const ireg lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), set1i(1));
        const ireg rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, set1i(0x7FFF)), lsb), 16);
        const ireg quiet = _mm256_or_si256(_mm256_srli_epi32(b, 16), set1i(0x40));
        const ireg nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, set1i(0x7FFFFFFF)), set1i(0x7F800000));
        _mm_storeu_si128(static_cast<__m128i *>(dst), narrow16(select(nan, quiet, rounded)));
    }
    static void store_f16(void *dst, reg x) {
        _mm_storeu_si128(static_cast<__m128i *>(dst),
                         _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    static void store_f32(void *dst, reg x) {
        const ireg b = bits(x);
        const ireg nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, set1i(0x7FFFFFFF)), set1i(0x7F800000));
        _mm256_storeu_si256(static_cast<__m256i *>(dst),
                            select(nan, _mm256_or_si256(b, set1i(0x00400000)), b));
    }
};
#endif

/// FP8 codes of x[i] / scale for n values (n a multiple of C::width; `load(i)`: x[i ..] as f32),
/// 32 at a time by C::fp8_codes32, the last 8 to 24 through zero vectors and a buffer.
/// `words16`: the input again when it is bf16 or f16 (else null), whose top bits give the signs
/// where the codec can take them (C::signs_from_16bit); bf16 words (`known`) it encodes from the
/// words themselves (C::fp8_codes32_bf16).
template <typename C, bool is_e4m3, bool then_by_256, words_known known, typename Load>
__attribute__((always_inline)) inline void encode_fp8_divided(Load load, dim n, typename C::reg divisor,
                                                              char *dst, const char *words16) {
    using reg = typename C::reg;
    auto quotient = [&](dim i) {
        const reg q = C::div(load(i), divisor);
        return then_by_256 ? C::mul(q, C::set1(1.f / 256.f)) : q;
    };
    dim i = 0;
    if constexpr (known != words_known::any)
        if (words16)
            for (; i + 32 <= n; i += 32)
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst + i),
                                    C::template fp8_codes32_bf16<is_e4m3, then_by_256,
                                                                 known == words_known::bf16_within_scale>(
                                            words16 + 2 * i, divisor));
    if constexpr (C::signs_from_16bit)
        if (words16)
            for (; i + 32 <= n; i += 32)
                _mm256_storeu_si256(
                        reinterpret_cast<__m256i *>(dst + i),
                        C::template fp8_codes32<is_e4m3>([&](dim k) { return quotient(i + k * C::width); },
                                                         C::signs_16bit(words16 + 2 * i)));
    constexpr bool within = known == words_known::bf16_within_scale;
    for (; i + 32 <= n; i += 32)
        _mm256_storeu_si256(
                reinterpret_cast<__m256i *>(dst + i),
                C::template fp8_codes32<is_e4m3, within>([&](dim k) { return quotient(i + k * C::width); }));
    if (i == n) return;
    alignas(32) unsigned char codes[32];
    _mm256_store_si256(reinterpret_cast<__m256i *>(codes),
                       C::template fp8_codes32<is_e4m3, within>([&](dim k) {
                           return i + k * C::width < n ? quotient(i + k * C::width) : C::zero();
                       }));
    std::memcpy(dst + i, codes, static_cast<size_t>(n - i));
}

template <typename C, bool is_e4m3, words_known known = words_known::any, typename Load>
__attribute__((always_inline)) inline void encode_fp8_loaded(Load load, dim n, float scale, char *dst,
                                                             const char *words16) {
    // e4m3 divides by scale * 2^8 (exact) to land in the f16 domain of fp8_grid_f16: the quotient
    // is the f32 quotient times 2^-8 wherever an FP8 code depends on it (it is below 2^-118
    // elsewhere). A scale whose 2^8 multiple overflows divides by itself and multiplies after.
    const float shifted = is_e4m3 ? scale * 256.f : scale;
    if (shifted <= FLT_MAX)
        encode_fp8_divided<C, is_e4m3, false, known>(load, n, C::set1(shifted), dst, words16);
    else
        encode_fp8_divided<C, is_e4m3, true, known>(load, n, C::set1(scale), dst, words16);
}

template <words_known known> using known_as = std::integral_constant<words_known, known>;

/// Calls encode(format, load, known) once, with the FP8 format (std::true_type: e4m3), the loader of
/// in_type's values as f32 (`load(row, i)`: row's values from i on) and what is known of their words
/// (bf16 ones `within_scale`: words_known::bf16_within_scale). The one dispatch of the encoders.
template <typename C, typename Encode>
void dispatch_fp8_encoder(data_type in_type, bool is_e4m3, bool within_scale, Encode encode) {
    auto by_input = [&](auto format) {
        switch (in_type) {
            case data_type::bf16: {
                auto load = [](const char *row, dim i) { return C::load_bf16(row + 2 * i); };
                within_scale ? encode(format, load, known_as<words_known::bf16_within_scale>())
                             : encode(format, load, known_as<words_known::bf16>());
                break;
            }
            case data_type::f16:
                encode(
                        format, [](const char *row, dim i) { return C::load_f16(row + 2 * i); },
                        known_as<words_known::any>());
                break;
            default:
                encode(
                        format,
                        [](const char *row, dim i) {
                            return C::load(reinterpret_cast<const float *>(row) + i);
                        },
                        known_as<words_known::any>());
                break;
        }
    };
    is_e4m3 ? by_input(std::true_type()) : by_input(std::false_type());
}

/// The FP8 codes of n values of type in_type (f32, bf16, f16) x[i] / scale.
template <typename C>
void encode_fp8(const void *src, data_type in_type, dim n, float scale, bool is_e4m3, void *dst) {
    const auto *in = static_cast<const char *>(src);
    const char *words16 = in_type == data_type::f32 ? nullptr : in;
    dispatch_fp8_encoder<C>(in_type, is_e4m3, false, [&](auto format, auto load, auto known) {
        encode_fp8_loaded<C, decltype(format)::value, decltype(known)::value>(
                [&](dim i) { return load(in, i); }, n, scale, static_cast<char *>(dst), words16);
    });
}

/// Prefetches the `bytes` bytes of an input row. The next group's rows are prefetched a row per row
/// encoded rather than all at once: a burst of 64 lines found the core's miss buffers full and
/// waited, so that memory idled while the group was encoded (2 threads from DRAM, e4m3: 1.21-1.32 ->
/// 0.97-1.01 ms, 4 alternating runs).
inline void prefetch_row(const char *row, dim bytes) {
    for (dim byte = 0; byte < bytes; byte += 64)
        _mm_prefetch(row + byte, _MM_HINT_T0);
}

/// One bf16 row's codes (n a multiple of 32) by the threshold encoder with its scale's plan (see
/// fp8_threshold_bounds), 32 at a time; a row holding a value the plan cannot take, or whose plan
/// is not usable, by the division path (encode_fp8_loaded). `within_scale`: a finite row with a
/// per-token scale (words_known::bf16_within_scale), else any bf16 words (words_known::bf16).
template <typename C, bool is_e4m3, bool within_scale>
__attribute__((always_inline)) inline void
encode_bf16_row_by_plan(const char *in, dim n, float scale,
                        const typename C::template fp8_thresholds<is_e4m3> &plan, char *out) {
    constexpr words_known known = within_scale ? words_known::bf16_within_scale : words_known::bf16;
    auto by_division = [&] {
        encode_fp8_loaded<C, is_e4m3, known>([&](dim i) { return C::load_bf16(in + 2 * i); }, n, scale, out,
                                             in);
    };
    if (!plan.usable) {
        by_division();
        return;
    }
    __m256i outside = _mm256_setzero_si256();
    for (dim i = 0; i < n; i += 32)
        outside = _mm256_or_si256(outside, C::template fp8_codes32_by_thresholds<is_e4m3, within_scale>(
                                                   in + 2 * i, plan, out + i));
    if (!_mm256_testz_si256(outside, outside)) by_division();
}

/// encode_rows_fp8 of 16 bf16 rows (n a multiple of 32) by the threshold encoder: the rows' plans
/// first, independent of each other (a row whose scale is its predecessor's, as in a group with a
/// per-tensor or per-head scale, shares its plan), then each row by encode_bf16_row_by_plan.
template <typename C, bool is_e4m3, bool within_scale>
void encode_bf16_rows_by_thresholds(const char *src, dim stride, dim n, const float *scales, char *dst,
                                    dim dst_stride, const char *next) {
    typename C::template fp8_thresholds<is_e4m3> plans[packed_group];
    for (dim j = 0; j < packed_group; ++j)
        if (j > 0 && !within_scale && scales[j] == scales[j - 1])
            plans[j] = plans[j - 1];
        else
            C::fp8_threshold_plan(scales[j], plans[j]);
    for (dim j = 0; j < packed_group; ++j) {
        if (next) prefetch_row(next + j * stride, 2 * n);
        encode_bf16_row_by_plan<C, is_e4m3, within_scale>(src + j * stride, n, scales[j], plans[j],
                                                          dst + j * dst_stride);
    }
}

/// encode_fp8 of 16 rows of bf16 or f16 values, `stride` bytes apart, each by its scale, into rows of
/// n codes `dst_stride` bytes apart from dst on: one dispatch for the group and one loop over its
/// rows. `within_scale`: the rows are finite and their scales per-token ones (words_known). `next`:
/// rows (the same stride) of a group encoded soon, prefetched a row per row encoded (or null).
template <typename C>
void encode_rows_fp8(const char *src, dim stride, data_type in_type, dim n, const float *scales, bool is_e4m3,
                     bool within_scale, char *dst, dim dst_stride, const char *next) {
    if constexpr (C::has_threshold_encoder)
        if (in_type == data_type::bf16 && n % 32 == 0) {
            auto encode = [&](auto format) {
                constexpr bool e4m3 = decltype(format)::value;
                within_scale ? encode_bf16_rows_by_thresholds<C, e4m3, true>(src, stride, n, scales, dst,
                                                                             dst_stride, next)
                             : encode_bf16_rows_by_thresholds<C, e4m3, false>(src, stride, n, scales, dst,
                                                                              dst_stride, next);
            };
            is_e4m3 ? encode(std::true_type()) : encode(std::false_type());
            return;
        }
    dispatch_fp8_encoder<C>(in_type, is_e4m3, within_scale, [&](auto format, auto load, auto known) {
        for (dim j = 0; j < packed_group; ++j) {
            const char *in = src + j * stride;
            if (next) prefetch_row(next + j * stride, 2 * n);
            encode_fp8_loaded<C, decltype(format)::value, decltype(known)::value>(
                    [&](dim i) { return load(in, i); }, n, scales[j], dst + j * dst_stride,
                    in_type == data_type::f32 ? nullptr : in);
        }
    });
}

/// encode_fp8 of one row of bf16 or f16 values (a token written alone, as decode steps write them):
/// bf16 rows (n a multiple of 32) whose scale's thresholds fp8_threshold_table holds (per-token
/// scales, powers of two) by the threshold encoder; other scales keep the division, cheaper for one
/// row than making the thresholds.
template <typename C>
void encode_16bit_row_fp8(const char *in, data_type in_type, dim n, float scale, bool is_e4m3, char *dst) {
    if constexpr (C::has_threshold_encoder)
        if (in_type == data_type::bf16 && n % 32 == 0) {
            auto by_table = [&](auto format) {
                constexpr bool e4m3 = decltype(format)::value;
                if (!C::template fp8_threshold_table_holds<e4m3>(scale)) return false;
                typename C::template fp8_thresholds<e4m3> plan;
                C::fp8_threshold_plan(scale, plan);
                encode_bf16_row_by_plan<C, e4m3, false>(in, n, scale, plan, dst);
                return true;
            };
            if (is_e4m3 ? by_table(std::true_type()) : by_table(std::false_type())) return;
        }
    encode_fp8<C>(in, in_type, n, scale, is_e4m3, dst);
}

/// Encodes n values (n a multiple of V::width) into cache type dt: FP8 encodes src / scale, the other
/// types ignore the scale.
template <typename V> void encode_row(const float *src, dim n, float scale, data_type dt, void *dst) {
    using C = codec<V>;
    char *out = static_cast<char *>(dst);
    switch (dt) {
        case data_type::f8_e4m3:
        case data_type::f8_e5m2:
            encode_fp8<C>(src, data_type::f32, n, scale, dt == data_type::f8_e4m3, out);
            break;
        case data_type::bf16:
            for (dim i = 0; i < n; i += V::width)
                C::store_bf16(out + 2 * i, V::load(src + i));
            break;
        case data_type::f16:
            for (dim i = 0; i < n; i += V::width)
                C::store_f16(out + 2 * i, V::load(src + i));
            break;
        case data_type::f32:
            for (dim i = 0; i < n; i += V::width)
                C::store_f32(out + 4 * i, V::load(src + i));
            break;
        default: break;
    }
}

/// encode_row for any n: whole vectors, then the tail through a zero-padded vector (never reading or
/// writing past either row). The entry point of the codec tests.
template <typename V> void encode_row_any(const float *src, int64_t n, float scale, data_type dt, void *dst) {
    const dim whole = n - n % V::width;
    encode_row<V>(src, whole, scale, dt, dst);
    if (whole == n) return;
    alignas(64) float tail[V::width] = {};
    alignas(64) unsigned char bytes[V::width * sizeof(float)];
    std::memcpy(tail, src + whole, static_cast<size_t>(n - whole) * sizeof(float));
    encode_row<V>(tail, V::width, scale, dt, bytes);
    const size_t es = data_type_size(dt);
    std::memcpy(static_cast<char *>(dst) + static_cast<size_t>(whole) * es, bytes,
                static_cast<size_t>(n - whole) * es);
}

/// Converts n input values (f32/bf16/f16) to f32 into dst; returns the largest finite |x| when
/// `want_amax` (else 0).
template <typename V> float load_row(const void *src, data_type dt, dim n, float *dst, bool want_amax) {
    using reg = typename V::reg;
    const char *in = static_cast<const char *>(src);
    reg amax = V::zero();
    auto run = [&](auto load) {
        if (want_amax) {
            for (dim i = 0; i < n; i += V::width) {
                const reg x = load(i);
                V::store(dst + i, x);
                amax = V::max(amax, codec<V>::abs_finite(x));
            }
        } else {
            for (dim i = 0; i < n; i += V::width)
                V::store(dst + i, load(i));
        }
    };
    switch (dt) {
        case data_type::bf16: run([&](dim i) { return V::load_bf16(in + 2 * i); }); break;
        case data_type::f16: run([&](dim i) { return V::load_f16(in + 2 * i); }); break;
        default: run([&](dim i) { return V::load(reinterpret_cast<const float *>(in) + i); }); break;
    }
    return want_amax ? V::reduce_max(amax) : 0.f;
}

// Scatters a token's encoded row (n elements of es bytes) into its packed (block, head) region: K as
// pairs of dims (a pair every 32 elements), V one element per dim (every 2 elements within a group of
// 16 dims). The group starts come from src/cache_layout.hpp; the steps within are its strides.
// Templated on V like everything here, so that no symbol compiled with one ISA's flags is shared
// with (and possibly picked by the linker for) another translation unit.
template <typename V, size_t es>
void scatter_packed(const unsigned char *row, dim n, bool is_value, dim t, dim block_size, char *region) {
    constexpr dim e = static_cast<dim>(es);
    if (!is_value) {
        char *dst = region + packed_k_offset(t, 0, n) * e;
        const dim step = (packed_k_offset(t, 2, n) - packed_k_offset(t, 0, n)) * e;
        for (dim d = 0; d < n; d += 2, dst += step)
            std::memcpy(dst, row + d * e, 2 * es);
        return;
    }
    const dim step = (packed_v_offset(t, 1, block_size) - packed_v_offset(t, 0, block_size)) * e;
    for (dim g = 0; g < n; g += packed_group) {
        char *dst = region + packed_v_offset(t, g, block_size) * e;
        const unsigned char *src = row + g * e;
        for (dim j = 0; j < packed_group; ++j)
            std::memcpy(dst + j * step, src + j * e, es);
    }
}

// A per-token scale: the row's amax over the format's largest finite value (`largest`), at least
// FLT_MIN, as the reference computes it.
inline float token_scale(float amax, float largest) {
    return std::max(amax / largest, FLT_MIN);
}

// The scale of one (token, head) row by the mask; a per-token scale is computed from `amax` and
// written.
inline float row_scale(const reshape_and_cache_problem &p, float amax, bool is_value, float *scales,
                       dim block, dim head, dim offset) {
    const int mask = is_value ? p.v_scales_mask : p.k_scales_mask;
    if (mask == scales_per_token) {
        const float scale = token_scale(amax, fp8_max((is_value ? p.v_cache : p.k_cache).get_data_type()));
        scales[(block * p.kv_heads + head) * p.block_size + offset] = scale;
        return scale;
    }
    if (mask == scales_per_kv_head) return scales[head];
    if (mask == scales_per_tensor) return scales[0];
    return 1.f;
}

// A bf16 row into a bf16 cache, or f16 into f16 (n values, a multiple of 8): the reference's trip
// through f32 changes only NaNs, which it quiets (bf16 | 0x40, f16 | 0x200); the rest is copied, 32
// words per step, rather than converted to f32 and rounded back (a group's K and V rows in cache:
// 38 -> 27 ns per (token, kv head) on x64:avx512, 49 -> 28 on x64:avx2).
template <typename V> void copy_16bit_quieting_nan(const void *src, data_type dt, dim n, void *dst) {
    const auto *in = static_cast<const char *>(src);
    auto *out = static_cast<char *>(dst);
    const short infinity = dt == data_type::bf16 ? 0x7F80 : 0x7C00,
                quiet = dt == data_type::bf16 ? 0x40 : 0x200;
    dim i = 0;
#if defined(__AVX512BW__)
    if constexpr (V::width == 16) {
        const __m512i magnitude = _mm512_set1_epi16(0x7FFF), above = _mm512_set1_epi16(infinity),
                      quiet_bit = _mm512_set1_epi16(quiet);
        for (; i + 32 <= n; i += 32) {
            const __m512i w = _mm512_loadu_si512(in + 2 * i);
            const __mmask32 nan = _mm512_cmpgt_epi16_mask(_mm512_and_si512(w, magnitude), above);
            _mm512_storeu_si512(out + 2 * i, _mm512_mask_blend_epi16(nan, w, _mm512_or_si512(w, quiet_bit)));
        }
    }
#endif
    const __m256i magnitude = _mm256_set1_epi16(0x7FFF), above = _mm256_set1_epi16(infinity),
                  quiet_bit = _mm256_set1_epi16(quiet);
    for (; i < n; i += 16) { // the last step may hold 8 values (n a multiple of 8)
        const bool half = i + 16 > n;
        const __m256i w =
                half ? _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(in + 2 * i)))
                     : _mm256_loadu_si256(reinterpret_cast<const __m256i *>(in + 2 * i));
        const __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(w, magnitude), above);
        const __m256i y = _mm256_or_si256(w, _mm256_and_si256(nan, quiet_bit));
        if (half)
            _mm_storeu_si128(reinterpret_cast<__m128i *>(out + 2 * i), _mm256_castsi256_si128(y));
        else
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + 2 * i), y);
    }
}

// An input row (f32/bf16/f16, n = head size values) encoded into dst in the cache's type, its scale
// found by the mask (a per-token one computed and written). `row`: a buffer for the f32 copy, which
// FP8 caches skip for 16-bit inputs.
template <typename V>
void encode_input_row(const reshape_and_cache_problem &p, const void *in, data_type in_type, bool is_value,
                      float *scales, dim block, dim head, dim offset, float *row, void *dst) {
    using C = codec<V>;
    const data_type dt = (is_value ? p.v_cache : p.k_cache).get_data_type();
    const bool amax = (is_value ? p.v_scales_mask : p.k_scales_mask) == scales_per_token;
    const dim n = p.head_size;
    if (in_type == dt && (dt == data_type::bf16 || dt == data_type::f16)) { // (no scales: not FP8)
        copy_16bit_quieting_nan<V>(in, dt, n, dst);
        return;
    }
    if (is_fp8(dt) && in_type != data_type::f32) {
        const float m = amax ? C::amax_16bit(in, in_type, n) : 0.f;
        encode_16bit_row_fp8<C>(static_cast<const char *>(in), in_type, n,
                                row_scale(p, m, is_value, scales, block, head, offset),
                                dt == data_type::f8_e4m3, static_cast<char *>(dst));
        return;
    }
    const float m = load_row<V>(in, in_type, n, row, amax);
    encode_row<V>(row, n, row_scale(p, m, is_value, scales, block, head, offset), dt, dst);
}

// One (token, head) row of one cache encoded into its slot.
template <typename V>
void store_row(const reshape_and_cache_problem &p, const void *in, data_type in_type, bool is_value,
               void *cache_data, float *scales, dim block, dim head, dim offset, float *row) {
    const tensor_desc &cache = is_value ? p.v_cache : p.k_cache;
    const data_type dt = cache.get_data_type();
    const dim n = p.head_size;
    const cache_view view(cache, is_value);
    const dim es = static_cast<dim>(data_type_size(dt));
    char *base = static_cast<char *>(cache_data);
    if (!view.packed()) {
        encode_input_row<V>(p, in, in_type, is_value, scales, block, head, offset, row,
                            base + view.offset(block, head, offset, 0) * es);
        return;
    }
    alignas(64) unsigned char encoded[max_head_size * sizeof(float)];
    encode_input_row<V>(p, in, in_type, is_value, scales, block, head, offset, row, encoded);
    char *region = base + view.region(block, head) * es;
    switch (es) {
        case 1: scatter_packed<V, 1>(encoded, n, is_value, offset, p.block_size, region); break;
        case 2: scatter_packed<V, 2>(encoded, n, is_value, offset, p.block_size, region); break;
        default: scatter_packed<V, 4>(encoded, n, is_value, offset, p.block_size, region); break;
    }
}

// The stores of whole 16-token groups go around the caches (non-temporal) where 16-byte aligned:
// together they fill whole lines, which a normal store would first read from memory for ownership
// (1 thread, caches flushed: ~12% faster). Each task ends with an sfence, so that they are visible
// when execute returns.
inline void store_streaming(char *dst, __m128i x) {
    if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0)
        _mm_stream_si128(reinterpret_cast<__m128i *>(dst), x);
    else
        _mm_storeu_si128(reinterpret_cast<__m128i *>(dst), x);
}

// The 256-bit stores of whole groups, non-temporal where 32-byte aligned (see store_streaming).
inline void store_streaming_256(char *dst, __m256i x) {
    if ((reinterpret_cast<uintptr_t>(dst) & 31) == 0)
        _mm256_stream_si256(reinterpret_cast<__m256i *>(dst), x);
    else
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst), x);
}

// 32 bytes of the K rows of 16 tokens (rows n elements of es bytes apart, from `rows` on): 16 pairs
// of dims (es 1) or 8 (es 2), written at dst in the packed K order, per pair the 16 tokens' pairs
// (32 or 64 bytes). A 16 x 16 transpose of 16-bit pairs, or two 8 x 8 transposes of 32-bit pairs
// (tokens 0-7 and 8-15), in 256-bit registers, whose stores are whole 32-byte units. The 128-bit
// transposes below store each 32 bytes as two halves from different passes, and the
// write-combining buffers flush partial lines: to memory, one thread on Zen 3 wrote a group of 1-byte
// K rows at ~50 cycles per row that way, ~20 this way.
template <size_t es>
__attribute__((always_inline)) inline void write_packed_k_block_256(const unsigned char *rows, dim n,
                                                                    char *dst) {
    static_assert(es == 1 || es == 2, "16-bit or 32-bit pairs");
    const dim row_bytes = n * static_cast<dim>(es);
    __m256i r[16], t[16];
    for (int j = 0; j < 16; ++j)
        r[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(rows + j * row_bytes));
    if constexpr (es == 1) {              // in each 128-bit lane L, the row's pairs 8L .. 8L + 7
        for (int j = 0; j < 16; j += 2) { // tokens j, j + 1: t[j] pairs 8L + 0 .. 3, t[j + 1] 4 .. 7
            t[j] = _mm256_unpacklo_epi16(r[j], r[j + 1]);
            t[j + 1] = _mm256_unpackhi_epi16(r[j], r[j + 1]);
        }
        for (int m = 0; m < 16; m += 4) // tokens m .. m + 3: r[m + q] pairs 8L + 2q, 8L + 2q + 1
            for (int h = 0; h < 2; ++h) {
                r[m + 2 * h] = _mm256_unpacklo_epi32(t[m + h], t[m + 2 + h]);
                r[m + 2 * h + 1] = _mm256_unpackhi_epi32(t[m + h], t[m + 2 + h]);
            }
        for (int q = 0; q < 4; ++q) // t[k]: tokens 0-7 of pair 8L + k; t[8 + k]: tokens 8-15
            for (int h = 0; h < 2; ++h) {
                t[8 * h + 2 * q] = _mm256_unpacklo_epi64(r[8 * h + q], r[8 * h + 4 + q]);
                t[8 * h + 2 * q + 1] = _mm256_unpackhi_epi64(r[8 * h + q], r[8 * h + 4 + q]);
            }
        for (int k = 0; k < 8; ++k) { // pairs k (the lanes 0) and 8 + k (the lanes 1)
            store_streaming_256(dst + k * 32, _mm256_permute2x128_si256(t[k], t[8 + k], 0x20));
            store_streaming_256(dst + (8 + k) * 32, _mm256_permute2x128_si256(t[k], t[8 + k], 0x31));
        }
    } else { // in each 128-bit lane L, the row's pairs 4L .. 4L + 3; per 8 tokens h .. h + 7:
        for (int h = 0; h < 16; h += 8) {
            for (int j = 0; j < 8;
                 j += 2) { // tokens h + j, + 1: t[h + j] pairs 4L, + 1; t[h + j + 1] + 2, + 3
                t[h + j] = _mm256_unpacklo_epi32(r[h + j], r[h + j + 1]);
                t[h + j + 1] = _mm256_unpackhi_epi32(r[h + j], r[h + j + 1]);
            }
            for (int j = 0; j < 8; j += 4) // tokens h + j .. h + j + 3: r[h + j + q] pair 4L + q
                for (int i = 0; i < 2; ++i) {
                    r[h + j + 2 * i] = _mm256_unpacklo_epi64(t[h + j + i], t[h + j + 2 + i]);
                    r[h + j + 2 * i + 1] = _mm256_unpackhi_epi64(t[h + j + i], t[h + j + 2 + i]);
                }
        }
        for (int q = 0; q < 4; ++q) // pairs q (the lanes 0) and 4 + q (the lanes 1): tokens 0-7, 8-15
            for (int h = 0; h < 16; h += 8) {
                store_streaming_256(dst + q * 64 + h * 4,
                                    _mm256_permute2x128_si256(r[h + q], r[h + 4 + q], 0x20));
                store_streaming_256(dst + (4 + q) * 64 + h * 4,
                                    _mm256_permute2x128_si256(r[h + q], r[h + 4 + q], 0x31));
            }
    }
}

#if defined(__AVX512BW__)
// The 512-bit stores of whole groups, non-temporal where 64-byte aligned (see store_streaming).
inline void store_streaming_512(char *dst, __m512i x) {
    if ((reinterpret_cast<uintptr_t>(dst) & 63) == 0)
        _mm512_stream_si512(reinterpret_cast<__m512i *>(dst), x);
    else
        _mm512_storeu_si512(dst, x);
}

// Transposes the 128-bit lanes of a, b, c, d: lane L of the results holds a, b, c, d's lanes L.
inline void transpose_lanes(__m512i &a, __m512i &b, __m512i &c, __m512i &d) {
    const __m512i ab01 = _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                  cd01 = _mm512_shuffle_i64x2(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                  ab23 = _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 2, 3, 2)),
                  cd23 = _mm512_shuffle_i64x2(c, d, _MM_SHUFFLE(3, 2, 3, 2));
    a = _mm512_shuffle_i64x2(ab01, cd01, _MM_SHUFFLE(2, 0, 2, 0));
    b = _mm512_shuffle_i64x2(ab01, cd01, _MM_SHUFFLE(3, 1, 3, 1));
    c = _mm512_shuffle_i64x2(ab23, cd23, _MM_SHUFFLE(2, 0, 2, 0));
    d = _mm512_shuffle_i64x2(ab23, cd23, _MM_SHUFFLE(3, 1, 3, 1));
}

// 32 pairs of 1-byte K codes of 16 tokens (rows n bytes apart, from `rows` on) in the packed K order
// at dst (1 KiB: per pair the 16 tokens' pairs): a 16 x 32 transpose of 16-bit pairs in 512-bit
// registers. Three rounds of unpacks leave, in each 128-bit lane L of register r[h][k], the 8
// tokens 8h .. 8h + 7 of pair 8L + k; 4 x 4 lane transposes then gather each stored register's
// pairs 2m, 2m + 1 (~3.8 instructions per 16 codes with the stores, against ~7.5 for 128-bit
// transposes).
template <typename V> void write_packed_k_32_pairs(const unsigned char *rows, dim n, char *dst) {
    __m512i x[16], y[16];
    for (int j = 0; j < 16; ++j)
        x[j] = _mm512_loadu_si512(rows + j * n);
    for (int i = 0; i < 8; ++i) { // tokens 2i, 2i + 1: pairs 4L .. of lane L in 32-bit units
        y[2 * i] = _mm512_unpacklo_epi16(x[2 * i], x[2 * i + 1]);     // pairs 8L + 0 .. 3
        y[2 * i + 1] = _mm512_unpackhi_epi16(x[2 * i], x[2 * i + 1]); // pairs 8L + 4 .. 7
    }
    for (int m = 0; m < 4; ++m) // tokens 4m .. 4m + 3 in 64-bit units
        for (int half = 0; half < 2; ++half) {
            const __m512i a = y[4 * m + half], b = y[4 * m + 2 + half];
            x[4 * m + 2 * half] = _mm512_unpacklo_epi32(a, b);     // pairs 8L + 4 half + 0, 1
            x[4 * m + 2 * half + 1] = _mm512_unpackhi_epi32(a, b); // pairs 8L + 4 half + 2, 3
        }
    // r[h][k] = y[8h + k]: tokens 8h .. 8h + 7 of pair 8L + k, one 128-bit unit per lane.
    for (int h = 0; h < 2; ++h)
        for (int q = 0; q < 4; ++q) { // x[8h + q] (quad 2h) with x[8h + 4 + q] (quad 2h + 1)
            const __m512i a = x[8 * h + q], b = x[8 * h + 4 + q];
            y[8 * h + 2 * q] = _mm512_unpacklo_epi64(a, b);
            y[8 * h + 2 * q + 1] = _mm512_unpackhi_epi64(a, b);
        }
    for (int k = 0; k < 8; k += 2) { // stored register 4L + k / 2: pairs 8L + k, 8L + k + 1
        __m512i a = y[k], b = y[8 + k], c = y[k + 1], d = y[8 + k + 1];
        transpose_lanes(a, b, c, d);
        const __m512i out[4] = { a, b, c, d };
        for (int lane = 0; lane < 4; ++lane)
            store_streaming_512(dst + (4 * lane + k / 2) * 64, out[lane]);
    }
}

// 64 dims of 1-byte V codes of 16 tokens (rows n bytes apart, from `rows` on) in the packed V order:
// group k (dims 16k .. 16k + 15) to group_dst(k), 256 bytes of 8 token pairs, 32 each. Unpacking two
// tokens' rows interleaves them per 128-bit lane, i.e. per group of 16 dims; a 4 x 4 lane transpose
// of two such pairs puts each group's 64 bytes in one register.
template <typename V, typename Destination>
void write_packed_v_64_dims(const unsigned char *rows, dim n, Destination group_dst) {
    char *dst[4];
    for (int k = 0; k < 4; ++k)
        dst[k] = group_dst(k);
    for (int j = 0; j < 16; j += 4) {
        const __m512i r0 = _mm512_loadu_si512(rows + j * n), r1 = _mm512_loadu_si512(rows + (j + 1) * n),
                      r2 = _mm512_loadu_si512(rows + (j + 2) * n),
                      r3 = _mm512_loadu_si512(rows + (j + 3) * n);
        __m512i a = _mm512_unpacklo_epi8(r0, r1), b = _mm512_unpackhi_epi8(r0, r1),
                c = _mm512_unpacklo_epi8(r2, r3), d = _mm512_unpackhi_epi8(r2, r3);
        transpose_lanes(a, b, c, d);
        store_streaming_512(dst[0] + j * 16, a);
        store_streaming_512(dst[1] + j * 16, b);
        store_streaming_512(dst[2] + j * 16, c);
        store_streaming_512(dst[3] + j * 16, d);
    }
}
#endif

// Two tokens' 32 bytes (a, b) interleaved by elements of es bytes: a[0], b[0], a[1], b[1], ... of
// their first 16 bytes to `first`, of their second 16 bytes to `second` (32 bytes each). 256-bit
// loads and whole 32-byte stores: the 128-bit version took twice the loads and stores (to memory, one
// thread on Zen 3 wrote a group of 1-byte V rows at ~20 cycles per row with it, ~15 this way).
template <size_t es>
__attribute__((always_inline)) inline void interleave_32_bytes(const unsigned char *a, const unsigned char *b,
                                                               char *first, char *second) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(a));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b));
    __m256i low, high; // per 128-bit lane: the interleave of the lane's first 8 bytes, its last 8
    if constexpr (es == 1)
        low = _mm256_unpacklo_epi8(x, y), high = _mm256_unpackhi_epi8(x, y);
    else if constexpr (es == 2)
        low = _mm256_unpacklo_epi16(x, y), high = _mm256_unpackhi_epi16(x, y);
    else
        low = _mm256_unpacklo_epi32(x, y), high = _mm256_unpackhi_epi32(x, y);
    store_streaming_256(first, _mm256_permute2x128_si256(low, high, 0x20));
    store_streaming_256(second, _mm256_permute2x128_si256(low, high, 0x31));
}

// dst (32 elements of es bytes) = a[0], b[0], a[1], b[1], ... of 16 elements each: two tokens' values
// of one group of 16 dims, in the packed V order.
template <typename V, size_t es>
void interleave_16(const unsigned char *a, const unsigned char *b, char *dst) {
    if constexpr (es == 1) { // 16 bytes each (the 32-byte steps take two groups: write_packed_group)
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i *>(a));
        const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b));
        store_streaming(dst, _mm_unpacklo_epi8(x, y));
        store_streaming(dst + 16, _mm_unpackhi_epi8(x, y));
    } else {
        for (size_t c = 0; c < es / 2; ++c) // 32-byte chunks: 32 / es elements of each
            interleave_32_bytes<es>(a + 32 * c, b + 32 * c, dst + 64 * c, dst + 64 * c + 32);
    }
}

// Transposes r[0..side-1] as a side x side matrix of elements of 16 / side bytes (8 x 8 of 16 bits,
// 4 x 4 of 32): three, then two rounds of unpacks.
template <int side> __attribute__((always_inline)) inline void transpose_square(__m128i *r) {
    static_assert(side == 8 || side == 4, "8 x 8 of 16-bit or 4 x 4 of 32-bit elements");
    __m128i t[side];
    if constexpr (side == 8) {
        for (int i = 0; i < 8; i += 2) {
            t[i] = _mm_unpacklo_epi16(r[i], r[i + 1]);
            t[i + 1] = _mm_unpackhi_epi16(r[i], r[i + 1]);
        }
        // t[0], t[2]: columns 0-3 of rows 0-1 and 2-3, as 32-bit pairs; t[1], t[3]: columns 4-7.
        for (int half = 0; half < 8; half += 4)
            for (int i = 0; i < 2; ++i) {
                r[half + 2 * i] = _mm_unpacklo_epi32(t[half + i], t[half + i + 2]);
                r[half + 2 * i + 1] = _mm_unpackhi_epi32(t[half + i], t[half + i + 2]);
            }
        // r[0..3]: columns (0,1), (2,3), (4,5), (6,7) of rows 0-3; r[4..7]: of rows 4-7.
        for (int i = 0; i < 4; ++i) {
            t[2 * i] = _mm_unpacklo_epi64(r[i], r[i + 4]);
            t[2 * i + 1] = _mm_unpackhi_epi64(r[i], r[i + 4]);
        }
    } else {
        const __m128i a = _mm_unpacklo_epi32(r[0], r[1]), b = _mm_unpackhi_epi32(r[0], r[1]);
        const __m128i c = _mm_unpacklo_epi32(r[2], r[3]), d = _mm_unpackhi_epi32(r[2], r[3]);
        t[0] = _mm_unpacklo_epi64(a, c), t[1] = _mm_unpackhi_epi64(a, c);
        t[2] = _mm_unpacklo_epi64(b, d), t[3] = _mm_unpackhi_epi64(b, d);
    }
    for (int i = 0; i < side; ++i)
        r[i] = t[i];
}

// The K rows of 16 tokens (side by side, n elements each) in the packed K order from dst on: per pair
// of dims, the 16 tokens' pairs. A transpose of 16 x n / 2 pairs, in square blocks of 16-byte
// registers for 1- and 2-byte elements; pairs left over (and 4-byte elements) are copied one by one.
template <typename V, size_t es> void write_packed_k_group(const unsigned char *rows, dim n, char *dst) {
    constexpr dim e = static_cast<dim>(es), pair_bytes = 2 * e;
    constexpr int side = es <= 2 ? static_cast<int>(16 / pair_bytes) : 1; // pairs per register
    dim p0 = 0;
#if defined(__AVX512BW__)
    if constexpr (es == 1 && V::width == 16)
        for (; p0 + 32 <= n / 2; p0 += 32)
            write_packed_k_32_pairs<V>(rows + 2 * p0, n, dst + p0 * packed_group * pair_bytes);
#endif
    if constexpr (side > 1) {
        constexpr dim block_pairs = 32 / pair_bytes; // (write_packed_k_block_256)
        for (; p0 + block_pairs <= n / 2; p0 += block_pairs)
            write_packed_k_block_256<es>(rows + p0 * pair_bytes, n, dst + p0 * packed_group * pair_bytes);
        for (; p0 + side <= n / 2; p0 += side)
            for (dim j0 = 0; j0 < packed_group; j0 += side) {
                __m128i r[side];
                for (int i = 0; i < side; ++i)
                    r[i] = _mm_loadu_si128(
                            reinterpret_cast<const __m128i *>(rows + ((j0 + i) * n + 2 * p0) * e));
                transpose_square<side>(r);
                for (int k = 0; k < side; ++k)
                    store_streaming(dst + ((p0 + k) * packed_group + j0) * pair_bytes, r[k]);
            }
    }
    for (; p0 < n / 2; ++p0)
        for (dim j = 0; j < packed_group; ++j)
            std::memcpy(dst + (p0 * packed_group + j) * pair_bytes, rows + (j * n + 2 * p0) * e, 2 * es);
}

// The encoded rows of 16 tokens (side by side, n elements each) whose slots are one whole 16-token
// group of a block, written in the packed order: the stores walk through the group's bytes in
// address order (K: one region of 16 x n; V: one run of 16 x 16 per group of 16 dims).
template <typename V, size_t es>
void write_packed_group(const unsigned char *rows, dim n, bool is_value, dim offset0, dim block_size,
                        char *region) {
    constexpr dim e = static_cast<dim>(es);
    if (!is_value) {
        write_packed_k_group<V, es>(rows, n, region + packed_k_offset(offset0, 0, n) * e);
        return;
    }
    dim g = 0;
#if defined(__AVX512BW__)
    if constexpr (es == 1 && V::width == 16)
        for (; g + 64 <= n; g += 64)
            write_packed_v_64_dims<V>(rows + g, n, [&](dim k) {
                return region + packed_v_offset(offset0, g + k * packed_group, block_size);
            });
#endif
    if constexpr (es == 1)
        for (; g + 2 * packed_group <= n; g += 2 * packed_group) { // two groups of 16 dims at once
            char *first = region + packed_v_offset(offset0, g, block_size),
                 *second = region + packed_v_offset(offset0, g + packed_group, block_size);
            for (dim j = 0; j < packed_group; j += 2, first += 32, second += 32)
                interleave_32_bytes<1>(rows + j * n + g, rows + (j + 1) * n + g, first, second);
        }
    for (; g < n; g += packed_group) {
        char *dst = region + packed_v_offset(offset0, g, block_size) * e;
        for (dim j = 0; j < packed_group; j += 2, dst += 32 * e)
            interleave_16<V, es>(rows + (j * n + g) * e, rows + ((j + 1) * n + g) * e, dst);
    }
}

// 16 tokens whose slots are 16 consecutive ones of a block (of a packed cache: one whole 16-token
// group): each row encoded (its scale found on the way) into `rows`, then the group written at once
// in the packed order; or, in a plain cache, straight into the 16 slots' rows.
// `next_t0`, `next_head`: a group the caller stores soon from this input (K or V), whose rows are
// prefetched while this one encodes, one per row encoded (next_t0 < 0: none). Without it the first
// pass over each row (the amax) waited for memory: one thread read ~10 GB/s.
template <typename V>
void store_group(const reshape_and_cache_problem &p, const reshape_and_cache_arguments &a, dim t0, dim head,
                 bool is_value, dim block, dim offset0, float *row, unsigned char *rows, dim next_t0,
                 dim next_head) {
    const tensor_desc &cache = is_value ? p.v_cache : p.k_cache;
    const data_type dt = cache.get_data_type(), in_type = is_value ? p.value_type : p.key_type;
    const dim n = p.head_size, es = static_cast<dim>(data_type_size(dt));
    const dim in_es = static_cast<dim>(data_type_size(in_type));
    const dim token_stride = is_value ? a.value_token_stride : a.key_token_stride;
    const dim head_stride = is_value ? a.value_head_stride : a.key_head_stride;
    const char *in = static_cast<const char *>(is_value ? a.value : a.key);
    float *scales = is_value ? a.v_scales : a.k_scales;
    auto input_row = [&](dim j) { return in + ((t0 + j) * token_stride + head * head_stride) * in_es; };
    const char *next =
            next_t0 >= 0 ? in + (next_t0 * token_stride + next_head * head_stride) * in_es : nullptr;
    const cache_view view(cache, is_value);
    char *base = static_cast<char *>(is_value ? a.v_cache : a.k_cache);
    // Where the rows are encoded: `rows` (packed), or the plain cache's rows of the slots.
    char *dst =
            view.packed() ? reinterpret_cast<char *>(rows) : base + view.offset(block, head, offset0, 0) * es;
    const dim dst_stride = (view.packed() ? n : view.token_stride()) * es;
    if (is_fp8(dt) && in_type != data_type::f32) {
        // 16-bit rows to FP8 in three passes over the group, amaxes, scales, codes, rather than row
        // by row: each row's chain (amax reduction, scale division, encoding) is long and serial,
        // and one row of it left the core mostly idle (~175 cycles per row, ~100 in passes).
        const bool per_token = (is_value ? p.v_scales_mask : p.k_scales_mask) == scales_per_token;
        float row_scales[packed_group] = {};
        bool within_scale = false;
        if (per_token) {
            // row_scale's per-token scales of the 16 rows at once (they are contiguous).
            within_scale =
                    codec<V>::amax_16bit_rows(input_row(0), token_stride * in_es, in_type, n, row_scales);
            float *group_scales = scales + (block * p.kv_heads + head) * p.block_size + offset0;
            // token_scale in vectors (a division per lane is the scalar one's, bit for bit).
            using reg = typename V::reg;
            const reg largest = V::set1(fp8_max(dt)), smallest = V::set1(FLT_MIN);
            for (dim j = 0; j < packed_group; j += V::width) {
                const reg scale = V::max(codec<V>::div(V::load(row_scales + j), largest), smallest);
                V::store(row_scales + j, scale);
                V::store(group_scales + j, scale);
            }
        } else {
            for (dim j = 0; j < packed_group; ++j)
                row_scales[j] = row_scale(p, 0.f, is_value, scales, block, head, offset0 + j);
        }
        encode_rows_fp8<codec<V>>(input_row(0), token_stride * in_es, in_type, n, row_scales,
                                  dt == data_type::f8_e4m3, within_scale, dst, dst_stride, next);
    } else {
        for (dim j = 0; j < packed_group; ++j) {
            if (next) prefetch_row(next + j * token_stride * in_es, n * in_es);
            encode_input_row<V>(p, input_row(j), in_type, is_value, scales, block, head, offset0 + j, row,
                                dst + j * dst_stride);
        }
    }
    if (!view.packed()) return;
    char *region = base + view.region(block, head) * es;
    switch (es) {
        case 1: write_packed_group<V, 1>(rows, n, is_value, offset0, p.block_size, region); break;
        case 2: write_packed_group<V, 2>(rows, n, is_value, offset0, p.block_size, region); break;
        default: write_packed_group<V, 4>(rows, n, is_value, offset0, p.block_size, region); break;
    }
}

template <typename V> std::string decline(const reshape_and_cache_problem &p, const primitive_attr &) {
    // snprintf rather than concat<>: an inline template instantiated here, compiled with this ISA's
    // flags, could be the copy the linker keeps for the other translation units.
    if (p.head_size % V::width != 0) {
        char reason[64];
        std::snprintf(reason, sizeof reason, "head size %lld is not a multiple of %d",
                      static_cast<long long>(p.head_size), V::width);
        return reason;
    }
    return {};
}

// Parallel with oneTBB over (span of tokens, kv head). Within a span, 16 tokens whose slots are 16
// consecutive ones of a block (in a packed cache: one whole 16-token group) are encoded together and
// written at once (the common case in prefill; 16 rows' amaxes, scales and codes in passes, packed
// ones in the layout's order); any other token is written row by row: it converts its K input,
// writes K, then V. Tokens with a negative slot or superseded by a later token of the call are
// skipped (and a group holding one takes the row path).
template <typename V> void execute(const reshape_and_cache_problem &p, const reshape_and_cache_arguments &a) {
    constexpr dim span = 256; // tokens per task; a group cut by a span's end takes the row path
    const dim heads = p.kv_heads;
    const dim key_es = static_cast<dim>(data_type_size(p.key_type)),
              value_es = static_cast<dim>(data_type_size(p.value_type));
    const bool any_packed =
            p.k_cache.get_layout() == layout::packed || p.v_cache.get_layout() == layout::packed;
    auto slot_of = [&](dim t) { return a.slots64 ? a.slots64[t] : static_cast<dim>(a.slots32[t]); };
    auto writable = [&](dim t) { return slot_of(t) >= 0 && !(a.superseded && a.superseded[t]); };
    auto key_row = [&](dim t, dim h) {
        return static_cast<const char *>(a.key) + (t * a.key_token_stride + h * a.key_head_stride) * key_es;
    };
    auto value_row = [&](dim t, dim h) {
        return static_cast<const char *>(a.value) +
               (t * a.value_token_stride + h * a.value_head_stride) * value_es;
    };
    // Tokens t .. t + 15 take 16 consecutive slots of one block from slot_of(t) on, which start a
    // 16-token group if a cache is packed.
    auto whole_group = [&](dim t) {
        const dim s0 = slot_of(t);
        if (s0 < 0 || s0 % p.block_size + packed_group > p.block_size) return false;
        if (any_packed && s0 % packed_group != 0) return false;
        for (dim j = 0; j < packed_group; ++j)
            if (slot_of(t + j) != s0 + j || !writable(t + j)) return false;
        return true;
    };
    // Tasks over (span of tokens, part of the heads); within a task, token by token (or group by
    // group) all its heads, so that the input, [tokens, heads, head size], is read nearly in address
    // order (a task per head read rows a token stride apart: ~10% slower from memory). Heads are
    // split only where there are too few spans to occupy the threads (decode).
    const dim spans = (a.num_tokens + span - 1) / span;
    const dim concurrency = tbb::this_task_arena::max_concurrency();
    if (spans == 0) return;
    const dim head_parts = std::min(heads, std::max<dim>(1, 2 * concurrency / spans));
    const dim heads_per_part = (heads + head_parts - 1) / head_parts;
    parallel_for<dim>(0, spans * head_parts, 1, [&](dim first_task, dim last_task) {
        alignas(64) float row[max_head_size];
        alignas(64) unsigned char group_rows[packed_group * max_head_size * sizeof(float)];
        for (dim i = first_task; i != last_task; ++i) {
            const dim h0 = i % head_parts * heads_per_part, h1 = std::min(heads, h0 + heads_per_part);
            const dim first = i / head_parts * span, last = std::min(a.num_tokens, first + span);
            for (dim t = first; t < last;) {
                if (t + packed_group <= last && whole_group(t)) {
                    const dim slot = slot_of(t), block = slot / p.block_size, offset0 = slot % p.block_size;
                    for (dim h = h0; h < h1; ++h) {
                        // Prefetched: the rows `ahead` heads on, in the next tokens past the last head.
                        constexpr dim ahead = 2;
                        const dim next_t0 = t + (h - h0 + ahead) / (h1 - h0) * packed_group;
                        const dim next = next_t0 + packed_group <= last ? next_t0 : -1;
                        const dim next_head = h0 + (h - h0 + ahead) % (h1 - h0);
                        store_group<V>(p, a, t, h, false, block, offset0, row, group_rows, next, next_head);
                        store_group<V>(p, a, t, h, true, block, offset0, row, group_rows, next, next_head);
                    }
                    t += packed_group;
                    continue;
                }
                if (writable(t)) {
                    const dim slot = slot_of(t), block = slot / p.block_size, offset = slot % p.block_size;
                    for (dim h = h0; h < h1; ++h) {
                        // Prefetched: the rows `ahead` heads on (past the last head, the next
                        // token's), as in the groups above.
                        constexpr dim ahead = 2;
                        const dim next_t = t + (h - h0 + ahead) / (h1 - h0),
                                  next_head = h0 + (h - h0 + ahead) % (h1 - h0);
                        if (next_t < last) {
                            prefetch_row(key_row(next_t, next_head), p.head_size * key_es);
                            prefetch_row(value_row(next_t, next_head), p.head_size * value_es);
                        }
                        store_row<V>(p, key_row(t, h), p.key_type, false, a.k_cache, a.k_scales, block, h,
                                     offset, row);
                        store_row<V>(p, value_row(t, h), p.value_type, true, a.v_cache, a.v_scales, block, h,
                                     offset, row);
                    }
                }
                ++t;
            }
        }
        _mm_sfence();
    });
}

} // namespace x64_rac
#pragma GCC visibility pop
} // namespace detail
} // namespace pagedattn
