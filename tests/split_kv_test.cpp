// The step plan and split-KV: a plan built once per step gives the same results as execute's own
// partition; KV ranges split into 1, 2 and 7 pieces (merged with log-sum-exp) equal the unsplit
// result within rounding, including pieces that a window hides from some rows and prefill tiles; a
// plan built for another step is rejected; and execute with a plan and a user scratchpad allocates
// nothing.
#include <atomic>
#include <cstdlib>
#include <new>

#include <tbb/task_arena.h>

#include "test_util.hpp"

// Counts every allocation through operator new of the whole test binary. (GCC flags the free of a
// replaced operator new's memory as mismatched; the replacement is consistent.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
static std::atomic<long> allocations { 0 };
void *operator new(std::size_t size) {
    allocations.fetch_add(1, std::memory_order_relaxed);
    if (void *p = std::malloc(size ? size : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void *p) noexcept {
    std::free(p);
}
void operator delete(void *p, std::size_t) noexcept {
    std::free(p);
}

namespace {

using namespace test_util;
using oracle::scales;

pa::tensor seq_lens_of(const attn_setup &s) {
    return pa::tensor(pa::tensor_desc({ s.b.num_seqs }, pa::data_type::s32), s.b.seq_lens.data());
}
pa::tensor starts_of(const attn_setup &s) {
    return pa::tensor(pa::tensor_desc({ s.b.num_seqs + 1 }, pa::data_type::s32), s.b.query_start_loc.data());
}

std::vector<attn_case> split_cases() {
    std::vector<attn_case> v;
    const int long_len = reduced() ? 2100 : 7812;
    // vLLM's window 256 = left 255, right 0: a decode sees 256 tokens, a prefill tile more, so some
    // pieces are wholly outside some rows' windows.
    v.push_back(make_case("window256", 8, 2, 64, 16, { { 1, long_len }, { 134, reduced() ? 1000 : 5131 } },
                          format::bf16, format::e4m3, cache_layout::hnd)
                        .scales(scales::per_token, scales::per_token)
                        .window(255, 0)
                        .with_sinks());
    v.push_back(make_case("long_decode", 16, 1, 128, 128, { { 1, long_len } }, format::f32, format::bf16,
                          cache_layout::nhd)
                        .with_alibi());
    v.push_back(make_case("mixed", 4, 4, 32, 32, { { 1, 1234 }, { 0, 50 }, { 98, 1145 }, { 1, 7 } },
                          format::f16, format::e5m2, cache_layout::kv_shared)
                        .scales(scales::per_kv_head, scales::per_tensor, 0.037f, 5.3f)
                        .non_causal()
                        .cap(50.f));
    // Prefill tiles of 64 rows split: large partials, many rows per merged group.
    v.push_back(make_case("prefill_tiles", 8, 2, 128, 16, { { 64, reduced() ? 700 : 1500 } }, format::bf16,
                          format::bf16, cache_layout::hnd));
    return v;
}

class split_kv : public ::testing::TestWithParam<attn_case> {};

TEST_P(split_kv, forced_splits_equal_unsplit_within_rounding) {
    const attn_case &c = GetParam();
    const attn_setup s = build_setup(c);
    const oracle::result ref = s.oracle_on_cache();
    pa::paged_attention::primitive_desc pd(engine(), s.desc(), s.attr());
    do {
        SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
        const pa::paged_attention prim(pd);
        dnnl::stream st = make_stream();
        buffer unsplit = s.make_dst();
        prim.execute(st, s.args(s.q.data(), unsplit.data()));
        EXPECT_EQ(compare_attention(unsplit.data(), c.dst_fmt, ref).failures, 0);
        for (int splits : { 1, 2, 7 }) {
            SCOPED_TRACE(std::to_string(splits) + " splits");
            const pa::paged_attention::plan plan(pd, seq_lens_of(s), starts_of(s), splits);
            if (splits == 1)
                EXPECT_EQ(plan.split_items(), 0);
            else
                EXPECT_GE(plan.split_items(), 2 * c.hkv) << "the long sequence's items must be split";
            buffer dst = s.make_dst();
            pa::exec_args args = s.args(s.q.data(), dst.data());
            args[pa::ARG_PLAN] = plan.as_tensor();
            prim.execute(st, args);
            const comparison cmp = compare_attention(dst.data(), c.dst_fmt, ref);
            EXPECT_EQ(cmp.failures, 0) << "split against the oracle: " << cmp;
            // Both within the tolerance of the exact value: within twice it of each other.
            oracle::result base = ref;
            for (size_t i = 0; i < base.out.size(); ++i)
                base.out[i] = reference::load(unsplit.data(), c.dst_fmt, static_cast<int64_t>(i));
            const comparison diff = compare(dst.data(), c.dst_fmt, base,
                                            [&](size_t i) { return 2.0 * attention_tol(ref, i, c.dst_fmt); });
            EXPECT_EQ(diff.failures, 0) << "split against unsplit: " << diff;
        }
    } while (pd.next_impl());
}

INSTANTIATE_TEST_SUITE_P(cases, split_kv, ::testing::ValuesIn(split_cases()),
                         [](const ::testing::TestParamInfo<attn_case> &i) { return i.param.name(); });

attn_case small_case() {
    attn_case c = make_case("plan", 8, 2, 64, 16, { { 1, 900 }, { 5, 40 } }, format::bf16, format::e4m3,
                            cache_layout::hnd);
    return c.scales(scales::per_token, scales::per_token);
}

// Without forced splits the plan splits long KV ranges when the calling arena's threads would get
// fewer than 8 work items each (a thread slowed by other work then leaves the rest idle): 4 items
// on 2 threads are split, on 1 thread nothing is, and 64 items on 2 threads are not split either.
TEST(plan, splits_when_threads_get_few_items) {
    const attn_setup s = build_setup(small_case()); // 2 sequences x 2 kv heads, one of 900 tokens
    pa::paged_attention::primitive_desc pd(engine(), s.desc(), s.attr());
    auto split_items_in_arena = [&](int threads, const attn_setup &setup) {
        long split = -1;
        tbb::task_arena(threads).execute([&] {
            split = pa::paged_attention::plan(pd, seq_lens_of(setup), starts_of(setup)).split_items();
        });
        return split;
    };
    EXPECT_GT(split_items_in_arena(2, s), 0) << "4 items on 2 threads";
    EXPECT_EQ(split_items_in_arena(1, s), 0) << "one thread";
    attn_setup many = s; // 32 decode sequences of 900 tokens: 64 items
    many.b.num_seqs = 32;
    many.b.seq_lens.assign(32, 900);
    many.b.query_start_loc.clear();
    for (int i = 0; i <= 32; ++i)
        many.b.query_start_loc.push_back(i);
    EXPECT_EQ(split_items_in_arena(2, many), 0) << "64 items on 2 threads";
}

TEST(plan, rejects_another_step) {
    const attn_setup s = build_setup(small_case());
    pa::paged_attention::primitive_desc pd(engine(), s.desc(), s.attr());
    const pa::paged_attention prim(pd);
    const pa::paged_attention::plan plan(pd, seq_lens_of(s), starts_of(s), 2);
    dnnl::stream st = make_stream();
    buffer dst = s.make_dst();
    dst.fill(0x5A);
    const buffer before = dst;
    attn_setup other = s;
    other.b.seq_lens[0] -= 1; // the next step of a decode would differ like this
    pa::exec_args args = other.args(s.q.data(), dst.data());
    args[pa::ARG_PLAN] = plan.as_tensor();
    try {
        prim.execute(st, args);
        FAIL() << "a plan of another step was accepted";
    } catch (const pa::error &e) {
        EXPECT_EQ(e.get_status(), pa::status::invalid_arguments);
        EXPECT_NE(std::string(e.what()).find("plan"), std::string::npos) << e.what();
    }
    EXPECT_EQ(std::memcmp(dst.data(), before.data(), dst.size()), 0) << "dst was written";

    // A plan of a primitive_desc with another problem (a window) is rejected too.
    pa::paged_attention::options o = s.opts;
    o.window_left = 10;
    const pa::paged_attention::desc windowed(s.desc().query(), s.desc().k_cache(), s.desc().v_cache(),
                                             s.desc().dst(), o);
    pa::paged_attention::primitive_desc other_pd(engine(), windowed, s.attr());
    const pa::paged_attention::plan foreign(other_pd, seq_lens_of(s), starts_of(s));
    args = s.args(s.q.data(), dst.data());
    args[pa::ARG_PLAN] = foreign.as_tensor();
    EXPECT_THROW(prim.execute(st, args), pa::error);

    // Not a plan at all.
    uint64_t junk[8] = {};
    args[pa::ARG_PLAN] = pa::tensor(pa::tensor_desc({ 64 }, pa::data_type::u8), junk);
    EXPECT_THROW(prim.execute(st, args), pa::error);
}

TEST(plan, execute_with_plan_and_user_scratchpad_allocates_nothing) {
    const attn_setup s = build_setup(small_case());
    pa::primitive_attr attr = s.attr();
    attr.set_scratchpad_mode(pa::scratchpad_mode::user);
    pa::paged_attention::primitive_desc pd(engine(), s.desc(), attr);
    do {
        SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
        const pa::paged_attention prim(pd);
        dnnl::stream st = make_stream();
        for (int splits : { 0, 3 }) {
            const pa::paged_attention::plan plan(pd, seq_lens_of(s), starts_of(s), splits);
            buffer dst = s.make_dst();
            std::vector<char> scratchpad(pd.scratchpad_desc().get_size());
            pa::exec_args args = s.args(s.q.data(), dst.data());
            args[pa::ARG_PLAN] = plan.as_tensor();
            args[pa::ARG_SCRATCHPAD] = pa::tensor(pd.scratchpad_desc(), scratchpad.data());
            prim.execute(st, args); // warm-up: thread pool start
            const long before = allocations.load();
            prim.execute(st, args);
            const long during = allocations.load() - before;
            EXPECT_EQ(during, 0) << during << " allocations in one execute with " << splits << " splits";
            EXPECT_EQ(compare_attention(dst.data(), s.c.dst_fmt, s.oracle_on_cache()).failures, 0);
        }
    } while (pd.next_impl());
}

} // namespace
