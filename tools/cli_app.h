// Command-line conventions shared by libxpack's programs, over CLI11 (Debian's
// libcli11-dev). Each tool used to parse its arguments by hand, and they differed in
// ways users tripped on (issue 15): `--key=value` worked in one tool only, flags were
// missing from --help, `--ios 1M` was read as 1,048,576 reads. Here, once:
//  - --help is generated and lists every flag but test hooks (hidden(), still parsed);
//  - --version prints "<tool> <libxpack version>";
//  - `--key=value` and `--key value` both work;
//  - exit status 0 success, 1 failure, 2 usage error: a parse error prints ONE line
//    naming the flag plus "run with --help"; CLI11's own exit codes never leak;
//  - sizes take binary K/M/G/T suffixes, counts refuse any suffix, every number is
//    range-checked and the message names the flag, the value and the range.
// Header-only and built on the public C API alone (xpack_version), so that programs
// linking libxpack.so rather than the internal archive (examples/xpack-run) can adopt
// it: in meson, `dependencies : cli_app_dep` (tools/meson.build).
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "xpack/xpack.h"

namespace xpack::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// ---- number parsing (pure; *why says what is wrong, without the flag's name) -------

// 1048576 -> "1M", 1536 -> "1536": the largest binary suffix that divides exactly.
inline std::string size_text(uint64_t bytes) {
  static const char kSuffix[] = "KMGT";
  int k = 0;
  while (k < 4 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++k;
  }
  return std::to_string(bytes) + (k ? std::string(1, kSuffix[k - 1]) : std::string());
}

inline std::string range_text(uint64_t lo, uint64_t hi, bool sizes) {
  auto t = [&](uint64_t v) { return sizes ? size_text(v) : std::to_string(v); };
  if (hi == std::numeric_limits<uint64_t>::max()) return ">= " + t(lo);
  return t(lo) + ".." + t(hi);
}

namespace detail {
inline bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}
// K/M/G/T (any case), optionally followed by B or iB; "B" alone. Returns the shift.
inline std::optional<int> suffix_shift(std::string_view s) {
  auto lower = [](char c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c); };
  if (s.empty()) return 0;
  if (s.size() == 1 && lower(s[0]) == 'b') return 0;
  int shift;
  switch (lower(s[0])) {
    case 'k': shift = 10; break;
    case 'm': shift = 20; break;
    case 'g': shift = 30; break;
    case 't': shift = 40; break;
    default: return std::nullopt;
  }
  std::string rest;
  for (char c : s.substr(1)) rest += lower(c);
  if (rest.empty() || rest == "b" || rest == "ib") return shift;
  return std::nullopt;
}
}  // namespace detail

// A whole decimal number in [lo, hi]: no sign, no K/M/G/T suffix, no 0x; a leading zero
// is not octal. So `--ios 1M` is refused rather than read as 1,048,576 reads, and
// `--layers 010` is 10 (the hand-written strtoull(.., 0) of xpack-synth read 8).
inline bool parse_count(std::string_view s, uint64_t lo, uint64_t hi, uint64_t* out, std::string* why) {
  if (!detail::all_digits(s)) {
    size_t d = 0;
    while (d < s.size() && s[d] >= '0' && s[d] <= '9') ++d;
    bool suffixed = d > 0 && d < s.size() && detail::suffix_shift(s.substr(d)).value_or(0) > 0;
    *why = "expected a whole number, got '" + std::string(s) + "'" +
           (suffixed ? " (a count takes no K/M/G/T suffix)" : "");
    return false;
  }
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi) {
    *why = std::string(s) + " is out of range (" + range_text(lo, hi, false) + ")";
    return false;
  }
  *out = v;
  return true;
}

