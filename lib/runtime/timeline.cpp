// Timeline of compute and communication spans (see timeline.h).
#include "lib/runtime/timeline.h"

#include <filesystem>
#include <fstream>

#include "lib/core/error.h"

namespace ds {

double Timeline::now_us() const { return us(std::chrono::steady_clock::now()); }

double Timeline::us(std::chrono::steady_clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - epoch_).count();
}

void Timeline::add(Event e) {
  if (!on_) return;
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(e));
}

std::vector<Timeline::Event> Timeline::events() {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

void Timeline::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  events_.clear();
}

void Timeline::write_chrome_trace(const std::string& path, int rank) {
  std::vector<Event> ev = events();
  std::error_code ec;  // the folder is made if missing; a failure shows as the open's
  if (const std::filesystem::path dir = std::filesystem::path(path).parent_path(); !dir.empty())
    std::filesystem::create_directories(dir, ec);
  std::ofstream f(path);
  DS_USER_CHECK(f.good(), "--profile: cannot write the timeline file '{}'", path);
  f << "{\"traceEvents\": [\n";
  for (size_t i = 0; i < ev.size(); ++i) {
    const Event& e = ev[i];
    f << fmt::format(R"({{"name": "{}", "cat": "{}", "ph": "X", "pid": {}, "tid": {}, "ts": {:.3f}, "dur": {:.3f}, )"
                     R"("args": {{"issued_us": {:.3f}}}}}{})",
                     e.name, e.cat, rank, e.tid, e.begin_us, e.end_us - e.begin_us, e.issue_us,
                     i + 1 < ev.size() ? ",\n" : "\n");
  }
  f << "]}\n";
  DS_USER_CHECK(f.good(), "--profile: writing the timeline file '{}' failed", path);
}

}  // namespace ds
