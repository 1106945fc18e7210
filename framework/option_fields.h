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
// config layer (training/config/option_schema.h) turns the declaration into schema
// keys under a section and reads a resolved config back into the struct.
#pragma once

#include <charconv>
#include <cstdint>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace stillpoint {

// The shortest text that reads back as the same double: 0.1, 1e-06, 40.
inline std::string ShortestNumberText(double value) {
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::general);
  return std::string(buffer, result.ptr);
}

enum class OptionKind { kBool, kInt, kDouble, kString, kEnum, kStringList, kDoubleList };

// The values a numeric field accepts: [min, max] with either end open, and
// optionally 0 besides (a field whose 0 turns a feature off). NaN is never
// inside; with max the largest double, infinity is not either.
struct OptionBounds {
  double min = 0;
  double max = 0;
  bool min_open = false;
  bool max_open = false;
  bool zero_allowed = false;

  static OptionBounds Closed(double min, double max) { return {min, max}; }
  // (min, max], e.g. a damping factor in (0, 1].
  static OptionBounds OpenClosed(double min, double max) { return {min, max, true, false}; }
  static OptionBounds Open(double min, double max) { return {min, max, true, true}; }
  // The same bounds, with 0 allowed too.
  OptionBounds OrZero() const {
    OptionBounds bounds = *this;
    bounds.zero_allowed = true;
    return bounds;
  }

  bool Contains(double value) const {
    if (zero_allowed && value == 0) return true;
    const bool above = min_open ? value > min : value >= min;
    const bool below = max_open ? value < max : value <= max;
    return above && below;  // false for NaN
  }
  // "[0, 1]", "(0, 1]", "0 or [1, 1.7976931348623157e+308]".
  std::string Text() const {
    return std::string(zero_allowed ? "0 or " : "") + (min_open ? "(" : "[") +
           ShortestNumberText(min) + ", " + ShortestNumberText(max) + (max_open ? ")" : "]");
  }
};

