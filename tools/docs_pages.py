"""The docs' generated parts, rendered from the code that defines them (one source, nothing copied).

    python -m tools.docs_pages settings       # the settings page's tables, as Markdown
    python -m tools.docs_pages datatypes      # the route reference's DataType table

`tools/mkdocs_hooks.py` puts them into the pages at build time, where a page has the marker
`<!-- generated: NAME -->`:

- `settings`: every field of `api.config.settings.Settings` as its environment variable, with
  its default and its `description` (nested models as `PARENT__FIELD`, per-route settings as
  `MODELS__<ROUTE>__FIELD` from `ModelSettings`), the example routes' own options, the API's HTTP
  server limits (the `Attributes:` of `api.http_server.limits.ConnectionLimits`) and
  run-server.sh's variables (the "Environment" block of its header);
- `datatypes`: each `DataType` member the API sends and what a request's JSON value must be
  for it (`api.model_routes.scaffold.JSON_TYPES`).
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Iterator
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from api.config.settings import ModelSettings, Settings
from api.http_server.limits import ConnectionLimits
from api.model_routes.scaffold import JSON_TYPES
from tools.processes import REPO


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None or value == [] or value == {}:
        return "unset"
    if isinstance(value, bool):
        value = str(value).lower()
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _rows(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str, str]]:
    """(variable, default, description) for each field of `model`, nested models expanded."""
    for name, field in model.model_fields.items():
        variable = prefix + name.upper()
        annotation = field.annotation
        if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
            yield from _rows(annotation, variable + "__")
            continue
        if get_origin(annotation) is dict:
            value = get_args(annotation)[1]
            if inspect.isclass(value) and issubclass(value, BaseModel):
                continue  # a map of models (MODELS): its own table
        yield variable, _default(field), field.description or ""


def _table(rows: Iterator[tuple[str, str, str]]) -> str:
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{variable}` | {_cell(default)} | {_cell(text)} |" for variable, default, text in rows]
    return "\n".join(lines)


def _attributes(docstring: str) -> Iterator[tuple[str, str]]:
    """(name, text) of each entry of a Google-style `Attributes:` section."""
    section = docstring.split("Attributes:", 1)[1]
    for match in re.finditer(r"^ {4}(\w+): (.*?)(?=^ {4}\w+: |\Z)", section, re.S | re.M):
        yield match[1], " ".join(match[2].split())


def _example_options() -> Iterator[tuple[str, str, str]]:
    from examples.digits.route import route as digits
    from examples.fraud.route import route as fraud

    for route in (fraud, digits):
        yield from _rows(route.options, f"MODELS__{route.name.upper()}__")


def run_server_environment() -> str:
    """The "Environment" block of run-server.sh's header, without the comment marks."""
    text = (REPO / "run-server.sh").read_text()
    block = text.split("# Environment (defaults in brackets):\n", 1)[1].split("\nset -euo pipefail", 1)[0]
    return "\n".join(line.removeprefix("#").removeprefix(" ") for line in block.splitlines())


def settings_markdown() -> str:
    """The settings page's generated part."""
    limits = inspect.getdoc(ConnectionLimits) or ""
    server = "\n".join(f"- `{name}`: {text}" for name, text in _attributes(limits))
    return "\n\n".join(
        [
            "## The API\n\nRead from the environment by `api.config.settings.Settings` (pydantic-settings; "
            "names are case-insensitive).\n\n" + _table(_rows(Settings, "")),
            "## Each model route: `MODELS__<ROUTE>__<SETTING>`\n\nEvery route takes these "
            "(`ModelSettings`), with `<ROUTE>` its name in upper case, plus its own options.\n\n"
            + _table(_rows(ModelSettings, "MODELS__<ROUTE>__")),
            "### The example routes' own options\n\n" + _table(_example_options()),
            "## The API's HTTP server (`gunicorn.conf.py`)\n\nEach worker's connection limits "
            "(`api.http_server.limits.ConnectionLimits`), from gunicorn's own settings (set them in "
            "`gunicorn.conf.py` or on gunicorn's command line) or the variables named:\n\n" + server,
            "## run-server.sh (one container, `make run`)\n\nFrom the script's header:\n\n```text\n"
            + run_server_environment()
            + "\n```",
        ]
    )


def datatypes_markdown() -> str:
    """The route reference's table of the dtypes a route may declare."""
    lines = ["| `DataType` | a request's JSON value (one element) | range |", "|---|---|---|"]
    for dtype, kind in JSON_TYPES.items():
        span = (
            ""
            if kind.low is None
            else f"{kind.low:g} .. {kind.high:g}"
            if kind.annotation == "float"
            else (f"{kind.low} .. {kind.high}")
        )
        lines.append(f"| `{dtype.name}` | {_cell(kind.json)} (`{kind.annotation}`) | {span} |")
    return "\n".join(lines)


GENERATED = {"settings": settings_markdown, "datatypes": datatypes_markdown}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in GENERATED:
        print(f"usage: python -m tools.docs_pages {{{','.join(GENERATED)}}}", file=sys.stderr)
        return 2
    print(GENERATED[argv[0]]())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
