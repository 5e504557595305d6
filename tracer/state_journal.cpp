#include "tracer/state_journal.h"

#include <algorithm>

#include "eager/autograd.h"
#include "tracer/recorder.h"

namespace kiln::tracer {

namespace {

// Runs the journal's own tensor work unrecorded: not traced, not differentiated, not journaled.
template <class F> decltype(auto) quietly(F&& fn) {
  WriteObserver* observer = dispatch::set_write_observer(nullptr);
  struct Restore {
    WriteObserver* o;
    ~Restore() { dispatch::set_write_observer(o); }
  } restore{observer};
  NoGradGuard no_grad;
  return untraced(std::forward<F>(fn));
}

}  // namespace

Tensor whole_storage(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->dtype = t.dtype();
  impl->shape = {static_cast<int64_t>(t.storage()->nbytes() / t.itemsize())};
  impl->strides = {1};
  return Tensor(std::move(impl));
}

StateJournal::StateJournal(bool keep_values)
    : outer_(dispatch::set_write_observer(this)),
      keep_values_(keep_values),
      first_new_serial_(StorageImpl::next_serial()) {}
StateJournal::~StateJournal() { dispatch::set_write_observer(outer_); }

void StateJournal::before_write(const OpCall& call) {
  if (outer_) outer_->before_write(call);  // an enclosing journal undoes this run too
  const Tensor& dst = call.inputs[0];
  if (!dst.defined() || dst.storage()->serial() >= first_new_serial_) return;
  if (refuse_history_writes_ && is_grad_enabled() &&
      std::ranges::any_of(call.inputs, [](const Tensor& t) { return t.requires_grad(); }))
    throw ShapeOnlyAbort{};
  if (written_at_.count(dst.storage().get())) return;
  quietly([&] {
    Tensor whole = whole_storage(dst);
    written_at_[dst.storage().get()] = written_.size();
    written_.push_back({whole, keep_values_ ? whole.clone() : Tensor(), user_facing(call.loc),
                        dst.storage()->version(), dst.storage()->history_version()});
  });
}

void StateJournal::before_grad_change(const Tensor& t) {
  if (outer_) outer_->before_grad_change(t);
  // A tensor made during the run is not state (and is not kept alive here).
  if (!t.defined() || t.storage()->serial() >= first_new_serial_ || grads_.count(t.impl())) return;
  grads_[t.impl()] = {t, quietly([&] { return t.grad(); })};
}

std::vector<Tensor> StateJournal::current() const {
  std::vector<Tensor> out;
  quietly([&] {
    for (const Written& w : written_) out.push_back(w.whole.clone());
  });
  return out;
}

void StateJournal::restore(bool versions) {
  quietly([&] {
    for (Written& w : written_) {
      if (w.before.defined()) w.whole.copy_(w.before);
      if (versions) w.whole.storage()->set_version(w.version);
    }
    for (auto& [impl, g] : grads_) g.tensor.set_grad(g.before);
  });
}

std::optional<Loc> StateJournal::history_changed() const {
  for (const Written& w : written_)
    if (w.whole.storage()->history_version() != w.history_version) return w.loc;
  return std::nullopt;
}

}  // namespace kiln::tracer
