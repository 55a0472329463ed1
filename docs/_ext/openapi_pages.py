"""``.. openapi:: PATH``: an OpenAPI 3.0 description rendered as a page of the docs.

Each operation becomes a section (method and path as its title, summary, description,
parameters, request body, responses) grouped by tag, then each schema of
``components.schemas`` a section with its properties; a ``$ref`` is a link to the
schema's section. ``:tag:`` shows only the operations whose first tag it is, ``:schemas:`` the schemas,
``:routes:`` instead a table of every operation with its summary, each linked to its section.

Why this and not sphinxcontrib-openapi or redoc: the first renders through
sphinxcontrib-httpdomain and has not followed Sphinx's recent majors (it is a risk under
Sphinx 9), the second is a JavaScript bundle fetched from a CDN (no offline build, no
internal-link check, no search). The description is one file of plain YAML that
``tests/test_options.py`` already checks against the code; about 200 lines render it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from docutils import nodes
from docutils.parsers.rst import Directive, directives
from docutils.statemachine import StringList
from sphinx.util.nodes import nested_parse_with_titles

METHODS = ("get", "put", "post", "patch", "delete")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _text(markdown: str) -> str:
    """An OpenAPI description (CommonMark) as reStructuredText: `code` becomes ``code``."""
    text = " ".join(markdown.split()) if "\n\n" not in markdown else markdown.strip()
    text = text.replace("\\", "\\\\").replace("*", "\\*").replace("|", "\\|")
    return re.sub(r"(?<!`)`([^`]+)`(?!`)", r"``\1``", text)  # ``already RST`` stays


class Spec:
    """The loaded description and how to name and link its parts."""

    def __init__(self, path: Path, prefix: str) -> None:
        self.doc = yaml.safe_load(path.read_text())
        self.prefix = prefix

    def resolve(self, item: dict[str, Any]) -> dict[str, Any]:
        ref = item.get("$ref")
        if ref is None:
            return item
        node: Any = self.doc
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        return node

    def label(self, kind: str, name: str) -> str:
        return f"{self.prefix}-{kind}-{_slug(name)}"

    def type_of(self, schema: dict[str, Any]) -> str:
        """A one-line type: ``string``, array of :ref:`Job`, one of ``a``, ``b``..."""
        ref = schema.get("$ref")
        if ref is not None:
            name = ref.rsplit("/", 1)[1]
            return f":ref:`{name} <{self.label('schema', name)}>`"
        if "enum" in schema:
            shown = ", ".join(f"``{v}``" for v in schema["enum"])
            kind = f"one of {shown}"
        elif schema.get("type") == "array":
            kind = f"array of {self.type_of(schema.get('items', {}))}"
        elif "allOf" in schema:
            kind = " and ".join(self.type_of(s) for s in schema["allOf"])
        elif "oneOf" in schema or "anyOf" in schema:
            kind = " or ".join(self.type_of(s) for s in schema.get("oneOf", schema.get("anyOf")))
        elif (
            schema.get("type") == "object"
            and "additionalProperties" in schema
            and isinstance(schema["additionalProperties"], dict)
        ):
            kind = f"object of {self.type_of(schema['additionalProperties'])}"
        else:
            kind = f"``{schema.get('type', 'any')}``"
        if schema.get("nullable"):
            kind += " or ``null``"
        return kind

    def properties(self, schema: dict[str, Any], indent: str = "") -> list[str]:
        """A bullet per property: name, type, required, description."""
        schema = self.resolve(schema)
        required = set(schema.get("required", ()))
        lines = []
        for name, prop in schema.get("properties", {}).items():
            mark = " (required)" if name in required else ""
            line = f"{indent}- ``{name}``: {self.type_of(prop)}{mark}"
            if prop.get("description"):
                line += f" — {_text(prop['description'])}"
            if "default" in prop:
                line += f"; default ``{prop['default']!r}``"
            lines.append(line)
        return lines


class OpenAPI(Directive):
    """Render an OpenAPI description (path relative to the page's source file)."""

    required_arguments = 1
    option_spec = {
        "tag": directives.unchanged,
        "schemas": directives.flag,
        "routes": directives.flag,
    }

    def run(self) -> list[nodes.Node]:
        env = self.state.document.settings.env
        source = Path(env.doc2path(env.docname)).parent
        path = (source / self.arguments[0]).resolve()
        env.note_dependency(str(path))
        spec = Spec(path, "openapi")
        lines: list[str] = self.routes(spec) if "routes" in self.options else []
        tag = self.options.get("tag")
        for route, item in spec.doc.get("paths", {}).items():
            shared = item.get("parameters", [])
            for method in METHODS:
                # an operation is shown once, under its first tag
                if "routes" in self.options or method not in item:
                    continue
                if tag is None or item[method].get("tags", [None])[0] == tag:
                    lines += self.operation(spec, route, method, item[method], shared)
        if "schemas" in self.options:
            lines += self.schemas(spec)
        container = nodes.container(classes=["openapi"])
        nested_parse_with_titles(self.state, StringList(lines, source=str(path)), container)
        return container.children

    def routes(self, spec: Spec) -> list[str]:
        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 40 60", ""]
        lines += ["   * - route", "     - what"]
        for route, item in spec.doc.get("paths", {}).items():
            for method in METHODS:
                if method in item:
                    op = item[method]
                    title = f"{method.upper()} {route}"
                    label = spec.label("op", op.get("operationId", title))
                    summary = _text(op.get("summary", ""))
                    lines += [f"   * - :ref:`{title} <{label}>`", f"     - {summary}"]
        return lines + [""]

    def operation(
        self, spec: Spec, route: str, method: str, op: dict[str, Any], shared: list[dict[str, Any]]
    ) -> list[str]:
        title = f"{method.upper()} {route}"
        lines = [
            f".. _{spec.label('op', op.get('operationId', title))}:",
            "",
            title,
            "~" * len(title),
            "",
        ]
        if op.get("summary"):
            lines += [f"**{_text(op['summary'])}**", ""]
        if op.get("description"):
            lines += [_text(op["description"]), ""]
        if op.get("security") == []:
            lines += ["No authentication.", ""]
        params = [spec.resolve(p) for p in shared + op.get("parameters", [])]
        if params:
            lines += ["Parameters:", ""]
            for p in params:
                need = ", required" if p.get("required") else ""
                line = f"- ``{p['name']}`` ({p['in']}{need}): {spec.type_of(p.get('schema', {}))}"
                if p.get("description"):
                    line += f" — {_text(p['description'])}"
                lines.append(line)
            lines.append("")
        body = op.get("requestBody")
        if body:
            body = spec.resolve(body)
            for media, content in body.get("content", {}).items():
                schema = content.get("schema", {})
                need = "required" if body.get("required") else "optional"
                lines += [f"Request body ({need}, ``{media}``): {spec.type_of(schema)}", ""]
                if "$ref" not in schema:
                    lines += spec.properties(schema) + [""]
        lines += ["Responses:", ""]
        for code, answer in op.get("responses", {}).items():
            answer = spec.resolve(answer)
            line = f"- **{code}** {_text(answer.get('description', ''))}"
            schemas = [c.get("schema", {}) for c in answer.get("content", {}).values()]
            if schemas and schemas[0]:
                line += f": {spec.type_of(schemas[0])}"
            lines.append(line)
        return lines + [""]

    def schemas(self, spec: Spec) -> list[str]:
        lines: list[str] = []
        for name, schema in spec.doc.get("components", {}).get("schemas", {}).items():
            lines += [f".. _{spec.label('schema', name)}:", "", name, "~" * len(name), ""]
            if schema.get("description"):
                lines += [_text(schema["description"]), ""]
            for part in schema.get("allOf", ()):
                if "$ref" in part:
                    lines += [f"Everything of {spec.type_of(part)}, and:", ""]
                else:
                    lines += spec.properties(part) + [""]
            if "properties" in schema:
                lines += spec.properties(schema) + [""]
            elif "allOf" in schema:
                pass
            else:
                lines += [
                    f"A {spec.type_of({k: v for k, v in schema.items() if k != 'description'})}.",
                    "",
                ]
        return lines


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("openapi", OpenAPI)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
