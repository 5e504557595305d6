#pragma once
// Differential fuzzing of kiln::compile against eager mode: a seeded random-program generator,
// an interpreter (eager or under kiln::compile), a runner that compares the two, a shrinker
// (delta debugging over ops, then shapes) and a printer that writes a failing program as a
// standalone C++ repro. See tests/fuzz/README.md.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::fuzz {

enum class Op : uint8_t {
  Unary, Cast, Binary, BinScalar, Compare, Where, Transpose, Permute, Slice, Flatten, Reshape,
  Unsqueeze, Expand, Select, Contiguous, Reduce, Matmul, MatmulT, Softmax, LayerNorm, InPlace,
  Branch, ItemScale,
  kCount
};

/// One op: reads values a, b, c (-1: none) and writes one new value (an in-place op's new value
/// is its target, the same tensor). p: small op-specific parameters, resolved against the
/// operands' ranks/sizes when the op runs (so a program stays valid when input sizes change).
struct Node {
  Op op = Op::Unary;
  int a = -1, b = -1, c = -1;
  int p[4] = {0, 0, 0, 0};
};

/// An argument: dtype and dims; a dim >= 0 is a size symbol (its value per phase), -1 is size 1,
/// -2 is size 0. Symbols make broadcasting partners change size together.
struct Arg {
  DType dtype = DType::Float32;
  std::vector<int> dims;
};

/// A program over values: values 0..args-1 are the arguments, value args.size()+i is node i's.
struct Program {
  std::vector<Arg> args;
  /// Symbol values per phase: phase 0 (A) first traced, 1 (B) changed sizes (recompile,
  /// automatic dynamic), 2 (C) a third size (replay of the symbolic entry).
  std::vector<std::vector<int64_t>> sym;
  std::vector<Node> nodes;
  std::vector<int> outputs;
  uint64_t data_seed = 0;
  int phases = 3;  ///< how many of the phases to run (the shrinker may drop B and C)
};

/// Generates program `index` of stream `seed` (deterministic). `large`: a stream of its own
/// whose first size symbol is 63 to 1,006 (rows and columns long enough for the CPU's row
/// blocks, row prefetch and vector-width hints), used at most once per argument, and whose
/// values stay under 2^21 elements.
Program generate(uint64_t seed, uint64_t index, bool large = false);

/// The argument tensors of `phase` (deterministic from data_seed and phase).
std::vector<Tensor> make_inputs(const Program& p, int phase);

/// Runs the program on `args` (in-place ops write into them). If `code` is given, appends the
/// C++ statements executed (one per node). Throws what the ops throw.
std::vector<Tensor> interpret(const Program& p, std::vector<Tensor> args,
                              std::vector<std::string>* code = nullptr);

struct Tolerance {
  // |compiled - eager| <= atol * scale + rtol * |eager|, scale = max(1, max |eager| finite).
  double rtol32 = 1e-4, atol32 = 1e-5;
  double rtol64 = 1e-10, atol64 = 1e-12;
};

/// Runs the program eagerly and compiled (fresh kiln::compile; calls A, A, B, B, C, C) and
/// returns "" when every call agrees, else a description of the first difference.
std::string check(const Program& p, const Tolerance& tol = {});

/// A check: "" when the program passes, else what failed.
using Checker = std::function<std::string(const Program&)>;

/// Delta debugging: a smaller program for which `fails` still reports a failure (default:
/// check(p, tol)). `budget`: max checks.
Program shrink(const Program& p, const Tolerance& tol = {}, int budget = 400,
               const Checker& fails = nullptr);

/// The program as one line of integers, and back (kiln-fuzz --program FILE; the shrinker of
/// crashes runs each candidate in a child process).
std::string serialize(const Program& p);
Program deserialize(const std::string& text);

/// A standalone C++ program (kiln's public API) reproducing `p`'s failing calls.
std::string to_cpp(const Program& p, const std::string& failure);

/// A one-line summary (ops, shapes) for logs.
std::string summary(const Program& p);

}  // namespace kiln::fuzz
