// The reader's picture samples against what one GPU consumes: rows of an image-text dataset (packed
// conversations with their pictures, as forge-train's sft reads them) per CPU-second of one core, next to
// the rows per second an H200 at its BF16 dense peak trains at the demo's vision-language model scaled to
// a 7B language model (LLaVA-1.5-7B's shape: Llama 7B behind a ViT-L/14 at 336 pixels), from the FLOPs the
// trainer counts (trainer::flops_per_token, the plan's and the MFU's) plus the tower's forward per picture.
// Usage: bench_image_reader DATASET [ROUNDS] (bench/image_reader.sh prepares DATASET)
#include "forge/dataio/reader.h"
#include "forge/trainer/model.h"
#include "forge/trainer/spec.h"
#include "timing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>

using namespace forge;

namespace {

constexpr double kH200Bf16Tflops = 989.4;  // dense, SXM (NVIDIA's data sheet; the H100 SXM's too)

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: bench_image_reader DATASET [ROUNDS]\n");
    return 64;
  }
  const std::string dataset = argv[1];
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const trainer::ModelSpec m = trainer::model_spec(std::vector<std::string>{
      "--model.family=llama", "--model.layers=32", "--model.d_model=4096", "--model.heads=32",
      "--model.kv_heads=32", "--model.ffn_hidden=11008", "--model.vocab=32064", "--model.seq_len=2048",
      "--vision.layers=24", "--vision.image_size=336", "--vision.patch=14", "--vision.width=1024",
      "--vision.heads=16", "--vision.mlp_hidden=4096", "--vision.projector_hidden=4096"});
  const trainer::ParameterCounts n = trainer::parameter_counts(m);
  const double tower = n.total - n.active;  // encoder and projector (the language model is dense)
  const int t = m.vision.tokens();
  // A picture through the encoder and projector, forward only (LLaVA trains with the encoder frozen; a
  // trained one would cost 3x and make the GPU's appetite smaller): 2 FLOPs per parameter and position,
  // and attention's QK^T and PV over the picture's positions.
  const double tower_flops = 2 * tower * t + 4.0 * m.vision.layers * double(t) * t * m.vision.width;

  data::ReaderOptions o;
  o.seq_len = uint32_t(m.seq_len);
  o.global_batch = 8;
  o.document_mask = o.loss_mask = true;
  o.prefetch = 0;  // one core: what the training loop's thread would do itself
  // Each round opens the dataset afresh (manifest, shard checksums) and reads one epoch: the first pays
  // for mapping the shards; the best and the worst round are both reported.
  double best_rows_per_cpu_s = 0, worst_rows_per_cpu_s = 1e300, pictures_per_row = 0, mb_per_row = 0;
  for (int r = 0; r < rounds; ++r) {
    data::Reader reader(dataset, o);
    const uint64_t steps = std::max<uint64_t>(1, reader.samples_per_epoch() / o.global_batch);
    MicroBatch batch;
    uint64_t rows = 0, pictures = 0, bytes = 0;
    const double c0 = bench::process_cpu_now(), w0 = bench::wall_now();
    for (uint64_t s = 0; s < steps; ++s) {
      reader.next(batch);
      rows += uint64_t(batch.rows);
      pictures += batch.images();
      bytes += batch.image_pixels.size() + batch.inputs.size() * sizeof(batch.inputs[0]);
    }
    const double cpu = bench::process_cpu_now() - c0, wall = bench::wall_now() - w0;
    best_rows_per_cpu_s = std::max(best_rows_per_cpu_s, double(rows) / cpu);
    worst_rows_per_cpu_s = std::min(worst_rows_per_cpu_s, double(rows) / cpu);
    pictures_per_row = double(pictures) / double(rows);
    mb_per_row = double(bytes) / double(rows) / 1e6;
    fmt::print("round {}: {} rows ({} pictures) in {:.3f} s CPU, {:.3f} s wall\n", r + 1, rows, pictures, cpu,
               wall);
  }
  const double row_flops = trainer::flops_per_token(m) * m.seq_len + pictures_per_row * tower_flops;
  const double gpu_rows_per_s = kH200Bf16Tflops * 1e12 / row_flops;
  fmt::print(
      "model: Llama 7B ({:.2f} B parameters) behind a ViT-L/14 at 336 ({:.0f} M with the projector), "
      "{} positions a row\n",
      n.active / 1e9, tower / 1e6, m.seq_len);
  fmt::print("a row: {:.2f} pictures of {} positions, {:.2f} MB delivered, {:.1f} TFLOP to train\n",
             pictures_per_row, t, mb_per_row, row_flops / 1e12);
  fmt::print("reader, one core: {:.0f} rows per CPU-second ({:.0f} pictures, {:.0f} MB)\n",
             best_rows_per_cpu_s, best_rows_per_cpu_s * pictures_per_row, best_rows_per_cpu_s * mb_per_row);
  fmt::print("one H200 at its BF16 dense peak ({:.1f} TFLOP/s): {:.2f} rows per second\n", kH200Bf16Tflops,
             gpu_rows_per_s);
  fmt::print("ratio: one core reads {:.0f}x (worst round {:.0f}x) what one H200 consumes (goal: 20x)\n",
             best_rows_per_cpu_s / gpu_rows_per_s, worst_rows_per_cpu_s / gpu_rows_per_s);
}
