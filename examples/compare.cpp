// Compare eager and compiled runs of real workloads: for each output, the max abs / rel
// difference; when beyond tolerance, the first recorded op whose compiled value diverges from
// eager (op name and source line). kiln::compare runs the function on fresh copies of the
// arguments in both modes, so the workloads' inputs are not changed.
//   build/examples/compare [fusion|mlp|transformer]...     (default: all)
#include <cstring>
#include <iostream>

#include "kiln/nn.h"

using namespace kiln;

namespace {

void report(const std::string& name, const CompareReport& r) {
  fmt::print("== {} ==\n{}\n", name, r.str());
}

void fusion() {
  manual_seed(1);
  Tensor x = randn({256, 1024});
  Tensor w = randn({1024}), b = randn({1024});
  report("x*x + x", kiln::compare([](const Tensor& x) { return x * x + x; }, x));
  report("gelu chain", kiln::compare([](const Tensor& x) { return gelu(x * 0.5 + 1.0) * x; }, x));
  report("softmax(2x)", kiln::compare([](const Tensor& x) { return softmax(x * 2.0, -1); }, x));
  report("layer_norm(x + 1)", kiln::compare(
                           [&](const Tensor& x) { return layer_norm(x + 1.0, {1024}, w, b); }, x));
}

void mlp() {
  manual_seed(2);
  nn::Sequential model{std::make_shared<nn::Linear>(64, 128), std::make_shared<nn::ReLU>(),
                       std::make_shared<nn::Linear>(128, 128), std::make_shared<nn::ReLU>(),
                       std::make_shared<nn::Linear>(128, 10)};
  Tensor x = randn({64, 64});
  Tensor y = randint(0, 10, {64});
  report("MLP 64-128-128-10 forward + cross_entropy",
         kiln::compare([&](const Tensor& x, const Tensor& y) {
           return cross_entropy(model.forward(x), y);
         }, x, y));
}

void transformer() {
  manual_seed(3);
  nn::TransformerEncoderLayerOptions o;
  o.d_model = 256, o.nhead = 4, o.dim_feedforward = 1024, o.activation = "gelu";
  o.batch_first = true;
  nn::TransformerEncoder model(o, 2);
  model.eval();  // no dropout: both modes see the same function
  Tensor x = randn({8, 128, 256});
  report("TransformerEncoder (2 layers) forward",
         kiln::compare([&](const Tensor& x) { return model.forward(x); }, x));
}

}  // namespace

int main(int argc, char** argv) {
  const char* known[] = {"fusion", "mlp", "transformer"};
  for (int i = 1; i < argc; ++i) {
    bool ok = false;
    for (const char* k : known) ok |= std::strcmp(argv[i], k) == 0;
    if (!ok) {
      bool help = std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0;
      fmt::print(help ? stdout : stderr,
                 "{}usage: compare [fusion|mlp|transformer]...   (default: all)\n"
                 "Runs each workload eagerly and compiled and prints, per output, the max abs / "
                 "rel difference and the first diverging op.\n",
                 help ? "" : fmt::format("compare: unknown workload '{}'\n", argv[i]));
      return help ? 0 : 2;
    }
  }
  bool all = argc < 2;
  auto want = [&](const char* name) {
    if (all) return true;
    for (int i = 1; i < argc; ++i)
      if (std::strcmp(argv[i], name) == 0) return true;
    return false;
  };
  if (want("fusion")) fusion();
  if (want("mlp")) mlp();
  if (want("transformer")) transformer();
}
