// Shell quoting and splitting: the only place command strings for remote shells are built from words.
#include "launcher/shell.h"

#include "lib/core/error.h"

namespace ds::launch {

std::string shell_quote(const std::string& s) {
  if (s.empty()) return "''";
  bool safe = true;
  for (unsigned char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.' || c == '/' || c == ':' || c == ',' || c == '=' ||
              c == '+' || c == '@' || c == '%';
    if (!ok) {
      safe = false;
      break;
    }
  }
  if (safe) return s;
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\"'\"'";
    else out += c;
  }
  return out + "'";
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) {
    if (!out.empty()) out += ' ';
    out += shell_quote(w);
  }
  return out;
}

std::vector<std::string> shell_split(const std::string& s, const std::string& what) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) out.push_back(cur), cur.clear(), in_word = false;
    } else if (c == '\'') {
      size_t end = s.find('\'', i + 1);
      DS_USER_CHECK(end != std::string::npos, "{}: unterminated single quote in '{}'", what, s);
      cur += s.substr(i + 1, end - i - 1);
      i = end;
      in_word = true;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < s.size() && s[j] != '"'; ++j) {
        if (s[j] == '\\' && j + 1 < s.size() &&
            (s[j + 1] == '"' || s[j + 1] == '\\' || s[j + 1] == '$' || s[j + 1] == '`'))
          ++j;
        cur += s[j];
      }
      DS_USER_CHECK(j < s.size(), "{}: unterminated double quote in '{}'", what, s);
      i = j;
      in_word = true;
    } else if (c == '\\' && i + 1 < s.size()) {
      cur += s[++i];
      in_word = true;
    } else {
      cur += c;
      in_word = true;
    }
  }
  if (in_word) out.push_back(cur);
  return out;
}

}  // namespace ds::launch
