// kiln-cpu-row-loops (codegen/column_fusion.cpp, codegen/row_prefetch.cpp): in a CPU row loop,
// consecutive column loops merge when each iteration then reads what it read before, and each
// row prefetches the next row of the inputs it reads.
// RUN: kiln-opt %s --split-input-file --kiln-cpu-row-loops | FileCheck %s

// Softmax's exp, stored in the output, and its float64 sum: one loop, the sum's initial value
// moved above it, the scale after the sum left alone (it needs the whole sum). The sum, only
// rounded to float32, then runs in a float32 partial (cpu-blocked-sums.mlir). The merged loop
// widens float32 to float64, so it asks for float32's 16 lanes (it has 1024 columns: at least
// 64 are needed, 4 steps of 16).
// CHECK-LABEL: func.func @exp_and_sum
// CHECK:         scf.parallel (%[[ROW:.*]]) =
// CHECK:           memref.store %{{.*}}, %[[SUM:.*]][%c0{{.*}}, %c0{{.*}}] : memref<1x1xf64>
// CHECK:           scf.for %[[J:.*]] = {{.*}} iter_args
// CHECK:             math.exp
// CHECK-NEXT:        memref.store %{{.*}}, %[[OUT:[a-z0-9_]+]][%[[ROW]], %[[J]]]
// CHECK-NEXT:        memref.load %[[OUT]][%[[ROW]], %[[J]]]
// CHECK-NEXT:        arith.addf {{.*}} fastmath<reassoc> : f32
// CHECK-NEXT:        scf.yield
// CHECK-NEXT:      } {llvm.loop_annotation = #{{.*}}}
// CHECK:           arith.addf {{.*}} fastmath<reassoc> : f64
// CHECK-NEXT:      memref.store %{{.*}}, %[[SUM]]
// CHECK:           arith.divf
// CHECK:           scf.for
// CHECK:             arith.mulf
// CHECK:           }
// CHECK-NOT:       scf.for
// CHECK:         scf.reduce
func.func @exp_and_sum(%x: memref<?x1024xf32>, %out: memref<?x1024xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c1024 = arith.constant 1024 : index
  %zero = arith.constant 0.0 : f64
  %one = arith.constant 1.0 : f32
  %rows = memref.dim %x, %c0 : memref<?x1024xf32>
  %sum = memref.alloc() : memref<1x1xf64>
  %inv = memref.alloc() : memref<1x1xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c1024 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x1024xf32>
      %e = math.exp %v : f32
      memref.store %e, %out[%i, %j] : memref<?x1024xf32>
    }
    memref.store %zero, %sum[%c0, %c0] : memref<1x1xf64>
    scf.for %j = %c0 to %c1024 step %c1 {
      %e = memref.load %out[%i, %j] : memref<?x1024xf32>
      %s = memref.load %sum[%c0, %c0] : memref<1x1xf64>
      %w = arith.extf %e : f32 to f64
      %t = arith.addf %s, %w fastmath<reassoc> {kiln_nonnegative_terms, kiln_widened_float32_sum} : f64
      memref.store %t, %sum[%c0, %c0] : memref<1x1xf64>
    }
    %s = memref.load %sum[%c0, %c0] : memref<1x1xf64>
    %sf = arith.truncf %s : f64 to f32
    %r = arith.divf %one, %sf : f32
    memref.store %r, %inv[%c0, %c0] : memref<1x1xf32>
    scf.for %j = %c0 to %c1024 step %c1 {
      %e = memref.load %out[%i, %j] : memref<?x1024xf32>
      %q = memref.load %inv[%c0, %c0] : memref<1x1xf32>
      %p = arith.mulf %e, %q : f32
      memref.store %p, %out[%i, %j] : memref<?x1024xf32>
    }
    scf.reduce
  }
  memref.dealloc %sum : memref<1x1xf64>
  memref.dealloc %inv : memref<1x1xf32>
  return
}

// -----

