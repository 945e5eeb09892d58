// pagedattn_bench: times paged_attention and reshape_and_cache against the machine's ceilings,
// measured in the same run: DRAM read bandwidth (all threads, 1 GiB) and oneDNN's bf16 matmul
// (2048^3, bf16 in, f32 out; on a host where oneDNN has no bf16 matmul, the f32 one is prefill's
// ceiling, and the table says so). Every figure is a median of repetitions after a warm-up; decode and
// reshape cases flush the caches before each repetition so that their memory traffic is real. The
// cache types of one shape alternate repetition by repetition, so drift does not bias their ratios.
//
//   pagedattn_bench [--csv PATH] [--filter decode|verify|prefill|reshape] [--reps N] [--no-flush]
//                  [--context N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>
#include <tbb/task_arena.h>

#include "pagedattn/pagedattn.hpp"

namespace {

using namespace pagedattn;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) {
    return std::chrono::duration<double>(clock_type::now() - t).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Evicts the caches by reading 96 MiB, three times the L3, one word per cache line. Reading, not
// writing: a written buffer would leave the caches full of dirty lines, whose write-backs would
// then compete with the timed case's own traffic.
void flush_caches() {
    static std::vector<uint64_t> buffer(size_t(96) << 17, 1); // 96 MiB of 8-byte words
    static volatile uint64_t sink;
    sink = sink + tbb::parallel_reduce(
                          tbb::blocked_range<size_t>(0, buffer.size(), size_t(1) << 17), uint64_t(0),
                          [&](const tbb::blocked_range<size_t> &r, uint64_t acc) {
                              for (size_t i = r.begin(); i < r.end(); i += 8)
                                  acc += buffer[i];
                              return acc;
                          },
                          std::plus<uint64_t>());
}

__attribute__((target("avx2"))) uint64_t sum_words_avx2(const uint64_t *p, size_t n) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= n; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
    }
    return s0 + s1 + s2 + s3;
}

double measure_dram_read_gb_per_s(int reps) {
    const size_t bytes = size_t(1) << 30, words = bytes / 8;
    std::vector<uint64_t> data(words);
    tbb::parallel_for(tbb::blocked_range<size_t>(0, words), [&](const tbb::blocked_range<size_t> &r) {
        for (size_t i = r.begin(); i != r.end(); ++i)
            data[i] = i;
    });
    std::vector<double> times;
    uint64_t sink = 0;
    for (int rep = 0; rep < reps; ++rep) {
        const auto start = clock_type::now();
        sink += tbb::parallel_reduce(
                tbb::blocked_range<size_t>(0, words, 1 << 17), uint64_t(0),
                [&](const tbb::blocked_range<size_t> &r, uint64_t acc) {
                    return acc + sum_words_avx2(data.data() + r.begin(), r.size());
                },
                std::plus<uint64_t>());
        times.push_back(seconds_since(start));
    }
    if (sink == 42) std::puts("");
    return bytes / median(times) / 1e9;
}

// oneDNN matmul 2048^3 with inputs of type `in` and an f32 output; 0 where oneDNN has none for it
// on this host (oneDNN 2.6 has no bf16 matmul without AVX-512).
double measure_matmul_gflop_per_s(dnnl::memory::data_type in, int reps) {
    try {
        const dnnl::memory::dim n = 2048;
        dnnl::engine eng(dnnl::engine::kind::cpu, 0);
        dnnl::stream s(eng);
        using tag = dnnl::memory::format_tag;
        using dt = dnnl::memory::data_type;
        dnnl::memory::desc a({ n, n }, in, tag::ab), b({ n, n }, in, tag::ab), c({ n, n }, dt::f32, tag::ab);
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), eng);
        dnnl::matmul mm(pd);
        dnnl::memory ma(a, eng), mb(b, eng), mc(c, eng);
        std::memset(ma.get_data_handle(), 0x3C, a.get_size()); // ~0.011 in f32, ~0.011 in bf16
        std::memset(mb.get_data_handle(), 0x3C, b.get_size());
        std::vector<double> times;
        for (int rep = -2; rep < reps; ++rep) {
            const auto start = clock_type::now();
            mm.execute(s, { { DNNL_ARG_SRC, ma }, { DNNL_ARG_WEIGHTS, mb }, { DNNL_ARG_DST, mc } });
            s.wait();
            if (rep >= 0) times.push_back(seconds_since(start));
        }
        return 2.0 * n * n * n / median(times) / 1e9;
    } catch (const dnnl::error &) {
        return 0.0;
    }
}

