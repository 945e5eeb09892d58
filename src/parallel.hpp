// The one parallel loop of the library's primitives, on oneTBB.
//
// The loop is type-erased: TBB's templates are instantiated once, in parallel.cpp, which a
// ThreadSanitizer build compiles uninstrumented like libtbb itself (Debian's libtbb is not
// instrumented, so TSan cannot see TBB's own synchronization and would report its task objects).
// The kernels' task bodies stay instrumented, and the loop states what TBB guarantees: all the
// calling thread did before the loop happens before every task body, and every task body happens
// before the loop returns. Nothing orders two task bodies, so a race between tasks (two tasks
// writing one scratch region) is still reported.
#pragma once

#include <cstddef>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PAGEDATTN_THREAD_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(PAGEDATTN_THREAD_SANITIZER)
#define PAGEDATTN_THREAD_SANITIZER 1
#endif

#ifdef PAGEDATTN_THREAD_SANITIZER
#include <sanitizer/tsan_interface.h>
#endif

namespace pagedattn {
namespace detail {

using range_function = void (*)(void *context, size_t first, size_t last);

/// Calls function(context, first, last) on disjoint subranges covering [begin, end), in parallel
/// in the calling thread's arena; subranges have `grain` indices or more (1: TBB's auto
/// partitioner alone decides).
void parallel_for_ranges(size_t begin, size_t end, size_t grain, range_function function, void *context);

/// body(first, last) on disjoint subranges covering [begin, end), in parallel; Index is an
/// integer type and begin >= 0.
template <typename Index, typename Body>
void parallel_for(Index begin, Index end, Index grain, const Body &body) {
    struct context_type {
        const Body &body;
#ifdef PAGEDATTN_THREAD_SANITIZER
        char before = 0, after = 0; // their addresses name the two happens-before edges
#endif
    } context { body };
    const range_function function = [](void *c, size_t first, size_t last) {
        auto &ctx = *static_cast<context_type *>(c);
#ifdef PAGEDATTN_THREAD_SANITIZER
        __tsan_acquire(&ctx.before);
#endif
        ctx.body(static_cast<Index>(first), static_cast<Index>(last));
#ifdef PAGEDATTN_THREAD_SANITIZER
        __tsan_release(&ctx.after);
#endif
    };
#ifdef PAGEDATTN_THREAD_SANITIZER
    __tsan_release(&context.before);
#endif
    parallel_for_ranges(static_cast<size_t>(begin), static_cast<size_t>(end), static_cast<size_t>(grain),
                        function, &context);
#ifdef PAGEDATTN_THREAD_SANITIZER
    __tsan_acquire(&context.after);
#endif
}

} // namespace detail
} // namespace pagedattn
