#pragma once
/// The public op functions of kiln (eager mode; compile() traces these same calls).
///
/// Conventions, as in PyTorch:
/// * Binary and ternary ops broadcast (NumPy rules) and promote dtypes (core/dtype.h); a host
///   Scalar takes part in promotion as a "wrapped number" (int tensor + 2.5 → float32).
/// * Ops marked "float" return the default float dtype for integer/bool input.
/// * NaN propagates through max/min/maximum/minimum/relu/clamp/amax/amin/argmax (the first
///   NaN wins for argmax/argmin).
/// * Every function takes a defaulted `loc` so errors name the caller's line; invalid input
///   throws kiln::Error naming the op, the offending shapes/dtypes/values and that line.
#include <concepts>
#include <optional>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// ================================ unary (elementwise) ================================
Tensor neg(const Tensor& x, Loc loc = Loc::current());
Tensor abs(const Tensor& x, Loc loc = Loc::current());
/// -1, 0 or +1 (NaN stays NaN); a bool tensor's sign is a copy of it, as in PyTorch.
Tensor sign(const Tensor& x, Loc loc = Loc::current());
Tensor exp(const Tensor& x, Loc loc = Loc::current());              ///< float
Tensor exp2(const Tensor& x, Loc loc = Loc::current());             ///< float
Tensor log(const Tensor& x, Loc loc = Loc::current());              ///< float
Tensor log2(const Tensor& x, Loc loc = Loc::current());             ///< float
Tensor log1p(const Tensor& x, Loc loc = Loc::current());            ///< float
Tensor expm1(const Tensor& x, Loc loc = Loc::current());            ///< float
Tensor sqrt(const Tensor& x, Loc loc = Loc::current());             ///< float
Tensor rsqrt(const Tensor& x, Loc loc = Loc::current());            ///< float, 1/sqrt(x)
Tensor reciprocal(const Tensor& x, Loc loc = Loc::current());       ///< float
Tensor sin(const Tensor& x, Loc loc = Loc::current());              ///< float
Tensor cos(const Tensor& x, Loc loc = Loc::current());              ///< float
Tensor tan(const Tensor& x, Loc loc = Loc::current());              ///< float
Tensor tanh(const Tensor& x, Loc loc = Loc::current());             ///< float
Tensor sigmoid(const Tensor& x, Loc loc = Loc::current());          ///< float, 1/(1+e^-x)
Tensor relu(const Tensor& x, Loc loc = Loc::current());             ///< max(x, 0), NaN kept
/// GELU (Hendrycks & Gimpel 2016). approximate = "none": x·Φ(x) = 0.5x(1+erf(x/√2));
/// "tanh": 0.5x(1+tanh(√(2/π)(x+0.044715x³))). Throws for another `approximate`.
Tensor gelu(const Tensor& x, std::string_view approximate = "none", Loc loc = Loc::current());
Tensor silu(const Tensor& x, Loc loc = Loc::current());             ///< float, x·sigmoid(x)
Tensor erf(const Tensor& x, Loc loc = Loc::current());              ///< float
Tensor floor(const Tensor& x, Loc loc = Loc::current());
Tensor ceil(const Tensor& x, Loc loc = Loc::current());
Tensor round(const Tensor& x, Loc loc = Loc::current());            ///< half to even
Tensor trunc(const Tensor& x, Loc loc = Loc::current());
Tensor logical_not(const Tensor& x, Loc loc = Loc::current());      ///< bool
/// Clamps to [low, high] (either may be absent, not both). NaN stays NaN.
Tensor clamp(const Tensor& x, std::optional<Scalar> low, std::optional<Scalar> high,
             Loc loc = Loc::current());

