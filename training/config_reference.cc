#include "training/config_reference.h"

#include <yaml-cpp/yaml.h>

#include <map>
#include <memory>
#include <sstream>

#include "training/metrics.h"

namespace stillpoint {
namespace {

// A key's default as JSON: strings quoted, lists as arrays.
std::string DefaultJson(const ConfigKey& key) {
  auto scalar = [&](const std::string& text, bool is_string) {
    return is_string ? JsonString(text) : text;
  };
  switch (key.type) {
    case ConfigType::kBool:
    case ConfigType::kInt:
    case ConfigType::kDouble:
      return key.default_value;
    case ConfigType::kString:
    case ConfigType::kEnum:
      return JsonString(key.default_value);
    case ConfigType::kStringList:
    case ConfigType::kDoubleList: {
      const YAML::Node list = YAML::Load(key.default_value);
      std::string out = "[";
      for (std::size_t i = 0; i < list.size(); ++i) {
        out += (i ? ", " : "") +
               scalar(list[i].Scalar(), key.type == ConfigType::kStringList);
      }
      return out + "]";
    }
  }
  return "null";
}

std::string EnumJson(const std::vector<std::string>& choices) {
  std::string out = "[";
  for (std::size_t i = 0; i < choices.size(); ++i) out += (i ? ", " : "") + JsonString(choices[i]);
  return out + "]";
}

// The range keywords; a key that also allows 0 ("0: off") accepts either
// the range or the constant 0.
std::string Bounds(const ConfigKey& key) {
  std::string out;
  if (key.has_min) {
    out += std::string(key.min_open ? ", \"exclusiveMinimum\": " : ", \"minimum\": ") +
           JsonNumber(key.min);
  }
  if (key.has_max) {
    out += std::string(key.max_open ? ", \"exclusiveMaximum\": " : ", \"maximum\": ") +
           JsonNumber(key.max);
  }
  if (key.zero_allowed && !out.empty()) out = ", \"anyOf\": [{\"const\": 0}, {" + out.substr(2) + "}]";
  return out;
}

std::string KeySchema(const ConfigKey& key) {
  std::string out = "{\"description\": " + JsonString(key.doc);
  switch (key.type) {
    case ConfigType::kBool:
      out += ", \"type\": \"boolean\"";
      break;
    case ConfigType::kInt:
      out += ", \"type\": \"integer\"" + Bounds(key);
      break;
    case ConfigType::kDouble:
      out += ", \"type\": \"number\"" + Bounds(key);
      break;
    case ConfigType::kString:
      // An empty value (`key:`) reads as "".
      out += ", \"type\": [\"string\", \"null\"]";
      if (!key.choices.empty()) out += ", \"enum\": " + EnumJson(key.choices);
      break;
    case ConfigType::kEnum:
      out += ", \"type\": \"string\", \"enum\": " + EnumJson(key.choices);
      break;
    case ConfigType::kStringList:
      out += ", \"type\": \"array\", \"items\": {\"type\": \"string\"";
      if (!key.choices.empty()) out += ", \"enum\": " + EnumJson(key.choices);
      out += "}";
      break;
    case ConfigType::kDoubleList:
      out += ", \"type\": \"array\", \"items\": {\"type\": \"number\"" + Bounds(key) + "}";
      break;
  }
  if (!key.required) out += ", \"default\": " + DefaultJson(key);
  return out + "}";
}

// The keys as a tree of sections.
struct Section {
  std::vector<std::pair<std::string, std::unique_ptr<Section>>> children;  // in schema order
  const ConfigKey* key = nullptr;
  Section* Child(const std::string& name) {
    for (auto& [child_name, child] : children) {
      if (child_name == name) return child.get();
    }
    children.emplace_back(name, std::make_unique<Section>());
    return children.back().second.get();
  }
};

// head: members written first (the root's $schema, title, description).
void WriteSection(const Section& section, int indent, std::ostringstream& out,
                  const std::string& head = "") {
  const std::string pad(static_cast<std::size_t>(indent), ' ');
  out << "{" << head << "\"type\": \"object\", \"additionalProperties\": false";
  std::vector<std::string> required;
  for (const auto& [name, child] : section.children) {
    if (child->key && child->key->required) required.push_back(name);
  }
  if (!required.empty()) out << ", \"required\": " << EnumJson(required);
  out << ", \"properties\": {";
  bool first = true;
  for (const auto& [name, child] : section.children) {
    out << (first ? "\n" : ",\n") << pad << "  " << JsonString(name) << ": ";
    first = false;
    if (child->key) {
      out << KeySchema(*child->key);
    } else {
      WriteSection(*child, indent + 2, out);
    }
  }
  out << "\n" << pad << "}}";
}

}  // namespace

std::string ConfigReferenceText(const ConfigSchema& schema) {
  std::ostringstream out;
  std::string section;
  for (const ConfigKey& key : schema.keys()) {
    const std::size_t dot = key.path.find('.');
    const std::string top = dot == std::string::npos ? "top level" : key.path.substr(0, dot);
    if (top != section) {
      out << (section.empty() ? "" : "\n") << "[" << top << "]\n";
      section = top;
    }
    out << "  " << key.path << " = " << (key.required ? "(required)" : key.default_value);
    if (!key.choices.empty()) {
      out << "  (";
      for (std::size_t i = 0; i < key.choices.size(); ++i) out << (i ? " | " : "") << key.choices[i];
      out << ")";
    }
    out << "\n      " << key.doc << "\n";
  }
  return out.str();
}

std::string ConfigJsonSchema(const ConfigSchema& schema) {
  Section root;
  for (const ConfigKey& key : schema.keys()) {
    Section* at = &root;
    std::size_t begin = 0;
    while (true) {
      const std::size_t dot = key.path.find('.', begin);
      at = at->Child(key.path.substr(begin, dot == std::string::npos ? dot : dot - begin));
      if (dot == std::string::npos) break;
      begin = dot + 1;
    }
    at->key = &key;
  }
  std::ostringstream out;
  WriteSection(root, 0, out,
               "\"$schema\": \"http://json-schema.org/draft-07/schema#\", \"title\": "
               "\"stillpoint config\", \"description\": \"A stillpoint YAML config (stillpoint "
               "config --doc describes every key)\", ");
  out << "\n";
  return out.str();
}

std::string ConfigKeyList(const ConfigSchema& schema) {
  std::string out;
  for (const ConfigKey& key : schema.keys()) out += key.path + "\n";
  return out;
}

}  // namespace stillpoint
