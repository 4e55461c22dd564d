// Checkpoint loader validation: every malformed state.json field, optimizer
// shard, `latest` pointer, flipped bit and non-finite value is one UserError
// naming the file (and field or tensor), thrown before anything is loaded,
// both in process (load_checkpoint, open_saved_step) and through dsconvert.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lib/ckpt/checkpoint.h"
#include "lib/ckpt/crc32c.h"
#include "lib/ckpt/file_io.h"
#include "lib/ckpt/reshape.h"
#include "lib/ckpt/safetensors.h"
#include "lib/core/error.h"
#include "lib/core/json_config.h"
#include "lib/model/tp_shard.h"
#include "test/model/tiny_model.h"
#include "test/skip.h"

using namespace ds;
namespace fs = std::filesystem;
using Catch::Contains;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

// A saved tiny checkpoint (2 optimizer shards) in a fresh directory.
struct Saved {
  fs::path dir, step;
  ModelConfig cfg = test::tiny_model(false);
  ModelLayout layout = build_layout(cfg);

  explicit Saved(const std::string& name) {
    dir = fs::temp_directory_path() / ("dstrain_loadval_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    const int64_t n = layout.total, half = n / 2;
    Tensor p = Tensor::empty({n}, DType::F32), m = p.clone(), v = p.clone();
    for (int64_t i = 0; i < n; ++i) {
      p.data<float>()[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
      m.data<float>()[i] = -0.001f * static_cast<float>(i % 13);
      v.data<float>()[i] = 0.002f * static_cast<float>(i % 7);
    }
    TrainState st;
    st.iteration = 3;
    st.consumed_samples = 24;
    for (int r = 0; r < 2; ++r) {
      const int64_t lo = r ? half : 0, hi = r ? n : half;
      CheckpointData d{&layout, p, adam_states(m.view(lo, {hi - lo}), v.view(lo, {hi - lo})), lo, hi, 3, r, 2};
      write_checkpoint_files(dir.string(), st, d, nlohmann::json{{"note", 1}});
    }
    commit_checkpoint(dir.string(), 3);
    step = dir / "global_step3";
  }
  ~Saved() { fs::remove_all(dir); }

  // Loads into a fresh single-rank destination; returns the error text ("" if none).
  // receive: the weights through receive_params, as the trainer loads them
  // (read in one pass and verified after; the destination may be written).
  std::string load_error(bool with_model = false, bool receive = false) const {
    Tensor p = Tensor::zeros({layout.total}, DType::F32), m = p.clone(), v = p.clone();
    CheckpointData d{&layout, p, adam_states(m, v), 0, layout.total, 0, 0, 1, {}};
    if (with_model) d.model = &cfg;
    if (receive) {
      d.params = Tensor();
      d.receive_params = [&](const CheckpointData::ParamsReader& read) { read(0, layout.total, p.data<float>()); };
    }
    TrainState st;
    try {
      load_checkpoint(dir.string(), st, d);
    } catch (const UserError& e) {
      for (int64_t i = 0; i < layout.total && !receive; ++i)
        if (p.data<float>()[i] != 0.0f) return "destination touched";
      return e.what();
    }
    return "";
  }
  // state.json edited as JSON, its own checksum and format_version dropped (as
  // an older, unversioned file) so the field checks run.
  template <class Fn>
  void edit_state(Fn fn) const {
    nlohmann::json j = nlohmann::json::parse(slurp(step / "state.json"));
    j.erase("state_checksum");
    j.erase("format_version");
    fn(j);
    spit(step / "state.json", j.dump(1));
  }
};

// One line, naming the file.
void expect_one_line(const std::string& err, const std::string& file, const std::string& what) {
  INFO(err);
  CHECK(err.find('\n') == std::string::npos);
  CHECK_THAT(err, Contains(file) && Contains(what));
}

std::string dsconvert_exe() {
  const char* bin = std::getenv("DS_BINARY_DIR");
  return std::string(bin ? bin : ".") + "/apps/dsconvert/dsconvert";
}

// Runs dsconvert with `args`, its output in `out`: it must exit 1 with one
// line of output, which is returned.
std::string dsconvert_fails(const std::string& args, const fs::path& out) {
  const int rc = std::system((dsconvert_exe() + " " + args + " > " + out.string() + " 2>&1").c_str());
  const std::string text = slurp(out);
  INFO(text);
  REQUIRE(WIFEXITED(rc));
  CHECK(WEXITSTATUS(rc) == 1);
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
  return text;
}

}  // namespace

TEST_CASE("crc32c matches the standard check value") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
  const std::string s(1000, 'x');
  CHECK(crc32c(s.data() + 3, 997, crc32c(s.data(), 3)) == crc32c(s.data(), 1000));
  uint32_t c = 0;
  CHECK(parse_crc32c_text(crc32c_text(0xdeadbeef), c));
  CHECK(c == 0xdeadbeefu);
  CHECK_FALSE(parse_crc32c_text("crc32c:DEADBEEF", c));
  CHECK_FALSE(parse_crc32c_text("crc32c:123", c));
}

