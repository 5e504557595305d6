#pragma once
/// The dispatcher: the one path every op call takes.
///
///   validate + infer shapes/dtypes (core/meta.h)
///   → tracer hook (thread-local; used by compile())
///   → view construction, or input dtype conversion + output allocation + backend kernel
///   → version-counter bump for in-place ops
///   → autograd hook (records a backward node when an input requires grad)
#include <span>
#include <vector>

#include "core/meta.h"

namespace kiln {

/// An extension point on the dispatch path. Hooks see every op with its validated metadata.
class DispatchHook {
 public:
  virtual ~DispatchHook() = default;
  /// Called before the kernel. Return true if the hook produced `outs` itself (e.g. a tracer
  /// computing with symbolic values); the kernel is then skipped.
  virtual bool before_kernel(const OpCall& call, const InferredMeta& meta,
                             std::vector<Tensor>& outs) {
    return false;
  }
  /// Called once the outputs exist.
  virtual void after_kernel(const OpCall& call, const InferredMeta& meta,
                            std::vector<Tensor>& outs) {}
  /// Called (tracer hook only) after autograd changed the .grad of leaf tensor `leaf`
  /// (backward accumulating into it, set_grad, zero_grad).
  virtual void on_grad_assigned(const Tensor& leaf) {}
  /// Called (tracer hook only) when backward is about to give leaf tensor `leaf` its first
  /// .grad: the result depends on the .grad being undefined (else it would accumulate).
  virtual void on_grad_found_undefined(const Tensor& leaf) {}
};

namespace dispatch {

/// Installs the tracer hook for the calling thread (nullptr removes it); returns the old one.
DispatchHook* set_tracer_hook(DispatchHook* hook);
/// The calling thread's tracer hook (nullptr when not tracing).
DispatchHook* tracer_hook();
/// Installs the process-wide autograd hook (nullptr removes it); returns the old one.
DispatchHook* set_autograd_hook(DispatchHook* hook);

/// Runs `call` and returns its outputs. Throws kiln::Error for invalid inputs.
std::vector<Tensor> call(OpCall&& call);
/// call() for single-output ops.
Tensor call1(OpCall&& call);

/// A new contiguous tensor with uninitialised elements, from the device's allocator
/// (cuda::allocator(i) for Device::cuda(i)). Throws kiln::Error "no CUDA device: ..." for a
/// CUDA device when CUDA is unavailable.
Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());

/// The kernels of a non-cpu device: computes op `call` into `outs`, which the dispatcher has
/// allocated on the inputs' device with the shapes/dtypes of `meta` (for in-place ops, outs[0]
/// is inputs[0]). Unlike cpu kernels, device kernels see the inputs in their own dtypes (the
/// dispatcher converts nothing; meta.compute_dtype says what to compute in) and may see 0-d
/// cpu "wrapped number" inputs (Python-style scalars). Views never reach the kernel.
using DeviceKernel = void (*)(const OpCall& call, const InferredMeta& meta,
                              std::span<Tensor> outs);
/// Registers the kernel provider for `type` (nullptr removes it); returns the old one. For
/// CUDA it is installed by kiln's codegen; without one, every non-view op on CUDA tensors
/// throws kiln::Error "<op>: no CUDA kernels registered ...".
DeviceKernel set_device_kernel(DeviceType type, DeviceKernel kernel);

/// A 0-d tensor holding host scalar `s` marked as a wrapped number (promotes like a Scalar).
Tensor wrap_scalar(Scalar s);

}  // namespace dispatch
}  // namespace kiln
