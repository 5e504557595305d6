// CUDA end to end (issue 7): eager ops on the device against the CPU, compiled against eager,
// autograd and an optimizer step. Tag [cuda]. The device tests WARN "skipped: no CUDA device"
// and return on machines without a GPU (benchmarks/gpu/run_device_check.sh runs them on one);
// the tests of what happens without a device run everywhere.
#include <catch2/catch.hpp>
#include <cmath>

#include "backends/cuda/driver.h"
#include "codegen/codegen.h"
#include "eager/dispatch.h"
#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "nn/optim.h"

using namespace kiln;

namespace {

#define REQUIRE_CUDA_OR_SKIP()                                                          \
  do {                                                                                  \
    if (!cuda::is_available()) {                                                        \
      WARN("skipped: no CUDA device (" << cuda::unavailable_reason() << ")");           \
      return;                                                                           \
    }                                                                                   \
  } while (0)

/// Largest |a - b| / (1 + |b|) over the elements (a on any device, b on the cpu).
double rel_diff(const Tensor& a, const Tensor& b) {
  Tensor ac = a.cpu().to(DType::Float64).contiguous(), bc = b.to(DType::Float64).contiguous();
  REQUIRE(ac.shape() == bc.shape());
  double m = 0;
  const double* pa = ac.data<double>();
  const double* pb = bc.data<double>();
  for (int64_t i = 0; i < ac.numel(); ++i) {
    if (std::isnan(pa[i]) != std::isnan(pb[i])) return INFINITY;
    if (!std::isnan(pa[i])) m = std::max(m, std::abs(pa[i] - pb[i]) / (1 + std::abs(pb[i])));
  }
  return m;
}

}  // namespace

TEST_CASE("cuda: without a device, moving a module leaves it on the cpu", "[cuda]") {
  if (cuda::is_available()) return;  // the device case is below
  nn::Linear lin(4, 3);
  Tensor w = lin.parameters()[0];
  std::vector<float> before = w.to_vector<float>();
  CHECK_THROWS_WITH(lin.to(Device::cuda()), Catch::Contains("no CUDA device"));
  CHECK(w.device() == Device::cpu());
  CHECK(w.to_vector<float>() == before);
  CHECK_THROWS_WITH(randn({2, 2}, Device::cuda()), Catch::Contains("no CUDA device"));
}

TEST_CASE("cuda: eager ops on the device equal the cpu's", "[cuda]") {
  REQUIRE_CUDA_OR_SKIP();
  Tensor x = randn({64, 33}), y = randn({64, 33}), w = randn({33, 17});
  Tensor xd = x.cuda(), yd = y.cuda(), wd = w.cuda();
  CHECK(rel_diff(add(mul(xd, xd), xd), add(mul(x, x), x)) == 0);
  CHECK(rel_diff(add(xd, 2.5), add(x, 2.5)) == 0);  // a host scalar with a device tensor
  CHECK(rel_diff(exp(xd), exp(x)) < 1e-6);
  CHECK(rel_diff(tanh(xd), tanh(x)) < 1e-6);
  CHECK(rel_diff(gelu(xd), gelu(x)) < 1e-6);
  // div.full inside (2 ulp): sigmoid, silu, tanh-gelu; NaN and inf pass through; silu(-88) and
  // gelu(-10.03, tanh), ~1e-36, divide by more than 2^126 (div.approx would give 0)
  Tensor wide = x * 30.0;
  Tensor wide_d = wide.cuda();
  CHECK(rel_diff(sigmoid(wide_d), sigmoid(wide)) < 1e-6);
  CHECK(rel_diff(silu(wide_d), silu(wide)) < 1e-6);
  CHECK(rel_diff(gelu(wide_d, "tanh"), gelu(wide, "tanh")) < 1e-6);
  Tensor special = tensor({NAN, INFINITY, -INFINITY, -100.0f, 100.0f, 0.0f, -88.0f, -10.03f});
  for (auto op : {+[](const Tensor& t) { return sigmoid(t); },
                  +[](const Tensor& t) { return silu(t); },
                  +[](const Tensor& t) { return gelu(t, "tanh"); },
                  +[](const Tensor& t) { return tanh(t); }}) {
    std::vector<float> got = op(special.cuda()).cpu().to_vector<float>();
    std::vector<float> want = op(special).to_vector<float>();
    for (size_t i = 0; i < want.size(); ++i) {
      INFO("element " << i << ": device " << got[i] << ", cpu " << want[i]);
      CHECK((std::isnan(got[i]) ? std::isnan(want[i])
                                : got[i] == want[i] ||
                                      std::abs(got[i] - want[i]) <= 1e-6f * std::abs(want[i])));
    }
  }
  CHECK(rel_diff(softmax(xd, -1), softmax(x, -1)) < 1e-6);
  CHECK(rel_diff(layer_norm(xd, {33}), layer_norm(x, {33})) < 1e-5);
  CHECK(rel_diff(sum(xd), sum(x)) < 1e-6);
  CHECK(rel_diff(matmul(xd, wd), matmul(x, w)) < 1e-5);
  CHECK(rel_diff(where(gt(xd, yd), xd, yd), where(gt(x, y), x, y)) == 0);
  CHECK(rel_diff(xd.t().contiguous(), x.t().contiguous()) == 0);            // a strided copy
  CHECK(rel_diff(cat({xd, yd}, 0), cat({x, y}, 0)) == 0);                   // host path
  Tensor idx = from_vector<int64_t>({3, 0, 7}, {3});
  CHECK(rel_diff(index_select(xd, 0, idx.cuda()), index_select(x, 0, idx)) == 0);
  Tensor z = zeros({5}, Device::cuda());
  z.fill_(1.5);
  CHECK(z.cpu().to_vector<float>() == std::vector<float>(5, 1.5f));
}

