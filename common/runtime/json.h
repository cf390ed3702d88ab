// json.h — a tiny streaming JSON writer (reports and logs); numbers keep full precision.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nz {

class JsonWriter {
 public:
  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }
  void key(const std::string& k) {
    comma();
    quote(k);
    out_ += ':';
    after_key_ = true;
  }
  void value(const std::string& s) { comma(); quote(s); }
  void value(const char* s) { value(std::string(s)); }
  void value(double x);  // %.17g: a double read back is the same double
  void value(int64_t x) { comma(); out_ += std::to_string(x); }
  void value(uint64_t x) { comma(); out_ += std::to_string(x); }
  void value(int x) { value(int64_t(x)); }
  void value(bool b) { comma(); out_ += b ? "true" : "false"; }
  void raw(const std::string& json) { comma(); out_ += json; }  // an already-written JSON value
  template <class V> void kv(const std::string& k, const V& v) { key(k); value(v); }
  const std::string& str() const { return out_; }

 private:
  void open(char c) { comma(); out_ += c; first_.push_back(true); }
  void close(char c) { out_ += c; first_.pop_back(); }
  void comma();
  void quote(const std::string& s);
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace nz
