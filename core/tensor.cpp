#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <type_traits>
#include <utility>

#include "core/meta.h"

namespace kiln {

int64_t Tensor::size(int64_t d, Loc loc) const {
  KILN_CHECK(dim() > 0, "size", loc, "dim {} requested, but the tensor has no dims", d);
  return shape()[wrap_dim(d, dim(), "size", loc)];
}
int64_t Tensor::stride(int64_t d, Loc loc) const {
  KILN_CHECK(dim() > 0, "stride", loc, "dim {} requested, but the tensor has no dims", d);
  return strides()[wrap_dim(d, dim(), "stride", loc)];
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expected) return numel() == 0;
    expected *= shape()[i];
  }
  return true;
}

bool Tensor::is_non_overlapping_and_dense() const {
  if (is_contiguous()) return true;
  // Sort dims by stride; dense if each stride equals the product of the smaller dims' sizes.
  int r = dim();
  int order[kMaxRank];
  for (int i = 0; i < r; ++i) order[i] = i;
  std::sort(order, order + r, [&](int a, int b) { return strides()[a] < strides()[b]; });
  int64_t expected = 1;
  for (int i = 0; i < r; ++i) {
    int d = order[i];
    if (shape()[d] == 1) continue;
    if (strides()[d] != expected) return false;
    expected *= shape()[d];
  }
  return true;
}

void Tensor::throw_undefined() {
  throw Error("tensor", "the tensor is undefined (default-constructed)");
}

void Tensor::check_data_type(DType requested, Loc loc) const {
  KILN_CHECK(defined(), "data", loc, "tensor is undefined");
  KILN_CHECK(requested == dtype(), "data", loc,
             "requested element type {} but the tensor holds {}", name(requested), name(dtype()));
}

namespace {
// Calls fn(element_offset) for every element in logical row-major order.
template <class Fn> void for_each_offset(const Tensor& t, Fn&& fn) {
  int64_t n = t.numel();
  if (n == 0) return;
  int r = t.dim();
  int64_t idx[kMaxRank] = {};
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    fn(off);
    for (int d = r - 1; d >= 0; --d) {
      if (++idx[d] < t.shape()[d]) {
        off += t.strides()[d];
        break;
      }
      off -= (t.shape()[d] - 1) * t.strides()[d];
      idx[d] = 0;
    }
  }
}
}  // namespace

namespace {
thread_local HostReadObserver t_host_read_observer = nullptr;
}  // namespace

HostReadObserver set_host_read_observer(HostReadObserver observer) {
  return std::exchange(t_host_read_observer, observer);
}

thread_local RawAccessObserver detail::t_raw_access_observer = nullptr;
RawAccessObserver set_raw_access_observer(RawAccessObserver observer) {
  return std::exchange(detail::t_raw_access_observer, observer);
}

namespace {
// Element `v` of type S as item<T>() / to_vector<T>() return it. A value T cannot hold is a
// kiln::Error, as PyTorch's checked item<T>(): a float out of T's range or NaN into an integer,
// an int64 out of int32's range, a double past float's largest (a plain cast is undefined).
template <class T, class S> T converted(S v, const char* op, Loc loc) {
  constexpr bool narrowing =
      (std::is_integral_v<T> && !std::is_same_v<T, bool> &&
       (std::is_floating_point_v<S> || sizeof(S) > sizeof(T))) ||
      (std::is_same_v<T, float> && std::is_same_v<S, double>);
  if constexpr (narrowing) {
    if constexpr (std::is_floating_point_v<S>)
      check_scalar_fits(Scalar(static_cast<double>(v)), dtype_of<T>(), op, loc);
    else
      check_scalar_fits(Scalar(static_cast<int64_t>(v)), dtype_of<T>(), op, loc);
  }
  return static_cast<T>(v);
}
}  // namespace

template <class T> T Tensor::item(Loc loc) const {
  KILN_CHECK(defined(), "item", loc, "tensor is undefined");
  if (t_host_read_observer) t_host_read_observer(*this, loc);
  KILN_CHECK(numel() == 1, "item", loc, "a tensor with {} elements (shape {}) cannot be converted "
             "to a scalar", numel(), to_string(shape()));
  KILN_CHECK(device().is_cpu(), "item", loc, "tensor is on {}; call .cpu() first",
             device().str());
  T out{};
  KILN_DISPATCH_ALL(dtype(), S,
                    { out = converted<T>(*static_cast<const S*>(raw_data()), "item", loc); });
  return out;
}

template <class T> std::vector<T> Tensor::to_vector(Loc loc) const {
  KILN_CHECK(defined(), "to_vector", loc, "tensor is undefined");
  if (t_host_read_observer) t_host_read_observer(*this, loc);
  KILN_CHECK(device().is_cpu(), "to_vector", loc, "tensor is on {}; call .cpu() first",
             device().str());
  std::vector<T> out;
  out.reserve(numel());
  KILN_DISPATCH_ALL(dtype(), S, {
    const S* base = static_cast<const S*>(raw_data());
    for_each_offset(*this,
                    [&](int64_t off) { out.push_back(converted<T>(base[off], "to_vector", loc)); });
  });
  return out;
}

