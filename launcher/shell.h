// POSIX shell quoting and word splitting for the command lines dsrun sends to
// remote shells (ssh, pdsh). Quoting is total: any byte string round-trips
// through `sh -c` unchanged, so no value can inject a command. Pure.
#pragma once
#include <string>
#include <vector>

namespace ds::launch {

// Returns `s` unchanged when it only holds safe characters, else single-quoted
// with embedded quotes written as '"'"'. The empty string becomes ''.
std::string shell_quote(const std::string& s);
// Quotes each word and joins them with spaces.
std::string shell_join(const std::vector<std::string>& words);
// Splits like Python's shlex.split (quotes, backslashes); used for --launcher_args.
// An unterminated quote is a ds::UserError naming `what`.
std::vector<std::string> shell_split(const std::string& s, const std::string& what);

}  // namespace ds::launch
