#include "plan.hpp"

#include "src/fp8.hpp"

namespace pagedattn {
namespace detail {

namespace {
constexpr dim min_split_tokens = 256; // shorter KV pieces cost more to merge than they save
// Work items wanted per thread before long ranges are split: with only one or two per thread, a
// thread slowed down (a shared machine, another process) leaves the others idle at the end.
constexpr dim items_per_thread = 8;

uint64_t mix(uint64_t hash, uint64_t value) {
    for (int i = 0; i < 8; ++i) { // FNV-1a over the value's bytes
        hash ^= (value >> (8 * i)) & 0xFF;
        hash *= 0x100000001b3ull;
    }
    return hash;
}
} // namespace

uint64_t plan_fingerprint(const paged_attention_problem &p, dim num_seqs, const int32_t *seq_lens,
                          const int32_t *query_start_loc, int forced_kv_splits) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (dim v :
         { p.q_heads, p.kv_heads, p.head_size, p.block_size, p.options.window_left, p.options.window_right,
           static_cast<dim>(p.options.causal), static_cast<dim>(forced_kv_splits), num_seqs })
        h = mix(h, static_cast<uint64_t>(v));
    for (dim s = 0; s < num_seqs; ++s)
        h = mix(h, static_cast<uint32_t>(seq_lens[s]));
    for (dim s = 0; s <= num_seqs; ++s)
        h = mix(h, static_cast<uint32_t>(query_start_loc[s]));
    return h;
}

void build_plan(const paged_attention_problem &p, dim num_seqs, const int32_t *seq_lens,
                const int32_t *query_start_loc, int threads, int forced_kv_splits, int32_t partial_limit,
                plan_data &out) {
    out.fingerprint = plan_fingerprint(p, num_seqs, seq_lens, query_start_loc, forced_kv_splits);
    out.items.clear();
    out.groups.clear();
    out.partials = 0;
    out.forced_kv_splits = forced_kv_splits;
    const dim tile = tokens_per_tile(p);
    dim total_kv = 0;
    for (dim s = 0; s < num_seqs; ++s) {
        const dim q_len = query_start_loc[s + 1] - query_start_loc[s];
        const dim context = seq_lens[s] - q_len;
        for (dim first = 0; first < q_len; first += tile) {
            const dim last = std::min(q_len, first + tile);
            // The union of the tile's visible ranges (each row still masks its own).
            const kv_range a = visible_range(p.options, context + first, seq_lens[s]);
            const kv_range b = visible_range(p.options, context + last - 1, seq_lens[s]);
            const dim begin = std::min(a.begin, b.begin), end = std::max(a.end, b.end);
            for (dim h = 0; h < p.kv_heads; ++h) {
                out.items.push_back({ s, h, first, last, begin, std::max(begin, end), -1 });
                total_kv += std::max<dim>(0, end - begin);
            }
        }
    }

    const bool few_items = threads > 1 && static_cast<dim>(out.items.size()) < items_per_thread * threads;
    if (forced_kv_splits == 1 || (forced_kv_splits <= 0 && !few_items) || total_kv == 0) return;
    const size_t unsplit = out.items.size();
    const dim target_items = items_per_thread * static_cast<dim>(threads);
    for (size_t i = 0; i < unsplit; ++i) {
        const work_item item = out.items[i];
        const dim length = item.kv_end - item.kv_begin;
        dim parts = forced_kv_splits > 1 ? std::min<dim>(forced_kv_splits, length)
                                         : std::min<dim>((length * target_items + total_kv - 1) / total_kv,
                                                         length / min_split_tokens);
        parts = std::min<dim>(parts, partial_limit - out.partials);
        if (parts < 2) continue;
        // Pieces of equal length, rounded to whole cache blocks when the range allows it.
        dim piece = (length + parts - 1) / parts;
        if (piece >= p.block_size) piece = (piece + p.block_size - 1) / p.block_size * p.block_size;
        split_group group { item.seq, item.kv_head, item.first_token, item.last_token, out.partials, 0 };
        for (dim begin = item.kv_begin; begin < item.kv_end; begin += piece) {
            work_item part = item;
            part.kv_begin = begin;
            part.kv_end = std::min(item.kv_end, begin + piece);
            part.partial = out.partials++;
            ++group.count;
            if (group.count == 1)
                out.items[i] = part; // the first piece replaces the item in place
            else
                out.items.push_back(part);
        }
        out.groups.push_back(group);
    }
}

void store_item_output(const paged_attention_problem &p, const paged_attention_arguments &a,
                       const work_item &item, float *acc, const float *row_max, const float *row_sum,
                       float out_factor, float *partial) {
    const dim group = p.q_heads / p.kv_heads, d = p.head_size;
    const dim rows = (item.last_token - item.first_token) * group;
    if (partial) {
        for (dim i = 0; i < rows * d; ++i)
            partial[i] = acc[i] * out_factor;
        std::copy(row_max, row_max + rows, partial + rows * d);
        std::copy(row_sum, row_sum + rows, partial + rows * d + rows);
        return;
    }
    const dim q_begin = a.query_start_loc[item.seq];
    const dim dst_size = static_cast<dim>(data_type_size(p.dst_type));
    for (dim r = 0; r < rows; ++r) {
        const dim token = q_begin + item.first_token + r / group, head = item.kv_head * group + r % group;
        float *out = acc + r * d;
        const float scale = row_sum[r] > 0.f ? out_factor / row_sum[r] : 0.f; // fully masked: zeros
        for (dim i = 0; i < d; ++i)
            out[i] *= scale;
        char *dst = static_cast<char *>(a.dst) +
                    (token * a.dst_token_stride + head * a.dst_head_stride) * dst_size;
        convert_row_from_f32(out, d, 1.f, p.dst_type, dst);
    }
}

} // namespace detail
} // namespace pagedattn
