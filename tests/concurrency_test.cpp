// Concurrent executes of one primitive (DESIGN §2: a primitive is immutable; execute may be called
// from several threads at once on different data). 8 std::threads, each with its own query, caches,
// block table, dst (and, in scratchpad_mode::user, its own scratchpad), run one primitive at the
// same time; every result must equal, bit for bit, what a serial execute of the same inputs gives.
// Every implementation of the walk, both scratchpad modes, several rounds (alternately from the
// std::threads and from inside one tbb::task_arena; half the workers pass one shared plan); the
// same for reshape_and_cache writing disjoint caches. The tsan leg of scripts/run_tests.sh runs
// this file under ThreadSanitizer.
#include <atomic>
#include <thread>

#include <oneapi/tbb/task_arena.h>

#include "tbb_calls.hpp"
#include "test_util.hpp"

namespace {

using namespace test_util;
using oracle::scales;

constexpr int workers = 8;

int rounds() {
    return 3; // one per launch
}

/// How the workers call execute:
/// - threads: straight from their std::threads;
/// - arena: from inside one tbb::task_arena that all the std::threads enter (of the default
///   arena's concurrency, so that a plan chosen inside it is the serial executes' one); with more
///   workers than slots, a worker's execute runs on another thread of the arena;
/// - tbb_tasks: as the tasks of one tbb::parallel_for, as an engine may call execute; a thread that
///   waits inside one execute's loop may then run another worker's whole execute.
enum class launch { threads, arena, tbb_tasks };
const char *name_of(launch l) {
    switch (l) {
        case launch::threads: return "from std::threads";
        case launch::arena: return "inside one tbb::task_arena";
        case launch::tbb_tasks: return "as tbb::parallel_for tasks";
    }
    return "?";
}
/// Round r launches this way (every case sees each).
launch launch_of_round(int round) {
    return static_cast<launch>(round % 3);
}

/// Runs body(w) for each worker w, launched `how` (the std::threads wait for each other, to
/// overlap as much as possible); returns the exception messages (empty strings when none was
/// thrown).
template <typename Body> std::vector<std::string> run_concurrently(launch how, const Body &body) {
    std::vector<std::string> errors(workers);
    if (how == launch::tbb_tasks) {
        for_each_task(workers, [&](int w) {
            try {
                body(w);
            } catch (const std::exception &e) {
                errors[static_cast<size_t>(w)] = e.what();
            }
        });
        return errors;
    }
    std::atomic<int> ready { 0 };
    tbb::task_arena arena(tbb::this_task_arena::max_concurrency());
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w)
        threads.emplace_back([&, w] {
            try {
                ready.fetch_add(1);
                while (ready.load() < workers)
                    std::this_thread::yield();
                if (how == launch::arena)
                    execute_in(arena, [&] { body(w); });
                else
                    body(w);
            } catch (const std::exception &e) {
                errors[static_cast<size_t>(w)] = e.what();
            }
        });
    for (auto &t : threads)
        t.join();
    return errors;
}

// ---------------------------------------------------------------------------------------------
// paged_attention

struct attention_case {
    attn_case c;
    bool packed = false; // caches of layout::any (packed), written from the setup's inputs
    std::string name() const { return c.name() + (packed ? "_packed" : ""); }
};
void PrintTo(const attention_case &x, std::ostream *os) {
    *os << x.name();
}

/// A worker's K/V caches in the layout layout::any resolves to (packed for the dims used here),
/// written by reshape_and_cache from the setup's inputs and slots.
struct any_caches {
    pa::tensor_desc md;
    buffer k, v;
    scales_spec ks, vs;
};

pa::tensor_desc any_md(const attn_setup &s) {
    return pa::tensor_desc({ s.b.num_blocks, s.c.hkv, s.c.bs, s.c.d }, dt_of(s.c.cache_fmt), pa::layout::any);
}

