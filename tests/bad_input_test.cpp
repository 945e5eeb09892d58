// Bad inputs: each must throw pagedattn::error with the right status and a message that names the
// argument. Execute-time errors must leave every output (dst, caches, per-token scales) untouched,
// even when the defect is only in the last sequence or the last token: validation precedes writing.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "pagedattn/pagedattn.hpp"

namespace {

using namespace pagedattn;

constexpr uint8_t sentinel = 0xA5;

bool is_ident_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// `name` occurs in `text` as a whole word ("query" does not match inside "query_start_loc").
bool names_word(const std::string &text, const std::string &name) {
    for (size_t pos = text.find(name); pos != std::string::npos; pos = text.find(name, pos + 1)) {
        const bool left = pos == 0 || !is_ident_char(text[pos - 1]);
        const bool right = pos + name.size() == text.size() || !is_ident_char(text[pos + name.size()]);
        if (left && right) return true;
    }
    return false;
}

// Runs f, expects a pagedattn::error of status st whose message names one of `names`.
template <typename F> void expect_error(F &&f, status st, std::initializer_list<const char *> names) {
    try {
        f();
        ADD_FAILURE() << "no pagedattn::error was thrown";
    } catch (const pagedattn::error &e) {
        EXPECT_EQ(static_cast<int>(e.get_status()), static_cast<int>(st)) << e.what();
        bool named = false;
        std::string wanted;
        for (const char *n : names) {
            named = named || names_word(e.what(), n);
            wanted += std::string(" ") + n;
        }
        EXPECT_TRUE(named) << "message \"" << e.what() << "\" names none of:" << wanted;
    }
}

void expect_invalid(std::initializer_list<const char *> names, const std::function<void()> &f) {
    expect_error(f, status::invalid_arguments, names);
}

// Snapshots of output buffers, compared whole after a failed execute.
class untouched_check {
public:
    void add(const char *name, const void *p, size_t bytes) {
        const auto *b = static_cast<const uint8_t *>(p);
        entries_.push_back({ name, p, std::vector<uint8_t>(b, b + bytes) });
    }
    void verify() const {
        for (const auto &e : entries_) {
            const auto *b = static_cast<const uint8_t *>(e.p);
            size_t changed = 0;
            for (size_t i = 0; i < e.before.size(); ++i)
                changed += b[i] != e.before[i];
            EXPECT_EQ(changed, 0u) << e.name << ": bytes written despite the error";
        }
    }
    // Whether any byte differs: used to show that a valid execute does change the outputs.
    bool any_changed(const char *name) const {
        for (const auto &e : entries_)
            if (std::string(e.name) == name && std::memcmp(e.p, e.before.data(), e.before.size()) != 0)
                return true;
        return false;
    }

private:
    struct entry {
        const char *name;
        const void *p;
        std::vector<uint8_t> before;
    };
    std::vector<entry> entries_;
};

// ---------------------------------------------------------------------------------------------
// paged_attention
// ---------------------------------------------------------------------------------------------

// A valid three-sequence batch; tests break one thing, usually in the last sequence.
struct pa_fixture : testing::Test {
    static constexpr dim hq = 4, hkv = 2, d = 16, bs = 4, nb = 6, s = 3, t = 6, w = 3, table_stride = 4;

    dnnl::engine eng { dnnl::engine::kind::cpu, 0 };
    dnnl::stream strm { eng };
    data_type cache_dt = data_type::f8_e4m3;
    int k_mask = scales_per_tensor, v_mask = scales_per_kv_head;
    paged_attention::options opts;
    paged_attention::primitive_desc pd;
    paged_attention prim;

    std::vector<float> query, dst;
    std::vector<uint8_t> k_cache, v_cache;
    // Row stride 4 > width 3; entries past each sequence's needed blocks are -1 (never read).
    std::vector<int32_t> block_table { 1, 0, -1, 99, 3, 2, -1, 99, 5, 4, 0, 99 };
    std::vector<int32_t> seq_lens { 5, 7, 9 };
    std::vector<int32_t> query_start_loc { 0, 2, 3, 6 };
    std::vector<float> k_scales { 0.5f }, v_scales { 0.25f, 2.0f };
    std::vector<float> alibi_slopes { 0.1f, 0.2f, 0.3f, 0.4f }, sinks { 0.f, 1.f, -1.f, 2.f };

    pa_fixture() {
        query.resize(t * hq * d);
        for (size_t i = 0; i < query.size(); ++i)
            query[i] = 0.01f * static_cast<float>(static_cast<int>(i % 23) - 11);
        dst.resize(t * hq * d);
        std::memset(dst.data(), sentinel, dst.size() * sizeof(float));
    }

    tensor_desc cache_md() const { return tensor_desc({ nb, hkv, bs, d }, cache_dt, layout::plain); }

    void build() {
        const size_t bytes = cache_md().get_size();
        k_cache.resize(bytes);
        v_cache.resize(bytes);
        for (size_t i = 0; i < bytes; ++i) { // finite values of every cache type, no NaN codes
            k_cache[i] = static_cast<uint8_t>((i * 37) & 0x37);
            v_cache[i] = static_cast<uint8_t>((i * 53) & 0x37);
        }
        paged_attention::desc desc(tensor_desc({ runtime_dim, hq, d }, data_type::f32), cache_md(),
                                   cache_md(), tensor_desc({ runtime_dim, hq, d }, data_type::f32), opts);
        primitive_attr attr;
        if (k_mask >= 0) attr.set_scales_mask(ARG_K_CACHE, k_mask);
        if (v_mask >= 0) attr.set_scales_mask(ARG_V_CACHE, v_mask);
        pd = paged_attention::primitive_desc(eng, desc, attr);
        prim = paged_attention(pd);
    }

    void SetUp() override { build(); }

