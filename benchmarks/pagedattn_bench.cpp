// pagedattn_bench: times paged_attention and reshape_and_cache against the machine's ceilings,
// measured in the same run: DRAM read bandwidth (all threads, 1 GiB) and oneDNN's bf16 matmul
// (2048^3, bf16 in, f32 out; on a host where oneDNN has no bf16 matmul, the f32 one is prefill's
// ceiling, and the table says so). Every figure is a median of repetitions after a warm-up (--filter
// cost's: the fastest repetition); decode and
// reshape cases flush the caches before each repetition so that their memory traffic is real. The
// cases of one shape alternate repetition by repetition, and with them the ceiling they are compared
// with, so that drift biases neither their ratios nor their fractions of the ceiling. The ceilings are
// also measured once at the start (the header line and the CSV's ceiling rows).
//
//   pagedattn_bench [--csv PATH] [--filter decode|verify|prefill|reshape|cost] [--reps N] [--no-flush]
//                  [--small-pages] [--context N] [--isa LIST] [--kv-heads N] [--block-size N]
//                  [--scales per-token] [--layout plain|packed]
// --isa avx2,avx512,avx512_bf16,amx,all runs every case once per ISA cap of the list (the attribute
// primitive_attr::set_max_cpu_isa on both primitives), so that one run compares the implementations:
// the impl column names what each cap chose.
// --kv-heads 1|2|4|8 runs the attention cases as one rank of a tensor-parallel deployment sees them:
// N kv heads and 4N q heads (GQA 4, as 32/8), the batch 8/N times larger, so that every case reads
// the cache bytes and does the products of its 32/8 form; the batch column shows the larger batch.
// --block-size N: every attention case's cache blocks hold N tokens (by default decode runs 128 and
// 16, the other kinds 128). Neither changes --filter cost or reshape.
// --scales per-token: the FP8 attention cases read one f32 scale per cached token and kv head for K
// and for V, as reshape_and_cache's dynamic scales write them (the demo's cache); their cache column
// says so and their GB/s count the scales' bytes. By default FP8 caches have no scales (1).
// --layout plain: the attention cases' caches (--filter cost's too) in the plain layout, HND, which
// every implementation reads but x64:avx512_bf16 and x64:amx (cache column "/plain"); packed is what
// `any` resolves to for these shapes, the default.
// reshape writes e4m3 with per-token scales and, as "f8_e4m3/tensor", with one per-tensor scale for K
// and V each, into the packed layout, and as "f8_e4m3/plain" with per-token scales into vLLM's
// [blocks, kv heads, block size, head size].
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <immintrin.h>
#include <sys/mman.h>

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

// The large buffers (KV caches, the ceiling's 1 GiB, the flush's 96 MiB): mapped whole and, unless
// --small-pages, advised to use transparent huge pages, as an inference engine allocating its KV
// cache would. With 4 KiB pages nearly every 4 KiB of a scattered cache block costs a page walk:
// on the development VM decode ran 4-8% slower and verify ~10% slower. The ceiling's buffer gets
// the same pages as the cases.
template <typename T> class big_array {
public:
    big_array() = default;
    big_array(size_t n, bool huge_pages, T value = T()) : size_(n) {
        if (n == 0) return;
        bytes_ = (n * sizeof(T) + (size_t(2) << 20) - 1) / (size_t(2) << 20) * (size_t(2) << 20);
        void *p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        if (huge_pages) madvise(p, bytes_, MADV_HUGEPAGE); // a hint: without THP it is ignored
        data_ = static_cast<T *>(p);
        std::fill(data_, data_ + n, value);
    }
    big_array(big_array &&o) noexcept { swap(o); }
    big_array &operator=(big_array &&o) noexcept {
        swap(o);
        return *this;
    }
    big_array(const big_array &) = delete;
    big_array &operator=(const big_array &) = delete;
    ~big_array() {
        if (data_) munmap(data_, bytes_);
    }
    T *data() const { return data_; }
    size_t size() const { return size_; }
    T &operator[](size_t i) const { return data_[i]; }

private:
    void swap(big_array &o) noexcept {
        std::swap(data_, o.data_);
        std::swap(size_, o.size_);
        std::swap(bytes_, o.bytes_);
    }
    T *data_ = nullptr;
    size_t size_ = 0, bytes_ = 0;
};