TEST_CASE("cuda: row reductions over a warp's lanes equal the cpu's", "[cuda]") {
  // Rows of 64 or more elements get 32 lanes each (codegen/gpu_row_lanes.cpp); 37 rows leave
  // the last block of 256 threads part full, and 300 and 4,097 columns part of the last pass.
  REQUIRE_CUDA_OR_SKIP();
  for (int64_t cols : {64, 300, 4097}) {
    INFO(cols << " columns");
    Tensor x = randn({37, cols}) * 3.0;
    Tensor xd = x.cuda();
    CHECK(rel_diff(softmax(xd, -1), softmax(x, -1)) < 1e-6);
    CHECK(rel_diff(log_softmax(xd, -1), log_softmax(x, -1)) < 1e-5);
    CHECK(rel_diff(layer_norm(xd, {cols}), layer_norm(x, {cols})) < 1e-5);
    CHECK(rel_diff(sum(xd, {-1}), sum(x, {-1})) < 1e-6);
    CHECK(rel_diff(amax(xd, {-1}), amax(x, {-1})) == 0);
    CHECK(rel_diff(amin(xd - 100.0, {-1}), amin(x - 100.0, {-1})) == 0);
    Tensor xi = randint(-1000, 1000, {37, cols});
    CHECK(rel_diff(sum(xi.cuda(), {-1}), sum(xi, {-1})) == 0);
  }
  Tensor nan_row = ones({3, 100});
  nan_row.select(0, 1).select(0, 77).fill_(NAN);
  std::vector<float> y = softmax(nan_row.cuda(), -1).cpu().to_vector<float>();
  CHECK(y[0] == Approx(0.01));
  CHECK(std::isnan(y[100]));
  CHECK(y[299] == Approx(0.01));
  // After a GEMM, the reductions load their initial values (a warp sync before the stores).
  auto f = [](const Tensor& a, const Tensor& b) { return softmax(matmul(a, b), -1); };
  auto cf = compile(f);
  Tensor a = randn({77, 16}), b = randn({16, 500});
  CHECK(rel_diff(cf(a.cuda(), b.cuda()), f(a, b)) < 1e-5);
}

TEST_CASE("cuda: compiled functions on the device equal eager", "[cuda]") {
  REQUIRE_CUDA_OR_SKIP();
  auto f = [](const Tensor& x, const Tensor& w) {
    return softmax(gelu(add(matmul(x, w), 1.0)), -1);
  };
  auto cf = compile(f);
  Tensor x = randn({128, 64}).cuda(), w = randn({64, 32}).cuda();
  Tensor expect = f(x, w);
  Tensor got = cf(x, w);
  CHECK(got.device() == Device::cuda());
  CHECK(rel_diff(got, expect.cpu()) < 1e-5);
  CHECK(rel_diff(cf(x, w), expect.cpu()) < 1e-5);  // replay
  CHECK(cf.explain().find("cuda") != std::string::npos);
}

