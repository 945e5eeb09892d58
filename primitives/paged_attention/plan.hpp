// The partition of one step into work items: (sequence, kv head, query tile, KV range). Items own
// disjoint rows of dst — or, when a long KV range is split across threads, their own partial
// result (unnormalized output, running max and sum per row), merged with log-sum-exp in a second
// phase. The partition depends only on the step's seq lens and query start loc, the problem and the
// thread count, so paged_attention::plan builds it once per step for every layer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "paged_attention_internal.hpp"

namespace pagedattn {
namespace detail {

struct work_item {
    dim seq, kv_head, first_token, last_token; // query tokens [first, last) of the sequence
    dim kv_begin, kv_end;                      // the KV tokens this item reads
    int32_t partial;                           // < 0: writes dst; else its partial result's index
};

/// The split items of one (sequence, kv head, query tile), merged into dst after all items ran.
struct split_group {
    dim seq, kv_head, first_token, last_token;
    int32_t first_partial, count;
};

struct plan_data {
    static constexpr uint64_t magic = 0x6e616c705f617070ull;
    uint64_t header = magic;
    uint64_t fingerprint = 0;
    std::vector<work_item> items;
    std::vector<split_group> groups;
    int32_t partials = 0;
    int forced_kv_splits = 0;
};

/// Query tokens per item: about 64 (token, q head) rows, since the q heads of one kv head share
/// each K/V row they read.
inline dim tokens_per_tile(const paged_attention_problem &p) {
    return std::max<dim>(1, 64 / (p.q_heads / p.kv_heads));
}

/// Floats of one partial result: rows x head_size accumulators, then rows maxima, rows sums.
inline size_t partial_floats(const paged_attention_problem &p) {
    const dim rows = tokens_per_tile(p) * (p.q_heads / p.kv_heads);
    return static_cast<size_t>(rows * (p.head_size + 2));
}

/// At most this many partials per step, so that a scratchpad sized at creation always holds them.
inline int32_t max_partials(int threads) {
    return 8 * std::max(threads, 1);
}

/// Hash of everything the partition depends on except the thread count.
uint64_t plan_fingerprint(const paged_attention_problem &p, dim num_seqs, const int32_t *seq_lens,
                          const int32_t *query_start_loc, int forced_kv_splits);

/// Fills `out` (reusing its capacity). Splits KV ranges when there are fewer items than 8x
/// `threads`, or into exactly `forced_kv_splits` parts when that is > 0 (1: no split); never more than
/// `partial_limit` partials. Inputs must be valid (checked by the caller).
void build_plan(const paged_attention_problem &p, dim num_seqs, const int32_t *seq_lens,
                const int32_t *query_start_loc, int threads, int forced_kv_splits, int32_t partial_limit,
                plan_data &out);

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

/// The end of a work item: rows x head_size accumulators `acc` with their running maxima and sums
/// become dst rows (normalized, times `out_factor`; fully masked rows give zeros), or, for a split
/// item, its partial result (unnormalized, times `out_factor`).
void store_item_output(const paged_attention_problem &p, const paged_attention_arguments &a,
                       const work_item &item, float *acc, const float *row_max, const float *row_sum,
                       float out_factor, float *partial);

} // namespace detail
} // namespace pagedattn
