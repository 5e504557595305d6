#pragma once
// Independent float64 / exact-integer references for the conformance suite (tests/conformance).
//
// Nothing here calls a kiln kernel or core/formulas.h: tensors are read element by element
// through their strides (read()), and every op is re-implemented with std:: math in double
// (integers: exact 64-bit arithmetic with two's-complement wrap to the result dtype), naive
// loops for reductions / matmul / softmax / layer_norm / losses, explicit index logic for views
// and index ops. Promotion rules are re-stated here too (promote()).
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/op.h"
#include "kiln/kiln.h"

namespace conf {

using kiln::DType;
using kiln::OpAttrs;
using kiln::OpKind;
using kiln::Tensor;
using Ix = std::vector<int64_t>;

/// How closely eager must match the reference (see the table at the top of conformance_test.cpp).
enum class Tol { Exact, Approx, Accum };

/// The values of a tensor, read through its strides (no kiln kernel involved).
struct Arr {
  Ix shape;
  DType dtype = DType::Float32;
  std::vector<double> f;   // every dtype, as double
  std::vector<int64_t> i;  // integer / bool dtypes, exact
  int64_t numel() const { return static_cast<int64_t>(f.size()); }
};

/// The expected result of an op, or that it must raise.
struct Ref {
  bool raises = false;
  std::string why;         // why it must raise (for the failure message)
  Ix shape;
  DType dtype = DType::Float32;
  std::vector<double> f;   // float results (already rounded to dtype)
  std::vector<int64_t> i;  // integer / bool results
  std::vector<double> mag; // Accum: per element, the sum of |terms| (scales the tolerance)
  Tol tol = Tol::Exact;
  bool aliases_input0 = false;  // views: the result must share input 0's storage
  bool property_only = false;   // random ops: checked by property (see check_random)
};

inline int64_t numel(const Ix& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}
inline bool is_float(DType d) { return d == DType::Float32 || d == DType::Float64; }
inline bool is_int(DType d) { return d == DType::Int32 || d == DType::Int64; }
inline int rank_of(DType d) {
  switch (d) {
    case DType::Bool: return 0;
    case DType::Int32: return 1;
    case DType::Int64: return 2;
    case DType::Float32: return 3;
    default: return 4;
  }
}
inline int kind_of(DType d) { return d == DType::Bool ? 0 : is_int(d) ? 1 : 2; }
inline DType max_dtype(DType a, DType b) { return rank_of(a) >= rank_of(b) ? a : b; }

/// PyTorch's promotion for tensors: dimensioned tensors decide, a 0-d tensor only when it is of
/// a higher kind (bool < integer < float); `scalars` are wrapped host numbers (a third tier).
inline DType promote(const std::vector<Arr>& xs, const std::vector<kiln::Scalar>& scalars = {}) {
  bool have[3] = {false, false, false};
  DType tier[3] = {DType::Bool, DType::Bool, DType::Bool};
  for (const Arr& x : xs) {
    int t = x.shape.empty() ? 1 : 0;
    tier[t] = have[t] ? max_dtype(tier[t], x.dtype) : x.dtype;
    have[t] = true;
  }
  for (const kiln::Scalar& s : scalars) {
    DType d = s.is_floating() ? DType::Float32 : s.dtype() == DType::Bool ? DType::Bool : DType::Int64;
    tier[2] = have[2] ? max_dtype(tier[2], d) : d;
    have[2] = true;
  }
  DType r = DType::Bool;
  bool any = false;
  for (int t = 0; t < 3; ++t) {
    if (!have[t]) continue;
    if (!any) r = tier[t], any = true;
    else if (kind_of(tier[t]) > kind_of(r))
      r = (t == 2 && is_float(tier[t])) ? DType::Float32 : max_dtype(r, tier[t]);
  }
  return r;
}

template <class F> void for_each_index(const Ix& shape, F&& f) {
  int64_t n = numel(shape);
  Ix idx(shape.size(), 0);
  for (int64_t flat = 0; flat < n; ++flat) {
    f(idx, flat);
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < shape[static_cast<size_t>(d)]) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
}

template <class T> void read_typed(const Tensor& t, Arr& a) {
  const T* base = static_cast<const T*>(t.raw_data());
  Ix strides(t.strides().begin(), t.strides().end());
  for_each_index(a.shape, [&](const Ix& idx, int64_t) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * strides[d];
    T v = base[off];
    a.f.push_back(static_cast<double>(v));
    if constexpr (!std::is_floating_point_v<T>) a.i.push_back(static_cast<int64_t>(v));
  });
}

