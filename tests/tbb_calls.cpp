#include "tbb_calls.hpp"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

namespace test_util {

void execute_in_arena(tbb::task_arena &arena, void (*function)(void *, int), void *context) {
    arena.execute([&] { function(context, 0); });
}

void parallel_for_tasks(int n, void (*function)(void *, int), void *context) {
    tbb::parallel_for(tbb::blocked_range<int>(0, n, 1), [&](const tbb::blocked_range<int> &r) {
        for (int i = r.begin(); i != r.end(); ++i)
            function(context, i);
    });
}

} // namespace test_util
