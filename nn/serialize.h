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
void save_safetensors(const StateDict& dict, const std::string& path);
/// Reads every tensor of a safetensors file (in file order). Throws kiln::Error naming the
/// path on a missing/corrupt file or an unsupported dtype.
StateDict load_safetensors(const std::string& path);

}  // namespace kiln::nn
