"""planner.versions reads installed versions off the dist-info directories on sys.path, as
importlib.metadata does, without importing it."""

import os
import subprocess
import sys
from importlib import metadata

import pytest

from planner import versions


@pytest.mark.parametrize("package", ["numpy", "pandas", "plan-parallel", "plan_parallel",
                                     "PyYAML", "no-such-package-here"])
def test_installed_version_is_importlib_metadatas(package):
    try:
        want = metadata.version(package)
    except metadata.PackageNotFoundError:
        want = None
    assert versions.installed_version(package) == want


def test_the_planners_version_and_its_verl_pin_come_from_its_metadata():
    assert versions.planner_version() == metadata.version("plan-parallel")
    pins = [r for r in metadata.requires("plan-parallel") if r.startswith("verl==")]
    assert pins and pins[0].startswith(f"verl=={versions.target_verl_version()};")


def test_a_dist_info_directory_is_read(tmp_path, monkeypatch):
    info = tmp_path / "Some.Package-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: Some.Package\n"
                                   "Version: 1.2.3\n\nVersion: 9.9 (the body, not a header)\n")
    (tmp_path / "other-0.1.egg-info").write_text("Name: other\nVersion: 0.1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert versions.installed_version("some-package") == "1.2.3"
    assert versions.installed_version("OTHER") == "0.1"
    assert versions.installed_version("some-packages") is None


def test_importing_the_planner_does_not_import_importlib_metadata():
    code = "import sys, planner; print('importlib.metadata' in sys.modules, planner.__version__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.split() == ["False", metadata.version("plan-parallel")]


def test_a_directory_listing_is_kept_until_the_directory_changes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    assert versions.installed_version("late-package") is None  # lists tmp_path, keeps it
    info = tmp_path / "late_package-2.0.dist-info"
    info.mkdir()  # changes tmp_path's mtime: listed again
    (info / "METADATA").write_text("Name: late-package\nVersion: 2.0\n")
    stamp = tmp_path.stat().st_mtime_ns + 10**9  # past a coarse clock's tick, as later is
    os.utime(tmp_path, ns=(stamp, stamp))
    assert versions.installed_version("late-package") == "2.0"
