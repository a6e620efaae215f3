#include "report.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/store.h"
#include "forge/common/error.h"
#include "forge/common/html.h"
#include "forge/common/run_segment.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string_view>
#include <tuple>

namespace forge::launcher {

namespace fs = std::filesystem;

namespace {

struct Point {
  double step, loss, tps, mfu;
};

// The step-time split of the metrics records (compute, communication, bubble, data wait, checkpoint
// stall), in the order the charts stack it.
constexpr const char* kSplitKeys[] = {"compute_ms", "comm_ms", "bubble_ms", "data_wait_ms", "ckpt_stall_ms"};
constexpr const char* kSplitNames[] = {"compute", "communication", "bubble", "data wait", "checkpoint stall"};

// Reinforcement learning's figures (run.objective = grpo, ppo), a chart each: its series and the record
// field each reads ("rollout." for the rollout's figures, in the first record of each rollout).
struct RlChart {
  const char* title;
  std::vector<std::pair<const char*, const char*>> series;  // name, field
};
const std::vector<RlChart>& rl_charts() {
  static const std::vector<RlChart> charts = {
      {"rollouts: mean reward (and each scorer's, over the replies it applies to)",
       {{"reward", "rollout.reward"}}},
      {"rollouts: reply length (tokens)", {{"reply tokens", "rollout.reply_tokens"}}},
      {"rollouts: generation tokens/s", {{"generation", "rollout.generation_tokens_per_s"}}},
      {"policy update: KL to the reference, share of ratios (and values) the clip held",
       {{"KL", "kl"}, {"clip fraction", "clip_fraction"}, {"value clip fraction", "value_clip_fraction"}}},
      {"value head (ppo): clipped squared error to the returns", {{"value loss", "value_loss"}}}};
  return charts;
}

struct Marker {
  int64_t step = 0;
  std::string kind;  // "resume", "ckpt", "guard"
  std::string label;
  bool operator<(const Marker& o) const {
    return std::tie(step, kind, label) < std::tie(o.step, o.kind, o.label);
  }
};

double number(const Json& rec, const char* key) {
  const auto it = rec.find(key);
  return it != rec.end() && it->is_number() ? it->get<double>() : NAN;
}

std::string guard_label(const Json& e) {
  const std::string kind = e.value("kind", std::string("guard"));
  if (kind == "nonfinite") return "non-finite loss/gradient: " + e.value("action", std::string("?"));
  if (kind == "loss_spike") return fmt::format("loss spike (z = {:.1f})", number(e, "z"));
  if (kind == "rewind") return fmt::format("rewound to step {}", e.value("to_step", int64_t{0}));
  if (kind == "dead_expert")
    return fmt::format("dead expert {}/{}", e.value("layer", 0), e.value("expert", 0));
  if (kind == "expert_imbalance")
    return fmt::format("expert imbalance in block {} ({:.1f}x)", e.value("layer", 0),
                       number(e, "max_over_mean"));
  return kind;
}

// Records of one metrics file; markers of every file.
std::vector<Json> read_metrics(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(ExitCode::kIo, "cannot read {}", file.string());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Json> out;
  size_t at = 0;
  for (int line = 1; at < text.size(); ++line) {
    const size_t end = text.find('\n', at);
    const bool complete = end != std::string::npos;
    const std::string_view s(text.data() + at, (complete ? end : text.size()) - at);
    at = complete ? end + 1 : text.size();
    if (s.empty()) continue;
    Json rec = Json::parse(s, nullptr, /*allow_exceptions=*/false);
    if (!rec.is_object() || !rec.contains("step")) {
      // A killed run can leave half of its last line; everything before it is complete.
      if (!complete) break;
      fail(ExitCode::kData, "{}:{}: not a metrics record (a JSON object with \"step\"); the file is damaged",
           file.string(), line);
    }
    out.push_back(std::move(rec));
  }
  return out;
}

// About `n` round tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int n) {
  const double raw = (hi - lo) / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (const double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  std::vector<double> out;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push_back(v);
  return out;
}

// One plotted quantity: its name (the legend, and data-series for whoever checks the page) and points.
struct Series {
  std::string name;
  std::vector<std::pair<double, double>> pts;
};

// Colours of a chart's series in order (colour-blind safe, Okabe-Ito).
constexpr const char* kColors[] = {"#0072b2", "#e69f00", "#009e73", "#cc79a7", "#d55e00", "#56b4e9"};

// Title on the first line, the legend of a multi-series chart on the second, then the plot.
constexpr double kW = 760, kH = 280, kL = 70, kR = 16, kT = 44, kB = 36;

std::string svg_open(const std::string& title) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "role=\"img\" aria-label=\"{2}\">\n<text x=\"{3}\" y=\"18\" class=\"title\">{2}</text>\n",
      kW, kH, html_escape(title), kL);
}

