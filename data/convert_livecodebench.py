"""Convert LiveCodeBench (code_generation_lite) into a mentor PROBLEMS set.

    python -m mentor.data.convert_livecodebench OUT.parquet [--from DIR] [--version release_v5]
        [--dataset livecodebench/code_generation_lite] [--public-only] [--max-test-mb 256]

then ``mentor build --base OUT.parquet``. The release is read as LiveCodeBench
publishes it: the ``test*.jsonl`` files of the dataset repository (``release_vN``
= ``test.jsonl`` .. ``testN.jsonl``, ``vN`` = that file alone, ``vA_vB`` = files A
to B), from ``--from DIR`` (a copy of the repository) or else from the Hugging Face
cache (``huggingface_hub``, offline), one JSON line at a time: no loading script,
which `datasets` >= 4 refuses. A line or row that cannot be used (not UTF-8, not a
JSON object, fields of the wrong type, tests that cannot be decoded) is left out
and counted; the rest of its file is kept.

Fields read (LiveCodeBench's ``lcb_runner/benchmarks/code_generation.py``):
``question_id``, ``question_title``, ``question_content``, ``platform``,
``contest_id``, ``contest_date``, ``starter_code``, ``difficulty``,
``public_test_cases`` (JSON), ``private_test_cases`` (JSON, or in the release
base64 of zlib of a pickled JSON string), ``metadata`` (JSON; ``func_name`` for
functional problems).

Tests become mentor's code labels (`pipeline.schemas.code_label`, run by `mentor.training.code_verify`):

- ``testtype: stdin``: ``kind: "stdio"``, one ``{input, output}`` case each, run in
  the sandbox with the input on stdin, the output compared line by line.
- ``testtype: functional`` (LeetCode: ``class Solution: def f(self, ...)``): the
  verifier has no method-call kind, so the cases become assert-style tests of the
  ``humaneval`` kind: ``check(candidate)`` calls ``candidate(*args)`` for every
  case (LiveCodeBench's input format: one JSON value per line = one argument; the
  output one JSON value) and compares as LiveCodeBench's grader does (a tuple
  answer counts as a list), recording every result before the one assert, so
  whether one answer passed never changes which calls follow. The entry point
  is ``Solution.<func_name>``: the method of a ``Solution()`` instance, which the
  verifier's worker must resolve; a verifier that does not accept such an entry
  point (see `functional_supported`) would score every one of them 0, so such
  problems are then left out and counted (``functional_unsupported``).

Private tests are decoded without trusting the data: base64, zlib with a size
cap, then a restricted unpickler that builds plain values only (no class or
function can be named, so nothing runs), and the result must be a JSON string.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import pickle
import sys
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from mentor.pipeline.errors import ConfigError, DataError
from mentor.pipeline.io import write_parquet_atomic
from mentor.pipeline.outdir import disk_error
from mentor.pipeline.schemas import code_label, parse_code_label

DATASET = "livecodebench/code_generation_lite"
MAX_RELEASE = 6
STDIN_NOTE = "Read the input from standard input and write the answer to standard output."
STARTER_NOTE = "Complete this starter code (the method of class Solution is what the tests call):"
TEXT_FIELDS = ("question_content", "starter_code", "question_title")


class PrivateTestsError(ValueError):
    """The private tests cannot be decoded safely (the reason is the message)."""


class _PlainUnpickler(pickle.Unpickler):
    """Builds str/bytes/int/float/list/dict/tuple/bool/None only: naming any class or function is refused."""

    def find_class(self, module: str, name: str):  # noqa: D401 - pickle's hook
        raise pickle.UnpicklingError(f"private tests name {module}.{name}; only plain values are allowed")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("private tests use a persistent id; only plain values are allowed")


def decode_private(blob: str, max_bytes: int = 256 << 20) -> list[dict]:
    """LiveCodeBench's ``private_test_cases``: a JSON list, or base64(zlib(pickle(JSON string))), decoded safely."""
    if max_bytes < 1:  # zlib reads a max_length of 0 as "no limit"
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    if not isinstance(blob, str):
        raise PrivateTestsError(f"a {type(blob).__name__}, not a string")
    text = blob.strip()
    if text.startswith("["):
        return _cases(json.loads(text))
    try:
        packed = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise PrivateTestsError(f"not base64 ({exc})") from None
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(packed, max_bytes)
    except zlib.error as exc:
        raise PrivateTestsError(f"not zlib data ({exc})") from None
    if inflater.unconsumed_tail:
        raise PrivateTestsError(f"over {max_bytes >> 20} MiB decompressed; raise --max-test-mb to keep the problem")
    try:
        value = _PlainUnpickler(io.BytesIO(raw)).load()
    except Exception as exc:  # whatever a malformed pickle raises: unreadable, never run
        raise PrivateTestsError(f"not a pickled string ({exc})") from None
    if not isinstance(value, str):
        raise PrivateTestsError(f"the pickle holds a {type(value).__name__}, not a JSON string")
    return _cases(json.loads(value))