template <typename Options>
class OptionFields {
 public:
  struct Field {
    std::string name;  // the key below its section, e.g. "max_iterations"
    std::string doc;
    OptionKind kind = OptionKind::kInt;
    // kInt, kDouble, kDoubleList (each item): the values accepted.
    OptionBounds bounds;
    // kEnum: the names of the values; kStringList: the allowed items
    // (empty: any).
    std::vector<std::string> choices;
    // Whether the field is a config key (NotInConfig: a setting for code
    // only, still validated and printed).
    bool in_config = true;
    // Whether the field is read by the options it is part of (AppliesWhen;
    // nullptr: always): a field that does not apply yet differs from its
    // default is reported as unused (Unused).
    std::function<bool(const Options&)> applies;
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
      switch (kind) {
        case OptionKind::kBool:
          return get_number(options) != 0 ? "true" : "false";
        case OptionKind::kInt:
          out << static_cast<int64_t>(get_number(options));
          return out.str();
        case OptionKind::kDouble:
          return ShortestNumberText(get_number(options));
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
          for (std::size_t i = 0; i < items.size(); ++i) {
            out << (i ? ", " : "") << ShortestNumberText(items[i]);
          }
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
    return Int(name, member,
               OptionBounds::Closed(static_cast<double>(min), static_cast<double>(max)), doc);
  }
  template <typename Integer>
  OptionFields& Int(const std::string& name, Integer Options::*member, const OptionBounds& bounds,
                    const std::string& doc) {
    static_assert(std::is_integral_v<Integer> && !std::is_same_v<Integer, bool>);
    Field field = Make(name, OptionKind::kInt, doc);
    field.bounds = bounds;
    field.get_number = [member](const Options& o) { return static_cast<double>(o.*member); };
    field.set_number = [member](Options& o, double v) { o.*member = static_cast<Integer>(v); };
    return Add(std::move(field));
  }
  OptionFields& Double(const std::string& name, double Options::*member, double min, double max,
                       const std::string& doc) {
    return Double(name, member, OptionBounds::Closed(min, max), doc);
  }
  OptionFields& Double(const std::string& name, double Options::*member,
                       const OptionBounds& bounds, const std::string& doc) {
    Field field = Make(name, OptionKind::kDouble, doc);
    field.bounds = bounds;
    field.get_number = [member](const Options& o) { return o.*member; };
    field.set_number = [member](Options& o, double v) { o.*member = v; };
    return Add(std::move(field));
  }
  OptionFields& Bool(const std::string& name, bool Options::*member, const std::string& doc) {
    Field field = Make(name, OptionKind::kBool, doc);
    field.bounds = OptionBounds::Closed(0, 1);
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
  // A list of enum values, named by `to_string` among `values`.
  template <typename E>
  OptionFields& EnumList(const std::string& name, std::vector<E> Options::*member,
                         const std::vector<E>& values, const char* (*to_string)(E),
                         const std::string& doc) {
    Field field = Make(name, OptionKind::kStringList, doc);
    for (E value : values) field.choices.push_back(to_string(value));
    field.get_texts = [member, to_string](const Options& o) {
      std::vector<std::string> names;
      for (E value : o.*member) names.push_back(to_string(value));
      return names;
    };
    field.set_texts = [member, values, to_string, name](Options& o,
                                                        const std::vector<std::string>& texts) {
      std::vector<E> parsed;
      for (const std::string& text : texts) {
        bool found = false;
        for (E value : values) {
          if (text == to_string(value)) {
            parsed.push_back(value);
            found = true;
            break;
          }
        }
        if (!found) throw std::invalid_argument(name + ": unknown value '" + text + "'");
      }
      o.*member = parsed;
    };
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
    field.bounds = OptionBounds::Closed(min, max);
    field.get_numbers = [member](const Options& o) { return o.*member; };
    field.set_numbers = [member](Options& o, const std::vector<double>& v) { o.*member = v; };
    return Add(std::move(field));
  }

  // The fields of a member struct, declared by its own Fields(), named
  // prefix + their name (e.g. "key_adaptation." + "iterations"); `names`
  // (empty: all) picks some of them, in this order, so a section can
  // interleave a member's fields with its own. `applies` (nullptr: always)
  // says when the member is read at all; a field's own condition still holds.
  template <typename Sub>
  OptionFields& Include(const std::string& prefix, Sub Options::*member,
                        const OptionFields<Sub>& sub, const std::vector<std::string>& names = {},
                        std::function<bool(const Options&)> applies = nullptr) {
    std::vector<const typename OptionFields<Sub>::Field*> picked;
    if (names.empty()) {
      for (const auto& field : sub.fields()) picked.push_back(&field);
    } else {
      for (const std::string& name : names) {
        const typename OptionFields<Sub>::Field* found = nullptr;
        for (const auto& field : sub.fields()) {
          if (field.name == name) found = &field;
        }
        if (found == nullptr) throw std::invalid_argument("Include: no field '" + name + "'");
        picked.push_back(found);
      }
    }
    for (const auto* s : picked) Add(Wrap(prefix, member, *s, applies));
    return *this;
  }

  // Keeps the field declared last out of the config schema.
  OptionFields& NotInConfig() {
    fields_.back().in_config = false;
    return *this;
  }

  // The field declared last is read only when `applies` says so (e.g. an
  // Anderson setting when the solver is Anderson).
  OptionFields& AppliesWhen(std::function<bool(const Options&)> applies) {
    fields_.back().applies = std::move(applies);
    return *this;
  }

  const std::vector<Field>& fields() const { return fields_; }

  // The fields of `options` that do not apply to them yet differ from
  // `defaults`: settings that would be silently ignored.
  std::vector<const Field*> Unused(const Options& options,
                                   const Options& defaults = Options()) const {
    std::vector<const Field*> unused;
    for (const Field& field : fields_) {
      if (field.applies && !field.applies(options) &&
          field.Text(options) != field.Text(defaults)) {
        unused.push_back(&field);
      }
    }
    return unused;
  }

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
  // A field of the member struct `member` as a field of Options.
  template <typename Sub>
  static Field Wrap(const std::string& prefix, Sub Options::*member,
                    const typename OptionFields<Sub>::Field& s,
                    const std::function<bool(const Options&)>& applies) {
    Field field = Make(prefix + s.name, s.kind, s.doc);
    field.bounds = s.bounds;
    field.choices = s.choices;
    field.in_config = s.in_config;
    if (applies || s.applies) {
      field.applies = [member, applies, inner = s.applies](const Options& o) {
        return (!applies || applies(o)) && (!inner || inner(o.*member));
      };
    }
    if (s.get_number) {
      field.get_number = [member, get = s.get_number](const Options& o) { return get(o.*member); };
      field.set_number = [member, set = s.set_number](Options& o, double v) { set(o.*member, v); };
    }
    if (s.get_text) {
      field.get_text = [member, get = s.get_text](const Options& o) { return get(o.*member); };
      field.set_text = [member, set = s.set_text](Options& o, const std::string& v) {
        set(o.*member, v);
      };
    }
    if (s.get_texts) {
      field.get_texts = [member, get = s.get_texts](const Options& o) { return get(o.*member); };
      field.set_texts = [member, set = s.set_texts](Options& o,
                                                    const std::vector<std::string>& v) {
        set(o.*member, v);
      };
    }
    if (s.get_numbers) {
      field.get_numbers = [member, get = s.get_numbers](const Options& o) {
        return get(o.*member);
      };
      field.set_numbers = [member, set = s.set_numbers](Options& o, const std::vector<double>& v) {
        set(o.*member, v);
      };
    }
    return field;
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
        if (!field.bounds.Contains(field.get_number(options))) {
          return field.name + " = " + field.Text(options) + " is outside " + field.bounds.Text();
        }
        return "";
      case OptionKind::kDoubleList:
        for (double value : field.get_numbers(options)) {
          if (!field.bounds.Contains(value)) {
            return field.name + " holds " + field.Text(options) + ", outside " +
                   field.bounds.Text();
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
