"""The configuration file of ``fstream`` (issue 30, "Configuration file"): where it is, what it may say, precedence.

A TOML section per command plus ``[redis]`` and ``[metrics]``; ``FSTREAM_<SECTION>_<KEY>`` overrides the file, the
command line both (docs/config.md). Every section, key, type and check is read off the argparse parser; each
section is a pydantic model made from it. With no file and no such variable, ``apply`` returns before any import.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any, Callable, Mapping, Sequence

from transfer_agent.errors import FStreamError

DEFAULT_PATH = "/etc/fstream/fstream.toml"
ENV_CONFIG = "FSTREAM_CONFIG"
ENV_PREFIX = "FSTREAM_"
REDIS, METRICS = "redis", "metrics"
# [redis] key -> the option it sets in every command; password-file: never a password in an argument (issue 40)
REDIS_KEYS = {"url": "redis", "namespace": "namespace", "password-file": "redis-password-file"}
METRICS_PREFIX = "metrics-"  # [metrics] key -> --metrics-<key>
OLD_REDIS_ENV = "FSTREAM_REDIS_URL"  # read by the commands themselves since before the file existed
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}
_CHECKS = {"DURATION": ("parse_duration", "a duration such as 40ms, 20s or 2m"),
           "SIZE": ("parse_size", "a size such as 64KiB or 1MiB"),
           "RATE": ("parse_rate", "a rate such as 800Mbps, 1Gbit or 100MB/s")}


class ConfigError(FStreamError):
    """Every problem of a configuration; ``problems``: one line each (file or variable, key, value, reason)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        head = self.problems[0] if len(self.problems) == 1 else \
            f"{len(self.problems)} problems in the configuration:\n  " + "\n  ".join(self.problems)
        super().__init__(head)


# -- the global option, cheap (no parser yet) -------------------------------------------------------
def global_options(argv: Sequence[str]) -> tuple[str | None, int | None]:
    """``(--config FILE or None, index of the command)`` from the options before the command name."""
    path, i = None, 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if len(name) > 2 and "--config".startswith(name):  # argparse accepts an unambiguous prefix
            path, i = (value, i + 1) if eq else ((argv[i + 1] if i + 1 < len(argv) else None), i + 2)
            continue
        if arg == "--":
            return path, (i + 1 if i + 1 < len(argv) else None)
        if not arg.startswith("-"):
            return path, i
        i += 1
    return path, None


def locate(explicit: str | None) -> str | None:
    """The file to read: ``--config``, else ``$FSTREAM_CONFIG`` (both must exist), else the default if it exists."""
    named = explicit if explicit is not None else os.environ.get(ENV_CONFIG) or None
    return named if named is not None else DEFAULT_PATH if os.path.exists(DEFAULT_PATH) else None


def env_name(section: str, key: str = "") -> str:
    """``FSTREAM_<SECTION>_<KEY>``: upper case, ``-`` -> ``_``."""
    return ENV_PREFIX + "_".join(p.upper().replace("-", "_") for p in (section, key) if p)


def env_section(name: str, sections: Sequence[str]) -> str | None:
    """The section a ``FSTREAM_*`` variable belongs to: the longest section whose prefix it has."""
    return max((s for s in sections if name.startswith(env_name(s) + "_")), key=len, default=None)


def relevant_env(command: str, sections: Sequence[str], environ: Mapping[str, str],
                 new_only: bool = False) -> dict[str, str]:
    """The variables that may configure ``command``: its section's, ``[redis]``'s and ``[metrics]``'s.
    ``new_only``: without ``FSTREAM_REDIS_URL``, which alone needs no configuration (the commands read it
    themselves, as before the file existed)."""
    ours = {command, REDIS, METRICS}
    names = [*sections, REDIS, METRICS]
    return {n: v for n, v in environ.items() if n.startswith(ENV_PREFIX) and env_section(n, names) in ours
            and not (new_only and n == OLD_REDIS_ENV)}


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The command parsers of ``fstream`` (name -> parser)."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return dict(sub.choices) if sub is not None else {}


