// f32 vectors for the x64 kernels: one traits struct per vector width, with the same surface, so a
// kernel is written once as a template. Included only by translation units compiled with the ISA's
// flags. The loads decode the cache formats of src/fp8.hpp exactly (bit-identical to the scalar
// codec), FP8 subnormals included, provided MXCSR's denormals-are-zero bit is clear (the default).
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "pagedattn/common.hpp"

namespace pagedattn {
namespace detail {

// exp(x) for x <= 0 (scores minus their running max): range reduction to 2^n * exp(r) with
// |r| <= ln2/2 and a degree-7 polynomial. Relative error below 1.3e-7 for x >= -20 and 3e-7 below
// (weights under 2e-9 of the largest, where the reduction's one-step r = x - n ln2 loses bits to
// n's size). Inputs below -87 give ~0 (e^-87); NaN gives NaN (vmaxps returns its second operand when
// either is NaN: a NaN score, from a NaN key or query, must make its row NaN as in the reference,
// not weigh e^-87). The softmax's loop of exponentials is bound by the latency of each one (its
// iterations fill the scheduler) more than by their operations, so the steps are arranged for a
// short chain (x64:avx2 on Zen 3: the softmax's share of decode 6.8 -> 6.0 TSC ticks per (token,
// kv head), of e4m3's 76):
// - n is rounded by adding 1.5 * 2^23 + 127 to x log2(e) (in [-125.6, 0]): the sum's unit is 1,
//   so its low mantissa bits hold n + 127, which shifted into the exponent field make 2^n (one FMA
//   and a subtraction for a multiplication, a rounding, a conversion and an addition);
// - the polynomial's bracket by pairs of terms (Estrin's scheme): 3 dependent FMAs, not 5.
template <typename V> typename V::reg exp_negative(typename V::reg x) {
    using R = typename V::reg;
    constexpr float rounding_addend = 0x1.8p23f + 127.f;
    x = V::max(V::set1(-87.f), x);
    const R rounded = V::fma(x, V::set1(1.44269504088896341f), V::set1(rounding_addend));
    const R n = V::add(rounded, V::set1(-rounding_addend));
    const R r = V::fma(n, V::set1(-0.693147182f), x);
    // exp(r) = 1 + r + r^2 (c2 + c3 r + c4 r^2 + c5 r^3 + c6 r^4 + c7 r^5)
    const R r2 = V::mul(r, r);
    const R c23 = V::fma(V::set1(1.6666665459e-1f), r, V::set1(5.0000001201e-1f));
    const R c45 = V::fma(V::set1(8.3334519073e-3f), r, V::set1(4.1665795894e-2f));
    const R c67 = V::fma(V::set1(1.9875691500e-4f), r, V::set1(1.3981999507e-3f));
    const R bracket = V::fma(V::fma(c67, r2, c45), r2, c23);
    const R p = V::fma(bracket, r2, V::add(r, V::set1(1.f)));
    return V::mul(p, V::low_bits_into_exponent(rounded));
}

/// The tile unit of traits without tile products (x64:amx's traits name a src/x64/amx_tiles.hpp backend).
struct no_tiles {};

#if defined(__AVX512F__) && defined(__AVX512BW__)
struct avx512_f32 {
    static constexpr int width = 16;
    static constexpr bool pair_products = false; // scores by f32 FMAs
    static constexpr bool tile_products = false; // (x64:amx's traits say true)
    using tiles = no_tiles;
    using reg = __m512;
    static reg zero() { return _mm512_setzero_ps(); }
    static reg set1(float x) { return _mm512_set1_ps(x); }
    static reg load(const float *p) { return _mm512_loadu_ps(p); }
    static void store(float *p, reg v) { _mm512_storeu_ps(p, v); }
    static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
    static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
    static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
    static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
    /// x's low 9 bits as the exponent field, the rest cleared (exp_negative's 2^n).
    static reg low_bits_into_exponent(reg x) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(x), 23));
    }
    static float reduce_add(reg v) { return _mm512_reduce_add_ps(v); }
    static void reduce_add4(reg a, reg b, reg c, reg d, float *out) {
        out[0] = reduce_add(a), out[1] = reduce_add(b), out[2] = reduce_add(c), out[3] = reduce_add(d);
    }
    static constexpr bool fp8_rows_by_shifts = false; // (dequantize_row: see avx2_f32's)
    static constexpr bool fp8_by_table = false;
    /// Whether the kernels may decode FP8 without the patch for special codes (e4m3 NaN, e5m2 inf
    /// and NaN: 3 operations per 16 codes beside the decoding's), checking the codes as they go.
    static constexpr bool fp8_patch_skippable = true;
    /// What load_pair's values are in units of: e4m3 gives value x 2^-120 and e5m2 value x 2^-112,
    /// as f32 subnormals for subnormal codes (exact while MXCSR's denormals-are-zero is clear: the
    /// kernels clear it); the other types the value.
    static float load_unit(data_type dt) {
        return dt == data_type::f8_e4m3 ? 0x1p-120f : dt == data_type::f8_e5m2 ? 0x1p-112f : 1.f;
    }
    template <data_type dt> static constexpr int fp8_shift = dt == data_type::f8_e4m3 ? 4 : 3;
    /// As avx2_f32::fp8_masked_to_f32 (32-bit lanes): `shifted` holds a code's sign at bit 31 and
    /// its other 7 bits at 26..20 (e4m3) or 27..21 (e5m2).
    template <data_type dt, bool may_hold_special> static __m512i fp8_masked_to_f32(__m512i shifted) {
        constexpr bool e4m3 = dt == data_type::f8_e4m3;
        const __m512i t = _mm512_and_si512(
                shifted, _mm512_set1_epi32(static_cast<int>(e4m3 ? 0x87F00000u : 0x8FE00000u)));
        if constexpr (!may_hold_special) return t;
        const __m512i special = _mm512_set1_epi32(e4m3 ? 0x07F00000 : 0x0F800000);
        const __mmask16 is_special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(t, special), special);
        return _mm512_mask_or_epi32(t, is_special, t, _mm512_set1_epi32(e4m3 ? 0x78000000 : 0x70000000));
    }
    /// A code in a lane's top byte, shifted right with the sign copied and masked: the f32 bits of
    /// load_unit's value. Integer operations only: converting f16 bits (vcvtph2ps) had made
    /// x64:avx512's e4m3 scores ~60% dearer than bf16's on Zen 5, this ~7% (a bare loop of the
    /// scores' 8 FMAs per 32 codes, in L1).
    template <data_type dt, bool may_hold_special> static __m512i fp8_top_byte_to_f32(__m512i top) {
        return fp8_masked_to_f32<dt, may_hold_special>(_mm512_srai_epi32(top, fp8_shift<dt>));
    }
    /// Whether fp8_by_parity and fp8_to_bf16_words exist (see avx2_f32's).
    static constexpr bool fp8_pairs_by_parity = true;
    /// 64 FP8 codes, two rows of 32 (each 16 pairs, as load_pair's), in the 256-bit halves, split
    /// as avx2_f32::fp8_by_parity splits one row: the first row's even pairs in lanes 0..7 of
    /// even_first / even_second and its odd pairs in those of odd_first / odd_second, the second
    /// row's in lanes 8..15. 5 shifts and 4 masks per 64 codes, where load_pair takes 10 shifts or
    /// shuffles and 4 masks: on Zen 4 the shifts and shuffles share a pipe with the FMAs.
    template <data_type dt, bool may_hold_special = true>
    __attribute__((always_inline)) static void fp8_by_parity(__m512i x, reg &even_first, reg &even_second,
                                                             reg &odd_first, reg &odd_second) {
        constexpr int shift = fp8_shift<dt>;
        const __m512i seconds = _mm512_srai_epi16(x, shift);
        const __m512i firsts = _mm512_srai_epi16(_mm512_slli_epi16(x, 8), shift);
        even_first =
                _mm512_castsi512_ps(fp8_masked_to_f32<dt, may_hold_special>(_mm512_slli_epi32(firsts, 16)));
        even_second =
                _mm512_castsi512_ps(fp8_masked_to_f32<dt, may_hold_special>(_mm512_slli_epi32(seconds, 16)));
        odd_first = _mm512_castsi512_ps(fp8_masked_to_f32<dt, may_hold_special>(firsts));
        odd_second = _mm512_castsi512_ps(fp8_masked_to_f32<dt, may_hold_special>(seconds));
    }
    /// 32 FP8 codes as the bf16 words of load_pair's values (avx2_f32's, in 256-bit registers:
    /// the decoded copies are written 32 words at a time either way).
    template <data_type dt, bool may_hold_special>
    __attribute__((always_inline)) static void fp8_to_bf16_words(__m256i x, uint16_t *out);
    // e4m3 S.EEEE.MMM, one code per 32-bit lane: the magnitude bits shifted to f32's exponent and
    // mantissa position give the value times 2^-120 (subnormals too); NaN codes (magnitude 0x7F)
    // are patched after.
    static reg decode_e4m3_lanes(__m512i x) {
        const __m512i magnitude = _mm512_and_si512(x, _mm512_set1_epi32(0x7F));
        const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x80)), 24);
        __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(magnitude, 20)),
                                 _mm512_set1_ps(0x1p120f));
        v = _mm512_mask_mov_ps(v, _mm512_cmpeq_epi32_mask(magnitude, _mm512_set1_epi32(0x7F)),
                               _mm512_set1_ps(NAN));
        return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
    }
    // e5m2, one code per 32-bit lane, is the top byte of an f16.
    static reg decode_e5m2_lanes(__m512i x) {
        return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_slli_epi32(x, 8)));
    }
    static reg load_e4m3(const void *p) {
        return decode_e4m3_lanes(_mm512_cvtepu8_epi32(_mm_loadu_si128(static_cast<const __m128i *>(p))));
    }
    static reg load_e5m2(const void *p) {
        return decode_e5m2_lanes(_mm512_cvtepu8_epi32(_mm_loadu_si128(static_cast<const __m128i *>(p))));
    }
    static reg load_bf16(const void *p) {
        const __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i *>(p)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    }
    static reg load_f16(const void *p) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i *>(p)));
    }
    // Packed-layout loads: 2 * width elements holding width pairs (element 2i + k is item i's k-th
    // of the pair), split into the first and the second of each pair. FP8 comes out in load_unit's
    // units: the kernel folds 2^120 or 2^112 into q, the probabilities and the output, exactly.
    // `may_hold_nan` false: FP8 codes known to hold no special skip its patch.
    template <bool may_hold_nan = true>
    __attribute__((always_inline)) static void load_pair(const void *p, data_type dt, reg &first,
                                                         reg &second) {
        switch (dt) {
            case data_type::bf16: {
                const __m512i x = _mm512_loadu_si512(p);
                first = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
                second = _mm512_castsi512_ps(
                        _mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
                break;
            }
            case data_type::f16: {
                const __m512i x = _mm512_loadu_si512(p);
                first = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x));
                second = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(x, 16)));
                break;
            }
            case data_type::f32: {
                const float *f = static_cast<const float *>(p);
                const __m512 a = _mm512_loadu_ps(f), b = _mm512_loadu_ps(f + 16);
                const __m512i even =
                        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
                first = _mm512_permutex2var_ps(a, even, b);
                second = _mm512_permutex2var_ps(a, _mm512_add_epi32(even, _mm512_set1_epi32(1)), b);
                break;
            }
            case data_type::f8_e4m3: load_fp8_pair<data_type::f8_e4m3, may_hold_nan>(p, first, second); break;
            default: load_fp8_pair<data_type::f8_e5m2, may_hold_nan>(p, first, second); break;
        }
    }
    // 32 FP8 codes: each pair's in the low half of a 32-bit lane, shifted to the top byte.
    template <data_type dt, bool may_hold_special>
    __attribute__((always_inline)) static void load_fp8_pair(const void *p, reg &first, reg &second) {
        const __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i *>(p)));
        first = _mm512_castsi512_ps(fp8_top_byte_to_f32<dt, may_hold_special>(_mm512_slli_epi32(x, 24)));
        second = _mm512_castsi512_ps(fp8_top_byte_to_f32<dt, may_hold_special>(_mm512_slli_epi32(x, 16)));
    }
    /// The inverse of load_pair for f32: interleaves first and second into 2 * width floats.
    static void store_pair(float *p, reg first, reg second) {
        const __m512i low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        _mm512_storeu_ps(p, _mm512_permutex2var_ps(first, low, second));
        _mm512_storeu_ps(p + 16,
                         _mm512_permutex2var_ps(first, _mm512_add_epi32(low, _mm512_set1_epi32(8)), second));
    }
    /// The inverse of load_pair for bf16, for values exact in bf16 (their low 16 bits zero).
    static void store_pair_bf16(uint16_t *p, reg first, reg second) {
        _mm512_storeu_si512(
                p, _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(first), 16),
                                   _mm512_and_si512(_mm512_castps_si512(second),
                                                    _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)))));
    }
    using mask = __mmask16;
    static reg iota() { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
    /// Lanes with lo <= x < hi.
    static mask in_range(reg x, reg lo, reg hi) {
        return _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ) & _mm512_cmp_ps_mask(x, hi, _CMP_LT_OQ);
    }
    static reg select(mask m, reg a, reg b) { return _mm512_mask_mov_ps(b, m, a); }
    static bool any(mask m) { return m != 0; }
    static float reduce_max(reg v) { return _mm512_reduce_max_ps(v); }
};
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
struct avx2_f32 {
    static constexpr int width = 8;
    static constexpr bool pair_products = false;
    static constexpr bool tile_products = false;
    using tiles = no_tiles;
    using reg = __m256;
    static reg zero() { return _mm256_setzero_ps(); }
    static reg set1(float x) { return _mm256_set1_ps(x); }
    static reg load(const float *p) { return _mm256_loadu_ps(p); }
    static void store(float *p, reg v) { _mm256_storeu_ps(p, v); }
    static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
    static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
    static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
    static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
    static reg low_bits_into_exponent(reg x) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(x), 23));
    }
    static float reduce_add(reg v) {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
    /// reduce_add of four vectors at once, into out[0..3]: three horizontal adds and one add of
    /// the halves (5 operations where four reduce_adds take 20).
    static void reduce_add4(reg a, reg b, reg c, reg d, float *out) {
        const __m256 sums = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
        _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1)));
    }
    static constexpr bool fp8_by_table = false;
    static constexpr bool fp8_patch_skippable = true; // (as avx512_f32)
    /// e4m3 as avx512_f32's (value x 2^-120); e5m2 the same way: a code in a lane's top byte
    /// shifted right by 3 with the sign copied, the copies cleared, puts E in the f32 exponent's low
    /// 5 bits and M at the mantissa's top, the value x 2^-112 (subnormals as f32 subnormals). Only
    /// the codes whose E is all ones (inf and NaN) need a patch: their exponent's other bits set.
    /// Through f16 (vcvtph2ps) e5m2 had cost 124 cycles per (token, kv head) of decode in cache on
    /// Zen 3, e4m3 by shifts 104.
    static float load_unit(data_type dt) {
        return dt == data_type::f8_e4m3 ? 0x1p-120f : dt == data_type::f8_e5m2 ? 0x1p-112f : 1.f;
    }
    template <data_type dt> static constexpr int fp8_shift = dt == data_type::f8_e4m3 ? 4 : 3;
    template <data_type dt, bool may_hold_special> static __m256i fp8_top_byte_to_f32(__m256i top) {
        return fp8_masked_to_f32<dt, may_hold_special>(_mm256_srai_epi32(top, fp8_shift<dt>));
    }
    // `shifted`: a code's sign at bit 31 and its other 7 bits at 26..20 (e4m3) or 27..21 (e5m2),
    // the other bits anything: the f32 form of load_unit, its specials (e4m3 NaN, e5m2 inf and NaN)
    // patched unless known absent. lane_bits 16: the same in 16-bit lanes, each the top half of
    // such an f32 (its bf16 word).
    // (Always inlined: x64:avx512's files use it through fp8_to_bf16_words, and an out-of-line copy
    // compiled with their flags could be the one the linker keeps for x64:avx2's callers.)
    template <data_type dt, bool may_hold_special, int lane_bits = 32>
    __attribute__((always_inline)) static __m256i fp8_masked_to_f32(__m256i shifted) {
        constexpr bool e4m3 = dt == data_type::f8_e4m3;
        auto set1 = [](uint32_t f32_bits) {
            return lane_bits == 32 ? _mm256_set1_epi32(static_cast<int>(f32_bits))
                                   : _mm256_set1_epi16(static_cast<short>(f32_bits >> 16));
        };
        const __m256i t = _mm256_and_si256(shifted, set1(e4m3 ? 0x87F00000u : 0x8FE00000u));
        if constexpr (!may_hold_special) return t;
        const __m256i special = set1(e4m3 ? 0x07F00000u : 0x0F800000u); // E.M (e4m3), E (e5m2) all ones
        const __m256i masked = _mm256_and_si256(t, special);
        const __m256i is_special =
                lane_bits == 32 ? _mm256_cmpeq_epi32(masked, special) : _mm256_cmpeq_epi16(masked, special);
        return _mm256_or_si256(t, _mm256_and_si256(is_special, set1(e4m3 ? 0x78000000u : 0x70000000u)));
    }
    /// 32 FP8 codes loaded as one vector (16 pairs, as load_pair's 2 x 16; the kernels check the
    /// loaded codes for specials as they go) by the parity of the pair: pairs 0, 2, ..,
    /// 14 into even_first / even_second, pairs 1, 3, .., 15 into odd_first / odd_second. Each 32-bit
    /// lane holds pairs 2j and 2j + 1; 16-bit arithmetic shifts bring each code's sign and bits
    /// into place within its word, a 32-bit shift the low word's up: 5 shifts and 4 masks per 32
    /// codes, where load_pair takes 8 shifts or shuffles (on Zen 3 they seem to share a pipe with the FMAs:
    /// a bare loop of the scores took 37.6 cycles per token against 42-45, bf16 32-34).
    static constexpr bool fp8_pairs_by_parity = true;
    template <data_type dt, bool may_hold_special = true>
    __attribute__((always_inline)) static void fp8_by_parity(__m256i x, reg &even_first, reg &even_second,
                                                             reg &odd_first, reg &odd_second) {
        constexpr int shift = fp8_shift<dt>;
        const __m256i seconds = _mm256_srai_epi16(x, shift);                      // codes 1 and 3 of a lane
        const __m256i firsts = _mm256_srai_epi16(_mm256_slli_epi16(x, 8), shift); // codes 0 and 2
        even_first =
                _mm256_castsi256_ps(fp8_masked_to_f32<dt, may_hold_special>(_mm256_slli_epi32(firsts, 16)));
        even_second =
                _mm256_castsi256_ps(fp8_masked_to_f32<dt, may_hold_special>(_mm256_slli_epi32(seconds, 16)));
        odd_first = _mm256_castsi256_ps(fp8_masked_to_f32<dt, may_hold_special>(firsts));
        odd_second = _mm256_castsi256_ps(fp8_masked_to_f32<dt, may_hold_special>(seconds));
    }
    /// 32 FP8 codes as the bf16 words of load_pair's values (times load_unit: exact), in the codes'
    /// order, for the kernels' decoded copies: each code unpacked into a word's high byte, shifted
    /// and masked in 16-bit lanes by fp8_masked_to_f32 (the f32 bits' top half), the 128-bit
    /// halves put back in order: 5 operations per 16 codes, the store included, where load_pair
    /// and store_pair_bf16 took 10.
    template <data_type dt, bool may_hold_special>
    __attribute__((always_inline)) static void fp8_to_bf16_words(__m256i x, uint16_t *out) {
        auto decode = [](__m256i high_bytes) {
            return fp8_masked_to_f32<dt, may_hold_special, 16>(_mm256_srai_epi16(high_bytes, fp8_shift<dt>));
        };
        // codes 0-7 and 16-23, then 8-15 and 24-31
        const __m256i low = decode(_mm256_unpacklo_epi8(_mm256_setzero_si256(), x)),
                      high = decode(_mm256_unpackhi_epi8(_mm256_setzero_si256(), x));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(out), _mm256_permute2x128_si256(low, high, 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + 16),
                            _mm256_permute2x128_si256(low, high, 0x31));
    }
    static reg decode_e4m3_lanes(__m256i x) {
        const __m256i magnitude = _mm256_and_si256(x, _mm256_set1_epi32(0x7F));
        const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24);
        __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(magnitude, 20)),
                                 _mm256_set1_ps(0x1p120f));
        const __m256 is_nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(magnitude, _mm256_set1_epi32(0x7F)));
        v = _mm256_blendv_ps(v, _mm256_set1_ps(NAN), is_nan);
        return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign));
    }
    // The low 16 bits of each 32-bit lane, as 8 packed 16-bit values.
    static __m128i narrow16(__m256i x) {
        const __m256i packed =
                _mm256_packus_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0xFFFF)), _mm256_setzero_si256());
        return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0)));
    }
    static reg decode_e5m2_lanes(__m256i x) { return _mm256_cvtph_ps(narrow16(_mm256_slli_epi32(x, 8))); }
    static reg load_e4m3(const void *p) {
        return decode_e4m3_lanes(_mm256_cvtepu8_epi32(_mm_loadl_epi64(static_cast<const __m128i *>(p))));
    }
    static reg load_e5m2(const void *p) {
        return decode_e5m2_lanes(_mm256_cvtepu8_epi32(_mm_loadl_epi64(static_cast<const __m128i *>(p))));
    }
    static reg load_bf16(const void *p) {
        const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i *>(p)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    }
    static reg load_f16(const void *p) {
        return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i *>(p)));
    }
    template <bool may_hold_nan = true> // as avx512_f32::load_pair
    __attribute__((always_inline)) static void load_pair(const void *p, data_type dt, reg &first,
                                                         reg &second) {
        switch (dt) {
            case data_type::bf16: {
                const __m256i x = _mm256_loadu_si256(static_cast<const __m256i *>(p));
                first = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
                second = _mm256_castsi256_ps(
                        _mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
                break;
            }
            case data_type::f16: { // even words to the low half, odd words to the high half
                const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                                       0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
                const __m256i x = _mm256_permute4x64_epi64(
                        _mm256_shuffle_epi8(_mm256_loadu_si256(static_cast<const __m256i *>(p)), split),
                        _MM_SHUFFLE(3, 1, 2, 0));
                first = _mm256_cvtph_ps(_mm256_castsi256_si128(x));
                second = _mm256_cvtph_ps(_mm256_extracti128_si256(x, 1));
                break;
            }
            case data_type::f32: {
                const float *f = static_cast<const float *>(p);
                const __m256 a = _mm256_loadu_ps(f), b = _mm256_loadu_ps(f + 8);
                // Within 128-bit lanes first, then the 64-bit quarters back in order.
                const __m256 even = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
                const __m256 odd = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
                first = _mm256_castpd_ps(
                        _mm256_permute4x64_pd(_mm256_castps_pd(even), _MM_SHUFFLE(3, 1, 2, 0)));
                second = _mm256_castpd_ps(
                        _mm256_permute4x64_pd(_mm256_castps_pd(odd), _MM_SHUFFLE(3, 1, 2, 0)));
                break;
            }
            case data_type::f8_e4m3: load_fp8_pair<data_type::f8_e4m3, may_hold_nan>(p, first, second); break;
            default: load_fp8_pair<data_type::f8_e5m2, may_hold_nan>(p, first, second); break;
        }
    }
    // 16 FP8 codes, in both 128-bit halves: one byte shuffle puts each pair's first code (second
    // code) in the top byte of a 32-bit lane, the other bytes zero: 3 operations per 8 codes where
    // widening and shifting (as avx512_f32 does) took 3.5; on Zen 3 a bare loop of the scores' FMAs
    // took 42-44 cycles per token instead of 46-47 (bf16 35-37).
    template <data_type dt, bool may_hold_special>
    __attribute__((always_inline)) static void load_fp8_pair(const void *p, reg &first, reg &second) {
        const __m256i firsts =
                _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 2, -1, -1, -1, 4, -1, -1, -1, 6, //
                                 -1, -1, -1, 8, -1, -1, -1, 10, -1, -1, -1, 12, -1, -1, -1, 14);
        const __m256i seconds =
                _mm256_setr_epi8(-1, -1, -1, 1, -1, -1, -1, 3, -1, -1, -1, 5, -1, -1, -1, 7, //
                                 -1, -1, -1, 9, -1, -1, -1, 11, -1, -1, -1, 13, -1, -1, -1, 15);
        const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128(static_cast<const __m128i *>(p)));
        first = _mm256_castsi256_ps(
                fp8_top_byte_to_f32<dt, may_hold_special>(_mm256_shuffle_epi8(x, firsts)));
        second = _mm256_castsi256_ps(
                fp8_top_byte_to_f32<dt, may_hold_special>(_mm256_shuffle_epi8(x, seconds)));
    }
    /// dequantize_row of FP8 codes (n a multiple of 8), in order: each code put in a lane's top
    /// byte and shifted into f32 bits in load_unit's units (fp8_top_byte_to_f32, integer
    /// operations), then multiplied once by scale / load_unit where that is finite (one rounding
    /// of the exact value times the scale, as value x scale), else by 1 / load_unit and scale.
    /// The patch for special codes only in a row that holds one, checked 8 codes at a time in a
    /// general register: (byte & mask) + step carries into bit 7 for a special byte alone.
    /// (In the plain layout's kernel, e4m3 to f32 by a multiplication, a blend for NaN and the
    /// sign or'ed in had cost ~11 vector operations per 8 codes; this ~6.)
    static constexpr bool fp8_rows_by_shifts = true;
    template <data_type dt>
    static void dequantize_fp8_row(const char *codes, int64_t n, float scale, float *dst) {
        constexpr bool e4m3 = dt == data_type::f8_e4m3;
        constexpr uint64_t mask = e4m3 ? 0x7F7F7F7F7F7F7F7Full : 0x7C7C7C7C7C7C7C7Cull;
        constexpr uint64_t step = e4m3 ? 0x0101010101010101ull : 0x0404040404040404ull;
        uint64_t carries = 0;
        for (int64_t i = 0; i < n; i += 8) {
            uint64_t x;
            std::memcpy(&x, codes + i, 8);
            carries |= (x & mask) + step;
        }
        const float unit = load_unit(dt), combined = scale / unit; // (exact, unless it overflows)
        auto run = [&](auto patched, auto once) {
            const reg factor = set1(once ? combined : 1.f / unit), then = set1(scale);
            for (int64_t i = 0; i < n; i += 8) {
                const __m256i top = _mm256_slli_epi32(
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(codes + i))),
                        24);
                reg v = _mm256_mul_ps(
                        _mm256_castsi256_ps(fp8_top_byte_to_f32<dt, decltype(patched)::value>(top)), factor);
                if (!once) v = _mm256_mul_ps(v, then);
                _mm256_storeu_ps(dst + i, v);
            }
        };
        const bool special = (carries & 0x8080808080808080ull) != 0, once = std::isfinite(combined);
        if (special)
            once ? run(std::true_type(), true) : run(std::true_type(), false);
        else
            once ? run(std::false_type(), true) : run(std::false_type(), false);
    }
    static void store_pair(float *p, reg first, reg second) {
        const __m256 low = _mm256_unpacklo_ps(first, second), high = _mm256_unpackhi_ps(first, second);
        _mm256_storeu_ps(p, _mm256_permute2f128_ps(low, high, 0x20));
        _mm256_storeu_ps(p + 8, _mm256_permute2f128_ps(low, high, 0x31));
    }
    /// The inverse of load_pair for bf16, for values exact in bf16 (their low 16 bits zero).
    static void store_pair_bf16(uint16_t *p, reg first, reg second) {
        _mm256_storeu_si256(
                reinterpret_cast<__m256i *>(p),
                _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(first), 16),
                                _mm256_and_si256(_mm256_castps_si256(second),
                                                 _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)))));
    }
    using mask = __m256;
    static reg iota() { return _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7); }
    static mask in_range(reg x, reg lo, reg hi) {
        return _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ), _mm256_cmp_ps(x, hi, _CMP_LT_OQ));
    }
    static reg select(mask m, reg a, reg b) { return _mm256_blendv_ps(b, a, m); }
    static bool any(mask m) { return _mm256_movemask_ps(m) != 0; }
    static float reduce_max(reg v) {
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        return _mm_cvtss_f32(m);
    }
};
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
template <data_type dt, bool may_hold_special>
inline void avx512_f32::fp8_to_bf16_words(__m256i x, uint16_t *out) {
    avx2_f32::fp8_to_bf16_words<dt, may_hold_special>(x, out);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__) && defined(__AVX512VBMI__)
