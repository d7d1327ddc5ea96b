#include "muse/speculative/verify_width.h"

#include <algorithm>

namespace muse {

void StepCostModel::finish() {
  for (size_t i = 1; i < seconds.size(); ++i) seconds[i] = std::max(seconds[i], seconds[i - 1]);
}

double StepCostModel::cost(int64_t rows) const {
  if (rows < 1) rows = 1;
  double base = 0;
  const int64_t n = int64_t(seconds.size());
  if (n == 0) base = double(rows);
  else if (rows <= n) base = seconds[size_t(rows - 1)];
  else {
    const double slope = n >= 2 ? (seconds[size_t(n - 1)] - seconds[size_t(n - 2)]) : seconds[0];
    base = seconds[size_t(n - 1)] + slope * double(rows - n);
  }
  if (expert_seconds > 0 && !distinct_experts.empty()) {
    const int64_t m = int64_t(distinct_experts.size());
    base += expert_seconds * distinct_experts[size_t(std::min(rows, m) - 1)];
  }
  return base;
}

void StepCostModel::observe_experts(int64_t rows, double distinct, double alpha) {
  if (rows < 1) return;
  if (int64_t(distinct_experts.size()) < rows) {
    const double last = distinct_experts.empty() ? distinct : distinct_experts.back();
    distinct_experts.resize(size_t(rows), last);
    distinct_experts[size_t(rows - 1)] = distinct;
    return;
  }
  double& d = distinct_experts[size_t(rows - 1)];
  d = (1 - alpha) * d + alpha * distinct;
}

std::vector<int> pick_widths(std::span<const std::vector<float>> confidence, std::span<const int> caps,
                             int64_t base_rows, const StepCostModel& cost, double draft_seconds) {
  const size_t R = confidence.size();
  std::vector<int> width(R, 0);
  struct Slot {
    double a;
    size_t r;
    int j;
  };
  std::vector<Slot> slots;
  for (size_t r = 0; r < R; ++r) {
    double a = 1;
    const int cap = std::min<int>(caps[r], int(confidence[r].size()));
    for (int j = 0; j < cap; ++j) {
      a *= double(confidence[r][size_t(j)]);
      slots.push_back({a, r, j});
    }
  }
  // Best first; within a request earlier positions first (a never grows with j).
  std::stable_sort(slots.begin(), slots.end(), [](const Slot& x, const Slot& y) {
    return x.a != y.a ? x.a > y.a : (x.r != y.r ? x.r < y.r : x.j < y.j);
  });
  int64_t rows = base_rows + int64_t(R);
  double tokens = double(R);
  double best = tokens / (cost.cost(rows) + draft_seconds);
  for (const Slot& s : slots) {
    if (s.j != width[s.r]) continue;  // its earlier slot was not admitted
    const double t = tokens + s.a;
    const double theta = t / (cost.cost(rows + 1) + draft_seconds);
    if (!(theta > best)) break;
    best = theta;
    tokens = t;
    ++rows;
    width[s.r] = s.j + 1;
  }
  return width;
}

}  // namespace muse
