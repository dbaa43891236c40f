"""Mutation testing of the worker's core with mutmut: ``scripts/mutation`` (docs/reliability.md).

Runs in a copy of the checkout, ``.mutation/<name>/`` (mutmut writes its mutants and results
under ``mutants/`` there and never touches the checkout), with mutmut's settings written into
that copy's ``pyproject.toml``. The test command is the unit tests of the mutated packages and
one pytest test per simulation seed (``tests/mutation/test_seeds.py``); mutmut runs, for each
mutant, only the tests that called the mutated function, and stops at the first that fails.

At the end (or with ``--report``, from the results already there) it prints the score per
package and every surviving mutant with its line, and writes both to
``.mutation/<name>/report.md``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections import Counter
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

from tests.simulation.mixes import MIXES

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("worker", "state", "kafka")
UNIT_TESTS = {package: f"tests/unit/{package}" for package in PACKAGES}

#: The fixed seeds of a full run, chosen by ``python -m tests.mutation.choose_seeds`` (its
#: docstring says how): the 17 seeds that found a defect or a hole, then a greedy cover of the
#: lines of the three packages that they and seeds 0-99 reach (2,788 lines; the 17 reach 2,744).
FOUND_SEEDS = (0, 5, 6, 17, 22, 29, 187, 242, 331, 483, 1077, 1270, 1915, 2489, 3024, 5874, 10397)
SEEDS: tuple[int, ...] = (*FOUND_SEEDS, 10, 45, 9, 12, 1, 20, 32, 39, 41, 51, 88)

#: Log statements are not mutated: their text is for people, and changing it changes no
#: behaviour the tests or the simulation can see (the lines that matter are pinned by
#: tests/unit/worker/test_log_lines.py, which does not need mutants to stay right).
SECTION = "\n[tool.mutmut]\n"
DO_NOT_MUTATE = [r"^\s*(log|logger|_log)\.(debug|info|warning|error|exception|critical)\("]

#: mutmut's exit codes (mutmut/stats.py) as this report counts them: a timeout is a kill (the
#: mutant made a test hang, which a test run notices), "no tests" a survivor (nothing ran it).
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped"}
STATUS.update(dict.fromkeys((36, -24, 24, 152, 255), "timeout"))
STATUS.update({37: "type check", -11: "crashed", -9: "crashed"})
DETECTED = {"killed", "timeout", "crashed", "type check"}
ALIVE = {"survived", "no tests", "suspicious"}


@dataclass(frozen=True)
class Only:
    """A file to mutate, optionally only the mutants on lines ``first``..``last``."""

    path: str
    first: int = 0
    last: int = 1 << 30

    @property
    def ranged(self) -> bool:
        """Whether only some lines of the file are selected."""
        return bool(self.first) or self.last < 1 << 30

    @classmethod
    def parse(cls, text: str) -> Only:
        """``path``, ``path:first-last`` (lines), or ``path:name`` (a function, or ``Class.method``: its lines
        in the file as it is now, so that a selection outlives edits above it)."""
        path, _, lines = text.partition(":")
        if not lines:
            return cls(path)
        if not lines[0].isdigit():
            spans = _functions(ROOT / path)
            cls_name, _, method = lines.rpartition(".")
            key = f"xǁ{cls_name}ǁ{method}" if cls_name else f"x_{method}"
            if key not in spans:
                raise SystemExit(f"scripts/mutation: no function {lines} in {path}")
            return cls(path, *spans[key])
        first, _, last = lines.partition("-")
        return cls(path, int(first), int(last or first))


def parse_seeds(text: str) -> list[int]:
    """``0-299``, ``1,5,9`` or a mix: the seeds, in order."""
    seeds: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        seeds.extend(range(int(first), int(last) + 1) if dash else [int(first)])
    return seeds


def _copy_checkout(work: Path, under: str = "") -> None:
    """The checkout's files (tracked and new, not ignored; those ``under`` a folder) into ``work``, symlinks kept."""
    names = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.split(b"\0")
    buffer = BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in names:
            if name and name.startswith(under.encode()) and (ROOT / name.decode()).exists():
                tar.add(ROOT / name.decode(), arcname=name.decode(), recursive=False)
    buffer.seek(0)
    with tarfile.open(fileobj=buffer) as tar:
        tar.extractall(work, filter="tar")


def refresh_unmutated(work: Path, files: list[str], root: Path = ROOT) -> list[str]:
    """The checkout's ``pipeline/`` modules that the run does not mutate, copied over the run's copy and mutmut's
    (``mutants/``, once made): a run resumed in a later session judges its mutants among the code as it is now.
    The mutated files stay as they were, with the mutants made from them (a function changed since is judged
    again by the next run from its ledger, by its hash). The modules copied are returned."""
    copied: list[str] = []
    for source in sorted((root / "pipeline").rglob("*.py")):
        name = str(source.relative_to(root))
        if name in files:
            continue
        targets = [work / name] + ([work / "mutants" / name] if (work / "mutants").is_dir() else [])
        for target in targets:
            if not target.exists() or target.read_bytes() != source.read_bytes():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
                copied.append(str(target.relative_to(work)))
    return copied