    exec_args args() {
        exec_args a {
            { ARG_QUERY, tensor(tensor_desc({ t, hq, d }, data_type::f32), query.data()) },
            { ARG_DST, tensor(tensor_desc({ t, hq, d }, data_type::f32), dst.data()) },
            { ARG_K_CACHE, tensor(cache_md(), k_cache.data()) },
            { ARG_V_CACHE, tensor(cache_md(), v_cache.data()) },
            { ARG_BLOCK_TABLE,
              tensor(tensor_desc({ s, w }, data_type::s32, dims { table_stride, 1 }), block_table.data()) },
            { ARG_SEQ_LENS, tensor(tensor_desc({ s }, data_type::s32), seq_lens.data()) },
            { ARG_QUERY_START_LOC, tensor(tensor_desc({ s + 1 }, data_type::s32), query_start_loc.data()) }
        };
        if (k_mask >= 0) a[ARG_K_SCALES] = tensor(tensor_desc({ 1 }, data_type::f32), k_scales.data());
        if (v_mask >= 0) a[ARG_V_SCALES] = tensor(tensor_desc({ hkv }, data_type::f32), v_scales.data());
        if (opts.alibi_slopes)
            a[ARG_ALIBI_SLOPES] = tensor(tensor_desc({ hq }, data_type::f32), alibi_slopes.data());
        if (opts.sinks) a[ARG_SINKS] = tensor(tensor_desc({ hq }, data_type::f32), sinks.data());
        return a;
    }

    untouched_check snapshot() const {
        untouched_check c;
        c.add("dst", dst.data(), dst.size() * sizeof(float));
        c.add("k_cache", k_cache.data(), k_cache.size());
        c.add("v_cache", v_cache.data(), v_cache.size());
        c.add("k_scales", k_scales.data(), k_scales.size() * sizeof(float));
        c.add("v_scales", v_scales.data(), v_scales.size() * sizeof(float));
        return c;
    }

    // Executes with `a`, expects invalid_arguments naming one of `names`, and nothing written.
    void expect_exec_error(const exec_args &a, std::initializer_list<const char *> names) {
        const untouched_check c = snapshot();
        expect_error([&] { prim.execute(strm, a); }, status::invalid_arguments, names);
        strm.wait();
        c.verify();
    }
};

TEST_F(pa_fixture, valid_batch_runs_and_writes_dst) {
    const untouched_check c = snapshot();
    prim.execute(strm, args());
    strm.wait();
    EXPECT_TRUE(c.any_changed("dst"));
    for (float x : dst)
        ASSERT_TRUE(std::isfinite(x));
}

// Edge inputs that are valid must not be rejected.

TEST_F(pa_fixture, sequence_without_query_tokens_is_valid) {
    query_start_loc = { 0, 2, 2, 6 }; // the middle sequence only has context this step
    prim.execute(strm, args());
    strm.wait();
    for (float x : dst)
        ASSERT_TRUE(std::isfinite(x));
}

TEST_F(pa_fixture, empty_step_is_valid_and_writes_nothing) {
    exec_args a = args();
    a[ARG_QUERY] = tensor(tensor_desc({ 0, hq, d }, data_type::f32), query.data());
    a[ARG_DST] = tensor(tensor_desc({ 0, hq, d }, data_type::f32), dst.data());
    a[ARG_BLOCK_TABLE] = tensor(tensor_desc({ 0, w }, data_type::s32), block_table.data());
    a[ARG_SEQ_LENS] = tensor(tensor_desc({ 0 }, data_type::s32), seq_lens.data());
    a[ARG_QUERY_START_LOC] = tensor(tensor_desc({ 1 }, data_type::s32), query_start_loc.data());
    const untouched_check c = snapshot();
    prim.execute(strm, a);
    strm.wait();
    c.verify();
}

// Descriptor and primitive_desc errors.

struct pa_desc_case {
    tensor_desc query, k_cache, v_cache, dst;
};

pa_desc_case good_pa_desc() {
    return { tensor_desc({ runtime_dim, 4, 16 }, data_type::f32),
             tensor_desc({ 6, 2, 4, 16 }, data_type::f8_e4m3),
             tensor_desc({ 6, 2, 4, 16 }, data_type::f8_e4m3),
             tensor_desc({ runtime_dim, 4, 16 }, data_type::f32) };
}

void create_pa(const pa_desc_case &c, const paged_attention::options &o = {},
               const primitive_attr &attr = {}) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    paged_attention::desc d(c.query, c.k_cache, c.v_cache, c.dst, o);
    paged_attention::primitive_desc pd(eng, d, attr);
}

TEST(paged_attention_desc, good_desc_is_accepted) {
    EXPECT_NO_THROW(create_pa(good_pa_desc()));
}

