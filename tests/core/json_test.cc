#include "muse/core/json.h"

#include <gtest/gtest.h>

using muse::Json;

TEST(Json, ParsesAndKeepsKeyOrder) {
  auto r = Json::parse(R"({"b": 1, "a": [true, null, 2.5, "x\u00e9\ud83d\ude00"], "c": {"z": -3}})");
  ASSERT_TRUE(r.ok()) << r.message();
  const Json& j = *r;
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.as_object()[0].first, "b");
  EXPECT_EQ(j.as_object()[1].first, "a");
  EXPECT_EQ(j.find("a")->as_array()[3].as_string(), "x\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(j.dump(), R"({"b":1,"a":[true,null,2.5,"xé😀"],"c":{"z":-3}})");
  EXPECT_EQ(j.dump(muse::JsonDumpOptions::python()),
            R"({"b": 1, "a": [true, null, 2.5, "x\u00e9\ud83d\ude00"], "c": {"z": -3}})");
}

TEST(Json, RejectsBadInputWithPosition) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "01", "1.", "\"\\x\"", "\"\x01\"", "\"\xff\"",
                          "\"\\ud800\"", "nul", "[1] 2", "1e999"}) {
    auto r = Json::parse(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.message().find("invalid JSON at line"), std::string::npos);
    }
  }
  std::string deep(10000, '[');
  EXPECT_FALSE(Json::parse(deep).ok());
}

TEST(Json, DuplicateKeysLastWins) {
  auto r = Json::parse(R"({"a":1,"b":2,"a":3})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 2u);
  EXPECT_EQ(r->get_int("a", 0), 3);
  muse::JsonParseOptions strict;
  strict.reject_duplicate_keys = true;
  EXPECT_FALSE(Json::parse(R"({"a":1,"a":3})", strict).ok());
}

TEST(Json, PythonFloatRepr) {
  auto f = [](double d) {
    std::string s;
    muse::format_python_float(s, d);
    return s;
  };
  EXPECT_EQ(f(1.0), "1.0");
  EXPECT_EQ(f(0.1), "0.1");
  EXPECT_EQ(f(1e16), "1e+16");
  EXPECT_EQ(f(1e-5), "1e-05");
  EXPECT_EQ(f(0.0001), "0.0001");
  EXPECT_EQ(f(123456789012345680.0), "1.2345678901234568e+17");
  EXPECT_EQ(f(-2.5), "-2.5");
  EXPECT_EQ(f(1234567890123456.0), "1234567890123456.0");
}

TEST(Json, Utf8Validation) {
  EXPECT_TRUE(muse::is_valid_utf8("héllo 😀"));
  EXPECT_FALSE(muse::is_valid_utf8("\xc0\xaf"));       // overlong
  EXPECT_FALSE(muse::is_valid_utf8("\xed\xa0\x80"));   // surrogate
  EXPECT_FALSE(muse::is_valid_utf8("\xf4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_EQ(muse::find_invalid_utf8("ab\xff"), 2u);
}
