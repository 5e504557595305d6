#include "nn/module.h"

#include "eager/autograd.h"
#include "eager/dispatch.h"
#include "nn/serialize.h"

namespace kiln::nn {

Tensor Module::forward(const Tensor&) {
  throw Error(name(), "this module's forward takes other arguments; call its own forward");
}

namespace {
// Sets `name` to `t` in `entries`: replaces an existing entry in place, else appends. A name
// of the other kind (a buffer's for a parameter) is an error, as PyTorch's KeyError.
void put(StateDict& entries, const StateDict& other_kind, const char* what,
         const std::string& name, const Tensor& t) {
  for (const auto& [n, old] : other_kind)
    KILN_CHECK(n != name, what, Loc::current(),
               "'{}' is already registered as a {}; a module's parameters and buffers need "
               "different names",
               name, std::string_view(what) == "register_parameter" ? "buffer" : "parameter");
  for (auto& [n, old] : entries)
    if (n == name) {
      if (old.impl() != t.impl()) note_parameter_rebind();  // compiled functions retrace
      old = t;
      return;
    }
  entries.emplace_back(name, t);
}
}  // namespace

Tensor Module::register_parameter(const std::string& n, Tensor t) {
  if (t.defined() && !t.requires_grad()) t.requires_grad_();
  put(params_, buffers_, "register_parameter", n, t);
  return t;
}
void Module::to(Device device, Loc loc) {
  at_user_line(loc, [&] {  // the copies' errors (no CUDA device) name the caller's line
  StateDict all = named_parameters();
  for (auto& entry : named_buffers()) all.push_back(entry);
  std::vector<Tensor> moved;
  {
    NoGradGuard no_grad;
    for (const auto& [n, t] : all)
      moved.push_back(t.defined() ? t.detach().to(device).contiguous() : t);
  }
  // All copies made (an error above leaves the module as it was); now retarget the handles.
  for (size_t i = 0; i < all.size(); ++i) {
    Tensor t = all[i].second;
    if (!t.defined() || t.device() == device) continue;
    TensorImpl* impl = t.impl();
    impl->storage = moved[i].storage();
    impl->strides = moved[i].strides();
    impl->offset = moved[i].offset();
    if (t.grad().defined()) t.set_grad(Tensor());
  }
  });
}

Tensor Module::register_buffer(const std::string& n, Tensor t) {
  put(buffers_, params_, "register_buffer", n, t);
  return t;
}

void Module::collect(const std::string& prefix, bool recurse, bool params, bool dedup,
                     StateDict& out) const {
  // With dedup, a tensor shared by several submodules (tied weights) is listed once, as
  // PyTorch's named_parameters(); its state_dict() lists every name.
  for (const auto& [n, t] : params ? params_ : buffers_) {
    bool seen = false;
    for (const auto& kv : out) seen |= dedup && kv.second.is_same(t);
    if (t.defined() && !seen) out.emplace_back(prefix + n, t);
  }
  if (!recurse) return;
  for (const auto& [n, m] : children_) m->collect(prefix + n + ".", true, params, dedup, out);
}

StateDict Module::named_parameters(bool recurse) const {
  StateDict out;
  collect("", recurse, true, true, out);
  return out;
}
std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}
StateDict Module::named_buffers(bool recurse) const {
  StateDict out;
  collect("", recurse, false, true, out);
  return out;
}

bool Module::is_training(Loc loc) const {
  const std::shared_ptr<bool>& cell = training_.cell;
  // Traced: one guard per module (its flag's cell), named by its class in explain().
  if (dispatch::tracer_hook())
    dispatch::note_host_value(cell.get(), name() + ".is_training()", [&] {
      return HostReader([cell]() -> std::optional<Scalar> { return Scalar(*cell); });
    }, user_facing(loc));
  return *cell;
}

namespace {
// Guards the setting at `field` through `read`, which returns it as a Scalar. `alive` is the
// module's token: once the module is gone nothing can change the field, and a module built
// inside the compiled function is built again by the code the trace replaces, so the guard
// then holds.
template <class T, class Read>
void note_setting(const std::shared_ptr<const int>& alive, const T* field, const std::string& what,
                  Read read, Loc loc) {
  dispatch::note_host_value(field, what, [&] {
    return HostReader([alive = std::weak_ptr<const int>(alive), field, read,
                       traced = read(*field)]() -> std::optional<Scalar> {
      if (alive.expired()) return traced;
      return read(*field);
    });
  }, user_facing(loc));
}
}  // namespace

