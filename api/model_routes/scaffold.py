"""Write a model route for a SavedModel from its signature: `python -m api.model_routes.scaffold`.

    python -m api.model_routes.scaffold --saved-model my-model/models/iris --name iris

reads `saved_model.pb` of the newest version under the base path (or of the version folder
given) with the API's own protos (`api.protos`: SavedModel, MetaGraphDef, SignatureDef; no
TensorFlow), picks the MetaGraph tagged `serve` and its `serving_default` SignatureDef (what
TF Serving serves; `--tag`, `--signature` for others) and writes:

- `<routes dir>/<name>_route.py`: a `ModelRoute` on `POST /v1/<name>/predict` whose request
  body has one field per input, whose answer has one field per output plus `model`, with
  every `TensorSpec` filled in from the signature and preprocess / postprocess that pass
  the tensors through. The request schema is strict (`JSON_TYPES` says what each dtype
  takes): a model whose inputs are its raw features is served with no line written; edit
  the module to take your own request format.
- the model's entry in a serving model config (TF Serving's `ModelServerConfig` text
  format), created or appended to, with `base_path: "/models/<base path's folder name>"`:
  `/models/` is `MODELS_DIR` (run-server.sh rewrites it; compose and Kubernetes mount it).

Defaults follow the layout the docs use (`docs/own-model.md`): models in `<project>/models/`,
the config `<project>/models.config`, routes in `<project>/routes/`, where `<project>` is the
folder above the models folder. It then prints the `make run` line that serves the route.

Exit status 0, or 2 with one line saying what to fix: no SavedModel there, no such tag set or
signature, a tensor whose shape has an unknown size beyond the batch dimension or whose dtype
the API cannot send, a route or config entry that already exists (`--force` overwrites the
module).
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from google.protobuf.message import DecodeError

from api.model_routes._declaration import _NAME
from api.protos.tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
from api.protos.tensorflow_serving.config import model_server_config_pb2
from api.serving_client import DataType

#: The MetaGraph tag and SignatureDef key TF Serving serves by default.
SERVE_TAG = "serve"
DEFAULT_SIGNATURE = "serving_default"


@dataclass(frozen=True, slots=True)
class JsonType:
    """What a request's JSON value must be for one element of a tensor of some dtype.

    Attributes:
        annotation: the pydantic type of one element in the generated schema.
        json: what the JSON value is, in words (the route reference's table).
        low / high: the element's range, when the dtype bounds it (checked: 422 outside).
    """

    annotation: str
    json: str
    low: float | int | None = None
    high: float | int | None = None


_FLOAT32_MAX = 3.4028234663852886e38
#: For each dtype the API sends: what one element of a request takes (strict: no strings for
#: numbers, no numbers for booleans). One source for the scaffold and the route reference.
JSON_TYPES: Mapping[DataType, JsonType] = {
    DataType.DT_FLOAT: JsonType("float", "a JSON number (an integer too), finite, within float32's range; "
                                "rounded to float32", -_FLOAT32_MAX, _FLOAT32_MAX),
    DataType.DT_DOUBLE: JsonType("float", "a JSON number (an integer too), finite"),
    DataType.DT_INT8: JsonType("int", "an integer", -(2**7), 2**7 - 1),
    DataType.DT_INT16: JsonType("int", "an integer", -(2**15), 2**15 - 1),
    DataType.DT_INT32: JsonType("int", "an integer", -(2**31), 2**31 - 1),
    DataType.DT_INT64: JsonType("int", "an integer", -(2**63), 2**63 - 1),
    DataType.DT_UINT8: JsonType("int", "an integer", 0, 2**8 - 1),
    DataType.DT_UINT16: JsonType("int", "an integer", 0, 2**16 - 1),
    DataType.DT_UINT32: JsonType("int", "an integer", 0, 2**32 - 1),
    DataType.DT_UINT64: JsonType("int", "an integer", 0, 2**64 - 1),
    DataType.DT_BOOL: JsonType("bool", "true or false"),
    DataType.DT_STRING: JsonType("str", "a JSON string, sent as its UTF-8 bytes"),
}  # fmt: skip


class ScaffoldError(ValueError):
    """The SavedModel cannot be scaffolded as asked; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class Tensor:
    """One input or output of the signature: its alias, dtype and per-example shape."""

    alias: str
    dtype: DataType
    shape: tuple[int, ...]

    @property
    def field(self) -> str:
        """A Python identifier for the schema field (the alias itself when it is one)."""
        name = re.sub(r"\W", "_", self.alias)
        if not name or name[0].isdigit() or keyword.iskeyword(name) or name == "model":
            name = f"t_{name}"
        return name


def find_version(saved_model: Path) -> Path:
    """The version folder to read: `saved_model` itself when it holds `saved_model.pb`, else its
    highest numeric subfolder that does (TF Serving's base path layout).

    Raises:
        ScaffoldError: neither.
    """
    if (saved_model / "saved_model.pb").is_file():
        return saved_model
    versions = sorted(
        (int(p.name), p) for p in saved_model.glob("*") if p.name.isdigit() and (p / "saved_model.pb").is_file()
    )
    if not versions:
        raise ScaffoldError(
            f"{saved_model}: no saved_model.pb there nor in a numeric version folder under it; TF Serving "
            "reads <base_path>/<version>/saved_model.pb (e.g. models/iris/1/saved_model.pb)"
        )
    return versions[-1][1]


def read_signature(
    version_dir: Path, tag: str = SERVE_TAG, signature: str = DEFAULT_SIGNATURE
) -> meta_graph_pb2.SignatureDef:
    """The SignatureDef `signature` of the MetaGraph tagged `tag` in `version_dir/saved_model.pb`.

    Raises:
        ScaffoldError: the file does not parse as a SavedModel, or has no such tag or signature.
    """
    saved = saved_model_pb2.SavedModel()
    try:
        saved.ParseFromString((version_dir / "saved_model.pb").read_bytes())
    except (OSError, DecodeError) as exc:
        raise ScaffoldError(f"{version_dir / 'saved_model.pb'}: not a SavedModel ({exc})") from exc
    graphs = [g for g in saved.meta_graphs if tag in g.meta_info_def.tags]
    if not graphs:
        tags = sorted({t for g in saved.meta_graphs for t in g.meta_info_def.tags})
        raise ScaffoldError(f"{version_dir}: no MetaGraph tagged {tag!r} (its tags: {', '.join(tags) or 'none'})")
    signatures = graphs[0].signature_def
    if signature not in signatures:
        known = ", ".join(sorted(signatures)) or "none"
        raise ScaffoldError(f"{version_dir}: no signature {signature!r} (it has: {known}); pass --signature")
    return signatures[signature]


def tensors(kind: str, infos: Mapping[str, meta_graph_pb2.TensorInfo]) -> list[Tensor]:
    """Each input or output as one example's `Tensor`, the batch dimension left out.

    Raises:
        ScaffoldError: an unknown rank, an unknown size beyond the batch dimension, or a dtype
            the API does not send (`JSON_TYPES`).
    """
    found = []
    for alias in sorted(infos):
        info = infos[alias]
        try:
            dtype = DataType(info.dtype)
        except ValueError:
            dtype = None
        if dtype is None or dtype not in JSON_TYPES:
            raise ScaffoldError(
                f"{kind} {alias!r} has dtype {info.dtype}, which the API does not send (it sends: "
                f"{', '.join(d.name for d in JSON_TYPES)}); cast it in the model's signature"
            )
        shape = info.tensor_shape
        dims = [d.size for d in shape.dim]
        if shape.unknown_rank or not dims:
            raise ScaffoldError(
                f"{kind} {alias!r} has {'an unknown rank' if shape.unknown_rank else 'no batch dimension'}; "
                "declare its TensorSpec by hand (docs/model-routes.md)"
            )
        if any(size < 0 for size in dims[1:]):
            raise ScaffoldError(
                f"{kind} {alias!r} has shape {dims}: a size beyond the batch dimension is unknown (-1), so one "
                "example's shape cannot be declared; export the signature with fixed sizes, or declare it by hand"
            )
        found.append(Tensor(alias, dtype, tuple(dims[1:])))
    return found


#: The generated module's name for one element of each dtype that has a range.
_ALIASES: Mapping[DataType, str] = {d: d.name.removeprefix("DT_").title().replace("Uint", "UInt") for d in JSON_TYPES}


def _element(dtype: DataType) -> str:
    kind = JSON_TYPES[dtype]
    return kind.annotation if kind.low is None else _ALIASES[dtype]


def _alias_line(dtype: DataType) -> str:
    kind = JSON_TYPES[dtype]
    assert kind.low is not None and kind.high is not None
    low, high = (repr(float(v)) if kind.annotation == "float" else str(v) for v in (kind.low, kind.high))
    return f"{_ALIASES[dtype]} = Annotated[{kind.annotation}, Field(ge={low}, le={high})]  # one {dtype.name} value"


def _nested(element: str, shape: Sequence[int], name: str, aliases: list[str]) -> str:
    """The annotation of a value of `shape`; each level below the outermost becomes an alias
    line appended to `aliases` (`Image1`, `Image2`, ...), so no line nests more than once."""
    annotation = element
    for depth, size in enumerate(reversed(shape)):
        level = f"Annotated[list[{annotation}], Field(min_length={size}, max_length={size})]"
        if depth == len(shape) - 1:
            return level
        alias = f"{name}{depth + 1}"
        aliases.append(f"{alias} = {level}")
        annotation = alias
    return annotation


def _type_name(field: str) -> str:
    return "".join(part.title() for part in field.split("_") if part) or "T"


def _q(text: str) -> str:
    """A Python string literal in double quotes."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _spec(tensor: Tensor) -> str:
    sizes = ", ".join(map(str, tensor.shape))
    shape = f"({sizes},)" if len(tensor.shape) == 1 else f"({sizes})"
    return f"TensorSpec(DataType.{tensor.dtype.name}, {shape})"


def _shape_text(tensor: Tensor) -> str:
    return "[" + ", ".join(["batch", *map(str, tensor.shape)]) + "]"


def route_module(name: str, model_dir: str, signature: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> str:
    """The text of the route module for `name` (see the module doc)."""
    title = name.replace("_", " ").title().replace(" ", "")
    strings = [t for t in inputs if t.dtype is DataType.DT_STRING]
    lines = [
        f'"""The {name} model as a route: `POST /v1/{name}/predict`, its signature\'s tensors in and out.',
        "",
        f"Written by `python -m api.model_routes.scaffold` from {model_dir}, signature {signature}:",
    ]
    for kind, group in (("input", inputs), ("output", outputs)):
        for t in group:
            lines.append(f"    {kind:<6} {t.alias:<20} {t.dtype.name:<10} {_shape_text(t)}")
    lines += [
        "",
        "Strict request types: each value is what its dtype takes (a JSON number, an integer, true or",
        "false, a string; docs/model-routes.md), of its shape, no other field. Edit the schemas,",
        "preprocess and postprocess to take and give your own formats.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Annotated, Any" if strings else "from typing import Annotated",
        "",
        "from pydantic import BaseModel, ConfigDict, Field",
        "",
        "from api.model_routes import "
        "DataType, JsonBody, ModelInfo, ModelRoute, NoOptions, Prediction, Signature, TensorSpec",
        "",
    ]
    ranged = sorted({t.dtype for t in inputs if JSON_TYPES[t.dtype].low is not None})
    lines += [_alias_line(dtype) for dtype in ranged]
    aliases_at = len(lines)
    shape_aliases: list[str] = []
    lines += [
        "",
        "",
        f"class {title}Request(BaseModel):",
        '    """One example: each input of the signature, one example\'s value of its shape."""',
        "",
        '    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, protected_namespaces=())',
        "",
    ]
    for t in inputs:
        alias = "" if t.field == t.alias else f" = Field(alias={_q(t.alias)})"
        annotation = _nested(_element(t.dtype), t.shape, _type_name(t.field), shape_aliases)
        lines.append(f"    {t.field}: {annotation}{alias}  # {t.dtype.name} {_shape_text(t)}")
    lines += [
        "",
        "",
        f"class {title}Response(BaseModel):",
        '    """Each output of the signature for the example, and the model version that answered."""',
        "",
        "    model_config = ConfigDict(protected_namespaces=())",
        "",
    ]
    for t in outputs:
        element = {"str": "bytes"}.get(JSON_TYPES[t.dtype].annotation, JSON_TYPES[t.dtype].annotation)
        alias = "" if t.field == t.alias else f" = Field(alias={_q(t.alias)})"
        annotation = _nested(element, t.shape, _type_name(t.field) + "Out", shape_aliases)
        lines.append(f"    {t.field}: {annotation}{alias}  # {t.dtype.name} {_shape_text(t)}")
    lines += ["    model: ModelInfo", "", ""]
    lines[aliases_at:aliases_at] = shape_aliases
    if strings:
        lines += [
            "def _utf8(value: Any) -> Any:",
            '    """A string tensor\'s values as the bytes serving takes, at any nesting."""',
            "    return value.encode() if isinstance(value, str) else [_utf8(v) for v in value]",
            "",
            "",
        ]
    lines += [
        f"def preprocess(request: {title}Request, options: NoOptions) -> dict[str, object]:",
        '    """The request\'s values are the inputs: passed through."""',
        "    return {",
    ]
    for t in inputs:
        value = f"request.{t.field}"
        lines.append(f"        {_q(t.alias)}: {f'_utf8({value})' if t.dtype is DataType.DT_STRING else value},")
    lines += [
        "    }",
        "",
        "",
        f"def postprocess(request: {title}Request, prediction: Prediction, options: NoOptions) -> {title}Response:",
        '    """The outputs are the answer: passed through."""',
        f"    return {title}Response.model_validate(",
        "        {",
    ]
    for t in outputs:
        lines.append(f"            {_q(t.alias)}: prediction.outputs[{_q(t.alias)}],")
    lines += [
        '            "model": prediction.model,',
        "        }",
        "    )",
        "",
        "",
        f"route: ModelRoute[{title}Request, {title}Response, NoOptions] = ModelRoute(",
        f"    name={_q(name)},",
        f'    path="/v1/{name}/predict",',
        f'    summary="Predict with the {name} model.",',
        f"    request=JsonBody({title}Request),",
        f"    response={title}Response,",
        "    signature=Signature(",
        f"        model_name={_q(name)},",
        "        inputs={",
    ]
    lines += [f"            {_q(t.alias)}: {_spec(t)}," for t in inputs]
    lines += ["        },", "        outputs={"]
    lines += [f"            {_q(t.alias)}: {_spec(t)}," for t in outputs]
    lines += ["        },"]
    if signature != DEFAULT_SIGNATURE:
        lines.append(f"        signature_name={_q(signature)},")
    lines += [
        "    ),",
        "    preprocess=preprocess,",
        "    postprocess=postprocess,",
        ")",
        "",
    ]
    return "\n".join(lines)


