// DeepSpeed-Chat's command lines, read as argparse reads them (chat_args.h).
#include "lib/chat/chat_args.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include "lib/core/error.h"

namespace ds::chat {

namespace {

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// Digits with single underscores between them (Python's numeric literals);
// the digits without the underscores, or nullopt.
std::optional<std::string> digits(const std::string& s) {
  if (s.empty() || s.front() == '_' || s.back() == '_') return std::nullopt;
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (s[i + 1] == '_') return std::nullopt;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return std::nullopt;
    out += s[i];
  }
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::optional<int64_t> python_int(const std::string& text) {
  std::string s = trim(text);
  bool neg = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    neg = s[0] == '-';
    s = s.substr(1);
  }
  const auto d = digits(s);
  if (!d || d->size() > 18) return std::nullopt;  // beyond int64: refused rather than wrapped
  const int64_t v = std::stoll(*d);
  return neg ? -v : v;
}

std::optional<double> python_float(const std::string& text) {
  std::string s = trim(text);
  std::string sign;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    sign = s.substr(0, 1);
    s = s.substr(1);
  }
  const std::string l = lower(s);
  if (l == "inf" || l == "infinity") return sign == "-" ? -INFINITY : INFINITY;
  if (l == "nan") return NAN;
  // mantissa [e exponent], each part digits with single underscores
  const size_t e = l.find('e');
  const std::string mant = l.substr(0, e), expo = e == std::string::npos ? "" : l.substr(e + 1);
  const size_t dot = mant.find('.');
  const std::string ip = mant.substr(0, dot), fp = dot == std::string::npos ? "" : mant.substr(dot + 1);
  if (ip.empty() && fp.empty()) return std::nullopt;
  std::string clean = sign;
  if (!ip.empty()) {
    const auto d = digits(ip);
    if (!d) return std::nullopt;
    clean += *d;
  }
  if (dot != std::string::npos) {
    clean += '.';
    if (!fp.empty()) {
      const auto d = digits(fp);
      if (!d) return std::nullopt;
      clean += *d;
    }
  }
  if (e != std::string::npos) {
    std::string es = expo, esign;
    if (!es.empty() && (es[0] == '+' || es[0] == '-')) {
      esign = es.substr(0, 1);
      es = es.substr(1);
    }
    const auto d = digits(es);
    if (!d) return std::nullopt;
    clean += "e" + esign + *d;
  }
  return std::strtod(clean.c_str(), nullptr);
}

std::string python_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

bool ParsedArgs::given(const std::string& name) const {
  return std::find(given_.begin(), given_.end(), name) != given_.end();
}

bool ParsedArgs::flag(const std::string& name) const { return flags_.at(name); }

std::optional<std::string> ParsedArgs::str(const std::string& name) const { return values_.at(name); }

std::optional<int64_t> ParsedArgs::integer(const std::string& name) const {
  const auto& v = values_.at(name);
  return v ? python_int(*v) : std::nullopt;
}

std::optional<double> ParsedArgs::real(const std::string& name) const {
  const auto& v = values_.at(name);
  return v ? python_float(*v) : std::nullopt;
}

const std::vector<std::string>& ParsedArgs::list(const std::string& name) const { return lists_.at(name); }

bool wants_help(const std::vector<std::string>& argv) {
  for (const std::string& a : argv)
    if (a == "-h" || a == "--help") return true;
  return false;
}

std::string usage(const std::vector<ArgSpec>& specs, const std::string& prog) {
  std::string out = "usage: " + prog + " [flags], as DeepSpeed-Chat's main.py takes them:\n";
  for (const ArgSpec& s : specs) {
    std::string what;
    switch (s.kind) {
      case ArgKind::Flag: what = "(flag)"; break;
      case ArgKind::List: {
        what = "[VALUE ...]";
        std::string d;
        for (const std::string& v : s.list_default) d += (d.empty() ? "" : " ") + v;
        if (!d.empty()) what += " (default: " + d + ")";
        break;
      }
      default: {
        what = s.kind == ArgKind::Int ? "INT" : s.kind == ArgKind::Float ? "FLOAT" : "VALUE";
        if (!s.choices.empty()) {
          what = "{";
          for (const std::string& c : s.choices) what += (what.size() > 1 ? "," : "") + c;
          what += "}";
        }
        what += s.required ? " (required)" : " (default: " + (s.dflt ? *s.dflt : std::string("None")) + ")";
      }
    }
    out += "  " + s.name + " " + what + "\n";
  }
  return out;
}

