// Vision-language training step on the CPU (bench/vision.sh): the trainer benchmark's Llama shape (6 blocks
// of 384, 6 heads sharing 3 key/value heads, SwiGLU 1024, vocabulary 8192, 8 x 256 positions) with a vision
// tower of the same width (6 blocks, 6 heads, MLP 1536, projector 384) over 112 x 112 pictures in 14-pixel
// patches (64 positions each), two pictures a row (half the positions). Prints the step's time with the
// pictures and without (the same tokens, the tower skipped), the tower's share, the tower's own forward +
// backward time and GFLOP/s against the sgemm peak measured in the same run; bench/vision.sh sets the PyTorch
// peer of the tower beside it. Then the step with the language model frozen (train.freeze = lm: none of
// its weight gradients formed) against the same step trained, next to the ratio of their FLOPs.
//
// Usage: bench_vision [--threads N] [--reps N]
#include "forge/trainer/model.h"
#include "forge/trainer/runtime.h"
#include "forge/trainer/spec.h"
#include "timing.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace forge::trainer;

int main(int argc, char** argv) {
  int threads = 2, reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_vision [--threads N] [--reps N]\n");
      return 64;
    }
  }
  use_threads(threads);
  const ModelSpec spec = model_spec(std::vector<std::string>{
      "--model.family=llama", "--model.layers=6", "--model.d_model=384", "--model.heads=6",
      "--model.kv_heads=3", "--model.ffn_hidden=1024", "--model.vocab=8192", "--model.seq_len=256",
      "--vision.layers=6", "--vision.image_size=112", "--vision.patch=14", "--vision.width=384",
      "--vision.heads=6"});
  const VisionSpec& v = spec.vision;
  const int B = 8, T = spec.seq_len, per_row = 2;
  GPT model(spec, {.batch = B});
  model.init(1);

  std::mt19937 rng(7);
  forge::MicroBatch with;
  with.resize(B, T);
  for (size_t i = 0; i < with.size(); ++i) {
    with.inputs[i] = int32_t(rng() % uint32_t(spec.vocab));
    with.targets[i] = int32_t(rng() % uint32_t(spec.vocab));
  }
  with.image_size = v.image_size;
  with.image_tokens = v.tokens();
  std::vector<uint8_t> rgb(with.image_bytes());
  for (int r = 0; r < B; ++r)
    for (int k = 0; k < per_row; ++k) {
      for (auto& p : rgb) p = uint8_t(rng());
      with.add_image(r, 16 + k * (v.tokens() + 32), rgb.data());
    }
  forge::MicroBatch without = with;
  without.image_pixels.clear();
  without.image_starts.clear();

  const double peak = measure_sgemm_gflops(2048, 3);
  const double step_with = forge::bench::best_seconds([&] { model.forward_backward(with, 1.0f); }, reps);
  const double step_without =
      forge::bench::best_seconds([&] { model.forward_backward(without, 1.0f); }, reps);
  // The tower's products per picture, forward and backward (3 x the forward's 2 x multiply-adds): its
  // parameters times its positions, and per block the attention's two T x T x width products.
  double tower_params = 0;
  for (const ParamInfo& p : model.params())
    if (p.name.starts_with("vision.") || p.name.starts_with("projector.")) tower_params += double(p.numel);
  tower_params -= double(v.tokens()) * v.width;  // the position table is added, not multiplied
  const double pictures = double(B * per_row);
  const double tower_flops =
      pictures * 6.0 *
      (tower_params * v.tokens() + 2.0 * v.layers * double(v.tokens()) * v.tokens() * v.width);
  const double tower_s = step_with - step_without;
  // The language model frozen: its products form their input gradients only, 2 of their 6 FLOPs per
  // multiplying parameter and position saved (the embedding is a lookup, not a product).
  Freeze lm;
  lm.lm = true;
  GPT frozen(spec, {.batch = B, .frozen = lm.predicate()});
  frozen.init(1);
  const double step_frozen = forge::bench::best_seconds([&] { frozen.forward_backward(with, 1.0f); }, reps);
  double lm_params = 0;
  for (const ParamInfo& p : model.params())
    if (model_part(p.name) == ModelPart::kLm && p.shape.size() == 2 && p.name != "wte.weight")
      lm_params += double(p.numel);
  const double positions = double(B) * T, C = spec.d_model;
  const double attention = 6.0 * spec.layers * B * double(T) * T * C;  // causal: half of QK^T and AV, x3
  const double trained_flops = 6.0 * lm_params * positions + attention + tower_flops;
  const double frozen_flops = trained_flops - 2.0 * lm_params * positions;
  std::printf(
      "shape: llama 6 x 384, %d x %d positions; vision %d blocks of %d, %d pictures of %d x %d (%d tokens "
      "each), %.1f M tower parameters; %d threads\n",
      B, T, v.layers, v.width, int(pictures), v.image_size, v.image_size, v.tokens(), tower_params / 1e6,
      threads);
  std::printf("sgemm_peak_gflops=%.1f\n", peak);
  std::printf("step_with_pictures_ms=%.1f step_text_only_ms=%.1f\n", step_with * 1e3, step_without * 1e3);
  std::printf("tower_ms=%.1f tower_share=%.1f%% tower_gflops=%.1f (%.1f%% of peak) pictures_per_s=%.1f\n",
              tower_s * 1e3, 100.0 * tower_s / step_with, tower_flops / tower_s / 1e9,
              100.0 * tower_flops / tower_s / 1e9 / peak, pictures / tower_s);
  std::printf("step_lm_frozen_ms=%.1f frozen_over_trained=%.3f flops_ratio=%.3f\n", step_frozen * 1e3,
              step_frozen / step_with, frozen_flops / trained_flops);
  return 0;
}