struct row {
    std::string kind, cache, impl;
    long batch, q_len, context, block_size, threads;
    double median_ms, gb_per_s, gflop_per_s, fraction_of_ceiling;
};

struct config {
    std::string csv, filter;
    int reps = 20;
    bool flush = true; // --no-flush: caches stay warm (diagnosis: compute vs memory)
    long context = 0;  // --context N: only the decode shapes of that context (while tuning a kernel)
    double dram = 0, matmul_bf16 = 0, matmul_f32 = 0;
    // Prefill's ceiling: the bf16 matmul, or where the host has none the f32 one.
    double matmul() const { return matmul_bf16 > 0 ? matmul_bf16 : matmul_f32; }
    std::vector<row> rows;
    bool wants(const char *kind) const { return filter.empty() || filter == kind; }
};

// Random cache bytes that decode to finite values of moderate size for every cache type.
void fill_cache(std::vector<uint8_t> &bytes, data_type dt, uint32_t seed) {
    std::mt19937 rng(seed);
    const size_t element = data_type_size(dt);
    for (size_t i = 0; i < bytes.size(); i += element) {
        const uint32_t r = rng();
        switch (dt) {
            case data_type::f8_e4m3: bytes[i] = static_cast<uint8_t>((r & 0x80) | (0x20 + r % 0x30)); break;
            case data_type::f8_e5m2: bytes[i] = static_cast<uint8_t>((r & 0x80) | (0x30 + r % 0x18)); break;
            case data_type::f32: {
                const float v = (static_cast<int>(r % 2001) - 1000) / 1000.f;
                std::memcpy(&bytes[i], &v, 4);
                break;
            }
            default: { // bf16 and f16: a sign, a moderate exponent, random mantissa
                const uint16_t v = static_cast<uint16_t>(
                        (r & 0x8000) | (dt == data_type::bf16 ? 0x3C00 : 0x3000) | (r & 0x3FF));
                std::memcpy(&bytes[i], &v, 2);
                break;
            }
        }
    }
}

// One attention shape with its caches; run() executes one step.
struct attention_case {
    long batch, q_len, context, block_size;
    data_type cache_type;
    bool causal;
    dim hq = 32, hkv = 8, d = 128;
    std::vector<uint8_t> k_cache, v_cache;
    std::vector<uint16_t> query, dst;
    std::vector<int32_t> block_table, seq_lens, query_start_loc;
    paged_attention::primitive_desc pd;
    paged_attention primitive;
    tensor_desc cache_md;

    attention_case(long batch_, long q_len_, long context_, long block_size_, data_type dt, bool causal_)
        : batch(batch_), q_len(q_len_), context(context_), block_size(block_size_), cache_type(dt),
          causal(causal_) {
        dnnl::engine eng(dnnl::engine::kind::cpu, 0);
        const dim blocks_per_seq = (context + block_size - 1) / block_size;
        const dim num_blocks = batch * blocks_per_seq;
        paged_attention::options o;
        o.causal = causal;
        pd = paged_attention::primitive_desc(
                eng, paged_attention::desc({ { runtime_dim, hq, d }, data_type::bf16 },
                                           { { num_blocks, hkv, block_size, d }, dt, layout::any },
                                           { { num_blocks, hkv, block_size, d }, dt, layout::any },
                                           { { runtime_dim, hq, d }, data_type::bf16 }, o));
        primitive = paged_attention(pd);
        cache_md = pd.query_md(ARG_K_CACHE);
        k_cache.resize(cache_md.get_size());
        v_cache.resize(cache_md.get_size());
        fill_cache(k_cache, dt, 1);
        fill_cache(v_cache, dt, 2);
        const long tokens = batch * q_len;
        query.assign(static_cast<size_t>(tokens * hq * d), 0x3C00);
        dst.assign(query.size(), 0);
        std::mt19937 rng(3);
        for (auto &x : query)
            x = static_cast<uint16_t>(0x3E00 | (rng() & 0x7F) | (rng() & 0x8000));
        std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
        for (size_t i = 0; i < blocks.size(); ++i)
            blocks[i] = static_cast<int32_t>(i);
        std::shuffle(blocks.begin(), blocks.end(), rng); // a realistic, scattered block table
        block_table = blocks;
        seq_lens.assign(static_cast<size_t>(batch), static_cast<int32_t>(context));
        for (long s = 0; s <= batch; ++s)
            query_start_loc.push_back(static_cast<int32_t>(s * q_len));
    }

