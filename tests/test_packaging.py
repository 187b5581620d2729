"""handoff as a user installs it: `pip install /path/to/handoff` into their own environment.

- beside a torch the environment already holds it installs no other torch (nor anything else it has):
  pyproject.toml takes ranges, not the lock's pins;
- the wheel holds every subpackage and the page: installed into a fresh virtualenv outside the checkout, with no
  project file on the path, it trains for an epoch with DDP, exports with parity and serves.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, digit_images, png_bytes

from harness.server import BentoServer


def test_installing_beside_an_existing_stack_replaces_nothing(tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    planned = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert planned == ["handoff"], f"pip would also install {planned}"


def _source_copy(into: Path) -> Path:
    """The checkout's files as a clone has them (tracked, and new ones git does not ignore): pip builds in the
    source folder, which must not write build/ into the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    for name in listed.stdout.splitlines():
        if (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)
    return into


def _user_environment(folder: Path) -> Path:
    """A fresh virtualenv whose only packages beyond pip are the "system's": this environment's site-packages, put
    on its path by a .pth file (a plain path line: the editable install's finder there is never run), so torch is
    the user's own and nothing of the checkout is importable. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=300)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "users_stack.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.mark.e2e
def test_the_installed_wheel_trains_exports_and_serves(tmp_path):
    python = _user_environment(tmp_path / "env")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean["PYTHONUNBUFFERED"] = "1"
    work = tmp_path / "work"
    work.mkdir()

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(python), *args], cwd=work, env=clean, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done

    # The README's and docs/getting-started.md's install line: `pip install /path/to/handoff`.
    run("-m", "pip", "install", "--quiet", str(_source_copy(tmp_path / "handoff")))
    where = run(
        "-c",
        "import contract, export.tasks, export.readers, train.checkpoint, serve.http.page as p; "
        "print(p.PAGE, p.PAGE.is_file())",
    ).stdout.split()
    assert where[0].startswith(str(tmp_path / "env")) and where[1] == "True", where

    run(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "train.main",
        "--out",
        "run",
        "--epochs",
        "1",
        "--workers",
        "0",
    )
    run("-m", "export", "run/last.pt", "--no-bento")
    manifest = json.loads((work / "run" / "last.export" / "manifest.json").read_text())
    assert manifest["status"] == "passed", manifest.get("parity")

    images, _ = digit_images(4)
    with BentoServer(
        tmp_path / "serve.log",
        "serve.service:ModelService",
        cwd=work,
        python=str(python),
        HANDOFF_MODEL_DIR=str(work / "run" / "last.export"),
    ) as server:
        server.wait_ready()
        page = httpx.get(server.url + "/", timeout=30)
        assert page.status_code == 200 and "<html" in page.text.lower()
        answer = httpx.post(
            server.url + "/classify", content=png_bytes(images[0]), headers={"Content-Type": "image/png"}, timeout=30
        )
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["predictions"]) == 5, answer.json()
