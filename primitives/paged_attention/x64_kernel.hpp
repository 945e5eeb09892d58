// The x64 paged_attention kernel, written once over an f32 vector type (avx2_f32, avx512_f32) and
// instantiated by the thin per-ISA files avx2.cpp and avx512.cpp. f32 products and accumulation for
// every input type (so it meets fpmath_mode::strict), the plain cache layout.
//
// Per work item (sequence, kv head, query tile) it walks the visible KV tokens block by block
// through the block table, in chunks of up to `chunk` tokens: each K row is dequantized once and
// serves every q head of the kv head (GQA) and every query token of the tile; scores get the
// per-token K scale, soft-cap and ALiBi; an online softmax in f32 rescales the accumulators once
// per chunk; each V row is dequantized once and accumulated into every row. Per-tensor and per-head
// K scales are folded into q, V scales into the output.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "paged_attention_internal.hpp"
#include "plan.hpp"
#include "src/error.hpp"
#include "src/fp8.hpp"
#include "src/x64/f32_vectors.hpp"

namespace pagedattn {
namespace detail {
namespace x64 {

constexpr dim chunk = 16;

template <typename V> std::string decline(const paged_attention_problem &p, const primitive_attr &) {
    if (p.head_size % V::width != 0)
        return concat("head size ", p.head_size, " is not a multiple of ", V::width);
    if (p.k_cache.get_layout() != layout::plain || p.v_cache.get_layout() != layout::plain)
        return "reads the plain layout only";
    return {};
}

struct scratch_layout {
    size_t q, acc, scores, row_max, row_sum, k_row, v_row, total; // offsets in floats
    explicit scratch_layout(const paged_attention_problem &p) {
        const size_t rows = static_cast<size_t>(tokens_per_tile(p) * (p.q_heads / p.kv_heads));
        const size_t d = static_cast<size_t>(p.head_size);
        q = 0;
        acc = q + rows * d;
        scores = acc + rows * d;
        row_max = scores + rows * chunk;
        row_sum = row_max + rows;
        k_row = row_sum + rows;
        v_row = k_row + d;
        total = v_row + d;
    }
};

inline size_t scratch_bytes(const paged_attention_problem &p) {
    return scratch_layout(p).total * sizeof(float);
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

template <typename V> void add_weighted(float *out, float weight, const float *v, dim n) {
    const typename V::reg w = V::set1(weight);
    for (dim i = 0; i < n; i += V::width)
        V::store(out + i, V::fma(w, V::load(v + i), V::load(out + i)));
}

template <typename V>
void run_item(const paged_attention_problem &p, const paged_attention_arguments &a, const work_item &item,
              float *scratch, float *partial) {
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
    float *k_row = scratch + layout.k_row, *v_row = scratch + layout.v_row;

    // Folded scales: a K scale that does not vary per token multiplies q once.
    const bool k_per_token = p.k_scales_mask == scales_per_token,
               v_per_token = p.v_scales_mask == scales_per_token;
    const float q_factor =
            o.softmax_scale *
            (k_per_token ? 1.f : row_scale(a.k_scales, p.k_scales_mask, p, 0, item.kv_head, 0));
    const float out_factor =
            v_per_token ? 1.f : row_scale(a.v_scales, p.v_scales_mask, p, 0, item.kv_head, 0);

    for (dim r = 0; r < rows; ++r) {
        const dim t = item.first_token + r / group, head = item.kv_head * group + r % group;
        const char *src = static_cast<const char *>(a.query) +
                          ((q_begin + t) * a.query_token_stride + head * a.query_head_stride) *
                                  static_cast<dim>(data_type_size(p.query_type));
        convert_row_to_f32(src, p.query_type, d, 1.f, q + r * d);
        for (dim i = 0; i < d; ++i)
            q[r * d + i] *= q_factor;
        std::fill(acc + r * d, acc + (r + 1) * d, 0.f);
        const bool sink = a.sinks && !partial; // a split item leaves the sink to the merge
        row_max[r] = sink ? a.sinks[head] : minus_infinity;
        row_sum[r] = sink ? 1.f : 0.f;
    }
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
            for (dim r = 0; r < rows; ++r) {
                const dim position = context + item.first_token + r / group;
                const kv_range visible = visible_range(o, position, seq_len);
                if (j < visible.begin || j >= visible.end) continue;
                float x = dot<V>(q + r * d, k_row, d);
                if (o.soft_cap > 0.f) x = o.soft_cap * std::tanh(x / o.soft_cap);
                if (a.alibi_slopes)
                    x += a.alibi_slopes[item.kv_head * group + r % group] * static_cast<float>(j - position);
                scores[r * chunk + (j - j0)] = x;
            }
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
            for (dim j = 0; j < n; ++j) {
                s[j] = s[j] == minus_infinity ? 0.f : padded[j]; // masked scores weigh exactly 0
                row_sum[r] += s[j];
            }
        }

        for (dim j = j0; j < j1; ++j) {
            const dim offset = j - logical_block * bs;
            bool used = false;
            for (dim r = 0; r < rows && !used; ++r)
                used = scores[r * chunk + (j - j0)] != 0.f;
            if (!used) continue; // masked for every row: the V row is not even read
            const float v_scale =
                    v_per_token ? row_scale(a.v_scales, p.v_scales_mask, p, block, item.kv_head, offset)
                                : 1.f;
            dequantize_row<V>(v_base + (block * vs[0] + offset * vs[2]) * v_size, v_type, d, v_scale, v_row);
            for (dim r = 0; r < rows; ++r) {
                const float weight = scores[r * chunk + (j - j0)];
                if (weight != 0.f) add_weighted<V>(acc + r * d, weight, v_row, d);
            }
        }
        j0 = j1;
    }

    store_item_output(p, a, item, acc, row_max, row_sum, out_factor, partial);
}

} // namespace x64
} // namespace detail
} // namespace pagedattn
