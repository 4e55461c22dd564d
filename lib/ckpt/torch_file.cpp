// PyTorch zip checkpoints, read without executing anything (torch_file.h).
#include "lib/ckpt/torch_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <functional>

#include "lib/core/error.h"

namespace ds {
namespace {

constexpr uint64_t kMaxPickle = uint64_t(1) << 30;  // data.pkl holds structure only
constexpr size_t kMaxStack = size_t(1) << 20;
constexpr size_t kMaxTensors = size_t(1) << 20;

uint16_t le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t le32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t le64(const unsigned char* p) { return le32(p) | (static_cast<uint64_t>(le32(p + 4)) << 32); }

// A value of the restricted unpickler.
struct Obj;
using ObjP = std::shared_ptr<Obj>;
struct Obj {
  enum Kind { None, Bool, Int, Float, Str, Bytes, List, Tuple, Dict, Global, Storage, TensorV, Mark } kind = None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                                  // Str, Bytes; Global: "module.name"; Storage: dtype name
  std::vector<ObjP> items;                        // List, Tuple
  std::vector<std::pair<ObjP, ObjP>> dict;        // Dict
  std::string key;                                // Storage: its key
  TorchTensorInfo tensor;                         // TensorV
  // A container placed in another is frozen (what torch.save writes is a
  // tree, each container filled before it is placed), so no cycle can form;
  // depth: the levels below it, bounded so that freeing it cannot recurse deep.
  bool frozen = false;
  int depth = 0;
};

ObjP make(Obj::Kind k) {
  auto o = std::make_shared<Obj>();
  o->kind = k;
  return o;
}

// The storage classes a tensor names, by their element type.
bool storage_dtype(const std::string& global, std::string& dtype) {
  static const char* kTypes[] = {"Float", "Half", "BFloat16", "Double", "Long", "Int", "Short", "Char", "Byte", "Bool"};
  for (const char* t : kTypes)
    if (global == std::string("torch.") + t + "Storage") {
      dtype = t;
      return true;
    }
  return false;
}

class Unpickler {
 public:
  Unpickler(const std::string& file, const std::string& data) : file_(file), d_(data) {}