constexpr const char* kNoData = "<text x=\"70\" y=\"140\">no data</text>\n</svg>\n";

// The plot's frame and its value grid, for y = Y(value) over [y_lo, y_hi].
template <typename ToY>
std::string svg_frame(double y_lo, double y_hi, const ToY& Y) {
  std::string out = fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>\n", kL,
                                kT, kW - kL - kR, kH - kT - kB);
  const std::vector<double> values = ticks(y_lo, y_hi, 5);
  // As many decimals as the tick step has, so that neighbouring labels differ (86.015 and 86.02 under a
  // fixed count of significant digits read 86.02 twice).
  const double step = values.size() > 1 ? values[1] - values[0] : 1.0;
  const int decimals = std::clamp(-static_cast<int>(std::floor(std::log10(step) + 1e-9)), 0, 9);
  for (const double v : values)
    out += fmt::format(
        "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" class=\"grid\"/><text x=\"{3}\" "
        "y=\"{4:.1f}\" class=\"ytick\">{5:.{6}f}</text>\n",
        kL, kW - kR, Y(v), kL - 6, Y(v) + 4, std::fabs(v) < step * 1e-6 ? 0.0 : v, decimals);
  return out;
}

// "x,y x,y ..." of a series; long runs keep every k-th point, which keeps the page small and the shape of a
// 100k-step curve.
template <typename ToX, typename ToY>
std::string svg_points(const std::vector<std::pair<double, double>>& pts, const ToX& X, const ToY& Y) {
  std::string out;
  const size_t stride = std::max<size_t>(1, pts.size() / 4000);
  for (size_t k = 0; k < pts.size(); k += stride)
    out += fmt::format("{:.1f},{:.1f} ", X(pts[k].first), Y(pts[k].second));
  return out;
}

// The legend of a multi-series chart, under the title.
std::string svg_legend(const std::vector<std::string>& names) {
  std::string out;
  double x = kL;
  for (size_t i = 0; i < names.size(); ++i) {
    out += fmt::format(
        "<rect x=\"{:.0f}\" y=\"26\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{:.0f}\" y=\"35\" "
        "class=\"legend\">{}</text>\n",
        x, kColors[i % std::size(kColors)], x + 14, html_escape(names[i]));
    x += 14 + 7.0 * double(names[i].size()) + 18;
  }
  return out;
}

