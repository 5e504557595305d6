// Suite `eager-ops`: per-op overhead and the bandwidth / FLOP rate of single eager ops,
// next to this machine's own ceilings measured in the same run (memcpy, a direct sgemm).
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "backends/cpu/parallel.h"
#include "benchmarks/harness.h"
#include "kiln/kiln.h"

#if __has_include("backends/cpu/blas.h")
#include "backends/cpu/blas.h"
#define KILN_BENCH_HAVE_SGEMM 1
#endif

namespace kiln::bench {
namespace {

constexpr char kSuite[] = "eager-ops";
constexpr int64_t k16M = int64_t{1} << 24;
constexpr int64_t kRows = 4096, kCols = 1024;
constexpr int64_t kMatmulN = 1024;
constexpr double kF32 = sizeof(float);

// Inputs are made once in setup (outside the timed loop) and captured by the body; each call
// allocates its output, so the caching allocator is part of what is measured.

Benchmark overhead_add_1elem(const RunConfig&) {
  Tensor a = filled({1}), b = filled({1});
  return {[a, b] { do_not_optimize(kiln::add(a, b)); }, ns_per_call()};
}

Benchmark copy_16m(const RunConfig&) { return copy_reference(k16M); }

Benchmark add_16m(const RunConfig&) {
  Tensor a = filled({k16M}), b = filled({k16M});
  return {[a, b] { do_not_optimize(kiln::add(a, b)); }, gb_per_s(3 * kF32 * k16M)};
}

// A bias row added to 1000 rows of 100: rows end in partial vectors (elementwise.h tails).
Benchmark add_broadcast_1000x100(const RunConfig&) {
  Tensor a = filled({1000, 100}), b = filled({100});
  return {[a, b] { do_not_optimize(kiln::add(a, b)); }, gb_per_s(2 * kF32 * 1000 * 100)};
}

Benchmark gelu_16m(const RunConfig&) {
  Tensor x = filled({k16M}, -3.f, 3.f);
  return {[x] { do_not_optimize(kiln::gelu(x, "tanh")); }, gb_per_s(2 * kF32 * k16M)};
}

Benchmark softmax_4096x1024(const RunConfig&) {
  Tensor x = filled({kRows, kCols}, -4.f, 4.f);
  return {[x] { do_not_optimize(kiln::softmax(x, -1)); }, gb_per_s(2 * kF32 * kRows * kCols)};
}

Benchmark gelu_erf_16m(const RunConfig&) {
  Tensor x = filled({k16M}, -3.f, 3.f);
  return {[x] { do_not_optimize(kiln::gelu(x)); }, gb_per_s(2 * kF32 * k16M)};
}

Benchmark log_softmax_4096x1024(const RunConfig&) {
  Tensor x = filled({kRows, kCols}, -4.f, 4.f);
  return {[x] { do_not_optimize(kiln::log_softmax(x, -1)); },
          gb_per_s(2 * kF32 * kRows * kCols)};
}

// logsumexp over rows (the row path) and over columns (the column path); GB/s of the input.
Benchmark logsumexp_4096x1024(int64_t dim) {
  Tensor x = filled({kRows, kCols}, -4.f, 4.f);
  return {[x, dim] { do_not_optimize(kiln::logsumexp(x, {dim})); },
          gb_per_s(kF32 * kRows * kCols)};
}

Benchmark layer_norm_4096x1024(const RunConfig&) {
  Tensor x = filled({kRows, kCols}, -4.f, 4.f);
  return {[x] { do_not_optimize(kiln::layer_norm(x, {kCols})); },
          gb_per_s(2 * kF32 * kRows * kCols)};
}

// Backward on a retained graph (only the backward is timed): reads x and the output gradient,
// writes dx. The sizes of the speed review against PyTorch: layer_norm [8192, 768] with weight
// and bias, gelu (erf) over 16M elements.
Benchmark layer_norm_backward_8192x768(const RunConfig&) {
  constexpr int64_t rows = 8192, cols = 768;
  Tensor x = filled({rows, cols}, -4.f, 4.f).requires_grad_();
  Tensor w = filled({cols}).requires_grad_(), b = filled({cols}).requires_grad_();
  Tensor y = kiln::layer_norm(x, {cols}, w, b), g = filled({rows, cols});
  return {[=] { do_not_optimize(kiln::grad({y}, {x, w, b}, {g}, false, true)); },
          gb_per_s(3 * kF32 * rows * cols)};
}

Benchmark gelu_backward_16m(const RunConfig&) {
  Tensor x = filled({k16M}, -3.f, 3.f).requires_grad_();
  Tensor y = kiln::gelu(x), g = filled({k16M});
  return {[=] { do_not_optimize(kiln::grad({y}, {x}, {g}, false, true)); },
          gb_per_s(3 * kF32 * k16M)};
}

// A transposed copy of a 1024 x 1024 float32 (rows 4 KiB apart): the blocked path of
// contiguous(); element by element it ran at a tenth of copy bandwidth.
Benchmark transpose_contiguous_1024(const RunConfig&) {
  Tensor x = filled({kMatmulN, kMatmulN});
  return {[x] { do_not_optimize(x.t().contiguous()); },
          gb_per_s(2 * kF32 * kMatmulN * kMatmulN)};
}

// Conversions of a [2048, 2048] float32 read across its memory order (x.t()), next to the
// contiguous conversion: the blocked transpose converts as it writes (backends/cpu/copy.cpp).
constexpr int64_t kCastN = 2048;

Benchmark cast_case(bool transposed, DType to) {
  Tensor x = filled({kCastN, kCastN});
  if (transposed) x = x.t();
  const double bytes = (kF32 + static_cast<double>(itemsize(to))) * kCastN * kCastN;
  return {[x, to] { do_not_optimize(x.to(to)); }, gb_per_s(bytes)};
}

// Index ops on a [4096, 1024] float32 table, contiguous or the transpose of a [1024, 4096] one
// (read across its memory order): 4096 random rows (index_select dim 0, embedding), or a
// random row per element (gather dim 0). GB/s of the output written and the rows read.
constexpr int64_t kTableRows = 4096, kTableCols = 1024;

Tensor index_table(bool transposed) {
  return transposed ? filled({kTableCols, kTableRows}).t() : filled({kTableRows, kTableCols});
}

Benchmark index_select_case(bool transposed) {
  Tensor w = index_table(transposed), i = randint(0, kTableRows, {kTableRows}, {DType::Int64});
  return {[w, i] { do_not_optimize(kiln::index_select(w, 0, i)); },
          gb_per_s(2 * kF32 * kTableRows * kTableCols)};
}

Benchmark embedding_case(bool transposed) {
  Tensor w = index_table(transposed), i = randint(0, kTableRows, {kTableRows}, {DType::Int64});
  return {[w, i] { do_not_optimize(kiln::embedding(w, i)); },
          gb_per_s(2 * kF32 * kTableRows * kTableCols)};
}

Benchmark gather_case(bool transposed) {
  Tensor w = index_table(transposed);
  Tensor i = randint(0, kTableRows, {kTableRows, kTableCols}, {DType::Int64});
  return {[w, i] { do_not_optimize(kiln::gather(w, 0, i)); },
          gb_per_s((2 * kF32 + 8) * kTableRows * kTableCols)};
}

// Adds of a [4096, 1024] float32 source at random rows (repeated indices accumulate), in
// parallel over the columns (backends/cpu/scatter.cpp). GB/s of source, index and output.
Benchmark index_add_4096x1024(const RunConfig&) {
  Tensor x = filled({kTableRows, kTableCols}), s = filled({kTableRows, kTableCols});
  Tensor i = randint(0, kTableRows, {kTableRows}, {DType::Int64});
  return {[=] { do_not_optimize(kiln::index_add(x, 0, i, s)); },
          gb_per_s(3 * kF32 * kTableRows * kTableCols)};
}

Benchmark scatter_add_4096x1024(const RunConfig&) {
  Tensor x = filled({kTableRows, kTableCols}), s = filled({kTableRows, kTableCols});
  Tensor i = randint(0, kTableRows, {kTableRows, kTableCols}, {DType::Int64});
  return {[=] { do_not_optimize(kiln::scatter_add(x, 0, i, s)); },
          gb_per_s((3 * kF32 + 8) * kTableRows * kTableCols)};
}

// A decoder's sampling step: a vocabulary-sized float32 row of logits per batch item (argsort
// and cumsum in backends/cpu/scan.cpp, parallel over rows). GB/s of the input read
// (cumsum: and of its output written).
constexpr int64_t kBatch = 64, kVocab = 32000;

Benchmark topk_64x32000(const RunConfig&) {
  Tensor x = filled({kBatch, kVocab}, -4.f, 4.f);
  return {[x] { do_not_optimize(kiln::topk(x, 50, -1).values); },
          gb_per_s(kF32 * kBatch * kVocab)};
}

Benchmark sort_64x32000(const RunConfig&) {
  Tensor x = filled({kBatch, kVocab}, -4.f, 4.f);
  return {[x] { do_not_optimize(kiln::sort(x, -1, true).values); },
          gb_per_s(kF32 * kBatch * kVocab)};
}

Benchmark cumsum_64x32000(const RunConfig&) {
  Tensor x = filled({kBatch, kVocab}, 0.f, 1.f);
  return {[x] { do_not_optimize(kiln::cumsum(x, -1)); }, gb_per_s(2 * kF32 * kBatch * kVocab)};
}

// A ResNet stage's 3x3 convolution: [32, 64, 56, 56] float32 with [64, 64, 3, 3], padding 1
// (unfold in backends/cpu/window.cpp, then one sgemm-backed matmul per batch item). GFLOP/s of
// the direct convolution's 2·N·O·Ho·Wo·C·kh·kw multiply-adds; the backward (input and weight
// gradients: fold, two matmuls) counts twice that again.
constexpr int64_t kConvN = 32, kConvC = 64, kConvHw = 56;
constexpr double kConvFlops = 2.0 * kConvN * kConvC * kConvHw * kConvHw * kConvC * 9;

Benchmark conv2d_32x64x56x56(const RunConfig&) {
  Tensor x = filled({kConvN, kConvC, kConvHw, kConvHw}), w = filled({kConvC, kConvC, 3, 3});
  return {[x, w] { do_not_optimize(kiln::conv2d(x, w, Tensor(), 1, 1)); },
          gflop_per_s(kConvFlops)};
}

Benchmark conv2d_32x64x56x56_backward(const RunConfig&) {
  Tensor x = filled({kConvN, kConvC, kConvHw, kConvHw}).requires_grad_();
  Tensor w = filled({kConvC, kConvC, 3, 3}).requires_grad_();
  Tensor gy = filled({kConvN, kConvC, kConvHw, kConvHw});
  return {[x, w, gy] {
            Tensor y = kiln::conv2d(x, w, Tensor(), 1, 1);
            do_not_optimize(kiln::grad({y}, {x, w}, {gy})[1]);
          },
          gflop_per_s(3 * kConvFlops)};
}

// rand and randn of 4M float32 (randn: Box–Muller in float64, backends/cpu/random.cpp).
constexpr int64_t k4M = int64_t{1} << 22;

Benchmark rand_4m(const RunConfig&) {
  return {[] { do_not_optimize(kiln::rand({k4M})); }, gb_per_s(kF32 * k4M)};
}

Benchmark randn_4m(const RunConfig&) {
  return {[] { do_not_optimize(kiln::randn({k4M})); }, gb_per_s(kF32 * k4M)};
}

constexpr double kMatmulFlops = 2.0 * kMatmulN * kMatmulN * kMatmulN;

Benchmark matmul_1024(const RunConfig&) {
  Tensor a = filled({kMatmulN, kMatmulN}), b = filled({kMatmulN, kMatmulN});
  return {[a, b] { do_not_optimize(kiln::matmul(a, b)); }, gflop_per_s(kMatmulFlops)};
}

// The same product under set_float32_matmul_precision("medium"): bfloat16 inputs where the CPU
// has the kernels (backends/cpu/bf16_gemm.h), float32 elsewhere.
Benchmark matmul_1024_medium(const RunConfig&) {
  Tensor a = filled({kMatmulN, kMatmulN}), b = filled({kMatmulN, kMatmulN});
  return {[a, b] {
            const MatmulPrecision saved = float32_matmul_precision();
            set_float32_matmul_precision(MatmulPrecision::Medium);
            do_not_optimize(kiln::matmul(a, b));
            set_float32_matmul_precision(saved);
          },
          gflop_per_s(kMatmulFlops)};
}

Benchmark matmul_1024_reference(const RunConfig&) {
#ifdef KILN_BENCH_HAVE_SGEMM
  Tensor a = filled({kMatmulN, kMatmulN}), b = filled({kMatmulN, kMatmulN});
  Tensor c = filled({kMatmulN, kMatmulN});
  return {[a, b, c] {
            const int64_t n = kMatmulN;
            cpu::sgemm(false, false, n, n, n, 1.f, a.data<float>(), n, b.data<float>(), n, 0.f,
                       c.data<float>(), n);
            do_not_optimize(c.data<float>());
          },
          gflop_per_s(kMatmulFlops)};
#else
  throw Skipped("backends/cpu/blas.h (kiln::cpu::sgemm) is not in this build");
#endif
}

// A batch of tiny products (backends/cpu/small_gemm.cpp): one BLAS call per product cost
// about 0.3 us each before (304 us on one Zen 4 core, now 21 us).
Benchmark bmm_1024x8x8(const RunConfig&) {
  Tensor a = filled({1024, 8, 8}), b = filled({1024, 8, 8});
  return {[a, b] { do_not_optimize(kiln::bmm(a, b)); }, gflop_per_s(2.0 * 1024 * 8 * 8 * 8)};
}

// int64 through kiln's blocked gemm<int64_t> (AVX-512 vpmullq tiles); GOP/s as GFLOP/s.
// x.t().contiguous() of a [2048, 2048] (rows 8 KiB apart in float32), next to a contiguous copy
// of it (x.clone()): the transposed copy runs through register blocks (backends/cpu/copy.cpp).
Benchmark copy_case(bool transposed, DType dtype) {
  Tensor x = filled({kCastN, kCastN}).to(dtype);
  const double bytes = 2.0 * static_cast<double>(itemsize(dtype)) * kCastN * kCastN;
  if (transposed) return {[x] { do_not_optimize(x.t().contiguous()); }, gb_per_s(bytes)};
  return {[x] { do_not_optimize(x.clone()); }, gb_per_s(bytes)};
}

// The batched case: [64, 256, 512] float32 with its last two dims swapped.
Benchmark contiguous_transposed_batched(const RunConfig&) {
  Tensor x = filled({64, 256, 512});
  return {[x] { do_not_optimize(x.transpose(1, 2).contiguous()); },
          gb_per_s(2 * kF32 * 64 * 256 * 512)};
}

Benchmark matmul_512_int64(const RunConfig&) {
  Tensor a = (filled({512, 512}) * 100).to(DType::Int64);
  Tensor b = (filled({512, 512}) * 100).to(DType::Int64);
  return {[a, b] { do_not_optimize(kiln::matmul(a, b)); }, gflop_per_s(2.0 * 512 * 512 * 512)};
}

std::vector<Case> cases() {
  return {
      {"overhead_add_1elem", Mode::Eager, "ns/op", overhead_add_1elem},
      {"copy_16M", Mode::Reference, "GB/s", copy_16m},
      {"add_16M", Mode::Eager, "GB/s", add_16m},
      {"add_broadcast_1000x100", Mode::Eager, "GB/s", add_broadcast_1000x100},
      {"gelu_16M", Mode::Eager, "GB/s", gelu_16m},
      {"gelu_erf_16M", Mode::Eager, "GB/s", gelu_erf_16m},
      {"softmax_4096x1024", Mode::Eager, "GB/s", softmax_4096x1024},
      {"log_softmax_4096x1024", Mode::Eager, "GB/s", log_softmax_4096x1024},
      {"logsumexp_4096x1024", Mode::Eager, "GB/s",
       [](const RunConfig&) { return logsumexp_4096x1024(1); }},
      {"logsumexp_dim0_4096x1024", Mode::Eager, "GB/s",
       [](const RunConfig&) { return logsumexp_4096x1024(0); }},
      {"layer_norm_4096x1024", Mode::Eager, "GB/s", layer_norm_4096x1024},
      {"layer_norm_backward_8192x768", Mode::Eager, "GB/s", layer_norm_backward_8192x768},
      {"gelu_backward_16M", Mode::Eager, "GB/s", gelu_backward_16m},
      {"transpose_contiguous_1024", Mode::Eager, "GB/s", transpose_contiguous_1024},
      {"cast_2048_f64", Mode::Eager, "GB/s",
       [](const RunConfig&) { return cast_case(false, DType::Float64); }},
      {"cast_transposed_2048_f64", Mode::Eager, "GB/s",
       [](const RunConfig&) { return cast_case(true, DType::Float64); }},
      {"cast_2048_i32", Mode::Eager, "GB/s",
       [](const RunConfig&) { return cast_case(false, DType::Int32); }},
      {"cast_transposed_2048_i32", Mode::Eager, "GB/s",
       [](const RunConfig&) { return cast_case(true, DType::Int32); }},
      {"clone_2048x2048", Mode::Eager, "GB/s",
       [](const RunConfig&) { return copy_case(false, DType::Float32); }},
      {"contiguous_transposed_2048x2048", Mode::Eager, "GB/s",
       [](const RunConfig&) { return copy_case(true, DType::Float32); }},
      {"clone_2048x2048_f64", Mode::Eager, "GB/s",
       [](const RunConfig&) { return copy_case(false, DType::Float64); }},
      {"contiguous_transposed_2048x2048_f64", Mode::Eager, "GB/s",
       [](const RunConfig&) { return copy_case(true, DType::Float64); }},
      {"clone_2048x2048_bool", Mode::Eager, "GB/s",
       [](const RunConfig&) { return copy_case(false, DType::Bool); }},
      {"contiguous_transposed_2048x2048_bool", Mode::Eager, "GB/s",
       [](const RunConfig&) { return copy_case(true, DType::Bool); }},
      {"contiguous_transposed_64x256x512", Mode::Eager, "GB/s", contiguous_transposed_batched},
      {"index_select_4096x1024", Mode::Eager, "GB/s",
       [](const RunConfig&) { return index_select_case(false); }},
      {"index_select_transposed_4096x1024", Mode::Eager, "GB/s",
       [](const RunConfig&) { return index_select_case(true); }},
      {"embedding_4096x1024", Mode::Eager, "GB/s",
       [](const RunConfig&) { return embedding_case(false); }},
      {"embedding_transposed_4096x1024", Mode::Eager, "GB/s",
       [](const RunConfig&) { return embedding_case(true); }},
      {"gather_4096x1024", Mode::Eager, "GB/s",
       [](const RunConfig&) { return gather_case(false); }},
      {"gather_transposed_4096x1024", Mode::Eager, "GB/s",
       [](const RunConfig&) { return gather_case(true); }},
      {"index_add_4096x1024", Mode::Eager, "GB/s", index_add_4096x1024},
      {"scatter_add_4096x1024", Mode::Eager, "GB/s", scatter_add_4096x1024},
      {"topk_64x32000", Mode::Eager, "GB/s", topk_64x32000},
      {"sort_64x32000", Mode::Eager, "GB/s", sort_64x32000},
      {"cumsum_64x32000", Mode::Eager, "GB/s", cumsum_64x32000},
      {"conv2d_32x64x56x56", Mode::Eager, "GFLOP/s", conv2d_32x64x56x56},
      {"conv2d_32x64x56x56_backward", Mode::Eager, "GFLOP/s", conv2d_32x64x56x56_backward},
      {"rand_4M", Mode::Eager, "GB/s", rand_4m},
      {"randn_4M", Mode::Eager, "GB/s", randn_4m},
      {"matmul_1024", Mode::Eager, "GFLOP/s", matmul_1024},
      {"matmul_1024", Mode::Reference, "GFLOP/s", matmul_1024_reference},
      {"matmul_1024_medium", Mode::Eager, "GFLOP/s", matmul_1024_medium},
      {"bmm_1024x8x8", Mode::Eager, "GFLOP/s", bmm_1024x8x8},
      {"matmul_512_int64", Mode::Eager, "GOP/s", matmul_512_int64},
  };
}

/// One targets line; "n/a" when a case it needs did not run.
void check_line(std::string_view what, const Record* x, const Record* ref, double target_ratio) {
  if (!x || !ref) {
    fmt::print("  {:<34} n/a (a case it needs did not run)\n", what);
    return;
  }
  double ratio = x->value / ref->value;
  fmt::print("  {:<34} {:.3g} / {:.3g} {} = {:.0f} %   target >= {:.0f} %   {}\n", what, x->value,
             ref->value, x->unit, 100 * ratio, 100 * target_ratio,
             ratio >= target_ratio ? "ok" : "MISSED");
}

void summary(std::span<const Record> records) {
  if (!suite_ran(records, kSuite)) return;
  auto find = [&](std::string_view name, Mode mode) {
    return find_record(records, kSuite, name, mode);
  };
  fmt::print("\ntargets (printed, not asserted; the machine is shared, expect +-20-30 %):\n");
  if (const Record* o = find("overhead_add_1elem", Mode::Eager)) {
    fmt::print("  {:<34} {:.0f} ns   target <= 500 ns   {}\n", "per-op overhead (add, 1 elem)",
               o->value, o->value <= 500 ? "ok" : "MISSED");
  } else {
    fmt::print("  {:<34} n/a (a case it needs did not run)\n", "per-op overhead (add, 1 elem)");
  }
  check_line("add_16M vs copy_16M", find("add_16M", Mode::Eager),
             find("copy_16M", Mode::Reference), 0.60);
  // "Within 10 %" of the direct BLAS call: at least 90 % of its rate.
  check_line("matmul_1024 eager vs reference", find("matmul_1024", Mode::Eager),
             find("matmul_1024", Mode::Reference), 0.90);
}

[[maybe_unused]] const bool registered = register_suite(
    {kSuite, "per-op overhead and single-op GB/s, GFLOP/s vs memcpy / sgemm", cases, summary});

}  // namespace
}  // namespace kiln::bench
