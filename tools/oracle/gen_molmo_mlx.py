"""The MLX community form of the tiny Molmo (v1): tests/fixtures/molmo_mlx, made by mlx-vlm's own converter, with
mlx-vlm on mlx-cpu as the reference.

The checkpoint is what `mlx_vlm.convert('<base>', mlx_path=..., dtype='float32')` (no quantization) writes for
tests/fixtures/molmo's checkpoint files (<base>: config.json, model.safetensors, preprocessor_config.json,
tokenizer.json, tokenizer_config.json, chat_template.jinja; no goldens, inputs or provenance, which the converter
would copy), run offline on the local directory: model.safetensors under mlx-vlm's key names (its Molmo sanitize
maps model.transformer.* -> language_model.model.* and model.vision_backbone.* -> vision_tower.*), written by
mx.save_safetensors with metadata {"format": "mlx"}, model.safetensors.index.json, config.json as mlx-vlm's
save_config writes it (json.dump, indent 4, keys sorted at the top level), the processor files MolmoProcessor's
save_pretrained writes (processor_config.json, tokenizer_config.json with processor_class and transformers'
is_local / local_files_only, tokenizer.json, chat_template.jinja), preprocessor_config.json copied as it was, and
the model card README.md. The images in inputs/ are molmo's (gen_molmo.write_inputs).

The script checks the conversion against the base tensor by tensor (every tensor equal after the renames, f32, same
shape: nothing transposed, split, merged, added or dropped) and the config (equal to the base's as JSON). The
goldens come from mlx-vlm loading the written fixture, for molmo's variants (image, long, text_only, image_jpeg),
recorded exactly as gen_molmo.py records them."""

import json
import shutil
import tempfile
from pathlib import Path

import common
import gen_molmo
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

BASE = "molmo"
BASE_FILES = ["config.json", "model.safetensors", "preprocessor_config.json", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja"]
# The first two components of every key mlx-vlm writes.
PREFIXES = ["language_model.model", "vision_tower.image_pooling_2d", "vision_tower.image_projector",
            "vision_tower.image_vit", "vision_tower.pad_embed"]
RENAMES = [("model.transformer.", "language_model.model."), ("model.vision_backbone.", "vision_tower.")]


def mlx_key(key: str) -> str:
    for theirs, ours in RENAMES:
        if key.startswith(theirs):
            return ours + key[len(theirs):]
    return key


def build(out: Path) -> None:
    from mlx_vlm import convert

    base = common.FIXTURES / BASE
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "molmo"
        src.mkdir()
        for name in BASE_FILES:
            shutil.copyfile(base / name, src / name)
        out.rmdir()  # mlx_vlm.convert writes into a fresh directory
        convert(str(src), mlx_path=str(out), dtype="float32")
    card = (out / "README.md").read_text()
    assert len(card) < 200 and "/" not in card.replace("image-text-to-text", ""), card
    cross_check(out, base)
    gen_molmo.write_inputs(out)


def cross_check(out: Path, base: Path) -> None:
    """The converted checkpoint against the base: same tensors under the renamed keys, same config."""
    ours, theirs = load_file(str(out / "model.safetensors")), load_file(str(base / "model.safetensors"))
    renamed = {mlx_key(k): v for k, v in theirs.items()}
    if set(ours) != set(renamed):
        raise RuntimeError(f"keys differ: {sorted(set(ours) ^ set(renamed))}")
    for k, v in ours.items():
        if v.dtype != np.float32 or v.shape != renamed[k].shape or not np.array_equal(v, renamed[k]):
            raise RuntimeError(f"{k} is not the base's tensor")
    with safe_open(str(out / "model.safetensors"), "np") as f:
        assert f.metadata() == {"format": "mlx"}, f.metadata()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(ours) and set(index["weight_map"].values()) == {"model.safetensors"}
    if sorted({".".join(k.split(".")[:2]) for k in ours}) != PREFIXES:
        raise RuntimeError(f"key prefixes {sorted({'.'.join(k.split('.')[:2]) for k in ours})}")
    if json.loads((out / "config.json").read_text()) != json.loads((base / "config.json").read_text()):
        raise RuntimeError("mlx_vlm.convert changed config.json's content")


def main() -> None:
    args = common.parse_args(__doc__)
    notes = [
        "MLX community form: what mlx_vlm.convert('<base>', mlx_path='tests/fixtures/molmo_mlx', dtype='float32') "
        "writes (no quantization; everything else mlx-vlm's default), run offline on a directory holding "
        "tests/fixtures/molmo's " + ", ".join(BASE_FILES),
        "weights: mlx-vlm's key names (model.transformer.* -> language_model.model.*, model.vision_backbone.* -> "
        "vision_tower.*), every tensor f32 and equal to the base's (checked: nothing transposed, split, merged, "
        "added or dropped), metadata {\"format\": \"mlx\"}, with model.safetensors.index.json; top-level prefixes: "
        + ", ".join(PREFIXES) + " (checked)",
        "config.json: mlx-vlm's save_config of the base's (nested text_config / vision_config, Molmo's key names), "
        "the same content as tests/fixtures/molmo's (checked), formatted by json.dump with indent 4",
        "processor files as mlx-vlm's MolmoProcessor.save_pretrained writes them: processor_config.json (the image "
        "processor's settings with image_mean / image_std and processor_class), tokenizer_config.json (with "
        "processor_class, and transformers' is_local / local_files_only); preprocessor_config.json, tokenizer.json "
        "and chat_template.jinja equal the base's; README.md is mlx-vlm's model card (front matter only)",
        "transformers has no Molmo v1; mlx-vlm is the reference and there is no second implementation",
        "mlx-vlm's Molmo processor takes one image per prompt: no two-image variant",
        gen_molmo.NOTES[-1],
    ]
    common.mlx_fixture(
        "molmo_mlx", "gen_molmo_mlx.py", build, gen_molmo.load_processor, gen_molmo.run_variant, gen_molmo.variants(),
        check=args.check, reference="mlx-vlm Molmo (models/molmo) on mlx-cpu, fp32; mlx-vlm MolmoProcessor",
        notes=notes,
    )


if __name__ == "__main__":
    main()
