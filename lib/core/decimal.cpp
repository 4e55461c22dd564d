// Strict decimal parsing (decimal.h): the text is checked against the decimal
// grammar first, then converted by std::from_chars (no locale, no hex).
#include "lib/core/decimal.h"

#include <charconv>
#include <cmath>

namespace ds {

namespace {

bool digit(char c) { return c >= '0' && c <= '9'; }

// Length of the run of digits at s[i...].
size_t digits_at(std::string_view s, size_t i) {
  size_t n = 0;
  while (i + n < s.size() && digit(s[i + n])) ++n;
  return n;
}

}  // namespace

std::optional<double> parse_decimal(std::string_view s) {
  size_t i = 0;
  if (i < s.size() && s[i] == '-') ++i;
  const size_t body = i;
  const size_t whole = digits_at(s, i);
  i += whole;
  size_t frac = 0;
  if (i < s.size() && s[i] == '.') frac = digits_at(s, ++i), i += frac;
  if (whole + frac == 0) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    const size_t exp = digits_at(s, i);
    if (exp == 0) return std::nullopt;
    i += exp;
  }
  if (i != s.size()) return std::nullopt;
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data() + body, s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return body > 0 && s[0] == '-' ? -v : v;
}

std::optional<int64_t> parse_decimal_int(std::string_view s) {
  size_t i = 0;
  const bool neg = !s.empty() && s[0] == '-';
  if (neg) ++i;
  if (digits_at(s, i) != s.size() - i || i == s.size()) return std::nullopt;
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data() + i, s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  const uint64_t limit = neg ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;
  if (v > limit) return std::nullopt;
  return neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
}

}  // namespace ds
