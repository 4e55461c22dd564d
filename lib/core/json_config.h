// Strict reading of JSON config sections.
// A JsonSection wraps one JSON object and remembers which keys were read.
// finish() then reports every key nobody read: as an error for our own
// sections (typo protection), as a named warning for DeepSpeed sections we only
// partly implement. Type mismatches are errors naming the full key path.
#pragma once
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>

#include "lib/core/error.h"

namespace ds {

enum class UnknownKeys { Error, Warn };

class JsonSection {
 public:
  JsonSection(const nlohmann::json& obj, std::string path);  // path like "model" or "" for root

  bool has(const std::string& key) const;
  // Marks the key as known without reading it.
  void mark(const std::string& key) { note(key); }

  // While set, every key a section reads, marks or opens is added to `log`
  // as its dotted path ("model.moe.topk"): the readers declare the keys they
  // accept, and test/config/test_config_docs.cpp holds docs/config.md to them.
  static void set_key_log(std::set<std::string>* log);

  template <class T>
  T get(const std::string& key, const T& fallback) {
    note(key);
    if (!obj_.contains(key) || obj_.at(key).is_null()) return fallback;
    return convert<T>(key);
  }
  template <class T>
  T require(const std::string& key) {
    note(key);
    DS_USER_CHECK(obj_.contains(key), "config: missing required key '{}'", full(key));
    return convert<T>(key);
  }
  // A nested object (empty object if absent).
  JsonSection section(const std::string& key);

  // Reports keys not read. With Error: throws UserError naming them.
  void finish(UnknownKeys mode) const;
  std::string full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const nlohmann::json& raw() const { return obj_; }

 private:
  void note(const std::string& key);
  template <class T>
  T convert(const std::string& key) {
    const auto& v = obj_.at(key);
    try {
      if constexpr (std::is_same_v<T, bool>) {
        DS_USER_CHECK(v.is_boolean(), "config: '{}' must be true or false, got {}", full(key), v.dump());
      } else if constexpr (std::is_integral_v<T>) {
        return integer_in_range<T>(v, key);
      } else if constexpr (std::is_floating_point_v<T>) {
        DS_USER_CHECK(v.is_number(), "config: '{}' must be a number, got {}", full(key), v.dump());
      } else if constexpr (std::is_same_v<T, std::string>) {
        DS_USER_CHECK(v.is_string(), "config: '{}' must be a string, got {}", full(key), v.dump());
      }
      return v.get<T>();
    } catch (const nlohmann::json::exception& e) {
      DS_USER_ERROR("config: '{}' has the wrong type ({}): {}", full(key), v.dump(), e.what());
    }
  }

  // An integer (or a float with an integral value, like 1e3) that T can hold;
  // anything else is a UserError naming the key, never a wrapped or UB cast.
  template <class T>
  T integer_in_range(const nlohmann::json& v, const std::string& key) const {
    constexpr long double lo = static_cast<long double>(std::numeric_limits<T>::min());
    constexpr long double hi = static_cast<long double>(std::numeric_limits<T>::max());
    long double x = 0;
    bool ok = v.is_number();
    if (v.is_number_unsigned()) x = static_cast<long double>(v.get<uint64_t>());
    else if (v.is_number_integer()) x = static_cast<long double>(v.get<int64_t>());
    else if (ok) x = v.get<double>(), ok = std::isfinite(x) && std::trunc(x) == x;
    DS_USER_CHECK(ok, "config: '{}' must be an integer, got {}", full(key), v.dump());
    DS_USER_CHECK(x >= lo && x <= hi, "config: '{}' must be an integer in [{}, {}], got {}", full(key),
                  std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), v.dump());
    return static_cast<T>(x);
  }

  nlohmann::json obj_;
  std::string path_;
  std::set<std::string> seen_;
};

// Deepest nesting of arrays and objects any JSON input may have. Parsing and
// copying a JSON value recurse once per level, so a file of 70,000 '[' would
// overflow the stack; our files nest a handful of levels.
inline constexpr int kMaxJsonDepth = 64;

// Parses JSON text. `what` names the input in the one-line UserError that
// malformed text or nesting deeper than kMaxJsonDepth gives, e.g.
// "config file 'x.json'" or "checkpoint 'd/global_step3': state.json".
nlohmann::json parse_json_text(std::string_view text, const std::string& what);
// Index of the first byte at which `text` nests arrays/objects deeper than
// max_depth (strings are skipped), or std::string_view::npos if it does not.
size_t json_too_deep_at(std::string_view text, int max_depth);

// Parses a JSON file; a missing or malformed file is a UserError naming it.
nlohmann::json load_json_file(const std::string& path);

}  // namespace ds
