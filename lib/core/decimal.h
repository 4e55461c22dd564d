// Strict decimal numbers for what users and files give us (blend weights,
// --split, CSV monitor columns, environment variables): an optional '-',
// digits with an optional fraction, an optional exponent, and nothing else.
// strtod and strtoll alone also take "0x10", "inf", "nan", leading spaces and
// a trailing partial parse; these refuse all of them.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace ds {

// "949", "-0.5", "1e-3", ".5": a finite double; nullopt for anything else
// (empty, "+1", hex, inf/nan, spaces, an overflowing exponent).
std::optional<double> parse_decimal(std::string_view s);

// "12", "-3": an integer within int64; nullopt for anything else
// (fractions, exponents, hex, spaces, out of range).
std::optional<int64_t> parse_decimal_int(std::string_view s);

}  // namespace ds
