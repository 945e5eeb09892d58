// Thread counts: 1, 2 and 7 threads (task arenas under a global_control of 7) give the same results
// within rounding, on batches where the work partition differs with the thread count (a long
// prefill next to decodes, and long decodes that split the KV range); and concurrent executes of one
// primitive from several threads, on different data, are each correct.
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <thread>

#include "test_util.hpp"

namespace {

using namespace test_util;
using oracle::scales;

std::vector<attn_case> thread_cases() {
    std::vector<attn_case> v;
    // The mixed batch of the matrix; under the sanitizer a smaller mix of the same shape.
    const std::vector<std::pair<int, int>> mixed =
            reduced() ? std::vector<std::pair<int, int>> { { 98, 1145 }, { 1, 4162 }, { 1, 1234 }, { 5, 5 } }
                      : std::vector<std::pair<int, int>> {
                            { 992, 2456 }, { 1, 1234 }, { 98, 1145 }, { 1, 4162 }
                        };
    v.push_back(make_case("mixed", 4, 4, 32, 16, mixed, format::f32, format::e4m3, cache_layout::hnd)
                        .scales(scales::per_token, scales::per_token));
    v.push_back(make_case("long_decode", 16, 1, 128, 16, { { 1, 7812 }, { 1, 4162 } }, format::bf16,
                          format::bf16, cache_layout::nhd));
    v.push_back(make_case("long_decode_window", 8, 2, 64, 32, { { 1, 7812 } }, format::f16, format::e5m2,
                          cache_layout::kv_shared)
                        .scales(scales::per_kv_head, scales::per_tensor, 0.037f, 5.3f)
                        .window(1000, -1)
                        .with_sinks());
    return v;
}

class thread_counts : public ::testing::TestWithParam<attn_case> {};

TEST_P(thread_counts, agree_with_each_other_and_the_oracle) {
    const attn_case &c = GetParam();
    const attn_setup s = build_setup(c);
    const oracle::result ref = s.oracle_on_cache();
    pa::paged_attention::primitive_desc pd(engine(), s.desc(), s.attr());
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, 7);
    do {
        SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
        const pa::paged_attention prim(pd);
        const int counts[3] = { 7, 1, 2 };
        std::vector<buffer> out;
        for (int n : counts) {
            buffer dst = s.make_dst();
            tbb::task_arena arena(n);
            arena.execute([&] {
                dnnl::stream st = make_stream();
                prim.execute(st, s.args(s.q.data(), dst.data()));
                st.wait();
            });
            const comparison cmp = compare_attention(dst.data(), c.dst_fmt, ref);
            EXPECT_EQ(cmp.failures, 0) << n << " threads against the oracle: " << cmp;
            out.push_back(std::move(dst));
        }
        // Two results that each sit within the tolerance of the exact value differ by at most twice
        // it: "the same within rounding".
        for (int a = 1; a < 3; ++a) {
            oracle::result seven = ref;
            for (size_t i = 0; i < seven.out.size(); ++i)
                seven.out[i] = reference::load(out[0].data(), c.dst_fmt, static_cast<int64_t>(i));
            const comparison cmp = compare(out[static_cast<size_t>(a)].data(), c.dst_fmt, seven,
                                           [&](size_t i) { return 2.0 * attention_tol(ref, i, c.dst_fmt); });
            EXPECT_EQ(cmp.failures, 0) << counts[a] << " threads against 7 threads: " << cmp;
        }
    } while (pd.next_impl());
}

