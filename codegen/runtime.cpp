// The table of runtime symbols (codegen/runtime.h). Each extern kernel adds its entry here.
#include "codegen/runtime.h"

namespace kiln::codegen {

const std::vector<RuntimeSymbol>& runtime_symbols() {
  static const std::vector<RuntimeSymbol> symbols = {};
  return symbols;
}

}  // namespace kiln::codegen