TEST_CASE("cuda: autograd and an AdamW step on the device match the cpu", "[cuda]") {
  REQUIRE_CUDA_OR_SKIP();
  manual_seed(3);
  nn::Linear cpu_lin(8, 4), gpu_lin(8, 4);
  gpu_lin.load_state_dict(cpu_lin.state_dict());
  gpu_lin.to(Device::cuda());
  nn::AdamW cpu_opt(cpu_lin.parameters()), gpu_opt(gpu_lin.parameters());
  Tensor x = randn({16, 8});
  for (int step = 0; step < 3; ++step) {
    for (auto [lin, opt, in] : {std::tuple<nn::Linear*, nn::AdamW*, Tensor>{&cpu_lin, &cpu_opt, x},
                                {&gpu_lin, &gpu_opt, x.cuda()}}) {
      opt->zero_grad();
      Tensor loss = mul(lin->forward(in), lin->forward(in)).sum();
      loss.backward();
      opt->step();
    }
  }
  for (size_t i = 0; i < cpu_lin.parameters().size(); ++i)
    CHECK(rel_diff(gpu_lin.parameters()[i], cpu_lin.parameters()[i]) < 1e-5);
}

TEST_CASE("cuda: dropout draws the cpu's mask on the device; permuted copies stay there",
          "[cuda]") {
  REQUIRE_CUDA_OR_SKIP();
  const auto host_before = codegen::cuda_host_fallbacks();
  // Dropout and its mask: a generated Philox kernel with the key as its operand.
  Tensor x = randn({64, 33});
  for (double p : {0.1, 0.5}) {
    GeneratorState s = generator_state();
    Tensor on_cpu = dropout(x, p);
    set_generator_state(s);
    Tensor on_gpu = dropout(x.cuda(), p);
    CHECK(on_gpu.device().is_cuda());
    CHECK(rel_diff(on_gpu, on_cpu) == 0);
    OpAttrs a;
    a.dims = {5, 7, 3};
    a.dtype = DType::Bool;
    a.p = p;
    a.seed = 9;
    a.offset = 123;
    Tensor mask_cpu = dispatch::call1({OpKind::DropoutMask, {}, a, Loc::current()});
    a.device = Device::cuda();
    Tensor mask_gpu = dispatch::call1({OpKind::DropoutMask, {}, a, Loc::current()});
    CHECK(mask_gpu.device().is_cuda());
    CHECK(mask_gpu.cpu().to_vector<bool>() == mask_cpu.to_vector<bool>());
  }
  // The gradient of dropout on the device: the same mask times the scale.
  Tensor xg = x.cuda().detach().requires_grad_();
  GeneratorState s = generator_state();
  dropout(xg, 0.25).sum().backward();
  set_generator_state(s);
  Tensor xc = x.detach().requires_grad_();
  dropout(xc, 0.25).sum().backward();
  CHECK(rel_diff(xg.grad(), xc.grad()) == 0);
  // contiguous() and copy_ of a permuted device view (attention's heads merged back).
  Tensor base = randn({2, 3, 4, 5});
  Tensor view_gpu = base.cuda().permute({0, 2, 1, 3});
  Tensor view_cpu = base.permute({0, 2, 1, 3});
  CHECK(rel_diff(view_gpu.contiguous(), view_cpu.contiguous()) == 0);
  CHECK(view_gpu.contiguous().is_contiguous());
  Tensor dst = zeros({2, 4, 3, 5}, {DType::Float32, Device::cuda()});
  dst.copy_(view_gpu);
  CHECK(rel_diff(dst, view_cpu) == 0);
  // Broadcast views (stride 0) as kernel inputs: sum()'s gradient expanded back, a row
  // expanded over a batch, permuted and broadcast at once.
  Tensor row = randn({1, 5}), y = randn({4, 5});
  CHECK(rel_diff(mul(row.cuda().expand({4, 5}), y.cuda()), mul(row.expand({4, 5}), y)) == 0);
  CHECK(rel_diff(row.cuda().expand({4, 5}).contiguous(), row.expand({4, 5})) == 0);
  Tensor col = randn({3, 1});
  CHECK(rel_diff(exp(col.cuda().expand({3, 6}).t()), exp(col.expand({3, 6}).t())) < 1e-6);
  Tensor yg = y.cuda().detach().requires_grad_();
  (yg * yg).sum().backward();
  CHECK(rel_diff(yg.grad(), 2 * y) == 0);
  // None of the above went through the host.
  CHECK(codegen::cuda_host_fallbacks() == host_before);
}

