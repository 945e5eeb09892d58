// The TBB calls tests make to launch work: arena.execute(f), and f(i) as the tasks of one
// tbb::parallel_for. Their TBB templates live in tbb_calls.cpp, which a ThreadSanitizer build
// compiles uninstrumented like Debian's libtbb (TSan cannot see how libtbb hands work to another
// thread); the happens-before edges TBB guarantees are stated to TSan instead, as
// src/parallel.hpp does for the library's loops.
#pragma once

#include <oneapi/tbb/task_arena.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PAGEDATTN_TEST_THREAD_SANITIZER 1
#include <sanitizer/tsan_interface.h>
#endif
#endif

namespace test_util {

void execute_in_arena(tbb::task_arena &arena, void (*function)(void *, int), void *context);
void parallel_for_tasks(int n, void (*function)(void *, int), void *context);

namespace detail {
/// Calls launch(trampoline, &context) where the trampoline calls f(i), with TSan's edges.
template <typename F, typename Launch> void annotated(const F &f, const Launch &launch) {
    struct context_type {
        const F &f;
#ifdef PAGEDATTN_TEST_THREAD_SANITIZER
        char before = 0, after = 0; // their addresses name the two happens-before edges
#endif
    } context { f };
#ifdef PAGEDATTN_TEST_THREAD_SANITIZER
    __tsan_release(&context.before);
#endif
    launch(
            [](void *c, int i) {
                auto &ctx = *static_cast<context_type *>(c);
#ifdef PAGEDATTN_TEST_THREAD_SANITIZER
                __tsan_acquire(&ctx.before);
#endif
                ctx.f(i);
#ifdef PAGEDATTN_TEST_THREAD_SANITIZER
                __tsan_release(&ctx.after);
#endif
            },
            static_cast<void *>(&context));
#ifdef PAGEDATTN_TEST_THREAD_SANITIZER
    __tsan_acquire(&context.after);
#endif
}
} // namespace detail

/// arena.execute(f).
template <typename F> void execute_in(tbb::task_arena &arena, const F &f) {
    detail::annotated([&](int) { f(); },
                      [&](void (*function)(void *, int), void *c) { execute_in_arena(arena, function, c); });
}

/// f(0) ... f(n - 1) as the tasks of one tbb::parallel_for (grain 1) in the calling arena.
template <typename F> void for_each_task(int n, const F &f) {
    detail::annotated(f, [&](void (*function)(void *, int), void *c) { parallel_for_tasks(n, function, c); });
}

} // namespace test_util
