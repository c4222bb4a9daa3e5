"""Running a local `kforge serve` for tests and tools (not needed by engines)."""

import signal
import subprocess
import time

_MARKER = "kforge: serving on "


def start_server(kforge_bin, cache_dir, log_path, args=(), env=None, timeout=60.0):
    """Starts `kforge serve --listen 127.0.0.1:0` on a free port; returns
    (process, "127.0.0.1:PORT") once it logs its address. RuntimeError with
    the log when it exits or stays silent for `timeout` seconds."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen([kforge_bin, "serve", "--listen", "127.0.0.1:0", "--cache-dir",
                                 cache_dir, *args], stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    while True:
        with open(log_path) as f:
            text = f.read()
        if _MARKER in text:
            return proc, text.split(_MARKER, 1)[1].split()[0]
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"kforge serve did not start:\n{text}")
        time.sleep(0.02)


def stop_server(proc, timeout=60.0):
    """SIGTERM, then SIGKILL after `timeout` seconds; returns the exit code."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
