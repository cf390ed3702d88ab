// json.cpp — JsonWriter's escaping and number formatting.
#include "runtime/json.h"

#include <cmath>
#include <cstdio>

namespace nz {

void JsonWriter::comma() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ',';
    first_.back() = false;
  }
}

void JsonWriter::quote(const std::string& s) {
  out_ += '"';
  for (char c : s) {
    switch (c) {
      case '"': out_ += "\\\""; break;
      case '\\': out_ += "\\\\"; break;
      case '\n': out_ += "\\n"; break;
      case '\t': out_ += "\\t"; break;
      default:
        if ((unsigned char)c < 0x20) {
          char buf[8];
          snprintf(buf, sizeof buf, "\\u%04x", c);
          out_ += buf;
        } else {
          out_ += c;
        }
    }
  }
  out_ += '"';
}

void JsonWriter::value(double x) {
  comma();
  if (!std::isfinite(x)) {  // JSON has no NaN/inf
    out_ += "null";
    return;
  }
  char buf[32];
  snprintf(buf, sizeof buf, "%.17g", x);
  out_ += buf;
}

}  // namespace nz
