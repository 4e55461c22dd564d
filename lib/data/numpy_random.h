// numpy's default random generator, bit for bit: np.random.default_rng(seed)
// (SeedSequence -> PCG64) and the Generator methods DeepSpeed's data sampler
// (runtime/data_pipeline/data_sampling/data_sampler.py) draws with: random(),
// shuffle() of a 1-d array and choice(n, size, replace=True, p). Its
// curriculum order depends on these draws, so reproducing them exactly is
// what lets the same seed visit the same samples (numpy 1.17+ algorithms:
// SeedSequence's hash mixing, PCG64 XSL-RR 128/64, the 53-bit double,
// Fisher-Yates with masked rejection sampling, inverse-CDF choice).
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ds::data {

class NumpyGenerator {
 public:
  // np.random.default_rng(seed) for a non-negative integer seed.
  explicit NumpyGenerator(uint64_t seed);
  uint64_t next_u64();
  uint32_t next_u32();  // PCG64's buffered half of a 64-bit draw, as numpy's
  double random();      // Generator.random(): [0, 1), 53 bits
  // Generator.shuffle(x) of a 1-d array (in place).
  template <class T>
  void shuffle(std::vector<T>& x) {
    for (std::size_t i = x.size(); i-- > 1;) {
      const std::size_t j = static_cast<std::size_t>(interval(i));
      std::swap(x[i], x[j]);
    }
  }
  // Generator.choice(len(p), size, replace=True, p=p): indices drawn by p
  // (normalised by its sum, as numpy's cdf / cdf[-1]).
  std::vector<int64_t> choice(const std::vector<double>& p, int64_t size);

 private:
  uint64_t interval(uint64_t max);  // uniform in [0, max] (numpy's random_interval)
  unsigned __int128 state_ = 0, inc_ = 0;
  bool has_u32_ = false;
  uint32_t u32_ = 0;
};

}  // namespace ds::data