// Determinism: for one implementation and one plan, dst is the same bits on 1, 2 and 7 threads (the
// plan fixes the partition, split-KV pieces included, and each item's arithmetic is sequential);
// and execute without a plan gives the bits of a plan built in the same arena (it builds the same
// one). Only the partition chosen without a plan varies with the thread count (more KV splits on
// more threads), which agree_with_each_other_and_the_oracle bounds.
TEST_P(thread_counts, one_plan_gives_the_same_bits_on_any_thread_count) {
    const attn_case &c = GetParam();
    const attn_setup s = build_setup(c);
    pa::paged_attention::primitive_desc pd(engine(), s.desc(), s.attr());
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, 7);
    const pa::tensor lens(pa::tensor_desc({ s.b.num_seqs }, pa::data_type::s32), s.b.seq_lens.data());
    const pa::tensor starts(pa::tensor_desc({ s.b.num_seqs + 1 }, pa::data_type::s32),
                            s.b.query_start_loc.data());
    do {
        SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
        const pa::paged_attention prim(pd);
        for (int splits : { 1, 3 }) {
            SCOPED_TRACE(std::to_string(splits) + " KV pieces per item");
            const pa::paged_attention::plan plan(pd, lens, starts, splits);
            std::vector<buffer> out;
            for (int n : { 1, 2, 7 }) {
                buffer dst = s.make_dst();
                tbb::task_arena(n).execute([&] {
                    dnnl::stream st = make_stream();
                    pa::exec_args a = s.args(s.q.data(), dst.data());
                    a[pa::ARG_PLAN] = plan.as_tensor();
                    prim.execute(st, a);
                    st.wait();
                });
                out.push_back(std::move(dst));
            }
            for (size_t i = 1; i < out.size(); ++i)
                EXPECT_EQ(std::memcmp(out[i].data(), out[0].data(), out[0].size()), 0)
                        << (i == 1 ? 2 : 7) << " threads gave other bits than 1 thread with the same plan";
        }
        for (int n : { 1, 2, 7 }) {
            SCOPED_TRACE(std::to_string(n) + " threads, no plan against the arena's own plan");
            buffer with_plan = s.make_dst(), without = s.make_dst();
            tbb::task_arena(n).execute([&] {
                const pa::paged_attention::plan plan(pd, lens, starts);
                dnnl::stream st = make_stream();
                pa::exec_args a = s.args(s.q.data(), with_plan.data());
                a[pa::ARG_PLAN] = plan.as_tensor();
                prim.execute(st, a);
                prim.execute(st, s.args(s.q.data(), without.data()));
                st.wait();
            });
            EXPECT_EQ(std::memcmp(with_plan.data(), without.data(), with_plan.size()), 0);
        }
    } while (pd.next_impl());
}

INSTANTIATE_TEST_SUITE_P(batches, thread_counts, ::testing::ValuesIn(thread_cases()),
                         [](const ::testing::TestParamInfo<attn_case> &i) { return i.param.name(); });

// One primitive, executed at the same time from 4 threads, each with its own query and dst (the
// primitive is immutable; library-mode scratch is per thread).
TEST(thread_safety, concurrent_executes_of_one_primitive) {
    attn_case c = make_case("concurrent", 8, 2, 64, 16, { { 12, 300 }, { 1, 1000 }, { 1, 77 } }, format::bf16,
                            format::e4m3, cache_layout::hnd);
    c.scales(scales::per_token, scales::per_token);
    const attn_setup s = build_setup(c);
    constexpr int workers = 4;
    // A different query per worker (scaled copies of the setup's, exact in bf16: powers of two).
    std::vector<buffer> queries, dsts;
    std::vector<oracle::result> refs;
    for (int w = 0; w < workers; ++w) {
        attn_setup sw = s;
        const float f = std::ldexp(1.f, w - 1);
        for (size_t i = 0; i < sw.q_in.size(); ++i)
            store_exact(sw.q.data(), c.q_fmt, static_cast<int64_t>(i), sw.q_in[i] * f);
        refs.push_back(sw.oracle_on_cache());
        queries.push_back(std::move(sw.q));
        dsts.push_back(s.make_dst());
    }
    pa::paged_attention::primitive_desc pd(engine(), s.desc(), s.attr());
    do {
        SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
        const pa::paged_attention prim(pd);
        for (auto &d : dsts)
            d.fill(0xFF);
        std::vector<std::thread> threads;
        std::vector<std::string> errors(workers); // an exception must not escape a std::thread
        for (int w = 0; w < workers; ++w)
            threads.emplace_back([&, w] {
                try {
                    dnnl::stream st = make_stream();
                    for (int rep = 0; rep < 3; ++rep)
                        prim.execute(st, s.args(queries[static_cast<size_t>(w)].data(),
                                                dsts[static_cast<size_t>(w)].data()));
                    st.wait();
                } catch (const std::exception &e) {
                    errors[static_cast<size_t>(w)] = e.what();
                }
            });
        for (auto &t : threads)
            t.join();
        for (int w = 0; w < workers; ++w) {
            EXPECT_EQ(errors[static_cast<size_t>(w)], "") << "worker " << w;
            const comparison cmp = compare_attention(dsts[static_cast<size_t>(w)].data(), c.dst_fmt,
                                                     refs[static_cast<size_t>(w)]);
            EXPECT_EQ(cmp.failures, 0) << "worker " << w << ": " << cmp;
        }
    } while (pd.next_impl());
}

} // namespace
