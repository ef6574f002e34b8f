"""Peak memory of a CLI run, measured in the child itself.

``getrusage().ru_maxrss`` is the wrong tool here: Linux carries the high-water mark across fork
and exec, so a child started by a large pytest process reports the *parent's* size (CI saw
460 MB for a replay that peaks at 80 MB). ``VmHWM`` in ``/proc/self/status`` belongs to the
exec'd address space alone."""
from __future__ import annotations

import sys

MARK = "skewd-test-peak-rss-kib"

#: a ``python -c`` program: run ``skewd.cli.main(argv)``, then print the process's own peak RSS
#: as the last line of stderr, whatever the exit status
PROGRAM = (
    "import sys\n"
    "def _peak():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            return int(line.split()[1])\n"
    "    return -1\n"
    "from skewd.cli import main\n"
    "try:\n"
    "    rc = main(sys.argv[1:])\n"
    "finally:\n"
    "    sys.stdout.flush()\n"
    f"    print('{MARK}', _peak(), file=sys.stderr, flush=True)\n"
    "sys.exit(rc)\n"
)


def cli_argv(*args: str) -> list[str]:
    """The argv that runs ``skewd <args>`` and reports its peak RSS."""
    return [sys.executable, "-c", PROGRAM, *args]


def peak_kib(output: str) -> int:
    """The peak RSS (KiB) the child printed; fails loudly if it printed none."""
    for line in reversed(output.splitlines()):
        if line.startswith(MARK):
            return int(line.split()[1])
    raise AssertionError(f"the child printed no {MARK} line:\n{output[-2000:]}")
