// SVG rendering of training curves: layout (title, legend, stacked panels on
// one x range), nice ticks, and the series with their data coordinates.
#include "lib/plot/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/core/error.h"

namespace ds::plot {
namespace {

struct MetricInfo {
  const char* name;
  const char* title;
  std::vector<const char*> curves;  // the first is drawn solid, the second (validation) dashed
  int height;
};

const std::vector<MetricInfo>& metric_table() {
  static const std::vector<MetricInfo> kMetrics = {
      {"loss", "lm loss", {"train_loss", "valid_loss"}, 300},
      {"lr", "learning rate", {"lr"}, 150},
      {"grad_norm", "grad norm", {"grad_norm"}, 150},
      {"loss_scale", "loss scale", {"loss_scale"}, 150},
      {"tokens_per_s", "tokens/s", {"tokens_per_s"}, 150},
      // DeepSpeed-Chat's step 3 (dschat ppo): the average reward, the actor's (solid) and critic's (dashed) losses
      {"reward", "reward", {"reward"}, 200},
      {"ppo_loss", "actor / critic loss", {"actor_loss", "critic_loss"}, 200},
  };
  return kMetrics;
}

const MetricInfo& metric_info(const std::string& m) {
  for (const MetricInfo& i : metric_table())
    if (m == i.name) return i;
  DS_USER_ERROR("--metrics: unknown metric '{}' (known: {})", m, metric_list());
}

// Distinct colours for up to eight runs, then repeated.
const char* color(size_t i) {
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                  "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  return kColors[i % 8];
}

constexpr int kLeft = 84, kRight = 24, kPanelGap = 40, kFont = 12;
constexpr double kCharWidth = 7.0;  // DejaVu Sans at 12 px, about

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return !(hi >= lo); }
};

std::string num(double v) { return fmt::format("{}", v); }  // shortest text that reads back as v

// Where v lies in [lo, hi], as a fraction (0 at lo, 1 at hi). Halves first,
// so that a range as wide as +-1e308 does not overflow to inf and nan.
double fraction(double v, double lo, double hi) {
  const double span = hi * 0.5 - lo * 0.5;
  if (!(span > 0) || !std::isfinite(span)) return 0.5;
  const double t = (v * 0.5 - lo * 0.5) / span;
  return std::isfinite(t) ? std::clamp(t, -1.0, 2.0) : 0.5;
}

struct Box {
  double left, top, width, height;
  Axis x, y;
  double px(double v) const { return left + fraction(v, x.lo, x.hi) * width; }
  double py(double v) const { return top + height - fraction(v, y.lo, y.hi) * height; }
};

// The points of a series to draw: all of them while there are at most two per
// pixel column, else the lowest and highest of each column, in x order (the
// envelope a line at this width shows anyway).
std::vector<size_t> points_to_draw(const Curve& c, const Box& b) {
  std::vector<size_t> keep;
  const auto columns = static_cast<size_t>(std::max(1.0, b.width));
  if (c.x.size() <= 2 * columns) {
    for (size_t i = 0; i < c.x.size(); ++i) keep.push_back(i);
    return keep;
  }
  size_t i = 0;
  while (i < c.x.size()) {
    const double column = std::floor(b.px(c.x[i]));
    size_t lo = i, hi = i, j = i;
    for (; j < c.x.size() && std::floor(b.px(c.x[j])) == column; ++j) {
      if (c.y[j] < c.y[lo]) lo = j;
      if (c.y[j] > c.y[hi]) hi = j;
    }
    keep.push_back(std::min(lo, hi));
    if (hi != lo) keep.push_back(std::max(lo, hi));
    i = j;
  }
  return keep;
}

void draw_axes(std::string& svg, const Box& b, const MetricInfo& m) {
  for (double t : b.y.ticks) {
    const double y = b.py(t);
    svg += fmt::format(R"(<line class="grid" x1="{:.2f}" y1="{:.2f}" x2="{:.2f}" y2="{:.2f}"/>)"
                       R"(<text class="tick" x="{:.2f}" y="{:.2f}" text-anchor="end">{}</text>)" "\n",
                       b.left, y, b.left + b.width, y, b.left - 6, y + 4, tick_label(t, b.y.step));
  }
  for (double t : b.x.ticks) {
    const double x = b.px(t);
    svg += fmt::format(R"(<line class="grid" x1="{:.2f}" y1="{:.2f}" x2="{:.2f}" y2="{:.2f}"/>)"
                       R"(<text class="tick" x="{:.2f}" y="{:.2f}" text-anchor="middle">{}</text>)" "\n",
                       x, b.top, x, b.top + b.height, x, b.top + b.height + 16, tick_label(t, b.x.step));
  }
  svg += fmt::format(R"(<rect class="frame" x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}"/>)" "\n", b.left,
                     b.top, b.width, b.height);
  const double cy = b.top + b.height / 2;
  svg += fmt::format(R"svg(<text class="label" x="18" y="{:.2f}" text-anchor="middle" transform="rotate(-90 18 {:.2f})">{}</text>)svg"
                     "\n", cy, cy, m.title);
}