def _settings(files: list[str], tests: list[str]) -> str:
    settings = {
        "source_paths": ["pipeline"],
        "only_mutate": files,
        "do_not_mutate_patterns": DO_NOT_MUTATE,
        "pytest_add_cli_args_test_selection": tests,
        # under mutmut's trampolines a task's coroutine left pending by a worker test is closed
        # outside its loop (its `finally` then meets no running loop): reported as unraisable,
        # which pyproject makes an error, and mutmut's stats run then stops before any mutant
        "pytest_add_cli_args": [
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore::pytest.PytestUnraisableExceptionWarning",
        ],
        # the stats run leaves threads behind (RocksDB, executors): forking mutants from it
        # deadlocks, so they fork from a server that only collected the tests
        "process_isolation": "forkserver",
        "also_copy": ["topologies", "deploy", "docs", "README.md", "examples"],
        "use_git_change_detection": False,
        # a mutant that makes a test hang is stopped after 8 times its tests' time (mutmut's
        # default, 15, lets one hanging simulation seed cost a quarter of an hour)
        "timeout_multiplier": 8.0,
    }
    return SECTION + "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())


def _files(packages: list[str], only: list[Only]) -> list[str]:
    if only:
        return sorted({o.path for o in only})
    return sorted(
        str(path.relative_to(ROOT))
        for package in packages
        for path in (ROOT / "pipeline" / package).glob("*.py")
        if path.name != "__init__.py"
    )


def _functions(path: Path) -> dict[str, tuple[int, int]]:
    """mutmut's name of each function and method of ``path`` (``x_f``, ``xǁClassǁf``): its lines."""
    spans: dict[str, tuple[int, int]] = {}
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            spans[f"x_{node.name}"] = (node.lineno, node.end_lineno or node.lineno)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    spans[f"xǁ{node.name}ǁ{item.name}"] = (item.lineno, item.end_lineno or item.lineno)
    return spans


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    status: str
    line: int
    before: str
    after: str


def _locate(work: Path, path: str, name: str, diff: str) -> tuple[int, str, str]:
    """The line of ``path`` a mutant changes, and that line before and after."""
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    function = name.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0]
    source = (work / path).read_text().splitlines()
    first, last = _functions(work / path).get(function, (1, len(source)))
    line = first
    if removed:
        wanted = removed[0].strip()
        line = next((n for n in range(first, last + 1) if source[n - 1].strip() == wanted), first)
    return line, " ".join(r.strip() for r in removed)[:200], " ".join(a.strip() for a in added)[:200]


def _mutants(work: Path, files: list[str]) -> list[Mutant]:
    os.chdir(work)
    from mutmut.mutation.diff_apply import get_diff_for_mutant  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: PLC0415

    found: list[Mutant] = []
    for path in files:
        meta = work / "mutants" / f"{path}.meta"
        if not meta.exists():
            continue
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        for name, code in codes.items():
            status = "not run" if code is None else STATUS.get(code, "suspicious")
            if status in DETECTED or status == "skipped":
                found.append(Mutant(name, path, status, 0, "", ""))
                continue
            line, before, after = _locate(work, path, name, get_diff_for_mutant(name, path=path))
            found.append(Mutant(name, path, status, line, before, after))
    return found


def load_ledger(ledger: Path, work: Path) -> int:
    """Put a ledger's results where mutmut keeps its own (``mutants/<file>.meta``) before it makes the mutants.

    mutmut then keeps the result of each mutant whose function is unchanged (the same source hash)
    and runs the others again; the number of results put back is returned. A run that a session
    cannot finish goes on in the next one, on a fresh checkout, from the ledger it committed.
    """
    if not ledger.exists():
        return 0
    data = json.loads(ledger.read_text())
    count = 0
    for path, entry in data["files"].items():
        meta = work / "mutants" / f"{path}.meta"
        meta.parent.mkdir(parents=True, exist_ok=True)
        codes = entry["exit_code_by_key"]
        meta.write_text(
            json.dumps(
                {
                    "exit_code_by_key": codes,
                    "hash_by_function_name": entry["hash_by_function_name"],
                    "type_check_error_by_key": {},
                    "durations_by_key": {},
                    "estimated_durations_by_key": {},
                }
            )
        )
        count += len(codes)
    return count


