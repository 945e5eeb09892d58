#include "oracle.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace oracle {
namespace {

// Decoding tables built from reference_formats (the definitions), so that big caches decode fast.
struct tables {
    std::vector<double> bf16, f16, e4m3, e5m2;
    tables() : bf16(65536), f16(65536), e4m3(256), e5m2(256) {
        for (uint32_t c = 0; c < 65536; ++c) {
            bf16[c] = reference::bf16_to_double(static_cast<uint16_t>(c));
            f16[c] = reference::f16_to_double(static_cast<uint16_t>(c));
        }
        for (uint32_t c = 0; c < 256; ++c) {
            e4m3[c] = reference::decode_fp8(format::e4m3, static_cast<uint8_t>(c));
            e5m2[c] = reference::decode_fp8(format::e5m2, static_cast<uint8_t>(c));
        }
    }
};

const tables &lut() {
    static const tables t;
    return t;
}

double load_fast(const void *base, format f, int64_t i) {
    const auto *bytes = static_cast<const unsigned char *>(base);
    switch (f) {
        case format::f32: {
            float x;
            std::memcpy(&x, bytes + 4 * i, 4);
            return x;
        }
        case format::bf16:
        case format::f16: {
            uint16_t c;
            std::memcpy(&c, bytes + 2 * i, 2);
            return f == format::bf16 ? lut().bf16[c] : lut().f16[c];
        }
        case format::e4m3: return lut().e4m3[bytes[i]];
        case format::e5m2: return lut().e5m2[bytes[i]];
    }
    return std::numeric_limits<double>::quiet_NaN();
}

// K and V of one sequence as dense double [seq_len, Hkv, D] (plus optional error bounds).
struct sequence_kv {
    int64_t len = 0;
    std::vector<double> k, v, k_err, v_err;
};

// DESIGN §3 masks: causal j <= p; window p - left <= j <= p + right (-1 = unbounded).
bool visible(const problem &pr, int64_t j, int64_t p) {
    if (pr.causal && j > p) return false;
    if (pr.window_left >= 0 && j < p - pr.window_left) return false;
    if (pr.window_right >= 0 && j > p + pr.window_right) return false;
    return true;
}

void attend(const problem &pr, const query &q, int64_t s, const sequence_kv &kv, result &r) {
    const int64_t hq = pr.num_heads, hkv = pr.num_kv_heads, dd = pr.head_size;
    const int64_t group = hq / hkv;
    const int64_t q0 = pr.query_start_loc[s], q_len = pr.query_start_loc[s + 1] - q0;
    const int64_t seq_len = kv.len;
    const bool quant = !kv.k_err.empty();
    std::vector<double> qv(dd), x(seq_len), a(seq_len), w(seq_len), sx(seq_len);
    std::vector<char> vis(seq_len);
    for (int64_t i = 0; i < q_len; ++i) {
        const int64_t t = q0 + i;
        const int64_t pos = seq_len - q_len + i;
        for (int64_t h = 0; h < hq; ++h) {
            const int64_t g = h / group;
            for (int64_t d = 0; d < dd; ++d)
                qv[d] = load_fast(q.data, q.fmt, t * q.token_stride + h * q.head_stride + d);
            double m = -std::numeric_limits<double>::infinity();
            bool any = false;
            for (int64_t j = 0; j < seq_len; ++j) {
                vis[j] = visible(pr, j, pos);
                if (!vis[j]) continue;
                any = true;
                const double *kr = &kv.k[(j * hkv + g) * dd];
                double dot = 0, abs_dot = 0;
                for (int64_t d = 0; d < dd; ++d) {
                    dot += qv[d] * kr[d];
                    abs_dot += std::fabs(qv[d] * kr[d]);
                }
                double xj = pr.softmax_scale * dot;
                if (pr.soft_cap > 0) xj = pr.soft_cap * std::tanh(xj / pr.soft_cap);
                double alibi = 0;
                if (pr.alibi_slopes) alibi = pr.alibi_slopes[h] * static_cast<double>(j - pos);
                xj += alibi;
                x[j] = xj;
                a[j] = pr.softmax_scale * abs_dot + std::fabs(alibi) + std::fabs(xj);
                if (xj > m) m = xj; // NaN scores stay out of the max but poison their own term
                if (quant) {
                    const double *er = &kv.k_err[(j * hkv + g) * dd];
                    double var = 0;
                    for (int64_t d = 0; d < dd; ++d)
                        var += qv[d] * qv[d] * er[d] * er[d] / 3.0;
                    sx[j] = pr.softmax_scale * std::sqrt(var);
                }
            }
            const size_t row = r.index(t, h, 0);
            if (!any) continue; // fully masked row: zeros (result is zero-initialized)
            if (pr.sinks && pr.sinks[h] > m) m = pr.sinks[h];
            double denom = pr.sinks ? std::exp(pr.sinks[h] - m) : 0.0;
            for (int64_t j = 0; j < seq_len; ++j) {
                if (!vis[j]) continue;
                w[j] = std::exp(x[j] - m);
                denom += w[j];
            }
            double sx_max = 0;
            for (int64_t j = 0; j < seq_len; ++j) {
                if (!vis[j]) continue;
                w[j] /= denom;
                a[j] += std::fabs(m);
                if (quant) sx_max = std::max(sx_max, sx[j]);
                const double *vr = &kv.v[(j * hkv + g) * dd];
                for (int64_t d = 0; d < dd; ++d)
                    r.out[row + d] += w[j] * vr[d];
            }
            for (int64_t j = 0; j < seq_len; ++j) {
                if (!vis[j]) continue;
                const double *vr = &kv.v[(j * hkv + g) * dd];
                for (int64_t d = 0; d < dd; ++d) {
                    const double dev = std::fabs(vr[d] - r.out[row + d]);
                    r.err_score[row + d] += w[j] * a[j] * dev;
                    r.err_sum[row + d] += w[j] * std::fabs(vr[d]);
                    r.v_abs_sum[row + d] += std::fabs(vr[d]);
                    if (quant) {
                        const double ev = kv.v_err[(j * hkv + g) * dd + d];
                        r.quant_sigma[row + d] += w[j] * w[j] * (dev * dev * sx[j] * sx[j] + ev * ev / 3.0);
                        r.quant_second[row + d] += w[j] * sx[j] * sx[j] * dev;
                    }
                }
            }
            if (quant) {
                for (int64_t d = 0; d < dd; ++d)
                    r.quant_sigma[row + d] = std::sqrt(r.quant_sigma[row + d]);
                r.quant_sigma_x_max[static_cast<size_t>(t * hq + h)] = sx_max;
            }
        }
    }
}

result make_result(const problem &pr, bool quant) {
    result r;
    r.tokens = pr.query_start_loc[pr.num_seqs];
    r.heads = pr.num_heads;
    r.head_size = pr.head_size;
    const size_t n = static_cast<size_t>(r.tokens * r.heads * r.head_size);
    r.out.assign(n, 0.0);
    r.err_score.assign(n, 0.0);
    r.err_sum.assign(n, 0.0);
    r.v_abs_sum.assign(n, 0.0);
    if (quant) {
        r.quant_sigma.assign(n, 0.0);
        r.quant_second.assign(n, 0.0);
        r.quant_sigma_x_max.assign(static_cast<size_t>(r.tokens * r.heads), 0.0);
    }
    return r;
}

void check(const problem &pr) {
    if (pr.num_kv_heads <= 0 || pr.num_heads % pr.num_kv_heads != 0)
        throw std::invalid_argument("oracle: Hq must be a multiple of Hkv");
}

double scale_of(const paged_cache &c, const problem &pr, int64_t b, int64_t h, int64_t t) {
    switch (c.scale_kind) {
        case scales::none: return 1.0;
        case scales::per_tensor: return c.scale_values[0];
        case scales::per_kv_head: return c.scale_values[h];
        case scales::per_token: return c.scale_values[(b * pr.num_kv_heads + h) * pr.block_size + t];
    }
    return std::numeric_limits<double>::quiet_NaN();
}

} // namespace