def add_model_config(config_path: Path, name: str, base_path: str) -> str:
    """Append `name`'s entry to the model config at `config_path` (made when missing); the entry's text.

    Raises:
        ScaffoldError: the file does not parse, or already names `name`.
    """
    entry = f'  config {{\n    name: "{name}"\n    base_path: "{base_path}"\n    model_platform: "tensorflow"\n  }}\n'
    text = config_path.read_text() if config_path.exists() else ""
    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ScaffoldError(f"{config_path}: not a ModelServerConfig ({exc})") from exc
    if any(model.name == name for model in config.model_config_list.config):
        raise ScaffoldError(f"{config_path} already has a model named {name!r}; pick another --name or edit the file")
    if not config.model_config_list.config:
        header = (
            "# TF Serving's model config (ModelServerConfig, text format). /models/ is MODELS_DIR: run-server.sh\n"
            "# rewrites it, compose and Kubernetes mount the models folder there.\n"
        )
        config_path.parent.mkdir(parents=True, exist_ok=True)
        config_path.write_text(header + "model_config_list {\n" + entry + "}\n")
        return entry
    closing = text.rstrip().rfind("}")
    config_path.write_text(text[:closing].rstrip() + "\n" + entry + text[closing:])
    text_format.Parse(config_path.read_text(), model_server_config_pb2.ModelServerConfig())  # still parses
    return entry


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m api.model_routes.scaffold", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--saved-model", type=Path, required=True, help="the model's base path (or one version folder)")
    parser.add_argument("--name", required=True, help="the route's and the served model's name: lower-case, digits, _")
    parser.add_argument("--routes-dir", type=Path, help="where the route module goes (default: <project>/routes)")
    parser.add_argument(
        "--model-config", type=Path, help="the model config to add to (default: <project>/models.config)"
    )
    parser.add_argument("--signature", default=DEFAULT_SIGNATURE, help="SignatureDef key (default: serving_default)")
    parser.add_argument("--tag", default=SERVE_TAG, help="MetaGraph tag set (default: serve)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing route module")
    args = parser.parse_args(argv)
    try:
        if not _NAME.fullmatch(args.name):
            raise ScaffoldError(f"--name {args.name!r}: lower-case letters, digits and '_', starting with a letter")
        version_dir = find_version(args.saved_model)
        base = version_dir.parent if version_dir.name.isdigit() else None
        if base is None:
            raise ScaffoldError(
                f"{version_dir}: TF Serving needs it in a numeric version folder; move it to {version_dir}/1"
            )
        signature = read_signature(version_dir, args.tag, args.signature)
        inputs, outputs = tensors("input", signature.inputs), tensors("output", signature.outputs)
        if not inputs or not outputs:
            missing = "inputs" if not inputs else "outputs"
            raise ScaffoldError(f"{version_dir}: signature {args.signature!r} has no {missing}")
        project = base.parent.parent
        routes_dir: Path = args.routes_dir or project / "routes"
        config: Path = args.model_config or project / "models.config"
        module = routes_dir / f"{args.name}_route.py"
        if module.exists() and not args.force:
            raise ScaffoldError(f"{module} exists; pass --force to overwrite it")
        text = route_module(args.name, str(base), args.signature, inputs, outputs)
        entry = add_model_config(config, args.name, f"/models/{base.name}")
    except ScaffoldError as exc:
        print(f"scaffold: {exc}", file=sys.stderr)
        return 2
    routes_dir.mkdir(parents=True, exist_ok=True)
    module.write_text(text)
    print(f"wrote {module}: POST /v1/{args.name}/predict, {len(inputs)} input(s), {len(outputs)} output(s)")
    print(f"added to {config}:\n{entry.rstrip()}")
    print("serve it (both tiers, http://127.0.0.1:9000/docs shows the schema):")
    print(
        f"  MODELS_DIR={base.parent} MODEL_CONFIG_FILE={config} PYTHONPATH={routes_dir} "
        f"MODEL_ROUTES={args.name}_route:route make run"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