// Two sums of one row in float32 (a layer_norm backward's two row sums): one loop, and no
// vectorization hint (nothing widens).
// CHECK-LABEL: func.func @sibling_sums
// CHECK:         scf.parallel
// CHECK:           scf.for
// CHECK:             arith.addf
// CHECK:             arith.addf
// CHECK-NEXT:        memref.store
// CHECK-NEXT:      }{{$}}
// CHECK-NOT:       scf.for
// CHECK:         scf.reduce
func.func @sibling_sums(%x: memref<?x8xf32>, %y: memref<?x8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %zero = arith.constant 0.0 : f32
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %a = memref.alloc() : memref<1x1xf32>
  %b = memref.alloc() : memref<1x1xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    memref.store %zero, %a[%c0, %c0] : memref<1x1xf32>
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %s = memref.load %a[%c0, %c0] : memref<1x1xf32>
      %t = arith.addf %s, %v fastmath<reassoc> : f32
      memref.store %t, %a[%c0, %c0] : memref<1x1xf32>
    }
    memref.store %zero, %b[%c0, %c0] : memref<1x1xf32>
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %w = memref.load %y[%i, %j] : memref<?x8xf32>
      %p = arith.mulf %v, %w : f32
      %s = memref.load %b[%c0, %c0] : memref<1x1xf32>
      %t = arith.addf %s, %p fastmath<reassoc> : f32
      memref.store %t, %b[%c0, %c0] : memref<1x1xf32>
    }
    scf.reduce
  }
  memref.dealloc %a : memref<1x1xf32>
  memref.dealloc %b : memref<1x1xf32>
  return
}

// -----

// Kept apart, one reason each:
// - a sum in order (no reassoc: LLVM would not vectorize it, nor then the loop joining it);
// CHECK-LABEL: func.func @ordered_sum
// CHECK:         scf.for
// CHECK:         scf.for
func.func @ordered_sum(%x: memref<?x8xf32>, %out: memref<?x8xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %zero = arith.constant 0.0 : f32
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %sum = memref.alloc() : memref<1x1xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %e = math.exp %v : f32
      memref.store %e, %out[%i, %j] : memref<?x8xf32>
    }
    memref.store %zero, %sum[%c0, %c0] : memref<1x1xf32>
    scf.for %j = %c0 to %c8 step %c1 {
      %e = memref.load %out[%i, %j] : memref<?x8xf32>
      %s = memref.load %sum[%c0, %c0] : memref<1x1xf32>
      %t = arith.addf %s, %e : f32
      memref.store %t, %sum[%c0, %c0] : memref<1x1xf32>
    }
    scf.reduce
  }
  memref.dealloc %sum : memref<1x1xf32>
  return
}

// -----

// - the second loop reads another column of what the first writes (column 0: written in the
//   first loop's first iteration, but read in every one after the merge);
// CHECK-LABEL: func.func @other_column
// CHECK:         scf.for
// CHECK:         scf.for
func.func @other_column(%x: memref<?x8xf32>, %out: memref<?x8xf32> {llvm.noalias}, %out2: memref<?x8xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c7 = arith.constant 7 : index
  %c8 = arith.constant 8 : index
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      memref.store %v, %out[%i, %j] : memref<?x8xf32>
    }
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %out[%i, %c7] : memref<?x8xf32>
      memref.store %v, %out2[%i, %j] : memref<?x8xf32>
    }
    scf.reduce
  }
  return
}

// -----

// - the second loop writes an argument that may share memory with the first's input (no
//   llvm.noalias);
// CHECK-LABEL: func.func @may_alias
// CHECK:         scf.for
// CHECK:         scf.for
func.func @may_alias(%x: memref<?x8xf32>, %out: memref<?x8xf32> {llvm.noalias}, %y: memref<?x8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      memref.store %v, %out[%i, %j] : memref<?x8xf32>
    }
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %out[%i, %j] : memref<?x8xf32>
      memref.store %v, %y[%i, %j] : memref<?x8xf32>
    }
    scf.reduce
  }
  return
}

// -----

// - what lies between reads the first loop's accumulator (the max before exp(x - max));
// CHECK-LABEL: func.func @needs_whole_result
// CHECK:         scf.for
// CHECK:         memref.load
// CHECK:         scf.for
func.func @needs_whole_result(%x: memref<?x8xf32>, %out: memref<?x8xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %neg_inf = arith.constant 0xFF800000 : f32
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %max = memref.alloc() : memref<1x1xf32>
  %m2 = memref.alloc() : memref<1x1xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    memref.store %neg_inf, %max[%c0, %c0] : memref<1x1xf32>
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %m = memref.load %max[%c0, %c0] : memref<1x1xf32>
      %n = arith.maximumf %v, %m : f32
      memref.store %n, %max[%c0, %c0] : memref<1x1xf32>
    }
    %m = memref.load %max[%c0, %c0] : memref<1x1xf32>
    memref.store %m, %m2[%c0, %c0] : memref<1x1xf32>
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %mm = memref.load %m2[%c0, %c0] : memref<1x1xf32>
      %d = arith.subf %v, %mm : f32
      memref.store %d, %out[%i, %j] : memref<?x8xf32>
    }
    scf.reduce
  }
  memref.dealloc %max : memref<1x1xf32>
  memref.dealloc %m2 : memref<1x1xf32>
  return
}

// -----