any_caches write_any(const attn_setup &s) {
    const attn_case &c = s.c;
    const pa::tensor_desc kv({ pa::runtime_dim, c.hkv, c.d }, dt_of(c.q_fmt));
    const pa::reshape_and_cache::primitive_desc pd(
            engine(), pa::reshape_and_cache::desc(kv, kv, any_md(s), any_md(s)), s.attr());
    any_caches out;
    out.md = pd.query_md(pa::ARG_K_CACHE);
    out.k = buffer(out.md.get_size());
    out.v = buffer(out.md.get_size());
    out.ks = make_scales(c.k_scales, c.scale_a, c.scale_b, s.b.num_blocks, c.hkv, c.bs);
    out.vs = make_scales(c.v_scales, c.scale_b, c.scale_a, s.b.num_blocks, c.hkv, c.bs);
    const int64_t ctx = s.b.context_tokens;
    buffer key(s.k_in.size() * static_cast<size_t>(size_of(c.q_fmt))), value(key.size());
    for (size_t i = 0; i < s.k_in.size(); ++i) {
        store_exact(key.data(), c.q_fmt, static_cast<int64_t>(i), s.k_in[i]);
        store_exact(value.data(), c.q_fmt, static_cast<int64_t>(i), s.v_in[i]);
    }
    std::vector<int64_t> slots;
    for (int64_t q = 0; q < s.b.num_seqs; ++q)
        for (int64_t j = 0; j < s.b.seq_lens[static_cast<size_t>(q)]; ++j)
            slots.push_back(s.b.slot_of(q, j));
    const pa::tensor_desc run({ ctx, c.hkv, c.d }, dt_of(c.q_fmt));
    pa::exec_args a {
        { pa::ARG_KEY, pa::tensor(run, key.data()) },
        { pa::ARG_VALUE, pa::tensor(run, value.data()) },
        { pa::ARG_K_CACHE, pa::tensor(out.md, out.k.data()) },
        { pa::ARG_V_CACHE, pa::tensor(out.md, out.v.data()) },
        { pa::ARG_SLOT_MAPPING, pa::tensor(pa::tensor_desc({ ctx }, pa::data_type::s64), slots.data()) },
    };
    if (out.ks.kind != scales::none)
        a[pa::ARG_K_SCALES] = pa::tensor(out.ks.md(s.b.num_blocks, c.hkv, c.bs), out.ks.values.data());
    if (out.vs.kind != scales::none)
        a[pa::ARG_V_SCALES] = pa::tensor(out.vs.md(s.b.num_blocks, c.hkv, c.bs), out.vs.values.data());
    dnnl::stream st = make_stream();
    pa::reshape_and_cache(pd).execute(st, a);
    st.wait();
    return out;
}

std::vector<attention_case> attention_cases() {
    const bool red = reduced();
    using seqs = std::vector<std::pair<int, int>>;
    std::vector<attention_case> v;
    // Mixed prefill and decode with long sequences, GQA, FP8 with per-token scales, plain cache.
    v.push_back({ make_case("mixed_e4m3", 8, 2, 64, 16,
                            red ? seqs { { 12, 300 }, { 1, 900 }, { 1, 200 }, { 5, 5 } }
                                : seqs { { 24, 1145 }, { 1, 4162 }, { 1, 1234 }, { 5, 5 } },
                            format::bf16, format::e4m3, cache_layout::hnd)
                          .scales(scales::per_token, scales::per_token) });
    // bf16 cache, one kv head and few sequences: the plan splits the long KV ranges across threads
    // and merges them (the shared scratch region of an execute).
    v.push_back({ make_case("split_bf16", 8, 1, 128, 32,
                            red ? seqs { { 1, 1500 }, { 3, 400 } } : seqs { { 1, 5000 }, { 3, 900 } },
                            format::f16, format::bf16, cache_layout::nhd)
                          .with_sinks() });
    // e5m2, per-token K and per-head V scales, K and V in one allocation.
    v.push_back(
            { make_case("mixed_e5m2_kvshared", 4, 4, 32, 16,
                        red ? seqs { { 7, 200 }, { 1, 600 } } : seqs { { 20, 700 }, { 1, 2500 }, { 2, 30 } },
                        format::f32, format::e5m2, cache_layout::kv_shared)
                      .scales(scales::per_token, scales::per_kv_head, 1.f, 0.037f) });
    // The first two in packed caches.
    v.push_back({ v[0].c, true });
    v.push_back({ v[1].c, true });
    return v;
}

class concurrent_attention : public ::testing::TestWithParam<attention_case> {};

