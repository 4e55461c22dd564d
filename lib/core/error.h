// Errors and check macros used everywhere.
// Every failure carries file:line, the host name and the rank (from RANK) so a
// message from a 64-rank job says where it came from. User-input errors use
// ds::UserError: the apps print only its message (one line) and exit 1.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace ds {

// An internal invariant broke (a bug, a device failure, a library error).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The user gave us something wrong (config key, batch size, file, flag).
// The message names the input and what to do; no file:line decoration.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "host=<name> rank=<RANK or ->" for error messages.
std::string error_origin();

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);

}  // namespace ds

#define DS_THROW(...) ::ds::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))

#define DS_CHECK(cond, ...)                                                   \
  do {                                                                        \
    if (!(cond)) ::ds::throw_error(__FILE__, __LINE__,                        \
                                   "check failed: " #cond ": " +              \
                                       ::fmt::format(__VA_ARGS__));           \
  } while (0)

// A user-input error: one clear line naming the input.
#define DS_USER_ERROR(...) throw ::ds::UserError(::fmt::format(__VA_ARGS__))
#define DS_USER_CHECK(cond, ...) \
  do {                           \
    if (!(cond)) DS_USER_ERROR(__VA_ARGS__); \
  } while (0)