// Evicts the caches by reading 96 MiB, three times the L3, one word per cache line. Reading, not
// writing: a written buffer would leave the caches full of dirty lines, whose write-backs would
// then compete with the timed case's own traffic.
void flush_caches(const big_array<uint64_t> &buffer) { // 96 MiB of 8-byte words
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

// One (block, head) region read whole while every line of a later one is prefetched, as the
// kernels read a cache (T1: into L2, one prefetch per line).
__attribute__((target("avx2"))) uint64_t read_region_avx2(const char *region, const char *next,
                                                          size_t bytes) {
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (size_t o = 0; o < bytes; o += 64) {
        _mm_prefetch(next + o, _MM_HINT_T1);
        s0 = _mm256_add_epi64(s0, _mm256_load_si256(reinterpret_cast<const __m256i *>(region + o)));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256(reinterpret_cast<const __m256i *>(region + o + 32)));
    }
    alignas(32) uint64_t lanes[4];
    _mm256_store_si256(reinterpret_cast<__m256i *>(lanes), _mm256_add_epi64(s0, s1));
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

// The machine's ceilings, one repetition at a time: a group of cases alternates its repetitions
// with the ceiling it is compared with, so that the ratio sees the same machine (the bandwidth of a
// shared host drifts by 20% and more within minutes).
class ceilings {
public:
    explicit ceilings(bool huge_pages)
        : data_(size_t(1) << 27, huge_pages) { // 1 GiB of 8-byte words, written once so that pages exist
        tbb::parallel_for(tbb::blocked_range<size_t>(0, data_.size()),
                          [&](const tbb::blocked_range<size_t> &r) {
                              for (size_t i = r.begin(); i != r.end(); ++i)
                                  data_[i] = i;
                          });
        bf16_ = make_matmul(dnnl::memory::data_type::bf16);
        f32_ = make_matmul(dnnl::memory::data_type::f32);
    }
    ~ceilings() {
        if (sink_ == 42) std::puts(""); // the sums are used
    }

    /// One read of the 1 GiB with all threads.
    double dram_read_gb_per_s() {
        const auto start = clock_type::now();
        sink_ += tbb::parallel_reduce(
                tbb::blocked_range<size_t>(0, data_.size(), 1 << 17), uint64_t(0),
                [&](const tbb::blocked_range<size_t> &r, uint64_t acc) {
                    return acc + sum_words_avx2(data_.data() + r.begin(), r.size());
                },
                std::plus<uint64_t>());
        return data_.size() * 8.0 / seconds_since(start) / 1e9;
    }

    bool has_bf16_matmul() const { return bf16_ != nullptr; }
    /// One oneDNN matmul 2048^3, bf16 in and f32 out; 0 where oneDNN has none on this host (oneDNN
    /// 2.6 has no bf16 matmul without AVX-512).
    double bf16_matmul_gflop_per_s() { return bf16_ ? bf16_->run() : 0.0; }
    double f32_matmul_gflop_per_s() { return f32_ ? f32_->run() : 0.0; }
    /// Prefill's ceiling: the bf16 matmul, or where the host has none the f32 one.
    double prefill_gflop_per_s() { return bf16_ ? bf16_->run() : f32_matmul_gflop_per_s(); }

private:
    struct matmul {
        dnnl::engine eng { dnnl::engine::kind::cpu, 0 };
        dnnl::stream stream { eng };
        dnnl::matmul primitive;
        dnnl::memory a, b, c;
        static constexpr dnnl::memory::dim n = 2048;
        double run() {
            const auto start = clock_type::now();
            primitive.execute(stream, { { DNNL_ARG_SRC, a }, { DNNL_ARG_WEIGHTS, b }, { DNNL_ARG_DST, c } });
            stream.wait();
            return 2.0 * n * n * n / seconds_since(start) / 1e9;
        }
    };
    static std::unique_ptr<matmul> make_matmul(dnnl::memory::data_type in) {
        try {
            auto m = std::make_unique<matmul>();
            using tag = dnnl::memory::format_tag;
            const dnnl::memory::desc a({ matmul::n, matmul::n }, in, tag::ab),
                    b = a, c({ matmul::n, matmul::n }, dnnl::memory::data_type::f32, tag::ab);
            m->primitive = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), m->eng));
            m->a = dnnl::memory(a, m->eng);
            m->b = dnnl::memory(b, m->eng);
            m->c = dnnl::memory(c, m->eng);
            std::memset(m->a.get_data_handle(), 0x3C, a.get_size()); // ~0.011 in f32, ~0.011 in bf16
            std::memset(m->b.get_data_handle(), 0x3C, b.get_size());
            m->run(); // oneDNN's first execution sets up its kernels
            return m;
        } catch (const dnnl::error &) {
            return nullptr;
        }
    }
    big_array<uint64_t> data_;
    std::unique_ptr<matmul> bf16_, f32_;
    uint64_t sink_ = 0;
};

/// Median of `reps` repetitions of a ceiling after two warm-ups.
double median_of(int reps, const std::function<double()> &once) {
    std::vector<double> v;
    for (int rep = -2; rep < reps; ++rep) {
        const double x = once();
        if (rep >= 0) v.push_back(x);
    }
    return median(v);
}

struct row {
    std::string kind, cache, impl;
    long batch, q_len, context, block_size, threads;
    double median_ms, gb_per_s, gflop_per_s, fraction_of_ceiling;
    double ceiling;  // measured beside the case: DRAM read GB/s, or for prefill matmul GFLOP/s
    double walk = 0; // decode and verify: the walk ceiling's GB/s, measured beside the case (0: none)
};

struct config {
    std::string csv, filter;
    int reps = 20;
    bool flush = true;      // --no-flush: caches stay warm (diagnosis: compute vs memory)
    bool huge_pages = true; // --small-pages: 4 KiB pages for every buffer
    big_array<uint64_t> flush_buffer;
    long context = 0;    // --context N: only the decode shapes of that context (while tuning a kernel)
    long kv_heads = 8;   // --kv-heads N (q heads 4N, batches x 8/N)
    long block_size = 0; // --block-size N (0: the defaults)
    layout cache_layout = layout::any; // --layout plain: the attention cases' caches plain (HND)
    bool per_token_scales = false;     // --scales per-token: FP8 attention cases read per-token scales
    cpu_isa cap = cpu_isa::all;        // the cap of the current pass (--isa)
    std::unique_ptr<ceilings> machine;
    double dram = 0, matmul_bf16 = 0, matmul_f32 = 0; // measured at the start
    std::vector<row> rows;
    bool wants(const char *kind) const { return filter.empty() || filter == kind; }
};

