// Eager ops on CUDA tensors (issue 7). Kernels are generated, not hand-written: an op call
// becomes a one-op kiln graph, compiled for the tensors' device by the same pipeline as compiled
// graphs (codegen/gpu_lowering.cpp) and cached per (op, attributes, dtypes, shapes). So one
// lowering per op serves the CPU, compiled GPU graphs and eager GPU ops, and every eager GPU
// kernel's PTX is checked on machines without a GPU (tests/conformance/gpu_ptx_ops_test.cpp).
// Random ops (rand, randn, randint, dropout and its mask) draw on the device from a kernel whose
// operand is the Philox key (codegen/lower_random.cpp). contiguous()/copy_ of permuted or
// broadcast views are copy kernels. Ops the codegen does not lower (other copy_/fill_, bool
// index_add/scatter_add, other strided views) run their CPU kernel on host copies of the
// operands' storages and copy the written storages back: correct for every op, slow
// (codegen/README.md, "GPU").
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <unordered_map>

#include "backends/cpu/allocator.h"
#include "backends/cpu/kernels.h"
#include "backends/cuda/copy.h"
#include "backends/cuda/driver.h"
#include "codegen/codegen.h"
#include "codegen/strided_read.h"
#include "core/philox.h"
#include "eager/autograd.h"
#include "eager/dispatch.h"
#include "eager/value_checks.h"

