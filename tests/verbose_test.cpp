// Verbose lines, in the documented shape
//   pagedattn_verbose,<create|exec>,cpu,<primitive>,<impl>,<descs>,<attrs>,<problem>,<ms>
//   pagedattn_verbose,create:dispatch,<primitive>,<impl>,<why it declined>      (level 3)
// captured from stderr around primitive_desc creation and execute at each level.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "pagedattn/pagedattn.hpp"

namespace {

using namespace pagedattn;

// The verbose lines that `f` writes to stderr.
std::vector<std::string> verbose_lines(const std::function<void()> &f) {
    testing::internal::CaptureStderr();
    try {
        f();
    } catch (...) {
        testing::internal::GetCapturedStderr();
        throw;
    }
    std::istringstream in(testing::internal::GetCapturedStderr());
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);)
        if (line.rfind("pagedattn_verbose", 0) == 0) lines.push_back(line);
    return lines;
}

std::string joined(const std::vector<std::string> &lines) {
    std::string out;
    for (const auto &l : lines)
        out += l + "\n";
    return out;
}

// kind, primitive, impl, descs, attrs, problem, milliseconds.
const std::regex line_shape(R"(^pagedattn_verbose,(create|exec),cpu,(paged_attention|reshape_and_cache),)"
                            R"(([^,]+),([^,]*),([^,]*),([^,]*),([0-9.]+)$)");

struct parsed_line {
    std::string kind, primitive, impl, descs, attrs, problem;
    double ms;
};

// Every create/exec line has exactly the documented nine fields; returns those of `kind`.
std::vector<parsed_line> parse(const std::vector<std::string> &lines, const std::string &kind) {
    std::vector<parsed_line> out;
    for (const auto &l : lines) {
        if (l.rfind("pagedattn_verbose,create:dispatch,", 0) == 0) continue;
        std::smatch m;
        if (!std::regex_match(l, m, line_shape)) {
            ADD_FAILURE() << "verbose line not in the documented shape: " << l;
            continue;
        }
        if (m[1] == kind) out.push_back({ m[1], m[2], m[3], m[4], m[5], m[6], std::stod(m[7]) });
    }
    return out;
}

size_t count_dispatch(const std::vector<std::string> &lines) {
    const std::regex dispatch(
            R"(^pagedattn_verbose,create:dispatch,(paged_attention|reshape_and_cache),[^,]+,.+$)");
    size_t n = 0;
    for (const auto &l : lines)
        n += std::regex_match(l, dispatch);
    return n;
}

// A decode step of two sequences over a 4x2x16x64 f8_e4m3 cache.
struct pa_setup {
    static constexpr dim hq = 4, hkv = 2, d = 64, bs = 16, nb = 4, s = 2, t = 2;
    dnnl::engine eng { dnnl::engine::kind::cpu, 0 };
    dnnl::stream strm { eng };
    std::vector<float> query = std::vector<float>(t * hq * d, 0.25f), dst = std::vector<float>(t * hq * d);
    std::vector<uint8_t> k_cache = std::vector<uint8_t>(nb * hkv * bs * d, 0x30),
                         v_cache = std::vector<uint8_t>(nb * hkv * bs * d, 0x28);
    std::vector<int32_t> block_table { 0, 1, 2, 3 }, seq_lens { 20, 31 }, query_start_loc { 0, 1, 2 };
    std::vector<float> k_scales { 0.5f };

    static tensor_desc cache_md() {
        return tensor_desc({ nb, hkv, bs, d }, data_type::f8_e4m3, layout::plain);
    }

    paged_attention::primitive_desc make_pd(cpu_isa cap = cpu_isa::all) const {
        primitive_attr attr;
        attr.set_scales_mask(ARG_K_CACHE, scales_per_tensor);
        attr.set_max_cpu_isa(cap);
        return paged_attention::primitive_desc(
                eng,
                paged_attention::desc(tensor_desc({ runtime_dim, hq, d }, data_type::f32), cache_md(),
                                      cache_md(), tensor_desc({ runtime_dim, hq, d }, data_type::f32)),
                attr);
    }