// Random cache bytes that decode to finite values of moderate size for every cache type.
void fill_cache(big_array<uint8_t> &bytes, data_type dt, uint32_t seed) {
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
    dim hq, hkv, d = 128;
    big_array<uint8_t> k_cache, v_cache;
    std::vector<uint16_t> query, dst;
    std::vector<float> k_scales, v_scales; // per cached token and kv head, when the case has them
    std::vector<int32_t> block_table, seq_lens, query_start_loc;
    paged_attention::primitive_desc pd;
    paged_attention primitive;
    tensor_desc cache_md;

    attention_case(long batch_, long q_len_, long context_, long block_size_, data_type dt, bool causal_,
                   bool huge_pages, cpu_isa cap, dim kv_heads = 8, bool per_token_scales = false,
                   layout cache_layout = layout::any)
        : batch(batch_), q_len(q_len_), context(context_), block_size(block_size_), cache_type(dt),
          causal(causal_), hq(4 * kv_heads), hkv(kv_heads) {
        dnnl::engine eng(dnnl::engine::kind::cpu, 0);
        const dim blocks_per_seq = (context + block_size - 1) / block_size;
        const dim num_blocks = batch * blocks_per_seq;
        paged_attention::options o;
        o.causal = causal;
        primitive_attr attr;
        attr.set_max_cpu_isa(cap);
        if (per_token_scales && data_type_size(dt) == 1) {
            attr.set_scales_mask(ARG_K_CACHE, scales_per_token);
            attr.set_scales_mask(ARG_V_CACHE, scales_per_token);
            k_scales.resize(static_cast<size_t>(num_blocks * hkv * block_size));
            v_scales.resize(k_scales.size());
        }
        pd = paged_attention::primitive_desc(
                eng,
                paged_attention::desc({ { runtime_dim, hq, d }, data_type::bf16 },
                                      { { num_blocks, hkv, block_size, d }, dt, cache_layout },
                                      { { num_blocks, hkv, block_size, d }, dt, cache_layout },
                                      { { runtime_dim, hq, d }, data_type::bf16 }, o),
                attr);
        primitive = paged_attention(pd);
        cache_md = pd.query_md(ARG_K_CACHE);
        k_cache = big_array<uint8_t>(cache_md.get_size(), huge_pages);
        v_cache = big_array<uint8_t>(cache_md.get_size(), huge_pages);
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
        // Per-token scales as amax / 448 of moderate rows: [1/16, 1/8).
        for (auto *scales : { &k_scales, &v_scales })
            for (float &x : *scales)
                x = std::ldexp(1.f + static_cast<float>(rng() % 256) / 256.f, -4);
        block_table = blocks;
        seq_lens.assign(static_cast<size_t>(batch), static_cast<int32_t>(context));
        for (long s = 0; s <= batch; ++s)
            query_start_loc.push_back(static_cast<int32_t>(s * q_len));
    }

    void run(const dnnl::stream &s) {
        const dim tokens = batch * q_len;
        const dim width = static_cast<dim>(block_table.size()) / batch;
        exec_args args = {
            { ARG_QUERY, tensor({ { tokens, hq, d }, data_type::bf16 }, query.data()) },
            { ARG_K_CACHE, tensor(cache_md, k_cache.data()) },
            { ARG_V_CACHE, tensor(cache_md, v_cache.data()) },
            { ARG_BLOCK_TABLE, tensor({ { batch, width }, data_type::s32 }, block_table.data()) },
            { ARG_SEQ_LENS, tensor({ { batch }, data_type::s32 }, seq_lens.data()) },
            { ARG_QUERY_START_LOC, tensor({ { batch + 1 }, data_type::s32 }, query_start_loc.data()) },
            { ARG_DST, tensor({ { tokens, hq, d }, data_type::bf16 }, dst.data()) }
        };
        if (!k_scales.empty()) {
            const tensor_desc scales_md({ static_cast<dim>(block_table.size()), hkv, block_size },
                                        data_type::f32);
            args[ARG_K_SCALES] = tensor(scales_md, k_scales.data());
            args[ARG_V_SCALES] = tensor(scales_md, v_scales.data());
        }
        primitive.execute(s, args);
    }

    /// K and V codes read by the step, and their per-token scales when the case has them.
    double cache_bytes() const {
        return 2.0 * batch * context * hkv * (d * data_type_size(cache_type) + (k_scales.empty() ? 0 : 4));
    }
    double flops() const {
        const double pairs = causal ? batch * (q_len * (context - q_len) + q_len * (q_len + 1) / 2.0)
                                    : double(batch) * q_len * context;
        return 4.0 * hq * d * pairs;
    }

    /// The walk ceiling: GB/s of a bare read of this case's caches in the order the kernels read
    /// them, compute aside. Items (sequence, kv head) in the plan's order, shared among the arena's
    /// threads by TBB as the plan's items are (KV ranges unsplit); each walks its sequence's block
    /// table a chunk of 128 tokens at a time, as the kernels do: the chunk's (block, head) regions of
    /// K, then of V (packed: contiguous, at the block and head strides), each read while the lines
    /// of the region 128 tokens further on are prefetched (the item's last chunk: nothing new).
    /// Scattered blocks can make this pattern slower than the sequential DRAM read (on the
    /// development VM: FP8 with 1-2 kv heads and 128-token blocks); `wfrac` then separates the
    /// kernels' share from the pattern's.
    double walk_gb_per_s() const {
        const size_t element = data_type_size(cache_type), region = size_t(block_size * d) * element;
        const dims &strides = cache_md.get_strides();
        const dim width = static_cast<dim>(block_table.size()) / batch,
                  blocks = (context + block_size - 1) / block_size,
                  ahead = std::max<dim>(1, 128 / block_size);
        auto address = [&](const big_array<uint8_t> &cache, dim seq, dim head, dim j) {
            const dim block = block_table[static_cast<size_t>(seq * width + j)];
            return reinterpret_cast<const char *>(cache.data()) +
                   static_cast<size_t>(block * strides[0] + head * strides[1]) * element;
        };
        const auto start = clock_type::now();
        const uint64_t sum = tbb::parallel_reduce(
                tbb::blocked_range<dim>(0, batch * hkv, 1), uint64_t(0),
                [&](const tbb::blocked_range<dim> &r, uint64_t acc) {
                    for (dim item = r.begin(); item != r.end(); ++item) {
                        const dim seq = item / hkv, head = item % hkv;
                        for (dim chunk = 0; chunk < blocks; chunk += ahead) {
                            const dim end = std::min(chunk + ahead, blocks);
                            for (const big_array<uint8_t> *cache : { &k_cache, &v_cache })
                                for (dim j = chunk; j < end; ++j)
                                    acc += read_region_avx2(
                                            address(*cache, seq, head, j),
                                            address(*cache, seq, head, std::min(j + ahead, blocks - 1)),
                                            region);
                        }
                    }
                    return acc;
                },
                std::plus<uint64_t>());
        const double seconds = seconds_since(start);
        static volatile uint64_t sink;
        sink = sink + sum;
        return 2.0 * batch * hkv * blocks * region / seconds / 1e9;
    }
};

// The cache column's width: wider for "f8_e4m3/token" (--scales per-token), "/plain" (--layout
// plain) and reshape's "f8_e4m3/tensor".
int cache_column(const config &cfg) {
    const bool plain = cfg.cache_layout == layout::plain;
    return cfg.wants("reshape") || (plain && cfg.per_token_scales) ? 19
           : cfg.per_token_scales || plain                         ? 13
                                                                   : 8;
}

void print_row(const config &cfg, const row &r) {
    std::printf("%-8s %5ld %5ld %7ld %-*s %5ld %3ld %-16s %10.3f %8.1f %8.1f %7.1f %6.2f", r.kind.c_str(),
                r.batch, r.q_len, r.context, cache_column(cfg), r.cache.c_str(), r.block_size, r.threads,
                r.impl.c_str(), r.median_ms, r.gb_per_s, r.gflop_per_s, r.ceiling, r.fraction_of_ceiling);
    if (r.walk > 0)
        std::printf(" %7.1f %6.2f\n", r.walk, r.gb_per_s / r.walk);
    else
        std::printf("\n");
    std::fflush(stdout);
}

