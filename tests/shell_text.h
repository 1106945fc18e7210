// Building shell commands for the tests that run the stillpoint program as
// a user does, and reading back what it wrote.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace stillpoint::testing_support {

// `word` as one single-quoted shell word (an embedded ' becomes '\'').
inline std::string Quoted(const std::string& word) {
  std::string q = "'";
  for (char ch : word) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// `program train CONFIG OVERRIDES... > OUTPUT 2>&1`, every word quoted.
inline std::string TrainCommand(const std::string& program, const std::string& config,
                                const std::vector<std::string>& overrides,
                                const std::filesystem::path& output) {
  std::string command = Quoted(program) + " train " + Quoted(config);
  for (const std::string& o : overrides) command += " " + Quoted(o);
  return command + " > " + Quoted(output.string()) + " 2>&1";
}

// The whole file as text ("" when it cannot be read).
inline std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace stillpoint::testing_support
