"""A job's trained weights as files: `pnode job export`'s two formats, written and read.

``.safetensors`` holds the model's own tensor names and, in its metadata,
the job (``pnode_job``), the updates applied (``pnode_step``) and the job's
config (``pnode_config``), so any job's model, byte-level ones included,
can be rebuilt from it.

``.gguf`` is llama.cpp's format, for jobs that descend from a GGUF model
(``init``, or the ``init`` of the export it names): the metadata of that
file (architecture, tokenizer, chat template) is copied, the trained
weights replace its tensors (float32, Q/K rows permuted back to
llama.cpp's layout), and ``pnode.job``,
``pnode.step`` and ``pnode.config`` are added. Anything that reads the
original model reads the export: `pwallet infer --model`, `pnode start
--model` and llama.cpp itself. A byte-level job has no tokenizer to put
in such a file, so it is refused.

Both are written to a temporary file beside the target and renamed over
it: a crash leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from pathlib import Path

import gguf as gguf_lib
import numpy as np
import torch

from compute.errors import ComputeError, ModelFileError
from compute.gguf import gguf_name, open_gguf
from compute.hf import hf_state_from_model
from compute.model import Transformer

FORMATS = (".safetensors", ".gguf")


def permute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """HF's Q or K rows in llama.cpp's interleaved-pairs order (inverse of `unpermute_qk`).

    Args:
        w: (n_heads * hd, in) weight in HF row order.
        n_heads: heads in w (query heads for Q, KV heads for K).
    """
    hd = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, hd // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def save_export(path: Path, weights: Mapping[str, torch.Tensor], config_json: str,
                job: str, step: int) -> None:
    """Write a job's whole model to ``path`` (its suffix picks the format, `FORMATS`).

    Args:
        weights: the job model's state dict (`Transformer` names), on the CPU.
        config_json: the job's canonical config (`compute.jobfile.config_json`).
        job: the job id, hex.
        step: the updates applied to ``weights``.

    Raises:
        ModelFileError: an unknown suffix, a GGUF of a byte-level job, or
            weights that are not the config's model.
        OSError: the file cannot be written.
    """
    meta = {"pnode_job": job, "pnode_step": str(step), "pnode_config": config_json}
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        _replace(path, lambda tmp: save_file(_unshared(weights), str(tmp), meta))
    elif path.suffix == ".gguf":
        from compute.jobfile import config_from_json
        from compute.pretrained import gguf_of

        config = config_from_json(config_json)
        template_path = gguf_of(config.init)
        if template_path is None:
            raise ModelFileError("a byte-level job's model has no tokenizer to put in a GGUF "
                                 "file: export it as .safetensors")
        model = _model(config.model, weights, path)
        template = open_gguf(template_path)
        _replace(path, lambda tmp: write_gguf(tmp, model, template, {
            k.replace("_", "."): v for k, v in meta.items()}))
    else:
        raise ModelFileError(f"{path}: expected a file name ending in {' or '.join(FORMATS)}")


def write_gguf(path: Path, model: Transformer, template: gguf_lib.GGUFReader,
               extra: Mapping[str, str]) -> None:
    """Write ``model`` as a GGUF file with ``template``'s metadata plus ``extra`` (strings).

    The output weight is written only when it differs from the embeddings
    (a tied model's file has none; the readers tie them again).
    """
    arch = str(template.fields["general.architecture"].contents())
    writer = gguf_lib.GGUFWriter(str(path), arch=arch)
    for key, f in template.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer's own
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf_lib.GGUFValueType.ARRAY else None
        writer.add_key_value(key, f.contents(), vtype, sub)
    for key, value in extra.items():
        writer.add_string(key, value)
    cfg = model.config
    hf = hf_state_from_model(model)
    if torch.equal(hf["lm_head.weight"], hf["model.embed_tokens.weight"]):
        del hf["lm_head.weight"]
    for name, w in hf.items():
        if name.endswith("q_proj.weight"):
            w = permute_qk(w, cfg.n_heads)
        elif name.endswith("k_proj.weight"):
            w = permute_qk(w, cfg.n_kv_heads)
        array = np.ascontiguousarray(w.detach().to(torch.float32).numpy())
        writer.add_tensor(gguf_name(name), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def export_config(path: Path):
    """The job config in a .safetensors export's metadata (nothing else is read).

    Raises:
        ModelFileError: not an export of pnode's.
    """
    return _read_meta(path)[1]


def load_export(path: Path) -> tuple[Transformer, str]:
    """(the model, the job's config JSON) of a .safetensors export.

    Raises:
        ModelFileError: not an export of pnode's, or weights that are not its config's model.
    """
    from safetensors.torch import load_file

    text, config = _read_meta(path)
    try:
        weights = load_file(str(path))
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc}") from None
    return _model(config.model, weights, path), text


def _read_meta(path: Path):
    from compute.jobfile import config_from_json
    from compute.pretrained import export_config_text, not_an_export

    text = export_config_text(path)
    try:
        return text, config_from_json(text)
    except (ValueError, ComputeError) as exc:
        raise not_an_export(path, exc) from None


def _model(model_config, weights: Mapping[str, torch.Tensor], source: Path) -> Transformer:
    model = Transformer(model_config)
    try:
        model.load_state_dict(dict(weights))
    except RuntimeError as exc:
        raise ModelFileError(f"{source}: the weights are not the job's model: {exc}") from None
    return model.eval()


def _unshared(weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` with a copy of each tensor that shares memory with one before it (tied
    embeddings: safetensors refuses shared tensors)."""
    seen, out = set(), {}
    for name, t in weights.items():
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.contiguous() if ptr not in seen else t.clone()
        seen.add(ptr)
    return out


def _replace(path: Path, write) -> None:
    if not path.parent.is_dir():  # (safetensors would say so in its own error type)
        raise FileNotFoundError(errno.ENOENT, "no such directory", str(path.parent))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
