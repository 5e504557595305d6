// CUDA code generation without a GPU: the PTX of fused graphs (codegen::Executable with
// CompileOptions::device = cuda), its kernel count, and that ptxas assembles it.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/driver.h"
#include "codegen/codegen.h"
#include "codegen/strided_read.h"
#include "gpu_graphs.h"
#include "kiln/kiln.h"
#include "ptxas.h"

using namespace kiln;

namespace {

codegen::CompileOptions cuda_options() {
  codegen::CompileOptions o;
  o.device = Device::cuda();
  o.disk_cache = false;
  return o;
}

/// Occurrences of `what` in `text`.
int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

/// `.entry` kernels in `ptx`.
int entries(const std::string& ptx) { return count(ptx, ".entry"); }

/// Assembles `ptx` for sm_90 with ptxas; skips (WARN) when ptxas is not installed.
void check_assembles(const std::string& ptx, const std::string& name) {
  std::string ptxas = testing::find_ptxas();
  if (ptxas.empty()) {
    WARN("skipped: ptxas not found (install the CUDA toolkit to check " << name << ")");
    return;
  }
  CHECK(testing::ptxas_errors(ptxas, ptx, name) == "");
}

/// Global loads before the first global store in `ptx`.
int loads_before_first_store(const std::string& ptx) {
  size_t store = ptx.find("st.global");
  std::string head = ptx.substr(0, store);
  int n = 0;
  for (size_t at = head.find("ld.global"); at != std::string::npos;
       at = head.find("ld.global", at + 1))
    ++n;
  return n;
}

/// Labels in `ptx` that a later branch jumps back to: one per loop a thread runs (a loop whose
/// guarded parts each branch back to its latch still counts once).
int backward_branches(const std::string& ptx) {
  std::set<std::string> targets;
  std::smatch m;
  const std::regex branch(R"(bra(\.uni)?\s+(\$L__BB\d+_\d+);)");
  for (auto it = ptx.cbegin(); std::regex_search(it, ptx.cend(), m, branch);
       it = m.suffix().first) {
    size_t at = static_cast<size_t>(m[0].first - ptx.cbegin());
    size_t label = ptx.find(m[2].str() + ":");
    if (label != std::string::npos && label < at) targets.insert(m[2].str());
  }
  return static_cast<int>(targets.size());
}

/// Whether a kernel of `ptx` has a loop.
bool has_loop(const std::string& ptx) { return backward_branches(ptx) > 0; }

}  // namespace

TEST_CASE("gpu ptx: fused x*x + x is one kernel and assembles for sm_90") {
  for (std::vector<int64_t> shape : {std::vector<int64_t>{1 << 20}, std::vector<int64_t>{300, 7}}) {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, shape);
    g.output(g.op(OpKind::Add, {g.op(OpKind::Mul, {x, x}), x}));
    codegen::Executable exe(g, cuda_options());
    CHECK(exe.device() == Device::cuda());
    const std::string& ptx = exe.ptx();
    CHECK(ptx.find(".target sm_90") != std::string::npos);
    CHECK(entries(ptx) == 1);
    CHECK(exe.num_kernels() == 1);
    // One element per thread, x loaded once: mul then add.
    CHECK(std::regex_search(ptx, std::regex(R"(mul\.rn\.f32)")));
    CHECK(std::regex_search(ptx, std::regex(R"(add\.rn\.f32)")));
    check_assembles(ptx, "square_plus");
  }
}

TEST_CASE("gpu ptx: an elementwise kernel loads elements_per_thread elements before storing") {
  for (int per_thread : {1, 4, 8}) {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {ir::kDynamic});
    g.output(g.op(OpKind::Add, {g.op(OpKind::Mul, {x, x}), x}));
    codegen::CompileOptions o = cuda_options();
    o.gpu.elements_per_thread = per_thread;
    codegen::Executable exe(g, o);
    INFO("elements_per_thread " << per_thread << "\n" << exe.ptx());
    CHECK(entries(exe.ptx()) == 1);
    // The last element's load may sink below the first guard, never below the first store.
    CHECK(loads_before_first_store(exe.ptx()) == per_thread);
    check_assembles(exe.ptx(), "square_plus_unrolled");
  }
}

TEST_CASE("gpu ptx: a column sum adds its rows in a loop inside one kernel") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {ir::kDynamic, 768});
  OpAttrs a;
  a.dims = {0};
  g.output(g.op(OpKind::Sum, {x}, a));
  codegen::Executable exe(g, cuda_options());
  INFO(exe.ptx());
  // Zero the float64 sums, partial sums over strided chunks of rows (a thread per chunk and
  // column), add the partials, round to float32. A row loop on the host would instead launch a
  // loop-free adding kernel once per row; one thread per column had 768 threads for 16,384 rows.
  CHECK(entries(exe.ptx()) == 4);
  CHECK(has_loop(exe.ptx()));
  check_assembles(exe.ptx(), "column_sum");
}

TEST_CASE("gpu ptx: a constant operand is a value, not a host global the kernel reads") {
  // x + 1.0 as compile() traces it: the 1.0 is a kiln.constant, which bufferizes to a
  // memref.global in host memory; a kernel reading it faulted on the H200.
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {ir::kDynamic, 32});
  g.output(g.op(OpKind::Add, {x, g.constant(Scalar(1.5), DType::Float32)}));
  codegen::Executable exe(g, cuda_options());
  INFO(exe.ptx());
  CHECK(entries(exe.ptx()) == 1);
  CHECK(loads_before_first_store(exe.ptx()) == 4);  // x's four elements; 1.5 is a value
  check_assembles(exe.ptx(), "add_constant");
}

TEST_CASE("gpu ptx: a gelu chain is one kernel without libdevice calls") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {4096, 1024});
  OpAttrs exact;  // erf gelu
  OpAttrs tanh_mode;
  tanh_mode.mode = 1;
  ir::Value y = g.op(OpKind::Gelu, {g.op(OpKind::Add, {g.op(OpKind::Mul, {x, x}), x})}, exact);
  g.output(g.op(OpKind::Gelu, {g.op(OpKind::Tanh, {y})}, tanh_mode));
  codegen::Executable exe(g, cuda_options());
  CHECK(entries(exe.ptx()) == 1);
  CHECK(exe.ptx().find("__nv_") == std::string::npos);  // polynomials, no libdevice
  check_assembles(exe.ptx(), "gelu_chain");
}