    void run(const dnnl::stream &s) {
        const dim tokens = batch * q_len;
        const dim width = static_cast<dim>(block_table.size()) / batch;
        primitive.execute(
                s,
                { { ARG_QUERY, tensor({ { tokens, hq, d }, data_type::bf16 }, query.data()) },
                  { ARG_K_CACHE, tensor(cache_md, k_cache.data()) },
                  { ARG_V_CACHE, tensor(cache_md, v_cache.data()) },
                  { ARG_BLOCK_TABLE, tensor({ { batch, width }, data_type::s32 }, block_table.data()) },
                  { ARG_SEQ_LENS, tensor({ { batch }, data_type::s32 }, seq_lens.data()) },
                  { ARG_QUERY_START_LOC, tensor({ { batch + 1 }, data_type::s32 }, query_start_loc.data()) },
                  { ARG_DST, tensor({ { tokens, hq, d }, data_type::bf16 }, dst.data()) } });
    }

    double cache_bytes() const { return 2.0 * batch * context * hkv * d * data_type_size(cache_type); }
    double flops() const {
        const double pairs = causal ? batch * (q_len * (context - q_len) + q_len * (q_len + 1) / 2.0)
                                    : double(batch) * q_len * context;
        return 4.0 * hq * d * pairs;
    }
};

void report(config &cfg, const std::string &kind, const attention_case &c, long threads, double seconds) {
    row r;
    r.kind = kind;
    r.cache = data_type_name(c.cache_type);
    r.impl = c.pd.impl_info_str();
    r.batch = c.batch;
    r.q_len = c.q_len;
    r.context = c.context;
    r.block_size = c.block_size;
    r.threads = threads;
    r.median_ms = seconds * 1e3;
    r.gb_per_s = c.cache_bytes() / seconds / 1e9;
    r.gflop_per_s = c.flops() / seconds / 1e9;
    r.fraction_of_ceiling =
            kind == "prefill" ? (cfg.matmul() > 0 ? r.gflop_per_s / cfg.matmul() : 0) : r.gb_per_s / cfg.dram;
    cfg.rows.push_back(r);
    std::printf("%-8s %5ld %5ld %7ld %-8s %5ld %3ld %-16s %10.3f %8.1f %8.1f %6.2f\n", r.kind.c_str(),
                r.batch, r.q_len, r.context, r.cache.c_str(), r.block_size, r.threads, r.impl.c_str(),
                r.median_ms, r.gb_per_s, r.gflop_per_s, r.fraction_of_ceiling);
    std::fflush(stdout);
}

// Times the cases of one shape with alternating repetitions; the reference is never timed on
// large cases (it would take minutes and say nothing about the kernels).
void time_alternating(config &cfg, const std::string &kind, std::vector<attention_case *> cases, long threads,
                      bool flush) {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    tbb::task_arena arena(static_cast<int>(threads));
    std::vector<std::vector<double>> times(cases.size());
    for (attention_case *c : cases)
        if (std::string(c->pd.impl_info_str()) == "ref:any" && c->batch * c->context * c->q_len > 8192) {
            std::printf("%-8s %5ld %5ld %7ld %-8s: only ref:any accepts it; not timed\n", kind.c_str(),
                        c->batch, c->q_len, c->context, data_type_name(c->cache_type));
            return;
        }
    for (int rep = -2; rep < cfg.reps; ++rep) {
        for (size_t i = 0; i < cases.size(); ++i) {
            if (flush && cfg.flush) flush_caches();
            const auto start = clock_type::now();
            arena.execute([&] { cases[i]->run(s); });
            if (rep >= 0) times[i].push_back(seconds_since(start));
        }
    }
    for (size_t i = 0; i < cases.size(); ++i)
        report(cfg, kind, *cases[i], threads, median(times[i]));
}