namespace kiln::codegen {
namespace {

/// One input of a one-op kernel: the tensor passed to the kernel and, for a dense permuted view
/// (W.t()), the permutation the graph applies to it (the tensor passed is the contiguous base);
/// for a broadcast view (stride 0), the shape the graph then expands it to; for another strided
/// view (`x[:, 1:]`, `x[..., ::2]`), the view ops the graph applies to the contiguous block of
/// storage passed (codegen/strided_read.h).
struct KernelInput {
  Tensor tensor;
  std::optional<Dims> permute;
  std::optional<Dims> expand;
  std::optional<StridedRead> strided;
};

/// `t` as a kernel input on `device`, or nullopt when the host path must take it (a strided
/// view that is not a dense permutation, possibly broadcast). 0-d host scalars are converted to
/// `compute` (as compile() feeds wrapped scalars) and copied to the device (a copy, not
/// Tensor::to, which compile()'s tracing rejects).
std::optional<KernelInput> kernel_input(const Tensor& t, DType compute, Device device) {
  if (t.device() != device) {
    Tensor host = t;
    if (t.impl()->wrapped_number && t.dtype() != compute) {
      host = dispatch::empty({}, compute);
      cpu::copy_cast(host, t);
    }
    Tensor d = dispatch::empty(host.shape(), host.dtype(), device);
    cuda::copy_to_device(d.raw_data(), host.raw_data(), itemsize(host.dtype()), device.index);
    return KernelInput{d, std::nullopt, std::nullopt, std::nullopt};
  }
  // A broadcast view (sum()'s gradient expanded back to its input's shape): the kernel reads
  // its distinct elements (the stride-0 dims as size 1), and the graph expands them.
  bool broadcast = false;
  for (int d = 0; d < t.dim(); ++d) broadcast |= t.strides()[d] == 0 && t.shape()[d] > 1;
  if (broadcast) {
    auto impl = std::make_shared<TensorImpl>(*t.impl());
    impl->autograd.reset();
    for (int d = 0; d < t.dim(); ++d)
      if (impl->strides[d] == 0) impl->shape[d] = 1;
    std::optional<KernelInput> distinct = kernel_input(Tensor(std::move(impl)), compute, device);
    if (distinct) distinct->expand = t.shape();
    return distinct;
  }
  if (t.is_contiguous()) return KernelInput{t, std::nullopt, std::nullopt, std::nullopt};
  if (!t.is_non_overlapping_and_dense()) {
    // Bool inputs are converted from bytes whole, before the graph's ops (bool_bytes.cpp): a
    // bool block would be read to its end, past the storage's (review).
    if (t.dtype() == DType::Bool) return std::nullopt;
    std::optional<StridedRead> read = strided_read(t.shape(), t.strides());
    if (!read) return std::nullopt;
    auto impl = std::make_shared<TensorImpl>(*t.impl());
    impl->autograd.reset();
    impl->shape = read->block;
    impl->strides = contiguous_strides(read->block);
    return KernelInput{Tensor(std::move(impl)), std::nullopt, std::nullopt, read};
  }
  // The base's dims are t's dims by decreasing stride; t = base.permute(inverse order).
  const int r = t.dim();
  std::vector<int> order(r);
  for (int i = 0; i < r; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) {  // ties in dim order
    return t.strides()[a] != t.strides()[b] ? t.strides()[a] > t.strides()[b] : a < b;
  });
  auto impl = std::make_shared<TensorImpl>(*t.impl());
  impl->autograd.reset();
  Shape base_shape = t.shape();
  Dims perm = t.shape();  // resized below
  for (int j = 0; j < r; ++j) {
    base_shape[j] = t.shape()[order[j]];
    perm[order[j]] = j;
  }
  impl->shape = base_shape;
  impl->strides = contiguous_strides(base_shape);
  Tensor base(std::move(impl));
  if (!base.is_contiguous()) return std::nullopt;
  return KernelInput{base, perm, std::nullopt, std::nullopt};
}

/// Everything that selects a one-op kernel: op, attributes, and per input dtype, shape,
/// permutation and broadcast shape. Not a random op's seed and offset: no graph uses them (the
/// dropout mask's key is an operand), and a key per draw would cache one entry per call.
std::string kernel_key(const OpCall& c, const std::vector<KernelInput>& ins, Device device) {
  const OpAttrs& a = c.attrs;
  std::string key = fmt::format(
      "{} {} dims={} all={} keep={} desc={} dim={},{} slice={},{},{} alpha={} beta={} clamp={}{} "
      "eps={} p={} mode={} ignore={} dtype={} low={} high={}",
      c.name(), device.str(), to_string(a.dims), a.all_dims, a.keepdim, a.descending, a.dim,
      a.dim1, a.start,
      a.end, a.step, a.alpha.str(), a.beta.str(), a.has_low, a.has_high, a.eps, a.p, a.mode,
      a.ignore_index, name(a.dtype), a.low.str(), a.high.str());
  for (const KernelInput& in : ins) {
    key += fmt::format(" {}{}{}{}", name(in.tensor.dtype()), to_string(in.tensor.shape()),
                       in.permute ? "^" + to_string(*in.permute) : "",
                       in.expand ? "->" + to_string(*in.expand) : "");
    if (const auto& r = in.strided)
      key += fmt::format("[kept {}{} perm {} unsq {}]", to_string(r->kept),
                         r->extra_inner ? " inner" : "", to_string(r->permute),
                         fmt::join(r->unsqueeze, ","));
  }
  return key;
}

struct KernelCache {
  std::mutex mutex;
  // nullptr: the op has no GPU lowering for this key (runs on the host).
  std::unordered_map<std::string, std::shared_ptr<const Executable>> kernels;
};
KernelCache& cache() {
  static KernelCache* c = new KernelCache;  // never destroyed: kernels may run at exit
  return *c;
}

/// The compiled one-op kernel of `c` on `ins`, or nullptr when the op has no GPU lowering.
std::shared_ptr<const Executable> one_op_kernel(const OpCall& c,
                                                const std::vector<KernelInput>& ins,
                                                Device device) {
  std::string key = kernel_key(c, ins, device);
  KernelCache& kc = cache();
  {
    std::lock_guard lock(kc.mutex);
    if (auto it = kc.kernels.find(key); it != kc.kernels.end()) return it->second;
  }
  std::shared_ptr<const Executable> exe;
  try {
    ir::Graph g;
    std::vector<ir::Value> vals;
    for (const KernelInput& in : ins) {
      ir::Value v = g.input(in.tensor.dtype(), in.tensor.shape().vec());
      if (in.strided) v = apply_strided_read(g, v, *in.strided);
      if (in.permute) {
        OpAttrs p;
        p.dims = *in.permute;
        v = g.op(OpKind::Permute, {v}, p);
      }
      if (in.expand) {
        OpAttrs e;
        e.dims = *in.expand;
        v = g.op(OpKind::Expand, {v}, e);
      }
      vals.push_back(v);
    }
    // contiguous(): the permuted input itself, which the graph returns as a new tensor.
    g.output(c.op == OpKind::Contiguous ? vals.at(0) : g.op(c.op, vals, c.attrs));
    CompileOptions options;
    options.device = device;
    options.gpu = GpuTarget::from_env();
    exe = std::make_shared<const Executable>(g, options);
  } catch (const Error&) {
    exe = nullptr;  // not in the IR, or no lowering: the host path
  }
  std::lock_guard lock(kc.mutex);
  return kc.kernels.emplace(key, exe).first->second;
}

struct HostFallbacks {
  std::mutex mutex;
  std::map<std::string, uint64_t> calls;
};
HostFallbacks& host_fallbacks() {
  static HostFallbacks* f = new HostFallbacks;  // never destroyed: ops may run at exit
  return *f;
}

/// Ops a kernel runs itself: not recorded by autograd or a tracer (restored on exit).
struct KernelScope {
  NoGradGuard no_grad;
  DispatchHook* tracer = dispatch::set_tracer_hook(nullptr);
  KernelScope() = default;
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;
  ~KernelScope() { dispatch::set_tracer_hook(tracer); }
};

/// Runs `c` with its CPU kernel on host copies: each CUDA storage an operand uses is copied to
/// the host once, the op runs through the CPU dispatcher on views of those copies with the
/// same offsets and strides, and the results (and, for in-place ops, the written storage) go
/// back to the device.
void run_on_host(const OpCall& c, std::span<Tensor> outs, const char* why) {
  {
    HostFallbacks& f = host_fallbacks();
    std::lock_guard lock(f.mutex);
    ++f.calls[fmt::format("{} ({})", c.name(), why)];
  }
  std::unordered_map<const StorageImpl*, Storage> host;
  auto mirror = [&](const Tensor& t) -> Tensor {
    if (!t.defined() || t.device().is_cpu()) return t;
    Storage& h = host[t.storage().get()];
    if (!h) {
      h = std::make_shared<StorageImpl>(t.storage()->nbytes(), cpu::allocator());
      cuda::copy_to_host(h->data(), t.storage()->data(), h->nbytes(), t.device().index);
    }
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = h;
    impl->shape = t.shape();
    impl->strides = t.strides();
    impl->offset = t.offset();
    impl->dtype = t.dtype();
    impl->wrapped_number = t.impl()->wrapped_number;
    return Tensor(std::move(impl));
  };
  OpCall hc = c;
  hc.attrs.device = Device::cpu();  // ops without inputs (random ops) draw on the host
  for (Tensor& t : hc.inputs) t = mirror(t);
  std::vector<Tensor> results;
  {
    KernelScope scope;
    results = dispatch::call(std::move(hc));
  }
  if (op_info(c.op).category != OpCategory::View &&
      (c.op == OpKind::CopyInto || c.op == OpKind::Fill)) {
    const Tensor& dst = c.inputs[0];
    if (dst.device().is_cpu()) return;  // written in place on the host already
    const Storage& h = host.at(dst.storage().get());
    cuda::copy_to_device(dst.storage()->data(), h->data(), h->nbytes(), dst.device().index);
    return;
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    Tensor r = results[i].contiguous();
    cuda::copy_to_device(outs[i].raw_data(), r.raw_data(),
                         static_cast<size_t>(r.numel()) * itemsize(r.dtype()),
                         outs[i].device().index);
  }
}

/// copy_ of the same dtype and shape from another contiguous buffer into contiguous device
/// memory: one device-to-device copy. Returns false for the other cases.
bool contiguous_copy_on_device(const OpCall& c) {
  if (c.op != OpKind::CopyInto) return false;  // (random ops have no inputs)
  const Tensor& dst = c.inputs[0];
  if (!dst.device().is_cuda() || !dst.is_contiguous() || dst.numel() == 0) return false;
  const Tensor& src = c.inputs[1];
  if (src.device() != dst.device() || src.dtype() != dst.dtype() ||
      src.shape() != dst.shape() || !src.is_contiguous() || src.storage() == dst.storage())
    return false;
  cuda::copy_device_to_device(dst.raw_data(), dst.device().index, src.raw_data(),
                              dst.device().index,
                              static_cast<size_t>(dst.numel()) * itemsize(dst.dtype()), c.loc);
  return true;
}

/// fill_ and copy_ into device memory of any layout that cuda::pitched_view describes (a KV
/// cache's slot, a column, a block `x[:, :k]`, a contiguous tensor) as the driver's 2-D
/// memsets and copies of its rows, queued on kiln's stream: the host path copied the whole
/// storage to the host and back. copy_'s source is first made a contiguous device tensor of
/// the destination's dtype and shape (cast, broadcast) by eager ops, which run on the device,
/// and copied when it shares the destination's storage. Returns false for other cases (the
/// host path).
bool pitched_write_on_device(const OpCall& c, Device device) {
  if (c.op != OpKind::Fill && c.op != OpKind::CopyInto) return false;
  const Tensor& dst = c.inputs[0];
  if (!dst.device().is_cuda() || dst.device() != device) return false;
  if (dst.numel() == 0) return true;  // nothing to write
  std::optional<cuda::PitchedView> view = cuda::pitched_view(dst.shape(), dst.strides());
  if (!view || cuda::pitched_calls(*view).calls > cuda::kMaxPitchedCalls) return false;
  const size_t size = itemsize(dst.dtype());
  if (c.op == OpKind::Fill) {
    uint64_t bits = 0;
    KILN_DISPATCH_ALL(dst.dtype(), T, {
      T v = c.attrs.alpha.to<T>();
      std::memcpy(&bits, &v, sizeof(T));
    });
    return cuda::fill_pitched(dst.raw_data(), *view, bits, size, device.index, c.loc);
  }
  if (c.inputs[1].device() != device) return false;
  Tensor src = c.inputs[1];
  {
    KernelScope scope;
    if (src.dtype() != dst.dtype()) src = src.to(dst.dtype(), c.loc);
    if (src.shape() != dst.shape()) src = src.expand(dst.shape(), c.loc);
    if (!src.is_contiguous()) src = src.contiguous(c.loc);
  }
  if (src.storage() == dst.storage()) {  // a snapshot, as eager reads, queued on the stream
    Tensor copy = dispatch::empty(src.shape(), src.dtype(), device);
    cuda::check(cuda::driver("copy_", c.loc)
                    .cuMemcpyDtoDAsync(reinterpret_cast<cuda::CUdeviceptr>(copy.raw_data()),
                                       reinterpret_cast<cuda::CUdeviceptr>(src.raw_data()),
                                       static_cast<size_t>(src.numel()) * size,
                                       cuda::kiln_stream(device.index, c.loc)),
                "copy_", c.loc);
    src = copy;
  }
  return cuda::copy_into_pitched(dst.raw_data(), *view, src.raw_data(), size, device.index,
                                 c.loc);
}

/// contiguous() of a dense permuted view (attention's heads merged back, [B, H, T, D] ->
/// [B, T, H, D]) or of a broadcast one, and copy_ of one into a contiguous tensor of its dtype
/// and shape: one copy kernel instead of a round trip through the host. Returns false
/// otherwise.
bool permuted_copy_on_device(const OpCall& c, Device device, std::span<Tensor> outs) {
  const bool copy = c.op == OpKind::CopyInto;
  if (c.op != OpKind::Contiguous && !copy) return false;
  const Tensor& src = c.inputs[copy ? 1 : 0];
  const Tensor& dst = copy ? c.inputs[0] : outs[0];
  if (src.device() != device || dst.device() != device || src.dtype() != dst.dtype() ||
      !(src.shape() == dst.shape()) || !dst.is_contiguous() || src.is_contiguous() ||
      src.numel() == 0 || src.storage() == dst.storage())
    return false;
  std::optional<KernelInput> in = kernel_input(src, src.dtype(), device);
  if (!in || (!in->permute && !in->expand && !in->strided)) return false;
  auto exe = one_op_kernel(OpCall{OpKind::Contiguous, {src}, {}, c.loc}, {*in}, device);
  if (!exe) return false;
  exe->run_into({in->tensor}, {dst});
  return true;
}

/// A Philox key (seed, offset) as an int64 [2] tensor on `device`, written by four 32-bit
/// memsets on kiln's stream: no host buffer and no synchronisation, unlike a copy.
Tensor device_key(uint64_t seed, uint64_t offset, Device device, Loc loc) {
  Tensor key = dispatch::empty({2}, DType::Int64, device);
  const uint32_t words[4] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                             static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)};
  cuda::set_current_device(device.index, loc);
  const cuda::DriverApi& api = cuda::driver("dropout", loc);
  const auto base = reinterpret_cast<cuda::CUdeviceptr>(key.raw_data());
  for (int i = 0; i < 4; ++i)
    cuda::check(api.cuMemsetD32Async(base + 4 * i, words[i], 1,
                                     cuda::kiln_stream(device.index, loc)),
                "dropout", loc);
  return key;
}

