// paged_attention against the fp64 oracle on random inputs, over a matrix of shapes, types, layouts
// and options; every implementation the host can run is checked (pd.next_impl()).
//
// Each case fills its cache with reshape_and_cache, then
//  1. compares every implementation's output with the oracle run on the cache as stored (decoded
//     codes times scales): the attention tolerance class of the dst type, the same for every cache
//     type, so an FP8 kernel may add nothing beyond the quantization itself;
//  2. for FP8 caches, compares it with the oracle run on the unquantized inputs, with a tolerance
//     propagated from each element's quantization error bound (e4m3: 2^-4 relative, e5m2: 2^-3).
#include "matrix_cases.hpp"
#include "test_util.hpp"

namespace {

using namespace test_util;
using oracle::scales;

std::vector<attn_case> cases() {
    return matrix_cases();
}

class paged_attention_random : public ::testing::TestWithParam<attn_case> {};

TEST_P(paged_attention_random, matches_oracle) {
    const attn_case &c = GetParam();
    if (c.large && reduced()) GTEST_SKIP() << "large case skipped under PAGEDATTN_TEST_REDUCED=1";
    const attn_setup s = build_setup(c);
    expect_token_scales(s);

    const oracle::result ref = s.oracle_on_cache();
    oracle::result unq;
    const bool check_unquantized = is_fp8(c.cache_fmt) && unquantized_oracle(s, unq);
    if (is_fp8(c.cache_fmt) && !c.outliers) {
        EXPECT_TRUE(check_unquantized) << "no saturation expected";
    }

    pa::paged_attention::primitive_desc pd(engine(), s.desc(), s.attr());
    const pa::tensor_desc kmd = pd.query_md(pa::ARG_K_CACHE);
    EXPECT_EQ(kmd.get_strides(), s.cache.md().get_strides()) << "a plain cache keeps the caller's strides";
    dnnl::stream st = make_stream();
    int impls = 0;
    do {
        ++impls;
        SCOPED_TRACE(std::string("impl ") + pd.impl_info_str());
        pa::paged_attention prim(pd);
        buffer dst = s.make_dst(); // NaN-filled: a row left unwritten fails
        prim.execute(st, s.args(s.q.data(), dst.data()));
        st.wait();

        const comparison cmp = compare_attention(dst.data(), c.dst_fmt, ref);
        EXPECT_EQ(cmp.failures, 0) << "against the oracle on the stored cache: " << cmp;
        EXPECT_EQ(cmp.checked, s.b.tokens * c.hq * c.d);
        RecordProperty(std::string("max_err_over_tol_") + pd.impl_info_str(), std::to_string(cmp.max_ratio));

        if (check_unquantized) {
            // Rows whose score sd exceeds the linear limit (outliers in q or K) are left to (1).
            int64_t rows = 0;
            const comparison qc = compare(
                    dst.data(), c.dst_fmt, unq, [&](size_t i) { return quant_tol(unq, i, c.dst_fmt); },
                    [&](int64_t t, int64_t h) {
                        const bool ok = unq.quant_sigma_x_max[static_cast<size_t>(t * c.hq + h)] <=
                                        quant_linear_limit;
                        rows += ok;
                        return ok;
                    });
            EXPECT_EQ(qc.failures, 0) << "against the oracle on the unquantized inputs: " << qc;
            if (!c.outliers) {
                EXPECT_GT(rows, 0) << "the unquantized comparison checked nothing";
            }
            RecordProperty("unquantized_rows_checked", std::to_string(rows));
            RecordProperty(std::string("unquantized_max_err_over_tol_") + pd.impl_info_str(),
                           std::to_string(qc.max_ratio));
        }
    } while (pd.next_impl());
    RecordProperty("implementations", std::to_string(impls));
}

INSTANTIATE_TEST_SUITE_P(matrix, paged_attention_random, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<attn_case> &i) { return i.param.name(); });

} // namespace
