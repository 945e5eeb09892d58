// x64:amx — the x64 kernel of x64:avx512_bf16 with the products of items of 8 rows or more (prefill,
// chunked prefill, verify, large GQA groups) on AMX tiles (TDPBF16PS), on the packed layout, whose K
// and V groups are tile rows by design. Decode items keep the pair products (vdpbf16ps).
//
// Tiles (src/x64/amx_tiles.hpp), one configuration for all: 8 tiles of 16 rows x 64 bytes, C tiles
// 0-3 (2 x 2 blocks of 16 x 16 f32), A tiles 4-5, B tiles 6-7.
//   scores: A = 16 query rows x 32 dims of bf16 q (zero-padded to a multiple of 32 dims), B = 16
//           rows of a K group's dim pairs x 16 tokens, straight from a bf16 cache or from keys
//           decoded to bf16 in L1 (FP8, or D % 32 != 0);
//   values: A = 16 rows x 32 tokens of probabilities rounded to bf16 pairs, B = 16 token pairs x 16
//           dims of V decoded or copied to bf16 in L1, with the tokens outside the item's range
//           zeroed. Only with a bf16 dst (the rounding of the probabilities is of dst's order);
//           f32 and f16 dst keep f32 probabilities and vector FMAs for the values.
// Compiled with the AVX-512-BF16/VBMI flags and -mamx-tile -mamx-bf16. With the build option
// PAGEDATTN_AMX_EMULATOR the tiles are emulated instead (and the implementation needs only
// AVX512-BF16): the same kernel, run where there is no AMX.
#define PAGEDATTN_X64_ISA amx
#include "src/x64/amx_tiles.hpp"
#include "x64_kernel.hpp"

namespace pagedattn {
namespace detail {
namespace x64 {
#pragma GCC visibility push(hidden)
namespace amx {

#if PAGEDATTN_AMX_EMULATOR
using tile_backend = detail::amx_tiles::emulated_tiles;
constexpr cpu_isa required_isa = cpu_isa::avx512_bf16;
#else
using tile_backend = detail::amx_tiles::hardware_tiles;
constexpr cpu_isa required_isa = cpu_isa::amx;
#endif

// C[m][n] (M x N blocks of 16 x 16 f32, c_stride bytes per row) = sum over k_steps of A[m] (16 rows,
// 64 bytes a step) x B[n] (16 rows, b_step bytes a step). Every tile of the one configuration.
template <int M, int N, typename Tiles>
void tile_block_products(Tiles &t, const char *const *a, long a_stride, const char *const *b, long b_stride,
                         long b_step, dim k_steps, float *const (*c)[2], long c_stride) {
    t.template zero<0>();
    if constexpr (N > 1) t.template zero<1>();
    if constexpr (M > 1) t.template zero<2>();
    if constexpr (M > 1 && N > 1) t.template zero<3>();
    for (dim s = 0; s < k_steps; ++s) {
        t.template load<4>(a[0] + 64 * s, a_stride);
        if constexpr (M > 1) t.template load<5>(a[1] + 64 * s, a_stride);
        t.template load<6>(b[0] + b_step * s, b_stride);
        if constexpr (N > 1) t.template load<7>(b[1] + b_step * s, b_stride);
        t.template dpbf16ps<0, 4, 6>();
        if constexpr (N > 1) t.template dpbf16ps<1, 4, 7>();
        if constexpr (M > 1) t.template dpbf16ps<2, 5, 6>();
        if constexpr (M > 1 && N > 1) t.template dpbf16ps<3, 5, 7>();
    }
    t.template store<0>(c[0][0], c_stride);
    if constexpr (N > 1) t.template store<1>(c[0][1], c_stride);
    if constexpr (M > 1) t.template store<2>(c[1][0], c_stride);
    if constexpr (M > 1 && N > 1) t.template store<3>(c[1][1], c_stride);
}

template <typename Tiles>
void tile_blocks(Tiles &t, bool two_rows, bool two_columns, const char *const *a, long a_stride,
                 const char *const *b, long b_stride, long b_step, dim k_steps, float *const (*c)[2],
                 long c_stride) {
    if (two_rows && two_columns)
        tile_block_products<2, 2>(t, a, a_stride, b, b_stride, b_step, k_steps, c, c_stride);
    else if (two_rows)
        tile_block_products<2, 1>(t, a, a_stride, b, b_stride, b_step, k_steps, c, c_stride);
    else if (two_columns)
        tile_block_products<1, 2>(t, a, a_stride, b, b_stride, b_step, k_steps, c, c_stride);
    else
        tile_block_products<1, 1>(t, a, a_stride, b, b_stride, b_step, k_steps, c, c_stride);
}

/// avx512_bf16_f32 plus the tile products that run_item_packed calls for items of tile_min_rows or
/// more.
struct amx_f32 : avx512_bf16_f32 {
    static constexpr bool tile_products = true;
    using tiles = tile_backend;
    static constexpr dim tile_min_rows = 8;

