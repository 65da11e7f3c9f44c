"""tests/helpers/home.py, which fails the session when the suite touches the real home: it reports each file
created, changed or deleted, and each directory created or deleted, and nothing else."""
from __future__ import annotations

import os

from tests.helpers.home import changes, snapshot


def test_a_created_a_changed_and_a_deleted_file_are_reported(tmp_path):
    (tmp_path / "kept").write_text("same")
    (tmp_path / "changed").write_text("before")
    (tmp_path / "deleted").write_text("x")
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "deep")  # recorded, not followed
    before = snapshot(tmp_path)
    assert changes(before, snapshot(tmp_path)) == []

    (tmp_path / "deep" / "er" / "created").write_text("new")
    (tmp_path / "changed").write_text("after, longer")
    (tmp_path / "deleted").unlink()
    (tmp_path / "empty").mkdir()
    assert changes(before, snapshot(tmp_path)) == [
        f"changed {tmp_path / 'changed'}", f"created {tmp_path / 'deep' / 'er' / 'created'}",
        f"deleted {tmp_path / 'deleted'}", f"created {tmp_path / 'empty'}"]


def test_a_file_rewritten_with_the_same_size_is_reported_by_its_mtime(tmp_path):
    (tmp_path / "f").write_text("one")
    before = snapshot(tmp_path)
    (tmp_path / "f").write_text("two")
    os.utime(tmp_path / "f", ns=(0, before[str(tmp_path / "f")][1] + 1))
    assert changes(before, snapshot(tmp_path)) == [f"changed {tmp_path / 'f'}"]


def test_skipped_directories_and_toolchains_are_not_looked_into(tmp_path):
    cache, pyenv = tmp_path / "cache" / "tidemark", tmp_path / ".pyenv"
    cache.mkdir(parents=True)
    pyenv.mkdir()
    before = snapshot(tmp_path, skip=[cache])
    (cache / "jar").write_text("shared, read-only for the suite")
    (pyenv / "version").write_text("3.12")
    assert changes(before, snapshot(tmp_path, skip=[cache])) == []
    (tmp_path / ".rustup").mkdir()  # a toolchain directory that was not there is reported
    assert changes(before, snapshot(tmp_path, skip=[cache])) == [f"created {tmp_path / '.rustup'}"]


def test_a_missing_root_is_empty(tmp_path):
    assert snapshot(tmp_path / "nope") == {}