TEST_CASE("gpu ptx: exp-based activations: no float-to-int conversions, no IEEE division") {
  // The H200 ran the gelu chain at 63 % of copy bandwidth: issue-bound on ~90 instructions per
  // element, four of them float-to-int conversions and ~10 an IEEE division (div.rn). Now the
  // roundings are additions and the 1 + e^-x divisions div.full (formulas.h): 2 ulp over the
  // whole range, where div.approx gives 0 for divisors above 2^126 (silu(-88) ~ -1e-36).
  OpAttrs tanh_mode;
  tanh_mode.mode = 1;
  for (OpKind kind : {OpKind::Gelu, OpKind::Silu, OpKind::Sigmoid, OpKind::Exp}) {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {4096, 1024});
    ir::Value y = g.op(OpKind::Add, {g.op(OpKind::Mul, {x, x}), x});
    g.output(g.op(kind, {y}, kind == OpKind::Gelu ? tanh_mode : OpAttrs{}));
    codegen::Executable exe(g, cuda_options());
    const std::string& ptx = exe.ptx();
    INFO(op_name(kind) << "\n" << ptx);
    CHECK(entries(ptx) == 1);
    CHECK_FALSE(std::regex_search(ptx, std::regex(R"(cvt\.r[nmpz]i)")));
    CHECK(count(ptx, "div.rn.f32") == 0);
    if (kind != OpKind::Exp) CHECK(count(ptx, "div.full.f32") > 0);
    CHECK(count(ptx, "div.approx.f32") + count(ptx, "rcp.approx.f32") == 0);
    check_assembles(ptx, "activation");
  }
}

TEST_CASE("gpu ptx: tanh's and erfc's own divisions are approximate, the graph's stay exact") {
  // Whole-block SASS slots per 4 elements (ptxas sm_90): tanh 280 -> 136, gelu (erf) 464 -> 336.
  auto ptx_of = [](OpKind kind, bool divide) {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {4096, 1024});
    ir::Value y = g.op(kind, {x});
    if (divide) y = g.op(OpKind::Div, {y, g.input(DType::Float32, {4096, 1024})});
    g.output(y);
    return codegen::Executable(g, cuda_options()).ptx();
  };
  auto exact = [](const std::string& ptx) {
    return count(ptx, "div.rn.f32") + count(ptx, "rcp.rn.f32");
  };
  auto approximate = [](const std::string& ptx) {
    return count(ptx, "div.approx.f32") + count(ptx, "rcp.approx.f32");
  };
  for (OpKind kind : {OpKind::Tanh, OpKind::Gelu}) {  // gelu: 0.5 x erfc(-x / sqrt 2)
    std::string ptx = ptx_of(kind, false);
    INFO(op_name(kind) << "\n" << ptx);
    CHECK(exact(ptx) == 0);
    CHECK(approximate(ptx) > 0);
    check_assembles(ptx, "approximate_division");
    std::string divided = ptx_of(kind, true);  // tanh(x) / y: the user's division is IEEE
    CHECK(count(divided, "div.rn.f32") > 0);
  }
  // log1p's x * log(u) / (u - 1) divides by up to 3e38, beyond div.approx's 2^126: exact.
  CHECK(exact(ptx_of(OpKind::Log1p, false)) > 0);
}

TEST_CASE("gpu ptx: a thread whose elements are all in bounds addresses them without tests") {
  // 256 threads x 4 elements: a thread's elements are 1024 bytes apart. The whole-block path
  // reads and writes them at constant offsets from one address; only the last block clamps
  // and guards each element.
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {ir::kDynamic});
  g.output(g.op(OpKind::Add, {g.op(OpKind::Mul, {x, x}), x}));
  codegen::Executable exe(g, cuda_options());
  const std::string& ptx = exe.ptx();
  INFO(ptx);
  auto at_offset = [&](const std::string& access, int offset) {
    return std::regex_search(ptx, std::regex(access + R"(\.global\.b32\s+[^\n]*\[%rd\d+\+)" +
                                             std::to_string(offset) + "\\]"));
  };
  for (int offset : {1024, 2048, 3072}) CHECK(at_offset("ld", offset));
  // (The fourth store is the tail both paths share: the device compiler merges it.)
  for (int offset : {1024, 2048}) CHECK(at_offset("st", offset));
  check_assembles(ptx, "whole_block");
}

TEST_CASE("gpu ptx: softmax over rows is at most 2 kernels") {
  ir::Graph g;
  OpAttrs a;
  a.dim = -1;
  g.output(g.op(OpKind::Softmax, {g.input(DType::Float32, {512, 4096})}, a));
  codegen::Executable exe(g, cuda_options());
  // max, exp + sum, the float64 sum's rounding and the divide: one kernel, a thread per row.
  CHECK(entries(exe.ptx()) == 1);
  check_assembles(exe.ptx(), "softmax");
}