    static detail::amx_tiles::tile_config tile_configuration() {
        detail::amx_tiles::tile_config config;
        for (int t = 0; t < detail::amx_tiles::tile_count; ++t)
            config.set(t, 16, 64);
        return config;
    }

    /// probability (rows x packed_chunk f32) = factor * q . k for the chunk's `count` groups:
    /// q_tiles holds the rows (a multiple of 16, zero-padded) of d_tiles bf16 each; each group's
    /// keys are d_tiles / 2 rows of 64 bytes (16 tokens x a dim pair). `k_ahead` (null when the keys
    /// were staged, their prefetches done) gives each group's distance to the next chunk's.
    static void tile_scores(tiles &t, const uint16_t *q_tiles, dim rows, dim d_tiles,
                            const char *const *k_groups, dim count, const dim *k_ahead, float factor,
                            float *probability) {
        const char *q = reinterpret_cast<const char *>(q_tiles);
        const long q_stride = static_cast<long>(d_tiles) * 2, c_stride = packed_chunk * 4;
        if (k_ahead)
            for (dim g = 0; g < count; ++g)
                if (k_ahead[g] != 0)
                    for (dim line = 0; line < d_tiles * 32; line += 64)
                        prefetch_ahead(k_groups[g] + line, k_ahead[g]);
        for (dim r0 = 0; r0 < rows; r0 += 32) {
            const bool two_rows = r0 + 16 < rows;
            const char *a[2] = { q + r0 * q_stride, q + (r0 + 16) * q_stride };
            for (dim g = 0; g < count; g += 2) {
                const bool two_groups = g + 1 < count;
                const char *b[2] = { k_groups[g], two_groups ? k_groups[g + 1] : nullptr };
                float *row0 = probability + r0 * packed_chunk + g * 16, *row16 = row0 + 16 * packed_chunk;
                float *const c[2][2] = { { row0, row0 + 16 }, { row16, row16 + 16 } };
                tile_blocks(t, two_rows, two_groups, a, q_stride, b, 64, 1024, d_tiles / 32, c, c_stride);
            }
        }
        const reg f = set1(factor);
        for (dim r = 0; r < rows; ++r)
            for (dim v = 0; v < count * 16; v += 16)
                store(probability + r * packed_chunk + v, mul(load(probability + r * packed_chunk + v), f));
    }

