#include "muse/plan/hardware.h"

#include <cmath>
#include <cstdio>

namespace muse::plan {

namespace {

constexpr double kGB = 1e9;
constexpr int64_t kGiB = int64_t(1) << 30;

// Every figure here is cited in docs/plan.md ("Hardware profiles"). Vendor
// memory sizes are decimal GB as printed on the spec sheet; DRAM sizes made of
// DIMMs or LPDDR packages are binary (GiB).
std::vector<HardwareProfile> builtin_profiles() {
  std::vector<HardwareProfile> p;
  {
    HardwareProfile h;
    h.name = "gb300";
    h.description = "1 x NVIDIA GB300 (DGX Station): Blackwell Ultra + Grace";
    h.kind = MemoryKind::Discrete;
    h.devices = 1;
    h.device_memory_bytes = int64_t(288 * kGB);
    h.device_bandwidth = 8000 * kGB;
    h.host_memory_bytes = 494 * kGiB;  // visible Grace LPDDR5X (seed 000; spec sheet: 496 GB)
    h.host_bandwidth = 396 * kGB;
    h.link_bandwidth = 450 * kGB;  // NVLink-C2C 900 GB/s total = 450 per direction
    h.device_memory_label = "HBM3e";
    h.link_label = "NVLink-C2C";
    h.source = "The Register 2025-03-18 via expert-offload.md 4.1; seed 000";
    p.push_back(h);
  }
  {
    HardwareProfile h;
    h.name = "b300x4";
    h.description = "4 x NVIDIA B300 SXM (HGX Blackwell Ultra), x86 host";
    h.kind = MemoryKind::Discrete;
    h.devices = 4;
    h.device_memory_bytes = int64_t(288 * kGB);
    h.device_bandwidth = 8000 * kGB;
    h.host_memory_bytes = 2048 * kGiB;  // assumption: half of a 4 TB 8-GPU HGX B300 server
    h.host_bandwidth = 819.2 * kGB;     // 2 x Xeon 6776P, 8 x DDR5-6400 each
    h.link_bandwidth = 128 * kGB;       // PCIe 6.0 x16, one direction
    h.device_memory_label = "HBM3e";
    h.link_label = "PCIe 6.0 x16";
    h.source = "DGX B300 2.3 TB HBM3e / 8 GPUs; HGX B300 server specs (see docs/plan.md)";
    p.push_back(h);
  }
  {
    HardwareProfile h;
    h.name = "h200";
    h.description = "1 x NVIDIA H200 SXM, PCIe Gen5 host (the project's test machine)";
    h.kind = MemoryKind::Discrete;
    h.devices = 1;
    h.device_memory_bytes = int64_t(141 * kGB);
    h.device_bandwidth = 4430 * kGB;  // measured streaming read
    h.host_memory_bytes = 128 * kGiB;
    h.host_bandwidth = 83 * kGB;     // measured, 16 threads
    h.link_bandwidth = 55.2 * kGB;   // measured pinned H2D
    h.device_memory_label = "HBM3e";
    h.link_label = "PCIe Gen5 x16";
    h.source = "device-facts.md (measured 2026-11-29)";
    p.push_back(h);
  }
  {
    HardwareProfile h;
    h.name = "h200x8";
    h.description = "8 x NVIDIA H200 SXM (DGX/HGX H200)";
    h.kind = MemoryKind::Discrete;
    h.devices = 8;
    h.device_memory_bytes = int64_t(141 * kGB);
    h.device_bandwidth = 4800 * kGB;
    h.host_memory_bytes = 2048 * kGiB;  // DGX H200: 2 TB
    h.host_bandwidth = 614.4 * kGB;     // 2 x Xeon 8480C, 8 x DDR5-4800 each
    h.link_bandwidth = 64 * kGB;        // PCIe Gen5 x16 per GPU, one direction
    h.device_memory_label = "HBM3e";
    h.link_label = "PCIe Gen5 x16";
    h.source = "NVIDIA H200 and DGX H200 datasheets (see docs/plan.md)";
    p.push_back(h);
  }
  {
    HardwareProfile h;
    h.name = "mi355xx8";
    h.description = "8 x AMD Instinct MI355X";
    h.kind = MemoryKind::Discrete;
    h.devices = 8;
    h.device_memory_bytes = int64_t(288 * kGB);
    h.device_bandwidth = 8000 * kGB;
    h.host_memory_bytes = 2048 * kGiB;  // assumption: typical 8-GPU platform
    h.host_bandwidth = 1228.8 * kGB;    // 2 x EPYC 9005, 12 x DDR5-6400 each
    h.link_bandwidth = 64 * kGB;        // PCIe Gen5 x16 per GPU, one direction
    h.device_memory_label = "HBM3E";
    h.link_label = "PCIe Gen5 x16";
    h.source = "AMD Instinct MI355X spec page (see docs/plan.md)";
    p.push_back(h);
  }
  {
    HardwareProfile h;
    h.name = "m5-ultra-512";
    h.description = "1 x Apple M5 Ultra Mac Studio, 512 GB unified memory";
    h.kind = MemoryKind::Unified;
    h.devices = 1;
    h.device_memory_bytes = 512 * kGiB;
    h.device_bandwidth = 1228.8 * kGB;  // our inference: 1024-bit LPDDR5X-9600
    h.device_memory_label = "LPDDR5X unified";
    h.link_label = "none (unified)";
    h.source = "seed 003; bandwidth inferred from Apple's M5 figure (see docs/plan.md)";
    p.push_back(h);
  }
  {
    HardwareProfile h;
    h.name = "xeon-6980p";
    h.description = "2 x Intel Xeon 6980P (128 P-cores each), CPU inference";
    h.kind = MemoryKind::CpuOnly;
    h.devices = 2;
    h.device_memory_bytes = 768 * kGiB;  // assumption: 12 x 64 GB DDR5 RDIMM per socket
    h.device_bandwidth = 614.4 * kGB;    // 12 x DDR5-6400 per socket
    h.device_memory_label = "DDR5";
    h.link_label = "none (CPU)";
    h.source = "Intel Xeon 6980P spec (12 channels DDR5-6400); seed 003 (SGLang --tp-size 2)";
    p.push_back(h);
  }
  return p;
}

Status check_range(const char* flag, double v, double lo, double hi, bool lo_inclusive) {
  if (!std::isfinite(v) || (lo_inclusive ? v < lo : v <= lo) || v > hi) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s = %g is impossible (expected %s %g and <= %g)", flag, v,
                  lo_inclusive ? ">=" : ">", lo, hi);
    return make_error(buf);
  }
  return Status::Ok();
}

}  // namespace

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::Discrete: return "discrete";
    case MemoryKind::Unified: return "unified";
    case MemoryKind::CpuOnly: return "cpu";
  }
  return "unknown";
}

