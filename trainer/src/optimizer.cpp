#include "forge/trainer/optimizer.h"

#include "cpu/kernels.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace forge::trainer {

double learning_rate(const OptimConfig& o, int64_t step, int64_t total_steps) {
  if (step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
  const int64_t decay_steps = total_steps - o.warmup_steps;
  if (decay_steps <= 0) return o.lr;
  const double progress = std::min(1.0, double(step - o.warmup_steps) / double(decay_steps));
  return o.min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (o.lr - o.min_lr);
}

double grad_norm(std::span<const float> g) {
  const FlatRange all{0, g.size()};
  return std::sqrt(cpu::sum_squares(g.data(), {&all, 1}));
}

double clip_grad_norm(std::span<float> g, double max_norm) {
  const double norm = grad_norm(g);
  if (max_norm <= 0) return norm;
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    const float c = float(coef);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < g.size(); ++i) g[i] *= c;
  }
  return norm;
}

AdamW::AdamW(const OptimConfig& optim, const std::vector<ParamInfo>& params, size_t size,
             std::vector<FlatRange> ranges, Backend& backend)
    : optim_(optim), backend_(backend), ranges_(std::move(ranges)), size_(size) {
  if (ranges_.empty()) ranges_.push_back({0, size});
  size_t at = 0;
  for (const FlatRange& r : ranges_) {
    if (r.lo > r.hi || r.hi > size) throw std::invalid_argument("AdamW: owned range outside the buffer");
    for (const auto& p : params) {
      const size_t lo = std::max(r.lo, p.offset), hi = std::min(r.hi, p.offset + p.numel);
      if (lo < hi) segments_.push_back({lo, hi, at + (lo - r.lo), p.decay});
    }
    at += r.hi - r.lo;
  }
  m_ = backend.alloc<float>(at);
  v_ = backend.alloc<float>(at);
}

void AdamW::step(std::span<float> w, std::span<const float> g, double lr) {
  if (w.size() != size_ || g.size() != size_)
    throw std::invalid_argument("AdamW::step: buffer sizes do not match the optimizer state");
  ++t_;
  AdamWStep s;
  s.beta1 = float(optim_.beta1);
  s.beta2 = float(optim_.beta2);
  s.eps = float(optim_.eps);
  const double seen = double(t_ + moment_steps_before_);  // updates the moments have averaged
  s.step_size = float(lr / (1.0 - std::pow(optim_.beta1, seen)));
  s.inv_sqrt_bc2 = float(1.0 / std::sqrt(1.0 - std::pow(optim_.beta2, seen)));
  s.keep = float(1.0 - lr * optim_.weight_decay);
  backend_.adamw(w.data(), g.data(), m_.data(), v_.data(), segments_, s);
}

}  // namespace forge::trainer
