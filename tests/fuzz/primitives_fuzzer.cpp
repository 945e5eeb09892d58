// libFuzzer target over both primitives' public API: descriptor creation (dims, data types, layouts,
// strides, options, attributes), the walk over implementations, and execute with fuzzed runtime
// dims, argument ids, block tables, seq lens, query start locs, slot mappings, scales and plans.
// Sizes stay small so that one execution takes well under a millisecond.
//
// The contract checked: every input either throws pagedattn::error or computes; nothing crashes or
// trips ASan/UBSan (the build adds -fsanitize=fuzzer,address,undefined); and an execute that throws
// leaves every byte it could write (dst, caches, per-token scales) as it was.
//
//   build:  tests/fuzz/run.sh [seconds]   (a clang build in build-fuzz/, then a run on the corpus)
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pagedattn/pagedattn.hpp"

namespace {

namespace pa = pagedattn;
using pa::dim;

// How the inputs ended (PAGEDATTN_FUZZ_STATS=1 prints them at exit): rejected at creation, thrown
// at execute, computed; per primitive.
struct outcomes {
    long rejected = 0, thrown = 0, computed = 0;
};
outcomes attention_outcomes, reshape_outcomes;
void print_outcomes() {
    std::fprintf(
            stderr,
            "outcomes: paged_attention rejected %ld, thrown %ld, computed %ld; reshape_and_cache rejected "
            "%ld, thrown %ld, computed %ld\n",
            attention_outcomes.rejected, attention_outcomes.thrown, attention_outcomes.computed,
            reshape_outcomes.rejected, reshape_outcomes.thrown, reshape_outcomes.computed);
}

const dnnl::engine &engine() {
    static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    return eng;
}

pa::data_type pick_type(FuzzedDataProvider &in, pa::data_type usual) {
    static const pa::data_type all[] = { pa::data_type::f32,     pa::data_type::bf16,
                                         pa::data_type::f16,     pa::data_type::f8_e4m3,
                                         pa::data_type::f8_e5m2, pa::data_type::s32,
                                         pa::data_type::s64,     pa::data_type::u8,
                                         pa::data_type::s8,      static_cast<pa::data_type>(77) };
    if (in.ConsumeIntegralInRange<int>(0, 3) != 0) return usual;
    return all[in.ConsumeIntegralInRange<size_t>(0, sizeof all / sizeof all[0] - 1)];
}

dim pick_dim(FuzzedDataProvider &in, dim usual) {
    switch (in.ConsumeIntegralInRange<int>(0, 15)) {
        case 0: return 0;
        case 1: return usual + 1;
        case 2: return usual > 0 ? usual - 1 : 1;
        case 3: return pa::runtime_dim;
        case 4: return -in.ConsumeIntegralInRange<dim>(1, 5);
        default: return usual;
    }
}

/// A descriptor near `dims`: usually dense, sometimes with other dims, caller strides or another layout.
pa::tensor_desc pick_desc(FuzzedDataProvider &in, pa::dims dims, pa::data_type dt, pa::layout usual_layout) {
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0)
        for (dim &d : dims)
            d = pick_dim(in, d);
    pa::layout l = usual_layout;
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0)
        l = static_cast<pa::layout>(in.ConsumeIntegralInRange<int>(0, 3)); // 3: not a layout
    if (in.ConsumeIntegralInRange<int>(0, 5) != 0) return pa::tensor_desc(dims, dt, l);
    pa::dims strides(dims.size(), 1);
    dim stride = 1;
    for (size_t i = dims.size(); i-- > 0;) {
        strides[i] = stride;
        if (in.ConsumeBool()) strides[i] += in.ConsumeIntegralInRange<dim>(-2, 64);
        stride = std::max<dim>(strides[i], 1) * std::max<dim>(dims[i] > 0 ? dims[i] : 1, 1);
        if (stride > (dim(1) << 24)) return pa::tensor_desc(dims, dt, l);
    }
    return pa::tensor_desc(dims, dt, strides, l);
}

