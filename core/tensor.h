#pragma once
/// Tensor: a cheap, ref-counted handle to a TensorImpl (storage + shape + strides + offset +
/// dtype). Copying a Tensor copies the handle, not the data; views share the storage.
///
/// Metadata accessors are defined in core/. The op methods (t.sum(), t.view(...), ...) are
/// declared here for convenience and defined in eager/ (like ATen's TensorBody); they go
/// through the dispatcher exactly like the free functions in eager/ops.h.
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/scalar.h"
#include "core/shape.h"
#include "core/storage.h"

namespace kiln {

/// Autograd state attached to a tensor; defined by eager/ (core only holds the pointer).
struct AutogradMeta {
  virtual ~AutogradMeta() = default;
  /// What a printed tensor shows of its autograd state ("grad_fn=<MulBackward>",
  /// "requires_grad=True"), or "" (eager/ fills it in; core knows no autograd).
  virtual std::string repr_suffix() const { return ""; }
};

struct TensorImpl {
  Storage storage;
  Shape shape;
  Strides strides;        // in elements; may be 0 (broadcast) or non-monotonic (views)
  int64_t offset = 0;     // in elements
  DType dtype = DType::Float32;
  /// A host scalar wrapped as a 0-d tensor: takes part in type promotion like a Scalar.
  bool wrapped_number = false;
  /// Which autograd lineage of its storage the tensor belongs to: 0, or the id detach() gave
  /// it (its views inherit it). Tensors of one lineage share gradient history through their
  /// memory (StorageImpl::gained_history_in_place); a detached one does not.
  uint64_t lineage = 0;
  /// A view's base: the tensor whose memory it views, itself never a view (a view of a view
  /// has the first one's base); null for other tensors. An in-place op on a view gives the base
  /// the new gradient history (autograd's CopySlices, as in PyTorch).
  std::shared_ptr<TensorImpl> base;
  std::shared_ptr<AutogradMeta> autograd;
};

struct TensorOperand;
struct ScalarOperand;
struct ValuesIndices;  // eager/ops.h

/// Observer of raw element access (Tensor::data<T>(), raw_data()) on the calling thread: the
/// tracer runs a function eagerly whose own code reaches tensor memory through a pointer, which
/// a replay of its recorded ops would skip. Returns the previous observer.
using RawAccessObserver = void (*)(Loc loc);
RawAccessObserver set_raw_access_observer(RawAccessObserver observer);
namespace detail {
extern thread_local RawAccessObserver t_raw_access_observer;
}  // namespace detail

class Tensor {
 public:
  /// An undefined tensor (no storage); most ops reject it with kiln::Error.
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  DType dtype() const { return checked()->dtype; }
  Device device() const { return checked()->storage->device(); }
  const Shape& shape() const { return checked()->shape; }
  const Strides& strides() const { return checked()->strides; }
  int64_t offset() const { return checked()->offset; }
  int dim() const { return checked()->shape.size(); }
  /// Size of dim `d` (negative counts from the end). Throws kiln::Error if out of range.
  int64_t size(int64_t d, Loc loc = Loc::current()) const;
  int64_t stride(int64_t d, Loc loc = Loc::current()) const;
  int64_t numel() const { return kiln::numel(checked()->shape); }
  size_t itemsize() const { return kiln::itemsize(checked()->dtype); }
  bool is_contiguous() const;
  /// True when the tensor's elements cover one dense block (any order of dims).
  bool is_non_overlapping_and_dense() const;

