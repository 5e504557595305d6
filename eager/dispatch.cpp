#include "eager/dispatch.h"

#include <array>
#include <utility>

#include "backends/cpu/allocator.h"
#include "backends/cpu/kernels.h"
#include "eager/view.h"

namespace kiln::dispatch {
namespace {

thread_local DispatchHook* t_tracer_hook = nullptr;
DispatchHook* g_autograd_hook = nullptr;

// Whether input i of `op` is converted to the compute dtype before the kernel runs.
// Index tensors, masks and conditions keep their dtype.
bool converts_input(OpKind op, size_t i) {
  switch (op_info(op).category) {
    case OpCategory::Unary:
    case OpCategory::Binary:
    case OpCategory::Reduction:
    case OpCategory::IndexReduction:
    case OpCategory::Normalization:
    case OpCategory::Matmul:
    case OpCategory::Shape: return true;
    case OpCategory::Ternary: return i > 0;
    case OpCategory::Loss: return op == OpKind::MseLoss || i == 0;
    default: return false;
  }
}

bool is_in_place(OpKind op) { return op == OpKind::CopyInto || op == OpKind::Fill; }

void check_inputs(const OpCall& c) {
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    if (!t.defined()) {
      KILN_CHECK(c.op == OpKind::LayerNorm && i > 0, c.name(), c.loc,
                 "input {} is an undefined tensor", i);
      continue;
    }
    KILN_CHECK(t.device().is_cpu(), c.name(), c.loc,
               "input {} is on {}, but only the cpu backend is available", i, t.device().str());
  }
}

}  // namespace

DispatchHook* set_tracer_hook(DispatchHook* hook) { return std::exchange(t_tracer_hook, hook); }
DispatchHook* tracer_hook() { return t_tracer_hook; }
DispatchHook* set_autograd_hook(DispatchHook* hook) {
  return std::exchange(g_autograd_hook, hook);
}

Tensor empty(const Shape& shape, DType dtype, Device device) {
  KILN_CHECK(device.is_cpu(), "empty", Loc::current(), "no backend for device {}", device.str());
  check_shape(shape, itemsize(dtype), "empty");
  auto impl = std::make_shared<TensorImpl>();
  int64_t n = numel(shape);
  impl->storage = std::make_shared<StorageImpl>(static_cast<size_t>(n) * itemsize(dtype),
                                                cpu::allocator());
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor wrap_scalar(Scalar s) {
  DType t = s.is_floating() ? DType::Float64 : (s.is_bool() ? DType::Bool : DType::Int64);
  Tensor out = empty({}, t);
  KILN_DISPATCH_ALL(t, T, { *out.data<T>() = s.to<T>(); });
  out.impl()->wrapped_number = true;
  return out;
}

std::vector<Tensor> call(OpCall&& c) {
  check_inputs(c);
  // Metadata of the defined inputs (absent optional inputs are skipped).
  std::array<TensorMeta, 4> small;
  std::vector<TensorMeta> large;
  size_t n = 0;
  for (const Tensor& t : c.inputs) n += t.defined();
  TensorMeta* metas = small.data();
  if (n > small.size()) {
    large.resize(n);
    metas = large.data();
  }
  size_t j = 0;
  for (const Tensor& t : c.inputs)
    if (t.defined()) metas[j++] = TensorMeta::of(t);
  InferredMeta meta = infer_meta(c.op, std::span<const TensorMeta>(metas, n), c.attrs, c.loc);

  std::vector<Tensor> outs;
  if (t_tracer_hook && t_tracer_hook->before_kernel(c, meta, outs)) {
    t_tracer_hook->after_kernel(c, meta, outs);
    return outs;
  }

  if (is_in_place(c.op)) {
    const Tensor& dst = c.inputs[0];
    for (int d = 0; d < dst.dim(); ++d)
      KILN_CHECK(dst.strides()[d] != 0 || dst.shape()[d] <= 1, c.name(), c.loc,
                 "more than one element of the written-to tensor (shape {}, strides {}) refers to "
                 "a single memory location; clone() it first",
                 to_string(dst.shape()), to_string(dst.strides()));
  }
  if (g_autograd_hook) g_autograd_hook->before_kernel(c, meta, outs);  // rejects bad in-place ops

  // The kernel sees inputs in the compute dtype; the caller's tensors are untouched.
  const OpCall* kp = &c;
  OpCall converted;
  // copy_ from memory that overlaps the destination (a.copy_(a.t())) reads a snapshot.
  if (c.op == OpKind::CopyInto && c.inputs[1].storage() == c.inputs[0].storage()) {
    converted = c;
    kp = &converted;
    Tensor snap = empty(c.inputs[1].shape(), c.inputs[1].dtype());
    cpu::copy_cast(snap, c.inputs[1]);
    converted.inputs[1] = snap;
  }
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    if (t.defined() && t.dtype() != meta.compute_dtype && converts_input(c.op, i)) {
      if (kp == &c) converted = c, kp = &converted;  // (kp may already be the snapshot copy)
      Tensor conv = empty(t.shape(), meta.compute_dtype);
      cpu::copy_cast(conv, t);
      converted.inputs[i] = conv;
    }
  }

  if (op_info(c.op).category == OpCategory::View) {
    outs.push_back(make_view(*kp, meta));
  } else {
    if (is_in_place(c.op)) {
      outs.push_back(c.inputs[0]);
    } else {
      outs.reserve(meta.outputs.size());
      for (const OutputMeta& o : meta.outputs) outs.push_back(empty(o.shape, o.dtype));
    }
    cpu::Kernel k = cpu::kernel_for(c.op);
    KILN_CHECK(k != nullptr, c.name(), c.loc, "no cpu kernel");
    k(*kp, meta, outs);
    if (is_in_place(c.op)) c.inputs[0].bump_version();
  }
  if (g_autograd_hook) g_autograd_hook->after_kernel(c, meta, outs);
  if (t_tracer_hook) t_tracer_hook->after_kernel(c, meta, outs);
  return outs;
}

Tensor call1(OpCall&& c) { return std::move(call(std::move(c))[0]); }

}  // namespace kiln::dispatch
