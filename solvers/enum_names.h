// The one parser behind every StringTo<Enum> of the solvers: the text (in
// any letter case) is matched against ToString of each candidate, so each
// enum's spelling is written once, in its ToString.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>

namespace stillpoint::internal {

inline std::string Lower(const std::string& text) {
  std::string out = text;
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// candidates: any range of Enum values (an initializer list, a vector).
// Returns false, leaving *value alone, when nothing matches.
template <typename Enum, typename Range>
bool ParseEnumByName(const std::string& text, const Range& candidates, Enum* value) {
  const std::string wanted = Lower(text);
  for (Enum candidate : candidates) {
    if (Lower(ToString(candidate)) == wanted) {
      *value = candidate;
      return true;
    }
  }
  return false;
}

}  // namespace stillpoint::internal
