// oneDNN-style interface contracts: the implementation walk, query_md, scratchpad modes, attributes,
// ISA detection, the dnnl::memory interop overloads, error types and version macros.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "pagedattn/pagedattn.hpp"

namespace {

using namespace pagedattn;

constexpr uint8_t sentinel = 0xA5;

uint16_t to_bf16_truncated(float x) { // inputs only: the values are chosen exact in bf16
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return static_cast<uint16_t>(u >> 16);
}

// A small mixed batch (a prefill chunk and a decode token) over an FP8 cache of dims 4x2x16x64.
struct pa_problem {
    static constexpr dim hq = 4, hkv = 2, d = 64, bs = 16, nb = 4, s = 2, t = 4, w = 2, table_stride = 3;

    std::vector<uint16_t> query;
    std::vector<uint8_t> k_cache, v_cache;
    std::vector<int32_t> block_table { 0, 2, -7, 3, 1, -7 };
    std::vector<int32_t> seq_lens { 17, 30 };
    std::vector<int32_t> query_start_loc { 0, 3, 4 };
    std::vector<float> k_scales { 0.05f }, v_scales { 0.02f, 0.03f };

    pa_problem() {
        query.resize(t * hq * d);
        for (size_t i = 0; i < query.size(); ++i)
            query[i] = to_bf16_truncated(0.0625f * static_cast<float>(static_cast<int>((i * 7) % 33) - 16));
        k_cache.resize(nb * hkv * bs * d);
        v_cache.resize(k_cache.size());
        for (size_t i = 0; i < k_cache.size(); ++i) { // e4m3 codes of magnitude < 1, no NaN
            k_cache[i] = static_cast<uint8_t>((i * 101 + 7) & 0xB7);
            v_cache[i] = static_cast<uint8_t>((i * 59 + 3) & 0xB7);
        }
    }

    static tensor_desc cache_md() {
        return tensor_desc({ nb, hkv, bs, d }, data_type::f8_e4m3, layout::plain);
    }

    static paged_attention::desc desc() {
        return paged_attention::desc(tensor_desc({ runtime_dim, hq, d }, data_type::bf16), cache_md(),
                                     cache_md(), tensor_desc({ runtime_dim, hq, d }, data_type::f32));
    }

    static primitive_attr attr() {
        primitive_attr a;
        a.set_scales_mask(ARG_K_CACHE, scales_per_tensor);
        a.set_scales_mask(ARG_V_CACHE, scales_per_kv_head);
        return a;
    }

    exec_args args(std::vector<float> &dst) {
        dst.assign(t * hq * d, 0.f);
        std::memset(dst.data(), sentinel, dst.size() * sizeof(float));
        return { { ARG_QUERY, tensor(tensor_desc({ t, hq, d }, data_type::bf16), query.data()) },
                 { ARG_DST, tensor(tensor_desc({ t, hq, d }, data_type::f32), dst.data()) },
                 { ARG_K_CACHE, tensor(cache_md(), k_cache.data()) },
                 { ARG_V_CACHE, tensor(cache_md(), v_cache.data()) },
                 { ARG_BLOCK_TABLE, tensor(tensor_desc({ s, w }, data_type::s32, dims { table_stride, 1 }),
                                           block_table.data()) },
                 { ARG_SEQ_LENS, tensor(tensor_desc({ s }, data_type::s32), seq_lens.data()) },
                 { ARG_QUERY_START_LOC,
                   tensor(tensor_desc({ s + 1 }, data_type::s32), query_start_loc.data()) },
                 { ARG_K_SCALES, tensor(tensor_desc({ 1 }, data_type::f32), k_scales.data()) },
                 { ARG_V_SCALES, tensor(tensor_desc({ hkv }, data_type::f32), v_scales.data()) } };
    }
};

void expect_all_written_and_finite(const std::vector<float> &dst) {
    for (size_t i = 0; i < dst.size(); ++i) {
        uint32_t u;
        std::memcpy(&u, &dst[i], 4);
        ASSERT_NE(u, 0xA5A5A5A5u) << "dst[" << i << "] not written";
        ASSERT_TRUE(std::isfinite(dst[i])) << "dst[" << i << "]";
    }
}

// A reshape_and_cache step of 5 tokens into a bf16-input, e5m2-cache problem with per-token K scales.
struct rac_problem {
    static constexpr dim h = 2, d = 32, bs = 8, nb = 3, t = 5;

    std::vector<uint16_t> key, value;
    std::vector<int32_t> slots { 4, 17, -1, 0, 23 };
    std::vector<float> v_scale { 0.37f };

    rac_problem() {
        key.resize(t * h * d);
        value.resize(key.size());
        for (size_t i = 0; i < key.size(); ++i) {
            key[i] = to_bf16_truncated(0.125f * static_cast<float>(static_cast<int>((i * 13) % 41) - 20));
            value[i] = to_bf16_truncated(-0.25f * static_cast<float>(static_cast<int>((i * 5) % 17) - 8));
        }
    }