TEST_P(concurrent_attention, equals_serial_bit_for_bit) {
    const attn_case &base = GetParam().c;
    const bool packed = GetParam().packed;
    // One setup per worker: same shapes (so one primitive serves all), different data and block
    // tables (the seed comes from the tag).
    std::vector<attn_setup> setups;
    for (int w = 0; w < workers; ++w) {
        attn_case c = base;
        c.tag += "_w" + std::to_string(w);
        setups.push_back(build_setup(c));
        ASSERT_TRUE(setups.back().cache.md() == setups.front().cache.md());
        ASSERT_EQ(setups.back().b.num_blocks, setups.front().b.num_blocks);
    }
    const oracle::result ref0 = setups[0].oracle_on_cache(); // the packed caches hold the same values
    std::vector<any_caches> caches;
    if (packed) {
        for (const attn_setup &s : setups) {
            caches.push_back(write_any(s));
            ASSERT_EQ(caches.back().md.get_layout(), pa::layout::packed);
        }
    }
    const auto attention_desc = [&] {
        const attn_setup &s = setups[0];
        if (!packed) return s.desc();
        return pa::paged_attention::desc(
                pa::tensor_desc({ pa::runtime_dim, s.c.hq, s.c.d }, dt_of(s.c.q_fmt)), any_md(s), any_md(s),
                pa::tensor_desc({ pa::runtime_dim, s.c.hq, s.c.d }, dt_of(s.c.dst_fmt)), s.opts);
    };
    if (base.tag.rfind("split", 0) == 0 && tbb::this_task_arena::max_concurrency() > 1) {
        // The case is meant to split KV ranges (few work items for the threads).
        const pa::paged_attention::primitive_desc pd(engine(), attention_desc(), setups[0].attr());
        const attn_setup &s = setups[0];
        const pa::paged_attention::plan plan(
                pd, pa::tensor(pa::tensor_desc({ s.b.num_seqs }, pa::data_type::s32), s.b.seq_lens.data()),
                pa::tensor(pa::tensor_desc({ s.b.num_seqs + 1 }, pa::data_type::s32),
                           s.b.query_start_loc.data()));
        EXPECT_GT(plan.split_items(), 0) << "no KV range is split";
    }
    const size_t dst_bytes = setups[0].make_dst().size();

    for (pa::scratchpad_mode mode : { pa::scratchpad_mode::library, pa::scratchpad_mode::user }) {
        const bool user = mode == pa::scratchpad_mode::user;
        SCOPED_TRACE(user ? "user scratchpad" : "library scratchpad");
        pa::primitive_attr attr = setups[0].attr();
        attr.set_scratchpad_mode(mode);
        pa::paged_attention::primitive_desc pd(engine(), attention_desc(), attr);
        do {
            SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
            const pa::paged_attention prim(pd);
            // One plan, shared by the odd workers' concurrent executes (the even ones plan for
            // themselves): every worker has the same seq lens.
            const pa::paged_attention::plan plan(
                    pd,
                    pa::tensor(pa::tensor_desc({ setups[0].b.num_seqs }, pa::data_type::s32),
                               setups[0].b.seq_lens.data()),
                    pa::tensor(pa::tensor_desc({ setups[0].b.num_seqs + 1 }, pa::data_type::s32),
                               setups[0].b.query_start_loc.data()));
            const size_t scratch_bytes = pd.scratchpad_desc().get_size();
            if (user) {
                EXPECT_GT(scratch_bytes, 0u);
            } else {
                EXPECT_EQ(scratch_bytes, 0u);
            }
            std::vector<buffer> scratch;
            for (int w = 0; w < workers; ++w)
                scratch.emplace_back(scratch_bytes); // 0xFF-filled: stale scratch would show
            const auto args = [&](int w, void *dst, bool with_plan) {
                pa::exec_args a =
                        setups[static_cast<size_t>(w)].args(setups[static_cast<size_t>(w)].q.data(), dst);
                if (packed) {
                    const any_caches &k = caches[static_cast<size_t>(w)];
                    a[pa::ARG_K_CACHE] = pa::tensor(k.md, k.k.data());
                    a[pa::ARG_V_CACHE] = pa::tensor(k.md, k.v.data());
                    const int64_t nb = setups[0].b.num_blocks;
                    if (k.ks.kind != scales::none)
                        a[pa::ARG_K_SCALES] = pa::tensor(k.ks.md(nb, base.hkv, base.bs), k.ks.values.data());
                    if (k.vs.kind != scales::none)
                        a[pa::ARG_V_SCALES] = pa::tensor(k.vs.md(nb, base.hkv, base.bs), k.vs.values.data());
                }
                if (user)
                    a[pa::ARG_SCRATCHPAD] = pa::tensor(
                            pa::tensor_desc({ static_cast<int64_t>(scratch_bytes) }, pa::data_type::u8),
                            scratch[static_cast<size_t>(w)].data());
                if (with_plan) a[pa::ARG_PLAN] = plan.as_tensor();
                return a;
            };

            // Serial: each worker's inputs, one after the other.
            std::vector<buffer> serial;
            dnnl::stream st = make_stream();
            for (int w = 0; w < workers; ++w) {
                serial.emplace_back(dst_bytes);
                prim.execute(st, args(w, serial.back().data(), false));
                st.wait();
            }
            // The serial results are right (worker 0 against the oracle) and differ between workers.
            const comparison cmp = compare_attention(serial[0].data(), base.dst_fmt, ref0);
            EXPECT_EQ(cmp.failures, 0) << "serial worker 0 against the oracle: " << cmp;
            EXPECT_NE(std::memcmp(serial[0].data(), serial[1].data(), dst_bytes), 0) << "workers share data";

            for (int round = 0; round < rounds(); ++round) {
                const launch how = launch_of_round(round);
                SCOPED_TRACE("round " + std::to_string(round) + ", " + name_of(how));
                std::vector<buffer> out;
                for (int w = 0; w < workers; ++w)
                    out.emplace_back(dst_bytes);
                const std::vector<std::string> errors = run_concurrently(how, [&](int w) {
                    dnnl::stream s = make_stream();
                    // Twice, so that one worker's second execute overlaps others' first ones.
                    for (int rep = 0; rep < 2; ++rep) {
                        prim.execute(s, args(w, out[static_cast<size_t>(w)].data(), w % 2 == 1));
                        s.wait();
                    }
                });
                for (int w = 0; w < workers; ++w) {
                    EXPECT_EQ(errors[static_cast<size_t>(w)], "") << "worker " << w;
                    const auto &got = out[static_cast<size_t>(w)], &want = serial[static_cast<size_t>(w)];
                    size_t differing = 0, first = 0;
                    for (size_t i = dst_bytes; i-- > 0;)
                        if (got.data()[i] != want.data()[i]) {
                            ++differing;
                            first = i;
                        }
                    EXPECT_EQ(differing, 0u)
                            << "worker " << w << ": " << differing
                            << " bytes differ from the serial execute, the first at byte " << first;
                }
            }
        } while (pd.next_impl());
    }
}