# -- options read off a parser ----------------------------------------------------------------------
class Option:
    """One long option of a command and the places (parser, action) it lives in (nested subcommands too).

    :param key: the key in the file: the first long option name without ``--``.
    :param action: the argparse action that types and checks its value.
    """

    def __init__(self, key: str, action: argparse.Action) -> None:
        self.key, self.action = key, action
        self.places: list[tuple[argparse.ArgumentParser, argparse.Action]] = []  # where to give the default

    @property
    def kind(self) -> str:
        a = self.action
        if isinstance(a, argparse._CountAction):
            return "count"
        if isinstance(a, argparse._AppendAction) or a.nargs in ("+", "*") or isinstance(a.nargs, int) and a.nargs > 1:
            return "list"
        return "flag" if a.nargs == 0 else "value"

    def expects(self) -> str:
        """What a value must be, in words (for "not ..." reasons)."""
        a = self.action
        if self.kind == "flag":
            return "true or false"
        if self.kind == "count":
            return "a count (0, 1, 2, ...)"
        if a.choices is not None:
            return "one of " + ", ".join(str(c) for c in a.choices)
        if a.type is int:
            return "an integer"
        if a.type is float:
            return "a number"
        check = _CHECKS.get(a.metavar) if isinstance(a.metavar, str) else None
        return check[1] if check else "a string"

    def convert(self, raw: Any) -> Any:
        """The value for the argparse namespace from a TOML value (or a pre-parsed variable); ``ValueError(reason)``."""
        kind = self.kind
        if kind == "list":
            return [self._scalar(item) for item in (raw if isinstance(raw, list) else [raw])]
        if kind == "value":
            return self._scalar(raw)
        bad_count = isinstance(raw, bool) or not isinstance(raw, int) or raw < 0
        if (kind == "flag" and not isinstance(raw, bool)) or (kind == "count" and bad_count):
            raise ValueError(f"not {self.expects()}")
        return raw

    def _scalar(self, raw: Any) -> Any:
        a = self.action
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            raise ValueError(f"not {self.expects()}" + (" (a table or list where one value belongs)"
                                                        if isinstance(raw, (dict, list)) else ""))
        check = _CHECKS.get(a.metavar) if isinstance(a.metavar, str) else None
        if not isinstance(raw, str) and a.type in (None, str) and not check:  # `listen = 9000`: a typo'd string
            raise ValueError(f"not {self.expects()}")
        text = raw if isinstance(raw, str) else str(raw)
        if a.type is None:
            value: Any = text
        elif a.type in (int, float):
            try:
                value = a.type(text)
            except ValueError:
                raise ValueError(f"not {self.expects()}") from None
        else:
            try:
                value = a.type(text)
            except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
                raise ValueError(str(exc) or f"not {self.expects()}") from None
        if a.choices is not None and value not in a.choices:
            raise ValueError(f"not {self.expects()}")
        if check:
            from fstream_provider.model import units

            try:
                getattr(units, check[0])(text)
            except ValueError:
                raise ValueError(f"not {check[1]}") from None
        return value

    def from_env(self, text: str) -> Any:
        """A variable's text as the TOML value it stands for (lists comma-separated, flags true/false/1/0)."""
        kind = self.kind
        if kind == "flag":
            low = text.strip().lower()
            return True if low in _TRUE else False if low in _FALSE else text
        if kind == "count":
            return int(text) if text.strip().isdigit() else text
        if kind == "list":
            return [part.strip() for part in text.split(",") if part.strip()]
        return text

    def dest_value(self, value: Any) -> Any:
        """What argparse would have stored had the option been given: a flag set stores its ``const``."""
        if self.kind == "flag":
            return self.action.const if value else self.action.default
        return list(value) if self.kind == "list" else value

    def display(self, raw: Any, value: Any) -> Any:
        """How a value reads back: numbers and flags typed (``"12"`` from a variable is ``12``), others as given."""
        typed = self.kind in ("flag", "count") or self.action.type in (int, float)
        if self.kind == "list" and not isinstance(raw, list):
            raw = [raw]
        return value if typed else raw

    def default_shown(self) -> Any:
        return False if self.kind == "flag" else self.action.default


