// reshape_and_cache: descriptor validation, the implementation-list walk, and the checks of every
// execute argument (every slot included) before any byte is written.
#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "reshape_and_cache_internal.hpp"
#include "src/arguments.hpp"
#include "src/cache_desc.hpp"
#include "src/fp8.hpp"
#include "src/primitive_desc_state.hpp"
#include "src/scratch.hpp"

namespace pagedattn {
namespace detail {
namespace {

constexpr const char *primitive_name = "reshape_and_cache";

[[noreturn]] void fail_desc(const char *what, const std::string &rule) {
    throw_error(status::invalid_arguments, concat(primitive_name, ": ", what, ": ", rule));
}

void validate_new_tokens(const char *what, const tensor_desc &d, const dims &cache_dims) {
    if (d.ndims() != 3)
        fail_desc(what, concat("expected 3 dims [T, Hkv, D], got ", dims_string(d.get_dims())));
    if (!is_activation_type(d.get_data_type()))
        fail_desc(what, concat("data type ", data_type_name(d.get_data_type()), " is not f32, bf16 or f16"));
    const dims &x = d.get_dims();
    if (x[0] != runtime_dim && x[0] < 0) fail_desc(what, "T must be runtime_dim or >= 0");
    if (x[1] != cache_dims[1] || x[2] != cache_dims[3])
        fail_desc(what, concat("dims ", dims_string(x), " do not match the cache's Hkv = ", cache_dims[1],
                               ", D = ", cache_dims[3]));
}

std::string problem_string(const reshape_and_cache_problem &p) {
    return concat("hkv", p.kv_heads, ":d", p.head_size, ":bs", p.block_size, ":nb", p.num_blocks);
}

struct pd_state : primitive_desc_state {
    reshape_and_cache::desc desc;
    reshape_and_cache_problem problem;

    pd_state(const reshape_and_cache::desc &d) : desc(d) {}

    const reshape_and_cache_implementation &implementation() const {
        return *reshape_and_cache_implementations[impl_index];
    }

