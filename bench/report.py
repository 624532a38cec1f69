"""A bench's printed results kept as a report (issue 64: figures in the docs come from reports checked into
docs/results/<name>/, each carrying its command, commit and CPU). Runs the command, shows its output as it
comes, and writes DIR/report.md: the command, the commit (and whether the working tree had changes), the
CPU, the date, the wall time and the exit status, then the output itself, as markdown (``--markdown``: the
bench prints markdown tables) or verbatim in a text block. Nothing is written when the command fails or is
interrupted, so a report never holds half a run.

Usage: python bench/report.py docs/results/device_speed [--title TITLE] [--markdown] -- \
    python bench/device.py --rounds 3
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resnet8ptq.hardware import detect  # noqa: E402


def git(*arguments: str) -> str:
    """``git`` in this repository; its output, stripped."""
    return subprocess.run(["git", "-C", str(REPO), *arguments], capture_output=True, text=True).stdout.strip()


def run(command: list[str]) -> tuple[int, str, float]:
    """``command``'s exit status, its output (stdout and stderr together; a progress bar's line kept in its
    last state, blank lines dropped) and its wall time in seconds; the output is echoed as it comes."""
    start = time.perf_counter()
    lines = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as process:
        for raw in process.stdout:  # bytes: a text stream would turn tqdm's carriage returns into lines
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()
            last = raw.decode(errors="replace").rstrip("\n").split("\r")
            kept = next((part for part in reversed(last) if part.strip()), "")
            if kept:
                lines.append(kept.rstrip() + "\n")
    return process.returncode, "".join(lines), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="where report.md goes (docs/results/<name>)")
    parser.add_argument("--title", help="the report's title (default: the command)")
    parser.add_argument("--markdown", action="store_true", help="the command prints markdown")
    parser.usage = "%(prog)s DIR [--title TITLE] [--markdown] -- COMMAND ..."
    given = sys.argv[1:]
    cut = given.index("--") if "--" in given else len(given)
    args, command = parser.parse_args(given[:cut]), given[cut + 1 :]
    if not command:
        parser.error("no command given: python bench/report.py DIR -- python bench/<bench>.py ...")
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = bool(git("status", "--porcelain", "--untracked-files=no"))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    status, output, seconds = run(command)
    if status != 0:
        sys.exit(f"{shlex.join(command)} exited with {status}: no report written")
    lines = [
        f"# {args.title or shlex.join(command)}",
        "",
        f"- command: `{shlex.join(command)}`",
        f"- commit: {commit}" + (" (with uncommitted changes)" if changed else ""),
        f"- CPU: {detect().label}",
        f"- started: {started}; took {seconds / 60:.1f} min",
        f"- written by: `{shlex.join(['python', *sys.argv])}`",
        "",
    ]
    body = output.rstrip() + "\n" if args.markdown else "```text\n" + output.rstrip() + "\n```\n"
    args.directory.mkdir(parents=True, exist_ok=True)
    partial = args.directory / "report.md.partial"
    partial.write_text("\n".join(lines) + "\n" + body)
    partial.replace(args.directory / "report.md")
    print(f"Wrote {args.directory / 'report.md'}")


if __name__ == "__main__":
    main()