  /// Pointer to the first element (storage base + offset). T must match dtype(). For a CUDA
  /// tensor this is a device address: pass it to kernels, never dereference it on the host.
  /// Inside compile() a call from the user's code makes the function run eagerly (a replay
  /// would not run the reads and writes made through the pointer). storage()->data() is not
  /// watched: compile()'s check=true finds what a write through it leaves different.
  template <class T> T* data(Loc loc = Loc::current()) const {
    check_data_type(dtype_of<T>(), loc);
    if (detail::t_raw_access_observer) [[unlikely]] detail::t_raw_access_observer(loc);
    return static_cast<T*>(impl_->storage->data()) + impl_->offset;
  }
  /// data<T>() without the dtype check.
  void* raw_data(Loc loc = Loc::current()) const {
    if (detail::t_raw_access_observer) [[unlikely]] detail::t_raw_access_observer(loc);
    return static_cast<char*>(checked()->storage->data()) + impl_->offset * itemsize();
  }
  const Storage& storage() const { return checked()->storage; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  uint64_t version() const { return checked()->storage->version(); }
  void bump_version() const { checked()->storage->bump_version(); }

  /// The value of a one-element tensor as T (bool, int32_t, int64_t, float or double).
  /// Throws kiln::Error if numel() != 1, if the tensor is not on the cpu ("tensor is on cuda:0;
  /// call .cpu() first"; likewise to_vector()), or if T cannot hold the value (NaN or a value
  /// out of range into an integer, an int64 out of int32's range, a double past float's
  /// largest), as PyTorch's checked item<T>().
  template <class T> T item(Loc loc = Loc::current()) const;
  /// Copies the elements (in logical row-major order) into a vector of T, converting as item().
  template <class T> std::vector<T> to_vector(Loc loc = Loc::current()) const;

  // ---- op methods (defined in eager/) ----
  /// This tensor converted to `dtype` (C++ conversion rules); *this itself if already `dtype`.
  Tensor to(DType dtype, Loc loc = Loc::current()) const;
  /// This tensor on `device`: *this itself if already there, otherwise a contiguous copy
  /// (same shape, dtype and values). Recorded by autograd: the gradient goes back to the
  /// source device. Throws kiln::Error "no CUDA device: ..." when CUDA is unavailable.
  Tensor to(Device device, Loc loc = Loc::current()) const;
  /// to(Device::cpu()).
  Tensor cpu(Loc loc = Loc::current()) const;
  /// to(Device::cuda(index)).
  Tensor cuda(int index = 0, Loc loc = Loc::current()) const;
  Tensor clone(Loc loc = Loc::current()) const;
  Tensor contiguous(Loc loc = Loc::current()) const;
  /// Copies `src` (broadcast to this shape, converted to this dtype) into this tensor; a
  /// source on another device is moved to this tensor's device first.
  Tensor& copy_(const Tensor& src, Loc loc = Loc::current());
  /// Sets every element to `value` (converted to this dtype); as in PyTorch, an expanded
  /// (stride-0) view may be filled, unlike the other in-place ops.
  Tensor& fill_(Scalar value, Loc loc = Loc::current());
  Tensor view(const Shape& shape, Loc loc = Loc::current()) const;
  Tensor reshape(const Shape& shape, Loc loc = Loc::current()) const;
  Tensor transpose(int64_t d0, int64_t d1, Loc loc = Loc::current()) const;
  /// Transpose of a 2-D tensor (or a 0/1-D tensor, unchanged).
  Tensor t(Loc loc = Loc::current()) const;
  Tensor permute(const Dims& order, Loc loc = Loc::current()) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1,
               Loc loc = Loc::current()) const;
  Tensor select(int64_t dim, int64_t index, Loc loc = Loc::current()) const;
  Tensor expand(const Shape& shape, Loc loc = Loc::current()) const;
  Tensor squeeze(Loc loc = Loc::current()) const;
  Tensor squeeze(int64_t dim, Loc loc = Loc::current()) const;
  Tensor unsqueeze(int64_t dim, Loc loc = Loc::current()) const;
  Tensor flatten(int64_t start = 0, int64_t end = -1, Loc loc = Loc::current()) const;