INSTANTIATE_TEST_SUITE_P(batches, concurrent_attention, ::testing::ValuesIn(attention_cases()),
                         [](const ::testing::TestParamInfo<attention_case> &i) { return i.param.name(); });

// Executes in library scratchpad mode on a case whose plan splits KV ranges (the partial results
// live in scratch shared by the execute's tasks), launched two ways that make TBB run two
// executes nested on one thread: std::threads entering a 2-thread arena (a thread waiting inside
// one execute's loop runs another thread's delegated execute meanwhile) and the tasks of one
// tbb::parallel_for in that arena. Their scratch must still be apart. Many executes, as the
// nesting depends on how TBB steals; the serial executes run in the same arena, so that all plan
// for its 2 threads.
TEST(nested_executes, on_one_thread_keep_their_scratch_apart) {
    const attn_case base = attention_cases()[1].c;
    ASSERT_EQ(base.tag.rfind("split", 0), 0u);
    std::vector<attn_setup> setups;
    for (int w = 0; w < workers; ++w) {
        attn_case c = base;
        c.tag += "_w" + std::to_string(w);
        setups.push_back(build_setup(c));
    }
    tbb::task_arena arena(2);
    pa::paged_attention::primitive_desc pd(engine(), setups[0].desc(), setups[0].attr());
    const size_t dst_bytes = setups[0].make_dst().size();
    constexpr int executes = 32; // per launch and repeat; execute e computes worker e % 8's inputs
    const int repeats = reduced() ? 2 : 4;
    do {
        SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
        const pa::paged_attention prim(pd);
        const auto run = [&](int e, void *dst) {
            const attn_setup &s = setups[static_cast<size_t>(e % workers)];
            dnnl::stream st = make_stream();
            prim.execute(st, s.args(s.q.data(), dst));
        };
        std::vector<buffer> serial;
        for (int w = 0; w < workers; ++w) {
            serial.emplace_back(dst_bytes);
            execute_in(arena, [&] { run(w, serial.back().data()); });
        }
        for (const bool as_tasks : { false, true }) {
            SCOPED_TRACE(as_tasks ? "tbb::parallel_for tasks in the arena" : "std::threads into the arena");
            int wrong = 0;
            std::vector<std::string> errors(executes);
            for (int repeat = 0; repeat < repeats; ++repeat) {
                std::vector<buffer> out;
                for (int e = 0; e < executes; ++e)
                    out.emplace_back(dst_bytes);
                const auto body = [&](int e) {
                    try {
                        run(e, out[static_cast<size_t>(e)].data());
                    } catch (const std::exception &x) {
                        errors[static_cast<size_t>(e)] = x.what();
                    }
                };
                if (as_tasks) {
                    execute_in(arena, [&] { for_each_task(executes, body); });
                } else {
                    std::vector<std::thread> threads;
                    for (int e = 0; e < executes; ++e)
                        threads.emplace_back([&, e] { execute_in(arena, [&] { body(e); }); });
                    for (auto &t : threads)
                        t.join();
                }
                for (int e = 0; e < executes; ++e)
                    if (std::memcmp(out[static_cast<size_t>(e)].data(),
                                    serial[static_cast<size_t>(e % workers)].data(), dst_bytes) != 0)
                        ++wrong;
            }
            for (const std::string &x : errors)
                EXPECT_EQ(x, "");
            EXPECT_EQ(wrong, 0) << "of " << executes * repeats << " executes, " << wrong
                                << " differ from the serial ones";
        }
    } while (pd.next_impl());
}

