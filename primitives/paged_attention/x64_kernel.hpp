// The x64 paged_attention kernel, written once over an f32 vector type (avx2_f32, avx512_f32) and
// instantiated by the thin per-ISA files avx2.cpp and avx512.cpp. f32 products and accumulation for
// every input type (so it meets fpmath_mode::strict), both cache layouts.
//
// Per work item (sequence, kv head, query tile) it walks the item's KV range through the block
// table in chunks (16 tokens in the plain layout; 128 in the packed one, eight 16-token groups that
// may come from different blocks); the q heads of the kv head and the query tokens of the tile are the
// rows of the item (GQA: each K/V element loaded serves all of them). Scores get the per-token K
// scale, soft-cap and ALiBi; an online softmax in f32 rescales the accumulators once per chunk.
// Per-tensor and per-head K scales are folded into q, V scales into the output, per-token V scales
// into the probabilities.
//   plain:  each K row is dequantized once into L1 and dotted with every row; each V row likewise.
//   packed: tokens sit in vector lanes (K rows of 16 tokens x a dim pair, V rows of 16 dims x a
//           token pair), so FP8/bf16 are dequantized in registers right before the FMAs and scores
//           need no horizontal sums (FP8 by integer shifts into f32 bits, value x 2^-120 for
//           e4m3 or 2^-112 for e5m2, split by parity, without the patch for NaN and inf: the codes
//           are checked as read, and the work redone with the patch where they held one).
//           The instantiation of avx512_bf16.cpp computes the scores by bf16 pair products instead
//           (vdpbf16ps), and with a bf16 dst the values' products too (the probabilities rounded to
//           bf16, as dst will be; f32 and f16 dst keep them in f32).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "paged_attention_internal.hpp"
#include "plan.hpp"
#include "src/cache_layout.hpp"
#include "src/error.hpp"
#include "src/fp8.hpp"
#include "src/x64/f32_vectors.hpp"

#ifndef PAGEDATTN_X64_ISA
#error "define PAGEDATTN_X64_ISA (the including file's ISA) before including x64_kernel.hpp"
#endif

