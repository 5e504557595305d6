#pragma once
/// Shape and Strides: small fixed-capacity arrays of int64 (no heap allocation), so that
/// per-op metadata work stays in the tens of nanoseconds.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <source_location>
#include <string>
#include <vector>

namespace kiln {

/// Maximum tensor rank. Ops that would exceed it throw kiln::Error.
inline constexpr int kMaxRank = 12;

class Dims {
 public:
  Dims() = default;
  /// More than kMaxRank values throw kiln::Error naming the caller's line.
  Dims(std::initializer_list<int64_t> v, std::source_location loc = std::source_location::current());
  explicit Dims(const std::vector<int64_t>& v,
                std::source_location loc = std::source_location::current());
  /// `n` copies of `value`.
  static Dims filled(int n, int64_t value);

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t& operator[](int i) { return d_[i]; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t* begin() { return d_; }
  int64_t* end() { return d_ + n_; }
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + n_; }
  const int64_t* data() const { return d_; }
  int64_t back() const { return d_[n_ - 1]; }
  void push_back(int64_t v);
  void insert(int pos, int64_t v);
  void erase(int pos);
  void resize(int n, int64_t fill = 0);
  std::vector<int64_t> vec() const { return {begin(), end()}; }

  friend bool operator==(const Dims& a, const Dims& b) {
    return a.n_ == b.n_ && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  int64_t d_[kMaxRank] = {};
  int n_ = 0;
};

using Shape = Dims;
using Strides = Dims;

/// Product of the sizes (1 for a 0-d shape).
int64_t numel(const Shape& s);
/// Throws kiln::Error naming `op` unless every size is >= 0 and the element count times
/// `itemsize` fits in int64 (so no tensor claims more elements than memory can hold).
void check_shape(const Shape& s, size_t itemsize, const char* op,
                 std::source_location loc = std::source_location::current());
/// Row-major (C-contiguous) strides in elements.
Strides contiguous_strides(const Shape& s);
/// "[2, 3]"
std::string to_string(const Dims& d);
/// Wraps a possibly negative dim into [0, rank). Throws kiln::Error naming `op` if out of range.
int wrap_dim(int64_t dim, int rank, const char* op,
             std::source_location loc = std::source_location::current());

}  // namespace kiln