// ================================ binary (elementwise) ================================
/// a + alpha·b
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha = 1, Loc loc = Loc::current());
Tensor add(const Tensor& a, Scalar b, Scalar alpha = 1, Loc loc = Loc::current());
/// a − alpha·b. Throws kiln::Error when either operand is bool (as PyTorch; use logical_not).
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha = 1, Loc loc = Loc::current());
Tensor sub(const Tensor& a, Scalar b, Scalar alpha = 1, Loc loc = Loc::current());
Tensor mul(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor mul(const Tensor& a, Scalar b, Loc loc = Loc::current());
/// True division (float result). x/0 gives ±inf or nan (IEEE), also for integer inputs.
Tensor div(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor div(const Tensor& a, Scalar b, Loc loc = Loc::current());
/// floor(a / b). Integers: INT_MIN / -1 wraps to INT_MIN (two's complement, no trap);
/// division by zero throws kiln::Error ("division by zero"). Floats: IEEE (±inf / nan).
Tensor floor_divide(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor floor_divide(const Tensor& a, Scalar b, Loc loc = Loc::current());
/// a − floor(a/b)·b: the sign of the divisor (Python's %). Integers: x % 0 throws
/// kiln::Error, INT_MIN % -1 = 0. Floats: x % 0 = nan.
Tensor remainder(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor remainder(const Tensor& a, Scalar b, Loc loc = Loc::current());
/// a^b. Integers: exact by repeated squaring (wrapping); a negative exponent tensor gives
/// 1/a^|b| truncated (1 for a = 1, ±1 for a = -1, 0 otherwise; a = 0 throws kiln::Error); a
/// negative number exponent throws kiln::Error, as in PyTorch.
/// A number exponent 0.5 or -0.5 on a float tensor is sqrt or rsqrt, as in PyTorch
/// (pow(-inf, 0.5) = nan, pow(-0., 0.5) = -0.); a tensor exponent follows C's pow.
Tensor pow(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor pow(const Tensor& a, Scalar b, Loc loc = Loc::current());
Tensor maximum(const Tensor& a, const Tensor& b, Loc loc = Loc::current());  ///< NaN kept
Tensor minimum(const Tensor& a, const Tensor& b, Loc loc = Loc::current());  ///< NaN kept
Tensor atan2(const Tensor& a, const Tensor& b, Loc loc = Loc::current());    ///< float
Tensor eq(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor ne(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor lt(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor le(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor gt(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor ge(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor eq(const Tensor& a, Scalar b, Loc loc = Loc::current());
Tensor ne(const Tensor& a, Scalar b, Loc loc = Loc::current());
Tensor lt(const Tensor& a, Scalar b, Loc loc = Loc::current());
Tensor le(const Tensor& a, Scalar b, Loc loc = Loc::current());
Tensor gt(const Tensor& a, Scalar b, Loc loc = Loc::current());
Tensor ge(const Tensor& a, Scalar b, Loc loc = Loc::current());
Tensor logical_and(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor logical_or(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor logical_xor(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
/// cond ? a : b elementwise; cond must be bool; all three broadcast.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor where(const Tensor& cond, const Tensor& a, Scalar b, Loc loc = Loc::current());
Tensor where(const Tensor& cond, Scalar a, const Tensor& b, Loc loc = Loc::current());
/// Both branches host scalars: the result has their dtype (bool, int64 or the default float).
Tensor where(const Tensor& cond, Scalar a, Scalar b, Loc loc = Loc::current());

/// Elementwise float tests (bool results, as torch.isnan / isinf / isfinite): x is NaN; x is
/// ±inf; x is neither. Integer and bool elements are always finite.
Tensor isnan(const Tensor& x, Loc loc = Loc::current());
Tensor isinf(const Tensor& x, Loc loc = Loc::current());
Tensor isfinite(const Tensor& x, Loc loc = Loc::current());
/// |a − b| ≤ atol + rtol·|b| elementwise with broadcasting (bool), as torch.isclose: equal
/// values (equal infinities too) are close; NaN is close to NaN only with equal_nan. Integer
/// and bool inputs are compared as float64. Throws kiln::Error for shapes that do not
/// broadcast or a negative rtol / atol.
Tensor isclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
               bool equal_nan = false, Loc loc = Loc::current());
/// isclose at every element, as torch.allclose (reads one bool to the host: in a compiled
/// function a guard on its answer).
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
              bool equal_nan = false, Loc loc = Loc::current());
/// Same shape and equal elements (NaN equals nothing), as torch.equal; false for different
/// shapes. Reads one bool to the host.
bool equal(const Tensor& a, const Tensor& b, Loc loc = Loc::current());

// Operators: errors name the line of the expression (TensorOperand, core/tensor.h).
Tensor operator-(TensorOperand x);
Tensor operator+(TensorOperand a, const Tensor& b);
Tensor operator-(TensorOperand a, const Tensor& b);
Tensor operator*(TensorOperand a, const Tensor& b);
Tensor operator/(TensorOperand a, const Tensor& b);
Tensor operator+(TensorOperand a, Scalar b);
Tensor operator-(TensorOperand a, Scalar b);
Tensor operator*(TensorOperand a, Scalar b);
Tensor operator/(TensorOperand a, Scalar b);
Tensor operator+(Scalar a, TensorOperand b);
Tensor operator-(Scalar a, TensorOperand b);
Tensor operator*(Scalar a, TensorOperand b);
Tensor operator/(Scalar a, TensorOperand b);
/// Elementwise comparisons (bool tensors), as in PyTorch: `(x > 0).item<bool>()`.
Tensor operator<(TensorOperand a, const Tensor& b);
Tensor operator<=(TensorOperand a, const Tensor& b);
Tensor operator>(TensorOperand a, const Tensor& b);
Tensor operator>=(TensorOperand a, const Tensor& b);
Tensor operator<(TensorOperand a, Scalar b);
Tensor operator<=(TensorOperand a, Scalar b);
Tensor operator>(TensorOperand a, Scalar b);
Tensor operator>=(TensorOperand a, Scalar b);
Tensor operator<(Scalar a, TensorOperand b);
Tensor operator<=(Scalar a, TensorOperand b);
Tensor operator>(Scalar a, TensorOperand b);
Tensor operator>=(Scalar a, TensorOperand b);
/// Elementwise equality (bool tensors), as in PyTorch; `is_same()` tells tensor identity.
Tensor operator==(TensorOperand a, const Tensor& b);
Tensor operator!=(TensorOperand a, const Tensor& b);
Tensor operator==(TensorOperand a, Scalar b);
Tensor operator!=(TensorOperand a, Scalar b);
Tensor operator==(Scalar a, TensorOperand b);
Tensor operator!=(Scalar a, TensorOperand b);
/// remainder (Python's %: the sign of the divisor) and logical_not.
Tensor operator%(TensorOperand a, const Tensor& b);
Tensor operator%(TensorOperand a, Scalar b);
Tensor operator%(Scalar a, TensorOperand b);
Tensor operator!(TensorOperand x);

// ================================ reductions ================================
// `dims` empty = every dim. keepdim keeps reduced dims with size 1.
/// Sum; bool/int inputs give int64. The sum of an empty set is 0.
Tensor sum(const Tensor& x, const Dims& dims = {}, bool keepdim = false, Loc loc = Loc::current());
/// Mean; floating inputs only. The mean of an empty set is nan.
Tensor mean(const Tensor& x, const Dims& dims = {}, bool keepdim = false, Loc loc = Loc::current());
/// Product; bool/int inputs give int64. The product of an empty set is 1.
Tensor prod(const Tensor& x, const Dims& dims = {}, bool keepdim = false, Loc loc = Loc::current());
/// Max / min over dims; NaN propagates. An empty reduced dim throws kiln::Error.
Tensor amax(const Tensor& x, const Dims& dims = {}, bool keepdim = false, Loc loc = Loc::current());
Tensor amin(const Tensor& x, const Dims& dims = {}, bool keepdim = false, Loc loc = Loc::current());
/// Variance Σ(x−mean)²/max(N−correction, 0); floating only. N−correction ≤ 0 gives inf, or nan
/// for a constant row (PyTorch).
Tensor var(const Tensor& x, const Dims& dims = {}, int64_t correction = 1, bool keepdim = false,
           Loc loc = Loc::current());
Tensor std(const Tensor& x, const Dims& dims = {}, int64_t correction = 1, bool keepdim = false,
           Loc loc = Loc::current());
/// log Σ exp(x), computed stably as m + log Σ exp(x − m), m = max.
Tensor logsumexp(const Tensor& x, const Dims& dims, bool keepdim = false, Loc loc = Loc::current());
Tensor all(const Tensor& x, const Dims& dims = {}, bool keepdim = false, Loc loc = Loc::current());
Tensor any(const Tensor& x, const Dims& dims = {}, bool keepdim = false, Loc loc = Loc::current());
/// The reductions above over one dim given as an integer, as in PyTorch: sum(x, 1),
/// var(x, 0), amax(x, -1, true). Templates, so that sum(x, {}) still means every dim (a
/// braced list never deduces an integer); bool is not a dim.
template <class I>
concept ReductionDim = std::integral<I> && !std::same_as<I, bool>;
#define KILN_ONE_DIM_REDUCTION(name)                                                         \
  template <ReductionDim I>                                                                   \
  Tensor name(const Tensor& x, I dim, bool keepdim = false, Loc loc = Loc::current()) {       \
    return name(x, Dims{static_cast<int64_t>(dim)}, keepdim, loc);                            \
  }
KILN_ONE_DIM_REDUCTION(sum)
KILN_ONE_DIM_REDUCTION(mean)
KILN_ONE_DIM_REDUCTION(prod)
KILN_ONE_DIM_REDUCTION(amax)
KILN_ONE_DIM_REDUCTION(amin)
KILN_ONE_DIM_REDUCTION(logsumexp)
KILN_ONE_DIM_REDUCTION(all)
KILN_ONE_DIM_REDUCTION(any)
#undef KILN_ONE_DIM_REDUCTION
template <ReductionDim I>
Tensor var(const Tensor& x, I dim, int64_t correction = 1, bool keepdim = false,
           Loc loc = Loc::current()) {
  return var(x, Dims{static_cast<int64_t>(dim)}, correction, keepdim, loc);
}
template <ReductionDim I>
Tensor std(const Tensor& x, I dim, int64_t correction = 1, bool keepdim = false,
           Loc loc = Loc::current()) {
  return std(x, Dims{static_cast<int64_t>(dim)}, correction, keepdim, loc);
}
/// Index (int64) of the max / min along `dim`, or into the flattened tensor when dim is
/// absent. Ties and NaN: the first occurrence wins; a NaN counts as the maximum (and minimum).
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
              Loc loc = Loc::current());
Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
              Loc loc = Loc::current());
/// The largest / smallest element as a 0-d tensor, as torch.max(x) / torch.min(x): NaN if any
/// element is NaN. The gradient is shared evenly by the elements equal to the result, or by
/// the NaNs when it is NaN (PyTorch's evenly_distribute_backward). Throws kiln::Error for an
/// empty tensor.
Tensor max(const Tensor& x, Loc loc = Loc::current());
Tensor min(const Tensor& x, Loc loc = Loc::current());
/// Values and their int64 indices along one dim: `auto [values, indices] = max(x, 1);`.
struct ValuesIndices {
  Tensor values, indices;
};
/// torch.max(x, dim) / torch.min(x, dim): the max (min) along `dim` and the index of its first
/// occurrence (a NaN counts as the max and the min, as in argmax); the gradient flows to that
/// element only, as PyTorch's. Throws kiln::Error for a bad dim or an empty dim.
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false, Loc loc = Loc::current());
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false, Loc loc = Loc::current());
/// The int64 indices that sort x along `dim` (PyTorch's argsort with stable=True): ascending,
/// or descending; equal values keep their order (stable), and NaN sorts as the largest value
/// (last ascending, first descending). Any dtype (bool: false < true); a 0-d x gives a 0-d 0.
/// Not differentiable (integer result). Throws kiln::Error naming the caller's line for a dim
/// out of range. Compiled code runs it as an eager op inside the replay (not in the IR); on a
/// CUDA tensor it runs on the host (copied there and back), as does cumsum.
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false,
               Loc loc = Loc::current());
/// torch.sort(x, dim, descending, stable=True): values = gather(x, dim, indices) with indices =
/// argsort(x, dim, descending); the gradient of the values goes back through gather to the
/// elements they came from. `auto [values, indices] = sort(x, -1, true);`
ValuesIndices sort(const Tensor& x, int64_t dim = -1, bool descending = false,
                   Loc loc = Loc::current());
/// torch.topk: the k largest (or, largest = false, smallest) elements along `dim` and their
/// int64 indices, in sorted order (largest first; smallest first for largest = false) whatever
/// `sorted` says (PyTorch leaves the order unspecified for sorted = false). Equal values: the
/// lower index first; NaN is the largest value (largest = true takes NaNs first). Result shape:
/// x's with size(dim) = k. Values' gradient as sort's. Throws kiln::Error naming the caller's
/// line for a dim out of range or k outside [0, x.size(dim)] (a 0-d x has size 1).
ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                   bool sorted = true, Loc loc = Loc::current());
/// Running sums along `dim`: result[..., i, ...] = Σ_{j <= i} x[..., j, ...] (torch.cumsum).
/// bool/int x gives int64 (PyTorch); `dtype` converts x first. float32 sums in float64 and
/// rounds each result once (as PyTorch's CPU kernel), float64 sums sequentially. Gradient: the
/// reverse running sum of the output gradient. Throws kiln::Error naming the caller's line for
/// a dim out of range. Compiled code runs it as an eager op inside the replay (not in the IR).
Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt,
              Loc loc = Loc::current());
/// exp(x − max) / Σ exp(x − max) along dim (float).
Tensor softmax(const Tensor& x, int64_t dim, Loc loc = Loc::current());
/// x − max − log Σ exp(x − max) along dim (float).
Tensor log_softmax(const Tensor& x, int64_t dim, Loc loc = Loc::current());

// ================================ linear algebra ================================
/// Matrix product with NumPy semantics: 1-D·1-D → 0-d dot; 2-D·2-D; a 1-D operand gets a
/// unit dim that is removed; batch dims broadcast. float32 goes through oneDNN's sgemm.
Tensor matmul(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
/// Batched matmul of [B,n,k]·[B,k,m] (no broadcasting).
Tensor bmm(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
/// beta·bias + alpha·(a @ b) for 2-D a, b; bias broadcasts to the result.
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b, Scalar beta = 1,
             Scalar alpha = 1, Loc loc = Loc::current());
/// x @ weightᵀ + bias, weight [out, in], bias [out] (optional), x [..., in].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              Loc loc = Loc::current());

// ================================ shape and data ================================
/// Concatenates along `dim`: shapes must match except in `dim`; the result takes the promoted
/// dtype. As in PyTorch, a 1-D tensor of size 0 may join tensors of any rank (it adds nothing).
/// Throws kiln::Error naming the shapes when they do not match, or for an empty list or 0-d
/// tensors.
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0, Loc loc = Loc::current());
/// Stacks equal-shape tensors along a new dim.
Tensor stack(const std::vector<Tensor>& xs, int64_t dim = 0, Loc loc = Loc::current());
/// Views of at most `size` elements along dim (the last may be smaller).
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim = 0, Loc loc = Loc::current());
/// Views with the given sizes along dim (they must add up to x.size(dim)).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0,
                          Loc loc = Loc::current());
/// `chunks` views of ceil(size/chunks) elements (fewer if the dim is small), like PyTorch.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0, Loc loc = Loc::current());
/// Rows of x along dim picked by a 1-D int index. Out-of-range indices throw kiln::Error.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index, Loc loc = Loc::current());
/// out[i][j] = x[index[i][j]][j] for dim 0 (and so on); index has x's rank.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index, Loc loc = Loc::current());
/// x with source's slices added at `index` along dim (repeated indices accumulate);
/// source has x's shape except source.size(dim) == index.numel().
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source,
                 Loc loc = Loc::current());
/// x with source's slices written at `index` along dim: result[..., index[i], ...] =
/// source[..., i, ...], the rest x's (PyTorch's index_copy). index: int64 or int32, 0-d or 1-D;
/// source: x's dtype and x's shape except source.size(dim) == index.numel(). A repeated index
/// takes its last slice (PyTorch leaves that undefined), eagerly and compiled; the gradient
/// goes to that slice only. Throws kiln::Error naming the op and the caller's line for a dim
/// out of range, a wrong index dtype or rank, a dtype or shape mismatch, or an index out of
/// range (a compiled replay raises the same error at the same line). In place:
/// Tensor::index_copy_.
Tensor index_copy(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source,
                  Loc loc = Loc::current());
/// x with src[i][j] added at x[index[i][j]][j] for dim 0 (and so on); index has x's rank.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src,
                   Loc loc = Loc::current());
/// weight[indices] for weight [num_embeddings, dim]: output indices.shape + [dim].
Tensor embedding(const Tensor& weight, const Tensor& indices, Loc loc = Loc::current());
/// int64 one-hot of int64 indices in [0, num_classes); num_classes = -1 uses max + 1.
Tensor one_hot(const Tensor& indices, int64_t num_classes = -1, Loc loc = Loc::current());
/// x with `value` where mask (bool) is true; the result has x and mask's broadcast shape (PyTorch).
Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value, Loc loc = Loc::current());
/// Lower / upper triangle of the last two dims (diagonal offset as in PyTorch), rest zero.
Tensor tril(const Tensor& x, int64_t diagonal = 0, Loc loc = Loc::current());
Tensor triu(const Tensor& x, int64_t diagonal = 0, Loc loc = Loc::current());
/// The shape both broadcast to, as a view (no copy).
Tensor broadcast_to(const Tensor& x, const Shape& shape, Loc loc = Loc::current());

