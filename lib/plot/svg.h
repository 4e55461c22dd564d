// Training curves drawn as SVG, written directly: one panel per metric,
// stacked, all on one shared x axis (iteration, samples or tokens), one
// colour per run, training solid and validation dashed, with a legend. Every
// series carries its data coordinates (data-x / data-y) and every panel its
// axis ranges and pixel box (data-x0 ... data-height), so a test or a script
// can read the values back or invert the axis transform.
#pragma once
#include <string>
#include <vector>

#include "lib/plot/runs.h"

namespace ds::plot {

// Panels: "loss" (train_loss and valid_loss), "lr", "grad_norm", "loss_scale", "tokens_per_s".
bool is_metric(const std::string& m);
const std::vector<std::string>& metric_names();
std::string metric_list();  // "loss, lr, ..." for messages
// The curve keys metric m draws (Run::curves), the main one first.
const std::vector<const char*>& metric_curves(const std::string& m);

struct PlotOptions {
  std::vector<std::string> metrics = {"loss"};
  XAxis x = XAxis::Iteration;
  std::string title;  // empty: "training curves"
  int width = 900;    // pixels; height follows from the panels
};

// Ticks of a "nice" axis over [lo, hi] (steps of 1, 2, 2.5 or 5 times a power
// of ten, about `target` of them); the returned ends are the first and last tick.
struct Axis {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> ticks;
};
Axis nice_axis(double lo, double hi, int target);
std::string tick_label(double v, double step);  // "0.002", "2.5", "1.2M", "3e-05"

// UserError when no run has anything for the requested panels.
std::string render_svg(const std::vector<Run>& runs, const PlotOptions& o);

std::string xml_escape(const std::string& s);

}  // namespace ds::plot
