// The HTML report: one self-contained page (no scripts, no external files) with the table and inline
// SVG bar charts, so it can be mailed or dropped on any web server.
#include "forge/quota/report.h"

#include "forge/common/html.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

namespace forge::quota {
namespace {

// Horizontal bars, one per row (data-series names what a bar shows, data-key its row); `wasted` (optional)
// is drawn over the start of each bar in red. Rows without the value (an optional one unset) get no bar.
template <typename Value>
std::string bar_chart(const std::string& title, const std::vector<ReportRow>& rows, Value ReportRow::*value,
                      double ReportRow::*wasted, const std::string& unit, int digits = -1) {
  const auto get = [&](const ReportRow& r) -> std::optional<double> { return r.*value; };
  const int label_w = 160, bar_w = 420, row_h = 22, top = 28;
  const int height = top + row_h * static_cast<int>(rows.size()) + 10;
  double max = 0;
  for (const auto& r : rows) max = std::max(max, get(r).value_or(0.0));
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" role=\"img\" aria-label=\"{}\">\n"
      "<text x=\"0\" y=\"18\" font-weight=\"bold\">{}</text>\n",
      label_w + bar_w + 120, height, html_escape(title), html_escape(title));
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const int y = top + static_cast<int>(i) * row_h;
    const std::string key = html_escape(r.key);
    svg += fmt::format("<text x=\"0\" y=\"{}\">{}</text>\n", y + 15, html_escape(r.key.substr(0, 24)));
    const std::optional<double> v = get(r);
    if (!v) {
      svg += fmt::format("<text x=\"{}\" y=\"{}\">&ndash;</text>\n", label_w, y + 15);
      continue;
    }
    const double w = max > 0 ? *v / max * bar_w : 0;
    svg += fmt::format(
        "<rect data-series=\"{}\" data-key=\"{}\" x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"16\" "
        "fill=\"#4878a8\"/>\n",
        html_escape(title), key, label_w, y + 2, w);
    if (wasted && max > 0 && r.*wasted > 0)
      svg += fmt::format(
          "<rect data-series=\"wasted\" data-key=\"{}\" x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"16\" "
          "fill=\"#c0392b\"/>\n",
          key, label_w, y + 2, r.*wasted / max * bar_w);
    // digits < 0: three significant digits (format_amount), so that small jobs do not all read 0.0.
    const std::string amount = digits < 0 ? format_amount(*v) : fmt::format("{:.{}f}", *v, digits);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\">{} {}</text>\n", label_w + w + 6, y + 15, amount,
                       html_escape(unit));
  }
  return svg + "</svg>\n";
}

std::string opt(const std::optional<double>& v, int digits) {
  return v ? fmt::format("{:.{}f}", *v, digits) : "&ndash;";
}

}  // namespace

std::string render_report_html(const Report& r) {
  const std::string title =
      fmt::format("GPU usage by {}, {} to {} (UTC)", group_name(r.by), format_utc(r.from), format_utc(r.to));
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\n"
      "<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}"
      "td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}td:first-child,th:first-child"
      "{{text-align:left}}svg text{{font-size:12px}}</style></head><body>\n<h1>{}</h1>\n",
      html_escape(title), html_escape(title));
  out += bar_chart("GPU-hours (red: lost to failed and preempted runs)", r.rows, &ReportRow::gpu_hours,
                   &ReportRow::wasted_gpu_hours, "GPU-h");
  out += bar_chart("Cost", r.rows, &ReportRow::cost, nullptr, "");
  out += bar_chart("Effective training time ratio (ETTR)", r.rows, &ReportRow::ettr, nullptr, "", 3);
  out += fmt::format(
      "<table>\n<tr><th>{}</th><th>GPU-hours</th><th>cost</th><th>jobs</th><th>wasted GPU-hours</th>"
      "<th>tokens</th><th>cost per M tokens</th><th>MFU</th><th>ETTR</th></tr>\n",
      group_name(r.by));
  const auto row = [&](const ReportRow& x, bool total) {
    const char* tag = total ? "th" : "td";
    return fmt::format(
        "<tr><{0}>{1}</{0}><{0}>{2}</{0}><{0}>{3}</{0}><{0}>{4}</{0}><{0}>{5}</{0}>"
        "<{0}>{6:.0f}</{0}><{0}>{7}</{0}><{0}>{8}</{0}><{0}>{9}</{0}></tr>\n",
        tag, html_escape(x.key), format_amount(x.gpu_hours), format_amount(x.cost), x.jobs,
        format_amount(x.wasted_gpu_hours), x.tokens, opt(x.cost_per_mtoken, 4), opt(x.mfu, 3),
        opt(x.ettr, 3));
  };
  for (const auto& x : r.rows) out += row(x, false);
  out += row(r.total, true);
  out +=
      "</table>\n<p>GPU-hours are clipped to the window (sreport's convention); cost is GPU-hours x price x "
      "the tier's charge. Wasted: the work after a run's newest committed checkpoint when it did not finish, "
      "plus the start-up of a resumed run; ETTR: step time that a checkpoint or the finished run keeps, over "
      "GPU-hours (runs that recorded it).</p>\n</body></html>\n";
  return out;
}

}  // namespace forge::quota
