// Options structs that describe themselves: a struct declares each of its
// fields once, with its name, member, range (or choices) and meaning, and
// validation, printing, the config schema and YAML reading all come from
// that one declaration, so they cannot disagree:
//
//   struct TrainerOptions {
//     int64_t steps = 300;
//     double clip_norm = 1.0;
//     static const OptionFields<TrainerOptions>& Fields();
//   };
//   const OptionFields<TrainerOptions>& TrainerOptions::Fields() {
//     static const auto* fields = &(new OptionFields<TrainerOptions>)
//         ->Int("steps", &TrainerOptions::steps, 0, kBig, "Optimizer steps")
//         .Double("clip_norm", &TrainerOptions::clip_norm, 0, kInf, "...");
//     return *fields;
//   }
//
// The defaults are those of a default-constructed struct. Check() is the
// struct's range check; Describe() its one-line-per-field printout; the
// config layer (training/option_schema.h) turns the declaration into schema
// keys under a section and reads a resolved config back into the struct.
#pragma once

#include <cstdint>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace stillpoint {

enum class OptionKind { kBool, kInt, kDouble, kString, kEnum, kStringList, kDoubleList };

template <typename Options>
class OptionFields {
 public:
  struct Field {
    std::string name;  // the key below its section, e.g. "max_iterations"
    std::string doc;
    OptionKind kind = OptionKind::kInt;
    // kInt, kDouble, kDoubleList (each item): the closed range of values.
    double min = 0;
    double max = 0;
    // kEnum: the names of the values; kStringList: the allowed items
    // (empty: any).
    std::vector<std::string> choices;
    // kBool (0/1), kInt, kDouble.
    std::function<double(const Options&)> get_number;
    std::function<void(Options&, double)> set_number;
    // kString, kEnum (the value's name).
    std::function<std::string(const Options&)> get_text;
    std::function<void(Options&, const std::string&)> set_text;
    // kStringList.
    std::function<std::vector<std::string>(const Options&)> get_texts;
    std::function<void(Options&, const std::vector<std::string>&)> set_texts;
    // kDoubleList.
    std::function<std::vector<double>(const Options&)> get_numbers;
    std::function<void(Options&, const std::vector<double>&)> set_numbers;

    // The value as it prints in Describe and in YAML: 3, 0.001, true,
    // anderson, [csv, jsonl].
    std::string Text(const Options& options) const {
      std::ostringstream out;
      out.precision(17);
      switch (kind) {
        case OptionKind::kBool:
          return get_number(options) != 0 ? "true" : "false";
        case OptionKind::kInt:
          out << static_cast<int64_t>(get_number(options));
          return out.str();
        case OptionKind::kDouble:
          out << get_number(options);
          return out.str();
        case OptionKind::kString:
        case OptionKind::kEnum:
          return get_text(options);
        case OptionKind::kStringList: {
          out << "[";
          const std::vector<std::string> items = get_texts(options);
          for (std::size_t i = 0; i < items.size(); ++i) out << (i ? ", " : "") << items[i];
          out << "]";
          return out.str();
        }
        case OptionKind::kDoubleList: {
          out << "[";
          const std::vector<double> items = get_numbers(options);
          for (std::size_t i = 0; i < items.size(); ++i) out << (i ? ", " : "") << items[i];
          out << "]";
          return out.str();
        }
      }
      return "";
    }
  };

