#include "tbb_calls.hpp"

namespace test_util {

void execute_in_arena(tbb::task_arena &arena, void (*function)(void *), void *context) {
    arena.execute([&] { function(context); });
}

} // namespace test_util