// ---------------------------------------------------------------------------------------------
// reshape_and_cache

struct reshape_case {
    std::string name;
    format in, cache;
    int64_t hkv, bs, d;
    bool any_layout; // layout::any (packed where it applies) or dense plain
    scales ks, vs;
};
void PrintTo(const reshape_case &c, std::ostream *os) {
    *os << c.name;
}

std::vector<reshape_case> reshape_cases() {
    return {
        { "e4m3_token_packed", format::bf16, format::e4m3, 2, 16, 128, true, scales::per_token,
          scales::per_token },
        { "bf16_plain", format::f32, format::bf16, 4, 16, 64, false, scales::none, scales::none },
        { "e5m2_token_head_plain", format::f16, format::e5m2, 2, 32, 80, false, scales::per_token,
          scales::per_kv_head },
    };
}

/// One worker's inputs and caches.
struct reshape_work {
    buffer key, value;
    std::vector<int64_t> slots;
    buffer k_cache, v_cache;
    scales_spec ks, vs;
};

class concurrent_reshape : public ::testing::TestWithParam<reshape_case> {};

TEST_P(concurrent_reshape, equals_serial_bit_for_bit) {
    const reshape_case &c = GetParam();
    const int64_t tokens = reduced() ? 500 : 1500;
    const int64_t nb = (tokens + c.bs - 1) / c.bs + 4;
    const pa::dims dims { nb, c.hkv, c.bs, c.d };
    const pa::tensor_desc cache = c.any_layout ? pa::tensor_desc(dims, dt_of(c.cache), pa::layout::any)
                                               : pa::tensor_desc(dims, dt_of(c.cache));
    const pa::tensor_desc kv_md({ pa::runtime_dim, c.hkv, c.d }, dt_of(c.in));
    pa::primitive_attr attr;
    if (c.ks != scales::none) attr.set_scales_mask(pa::ARG_K_CACHE, scales_mask(c.ks));
    if (c.vs != scales::none) attr.set_scales_mask(pa::ARG_V_CACHE, scales_mask(c.vs));
    pa::reshape_and_cache::primitive_desc pd(engine(),
                                             pa::reshape_and_cache::desc(kv_md, kv_md, cache, cache), attr);
    const pa::tensor_desc cache_md = pd.query_md(pa::ARG_K_CACHE);
    const size_t cache_bytes = cache_md.get_size();

    // Per worker: its own tokens (a few skipped) and slots (a shuffled subset of the cache).
    std::vector<reshape_work> inputs(workers);
    for (int w = 0; w < workers; ++w) {
        reshape_work &in = inputs[static_cast<size_t>(w)];
        rng r(seed_of(c.name + std::to_string(w)));
        const size_t n = static_cast<size_t>(tokens * c.hkv * c.d);
        in.key = buffer(n * static_cast<size_t>(size_of(c.in)));
        in.value = buffer(in.key.size());
        std::vector<float> k(n), v(n);
        for (auto &x : k)
            x = r.coarse_normal();
        for (auto &x : v)
            x = r.coarse_normal();
        add_outliers(k, 3, r);
        for (size_t i = 0; i < n; ++i) {
            store_exact(in.key.data(), c.in, static_cast<int64_t>(i), k[i]);
            store_exact(in.value.data(), c.in, static_cast<int64_t>(i), v[i]);
        }
        std::vector<int64_t> perm(static_cast<size_t>(nb * c.bs));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), r.engine());
        perm.resize(static_cast<size_t>(tokens));
        for (size_t i = 7; i < perm.size(); i += 97)
            perm[i] = -1;
        in.slots = perm;
    }
    const auto fresh = [&](reshape_work &x) { // NaN-filled caches and per-token scales
        x.k_cache = buffer(cache_bytes);
        x.v_cache = buffer(cache_bytes);
        x.ks = make_scales(c.ks, 0.037f, 5.3f, nb, c.hkv, c.bs);
        x.vs = make_scales(c.vs, 5.3f, 0.037f, nb, c.hkv, c.bs);
    };
    const auto args = [&](const reshape_work &in, reshape_work &out) {
        const pa::tensor_desc run({ tokens, c.hkv, c.d }, dt_of(c.in));
        pa::exec_args a {
            { pa::ARG_KEY, pa::tensor(run, in.key.data()) },
            { pa::ARG_VALUE, pa::tensor(run, in.value.data()) },
            { pa::ARG_K_CACHE, pa::tensor(cache_md, out.k_cache.data()) },
            { pa::ARG_V_CACHE, pa::tensor(pd.query_md(pa::ARG_V_CACHE), out.v_cache.data()) },
            { pa::ARG_SLOT_MAPPING,
              pa::tensor(pa::tensor_desc({ tokens }, pa::data_type::s64), in.slots.data()) },
        };
        if (c.ks != scales::none)
            a[pa::ARG_K_SCALES] = pa::tensor(out.ks.md(nb, c.hkv, c.bs), out.ks.values.data());
        if (c.vs != scales::none)
            a[pa::ARG_V_SCALES] = pa::tensor(out.vs.md(nb, c.hkv, c.bs), out.vs.values.data());
        return a;
    };
    const auto same = [](const std::vector<float> &a, const std::vector<float> &b) {
        return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    };

    do {
        SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
        const pa::reshape_and_cache prim(pd);
        std::vector<reshape_work> serial(workers);
        dnnl::stream st = make_stream();
        for (int w = 0; w < workers; ++w) {
            fresh(serial[static_cast<size_t>(w)]);
            prim.execute(st, args(inputs[static_cast<size_t>(w)], serial[static_cast<size_t>(w)]));
            st.wait();
        }
        // Something was written, and differently per worker.
        EXPECT_NE(std::memcmp(serial[0].k_cache.data(), serial[1].k_cache.data(), cache_bytes), 0);
        buffer untouched(cache_bytes);
        EXPECT_NE(std::memcmp(serial[0].v_cache.data(), untouched.data(), cache_bytes), 0);

        for (int round = 0; round < rounds(); ++round) {
            const launch how = launch_of_round(round);
            SCOPED_TRACE("round " + std::to_string(round) + ", " + name_of(how));
            std::vector<reshape_work> out(workers);
            for (int w = 0; w < workers; ++w)
                fresh(out[static_cast<size_t>(w)]);
            const std::vector<std::string> errors = run_concurrently(how, [&](int w) {
                dnnl::stream s = make_stream();
                for (int rep = 0; rep < 2; ++rep) { // idempotent: the same tokens to the same slots
                    prim.execute(s, args(inputs[static_cast<size_t>(w)], out[static_cast<size_t>(w)]));
                    s.wait();
                }
            });
            for (int w = 0; w < workers; ++w) {
                const reshape_work &got = out[static_cast<size_t>(w)], &want = serial[static_cast<size_t>(w)];
                EXPECT_EQ(errors[static_cast<size_t>(w)], "") << "worker " << w;
                EXPECT_EQ(std::memcmp(got.k_cache.data(), want.k_cache.data(), cache_bytes), 0)
                        << "worker " << w << " K cache";
                EXPECT_EQ(std::memcmp(got.v_cache.data(), want.v_cache.data(), cache_bytes), 0)
                        << "worker " << w << " V cache";
                EXPECT_TRUE(same(got.ks.values, want.ks.values)) << "worker " << w << " K scales";
                EXPECT_TRUE(same(got.vs.values, want.vs.values)) << "worker " << w << " V scales";
            }
        }
    } while (pd.next_impl());
}

INSTANTIATE_TEST_SUITE_P(caches, concurrent_reshape, ::testing::ValuesIn(reshape_cases()),
                         [](const ::testing::TestParamInfo<reshape_case> &i) { return i.param.name; });

} // namespace
