#include "training/config/config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cfloat>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace stillpoint {
namespace {

std::string Where(const std::string& source, const YAML::Mark& mark) {
  std::ostringstream out;
  out << source;
  if (mark.line >= 0) out << ":" << mark.line + 1 << ":" << mark.column + 1;
  return out.str();
}

// The shortest text that reads back as the same double ("0.2", not
// "0.20000000000000001"), in positional notation from 1e-4 to 1e15
// ("1000000", not "1e+06").
std::string FormatNumber(double value) {
  char buffer[400];
  const double magnitude = std::fabs(value);
  const auto result =
      magnitude >= 1e-4 && magnitude < 1e15
          ? std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::fixed)
          : std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

std::string JoinQuoted(const std::vector<std::string>& items) {
  std::string text;
  for (std::size_t i = 0; i < items.size(); ++i) text += (i ? ", '" : "'") + items[i] + "'";
  return text;
}

// "'x' is not one of 'a', 'b'; did you mean 'a'?" (the suggestion when one
// choice is close, ClosestName).
std::string NotAChoice(const std::string& text, const std::vector<std::string>& choices) {
  std::string message = "'" + text + "' is not one of " + JoinQuoted(choices);
  const std::string closest = ClosestName(text, choices);
  if (!closest.empty()) message += "; did you mean '" + closest + "'?";
  return message;
}

std::size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitution = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitution});
    }
  }
  return row[b.size()];
}

const char* TypeName(ConfigType type) {
  switch (type) {
    case ConfigType::kBool:
      return "a boolean (true or false)";
    case ConfigType::kInt:
      return "an integer";
    case ConfigType::kDouble:
      return "a number";
    case ConfigType::kString:
      return "a string";
    case ConfigType::kEnum:
      return "one of the listed names";
    case ConfigType::kStringList:
      return "a list of strings";
    case ConfigType::kDoubleList:
      return "a list of numbers";
  }
  return "a value";
}

bool ParseInt(const std::string& text, int64_t* value) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *value = parsed;
  return true;
}

bool ParseDouble(const std::string& text, double* value) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const double parsed = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size() || !std::isfinite(parsed)) return false;
  *value = parsed;
  return true;
}

OptionBounds BoundsOf(const ConfigKey& key) {
  OptionBounds bounds;
  bounds.min = key.min;
  bounds.max = key.max;
  bounds.min_open = key.min_open;
  bounds.max_open = key.max_open;
  bounds.zero_allowed = key.zero_allowed;
  return bounds;
}

std::string RangeText(const ConfigKey& key) {
  std::ostringstream out;
  if (key.has_min && key.has_max && (key.min_open || key.max_open || key.zero_allowed)) {
    out << (key.zero_allowed ? "0 or " : "") << (key.min_open ? "(" : "[")
        << FormatNumber(key.min) << ", " << FormatNumber(key.max) << (key.max_open ? ")" : "]");
  } else if (key.has_min && key.has_max) {
    out << "[" << FormatNumber(key.min) << ", " << FormatNumber(key.max) << "]";
  } else if (key.has_min) {
    out << ">= " << FormatNumber(key.min);
  } else if (key.has_max) {
    out << "<= " << FormatNumber(key.max);
  }
  return out.str();
}

bool InRange(const ConfigKey& key, double value) {
  if (key.has_min && key.has_max) return BoundsOf(key).Contains(value);
  return (!key.has_min || value >= key.min) && (!key.has_max || value <= key.max);
}

