// kiln-cpu-row-loops (codegen/blocked_sums.cpp): a float64 sum of float32 terms that the
// reduce's lowering widened (its add marked kiln_widened_float32_sum) in a CPU row's column
// loop, whose result is only rounded to float32 (after a mean's division, say), runs in float32
// partials, one per block of 4,096 columns, each added to the float64 sum, as eager's kernels
// sum. Terms >= 0 (kiln_nonnegative_terms: softmax's sum of exps) cannot overflow short of the
// total; other sums redo a block in float64 where its partial is not finite.
// RUN: kiln-opt %s --split-input-file --kiln-cpu-row-loops | FileCheck %s

// Columns not known: blocks of 4,096 (step * 4096), the last one cut at the row's end. The
// partial starts at -0.0, the sum's identity.
// CHECK-LABEL: func.func @dynamic_columns
// CHECK:         scf.parallel (%[[ROW:.*]]) =
// CHECK:           %[[BLOCK:.*]] = arith.constant 4096 : index
// CHECK:           %[[STEP:.*]] = arith.muli %{{.*}}, %[[BLOCK]] : index
// CHECK:           scf.for %[[B:.*]] = %{{.*}} to %[[N:.*]] step %[[STEP]] {
// CHECK:             %[[END:.*]] = arith.addi %[[B]], %[[STEP]] : index
// CHECK:             %[[UB:.*]] = arith.minsi %[[END]], %[[N]] : index
// CHECK:             %[[ID:.*]] = arith.constant -0.000000e+00 : f32
// CHECK:             %[[P:.*]] = scf.for %[[J:.*]] = %[[B]] to %[[UB]] step %{{.*}} iter_args(%[[ACC:.*]] = %[[ID]]) -> (f32) {
// CHECK:               %[[V:.*]] = memref.load %{{.*}}[%[[ROW]], %[[J]]]
// CHECK:               %[[S:.*]] = arith.addf %[[ACC]], %[[V]] fastmath<reassoc> : f32
// CHECK:               scf.yield %[[S]] : f32
// CHECK:             }
// CHECK:             %[[OLD:.*]] = memref.load %[[SUM:.*]][%c0, %c0] : memref<1x1xf64>
// CHECK:             %[[W:.*]] = arith.extf %[[P]] : f32 to f64
// CHECK:             %[[T:.*]] = arith.addf %[[OLD]], %[[W]] fastmath<reassoc> : f64
// CHECK:             memref.store %[[T]], %[[SUM]][%c0, %c0]
// CHECK:           }
// CHECK:           arith.truncf
func.func @dynamic_columns(%x: memref<?x?xf32>, %out: memref<?x1xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f64
  %rows = memref.dim %x, %c0 : memref<?x?xf32>
  %cols = memref.dim %x, %c1 : memref<?x?xf32>
  %sum = memref.alloc() : memref<1x1xf64>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    memref.store %zero, %sum[%c0, %c0] : memref<1x1xf64>
    scf.for %j = %c0 to %cols step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x?xf32>
      %s = memref.load %sum[%c0, %c0] : memref<1x1xf64>
      %w = arith.extf %v : f32 to f64
      %t = arith.addf %s, %w fastmath<reassoc> {kiln_nonnegative_terms, kiln_widened_float32_sum} : f64
      memref.store %t, %sum[%c0, %c0] : memref<1x1xf64>
    }
    %s = memref.load %sum[%c0, %c0] : memref<1x1xf64>
    %r = arith.truncf %s : f64 to f32
    memref.store %r, %out[%i, %c0] : memref<?x1xf32>
    scf.reduce
  }
  memref.dealloc %sum : memref<1x1xf64>
  return
}

// -----

