// json_read.h — a small JSON reader for the tests (reports written by the trainers).
// Numbers are kept as the text's double, which round-trips the %.17g the writer prints.
#pragma once
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace nzt {

struct Json {
  enum Kind { Null, Bool, Num, Str, Arr, Obj } kind = Null;
  double num = 0;
  bool b = false;
  std::string str;
  std::vector<Json> arr;
  std::map<std::string, Json> obj;

  const Json& operator[](const std::string& k) const {
    auto it = obj.find(k);
    if (kind != Obj || it == obj.end()) throw std::runtime_error("json: no key '" + k + "'");
    return it->second;
  }
  const Json& operator[](size_t i) const {
    if (kind != Arr || i >= arr.size()) throw std::runtime_error("json: index out of range");
    return arr[i];
  }
  bool has(const std::string& k) const { return kind == Obj && obj.count(k); }
  size_t size() const { return kind == Arr ? arr.size() : obj.size(); }
  double d() const { return num; }
  unsigned long long u() const { return (unsigned long long)num; }

  static Json parse(const std::string& text) {
    size_t i = 0;
    Json j = value(text, i);
    ws(text, i);
    if (i != text.size()) throw std::runtime_error("json: trailing characters");
    return j;
  }

 private:
  static void ws(const std::string& s, size_t& i) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) i++;
  }
  static Json value(const std::string& s, size_t& i) {
    ws(s, i);
    if (i >= s.size()) throw std::runtime_error("json: unexpected end");
    Json j;
    char c = s[i];
    if (c == '{') {
      j.kind = Obj;
      i++;
      ws(s, i);
      if (s[i] == '}') { i++; return j; }
      while (true) {
        ws(s, i);
        std::string k = string(s, i);
        ws(s, i);
        if (s[i++] != ':') throw std::runtime_error("json: expected ':'");
        j.obj[k] = value(s, i);
        ws(s, i);
        if (s[i] == ',') { i++; continue; }
        if (s[i++] != '}') throw std::runtime_error("json: expected '}'");
        return j;
      }
    }
    if (c == '[') {
      j.kind = Arr;
      i++;
      ws(s, i);
      if (s[i] == ']') { i++; return j; }
      while (true) {
        j.arr.push_back(value(s, i));
        ws(s, i);
        if (s[i] == ',') { i++; continue; }
        if (s[i++] != ']') throw std::runtime_error("json: expected ']'");
        return j;
      }
    }
    if (c == '"') { j.kind = Str; j.str = string(s, i); return j; }
    if (s.compare(i, 4, "true") == 0) { j.kind = Bool; j.b = true; i += 4; return j; }
    if (s.compare(i, 5, "false") == 0) { j.kind = Bool; i += 5; return j; }
    if (s.compare(i, 4, "null") == 0) { i += 4; return j; }
    char* end = nullptr;
    j.num = strtod(s.c_str() + i, &end);
    if (end == s.c_str() + i) throw std::runtime_error("json: bad value");
    j.kind = Num;
    i = end - s.c_str();
    return j;
  }
  static std::string string(const std::string& s, size_t& i) {
    if (s[i] != '"') throw std::runtime_error("json: expected a string");
    std::string out;
    for (i++; i < s.size() && s[i] != '"'; i++) {
      if (s[i] == '\\') {
        i++;
        switch (s[i]) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'u': out += char(std::strtol(s.substr(i + 1, 4).c_str(), nullptr, 16)); i += 4; break;
          default: out += s[i];
        }
      } else {
        out += s[i];
      }
    }
    i++;
    return out;
  }
};

}  // namespace nzt
