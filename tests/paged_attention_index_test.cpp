// Index-revealing cases that random data hides:
//  - peaked scores: V rows encode their own position, physical block, kv head and sequence; one-hot
//    q and large K entries put a dominant score on one known position, next to a larger one just
//    outside a mask edge (window left/right, causal) or a weaker decoy across a block boundary, so
//    the output names the position that was attended (f32 caches: exact);
//  - all 256 FP8 codes in K and in V (cache bytes written directly), against exact decoding;
//  - a negative control: a key moved by one position must fail the oracle comparison.
#include "test_util.hpp"

namespace {

using namespace test_util;

// ---------------------------------------------------------------------------------------------
// Peaked scores at mask edges and block boundaries.

enum class edge { left, right, causal, block, sink, alibi };
const char *name_of(edge e) {
    switch (e) {
        case edge::left: return "left";
        case edge::right: return "right";
        case edge::causal: return "causal";
        case edge::block: return "block";
        case edge::sink: return "sink";
        case edge::alibi: return "alibi";
    }
    return "?";
}

struct index_case {
    edge kind;
    int64_t hq, hkv, d, bs;
    std::vector<std::pair<int, int>> seqs;
    bool causal;
    int64_t left, right;
    cache_layout layout;
    bool large = false;

    std::string name() const {
        std::ostringstream os;
        os << name_of(kind) << "_h" << hq << "x" << hkv << "_d" << d << "_bs" << bs << "_"
           << (causal ? "causal" : "noncausal") << "_win"
           << (left < 0 ? std::string("inf") : std::to_string(left)) << "_"
           << (right < 0 ? std::string("inf") : std::to_string(right)) << "_" << name_of(layout);
        for (const auto &s : seqs)
            os << "_q" << s.first << "s" << s.second;
        return os.str();
    }
};

// Magnitudes of the peaked K entries (softmax scale 1): the attended one beats every zero score by
// e^50 and a decoy by e^20, so the output equals the attended V row to f32 precision; an entry just
// outside a mask is larger still, so attending it by mistake shows.
constexpr float inside_peak = 50.f, outside_peak = 100.f, decoy_peak = 30.f;
constexpr float alibi_slope = 3.f; // the farther of two equal peaks (10 tokens apart) loses by 30

// DESIGN §3's masks, restated to place the peaks (the oracle has its own copy).
bool visible(const index_case &c, int64_t j, int64_t p, int64_t seq_len) {
    if (j < 0 || j >= seq_len) return false;
    if (c.causal && j > p) return false;
    if (c.left >= 0 && j < p - c.left) return false;
    if (c.right >= 0 && j > p + c.right) return false;
    return true;
}

class paged_attention_index : public ::testing::TestWithParam<index_case> {};

TEST_P(paged_attention_index, attends_the_expected_position) {
    const index_case &c = GetParam();
    if (c.large && reduced()) GTEST_SKIP() << "large case skipped under PAGEDATTN_TEST_REDUCED=1";
    ASSERT_GE(c.d, 8);
    rng r(seed_of(c.name()));
    const batch b = make_batch(c.seqs, c.bs, r, true);
    kv_cache cache = make_cache(format::f32, b.num_blocks, c.hkv, c.bs, c.d, c.layout);
    float *kc = static_cast<float *>(cache.k()), *vc = static_cast<float *>(cache.v());
    for (int64_t s = 0; s < b.num_seqs; ++s)
        for (int64_t j = 0; j < b.seq_lens[static_cast<size_t>(s)]; ++j)
            for (int64_t g = 0; g < c.hkv; ++g) {
                const int64_t blk = b.block_of(s, j), o = cache.offset(blk, g, j % c.bs);
                std::fill(kc + o, kc + o + c.d, 0.f);
                std::fill(vc + o, vc + o + c.d, 0.f);
                // V names its position, physical block, kv head, sequence and offset in the block.
                vc[o + 0] = static_cast<float>(j);
                vc[o + 1] = static_cast<float>(blk);
                vc[o + 2] = static_cast<float>(g);
                vc[o + 3] = static_cast<float>(s);
                vc[o + 4] = static_cast<float>(j % c.bs);
            }

    // Query token i of a sequence is one-hot along dim i, so its peaks live in that K column only.
    buffer q(static_cast<size_t>(b.tokens * c.hq * c.d * 4));
    float *qf = q.as<float>();
    std::fill(qf, qf + b.tokens * c.hq * c.d, 0.f);
    std::vector<int64_t> target(static_cast<size_t>(b.tokens * c.hkv), -1); // expected position per (t, g)
    const auto put = [&](int64_t s, int64_t g, int64_t j, int64_t dim, float value) {
        kc[cache.offset(b.block_of(s, j), g, j % c.bs) + dim] = value;
    };
    int64_t targets = 0;
    for (int64_t s = 0; s < b.num_seqs; ++s) {
        const int64_t ql = b.q_lens[static_cast<size_t>(s)], sl = b.seq_lens[static_cast<size_t>(s)];
        ASSERT_LE(ql, c.d) << "one K column per query token";
        for (int64_t i = 0; i < ql; ++i) {
            const int64_t t = b.query_start_loc[static_cast<size_t>(s)] + i, p = sl - ql + i;
            for (int64_t h = 0; h < c.hq; ++h)
                qf[(t * c.hq + h) * c.d + i] = 1.f;
            for (int64_t g = 0; g < c.hkv; ++g) {
                // The attended position differs per kv head (by g), so GQA mapping errors show.
                int64_t in = -1, out = -1, decoy_a = -1, decoy_b = -1, far = -1;
                switch (c.kind) {
                    case edge::left:
                        in = p - c.left + g;
                        out = p - c.left - 1;
                        break;
                    case edge::right:
                        in = p + c.right - g;
                        out = p + c.right + 1;
                        break;
                    case edge::causal:
                    case edge::sink:
                        in = p - g;
                        out = p + 1;
                        break;
                    case edge::block:
                        in = (p / c.bs) * c.bs - (g % 2); // first token of p's block or last of the previous
                        decoy_a = in - 1;
                        decoy_b = in + 1;
                        break;
                    case edge::alibi:
                        in = p - g;
                        far = in - 10;
                        break;
                }
                const bool has_in = visible(c, in, p, sl);
                if (out >= 0 && out < sl) {
                    ASSERT_FALSE(visible(c, out, p, sl)) << "test bug: the outside peak is visible";
                    put(s, g, out, i, outside_peak);
                }
                if (!has_in) continue;
                put(s, g, in, i, inside_peak);
                if (visible(c, decoy_a, p, sl)) put(s, g, decoy_a, i, decoy_peak);
                if (visible(c, decoy_b, p, sl)) put(s, g, decoy_b, i, decoy_peak);
                if (visible(c, far, p, sl)) put(s, g, far, i, inside_peak);
                target[static_cast<size_t>(t * c.hkv + g)] = in;
                ++targets;
            }
        }
    }
    ASSERT_GT(targets, 0) << "test bug: no position to attend";

    pa::paged_attention::options o;
    o.softmax_scale = 1.f;
    o.causal = c.causal;
    o.window_left = c.left;
    o.window_right = c.right;
    o.alibi_slopes = c.kind == edge::alibi;
    o.sinks = c.kind == edge::sink;
    const std::vector<float> slopes(static_cast<size_t>(c.hq), alibi_slope);
    const std::vector<float> sinks(static_cast<size_t>(c.hq), inside_peak); // halves the attended row

    oracle::problem pr;
    pr.num_heads = c.hq;
    pr.num_kv_heads = c.hkv;
    pr.head_size = c.d;
    pr.block_size = c.bs;
    pr.num_blocks = b.num_blocks;
    pr.num_seqs = b.num_seqs;
    pr.seq_lens = b.seq_lens.data();
    pr.query_start_loc = b.query_start_loc.data();
    pr.block_table = b.block_table.data();
    pr.block_table_stride = b.row_stride;
    pr.softmax_scale = 1.0;
    pr.causal = c.causal;
    pr.window_left = c.left;
    pr.window_right = c.right;
    pr.alibi_slopes = o.alibi_slopes ? slopes.data() : nullptr;
    pr.sinks = o.sinks ? sinks.data() : nullptr;
    oracle::query qv;
    qv.data = q.data();
    qv.fmt = format::f32;
    qv.token_stride = c.hq * c.d;
    qv.head_stride = c.d;
    const oracle::result ref =
            oracle::paged_attention(pr, qv, cache.view(true, oracle::scales::none, nullptr),
                                    cache.view(false, oracle::scales::none, nullptr));

    const pa::tensor_desc qmd({ pa::runtime_dim, c.hq, c.d }, pa::data_type::f32);
    pa::paged_attention::primitive_desc pd(engine(),
                                           pa::paged_attention::desc(qmd, cache.md(), cache.md(), qmd, o));
    dnnl::stream st = make_stream();
    do {
        SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
        buffer dst(q.size());
        const pa::tensor_desc run_md({ b.tokens, c.hq, c.d }, pa::data_type::f32);
        pa::exec_args args {
            { pa::ARG_QUERY, pa::tensor(run_md, q.data()) },
            { pa::ARG_K_CACHE, pa::tensor(cache.md(), cache.k()) },
            { pa::ARG_V_CACHE, pa::tensor(cache.md(), cache.v()) },
            { pa::ARG_BLOCK_TABLE,
              pa::tensor(pa::tensor_desc({ b.num_seqs, b.width }, pa::data_type::s32, { b.row_stride, 1 }),
                         b.block_table.data()) },
            { pa::ARG_SEQ_LENS,
              pa::tensor(pa::tensor_desc({ b.num_seqs }, pa::data_type::s32), b.seq_lens.data()) },
            { pa::ARG_QUERY_START_LOC,
              pa::tensor(pa::tensor_desc({ b.num_seqs + 1 }, pa::data_type::s32), b.query_start_loc.data()) },
            { pa::ARG_DST, pa::tensor(run_md, dst.data()) },
        };
        if (o.alibi_slopes)
            args[pa::ARG_ALIBI_SLOPES] =
                    pa::tensor(pa::tensor_desc({ c.hq }, pa::data_type::f32), slopes.data());
        if (o.sinks)
            args[pa::ARG_SINKS] = pa::tensor(pa::tensor_desc({ c.hq }, pa::data_type::f32), sinks.data());
        pa::paged_attention(pd).execute(st, args);
        st.wait();

        const comparison cmp = compare_attention(dst.data(), format::f32, ref);
        EXPECT_EQ(cmp.failures, 0) << cmp;

        // The position read back from the output, by hand: V of the target (halved with a sink
        // equal to the peak: e^50 / (e^50 + e^50)).
        const float *out = dst.as<float>();
        const double factor = c.kind == edge::sink ? 0.5 : 1.0;
        int64_t wrong = 0;
        for (int64_t s = 0; s < b.num_seqs; ++s)
            for (int64_t i = 0; i < b.q_lens[static_cast<size_t>(s)]; ++i) {
                const int64_t t = b.query_start_loc[static_cast<size_t>(s)] + i;
                for (int64_t h = 0; h < c.hq; ++h) {
                    const int64_t g = h / (c.hq / c.hkv), j = target[static_cast<size_t>(t * c.hkv + g)];
                    if (j < 0) continue;
                    const double want[5] = { static_cast<double>(j), static_cast<double>(b.block_of(s, j)),
                                             static_cast<double>(g), static_cast<double>(s),
                                             static_cast<double>(j % c.bs) };
                    const float *row = out + (t * c.hq + h) * c.d;
                    bool ok = true;
                    // 0.25: positions are integers, so this names exactly one (also when halved).
                    for (int e = 0; e < 5; ++e)
                        ok = ok && std::fabs(row[e] - want[e] * factor) < 0.25;
                    if (!ok && wrong++ < 6)
                        ADD_FAILURE()
                                << "seq " << s << " query " << i << " (p "
                                << (b.seq_lens[static_cast<size_t>(s)] - b.q_lens[static_cast<size_t>(s)] + i)
                                << ") head " << h << ": expected position " << j << " block " << want[1]
                                << " kv head " << g << "; got position " << row[0] / factor << " block "
                                << row[1] / factor << " kv head " << row[2] / factor << " seq "
                                << row[3] / factor << " offset " << row[4] / factor;
                }
            }
        EXPECT_EQ(wrong, 0);
    } while (pd.next_impl());
}

std::vector<index_case> index_cases() {
    const auto hnd = cache_layout::hnd, nhd = cache_layout::nhd, kvs = cache_layout::kv_shared;
    std::vector<index_case> v;
    // vLLM window 256 (left 255, right 0) at p - 256 / p - 255, including the first positions.
    v.push_back({ edge::left,
                  8,
                  2,
                  64,
                  16,
                  { { 1, 700 }, { 20, 300 }, { 1, 256 }, { 1, 257 } },
                  true,
                  255,
                  0,
                  hnd });
    v.push_back({ edge::left, 32, 8, 64, 32, { { 64, 5131 } }, true, 255, 0, kvs, true });
    v.push_back({ edge::left, 4, 4, 32, 1, { { 10, 600 }, { 1, 258 } }, false, 256, -1, nhd });
    v.push_back({ edge::left, 9, 3, 64, 13, { { 30, 400 }, { 1, 77 } }, true, 64, 5, kvs });
    v.push_back({ edge::right, 9, 3, 64, 7, { { 30, 400 }, { 1, 77 } }, false, 40, 17, kvs });
    v.push_back({ edge::right, 16, 1, 32, 16, { { 32, 120 }, { 3, 16 } }, false, -1, 2, hnd });
    v.push_back({ edge::causal, 4, 4, 32, 1, { { 32, 100 }, { 5, 5 } }, true, -1, -1, nhd });
    v.push_back({ edge::causal, 8, 2, 80, 16, { { 40, 41 }, { 1, 213 } }, true, 300, -1, hnd });
    v.push_back({ edge::block, 9, 3, 64, 16, { { 40, 500 }, { 1, 33 }, { 1, 17 } }, true, -1, -1, hnd });
    v.push_back({ edge::block, 16, 1, 32, 128, { { 1, 7812 }, { 20, 300 } }, true, -1, -1, nhd });
    v.push_back({ edge::block, 4, 4, 32, 13, { { 32, 300 }, { 1, 27 } }, true, -1, -1, kvs });
    v.push_back({ edge::block, 8, 2, 32, 1, { { 8, 50 } }, true, -1, -1, hnd });
    v.push_back({ edge::sink, 4, 4, 32, 16, { { 8, 50 }, { 1, 1 } }, true, -1, -1, hnd });
    v.push_back({ edge::alibi, 8, 2, 64, 32, { { 16, 200 } }, true, -1, -1, nhd });
    return v;
}

INSTANTIATE_TEST_SUITE_P(edges, paged_attention_index, ::testing::ValuesIn(index_cases()),
                         [](const ::testing::TestParamInfo<index_case> &i) { return i.param.name(); });

// ---------------------------------------------------------------------------------------------
// All 256 FP8 codes.
//
// K: sequence c (one per code, seq_len 3, q_len 2, block_size 3 so each owns one block) holds code c
// in dim 0 of token 0 and zeros elsewhere, with a per-token scale 2^-floor(log2|value|) that brings
// the value into [1, 2): query 0 (p = 1) then reads softmax over (x, 0) with x = decode(c) * scale,
// which moves by >= 1e-2 per code step, so one wrong code shows.
// NaN and inf K codes (no defined score) are placed at token 2 instead, masked by causality for
// query 0: the masked score must not leak (query 0 gives softmax(0, 0)); query 1, which sees them,
// is not checked.
// V: 16 more sequences (seq_len 1) hold all 256 codes in the V row of their only token, so the
// output is exactly decode(code); NaN codes must give NaN in that element only (checked on purpose:
// an attended NaN value propagates), inf codes of e5m2 give the same inf.

class fp8_codes : public ::testing::TestWithParam<format> {};

TEST_P(fp8_codes, decode_exactly_in_k_and_v) {
    const format f = GetParam();
    constexpr int64_t hq = 2, hkv = 1, d = 16, bs = 3;
    std::vector<std::pair<int, int>> seqs(256, { 2, 3 });
    for (int i = 0; i < 16; ++i)
        seqs.push_back({ 1, 1 });
    rng r(f == format::e4m3 ? 43 : 52);
    const batch b = make_batch(seqs, bs, r, true);
    kv_cache cache = make_cache(f, b.num_blocks, hkv, bs, d, cache_layout::hnd);
    auto *kc = static_cast<uint8_t *>(cache.k()), *vc = static_cast<uint8_t *>(cache.v());
    const uint8_t one = reference::encode_fp8_slow(f, 1.0);
    ASSERT_EQ(reference::decode_fp8(f, one), 1.0);
    scales_spec ks = make_scales(oracle::scales::per_token, 1.f, 1.f, b.num_blocks, hkv, bs);
    const auto finite = [&](int code) {
        return std::isfinite(reference::decode_fp8(f, static_cast<uint8_t>(code)));
    };
    for (int64_t s = 0; s < b.num_seqs; ++s)
        for (int64_t j = 0; j < b.seq_lens[static_cast<size_t>(s)]; ++j) {
            const int64_t blk = b.block_of(s, j), o = cache.offset(blk, 0, j);
            std::fill(kc + o, kc + o + d, uint8_t(0));
            std::fill(vc + o, vc + o + d, uint8_t(0));
            float kscale = 1.f;
            if (s < 256) {
                const int code = static_cast<int>(s);
                if ((j == 0 && finite(code)) || (j == 2 && !finite(code))) kc[o] = static_cast<uint8_t>(code);
                if (j == 0 && finite(code)) {
                    const double x = reference::decode_fp8(f, static_cast<uint8_t>(code));
                    if (x != 0)
                        kscale = static_cast<float>(
                                std::ldexp(1.0, -static_cast<int>(std::floor(std::log2(std::fabs(x))))));
                }
                vc[o + j] = one;
            } else {
                for (int64_t e = 0; e < d; ++e)
                    vc[o + e] = static_cast<uint8_t>((s - 256) * d + e);
            }
            ks.values[static_cast<size_t>(blk * bs + j)] = kscale;
        }
    buffer q(static_cast<size_t>(b.tokens * hq * d * 4));
    float *qf = q.as<float>();
    std::fill(qf, qf + b.tokens * hq * d, 0.f);
    for (int64_t t = 0; t < b.tokens; ++t)
        for (int64_t h = 0; h < hq; ++h)
            qf[(t * hq + h) * d] = 1.f;

    pa::paged_attention::options o;
    o.softmax_scale = 1.f;
    pa::primitive_attr attr;
    attr.set_scales_mask(pa::ARG_K_CACHE, pa::scales_per_token);
    const pa::tensor_desc qmd({ pa::runtime_dim, hq, d }, pa::data_type::f32);
    pa::paged_attention::primitive_desc pd(
            engine(), pa::paged_attention::desc(qmd, cache.md(), cache.md(), qmd, o), attr);

    oracle::problem pr;
    pr.num_heads = hq;
    pr.num_kv_heads = hkv;
    pr.head_size = d;
    pr.block_size = bs;
    pr.num_blocks = b.num_blocks;
    pr.num_seqs = b.num_seqs;
    pr.seq_lens = b.seq_lens.data();
    pr.query_start_loc = b.query_start_loc.data();
    pr.block_table = b.block_table.data();
    pr.block_table_stride = b.row_stride;
    pr.softmax_scale = 1.0;
    oracle::query qv { q.data(), format::f32, hq * d, d };
    const oracle::result ref =
            oracle::paged_attention(pr, qv, cache.view(true, oracle::scales::per_token, ks.values.data()),
                                    cache.view(false, oracle::scales::none, nullptr));
    // Rows that see a NaN or inf key: the oracle gives NaN there and the contract defines nothing.
    const auto row_defined = [&](int64_t t, int64_t) {
        const int64_t s = t < 512 ? t / 2 : 256 + (t - 512);
        return !(s < 256 && t % 2 == 1 && !finite(static_cast<int>(s)));
    };

    dnnl::stream st = make_stream();
    do {
        SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
        buffer dst(q.size());
        const pa::tensor_desc run_md({ b.tokens, hq, d }, pa::data_type::f32);
        pa::exec_args args {
            { pa::ARG_QUERY, pa::tensor(run_md, q.data()) },
            { pa::ARG_K_CACHE, pa::tensor(cache.md(), cache.k()) },
            { pa::ARG_V_CACHE, pa::tensor(cache.md(), cache.v()) },
            { pa::ARG_BLOCK_TABLE,
              pa::tensor(pa::tensor_desc({ b.num_seqs, b.width }, pa::data_type::s32, { b.row_stride, 1 }),
                         b.block_table.data()) },
            { pa::ARG_SEQ_LENS,
              pa::tensor(pa::tensor_desc({ b.num_seqs }, pa::data_type::s32), b.seq_lens.data()) },
            { pa::ARG_QUERY_START_LOC,
              pa::tensor(pa::tensor_desc({ b.num_seqs + 1 }, pa::data_type::s32), b.query_start_loc.data()) },
            { pa::ARG_DST, pa::tensor(run_md, dst.data()) },
            { pa::ARG_K_SCALES, pa::tensor(ks.md(b.num_blocks, hkv, bs), ks.values.data()) },
        };
        pa::paged_attention(pd).execute(st, args);
        st.wait();

        const comparison cmp = compare(
                dst.data(), format::f32, ref, [&](size_t i) { return attention_tol(ref, i, format::f32); },
                row_defined);
        EXPECT_EQ(cmp.failures, 0) << cmp;

        // By hand from the code's definition. 2e-6: a few f32 ulps of exp and the division near 1;
        // neighbouring codes move these values by >= 1e-2.
        const float *out = dst.as<float>();
        int64_t wrong = 0;
        for (int code = 0; code < 256; ++code)
            for (int64_t h = 0; h < hq; ++h) {
                const double v = reference::decode_fp8(f, static_cast<uint8_t>(code));
                const double x = finite(code)
                                         ? (v == 0 ? 0.0
                                                   : v * std::ldexp(1.0, -static_cast<int>(std::floor(
                                                                                 std::log2(std::fabs(v))))))
                                         : 0.0;
                const float *row0 = out + (2 * code * hq + h) * d;
                const double p0 = 1.0 / (1.0 + std::exp(-x));
                bool ok = std::fabs(row0[0] - p0) <= 2e-6 && std::fabs(row0[1] - (1 - p0)) <= 2e-6 &&
                          row0[2] == 0.f;
                if (finite(code)) {
                    const float *row1 = out + ((2 * code + 1) * hq + h) * d;
                    const double den = std::exp(x) + 2.0;
                    ok = ok && std::fabs(row1[0] - std::exp(x) / den) <= 2e-6 &&
                         std::fabs(row1[1] - 1 / den) <= 2e-6 && std::fabs(row1[2] - 1 / den) <= 2e-6;
                }
                if (!ok && wrong++ < 6)
                    ADD_FAILURE() << "K code 0x" << std::hex << code << std::dec << " (" << v << ") head "
                                  << h << ": got " << row0[0] << ", " << row0[1] << ", want " << p0 << ", "
                                  << 1 - p0;
            }
        for (int code = 0; code < 256; ++code)
            for (int64_t h = 0; h < hq; ++h) {
                const int64_t t = 512 + code / d;
                const double want = reference::decode_fp8(f, static_cast<uint8_t>(code));
                const double got = out[(t * hq + h) * d + code % d];
                // 2^-22 relative: p = 1 up to the kernel's exp and division rounding.
                const bool ok = std::isnan(want)   ? std::isnan(got)
                                : std::isinf(want) ? got == want
                                                   : std::fabs(got - want) <= 0x1p-22 * std::fabs(want);
                if (!ok && wrong++ < 12)
                    ADD_FAILURE() << "V code 0x" << std::hex << code << std::dec << " head " << h << ": got "
                                  << got << ", want " << want;
            }
        EXPECT_EQ(wrong, 0);
    } while (pd.next_impl());
}

INSTANTIATE_TEST_SUITE_P(formats, fp8_codes, ::testing::Values(format::e4m3, format::e5m2),
                         [](const ::testing::TestParamInfo<format> &i) {
                             return std::string(test_util::name_of(i.param));
                         });

// ---------------------------------------------------------------------------------------------
// Negative control: the tolerance is tight enough that a key moved by one position fails.

TEST(paged_attention_negative_control, moved_key_fails_the_oracle_comparison) {
    attn_case c = make_case("negative_control", 4, 4, 64, 16, { { 4, 40 }, { 1, 17 } }, format::f32,
                            format::e4m3, cache_layout::hnd);
    c.scales(oracle::scales::per_token, oracle::scales::per_token);
    const attn_setup s = build_setup(c);
    pa::paged_attention::primitive_desc pd(engine(), s.desc(), s.attr());
    dnnl::stream st = make_stream();

    // The same setup with the keys of positions 20 and 21 of sequence 0 swapped (codes and
    // per-token scales), kv head 0: every query of sequence 0 (p >= 36) sees both.
    attn_setup moved = s;
    const int64_t b20 = s.b.block_of(0, 20), b21 = s.b.block_of(0, 21);
    auto *k = static_cast<uint8_t *>(moved.cache.k());
    std::swap_ranges(k + moved.cache.offset(b20, 0, 20 % c.bs),
                     k + moved.cache.offset(b20, 0, 20 % c.bs) + c.d,
                     k + moved.cache.offset(b21, 0, 21 % c.bs));
    std::swap(moved.ks.values[static_cast<size_t>(b20 * c.bs + 20 % c.bs)],
              moved.ks.values[static_cast<size_t>(b21 * c.bs + 21 % c.bs)]);
    const oracle::result right = s.oracle_on_cache(), wrong = moved.oracle_on_cache();
    do {
        SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
        buffer dst = s.make_dst();
        pa::paged_attention(pd).execute(st, s.args(s.q.data(), dst.data()));
        st.wait();
        const comparison ok = compare_attention(dst.data(), c.dst_fmt, right);
        EXPECT_EQ(ok.failures, 0) << ok;
        const comparison bad = compare_attention(dst.data(), c.dst_fmt, wrong);
        EXPECT_GT(bad.failures, 0) << "a moved key passed the comparison: the tolerance is too loose";
        EXPECT_GT(bad.max_ratio, 10.0) << bad;
        RecordProperty("moved_key_max_err_over_tol", std::to_string(bad.max_ratio));
    } while (pd.next_impl());
}

} // namespace
