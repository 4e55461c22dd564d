// PyTorch's zip checkpoints (lib/ckpt/torch_file.h) against PyTorch itself:
// test/ckpt/torch_fixtures.py saves state dicts with torch.save (several
// dtypes, a transposed view, views sharing a storage at an offset, nested
// containers, plain values, an nn.Linear's OrderedDict of Parameters) and
// each tensor's contiguous bytes; every tensor read here must equal them bit
// for bit. A file whose unpickling would call os.system, the legacy format,
// truncations and byte flips are one UserError naming the file, and nothing
// is executed. Skips when /usr/bin/python3 cannot import torch.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lib/ckpt/torch_file.h"
#include "lib/core/error.h"
#include "test/skip.h"

using namespace ds;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

struct Fixtures {
  fs::path dir;
  int rc = 0;
  Fixtures() {
    dir = fs::temp_directory_path() / ("dstrain_torchfile_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    const char* src = std::getenv("DS_SOURCE_DIR");
    const std::string script = std::string(src ? src : ".") + "/test/ckpt/torch_fixtures.py";
    const int s = std::system(("/usr/bin/python3 " + script + " " + dir.string() + " > " + dir.string() +
                               ".log 2>&1").c_str());
    rc = WIFEXITED(s) ? WEXITSTATUS(s) : -1;
  }
  ~Fixtures() {
    fs::remove_all(dir);
    fs::remove(dir.string() + ".log");
  }
  std::string log() const { return slurp(dir.string() + ".log"); }
};

std::string error_of(const std::string& path) {
  try {
    TorchFile f = TorchFile::open(path);
    for (const auto& [name, t] : f.tensors()) (void)f.get(name);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("PyTorch zip files read as PyTorch wrote them; nothing else is executed or accepted") {
  const Fixtures fx;
  if (fx.rc == 77) DS_SKIP(fx.log());
  INFO(fx.log());
  REQUIRE(fx.rc == 0);

  SECTION("every tensor equals PyTorch's bytes, plain values read as text") {
    std::ifstream exp(fx.dir / "expected.txt");
    std::string line;
    int checked = 0;
    while (std::getline(exp, line)) {
      std::istringstream ls(line);
      std::string file, name, dtype;
      ls >> file >> name >> dtype;
      Shape shape;
      for (int64_t d; ls >> d;) shape.push_back(d);
      INFO(file << " " << name);
      const TorchFile f = TorchFile::open((fx.dir / (file + ".pt")).string());
      REQUIRE(f.has(name));
      const Tensor t = f.get(name);
      CHECK(dtype_name(t.dtype()) == dtype);
      CHECK(t.shape() == shape);
      const std::string want = slurp(fx.dir / (file + "." + name + ".bin"));
      REQUIRE(want.size() == t.nbytes());
      CHECK(std::memcmp(want.data(), t.raw(), want.size()) == 0);
      ++checked;
    }
    CHECK(checked == 12);
    const TorchFile ok = TorchFile::open((fx.dir / "ok.pt").string());
    CHECK(ok.tensors().size() == 10);
    CHECK(ok.tensors().at("t").stride == std::vector<int64_t>{1, 6});  // the transposed view, as saved
    CHECK(ok.tensors().at("v").offset == 2);
    CHECK(ok.tensors().at("v").storage == ok.tensors().at("w").storage);
    const auto& s = ok.scalars();
    CHECK(s.at("n") == "7");
    CHECK(s.at("neg") == "-123456789012");
    CHECK(s.at("x") == "0.25");
    CHECK(s.at("s") == "hello");
    CHECK(s.at("flag") == "True");
    CHECK(s.at("none") == "None");
    CHECK(s.at("lst.1") == "3");
  }

  SECTION("a pickle that would call os.system is refused, naming the global; nothing runs") {
    const std::string err = error_of((fx.dir / "evil.pt").string());
    CHECK_THAT(err, Contains((fx.dir / "evil.pt").string()) && Contains("the global posix.system") &&
                        Contains("nothing is executed"));
    CHECK(err.find('\n') == std::string::npos);
    CHECK_FALSE(fs::exists(fx.dir / "pwned"));
  }

  SECTION("the legacy format and files that are not PyTorch's are one line naming them") {
    CHECK_THAT(error_of((fx.dir / "legacy.pt").string()), Contains("legacy format"));
    spit(fx.dir / "text.pt", "hello, this is not a checkpoint at all");
    CHECK_THAT(error_of((fx.dir / "text.pt").string()), Contains("is not a zip archive"));
    CHECK_THAT(error_of((fx.dir / "missing.pt").string()), Contains("cannot be opened"));
  }

  SECTION("a container holding itself and nesting past 64 levels are refused") {
    CHECK_THAT(error_of((fx.dir / "cycle.pt").string()), Contains("changed after it was placed in another"));
    CHECK_THAT(error_of((fx.dir / "deep.pt").string()), Contains("nested more than 64 deep"));
  }

  SECTION("every truncation and many byte flips are a UserError, never a crash") {
    const std::string bytes = slurp(fx.dir / "ok.pt");
    const fs::path cut = fx.dir / "cut.pt";
    for (size_t n = 0; n < bytes.size(); n += std::max<size_t>(1, bytes.size() / 300)) {
      spit(cut, bytes.substr(0, n));
      INFO("first " << n << " bytes");
      CHECK_FALSE(error_of(cut.string()).empty());
    }
    int errors = 0;
    for (size_t at = 0; at < bytes.size(); at += 7) {
      std::string b = bytes;
      b[at] = static_cast<char>(b[at] ^ 0x5a);
      spit(cut, b);
      errors += error_of(cut.string()).empty() ? 0 : 1;  // a flip in tensor data reads as other values
    }
    CHECK(errors > 0);
  }
}

// ---- writing: TorchSaveWriter (lib/ckpt/torch_save.h) ------------------------

#include "lib/ckpt/torch_save.h"

TEST_CASE("crc32_zip is zip's CRC-32") {
  REQUIRE(crc32_zip("123456789", 9) == 0xCBF43926u);
  REQUIRE(crc32_zip("", 0) == 0u);
  const std::string s(1000, 'x');
  REQUIRE(crc32_zip(s.data() + 3, 997, crc32_zip(s.data(), 3)) == crc32_zip(s.data(), 1000));
}

// A state dict written by TorchSaveWriter reads back through TorchFile and
// through torch.load(weights_only=True) with the same values, also with
// every member's size and offset in zip64 fields.
TEST_CASE("TorchSaveWriter: read back by TorchFile and by torch.load") {
  const fs::path dir = fs::temp_directory_path() / ("dstrain_torchsave_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<std::pair<std::string, Shape>> decl = {
      {"rwtransformer.h.0.attn.c_attn.weight", {3, 4}}, {"v_head.weight", {1, 5}}, {"scale", {}},
      {"x.bias", {7}}, {"three", {2, 3, 2}}};
  auto value = [](size_t k, int64_t i) { return static_cast<float>(k) * 100.f + static_cast<float>(i) * 0.25f - 1.f; };
  for (uint64_t zip64_from : {uint64_t{0xffffffffull}, uint64_t{64}}) {
    DYNAMIC_SECTION("zip64 from " << zip64_from) {
      TorchSaveWriter w;
      for (const auto& [n, s] : decl) w.declare_f32(n, s);
      const fs::path path = dir / "pytorch_model.bin";
      size_t asked = 0;
      w.write_streamed(
          path.string(),
          [&](const std::string& name) {
            REQUIRE(name == decl[asked].first);  // in declaration order, once each
            Tensor t = Tensor::empty(decl[asked].second, DType::F32);
            for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = value(asked, i);
            ++asked;
            return t;
          },
          nullptr, zip64_from);
      REQUIRE(asked == decl.size());
      const TorchFile f = TorchFile::open(path.string());
      REQUIRE(f.tensors().size() == decl.size());
      for (size_t k = 0; k < decl.size(); ++k) {
        const Tensor t = f.get(decl[k].first);
        REQUIRE(t.shape() == decl[k].second);
        for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(t.data<float>()[i] == value(k, i));
      }
      // torch.load, restricted to tensors: each tensor's shape and values. With
      // zip64 fields in a small file Python's zipfile checks the archive and
      // every member's CRC instead: PyTorch's zip reader (miniz) checks a
      // zip64 offset's member against the file's size as if the offset were
      // 0xffffffff, which only a file over 4 GiB satisfies.
      const bool small64 = zip64_from < 0xffffffffull;
      const std::string py =
          small64 ? "import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1])\nassert z.testzip() is None\n"
                    "print(' '.join(i.filename for i in z.infolist()))\n"
                  : "import sys\ntry:\n    import torch\nexcept ImportError:\n    sys.exit(77)\n"
                    "sd = torch.load(sys.argv[1], weights_only=True)\n"
                    "for k, v in sd.items():\n"
                    "    print(k, list(v.shape), ' '.join('%.9g' % x for x in v.reshape(-1).tolist()))\n";
      spit(dir / "load.py", py);
      const int s = std::system(("/usr/bin/python3 " + (dir / "load.py").string() + " " + path.string() + " > " +
                                 (dir / "load.out").string() + " 2>&1").c_str());
      const int rc = WIFEXITED(s) ? WEXITSTATUS(s) : -1;
      if (rc == 77) {
        WARN("torch is not importable by /usr/bin/python3: torch.load not checked");
      } else {
        INFO(slurp(dir / "load.out"));
        REQUIRE(rc == 0);
        std::string want;  // the same lines, built here
        if (small64) {
          want = "archive/data.pkl archive/byteorder";
          for (size_t k = 0; k < decl.size(); ++k) want += " archive/data/" + std::to_string(k);
          want += " archive/version\n";
        }
        for (size_t k = 0; k < decl.size() && !small64; ++k) {
          want += decl[k].first + " [";
          for (size_t d = 0; d < decl[k].second.size(); ++d)
            want += (d ? ", " : "") + std::to_string(decl[k].second[d]);
          want += "] ";
          for (int64_t i = 0; i < shape_numel(decl[k].second); ++i) {
            char b[32];
            std::snprintf(b, sizeof b, "%s%.9g", i ? " " : "", static_cast<double>(value(k, i)));
            want += b;
          }
          want += "\n";
        }
        REQUIRE(slurp(dir / "load.out") == want);
      }
    }
  }
  fs::remove_all(dir);
}