TEST_CASE("crc32c: the CRC32-instruction path equals the table on every length and alignment") {
  std::vector<unsigned char> buf(3 * 8192 * 4 + 100);
  uint64_t x = 88172645463325252ull;
  for (unsigned char& b : buf) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<unsigned char>(x);
  }
  INFO("method " << crc32c_method());
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{4095}, size_t{3 * 8192 - 1},
                   size_t{3 * 8192}, size_t{3 * 8192 + 1}, size_t{6 * 8192 + 13}, size_t{3 * 8192 * 4}})
    for (size_t off : {0, 1, 3, 7})
      for (uint32_t start : {0u, 0x12345678u}) {
        CAPTURE(n, off, start);
        CHECK(crc32c(buf.data() + off, n, start) == crc32c_portable(buf.data() + off, n, start));
      }
  // Continuing a CRC in pieces gives the whole buffer's.
  const size_t total = buf.size() - 8;
  CHECK(crc32c(buf.data() + 30000, total - 30000, crc32c(buf.data(), 30000)) == crc32c_portable(buf.data(), total));
}

TEST_CASE("crc32c_combine joins the CRCs of two parts") {
  std::vector<unsigned char> buf(100000);
  uint64_t x = 1234567;
  for (unsigned char& b : buf) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<unsigned char>(x);
  }
  for (size_t cut : {size_t{0}, size_t{1}, size_t{8}, size_t{4097}, size_t{50000}, buf.size() - 1, buf.size()}) {
    CAPTURE(cut);
    const uint32_t a = crc32c(buf.data(), cut), b = crc32c(buf.data() + cut, buf.size() - cut);
    CHECK(crc32c_combine(a, b, buf.size() - cut) == crc32c(buf.data(), buf.size()));
  }
}

