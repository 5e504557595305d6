// Kernel timers for compiled CPU code and kernel descriptions for CUDA code (kernel_profile.h;
// the timers' runtime side is in runtime.cpp, the CUDA profile's in backends/cuda/profile.cpp).
#include "codegen/kernel_profile.h"

#include <algorithm>
#include <string>

#include "ir/dialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Location.h"

namespace kiln::codegen {
namespace {

constexpr char kBegin[] = "kiln_rt_kernel_begin";
constexpr char kEnd[] = "kiln_rt_kernel_end";
constexpr size_t kMaxLines = 4;  // source lines named per kernel

std::string bound(mlir::Value lb, mlir::Value ub) {
  auto l = mlir::getConstantIntValue(lb), u = mlir::getConstantIntValue(ub);
  return l && u ? std::to_string(*u - *l) : "?";
}

// "[8, 128, 1024]": the trip counts of the loops that nest perfectly from `op` inwards.
std::string nest_shape(mlir::Operation* op) {
  std::string dims;
  auto add = [&](const std::string& d) { dims += (dims.empty() ? "" : ", ") + d; };
  while (op) {
    mlir::Region* body = nullptr;
    if (auto p = llvm::dyn_cast<mlir::scf::ParallelOp>(op)) {
      for (size_t i = 0; i < p.getNumLoops(); ++i)
        add(bound(p.getLowerBound()[i], p.getUpperBound()[i]));
      body = &p.getRegion();
    } else if (auto f = llvm::dyn_cast<mlir::scf::ForOp>(op)) {
      add(bound(f.getLowerBound(), f.getUpperBound()));
      body = &f.getRegion();
    } else {
      break;
    }
    // The next loop, when it is the body's only op besides constants and the terminator.
    mlir::Operation* inner = nullptr;
    int others = 0;
    for (mlir::Operation& o : body->front()) {
      if (llvm::isa<mlir::scf::ParallelOp, mlir::scf::ForOp>(o))
        inner = inner ? nullptr : &o;
      else if (!o.hasTrait<mlir::OpTrait::IsTerminator>() &&
               !llvm::isa<mlir::arith::ConstantOp>(o))
        ++others;
    }
    op = others == 0 ? inner : nullptr;
  }
  return "[" + dims + "]";
}

void add_once(std::vector<std::string>& names, std::string name) {
  if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
}

// The graph ops (name_op_locations' names) and their source lines ("file.cpp:42") inside `loc`
// (fused locations hold several). Only named locations count: a graph parsed without its
// locations has the positions in its own text, which say nothing to the user.
void op_names_and_lines(mlir::Location loc, std::vector<std::string>& ops,
                        std::vector<std::string>& lines) {
  loc->walk([&](mlir::Location l) {
    auto n = llvm::dyn_cast<mlir::NameLoc>(l);
    if (!n) return mlir::WalkResult::advance();
    add_once(ops, n.getName().str());
    n.getChildLoc()->walk([&](mlir::Location c) {
      if (auto f = llvm::dyn_cast<mlir::FileLineColLoc>(c)) {
        std::string file = f.getFilename().str();
        file = file.substr(file.find_last_of('/') + 1);
        add_once(lines, file + ":" + std::to_string(f.getLine()));
      }
      return mlir::WalkResult::advance();
    });
    return mlir::WalkResult::skip();
  });
}

// A GEMM call's size operand (extern_calls.cpp: a constant, or a dim of a memref's strided
// metadata) as text; "?" when it is known at run time only.
std::string gemm_size(mlir::Value v) {
  if (auto c = mlir::getConstantIntValue(v)) return std::to_string(*c);
  auto md = v.getDefiningOp<mlir::memref::ExtractStridedMetadataOp>();
  if (!md) return "?";
  auto type = llvm::cast<mlir::MemRefType>(md.getSource().getType());
  const int64_t dim = static_cast<int64_t>(llvm::cast<mlir::OpResult>(v).getResultNumber()) - 2;
  if (dim < 0 || dim >= type.getRank() || type.isDynamicDim(dim)) return "?";
  return std::to_string(type.getDimSize(dim));
}

// "GEMM [m, k] x [k, n]", after "12 x " for a batch of 12 (kiln_rt_gemm_*'s first operands:
// batch, m, n, k).
std::string describe_gemm(mlir::func::CallOp call) {
  if (call.getNumOperands() < 4) return "GEMM";
  const std::string batch = gemm_size(call.getOperand(0)), m = gemm_size(call.getOperand(1)),
                    n = gemm_size(call.getOperand(2)), k = gemm_size(call.getOperand(3));
  return "GEMM " + (batch == "1" ? "" : batch + " x ") + "[" + m + ", " + k + "] x [" + k + ", " +
         n + "]";
}

// "softmax, mul (model.cpp:12, model.cpp:14)": the graph ops whose names occur in `op`'s
// locations (name_op_locations) and their source lines; "" when there are none.
std::string fused_ops(mlir::Operation* op) {
  std::vector<std::string> ops, lines;
  op->walk([&](mlir::Operation* o) { op_names_and_lines(o->getLoc(), ops, lines); });
  std::string text;
  for (size_t i = 0; i < ops.size(); ++i) text += (i ? ", " : "") + ops[i];
  if (!lines.empty()) {
    text += text.empty() ? "(" : " (";
    for (size_t i = 0; i < std::min(lines.size(), kMaxLines); ++i)
      text += (i ? ", " : "") + lines[i];
    if (lines.size() > kMaxLines) text += ", ...";
    text += ")";
  }
  return text;
}

std::string describe(mlir::Operation* op) {
  std::string what;
  if (auto call = llvm::dyn_cast<mlir::func::CallOp>(op)) {
    // A GEMM's own op is "matmul": its line says enough.
    what = call.getCallee().starts_with("kiln_rt_gemm") ? describe_gemm(call)
                                                          : call.getCallee().str();
    std::vector<std::string> ops, lines;
    op_names_and_lines(op->getLoc(), ops, lines);
    if (!lines.empty()) what += " (" + lines.front() + ")";
    return what;
  }
  what = llvm::isa<mlir::memref::CopyOp>(op) ? "copy" : "loop nest " + nest_shape(op);
  const std::string ops = fused_ops(op);
  return ops.empty() ? what : what + (ops.front() == '(' ? " " : ": ") + ops;
}

}  // namespace

void name_op_locations(mlir::ModuleOp m) {
  m.walk([](mlir::Operation* op) {
    auto kind = op->getAttrOfType<mlir::StringAttr>("kind");
    if (kind && llvm::isa<kiln::dialect::KilnDialect>(op->getDialect()))
      op->setLoc(mlir::NameLoc::get(kind, op->getLoc()));
  });
}

std::vector<std::string> instrument_kernels(mlir::func::FuncOp main) {
  std::vector<std::string> kernels;
  llvm::SmallVector<mlir::Operation*> ops;
  for (mlir::Operation& op : main.getBody().front()) {
    auto call = llvm::dyn_cast<mlir::func::CallOp>(op);
    if (llvm::isa<mlir::scf::ParallelOp, mlir::scf::ForOp, mlir::memref::CopyOp>(op) ||
        (call && call.getCallee() != kBegin && call.getCallee() != kEnd))
      ops.push_back(&op);
  }
  if (ops.empty()) return kernels;
  auto m = main->getParentOfType<mlir::ModuleOp>();
  mlir::OpBuilder b(m.getBodyRegion());
  const mlir::FunctionType type = b.getFunctionType({b.getIndexType()}, {});
  for (const char* name : {kBegin, kEnd}) {
    if (m.lookupSymbol<mlir::func::FuncOp>(name)) continue;
    b.setInsertionPointToStart(m.getBody());
    mlir::func::FuncOp::create(b, m.getLoc(), name, type).setPrivate();
  }
  for (mlir::Operation* op : ops) {
    b.setInsertionPoint(op);
    mlir::Value id = mlir::arith::ConstantIndexOp::create(b, op->getLoc(),
                                                         static_cast<int64_t>(kernels.size()));
    mlir::func::CallOp::create(b, op->getLoc(), kBegin, mlir::TypeRange{}, mlir::ValueRange{id});
    b.setInsertionPointAfter(op);
    mlir::func::CallOp::create(b, op->getLoc(), kEnd, mlir::TypeRange{}, mlir::ValueRange{id});
    kernels.push_back(describe(op));
  }
  return kernels;
}

std::vector<std::pair<std::string, std::string>> describe_gpu_kernels(mlir::ModuleOp m) {
  std::vector<std::pair<std::string, std::string>> kernels;
  m.walk([&](mlir::gpu::GPUFuncOp f) {
    if (!f.isKernel()) return;
    std::string ops = fused_ops(f);
    if (!ops.empty()) kernels.emplace_back(f.getName().str(), std::move(ops));
  });
  return kernels;
}

}  // namespace kiln::codegen