// - what lies between writes an allocation the first loop reads through a view (moved above
//   it, the store would change what it reads);
// CHECK-LABEL: func.func @between_writes_a_view
// CHECK:         scf.for
// CHECK:         memref.store %{{.*}}, %alloc
// CHECK:         scf.for
func.func @between_writes_a_view(%x: memref<?x8xf32>, %out: memref<?x8xf32> {llvm.noalias}, %out2: memref<?x8xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c8 = arith.constant 8 : index
  %two = arith.constant 2.0 : f32
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %buf = memref.alloc() : memref<1x8xf32>
  %flat = memref.collapse_shape %buf [[0, 1]] : memref<1x8xf32> into memref<8xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %flat[%j] : memref<8xf32>
      memref.store %v, %out[%i, %j] : memref<?x8xf32>
    }
    memref.store %two, %buf[%c0, %c3] : memref<1x8xf32>
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      memref.store %v, %out2[%i, %j] : memref<?x8xf32>
    }
    scf.reduce
  }
  memref.dealloc %buf : memref<1x8xf32>
  return
}

// -----

// - the second loop reads the first one's accumulator in each column (a running value).
// CHECK-LABEL: func.func @reads_accumulator
// CHECK:         scf.for
// CHECK:         scf.for
func.func @reads_accumulator(%x: memref<?x8xf32>, %out: memref<?x8xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %max = memref.alloc() : memref<1x1xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %m = memref.load %max[%c0, %c0] : memref<1x1xf32>
      %n = arith.maximumf %v, %m : f32
      memref.store %n, %max[%c0, %c0] : memref<1x1xf32>
    }
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %m = memref.load %max[%c0, %c0] : memref<1x1xf32>
      %d = arith.subf %v, %m : f32
      memref.store %d, %out[%i, %j] : memref<?x8xf32>
    }
    scf.reduce
  }
  memref.dealloc %max : memref<1x1xf32>
  return
}

// -----

// - the second loop stores its running sum in each column (a cumulative sum: no reduction LLVM
//   vectorizes, and the first loop would lose its vectors with it).
// CHECK-LABEL: func.func @running_sum
// CHECK:         scf.for
// CHECK:         scf.for
func.func @running_sum(%x: memref<?x8xf32>, %out: memref<?x8xf32> {llvm.noalias}, %out2: memref<?x8xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %acc = memref.alloc() : memref<1x1xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      memref.store %v, %out[%i, %j] : memref<?x8xf32>
    }
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %s = memref.load %acc[%c0, %c0] : memref<1x1xf32>
      %t = arith.addf %s, %v fastmath<reassoc> : f32
      memref.store %t, %acc[%c0, %c0] : memref<1x1xf32>
      memref.store %t, %out2[%i, %j] : memref<?x8xf32>
    }
    scf.reduce
  }
  memref.dealloc %acc : memref<1x1xf32>
  return
}

// -----

// - the second loop sums into an output's element (LLVM cannot keep it in a register next to
//   the first loop's stores to another argument).
// CHECK-LABEL: func.func @sum_in_output
// CHECK:         scf.for
// CHECK:         scf.for
func.func @sum_in_output(%x: memref<?x8xf32>, %out: memref<?x8xf32> {llvm.noalias}, %sum: memref<?xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      memref.store %v, %out[%i, %j] : memref<?x8xf32>
    }
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %s = memref.load %sum[%i] : memref<?xf32>
      %t = arith.addf %s, %v fastmath<reassoc> : f32
      memref.store %t, %sum[%i] : memref<?xf32>
    }
    scf.reduce
  }
  return
}

// -----

// - the loops count in different integer types (i32 and index: the merged body would index
//   with an i32);
// CHECK-LABEL: func.func @other_index_type
// CHECK:         scf.for {{.*}} : i32
// CHECK:         scf.for
func.func @other_index_type(%x: memref<?x8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %i0 = arith.constant 0 : i32
  %i1 = arith.constant 1 : i32
  %i8 = arith.constant 8 : i32
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %a = memref.alloc() : memref<1xf32>
  %b = memref.alloc() : memref<1xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %i0 to %i8 step %i1 : i32 {
      %jj = arith.index_cast %j : i32 to index
      %v = memref.load %x[%i, %jj] : memref<?x8xf32>
      %s = memref.load %a[%c0] : memref<1xf32>
      %t = arith.addf %s, %v fastmath<reassoc> : f32
      memref.store %t, %a[%c0] : memref<1xf32>
    }
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %s = memref.load %b[%c0] : memref<1xf32>
      %t = arith.maximumf %s, %v : f32
      memref.store %t, %b[%c0] : memref<1xf32>
    }
    scf.reduce
  }
  memref.dealloc %a : memref<1xf32>
  memref.dealloc %b : memref<1xf32>
  return
}

