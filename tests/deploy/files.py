"""Readers for the deployment files: a small Dockerfile parser, compose.yaml, .dockerignore.

The Dockerfile parser covers what the image uses: comments, line continuations, exec (JSON)
and shell forms, ``ARG`` defaults substituted into ``FROM``, ``ENV key=value`` pairs (quoted or
not) and stages. It is deliberately strict: an instruction it does not understand is an error,
so a check can never pass because the parser skipped a line.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
COMPOSE = REPO_ROOT / "compose.yaml"
ENV_EXAMPLE = REPO_ROOT / ".env.example"
CONFIG_EXAMPLE = REPO_ROOT / "config.example.yaml"
PROXY_SERVICE = "compaction-proxy"

KNOWN = {
    "FROM", "ARG", "ENV", "LABEL", "WORKDIR", "COPY", "ADD", "RUN", "USER", "EXPOSE", "VOLUME",
    "HEALTHCHECK", "STOPSIGNAL", "ENTRYPOINT", "CMD", "SHELL", "ONBUILD",
}  # fmt: skip
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int  # 1-based line of the instruction's first line

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction, else None (shell form)."""
        text = self.args.strip()
        if not text.startswith("["):
            return None
        value = json.loads(text)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"line {self.line}: exec form must be a JSON array of strings")
        return value

    def flags_and_rest(self) -> tuple[dict[str, str], str]:
        """Leading ``--flag=value`` options (COPY --from, HEALTHCHECK --timeout) and the rest."""
        flags: dict[str, str] = {}
        rest = self.args.strip()
        while rest.startswith("--"):
            token, _, rest = rest.partition(" ")
            name, _, value = token[2:].partition("=")
            flags[name] = value
            rest = rest.lstrip()
        return flags, rest


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        """Every ENV of the stage, in order (later wins), ``${VAR}`` expanded from earlier ones."""
        values: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for key, value in parse_env_args(instruction.args).items():
                values[key] = expand(value, values)
        return values

    def env_before(self, line: int) -> dict[str, str]:
        values: dict[str, str] = {}
        for instruction in self.all("ENV"):
            if instruction.line < line:
                for key, value in parse_env_args(instruction.args).items():
                    values[key] = expand(value, values)
        return values


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction text) with continuations joined and comments dropped."""
    result: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue  # comments, also inside a continued instruction (Docker drops them)
        if not current:
            start = number
        if stripped.endswith("\\"):
            current.append(stripped[:-1].strip())
            continue
        current.append(stripped)
        result.append((start, " ".join(part for part in current if part)))
        current = []
    if current:
        raise ValueError(f"line {start}: the file ends inside a continued instruction")
    return result


def expand(text: str, values: dict[str, str]) -> str:
    return _VAR.sub(lambda m: values.get(m.group(1) or m.group(2), ""), text)


def parse_env_args(args: str) -> dict[str, str]:
    tokens = shlex.split(args, posix=True)
    if tokens and "=" not in tokens[0]:  # legacy `ENV KEY value`
        return {tokens[0]: " ".join(tokens[1:])}
    pairs: dict[str, str] = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if not sep:
            raise ValueError(f"ENV {args!r}: {token!r} is not KEY=value")
        pairs[key] = value
    return pairs


def parse_dockerfile(text: str) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line, instruction_text in logical_lines(text):
        keyword, _, args = instruction_text.partition(" ")
        keyword = keyword.upper()
        if keyword not in KNOWN:
            raise ValueError(f"line {line}: unknown instruction {keyword!r}")
        instruction = Instruction(keyword, args.strip(), line)
        if keyword == "FROM":
            parts = expand(instruction.args, global_args).split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            if len(parts) not in (1, 3):
                raise ValueError(f"line {line}: cannot read FROM {instruction.args!r}")
            stages.append(Stage(image=parts[0], name=name))
            continue
        if not stages:
            if keyword != "ARG":
                raise ValueError(f"line {line}: only ARG may come before the first FROM")
            key, _, default = instruction.args.partition("=")
            global_args[key.strip()] = default.strip().strip('"')
            continue
        stages[-1].instructions.append(instruction)
    return Dockerfile(global_args, stages)


def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict), "compose.yaml must be a mapping"
    return data


def env_mapping(environment: Any) -> dict[str, str | None]:
    """A compose `environment` in either syntax (mapping or list of KEY=value) as a dict."""
    if environment is None:
        return {}
    if isinstance(environment, dict):
        return {str(k): None if v is None else str(v) for k, v in environment.items()}
    result: dict[str, str | None] = {}
    for item in environment:
        key, sep, value = str(item).partition("=")
        result[key] = value if sep else None
    return result


def healthcheck_python(test: list[str]) -> str:
    """The code of a ``python -c CODE`` healthcheck command (exec form, CMD prefix allowed)."""
    argv = test[1:] if test and test[0] in ("CMD",) else list(test)
    assert argv[:2] == ["python", "-c"] and len(argv) == 3, (
        f"healthcheck should be exec form `python -c CODE` (the slim image has no curl): {test}"
    )
    return argv[2]
