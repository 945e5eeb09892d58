// The partition of one execute into independent work items: (sequence, kv head, query tile). Each
// item owns its rows of dst, so items run in parallel without synchronization.
#pragma once

#include <algorithm>
#include <vector>

#include "paged_attention_internal.hpp"

namespace pagedattn {
namespace detail {

struct work_item {
    dim seq, kv_head, first_token, last_token; // query tokens [first, last) of the sequence
};

/// Query tokens per item: about 64 (token, q head) rows, since the q heads of one kv head share
/// each K/V row they read.
inline dim tokens_per_tile(const paged_attention_problem &p) {
    return std::max<dim>(1, 64 / (p.q_heads / p.kv_heads));
}

inline std::vector<work_item> build_work_items(const paged_attention_problem &p,
                                               const paged_attention_arguments &a) {
    const dim tile = tokens_per_tile(p);
    std::vector<work_item> items;
    for (dim s = 0; s < a.num_seqs; ++s) {
        const dim q_len = a.query_start_loc[s + 1] - a.query_start_loc[s];
        for (dim first = 0; first < q_len; first += tile)
            for (dim h = 0; h < p.kv_heads; ++h)
                items.push_back({ s, h, first, std::min(q_len, first + tile) });
    }
    return items;
}

/// The KV tokens [begin, end) that a query token at absolute position `position` may see.
struct kv_range {
    dim begin, end;
};
inline kv_range visible_range(const paged_attention_options &o, dim position, dim seq_len) {
    kv_range r { o.window_left >= 0 ? std::max<dim>(0, position - o.window_left) : 0, seq_len };
    if (o.causal) r.end = std::min(r.end, position + 1);
    if (o.window_right >= 0) r.end = std::min(r.end, position + o.window_right + 1);
    return r;
}

/// Scale of one cache row (1 when the cache has no scales).
inline float row_scale(const float *scales, int mask, const paged_attention_problem &p, dim block, dim head,
                       dim offset) {
    if (!scales) return 1.f;
    if (mask == scales_per_tensor) return scales[0];
    if (mask == scales_per_kv_head) return scales[head];
    return scales[(block * p.kv_heads + head) * p.block_size + offset];
}

} // namespace detail
} // namespace pagedattn
