// The vision tower of a vision-language model (VisionSpec, model.h): the ViT encoder and the projector that
// turn a micro-batch's pictures into rows of the language model's width. The GPT (model.cpp) owns one when
// its slice holds the embedding, and puts those rows in place of the pictures' placeholder embeddings.
//
// Pixels enter as SigLIP's do: x / 127.5 - 1 per channel (mean and std 0.5). A picture's patches are its
// (image_size / patch)^2 squares in row-major order, each flattened channel first, then row, then column:
// the layout of a [width, 3, patch, patch] convolution weight, so the patch embedding is one product.
#pragma once

#include "forge/trainer/backend.h"
#include "forge/trainer/layers.h"
#include "forge/trainer/model.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace forge::trainer {

class VisionTower {
 public:
  // Up to `max_pictures` pictures per micro-batch, for `slots` micro-batches in flight; `ref` looks up a
  // parameter of the model's table by name, `layers` makes the products (split over tensor-parallel ranks
  // as their parameters are: every rank holds every picture's rows, and its share of the heads and of the
  // MLP's and projector's hidden width). A frozen parameter's ref has no gradient: with the encoder frozen,
  // backward() stops at the projector.
  VisionTower(Backend& backend, const LayerFactory& layers, const VisionSpec& spec, int d_model,
              int max_pictures, int slots, const std::function<ParamRef(const std::string&)>& ref);
  ~VisionTower();
  VisionTower(const VisionTower&) = delete;
  VisionTower& operator=(const VisionTower&) = delete;

  // The features [pictures x tokens, d_model] (backend memory) of `pictures` pictures of image_size^2 RGB
  // bytes each at `pixels` (host memory), kept in `slot` for backward.
  const float* forward(int slot, const uint8_t* pixels, int pictures);
  // Adds the gradients of the tower's parameters from d_features = dL/d(features) of the pictures
  // forward() ran on `slot` ([pictures x tokens, d_model], backend memory; overwritten).
  void backward(int slot, float* d_features);
  // Scratch of [max_pictures x tokens, d_model] floats for the caller's d_features.
  float* d_features() { return d_features_.data(); }
  // Whether backward() forms any gradient (false: the encoder and the projector are frozen).
  bool trains() const { return trains_; }
  size_t activation_bytes() const;

 private:
  struct Block;
  struct Acts;

  Backend& backend_;
  VisionSpec spec_;
  int d_model_, max_rows_;
  int qkv_, att_, mlp_,
      proj_;  // this rank's widths: q|k|v, the attention's output, the MLP's and projector's hidden
  bool frozen_encoder_, trains_;
  AttentionShape shape_;
  std::unique_ptr<Linear> patch_, fc1_, fc2_;
  std::unique_ptr<NormLayer> ln_post_;
  ParamRef pos_;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<std::unique_ptr<Acts>> acts_;  // per slot
  std::vector<float> patches_host_;
  Buffer<float> d_features_, dx_, dln_, dqkv_, datt_, dmlp_, dproj_;
};

}  // namespace forge::trainer