void report(config &cfg, const std::string &kind, const attention_case &c, long threads, double seconds,
            double ceiling, double walk = 0) {
    row r;
    r.kind = kind;
    r.cache = std::string(data_type_name(c.cache_type)) + (c.k_scales.empty() ? "" : "/token") +
              (c.cache_md.get_layout() == layout::plain ? "/plain" : "");
    r.impl = c.pd.impl_info_str();
    r.batch = c.batch;
    r.q_len = c.q_len;
    r.context = c.context;
    r.block_size = c.block_size;
    r.threads = threads;
    r.median_ms = seconds * 1e3;
    r.gb_per_s = c.cache_bytes() / seconds / 1e9;
    r.gflop_per_s = c.flops() / seconds / 1e9;
    r.ceiling = ceiling;
    r.fraction_of_ceiling = ceiling > 0 ? (kind == "prefill" ? r.gflop_per_s : r.gb_per_s) / ceiling : 0;
    r.walk = walk;
    cfg.rows.push_back(r);
    print_row(cfg, r);
}

struct timings {
    std::vector<double> seconds; // median per case
    double ceiling;              // median of the ceiling's repetitions
    std::vector<double> walks;   // median of each case's walk ceiling (when given)
};

// Times cases with alternating repetitions (after two warm-ups): each repetition runs every case
// once, then the ceiling once, so that drift biases neither the cases' ratios nor their fractions
// of the ceiling. `flush`: the caches are evicted before each case. `ceiling_between` false: the
// ceiling's repetitions follow the cases' instead (oneDNN's matmul runs on OpenMP threads that
// spin for a while after it, which slowed the next case by up to 40%).
// `walks`, when given: each case's walk ceiling, run right after the case (flushed likewise) in
// its arena.
timings time_alternating(config &cfg, const std::vector<std::function<void()>> &cases, long threads,
                         bool flush, const std::function<double()> &ceiling, bool ceiling_between = true,
                         const std::vector<std::function<double()>> *walks = nullptr) {
    tbb::task_arena arena(static_cast<int>(threads));
    std::vector<std::vector<double>> times(cases.size()), walk_values(cases.size());
    std::vector<double> ceiling_values;
    // The flush runs in the case's arena, whose worker threads then stay in it as an engine's do
    // from step to step (flushing from the default arena left the case ~30 us of waking and joining
    // them: 1 x 8192 decode read 86-93% of the GB/s of 8 x 8192, now 94-100%).
    auto flush_if_asked = [&] {
        if (flush && cfg.flush) arena.execute([&] { flush_caches(cfg.flush_buffer); });
    };
    for (int rep = -2; rep < cfg.reps; ++rep) {
        for (size_t i = 0; i < cases.size(); ++i) {
            flush_if_asked();
            const auto start = clock_type::now();
            arena.execute(cases[i]);
            if (rep >= 0) times[i].push_back(seconds_since(start));
            if (!walks) continue;
            flush_if_asked();
            double gb_per_s = 0;
            arena.execute([&] { gb_per_s = (*walks)[i](); });
            if (rep >= 0) walk_values[i].push_back(gb_per_s);
        }
        if (!ceiling_between) continue;
        const double c = ceiling(); // with all threads, as at the start
        if (rep >= 0) ceiling_values.push_back(c);
    }
    for (int rep = -2; rep < cfg.reps && !ceiling_between; ++rep) {
        const double c = ceiling();
        if (rep >= 0) ceiling_values.push_back(c);
    }
    timings t;
    for (size_t i = 0; i < cases.size(); ++i) {
        t.seconds.push_back(median(times[i]));
        t.walks.push_back(walks ? median(walk_values[i]) : 0.0);
    }
    t.ceiling = median(ceiling_values);
    return t;
}

// Times the attention cases of one shape against the ceiling of their kind; the reference is never
// timed on large cases (it would take minutes and say nothing about the kernels).
void time_attention(config &cfg, const std::string &kind, std::vector<attention_case *> cases, long threads,
                    bool flush) {
    for (attention_case *c : cases)
        if (std::string(c->pd.impl_info_str()) == "ref:any" && c->batch * c->context * c->q_len > 8192) {
            std::printf("%-8s %5ld %5ld %7ld %-8s: only ref:any accepts it; not timed\n", kind.c_str(),
                        c->batch, c->q_len, c->context, data_type_name(c->cache_type));
            return;
        }
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    std::vector<std::function<void()>> runs;
    std::vector<std::function<double()>> walks;
    for (attention_case *c : cases) {
        runs.push_back([c, &s] { c->run(s); });
        walks.push_back([c] { return c->walk_gb_per_s(); });
    }
    ceilings &m = *cfg.machine;
    const timings t = kind == "prefill" ? time_alternating(
                                                  cfg, runs, threads, flush,
                                                  [&] { return m.prefill_gflop_per_s(); }, false)
                                        : time_alternating(
                                                  cfg, runs, threads, flush,
                                                  [&] { return m.dram_read_gb_per_s(); }, true, &walks);
    for (size_t i = 0; i < cases.size(); ++i)
        report(cfg, kind, *cases[i], threads, t.seconds[i], t.ceiling, t.walks[i]);
}

void run_attention(config &cfg) {
    const data_type types[] = { data_type::bf16, data_type::f8_e4m3, data_type::f8_e5m2 };
    // Every case as --kv-heads and --block-size shape it (see the top).
    const long scale = 8 / cfg.kv_heads, bs = cfg.block_size ? cfg.block_size : 128;
    auto add = [&](std::vector<attention_case> &cases, long batch, long q_len, long context, long block_size,
                   data_type dt) {
        cases.emplace_back(batch * scale, q_len, context, block_size, dt, true, cfg.huge_pages, cfg.cap,
                           cfg.kv_heads, cfg.per_token_scales, cfg.cache_layout);
    };
    if (cfg.wants("decode")) {
        // 1 and 8 sequences of one context alternate too: their GB/s are compared.
        std::vector<long> block_sizes { 128L, 16L };
        if (cfg.block_size) block_sizes = { cfg.block_size };
        for (long context : { 128L, 512L, 2048L, 8192L, 32768L })
            for (long block_size : block_sizes) {
                if (!cfg.block_size && block_size == 16 && context != 8192)
                    continue; // 16 is reported beside, at one size
                if (cfg.context && context != cfg.context) continue;
                std::vector<attention_case> cases;
                cases.reserve(6);
                for (long batch : { 1L, 8L })
                    for (data_type dt : types)
                        add(cases, batch, 1, context, block_size, dt);
                std::vector<attention_case *> pointers;
                for (attention_case &c : cases)
                    pointers.push_back(&c);
                time_attention(cfg, "decode", pointers, 2, true);
            }
        std::vector<attention_case> cases;
        cases.reserve(2);
        add(cases, 1, 1, 8192, bs, data_type::bf16);
        add(cases, 1, 1, 8192, bs, data_type::f8_e4m3);
        time_attention(cfg, "decode", { &cases[0], &cases[1] }, 1, true);
    }
    if (cfg.wants("verify")) {
        std::vector<attention_case> cases;
        cases.reserve(4);
        for (long q_len : { 4L, 1L })
            for (data_type dt : { data_type::bf16, data_type::f8_e4m3 })
                add(cases, 8, q_len, 2048, bs, dt);
        time_attention(cfg, "verify", { &cases[0], &cases[1], &cases[2], &cases[3] }, 2, true);
    }
    if (cfg.wants("prefill")) {
        for (long n : { 512L, 2048L }) {
            std::vector<attention_case> cases;
            cases.reserve(2);
            for (data_type dt : { data_type::bf16, data_type::f8_e4m3 })
                add(cases, 1, n, n, bs, dt);
            time_attention(cfg, "prefill", { &cases[0], &cases[1] }, 2, false);
        }
    }
}

