// The parallel layout of a job: how its ranks split the work, five ways. One type, one parser, one rank
// formula and one validation for every program: forge-train, forge-gate, forge-quota, the SPANK plugin
// (which embeds this file: standard library only) and the checkpoints (docs/ARCHITECTURE.md, "Layout").
//
//   tp  tensor parallel: the matrices of each layer are split (innermost, so a TP group stays in a node)
//   cp  context parallel: the sequence is split                     (must be 1 until it is implemented)
//   dp  data parallel: replicas of the model on different data (ZeRO-1 shards their optimizer state)
//   ep  expert parallel: carved out of dp, ep consecutive dp ranks share out the experts of MoE blocks
//   pp  pipeline parallel: stages of consecutive layers (outermost)
//
//   rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)),   ep_rank = dp_rank % ep
//
// The spelling is "tp2,pp2,dp4": tp, pp and dp must be given, cp and ep may be (default 1), any order.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace forge {

struct Layout {
  int tp = 1, cp = 1, ep = 1, dp = 1, pp = 1;

  // Ranks the layout needs (ep divides dp, so it adds none).
  int world() const { return tp * cp * dp * pp; }
  // The normalised spelling: "tp2,pp2,dp4", then ",cp2" and ",ep2" when they are not 1.
  std::string str() const;
  bool operator==(const Layout&) const = default;

  // Where a rank sits in each dimension.
  struct Coords {
    int tp = 0, cp = 0, dp = 0, pp = 0;
  };
  Coords coords(int rank) const;
  int rank(const Coords& c) const { return c.tp + tp * (c.cp + cp * (c.dp + dp * c.pp)); }
  int ep_rank(const Coords& c) const { return c.dp % ep; }
};

// Parses a layout. On failure returns nullopt and sets `why` (when given) to one line naming the part that
// is wrong and the expected form: an unknown dimension, a value that is not a whole number from 1 to
// 65536, a dimension given twice or missing, or a product over 1048576 ranks.
std::optional<Layout> parse_layout(std::string_view text, std::string* why);

// What of a model a layout must divide.
struct ModelDims {
  int layers = 0, heads = 0, vocab = 0;
  int experts = 0;   // per Mixture-of-Experts block; 0: a dense model
  int kv_heads = 0;  // key/value heads (grouped-query attention); 0: as many as heads
  int seq_len = 0;   // tokens per training sequence; 0: not known
};

// The first problem of running `model` on `layout`, as the job-spec key to change and why.
struct LayoutProblem {
  std::string key, why;
};
std::optional<LayoutProblem> layout_problem(const Layout& layout, const ModelDims& model);

}  // namespace forge