/// The bf16 bits of each FP8 magnitude (code & 0x7F), for decoding by table: exact, FP8 subnormals
/// as normal bf16 numbers (vdpbf16ps reads bf16 denormals as zero), inf and NaN as bf16's. Kept as
/// two 128-byte tables, low and high bytes, each one two-register byte permute (vpermt2b).
struct fp8_bf16_table {
    alignas(64) uint8_t low[128] = {};
    alignas(64) uint8_t high[128] = {};
    constexpr explicit fp8_bf16_table(data_type dt) {
        const int mantissa_bits = dt == data_type::f8_e4m3 ? 3 : 2, bias = dt == data_type::f8_e4m3 ? 7 : 15;
        for (int m = 1; m < 128; ++m) {
            int exponent = m >> mantissa_bits, fraction = m & ((1 << mantissa_bits) - 1), bits = 0;
            if (dt == data_type::f8_e4m3 ? m == 0x7F : exponent == 31) {
                bits = dt == data_type::f8_e5m2 && fraction == 0 ? 0x7F80 : 0x7FC0;
            } else {
                int power = exponent - bias; // value: (1 + fraction / 2^mantissa_bits) * 2^power
                if (exponent == 0) {         // subnormal: fraction / 2^mantissa_bits * 2^(1 - bias)
                    power = 1 - bias;
                    while (fraction < (1 << mantissa_bits))
                        fraction <<= 1, --power;
                    fraction -= 1 << mantissa_bits;
                }
                bits = (power + 127) << 7 | fraction << (7 - mantissa_bits);
            }
            low[m] = static_cast<uint8_t>(bits & 0xFF);
            high[m] = static_cast<uint8_t>(bits >> 8);
        }
    }
};
inline constexpr fp8_bf16_table e4m3_in_bf16 { data_type::f8_e4m3 }, e5m2_in_bf16 { data_type::f8_e5m2 };