inline Arr read(const Tensor& t) {
  Arr a;
  a.shape = Ix(t.shape().begin(), t.shape().end());
  a.dtype = t.dtype();
  switch (t.dtype()) {
    case DType::Float32: read_typed<float>(t, a); break;
    case DType::Float64: read_typed<double>(t, a); break;
    case DType::Int32: read_typed<int32_t>(t, a); break;
    case DType::Int64: read_typed<int64_t>(t, a); break;
    default: read_typed<bool>(t, a); break;
  }
  return a;
}

/// x rounded to a float dtype (float32 values are rounded once from the double result).
inline double round_to(DType d, double x) {
  return d == DType::Float32 ? static_cast<double>(static_cast<float>(x)) : x;
}
/// Two's-complement wrap of a 64-bit result to an integer / bool dtype.
inline int64_t wrap_to(DType d, uint64_t v) {
  if (d == DType::Int32) return static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(v)));
  if (d == DType::Bool) return v != 0;
  return static_cast<int64_t>(v);
}
/// An input element converted to compute dtype `c` (float), as double.
inline double as_float(const Arr& a, int64_t j, DType c) {
  return round_to(c, a.f[static_cast<size_t>(j)]);
}
inline int64_t as_int(const Arr& a, int64_t j) {
  return a.i.empty() ? static_cast<int64_t>(a.f[static_cast<size_t>(j)]) : a.i[static_cast<size_t>(j)];
}

inline Ref raises(std::string why) {
  Ref r;
  r.raises = true;
  r.why = std::move(why);
  return r;
}

inline Ref result(const Ix& shape, DType dt, Tol tol = Tol::Exact) {
  Ref r;
  r.shape = shape;
  r.dtype = dt;
  r.tol = tol;
  size_t n = static_cast<size_t>(numel(shape));
  if (is_float(dt)) r.f.assign(n, 0.0);
  else r.i.assign(n, 0);
  return r;
}
inline void set_f(Ref& r, int64_t j, double v) { r.f[static_cast<size_t>(j)] = round_to(r.dtype, v); }
inline void set_i(Ref& r, int64_t j, uint64_t v) { r.i[static_cast<size_t>(j)] = wrap_to(r.dtype, v); }

/// NumPy broadcasting of shapes; false when they do not broadcast.
inline bool broadcast(const std::vector<Ix>& shapes, Ix& out) {
  size_t r = 0;
  for (const Ix& s : shapes) r = std::max(r, s.size());
  out.assign(r, 1);
  for (const Ix& s : shapes)
    for (size_t k = 0; k < s.size(); ++k) {
      int64_t& o = out[r - s.size() + k];
      int64_t v = s[k];
      if (o == v || v == 1) continue;
      if (o == 1) o = v;
      else return false;
    }
  return true;
}
/// Flat position in `a` (row-major) of output index `idx` under broadcasting.
inline int64_t bcast_at(const Arr& a, const Ix& idx) {
  int64_t j = 0;
  size_t off = idx.size() - a.shape.size();
  for (size_t k = 0; k < a.shape.size(); ++k)
    j = j * a.shape[k] + (a.shape[k] == 1 ? 0 : idx[off + k]);
  return j;
}
inline int64_t flat_of(const Ix& shape, const Ix& idx) {
  int64_t j = 0;
  for (size_t k = 0; k < shape.size(); ++k) j = j * shape[k] + idx[k];
  return j;
}
inline int64_t wrap_dim(int64_t d, int64_t rank) { return d < 0 ? d + rank : d; }

/// The reference of op `k` on `inputs` with `attrs`. Unknown ops return a Ref with
/// why == "no reference" (the suite then fails, saying what to add).
Ref reference(OpKind k, const std::vector<Tensor>& inputs, const OpAttrs& a);

}  // namespace conf
