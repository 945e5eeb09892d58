// The process-wide ISA cap: PAGEDATTN_MAX_CPU_ISA is read once, and the effective level is the
// lower of it and the host's. ctest runs this file with the variable set to several values.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "pagedattn/pagedattn.hpp"
#include "test_util.hpp"

namespace {

using pagedattn::cpu_isa;

TEST(cpu_isa_cap, environment_caps_the_host_level) {
    const cpu_isa host = pagedattn::get_host_cpu_isa();
    const cpu_isa cap = test_util::environment_cap();
    EXPECT_EQ(pagedattn::get_max_cpu_isa(), std::min(host, cap))
            << "host " << pagedattn::cpu_isa_name(host) << ", cap " << pagedattn::cpu_isa_name(cap);
    EXPECT_NE(pagedattn::get_host_cpu_isa(), cpu_isa::all) << "the host level is a real level, never 'all'";
}

TEST(cpu_isa_cap, attribute_only_lowers_the_cap) {
    // Whatever the attribute asks, an implementation above min(host, environment) is never chosen:
    // today every list ends with ref:any, and with the attribute at generic it is the only choice.
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    using namespace pagedattn;
    primitive_attr attr;
    attr.set_max_cpu_isa(cpu_isa::generic);
    paged_attention::desc d(
            { { runtime_dim, 4, 32 }, data_type::f32 }, { { 4, 2, 16, 32 }, data_type::bf16, layout::any },
            { { 4, 2, 16, 32 }, data_type::bf16, layout::any }, { { runtime_dim, 4, 32 }, data_type::f32 });
    paged_attention::primitive_desc pd(eng, d, attr);
    EXPECT_STREQ(pd.impl_info_str(), "ref:any");
    EXPECT_FALSE(pd.next_impl());
}

} // namespace