// Lines against the step, or areas stacked in order (each series on top of the ones before it), with the
// run's markers; non-finite points are left out.
std::string svg_chart(const std::string& title, std::vector<Series> series,
                      const std::vector<Marker>& markers, double x_lo, double x_hi, bool stacked = false) {
  for (Series& sr : series) std::erase_if(sr.pts, [](const auto& p) { return !std::isfinite(p.second); });
  if (stacked)  // cumulative: series i is the sum of series 0..i at each step
    for (size_t i = 1; i < series.size(); ++i) {
      std::map<double, double> below(series[i - 1].pts.begin(), series[i - 1].pts.end());
      for (auto& p : series[i].pts) p.second += below.contains(p.first) ? below[p.first] : 0.0;
    }
  std::string svg = svg_open(title);
  std::vector<std::string> names;
  size_t n = 0;
  double y_lo = INFINITY, y_hi = -INFINITY;
  for (const Series& sr : series) {
    names.push_back(sr.name);
    n += sr.pts.size();
    for (const auto& p : sr.pts) y_lo = std::min(y_lo, p.second), y_hi = std::max(y_hi, p.second);
  }
  if (n == 0) return svg + kNoData;
  if (series.size() > 1) svg += svg_legend(names);
  if (stacked) y_lo = 0;
  const double pad = y_hi > y_lo ? 0.05 * (y_hi - y_lo) : std::max(0.5 * std::abs(y_hi), 1e-9);
  y_lo -= stacked ? 0 : pad, y_hi += pad;
  if (x_hi <= x_lo) x_hi = x_lo + 1;
  const auto X = [&](double x) { return kL + (x - x_lo) / (x_hi - x_lo) * (kW - kL - kR); };
  const auto Y = [&](double y) { return kT + (y_hi - y) / (y_hi - y_lo) * (kH - kT - kB); };
  svg += svg_frame(y_lo, y_hi, Y);
  for (const double v : ticks(x_lo, x_hi, 8))
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"xtick\">{:.0f}</text>\n", X(v), kH - kB + 16, v);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" class=\"xtick\">step</text>\n", kW - kR, kH - 4);
  for (const auto& m : markers)
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" class=\"m-{3}\"><title>step {4}: "
        "{5}</title></line>\n",
        X(double(m.step)), kT, kH - kB, m.kind, m.step, html_escape(m.label));
  for (size_t i = stacked ? series.size() : 0; i-- > 0;) {  // top area first, the ones below over it
    const auto& pts = series[i].pts;
    if (pts.empty()) continue;
    svg += fmt::format(
        "<polygon class=\"area\" data-series=\"{}\" fill=\"{}\" points=\"{}{:.1f},{:.1f} {:.1f},{:.1f}\"/>\n",
        html_escape(series[i].name), kColors[i % std::size(kColors)], svg_points(pts, X, Y),
        X(pts.back().first), Y(0), X(pts.front().first), Y(0));
  }
  if (!stacked)
    for (size_t i = 0; i < series.size(); ++i)
      svg += fmt::format("<polyline class=\"series\" data-series=\"{}\" stroke=\"{}\" points=\"{}\"/>\n",
                         html_escape(series[i].name),
                         series.size() > 1 ? kColors[i % std::size(kColors)] : "#222",
                         svg_points(series[i].pts, X, Y));
  return svg + "</svg>\n";
}

