#include "forge/dataio/pii.h"
#include "forge/common/error.h"
#include "support/paths.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace forge::data;

namespace {

constexpr std::array<bool, kPiiTypes> kAll = {true, true, true, true, true};

PiiScanner& scanner() {
  static PiiScanner compiled_once;
  return compiled_once;
}

std::string redacted(const std::string& text, const std::array<bool, kPiiTypes>& types = kAll) {
  std::vector<PiiMatch> m;
  scanner().find(text, types, m);
  return redact_pii(text, m);
}

Document doc(std::string text, uint16_t domain) {
  Document d;
  d.text = std::move(text);
  d.domain = domain;
  return d;
}

// Filler prose of n words, with no PII and no safety term.
std::string filler(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i % 10 == 9) ? "river.\n" : "quiet ";
  return out;
}

}  // namespace

TEST_CASE("planted PII of every type is replaced by its placeholder") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      // e-mail
      {"Write to jane.doe+news@example.co.uk today.", "Write to <EMAIL> today."},
      {"<a href=\"mailto:ops@mail.example.org\">", "<a href=\"mailto:<EMAIL>\">"},
      // phones
      {"Call 555-123-4567 now", "Call <PHONE> now"},
      {"Call (555) 123-4567.", "Call <PHONE>."},
      {"UK office: +44 20 7946 0958, ask for Bob", "UK office: <PHONE>, ask for Bob"},
      {"tel:+14155552671", "tel:<PHONE>"},
      {"Toll free 1-800-555-0199.", "Toll free <PHONE>."},
      {"fax 555.867.5309", "fax <PHONE>"},
      // IPs
      {"ssh root@203.0.113.7 -p 22", "ssh root@<IP> -p 22"},
      {"client 198.51.100.23 connected", "client <IP> connected"},
      {"server at 10.1.2.3:8080", "server at <IP>:8080"},
      {"v6 peer 2001:db8:85a3::8a2e:370:7334 up", "v6 peer <IP> up"},
      {"link-local fe80::1ff:fe23:4567:890a%eth0", "link-local <IP>%eth0"},
      // cards (Luhn-valid test numbers of the networks)
      {"card 4111 1111 1111 1111 exp 12/27", "card <CARD> exp 12/27"},
      {"card 4111-1111-1111-1111.", "card <CARD>."},
      {"amex 378282246310005", "amex <CARD>"},
      {"mc 5555555555554444;", "mc <CARD>;"},
      // secrets
      {"aws_access_key_id = AKIAZ7Q4N2P9X3K5M8TB", "aws_access_key_id = <SECRET>"},
      {"token: ghp_4mD9sK2LxQ7vR1tY8bN3wE6zU0aC5jH2fG7p", "token: <SECRET>"},
      {"GH=github_pat_11ABCDE2Y0aZ9xQ8wV7uT6_s5R4q3P2o1N0mL9kJ8iH7gF6eD5cB4a", "GH=<SECRET>"},
      {"OPENAI_API_KEY=\"sk-proj-7fK2mQ9xL4vB8nR1tZ6wC3yH5jD0gS\"", "OPENAI_API_KEY=\"<SECRET>\""},
      {"slack xoxb-2931847561-8Kq3LmZ7xR2vN9pT4wY6", "slack <SECRET>"},
      {"key=AIzaSyD3x9Kq7LmN2pR8tV4wZ6yB1cF5hJ0gE3s&", "key=<SECRET>&"},
      {"Authorization: Bearer "
       "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U end",
       "Authorization: Bearer <SECRET> end"},
      {"before\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\nq9Zx+/w==\n-----END RSA PRIVATE "
       "KEY-----\n"
       "after",
       "before\n<SECRET>\nafter"},
  };
  for (const auto& [in, want] : cases) {
    INFO(in);
    CHECK(redacted(in) == want);
  }
}

