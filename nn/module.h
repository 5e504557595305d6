#pragma once
/// nn::Module: named parameters, buffers and submodules; train/eval; state_dict save/load.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln::nn {

/// An ordered name → tensor map ("layer1.weight" → tensor), as PyTorch's state_dict.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

/// The keys a non-strict load did not match, as PyTorch's load_state_dict returns them:
/// `missing_keys` of the destination absent from the dict, `unexpected_keys` of the dict the
/// destination lacks.
struct IncompatibleKeys {
  std::vector<std::string> missing_keys, unexpected_keys;
};

/// Copies each tensor of `src` into the tensor of `dst` with the same key (in place, under
/// no_grad, converted to the destination's dtype and device), so that whoever holds the
/// destination tensors (a module, an optimizer, a compiled step) sees the values. Shapes must
/// match. With `strict`, missing and unexpected keys are an error listing all of them. Throws
/// kiln::Error named `op` at `loc`; everything is checked before the first copy, so a failed
/// load leaves every destination tensor as it was.
IncompatibleKeys load_state_into(const StateDict& dst, const StateDict& src, bool strict,
                                 const char* op, Loc loc);

class Module {
 public:
  virtual ~Module() = default;

  /// The module's computation on one tensor. Modules with other signatures (e.g.
  /// MultiheadAttention) throw kiln::Error here and offer their own forward.
  virtual Tensor forward(const Tensor& x);
  /// forward(x), with errors raised inside kiln's code (a Linear given the wrong width) naming
  /// the caller's line, as PyTorch's `model(x)` is the call and `forward` the definition
  /// (calling forward(x) directly works too, but such errors then name the module's source).
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) {
    return at_user_line(loc, [&] { return forward(x); });
  }

  /// Parameters of this module and (if recurse) its submodules, in registration order, with
  /// dotted names ("0.weight"). A tensor registered under several names (tied weights) is
  /// listed once, under its first name, as in PyTorch (state_dict() lists every name).
  StateDict named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  StateDict named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const {
    return children_;
  }

  /// Sets training mode here and in every submodule (affects Dropout). `loc` names the call in
  /// explain() where a compiled function makes it.
  virtual void train(bool on = true, Loc loc = Loc::current());
  void eval(Loc loc = Loc::current()) { train(false, loc); }
  /// Whether the module is in training mode. Inside a compiled function (kiln::compile of the
  /// module, or of a function that calls it) the read is a guarded host value, like
  /// kiln::guarded: the compiled function checks the flag on every call, so train() / eval()
  /// after compiling traces again (or replays the entry traced in that mode), as
  /// torch.compile does. Modules that read their mode must read it here. explain() names the
  /// guard with `loc`, or the user's line of the module call when the read is kiln's own.
  bool is_training(Loc loc = Loc::current()) const;
  /// Lives as long as this module (copies get their own): compile() guards a module argument
  /// by its address and this token, so a new module built where a destroyed one was (an
  /// optional's emplace, a stack object in a loop) traces again instead of replaying the old
  /// module's weights.
  std::weak_ptr<const void> lifetime_token() const { return alive_.token; }

  /// Sets .grad of every parameter to undefined.
  void zero_grad();

  /// Moves every parameter and buffer (and the submodules') to `device`, in place like
  /// PyTorch's module.to(device): the handles the module and the caller hold now refer to the
  /// device copy (contiguous), requires_grad is kept and .grad is dropped. Throws kiln::Error
  /// ("no CUDA device: ...") when the device is not available; nothing is moved then.
  void to(Device device, Loc loc = Loc::current());

  /// Parameters and buffers by dotted name. A tied tensor appears under every name it is
  /// registered as ("enc.weight" and "dec.weight"), as PyTorch's state_dict.
  StateDict state_dict() const;
  /// Copies values from `dict` into this module's tensors (load_state_into). A tied tensor is
  /// copied once per name, in state_dict() order (the last name's value wins, as in PyTorch,
  /// which does not compare them). Returns the keys that did not match (strict=false).
  IncompatibleKeys load_state_dict(const StateDict& dict, bool strict = true,
                                   Loc loc = Loc::current());
  /// Saves state_dict() as a safetensors file (see nn/serialize.h).
  void save(const std::string& path, Loc loc = Loc::current()) const;
  /// Loads a safetensors file written by save() (or by PyTorch's safetensors).
  IncompatibleKeys load(const std::string& path, bool strict = true, Loc loc = Loc::current());

  /// Class name, e.g. "Linear".
  virtual std::string name() const = 0;

  /// Registers a parameter (made to require grad) under `name` and returns the same handle;
  /// the module's member and the registry share the tensor, and updates happen in place. A
  /// name already registered is replaced in place (its position in state_dict() is kept), as
  /// libtorch's register_parameter: this is how to tie or swap a parameter from outside.
  ///
  /// Pitfall: the registry cannot see assignments to a member. `head->weight = emb->weight`
  /// makes head's forward use emb's tensor while parameters(), state_dict() and save() keep the
  /// old one (PyTorch's __setattr__ re-registers; C++ cannot), and a compiled function that
  /// captured the old tensor replays it while that tensor lives (compile() guards a captured
  /// tensor by identity; `check = true` reports the difference). Tie weights by re-registering:
  ///   head->weight = head->register_parameter("weight", emb->weight);
  /// (parameters() then lists the shared tensor once; state_dict() under both names.)
  /// A tensor with autograd history (`a * 2`) is registered detached, as a leaf (as PyTorch's
  /// nn.Parameter(a * 2)): use the tensor returned. Throws kiln::Error when `name` is a
  /// buffer's or a submodule's (as PyTorch's KeyError), empty or holds a '.'.
  Tensor register_parameter(const std::string& name, Tensor t, Loc loc = Loc::current());
  /// Registers (or, for a name already registered, replaces) a buffer: state that is saved
  /// and moved with the module but not trained. A non-persistent buffer (PyTorch's
  /// persistent=False: a cache such as a causal mask) is moved but left out of state_dict().
  /// Throws kiln::Error when `name` is a parameter's or a submodule's, empty or holds a '.'.
  Tensor register_buffer(const std::string& name, Tensor t, bool persistent = true,
                         Loc loc = Loc::current());

 protected:
  /// Returns `field`, a setting of this module that its forward reads (Dropout's p, LayerNorm's
  /// eps, GELU's approximate). Inside a compiled function the read is a guarded host value,
  /// like is_training(), named "<Class>.<what>" in explain(): a setting changed after
  /// compiling traces again (or replays the entry traced with that value) instead of replaying
  /// the value the first trace saw, as torch.compile guards module attributes. explain() names
  /// the guard with `loc`, or the user's line of the module call when the read is kiln's own.
  double setting(const double& field, const char* what, Loc loc = Loc::current()) const;
  bool setting(const bool& field, const char* what, Loc loc = Loc::current()) const;
  const std::string& setting(const std::string& field, const char* what,
                             Loc loc = Loc::current()) const;
  int64_t setting(const int64_t& field, const char* what, Loc loc = Loc::current()) const;
  const Shape& setting(const Shape& field, const char* what, Loc loc = Loc::current()) const;

  /// Inside a compiled function: guards this module's submodules (which objects, in which
  /// order) as they are now, so that a change (Sequential::push_back after compile()) traces
  /// again instead of replaying the old layers. Containers call it in forward. No-op outside
  /// a trace.
  void guard_submodules(Loc loc = Loc::current()) const;

  /// Registers (or, for a name already registered, replaces, as PyTorch's add_module) submodule
  /// `m` under `name`: its parameters and buffers are this module's as "name.<theirs>". Returns
  /// `m`. Throws kiln::Error when `m` is null, when `name` is empty, or when it is a
  /// parameter's or buffer's name. It may hold dots (containers' "layers.0").
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m,
                                     Loc loc = Loc::current()) {
    KILN_CHECK(m != nullptr, "register_module", loc, "submodule \"{}\" is null", name);
    put_child(name, m, loc);
    return m;
  }

 private:
  /// register_module's work: checks the name, replaces a child of that name or appends.
  void put_child(const std::string& name, std::shared_ptr<Module> m, Loc loc);
  void collect(const std::string& prefix, bool recurse, bool params, bool dedup,
               StateDict& out) const;

  // The training flag in a cell of its own, so a compiled function's guard can keep reading it
  // even after the module is gone (a module built inside the compiled function). A copy of a
  // module gets its own cell.
  struct Flag {
    std::shared_ptr<bool> cell = std::make_shared<bool>(true);
    Flag() = default;
    Flag(const Flag& o) : cell(std::make_shared<bool>(*o.cell)) {}
    Flag& operator=(const Flag& o) {
      *cell = *o.cell;
      return *this;
    }
  };
  Flag training_;
  // Alive while this module is: a compiled function's guard on a setting() reads the field
  // through it, and traces again once the module is gone. A copy gets its own token.
  struct Alive {
    std::shared_ptr<const int> token = std::make_shared<const int>(0);
    Alive() = default;
    Alive(const Alive&) {}
    Alive& operator=(const Alive&) { return *this; }
  };
  Alive alive_;
  StateDict params_, buffers_;
  std::vector<std::string> non_persistent_;  // names of buffers state_dict() leaves out
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace kiln::nn
