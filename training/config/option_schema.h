// The config side of self-describing options (framework/option_fields.h):
// an Options struct's field declaration becomes the schema keys of a
// section (defaults from a default-constructed struct, ranges and choices
// from the declaration), and a resolved config is read back into the
// struct, so a new config key is one line in the struct's declaration.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "framework/option_fields.h"
#include "training/config/config.h"

namespace stillpoint {

// Adds one key per field, `prefix` + name (e.g. "train." + "steps"), with
// `defaults`' value as its default.
// `include` (nullptr: every field) leaves out the fields it returns false
// for, by name.
using OptionFilter = std::function<bool(const std::string& name)>;

template <typename Options>
void AddOptionKeys(ConfigSchema& schema, const std::string& prefix,
                   const OptionFields<Options>& fields, const Options& defaults = Options(),
                   const OptionFilter& include = nullptr) {
  using Field = typename OptionFields<Options>::Field;
  for (const Field& f : fields.fields()) {
    if (!f.in_config || (include && !include(f.name))) continue;
    const std::string path = prefix + f.name;
    switch (f.kind) {
      case OptionKind::kBool:
        schema.Bool(path, f.get_number(defaults) != 0, f.doc);
        break;
      case OptionKind::kInt:
        schema.Int(path, static_cast<int64_t>(f.get_number(defaults)), f.doc, f.bounds);
        break;
      case OptionKind::kDouble:
        schema.Double(path, f.get_number(defaults), f.doc, f.bounds);
        break;
      case OptionKind::kString:
        schema.String(path, f.get_text(defaults), f.doc);
        break;
      case OptionKind::kEnum:
        schema.Enum(path, f.get_text(defaults), f.choices, f.doc);
        break;
      case OptionKind::kStringList:
        schema.StringList(path, f.get_texts(defaults), f.choices, f.doc);
        break;
      case OptionKind::kDoubleList:
        schema.DoubleList(path, f.get_numbers(defaults), f.doc, f.bounds.min, f.bounds.max);
        break;
    }
  }
}

// The struct with every field read from `config`'s key prefix + name (the
// config was validated against a schema that AddOptionKeys filled).
// Fields left out by `include` keep their value in `options`.
template <typename Options>
Options ReadOptionKeys(const Config& config, const std::string& prefix,
                       const OptionFields<Options>& fields, Options options = Options(),
                       const OptionFilter& include = nullptr) {
  using Field = typename OptionFields<Options>::Field;
  for (const Field& f : fields.fields()) {
    if (!f.in_config || (include && !include(f.name))) continue;
    const std::string path = prefix + f.name;
    switch (f.kind) {
      case OptionKind::kBool:
        f.set_number(options, config.GetBool(path) ? 1.0 : 0.0);
        break;
      case OptionKind::kInt:
        f.set_number(options, static_cast<double>(config.GetInt(path)));
        break;
      case OptionKind::kDouble:
        f.set_number(options, config.GetDouble(path));
        break;
      case OptionKind::kString:
      case OptionKind::kEnum:
        f.set_text(options, config.GetString(path));
        break;
      case OptionKind::kStringList:
        f.set_texts(options, config.GetStringList(path));
        break;
      case OptionKind::kDoubleList:
        f.set_numbers(options, config.GetDoubleList(path));
        break;
    }
  }
  return options;
}

}  // namespace stillpoint