TEST_CASE("cuda: index ops run on the device and raise eager's error for an index out of range",
          "[cuda]") {
  REQUIRE_CUDA_OR_SKIP();
  Tensor w = randn({50, 24}), x = randn({6, 40});
  Tensor tokens = randint(0, 50, {4, 33}), cols = randint(0, 40, {17});
  Tensor picks = randint(0, 6, {5, 40}), mask = rand({40}) < 0.3;
  Tensor wd = w.cuda(), xd = x.cuda(), td = tokens.cuda();
  auto host_calls = [] {
    uint64_t n = 0;
    for (auto& [what, calls] : codegen::cuda_host_fallbacks()) n += calls;
    return n;
  };
  const uint64_t before = host_calls();
  CHECK(rel_diff(embedding(wd, td), embedding(w, tokens)) == 0);
  CHECK(rel_diff(index_select(xd, 1, cols.cuda()), index_select(x, 1, cols)) == 0);
  CHECK(rel_diff(gather(xd, 0, picks.cuda()), gather(x, 0, picks)) == 0);
  CHECK(rel_diff(tril(xd, 2), tril(x, 2)) == 0);
  CHECK(rel_diff(triu(xd, -1), triu(x, -1)) == 0);
  CHECK(rel_diff(masked_fill(xd, mask.cuda(), -1e9), masked_fill(x, mask, -1e9)) == 0);
  CHECK(host_calls() == before);  // none took the host path
  // Out of range: eager's error, from the CPU kernel the check hands the call to.
  Tensor bad = tokens.clone();
  bad.data<int64_t>()[5] = 50;
  std::string cpu_error, cuda_error;
  try {
    embedding(w, bad);
  } catch (const Error& e) {
    cpu_error = e.message();
  }
  try {
    embedding(wd, bad.cuda());
  } catch (const Error& e) {
    cuda_error = e.message();
  }
  CHECK(cpu_error.find("out of range") != std::string::npos);
  CHECK(cuda_error == cpu_error);
  CHECK_THROWS_WITH(one_hot(from_vector<int64_t>({0, 7}, Shape{2}).cuda(), 5),
                    Catch::Contains("out of range"));
}

TEST_CASE("cuda: index_add, scatter_add and an embedding's gradient run on the device",
          "[cuda]") {
  REQUIRE_CUDA_OR_SKIP();
  // Integer-valued floats: the atomic adds' order does not change the sums.
  Tensor x = randint(-4, 4, {6, 40}).to(DType::Float32);
  Tensor src = randint(-9, 9, {5, 40}).to(DType::Float32);
  Tensor rows = from_vector<int64_t>({5, 0, 5, 2, 5}, Shape{5});
  Tensor picks = randint(0, 40, {6, 30});
  const auto host_before = codegen::cuda_host_fallbacks();
  CHECK(rel_diff(index_add(x.cuda(), 0, rows.cuda(), src.cuda()), index_add(x, 0, rows, src)) ==
        0);
  Tensor vals = src.slice(1, 0, 30).contiguous();
  CHECK(rel_diff(scatter_add(x.cuda(), 1, picks.slice(0, 0, 5).cuda(), vals.cuda()),
                 scatter_add(x, 1, picks.slice(0, 0, 5), vals)) == 0);
  Tensor w = randn({50, 24});
  Tensor wd = w.cuda().requires_grad_(), wc = w.clone().requires_grad_();
  Tensor tokens = randint(0, 50, {4, 33});
  embedding(wd, tokens.cuda()).sum().backward();
  embedding(wc, tokens).sum().backward();
  CHECK(rel_diff(wd.grad(), wc.grad()) == 0);  // counts of each token: exact
  CHECK(codegen::cuda_host_fallbacks() == host_before);  // none took the host path
  CHECK_THROWS_WITH(index_add(x.cuda(), 0, from_vector<int64_t>({1, 6}, Shape{2}).cuda(),
                              src.slice(0, 0, 2).cuda()),
                    Catch::Contains("out of range"));
}

