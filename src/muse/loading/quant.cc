#include "muse/loading/quant.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <vector>

#include "muse/loading/convert.h"

namespace muse {

namespace {

Status check_bytes(const QuantInput& in, uint64_t want, const char* what) {
  if (!in.data && want) return make_error(std::string(what) + ": no data");
  if (in.nbytes != want)
    return make_error(std::string(what) + ": " + std::to_string(in.nbytes) + " bytes, expected " + std::to_string(want) +
                      " for the given shape");
  return Status::Ok();
}

// Float scales of any float dtype, as f32.
Result<std::vector<float>> float_scales(const QuantInput& in, int64_t count, const char* what) {
  if (in.dtype != DType::F32 && in.dtype != DType::F16 && in.dtype != DType::BF16)
    return make_error(std::string(what) + " must be F32, F16 or BF16, got " + std::string(dtype_name(in.dtype)));
  MUSE_RETURN_IF_ERROR(check_bytes(in, uint64_t(count) * uint64_t(dtype_bits(in.dtype) / 8), what));
  std::vector<float> v(static_cast<size_t>(count));
  MUSE_RETURN_IF_ERROR(convert_to_f32(in.dtype, in.data, 0, count, v.data()));
  return v;
}

uint32_t load_u32(const uint8_t* p, int64_t index) {
  uint32_t v;
  std::memcpy(&v, p + 4 * index, 4);
  return v;
}

Status positive_shape(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0 || rows > (int64_t(1) << 31) || cols > (int64_t(1) << 31))
    return make_error("quantized tensor shape [" + std::to_string(rows) + ", " + std::to_string(cols) + "] is invalid");
  return Status::Ok();
}

}  // namespace

Status decode_nvfp4(QuantInput packed, QuantInput block_scales, float global, int64_t rows, int64_t cols, float* out) {
  MUSE_RETURN_IF_ERROR(positive_shape(rows, cols));
  if (cols % 16) return make_error("NVFP4: in_features " + std::to_string(cols) + " is not a multiple of 16");
  if (block_scales.dtype != DType::F8_E4M3 && block_scales.dtype != DType::U8)
    return make_error("NVFP4: block scales must be F8_E4M3, got " + std::string(dtype_name(block_scales.dtype)));
  MUSE_RETURN_IF_ERROR(check_bytes(packed, uint64_t(rows * cols / 2), "NVFP4 weight"));
  MUSE_RETURN_IF_ERROR(check_bytes(block_scales, uint64_t(rows * cols / 16), "NVFP4 weight_scale"));
  const int64_t blocks = cols / 16;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* q = packed.data + r * cols / 2;
    float* o = out + r * cols;
    for (int64_t b = 0; b < blocks; ++b) {
      const float s = f8_e4m3_to_f32(block_scales.data[r * blocks + b]) * global;
      for (int64_t i = 0; i < 8; ++i) {
        uint8_t byte = q[b * 8 + i];
        o[b * 16 + 2 * i] = e2m1_to_f32(byte & 15) * s;  // even element: low nibble
        o[b * 16 + 2 * i + 1] = e2m1_to_f32(byte >> 4) * s;
      }
    }
  }
  return Status::Ok();
}

Status decode_mxfp4(QuantInput packed, QuantInput scales, int64_t rows, int64_t cols, float* out) {
  MUSE_RETURN_IF_ERROR(positive_shape(rows, cols));
  if (cols % 32) return make_error("MXFP4: in_features " + std::to_string(cols) + " is not a multiple of 32");
  if (scales.dtype != DType::U8 && scales.dtype != DType::F8_E8M0)
    return make_error("MXFP4: scales must be U8 or F8_E8M0 (E8M0), got " + std::string(dtype_name(scales.dtype)));
  MUSE_RETURN_IF_ERROR(check_bytes(packed, uint64_t(rows * cols / 2), "MXFP4 weight"));
  MUSE_RETURN_IF_ERROR(check_bytes(scales, uint64_t(rows * cols / 32), "MXFP4 scales"));
  const int64_t blocks = cols / 32;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* q = packed.data + r * cols / 2;
    float* o = out + r * cols;
    for (int64_t b = 0; b < blocks; ++b) {
      const float s = f8_e8m0_to_f32(scales.data[r * blocks + b]);
      for (int64_t i = 0; i < 16; ++i) {
        uint8_t byte = q[b * 16 + i];
        o[b * 32 + 2 * i] = e2m1_to_f32(byte & 15) * s;
        o[b * 32 + 2 * i + 1] = e2m1_to_f32(byte >> 4) * s;
      }
    }
  }
  return Status::Ok();
}

