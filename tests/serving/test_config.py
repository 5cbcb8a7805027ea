"""Unit tests for serving.model_servers.flags, serving.config.model_server_config and
serving.sources.storage_path.file_system_storage_path_source (no TensorFlow needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

from serving.config import model_server_config as config_module
from serving.model_servers import flags, server_config
from serving.model_servers.flags import FlagError, ServerOptions, parse_flags
from serving.sources.storage_path import file_system_storage_path_source as source
from serving.util.errors import Code, ServingError

# ---- flags -------------------------------------------------------------------------------------


def test_flag_defaults_are_tf_serving_defaults() -> None:
    options = parse_flags(["--model_base_path=/models/m"])
    assert options.port == 8500
    assert options.rest_api_port == 8501
    assert options.rest_api_host == "0.0.0.0"
    assert options.rest_api_timeout_in_ms == 30000
    assert options.model_name == "default"
    assert options.saved_model_tags == "serve"
    assert options.enable_model_warmup is True
    assert flags.rest_api_num_threads(options) >= 4


def test_flags_accept_equals_and_space_forms() -> None:
    options = parse_flags(
        ["--port", "9000", "--rest_api_port=9001", "--model_name", "m", "--model_base_path=/m"]
    )
    assert (options.port, options.rest_api_port, options.model_name) == (9000, 9001, "m")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--rest_api_enable_cors_support"], True),
        (["--rest_api_enable_cors_support=true"], True),
        (["--rest_api_enable_cors_support=false"], False),
        (["--rest_api_enable_cors_support=0"], False),
        ([], False),
    ],
)
def test_bool_flags(argv: list[str], expected: bool) -> None:
    options = parse_flags([*argv, "--model_base_path=/m"])
    assert options.rest_api_enable_cors_support is expected


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--bogus=1", "--model_base_path=/m"], "--bogus=1"),
        (["--port=abc", "--model_base_path=/m"], "--port"),
        (["--enable_batching=maybe", "--model_base_path=/m"], "invalid boolean value"),
        (["--rest_api_por=1", "--model_base_path=/m"], "--rest_api_por"),  # no abbreviations
        (["--port=70000", "--model_base_path=/m"], "not a valid port"),
        (
            ["--port=9000", "--rest_api_port=9000", "--model_base_path=/m"],
            "cannot be same as --port",
        ),
        (
            [],
            "Both server_options.model_base_path and server_options.model_config_file are empty!",
        ),
    ],
)
def test_bad_flags(argv: list[str], fragment: str) -> None:
    with pytest.raises(FlagError) as info:
        parse_flags(argv)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_rest_port_zero_disables_rest_and_may_equal_nothing() -> None:
    assert parse_flags(["--rest_api_port=0", "--port=0", "--model_base_path=/m"]).rest_api_port == 0


def test_session_threads_fall_back_to_session_parallelism() -> None:
    cpus = flags.schedulable_cpus()  # unset: the container's CPUs, not TensorFlow's host default
    assert flags.session_threads(ServerOptions()) == (cpus, cpus)
    assert flags.session_threads(ServerOptions(tensorflow_session_parallelism=3)) == (3, 3)
    options = ServerOptions(tensorflow_intra_op_parallelism=1, tensorflow_session_parallelism=4)
    assert flags.session_threads(options) == (1, 4)
    options = ServerOptions(tensorflow_intra_op_parallelism=2, tensorflow_inter_op_parallelism=5)
    assert flags.session_threads(options) == (2, 5)


def test_unimplemented_flags_are_reported() -> None:
    options = parse_flags(["--platform_config_file=/p", "--model_base_path=/m"])
    assert flags.unimplemented_flags(options) == ["platform_config_file"]
    batching = parse_flags(["--enable_batching", "--monitoring_config_file=/m", "--model_base_path=/m"])
    assert flags.unimplemented_flags(batching) == []  # implemented: serving.batching.batching_session, .metrics
    assert flags.unimplemented_flags(ServerOptions()) == []


def test_saved_model_tags() -> None:
    options = parse_flags(["--saved_model_tags=serve,gpu", "--model_base_path=/m"])
    assert flags.saved_model_tags(options) == ("serve", "gpu")


# ---- config ------------------------------------------------------------------------------------

CONFIG = """
model_config_list {
  config {
    name: "a"
    base_path: "/models/a"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 3 } }
    version_labels { key: "stable" value: 1 }
  }
  config { name: "b" base_path: "gs://bucket/b" model_platform: "tensorflow" }
}
"""


def test_read_config_file(tmp_path: Path) -> None:
    path = tmp_path / "models.config"
    path.write_text(CONFIG)
    config = config_module.read_config_file(str(path))
    models = config.model_config_list.config
    assert [m.name for m in models] == ["a", "b"]
    assert list(models[0].model_version_policy.specific.versions) == [1, 3]
    assert dict(models[0].version_labels) == {"stable": 1}
    config_module.validate_config(config)


def test_load_config_prefers_the_file(tmp_path: Path) -> None:
    path = tmp_path / "models.config"
    path.write_text(CONFIG)
    options = ServerOptions(model_config_file=str(path), model_base_path="/ignored")
    assert [m.name for m in server_config.load_config(options).model_config_list.config] == [
        "a",
        "b",
    ]


def test_single_model_config_matches_tf_serving() -> None:
    config = server_config.load_config(ServerOptions(model_name="m", model_base_path="/models/m"))
    expected = text_format.Parse(
        'model_config_list { config { name: "m" base_path: "/models/m"'
        ' model_platform: "tensorflow" } }',
        config_module.ModelServerConfig(),
    )
    assert config == expected


def test_invalid_protobuf_file(tmp_path: Path) -> None:
    path = tmp_path / "models.config"
    path.write_text("model_config_list { config { nam: 'a' } }")
    with pytest.raises(ServingError) as info:
        config_module.read_config_file(str(path))
    assert info.value.code is Code.INVALID_ARGUMENT
    assert info.value.message.startswith(f"Invalid protobuf file: '{path}': ")
    assert "nam" in info.value.message


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ServingError, match="Could not read model config file .*No such file"):
        config_module.read_config_file(str(tmp_path / "absent"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            (
                'config { name: "a" base_path: "/a" model_platform: "tensorflow" }'
                'config { name: "a" base_path: "/b" model_platform: "tensorflow" }'
            ),
            "Illegal to list model a multiple times in config list",
        ),
        (
            'config { name: "a" base_path: "models/a" model_platform: "tensorflow" }',
            "Expected model a to have an absolute path or URI; got base_path()=models/a",
        ),
        (
            'config { name: "a" base_path: "/a" }',
            (
                "Illegal setting neither ModelServerConfig::model_type (deprecated) nor "
                "ModelServerConfig::model_platform."
            ),
        ),
        (
            'config { name: "a" base_path: "/a" model_platform: "onnx" }',
            "Model a requests unsupported platform onnx",
        ),
    ],
)
def test_config_validation(text: str, expected: str) -> None:
    config = text_format.Parse(f"model_config_list {{ {text} }}", config_module.ModelServerConfig())
    with pytest.raises(ServingError) as info:
        config_module.validate_config(config)
    assert info.value.message == expected


def test_deprecated_model_type_tensorflow_is_accepted() -> None:
    config = text_format.Parse(
        'model_config_list { config { name: "a" base_path: "/a" model_type: TENSORFLOW } }',
        config_module.ModelServerConfig(),
    )
    config_module.validate_config(config)


def test_empty_config_is_valid() -> None:
    config_module.validate_config(config_module.ModelServerConfig())


# ---- source: version directories and policy ----------------------------------------------------


def _policy(text: str) -> source.ServableVersionPolicy:
    return text_format.Parse(text, source.ServableVersionPolicy())


@pytest.mark.parametrize(
    ("policy", "on_disk", "aspired"),
    [
        ("", [1, 3, 2], [3]),
        ("latest {}", [1, 3, 2], [3]),
        ("latest { num_versions: 2 }", [1, 3, 2], [3, 2]),
        ("latest { num_versions: 5 }", [1, 2], [2, 1]),
        ("all {}", [1, 3, 2], [3, 2, 1]),
        ("specific { versions: 1 versions: 7 }", [1, 3, 2], [1]),
        ("specific { versions: 7 }", [1, 2], []),
        ("", [], []),
    ],
)
def test_select_versions(policy: str, on_disk: list[int], aspired: list[int]) -> None:
    assert source.select_versions(_policy(policy), on_disk) == aspired


def test_list_versions(tmp_path: Path) -> None:
    for name in ("1", "0002", "10", "abc", "1.5"):
        (tmp_path / name).mkdir()
    (tmp_path / "3").write_text("a file, not a version")
    versions = source.list_versions("m", str(tmp_path))
    assert sorted(versions) == [1, 2, 10]
    assert versions[2] == str(tmp_path / "0002")


def test_list_versions_missing_base_path(tmp_path: Path) -> None:
    with pytest.raises(ServingError) as info:
        source.list_versions("m", str(tmp_path / "nope"))
    assert info.value.code is Code.NOT_FOUND
    assert info.value.message == f"Could not find base path {tmp_path / 'nope'} for servable m"