TEST_CASE("cuda: index_copy_ writes a KV cache's slot on the device, the last of a repeated "
          "index winning", "[cuda]") {
  REQUIRE_CUDA_OR_SKIP();
  // Not yet run on a GPU: index_copy's nest stays one serial kernel there (codegen/README.md).
  Tensor cache = randn({1, 16, 32}), k = randn({1, 3, 32});
  Tensor at = from_vector<int64_t>({7, 2, 7}, Shape{3});
  Tensor on_device = cache.cuda();
  const auto host_before = codegen::cuda_host_fallbacks();
  on_device.index_copy_(1, at.cuda(), k.cuda());
  CHECK(rel_diff(on_device, cache.index_copy(1, at, k)) == 0);
  CHECK(codegen::cuda_host_fallbacks() == host_before);
  CHECK_THROWS_WITH(on_device.index_copy_(1, from_vector<int64_t>({16}, Shape{1}).cuda(),
                                          k.slice(1, 0, 1).cuda()),
                    Catch::Contains("out of range"));
}

TEST_CASE("cuda: rand, randn and randint draw on the device the cpu's numbers", "[cuda]") {
  REQUIRE_CUDA_OR_SKIP();
  // They were drawn on the host and copied over PCIe.
  auto draw = [](Device d) {
    manual_seed(21);
    return std::vector<Tensor>{rand({300, 7}, d), rand({5, 3}, {DType::Float64, d}),
                               randn({300, 7}, d), randint(-5, 1000, {77}, d)};
  };
  const auto host_before = codegen::cuda_host_fallbacks();
  std::vector<Tensor> on_device = draw(Device::cuda()), on_cpu = draw(Device::cpu());
  CHECK(codegen::cuda_host_fallbacks() == host_before);  // none took the host path
  CHECK(rel_diff(on_device[0], on_cpu[0]) == 0);  // [0, 1): u itself
  CHECK(rel_diff(on_device[1], on_cpu[1]) == 0);
  CHECK(rel_diff(on_device[2], on_cpu[2]) < 1e-6);  // log and cos: libdevice vs libm
  CHECK(on_device[3].cpu().to_vector<int64_t>() == on_cpu[3].to_vector<int64_t>());
  CHECK_THROWS_WITH(randint(0, int64_t{1} << 40, {3}, {DType::Int32, Device::cuda()}),
                    Catch::Contains("does not fit dtype int32"));
}

TEST_CASE("cuda: ops on sliced and strided views run on the device", "[cuda]") {
  REQUIRE_CUDA_OR_SKIP();
  Tensor x = randn({4, 9, 30});
  Tensor xd = x.cuda();
  auto host_calls = [] {
    uint64_t n = 0;
    for (auto& [what, calls] : codegen::cuda_host_fallbacks()) n += calls;
    return n;
  };
  const uint64_t before = host_calls();
  CHECK(rel_diff(exp(xd.slice(1, 0, 8)), exp(x.slice(1, 0, 8))) == 0);           // x[:, :-1]
  CHECK(rel_diff(xd.slice(2, 1, 30, 3) * 2.0, x.slice(2, 1, 30, 3) * 2.0) == 0);  // a step
  CHECK(rel_diff(xd.select(2, 7).contiguous(), x.select(2, 7).contiguous()) == 0);
  CHECK(rel_diff(log_softmax(xd.slice(1, 1, 9), -1), log_softmax(x.slice(1, 1, 9), -1)) < 1e-6);
  CHECK(host_calls() == before);
  // Bool views take the host path (their bytes are converted whole): still eager's values.
  Tensor m = x > 0.0;
  CHECK(rel_diff(logical_not(m.cuda().slice(1, 1, 9)).to(DType::Float32),
                 logical_not(m.slice(1, 1, 9)).to(DType::Float32)) == 0);
}