    static tensor_desc cache_md() { return tensor_desc({ nb, h, bs, d }, data_type::f8_e5m2, layout::any); }
    static reshape_and_cache::desc desc() {
        return reshape_and_cache::desc(tensor_desc({ runtime_dim, h, d }, data_type::bf16),
                                       tensor_desc({ runtime_dim, h, d }, data_type::bf16), cache_md(),
                                       cache_md());
    }
    static primitive_attr attr() {
        primitive_attr a;
        a.set_scales_mask(ARG_K_CACHE, scales_per_token);
        a.set_scales_mask(ARG_V_CACHE, scales_per_tensor);
        return a;
    }

    struct outputs {
        std::vector<uint8_t> k_cache, v_cache;
        std::vector<float> k_scales;
    };

    exec_args args(const reshape_and_cache::primitive_desc &pd, outputs &o) {
        const tensor_desc kc = pd.query_md(ARG_K_CACHE), vc = pd.query_md(ARG_V_CACHE);
        o.k_cache.assign(kc.get_size(), sentinel);
        o.v_cache.assign(vc.get_size(), sentinel);
        o.k_scales.assign(nb * h * bs, -1.f);
        return { { ARG_KEY, tensor(tensor_desc({ t, h, d }, data_type::bf16), key.data()) },
                 { ARG_VALUE, tensor(tensor_desc({ t, h, d }, data_type::bf16), value.data()) },
                 { ARG_K_CACHE, tensor(kc, o.k_cache.data()) },
                 { ARG_V_CACHE, tensor(vc, o.v_cache.data()) },
                 { ARG_SLOT_MAPPING, tensor(tensor_desc({ t }, data_type::s32), slots.data()) },
                 { ARG_K_SCALES, tensor(tensor_desc({ nb, h, bs }, data_type::f32), o.k_scales.data()) },
                 { ARG_V_SCALES, tensor(tensor_desc({ 1 }, data_type::f32), v_scale.data()) } };
    }
};

// ---------------------------------------------------------------------------------------------
// Implementation list walk
// ---------------------------------------------------------------------------------------------

TEST(impl_walk, paged_attention_every_implementation_runs) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    pa_problem p;
    paged_attention::primitive_desc pd(eng, pa_problem::desc(), pa_problem::attr());
    std::vector<std::string> names;
    std::vector<std::vector<float>> outputs;
    do {
        const std::string name = pd.impl_info_str();
        SCOPED_TRACE(name);
        EXPECT_FALSE(name.empty());
        if (!names.empty()) {
            EXPECT_NE(name, names.back());
        }
        names.push_back(name);
        paged_attention prim(pd);
        std::vector<float> dst;
        prim.execute(strm, p.args(dst));
        strm.wait();
        expect_all_written_and_finite(dst);
        outputs.push_back(dst);
    } while (pd.next_impl());
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size()) << "an impl came twice";
    EXPECT_EQ(names.back(), "ref:any");
    // Every implementation agrees with the reference (precision differences only).
    for (size_t i = 0; i + 1 < outputs.size(); ++i)
        for (size_t j = 0; j < outputs[i].size(); ++j)
            ASSERT_NEAR(outputs[i][j], outputs.back()[j], 1e-2 + 1e-2 * std::fabs(outputs.back()[j]))
                    << names[i] << " vs ref:any at " << j;
    // The walk's end is sticky and leaves a usable pd.
    EXPECT_FALSE(pd.next_impl());
    EXPECT_FALSE(pd.next_impl());
    EXPECT_STREQ(pd.impl_info_str(), "ref:any");
    paged_attention prim(pd);
    std::vector<float> dst;
    prim.execute(strm, p.args(dst));
    strm.wait();
    EXPECT_EQ(std::memcmp(dst.data(), outputs.back().data(), dst.size() * sizeof(float)), 0);
}

TEST(impl_walk, reshape_and_cache_every_implementation_writes_the_same_bytes) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    rac_problem p;
    reshape_and_cache::primitive_desc pd(eng, rac_problem::desc(), rac_problem::attr());
    std::vector<std::string> names;
    std::vector<rac_problem::outputs> results;
    do {
        const std::string name = pd.impl_info_str();
        SCOPED_TRACE(name);
        EXPECT_FALSE(name.empty());
        if (!names.empty()) {
            EXPECT_NE(name, names.back());
        }
        names.push_back(name);
        reshape_and_cache prim(pd);
        rac_problem::outputs o;
        prim.execute(strm, p.args(pd, o));
        strm.wait();
        results.push_back(o);
    } while (pd.next_impl());
    EXPECT_EQ(names.back(), "ref:any");
    // FP8 quantization is defined bit-exactly, so every implementation stores the same bytes.
    for (size_t i = 0; i + 1 < results.size(); ++i) {
        EXPECT_EQ(results[i].k_cache, results.back().k_cache) << names[i];
        EXPECT_EQ(results[i].v_cache, results.back().v_cache) << names[i];
        EXPECT_EQ(std::memcmp(results[i].k_scales.data(), results.back().k_scales.data(),
                              results[i].k_scales.size() * sizeof(float)),
                  0)
                << names[i];
    }
    EXPECT_NE(results.back().k_cache, std::vector<uint8_t>(results.back().k_cache.size(), sentinel));
    EXPECT_FALSE(pd.next_impl());
    EXPECT_STREQ(pd.impl_info_str(), "ref:any");
}