void draw_series(std::string& svg, const Box& b, const Run& run, const char* key, size_t run_index, bool dashed) {
  auto it = run.curves.find(key);
  if (it == run.curves.end() || it->second.x.empty()) return;
  const Curve& c = it->second;
  const std::vector<size_t> keep = points_to_draw(c, b);
  std::string points, xs, ys;
  for (size_t k = 0; k < keep.size(); ++k) {
    const size_t i = keep[k];
    points += fmt::format("{}{:.2f},{:.2f}", k ? " " : "", b.px(c.x[i]), b.py(c.y[i]));
    if (k) {
      xs += ' ';
      ys += ' ';
    }
    xs += num(c.x[i]);
    ys += num(c.y[i]);
  }
  svg += fmt::format(R"(<polyline class="series" data-run="{}" data-curve="{}" stroke="{}"{} points="{}" )"
                     R"(data-x="{}" data-y="{}"/>)" "\n",
                     xml_escape(run.label), key, color(run_index), dashed ? R"( stroke-dasharray="6 4")" : "", points,
                     xs, ys);
  if (dashed || c.x.size() == 1) {  // validation points (and lone points) get markers
    svg += fmt::format(R"(<g class="markers" fill="{}">)", color(run_index));
    for (size_t k = 0; k < keep.size() && k < 400; ++k)
      svg += fmt::format(R"(<circle cx="{:.2f}" cy="{:.2f}" r="2.8"/>)", b.px(c.x[keep[k]]), b.py(c.y[keep[k]]));
    svg += "</g>\n";
  }
}

// The legend rows: one entry per run, then the line styles; returns its bottom.
double draw_legend(std::string& svg, const std::vector<Run>& runs, bool styles, double top, int width) {
  std::vector<std::pair<std::string, std::string>> items;  // (text, svg of the sample line at 0,0)
  for (size_t i = 0; i < runs.size(); ++i)
    items.emplace_back(runs[i].label, fmt::format(R"(<line x1="0" y1="0" x2="24" y2="0" stroke="{}" stroke-width="2.5"/>)",
                                                  color(i)));
  if (styles) {
    items.emplace_back("training", R"(<line x1="0" y1="0" x2="24" y2="0" stroke="#555" stroke-width="1.6"/>)");
    items.emplace_back("validation", R"(<line x1="0" y1="0" x2="24" y2="0" stroke="#555" stroke-width="1.6" )"
                                     R"(stroke-dasharray="6 4"/><circle cx="12" cy="0" r="2.8" fill="#555"/>)");
  }
  svg += R"(<g class="legend">)" "\n";
  double x = kLeft, y = top + 8;
  for (const auto& [text, sample] : items) {
    const double w = 32 + kCharWidth * static_cast<double>(text.size()) + 18;
    if (x + w > width - kRight && x > kLeft) {
      x = kLeft;
      y += 18;
    }
    svg += fmt::format(R"svg(<g transform="translate({:.1f} {:.1f})">{}<text x="30" y="4">{}</text></g>)svg" "\n", x, y,
                       sample, xml_escape(text));
    x += w;
  }
  svg += "</g>\n";
  return y + 12;
}

}  // namespace

bool is_metric(const std::string& m) {
  return std::any_of(metric_table().begin(), metric_table().end(), [&](const MetricInfo& i) { return m == i.name; });
}

const std::vector<std::string>& metric_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> v;
    for (const MetricInfo& i : metric_table()) v.push_back(i.name);
    return v;
  }();
  return kNames;
}

const std::vector<const char*>& metric_curves(const std::string& m) { return metric_info(m).curves; }