/// bytes repeats `fill` (or a fixed pattern when it is empty). Not coverage-instrumented: a
/// per-byte loop over caches of up to 4 MiB took a quarter of the fuzzer's time.
__attribute__((no_sanitize("coverage"))) void fill_bytes(std::vector<uint8_t> &bytes,
                                                         const std::vector<uint8_t> &fill) {
    for (size_t i = 0; i < bytes.size(); ++i)
        bytes[i] = fill.empty() ? static_cast<uint8_t>(i * 37) : fill[i % fill.size()];
}

/// Bytes a tensor of `md` may be read or written through: its size, or 0 when it has none (runtime dims).
struct memory {
    std::vector<uint8_t> bytes;
    explicit memory(const pa::tensor_desc &md, FuzzedDataProvider &in, bool random) {
        const size_t n = md.get_size();
        if (n > (size_t(1) << 22)) return; // too large for a fast execution: left empty (null data)
        bytes.resize(n);
        if (random) {
            fill_bytes(bytes, in.ConsumeBytes<uint8_t>(std::min<size_t>(n, 256)));
        }
    }
    void *data() { return bytes.empty() ? nullptr : bytes.data(); }
};

/// Values of an s32 or s64 tensor, mostly plausible, sometimes not.
template <typename T> std::vector<T> plausible(FuzzedDataProvider &in, size_t n, T lo, T hi) {
    std::vector<T> v(n);
    for (auto &x : v)
        x = in.ConsumeIntegralInRange<int>(0, 15) == 0
                    ? static_cast<T>(in.ConsumeIntegralInRange<int>(-3, 100000))
                    : in.ConsumeIntegralInRange<T>(lo, hi);
    return v;
}

pa::primitive_attr pick_attr(FuzzedDataProvider &in, bool fp8_cache) {
    pa::primitive_attr attr;
    static const int masks[] = { pa::scales_per_tensor, pa::scales_per_kv_head, pa::scales_per_token, 5, -1 };
    auto mask = [&] { return masks[in.ConsumeIntegralInRange<size_t>(0, 4)]; };
    try {
        if (in.ConsumeBool() || (fp8_cache && in.ConsumeBool())) {
            const int k = mask(), v = in.ConsumeBool() ? k : mask();
            if (k != -1) attr.set_scales_mask(pa::ARG_K_CACHE, k);
            if (v != -1) attr.set_scales_mask(pa::ARG_V_CACHE, v);
        }
        if (in.ConsumeIntegralInRange<int>(0, 15) == 0) attr.set_scales_mask(pa::ARG_DST, 0);
    } catch (const pa::error &) {
    }
    if (in.ConsumeBool()) attr.set_scratchpad_mode(pa::scratchpad_mode::user);
    if (in.ConsumeBool()) attr.set_fpmath_mode(pa::fpmath_mode::bf16);
    if (in.ConsumeBool())
        attr.set_max_cpu_isa(static_cast<pa::cpu_isa>(in.ConsumeIntegralInRange<int>(0, 5)));
    return attr;
}

size_t scales_count(int mask, dim nb, dim hkv, dim bs) {
    return mask == pa::scales_per_token     ? static_cast<size_t>(nb * hkv * bs)
           : mask == pa::scales_per_kv_head ? static_cast<size_t>(hkv)
                                            : 1;
}

/// The scales tensor a mask asks for.
pa::tensor_desc scales_md(int mask, dim nb, dim hkv, dim bs) {
    const dim n = static_cast<dim>(scales_count(mask, nb, hkv, bs));
    return mask == pa::scales_per_token ? pa::tensor_desc({ nb, hkv, bs }, pa::data_type::f32)
                                        : pa::tensor_desc({ n }, pa::data_type::f32);
}

/// Scales: positive finite values mostly, sometimes 0, negative, inf or NaN.
std::vector<float> pick_scales(FuzzedDataProvider &in, size_t n) {
    static const float odd[] = { 0.f, -1.f, INFINITY, NAN, 1e-40f, 3e38f };
    std::vector<float> v(n);
    for (auto &x : v)
        x = in.ConsumeIntegralInRange<int>(0, 31) == 0 ? odd[in.ConsumeIntegralInRange<size_t>(0, 5)]
                                                       : in.ConsumeFloatingPointInRange<float>(1e-3f, 4.f);
    return v;
}