Status decode_fp8(QuantInput weight, QuantInput scale, Fp8Scaling scaling, int64_t rows, int64_t cols, float* out,
                  int64_t block_rows, int64_t block_cols) {
  MUSE_RETURN_IF_ERROR(positive_shape(rows, cols));
  if (weight.dtype != DType::F8_E4M3 && weight.dtype != DType::F8_E5M2)
    return make_error("FP8 weight must be F8_E4M3 or F8_E5M2, got " + std::string(dtype_name(weight.dtype)));
  MUSE_RETURN_IF_ERROR(check_bytes(weight, uint64_t(rows * cols), "FP8 weight"));
  if (scaling == Fp8Scaling::Block && (block_rows <= 0 || block_cols <= 0))
    return make_error("FP8 block size must be positive");
  const int64_t brows = scaling == Fp8Scaling::Block ? (rows + block_rows - 1) / block_rows : 0;
  const int64_t bcols = scaling == Fp8Scaling::Block ? (cols + block_cols - 1) / block_cols : 0;
  const int64_t count = scaling == Fp8Scaling::PerTensor ? 1 : scaling == Fp8Scaling::PerChannel ? rows : brows * bcols;
  MUSE_ASSIGN_OR_RETURN(std::vector<float> s, float_scales(scale, count, "FP8 weight_scale"));
  MUSE_RETURN_IF_ERROR(convert_to_f32(weight.dtype, weight.data, 0, rows * cols, out));
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + r * cols;
    if (scaling == Fp8Scaling::Block) {
      const float* srow = s.data() + (r / block_rows) * bcols;
      for (int64_t c = 0; c < cols; ++c) o[c] *= srow[c / block_cols];
    } else {
      const float f = scaling == Fp8Scaling::PerTensor ? s[0] : s[size_t(r)];
      for (int64_t c = 0; c < cols; ++c) o[c] *= f;
    }
  }
  return Status::Ok();
}

Status decode_gptq_int4(const GptqArgs& a, float* out) {
  const int64_t K = a.in_features, N = a.out_features;
  MUSE_RETURN_IF_ERROR(positive_shape(N, K));
  if (K % 8 || N % 8) return make_error("GPTQ: in/out features must be multiples of 8");
  const int64_t G = a.group_size <= 0 ? K : a.group_size;
  const int64_t groups = (K + G - 1) / G;
  if (a.qweight.dtype != DType::I32 || a.qzeros.dtype != DType::I32)
    return make_error("GPTQ: qweight and qzeros must be I32");
  MUSE_RETURN_IF_ERROR(check_bytes(a.qweight, uint64_t(K / 8 * N * 4), "GPTQ qweight [K/8, N]"));
  MUSE_RETURN_IF_ERROR(check_bytes(a.qzeros, uint64_t(groups * (N / 8) * 4), "GPTQ qzeros [K/G, N/8]"));
  MUSE_ASSIGN_OR_RETURN(std::vector<float> scales, float_scales(a.scales, groups * N, "GPTQ scales [K/G, N]"));
  std::vector<int32_t> g_idx(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) g_idx[size_t(k)] = int32_t(k / G);
  if (a.g_idx.data) {
    if (a.g_idx.dtype != DType::I32) return make_error("GPTQ: g_idx must be I32");
    MUSE_RETURN_IF_ERROR(check_bytes(a.g_idx, uint64_t(K * 4), "GPTQ g_idx [K]"));
    for (int64_t k = 0; k < K; ++k) {
      int32_t g = int32_t(load_u32(a.g_idx.data, k));
      if (g < 0 || g >= groups)
        return make_error("GPTQ: g_idx[" + std::to_string(k) + "] = " + std::to_string(g) + " is not a group in [0, " +
                          std::to_string(groups) + ")");
      g_idx[size_t(k)] = g;
    }
  }
  const int zero_offset = a.zeros_minus_one ? 1 : 0;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t g = g_idx[size_t(k)];
    for (int64_t n = 0; n < N; ++n) {
      int q = int((load_u32(a.qweight.data, (k / 8) * N + n) >> (4 * (k % 8))) & 15);
      int z = int((load_u32(a.qzeros.data, g * (N / 8) + n / 8) >> (4 * (n % 8))) & 15) + zero_offset;
      out[n * K + k] = scales[size_t(g * N + n)] * float(q - z);
    }
  }
  return Status::Ok();
}

