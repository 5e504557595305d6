#include "core/error.h"

namespace kiln {

Error::Error(std::string op, std::string message, Loc where)
    : message_(std::move(message)), where_(where) {
  set_op(std::move(op));
}

void Error::set_op(std::string op) {
  op_ = std::move(op);
  full_ = fmt::format("kiln::{}: {} (at {}:{})", op_, message_, where_.file_name(), where_.line());
}

namespace {
thread_local const char* t_public_op = nullptr;
}  // namespace

const char* public_op() { return t_public_op; }
void set_public_op(const char* op) { t_public_op = op; }

}  // namespace kiln
