"""Generated kernel sources are imported (run) from a cache folder: it must be private."""

import os
import stat

import pytest

from translator_kernels.codegen.host import cache_dir


def test_default_cache_is_private_and_not_in_tmp(monkeypatch, tmp_path):
    monkeypatch.delenv("FLYDSL_TRANSLATOR_KERNEL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    d = cache_dir()
    assert d == tmp_path / "xdg" / "flydsl-translator" / "kernels"
    assert stat.S_IMODE(os.lstat(d).st_mode) & 0o077 == 0
    monkeypatch.delenv("XDG_CACHE_HOME")
    import tempfile
    assert not str(cache_dir()).startswith(tempfile.gettempdir())


def test_symlinked_cache_is_refused(monkeypatch, tmp_path):
    shared = tmp_path / "world"
    shared.mkdir()
    os.chmod(shared, 0o777)
    link = tmp_path / "cache"
    link.symlink_to(shared)
    monkeypatch.setenv("FLYDSL_TRANSLATOR_KERNEL_CACHE", str(link))
    with pytest.raises(PermissionError, match="symlink"):
        cache_dir()


def test_group_writable_cache_of_ours_is_closed(monkeypatch, tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    os.chmod(d, 0o777)
    monkeypatch.setenv("FLYDSL_TRANSLATOR_KERNEL_CACHE", str(d))
    assert stat.S_IMODE(os.lstat(cache_dir()).st_mode) == 0o700


def test_cache_owned_by_someone_else_is_refused(monkeypatch, tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    monkeypatch.setenv("FLYDSL_TRANSLATOR_KERNEL_CACHE", str(d))
    monkeypatch.setattr(os, "getuid", lambda: os.lstat(d).st_uid + 1)
    with pytest.raises(PermissionError, match="owned by uid"):
        cache_dir()


def test_private_ld_lld_link_survives_racing_workers(monkeypatch, tmp_path):
    """Test workers (pytest-xdist) compile at once on a clean machine, each making flysim's private
    ROCM_PATH/llvm/bin/ld.lld link. Here another worker makes it between our look and our link: no
    FileExistsError, and the link is whole. A stale link is replaced; no temporary link is left."""
    from pathlib import Path

    from flysim import toolchain

    ld = tmp_path / "bin" / "ld.lld"  # the link's target: any file serves (only links are made here)
    ld.parent.mkdir()
    ld.write_text("")
    ld = str(ld)
    monkeypatch.setattr(toolchain, "PRIVATE_ROOT", tmp_path / "rocm")
    link = tmp_path / "rocm" / "llvm" / "bin" / "ld.lld"
    real_symlink_to = Path.symlink_to

    def other_worker_first(self, target, *a, **k):
        if not link.is_symlink():
            real_symlink_to(link, os.path.realpath(ld))  # the other worker's link, made just now
        return real_symlink_to(self, target, *a, **k)

    monkeypatch.setattr(Path, "symlink_to", other_worker_first)
    assert toolchain._private_rocm(ld) == str(tmp_path / "rocm")
    assert os.path.realpath(link) == os.path.realpath(ld)
    monkeypatch.setattr(Path, "symlink_to", real_symlink_to)
    link.unlink()
    link.symlink_to(tmp_path / "gone")  # stale: an ld.lld that is no more
    toolchain._private_rocm(ld)
    assert os.path.realpath(link) == os.path.realpath(ld)
    assert os.listdir(link.parent) == ["ld.lld"]


# ---- an unusable cache folder is one TranslatorError naming the fix, and leaves no temporary file ----

def test_cache_path_that_is_a_file_or_cannot_be_created_is_a_translator_error(monkeypatch, tmp_path):
    from translator.errors import CacheDirError, TranslatorError

    blocker = tmp_path / "file"
    blocker.write_text("")
    for path, why in ((blocker, "cannot be created|not a folder"), (blocker / "sub", "cannot be created"),
                      ("/proc/flydsl_nope/kernels", "cannot be created")):
        monkeypatch.setenv("FLYDSL_TRANSLATOR_KERNEL_CACHE", str(path))
        with pytest.raises(CacheDirError, match=why) as e:
            cache_dir()
        assert isinstance(e.value, TranslatorError) and "FLYDSL_TRANSLATOR_KERNEL_CACHE" in str(e.value)


def test_full_disk_is_a_translator_error_and_leaves_no_temporary_file(monkeypatch, tmp_path):
    import errno
    from pathlib import Path

    from translator.errors import CacheDirError
    from translator_kernels.codegen.host import write_source

    monkeypatch.setenv("FLYDSL_TRANSLATOR_KERNEL_CACHE", str(tmp_path / "c"))

    def full(self, *a, **k):
        self.open("w").close()  # the file exists, 0 bytes, as a real ENOSPC leaves it
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(CacheDirError, match="No space left.*free space"):
        write_source("print(1)\n", "k_full", {})
    assert list((tmp_path / "c").iterdir()) == []
