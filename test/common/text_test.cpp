#include "forge/common/text.h"

#include <catch2/catch.hpp>

#include <string>

TEST_CASE("printable escapes what a terminal or log should not see") {
  CHECK(forge::printable("team-a") == "team-a");
  CHECK(forge::printable("a\nb\xff\\") == "a\\x0ab\\xff\\x5c");
  CHECK(forge::printable(std::string(4096, 'x'), 8) == "xxxxxxxx...(4096 bytes)");
}

TEST_CASE("parse_int takes the whole text as a decimal integer or nothing") {
  CHECK(forge::parse_int("42") == 42);
  CHECK(forge::parse_int("-7") == -7);
  for (const char* bad : {"", "+1", " 1", "1 ", "1x", "0x10", "99999999999999999999"}) {
    INFO(bad);
    CHECK_FALSE(forge::parse_int(bad));
  }
}

TEST_CASE("trim and split_list") {
  CHECK(forge::trim(" \t a b \r") == "a b");
  CHECK(forge::trim("   ").empty());
  CHECK(forge::split_list(" a, b ,,c ") == std::vector<std::string>{"a", "b", "c"});
  CHECK(forge::split_list("x:y", ':') == std::vector<std::string>{"x", "y"});
}
