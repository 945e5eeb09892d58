// Helpers shared by the attention test suites: random data, paged caches and batches, running
// reshape_and_cache to fill a cache, and comparing a primitive's output with the fp64 oracle.
//
// Tolerances (every comparison of paged_attention against the oracle uses attention_tol):
//   The oracle is exact (fp64) on the same stored inputs, so what remains is the kernel's own f32
//   arithmetic and the final rounding to dst. The oracle reports, per output element, how sensitive
//   it is to a relative rounding of the scores (err_score) and the magnitude of what is summed
//   (err_sum); the tolerance is
//     f32_rounding_units * 2^-24 * (err_score + err_sum) + u_dst * (|o| + err_sum)
//       + 2 * FLT_MIN * v_abs_sum + floor_dst
//   which depends on the dst type only, never on the cache type (FP8 gets no extra slack there).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "oracle.hpp"
#include "pagedattn/pagedattn.hpp"
#include "reference_formats.hpp"

namespace test_util {

namespace pa = pagedattn;
using reference::format;

/// PAGEDATTN_TEST_REDUCED=1 (the sanitizer build): the largest cases are skipped.
/// PAGEDATTN_MAX_CPU_ISA as the tests read it, from the documented names (case-insensitive); unset or
/// unknown means no cap.
inline pa::cpu_isa environment_cap() {
    const char *value = std::getenv("PAGEDATTN_MAX_CPU_ISA");
    if (!value) return pa::cpu_isa::all;
    std::string v(value);
    for (char &c : v)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (v == "generic") return pa::cpu_isa::generic;
    if (v == "avx2") return pa::cpu_isa::avx2;
    if (v == "avx512") return pa::cpu_isa::avx512;
    if (v == "avx512_bf16") return pa::cpu_isa::avx512_bf16;
    if (v == "amx") return pa::cpu_isa::amx;
    return pa::cpu_isa::all;
}

inline bool reduced() {
    const char *e = std::getenv("PAGEDATTN_TEST_REDUCED");
    return e != nullptr && std::string(e) == "1";
}

inline const dnnl::engine &engine() {
    static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    return eng;
}
inline dnnl::stream make_stream() {
    return dnnl::stream(engine());
}

// ---------------------------------------------------------------------------------------------
// Formats

inline pa::data_type dt_of(format f) {
    switch (f) {
        case format::f32: return pa::data_type::f32;
        case format::bf16: return pa::data_type::bf16;
        case format::f16: return pa::data_type::f16;
        case format::e4m3: return pa::data_type::f8_e4m3;
        case format::e5m2: return pa::data_type::f8_e5m2;
    }
    return pa::data_type::undef;
}
inline int64_t size_of(format f) {
    return f == format::f32 ? 4 : (f == format::bf16 || f == format::f16) ? 2 : 1;
}
inline const char *name_of(format f) {
    switch (f) {
        case format::f32: return "f32";
        case format::bf16: return "bf16";
        case format::f16: return "f16";
        case format::e4m3: return "e4m3";
        case format::e5m2: return "e5m2";
    }
    return "?";
}
inline bool is_fp8(format f) {
    return f == format::e4m3 || f == format::e5m2;
}

/// Unit roundoff of a format: half its relative spacing (f32 2^-24, f16 2^-11, bf16 2^-8, e4m3 2^-4,
/// e5m2 2^-3: 23, 10, 7, 3 and 2 stored mantissa bits).
inline double unit_roundoff(format f) {
    switch (f) {
        case format::f32: return 0x1p-24;
        case format::f16: return 0x1p-11;
        case format::bf16: return 0x1p-8;
        case format::e4m3: return 0x1p-4;
        case format::e5m2: return 0x1p-3;
    }
    return 1.0;
}

/// Bound of |decode(encode(x / scale)) * scale - x| for an FP8 format when x / scale does not
/// exceed the largest finite value: half an ulp relative (normal range) plus half the subnormal
/// spacing (e4m3 2^-9 / 2, e5m2 2^-16 / 2) times the scale.
inline double fp8_error_bound(format f, double x, double scale) {
    const double half_subnormal = f == format::e4m3 ? 0x1p-10 : 0x1p-17;
    return unit_roundoff(f) * std::fabs(x) + half_subnormal * scale;
}

/// Exactly stores a value that the format represents (the generators below only make such values);
/// throws otherwise, so a generator bug cannot silently change the inputs.
inline void store_exact(void *base, format f, int64_t i, float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    auto *p = static_cast<unsigned char *>(base);
    if (f == format::f32) {
        std::memcpy(p + 4 * i, &x, 4);
        return;
    }
    if (f == format::bf16) {
        if ((bits & 0xFFFFu) != 0) throw std::logic_error("store_exact: not a bf16 value");
        const uint16_t h = static_cast<uint16_t>(bits >> 16);
        std::memcpy(p + 2 * i, &h, 2);
        return;
    }
    if (f == format::f16) {
        const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
        uint16_t h = sign;
        if ((bits & 0x7FFFFFFFu) != 0) {
            const int e = static_cast<int>((bits >> 23) & 0xFF) - 127;
            const uint32_t m = bits & 0x7FFFFFu;
            if (e < -14 || e > 15 || (m & 0x1FFFu) != 0)
                throw std::logic_error("store_exact: not an f16 normal");
            h = static_cast<uint16_t>(sign | ((e + 15) << 10) | (m >> 13));
        }
        std::memcpy(p + 2 * i, &h, 2);
        return;
    }
    throw std::logic_error("store_exact: FP8 is written by reshape_and_cache or as codes");
}

/// Rounds x to the format by its reference definition (slow for FP8: for a few values only).
inline void store_rounded(void *base, format f, int64_t i, double x) {
    auto *p = static_cast<unsigned char *>(base);
    uint16_t h = 0;
    switch (f) {
        case format::f32: {
            const float v = static_cast<float>(x);
            std::memcpy(p + 4 * i, &v, 4);
            return;
        }
        case format::bf16: h = reference::double_to_bf16(x); break;
        case format::f16: h = reference::double_to_f16(x); break;
        case format::e4m3:
        case format::e5m2: p[i] = reference::encode_fp8_slow(f, x); return;
    }
    std::memcpy(p + 2 * i, &h, 2);
}

// ---------------------------------------------------------------------------------------------
// Memory and random data

/// 64-byte aligned bytes, filled with 0xFF on creation: a NaN in every format (f32/bf16/f16 all-ones,
/// e4m3 S.1111.111, e5m2 S.11111.11), so anything the library reads that the test did not write
/// poisons the result, and anything it should have written but did not stays NaN.
class buffer {
public:
    buffer() = default;
    explicit buffer(size_t bytes) : bytes_(bytes), mem_(allocate(bytes)) { fill(0xFF); }
    buffer(const buffer &o) : buffer(o.bytes_) {
        if (bytes_) std::memcpy(data(), o.data(), bytes_);
    }
    buffer &operator=(const buffer &o) {
        if (this != &o) *this = buffer(o);
        return *this;
    }
    buffer(buffer &&) noexcept = default;
    buffer &operator=(buffer &&) noexcept = default;