    void run(const paged_attention &prim) {
        prim.execute(strm,
                     { { ARG_QUERY, tensor(tensor_desc({ t, hq, d }, data_type::f32), query.data()) },
                       { ARG_DST, tensor(tensor_desc({ t, hq, d }, data_type::f32), dst.data()) },
                       { ARG_K_CACHE, tensor(cache_md(), k_cache.data()) },
                       { ARG_V_CACHE, tensor(cache_md(), v_cache.data()) },
                       { ARG_BLOCK_TABLE, tensor(tensor_desc({ s, 2 }, data_type::s32), block_table.data()) },
                       { ARG_SEQ_LENS, tensor(tensor_desc({ s }, data_type::s32), seq_lens.data()) },
                       { ARG_QUERY_START_LOC,
                         tensor(tensor_desc({ s + 1 }, data_type::s32), query_start_loc.data()) },
                       { ARG_K_SCALES, tensor(tensor_desc({ 1 }, data_type::f32), k_scales.data()) } });
        strm.wait();
    }
};

class verbose : public testing::Test {
protected:
    void TearDown() override { set_verbose(0); } // leave the process quiet, even after a failure
};

TEST_F(verbose, set_and_get_level) {
    set_verbose(3);
    EXPECT_EQ(get_verbose(), 3);
    set_verbose(0);
    EXPECT_EQ(get_verbose(), 0);
}

TEST_F(verbose, level_2_prints_create_and_exec_lines) {
    pa_setup p;
    set_verbose(2);
    paged_attention::primitive_desc pd;
    const auto create_lines = verbose_lines([&] { pd = p.make_pd(); });
    const auto creates = parse(create_lines, "create");
    ASSERT_EQ(creates.size(), 1u) << joined(create_lines);
    EXPECT_EQ(parse(create_lines, "exec").size(), 0u);
    EXPECT_EQ(count_dispatch(create_lines), 0u) << "dispatch lines are level 3";
    EXPECT_EQ(creates[0].primitive, "paged_attention");
    EXPECT_EQ(creates[0].impl, pd.impl_info_str());
    EXPECT_NE(creates[0].descs.find("f8_e4m3"), std::string::npos) << creates[0].descs;
    EXPECT_NE(creates[0].descs.find("4x2x16x64"), std::string::npos) << creates[0].descs;
    EXPECT_GE(creates[0].ms, 0.0);

    paged_attention prim(pd);
    const auto exec_lines = verbose_lines([&] { p.run(prim); });
    const auto execs = parse(exec_lines, "exec");
    ASSERT_EQ(execs.size(), 1u) << joined(exec_lines);
    EXPECT_EQ(parse(exec_lines, "create").size(), 0u);
    EXPECT_EQ(execs[0].primitive, "paged_attention");
    EXPECT_EQ(execs[0].impl, pd.impl_info_str());
    EXPECT_NE(execs[0].descs.find("f8_e4m3"), std::string::npos) << execs[0].descs;
    EXPECT_NE(execs[0].descs.find("4x2x16x64"), std::string::npos) << execs[0].descs;
    EXPECT_NE(execs[0].descs.find("f32"), std::string::npos) << execs[0].descs;
    EXPECT_GE(execs[0].ms, 0.0);
    set_verbose(0);
}

TEST_F(verbose, reference_lines_match_the_documented_pattern) {
    pa_setup p;
    set_verbose(2);
    paged_attention::primitive_desc pd;
    const auto create_lines = verbose_lines([&] { pd = p.make_pd(cpu_isa::generic); });
    paged_attention prim(pd);
    const auto exec_lines = verbose_lines([&] { p.run(prim); });
    set_verbose(0);
    ASSERT_EQ(create_lines.size(), 1u) << joined(create_lines);
    ASSERT_EQ(exec_lines.size(), 1u) << joined(exec_lines);
    EXPECT_TRUE(std::regex_match(create_lines[0],
                                 std::regex("^pagedattn_verbose,create,cpu,paged_attention,ref:any,.*")))
            << create_lines[0];
    EXPECT_TRUE(std::regex_match(
            exec_lines[0], std::regex("^pagedattn_verbose,exec,cpu,paged_attention,ref:any,.*,[0-9.]+$")))
            << exec_lines[0];
    EXPECT_NE(exec_lines[0].find("f8_e4m3"), std::string::npos);
    EXPECT_NE(exec_lines[0].find("4x2x16x64"), std::string::npos);
    // The attribute fields show the scales mask and the ISA cap.
    EXPECT_NE(exec_lines[0].find("k_cache:0"), std::string::npos) << exec_lines[0];
    EXPECT_NE(exec_lines[0].find("generic"), std::string::npos) << exec_lines[0];
}