std::vector<std::string> hardware_profile_names() {
  std::vector<std::string> names;
  for (const auto& h : builtin_profiles()) names.push_back(h.name);
  return names;
}

Result<HardwareProfile> find_hardware_profile(std::string_view name) {
  for (auto& h : builtin_profiles())
    if (h.name == name) return h;
  std::string list;
  for (const auto& n : hardware_profile_names()) list += (list.empty() ? "" : ", ") + n;
  return make_error("unknown hardware profile '" + std::string(name) + "' (valid: " + list +
                    "; or describe it with --gpus, --gpu-memory-gb, --gpu-bandwidth-gbs, --host-memory-gb, "
                    "--host-bandwidth-gbs, --link-bandwidth-gbs)");
}

Result<HardwareProfile> resolve_hardware(const std::string& profile_name, const HardwareOverrides& o) {
  HardwareProfile h;
  if (!profile_name.empty()) {
    MUSE_ASSIGN_OR_RETURN(h, find_hardware_profile(profile_name));
  } else {
    if (!o.gpu_memory_gib || !o.gpu_bandwidth_gbs)
      return make_error("no hardware given: pass --hardware NAME (" + [] {
               std::string l;
               for (const auto& n : hardware_profile_names()) l += (l.empty() ? "" : ", ") + n;
               return l;
             }() + ") or at least --gpu-memory-gb and --gpu-bandwidth-gbs");
    h.name = "custom";
    h.description = "custom hardware from the command line";
    h.device_memory_label = "GPU memory";
    h.link_label = "host link";
    h.source = "command line";
  }
  // Limits: far above any machine, far below int64 overflow in byte sums.
  if (o.gpus) {
    if (*o.gpus < 1 || *o.gpus > 4096)
      return make_error("--gpus = " + std::to_string(*o.gpus) + " is impossible (expected 1 to 4096)");
    h.devices = *o.gpus;
  }
  if (o.gpu_memory_gib) {
    MUSE_RETURN_IF_ERROR(check_range("--gpu-memory-gb", *o.gpu_memory_gib, 0, 1 << 20, false));
    h.device_memory_bytes = int64_t(*o.gpu_memory_gib * double(kGiB));
  }
  if (o.gpu_bandwidth_gbs) {
    MUSE_RETURN_IF_ERROR(check_range("--gpu-bandwidth-gbs", *o.gpu_bandwidth_gbs, 0, 1e6, false));
    h.device_bandwidth = *o.gpu_bandwidth_gbs * kGB;
  }
  const bool wants_host = o.host_memory_gib || o.host_bandwidth_gbs || o.link_bandwidth_gbs;
  if (wants_host && h.kind != MemoryKind::Discrete)
    return make_error("hardware '" + h.name + "' is " + memory_kind_name(h.kind) +
                      " memory: there is no separate host memory or host link to describe "
                      "(--host-memory-gb, --host-bandwidth-gbs, --link-bandwidth-gbs)");
  if (o.host_memory_gib) {
    MUSE_RETURN_IF_ERROR(check_range("--host-memory-gb", *o.host_memory_gib, 0, 1 << 24, true));
    h.host_memory_bytes = int64_t(*o.host_memory_gib * double(kGiB));
  }
  if (o.host_bandwidth_gbs) {
    MUSE_RETURN_IF_ERROR(check_range("--host-bandwidth-gbs", *o.host_bandwidth_gbs, 0, 1e7, true));
    h.host_bandwidth = *o.host_bandwidth_gbs * kGB;
  }
  if (o.link_bandwidth_gbs) {
    MUSE_RETURN_IF_ERROR(check_range("--link-bandwidth-gbs", *o.link_bandwidth_gbs, 0, 1e6, true));
    h.link_bandwidth = *o.link_bandwidth_gbs * kGB;
  }
  if (h.device_memory_bytes <= 0 || h.device_bandwidth <= 0)
    return make_error("hardware '" + h.name + "' needs a positive GPU memory size and bandwidth");
  if (o.any() && h.name != "custom") h.description += " (with command-line overrides)";
  return h;
}

}  // namespace muse::plan
