#pragma once
/// kiln's neural-network library: modules, initialisation, optimisers, safetensors I/O.
#include "kiln/kiln.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/serialize.h"
#include "nn/transformer.h"

namespace kiln {

/// compile() of a module's forward: `auto cm = kiln::compile(model); Tensor y = cm(x);`. The
/// module is used by reference (it must outlive the compiled function); its parameters are
/// captured tensors (guarded, graph inputs), so optimizer steps do not recompile. The training
/// flag of every module whose forward reads it (Module::is_training(): Dropout, the
/// Transformer layers) is guarded: `module.eval()` / `train()` after compiling selects the
/// entry traced in that mode (tracing it on first use). So are the settings a forward reads
/// (Module::setting: Dropout's p, LayerNorm's eps, ...).
template <class M>
  requires std::derived_from<M, nn::Module>
auto compile(M& module, CompileOptions options = {}, Loc loc = Loc::current()) {
  std::string name = module.name();
  return kiln::compile([&module](const Tensor& x) { return module.forward(x); },
                       std::move(options), std::move(name), loc);
}

}  // namespace kiln
