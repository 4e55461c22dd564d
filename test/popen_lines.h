// Runs a command through the shell (a test's Python reference) and returns
// its exit code (-1 when it did not exit normally), its standard output
// appended to `lines` one line each.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace ds::test {

inline int popen_lines(const std::string& cmd, std::vector<std::string>& lines) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(::popen(cmd.c_str(), "r"), ::pclose);
  if (!p) return -1;
  std::string text;
  char buf[65536];
  for (size_t k; (k = std::fread(buf, 1, sizeof buf, p.get())) > 0;) text.append(buf, k);
  const int st = ::pclose(p.release());
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace ds::test
