// Checkpoint I/O throughput against the file system's own sequential speed,
// in one run on the same directory (docs/benchmarks.md, "Checkpoint I/O").
//
//   bench_ckpt_io [--dir D] [--layers L] [--hidden C] [--repeat K] [--ranks N]
//
// --ranks N (> 1): the aggregate of N ranks on this node, as ZeRO-3 at DP N
// saves and loads: N processes started together, rank r writing its
// optimizer shard (1/N of the state) and rank 0 also the model file, then the
// commit; loading, each rank reads its 1/N of the weights (verifying the
// chunks it touched) and its optimizer range. The peers then run N jobs in
// parallel (N dd processes; fio --numjobs N), each on its own file of 1/N of
// the bytes.
//
// One rank's checkpoint of a GPT-2-shaped model (L layers, hidden C,
// vocabulary 50304): model.safetensors (f32 weights) and its optimizer shard
// (Adam m and v), written the way dstrain writes them (each file to a
// temporary name, fsynced, renamed; then the CRC-32C pass and the commit of
// the step directory and `latest`), then loaded back (each file read once,
// checksummed as it is read; every value checked finite). The same byte counts are then written and read
// by `dd` (conv=fsync) and, when installed, `fio` (sequential 4 MiB blocks,
// end_fsync). Before each read the page cache is dropped when this process
// may (root); otherwise every read, ours and the peers', comes from a warm
// cache and the report says so. Prints GB/s and our / peer ratios.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/ckpt/checkpoint.h"
#include "lib/ckpt/crc32c.h"
#include "lib/ckpt/file_io.h"
#include "lib/core/error.h"
#include "lib/model/layout.h"

namespace fs = std::filesystem;
using namespace ds;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool drop_caches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "3\n";
  f.flush();
  return static_cast<bool>(f);
}

// Runs a shell command; returns its wall time in seconds (negative on failure).
double timed(const std::string& cmd) {
  const double t0 = now_s();
  const int rc = std::system((cmd + " > /dev/null 2>&1").c_str());
  const double t = now_s() - t0;
  return rc == 0 ? t : -1.0;
}

bool have(const char* tool) { return std::system((std::string("command -v ") + tool + " > /dev/null 2>&1").c_str()) == 0; }

void row(const char* what, int64_t bytes, double ours, double peer, const char* peer_name) {
  const double g = 1e9;
  if (peer <= 0) {
    std::printf("%-6s %8.2f GB  ours %6.2f GB/s   %-4s   (not run)\n", what, bytes / g, bytes / g / ours, peer_name);
    return;
  }
  std::printf("%-6s %8.2f GB  ours %6.2f GB/s   %-4s %6.2f GB/s   ours/%s %.2f\n", what, bytes / g, bytes / g / ours,
              peer_name, bytes / g / peer, peer_name, peer / ours);
}