namespace pagedattn {
namespace detail {
namespace x64 {
// Everything here is compiled once per ISA file with that ISA's flags. A namespace per ISA keeps the
// copies apart: otherwise the linker would keep one copy of each inline function for all of them,
// possibly the AVX-512 one for a caller on an AVX2 machine. Hidden: nothing here is API, and calls
// between exported template instances went through the PLT and were not inlined.
#pragma GCC visibility push(hidden)
namespace PAGEDATTN_X64_ISA {

constexpr dim chunk = 16; // plain layout: tokens per online-softmax step
// Packed layout: up to 8 groups of 16 tokens, from one block or several. 128 rather than 64: a
// 128-token block's K and V regions are then read in one chunk each, V's rows of 16 dims whole
// (8 x 8192 decode from memory ~10% faster when the DRAM is not shared, in cache ~4%).
constexpr dim packed_chunk = 128;

template <typename V> std::string decline(const paged_attention_problem &p, const primitive_attr &) {
    if (p.head_size % V::width != 0) {
        // snprintf rather than concat: no template instantiation shared with other files.
        char reason[64];
        std::snprintf(reason, sizeof reason, "head size %ld is not a multiple of %d",
                      static_cast<long>(p.head_size), V::width);
        return reason;
    }
    if (p.k_cache.get_layout() != p.v_cache.get_layout()) return "K and V caches in different layouts";
    if constexpr (V::pair_products) {
        if (p.k_cache.get_layout() != layout::packed) return "bf16 pair products read the packed layout only";
        if (p.query_type != data_type::bf16)
            return "the query is not bf16: under fpmath strict f32/f16 queries are multiplied in f32";
        const data_type k = p.k_cache.get_data_type();
        if (k != data_type::bf16 && k != data_type::f8_e4m3 && k != data_type::f8_e5m2)
            return "f32/f16 keys are not exact in bf16";
    }
    return {};
}

// With tile products the rows are counted in whole tiles of 16 (the padding rows' scores and
// probabilities are computed and ignored), and two regions are added: q as bf16 rows of a multiple
// of 32 dims (a tile row), and the tiles' share of a chunk's output.
struct scratch_layout {
    size_t q, acc, scores, row_max, row_sum, correction, k_row, k_chunk, v_chunk, probability_pairs, tile_q,
            tile_out, total; // in floats
    explicit scratch_layout(const paged_attention_problem &p, bool tiles = false) {
        const size_t item_rows = static_cast<size_t>(tokens_per_tile(p) * (p.q_heads / p.kv_heads));
        const size_t rows = tiles ? (item_rows + 15) / 16 * 16 : item_rows;
        const size_t d = static_cast<size_t>(p.head_size);
        q = 0;
        acc = q + rows * d;
        scores = acc + rows * d;
        row_max = scores + rows * packed_chunk;
        row_sum = row_max + rows;
        correction = row_sum + rows;
        k_row = correction + rows;
        k_chunk = k_row + d;
        v_chunk = k_chunk + packed_chunk * d;
        probability_pairs = v_chunk + packed_chunk * d;
        tile_q = probability_pairs + rows * packed_chunk / 2;
        tile_out = tile_q + (tiles ? rows * ((d + 31) / 32 * 32) / 2 : 0);
        total = tile_out + (tiles ? rows * d : 0);
    }
};

template <typename V> size_t scratch_bytes(const paged_attention_problem &p) {
    return scratch_layout(p, V::tile_products).total * sizeof(float);
}

// The rows of a work item: (query token, q head) pairs, q in f32 times the softmax scale and any
// K scale that does not vary per token; accumulators zeroed; maxima and sums started (from the
// sink, unless the item is a piece of a split range).
struct item_rows {
    bool k_per_token, v_per_token;
    float q_factor;   // softmax scale times a K scale that does not vary per token
    float out_factor; // V scale that does not vary per token
};

inline item_rows prepare_rows(const paged_attention_problem &p, const paged_attention_arguments &a,
                              const work_item &item, float *q, float *acc, float *row_max, float *row_sum,
                              const float *partial, bool scale_q = true) {
    const auto &o = p.options;
    const dim group = p.q_heads / p.kv_heads, d = p.head_size;
    const dim q_begin = a.query_start_loc[item.seq];
    const dim rows = (item.last_token - item.first_token) * group;
    item_rows info;
    info.k_per_token = p.k_scales_mask == scales_per_token;
    info.v_per_token = p.v_scales_mask == scales_per_token;
    const float q_factor =
            o.softmax_scale *
            (info.k_per_token ? 1.f : row_scale(a.k_scales, p.k_scales_mask, p, 0, item.kv_head, 0));
    info.q_factor = q_factor;
    info.out_factor = info.v_per_token ? 1.f : row_scale(a.v_scales, p.v_scales_mask, p, 0, item.kv_head, 0);
    for (dim r = 0; r < rows; ++r) {
        const dim t = item.first_token + r / group, head = item.kv_head * group + r % group;
        const char *src = static_cast<const char *>(a.query) +
                          ((q_begin + t) * a.query_token_stride + head * a.query_head_stride) *
                                  static_cast<dim>(data_type_size(p.query_type));
        convert_row_to_f32(src, p.query_type, d, 1.f, q + r * d);
        if (scale_q) // else the kernel scales the scores (its q must stay exact in bf16)
            for (dim i = 0; i < d; ++i)
                q[r * d + i] *= q_factor;
        std::fill(acc + r * d, acc + (r + 1) * d, 0.f);
        const bool sink = a.sinks && !partial; // a split item leaves the sink to the merge
        row_max[r] = sink ? a.sinks[head] : -std::numeric_limits<float>::infinity();
        row_sum[r] = sink ? 1.f : 0.f;
    }
    return info;
}

template <typename V> float dot(const float *a, const float *b, dim n) {
    typename V::reg s0 = V::zero(), s1 = V::zero();
    dim i = 0;
    for (; i + 2 * V::width <= n; i += 2 * V::width) {
        s0 = V::fma(V::load(a + i), V::load(b + i), s0);
        s1 = V::fma(V::load(a + i + V::width), V::load(b + i + V::width), s1);
    }
    if (i < n) s0 = V::fma(V::load(a + i), V::load(b + i), s0);
    return V::reduce_add(V::add(s0, s1));
}

// The dot products of 4 rows (q, d floats apart) with one row k of d floats, k's loads shared and
// the four horizontal sums taken together.
template <typename V> void dot4(const float *q, dim d, const float *k, float *out) {
    using reg = typename V::reg;
    reg s[4][2];
    for (auto &row : s)
        row[0] = row[1] = V::zero();
    dim i = 0;
    for (; i + 2 * V::width <= d; i += 2 * V::width) {
        const reg k0 = V::load(k + i), k1 = V::load(k + i + V::width);
        for (int r = 0; r < 4; ++r) {
            s[r][0] = V::fma(V::load(q + r * d + i), k0, s[r][0]);
            s[r][1] = V::fma(V::load(q + r * d + i + V::width), k1, s[r][1]);
        }
    }
    if (i < d) {
        const reg k0 = V::load(k + i);
        for (int r = 0; r < 4; ++r)
            s[r][0] = V::fma(V::load(q + r * d + i), k0, s[r][0]);
    }
    V::reduce_add4(V::add(s[0][0], s[0][1]), V::add(s[1][0], s[1][1]), V::add(s[2][0], s[2][1]),
                   V::add(s[3][0], s[3][1]), out);
}

// Dims i .. i + K vectors of R rows of acc (d floats apart) += each used token's weight for the row
// (weights: R rows, `stride` apart, the token's at index token[u]) times its value row (values + u *
// d), in registers. A weight of 0 (a token the row does not see, or whose weight underflowed) adds
// nothing, not even a NaN from an infinite value.
template <typename V, int R, int K>
void add_weighted_slice(float *acc, dim d, const float *weights, dim stride, const dim *token, dim used,
                        const float *values, dim i) {
    using reg = typename V::reg;
    reg a[R][K];
    for (int r = 0; r < R; ++r)
        for (int k = 0; k < K; ++k)
            a[r][k] = V::load(acc + r * d + i + k * V::width);
    for (dim u = 0; u < used; ++u) {
        reg x[K];
        for (int k = 0; k < K; ++k)
            x[k] = V::load(values + u * d + i + k * V::width);
        for (int r = 0; r < R; ++r) {
            const float weight = weights[r * stride + token[u]];
            if (weight == 0.f) continue;
            const reg w = V::set1(weight);
            for (int k = 0; k < K; ++k)
                a[r][k] = V::fma(w, x[k], a[r][k]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int k = 0; k < K; ++k)
            V::store(acc + r * d + i + k * V::width, a[r][k]);
}

// add_weighted_slice over all rows and dims: two rows and 4 vectors of dims at a time (8
// accumulators, 4 values and a weight in AVX2's 16 registers), so that the accumulators are loaded
// and stored once per chunk rather than once per token and row.
template <typename V>
void add_weighted_rows(float *acc, dim rows, dim d, const float *weights, dim stride, const dim *token,
                       dim used, const float *values) {
    constexpr dim slice = 4 * V::width;
    for (dim r = 0; r < rows; r += 2) {
        auto run = [&](auto two) {
            constexpr int R = decltype(two)::value ? 2 : 1;
            float *a = acc + r * d;
            const float *w = weights + r * stride;
            dim i = 0;
            for (; i + slice <= d; i += slice)
                add_weighted_slice<V, R, 4>(a, d, w, stride, token, used, values, i);
            for (; i < d; i += V::width)
                add_weighted_slice<V, R, 1>(a, d, w, stride, token, used, values, i);
        };
        r + 1 < rows ? run(std::true_type()) : run(std::false_type());
    }
}

template <typename V>
void run_item_plain(const paged_attention_problem &p, const paged_attention_arguments &a,
                    const work_item &item, float *scratch, float *partial) {
    constexpr float minus_infinity = -std::numeric_limits<float>::infinity();
    const scratch_layout layout(p);
    const auto &o = p.options;
    const dim group = p.q_heads / p.kv_heads, d = p.head_size, bs = p.block_size;
    const dim q_begin = a.query_start_loc[item.seq];
    const dim q_len = a.query_start_loc[item.seq + 1] - q_begin;
    const dim seq_len = a.seq_lens[item.seq];
    const dim context = seq_len - q_len;
    const dim rows = (item.last_token - item.first_token) * group;
    float *q = scratch + layout.q, *acc = scratch + layout.acc, *scores = scratch + layout.scores;
    float *row_max = scratch + layout.row_max, *row_sum = scratch + layout.row_sum;
    float *k_row = scratch + layout.k_row, *v_chunk = scratch + layout.v_chunk;

    const item_rows rows_info = prepare_rows(p, a, item, q, acc, row_max, row_sum, partial);
    const bool k_per_token = rows_info.k_per_token, v_per_token = rows_info.v_per_token;
    const float out_factor = rows_info.out_factor;
    const dim kv_begin = item.kv_begin, kv_end = item.kv_end; // the plan's range (each row masks its own)

    const data_type k_type = p.k_cache.get_data_type(), v_type = p.v_cache.get_data_type();
    const dim k_size = static_cast<dim>(data_type_size(k_type)),
              v_size = static_cast<dim>(data_type_size(v_type));
    const dims &ks = p.k_cache.get_strides(), &vs = p.v_cache.get_strides();
    const char *k_base = static_cast<const char *>(a.k_cache) + item.kv_head * ks[1] * k_size;
    const char *v_base = static_cast<const char *>(a.v_cache) + item.kv_head * vs[1] * v_size;

    for (dim j0 = kv_begin; j0 < kv_end;) {
        const dim logical_block = j0 / bs;
        const dim j1 = std::min({ kv_end, (logical_block + 1) * bs, j0 + chunk });
        const dim block = a.block_table[item.seq * a.block_table_stride + logical_block];
        const dim n = j1 - j0;

        for (dim r = 0; r < rows; ++r)
            std::fill(scores + r * chunk, scores + r * chunk + n, minus_infinity);
        for (dim j = j0; j < j1; ++j) {
            const dim offset = j - logical_block * bs;
            const float k_scale =
                    k_per_token ? row_scale(a.k_scales, p.k_scales_mask, p, block, item.kv_head, offset)
                                : 1.f;
            dequantize_row<V>(k_base + (block * ks[0] + offset * ks[2]) * k_size, k_type, d, k_scale, k_row);
            auto score = [&](dim r, float x) { // x: row r's dot product, kept where j is visible to it
                const dim position = context + item.first_token + r / group;
                const kv_range visible = visible_range(o, position, seq_len);
                if (j < visible.begin || j >= visible.end) return;
                if (o.soft_cap > 0.f) x = o.soft_cap * std::tanh(x / o.soft_cap);
                if (a.alibi_slopes)
                    x += a.alibi_slopes[item.kv_head * group + r % group] * static_cast<float>(j - position);
                scores[r * chunk + (j - j0)] = x;
            };
            dim r = 0;
            for (; r + 4 <= rows; r += 4) { // (the products of a row that does not see j are dropped)
                float x[4];
                dot4<V>(q + r * d, d, k_row, x);
                for (int i = 0; i < 4; ++i)
                    score(r + i, x[i]);
            }
            for (; r < rows; ++r)
                score(r, dot<V>(q + r * d, k_row, d));
        }

        for (dim r = 0; r < rows; ++r) {
            float *s = scores + r * chunk;
            float chunk_max = minus_infinity;
            for (dim j = 0; j < n; ++j)
                chunk_max = std::max(chunk_max, s[j]);
            if (chunk_max == minus_infinity) { // nothing visible to this row here
                std::fill(s, s + n, 0.f);
                continue;
            }
            const float new_max = std::max(row_max[r], chunk_max);
            const float correction = std::exp(row_max[r] - new_max);
            row_max[r] = new_max;
            row_sum[r] *= correction;
            if (correction != 1.f)
                for (dim i = 0; i < d; i += V::width)
                    V::store(acc + r * d + i, V::mul(V::set1(correction), V::load(acc + r * d + i)));
            float padded[chunk];
            for (dim j = 0; j < chunk; ++j)
                padded[j] = j < n ? s[j] - new_max : -1e30f;
            for (dim j = 0; j < chunk; j += V::width)
                V::store(padded + j, exp_negative<V>(V::load(padded + j)));
            float sum = row_sum[r]; // (a local: through row_sum[r] each add waited for the last store)
            for (dim j = 0; j < n; ++j) {
                s[j] = s[j] == minus_infinity ? 0.f : padded[j]; // masked scores weigh exactly 0
                sum += s[j];
            }
            row_sum[r] = sum;
        }

        // The V rows some row weighs, dequantized side by side (a row masked for every row is not
        // even read), then weighed into the accumulators.
        dim token[chunk], used = 0;
        for (dim j = j0; j < j1; ++j) {
            const dim offset = j - logical_block * bs;
            bool weighed = false;
            for (dim r = 0; r < rows && !weighed; ++r)
                weighed = scores[r * chunk + (j - j0)] != 0.f;
            if (!weighed) continue;
            const float v_scale =
                    v_per_token ? row_scale(a.v_scales, p.v_scales_mask, p, block, item.kv_head, offset)
                                : 1.f;
            dequantize_row<V>(v_base + (block * vs[0] + offset * vs[2]) * v_size, v_type, d, v_scale,
                              v_chunk + used * d);
            token[used++] = j - j0;
        }
        add_weighted_rows<V>(acc, rows, d, scores, chunk, token, used, v_chunk);
        j0 = j1;
    }

    store_item_output(p, a, item, acc, row_max, row_sum, out_factor, partial);
}

// Whether FP8 codes hold a special code, asked of the codes as a loop decodes them (n a multiple of
// 16 per call): e4m3's NaN (S.1111.111, magnitude 0x7F), e5m2's inf and NaN (S.11111.MM, magnitude
// 0x7C and up). Where V::fp8_patch_skippable, the loops decode without the patch for them (3 or 4
// vector operations per 8 or 16 codes beside the decoding's) and check the codes as they go (2
// per 32 codes), redoing their work with the patch if one turns up. A scan of each chunk before
// its passes, a second pass over the codes, had cost ~10% in cache (x64:avx512 on Zen 5, x64:avx2
// on Zen 3), mostly for bringing the chunk into L1 apart from the FMAs.
class fp8_special_check {
    __m256i largest_ = _mm256_setzero_si256();
#ifdef __AVX512F__
    __m512i largest512_ = _mm512_setzero_si512(); // 64 codes at a time (merged by largest())
#endif
    char first_special_;

    __m256i largest() const {
#ifdef __AVX512F__
        return _mm256_max_epu8(largest_, _mm256_max_epu8(_mm512_castsi512_si256(largest512_),
                                                         _mm512_extracti64x4_epi64(largest512_, 1)));
#else
        return largest_;
#endif
    }

public:
    explicit fp8_special_check(data_type dt = data_type::f8_e4m3)
        : first_special_(dt == data_type::f8_e4m3 ? 0x7F : 0x7C) {}
    void add(__m256i codes) {
        largest_ = _mm256_max_epu8(largest_, _mm256_and_si256(codes, _mm256_set1_epi8(0x7F)));
    }
    void add(const char *codes, dim n) {
        dim i = 0;
        for (; i + 32 <= n; i += 32)
            add(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(codes + i)));
        if (i < n) // 16 codes
            add(_mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(codes + i))));
    }
#ifdef __AVX512F__
    void add(__m512i codes) {
        largest512_ = _mm512_max_epu8(largest512_, _mm512_and_si512(codes, _mm512_set1_epi8(0x7F)));
    }
#endif
    void add(const fp8_special_check &other) {
        largest_ = _mm256_max_epu8(largest_, other.largest());
    }
    bool found() const { // some byte of largest() >= first_special_
        const __m256i m = largest();
        return _mm256_movemask_epi8(
                       _mm256_cmpeq_epi8(_mm256_max_epu8(m, _mm256_set1_epi8(first_special_)), m)) != 0;
    }
};

// The FP8 values one V::fp8_by_parity call splits: with 8-lane vectors the 32 codes at `row` (a V
// row's two 8-dim vectors: `other` is row + 16 then), with 16 lanes those and the 32 at `other`
// (the next 16 dims' V row) in the high half. Checked for specials into `check` where asked.
template <typename V, bool check_codes>
__attribute__((always_inline)) inline auto load_parity_codes(const char *row, const char *other,
                                                             fp8_special_check &check) {
    const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(row));
    if constexpr (check_codes) check.add(low);
    if constexpr (V::width == 8) {
        (void)other;
        return low;
    } else {
#ifdef __AVX512F__
        const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(other));
        if constexpr (check_codes) check.add(high);
        return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
#endif
    }
}

// The next chunk is fetched while this one computes, a cache line at a time inside the inner loops:
// each load of the current chunk is paired with a prefetch of the element at the same position in
// the next chunk, `ahead` bytes further on (0 when there is no next chunk: the lines prefetched are
// then the current ones, already cached). Spread like this the loads overlap the FMAs (issued in one
// burst at the chunk's start, they filled the miss queues and stalled the core for about the memory
// time); into L2 (T1), since the next chunk's 32 KiB of bf16 K and V would evict the current V and
// the accumulators from the 32 KiB L1.
__attribute__((always_inline)) inline void prefetch_ahead(const char *current, dim ahead) {
    _mm_prefetch(current + ahead, _MM_HINT_T1);
}

// Into L1: small reads the next steps need soon (per-token scales).
__attribute__((always_inline)) inline void prefetch_line(const float *line) {
    _mm_prefetch(reinterpret_cast<const char *>(line), _MM_HINT_T0);
}

// Scores of N rows against G 16-token groups of packed K blocks: out[r][16 g + t] = q_r . k_t of
// group g. The groups' pair of dims is decoded first, then each row's two q values are broadcast
// once and used at once: N x lanes x G accumulators + 2 x lanes x G K vectors + 2 broadcasts fit
// the 16 ymm registers of AVX2 for N = 4, G = 1 (an accumulator spilled to the stack would put a
// store-to-load forward into its dependency chain). With 16-lane vectors a broadcast serves 2
// groups (G = 2): one per FMA, with the keys' loads and the prefetches, was more than the core's
// ~2 loads per cycle (bare loop: 16 FMAs, each with its own broadcast, plus 4 key loads and 2
// prefetches, 12.4 cycles; 8.5 with the broadcasts in registers).
//
// check_nan (FP8 by parity only, without the patch): returns whether the codes held a special (e4m3
// NaN, e5m2 inf or NaN), so that the caller redoes the groups with the patch.
template <typename V, int N, int G, data_type k_type, bool may_hold_nan = true, bool check_nan = false>
bool packed_scores(const char *const *k_groups, dim k_size, const float *q, dim d, float *out, dim out_stride,
                   const dim *ahead) {
    using R = typename V::reg;
    constexpr int width = V::width, lanes = 16 / width;
    constexpr dim pair_bytes = 32 * (k_type == data_type::f32                                ? 4
                                     : k_type == data_type::bf16 || k_type == data_type::f16 ? 2
                                                                                             : 1);
    // Each sum is split over `chains` accumulators (the first and second of a pair, and with 32
    // registers the pairs' parity too), so that 8 or more FMAs are in flight: with one per (row,
    // vector) the 16-lane kernel's 4 decode rows ran 4 chains of 2 dependent FMAs per pair,
    // bound by the FMA latency at half the FMA throughput. 16 ymm registers hold 8 sums at most
    // (N = 4, two vectors each: 8 chains already).
    constexpr int registers = width == 16 ? 32 : 16;
    constexpr int sums = N * lanes * G, keys = 2 * lanes * G;
    constexpr int chains = 4 * sums + keys + 2 <= registers ? 4 : 2 * sums + keys + 2 <= registers ? 2 : 1;
    R s[N][G][lanes][chains];
    for (int r = 0; r < N; ++r)
        for (int g = 0; g < G; ++g)
            for (int v = 0; v < lanes; ++v)
                for (int c = 0; c < chains; ++c)
                    s[r][g][v][c] = V::zero();
    constexpr int pairs_per_step = chains == 4 ? 2 : 1; // d / 2 is a multiple of 4 (d % 8 == 0)
    // FP8 keys with 8-lane vectors by the tokens' parity (V::fp8_by_parity): lane vector 0
    // holds the even tokens, 1 the odd ones, interleaved back when the scores are stored.
    constexpr bool by_parity = V::fp8_pairs_by_parity && is_fp8(k_type) && lanes == 2;
    static_assert(by_parity || !check_nan, "checked as read: FP8 by parity only");
    fp8_special_check nan_check(k_type);
    for (dim pair0 = 0; pair0 < d / 2; pair0 += pairs_per_step)
        for (int h = 0; h < pairs_per_step; ++h) {
            const dim pair = pair0 + h;
            R first[G][lanes], second[G][lanes];
            for (int g = 0; g < G; ++g) {
                if constexpr (by_parity) {
                    const __m256i codes =
                            _mm256_loadu_si256(reinterpret_cast<const __m256i *>(k_groups[g] + pair * 32));
                    if constexpr (check_nan) nan_check.add(codes);
                    V::template fp8_by_parity<k_type, may_hold_nan>(codes, first[g][0], second[g][0],
                                                                    first[g][1], second[g][1]);
                    continue;
                }
                for (int v = 0; v < lanes; ++v)
                    V::template load_pair<may_hold_nan>(k_groups[g] + (pair * 32 + v * 2 * width) * k_size,
                                                        k_type, first[g][v], second[g][v]);
            }
            for (int g = 0; g < G; ++g)
                for (dim line = 0; line < pair_bytes; line += 64)
                    prefetch_ahead(k_groups[g] + pair * pair_bytes + line, ahead[g]);
            // the first of the pair into chain c, the second into c + 1 (one chain: both into 0)
            constexpr int second_offset = chains > 1 ? 1 : 0;
            const int c = chains == 4 ? 2 * h : 0;
            for (int r = 0; r < N; ++r) {
                const R q0 = V::set1(q[r * d + 2 * pair]);
                for (int g = 0; g < G; ++g)
                    for (int v = 0; v < lanes; ++v)
                        s[r][g][v][c] = V::fma(q0, first[g][v], s[r][g][v][c]);
                const R q1 = V::set1(q[r * d + 2 * pair + 1]);
                for (int g = 0; g < G; ++g)
                    for (int v = 0; v < lanes; ++v)
                        s[r][g][v][c + second_offset] =
                                V::fma(q1, second[g][v], s[r][g][v][c + second_offset]);
            }
        }
    for (int r = 0; r < N; ++r)
        for (int g = 0; g < G; ++g) {
            R sums[lanes];
            for (int v = 0; v < lanes; ++v) {
                sums[v] = s[r][g][v][0];
                for (int c = 1; c < chains; ++c)
                    sums[v] = V::add(sums[v], s[r][g][v][c]);
            }
            if constexpr (by_parity)
                V::store_pair(out + r * out_stride + g * 16, sums[0], sums[1]);
            else
                for (int v = 0; v < lanes; ++v)
                    V::store(out + r * out_stride + g * 16 + v * width, sums[v]);
        }
    return check_nan && nan_check.found();
}

// Scores by bf16 pair products of N rows against G 16-token groups: q_pairs holds the rows' q as
// bf16 pairs, pair-major (pair i of row r at i * N + r); the scores are multiplied by `factor` (the
// softmax scale and any folded K scale) after the sums. Each q broadcast serves the G groups, each
// key the N rows. vdpbf16ps takes several cycles: with few sums (N x G) each is split over `chains`
// accumulators (the pairs taken in turn), so that 12 to 16 are in flight.
template <typename V, int N, int G, data_type k_type>
void packed_pair_scores(const char *const *k_groups, dim k_size, const uint32_t *q_pairs, dim d, float factor,
                        float *out, dim out_stride, const dim *ahead) {
    using R = typename V::reg;
    constexpr int sums = N * G, chains = sums >= 12 ? 1 : sums >= 6 ? 2 : sums >= 3 ? 4 : 8; // d / 2: 8 x
    R s[N][G][chains];
    for (int r = 0; r < N; ++r)
        for (int g = 0; g < G; ++g)
            for (int c = 0; c < chains; ++c)
                s[r][g][c] = V::zero();
    // FP8 keys are decoded two rows of pairs (64 codes, one line) at a time: the byte tables' cost
    // per code halves.
    constexpr int rows_per_load = k_type == data_type::bf16 ? 1 : 2;
    constexpr int step = chains > rows_per_load ? chains : rows_per_load; // d / 2: 8 x
    for (dim pair = 0; pair < d / 2; pair += step)
        for (int c = 0; c < step; c += rows_per_load) {
            typename V::pairs k[rows_per_load][G];
            for (int g = 0; g < G; ++g) {
                const char *k_pairs = k_groups[g] + (pair + c) * 32 * k_size; // 64 bytes (bf16) or 32 (FP8)
                if constexpr (rows_per_load == 2)
                    V::load_two_bf16_pairs(k_pairs, k_type, k[0][g], k[1][g]);
                else
                    k[0][g] = V::load_bf16_pairs(k_pairs, k_type);
                if (k_type == data_type::bf16 || (pair + c) % 2 == 0) prefetch_ahead(k_pairs, ahead[g]);
            }
            for (int h = 0; h < rows_per_load; ++h) {
                const int chain = (c + h) % chains;
                for (int r = 0; r < N; ++r) {
                    const typename V::pairs q = V::broadcast_pair(q_pairs[(pair + c + h) * N + r]);
                    for (int g = 0; g < G; ++g)
                        s[r][g][chain] = V::dot_pairs(s[r][g][chain], q, k[h][g]);
                }
            }
        }
    for (int r = 0; r < N; ++r)
        for (int g = 0; g < G; ++g) {
            for (int c = 1; c < chains; ++c)
                s[r][g][0] = V::add(s[r][g][0], s[r][g][c]);
            V::store(out + r * out_stride + g * 16, V::mul(s[r][g][0], V::set1(factor)));
        }
}

// Rows per score pass with pair products, of an item's `rows`. bf16 keys: up to 4, each pass
// against up to 4 groups (a q broadcast and a key load serve 4 products). FP8 keys: up to 16 (a
// verify step's 4 tokens x 4 q heads in one), one group at a time, so that each key decoded serves
// them all. bf16 keys of items of 8 to 16 rows (verify) too: each key then read once per chunk
// rather than once per 4 rows (verify q_len 4 from memory 5-7% faster in 3 alternating pairs of
// runs); with more rows (prefill) 4-row passes were 5-6% faster.
inline dim pair_row_block(dim remaining_rows, dim rows, data_type k_type) {
    if ((k_type != data_type::bf16 || rows <= 16) && remaining_rows >= 8)
        return remaining_rows >= 16 ? 16 : 8;
    return std::min<dim>(4, remaining_rows);
}

constexpr int max_chunk_groups = packed_chunk / 16;

// One block of rows' share of a packed V chunk: acc = acc * correction + probabilities x V. The
// chunk's 16-token groups may lie in different blocks (small block sizes): group g's values start
// at group[g] (its first token pair, dims 0..15), and the groups of 16 dims are dims_group_stride
// bytes apart.
struct packed_values_rows {
    const char *group[max_chunk_groups];
    dim ahead[max_chunk_groups]; // bytes from group g's values to the next chunk's group g
    dim dims_group_stride;
    data_type v_type;
    dim v_size, g0, first_pair, end_pair;
    dim common_begin, common_end; // tokens every row of the block sees
    const float *probability;     // rows x packed_chunk
    // The probabilities rounded to bf16, as token pairs (rows x packed_chunk / 2), where the dst is
    // bf16 and values are bf16 or FP8 (pair products only), else null: see packed_values_slice.
    const uint32_t *probability_pairs;
    const float *correction;
    float *acc; // rows x d
    dim d;
};

// Pairs every row sees take the fast path; at range edges a token a row does not see is skipped
// for it, so that a non-finite value it excludes cannot leak in through 0 * inf.
// S dim vectors starting at vector v0, for N rows: the accumulators stay in registers across the
// token pairs, and each probability is broadcast once for all S vectors. Inlined into
// packed_values' loop over the slices (a call per slice cost ~50 cycles).
//
// With probability_pairs (bf16 dst): the V rows, which hold each dim's values of a token pair side by
// side, are bf16 pairs already, so one vdpbf16ps per row adds both tokens' products: half the
// FMAs, and no split of the pairs into f32. The probabilities are then rounded to bf16, an error of
// the order of the dst's own rounding (under fpmath strict f32 and f16 dst keep them in f32).
//
// check_nan (FP8 by parity only, without the patch): returns whether the codes held a special, before
// storing anything, so that the caller redoes the slice with the patch from the same accumulators.
template <typename V, int N, int S, data_type v_type, bool may_hold_nan, bool pair_probabilities = false,
          bool check_nan = false>
__attribute__((always_inline)) inline bool packed_values_slice(const packed_values_rows &job, dim v0) {
    using R = typename V::reg;
    constexpr int width = V::width;
    dim offset_in_group[S]; // of vector v0 + i within a group's V rows, the same for every pair
    for (int i = 0; i < S; ++i) {
        const dim dv = (v0 + i) * width;
        offset_in_group[i] = (dv / 16) * job.dims_group_stride + dv % 16 * 2 * job.v_size;
    }
    auto row_of = [&](int i, dim pair) { // the V row holding vector v0 + i for a token pair (>= 0)
        const auto u = static_cast<size_t>(pair);
        return job.group[u / 8] + offset_in_group[i] + static_cast<dim>(u % 8) * 32 * job.v_size;
    };
    // odd: the odd token pairs' sums with pair products, where N x S sums alone are too few (below)
    constexpr bool odd_sums = pair_probabilities && N * S <= 8;
    // FP8 values by the dims' parity (V::fp8_by_parity): vectors i and i + 1 (i even, as v0 is for
    // S >= 2) hold the even and the odd dims of their 2 x width dims (8 lanes: a 16-dim row; 16
    // lanes: two rows, the first's in lanes 0..7), split from the accumulators when loaded and
    // interleaved back when stored.
    constexpr bool by_parity = V::fp8_pairs_by_parity && is_fp8(v_type) && S % 2 == 0;
    constexpr int row_step = by_parity ? 2 : 1; // vectors decoded together
    static_assert(by_parity || !check_nan, "checked as read: FP8 by parity only");
    fp8_special_check nan_check(v_type);
    // p: vector i's V row for a token pair; other: vector i + 1's.
    auto decode_by_parity = [&](const char *p, const char *other, auto &even_first, auto &even_second,
                                auto &odd_first, auto &odd_second) __attribute__((always_inline)) {
        if constexpr (by_parity) {
            const auto codes = load_parity_codes<V, check_nan>(p, other, nan_check);
            V::template fp8_by_parity<v_type, may_hold_nan>(codes, even_first, even_second, odd_first,
                                                            odd_second);
        }
    };
    R out[N][S], odd[N][S];
    for (int r = 0; r < N; ++r)
        for (int i = 0; i < S; i += row_step) {
            const float *a = job.acc + r * job.d + (v0 + i) * width;
            if constexpr (by_parity)
                V::template load_pair<true>(a, data_type::f32, out[r][i], out[r][i + 1]);
            else
                out[r][i] = V::load(a);
            for (int h = 0; h < row_step; ++h) {
                out[r][i + h] = V::mul(out[r][i + h], V::set1(job.correction[r]));
                if constexpr (odd_sums) odd[r][i + h] = V::zero();
            }
        }
    // Pairs every row sees: plain FMAs. At the range's edges, a token a row does not see is
    // skipped for that row, so that 0 * (a non-finite value it excludes) cannot leak in.
    const dim fast_begin = std::max(job.first_pair, (job.common_begin - job.g0 + 1) / 2);
    const dim fast_end = std::max(fast_begin, std::min(job.end_pair, (job.common_end - job.g0) / 2));
    // The S vectors of a token pair are decoded first, then each row's two probabilities are
    // broadcast once: N x S accumulators + 2 x S values + 2 broadcasts stay in registers.
    // One 16-token group (8 pairs) at a time, its rows walked by a step of one token pair.
    for (dim group_begin = fast_begin; group_begin < fast_end;) {
        const dim group_end = std::min(fast_end, (group_begin / 8 + 1) * 8);
        const char *rows[S];
        for (int i = 0; i < S; ++i)
            rows[i] = row_of(i, group_begin);
        const dim ahead = job.ahead[group_begin / 8], step = 32 * job.v_size;
        // One prefetch per cache line: with 8-lane vectors a 16-dim group's pair of 16-bit or FP8
        // values (<= 64 bytes) is two vectors, the first at an even index (slices of S >= 2 start
        // at an even v0).
        auto starts_line = [](int i) {
            return !(width == 8 && v_type != data_type::f32 && S >= 2 && i % 2 == 1);
        };
        // The lines prefetched advance by a constant per token pair, the pairs being walked in
        // order from group_begin (indexed by the pair, the loop's scalar work and spills had
        // outweighed its products).
        const char *prefetch_at[S];
        for (int i = 0; i < S; ++i)
            prefetch_at[i] = rows[i] + ahead;
        auto prefetch_next = [&]() __attribute__((always_inline)) {
            for (int i = 0; i < S; ++i) {
                if (starts_line(i)) _mm_prefetch(prefetch_at[i], _MM_HINT_T1);
                prefetch_at[i] += step;
            }
        };
        if constexpr (pair_probabilities) {
            // vdpbf16ps has a latency of several cycles (6 on Zen 5) and N x S sums (4 in decode's
            // bf16 slices, 8 in its FP8 ones) kept it below its throughput: there the odd token
            // pairs add into a second set of sums (`odd`, merged after the slice), as many again in
            // flight. Not with 16 sums already (8-row passes): 32 spilled to the stack.
            // The values and probabilities advance by a constant per token pair too.
            using P = typename V::pairs;
            const char *values_at[S];
            for (int i = 0; i < S; ++i)
                values_at[i] = rows[i];
            const uint32_t *weights = job.probability_pairs + group_begin; // row r's at r * packed_chunk / 2
            auto accumulate_pairs = [&](const uint32_t *w, const P(&values)[S], R(&sums)[N][S])
                    __attribute__((always_inline)) {
                for (int r = 0; r < N; ++r) {
                    const P weight = V::broadcast_pair(w[r * (packed_chunk / 2)]);
                    for (int i = 0; i < S; ++i)
                        sums[r][i] = V::dot_pairs(sums[r][i], weight, values[i]);
                }
            };
            dim pair = group_begin;
            for (; pair + 1 < group_end; pair += 2) { // two pairs (FP8: 64 codes, a line, decoded at once)
                P values[S], next[S];
                for (int i = 0; i < S; ++i) {
                    if constexpr (v_type != data_type::bf16)
                        V::load_two_bf16_pairs(values_at[i], v_type, values[i], next[i]);
                    else
                        values[i] = V::load_bf16_pairs(values_at[i], v_type),
                        next[i] = V::load_bf16_pairs(values_at[i] + step, v_type);
                    values_at[i] += 2 * step;
                }
                prefetch_next();
                prefetch_next();
                accumulate_pairs(weights, values, out);
                if constexpr (odd_sums)
                    accumulate_pairs(weights + 1, next, odd);
                else
                    accumulate_pairs(weights + 1, next, out);
                weights += 2;
            }
            if (pair < group_end) {
                P values[S];
                for (int i = 0; i < S; ++i)
                    values[i] = V::load_bf16_pairs(values_at[i], v_type);
                prefetch_next();
                accumulate_pairs(weights, values, out);
            }
            group_begin = group_end;
            continue;
        }
        auto accumulate = [&](dim pair, const R(&first)[S], const R(&second)[S])
                __attribute__((always_inline)) {
            prefetch_next(); // (pairs in order: each call is the next pair's)
            for (int r = 0; r < N; ++r) {
                // Each broadcast used at once, and each FMA adding into its accumulator in place
                // (nested FMAs made the compiler copy a broadcast per row).
                const R w0 = V::set1(job.probability[r * packed_chunk + 2 * pair]);
                for (int i = 0; i < S; ++i)
                    out[r][i] = V::fma(w0, first[i], out[r][i]);
                const R w1 = V::set1(job.probability[r * packed_chunk + 2 * pair + 1]);
                for (int i = 0; i < S; ++i)
                    out[r][i] = V::fma(w1, second[i], out[r][i]);
            }
        };
        for (dim pair = group_begin; pair < group_end;) {
            R first[S], second[S];
            if constexpr (V::fp8_by_table && (v_type == data_type::f8_e4m3 || v_type == data_type::f8_e5m2)) {
                if (pair + 1 < group_end) { // two pairs (64 codes, a line) decoded at a time
                    __m512i next[S];
                    for (int i = 0; i < S; ++i) {
                        __m512i x;
                        V::load_two_fp8_as_bf16(rows[i] + (pair - group_begin) * step, v_type, x, next[i]);
                        V::split_pairs(x, first[i], second[i]);
                    }
                    accumulate(pair, first, second);
                    for (int i = 0; i < S; ++i)
                        V::split_pairs(next[i], first[i], second[i]);
                    accumulate(pair + 1, first, second);
                    pair += 2;
                    continue;
                }
            }
            for (int i = 0; i < S; i += row_step)
                if constexpr (by_parity)
                    decode_by_parity(rows[i] + (pair - group_begin) * step,
                                     rows[i + 1] + (pair - group_begin) * step, first[i], second[i],
                                     first[i + 1], second[i + 1]);
                else
                    V::template load_pair<may_hold_nan>(rows[i] + (pair - group_begin) * step, v_type,
                                                        first[i], second[i]);
            accumulate(pair, first, second);
            ++pair;
        }
        group_begin = group_end;
    }
    for (dim pair = job.first_pair; pair < job.end_pair; ++pair) {
        if (pair == fast_begin) pair = fast_end;
        if (pair >= job.end_pair) break;
        for (int i = 0; i < S; i += row_step) {
            R first[row_step], second[row_step];
            if constexpr (by_parity)
                decode_by_parity(row_of(i, pair), row_of(i + 1, pair), first[0], second[0], first[1],
                                 second[1]);
            else
                V::template load_pair<may_hold_nan>(row_of(i, pair), v_type, first[0], second[0]);
            for (int h = 0; h < row_step; ++h)
                for (int r = 0; r < N; ++r) {
                    const float *pr = job.probability + r * packed_chunk + 2 * pair;
                    if (pr[0] != 0.f) out[r][i + h] = V::fma(V::set1(pr[0]), first[h], out[r][i + h]);
                    if (pr[1] != 0.f) out[r][i + h] = V::fma(V::set1(pr[1]), second[h], out[r][i + h]);
                }
        }
    }
    if constexpr (check_nan)
        if (nan_check.found()) return true;
    for (int r = 0; r < N; ++r)
        for (int i = 0; i < S; i += row_step) {
            for (int h = 0; h < row_step; ++h)
                if constexpr (odd_sums) out[r][i + h] = V::add(out[r][i + h], odd[r][i + h]);
            float *a = job.acc + r * job.d + (v0 + i) * width;
            if constexpr (by_parity)
                V::store_pair(a, out[r][i], out[r][i + 1]);
            else
                V::store(a, out[r][i]);
        }
    return false;
}

// acc (N rows x D) = acc * correction + probabilities x V for one packed V group, in slices of
// dims sized to the register file (32 zmm, 16 ymm).
//
// check_nan (FP8 by parity): special codes checked for as each slice reads them, the slice redone
// with the patch if one turns up (slices of an odd S, not by parity, always patched).
template <typename V, int N, data_type v_type, bool may_hold_nan = true, bool pair_probabilities = false,
          bool check_nan = false>
void packed_values(const packed_values_rows &job) {
    // N x S accumulators + 2 x S values + 2 broadcasts within the register file (32 zmm, 16 ymm).
    // But decode's 4-row passes (a GQA group of 4) by pair products read fewer 16-dim rows of a V
    // region side by side: bf16 one, each read through before the next (from memory 5-10% more
    // GB/s than 4 side by side: 8 x 8192 decode 0.83-0.86 of the DRAM read against 0.76-0.82 in 8
    // alternating runs, though ~10% slower on cache-resident data), FP8 two (one cost it 3-5% in
    // compute; two read ~6% more than 4 in 4 alternating runs, and are as fast in cache). Fewer
    // rows keep the default: a slice of one row would have too few sums in flight.
    constexpr bool decode_pairs = pair_probabilities && N == 4;
    constexpr int widest = decode_pairs     ? (v_type == data_type::bf16 ? 1 : 2)
                           : V::width == 16 ? (N > 4   ? 2
                                               : N > 1 ? 4
                                                       : 8)
                                            : (N > 1 ? 2 : 4);
    auto slice = [&](auto vectors_in_slice, dim v0) __attribute__((always_inline)) {
        constexpr int S = decltype(vectors_in_slice)::value;
        if constexpr (check_nan && S % 2 == 0) {
            if (packed_values_slice<V, N, S, v_type, false, pair_probabilities, true>(job, v0))
                packed_values_slice<V, N, S, v_type, true, pair_probabilities>(job, v0);
        } else {
            packed_values_slice<V, N, S, v_type, may_hold_nan || check_nan, pair_probabilities>(job, v0);
        }
    };
    const dim vectors = job.d / V::width;
    dim v0 = 0;
    for (; v0 + widest <= vectors; v0 += widest)
        slice(std::integral_constant<int, widest> {}, v0);
    if (widest > 4 && v0 + 4 <= vectors) slice(std::integral_constant<int, 4> {}, v0), v0 += 4;
    if (v0 + 2 <= vectors) slice(std::integral_constant<int, 2> {}, v0), v0 += 2;
    if (v0 < vectors) slice(std::integral_constant<int, 1> {}, v0);
}

// FP8 keys by parity: special codes are checked for as the keys are read (no scan), the groups
// redone with the patch if one turns up.
template <typename V, int N, int G, data_type k_type>
void packed_scores_checked(const char *const *k_groups, dim k_size, const float *q, dim d, float *out,
                           dim out_stride, const dim *ahead) {
    if (packed_scores<V, N, G, k_type, false, true>(k_groups, k_size, q, d, out, out_stride, ahead))
        packed_scores<V, N, G, k_type>(k_groups, k_size, q, d, out, out_stride, ahead);
}

// The cache type as a template argument, so that the decoding in the inner loops is fixed at
// compile time; N rows against G groups.
template <typename V, int N, int G>
void packed_scores_of(data_type k_type, const char *const *k_groups, dim k_size, const float *q, dim d,
                      float *out, dim out_stride, const dim *ahead) {
    switch (k_type) {
        case data_type::f32:
            packed_scores<V, N, G, data_type::f32>(k_groups, k_size, q, d, out, out_stride, ahead);
            break;
        case data_type::bf16:
            packed_scores<V, N, G, data_type::bf16>(k_groups, k_size, q, d, out, out_stride, ahead);
            break;
        case data_type::f16:
            packed_scores<V, N, G, data_type::f16>(k_groups, k_size, q, d, out, out_stride, ahead);
            break;
        default: // FP8 by parity, 8 lanes (16 lanes: packed_scores_groups takes it by lines)
            if constexpr (V::width == 8) {
                if (k_type == data_type::f8_e4m3)
                    packed_scores_checked<V, N, G, data_type::f8_e4m3>(k_groups, k_size, q, d, out,
                                                                       out_stride, ahead);
                else
                    packed_scores_checked<V, N, G, data_type::f8_e5m2>(k_groups, k_size, q, d, out,
                                                                       out_stride, ahead);
            }
            break;
    }
}

#ifdef __AVX512F__
// Scores of N rows (up to 8) against one 16-token group of FP8 keys, with 16-lane vectors: a line
// (dim pairs 2u and 2u + 1 of the 16 tokens) per load, split by V::fp8_by_parity into pair 2u's
// even (odd) tokens in lanes 0..7 and pair 2u + 1's in lanes 8..15, so that each vector is
// multiplied by q's half-broadcasts ([q_4u x 8, q_4u+2 x 8] for the pairs' firsts, [q_4u+1 x 8,
// q_4u+3 x 8] for their seconds), and the halves added at the end. Joining two groups' rows for
// broadcast q instead (packed_scores' way) took a shuffle per 64 codes: on Zen 4, decode 1 x 1024
// e4m3 27.2 ns per (token, kv head) that way, 25.2 this way.
// The half-broadcasts are made from q's four values as each line needs them (a 16-byte broadcast
// load, two in-lane permutes), not stored once per item: stored, they took 4 KiB per row, 16 KiB
// for decode's 4 rows read per group, and the lines streaming through L1 evicted them, so that
// from DRAM the pass waited on their reloads beside its prefetches (Zen 5, decode 8 x 8192 e4m3:
// 5.81 -> 5.32 ms; in cache 7% slower, 0.079 -> 0.085 ms for 1 x 768).
// q: N rows of d. check_nan: as packed_scores'.
template <typename V, int N, data_type k_type, bool may_hold_nan, bool check_nan>
bool packed_scores_by_lines(const char *k_group, const float *q, dim d, float *out, dim out_stride,
                            dim ahead) {
    using R = typename V::reg;
    const __m512i first_lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2),
                  second_lanes = _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3);
    // With up to 4 rows the firsts and the seconds add into separate sums (2 chains), so that 16
    // FMAs are in flight; 8 rows have 16 sums of one chain each.
    constexpr int chains = N <= 4 ? 2 : 1, second_chain = chains - 1;
    R even[N][chains], odd[N][chains];
    for (int r = 0; r < N; ++r)
        for (int c = 0; c < chains; ++c)
            even[r][c] = odd[r][c] = V::zero();
    fp8_special_check nan_check(k_type);
    for (dim u = 0; u < d / 4; ++u) {
        const char *line = k_group + u * 64;
        const __m512i codes = _mm512_loadu_si512(line);
        if constexpr (check_nan) nan_check.add(codes);
        prefetch_ahead(line, ahead);
        R even_first, even_second, odd_first, odd_second;
        V::template fp8_by_parity<k_type, may_hold_nan>(codes, even_first, even_second, odd_first,
                                                        odd_second);
        for (int r = 0; r < N; ++r) {
            const __m512 four = _mm512_broadcast_f32x4(_mm_loadu_ps(q + r * d + 4 * u));
            const R firsts = _mm512_permutevar_ps(four, first_lanes),
                    seconds = _mm512_permutevar_ps(four, second_lanes);
            even[r][0] = V::fma(firsts, even_first, even[r][0]);
            odd[r][0] = V::fma(firsts, odd_first, odd[r][0]);
            even[r][second_chain] = V::fma(seconds, even_second, even[r][second_chain]);
            odd[r][second_chain] = V::fma(seconds, odd_second, odd[r][second_chain]);
        }
    }
    if constexpr (check_nan)
        if (nan_check.found()) return true;
    // Each sum's halves added ([even lanes 0..7 | odd lanes 0..7] + [even 8..15 | odd 8..15]), then
    // the even and odd tokens interleaved back.
    const __m512i interleave = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    for (int r = 0; r < N; ++r) {
        R e = even[r][0], o = odd[r][0];
        if constexpr (chains == 2) e = V::add(e, even[r][1]), o = V::add(o, odd[r][1]);
        const R halves = V::add(_mm512_shuffle_f32x4(e, o, _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm512_shuffle_f32x4(e, o, _MM_SHUFFLE(3, 2, 3, 2)));
        V::store(out + r * out_stride, _mm512_permutexvar_ps(interleave, halves));
    }
    return false;
}