TEST_CASE("cuda: copy_ and fill_ into strided views run on the device", "[cuda]") {
  REQUIRE_CUDA_OR_SKIP();
  auto host_calls = [] {
    uint64_t n = 0;
    for (auto& [what, calls] : codegen::cuda_host_fallbacks()) n += calls;
    return n;
  };
  const uint64_t before = host_calls();
  // A KV cache [B, H, T, D] written one slot at a time, as in a decoding loop.
  Tensor cache = zeros({2, 3, 6, 4}), k = randn({2, 3, 1, 4});
  Tensor cache_d = cache.cuda();
  cache.slice(2, 4, 5).copy_(k);
  cache_d.slice(2, 4, 5).copy_(k.cuda());
  CHECK(rel_diff(cache_d, cache) == 0);
  // A column; a block of planes; a cast and broadcast source; fill_ of each width.
  Tensor x = randn({5, 7, 9}), xd = x.cuda();
  Tensor col = randn({5});
  x.select(2, 3).select(1, 2).copy_(col);
  xd.select(2, 3).select(1, 2).copy_(col.cuda());
  Tensor blk = randn({5, 2, 3});
  x.slice(1, 1, 3).slice(2, 4, 7).copy_(blk);
  xd.slice(1, 1, 3).slice(2, 4, 7).copy_(blk.cuda());
  Tensor row = arange(0, 3, 1, {DType::Float64});  // float64 [3] into float32 [5, 2, 3]
  x.slice(1, 4, 6).slice(2, 0, 3).copy_(row);
  xd.slice(1, 4, 6).slice(2, 0, 3).copy_(row.cuda());
  x.slice(2, 0, 9, 2).fill_(-1.5);
  xd.slice(2, 0, 9, 2).fill_(-1.5);
  CHECK(rel_diff(xd, x) == 0);
  // A source that overlaps the view: copied first, as eager reads a snapshot.
  Tensor y = arange(0, 20, 1, {DType::Float32}).view({4, 5}), yd = y.cuda();
  y.slice(1, 1, 5).copy_(y.slice(1, 0, 4));
  yd.slice(1, 1, 5).copy_(yd.slice(1, 0, 4));
  CHECK(rel_diff(yd, y) == 0);
  // Into a contiguous tensor: a bool source cast, a row broadcast.
  Tensor f = randn({3, 5}), fd = f.cuda();
  Tensor mask = randn({3, 5}) > 0.0;
  f.copy_(mask);
  fd.copy_(mask.cuda());
  CHECK(rel_diff(fd, f) == 0);
  f.copy_(row.slice(0, 0, 1));
  fd.copy_(row.slice(0, 0, 1).cuda());
  CHECK(rel_diff(fd, f) == 0);
  for (DType t : {DType::Bool, DType::Int32, DType::Int64, DType::Float64}) {
    Tensor z = zeros({4, 6}, {t}), zd = z.cuda();
    z.slice(1, 1, 4).fill_(3);
    zd.slice(1, 1, 4).fill_(3);
    CHECK(rel_diff(zd.to(DType::Float64), z.to(DType::Float64)) == 0);
    zd.fill_(-7);  // contiguous: float64 -7.0's two words differ
    CHECK(rel_diff(zd.to(DType::Float64), full({4, 6}, -7.0, {t}).to(DType::Float64)) == 0);
  }
  CHECK(host_calls() == before);
}

TEST_CASE("cuda: compiled matmuls follow the matmul precision as eager ones do", "[cuda]") {
  REQUIRE_CUDA_OR_SKIP();
  const MatmulPrecision saved = float32_matmul_precision();
  manual_seed(5);
  const Tensor a = randn({384, 512}).cuda(), b = randn({512, 256}).cuda();
  auto f = compile([](const Tensor& x, const Tensor& y) { return relu(matmul(x, y)) * 2.0; });
  for (const char* p : {"highest", "high", "medium", "highest"}) {
    CAPTURE(p);
    set_float32_matmul_precision(p);
    const Tensor eager = relu(matmul(a, b)) * 2.0;
    CHECK(rel_diff(f(a, b), eager.cpu()) < 1e-5);  // the same cuBLAS call, same precision
  }
  set_float32_matmul_precision(saved);
  CHECK(f.compile_count() == 1);
}
