#pragma once
/// Internal: automatic dynamic shapes and scalars by comparing two traces.
///
/// When a call misses only because of sizes (or host-scalar values), the function is traced
/// again and the new trace is compared with the old one, op by op. Every integer that differs
/// (a dim of a value, a view's target shape, a slice bound) must be the same multiple of one of
/// the changed argument dims, or of the product of two, in both traces; every wrapped constant
/// that differs must equal a changed host-scalar argument in both, or be such a multiple, or a
/// number over a changed dim (SizeOf); a tensor made from host data must be unchanged, an
/// `empty` that fill_/copy_ overwrites, or an integer arange; random ops' generator offsets
/// must follow their sizes. Then those become symbolic (SymInt / ScalarArg / SizeOf / sized
/// snapshots / Node::rng_draws) and the new specialisation serves every size. Anything else
/// that differs (another op, a host value computed otherwise from a size, a read value) keeps
/// the specialisation static.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tracer/program.h"

namespace kiln::tracer {

/// An earlier trace of the function, at argument sizes `shapes`. Two traces whose sizes changed
/// together (batch and length) fit several formulas (T - 1 and -2 * B + 8); earlier traces
/// that ran the same ops pick among them.
struct Witness {
  std::shared_ptr<const Program> program;
  std::vector<Shape> shapes;
  std::vector<Scalar> scalars;  ///< its host-scalar arguments by position
};

/// Makes `nw` symbolic in `dims` ((argument, dim)) and `scalars` (argument positions) by
/// comparison with `old`; where several formulas fit both, the first that also fits the
/// `earlier` traces (else the first). Returns "" on success, else why not (then `nw` is left
/// usable as a static specialisation).
std::string generalize(Program& nw, const Program& old, const std::vector<Shape>& new_shapes,
                       const std::vector<Shape>& old_shapes,
                       const std::vector<Scalar>& new_scalars,
                       const std::vector<Scalar>& old_scalars,
                       const std::vector<std::pair<int, int>>& dims,
                       const std::vector<int>& scalars, const std::vector<Witness>& earlier);

/// Empty when `trace` (a fresh trace of a call whose tensor arguments have `shapes` and whose
/// host scalars are `scalars`) is what the symbolic program `sym` computes at those sizes: the
/// same ops, every size / bound / view shape equal to its symbolic formula, the same
/// constants. Else the first difference. Automatic dynamic shapes infer formulas from two traces
/// and cannot see the C++ arithmetic that made an integer (`x.size(0) / 2` is 1 for sizes 2
/// and 3), so a symbolic specialisation is checked this way once per new size set. The value of a
/// host-scalar argument made dynamic is part of that set (sizes_key in function.cpp): host code
/// may branch on it, so each new value is confirmed once too (a number that changes on every
/// call belongs in a 0-d tensor).
std::string conforms(const Program& trace, const Program& sym, const std::vector<Shape>& shapes,
                     const std::vector<Scalar>& scalars);

/// Whether `a` and `b` ran the same ops on the same values, apart from the integers sizes may
/// change and wrapped constants: traces of one code path at two sizes.
bool same_ops(const Program& a, const Program& b);

/// The size formulas of symbolic program `p` that are more than an argument's size, for
/// explain(): "slice at model.cpp:12 end = (s0.0 + 1) / 2; a constant used by mul at
/// model.cpp:13 = 1 / sqrt(s0.0)", at most `limit` of them. s<a>.<d>: dim d of tensor
/// argument a; arg<a>: host-integer argument a.
std::string describe_formulas(const Program& p, size_t limit = 6);

/// The host-scalar arguments whose values symbolic sizes of `p` are made of (SymInt::scalar).
std::vector<int> size_scalars(const Program& p);

/// For CompileOptions::check when compiled and eager differ although a fresh trace, compiled,
/// matches eager op by op: the first way the `replayed` specialisation's trace differs from a
/// `fresh` recording of the same call — another op (a C++ branch on state the tracer cannot
/// see), a wrapped constant or op attribute with another value (a host number read in C++),
/// another captured tensor, or a tensor made from host data that has changed. "" if none.
std::string stale_trace_difference(const Program& replayed, const Program& fresh);

/// Whether an op of `p` broadcast a size-1 dim of an input to another size, or squeezed one
/// away. A marked dim traced at size 1 then stays specialised: compiled code built with it
/// symbolic took it for the size it broadcast against (a reduction over the broadcast dim
/// summed one column), or kept the dim squeeze dropped.
bool broadcasts_size_one(const Program& p);

/// Marks dims symbolic from the first trace (CompileOptions::dynamic_dims / Dynamic::Always):
/// the arguments' dims, and every value dim / shape attribute equal to the traced size when
/// that size is >= 2. Optimistic: a replay that fails with these sizes re-traces.
void mark_symbolic(Program& p, const std::vector<Shape>& shapes,
                   const std::vector<std::pair<int, int>>& dims);

}  // namespace kiln::tracer
