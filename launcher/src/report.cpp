#include "report.h"

#include "forge/ckpt/checkpoint.h"
#include "forge/ckpt/store.h"
#include "forge/common/error.h"
#include "forge/common/html.h"

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

std::string svg_plot(const std::string& title, const std::vector<std::pair<double, double>>& all,
                     const std::vector<Marker>& markers, double x_lo, double x_hi) {
  constexpr double W = 760, H = 260, L = 70, R = 16, T = 28, B = 36;
  std::vector<std::pair<double, double>> pts;
  for (const auto& p : all)
    if (std::isfinite(p.second)) pts.push_back(p);
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "role=\"img\" aria-label=\"{2}\">\n<text x=\"{3}\" y=\"18\" class=\"title\">{2}</text>\n",
      W, H, html_escape(title), L);
  if (pts.empty()) return svg + fmt::format("<text x=\"{}\" y=\"{}\">no data</text>\n</svg>\n", L, H / 2);
  double y_lo = pts[0].second, y_hi = pts[0].second;
  for (const auto& p : pts) y_lo = std::min(y_lo, p.second), y_hi = std::max(y_hi, p.second);
  const double pad = y_hi > y_lo ? 0.05 * (y_hi - y_lo) : std::max(0.5 * std::abs(y_hi), 1e-9);
  y_lo -= pad, y_hi += pad;
  if (x_hi <= x_lo) x_hi = x_lo + 1;
  const auto X = [&](double x) { return L + (x - x_lo) / (x_hi - x_lo) * (W - L - R); };
  const auto Y = [&](double y) { return T + (y_hi - y) / (y_hi - y_lo) * (H - T - B); };
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"frame\"/>\n", L, T,
                     W - L - R, H - T - B);
  for (const double v : ticks(y_lo, y_hi, 5))
    svg += fmt::format(
        "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" class=\"grid\"/><text x=\"{3}\" "
        "y=\"{4:.1f}\" "
        "class=\"ytick\">{5:.4g}</text>\n",
        L, W - R, Y(v), L - 6, Y(v) + 4, v);
  for (const double v : ticks(x_lo, x_hi, 8))
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"xtick\">{:.0f}</text>\n", X(v), H - B + 16, v);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" class=\"xtick\">step</text>\n", W - R, H - 4);
  for (const auto& m : markers)
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" class=\"m-{3}\"><title>step {4}: "
        "{5}</title>"
        "</line>\n",
        X(double(m.step)), T, H - B, m.kind, m.step, html_escape(m.label));
  // Long runs: every k-th point keeps the page small; the shape of a 100k-step curve survives it.
  const size_t stride = std::max<size_t>(1, pts.size() / 4000);
  svg += "<polyline class=\"series\" points=\"";
  for (size_t i = 0; i < pts.size(); i += stride)
    svg += fmt::format("{:.1f},{:.1f} ", X(pts[i].first), Y(pts[i].second));
  svg += "\"/>\n</svg>\n";
  return svg;
}

constexpr const char* kStyle = R"(body{font-family:sans-serif;margin:2em;color:#222}
table{border-collapse:collapse}td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}
svg{display:block;margin:1em 0}.title{font-weight:bold;font-size:14px}
.frame{fill:none;stroke:#888}.grid{stroke:#eee}.ytick{font-size:11px;text-anchor:end}
.xtick{font-size:11px;text-anchor:middle}.series{fill:none;stroke:#222;stroke-width:1.2}
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
  for (const auto& [rank, file] : files) {
    const auto records = read_metrics(file);
    const bool plotted = rank == files.begin()->first;
    for (const auto& rec : records) {
      const int64_t step = rec["step"].is_number() ? rec["step"].get<int64_t>() : 0;
      if (plotted) {
        points.push_back(
            {double(step), number(rec, "loss"), number(rec, "tokens_per_s"), number(rec, "mfu")});
        ++r.records;
      }
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
  const auto series = [&](double Point::*field) {
    std::vector<std::pair<double, double>> s;
    for (const auto& p : points) s.emplace_back(p.step, p.*field);
    return s;
  };
  const Json& s = r.summary;
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
    row("mean MFU", fmt::format("{:.2f}%", 100 * number(s, "mean_mfu")));
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
  html += svg_plot("training loss", series(&Point::loss), mark, x_lo, x_hi);
  html += svg_plot("throughput (tokens/s)", series(&Point::tps), mark, x_lo, x_hi);
  html += svg_plot("model FLOPs utilisation", series(&Point::mfu), mark, x_lo, x_hi);
  html += "<h2>Checkpoints</h2>\n<ul>\n";
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
