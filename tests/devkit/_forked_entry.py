"""An entry point for tests/devkit/test_forkserver.py: ``main()`` records what it was
given (argv, a variable, cwd, its pid and group, and ``SET_UP``: what a fork server's setup
code left here, None without one) as JSON in the file ``sys.argv[1]``, then
exits with ``sys.argv[2]`` or, given "sleep", sleeps until it is stopped. Its import starts a
thread when ``FORKED_ENTRY_THREAD`` is set."""

import json
import os
import sys
import threading
import time

if os.environ.get("FORKED_ENTRY_THREAD"):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()

SET_UP: int | None = None


def main() -> None:
    out, then = sys.argv[1], sys.argv[2]
    seen = {"argv": sys.argv, "var": os.environ.get("FORKED_VAR"), "cwd": os.getcwd(),
            "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
            "set_up": SET_UP}  # fmt: skip
    with open(out, "w", encoding="utf-8") as f:
        json.dump(seen, f)
    print("to the log", flush=True)
    if then == "sleep":
        time.sleep(3600)
    sys.exit(int(then))
