// The Mixture-of-Experts FFN (model.ffn = moe; docs/TRAINER.md, "Mixture of Experts"): a router and
// `experts` MLPs in the block's FFN slot, GELU MLPs of the dense MLP's shape (GPT-2 style) or SwiGLU ones
// (Mixtral, Qwen-MoE).
//
//   router   logits = x Wr^T in FP32 (the master weights, also in BF16 mode), p = softmax(logits); each
//            token goes to its top_k experts (ties: the lower index). By default gate = p of that expert,
//            NOT renormalised over the k chosen (renormalising top-1 would leave the router no gradient
//            from the language-model loss; Switch Transformer does the same). renormalize: gate_j = p_j /
//            sum of the p of the token's top_k chosen experts (dropped ones included), what Mixtral and
//            Qwen 3 MoE do (with top_k >= 2); the gradient flows through the sum to all k chosen p.
//   capacity capacity_factor > 0: an expert takes at most ceil(factor x N x top_k / experts) of a
//            micro-batch's N tokens on this rank; first choices of every token first, then second
//            choices, each in token order. A dropped assignment adds nothing: the token keeps its
//            residual stream (and its other experts). 0: dropless.
//   output   out[t] = sum over t's kept assignments of gate x expert(x[t]). GELU experts: expert(x) =
//            proj(gelu(fc(x))), each Linear with its bias (when the model has biases). SwiGLU experts:
//            [g | u] = gate_up(x) (2 x the hidden width), expert(x) = down(silu(g) x u), no biases in the
//            released models (the layer takes them if given).
//   losses   load balancing aux = alpha x E x sum_i f_i P_i (Switch/GShard; f_i: share of the N x top_k
//            assignments routed to expert i before capacity, a constant; P_i: mean router probability),
//            and z = beta x mean_t logsumexp(logits_t)^2. Each micro-batch's weigh `loss_weight` in the
//            objective (the trainer: 1 / (micro-batches x dp), their mean over the step).
//
// The experts this process holds are [rank, rank + 1) x experts / size() of the TokenExchange: tokens go to
// them and come back through exchange_rows (an all-to-all under expert parallelism). Tensor parallelism
// does not split the experts: the tensor-parallel ranks hold the same experts and compute the same rows.
#pragma once

#include "forge/trainer/model.h"
#include "forge/trainer/step_stats.h"

#include <memory>
#include <vector>

namespace forge::trainer {

struct MoeSettings {
  int experts = 0, top_k = 1;
  double capacity_factor = 0, aux_coef = 1e-2, z_coef = 1e-3;
  bool bf16 = false;         // store the experts' activations as 2-byte BF16 as the dense MLP does
  bool swiglu = false;       // SwiGLU experts (gate_up, down) instead of GELU ones (fc, proj)
  bool renormalize = false;  // gates renormalised over the token's top_k chosen experts
  bool round_robin = false;  // testing: assignment j of token t goes to expert (t x top_k + j) mod experts
  int banned_expert = -1;    // testing: never chosen (never_choose)
};

class MoeLayer final : public FeedForward {
 public:
  // router: [experts, C], its FP32 values; E_local = experts / exchange->size(). GELU experts: fc
  // [E_local, H, C] and [E_local, H], proj [E_local, C, H] and [E_local, C] (H = 4C for GPT-2). SwiGLU
  // experts: fc_weight is gate_up [E_local, 2H, C] (per expert, H gate rows then H up rows), proj_weight
  // down [E_local, C, H]. A bias may be null (none; the released SwiGLU models have none, and
  // model.linear_bias = off removes the GELU experts' too). `rows`: the most rows forward takes.
  MoeLayer(Backend& backend, const MoeSettings& settings, int layer, ParamRef router, ParamRef fc_weight,
           ParamRef fc_bias, ParamRef proj_weight, ParamRef proj_bias,
           std::unique_ptr<TokenExchange> exchange, int slots, int rows);
  ~MoeLayer() override;

  void forward(int slot, ConstAct in, float* out, int rows) override;
  void backward(int slot, ConstAct in, const float* dout, float* din, int rows) override;
  const float* output_bias() const override;  // zeros: each expert's bias is in its output
  size_t activation_bytes() const override;

  int layer() const { return layer_; }
  void set_loss_weight(float weight) { loss_weight_ = weight; }
  // Testing (guard.inject_dead_expert): the router never chooses `expert`.
  void never_choose(int expert) { settings_.banned_expert = expert; }
  RouterStats take_stats();

  // The routing of the last forward on `slot` (tests): per token t and choice j < top_k.
  struct Routing {
    std::vector<int32_t> expert;  // [N, top_k]
    std::vector<float> gate;      // [N, top_k], renormalised when settings.renormalize
    std::vector<int32_t> row;     // [N, top_k]: its row among the sent ones; -1: dropped
    double aux = 0, z = 0;        // this micro-batch's losses
  };
  const Routing& routing(int slot) const;

 private:
  struct Slot;
  struct Work;
  void route(Slot& s, ConstAct in, int N);
  void expert_backward(Slot& s, const float* dy, float* dx);

  Backend& backend_;
  MoeSettings settings_;
  int layer_, C_, H_, local_experts_;
  int fc_width_;  // rows of each expert's first product: H (GELU), 2H (SwiGLU's gate | up)
  ParamRef router_, fc_w_, fc_b_, proj_w_, proj_b_;
  std::unique_ptr<TokenExchange> exchange_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unique_ptr<Work> work_;
  Buffer<float> zero_bias_;
  float loss_weight_ = 1;
  RouterStats stats_;
};

}  // namespace forge::trainer
