"""Docs that run (issue 64): every `run.py` command in README.md and docs/*.md composes with Hydra, as
`python run.py ... --cfg job` would, and passes the settings' own checks (`quant_spec`: types, values and
their combinations), once for every value it sweeps; every `python -m resnet8ptq.<module>` names a module
that exists and every `make <target>` a target of the Makefile; every relative link points at a file, and its
`#anchor` at a heading of that file. Commands that elide settings (`...`, `ARGS`) are not checked."""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

import resnet8ptq.config  # noqa: F401  (registers base_config)
from resnet8ptq.config import quant_spec

REPO = Path(__file__).resolve().parents[2]
PAGES = [
    REPO / "README.md",
    *sorted(page for page in (REPO / "docs").rglob("*.md") if "results" not in page.relative_to(REPO).parts),
]
"""README.md and every page of docs/ (the tutorial, docs/howto/, docs/reference/, ...), the generated reports
under docs/results/ aside: they quote runs, not commands to run."""
FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
FLAGS = {"-m", "--multirun", "--help", "--cfg", "job"}
ELIDED = re.compile(r"\.\.\.|\bARGS\b|@hydra\.main|=[A-Z]\b")
"""What marks a command as a sketch with settings left out (``...``, ``ARGS``, a value such as ``W``)."""
NOT_INSTALLED = {"hydra/launcher=ray": "hydra-ray-launcher, installed apart (docs/scaling.md)"}
"""Settings of plugins the venv does not hold, with where the docs say how to install them."""
HYPOTHETICAL = {
    ("development.md", "algo=cle_clip algo.clip_ratio=0.98"): "the guide's example of an algorithm to add",
}
"""Commands the docs show for code a reader would write first."""


def commands_in(text: str, marker: str) -> Iterator[str]:
    """Every command line holding ``marker`` in ``text``: in fenced blocks (continued lines joined, comments
    dropped) and in inline code (wrapped lines joined)."""
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if marker in line:
                yield line
    for span in re.findall(rf"`([^`]*?{re.escape(marker)}[^`]*)`", FENCE.sub("", text)):
        yield " ".join(span.split())


def run_commands() -> list[tuple[str, str]]:
    """(page, the arguments after run.py) of every checkable command."""
    found = []
    for page in PAGES:
        for command in commands_in(page.read_text(), "run.py"):
            arguments = command[command.index("run.py") + len("run.py") :].strip()
            skipped = (page.name, arguments) in HYPOTHETICAL or any(k in arguments for k in NOT_INSTALLED)
            if not ELIDED.search(arguments) and not skipped:
                found.append((page.name, arguments))
    return found


def variants(arguments: str) -> list[list[str]]:
    """The overrides of one command, once per value of each sweep (the other sweeps at their first value),
    flags dropped."""
    tokens = [token for token in shlex.split(arguments) if token not in FLAGS]
    strange = [token for token in tokens if "=" not in token and not token.startswith("~")]
    assert not strange, f"not a setting: {strange}"
    parsed = OverridesParser.create().parse_overrides(tokens)
    values = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]
        if o.is_sweep_override()
        else [o.input_line]
        for o in parsed
    ]
    first = [options[0] for options in values]
    result = [first]
    for index, options in enumerate(values):
        result += [[*first[:index], option, *first[index + 1 :]] for option in options[1:]]
    return result


COMMANDS = run_commands()


def test_the_docs_hold_commands() -> None:
    """The extraction finds what the pages hold (the README's headline sweep among them), the how-to guides'
    commands included."""
    assert len(COMMANDS) >= 60
    assert ("README.md", "-m backend=onnx,torch dtype=int8,uint8") in COMMANDS
    howtos = sorted((REPO / "docs" / "howto").glob("*.md"))
    assert howtos and set(howtos) <= set(PAGES)
    assert {page for page, _ in COMMANDS} >= {page.name for page in howtos}


@pytest.fixture(scope="module")
def compose_config():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        yield lambda overrides: compose("config", overrides=overrides, return_hydra_config=True)


@pytest.fixture(scope="module")
def checked(compose_config):
    """The error of one list of overrides (None: composed and checked), each list checked once."""

    @functools.cache
    def check(overrides: tuple[str, ...]) -> str | None:
        try:
            quant_spec(compose_config(list(overrides)))
        except Exception as error:  # its message names the setting; the caller says where it is written
            return f"{type(error).__name__}: {error}"
        return None

    return check