// Checks one scalar item against the key; returns "" or the reason it fails.
std::string CheckItem(const ConfigKey& key, const std::string& text, bool list_item) {
  const ConfigType type = list_item ? (key.type == ConfigType::kDoubleList ? ConfigType::kDouble
                                                                            : ConfigType::kString)
                                    : key.type;
  switch (type) {
    case ConfigType::kBool:
      if (text != "true" && text != "false") return "expected true or false, got '" + text + "'";
      return "";
    case ConfigType::kInt: {
      int64_t v;
      if (!ParseInt(text, &v)) return "expected an integer, got '" + text + "'";
      if (!InRange(key, static_cast<double>(v))) {
        return "value " + text + " is out of range " + RangeText(key);
      }
      return "";
    }
    case ConfigType::kDouble: {
      double v;
      if (!ParseDouble(text, &v)) return "expected a finite number, got '" + text + "'";
      // Models train in float32: a value finite in double but infinite there
      // would turn every product it enters into inf or NaN.
      if (std::fabs(v) > FLT_MAX) {
        return "value " + text + " does not fit in float32 (largest magnitude " +
               FormatNumber(FLT_MAX) + ")";
      }
      if (!InRange(key, v)) return "value " + text + " is out of range " + RangeText(key);
      return "";
    }
    case ConfigType::kEnum:
      if (std::find(key.choices.begin(), key.choices.end(), text) == key.choices.end()) {
        return NotAChoice(text, key.choices);
      }
      return "";
    case ConfigType::kString:
      if (!key.choices.empty() &&
          std::find(key.choices.begin(), key.choices.end(), text) == key.choices.end()) {
        return NotAChoice(text, key.choices);
      }
      return "";
    default:
      return "";
  }
}

ConfigKey MakeKey(const std::string& path, ConfigType type, const std::string& default_value,
                  const std::string& doc) {
  ConfigKey key;
  key.path = path;
  key.type = type;
  key.default_value = default_value;
  key.doc = doc;
  return key;
}

// Whether text holds a second YAML document, and where it starts. At most
// two documents are read: yaml-cpp's LoadAll loops forever on some
// malformed inputs, its parser reporting one empty document after another
// (found by tests/fuzz/config_fuzz.cc).
bool SecondDocument(const std::string& text, YAML::Mark* start) {
  class DocumentStart : public YAML::EventHandler {
   public:
    void OnDocumentStart(const YAML::Mark& mark) override { start = mark; }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
    YAML::Mark start = YAML::Mark::null_mark();
  };
  std::stringstream stream(text);
  YAML::Parser parser(stream);
  DocumentStart first, second;
  if (!parser.HandleNextDocument(first) || !parser.HandleNextDocument(second)) return false;
  *start = second.start;
  return true;
}

bool IsList(ConfigType type) {
  return type == ConfigType::kStringList || type == ConfigType::kDoubleList;
}

}  // namespace

// ---------------------------------------------------------------- schema

ConfigSchema& ConfigSchema::Add(ConfigKey key) {
  SP_CHECK(Find(key.path) == nullptr, "ConfigSchema: key '", key.path, "' declared twice");
  keys_.push_back(std::move(key));
  return *this;
}

ConfigSchema& ConfigSchema::DefaultFollows(const std::string& path, const std::string& other,
                                           const std::map<std::string, std::string>& default_by) {
  SP_CHECK(Find(other) != nullptr, "ConfigSchema: DefaultFollows: no key '", other, "'");
  auto it = std::find_if(keys_.begin(), keys_.end(),
                         [&](const ConfigKey& key) { return key.path == path; });
  SP_CHECK(it != keys_.end(), "ConfigSchema: DefaultFollows: no key '", path, "'");
  for (const ConfigKey::DefaultRule& rule : it->default_rules) {
    SP_CHECK(rule.follows != other, "ConfigSchema: DefaultFollows: '", path, "' already follows '",
             other, "'");
  }
  it->default_rules.push_back({other, default_by});
  return *this;
}

ConfigSchema& ConfigSchema::Bool(const std::string& path, bool default_value,
                                 const std::string& doc) {
  return Add(MakeKey(path, ConfigType::kBool, default_value ? "true" : "false", doc));
}

ConfigSchema& ConfigSchema::Int(const std::string& path, int64_t default_value,
                                const std::string& doc, int64_t min, int64_t max) {
  ConfigKey key = MakeKey(path, ConfigType::kInt, std::to_string(default_value), doc);
  key.has_min = key.has_max = true;
  key.min = static_cast<double>(min);
  key.max = static_cast<double>(max);
  return Add(key);
}

ConfigSchema& ConfigSchema::Double(const std::string& path, double default_value,
                                   const std::string& doc, double min, double max) {
  ConfigKey key = MakeKey(path, ConfigType::kDouble, FormatNumber(default_value), doc);
  key.has_min = key.has_max = true;
  key.min = min;
  key.max = max;
  return Add(key);
}

