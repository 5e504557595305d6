#include "tracer/generalize.h"

#include <cmath>
#include <cstring>
#include <optional>

namespace kiln::tracer {
namespace {

bool same(const Scalar& a, const Scalar& b) {
  if (a.kind() != b.kind()) return false;
  if (a.is_floating()) {
    double x = a.to<double>(), y = b.to<double>();
    return std::memcmp(&x, &y, sizeof x) == 0;
  }
  return a.to<int64_t>() == b.to<int64_t>();
}

// Attributes other than sizes / bounds / random counters must match exactly.
bool same_fixed_attrs(const OpAttrs& a, const OpAttrs& b) {
  return a.all_dims == b.all_dims && a.keepdim == b.keepdim && a.dim == b.dim &&
         a.dim1 == b.dim1 && a.step == b.step && same(a.alpha, b.alpha) && same(a.beta, b.beta) &&
         a.has_low == b.has_low && a.has_high == b.has_high && a.eps == b.eps && a.p == b.p &&
         a.mode == b.mode && a.ignore_index == b.ignore_index && a.dtype == b.dtype &&
         same(a.low, b.low) && same(a.high, b.high) && a.dims.size() == b.dims.size();
}

// Ops whose attrs.dims hold sizes (not dim indices or a permutation).
bool dims_are_sizes(OpKind op) {
  return op == OpKind::View || op == OpKind::Expand || op == OpKind::LayerNorm ||
         op_info(op).category == OpCategory::Random;
}

struct Explainer {
  const std::vector<Shape>& nsh;
  const std::vector<Shape>& osh;
  const std::vector<std::pair<int, int>>& dims;
  // The symbolic int with new == f * new_size and old == f * old_size, if any.
  bool operator()(int64_t nv, int64_t ov, SymInt& out) const {
    for (auto [a, d] : dims) {
      int64_t ns = nsh[a][d], os = osh[a][d];
      if (ns == os || ns <= 0 || os <= 0) continue;
      if (nv % ns == 0 && ov % os == 0 && nv / ns == ov / os && nv / ns != 0) {
        out = {a, d, nv / ns};
        return true;
      }
    }
    return false;
  }
};

bool same_contents(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), x.numel() * x.itemsize()) == 0;
}

// Empty when `a` and `b` ran the same ops on the same values, apart from integers that sizes
// may change (value dims, view sizes, slice bounds) and wrapped constants; else the difference.
std::string same_structure(const Program& a, const Program& b) {
  if (a.nodes.size() != b.nodes.size() || a.values.size() != b.values.size() ||
      a.sources.size() != b.sources.size())
    return "the two traces have different ops";
  for (size_t v = 0; v < a.values.size(); ++v)
    if (a.values[v].dtype != b.values[v].dtype || a.values[v].shape.size() != b.values[v].shape.size() ||
        a.values[v].source != b.values[v].source)
      return fmt::format("value %{} differs in dtype or rank", v);
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const Node& n = a.nodes[i];
    const Node& o = b.nodes[i];
    if (n.kind != o.kind || n.op != o.op || n.in != o.in || n.out != o.out ||
        n.in_place != o.in_place || n.rng_delta != o.rng_delta)
      return fmt::format("op #{} differs", i);
    if (n.kind == Node::Kind::Read) {
      if (!same(n.read_value, o.read_value)) return "a host read saw a different value";
      continue;
    }
    if (n.kind != Node::Kind::Op) continue;
    if (!same_fixed_attrs(n.attrs, o.attrs))
      return fmt::format("attributes of op #{} ({}) differ", i, op_name(n.op));
    for (int k = 0; k < n.attrs.dims.size(); ++k)
      if (!dims_are_sizes(n.op) && n.attrs.dims[k] != o.attrs.dims[k])
        return fmt::format("a shape attribute of {} is not symbolic", op_name(n.op));
  }
  for (size_t s = 0; s < a.sources.size(); ++s) {
    const Source& ns = a.sources[s];
    const Source& os = b.sources[s];
    bool scalar_kinds = (ns.kind == SourceKind::Constant || ns.kind == SourceKind::ScalarArg) &&
                        (os.kind == SourceKind::Constant || os.kind == SourceKind::ScalarArg);
    if (!scalar_kinds && (ns.kind != os.kind || ns.index != os.index))
      return "the traces' inputs differ";
    if (ns.kind == SourceKind::Captured &&
        (ns.captured.owner_before(os.captured) || os.captured.owner_before(ns.captured)))
      return "a different tensor was captured";
  }
  if (a.outputs != b.outputs || a.write_backs != b.write_backs ||
      a.grad_assignments != b.grad_assignments ||
      a.grad_undefined_at_call != b.grad_undefined_at_call || a.grad_reach != b.grad_reach ||
      a.args_sharing_captured != b.args_sharing_captured ||
      a.rng_consumed != b.rng_consumed ||
      a.backward_begin != b.backward_begin || a.aliased_mutation != b.aliased_mutation ||
      a.output_constants.size() != b.output_constants.size())
    return "the traces' results differ";
  for (size_t k = 0; k < a.output_constants.size(); ++k)
    if (!same(a.output_constants[k], b.output_constants[k]))
      return "a host value returned by the function depends on the sizes";
  return {};
}

}  // namespace

