# lit configuration for kiln's IR tests. ctest runs:
#   lit --param tools=<dir of kiln-opt> --param exec_root=<build dir> tests/ir
import os

import lit.formats

config.name = "kiln-ir"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = lit_config.params.get("exec_root", os.path.join(config.test_source_root, "Output"))

tools = lit_config.params.get("tools", "")
llvm_bin = lit_config.params.get("llvm_bin", "/usr/lib/llvm-22/bin")  # FileCheck, not
config.environment["PATH"] = os.pathsep.join(
    p for p in [tools, llvm_bin, os.environ.get("PATH", "")] if p)