// A byte size: digits, then optionally K, M, G or T (binary: 1K = 1024; any case;
// "KB"/"KiB" alike; "B" alone means bytes). A bare number counts `unit` bytes (1 for a
// flag in bytes, 1 MiB for a flag named -mib); a suffixed one must be a whole number of
// units. The result, in bytes, must lie in [lo, hi].
inline bool parse_size(std::string_view s, uint64_t unit, uint64_t lo, uint64_t hi, uint64_t* out,
                       std::string* why) {
  size_t d = 0;
  while (d < s.size() && s[d] >= '0' && s[d] <= '9') ++d;
  auto shift = d ? detail::suffix_shift(s.substr(d)) : std::nullopt;
  if (!shift) {
    *why = "expected a size such as 4096, 64K, 1M or 2G, got '" + std::string(s) + "'";
    return false;
  }
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + d, v);
  const bool bare = d == s.size();
  const uint64_t mult = bare ? unit : (uint64_t{1} << *shift);
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  if (ec != std::errc() || p != s.data() + d || (mult > 1 && v > max / mult)) {
    *why = std::string(s) + " is too large" +
           (hi == max ? std::string(" for 64 bits") : " (" + range_text(lo, hi, true) + ")");
    return false;
  }
  v *= mult;
  if (unit > 1 && v % unit != 0) {
    *why = std::string(s) + " is not a whole number of " +
           (unit == (1u << 20) ? std::string("MiB") : size_text(unit) + "-byte units");
    return false;
  }
  if (v < lo || v > hi) {
    *why = std::string(s) + " is out of range (" + range_text(lo, hi, true) + ")";
    return false;
  }
  *out = v;
  return true;
}

// A real number in [lo, hi] (or (lo, hi] with lo_open): decimal, optionally with a
// fraction and an exponent ("0.25", "1e-3", "-2"); no nan, inf, hex, trailing junk or
// leading '+'. For temperatures, probabilities, seconds.
inline bool parse_real(std::string_view s, double lo, double hi, bool lo_open, double* out, std::string* why) {
  auto lower = [](char c) { return static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c); };
  auto bound = [](double v) {
    std::ostringstream o;
    o << v;
    return o.str();
  };
  const std::string range = (lo_open ? "> " : ">= ") + bound(lo) + (hi < std::numeric_limits<double>::max() ? " and <= " + bound(hi) : std::string());
  // from_chars takes "inf", "nan" and "0x1p3": refuse them before it sees them.
  bool plain = !s.empty();
  for (size_t i = 0; i < s.size() && plain; ++i) {
    const char c = lower(s[i]);
    plain = (c >= '0' && c <= '9') || c == '.' || c == 'e' || (c == '-' && (i == 0 || lower(s[i - 1]) == 'e')) ||
            (c == '+' && i > 0 && lower(s[i - 1]) == 'e');
  }
  double v = 0;
  if (plain) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::general);
    plain = ec == std::errc() && p == s.data() + s.size();
    if (ec == std::errc::result_out_of_range) {
      *why = std::string(s) + " is out of range (" + range + ")";
      return false;
    }
  }
  if (!plain || !std::isfinite(v)) {
    *why = "expected a number such as 0.5 or 2, got '" + std::string(s) + "'";
    return false;
  }
  if (v < lo || (lo_open && v == lo) || v > hi) {
    *why = std::string(s) + " is out of range (" + range + ")";
    return false;
  }
  *out = v;
  return true;
}

// ---- the application ----------------------------------------------------------------

// Help in the layout the hand-written texts had: synopsis, paragraph, arguments,
// options (long names aligned whether or not a short one exists), notes.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter(std::string usage, std::string notes) : usage_(std::move(usage)), notes_(std::move(notes)) {
    column_width(26);
    label("Positionals", "arguments");
  }
  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode mode) const override {
    std::string out;
    for (std::string part : {"usage: " + usage_, app->get_description(), make_positionals(app),
                             make_groups(app, mode), notes_, app->get_footer()}) {
      while (!part.empty() && part.front() == '\n') part.erase(0, 1);
      while (!part.empty() && part.back() == '\n') part.pop_back();
      if (!part.empty()) out += (out.empty() ? "" : "\n\n") + part;
    }
    return out + "\n";
  }
  // A positional shows its name only (CLI11 adds "TEXT REQUIRED").
  std::string make_option(const CLI::Option* opt, bool positional) const override {
    if (!positional) return CLI::Formatter::make_option(opt, positional);
    std::stringstream out;
    CLI::detail::format_help(out, make_option_name(opt, true), make_option_desc(opt), get_column_width());
    return out.str();
  }
  std::string make_option_name(const CLI::Option* opt, bool positional) const override {
    if (positional) return opt->get_name(true, false);
    std::string names;
    for (const auto& s : opt->get_snames()) names += (names.empty() ? "-" : ", -") + s;
    for (const auto& l : opt->get_lnames()) names += (names.empty() ? "    --" : ", --") + l;
    return names;
  }

 private:
  std::string usage_, notes_;
};

