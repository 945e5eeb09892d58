// Verbose lines in the shape of onednn_verbose:
//   pagedattn_verbose,<create|exec>,cpu,<primitive>,<impl>,<descs>,<attrs>,<problem>,<ms>
//   pagedattn_verbose,create:dispatch,<primitive>,<impl>,<why it declined>      (level 3)
#pragma once

#include <chrono>
#include <string>

#include "pagedattn/common.hpp"

namespace pagedattn {
namespace detail {

/// Writes one whole line to stderr (one write, so concurrent lines do not interleave).
void verbose_print(const std::string &line);

/// "attr-scales:k_cache:7+v_cache:0 attr-fpmath:strict attr-scratchpad:user attr-isa:all"
std::string attr_string(const primitive_attr &attr);

/// Milliseconds since `start`, in fixed notation ("0.0420"), as the last field of a line.
std::string milliseconds_since(std::chrono::steady_clock::time_point start);

} // namespace detail
} // namespace pagedattn