TEST_CASE("gpu ptx: softmax of attention scores has a thread per row, not per batch") {
  // [B, H, L, S] scores: every nest runs over (b, h, l), so the one kernel gets a thread per
  // (b, h, l) with 3 loops over S (max; sum of exp(x - max); exp(x - max) / sum: GPU fusion
  // recomputes the exp instead of storing it). With a thread per b (the batch dim alone),
  // each thread ran H * L rows: 32 threads for the original-size Transformer.
  ir::Graph g;
  OpAttrs a;
  a.dim = -1;
  g.output(g.op(OpKind::Softmax, {g.input(DType::Float32, {32, 12, 512, 512})}, a));
  codegen::Executable exe(g, cuda_options());
  INFO(exe.ptx());
  CHECK(entries(exe.ptx()) == 1);
  CHECK(backward_branches(exe.ptx()) == 3);
  check_assembles(exe.ptx(), "softmax_4d");
  // layer_norm over the last dim of [B, T, E]: a thread per (b, t).
  ir::Graph ln;
  OpAttrs norm;
  norm.dims = {768};
  norm.eps = 1e-5;
  ln.output(ln.op(OpKind::LayerNorm, {ln.input(DType::Float32, {32, 512, 768})}, norm));
  codegen::Executable lexe(ln, cuda_options());
  INFO(lexe.ptx());
  CHECK(entries(lexe.ptx()) == 1);
  CHECK(backward_branches(lexe.ptx()) <= 4);
  check_assembles(lexe.ptx(), "layer_norm_3d");
  // Normalised over the last two dims: (b, t) rows would read other rows' mean, so the
  // kernel keeps a thread per b.
  ir::Graph ln2;
  norm.dims = {512, 768};
  ln2.output(ln2.op(OpKind::LayerNorm, {ln2.input(DType::Float32, {32, 512, 768})}, norm));
  codegen::Executable l2(ln2, cuda_options());
  INFO(l2.ptx());
  CHECK(backward_branches(l2.ptx()) > backward_branches(lexe.ptx()));
  check_assembles(l2.ptx(), "layer_norm_2d_normalized");
}

TEST_CASE("gpu ptx: layer_norm and a full sum") {
  {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, {256, 768});
    OpAttrs ln;
    ln.dims = {768};
    g.output(g.op(OpKind::LayerNorm, {x}, ln));
    codegen::Executable exe(g, cuda_options());
    // mean, variance (float64 statistics), normalise: one kernel, a thread per row.
    CHECK(entries(exe.ptx()) == 1);
    check_assembles(exe.ptx(), "layer_norm");
  }
  {
    ir::Graph g;
    g.output(g.op(OpKind::Sum, {g.input(DType::Float32, {1 << 22})}));
    codegen::Executable exe(g, cuda_options());
    // 16,384 threads each sum every 16,384th element, 64 threads sum those partials, and one
    // thread their 64 partials (init, accumulation and rounding). It was one thread for all.
    CHECK(entries(exe.ptx()) == 3);
    check_assembles(exe.ptx(), "sum_all");
  }
}

TEST_CASE("gpu ptx: a matmul with a bias and gelu epilogue: cuBLAS plus one kernel") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {1024, 256});
  ir::Value w = g.input(DType::Float32, {256, 1024});
  ir::Value b = g.input(DType::Float32, {1024});
  OpAttrs exact;
  g.output(g.op(OpKind::Gelu, {g.op(OpKind::Add, {g.op(OpKind::Matmul, {x, w}), b})}, exact));
  codegen::Executable exe(g, cuda_options());
  // The GEMM is a host call of cuBLAS; the bias add and gelu are one kernel (the add's only
  // user is elementwise, so it is not folded into the GEMM's C: fusion.cpp).
  INFO(exe.ptx());
  CHECK(entries(exe.ptx()) == 1);
  check_assembles(exe.ptx(), "matmul_epilogue");
}

TEST_CASE("gpu ptx: the target chip and block size come from GpuTarget") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {1000});
  g.output(g.op(OpKind::Exp, {x}));
  codegen::CompileOptions o = cuda_options();
  o.gpu.chip = "sm_80";
  o.gpu.features = "+ptx78";
  o.gpu.threads_per_block = 128;
  codegen::Executable exe(g, o);
  CHECK(exe.ptx().find(".target sm_80") != std::string::npos);
  CHECK(exe.ptx().find(".version 7.8") != std::string::npos);
  CHECK(entries(exe.ptx()) == 1);
  // Different targets are different cache entries.
  codegen::Executable sm90(g, cuda_options());
  CHECK(sm90.ptx().find(".target sm_90") != std::string::npos);
}

// atoi read "64abc" as 64, 4294967360 (2^32 + 64) as 64 and "2.9" as 2, and "32 " threw from
// every compile; now the whole value must be an integer in range, else the default is kept.
TEST_CASE("gpu target: KILN_CUDA_* integers are parsed strictly; a bad one keeps the default") {
  const codegen::GpuTarget defaults;
  struct Var {
    const char* name;
    int codegen::GpuTarget::*field;
    std::vector<std::pair<const char*, int>> good;
    std::vector<const char*> bad;
  };
  const Var vars[] = {
      {"KILN_CUDA_THREADS_PER_BLOCK", &codegen::GpuTarget::threads_per_block,
       {{"64", 64}, {"32 ", 32}, {" 1024", 1024}},
       {"64abc", "4294967360", "2.9", "48", "0", "-64", "2048", "abc"}},
      {"KILN_CUDA_ELEMENTS_PER_THREAD", &codegen::GpuTarget::elements_per_thread,
       {{"1", 1}, {"16 ", 16}, {"\t8", 8}},
       {"2.9", "4294967298", "17", "0", "8x", "-1"}},
      {"KILN_CUDA_ROW_LANES", &codegen::GpuTarget::row_lanes,
       {{"1", 1}, {" 32 ", 32}},
       {"1x", "4294967297", "16", "0", "32.0"}},
  };
  for (const Var& var : vars) {
    INFO(var.name);
    ::unsetenv(var.name);
    CHECK(codegen::GpuTarget::from_env().*var.field == defaults.*var.field);
    for (auto [text, value] : var.good) {
      INFO(text);
      ::setenv(var.name, text, 1);
      CHECK(codegen::GpuTarget::from_env().*var.field == value);
    }
    for (const char* text : var.bad) {
      INFO(text);
      ::setenv(var.name, text, 1);
      codegen::GpuTarget t;
      CHECK_NOTHROW(t = codegen::GpuTarget::from_env());
      CHECK(t.*var.field == defaults.*var.field);
    }
    ::unsetenv(var.name);
  }
}

TEST_CASE("gpu ptx: CUDA executables without a device refuse to run") {
  if (cuda::is_available()) return;  // with a device they run (tests/tracer/cuda_test.cpp)
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {8});
  g.output(g.op(OpKind::Add, {x, x}));
  codegen::Executable exe(g, cuda_options());
  CHECK_THROWS_WITH(exe.run({ones({8})}), Catch::Contains("no CUDA device"));
}

