// dsplot: training curves of one or several runs as one picture.
//   dsplot RUN_DIR_or_CSV_or_EVENTS ... -o curves.svg [-o curves.png]
//          [--label NAME ...] [--metrics loss,lr,grad_norm,loss_scale,tokens_per_s,reward,ppo_loss]
//          [--x iteration|samples|tokens] [--seq-length T] [--title TEXT] [--width PX] [--png-scale S]
// Every run is drawn in its own colour on shared axes (training solid,
// validation dashed). User errors print one line naming the input and exit 1;
// the outputs are written as a set: all of them whole, or none. docs/plotting.md.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <set>

#include "lib/core/atomic_file.h"
#include "lib/core/error.h"
#include "lib/core/run_main.h"
#include "lib/plot/png.h"
#include "lib/plot/runs.h"
#include "lib/plot/svg.h"

namespace {

struct Args {
  std::vector<std::string> inputs, outputs, labels;
  std::string metrics = "loss", x = "iteration", title;
  int64_t seq_length = 0;
  int width = 900;
  double png_scale = 1.0;
};

enum class Format { Svg, Png };

Format format_of(const std::string& path) {
  auto ends = [&](const char* ext) {
    const std::string e(ext);
    return path.size() > e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0;
  };
  if (ends(".svg") || ends(".SVG")) return Format::Svg;
  if (ends(".png") || ends(".PNG")) return Format::Png;
  DS_USER_ERROR("-o {}: the output's name must end in .svg or .png", path);
}

std::vector<std::string> split_metrics(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    const std::string m = s.substr(start, end - start);
    DS_USER_CHECK(ds::plot::is_metric(m), "--metrics: unknown metric '{}' (known: {})", m, ds::plot::metric_list());
    out.push_back(m);
    start = end + 1;
  }
  return out;
}

int run(const Args& a) {
  DS_USER_CHECK(!a.outputs.empty(), "-o is required (curves.svg and/or curves.png)");
  DS_USER_CHECK(a.labels.empty() || a.labels.size() == a.inputs.size(),
                "--label: give one per input or none ({} labels for {} inputs)", a.labels.size(), a.inputs.size());
  for (const std::string& out : a.outputs)
    if (format_of(out) == Format::Png)
      DS_USER_CHECK(ds::plot::png_supported(), "-o {}: this dsplot was built without librsvg (Debian package "
                    "librsvg2-dev) and writes SVG only", out);
  ds::plot::PlotOptions po;
  po.metrics = split_metrics(a.metrics);
  po.x = ds::plot::parse_x_axis(a.x);
  po.title = a.title;
  po.width = a.width;
  const ds::plot::LoadOptions lo{.x = po.x, .seq_length = a.seq_length};
  std::vector<ds::plot::Run> runs;
  std::set<std::string> seen;
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    runs.push_back(ds::plot::load_run(a.inputs[i], lo));
    ds::plot::Run& r = runs.back();
    for (const std::string& w : r.warnings) std::fprintf(stderr, "dsplot: warning: %s\n", w.c_str());
    if (!a.labels.empty()) r.label = a.labels[i];
    if (seen.count(r.label)) r.label = r.source;  // two runs named alike: their paths tell them apart
    seen.insert(r.label);
    for (const std::string& m : po.metrics) {
      const char* key = ds::plot::metric_curves(m).front();  // the panel's main curve
      auto it = r.curves.find(key);
      if (it == r.curves.end() || it->second.x.empty())
        std::fprintf(stderr, "dsplot: warning: %s (%s) has no '%s' values against %s\n", r.label.c_str(),
                     r.source.c_str(), key, ds::plot::x_axis_name(po.x));
    }
  }
  // Every output is rendered and written to its temporary before any is
  // renamed into place: all are written, or none.
  const std::string svg = ds::plot::render_svg(runs, po);
  ds::StagedFiles files;
  for (const std::string& out : a.outputs)
    files.stage(out, format_of(out) == Format::Svg ? svg : ds::plot::render_png(svg, out, a.png_scale));
  files.commit();
  for (const std::string& out : a.outputs) {
    std::printf("dsplot: wrote %s (%zu run%s: %s)\n", out.c_str(), runs.size(), runs.size() == 1 ? "" : "s",
                a.metrics.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"dsplot: training and validation curves of dstrain runs (CSV monitor or TensorBoard files) as SVG/PNG"};
  app.add_option("inputs", a.inputs, "Run directories, train.csv/valid.csv files or events.out.tfevents.* files")
      ->required();
  app.add_option("-o,--output", a.outputs, "Output file(s): .svg and/or .png (repeat -o for both)");
  app.add_option("--label", a.labels, "Legend name per input, in input order (default: the job directory's name)");
  app.add_option("--metrics", a.metrics, "Panels, comma-separated: loss, lr, grad_norm, loss_scale, tokens_per_s, reward, ppo_loss "
                 "(dschat ppo)");
  app.add_option("--x", a.x, "x axis: iteration, samples or tokens");
  app.add_option("--seq-length", a.seq_length, "Sequence length, for --x tokens from CSV files");
  app.add_option("--title", a.title, "Picture title");
  app.add_option("--width", a.width, "Width in pixels");
  app.add_option("--png-scale", a.png_scale, "PNG pixels per SVG pixel");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "dsplot: error: %s (see dsplot --help)\n", e.what());
    return 1;
  }
  return ds::run_main("dsplot", [&] {
    return run(a);
  });
}