class App {
 public:
  // tool: the name in messages and --version. usage: the synopsis after "usage: ".
  // about: what the tool does, shown under the synopsis. footer: last lines of --help
  // (at least the exit statuses).
  App(std::string tool, std::string usage, std::string about, std::string footer)
      : tool_(std::move(tool)), usage_(std::move(usage)), app_(std::move(about), tool_) {
    app_.footer(std::move(footer));
    // Every option is added after this: a repeated flag takes its last value, as the
    // hand-written parsers did (a script can override an earlier default).
    app_.option_defaults()->group("options")->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app_.set_help_flag();  // added again at parse(), so that it is listed last
  }
  App(const App&) = delete;
  App& operator=(const App&) = delete;

  // The CLI11 application, for whatever the helpers below do not cover.
  CLI::App& cli() { return app_; }
  const std::string& tool() const { return tool_; }

  CLI::Option* flag(const std::string& names, bool* on, const std::string& help) {
    return app_.add_flag(names, *on, help);
  }
  // A text value (a path, a list); placeholder is how --help shows the value.
  CLI::Option* text(const std::string& names, const std::string& placeholder, std::string* out,
                    const std::string& help) {
    return app_.add_option(names, *out, help)->option_text(placeholder);
  }
  // A positional argument.
  CLI::Option* positional(const std::string& name, std::string* out, const std::string& help) {
    return app_.add_option(name, *out, help)->group("arguments");
  }
  // One of `choices`, taken as given.
  CLI::Option* choice(const std::string& names, const std::string& placeholder, std::string* out,
                      std::vector<std::string> choices, const std::string& help) {
    std::string flag = display_name(names);
    return app_
        .add_option_function<std::string>(
            names,
            [flag, out, choices](const std::string& v) {
              std::string list;
              for (const auto& c : choices) {
                if (c == v) {
                  *out = v;
                  return;
                }
                list += (list.empty() ? "" : ", ") + c;
              }
              throw CLI::ValidationError(flag, "'" + v + "' is not one of " + list);
            },
            help)
        ->option_text(placeholder);
  }
  // A whole number in [lo, hi] (see parse_count), stored into an integer of any width.
  template <class T>
  CLI::Option* count(const std::string& names, const std::string& placeholder, T* out, const std::string& help,
                     uint64_t lo, uint64_t hi) {
    static_assert(std::is_integral_v<T>);
    if (hi > static_cast<uint64_t>(std::numeric_limits<T>::max())) hi = std::numeric_limits<T>::max();
    std::string flag = display_name(names);
    return app_
        .add_option_function<std::string>(
            names,
            [flag, out, lo, hi](const std::string& v) {
              uint64_t n = 0;
              std::string why;
              if (!parse_count(v, lo, hi, &n, &why)) throw CLI::ValidationError(flag, why);
              *out = static_cast<T>(n);
            },
            help)
        ->option_text(placeholder);
  }
  // A byte size (see parse_size): a bare number counts `unit` bytes. Stored in bytes.
  CLI::Option* size(const std::string& names, const std::string& placeholder, uint64_t* bytes,
                    const std::string& help, uint64_t unit, uint64_t lo, uint64_t hi) {
    std::string flag = display_name(names);
    CLI::Option* opt = app_.add_option_function<std::string>(
            names,
            [flag, bytes, unit, lo, hi](const std::string& v) {
              uint64_t n = 0;
              std::string why;
              if (!parse_size(v, unit, lo, hi, &n, &why)) throw CLI::ValidationError(flag, why);
              *bytes = n;
            },
            help);
    size_options_.push_back(opt);
    return opt->option_text(placeholder);
  }
  // A real number (see parse_real), stored into a float or a double.
  template <class T>
  CLI::Option* real(const std::string& names, const std::string& placeholder, T* out, const std::string& help,
                    double lo, double hi, bool lo_open = false) {
    static_assert(std::is_floating_point_v<T>);
    std::string flag = display_name(names);
    return app_
        .add_option_function<std::string>(
            names,
            [flag, out, lo, hi, lo_open](const std::string& v) {
              double x = 0;
              std::string why;
              if (!parse_real(v, lo, hi, lo_open, &x, &why)) throw CLI::ValidationError(flag, why);
              *out = static_cast<T>(x);
            },
            help)
        ->option_text(placeholder);
  }
  // How a flag given without its value is reported, for a tool whose established
  // wording scripts already match (default: "--flag needs a value").
  void missing_value_message(std::function<std::string(const std::string& flag)> f) { missing_value_ = std::move(f); }
  // Keeps a test hook out of --help; it parses as before.
  static CLI::Option* hidden(CLI::Option* opt) { return opt->group(""); }

