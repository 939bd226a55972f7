"""Config sources: local paths, a fake Hugging Face cache, a fake catalog and a fake Hub.

No test touches the network: `huggingface_hub.hf_hub_download` is replaced by a
function that fails the test unless a test installs its own fake.
"""

import json
from types import SimpleNamespace

import huggingface_hub
import pytest
from huggingface_hub import errors as hf_errors

from moetune.errors import ConfigSourceError
from moetune.extract import sources
from moetune.extract.sources import load_config

CONFIG = {"architectures": ["MixtralForCausalLM"], "num_local_experts": 8}
CATALOG_INDEX = """\
# Bundled configs

| file | architectures[0] | paths / notes | provenance |
|---|---|---|---|
| acme__Big-MoE.json | BigMoe | `a` \\| `b` | `acme/configs@abc123:big/config.json` |
"""


@pytest.fixture(autouse=True)
def isolated_hf(monkeypatch, tmp_path):
    """A private HF_HOME, online, no cache overrides, and a Hub that must not be called."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))

    def no_network(*args, **kwargs):
        pytest.fail(f"the Hub was called: {args} {kwargs}")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    # The fake Hub is "reachable"; tests/extract/test_hub_unreachable.py covers a dead one.
    monkeypatch.setattr(sources, "hub_reachable", lambda *args, **kwargs: (True, ""))


@pytest.fixture
def catalog(monkeypatch, tmp_path):
    folder = tmp_path / "catalog"
    folder.mkdir()
    (folder / "acme__Big-MoE.json").write_text(json.dumps({"bundled": True}))
    (folder / "INDEX.md").write_text(CATALOG_INDEX)
    monkeypatch.setattr(sources, "CATALOG_DIR", folder)
    return folder


def fake_cache(root, repo_id, config, commit="abc123def", ref="main"):
    """The hub cache layout huggingface_hub writes: refs/<ref> -> snapshots/<commit>/."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    (repo / "refs").mkdir()
    (repo / "refs" / ref).write_text(commit)
    return snapshot / "config.json"


def http_error(cls, message):
    return cls(message, response=SimpleNamespace(headers={}, request=None))


def test_local_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    loaded = load_config(str(tmp_path))
    assert loaded.config == CONFIG
    assert loaded.path == str(tmp_path / "config.json")
    assert loaded.description == f"local file {tmp_path / 'config.json'}"


def test_local_json_file(tmp_path):
    file = tmp_path / "my-model.json"
    file.write_text(json.dumps(CONFIG))
    assert load_config(str(file)).config == CONFIG


def test_directory_without_config(tmp_path):
    with pytest.raises(ConfigSourceError) as exc:
        load_config(str(tmp_path))
    assert str(exc.value) == f"{tmp_path} is a directory without a config.json"


def test_missing_path():
    with pytest.raises(ConfigSourceError) as exc:
        load_config("./no/such/config.json")
    assert str(exc.value) == "./no/such/config.json: no such file or directory"


def test_neither_path_nor_repo_id():
    with pytest.raises(ConfigSourceError) as exc:
        load_config("not a model")
    assert (
        str(exc.value)
        == "'not a model' is neither an existing path nor a Hugging Face repo id (org/name)"
    )


def test_malformed_json_names_file_and_line(tmp_path):
    file = tmp_path / "config.json"
    file.write_text('{\n  "num_experts": 8,\n  "top_k" 2\n}\n')
    with pytest.raises(ConfigSourceError) as exc:
        load_config(str(tmp_path))
    assert str(exc.value) == (
        f"malformed JSON in {file} at line 3, column 11: Expecting ':' delimiter"
    )


def test_json_that_is_not_an_object(tmp_path):
    file = tmp_path / "config.json"
    file.write_text("[1, 2]")
    with pytest.raises(ConfigSourceError) as exc:
        load_config(str(file))
    assert str(exc.value) == f"{file} holds a JSON list, not a config object"


def test_hf_cache_main(tmp_path):
    file = fake_cache(tmp_path / "hf_home" / "hub", "acme/Small-MoE", CONFIG)
    loaded = load_config("acme/Small-MoE")
    assert loaded.config == CONFIG
    assert loaded.path == str(file)
    assert loaded.description == "Hugging Face cache (revision abc123def)"


def test_hf_cache_respects_hf_hub_cache(monkeypatch, tmp_path):
    fake_cache(tmp_path / "elsewhere", "acme/Small-MoE", CONFIG)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert load_config("acme/Small-MoE").config == CONFIG