#endif

// N rows against the chunk's groups: 2 at a time with 16-lane vectors (packed_scores), else 1;
// FP8 keys with 16 lanes one at a time by lines.
template <typename V, int N>
void packed_scores_groups(data_type k_type, const char *const *k_groups, dim groups, dim k_size,
                          const float *q, dim d, float *out, dim out_stride, const dim *ahead) {
    dim g = 0;
#ifdef __AVX512F__
    if constexpr (V::width == 16)
        if (is_fp8(k_type)) {
            static_assert(V::fp8_pairs_by_parity, "FP8 keys by lines split them by parity");
            auto by_lines = [&](auto format) {
                constexpr data_type dt = decltype(format)::value;
                for (; g < groups; ++g)
                    if (packed_scores_by_lines<V, N, dt, false, true>(k_groups[g], q, d, out + g * 16,
                                                                      out_stride, ahead[g]))
                        packed_scores_by_lines<V, N, dt, true, false>(k_groups[g], q, d, out + g * 16,
                                                                      out_stride, ahead[g]);
            };
            if (k_type == data_type::f8_e4m3)
                by_lines(std::integral_constant<data_type, data_type::f8_e4m3>());
            else
                by_lines(std::integral_constant<data_type, data_type::f8_e5m2>());
            return;
        }
#endif
    if constexpr (V::width == 16)
        for (; g + 2 <= groups; g += 2)
            packed_scores_of<V, N, 2>(k_type, k_groups + g, k_size, q, d, out + g * 16, out_stride,
                                      ahead + g);
    for (; g < groups; ++g)
        packed_scores_of<V, N, 1>(k_type, k_groups + g, k_size, q, d, out + g * 16, out_stride, ahead + g);
}

