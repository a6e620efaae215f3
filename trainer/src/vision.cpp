// The vision tower's forward and backward over the backend's ops (vision.h).
#include "vision.h"

#include "forge/common/trace.h"

#include <stdexcept>

namespace forge::trainer {

struct VisionTower::Block {
  std::unique_ptr<NormLayer> ln1, ln2;
  std::unique_ptr<Linear> qkv, proj, fc, fc_proj;
};

// What one micro-batch's backward reads again (every buffer max_rows_ rows).
struct VisionTower::Acts {
  int pictures = 0;
  Buffer<float> patches;  // [rows, patch_values]: the normalised pixels
  Buffer<float> x;        // (layers + 1) x [rows, width]: the stream entering each block, and leaving
  struct PerBlock {
    Buffer<float> ln1, ln1_stats, qkv, att, lse, res_mid, ln2, ln2_stats, pre, act;
  };
  std::vector<PerBlock> blocks;
  Buffer<float> post, post_stats, pre1, hidden, features;  // post: empty without the final norm
};

VisionTower::VisionTower(Backend& backend, const LayerFactory& layers, const VisionSpec& spec, int d_model,
                         int max_pictures, int slots, const std::function<ParamRef(const std::string&)>& ref)
    : backend_(backend),
      spec_(spec),
      d_model_(d_model),
      max_rows_(max_pictures * spec.tokens()),
      frozen_encoder_(ref("vision.patch.weight").grad == nullptr),
      trains_(!frozen_encoder_ || ref("projector.fc2.weight").grad != nullptr) {
  if (!spec.enabled() || max_pictures < 1 || slots < 1)
    throw std::invalid_argument("VisionTower: needs a vision spec, >= 1 picture and >= 1 slot");
  const auto local_rows = [&](const std::string& name) { return int(ref(name).info->local_shape[0]); };
  qkv_ = local_rows("vision.blocks.0.attn.qkv.weight");
  att_ = qkv_ / 3;
  mlp_ = local_rows("vision.blocks.0.mlp.fc.weight");
  proj_ = local_rows("projector.fc1.weight");
  const int head_dim = spec.width / spec.heads;
  shape_ = {att_ / head_dim, att_ / head_dim, head_dim, 0, false};
  const auto linear = [&](const std::string& name, bool add_bias) {
    return layers.linear(backend, ref(name + ".weight"), ref(name + ".bias"), add_bias);
  };
  const auto layernorm = [&](const std::string& name) {
    return std::make_unique<NormLayer>(backend, true, spec.norm_eps, ref(name + ".weight"),
                                       ref(name + ".bias"));
  };
  patch_ = linear("vision.patch", true);
  pos_ = ref("vision.pos.weight");
  for (int l = 0; l < spec.layers; ++l) {
    const std::string b = "vision.blocks." + std::to_string(l) + ".";
    auto block = std::make_unique<Block>();
    block->ln1 = layernorm(b + "ln1");
    block->ln2 = layernorm(b + "ln2");
    // The output products' biases are fused into the residual adds that follow them.
    block->qkv = linear(b + "attn.qkv", true);
    block->proj = linear(b + "attn.proj", false);
    block->fc = linear(b + "mlp.fc", true);
    block->fc_proj = linear(b + "mlp.proj", false);
    blocks_.push_back(std::move(block));
  }
  if (spec.post_norm) ln_post_ = layernorm("vision.ln_post");
  fc1_ = linear("projector.fc1", true);
  fc2_ = linear("projector.fc2", true);

  // This rank's share of the split widths (all of them on one rank).
  const size_t M = size_t(max_rows_), W = size_t(spec.width), Q = size_t(qkv_), A = size_t(att_),
               H = size_t(mlp_), P = size_t(proj_), C = size_t(d_model);
  for (int s = 0; s < slots; ++s) {
    auto a = std::make_unique<Acts>();
    a->patches = backend.alloc<float>(M * size_t(spec.patch_values()));
    a->x = backend.alloc<float>(size_t(spec.layers + 1) * M * W);
    for (int l = 0; l < spec.layers; ++l) {
      Acts::PerBlock k;
      k.ln1 = backend.alloc<float>(M * W);
      k.ln1_stats = backend.alloc<float>(2 * M);
      k.qkv = backend.alloc<float>(M * Q);
      k.att = backend.alloc<float>(M * A);
      k.lse = backend.alloc<float>(M * size_t(shape_.heads));
      k.res_mid = backend.alloc<float>(M * W);
      k.ln2 = backend.alloc<float>(M * W);
      k.ln2_stats = backend.alloc<float>(2 * M);
      k.pre = backend.alloc<float>(M * H);
      k.act = backend.alloc<float>(M * H);
      a->blocks.push_back(std::move(k));
    }
    if (ln_post_) {
      a->post = backend.alloc<float>(M * W);
      a->post_stats = backend.alloc<float>(2 * M);
    }
    a->pre1 = backend.alloc<float>(M * P);
    a->hidden = backend.alloc<float>(M * P);
    a->features = backend.alloc<float>(M * C);
    acts_.push_back(std::move(a));
  }
  d_features_ = backend.alloc<float>(M * C);
  dx_ = backend.alloc<float>(M * W);
  dln_ = backend.alloc<float>(M * W);
  dqkv_ = backend.alloc<float>(M * Q);
  datt_ = backend.alloc<float>(M * A);
  dmlp_ = backend.alloc<float>(M * H);
  dproj_ = backend.alloc<float>(M * P);
}

VisionTower::~VisionTower() = default;

const float* VisionTower::forward(int slot, const uint8_t* pixels, int pictures) {
  TraceSpan span("forward vision", "compute");
  Acts& a = *acts_.at(size_t(slot));
  const int T = spec_.tokens(), W = spec_.width, PV = spec_.patch_values();
  const int M = pictures * T;
  if (pictures < 1 || M > max_rows_) throw std::invalid_argument("VisionTower: pictures outside [1, max]");
  a.pictures = pictures;
  // Patches, normalised: patch (gy, gx) of picture k is row k x T + gy x grid + gx.
  const int S = spec_.image_size, p = spec_.patch, G = spec_.grid();
  patches_host_.resize(size_t(M) * size_t(PV));
  for (int k = 0; k < pictures; ++k)
    for (int gy = 0; gy < G; ++gy)
      for (int gx = 0; gx < G; ++gx) {
        float* row = patches_host_.data() + (int64_t(k) * T + gy * G + gx) * PV;
        for (int c = 0; c < 3; ++c)
          for (int y = 0; y < p; ++y)
            for (int x = 0; x < p; ++x) {
              const uint8_t v = pixels[((int64_t(k) * S + gy * p + y) * S + gx * p + x) * 3 + c];
              row[(c * p + y) * p + x] = float(v) / 127.5f - 1.0f;
            }
      }
  backend_.copy_from_host(a.patches.data(), patches_host_.data(), patches_host_.size() * sizeof(float));

  const int64_t MW = int64_t(M) * W;
  float* x = a.x.data();
  patch_->forward(x, a.patches.data(), M);
  for (int k = 0; k < pictures; ++k)
    backend_.residual_forward(x + int64_t(k) * T * W, x + int64_t(k) * T * W, pos_.value, nullptr, T, W);
  float* delta = dln_.data();  // forward scratch: a layer's update to the stream
  for (size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = *blocks_[l];
    Acts::PerBlock& k = a.blocks[l];
    const float* in = x + int64_t(l) * MW;
    b.ln1->forward(k.ln1.data(), k.ln1_stats.data(), in, M, W);
    b.qkv->forward(k.qkv.data(), k.ln1.data(), M);
    backend_.attention_forward(k.att.data(), k.lse.data(), k.qkv.data(), nullptr, pictures, T, shape_);
    b.proj->forward(delta, k.att.data(), M);
    b.ln2->residual_forward(k.res_mid.data(), k.ln2.data(), k.ln2_stats.data(), in, delta, b.proj->bias(), M,
                            W);
    b.fc->forward_gelu(k.act.data(), k.pre.data(), k.ln2.data(), M);
    b.fc_proj->forward(delta, k.act.data(), M);
    backend_.residual_forward(x + int64_t(l + 1) * MW, k.res_mid.data(), delta, b.fc_proj->bias(), M, W);
  }
  const float* last = x + int64_t(blocks_.size()) * MW;
  if (ln_post_) ln_post_->forward(a.post.data(), a.post_stats.data(), last, M, W);
  fc1_->forward_gelu(a.hidden.data(), a.pre1.data(), ln_post_ ? a.post.data() : last, M);
  fc2_->forward(a.features.data(), a.hidden.data(), M);
  return a.features.data();
}

void VisionTower::backward(int slot, float* d_features) {
  TraceSpan span("backward vision", "compute");
  Acts& a = *acts_.at(size_t(slot));
  const int T = spec_.tokens(), W = spec_.width, H = mlp_, P = proj_;
  const int M = a.pictures * T;
  const int64_t MW = int64_t(M) * W;
  const float* x = a.x.data();
  float *dx = dx_.data(), *dln = dln_.data();
  fc2_->backward(dproj_.data(), d_features, a.hidden.data(), M);
  backend_.gelu_backward(dproj_.data(), a.pre1.data(), M, P);
  // dx = dL/d(last block's output): through the final norm, or straight from the projector.
  const float* last = x + int64_t(blocks_.size()) * MW;
  fc1_->backward(frozen_encoder_ ? nullptr
                 : ln_post_      ? dln
                                 : dx,
                 dproj_.data(), ln_post_ ? a.post.data() : last, M);
  if (frozen_encoder_) return;
  if (ln_post_) {
    backend_.fill(dx, 0.0f, size_t(MW));
    ln_post_->backward(dx, dln, last, a.post_stats.data(), M, W);
  }
  // dx = dL/d(block output), in place: the MLP's norm adds its path (dx = dL/d(res_mid)), then the
  // attention's norm adds its own (dx = dL/d(block input)).
  for (size_t l = blocks_.size(); l-- > 0;) {
    Block& b = *blocks_[l];
    Acts::PerBlock& k = a.blocks[l];
    b.fc_proj->backward(dmlp_.data(), dx, k.act.data(), M);
    backend_.gelu_backward(dmlp_.data(), k.pre.data(), M, H);
    b.fc->backward(dln, dmlp_.data(), k.ln2.data(), M);
    b.ln2->backward(dx, dln, k.res_mid.data(), k.ln2_stats.data(), M, W);
    b.proj->backward(datt_.data(), dx, k.att.data(), M);
    backend_.attention_backward(dqkv_.data(), datt_.data(), k.qkv.data(), k.att.data(), k.lse.data(), nullptr,
                                a.pictures, T, shape_);
    b.qkv->backward(dln, dqkv_.data(), k.ln1.data(), M);
    b.ln1->backward(dx, dln, x + int64_t(l) * MW, k.ln1_stats.data(), M, W);
  }
  for (int p = 0; p < a.pictures; ++p)
    backend_.residual_forward(pos_.grad, pos_.grad, dx + int64_t(p) * T * W, nullptr, T, W);
  patch_->backward(nullptr, dx, a.patches.data(), M);
}

size_t VisionTower::activation_bytes() const {
  size_t n = 0;
  for (const auto& a : acts_) {
    n += a->patches.size() + a->x.size() + a->post.size() + a->post_stats.size() + a->pre1.size() +
         a->hidden.size() + a->features.size();
    for (const auto& k : a->blocks)
      for (const auto* v :
           {&k.ln1, &k.ln1_stats, &k.qkv, &k.att, &k.lse, &k.res_mid, &k.ln2, &k.ln2_stats, &k.pre, &k.act})
        n += v->size();
  }
  for (const auto* v : {&d_features_, &dx_, &dln_, &dqkv_, &datt_, &dmlp_, &dproj_}) n += v->size();
  return n * sizeof(float);
}

}  // namespace forge::trainer