// reshape_and_cache of `tokens` bf16 keys and values into a cache of type dt (FP8 with per-token
// scales, computed from each row as vLLM's dynamic scales are, or with `per_tensor_scale`, one given
// scale for K and V each, as vLLM's k_scale and v_scale), in the packed layout or (`plain`) vLLM's
// [blocks, kv heads, block size, head size].
struct reshape_case {
    static constexpr dim hkv = 8, d = 128, bs = 128;
    dim tokens, blocks;
    data_type cache_type;
    reshape_and_cache::primitive_desc pd;
    reshape_and_cache primitive;
    big_array<uint8_t> k_cache, v_cache;
    std::vector<float> k_scales, v_scales;
    exec_args args;

    bool per_tensor; // one scale for K and V each, else per-token scales
    bool plain;
    bool one_by_one; // the slots of each 16 tokens reversed (one_by_one_slots): each token written alone

    // key, value: at least `tokens` rows; slots: 0, 1, ...
    reshape_case(dim tokens_, data_type dt, const big_array<uint16_t> &key, const big_array<uint16_t> &value,
                 const std::vector<int64_t> &slots, bool huge_pages, cpu_isa cap, float per_tensor_scale = 0,
                 bool plain_ = false, bool one_by_one_ = false)
        : tokens(tokens_), blocks((tokens_ + bs - 1) / bs), cache_type(dt), per_tensor(per_tensor_scale > 0),
          plain(plain_), one_by_one(one_by_one_) {
        dnnl::engine eng(dnnl::engine::kind::cpu, 0);
        primitive_attr attr;
        attr.set_max_cpu_isa(cap);
        if (data_type_size(dt) == 1) {
            attr.set_scales_mask(ARG_K_CACHE, per_tensor ? scales_per_tensor : scales_per_token);
            attr.set_scales_mask(ARG_V_CACHE, per_tensor ? scales_per_tensor : scales_per_token);
        }
        const tensor_desc kv({ runtime_dim, hkv, d }, data_type::bf16),
                cache({ blocks, hkv, bs, d }, dt, plain ? layout::plain : layout::any);
        pd = reshape_and_cache::primitive_desc(eng, reshape_and_cache::desc(kv, kv, cache, cache), attr);
        primitive = reshape_and_cache(pd);
        const tensor_desc cmd = pd.query_md(ARG_K_CACHE);
        k_cache = big_array<uint8_t>(cmd.get_size(), huge_pages);
        v_cache = big_array<uint8_t>(cmd.get_size(), huge_pages);
        k_scales.assign(per_tensor ? 1 : static_cast<size_t>(blocks * hkv * bs), per_tensor_scale);
        v_scales.assign(k_scales.size(), per_tensor_scale);
        args = { { ARG_KEY, tensor({ { tokens, hkv, d }, data_type::bf16 }, key.data()) },
                 { ARG_VALUE, tensor({ { tokens, hkv, d }, data_type::bf16 }, value.data()) },
                 { ARG_K_CACHE, tensor(cmd, k_cache.data()) },
                 { ARG_V_CACHE, tensor(cmd, v_cache.data()) },
                 { ARG_SLOT_MAPPING,
                   tensor({ { tokens }, data_type::s64 }, const_cast<int64_t *>(slots.data())) } };
        if (data_type_size(dt) == 1) {
            const dims scales_dims = per_tensor ? dims { 1 } : dims { blocks, hkv, bs };
            args[ARG_K_SCALES] = tensor({ scales_dims, data_type::f32 }, k_scales.data());
            args[ARG_V_SCALES] = tensor({ scales_dims, data_type::f32 }, v_scales.data());
        }
    }
    // Bytes read (the bf16 rows) plus written (the cache and any per-token scales).
    double bytes() const {
        return 2.0 * tokens * hkv * d * (2 + data_type_size(cache_type)) +
               (data_type_size(cache_type) == 1 && !per_tensor ? 2.0 * tokens * hkv * 4 : 0);
    }
    // The cache column: the type, and the scales or layout where they are not the first cases'.
    std::string name() const {
        return std::string(data_type_name(cache_type)) + (per_tensor ? "/tensor" : "") +
               (plain ? "/plain" : "") + (one_by_one ? "/rows" : "");
    }
};

// bf16 keys or values for `tokens` tokens of reshape_case's shape: random signs, |x| in [2^-7, 2).
big_array<uint16_t> reshape_input(dim tokens, unsigned seed, bool huge_pages) {
    const size_t elements = static_cast<size_t>(tokens * reshape_case::hkv * reshape_case::d);
    big_array<uint16_t> x(elements, huge_pages);
    std::mt19937 rng(seed);
    for (size_t i = 0; i < elements; ++i)
        x[i] = static_cast<uint16_t>(0x3C00 | (rng() & 0x3FF) | (rng() & 0x8000));
    return x;
}

std::vector<int64_t> identity_slots(dim tokens) {
    std::vector<int64_t> slots(static_cast<size_t>(tokens));
    for (dim t = 0; t < tokens; ++t)
        slots[static_cast<size_t>(t)] = t;
    return slots;
}

