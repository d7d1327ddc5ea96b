// Shared between the fake model's two halves (fake_model.cc, fake_engine.cc).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fake_model.h"

namespace muse::server::fake {

// Bytes -> ids; with parse_specials, special-token spellings become their ids.
std::vector<int32_t> encode(std::string_view text, bool parse_specials);
std::string decode_bytes(std::span<const int32_t> ids, bool skip_special);
std::shared_ptr<GenerationService> make_fake_engine(const FakeModelOptions& options);

}  // namespace muse::server::fake