  Tensor sum(Loc loc = Loc::current()) const;
  Tensor sum(const Dims& dims, bool keepdim = false, Loc loc = Loc::current()) const;
  Tensor mean(Loc loc = Loc::current()) const;
  Tensor mean(const Dims& dims, bool keepdim = false, Loc loc = Loc::current()) const;
  Tensor matmul(const Tensor& other, Loc loc = Loc::current()) const;
  /// Entries of `index` (int32/int64, 0-d or 1-D) along `dim`; see kiln::index_select.
  Tensor index_select(int64_t dim, const Tensor& index, Loc loc = Loc::current()) const;
  /// This tensor with source's slices written at `index` along `dim`; see kiln::index_copy.
  Tensor index_copy(int64_t dim, const Tensor& index, const Tensor& source,
                    Loc loc = Loc::current()) const;
  /// kiln::index_copy written into this tensor (a KV cache's slot at a position tensor:
  /// `k_cache.index_copy_(1, pos, k)`); errors as kiln::index_copy's, raised before anything
  /// is written. Recorded by autograd and by compile() as copy_ of the out-of-place result.
  Tensor& index_copy_(int64_t dim, const Tensor& index, const Tensor& source,
                      Loc loc = Loc::current());

  // PyTorch's method spellings of common ops: x.exp() is kiln::exp(x), x.amax(1) is
  // kiln::amax(x, 1), x.mul_(y) is x *= y; eager/ops.h documents each op and its errors.
  Tensor exp(Loc loc = Loc::current()) const;
  Tensor log(Loc loc = Loc::current()) const;
  Tensor sqrt(Loc loc = Loc::current()) const;
  Tensor rsqrt(Loc loc = Loc::current()) const;
  Tensor abs(Loc loc = Loc::current()) const;
  Tensor neg(Loc loc = Loc::current()) const;
  Tensor relu(Loc loc = Loc::current()) const;
  Tensor sigmoid(Loc loc = Loc::current()) const;
  Tensor tanh(Loc loc = Loc::current()) const;
  Tensor pow(Scalar exponent, Loc loc = Loc::current()) const;
  Tensor clamp(std::optional<Scalar> low, std::optional<Scalar> high,
               Loc loc = Loc::current()) const;
  Tensor softmax(int64_t dim, Loc loc = Loc::current()) const;
  Tensor log_softmax(int64_t dim, Loc loc = Loc::current()) const;
  Tensor amax(const Dims& dims = {}, bool keepdim = false, Loc loc = Loc::current()) const;
  Tensor amin(const Dims& dims = {}, bool keepdim = false, Loc loc = Loc::current()) const;
  Tensor prod(const Dims& dims = {}, bool keepdim = false, Loc loc = Loc::current()) const;
  /// x.var(), x.std({0, 1}, 0), x.var(1): see kiln::var (correction 1 by default).
  Tensor var(const Dims& dims = {}, int64_t correction = 1, bool keepdim = false,
             Loc loc = Loc::current()) const;
  Tensor std(const Dims& dims = {}, int64_t correction = 1, bool keepdim = false,
             Loc loc = Loc::current()) const;
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  Tensor var(I dim, int64_t correction = 1, bool keepdim = false,
             Loc loc = Loc::current()) const {
    return var(Dims{static_cast<int64_t>(dim)}, correction, keepdim, loc);
  }
  template <std::integral I>
    requires(!std::same_as<I, bool>)
  Tensor std(I dim, int64_t correction = 1, bool keepdim = false,
             Loc loc = Loc::current()) const {
    return std(Dims{static_cast<int64_t>(dim)}, correction, keepdim, loc);
  }
  Tensor logsumexp(const Dims& dims, bool keepdim = false, Loc loc = Loc::current()) const;
  Tensor all(const Dims& dims = {}, bool keepdim = false, Loc loc = Loc::current()) const;
  Tensor any(const Dims& dims = {}, bool keepdim = false, Loc loc = Loc::current()) const;
  /// x.sum(1), x.mean(-1), x.all(1): one dim, as in PyTorch (a template, so that x.sum({})
  /// still means every dim: a braced list never deduces an integer).
#define KILN_ONE_DIM_METHOD(op)                                          \
  template <std::integral I>                                                \
    requires(!std::same_as<I, bool>)                                        \
  Tensor op(I dim, bool keepdim = false, Loc loc = Loc::current()) const {  \
    return op(Dims{static_cast<int64_t>(dim)}, keepdim, loc);               \
  }
  KILN_ONE_DIM_METHOD(sum)
  KILN_ONE_DIM_METHOD(mean)
  KILN_ONE_DIM_METHOD(amax)
  KILN_ONE_DIM_METHOD(amin)
  KILN_ONE_DIM_METHOD(prod)
  KILN_ONE_DIM_METHOD(logsumexp)
  KILN_ONE_DIM_METHOD(all)
  KILN_ONE_DIM_METHOD(any)
#undef KILN_ONE_DIM_METHOD
  /// x.max(), x.min(): the largest / smallest element (kiln::max(x)); x.max(1) gives
  /// `auto [values, indices]` along dim 1 (kiln::max(x, 1)).
  Tensor max(Loc loc = Loc::current()) const;
  Tensor min(Loc loc = Loc::current()) const;
  ValuesIndices max(int64_t dim, bool keepdim = false, Loc loc = Loc::current()) const;
  ValuesIndices min(int64_t dim, bool keepdim = false, Loc loc = Loc::current()) const;
  Tensor argmax(std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
                Loc loc = Loc::current()) const;
  Tensor argmin(std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
                Loc loc = Loc::current()) const;
  /// x.sort(), x.argsort(1, true), x.topk(5), x.cumsum(-1): see kiln::sort, kiln::argsort,
  /// kiln::topk and kiln::cumsum.
  ValuesIndices sort(int64_t dim = -1, bool descending = false, Loc loc = Loc::current()) const;
  Tensor argsort(int64_t dim = -1, bool descending = false, Loc loc = Loc::current()) const;
  ValuesIndices topk(int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true,
                     Loc loc = Loc::current()) const;
  Tensor cumsum(int64_t dim, std::optional<DType> dtype = std::nullopt,
                Loc loc = Loc::current()) const;
  Tensor& add_(TensorOperand other);
  Tensor& add_(ScalarOperand other);
  Tensor& sub_(TensorOperand other);
  Tensor& sub_(ScalarOperand other);
  Tensor& mul_(TensorOperand other);
  Tensor& mul_(ScalarOperand other);
  Tensor& div_(TensorOperand other);
  Tensor& div_(ScalarOperand other);