// cat lowers to slices of the result (codegen/lower.cpp): a kernel per joined input, the last
// writing into the output, plus the copy of the first's temporary; the PTX assembles.
TEST_CASE("gpu ptx: cat of two computed inputs writes each into its slice of the result") {
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {512, 64});
  ir::Value y = g.input(DType::Float32, {256, 64});
  OpAttrs rows;  // dim 0
  g.output(g.op(OpKind::Cat, {g.op(OpKind::Exp, {x}), g.op(OpKind::Mul, {y, y})}, rows));
  codegen::Executable exe(g, cuda_options());
  CHECK(entries(exe.ptx()) == 3);
  check_assembles(exe.ptx(), "cat");
}

// More than 32 inputs: tensor.concat, an allocation and a copy kernel per input (after each
// input's own kernel); the PTX assembles.
TEST_CASE("gpu ptx: cat of 33 computed inputs is a kernel and a copy per input") {
  ir::Graph g;
  std::vector<ir::Value> parts;
  for (int i = 0; i < 33; ++i)
    parts.push_back(g.op(OpKind::Exp, {g.input(DType::Float32, {128, 64})}));
  OpAttrs cols;
  cols.dim = 1;
  g.output(g.op(OpKind::Cat, parts, cols));
  codegen::Executable exe(g, cuda_options());
  INFO(exe.ptx());
  CHECK(entries(exe.ptx()) == 66);  // the chain of insert_slices had the last write its slice
  check_assembles(exe.ptx(), "cat33");
}

TEST_CASE("gpu ptx: a dropout mask is one kernel that reads its Philox key on the device") {
  // Eager dropout on a CUDA tensor runs this kernel (codegen/cuda_kernels.cpp) instead of
  // drawing on the host and copying the mask over. The key (seed, offset) is its operand.
  for (DType dtype : {DType::Bool, DType::Float32}) {
    ir::Graph g;
    ir::Value key = g.input(DType::Int64, {2});
    OpAttrs a;
    a.dims = {32, 512, 768};
    a.dtype = dtype;
    a.p = 0.1;
    g.output(g.op(OpKind::DropoutMask, {key}, a));
    codegen::Executable exe(g, cuda_options());
    INFO(exe.ptx());
    CHECK(entries(exe.ptx()) == 1);
    CHECK(exe.num_kernels() == 1);
    // The key's two words come from global memory inside the kernel (not the host).
    CHECK(loads_before_first_store(exe.ptx()) >= 2);
    CHECK(std::regex_search(exe.ptx(), std::regex(R"(mul\.wide\.u32)")));  // Philox rounds
    // Parameters: the two memref descriptors (key 5, the 3-d mask 9) and 4 loop bounds, no
    // constants (there were 48): Philox's multipliers as parameters kept the device compiler
    // from using 32-bit multiplies.
    CHECK(count(exe.ptx(), ".param .") <= 18);
    check_assembles(exe.ptx(), "dropout_mask");
  }
}

TEST_CASE("gpu ptx: an embedding lookup and its scaling are one kernel reading the table on "
          "the device at a clamped index") {
  // Eager embedding on a CUDA tensor ran on the host (the table copied over PCIe both ways).
  ir::Graph g;
  ir::Value table = g.input(DType::Float32, {30522, 768});
  ir::Value tokens = g.input(DType::Int64, {32, 512});
  ir::Value e = g.op(OpKind::Embedding, {table, tokens});
  g.output(g.op(OpKind::Mul, {e, g.constant(Scalar(27.7), DType::Float32)}));
  codegen::Executable exe(g, cuda_options());
  INFO(exe.ptx());
  CHECK(entries(exe.ptx()) == 1);
  CHECK(exe.num_kernels() == 1);
  // The index is clamped into [0, 30521] before the table is read.
  CHECK(std::regex_search(exe.ptx(), std::regex(R"(max\.s64[^\n]*, 0;)")));
  CHECK(std::regex_search(exe.ptx(), std::regex(R"(min\.s64[^\n]*, 30521;)")));
  check_assembles(exe.ptx(), "embedding");
}

TEST_CASE("gpu ptx: a KV cache's slot written by index_copy assembles, with no atomics") {
  // index_copy's nest is index_add's without the add: a repeated index must keep its last
  // slice, so the GPU lowering leaves it serial (codegen/README.md), never atomic.
  ir::Graph g;
  OpAttrs along1;
  along1.dim = 1;
  ir::Value cache = g.input(DType::Float32, {1, 64, 256});
  ir::Value pos = g.input(DType::Int64, {1});
  ir::Value k = g.input(DType::Float32, {1, 1, 256});
  g.output(g.op(OpKind::IndexCopy, {cache, pos, k}, along1));
  codegen::Executable exe(g, cuda_options());
  INFO(exe.ptx());
  CHECK(count(exe.ptx(), "atom.") == 0);
  CHECK(std::regex_search(exe.ptx(), std::regex(R"(min\.s64[^\n]*, 63;)")));
  check_assembles(exe.ptx(), "index_copy");
}

