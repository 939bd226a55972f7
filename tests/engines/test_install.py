"""`tune --install`: where each engine's files go, and never clobbering a different file."""

import pytest

from moetune.engines.install import (
    InstallError,
    check_target_files,
    check_writable,
    engine_files,
    install_files,
    install_target,
)

NAME = "E=4,N=32,device_name=NVIDIA_H200.json"


def tuned(tmp_path, text='{"1": {}}\n', name=NAME):
    source = tmp_path / "out" / name
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(text)
    return source


def test_env_var_folder_first_then_the_package(tmp_path):
    env = {
        "VLLM_TUNED_CONFIG_FOLDER": str(tmp_path / "v"),
        "SGLANG_MOE_CONFIG_DIR": str(tmp_path / "s"),
    }
    vllm = install_target("vllm", "3.6.0", env=env, package=tmp_path / "pkg")
    assert (vllm.folder, vllm.export) == (tmp_path / "v", None)
    sglang = install_target("sglang", "3.6.0", env=env, package=tmp_path / "pkg")
    assert sglang.folder == tmp_path / "s" / "configs" / "triton_3_6_0"
    package = install_target("vllm", "3.6.0", env={}, package=tmp_path / "pkg")
    assert package.folder == tmp_path / "pkg" and "installed vllm" in package.source


def test_install_dir_wins_and_prints_the_export_line(tmp_path):
    target = install_target("sglang", "3.6.0", tmp_path / "mine", env={}, package=None)
    assert target.folder == tmp_path / "mine" / "configs" / "triton_3_6_0"
    assert target.export == f"export SGLANG_MOE_CONFIG_DIR={tmp_path / 'mine'}"
    # Already exported: nothing to print.
    env = {"VLLM_TUNED_CONFIG_FOLDER": str(tmp_path / "mine")}
    assert install_target("vllm", "3.6.0", tmp_path / "mine", env=env).export is None


def test_no_engine_and_no_install_dir_is_a_one_line_error(tmp_path):
    with pytest.raises(InstallError, match="vLLM is not installed here.*--install-dir"):
        install_target("vllm", "3.6.0", env={}, package=None)


def test_an_unwritable_folder_fails_before_tuning(tmp_path):
    # A file where a folder should be: nothing can be created below it (even as root).
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(InstallError, match="cannot write"):
        check_writable(install_target("vllm", "3.6.0", blocker / "sub", env={}))
    check_writable(install_target("vllm", "3.6.0", tmp_path / "new" / "deep", env={}))


def test_new_identical_and_different_files(tmp_path):
    target = install_target("vllm", "3.6.0", tmp_path / "engine", env={})
    source = tuned(tmp_path)
    (done,) = install_files(target, [source])
    assert done.status == "installed" and done.target.read_text() == source.read_text()

    (again,) = install_files(target, [source])
    assert again.status == "already installed" and again.backup is None

    old = '{"1": {"old": 1}}\n'
    done.target.write_text(old)
    with pytest.raises(InstallError, match="exists and differs.*--overwrite-installed"):
        install_files(target, [source])
    assert done.target.read_text() == old  # untouched
    assert list(target.folder.iterdir()) == [done.target]

    (replaced,) = install_files(target, [source], overwrite=True, now=0)
    assert replaced.status == "replaced"
    assert replaced.backup == target.folder / f"{NAME}.bak-19700101-000000"
    assert replaced.backup.read_text() == old
    assert replaced.target.read_text() == source.read_text()
    assert not list(target.folder.glob(".*.tmp"))


def test_a_refused_conflict_copies_nothing(tmp_path):
    target = install_target("sglang", "3.6.0", tmp_path / "engine", env={})
    up = tuned(tmp_path)
    down = tuned(tmp_path, '{"1": {"down": 1}}\n', NAME.replace(".json", "_down.json"))
    target.folder.mkdir(parents=True)
    (target.folder / down.name).write_text("different\n")
    with pytest.raises(InstallError):
        install_files(target, engine_files("sglang", up))
    assert not (target.folder / NAME).exists()


def test_sglang_installs_the_down_twin_vllm_does_not(tmp_path):
    up = tuned(tmp_path)
    assert engine_files("sglang", up) == [up]
    down = tuned(tmp_path, "{}\n", NAME.replace(".json", "_down.json"))
    assert engine_files("sglang", up) == [up, down]
    assert engine_files("vllm", up) == [up]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_empty_env_var_is_refused(engine, tmp_path):
    # The engine would read tuned files from its working folder, not from the package.
    env = {"VLLM_TUNED_CONFIG_FOLDER": "", "SGLANG_MOE_CONFIG_DIR": ""}
    with pytest.raises(InstallError, match="is set but empty"):
        install_target(engine, "3.6.0", env=env, package=tmp_path)
    # --install-dir still wins
    assert install_target(engine, "3.6.0", tmp_path / "mine", env=env).source == "--install-dir"


def test_the_installed_release_gives_the_folder(tmp_path, monkeypatch):
    from moetune.engines import sglang
    from moetune.engines.installed import InstalledEngine

    root = tmp_path / "sglang" / "srt/layers/moe/moe_runner/triton_utils"
    found = InstalledEngine(
        engine="sglang",
        version="0.5.23",
        root=tmp_path / "sglang",
        kernel_source=None,
        configs_dir=root / "configs",
        lookup_source=None,
        release="0.5.23",
    )
    monkeypatch.setattr(sglang, "installed", lambda: found)
    target = install_target("sglang", "3.6.0", env={})
    assert target.folder == root / "configs" / "triton_3_6_0"
    assert target.source == "the installed sglang 0.5.23 package"


