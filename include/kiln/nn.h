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

/// The forward of a module compiled by compile(module) below.
template <class M>
  requires std::derived_from<M, nn::Module>
struct ModuleForward {
  M* module;
  Tensor operator()(const Tensor& x) const { return module->forward(x); }
};

/// What compile(module) returns: the Compiled forward, called as `cm(x)`. Like
/// Module::operator(), an error raised in kiln's own layer code (a wrong width, a bad index in
/// an Embedding, on the first call or on a replay) names the caller's `cm(x)` line.
template <class M>
class CompiledModule : public Compiled<ModuleForward<M>> {
 public:
  using Compiled<ModuleForward<M>>::Compiled;
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const {
    try {
      return Compiled<ModuleForward<M>>::operator()(x);
    } catch (Error& e) {
      if (inside_kiln(e.where())) e.set_where(loc);
      throw;
    }
  }
};

/// compile() of a module's forward: `auto cm = kiln::compile(model); Tensor y = cm(x);`. The
/// module is used by reference (it must outlive the compiled function); its parameters are
/// captured tensors (guarded, graph inputs), so optimizer steps do not recompile. The training
/// flag of every module whose forward reads it (Module::is_training(): Dropout, the
/// Transformer layers) is guarded: `module.eval()` / `train()` after compiling selects the
/// entry traced in that mode (tracing it on first use). So are the settings a forward reads
/// (Module::setting: Dropout's p, LayerNorm's eps, ...).
template <class M>
  requires std::derived_from<M, nn::Module>
CompiledModule<M> compile(M& module, CompileOptions options = {}, Loc loc = Loc::current()) {
  return CompiledModule<M>(ModuleForward<M>{&module}, std::move(options), module.name(), loc);
}

}  // namespace kiln
