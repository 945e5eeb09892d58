// paged_attention: attention of a step's query tokens against a paged KV cache.
#pragma once

#include "pagedattn/common.hpp"

namespace pagedattn {

/// The attention options fixed at creation (paged_attention::options).
struct paged_attention_options {
    /// Multiplies q·k. 0 means 1 / sqrt(head_size).
    float softmax_scale = 0.f;
    /// Query token i of a sequence sees KV tokens j <= p, p = seq_len - q_len + i.
    bool causal = true;
    /// Sliding window, both bounds inclusive: p - window_left <= j <= p + window_right; -1 is
    /// unbounded. vLLM's window W is window_left = W - 1, window_right = 0.
    dim window_left = -1, window_right = -1;
    /// Logit soft-cap: x = cap * tanh(x / cap) when cap > 0.
    float soft_cap = 0.f;
    /// ARG_ALIBI_SLOPES is given at execute: x += slope[h] * (j - p).
    bool alibi_slopes = false;
    /// ARG_SINKS is given at execute: one raw logit per q head that joins the softmax
    /// denominator only.
    bool sinks = false;
};

/// Arguments of execute (T = tokens in the step, S = sequences, see README for the semantics):
///   ARG_QUERY           [T, Hq, D] f32/bf16/f16, unit stride on D
///   ARG_K_CACHE, ARG_V_CACHE  as query_md() gives them
///   ARG_BLOCK_TABLE     s32 [S, W], unit stride on dim 1; row s lists the cache blocks of sequence s
///   ARG_SEQ_LENS        s32 [S]: KV length of each sequence including this step's tokens
///   ARG_QUERY_START_LOC s32 [S + 1]: 0, then cumulative query lengths, ending at T
///   ARG_DST             [T, Hq, D] of the desc's dst type, unit stride on D
///   ARG_ALIBI_SLOPES, ARG_SINKS   f32 [Hq], when the options say they are given
///   ARG_K_SCALES, ARG_V_SCALES    f32, when the attribute sets a scales mask for that cache
///   ARG_SCRATCHPAD      u8 [scratchpad_desc() size], in scratchpad_mode::user
///   ARG_PLAN            optional: plan::as_tensor() of a plan built for this step
class paged_attention {
public:
    using options = paged_attention_options;

    class desc {
    public:
        /// query and dst: [T, Hq, D], T a runtime_dim (or fixed); k_cache and v_cache:
        /// [num_blocks, Hkv, block_size, D] with a layout. Validated here.
        desc(const tensor_desc &query, const tensor_desc &k_cache, const tensor_desc &v_cache,
             const tensor_desc &dst, const options &opts = options());
        const tensor_desc &query() const { return query_; }
        const tensor_desc &k_cache() const { return k_cache_; }
        const tensor_desc &v_cache() const { return v_cache_; }
        const tensor_desc &dst() const { return dst_; }
        const options &get_options() const { return options_; }

    private:
        tensor_desc query_, k_cache_, v_cache_, dst_;
        options options_;
    };

    class primitive_desc : public primitive_desc_base {
    public:
        primitive_desc() = default;
        /// Walks the implementation list and keeps the first that accepts. Throws unimplemented
        /// when none does, unless allow_empty (then the pd is empty: operator bool is false).
        primitive_desc(const dnnl::engine &engine, const desc &d,
                       const primitive_attr &attr = primitive_attr(), bool allow_empty = false);
        const desc &get_desc() const;
    };

    /// The step's work partition (flashinfer's plan/run, vLLM's scheduler metadata): built once per
    /// step from its seq lens and query start loc, then passed to every layer's execute as ARG_PLAN
    /// so that execute does no planning (and, with a user scratchpad, allocates nothing). It carries
    /// a fingerprint of the problem and the step it was built from; execute rejects a mismatch. It
    /// balances the work for the calling arena's concurrency: when there are fewer than 8 work items
    /// per thread (few long sequences) it splits KV ranges, merged afterwards with log-sum-exp.
    class plan {
    public:
        plan() = default;
        /// seq_lens s32 [S], query_start_loc s32 [S + 1], as for execute. forced_kv_splits > 0
        /// splits every work item's KV range into that many pieces (1: none; capped by the
        /// scratchpad's room), for tests; 0 lets the plan decide.
        plan(const primitive_desc &pd, const tensor &seq_lens, const tensor &query_start_loc,
             int forced_kv_splits = 0);
        /// The plan as an argument: exec_args{..., {ARG_PLAN, plan.as_tensor()}}. The plan must
        /// outlive the executes that use it.
        tensor as_tensor() const;
        /// Work items whose KV range was split across threads (0: none).
        int split_items() const;

    private:
        std::shared_ptr<void> data_;
    };

    paged_attention() = default;
    explicit paged_attention(const primitive_desc &pd);
    const primitive_desc &get_primitive_desc() const { return pd_; }

    /// Validates every argument (dst is untouched on error), then computes dst.
    void execute(const dnnl::stream &stream, const exec_args &args) const;
    /// oneDNN interop: each memory's dims, data type and strides are read from its desc; a cache
    /// may be any memory of at least query_md(arg).get_size() bytes (its type comes from the pd).
    void execute(const dnnl::stream &stream, const std::unordered_map<int, dnnl::memory> &args) const;

private:
    primitive_desc pd_;
    std::shared_ptr<void> resources_; // per-thread scratch of scratchpad_mode::library
};

} // namespace pagedattn