def _cases(value: Any) -> list[dict]:
    if not isinstance(value, list) or not all(
        isinstance(c, dict) and isinstance(c.get("input"), str) and isinstance(c.get("output"), str)
        and isinstance(c.get("testtype", "stdin"), str) for c in value
    ):
        raise PrivateTestsError("not a list of {input, output, testtype} cases")
    return value


def functional_tests(cases: list[dict]) -> str:
    """`check(candidate)` source for LeetCode-style cases (JSON data only, embedded as one string literal)."""
    data = [[[json.loads(line) for line in c["input"].split("\n")], json.loads(c["output"])] for c in cases]
    return (
        "import json\n"
        f"CASES = json.loads({json.dumps(data)!r})\n"
        "\n"
        "def check(candidate):\n"
        "    # Every case is called, whatever earlier answers were; one assert at the end.\n"
        "    results = []\n"
        "    for args, expected in CASES:\n"
        "        try:\n"
        "            got = candidate(*args)\n"
        "        except Exception:\n"
        "            results.append(False)\n"
        "            continue\n"
        "        if isinstance(got, tuple):  # LiveCodeBench's grader: a tuple answer compares as a list\n"
        "            got = list(got)\n"
        "        results.append(got == expected)\n"
        "    assert all(results), f'{results.count(False)} of {len(results)} cases failed'\n"
    )


def functional_supported() -> bool:
    """Whether mentor's code verifier accepts a ``Solution.<method>`` entry point."""
    try:
        parse_code_label(code_label(functional_tests([{"input": "1", "output": "1"}]), "Solution.f", "humaneval", setup=""))
    except ValueError:
        return False
    return True


def _problem_text(row: dict, functional: bool) -> str:
    text = str(row.get("question_content") or "").strip()
    starter = str(row.get("starter_code") or "").rstrip()
    if functional or starter:
        return f"{text}\n\n{STARTER_NOTE}\n```python\n{starter}\n```"
    return f"{text}\n\n{STDIN_NOTE}"


