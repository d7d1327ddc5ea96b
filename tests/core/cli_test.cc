// ArgParser (core/cli.h): the vLLM-style command line every muse command reads.
#include "muse/core/cli.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace muse {
namespace {

TEST(ArgParser, OptionsFlagsAndMissingValues) {
  std::string model, names, positional;
  int64_t port = 0;
  bool prefix = true;
  ArgParser a("serve", "test");
  a.positional("MODEL", &positional, false, "");
  a.option("--model", &model, "DIR", "");
  a.option("--port", &port, "N", "");
  a.flag("--enable-prefix-caching", &prefix, "");
  a.multi("--served-model-name", &names, "NAME...", "");
  ASSERT_TRUE(a.parse({"m1", "--port=8001", "--enable-prefix-caching=false", "--served-model-name", "a", "b",
                       "--model", "m2"}).ok());
  EXPECT_EQ(positional, "m1");
  EXPECT_EQ(port, 8001);
  EXPECT_FALSE(prefix);
  EXPECT_TRUE(a.given("--enable-prefix-caching"));
  EXPECT_EQ(names, "a,b");  // nargs='+': up to the next option
  EXPECT_EQ(model, "m2");

  // A value that is another option is a missing value; negative numbers are values.
  ArgParser b("serve", "test");
  b.option("--model", &model, "DIR", "");
  b.option("--port", &port, "N", "");
  auto s = b.parse({"--model", "--port", "8001"});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--model needs a value (got the option --port)"), std::string::npos) << s.message();
  EXPECT_TRUE(b.parse({"--port", "-1"}).ok());
  EXPECT_EQ(port, -1);
}

TEST(ArgParser, RefusedOptionsAreReportedTogetherUnlessTheirValueIsAccepted) {
  ArgParser a("serve", "test");
  a.unsupported("--pipeline-parallel-size", true, "not implemented", {"1"});
  a.unsupported("--attention-backend", true, "one implementation");
  a.unsupported("--trust-remote-code", false, "", {"", "true", "false"});
  a.alias("-pp", "--pipeline-parallel-size");
  EXPECT_TRUE(a.parse({"-pp", "1", "--trust-remote-code"}).ok());
  auto s = a.parse({"--pipeline-parallel-size", "2", "--attention-backend", "x"});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("2 options are not supported"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--pipeline-parallel-size 2: not implemented"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--attention-backend x: one implementation"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace muse
