#!/usr/bin/env python3
"""Every program a script, batch file, hook or document runs is built by the `programs` target.

Usage: programs_lint.py SOURCE_DIR PROGRAMS_TXT

PROGRAMS_TXT is the list CMake writes beside the build (one path per line, relative to the build tree, for
each target of `programs`). Collected from scripts/, configs/, docs/ and README.md:
  - build-tree paths: `$bin/quota/forge-quota`, `build/release/ckpt/forge-ckpt`, `$FORGE_BUILD_DIR/...`: the
    path must be one of the list's;
  - `forge_bin NAME` (scripts/sbatch/common.sh's lookup) and `forge-NAME ARGS` at a command's place (a
    line's or a code span's start, after |, &&, ;, $(, srun/runuser/sudo and their options): the name
    must be a program of the list or an executable script scripts/forge-NAME (forge-image). A name alone
    in a code span (`forge-a`, a group) is not a command.
Prints one line per offender (file:line: what, and what to do) and exits 1 when there is any.
"""
import os
import pathlib
import re
import sys

MODULES = "common|health|dataio|ckpt|quota|trainer|launcher|eval_gate|spank_plugin"
# A path into a build tree: the tree is a variable the scripts use for it, or build/<preset>.
BUILD_PATH = re.compile(
    r"(?:\$\{?(?:bin|build|FORGE_BUILD_DIR|BUILD_DIR)\}?|\bbuild/[a-z]+)/((?:%s)/forge[-_][A-Za-z0-9_.-]*[A-Za-z0-9])"
    % MODULES)
FORGE_BIN = re.compile(r"\bforge_bin\s+([A-Za-z0-9_-]+)")
# A command's place: the start of a line (after a shell prompt or comment marker) or of a code span, or
# after a pipe, a list operator, a command substitution, or a launcher with its options.
COMMAND = re.compile(
    r"(?:^[ \t]*(?:[$#>][ \t]+)?|`|\|[ \t]*|&&[ \t]*|;[ \t]*|\$\([ \t]*|"
    r"\b(?:srun|sudo|runuser(?:[ \t]+-u[ \t]+\S+)?[ \t]+--|exec|time)(?:[ \t]+-{1,2}[A-Za-z][\w=,.:/-]*)*[ \t]+)"
    r"(forge-[a-z][a-z0-9-]*)(?=[ \t]+[A-Za-z0-9$\"'-]|[ \t]*\)|[ \t]*$)",
    re.M)


def documents(root):
    for top in ("scripts", "configs", "docs"):
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and path.suffix not in (".png", ".h5", ".model", ".gz"):
                yield path
    yield root / "README.md"


def main():
    root, listing = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    paths = {line.strip() for line in listing.read_text().splitlines() if line.strip()}
    names = {pathlib.PurePath(p).name for p in paths}
    names |= {p.name for p in (root / "scripts").glob("forge-*") if p.is_file() and os.access(p, os.X_OK)}
    offenders = []
    for doc in documents(root):
        try:
            text = doc.read_text()
        except UnicodeDecodeError:
            continue
        rel = doc.relative_to(root)

        def where(match):
            return f"{rel}:{text.count(chr(10), 0, match.start()) + 1}"

        for m in BUILD_PATH.finditer(text):
            if m.group(1) not in paths:
                offenders.append(f"{where(m)}: runs {m.group(0)}, which the programs target does not build")
        for m in FORGE_BIN.finditer(text):
            if m.group(1) not in names:
                offenders.append(f"{where(m)}: forge_bin {m.group(1)}: not a program of the programs target")
        for m in COMMAND.finditer(text):
            if m.group(1) not in names:
                offenders.append(f"{where(m)}: runs {m.group(1)}, which the programs target does not build")
    for line in offenders:
        print(line)
    if offenders:
        print(f"{len(offenders)} invocation(s) of programs not built by `cmake --build <build> --target programs`: "
              f"add the program to FORGE_PROGRAMS (CMakeLists.txt) or correct the name "
              f"(known: {', '.join(sorted(names))})")
        return 1
    print(f"programs lint: every invocation in scripts/, configs/, docs/ and README.md is one of the "
          f"{len(names)} programs the target builds or scripts/ holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