  ObjP run() {
    while (true) {
      const int op = byte();
      switch (op) {
        case 0x80: byte(); break;               // PROTO
        case 0x95: take(8); break;              // FRAME
        case '.': return pop();                 // STOP
        case '(': push(make(Obj::Mark)); break;  // MARK
        case '}': case 'd': {                   // EMPTY_DICT, DICT (from mark)
          ObjP o = make(Obj::Dict);
          if (op == 'd') pairs_into(o, pop_mark());
          push(o);
          break;
        }
        case ']': case 'l': {                   // EMPTY_LIST, LIST
          ObjP o = make(Obj::List);
          if (op == 'l')
            for (ObjP& v : pop_mark()) add_item(o, v);
          push(o);
          break;
        }
        case ')': push(make(Obj::Tuple)); break;  // EMPTY_TUPLE
        case 't': {
          ObjP o = make(Obj::Tuple);
          for (ObjP& v : pop_mark()) add_item(o, v);
          push(o);
          break;
        }
        case 0x85: case 0x86: case 0x87: {  // TUPLE1-3
          ObjP o = make(Obj::Tuple);
          std::vector<ObjP> vs(static_cast<size_t>(op - 0x84));
          for (size_t k = vs.size(); k-- > 0;) vs[k] = pop();
          for (ObjP& v : vs) add_item(o, v);
          push(o);
          break;
        }
        case 'N': push(make(Obj::None)); break;
        case 0x88: case 0x89: {  // NEWTRUE, NEWFALSE
          ObjP o = make(Obj::Bool);
          o->b = op == 0x88;
          push(o);
          break;
        }
        case 'J': push_int(static_cast<int32_t>(le32(take(4)))); break;  // BININT
        case 'K': push_int(byte()); break;                              // BININT1
        case 'M': push_int(le16(take(2))); break;                       // BININT2
        case 0x8a: {                                                    // LONG1
          const int n = byte();
          fail_if(n > 8, "an integer of more than 64 bits");
          const unsigned char* p = take(static_cast<size_t>(n));
          uint64_t v = 0;
          for (int k = 0; k < n; ++k) v |= static_cast<uint64_t>(p[k]) << (8 * k);
          if (n > 0 && n < 8 && (p[n - 1] & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign-extend
          push_int(static_cast<int64_t>(v));
          break;
        }
        case 'G': {  // BINFLOAT: big-endian double
          const unsigned char* p = take(8);
          uint64_t v = 0;
          for (int k = 0; k < 8; ++k) v = (v << 8) | p[k];
          ObjP o = make(Obj::Float);
          std::memcpy(&o->f, &v, 8);
          push(o);
          break;
        }
        case 'X': push_str(Obj::Str, le32(take(4))); break;      // BINUNICODE
        case 0x8c: push_str(Obj::Str, byte()); break;            // SHORT_BINUNICODE
        case 0x8d: push_str(Obj::Str, le64(take(8))); break;     // BINUNICODE8
        case 'B': push_str(Obj::Bytes, le32(take(4))); break;    // BINBYTES
        case 'C': push_str(Obj::Bytes, byte()); break;           // SHORT_BINBYTES
        case 'q': memo_put(byte()); break;                       // BINPUT
        case 'r': memo_put(le32(take(4))); break;                // LONG_BINPUT
        case 0x94: memo_put(memo_.size()); break;                // MEMOIZE
        case 'h': push(memo_get(byte())); break;                 // BINGET
        case 'j': push(memo_get(le32(take(4)))); break;          // LONG_BINGET
        case '0': pop(); break;                                  // POP
        case '1': pop_mark(); break;                             // POP_MARK
        case '2': push(top()); break;                            // DUP
        case 's': {                                              // SETITEM
          ObjP v = pop(), k = pop();
          ObjP d = top();
          fail_if(d->kind != Obj::Dict, "SETITEM on something other than a dict");
          pairs_into(d, {k, v});
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<ObjP> kv = pop_mark();
          ObjP d = top();
          fail_if(d->kind != Obj::Dict, "SETITEMS on something other than a dict");
          pairs_into(d, kv);
          break;
        }
        case 'a': {  // APPEND
          ObjP v = pop();
          fail_if(top()->kind != Obj::List, "APPEND to something other than a list");
          add_item(top(), v);
          break;
        }
        case 'e': {  // APPENDS
          std::vector<ObjP> vs = pop_mark();
          fail_if(top()->kind != Obj::List, "APPENDS to something other than a list");
          for (ObjP& v : vs) add_item(top(), v);
          break;
        }
        case 'c': {  // GLOBAL "module\nname\n"
          const std::string module = line(), name = line();
          push(global(module, name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          ObjP name = pop(), module = pop();
          fail_if(name->kind != Obj::Str || module->kind != Obj::Str, "STACK_GLOBAL of non-strings");
          push(global(module->s, name->s));
          break;
        }
        case 'Q': {  // BINPERSID: ('storage', type, key, location, numel)
          ObjP pid = pop();
          fail_if(pid->kind != Obj::Tuple || pid->items.size() != 5 || pid->items[0]->kind != Obj::Str ||
                      pid->items[0]->s != "storage" || pid->items[1]->kind != Obj::Global ||
                      pid->items[2]->kind != Obj::Str || pid->items[4]->kind != Obj::Int,
                  "a persistent id that is not a storage");
          ObjP st = make(Obj::Storage);
          fail_if(!storage_dtype(pid->items[1]->s, st->s), "a storage of type " + pid->items[1]->s);
          st->key = pid->items[2]->s;
          st->i = pid->items[4]->i;
          push(st);
          break;
        }
        case 'R': {  // REDUCE: callable(*args)
          ObjP args = pop(), fn = pop();
          fail_if(fn->kind != Obj::Global || args->kind != Obj::Tuple, "REDUCE of something that is not a call");
          push(call(fn->s, args->items));
          break;
        }
        case 'b': {  // BUILD: a state dict's attributes (its _metadata: module versions) are dropped
          ObjP state = pop();
          const bool empty = state->kind == Obj::None || (state->kind == Obj::Dict && state->dict.empty()) ||
                             (state->kind == Obj::Tuple && state->items.empty());
          fail_if(!empty && !(top()->kind == Obj::Dict && state->kind == Obj::Dict),
                  "object state (BUILD) on something other than a dict");
          fail_if(top()->frozen, "a container changed after it was placed in another");
          break;
        }
        default:
          fail("pickle opcode 0x" + hex(op) + " (not one a tensor state dict is written with)");
      }
    }
  }

 private:
  const std::string& file_;
  const std::string& d_;
  size_t pos_ = 0;
  std::vector<ObjP> stack_;
  std::vector<ObjP> memo_;

  [[noreturn]] void fail(const std::string& what) const {
    DS_USER_ERROR("PyTorch file '{}': data.pkl holds {} at byte {}; only tensors and plain containers are read "
                  "(nothing is executed)", file_, what, pos_);
  }
  void fail_if(bool c, const std::string& what) const {
    if (c) fail(what);
  }
  static std::string hex(int v) {
    static const char* d = "0123456789abcdef";
    return std::string{d[(v >> 4) & 15], d[v & 15]};
  }
  int byte() {
    if (pos_ >= d_.size()) fail("no STOP before the end");
    return static_cast<unsigned char>(d_[pos_++]);
  }
  const unsigned char* take(uint64_t n) {
    if (n > d_.size() - pos_) fail("a field running past the end");
    const auto* p = reinterpret_cast<const unsigned char*>(d_.data() + pos_);
    pos_ += static_cast<size_t>(n);
    return p;
  }
  std::string line() {
    const size_t e = d_.find('\n', pos_);
    if (e == std::string::npos || e - pos_ > 256) fail("a GLOBAL name without its end");
    std::string s = d_.substr(pos_, e - pos_);
    pos_ = e + 1;
    return s;
  }
  void push(ObjP o) {
    fail_if(stack_.size() >= kMaxStack, "more than 2^20 values on the stack");
    stack_.push_back(std::move(o));
  }
  void push_int(int64_t v) {
    ObjP o = make(Obj::Int);
    o->i = v;
    push(o);
  }
  void push_str(Obj::Kind k, uint64_t n) {
    const unsigned char* p = take(n);
    ObjP o = make(k);
    o->s.assign(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
    push(o);
  }
  ObjP pop() {
    if (stack_.empty() || stack_.back()->kind == Obj::Mark) fail("a pop from an empty stack");
    ObjP o = std::move(stack_.back());
    stack_.pop_back();
    return o;
  }
  ObjP top() {
    if (stack_.empty() || stack_.back()->kind == Obj::Mark) fail("a reference to an empty stack");
    return stack_.back();
  }
  std::vector<ObjP> pop_mark() {
    size_t m = stack_.size();
    while (m > 0 && stack_[m - 1]->kind != Obj::Mark) --m;
    fail_if(m == 0, "a missing MARK");
    std::vector<ObjP> out(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m - 1);
    return out;
  }
  // Places child in container c (see Obj::frozen).
  void adopt(const ObjP& c, const ObjP& child) {
    fail_if(c->frozen || c == child, "a container changed after it was placed in another");
    child->frozen = true;
    c->depth = std::max(c->depth, child->depth + 1);
    fail_if(c->depth > 64, "containers nested more than 64 deep");
  }
  void add_item(const ObjP& c, const ObjP& v) {
    adopt(c, v);
    c->items.push_back(v);
  }
  void pairs_into(const ObjP& d, const std::vector<ObjP>& kv) {
    fail_if(kv.size() % 2 != 0, "an odd number of dict items");
    for (size_t k = 0; k < kv.size(); k += 2) {
      adopt(d, kv[k]);
      adopt(d, kv[k + 1]);
      d->dict.emplace_back(kv[k], kv[k + 1]);
    }
  }
  void memo_put(uint64_t k) {
    fail_if(k > memo_.size() + 1024 || k >= kMaxStack, "a memo index out of range");
    if (k >= memo_.size()) memo_.resize(static_cast<size_t>(k) + 1);
    memo_[static_cast<size_t>(k)] = top();
  }
  ObjP memo_get(uint64_t k) {
    fail_if(k >= memo_.size() || !memo_[static_cast<size_t>(k)], "a memo reference to nothing");
    return memo_[static_cast<size_t>(k)];
  }
  ObjP global(const std::string& module, const std::string& name) {
    const std::string g = module + "." + name;
    std::string dtype;
    if (g != "collections.OrderedDict" && g != "torch._utils._rebuild_tensor_v2" &&
        g != "torch._utils._rebuild_parameter" && !storage_dtype(g, dtype))
      fail("the global " + g);
    ObjP o = make(Obj::Global);
    o->s = g;
    return o;
  }
  static bool is_ints(const ObjP& t) {
    if (t->kind != Obj::Tuple) return false;
    for (const ObjP& x : t->items)
      if (x->kind != Obj::Int) return false;
    return true;
  }
  ObjP call(const std::string& fn, const std::vector<ObjP>& a) {
    if (fn == "collections.OrderedDict") {
      fail_if(!a.empty(), "OrderedDict called with arguments");
      return make(Obj::Dict);
    }
    if (fn == "torch._utils._rebuild_parameter") {
      fail_if(a.empty() || a[0]->kind != Obj::TensorV, "_rebuild_parameter without a tensor");
      return a[0];
    }
    if (fn == "torch._utils._rebuild_tensor_v2") {  // (storage, offset, size, stride, requires_grad, hooks[, metadata])
      fail_if(a.size() < 4 || a[0]->kind != Obj::Storage || a[1]->kind != Obj::Int || !is_ints(a[2]) ||
                  !is_ints(a[3]) || a[2]->items.size() != a[3]->items.size() || a[2]->items.size() > 8,
              "a malformed _rebuild_tensor_v2 call");
      ObjP t = make(Obj::TensorV);
      t->tensor.storage = a[0]->key;
      t->tensor.dtype_name = a[0]->s;
      t->tensor.offset = a[1]->i;
      for (size_t k = 0; k < a[2]->items.size(); ++k) {
        t->tensor.shape.push_back(a[2]->items[k]->i);
        t->tensor.stride.push_back(a[3]->items[k]->i);
      }
      t->i = a[0]->i;  // the storage's element count
      return t;
    }
    fail("a call of " + fn);  // (globals are checked when named; storages are not callable)
  }
};

int64_t element_size(const std::string& dtype) {
  if (dtype == "Double" || dtype == "Long") return 8;
  if (dtype == "Float" || dtype == "Int") return 4;
  if (dtype == "Half" || dtype == "BFloat16" || dtype == "Short") return 2;
  return 1;  // Char, Byte, Bool
}

}  // namespace

void TorchFile::pread_exact(uint64_t off, size_t n, void* dst) const {
  auto* out = static_cast<char*>(dst);
  DS_USER_CHECK(off <= size_ && n <= size_ - off, "PyTorch file '{}' is truncated: {} bytes at offset {} are past "
                "its end ({} bytes)", path_, n, off, size_);
  while (n > 0) {
    const ssize_t k = ::pread(*fd_, out, std::min<size_t>(n, size_t(1) << 30), static_cast<off_t>(off));
    if (k < 0 && errno == EINTR) continue;
    DS_USER_CHECK(k > 0, "PyTorch file '{}' cannot be read at byte {}: {}", path_, off,
                  k == 0 ? "it ended early" : std::strerror(errno));
    out += k;
    off += static_cast<uint64_t>(k);
    n -= static_cast<size_t>(k);
  }
}

void TorchFile::read_zip() {
  DS_USER_CHECK(size_ >= 22, "PyTorch file '{}' is not a zip archive ({} bytes); files saved by PyTorch before 1.6 "
                "(the legacy format) are not read: re-save them with torch.save", path_, size_);
  unsigned char magic[4];
  pread_exact(0, 4, magic);
  DS_USER_CHECK(le32(magic) == 0x04034b50,
                "PyTorch file '{}' is not a zip archive; files saved by PyTorch before 1.6 (the legacy format) are "
                "not read: re-save them with torch.save", path_);
  // The end of central directory record, within the last 64 KiB + 22 bytes.
  const uint64_t tail_n = std::min<uint64_t>(size_, 65557);
  std::vector<unsigned char> tail(tail_n);
  pread_exact(size_ - tail_n, tail_n, tail.data());
  int64_t eocd = -1;
  for (int64_t k = static_cast<int64_t>(tail_n) - 22; k >= 0; --k)
    if (le32(&tail[static_cast<size_t>(k)]) == 0x06054b50) {
      eocd = k;
      break;
    }
  DS_USER_CHECK(eocd >= 0, "PyTorch file '{}' is a truncated or malformed zip archive (no end record)", path_);
  const unsigned char* e = &tail[static_cast<size_t>(eocd)];
  uint64_t entries = le16(e + 10), cd_size = le32(e + 12), cd_off = le32(e + 16);
  if (entries == 0xffff || cd_size == 0xffffffffu || cd_off == 0xffffffffu) {  // zip64
    const uint64_t eocd_at = size_ - tail_n + static_cast<uint64_t>(eocd);
    DS_USER_CHECK(eocd_at >= 20, "PyTorch file '{}': malformed zip64 archive", path_);
    unsigned char loc[20];
    pread_exact(eocd_at - 20, 20, loc);
    DS_USER_CHECK(le32(loc) == 0x07064b50, "PyTorch file '{}': malformed zip64 archive (no locator)", path_);
    unsigned char z[56];
    pread_exact(le64(loc + 8), 56, z);
    DS_USER_CHECK(le32(z) == 0x06064b50, "PyTorch file '{}': malformed zip64 archive (no end record)", path_);
    entries = le64(z + 32);
    cd_size = le64(z + 40);
    cd_off = le64(z + 48);
  }
  DS_USER_CHECK(cd_off <= size_ && cd_size <= size_ - cd_off && entries <= cd_size / 46 && cd_size <= (1u << 30),
                "PyTorch file '{}': its zip directory lies outside the file", path_);
  std::vector<unsigned char> cd(static_cast<size_t>(cd_size));
  pread_exact(cd_off, cd.size(), cd.data());
  size_t at = 0;
  for (uint64_t k = 0; k < entries; ++k) {
    DS_USER_CHECK(at + 46 <= cd.size() && le32(&cd[at]) == 0x02014b50, "PyTorch file '{}': malformed zip directory "
                  "entry {}", path_, k);
    const unsigned char* c = &cd[at];
    const uint16_t method = le16(c + 10), name_n = le16(c + 28), extra_n = le16(c + 30), comment_n = le16(c + 32);
    uint64_t csize = le32(c + 20), usize = le32(c + 24), local = le32(c + 42);
    DS_USER_CHECK(at + 46 + name_n + extra_n + comment_n <= cd.size(), "PyTorch file '{}': malformed zip directory "
                  "entry {}", path_, k);
    const std::string name(reinterpret_cast<const char*>(c + 46), name_n);
    // zip64 extra field: the 0xffffffff values, in order (size, compressed, offset).
    for (size_t x = 46 + name_n; x + 4 <= 46u + name_n + extra_n;) {
      const uint16_t id = le16(c + x), n = le16(c + x + 2);
      if (x + 4 + n > 46u + name_n + extra_n) break;
      if (id == 0x0001) {
        size_t y = x + 4;
        auto next = [&](uint64_t& v) {
          if (v == 0xffffffffu && y + 8 <= x + 4 + n) {
            v = le64(c + y);
            y += 8;
          }
        };
        next(usize);
        next(csize);
        next(local);
      }
      x += 4 + n;
    }
    DS_USER_CHECK(method == 0 && csize == usize, "PyTorch file '{}': zip member '{}' is compressed; torch.save "
                  "stores members uncompressed", path_, name);
    unsigned char lh[30];
    pread_exact(local, 30, lh);
    DS_USER_CHECK(le32(lh) == 0x04034b50, "PyTorch file '{}': zip member '{}' has no local header", path_, name);
    const uint64_t data = local + 30 + le16(lh + 26) + le16(lh + 28);
    DS_USER_CHECK(data <= size_ && usize <= size_ - data, "PyTorch file '{}': zip member '{}' runs past the end of "
                  "the file (truncated?)", path_, name);
    members_[name] = Entry{data, usize};
    at += 46 + name_n + extra_n + comment_n;
  }
}

TorchFile TorchFile::open(const std::string& path) {
  TorchFile f;
  f.path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DS_USER_CHECK(fd >= 0, "PyTorch file '{}' cannot be opened: {}", path, std::strerror(errno));
  f.fd_ = std::shared_ptr<int>(new int(fd), [](int* p) {
    ::close(*p);
    delete p;
  });
  struct stat st {};
  DS_USER_CHECK(::fstat(fd, &st) == 0 && S_ISREG(st.st_mode), "PyTorch file '{}' is not a regular file", path);
  f.size_ = static_cast<uint64_t>(st.st_size);
  f.read_zip();
  // The archive's one folder: the member ending in /data.pkl.
  std::string pkl;
  for (const auto& [name, entry] : f.members_) {
    const size_t slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash) == "/data.pkl") {
      DS_USER_CHECK(pkl.empty(), "PyTorch file '{}' holds more than one data.pkl", path);
      pkl = name;
      f.prefix_ = name.substr(0, slash + 1);
    }
  }
  DS_USER_CHECK(!pkl.empty(), "PyTorch file '{}' is a zip archive without ARCHIVE/data.pkl (not a torch.save file)",
                path);
  const Entry& p = f.members_.at(pkl);
  DS_USER_CHECK(p.size <= kMaxPickle, "PyTorch file '{}': data.pkl is {} bytes, more than the 1 GiB a state dict's "
                "structure needs", path, p.size);
  std::string data(static_cast<size_t>(p.size), '\0');
  f.pread_exact(p.offset, data.size(), data.data());
  const ObjP root = Unpickler(path, data).run();
  // Flatten: tensors and scalars by dotted path.
  std::function<void(const ObjP&, const std::string&, int)> walk = [&](const ObjP& o, const std::string& at,
                                                                       int depth) {
    DS_USER_CHECK(depth <= 64, "PyTorch file '{}': its object is nested more than 64 deep", path);
    auto join = [&](const std::string& k) { return at.empty() ? k : at + "." + k; };
    switch (o->kind) {
      case Obj::Dict:
        for (const auto& [k, v] : o->dict) {
          DS_USER_CHECK(k->kind == Obj::Str || k->kind == Obj::Int, "PyTorch file '{}': a dict key at '{}' is "
                        "neither a string nor an integer", path, at);
          walk(v, join(k->kind == Obj::Str ? k->s : std::to_string(k->i)), depth + 1);
        }
        break;
      case Obj::List:
      case Obj::Tuple:
        for (size_t k = 0; k < o->items.size(); ++k) walk(o->items[k], join(std::to_string(k)), depth + 1);
        break;
      case Obj::TensorV: {
        DS_USER_CHECK(f.tensors_.size() < kMaxTensors, "PyTorch file '{}' holds more than 2^20 tensors", path);
        DS_USER_CHECK(f.tensors_.emplace(at, o->tensor).second, "PyTorch file '{}': two tensors at '{}'", path, at);
        // The view must lie inside its storage (all in elements).
        const TorchTensorInfo& t = o->tensor;
        int64_t hi = t.offset, numel = 1;
        for (size_t d = 0; d < t.shape.size(); ++d) {
          DS_USER_CHECK(t.shape[d] >= 0 && t.shape[d] <= (int64_t(1) << 40) && t.stride[d] >= 0 &&
                            t.stride[d] <= (int64_t(1) << 40),
                        "PyTorch file '{}': tensor '{}' has shape or stride out of range", path, at);
          numel = t.shape[d] == 0 ? 0 : numel * t.shape[d];
          DS_USER_CHECK(numel <= (int64_t(1) << 40), "PyTorch file '{}': tensor '{}' is too large", path, at);
          if (t.shape[d] > 0) hi += (t.shape[d] - 1) * t.stride[d];
        }
        const auto m = f.members_.find(f.prefix_ + "data/" + t.storage);
        DS_USER_CHECK(m != f.members_.end(), "PyTorch file '{}': tensor '{}' names storage '{}', which the archive "
                      "lacks", path, at, t.storage);
        const int64_t es = element_size(t.dtype_name);
        DS_USER_CHECK(o->i >= 0 && static_cast<uint64_t>(o->i) * static_cast<uint64_t>(es) <= m->second.size &&
                          t.offset >= 0 && (numel == 0 || hi < o->i),
                      "PyTorch file '{}': tensor '{}' reaches past its storage '{}'", path, at, t.storage);
        break;
      }
      case Obj::None: f.scalars_[at] = "None"; break;
      case Obj::Bool: f.scalars_[at] = o->b ? "True" : "False"; break;
      case Obj::Int: f.scalars_[at] = std::to_string(o->i); break;
      case Obj::Float: f.scalars_[at] = fmt::format("{}", o->f); break;
      case Obj::Str: f.scalars_[at] = o->s; break;
      case Obj::Bytes: f.scalars_[at] = fmt::format("<{} bytes>", o->s.size()); break;
      default: DS_USER_ERROR("PyTorch file '{}': the value at '{}' is not a tensor, container or plain value", path, at);
    }
  };
  walk(root, "", 0);
  return f;
}

Tensor TorchFile::get(const std::string& name) const {
  const auto it = tensors_.find(name);
  DS_USER_CHECK(it != tensors_.end(), "PyTorch file '{}' has no tensor '{}'", path_, name);
  const TorchTensorInfo& t = it->second;
  DType dt;
  if (t.dtype_name == "Float") dt = DType::F32;
  else if (t.dtype_name == "BFloat16") dt = DType::BF16;
  else if (t.dtype_name == "Half") dt = DType::F16;
  else if (t.dtype_name == "Int") dt = DType::I32;
  else if (t.dtype_name == "Long") dt = DType::I64;
  else if (t.dtype_name == "Byte" || t.dtype_name == "Bool") dt = DType::U8;
  else DS_USER_ERROR("PyTorch file '{}': tensor '{}' is of type {}, which dstrain does not read", path_, name,
                     t.dtype_name);
  const Entry& m = members_.at(prefix_ + "data/" + t.storage);
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  Tensor out = Tensor::empty(t.shape, dt);
  const int64_t n = out.numel();
  if (n == 0) return out;
  // Contiguous: one read; otherwise the storage span it covers, then gathered.
  int64_t hi = t.offset;
  bool contiguous = true;
  int64_t expect = 1;
  for (size_t d = t.shape.size(); d-- > 0;) {
    hi += (t.shape[d] - 1) * t.stride[d];
    if (t.shape[d] > 1 && t.stride[d] != expect) contiguous = false;
    expect *= t.shape[d];
  }
  if (contiguous) {
    pread_exact(m.offset + static_cast<uint64_t>(t.offset * es), static_cast<size_t>(n * es), out.raw());
    return out;
  }
  std::vector<char> span(static_cast<size_t>((hi - t.offset + 1) * es));
  pread_exact(m.offset + static_cast<uint64_t>(t.offset * es), span.size(), span.data());
  auto* dst = static_cast<char*>(out.raw());
  std::vector<int64_t> idx(t.shape.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t src = 0;
    for (size_t d = 0; d < idx.size(); ++d) src += idx[d] * t.stride[d];
    std::memcpy(dst + k * es, span.data() + src * es, static_cast<size_t>(es));
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace ds
