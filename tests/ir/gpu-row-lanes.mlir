// kiln-gpu-row-lanes (codegen/gpu_row_lanes.cpp): row loops whose threads run serial loops
// along the row's last dim become loops over (rows, 32 lanes); lane l runs columns l, l + 32,
// ..., keeps each reduction's part in a register and the lanes combine parts with a shuffle
// butterfly. Loops the analysis cannot show safe are left alone.
// RUN: kiln-opt %s --split-input-file --kiln-gpu-row-lanes | FileCheck %s
// RUN: kiln-opt %s --split-input-file --kiln-gpu-row-lanes=lanes=1 | FileCheck %s --check-prefix=ONE
// RUN: not kiln-opt %s --split-input-file --kiln-gpu-row-lanes=lanes=16 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: kiln-opt %s --split-input-file --kiln-gpu-row-lanes=per-lane=4 | FileCheck %s --check-prefix=FOUR

// Softmax's shape: the max's init is stored in the body (its value is used, the store dropped),
// the exp loop writes a column buffer, the row max is used from the register afterwards.
// CHECK-LABEL: func.func @softmax_rows
// CHECK-DAG:     %[[NEG_INF:.*]] = arith.constant 0xFF800000 : f32
// CHECK:         scf.parallel (%[[ROW:.*]], %[[LANE:.*]]) = ({{.*}}) to (%{{.*}}, %c32)
// CHECK-NOT:       memref.store %[[NEG_INF]]
// CHECK:           %[[PART:.*]] = scf.for %[[J:.*]] = %[[LANE]] to %{{.*}} step %c32{{.*}} iter_args(%[[P:.*]] = %{{.*}}) -> (f32)
// CHECK:             memref.load %{{.*}}[%[[ROW]], %[[J]]]
// CHECK:             arith.maximumf
// CHECK:           gpu.shuffle  xor %[[PART]], %c16_i32, %c32_i32{{.*}} : f32
// CHECK:           gpu.shuffle  xor %{{.*}}, %c8_i32, %c32_i32{{.*}} : f32
// CHECK:           gpu.shuffle  xor %{{.*}}, %c4_i32, %c32_i32{{.*}} : f32
// CHECK:           gpu.shuffle  xor %{{.*}}, %c2_i32, %c32_i32{{.*}} : f32
// CHECK:           gpu.shuffle  xor %{{.*}}, %c1_i32, %c32_i32{{.*}} : f32
// CHECK:           %[[MAX:.*]] = arith.maximumf %{{.*}}, %[[NEG_INF]] : f32
// CHECK-NOT:       nvvm.bar.warp.sync
// CHECK:           memref.store %[[MAX]], %[[ACC:.*]][%[[ROW]], %{{.*}}]
// CHECK:           scf.for %[[K:.*]] = %[[LANE]] to %{{.*}} step %c32{{.*}} {
// CHECK-NOT:         memref.load %[[ACC]]
// CHECK:             arith.subf %{{.*}}, %[[MAX]]
// CHECK:             memref.store %{{.*}}[%[[ROW]], %[[K]]]
// With 4 columns per lane and step, every column's loads come before any column's store, so a
// lane has 4 loads in flight; columns past the row's end read the step's first column, keep the
// running max as it was and store nothing.
// FOUR-LABEL: func.func @softmax_rows
// FOUR:         scf.parallel (%[[ROW:.*]], %[[LANE:.*]]) = ({{.*}}) to (%{{.*}}, %c32)
// FOUR:           scf.for %[[J:.*]] = %[[LANE]] to %c128 step %c128{{.*}} iter_args(%[[P:.*]] = %{{.*}}) -> (f32)
// FOUR-NEXT:        %[[V0:.*]] = memref.load %{{.*}}[%[[ROW]], %[[J]]]
// FOUR-NEXT:        %[[M0:.*]] = arith.maximumf %[[V0]], %[[P]]
// FOUR:             %[[AT1:.*]] = arith.addi %[[J]], %c32
// FOUR-NEXT:        %[[IN1:.*]] = arith.cmpi ult, %[[AT1]], %c128
// FOUR-NEXT:        %[[C1:.*]] = arith.select %[[IN1]], %[[AT1]], %[[J]]
// FOUR-NEXT:        %[[V1:.*]] = memref.load %{{.*}}[%[[ROW]], %[[C1]]]
// FOUR-NEXT:        %[[M1:.*]] = arith.maximumf %[[V1]], %[[M0]]
// FOUR-NEXT:        arith.select %[[IN1]], %[[M1]], %[[M0]]
// FOUR-COUNT-2:     memref.load
// FOUR-NOT:         scf.if
// FOUR:             scf.yield
// FOUR-COUNT-5:   gpu.shuffle  xor
// FOUR:           scf.for %[[K:.*]] = %[[LANE]] to %c128 step %c128
// FOUR-COUNT-4:     memref.load %{{.*}}[%[[ROW]], %{{.*}}] : memref<?x128xf32>
// FOUR-NOT:         memref.load
// FOUR:             memref.store %{{.*}}, %{{.*}}[%[[ROW]], %[[K]]]
// FOUR-NEXT:        scf.if %{{.*}} {
// FOUR-NEXT:          memref.store
// FOUR-NEXT:        }
// FOUR-COUNT-2:     scf.if
// ONE-LABEL: func.func @softmax_rows
// ONE:         scf.parallel (%{{.*}}, %{{.*}}) = ({{.*}}) to (%{{.*}}, %c1{{.*}})
// ONE-NOT:     gpu.shuffle
// ONE-LABEL: func.func @sum_without_init
// BAD: row lanes must be 1 or 32
func.func @softmax_rows(%x: memref<?x128xf32>, %y: memref<?x128xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c128 = arith.constant 128 : index
  %neg_inf = arith.constant 0xFF800000 : f32
  %n = memref.dim %x, %c0 : memref<?x128xf32>
  %max = memref.alloc(%n) : memref<?x1xf32>
  scf.parallel (%r) = (%c0) to (%n) step (%c1) {
    memref.store %neg_inf, %max[%r, %c0] : memref<?x1xf32>
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %x[%r, %j] : memref<?x128xf32>
      %m = memref.load %max[%r, %c0] : memref<?x1xf32>
      %new = arith.maximumf %v, %m : f32
      memref.store %new, %max[%r, %c0] : memref<?x1xf32>
    }
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %x[%r, %j] : memref<?x128xf32>
      %m = memref.load %max[%r, %c0] : memref<?x1xf32>
      %d = arith.subf %v, %m : f32
      memref.store %d, %y[%r, %j] : memref<?x128xf32>
    }
    scf.reduce
  }
  memref.dealloc %max : memref<?x1xf32>
  return
}