// N rows against G groups, the key type as a template argument.
template <typename V, int N, int G>
void packed_pair_scores_of(data_type k_type, const char *const *k_groups, dim k_size, const uint32_t *q_pairs,
                           dim d, float factor, float *out, dim out_stride, const dim *ahead) {
    if constexpr (V::pair_products) {
        switch (k_type) {
            case data_type::bf16:
                packed_pair_scores<V, N, G, data_type::bf16>(k_groups, k_size, q_pairs, d, factor, out,
                                                             out_stride, ahead);
                break;
            case data_type::f8_e4m3:
                packed_pair_scores<V, N, G, data_type::f8_e4m3>(k_groups, k_size, q_pairs, d, factor, out,
                                                                out_stride, ahead);
                break;
            default:
                packed_pair_scores<V, N, G, data_type::f8_e5m2>(k_groups, k_size, q_pairs, d, factor, out,
                                                                out_stride, ahead);
                break;
        }
    }
}

// N rows (1 to 4) against the chunk's groups, 4, 2 or 1 at a time.
template <typename V, int N>
void packed_pair_scores_groups(data_type k_type, const char *const *k_groups, dim groups, dim k_size,
                               const uint32_t *q_pairs, dim d, float factor, float *out, dim out_stride,
                               const dim *ahead) {
    for (dim g = 0; g < groups;) {
        const dim n = groups - g >= 4 ? 4 : groups - g >= 2 ? 2 : 1;
        float *o = out + g * 16;
        if (n == 4)
            packed_pair_scores_of<V, N, 4>(k_type, k_groups + g, k_size, q_pairs, d, factor, o, out_stride,
                                           ahead + g);
        else if (n == 2)
            packed_pair_scores_of<V, N, 2>(k_type, k_groups + g, k_size, q_pairs, d, factor, o, out_stride,
                                           ahead + g);
        else
            packed_pair_scores_of<V, N, 1>(k_type, k_groups + g, k_size, q_pairs, d, factor, o, out_stride,
                                           ahead + g);
        g += n;
    }
}

