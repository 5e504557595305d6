#pragma once
#include <cstdint>

/// Environment settings parsed alike everywhere: boolean switches (KILN_PROFILE,
/// KILN_DISABLE_CACHE, KILN_COMPILE, ...), byte sizes (KILN_CACHE_MAX_SIZE) and integers
/// (KILN_CUDA_THREADS_PER_BLOCK, ...). A switch that took any value but "0" as on made
/// KILN_PROFILE=false turn the kernel timers on and KILN_DISABLE_CACHE=false turn the disk cache
/// off; atoi read KILN_CUDA_THREADS_PER_BLOCK=64abc as 64. A value none of them accepts prints
/// one warning on stderr the first time the variable has that value (they are read at every
/// compile), and the default is used.

namespace kiln {

/// The switch `name`: true for 1, true, on, yes; false for 0, false, off, no (any case, white
/// space around the word ignored); `otherwise` when unset or empty. Any other value gives
/// `otherwise`, with a warning naming the variable, the accepted words and the value taken, the
/// first time the variable has that value. Reads the environment on each call.
bool env_flag(const char* name, bool otherwise = false);

/// The byte size `name`: a whole number with an optional binary suffix K, M, G or T (KiB, MiB,
/// GiB, TiB; a trailing "B" or "iB" and any case allowed: "512M", "2GiB", "1000"); `otherwise`
/// when unset or empty. A malformed, negative or overflowing value (over 2^62) gives `otherwise`,
/// with a warning on stderr the first time the variable has that value.
int64_t env_bytes(const char* name, int64_t otherwise);

/// The integer `name`: the whole value, white space around it ignored, a decimal integer in
/// [min, max] that `valid` (when given) accepts; `otherwise` when unset or empty. Any other value
/// ("64abc", "2.9", out of range) gives `otherwise`, with a warning saying `expected` (e.g. "a
/// multiple of 32 in [32, 1024]") the first time the variable has that value.
int64_t env_int(const char* name, int64_t otherwise, int64_t min, int64_t max,
                const char* expected, bool (*valid)(int64_t) = nullptr);

}  // namespace kiln