// One stacked bar per rank (the straggler view): each series' value per rank, flagged ranks outlined red.
std::string svg_rank_bars(const std::string& title, const std::vector<Series>& series,
                          const std::set<int>& flagged) {
  std::map<int, std::vector<double>> by_rank;
  for (size_t i = 0; i < series.size(); ++i)
    for (const auto& [rank, v] : series[i].pts) {
      auto& vals = by_rank[int(rank)];
      vals.resize(series.size(), 0.0);
      vals[i] = std::isfinite(v) ? v : 0.0;
    }
  std::string svg = svg_open(title);
  if (by_rank.empty()) return svg + kNoData;
  std::vector<std::string> names;
  for (const Series& sr : series) names.push_back(sr.name);
  svg += svg_legend(names);
  double y_hi = 0;
  for (const auto& [rank, vals] : by_rank) {
    double total = 0;
    for (double v : vals) total += v;
    y_hi = std::max(y_hi, total);
  }
  y_hi = y_hi > 0 ? 1.05 * y_hi : 1;
  const auto Y = [&](double y) { return kT + (y_hi - y) / y_hi * (kH - kT - kB); };
  svg += svg_frame(0, y_hi, Y);
  const double slot = (kW - kL - kR) / double(by_rank.size());
  const double bar = std::max(1.0, 0.8 * slot);
  const size_t label_every = std::max<size_t>(1, by_rank.size() / 16);
  size_t k = 0;
  for (const auto& [rank, vals] : by_rank) {
    const double x = kL + slot * (double(k) + 0.1);
    double base = 0;
    svg += fmt::format("<g class=\"rank\" data-rank=\"{}\">", rank);
    std::string tip = fmt::format("rank {}", rank);
    for (size_t i = 0; i < vals.size(); ++i) {
      svg += fmt::format(
          "<rect data-series=\"{}\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
          "fill=\"{}\"/>",
          html_escape(series[i].name), x, Y(base + vals[i]), bar, Y(base) - Y(base + vals[i]),
          kColors[i % std::size(kColors)]);
      base += vals[i];
      tip += fmt::format(", {} {:.3g}", series[i].name, vals[i]);
    }
    if (flagged.contains(rank))
      svg += fmt::format(
          "<rect class=\"straggler\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\"/>", x,
          Y(base), bar, Y(0) - Y(base));
    svg += fmt::format("<title>{}{}</title></g>\n", tip, flagged.contains(rank) ? " (straggler)" : "");
    if (k % label_every == 0)
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"xtick\">{}</text>\n", x + bar / 2, kH - kB + 16,
                         rank);
    ++k;
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" class=\"xtick\">rank</text>\n", kW - kR, kH - 4);
  return svg + "</svg>\n";
}

