// Built against an installed pagedattn: checks that the headers, the generated version header and the
// exported target are enough to create a primitive.
#include <pagedattn/pagedattn.hpp>

#include <cstdio>

int main() {
    using namespace pagedattn;
    try {
        dnnl::engine eng(dnnl::engine::kind::cpu, 0);
        const tensor_desc kv_md({ runtime_dim, 2, 64 }, data_type::bf16);
        const tensor_desc cache_md({ 8, 2, 16, 64 }, data_type::f8_e4m3, layout::any);
        primitive_attr attr;
        attr.set_scales_mask(ARG_K_CACHE, scales_per_token);
        attr.set_scales_mask(ARG_V_CACHE, scales_per_token);
        const reshape_and_cache::primitive_desc pd(
                eng, reshape_and_cache::desc(kv_md, kv_md, cache_md, cache_md), attr);
        std::printf("pagedattn %s: reshape_and_cache %s, k cache %s\n", PAGEDATTN_VERSION_STRING,
                    pd.impl_info_str(), pd.query_md(ARG_K_CACHE).str().c_str());
        return 0;
    } catch (const pagedattn::error &e) {
        std::fprintf(stderr, "pagedattn error: %s\n", e.what());
        return 1;
    }
}