TEST_F(verbose, level_3_adds_why_implementations_declined) {
    pa_setup p;
    // How many implementations accept without a cap: all but the reference must decline under the
    // generic cap, each with a dispatch line.
    size_t accepting = 0;
    {
        paged_attention::primitive_desc pd = p.make_pd();
        do {
            ++accepting;
        } while (pd.next_impl());
    }
    set_verbose(3);
    paged_attention::primitive_desc pd;
    const auto capped = verbose_lines([&] { pd = p.make_pd(cpu_isa::generic); });
    const auto plain = verbose_lines([&] { p.make_pd(); });
    paged_attention prim(pd);
    const auto exec_lines = verbose_lines([&] { p.run(prim); });
    set_verbose(0);
    EXPECT_EQ(parse(capped, "create").size(), 1u) << joined(capped);
    EXPECT_GE(count_dispatch(capped), accepting - 1) << joined(capped);
    EXPECT_EQ(parse(plain, "create").size(), 1u) << joined(plain);
    EXPECT_EQ(parse(exec_lines, "exec").size(), 1u) << joined(exec_lines);
    // Every line is either a create/exec line (checked by parse) or a dispatch line.
    for (const auto &l : capped) {
        if (l.rfind("pagedattn_verbose,create:dispatch,", 0) == 0) {
            EXPECT_EQ(count_dispatch({ l }), 1u) << l;
        }
    }
}

// An implementation above the host's level says which feature the host lacks. On a host without AMX
// (and a build with the hardware tiles) that is x64:amx: the CPUID bits, the OS's tile state in XCR0
// or Linux's permission for tile data, whichever failed first.
TEST_F(verbose, an_implementation_above_the_host_names_what_the_host_lacks) {
#if PAGEDATTN_AMX_EMULATOR
    GTEST_SKIP() << "x64:amx runs on emulated tiles in this build: it is never above the host";
#else
    if (get_host_cpu_isa() >= cpu_isa::amx) GTEST_SKIP() << "the host has AMX: nothing is above it";
    pa_setup p;
    if (std::string(p.make_pd().impl_info_str()) == "ref:any")
        GTEST_SKIP() << "no x64 implementation in this build (PAGEDATTN_ENABLE_X64=OFF) or on this host";
    set_verbose(3);
    const auto lines = verbose_lines([&] { p.make_pd(); });
    set_verbose(0);
    const std::regex amx(
            R"(^pagedattn_verbose,create:dispatch,paged_attention,x64:amx,the host lacks amx \((the CPU lacks AMX-TILE or AMX-BF16 \(CPUID\)|the OS does not enable AMX tile state.*|Linux refused AMX tile data.*|the CPU lacks .*|the OS does not .*)\)$)");
    size_t found = 0;
    for (const auto &l : lines)
        found += std::regex_match(l, amx);
    EXPECT_EQ(found, 1u) << joined(lines);
#endif
}

TEST_F(verbose, level_1_prints_exec_lines_only) {
    pa_setup p;
    set_verbose(1);
    paged_attention::primitive_desc pd;
    const auto create_lines = verbose_lines([&] { pd = p.make_pd(); });
    paged_attention prim(pd);
    const auto exec_lines = verbose_lines([&] {
        p.run(prim);
        p.run(prim);
    });
    set_verbose(0);
    EXPECT_TRUE(create_lines.empty()) << joined(create_lines);
    EXPECT_EQ(parse(exec_lines, "exec").size(), 2u) << joined(exec_lines);
    EXPECT_EQ(exec_lines.size(), 2u) << joined(exec_lines);
}