    unsigned char *data() { return mem_.get(); }
    const unsigned char *data() const { return mem_.get(); }
    size_t size() const { return bytes_; }
    void fill(unsigned char b) {
        if (bytes_) std::memset(data(), b, bytes_);
    }
    template <typename T> T *as() { return reinterpret_cast<T *>(data()); }
    template <typename T> const T *as() const { return reinterpret_cast<const T *>(data()); }

private:
    struct release {
        void operator()(unsigned char *p) const { ::operator delete(p, std::align_val_t(64)); }
    };
    static std::unique_ptr<unsigned char, release> allocate(size_t bytes) {
        // One spare byte so that an empty tensor still has a valid, distinct pointer.
        return std::unique_ptr<unsigned char, release>(
                static_cast<unsigned char *>(::operator new(bytes + 1, std::align_val_t(64))));
    }
    size_t bytes_ = 0;
    std::unique_ptr<unsigned char, release> mem_ = allocate(0);
};

class rng {
public:
    explicit rng(uint64_t seed) : gen_(seed) {}
    double normal() { return std::normal_distribution<double>(0.0, 1.0)(gen_); }
    double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(gen_); }
    int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen_); }
    /// ~N(0, 1) on a grid of 1/32 with |x| < 8: exact in f32, bf16 and f16 alike, so the same numbers
    /// reach the library whatever the input type, while FP8 (4 or 3 significant bits) must round.
    float coarse_normal() {
        const double k = std::max(-255.0, std::min(255.0, std::nearbyint(normal() * 32.0)));
        return static_cast<float>(k / 32.0);
    }
    std::mt19937_64 &engine() { return gen_; }

private:
    std::mt19937_64 gen_;
};

inline uint64_t seed_of(const std::string &s) {
    uint64_t h = 1469598103934665603ull; // FNV-1a: a stable seed per case name
    for (char c : s)
        h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    return h;
}

/// Sets `count` random elements of x to +-300 (representable in f32/bf16/f16; far beyond the
/// per-tensor e4m3 range at scale 0.037, so it saturates there).
inline void add_outliers(std::vector<float> &x, int count, rng &r) {
    if (x.empty()) return;
    for (int i = 0; i < count; ++i) {
        const auto at = static_cast<size_t>(r.integer(0, static_cast<int64_t>(x.size()) - 1));
        x[at] = (i % 2 == 0) ? 300.f : -300.f;
    }
}

// ---------------------------------------------------------------------------------------------
// Paged caches and batches

enum class cache_layout { hnd, nhd, kv_shared };
inline const char *name_of(cache_layout l) {
    return l == cache_layout::hnd ? "hnd" : l == cache_layout::nhd ? "nhd" : "kvshared";
}

/// A plain-layout K/V cache pair. HND and NHD use one allocation per cache; kv_shared holds K and V
/// of each block side by side in one allocation ([num_blocks, 2, block_size, Hkv, D], as
/// flashinfer/vLLM do), so both caches have the same strides and V starts one half-block later.
struct kv_cache {
    format fmt = format::f32;
    int64_t num_blocks = 0, kv_heads = 0, block_size = 0, head_size = 0;
    cache_layout layout = cache_layout::hnd;
    int64_t block_stride = 0, head_stride = 0, token_stride = 0;
    buffer k_mem, v_mem;  // v_mem unused for kv_shared
    int64_t v_offset = 0; // elements from k_mem's start to V, for kv_shared