def save_ledger(ledger: Path, work: Path, files: list[str], only: list[Only], command: str) -> int:
    """Write the results judged so far of the run's mutants (those on ``only``'s lines), with the hash of the
    function each belongs to, to ``ledger``; the number written is returned."""
    out: dict[str, dict[str, dict[str, object]]] = {}
    count = 0
    for path in files:
        meta = work / "mutants" / f"{path}.meta"
        if not meta.exists():
            continue
        data = json.loads(meta.read_text())
        ranges = [o for o in only if o.path == path]
        codes: dict[str, object] = {}
        for name, code in sorted(data["exit_code_by_key"].items()):
            if code is None:
                continue
            if any(o.ranged for o in ranges):
                line = _line(work, path, name)
                if not any(o.first <= line <= o.last for o in ranges):
                    continue
            codes[name] = code
        functions = {name.rsplit(".", 1)[-1].rsplit("__mutmut_", 1)[0] for name in codes}
        hashes = {f: h for f, h in sorted(data["hash_by_function_name"].items()) if f in functions}
        out[path] = {"exit_code_by_key": codes, "hash_by_function_name": hashes}
        count += len(codes)
    ledger = _at_root(ledger)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    ledger.write_text(json.dumps({"command": command, "files": out}, indent=1, sort_keys=True) + "\n")
    return count


def _line(work: Path, path: str, name: str) -> int:
    """The line of ``path`` mutant ``name`` changes (mutmut's diff, read in the run's directory)."""
    os.chdir(work)
    from mutmut.mutation.diff_apply import get_diff_for_mutant  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: PLC0415

    return _locate(work, path, name, get_diff_for_mutant(name, path=path))[0]


def _at_root(path: Path) -> Path:
    """A path given relative to the checkout (the script runs from its copy's directory too)."""
    return path if path.is_absolute() else ROOT / path


def _judged(work: Path, files: list[str]) -> set[str]:
    """The mutants that already have a result (from this run, or put back from a ledger)."""
    judged: set[str] = set()
    for path in files:
        meta = work / "mutants" / f"{path}.meta"
        if meta.exists():
            codes = json.loads(meta.read_text())["exit_code_by_key"]
            judged.update(name for name, code in codes.items() if code is not None)
    return judged


def _package(path: str) -> str:
    return path.split("/")[1]


