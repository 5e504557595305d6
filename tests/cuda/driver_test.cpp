// The driver loader without a GPU: a missing library, the toolkit's stub, and the errors every
// CUDA operation then raises.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <functional>

#include "backends/cuda/allocator.h"
#include "backends/cuda/blas.h"
#include "backends/cuda/copy.h"
#include "backends/cuda/mlir_runtime.h"
#include "cuda_test_util.h"
#include "error_of.h"
#include "eager/dispatch.h"
#include "kiln/kiln.h"

using namespace kiln;
using test::ScopedDriver;

namespace {
const char* const kMissing = "/nonexistent/libcuda.so.1";
const char* const kStub = "/usr/local/cuda/lib64/stubs/libcuda.so";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "<no error>";
}
}  // namespace

TEST_CASE("without a driver library CUDA is unavailable and says which file is missing") {
  ScopedDriver d(kMissing);
  CHECK_FALSE(d.status.available);
  CHECK(d.status.device_count == 0);
  CHECK(d.status.reason.find(kMissing) != std::string::npos);
  CHECK(d.status.reason.find("No such file") != std::string::npos);
  CHECK_FALSE(cuda::is_available());
  CHECK(cuda::device_count() == 0);
  CHECK(cuda::unavailable_reason() == d.status.reason);
}

TEST_CASE("every CUDA operation without a driver throws 'no CUDA device: <reason>'") {
  ScopedDriver d(kMissing);
  std::string expected = "no CUDA device: " + d.status.reason;
  CHECK(error_message([] { dispatch::empty({2}, Float32, Device::cuda()); }) == expected);
  CHECK(error_message([] { empty({2, 3}, TensorOptions{}).to(Device::cuda()); }) == expected);
  CHECK(error_message([] { tensor({1.0f, 2.0f}).cuda(); }) == expected);
  CHECK(error_message([] { cuda::allocator(0); }) == expected);
  CHECK(error_message([] { cuda::device_props(0); }) == expected);
  CHECK(error_message([] { cuda::synchronize(); }) == expected);
  CHECK(error_message([] { cuda::load_module(".version 8.0"); }) == expected);
  CHECK(error_message([] { cuda::kiln_stream(0); }) == expected);
  float host[2] = {1, 2};
  CHECK(error_message([&] { cuda::copy_to_host(host, host, sizeof(host)); }) == expected);
  CHECK(error_message([&] {
          cuda::gemm_strided_batched(DType::Float32, false, false, 1, 1, 1, 1.0, host, 1, 1,
                                     host, 1, 1, 0.0, host, 1, 1, 1);
        }) == expected);
  CHECK_FALSE(cuda::blas_available());
  CHECK(starts_with(cuda::blas_unavailable_reason(), "no CUDA device: "));
  // Zero-byte copies need no device and do nothing.
  CHECK_NOTHROW(cuda::copy_to_device(host, host, 0));
  // to() to the tensor's own device is the tensor itself, with or without CUDA.
  Tensor x = tensor({1.0f, 2.0f});
  CHECK(x.to(Device::cpu()).is_same(x));
  CHECK(x.cpu().is_same(x));
}

TEST_CASE("the error of a failed CUDA call names the op and the user's line") {
  ScopedDriver d(kMissing);
  int line = __LINE__ + 2;
  try {
    tensor({1.0f}).cuda();
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.op() == "to");  // the first CUDA call of a transfer allocates its output
    CHECK(static_cast<int>(e.where().line()) == line);
    CHECK(std::string(e.where().file_name()).find("driver_test.cpp") != std::string::npos);
  }
}

TEST_CASE("factories that build on the cpu and move to the device name themselves") {
  // Review: arange, linspace, tensor() and full on cuda raised under `to`'s name.
  ScopedDriver d(kMissing);
  const TensorOptions on_gpu{Float32, Device::cuda()};
  auto op_of = [](const std::function<void()>& f) { return testing::error_of(f).op(); };
  CHECK(op_of([&] { arange(5, on_gpu); }) == "arange");
  CHECK(op_of([&] { linspace(0, 1, 3, on_gpu); }) == "linspace");
  CHECK(op_of([&] { tensor({1.0f, 2.0f}, on_gpu); }) == "tensor");
  CHECK(op_of([&] { tensor({{1, 2}, {3, 4}}, on_gpu); }) == "tensor");
  CHECK(op_of([&] { full({2}, 3.0, on_gpu); }) == "full");
  CHECK(op_of([&] { eye(2, -1, on_gpu); }) == "eye");
  CHECK(starts_with(testing::error_of([&] { arange(5, on_gpu); }).message(), "no CUDA device"));
}

TEST_CASE("the toolkit's stub driver loads but cuInit reports CUDA_ERROR_STUB_LIBRARY") {
  if (access(kStub, R_OK) != 0) {
    WARN("skipped: " << kStub << " is absent (no CUDA toolkit on this machine)");
    return;
  }
  ScopedDriver d(kStub);
  CHECK_FALSE(d.status.available);
  INFO(d.status.reason);
  CHECK(starts_with(d.status.reason, "cuInit failed: "));
  CHECK(d.status.reason.find("CUDA_ERROR_STUB_LIBRARY") != std::string::npos);
  CHECK(d.status.reason.find("(34)") != std::string::npos);
  CHECK(error_message([] { dispatch::empty({4}, Float64, Device::cuda()); }) ==
        "no CUDA device: " + d.status.reason);
}

TEST_CASE("error_text names well-known driver codes without a driver") {
  ScopedDriver d(kMissing);
  std::string stub = cuda::error_text(34);
  CHECK(stub.find("CUDA_ERROR_STUB_LIBRARY (34)") == 0);
  CHECK_THROWS_WITH(cuda::check(2, "cuMemAlloc"), Catch::Contains("(2)"));
  CHECK_NOTHROW(cuda::check(0, "cuMemAlloc"));
}

TEST_CASE("the MLIR runtime functions record errors instead of throwing through JIT frames") {
  ScopedDriver d(kMissing);
  CHECK_FALSE(cuda::take_runtime_error().has_value());
  auto symbols = cuda::mlir_runtime_symbols();
  CHECK(symbols.size() == 19);
  void* load = nullptr;
  void* alloc = nullptr;
  for (auto& [name, address] : symbols) {
    CHECK(address != nullptr);
    if (std::string(name) == "mgpuModuleLoad") load = address;
    if (std::string(name) == "mgpuMemAlloc") alloc = address;
  }
  REQUIRE(load != nullptr);
  REQUIRE(alloc != nullptr);
  // The exact types of the C functions (UBSan's -fsanitize=function checks indirect calls).
  using LoadFn = cuda::CUmodule (*)(void*, size_t);
  using AllocFn = void* (*)(uint64_t, cuda::CUstream, bool);
  char ptx[] = ".version 8.0";
  CHECK(reinterpret_cast<LoadFn>(load)(ptx, sizeof(ptx)) == nullptr);
  CHECK(reinterpret_cast<AllocFn>(alloc)(64, nullptr, false) == nullptr);  // not recorded: 2nd
  std::optional<Error> e = cuda::take_runtime_error();
  REQUIRE(e.has_value());
  CHECK(starts_with(e->message(), "no CUDA device: "));
  CHECK_FALSE(cuda::take_runtime_error().has_value());  // taking clears it
}
