// fuzz_regression_test.cpp: a seeded mutation loop over one valid sample of every input format the engine
// reads (tests/util/hostile_util.h): truncations, byte flips, inserted and repeated bytes, and numbers swapped
// for hostile ones (1e400, -1, 2^63, NaN, a huge count). Every case must end in success or an engine::Error
// that says what is wrong: never another exception (bare library text such as std::bad_alloc or stoll), and
// never a crash (which ends this test binary; `make test-sanitize` runs it under ASan + UBSan too). The
// libFuzzer targets of `make fuzz` run the same readers for as long as one likes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <regex>

#include "engine/error.h"
#include "tests/util/hostile_util.h"

namespace {

namespace fs = std::filesystem;

constexpr int kCasesPerFormat = 500;

// The numbers a careless or hostile file puts where a count, an offset or a coordinate goes.
const char* const kHostileNumbers[] = {"1e400", "-1", "9223372036854775808", "NaN", "4294967296", "-0", "1e-400",
                                       "18446744073709551615", "2.5", "0x10", "99999999999999999999999"};

std::string mutate(const std::string& valid, std::mt19937_64& rng, std::string* what) {
  std::string s = valid;
  auto pick = [&](size_t n) { return n == 0 ? size_t(0) : size_t(rng() % n); };
  switch (rng() % 6) {
    case 0: {  // truncated
      const size_t at = pick(s.size());
      *what = "truncated to " + std::to_string(at) + " bytes";
      s.resize(at);
      break;
    }
    case 1: {  // a few bytes overwritten
      const int n = 1 + int(rng() % 8);
      *what = std::to_string(n) + " bytes flipped at";
      for (int k = 0; k < n && !s.empty(); k++) {
        const size_t at = pick(s.size());
        s[at] = char(rng());
        *what += " " + std::to_string(at);
      }
      break;
    }
    case 2: {  // random bytes inserted
      const size_t at = pick(s.size() + 1), n = 1 + pick(64);
      std::string junk(n, 0);
      for (char& c : junk) c = char(rng());
      s.insert(at, junk);
      *what = std::to_string(n) + " random bytes inserted at " + std::to_string(at);
      break;
    }
    case 3: {  // a range repeated
      const size_t at = pick(s.size()), n = std::min(s.size() - at, 1 + pick(256));
      s.insert(at, s.substr(at, n));
      *what = std::to_string(n) + " bytes at " + std::to_string(at) + " repeated";
      break;
    }
    case 4: {  // a number replaced by a hostile one (text formats; in binary ones, a digit run anywhere)
      std::vector<std::pair<size_t, size_t>> runs;
      for (size_t i = 0; i < s.size();) {
        if (std::isdigit((unsigned char)s[i])) {
          size_t j = i;
          while (j < s.size() && (std::isdigit((unsigned char)s[j]) || s[j] == '.')) j++;
          runs.push_back({i, j - i});
          i = j;
        } else {
          i++;
        }
      }
      if (runs.empty()) return mutate(valid, rng, what);
      const auto [at, n] = runs[pick(runs.size())];
      const char* number = kHostileNumbers[pick(std::size(kHostileNumbers))];
      *what = "the number at " + std::to_string(at) + " (" + s.substr(at, n) + ") replaced by " + number;
      s.replace(at, n, number);
      break;
    }
    default: {  // two distant bytes swapped and the end cut
      if (s.size() > 2) std::swap(s[pick(s.size())], s[pick(s.size())]);
      const size_t keep = s.size() - pick(std::min<size_t>(s.size(), 16));
      s.resize(keep);
      *what = "two bytes swapped, cut to " + std::to_string(keep);
      break;
    }
  }
  return s;
}

}  // namespace

TEST(FuzzRegression, EveryReaderAnswersMutatedInputWithSuccessOrAClearError) {
  const fs::path dir = fs::temp_directory_path() / ("fuzz_regression_" + std::to_string(getpid()));
  fs::create_directories(dir);
  int total = 0, errors = 0;
  for (const testutil::FormatSample& sample : testutil::format_samples()) {
    SCOPED_TRACE(sample.name);
    ASSERT_NO_THROW(testutil::read_input(sample.format, sample.valid, dir.string())) << "the valid sample fails";
    std::mt19937_64 rng(20261201 + uint64_t(sample.format));
    for (int i = 0; i < kCasesPerFormat; i++) {
      std::string what;
      const std::string input = mutate(sample.valid, rng, &what);
      total++;
      try {
        testutil::read_input(sample.format, input, dir.string());
      } catch (const engine::Error& e) {
        errors++;
        EXPECT_FALSE(std::string(e.what()).empty()) << sample.name << " case " << i << " (" << what << ")";
      } catch (const std::exception& e) {
        ADD_FAILURE() << sample.name << " case " << i << " (" << what << "): not an engine::Error but "
                      << typeid(e).name() << ": " << e.what();
      }
    }
  }
  fs::remove_all(dir);
  std::printf("fuzz regression: %d mutated inputs, %d refused with an engine::Error, %d read\n", total, errors,
              total - errors);
  EXPECT_GT(errors, total / 4) << "mutations this strong should break most inputs: is the harness reading them?";
}