def _func_name(row: dict) -> str | None:
    meta = row.get("metadata")
    try:
        meta = json.loads(meta) if isinstance(meta, str) and meta.strip() else (meta or {})
    except ValueError:
        return None
    name = meta.get("func_name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) and name.isidentifier() else None


def problems_from_rows(rows: Iterable[dict], private: bool = True, source: str = DATASET, max_bytes: int = 256 << 20,
                       functional: bool | None = None) -> tuple[pa.Table, Counter]:
    """PROBLEMS rows from LiveCodeBench rows; the counter says what was left out and why.

    `functional`: keep functional problems (default: when the verifier can check them, `functional_supported`).
    """
    keep_functional = functional_supported() if functional is None else functional
    out: dict[str, list] = {k: [] for k in ("problem_id", "domain", "problem", "label", "data_source")}
    counts: Counter = Counter()
    seen: set[str] = set()
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    for row in rows:
        if not isinstance(row, dict):
            counts["not_an_object"] += 1
            continue
        raw_id = row.get("question_id")
        if raw_id is not None and (isinstance(raw_id, bool) or not isinstance(raw_id, (str, int))):
            counts["question_id_invalid"] += 1
            continue
        qid = str(raw_id if raw_id is not None else "").strip()
        if not qid:
            counts["no_question_id"] += 1
            continue
        if not all(isinstance(row.get(k), (str, type(None))) for k in TEXT_FIELDS):
            counts["text_not_a_string"] += 1
            continue
        if qid in seen:
            counts["duplicate_question_id"] += 1
            continue
        try:
            public = row.get("public_test_cases")
            if public is not None and not isinstance(public, str):
                raise PrivateTestsError(f"public tests are a {type(public).__name__}, not a JSON string")
            cases = _cases(json.loads(public)) if public else []
            if private and row.get("private_test_cases"):
                try:
                    cases += decode_private(row["private_test_cases"], max_bytes)
                except PrivateTestsError as exc:
                    raise PrivateTestsError(f"private tests {exc}") from None
        except PrivateTestsError as exc:
            counts["too_large" if "MiB" in str(exc) else "tests_unreadable"] += 1
            _note(f"lcb/{qid}: left out of the set: {exc}")
            continue
        except (ValueError, TypeError, RecursionError):
            counts["tests_unreadable"] += 1
            continue
        if not cases:
            counts["no_tests"] += 1
            continue
        kinds = {c.get("testtype", "stdin") for c in cases}
        if kinds == {"functional"}:
            name = _func_name(row)
            if name is None:
                counts["functional_without_func_name"] += 1
                continue
            if not keep_functional:
                counts["functional_unsupported"] += 1
                continue
            try:
                tests = functional_tests(cases)
            except (ValueError, RecursionError):  # an input line or output that is not JSON (or nested beyond reading)
                counts["tests_unreadable"] += 1
                continue
            label = code_label(tests, f"Solution.{name}", "humaneval", setup="")
            counts["functional"] += 1
        elif kinds == {"stdin"}:
            label = code_label(json.dumps([{"input": c["input"], "output": c["output"]} for c in cases]), None, "stdio")
            counts["stdin"] += 1
        else:
            counts["mixed_test_types"] += 1
            continue
        seen.add(qid)
        out["problem_id"].append(f"lcb/{qid}")
        out["domain"].append("code")
        out["problem"].append(_problem_text(row, kinds == {"functional"}))
        out["label"].append(label)
        out["data_source"].append(source)
    return pa.table(out), counts


def _note(msg: str) -> None:
    print(f"note: {msg}", file=sys.stderr)


# --------------------------------------------------------------------------- the release files


def release_files(version: str) -> list[str]:
    """LiveCodeBench's file names for a version tag (release_vN, release_latest, vN, vA_vB)."""
    def name(i: int) -> str:
        return "test.jsonl" if i == 1 else f"test{i}.jsonl"

    if version == "release_latest":
        return [name(i) for i in range(1, MAX_RELEASE + 1)]
    if version.startswith("release_v") and version[9:].isdigit() and 1 <= int(version[9:]) <= MAX_RELEASE:
        return [name(i) for i in range(1, int(version[9:]) + 1)]
    if version.startswith("v"):
        parts = version[1:].split("_v")
        if all(p.isdigit() and 1 <= int(p) <= MAX_RELEASE for p in parts) and len(parts) in (1, 2):
            lo, hi = int(parts[0]), int(parts[-1])
            if lo <= hi:
                return [name(i) for i in range(lo, hi + 1)]
    raise ConfigError(f"--version {version}: not a LiveCodeBench version tag (release_v1..release_v{MAX_RELEASE}, "
                      f"release_latest, v1..v{MAX_RELEASE}, or vA_vB such as v5_v6)")


def locate_files(version: str, folder: str | None, dataset: str = DATASET) -> list[Path]:
    """The version's ``test*.jsonl`` files in `folder`, else in the local Hugging Face cache (never downloaded)."""
    names = release_files(version)
    if folder:
        root = Path(folder)
        if not root.is_dir():
            raise ConfigError(f"--from {folder}: no such folder; give the folder that holds LiveCodeBench's test*.jsonl files")
    else:
        try:
            from huggingface_hub import snapshot_download  # optional (the datasets extra)
        except ImportError:
            raise ConfigError("reading the Hugging Face cache needs huggingface_hub; pip install 'mentor[datasets]', "
                              "or pass --from DIR") from None
        try:
            root = Path(snapshot_download(dataset, repo_type="dataset", allow_patterns=names, local_files_only=True))
        except Exception as exc:  # offline and not cached: LocalEntryNotFoundError and kin
            raise ConfigError(f"{dataset}: not in the local Hugging Face cache ({type(exc).__name__}); download it where "
                              f"there is network (huggingface-cli download {dataset} --repo-type dataset) or pass --from DIR") from None
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise ConfigError(f"{root}: {version} needs {', '.join(names)}; missing {', '.join(missing)}")
    return [root / n for n in names]


def read_rows(files: list[Path], counts: Counter) -> Iterator[dict]:
    """The rows of LiveCodeBench's JSONL files, one line at a time; a line that is not a UTF-8 JSON object is
    left out and counted (``line_not_utf8``, ``line_not_json``), so one bad line never costs the good ones."""
    for f in files:
        with open(f, "rb") as fh:
            for raw in fh:
                if not raw.strip():
                    continue
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    counts["line_not_utf8"] += 1
                    continue
                try:
                    row = json.loads(text)
                except (ValueError, RecursionError):
                    counts["line_not_json"] += 1
                    continue
                yield row


def _megabytes(text: str) -> int:
    """--max-test-mb: a whole number of MiB, 1 to 65536 (0 would switch zlib's cap off)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MiB") from None
    if not 1 <= value <= 65536:
        raise argparse.ArgumentTypeError(f"{value} is not between 1 and 65536 MiB (the cap on decompressed private tests)")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="The PROBLEMS Parquet file to write (then: mentor build --base OUT).")
    ap.add_argument("--from", dest="folder", help="A folder with LiveCodeBench's test*.jsonl (default: the HF cache).")
    ap.add_argument("--dataset", default=DATASET, help="The dataset repository in the HF cache.")
    ap.add_argument("--version", default="release_v5", help="release_vN, release_latest, vN or vA_vB (default release_v5).")
    ap.add_argument("--public-only", action="store_true", help="Leave the private tests out (they are decoded safely).")
    ap.add_argument("--max-test-mb", type=_megabytes, default=256,
                    help="Leave out a problem whose private tests inflate beyond this many MiB (1 to 65536).")
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        if out.is_dir():
            raise ConfigError(f"{out}: is a folder; give the Parquet file to write, e.g. {out / 'livecodebench.parquet'}")
        files = locate_files(args.version, args.folder, args.dataset)
        lines: Counter = Counter()
        table, counts = problems_from_rows(read_rows(files, lines), private=not args.public_only, source=args.dataset,
                                           max_bytes=args.max_test_mb << 20)
        counts.update(lines)
        if table.num_rows == 0:
            raise DataError(f"{', '.join(map(str, files))}: no usable problem ({dict(counts)})")
        write_parquet_atomic(table, out, dataset="problems")
    except (ConfigError, DataError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a file that cannot be read, a folder that cannot be written
        print(f"Error: {disk_error(exc, exc.filename or str(out))}", file=sys.stderr)
        return 1
    if lines:
        _note(f"{sum(lines.values())} line(s) of the files are not UTF-8 JSON objects and were left out ({dict(lines)})")
    if counts.get("functional_unsupported"):
        _note(f"{counts['functional_unsupported']} functional (LeetCode) problem(s) left out: this mentor's code verifier "
              "cannot call a method of class Solution")
    print(json.dumps({"problems": table.num_rows, "files": [f.name for f in files], "counts": dict(counts)}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
