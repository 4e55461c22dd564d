// The command lines of DeepSpeed-Chat's main.py scripts, read as Python's
// argparse reads them, so that a launch script's flags work unchanged:
// "--flag value" and "--flag=value", a unique prefix of a flag name
// (argparse's allow_abbrev), store_true flags, nargs='*' lists (every value
// up to the next flag), choices, and argparse's int() / float() conversions.
// Errors are one line in argparse's words ("argument --seed: invalid int
// value: 'x'", "unrecognized arguments: --foo").
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ds::chat {

enum class ArgKind { Str, Int, Float, Flag, List };

struct ArgSpec {
  std::string name;  // "--per_device_train_batch_size"
  ArgKind kind = ArgKind::Str;
  std::optional<std::string> dflt;  // as text; nullopt = None (Str/Int/Float)
  std::vector<std::string> choices;  // empty: any
  bool required = false;
  std::vector<std::string> list_default = {};  // List
};

class ParsedArgs {
 public:
  bool given(const std::string& name) const;  // on the command line
  bool flag(const std::string& name) const;
  std::optional<std::string> str(const std::string& name) const;  // nullopt = None
  std::optional<int64_t> integer(const std::string& name) const;
  std::optional<double> real(const std::string& name) const;
  const std::vector<std::string>& list(const std::string& name) const;

 private:
  friend ParsedArgs parse_args(const std::vector<ArgSpec>& specs, const std::vector<std::string>& argv,
                               const std::string& prog);
  std::map<std::string, std::optional<std::string>> values_;
  std::map<std::string, std::vector<std::string>> lists_;
  std::map<std::string, bool> flags_;
  std::vector<std::string> given_;
};

// -h / --help anywhere in argv (argparse then prints the usage and exits 0).
bool wants_help(const std::vector<std::string>& argv);
// The flags with their kinds and defaults, one per line, for --help.
std::string usage(const std::vector<ArgSpec>& specs, const std::string& prog);

// argv without the program name. UserError ("PROG: argument ...") on a bad line.
ParsedArgs parse_args(const std::vector<ArgSpec>& specs, const std::vector<std::string>& argv,
                      const std::string& prog);

// Python's int() of a command-line value ("+3", " 7 ", "1_000" accepted as
// Python does); nullopt when Python would raise ValueError.
std::optional<int64_t> python_int(const std::string& text);
// Python's float(): decimal and exponent forms, inf/nan spellings, "_" between digits.
std::optional<double> python_float(const std::string& text);
// Python's repr() of a float ("0.1", "1e-05", "3.0", "inf", "nan").
std::string python_repr(double v);

}  // namespace ds::chat