// ================================ nn functional ================================
/// Layer normalisation over the trailing `normalized_shape` dims (Ba et al. 2016):
/// (x − mean) / sqrt(var_biased + eps) · weight + bias; weight/bias optional. Throws
/// kiln::Error for eps < 0 or NaN.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5, Loc loc = Loc::current());
/// Inverted dropout: zeroes each element with probability p and scales the rest by 1/(1−p),
/// using Philox draws from the global generator; identity (returns x itself) when not training
/// or p = 0.
Tensor dropout(const Tensor& x, double p = 0.5, bool training = true, Loc loc = Loc::current());
enum class Reduction { None, Mean, Sum };
/// Negative log-likelihood of log-probabilities [N, C] at int64 targets [N]; targets equal to
/// ignore_index are skipped (Mean divides by the count of the others). Out-of-range targets
/// throw kiln::Error. An unbatched [C] input takes a 0-d target (the loss is 0-d for every
/// reduction), and a K-dimensional [N, C, d1, ...] input a target [N, d1, ...] (None gives a
/// loss of the target's shape), as in PyTorch.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction = Reduction::Mean,
                int64_t ignore_index = -100, Loc loc = Loc::current());
/// nll_loss(log_softmax(logits, 1), target); an unbatched [C] input (0-d target) uses dim 0;
/// [N, C, d1, ...] logits take a target [N, d1, ...].
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     Reduction reduction = Reduction::Mean, int64_t ignore_index = -100,
                     Loc loc = Loc::current());