// Runs N processes together: each calls prepare(r) (allocations, untimed),
// then waits for the start; the work prepare returned runs timed. Returns the
// wall time from the start to the last exit, or a negative value when a
// process failed.
double run_ranks(int N, const std::function<std::function<void()>(int)>& prepare) {
  int ready[2], go[2];
  DS_CHECK(::pipe(ready) == 0 && ::pipe(go) == 0, "bench_ckpt_io: pipe failed");
  std::vector<pid_t> pids;
  for (int r = 0; r < N; ++r) {
    const pid_t pid = ::fork();
    DS_CHECK(pid >= 0, "bench_ckpt_io: fork failed");
    if (pid == 0) {
      int rc = 0;
      try {
        const std::function<void()> work = prepare(r);
        char c = 1;
        if (::write(ready[1], &c, 1) != 1 || ::read(go[0], &c, 1) != 1) ::_exit(3);
        work();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_ckpt_io: rank %d: %s\n", r, e.what());
        rc = 1;
      }
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  char c = 0;
  for (int r = 0; r < N; ++r)
    if (::read(ready[0], &c, 1) != 1) break;
  const double t0 = now_s();
  for (int r = 0; r < N; ++r) DS_CHECK(::write(go[1], &c, 1) == 1, "bench_ckpt_io: pipe write failed");
  bool ok = true;
  for (pid_t pid : pids) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  const double t = now_s() - t0;
  for (int fd : {ready[0], ready[1], go[0], go[1]}) ::close(fd);
  return ok ? t : -1.0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/bench_ckpt_io";
  int layers = 12, hidden = 1024, repeat = 2, ranks = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--dir") dir = v;
    else if (a == "--layers") layers = std::stoi(v);
    else if (a == "--hidden") hidden = std::stoi(v);
    else if (a == "--repeat") repeat = std::stoi(v);
    else if (a == "--ranks") ranks = std::stoi(v);
    else {
      std::fprintf(stderr, "bench_ckpt_io: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  ModelConfig m;
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.num_heads = 16;
  m.seq_length = 1024;
  m.max_position_embeddings = 1024;
  m.vocab_size = 50257;
  m.padded_vocab_size = 50304;
  const ModelLayout layout = build_layout(m);
  const int64_t n = layout.total;
  Tensor p = Tensor::empty({n}, DType::F32), mm = Tensor::empty({n}, DType::F32), vv = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) {
    p.data<float>()[i] = 0.001f * static_cast<float>(i % 1009) - 0.5f;
    mm.data<float>()[i] = 1e-4f * static_cast<float>(i % 31);
    vv.data<float>()[i] = 1e-6f * static_cast<float>(i % 17);
  }
  const int64_t bytes = 3 * 4 * n;  // weights + m + v (headers are a few KB)
  std::printf("checkpoint of %lld parameters (L=%d C=%d): %.2f GB per save (model %.2f GB + optimizer shard %.2f GB) "
              "in %s\n",
              static_cast<long long>(n), layers, hidden, bytes / 1e9, 4.0 * n / 1e9, 8.0 * n / 1e9, dir.c_str());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const bool dropped = drop_caches();
  std::printf("CRC-32C: %s\n", crc32c_method());
  std::printf("page cache: %s\n", dropped ? "dropped before every read" : "NOT dropped (not root): reads are warm for all");
  double best_save = 1e30, best_load = 1e30;
  auto range = [&](int r) { return std::make_pair(n * r / ranks, n * (r + 1) / ranks); };  // rank r's partition
  for (int k = 0; k < repeat && ranks > 1; ++k) {
    const std::string ck = dir + "/ck";
    fs::remove_all(ck);
    double t = run_ranks(ranks, [&](int r) -> std::function<void()> {
      const auto [lo, hi] = range(r);
      return [&, r, lo, hi] {
        TrainState st;
        st.iteration = 1 + k;
        CheckpointData d;
        d.layout = &layout;
        d.params = p;
        d.opt_state = adam_states(mm.view(lo, {hi - lo}), vv.view(lo, {hi - lo}));
        d.opt_begin = lo;
        d.opt_end = hi;
        d.opt_step = 1;
        d.rank = r;
        d.world = ranks;
        write_checkpoint_files(ck, st, d, nlohmann::json::object());
      };
    });
    DS_CHECK(t > 0, "bench_ckpt_io: a rank's save failed");
    const double c0 = now_s();
    commit_checkpoint(ck, 1 + k);  // rank 0, after the barrier
    t += now_s() - c0;
    std::printf("save %d (%d ranks): %.2f s\n", k, ranks, t);
    best_save = std::min(best_save, t);
    if (dropped) drop_caches();
    t = run_ranks(ranks, [&](int r) -> std::function<void()> {
      const auto [lo, hi] = range(r);
      // The rank's own buffers, touched before the start (the trainer's are
      // its store's, allocated at start-up).
      auto lp = std::make_shared<Tensor>(Tensor::zeros({hi - lo}, DType::F32));
      auto lm = std::make_shared<Tensor>(lp->clone()), lv = std::make_shared<Tensor>(lp->clone());
      return [&, lo, hi, lp, lm, lv] {
        CheckpointData d;
        d.layout = &layout;
        d.receive_params = [&](const CheckpointData::ParamsReader& read) { read(lo, hi, lp->data<float>()); };
        d.opt_state = adam_states(*lm, *lv);
        d.opt_begin = lo;
        d.opt_end = hi;
        TrainState got;
        DS_CHECK(load_checkpoint(ck, got, d), "the checkpoint did not load");
        DS_CHECK(lp->data<float>()[hi - lo - 1] == p.data<float>()[hi - 1] &&
                     lv->data<float>()[(hi - lo) / 2] == vv.data<float>()[lo + (hi - lo) / 2],
                 "loaded values differ");
      };
    });
    DS_CHECK(t > 0, "bench_ckpt_io: a rank's load failed");
    std::printf("load %d (%d ranks): %.2f s\n", k, ranks, t);
    best_load = std::min(best_load, t);
  }
  for (int k = 0; k < repeat && ranks == 1; ++k) {
    const std::string ck = dir + "/ck";
    fs::remove_all(ck);
    TrainState st;
    st.iteration = 1 + k;
    CheckpointData d;
    d.layout = &layout;
    d.params = p;
    d.opt_state = adam_states(mm, vv);
    d.opt_end = n;
    d.opt_step = 1;
    double t0 = now_s();
    write_checkpoint_files(ck, st, d, nlohmann::json::object());
    const double t_files = now_s() - t0;
    commit_checkpoint(ck, st.iteration);
    const double t_save = now_s() - t0;
    std::printf("save %d: files %.2f s, checksums + commit %.2f s\n", k, t_files, t_save - t_files);
    best_save = std::min(best_save, t_save);
    if (dropped) {  // the checksum pass alone, cold (how much of the load is the disk)
      drop_caches();
      const double c0 = now_s();
      for (const auto& e : fs::directory_iterator(ck + "/global_step" + std::to_string(st.iteration)))
        if (e.path().extension() == ".safetensors") file_crc32c(e.path().string());
      std::printf("load %d: checksum pass alone, cold: %.2f s\n", k, now_s() - c0);
      drop_caches();
    }
    Tensor lp = Tensor::zeros({n}, DType::F32), lm = lp.clone(), lv = lp.clone();
    CheckpointData r;
    r.layout = &layout;
    // As the trainer loads (Trainer::load_or_init): the weights through
    // receive_params into the rank's own store, here the whole of it.
    r.receive_params = [&](const CheckpointData::ParamsReader& read) { read(0, n, lp.data<float>()); };
    r.opt_state = adam_states(lm, lv);
    r.opt_end = n;
    TrainState got;
    t0 = now_s();
    DS_CHECK(load_checkpoint(ck, got, r), "bench_ckpt_io: the checkpoint did not load");
    best_load = std::min(best_load, now_s() - t0);
    std::printf("load %d: %.2f s\n", k, now_s() - t0);
    DS_CHECK(lp.data<float>()[n - 1] == p.data<float>()[n - 1] && lv.data<float>()[n / 2] == vv.data<float>()[n / 2],
             "bench_ckpt_io: loaded values differ");
  }
  fs::remove_all(dir + "/ck");
  // The peers write and read the same byte count, fsynced, on the same directory.
  const int64_t mib = (bytes + (1 << 20) - 1) >> 20;
  const std::string f = dir + "/peer.bin";
  double dd_w = 1e30, dd_r = 1e30, fio_w = 1e30, fio_r = 1e30;
  const bool fio = have("fio");
  for (int k = 0; k < repeat; ++k) {
    // N jobs in parallel, each on its own file of 1/N of the bytes.
    auto each = [&](const std::string& cmd) {  // cmd with {} for the job's file
      std::string all = "sh -c '";
      for (int j = 0; j < ranks; ++j) {
        std::string c = cmd;
        c.replace(c.find("{}"), 2, f + "." + std::to_string(j));
        all += c + " & ";
      }
      return all + "wait'";
    };
    for (int j = 0; j < ranks; ++j) fs::remove(f + "." + std::to_string(j));
    double t = timed(each("dd if=/dev/zero of={} bs=4M count=" + std::to_string(mib / 4 / ranks) + " conv=fsync"));
    if (t > 0) dd_w = std::min(dd_w, t);
    if (dropped) drop_caches();
    t = timed(each("dd if={} of=/dev/null bs=4M"));
    if (t > 0) dd_r = std::min(dd_r, t);
    for (int j = 0; j < ranks; ++j) fs::remove(f + "." + std::to_string(j));
    if (!fio) continue;
    for (const auto& e : fs::directory_iterator(dir))  // fio's files of the run before
      if (e.path().filename().string().rfind("seq.", 0) == 0) fs::remove(e.path());
    const std::string common = " --name=seq --directory=" + dir + " --bs=4M --size=" + std::to_string(mib / ranks) +
                               "M --ioengine=psync --numjobs=" + std::to_string(ranks) + " --group_reporting";
    t = timed("fio" + common + " --rw=write --end_fsync=1");
    if (t > 0) fio_w = std::min(fio_w, t);
    if (dropped) drop_caches();
    t = timed("fio" + common + " --rw=read");
    if (t > 0) fio_r = std::min(fio_r, t);
  }
  fs::remove_all(dir);
  auto ok = [](double t) { return t < 1e29 ? t : -1.0; };
  std::printf("best of %d, %d rank(s); ours: save = write + fsync + CRC-32C pass + commit, load = read (checksummed "
              "as read) + checks\n",
              repeat, ranks);
  row("save", bytes, best_save, ok(dd_w), "dd");
  row("load", bytes, best_load, ok(dd_r), "dd");
  if (fio) {
    row("save", bytes, best_save, ok(fio_w), "fio");
    row("load", bytes, best_load, ok(fio_r), "fio");
  }
  return 0;
}
