#include "nn/module.h"

#include <algorithm>
#include <unordered_map>

#include "eager/autograd.h"
#include "eager/dispatch.h"
#include "nn/serialize.h"

namespace kiln::nn {

Tensor Module::forward(const Tensor&) {
  throw Error(name(), "this module's forward takes other arguments; call its own forward");
}

namespace {
// A parameter's or buffer's name: not empty and without '.', which state_dict() keys use
// between a submodule's name and its entries ("fc.weight" as a parameter beside a child "fc"
// with a weight gave one key twice, and save() failed far from the cause). A submodule's name
// may hold dots: containers name their items "layers.0" as PyTorch's ModuleList keys.
void check_name(const char* what, const std::string& name, Loc loc, bool dots = false) {
  KILN_CHECK(!name.empty() && (dots || name.find('.') == std::string::npos), what, loc,
             "name '{}' must be non-empty{}", name,
             dots ? "" : " and must not contain '.' (state_dict() keys join submodule names "
                         "and theirs with '.')");
}

// Sets `name` to `t` in `entries`: replaces an existing entry in place, else appends. A name
// of the other kind (a buffer's for a parameter) is an error, as PyTorch's KeyError.
void put(StateDict& entries, const StateDict& other_kind,
         const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children,
         const char* what, const std::string& name, const Tensor& t, Loc loc) {
  check_name(what, name, loc);
  for (const auto& [n, child] : children)
    KILN_CHECK(n != name, what, loc, "'{}' is already registered as a submodule", name);
  for (const auto& [n, old] : other_kind)
    KILN_CHECK(n != name, what, loc,
               "'{}' is already registered as a {}; a module's parameters and buffers need "
               "different names",
               name, std::string_view(what) == "register_parameter" ? "buffer" : "parameter");
  for (auto& [n, old] : entries)
    if (n == name) {
      if (old.impl() != t.impl()) note_parameter_rebind(old);  // compiled functions retrace
      old = t;
      return;
    }
  entries.emplace_back(name, t);
}
}  // namespace

Tensor Module::register_parameter(const std::string& n, Tensor t, Loc loc) {
  KILN_CHECK(!t.defined() || is_floating(t.dtype()), "register_parameter", loc,
             "parameter '{}' must be floating point to require gradients, got {} {}", n,
             kiln::name(t.dtype()), to_string(t.shape()));
  if (t.defined() && !t.is_leaf()) t = t.detach();  // else its .grad would never be set
  if (t.defined() && !t.requires_grad()) t.requires_grad_(true, loc);
  put(params_, buffers_, children_, "register_parameter", n, t, loc);
  return t;
}

namespace {
// Whether `m` is `target` or holds it among its submodules, at any depth.
bool holds_module(const Module& m, const Module* target) {
  if (&m == target) return true;
  for (const auto& [n, child] : m.named_children())
    if (holds_module(*child, target)) return true;
  return false;
}
}  // namespace

void Module::put_child(const std::string& name, std::shared_ptr<Module> m, Loc loc) {
  check_name("register_module", name, loc, /*dots=*/true);
  // A module inside itself: every walk of the tree (parameters(), state_dict(), train(),
  // forward) recursed until the stack overflowed (a break-it pass).
  KILN_CHECK(!holds_module(*m, this), "register_module", loc,
             "submodule \"{}\" is this module or contains it; a module cannot contain itself",
             name);
  for (const StateDict* own : {&params_, &buffers_})
    for (const auto& [n, t] : *own)
      KILN_CHECK(n != name, "register_module", loc, "'{}' is already registered as a {}", name,
                 own == &params_ ? "parameter" : "buffer");
  for (auto& [n, child] : children_)
    if (n == name) {
      // Replaced in place, as PyTorch's add_module: a second child of one name gave
      // state_dict() every key twice, and parameters() the old layer's too.
      if (child != m) {  // compiled functions that read the old one's tensors retrace
        note_parameter_rebind(Tensor());
        if (child) {
          for (const auto& [n, t] : child->named_parameters()) note_parameter_rebind(t);
          for (const auto& [n, t] : child->named_buffers()) note_parameter_rebind(t);
        }
      }
      child = std::move(m);
      return;
    }
  children_.emplace_back(name, std::move(m));
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

Tensor Module::register_buffer(const std::string& n, Tensor t, bool persistent, Loc loc) {
  put(buffers_, params_, children_, "register_buffer", n, t, loc);
  std::erase(non_persistent_, n);
  if (!persistent) non_persistent_.push_back(n);
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

int64_t Module::setting(const int64_t& field, const char* what, Loc loc) const {
  if (dispatch::tracer_hook())
    note_setting(alive_.token, &field, name() + "." + what, [](int64_t v) { return Scalar(v); },
                 loc);
  return field;
}
const Shape& Module::setting(const Shape& field, const char* what, Loc loc) const {
  // Guarded as "equals the traced value", as a string.
  if (dispatch::tracer_hook())
    note_setting(alive_.token, &field,
                 fmt::format("{}.{} == {}", name(), what, to_string(field)),
                 [traced = field](const Shape& v) { return Scalar(v == traced); }, loc);
  return field;
}

void Module::guard_submodules(Loc loc) const {
  if (!dispatch::tracer_hook()) return;
  std::vector<const Module*> traced;
  for (const auto& [n, m] : children_) traced.push_back(m.get());
  note_setting(alive_.token, &children_,
               fmt::format("{}'s {} submodule(s) (the same objects)", name(), traced.size()),
               [traced](const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& now) {
                 bool same = now.size() == traced.size();
                 for (size_t i = 0; same && i < now.size(); ++i)
                   same = now[i].second.get() == traced[i];
                 return Scalar(same);
               },
               loc);
}

void Module::train(bool on, Loc loc) {
  *training_.cell = on;
  // Inside a compiled function: repeated on every call, and the function's later
  // is_training() reads are its own value, not guards (dispatch::note_host_write).
  if (dispatch::tracer_hook())
    dispatch::note_host_write(training_.cell.get(), name() + (on ? ".train()" : ".eval()"),
                              [cell = training_.cell, on] { *cell = on; }, user_facing(loc));
  for (auto& [n, m] : children_) m->train(on, loc);
}

void Module::zero_grad() { kiln::zero_grad(parameters()); }

StateDict Module::state_dict() const {
  // PyTorch's order: each module's parameters, then its buffers, then its children's entries.
  StateDict out;
  collect("", false, true, false, out);
  StateDict buffers;
  collect("", false, false, false, buffers);
  for (auto& entry : buffers)
    if (std::ranges::find(non_persistent_, entry.first) == non_persistent_.end())
      out.push_back(std::move(entry));
  for (const auto& [n, m] : children_)
    for (auto& [k, t] : m->state_dict()) out.emplace_back(n + "." + k, std::move(t));
  // Detached, as PyTorch's (keep_vars=False): the same memory, without requires_grad, so that
  // writing through an entry (sd["bias"].fill_(5)) updates the module.
  for (auto& [n, t] : out) t = t.detach();
  return out;
}

namespace {
// "a", "b", "c" and 4 more: a long list of keys in an error message.
std::string key_list(const std::vector<std::string>& keys) {
  constexpr size_t kShown = 8;
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kShown; ++i)
    out += fmt::format("{}\"{}\"", i ? ", " : "", keys[i]);
  if (keys.size() > kShown) out += fmt::format(" and {} more", keys.size() - kShown);
  return out;
}
}  // namespace

IncompatibleKeys load_state_into(const StateDict& dst, const StateDict& src, bool strict,
                                 const char* op, Loc loc) {
  std::unordered_map<std::string, size_t> by_key;
  for (size_t i = 0; i < src.size(); ++i) {
    auto [it, fresh] = by_key.emplace(src[i].first, i);
    KILN_CHECK(fresh, op, loc, "the state dict has the key \"{}\" twice (entries {} and {})",
               src[i].first, it->second, i);
  }
  IncompatibleKeys keys;
  std::vector<Tensor> sources(dst.size());
  std::vector<bool> used(src.size(), false);
  for (size_t j = 0; j < dst.size(); ++j) {
    const auto& [key, dest] = dst[j];
    auto it = by_key.find(key);
    if (it == by_key.end()) {
      keys.missing_keys.push_back(key);
      continue;
    }
    used[it->second] = true;
    const Tensor& source = src[it->second].second;
    KILN_CHECK(source.defined(), op, loc, "the tensor for \"{}\" is undefined", key);
    KILN_CHECK(source.shape() == dest.shape(), op, loc,
               "size mismatch for \"{}\": copying a tensor of shape {} into one of shape {}",
               key, to_string(source.shape()), to_string(dest.shape()));
    sources[j] = source.detach().to(dest.device()).to(dest.dtype());
  }
  for (size_t i = 0; i < src.size(); ++i)
    if (!used[i]) keys.unexpected_keys.push_back(src[i].first);
  if (strict && (!keys.missing_keys.empty() || !keys.unexpected_keys.empty())) {
    std::string what;
    if (!keys.missing_keys.empty())
      what = fmt::format("missing keys in state dict: {}", key_list(keys.missing_keys));
    if (!keys.unexpected_keys.empty())
      what += fmt::format("{}unexpected keys in state dict: {}", what.empty() ? "" : "; ",
                          key_list(keys.unexpected_keys));
    throw Error(op, what, loc);
  }
  NoGradGuard no_grad;
  for (size_t j = 0; j < dst.size(); ++j)
    if (sources[j].defined()) {
      Tensor d = dst[j].second;
      d.copy_(sources[j]);
    }
  return keys;
}

IncompatibleKeys Module::load_state_dict(const StateDict& dict, bool strict, Loc loc) {
  return load_state_into(state_dict(), dict, strict, "load_state_dict", loc);
}

void Module::save(const std::string& path, Loc loc) const {
  save_safetensors(state_dict(), path, loc);
}
IncompatibleKeys Module::load(const std::string& path, bool strict, Loc loc) {
  return load_state_dict(load_safetensors(path, loc), strict, loc);
}

}  // namespace kiln::nn