/// (a − b)² reduced.
Tensor mse_loss(const Tensor& a, const Tensor& b, Reduction reduction = Reduction::Mean,
                Loc loc = Loc::current());

// ================================ convolution and pooling ================================
// NCHW tensors, float32 / float64, PyTorch's semantics and argument order. unfold and fold are
// op-table rows (eager kernels; a compiled replay runs them as eager ops between its compiled
// regions); conv2d and the pools are composites over unfold, so their gradients are unfold's,
// fold's and matmul's. Bad arguments (rank, a non-positive kernel / stride / dilation, negative
// padding, a dilated kernel larger than the padded input, channels) throw kiln::Error naming
// the function called, the shapes / values and the caller's line.

/// A size for each of the two spatial dims (height, width): `3` is {3, 3}, as PyTorch's ints.
struct Size2 {
  int64_t h, w;
  Size2(int64_t both) : h(both), w(both) {}  // NOLINT(google-explicit-constructor): `3`
  Size2(int64_t h, int64_t w) : h(h), w(w) {}
};
/// im2col (torch.nn.functional.unfold): x [N, C, H, W] -> [N, C*kh*kw, L], where row
/// c*kh*kw + i*kw + j holds element (i, j) of channel c's window at each of the L = Ho*Wo
/// window positions (row-major), Ho = (H + 2*padding - dilation*(kh - 1) - 1) / stride + 1
/// (likewise Wo); elements in the zero padding read 0. Gradient: fold.
Tensor unfold(const Tensor& x, Size2 kernel_size, Size2 dilation = 1, Size2 padding = 0,
              Size2 stride = 1, Loc loc = Loc::current());
