// How tests launch work with TBB beside the library: arena.execute(f), and f(i) as the tasks of
// one parallel loop (the library's own, src/parallel.hpp, which states TBB's happens-before edges
// to ThreadSanitizer). arena.execute's TBB template lives in tbb_calls.cpp, which a
// ThreadSanitizer build compiles uninstrumented like Debian's libtbb (TSan cannot see how libtbb
// hands f to another thread of the arena); the edges execute guarantees are stated here instead.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include "src/parallel.hpp"

namespace test_util {

void execute_in_arena(tbb::task_arena &arena, void (*function)(void *), void *context);

/// arena.execute(f).
template <typename F> void execute_in(tbb::task_arena &arena, const F &f) {
    struct context_type {
        const F &f;
#ifdef PAGEDATTN_THREAD_SANITIZER
        char before = 0, after = 0; // their addresses name the two happens-before edges
#endif
    } context { f };
#ifdef PAGEDATTN_THREAD_SANITIZER
    __tsan_release(&context.before);
#endif
    execute_in_arena(
            arena,
            [](void *c) {
                auto &ctx = *static_cast<context_type *>(c);
#ifdef PAGEDATTN_THREAD_SANITIZER
                __tsan_acquire(&ctx.before);
#endif
                ctx.f();
#ifdef PAGEDATTN_THREAD_SANITIZER
                __tsan_release(&ctx.after);
#endif
            },
            &context);
#ifdef PAGEDATTN_THREAD_SANITIZER
    __tsan_acquire(&context.after);
#endif
}

/// f(0) ... f(n - 1) as the tasks of one parallel loop (grain 1) in the calling arena.
template <typename F> void for_each_task(int n, const F &f) {
    pagedattn::detail::parallel_for<int>(0, n, 1, [&](int first, int last) {
        for (int i = first; i != last; ++i)
            f(i);
    });
}

} // namespace test_util