    tensor_desc query_md(int arg) const override {
        switch (arg) {
            case ARG_KEY: return desc.key();
            case ARG_VALUE: return desc.value();
            case ARG_K_CACHE: return problem.k_cache;
            case ARG_V_CACHE: return problem.v_cache;
            case ARG_SLOT_MAPPING: return tensor_desc({ runtime_dim }, data_type::s64);
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
                find_implementation(reshape_and_cache_implementations, reshape_and_cache_implementation_count,
                                    first, primitive_name, problem, attr);
        if (impl_index < 0) return false;
        impl_name = implementation().name;
        return true;
    }

    std::shared_ptr<primitive_desc_state> next() const override {
        auto copy = std::make_shared<pd_state>(*this);
        if (!copy->select(impl_index + 1)) return nullptr;
        return copy;
    }
};

const pd_state &state_of(const primitive_desc_base &pd) {
    if (!pd) throw_error(status::invalid_arguments, concat(primitive_name, ": the primitive_desc is empty"));
    return static_cast<const pd_state &>(*pd.state());
}

// Marks every token whose slot a later token of the same call also writes, so that exactly one
// token (the last) reaches each slot even when tokens run in parallel. Empty when there are none.
std::vector<uint8_t> find_superseded(const reshape_and_cache_arguments &a) {
    auto slot_of = [&](dim t) { return a.slots64 ? a.slots64[t] : static_cast<dim>(a.slots32[t]); };
    // Increasing slots (prefill, and decode with one token per sequence in block order) repeat
    // none: no sort, no allocation.
    bool increasing = true;
    for (dim t = 0, last = -1; t < a.num_tokens && increasing; ++t) {
        const dim slot = slot_of(t);
        if (slot < 0) continue;
        increasing = slot > last;
        last = slot;
    }
    if (increasing) return {};
    std::vector<std::pair<dim, dim>> order; // (slot, token)
    order.reserve(static_cast<size_t>(a.num_tokens));
    for (dim t = 0; t < a.num_tokens; ++t)
        if (slot_of(t) >= 0) order.emplace_back(slot_of(t), t);
    std::sort(order.begin(), order.end());
    std::vector<uint8_t> superseded;
    for (size_t i = 1; i < order.size(); ++i) {
        if (order[i].first != order[i - 1].first) continue;
        if (superseded.empty()) superseded.assign(static_cast<size_t>(a.num_tokens), 0);
        superseded[static_cast<size_t>(order[i - 1].second)] = 1;
    }
    return superseded;
}

} // namespace
} // namespace detail

reshape_and_cache::desc::desc(const tensor_desc &key, const tensor_desc &value, const tensor_desc &k_cache,
                              const tensor_desc &v_cache)
    : key_(key), value_(value), k_cache_(k_cache), v_cache_(v_cache) {
    using namespace detail;
    const tensor_desc k = resolve_cache_desc(primitive_name, "k_cache", k_cache);
    const tensor_desc v = resolve_cache_desc(primitive_name, "v_cache", v_cache);
    if (v.get_dims() != k.get_dims())
        fail_desc("v_cache", concat("dims ", dims_string(v.get_dims()), " differ from k_cache's ",
                                    dims_string(k.get_dims())));
    validate_new_tokens("key", key, k.get_dims());
    validate_new_tokens("value", value, k.get_dims());
    const dim tk = key.get_dims()[0], tv = value.get_dims()[0];
    if (tk != runtime_dim && tv != runtime_dim && tk != tv)
        fail_desc("value", concat("T = ", tv, " differs from key's T = ", tk));
}

reshape_and_cache::primitive_desc::primitive_desc(const dnnl::engine &engine, const desc &d,
                                                  const primitive_attr &attr, bool allow_empty) {
    using namespace detail;
    const auto start = std::chrono::steady_clock::now();
    check_engine(primitive_name, engine);
    auto state = std::make_shared<pd_state>(d);
    state->engine = engine;
    state->attr = attr;
    state->max_threads = current_max_threads();
    reshape_and_cache_problem &p = state->problem;
    p.key_type = d.key().get_data_type();
    p.value_type = d.value().get_data_type();
    p.k_cache = resolve_cache_desc(primitive_name, "k_cache", d.k_cache());
    p.v_cache = resolve_cache_desc(primitive_name, "v_cache", d.v_cache());
    p.num_blocks = p.k_cache.get_dims()[0];
    p.kv_heads = p.k_cache.get_dims()[1];
    p.block_size = p.k_cache.get_dims()[2];
    p.head_size = p.k_cache.get_dims()[3];
    p.k_scales_mask = attr.get_scales_mask(ARG_K_CACHE);
    p.v_scales_mask = attr.get_scales_mask(ARG_V_CACHE);
    check_scales_attr(primitive_name, attr, p.k_cache, p.v_cache);
    if (!state->select(0)) {
        if (allow_empty) return;
        throw_error(status::unimplemented,
                    concat(primitive_name, ": no implementation on this machine accepts ", problem_string(p),
                           " (PAGEDATTN_VERBOSE=3 prints why each declined)"));
    }
    state_ = state;
    if (get_verbose() >= 2)
        verbose_print(concat("create,cpu,", primitive_name, ",", state->impl_name, ",key:", d.key().str(),
                             " value:", d.value().str(), " k_cache:", p.k_cache.str(),
                             " v_cache:", p.v_cache.str(), ",", attr_string(attr), ",", problem_string(p),
                             ",", milliseconds_since(start)));
}

const reshape_and_cache::desc &reshape_and_cache::primitive_desc::get_desc() const {
    return detail::state_of(*this).desc;
}

reshape_and_cache::reshape_and_cache(const primitive_desc &pd) : pd_(pd) {
    detail::state_of(pd);
}

void reshape_and_cache::execute(const dnnl::stream &stream, const exec_args &args) const {
    using namespace detail;
    const auto start = std::chrono::steady_clock::now();
    const pd_state &state = state_of(pd_);
    const reshape_and_cache_problem &p = state.problem;
    if (!stream)
        throw_error(status::invalid_arguments, concat(primitive_name, ": stream: empty dnnl::stream"));

    argument_ids allowed = { ARG_KEY, ARG_VALUE, ARG_K_CACHE, ARG_V_CACHE, ARG_SLOT_MAPPING };
    if (p.k_scales_mask >= 0) allowed.add(ARG_K_SCALES);
    if (p.v_scales_mask >= 0) allowed.add(ARG_V_SCALES);
    argument_checker check(primitive_name, args, allowed);

    const tensor &key = check.required(ARG_KEY);
    check.expect_shape(key, ARG_KEY, { pd_.get_desc().key().get_dims()[0], p.kv_heads, p.head_size },
                       "[T, Hkv, D]");
    check.expect_type(key, ARG_KEY, p.key_type);
    const dim num_tokens = key.get_desc().get_dims()[0];
    const tensor &value = check.required(ARG_VALUE);
    check.expect_shape(value, ARG_VALUE, { num_tokens, p.kv_heads, p.head_size }, "[T, Hkv, D] (T of key)");
    check.expect_type(value, ARG_VALUE, p.value_type);
    const tensor &k_cache = check.required(ARG_K_CACHE);
    check.expect_desc(k_cache, ARG_K_CACHE, p.k_cache);
    const tensor &v_cache = check.required(ARG_V_CACHE);
    check.expect_desc(v_cache, ARG_V_CACHE, p.v_cache);

    const tensor &slot_mapping = check.required(ARG_SLOT_MAPPING);
    check.expect_shape(slot_mapping, ARG_SLOT_MAPPING, { num_tokens }, "[T] (T of key)");
    const data_type slot_type = slot_mapping.get_desc().get_data_type();
    PAGEDATTN_EXPECT(check, slot_type == data_type::s64 || slot_type == data_type::s32, ARG_SLOT_MAPPING,
                     "data type ", data_type_name(slot_type), ", expected s64 or s32");

    reshape_and_cache_arguments a {};
    a.num_tokens = num_tokens;
    a.key = key.get_data_handle();
    a.value = value.get_data_handle();
    a.key_token_stride = key.get_desc().get_strides()[0];
    a.key_head_stride = key.get_desc().get_strides()[1];
    a.value_token_stride = value.get_desc().get_strides()[0];
    a.value_head_stride = value.get_desc().get_strides()[1];
    a.k_cache = k_cache.get_data_handle();
    a.v_cache = v_cache.get_data_handle();
    if (slot_type == data_type::s64)
        a.slots64 = static_cast<const int64_t *>(slot_mapping.get_data_handle());
    else
        a.slots32 = static_cast<const int32_t *>(slot_mapping.get_data_handle());
    const dim num_slots = p.num_blocks * p.block_size;
    for (dim t = 0; t < num_tokens; ++t) {
        const dim slot = a.slots64 ? a.slots64[t] : a.slots32[t];
        PAGEDATTN_EXPECT(check, slot < num_slots, ARG_SLOT_MAPPING, "slot ", slot, " of token ", t,
                         " is outside the cache's ", num_slots, " slots (num_blocks * block_size)");
    }
    for (int arg : { ARG_K_SCALES, ARG_V_SCALES }) {
        const int mask = arg == ARG_K_SCALES ? p.k_scales_mask : p.v_scales_mask;
        if (mask < 0) continue;
        const tensor &t = check.required(arg);
        check.expect_scales(t, arg, mask, p.k_cache.get_dims(), mask != scales_per_token);
        (arg == ARG_K_SCALES ? a.k_scales : a.v_scales) = static_cast<float *>(t.get_data_handle());
    }
    const std::vector<uint8_t> superseded = find_superseded(a);
    a.superseded = superseded.empty() ? nullptr : superseded.data();

    const reshape_and_cache_implementation &impl = state.implementation();
    impl.execute(p, a);

    if (get_verbose() >= 1)
        verbose_print(concat("exec,cpu,", primitive_name, ",", impl.name, ",key:", key.get_desc().str(),
                             " value:", value.get_desc().str(), " k_cache:", p.k_cache.str(),
                             " v_cache:", p.v_cache.str(), " slot_mapping:", slot_mapping.get_desc().str(),
                             ",", attr_string(state.attr), ",", problem_string(p), " t", num_tokens, ",",
                             milliseconds_since(start)));
}

void reshape_and_cache::execute(const dnnl::stream &stream,
                                const std::unordered_map<int, dnnl::memory> &args) const {
    execute(stream, detail::tensors_from_memories("reshape_and_cache", args,
                                                  [this](int arg) { return pd_.query_md(arg); }));
}

} // namespace pagedattn