template <typename V, int N> void packed_values_of(const packed_values_rows &job) {
    if constexpr (V::pair_products) {
        if (job.probability_pairs) {
            switch (job.v_type) {
                case data_type::bf16: return packed_values<V, N, data_type::bf16, true, true>(job);
                case data_type::f8_e4m3: return packed_values<V, N, data_type::f8_e4m3, true, true>(job);
                case data_type::f8_e5m2: return packed_values<V, N, data_type::f8_e5m2, true, true>(job);
                default: break;
            }
        }
    }
    if constexpr (V::fp8_pairs_by_parity) // FP8 by parity: checked as read
        if (is_fp8(job.v_type))
            return job.v_type == data_type::f8_e4m3
                           ? packed_values<V, N, data_type::f8_e4m3, false, false, true>(job)
                           : packed_values<V, N, data_type::f8_e5m2, false, false, true>(job);
    switch (job.v_type) {
        case data_type::f32: packed_values<V, N, data_type::f32>(job); break;
        case data_type::bf16: packed_values<V, N, data_type::bf16>(job); break;
        case data_type::f16: packed_values<V, N, data_type::f16>(job); break;
        case data_type::f8_e4m3: packed_values<V, N, data_type::f8_e4m3>(job); break;
        default: packed_values<V, N, data_type::f8_e5m2>(job); break;
    }
}

// The type a chunk of FP8 or f16 K/V is decoded into when several passes read it: bf16 for FP8
// (exact, and loaded with two integer ops), f32 for f16 (not exact in bf16).
inline data_type decoded_type(data_type stored) {
    return is_fp8(stored) ? data_type::bf16 : data_type::f32;
}

// Stores load_pair's output at element `index` of a decoded copy of type dt (bf16 or f32), in the
// same pair order.
template <typename V>
void store_decoded(float *copy, data_type dt, dim index, typename V::reg first, typename V::reg second) {
    if (dt == data_type::bf16)
        V::store_pair_bf16(reinterpret_cast<uint16_t *>(copy) + index, first, second);
    else
        V::store_pair(copy + index, first, second);
}

