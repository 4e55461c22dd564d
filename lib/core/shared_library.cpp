// Run-time library search (shared_library.h).
#include "lib/core/shared_library.h"

#include <glob.h>

#include <algorithm>
#include <cstdlib>

namespace ds {

std::vector<std::string> glob_paths(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  return out;
}

std::vector<std::string> python_site_dirs() {
  std::vector<std::string> roots;
  auto env = [](const char* k) {
    const char* v = std::getenv(k);
    return std::string(v ? v : "");
  };
  auto add = [&](const std::string& pattern) {
    for (const std::string& d : glob_paths(pattern)) roots.push_back(d);
  };
  if (!env("VIRTUAL_ENV").empty()) add(env("VIRTUAL_ENV") + "/lib/python3*/site-packages");
  const std::string pp = env("PYTHONPATH");
  for (size_t at = 0; !pp.empty() && at <= pp.size();) {
    const size_t colon = std::min(pp.find(':', at), pp.size());
    if (colon > at) roots.push_back(pp.substr(at, colon - at));
    at = colon + 1;
  }
  if (!env("HOME").empty()) add(env("HOME") + "/.local/lib/python3*/site-packages");
  for (const char* pattern : {"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
                              "/usr/lib/python3/dist-packages", "/usr/lib/python3*/site-packages",
                              "/opt/conda/lib/python3*/site-packages"})
    add(pattern);
  return roots;
}

std::vector<std::string> shared_library_candidates(const std::string& override_path, const std::string& soname,
                                                   const std::string& wheel_glob) {
  if (!override_path.empty()) return {override_path};
  std::vector<std::string> c = {soname, "/usr/local/cuda/lib64/" + soname, "/usr/lib/x86_64-linux-gnu/" + soname};
  for (const std::string& root : python_site_dirs())
    for (const std::string& p : glob_paths(root + "/" + wheel_glob)) c.push_back(p);
  return c;
}

}  // namespace ds