TEST(impl_walk, isa_cap_generic_picks_the_reference) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    primitive_attr attr = pa_problem::attr();
    attr.set_max_cpu_isa(cpu_isa::generic);
    paged_attention::primitive_desc pd(eng, pa_problem::desc(), attr);
    EXPECT_STREQ(pd.impl_info_str(), "ref:any");
    EXPECT_FALSE(pd.next_impl());

    primitive_attr rattr = rac_problem::attr();
    rattr.set_max_cpu_isa(cpu_isa::generic);
    reshape_and_cache::primitive_desc rpd(eng, rac_problem::desc(), rattr);
    EXPECT_STREQ(rpd.impl_info_str(), "ref:any");
    EXPECT_FALSE(rpd.next_impl());
}

TEST(impl_walk, allow_empty_on_an_accepted_problem_gives_a_pd) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    paged_attention::primitive_desc pd(eng, pa_problem::desc(), pa_problem::attr(), true);
    EXPECT_TRUE(static_cast<bool>(pd));
    EXPECT_STRNE(pd.impl_info_str(), "");
    reshape_and_cache::primitive_desc rpd(eng, rac_problem::desc(), rac_problem::attr(), true);
    EXPECT_TRUE(static_cast<bool>(rpd));
}

TEST(impl_walk, default_constructed_pd_is_empty) {
    paged_attention::primitive_desc pd;
    EXPECT_FALSE(static_cast<bool>(pd));
    EXPECT_THROW(pd.impl_info_str(), pagedattn::error);
    reshape_and_cache::primitive_desc rpd;
    EXPECT_FALSE(static_cast<bool>(rpd));
}

// ---------------------------------------------------------------------------------------------
// query_md
// ---------------------------------------------------------------------------------------------

// D = 40, BS = 12: no blocked layout could apply, so `any` must be dense plain head-major.
TEST(query_md, layout_any_resolves_to_dense_plain_for_both_primitives) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const dim nb = 5, hkv = 3, bs = 12, d = 40;
    for (data_type dt :
         { data_type::f8_e4m3, data_type::f8_e5m2, data_type::bf16, data_type::f16, data_type::f32 }) {
        const tensor_desc any({ nb, hkv, bs, d }, dt, layout::any);
        paged_attention::primitive_desc pd(
                eng, paged_attention::desc(tensor_desc({ runtime_dim, 2 * hkv, d }, data_type::f32), any, any,
                                           tensor_desc({ runtime_dim, 2 * hkv, d }, data_type::f32)));
        reshape_and_cache::primitive_desc rpd(
                eng, reshape_and_cache::desc(tensor_desc({ runtime_dim, hkv, d }, data_type::f32),
                                             tensor_desc({ runtime_dim, hkv, d }, data_type::f32), any, any));
        for (int arg : { ARG_K_CACHE, ARG_V_CACHE }) {
            const tensor_desc md = pd.query_md(arg);
            EXPECT_EQ(md.get_layout(), layout::plain);
            EXPECT_EQ(md.get_dims(), (dims { nb, hkv, bs, d }));
            EXPECT_EQ(md.get_strides(), (dims { hkv * bs * d, bs * d, d, 1 }));
            EXPECT_EQ(md.get_data_type(), dt);
            const size_t es = dt == data_type::f32                              ? 4
                              : (dt == data_type::bf16 || dt == data_type::f16) ? 2
                                                                                : 1;
            EXPECT_EQ(md.get_size(), static_cast<size_t>(nb * hkv * bs * d) * es);
            EXPECT_EQ(rpd.query_md(arg), md) << "the two primitives resolve any differently";
        }
    }
}

TEST(query_md, plain_descs_round_trip_unchanged) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    const dim nb = 4, hkv = 2, bs = 16, d = 64;
    const tensor_desc nhd({ nb, hkv, bs, d }, data_type::f8_e4m3, dims { bs * hkv * d, d, hkv * d, 1 });
    // K/V interleaved in one allocation: the block stride covers both.
    const tensor_desc interleaved({ nb, hkv, bs, d }, data_type::f8_e4m3,
                                  dims { 2 * hkv * bs * d, bs * d, d, 1 });
    const tensor_desc q({ runtime_dim, 4, d }, data_type::bf16), dst({ runtime_dim, 4, d }, data_type::f16);
    paged_attention::primitive_desc pd(eng, paged_attention::desc(q, nhd, interleaved, dst));
    EXPECT_EQ(pd.query_md(ARG_K_CACHE), nhd);
    EXPECT_EQ(pd.query_md(ARG_V_CACHE), interleaved);
    EXPECT_EQ(pd.query_md(ARG_K_CACHE).get_strides(), nhd.get_strides());
    EXPECT_EQ(pd.query_md(ARG_V_CACHE).get_strides(), interleaved.get_strides());
    EXPECT_EQ(pd.query_md(ARG_QUERY), q);
    EXPECT_EQ(pd.query_md(ARG_QUERY).get_dims()[0], runtime_dim);
    EXPECT_EQ(pd.query_md(ARG_DST), dst);
    EXPECT_TRUE(pd.query_md(999).is_zero());
    EXPECT_EQ(pd.get_desc().k_cache(), nhd);
    EXPECT_EQ(pd.get_desc().query(), q);

    reshape_and_cache::primitive_desc rpd(
            eng,
            reshape_and_cache::desc(tensor_desc({ runtime_dim, hkv, d }, data_type::f16),
                                    tensor_desc({ runtime_dim, hkv, d }, data_type::f16), nhd, interleaved));
    EXPECT_EQ(rpd.query_md(ARG_K_CACHE), nhd);
    EXPECT_EQ(rpd.query_md(ARG_V_CACHE), interleaved);
    EXPECT_TRUE(rpd.query_md(ARG_BLOCK_TABLE).is_zero());
}

