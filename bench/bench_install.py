"""Install time and size per extra: a fresh venv, ``pip install -e '<repo>[EXTRA]'``, timed;
then the size of its site-packages (less pip and setuptools, which every venv has) and the
number of distributions in it.

    .venv/bin/python bench/bench_install.py collector all

pip's cache and index settings are the caller's: say in the table whether the wheels were
already downloaded.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV_OWN = ("pip", "setuptools", "pkg_resources", "_distutils_hack")


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def measure(extra: str, workdir: Path) -> dict[str, float | int | str]:
    venv = workdir / extra
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    t0 = time.perf_counter()
    subprocess.run([*pip, "install", "-q", "-e", f"{REPO}[{extra}]"], check=True)
    install_s = time.perf_counter() - t0
    (site,) = (venv / "lib").glob("python3*/site-packages")
    own = sum(tree_bytes(site / name) for name in VENV_OWN if (site / name).exists())
    listed = subprocess.run(
        [*pip, "list", "--format=freeze"], check=True, capture_output=True, text=True
    ).stdout.split()
    return {
        "extra": extra,
        "install_s": round(install_s, 1),
        "site_packages_mib": round((tree_bytes(site) - own) / 2**20, 1),
        "distributions": len([d for d in listed if not d.startswith(("pip==", "setuptools=="))]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extras", nargs="+", help="extras to measure, e.g. collector all")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dctwin-install-") as tmp:
        print("| extra | install (s) | site-packages (MiB, less pip/setuptools) | distributions |")
        print("|---|---|---|---|")
        for extra in args.extras:
            r = measure(extra, Path(tmp))
            row = (r["extra"], r["install_s"], r["site_packages_mib"], r["distributions"])
            print("| `{}` | {} | {} | {} |".format(*row), flush=True)


if __name__ == "__main__":
    main()
