// Every FP8 code through every paged_attention implementation, in both cache layouts, with f32
// and bf16 dst, and with 1 or 16 query heads on the one kv head (16 rows: x64:amx's tile products;
// every head's query is the same, so each must give the same expected row), exactly: the kernels dequantize
// in registers (x64:avx512 and x64:avx2: e4m3 by shifts into f32 bits, as f32 subnormals for its subnormals;
// e5m2 likewise on x64:avx2 and as f16's top byte on x64:avx512; x64:avx512_bf16: both
// by byte tables into bf16), and FP8 subnormals, the largest values, inf and NaN must come out as the format
// defines them.
//   values: a one-hot softmax (score 448 against 0: every other weight underflows) selects one token,
//           the others' values are 0, and dst is exactly the selected token's dequantized V row;
//   keys:   two tokens, score x = q * k_code against 0, dst[0] = 1 / (1 + exp(-x)) in fp64.
// Each case runs as well with flush-to-zero and denormals-are-zero set in the caller's MXCSR (x86):
// FP8 subnormals must come out exact there too.
#include <cmath>
#include <cstring>
#include <ostream>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define PAGEDATTN_TEST_MXCSR 1
#endif

#include "pagedattn/pagedattn.hpp"
#include "reference_formats.hpp"

namespace {

namespace pa = pagedattn;

constexpr pa::dim block_size = 16;

// Byte offset of (block, t, d) in a one-head cache of head size hs: the element order of
// layout::packed written out from its definition, or plain HND.
pa::dim offset(pa::layout l, bool value, pa::dim block, pa::dim t, pa::dim d, pa::dim hs) {
    const pa::dim region = block * block_size * hs;
    if (l == pa::layout::plain) return region + t * hs + d;
    if (!value) return region + (t / 16) * 16 * hs + (d / 2) * 32 + (t % 16) * 2 + d % 2;
    return region + (d / 16) * 16 * block_size + (t / 2) * 32 + (d % 16) * 2 + t % 2;
}

struct setup {
    pa::data_type dt;
    pa::layout l;
    pa::data_type q_dt;   // f32 or bf16 (the values used are exact in bf16)
    pa::data_type dst_dt; // f32 or bf16 (with bf16, x64:avx512_bf16 multiplies the values in bf16 pairs)
    bool flush = false;   // FTZ and DAZ set in MXCSR around each execute
    pa::dim tokens;
    pa::dim head_size;
    pa::dim q_heads; // all with the same query
    std::vector<uint8_t> k, v;
    std::vector<int32_t> table, lens, starts { 0, 1 };
    std::vector<float> q, dst;
    pa::tensor_desc cache_md;
    std::vector<uint16_t> q_bf16, dst_bf16;
    std::vector<float> v_scales; // per token (block, head, token), when the primitive has that mask
    pa::dim window_left = -1;    // the sliding window's left bound (the query is at tokens - 1)
    pa::dim q_len = 1;           // query tokens, the last tokens' positions, all with the same query
    bool causal = false;