TEST_CASE("a safetensors file checksums its reads in any order; checksum() equals the file's CRC-32C") {
  const fs::path f = fs::temp_directory_path() / ("dstrain_tracked_" + std::to_string(::getpid()) + ".safetensors");
  SafetensorsWriter w;
  for (int k = 0; k < 3; ++k) {
    Tensor t = Tensor::empty({1000 + 37 * k}, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.25f * static_cast<float>(i * (k + 3) % 101);
    w.add("t" + std::to_string(k), t);
  }
  w.write(f.string());
  const uint32_t want = file_crc32c(f.string());
  std::vector<float> out(2000);
  SECTION("nothing read: the whole file") {
    SafetensorsFile sf = SafetensorsFile::open(f.string());
    sf.track_reads();
    CHECK(sf.checksum() == want);
  }
  SECTION("parts, backwards, overlapping, one twice") {
    SafetensorsFile sf = SafetensorsFile::open(f.string());
    sf.track_reads();
    sf.read_f32("t2", 500, 574, out.data());
    sf.read_f32("t1", 0, 1037, out.data());
    sf.read_f32("t0", 10, 20, out.data());
    sf.read_f32("t0", 15, 100, out.data());  // overlaps the read before
    sf.read_f32("t2", 500, 574, out.data());  // read again
    const SafetensorsFile copy = sf;          // copies share the record
    CHECK(copy.checksum() == want);
    CHECK(sf.checksum() == want);
  }
  SECTION("a batch of scattered slices (gaps streamed over) reads the right values") {
    SafetensorsFile sf = SafetensorsFile::open(f.string());
    sf.track_reads();
    // Every third run of 7 elements of each tensor, as a TP rank's row slices,
    // plus one read that starts a tensor and one that ends the file.
    std::vector<SafetensorsFile::F32Read> reads;
    std::vector<std::pair<int, int64_t>> where;  // (tensor, first) of each read
    int64_t at = 0;
    for (int k = 0; k < 3; ++k)
      for (int64_t first = (k == 1 ? 0 : 5); first + 7 <= 1000 + 37 * k; first += 21) {
        reads.push_back({"t" + std::to_string(k), first, 7, out.data() + at});
        where.push_back({k, first});
        at += 7;
      }
    reads.push_back({"t2", 1074 - 3, 3, out.data() + at});
    where.push_back({2, 1074 - 3});
    std::reverse(reads.begin(), reads.end());  // any order in
    std::reverse(where.begin(), where.end());
    std::fill(out.begin(), out.end(), -1.0f);
    sf.read_f32(reads);
    for (size_t r = 0; r < reads.size(); ++r)
      for (int64_t i = 0; i < reads[r].count; ++i) {
        const int k = where[r].first;
        const int64_t e = where[r].second + i;
        INFO("t" << k << "[" << e << "]");
        REQUIRE(reads[r].out[i] == 0.25f * static_cast<float>(e * (k + 3) % 101));
      }
    CHECK(sf.checksum() == want);
  }
  SECTION("a byte changed on disk after the reads is caught by the rest") {
    SafetensorsFile sf = SafetensorsFile::open(f.string());
    sf.track_reads();
    sf.read_f32("t0", 0, 1000, out.data());
    std::string bytes = slurp(f);
    bytes[bytes.size() - 2] ^= 0x01;  // in t2, not read
    spit(f, bytes);
    CHECK(sf.checksum() != want);
  }
  fs::remove(f);
}

TEST_CASE("a saved checkpoint records checksums and loads") {
  Saved s("ok");
  const StepState st = read_step_state(s.step);
  CHECK(st.checksums.size() == 3);  // model + 2 shards
  CHECK(st.checksums.count("model.safetensors"));
  CHECK(s.load_error().empty());
  CHECK(s.load_error(true).empty());
  CHECK(s.load_error(false, true).empty());
}

TEST_CASE("malformed state.json fields are one line naming the file and field") {
  Saved s("fields");
  const std::string file = (s.step / "state.json").string();
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"empty layout entry", [](auto& j) { j["layout"][3] = nlohmann::json::array(); }, "'layout[3]'"},
      {"dropped shape", [](auto& j) { j["layout"][2].erase(1); }, "'layout[2]'"},
      {"empty shape", [](auto& j) { j["layout"][1][1] = nlohmann::json::array(); }, "'layout[1][1]'"},
      {"string dimension", [](auto& j) { j["layout"][0][1][0] = "40"; }, "'layout[0][1][0]'"},
      {"negative dimension", [](auto& j) { j["layout"][0][1][0] = -40; }, "'layout[0][1][0]'"},
      {"huge shape", [](auto& j) { j["layout"][0][1] = {1 << 30, 1 << 30}; }, "'layout[0][1]'"},
      {"name not a string", [](auto& j) { j["layout"][0][0] = 7; }, "'layout[0]'"},
      {"layout not a list", [](auto& j) { j["layout"] = "x"; }, "'layout'"},
      {"layout missing", [](auto& j) { j.erase("layout"); }, "'layout' is missing"},
      {"iteration text", [](auto& j) { j["iteration"] = "abc"; }, "'iteration'"},
      {"iteration negative", [](auto& j) { j["iteration"] = -1; }, "'iteration'"},
      {"iteration float", [](auto& j) { j["iteration"] = 1.5; }, "'iteration'"},
      {"iteration too big", [](auto& j) { j["iteration"] = 18446744073709551615ull; }, "'iteration'"},
      {"loss scale", [](auto& j) { j["loss_scale"] = 0; }, "'loss_scale'"},
      {"shards zero", [](auto& j) { j["optimizer_shards"] = 0; }, "'optimizer_shards'"},
      {"shards text", [](auto& j) { j["optimizer_shards"] = "2"; }, "'optimizer_shards'"},
      {"tp huge", [](auto& j) { j["tensor_model_parallel_size"] = 1LL << 40; }, "'tensor_model_parallel_size'"},
      {"pp zero", [](auto& j) { j["pipeline_model_parallel_size"] = 0; }, "'pipeline_model_parallel_size'"},
      {"checksum text", [](auto& j) { j["checksums"]["model.safetensors"] = "md5:1"; }, "'checksums.model"},
      {"checksum path", [](auto& j) { j["checksums"]["../x"] = "crc32c:00000000"; }, "'checksums'"},
      {"config", [](auto& j) { j["config"] = 3; }, "'config'"},
      {"not an object", [](auto& j) { j = nlohmann::json::array(); }, "JSON object"},
  };
  const std::string original = slurp(s.step / "state.json");
  for (const Case& c : cases) {
    INFO(c.what);
    s.edit_state(c.edit);
    expect_one_line(s.load_error(), file, c.needle);
    expect_one_line(s.load_error(true), file, c.needle);
    CHECK_THROWS_WITH(open_saved_step(s.step.string(), s.cfg), Contains(file) && Contains(c.needle));
    spit(s.step / "state.json", original);
  }
  CHECK(s.load_error().empty());
}