// -----

// The sum's initial value comes from another loop: loaded before the lanes' loop, and a warp
// sync keeps every lane's load before any lane's store. The part starts at -0.0.
// CHECK-LABEL: func.func @sum_without_init
// CHECK:         scf.parallel (%[[ROW:.*]], %[[LANE:.*]]) =
// CHECK:           %[[INIT:.*]] = memref.load %[[ACC:.*]][%[[ROW]]]
// CHECK:           %[[PART:.*]] = scf.for {{.*}} iter_args(%{{.*}} = %cst{{.*}}) -> (f64)
// CHECK-COUNT-5:   gpu.shuffle  xor
// CHECK:           %[[SUM:.*]] = arith.addf %[[INIT]], %{{.*}} : f64
// CHECK-NEXT:      %[[ALL:.*]] = arith.constant -1 : i32
// CHECK-NEXT:      nvvm.bar.warp.sync %[[ALL]]
// CHECK-NEXT:      memref.store %[[SUM]], %[[ACC]][%[[ROW]]]
func.func @sum_without_init(%x: memref<?x256xf64>, %acc: memref<?xf64>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c256 = arith.constant 256 : index
  %n = memref.dim %x, %c0 : memref<?x256xf64>
  scf.parallel (%r) = (%c0) to (%n) step (%c1) {
    scf.for %j = %c0 to %c256 step %c1 {
      %v = memref.load %x[%r, %j] : memref<?x256xf64>
      %a = memref.load %acc[%r] : memref<?xf64>
      %s = arith.addf %a, %v : f64
      memref.store %s, %acc[%r] : memref<?xf64>
    }
    scf.reduce
  }
  return
}

// -----

// Refused: a running sum also stored per column (a cumsum) would store lanes' parts.
// CHECK-LABEL: func.func @running_sum
// CHECK-NOT:     gpu.shuffle
// CHECK:         scf.parallel (%{{[^,]*}}) =
func.func @running_sum(%x: memref<?x128xf32>, %acc: memref<?xf32>, %y: memref<?x128xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c128 = arith.constant 128 : index
  %zero = arith.constant 0.0 : f32
  %n = memref.dim %x, %c0 : memref<?x128xf32>
  scf.parallel (%r) = (%c0) to (%n) step (%c1) {
    memref.store %zero, %acc[%r] : memref<?xf32>
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %x[%r, %j] : memref<?x128xf32>
      %a = memref.load %acc[%r] : memref<?xf32>
      %s = arith.addf %a, %v : f32
      memref.store %s, %acc[%r] : memref<?xf32>
      memref.store %s, %y[%r, %j] : memref<?x128xf32>
    }
    scf.reduce
  }
  return
}

// -----

// Refused: a column buffer read at another column (reversed) than the one its lane wrote.
// CHECK-LABEL: func.func @reversed_read
// CHECK-NOT:     gpu.shuffle
// CHECK:         scf.parallel (%{{[^,]*}}) =
// CHECK:           scf.for %{{.*}} = %c0 to %c128 step %c1 {
func.func @reversed_read(%x: memref<?x128xf32>, %t: memref<?x128xf32>, %y: memref<?x128xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c127 = arith.constant 127 : index
  %c128 = arith.constant 128 : index
  %n = memref.dim %x, %c0 : memref<?x128xf32>
  scf.parallel (%r) = (%c0) to (%n) step (%c1) {
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %x[%r, %j] : memref<?x128xf32>
      memref.store %v, %t[%r, %j] : memref<?x128xf32>
    }
    scf.for %j = %c0 to %c128 step %c1 {
      %k = arith.subi %c127, %j : index
      %v = memref.load %t[%r, %k] : memref<?x128xf32>
      memref.store %v, %y[%r, %j] : memref<?x128xf32>
    }
    scf.reduce
  }
  return
}