TEST_F(verbose, level_0_prints_nothing) {
    pa_setup p;
    set_verbose(0);
    const auto lines = verbose_lines([&] {
        paged_attention prim(p.make_pd(cpu_isa::generic));
        p.run(prim);
    });
    EXPECT_TRUE(lines.empty()) << joined(lines);
}

TEST_F(verbose, failed_execute_prints_no_exec_line) {
    pa_setup p;
    paged_attention prim(p.make_pd());
    set_verbose(1);
    p.seq_lens[1] = 0; // below the query length: invalid
    const auto lines = verbose_lines([&] { EXPECT_THROW(p.run(prim), pagedattn::error); });
    set_verbose(0);
    EXPECT_EQ(parse(lines, "exec").size(), 0u) << joined(lines);
}

TEST_F(verbose, reshape_and_cache_lines) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    const dim h = 2, d = 64, bs = 16, nb = 4, t = 3;
    const tensor_desc cache_md({ nb, h, bs, d }, data_type::f8_e5m2, layout::any);
    primitive_attr attr;
    attr.set_scales_mask(ARG_K_CACHE, scales_per_token);
    attr.set_scales_mask(ARG_V_CACHE, scales_per_token);
    set_verbose(2);
    reshape_and_cache::primitive_desc pd;
    const auto create_lines = verbose_lines([&] {
        pd = reshape_and_cache::primitive_desc(
                eng,
                reshape_and_cache::desc(tensor_desc({ runtime_dim, h, d }, data_type::bf16),
                                        tensor_desc({ runtime_dim, h, d }, data_type::bf16), cache_md,
                                        cache_md),
                attr);
    });
    reshape_and_cache prim(pd);
    std::vector<uint16_t> key(t * h * d, 0x3F80), value(t * h * d, 0xBF80); // bf16 1.0 and -1.0
    std::vector<uint8_t> k_cache(pd.query_md(ARG_K_CACHE).get_size()),
            v_cache(pd.query_md(ARG_V_CACHE).get_size());
    std::vector<float> k_scales(nb * h * bs), v_scales(nb * h * bs);
    std::vector<int64_t> slots { 0, 5, -1 };
    const auto exec_lines = verbose_lines([&] {
        prim.execute(
                strm,
                { { ARG_KEY, tensor(tensor_desc({ t, h, d }, data_type::bf16), key.data()) },
                  { ARG_VALUE, tensor(tensor_desc({ t, h, d }, data_type::bf16), value.data()) },
                  { ARG_K_CACHE, tensor(pd.query_md(ARG_K_CACHE), k_cache.data()) },
                  { ARG_V_CACHE, tensor(pd.query_md(ARG_V_CACHE), v_cache.data()) },
                  { ARG_SLOT_MAPPING, tensor(tensor_desc({ t }, data_type::s64), slots.data()) },
                  { ARG_K_SCALES, tensor(tensor_desc({ nb, h, bs }, data_type::f32), k_scales.data()) },
                  { ARG_V_SCALES, tensor(tensor_desc({ nb, h, bs }, data_type::f32), v_scales.data()) } });
        strm.wait();
    });
    set_verbose(0);
    const auto creates = parse(create_lines, "create");
    const auto execs = parse(exec_lines, "exec");
    ASSERT_EQ(creates.size(), 1u) << joined(create_lines);
    ASSERT_EQ(execs.size(), 1u) << joined(exec_lines);
    for (const auto *l : { &creates[0], &execs[0] }) {
        EXPECT_EQ(l->primitive, "reshape_and_cache");
        EXPECT_EQ(l->impl, pd.impl_info_str());
        EXPECT_NE(l->descs.find("f8_e5m2"), std::string::npos) << l->descs;
        EXPECT_NE(l->descs.find("4x2x16x64"), std::string::npos) << l->descs;
        EXPECT_NE(l->descs.find("bf16"), std::string::npos) << l->descs;
    }
}

} // namespace
