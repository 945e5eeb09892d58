#include "parallel.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace pagedattn {
namespace detail {

void parallel_for_ranges(size_t begin, size_t end, size_t grain, range_function function, void *context) {
    tbb::parallel_for(tbb::blocked_range<size_t>(begin, end, grain),
                      [&](const tbb::blocked_range<size_t> &r) { function(context, r.begin(), r.end()); });
}

} // namespace detail
} // namespace pagedattn
