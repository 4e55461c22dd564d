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