// ---------------------------------------------------------------------------------------------
// Scratchpad
// ---------------------------------------------------------------------------------------------

TEST(scratchpad, library_mode_has_zero_desc) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    paged_attention::primitive_desc pd(eng, pa_problem::desc(), pa_problem::attr());
    EXPECT_EQ(pd.scratchpad_desc().get_size(), 0u);
    EXPECT_TRUE(pd.scratchpad_desc().is_zero());
    EXPECT_EQ(pd.query_md(ARG_SCRATCHPAD).get_size(), 0u);
}

TEST(scratchpad, user_mode_matches_library_mode_bit_for_bit) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    pa_problem p;
    primitive_attr user_attr = pa_problem::attr();
    user_attr.set_scratchpad_mode(scratchpad_mode::user);
    paged_attention::primitive_desc lib_pd(eng, pa_problem::desc(), pa_problem::attr());
    paged_attention::primitive_desc user_pd(eng, pa_problem::desc(), user_attr);
    ASSERT_STREQ(lib_pd.impl_info_str(), user_pd.impl_info_str());

    const tensor_desc sp = user_pd.scratchpad_desc();
    EXPECT_GT(sp.get_size(), 0u);
    EXPECT_EQ(sp.get_data_type(), data_type::u8);
    EXPECT_EQ(sp.ndims(), 1);
    EXPECT_EQ(user_pd.query_md(ARG_SCRATCHPAD), sp);

    std::vector<float> lib_dst, user_dst;
    paged_attention(lib_pd).execute(strm, p.args(lib_dst));
    strm.wait();

    paged_attention user_prim(user_pd);
    // Without the scratchpad: an error that names it, and dst untouched.
    exec_args a = p.args(user_dst);
    const std::vector<float> untouched = user_dst;
    try {
        user_prim.execute(strm, a);
        ADD_FAILURE() << "no error without ARG_SCRATCHPAD in scratchpad_mode::user";
    } catch (const pagedattn::error &e) {
        EXPECT_EQ(e.get_status(), status::invalid_arguments);
        EXPECT_NE(std::string(e.what()).find("scratchpad"), std::string::npos) << e.what();
    }
    EXPECT_EQ(std::memcmp(user_dst.data(), untouched.data(), untouched.size() * sizeof(float)), 0);

    // A one-byte scratchpad is too small for anything that asks for more than its alignment slack.
    if (sp.get_size() > 128) {
        uint8_t tiny = 0;
        a[ARG_SCRATCHPAD] = tensor(tensor_desc({ 1 }, data_type::u8), &tiny);
        try {
            user_prim.execute(strm, a);
            ADD_FAILURE() << "no error for a 1-byte scratchpad";
        } catch (const pagedattn::error &e) {
            EXPECT_NE(std::string(e.what()).find("scratchpad"), std::string::npos) << e.what();
        }
        EXPECT_EQ(std::memcmp(user_dst.data(), untouched.data(), untouched.size() * sizeof(float)), 0);
    }

    // With the buffer: the same bytes as library mode, twice (scratch contents do not leak across calls).
    std::vector<uint8_t> scratch(sp.get_size(), 0xEE);
    a[ARG_SCRATCHPAD] = tensor(sp, scratch.data());
    for (int run = 0; run < 2; ++run) {
        user_prim.execute(strm, a);
        strm.wait();
        EXPECT_EQ(std::memcmp(user_dst.data(), lib_dst.data(), lib_dst.size() * sizeof(float)), 0)
                << "run " << run;
    }
}

// ---------------------------------------------------------------------------------------------
// Attributes
// ---------------------------------------------------------------------------------------------