// Two sums of one loop (10,000 columns: three blocks) in two partials; the float64 terms of a
// third (not widened from float32) keep their float64 sum.
// CHECK-LABEL: func.func @two_sums_and_a_float64_one
// CHECK:         scf.for %{{.*}} = %c0{{.*}} to %c10000{{.*}} step
// CHECK:           scf.for {{.*}} iter_args(%[[A:.*]] = %{{.*}}, %[[B:.*]] = %{{.*}}) -> (f32, f32) {
// CHECK:             arith.addf %[[A]], {{.*}} : f32
// CHECK:             arith.addf %[[B]], {{.*}} : f32
// CHECK:             memref.load %[[S3:alloc[a-z0-9_]*]]
// CHECK:             arith.addf {{.*}} : f64
// CHECK-NEXT:        memref.store %{{.*}}, %[[S3]]
// CHECK:             scf.yield
// CHECK-COUNT-2:   arith.addf {{.*}} fastmath<reassoc> : f64
// CHECK:         }
func.func @two_sums_and_a_float64_one(%x: memref<?x10000xf32>, %y: memref<?x10000xf64>,
                                      %out: memref<?x3xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c10000 = arith.constant 10000 : index
  %zero = arith.constant 0.0 : f64
  %rows = memref.dim %x, %c0 : memref<?x10000xf32>
  %sum1 = memref.alloc() : memref<1x1xf64>
  %sum2 = memref.alloc() : memref<1x1xf64>
  %sum3 = memref.alloc() : memref<1x1xf64>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    memref.store %zero, %sum1[%c0, %c0] : memref<1x1xf64>
    memref.store %zero, %sum2[%c0, %c0] : memref<1x1xf64>
    memref.store %zero, %sum3[%c0, %c0] : memref<1x1xf64>
    scf.for %j = %c0 to %c10000 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x10000xf32>
      %sq = arith.mulf %v, %v : f32
      %a = memref.load %sum1[%c0, %c0] : memref<1x1xf64>
      %wa = arith.extf %v : f32 to f64
      %ta = arith.addf %a, %wa fastmath<reassoc> {kiln_nonnegative_terms, kiln_widened_float32_sum} : f64
      memref.store %ta, %sum1[%c0, %c0] : memref<1x1xf64>
      %b = memref.load %sum2[%c0, %c0] : memref<1x1xf64>
      %wb = arith.extf %sq : f32 to f64
      %tb = arith.addf %wb, %b fastmath<reassoc> {kiln_nonnegative_terms, kiln_widened_float32_sum} : f64
      memref.store %tb, %sum2[%c0, %c0] : memref<1x1xf64>
      %y64 = memref.load %y[%i, %j] : memref<?x10000xf64>
      %c = memref.load %sum3[%c0, %c0] : memref<1x1xf64>
      %tc = arith.addf %c, %y64 fastmath<reassoc> : f64
      memref.store %tc, %sum3[%c0, %c0] : memref<1x1xf64>
    }
    %r1 = memref.load %sum1[%c0, %c0] : memref<1x1xf64>
    %r2 = memref.load %sum2[%c0, %c0] : memref<1x1xf64>
    %r3 = memref.load %sum3[%c0, %c0] : memref<1x1xf64>
    %f1 = arith.truncf %r1 : f64 to f32
    %f2 = arith.truncf %r2 : f64 to f32
    %f3 = arith.truncf %r3 : f64 to f32
    memref.store %f1, %out[%i, %c0] : memref<?x3xf32>
    memref.store %f2, %out[%i, %c1] : memref<?x3xf32>
    memref.store %f3, %out[%i, %c2] : memref<?x3xf32>
    scf.reduce
  }
  memref.dealloc %sum1 : memref<1x1xf64>
  memref.dealloc %sum2 : memref<1x1xf64>
  memref.dealloc %sum3 : memref<1x1xf64>
  return
}

// -----