TEST_CASE("gpu ptx: an embedding's gradient (index_add) is a parallel loop of atomic adds") {
  // index_add / scatter_add on CUDA tensors ran on the host: an embedding's backward copied
  // the [30522, 768] gradient table over PCIe both ways every step.
  ir::Graph g;
  ir::Value table = g.input(DType::Float32, {30522, 768});
  ir::Value tokens = g.input(DType::Int64, {16384});
  ir::Value grad = g.input(DType::Float32, {16384, 768});
  g.output(g.op(OpKind::IndexAdd, {table, tokens, grad}));
  codegen::Executable exe(g, cuda_options());
  INFO(exe.ptx());
  // At most a copy of the table into the result and the adds; no one-thread kernel.
  CHECK(entries(exe.ptx()) <= 2);
  CHECK(count(exe.ptx(), "atom.global.add.f32") == 1);
  CHECK(std::regex_search(exe.ptx(), std::regex(R"(min\.s64[^\n]*, 30521;)")));
  check_assembles(exe.ptx(), "index_add");

  ir::Graph h;  // scatter_add of int64 counts along dim 1
  OpAttrs along1;
  along1.dim = 1;
  h.output(h.op(OpKind::ScatterAdd, {h.input(DType::Int64, {64, 100}),
                                     h.input(DType::Int32, {64, 7}),
                                     h.input(DType::Int64, {64, 7})}, along1));
  codegen::Executable counts(h, cuda_options());
  INFO(counts.ptx());
  CHECK(count(counts.ptx(), "atom.global.add.u64") == 1);
  check_assembles(counts.ptx(), "scatter_add");

  // A loop of one iteration (folded away) or `?` sizes still give the parallel atomic loop, not
  // one thread doing every add (review): a [1, N] row, and a gather's gradient over [?, ?, V].
  OpAttrs along2;
  along2.dim = 2;
  for (bool dynamic : {false, true}) {
    INFO("dynamic " << dynamic);
    ir::Graph s;
    const int64_t b = dynamic ? ir::kDynamic : 1, t = dynamic ? ir::kDynamic : 4;
    s.output(s.op(OpKind::ScatterAdd,
                  {s.input(DType::Float32, {b, t, 5000}), s.input(DType::Int64, {b, t, 1}),
                   s.input(DType::Float32, {b, t, 1})},
                  along2));
    codegen::Executable exe2(s, cuda_options());
    INFO(exe2.ptx());
    CHECK(count(exe2.ptx(), "atom.global.add.f32") == 1);
    CHECK(count(exe2.ptx(), "st.global.f32") <= 1);  // the copy of x only
  }
}

TEST_CASE("gpu ptx: rand, randn and randint are one kernel each, reading their key") {
  // They were drawn on the host and copied over PCIe. randn's float64 log and cos are
  // libdevice's (linked from the CUDA toolkit).
  const std::string toolkit = codegen::GpuTarget::from_env().toolkit;
  for (OpKind k : {OpKind::Uniform, OpKind::Normal, OpKind::RandInt}) {
    INFO(op_name(k));
    if (k == OpKind::Normal && toolkit.empty()) {
      WARN("skipped randn: no CUDA toolkit with libdevice found");
      continue;
    }
    OpAttrs a;
    a.dims = {1000, 1000};
    a.dtype = k == OpKind::RandInt ? DType::Int64 : DType::Float32;
    a.low = k == OpKind::RandInt ? Scalar(int64_t{-5}) : Scalar(0.0);
    a.high = k == OpKind::RandInt ? Scalar(int64_t{30522}) : Scalar(1.0);
    ir::Graph g;
    g.output(g.op(k, {g.input(DType::Int64, {2})}, a));
    codegen::Executable exe(g, cuda_options());
    INFO(exe.ptx());
    CHECK(entries(exe.ptx()) == 1);
    CHECK(exe.ptx().find(".extern") == std::string::npos);
    check_assembles(exe.ptx(), std::string(op_name(k)));
  }
}

TEST_CASE("gpu ptx: a sliced input (an LM's shifted logits) is read in place by one kernel") {
  // Eager ops on CUDA views that are neither contiguous nor dense took the host path; the
  // kernel now gets the block of storage and slices it (codegen/strided_read.h).
  Tensor logits = empty({8, 128, 1000}).slice(1, 0, 127);  // x[:, :-1]
  auto read = codegen::strided_read(logits.shape(), logits.strides());
  REQUIRE(read);
  ir::Graph g;
  ir::Value block = g.input(DType::Float32, read->block.vec());
  ir::Value x = codegen::apply_strided_read(g, block, *read);
  g.output(g.op(OpKind::Exp, {x}));
  codegen::Executable exe(g, cuda_options());
  INFO(exe.ptx());
  CHECK(entries(exe.ptx()) == 1);
  CHECK(exe.num_kernels() == 1);  // no copy of the slice first
  check_assembles(exe.ptx(), "sliced_exp");
}

TEST_CASE("gpu ptx: float64 math links CUDA's libdevice; without it, a clear error") {
  // float64 exp, erf, ... have no polynomial form here: the kernels call libdevice's __nv_exp,
  // __nv_erf (erf/erfc were calls to the host's libm, an unresolved extern in the PTX).
  for (OpKind k : {OpKind::Exp, OpKind::Erf, OpKind::Gelu}) {
    INFO(op_name(k));
    ir::Graph g;
    g.output(g.op(k, {g.input(DType::Float64, {1000})}));
    codegen::CompileOptions o = cuda_options();
    o.memory_cache = false;
    o.gpu.toolkit = "/nonexistent";
    CHECK_THROWS_WITH(codegen::Executable(g, o),
                      Catch::Contains("__nv_") && Catch::Contains("libdevice") &&
                          Catch::Contains("CUDA_HOME") && !Catch::Contains("\n("));
    o.gpu.toolkit = codegen::GpuTarget::from_env().toolkit;
    if (o.gpu.toolkit.empty()) {
      WARN("skipped the linked kernel: no CUDA toolkit with libdevice found");
      continue;
    }
    std::string ptx = codegen::Executable(g, o).ptx();
    CHECK(ptx.find(".extern") == std::string::npos);
    check_assembles(ptx, "f64_math");
    // A toolkit folder with a space in its name (the option was passed unquoted; review).
    auto spaced = std::filesystem::temp_directory_path() / "kiln cuda toolkit";
    std::filesystem::create_directories(spaced);
    std::error_code ec;
    std::filesystem::create_directory_symlink(std::filesystem::path(o.gpu.toolkit) / "nvvm",
                                              spaced / "nvvm", ec);
    o.gpu.toolkit = spaced.string();
    CHECK(codegen::Executable(g, o).ptx().find(".extern") == std::string::npos);
  }
}