  // In-place arithmetic (bumps the version counter); errors name the caller's line.
  Tensor& operator+=(TensorOperand o);
  Tensor& operator-=(TensorOperand o);
  Tensor& operator*=(TensorOperand o);
  Tensor& operator/=(TensorOperand o);
  Tensor& operator+=(ScalarOperand o);
  Tensor& operator-=(ScalarOperand o);
  Tensor& operator*=(ScalarOperand o);
  Tensor& operator/=(ScalarOperand o);

  // ---- autograd (defined in eager/autograd.cpp) ----
  /// Whether gradients are recorded for ops on this tensor.
  bool requires_grad() const;
  /// Marks a leaf tensor as requiring grad (a no-op on a non-leaf, as PyTorch). Throws
  /// kiln::Error for non-floating tensors and for requires_grad_(false) on a non-leaf.
  Tensor& requires_grad_(bool enabled = true, Loc loc = Loc::current());
  /// The accumulated gradient (undefined until a backward pass reaches this tensor).
  Tensor grad() const;
  /// Replaces the accumulated gradient (undefined clears it). Throws kiln::Error naming the
  /// caller's line when this tensor is undefined or g's shape or dtype differs from its own.
  void set_grad(const Tensor& g, Loc loc = Loc::current()) const;
  /// True for tensors created by the user (not by a recorded op).
  bool is_leaf() const;
  /// Name of the backward node that produced this tensor ("MulBackward"), or "" for leaves.
  std::string grad_fn_name() const;
  /// Also keep .grad for this non-leaf tensor on the next backward. Throws kiln::Error naming
  /// the caller's line when the tensor does not require grad.
  void retain_grad(Loc loc = Loc::current()) const;
  /// A tensor sharing this one's storage (and version counter) with no autograd history.
  Tensor detach(Loc loc = Loc::current()) const;
  /// Back-propagates from this tensor. `gradient` may be omitted for a one-element tensor.
  /// retain_graph keeps saved tensors for a second backward; create_graph records the
  /// backward itself for higher-order gradients (each leaf's .grad then holds the graph that
  /// made it, a reference cycle until the .grad is cleared: said once per process on stderr,
  /// as PyTorch warns; kiln::grad() has no such cycle). Throws kiln::Error when no input
  /// requires grad, when the graph was freed by an earlier backward, or when a saved tensor
  /// was modified in place after it was saved.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false,
                bool create_graph = false, Loc loc = Loc::current()) const;

