"""``engram export`` killed (SIGKILL) while it stages: what is left beside the output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import engram

CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from types import SimpleNamespace
    from engram.bundle.export import Exporter
    from engram.shard.v1 import shard_service_pb2 as spb

    def records(**_):
        for i in range(2000):
            yield spb.Record(id=f"r{i:04d}", fleet_id="fleet-a",
                             content=f"SECRET customer note {i} " + "x" * 2000)
        print("staged", flush=True)
        time.sleep(600)  # killed here, while it lists

    shard = SimpleNamespace(status=lambda: SimpleNamespace(fleet_id="fleet-a"), list=records)
    Exporter(SimpleNamespace(shard=shard)).export(Path(sys.argv[1]) / "fleet.bundle", "fleet-a")
""")


def test_a_killed_export_leaves_no_copy_of_the_fleet_behind(tmp_path: Path) -> None:
    """The staging SQLite file holds every staged row: it is unlinked as soon as it is open,
    so a kill leaves only ``<out>.partial`` (overwritten by the next export)."""
    root = str(Path(engram.__file__).parent.parent)
    env = dict(os.environ, PYTHONPATH=root)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "staged"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.bundle.partial"]
    assert b"SECRET" not in (tmp_path / "fleet.bundle.partial").read_bytes()
