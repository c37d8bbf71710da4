"""The VM harness's own rules, on the host: what it skips for, when the image is rebuilt,
how results come out. (The VM itself: test_vm.py.)"""
from __future__ import annotations

import shutil

from tests.vm import conftest, image, machine


def test_missing_tools_skip_with_one_line_naming_them_and_their_packages(monkeypatch):
    monkeypatch.setattr(conftest.os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: None if name in ("debootstrap", "qemu-system-x86_64") else "/x")
    why = conftest.missing()
    assert why == ("VM tests need qemu-system-x86_64, debootstrap "
                   "(apt-get install debootstrap qemu-system-x86)")
    monkeypatch.setattr(shutil, "which", lambda name: "/x")
    assert conftest.missing() is None
    monkeypatch.setattr(conftest.os, "geteuid", lambda: 1000)
    assert "root" in conftest.missing() and "\n" not in conftest.missing()


def test_a_changed_builder_gets_a_new_image_key(tmp_path, monkeypatch):
    guest = tmp_path / "guest"
    shutil.copytree(image.GUEST, guest)
    shutil.copy(image.__file__, tmp_path / "image.py")
    monkeypatch.setattr(image, "GUEST", guest)
    monkeypatch.setattr(image, "HERE", tmp_path)
    monkeypatch.setattr(image, "__file__", str(tmp_path / "image.py"))
    first = image.key()
    assert image.key() == first  # the same inputs, the same cached image
    (guest / "fleet-vmtest").write_text((guest / "fleet-vmtest").read_text() + "# changed\n")
    assert image.key() != first
    second = image.key()
    (tmp_path / "image.py").write_text((tmp_path / "image.py").read_text() + "# changed\n")
    assert image.key() not in (first, second)
    second = image.key()
    monkeypatch.setattr(image, "dependencies", lambda: ["numpy>=1.26", "something-new>=1"])
    assert image.key() not in (first, second)


def test_result_lines_are_read_by_scenario_and_noise_is_passed_over():
    text = ("\x00garbage\r\nFLEETVM BOOTED 12.5\r\n"
            'FLEETVM RESULT start {"enable_rc": 0}\r\n'
            "FLEETVM RESULT reload {not json\r\n"
            "[  3.1] kernel says\nFLEETVM DONE rc=0\n")
    results, lines = machine.parse(text)
    assert results["start"] == {"enable_rc": 0}
    assert results["reload"]["error"].startswith("unreadable result line")
    assert lines[0] == "FLEETVM BOOTED 12.5" and lines[-1] == "FLEETVM DONE rc=0"
    run = machine.Run(results, lines, "", 0, False)
    assert run.done and machine.Run.from_json(run.to_json()) == run