def test_hf_cache_by_revision(tmp_path):
    fake_cache(tmp_path / "hf_home" / "hub", "acme/Small-MoE", CONFIG, commit="c0ffee", ref="v2")
    loaded = load_config("acme/Small-MoE", revision="v2")
    assert loaded.description == "Hugging Face cache (revision c0ffee)"


def test_cache_wins_over_the_bundled_snapshot(tmp_path, catalog):
    fake_cache(tmp_path / "hf_home" / "hub", "acme/Big-MoE", CONFIG)
    assert load_config("acme/Big-MoE").config == CONFIG


def test_bundled_snapshot_case_insensitive_with_provenance(catalog):
    loaded = load_config("ACME/big-moe")
    assert loaded.config == {"bundled": True}
    assert loaded.path == str(catalog / "acme__Big-MoE.json")
    assert loaded.description == (
        "bundled snapshot acme__Big-MoE.json (provenance acme/configs@abc123:big/config.json)"
    )


def test_bundled_snapshot_wins_over_the_hub_when_online(catalog):
    # The autouse fixture fails the test if the Hub is called.
    assert load_config("acme/Big-MoE").config == {"bundled": True}


def test_revision_skips_the_bundled_snapshot_and_asks_the_hub(monkeypatch, tmp_path, catalog):
    calls = []

    def download(repo_id, filename, revision=None, cache_dir=None):
        calls.append((repo_id, filename, revision))
        return str(fake_cache(tmp_path / "hub_dl", repo_id, {"from": "hub"}, commit="feed01"))

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    loaded = load_config("acme/Big-MoE", revision="main")
    assert calls == [("acme/Big-MoE", "config.json", "main")]
    assert loaded.config == {"from": "hub"}
    assert loaded.description == "Hugging Face Hub (revision feed01)"


def test_hub_when_not_cached_and_not_bundled(monkeypatch, tmp_path, catalog):
    def download(repo_id, filename, revision=None, cache_dir=None):
        assert cache_dir == tmp_path / "hf_home" / "hub"
        return str(fake_cache(tmp_path / "hub_dl", repo_id, {"from": "hub"}))

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    assert load_config("acme/Other-MoE").config == {"from": "hub"}


def test_offline_and_not_cached(monkeypatch, catalog):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigSourceError) as exc:
        load_config("acme/Other-MoE")
    hub = sources.hf_cache_dir()
    assert str(exc.value) == (
        f"acme/Other-MoE is not in the Hugging Face cache ({hub}) and HF_HUB_OFFLINE is set: "
        "run `hf download acme/Other-MoE config.json` on a connected machine, "
        "pass --model /path/to/config.json"
    )


def test_offline_with_revision_points_at_the_bundled_snapshot(monkeypatch, catalog):
    monkeypatch.setenv("HF_HUB_OFFLINE", "true")
    with pytest.raises(ConfigSourceError) as exc:
        load_config("acme/Big-MoE", revision="v9")
    assert str(exc.value).endswith(
        "pass --model /path/to/config.json or drop --revision to use the bundled snapshot"
    )
    assert str(exc.value).startswith("acme/Big-MoE (revision v9) is not in the Hugging Face cache")


@pytest.mark.parametrize(
    "error, message",
    [
        (
            http_error(hf_errors.GatedRepoError, "403"),
            "acme/Other-MoE is gated: accept its terms on the Hub and set HF_TOKEN",
        ),
        (
            http_error(hf_errors.RepositoryNotFoundError, "404"),
            "acme/Other-MoE is not on the Hugging Face Hub (a private repo needs HF_TOKEN)",
        ),
        (
            http_error(hf_errors.RevisionNotFoundError, "404"),
            "revision 'v1' does not exist in acme/Other-MoE",
        ),
        (
            hf_errors.LocalEntryNotFoundError("connection refused"),
            "cannot reach the Hugging Face Hub for acme/Other-MoE (revision v1) and it is not "
            "cached: check the network, or run `hf download acme/Other-MoE config.json` where it works",
        ),
        (
            http_error(hf_errors.HfHubHTTPError, "500 Server Error\nmore detail"),
            "fetching acme/Other-MoE (revision v1) from the Hub failed: 500 Server Error",
        ),
    ],
)
def test_hub_errors_are_one_line(monkeypatch, error, message):
    def download(*args, **kwargs):
        raise error

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    with pytest.raises(ConfigSourceError) as exc:
        load_config("acme/Other-MoE", revision="v1")
    assert str(exc.value) == message


def test_catalog_models_lists_repo_ids(catalog):
    assert sources.catalog_models() == ["acme/Big-MoE"]