TEST_CASE("optimizer shards: metadata, dtype, shape and ranges are checked") {
  Saved s("shards");
  const fs::path shard = s.step / "optim_rank00001_of_00002.safetensors";
  const SafetensorsFile sf = SafetensorsFile::open(shard.string());
  Tensor m = sf.get("exp_avg"), v = sf.get("exp_avg_sq");
  const auto meta = sf.metadata();
  s.edit_state([](auto& j) { j.erase("checksums"); });  // rewritten shards: test the checks, not the checksums
  auto rewrite = [&](const std::function<void(SafetensorsWriter&, std::map<std::string, std::string>&)>& fn) {
    SafetensorsWriter w;
    auto md = meta;
    fn(w, md);
    for (const auto& [k, val] : md) w.set_metadata(k, val);
    w.write(shard.string());
  };
  const std::string f = shard.string();
  SECTION("I32 data is not read as F32") {
    Tensor i32 = Tensor::empty(m.shape(), DType::I32);
    rewrite([&](auto& w, auto&) { w.add("exp_avg", i32), w.add("exp_avg_sq", v); });
    expect_one_line(s.load_error(), f, "'exp_avg' is I32");
  }
  SECTION("swapped moments (a negative exp_avg_sq) are refused") {
    rewrite([&](auto& w, auto&) { w.add("exp_avg", v), w.add("exp_avg_sq", m); });
    expect_one_line(s.load_error(), f, "'exp_avg_sq' holds the negative value");
  }
  SECTION("a moment of the wrong shape") {
    rewrite([&](auto& w, auto&) { w.add("exp_avg", m.view(0, {m.numel() - 1})), w.add("exp_avg_sq", v); });
    expect_one_line(s.load_error(), f, "'exp_avg' is F32");
  }
  SECTION("non-numeric metadata") {
    rewrite([&](auto& w, auto& md) { w.add("exp_avg", m), w.add("exp_avg_sq", v), md["begin"] = "12abc"; });
    expect_one_line(s.load_error(), f, "metadata 'begin'");
  }
  SECTION("metadata out of range") {
    rewrite([&](auto& w, auto& md) { w.add("exp_avg", m), w.add("exp_avg_sq", v), md["end"] = "99999999999"; });
    expect_one_line(s.load_error(), f, "metadata 'end'");
  }
  SECTION("a shard copied to another rank's name") {
    rewrite([&](auto& w, auto& md) { w.add("exp_avg", m), w.add("exp_avg_sq", v), md["rank"] = "0"; });
    expect_one_line(s.load_error(), f, "says rank 0");
  }
  SECTION("overlapping shards leave a gap") {
    const std::string begin = meta.at("begin");
    rewrite([&](auto& w, auto& md) {
      md["begin"] = std::to_string(std::stoll(begin) - 1);
      md["end"] = std::to_string(std::stoll(md["end"]) - 1);
      w.add("exp_avg", m), w.add("exp_avg_sq", v);
    });
    expect_one_line(s.load_error(), s.step.string(), "overlap");
  }
  SECTION("NaN in a moment") {
    Tensor bad = m.clone();
    bad.data<float>()[5] = std::nanf("");
    rewrite([&](auto& w, auto&) { w.add("exp_avg", bad), w.add("exp_avg_sq", v); });
    expect_one_line(s.load_error(), f, "'exp_avg' holds nan at element 5");
  }
}