/// rand, randn, randint, dropout_mask, and dropout(x) as x times the mask of x's dtype (eager's
/// x * (keep ? scale : 0): NaN and inf stay NaN), drawn by generated kernels on the device
/// (eager's numbers: codegen/lower_random.cpp). The kernel reads the key from its operand, so
/// it is compiled once per (shape, dtype, p or range), not per draw. Returns false when a
/// kernel is not available or eager's kernel would raise (the host path).
bool random_on_device(const OpCall& c, Device device, Tensor& out) {
  if (c.op == OpKind::RandInt && c.attrs.dtype == DType::Int32 &&
      !philox::randint_fits_int32(c.attrs.low.to<int64_t>(), c.attrs.high.to<int64_t>()))
    return false;  // the CPU kernel raises: the range does not fit int32
  std::optional<KernelInput> x;
  if (c.op == OpKind::Dropout) {
    if (c.inputs[0].device() != device) return false;
    x = kernel_input(c.inputs[0], c.inputs[0].dtype(), device);
    if (!x) return false;
  }
  OpCall mask_call = c;  // the draw: the mask for dropout
  if (c.op == OpKind::Dropout) mask_call.op = OpKind::DropoutMask;
  mask_call.inputs.clear();
  if (c.op == OpKind::Dropout) {
    mask_call.attrs.dims = c.inputs[0].shape();
    mask_call.attrs.dtype = c.inputs[0].dtype();
  }
  std::vector<KernelInput> key = {
      {device_key(c.attrs.seed, c.attrs.offset, device, c.loc), std::nullopt, std::nullopt,
       std::nullopt}};
  auto mask_kernel = one_op_kernel(mask_call, key, device);
  if (!mask_kernel) return false;
  if (c.op != OpKind::Dropout) {
    mask_kernel->run_into({key[0].tensor}, {out});
    return true;
  }
  Tensor mask = dispatch::empty(c.inputs[0].shape(), c.inputs[0].dtype(), device);
  OpCall mul{OpKind::Mul, {}, {}, c.loc};
  std::vector<KernelInput> ins = {*x, {mask, std::nullopt, std::nullopt, std::nullopt}};
  auto mul_kernel = one_op_kernel(mul, ins, device);
  if (!mul_kernel) return false;
  mask_kernel->run_into({key[0].tensor}, {mask});
  mul_kernel->run_into({x->tensor, mask}, {out});
  return true;
}

