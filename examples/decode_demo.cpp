// decode_demo: a small LLM-serving simulation over a paged KV cache, run twice on the same inputs:
// once with a bf16 cache and once with an FP8 (e4m3) cache that holds one scale per cached token.
//
// Several sequences of different prompt lengths share one cache through a block allocator. Step 0
// prefills every prompt in one variable-length call: it writes all the prompts' keys and values
// and attends for the last --prefill-queries tokens of each (a chunked prefill whose earlier chunks
// were served before; 0: every token). Each later step decodes one token per sequence. Every step
// first writes its new keys and values into the cache (reshape_and_cache), then attends to the cache
// (paged_attention). The demo prints the implementations chosen, the memory of both caches, the
// speed of both runs and how far the FP8 outputs are from the bf16 ones.
//
// By default it is a serving step of a loaded server: 32 sequences of 1K-4K tokens in blocks of 128,
// a KV cache of hundreds of MiB, far beyond the last-level cache, as decode meets it in production.
// --small is the earlier in-cache case (6 short sequences, blocks of 16, every prompt token
// attended). --help lists the flags.

#include <pagedattn/pagedattn.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef __linux__
#include <sys/mman.h>
#endif

using namespace pagedattn;

namespace {

struct config {
    int seqs = 32;
    int q_heads = 32;
    int kv_heads = 8;
    int head_size = 128;
    int block_size = 128; // tokens per cache block: a packed 128-token block is one chunk of the kernels
    int prompt_min = 1024, prompt_max = 4096; // prompts are spread evenly over [min, max]
    int prefill_queries = 16;                 // prompt tokens attended in step 0 per sequence; 0: all
    int steps = 32;                           // decode steps after the prefill
    double threshold = -1;                    // relative error limit; negative: no check
};

/// --small: the in-cache case of the first demo.
void make_small(config &c) {
    c.seqs = 6;
    c.block_size = 16;
    c.prompt_min = 37;
    c.prompt_max = 700;
    c.prefill_queries = 0;
}

// ---------------------------------------------------------------------------------------------
// Inputs. They depend only on (sequence, position, head, dim), never on the cache type, so both
// runs see the same tokens.

// splitmix64: a tiny hash with the same output on every platform (std:: distributions differ).
uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
uint64_t hash(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e = 0) {
    return mix(mix(mix(mix(mix(a) ^ b) ^ c) ^ d) ^ e);
}
// A hash mapped to [0, 1).
double unit(uint64_t h) {
    return static_cast<double>(h >> 11) * 0x1.0p-53;
}

enum role : uint64_t { role_query = 1, role_key = 2, role_value = 3 };

// Smooth random vectors: dim d is a sinusoid of the position with its own frequency, phase and
// amplitude, plus some noise. A query shares the sinusoids of its kv head's keys (shape_head), so
// it attends most to recent positions, as real attention tends to, instead of uniformly. A
// sinusoid is stepped from one position to the next by a rotation: the demo makes tens of millions.
class sinusoid {
public:
    sinusoid(role r, int seq, int shape_head, int d, int first_pos) {
        const uint64_t h = hash(r == role_value ? 2 : 1, seq, shape_head, d);
        const double freq = 0.002 * std::pow(100.0, unit(h)); // 0.002 .. 0.2 radians per position
        const double phase = 6.283185307179586 * unit(mix(h + 1));
        amplitude_ = 0.5 + unit(mix(h + 2));
        sin_ = std::sin(freq * first_pos + phase);
        cos_ = std::cos(freq * first_pos + phase);
        step_sin_ = std::sin(freq);
        step_cos_ = std::cos(freq);
    }
    double value() const { return amplitude_ * sin_; }
    void next() {
        const double s = sin_ * step_cos_ + cos_ * step_sin_;
        cos_ = cos_ * step_cos_ - sin_ * step_sin_;
        sin_ = s;
    }

private:
    double amplitude_, sin_, cos_, step_sin_, step_cos_;
};

float input_value(const sinusoid &wave, role r, int seq, int pos, int head, int d) {
    const double noise = 2 * unit(hash(r, seq, pos, head, d)) - 1;
    return static_cast<float>(wave.value() + 0.3 * noise);
}

// bf16 is the upper half of an f32; round to nearest even (inputs here are finite).
uint16_t to_bf16(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t x) {
    const uint32_t u = static_cast<uint32_t>(x) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

// The new tokens of one step, grouped by sequence in sequence order: all are written to the cache,
// the last queries[s] of sequence s attend.
struct step_inputs {
    std::vector<int> new_tokens, queries; // per sequence
    int tokens = 0, query_tokens = 0;     // their sums: the step's K/V and query T
    std::vector<uint16_t> query;          // bf16 [query_tokens, q heads, head_size]
    std::vector<uint16_t> key, value;     // bf16 [tokens, kv heads, head_size]
};

std::vector<int> prompt_lengths(const config &c) {
    const int lo = std::min(c.prompt_min, c.prompt_max);
    std::vector<int> lens(c.seqs);
    for (int s = 0; s < c.seqs; ++s)
        lens[s] = c.seqs == 1 ? c.prompt_max : lo + (c.prompt_max - lo) * s / (c.seqs - 1);
    return lens;
}

// steps[0] is the prefill of every prompt; steps[1..] decode one token per sequence.
std::vector<step_inputs> make_inputs(const config &c, const std::vector<int> &prompts) {
    const int hq = c.q_heads, hkv = c.kv_heads, d = c.head_size;
    std::vector<step_inputs> steps(c.steps + 1);
    for (size_t k = 0; k < steps.size(); ++k) {
        step_inputs &in = steps[k];
        in.new_tokens = k == 0 ? prompts : std::vector<int>(prompts.size(), 1);
        for (int n : in.new_tokens) {
            in.queries.push_back(k == 0 && c.prefill_queries > 0 ? std::min(n, c.prefill_queries) : n);
            in.tokens += n;
            in.query_tokens += in.queries.back();
        }
        in.query.resize(static_cast<size_t>(in.query_tokens) * hq * d);
        in.key.resize(static_cast<size_t>(in.tokens) * hkv * d);
        in.value.resize(in.key.size());
        size_t t = 0, qt = 0; // the step's K/V token and query token
        for (int s = 0; s < c.seqs; ++s) {
            const int n = in.new_tokens[s], first_pos = k == 0 ? 0 : prompts[s] + static_cast<int>(k) - 1;
            const int first_query = n - in.queries[s];
            for (int h = 0; h < hkv; ++h)
                for (int e = 0; e < d; ++e) {
                    sinusoid kw(role_key, s, h, e, first_pos), vw(role_value, s, h, e, first_pos);
                    for (int i = 0; i < n; ++i, kw.next(), vw.next()) {
                        const size_t at = ((t + i) * hkv + h) * d + e;
                        in.key[at] = to_bf16(input_value(kw, role_key, s, first_pos + i, h, e));
                        in.value[at] = to_bf16(input_value(vw, role_value, s, first_pos + i, h, e));
                    }
                }
            for (int h = 0; h < hq; ++h) // q head h reads kv head h * hkv / hq (GQA)
                for (int e = 0; e < d; ++e) {
                    sinusoid qw(role_query, s, h * hkv / hq, e, first_pos + first_query);
                    for (int i = first_query; i < n; ++i, qw.next())
                        in.query[((qt + i - first_query) * hq + h) * d + e] =
                                to_bf16(input_value(qw, role_query, s, first_pos + i, h, e));
                }
            t += n;
            qt += in.queries[s];
        }
    }
    return steps;
}

// ---------------------------------------------------------------------------------------------
// Serving-side bookkeeping: a block allocator and the per-sequence block lists.

// Hands out cache blocks from a free list shuffled once, so that each sequence's blocks end up
// scattered through the cache, as they are in a server that has been running for a while.
class block_allocator {
public:
    block_allocator(int num_blocks, uint64_t seed) {
        for (int b = num_blocks - 1; b >= 0; --b)
            free_.push_back(b);
        for (size_t i = free_.size(); i > 1; --i) // Fisher-Yates with the portable hash
            std::swap(free_[i - 1], free_[mix(seed + i) % i]);
    }
    int32_t allocate() {
        if (free_.empty()) throw std::runtime_error("the KV cache has no free block left");
        const int32_t b = free_.back();
        free_.pop_back();
        return b;
    }

private:
    std::vector<int32_t> free_;
};

// Caches are large and read by SIMD kernels: zero-filled memory, aligned to 2 MiB and (on Linux)
// advised to use transparent huge pages, as an engine allocating its KV cache would: with 4 KiB
// pages nearly every 4 KiB of a scattered cache block costs a page walk (decode ~5% slower).
struct aligned_buffer {
    static constexpr size_t huge_page = size_t(2) << 20;
    explicit aligned_buffer(size_t bytes) {
        const size_t rounded = std::max(huge_page, (bytes + huge_page - 1) / huge_page * huge_page);
        ptr.reset(std::aligned_alloc(huge_page, rounded));
        if (!ptr) throw std::bad_alloc();
#ifdef __linux__
        madvise(ptr.get(), rounded, MADV_HUGEPAGE); // a hint: ignored where THP is off
#endif
        std::memset(ptr.get(), 0, bytes);
    }
    void *data() const {
        return ptr.get();
    }
    struct free_deleter {
        void operator()(void *p) const { std::free(p); }
    };
    std::unique_ptr<void, free_deleter> ptr;
};

struct run_result {
    std::string write_impl, attend_impl;
    size_t cache_bytes = 0; // K and V caches plus their scales
    double prefill_seconds = 0;
    std::vector<double> decode_step_seconds;
    std::vector<float> prefill_out, decode_out; // every step's dst, in step order
};

double elapsed(std::chrono::steady_clock::time_point since) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Runs the prefill and the decode steps with a cache of type cache_dt.
run_result simulate(const dnnl::engine &eng, const config &c, const std::vector<int> &prompts,
                    const std::vector<step_inputs> &steps, data_type cache_dt) {
    const dim hq = c.q_heads, hkv = c.kv_heads, d = c.head_size, bs = c.block_size;
    const dim num_seqs = c.seqs;

    // Enough blocks for every sequence at its final length, plus one spare per sequence.
    dim num_blocks = 0, table_width = 0;
    for (int p : prompts) {
        const dim blocks = (p + c.steps + bs - 1) / bs;
        num_blocks += blocks + 1;
        table_width = std::max(table_width, blocks);
    }

    // Descriptors: the step's token count is a runtime dim, so one primitive serves prefill and
    // decode; the cache shape, types and options are fixed.
    const tensor_desc cache_md({ num_blocks, hkv, bs, d }, cache_dt, layout::any);
    const tensor_desc new_kv_md({ runtime_dim, hkv, d }, data_type::bf16);
    const tensor_desc query_md({ runtime_dim, hq, d }, data_type::bf16);
    const tensor_desc dst_md({ runtime_dim, hq, d }, data_type::bf16); // the model's activations
    const bool fp8 = cache_dt == data_type::f8_e4m3 || cache_dt == data_type::f8_e5m2;
    primitive_attr attr;
    if (fp8) { // one scale per cached token and head, computed by reshape_and_cache as it writes
        attr.set_scales_mask(ARG_K_CACHE, scales_per_token);
        attr.set_scales_mask(ARG_V_CACHE, scales_per_token);
    }
    paged_attention::options opts; // causal, softmax scale 1/sqrt(head_size)

    const reshape_and_cache::primitive_desc write_pd(
            eng, reshape_and_cache::desc(new_kv_md, new_kv_md, cache_md, cache_md), attr);
    const paged_attention::primitive_desc attend_pd(
            eng, paged_attention::desc(query_md, cache_md, cache_md, dst_md, opts), attr);
    const reshape_and_cache write(write_pd);
    const paged_attention attend(attend_pd);

    // layout::any is resolved by the pd; allocate what it asks for. Both primitives resolve it the
    // same way by design: checked here because a mismatch would read garbage.
    const tensor_desc k_cache_md = write_pd.query_md(ARG_K_CACHE),
                      v_cache_md = write_pd.query_md(ARG_V_CACHE);
    if (k_cache_md != attend_pd.query_md(ARG_K_CACHE) || v_cache_md != attend_pd.query_md(ARG_V_CACHE))
        throw std::runtime_error("reshape_and_cache and paged_attention disagree on the cache layout");
    aligned_buffer k_cache(k_cache_md.get_size()), v_cache(v_cache_md.get_size());
    const tensor_desc scales_md = fp8 ? tensor_desc({ num_blocks, hkv, bs }, data_type::f32) : tensor_desc();
    std::vector<float> k_scales(fp8 ? num_blocks * hkv * bs : 0), v_scales(k_scales.size());

    run_result r;
    r.write_impl = write_pd.impl_info_str();
    r.attend_impl = attend_pd.impl_info_str();
    r.cache_bytes = k_cache_md.get_size() + v_cache_md.get_size() +
                    (k_scales.size() + v_scales.size()) * sizeof(float);

    block_allocator allocator(static_cast<int>(num_blocks), /*seed=*/42);
    std::vector<int32_t> block_table(num_seqs * table_width, -1); // -1: not allocated
    std::vector<int32_t> seq_lens(num_seqs, 0);
    std::vector<int32_t> query_start_loc;
    std::vector<int64_t> slot_mapping;
    dnnl::stream strm(eng);

    for (size_t k = 0; k < steps.size(); ++k) {
        const step_inputs &in = steps[k];
        const dim tokens = in.tokens;

        // Scheduler: give each sequence the blocks its new tokens need, and map every new token to
        // its cache slot (block * block_size + offset in the block).
        query_start_loc.assign(1, 0);
        slot_mapping.clear();
        for (dim s = 0; s < num_seqs; ++s) {
            const int n = in.new_tokens[s];
            for (int i = 0; i < n; ++i) {
                const dim pos = seq_lens[s] + i;
                int32_t &block = block_table[s * table_width + pos / bs];
                if (pos % bs == 0) block = allocator.allocate();
                slot_mapping.push_back(static_cast<int64_t>(block) * bs + pos % bs);
            }
            seq_lens[s] += n; // total KV length including this step's tokens
            query_start_loc.push_back(query_start_loc.back() + in.queries[s]);
        }

        const dim queries = in.query_tokens;
        std::vector<uint16_t> dst(queries * hq * d);
        exec_args write_args = {
            { ARG_KEY, tensor(tensor_desc({ tokens, hkv, d }, data_type::bf16), in.key.data()) },
            { ARG_VALUE, tensor(tensor_desc({ tokens, hkv, d }, data_type::bf16), in.value.data()) },
            { ARG_K_CACHE, tensor(k_cache_md, k_cache.data()) },
            { ARG_V_CACHE, tensor(v_cache_md, v_cache.data()) },
            { ARG_SLOT_MAPPING, tensor(tensor_desc({ tokens }, data_type::s64), slot_mapping.data()) },
        };
        exec_args attend_args = {
            { ARG_QUERY, tensor(tensor_desc({ queries, hq, d }, data_type::bf16), in.query.data()) },
            { ARG_K_CACHE, tensor(k_cache_md, k_cache.data()) },
            { ARG_V_CACHE, tensor(v_cache_md, v_cache.data()) },
            { ARG_BLOCK_TABLE,
              tensor(tensor_desc({ num_seqs, table_width }, data_type::s32), block_table.data()) },
            { ARG_SEQ_LENS, tensor(tensor_desc({ num_seqs }, data_type::s32), seq_lens.data()) },
            { ARG_QUERY_START_LOC,
              tensor(tensor_desc({ num_seqs + 1 }, data_type::s32), query_start_loc.data()) },
            { ARG_DST, tensor(tensor_desc({ queries, hq, d }, data_type::bf16), dst.data()) },
        };
        if (fp8) { // written by reshape_and_cache, read by paged_attention
            for (exec_args *args : { &write_args, &attend_args }) {
                (*args)[ARG_K_SCALES] = tensor(scales_md, k_scales.data());
                (*args)[ARG_V_SCALES] = tensor(scales_md, v_scales.data());
            }
        }

        const auto start = std::chrono::steady_clock::now();
        write.execute(strm, write_args);
        attend.execute(strm, attend_args);
        strm.wait();
        if (k == 0)
            r.prefill_seconds = elapsed(start);
        else
            r.decode_step_seconds.push_back(elapsed(start));

        std::vector<float> &out = k == 0 ? r.prefill_out : r.decode_out;
        for (uint16_t x : dst)
            out.push_back(from_bf16(x));
    }
    return r;
}

// The median resists the spikes of a shared machine better than the mean.
double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// ||a - b||_2 / ||b||_2 in double.
double relative_l2_error(const std::vector<float> &a, const std::vector<float> &b) {
    double diff = 0, ref = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
        ref += static_cast<double>(b[i]) * b[i];
    }
    return std::sqrt(diff / ref);
}

// ---------------------------------------------------------------------------------------------
// Command line.

void print_usage(std::FILE *out) {
    const config c;
    std::fprintf(
            out,
            "usage: decode_demo [flags]\n"
            "Simulates serving: a prefill of several prompts, then decode steps, once with a bf16 KV cache\n"
            "and once with an FP8 (e4m3, per-token scales) cache, and compares the two. The default is a\n"
            "loaded server's cache, far beyond the last-level cache.\n"
            "  --seqs N          sequences (default %d)\n"
            "  --hq N            query heads (default %d)\n"
            "  --hkv N           kv heads, dividing --hq (default %d)\n"
            "  --head-size N     head size (default %d)\n"
            "  --block-size N    tokens per cache block (default %d)\n"
            "  --prompt-min N    shortest prompt (default %d)\n"
            "  --prompt-max N    longest prompt; prompts spread over [min, max] (default %d)\n"
            "  --prefill-queries N  prompt tokens per sequence the prefill attends for, the last ones;\n"
            "                    0: all (default %d)\n"
            "  --steps N         decode steps (default %d)\n"
            "  --small           the in-cache case: 6 sequences of 37..700 tokens, every prompt token\n"
            "                    attended, blocks of 16 (later flags override)\n"
            "  --threshold X     exit with status 1 if the FP8 relative error exceeds X\n"
            "  --help            this text\n",
            c.seqs, c.q_heads, c.kv_heads, c.head_size, c.block_size, c.prompt_min, c.prompt_max,
            c.prefill_queries, c.steps);
}

bool parse_count(const char *text, int &out, bool zero_allowed) {
    char *end = nullptr;
    errno = 0;
    const long v = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || errno != 0 || v < (zero_allowed ? 0 : 1) || v > (1 << 20))
        return false;
    out = static_cast<int>(v);
    return true;
}