TEST(attributes, defaults_setters_and_getters_round_trip) {
    EXPECT_EQ(scales_per_tensor, 0);
    EXPECT_EQ(scales_per_kv_head, 2);
    EXPECT_EQ(scales_per_token, 7);

    primitive_attr attr;
    EXPECT_EQ(attr.get_scales_mask(ARG_K_CACHE), -1);
    EXPECT_EQ(attr.get_scales_mask(ARG_V_CACHE), -1);
    EXPECT_EQ(attr.get_scratchpad_mode(), scratchpad_mode::library);
    EXPECT_EQ(attr.get_fpmath_mode(), fpmath_mode::strict);
    EXPECT_EQ(attr.get_max_cpu_isa(), cpu_isa::all);
    EXPECT_TRUE(attr == primitive_attr());

    attr.set_scales_mask(ARG_K_CACHE, scales_per_token);
    EXPECT_EQ(attr.get_scales_mask(ARG_K_CACHE), scales_per_token);
    EXPECT_EQ(attr.get_scales_mask(ARG_V_CACHE), -1);
    EXPECT_FALSE(attr == primitive_attr());
    attr.set_scales_mask(ARG_V_CACHE, scales_per_kv_head);
    EXPECT_EQ(attr.get_scales_mask(ARG_V_CACHE), scales_per_kv_head);
    attr.set_scales_mask(ARG_K_CACHE, scales_per_tensor);
    EXPECT_EQ(attr.get_scales_mask(ARG_K_CACHE), scales_per_tensor);
    attr.set_scratchpad_mode(scratchpad_mode::user);
    EXPECT_EQ(attr.get_scratchpad_mode(), scratchpad_mode::user);
    attr.set_fpmath_mode(fpmath_mode::bf16);
    EXPECT_EQ(attr.get_fpmath_mode(), fpmath_mode::bf16);
    attr.set_max_cpu_isa(cpu_isa::avx2);
    EXPECT_EQ(attr.get_max_cpu_isa(), cpu_isa::avx2);

    primitive_attr copy = attr;
    EXPECT_TRUE(copy == attr);
    copy.set_max_cpu_isa(cpu_isa::avx512);
    EXPECT_FALSE(copy == attr);
}

TEST(attributes, pd_keeps_attr_engine_and_desc) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    primitive_attr attr = pa_problem::attr();
    attr.set_fpmath_mode(fpmath_mode::bf16);
    paged_attention::options o;
    o.softmax_scale = 0.125f;
    o.causal = false;
    o.window_left = 5;
    o.window_right = 0;
    o.soft_cap = 30.f;
    o.alibi_slopes = true;
    o.sinks = true;
    const paged_attention::desc d(
            tensor_desc({ runtime_dim, pa_problem::hq, pa_problem::d }, data_type::bf16),
            pa_problem::cache_md(), pa_problem::cache_md(),
            tensor_desc({ runtime_dim, pa_problem::hq, pa_problem::d }, data_type::bf16), o);
    paged_attention::primitive_desc pd(eng, d, attr);
    EXPECT_TRUE(pd.get_primitive_attr() == attr);
    EXPECT_EQ(pd.get_engine().get(), eng.get());
    const paged_attention::options &g = pd.get_desc().get_options();
    EXPECT_EQ(g.softmax_scale, 0.125f);
    EXPECT_FALSE(g.causal);
    EXPECT_EQ(g.window_left, 5);
    EXPECT_EQ(g.window_right, 0);
    EXPECT_EQ(g.soft_cap, 30.f);
    EXPECT_TRUE(g.alibi_slopes);
    EXPECT_TRUE(g.sinks);
    EXPECT_EQ(pd.query_md(ARG_ALIBI_SLOPES), tensor_desc({ pa_problem::hq }, data_type::f32));
    // The attribute is copied: changing the original later does not change the pd.
    attr.set_scales_mask(ARG_K_CACHE, scales_per_token);
    EXPECT_EQ(pd.get_primitive_attr().get_scales_mask(ARG_K_CACHE), scales_per_tensor);
}

// ---------------------------------------------------------------------------------------------
// ISA
// ---------------------------------------------------------------------------------------------

TEST(cpu_isa, names_and_order) {
    EXPECT_STREQ(cpu_isa_name(cpu_isa::generic), "generic");
    EXPECT_STREQ(cpu_isa_name(cpu_isa::avx2), "avx2");
    EXPECT_STREQ(cpu_isa_name(cpu_isa::avx512), "avx512");
    EXPECT_STREQ(cpu_isa_name(cpu_isa::avx512_bf16), "avx512_bf16");
    EXPECT_STREQ(cpu_isa_name(cpu_isa::amx), "amx");
    EXPECT_STREQ(cpu_isa_name(cpu_isa::all), "all");
    EXPECT_LT(cpu_isa::generic, cpu_isa::avx2);
    EXPECT_LT(cpu_isa::avx2, cpu_isa::avx512);
    EXPECT_LT(cpu_isa::avx512, cpu_isa::avx512_bf16);
    EXPECT_LT(cpu_isa::avx512_bf16, cpu_isa::amx);
    EXPECT_LT(cpu_isa::amx, cpu_isa::all);
}

TEST(cpu_isa, max_isa_never_exceeds_host) {
    EXPECT_LE(get_max_cpu_isa(), get_host_cpu_isa());
    EXPECT_NE(get_host_cpu_isa(), cpu_isa::all); // "all" is a cap, never a detected level
    if (std::getenv("PAGEDATTN_MAX_CPU_ISA") == nullptr) {
        EXPECT_EQ(get_max_cpu_isa(), get_host_cpu_isa());
    }
}