// Slots 0 .. tokens - 1 (a multiple of 16) with each 16 in reverse order: no 16 tokens take
// consecutive slots, so each token is written alone, as decode steps write them.
std::vector<int64_t> one_by_one_slots(dim tokens) {
    std::vector<int64_t> slots = identity_slots(tokens);
    for (size_t i = 0; i + 16 <= slots.size(); i += 16)
        std::reverse(slots.begin() + static_cast<std::ptrdiff_t>(i),
                     slots.begin() + static_cast<std::ptrdiff_t>(i + 16));
    return slots;
}

void run_reshape(config &cfg) {
    if (!cfg.wants("reshape")) return;
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    const dim tokens = 4096;
    const big_array<uint16_t> key = reshape_input(tokens, 5, cfg.huge_pages),
                              value = reshape_input(tokens, 6, cfg.huge_pages);
    const std::vector<int64_t> slots = identity_slots(tokens);
    std::vector<reshape_case> cases;
    cases.reserve(4);
    for (data_type dt : { data_type::bf16, data_type::f8_e4m3 })
        cases.emplace_back(tokens, dt, key, value, slots, cfg.huge_pages, cfg.cap);
    // A calibrated scale's kind: no bf16 amax / 448 (the inputs' |x| are below 2: no saturation)
    cases.emplace_back(tokens, data_type::f8_e4m3, key, value, slots, cfg.huge_pages, cfg.cap, 0.0046f);
    cases.emplace_back(tokens, data_type::f8_e4m3, key, value, slots, cfg.huge_pages, cfg.cap, 0.f, true);
    std::vector<std::function<void()>> runs;
    for (reshape_case &c : cases)
        runs.push_back([&c, &s] { c.primitive.execute(s, c.args); });
    const timings t = time_alternating(cfg, runs, 2, true, [&] { return cfg.machine->dram_read_gb_per_s(); });
    for (size_t i = 0; i < cases.size(); ++i) {
        const reshape_case &c = cases[i];
        row r { "reshape",
                c.name(),
                c.pd.impl_info_str(),
                1,
                tokens,
                0,
                reshape_case::bs,
                2,
                t.seconds[i] * 1e3,
                c.bytes() / t.seconds[i] / 1e9,
                0,
                0,
                t.ceiling };
        r.fraction_of_ceiling = r.gb_per_s / t.ceiling;
        cfg.rows.push_back(r);
        print_row(cfg, r);
    }
}

// --filter cost: the compute cost of decode per (token, kv head), in cycles, beside the bare-loop
// ceilings of each ISA, on one thread with the cache resident in L2/L3 (no memory time to hide it).
// The clock is measured by a chain of dependent integer adds (one per cycle on every x86 core since
// the P6); the ceilings are loops of independent products (12 chains, more than latency x
// throughput on any core). Decode 32/8 heads, D 128: per (token, kv head) 4 rows x 128 dims for
// the scores and as many for the values, so 2 x 512 multiply-adds: f32 FMAs take 64 (16 lanes) or
// 128 (8 lanes) instructions, vdpbf16ps 32 (a pair per lane). Verify (4 query tokens) takes 4 times
// as many.
double cycles_per_ns() {
    const long n = 200000000;
    long x = 0;
    const auto start = clock_type::now();
    for (long i = 0; i < n; ++i)
        asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    return 4.0 * n / (seconds_since(start) * 1e9);
}

// Twelve of one product instruction, into registers 0..11 of a kind: `op src1, src2, %%<kind>i`.
// clang-format off
#define PAGEDATTN_BENCH_PRODUCT(op, kind, i) op ", %%" kind #i "\n\t"
#define PAGEDATTN_BENCH_TWELVE(op, kind)                                                      \
    PAGEDATTN_BENCH_PRODUCT(op, kind, 0) PAGEDATTN_BENCH_PRODUCT(op, kind, 1)                 \
    PAGEDATTN_BENCH_PRODUCT(op, kind, 2) PAGEDATTN_BENCH_PRODUCT(op, kind, 3)                 \
    PAGEDATTN_BENCH_PRODUCT(op, kind, 4) PAGEDATTN_BENCH_PRODUCT(op, kind, 5)                 \
    PAGEDATTN_BENCH_PRODUCT(op, kind, 6) PAGEDATTN_BENCH_PRODUCT(op, kind, 7)                 \
    PAGEDATTN_BENCH_PRODUCT(op, kind, 8) PAGEDATTN_BENCH_PRODUCT(op, kind, 9)                 \
    PAGEDATTN_BENCH_PRODUCT(op, kind, 10) PAGEDATTN_BENCH_PRODUCT(op, kind, 11)
#define PAGEDATTN_BENCH_LOOP(op, kind)                                                        \
    const long n = 20000000;                                                                  \
    const auto start = clock_type::now();                                                     \
    for (long i = 0; i < n; ++i)                                                              \
        asm volatile(PAGEDATTN_BENCH_TWELVE(op, kind) ::: "xmm0", "xmm1", "xmm2", "xmm3",     \
                     "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");       \
    return 12.0 * n / (seconds_since(start) * 1e9)
// clang-format on

// Instructions per ns of each bare loop (12 independent accumulators).
__attribute__((target("avx2,fma"))) double ymm_fma_per_ns() {
    PAGEDATTN_BENCH_LOOP("vfmadd231ps %%ymm14, %%ymm15", "ymm");
}
__attribute__((target("avx512f"))) double zmm_fma_per_ns() {
    PAGEDATTN_BENCH_LOOP("vfmadd231ps %%zmm30, %%zmm31", "zmm");
}
__attribute__((target("avx512f,avx512bf16"))) double zmm_dpbf16_per_ns() {
    PAGEDATTN_BENCH_LOOP("vdpbf16ps %%zmm30, %%zmm31", "zmm");
}
#undef PAGEDATTN_BENCH_LOOP
#undef PAGEDATTN_BENCH_TWELVE
#undef PAGEDATTN_BENCH_PRODUCT

// ns of `reps` runs of each of two cases (run(0), run(1)) on `arena`, after `warmup` unrecorded
// ones, alternating so that drift biases neither.
template <typename Run>
void time_two_alternating(tbb::task_arena &arena, int warmup, int reps, Run run,
                          std::vector<double> (&ns)[2]) {
    for (int rep = -warmup; rep < reps; ++rep)
        for (int i = 0; i < 2; ++i) {
            const auto start = clock_type::now();
            arena.execute([&] { run(i); });
            if (rep >= 0) ns[i].push_back(seconds_since(start) * 1e9);
        }
}

