// paged_attention: descriptor validation, the implementation-list walk, and the checks of every
// execute argument before any implementation runs.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "paged_attention_internal.hpp"
#include "plan.hpp"
#include "src/arguments.hpp"
#include "src/cache_desc.hpp"
#include "src/fp8.hpp"
#include "src/parallel.hpp"
#include "src/primitive_desc_state.hpp"

#include <limits>

namespace pagedattn {
namespace detail {
namespace {

constexpr const char *primitive_name = "paged_attention";

[[noreturn]] void fail_desc(const char *what, const std::string &rule) {
    throw_error(status::invalid_arguments, concat(primitive_name, ": ", what, ": ", rule));
}

void validate_activation(const char *what, const tensor_desc &d) {
    if (d.ndims() != 3)
        fail_desc(what, concat("expected 3 dims [T, Hq, D], got ", dims_string(d.get_dims())));
    if (!is_activation_type(d.get_data_type()))
        fail_desc(what, concat("data type ", data_type_name(d.get_data_type()), " is not f32, bf16 or f16"));
    const dims &x = d.get_dims();
    if (x[0] != runtime_dim && x[0] < 0) fail_desc(what, "T must be runtime_dim or >= 0");
    if (x[1] < 1) fail_desc(what, concat("Hq = ", x[1], " must be >= 1"));
    if (x[2] < 1 || x[2] > max_head_size) fail_desc(what, concat("head size ", x[2], " is outside [1, 512]"));
}

tensor_desc resolve_cache(const char *what, const tensor_desc &d) {
    return resolve_cache_desc(primitive_name, what, d);
}

std::string problem_string(const paged_attention_problem &p) {
    const auto &o = p.options;
    std::string out =
            concat("hq", p.q_heads, ":hkv", p.kv_heads, ":d", p.head_size, ":bs", p.block_size, ":nb",
                   p.num_blocks, " scale:", o.softmax_scale, o.causal ? " causal" : " noncausal");
    if (o.window_left >= 0 || o.window_right >= 0)
        out += concat(" window:", o.window_left, ":", o.window_right);
    if (o.soft_cap > 0.f) out += concat(" softcap:", o.soft_cap);
    if (o.alibi_slopes) out += " alibi";
    if (o.sinks) out += " sinks";
    return out;
}

struct pd_state : primitive_desc_state {
    paged_attention::desc desc;
    paged_attention_problem problem;
    dnnl::engine keep_engine;

    pd_state(const paged_attention::desc &d) : desc(d) {}

    const paged_attention_implementation &implementation() const {
        return *paged_attention_implementations[impl_index];
    }

    tensor_desc query_md(int arg) const override {
        switch (arg) {
            case ARG_QUERY: return desc.query();
            case ARG_DST: return desc.dst();
            case ARG_K_CACHE: return problem.k_cache;
            case ARG_V_CACHE: return problem.v_cache;
            case ARG_BLOCK_TABLE: return tensor_desc({ runtime_dim, runtime_dim }, data_type::s32);
            case ARG_SEQ_LENS: return tensor_desc({ runtime_dim }, data_type::s32);
            case ARG_QUERY_START_LOC: return tensor_desc({ runtime_dim }, data_type::s32);
            case ARG_ALIBI_SLOPES:
                return problem.options.alibi_slopes ? tensor_desc({ problem.q_heads }, data_type::f32)
                                                    : tensor_desc();
            case ARG_SINKS:
                return problem.options.sinks ? tensor_desc({ problem.q_heads }, data_type::f32)
                                             : tensor_desc();
            case ARG_K_SCALES:
            case ARG_V_SCALES: {
                const int mask = arg == ARG_K_SCALES ? problem.k_scales_mask : problem.v_scales_mask;
                if (mask < 0) return tensor_desc();
                if (mask == scales_per_tensor) return tensor_desc({ 1 }, data_type::f32);
                if (mask == scales_per_kv_head) return tensor_desc({ problem.kv_heads }, data_type::f32);
                return tensor_desc({ problem.num_blocks, problem.kv_heads, problem.block_size },
                                   data_type::f32);
            }
            default: return tensor_desc();
        }
    }