std::string generalize(Program& nw, const Program& old, const std::vector<Shape>& new_shapes,
                       const std::vector<Shape>& old_shapes,
                       const std::vector<Scalar>& new_scalars,
                       const std::vector<Scalar>& old_scalars,
                       const std::vector<std::pair<int, int>>& dims,
                       const std::vector<int>& scalars) {
  if (std::string why = same_structure(nw, old); !why.empty()) return why;
  for (auto [a, d] : dims) {
    if (a >= int(new_shapes.size()) || a >= int(old_shapes.size()) || d >= new_shapes[a].size() ||
        d >= old_shapes[a].size())
      return "an argument changed rank";
    if (new_shapes[a][d] != old_shapes[a][d] && (new_shapes[a][d] < 2 || old_shapes[a][d] < 2))
      return "a changed size is 0 or 1 (specialised, as broadcasting depends on it)";
  }
  Explainer explain{new_shapes, old_shapes, dims};
  Program g = nw;  // work on a copy; commit on success
  for (size_t v = 0; v < g.values.size(); ++v) {
    ValueInfo& nv = g.values[v];
    const ValueInfo& ov = old.values[v];
    nv.sym.assign(nv.shape.size(), SymInt{});
    for (int d = 0; d < nv.shape.size(); ++d) {
      if (nv.shape[d] == ov.shape[d]) continue;
      if (!explain(nv.shape[d], ov.shape[d], nv.sym[d]))
        return fmt::format("a size ({} vs {}) is not a multiple of a changed argument size",
                           nv.shape[d], ov.shape[d]);
    }
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    const Node& o = old.nodes[i];
    if (n.kind != Node::Kind::Op) continue;
    n.sym_attrs.clear();
    auto check = [&](int64_t a, int64_t b, SymAttr::Field f, int idx) {
      if (a == b) return true;
      SymAttr s{f, idx, {}};
      if (!explain(a, b, s.sym)) return false;
      n.sym_attrs.push_back(s);
      return true;
    };
    for (int k = 0; k < n.attrs.dims.size(); ++k)
      if (!check(n.attrs.dims[k], o.attrs.dims[k], SymAttr::Dims, k))
        return fmt::format("a shape attribute of {} is not symbolic", op_name(n.op));
    if (!check(n.attrs.start, o.attrs.start, SymAttr::Start, 0) ||
        !check(n.attrs.end, o.attrs.end, SymAttr::End, 0))
      return fmt::format("a bound of {} is not symbolic", op_name(n.op));
  }
  for (size_t s = 0; s < g.sources.size(); ++s) {
    Source& ns = g.sources[s];
    const Source& os = old.sources[s];
    if (ns.kind == SourceKind::Snapshot) return "the function creates tensors from host data";
    if (ns.kind != SourceKind::Constant || same(ns.scalar, os.scalar)) continue;
    bool found = false;
    for (int a : scalars)
      if (a < int(new_scalars.size()) && same(ns.scalar, new_scalars[a]) &&
          same(os.scalar, old_scalars[a])) {
        ns.kind = SourceKind::ScalarArg;
        ns.index = a;
        found = true;
        break;
      }
    if (!found)
      return fmt::format("a constant ({} vs {}) is not a host-scalar argument", ns.scalar.str(),
                         os.scalar.str());
  }
  nw = std::move(g);
  return {};
}

