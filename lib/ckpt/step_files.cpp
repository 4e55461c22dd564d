// Reading one step directory safely: the `latest` pointer, state.json, file
// checksums, and the optimizer shards with every metadata field, dtype, shape
// and value range checked before any of it is used.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

#include "lib/ckpt/crc32c.h"
#include "lib/ckpt/file_io.h"
#include "lib/ckpt/reshape.h"
#include "lib/ckpt/safetensors.h"
#include "lib/core/error.h"
#include "lib/core/log.h"

namespace fs = std::filesystem;

namespace ds {
namespace {

constexpr size_t kMaxLatestBytes = 64;  // "global_step" + up to 19 digits + newline, with room

// A file's text for an error message: quoted, escaped, at most ~40 characters.
std::string shown(const std::string& t) {
  return nlohmann::json(t.size() > 40 ? t.substr(0, 40) + "..." : t)
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool is_step_name(const std::string& t) {
  constexpr size_t kPrefix = 11;  // "global_step"
  if (t.size() <= kPrefix || t.size() > kPrefix + 19 || t.compare(0, kPrefix, "global_step") != 0) return false;
  return std::all_of(t.begin() + kPrefix, t.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// An integer metadata field of an optimizer shard, in [lo, hi].
int64_t meta_int(const std::map<std::string, std::string>& meta, const char* key, int64_t lo, int64_t hi,
                 const std::string& file) {
  auto it = meta.find(key);
  DS_USER_CHECK(it != meta.end(), "checkpoint file '{}': optimizer shard metadata '{}' is missing", file, key);
  const std::string& t = it->second;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  DS_USER_CHECK(ec == std::errc() && end == t.data() + t.size() && !t.empty() && v >= lo && v <= hi,
                "checkpoint file '{}': optimizer shard metadata '{}' must be an integer in [{}, {}], got {}", file,
                key, lo, hi, shown(t));
  return v;
}

// Optional identity fields (written since checksums were added): a shard
// renamed or copied to another rank's name is refused.
void check_identity(const std::map<std::string, std::string>& meta, const std::string& file, int rank, int world,
                    const ShardCoords& at) {
  const std::pair<const char*, int> want[] = {{"rank", rank},
                                              {"world", world},
                                              {"tp_rank", at.tp_rank},
                                              {"pp_rank", at.pp_rank},
                                              {"ep_rank", at.ep_rank}};
  for (const auto& [key, value] : want) {
    if (!meta.count(key)) continue;
    const int64_t got = meta_int(meta, key, 0, kMaxParallelSize, file);
    DS_USER_CHECK(got == value, "checkpoint file '{}': optimizer shard says {} {}, its file name says {}", file, key,
                  got, value);
  }
}

// An optimizer state tensor of a shard must be F32 of shape (n).
void check_state_header(const SafetensorsFile& sf, const std::string& name, int64_t n) {
  DS_USER_CHECK(sf.has(name), "checkpoint file '{}': optimizer shard has no tensor '{}'", sf.path(), name);
  DS_USER_CHECK(sf.dtype_string(name) == "F32" && sf.shape(name) == Shape{n},
                "checkpoint file '{}': optimizer tensor '{}' is {} {}, expected F32 ({}) for its range", sf.path(),
                name, sf.dtype_string(name), shape_str(sf.shape(name)), n);
}

std::vector<std::string> split_names(const std::string& t) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= t.size() && !t.empty()) {
    const size_t comma = t.find(',', at);
    out.push_back(t.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace

std::string find_step_dir(const std::string& dir, const std::string& tag) {
  DS_USER_CHECK(fs::is_directory(dir), "checkpoint: '{}' is not a directory", dir);
  std::string t = tag;
  if (t.empty()) {
    const fs::path latest = fs::path(dir) / "latest";
    if (!fs::exists(latest)) return "";
    const std::string what = "checkpoint file '" + latest.string() + "'";
    t = read_small_file(latest.string(), kMaxLatestBytes, what);
    while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
    DS_USER_CHECK(is_step_name(t), "{} must hold one line global_step<N> naming a step directory beside it, got {}",
                  what, shown(t));
    DS_USER_CHECK(fs::is_directory(fs::path(dir) / t), "checkpoint: '{}' names '{}', which does not exist",
                  latest.string(), t);
  }
  DS_USER_CHECK(is_step_name(t), "checkpoint tag {} must be global_step<N> (a step directory inside '{}')",
                shown(t), dir);
  fs::path step = fs::path(dir) / t;
  DS_USER_CHECK(fs::is_directory(step), "checkpoint: '{}' does not exist", step.string());
  return step.string();
}

StepState read_step_state(const fs::path& step) {
  const std::string file = (step / "state.json").string();
  StepState s = parse_step_state(read_small_file(file, kMaxStateJsonBytes, "checkpoint file '" + file + "'"), file);
  if (s.checksums.empty())
    DS_WARN("checkpoint '{}' has no file checksums (written by an older dstrain); loading it unverified",
            step.string());
  return s;
}

namespace {

// The checksum state.json records for file `name` of the step; UserError
// naming the file when it has none or is missing.
uint32_t recorded_checksum(const fs::path& step, const StepState& st, const std::string& name) {
  const std::string file = (step / name).string();
  auto it = st.checksums.find(name);
  DS_USER_CHECK(it != st.checksums.end(), "checkpoint file '{}' has no checksum in state.json (not written with "
                "this checkpoint?)", file);
  DS_USER_CHECK(fs::exists(file), "checkpoint file '{}' is missing", file);
  return it->second;
}

void check_checksum(const fs::path& step, const std::string& name, uint32_t got, uint32_t want) {
  DS_USER_CHECK(got == want, "checkpoint file '{}' is corrupt: its checksum is {}, state.json recorded {}",
                (step / name).string(), crc32c_text(got), crc32c_text(want));
}

}  // namespace

void verify_step_file(const fs::path& step, const StepState& st, const std::string& name, Progress* progress) {
  if (st.checksums.empty()) return;  // an older checkpoint: read_step_state warned
  const uint32_t want = recorded_checksum(step, st, name);
  check_checksum(step, name, file_crc32c((step / name).string(), progress), want);
}

void track_step_file(const fs::path& step, const StepState& st, const std::string& name, SafetensorsFile& f,
                     Progress* progress) {
  if (st.checksums.empty()) return;  // an older checkpoint: nothing to check
  const uint32_t whole = recorded_checksum(step, st, name);  // none recorded: an error before anything is read
  auto it = st.chunk_checksums.find(name);
  if (it == st.chunk_checksums.end()) return f.track_reads(progress);
  // Chunk checksums: they must number the file's chunks and join to its checksum
  // (a state.json that says otherwise was not written with these files).
  const StepState::ChunkSums& c = it->second;
  const std::string file = (step / name).string();
  const uint64_t size = f.file_size();
  DS_USER_CHECK(c.crcs.size() == (size + c.chunk_bytes - 1) / c.chunk_bytes,
                "checkpoint file '{}' is corrupt: it is {} bytes, state.json has checksums of {} chunks of {} bytes",
                file, size, c.crcs.size(), c.chunk_bytes);
  uint32_t joined = 0;
  for (size_t i = 0; i < c.crcs.size(); ++i)
    joined = crc32c_combine(joined, c.crcs[i], std::min<uint64_t>(c.chunk_bytes, size - i * c.chunk_bytes));
  DS_USER_CHECK(joined == whole, "checkpoint '{}': state.json's chunk checksums of '{}' do not join to its "
                "checksum {} (state.json edited?)", step.string(), name, crc32c_text(whole));
  f.track_reads(progress, c.chunk_bytes);
}

void verify_step_reads(const fs::path& step, const StepState& st, const std::string& name, const SafetensorsFile& f) {
  if (!f.tracks_reads()) return;
  auto it = st.chunk_checksums.find(name);
  if (it == st.chunk_checksums.end()) return check_checksum(step, name, f.checksum(), recorded_checksum(step, st, name));
  const int64_t bad = f.bad_chunk(it->second.crcs);
  const uint64_t cb = it->second.chunk_bytes;
  DS_USER_CHECK(bad < 0, "checkpoint file '{}' is corrupt: the checksum of its bytes [{}, {}) differs from the one "
                "state.json recorded", (step / name).string(), bad * cb,
                std::min<uint64_t>(f.file_size(), (bad + 1) * cb));
}

void check_finite(const Tensor& t, const std::string& file, const std::string& tensor, bool non_negative) {
  const float* p = t.data<float>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    DS_USER_CHECK(std::isfinite(p[i]), "checkpoint file '{}': tensor '{}' holds {} at element {}; refusing to load "
                  "non-finite weights or optimizer moments", file, tensor, p[i], i);
    DS_USER_CHECK(!non_negative || p[i] >= 0.0f, "checkpoint file '{}': tensor '{}' holds the negative value {} at "
                  "element {}, but it is a mean of squares (moments swapped?)", file, tensor, p[i], i);
  }
}

namespace {

std::map<std::string, std::string> first_shard_metadata(const SavedStep& s, fs::path& f) {
  const std::string name = optimizer_shard_name(0, s.shards, s.sizes.at(0, 0));
  f = s.dir / name;
  DS_USER_CHECK(fs::exists(f), "checkpoint '{}': optimizer shard '{}' is missing", s.dir.string(), name);
  return SafetensorsFile::open(f.string()).metadata();
}

}  // namespace

std::string saved_optimizer_type(const SavedStep& s) {
  fs::path f;
  const auto meta = first_shard_metadata(s, f);
  auto it = meta.find("optimizer");
  if (it == meta.end()) return "AdamW";  // written before the type was recorded
  DS_USER_CHECK(!it->second.empty() && it->second.size() <= 64, "checkpoint file '{}': optimizer shard metadata "
                "'optimizer' must name the optimizer type, got {}", f.string(), shown(it->second));
  return it->second;
}

std::string saved_optimizer_scalars(const SavedStep& s, const ShardCoords& at) {
  const std::string name = optimizer_shard_name(0, s.shards, at);
  DS_USER_CHECK(fs::exists(s.dir / name), "checkpoint '{}': optimizer shard '{}' is missing", s.dir.string(), name);
  const auto meta = SafetensorsFile::open((s.dir / name).string()).metadata();
  auto it = meta.find("optimizer_scalars");
  return it == meta.end() ? "" : it->second;
}

OptimizerStates saved_state_names(const SavedStep& s) {
  fs::path f;
  const auto meta = first_shard_metadata(s, f);
  auto it = meta.find("states");
  if (it == meta.end()) return adam_states(Tensor(), Tensor());  // written before the names were recorded
  constexpr size_t kMaxStates = 16;
  const std::vector<std::string> names = split_names(it->second);
  // SGD without momentum keeps no state: an empty list.
  DS_USER_CHECK(names.size() <= kMaxStates, "checkpoint file '{}': optimizer shard metadata "
                "'states' must name at most {} tensors, got {}", f.string(), kMaxStates, shown(it->second));
  auto nn = meta.find("non_negative");
  const std::vector<std::string> non_negative = nn == meta.end() ? std::vector<std::string>{} : split_names(nn->second);
  OptimizerStates out;
  for (const std::string& n : names) {
    DS_USER_CHECK(!n.empty() && n.size() <= 64, "checkpoint file '{}': optimizer shard metadata 'states' holds an "
                  "empty or over-long name: {}", f.string(), shown(it->second));
    for (const OptimizerStateTensor& o : out)
      DS_USER_CHECK(o.name != n, "checkpoint file '{}': optimizer shard metadata 'states' names '{}' twice",
                    f.string(), n);
    const bool nonneg = std::find(non_negative.begin(), non_negative.end(), n) != non_negative.end();
    out.push_back({n, Tensor(), nonneg});
  }
  return out;
}

void check_saved_states(const SavedStep& s, const OptimizerStates& want, const std::string& type) {
  if (!type.empty()) {
    const std::string saved_type = saved_optimizer_type(s);
    DS_USER_CHECK(saved_type == type, "checkpoint '{}' was saved by the optimizer {}, this run's optimizer is {} "
                  "(optimizer.type); resume with the optimizer that saved it", s.dir.string(), saved_type, type);
  }
  const OptimizerStates saved = saved_state_names(s);
  bool same = saved.size() == want.size();
  for (size_t i = 0; same && i < want.size(); ++i) same = saved[i].name == want[i].name;
  DS_USER_CHECK(same, "checkpoint '{}' holds the optimizer state {} (saved with another optimizer?), this run's "
                "optimizer keeps {}", s.dir.string(),
                state_names(saved), state_names(want));
}

namespace {

// "b:e,b:e,..." (pieces.<group> metadata): sorted disjoint ranges in [0, total].
std::vector<Range> parse_pieces(const std::string& t, int64_t total, const std::string& file, const std::string& key) {
  std::vector<Range> out;
  for (const std::string& item : split_names(t)) {
    const size_t colon = item.find(':');
    int64_t b = -1, e = -1;
    bool ok = colon != std::string::npos;
    if (ok) {
      const auto r1 = std::from_chars(item.data(), item.data() + colon, b);
      const auto r2 = std::from_chars(item.data() + colon + 1, item.data() + item.size(), e);
      ok = r1.ec == std::errc() && r1.ptr == item.data() + colon && r2.ec == std::errc() &&
           r2.ptr == item.data() + item.size() && colon > 0 && colon + 1 < item.size();
    }
    DS_USER_CHECK(ok && b >= 0 && b < e && e <= total && (out.empty() || out.back().end <= b),
                  "checkpoint file '{}': optimizer shard metadata '{}' must list sorted ranges b:e inside [0, {}], "
                  "got {}", file, key, total, shown(t));
    out.push_back({b, e});
  }
  return out;
}

}  // namespace

void SavedStateFiles::open_file(const ShardCoords& at, int r, int64_t local_total, bool own_ep) {
  const std::string name = optimizer_shard_name(r, s_.shards, at);
  const fs::path f = s_.dir / name;
  DS_USER_CHECK(fs::exists(f), "checkpoint '{}': optimizer shard '{}' is missing", s_.dir.string(), name);
  File file{SafetensorsFile::open(f.string()), name, false};
  const auto meta = file.sf.metadata();
  const int64_t total = meta_int(meta, "total", 0, INT64_MAX, f.string());
  DS_USER_CHECK(total == local_total, "checkpoint file '{}': optimizer shard for {} parameters, the model has {}",
                f.string(), total, local_total);
  step_ = meta_int(meta, "step", 0, INT64_MAX, f.string());
  check_identity(meta, f.string(), r, s_.shards, at);
  const size_t index = files_.size();
  auto groups = meta.find("groups");
  if (groups == meta.end()) {  // one range
    if (!own_ep) return;
    const int64_t b = meta_int(meta, "begin", 0, total, f.string());
    const int64_t e = meta_int(meta, "end", b, total, f.string());
    for (const OptimizerStateTensor& t : names_) check_state_header(file.sf, t.name, e - b);
    files_.push_back(std::move(file));
    if (e > b) pieces_.push_back({index, "", b, e, 0});
    return;
  }
  auto sh = meta.find("shared_groups");
  const std::vector<std::string> shared = sh == meta.end() ? std::vector<std::string>{} : split_names(sh->second);
  constexpr size_t kMaxGroups = 16;
  const std::vector<std::string> names = split_names(groups->second);
  DS_USER_CHECK(!names.empty() && names.size() <= kMaxGroups, "checkpoint file '{}': optimizer shard metadata "
                "'groups' must name 1 to {} groups, got {}", f.string(), kMaxGroups, shown(groups->second));
  bool used = false;
  for (const std::string& g : names) {
    DS_USER_CHECK(!g.empty() && g.size() <= 64 && g.find('/') == std::string::npos, "checkpoint file '{}': "
                  "optimizer shard metadata 'groups' holds a malformed name: {}", f.string(), shown(groups->second));
    const std::string key = "pieces." + g;
    auto it = meta.find(key);
    DS_USER_CHECK(it != meta.end(), "checkpoint file '{}': optimizer shard metadata '{}' is missing", f.string(), key);
    const std::vector<Range> ranges = it->second.empty() ? std::vector<Range>{}
                                                         : parse_pieces(it->second, total, f.string(), key);
    int64_t n = 0;
    for (const Range& q : ranges) n += q.size();
    for (const OptimizerStateTensor& t : names_) check_state_header(file.sf, g + "/" + t.name, n);
    // Another expert-parallel rank's file: only its groups shared by every rank.
    if (!own_ep && std::find(shared.begin(), shared.end(), g) == shared.end()) continue;
    int64_t at_elem = 0;
    for (const Range& q : ranges) {
      pieces_.push_back({index, g + "/", q.begin, q.end, at_elem});
      at_elem += q.size();
    }
    used = true;
  }
  if (used || own_ep) files_.push_back(std::move(file));
}

SavedStateFiles::SavedStateFiles(const SavedStep& s, const ShardCoords& at, int64_t local_total,
                                 const OptimizerStates& names)
    : s_(s), names_(names) {
  for (int r = 0; r < s.shards; ++r) open_file(at, r, local_total, true);
  // Pieces of groups shared over the expert-parallel ranks live in every one's files.
  bool grouped = false;
  for (const File& f : files_) grouped = grouped || f.sf.metadata().count("shared_groups");
  if (grouped)
    for (int e = 0; e < s.sizes.ep; ++e)
      if (e != at.ep_rank)
        for (int r = 0; r < s.shards; ++r) open_file(at.at_ep(e), r, local_total, false);
  std::sort(pieces_.begin(), pieces_.end(), [](const Piece& a, const Piece& b) { return a.b < b.b; });
  int64_t pos = 0;
  for (const Piece& q : pieces_) {
    DS_USER_CHECK(q.b == pos, "checkpoint '{}': optimizer shards of tp rank {} / pp rank {} {} at element {}",
                  s.dir.string(), at.tp_rank, at.pp_rank, q.b < pos ? "overlap" : "leave a gap", std::min(q.b, pos));
    pos = q.e;
  }
  DS_USER_CHECK(pos == local_total, "checkpoint '{}': optimizer shards of tp rank {} / pp rank {} cover {} of {} "
                "elements", s.dir.string(), at.tp_rank, at.pp_rank, pos, local_total);
}

void SavedStateFiles::read(size_t state, int64_t lo, int64_t hi, float* dst) {
  const OptimizerStateTensor& t = names_.at(state);
  for (const Piece& q : pieces_) {  // only the overlap of each piece is read, straight into place
    const int64_t a = std::max(q.b, lo), b = std::min(q.e, hi);
    if (a >= b) continue;
    File& f = files_[q.file];
    if (!f.verified && s_.verified && s_.verified->count(f.name)) f.verified = true;
    if (!f.verified && !f.tracked) {
      if (s_.progress)
        s_.progress->set_total(s_.progress->total() + static_cast<int64_t>(fs::file_size(s_.dir / f.name)));
      track_step_file(s_.dir, s_.state, f.name, f.sf, s_.progress);
      f.tracked = true;
    }
    float* out = dst + (a - lo);
    f.sf.read_f32(q.prefix + t.name, q.at + (a - q.b), b - a, out);
    try {
      check_finite(Tensor::from_blob(out, {b - a}, DType::F32), f.sf.path(), q.prefix + t.name, t.non_negative);
    } catch (const UserError&) {
      if (f.tracked) verify(f);  // a corrupt file is named as such, not by the value it turned into
      throw;
    }
  }
}

void SavedStateFiles::verify(File& f) {
  if (f.verified || !f.tracked) return;
  verify_step_reads(s_.dir, s_.state, f.name, f.sf);
  f.verified = true;
  if (s_.verified) s_.verified->insert(f.name);
}

void SavedStateFiles::verify() {
  for (File& f : files_) verify(f);
}

void prepare_host_states(OptimizerStates& state, int64_t n, bool zero) {
  for (OptimizerStateTensor& t : state) {
    if (t.t.defined() && t.t.device().is_cpu() && t.t.dtype() == DType::F32 && t.t.numel() == n) {
      if (zero) t.t.zero_();
    } else {
      t.t = zero ? Tensor::zeros({n}, DType::F32) : Tensor::empty({n}, DType::F32);
    }
  }
}

OptimizerStates state_names_only(const OptimizerStates& state) {
  OptimizerStates out = state;
  for (OptimizerStateTensor& t : out) t.t = Tensor();
  return out;
}

int64_t read_state_range(const SavedStep& s, const ShardCoords& at, int64_t local_total, int64_t begin, int64_t end,
                         OptimizerStates& state) {
  SavedStateFiles files(s, at, local_total, state);
  prepare_host_states(state, end - begin, false);  // the shard's files cover every element (checked)
  for (size_t i = 0; i < state.size(); ++i)
    if (end > begin) files.read(i, begin, end, state[i].t.data<float>());
  files.verify();
  return files.step();
}

}  // namespace ds
