// Training curves read back for dsplot: a run's CSV monitor files
// (train.csv / valid.csv, lib/train/metrics.h) or TensorBoard event files
// (lib/train/tensorboard.h; the scalars Megatron-DeepSpeed writes), as curves
// keyed by metric against one x axis (iteration, consumed samples or tokens).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ds::plot {

enum class XAxis { Iteration, Samples, Tokens };
XAxis parse_x_axis(const std::string& s);  // "iteration" | "samples" | "tokens"; UserError otherwise
const char* x_axis_name(XAxis x);           // axis title

// Curve keys: "train_loss", "valid_loss", "lr", "grad_norm", "loss_scale", "tokens_per_s".
struct Curve {
  std::vector<double> x, y;  // sorted by x, one point per x, finite values only
};

struct Run {
  std::string label;   // legend text
  std::string source;  // the path it came from
  std::map<std::string, Curve> curves;
  std::vector<std::string> warnings;  // what was left out and why (dsplot prints them)
};

struct LoadOptions {
  XAxis x = XAxis::Iteration;
  int64_t seq_length = 0;  // CSV files with x = tokens: tokens = consumed samples * seq_length
};

// PATH is a CSV monitor file (train.csv or valid.csv: its sibling is read
// too), a TensorBoard event file, or a directory holding train.csv, event
// files, or one job directory with train.csv (csv_monitor's OUTPUT_PATH).
// Any problem (missing file, bad header or row, a corrupt record) is a
// UserError naming the file (and line or record), except an empty CSV file
// (0 bytes: a run whose disk was full before its header): that is a warning
// in Run::warnings, and the run's other file is still read.
Run load_run(const std::string& path, const LoadOptions& o);

// The pieces, for tests.
struct CsvTable {
  std::vector<std::string> columns;
  std::vector<std::vector<double>> rows;  // each as many values as columns
};
CsvTable read_csv(const std::string& path);

struct Scalar {
  std::string tag;
  int64_t step = 0;
  double value = 0;
};
// Every simple_value scalar of a TFRecord file of Event protocol buffers,
// with both CRCs of every record checked.
std::vector<Scalar> read_event_file(const std::string& path);

}  // namespace ds::plot