// Whether V decodes dt with a patch for special codes that a check can let it skip.
template <typename V> bool special_patch_skippable(data_type dt) {
    return V::fp8_patch_skippable && is_fp8(dt);
}

// The FP8 codes of a decoded copy into bf16 words by V::fp8_to_bf16_words (x64:avx2): calls
// run(decode) with decode(codes, n, words, ahead, check) converting n codes (a multiple of 32), the
// codes checked for specials into `check` unless `patched`, a line prefetched `ahead` per 64 codes.
// The check runs in a local, kept in a register: through the reference, which the words' stores
// might alias, each maximum waited on the store of the one before (on Zen 3 the keys' copy took 33
// TSC ticks per (token, kv head) so, 14 this way; load_pair's path before, 26).
template <typename V, bool patched, typename Run> void with_fp8_to_bf16(data_type dt, Run run) {
    auto by_format = [&](auto format) {
        run([](const char *codes, dim n, uint16_t *words, dim ahead, fp8_special_check &check) {
            fp8_special_check run_check;
            for (dim i = 0; i < n; i += 32) {
                if (i % 64 == 0) prefetch_ahead(codes + i, ahead);
                const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(codes + i));
                if constexpr (!patched) run_check.add(x);
                V::template fp8_to_bf16_words<decltype(format)::value, patched>(x, words + i);
            }
            if constexpr (!patched) check.add(run_check);
        });
    };
    if (dt == data_type::f8_e4m3)
        by_format(std::integral_constant<data_type, data_type::f8_e4m3>());
    else
        by_format(std::integral_constant<data_type, data_type::f8_e5m2>());
}