  // Adders return *this, so a declaration reads as one list.
  template <typename Integer>
  OptionFields& Int(const std::string& name, Integer Options::*member, int64_t min, int64_t max,
                    const std::string& doc) {
    static_assert(std::is_integral_v<Integer> && !std::is_same_v<Integer, bool>);
    Field field = Make(name, OptionKind::kInt, doc);
    field.min = static_cast<double>(min);
    field.max = static_cast<double>(max);
    field.get_number = [member](const Options& o) { return static_cast<double>(o.*member); };
    field.set_number = [member](Options& o, double v) { o.*member = static_cast<Integer>(v); };
    return Add(std::move(field));
  }
  OptionFields& Double(const std::string& name, double Options::*member, double min, double max,
                       const std::string& doc) {
    Field field = Make(name, OptionKind::kDouble, doc);
    field.min = min;
    field.max = max;
    field.get_number = [member](const Options& o) { return o.*member; };
    field.set_number = [member](Options& o, double v) { o.*member = v; };
    return Add(std::move(field));
  }
  OptionFields& Bool(const std::string& name, bool Options::*member, const std::string& doc) {
    Field field = Make(name, OptionKind::kBool, doc);
    field.max = 1;
    field.get_number = [member](const Options& o) { return o.*member ? 1.0 : 0.0; };
    field.set_number = [member](Options& o, double v) { o.*member = v != 0; };
    return Add(std::move(field));
  }
  OptionFields& String(const std::string& name, std::string Options::*member,
                       const std::string& doc) {
    Field field = Make(name, OptionKind::kString, doc);
    field.get_text = [member](const Options& o) { return o.*member; };
    field.set_text = [member](Options& o, const std::string& v) { o.*member = v; };
    return Add(std::move(field));
  }
  // An enum member, named by `to_string` among `values` (its choices).
  template <typename E>
  OptionFields& Enum(const std::string& name, E Options::*member, const std::vector<E>& values,
                     const char* (*to_string)(E),
                     const std::string& doc) {
    Field field = Make(name, OptionKind::kEnum, doc);
    for (E value : values) field.choices.push_back(to_string(value));
    field.get_text = [member, to_string](const Options& o) { return to_string(o.*member); };
    field.set_text = [member, values, to_string, name](Options& o, const std::string& text) {
      for (E value : values) {
        if (text == to_string(value)) {
          o.*member = value;
          return;
        }
      }
      throw std::invalid_argument(name + ": unknown value '" + text + "'");
    };
    return Add(std::move(field));
  }
  // A string member restricted to `choices` (an enum kept as its name).
  OptionFields& Choice(const std::string& name, std::string Options::*member,
                       const std::vector<std::string>& choices, const std::string& doc) {
    Field field = Make(name, OptionKind::kEnum, doc);
    field.choices = choices;
    field.get_text = [member](const Options& o) { return o.*member; };
    field.set_text = [member](Options& o, const std::string& v) { o.*member = v; };
    return Add(std::move(field));
  }
  OptionFields& StringList(const std::string& name, std::vector<std::string> Options::*member,
                           const std::vector<std::string>& choices, const std::string& doc) {
    Field field = Make(name, OptionKind::kStringList, doc);
    field.choices = choices;
    field.get_texts = [member](const Options& o) { return o.*member; };
    field.set_texts = [member](Options& o, const std::vector<std::string>& v) { o.*member = v; };
    return Add(std::move(field));
  }
  OptionFields& DoubleList(const std::string& name, std::vector<double> Options::*member,
                           double min, double max, const std::string& doc) {
    Field field = Make(name, OptionKind::kDoubleList, doc);
    field.min = min;
    field.max = max;
    field.get_numbers = [member](const Options& o) { return o.*member; };
    field.set_numbers = [member](Options& o, const std::vector<double>& v) { o.*member = v; };
    return Add(std::move(field));
  }

  const std::vector<Field>& fields() const { return fields_; }

  // The first field of `options` outside its range or choices, as
  // "max_iterations = -1 is outside [0, 1048576]"; "" when all are valid.
  std::string Check(const Options& options) const {
    for (const Field& field : fields_) {
      const std::string problem = CheckField(field, options);
      if (!problem.empty()) return problem;
    }
    return "";
  }

  // "name: value" per field, one per line, each line after the first
  // starting with `indent`.
  std::string Describe(const Options& options, const std::string& indent = "") const {
    std::string out;
    for (const Field& field : fields_) {
      if (!out.empty()) out += "\n" + indent;
      out += field.name + ": " + field.Text(options);
    }
    return out;
  }

 private:
  static Field Make(const std::string& name, OptionKind kind, const std::string& doc) {
    Field field;
    field.name = name;
    field.kind = kind;
    field.doc = doc;
    return field;
  }
  OptionFields& Add(Field field) {
    fields_.push_back(std::move(field));
    return *this;
  }
  static std::string Range(const Field& field) {
    std::ostringstream out;
    out.precision(17);
    out << "[" << field.min << ", " << field.max << "]";
    return out.str();
  }
  static bool InRange(const Field& field, double value) {
    return value >= field.min && value <= field.max;  // false for NaN
  }
  static bool IsChoice(const Field& field, const std::string& value) {
    if (field.choices.empty()) return true;
    for (const std::string& choice : field.choices) {
      if (choice == value) return true;
    }
    return false;
  }
  static std::string CheckField(const Field& field, const Options& options) {
    switch (field.kind) {
      case OptionKind::kInt:
      case OptionKind::kDouble:
        if (!InRange(field, field.get_number(options))) {
          return field.name + " = " + field.Text(options) + " is outside " + Range(field);
        }
        return "";
      case OptionKind::kDoubleList:
        for (double value : field.get_numbers(options)) {
          if (!InRange(field, value)) {
            return field.name + " holds " + field.Text(options) + ", outside " +
                   Range(field);
          }
        }
        return "";
      case OptionKind::kEnum:
        if (!IsChoice(field, field.get_text(options))) {
          return field.name + " = " + field.get_text(options) + " is not one of its choices";
        }
        return "";
      case OptionKind::kStringList:
        for (const std::string& item : field.get_texts(options)) {
          if (!IsChoice(field, item)) {
            return field.name + " holds '" + item + "', not one of its choices";
          }
        }
        return "";
      case OptionKind::kBool:
      case OptionKind::kString:
        return "";
    }
    return "";
  }

  std::vector<Field> fields_;
};

}  // namespace stillpoint