/// avx512_f32 plus bf16 pair products (vdpbf16ps) for the scores: q . k over a pair of dims in one
/// instruction. The products of bf16 values are exact in f32; the keys (bf16, or FP8 converted
/// exactly) are never bf16 denormals, which vdpbf16ps would read as zero. FP8 is converted by byte
/// tables (AVX512-VBMI, which every CPU with AVX512-BF16 but Cooper Lake has).
struct avx512_bf16_f32 : avx512_f32 {
    static constexpr bool pair_products = true;
    using pairs = __m512bh;

    static constexpr bool fp8_by_table = true; // FP8 decoding has no NaN patch to skip
    static constexpr bool fp8_patch_skippable = false;
    static constexpr bool fp8_pairs_by_parity = false; // (FP8 by the tables)

    // 64 FP8 codes to bf16 bits, codes 0..31 into `first` and 32..63 into `second`: three
    // operations per 32 codes. Two byte permutes (which read an index's low 7 bits) look up the low
    // and high bytes of the magnitude's bits (subnormals, inf and NaN included: no special cases),
    // the code's sign is copied into the high bytes, and the bytes are interleaved into words.
    // The interleave works within 128-bit lanes, so the codes are first put in the order it takes
    // them: lane L's 8 low bytes are codes 8L..8L+7, its 8 high bytes codes 32+8L..32+8L+7.
    static void fp8_to_bf16(__m512i codes, data_type dt, __m512i &first, __m512i &second) {
        const fp8_bf16_table &t = dt == data_type::f8_e4m3 ? e4m3_in_bf16 : e5m2_in_bf16;
        const __m512i interleave_order = _mm512_set_epi64(
                0x3F3E3D3C3B3A3938, 0x1F1E1D1C1B1A1918, 0x3736353433323130, 0x1716151413121110,
                0x2F2E2D2C2B2A2928, 0x0F0E0D0C0B0A0908, 0x2726252423222120, 0x0706050403020100);
        const __m512i c = _mm512_permutexvar_epi8(interleave_order, codes);
        const __m512i low =
                _mm512_permutex2var_epi8(_mm512_load_si512(t.low), c, _mm512_load_si512(t.low + 64));
        const __m512i high =
                _mm512_permutex2var_epi8(_mm512_load_si512(t.high), c, _mm512_load_si512(t.high + 64));
        // high | (c & 0x80)
        const __m512i signed_high =
                _mm512_ternarylogic_epi32(high, c, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);
        first = _mm512_unpacklo_epi8(low, signed_high);
        second = _mm512_unpackhi_epi8(low, signed_high);
    }
    static __m512i load_fp8_as_bf16(const void *p, data_type dt) {
        __m512i first, second;
        fp8_to_bf16(_mm512_zextsi256_si512(_mm256_loadu_si256(static_cast<const __m256i *>(p))), dt, first,
                    second);
        return first;
    }
    // As avx512_f32::load_pair, but FP8 through the bf16 tables: exact values (load_unit 1).
    template <bool may_hold_nan = true>
    __attribute__((always_inline)) static void load_pair(const void *p, data_type dt, reg &first,
                                                         reg &second) {
        if (dt != data_type::f8_e4m3 && dt != data_type::f8_e5m2)
            return avx512_f32::load_pair<may_hold_nan>(p, dt, first, second);
        split_pairs(load_fp8_as_bf16(p, dt), first, second);
    }
    // Two consecutive load_pairs' worth (64 FP8 codes) decoded together, as bf16 pairs: p's into
    // x0, p + 32's into x1 (split_pairs gives load_pair's first and second).
    __attribute__((always_inline)) static void load_two_fp8_as_bf16(const void *p, data_type dt, __m512i &x0,
                                                                    __m512i &x1) {
        fp8_to_bf16(_mm512_loadu_si512(p), dt, x0, x1);
    }
    // bf16 pairs to f32: each pair's first is its low half, its second its high half.
    static void split_pairs(__m512i x, reg &first, reg &second) {
        first = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
        second = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
    }
    static float load_unit(data_type) { return 1.f; }
    /// 16 pairs (32 elements of a packed K row) as bf16 pairs: bf16 as stored, FP8 converted.
    __attribute__((always_inline)) static pairs load_bf16_pairs(const void *p, data_type dt) {
        if (dt == data_type::bf16) return (pairs)_mm512_loadu_si512(p);
        return (pairs)load_fp8_as_bf16(p, dt);
    }
    /// 32 pairs (two consecutive packed rows of 32 elements): p's into `first`, the next row's into
    /// `second`.
    __attribute__((always_inline)) static void load_two_bf16_pairs(const void *p, data_type dt, pairs &first,
                                                                   pairs &second) {
        if (dt == data_type::bf16) {
            first = (pairs)_mm512_loadu_si512(p);
            second = (pairs)_mm512_loadu_si512(static_cast<const char *>(p) + 64);
            return;
        }
        __m512i x0, x1;
        load_two_fp8_as_bf16(p, dt, x0, x1);
        first = (pairs)x0, second = (pairs)x1;
    }
    static void store_pairs(uint16_t *p, pairs k) { _mm512_storeu_si512(p, (__m512i)k); }
    /// n floats (a multiple of 16) rounded to bf16 (nearest even), as pairs: dst[i] holds elements
    /// 2i (low half) and 2i + 1.
    static void store_as_bf16_pairs(const float *p, int64_t n, uint32_t *dst) {
        int64_t i = 0;
        for (; i + 32 <= n; i += 32)
            _mm512_storeu_si512(dst + i / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + i + 16),
                                                                          _mm512_loadu_ps(p + i)));
        if (i < n)
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(dst + i / 2),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(p + i)));
    }
    /// (q0, q1), given as bf16 bits, in every lane.
    static pairs broadcast_pair(uint32_t q_pair) {
        return (pairs)_mm512_set1_epi32(static_cast<int>(q_pair));
    }
    /// acc + q.first * k.first + q.second * k.second for 16 pairs.
    static reg dot_pairs(reg acc, pairs q, pairs k) { return _mm512_dpbf16_ps(acc, q, k); }
};
#endif

