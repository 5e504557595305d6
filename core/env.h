#pragma once
/// Boolean environment switches (KILN_PROFILE, KILN_DISABLE_CACHE, KILN_COMPILE, ...), parsed
/// alike everywhere. A switch that took any value but "0" as on made KILN_PROFILE=false turn the
/// kernel timers on and KILN_DISABLE_CACHE=false turn the disk cache off.

namespace kiln {

/// The switch `name`: true for 1, true, on, yes; false for 0, false, off, no (any case);
/// `otherwise` when unset or empty. Any other value prints one warning on stderr, naming the
/// variable and the accepted values, and gives `otherwise`. Reads the environment on each call:
/// callers cache the result where it is read often.
bool env_flag(const char* name, bool otherwise = false);

}  // namespace kiln
