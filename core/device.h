#pragma once
/// Device: where a tensor's storage lives (cpu, or cuda:N).
#include <cstdint>
#include <string>

#include "core/error.h"

namespace kiln {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int8_t index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, static_cast<int8_t>(index)}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  /// "cpu", "cuda:0"
  std::string str() const {
    return is_cpu() ? "cpu" : "cuda:" + std::to_string(index);
  }
  friend bool operator==(const Device&, const Device&) = default;
};

/// Throws kiln::Error naming `op` and `loc` for a DeviceType out of range (an integer cast to
/// DeviceType), which would otherwise be taken for CUDA.
inline void check_device(Device d, const char* op, Loc loc) {
  KILN_CHECK(d.type == DeviceType::CPU || d.type == DeviceType::CUDA, op, loc,
             "invalid DeviceType value {} (expected CPU or CUDA)", static_cast<int>(d.type));
}

}  // namespace kiln
