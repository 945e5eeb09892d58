// The test matrix of paged_attention: every value the foundation issue lists appears at least once.
#pragma once

#include "test_util.hpp"

namespace test_util {

/// The paged_attention test matrix (paged_attention_test.cpp runs it against the oracle,
/// implementation_selection_test.cpp checks that a fast implementation takes every case).
inline std::vector<attn_case> matrix_cases() {
    using oracle::scales;
    using seqs_t = std::vector<std::pair<int, int>>;
    const seqs_t mixed_batch { { 992, 2456 }, { 1, 1234 }, { 98, 1145 }, { 1, 4162 } };
    const auto f32 = format::f32, bf16 = format::bf16, f16 = format::f16, e4m3 = format::e4m3,
               e5m2 = format::e5m2;
    const auto hnd = cache_layout::hnd, nhd = cache_layout::nhd, kvs = cache_layout::kv_shared;
    const auto tensor = scales::per_tensor, head = scales::per_kv_head, token = scales::per_token;
    std::vector<attn_case> v;
    // Decode.
    v.push_back(make_case("decode_1_1", 4, 4, 64, 16, { { 1, 1 } }, f32, f32, hnd));
    v.push_back(make_case("decode_1_7", 8, 2, 32, 1, { { 1, 7 } }, bf16, bf16, nhd).non_causal().slots32());
    v.push_back(
            make_case("decode_213_312_7", 9, 3, 80, 13, { { 1, 213 }, { 1, 312 }, { 1, 7 } }, f16, e4m3, kvs)
                    .scales(tensor, tensor, 0.037f, 5.3f)
                    .with_sinks()
                    .with_outliers());
    v.push_back(make_case("decode_7812", 16, 1, 32, 128, { { 1, 7812 } }, bf16, e5m2, kvs)
                        .scales(token, token)
                        .with_outliers());
    v.push_back(make_case("decode_7812_312", 8, 2, 64, 32, { { 1, 7812 }, { 1, 312 } }, f32, e4m3, nhd)
                        .scales(head, head, 0.037f, 5.3f)
                        .window(255, 0)
                        .with_outliers());
    v.push_back(make_case("decode_213_f32cache", 32, 8, 128, 16, { { 1, 213 }, { 1, 1 } }, f16, f32, hnd)
                        .with_alibi());
    // Speculative verify and decode with a head size of 40: x64:avx2's 8-lane loops end in a single
    // vector (40 = 2 x 16 + 8), in the plain layout's rows of 4 q heads at once among them.
    v.push_back(make_case("verify_d40", 8, 2, 40, 16, { { 4, 300 }, { 1, 57 } }, bf16, e4m3, hnd)
                        .scales(token, token)
                        .with_outliers());
    // Prefill.
    v.push_back(
            make_case("prefill_5_5_3_16", 4, 4, 96, 16, { { 5, 5 }, { 3, 16 } }, f32, f16, hnd).with_alibi());
    v.push_back(make_case("prefill_5_5_3_16", 32, 8, 112, 32, { { 5, 5 }, { 3, 16 } }, bf16, e5m2, kvs)
                        .scales(tensor, head, 5.3f, 0.037f)
                        .non_causal()
                        .cap(50.f)
                        .with_outliers());
    v.push_back(make_case("prefill_134_5131", 4, 4, 32, 16, { { 134, 5131 } }, f32, e4m3, hnd)
                        .scales(token, token)
                        .is_large());
    v.push_back(make_case("prefill_134_5131", 8, 2, 64, 128, { { 134, 5131 } }, bf16, bf16, nhd)
                        .window(256, -1)
                        .with_outliers()
                        .is_large());
    // Mixed prefill and decode in one call.
    v.push_back(
            make_case("mixed", 4, 4, 32, 32, mixed_batch, bf16, e4m3, kvs).scales(token, token).is_large());
    v.push_back(make_case("mixed", 8, 2, 64, 16, mixed_batch, f16, f16, hnd)
                        .non_causal()
                        .window(100, 37)
                        .is_large());
    v.push_back(make_case("mixed_small", 9, 3, 64, 7, { { 17, 40 }, { 1, 213 }, { 6, 6 }, { 1, 1 } }, f32,
                          e5m2, nhd)
                        .scales(head, token, 5.3f, 0.037f)
                        .with_sinks()
                        .with_alibi());
    // Sequences without query tokens in this step.
    v.push_back(make_case("empty", 9, 3, 128, 7, { { 0, 0 }, { 2, 9 }, { 0, 17 }, { 1, 1 }, { 0, 5 } }, f32,
                          e5m2, nhd)
                        .scales(head, head, 5.3f, 0.037f)
                        .with_sinks());
    // Head sizes 256 and 512.
    v.push_back(make_case("d256", 16, 1, 256, 1, { { 1, 213 }, { 3, 16 } }, f16, e4m3, hnd)
                        .scales(tensor, tensor, 5.3f, 0.037f)
                        .with_alibi()
                        .slots32());
    v.push_back(make_case("d512", 32, 8, 512, 16, { { 1, 312 }, { 5, 5 } }, bf16, e4m3, kvs)
                        .scales(token, token)
                        .with_outliers());
    v.push_back(make_case("d512_long", 16, 1, 512, 128, { { 1, 7812 } }, f32, e5m2, nhd)
                        .scales(tensor, tensor, 0.037f, 0.037f)
                        .cap(50.f)
                        .is_large());
    // Block table in order, f32 cache, explicit softmax scale, bf16 query with f32 dst.
    v.push_back(make_case("in_order", 8, 2, 128, 32, { { 3, 16 }, { 1, 213 } }, f32, bf16, hnd)
                        .non_causal()
                        .in_order()
                        .scale(0.125f));
    v.push_back(make_case("dst_f32", 4, 4, 64, 16, { { 4, 40 }, { 1, 300 } }, bf16, f32, nhd)
                        .dst(f32)
                        .window(255, 0));
    // Windows: 256 left unbounded right, both bounds, with causal and without.
    v.push_back(make_case("window_256", 4, 4, 80, 32, { { 40, 700 }, { 1, 300 } }, f16, e4m3, kvs)
                        .scales(head, head, 0.037f, 5.3f)
                        .non_causal()
                        .window(256, -1));
    v.push_back(make_case("window_lr", 8, 2, 96, 16, { { 30, 400 }, { 1, 77 } }, f32, f32, hnd)
                        .non_causal()
                        .window(31, 17));
    v.push_back(make_case("window_lr_causal", 16, 1, 32, 1, { { 30, 400 } }, bf16, e4m3, nhd)
                        .scales(token, tensor, 5.3f, 5.3f)
                        .window(64, 5));
    // Soft-cap, ALiBi and sinks together, with outliers in q, K and V.
    v.push_back(make_case("softcap_alibi_sinks", 8, 2, 96, 16, { { 7, 300 }, { 1, 213 } }, f32, e5m2, nhd)
                        .scales(token, head, 0.037f, 5.3f)
                        .cap(50.f)
                        .with_alibi()
                        .with_sinks()
                        .with_outliers()
                        .scale(0.3f));
    v.push_back(make_case("softcap", 4, 4, 64, 128, { { 12, 140 } }, bf16, bf16, kvs)
                        .cap(50.f)
                        .scale(1.f)
                        .with_outliers());
    return v;
}

} // namespace test_util
