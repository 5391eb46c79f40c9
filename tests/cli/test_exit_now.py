"""The `regen` process ends with regen's exit code: Python's shutdown runs (threads joined,
atexit handlers, logs and streams flushed), the native libraries' C++ teardown does not (under
load one of its destructors sometimes aborted an export that had said exit 2: 134)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = """
import atexit, logging, sys, threading, time
from pathlib import Path
import pyarrow as pa
from regen.cli.main import exit_now

out = Path(sys.argv[1])
atexit.register(lambda: (out / "atexit").write_text("ran"))
logging.basicConfig(filename=str(out / "log"), level=logging.INFO)
logging.getLogger("child").info("logged before the exit")

def late() -> None:  # a thread that is still working when the command returns
    time.sleep(0.3)
    (out / "thread").write_text("joined")

threading.Thread(target=late).start()
pa.array(range(100_000)).sum()  # pyarrow's native pools in use
print("stdout, buffered", end="")
exit_now(3)
"""


def test_exit_now_keeps_the_code_and_runs_pythons_shutdown(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "stdout, buffered"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "joined"
    assert "logged before the exit" in (tmp_path / "log").read_text()


def test_the_regen_command_and_python_m_regen_end_through_it() -> None:
    from regen.cli import main as cli_main

    assert (Path(cli_main.__file__).parents[1] / "__main__.py").read_text().count("console()") == 1
    proc = subprocess.run([sys.executable, "-m", "regen", "status", "/nonexistent/run"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "/nonexistent/run" in proc.stderr + proc.stdout