// -----

// Prefetch: a row of 256 floats (1 KiB, 16 cache lines) of the input, the next row's (the last
// row's own for the last), at each line; not the output, which the row writes.
// CHECK-LABEL: func.func @prefetch
// CHECK:         scf.parallel (%[[ROW:.*]]) = (%{{.*}}) to (%[[ROWS:.*]]) step (%[[STEP:.*]]) {
// CHECK:           %[[LAST:.*]] = arith.subi %[[ROWS]], %c1{{.*}}
// CHECK:           %[[NEXT:.*]] = arith.addi %[[ROW]], %[[STEP]]
// CHECK:           %[[AT:.*]] = arith.minsi %[[NEXT]], %[[LAST]]
// CHECK:           memref.prefetch %[[X:.*]][%[[AT]], %c0{{.*}}], read, locality<3>, data
// CHECK-COUNT-15:  memref.prefetch %[[X]][%[[AT]], %{{.*}}], read, locality<3>, data
// CHECK-NOT:       memref.prefetch
// CHECK:           scf.for
func.func @prefetch(%x: memref<?x256xf32>, %out: memref<?x256xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c256 = arith.constant 256 : index
  %rows = memref.dim %x, %c0 : memref<?x256xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c256 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x256xf32>
      %w = memref.load %out[%i, %j] : memref<?x256xf32>
      %s = arith.addf %v, %w : f32
      memref.store %s, %out[%i, %j] : memref<?x256xf32>
    }
    scf.reduce
  }
  return
}

// -----

// No prefetch for rows shorter than a cache line (8 floats) or longer than 16 KiB.
// CHECK-LABEL: func.func @no_prefetch
// CHECK-NOT:     memref.prefetch
// CHECK:         return
func.func @no_prefetch(%x: memref<?x8xf32>, %y: memref<?x8192xf32>, %out: memref<?x8xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %w = memref.load %y[%i, %j] : memref<?x8192xf32>
      %s = arith.addf %v, %w : f32
      memref.store %s, %out[%i, %j] : memref<?x8xf32>
    }
    scf.reduce
  }
  return
}

// -----

// Softmax's exp and sum over 8 columns merge too, without the 16-lane hint (LLVM could not
// follow it: it would warn, and keep the loop scalar).
// CHECK-LABEL: func.func @short_exp_and_sum
// CHECK:         scf.for
// CHECK:           math.exp
// CHECK:           arith.addf {{.*}} : f32
// CHECK-NEXT:      scf.yield
// CHECK-NEXT:    }{{$}}
// CHECK-NOT:     scf.for
func.func @short_exp_and_sum(%x: memref<?x8xf32>, %out: memref<?x8xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %zero = arith.constant 0.0 : f64
  %rows = memref.dim %x, %c0 : memref<?x8xf32>
  %sum = memref.alloc() : memref<1x1xf64>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %c8 step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x8xf32>
      %e = math.exp %v : f32
      memref.store %e, %out[%i, %j] : memref<?x8xf32>
    }
    memref.store %zero, %sum[%c0, %c0] : memref<1x1xf64>
    scf.for %j = %c0 to %c8 step %c1 {
      %e = memref.load %out[%i, %j] : memref<?x8xf32>
      %s = memref.load %sum[%c0, %c0] : memref<1x1xf64>
      %w = arith.extf %e : f32 to f64
      %t = arith.addf %s, %w fastmath<reassoc> {kiln_nonnegative_terms, kiln_widened_float32_sum} : f64
      memref.store %t, %sum[%c0, %c0] : memref<1x1xf64>
    }
    scf.reduce
  }
  memref.dealloc %sum : memref<1x1xf64>
  return
}

// -----

// At most 16 KiB of next rows in all: of two inputs with 12 KiB rows, the first one read.
// CHECK-LABEL: func.func @prefetch_budget
// CHECK-COUNT-192: memref.prefetch %arg0
// CHECK-NOT:       memref.prefetch
// CHECK:           scf.for
func.func @prefetch_budget(%x: memref<?x3072xf32>, %y: memref<?x3072xf32>, %out: memref<?x3072xf32> {llvm.noalias}) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = arith.constant 3072 : index
  %rows = memref.dim %x, %c0 : memref<?x3072xf32>
  scf.parallel (%i) = (%c0) to (%rows) step (%c1) {
    scf.for %j = %c0 to %n step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x3072xf32>
      %w = memref.load %y[%i, %j] : memref<?x3072xf32>
      %s = arith.addf %v, %w : f32
      memref.store %s, %out[%i, %j] : memref<?x3072xf32>
    }
    scf.reduce
  }
  return
}