def options_of(parser: argparse.ArgumentParser) -> dict[str, Option]:
    """Every long option of a command, its nested subcommands' included (keyed by the first long name)."""
    out: dict[str, Option] = {}
    todo = [parser]
    while todo:
        p = todo.pop(0)
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo.extend(dict.fromkeys(a.choices.values()))
                continue
            if isinstance(a, (argparse._HelpAction, argparse._VersionAction)) or a.dest == argparse.SUPPRESS:
                continue
            if getattr(a, "internal", False):  # set by a process for its children (receive's --handoff-fd)
                continue
            longs = [s[2:] for s in a.option_strings if s.startswith("--")]
            if longs:
                out.setdefault(longs[0], Option(longs[0], a)).places.append((p, a))
    return out


# -- the schema: sections, keys, pydantic models -----------------------------------------------------
class Schema:
    """What a file may say for these commands: a section per command plus ``[redis]`` and ``[metrics]``.

    :param commands: the command parsers (``subcommands(build_parser(...))``).
    """

    def __init__(self, commands: Mapping[str, argparse.ArgumentParser]) -> None:
        self.own: dict[str, dict[str, Option]] = {}
        self.sections: dict[str, dict[str, Option]] = {}
        self._models: dict[str, Any] = {}
        self._plugins_loaded = False
        self.add(commands)

    def add(self, commands: Mapping[str, argparse.ArgumentParser]) -> None:
        for name, p in commands.items():
            self.own.setdefault(name, options_of(p))
        self.sections = {name: dict(opts) for name, opts in self.own.items()}
        redis, metrics = self.sections.setdefault(REDIS, {}), {}
        for opts in self.own.values():
            for key, opt_key in REDIS_KEYS.items():
                if opt_key in opts:
                    redis.setdefault(key, Option(key, opts[opt_key].action))
            for k, o in opts.items():
                if k.startswith(METRICS_PREFIX):
                    metrics.setdefault(k[len(METRICS_PREFIX):], Option(k[len(METRICS_PREFIX):], o.action))
        self.sections[METRICS] = metrics
        self._models.clear()

    def add_plugins(self) -> None:
        """Also the commands installed packages add (``fstream.commands``), once: a file may configure them."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        from importlib.metadata import entry_points

        scratch = argparse.ArgumentParser(prog="fstream").add_subparsers()
        for ep in entry_points(group="fstream.commands"):
            try:
                ep.load()(scratch)
            except ImportError:  # an optional dependency of that command is missing: it cannot be configured
                continue
        self.add({n: p for n, p in scratch.choices.items() if n not in self.own})

    def bindings(self, command: str) -> list[tuple[str, str, Option]]:
        """``(section, key, the command's option)`` for every key that sets one of ``command``'s options:
        the shared sections first, so that the command's own section wins over them in each layer."""
        own = self.own.get(command, {})
        shared = [(REDIS, key, own[opt]) for key, opt in REDIS_KEYS.items() if opt in own]
        shared += [(METRICS, k[len(METRICS_PREFIX):], o) for k, o in own.items() if k.startswith(METRICS_PREFIX)]
        return [b for b in shared if b[0] != command] + [(command, k, o) for k, o in own.items()]

    def model(self, section: str) -> Any:
        """The pydantic model of a section: one optional field per key, argparse's checks as its validator."""
        if section not in self._models:
            from typing import Annotated

            from pydantic import BeforeValidator, ConfigDict, Field, create_model

            fields = {f"o{i}": (Annotated[Any, BeforeValidator(opt.convert)], Field(None, validation_alias=key))
                      for i, (key, opt) in enumerate(self.sections[section].items())}
            self._models[section] = create_model(f"config_{section}", __config__=ConfigDict(extra="forbid"), **fields)
        return self._models[section]

    def validate(self, section: str, table: Mapping[str, Any], where: Callable[[str, Any], str]) -> tuple[
            dict[str, tuple[Any, Any]], list[str]]:
        """``({key: (raw, value)}, problems)`` of one section's table; ``where(key, raw)`` starts each problem."""
        from pydantic import ValidationError

        known = self.sections[section]
        norm: dict[str, Any] = {}
        problems: list[str] = []
        for k, raw in table.items():
            key = k.replace("_", "-")
            if key in norm:
                problems.append(f"{where(k, raw)}: given twice (as {key} and {k})")
            norm[key] = raw
        try:
            obj = self.model(section).model_validate(norm)
        except ValidationError as exc:
            for err in exc.errors():
                key = str(err["loc"][0]) if err["loc"] else "?"
                if err["type"] == "extra_forbidden":
                    problems.append(f"{where(key, err['input'])}: unknown key{suggest(key, known)}")
                else:
                    reason = err.get("ctx", {}).get("error") or err["msg"]
                    problems.append(f"{where(key, norm.get(key))}: {reason}")
            return {}, problems
        names = dict(zip((f"o{i}" for i in range(len(known))), known))
        return {names[f]: (known[names[f]].display(norm[names[f]], v), v) for f, v in obj
                if f in obj.model_fields_set}, problems


def closest(word: str, choices: Sequence[str]) -> str | None:
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def suggest(word: str, choices: Sequence[str], fmt: str = "{}") -> str:
    """``"; did you mean X?"`` with the closest of ``choices`` (difflib), or nothing."""
    close = closest(word, choices)
    return f"; did you mean {fmt.format(close)}?" if close else ""


def redact(value: Any) -> Any:
    """``value`` with any password in a URL (``redis://:PASSWORD@host``) replaced by ``***``."""
    if isinstance(value, list):
        return [redact(v) for v in value]
    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", value) if isinstance(value, str) else value


def shown(value: Any) -> str:
    """A value as TOML writes it (strings quoted), with any password in a URL replaced by ``***``."""
    value = redact(value)
    if isinstance(value, list):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, (str, bool)) or value is None else str(value)


