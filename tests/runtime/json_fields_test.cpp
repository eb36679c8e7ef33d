// integer_field: JSON integers from users and files, range-checked instead of cast unchecked.
#include "dsgd/common/json_fields.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace dsgd::runtime {
namespace {

using nlohmann::json;

std::string error_of(const json& j, const std::string& key) {
  try {
    integer_field(j, key, int32_t{0});
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(IntegerField, AbsentIsTheFallbackAndWholeNumbersOfEitherJsonKindAreRead) {
  EXPECT_EQ(integer_field(json::object(), "n", int64_t{42}), 42);
  EXPECT_EQ(integer_field(json{{"n", 7}}, "n", int64_t{0}), 7);
  EXPECT_EQ(integer_field(json{{"n", -7}}, "n", int64_t{0}), -7);
  EXPECT_EQ(integer_field(json::parse(R"({"n": 1e4})"), "n", int64_t{0}), 10000);
  EXPECT_EQ(integer_field(json::parse(R"({"n": 18446744073709551615})"), "n", uint64_t{0}), UINT64_MAX);
  EXPECT_EQ(integer_field(json::parse(R"({"n": -2147483648})"), "n", int32_t{0}), INT32_MIN);
  EXPECT_EQ(integer_field(json::parse(R"({"n": -9.223372036854775808e18})"), "n", int64_t{0}), INT64_MIN);
}

TEST(IntegerField, FractionsOutOfRangeAndNonNumbersNameTheKeyAndValue) {
  // What the config fuzzer found: 10000E020 is a float far past an int64.
  EXPECT_THROW(integer_field(json::parse(R"({"n": 10000E020})"), "n", int64_t{0}), std::invalid_argument);
  EXPECT_THROW(integer_field(json::parse(R"({"n": 9.223372036854775808e18})"), "n", int64_t{0}), std::invalid_argument);
  EXPECT_THROW(integer_field(json::parse(R"({"n": 18446744073709551615})"), "n", int64_t{0}), std::invalid_argument);
  EXPECT_THROW(integer_field(json::parse(R"({"n": -1})"), "n", uint32_t{0}), std::invalid_argument);
  EXPECT_THROW(integer_field(json::parse(R"({"n": -0.5})"), "n", uint32_t{0}), std::invalid_argument);
  EXPECT_EQ(error_of(json::parse(R"({"samples": 3.5})"), "samples"),
            "'samples' must be a whole number in -2147483648..2147483647, got 3.5");
  EXPECT_EQ(error_of(json::parse(R"({"samples": 2147483648})"), "samples"),
            "'samples' must be a whole number in -2147483648..2147483647, got 2147483648");
  EXPECT_EQ(error_of(json{{"samples", "many"}}, "samples"), "'samples' must be a number, got \"many\"");
  EXPECT_EQ(error_of(json{{"samples", true}}, "samples"), "'samples' must be a number, got true");
}

}  // namespace
}  // namespace dsgd::runtime
