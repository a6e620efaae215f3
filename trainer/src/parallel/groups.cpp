#include "forge/trainer/groups.h"

#include "forge/common/error.h"

#include <fmt/format.h>

namespace forge::trainer {

std::string Layout::str() const {
  return fmt::format("tp{},pp{},dp{}", tp, pp, dp);
}

ProcessGroups make_groups(std::unique_ptr<Comm> world, const Layout& layout) {
  if (world->size() != layout.world())
    fail(ExitCode::kUsage,
         "layout {} needs tp*pp*dp = {} ranks but the job has {} (set parallel.* or the "
         "number of tasks so they agree)",
         layout.str(), layout.world(), world->size());
  ProcessGroups g;
  g.layout = layout;
  g.rank = world->rank();
  g.tp_rank = g.rank % layout.tp;
  g.dp_rank = (g.rank / layout.tp) % layout.dp;
  g.pp_rank = g.rank / (layout.tp * layout.dp);
  // Colors name the position in the other two dimensions; keys order ranks within the group.
  g.tp = world->split(g.pp_rank * layout.dp + g.dp_rank, g.tp_rank, "tp");
  g.dp = world->split(g.pp_rank * layout.tp + g.tp_rank, g.dp_rank, "dp");
  g.pp = world->split(g.dp_rank * layout.tp + g.tp_rank, g.pp_rank, "pp");
  const bool holds_wte = layout.pp > 1 && (g.first_stage() || g.last_stage());
  g.embed = world->split(holds_wte ? g.dp_rank * layout.tp + g.tp_rank : -1, g.pp_rank, "embed");
  g.world = std::move(world);
  return g;
}

}  // namespace forge::trainer
