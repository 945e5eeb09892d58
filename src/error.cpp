#include "error.hpp"

namespace pagedattn {

error::error(pagedattn::status s, const std::string &message)
    : dnnl::error(static_cast<dnnl_status_t>(s), ""), status_(s),
      text_(std::make_shared<const std::string>(message)) {
    this->message = text_->c_str();
}

namespace detail {

void throw_error(status s, const std::string &message) {
    throw error(s, message);
}

std::string dims_string(const dims &d) {
    std::string out = "[";
    for (size_t i = 0; i < d.size(); ++i) {
        if (i) out += ", ";
        out += d[i] == runtime_dim ? std::string("runtime") : std::to_string(d[i]);
    }
    return out + "]";
}

} // namespace detail
} // namespace pagedattn