// A shard written with sharding groups (ZeRO 1-3 with expert parallelism,
// docs/formats.md): per group a list of pieces and the tensors
// "<group>/<state>". Shard 1 of the tiny checkpoint is rewritten so: loaded,
// its values land where the pieces say; malformed, one line naming the file.
TEST_CASE("optimizer shards with sharding groups: pieces are read and checked") {
  Saved s("groups");
  const fs::path shard = s.step / "optim_rank00001_of_00002.safetensors";
  const SafetensorsFile sf = SafetensorsFile::open(shard.string());
  const Tensor m = sf.get("exp_avg"), v = sf.get("exp_avg_sq");
  const auto meta = sf.metadata();
  const int64_t b = std::stoll(meta.at("begin")), e = std::stoll(meta.at("end")), n = e - b, k = n / 3;
  s.edit_state([](auto& j) { j.erase("checksums"); });
  // Group "x" holds [b, b + k) and [b + 2k, e); group "y" [b + k, b + 2k).
  auto cat = [](const Tensor& t, int64_t k1, int64_t k2) {
    Tensor out = Tensor::empty({t.numel() - (k2 - k1)}, DType::F32);
    out.view(0, {k1}).copy_from(t.view(0, {k1}));
    out.view(k1, {t.numel() - k2}).copy_from(t.view(k2, {t.numel() - k2}));
    return out;
  };
  const Tensor xm = cat(m, k, 2 * k), xv = cat(v, k, 2 * k), ym = m.view(k, {k}), yv = v.view(k, {k});
  auto rewrite = [&](const std::function<void(SafetensorsWriter&, std::map<std::string, std::string>&)>& fn) {
    SafetensorsWriter w;
    auto md = meta;
    md.erase("begin");
    md.erase("end");
    md["groups"] = "x,y";
    md["shared_groups"] = "x";
    md["pieces.x"] = fmt::format("{}:{},{}:{}", b, b + k, b + 2 * k, e);
    md["pieces.y"] = fmt::format("{}:{}", b + k, b + 2 * k);
    fn(w, md);
    for (const auto& [key, val] : md) w.set_metadata(key, val);
    w.write(shard.string());
  };
  auto tensors = [&](SafetensorsWriter& w) {
    w.add("x/exp_avg", xm), w.add("x/exp_avg_sq", xv), w.add("y/exp_avg", ym), w.add("y/exp_avg_sq", yv);
  };
  const std::string f = shard.string();
  SECTION("a well-formed grouped shard loads into the same values") {
    rewrite([&](auto& w, auto&) { tensors(w); });
    Tensor p = Tensor::zeros({s.layout.total}, DType::F32), lm = p.clone(), lv = p.clone();
    CheckpointData d{&s.layout, p, adam_states(lm, lv), 0, s.layout.total, 0, 0, 1, {}};
    TrainState st;
    REQUIRE(load_checkpoint(s.dir.string(), st, d));
    for (int64_t i = 0; i < n; ++i) {
      CHECK(lm.data<float>()[b + i] == m.data<float>()[i]);
      CHECK(lv.data<float>()[b + i] == v.data<float>()[i]);
    }
  }
  SECTION("malformed pieces") {
    rewrite([&](auto& w, auto& md) { tensors(w), md["pieces.y"] = "12-40"; });
    expect_one_line(s.load_error(), f, "metadata 'pieces.y' must list sorted ranges");
  }
  SECTION("pieces past the end of the layout") {
    rewrite([&](auto& w, auto& md) { tensors(w), md["pieces.y"] = fmt::format("{}:{}", e, e + k); });
    expect_one_line(s.load_error(), f, "metadata 'pieces.y' must list sorted ranges");
  }
  SECTION("unsorted pieces") {
    rewrite([&](auto& w, auto& md) {
      tensors(w), md["pieces.x"] = fmt::format("{}:{},{}:{}", b + 2 * k, e, b, b + k);
    });
    expect_one_line(s.load_error(), f, "metadata 'pieces.x' must list sorted ranges");
  }
  SECTION("a group without its pieces") {
    rewrite([&](auto& w, auto& md) { tensors(w), md.erase("pieces.y"); });
    expect_one_line(s.load_error(), f, "metadata 'pieces.y' is missing");
  }
  SECTION("a malformed group name") {
    rewrite([&](auto& w, auto& md) { tensors(w), md["groups"] = "x,y/z"; });
    expect_one_line(s.load_error(), f, "'groups' holds a malformed name");
  }
  SECTION("a group's state tensor missing") {
    rewrite([&](auto& w, auto&) { w.add("x/exp_avg", xm), w.add("x/exp_avg_sq", xv), w.add("y/exp_avg", ym); });
    expect_one_line(s.load_error(), f, "no tensor 'y/exp_avg_sq'");
  }
  SECTION("a state tensor shorter than its pieces") {
    rewrite([&](auto& w, auto&) {
      w.add("x/exp_avg", xm.view(0, {xm.numel() - 1})), w.add("x/exp_avg_sq", xv), w.add("y/exp_avg", ym),
          w.add("y/exp_avg_sq", yv);
    });
    expect_one_line(s.load_error(), f, "'x/exp_avg' is F32");
  }
  SECTION("pieces that overlap the other shard") {
    rewrite([&](auto& w, auto& md) {
      tensors(w), md["pieces.x"] = fmt::format("{}:{},{}:{}", b - 1, b + k - 1, b + 2 * k, e);
    });
    expect_one_line(s.load_error(), s.step.string(), "overlap");
  }
  SECTION("a negative second moment in a group") {
    Tensor bad = yv.clone();
    bad.data<float>()[0] = -1.0f;
    rewrite([&](auto& w, auto&) {
      w.add("x/exp_avg", xm), w.add("x/exp_avg_sq", xv), w.add("y/exp_avg", ym), w.add("y/exp_avg_sq", bad);
    });
    expect_one_line(s.load_error(), f, "'y/exp_avg_sq' holds the negative value");
  }
}

TEST_CASE("NaN or Inf in the weights is refused naming the file and tensor") {
  Saved s("nan");
  const fs::path model = s.step / "model.safetensors";
  const SafetensorsFile sf = SafetensorsFile::open(model.string());
  SafetensorsWriter w;
  std::vector<Tensor> keep;
  for (const std::string& name : sf.names()) {
    keep.push_back(sf.get(name));
    if (name == "layers.1.attn.proj.weight") keep.back().data<float>()[2] = INFINITY;
    w.add(name, keep.back());
  }
  w.set_metadata("format", "dstrain");
  w.write(model.string());
  s.edit_state([](auto& j) { j.erase("checksums"); });
  expect_one_line(s.load_error(), model.string(), "'layers.1.attn.proj.weight' holds inf");
  expect_one_line(s.load_error(true), model.string(), "'layers.1.attn.proj.weight' holds inf");
  expect_one_line(s.load_error(false, true), model.string(), "'layers.1.attn.proj.weight' holds inf");
}