    /// acc (rows x d) = acc * correction + probabilities x V for one chunk, or false (nothing
    /// written to acc) when a value the tiles would multiply is not finite. The values (`count`
    /// groups at v_groups, 16-dim groups dims_group_stride bytes apart) are staged as bf16 pairs in
    /// `staged` (a packed_chunk-token block), tokens outside [first_token, end_token) of the chunk and
    /// the pairs beyond its last group up to a multiple of 32 tokens zeroed; probability_pairs holds
    /// the rows' probabilities (rows rounded up to 16, the padding zero).
    static bool tile_values(tiles &t, const char *const *v_groups, dim count, data_type v_type,
                            dim dims_group_stride, const dim *v_ahead, dim first_token, dim end_token,
                            uint32_t *probability_pairs, dim rows, dim d, const float *correction,
                            uint16_t *staged, float *tile_out, float *acc) {
        const dim tokens = count * 16, k_tokens = (tokens + 31) / 32 * 32;
        const dim v_size = static_cast<dim>(data_type_size(v_type));
        const __m512i exponent = _mm512_set1_epi16(0x7F80);
        __mmask32 special = 0;
        for (dim dims_group = 0; dims_group < d / 16; ++dims_group) {
            uint16_t *out = staged + dims_group * 16 * packed_chunk;
            for (dim pair = 0; pair < k_tokens / 2; pair += 2) {
                __m512i x[2];
                if (pair >= tokens / 2) { // beyond the last group: zeros (tokens / 2 is a multiple of 8)
                    x[0] = x[1] = _mm512_setzero_si512();
                } else {
                    const char *source =
                            v_groups[pair / 8] + dims_group * dims_group_stride + pair % 8 * 32 * v_size;
                    pairs first, second;
                    load_two_bf16_pairs(source, v_type, first, second);
                    x[0] = (__m512i)first, x[1] = (__m512i)second;
                    if (v_ahead[pair / 8] != 0)
                        for (dim line = 0; line < 64 * v_size; line += 64)
                            prefetch_ahead(source + line, v_ahead[pair / 8]);
                }
                for (int h = 0; h < 2; ++h) {
                    const dim token = 2 * (pair + h); // the pair's first token (its low halves)
                    if (token < first_token || token + 1 >= end_token) {
                        const uint32_t keep =
                                (token >= first_token && token < end_token ? 0xFFFFu : 0u) |
                                (token + 1 >= first_token && token + 1 < end_token ? 0xFFFF0000u : 0u);
                        x[h] = _mm512_and_si512(x[h], _mm512_set1_epi32(static_cast<int>(keep)));
                    }
                    special |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(x[h], exponent), exponent);
                    _mm512_storeu_si512(out + (pair + h) * 32, x[h]);
                }
            }
        }
        if (special) return false;
        if (k_tokens != tokens) // the A tiles' last 16 tokens: zeros
            for (dim r = 0; r < rows; ++r)
                std::memset(probability_pairs + r * (packed_chunk / 2) + tokens / 2, 0, 32);

        const char *p = reinterpret_cast<const char *>(probability_pairs);
        const long a_stride = packed_chunk / 2 * 4, c_stride = static_cast<long>(d) * 4;
        const char *s = reinterpret_cast<const char *>(staged);
        const long dims_group_bytes = 16 * packed_chunk * 2;
        for (dim r0 = 0; r0 < rows; r0 += 32) {
            const bool two_rows = r0 + 16 < rows;
            const char *a[2] = { p + r0 * a_stride, p + (r0 + 16) * a_stride };
            for (dim dims_group = 0; dims_group < d / 16; dims_group += 2) {
                const bool two_groups = dims_group + 1 < d / 16;
                const char *b[2] = { s + dims_group * dims_group_bytes,
                                     s + (dims_group + 1) * dims_group_bytes };
                float *row0 = tile_out + r0 * d + dims_group * 16, *row16 = row0 + 16 * d;
                float *const c[2][2] = { { row0, row0 + 16 }, { row16, row16 + 16 } };
                tile_blocks(t, two_rows, two_groups, a, a_stride, b, 64, 1024, k_tokens / 32, c, c_stride);
            }
        }
        for (dim r = 0; r < rows; ++r) {
            const reg k = set1(correction[r]);
            for (dim i = 0; i < d; i += 16)
                store(acc + r * d + i, fma(load(acc + r * d + i), k, load(tile_out + r * d + i)));
        }
        return true;
    }
};

} // namespace amx
#pragma GCC visibility pop
} // namespace x64

const paged_attention_implementation paged_attention_amx = { "x64:amx", x64::amx::required_isa,
                                                             x64::amx::decline<x64::amx::amx_f32>,
                                                             x64::amx::scratch_bytes<x64::amx::amx_f32>,
                                                             x64::amx::run_item<x64::amx::amx_f32> };

} // namespace detail
} // namespace pagedattn