// -----

// Refused: a column sum's loop runs over rows (its index is not the last one): a thread per
// column reads neighbouring columns already.
// CHECK-LABEL: func.func @column_sum
// CHECK-NOT:     gpu.shuffle
func.func @column_sum(%x: memref<4096x512xf32>, %acc: memref<512xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c512 = arith.constant 512 : index
  %c4096 = arith.constant 4096 : index
  %zero = arith.constant 0.0 : f32
  scf.parallel (%c) = (%c0) to (%c512) step (%c1) {
    memref.store %zero, %acc[%c] : memref<512xf32>
    scf.for %r = %c0 to %c4096 step %c1 {
      %v = memref.load %x[%r, %c] : memref<4096x512xf32>
      %a = memref.load %acc[%c] : memref<512xf32>
      %s = arith.addf %a, %v : f32
      memref.store %s, %acc[%c] : memref<512xf32>
    }
    scf.reduce
  }
  return
}

// -----

// A load after a store in a column loop (it reads back what the column wrote) must stay after
// it: that loop keeps one column per lane and step; the other loop of the row still takes 4.
// CHECK-LABEL: func.func @read_back
// CHECK:         scf.for %{{.*}} step %c32
// CHECK:         scf.for %{{.*}} step %c32
// CHECK-COUNT-5:   gpu.shuffle  xor
// ONE-LABEL: func.func @read_back
// FOUR-LABEL: func.func @read_back
// FOUR:         scf.parallel (%[[ROW:.*]], %[[LANE:.*]]) =
// FOUR:           scf.for %[[J:.*]] = %[[LANE]] to %c128 step %c32{{.*}} {
// FOUR-NEXT:        %[[V:.*]] = memref.load %{{.*}}[%[[ROW]], %[[J]]]
// FOUR-NEXT:        memref.store %[[V]], %[[T:.*]][%[[ROW]], %[[J]]]
// FOUR-NEXT:        %[[W:.*]] = memref.load %[[T]][%[[ROW]], %[[J]]]
// FOUR:             memref.store %{{.*}}, %{{.*}}[%[[ROW]], %[[J]]]
// FOUR:           scf.for %{{.*}} = %[[LANE]] to %c128 step %c128
func.func @read_back(%x: memref<?x128xf32>, %t: memref<?x128xf32>, %y: memref<?x128xf32>,
                     %acc: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c128 = arith.constant 128 : index
  %zero = arith.constant 0.0 : f32
  %n = memref.dim %x, %c0 : memref<?x128xf32>
  scf.parallel (%r) = (%c0) to (%n) step (%c1) {
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %x[%r, %j] : memref<?x128xf32>
      memref.store %v, %t[%r, %j] : memref<?x128xf32>
      %w = memref.load %t[%r, %j] : memref<?x128xf32>
      %d = arith.mulf %w, %w : f32
      memref.store %d, %y[%r, %j] : memref<?x128xf32>
    }
    memref.store %zero, %acc[%r] : memref<?xf32>
    scf.for %j = %c0 to %c128 step %c1 {
      %v = memref.load %y[%r, %j] : memref<?x128xf32>
      %a = memref.load %acc[%r] : memref<?xf32>
      %s = arith.addf %a, %v : f32
      memref.store %s, %acc[%r] : memref<?xf32>
    }
    scf.reduce
  }
  return
}

// -----

// 64 columns are 2 per lane: a step takes 2, not 4 (columns 3 and 4 would always be past the
// end).
// CHECK-LABEL: func.func @two_per_lane
// ONE-LABEL: func.func @two_per_lane
// FOUR-LABEL: func.func @two_per_lane
// FOUR:         scf.for %{{.*}} = %{{.*}} to %c64 step %c64
// FOUR-COUNT-2:   memref.load %{{.*}} : memref<?x64xf32>
// FOUR-NOT:       memref.load
// FOUR:           scf.yield
func.func @two_per_lane(%x: memref<?x64xf32>, %acc: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c64 = arith.constant 64 : index
  %zero = arith.constant 0.0 : f32
  %n = memref.dim %x, %c0 : memref<?x64xf32>
  scf.parallel (%r) = (%c0) to (%n) step (%c1) {
    memref.store %zero, %acc[%r] : memref<?xf32>
    scf.for %j = %c0 to %c64 step %c1 {
      %v = memref.load %x[%r, %j] : memref<?x64xf32>
      %a = memref.load %acc[%r] : memref<?xf32>
      %s = arith.addf %a, %v : f32
      memref.store %s, %acc[%r] : memref<?xf32>
    }
    scf.reduce
  }
  return
}