/// col2im (torch.nn.functional.fold), unfold's adjoint: cols [N, C*kh*kw, L] -> [N, C,
/// output_size.h, output_size.w], each column element added at its window position (overlaps
/// sum; padding positions are dropped). L must equal the window count unfold gives for
/// output_size. Gradient: unfold.
Tensor fold(const Tensor& cols, Size2 output_size, Size2 kernel_size, Size2 dilation = 1,
            Size2 padding = 0, Size2 stride = 1, Loc loc = Loc::current());
/// 2-D cross-correlation (torch.nn.functional.conv2d): x [N, C, H, W], weight [O, C/groups,
/// kh, kw], optional bias [O] -> [N, O, Ho, Wo] (Ho as unfold's). Computed as unfold(x) then a
/// matmul with weight [O, C/groups*kh*kw] per group. Throws kiln::Error for groups < 1, C or O
/// not divisible by groups, weight.size(1) * groups != C, a bias other than [O], or x and
/// weight of different dtypes.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              Size2 stride = 1, Size2 padding = 0, Size2 dilation = 1, int64_t groups = 1,
              Loc loc = Loc::current());
/// Max over each (dilated) kh x kw window (torch.nn.functional.max_pool2d): [N, C, H, W] ->
/// [N, C, Ho, Wo]; stride defaults to kernel_size. Padding counts as -inf (never the max).
/// NaN propagates; the gradient goes to the first maximum of each window (row-major), as
/// PyTorch's. Throws kiln::Error for padding above half the kernel size (PyTorch's check).
Tensor max_pool2d(const Tensor& x, Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                  Size2 padding = 0, Size2 dilation = 1, Loc loc = Loc::current());
/// Mean over each kh x kw window (torch.nn.functional.avg_pool2d with count_include_pad =
/// true, ceil_mode = false): padding counts as 0 and the divisor is always kh*kw; stride
/// defaults to kernel_size. Throws kiln::Error for padding above half the kernel size.
Tensor avg_pool2d(const Tensor& x, Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                  Size2 padding = 0, Loc loc = Loc::current());

}  // namespace kiln
