"""A PEP 517 build backend for the oversub client, standard library only.

The package is pure Python with no build step, so a wheel is a zip of ``oversub/`` and its
metadata. Keeping the backend in the tree (``backend-path`` in pyproject.toml, ``requires``
empty) lets ``pip install clients/python`` work with no network: pip's isolated build
environment needs nothing installed into it. Hooks: build_wheel, build_sdist, build_editable
(PEP 660: a .pth file naming this folder) and prepare_metadata_for_build_wheel.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "oversub"
SUMMARY = ("Python client for oversubd: directives, acknowledgements, usage and ready reports, "
           "PyTorch helpers")
REQUIRES_PYTHON = ">=3.9"
TAG = "py3-none-any"


def _version() -> str:
    with open(os.path.join(HERE, NAME, "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if m is None:
        raise RuntimeError("oversub/__init__.py has no __version__")
    return m.group(1)


def _metadata() -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {_version()}",
        f"Summary: {SUMMARY}",
        f"Requires-Python: {REQUIRES_PYTHON}",
        "Classifier: Programming Language :: Python :: 3",
        "Classifier: Operating System :: POSIX :: Linux",
        "Classifier: Typing :: Typed",
        "Provides-Extra: torch",
        "Requires-Dist: torch; extra == \"torch\"",
    ]
    readme = os.path.join(HERE, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _wheel_file() -> str:
    return ("Wheel-Version: 1.0\nGenerator: oversub _build/backend.py\n"
            f"Root-Is-Purelib: true\nTag: {TAG}\n")


def _package_files() -> List[Tuple[str, str]]:
    """(path in the archive, path on disk) of the package's files, sorted."""
    out: List[Tuple[str, str]] = []
    root = os.path.join(HERE, NAME)
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith((".py", ".typed")):
                full = os.path.join(d, f)
                out.append((os.path.relpath(full, HERE).replace(os.sep, "/"), full))
    return out


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _write_wheel(directory: str, members: List[Tuple[str, bytes]]) -> str:
    dist_info = f"{NAME}-{_version()}.dist-info"
    members = members + [
        (f"{dist_info}/METADATA", _metadata().encode()),
        (f"{dist_info}/WHEEL", _wheel_file().encode()),
        (f"{dist_info}/top_level.txt", f"{NAME}\n".encode()),
    ]
    record = [_record_line(a, b) for a, b in members] + [f"{dist_info}/RECORD,,"]
    members.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    name = f"{NAME}-{_version()}-{TAG}.whl"
    os.makedirs(directory, exist_ok=True)
    # fixed timestamps: the same sources give the same wheel
    stamp = (2020, 1, 1, 0, 0, 0)
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in members:
            info = zipfile.ZipInfo(arcname, stamp)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return name


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, Any]] = None
                                    ) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Optional[Dict[str, Any]] = None) -> str:
    dist_info = f"{NAME}-{_version()}.dist-info"
    path = os.path.join(metadata_directory, dist_info)
    os.makedirs(path, exist_ok=True)
    for fname, text in (("METADATA", _metadata()), ("WHEEL", _wheel_file()),
                        ("top_level.txt", f"{NAME}\n")):
        with open(os.path.join(path, fname), "w", encoding="utf-8") as f:
            f.write(text)
    return dist_info


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    members = []
    for arcname, full in _package_files():
        with open(full, "rb") as f:
            members.append((arcname, f.read()))
    return _write_wheel(wheel_directory, members)


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, [(f"_{NAME}_editable.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    base = f"{NAME}-{_version()}"
    name = f"{base}.tar.gz"
    os.makedirs(sdist_directory, exist_ok=True)
    files = [(a, f) for a, f in _package_files()]
    for extra in ("pyproject.toml", "README.md", "_build/backend.py"):
        if os.path.exists(os.path.join(HERE, extra)):
            files.append((extra, os.path.join(HERE, extra)))
    pkg_info = _metadata().encode()
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for arcname, full in files:
            t.add(full, arcname=f"{base}/{arcname}", recursive=False)
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        info.mtime = int(time.time())
        t.addfile(info, io.BytesIO(pkg_info))
    return name