ConfigSchema& ConfigSchema::Int(const std::string& path, int64_t default_value,
                                const std::string& doc, const OptionBounds& bounds) {
  Int(path, default_value, doc, static_cast<int64_t>(bounds.min), static_cast<int64_t>(bounds.max));
  ConfigKey& key = keys_.back();
  key.min_open = bounds.min_open;
  key.max_open = bounds.max_open;
  key.zero_allowed = bounds.zero_allowed;
  return *this;
}

ConfigSchema& ConfigSchema::Double(const std::string& path, double default_value,
                                   const std::string& doc, const OptionBounds& bounds) {
  Double(path, default_value, doc, bounds.min, bounds.max);
  ConfigKey& key = keys_.back();
  key.min_open = bounds.min_open;
  key.max_open = bounds.max_open;
  key.zero_allowed = bounds.zero_allowed;
  return *this;
}

ConfigSchema& ConfigSchema::String(const std::string& path, const std::string& default_value,
                                   const std::string& doc) {
  return Add(MakeKey(path, ConfigType::kString, default_value, doc));
}

ConfigSchema& ConfigSchema::RequiredString(const std::string& path, const std::string& doc) {
  ConfigKey key = MakeKey(path, ConfigType::kString, "", doc);
  key.required = true;
  return Add(key);
}

ConfigSchema& ConfigSchema::Enum(const std::string& path, const std::string& default_value,
                                 const std::vector<std::string>& choices,
                                 const std::string& doc) {
  ConfigKey key = MakeKey(path, ConfigType::kEnum, default_value, doc);
  key.choices = choices;
  SP_CHECK(std::find(choices.begin(), choices.end(), default_value) != choices.end(),
           "ConfigSchema: default '", default_value, "' of '", path, "' is not a choice");
  return Add(key);
}

ConfigSchema& ConfigSchema::StringList(const std::string& path,
                                       const std::vector<std::string>& default_value,
                                       const std::vector<std::string>& choices,
                                       const std::string& doc) {
  std::string text = "[";
  for (std::size_t i = 0; i < default_value.size(); ++i) text += (i ? ", " : "") + default_value[i];
  ConfigKey key = MakeKey(path, ConfigType::kStringList, text + "]", doc);
  key.choices = choices;
  return Add(key);
}

ConfigSchema& ConfigSchema::DoubleList(const std::string& path,
                                       const std::vector<double>& default_value,
                                       const std::string& doc, double min, double max) {
  std::string text = "[";
  for (std::size_t i = 0; i < default_value.size(); ++i) {
    text += (i ? ", " : "") + FormatNumber(default_value[i]);
  }
  ConfigKey key = MakeKey(path, ConfigType::kDoubleList, text + "]", doc);
  key.has_min = key.has_max = true;
  key.min = min;
  key.max = max;
  return Add(key);
}

const ConfigKey* ConfigSchema::Find(const std::string& path) const {
  for (const ConfigKey& key : keys_) {
    if (key.path == path) return &key;
  }
  return nullptr;
}

std::string ClosestName(const std::string& text, const std::vector<std::string>& names) {
  std::string best;
  std::size_t best_distance = std::string::npos;
  for (const std::string& name : names) {
    const std::size_t d = EditDistance(text, name);
    if (d < best_distance) {
      best_distance = d;
      best = name;
    }
  }
  const std::size_t allowed = std::max<std::size_t>(2, best.size() / 3);
  return best_distance <= allowed ? best : "";
}

std::string ConfigSchema::Suggest(const std::string& path) const {
  std::string best;
  std::size_t best_distance = std::string::npos;
  const std::size_t dot = path.rfind('.');
  const std::string section = dot == std::string::npos ? "" : path.substr(0, dot);
  for (const ConfigKey& key : keys_) {
    // Candidates: the key itself and each of its section prefixes.
    std::string candidate = key.path;
    while (!candidate.empty()) {
      const std::size_t cdot = candidate.rfind('.');
      const std::string csection = cdot == std::string::npos ? "" : candidate.substr(0, cdot);
      if (csection == section) {
        const std::size_t d = EditDistance(path, candidate);
        if (d < best_distance) {
          best_distance = d;
          best = candidate;
        }
      }
      if (cdot == std::string::npos) break;
      candidate = csection;
    }
  }
  const std::size_t last_length = path.size() - (dot == std::string::npos ? 0 : dot + 1);
  if (best_distance == std::string::npos || best_distance > std::max<std::size_t>(2, last_length / 3)) {
    return "";
  }
  return best;
}

