// Which implementation the primitive_desc chooses (DESIGN §2, §5):
//  - on a host with AVX2 or better, no configuration of the paged_attention test matrix lands on
//    "ref:any", in plain or in packed (layout::any) caches, for either primitive;
//  - an ISA cap (primitive_attr::set_max_cpu_isa) chooses the first implementation of the uncapped
//    walk whose ISA is within the cap, and the capped walk is the uncapped one without the
//    implementations above the cap; walks go best first (non-increasing ISA) and end at "ref:any";
//  - env_cap.*: run by ctest under PAGEDATTN_MAX_CPU_ISA=<value> (tests/CMakeLists.txt), the
//    environment cap chooses the expected implementation.
// Only primitive_descs are built: no data, so this is cheap.
#include <cctype>

#include "matrix_cases.hpp"
#include "test_util.hpp"

namespace {

using namespace test_util;
using oracle::scales;
using pa::cpu_isa;

/// The ISA level an implementation name stands for (the documented names); fails on others.
cpu_isa isa_of(const std::string &name) {
    if (name == "ref:any") return cpu_isa::generic;
    if (name == "x64:avx2") return cpu_isa::avx2;
    if (name == "x64:avx512") return cpu_isa::avx512;
    if (name == "x64:avx512_bf16") return cpu_isa::avx512_bf16;
#if PAGEDATTN_AMX_EMULATOR
    if (name == "x64:amx") return cpu_isa::avx512_bf16; // emulated tiles: AVX512-BF16 suffices
#else
    if (name == "x64:amx") return cpu_isa::amx;
#endif
    ADD_FAILURE() << "unknown implementation name '" << name << "'";
    return cpu_isa::all;
}

/// The process-wide level: min(host, PAGEDATTN_MAX_CPU_ISA).
cpu_isa process_level() {
    return pa::get_max_cpu_isa();
}

// ---------------------------------------------------------------------------------------------
// The configurations: paged_attention_test.cpp's matrix.

std::vector<attn_case> matrix() {
    return matrix_cases();
}

/// How a configuration's caches are described: its plain layout (with the strides of
/// test_util::make_cache), or layout::any (packed where block_size and D are multiples of 16).
enum class cache_kind { plain, any };
const char *kind_name(cache_kind k) {
    return k == cache_kind::plain ? "plain" : "any";
}

struct config {
    attn_case c;
    cache_kind kind;
    std::string name() const { return c.name() + "_" + kind_name(kind); }
};
void PrintTo(const config &x, std::ostream *os) {
    *os << x.name();
}

std::vector<config> configs() {
    std::vector<config> v;
    for (const attn_case &c : matrix())
        for (cache_kind k : { cache_kind::plain, cache_kind::any })
            v.push_back({ c, k });
    return v;
}

/// The cache descriptor of a configuration; the number of blocks as make_batch would give it.
pa::tensor_desc cache_md(const config &x) {
    const attn_case &c = x.c;
    int64_t nb = 3;
    for (const auto &s : c.seqs)
        nb += (s.second + c.bs - 1) / c.bs;
    const pa::dims dims { nb, c.hkv, c.bs, c.d };
    if (x.kind == cache_kind::any) return pa::tensor_desc(dims, dt_of(c.cache_fmt), pa::layout::any);
    switch (c.layout) {
        case cache_layout::hnd:
            return pa::tensor_desc(dims, dt_of(c.cache_fmt), { c.hkv * c.bs * c.d, c.bs * c.d, c.d, 1 });
        case cache_layout::nhd:
            return pa::tensor_desc(dims, dt_of(c.cache_fmt), { c.bs * c.hkv * c.d, c.d, c.hkv * c.d, 1 });
        case cache_layout::kv_shared:
            return pa::tensor_desc(dims, dt_of(c.cache_fmt), { 2 * c.bs * c.hkv * c.d, c.d, c.hkv * c.d, 1 });
    }
    return {};
}

pa::primitive_attr attr_of(const attn_case &c, cpu_isa cap = cpu_isa::all) {
    pa::primitive_attr a;
    if (c.k_scales != scales::none) a.set_scales_mask(pa::ARG_K_CACHE, scales_mask(c.k_scales));
    if (c.v_scales != scales::none) a.set_scales_mask(pa::ARG_V_CACHE, scales_mask(c.v_scales));
    a.set_max_cpu_isa(cap);
    return a;
}

pa::paged_attention::desc attention_desc(const config &x) {
    const attn_case &c = x.c;
    pa::paged_attention::options o;
    o.softmax_scale = c.softmax_scale;
    o.causal = c.causal;
    o.window_left = c.left;
    o.window_right = c.right;
    o.soft_cap = c.soft_cap;
    o.alibi_slopes = c.alibi;
    o.sinks = c.sinks;
    const pa::tensor_desc md = cache_md(x);
    return pa::paged_attention::desc(pa::tensor_desc({ pa::runtime_dim, c.hq, c.d }, dt_of(c.q_fmt)), md, md,
                                     pa::tensor_desc({ pa::runtime_dim, c.hq, c.d }, dt_of(c.dst_fmt)), o);
}

/// reshape_and_cache writing the configuration's caches from key/value in the query's type.
pa::reshape_and_cache::desc reshape_desc(const config &x) {
    const pa::tensor_desc kv({ pa::runtime_dim, x.c.hkv, x.c.d }, dt_of(x.c.q_fmt));
    const pa::tensor_desc md = cache_md(x);
    return pa::reshape_and_cache::desc(kv, kv, md, md);
}

/// Every implementation of the walk, in order.
template <typename PD> std::vector<std::string> walk(PD pd) {
    std::vector<std::string> names;
    do
        names.push_back(pd.impl_info_str());
    while (pd.next_impl());
    return names;
}

std::string join(const std::vector<std::string> &v) {
    std::string s;
    for (const auto &x : v)
        s += (s.empty() ? "" : " ") + x;
    return s;
}

/// A walk goes best first (non-increasing ISA), has no repeats, ends at "ref:any", and uses
/// nothing above `level`.
void expect_well_ordered(const std::vector<std::string> &names, cpu_isa level) {
    ASSERT_FALSE(names.empty());
    EXPECT_EQ(names.back(), "ref:any") << join(names);
    for (size_t i = 0; i < names.size(); ++i) {
        EXPECT_LE(static_cast<int>(isa_of(names[i])), static_cast<int>(level))
                << names[i] << " is above the level " << pa::cpu_isa_name(level);
        if (i > 0) {
            EXPECT_LE(static_cast<int>(isa_of(names[i])), static_cast<int>(isa_of(names[i - 1])))
                    << "not best first: " << join(names);
            EXPECT_NE(names[i], names[i - 1]) << join(names);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Nothing lands on the reference

class selection : public ::testing::TestWithParam<config> {};

TEST_P(selection, nothing_lands_on_the_reference) {
    const config &x = GetParam();
    if (process_level() < cpu_isa::avx2)
        GTEST_SKIP() << "the process level is " << pa::cpu_isa_name(process_level())
                     << ": no x64 kernel may run";
    const pa::paged_attention::primitive_desc apd(engine(), attention_desc(x), attr_of(x.c));
    const pa::tensor_desc resolved = apd.query_md(pa::ARG_K_CACHE);
    const bool packed = resolved.get_layout() == pa::layout::packed;
    EXPECT_EQ(packed, x.kind == cache_kind::any && x.c.bs % 16 == 0 && x.c.d % 16 == 0) << resolved.str();
    RecordProperty("layout", pa::layout_name(resolved.get_layout()));
    RecordProperty("paged_attention", apd.impl_info_str());
    EXPECT_STRNE(apd.impl_info_str(), "ref:any")
            << "paged_attention on " << resolved.str() << " lands on the reference on a "
            << pa::cpu_isa_name(process_level()) << " host";
    const pa::reshape_and_cache::primitive_desc rpd(engine(), reshape_desc(x), attr_of(x.c));
    RecordProperty("reshape_and_cache", rpd.impl_info_str());
    EXPECT_STRNE(rpd.impl_info_str(), "ref:any")
            << "reshape_and_cache to " << resolved.str() << " lands on the reference on a "
            << pa::cpu_isa_name(process_level()) << " host";
}

// ISA caps by attribute choose the first implementation of the uncapped walk within the cap.
TEST_P(selection, attribute_caps_choose_the_expected_implementation) {
    const config &x = GetParam();
    const cpu_isa level = process_level();
    const std::vector<std::string> uncapped_a =
            walk(pa::paged_attention::primitive_desc(engine(), attention_desc(x), attr_of(x.c)));
    const std::vector<std::string> uncapped_r =
            walk(pa::reshape_and_cache::primitive_desc(engine(), reshape_desc(x), attr_of(x.c)));
    {
        SCOPED_TRACE("uncapped walks");
        expect_well_ordered(uncapped_a, level);
        expect_well_ordered(uncapped_r, level);
    }
    for (cpu_isa cap :
         { cpu_isa::generic, cpu_isa::avx2, cpu_isa::avx512, cpu_isa::avx512_bf16, cpu_isa::all }) {
        SCOPED_TRACE(std::string("cap ") + pa::cpu_isa_name(cap));
        const cpu_isa within = std::min(cap, level);
        const auto check = [&](const char *primitive, const std::vector<std::string> &uncapped,
                               const std::vector<std::string> &capped) {
            SCOPED_TRACE(primitive);
            expect_well_ordered(capped, within);
            std::vector<std::string> expected;
            for (const auto &n : uncapped)
                if (isa_of(n) <= within) expected.push_back(n);
            EXPECT_EQ(join(capped), join(expected)) << "the capped walk is the uncapped one within the cap";
            if (cap == cpu_isa::generic) {
                EXPECT_EQ(join(capped), "ref:any");
            }
            if (cap == cpu_isa::avx2 && level >= cpu_isa::avx2) {
                EXPECT_EQ(capped.front(), "x64:avx2");
            }
            if (cap == cpu_isa::avx512 && level >= cpu_isa::avx512) {
                EXPECT_EQ(capped.front(), "x64:avx512");
            }
        };
        check("paged_attention", uncapped_a,
              walk(pa::paged_attention::primitive_desc(engine(), attention_desc(x), attr_of(x.c, cap))));
        check("reshape_and_cache", uncapped_r,
              walk(pa::reshape_and_cache::primitive_desc(engine(), reshape_desc(x), attr_of(x.c, cap))));
    }
}

INSTANTIATE_TEST_SUITE_P(matrix, selection, ::testing::ValuesIn(configs()),
                         [](const ::testing::TestParamInfo<config> &i) { return i.param.name(); });

// ---------------------------------------------------------------------------------------------
// The environment cap (ctest runs env_cap.* under several PAGEDATTN_MAX_CPU_ISA values)

/// Problems every x64 implementation accepts (D and block size multiples of 16), in a plain and a
/// packed cache, FP8 with per-token scales and bf16.
std::vector<config> env_configs() {
    std::vector<config> v;
    v.push_back({ make_case("env_e4m3", 8, 2, 64, 16, { { 1, 100 } }, format::bf16, format::e4m3,
                            cache_layout::hnd)
                          .scales(scales::per_token, scales::per_token),
                  cache_kind::plain });
    v.push_back({ v.back().c, cache_kind::any });
    v.push_back({ make_case("env_bf16", 4, 4, 128, 32, { { 1, 100 } }, format::f32, format::bf16,
                            cache_layout::nhd),
                  cache_kind::plain });
    v.push_back({ v.back().c, cache_kind::any });
    return v;
}

TEST(env_cap, chooses_the_best_implementation_under_the_environment_cap) {
    const cpu_isa host = pa::get_host_cpu_isa(), cap = environment_cap();
    const cpu_isa level = std::min(host, cap);
    const char *env = std::getenv("PAGEDATTN_MAX_CPU_ISA");
    SCOPED_TRACE(std::string("PAGEDATTN_MAX_CPU_ISA=") + (env ? env : "(unset)") + ", host " +
                 pa::cpu_isa_name(host));
    ASSERT_EQ(pa::get_max_cpu_isa(), level);
    for (const config &x : env_configs()) {
        SCOPED_TRACE(x.name());
        const auto check = [&](const char *primitive, const std::vector<std::string> &names) {
            SCOPED_TRACE(std::string(primitive) + ": " + join(names));
            expect_well_ordered(names, level);
            const std::string &chosen = names.front();
            if (level == cpu_isa::generic) {
                EXPECT_EQ(chosen, "ref:any");
            }
            if (level == cpu_isa::avx2) {
                EXPECT_EQ(chosen, "x64:avx2");
            }
            if (level == cpu_isa::avx512) {
                EXPECT_EQ(chosen, "x64:avx512");
            }
            if (level >= cpu_isa::avx2) {
                EXPECT_NE(chosen, "ref:any");
            }
            if (level >= cpu_isa::avx512) {
                EXPECT_GE(isa_of(chosen), cpu_isa::avx512);
            }
        };
        check("paged_attention",
              walk(pa::paged_attention::primitive_desc(engine(), attention_desc(x), attr_of(x.c))));
        check("reshape_and_cache",
              walk(pa::reshape_and_cache::primitive_desc(engine(), reshape_desc(x), attr_of(x.c))));
        // An attribute can only lower the environment's cap: asking for more changes nothing.
        for (cpu_isa ask : { cpu_isa::avx512_bf16, cpu_isa::amx, cpu_isa::all }) {
            SCOPED_TRACE(std::string("attribute ") + pa::cpu_isa_name(ask));
            const std::vector<std::string> a =
                    walk(pa::paged_attention::primitive_desc(engine(), attention_desc(x), attr_of(x.c, ask)));
            expect_well_ordered(a, std::min(level, ask));
            if (ask >= level) {
                EXPECT_EQ(join(a), join(walk(pa::paged_attention::primitive_desc(engine(), attention_desc(x),
                                                                                 attr_of(x.c)))));
            }
        }
        const std::vector<std::string> low = walk(pa::paged_attention::primitive_desc(
                engine(), attention_desc(x), attr_of(x.c, cpu_isa::avx2)));
        EXPECT_EQ(low.front(), level >= cpu_isa::avx2 ? "x64:avx2" : "ref:any");
    }
}

} // namespace