constexpr const char* kStyle = R"(body{font-family:sans-serif;margin:2em;color:#222}
table{border-collapse:collapse}td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}
svg{display:block;margin:1em 0}.title{font-weight:bold;font-size:14px}
.frame{fill:none;stroke:#888}.grid{stroke:#eee}.ytick{font-size:11px;text-anchor:end}
.xtick{font-size:11px;text-anchor:middle}.series{fill:none;stroke-width:1.2}.legend{font-size:11px}
.area{stroke:none;opacity:.9}.straggler{fill:none;stroke:#d62728;stroke-width:2}
.m-resume{stroke:#1f77b4;stroke-width:2;stroke-dasharray:6 3}.m-ckpt{stroke:#9a9;stroke-dasharray:2 3}
.m-guard{stroke:#d62728;stroke-width:1.5}.key span{margin-right:2em}
)";

std::string format_bytes(uint64_t b) {
  return b >= (1u << 30) ? fmt::format("{:.1f} GiB", double(b) / double(1u << 30))
                         : fmt::format("{:.1f} MiB", double(b) / double(1u << 20));
}

}  // namespace

RunReport write_report(const std::string& run_dir) {
  const fs::path root(run_dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    fail(ExitCode::kUsage, "report: {} is not a directory (give the run.dir of a forge-train run)", run_dir);
  std::map<int, fs::path> files;  // by rank
  for (const auto& entry : fs::directory_iterator(root / "metrics", ec)) {
    const std::string name = entry.path().filename().string();
    int rank = -1;
    if (name.rfind("rank-", 0) == 0 && name.size() > 11 && name.ends_with(".jsonl") &&
        std::sscanf(name.c_str(), "rank-%d.jsonl", &rank) == 1 && rank >= 0)
      files[rank] = entry.path();
  }
  if (files.empty())
    fail(ExitCode::kUsage, "report: {} has no metrics/rank-*.jsonl: not a forge-train run directory",
         run_dir);

  RunReport r;
  r.run_dir = run_dir;
  r.html_path = (root / "report.html").string();
  if (fs::exists(root / "summary.json")) r.summary = read_json((root / "summary.json").string());

  std::vector<Point> points;
  std::set<Marker> markers;
  std::vector<Series> split(std::size(kSplitKeys)), per_rank(std::size(kSplitKeys));
  for (size_t i = 0; i < split.size(); ++i) split[i].name = per_rank[i].name = kSplitNames[i];
  std::map<double, double> peak_rss;  // step -> the largest rank's peak resident memory
  // MoE blocks: per block, each expert's share of the block's assignments (or, past 8 experts, the
  // smallest and the largest share), and the share capacity dropped.
  std::map<int, std::vector<Series>> expert_load;
  std::map<int, size_t> experts;
  std::map<int, Series> dropped;
  std::set<int> stragglers;
  std::vector<Json> saves;
  std::vector<std::vector<Series>> rl;  // per chart of rl_charts(), its series
  for (const RlChart& chart : rl_charts()) {
    rl.emplace_back();
    for (const auto& [name, field] : chart.series) rl.back().push_back({name, {}});
  }
  std::map<std::string, Series> reward_parts;
  for (const auto& [rank, file] : files) {
    const auto records = read_metrics(file);
    const bool plotted = rank == files.begin()->first;
    std::vector<double> sums(std::size(kSplitKeys), 0.0);
    for (const auto& rec : records) {
      const int64_t step = rec["step"].is_number() ? rec["step"].get<int64_t>() : 0;
      for (size_t i = 0; i < sums.size(); ++i) {
        const double v = number(rec, kSplitKeys[i]);
        if (plotted) split[i].pts.emplace_back(double(step), v);
        if (std::isfinite(v)) sums[i] += v / double(records.size());
      }
      if (const double rss = number(rec, "peak_rss_mib"); std::isfinite(rss))
        peak_rss[double(step)] = std::max(peak_rss[double(step)], rss);
      if (plotted) {
        points.push_back(
            {double(step), number(rec, "loss"), number(rec, "tokens_per_s"), number(rec, "mfu")});
        ++r.records;
        for (const auto& e : rec.value("ckpt_events", Json::array())) saves.push_back(e);
        const Json rollout = rec.value("rollout", Json::object());
        for (size_t c = 0; c < rl.size(); ++c)
          for (size_t i = 0; i < rl[c].size(); ++i) {
            constexpr std::string_view kNested = "rollout.";
            const char* field = rl_charts()[c].series[i].second;
            const bool nested = std::string_view(field).starts_with(kNested);
            const double v = number(nested ? rollout : rec, field + (nested ? kNested.size() : 0));
            if (std::isfinite(v)) rl[c][i].pts.emplace_back(double(step), v);
          }
        const Json parts = rollout.value("reward_parts", Json::object());
        for (const auto& [part, v] : parts.items())
          if (v.is_number()) {
            reward_parts[part].name = "reward: " + part;
            reward_parts[part].pts.emplace_back(double(step), v.get<double>());
          }
        for (const auto& m : rec.value("moe", Json::array())) {
          const auto tokens = m.value("tokens", std::vector<double>{});
          double sum = 0;
          for (double t : tokens) sum += t;
          if (tokens.empty() || !(sum > 0)) continue;
          auto& load = expert_load[m.value("layer", 0)];
          experts[m.value("layer", 0)] = tokens.size();
          const bool each = tokens.size() <= 8;
          if (load.empty()) {
            if (each)
              for (size_t e = 0; e < tokens.size(); ++e) load.push_back({fmt::format("expert {}", e), {}});
            else
              load = {{"least loaded expert", {}}, {"most loaded expert", {}}};
          }
          if (each && load.size() == tokens.size())
            for (size_t e = 0; e < tokens.size(); ++e)
              load[e].pts.emplace_back(double(step), tokens[e] / sum);
          if (!each) {
            const auto [lo, hi] = std::minmax_element(tokens.begin(), tokens.end());
            load[0].pts.emplace_back(double(step), *lo / sum);
            load[1].pts.emplace_back(double(step), *hi / sum);
          }
          Series& d = dropped[m.value("layer", 0)];
          d.name = fmt::format("block {}", m.value("layer", 0));
          d.pts.emplace_back(double(step), number(m, "dropped_fraction"));
        }
      }
      for (const auto& k : rec.value("stragglers", Json::array()))
        if (k.is_number_integer()) stragglers.insert(k.get<int>());
      if (rec.contains("resumed_from"))
        markers.insert({rec.value("resumed_from", int64_t{0}), "resume",
                        fmt::format("resumed from step {}", rec.value("resumed_from", int64_t{0}))});
      for (const auto& e : rec.value("ckpt_events", Json::array()))
        markers.insert({e.value("step", step), "ckpt",
                        fmt::format("{} checkpoint {}", e.value("tier", std::string("?")),
                                    e.value("outcome", std::string("?")))});
      for (const auto& e : rec.value("guard_events", Json::array()))
        markers.insert(
            {e.value("kind", std::string()) == "rewind" ? e.value("to_step", step) : e.value("step", step),
             "guard", fmt::format("rank {}: {}", rank, guard_label(e))});
      if (rec.contains("stragglers") && !rec["stragglers"].empty())
        markers.insert({step, "guard", "stragglers: ranks " + rec["stragglers"].dump()});
    }
    for (size_t i = 0; i < sums.size(); ++i) per_rank[i].pts.emplace_back(double(rank), sums[i]);
  }
  for (const auto& m : markers) {
    r.resumes += m.kind == "resume";
    r.guard_events += m.kind == "guard";
    r.ckpt_saves += m.kind == "ckpt";
  }
  if (!points.empty()) r.first_step = int64_t(points.front().step), r.last_step = int64_t(points.back().step);
  for (const auto& c : ckpt::list_checkpoints(run_dir)) {
    std::string line = fmt::format("{} step {}", ckpt::tier_name(c.tier), c.step);
    try {
      const auto cp = ckpt::Checkpoint::open(c.path);
      line += fmt::format(": loss {:.4f}, {}", cp.manifest().meta.loss, format_bytes(cp.bytes()));
    } catch (const Error& e) {
      line += fmt::format(": unreadable ({})", e.what());
    }
    r.checkpoints.push_back(line);
  }

  const std::vector<Marker> mark(markers.begin(), markers.end());
  const double x_lo = points.empty() ? 0 : std::min(0.0, points.front().step - 1);
  const double x_hi = points.empty() ? 1 : points.back().step;
  const auto series = [&](const char* title, double Point::*field) {
    Series out{title, {}};
    for (const auto& p : points) out.pts.emplace_back(p.step, p.*field);
    return std::vector<Series>{out};
  };
  const Json& s = r.summary;
  if (s.is_object() && s.contains("segments") && s["segments"].is_array() && !s["segments"].empty()) {
    double kept = 0, wall = 0;
    try {
      for (const Json& g : s["segments"]) {
        const RunSegment seg = RunSegment::from_json(g);
        kept += seg.kept_train_s;
        wall += seg.end - seg.start;
        r.lost_s += seg.wasted_s();
      }
      if (wall > 0) r.ettr = kept / wall;
    } catch (const Json::exception&) {
      r.lost_s = 0;  // segments of another shape (an older release): no ETTR
    }
  }
  const std::string name =
      s.is_object() ? s.value("name", root.filename().string()) : root.filename().string();
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>forge-train report: {0}"
      "</title>\n<style>{1}</style>\n</head>\n<body>\n<h1>forge-train run {0}</h1>\n<table "
      "class=\"summary\">\n",
      html_escape(name), kStyle);
  const auto row = [&](std::string_view k, const std::string& v) {
    html += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", k, html_escape(v));
  };
  row("run directory", run_dir);
  if (s.is_object()) {
    row("exit", fmt::format("{} ({})", s.value("exit_class", std::string("?")), s.value("exit_code", -1)));
    row("steps", fmt::format("{}", s.value("steps", int64_t{0})));
    row("tokens", fmt::format("{}", s.value("tokens", int64_t{0})));
    row("wall time", fmt::format("{:.1f} s", number(s, "wall_s")));
    row("final loss", fmt::format("{:.4f}", number(s, "final_loss")));
    if (s.contains("model")) row("model", s.value("model", std::string()));
    if (const Json p = s.value("parameters", Json()); p.is_object() && number(p, "total") > 0)
      row("parameters", number(p, "active") < number(p, "total")
                            ? fmt::format("{:.2f} M, {:.2f} M active per token", number(p, "total") / 1e6,
                                          number(p, "active") / 1e6)
                            : fmt::format("{:.2f} M", number(p, "total") / 1e6));
    row("mean MFU", fmt::format("{:.2f}%", 100 * number(s, "mean_mfu")));
    if (r.ettr >= 0)
      row("effective training time (ETTR)",
          fmt::format("{:.1f}%; lost {:.1f} s after checkpoints and in restarts", 100 * r.ettr, r.lost_s));
    row("spec hash", s.value("spec_hash", std::string("?")));
  } else {
    row("summary", "no summary.json: the run is still going, or was killed before it could write one");
  }
  row("metrics records", fmt::format("{} (steps {}..{})", r.records, r.first_step, r.last_step));
  row("resumes / checkpoint saves / guard events",
      fmt::format("{} / {} / {}", r.resumes, r.ckpt_saves, r.guard_events));
  html +=
      "</table>\n<p class=\"key\"><span style=\"color:#1f77b4\">- - resume</span><span style=\"color:#9a9\">"
      "&#183;&#183; checkpoint save</span><span style=\"color:#d62728\">| guard event</span></p>\n";
  html += svg_chart("training loss", series("loss", &Point::loss), mark, x_lo, x_hi);
  html += svg_chart("throughput (tokens/s)", series("tokens/s", &Point::tps), mark, x_lo, x_hi);
  html += svg_chart("model FLOPs utilisation", series("MFU", &Point::mfu), mark, x_lo, x_hi);
  html +=
      svg_chart(fmt::format("step time split, rank {} (ms)", files.begin()->first), split, mark, x_lo, x_hi,
                /*stacked=*/true);
  html += svg_rank_bars("mean step time by rank (ms): a straggler computes longer, the others wait", per_rank,
                        stragglers);
  html += svg_chart("peak resident memory, largest rank (MiB)",
                    {Series{"peak RSS", {peak_rss.begin(), peak_rss.end()}}}, mark, x_lo, x_hi);
  for (auto& [layer, load] : expert_load)
    html += svg_chart(fmt::format("expert load, MoE block {}: share of its assignments (even: 1/{})", layer,
                                  experts[layer]),
                      std::move(load), mark, x_lo, x_hi);
  if (!dropped.empty()) {
    std::vector<Series> d;
    for (auto& [layer, series] : dropped) d.push_back(std::move(series));
    html += svg_chart("MoE: share of assignments dropped at capacity", std::move(d), mark, x_lo, x_hi);
  }
  for (auto& [part, series] : reward_parts) rl[0].push_back(std::move(series));
  for (size_t c = 0; c < rl.size(); ++c) {
    std::erase_if(rl[c], [](const Series& sr) { return sr.pts.empty(); });
    if (!rl[c].empty()) html += svg_chart(rl_charts()[c].title, std::move(rl[c]), mark, x_lo, x_hi);
  }
  if (s.is_object() && s.contains("segments") && s["segments"].is_array()) {
    html +=
        "<h2>Segments</h2>\n<p>One per process of the run: a requeue or resume starts the next, on the "
        "same layout or another.</p>\n<table>\n<tr><th>#</th><th>job</th><th>layout</th><th>ranks</th>"
        "<th>steps</th><th>start-up s</th><th>train s</th><th>lost s</th><th>exit</th></tr>\n";
    int k = 0;
    for (const Json& g : s["segments"]) {
      const Json job = g.value("job_id", Json());
      html += fmt::format(
          "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}-{}</td><td>{:.1f}</td><td>{:.1f}</td>"
          "<td>{:.1f}</td><td>{}</td></tr>\n",
          ++k, html_escape(job.is_string() ? job.get<std::string>() : "-"),
          html_escape(g.value("layout", std::string("?"))), g.value("ranks", 0),
          g.value("resumed_from", int64_t{0}) + 1, g.value("last_step", int64_t{0}), number(g, "startup_s"),
          number(g, "train_s"), number(g, "lost_s"), html_escape(g.value("exit_class", std::string("?"))));
    }
    html += "</table>\n";
  }
  html +=
      "<h2>Checkpoint saves while "
      "training</h2>\n<table>\n<tr><th>step</th><th>tier</th><th>outcome</th><th>size</th>"
      "<th>stall s</th><th>copy s</th><th>write s</th></tr>\n";
  for (const Json& e : saves)
    html += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3f}</td><td>{:.3f}</td>"
        "<td>{:.3f}</td></tr>\n",
        e.value("step", int64_t{0}), html_escape(e.value("tier", std::string("?"))),
        html_escape(e.value("outcome", std::string("?"))), format_bytes(e.value("bytes", uint64_t{0})),
        number(e, "stall_s"), number(e, "copy_s"), number(e, "write_s"));
  if (saves.empty()) html += "<tr><td colspan=\"7\">none</td></tr>\n";
  html += "</table>\n<h2>Checkpoints</h2>\n<ul>\n";
  for (const auto& c : r.checkpoints) html += "<li>" + html_escape(c) + "</li>\n";
  if (r.checkpoints.empty()) html += "<li>none</li>\n";
  html += "</ul>\n<h2>Events</h2>\n<table>\n<tr><th>step</th><th>kind</th><th>what</th></tr>\n";
  for (const auto& m : mark)
    if (m.kind != "ckpt")
      html +=
          fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>\n", m.step, m.kind, html_escape(m.label));
  html += "</table>\n</body>\n</html>\n";
  write_file_atomic(r.html_path, html);
  return r;
}

