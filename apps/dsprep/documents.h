// Reading input documents for dsprep: JSON lines ({"text": ...} per line) or
// plain text (documents separated by blank lines, or one document per file).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace ds::prep {

enum class InputFormat { Auto, Text, Jsonl };
enum class TextSplit { Paragraph, File };

struct DocumentSource {
  std::string path;
  InputFormat format = InputFormat::Auto;  // Auto: .jsonl/.json -> Jsonl, else Text
  TextSplit text_split = TextSplit::Paragraph;
  std::string json_key = "text";
};

InputFormat resolve_format(const DocumentSource& src);

// Called with a document and the line of its file it starts on (1 for a
// whole file), so that errors about it can name it.
using DocumentFn = std::function<void(std::string_view doc, int64_t line)>;

// Calls on_doc for every non-empty document in order. Bad input throws
// ds::UserError naming the file (and line for JSON lines).
void read_documents(const DocumentSource& src, const DocumentFn& on_doc);

// The whole file as bytes (UserError naming it when missing).
std::string read_whole_file(const std::string& path);

}  // namespace ds::prep