/// n elements (n a multiple of V::width) of cache type dt, times `scale`, into dst.
template <typename V> void dequantize_row(const void *src, data_type dt, int64_t n, float scale, float *dst) {
    const typename V::reg s = V::set1(scale);
    const char *bytes = static_cast<const char *>(src);
    switch (dt) {
        case data_type::f32:
            for (int64_t i = 0; i < n; i += V::width)
                V::store(dst + i, V::mul(V::load(reinterpret_cast<const float *>(bytes) + i), s));
            break;
        case data_type::bf16:
            for (int64_t i = 0; i < n; i += V::width)
                V::store(dst + i, V::mul(V::load_bf16(bytes + 2 * i), s));
            break;
        case data_type::f16:
            for (int64_t i = 0; i < n; i += V::width)
                V::store(dst + i, V::mul(V::load_f16(bytes + 2 * i), s));
            break;
        case data_type::f8_e4m3:
            if constexpr (V::fp8_rows_by_shifts) {
                V::template dequantize_fp8_row<data_type::f8_e4m3>(bytes, n, scale, dst);
                break;
            }
            for (int64_t i = 0; i < n; i += V::width)
                V::store(dst + i, V::mul(V::load_e4m3(bytes + i), s));
            break;
        case data_type::f8_e5m2:
            if constexpr (V::fp8_rows_by_shifts) {
                V::template dequantize_fp8_row<data_type::f8_e5m2>(bytes, n, scale, dst);
                break;
            }
            for (int64_t i = 0; i < n; i += V::width)
                V::store(dst + i, V::mul(V::load_e5m2(bytes + i), s));
            break;
        default: break;
    }
}

} // namespace detail
} // namespace pagedattn
