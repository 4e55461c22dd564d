// Document readers for dsprep. Plain text in paragraph mode: lines are grouped
// into documents at blank (or whitespace-only) lines; a document's lines are
// joined with "\n" and carry no trailing newline (the end-of-document token
// follows it). In file mode the whole file, byte for byte, is one document.
#include "apps/dsprep/documents.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lib/core/error.h"
#include "lib/core/json_config.h"

namespace ds::prep {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string::npos;
}

std::ifstream open_input(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) DS_USER_ERROR("input file {} not found or not readable", path);
  return in;
}

void read_paragraphs(const std::string& path, const DocumentFn& on_doc) {
  std::ifstream in = open_input(path);
  std::string line, doc;
  int64_t line_no = 0, first = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF input
    if (is_blank(line)) {
      if (!doc.empty()) on_doc(doc, first);
      doc.clear();
      continue;
    }
    if (doc.empty()) {
      first = line_no;
      doc.swap(line);  // a long one-line document is not copied
      continue;
    }
    doc += '\n';
    doc += line;
  }
  if (in.bad()) DS_USER_ERROR("read error in input file {}", path);
  if (!doc.empty()) on_doc(doc, first);
}

void read_jsonl(const DocumentSource& src, const DocumentFn& on_doc) {
  std::ifstream in = open_input(src.path);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (is_blank(line)) continue;
    const nlohmann::json j = parse_json_text(line, fmt::format("input file {} line {}", src.path, line_no));
    if (!j.is_object() || !j.contains(src.json_key) || !j[src.json_key].is_string())
      DS_USER_ERROR("input file {} line {}: expected an object with a string field \"{}\"",
                    src.path, line_no, src.json_key);
    const std::string& text = j[src.json_key].get_ref<const std::string&>();
    if (!text.empty()) on_doc(text, line_no);
  }
  if (in.bad()) DS_USER_ERROR("read error in input file {}", src.path);
}

}  // namespace

InputFormat resolve_format(const DocumentSource& src) {
  if (src.format != InputFormat::Auto) return src.format;
  return ends_with(src.path, ".jsonl") || ends_with(src.path, ".json") ? InputFormat::Jsonl
                                                                        : InputFormat::Text;
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in = open_input(path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) DS_USER_ERROR("read error in input file {}", path);
  return ss.str();
}

void read_documents(const DocumentSource& src, const DocumentFn& on_doc) {
  if (resolve_format(src) == InputFormat::Jsonl) return read_jsonl(src, on_doc);
  if (src.text_split == TextSplit::Paragraph) return read_paragraphs(src.path, on_doc);
  std::string all = read_whole_file(src.path);
  if (!all.empty()) on_doc(all, 1);
}

}  // namespace ds::prep