std::string ConfigSchema::ToMarkdown() const {
  std::ostringstream out;
  std::string section;
  for (const ConfigKey& key : keys_) {
    const std::string top = key.path.substr(0, key.path.find('.'));
    if (top != section) {
      section = top;
      out << "\n## `" << section << "`\n\n| key | type | default | allowed | meaning |\n"
          << "|---|---|---|---|---|\n";
    }
    std::string allowed = RangeText(key);
    if (!key.choices.empty()) {
      allowed.clear();
      for (std::size_t i = 0; i < key.choices.size(); ++i) {
        allowed += (i ? ", " : "") + std::string("`") + key.choices[i] + "`";
      }
    }
    out << "| `" << key.path << "` | " << TypeName(key.type) << " | "
        << (key.required ? "(required)" : "`" + key.default_value + "`");
    for (const ConfigKey::DefaultRule& rule : key.default_rules) {
      for (const auto& [value, text] : rule.by) {
        out << " (" << rule.follows << " " << value << ": `" << text << "`)";
      }
    }
    out << " | " << allowed
        << " | " << key.doc << " |\n";
  }
  return out.str();
}

// ---------------------------------------------------------------- config

class ConfigBuilder {
 public:
  ConfigBuilder(Config* config, const std::string& source) : config_(config), source_(source) {}

  // The keys still at their default whose default follows another key's
  // value (ConfigKey::default_rules) take the default for that value.
  void ResolveFollowingDefaults() {
    for (const ConfigKey& key : config_->schema_->keys()) {
      if (key.default_rules.empty()) continue;
      const auto it = config_->values_.find(key.path);
      if (it == config_->values_.end() || it->second.origin != "default") continue;
      std::string text = key.default_value;
      for (const ConfigKey::DefaultRule& rule : key.default_rules) {
        const auto other = config_->values_.find(rule.follows);
        if (other == config_->values_.end() || other->second.items.empty()) continue;
        const auto chosen = rule.by.find(other->second.items[0]);
        if (chosen == rule.by.end()) continue;
        text = chosen->second;
        break;
      }
      SetValue(key, YAML::Node(text), "default");
    }
  }

  // Validates node as the value of key; stores it with its origin.
  void SetValue(const ConfigKey& key, const YAML::Node& node, const std::string& where) {
    Config::Value value;
    value.origin = where;
    if (IsList(key.type)) {
      if (!node.IsSequence()) {
        throw ConfigError(where + ": key '" + key.path + "' must be " + TypeName(key.type));
      }
      for (const YAML::Node& item : node) {
        if (!item.IsScalar()) {
          throw ConfigError(where + ": key '" + key.path + "' must be " + TypeName(key.type));
        }
        const std::string reason = CheckItem(key, item.Scalar(), true);
        if (!reason.empty()) {
          throw ConfigError(where + ": key '" + key.path + "': " + reason);
        }
        if (key.type == ConfigType::kStringList && !key.choices.empty() &&
            std::find(key.choices.begin(), key.choices.end(), item.Scalar()) ==
                key.choices.end()) {
          throw ConfigError(where + ": key '" + key.path + "': " +
                            NotAChoice(item.Scalar(), key.choices));
        }
        value.items.push_back(item.Scalar());
      }
    } else if (key.type == ConfigType::kString && node.IsNull()) {
      value.items.push_back("");  // `key:` with no value, or `key=` on the command line
    } else {
      if (!node.IsScalar()) {
        throw ConfigError(where + ": key '" + key.path + "' must be " + TypeName(key.type) +
                          (node.IsNull() ? ", but has no value" : ", not a mapping or list"));
      }
      const std::string reason = CheckItem(key, node.Scalar(), false);
      if (!reason.empty()) throw ConfigError(where + ": key '" + key.path + "': " + reason);
      value.items.push_back(node.Scalar());
    }
    config_->values_[key.path] = std::move(value);
  }

