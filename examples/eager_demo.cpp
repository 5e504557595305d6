// A short tour of kiln's eager API: every op runs the moment it is called.
//
// Each section catches kiln::Error and prints it, so the tour runs to the end even in a
// build where some CPU kernels are still missing (those sections print the error instead).
#include <functional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kiln/kiln.h"

using kiln::Tensor;

namespace {

int failed_sections = 0;

/// Prints a heading and runs one section; a kiln::Error ends only that section.
void section(std::string_view title, const std::function<void()>& body) {
  fmt::print("\n=== {} ===\n", title);
  try {
    body();
  } catch (const kiln::Error& e) {
    ++failed_sections;
    fmt::print("  (section stopped) {}\n", e.what());
  }
}

/// "name = <tensor>"; a multi-line repr starts on its own line so its columns line up.
void show(std::string_view name, const Tensor& t) {
  std::string repr = t.str();
  fmt::print("{} ={}{}\n", name, repr.find('\n') == std::string::npos ? " " : "\n", repr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {  // it takes no arguments: say so rather than ignore them
    const std::string_view a = argv[1];
    const bool help = a == "--help" || a == "-h";
    fmt::print(help ? stdout : stderr,
               "{}usage: eager_demo   (no arguments)\nRuns kiln's eager ops, autograd and nn "
               "modules on small tensors and prints each result.\n",
               help ? "" : fmt::format("eager_demo: unexpected argument '{}'\n", a));
    return help ? 0 : 2;
  }
  section("factories", [] {
    show("zeros({2, 3})", kiln::zeros({2, 3}));
    show("arange(6)", kiln::arange(6));  // integer bounds: int64
    show("linspace(0, 1, 5)", kiln::linspace(0, 1, 5));
    show("full({2, 2}, 7.5)", kiln::full({2, 2}, 7.5));
    show("eye(3)", kiln::eye(3));
    show("tensor({{1.f, 2.f}, {3.f, 4.f}})", kiln::tensor({{1.f, 2.f}, {3.f, 4.f}}));
  });

  section("views share storage: writes go through", [] {
    Tensor m = kiln::arange(6, kiln::Float32).view({2, 3});
    show("m", m);
    Tensor mt = m.t();  // no copy: the strides are swapped
    fmt::print("m.t() is contiguous: {}\n", mt.is_contiguous());
    mt.select(0, 2).fill_(-1);  // column 2 of m
    m.slice(1, 0, 2).select(0, 0).fill_(9);  // row 0, columns 0..1
    show("m after writing through m.t() and m.slice(...)", m);
  });

  section("broadcasting arithmetic", [] {
    Tensor a = kiln::arange(6, kiln::Float32).view({2, 3});
    Tensor row = kiln::tensor({10.f, 20.f, 30.f});  // [3] broadcasts over [2, 3]
    Tensor col = kiln::tensor({{1.f}, {2.f}});      // [2, 1] broadcasts over [2, 3]
    show("a + row", a + row);
    show("a * col - 1", a * col - 1);
  });

  section("reductions", [] {
    Tensor a = kiln::arange(6, kiln::Float32).view({2, 3});
    show("a.sum()", a.sum());
    show("sum(a, {1})", kiln::sum(a, {1}));
    show("a.mean({0})", a.mean({0}));
    show("amax(a, {1})", kiln::amax(a, {1}));
  });

  section("softmax", [] {
    Tensor logits = kiln::tensor({{1.f, 2.f, 3.f}, {1.f, 1.f, 1.f}});
    Tensor p = kiln::softmax(logits, -1);
    show("softmax(logits, -1)", p);
    show("rows sum to", p.sum({1}));
  });

  section("matmul", [] {
    Tensor a = kiln::arange(6, kiln::Float32).view({2, 3});
    Tensor b = kiln::ones({3, 2});
    show("a @ ones({3, 2})", kiln::matmul(a, b));
    show("a @ a.t()", a.matmul(a.t()));
  });

  section("type promotion (as in PyTorch)", [] {
    fmt::print("promote_types(int32, float32) = {}\n",
               kiln::name(kiln::promote_types(kiln::Int32, kiln::Float32)));
    fmt::print("promote_types(int32, int64)   = {}\n",
               kiln::name(kiln::promote_types(kiln::Int32, kiln::Int64)));
    Tensor ints = kiln::tensor({1, 2, 3});  // int32
    show("int32 tensor + 2.5", ints + 2.5);  // a float scalar makes it float32, not float64
    show("int32 tensor + 2", ints + 2);      // an int scalar keeps int32
    show("int32 tensor / 2", ints / 2);      // true division: float32
  });

  section("errors name the op, the problem and your line", [] {
    try {
      Tensor a = kiln::zeros({2, 3}), b = kiln::zeros({4, 5});
      kiln::matmul(a, b);  // inner dims 3 and 4 do not match
    } catch (const kiln::Error& e) {
      fmt::print("caught kiln::Error: {}\n", e.what());
      fmt::print("  op: {}, line: {} (the matmul call above, not a line inside kiln)\n", e.op(),
                 e.where().line());
    }
  });

  fmt::print("\n{}\n", failed_sections
                           ? fmt::format("{} section(s) stopped on a kiln::Error (see above).",
                                         failed_sections)
                           : std::string("done."));
  return failed_sections ? 1 : 0;  // a stopped section is a bug once every kernel exists
}