TEST_CASE("a flipped bit in any checkpoint file is caught before loading") {
  Saved s("flip");
  for (const char* name : {"model.safetensors", "optim_rank00000_of_00002.safetensors",
                           "optim_rank00001_of_00002.safetensors"}) {
    INFO(name);
    const fs::path f = s.step / name;
    const std::string original = slurp(f);
    for (size_t at : {size_t{3}, original.size() / 2, original.size() - 1}) {
      std::string bytes = original;
      bytes[at] ^= 0x10;
      spit(f, bytes);
      expect_one_line(s.load_error(), f.string(), "");
      CHECK_THAT(s.load_error(), Contains("corrupt") || Contains("safetensors file"));
      if (at != 3) CHECK_THAT(s.load_error(true), Contains(f.string()) && Contains("checksum"));
      expect_one_line(s.load_error(false, true), f.string(), "");
      CHECK_THAT(s.load_error(false, true), Contains("corrupt") || Contains("safetensors file"));
    }
    spit(f, original);
  }
  // A flip that turns a value into NaN: the file is named corrupt (its
  // checksum), not by the value it turned into.
  for (const char* name : {"model.safetensors", "optim_rank00001_of_00002.safetensors"}) {
    INFO(name);
    const fs::path f = s.step / name;
    const std::string original = slurp(f);
    std::string bytes = original;
    bytes[bytes.size() - 1] = 0x7f;  // the last f32: exponent all ones, a quiet NaN
    bytes[bytes.size() - 2] = static_cast<char>(0xc0);
    spit(f, bytes);
    expect_one_line(s.load_error(), f.string(), "corrupt");
    expect_one_line(s.load_error(false, true), f.string(), "corrupt");
    spit(f, original);
  }
  // state.json: a changed digit still parses, its own checksum catches it.
  const fs::path state = s.step / "state.json";
  const std::string original = slurp(state);
  std::string bytes = original;
  const size_t at = bytes.find("\"consumed_samples\": 24");
  REQUIRE(at != std::string::npos);
  bytes[at + 20] = '5';
  spit(state, bytes);
  expect_one_line(s.load_error(), state.string(), "state_checksum");
  spit(state, original);
  CHECK(s.load_error().empty());
}

TEST_CASE("an older checkpoint without checksums loads") {
  Saved s("old");
  s.edit_state([](auto& j) {
    j.erase("checksums");
    for (auto& e : j["layout"]) (void)e;
  });
  CHECK(s.load_error().empty());
  CHECK(read_step_state(s.step).checksums.empty());
}

// Deleting state_checksum (or the file checksums) must not turn the
// self-check off: a state.json that declares a format_version carries both.
TEST_CASE("a versioned state.json without its checksums is refused") {
  Saved s("version");
  const fs::path state = s.step / "state.json";
  const std::string original = slurp(state);
  const nlohmann::json saved = nlohmann::json::parse(original);
  CHECK(saved.value("format_version", 0) == kStateFormatVersion);
  nlohmann::json j = saved;
  j.erase("state_checksum");
  spit(state, j.dump(1));
  expect_one_line(s.load_error(), state.string(), "no state_checksum");
  CHECK_THAT(s.load_error(true), Contains("no state_checksum"));
  j.erase("checksums");  // re-checksummed without the file checksums
  spit(state, step_state_text(j));
  expect_one_line(s.load_error(), state.string(), "no file checksums");
  j = saved;  // a newer format, correctly checksummed
  j.erase("state_checksum");
  j["format_version"] = kStateFormatVersion + 1;
  const std::string compact = j.dump();
  j["state_checksum"] = crc32c_text(crc32c(compact.data(), compact.size()));
  spit(state, j.dump(1));
  expect_one_line(s.load_error(), state.string(), "format_version 2");
  spit(state, original);
  CHECK(s.load_error().empty());
}

TEST_CASE("'latest' may only name a global_stepN directory inside the load directory") {
  Saved s("latest");
  const fs::path latest = s.dir / "latest";
  fs::create_directories(s.dir / "elsewhere");
  for (const std::string& text : {std::string("../global_step3"), std::string("/etc"), std::string("elsewhere"),
                                  std::string("global_step3/../global_step3"), std::string("global_step"),
                                  std::string("global_step-3"), std::string(""), std::string(5000, '9'),
                                  std::string("global_step3\nglobal_step4")}) {
    INFO(text.substr(0, 40));
    spit(latest, text);
    expect_one_line(s.load_error(), latest.string(), "");
  }
  CHECK_THROWS_WITH(find_step_dir(s.dir.string(), "../global_step3"), Contains("global_step<N>"));
  spit(latest, "global_step3\n");
  CHECK(s.load_error().empty());
}

