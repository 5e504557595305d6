// float32 exp on the CPU (convert-kiln-to-linalg{cpu-math=true}, codegen/lower.cpp): the
// roundings of formulas::exp_f32 are math.roundeven (vrndscaleps) and 2^n is built by fptosi;
// for a GPU (the default) both are float additions of 1.5 * 2^23, which avoid its slow
// float-to-int conversions. The values are the same.
// RUN: kiln-opt %s --convert-kiln-to-linalg="cpu-math=true" | FileCheck %s --check-prefix=CPU
// RUN: kiln-opt %s --convert-kiln-to-linalg | FileCheck %s --check-prefix=GPU

// CPU-LABEL: func.func @exp
// CPU-NOT:     0x4B400000
// CPU-COUNT-2: math.roundeven %{{.*}} : f32
// CPU-COUNT-2: arith.fptosi %{{.*}} : f32 to i32
// CPU-NOT:     0x4B400000
// GPU-LABEL: func.func @exp
// GPU-NOT:     math.roundeven
// GPU-NOT:     arith.fptosi
// GPU:         arith.constant 0x4B400000 : f32
// GPU-NOT:     math.roundeven
// GPU-NOT:     arith.fptosi
func.func @exp(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = kiln.elementwise "exp" %x : (tensor<8xf32>) -> tensor<8xf32>
  return %0 : tensor<8xf32>
}