TEST_CASE("gpu ptx: cross_entropy over 30522 classes compiles for the GPU") {
  // nll_loss compared each class id with the target, the ids a [C, 1] constant: above 64
  // classes a host constant the kernels could not read, so the build failed and eager
  // cross_entropy on CUDA tensors took the host path. It now gathers x[n, t[n]].
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {256, 30522});
  ir::Value t = g.input(DType::Int64, {256});
  OpAttrs last, mean;
  last.dim = -1;
  mean.mode = 1;
  g.output(g.op(OpKind::NllLoss, {g.op(OpKind::LogSoftmax, {x}, last), t}, mean));
  std::unique_ptr<codegen::Executable> exe;
  REQUIRE_NOTHROW(exe = std::make_unique<codegen::Executable>(g, cuda_options()));
  INFO(exe->ptx());
  CHECK(entries(exe->ptx()) == exe->num_kernels());
  CHECK(exe->ptx().find(".global .align") == std::string::npos);  // no constant of class ids
  check_assembles(exe->ptx(), "cross_entropy");
}

TEST_CASE("gpu ptx: contiguous() of a permuted view is one copy kernel") {
  // What eager contiguous() / copy_ of a dense permuted CUDA view runs (codegen/cuda_kernels.cpp):
  // the graph of the base permuted, whose output is a new contiguous tensor.
  ir::Graph g;
  ir::Value base = g.input(DType::Float32, {32, 512, 12, 64});  // [B, T, H, D]
  OpAttrs a;
  a.dims = {0, 2, 1, 3};
  g.output(g.op(OpKind::Permute, {base}, a));
  codegen::Executable exe(g, cuda_options());
  INFO(exe.ptx());
  CHECK(entries(exe.ptx()) == 1);
  CHECK(count(exe.ptx(), "st.global") >= 1);
  check_assembles(exe.ptx(), "permuted_copy");
  // The same graph on the CPU gives the permuted values, contiguous.
  codegen::CompileOptions cpu;
  cpu.disk_cache = false;
  ir::Graph small;
  ir::Value x = small.input(DType::Float32, {2, 3, 4, 5});
  small.output(small.op(OpKind::Permute, {x}, a));
  Tensor in = arange(0, 120, 1, {DType::Float32}).view({2, 3, 4, 5});
  Tensor out = codegen::Executable(small, cpu).run({in}).at(0);
  CHECK(out.is_contiguous());
  CHECK(out.to_vector<float>() == in.permute({0, 2, 1, 3}).contiguous().to_vector<float>());
}

TEST_CASE("gpu ptx: a row reduction's lanes combine their parts with shuffles") {
  auto softmax_graph = [](const std::vector<int64_t>& shape, bool after_matmul) {
    ir::Graph g;
    OpAttrs a;
    a.dim = -1;
    ir::Value x = g.input(DType::Float32, shape);
    if (after_matmul)
      x = g.op(OpKind::Matmul, {g.input(DType::Float32, {shape[0], 64}),
                                g.input(DType::Float32, {64, shape[1]})});
    g.output(g.op(OpKind::Softmax, {x}, a));
    return g;
  };
  const std::string bfly = "shfl.sync.bfly";
  {
    codegen::Executable exe(softmax_graph({512, 4096}, false), cuda_options());
    std::string ptx = exe.ptx();
    INFO(ptx);
    // A float32 max (5 shuffles for 32 lanes) and a float64 sum (two 32-bit halves each).
    CHECK(count(ptx, bfly) == 15);
    CHECK(count(ptx, "bar.warp.sync") == 0);  // the initial values are the fills', in registers
    // x read by the max, sum and divide loops, which recompute exp(x - max) (it was stored
    // by a fourth loop and read back twice), 4 columns per lane and step; the row max and sum
    // come from registers, not reloaded in every iteration.
    CHECK(count(ptx, "ld.global") == 3 * 4);
    CHECK(count(ptx, "st.global") == 1 + 2 + 4);  // the row max, the sum (float64), y
    CHECK(entries(ptx) == 1);
    check_assembles(ptx, "softmax_lanes");
  }
  {  // after a GEMM: the run of row loops after it is verified and merged as well
    codegen::Executable exe(softmax_graph({512, 4096}, true), cuda_options());
    INFO(exe.ptx());
    CHECK(entries(exe.ptx()) == 1);  // it was 7: two fills, max, exp, sum, reciprocal, scale
    CHECK(count(exe.ptx(), bfly) == 15);
    CHECK(count(exe.ptx(), "bar.warp.sync") == 0);
    check_assembles(exe.ptx(), "matmul_softmax_lanes");
  }
  {  // the first input's rows are the batch (`?`): its fill, sum and rounding merge as rows.
     // The second input's rows are not, but its fill and max run over the same 256 rows, each
     // row touching its own element, so they merge too (fuse_same_domain_loops): the max starts
     // from the fill's value in a register. Before, the fill was a kernel of its own and the
     // max loaded the initial value behind a warp sync.
    ir::Graph g;
    OpAttrs a;
    a.dims = {-1};
    g.output(g.op(OpKind::Sum, {g.input(DType::Float32, {512, 300})}, a));
    g.output(g.op(OpKind::Amax, {g.input(DType::Float32, {256, 300})}, a));
    codegen::Executable exe(g, cuda_options());
    INFO(exe.ptx());
    CHECK(count(exe.ptx(), bfly) == 15);
    CHECK(count(exe.ptx(), "bar.warp.sync") == 0);
    CHECK(entries(exe.ptx()) == 2);
    check_assembles(exe.ptx(), "two_batches_lanes");
  }
  {  // rows shorter than 64 elements keep a thread per row
    codegen::Executable exe(softmax_graph({512, 40}, false), cuda_options());
    CHECK(count(exe.ptx(), bfly) == 0);
  }
  {  // GpuTarget::row_lanes = 1: a thread per row
    codegen::CompileOptions one = cuda_options();
    one.gpu.row_lanes = 1;
    codegen::Executable exe(softmax_graph({512, 4096}, false), one);
    CHECK(count(exe.ptx(), bfly) == 0);
  }
  {  // lanes other than a whole warp would shuffle with masks that leave lanes out
    codegen::CompileOptions half = cuda_options();
    half.gpu.row_lanes = 16;
    CHECK_THROWS_WITH(codegen::Executable(softmax_graph({512, 4096}, false), half),
                      Catch::Contains("row lanes must be 1 or 32"));
  }
  {  // a column sum reads neighbouring columns with neighbouring threads already: no lanes
    ir::Graph g;
    OpAttrs a;
    a.dims = {0};
    g.output(g.op(OpKind::Sum, {g.input(DType::Float32, {4096, 512})}, a));
    codegen::Executable exe(g, cuda_options());
    CHECK(count(exe.ptx(), bfly) == 0);
  }
}

