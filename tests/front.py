"""An nginx front proxy (engram/front.py) started for a test, on a free loopback port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engram.bench._harness import free_port
from engram.front import FrontLimits, render

NGINX = shutil.which("nginx") or (
    "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


def need_nginx() -> str:
    """nginx's path; skips the test when `make test` could not install it (its front-proxy
    target installs Debian's nginx-light where it runs as root with apt-get)."""
    if NGINX is None:
        pytest.skip("nginx is not installed (make test / make front-proxy install nginx-light "
                    "with apt-get when run as root; elsewhere install nginx with HTTP/2 and "
                    "gRPC)")
    return NGINX


def nginx_check(text: str, directory: Path) -> subprocess.CompletedProcess[str]:
    """`nginx -t` of the configuration ``text``, written to ``directory`` (its prefix)."""
    config = directory / "nginx-check.conf"
    config.write_text(text)
    return subprocess.run([need_nginx(), "-t", "-c", str(config), "-p", str(directory)],
                          capture_output=True, text=True, timeout=30, check=False)


@contextmanager
def front_proxy(upstream: str, limits: FrontLimits, state_dir: Path) -> Iterator[str]:
    """nginx in front of ``upstream`` until the block ends; yields the address it listens
    on. Its stderr goes to ``state_dir``/nginx.log."""
    nginx = need_nginx()
    state_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = state_dir / "nginx.conf"
    config.write_text(render(upstream, f"127.0.0.1:{port}", limits, state_dir=str(state_dir)))
    with open(state_dir / "nginx.log", "ab") as log:
        process = subprocess.Popen([nginx, "-c", str(config), "-p", str(state_dir)],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert process.poll() is None, (state_dir / "nginx.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nginx did not listen within 20 s"
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