    bool select(int first) {
        impl_index =
                find_implementation(paged_attention_implementations, paged_attention_implementation_count,
                                    first, primitive_name, problem, attr);
        if (impl_index < 0) return false;
        impl_name = implementation().name;
        scratch_bytes_per_thread = implementation().scratch_bytes_per_thread(problem);
        shared_scratch_bytes =
                static_cast<size_t>(max_partials(max_threads)) * partial_floats(problem) * sizeof(float);
        return true;
    }

    std::shared_ptr<primitive_desc_state> next() const override {
        auto copy = std::make_shared<pd_state>(*this);
        if (!copy->select(impl_index + 1)) return nullptr;
        return copy;
    }
};

// Combines the partial results of a split KV range with log-sum-exp: weights exp(max_i - max).
void merge_group(const paged_attention_problem &p, const paged_attention_arguments &a, const split_group &g,
                 const float *partials) {
    const dim group = p.q_heads / p.kv_heads, d = p.head_size;
    const dim rows = (g.last_token - g.first_token) * group;
    const size_t stride = partial_floats(p);
    const dim q_begin = a.query_start_loc[g.seq];
    float out[max_head_size];
    for (dim r = 0; r < rows; ++r) {
        const dim token = q_begin + g.first_token + r / group, head = g.kv_head * group + r % group;
        float max = a.sinks ? a.sinks[head] : -std::numeric_limits<float>::infinity();
        for (int32_t i = 0; i < g.count; ++i) {
            const float *part = partials + (g.first_partial + i) * stride;
            max = std::max(max, part[rows * d + r]);
        }
        float sum = a.sinks && max != -std::numeric_limits<float>::infinity() ? std::exp(a.sinks[head] - max)
                                                                              : 0.f;
        std::fill(out, out + d, 0.f);
        for (int32_t i = 0; i < g.count; ++i) {
            const float *part = partials + (g.first_partial + i) * stride;
            const float part_sum = part[rows * d + rows + r];
            if (part_sum == 0.f) continue; // nothing visible in this piece
            const float weight = std::exp(part[rows * d + r] - max);
            sum += weight * part_sum;
            for (dim k = 0; k < d; ++k)
                out[k] += weight * part[r * d + k];
        }
        const float inverse = sum > 0.f ? 1.f / sum : 0.f; // a fully masked row yields zeros
        for (dim k = 0; k < d; ++k)
            out[k] *= inverse;
        char *dst = static_cast<char *>(a.dst) + (token * a.dst_token_stride + head * a.dst_head_stride) *
                                                         static_cast<dim>(data_type_size(p.dst_type));
        convert_row_from_f32(out, d, 1.f, p.dst_type, dst);
    }
}

// Runs every work item in parallel, then, as a second phase, merges the split ones.
void run_plan(const paged_attention_problem &p, const paged_attention_arguments &a, const plan_data &plan,
              const paged_attention_implementation &impl, const thread_scratch &scratch) {
    float *partials = reinterpret_cast<float *>(scratch.shared());
    const size_t stride = partial_floats(p);
    parallel_for<size_t>(0, plan.items.size(), 1, [&](size_t first, size_t last) {
        float *buffer = reinterpret_cast<float *>(scratch.get());
        for (size_t i = first; i != last; ++i) {
            const work_item &item = plan.items[i];
            impl.run_item(p, a, item, i + 1 != last ? &plan.items[i + 1] : nullptr, buffer,
                          item.partial < 0 ? nullptr : partials + item.partial * stride);
        }
    });
    if (plan.groups.empty()) return;
    parallel_for<size_t>(0, plan.groups.size(), 1, [&](size_t first, size_t last) {
        for (size_t i = first; i != last; ++i)
            merge_group(p, a, plan.groups[i], partials);
    });
}

// Query start loc and seq lens of a step: shapes, types, and the values' rules. Returns S.
dim check_step(const argument_checker &check, const tensor &query_start_loc, const tensor &seq_lens) {
    check.expect_type(query_start_loc, ARG_QUERY_START_LOC, data_type::s32);
    PAGEDATTN_EXPECT(check,
                     query_start_loc.get_desc().ndims() == 1 && query_start_loc.get_desc().get_dims()[0] >= 1,
                     ARG_QUERY_START_LOC, "dims ", dims_string(query_start_loc.get_desc().get_dims()),
                     ", expected [S + 1]");
    const dim num_seqs = query_start_loc.get_desc().get_dims()[0] - 1;
    check.expect_shape(query_start_loc, ARG_QUERY_START_LOC, { num_seqs + 1 }, "[S + 1]");
    check.expect_type(seq_lens, ARG_SEQ_LENS, data_type::s32);
    check.expect_shape(seq_lens, ARG_SEQ_LENS, { num_seqs }, "[S] (S from query_start_loc)");
    const int32_t *starts = static_cast<const int32_t *>(query_start_loc.get_data_handle());
    const int32_t *lens = static_cast<const int32_t *>(seq_lens.get_data_handle());
    PAGEDATTN_EXPECT(check, starts[0] == 0, ARG_QUERY_START_LOC, "starts at ", starts[0],
                     ", must start at 0");
    for (dim s = 0; s < num_seqs; ++s) {
        PAGEDATTN_EXPECT(check, starts[s + 1] >= starts[s], ARG_QUERY_START_LOC, "decreases at sequence ", s,
                         " (", starts[s], " then ", starts[s + 1], ")");
        const dim q_len = starts[s + 1] - starts[s];
        PAGEDATTN_EXPECT(check, lens[s] >= q_len, ARG_SEQ_LENS, "sequence ", s, " has seq_len ", lens[s],
                         " < its query length ", q_len);
    }
    return num_seqs;
}

const pd_state &state_of(const primitive_desc_base &pd) {
    if (!pd) throw_error(status::invalid_arguments, concat(primitive_name, ": the primitive_desc is empty"));
    return static_cast<const pd_state &>(*pd.state());
}

} // namespace
} // namespace detail

paged_attention::desc::desc(const tensor_desc &query, const tensor_desc &k_cache, const tensor_desc &v_cache,
                            const tensor_desc &dst, const options &opts)
    : query_(query), k_cache_(k_cache), v_cache_(v_cache), dst_(dst), options_(opts) {
    using namespace detail;
    validate_activation("query", query);
    validate_activation("dst", dst);
    resolve_cache("k_cache", k_cache);
    resolve_cache("v_cache", v_cache);
    const dims &q = query.get_dims(), &kc = k_cache.get_dims();
    if (dst.get_dims()[1] != q[1] || dst.get_dims()[2] != q[2] ||
        (q[0] != runtime_dim && dst.get_dims()[0] != runtime_dim && q[0] != dst.get_dims()[0]))
        fail_desc("dst",
                  concat("dims ", dims_string(dst.get_dims()), " differ from query's ", dims_string(q)));
    if (v_cache.get_dims() != kc)
        fail_desc("v_cache", concat("dims ", dims_string(v_cache.get_dims()), " differ from k_cache's ",
                                    dims_string(kc)));
    if (kc[3] != q[2]) fail_desc("k_cache", concat("head size ", kc[3], " differs from query's ", q[2]));
    if (q[1] % kc[1] != 0) fail_desc("query", concat("Hq = ", q[1], " is not a multiple of Hkv = ", kc[1]));
    if (!std::isfinite(opts.softmax_scale)) fail_desc("options", "softmax_scale must be finite");
    if (opts.window_left < -1 || opts.window_right < -1)
        fail_desc("options", concat("window (", opts.window_left, ", ", opts.window_right,
                                    "): bounds are >= 0, or -1 for unbounded"));
    if (!(opts.soft_cap >= 0.f) || !std::isfinite(opts.soft_cap))
        fail_desc("options", concat("soft_cap ", opts.soft_cap, " must be finite and >= 0"));
}

paged_attention::primitive_desc::primitive_desc(const dnnl::engine &engine, const desc &d,
                                                const primitive_attr &attr, bool allow_empty) {
    using namespace detail;
    const auto start = std::chrono::steady_clock::now();
    check_engine(primitive_name, engine);
    auto state = std::make_shared<pd_state>(d);
    state->engine = engine;
    state->attr = attr;
    state->max_threads = current_max_threads();
    paged_attention_problem &p = state->problem;
    p.query_type = d.query().get_data_type();
    p.dst_type = d.dst().get_data_type();
    p.k_cache = resolve_cache("k_cache", d.k_cache());
    p.v_cache = resolve_cache("v_cache", d.v_cache());
    p.num_blocks = p.k_cache.get_dims()[0];
    p.kv_heads = p.k_cache.get_dims()[1];
    p.block_size = p.k_cache.get_dims()[2];
    p.head_size = p.k_cache.get_dims()[3];
    p.q_heads = d.query().get_dims()[1];
    p.options = d.get_options();
    if (p.options.softmax_scale == 0.f)
        p.options.softmax_scale = 1.f / std::sqrt(static_cast<float>(p.head_size));
    p.k_scales_mask = attr.get_scales_mask(ARG_K_CACHE);
    p.v_scales_mask = attr.get_scales_mask(ARG_V_CACHE);
    p.fpmath = attr.get_fpmath_mode();
    check_scales_attr(primitive_name, attr, p.k_cache, p.v_cache);
    if (!state->select(0)) {
        if (allow_empty) return;
        throw_error(status::unimplemented,
                    concat(primitive_name, ": no implementation on this machine accepts ", problem_string(p),
                           " (PAGEDATTN_VERBOSE=3 prints why each declined)"));
    }
    state_ = state;
    if (get_verbose() >= 2)
        verbose_print(concat("create,cpu,", primitive_name, ",", state->impl_name, ",query:", d.query().str(),
                             " k_cache:", p.k_cache.str(), " v_cache:", p.v_cache.str(),
                             " dst:", d.dst().str(), ",", attr_string(attr), ",", problem_string(p), ",",
                             milliseconds_since(start)));
}

const paged_attention::desc &paged_attention::primitive_desc::get_desc() const {
    return detail::state_of(*this).desc;
}

paged_attention::paged_attention(const primitive_desc &pd) : pd_(pd) {
    const auto &state = detail::state_of(pd);
    if (state.attr.get_scratchpad_mode() == scratchpad_mode::library)
        resources_ = std::make_shared<detail::library_scratch>(state.scratch_bytes_per_thread);
}

void paged_attention::execute(const dnnl::stream &stream, const exec_args &args) const {
    using namespace detail;
    const auto start = std::chrono::steady_clock::now();
    const pd_state &state = state_of(pd_);
    const paged_attention_problem &p = state.problem;
    if (!stream)
        throw_error(status::invalid_arguments, concat(primitive_name, ": stream: empty dnnl::stream"));

    argument_ids allowed = { ARG_QUERY,    ARG_K_CACHE,         ARG_V_CACHE, ARG_BLOCK_TABLE,
                             ARG_SEQ_LENS, ARG_QUERY_START_LOC, ARG_DST };
    if (p.options.alibi_slopes) allowed.add(ARG_ALIBI_SLOPES);
    if (p.options.sinks) allowed.add(ARG_SINKS);
    if (p.k_scales_mask >= 0) allowed.add(ARG_K_SCALES);
    if (p.v_scales_mask >= 0) allowed.add(ARG_V_SCALES);
    if (state.attr.get_scratchpad_mode() == scratchpad_mode::user) allowed.add(ARG_SCRATCHPAD);
    allowed.add(ARG_PLAN);
    argument_checker check(primitive_name, args, allowed);

    const tensor &query = check.required(ARG_QUERY);
    const dim fixed_tokens = pd_.get_desc().query().get_dims()[0];
    check.expect_shape(query, ARG_QUERY, { fixed_tokens, p.q_heads, p.head_size }, "[T, Hq, D]");
    check.expect_type(query, ARG_QUERY, p.query_type);
    const dim num_tokens = query.get_desc().get_dims()[0];

    const tensor &dst = check.required(ARG_DST);
    check.expect_shape(dst, ARG_DST, { num_tokens, p.q_heads, p.head_size }, "[T, Hq, D] (T of query)");
    check.expect_type(dst, ARG_DST, p.dst_type);

    const tensor &k_cache = check.required(ARG_K_CACHE);
    check.expect_desc(k_cache, ARG_K_CACHE, p.k_cache);
    const tensor &v_cache = check.required(ARG_V_CACHE);
    check.expect_desc(v_cache, ARG_V_CACHE, p.v_cache);

    const tensor &query_start_loc = check.required(ARG_QUERY_START_LOC);
    const tensor &seq_lens = check.required(ARG_SEQ_LENS);
    const dim num_seqs = check_step(check, query_start_loc, seq_lens);

    const tensor &block_table = check.required(ARG_BLOCK_TABLE);
    check.expect_type(block_table, ARG_BLOCK_TABLE, data_type::s32);
    check.expect_shape(block_table, ARG_BLOCK_TABLE, { num_seqs, runtime_dim }, "[S, max_blocks_per_seq]");
    const dim table_width = block_table.get_desc().get_dims()[1];
    const dim table_stride = block_table.get_desc().get_strides()[0];

    const int32_t *starts = static_cast<const int32_t *>(query_start_loc.get_data_handle());
    const int32_t *lens = static_cast<const int32_t *>(seq_lens.get_data_handle());
    const int32_t *table = static_cast<const int32_t *>(block_table.get_data_handle());
    for (dim s = 0; s < num_seqs; ++s) {
        const dim blocks_needed = (lens[s] + p.block_size - 1) / p.block_size;
        PAGEDATTN_EXPECT(check, blocks_needed <= table_width, ARG_BLOCK_TABLE, "sequence ", s, " needs ",
                         blocks_needed, " blocks for seq_len ", lens[s], ", the table has ", table_width,
                         " columns");
        for (dim b = 0; b < blocks_needed; ++b) {
            const int32_t block = table[s * table_stride + b];
            PAGEDATTN_EXPECT(check, block >= 0 && block < p.num_blocks, ARG_BLOCK_TABLE, "entry [", s, ", ",
                             b, "] = ", block, " is outside [0, ", p.num_blocks, ")");
        }
    }
    PAGEDATTN_EXPECT(check, starts[num_seqs] == num_tokens, ARG_QUERY_START_LOC, "ends at ", starts[num_seqs],
                     ", must end at T = ", num_tokens);

    paged_attention_arguments a {};
    a.num_tokens = num_tokens;
    a.num_seqs = num_seqs;
    a.query = query.get_data_handle();
    a.query_token_stride = query.get_desc().get_strides()[0];
    a.query_head_stride = query.get_desc().get_strides()[1];
    a.dst = dst.get_data_handle();
    a.dst_token_stride = dst.get_desc().get_strides()[0];
    a.dst_head_stride = dst.get_desc().get_strides()[1];
    a.k_cache = k_cache.get_data_handle();
    a.v_cache = v_cache.get_data_handle();
    a.block_table = table;
    a.block_table_stride = table_stride;
    a.seq_lens = lens;
    a.query_start_loc = starts;
    for (int arg : { ARG_ALIBI_SLOPES, ARG_SINKS }) {
        const bool given = arg == ARG_ALIBI_SLOPES ? p.options.alibi_slopes : p.options.sinks;
        if (!given) continue;
        const tensor &t = check.required(arg);
        check.expect_type(t, arg, data_type::f32);
        check.expect_shape(t, arg, { p.q_heads }, "[Hq]");
        (arg == ARG_ALIBI_SLOPES ? a.alibi_slopes : a.sinks) =
                static_cast<const float *>(t.get_data_handle());
    }
    for (int arg : { ARG_K_SCALES, ARG_V_SCALES }) {
        const int mask = arg == ARG_K_SCALES ? p.k_scales_mask : p.v_scales_mask;
        if (mask < 0) continue;
        const tensor &t = check.required(arg);
        check.expect_scales(t, arg, mask, p.k_cache.get_dims(), mask != scales_per_token);
        (arg == ARG_K_SCALES ? a.k_scales : a.v_scales) = static_cast<const float *>(t.get_data_handle());
    }

    // The partition: the caller's plan (checked against this step), or one built here.
    const plan_data *plan = nullptr;
    plan_data local_plan;
    if (const tensor *given = check.optional(ARG_PLAN)) {
        plan = static_cast<const plan_data *>(given->get_data_handle());
        check.expect(given->get_desc().get_size() == sizeof(plan_data) && plan->header == plan_data::magic,
                     ARG_PLAN, "not a paged_attention::plan (pass plan.as_tensor())");
        check.expect(
                plan->fingerprint == plan_fingerprint(p, num_seqs, lens, starts, plan->forced_kv_splits),
                ARG_PLAN,
                "built for another step or primitive_desc (seq lens, query start loc or problem differ)");
    } else {
        build_plan(p, num_seqs, lens, starts, current_max_threads(), 0, max_partials(state.max_threads),
                   local_plan);
        plan = &local_plan;
    }

    const paged_attention_implementation &impl = state.implementation();
    const size_t partial_size = partial_floats(p);
    if (state.attr.get_scratchpad_mode() == scratchpad_mode::user) {
        const tensor &scratchpad = check.required(ARG_SCRATCHPAD);
        const thread_scratch scratch(primitive_name, scratchpad.get_data_handle(),
                                     scratchpad.get_desc().get_size(), state.scratch_bytes_per_thread,
                                     state.max_threads, state.shared_scratch_bytes);
        run_plan(p, a, *plan, impl, scratch);
    } else {
        const thread_scratch scratch(static_cast<library_scratch *>(resources_.get()),
                                     plan->partials * partial_size * sizeof(float));
        run_plan(p, a, *plan, impl, scratch);
    }

    if (get_verbose() >= 1)
        verbose_print(concat("exec,cpu,", primitive_name, ",", impl.name, ",query:", query.get_desc().str(),
                             " k_cache:", p.k_cache.str(), " v_cache:", p.v_cache.str(), " dst:",
                             dst.get_desc().str(), ",", attr_string(state.attr), ",", problem_string(p), " t",
                             num_tokens, ":s", num_seqs, ":w", table_width, ",", milliseconds_since(start)));
}

paged_attention::plan::plan(const primitive_desc &pd, const tensor &seq_lens, const tensor &query_start_loc,
                            int forced_kv_splits) {
    using namespace detail;
    const pd_state &state = state_of(pd);
    const exec_args args = { { ARG_SEQ_LENS, seq_lens }, { ARG_QUERY_START_LOC, query_start_loc } };
    const argument_checker check("paged_attention::plan", args, { ARG_SEQ_LENS, ARG_QUERY_START_LOC });
    const dim num_seqs = check_step(check, check.required(ARG_QUERY_START_LOC), check.required(ARG_SEQ_LENS));
    auto data = std::make_shared<plan_data>();
    build_plan(state.problem, num_seqs, static_cast<const int32_t *>(seq_lens.get_data_handle()),
               static_cast<const int32_t *>(query_start_loc.get_data_handle()), current_max_threads(),
               forced_kv_splits, max_partials(state.max_threads), *data);
    data_ = data;
}

tensor paged_attention::plan::as_tensor() const {
    if (!data_) detail::throw_error(status::invalid_arguments, "paged_attention::plan: the plan is empty");
    return tensor(tensor_desc({ static_cast<dim>(sizeof(detail::plan_data)) }, data_type::u8), data_.get());
}

int paged_attention::plan::split_items() const {
    if (!data_) return 0;
    const auto &data = *static_cast<const detail::plan_data *>(data_.get());
    int count = 0;
    for (const auto &group : data.groups)
        count += group.count;
    return count;
}

void paged_attention::execute(const dnnl::stream &stream,
                              const std::unordered_map<int, dnnl::memory> &args) const {
    execute(stream, detail::tensors_from_memories("paged_attention", args,
                                                  [this](int arg) { return pd_.query_md(arg); }));
}

} // namespace pagedattn
