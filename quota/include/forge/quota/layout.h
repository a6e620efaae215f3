// The topology rules a job's parallel layout (forge/common/layout.h: --train-layout, [parallel] in the
// job spec) must obey on the cluster. A pipeline stage is tp*cp*dp consecutive ranks (the rank order).
#pragma once

#include "forge/common/layout.h"
#include "forge/quota/policy.h"

#include <optional>
#include <string>

namespace forge::quota {

// What admission reads of a job spec (--train-spec), in one read of the file: the layout of its
// [parallel] section (1 where a dimension is absent) and the [model] sizes the layout must divide (the
// trainer's defaults where absent, trainer/src/spec.cpp; model.experts: 0, a dense model).
struct SpecLayout {
  Layout layout;
  ModelDims model{.layers = 6, .heads = 6, .vocab = 8192};
  std::string run_dir;  // [run] dir as written (empty: not set)
};

// nullopt with `why` set (one line, file:line where there is one) when the file cannot be read, is not
// INI, or one of those values is not a whole number in its range.
std::optional<SpecLayout> read_spec_layout(const std::string& path, std::string* why);

// Nodes a layout needs: one when it fits in a node, else world / gpus_per_node.
int nodes_for(const Layout& layout, const Topology& topo);

// The first topology rule the layout breaks, as one actionable sentence; nullopt when it obeys them all.
std::optional<std::string> topology_violation(const Layout& layout, const Topology& topo);

}  // namespace forge::quota