def test_a_second_backup_in_the_same_second_keeps_the_first(tmp_path):
    target = install_target("vllm", "3.6.0", tmp_path / "engine", env={})
    target.folder.mkdir(parents=True)
    installed = target.folder / NAME
    backups = []
    for old in ('{"1": {"first": 1}}\n', '{"1": {"second": 1}}\n'):
        installed.write_text(old)
        (done,) = install_files(target, [tuned(tmp_path)], overwrite=True, now=0)
        backups.append(done.backup)
    assert [b.name for b in backups] == [
        f"{NAME}.bak-19700101-000000",
        f"{NAME}.bak-19700101-000000-2",
    ]
    assert [b.read_text() for b in backups] == ['{"1": {"first": 1}}\n', '{"1": {"second": 1}}\n']


def test_a_file_that_is_not_utf8_is_kept_byte_for_byte(tmp_path):
    target = install_target("vllm", "3.6.0", tmp_path / "engine", env={})
    target.folder.mkdir(parents=True)
    (target.folder / NAME).write_bytes(b"\xff\xfe not text")
    with pytest.raises(InstallError, match="exists and differs"):
        install_files(target, [tuned(tmp_path)])
    (done,) = install_files(target, [tuned(tmp_path)], overwrite=True)
    assert done.status == "replaced" and done.backup.read_bytes() == b"\xff\xfe not text"


def test_a_folder_in_the_way_is_a_one_line_error(tmp_path):
    target = install_target("vllm", "3.6.0", tmp_path / "engine", env={})
    (target.folder / NAME).mkdir(parents=True)
    with pytest.raises(
        InstallError, match=f"cannot install {target.folder / NAME}: Is a directory"
    ):
        install_files(target, [tuned(tmp_path)], overwrite=True)


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_dangling_symlink_target_is_refused_not_replaced(tmp_path, overwrite):
    target = install_target("vllm", "3.6.0", tmp_path / "engine", env={})
    target.folder.mkdir(parents=True)
    link = target.folder / NAME
    link.symlink_to(tmp_path / "gone.json")
    with pytest.raises(InstallError) as info:
        install_files(target, [tuned(tmp_path)], overwrite=overwrite)
    assert str(info.value) == (
        f"{link} is a dangling symlink (to {tmp_path / 'gone.json'}); moetune does not replace "
        "it unasked: remove it, or point it at a file, and rerun"
    )
    assert link.is_symlink() and not (tmp_path / "gone.json").exists()


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_target_linked_to_a_real_file_is_refused_and_both_are_left_alone(tmp_path, overwrite):
    target = install_target("vllm", "3.6.0", tmp_path / "engine", env={})
    target.folder.mkdir(parents=True)
    real = tmp_path / "real.json"
    real.write_text('{"1": {"theirs": 1}}\n')
    link = target.folder / NAME
    link.symlink_to(real)
    message = (
        f"{link} is a symlink (to {real}); moetune does not replace a link with its own file: "
        "remove it and rerun, or pass another --install-dir"
    )
    with pytest.raises(InstallError) as before:
        check_target_files(target, [NAME])  # before tuning
    assert str(before.value) == message
    with pytest.raises(InstallError) as after:
        install_files(target, [tuned(tmp_path)], overwrite=overwrite)  # a link made meanwhile
    assert str(after.value) == message
    assert link.is_symlink() and real.read_text() == '{"1": {"theirs": 1}}\n'
    assert sorted(p.name for p in target.folder.iterdir()) == [NAME]  # no backup either


def test_a_dangling_target_is_found_before_tuning(tmp_path):
    target = install_target("sglang", "3.6.0", tmp_path / "engine", env={})
    target.folder.mkdir(parents=True)
    down = "E=4,N=32,device_name=NVIDIA_H200_down.json"
    (target.folder / down).symlink_to(tmp_path / "gone.json")
    check_target_files(target, [NAME])
    with pytest.raises(InstallError, match=f"{down} is a dangling symlink"):
        check_target_files(target, [NAME, down])


@pytest.mark.parametrize("dangling", ["engine", "engine/configs"])
def test_a_dangling_folder_is_refused_before_tuning_and_when_installing(tmp_path, dangling):
    gone = tmp_path / "gone"
    link = tmp_path / dangling
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(gone)
    message = (
        f"--install sglang: {link} is a dangling symlink (to {gone}); moetune does not replace "
        "it unasked: remove it, or point it at a folder, and rerun"
    )
    env = {"SGLANG_MOE_CONFIG_DIR": str(tmp_path / "engine")}
    target = install_target("sglang", "3.6.0", env=env)
    with pytest.raises(InstallError) as before:
        check_writable(target)
    assert str(before.value) == message
    with pytest.raises(InstallError) as after:
        install_files(target, [tuned(tmp_path)])
    assert str(after.value) == message
    assert link.is_symlink() and not gone.exists()
    if dangling == "engine":  # named by --install-dir: refused before resolving it
        with pytest.raises(InstallError) as named:
            install_target("sglang", "3.6.0", link, env={})
        assert str(named.value) == message


def test_a_folder_linked_to_a_real_folder_is_followed(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "engine").symlink_to(real)
    target = install_target(
        "vllm", "3.6.0", env={"VLLM_TUNED_CONFIG_FOLDER": str(tmp_path / "engine")}
    )
    check_writable(target)
    check_target_files(target, [NAME])
    (done,) = install_files(target, [tuned(tmp_path)])
    assert done.status == "installed" and (real / NAME).read_text() == '{"1": {}}\n'