  void Walk(const YAML::Node& node, const std::string& prefix) {
    const ConfigSchema& schema = *config_->schema_;
    // yaml-cpp keeps every pair of a mapping, repeated keys too; the last
    // would silently win.
    std::map<std::string, std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (!it->first.IsScalar()) {
        throw ConfigError(Where(source_, it->first.Mark()) + ": a key must be a plain name" +
                          (prefix.empty() ? "" : " (in section '" + prefix + "')"));
      }
      const std::string name = it->first.as<std::string>();
      const std::string path = prefix.empty() ? name : prefix + "." + name;
      const std::string where = Where(source_, it->first.Mark());
      const auto [first, inserted] = seen.emplace(name, where);
      if (!inserted) {
        throw ConfigError(where + ": duplicate key '" + path + "' (first given at " +
                          first->second + ")");
      }
      if (const ConfigKey* key = schema.Find(path)) {
        SetValue(*key, it->second, where);
        continue;
      }
      if (IsSection(path)) {
        if (!it->second.IsMap()) {
          throw ConfigError(where + ": '" + path + "' is a section and must be a mapping of keys");
        }
        Walk(it->second, path);
        continue;
      }
      std::string message = where + ": unknown key '" + path + "'";
      const std::string suggestion = schema.Suggest(path);
      if (!suggestion.empty()) message += " (did you mean '" + suggestion + "'?)";
      throw ConfigError(message);
    }
  }

  void ApplyOverride(const std::string& text) {
    const std::size_t eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ConfigError("override '" + text + "': expected key.path=value");
    }
    const std::string path = text.substr(0, eq);
    const std::string where = "override '" + text + "'";
    const ConfigKey* key = config_->schema_->Find(path);
    if (!key) {
      std::string message = where + ": unknown key '" + path + "'";
      const std::string suggestion = config_->schema_->Suggest(path);
      if (!suggestion.empty()) message += " (did you mean '" + suggestion + "'?)";
      if (IsSection(path)) message = where + ": '" + path + "' is a section, not a key";
      throw ConfigError(message);
    }
    YAML::Node node;
    try {
      node = YAML::Load(text.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      throw ConfigError(where + ": the value is not valid YAML: " + e.msg);
    }
    SetValue(*key, node, where);
  }

  bool IsSection(const std::string& path) const {
    for (const ConfigKey& key : config_->schema_->keys()) {
      if (key.path.size() > path.size() && key.path.compare(0, path.size(), path) == 0 &&
          key.path[path.size()] == '.') {
        return true;
      }
    }
    return false;
  }

 private:
  Config* config_;
  std::string source_;
};

Config Config::FromYaml(const ConfigSchema& schema, const std::string& yaml_text,
                        const std::string& source, const std::vector<std::string>& overrides) {
  Config config;
  config.schema_ = std::make_shared<const ConfigSchema>(schema);
  config.source_ = source;
  ConfigBuilder builder(&config, source);
  for (const ConfigKey& key : schema.keys()) {
    if (key.required) continue;
    // Scalars are taken as text (an empty string stays a string); lists parse.
    builder.SetValue(key, IsList(key.type) ? YAML::Load(key.default_value)
                                           : YAML::Node(key.default_value),
                     "default");
  }
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
    YAML::Mark second;
    if (SecondDocument(yaml_text, &second)) {
      throw ConfigError(Where(source, second) +
                        ": a second YAML document starts here (after '---', or where the "
                        "first cannot go on); a config is one document");
    }
  } catch (const YAML::Exception& e) {
    // yaml-cpp's depth guard says only "bad file" (with no position).
    const bool too_deep = e.msg.find("depth") != std::string::npos || e.msg == "bad file";
    throw ConfigError(Where(source, e.mark) + ": malformed YAML: " +
                      (too_deep ? "nested too deeply (a config is sections of keys, at most a "
                                  "few levels deep)"
                                : e.msg));
  }
  if (root.IsDefined() && !root.IsNull()) {
    if (!root.IsMap()) {
      throw ConfigError(Where(source, root.Mark()) + ": the config must be a mapping of sections");
    }
    builder.Walk(root, "");
  }
  for (const std::string& text : overrides) builder.ApplyOverride(text);
  builder.ResolveFollowingDefaults();
  for (const ConfigKey& key : schema.keys()) {
    if (key.required && !config.values_.count(key.path)) {
      throw ConfigError(source + ": missing required key '" + key.path + "' (" + key.doc + ")");
    }
  }
  return config;
}