TEST(cpu_isa, host_isa_agrees_with_proc_cpuinfo) {
#if !defined(__x86_64__)
    EXPECT_EQ(get_host_cpu_isa(), cpu_isa::generic);
#else
    std::ifstream in("/proc/cpuinfo");
    if (!in) GTEST_SKIP() << "/proc/cpuinfo is not readable";
    std::set<std::string> flags;
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("flags", 0) != 0) continue;
        std::istringstream words(line.substr(line.find(':') + 1));
        for (std::string f; words >> f;)
            flags.insert(f);
        break; // the first processor is enough
    }
    if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
    auto has = [&](std::initializer_list<const char *> names) {
        return std::all_of(names.begin(), names.end(), [&](const char *n) { return flags.count(n) != 0; });
    };
    // The kernel lists a feature only when it also enabled its register state (XCR0).
    cpu_isa expected = cpu_isa::generic;
    if (has({ "avx2", "fma", "f16c" })) {
        expected = cpu_isa::avx2;
        if (has({ "avx512f", "avx512bw", "avx512vl" })) {
            expected = cpu_isa::avx512;
            if (has({ "avx512_bf16" })) {
                expected = cpu_isa::avx512_bf16;
                bool permitted = false;
#if defined(__linux__)
                // AMX also needs the process permission for tile data (ARCH_REQ_XCOMP_PERM, XTILEDATA).
                permitted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#endif
                if (has({ "amx_tile", "amx_bf16" }) && permitted) expected = cpu_isa::amx;
            }
        }
    }
    EXPECT_EQ(cpu_isa_name(get_host_cpu_isa()), std::string(cpu_isa_name(expected)));
#endif
}

// ---------------------------------------------------------------------------------------------
// oneDNN interop
// ---------------------------------------------------------------------------------------------

dnnl::memory wrap(const dnnl::engine &eng, const dnnl::memory::dims &d, dnnl::memory::data_type dt,
                  const dnnl::memory::dims &strides, const void *p) {
    return dnnl::memory(dnnl::memory::desc(d, dt, strides), eng, const_cast<void *>(p));
}

TEST(interop, paged_attention_memory_overload_matches_tensor_overload) {
    using dt = dnnl::memory::data_type;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    pa_problem p;
    paged_attention::primitive_desc pd(eng, pa_problem::desc(), pa_problem::attr());
    paged_attention prim(pd);
    std::vector<float> expected;
    prim.execute(strm, p.args(expected));
    strm.wait();

    const dim t = pa_problem::t, hq = pa_problem::hq, d = pa_problem::d, s = pa_problem::s;
    std::vector<float> dst(expected.size());
    std::memset(dst.data(), sentinel, dst.size() * sizeof(float));
    const size_t cache_bytes = pd.query_md(ARG_K_CACHE).get_size();
    std::unordered_map<int, dnnl::memory> args {
        { ARG_QUERY, wrap(eng, { t, hq, d }, dt::bf16, { hq * d, d, 1 }, p.query.data()) },
        { ARG_DST, wrap(eng, { t, hq, d }, dt::f32, { hq * d, d, 1 }, dst.data()) },
        // Caches as untyped bytes: their type and layout come from the pd.
        { ARG_K_CACHE, wrap(eng, { static_cast<dim>(cache_bytes) }, dt::u8, { 1 }, p.k_cache.data()) },
        { ARG_V_CACHE, wrap(eng, { static_cast<dim>(cache_bytes) }, dt::u8, { 1 }, p.v_cache.data()) },
        { ARG_BLOCK_TABLE,
          wrap(eng, { s, pa_problem::w }, dt::s32, { pa_problem::table_stride, 1 }, p.block_table.data()) },
        { ARG_SEQ_LENS, wrap(eng, { s }, dt::s32, { 1 }, p.seq_lens.data()) },
        { ARG_QUERY_START_LOC, wrap(eng, { s + 1 }, dt::s32, { 1 }, p.query_start_loc.data()) },
        { ARG_K_SCALES, wrap(eng, { 1 }, dt::f32, { 1 }, p.k_scales.data()) },
        { ARG_V_SCALES, wrap(eng, { pa_problem::hkv }, dt::f32, { 1 }, p.v_scales.data()) },
    };
    prim.execute(strm, args);
    strm.wait();
    EXPECT_EQ(std::memcmp(dst.data(), expected.data(), dst.size() * sizeof(float)), 0);

    // A cache memory smaller than query_md's size is an error that names the cache.
    std::vector<uint8_t> small(cache_bytes - 1);
    args[ARG_V_CACHE] = wrap(eng, { static_cast<dim>(small.size()) }, dt::u8, { 1 }, small.data());
    try {
        prim.execute(strm, args);
        ADD_FAILURE() << "no error for an undersized v_cache memory";
    } catch (const pagedattn::error &e) {
        EXPECT_EQ(e.get_status(), status::invalid_arguments);
        EXPECT_NE(std::string(e.what()).find("v_cache"), std::string::npos) << e.what();
    }
}