/// Fails (aborts, so that libFuzzer keeps the input) when bytes changed although execute threw.
void expect_unchanged(const std::vector<uint8_t> &before, const std::vector<uint8_t> &after,
                      const char *what) {
    if (before != after) {
        std::fprintf(stderr, "primitives_fuzzer: execute threw but wrote %s\n", what);
        std::abort();
    }
}

void fuzz_attention(FuzzedDataProvider &in) {
    static const dim head_sizes[] = { 1, 8, 16, 32, 48, 64, 80, 96, 128, 513 };
    const dim hkv = in.ConsumeIntegralInRange<dim>(1, 4);
    const dim hq = hkv * in.ConsumeIntegralInRange<dim>(1, 4) + (in.ConsumeIntegralInRange<int>(0, 15) == 0);
    const dim d = head_sizes[in.ConsumeIntegralInRange<size_t>(0, 9)];
    const dim bs = in.ConsumeBool() ? 16 * in.ConsumeIntegralInRange<dim>(1, 2)
                                    : in.ConsumeIntegralInRange<dim>(1, 9);
    const dim nb = in.ConsumeIntegralInRange<dim>(1, 8);
    const pa::data_type qt = pick_type(in, in.ConsumeBool() ? pa::data_type::bf16 : pa::data_type::f32);
    static const pa::data_type cache_types[] = { pa::data_type::bf16, pa::data_type::f8_e4m3,
                                                 pa::data_type::f8_e5m2, pa::data_type::f16,
                                                 pa::data_type::f32 };
    const pa::data_type ct = pick_type(in, cache_types[in.ConsumeIntegralInRange<size_t>(0, 4)]);
    const pa::data_type dt = pick_type(in, in.ConsumeBool() ? qt : pa::data_type::f32);
    const pa::layout cache_layout = in.ConsumeBool() ? pa::layout::any : pa::layout::plain;

    pa::paged_attention::options o;
    static const float floats[] = { 0.f, 0.125f, 1.f, -1.f, 30.f, NAN, INFINITY, 1e-30f };
    o.softmax_scale = floats[in.ConsumeIntegralInRange<size_t>(0, 7)];
    o.causal = in.ConsumeBool();
    o.window_left = in.ConsumeIntegralInRange<dim>(-3, 40);
    o.window_right = in.ConsumeIntegralInRange<dim>(-3, 40);
    o.soft_cap = in.ConsumeBool() ? 0.f : floats[in.ConsumeIntegralInRange<size_t>(0, 7)];
    o.alibi_slopes = in.ConsumeBool();
    o.sinks = in.ConsumeBool();
    const pa::primitive_attr attr =
            pick_attr(in, ct == pa::data_type::f8_e4m3 || ct == pa::data_type::f8_e5m2);

    pa::paged_attention::primitive_desc pd;
    try {
        const pa::tensor_desc cache = pick_desc(in, { nb, hkv, bs, d }, ct, cache_layout);
        const pa::tensor_desc v_cache = in.ConsumeIntegralInRange<int>(0, 7) == 0
                                                ? pick_desc(in, { nb, hkv, bs, d }, ct, cache_layout)
                                                : cache;
        pd = pa::paged_attention::primitive_desc(
                engine(),
                pa::paged_attention::desc(
                        pick_desc(in, { pa::runtime_dim, hq, d }, qt, pa::layout::plain), cache, v_cache,
                        pick_desc(in, { pa::runtime_dim, hq, d }, dt, pa::layout::plain), o),
                attr, in.ConsumeBool());
        for (int skip = in.ConsumeIntegralInRange<int>(0, 4); skip > 0 && pd.next_impl(); --skip) {
        }
    } catch (const pa::error &) {
        ++attention_outcomes.rejected;
        return;
    }
    pa::paged_attention prim;
    try {
        prim = pa::paged_attention(pd);
    } catch (const pa::error &) {
        ++attention_outcomes.rejected;
        return;
    }
    const pa::paged_attention::desc &desc = pd.get_desc();
    const pa::tensor_desc k_md = pd.query_md(pa::ARG_K_CACHE), v_md = pd.query_md(pa::ARG_V_CACHE);

    // The step: up to 4 sequences of up to 6 new tokens.
    const dim s = in.ConsumeIntegralInRange<dim>(0, 4);
    std::vector<int32_t> starts { 0 }, lens;
    for (dim i = 0; i < s; ++i) {
        const int32_t q_len = in.ConsumeIntegralInRange<int32_t>(0, 6);
        starts.push_back(starts.back() + q_len);
        lens.push_back(in.ConsumeIntegralInRange<int32_t>(
                q_len, std::max(q_len, static_cast<int32_t>(nb * bs + 2))));
    }
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0 && !lens.empty())
        lens[0] = in.ConsumeIntegralInRange<int32_t>(-3, 5);
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0 && starts.size() > 1)
        starts[1] = in.ConsumeIntegralInRange<int32_t>(-3, 20);
    const dim t = starts.back() + (in.ConsumeIntegralInRange<int>(0, 15) == 0);
    const dim width = in.ConsumeIntegralInRange<dim>(1, nb + 1);
    std::vector<int32_t> table = plausible<int32_t>(in, static_cast<size_t>(std::max<dim>(s, 1) * width), 0,
                                                    static_cast<int32_t>(nb - 1));

    const pa::tensor_desc q_md({ t, hq, d }, desc.query().get_data_type()),
            dst_md({ t, hq, d }, desc.dst().get_data_type());
    memory query(q_md, in, true), dst(dst_md, in, false), k(k_md, in, true), v(v_md, in, true);
    const int k_mask = attr.get_scales_mask(pa::ARG_K_CACHE), v_mask = attr.get_scales_mask(pa::ARG_V_CACHE);
    std::vector<float> k_scales = pick_scales(in, scales_count(k_mask, nb, hkv, bs)),
                       v_scales = pick_scales(in, scales_count(v_mask, nb, hkv, bs));
    std::vector<float> slopes = pick_scales(in, static_cast<size_t>(hq)),
                       sinks = pick_scales(in, static_cast<size_t>(hq));

    pa::exec_args args {
        { pa::ARG_QUERY, pa::tensor(q_md, query.data()) },
        { pa::ARG_K_CACHE, pa::tensor(k_md, k.data()) },
        { pa::ARG_V_CACHE, pa::tensor(v_md, v.data()) },
        { pa::ARG_BLOCK_TABLE, pa::tensor(pa::tensor_desc({ s, width }, pa::data_type::s32), table.data()) },
        { pa::ARG_SEQ_LENS, pa::tensor(pa::tensor_desc({ s }, pa::data_type::s32), lens.data()) },
        { pa::ARG_QUERY_START_LOC,
          pa::tensor(pa::tensor_desc({ static_cast<dim>(starts.size()) }, pa::data_type::s32),
                     starts.data()) },
        { pa::ARG_DST, pa::tensor(dst_md, dst.data()) },
    };
    if (k_mask != -1) args[pa::ARG_K_SCALES] = pa::tensor(scales_md(k_mask, nb, hkv, bs), k_scales.data());
    if (v_mask != -1) args[pa::ARG_V_SCALES] = pa::tensor(scales_md(v_mask, nb, hkv, bs), v_scales.data());
    if (o.alibi_slopes)
        args[pa::ARG_ALIBI_SLOPES] = pa::tensor(pa::tensor_desc({ hq }, pa::data_type::f32), slopes.data());
    if (o.sinks) args[pa::ARG_SINKS] = pa::tensor(pa::tensor_desc({ hq }, pa::data_type::f32), sinks.data());
    std::vector<uint8_t> scratch;
    if (attr.get_scratchpad_mode() == pa::scratchpad_mode::user) {
        scratch.resize(pd.scratchpad_desc().get_size() + (in.ConsumeBool() ? 0 : 64));
        if (in.ConsumeIntegralInRange<int>(0, 7) == 0 && !scratch.empty()) scratch.resize(scratch.size() / 2);
        args[pa::ARG_SCRATCHPAD] = pa::tensor(
                pa::tensor_desc({ static_cast<dim>(scratch.size()) }, pa::data_type::u8), scratch.data());
    }
    switch (in.ConsumeIntegralInRange<int>(0, 15)) { // an argument dropped or one that does not belong
        case 0: args.erase(pa::ARG_BLOCK_TABLE); break;
        case 1: args[pa::ARG_SLOT_MAPPING] = args[pa::ARG_SEQ_LENS]; break;
        case 2: args[4096] = args[pa::ARG_SEQ_LENS]; break;
        case 3:
            args[pa::ARG_QUERY] = pa::tensor(pa::tensor_desc({ t, hq, d }, pa::data_type::s32), query.data());
            break;
        default: break;
    }
    pa::paged_attention::plan plan;
    if (in.ConsumeBool()) {
        try {
            plan = pa::paged_attention::plan(pd, args[pa::ARG_SEQ_LENS], args[pa::ARG_QUERY_START_LOC],
                                             in.ConsumeIntegralInRange<int>(0, 3));
            if (in.ConsumeIntegralInRange<int>(0, 7) == 0 && !lens.empty()) ++lens[0]; // a stale plan
            args[pa::ARG_PLAN] = plan.as_tensor();
        } catch (const pa::error &) {
        }
    }

    const std::vector<uint8_t> dst_before = dst.bytes, k_before = k.bytes, v_before = v.bytes;
    dnnl::stream stream(engine());
    try {
        prim.execute(stream, args);
        ++attention_outcomes.computed;
    } catch (const pa::error &) {
        ++attention_outcomes.thrown;
        expect_unchanged(dst_before, dst.bytes, "dst");
        expect_unchanged(k_before, k.bytes, "the k cache");
        expect_unchanged(v_before, v.bytes, "the v cache");
    }
}