TEST_CASE("gpu ptx: a 4-D GEMM writes its output directly: no kernel") {
  ir::Graph g;
  g.output(g.op(OpKind::Matmul, {g.input(DType::Float32, {8, 12, 512, 64}),
                                 g.input(DType::Float32, {8, 12, 64, 512})}));
  codegen::Executable exe(g, cuda_options());
  INFO(exe.ptx());
  CHECK(exe.num_kernels() == 0);  // cuBLAS only; the copy out of a temporary was a kernel
}

TEST_CASE("gpu ptx: attention's softmax between two GEMMs is one kernel over a warp per row") {
  // scores = q @ k * 0.125, softmax over the last dim, @ v: the scale, max, exp, sum and divide
  // merge into one kernel with rows over (b, h, l), though the probabilities are reshaped for
  // the second GEMM (a view that only code after the loops uses).
  ir::Graph g;
  OpAttrs a;
  a.dim = -1;
  ir::Value q = g.input(DType::Float32, {8, 12, 512, 64});
  ir::Value k = g.input(DType::Float32, {8, 12, 64, 512});
  ir::Value v = g.input(DType::Float32, {8, 12, 512, 64});
  ir::Value scores =
      g.op(OpKind::Mul, {g.op(OpKind::Matmul, {q, k}), g.constant(Scalar(0.125), DType::Float32)});
  g.output(g.op(OpKind::Matmul, {g.op(OpKind::Softmax, {scores}, a), v}));
  codegen::Executable exe(g, cuda_options());
  INFO(exe.ptx());
  // The softmax kernel only: the second GEMM writes the output itself (its result was copied
  // out by a second kernel).
  CHECK(entries(exe.ptx()) == 1);
  CHECK(count(exe.ptx(), "shfl.sync.bfly") == 15);
  check_assembles(exe.ptx(), "attention");
  // layer_norm before a GEMM: one kernel with two float64 sums over lanes, one for the epilogue
  ir::Graph ln;
  OpAttrs norm;
  norm.dims = {768};
  norm.eps = 1e-5;
  ir::Value y = ln.op(OpKind::LayerNorm, {ln.input(DType::Float32, {4096, 768}),
                                          ln.input(DType::Float32, {768}),
                                          ln.input(DType::Float32, {768})},
                      norm);
  ir::Value w = ln.input(DType::Float32, {768, 768});
  ln.output(ln.op(OpKind::Gelu, {ln.op(OpKind::Matmul, {y, w})}));
  codegen::Executable lexe(ln, cuda_options());
  INFO(lexe.ptx());
  CHECK(entries(lexe.ptx()) == 2);
  CHECK(count(lexe.ptx(), "shfl.sync.bfly") == 20);
  check_assembles(lexe.ptx(), "layer_norm_matmul");
  // softmax's backward after the GEMM giving its incoming gradient, y * (g - sum(g * y)): the
  // sum's fill (placed before the GEMM) moves after it, and the rows of y and of the GEMM's
  // result (two inputs' `?`) are one count: one kernel, where it was 4.
  codegen::Executable bexe(test::softmax_backward_after_gemm(4096, 512, 64), cuda_options());
  INFO(bexe.ptx());
  CHECK(entries(bexe.ptx()) == 1);
  CHECK(count(bexe.ptx(), "shfl.sync.bfly") == 10);
  check_assembles(bexe.ptx(), "softmax_backward");
}

TEST_CASE("gpu ptx: in a static graph, softmax and the dropout after it are one kernel over a "
          "warp per row") {
  // A whole training step keeps its traced shapes (here the first output, a sum over the batch
  // like a weight gradient, has no rows to relax), so no `?` marks the row loops and the
  // static groups merge them: softmax(q @ k) * keep's max, sum of exp and masked probabilities
  // are one kernel (before, the probabilities were a kernel of their own, which read the
  // scores again from DRAM), then the batch sum's kernel.
  ir::Graph g = test::static_attention(96, 128, 128, 64);
  codegen::Executable exe(g, cuda_options());
  const std::string ptx = exe.ptx();
  INFO(ptx);
  CHECK(entries(ptx) == 2);
  // The max over lanes (5) and the float64 sum (two halves, 10), in the same kernel.
  CHECK(count(ptx, "shfl.sync.bfly") == 15);
  check_assembles(ptx, "static_softmax_dropout");
  // gpu_loops_test.cpp checks its values with these loops run on the CPU.
  // Few long rows stay apart: 64 rows of 4,096 would be 2,048 threads (a warp per row) where
  // the elementwise loop x - max had 65,536 (keeps_threads_busy). x - max(x, 1) and its column
  // sum (first: no rows to relax): the max, the difference and the column sum, 3 kernels.
  ir::Graph few;
  ir::Value x = few.input(DType::Float32, {64, 4096});
  OpAttrs row;
  row.dims = {1};
  row.keepdim = true;
  ir::Value centred = few.op(OpKind::Sub, {x, few.op(OpKind::Amax, {x}, row)});
  OpAttrs column;
  column.dims = {0};
  few.output(few.op(OpKind::Sum, {centred}, column));
  few.output(centred);
  codegen::Executable few_exe(few, cuda_options());
  INFO(few_exe.ptx());
  CHECK(entries(few_exe.ptx()) == 3);
}

TEST_CASE("gpu ptx: a projection's bias, head transpose and scaling are one kernel after "
          "cuBLAS") {
  // The bias add is not broadcast into the GEMM's C (a kernel writing C, which cuBLAS then
  // reads): one kernel reads the product with the heads' permutation, adds the bias and scales
  // (the transpose was a kernel of its own, storing q unscaled and scaled).
  codegen::Executable exe(test::query_heads(4, 128, 12, 64), cuda_options());
  INFO(exe.ptx());
  CHECK(entries(exe.ptx()) == 1);
  check_assembles(exe.ptx(), "query_heads");
}