Status decode_ct_int4(QuantInput packed, QuantInput scales, int64_t rows, int64_t cols, int64_t group_size, float* out) {
  MUSE_RETURN_IF_ERROR(positive_shape(rows, cols));
  const int64_t G = group_size <= 0 ? cols : group_size;
  if (cols % 8 || cols % G) return make_error("pack-quantized: in_features must be a multiple of 8 and of the group size");
  if (packed.dtype != DType::I32) return make_error("pack-quantized: weight_packed must be I32");
  MUSE_RETURN_IF_ERROR(check_bytes(packed, uint64_t(rows * cols / 8 * 4), "pack-quantized weight_packed [N, K/8]"));
  MUSE_ASSIGN_OR_RETURN(std::vector<float> s, float_scales(scales, rows * (cols / G), "pack-quantized weight_scale"));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) {
      int q = int((load_u32(packed.data, r * (cols / 8) + k / 8) >> (4 * (k % 8))) & 15) - 8;
      out[r * cols + k] = float(q) * s[size_t(r * (cols / G) + k / G)];
    }
  return Status::Ok();
}

Status check_scale_values(const QuantFormat& format, const void* scales, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(scales);
  const size_t width = size_t(std::max(8, dtype_bits(format.scale_dtype)) / 8);
  const size_t n = p ? bytes / width : 0;
  auto bad = [&](size_t i, const char* what) {
    return make_error("scale " + std::to_string(i) + " of " + std::to_string(n) + " (" +
                      std::string(dtype_name(format.scale_dtype)) + ") is " + what);
  };
  switch (format.scale_dtype) {
    case DType::F8_E4M3:
      for (size_t i = 0; i < n; ++i)
        if ((p[i] & 0x7F) == 0x7F) return bad(i, "NaN (E4M3 0x7F / 0xFF)");
      break;
    case DType::F8_E8M0:
      for (size_t i = 0; i < n; ++i)
        if (p[i] == 0xFF) return bad(i, "NaN (E8M0 0xFF)");
      break;
    case DType::F16:
    case DType::BF16: {
      const uint16_t exp = format.scale_dtype == DType::F16 ? 0x7C00 : 0x7F80;
      for (size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, p + 2 * i, 2);
        if ((v & exp) == exp) return bad(i, (v & uint16_t(~exp & 0x7FFF)) ? "NaN" : "infinite");
      }
      break;
    }
    case DType::F32:
      for (size_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, p + 4 * i, 4);
        if (!std::isfinite(v)) return bad(i, std::isnan(v) ? "NaN" : "infinite");
      }
      break;
    default: break;
  }
  return Status::Ok();
}

Status check_global_values(const std::vector<float>& global) {
  for (size_t i = 0; i < global.size(); ++i)
    if (!std::isfinite(global[i]))
      return make_error("global scale " + std::to_string(i) + " of " + std::to_string(global.size()) + " is " +
                        (std::isnan(global[i]) ? "NaN" : "infinite"));
  return Status::Ok();
}

QuantKind quant_kind_of(QuantScheme s) {
  switch (s) {
    case QuantScheme::ModelOptNvfp4:
    case QuantScheme::CompressedTensorsNvfp4: return QuantKind::Nvfp4;
    case QuantScheme::Mxfp4:
    case QuantScheme::QuarkMxfp4: return QuantKind::Mxfp4;
    case QuantScheme::ModelOptFp8:
    case QuantScheme::CompressedTensorsFp8:
    case QuantScheme::QuarkFp8:
    case QuantScheme::Fp8Block: return QuantKind::Fp8;
    case QuantScheme::Gptq:
    case QuantScheme::AutoRound:
    case QuantScheme::CompressedTensorsInt4: return QuantKind::Int4;
    case QuantScheme::None:
    case QuantScheme::Unknown: return QuantKind::None;
  }
  return QuantKind::None;
}

Result<Json> modelopt_quant_config(const Json& hf) {
  const Json* q = hf.is_object() ? hf.find("quantization") : nullptr;
  if (!q || !q->is_object()) return make_error("expected an object with a \"quantization\" object");
  Json out = Json::object();
  out.set("quant_method", "modelopt");
  MUSE_ASSIGN_OR_RETURN(std::string algo, q->string_member("quant_algo", ""));
  out.set("quant_algo", algo);
  if (const Json* g = q->find("group_size")) out.set("group_size", *g);
  if (const Json* e = q->find("exclude_modules")) out.set("ignore", *e);
  return out;
}