void run_cost(config &cfg) {
    if (cfg.filter != "cost") return; // only on request: it is a diagnosis, not a ratio to a ceiling
    const cpu_isa host = get_max_cpu_isa(), level = std::min(host, cfg.cap);
    const double clock = median_of(5, cycles_per_ns);
    // The product instruction of the level's kernel, and how many a (token, kv head) of decode needs.
    const char *product = "vfmadd231ps ymm";
    double products = 128, per_ns = 0;
    if (level >= cpu_isa::avx512_bf16) {
        product = "vdpbf16ps zmm", products = 32;
        per_ns = median_of(5, zmm_dpbf16_per_ns);
    } else if (level >= cpu_isa::avx512) {
        product = "vfmadd231ps zmm", products = 64;
        per_ns = median_of(5, zmm_fma_per_ns);
    } else if (level >= cpu_isa::avx2) {
        per_ns = median_of(5, ymm_fma_per_ns);
    }
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(eng);
    // Two contexts, and the cost per (token, kv head) from their difference: a call's fixed costs
    // (argument checks, the plan, the rows' set-up and output) cancel, leaving what a long context
    // pays per token. 8 kv heads x 768 tokens: 3 MiB of bf16, L3-resident.
    const long short_context = 256, long_context = 768;
    std::printf(
            "cost: one thread, 1 x %ld and 1 x %ld tokens in cache, clock %.2f GHz (dependent adds); bare "
            "loop: %s %.2f per cycle, so decode's %.0f per (token, kv head) take %.1f cycles (verify: 4 x)\n",
            short_context, long_context, clock, product, per_ns / std::max(clock, 1e-9), products,
            per_ns > 0 ? products * clock / per_ns : 0.0);
    tbb::task_arena one_thread(1);
    // Decode (q_len 1) and speculative verify (q_len 4: 16 rows per kv head, 4 x the products).
    for (long q_len : { 1L, 4L })
        for (data_type dt : { data_type::bf16, data_type::f8_e4m3, data_type::f8_e5m2 }) {
            std::vector<attention_case> cases;
            cases.reserve(2);
            for (long context : { short_context, long_context })
                cases.emplace_back(1, q_len, context, 128, dt, true, cfg.huge_pages, cfg.cap, 8, false,
                                   cfg.cache_layout);
            std::vector<double> ns[2];
            time_two_alternating(
                    one_thread, 5, 10 * cfg.reps, [&](int i) { cases[i].run(s); }, ns);
            // The fastest runs, as for reshape below: on a shared host the medians of unchanged code
            // moved by 40% between runs a minute apart, the minima by ~1%.
            const double short_ns = *std::min_element(ns[0].begin(), ns[0].end()),
                         long_ns = *std::min_element(ns[1].begin(), ns[1].end());
            const double per_pair =
                    (long_ns - short_ns) / double((long_context - short_context) * cases[0].hkv);
            const double fixed = short_ns - per_pair * double(short_context * cases[0].hkv);
            const std::string cache =
                    std::string(data_type_name(dt)) + (cfg.cache_layout == layout::plain ? "/plain" : "");
            std::printf("cost     %-6s %-18s %-16s %7.2f ns %7.1f cycles per (token, kv head), %6.2f us per "
                        "call\n",
                        q_len == 1 ? "decode" : "verify", cache.c_str(), cases[0].pd.impl_info_str(),
                        per_pair, per_pair * clock, fixed / 1e3);
        }
    // reshape_and_cache of bf16 rows (prefill's whole 16-token groups), per (token, kv head): one K
    // and one V row of 128 values, so 16 vectors of 16 values. 64 and 192 tokens: 768 KiB of input.
    const dim short_tokens = 64, long_tokens = 192;
    const big_array<uint16_t> key = reshape_input(long_tokens, 5, cfg.huge_pages),
                              value = reshape_input(long_tokens, 6, cfg.huge_pages);
    const std::vector<int64_t> slots = identity_slots(long_tokens), alone = one_by_one_slots(long_tokens);
    // (per_tensor_scale 0: per-token scales; run_reshape's calibrated scale for "/tensor")
    struct kind {
        data_type dt;
        float per_tensor_scale;
        bool plain, one_by_one;
    };
    const kind kinds[] = {
        { data_type::bf16, 0.f, false, false },    { data_type::f8_e4m3, 0.f, false, false },
        { data_type::f8_e5m2, 0.f, false, false }, { data_type::f8_e4m3, 0.0046f, false, false },
        { data_type::f8_e4m3, 0.f, true, false },  { data_type::f8_e4m3, 0.f, false, true },
        { data_type::f8_e4m3, 0.f, true, true }
    };
    for (const kind &k : kinds) {
        std::vector<reshape_case> cases;
        cases.reserve(2);
        for (dim tokens : { short_tokens, long_tokens }) {
            cases.emplace_back(tokens, k.dt, key, value, k.one_by_one ? alone : slots, cfg.huge_pages,
                               cfg.cap, k.per_tensor_scale, k.plain, k.one_by_one);
        }
        std::vector<double> ns[2];
        time_two_alternating(
                one_thread, 20, 400 * cfg.reps, [&](int i) { cases[i].primitive.execute(s, cases[i].args); },
                ns);
        const double per_pair = (*std::min_element(ns[1].begin(), ns[1].end()) -
                                 *std::min_element(ns[0].begin(), ns[0].end())) /
                                double((long_tokens - short_tokens) * reshape_case::hkv);
        const std::string cache = cases[0].name();
        std::printf(
                "cost     %-6s %-18s %-16s %7.2f ns %7.1f cycles per (token, kv head), %6.1f per 16 values\n",
                "reshape", cache.c_str(), cases[0].pd.impl_info_str(), per_pair, per_pair * clock,
                per_pair * clock / 16);
    }
}

} // namespace