TEST(interop, reshape_and_cache_memory_overload_matches_tensor_overload) {
    using dt = dnnl::memory::data_type;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    rac_problem p;
    reshape_and_cache::primitive_desc pd(eng, rac_problem::desc(), rac_problem::attr());
    reshape_and_cache prim(pd);
    rac_problem::outputs expected, got;
    prim.execute(strm, p.args(pd, expected));
    strm.wait();

    p.args(pd, got); // sentinel-filled outputs
    const dim t = rac_problem::t, h = rac_problem::h, d = rac_problem::d;
    std::unordered_map<int, dnnl::memory> args {
        { ARG_KEY, wrap(eng, { t, h, d }, dt::bf16, { h * d, d, 1 }, p.key.data()) },
        { ARG_VALUE, wrap(eng, { t, h, d }, dt::bf16, { h * d, d, 1 }, p.value.data()) },
        { ARG_K_CACHE,
          wrap(eng, { static_cast<dim>(got.k_cache.size()) }, dt::u8, { 1 }, got.k_cache.data()) },
        { ARG_V_CACHE,
          wrap(eng, { static_cast<dim>(got.v_cache.size()) }, dt::u8, { 1 }, got.v_cache.data()) },
        { ARG_SLOT_MAPPING, wrap(eng, { t }, dt::s32, { 1 }, p.slots.data()) },
        { ARG_K_SCALES, wrap(eng, { rac_problem::nb, h, rac_problem::bs }, dt::f32,
                             { h * rac_problem::bs, rac_problem::bs, 1 }, got.k_scales.data()) },
        { ARG_V_SCALES, wrap(eng, { 1 }, dt::f32, { 1 }, p.v_scale.data()) },
    };
    prim.execute(strm, args);
    strm.wait();
    EXPECT_EQ(got.k_cache, expected.k_cache);
    EXPECT_EQ(got.v_cache, expected.v_cache);
    EXPECT_EQ(std::memcmp(got.k_scales.data(), expected.k_scales.data(), got.k_scales.size() * sizeof(float)),
              0);
    EXPECT_NE(expected.v_cache, std::vector<uint8_t>(expected.v_cache.size(), sentinel));
}

// ---------------------------------------------------------------------------------------------
// Thread safety: one primitive, executes from several threads on different data.
// ---------------------------------------------------------------------------------------------

TEST(thread_safety, concurrent_executes_of_one_primitive) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    pa_problem p;
    paged_attention::primitive_desc pd(eng, pa_problem::desc(), pa_problem::attr());
    paged_attention prim(pd);
    std::vector<float> expected;
    {
        dnnl::stream strm(eng);
        prim.execute(strm, p.args(expected));
        strm.wait();
    }
    constexpr int threads = 4;
    std::vector<std::vector<float>> dst(threads);
    std::vector<exec_args> args;
    for (int i = 0; i < threads; ++i)
        args.push_back(p.args(dst[i]));
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i)
        pool.emplace_back([&, i] {
            dnnl::stream strm(eng);
            for (int rep = 0; rep < 5; ++rep)
                prim.execute(strm, args[i]);
            strm.wait();
        });
    for (auto &th : pool)
        th.join();
    for (int i = 0; i < threads; ++i)
        EXPECT_EQ(std::memcmp(dst[i].data(), expected.data(), expected.size() * sizeof(float)), 0)
                << "thread " << i;
}

// ---------------------------------------------------------------------------------------------
// Errors, enums, version
// ---------------------------------------------------------------------------------------------

TEST(errors, catchable_as_dnnl_error_with_onednn_status) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    pa_problem p;
    paged_attention prim(paged_attention::primitive_desc(eng, pa_problem::desc(), pa_problem::attr()));
    std::vector<float> dst;
    exec_args a = p.args(dst);
    a.erase(ARG_SEQ_LENS);
    bool caught = false;
    try {
        prim.execute(strm, a);
    } catch (const dnnl::error &e) {
        caught = true;
        EXPECT_EQ(static_cast<int>(e.status), 2);
        EXPECT_EQ(e.status, dnnl_invalid_arguments);
        EXPECT_NE(std::string(e.what()).find("seq_lens"), std::string::npos) << e.what();
        // The message survives a copy of the exception object.
        const pagedattn::error *pe = dynamic_cast<const pagedattn::error *>(&e);
        ASSERT_NE(pe, nullptr);
        const pagedattn::error copy = *pe;
        EXPECT_STREQ(copy.what(), e.what());
        EXPECT_EQ(copy.get_status(), status::invalid_arguments);
    }
    EXPECT_TRUE(caught);
    // Also a std::exception.
    EXPECT_THROW(prim.execute(strm, a), std::exception);
}

TEST(errors, status_values_match_onednn) {
    EXPECT_EQ(static_cast<int>(status::success), dnnl_success);
    EXPECT_EQ(static_cast<int>(status::out_of_memory), dnnl_out_of_memory);
    EXPECT_EQ(static_cast<int>(status::invalid_arguments), dnnl_invalid_arguments);
    EXPECT_EQ(static_cast<int>(status::unimplemented), dnnl_unimplemented);
    EXPECT_EQ(static_cast<int>(status::runtime_error), dnnl_runtime_error);
    EXPECT_EQ(static_cast<int>(status::invalid_arguments), 2);
}