result paged_attention(const problem &pr, const query &q, const paged_cache &k, const paged_cache &v) {
    check(pr);
    result r = make_result(pr, false);
    const int64_t hkv = pr.num_kv_heads, dd = pr.head_size, bs = pr.block_size;
    for (int64_t s = 0; s < pr.num_seqs; ++s) {
        sequence_kv kv;
        kv.len = pr.seq_lens[s];
        kv.k.resize(static_cast<size_t>(kv.len * hkv * dd));
        kv.v.resize(kv.k.size());
        for (int64_t j = 0; j < kv.len; ++j) {
            // Logical token j of the sequence lives in block table entry j / bs, offset j % bs.
            const int64_t b = pr.block_table[s * pr.block_table_stride + j / bs];
            const int64_t t = j % bs;
            if (b < 0 || b >= pr.num_blocks)
                throw std::out_of_range("oracle: block table entry out of range");
            for (int64_t h = 0; h < hkv; ++h) {
                const int64_t kb = b * k.block_stride + h * k.head_stride + t * k.token_stride;
                const int64_t vb = b * v.block_stride + h * v.head_stride + t * v.token_stride;
                const double ks = scale_of(k, pr, b, h, t), vs = scale_of(v, pr, b, h, t);
                for (int64_t d = 0; d < dd; ++d) {
                    kv.k[(j * hkv + h) * dd + d] = load_fast(k.data, k.fmt, kb + d) * ks;
                    kv.v[(j * hkv + h) * dd + d] = load_fast(v.data, v.fmt, vb + d) * vs;
                }
            }
        }
        attend(pr, q, s, kv, r);
    }
    return r;
}

result dense_attention(const problem &pr, const query &q, const dense_kv &in) {
    check(pr);
    const bool quant = !in.k_err.empty();
    result r = make_result(pr, quant);
    for (int64_t s = 0; s < pr.num_seqs; ++s) {
        sequence_kv kv;
        kv.len = pr.seq_lens[s];
        const size_t n = static_cast<size_t>(kv.len * pr.num_kv_heads * pr.head_size);
        kv.k.assign(in.k[s], in.k[s] + n);
        kv.v.assign(in.v[s], in.v[s] + n);
        if (quant) {
            kv.k_err.assign(in.k_err[s], in.k_err[s] + n);
            kv.v_err.assign(in.v_err[s], in.v_err[s] + n);
        }
        attend(pr, q, s, kv, r);
    }
    return r;
}

} // namespace oracle
