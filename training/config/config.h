// Strict, schema-driven YAML configuration.
//
// A ConfigSchema lists every key a config may hold: its dotted path, type,
// default, allowed range or choices, and a one-line doc. Loading a file
// checks it against the schema before any work starts; an unknown key (with
// a suggestion for a misspelling), a wrong type, an out-of-range value, a
// missing required key, a key given twice in one mapping, a second YAML
// document or malformed YAML is a ConfigError whose message names
// the file, line, column and key path. Overrides "key.path=value" (from the
// command line) are checked the same way and name the override.
//
// A loaded Config holds every key of the schema, defaults filled in; its
// ToYaml() is the resolved config written next to every run, and loading
// that file again gives the same Config.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "framework/check.h"
#include "framework/option_fields.h"

namespace stillpoint {

// Bad configuration input. Programs exit with code 2 on it.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& message) : Error(message) {}
};

enum class ConfigType { kBool, kInt, kDouble, kString, kEnum, kStringList, kDoubleList };

struct ConfigKey {
  std::string path;           // "train.optimizer.lr"
  ConfigType type = ConfigType::kString;
  std::string default_value;  // YAML text; for lists "[a, b]"
  std::string doc;
  std::vector<std::string> choices;  // kEnum; also allowed list items for kStringList if set
  bool has_min = false, has_max = false;
  double min = 0, max = 0;     // bounds for kInt, kDouble and list items
  bool min_open = false, max_open = false;  // exclusive ends (inclusive by default)
  bool zero_allowed = false;   // 0 is valid besides the range ("0: off")
  bool required = false;       // no default: the file must set it
  // A default that depends on other keys' values (e.g. a solver tolerance
  // on dtype): the first rule whose key's value it lists gives by[that
  // value], else default_value. Applied while the key is at its default,
  // also after Config::Set changes the other key.
  struct DefaultRule {
    std::string follows;
    std::map<std::string, std::string> by;
  };
  std::vector<DefaultRule> default_rules;
};

// The name of `names` closest to text by edit distance, when it is close
// enough to be a likely misspelling (at most two edits, or a third of its
// length when that is more); "" otherwise. For did-you-mean in errors about
// values and commands.
std::string ClosestName(const std::string& text, const std::vector<std::string>& names);

class ConfigSchema {
 public:
  // Adders return *this so a schema reads as one declaration list.
  ConfigSchema& Bool(const std::string& path, bool default_value, const std::string& doc);
  ConfigSchema& Int(const std::string& path, int64_t default_value, const std::string& doc,
                    int64_t min, int64_t max);
  ConfigSchema& Double(const std::string& path, double default_value, const std::string& doc,
                       double min, double max);
  // The same with bounds that may be open or allow 0 besides.
  ConfigSchema& Int(const std::string& path, int64_t default_value, const std::string& doc,
                    const OptionBounds& bounds);
  ConfigSchema& Double(const std::string& path, double default_value, const std::string& doc,
                       const OptionBounds& bounds);
  ConfigSchema& String(const std::string& path, const std::string& default_value,
                       const std::string& doc);
  ConfigSchema& RequiredString(const std::string& path, const std::string& doc);
  ConfigSchema& Enum(const std::string& path, const std::string& default_value,
                     const std::vector<std::string>& choices, const std::string& doc);
  // A list of strings; when choices is non-empty each item must be one of them.
  ConfigSchema& StringList(const std::string& path, const std::vector<std::string>& default_value,
                           const std::vector<std::string>& choices, const std::string& doc);
  ConfigSchema& DoubleList(const std::string& path, const std::vector<double>& default_value,
                           const std::string& doc, double min, double max);

  // A key made elsewhere (e.g. merged from the tasks' keys); a path given
  // twice is a logic error.
  ConfigSchema& Add(ConfigKey key);

  // Makes the default of `path` follow the value of `other` (see
  // ConfigKey::default_rules; an earlier rule of the key wins where both
  // list a value); both must be declared already, and one key follows
  // another at most once.
  ConfigSchema& DefaultFollows(const std::string& path, const std::string& other,
                               const std::map<std::string, std::string>& default_by);

  const std::vector<ConfigKey>& keys() const { return keys_; }
  const ConfigKey* Find(const std::string& path) const;
  // The closest known key path (edit distance on the last segment within the
  // same section, then on the whole path), or "" when nothing is close.
  std::string Suggest(const std::string& path) const;
  // Markdown reference of every key, grouped by top-level section.
  std::string ToMarkdown() const;

 private:
  std::vector<ConfigKey> keys_;
};

// A resolved configuration: every schema key with a value (as canonical
// YAML scalar text or a list of them).
class Config {
 public:
  // Parses and validates YAML text. source names it in errors (the file).
  static Config FromYaml(const ConfigSchema& schema, const std::string& yaml_text,
                         const std::string& source, const std::vector<std::string>& overrides = {});
  // Reads a file (missing/unreadable file, a directory, or more than
  // kMaxConfigBytes: ConfigError naming it).
  static constexpr std::size_t kMaxConfigBytes = std::size_t{1} << 20;
  static Config FromFile(const ConfigSchema& schema, const std::string& path,
                         const std::vector<std::string>& overrides = {});

  bool GetBool(const std::string& path) const;
  int64_t GetInt(const std::string& path) const;
  double GetDouble(const std::string& path) const;
  std::string GetString(const std::string& path) const;  // kString and kEnum
  std::vector<std::string> GetStringList(const std::string& path) const;
  std::vector<double> GetDoubleList(const std::string& path) const;
  // Where a value came from: "default", "<file>:<line>:<column>" or "override '<text>'".
  std::string Origin(const std::string& path) const;

  // Applies one more override after loading (same checks; used by eval and
  // compare to derive variants). Throws ConfigError.
  void Set(const std::string& override_text);

  // The resolved config as nested YAML, every key present, schema order.
  std::string ToYaml() const;
  // A key's value as text ("0.001", "[csv, jsonl]"); "" for a key without one.
  std::string ValueText(const std::string& path) const;
  const ConfigSchema& schema() const { return *schema_; }
  const std::string& source() const { return source_; }

 private:
  struct Value {
    std::vector<std::string> items;  // one item for scalars
    std::string origin;
  };
  const Value& Lookup(const std::string& path, ConfigType expected) const;

  std::shared_ptr<const ConfigSchema> schema_;
  std::string source_;
  std::map<std::string, Value> values_;
  friend class ConfigBuilder;
};

}  // namespace stillpoint