int main(int argc, char **argv) {
    config cfg;
    std::vector<cpu_isa> caps { cpu_isa::all };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--csv" && i + 1 < argc)
            cfg.csv = argv[++i];
        else if (a == "--filter" && i + 1 < argc)
            cfg.filter = argv[++i];
        else if (a == "--no-flush")
            cfg.flush = false;
        else if (a == "--small-pages")
            cfg.huge_pages = false;
        else if (a == "--reps" && i + 1 < argc)
            cfg.reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--context" && i + 1 < argc)
            cfg.context = std::atol(argv[++i]);
        else if (a == "--kv-heads" && i + 1 < argc) {
            cfg.kv_heads = std::atol(argv[++i]);
            if (cfg.kv_heads != 1 && cfg.kv_heads != 2 && cfg.kv_heads != 4 && cfg.kv_heads != 8) {
                std::fprintf(stderr, "pagedattn_bench: --kv-heads takes 1, 2, 4 or 8\n");
                return 2;
            }
        } else if (a == "--block-size" && i + 1 < argc) {
            cfg.block_size = std::atol(argv[++i]);
            if (cfg.block_size < 16 || cfg.block_size % 16) {
                std::fprintf(stderr, "pagedattn_bench: --block-size takes a multiple of 16\n");
                return 2;
            }
        } else if (a == "--layout" && i + 1 < argc) {
            const std::string l = argv[++i];
            if (l != "plain" && l != "packed") {
                std::fprintf(stderr, "pagedattn_bench: --layout takes plain or packed\n");
                return 2;
            }
            cfg.cache_layout = l == "plain" ? layout::plain : layout::packed;
        } else if (a == "--scales" && i + 1 < argc) {
            if (std::string(argv[++i]) != "per-token") {
                std::fprintf(stderr, "pagedattn_bench: --scales takes per-token\n");
                return 2;
            }
            cfg.per_token_scales = true;
        } else if (a == "--isa" && i + 1 < argc) {
            caps.clear();
            std::string list = argv[++i];
            for (size_t start = 0; start <= list.size();) {
                const size_t end = std::min(list.find(',', start), list.size());
                const std::string name = list.substr(start, end - start);
                bool known = false;
                for (cpu_isa isa : { cpu_isa::generic, cpu_isa::avx2, cpu_isa::avx512, cpu_isa::avx512_bf16,
                                     cpu_isa::amx, cpu_isa::all })
                    if (name == cpu_isa_name(isa)) caps.push_back(isa), known = true;
                if (!known) {
                    std::fprintf(stderr, "pagedattn_bench: unknown ISA '%s' in --isa\n", name.c_str());
                    return 2;
                }
                start = end + 1;
            }
        } else {
            std::printf(
                    "usage: %s [--csv PATH] [--filter decode|verify|prefill|reshape|cost] [--reps N] "
                    "[--no-flush] [--small-pages] [--context N] [--isa avx2,avx512,avx512_bf16,amx,all] "
                    "[--kv-heads 1|2|4|8] [--block-size N] [--scales per-token] [--layout plain|packed]\n",
                    argv[0]);
            return a == "--help" ? 0 : 2;
        }
    }
    try {
        std::printf("host ISA %s, threads %d; attention cases: %ld/%ld heads (q/kv)%s\n",
                    cpu_isa_name(get_max_cpu_isa()), tbb::this_task_arena::max_concurrency(),
                    4 * cfg.kv_heads, cfg.kv_heads, cfg.kv_heads == 8 ? "" : ", batches x 8/kv heads");
        cfg.flush_buffer = big_array<uint64_t>(size_t(96) << 17, cfg.huge_pages, 1);
        cfg.machine = std::make_unique<ceilings>(cfg.huge_pages);
        ceilings &m = *cfg.machine;
        const int reps = std::max(5, cfg.reps / 4);
        cfg.dram = median_of(reps, [&] { return m.dram_read_gb_per_s(); });
        cfg.matmul_bf16 = median_of(reps, [&] { return m.bf16_matmul_gflop_per_s(); });
        cfg.matmul_f32 = median_of(reps, [&] { return m.f32_matmul_gflop_per_s(); });
        std::printf(
                "ceiling: DRAM read %.1f GB/s, oneDNN matmul 2048^3 bf16 %.1f GFLOP/s%s, f32 %.1f GFLOP/s\n",
                cfg.dram, cfg.matmul_bf16, m.has_bf16_matmul() ? "" : " (none on this host)", cfg.matmul_f32);
        std::printf(
                "ceil: the ceiling measured beside the case, its repetitions alternating with the case's:\n"
                "DRAM read GB/s (decode, verify, reshape), %s matmul GFLOP/s (prefill); frac: the case's\n"
                "GB/s or GFLOP/s over it; walk (decode, verify): GB/s of a bare read of the case's\n"
                "caches in its kernels' order, also beside it; wfrac: the case's GB/s over it\n\n",
                m.has_bf16_matmul() ? "bf16" : "f32");
        std::printf("%-8s %5s %5s %7s %-*s %5s %3s %-16s %10s %8s %8s %7s %6s %7s %6s\n", "kind", "batch",
                    "q_len", "context", cache_column(cfg), "cache", "bs", "thr", "impl", "median_ms", "GB/s",
                    "GFLOP/s", "ceil", "frac", "walk", "wfrac");
        for (cpu_isa cap : caps) {
            cfg.cap = cap;
            run_attention(cfg);
            run_reshape(cfg);
            run_cost(cfg);
        }
    } catch (const pagedattn::error &e) {
        std::fprintf(stderr, "pagedattn_bench: %s\n", e.what());
        return 1;
    }
    if (!cfg.csv.empty()) {
        std::ofstream out(cfg.csv);
        out << "kind,batch,q_len,context,cache,block_size,threads,median_ms,gb_per_s,gflop_per_s,fraction_of_"
               "ceiling,ceiling,impl,walk_gb_per_s\n";
        const int threads = tbb::this_task_arena::max_concurrency();
        // The ceilings measured at the start, before the cases (each case's own is in its row).
        out << "ceiling_dram_read,0,0,0,,0," << threads << ",0," << cfg.dram << ",0,1," << cfg.dram
            << ",,0\n";
        out << "ceiling_bf16_matmul,0,0,0,,0," << threads << ",0,0," << cfg.matmul_bf16 << ",1,"
            << cfg.matmul_bf16 << ",,0\n";
        out << "ceiling_f32_matmul,0,0,0,,0," << threads << ",0,0," << cfg.matmul_f32 << ",1,"
            << cfg.matmul_f32 << ",,0\n";
        for (const row &r : cfg.rows)
            out << r.kind << ',' << r.batch << ',' << r.q_len << ',' << r.context << ',' << r.cache << ','
                << r.block_size << ',' << r.threads << ',' << r.median_ms << ',' << r.gb_per_s << ','
                << r.gflop_per_s << ',' << r.fraction_of_ceiling << ',' << r.ceiling << ',' << r.impl << ','
                << r.walk << '\n';
    }
    return 0;
}
