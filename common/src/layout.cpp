#include "forge/common/layout.h"

#include "forge/common/text.h"

#include <algorithm>
#include <cstdint>

namespace forge {

namespace {

constexpr int kMaxDim = 65536;
constexpr int64_t kMaxWorld = int64_t(1) << 20;

struct Dim {
  const char* name;
  int Layout::*value;
  bool required;
};
// The order of the normalised spelling.
constexpr Dim kDims[] = {{"tp", &Layout::tp, true},
                         {"pp", &Layout::pp, true},
                         {"dp", &Layout::dp, true},
                         {"cp", &Layout::cp, false},
                         {"ep", &Layout::ep, false}};

}  // namespace

std::string Layout::str() const {
  std::string out;
  for (const Dim& d : kDims) {
    if (!d.required && this->*d.value == 1) continue;
    // Appends, not operator+ chains: GCC 12 -O3 warns falsely (-Wrestrict) on those.
    if (!out.empty()) out += ',';
    out += d.name;
    out += std::to_string(this->*d.value);
  }
  return out;
}

Layout::Coords Layout::coords(int rank) const {
  Coords c;
  c.tp = rank % tp;
  c.cp = (rank / tp) % cp;
  c.dp = (rank / (tp * cp)) % dp;
  c.pp = rank / (tp * cp * dp);
  return c;
}

std::optional<Layout> parse_layout(std::string_view text, std::string* why) {
  const auto no = [&](const std::string& what) -> std::optional<Layout> {
    if (why) {  // appended piece by piece, as in str()
      why->clear();
      *why += '\'';
      *why += printable(text);
      *why += "' is not a layout: ";
      *why += what;
      *why += "; expected tpX,ppY,dpZ (and optionally cpN, epN) such as tp2,pp2,dp4";
    }
    return std::nullopt;
  };
  if (text.empty()) return no("it is empty");
  if (text.size() > 64) return no("it is longer than 64 characters");
  Layout layout;
  bool seen[std::size(kDims)] = {};
  for (size_t pos = 0; pos <= text.size();) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    pos = comma + 1;
    size_t index = std::size(kDims);
    for (size_t i = 0; i < std::size(kDims); ++i)
      if (item.substr(0, 2) == kDims[i].name) index = i;
    if (index == std::size(kDims))
      return no("unknown part '" + printable(item, 16) +
                "' (each part is tp, cp, ep, dp or pp and a number)");
    const char* name = kDims[index].name;
    if (seen[index]) return no(std::string(name) + " is given twice");
    const auto value = parse_int(item.substr(2));
    if (!value || *value < 1 || *value > kMaxDim)
      return no(std::string(name) + " needs a whole number from 1 to 65536, not '" +
                printable(item.substr(2), 16) + "'");
    seen[index] = true;
    layout.*kDims[index].value = static_cast<int>(*value);
  }
  for (size_t i = 0; i < std::size(kDims); ++i)
    if (kDims[i].required && !seen[i]) return no(std::string(kDims[i].name) + " is missing");
  // One factor at a time: four factors of up to 65536 would overflow 64 bits.
  int64_t world = 1;
  for (const int factor : {layout.tp, layout.cp, layout.dp, layout.pp})
    if ((world *= factor) > kMaxWorld) return no("tp*cp*dp*pp is larger than 1048576 ranks");
  return layout;
}

std::optional<LayoutProblem> layout_problem(const Layout& l, const ModelDims& m) {
  const auto problem = [](std::string key, std::string why) {
    return std::optional<LayoutProblem>(LayoutProblem{std::move(key), std::move(why)});
  };
  if (l.dp % l.ep != 0)
    return problem("parallel.ep", "must divide parallel.dp = " + std::to_string(l.dp) +
                                      " (expert-parallel groups are carved out of the data-parallel ones)");
  // Context parallelism cuts each sequence into 2 x cp chunks (two per rank, for causal balance).
  if (l.cp > 1 && m.seq_len > 0 && m.seq_len % (2 * l.cp) != 0) {
    std::string fits;
    for (int cp = 2; cp <= 64 && cp <= m.seq_len / 2; cp *= 2)
      if (m.seq_len % (2 * cp) == 0) fits += (fits.empty() ? "" : ", ") + std::to_string(cp);
    return problem("parallel.cp", "must cut model.seq_len = " + std::to_string(m.seq_len) + " into 2 x " +
                                      std::to_string(l.cp) + " equal chunks" +
                                      (fits.empty() ? std::string() : " (cp = " + fits + " would)"));
  }
  if (l.ep != 1 && m.experts == 0)
    return problem("parallel.ep",
                   "expert parallelism needs a Mixture-of-Experts model (model.ffn = moe): "
                   "it must be 1 for a dense one");
  if (l.ep != 1 && m.experts % l.ep != 0)
    return problem("parallel.ep", "must divide model.experts = " + std::to_string(m.experts) +
                                      " (each expert-parallel rank holds whole experts)");
  if (m.heads % l.tp != 0)
    return problem("parallel.tp",
                   "must divide model.heads = " + std::to_string(m.heads) + " (each rank holds whole heads)");
  if (const int kv = m.kv_heads > 0 ? m.kv_heads : m.heads; kv % l.tp != 0 && l.tp % kv != 0)
    return problem("parallel.tp",
                   "must divide model.kv_heads = " + std::to_string(kv) +
                       " or be a multiple of it (each rank holds whole key/value heads, or one "
                       "shared with tp / kv_heads ranks)");
  if (m.vocab % l.tp != 0)
    return problem("parallel.tp", "must divide model.vocab = " + std::to_string(m.vocab) +
                                      " (vocabulary-parallel embedding; pad the vocabulary)");
  if (l.pp > m.layers)
    return problem("parallel.pp", std::to_string(l.pp) +
                                      " stages need at least one block each but "
                                      "model.layers is " +
                                      std::to_string(m.layers));
  return std::nullopt;
}

}  // namespace forge