# -- the file, the environment, the layers -----------------------------------------------------------
def read_toml(path: str) -> dict[str, Any]:
    """The file's tables; a missing file or a syntax error (with line and column) is a ``ConfigError``."""
    import tomllib

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError([f"config {path}: no such file"]) from None
    except OSError as exc:
        raise ConfigError([f"config {path}: cannot read: {exc.strerror}"]) from None
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg)
        at = f"line {m.group(1)}, column {m.group(2)}: {msg[:m.start()]}" if m else msg
        raise ConfigError([f"config {path}: TOML syntax error at {at}"]) from None


class Setting:
    """One option's effective value: ``raw`` as the file would say it, ``value`` for argparse, and its source."""

    def __init__(self, raw: Any, value: Any, source: str) -> None:
        self.raw, self.value, self.source = raw, value, source


class Config:
    """A validated file (or none) and the environment, for one schema.

    :param schema: the sections and keys.
    :param path: the file read, or None.
    """

    def __init__(self, schema: Schema, path: str | None) -> None:
        self.schema, self.path = schema, path
        self.file: dict[tuple[str, str], Setting] = {}  # (section, key) -> what the file says
        self.keys = self.sections = 0

    @classmethod
    def load(cls, schema: Schema, path: str | None) -> Config:
        """Read and validate the whole file; every problem is reported together (``ConfigError``)."""
        cfg = cls(schema, path)
        if path is None:
            return cfg
        data = read_toml(path)
        problems: list[str] = []
        if any(name not in schema.sections for name, t in data.items() if isinstance(t, dict)):
            schema.add_plugins()
        for name, table in data.items():
            if not isinstance(table, dict):
                problems.append(f"config {path}: {name} = {shown(table)}: a key outside any section (keys go "
                                f"under their command's section, e.g. [receive])")
            elif name not in schema.sections:
                hint = suggest(name, list(schema.sections), "[{}]")
                problems.append(f"config {path}: [{name}]: unknown section{hint} (sections: the commands, [redis] "
                                f"and [metrics])")
            else:
                got, bad = schema.validate(name, table, lambda k, v, n=name: f"config {path}: [{n}] {k} = {shown(v)}")
                problems += bad
                cfg.sections += 1
                cfg.keys += len(table)
                src = f"file {path}"
                cfg.file.update({(name, k): Setting(raw, value, src) for k, (raw, value) in got.items()})
        if problems:
            raise ConfigError(problems)
        return cfg

    def env(self, command: str, environ: Mapping[str, str]) -> tuple[dict[tuple[str, str], Setting], list[str]]:
        """The variables that configure ``command``, validated like the file."""
        out: dict[tuple[str, str], Setting] = {}
        problems: list[str] = []
        names = [*self.schema.sections]
        for name, text in sorted(relevant_env(command, names, environ).items()):
            section = env_section(name, names)
            assert section is not None
            key = name[len(env_name(section)) + 1:].lower().replace("_", "-")
            if key not in self.schema.sections[section]:
                close = closest(key, list(self.schema.sections[section]))
                hint = f"; did you mean {env_name(section, close)}?" if close else ""
                problems.append(f"env {name}: unknown key {key} in [{section}]{hint}")
                continue
            raw = self.schema.sections[section][key].from_env(text)
            got, bad = self.schema.validate(section, {key: raw}, lambda k, v, n=name: f"env {n} = {shown(text)}")
            problems += bad
            out.update({(section, k): Setting(r, v, f"env {name}") for k, (r, v) in got.items()})
        return out, problems

    def effective(self, command: str, environ: Mapping[str, str] | None = None,
                  cli: Mapping[str, Any] | None = None) -> dict[str, Setting]:
        """Every option of ``command``: command line > environment > file > defaults (``ConfigError`` if bad)."""
        env, problems = self.env(command, os.environ if environ is None else environ)
        if problems:
            raise ConfigError(problems)
        own = self.schema.own[command]
        out = {k: Setting(o.default_shown(), o.action.default, "default") for k, o in own.items()}
        for layer in (self.file, env):
            for section, key, opt in self.schema.bindings(command):
                if (section, key) in layer:
                    out[opt.key] = layer[(section, key)]
        for key, value in (cli or {}).items():
            out[key] = Setting(value, value, "command line")
        return out


