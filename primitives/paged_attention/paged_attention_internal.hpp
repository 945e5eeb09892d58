// What the paged_attention primitive hands its implementations: the problem fixed at creation and
// the validated arguments of one execute. Every implementation receives only checked input.
#pragma once

#include <cstdint>
#include <string>

#include "pagedattn/paged_attention.hpp"
#include "src/scratch.hpp"

namespace pagedattn {
namespace detail {

struct paged_attention_problem {
    data_type query_type, dst_type;
    tensor_desc k_cache, v_cache; // resolved layouts: [num_blocks, kv_heads, block_size, head_size]
    dim q_heads, kv_heads, head_size, block_size, num_blocks;
    paged_attention::options options; // softmax_scale resolved (never 0)
    int k_scales_mask, v_scales_mask; // -1: no scales
    fpmath_mode fpmath;
};

/// Pointers and runtime dims of one execute, after validation. Strides are in elements.
struct paged_attention_arguments {
    dim num_tokens, num_seqs;
    const void *query;
    dim query_token_stride, query_head_stride;
    void *dst;
    dim dst_token_stride, dst_head_stride;
    const void *k_cache, *v_cache;
    const int32_t *block_table;
    dim block_table_stride;
    const int32_t *seq_lens, *query_start_loc;
    const float *alibi_slopes, *sinks; // null when not given
    const float *k_scales, *v_scales;  // null when the cache has no scales
};

struct work_item; // plan.hpp

struct paged_attention_implementation {
    const char *name; // impl_info_str
    cpu_isa isa;      // what the host (and the caps) must allow
    /// Empty when it accepts the problem, else why not (PAGEDATTN_VERBOSE=3 prints it).
    std::string (*decline)(const paged_attention_problem &, const primitive_attr &);
    size_t (*scratch_bytes_per_thread)(const paged_attention_problem &);
    /// Computes one work item with `scratch_bytes_per_thread` bytes of `scratch`: into dst, or,
    /// when `partial` is not null (a split KV range), into the partial result: rows x head_size
    /// unnormalized outputs (V scales applied), then rows maxima, then rows sums; sinks are left
    /// to the merge. `next` (may be null) is the item this thread runs next: its first KV lines
    /// can be fetched while this one's last chunk computes.
    void (*run_item)(const paged_attention_problem &, const paged_attention_arguments &, const work_item &,
                     const work_item *next, float *scratch, float *partial);
};

/// The list, best first, reference last (implementation_list.cpp).
extern const paged_attention_implementation *const paged_attention_implementations[];
extern const int paged_attention_implementation_count;

extern const paged_attention_implementation paged_attention_amx;
extern const paged_attention_implementation paged_attention_avx512_bf16;
extern const paged_attention_implementation paged_attention_avx512;
extern const paged_attention_implementation paged_attention_avx2;
extern const paged_attention_implementation paged_attention_ref;

/// The softmax's exponential of an x64 implementation (exp_negative of src/x64/f32_vectors.hpp) over
/// n values, n a multiple of 16: out[i] = exp(x[i]) for x[i] <= 0. Defined in avx512.cpp / avx2.cpp
/// (x64:avx512_bf16 and x64:amx share x64:avx512's), for the test of its accuracy.
void softmax_exp_avx512(const float *x, int64_t n, float *out);
void softmax_exp_avx2(const float *x, int64_t n, float *out);
using softmax_exp = void (*)(const float *x, int64_t n, float *out);
/// softmax_exp_avx512 for cpu_isa::avx512, softmax_exp_avx2 for cpu_isa::avx2, when the library was
/// built with them (PAGEDATTN_ENABLE_X64); else null. The caller checks that the host runs them.
softmax_exp paged_attention_softmax_exp(cpu_isa isa);

} // namespace detail
} // namespace pagedattn