std::string metric_list() {
  std::string out;
  for (const std::string& n : metric_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // XML 1.0 forbids most control characters, even escaped.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

Axis nice_axis(double lo, double hi, int target) {
  constexpr double kMax = std::numeric_limits<double>::max();
  if (!(hi > lo)) {
    const double d = lo != 0 ? std::fabs(lo) * 0.05 : 1.0;
    lo = std::max(lo - d, -kMax);
    hi = std::min(hi + d, kMax);
  }
  // (hi - lo) overflows for ranges wider than DBL_MAX: halves first.
  const double raw = (hi * 0.5 - lo * 0.5) / std::max(target, 1) * 2;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double f : {1.0, 2.0, 2.5, 5.0})
    if (f * mag >= raw * (1 - 1e-9)) {
      step = f * mag;
      break;
    }
  Axis a;
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  // A range too narrow for its magnitude (the ticks would not count up) or
  // underflowing: its two ends are the ticks.
  if (!std::isfinite(step) || !(step > 0) || !(last - first <= 1000)) {
    a.lo = lo, a.hi = hi, a.step = hi * 0.5 - lo * 0.5, a.ticks = {lo, hi};
    return a;
  }
  a.step = step;
  for (double k = first; k <= last + 0.5; k += 1) {
    const double t = std::clamp(k * step, -kMax, kMax);
    a.ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  }
  a.lo = a.ticks.front();
  a.hi = a.ticks.back();
  return a;
}

std::string tick_label(double v, double step) {
  if (v == 0) return "0";
  if (step < 1e-4 || step >= 1e15) return fmt::format("{:g}", v);
  double unit = 1;
  const char* suffix = "";
  if (step >= 1e9) unit = 1e9, suffix = "G";
  else if (step >= 1e6) unit = 1e6, suffix = "M";
  else if (step >= 1e3 && std::fabs(v) >= 1e4) unit = 1e3, suffix = "k";
  int decimals = 0;
  const double s = step / unit;
  while (decimals < 10 && std::fabs(std::round(s * std::pow(10, decimals)) - s * std::pow(10, decimals)) > 1e-6)
    ++decimals;
  return fmt::format("{:.{}f}{}", v / unit, decimals, suffix);
}

std::string render_svg(const std::vector<Run>& runs, const PlotOptions& o) {
  DS_USER_CHECK(!runs.empty(), "nothing to plot: no runs given");
  DS_USER_CHECK(!o.metrics.empty(), "--metrics: give at least one of {}", metric_list());
  DS_USER_CHECK(o.width >= 300 && o.width <= 10000, "--width must be in [300, 10000] pixels, got {}", o.width);
  Range xr;
  std::vector<Range> yr(o.metrics.size());
  for (size_t m = 0; m < o.metrics.size(); ++m) {
    for (const Run& r : runs)
      for (const char* key : metric_info(o.metrics[m]).curves)
        if (auto it = r.curves.find(key); it != r.curves.end())
          for (size_t i = 0; i < it->second.x.size(); ++i) {
            xr.add(it->second.x[i]);
            yr[m].add(it->second.y[i]);
          }
    DS_USER_CHECK(!yr[m].empty(), "none of the runs has '{}' values to plot (against {})", o.metrics[m],
                  x_axis_name(o.x));
  }
  const Axis xa = nice_axis(xr.lo, xr.hi, std::max(4, (o.width - kLeft - kRight) / 110));
  const bool has_loss = std::find(o.metrics.begin(), o.metrics.end(), "loss") != o.metrics.end();

  std::string body;
  body += fmt::format(R"(<text class="title" x="{}" y="26" text-anchor="middle">{}</text>)" "\n", o.width / 2,
                      xml_escape(o.title.empty() ? "training curves" : o.title));
  double top = draw_legend(body, runs, has_loss, 40, o.width) + 14;
  for (size_t m = 0; m < o.metrics.size(); ++m) {
    const MetricInfo& info = metric_info(o.metrics[m]);
    Box b{kLeft, top, static_cast<double>(o.width - kLeft - kRight), static_cast<double>(info.height), xa,
          nice_axis(yr[m].lo, yr[m].hi, info.height >= 250 ? 6 : 4)};
    body += fmt::format(R"(<g class="panel" data-metric="{}" data-x0="{}" data-x1="{}" data-y0="{}" data-y1="{}" )"
                        R"(data-left="{}" data-top="{}" data-width="{}" data-height="{}">)" "\n",
                        info.name, num(b.x.lo), num(b.x.hi), num(b.y.lo), num(b.y.hi), num(b.left), num(b.top),
                        num(b.width), num(b.height));
    draw_axes(body, b, info);
    for (size_t r = 0; r < runs.size(); ++r)
      for (size_t k = 0; k < info.curves.size(); ++k) draw_series(body, b, runs[r], info.curves[k], r, k == 1);
    body += "</g>\n";
    top += b.height + kPanelGap;
  }
  body += fmt::format(R"(<text class="label" x="{:.1f}" y="{:.1f}" text-anchor="middle">{}</text>)" "\n",
                      kLeft + (o.width - kLeft - kRight) / 2.0, top - kPanelGap + 36, x_axis_name(o.x));
  const int height = static_cast<int>(std::ceil(top - kPanelGap + 50));
  std::string svg = fmt::format(
      R"(<?xml version="1.0" encoding="UTF-8"?>)" "\n"
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" )"
      R"(font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="{2}">)" "\n"
      "<style>.grid{{stroke:#e4e4e4;stroke-width:1}} .frame{{fill:none;stroke:#444;stroke-width:1}} "
      ".series{{fill:none;stroke-width:1.6;stroke-linejoin:round}} .tick{{fill:#333}} .label{{font-size:13px}} "
      ".title{{font-size:16px;font-weight:bold}}</style>\n"
      R"(<rect width="100%" height="100%" fill="white"/>)" "\n",
      o.width, height, kFont);
  return svg + body + "</svg>\n";
}

}  // namespace ds::plot
