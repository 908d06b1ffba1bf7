// Whether this build runs under AddressSanitizer: its quarantine holds freed memory back, so a process's RSS
// says nothing about leaks there (the RSS bounds of the bad-input and fault tests hold in normal builds only).
#pragma once

namespace kvfleet::test {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kUnderAsan = true;
#else
constexpr bool kUnderAsan = false;
#endif
#else
constexpr bool kUnderAsan = false;
#endif

}  // namespace kvfleet::test
