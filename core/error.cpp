#include "core/error.h"

namespace kiln {

Error::Error(std::string op, std::string message, Loc where)
    : op_(std::move(op)), message_(std::move(message)), where_(where) {
  full_ = fmt::format("kiln::{}: {} (at {}:{})", op_, message_, where_.file_name(), where_.line());
}

}  // namespace kiln
