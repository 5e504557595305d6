#pragma once
/// Internal: autograd through compiled functions. While tracing, the backward of the outputs
/// is traced right after the forward (one joint trace, as AOTAutograd does); on replay the
/// outputs get a grad_fn that runs the compiled backward plan.
#include <memory>
#include <unordered_set>
#include <vector>

#include "tracer/function.h"
#include "tracer/plan.h"
#include "tracer/recorder.h"

namespace kiln::tracer {

/// After the function returned inside a trace: if grad mode is on and outputs require grad,
/// traces kiln::grad of those outputs with respect to every argument / captured tensor that
/// requires grad, with the incoming gradients as GradOutput values. Sets p.backward_begin,
/// grad_inputs, grad_results, grad_outputs. A graph already freed by the function's own
/// backward() leaves the program forward-only.
void record_backward(Recorder& rec, Program& p, const std::vector<OutValue>& outs);

/// After a replay: gives the differentiable outputs a grad_fn whose apply() runs `backward`
/// on the saved values (or, for a double backward with create_graph, re-runs the forward and
/// the backward on eager kernels so the gradient has history). `originals`: (value id, copy
/// made before the write-backs) of the arguments and captured tensors the call changed, which
/// such a re-run reads instead of their changed values.
void attach_backward(const std::shared_ptr<const Program>& p,
                     const std::shared_ptr<Plan>& backward, const std::vector<int>& saved,
                     RunState& st, std::vector<OutValue>& outs,
                     std::vector<std::pair<int, Tensor>> originals = {});

/// What a backward from `edges` into autograd history made before a traced call changes or
/// needs: the tensors whose .grad it sets (leaves behind the edges, retained non-leaves), the
/// storages its nodes saved for backward (an in-place write to one makes it raise), and
/// whether it would raise now (a saved tensor freed by an earlier backward, or changed).
struct HistoryReach {
  std::unordered_set<const TensorImpl*> grads;
  std::unordered_set<const StorageImpl*> saved;
  bool raises = false;
};
HistoryReach history_reach(const std::vector<autograd::Edge>& edges);

}  // namespace kiln::tracer