TEST_CASE("gpu ptx: attention's backward row stores only its score gradient") {
  // test::static_attention_backward between its two GEMMs: dropout's backward, the row sum and
  // the score gradient are one kernel (fuse_static_row_loops). Dropout's gradient ([batch, rows,
  // cols], 400 MB a layer at the original size) was stored there and read back twice; the two
  // readers now compute it again from the product and the mask (recompute_row_intermediates):
  // 6 stores (the score gradient's 4 columns per step, the row sum's 2), where there were 10.
  codegen::Executable exe(test::static_attention_backward(32, 128, 512, 64), cuda_options());
  const std::string ptx = exe.ptx();
  INFO(ptx);
  CHECK(entries(ptx) == 1);
  CHECK(count(ptx, "st.global.") == 6);
  check_assembles(ptx, "attention_backward_row");
}

TEST_CASE("gpu ptx: a bias gradient viewed as [n] is summed into its output: no copy kernel") {
  // Autograd's bias gradient: a sum over the rows with keepdim ([1, 1, n]) viewed as [n]. The
  // rounded sum was written to a temporary and copied into the output by a kernel of its own
  // (a launch per bias and layer norm parameter per step); the output buffer now takes the
  // temporary's place, expanded back to [1, 1, n].
  auto graph = [](const std::vector<int64_t>& x_shape) {
    ir::Graph g;
    ir::Value x = g.input(DType::Float32, x_shape);
    OpAttrs a;
    a.dims = {0, 1};
    a.keepdim = true;
    OpAttrs v;
    v.dims = {x_shape[2]};
    g.output(g.op(OpKind::View, {g.op(OpKind::Sum, {x}, a)}, v));
    return g;
  };
  codegen::Executable exe(graph({2, 64, 768}), cuda_options());
  INFO(exe.ptx());
  // Zeroing the float64 sums, adding the rows and rounding: one kernel, a thread per column
  // (fuse_same_domain_loops; they were 3).
  CHECK(entries(exe.ptx()) == 1);
  check_assembles(exe.ptx(), "bias_grad");
  codegen::CompileOptions cpu;
  cpu.disk_cache = false;
  Tensor x = randn({3, 5, 7});
  Tensor out = codegen::Executable(graph({3, 5, 7}), cpu).run({x}).at(0);
  Tensor ref = sum(x.to(DType::Float64), {0, 1}).to(DType::Float32);
  CHECK(out.shape() == Shape{7});
  CHECK(out.to_vector<float>() == ref.to_vector<float>());
}

TEST_CASE("gpu ptx: a row max viewed as [rows] keeps its warp per row, in the output buffer") {
  // The keepdim max is computed in the output expanded back to [rows, 1] (forward_output_copies,
  // above); the row-lanes rewrite must still see that buffer as the loops' own (own_buffer:
  // a reshape of an argument that nothing else uses), or each row got a thread of its own.
  ir::Graph g;
  ir::Value x = g.input(DType::Float32, {4096, 1024});
  OpAttrs a;
  a.dims = {1};
  a.keepdim = true;
  OpAttrs v;
  v.dims = {4096};
  g.output(g.op(OpKind::View, {g.op(OpKind::Amax, {x}, a)}, v));
  codegen::Executable exe(g, cuda_options());
  INFO(exe.ptx());
  CHECK(entries(exe.ptx()) <= 2);
  CHECK(count(exe.ptx(), "shfl.sync.bfly") == 5);  // a float32 max over 32 lanes
  check_assembles(exe.ptx(), "row_max_viewed");
}

TEST_CASE("gpu ptx: with kernel timers each kernel is described by its graph ops and lines") {
  ir::Graph g;
  OpAttrs a;
  a.dim = -1;
  ir::Value x = g.input(DType::Float32, {512, 4096});
  const int softmax_line = __LINE__ + 1;
  ir::Value y = g.op(OpKind::Softmax, {x}, a);
  const int sum_line = __LINE__ + 1;
  g.output(g.op(OpKind::Sum, {g.op(OpKind::Mul, {y, x})}));
  codegen::CompileOptions o = cuda_options();
  o.profile_kernels = true;
  codegen::Executable exe(g, o);
  const std::vector<std::string> kernels = exe.kernel_descriptions();
  INFO(exe.ptx());
  REQUIRE(static_cast<int>(kernels.size()) == entries(exe.ptx()));
  bool softmax = false, sum = false;
  for (const std::string& k : kernels) {
    INFO(k);
    const std::string name = k.substr(0, k.find(':'));
    CHECK(count(exe.ptx(), ".entry " + name + "(") == 1);  // a kernel of the PTX
    softmax = softmax || (k.find("softmax") != std::string::npos &&
                          k.find("gpu_ptx_test.cpp:" + std::to_string(softmax_line)) !=
                              std::string::npos);
    sum = sum || (k.find("sum") != std::string::npos &&
                  k.find("gpu_ptx_test.cpp:" + std::to_string(sum_line)) != std::string::npos);
  }
  CHECK(softmax);
  CHECK(sum);
  // The descriptions come back from the disk cache.
  char dir[] = "/tmp/kiln-gpu-kernel-ops-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  codegen::CompileOptions cached = o;
  cached.disk_cache = true;
  cached.cache_dir = dir;
  codegen::clear_memory_cache();
  codegen::Executable first(g, cached);
  codegen::clear_memory_cache();
  codegen::Executable loaded(g, cached);
  if (!first.stats().disk_note.starts_with("disabled")) {  // KILN_DISABLE_CACHE=1 is set
    CHECK(loaded.stats().source == codegen::CompileStats::Source::DiskCache);
    CHECK(loaded.kernel_descriptions() == kernels);
  }
  std::filesystem::remove_all(dir);
  // Without timers: no descriptions, and the same kernels.
  codegen::Executable plain(g, cuda_options());
  if (!codegen::kernel_profiling(cuda_options())) CHECK(plain.kernel_descriptions().empty());
  CHECK(entries(plain.ptx()) == entries(exe.ptx()));
}
