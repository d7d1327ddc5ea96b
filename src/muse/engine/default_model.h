// The embedded default model (models/muse-tiny) that `muse serve` and
// `muse run` use when no model is given.
#pragma once

#include <string>

#include "muse/core/status.h"

namespace muse {

// <dir of the executable>/../models/muse-tiny (the build tree or an
// installed prefix), then <dir of the executable>/models/muse-tiny, then
// MUSE_SOURCE_DIR/models/muse-tiny; an error naming the places looked at.
Result<std::string> default_model_dir();

}  // namespace muse