    setup(pa::data_type dt_, pa::layout l_, pa::data_type q_dt_, pa::data_type dst_dt_, pa::dim tokens_,
          pa::dim q_heads_, pa::dim head_size_ = 16)
        : dt(dt_), l(l_), q_dt(q_dt_), dst_dt(dst_dt_), tokens(tokens_), head_size(head_size_),
          q_heads(q_heads_), q(static_cast<size_t>(head_size), 0.f),
          dst(static_cast<size_t>(q_heads * head_size), 0.f),
          q_bf16(static_cast<size_t>(q_heads * head_size), 0),
          dst_bf16(static_cast<size_t>(q_heads * head_size), 0) {
        const pa::dim blocks = (tokens + block_size - 1) / block_size;
        cache_md = pa::tensor_desc({ blocks, 1, block_size, head_size }, dt, l);
        k.assign(cache_md.get_size(), 0);
        v.assign(cache_md.get_size(), 0);
        for (pa::dim b = 0; b < blocks; ++b)
            table.push_back(static_cast<int32_t>(blocks - 1 - b)); // reversed
        lens.push_back(static_cast<int32_t>(tokens));
    }
    uint8_t &k_at(pa::dim t, pa::dim d) {
        return k[offset(l, false, table[t / block_size], t % block_size, d, head_size)];
    }
    uint8_t &v_at(pa::dim t, pa::dim d) {
        return v[offset(l, true, table[t / block_size], t % block_size, d, head_size)];
    }
    pa::paged_attention::desc desc() const {
        pa::paged_attention::options o;
        o.causal = causal;
        o.softmax_scale = 1.f;
        o.window_left = window_left;
        return pa::paged_attention::desc({ { pa::runtime_dim, q_heads, head_size }, q_dt }, cache_md,
                                         cache_md, { { pa::runtime_dim, q_heads, head_size }, dst_dt }, o);
    }
    void run(const pa::paged_attention &prim) {
        std::vector<float> q_rows;
        for (pa::dim h = 0; h < q_len * q_heads; ++h)
            q_rows.insert(q_rows.end(), q.begin(), q.end());
        q_bf16.resize(q_rows.size());
        dst.resize(q_rows.size());
        dst_bf16.resize(q_rows.size());
        starts = { 0, static_cast<int32_t>(q_len) };
        for (size_t i = 0; i < q_rows.size(); ++i) { // the top half of an f32 that is exact in bf16
            uint32_t bits;
            std::memcpy(&bits, &q_rows[i], 4);
            q_bf16[i] = static_cast<uint16_t>(bits >> 16);
        }
        const void *query =
                q_dt == pa::data_type::bf16 ? static_cast<const void *>(q_bf16.data()) : q_rows.data();
        dnnl::stream s(dnnl::engine(dnnl::engine::kind::cpu, 0));
        std::unordered_map<int, pa::tensor> args {
            { pa::ARG_QUERY, pa::tensor({ { q_len, q_heads, head_size }, q_dt }, query) },
            { pa::ARG_K_CACHE, pa::tensor(cache_md, k.data()) },
            { pa::ARG_V_CACHE, pa::tensor(cache_md, v.data()) },
            { pa::ARG_BLOCK_TABLE,
              pa::tensor({ { 1, static_cast<pa::dim>(table.size()) }, pa::data_type::s32 }, table.data()) },
            { pa::ARG_SEQ_LENS, pa::tensor({ { 1 }, pa::data_type::s32 }, lens.data()) },
            { pa::ARG_QUERY_START_LOC, pa::tensor({ { 2 }, pa::data_type::s32 }, starts.data()) },
            { pa::ARG_DST, pa::tensor({ { q_len, q_heads, head_size }, dst_dt },
                                      dst_dt == pa::data_type::bf16 ? static_cast<void *>(dst_bf16.data())
                                                                    : static_cast<void *>(dst.data())) }
        };
        if (!v_scales.empty())
            args[pa::ARG_V_SCALES] = pa::tensor(
                    { { cache_md.get_dims()[0], 1, block_size }, pa::data_type::f32 }, v_scales.data());
#ifdef PAGEDATTN_TEST_MXCSR
        const unsigned saved = _mm_getcsr();
        if (flush) _mm_setcsr(saved | 0x8040u); // FTZ (bit 15) and DAZ (bit 6)
#endif
        if (flush) {
            // In an arena initialized under FTZ and DAZ: oneTBB gives an arena's worker threads the
            // floating-point settings of the thread that initialized it, so every thread that may run
            // an item has them (the default arena keeps those of whichever test came first).
            tbb::task_arena arena;
            arena.initialize();
            arena.execute([&] {
                prim.execute(s, args);
                s.wait();
            });
        } else {
            prim.execute(s, args);
            s.wait();
        }
#ifdef PAGEDATTN_TEST_MXCSR
        const unsigned after = _mm_getcsr();
        _mm_setcsr(saved);
        // Control bits only: the exception flags (bits 0-5) are sticky.
        if (flush) {
            EXPECT_EQ(after & ~0x3Fu, (saved | 0x8040u) & ~0x3Fu) << "the library changed the caller's MXCSR";
        }
#endif
        if (dst_dt == pa::data_type::bf16)
            for (size_t i = 0; i < dst.size(); ++i) { // bf16 bits are an f32's top half
                const uint32_t bits = static_cast<uint32_t>(dst_bf16[i]) << 16;
                std::memcpy(&dst[i], &bits, 4);
            }
    }
    float out(pa::dim head, pa::dim d, pa::dim token = 0) const {
        return dst[static_cast<size_t>((token * q_heads + head) * head_size + d)];
    }
};

reference::format format_of(pa::data_type dt) {
    return dt == pa::data_type::f8_e4m3 ? reference::format::e4m3 : reference::format::e5m2;
}

struct param {
    pa::data_type dt;
    pa::layout l;
    pa::data_type q_dt, dst_dt;
    pa::dim q_heads;
    bool flush; // FTZ and DAZ in the caller's MXCSR
};
void PrintTo(const param &p, std::ostream *os) {
    *os << pa::data_type_name(p.dt) << " " << pa::layout_name(p.l) << " query " << pa::data_type_name(p.q_dt)
        << " dst " << pa::data_type_name(p.dst_dt) << " " << p.q_heads << " q heads"
        << (p.flush ? " FTZ DAZ" : "");
}

class fp8_codes : public ::testing::TestWithParam<param> {};

TEST_P(fp8_codes, every_value_code_is_dequantized_exactly) {
    const param p = GetParam();
    const reference::format f = format_of(p.dt);
    setup s(p.dt, p.l, p.q_dt, p.dst_dt, 17,
            p.q_heads); // head size 16: token 0 selects, the 16 others hold 16 codes each
    s.flush = p.flush;
    const uint8_t big = p.dt == pa::data_type::f8_e4m3 ? 0x7E : 0x5F; // 448, and 448 in e5m2 too
    pa::paged_attention::primitive_desc pd(dnnl::engine(dnnl::engine::kind::cpu, 0), s.desc());
    do {
        SCOPED_TRACE(std::string(pd.impl_info_str()) + (p.l == pa::layout::packed ? " packed" : " plain"));
        const pa::paged_attention prim(pd);
        for (pa::dim target = 1; target < s.tokens; ++target) {
            std::fill(s.k.begin(), s.k.end(), 0);
            std::fill(s.v.begin(), s.v.end(), 0);
            s.k_at(target, 0) = big;
            // Only the selected token holds codes: every visible token's weight is positive by the
            // definition, so a NaN or inf value elsewhere would rightly reach dst.
            for (pa::dim d = 0; d < s.head_size; ++d)
                s.v_at(target, d) = static_cast<uint8_t>((target - 1) * s.head_size + d);
            s.q[0] = 1.f;
            s.run(prim);
            for (pa::dim h = 0; h < s.q_heads; ++h)
                for (pa::dim d = 0; d < s.head_size; ++d) {
                    const uint8_t code = static_cast<uint8_t>((target - 1) * s.head_size + d);
                    const double expected = reference::decode_fp8(f, code);
                    const float got = s.out(h, d);
                    if (std::isnan(expected))
                        EXPECT_TRUE(std::isnan(got)) << "code " << int(code) << " head " << h;
                    else
                        EXPECT_EQ(static_cast<double>(got), expected)
                                << "code " << int(code) << " head " << h;
                }
        }
    } while (pd.next_impl());
}

// Per-token V scales from 2^-100 to 2^100 (powers of two, so the products stay exact): each code
// of the selected token times its scale, exactly. Kernels that carry part of a decoding's unit in
// the probabilities must leave room for the scales there.
TEST_P(fp8_codes, every_value_code_times_a_per_token_scale_is_exact) {
    const param p = GetParam();
    const reference::format f = format_of(p.dt);
    setup s(p.dt, p.l, p.q_dt, p.dst_dt, 17, p.q_heads);
    s.flush = p.flush;
    const uint8_t big = p.dt == pa::data_type::f8_e4m3 ? 0x7E : 0x5F;
    pa::primitive_attr attr;
    attr.set_scales_mask(pa::ARG_V_CACHE, pa::scales_per_token);
    pa::paged_attention::primitive_desc pd(dnnl::engine(dnnl::engine::kind::cpu, 0), s.desc(), attr);
    do {
        SCOPED_TRACE(std::string(pd.impl_info_str()) + (p.l == pa::layout::packed ? " packed" : " plain"));
        const pa::paged_attention prim(pd);
        for (int exponent : { -100, 0, 100 })
            for (pa::dim target = 1; target < s.tokens; target += 5) {
                std::fill(s.k.begin(), s.k.end(), 0);
                std::fill(s.v.begin(), s.v.end(), 0);
                s.k_at(target, 0) = big;
                for (pa::dim d = 0; d < s.head_size; ++d)
                    s.v_at(target, d) = static_cast<uint8_t>((target - 1) * s.head_size + d);
                // Every token's scale is the selected one's: the largest in the range.
                s.v_scales.assign(static_cast<size_t>(s.cache_md.get_dims()[0] * block_size),
                                  std::ldexp(1.f, exponent));
                s.q[0] = 1.f;
                s.run(prim);
                for (pa::dim h = 0; h < s.q_heads; ++h)
                    for (pa::dim d = 0; d < s.head_size; ++d) {
                        const uint8_t code = static_cast<uint8_t>((target - 1) * s.head_size + d);
                        const double expected = std::ldexp(reference::decode_fp8(f, code), exponent);
                        const float got = s.out(h, d);
                        if (std::isnan(expected))
                            EXPECT_TRUE(std::isnan(got)) << "code " << int(code) << " scale 2^" << exponent;
                        else
                            EXPECT_EQ(static_cast<double>(got), expected)
                                    << "code " << int(code) << " scale 2^" << exponent << " head " << h;
                    }
            }
    } while (pd.next_impl());
}

TEST_P(fp8_codes, every_finite_key_code_is_dequantized_exactly) {
    const param p = GetParam();
    const reference::format f = format_of(p.dt);
    setup s(p.dt, p.l, p.q_dt, p.dst_dt, 2, p.q_heads);
    s.flush = p.flush;
    pa::paged_attention::primitive_desc pd(dnnl::engine(dnnl::engine::kind::cpu, 0), s.desc());
    do {
        SCOPED_TRACE(std::string(pd.impl_info_str()) + (p.l == pa::layout::packed ? " packed" : " plain"));
        const pa::paged_attention prim(pd);
        for (int code = 1; code < 256; ++code) {
            const double k = reference::decode_fp8(f, static_cast<uint8_t>(code));
            if (!std::isfinite(k) || k == 0.0) continue;
            // q = a power of two that puts the score in [1, 2): a key read wrongly (a subnormal
            // flushed to zero, a wrong exponent) moves the result far beyond rounding.
            const float q = std::ldexp(1.f, -std::ilogb(k));
            std::fill(s.k.begin(), s.k.end(), 0);
            std::fill(s.v.begin(), s.v.end(), 0);
            s.k_at(0, 5) = static_cast<uint8_t>(code);
            s.v_at(0, 0) = p.dt == pa::data_type::f8_e4m3 ? 0x38 : 0x3C; // 1.0
            s.v_at(1, 1) = p.dt == pa::data_type::f8_e4m3 ? 0x38 : 0x3C;
            std::fill(s.q.begin(), s.q.end(), 0.f);
            s.q[5] = q;
            s.run(prim);
            const double x = static_cast<double>(q) * k;
            const double expected = 1.0 / (1.0 + std::exp(-x));
            // f32 softmax of two scores: a few ulps of the weights; a bf16 dst adds its rounding, and
            // that of the probabilities (x64:avx512_bf16): bf16's unit roundoff 2^-8 each.
            const double bf16_slack = p.dst_dt == pa::data_type::bf16 ? 0x1p-7 : 0.0;
            for (pa::dim h = 0; h < s.q_heads; ++h) {
                EXPECT_NEAR(s.out(h, 0), expected, 4e-7 + bf16_slack * expected)
                        << "code " << code << " key " << k << " head " << h;
                EXPECT_NEAR(s.out(h, 1), 1.0 - expected, 4e-7 + bf16_slack * (1.0 - expected))
                        << "code " << code << " key " << k << " head " << h;
            }
        }
    } while (pd.next_impl());
}

// An attended NaN value reaches dst wherever it sits in the KV range: in each 16-token group of a
// 128-token chunk (block size 16: each group from another block), in each group of 16 dims, and in
// a chunk after the first. Kernels that check a chunk's e4m3 codes for NaN to skip its decoding
// patch must check all of them. Keys and the other values are 0: every token weighs 1 / 160.
TEST_P(fp8_codes, a_nan_value_anywhere_in_the_range_reaches_dst) {
    const param p = GetParam();
    const pa::dim tokens = 160, d_size = 128;
    setup s(p.dt, p.l, p.q_dt, p.dst_dt, tokens, p.q_heads, d_size);
    s.flush = p.flush;
    const uint8_t nan_code = p.dt == pa::data_type::f8_e4m3 ? 0x7F : 0x7E;
    pa::paged_attention::primitive_desc pd(dnnl::engine(dnnl::engine::kind::cpu, 0), s.desc());
    do {
        SCOPED_TRACE(std::string(pd.impl_info_str()) + (p.l == pa::layout::packed ? " packed" : " plain"));
        const pa::paged_attention prim(pd);
        for (pa::dim t : { 0, 15, 16, 33, 47, 48, 63, 64, 79, 95, 96, 111, 127, 128, 150, 159 })
            for (pa::dim d : { 0, 15, 16, 70, 127 }) {
                std::fill(s.v.begin(), s.v.end(), 0);
                s.v_at(t, d) = static_cast<uint8_t>(nan_code | (t % 2 ? 0x80 : 0));
                s.run(prim);
                for (pa::dim h = 0; h < s.q_heads; ++h)
                    for (pa::dim i = 0; i < d_size; ++i) {
                        const float got = s.out(h, i);
                        if (i == d)
                            EXPECT_TRUE(std::isnan(got))
                                    << "NaN at token " << t << " dim " << d << " head " << h;
                        else
                            EXPECT_EQ(got, 0.f)
                                    << "NaN at token " << t << " dim " << d << ", dim " << i << " head " << h;
                    }
            }
    } while (pd.next_impl());
}

// Head size 80: five 16-dim rows of values, so that x64:avx512 (one q head: one row of 8 vectors
// per slice at most) decodes the last alone, apart from the pairs of rows it decodes together.
TEST_P(fp8_codes, a_nan_value_in_a_head_of_five_16_dim_rows_reaches_dst) {
    const param p = GetParam();
    const pa::dim tokens = 48, d_size = 80;
    setup s(p.dt, p.l, p.q_dt, p.dst_dt, tokens, p.q_heads, d_size);
    s.flush = p.flush;
    const uint8_t nan_code = p.dt == pa::data_type::f8_e4m3 ? 0x7F : 0x7E;
    pa::paged_attention::primitive_desc pd(dnnl::engine(dnnl::engine::kind::cpu, 0), s.desc());
    do {
        SCOPED_TRACE(std::string(pd.impl_info_str()) + (p.l == pa::layout::packed ? " packed" : " plain"));
        const pa::paged_attention prim(pd);
        for (pa::dim t : { 0, 17, 47 })
            for (pa::dim d : { 0, 31, 64, 79 }) {
                std::fill(s.v.begin(), s.v.end(), 0);
                s.v_at(t, d) = static_cast<uint8_t>(nan_code | (t % 2 ? 0x80 : 0));
                s.run(prim);
                for (pa::dim h = 0; h < s.q_heads; ++h)
                    for (pa::dim i = 0; i < d_size; ++i) {
                        const float got = s.out(h, i);
                        if (i == d)
                            EXPECT_TRUE(std::isnan(got))
                                    << "NaN at token " << t << " dim " << d << " head " << h;
                        else
                            EXPECT_EQ(got, 0.f)
                                    << "NaN at token " << t << " dim " << d << ", dim " << i << " head " << h;
                    }
            }
    } while (pd.next_impl());
}

// A window whose first visible token is odd splits a token pair of the packed V rows: the pair is
// read for the visible token alone (x64 kernels: outside the loop over the pairs every row sees
// whole). A NaN value there reaches dst, and one at its invisible neighbour does not. Kernels that
// check e4m3 codes for NaN as they read them must check these reads too.
TEST_P(fp8_codes, a_nan_value_at_a_window_edge_reaches_dst_and_its_hidden_neighbours_does_not) {
    const param p = GetParam();
    const pa::dim tokens = 160, d_size = 128;
    const uint8_t nan_code = p.dt == pa::data_type::f8_e4m3 ? 0x7F : 0x7E;
    for (pa::dim first_visible : { 1, 33, 127, 129 }) {
        setup s(p.dt, p.l, p.q_dt, p.dst_dt, tokens, p.q_heads, d_size);
        s.flush = p.flush;
        s.window_left = tokens - 1 - first_visible;
        pa::paged_attention::primitive_desc pd(dnnl::engine(dnnl::engine::kind::cpu, 0), s.desc());
        do {
            SCOPED_TRACE(std::string(pd.impl_info_str()) +
                         (p.l == pa::layout::packed ? " packed" : " plain") + " first visible token " +
                         std::to_string(first_visible));
            const pa::paged_attention prim(pd);
            for (pa::dim d : { 0, 15, 16, 70, 127 })
                for (const bool hidden : { false, true }) {
                    std::fill(s.v.begin(), s.v.end(), 0);
                    const pa::dim t = hidden ? first_visible - 1 : first_visible;
                    s.v_at(t, d) = static_cast<uint8_t>(nan_code | (d % 2 ? 0x80 : 0));
                    s.run(prim);
                    for (pa::dim h = 0; h < s.q_heads; ++h)
                        for (pa::dim i = 0; i < d_size; ++i) {
                            const float got = s.out(h, i);
                            if (i == d && !hidden)
                                EXPECT_TRUE(std::isnan(got)) << "NaN at token " << t << " dim " << d;
                            else
                                EXPECT_EQ(got, 0.f) << "NaN at token " << t << " dim " << d << ", dim " << i
                                                    << (hidden ? " (not visible)" : "");
                        }
                }
        } while (pd.next_impl());
    }
}

// Causal verify, 4 query tokens at positions 36-39 of 40, keys 0 (equal weights): a NaN (e4m3) or
// infinite (e5m2) value at token 37 is seen by the last three query tokens alone. The first one's
// rows weigh it 0 and must come out 0 (every other value is 0), not NaN from 0 x inf or 0 x NaN:
// kernels that weigh a chunk's values for several rows at once must skip each row's zero weights.
TEST_P(fp8_codes, a_special_value_hidden_from_a_query_row_by_causality_does_not_reach_it) {
    const param p = GetParam();
    const pa::dim tokens = 40, d_size = 128, special_token = 37, special_dim = 5;
    setup s(p.dt, p.l, p.q_dt, p.dst_dt, tokens, p.q_heads, d_size);
    s.flush = p.flush;
    s.q_len = 4;
    s.causal = true;
    s.v_at(special_token, special_dim) = p.dt == pa::data_type::f8_e4m3 ? 0x7F : 0x7C;
    pa::paged_attention::primitive_desc pd(dnnl::engine(dnnl::engine::kind::cpu, 0), s.desc());
    do {
        SCOPED_TRACE(std::string(pd.impl_info_str()) + (p.l == pa::layout::packed ? " packed" : " plain"));
        s.run(pa::paged_attention(pd));
        for (pa::dim t = 0; t < s.q_len; ++t)
            for (pa::dim h = 0; h < s.q_heads; ++h)
                for (pa::dim i = 0; i < d_size; ++i) {
                    const float got = s.out(h, i, t);
                    if (t >= 1 && i == special_dim)
                        EXPECT_FALSE(std::isfinite(got)) << "query token " << t << " head " << h;
                    else
                        EXPECT_EQ(got, 0.f) << "query token " << t << " head " << h << " dim " << i;
                }
    } while (pd.next_impl());
}

// A NaN key anywhere in the range makes the score of its token NaN, and so every output of the
// rows that see it (as in the oracle). Kernels that check a chunk's e4m3 key codes for NaN to skip
// its decoding patch must check all of them; the keys are otherwise 0 and the values 1.
// 176 tokens: the second 128-token chunk holds an odd number of 16-token groups (3), which kernels
// that decode groups two at a time must handle apart (tokens 160-175).
TEST_P(fp8_codes, a_nan_key_anywhere_in_the_range_makes_the_rows_nan) {
    const param p = GetParam();
    const pa::dim tokens = 176, d_size = 128;
    setup s(p.dt, p.l, p.q_dt, p.dst_dt, tokens, p.q_heads, d_size);
    s.flush = p.flush;
    const uint8_t nan_code = p.dt == pa::data_type::f8_e4m3 ? 0x7F : 0x7E,
                  one = p.dt == pa::data_type::f8_e4m3 ? 0x38 : 0x3C;
    std::fill(s.q.begin(), s.q.end(), 1.f);
    pa::paged_attention::primitive_desc pd(dnnl::engine(dnnl::engine::kind::cpu, 0), s.desc());
    do {
        SCOPED_TRACE(std::string(pd.impl_info_str()) + (p.l == pa::layout::packed ? " packed" : " plain"));
        const pa::paged_attention prim(pd);
        for (pa::dim t : { 0, 15, 16, 33, 63, 64, 95, 127, 128, 159, 160, 175 })
            for (pa::dim d : { 0, 15, 16, 70, 127 }) {
                std::fill(s.k.begin(), s.k.end(), 0);
                std::fill(s.v.begin(), s.v.end(), one);
                s.k_at(t, d) = static_cast<uint8_t>(nan_code | (t % 2 ? 0x80 : 0));
                s.run(prim);
                for (pa::dim h = 0; h < s.q_heads; ++h)
                    for (pa::dim i = 0; i < d_size; ++i)
                        EXPECT_TRUE(std::isnan(s.out(h, i)))
                                << "NaN key at token " << t << " dim " << d << ", dim " << i << " head " << h;
            }
    } while (pd.next_impl());
}

// e5m2's infinities as keys, anywhere in the range: +inf makes its score +inf and so the rows NaN
// (inf - inf in the softmax, as in the oracle); -inf makes its score -inf and drops its token, so
// the rows hold the other tokens' values, all 1 (to the normalization's rounding). Kernels that check the
// codes for specials to skip their decoding patch must count the infinities (magnitude 0x7C) as specials.
TEST_P(fp8_codes, an_inf_key_anywhere_in_the_range_makes_the_rows_nan_or_drops_its_token) {
    const param p = GetParam();
    if (p.dt != pa::data_type::f8_e5m2) GTEST_SKIP() << "e4m3 has no infinity";
    const pa::dim tokens = 176, d_size = 128; // (a lone group as in the NaN test above)
    setup s(p.dt, p.l, p.q_dt, p.dst_dt, tokens, p.q_heads, d_size);
    s.flush = p.flush;
    const uint8_t one = 0x3C;
    std::fill(s.q.begin(), s.q.end(), 1.f);
    pa::paged_attention::primitive_desc pd(dnnl::engine(dnnl::engine::kind::cpu, 0), s.desc());
    do {
        SCOPED_TRACE(std::string(pd.impl_info_str()) + (p.l == pa::layout::packed ? " packed" : " plain"));
        const pa::paged_attention prim(pd);
        for (pa::dim t : { 0, 15, 16, 33, 63, 64, 95, 127, 128, 159, 160, 175 })
            for (pa::dim d : { 0, 15, 16, 70, 127 })
                for (const bool negative : { false, true }) {
                    std::fill(s.k.begin(), s.k.end(), 0);
                    std::fill(s.v.begin(), s.v.end(), one);
                    s.k_at(t, d) = negative ? 0xFC : 0x7C;
                    s.run(prim);
                    for (pa::dim h = 0; h < s.q_heads; ++h)
                        for (pa::dim i = 0; i < d_size; ++i) {
                            if (negative)
                                EXPECT_NEAR(s.out(h, i), 1.f, 1e-6) // (normalized by 1 / the sum)
                                        << "-inf key at token " << t << " dim " << d << ", dim " << i;
                            else
                                EXPECT_TRUE(std::isnan(s.out(h, i)))
                                        << "+inf key at token " << t << " dim " << d << ", dim " << i;
                        }
                }
    } while (pd.next_impl());
}

std::vector<param> params() {
    std::vector<param> v;
    for (pa::data_type dt : { pa::data_type::f8_e4m3, pa::data_type::f8_e5m2 })
        for (pa::layout l : { pa::layout::plain, pa::layout::packed })
            for (pa::data_type q : { pa::data_type::f32, pa::data_type::bf16 })
                for (pa::data_type dst : { pa::data_type::f32, pa::data_type::bf16 })
                    for (pa::dim q_heads : { 1, 16 })
                        for (bool flush : { false, true }) {
#ifndef PAGEDATTN_TEST_MXCSR
                            if (flush) continue;
#endif
                            v.push_back({ dt, l, q, dst, q_heads, flush });
                        }
    return v;
}

INSTANTIATE_TEST_SUITE_P(formats, fp8_codes, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<param> &i) {
                             return std::string(i.param.dt == pa::data_type::f8_e4m3 ? "e4m3" : "e5m2") +
                                    (i.param.l == pa::layout::packed ? "_packed" : "_plain") +
                                    (i.param.q_dt == pa::data_type::bf16 ? "_qbf16" : "_qf32") +
                                    (i.param.dst_dt == pa::data_type::bf16 ? "_dstbf16" : "_dstf32") +
                                    (i.param.q_heads == 1 ? "" : "_gqa" + std::to_string(i.param.q_heads)) +
                                    (i.param.flush ? "_ftz_daz" : "");
                         });

} // namespace
