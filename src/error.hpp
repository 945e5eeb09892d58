// Throwing helpers: every failure of the library is a pagedattn::error naming what broke which rule.
#pragma once

#include <sstream>
#include <string>

#include "pagedattn/common.hpp"

namespace pagedattn {
namespace detail {

[[noreturn]] void throw_error(status s, const std::string &message);

/// Concatenates its arguments with operator<< into one message.
template <typename... Parts> std::string concat(const Parts &...parts) {
    std::ostringstream out;
    (out << ... << parts);
    return out.str();
}

/// "[4, 8, 128]"
std::string dims_string(const dims &d);

} // namespace detail
} // namespace pagedattn
