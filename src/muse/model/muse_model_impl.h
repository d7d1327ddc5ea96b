// MuseModel::Step: the activation buffers viewed for one step of T rows.
// Shared by muse_model.cc and the per-family layer files.
#pragma once

#include "muse/model/muse_model.h"

namespace muse {

struct MuseModel::Step {
  int64_t T = 0;
  const StepPlanView* plan = nullptr;
  Tensor ids, positions, cos, sin, x, h, q, k, v, g, o, a, mlp_gate, mlp_up;
  Tensor router_logits, expert_ids, expert_weights, latent, moe_out;
};

}  // namespace muse
