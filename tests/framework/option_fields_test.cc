// framework/option_fields.h: a struct's field declaration validates,
// prints and sets its fields.
#include "framework/option_fields.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace stillpoint::option_fields_test {
namespace {

enum class Color { kRed, kBlue };
const char* ColorName(Color c) { return c == Color::kRed ? "red" : "blue"; }

struct Example {
  int count = 3;
  double damping = 1.0;
  double factor = 0.0;  // 0: off, else > 1
  bool verbose = false;
  Color color = Color::kRed;
  std::vector<Color> chain;
  std::vector<std::string> formats = {"csv"};

  static const OptionFields<Example>& Fields() {
    static const auto* fields =
        &(new OptionFields<Example>)
             ->Int("count", &Example::count, 1, 64, "how many")
             .Double("damping", &Example::damping, OptionBounds::OpenClosed(0, 1), "tau")
             .Double("factor", &Example::factor,
                     OptionBounds{1, std::numeric_limits<double>::max(), true, false}.OrZero(),
                     "a factor")
             .Bool("verbose", &Example::verbose, "talk")
             .Enum("color", &Example::color, {Color::kRed, Color::kBlue}, ColorName, "c")
             .EnumList("chain", &Example::chain, {Color::kRed, Color::kBlue}, ColorName, "cs")
             .StringList("formats", &Example::formats, {"csv", "jsonl"}, "f")
             .NotInConfig();
    return *fields;
  }
};

TEST(OptionFieldsTest, CheckNamesTheFirstFieldOutsideItsBounds) {
  Example e;
  EXPECT_EQ(Example::Fields().Check(e), "");
  e.count = 65;
  EXPECT_EQ(Example::Fields().Check(e), "count = 65 is outside [1, 64]");
  e.count = 64;
  e.damping = 0;  // open lower end
  EXPECT_EQ(Example::Fields().Check(e), "damping = 0 is outside (0, 1]");
  e.damping = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(Example::Fields().Check(e), "");
  e.damping = 1;
  e.factor = 0.5;
  EXPECT_EQ(Example::Fields().Check(e), "factor = 0.5 is outside 0 or (1, 1.7976931348623157e+308]");
  e.factor = std::numeric_limits<double>::infinity();
  EXPECT_NE(Example::Fields().Check(e), "");
  e.factor = 0;
  e.formats = {"csv", "xml"};
  EXPECT_EQ(Example::Fields().Check(e), "formats holds 'xml', not one of its choices");
}

TEST(OptionFieldsTest, DescribePrintsEveryFieldAndSettersRoundTrip) {
  Example e;
  e.chain = {Color::kBlue, Color::kRed};
  e.damping = 0.1;
  EXPECT_EQ(Example::Fields().Describe(e),
            "count: 3\ndamping: 0.1\nfactor: 0\nverbose: false\ncolor: red\nchain: [blue, red]\n"
            "formats: [csv]");
  Example copy;
  for (const auto& field : Example::Fields().fields()) {
    switch (field.kind) {
      case OptionKind::kEnum:
        field.set_text(copy, field.get_text(e));
        break;
      case OptionKind::kStringList:
        field.set_texts(copy, field.get_texts(e));
        break;
      default:
        if (field.get_number) field.set_number(copy, field.get_number(e));
    }
  }
  EXPECT_EQ(Example::Fields().Describe(copy), Example::Fields().Describe(e));
  const auto& color = Example::Fields().fields()[4];
  EXPECT_THROW(color.set_text(copy, "green"), std::invalid_argument);
  EXPECT_FALSE(Example::Fields().fields().back().in_config);
  EXPECT_TRUE(Example::Fields().fields().front().in_config);
}

}  // namespace
}  // namespace stillpoint::option_fields_test
