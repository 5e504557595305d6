// Tensor::to(Device), cpu(), cuda(): copies between host and device memory.
//
// A transfer is not an op of the op table (core/ops.def): it has no kernel on a single device
// and nothing for the compiler to fuse. It is recorded for autograd by its own backward node,
// whose gradient is the transfer back.
#include "backends/cuda/copy.h"
#include "eager/autograd.h"
#include "eager/autograd_graph.h"
#include "eager/dispatch.h"

namespace kiln {
namespace {

// Copies the bytes of contiguous `src` into a new tensor on `device`.
Tensor copy_to(const Tensor& src, Device device, Loc loc) {
  Tensor out = dispatch::empty(src.shape(), src.dtype(), device);
  size_t nbytes = static_cast<size_t>(src.numel()) * src.itemsize();
  Device from = src.device();
  if (from.is_cpu() && device.is_cuda()) {
    cuda::copy_to_device(out.raw_data(), src.raw_data(), nbytes, device.index, loc);
  } else if (from.is_cuda() && device.is_cpu()) {
    cuda::copy_to_host(out.raw_data(), src.raw_data(), nbytes, from.index, loc);
  } else {
    cuda::copy_device_to_device(out.raw_data(), device.index, src.raw_data(), from.index, nbytes,
                                loc);
  }
  return out;
}

// Backward of a transfer from `source`: the incoming gradient moved back there.
class ToDeviceBackward final : public autograd::Node {
 public:
  ToDeviceBackward(Device source, Loc loc) : source_(source), loc_(loc) {}
  std::string name() const override { return "ToDeviceBackward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    if (!grads[0].defined()) return {Tensor()};
    return {grads[0].to(source_, loc_)};
  }

 private:
  Device source_;
  Loc loc_;
};

}  // namespace

Tensor Tensor::to(Device device, Loc loc) const {
  KILN_CHECK(defined(), "to", loc, "tensor is undefined");
  check_device(device, "to", loc);
  if (device == this->device()) return *this;  // no copy, as in PyTorch
  KILN_CHECK(dispatch::tracer_hook() == nullptr, "to", loc,
             "moving a tensor from {} to {} inside a compiled function is not supported yet; "
             "move it before calling the compiled function",
             this->device().str(), device.str());
  // Report a missing driver as this call's error, at the user's line.
  if (device.is_cuda() || this->device().is_cuda()) cuda::driver("to", loc);
  // Device memory is copied as one block, so the source is made contiguous on its own device.
  Tensor src = is_contiguous() ? *this : contiguous(loc);
  Tensor out;
  {
    NoGradGuard no_grad;
    out = copy_to(src, device, loc);
  }
  autograd::Edge edge = autograd::gradient_edge(src);
  if (is_grad_enabled() && edge.valid()) {
    auto node = std::make_shared<ToDeviceBackward>(src.device(), loc);
    node->next_edges.push_back(std::move(edge));
    autograd::Meta& m = autograd::ensure_meta(out);
    m.requires_grad = true;
    m.grad_fn = std::move(node);
    m.output_nr = 0;
  }
  return out;
}

Tensor Tensor::cpu(Loc loc) const { return to(Device::cpu(), loc); }
Tensor Tensor::cuda(int index, Loc loc) const { return to(Device::cuda(index), loc); }

}  // namespace kiln