  /// PyTorch-style repr: values (summarised when large), shape and dtype.
  std::string str() const;

 private:
  /// impl_, or kiln::Error("tensor is undefined") for a default-constructed Tensor.
  TensorImpl* checked() const {
    if (!impl_) [[unlikely]] throw_undefined();
    return impl_.get();
  }
  [[noreturn]] static void throw_undefined();
  void check_data_type(DType requested, Loc loc) const;
  std::shared_ptr<TensorImpl> impl_;
};

/// An operand of an operator (`a * b`, `x += y`) with the caller's source line. Operators
/// cannot take a defaulted `Loc` argument, so the operand takes it when it converts: errors
/// from `a * b` then name the line of `a * b`, as they do for `mul(a, b)`.
struct TensorOperand {
  TensorOperand(const Tensor& t, Loc where = Loc::current()) : tensor(t), loc(where) {}
  const Tensor& tensor;
  Loc loc;
};
/// A host-number operand of an in-place operator (`x *= 2`), with the caller's source line.
struct ScalarOperand {
  template <class T>
    requires std::is_constructible_v<Scalar, T>
  ScalarOperand(T v, Loc where = Loc::current()) : scalar(v), loc(where) {}
  Scalar scalar;
  Loc loc;
};

/// Observer of values read to the host (item(), to_vector()) on the calling thread; the tracer
/// uses it to end a graph segment at a data-dependent read. Returns the previous observer.
using HostReadObserver = void (*)(const Tensor& t, Loc loc);
HostReadObserver set_host_read_observer(HostReadObserver observer);

/// Metadata of a tensor without data; what shape/dtype inference works on.
struct TensorMeta {
  DType dtype = DType::Float32;
  Shape shape;
  bool wrapped_number = false;
  /// A 2-D matrix stored column-major: a transpose of a contiguous matrix (nn::Linear's
  /// weight.t()), which addmm's backward gives a gradient of the same layout.
  bool column_major = false;
  static TensorMeta of(const Tensor& t) {
    const bool column_major = t.dim() == 2 && t.shape()[0] > 1 && t.shape()[1] > 1 &&
                              t.strides()[0] == 1 && t.strides()[1] == t.shape()[0];
    return {t.dtype(), t.shape(), t.impl()->wrapped_number, column_major};
  }
};

}  // namespace kiln

template <> struct fmt::formatter<kiln::Tensor> : fmt::formatter<std::string> {
  auto format(const kiln::Tensor& t, format_context& ctx) const {
    return fmt::formatter<std::string>::format(t.str(), ctx);
  }
};
/// `fmt::print("{} {}", t.shape(), t.dtype())` prints "[2, 3] float32", as error messages do.
template <> struct fmt::formatter<kiln::Shape> : fmt::formatter<std::string> {
  auto format(const kiln::Shape& s, format_context& ctx) const {
    return fmt::formatter<std::string>::format(kiln::to_string(s), ctx);
  }
};
template <> struct fmt::formatter<kiln::DType> : fmt::formatter<std::string_view> {
  auto format(kiln::DType d, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(kiln::name(d), ctx);
  }
};