const char* quant_scheme_name(QuantScheme s) {
  switch (s) {
    case QuantScheme::None: return "none";
    case QuantScheme::ModelOptNvfp4: return "modelopt-nvfp4";
    case QuantScheme::ModelOptFp8: return "modelopt-fp8";
    case QuantScheme::CompressedTensorsNvfp4: return "compressed-tensors-nvfp4";
    case QuantScheme::CompressedTensorsInt4: return "compressed-tensors-int4";
    case QuantScheme::CompressedTensorsFp8: return "compressed-tensors-fp8";
    case QuantScheme::Mxfp4: return "mxfp4";
    case QuantScheme::QuarkMxfp4: return "quark-mxfp4";
    case QuantScheme::QuarkFp8: return "quark-fp8";
    case QuantScheme::Fp8Block: return "fp8-block";
    case QuantScheme::Gptq: return "gptq";
    case QuantScheme::AutoRound: return "auto-round";
    case QuantScheme::Unknown: return "unknown";
  }
  return "unknown";
}

namespace {

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// compressed-tensors' weight scheme (config_groups.*.weights): every group
// must describe the same weights (muse reads one scheme a checkpoint).
Result<const Json*> ct_weights(const Json& qc) {
  const Json* groups = qc.find("config_groups");
  if (!groups || groups->is_null()) return static_cast<const Json*>(nullptr);
  if (!groups->is_object()) return make_error("compressed-tensors config_groups must be an object");
  const Json* first = nullptr;
  for (const auto& [name, g] : groups->as_object()) {
    const Json* w = g.is_object() ? g.find("weights") : nullptr;
    if (!g.is_object() || (w && !w->is_object() && !w->is_null()))
      return make_error("compressed-tensors config_groups." + name + " must be an object with a \"weights\" object");
    if (!w || w->is_null()) continue;
    if (first && !(*first == *w))
      return make_error("compressed-tensors config_groups describe different weight schemes (" + name +
                        " differs from the first); muse reads one scheme per checkpoint");
    if (!first) first = w;
  }
  return first;
}

// GPTQ / AutoRound / compressed-tensors INT4: what the settings say beyond
// the layout, each refusal by name.
Status check_int4_settings(const Json& qc, const std::string& m) {
  if (const Json* da = qc.find("desc_act"); da && !da->is_null()) {
    if (!da->is_bool()) return make_error(m + " desc_act must be true or false, not " + da->dump());
    if (da->as_bool())
      return make_error(m + " with desc_act = true (act-order: g_idx permutes the input channels) is not supported; "
                        "use a checkpoint quantized with desc_act = false");
  }
  MUSE_ASSIGN_OR_RETURN(int64_t g, qc.int_member("group_size", 128));
  if (g == 0 || g < -1) return make_error(m + " group_size " + std::to_string(g) + " is invalid (-1: one group per column)");
  return Status::Ok();
}

}  // namespace