void run_attention(config &cfg) {
    const data_type types[] = { data_type::bf16, data_type::f8_e4m3, data_type::f8_e5m2 };
    if (cfg.wants("decode")) {
        // 1 and 8 sequences of one context alternate too: their GB/s are compared.
        for (long context : { 128L, 512L, 2048L, 8192L, 32768L })
            for (long block_size : { 128L, 16L }) {
                if (block_size == 16 && context != 8192) continue; // 16 is reported beside, at one size
                if (cfg.context && context != cfg.context) continue;
                std::vector<attention_case> cases;
                cases.reserve(6);
                for (long batch : { 1L, 8L })
                    for (data_type dt : types)
                        cases.emplace_back(batch, 1, context, block_size, dt, true);
                std::vector<attention_case *> pointers;
                for (attention_case &c : cases)
                    pointers.push_back(&c);
                time_alternating(cfg, "decode", pointers, 2, true);
            }
        std::vector<attention_case> cases;
        cases.reserve(2);
        cases.emplace_back(1, 1, 8192, 128, data_type::bf16, true);
        cases.emplace_back(1, 1, 8192, 128, data_type::f8_e4m3, true);
        time_alternating(cfg, "decode", { &cases[0], &cases[1] }, 1, true);
    }
    if (cfg.wants("verify")) {
        std::vector<attention_case> cases;
        cases.reserve(4);
        for (long q_len : { 4L, 1L })
            for (data_type dt : { data_type::bf16, data_type::f8_e4m3 })
                cases.emplace_back(8, q_len, 2048, 128, dt, true);
        time_alternating(cfg, "verify", { &cases[0], &cases[1], &cases[2], &cases[3] }, 2, true);
    }
    if (cfg.wants("prefill")) {
        for (long n : { 512L, 2048L }) {
            std::vector<attention_case> cases;
            cases.reserve(2);
            for (data_type dt : { data_type::bf16, data_type::f8_e4m3 })
                cases.emplace_back(1, n, n, 128, dt, true);
            time_alternating(cfg, "prefill", { &cases[0], &cases[1] }, 2, false);
        }
    }
}

void run_reshape(config &cfg) {
    if (!cfg.wants("reshape")) return;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    const dim tokens = 4096, hkv = 8, d = 128, bs = 128, blocks = tokens / bs;
    std::vector<uint16_t> key(static_cast<size_t>(tokens * hkv * d)), value(key.size());
    std::mt19937 rng(5);
    for (auto &x : key)
        x = static_cast<uint16_t>(0x3C00 | (rng() & 0x3FF) | (rng() & 0x8000));
    for (auto &x : value)
        x = static_cast<uint16_t>(0x3C00 | (rng() & 0x3FF) | (rng() & 0x8000));
    std::vector<int64_t> slots(static_cast<size_t>(tokens));
    for (dim t = 0; t < tokens; ++t)
        slots[static_cast<size_t>(t)] = t;
    for (data_type dt : { data_type::bf16, data_type::f8_e4m3 }) {
        primitive_attr attr;
        if (dt == data_type::f8_e4m3) {
            attr.set_scales_mask(ARG_K_CACHE, scales_per_token);
            attr.set_scales_mask(ARG_V_CACHE, scales_per_token);
        }
        const tensor_desc kv({ runtime_dim, hkv, d }, data_type::bf16),
                cache({ blocks, hkv, bs, d }, dt, layout::any);
        reshape_and_cache::primitive_desc pd(eng, reshape_and_cache::desc(kv, kv, cache, cache), attr);
        reshape_and_cache prim(pd);
        const tensor_desc cmd = pd.query_md(ARG_K_CACHE);
        std::vector<uint8_t> kc(cmd.get_size()), vc(cmd.get_size());
        std::vector<float> ks(static_cast<size_t>(blocks * hkv * bs)), vs(ks.size());
        exec_args args = { { ARG_KEY, tensor({ { tokens, hkv, d }, data_type::bf16 }, key.data()) },
                           { ARG_VALUE, tensor({ { tokens, hkv, d }, data_type::bf16 }, value.data()) },
                           { ARG_K_CACHE, tensor(cmd, kc.data()) },
                           { ARG_V_CACHE, tensor(cmd, vc.data()) },
                           { ARG_SLOT_MAPPING, tensor({ { tokens }, data_type::s64 }, slots.data()) } };
        if (dt == data_type::f8_e4m3) {
            args[ARG_K_SCALES] = tensor({ { blocks, hkv, bs }, data_type::f32 }, ks.data());
            args[ARG_V_SCALES] = tensor({ { blocks, hkv, bs }, data_type::f32 }, vs.data());
        }
        tbb::task_arena arena(2);
        std::vector<double> times;
        for (int rep = -2; rep < cfg.reps; ++rep) {
            flush_caches();
            const auto start = clock_type::now();
            arena.execute([&] { prim.execute(s, args); });
            if (rep >= 0) times.push_back(seconds_since(start));
        }
        const double seconds = median(times);
        const double bytes = 2.0 * tokens * hkv * d * (2 + data_type_size(dt)) +
                             (dt == data_type::f8_e4m3 ? 2.0 * tokens * hkv * 4 : 0);
        row r { "reshape", data_type_name(dt), pd.impl_info_str(),    1, tokens, 0, bs,
                2,         seconds * 1e3,      bytes / seconds / 1e9, 0, 0 };
        r.fraction_of_ceiling = r.gb_per_s / cfg.dram;
        cfg.rows.push_back(r);
        std::printf("%-8s %5d %5ld %7d %-8s %5ld %3d %-16s %10.3f %8.1f %8.1f %6.2f\n", "reshape", 1,
                    (long)tokens, 0, r.cache.c_str(), (long)bs, 2, r.impl.c_str(), r.median_ms, r.gb_per_s,
                    0.0, r.fraction_of_ceiling);
    }
}

} // namespace