// Kept in float64, one reason each: a sum that may cancel in a loop that also writes other
// memory (its block could not be redone where [3e38, 3e38, -3e38] overflows a float32
// partial); an ordered sum (no reassoc); the accumulator is read in the loop by another op; a
// sum the lowering did not widen (a float64 sum the user asked for: sum of x.to(float64)).
// CHECK-LABEL: func.func @kept
// CHECK-NOT:     iter_args
// CHECK-COUNT-4: arith.addf {{.*}} : f64
// CHECK-NOT:     iter_args
func.func @kept(%x: memref<?x1024xf32>, %out: memref<?x4xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %c1024 = arith.constant 1024 : index
  %n = arith.constant 1024.0 : f64
  %zero = arith.constant 0.0 : f64
  %rows = memref.dim %x, %c0 : memref<?x1024xf32>
  %mean = memref.alloc() : memref<1x1xf64>
  %ordered = memref.alloc() : memref<1x1xf64>
  %read = memref.alloc() : memref<1x1xf64>
  %seen = memref.alloc() : memref<1024xf64>
  %plain = memref.alloc() : memref<1x1xf64>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    memref.store %zero, %plain[%c0, %c0] : memref<1x1xf64>
    memref.store %zero, %mean[%c0, %c0] : memref<1x1xf64>
    memref.store %zero, %ordered[%c0, %c0] : memref<1x1xf64>
    memref.store %zero, %read[%c0, %c0] : memref<1x1xf64>
    scf.for %j = %c0 to %c1024 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x1024xf32>
      %w = arith.extf %v : f32 to f64
      %a = memref.load %mean[%c0, %c0] : memref<1x1xf64>
      %ta = arith.addf %a, %w fastmath<reassoc> {kiln_widened_float32_sum} : f64
      memref.store %ta, %mean[%c0, %c0] : memref<1x1xf64>
      %b = memref.load %ordered[%c0, %c0] : memref<1x1xf64>
      %tb = arith.addf %b, %w {kiln_nonnegative_terms, kiln_widened_float32_sum} : f64
      memref.store %tb, %ordered[%c0, %c0] : memref<1x1xf64>
      %c = memref.load %read[%c0, %c0] : memref<1x1xf64>
      %tc = arith.addf %c, %w fastmath<reassoc> {kiln_nonnegative_terms, kiln_widened_float32_sum} : f64
      memref.store %tc, %read[%c0, %c0] : memref<1x1xf64>
      %peek = memref.load %read[%c0, %c0] : memref<1x1xf64>
      memref.store %peek, %seen[%j] : memref<1024xf64>
      %d = memref.load %plain[%c0, %c0] : memref<1x1xf64>
      %td = arith.addf %d, %w fastmath<reassoc> : f64
      memref.store %td, %plain[%c0, %c0] : memref<1x1xf64>
    }
    %r1 = memref.load %mean[%c0, %c0] : memref<1x1xf64>
    %m1 = arith.divf %r1, %n : f64
    %f1 = arith.truncf %m1 : f64 to f32
    %r2 = memref.load %ordered[%c0, %c0] : memref<1x1xf64>
    %f2 = arith.truncf %r2 : f64 to f32
    %r3 = memref.load %read[%c0, %c0] : memref<1x1xf64>
    %f3 = arith.truncf %r3 : f64 to f32
    memref.store %f1, %out[%i, %c0] : memref<?x4xf32>
    memref.store %f2, %out[%i, %c1] : memref<?x4xf32>
    memref.store %f3, %out[%i, %c2] : memref<?x4xf32>
    %r4 = memref.load %plain[%c0, %c0] : memref<1x1xf64>
    %f4 = arith.truncf %r4 : f64 to f32
    memref.store %f4, %out[%i, %c3] : memref<?x4xf32>
    scf.reduce
  }
  memref.dealloc %plain : memref<1x1xf64>
  memref.dealloc %mean : memref<1x1xf64>
  memref.dealloc %ordered : memref<1x1xf64>
  memref.dealloc %read : memref<1x1xf64>
  memref.dealloc %seen : memref<1024xf64>
  return
}

// -----

