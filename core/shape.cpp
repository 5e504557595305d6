#include "core/shape.h"

#include <fmt/format.h>

#include "core/error.h"

namespace kiln {

static void check_rank(size_t n, std::source_location loc = std::source_location::current()) {
  if (n > static_cast<size_t>(kMaxRank))
    throw Error("shape", fmt::format("rank {} exceeds kiln's maximum rank {}", n, kMaxRank), loc);
}

Dims::Dims(std::initializer_list<int64_t> v, std::source_location loc) {
  check_rank(v.size(), loc);
  std::copy(v.begin(), v.end(), d_);
  n_ = static_cast<int>(v.size());
}
Dims::Dims(const std::vector<int64_t>& v, std::source_location loc) {
  check_rank(v.size(), loc);
  std::copy(v.begin(), v.end(), d_);
  n_ = static_cast<int>(v.size());
}
Dims Dims::filled(int n, int64_t value) {
  Dims d;
  d.resize(n, value);
  return d;
}
void Dims::push_back(int64_t v) {
  check_rank(n_ + 1);
  d_[n_++] = v;
}
void Dims::insert(int pos, int64_t v) {
  check_rank(n_ + 1);
  std::copy_backward(d_ + pos, d_ + n_, d_ + n_ + 1);
  d_[pos] = v;
  ++n_;
}
void Dims::erase(int pos) {
  std::copy(d_ + pos + 1, d_ + n_, d_ + pos);
  --n_;
}
void Dims::resize(int n, int64_t fill) {
  check_rank(n);
  for (int i = n_; i < n; ++i) d_[i] = fill;
  n_ = n;
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}
Strides contiguous_strides(const Shape& s) {
  Strides st = Dims::filled(s.size(), 1);
  for (int i = s.size() - 2; i >= 0; --i) st[i] = st[i + 1] * std::max<int64_t>(s[i + 1], 1);
  return st;
}
std::string to_string(const Dims& d) { return fmt::format("[{}]", fmt::join(d, ", ")); }
void check_shape(const Shape& s, size_t itemsize, const char* op, std::source_location loc) {
  bool empty = false;
  for (int64_t v : s) {
    KILN_CHECK(v >= 0, op, loc, "negative size {} in shape {}", v, to_string(s));
    empty |= v == 0;
  }
  if (empty) return;  // zero elements, whatever the other sizes
  int64_t n = static_cast<int64_t>(itemsize);
  for (int64_t v : s)
    KILN_CHECK(!__builtin_mul_overflow(n, v, &n), op, loc,
               "shape {} is too large: its size in bytes overflows int64", to_string(s));
}
int wrap_dim(int64_t dim, int rank, const char* op, std::source_location loc) {
  int64_t r = std::max(rank, 1);  // a 0-d tensor accepts dim 0 and -1, like PyTorch
  if (dim < -r || dim >= r)
    throw Error(op, fmt::format("dim {} out of range: expected one in [{}, {}]", dim, -r, r - 1),
                loc);
  return static_cast<int>(dim < 0 ? dim + r : dim);
}

}  // namespace kiln
