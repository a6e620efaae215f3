#include "forge/comm/groups.h"

#include "forge/common/error.h"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <vector>

namespace forge::comm {

namespace {

class DoneRequest final : public Request {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class SelfComm final : public Comm {
 public:
  explicit SelfComm(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  RequestPtr all_reduce(void*, size_t, CommType, ReduceOp) override { return done(); }
  RequestPtr reduce_scatter(const void* in, void* out, size_t count, CommType type) override {
    return copy(in, out, count, type);
  }
  RequestPtr all_gather(const void* in, void* out, size_t count, CommType type) override {
    return copy(in, out, count, type);
  }
  RequestPtr broadcast(void*, size_t, CommType, int) override { return done(); }
  RequestPtr all_to_all_v(const void* in, const size_t* send_counts, void* out, const size_t* recv_counts,
                          CommType type) override {
    if (send_counts[0] != recv_counts[0])
      throw std::logic_error("self communicator '" + name_ + "': all_to_all_v receives what it sends");
    return copy(in, out, send_counts[0], type);
  }
  RequestPtr send(const void*, size_t, CommType, int, int) override { return no_peer("send"); }
  RequestPtr recv(void*, size_t, CommType, int, int) override { return no_peer("recv"); }
  void barrier() override {}
  std::unique_ptr<Comm> split(int color, int, const std::string& name) override {
    return color < 0 ? nullptr : std::make_unique<SelfComm>(name);  // as MPI_UNDEFINED
  }
  void abort(int exit_code) override { std::_Exit(exit_code); }

 private:
  static RequestPtr done() { return std::make_unique<DoneRequest>(); }
  RequestPtr copy(const void* in, void* out, size_t count, CommType type) {
    if (in != out) std::memmove(out, in, count * comm_type_size(type));
    return done();
  }
  [[noreturn]] RequestPtr no_peer(const char* op) {
    throw std::logic_error(std::string("self communicator '") + name_ + "': " + op + " has no peer");
  }
  std::string name_;
};

}  // namespace

std::unique_ptr<Comm> self_comm(const std::string& name) {
  return std::make_unique<SelfComm>(name);
}

ProcessGroups make_groups(std::unique_ptr<Comm> world, const Layout& layout) {
  if (world->size() != layout.world())
    fail(ExitCode::kUsage,
         "layout {} needs {} ranks but the job has {} (set parallel.* or the number of tasks so they agree)",
         layout.str(), layout.world(), world->size());
  ProcessGroups g;
  g.layout = layout;
  g.rank = world->rank();
  const Layout::Coords c = layout.coords(g.rank);
  g.tp_rank = c.tp;
  g.cp_rank = c.cp;
  g.dp_rank = c.dp;
  g.pp_rank = c.pp;
  // Colors name the position in the other dimensions; keys order ranks within the group.
  const int tp = layout.tp, cp = layout.cp;
  g.tp = world->split(c.cp + cp * (c.dp + layout.dp * c.pp), c.tp, "tp");
  g.dp = world->split(c.tp + tp * (c.cp + cp * c.pp), c.dp, "dp");
  g.cp = world->split(c.tp + tp * (c.dp + layout.dp * c.pp), c.cp, "cp");
  g.dp_cp = world->split(c.tp + tp * c.pp, c.cp + cp * c.dp, "dp_cp");
  const int stage_color = c.tp + tp * (c.cp + cp * c.dp);
  g.pp = world->split(stage_color, c.pp, "pp");
  const bool holds_wte = layout.pp > 1 && (g.first_stage() || g.last_stage());
  g.embed = world->split(holds_wte ? stage_color : -1, c.pp, "embed");
  // Expert parallelism carves dp into dp / ep groups of ep consecutive dp ranks (layout.h): the ep group
  // shares out the experts; the ranks at the same place in every ep group hold the same experts, and so
  // do the context-parallel ranks (each routes its own chunks of the sequences): expert_dp spans both.
  const int ep = layout.ep, replica = c.tp + tp * (c.cp + cp * c.pp);
  g.ep_rank = layout.ep_rank(c);
  g.ep = world->split(replica + tp * cp * layout.pp * (c.dp / ep), g.ep_rank, "ep");
  g.expert_dp =
      world->split(c.tp + tp * (c.pp + layout.pp * g.ep_rank), c.cp + cp * (c.dp / ep), "expert_dp");
  g.world = std::move(world);
  return g;
}

std::vector<std::string> gather_node_names(Comm& group, const std::string& node) {
  // Fixed-size records, NUL-terminated (Slurm's node names are short).
  constexpr size_t kName = 64;
  std::string mine = node.substr(0, kName - 1);
  mine.resize(kName, '\0');
  std::string all(kName * size_t(group.size()), '\0');
  group.all_gather(mine.data(), all.data(), kName, CommType::kU8)->wait();
  std::vector<std::string> out;
  for (int r = 0; r < group.size(); ++r) out.emplace_back(all.c_str() + size_t(r) * kName);
  return out;
}

NodeSplit split_by_node(Comm& group, const std::string& node, const std::string& key) {
  const std::vector<std::string> all = gather_node_names(group, node);
  std::vector<std::string> names;  // in order of first appearance
  std::map<std::string, int> count;
  int index = 0, place = 0;  // this rank's node and its place among the node's ranks
  for (int r = 0; r < group.size(); ++r) {
    const std::string& name = all[size_t(r)];
    if (count[name]++ == 0) names.push_back(name);
    if (r == group.rank()) {
      index = int(std::find(names.begin(), names.end(), name) - names.begin());
      place = count[name] - 1;
    }
  }
  for (const std::string& n : names)
    if (count[n] != count[names[0]])
      fail(ExitCode::kUsage,
           "{} = node needs the same number of the '{}' group's {} ranks on every node, but node {} holds {} "
           "and node {} holds {}: give every node as many tasks, or set {} = dp",
           key, group.name(), group.size(), names[0], count[names[0]], n, count[n], key);
  NodeSplit out;
  out.nodes = int(names.size());
  out.shard = group.split(index, place, group.name() + "_shard");
  out.replica = group.split(place, index, group.name() + "_replica");
  return out;
}

}  // namespace forge::comm
