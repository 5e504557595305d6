// The `kiln` dialect: a few generic ops by category, each carrying the op's name from the op
// table (core/ops.def) in its `kind` attribute. Verification of every op maps `kind` back to
// kiln::OpKind and calls core's infer_meta, so diagnostics match eager mode.
#ifndef KILN_OPS_TD
#define KILN_OPS_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

def Kiln_Dialect : Dialect {
  let name = "kiln";
  let cppNamespace = "::kiln::dialect";
  let summary = "kiln's tensor-level op set, one op per category of the op table";
  let hasConstantMaterializer = 1;
}

class Kiln_Op<string mnemonic, list<Trait> traits = []>
    : Op<Kiln_Dialect, mnemonic, !listconcat(traits, [Pure])> {
  let hasVerifier = 1;
}

// Optional attributes shared by the categories; their names match kiln::OpAttrs' fields.
defvar KilnScalarAttr = OptionalAttr<TypedAttrInterface>;

def Kiln_ElementwiseOp : Kiln_Op<"elementwise"> {
  let summary = "elementwise op (unary, binary or ternary row of the op table, or the cast `to` "
                "with its target element type in `dtype`), broadcasting";
  let arguments = (ins StrAttr:$kind, Variadic<AnyRankedTensor>:$inputs,
                       KilnScalarAttr:$alpha, KilnScalarAttr:$beta,
                       OptionalAttr<I64Attr>:$mode, OptionalAttr<TypeAttr>:$dtype);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$kind $inputs attr-dict `:` functional-type($inputs, results)";
  let hasFolder = 1;
}

def Kiln_ReduceOp : Kiln_Op<"reduce"> {
  let summary = "reduction over `dims` (all dims when absent)";
  let arguments = (ins StrAttr:$kind, AnyRankedTensor:$input,
                       OptionalAttr<DenseI64ArrayAttr>:$dims, UnitAttr:$keepdim,
                       OptionalAttr<I64Attr>:$mode);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$kind $input attr-dict `:` functional-type($input, results)";
}

def Kiln_MatmulOp : Kiln_Op<"matmul"> {
  let summary = "matmul / addmm (beta * bias + alpha * a @ b)";
  let arguments = (ins StrAttr:$kind, Variadic<AnyRankedTensor>:$inputs,
                       KilnScalarAttr:$alpha, KilnScalarAttr:$beta);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$kind $inputs attr-dict `:` functional-type($inputs, results)";
}

def Kiln_ViewOp : Kiln_Op<"view"> {
  let summary = "view-category op (view, transpose, permute, slice, select, expand, squeeze, unsqueeze), as a value";
  let arguments = (ins StrAttr:$kind, AnyRankedTensor:$input,
                       OptionalAttr<DenseI64ArrayAttr>:$dims,
                       OptionalAttr<I64Attr>:$dim, OptionalAttr<I64Attr>:$dim1,
                       OptionalAttr<I64Attr>:$start, OptionalAttr<I64Attr>:$end,
                       OptionalAttr<I64Attr>:$step);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$kind $input attr-dict `:` functional-type($input, results)";
  let hasFolder = 1;
}

def Kiln_CompositeOp : Kiln_Op<"composite"> {
  let summary = "normalization / loss row of the op table (softmax, log_softmax, layer_norm, "
                "nll_loss, mse_loss); `kiln-decompose` rewrites it into primitive kiln ops";
  let arguments = (ins StrAttr:$kind, Variadic<AnyRankedTensor>:$inputs,
                       OptionalAttr<I64Attr>:$dim, OptionalAttr<DenseI64ArrayAttr>:$dims,
                       OptionalAttr<F64Attr>:$eps, OptionalAttr<I64Attr>:$mode,
                       OptionalAttr<I64Attr>:$ignore_index);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$kind $inputs attr-dict `:` functional-type($inputs, results)";
}

def Kiln_IndexOp : Kiln_Op<"index"> {
  let summary = "index-category row of the op table: one_hot (`mode` = num_classes), tril / "
                "triu (`mode` = diagonal), masked_fill (`alpha` = the value), index_select / "
                "gather (along `dim`), embedding, index_add / index_copy / scatter_add (x, index, "
                "source; along `dim`)";
  let arguments = (ins StrAttr:$kind, Variadic<AnyRankedTensor>:$inputs,
                       OptionalAttr<I64Attr>:$mode, OptionalAttr<I64Attr>:$dim,
                       KilnScalarAttr:$alpha);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$kind $inputs attr-dict `:` functional-type($inputs, results)";
}

def Kiln_ShapeOp : Kiln_Op<"shape"> {
  let summary = "shape-category row of the op table: cat (the inputs joined along `dim`; all of "
                "the result's element type and rank)";
  let arguments = (ins StrAttr:$kind, Variadic<AnyRankedTensor>:$inputs,
                       OptionalAttr<I64Attr>:$dim);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$kind $inputs attr-dict `:` functional-type($inputs, results)";
}

def Kiln_RandomOp : Kiln_Op<"random"> {
  let summary = "random-category row of the op table drawn from an explicit Philox key: "
                "dropout_mask (`p`), rand / randn / randint (`low`, `high`: the range, or "
                "randn's mean and std); `key` is tensor<2xi64> holding (seed, counter offset), "
                "so the op is a pure function of its operand and one kernel serves every draw";
  let arguments = (ins StrAttr:$kind, AnyRankedTensor:$key, F64Attr:$p,
                       KilnScalarAttr:$low, KilnScalarAttr:$high);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$kind $key attr-dict `:` functional-type($key, results)";
}

def Kiln_ConstantOp : Kiln_Op<"constant", [ConstantLike]> {
  let summary = "tensor constant";
  let arguments = (ins ElementsAttr:$value);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$value attr-dict `:` type($result)";
  let hasFolder = 1;
}

#endif
