// The softmax's exponential of the x64 implementations (exp_negative, through
// detail::paged_attention_softmax_exp) against std::exp in fp64, over a sweep of the f32 values in
// [-87, 0] (every 61st bit pattern, and the ends), below it, and NaN. The paged_attention suites
// cannot see every error of it: a factor common to all weights cancels in the normalisation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "pagedattn/pagedattn.hpp"
#include "primitives/paged_attention/paged_attention_internal.hpp"

namespace {

using namespace pagedattn;

struct isa_case {
    cpu_isa isa;
    const char *name;
};

class softmax_exp_test : public testing::TestWithParam<isa_case> {
protected:
    // The exponentials of x, padded with zeros to whole vectors.
    std::vector<float> exp_of(std::vector<float> x) const {
        const detail::softmax_exp exp = detail::paged_attention_softmax_exp(GetParam().isa);
        const size_t n = x.size();
        x.resize((n + 15) / 16 * 16, 0.f);
        std::vector<float> out(x.size() + 16, -1.f); // a guard vector after the values
        exp(x.data(), static_cast<int64_t>(x.size()), out.data());
        for (size_t i = x.size(); i < out.size(); ++i)
            EXPECT_EQ(out[i], -1.f) << "wrote past the values";
        out.resize(n);
        return out;
    }
    void SetUp() override {
        if (detail::paged_attention_softmax_exp(GetParam().isa) == nullptr)
            GTEST_SKIP() << "the library was built without the x64 kernels";
        if (static_cast<int>(get_host_cpu_isa()) < static_cast<int>(GetParam().isa))
            GTEST_SKIP() << "the host does not run " << GetParam().name;
    }
};

float float_of(uint32_t bits) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
}

TEST_P(softmax_exp_test, within_its_relative_error_over_minus_87_to_0) {
    std::vector<float> x;
    uint32_t last;
    const float lowest = -87.f;
    std::memcpy(&last, &lowest, sizeof last);
    for (uint32_t bits = 0x80000000u; bits < last; bits += 61) // -0 down to -87
        x.push_back(float_of(bits));
    x.push_back(lowest);
    for (float v : { -0.f, 0.f, -1e-30f, -0.34657359f, -0.34657360f, -1.f, -20.f, -86.99999f })
        x.push_back(v);
    const std::vector<float> y = exp_of(x);
    double worst_near = 0, worst_far = 0;
    size_t failures = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double expected = std::exp(static_cast<double>(x[i]));
        const double error = std::fabs(y[i] - expected) / expected;
        // Weights within 2e-9 of the largest (x >= -20) carry the sums: 1.3e-7 there.
        const bool near = x[i] >= -20.f;
        double &worst = near ? worst_near : worst_far;
        worst = std::max(worst, error);
        if (error > (near ? 1.3e-7 : 3e-7) && failures++ < 8)
            ADD_FAILURE() << "exp(" << x[i] << "): got " << y[i] << ", expected " << expected
                          << " (relative error " << error << ")";
    }
    EXPECT_EQ(failures, 0u) << "of " << x.size() << " values; worst relative error " << worst_near
                            << " for x >= -20, " << worst_far << " below";
}

TEST_P(softmax_exp_test, below_minus_87_about_zero_and_nan_stays_nan) {
    const float infinity = std::numeric_limits<float>::infinity();
    const std::vector<float> x = { -87.5f, -100.f, -1e4f, -3e38f, -infinity, std::nanf(""), -std::nanf("") };
    const std::vector<float> y = exp_of(x);
    for (size_t i = 0; i + 2 < x.size(); ++i) {
        EXPECT_GE(y[i], 0.f) << "exp(" << x[i] << ")";
        EXPECT_LE(y[i], 1.7e-38f) << "exp(" << x[i] << ")"; // e^-87 = 1.65e-38
    }
    EXPECT_TRUE(std::isnan(y[x.size() - 2]));
    EXPECT_TRUE(std::isnan(y[x.size() - 1]));
}

INSTANTIATE_TEST_SUITE_P(x64, softmax_exp_test,
                         testing::Values(isa_case { cpu_isa::avx512, "avx512" },
                                         isa_case { cpu_isa::avx2, "avx2" }),
                         [](const testing::TestParamInfo<isa_case> &info) {
                             return std::string(info.param.name);
                         });

} // namespace
