#pragma once
#include <cstdint>

/// Environment settings parsed alike everywhere: boolean switches (KILN_PROFILE,
/// KILN_DISABLE_CACHE, KILN_COMPILE, ...) and byte sizes (KILN_CACHE_MAX_SIZE). A switch that
/// took any value but "0" as on made KILN_PROFILE=false turn the kernel timers on and
/// KILN_DISABLE_CACHE=false turn the disk cache off.

namespace kiln {

/// The switch `name`: true for 1, true, on, yes; false for 0, false, off, no (any case);
/// `otherwise` when unset or empty. Any other value prints one warning on stderr, naming the
/// variable and the accepted values, and gives `otherwise`. Reads the environment on each call:
/// callers cache the result where it is read often.
bool env_flag(const char* name, bool otherwise = false);

/// The byte size `name`: a whole number with an optional binary suffix K, M, G or T (KiB, MiB,
/// GiB, TiB; a trailing "B" or "iB" and any case allowed: "512M", "2GiB", "1000"); `otherwise`
/// when unset or empty. A malformed, negative or overflowing value (over 2^62) gives `otherwise`,
/// with a warning on stderr the first time the variable has that value.
int64_t env_bytes(const char* name, int64_t otherwise);

}  // namespace kiln