// A mean and a sum that may cancel, in a loop that writes nothing else: both in float32
// partials; a block whose partials are not both finite (p - p == 0 is false for inf and NaN)
// runs the original loop over its columns, adding float64 terms to the accumulators; the
// others add the partials. The mean's division by its count comes after, as before.
// CHECK-LABEL: func.func @redone_where_not_finite
// CHECK:         scf.parallel (%[[ROW:.*]]) =
// CHECK:           %[[P:.*]]:2 = scf.for %[[J:.*]] = {{.*}} iter_args({{.*}}) -> (f32, f32) {
// CHECK:             arith.addf {{.*}} fastmath<reassoc> : f32
// CHECK:             arith.addf {{.*}} fastmath<reassoc> : f32
// CHECK:           }
// CHECK:           %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK:           %[[D0:.*]] = arith.subf %[[P]]#0, %[[P]]#0 : f32
// CHECK:           %[[OK0:.*]] = arith.cmpf oeq, %[[D0]], %[[ZERO]] : f32
// CHECK:           %[[D1:.*]] = arith.subf %[[P]]#1, %[[P]]#1 : f32
// CHECK:           %[[OK1:.*]] = arith.cmpf oeq, %[[D1]], %[[ZERO]] : f32
// CHECK:           %[[OK:.*]] = arith.andi %[[OK0]], %[[OK1]] : i1
// CHECK:           scf.if %[[OK]] {
// CHECK-COUNT-2:     arith.extf %[[P]]
// CHECK:           } else {
// CHECK:             scf.for
// CHECK-COUNT-2:       arith.addf {{.*}} fastmath<reassoc> {kiln_widened_float32_sum} : f64
// CHECK:             }
// CHECK:           }
// CHECK:           arith.divf
// CHECK:         scf.reduce
func.func @redone_where_not_finite(%x: memref<?x1024xf32>, %out: memref<?x2xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c1024 = arith.constant 1024 : index
  %n = arith.constant 1024.0 : f64
  %zero = arith.constant 0.0 : f64
  %rows = memref.dim %x, %c0 : memref<?x1024xf32>
  %mean = memref.alloc() : memref<1x1xf64>
  %sum = memref.alloc() : memref<1x1xf64>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    memref.store %zero, %mean[%c0, %c0] : memref<1x1xf64>
    memref.store %zero, %sum[%c0, %c0] : memref<1x1xf64>
    scf.for %j = %c0 to %c1024 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x1024xf32>
      %w = arith.extf %v : f32 to f64
      %a = memref.load %mean[%c0, %c0] : memref<1x1xf64>
      %ta = arith.addf %a, %w fastmath<reassoc> {kiln_widened_float32_sum} : f64
      memref.store %ta, %mean[%c0, %c0] : memref<1x1xf64>
      %b = memref.load %sum[%c0, %c0] : memref<1x1xf64>
      %tb = arith.addf %b, %w fastmath<reassoc> {kiln_widened_float32_sum} : f64
      memref.store %tb, %sum[%c0, %c0] : memref<1x1xf64>
    }
    %r1 = memref.load %mean[%c0, %c0] : memref<1x1xf64>
    %m1 = arith.divf %r1, %n : f64
    %f1 = arith.truncf %m1 : f64 to f32
    %r2 = memref.load %sum[%c0, %c0] : memref<1x1xf64>
    %f2 = arith.truncf %r2 : f64 to f32
    memref.store %f1, %out[%i, %c0] : memref<?x2xf32>
    memref.store %f2, %out[%i, %c1] : memref<?x2xf32>
    scf.reduce
  }
  memref.dealloc %mean : memref<1x1xf64>
  memref.dealloc %sum : memref<1x1xf64>
  return
}

// -----