Config Config::FromFile(const ConfigSchema& schema, const std::string& path,
                        const std::vector<std::string>& overrides) {
  std::error_code error;
  // A directory opens as an empty stream on Linux, which would read as an
  // empty config and train the defaults.
  if (std::filesystem::is_directory(path, error)) {
    throw ConfigError(path + ": is a directory, not a config file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open the config file");
  // Read at most one byte past the cap, so an endless source (/dev/zero, a
  // pipe) is refused instead of filling memory.
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw ConfigError(path + ": cannot read the config file");
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > kMaxConfigBytes) {
    throw ConfigError(path + ": larger than " + std::to_string(kMaxConfigBytes >> 20) +
                      " MiB; not a config file");
  }
  return FromYaml(schema, text, path, overrides);
}

void Config::Set(const std::string& override_text) {
  ConfigBuilder builder(this, source_);
  builder.ApplyOverride(override_text);
  builder.ResolveFollowingDefaults();
}

const Config::Value& Config::Lookup(const std::string& path, ConfigType expected) const {
  const ConfigKey* key = schema_ ? schema_->Find(path) : nullptr;
  SP_CHECK(key != nullptr, "Config: no key '", path, "' in the schema");
  const bool compatible = key->type == expected ||
                          (expected == ConfigType::kString && key->type == ConfigType::kEnum) ||
                          (expected == ConfigType::kDouble && key->type == ConfigType::kInt);
  SP_CHECK(compatible, "Config: key '", path, "' is ", TypeName(key->type), ", not ",
           TypeName(expected));
  auto it = values_.find(path);
  SP_CHECK(it != values_.end(), "Config: key '", path, "' has no value");
  return it->second;
}

bool Config::GetBool(const std::string& path) const {
  return Lookup(path, ConfigType::kBool).items[0] == "true";
}

int64_t Config::GetInt(const std::string& path) const {
  int64_t value = 0;
  ParseInt(Lookup(path, ConfigType::kInt).items[0], &value);
  return value;
}

double Config::GetDouble(const std::string& path) const {
  double value = 0;
  ParseDouble(Lookup(path, ConfigType::kDouble).items[0], &value);
  return value;
}

std::string Config::GetString(const std::string& path) const {
  return Lookup(path, ConfigType::kString).items[0];
}

std::vector<std::string> Config::GetStringList(const std::string& path) const {
  return Lookup(path, ConfigType::kStringList).items;
}

std::vector<double> Config::GetDoubleList(const std::string& path) const {
  std::vector<double> values;
  for (const std::string& item : Lookup(path, ConfigType::kDoubleList).items) {
    double v = 0;
    ParseDouble(item, &v);
    values.push_back(v);
  }
  return values;
}

std::string Config::Origin(const std::string& path) const {
  auto it = values_.find(path);
  return it == values_.end() ? "" : it->second.origin;
}

std::string Config::ValueText(const std::string& path) const {
  auto it = values_.find(path);
  if (it == values_.end()) return "";
  const ConfigKey* key = schema_->Find(path);
  if (key == nullptr || !IsList(key->type)) return it->second.items[0];
  std::string text = "[";
  for (std::size_t i = 0; i < it->second.items.size(); ++i) {
    text += (i ? ", " : "") + it->second.items[i];
  }
  return text + "]";
}

std::string Config::ToYaml() const {
  // A map root from the start: copies of a YAML::Node share its storage only
  // once it exists.
  YAML::Node root(YAML::NodeType::Map);
  for (const ConfigKey& key : schema_->keys()) {
    auto it = values_.find(key.path);
    if (it == values_.end()) continue;
    std::vector<std::string> segments;
    std::stringstream stream(key.path);
    std::string segment;
    while (std::getline(stream, segment, '.')) segments.push_back(segment);
    // Walk to the parent mapping, creating sections in schema order.
    YAML::Node parent = root;
    for (std::size_t i = 0; i + 1 < segments.size(); ++i) {
      if (!parent[segments[i]]) parent[segments[i]] = YAML::Node(YAML::NodeType::Map);
      parent.reset(parent[segments[i]]);
    }
    if (IsList(key.type)) {
      YAML::Node list(YAML::NodeType::Sequence);
      for (const std::string& item : it->second.items) list.push_back(item);
      list.SetStyle(YAML::EmitterStyle::Flow);
      parent[segments.back()] = list;
    } else {
      parent[segments.back()] = it->second.items[0];
    }
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace stillpoint
