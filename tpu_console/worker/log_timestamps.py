"""The time a log line says it was written, read from the start of the line as loggers put it there:

- absl's and glog's prefix: `I1127 21:44:59.518823 139832939633536 peft_trainer.py:488] ...` (a level letter,
  month and day, the time to the microsecond, the thread, the file and line);
- Python logging's default `asctime`: `2026-11-27 21:44:59,518 INFO ...` (milliseconds after a comma);
- ISO 8601: `2026-11-27T21:44:59.518823Z`, `2026-11-27 21:44:59.518+01:00` (loguru's, datetime's own).

Colours, spaces and brackets before it are passed over (`[2026-11-27 21:44:59,518] ...`), and one tag such as
torchrun's `[rank0]: `; a time elsewhere in the line is not the line's (a checkpoint's name, a message).

`timestamp(line)` gives seconds, for the time between two lines of one program: the difference is right, the
value is no unix time. glog prints no year (read as 2000's, a leap year, so 29 February reads; a step over
New Year comes out negative), and loggers mostly print local time with no zone (read as if UTC; an offset,
where printed, is taken off).

Python 3.8+ and the standard library only; it imports nothing of the console (it runs on the workers).
"""

import re
from datetime import UTC, datetime

GLOG_YEAR = 2000  # glog prints month and day only

_LEAD = r"(?:\x1b\[[0-9;]*m|[\s\[(])*(?:\[[^\]\s]{1,32}\]:?\s*)?(?:\x1b\[[0-9;]*m|[\s\[(])*"
_GLOG = re.compile(_LEAD + r"[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) +\d+ [^\s:\]]+:\d+\]")
_ISO = re.compile(_LEAD + r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?"
                          r"(Z|[+-]\d\d:?\d\d)?(?![\d:])")


def timestamp(line):
    """Seconds of the time at the start of `line` (the module's docstring), or None where it has none."""
    found = _GLOG.match(line)
    if found is not None:
        month, day, hour, minute, second, micro = (int(g) for g in found.groups())
        return _seconds(GLOG_YEAR, month, day, hour, minute, second, micro / 1e6)
    found = _ISO.match(line)
    if found is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in found.groups()[:6])
    fraction, zone = found.group(7), found.group(8)
    seconds = _seconds(year, month, day, hour, minute, second, float("0." + fraction) if fraction else 0.0)
    if seconds is None or zone in (None, "Z"):
        return seconds
    sign = -1 if zone[0] == "-" else 1
    digits = zone[1:].replace(":", "")
    return seconds - sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)


def _seconds(year, month, day, hour, minute, second, fraction):
    try:
        moment = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None  # not a date (`I1340 ...`): not a logger's prefix
    return moment.timestamp() + fraction
