// Tests on a real device; each one WARNs "skipped: no CUDA device (...)" when none is usable.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "backends/cuda/allocator.h"
#include "backends/cuda/blas.h"
#include "backends/cuda/copy.h"
#include "cuda_test_util.h"
#include "eager/dispatch.h"
#include "kiln/kiln.h"

using namespace kiln;

TEST_CASE("gpu: device properties are sensible") {
  KILN_REQUIRE_CUDA_OR_SKIP();
  REQUIRE(cuda::device_count() >= 1);
  cuda::DeviceProps p = cuda::device_props(0);
  CHECK_FALSE(p.name.empty());
  CHECK(p.sm_major >= 3);
  CHECK(p.multiprocessor_count > 0);
  CHECK(p.max_threads_per_block >= 256);
  CHECK(p.warp_size == 32);
  CHECK(p.total_memory > (size_t{1} << 28));
  CHECK_THROWS_WITH(cuda::device_props(cuda::device_count()), Catch::Contains("does not exist"));
}

TEST_CASE("gpu: to(cuda) and back keeps values, dtype and shape") {
  KILN_REQUIRE_CUDA_OR_SKIP();
  Tensor x = arange(12, {Float32}).view({3, 4}) * 0.5;
  Tensor d = x.cuda();
  CHECK(d.device() == Device::cuda(0));
  CHECK(d.shape() == Shape{3, 4});
  CHECK(d.dtype() == DType::Float32);
  CHECK(d.cuda().is_same(d));
  Tensor back = d.cpu();
  CHECK(back.device() == Device::cpu());
  CHECK(back.to_vector<float>() == x.to_vector<float>());
  // A non-contiguous cpu tensor goes over in logical order.
  Tensor t = x.t().to(Device::cuda());
  CHECK(t.shape() == Shape{4, 3});
  CHECK(t.is_contiguous());
  CHECK(t.cpu().to_vector<float>() == x.t().contiguous().to_vector<float>());
  // Integer and double tensors too.
  Tensor i = arange(5, {Int64}).cuda().cpu();
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
  Tensor e = empty({0}, TensorOptions{}).cuda();
  CHECK(e.numel() == 0);
  CHECK(e.cpu().numel() == 0);
}

TEST_CASE("gpu: the gradient of a transfer is the transfer back") {
  KILN_REQUIRE_CUDA_OR_SKIP();
  Tensor x = tensor({1.0f, 2.0f, 3.0f}).requires_grad_();
  Tensor y = x.cuda().cpu();  // both transfers recorded
  CHECK(y.grad_fn_name() == "ToDeviceBackward");
  (y * tensor({2.0f, 3.0f, 4.0f})).sum().backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().device() == Device::cpu());
  CHECK(x.grad().to_vector<float>() == std::vector<float>{2, 3, 4});
}

TEST_CASE("gpu: raw copies and memset round-trip") {
  KILN_REQUIRE_CUDA_OR_SKIP();
  std::vector<float> host = {1, 2, 3, 4, 5};
  Allocator* a = cuda::allocator(0);
  CHECK(a->device() == Device::cuda(0));
  void* d1 = a->allocate(host.size() * sizeof(float));
  void* d2 = a->allocate(host.size() * sizeof(float));
  cuda::copy_to_device(d1, host.data(), host.size() * sizeof(float));
  cuda::copy_device_to_device(d2, 0, d1, 0, host.size() * sizeof(float));
  std::vector<float> out(host.size());
  cuda::copy_to_host(out.data(), d2, out.size() * sizeof(float));
  CHECK(out == host);
  cuda::memset_device(d2, 0, out.size() * sizeof(float));
  cuda::copy_to_host(out.data(), d2, out.size() * sizeof(float));
  CHECK(out == std::vector<float>(5, 0.0f));
  a->deallocate(d1, 0);
  a->deallocate(d2, 0);
}

TEST_CASE("gpu: the real allocator caches and reuses blocks") {
  KILN_REQUIRE_CUDA_OR_SKIP();
  cuda::CachingAllocator& cache = cuda::caching_allocator(0);
  cache.empty_cache();
  cuda::AllocatorStats before = cache.stats();
  void* p = nullptr;
  {
    Tensor t = dispatch::empty({1000}, Float32, Device::cuda());
    p = t.raw_data();
    CHECK(reinterpret_cast<uintptr_t>(p) % kAlignment == 0);
    CHECK(cache.stats().allocated_bytes == before.allocated_bytes + 4096);
  }
  CHECK(cache.stats().cached_bytes >= 4096);
  Tensor again = dispatch::empty({1024}, Float32, Device::cuda());  // same rounded size
  CHECK(again.raw_data() == p);
  CHECK(cache.stats().cache_hits == before.cache_hits + 1);
  CHECK_THROWS_WITH(dispatch::empty({int64_t{1} << 40}, Float32, Device::cuda()),
                    Catch::Contains("out of memory: tried to allocate"));
}