// The packed layout (block_size % 16 == 0): chunks of up to eight 16-token groups, each found through
// the block table, so that small blocks (16, vLLM's default) get the same long inner loops as
// large ones.
template <typename V>
void run_item_packed(const paged_attention_problem &p, const paged_attention_arguments &a,
                     const work_item &item, const work_item *next_item, float *scratch, float *partial) {
    using R = typename V::reg;
    constexpr int width = V::width;
    // Rows whose scores stay in registers per pass of f32 products: 8 with 32 vector registers
    // (each key loaded and converted once for 8 rows: verify's 16 rows in 2 passes, not 4), 4 with 16.
    constexpr dim row_block = width == 16 ? 8 : 4;
    constexpr float minus_infinity = -std::numeric_limits<float>::infinity();
    const scratch_layout layout(p, V::tile_products);
    const auto &o = p.options;
    const dim group = p.q_heads / p.kv_heads, d = p.head_size, bs = p.block_size;
    const dim q_len = a.query_start_loc[item.seq + 1] - a.query_start_loc[item.seq];
    const dim seq_len = a.seq_lens[item.seq];
    const dim context = seq_len - q_len;
    const dim rows = (item.last_token - item.first_token) * group;
    float *q = scratch + layout.q, *acc = scratch + layout.acc, *probability = scratch + layout.scores;
    float *row_max = scratch + layout.row_max, *row_sum = scratch + layout.row_sum;
    float *correction = scratch + layout.correction;
    float *k_decoded = scratch + layout.k_chunk, *v_decoded = scratch + layout.v_chunk;
    const item_rows info = prepare_rows(p, a, item, q, acc, row_max, row_sum, partial, !V::pair_products);
    // bf16 dst: values by pair products with the probabilities rounded to bf16 (packed_values_slice).
    uint32_t *probability_pairs = V::pair_products && p.dst_type == data_type::bf16
                                          ? reinterpret_cast<uint32_t *>(scratch + layout.probability_pairs)
                                          : nullptr;

    const data_type k_type = p.k_cache.get_data_type(), v_type = p.v_cache.get_data_type();
    const dim k_size = static_cast<dim>(data_type_size(k_type)),
              v_size = static_cast<dim>(data_type_size(v_type));
    const cache_view k_view(p.k_cache, false), v_view(p.v_cache, true);
    // Pair products: q as bf16 pairs (exact: the query is bf16, so its bf16 bits are the f32's
    // high half), pair-major within each pass's block of rows (pair_row_block) so that the
    // pass's broadcasts address one pointer: packed in place over the first half of the f32 q
    // (pair i written at index i / 2 <= i after both of its values were read), then reordered
    // into the second half.
    // FP8 keys read by several passes of pair products are decoded once per chunk into bf16 pairs,
    // then scored as bf16 keys.
    // Tile products (x64:amx) for items of V::tile_min_rows rows or more (prefill, verify, large
    // GQA groups); fewer rows (decode) take the pair products, which read each key and value once
    // for all rows as well and leave no tile rows idle. Keys are staged for the tiles (decoded to
    // bf16, their pairs padded with zeros to a multiple of 32 dims) unless bf16 with D % 32 == 0.
    bool tiles = false;
    if constexpr (V::tile_products) tiles = rows >= V::tile_min_rows;
    const dim d_tiles = (d + 31) / 32 * 32, rows_tiles = (rows + 15) / 16 * 16;
    const bool tile_keys_staged = tiles && (k_type != data_type::bf16 || d % 32 != 0);
    const dim k_group_elements = 16 * (tiles ? d_tiles : d); // of a decoded group
    uint16_t *tile_q = reinterpret_cast<uint16_t *>(scratch + layout.tile_q);
    typename V::tiles tile_unit;
    const bool pair_keys_decoded_once = V::pair_products && !tiles && rows > 16 && is_fp8(k_type);
    const data_type pair_scores_type = pair_keys_decoded_once ? data_type::bf16 : k_type;
    uint32_t *q_pairs = reinterpret_cast<uint32_t *>(q) + rows * d / 2;
    if constexpr (V::pair_products) {
        uint32_t *row_major = reinterpret_cast<uint32_t *>(q);
        // By the bf16 conversion, 32 values per step: exact here, as the values came from bf16 (their
        // denormals become zeros, as the products read them anyway). rows x d is a multiple of 16
        // (decline). Element by element, this scalar loop of rows x d / 2 steps per item took ~3 us of
        // a one-thread verify call's ~18 us of fixed cost.
        V::store_as_bf16_pairs(q, rows * d, row_major);
        if (tiles) { // the A tiles' rows: bf16 q, zeros beyond D and below the last row
            std::memset(tile_q, 0, static_cast<size_t>(rows_tiles * d_tiles) * 2);
            for (dim r = 0; r < rows; ++r)
                std::memcpy(tile_q + r * d_tiles, row_major + r * (d / 2), static_cast<size_t>(d) * 2);
            // The padding rows' probabilities, read by the values' A tiles, are zeros too.
            if (probability_pairs)
                std::memset(probability_pairs + rows * (packed_chunk / 2), 0,
                            static_cast<size_t>((rows_tiles - rows) * packed_chunk / 2) * 4);
            if (tile_keys_staged && d_tiles != d) // the pairs beyond D of each staged group
                for (dim g = 0; g < max_chunk_groups; ++g)
                    std::memset(reinterpret_cast<uint16_t *>(k_decoded) + g * k_group_elements + 16 * d, 0,
                                static_cast<size_t>(16 * (d_tiles - d)) * 2);
            if constexpr (V::tile_products) tile_unit.configure(V::tile_configuration());
        }
        for (dim r0 = 0, n; r0 < rows; r0 += n) {
            n = pair_row_block(rows - r0, rows, pair_scores_type);
            for (dim pair = 0; pair < d / 2; ++pair)
                for (dim r = 0; r < n; ++r)
                    q_pairs[r0 * (d / 2) + pair * n + r] = row_major[(r0 + r) * (d / 2) + pair];
        }
    }
    // load_pair's units (e4m3: 2^-120; e5m2: 2^-112) folded back by powers of two
    // (exact): into q and into the probabilities (times any per-token V scales) as far as their
    // largest magnitude stays below 2^125, the rest into the scores (score_factor) and the output.
    // Normally all of it goes into q and the probabilities, so that every product is the true one
    // (no new subnormals), and the sums stay far from overflow (|k| and |v| x the unit are below
    // 2^-96).
    auto into = [](int unit, float largest) {
        return std::isfinite(largest) && largest > 0.f ? std::min(unit, 124 - std::ilogb(largest)) : unit;
    };
    float score_factor = 1.f, probability_factor = 1.f, out_factor = info.out_factor;
    if (!V::pair_products && V::load_unit(k_type) != 1.f) {
        const int unit = -std::ilogb(V::load_unit(k_type));
        // The largest |q| in vectors: a scalar loop of maxima, one chain of their latency, took
        // ~2000 cycles per 4-row item. A NaN is passed over (vmaxps gives its second operand), as
        // std::max(largest, NaN) would.
        R most = V::zero();
        for (dim i = 0; i < rows * d; i += width) {
            const R x = V::load(q + i);
            most = V::max(V::max(x, V::mul(x, V::set1(-1.f))), most);
        }
        const int into_q = into(unit, V::reduce_max(most));
        const float q_factor = std::ldexp(1.f, into_q);
        for (dim i = 0; i < rows * d; ++i)
            q[i] *= q_factor;
        score_factor = std::ldexp(1.f, unit - into_q);
    }
    if (!V::pair_products && V::load_unit(v_type) != 1.f) {
        const int unit = -std::ilogb(V::load_unit(v_type));
        float largest = 1.f;    // a probability's
        if (info.v_per_token) { // times the largest V scale of the item's tokens (all > 0)
            R most = V::zero();
            largest = 0.f;
            // The item's scales a block's share at a time: f(block's scales, first token, end).
            auto each_block = [&](auto &&f) {
                for (dim t = item.kv_begin; t < item.kv_end;) {
                    const dim b = t / bs, block = a.block_table[item.seq * a.block_table_stride + b];
                    const dim end = std::min(item.kv_end, (b + 1) * bs) - b * bs;
                    f(a.v_scales + (block * p.kv_heads + item.kv_head) * bs, t - b * bs, end);
                    t = b * bs + end;
                }
            };
            // Every block's lines requested before any is read: read a block at a time, each
            // block's first load waited for memory.
            each_block([](const float *scales, dim i, dim end) {
                for (i = i / 16 * 16; i < end; i += 16)
                    prefetch_line(scales + i);
            });
            each_block([&](const float *scales, dim i, dim end) {
                for (; i + width <= end; i += width)
                    most = V::max(most, V::load(scales + i));
                for (; i < end; ++i)
                    largest = std::max(largest, scales[i]);
            });
            largest = std::max(largest, V::reduce_max(most));
        }
        const int into_probabilities = into(unit, largest);
        probability_factor = std::ldexp(1.f, into_probabilities);
        out_factor = info.out_factor * std::ldexp(1.f, unit - into_probabilities);
    }

    // Where a chunk's 16-token groups lie, each through the block table: with small block sizes a
    // chunk spans several blocks.
    struct chunk_groups {
        dim count = 0;
        const char *k[max_chunk_groups], *v[max_chunk_groups];
        dim scale[max_chunk_groups]; // index of the group's first per-token scale
    };
    auto groups_of = [&](const work_item &of, dim c0, dim c1) {
        chunk_groups cg;
        cg.count = (c1 - c0) / 16;
        for (dim g = 0; g < cg.count; ++g) {
            const dim t = c0 + 16 * g, offset = t % bs;
            const dim block = a.block_table[of.seq * a.block_table_stride + t / bs];
            cg.k[g] = static_cast<const char *>(a.k_cache) +
                      (k_view.region(block, of.kv_head) + offset * d) * k_size;
            cg.v[g] = static_cast<const char *>(a.v_cache) +
                      (v_view.region(block, of.kv_head) + offset / 2 * 32) * v_size;
            cg.scale[g] = (block * p.kv_heads + of.kv_head) * bs + offset;
        }
        return cg;
    };
    // Where an item's chunk from c0 ends: packed_chunk tokens on, or its range's last 16-token group.
    auto chunk_end = [&](const work_item &of, dim c0) {
        return std::min(c0 + packed_chunk, (of.kv_end + 15) / 16 * 16);
    };
    // The first chunk of an item, as the loop below walks it (none if its KV range is empty).
    auto first_chunk_of = [&](const work_item &of) {
        const dim c0 = of.kv_begin / 16 * 16;
        return of.kv_begin < of.kv_end ? groups_of(of, c0, chunk_end(of, c0)) : chunk_groups {};
    };

    for (dim c0 = item.kv_begin / 16 * 16; c0 < item.kv_end;) {
        const dim c1 = chunk_end(item, c0);
        const dim tokens = c1 - c0; // a multiple of 16
        const chunk_groups chunk = groups_of(item, c0, c1);
        // From each group's K and V to the next chunk's group at the same position (0: none). After
        // the item's last chunk, the next item's first: otherwise its first chunk, read from memory
        // with nothing fetched ahead, cost 1 of every 32 chunks of a 4096-token split piece about
        // its memory time.
        dim k_ahead[max_chunk_groups] = {}, v_ahead[max_chunk_groups] = {};
        if (c1 < item.kv_end || next_item) {
            const chunk_groups next =
                    c1 < item.kv_end ? groups_of(item, c1, chunk_end(item, c1)) : first_chunk_of(*next_item);
            for (dim g = 0; g < std::min(chunk.count, next.count); ++g) {
                k_ahead[g] = next.k[g] - chunk.k[g];
                v_ahead[g] = next.v[g] - chunk.v[g];
            }
            // The next chunk's per-token scales too (a group's 16 are one line): read from memory
            // when the softmax needs them, they stalled each chunk (x64:avx512, 8 x 8192 e4m3 from
            // DRAM: 6.29 -> 5.93 ms; x64:avx512_bf16 4.61 -> 4.16).
            for (dim g = 0; g < next.count; ++g) {
                if (info.k_per_token) prefetch_line(a.k_scales + next.scale[g]);
                if (info.v_per_token) prefetch_line(a.v_scales + next.scale[g]);
            }
        }

        // Scores: rows x tokens, the tokens in lanes, one 16-token group at a time. When several
        // passes of rows read the chunk (prefill, verify, large GQA groups), FP8 and f16 keys are
        // decoded once into L1 (same element order) rather than once per pass: FP8 as bf16, which
        // holds every FP8 value exactly and is the cheapest type to load, f16 as f32.
        // With pair products, FP8 keys read by more than one 16-row pass (prefill) are decoded
        // once too, straight into bf16 pairs.
        const bool k_once = tile_keys_staged || pair_keys_decoded_once ||
                            (!V::pair_products && rows > row_block && k_type != data_type::f32 &&
                             k_type != data_type::bf16);
        const data_type k_source_type = !k_once ? k_type : decoded_type(k_type);
        // Keys too: a NaN code must decode to NaN here as everywhere (rows that see one have no
        // defined output, but the reference's are NaN-valued). FP8 chunks that hold no special
        // code skip the patch: checked as the keys are decoded once or by parity, and redone with
        // the patch if one turns up (fp8_special_check).
        const bool k_nan_possible = !V::pair_products && special_patch_skippable<V>(k_type);
        // Returns whether a NaN code went through unpatched (the check only runs without the patch).
        auto decode_keys_once = [&](auto patched) {
            fp8_special_check check(k_type);
            if constexpr (V::fp8_pairs_by_parity)
                if (is_fp8(k_type)) { // (straight into bf16 words)
                    with_fp8_to_bf16<V, decltype(patched)::value>(k_type, [&](auto decode) {
                        for (dim g = 0; g < chunk.count; ++g)
                            decode(chunk.k[g], 16 * d, reinterpret_cast<uint16_t *>(k_decoded) + g * 16 * d,
                                   k_ahead[g], check);
                    });
                    return check.found();
                }
            for (dim g = 0; g < chunk.count; ++g)
                for (dim i = 0; i < 16 * d; i += V::pair_products ? 4 * width : 2 * width) {
                    const char *source = chunk.k[g] + i * k_size;
                    if (i * k_size % 64 == 0) prefetch_ahead(source, k_ahead[g]);
                    if constexpr (V::pair_products) { // (64 codes, a line, at a time; bf16 for tiles)
                        typename V::pairs first, second;
                        V::load_two_bf16_pairs(source, k_type, first, second);
                        uint16_t *copy = reinterpret_cast<uint16_t *>(k_decoded) + g * k_group_elements + i;
                        V::store_pairs(copy, first);
                        V::store_pairs(copy + 2 * width, second);
                    } else {
                        R first, second;
                        V::template load_pair<decltype(patched)::value>(source, k_type, first, second);
                        if constexpr (!decltype(patched)::value) check.add(source, 2 * width);
                        store_decoded<V>(k_decoded, k_source_type, g * 16 * d + i, first, second);
                    }
                }
            return check.found();
        };
        if (k_once && (!k_nan_possible || decode_keys_once(std::false_type {})))
            decode_keys_once(std::true_type {});
        const dim k_source_size = static_cast<dim>(data_type_size(k_source_type));
        auto k_group_of = [&](dim g) { // the group's keys, as stored or decoded
            return k_once ? reinterpret_cast<const char *>(k_decoded) + g * k_group_elements * k_source_size
                          : chunk.k[g];
        };
        if (tiles) {
            if constexpr (V::tile_products) {
                const char *k_groups[max_chunk_groups];
                for (dim g = 0; g < chunk.count; ++g)
                    k_groups[g] = k_group_of(g);
                V::tile_scores(tile_unit, tile_q, rows, d_tiles, k_groups, chunk.count,
                               k_once ? nullptr : k_ahead, info.q_factor, probability);
            }
        } else if constexpr (V::pair_products) {
            const char *k_groups[max_chunk_groups];
            dim ahead[max_chunk_groups];
            for (dim g = 0; g < chunk.count; ++g) {
                k_groups[g] = k_group_of(g);
                ahead[g] = k_once ? 0 : k_ahead[g];
            }
            for (dim r0 = 0; r0 < rows;) {
                const dim n = pair_row_block(rows - r0, rows, pair_scores_type), groups = tokens / 16;
                const uint32_t *qr = q_pairs + r0 * (d / 2);
                float *out = probability + r0 * packed_chunk;
                const float f = info.q_factor;
                switch (n) {
                    case 16: // one group at a time
                    case 8:
                        for (dim g = 0; g < groups; ++g)
                            (n == 16 ? packed_pair_scores_of<V, 16, 1>
                                     : packed_pair_scores_of<V, 8, 1>)(k_source_type, k_groups + g,
                                                                       k_source_size, qr, d, f, out + g * 16,
                                                                       packed_chunk, ahead + g);
                        break;
                    case 4:
                        packed_pair_scores_groups<V, 4>(k_source_type, k_groups, groups, k_source_size, qr, d,
                                                        f, out, packed_chunk, ahead);
                        break;
                    case 3:
                        packed_pair_scores_groups<V, 3>(k_source_type, k_groups, groups, k_source_size, qr, d,
                                                        f, out, packed_chunk, ahead);
                        break;
                    case 2:
                        packed_pair_scores_groups<V, 2>(k_source_type, k_groups, groups, k_source_size, qr, d,
                                                        f, out, packed_chunk, ahead);
                        break;
                    default:
                        packed_pair_scores_groups<V, 1>(k_source_type, k_groups, groups, k_source_size, qr, d,
                                                        f, out, packed_chunk, ahead);
                        break;
                }
                r0 += n;
            }
        } else {
            const char *k_groups[max_chunk_groups];
            dim ahead[max_chunk_groups];
            for (dim g = 0; g < chunk.count; ++g) {
                k_groups[g] = k_group_of(g);
                ahead[g] = k_once ? 0 : k_ahead[g];
            }
            const dim groups = tokens / 16;
            for (dim r0 = 0, n; r0 < rows; r0 += n) {
                n = rows - r0 >= row_block ? row_block : std::min<dim>(4, rows - r0);
                const float *qr = q + r0 * d;
                float *out = probability + r0 * packed_chunk;
                switch (n) {
                    case 8:
                        if constexpr (row_block == 8)
                            packed_scores_groups<V, 8>(k_source_type, k_groups, groups, k_source_size, qr, d,
                                                       out, packed_chunk, ahead);
                        break;
                    case 4:
                        packed_scores_groups<V, 4>(k_source_type, k_groups, groups, k_source_size, qr, d, out,
                                                   packed_chunk, ahead);
                        break;
                    case 3:
                        packed_scores_groups<V, 3>(k_source_type, k_groups, groups, k_source_size, qr, d, out,
                                                   packed_chunk, ahead);
                        break;
                    case 2:
                        packed_scores_groups<V, 2>(k_source_type, k_groups, groups, k_source_size, qr, d, out,
                                                   packed_chunk, ahead);
                        break;
                    default:
                        packed_scores_groups<V, 1>(k_source_type, k_groups, groups, k_source_size, qr, d, out,
                                                   packed_chunk, ahead);
                        break;
                }
            }
        }

        // Online softmax per row over the chunk's visible lanes, in two passes over the rows: the
        // scores finished and their maxima first, then the exponentials. In one pass each row's
        // exponentials waited for its maximum's reduction, and the rows ran one after another
        // (16-row verify spent about a third of its time here); apart, the rows' exponentials
        // are independent work the core overlaps.
        const R lane = V::add(V::iota(), V::set1(static_cast<float>(c0)));
        struct row_view {
            kv_range visible; // clipped to the item's range
            bool seen, whole; // anything visible in the chunk; all of it
            dim position, head;
        };
        auto view_of = [&](dim r) {
            row_view w;
            w.position = context + item.first_token + r / group;
            w.head = item.kv_head * group + r % group;
            w.visible = visible_range(o, w.position, seq_len);
            w.visible.begin = std::max(w.visible.begin, item.kv_begin);
            w.visible.end = std::min(w.visible.end, item.kv_end);
            w.seen = !(w.visible.begin >= std::min(w.visible.end, c1) || w.visible.end <= c0);
            // Chunks the row sees whole (all but a range's edges) skip the lane masks.
            w.whole = w.visible.begin <= c0 && w.visible.end >= c1;
            return w;
        };
        for (dim r = 0; r < rows; ++r) {
            const row_view w = view_of(r);
            float *pr = probability + r * packed_chunk;
            correction[r] = 1.f;
            if (!w.seen) {
                std::fill(pr, pr + tokens, 0.f);
                continue;
            }
            const R lo = V::set1(static_cast<float>(w.visible.begin)),
                    hi = V::set1(static_cast<float>(w.visible.end));
            if (info.k_per_token || score_factor != 1.f)
                for (dim v = 0; v < tokens; v += width) {
                    R x = V::mul(V::load(pr + v), V::set1(score_factor));
                    if (info.k_per_token) x = V::mul(x, V::load(a.k_scales + chunk.scale[v / 16] + v % 16));
                    V::store(pr + v, x);
                }
            if (o.soft_cap > 0.f)
                for (dim j = 0; j < tokens; ++j)
                    pr[j] = o.soft_cap * std::tanh(pr[j] / o.soft_cap);
            R chunk_max = V::set1(minus_infinity);
            for (dim v = 0; v < tokens; v += width) {
                const R j = V::add(lane, V::set1(static_cast<float>(v)));
                R x = V::load(pr + v);
                if (a.alibi_slopes)
                    x = V::fma(V::set1(a.alibi_slopes[w.head]),
                               V::add(j, V::set1(-static_cast<float>(w.position))), x);
                if (!w.whole) x = V::select(V::in_range(j, lo, hi), x, V::set1(minus_infinity));
                V::store(pr + v, x);
                chunk_max = V::max(chunk_max, x);
            }
            const float new_max = std::max(row_max[r], V::reduce_max(chunk_max));
            // (an unchanged finite maximum, most chunks of a long range, needs no exp)
            correction[r] =
                    row_max[r] == new_max && std::isfinite(new_max) ? 1.f : std::exp(row_max[r] - new_max);
            row_sum[r] *= correction[r];
            row_max[r] = new_max;
        }
        for (dim r = 0; r < rows; ++r) {
            const row_view w = view_of(r);
            if (!w.seen) continue;
            float *pr = probability + r * packed_chunk;
            const R lo = V::set1(static_cast<float>(w.visible.begin)),
                    hi = V::set1(static_cast<float>(w.visible.end));
            const R minus_max = V::set1(-row_max[r]);
            R sum = V::zero();
            for (dim v = 0; v < tokens; v += width) {
                R weight = exp_negative<V>(V::add(V::load(pr + v), minus_max));
                if (!w.whole) {
                    const R j = V::add(lane, V::set1(static_cast<float>(v)));
                    weight = V::select(V::in_range(j, lo, hi), weight, V::zero());
                }
                sum = V::add(sum, weight);
                if (probability_factor != 1.f) weight = V::mul(weight, V::set1(probability_factor));
                // Per-token V scales weigh the values, not the softmax denominator. Masked lanes
                // are exact zeros (their scales may be unwritten, and stay out of the product).
                if (info.v_per_token) {
                    const R scaled = V::mul(weight, V::load(a.v_scales + chunk.scale[v / 16] + v % 16));
                    weight = w.whole ? scaled
                                     : V::select(V::in_range(V::add(lane, V::set1(static_cast<float>(v))), lo,
                                                             hi),
                                                 scaled, V::zero());
                }
                V::store(pr + v, weight);
            }
            row_sum[r] += V::reduce_add(sum);
        }
        if constexpr (V::pair_products) {
            if (probability_pairs)
                for (dim r = 0; r < rows; ++r)
                    V::store_as_bf16_pairs(probability + r * packed_chunk, tokens,
                                           probability_pairs + r * (packed_chunk / 2));
        }

        // Values by tile products (bf16 dst; f32 and f16 dst keep f32 probabilities, below): the
        // chunk's values staged as bf16 with the tokens outside the item's range zeroed. A chunk
        // holding a non-finite value takes the vector path instead, which skips, for each row, the
        // tokens it does not see (0 * inf in a tile would give NaN to rows that must not see it).
        if constexpr (V::tile_products) {
            if (tiles && probability_pairs) {
                const dim first_token = std::max(item.kv_begin, c0) - c0,
                          end_token = std::min(item.kv_end, c1) - c0;
                if (V::tile_values(tile_unit, chunk.v, chunk.count, v_type, 16 * bs * v_size, v_ahead,
                                   first_token, end_token, probability_pairs, rows, d, correction,
                                   reinterpret_cast<uint16_t *>(v_decoded), scratch + layout.tile_out, acc)) {
                    c0 = c1;
                    continue;
                }
            }
        }

        // Values: acc (rows x D) = acc * correction + probabilities x V, 16 dims x a token pair
        // per V row.
        const dim first_pair = (std::max(item.kv_begin, c0) - c0) / 2;
        const dim end_pair = (std::min(item.kv_end, c1) - c0 + 1) / 2;
        // Rows per pass: every V element decoded once per pass serves them all (4: a GQA group of
        // 4 q heads in decode reads each V element once; 8 with 32 registers, for verify and
        // prefill, whose passes then load and split each V vector for twice as many rows).
        constexpr dim value_rows = width == 16 ? 8 : 4;
        // With several passes, FP8 and f16 values are decoded once into L1 as the keys are: the pairs
        // of this chunk for every dims group, at the element positions of a packed_chunk-token block.
        const bool v_once = rows > value_rows && v_type != data_type::f32 && v_type != data_type::bf16;
        const data_type v_source_type = v_once ? decoded_type(v_type) : v_type;
        // (NaN codes as with the keys)
        const bool v_nan_possible = !V::fp8_by_table && special_patch_skippable<V>(v_type);
        bool v_staged = false;
        if constexpr (V::pair_products) {
            // FP8 for pair products: 64 codes (two token pairs of a 16-dim row, one line) to bf16
            // pairs by one table decode, stored as they come; the pairs from an even one on, so that
            // an odd first pair stages its even neighbour too (never read for a row that does not
            // see it). The generic loop below decodes 32 codes per call, splits them into f32 and
            // merges them back, with the type looked up per call: in cache it cost FP8 verify
            // (16 rows) more than its keys' decoding and scores together.
            if (v_once && is_fp8(v_type)) {
                uint16_t *staged = reinterpret_cast<uint16_t *>(v_decoded);
                for (dim dims_group = 0; dims_group < d / 16; ++dims_group)
                    for (dim pair = first_pair / 2 * 2; pair < end_pair; pair += 2) {
                        const char *codes = chunk.v[pair / 8] + dims_group * 16 * bs + (pair % 8) * 32;
                        prefetch_ahead(codes, v_ahead[pair / 8]);
                        typename V::pairs low, high;
                        V::load_two_bf16_pairs(codes, v_type, low, high);
                        uint16_t *to = staged + dims_group * 16 * packed_chunk + pair * 32;
                        V::store_pairs(to, low);
                        V::store_pairs(to + 32, high);
                    }
                v_staged = true;
            }
        }
        auto decode_values_once = [&](auto patched) { // as decode_keys_once
            fp8_special_check check(v_type);
            if constexpr (V::fp8_pairs_by_parity)
                if (is_fp8(v_type)) { // (a group's token pairs of a dims group, 32 codes each, at once)
                    with_fp8_to_bf16<V, decltype(patched)::value>(v_type, [&](auto decode) {
                        for (dim dims_group = 0; dims_group < d / 16; ++dims_group)
                            for (dim g = first_pair / 8; g * 8 < end_pair; ++g) {
                                const dim pair = std::max(first_pair, 8 * g),
                                          end = std::min(end_pair, 8 * g + 8);
                                decode(chunk.v[g] + dims_group * 16 * bs + (pair % 8) * 32, (end - pair) * 32,
                                       reinterpret_cast<uint16_t *>(v_decoded) +
                                               dims_group * 16 * packed_chunk + pair * 32,
                                       v_ahead[g], check);
                            }
                    });
                    return check.found();
                }
            for (dim dims_group = 0; dims_group < d / 16; ++dims_group)
                for (dim pair = first_pair; pair < end_pair; ++pair)
                    for (dim sub = 0; sub < 16; sub += width) {
                        R first, second;
                        const char *values = chunk.v[pair / 8] +
                                             (dims_group * 16 * bs + (pair % 8) * 32 + sub * 2) * v_size;
                        V::template load_pair<decltype(patched)::value>(values, v_type, first, second);
                        if constexpr (!decltype(patched)::value) check.add(values, 2 * width);
                        if (sub == 0 && (v_size > 1 || pair % 2 == 0))
                            prefetch_ahead(values, v_ahead[pair / 8]);
                        store_decoded<V>(v_decoded, v_source_type,
                                         dims_group * 16 * packed_chunk + pair * 32 + sub * 2, first, second);
                    }
            return check.found();
        };
        if (v_once && !v_staged && (!v_nan_possible || decode_values_once(std::false_type {})))
            decode_values_once(std::true_type {});
        for (dim r0 = 0, n; r0 < rows; r0 += n) {
            n = rows - r0 >= value_rows ? value_rows : std::min<dim>(4, rows - r0);
            dim common_begin = item.kv_begin,
                common_end = item.kv_end; // tokens every row of the pass sees
            for (dim rr = 0; rr < n; ++rr) {
                const kv_range vr = visible_range(o, context + item.first_token + (r0 + rr) / group, seq_len);
                common_begin = std::max(common_begin, vr.begin);
                common_end = std::min(common_end, vr.end);
            }
            // The values as stored, or their copy decoded into L1 (laid out as a packed_chunk-token block).
            packed_values_rows job;
            const dim source_size = static_cast<dim>(data_type_size(v_source_type));
            for (dim g = 0; g < chunk.count; ++g) {
                job.group[g] = v_once ? reinterpret_cast<const char *>(v_decoded) + g * 8 * 32 * source_size
                                      : chunk.v[g];
                job.ahead[g] = v_once ? 0 : v_ahead[g];
            }
            job.dims_group_stride = 16 * (v_once ? packed_chunk : bs) * source_size;
            job.v_type = v_source_type;
            job.v_size = source_size;
            job.g0 = c0;
            job.first_pair = first_pair;
            job.end_pair = end_pair;
            job.common_begin = common_begin;
            job.common_end = common_end;
            job.probability = probability + r0 * packed_chunk;
            job.probability_pairs = probability_pairs ? probability_pairs + r0 * (packed_chunk / 2) : nullptr;
            job.correction = correction + r0;
            job.acc = acc + r0 * d;
            job.d = d;
            switch (n) {
                case 8:
                    if constexpr (value_rows == 8) packed_values_of<V, 8>(job);
                    break;
                case 4: packed_values_of<V, 4>(job); break;
                case 3: packed_values_of<V, 3>(job); break;
                case 2: packed_values_of<V, 2>(job); break;
                default: packed_values_of<V, 1>(job); break;
            }
        }
        c0 = c1;
    }
    if constexpr (V::tile_products)
        if (tiles) tile_unit.release();

    store_item_output(p, a, item, acc, row_max, row_sum, out_factor, partial);
}