Result<QuantInfo> describe_quantization(const Json& qc) {
  QuantInfo info;
  if (qc.is_null()) return info;
  if (!qc.is_object()) return make_error("quantization_config must be an object");
  MUSE_ASSIGN_OR_RETURN(info.method, qc.string_member("quant_method", ""));
  MUSE_ASSIGN_OR_RETURN(info.group_size, qc.int_member("group_size", 0));
  info.scheme = QuantScheme::Unknown;
  const std::string& m = info.method;
  if (m == "modelopt") {
    MUSE_ASSIGN_OR_RETURN(std::string algo, qc.string_member("quant_algo", ""));
    algo = upper(algo);
    if (algo == "NVFP4" || algo == "W4A16_NVFP4") {
      info.scheme = QuantScheme::ModelOptNvfp4;
      if (!info.group_size) info.group_size = 16;
      if (info.group_size != 16)
        return make_error("modelopt NVFP4 with group_size " + std::to_string(info.group_size) + " (NVFP4 blocks are 16)");
    } else if (algo == "FP8" || algo == "FP8_PER_CHANNEL_PER_TOKEN" || algo == "FP8_PB_WO") {
      info.scheme = QuantScheme::ModelOptFp8;
    } else {
      return make_error("modelopt quant_algo \"" + algo + "\" is not supported (muse reads NVFP4, W4A16_NVFP4, FP8, " +
                        "FP8_PER_CHANNEL_PER_TOKEN and FP8_PB_WO)");
    }
  } else if (m == "compressed-tensors") {
    MUSE_ASSIGN_OR_RETURN(std::string format, qc.string_member("format", ""));
    MUSE_ASSIGN_OR_RETURN(const Json* w, ct_weights(qc));
    if (format == "nvfp4-pack-quantized") {
      info.scheme = QuantScheme::CompressedTensorsNvfp4;
      info.group_size = 16;
    } else if (format == "pack-quantized") {
      info.scheme = QuantScheme::CompressedTensorsInt4;
    } else if (format == "float-quantized" || format == "naive-quantized") {
      info.scheme = QuantScheme::CompressedTensorsFp8;
    } else if (format == "mxfp4-pack-quantized") {
      info.scheme = QuantScheme::Mxfp4;
      info.group_size = 32;
    } else {
      return make_error("compressed-tensors format \"" + format + "\" is not supported (muse reads " +
                        "nvfp4-pack-quantized, mxfp4-pack-quantized, pack-quantized (INT4 W4A16), float-quantized " +
                        "and naive-quantized (FP8))");
    }
    if (w) {
      if (const Json* gs = w->find("group_size"); gs && !gs->is_null()) {
        if (!gs->is_int() || gs->as_int() <= 0)
          return make_error("compressed-tensors weights.group_size must be a positive integer, not " + gs->dump());
        info.group_size = gs->as_int();
      } else if (info.scheme == QuantScheme::CompressedTensorsInt4) {
        info.group_size = -1;  // strategy "channel": one group per output channel
      }
      if (info.scheme == QuantScheme::CompressedTensorsInt4) {
        MUSE_ASSIGN_OR_RETURN(int64_t bits, w->int_member("num_bits", 4));
        MUSE_ASSIGN_OR_RETURN(std::string type, w->string_member("type", "int"));
        MUSE_ASSIGN_OR_RETURN(bool sym, w->bool_member("symmetric", true));
        if (bits != 4 || type != "int")
          return make_error("compressed-tensors pack-quantized with num_bits " + std::to_string(bits) + ", type \"" +
                            type + "\" is not supported (INT4 only: num_bits 4, type int)");
        if (!sym)
          return make_error("compressed-tensors pack-quantized with symmetric = false (asymmetric zero points) is not "
                            "supported");
        // actorder "weight" (alias "static") orders the calibration only: the
        // stored format is the plain one. "group" ("dynamic") maps columns to
        // groups through g_idx at run time.
        if (const Json* ao = w->find("actorder"); ao && !ao->is_null() && !(ao->is_bool() && !ao->as_bool())) {
          const std::string a = ao->is_string() ? ao->as_string() : ao->dump();
          if (a != "weight" && a != "static")
            return make_error("compressed-tensors pack-quantized with actorder " + ao->dump() +
                              " (g_idx permutes the input channels) is not supported (actorder \"weight\" is)");
        }
      }
    }
  } else if (m == "mxfp4") {
    info.scheme = QuantScheme::Mxfp4;
    info.group_size = 32;
  } else if (m == "quark") {
    const Json* global = qc.find("global_quant_config");
    const Json* weight = global && global->is_object() ? global->find("weight") : nullptr;
    if (!weight || !weight->is_object())
      return make_error("quark quantization_config without global_quant_config.weight");
    MUSE_ASSIGN_OR_RETURN(std::string dtype, weight->string_member("dtype", ""));
    if (dtype == "fp4") {
      info.scheme = QuantScheme::QuarkMxfp4;
      info.group_size = 32;
    } else if (dtype == "fp8_e4m3") {
      info.scheme = QuantScheme::QuarkFp8;
    } else {
      return make_error("quark weight dtype \"" + dtype + "\" is not supported (muse reads fp4 (MXFP4) and fp8_e4m3)");
    }
    for (const char* per_layer : {"layer_quant_config", "layer_type_quant_config"})
      if (const Json* l = qc.find(per_layer); l && l->size() > 0)
        return make_error(std::string("quark ") + per_layer + " (formats that differ per layer) is not supported; " +
                          "muse reads one format per checkpoint (global_quant_config)");
  } else if (m == "fp8") {
    info.scheme = QuantScheme::Fp8Block;
    info.group_size = 128;
    info.fp8_blocks = true;
    if (const Json* b = qc.find("weight_block_size"); b && !b->is_null()) {
      const bool pair = b->is_array() && b->size() == 2 && b->as_array()[0].is_int() && b->as_array()[1].is_int();
      if (!pair) return make_error("fp8 weight_block_size must be two integers, not " + b->dump());
      if (b->as_array()[0].as_int() != 128 || b->as_array()[1].as_int() != 128)
        return make_error("fp8 weight_block_size " + b->dump() + " is not supported (128 x 128 blocks only)");
    }
  } else if (m == "ptpc_fp8") {
    // vLLM's online method: the tensors are BF16, quantized per channel at load.
    info.scheme = QuantScheme::None;
    info.online = QuantKind::Fp8;
  } else if (m == "gptq" || m == "auto-round" || m == "autoround" || m == "intel/auto-round") {
    MUSE_ASSIGN_OR_RETURN(int64_t bits, qc.int_member("bits", 4));
    if (bits != 4) return make_error(m + " with bits = " + std::to_string(bits) + ": only 4-bit GPTQ/AutoRound is supported");
    MUSE_RETURN_IF_ERROR(check_int4_settings(qc, m));
    if (m == "gptq") {
      MUSE_ASSIGN_OR_RETURN(std::string format, qc.string_member("checkpoint_format", "gptq"));
      if (format != "gptq" && format != "gptq_v2")
        return make_error("gptq checkpoint_format \"" + format + "\" is not supported (gptq: zeros stored minus one; "
                          "gptq_v2: zeros as they are)");
      info.scheme = QuantScheme::Gptq;
      info.zeros_minus_one = format != "gptq_v2";
      // GPTQModel's per-module overrides: "-:regex" skips a module (an
      // exclusion); any other entry changes bits or groups there.
      if (const Json* d = qc.find("dynamic"); d && d->size() > 0) {
        if (!d->is_object()) return make_error("gptq dynamic must be an object");
        for (const auto& [key, v] : d->as_object()) {
          if (key.rfind("-:", 0) == 0) info.excluded.push_back("re:" + key.substr(2));
          else return make_error("gptq dynamic override \"" + key + "\" (per-module bits or groups) is not supported");
        }
      }
    } else {
      MUSE_ASSIGN_OR_RETURN(std::string packing, qc.string_member("packing_format", "auto_round:auto_gptq"));
      if (packing != "auto_round:auto_gptq" && packing != "auto_gptq" && packing != "auto_round")
        return make_error(m + " packing_format \"" + packing + "\" is not supported (auto_round:auto_gptq: GPTQ v1, " +
                          "zeros stored minus one; auto_round: zeros as they are)");
      MUSE_ASSIGN_OR_RETURN(std::string data_type, qc.string_member("data_type", "int"));
      if (data_type != "int")
        return make_error(m + " data_type \"" + data_type + "\" is not supported (integer 4-bit only)");
      info.scheme = QuantScheme::AutoRound;
      info.zeros_minus_one = packing != "auto_round";
      // Per-layer settings: 16 bits or a float data type leaves the module
      // unquantized (an exclusion); other bits or groups are refused.
      if (const Json* ec = qc.find("extra_config"); ec && ec->size() > 0) {
        if (!ec->is_object()) return make_error(m + " extra_config must be an object");
        const int64_t group = info.group_size ? info.group_size : 128;
        for (const auto& [module, v] : ec->as_object()) {
          if (!v.is_object()) return make_error(m + " extra_config." + module + " must be an object");
          MUSE_ASSIGN_OR_RETURN(int64_t b, v.int_member("bits", bits));
          MUSE_ASSIGN_OR_RETURN(std::string dt, v.string_member("data_type", "int"));
          MUSE_ASSIGN_OR_RETURN(int64_t g, v.int_member("group_size", group));
          if (b >= 16 || dt == "float" || dt == "fp" || dt == "bf16" || dt == "fp16") {
            info.excluded.push_back(module);
          } else if (b != bits || dt != "int" || g != group) {
            return make_error(m + " extra_config." + module + " (bits " + std::to_string(b) + ", group_size " +
                              std::to_string(g) + ", data_type " + dt + ") differs from the checkpoint's scheme: " +
                              "per-layer schemes are not supported");
          }
        }
      }
    }
    if (!info.group_size) info.group_size = 128;
  }
  for (const char* key : {"ignore", "exclude_modules", "exclude", "modules_to_not_convert"}) {
    const Json* l = qc.find(key);
    if (!l || l->is_null()) continue;
    if (l->is_string()) {
      info.excluded.push_back(l->as_string());
      continue;
    }
    if (!l->is_array()) return make_error(std::string(key) + " must be a list of module names or patterns");
    for (const Json& e : l->as_array()) {
      if (!e.is_string()) return make_error(std::string(key) + " holds " + e.dump() + ", not a module name or pattern");
      info.excluded.push_back(e.as_string());
    }
  }
  return info;
}

}  // namespace muse
