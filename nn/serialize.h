#pragma once
/// safetensors files (https://github.com/huggingface/safetensors, format spec in its README):
/// 8 bytes little-endian u64 N, then N bytes of JSON header
///   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
/// then the raw little-endian tensor bytes (row-major). Offsets are relative to the byte
/// after the header. kiln writes BOOL, I32, I64, F32, F64.
#include <string>

#include "nn/module.h"

namespace kiln::nn {

/// Writes `dict` to `path`. Throws kiln::Error if the file cannot be written.
void save_safetensors(const StateDict& dict, const std::string& path, Loc loc = Loc::current());
/// Reads every tensor of a safetensors file (in file order). Throws kiln::Error naming the
/// path and `loc` on a missing, unreadable (a directory) or corrupt file: a bad header
/// (objects nested more than 64 deep, a tensor name given twice, bad offsets), an unsupported
/// dtype, or a BOOL tensor with a byte other than 0 or 1.
StateDict load_safetensors(const std::string& path, Loc loc = Loc::current());

}  // namespace kiln::nn