TEST(paged_attention_desc, query_wrong_rank) {
    pa_desc_case c = good_pa_desc();
    c.query = tensor_desc({ runtime_dim, 64 }, data_type::f32);
    expect_invalid({ "query" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, dst_wrong_dims) {
    pa_desc_case c = good_pa_desc();
    c.dst = tensor_desc({ runtime_dim, 2, 16 }, data_type::f32);
    expect_invalid({ "dst" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, fixed_token_counts_differ) {
    pa_desc_case c = good_pa_desc();
    c.query = tensor_desc({ 6, 4, 16 }, data_type::f32);
    c.dst = tensor_desc({ 5, 4, 16 }, data_type::f32);
    expect_invalid({ "dst", "query" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, k_cache_wrong_rank) {
    pa_desc_case c = good_pa_desc();
    c.k_cache = tensor_desc({ 6, 2, 64 }, data_type::f8_e4m3);
    expect_invalid({ "k_cache" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, v_cache_dims_differ_from_k_cache) {
    pa_desc_case c = good_pa_desc();
    c.v_cache = tensor_desc({ 7, 2, 4, 16 }, data_type::f8_e4m3);
    expect_invalid({ "v_cache" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, cache_head_size_differs_from_query) {
    pa_desc_case c = good_pa_desc();
    c.k_cache = c.v_cache = tensor_desc({ 6, 2, 4, 32 }, data_type::f8_e4m3);
    expect_invalid({ "k_cache", "query" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, q_heads_not_multiple_of_kv_heads) {
    pa_desc_case c = good_pa_desc();
    c.query = c.dst = tensor_desc({ runtime_dim, 3, 16 }, data_type::f32);
    expect_invalid({ "query", "k_cache" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, head_size_above_512) {
    pa_desc_case c = good_pa_desc();
    c.query = c.dst = tensor_desc({ runtime_dim, 4, 520 }, data_type::f32);
    c.k_cache = c.v_cache = tensor_desc({ 6, 2, 4, 520 }, data_type::f8_e4m3);
    expect_invalid({ "query", "k_cache" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, head_size_512_is_accepted) {
    pa_desc_case c = good_pa_desc();
    c.query = c.dst = tensor_desc({ runtime_dim, 4, 512 }, data_type::f32);
    c.k_cache = c.v_cache = tensor_desc({ 6, 2, 4, 512 }, data_type::f8_e4m3);
    EXPECT_NO_THROW(create_pa(c));
}

TEST(paged_attention_desc, query_s32_type) {
    pa_desc_case c = good_pa_desc();
    c.query = tensor_desc({ runtime_dim, 4, 16 }, data_type::s32);
    expect_invalid({ "query" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, query_f8_type) {
    pa_desc_case c = good_pa_desc();
    c.query = tensor_desc({ runtime_dim, 4, 16 }, data_type::f8_e4m3);
    expect_invalid({ "query" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, dst_u8_type) {
    pa_desc_case c = good_pa_desc();
    c.dst = tensor_desc({ runtime_dim, 4, 16 }, data_type::u8);
    expect_invalid({ "dst" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, cache_s8_type) {
    pa_desc_case c = good_pa_desc();
    c.k_cache = c.v_cache = tensor_desc({ 6, 2, 4, 16 }, data_type::s8);
    expect_invalid({ "k_cache" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, cache_zero_block_size) {
    pa_desc_case c = good_pa_desc();
    c.k_cache = c.v_cache = tensor_desc({ 6, 2, 0, 16 }, data_type::f8_e4m3);
    expect_invalid({ "k_cache" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, cache_non_unit_head_dim_stride) {
    pa_desc_case c = good_pa_desc();
    c.k_cache = tensor_desc({ 6, 2, 4, 16 }, data_type::f8_e4m3, dims { 256, 128, 32, 2 });
    expect_invalid({ "k_cache" }, [&] { create_pa(c); });
}

TEST(paged_attention_desc, window_below_minus_one) {
    paged_attention::options o;
    o.window_left = -2;
    try {
        create_pa(good_pa_desc(), o);
        ADD_FAILURE() << "no error for window_left = -2";
    } catch (const pagedattn::error &e) {
        EXPECT_EQ(e.get_status(), status::invalid_arguments);
        EXPECT_NE(std::string(e.what()).find("window"), std::string::npos) << e.what();
    }
}

TEST(paged_attention_desc, scales_mask_on_bf16_cache) {
    pa_desc_case c = good_pa_desc();
    c.k_cache = c.v_cache = tensor_desc({ 6, 2, 4, 16 }, data_type::bf16);
    primitive_attr attr;
    attr.set_scales_mask(ARG_K_CACHE, scales_per_tensor);
    // The desc itself is fine; the error comes at primitive_desc creation.
    paged_attention::desc d(c.query, c.k_cache, c.v_cache, c.dst);
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    expect_invalid({ "k_cache", "k_scales" }, [&] { paged_attention::primitive_desc pd(eng, d, attr); });
}

TEST(paged_attention_desc, scales_mask_on_f32_v_cache) {
    pa_desc_case c = good_pa_desc();
    c.k_cache = c.v_cache = tensor_desc({ 6, 2, 4, 16 }, data_type::f32);
    primitive_attr attr;
    attr.set_scales_mask(ARG_V_CACHE, scales_per_token);
    expect_invalid({ "v_cache", "v_scales" }, [&] { create_pa(c, {}, attr); });
}

TEST(paged_attention_desc, invalid_scales_mask_value) {
    // Mask 1 (varies along blocks only) is none of the three supported masks.
    expect_invalid({ "k_cache", "k_scales" }, [&] {
        primitive_attr attr;
        attr.set_scales_mask(ARG_K_CACHE, 1);
        create_pa(good_pa_desc(), {}, attr);
    });
}

TEST(paged_attention_desc, scales_mask_on_non_cache_argument) {
    expect_invalid({ "query" }, [&] {
        primitive_attr attr;
        attr.set_scales_mask(ARG_QUERY, scales_per_tensor);
        create_pa(good_pa_desc(), {}, attr);
    });
}

// Execute errors.

TEST_F(pa_fixture, seq_len_below_q_len_in_last_sequence) {
    seq_lens[2] = 2; // q_len of the last sequence is 3
    expect_exec_error(args(), { "seq_lens" });
}

TEST_F(pa_fixture, negative_seq_len) {
    seq_lens[2] = -1;
    expect_exec_error(args(), { "seq_lens" });
}

TEST_F(pa_fixture, huge_seq_len_in_last_sequence) {
    seq_lens[2] = std::numeric_limits<int32_t>::max(); // needs far more blocks than the table has
    expect_exec_error(args(), { "block_table", "seq_lens" });
}

TEST_F(pa_fixture, token_count_differs_from_fixed_desc) {
    // A desc with T fixed at 6 rejects a 5-token query at execute.
    paged_attention::desc fixed(tensor_desc({ t, hq, d }, data_type::f32), cache_md(), cache_md(),
                                tensor_desc({ t, hq, d }, data_type::f32), opts);
    primitive_attr attr;
    attr.set_scales_mask(ARG_K_CACHE, k_mask);
    attr.set_scales_mask(ARG_V_CACHE, v_mask);
    prim = paged_attention(paged_attention::primitive_desc(eng, fixed, attr));
    EXPECT_NO_THROW(prim.execute(strm, args()));
    query_start_loc = { 0, 2, 3, 5 };
    exec_args a = args();
    a[ARG_QUERY] = tensor(tensor_desc({ t - 1, hq, d }, data_type::f32), query.data());
    a[ARG_DST] = tensor(tensor_desc({ t - 1, hq, d }, data_type::f32), dst.data());
    expect_exec_error(a, { "query" });
}

TEST_F(pa_fixture, query_start_loc_not_monotone) {
    query_start_loc = { 0, 3, 2, 6 };
    expect_exec_error(args(), { "query_start_loc" });
}

TEST_F(pa_fixture, query_start_loc_not_ending_at_t) {
    query_start_loc = { 0, 2, 3, 5 };
    expect_exec_error(args(), { "query_start_loc" });
}

TEST_F(pa_fixture, query_start_loc_beyond_t) {
    query_start_loc = { 0, 2, 3, 7 };
    expect_exec_error(args(), { "query_start_loc" });
}

TEST_F(pa_fixture, query_start_loc_not_starting_at_zero) {
    query_start_loc = { 1, 2, 3, 6 };
    expect_exec_error(args(), { "query_start_loc" });
}

TEST_F(pa_fixture, block_table_negative_entry_in_last_row) {
    block_table[2 * table_stride + 2] = -1;
    expect_exec_error(args(), { "block_table" });
}

TEST_F(pa_fixture, block_table_entry_equal_to_num_blocks_in_last_row) {
    block_table[2 * table_stride + 2] = static_cast<int32_t>(nb);
    expect_exec_error(args(), { "block_table" });
}

TEST_F(pa_fixture, block_table_too_narrow_for_last_sequence) {
    // Width 2 covers 8 tokens; the last sequence has 9.
    exec_args a = args();
    a[ARG_BLOCK_TABLE] =
            tensor(tensor_desc({ s, 2 }, data_type::s32, dims { table_stride, 1 }), block_table.data());
    expect_exec_error(a, { "block_table" });
}

TEST_F(pa_fixture, block_table_wrong_rank) {
    exec_args a = args();
    a[ARG_BLOCK_TABLE] = tensor(tensor_desc({ s * table_stride }, data_type::s32), block_table.data());
    expect_exec_error(a, { "block_table" });
}

TEST_F(pa_fixture, block_table_too_few_rows) {
    exec_args a = args();
    a[ARG_BLOCK_TABLE] =
            tensor(tensor_desc({ s - 1, w }, data_type::s32, dims { table_stride, 1 }), block_table.data());
    expect_exec_error(a, { "block_table" });
}

TEST_F(pa_fixture, block_table_wrong_type) {
    exec_args a = args();
    a[ARG_BLOCK_TABLE] =
            tensor(tensor_desc({ s, w }, data_type::f32, dims { table_stride, 1 }), block_table.data());
    expect_exec_error(a, { "block_table" });
}

TEST_F(pa_fixture, seq_lens_wrong_length) {
    exec_args a = args();
    a[ARG_SEQ_LENS] = tensor(tensor_desc({ s - 1 }, data_type::s32), seq_lens.data());
    expect_exec_error(a, { "seq_lens", "query_start_loc" });
}

TEST_F(pa_fixture, seq_lens_wrong_type) {
    exec_args a = args();
    a[ARG_SEQ_LENS] = tensor(tensor_desc({ s }, data_type::f32), seq_lens.data());
    expect_exec_error(a, { "seq_lens" });
}

TEST_F(pa_fixture, query_start_loc_wrong_rank) {
    exec_args a = args();
    a[ARG_QUERY_START_LOC] = tensor(tensor_desc({ 1, s + 1 }, data_type::s32), query_start_loc.data());
    expect_exec_error(a, { "query_start_loc" });
}

TEST_F(pa_fixture, query_wrong_heads) {
    exec_args a = args();
    a[ARG_QUERY] = tensor(tensor_desc({ t, 2, 2 * d }, data_type::f32), query.data());
    expect_exec_error(a, { "query" });
}

TEST_F(pa_fixture, query_wrong_rank) {
    exec_args a = args();
    a[ARG_QUERY] = tensor(tensor_desc({ t, hq * d }, data_type::f32), query.data());
    expect_exec_error(a, { "query" });
}

TEST_F(pa_fixture, query_type_differs_from_desc) {
    exec_args a = args();
    a[ARG_QUERY] = tensor(tensor_desc({ t, hq, d }, data_type::bf16), query.data());
    expect_exec_error(a, { "query" });
}

TEST_F(pa_fixture, query_non_unit_inner_stride) {
    query_start_loc = { 0, 1, 2, 3 }; // three tokens, one per sequence
    exec_args a = args();
    a[ARG_QUERY] = tensor(tensor_desc({ t / 2, hq, d }, data_type::f32, dims { 2 * hq * d, 2 * d, 2 }),
                          query.data());
    a[ARG_DST] = tensor(tensor_desc({ t / 2, hq, d }, data_type::f32), dst.data());
    expect_exec_error(a, { "query" });
}

TEST_F(pa_fixture, dst_token_count_differs_from_query) {
    exec_args a = args();
    a[ARG_DST] = tensor(tensor_desc({ t - 1, hq, d }, data_type::f32), dst.data());
    expect_exec_error(a, { "dst" });
}

TEST_F(pa_fixture, dst_type_differs_from_desc) {
    exec_args a = args();
    a[ARG_DST] = tensor(tensor_desc({ t, hq, d }, data_type::bf16), dst.data());
    expect_exec_error(a, { "dst" });
}

TEST_F(pa_fixture, k_cache_desc_differs_from_pd) {
    exec_args a = args();
    // Same bytes, token-major strides instead of the pd's head-major ones.
    a[ARG_K_CACHE] = tensor(tensor_desc({ nb, hkv, bs, d }, cache_dt, dims { bs * hkv * d, d, hkv * d, 1 }),
                            k_cache.data());
    expect_exec_error(a, { "k_cache" });
}

TEST_F(pa_fixture, v_cache_type_differs_from_pd) {
    exec_args a = args();
    a[ARG_V_CACHE] =
            tensor(tensor_desc({ nb, hkv, bs, d }, data_type::f8_e5m2, layout::plain), v_cache.data());
    expect_exec_error(a, { "v_cache" });
}

TEST_F(pa_fixture, unknown_argument_id) {
    exec_args a = args();
    float dummy = 0.f;
    a[999] = tensor(tensor_desc({ 1 }, data_type::f32), &dummy);
    const untouched_check c = snapshot();
    try {
        prim.execute(strm, a);
        ADD_FAILURE() << "no error for argument id 999";
    } catch (const pagedattn::error &e) {
        EXPECT_EQ(e.get_status(), status::invalid_arguments);
        EXPECT_NE(std::string(e.what()).find("999"), std::string::npos) << e.what();
    }
    c.verify();
}

TEST_F(pa_fixture, alibi_slopes_not_expected) {
    exec_args a = args();
    a[ARG_ALIBI_SLOPES] = tensor(tensor_desc({ hq }, data_type::f32), alibi_slopes.data());
    expect_exec_error(a, { "alibi_slopes" });
}

TEST_F(pa_fixture, sinks_not_expected) {
    exec_args a = args();
    a[ARG_SINKS] = tensor(tensor_desc({ hq }, data_type::f32), sinks.data());
    expect_exec_error(a, { "sinks" });
}

TEST_F(pa_fixture, slot_mapping_not_expected) {
    exec_args a = args();
    int64_t slot = 0;
    a[ARG_SLOT_MAPPING] = tensor(tensor_desc({ 1 }, data_type::s64), &slot);
    expect_exec_error(a, { "slot_mapping" });
}

TEST_F(pa_fixture, key_not_expected) {
    exec_args a = args();
    a[ARG_KEY] = tensor(tensor_desc({ t, hkv, d }, data_type::f32), query.data());
    expect_exec_error(a, { "key" });
}

TEST_F(pa_fixture, scratchpad_not_expected_in_library_mode) {
    exec_args a = args();
    std::vector<uint8_t> scratch(1 << 16);
    a[ARG_SCRATCHPAD] =
            tensor(tensor_desc({ static_cast<dim>(scratch.size()) }, data_type::u8), scratch.data());
    expect_exec_error(a, { "scratchpad" });
}

TEST_F(pa_fixture, k_scales_not_expected_without_mask) {
    k_mask = -1;
    build();
    exec_args a = args();
    a[ARG_K_SCALES] = tensor(tensor_desc({ 1 }, data_type::f32), k_scales.data());
    expect_exec_error(a, { "k_scales" });
}

TEST_F(pa_fixture, alibi_slopes_wrong_dims) {
    opts.alibi_slopes = true;
    build();
    exec_args a = args();
    a[ARG_ALIBI_SLOPES] = tensor(tensor_desc({ hq - 1 }, data_type::f32), alibi_slopes.data());
    expect_exec_error(a, { "alibi_slopes" });
}

TEST_F(pa_fixture, sinks_wrong_type) {
    opts.sinks = true;
    build();
    exec_args a = args();
    a[ARG_SINKS] = tensor(tensor_desc({ hq }, data_type::s32), sinks.data());
    expect_exec_error(a, { "sinks" });
}

TEST_F(pa_fixture, k_scales_wrong_dims) {
    exec_args a = args();
    a[ARG_K_SCALES] = tensor(tensor_desc({ 2 }, data_type::f32), v_scales.data());
    expect_exec_error(a, { "k_scales" });
}

TEST_F(pa_fixture, v_scales_wrong_dims) {
    exec_args a = args();
    a[ARG_V_SCALES] = tensor(tensor_desc({ 1 }, data_type::f32), v_scales.data());
    expect_exec_error(a, { "v_scales" });
}

TEST_F(pa_fixture, per_token_scales_wrong_dims) {
    k_mask = scales_per_token;
    build();
    std::vector<float> per_token(nb * hkv * bs, 1.f);
    exec_args a = args();
    a[ARG_K_SCALES] = tensor(tensor_desc({ nb, hkv, bs - 1 }, data_type::f32), per_token.data());
    expect_exec_error(a, { "k_scales" });
}

// Per-tensor and per-head scales must be finite and > 0.
const float bad_scales[] = { 0.f,
                             -0.f,
                             -1.f,
                             std::numeric_limits<float>::quiet_NaN(),
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity() };

TEST_F(pa_fixture, bad_per_tensor_k_scale) {
    for (float bad : bad_scales) {
        SCOPED_TRACE(bad);
        k_scales[0] = bad;
        expect_exec_error(args(), { "k_scales" });
    }
}

TEST_F(pa_fixture, bad_per_head_v_scale_in_last_head) {
    for (float bad : bad_scales) {
        SCOPED_TRACE(bad);
        v_scales[hkv - 1] = bad;
        expect_exec_error(args(), { "v_scales" });
    }
}

// One test per required argument: left out, and given with a null pointer.
class pa_required_arg : public pa_fixture, public testing::WithParamInterface<int> {};

TEST_P(pa_required_arg, missing) {
    exec_args a = args();
    ASSERT_EQ(a.erase(GetParam()), 1u);
    expect_exec_error(a, { arg_name(GetParam()) });
}

TEST_P(pa_required_arg, null_pointer) {
    exec_args a = args();
    a[GetParam()] = tensor(a.at(GetParam()).get_desc(), static_cast<void *>(nullptr));
    expect_exec_error(a, { arg_name(GetParam()) });
}

INSTANTIATE_TEST_SUITE_P(all, pa_required_arg,
                         testing::Values(ARG_QUERY, ARG_DST, ARG_K_CACHE, ARG_V_CACHE, ARG_BLOCK_TABLE,
                                         ARG_SEQ_LENS, ARG_QUERY_START_LOC, ARG_K_SCALES, ARG_V_SCALES),
                         [](const testing::TestParamInfo<int> &info) {
                             return std::string(arg_name(info.param));
                         });

TEST(arg_names, match_the_documented_spellings) {
    // The execute error tests look for these names in messages.
    EXPECT_STREQ(arg_name(ARG_QUERY), "query");
    EXPECT_STREQ(arg_name(ARG_KEY), "key");
    EXPECT_STREQ(arg_name(ARG_VALUE), "value");
    EXPECT_STREQ(arg_name(ARG_DST), "dst");
    EXPECT_STREQ(arg_name(ARG_K_CACHE), "k_cache");
    EXPECT_STREQ(arg_name(ARG_V_CACHE), "v_cache");
    EXPECT_STREQ(arg_name(ARG_BLOCK_TABLE), "block_table");
    EXPECT_STREQ(arg_name(ARG_SEQ_LENS), "seq_lens");
    EXPECT_STREQ(arg_name(ARG_QUERY_START_LOC), "query_start_loc");
    EXPECT_STREQ(arg_name(ARG_SLOT_MAPPING), "slot_mapping");
    EXPECT_STREQ(arg_name(ARG_ALIBI_SLOPES), "alibi_slopes");
    EXPECT_STREQ(arg_name(ARG_SINKS), "sinks");
    EXPECT_STREQ(arg_name(ARG_K_SCALES), "k_scales");
    EXPECT_STREQ(arg_name(ARG_V_SCALES), "v_scales");
    EXPECT_STREQ(arg_name(ARG_SCRATCHPAD), "scratchpad");
    EXPECT_STREQ(arg_name(999), "unknown");
}

// ---------------------------------------------------------------------------------------------
// reshape_and_cache
// ---------------------------------------------------------------------------------------------

// Six tokens into a 4-block cache; K has per-token scales (written by the primitive), V per-tensor.
struct rac_fixture : testing::Test {
    static constexpr dim h = 2, d = 16, bs = 4, nb = 4, t = 6;

    dnnl::engine eng { dnnl::engine::kind::cpu, 0 };
    dnnl::stream strm { eng };
    int k_mask = scales_per_token, v_mask = scales_per_tensor;
    reshape_and_cache::primitive_desc pd;
    reshape_and_cache prim;

    std::vector<float> key, value;
    std::vector<uint8_t> k_cache, v_cache;
    std::vector<float> k_scales, v_scales;
    std::vector<int64_t> slots { 3, -1, 7, 15, 0, 9 };

    tensor_desc cache_md() const { return tensor_desc({ nb, h, bs, d }, data_type::f8_e4m3, layout::plain); }

    static std::vector<float> scales_for(int mask) {
        std::vector<float> v(mask == scales_per_token ? nb * h * bs : mask == scales_per_kv_head ? h : 1);
        if (mask == scales_per_token)
            std::memset(v.data(), sentinel, v.size() * sizeof(float));
        else
            std::fill(v.begin(), v.end(), 0.037f);
        return v;
    }

    static tensor_desc scales_md(int mask) {
        if (mask == scales_per_token) return tensor_desc({ nb, h, bs }, data_type::f32);
        return tensor_desc({ mask == scales_per_kv_head ? h : 1 }, data_type::f32);
    }

    void build() {
        primitive_attr attr;
        if (k_mask >= 0) attr.set_scales_mask(ARG_K_CACHE, k_mask);
        if (v_mask >= 0) attr.set_scales_mask(ARG_V_CACHE, v_mask);
        reshape_and_cache::desc desc(tensor_desc({ runtime_dim, h, d }, data_type::f32),
                                     tensor_desc({ runtime_dim, h, d }, data_type::f32), cache_md(),
                                     cache_md());
        pd = reshape_and_cache::primitive_desc(eng, desc, attr);
        prim = reshape_and_cache(pd);
        k_scales = scales_for(k_mask);
        v_scales = scales_for(v_mask);
    }

    void SetUp() override {
        key.resize(t * h * d);
        value.resize(t * h * d);
        for (size_t i = 0; i < key.size(); ++i) {
            key[i] = 0.25f * static_cast<float>(static_cast<int>(i % 19) - 9);
            value[i] = -0.5f * key[i] + 0.125f;
        }
        k_cache.assign(cache_md().get_size(), sentinel);
        v_cache.assign(cache_md().get_size(), sentinel);
        build();
    }

    exec_args args() {
        exec_args a { { ARG_KEY, tensor(tensor_desc({ t, h, d }, data_type::f32), key.data()) },
                      { ARG_VALUE, tensor(tensor_desc({ t, h, d }, data_type::f32), value.data()) },
                      { ARG_K_CACHE, tensor(cache_md(), k_cache.data()) },
                      { ARG_V_CACHE, tensor(cache_md(), v_cache.data()) },
                      { ARG_SLOT_MAPPING, tensor(tensor_desc({ t }, data_type::s64), slots.data()) } };
        if (k_mask >= 0) a[ARG_K_SCALES] = tensor(scales_md(k_mask), k_scales.data());
        if (v_mask >= 0) a[ARG_V_SCALES] = tensor(scales_md(v_mask), v_scales.data());
        return a;
    }

    untouched_check snapshot() const {
        untouched_check c;
        c.add("k_cache", k_cache.data(), k_cache.size());
        c.add("v_cache", v_cache.data(), v_cache.size());
        c.add("k_scales", k_scales.data(), k_scales.size() * sizeof(float));
        c.add("v_scales", v_scales.data(), v_scales.size() * sizeof(float));
        return c;
    }

    void expect_exec_error(const exec_args &a, std::initializer_list<const char *> names) {
        const untouched_check c = snapshot();
        expect_error([&] { prim.execute(strm, a); }, status::invalid_arguments, names);
        strm.wait();
        c.verify();
    }
};

TEST_F(rac_fixture, valid_step_writes_caches_and_scales) {
    const untouched_check c = snapshot();
    prim.execute(strm, args());
    strm.wait();
    EXPECT_TRUE(c.any_changed("k_cache"));
    EXPECT_TRUE(c.any_changed("v_cache"));
    EXPECT_TRUE(c.any_changed("k_scales"));
}

TEST_F(rac_fixture, all_slots_skipped_is_valid_and_writes_nothing) {
    slots = { -1, -1, -2, -100, -1, std::numeric_limits<int64_t>::min() };
    const untouched_check c = snapshot();
    prim.execute(strm, args());
    strm.wait();
    c.verify();
}

struct rac_desc_case {
    tensor_desc key, value, k_cache, v_cache;
};

rac_desc_case good_rac_desc() {
    return { tensor_desc({ runtime_dim, 2, 16 }, data_type::f32),
             tensor_desc({ runtime_dim, 2, 16 }, data_type::f32),
             tensor_desc({ 4, 2, 4, 16 }, data_type::f8_e4m3),
             tensor_desc({ 4, 2, 4, 16 }, data_type::f8_e4m3) };
}

void create_rac(const rac_desc_case &c, const primitive_attr &attr = {}) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    reshape_and_cache::desc d(c.key, c.value, c.k_cache, c.v_cache);
    reshape_and_cache::primitive_desc pd(eng, d, attr);
}

TEST(reshape_and_cache_desc, good_desc_is_accepted) {
    EXPECT_NO_THROW(create_rac(good_rac_desc()));
}

TEST(reshape_and_cache_desc, key_wrong_rank) {
    rac_desc_case c = good_rac_desc();
    c.key = tensor_desc({ runtime_dim, 32 }, data_type::f32);
    expect_invalid({ "key" }, [&] { create_rac(c); });
}

TEST(reshape_and_cache_desc, key_s32_type) {
    rac_desc_case c = good_rac_desc();
    c.key = tensor_desc({ runtime_dim, 2, 16 }, data_type::s32);
    expect_invalid({ "key" }, [&] { create_rac(c); });
}

TEST(reshape_and_cache_desc, value_f8_type) {
    rac_desc_case c = good_rac_desc();
    c.value = tensor_desc({ runtime_dim, 2, 16 }, data_type::f8_e5m2);
    expect_invalid({ "value" }, [&] { create_rac(c); });
}

TEST(reshape_and_cache_desc, value_dims_differ_from_key) {
    rac_desc_case c = good_rac_desc();
    c.value = tensor_desc({ runtime_dim, 1, 32 }, data_type::f32);
    expect_invalid({ "value" }, [&] { create_rac(c); });
}

TEST(reshape_and_cache_desc, key_heads_differ_from_cache) {
    rac_desc_case c = good_rac_desc();
    c.key = c.value = tensor_desc({ runtime_dim, 4, 16 }, data_type::f32);
    expect_invalid({ "key", "k_cache" }, [&] { create_rac(c); });
}

TEST(reshape_and_cache_desc, key_head_size_differs_from_cache) {
    rac_desc_case c = good_rac_desc();
    c.key = c.value = tensor_desc({ runtime_dim, 2, 8 }, data_type::f32);
    expect_invalid({ "key", "k_cache" }, [&] { create_rac(c); });
}

TEST(reshape_and_cache_desc, head_size_above_512) {
    rac_desc_case c = good_rac_desc();
    c.key = c.value = tensor_desc({ runtime_dim, 2, 513 }, data_type::f32);
    c.k_cache = c.v_cache = tensor_desc({ 4, 2, 4, 513 }, data_type::f8_e4m3);
    expect_invalid({ "key", "k_cache" }, [&] { create_rac(c); });
}

TEST(reshape_and_cache_desc, k_cache_wrong_rank) {
    rac_desc_case c = good_rac_desc();
    c.k_cache = tensor_desc({ 4, 8, 16 }, data_type::f8_e4m3);
    expect_invalid({ "k_cache" }, [&] { create_rac(c); });
}

TEST(reshape_and_cache_desc, v_cache_dims_differ) {
    rac_desc_case c = good_rac_desc();
    c.v_cache = tensor_desc({ 5, 2, 4, 16 }, data_type::f8_e4m3);
    expect_invalid({ "v_cache" }, [&] { create_rac(c); });
}

TEST(reshape_and_cache_desc, cache_s32_type) {
    rac_desc_case c = good_rac_desc();
    c.v_cache = tensor_desc({ 4, 2, 4, 16 }, data_type::s32);
    expect_invalid({ "v_cache" }, [&] { create_rac(c); });
}

TEST(reshape_and_cache_desc, scales_mask_on_bf16_cache) {
    rac_desc_case c = good_rac_desc();
    c.k_cache = c.v_cache = tensor_desc({ 4, 2, 4, 16 }, data_type::bf16);
    primitive_attr attr;
    attr.set_scales_mask(ARG_K_CACHE, scales_per_token);
    reshape_and_cache::desc d(c.key, c.value, c.k_cache, c.v_cache);
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    expect_invalid({ "k_cache", "k_scales" }, [&] { reshape_and_cache::primitive_desc pd(eng, d, attr); });
}

TEST(reshape_and_cache_desc, scales_mask_on_f16_v_cache) {
    rac_desc_case c = good_rac_desc();
    c.v_cache = tensor_desc({ 4, 2, 4, 16 }, data_type::f16);
    primitive_attr attr;
    attr.set_scales_mask(ARG_V_CACHE, scales_per_kv_head);
    expect_invalid({ "v_cache", "v_scales" }, [&] { create_rac(c, attr); });
}

TEST_F(rac_fixture, slot_out_of_range_in_last_token) {
    slots[t - 1] = nb * bs;
    expect_exec_error(args(), { "slot_mapping" });
}

TEST_F(rac_fixture, huge_s64_slot_in_last_token) {
    slots[t - 1] = std::numeric_limits<int64_t>::max();
    expect_exec_error(args(), { "slot_mapping" });
}

TEST_F(rac_fixture, s32_slot_out_of_range_in_last_token) {
    std::vector<int32_t> slots32(slots.begin(), slots.end());
    slots32[t - 1] = static_cast<int32_t>(nb * bs + 3);
    exec_args a = args();
    a[ARG_SLOT_MAPPING] = tensor(tensor_desc({ t }, data_type::s32), slots32.data());
    expect_exec_error(a, { "slot_mapping" });
}

TEST_F(rac_fixture, slot_mapping_wrong_length) {
    exec_args a = args();
    a[ARG_SLOT_MAPPING] = tensor(tensor_desc({ t - 1 }, data_type::s64), slots.data());
    expect_exec_error(a, { "slot_mapping" });
}

TEST_F(rac_fixture, slot_mapping_wrong_type) {
    exec_args a = args();
    a[ARG_SLOT_MAPPING] = tensor(tensor_desc({ t }, data_type::f32), slots.data());
    expect_exec_error(a, { "slot_mapping" });
}

TEST_F(rac_fixture, slot_mapping_wrong_rank) {
    exec_args a = args();
    a[ARG_SLOT_MAPPING] = tensor(tensor_desc({ 2, t / 2 }, data_type::s64), slots.data());
    expect_exec_error(a, { "slot_mapping" });
}

TEST_F(rac_fixture, value_token_count_differs_from_key) {
    exec_args a = args();
    a[ARG_VALUE] = tensor(tensor_desc({ t - 1, h, d }, data_type::f32), value.data());
    expect_exec_error(a, { "value", "key" });
}

TEST_F(rac_fixture, key_wrong_heads) {
    exec_args a = args();
    a[ARG_KEY] = tensor(tensor_desc({ t, 2 * h, d / 2 }, data_type::f32), key.data());
    expect_exec_error(a, { "key" });
}

TEST_F(rac_fixture, key_type_differs_from_desc) {
    exec_args a = args();
    a[ARG_KEY] = tensor(tensor_desc({ t, h, d }, data_type::bf16), key.data());
    expect_exec_error(a, { "key" });
}

TEST_F(rac_fixture, k_cache_desc_differs_from_pd) {
    exec_args a = args();
    a[ARG_K_CACHE] =
            tensor(tensor_desc({ nb, h, bs, d }, data_type::f8_e4m3, dims { bs * h * d, d, h * d, 1 }),
                   k_cache.data());
    expect_exec_error(a, { "k_cache" });
}

TEST_F(rac_fixture, unknown_argument_id) {
    exec_args a = args();
    float dummy = 0.f;
    a[999] = tensor(tensor_desc({ 1 }, data_type::f32), &dummy);
    const untouched_check c = snapshot();
    try {
        prim.execute(strm, a);
        ADD_FAILURE() << "no error for argument id 999";
    } catch (const pagedattn::error &e) {
        EXPECT_EQ(e.get_status(), status::invalid_arguments);
        EXPECT_NE(std::string(e.what()).find("999"), std::string::npos) << e.what();
    }
    c.verify();
}

TEST_F(rac_fixture, block_table_not_expected) {
    exec_args a = args();
    int32_t table = 0;
    a[ARG_BLOCK_TABLE] = tensor(tensor_desc({ 1, 1 }, data_type::s32), &table);
    expect_exec_error(a, { "block_table" });
}

TEST_F(rac_fixture, dst_not_expected) {
    exec_args a = args();
    a[ARG_DST] = tensor(tensor_desc({ t, h, d }, data_type::f32), value.data());
    expect_exec_error(a, { "dst" });
}

TEST_F(rac_fixture, v_scales_not_expected_without_mask) {
    v_mask = -1;
    build();
    exec_args a = args();
    float one = 1.f;
    a[ARG_V_SCALES] = tensor(tensor_desc({ 1 }, data_type::f32), &one);
    expect_exec_error(a, { "v_scales" });
}

TEST_F(rac_fixture, bad_per_tensor_v_scale) {
    for (float bad : bad_scales) {
        SCOPED_TRACE(bad);
        v_scales[0] = bad;
        expect_exec_error(args(), { "v_scales" });
    }
}

TEST_F(rac_fixture, bad_per_head_k_scale_in_last_head) {
    k_mask = scales_per_kv_head;
    build();
    for (float bad : bad_scales) {
        SCOPED_TRACE(bad);
        k_scales[h - 1] = bad;
        expect_exec_error(args(), { "k_scales" });
    }
}

TEST_F(rac_fixture, per_token_scales_wrong_dims) {
    exec_args a = args();
    a[ARG_K_SCALES] = tensor(tensor_desc({ nb, h, bs - 1 }, data_type::f32), k_scales.data());
    expect_exec_error(a, { "k_scales" });
}

TEST_F(rac_fixture, per_tensor_scales_wrong_dims) {
    exec_args a = args();
    a[ARG_V_SCALES] = tensor(tensor_desc({ h }, data_type::f32), k_scales.data());
    expect_exec_error(a, { "v_scales" });
}

TEST_F(rac_fixture, scales_wrong_type) {
    exec_args a = args();
    a[ARG_V_SCALES] = tensor(tensor_desc({ 1 }, data_type::bf16), v_scales.data());
    expect_exec_error(a, { "v_scales" });
}

class rac_required_arg : public rac_fixture, public testing::WithParamInterface<int> {};

TEST_P(rac_required_arg, missing) {
    exec_args a = args();
    ASSERT_EQ(a.erase(GetParam()), 1u);
    expect_exec_error(a, { arg_name(GetParam()) });
}

TEST_P(rac_required_arg, null_pointer) {
    exec_args a = args();
    a[GetParam()] = tensor(a.at(GetParam()).get_desc(), static_cast<void *>(nullptr));
    expect_exec_error(a, { arg_name(GetParam()) });
}

INSTANTIATE_TEST_SUITE_P(all, rac_required_arg,
                         testing::Values(ARG_KEY, ARG_VALUE, ARG_K_CACHE, ARG_V_CACHE, ARG_SLOT_MAPPING,
                                         ARG_K_SCALES, ARG_V_SCALES),
                         [](const testing::TestParamInfo<int> &info) {
                             return std::string(arg_name(info.param));
                         });

} // namespace