TEST_CASE("gpu: cuBLAS gemm_strided_batched matches a cpu reference (row-major)") {
  KILN_REQUIRE_CUDA_OR_SKIP();
  if (!cuda::blas_available()) {
    WARN("skipped: " << cuda::blas_unavailable_reason());
    return;
  }
  const int64_t batch = 2, m = 3, n = 4, k = 5;
  for (bool trans_a : {false, true})
    for (bool trans_b : {false, true}) {
      // A stored m x k (or k x m when transposed), B stored k x n (or n x k).
      Tensor a = randn({batch, trans_a ? k : m, trans_a ? m : k}, {Float64});
      Tensor b = randn({batch, trans_b ? n : k, trans_b ? k : n}, {Float64});
      Tensor c0 = randn({batch, m, n}, {Float64});
      Tensor opa = trans_a ? a.transpose(1, 2) : a, opb = trans_b ? b.transpose(1, 2) : b;
      Tensor expected = matmul(opa, opb) * 1.5 + c0 * 0.5;
      for (DType dt : {DType::Float64, DType::Float32}) {
        Tensor da = a.to(dt).cuda(), db = b.to(dt).cuda(), dc = c0.to(dt).cuda();
        cuda::gemm_strided_batched(dt, trans_a, trans_b, m, n, k, 1.5, da.raw_data(),
                                   a.size(2), a.size(1) * a.size(2), db.raw_data(), b.size(2),
                                   b.size(1) * b.size(2), 0.5, dc.raw_data(), n, m * n, batch);
        std::vector<double> got = dc.cpu().to_vector<double>();
        std::vector<double> want = expected.to_vector<double>();
        REQUIRE(got.size() == want.size());
        double tol = dt == DType::Float64 ? 1e-12 : 1e-4;
        for (size_t i = 0; i < got.size(); ++i)
          CHECK(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
      }
    }
}

TEST_CASE("gpu: float32 matmul follows the matmul precision (TF32, bfloat16 inputs)") {
  KILN_REQUIRE_CUDA_OR_SKIP();
  if (!cuda::blas_available()) {
    WARN("skipped: " << cuda::blas_unavailable_reason());
    return;
  }
  const MatmulPrecision saved = float32_matmul_precision();
  manual_seed(3);
  const Tensor a = randn({512, 512}, {Float64}), b = randn({512, 512}, {Float64});
  const Tensor exact = matmul(a, b);
  const double scale = matmul(a.abs(), b.abs()).max().item<double>();
  const Tensor da = a.to(DType::Float32).cuda(), db = b.to(DType::Float32).cuda();
  auto err = [&](const Tensor& t) {
    return (t.cpu().to(DType::Float64) - exact).abs().max().item<double>() / scale;
  };
  struct Expect {
    const char* precision;
    double low, high;  // bounds on the largest error, relative to sum |a·b|
  };
  // float32: about 2^-24 per product; TF32 inputs 2^-11; bfloat16 inputs 2^-8 (cuBLAS may
  // take TF32 for FAST_16BF). Before Ampere there are no such tensor cores: float32 throughout.
  const bool tensor_cores = cuda::device_props(0).sm_major >= 8;
  const double low = tensor_cores ? 1e-5 : 0;
  for (Expect e : {Expect{"highest", 0, 1e-5}, Expect{"high", low, 5e-3},
                   Expect{"medium", low, 3e-2}}) {
    CAPTURE(e.precision);
    set_float32_matmul_precision(e.precision);
    const Tensor eager = matmul(da, db);
    CHECK(err(eager) >= e.low);
    CHECK(err(eager) < e.high);
  }
  set_float32_matmul_precision(saved);
}

TEST_CASE("gpu: a PTX kernel loads and runs through load_module and launch") {
  KILN_REQUIRE_CUDA_OR_SKIP();
  // out[i] = 2 * in[i] for i < n, one thread per element.
  const char* ptx = R"(
.version 7.0
.target sm_50
.address_size 64
.visible .entry twice(.param .u64 in, .param .u64 out, .param .u32 n) {
  .reg .pred %p;
  .reg .b32 %r<6>;
  .reg .f32 %f<3>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [in];
  ld.param.u64 %rd2, [out];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %p, %r5, %r1;
  @%p bra DONE;
  cvta.to.global.u64 %rd3, %rd1;
  cvta.to.global.u64 %rd4, %rd2;
  mul.wide.u32 %rd5, %r5, 4;
  add.s64 %rd6, %rd3, %rd5;
  add.s64 %rd7, %rd4, %rd5;
  ld.global.f32 %f1, [%rd6];
  add.f32 %f2, %f1, %f1;
  st.global.f32 [%rd7], %f2;
DONE:
  ret;
}
)";
  cuda::Module module = cuda::load_module(ptx);
  cuda::Function fn = module.function("twice");
  CHECK_THROWS_WITH(module.function("absent"), Catch::Contains("absent"));
  Tensor in = arange(1000, {Float32}).cuda();
  Tensor out = dispatch::empty({1000}, Float32, Device::cuda());
  uint64_t in_ptr = reinterpret_cast<uint64_t>(in.raw_data());
  uint64_t out_ptr = reinterpret_cast<uint64_t>(out.raw_data());
  uint32_t n = 1000;
  void* args[] = {&in_ptr, &out_ptr, &n};
  cuda::launch(fn, cuda::launch_config(n, cuda::device_props(0)), args);
  std::vector<float> got = out.cpu().to_vector<float>();
  for (int i = 0; i < 1000; ++i) CHECK(got[i] == 2.0f * i);
}

TEST_CASE("gpu: factories on the device hold the values they hold on the cpu") {
  KILN_REQUIRE_CUDA_OR_SKIP();
  TensorOptions on_cuda;
  on_cuda.device = Device::cuda();
  Tensor z = zeros({2, 3}, on_cuda);
  CHECK(z.device() == Device::cuda(0));
  CHECK(z.cpu().to_vector<float>() == std::vector<float>(6, 0.0f));
  CHECK(arange(5, on_cuda).cpu().to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(ones_like(z).device() == Device::cuda(0));
  CHECK(ones_like(z).cpu().to_vector<float>() == std::vector<float>(6, 1.0f));
  manual_seed(7);
  Tensor r_cpu = randn({16});
  manual_seed(7);
  Tensor r_cuda = randn({16}, on_cuda);
  CHECK(r_cuda.device() == Device::cuda(0));
  CHECK(r_cuda.cpu().to_vector<float>() == r_cpu.to_vector<float>());
}
