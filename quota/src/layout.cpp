#include "forge/quota/layout.h"

#include <fmt/format.h>

#include "forge/common/error.h"
#include "forge/common/ini.h"
#include "forge/common/text.h"

#include <limits>

namespace forge::quota {

std::optional<SpecLayout> read_spec_layout(const std::string& path, std::string* why) {
  SpecLayout spec;
  struct Slot {
    const char* section;
    const char* key;
    int* value;
    int64_t max;
  };
  // The layout's bounds are parse_layout's; the model's the trainer's (positive ints).
  const Slot slots[] = {{"parallel", "tp", &spec.layout.tp, 65536},
                        {"parallel", "cp", &spec.layout.cp, 65536},
                        {"parallel", "ep", &spec.layout.ep, 65536},
                        {"parallel", "dp", &spec.layout.dp, 65536},
                        {"parallel", "pp", &spec.layout.pp, 65536},
                        {"model", "layers", &spec.model.layers, std::numeric_limits<int>::max()},
                        {"model", "heads", &spec.model.heads, std::numeric_limits<int>::max()},
                        {"model", "vocab", &spec.model.vocab, std::numeric_limits<int>::max()},
                        {"model", "experts", &spec.model.experts, std::numeric_limits<int>::max()},
                        {"model", "seq_len", &spec.model.seq_len, std::numeric_limits<int>::max()}};
  try {
    for (const auto& section : read_ini(path)) {
      if (const IniEntry* e = section.name == "run" ? section.find("dir") : nullptr) spec.run_dir = e->value;
      for (const Slot& s : slots) {
        const IniEntry* e = section.name == s.section ? section.find(s.key) : nullptr;
        if (!e) continue;
        const auto value = parse_int(e->value);
        if (!value || *value < 1 || *value > s.max) {
          if (why)
            *why = fmt::format("{}:{}: {}.{} = {}: expected a whole number from 1 to {}",
                               printable(path, 256), e->line, s.section, s.key, printable(e->value), s.max);
          return std::nullopt;
        }
        *s.value = static_cast<int>(*value);
      }
    }
    return spec;
  } catch (const forge::Error& e) {
    if (why) *why = e.what();
    return std::nullopt;
  }
}

int nodes_for(const Layout& layout, const Topology& topo) {
  const int gpus = layout.world();
  return gpus <= topo.gpus_per_node ? 1 : (gpus + topo.gpus_per_node - 1) / topo.gpus_per_node;
}

std::optional<std::string> topology_violation(const Layout& l, const Topology& topo) {
  const int gpn = topo.gpus_per_node, gpus = l.world(), stage = l.tp * l.cp * l.dp;
  if (topo.tp_within_node && (l.tp > gpn || gpn % l.tp != 0))
    return fmt::format(
        "TP={} does not fit inside one node of {} GPUs (a TP group must stay in a node): use a tp that "
        "divides {} and raise dp or pp instead",
        l.tp, gpn, gpn);
  if (gpus > gpn && gpus % gpn != 0)
    return fmt::format(
        "{} GPUs (tp*cp*dp*pp) span nodes but do not fill them: a multi-node job uses whole nodes of {} "
        "GPUs, so make tp*cp*dp*pp a multiple of {}",
        gpus, gpn, gpn);
  if (topo.pp_align_nodes && l.pp > 1 && stage % gpn != 0 && gpn % stage != 0)
    return fmt::format(
        "a pipeline stage of {} GPUs (tp*cp*dp) would straddle nodes of {} GPUs: make tp*cp*dp a multiple "
        "or a divisor of {}",
        stage, gpn, gpn);
  return std::nullopt;
}

}  // namespace forge::quota