TEST_CASE("look-alikes are left alone") {
  const std::vector<std::string> untouched = {
      // versions and dotted figures
      "Upgrade to version 1.2.3.4 or v10.0.0.1 (release 2.3.4.5).",
      "Windows 10.0.19041.1 and pip 23.1.2",
      "pi is 3.14159265358979 and e is 2.718281828459045",
      "GnuCOBOL 3.1.2.0, HTML5 section 8.2.4.44, RFC 2616 section 8.1.2.2, fileset '7.1.4.34'",
      "aix-6107-1415-32 and lat +45.25919444444 and net 10.1.2.0/24",
      // dates and times
      "Released 2024-01-15, patched 15/01/2024 and 01.02.2024 at 10:30:00.",
      "ts=2024-01-15 10:30:45.123",
      // hashes and ids in code
      "git checkout e83c5163316f89bfbd7d9ab23ca2e25604af290d",
      "sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
      "id = \"550e8400-e29b-41d4-a716-446655440000\"",
      // numbers that fail Luhn or are no card, and rows of figures
      "order 4111111111111112 shipped; invoice 1234567890123456",
      "epoch 1700000000 and rows 10 20 30 40 50 60",
      "matrix [[1, 2], [3, 4]] and 555 123 4567 boxes",
      // loopback, unspecified, netmask; C++ scopes; short or wordy key-like strings
      "bind 0.0.0.0 or 127.0.0.1 with mask 255.255.255.0",
      "std::vector<int> v; abc::def::ghi(); 12:30:45",
      "export OPENAI_API_KEY=sk-test and sk-your-api-key-goes-here-please-now",
      "disk-a8f7d6e5c4b3a2918273 task-abcdefghij1234567890",
      "AKIAIIIIIIIIIIIIIIII is filler",
      // not e-mail: decorators, scoped packages
      "@property\ndef x(self): return self.y\nimport '@angular/core'",
  };
  for (const auto& in : untouched) {
    INFO(in);
    CHECK(redacted(in) == in);
  }
}

TEST_CASE("overlapping matches resolve leftmost-longest and disabled types stay") {
  // A phone number inside an e-mail address: the longer match that starts first wins.
  CHECK(redacted("mail bob.555-123-4567@example.com now") == "mail <EMAIL> now");
  std::array<bool, kPiiTypes> no_phone = kAll;
  no_phone[size_t(PiiType::kPhone)] = false;
  CHECK(redacted("Call 555-123-4567 or a@b.example", no_phone) == "Call 555-123-4567 or <EMAIL>");
  std::array<bool, kPiiTypes> no_ip = kAll;
  no_ip[size_t(PiiType::kIp)] = false;
  CHECK(redacted("client 198.51.100.23 connected", no_ip) == "client 198.51.100.23 connected");
  // Two phone numbers side by side are two placeholders.
  CHECK(redacted("+1 555 123 4567, +1 555 987 6543") == "<PHONE>, <PHONE>");
}

TEST_CASE("the PII stage counts per type and domain, and the drop policy drops") {
  Corpus c;
  c.domain_id("web");
  c.domain_id("code");
  c.docs = {doc("mail bob@example.com or call 555-123-4567", 0), doc("no pii here at all", 0),
            doc("host = \"203.0.113.9\"\nkey = \"AKIAZ7Q4N2P9X3K5M8TB\"\n", 1),
            doc("bad \xff byte line\nok", 0)};
  SECTION("redact") {
    Corpus r = c;
    const forge::Json j = redact_pii(r, scanner(), PiiOptions{});
    REQUIRE(r.docs.size() == 4);
    CHECK(r.docs[0].text == "mail <EMAIL> or call <PHONE>");
    CHECK(r.docs[2].text == "host = \"<IP>\"\nkey = \"<SECRET>\"\n");
    CHECK(j["found"]["email"] == 1);
    CHECK(j["found"]["secret"] == 1);
    CHECK(j["by_domain"]["web"]["found"]["phone"] == 1);
    CHECK(j["by_domain"]["web"]["found"]["ip"] == 0);
    CHECK(j["by_domain"]["code"]["found"]["ip"] == 1);
    CHECK(j["by_domain"]["web"]["redacted"] == 1);
    CHECK(j["documents_redacted"] == 2);
    CHECK(j["removed"]["pii_drop"] == 0);
    CHECK(j["unknown_encoding_lines"]["invalid_utf8"] == 1);
    CHECK(r.docs[3].text == c.docs[3].text);  // counted, scanned, not failed
  }
  SECTION("drop") {
    PiiOptions o;
    o.drop = true;
    const forge::Json j = redact_pii(c, scanner(), o);
    REQUIRE(c.docs.size() == 2);
    CHECK(c.docs[0].text == "no pii here at all");
    CHECK(j["removed"]["pii_drop"] == 2);
    CHECK(j["by_domain"]["code"]["removed"] == 1);
  }
}