TEST_CASE("deeply nested JSON is refused naming the file") {
  Saved s("deep");
  spit(s.step / "state.json", std::string(70000, '[') + std::string(70000, ']'));
  expect_one_line(s.load_error(), (s.step / "state.json").string(), "deeper than 64 levels");
  const fs::path cfg = s.dir / "config.json";
  spit(cfg, "{\"a\": " + std::string(70000, '{'));
  CHECK_THROWS_WITH(load_json_file(cfg.string()), Contains(cfg.string()) && Contains("deeper than"));
  // Strings may hold brackets: they do not count.
  CHECK(parse_json_text("{\"a\": \"" + std::string(1000, '[') + "\\\"\"}", "x").is_object());
  CHECK(json_too_deep_at("[[[]]]", 3) == std::string::npos);
  CHECK(json_too_deep_at("[[[[]]]]", 3) == 3);
}

TEST_CASE("dsconvert answers a broken checkpoint with one error line, exit 1", "[dsconvert]") {
  if (!fs::exists(dsconvert_exe())) DS_SKIP("dsconvert not built at " << dsconvert_exe());
  Saved s("dsconvert");
  s.edit_state([](auto& j) { j["layout"][5] = nlohmann::json::array(); });
  const std::string text =
      dsconvert_fails("--load " + s.dir.string() + " --export-hf " + (s.dir / "hf").string(), s.dir / "out.txt");
  CHECK_THAT(text, Contains("dsconvert: error:") && Contains("'layout[5]'"));
  CHECK_FALSE(fs::exists(s.dir / "hf"));
}

TEST_CASE("a checkpoint of another head count (same shapes) is refused naming the heads") {
  Saved s("heads");
  s.edit_state([&](auto& j) { j["config"]["model"] = {{"num_heads", s.cfg.num_heads * 2}}; });
  expect_one_line(s.load_error(true), s.step.string(), "has 4 attention heads, the configured model 2");
  s.edit_state([&](auto& j) { j["config"]["model"] = {{"num_heads", s.cfg.num_heads}, {"num_key_value_heads", 1}}; });
  expect_one_line(s.load_error(true), s.step.string(), "has 1 key-value heads, the configured model 2");
  s.edit_state([&](auto& j) { j["config"]["model"] = {{"num_heads", s.cfg.num_heads}, {"num_key_value_heads", 2}}; });
  CHECK(s.load_error(true) == "");
}

TEST_CASE("dsconvert never replaces a file or a directory that is not a previous export", "[dsconvert]") {
  if (!fs::exists(dsconvert_exe())) DS_SKIP("dsconvert not built at " << dsconvert_exe());
  Saved s("export_target");
  const fs::path file = s.dir / "notes.txt", dir = s.dir / "mine", out = s.dir / "out.txt";
  spit(file, "keep me");
  fs::create_directories(dir);
  spit(dir / "train.py", "keep me too");
  for (const auto& [target, needle] : {std::pair{file.string(), "exists and is not a directory"},
                                       std::pair{dir.string() + "/", "already holds 'train.py'"},
                                       std::pair{(file / "sub").string(), "is not a directory, so nothing"}}) {
    const std::string text = dsconvert_fails("--load " + s.dir.string() + " --export-hf " + target, out);
    CHECK_THAT(text, Contains("dsconvert: error: --export-hf '" + target + "'") && Contains(needle));
  }
  CHECK(slurp(file) == "keep me");
  CHECK(slurp(dir / "train.py") == "keep me too");
}

TEST_CASE("JSON config integers outside their type are errors naming the key") {
  const nlohmann::json j = nlohmann::json::parse(
      R"({"big": 1e50, "over_int": 3e9, "whole": 4.0, "half": 2.5, "u64": 18446744073709551615, "neg": -1})");
  JsonSection s(j, "model");
  CHECK_THROWS_WITH(s.get<int>("big", 0), Contains("'model.big'"));  // found by fuzz_config (UBSan)
  CHECK_THROWS_WITH(s.get<int>("over_int", 0), Contains("'model.over_int' must be an integer in"));
  CHECK(s.get<int64_t>("over_int", 0) == 3000000000LL);
  CHECK(s.get<int>("whole", 0) == 4);
  CHECK_THROWS_WITH(s.get<int>("half", 0), Contains("'model.half' must be an integer"));
  CHECK_THROWS_WITH(s.get<int64_t>("u64", 0), Contains("'model.u64'"));
  CHECK(s.get<uint64_t>("u64", 0) == 18446744073709551615ull);
  CHECK_THROWS_WITH(s.get<uint32_t>("neg", 0), Contains("'model.neg'"));
}