int main(int argc, char **argv) {
    config cfg;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--csv" && i + 1 < argc)
            cfg.csv = argv[++i];
        else if (a == "--filter" && i + 1 < argc)
            cfg.filter = argv[++i];
        else if (a == "--no-flush")
            cfg.flush = false;
        else if (a == "--reps" && i + 1 < argc)
            cfg.reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--context" && i + 1 < argc)
            cfg.context = std::atol(argv[++i]);
        else {
            std::printf("usage: %s [--csv PATH] [--filter decode|verify|prefill|reshape] [--reps N] "
                        "[--no-flush] [--context N]\n",
                        argv[0]);
            return a == "--help" ? 0 : 2;
        }
    }
    try {
        std::printf("host ISA %s, threads %d\n", cpu_isa_name(get_max_cpu_isa()),
                    tbb::this_task_arena::max_concurrency());
        cfg.dram = measure_dram_read_gb_per_s(std::max(5, cfg.reps / 4));
        cfg.matmul_bf16 =
                measure_matmul_gflop_per_s(dnnl::memory::data_type::bf16, std::max(5, cfg.reps / 4));
        cfg.matmul_f32 = measure_matmul_gflop_per_s(dnnl::memory::data_type::f32, std::max(5, cfg.reps / 4));
        std::printf(
                "ceiling: DRAM read %.1f GB/s, oneDNN matmul 2048^3 bf16 %.1f GFLOP/s%s, f32 %.1f GFLOP/s\n",
                cfg.dram, cfg.matmul_bf16, cfg.matmul_bf16 > 0 ? "" : " (none on this host)", cfg.matmul_f32);
        std::printf("frac: GB/s over DRAM read (decode, verify, reshape), GFLOP/s over the %s matmul "
                    "(prefill)\n\n",
                    cfg.matmul_bf16 > 0 ? "bf16" : "f32");
        std::printf("%-8s %5s %5s %7s %-8s %5s %3s %-16s %10s %8s %8s %6s\n", "kind", "batch", "q_len",
                    "context", "cache", "bs", "thr", "impl", "median_ms", "GB/s", "GFLOP/s", "frac");
        run_attention(cfg);
        run_reshape(cfg);
    } catch (const pagedattn::error &e) {
        std::fprintf(stderr, "pagedattn_bench: %s\n", e.what());
        return 1;
    }
    if (!cfg.csv.empty()) {
        std::ofstream out(cfg.csv);
        out << "kind,batch,q_len,context,cache,block_size,threads,median_ms,gb_per_s,gflop_per_s,fraction_of_"
               "ceiling,impl\n";
        out << "ceiling_dram_read,0,0,0,,0,0,0," << cfg.dram << ",0,1,\n";
        out << "ceiling_bf16_matmul,0,0,0,,0,0,0,0," << cfg.matmul_bf16 << ",1,\n";
        out << "ceiling_f32_matmul,0,0,0,,0,0,0,0," << cfg.matmul_f32 << ",1,\n";
        for (const row &r : cfg.rows)
            out << r.kind << ',' << r.batch << ',' << r.q_len << ',' << r.context << ',' << r.cache << ','
                << r.block_size << ',' << r.threads << ',' << r.median_ms << ',' << r.gb_per_s << ','
                << r.gflop_per_s << ',' << r.fraction_of_ceiling << ',' << r.impl << '\n';
    }
    return 0;
}