TEST_CASE("encoding counts lines with invalid UTF-8 and with U+FFFD once each") {
  EncodingCounts e;
  e.add("ok line\nbad \xC3 and \xff again\n\xE2\x82\xAC euro fine\nrepaired \xEF\xBF\xBD here\n\xED\xA0\x80");
  CHECK(e.invalid_utf8_lines == 2);  // the \xC3 line (once) and the surrogate line
  CHECK(e.replacement_char_lines == 1);
}

TEST_CASE("safety: weighted matches per 1000 words, threshold, per-domain counts") {
  const auto entries = parse_safety_list(
      "# example list\n\nbomb-making\t3\ncredit card dump\nre:untraceable\\s+(gun|rifle)s?\t2.5\n", "test");
  REQUIRE(entries.size() == 3);
  CHECK(entries[0].weight == 3.0);
  CHECK(entries[2].regex);
  SafetyFilter f(entries, "test");
  CHECK(f.score(filler(200)) == 0.0);
  // 200 words, "a" and the phrase (3 words): one match of weight 1 over 204 words.
  CHECK(f.score(filler(200) + "a Credit  Card\ndump") == Approx(1000.0 / 204.0));
  // Word boundaries: "bomb-makings" and "xcredit card dump" are not the entries.
  CHECK(f.score("bomb-makings xcredit card dump") == 0.0);
  // A short text counts as kSafetyMinWords words; the regex entry matches case-insensitively.
  CHECK(f.score("BOMB-MAKING and untraceable rifles") == Approx(1000.0 * (3 + 2.5) / 100));

  Corpus c;
  c.domain_id("web");
  c.docs = {doc(filler(300), 0), doc(filler(300) + " bomb-making", 0), doc("bomb-making guide", 0)};
  SafetyOptions o;
  o.threshold = 20;
  const forge::Json j = safety_filter(c, f, o);
  REQUIRE(c.docs.size() == 2);  // 30 > 20 is removed; 3000/301 = 9.97 stays
  CHECK(c.docs[1].text.ends_with("bomb-making"));
  CHECK(j["removed"]["safety_threshold"] == 1);
  CHECK(j["by_domain"]["web"]["documents_with_matches"] == 2);
  CHECK(j["top_entries"][0]["entry"] == "bomb-making");
  CHECK(j["top_entries"][0]["matches"] == 2);
}

TEST_CASE("a bad safety list is a usage error naming the file and line") {
  forge::test::TempDir tmp;
  const auto expect_usage = [&](const std::string& content, const std::string& where) {
    tmp.write("list.txt", content);
    const std::string path = tmp / "list.txt";
    try {
      SafetyFilter::load(path);
      FAIL("no error for " << content);
    } catch (const forge::Error& e) {
      CHECK(e.code() == forge::ExitCode::kUsage);
      CHECK_THAT(e.what(), Catch::Contains(path + where));
    }
  };
  expect_usage("ok\n# comment\nre:(unclosed\n", ":3:");
  expect_usage("ok\nword\tmany\n", ":2: weight 'many'");
  expect_usage("re:\n", ":1: empty regex");
  expect_usage("# only comments\n", ": no entries");
  CHECK_THROWS_AS(SafetyFilter::load(tmp / "missing.txt"), forge::Error);
}

TEST_CASE("the example safety list compiles") {
  const SafetyFilter f = SafetyFilter::load(forge::test::source_path("configs/safety.example.txt"));
  CHECK(f.entries().size() >= 3);
}