#define KILN_INSTANTIATE(T)                      \
  template T Tensor::item<T>(Loc) const;         \
  template std::vector<T> Tensor::to_vector<T>(Loc) const;
KILN_INSTANTIATE(bool)
KILN_INSTANTIATE(int32_t)
KILN_INSTANTIATE(int64_t)
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
#undef KILN_INSTANTIATE

namespace {
constexpr int64_t kSummariseAbove = 1000;
constexpr int64_t kEdgeItems = 3;

std::string format_value(double v, bool floating, bool int_valued, bool sci) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (sci) return fmt::format("{:.4e}", v);
  if (int_valued) return fmt::format("{:.0f}.", v);
  return fmt::format("{:.4f}", v);
}

void format_dim(const std::vector<std::string>& cells, const Shape& shape, int d, int64_t& pos,
                bool summarise, int width, int indent, std::string& out) {
  out += '[';
  int64_t n = shape[d];
  // As PyTorch: slices of a k-dim sub-tensor are separated by k - 1 line breaks.
  int inner_dims = static_cast<int>(shape.size()) - d - 1;
  std::string separator = inner_dims == 0 ? ", "
                                          : "," + std::string(inner_dims, '\n') +
                                                std::string(indent + d + 1, ' ');
  for (int64_t i = 0; i < n; ++i) {
    if (summarise && n > 2 * kEdgeItems && i == kEdgeItems) {
      out += "..." + separator;
      i = n - kEdgeItems - 1;
      continue;
    }
    if (inner_dims == 0) {
      out += fmt::format("{:>{}}", cells[pos++], width);
    } else {
      format_dim(cells, shape, d + 1, pos, summarise, width, indent, out);
    }
    if (i + 1 < n) out += separator;
  }
  out += ']';
}
}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  // Device memory cannot be read from here (core does not know the backends).
  if (!device().is_cpu())
    return fmt::format("tensor(<values on {}; call .cpu() to print them>, shape={}, dtype={}, "
                       "device={})",
                       device().str(), to_string(shape()), name(dtype()), device().str());
  bool summarise = numel() > kSummariseAbove;
  // Collect the printed elements (only edges when summarising), in row-major order.
  std::vector<double> vals;
  std::vector<int64_t> ints;  // exact values of integer tensors (a double loses int64 digits)
  {
    std::vector<double> all;
    if (!summarise) {
      all = to_vector<double>();
      if (is_integral(dtype())) ints = to_vector<int64_t>();
    } else {
      // Gather only the edge elements: iterate over the logical index space, skipping middles.
      const Shape& s = shape();
      std::function<void(int, int64_t)> rec = [&](int d, int64_t off) {
        if (d == dim()) {
          KILN_DISPATCH_ALL(dtype(), S, {
            S v = static_cast<const S*>(storage()->data())[off];
            all.push_back(static_cast<double>(v));
            if (is_integral(dtype())) ints.push_back(static_cast<int64_t>(v));
          });
          return;
        }
        for (int64_t i = 0; i < s[d]; ++i) {
          if (s[d] > 2 * kEdgeItems && i == kEdgeItems) i = s[d] - kEdgeItems;
          rec(d + 1, off + i * strides()[d]);
        }
      };
      rec(0, offset());
    }
    vals = std::move(all);
  }
  bool floating = is_floating(dtype());
  bool int_valued = true, sci = false;
  double maxabs = 0, minabs = INFINITY;
  for (double v : vals) {
    if (!std::isfinite(v)) continue;
    if (v != std::floor(v)) int_valued = false;
    maxabs = std::max(maxabs, std::fabs(v));
    if (v != 0) minabs = std::min(minabs, std::fabs(v));
  }
  if (floating && (maxabs >= 1e8 || (!int_valued && minabs < 1e-4))) sci = true;
  std::vector<std::string> cells;
  int width = 0;
  for (size_t i = 0; i < vals.size(); ++i) {
    double v = vals[i];
    cells.push_back(dtype() == DType::Bool ? (v != 0 ? "True" : "False")
                    : !ints.empty()        ? fmt::format("{}", ints[i])
                                           : format_value(v, floating, int_valued, sci));
    width = std::max<int>(width, cells.back().size());
  }
  std::string body;
  if (dim() == 0) {
    body = cells.empty() ? "" : cells[0];
  } else if (numel() == 0) {
    body = "[]";
  } else {
    int64_t pos = 0;
    format_dim(cells, shape(), 0, pos, summarise, width, 7, body);
  }
  std::string out = "tensor(" + body;
  if (summarise || numel() == 0) out += ", shape=" + to_string(shape());
  // As PyTorch: the dtype is shown unless the values imply it (float32, int64, True/False).
  if (dtype() != DType::Float32 && dtype() != DType::Int64 && dtype() != DType::Bool)
    out += fmt::format(", dtype={}", name(dtype()));
  return out + ")";
}

}  // namespace kiln
