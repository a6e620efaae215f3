// The parallel layout a job declares (--train-layout=tp2,pp2,dp4; [parallel] in the job spec) and the
// topology rules it must obey. Rank order is TP fastest, then DP, then PP (ARCHITECTURE.md), so a
// pipeline stage is tp*dp consecutive ranks.
#pragma once

#include "forge/quota/policy.h"

#include <optional>
#include <string>
#include <string_view>

namespace forge::quota {

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  int gpus() const { return tp * pp * dp; }
  std::string str() const;  // "tp2,pp2,dp4"
  bool operator==(const Layout&) const = default;
};

// Parses "tpX,ppY,dpZ" (each exactly once, any order, 1..65536, total <= 1048576). On failure returns
// nullopt and sets `why` to a message that names the expected form.
std::optional<Layout> parse_layout(std::string_view text, std::string* why);

// The layout of a job spec's [parallel] section (tp, pp, dp; 1 when absent). nullopt with `why` set
// when the file cannot be read or its values are not positive whole numbers.
std::optional<Layout> read_spec_layout(const std::string& path, std::string* why);

// Nodes a layout needs: one when it fits in a node, else gpus / gpus_per_node.
int nodes_for(const Layout& layout, const Topology& topo);

// The first topology rule the layout breaks, as one actionable sentence; nullopt when it obeys them all.
std::optional<std::string> topology_violation(const Layout& layout, const Topology& topo);

// User-supplied text made safe to print: at most `max` bytes, control and non-ASCII bytes as \xNN.
std::string printable(std::string_view text, size_t max = 64);

}  // namespace forge::quota