/// Whether eager's CPU kernel would reject the values of `c`'s inputs (eager/value_checks.h:
/// indices out of range, an integer division by zero, ...), which generated kernels compute
/// through. Copies the checked inputs (indices, divisors: small next to what the op reads) to
/// the host.
bool eager_rejects(const OpCall& c, const InferredMeta& meta) {
  std::vector<int> checked = value_checked_inputs(c.op, c.attrs, meta.compute_dtype);
  if (checked.empty()) return false;
  std::vector<Shape> shapes;
  for (const Tensor& t : c.inputs) shapes.push_back(t.defined() ? t.shape() : Shape{});
  std::vector<std::vector<int64_t>> values;
  for (int k : checked) {
    Tensor host;
    {
      KernelScope scope;
      host = c.inputs[k].cpu().to(DType::Int64).contiguous();
    }
    const int64_t* d = host.data<int64_t>();
    values.emplace_back(d, d + host.numel());
  }
  return eager_rejects_values(c.op, c.attrs, shapes, values);
}

/// The dispatcher's kernel for CUDA tensors (eager/dispatch.h, set_device_kernel).
void cuda_kernel(const OpCall& c, const InferredMeta& meta, std::span<Tensor> outs) {
  Device device = c.attrs.device;
  for (const Tensor& t : c.inputs)
    if (t.defined() && t.device().is_cuda()) device = t.device();
  if (contiguous_copy_on_device(c)) return;
  if (permuted_copy_on_device(c, device, outs)) return;
  if (pitched_write_on_device(c, device)) return;
  if (op_info(c.op).category == OpCategory::Random && outs.size() == 1 &&
      random_on_device(c, device, outs[0]))
    return;
  // Other in-place ops and strided copies (whose one-op graph would see a contiguous input)
  // take the host path, as do ops with several results or absent optional inputs.
  if (c.op == OpKind::CopyInto || c.op == OpKind::Fill || c.op == OpKind::Contiguous)
    return run_on_host(c, outs, "this layout");
  if (meta.outputs.size() != 1) return run_on_host(c, outs, "several results");
  // The CPU kernel raises eager's error for values the generated one computes through.
  if (eager_rejects(c, meta)) return run_on_host(c, outs, "rejected input values");
  std::vector<KernelInput> ins;
  for (const Tensor& t : c.inputs) {
    std::optional<KernelInput> in;
    if (t.defined()) in = kernel_input(t, meta.compute_dtype, device);
    if (!in) return run_on_host(c, outs, t.defined() ? "a strided input" : "an absent input");
    ins.push_back(std::move(*in));
  }
  auto exe = one_op_kernel(c, ins, device);
  if (!exe) return run_on_host(c, outs, "no GPU lowering");
  std::vector<Tensor> tensors;
  for (const KernelInput& in : ins) tensors.push_back(in.tensor);
  exe->run_into(tensors, std::vector<Tensor>(outs.begin(), outs.end()));
}

/// Installed when this file is linked (kiln_tracer links it whole; CMakeLists.txt).
const bool g_registered = [] {
  dispatch::set_device_kernel(DeviceType::CUDA, &cuda_kernel);
  return true;
}();

}  // namespace

std::vector<std::pair<std::string, uint64_t>> cuda_host_fallbacks() {
  HostFallbacks& f = host_fallbacks();
  std::lock_guard lock(f.mutex);
  return {f.calls.begin(), f.calls.end()};
}

}  // namespace kiln::codegen