TEST_CASE("a rank reading part of a large checkpoint verifies the chunks it reads and reads nothing else") {
  // GPT-2 blocks of hidden 768, 4 layers: a 113 MB model file, 7 chunks of
  // 16 MiB. Pipeline stage 1 of 2 holds layers 2-3 and the tied wte.
  ModelConfig cfg = test::tiny_model(false);
  cfg.num_layers = 4;
  cfg.hidden_size = 768;
  cfg.num_heads = 4;
  const ModelLayout full = build_layout(cfg);
  const int64_t n = full.total;
  const fs::path dir = fs::temp_directory_path() / ("dstrain_chunks_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Tensor p = Tensor::empty({n}, DType::F32), m = Tensor::zeros({n}, DType::F32), v = m.clone();
  for (int64_t i = 0; i < n; ++i) p.data<float>()[i] = 1e-3f * static_cast<float>(i % 1013) - 0.4f;
  TrainState st;
  st.iteration = 1;
  CheckpointData d{&full, p, adam_states(m, v), 0, n, 1, 0, 1, {}};
  write_checkpoint_files(dir.string(), st, d, nlohmann::json::object());
  commit_checkpoint(dir.string(), 1);
  const fs::path step = dir / "global_step1", file = step / "model.safetensors";
  const uint64_t size = fs::file_size(file);
  const StepState state = read_step_state(step);
  REQUIRE(state.chunk_checksums.count("model.safetensors"));
  const StepState::ChunkSums& sums = state.chunk_checksums.at("model.safetensors");
  CHECK(sums.chunk_bytes == kChecksumChunk);
  REQUIRE(sums.crcs.size() == (size + kChecksumChunk - 1) / kChecksumChunk);
  REQUIRE(sums.crcs.size() >= 6);

  // Stage 1 reads its weights, verifies the chunks they lie in (and the
  // header's), and reads less than the file.
  auto load_stage = [&](int stage, std::vector<float>& out) {
    const ModelLayout local = build_layout(cfg, {.pp = 2, .pp_rank = stage});
    const SavedStep s = open_saved_step(step.string(), cfg);
    const SafetensorsFile model = open_saved_model_tracked(s);
    out.assign(static_cast<size_t>(local.total), 0.f);
    read_local_params(s, model, local, 0, local.total, out.data());
    verify_saved_model(s, model);
    return model.checksummed_bytes();
  };
  const ModelLayout stage1 = build_layout(cfg, {.pp = 2, .pp_rank = 1});
  std::vector<float> got;
  const uint64_t read1 = load_stage(1, got);
  INFO("stage 1 checksummed " << read1 << " of " << size << " bytes");
  CHECK(read1 < size * 3 / 4);
  Tensor want = Tensor::empty({stage1.total}, DType::F32);
  slice_tp_params(stage1, full, p, want);
  REQUIRE(std::memcmp(got.data(), want.raw(), want.nbytes()) == 0);

  // A chunk that holds only stage 0's weights (layers 0-1): a flipped byte
  // there fails stage 0's load, naming the file and the chunk, and not stage
  // 1's, which never reads it. A flip in stage 1's weights fails stage 1.
  const SafetensorsFile sf = SafetensorsFile::open(file.string());
  uint64_t lo = size, hi = 0;  // the file bytes of layers 0 and 1
  for (const ParamSpec& q : full.params)
    if (q.layer == 0 || q.layer == 1) {
      lo = std::min(lo, sf.file_offset(q.name));
      hi = std::max(hi, sf.file_offset(q.name) + static_cast<uint64_t>(q.numel) * 4);
    }
  const uint64_t chunk = (lo + kChecksumChunk - 1) / kChecksumChunk;  // the first whole chunk inside [lo, hi)
  REQUIRE((chunk + 1) * kChecksumChunk <= hi);
  const std::string original = slurp(file);
  auto flip_at = [&](uint64_t at) {
    std::string bytes = original;
    bytes[at] ^= 0x04;
    spit(file, bytes);
  };
  flip_at(chunk * kChecksumChunk + 4097);
  CHECK_NOTHROW(load_stage(1, got));
  try {
    load_stage(0, got);
    FAIL("stage 0 loaded a corrupt chunk");
  } catch (const UserError& e) {
    expect_one_line(e.what(), file.string(), "corrupt");
    CHECK_THAT(e.what(), Contains("bytes [" + std::to_string(chunk * kChecksumChunk) + ", "));
  }
  flip_at(sf.file_offset("layers.3.mlp.fc.weight") + 8);
  CHECK_THROWS_WITH(load_stage(1, got), Contains("corrupt"));
  // The header's chunk is always verified: a flip there (in any tensor) fails
  // every rank's load.
  flip_at(sf.file_offset(sf.names().front()) < kChecksumChunk ? sf.file_offset(sf.names().front()) : 100);
  CHECK_THROWS(load_stage(1, got));
  spit(file, original);
  // A state.json whose chunk checksums do not join to the file's checksum is refused.
  {
    nlohmann::json j = nlohmann::json::parse(slurp(step / "state.json"));
    j.erase("state_checksum");
    j.erase("format_version");
    j["chunk_checksums"]["model.safetensors"]["crc32c"][0] = "crc32c:00000000";
    spit(step / "state.json", j.dump(1));
    std::vector<float> out;
    CHECK_THROWS_WITH(load_stage(1, out), Contains("do not join"));
  }
  fs::remove_all(dir);
}