// Returns false (after printing why) on a bad command line.
bool parse_args(int argc, char **argv, config &c, bool &help) {
    struct int_flag {
        const char *name;
        int *value;
    };
    const int_flag int_flags[] = { { "--seqs", &c.seqs },
                                   { "--hq", &c.q_heads },
                                   { "--hkv", &c.kv_heads },
                                   { "--head-size", &c.head_size },
                                   { "--block-size", &c.block_size },
                                   { "--prompt-min", &c.prompt_min },
                                   { "--prompt-max", &c.prompt_max },
                                   { "--prefill-queries", &c.prefill_queries },
                                   { "--steps", &c.steps } };
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            help = true;
            return true;
        }
        if (arg == "--small") {
            make_small(c);
            continue;
        }
        if (i + 1 >= argc) {
            std::fprintf(stderr, "decode_demo: %s needs a value (or is unknown); see --help\n", arg.c_str());
            return false;
        }
        const char *value = argv[++i];
        bool known = false, ok = false;
        for (const int_flag &f : int_flags) {
            if (arg != f.name) continue;
            known = true;
            ok = parse_count(value, *f.value, f.value == &c.prefill_queries);
        }
        if (arg == "--threshold") {
            char *end = nullptr;
            c.threshold = std::strtod(value, &end);
            known = true;
            ok = end != value && *end == '\0' && c.threshold >= 0;
        }
        if (!known) {
            std::fprintf(stderr, "decode_demo: unknown flag %s; see --help\n", arg.c_str());
            return false;
        }
        if (!ok) {
            std::fprintf(stderr, "decode_demo: bad value '%s' for %s (expected %s)\n", value, arg.c_str(),
                         arg == "--threshold"         ? "a number >= 0"
                         : arg == "--prefill-queries" ? "an integer >= 0"
                                                      : "a positive integer");
            return false;
        }
    }
    return true;
}