def install(schema: Schema, command: str, settings: Mapping[str, Setting]) -> Callable[[argparse.Namespace], None]:
    """Give the command's parser the configured values as defaults (a configured required option is no longer
    required); returns what to do after parsing: an ``append`` option given on the command line replaces the
    configured list instead of extending it."""
    lists: dict[str, list] = {}
    for key, s in settings.items():
        if s.source == "default":
            continue
        opt = schema.own[command][key]
        value = opt.dest_value(s.value)
        for parser, action in opt.places:
            parser.set_defaults(**{action.dest: value})
            action.required = False
        if isinstance(value, list):
            lists[opt.action.dest] = value

    def finish(args: argparse.Namespace) -> None:
        for dest, configured in lists.items():
            got = getattr(args, dest, None)
            if isinstance(got, list) and len(got) > len(configured) and got[:len(configured)] == configured:
                setattr(args, dest, got[len(configured):])
    return finish


def unconfigured(args: argparse.Namespace) -> None:
    """``apply``'s after-parse step when nothing configures the command."""
    return None


def may_configure(command: str, explicit: str | None, commands: Sequence[str]) -> bool:
    """Whether a file or a ``FSTREAM_*`` variable may configure ``command`` (one of ``commands``, every command
    of the parser); ``apply`` reads and imports nothing when not."""
    return locate(explicit) is not None or bool(relevant_env(command, list(commands), os.environ, new_only=True))


def apply(parser: argparse.ArgumentParser, argv: Sequence[str], command: str | None,
          explicit: str | None) -> Callable[[argparse.Namespace], None]:
    """Configure ``command`` before ``parser.parse_args(argv)``; returns the after-parse step (see ``install``).

    Cheap when there is nothing to read: no file and no new variable for this command imports and reads nothing.
    ``config`` itself (it inspects configurations) and ``--help`` are never configured.
    """
    commands = subcommands(parser)
    if command not in commands or command == "config" or {"-h", "--help"} & set(argv):
        return unconfigured
    if not may_configure(command, explicit, list(commands)):
        return unconfigured
    path = locate(explicit)
    schema = Schema(commands)
    settings = Config.load(schema, path).effective(command)
    return install(schema, command, settings)