std::string conforms(const Program& trace, const Program& sym, const std::vector<Shape>& shapes,
                     const std::vector<Scalar>& scalars) {
  if (std::string why = same_structure(trace, sym); !why.empty()) return why;
  auto at = [&](const SymInt& s) -> std::optional<int64_t> {
    if (s.arg < 0 || s.arg >= int(shapes.size()) || s.dim >= shapes[s.arg].size())
      return std::nullopt;
    return s.factor * shapes[s.arg][s.dim];
  };
  // Symbolic dims must follow their formulas; static ones are re-inferred and checked by the
  // replay itself (a marked dim traced at size 1 leaves broadcast results static).
  for (size_t v = 0; v < trace.values.size(); ++v) {
    const ValueInfo& tv = trace.values[v];
    const ValueInfo& sv = sym.values[v];
    for (int d = 0; d < tv.shape.size() && d < int(sv.sym.size()); ++d) {
      if (sv.sym[d].arg < 0) continue;
      int64_t expected = at(sv.sym[d]).value_or(-1);
      if (tv.shape[d] != expected)
        return fmt::format("value %{} has size {} in dim {}, the symbolic trace gives {}", v,
                           tv.shape[d], d, expected);
    }
  }
  for (size_t i = 0; i < trace.nodes.size(); ++i) {
    const Node& tn = trace.nodes[i];
    const Node& sn = sym.nodes[i];
    if (tn.kind != Node::Kind::Op) continue;
    OpAttrs expected = sn.attrs;
    for (const SymAttr& s : sn.sym_attrs) {
      int64_t x = at(s.sym).value_or(-1);
      if (s.field == SymAttr::Dims) expected.dims[s.index] = x;
      if (s.field == SymAttr::Start) expected.start = x;
      if (s.field == SymAttr::End) expected.end = x;
    }
    if (tn.attrs.dims != expected.dims || tn.attrs.start != expected.start ||
        tn.attrs.end != expected.end)
      return fmt::format("a size or bound of op #{} ({}) at {}:{} is not what the symbolic trace "
                         "gives", i, op_name(tn.op), tn.loc.file_name(), tn.loc.line());
  }
  for (size_t s = 0; s < trace.sources.size(); ++s) {
    const Source& ts = trace.sources[s];
    const Source& ss = sym.sources[s];
    if (ss.kind == SourceKind::ScalarArg) {
      if (ss.index >= int(scalars.size()) || !same(ts.scalar, scalars[ss.index]))
        return "a constant is no longer the host-scalar argument";
    } else if (ts.kind == SourceKind::Constant) {
      if (ss.kind != SourceKind::Constant || !same(ts.scalar, ss.scalar))
        return fmt::format("a constant changed ({} vs {})", ts.scalar.str(), ss.scalar.str());
    } else if (ts.kind == SourceKind::Snapshot) {
      if (!same_contents(ts.snapshot, ss.snapshot))
        return "a tensor the function created from host data changed";
    }
  }
  return {};
}

void mark_symbolic(Program& p, const std::vector<Shape>& shapes,
                   const std::vector<std::pair<int, int>>& dims) {
  auto match = [&](int64_t v, SymInt& out) {
    for (auto [a, d] : dims)
      if (shapes[a][d] >= 2 && v == shapes[a][d]) {
        out = {a, d, 1};
        return true;
      }
    return false;
  };
  for (ValueInfo& v : p.values) {
    v.sym.assign(v.shape.size(), SymInt{});
    if (v.source >= 0 && p.sources[v.source].kind == SourceKind::Arg) {
      int a = p.sources[v.source].index;
      for (auto [da, d] : dims)
        if (da == a && d < v.shape.size()) v.sym[d] = {a, d, 1};
      continue;
    }
    for (int d = 0; d < v.shape.size(); ++d) match(v.shape[d], v.sym[d]);
  }
  for (Node& n : p.nodes) {
    if (n.kind != Node::Kind::Op || !dims_are_sizes(n.op) ||
        op_info(n.op).category == OpCategory::Random)
      continue;
    for (int k = 0; k < n.attrs.dims.size(); ++k) {
      SymAttr s{SymAttr::Dims, k, {}};
      if (match(n.attrs.dims[k], s.sym)) n.sym_attrs.push_back(s);
    }
  }
}

}  // namespace kiln::tracer
