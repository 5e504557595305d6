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

// PyTorch's _Formatter (torch/_tensor_str.py): floating values print in "int mode" (`3.`)
// when every nonzero finite value is an integer, in scientific notation when those values span
// more than a factor 1000 or exceed 1e8 (or, outside int mode, fall below 1e-4), else with 4
// decimals; the column width comes from the nonzero finite values only (nan, inf, -0. may be
// wider and are not padded for).
struct Formatter {
  bool floating = false, int_mode = true, sci = false;
  int width = 1;

  Formatter(const std::vector<double>& vals, const std::vector<std::string>& exact, bool fp)
      : floating(fp) {
    if (!floating) {
      for (const std::string& e : exact) width = std::max<int>(width, e.size());
      return;
    }
    double lo = INFINITY, hi = 0;
    for (double v : vals) {
      if (!std::isfinite(v) || v == 0) continue;
      lo = std::min(lo, std::fabs(v));
      hi = std::max(hi, std::fabs(v));
      if (v != std::ceil(v)) int_mode = false;
    }
    if (hi == 0) return;  // no nonzero finite value
    sci = hi / lo > 1000 || hi > 1e8 || (!int_mode && lo < 1e-4);
    for (double v : vals)
      if (std::isfinite(v) && v != 0)
        width = std::max<int>(width, format(v).size());
  }
  std::string format(double v) const {
    if (std::isnan(v)) return "nan";  // a NaN's sign bit is not shown (fmt would say -nan)
    if (sci) return fmt::format("{:.4e}", v);
    if (int_mode) return std::isfinite(v) ? fmt::format("{:.0f}.", v) : fmt::format("{}", v);
    return fmt::format("{:.4f}", v);
  }
};

constexpr int kLineWidth = 80;

// The elements of dim `d` onward from cells[pos], as PyTorch's _tensor_str: a vector's items
// wrap at kLineWidth; slices of a k-dim sub-tensor are separated by k - 1 line breaks.
void format_dim(const std::vector<std::string>& cells, const Shape& shape, int d, int64_t& pos,
                bool summarise, int width, int indent, std::string& out) {
  out += '[';
  int64_t n = shape[d];
  const bool elided = summarise && n > 2 * kEdgeItems;
  int inner_dims = static_cast<int>(shape.size()) - d - 1;
  const std::string margin(indent + d + 1, ' ');
  if (inner_dims == 0) {
    std::vector<std::string> items;
    for (int64_t i = 0; i < n; ++i) {
      if (elided && i == kEdgeItems) {
        items.push_back(" ...");
        i = n - kEdgeItems - 1;
        continue;
      }
      items.push_back(fmt::format("{:>{}}", cells[pos++], width));
    }
    const size_t per_line = std::max(1, (kLineWidth - indent - d) / (width + 2));
    for (size_t j = 0; j < items.size(); ++j) {
      if (j > 0) out += j % per_line == 0 ? ",\n" + margin : ", ";
      out += items[j];
    }
    out += ']';
    return;
  }
  const std::string separator = "," + std::string(inner_dims, '\n') + margin;
  for (int64_t i = 0; i < n; ++i) {
    if (elided && i == kEdgeItems) {
      out += "..." + separator;
      i = n - kEdgeItems - 1;
      continue;
    }
    format_dim(cells, shape, d + 1, pos, summarise, width, indent, out);
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
  std::vector<std::string> exact;  // integer and bool elements as printed
  for (size_t i = 0; i < vals.size(); ++i) {
    if (dtype() == DType::Bool) exact.push_back(vals[i] != 0 ? "True" : "False");
    else if (!ints.empty()) exact.push_back(fmt::format("{}", ints[i]));
  }
  const Formatter formatter(vals, exact, is_floating(dtype()));
  std::vector<std::string> cells = exact;
  if (formatter.floating)
    for (double v : vals) cells.push_back(formatter.format(v));
  const int width = formatter.width;
  std::string body;
  if (dim() == 0) {
    body = cells.empty() ? "" : cells[0];
  } else if (numel() == 0) {
    body = "[]";
  } else {
    int64_t pos = 0;
    format_dim(cells, shape(), 0, pos, summarise, width, 7, body);
  }
  // PyTorch's suffixes (_str_intern, _add_suffixes): an empty tensor's size unless it is 1-D,
  // the dtype unless float32 or implied by the values (int64, True/False; an empty tensor
  // shows those too), the autograd state, each on a line of its own when it would pass
  // kLineWidth. kiln adds the shape of a summary.
  std::vector<std::string> suffixes;
  if (summarise) suffixes.push_back("shape=" + to_string(shape()));
  if (numel() == 0 && dim() != 1) {
    std::string dims;
    for (int d = 0; d < dim(); ++d) dims += fmt::format("{}{}", d ? ", " : "", shape()[d]);
    suffixes.push_back(fmt::format("size=({})", dims));
  }
  if (dtype() != DType::Float32 &&
      (numel() == 0 || (dtype() != DType::Int64 && dtype() != DType::Bool)))
    suffixes.push_back(fmt::format("dtype={}", name(dtype())));
  if (impl()->autograd) {
    std::string autograd = impl()->autograd->repr_suffix();
    if (!autograd.empty()) suffixes.push_back(std::move(autograd));
  }
  std::string out = "tensor(" + body;
  const size_t newline = out.rfind('\n');  // PyTorch's count of the last line, 2 over
  size_t last_line = newline == std::string::npos ? out.size() + 2 : out.size() - newline + 1;
  const size_t indent = 7;  // "tensor("
  for (const std::string& suffix : suffixes) {
    if (last_line + suffix.size() + 2 > kLineWidth) {
      out += ",\n" + std::string(indent, ' ') + suffix;
      last_line = indent + suffix.size();
    } else {
      out += ", " + suffix;
      last_line += suffix.size() + 2;
    }
  }
  return out + ")";
}

}  // namespace kiln
