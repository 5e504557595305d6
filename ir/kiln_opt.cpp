// kiln-opt: mlir-opt with the kiln dialect. Runs any registered pass pipeline on kiln IR, e.g.
//   kiln-opt --canonicalize --cse file.mlir
#include "ir/decompose.h"
#include "ir/dialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#if KILN_HAS_CODEGEN
#include "codegen/lower.h"
#endif

int main(int argc, char** argv) {
  mlir::DialectRegistry registry;
  registry.insert<kiln::dialect::KilnDialect, mlir::func::FuncDialect, mlir::arith::ArithDialect,
                  mlir::tensor::TensorDialect>();
  mlir::registerTransformsPasses();  // canonicalize, cse, symbol-dce, inline, ...
  kiln::dialect::register_decompose_pass();  // kiln-decompose
#if KILN_HAS_CODEGEN
  kiln::codegen::register_codegen(registry);  // convert-kiln-to-linalg, linalg, math
#endif
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "kiln optimizer driver\n", registry));
}