def report(work: Path, files: list[str], only: list[Only], command: str) -> tuple[str, bool]:
    """The score per package and the surviving mutants, as Markdown; whether every mutant was run."""
    mutants = [m for m in _mutants(work, files) if _wanted(m, only)]
    lines = [
        f"# Mutation run `{work.name}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        f"`{command}`",
        "",
        "| package | mutants | killed | timeout | survived | no tests | not run | score |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    packages = sorted({_package(m.path) for m in mutants})
    complete = True
    for package in [*packages, "all"]:
        ours = [m for m in mutants if package in ("all", _package(m.path))]
        counts = Counter(m.status for m in ours)
        run = len(ours) - counts["not run"] - counts["skipped"]
        detected = sum(counts[s] for s in DETECTED)
        score = f"{100 * detected / run:.1f}%" if run else "-"
        complete = complete and counts["not run"] == 0
        lines.append(
            f"| {package} | {len(ours)} | {counts['killed'] + counts['crashed'] + counts['type check']} |"
            f" {counts['timeout']} | {counts['survived']} | {counts['no tests']} | {counts['not run']} | {score} |"
        )
    alive = sorted(
        (m for m in mutants if m.status in ("survived", "no tests", "suspicious")),
        key=lambda m: (m.path, m.line),
    )
    lines += ["", f"## Surviving mutants ({len(alive)})", ""]
    lines += ["| module | line | mutant | status | before | after |", "|---|---:|---|---|---|---|"]
    lines += [
        f"| {m.path} | {m.line} | {m.name.rsplit('.', 1)[-1]} | {m.status} | `{_cell(m.before)}` | `{_cell(m.after)}` |"
        for m in alive
    ]
    return "\n".join(lines) + "\n", complete


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


def _wanted(mutant: Mutant, only: list[Only]) -> bool:
    if not only or mutant.line == 0:
        return True
    return any(o.path == mutant.path and o.first <= mutant.line <= o.last for o in only)


def _names_in_lines(work: Path, only: list[Only]) -> list[str]:
    """The mutants of ``only``'s line ranges (mutants generated first)."""
    os.chdir(work)
    from mutmut.__main__ import create_mutants  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: PLC0415
    from mutmut.mutation.diff_apply import get_diff_for_mutant  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: PLC0415
    from mutmut.utils.file_utils import (  # type: ignore[import-not-found,import-untyped,unused-ignore]  # noqa: PLC0415
        copy_also_copy_files,
        copy_src_dir,
        setup_source_paths,
    )

    copy_src_dir()
    copy_also_copy_files()
    setup_source_paths()
    create_mutants(1)
    names: list[str] = []
    for path in sorted({o.path for o in only}):
        codes = json.loads((work / "mutants" / f"{path}.meta").read_text())["exit_code_by_key"]
        for name in codes:
            line, _, _ = _locate(work, path, name, get_diff_for_mutant(name, path=path))
            if any(o.path == path and o.first <= line <= o.last for o in only):
                names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/mutation", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--package",
        action="append",
        choices=PACKAGES,
        help="mutate this package of pipeline/ (default: all three)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="mutate only this file, optionally only these lines (pipeline/state/store.py:120-180); repeatable",
    )
    parser.add_argument("--seeds", help="simulation seeds, e.g. 0-299 or 3,17,40 (default: the fixed set)")
    parser.add_argument(
        "--mix",
        default="default",
        choices=sorted(MIXES),
        help="the simulation mix the seeds run under (tests/simulation/mixes.py; default: default)",
    )
    parser.add_argument(
        "--simulation-only", action="store_true", help="the simulation seeds alone, no unit tests"
    )
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--name", help="the run's directory under .mutation/ (default: from the options)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on with the run's mutants and results (the tests as they are now)",
    )
    parser.add_argument(
        "--rerun-survivors",
        action="store_true",
        help="with --resume: run the surviving mutants again (after adding the tests that should kill them)",
    )
    parser.add_argument(
        "--report", action="store_true", help="only print and write the report of the results"
    )
    parser.add_argument(
        "--ledger",
        type=Path,
        help="a file (tests/mutation/ledgers/<name>.json) the results are taken from at the start and written "
        "to at the end: commit it, and the next session goes on where this one stopped",
    )
    args = parser.parse_args(argv)

    packages = args.package or list(PACKAGES)
    only = [Only.parse(text) for text in args.only]
    seeds = parse_seeds(args.seeds) if args.seeds else list(SEEDS)
    name = args.name or "-".join((["sim"] if args.simulation_only else []) + (["only"] if only else packages))
    work = ROOT / ".mutation" / name
    files = _files(packages, only)
    tests = (
        ["tests/mutation"]
        if args.simulation_only
        else [
            *sorted({UNIT_TESTS[_package(f)] for f in files}),
            "tests/mutation",
        ]
    )
    command = "scripts/mutation " + " ".join(argv if argv is not None else sys.argv[1:])
    if not args.report:
        if not args.resume:
            subprocess.run(["rm", "-rf", str(work)], check=True)
            work.mkdir(parents=True)
            _copy_checkout(work)
        else:  # the tests as they are now (one added to kill a survivor), the mutated code as it was
            _copy_checkout(work, under="tests/")
            for name in refresh_unmutated(work, files):
                print(f"resumed with {name} as it is now", flush=True)
        pyproject = work / "pyproject.toml"
        ours = pyproject.read_text().split(SECTION)[0]
        pyproject.write_text(ours + _settings(files, tests))
        env = dict(
            os.environ, PYTHONHASHSEED="0", MUTATION_SEEDS=",".join(map(str, seeds)), MUTATION_MIX=args.mix
        )
        os.environ.update(env)
        if args.ledger is not None and not args.resume:
            print(f"{load_ledger(_at_root(args.ledger), work)} results taken from {args.ledger}", flush=True)
        lines = any(o.ranged for o in only)
        names = _names_in_lines(work, only) if lines else []
        if names and (args.resume or args.ledger is not None):
            # named mutants are run whatever their result: name only those not judged yet
            judged = _judged(work, files)
            names = [name for name in names if name not in judged]
            if not names:
                print("every mutant of the selection already has a result")
        if args.rerun_survivors:
            alive = [m for m in _mutants(work, files) if _wanted(m, only) and m.status in ALIVE]
            names = [m.name for m in alive]
            if not names:
                print("no surviving mutant to run again")
        print(
            f"mutating {len(files)} files in {work}; tests: {' '.join(tests)}; {len(seeds)} seeds of the {args.mix} mix",
            flush=True,
        )
        started = time.monotonic()
        code = (
            0
            if lines and not names
            else subprocess.run(
                [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.jobs), *names],
                cwd=work,
                env=env,
                stdout=(work / "mutmut.log").open("w"),
                stderr=subprocess.STDOUT,
                check=False,
            ).returncode
        )
        print(f"mutmut exited {code} after {time.monotonic() - started:.0f}s (its output: {work}/mutmut.log)")
    text, complete = report(work, files, only, command)
    (work / "report.md").write_text(text)
    print(text)
    print(f"report: {work}/report.md")
    if args.ledger is not None:
        print(f"{save_ledger(args.ledger, work, files, only, command)} results written to {args.ledger}")
    return 0 if complete else 1


if __name__ == "__main__":
    raise SystemExit(main())
