// dsprep's tokenization pass. Documents are read in input order into batches;
// each worker thread has its own tokenizer (as each of Megatron's worker
// processes builds one) and takes every N-th document of the batch; the batch
// is then written in order, so the output does not depend on --workers.
#include "apps/dsprep/tokenize.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "lib/core/error.h"
#include "lib/data/bpe.h"
#include "lib/data/indexed_dataset.h"

namespace ds::prep {

namespace {

constexpr size_t kBatchDocs = 512;
constexpr size_t kBatchBytes = size_t{4} << 20;

class Progress {
 public:
  Progress(int64_t interval, int64_t total_bytes) : interval_(interval), total_(total_bytes) {}
  // Called after each written document.
  void document(int64_t docs, int64_t bytes) {
    if (interval_ <= 0 || docs % interval_ != 0) return;
    const double dt = seconds();
    const double rate = dt > 0 ? bytes / dt : 0;
    const double left = total_ > bytes && rate > 0 ? (total_ - bytes) / rate : 0;
    std::fprintf(stderr,
                 "dsprep: processed %lld documents (%.0f docs/s, %.2f MB/s), %.0f%% of the input, ETA %.0f s\n",
                 static_cast<long long>(docs), dt > 0 ? docs / dt : 0.0, rate / 1e6,
                 total_ > 0 ? 100.0 * std::min<double>(bytes, total_) / total_ : 100.0, left);
  }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  int64_t interval_, total_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

// Tokenizes docs[i] into ids[i] on `tokenizers.size()` threads.
void encode_batch(const std::vector<std::unique_ptr<data::Tokenizer>>& tokenizers, bool append_eod,
                  const std::vector<std::string>& docs, std::vector<std::vector<int32_t>>& ids) {
  ids.resize(docs.size());
  auto work = [&](size_t w) {
    for (size_t i = w; i < docs.size(); i += tokenizers.size()) {
      ids[i].clear();
      tokenizers[w]->encode_document(docs[i], append_eod, ids[i]);
    }
  };
  if (tokenizers.size() == 1 || docs.size() < 2) return work(0);
  std::vector<std::thread> threads;
  std::exception_ptr error;
  std::mutex mu;
  for (size_t w = 0; w < tokenizers.size(); ++w)
    threads.emplace_back([&, w] {
      try {
        work(w);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

int64_t total_input_bytes(const std::vector<DocumentSource>& sources) {
  int64_t n = 0;
  std::error_code ec;
  for (const DocumentSource& s : sources) {
    const auto size = std::filesystem::file_size(s.path, ec);
    if (!ec) n += static_cast<int64_t>(size);
  }
  return n;
}

}  // namespace

TokenizeStats tokenize_to_dataset(const std::vector<DocumentSource>& sources, const TokenizeOptions& opt) {
  DS_USER_CHECK(opt.workers >= 1 && opt.workers <= 1024, "--workers must be in [1, 1024], got {}", opt.workers);
  DS_USER_CHECK(opt.log_interval >= 0, "--log-interval must be >= 0, got {}", opt.log_interval);
  Progress progress(opt.log_interval, total_input_bytes(sources));
  std::vector<std::unique_ptr<data::Tokenizer>> toks;
  toks.push_back(data::load_tokenizer(opt.tokenizer));
  const data::TokenizerInfo info = toks[0]->info();
  if (opt.append_eod && info.eod_id < 0)
    DS_USER_ERROR("--append-eod: the {} tokenizer has no end-of-document token ({}); pass --no-append-eod",
                  data::tokenizer_kind_name(info.kind),
                  info.kind == data::TokenizerKind::GPT2BPE ? data::kEndOfText : "no eos piece");
  for (int w = 1; w < opt.workers; ++w) toks.push_back(data::load_tokenizer(opt.tokenizer));
  const auto dtype =
      opt.dtype == "auto" ? data::token_dtype_for_vocab(info.vocab_size) : data::parse_token_dtype(opt.dtype);
  data::IndexedDatasetWriter writer(opt.output_prefix, dtype);
  TokenizeStats st;
  std::vector<std::string> docs;
  std::vector<std::vector<int32_t>> ids;
  size_t batch_bytes = 0;
  auto flush = [&] {
    encode_batch(toks, opt.append_eod, docs, ids);
    for (size_t i = 0; i < docs.size(); ++i) {
      st.bytes += static_cast<int64_t>(docs[i].size());
      if (ids[i].empty()) {
        ++st.empty_documents;  // encodes to nothing (e.g. only spaces for SentencePiece): not written
      } else {
        writer.add_document(ids[i]);
        ++st.documents;
      }
      progress.document(st.documents + st.empty_documents, st.bytes);
    }
    docs.clear();
    batch_bytes = 0;
  };
  for (const DocumentSource& src : sources)
    read_documents(src, [&](std::string_view doc) {
      docs.emplace_back(doc);
      batch_bytes += doc.size();
      if (docs.size() >= kBatchDocs || batch_bytes >= kBatchBytes) flush();
    });
  flush();
  DS_USER_CHECK(st.documents > 0, "no documents found in the input (--input {})", sources.front().path);
  writer.finalize();
  st.tokens = writer.num_tokens();
  st.vocab_size = info.vocab_size;
  st.dtype = data::token_dtype_name(dtype);
  st.seconds = progress.seconds();
  return st;
}

}  // namespace ds::prep
