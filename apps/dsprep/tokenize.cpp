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
#include "lib/core/progress.h"
#include "lib/data/bpe.h"
#include "lib/data/indexed_dataset.h"

namespace ds::prep {

namespace {

constexpr size_t kBatchDocs = 512;
constexpr size_t kBatchBytes = size_t{4} << 20;

// Where a document starts, for errors about it.
struct DocPlace {
  const std::string* path;
  int64_t line;
};

// Tokenizes docs[i] into ids[i] on `tokenizers.size()` threads. A document the
// tokenizer refuses is a UserError naming its file and line.
void encode_batch(const std::vector<std::unique_ptr<data::Tokenizer>>& tokenizers, bool append_eod,
                  const std::vector<std::string>& docs, const std::vector<DocPlace>& places,
                  std::vector<std::vector<int32_t>>& ids) {
  ids.resize(docs.size());
  auto work = [&](size_t w) {
    for (size_t i = w; i < docs.size(); i += tokenizers.size()) {
      ids[i].clear();
      try {
        tokenizers[w]->encode_document(docs[i], append_eod, ids[i]);
      } catch (const UserError& e) {
        DS_USER_ERROR("input file {} line {}: {}", *places[i].path, places[i].line, e.what());
      }
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
  // Megatron's --log-interval: a plain line every N documents; on a terminal one
  // status line redrawn at most every two seconds.
  Progress progress(ProgressOptions{.label = "dsprep: tokenizing",
                                    .unit = ProgressUnit::Bytes,
                                    .count_name = "documents",
                                    .total = total_input_bytes(sources),
                                    .style = opt.log_interval > 0 ? ProgressStyle::Auto : ProgressStyle::Off,
                                    .every = opt.log_interval});
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
  std::vector<DocPlace> places;
  std::vector<std::vector<int32_t>> ids;
  size_t batch_bytes = 0;
  auto flush = [&] {
    encode_batch(toks, opt.append_eod, docs, places, ids);
    for (size_t i = 0; i < docs.size(); ++i) {
      st.bytes += static_cast<int64_t>(docs[i].size());
      if (ids[i].empty()) {
        ++st.empty_documents;  // encodes to nothing (e.g. only spaces for SentencePiece): not written
      } else {
        writer.add_document(ids[i]);
        ++st.documents;
      }
      progress.update(st.bytes, st.documents + st.empty_documents);
    }
    docs.clear();
    places.clear();
    batch_bytes = 0;
  };
  for (const DocumentSource& src : sources)
    read_documents(src, [&](std::string_view doc, int64_t line) {
      docs.emplace_back(doc);
      places.push_back({&src.path, line});
      batch_bytes += doc.size();
      if (docs.size() >= kBatchDocs || batch_bytes >= kBatchBytes) flush();
    });
  flush();
  DS_USER_CHECK(st.documents > 0, "no documents found in the input (--input {})", sources.front().path);
  progress.finish();
  writer.finalize();
  st.tokens = writer.num_tokens();
  st.vocab_size = info.vocab_size;
  st.dtype = data::token_dtype_name(dtype);
  st.seconds = progress.seconds();
  return st;
}

}  // namespace ds::prep