const char *status_name(status s) {
    switch (s) {
        case status::out_of_memory: return "out_of_memory";
        case status::invalid_arguments: return "invalid_arguments";
        case status::unimplemented: return "unimplemented";
        case status::runtime_error: return "runtime_error";
        default: return "error";
    }
}

} // namespace

int main(int argc, char **argv) {
    config c;
    bool help = false;
    if (!parse_args(argc, argv, c, help)) return 2;
    if (help) {
        print_usage(stdout);
        return 0;
    }

    try {
        dnnl::engine eng(dnnl::engine::kind::cpu, 0);
        const std::vector<int> prompts = prompt_lengths(c);
        const std::vector<step_inputs> steps = make_inputs(c, prompts);

        std::printf("pagedattn %s decode demo (CPU ISA available to the library: %s)\n",
                    PAGEDATTN_VERSION_STRING, cpu_isa_name(get_max_cpu_isa()));
        std::printf(
                "  %d sequences, prompts of %d..%d tokens (%d in all; the prefill attends for %d of them),"
                " then %d decode steps\n",
                c.seqs, prompts.front(), prompts.back(), steps[0].tokens, steps[0].query_tokens, c.steps);
        std::printf("  %d query heads, %d kv heads, head size %d, block size %d; query and output bf16\n\n",
                    c.q_heads, c.kv_heads, c.head_size, c.block_size);

        const run_result bf16 = simulate(eng, c, prompts, steps, data_type::bf16);
        const run_result fp8 = simulate(eng, c, prompts, steps, data_type::f8_e4m3);

        // Decode speed from the median step: each step decodes one token per sequence.
        const double bf16_step = median(bf16.decode_step_seconds), fp8_step = median(fp8.decode_step_seconds);
        std::printf("%-8s  %-17s  %-15s  %12s  %10s  %12s  %10s\n", "cache", "reshape_and_cache",
                    "paged_attention", "KV cache MiB", "prefill ms", "decode tok/s", "ms/step");
        const struct {
            const char *name;
            const run_result &r;
            double step_seconds;
        } rows[] = { { "bf16", bf16, bf16_step }, { "f8_e4m3", fp8, fp8_step } };
        for (const auto &row : rows)
            std::printf("%-8s  %-17s  %-15s  %12.2f  %10.1f  %12.1f  %10.3f\n", row.name,
                        row.r.write_impl.c_str(), row.r.attend_impl.c_str(), row.r.cache_bytes / 1048576.0,
                        1e3 * row.r.prefill_seconds, c.seqs / row.step_seconds, 1e3 * row.step_seconds);
        std::printf("(KV cache: K and V caches plus, for FP8, one f32 scale per token and kv head;\n"
                    " decode: reshape_and_cache + paged_attention, median step, one token per sequence)\n\n");
        std::printf("FP8 cache: %.2fx the memory of bf16 (%.0f MiB saved), %.2fx its decode speed\n",
                    static_cast<double>(fp8.cache_bytes) / bf16.cache_bytes,
                    (static_cast<double>(bf16.cache_bytes) - fp8.cache_bytes) / 1048576.0,
                    bf16_step / fp8_step);

        const double prefill_error = relative_l2_error(fp8.prefill_out, bf16.prefill_out);
        const double decode_error = relative_l2_error(fp8.decode_out, bf16.decode_out);
        std::printf("relative L2 error of the FP8 outputs against bf16: decode %.5f, prefill %.5f\n",
                    decode_error, prefill_error);
        if (c.threshold >= 0) {
            // Written so that a NaN error fails too.
            const bool pass = decode_error <= c.threshold && prefill_error <= c.threshold;
            std::printf("threshold %g: %s\n", c.threshold, pass ? "passed" : "FAILED");
            if (!pass) return 1;
        }
        return 0;
    } catch (const pagedattn::error &e) {
        std::fprintf(stderr, "decode_demo: pagedattn error (%s): %s\n", status_name(e.get_status()),
                     e.what());
    } catch (const dnnl::error &e) {
        std::fprintf(stderr, "decode_demo: oneDNN error (status %d): %s\n", static_cast<int>(e.status),
                     e.what());
    } catch (const std::exception &e) {
        std::fprintf(stderr, "decode_demo: %s\n", e.what());
    }
    return 1;
}
