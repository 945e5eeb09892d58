// ref:any — the portable reference implementation: plain C++, f32 arithmetic, online softmax over
// the KV blocks of each sequence, parallel with oneTBB over (sequence, kv head, query tile).
// It reads every cache type and layout (element by element) and accepts every problem; the fast kernels are
// checked against it and against the fp64 oracle of the tests.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "paged_attention_internal.hpp"
#include "plan.hpp"
#include "src/cache_layout.hpp"
#include "src/fp8.hpp"

namespace pagedattn {
namespace detail {
namespace {

struct scratch_layout {
    dim rows, block;
    size_t q, acc, max, sum, keys, values, scores, total; // offsets in floats
    explicit scratch_layout(const paged_attention_problem &p)
        : rows(tokens_per_tile(p) * (p.q_heads / p.kv_heads)), block(p.block_size) {
        const size_t d = static_cast<size_t>(p.head_size);
        q = 0;
        acc = q + rows * d;
        max = acc + rows * d;
        sum = max + rows;
        keys = sum + rows;
        values = keys + block * d;
        scores = values + block * d;
        total = scores + block;
    }
};

std::string decline(const paged_attention_problem &, const primitive_attr &) {
    return {};
}

size_t scratch_bytes(const paged_attention_problem &p) {
    return scratch_layout(p).total * sizeof(float);
}

void run_item(const paged_attention_problem &p, const paged_attention_arguments &a, const work_item &item,
              const work_item * /*next: the reference fetches nothing ahead*/, float *scratch,
              float *partial) {
    const scratch_layout layout(p);
    const dim group = p.q_heads / p.kv_heads, d = p.head_size, bs = p.block_size;
    const auto &o = p.options;
    const dim q_begin = a.query_start_loc[item.seq];
    const dim q_len = a.query_start_loc[item.seq + 1] - q_begin;
    const dim seq_len = a.seq_lens[item.seq];
    const dim context = seq_len - q_len; // absolute position of the first query token
    const dim tokens = item.last_token - item.first_token;
    const dim rows = tokens * group;
    float *q = scratch + layout.q, *acc = scratch + layout.acc, *row_max = scratch + layout.max;
    float *row_sum = scratch + layout.sum, *keys = scratch + layout.keys, *values = scratch + layout.values;
    float *scores = scratch + layout.scores;
    const size_t q_size = data_type_size(p.query_type);

    for (dim r = 0; r < rows; ++r) {
        const dim token = q_begin + item.first_token + r / group, head = item.kv_head * group + r % group;
        const char *src =
                static_cast<const char *>(a.query) +
                (token * a.query_token_stride + head * a.query_head_stride) * static_cast<dim>(q_size);
        convert_row_to_f32(src, p.query_type, d, 1.f, q + r * d);
        std::fill(acc + r * d, acc + (r + 1) * d, 0.f);
        const bool sink = a.sinks && !partial; // a split item leaves the sink to the merge
        row_max[r] = sink ? a.sinks[head] : -std::numeric_limits<float>::infinity();
        row_sum[r] = sink ? 1.f : 0.f; // exp(sink - max) with max = sink
    }

    // The KV range any row of the tile can see.
    const dim first_position = context + item.first_token, last_position = context + item.last_token - 1;
    dim kv_begin = o.window_left >= 0 ? std::max<dim>(0, first_position - o.window_left) : 0;
    dim kv_end = o.causal ? last_position + 1 : seq_len;
    if (o.window_right >= 0) kv_end = std::min(kv_end, last_position + o.window_right + 1);
    kv_end = std::min(kv_end, seq_len);
    kv_begin = std::max(kv_begin, item.kv_begin); // this item's piece of a split range
    kv_end = std::min(kv_end, item.kv_end);

    const cache_view k_view(p.k_cache, false), v_view(p.v_cache, true);
    const data_type k_type = p.k_cache.get_data_type(), v_type = p.v_cache.get_data_type();
    for (dim logical_block = kv_begin / bs; logical_block * bs < kv_end; ++logical_block) {
        const dim block = a.block_table[item.seq * a.block_table_stride + logical_block];
        const dim j_begin = std::max(kv_begin, logical_block * bs);
        const dim j_end = std::min(kv_end, (logical_block + 1) * bs);
        for (dim j = j_begin; j < j_end; ++j) {
            const dim offset = j - logical_block * bs;
            const float k_scale = row_scale(a.k_scales, p.k_scales_mask, p, block, item.kv_head, offset);
            const float v_scale = row_scale(a.v_scales, p.v_scales_mask, p, block, item.kv_head, offset);
            for (dim i = 0; i < d; ++i) {
                keys[(j - j_begin) * d + i] =
                        load_as_f32(a.k_cache, k_type, k_view.offset(block, item.kv_head, offset, i)) *
                        k_scale;
                values[(j - j_begin) * d + i] =
                        load_as_f32(a.v_cache, v_type, v_view.offset(block, item.kv_head, offset, i)) *
                        v_scale;
            }
        }
        for (dim r = 0; r < rows; ++r) {
            const dim position = context + item.first_token + r / group,
                      head = item.kv_head * group + r % group;
            float block_max = -std::numeric_limits<float>::infinity();
            bool any = false;
            for (dim j = j_begin; j < j_end; ++j) {
                const bool visible = (!o.causal || j <= position) &&
                                     (o.window_left < 0 || j >= position - o.window_left) &&
                                     (o.window_right < 0 || j <= position + o.window_right);
                float &x = scores[j - j_begin];
                if (!visible) {
                    x = -std::numeric_limits<float>::infinity();
                    continue;
                }
                const float *k = keys + (j - j_begin) * d, *qr = q + r * d;
                float dot = 0.f;
                for (dim i = 0; i < d; ++i)
                    dot += qr[i] * k[i];
                x = o.softmax_scale * dot;
                if (o.soft_cap > 0.f) x = o.soft_cap * std::tanh(x / o.soft_cap);
                if (a.alibi_slopes) x += a.alibi_slopes[head] * static_cast<float>(j - position);
                block_max = std::max(block_max, x);
                any = true;
            }
            if (!any) continue;
            const float new_max = std::max(row_max[r], block_max);
            const float correction = std::exp(row_max[r] - new_max); // 0 when the old max is -inf
            float *out = acc + r * d;
            row_sum[r] *= correction;
            for (dim i = 0; i < d; ++i)
                out[i] *= correction;
            for (dim j = j_begin; j < j_end; ++j) {
                if (scores[j - j_begin] == -std::numeric_limits<float>::infinity()) continue;
                const float weight = std::exp(scores[j - j_begin] - new_max);
                row_sum[r] += weight;
                const float *v = values + (j - j_begin) * d;
                for (dim i = 0; i < d; ++i)
                    out[i] += weight * v[i];
            }
            row_max[r] = new_max;
        }
    }

    store_item_output(p, a, item, acc, row_max, row_sum, 1.f, partial);
}

} // namespace

const paged_attention_implementation paged_attention_ref = { "ref:any", cpu_isa::generic, decline,
                                                             scratch_bytes, run_item };

} // namespace detail
} // namespace pagedattn