ParsedArgs parse_args(const std::vector<ArgSpec>& specs, const std::vector<std::string>& argv,
                      const std::string& prog) {
  auto fail = [&](const std::string& msg) { throw UserError(fmt::format("{}: {}", prog, msg)); };
  ParsedArgs out;
  for (const ArgSpec& s : specs) {
    if (s.kind == ArgKind::Flag) out.flags_[s.name] = false;
    else if (s.kind == ArgKind::List) out.lists_[s.name] = s.list_default;
    else out.values_[s.name] = s.dflt;
  }
  // argparse's allow_abbrev: an exact name, else a unique prefix.
  auto find = [&](const std::string& name) -> const ArgSpec* {
    for (const ArgSpec& s : specs)
      if (s.name == name) return &s;
    std::vector<const ArgSpec*> hits;
    for (const ArgSpec& s : specs)
      if (s.name.compare(0, name.size(), name) == 0) hits.push_back(&s);
    if (hits.size() > 1) {
      std::string names;
      for (const ArgSpec* h : hits) names += (names.empty() ? "" : ", ") + h->name;
      fail(fmt::format("ambiguous option: {} could match {}", name, names));
    }
    return hits.empty() ? nullptr : hits[0];
  };
  auto is_flag = [](const std::string& a) {
    return a.size() > 1 && a[0] == '-' && !python_float(a);  // "-1" is a value, as argparse takes it
  };
  std::vector<std::string> unknown;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (!is_flag(a)) {
      unknown.push_back(a);
      continue;
    }
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq);
    const ArgSpec* s = a.rfind("--", 0) == 0 ? find(name) : nullptr;
    if (!s) {
      unknown.push_back(a);
      continue;
    }
    out.given_.push_back(s->name);
    if (s->kind == ArgKind::Flag) {
      if (eq != std::string::npos) fail(fmt::format("argument {}: ignored explicit argument '{}'", s->name,
                                                    a.substr(eq + 1)));
      out.flags_[s->name] = true;
      continue;
    }
    if (s->kind == ArgKind::List) {
      std::vector<std::string> vals;
      if (eq != std::string::npos) vals.push_back(a.substr(eq + 1));
      else
        while (i + 1 < argv.size() && !is_flag(argv[i + 1])) vals.push_back(argv[++i]);
      out.lists_[s->name] = vals;
      continue;
    }
    std::string v;
    if (eq != std::string::npos) {
      v = a.substr(eq + 1);
    } else {
      if (i + 1 >= argv.size() || is_flag(argv[i + 1]))
        fail(fmt::format("argument {}: expected one argument", s->name));
      v = argv[++i];
    }
    if (s->kind == ArgKind::Int && !python_int(v))
      fail(fmt::format("argument {}: invalid int value: '{}'", s->name, v));
    if (s->kind == ArgKind::Float && !python_float(v))
      fail(fmt::format("argument {}: invalid float value: '{}'", s->name, v));
    if (!s->choices.empty() && std::find(s->choices.begin(), s->choices.end(), v) == s->choices.end()) {
      std::string c;
      for (const std::string& x : s->choices) c += (c.empty() ? "'" : ", '") + x + "'";
      fail(fmt::format("argument {}: invalid choice: '{}' (choose from {})", s->name, v, c));
    }
    out.values_[s->name] = v;
  }
  for (const ArgSpec& s : specs)
    if (s.required && !out.given(s.name)) fail(fmt::format("the following arguments are required: {}", s.name));
  if (!unknown.empty()) {
    std::string u;
    for (const std::string& x : unknown) u += (u.empty() ? "" : " ") + x;
    fail("unrecognized arguments: " + u);
  }
  return out;
}

}  // namespace ds::chat