@pytest.mark.parametrize(("page", "arguments"), COMMANDS, ids=[f"{p}: {a}"[:90] for p, a in COMMANDS])
def test_every_run_command_composes(checked, page: str, arguments: str) -> None:
    for overrides in variants(arguments):
        error = checked(tuple(overrides))
        assert error is None, f"{page}: python run.py {arguments}: {overrides}: {error}"


def test_a_misspelt_setting_fails(compose_config) -> None:
    """The check can fail: a misspelt key, a misspelt choice, a bad value."""
    for overrides in (
        ["device=cim", "device.rowz=128"],
        ["device=cimm"],
        ["device=cim", "device.adc_range=msee"],
    ):
        with pytest.raises(Exception, match=r"rowz|cimm|msee"):
            quant_spec(compose_config(overrides))


def test_every_module_and_make_target_exists() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))
    missing = []
    for page in PAGES:
        text = page.read_text()
        for command in commands_in(text, "python -m resnet8ptq."):
            for module in re.findall(r"python -m (resnet8ptq(?:\.\w+)+)", command):  # not `<module>`
                if importlib.util.find_spec(module) is None:
                    missing.append(f"{page.name}: {module}")
        for command in commands_in(text, "make "):
            for target in re.findall(r"(?:^|&&|;)\s*make ([a-z][\w-]*)", command):
                if target not in targets:
                    missing.append(f"{page.name}: make {target}")
    assert missing == []


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but hyphens and underscores dropped,
    spaces as hyphens, repeats numbered."""
    found, counts = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        repeat = counts.get(slug, 0)
        counts[slug] = repeat + 1
        found.add(slug if repeat == 0 else f"{slug}-{repeat}")
    return found


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no {path})")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.name}: {target} (no heading #{anchor} in {file.name})")
    assert broken == []


DICT_SETTINGS = ("search.calib_params",)
"""Settings whose value is a mapping, documented as a whole."""
UNDOCUMENTED = {
    "backend._target_": "Hydra's instantiation target, not a setting",
    "calib.method": "set by the calib group's choice (`calib=entropy`)",
    "components.kind": "set by the components group's choice (`components=none`)",
}
"""Keys of the composed configuration that are not settings a user sets, with why."""


def documented_tokens() -> set[str]:
    """Every backticked span of README.md and docs/ (a command's settings do not count), a one-word
    ``key=value`` span as its key."""
    tokens = set()
    for page in PAGES:
        for span in re.findall(r"`([^`]+)`", FENCE.sub("", page.read_text())):
            tokens |= {span, span.split("=")[0]} if " " not in span else {span}
    return tokens


def test_every_setting_is_documented(compose_config) -> None:
    """Every key of the composed configuration (the boards' own data under mcu.boards aside) is named in
    README.md or docs/: by itself, as a whole mapping (:data:`DICT_SETTINGS`), or by a pattern
    (`algo.*_batch_size`; a whole group, `device.*`, does not count)."""
    from resnet8ptq.tracking.identity import flatten

    config = OmegaConf.to_container(compose_config([]), resolve=False)
    config.pop("hydra", None)
    tokens = documented_tokens()
    patterns = [
        t for t in tokens if re.fullmatch(r"\w+\.[\w.]*\*\w+", t)
    ]  # `algo.*_batch_size`, not `device.*`
    missing = [
        key
        for key in flatten(config)
        if not key.startswith("mcu.boards.")
        and key not in UNDOCUMENTED
        and key not in tokens
        and not any(key.startswith(f"{setting}.") and setting in tokens for setting in DICT_SETTINGS)
        and not any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns)
    ]
    assert missing == []


README_LINES, PAGE_LINES = 200, 400
"""Issue 64: the README a one-screen quick start with a table of contents, no page of docs/ a long read
(the generated reports in docs/results/ and the generated reference aside: they list, not explain)."""


def test_no_page_is_too_long() -> None:
    long = [
        f"{page.relative_to(REPO)}: {lines} lines"
        for page in PAGES
        if page.parent.name != "reference"
        and (lines := len(page.read_text().splitlines()))
        > (README_LINES if page.name == "README.md" else PAGE_LINES)
    ]
    assert long == [], f"README.md at most {README_LINES} lines, a page of docs/ at most {PAGE_LINES}"