void fuzz_reshape(FuzzedDataProvider &in) {
    const dim hkv = in.ConsumeIntegralInRange<dim>(1, 4);
    static const dim head_sizes[] = { 1, 8, 16, 32, 48, 64, 128, 513 };
    const dim d = head_sizes[in.ConsumeIntegralInRange<size_t>(0, 7)];
    const dim bs = in.ConsumeBool() ? 16 : in.ConsumeIntegralInRange<dim>(1, 9);
    const dim nb = in.ConsumeIntegralInRange<dim>(1, 6);
    const pa::data_type in_t = pick_type(in, in.ConsumeBool() ? pa::data_type::bf16 : pa::data_type::f32);
    static const pa::data_type cache_types[] = { pa::data_type::bf16, pa::data_type::f8_e4m3,
                                                 pa::data_type::f8_e5m2, pa::data_type::f16,
                                                 pa::data_type::f32 };
    const pa::data_type ct = pick_type(in, cache_types[in.ConsumeIntegralInRange<size_t>(0, 4)]);
    const pa::primitive_attr attr =
            pick_attr(in, ct == pa::data_type::f8_e4m3 || ct == pa::data_type::f8_e5m2);
    pa::reshape_and_cache::primitive_desc pd;
    pa::reshape_and_cache prim;
    try {
        const pa::tensor_desc kv = pick_desc(in, { pa::runtime_dim, hkv, d }, in_t, pa::layout::plain);
        const pa::tensor_desc cache =
                pick_desc(in, { nb, hkv, bs, d }, ct, in.ConsumeBool() ? pa::layout::any : pa::layout::plain);
        pd = pa::reshape_and_cache::primitive_desc(engine(),
                                                   pa::reshape_and_cache::desc(kv, kv, cache, cache), attr);
        for (int skip = in.ConsumeIntegralInRange<int>(0, 3); skip > 0 && pd.next_impl(); --skip) {
        }
        prim = pa::reshape_and_cache(pd);
    } catch (const pa::error &) {
        ++reshape_outcomes.rejected;
        return;
    }
    const dim t = in.ConsumeIntegralInRange<dim>(0, 40);
    const pa::tensor_desc kv_md({ t, hkv, d }, pd.get_desc().key().get_data_type());
    const pa::tensor_desc k_md = pd.query_md(pa::ARG_K_CACHE), v_md = pd.query_md(pa::ARG_V_CACHE);
    memory key(kv_md, in, true), value(kv_md, in, true), k(k_md, in, true), v(v_md, in, true);
    const bool s64 = in.ConsumeBool();
    std::vector<int64_t> slots64 = plausible<int64_t>(in, static_cast<size_t>(t), -1, nb * bs - 1);
    std::vector<int32_t> slots32(slots64.begin(), slots64.end());
    const int k_mask = attr.get_scales_mask(pa::ARG_K_CACHE), v_mask = attr.get_scales_mask(pa::ARG_V_CACHE);
    std::vector<float> k_scales = pick_scales(in, scales_count(k_mask, nb, hkv, bs)),
                       v_scales = pick_scales(in, scales_count(v_mask, nb, hkv, bs));
    pa::exec_args args {
        { pa::ARG_KEY, pa::tensor(kv_md, key.data()) },
        { pa::ARG_VALUE, pa::tensor(kv_md, value.data()) },
        { pa::ARG_K_CACHE, pa::tensor(k_md, k.data()) },
        { pa::ARG_V_CACHE, pa::tensor(v_md, v.data()) },
        { pa::ARG_SLOT_MAPPING,
          s64 ? pa::tensor(pa::tensor_desc({ t }, pa::data_type::s64), slots64.data())
              : pa::tensor(pa::tensor_desc({ t }, pa::data_type::s32), slots32.data()) },
    };
    if (k_mask != -1) args[pa::ARG_K_SCALES] = pa::tensor(scales_md(k_mask, nb, hkv, bs), k_scales.data());
    if (v_mask != -1) args[pa::ARG_V_SCALES] = pa::tensor(scales_md(v_mask, nb, hkv, bs), v_scales.data());
    std::vector<uint8_t> scratch;
    if (attr.get_scratchpad_mode() == pa::scratchpad_mode::user) {
        scratch.resize(pd.scratchpad_desc().get_size());
        args[pa::ARG_SCRATCHPAD] = pa::tensor(
                pa::tensor_desc({ static_cast<dim>(scratch.size()) }, pa::data_type::u8), scratch.data());
    }
    switch (in.ConsumeIntegralInRange<int>(0, 15)) {
        case 0: args.erase(pa::ARG_SLOT_MAPPING); break;
        case 1: args[pa::ARG_QUERY] = args[pa::ARG_KEY]; break;
        case 2:
            args[pa::ARG_VALUE] =
                    pa::tensor(pa::tensor_desc({ t + 1, hkv, d }, kv_md.get_data_type()), value.data());
            break;
        default: break;
    }
    const std::vector<uint8_t> k_before = k.bytes, v_before = v.bytes;
    const std::vector<float> ks_before = k_scales, vs_before = v_scales;
    dnnl::stream stream(engine());
    try {
        prim.execute(stream, args);
        ++reshape_outcomes.computed;
    } catch (const pa::error &) {
        ++reshape_outcomes.thrown;
        expect_unchanged(k_before, k.bytes, "the k cache");
        expect_unchanged(v_before, v.bytes, "the v cache");
        if (std::memcmp(ks_before.data(), k_scales.data(), k_scales.size() * 4) != 0 ||
            std::memcmp(vs_before.data(), v_scales.data(), v_scales.size() * 4) != 0) {
            std::fprintf(stderr, "primitives_fuzzer: execute threw but wrote scales\n");
            std::abort();
        }
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const bool stats = [] {
        const char *e = std::getenv("PAGEDATTN_FUZZ_STATS");
        if (e && e[0] == '1') std::atexit(print_outcomes);
        return true;
    }();
    (void)stats;
    FuzzedDataProvider in(data, size);
    if (in.ConsumeBool())
        fuzz_attention(in);
    else
        fuzz_reshape(in);
    return 0;
}
