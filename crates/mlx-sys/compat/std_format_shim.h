// GCC 12's libstdc++ (Debian 12) has no <format>; mlx-c's private/io.h calls std::format with
// "{}" placeholders only. Force-included; inert where the library provides std::format.
#pragma once
#ifdef __cplusplus
#include <version>
#if !defined(__cpp_lib_format)
#include <sstream>
#include <string>
#include <string_view>
namespace std {
template <class... Args>
inline string format(string_view fmt, Args&&... args) {
  ostringstream out;
  size_t pos = 0;
  auto put = [&](const auto& arg) {
    size_t at = fmt.find("{}", pos);
    if (at == string_view::npos) return;
    out << fmt.substr(pos, at - pos) << arg;
    pos = at + 2;
  };
  (put(args), ...);
  out << fmt.substr(pos);
  return out.str();
}
}  // namespace std
#endif
#endif