// MXCSR's denormals-are-zero and flush-to-zero cleared while it lives, its other control bits
// and the caller's exception flags kept: FP8 subnormals become f32 subnormals in load_pair's
// units (e4m3 and e5m2) and in decode_e4m3_lanes, which DAZ would read as zeros.
class subnormals_kept {
    static constexpr unsigned flush_bits = 0x8040u, exception_flags = 0x3Fu;
    unsigned saved_;
    bool changed_;

public:
    explicit subnormals_kept(bool needed) : saved_(_mm_getcsr()), changed_(needed && (saved_ & flush_bits)) {
        if (changed_) _mm_setcsr(saved_ & ~flush_bits);
    }
    ~subnormals_kept() {
        if (changed_) _mm_setcsr((_mm_getcsr() & exception_flags) | (saved_ & ~exception_flags));
    }
    subnormals_kept(const subnormals_kept &) = delete;
    subnormals_kept &operator=(const subnormals_kept &) = delete;
};

template <typename V>
void run_item(const paged_attention_problem &p, const paged_attention_arguments &a, const work_item &item,
              const work_item *next, float *scratch, float *partial) {
    const subnormals_kept kept(is_fp8(p.k_cache.get_data_type()) || is_fp8(p.v_cache.get_data_type()));
    if (p.k_cache.get_layout() == layout::packed)
        run_item_packed<V>(p, a, item, next, scratch, partial);
    else
        run_item_plain<V>(p, a, item, scratch, partial);
}

} // namespace PAGEDATTN_X64_ISA
#pragma GCC visibility pop
} // namespace x64
} // namespace detail
} // namespace pagedattn