TEST(enums, data_type_values_and_sizes) {
    // oneDNN 3.x values (2.6 has the same ones up to u8).
    EXPECT_EQ(static_cast<int>(data_type::f16), 1);
    EXPECT_EQ(static_cast<int>(data_type::bf16), 2);
    EXPECT_EQ(static_cast<int>(data_type::f32), 3);
    EXPECT_EQ(static_cast<int>(data_type::s32), 4);
    EXPECT_EQ(static_cast<int>(data_type::s8), 5);
    EXPECT_EQ(static_cast<int>(data_type::u8), 6);
    EXPECT_EQ(static_cast<int>(data_type::f8_e5m2), 9);
    EXPECT_EQ(static_cast<int>(data_type::f8_e4m3), 10);
    EXPECT_EQ(static_cast<int>(data_type::f32), static_cast<int>(dnnl::memory::data_type::f32));
    EXPECT_EQ(static_cast<int>(data_type::bf16), static_cast<int>(dnnl::memory::data_type::bf16));
    EXPECT_EQ(data_type_size(data_type::f32), 4u);
    EXPECT_EQ(data_type_size(data_type::bf16), 2u);
    EXPECT_EQ(data_type_size(data_type::f16), 2u);
    EXPECT_EQ(data_type_size(data_type::f8_e4m3), 1u);
    EXPECT_EQ(data_type_size(data_type::f8_e5m2), 1u);
    EXPECT_EQ(data_type_size(data_type::s64), 8u);
    EXPECT_EQ(data_type_size(data_type::undef), 0u);
    EXPECT_STREQ(data_type_name(data_type::f8_e4m3), "f8_e4m3");
    EXPECT_STREQ(data_type_name(data_type::f8_e5m2), "f8_e5m2");
    EXPECT_STREQ(data_type_name(data_type::bf16), "bf16");
}

TEST(enums, argument_ids) {
    EXPECT_EQ(ARG_QUERY, DNNL_ARG_SRC_0);
    EXPECT_EQ(ARG_KEY, DNNL_ARG_SRC_1);
    EXPECT_EQ(ARG_VALUE, DNNL_ARG_SRC_2);
    EXPECT_EQ(ARG_DST, DNNL_ARG_DST);
    EXPECT_EQ(ARG_SCRATCHPAD, DNNL_ARG_SCRATCHPAD);
    const std::vector<int> paged { ARG_K_CACHE,         ARG_V_CACHE,      ARG_BLOCK_TABLE,  ARG_SEQ_LENS,
                                   ARG_QUERY_START_LOC, ARG_SLOT_MAPPING, ARG_ALIBI_SLOPES, ARG_SINKS,
                                   ARG_K_SCALES,        ARG_V_SCALES };
    EXPECT_EQ(std::set<int>(paged.begin(), paged.end()).size(), paged.size());
    for (int id : paged) {
        EXPECT_NE(id, 4096) << "oneDNN 2.6's zero-points id";
        EXPECT_NE(id, DNNL_ARG_SRC_0);
        EXPECT_NE(id, DNNL_ARG_DST);
        EXPECT_NE(id, DNNL_ARG_SCRATCHPAD);
        EXPECT_STRNE(arg_name(id), "unknown");
    }
}

TEST(tensor_desc, dense_strides_size_and_zero_desc) {
    const tensor_desc t({ 3, 4, 5 }, data_type::bf16);
    EXPECT_EQ(t.get_strides(), (dims { 20, 5, 1 }));
    EXPECT_EQ(t.get_size(), 3u * 4u * 5u * 2u);
    EXPECT_EQ(t.nelems(), 60);
    const tensor_desc strided({ 3, 4, 5 }, data_type::f32, dims { 40, 8, 1 });
    EXPECT_EQ(strided.get_size(), (2u * 40u + 3u * 8u + 4u + 1u) * 4u); // first to one past the last element
    EXPECT_NE(t, tensor_desc({ 3, 4, 5 }, data_type::f16));
    const tensor_desc rt({ runtime_dim, 4, 5 }, data_type::f32);
    EXPECT_TRUE(rt.has_runtime_dims());
    EXPECT_EQ(rt.get_size(), 0u);
    EXPECT_TRUE(tensor_desc().is_zero());
    EXPECT_FALSE(t.is_zero());
    EXPECT_EQ(tensor_desc({ 64, 8, 16, 128 }, data_type::f8_e4m3, layout::plain).str(),
              "f8_e4m3:plain:64x8x16x128");
}

TEST(version, macros_exist_and_agree) {
    static_assert(PAGEDATTN_VERSION_MAJOR >= 0 && PAGEDATTN_VERSION_MINOR >= 0 &&
                          PAGEDATTN_VERSION_PATCH >= 0,
                  "version macros are integers");
    const std::string expected = std::to_string(PAGEDATTN_VERSION_MAJOR) + "." +
                                 std::to_string(PAGEDATTN_VERSION_MINOR) + "." +
                                 std::to_string(PAGEDATTN_VERSION_PATCH);
    EXPECT_EQ(std::string(PAGEDATTN_VERSION_STRING), expected);
}

} // namespace
