// pagedattn: oneDNN-style primitives for paged attention over an FP8 (or bf16/f16/f32) KV cache.
#pragma once

#include "pagedattn/common.hpp"
#include "pagedattn/paged_attention.hpp"
#include "pagedattn/reshape_and_cache.hpp"