double Module::setting(const double& field, const char* what, Loc loc) const {
  if (dispatch::tracer_hook())
    note_setting(alive_.token, &field, name() + "." + what, [](double v) { return Scalar(v); },
                 loc);
  return field;
}
bool Module::setting(const bool& field, const char* what, Loc loc) const {
  if (dispatch::tracer_hook())
    note_setting(alive_.token, &field, name() + "." + what, [](bool v) { return Scalar(v); },
                 loc);
  return field;
}
const std::string& Module::setting(const std::string& field, const char* what, Loc loc) const {
  // A string is guarded as "equals the traced value" (a Scalar holds numbers only).
  if (dispatch::tracer_hook())
    note_setting(alive_.token, &field, fmt::format("{}.{} == \"{}\"", name(), what, field),
                 [traced = field](const std::string& v) { return Scalar(v == traced); }, loc);
  return field;
}

void Module::train(bool on) {
  *training_.cell = on;
  for (auto& [n, m] : children_) m->train(on);
}

void Module::zero_grad() { kiln::zero_grad(parameters()); }

StateDict Module::state_dict() const {
  // PyTorch's order: each module's parameters, then its buffers, then its children's entries.
  StateDict out;
  collect("", false, true, false, out);
  collect("", false, false, false, out);
  for (const auto& [n, m] : children_)
    for (auto& [k, t] : m->state_dict()) out.emplace_back(n + "." + k, std::move(t));
  // Detached, as PyTorch's (keep_vars=False): the same memory, without requires_grad, so that
  // writing through an entry (sd["bias"].fill_(5)) updates the module.
  for (auto& [n, t] : out) t = t.detach();
  return out;
}

void Module::load_state_dict(const StateDict& dict, bool strict, Loc loc) {
  // Everything is checked (and every source converted to its destination's dtype and device)
  // before the first copy, so a failed call leaves every parameter and buffer unchanged.
  StateDict mine = state_dict();
  std::vector<Tensor> sources(mine.size());
  std::vector<bool> used(dict.size(), false);
  for (size_t i = 0; i < dict.size(); ++i)
    for (size_t k = 0; k < i; ++k)
      KILN_CHECK(dict[k].first != dict[i].first, "load_state_dict", loc,
                 "the state dict has the key \"{}\" twice (entries {} and {})", dict[i].first,
                 k, i);
  for (size_t j = 0; j < mine.size(); ++j) {
    const auto& [key, dst] = mine[j];
    size_t i = 0;
    while (i < dict.size() && dict[i].first != key) ++i;
    if (i == dict.size()) {
      KILN_CHECK(!strict, "load_state_dict", loc, "missing key \"{}\" in state dict",
                 key);
      continue;
    }
    used[i] = true;
    const Tensor& src = dict[i].second;
    KILN_CHECK(src.defined(), "load_state_dict", loc,
               "the tensor for \"{}\" is undefined", key);
    KILN_CHECK(src.shape() == dst.shape(), "load_state_dict", loc,
               "size mismatch for \"{}\": copying a tensor of shape {} into one of shape {}", key,
               to_string(src.shape()), to_string(dst.shape()));
    sources[j] = src.detach().to(dst.device()).to(dst.dtype());
  }
  for (size_t i = 0; strict && i < dict.size(); ++i)
    KILN_CHECK(used[i], "load_state_dict", loc, "unexpected key \"{}\" in state dict",
               dict[i].first);
  NoGradGuard no_grad;
  for (size_t j = 0; j < mine.size(); ++j)
    if (sources[j].defined()) {
      Tensor d = mine[j].second;
      d.copy_(sources[j]);
    }
}

void Module::save(const std::string& path, Loc loc) const {
  save_safetensors(state_dict(), path, loc);
}
void Module::load(const std::string& path, bool strict, Loc loc) {
  load_state_dict(load_safetensors(path, loc), strict, loc);
}

}  // namespace kiln::nn