    void *k() { return k_mem.data(); }
    void *v() {
        return layout == cache_layout::kv_shared ? k_mem.data() + v_offset * size_of(fmt) : v_mem.data();
    }
    const void *k() const { return const_cast<kv_cache *>(this)->k(); }
    const void *v() const { return const_cast<kv_cache *>(this)->v(); }
    int64_t offset(int64_t b, int64_t h, int64_t t) const {
        return b * block_stride + h * head_stride + t * token_stride;
    }
    pa::tensor_desc md() const {
        return pa::tensor_desc({ num_blocks, kv_heads, block_size, head_size }, dt_of(fmt),
                               { block_stride, head_stride, token_stride, 1 });
    }
    oracle::paged_cache view(bool is_k, oracle::scales kind, const float *scales) const {
        oracle::paged_cache c;
        c.data = is_k ? k() : v();
        c.fmt = fmt;
        c.block_stride = block_stride;
        c.head_stride = head_stride;
        c.token_stride = token_stride;
        c.scale_kind = kind;
        c.scale_values = scales;
        return c;
    }
};

inline kv_cache make_cache(format f, int64_t nb, int64_t hkv, int64_t bs, int64_t d, cache_layout l) {
    kv_cache c;
    c.fmt = f;
    c.num_blocks = nb;
    c.kv_heads = hkv;
    c.block_size = bs;
    c.head_size = d;
    c.layout = l;
    const auto es = static_cast<size_t>(size_of(f));
    switch (l) {
        case cache_layout::hnd:
            c.block_stride = hkv * bs * d;
            c.head_stride = bs * d;
            c.token_stride = d;
            break;
        case cache_layout::nhd:
            c.block_stride = bs * hkv * d;
            c.head_stride = d;
            c.token_stride = hkv * d;
            break;
        case cache_layout::kv_shared:
            c.block_stride = 2 * bs * hkv * d;
            c.head_stride = d;
            c.token_stride = hkv * d;
            c.v_offset = bs * hkv * d;
            break;
    }
    const auto elems = static_cast<size_t>(nb * c.block_stride);
    c.k_mem = buffer(elems * es);
    if (l != cache_layout::kv_shared) c.v_mem = buffer(elems * es);
    return c;
}

/// Sequences of one step with their block table. Sequence s owns ceil(seq_len / block_size) blocks
/// taken from a permutation of the cache's blocks (shuffled unless in order); a few blocks stay
/// unused, and the table's unused entries and row padding hold out-of-range garbage that the
/// library must not read.
struct batch {
    int64_t num_seqs = 0, block_size = 1, num_blocks = 0, width = 1, row_stride = 1;
    int64_t tokens = 0, context_tokens = 0;
    std::vector<int32_t> q_lens, seq_lens, query_start_loc, context_start, block_table;

    int32_t block_of(int64_t s, int64_t j) const {
        return block_table[static_cast<size_t>(s * row_stride + j / block_size)];
    }
    int64_t slot_of(int64_t s, int64_t j) const { return block_of(s, j) * block_size + j % block_size; }
    int64_t max_seq_len() const {
        return seq_lens.empty() ? 0 : *std::max_element(seq_lens.begin(), seq_lens.end());
    }
};

