#include "forge/trainer/trainer.h"

#include "forge/common/error.h"
#include "forge/trainer/progress.h"
#include "forge/trainer/runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace forge::trainer {

namespace {
int threads_first(int threads) {
  use_threads(threads);  // before the model's buffers are touched by OpenMP
  return threads;
}
}  // namespace

Trainer::Trainer(const TrainSpec& spec)
    : spec_(spec),
      threads_(threads_first(spec.threads)),
      model_(spec.model, spec.batch, spec.dtype),
      optimizer_(spec.optim, model_.params(), model_.weights().size()) {
  model_.init(spec.seed);
  inputs_.resize(size_t(spec.batch) * spec.model.seq_len);
  targets_.resize(inputs_.size());
}

void split_rows(const int32_t* rows, size_t count, int seq_len, int32_t* inputs, int32_t* targets) {
  const size_t T = size_t(seq_len);
  for (size_t r = 0; r < count; ++r) {
    const int32_t* src = rows + r * (T + 1);
    std::copy(src, src + T, inputs + r * T);
    std::copy(src + 1, src + 1 + T, targets + r * T);
  }
}

size_t Trainer::tokens_per_step() const {
  return size_t(spec_.microbatches) * size_t(spec_.batch) * size_t(spec_.model.seq_len + 1);
}

StepStats Trainer::step(std::span<const int32_t> tokens) {
  if (tokens.size() != tokens_per_step())
    throw std::invalid_argument("Trainer::step: expected microbatches x batch x (seq_len + 1) tokens");
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t step = optimizer_.steps_taken() + 1;
  const int T = spec_.model.seq_len;
  const size_t row = size_t(T) + 1;
  mark_activity("forward_backward");
  model_.zero_grad();
  double loss = 0;
  for (int mb = 0; mb < spec_.microbatches; ++mb) {
    split_rows(tokens.data() + size_t(mb) * size_t(spec_.batch) * row, size_t(spec_.batch), T, inputs_.data(),
               targets_.data());
    loss += model_.forward_backward(inputs_, targets_, 1.0f / float(spec_.microbatches));
  }
  loss /= spec_.microbatches;
  if (inject_nan_) {
    inject_nan_ = false;
    loss = std::numeric_limits<double>::quiet_NaN();
  }
  const double lr = learning_rate(spec_.optim, step - 1, spec_.steps);
  const double norm = std::isfinite(loss) ? clip_grad_norm(model_.grads(), spec_.optim.grad_clip)
                                          : std::numeric_limits<double>::quiet_NaN();
  const bool finite = std::isfinite(loss) && std::isfinite(norm);
  mark_activity("optimizer");
  if (finite) {
    optimizer_.step(model_.weights(), model_.grads(), lr);
    model_.weights_changed();
  } else {
    // The update is dropped, the step is not: step numbers, the schedule and the data stay functions
    // of the step whatever the guard decides.
    optimizer_.restore_steps(step);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {step, loss, norm, lr, seconds, int64_t(spec_.microbatches) * spec_.batch * T, finite};
}

}  // namespace forge::trainer