// A float64 sum the user asked for, over columns not known (or over 4,096): float64 partials
// per block of 4,096 columns, each added to the accumulator (block_float64_sums), as eager's
// kernels sum: one running sum of 10^7 terms lost each term under half an ulp of its total.
// CHECK-LABEL: func.func @long_float64_sum
// CHECK:         scf.parallel
// CHECK:           scf.for %[[B:.*]] = %{{.*}} to %[[N:.*]] step %[[STEP:.*]] {
// CHECK:             %[[UB:.*]] = arith.minsi %{{.*}}, %[[N]] : index
// CHECK:             %[[ID:.*]] = arith.constant -0.000000e+00 : f64
// CHECK:             %[[P:.*]] = scf.for %{{.*}} = %[[B]] to %[[UB]] step %{{.*}} iter_args(%[[ACC:.*]] = %[[ID]]) -> (f64) {
// CHECK:               %[[S:.*]] = arith.addf %[[ACC]], %{{.*}} fastmath<reassoc> : f64
// CHECK:               scf.yield %[[S]] : f64
// CHECK:             }
// CHECK:             %[[OLD:.*]] = memref.load %[[SUM:.*]][%c0, %c0] : memref<1x1xf64>
// CHECK-NEXT:        %[[T:.*]] = arith.addf %[[OLD]], %[[P]] fastmath<reassoc> : f64
// CHECK-NEXT:        memref.store %[[T]], %[[SUM]][%c0, %c0]
func.func @long_float64_sum(%x: memref<?x?xf64>, %out: memref<?x1xf64> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f64
  %rows = memref.dim %x, %c0 : memref<?x?xf64>
  %cols = memref.dim %x, %c1 : memref<?x?xf64>
  %sum = memref.alloc() : memref<1x1xf64>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    memref.store %zero, %sum[%c0, %c0] : memref<1x1xf64>
    scf.for %j = %c0 to %cols step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x?xf64>
      %s = memref.load %sum[%c0, %c0] : memref<1x1xf64>
      %t = arith.addf %s, %v fastmath<reassoc> : f64
      memref.store %t, %sum[%c0, %c0] : memref<1x1xf64>
    }
    %s = memref.load %sum[%c0, %c0] : memref<1x1xf64>
    memref.store %s, %out[%i, %c0] : memref<?x1xf64>
    scf.reduce
  }
  memref.dealloc %sum : memref<1x1xf64>
  return
}

// -----

// A whole-tensor sum of [1000, 100]: 100 terms a row, but 100,000 into one element, so each
// row's run gets a partial of its own; a row sum of 100 terms (@short_rows' second sum, whose
// element changes with the row) stays a running sum.
// CHECK-LABEL: func.func @short_rows
// CHECK:         scf.for %[[I:.*]] = %c0 to %c1000 step %c1 {
// CHECK:           %[[P:.*]] = scf.for {{.*}} iter_args(%[[ACC:.*]] = %{{.*}}) -> (f64) {
// CHECK:             %[[R:.*]] = memref.load %[[ROWS:.*]][%[[I]]] : memref<1000xf64>
// CHECK:             %[[RS:.*]] = arith.addf %[[R]], {{.*}} : f64
// CHECK:             memref.store %[[RS]], %[[ROWS]][%[[I]]]
// CHECK:             arith.addf %[[ACC]], {{.*}} : f64
// CHECK:           }
// CHECK:           memref.load %[[TOTAL:.*]][] : memref<f64>
// CHECK:           arith.addf {{.*}}, %[[P]]
func.func @short_rows(%x: memref<1000x100xf64>, %total: memref<f64> {llvm.noalias},
                      %rows: memref<1000xf64> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c100 = arith.constant 100 : index
  %c1000 = arith.constant 1000 : index
  scf.for %i = %c0 to %c1000 step %c1 {
    scf.for %j = %c0 to %c100 step %c1 {
      %v = memref.load %x[%i, %j] : memref<1000x100xf64>
      %r = memref.load %rows[%i] : memref<1000xf64>
      %rs = arith.addf %r, %v fastmath<reassoc> : f64
      memref.store %rs, %rows[%i] : memref<1000xf64>
      %s = memref.load %total[] : memref<f64>
      %t = arith.addf %s, %v fastmath<reassoc> : f64
      memref.store %t, %total[] : memref<f64>
    }
  }
  return
}