/// seqs: (q_len, seq_len) per sequence.
inline batch make_batch(const std::vector<std::pair<int, int>> &seqs, int64_t block_size, rng &r,
                        bool shuffle, int64_t extra_blocks = 3) {
    batch b;
    b.num_seqs = static_cast<int64_t>(seqs.size());
    b.block_size = block_size;
    int64_t needed = 0, widest = 0;
    b.query_start_loc.push_back(0);
    for (const auto &qs : seqs) {
        if (qs.first > qs.second) throw std::logic_error("make_batch: q_len > seq_len");
        b.q_lens.push_back(qs.first);
        b.seq_lens.push_back(qs.second);
        b.query_start_loc.push_back(b.query_start_loc.back() + qs.first);
        b.context_start.push_back(static_cast<int32_t>(b.context_tokens));
        b.context_tokens += qs.second;
        const int64_t nblk = (qs.second + block_size - 1) / block_size;
        needed += nblk;
        widest = std::max(widest, nblk);
    }
    b.tokens = b.query_start_loc.back();
    b.num_blocks = needed + extra_blocks;
    b.width = widest + 1;
    b.row_stride = b.width + 2;
    std::vector<int32_t> perm(static_cast<size_t>(b.num_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    if (shuffle) std::shuffle(perm.begin(), perm.end(), r.engine());
    b.block_table.assign(static_cast<size_t>(b.num_seqs * b.row_stride), 0);
    size_t next = 0;
    for (int64_t s = 0; s < b.num_seqs; ++s) {
        const int64_t nblk = (b.seq_lens[static_cast<size_t>(s)] + block_size - 1) / block_size;
        for (int64_t i = 0; i < b.row_stride; ++i) {
            int32_t &e = b.block_table[static_cast<size_t>(s * b.row_stride + i)];
            if (i < nblk)
                e = perm[next++];
            else
                e = (i % 2 == 0) ? static_cast<int32_t>(b.num_blocks + 1000) : -3; // never read
        }
    }
    return b;
}

// ---------------------------------------------------------------------------------------------
// Scales

inline int scales_mask(oracle::scales k) {
    switch (k) {
        case oracle::scales::per_tensor: return pa::scales_per_tensor;
        case oracle::scales::per_kv_head: return pa::scales_per_kv_head;
        case oracle::scales::per_token: return pa::scales_per_token;
        case oracle::scales::none: break;
    }
    return -1;
}
inline const char *name_of(oracle::scales k) {
    switch (k) {
        case oracle::scales::none: return "none";
        case oracle::scales::per_tensor: return "tensor";
        case oracle::scales::per_kv_head: return "head";
        case oracle::scales::per_token: return "token";
    }
    return "?";
}

/// Scale values of one cache: [1], [Hkv] or [num_blocks, Hkv, block_size] (the latter NaN until
/// reshape_and_cache writes them).
struct scales_spec {
    oracle::scales kind = oracle::scales::none;
    std::vector<float> values;

    double at(int64_t b, int64_t h, int64_t t, int64_t kv_heads, int64_t block_size) const {
        switch (kind) {
            case oracle::scales::none: return 1.0;
            case oracle::scales::per_tensor: return values[0];
            case oracle::scales::per_kv_head: return values[static_cast<size_t>(h)];
            case oracle::scales::per_token:
                return values[static_cast<size_t>((b * kv_heads + h) * block_size + t)];
        }
        return NAN;
    }
    pa::tensor_desc md(int64_t nb, int64_t hkv, int64_t bs) const {
        if (kind == oracle::scales::per_tensor) return pa::tensor_desc({ 1 }, pa::data_type::f32);
        if (kind == oracle::scales::per_kv_head) return pa::tensor_desc({ hkv }, pa::data_type::f32);
        return pa::tensor_desc({ nb, hkv, bs }, pa::data_type::f32);
    }
};

/// per_tensor: {a}; per_kv_head: a, b, a, b, ...; per_token: NaN placeholders to be written.
inline scales_spec make_scales(oracle::scales kind, float a, float b, int64_t nb, int64_t hkv, int64_t bs) {
    scales_spec s;
    s.kind = kind;
    if (kind == oracle::scales::per_tensor) s.values = { a };
    if (kind == oracle::scales::per_kv_head)
        for (int64_t h = 0; h < hkv; ++h)
            s.values.push_back(h % 2 == 0 ? a : b);
    if (kind == oracle::scales::per_token) s.values.assign(static_cast<size_t>(nb * hkv * bs), NAN);
    return s;
}

/// DESIGN §3: the per-token scale of a token written by reshape_and_cache,
/// max(amax_d |x_d| / fp8_max, FLT_MIN) in f32 arithmetic.
inline float expected_token_scale(const float *x, int64_t d, format f) {
    float amax = 0.f;
    for (int64_t i = 0; i < d; ++i)
        if (!std::isnan(x[i])) amax = std::max(amax, std::fabs(x[i]));
    return std::max(amax / static_cast<float>(reference::fp8_max(f)), FLT_MIN);
}

// ---------------------------------------------------------------------------------------------
// Comparison

/// 32 units of f32 rounding on the scores' sensitivity: the f32 dot product (about sqrt(D) units of
/// its sum of |q_e k_e| for D <= 512 with blocked accumulation, far below the worst case D units),
/// the soft-cap/ALiBi/max subtraction, exp and the normalization each add a few units.
constexpr double f32_rounding_units = 32.0;

/// f32 exp underflows below e^-87: a probability under FLT_MIN may be flushed to 0 or clamped to
/// about FLT_MIN, so each visible V value may be off by FLT_MIN times itself; 2 for the rounding.
constexpr double underflow_units = 2.0;

/// Smallest absolute error worth reporting in dst: half the f16 subnormal spacing for f16 outputs.
inline double dst_floor(format dst) {
    return dst == format::f16 ? 0x1p-25 : 1e-37;
}

/// The tolerance class of paged_attention against the oracle on the same stored inputs (see top).
/// u_dst * |o| is the final rounding; u_dst * err_sum lets a kernel whose dst is that coarse round an
/// intermediate (the probabilities, a partial sum) to the same precision, but no coarser.
inline double attention_tol(const oracle::result &r, size_t i, format dst) {
    return f32_rounding_units * 0x1p-24 * (r.err_score[i] + r.err_sum[i]) +
           unit_roundoff(dst) * (std::fabs(r.out[i]) + r.err_sum[i]) +
           underflow_units * FLT_MIN * r.v_abs_sum[i] + dst_floor(dst);
}

struct comparison {
    int64_t checked = 0, failures = 0;
    double max_ratio = 0; // max |got - want| / tol over finite expectations
    std::string report;   // the first failures
};

inline std::ostream &operator<<(std::ostream &os, const comparison &c) {
    return os << "checked " << c.checked << ", failures " << c.failures << ", max err/tol " << c.max_ratio
              << "\n"
              << c.report;
}

/// Compares dst (format `fmt`, dense [T, Hq, D]) with the oracle. want NaN requires got NaN and
/// want +-inf requires the same infinity; otherwise |got - want| <= tol(i). `row_ok(t, h)` may
/// exclude rows.
template <typename Tol, typename RowOk>
comparison compare(const void *dst, format fmt, const oracle::result &ref, Tol tol, RowOk row_ok) {
    comparison c;
    std::ostringstream os;
    for (int64_t t = 0; t < ref.tokens; ++t)
        for (int64_t h = 0; h < ref.heads; ++h) {
            if (!row_ok(t, h)) continue;
            for (int64_t d = 0; d < ref.head_size; ++d) {
                const size_t i = ref.index(t, h, d);
                const double got = reference::load(dst, fmt, static_cast<int64_t>(i));
                const double want = ref.out[i];
                bool ok;
                double ratio = 0;
                double bound = 0;
                if (std::isnan(want)) {
                    ok = std::isnan(got);
                } else if (std::isinf(want)) {
                    ok = got == want;
                } else {
                    bound = tol(i);
                    ratio = std::fabs(got - want) / bound;
                    ok = ratio <= 1.0; // false for NaN got
                    if (std::isnan(ratio)) ratio = INFINITY;
                    c.max_ratio = std::max(c.max_ratio, ratio);
                }
                ++c.checked;
                if (!ok) {
                    if (c.failures < 8)
                        os << "  [t " << t << ", h " << h << ", d " << d << "] got " << got << " want "
                           << want << " tol " << bound << "\n";
                    ++c.failures;
                }
            }
        }
    c.report = os.str();
    return c;
}

template <typename Tol> comparison compare(const void *dst, format fmt, const oracle::result &ref, Tol tol) {
    return compare(dst, fmt, ref, tol, [](int64_t, int64_t) { return true; });
}

/// Compares against the oracle with the attention tolerance class of the dst format.
inline comparison compare_attention(const void *dst, format fmt, const oracle::result &ref) {
    return compare(dst, fmt, ref, [&](size_t i) { return attention_tol(ref, i, fmt); });
}

// ---------------------------------------------------------------------------------------------
// A random attention problem: inputs, a cache filled by reshape_and_cache, and the oracle.

struct attn_case {
    std::string tag;
    int64_t hq = 4, hkv = 4, d = 32, bs = 16;
    std::vector<std::pair<int, int>> seqs; // (q_len, seq_len)
    format q_fmt = format::f32, dst_fmt = format::f32, cache_fmt = format::f32;
    cache_layout layout = cache_layout::hnd;
    oracle::scales k_scales = oracle::scales::none, v_scales = oracle::scales::none;
    float scale_a = 1.f, scale_b = 1.f;
    bool causal = true;
    int64_t left = -1, right = -1;
    float soft_cap = 0.f, softmax_scale = 0.f;
    bool alibi = false, sinks = false, outliers = false, shuffle = true, slots64 = true, large = false;

    attn_case &scales(oracle::scales k, oracle::scales v, float a = 1.f, float b = 1.f) {
        k_scales = k;
        v_scales = v;
        scale_a = a;
        scale_b = b;
        return *this;
    }
    attn_case &window(int64_t l, int64_t r) {
        left = l;
        right = r;
        return *this;
    }
    attn_case &non_causal() {
        causal = false;
        return *this;
    }
    attn_case &cap(float c) {
        soft_cap = c;
        return *this;
    }
    attn_case &with_alibi() {
        alibi = true;
        return *this;
    }
    attn_case &with_sinks() {
        sinks = true;
        return *this;
    }
    attn_case &with_outliers() {
        outliers = true;
        return *this;
    }
    attn_case &in_order() {
        shuffle = false;
        return *this;
    }
    attn_case &slots32() {
        slots64 = false;
        return *this;
    }
    attn_case &is_large() {
        large = true;
        return *this;
    }
    attn_case &dst(format f) {
        dst_fmt = f;
        return *this;
    }
    attn_case &scale(float s) {
        softmax_scale = s;
        return *this;
    }

    /// Test name: every property of the case, [A-Za-z0-9_] only.
    std::string name() const {
        std::ostringstream os;
        os << tag << "_h" << hq << "x" << hkv << "_d" << d << "_bs" << bs << "_q" << name_of(q_fmt);
        if (dst_fmt != q_fmt) os << "_dst" << name_of(dst_fmt);
        os << "_" << name_of(cache_fmt);
        if (k_scales != oracle::scales::none) os << "_k" << name_of(k_scales);
        if (v_scales != oracle::scales::none) os << "_v" << name_of(v_scales);
        os << "_" << name_of(layout) << (causal ? "_causal" : "_noncausal");
        if (left >= 0 || right >= 0)
            os << "_win" << (left < 0 ? std::string("inf") : std::to_string(left)) << "_"
               << (right < 0 ? std::string("inf") : std::to_string(right));
        if (soft_cap > 0) os << "_cap" << static_cast<int>(soft_cap);
        if (softmax_scale != 0) os << "_scaled";
        if (alibi) os << "_alibi";
        if (sinks) os << "_sinks";
        if (outliers) os << "_outliers";
        if (!shuffle) os << "_inorder";
        if (!slots64) os << "_slots32";
        return os.str();
    }
};

/// gtest prints the case by its name instead of its bytes.
inline void PrintTo(const attn_case &c, std::ostream *os) {
    *os << c.name();
}

inline attn_case make_case(std::string tag, int64_t hq, int64_t hkv, int64_t d, int64_t bs,
                           std::vector<std::pair<int, int>> seqs, format q, format cache,
                           cache_layout layout) {
    attn_case c;
    c.tag = std::move(tag);
    c.hq = hq;
    c.hkv = hkv;
    c.d = d;
    c.bs = bs;
    c.seqs = std::move(seqs);
    c.q_fmt = q;
    c.dst_fmt = q;
    c.cache_fmt = cache;
    c.layout = layout;
    return c;
}

struct attn_setup {
    attn_case c;
    batch b;
    std::vector<float> k_in, v_in; // [context_tokens, Hkv, D]: the exact inputs of reshape_and_cache
    std::vector<float> q_in;       // [T, Hq, D]
    buffer q;                      // q_in stored in q_fmt
    kv_cache cache;
    scales_spec ks, vs;
    std::vector<float> alibi, sinks;
    pa::paged_attention::options opts;

    oracle::problem problem() const {
        oracle::problem p;
        p.num_heads = c.hq;
        p.num_kv_heads = c.hkv;
        p.head_size = c.d;
        p.block_size = c.bs;
        p.num_blocks = b.num_blocks;
        p.num_seqs = b.num_seqs;
        p.seq_lens = b.seq_lens.data();
        p.query_start_loc = b.query_start_loc.data();
        p.block_table = b.block_table.data();
        p.block_table_stride = b.row_stride;
        p.softmax_scale = opts.softmax_scale == 0.f ? 1.0 / std::sqrt(static_cast<double>(c.d))
                                                    : static_cast<double>(opts.softmax_scale);
        p.causal = opts.causal;
        p.window_left = opts.window_left;
        p.window_right = opts.window_right;
        p.soft_cap = opts.soft_cap;
        p.alibi_slopes = c.alibi ? alibi.data() : nullptr;
        p.sinks = c.sinks ? sinks.data() : nullptr;
        return p;
    }
    oracle::query query_view() const {
        oracle::query v;
        v.data = q.data();
        v.fmt = c.q_fmt;
        v.token_stride = c.hq * c.d;
        v.head_stride = c.d;
        return v;
    }
    /// The oracle on the cache exactly as stored (decoded codes times the scales in use).
    oracle::result oracle_on_cache() const {
        return oracle::paged_attention(problem(), query_view(), cache.view(true, ks.kind, ks.values.data()),
                                       cache.view(false, vs.kind, vs.values.data()));
    }

    pa::primitive_attr attr() const {
        pa::primitive_attr a;
        if (ks.kind != oracle::scales::none) a.set_scales_mask(pa::ARG_K_CACHE, scales_mask(ks.kind));
        if (vs.kind != oracle::scales::none) a.set_scales_mask(pa::ARG_V_CACHE, scales_mask(vs.kind));
        return a;
    }
    pa::paged_attention::desc desc() const {
        const pa::tensor_desc qmd({ pa::runtime_dim, c.hq, c.d }, dt_of(c.q_fmt));
        const pa::tensor_desc dmd({ pa::runtime_dim, c.hq, c.d }, dt_of(c.dst_fmt));
        return pa::paged_attention::desc(qmd, cache.md(), cache.md(), dmd, opts);
    }
    buffer make_dst() const {
        return buffer(static_cast<size_t>(b.tokens * c.hq * c.d * size_of(c.dst_fmt)));
    }

    /// Arguments of paged_attention; q_data/dst override the setup's query and destination.
    pa::exec_args args(const void *q_data, void *dst) const {
        const int64_t nb = b.num_blocks;
        pa::exec_args a {
            { pa::ARG_QUERY, pa::tensor(pa::tensor_desc({ b.tokens, c.hq, c.d }, dt_of(c.q_fmt)), q_data) },
            { pa::ARG_K_CACHE, pa::tensor(cache.md(), cache.k()) },
            { pa::ARG_V_CACHE, pa::tensor(cache.md(), cache.v()) },
            { pa::ARG_BLOCK_TABLE,
              pa::tensor(pa::tensor_desc({ b.num_seqs, b.width }, pa::data_type::s32, { b.row_stride, 1 }),
                         b.block_table.data()) },
            { pa::ARG_SEQ_LENS,
              pa::tensor(pa::tensor_desc({ b.num_seqs }, pa::data_type::s32), b.seq_lens.data()) },
            { pa::ARG_QUERY_START_LOC,
              pa::tensor(pa::tensor_desc({ b.num_seqs + 1 }, pa::data_type::s32), b.query_start_loc.data()) },
            { pa::ARG_DST, pa::tensor(pa::tensor_desc({ b.tokens, c.hq, c.d }, dt_of(c.dst_fmt)), dst) },
        };
        if (c.alibi)
            a[pa::ARG_ALIBI_SLOPES] = pa::tensor(pa::tensor_desc({ c.hq }, pa::data_type::f32), alibi.data());
        if (c.sinks)
            a[pa::ARG_SINKS] = pa::tensor(pa::tensor_desc({ c.hq }, pa::data_type::f32), sinks.data());
        if (ks.kind != oracle::scales::none)
            a[pa::ARG_K_SCALES] = pa::tensor(ks.md(nb, c.hkv, c.bs), ks.values.data());
        if (vs.kind != oracle::scales::none)
            a[pa::ARG_V_SCALES] = pa::tensor(vs.md(nb, c.hkv, c.bs), vs.values.data());
        return a;
    }
};

/// Builds the inputs and fills the cache with reshape_and_cache (all context tokens in one call).
inline attn_setup build_setup(const attn_case &c) {
    attn_setup s;
    s.c = c;
    rng r(seed_of(c.name()));
    s.b = make_batch(c.seqs, c.bs, r, c.shuffle);
    const int64_t ctx = s.b.context_tokens, T = s.b.tokens;
    s.k_in.resize(static_cast<size_t>(ctx * c.hkv * c.d));
    s.v_in.resize(s.k_in.size());
    s.q_in.resize(static_cast<size_t>(T * c.hq * c.d));
    for (auto &x : s.k_in)
        x = r.coarse_normal();
    for (auto &x : s.v_in)
        x = r.coarse_normal();
    for (auto &x : s.q_in)
        x = r.coarse_normal();
    if (c.outliers) {
        add_outliers(s.k_in, 6, r);
        add_outliers(s.v_in, 6, r);
        add_outliers(s.q_in, 4, r);
    }
    s.q = buffer(s.q_in.size() * static_cast<size_t>(size_of(c.q_fmt)));
    for (size_t i = 0; i < s.q_in.size(); ++i)
        store_exact(s.q.data(), c.q_fmt, static_cast<int64_t>(i), s.q_in[i]);

    s.cache = make_cache(c.cache_fmt, s.b.num_blocks, c.hkv, c.bs, c.d, c.layout);
    s.ks = make_scales(c.k_scales, c.scale_a, c.scale_b, s.b.num_blocks, c.hkv, c.bs);
    s.vs = make_scales(c.v_scales, c.scale_b, c.scale_a, s.b.num_blocks, c.hkv, c.bs);

    if (c.alibi)
        for (int64_t h = 0; h < c.hq; ++h)
            s.alibi.push_back(static_cast<float>(r.uniform(0.0, 0.25)));
    if (c.sinks)
        for (int64_t h = 0; h < c.hq; ++h)
            s.sinks.push_back(static_cast<float>(r.uniform(-1.0, 4.0)));
    s.opts.softmax_scale = c.softmax_scale;
    s.opts.causal = c.causal;
    s.opts.window_left = c.left;
    s.opts.window_right = c.right;
    s.opts.soft_cap = c.soft_cap;
    s.opts.alibi_slopes = c.alibi;
    s.opts.sinks = c.sinks;

    // reshape_and_cache: key/value in the query's type (exact: the values are on a coarse grid).
    const format in_fmt = c.q_fmt;
    buffer kb(s.k_in.size() * static_cast<size_t>(size_of(in_fmt))), vb(kb.size());
    for (size_t i = 0; i < s.k_in.size(); ++i) {
        store_exact(kb.data(), in_fmt, static_cast<int64_t>(i), s.k_in[i]);
        store_exact(vb.data(), in_fmt, static_cast<int64_t>(i), s.v_in[i]);
    }
    std::vector<int64_t> slots64;
    std::vector<int32_t> slots32;
    for (int64_t q = 0; q < s.b.num_seqs; ++q)
        for (int64_t j = 0; j < s.b.seq_lens[static_cast<size_t>(q)]; ++j) {
            slots64.push_back(s.b.slot_of(q, j));
            slots32.push_back(static_cast<int32_t>(s.b.slot_of(q, j)));
        }
    const pa::tensor_desc kv_md({ pa::runtime_dim, c.hkv, c.d }, dt_of(in_fmt));
    pa::reshape_and_cache::desc rd(kv_md, kv_md, s.cache.md(), s.cache.md());
    pa::reshape_and_cache::primitive_desc rpd(engine(), rd, s.attr());
    pa::reshape_and_cache prim(rpd);
    const pa::tensor_desc kv_run({ ctx, c.hkv, c.d }, dt_of(in_fmt));
    pa::exec_args a {
        { pa::ARG_KEY, pa::tensor(kv_run, kb.data()) },
        { pa::ARG_VALUE, pa::tensor(kv_run, vb.data()) },
        { pa::ARG_K_CACHE, pa::tensor(rpd.query_md(pa::ARG_K_CACHE), s.cache.k()) },
        { pa::ARG_V_CACHE, pa::tensor(rpd.query_md(pa::ARG_V_CACHE), s.cache.v()) },
        { pa::ARG_SLOT_MAPPING,
          c.slots64 ? pa::tensor(pa::tensor_desc({ ctx }, pa::data_type::s64), slots64.data())
                    : pa::tensor(pa::tensor_desc({ ctx }, pa::data_type::s32), slots32.data()) },
    };
    if (s.ks.kind != oracle::scales::none)
        a[pa::ARG_K_SCALES] = pa::tensor(s.ks.md(s.b.num_blocks, c.hkv, c.bs), s.ks.values.data());
    if (s.vs.kind != oracle::scales::none)
        a[pa::ARG_V_SCALES] = pa::tensor(s.vs.md(s.b.num_blocks, c.hkv, c.bs), s.vs.values.data());
    dnnl::stream st = make_stream();
    prim.execute(st, a);
    st.wait();
    return s;
}

/// The context token index (row of k_in/v_in) of token j of sequence s.
inline int64_t context_row(const batch &b, int64_t s, int64_t j) {
    return b.context_start[static_cast<size_t>(s)] + j;
}

/// Checks that reshape_and_cache wrote per-token scales by the definition (for every written slot).
inline void expect_token_scales(const attn_setup &s) {
    const auto check = [&](const scales_spec &sp, const std::vector<float> &in, const char *which) {
        if (sp.kind != oracle::scales::per_token) return;
        int64_t bad = 0;
        for (int64_t q = 0; q < s.b.num_seqs; ++q)
            for (int64_t j = 0; j < s.b.seq_lens[static_cast<size_t>(q)]; ++j)
                for (int64_t h = 0; h < s.c.hkv; ++h) {
                    const float want = expected_token_scale(
                            &in[static_cast<size_t>((context_row(s.b, q, j) * s.c.hkv + h) * s.c.d)], s.c.d,
                            s.c.cache_fmt);
                    const double got = sp.at(s.b.block_of(q, j), h, j % s.c.bs, s.c.hkv, s.c.bs);
                    if (got != static_cast<double>(want) && bad++ < 4)
                        ADD_FAILURE() << which << " scale of seq " << q << " token " << j << " head " << h
                                      << ": got " << got << ", want " << want;
                }
        EXPECT_EQ(bad, 0) << which << " per-token scales differ from max(amax / fp8_max, FLT_MIN)";
    };
    check(s.ks, s.k_in, "K");
    check(s.vs, s.v_in, "V");
}

/// The unquantized comparison of an FP8 cache: the oracle on the inputs of reshape_and_cache with
/// a bound of every element's quantization error; empty when some element saturates (its error is
/// then not a rounding error; the dequantized comparison covers those cases).
inline bool unquantized_oracle(const attn_setup &s, oracle::result &out) {
    const attn_case &c = s.c;
    std::vector<float> k_err(s.k_in.size()), v_err(s.v_in.size());
    const double fmax = reference::fp8_max(c.cache_fmt);
    for (int64_t q = 0; q < s.b.num_seqs; ++q)
        for (int64_t j = 0; j < s.b.seq_lens[static_cast<size_t>(q)]; ++j)
            for (int64_t h = 0; h < c.hkv; ++h) {
                const int64_t blk = s.b.block_of(q, j), t = j % c.bs;
                const size_t row = static_cast<size_t>((context_row(s.b, q, j) * c.hkv + h) * c.d);
                // Per-token scales from the definition, not from what the library wrote.
                const double ksc = s.ks.kind == oracle::scales::per_token
                                           ? expected_token_scale(&s.k_in[row], c.d, c.cache_fmt)
                                           : s.ks.at(blk, h, t, c.hkv, c.bs);
                const double vsc = s.vs.kind == oracle::scales::per_token
                                           ? expected_token_scale(&s.v_in[row], c.d, c.cache_fmt)
                                           : s.vs.at(blk, h, t, c.hkv, c.bs);
                for (int64_t e = 0; e < c.d; ++e) {
                    const double kx = s.k_in[row + static_cast<size_t>(e)],
                                 vx = s.v_in[row + static_cast<size_t>(e)];
                    // Saturated: beyond the largest finite by more than a rounding error.
                    if (std::fabs(kx) - fmax * ksc > fp8_error_bound(c.cache_fmt, kx, ksc) ||
                        std::fabs(vx) - fmax * vsc > fp8_error_bound(c.cache_fmt, vx, vsc))
                        return false;
                    k_err[row + static_cast<size_t>(e)] =
                            static_cast<float>(fp8_error_bound(c.cache_fmt, kx, ksc));
                    v_err[row + static_cast<size_t>(e)] =
                            static_cast<float>(fp8_error_bound(c.cache_fmt, vx, vsc));
                }
            }
    oracle::dense_kv kv;
    for (int64_t q = 0; q < s.b.num_seqs; ++q) {
        const size_t row = static_cast<size_t>(context_row(s.b, q, 0) * c.hkv * c.d);
        kv.k.push_back(s.k_in.data() + row);
        kv.v.push_back(s.v_in.data() + row);
        kv.k_err.push_back(k_err.data() + row);
        kv.v_err.push_back(v_err.data() + row);
    }
    out = oracle::dense_attention(s.problem(), s.query_view(), kv);
    return true;
}

/// Largest score standard deviation (in logits) for which the first-order propagation of the
/// quantization error is trusted: exp(x + e) = exp(x)(1 + e + e^2/2 ...), so at 0.25 the terms
/// beyond first order are covered by the explicit second-order envelope below.
constexpr double quant_linear_limit = 0.25;
/// 6 standard deviations: the errors of many independently rounded elements sum to a near-Gaussian;
/// exceeding 6 sigma has probability ~2e-9 per element, and a case compares ~1e6 elements.
constexpr double quant_sigmas = 6.0;

/// Tolerance of the unquantized comparison: quantization (6 sigma + second order with the score's 6
/// sigma squared / 2) plus the kernel's own attention tolerance class.
inline double quant_tol(const oracle::result &u, size_t i, format dst) {
    return quant_sigmas * u.quant_sigma[i] + 18.0 * u.quant_second[i] + attention_tol(u, i, dst);
}

} // namespace test_util