  // Parses argv. nullopt: go on. Otherwise the tool returns this status at once: 0 after
  // --help or --version (printed on stdout), 2 after a usage error (printed on stderr).
  std::optional<int> parse(int argc, char** argv) {
    if (!app_.get_help_ptr()) {
      app_.set_help_flag("-h,--help", "this help");
      app_.set_version_flag("--version", std::string(tool_) + " " + xpack_version(),
                            "print '" + tool_ + " <libxpack version>'");
    }
    try {
      app_.parse(argc, argv);
      return std::nullopt;
    } catch (const CLI::CallForHelp&) {
      std::fputs(help().c_str(), stdout);
      return kExitOk;
    } catch (const CLI::CallForVersion& e) {
      std::printf("%s\n", e.what());
      return kExitOk;
    } catch (const CLI::Success&) {
      return kExitOk;
    } catch (const CLI::ExtrasError&) {
      std::vector<std::string> rest = app_.remaining();
      std::string first = rest.empty() ? std::string("?") : rest.front();
      if (first.size() > 1 && first[0] == '-') {
        if (size_t eq = first.find('='); eq != std::string::npos) first.resize(eq);
        return usage_error("unknown option " + first);
      }
      return usage_error("unexpected argument '" + first + "'");
    } catch (const CLI::ArgumentMismatch& e) {
      // CLI11 says "--trunk: 1 required TEXT missing"; the flag is before the colon.
      std::string m = e.what();
      size_t colon = m.find(':');
      if (colon != std::string::npos && m.ends_with(" missing"))
        return usage_error(missing_value_ ? missing_value_(m.substr(0, colon)) : m.substr(0, colon) + " needs a value");
      return usage_error(m);
    } catch (const CLI::ConversionError& e) {
      // CLI11 says "Could not convert: --json = maybe" (a value given to a switch).
      std::string m = e.what();
      const std::string head = "Could not convert: ";
      size_t eq = m.find(" = ");
      if (m.rfind(head, 0) == 0 && eq != std::string::npos)
        return usage_error(m.substr(head.size(), eq - head.size()) + ": '" + m.substr(eq + 3) +
                           "' is not a valid value");
      return usage_error(m);
    } catch (const CLI::ParseError& e) {
      return usage_error(e.what());
    }
  }

  // "<tool>: <msg>; run with --help" on stderr; returns 2 (the usage-error status).
  int usage_error(std::string_view msg) {
    last_message_ = std::string(msg);
    std::fprintf(stderr, "%s: %.*s; run with --help\n", tool_.c_str(), static_cast<int>(msg.size()), msg.data());
    return kExitUsage;
  }
  // The message of the last usage error (for tests of a tool's command line).
  const std::string& last_message() const { return last_message_; }
  // "<tool>: <msg>" on stderr; returns 1 (the failure status).
  int failure(std::string_view msg) const {
    std::fprintf(stderr, "%s: %.*s\n", tool_.c_str(), static_cast<int>(msg.size()), msg.data());
    return kExitFailure;
  }

  std::string help() {
    const char* note =
        "SIZE values take K, M, G, T suffixes, binary (1K = 1024 bytes, 1M = 1048576); a bare\n"
        "number is in the unit the flag names (MiB for --*-mib, bytes otherwise).\n";
    app_.formatter(std::make_shared<HelpFormatter>(usage_, sizes_visible() ? note : ""));
    return app_.help();
  }

 private:
  // "-o,--output" -> "--output": the name a message uses.
  static std::string display_name(const std::string& names) {
    std::string first, longest;
    size_t start = 0;
    while (start <= names.size()) {
      size_t comma = names.find(',', start);
      std::string n = names.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (first.empty()) first = n;
      if (longest.empty() && n.rfind("--", 0) == 0) longest = n;
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return longest.empty() ? first : longest;
  }
  bool sizes_visible() const {
    for (const CLI::Option* o : size_options_)
      if (!o->get_group().empty()) return true;
    return false;
  }

  std::string tool_, usage_;
  std::string last_message_;
  std::function<std::string(const std::string&)> missing_value_;
  CLI::App app_;
  std::vector<const CLI::Option*> size_options_;
};

}  // namespace xpack::cli
