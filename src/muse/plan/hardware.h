// Hardware descriptions for `muse plan`: how much memory each tier holds and
// how fast each path reads. Built-in profiles carry the public figures cited
// in docs/plan.md; every figure can be overridden from the command line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "muse/core/status.h"

namespace muse::plan {

// Discrete: GPUs with their own memory, host DRAM behind a link (PCIe or C2C).
// Unified: one memory pool shared by CPU and GPU (Apple silicon); nothing to
// offload to. CpuOnly: the model runs from host DRAM (Xeon sockets).
enum class MemoryKind { Discrete, Unified, CpuOnly };
const char* memory_kind_name(MemoryKind kind);

struct HardwareProfile {
  std::string name;         // profile name, or "custom"
  std::string description;  // one line, e.g. "1 x NVIDIA GB300 (DGX Station)"
  MemoryKind kind = MemoryKind::Discrete;
  int devices = 1;                    // GPUs (Discrete), chips (Unified), sockets (CpuOnly)
  int64_t device_memory_bytes = 0;    // per device; for Unified/CpuOnly the whole pool / devices
  double device_bandwidth = 0;        // bytes/s per device
  int64_t host_memory_bytes = 0;      // Discrete only: host DRAM of the whole machine
  double host_bandwidth = 0;          // bytes/s of host DRAM, whole machine
  double link_bandwidth = 0;          // bytes/s host->device per device, one direction
  std::string device_memory_label;    // "HBM3e", "LPDDR5X unified", "DDR5"
  std::string link_label;             // "PCIe Gen5 x16", "NVLink-C2C"
  std::string source;                 // short citation; docs/plan.md has the full list
};

// The built-in names, in the order `muse plan --help` lists them.
std::vector<std::string> hardware_profile_names();
// Unknown names are an error that lists the valid ones.
Result<HardwareProfile> find_hardware_profile(std::string_view name);

// Command-line overrides. Memory in GiB (vLLM's "-gb" flags are GiB),
// bandwidth in GB/s (10^9 bytes/s, as vendors quote it).
struct HardwareOverrides {
  std::optional<int> gpus;
  std::optional<double> gpu_memory_gib;
  std::optional<double> gpu_bandwidth_gbs;
  std::optional<double> host_memory_gib;
  std::optional<double> host_bandwidth_gbs;
  std::optional<double> link_bandwidth_gbs;
  bool any() const {
    return gpus || gpu_memory_gib || gpu_bandwidth_gbs || host_memory_gib || host_bandwidth_gbs || link_bandwidth_gbs;
  }
};

// Builds the hardware from an optional profile name plus overrides. Without a
// profile, --gpu-memory-gb and --gpu-bandwidth-gbs are required (a discrete
// machine; host figures default to none, so nothing can be offloaded).
// Impossible numbers (zero GPUs, negative or absurd sizes) are errors.
Result<HardwareProfile> resolve_hardware(const std::string& profile_name, const HardwareOverrides& overrides);

}  // namespace muse::plan
