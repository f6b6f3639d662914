"""A real terminal for the tests: a tmux server of our own, a clean bash in it, and its screen.

The server runs on its own socket (`tmux -L NAME`, no config file) and is killed by that name
alone, so no other tmux is touched. The shell's prompt is `$ ` and `dpgate` is a function that
runs this checkout's `python -m dpgate.cli`, so the screen reads like a user's. Everything the
pane receives is also recorded byte for byte (pipe-pane), which shows the status line's live
redraws that the final screen no longer holds.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway_processes import PYTHON, ROOT

TMUX = shutil.which("tmux")


class TmuxSession:
    def __init__(self, directory: Path, width: int, height: int) -> None:
        if TMUX is None:  # a missing tmux fails the test: the suite must run it, never skip it
            pytest.fail("tmux is not installed: ./dev.sh test installs it (apt-get install tmux)")
        self.socket = f"dpgate-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.log_path = directory / f"{self.socket}.log"
        rc = directory / f"{self.socket}.bashrc"
        rc.write_text(
            "PS1='$ '\nunset HISTFILE PROMPT_COMMAND\n"
            f"export PYTHONPATH={shlex.quote(str(ROOT))}\n"
            f'dpgate() {{ {shlex.quote(PYTHON)} -m dpgate.cli "$@"; }}\n'
        )
        env = {key: value for key, value in os.environ.items() if not key.startswith("TMUX")}
        env.pop("DPGATE_API_KEY", None)
        self.socket_path: Path | None = None
        self._tmux(
            "new-session", "-d", "-x", str(width), "-y", str(height),
            f"bash --noprofile --rcfile {shlex.quote(str(rc))} -i",
            env=env,
        )  # fmt: skip
        try:
            # kill-server leaves the socket file behind; remember where it is to remove it.
            self.socket_path = Path(self._tmux("display-message", "-p", "#{socket_path}").strip())
            self._tmux("pipe-pane", "-o", f"cat >> {shlex.quote(str(self.log_path))}")
            self.wait_for(lambda screen: screen.rstrip().endswith("$"), timeout=10)
        except BaseException:
            self.kill()
            raise

    def _tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        command = [TMUX, "-L", self.socket, "-f", "/dev/null", *args]
        return subprocess.run(command, capture_output=True, text=True, check=True, timeout=10, env=env).stdout

    def type_line(self, line: str) -> None:
        self._tmux("send-keys", "-l", line)
        self._tmux("send-keys", "Enter")

    def screen(self) -> str:
        """The visible screen, one line per row (trailing blanks dropped)."""
        return self._tmux("capture-pane", "-p")

    def history(self) -> str:
        """Everything the pane holds, scrolled-off rows included, wrapped rows joined into their line."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-")

    def received(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for(self, is_done, timeout: float) -> str:
        """Poll until `is_done(history)` holds (wrapped rows joined, so a long line matches whole)."""
        deadline = time.monotonic() + timeout
        while True:
            history = self.history()
            if is_done(history):
                return history
            if time.monotonic() > deadline:
                raise AssertionError(f"the terminal never showed what was awaited; it shows:\n{self.screen()}")
            time.sleep(0.05)

    def kill(self) -> None:
        subprocess.run([TMUX, "-L", self.socket, "kill-server"], capture_output=True, timeout=10)
        if self.socket_path is not None and self.socket_path.name == self.socket:
            self.socket_path.unlink(missing_ok=True)


@contextlib.contextmanager
def open_terminal(directory: Path, width: int, height: int) -> Iterator[TmuxSession]:
    """A terminal for one test, killed after it whatever happened."""
    session = TmuxSession(directory, width, height)
    try:
        yield session
    finally:
        session.kill()
