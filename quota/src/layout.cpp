#include "forge/quota/layout.h"

#include <fmt/format.h>

#include "forge/common/error.h"
#include "ini.h"

#include <charconv>
#include <fstream>
#include <sstream>

namespace forge::quota {

std::string Layout::str() const {
  return fmt::format("tp{},pp{},dp{}", tp, pp, dp);
}

std::optional<Layout> parse_layout(std::string_view text, std::string* why) {
  const auto no = [&](const std::string& what) -> std::optional<Layout> {
    if (why)
      *why = fmt::format("'{}' is not a layout: {}; expected tpX,ppY,dpZ such as tp2,pp2,dp4",
                         printable(text), what);
    return std::nullopt;
  };
  if (text.empty()) return no("it is empty");
  if (text.size() > 64) return no("it is longer than 64 characters");
  Layout layout;
  bool seen[3] = {false, false, false};
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    if (item.size() < 3) return no("each part is tp, pp or dp followed by a number");
    const std::string_view key = item.substr(0, 2), digits = item.substr(2);
    const int index = key == "tp" ? 0 : key == "pp" ? 1 : key == "dp" ? 2 : -1;
    if (index < 0) return no(fmt::format("unknown part '{}'", printable(item, 16)));
    if (seen[index]) return no(fmt::format("{} is given twice", key));
    const auto value = parse_int(digits);
    if (!value || *value < 1 || *value > 65536)
      return no(fmt::format("{} needs a whole number from 1 to 65536", key));
    seen[index] = true;
    (index == 0 ? layout.tp : index == 1 ? layout.pp : layout.dp) = static_cast<int>(*value);
    pos = comma + 1;
  }
  if (!seen[0] || !seen[1] || !seen[2]) return no("tp, pp and dp must all be given");
  if (static_cast<int64_t>(layout.tp) * layout.pp * layout.dp > (1 << 20))
    return no("tp*pp*dp is larger than 1048576 GPUs");
  return layout;
}

std::optional<Layout> read_spec_layout(const std::string& path, std::string* why) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (why) *why = fmt::format("cannot read job spec '{}'", printable(path, 256));
    return std::nullopt;
  }
  std::ostringstream text;
  text << in.rdbuf();
  try {
    Layout l;
    for (const auto& section : parse_ini(text.str(), printable(path, 256))) {
      if (section.name != "parallel") continue;
      for (const auto& e : section.entries) {
        int* slot = e.key == "tp" ? &l.tp : e.key == "pp" ? &l.pp : e.key == "dp" ? &l.dp : nullptr;
        if (!slot) continue;
        const auto value = parse_int(e.value);
        if (!value || *value < 1 || *value > 65536) {
          if (why)
            *why = fmt::format("{}:{}: parallel.{} = {}: expected a whole number from 1 to 65536",
                               printable(path, 256), e.line, e.key, printable(e.value));
          return std::nullopt;
        }
        *slot = static_cast<int>(*value);
      }
    }
    return l;
  } catch (const forge::Error& e) {
    if (why) *why = e.what();
    return std::nullopt;
  }
}

int nodes_for(const Layout& layout, const Topology& topo) {
  const int gpus = layout.gpus();
  return gpus <= topo.gpus_per_node ? 1 : (gpus + topo.gpus_per_node - 1) / topo.gpus_per_node;
}

std::optional<std::string> topology_violation(const Layout& l, const Topology& topo) {
  const int gpn = topo.gpus_per_node, gpus = l.gpus(), stage = l.tp * l.dp;
  if (topo.tp_within_node && (l.tp > gpn || gpn % l.tp != 0))
    return fmt::format(
        "TP={} does not fit inside one node of {} GPUs (a TP group must stay in a node): use a tp that "
        "divides {} and raise dp or pp instead",
        l.tp, gpn, gpn);
  if (gpus > gpn && gpus % gpn != 0)
    return fmt::format(
        "{} GPUs (tp*pp*dp) span nodes but do not fill them: a multi-node job uses whole nodes of {} GPUs, "
        "so make tp*pp*dp a multiple of {}",
        gpus, gpn, gpn);
  if (topo.pp_align_nodes && l.pp > 1 && stage % gpn != 0 && gpn % stage != 0)
    return fmt::format(
        "a pipeline stage of {} GPUs (tp*dp) would straddle nodes of {} GPUs: make tp*dp a multiple or a "
        "divisor of {}",
        stage, gpn, gpn);
  return std::nullopt;
}

std::string printable(std::string_view text, size_t max) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= max) {
      out += fmt::format("...({} bytes)", text.size());
      break;
    }
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\')
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

}  // namespace forge::quota