void print_report(const RunReport& r) {
  const Json& s = r.summary;
  if (s.is_object()) {
    fmt::print("run {} (spec {}): exit {} ({})\n", s.value("name", std::string("?")),
               s.value("spec_hash", std::string("?")), s.value("exit_class", std::string("?")),
               s.value("exit_code", -1));
    fmt::print("steps {}, tokens {}, wall {:.1f} s, final loss {:.4f}, mean MFU {:.2f}%\n",
               s.value("steps", int64_t{0}), s.value("tokens", int64_t{0}), number(s, "wall_s"),
               number(s, "final_loss"), 100 * number(s, "mean_mfu"));
    if (s.contains("model")) fmt::print("model {}\n", s.value("model", std::string()));
    if (r.ettr >= 0)
      fmt::print("effective training time {:.1f}% (ETTR), lost {:.1f} s after checkpoints and in restarts\n",
                 100 * r.ettr, r.lost_s);
  } else {
    fmt::print("run {}: no summary.json (still going, or killed before it could write one)\n", r.run_dir);
  }
  fmt::print("metrics: {} records (steps {}..{}), {} resumes, {} checkpoint saves, {} guard events\n",
             r.records, r.first_step, r.last_step, r.resumes, r.ckpt_saves, r.guard_events);
  fmt::print("checkpoints:{}\n", r.checkpoints.empty() ? " none" : "");
  for (const auto& c : r.checkpoints) fmt::print("  {}\n", c);
  fmt::print("report: {}\n", r.html_path);
}

}  // namespace forge::launcher
