#include "muse/chat/chat_profile.h"

namespace muse::chat {

// Muse Glimmer 30B (chat-format.md §2, §6).
const ChatProfile& muse_glimmer_profile() {
  static const ChatProfile p = [] {
    ChatProfile p;
    p.name = "muse_glimmer";
    p.model_types = {"muse_glimmer", "muse_glimmer_text"};
    p.template_sha256 = {"cfc67e5f349f37690dfd31ed1f18bc4442a9dd32fe39a648f993cb4eb3cae678",   // HF a4e59da
                         // models/muse-tiny/chat_template.jinja: its own bytes, the Glimmer format
                         // (docs/muse-tiny.md), though its config says model_type muse_spark.
                         "6a605bd05b4f71b40c4b02fbd54c6f003701dd2be8c7e91b7f2dc10d55ee52d1"};
    p.legacy_template_sha256 = {"114f55ebdc1804c1af371197b9fdf2d6bb925966c9dfe46b73782a71bc07965e"};  // 7f1ae41
    p.is_muse = true;
    p.bos_token = "<|begin_of_text|>";
    p.stop_token_ids = {200001, 200008};
    p.effort_kwarg = "reasoning_strength";
    p.known_template_efforts = {"low", "medium", "high", "xhigh"};
    p.effort_map = {{"low", Json("low")},       {"medium", Json("medium")}, {"high", Json("high")},
                    {"xhigh", Json("xhigh")},   {"none", Json("low")},      {"minimal", Json("low")}};
    p.part_map = {{"text", "text"},   {"image_url", "image"}, {"image", "image"},
                  {"video_url", "video"}, {"video", "video"}};
    p.role_map = {{"developer", "system"}};
    p.escaping = CallerTextEscaping::None;
    return p;
  }();
  return p;
}

// Muse Spark Open, from the public port (chat-format.md §7): unverified until
// the checkpoint's own template is read and pinned.
const ChatProfile& muse_spark_profile() {
  static const ChatProfile p = [] {
    ChatProfile p;
    p.name = "muse_spark";
    p.model_types = {"muse_spark"};
    p.is_muse = true;
    p.bos_token = "<|begin_of_text|>";
    p.stop_token_ids = {200001, 200008};
    p.effort_kwarg = "reasoning_strength";
    p.known_template_efforts = {};
    p.effort_map = {{"minimal", Json(1)}, {"low", Json(16)},   {"medium", Json(64)},
                    {"high", Json(256)},  {"xhigh", Json(512)}, {"none", Json(1)}};
    p.part_map = {{"text", "text"},   {"image_url", "image"}, {"image", "image"},
                  {"video_url", "video"}, {"video", "video"}, {"input_audio", "audio"},
                  {"audio_url", "audio"}, {"audio", "audio"}};
    p.role_map = {};  // developer messages render as their own segments
    p.escaping = CallerTextEscaping::SparkEsc;
    p.framing.missing_recipient_is_reasoning = true;
    p.framing.content_recipients = {"user", "commentary"};
    return p;
  }();
  return p;
}

const ChatProfile& generic_profile() {
  static const ChatProfile p = [] {
    ChatProfile p;
    p.name = "generic";
    p.part_map = {{"text", "text"},         {"image_url", "image"}, {"image", "image"},
                  {"input_audio", "audio"}, {"audio_url", "audio"}, {"audio", "audio"},
                  {"video_url", "video"},   {"video", "video"}};
    return p;
  }();
  return p;
}

const ChatProfile& select_profile(std::string_view template_sha256, std::string_view model_type, bool* legacy) {
  if (legacy) *legacy = false;
  for (const ChatProfile* p : {&muse_glimmer_profile(), &muse_spark_profile()}) {
    for (const auto& h : p->template_sha256)
      if (h == template_sha256) return *p;
    for (const auto& h : p->legacy_template_sha256)
      if (h == template_sha256) {
        if (legacy) *legacy = true;
        return *p;
      }
  }
  for (const ChatProfile* p : {&muse_glimmer_profile(), &muse_spark_profile()})
    for (const auto& t : p->model_types)
      if (t == model_type) return *p;
  return generic_profile();
}

}  // namespace muse::chat
