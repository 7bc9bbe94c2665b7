"""The Hugging Face Hub form of the served fixtures: tests/fixtures/<name>_hub for llama, qwen2, qwen3,
gemma3_text, qwen2_vl, qwen2_5_vl, qwen3_vl, gemma3, llava, molmo2 and gemma3n.

The fixtures are what transformers 5.24's `save_pretrained` writes. The checkpoints users download were mostly
written by transformers 4, and differ in form but not in meaning:

- config.json: `rope_theta` beside a legacy `rope_scaling` (its type spelled `type`, Qwen2-VL's M-RoPE as `mrope`)
  instead of `rope_parameters`; no `layer_types` (Gemma 3 says `sliding_window_pattern` and
  `rope_local_base_freq`); Qwen2-VL's and Qwen2.5-VL's text fields flat beside `vision_config` (Qwen2.5-VL's vision fields without
  rotary parameters, the channels as `in_chans`); Qwen3-VL's interleaved sections in a `rope_scaling` of type
  `default`, its vision config under the old model type `qwen3_vl`; sub-configs sparse, every field
  equal to its config class's default left out (LLaVA 1.5's `text_config`); `torch_dtype` for `dtype`;
- tensor names: the CLIP and SigLIP towers under `vision_tower.vision_model.`; the vision-language checkpoints
  sharded in two files with `model.safetensors.index.json`;
- the image processor flat in `preprocessor_config.json`, `processor_config.json` keeping the processor's own
  fields; the chat template in the processor's `chat_template.json` (vision-language) or in
  `tokenizer_config.json` (text).

Molmo2's Hub checkpoints (allenai/Molmo2-4B, -8B) were written by allenai's remote code, not by transformers, so
their config is the one transformers 5.24's Molmo2Config reads as legacy (its `__post_init__` hooks and
`attribute_map`); the tensor names are already the Hub's (transformers 5.24 saves Molmo2 back to them, and the
fixture's post-save step restores the Hub's embedding split, `wte.embedding` [vocab_size, hidden] +
`wte.new_embedding` [additional_vocab_size, hidden]). Its Hub form changes:

- the vision config under `vit_config` (model type `molmo2`), its input size, patch and position-table size as
  `image_default_input_size`, `image_patch_size` and `image_num_pos`, beside the remote code's own fields
  (`float32_attention`, `residual_dropout`);
- the ViT deeper in the config than in the weights, as on the Hub: Molmo2-4B's and -8B's `vit_config` says 27
  layers and `vit_layers` [-3, -9] (layers 24 and 18), and the checkpoints hold resblocks 0 to 24 only, the
  ones the adapter reads (the remote code builds max(layer) + 1 of them; transformers' Molmo2Config and mlx-vlm's
  molmo2 config say so in their workarounds, and vLLM builds the same). Here the config says one layer more
  than the fixture's tower and the checkpoint holds the fixture's whole tower: `vit_layers` are the fixture's
  feature layers counted from the declared depth. transformers resolves them modulo the declared depth and
  builds max(layer) + 1 layers, so it loads every stored tensor and none is missing;
- the adapter's feature layers as `vit_layers` (model type `molmo2`, beside `float32_attention`,
  `pooling_attention_mask` and the dropouts), its biases (`attention_bias` true, `mlp_bias` false) left to the
  class defaults as the Hub's config leaves them;
- the text config's legacy names `qkv_bias` and `layer_norm_eps` (Molmo2TextConfig's `attribute_map`),
  `rope_theta` with `rope_scaling` null, `rope_scaling_layers` null (every layer), `use_qk_norm`, the dropouts,
  no token ids (generation_config.json has them);
- `auto_map` naming the remote code's classes (transformers uses its own, the model type being registered).

Gemma 3n's Hub checkpoints (google/gemma-3n-E2B-it, -E4B-it) were written by transformers 4.53
(`convert_gemma3n_weights.py`, then `save_pretrained`). Their tensor names are the ones transformers 5.24 writes
(`model.language_model.*`, `model.audio_tower.*`, `model.vision_tower.timm_model.*`, `model.embed_audio.*`,
`model.embed_vision.*`, the head tied and not stored; transformers 5.24 has no conversion mapping for `gemma3n`,
only `gemma3n_text`'s prefix change for loading the text model alone), so the tensors are the fixture's, sharded.
The config differs:

- `text_config`: transformers 4.53's `Gemma3nTextConfig` took `rope_theta`, `rope_scaling` and
  `rope_local_base_freq` (saved as such, `rope_scaling` null) where 5.24 saves `rope_parameters` per layer type
  (its `convert_rope_params_to_dict` reads the legacy three back); `layer_types` saved as now; two fields 5.24 has no
  use for, kept from the Hub's config: `query_pre_attn_scalar` (256 on the Hub; Gemma 3n's attention is unscaled,
  in 4.53 as in 5.24) and `altup_lr_multiplier` (1.0, a training setting); `tie_word_embeddings` left out, equal to
  the class default (4.53's `to_diff_dict` drops a sub-config field equal to its class default; the token ids stay,
  the fixture's differing from the class's 0, 1, 2); `torch_dtype` in every sub-config (the conversion sets each
  sub-config's dtype);
- the root: `torch_dtype`; the instruction-tuned checkpoints' `eos_token_id` ([<eos>, <end_of_turn>]); no
  `use_cache` or `tie_word_embeddings` (4.53's `Gemma3nConfig` took neither: its sub-configs, the soft-token
  counts, the six token ids and `initializer_range`);
- the processor: `preprocessor_config.json` holding the feature extractor's and the image processor's fields flat in
  one object (the conversion script writes their union, both classes saving to that one file),
  `processor_config.json` the processor's own `audio_seq_length` and `image_seq_length`.

Each Hub form gets the fixture's goldens and inputs unchanged, and is checked by loading it back with
transformers: the processor must give the goldens' prompt, `input_ids` and `pixel_values` (Gemma 3n:
`input_features` and `input_features_mask`, and every feature extractor setting) exactly, and the model the goldens'
logits within the check's bound. `--check` rebuilds every Hub form in memory, compares it with the committed one,
and repeats the load-back check. `gen_hub.py [--check] NAME ...` makes or checks only the named fixtures' forms."""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import common
import torch
from safetensors.torch import load_file, save_file

TEXT = ["llama", "qwen2", "qwen3", "gemma3_text"]
VLM = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3", "llava", "molmo2", "gemma3n"]
# Where transformers 4 kept the vision towers that transformers 5 saves one level up.
TOWER_RENAMES = {"gemma3": ("vision_tower.", "vision_tower.vision_model."),
                 "llava": ("vision_tower.", "vision_tower.vision_model.")}


def legacy_rope(cfg: dict, per_kind: bool) -> None:
    """`rope_parameters` back to `rope_theta` + `rope_scaling` (+ `rope_local_base_freq` per kind)."""
    rope = cfg.pop("rope_parameters", None)
    if rope is None:
        return
    if per_kind:
        full, sliding = dict(rope["full_attention"]), dict(rope["sliding_attention"])
        cfg["rope_theta"] = full.pop("rope_theta")
        cfg["rope_local_base_freq"] = sliding.pop("rope_theta")
        assert sliding.get("rope_type", "default") == "default", sliding
        if full.get("rope_type", "default") != "default":
            cfg["rope_scaling"] = full
        return
    rope = dict(rope)
    cfg["rope_theta"] = rope.pop("rope_theta")
    kind = rope.pop("rope_type", "default")
    if cfg.get("model_type") == "qwen3_vl_text":
        # Qwen3-VL's Hub configs keep the sections, interleaved, in a `rope_scaling` of type `default`.
        cfg["rope_scaling"] = {"rope_type": kind, **rope}
    elif "mrope_section" in rope:
        rope.pop("mrope_interleaved", None)
        cfg["rope_scaling"] = {"type": "mrope", **rope}
    elif kind != "default":
        cfg["rope_scaling"] = {"rope_type": kind, **rope}


def sparse(cfg: dict, config_class) -> dict:
    """Only the fields that differ from `config_class`'s defaults (and the model type)."""
    defaults = config_class().to_dict()
    return {k: v for k, v in cfg.items() if k == "model_type" or defaults.get(k, object()) != v}


def text_form(cfg: dict) -> dict:
    cfg = dict(cfg)
    gemma = cfg.get("model_type") == "gemma3_text"
    legacy_rope(cfg, per_kind=gemma)
    types = cfg.pop("layer_types", None)
    if gemma:
        # The pattern that derives these layer types (layer i slides unless (i + 1) % n == 0).
        cfg.pop("_sliding_window_pattern", None)
        derive = lambda n: ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(len(types))]
        cfg["sliding_window_pattern"] = next(n for n in range(1, len(types) + 1) if derive(n) == types)
    else:
        assert types is None or all(t == "full_attention" for t in types), types
    return cfg


# What a Hub form adds to its fixture's provenance notes.
NOTES = {
    "molmo2": ["Molmo2's Hub config is allenai's remote-code form (vit_config, vit_layers, qkv_bias, layer_norm_eps, "
               "rope_theta, auto_map); the tensor names are the fixture's, already the Hub's. As on the Hub "
               "(Molmo2-4B/-8B: 27 ViT layers declared, resblocks 0-24 stored, vit_layers [-3, -9]), vit_config "
               "declares one layer more than the checkpoint holds and vit_layers count from that depth; transformers "
               "and allenai's code build max(layer) + 1 layers, every stored one"],
    "gemma3n": ["Gemma 3n's Hub config is transformers 4.53's (google/gemma-3n-E2B-it): text_config with rope_theta, "
                "rope_local_base_freq and rope_scaling null, layer_types, the Hub's query_pre_attn_scalar (256) and "
                "altup_lr_multiplier (1.0), which transformers ignores, no tie_word_embeddings; torch_dtype in every "
                "sub-config; eos_token_id at the root, no use_cache or tie_word_embeddings there; the tensor names "
                "are the fixture's, as 4.53 wrote them; the feature extractor and image processor flat in one "
                "preprocessor_config.json, as the conversion script writes it"],
}
# How many layers Molmo2's Hub-form `vit_config` declares beyond the tower the checkpoint holds (Molmo2-4B and -8B:
# 27 declared, 25 stored; the adapter reads up to the last stored one).
MOLMO2_UNSTORED_VIT_LAYERS = 1


def molmo2_hub_config(cfg: dict) -> dict:
    """Molmo2's config.json as allenai's remote code writes it on the Hub (see the module docstring)."""
    text, vision = dict(cfg.pop("text_config")), dict(cfg.pop("vision_config"))
    adapter = dict(cfg.pop("adapter_config"))
    rope = dict(text.pop("rope_parameters"))
    assert rope.pop("rope_type", "default") == "default" and not rope.keys() - {"rope_theta"}, rope
    layers = text["num_hidden_layers"]
    assert text.pop("rope_scaling_layers") == list(range(layers)), "Molmo2's Hub configs scale every layer (null)"
    assert text.pop("tie_word_embeddings") is False and not text.pop("norm_after")
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        text.pop(k, None)
    text.update(rope_theta=rope["rope_theta"], rope_scaling=None, rope_scaling_layers=None, norm_after=False,
                qkv_bias=text.pop("attention_bias"), layer_norm_eps=text.pop("rms_norm_eps"), use_qk_norm=True,
                embedding_dropout=0.0, residual_dropout=0.0)

    stored = vision["num_hidden_layers"]
    declared = stored + MOLMO2_UNSTORED_VIT_LAYERS
    assert vision.pop("attention_bias") is True and vision.pop("num_channels") == 3, vision
    vision.update(model_type="molmo2", num_hidden_layers=declared, float32_attention=True, residual_dropout=0.0,
                  image_default_input_size=vision.pop("image_size"), image_patch_size=vision.pop("patch_size"),
                  image_num_pos=vision.pop("num_position_embeddings"))

    # The fixture's feature layers counted from the declared depth: the same layers, negative as on the Hub
    # (-3 and -9 of 27), and the deepest one the last the checkpoint holds.
    feature = [layer % stored for layer in adapter.pop("vision_feature_layer")]
    assert max(feature) == stored - 1, f"the adapter must read the tower's last layer to store it whole: {feature}"
    assert adapter.pop("attention_bias") is True and adapter.pop("mlp_bias") is False, adapter
    adapter.update(model_type="molmo2", vit_layers=[layer - declared for layer in feature], float32_attention=True,
                   pooling_attention_mask=True, image_feature_dropout=0.0, residual_dropout=0.0)

    cfg.update(text_config=text, vit_config=vision, adapter_config=adapter, use_cache=True,
               auto_map={"AutoConfig": "configuration_molmo2.Molmo2Config",
                         "AutoModelForImageTextToText": "modeling_molmo2.Molmo2ForConditionalGeneration"})
    return cfg


# Fields google/gemma-3n-E2B-it's text_config carries that transformers (4.53 and 5.24) never reads.
GEMMA3N_UNREAD = {"query_pre_attn_scalar": 256, "altup_lr_multiplier": 1.0}


def gemma3n_hub_config(cfg: dict) -> dict:
    """Gemma 3n's config.json as transformers 4.53 wrote google/gemma-3n-E2B-it's (see the module docstring)."""
    dtype = cfg["torch_dtype"]
    text = dict(cfg.pop("text_config"))
    legacy_rope(text, per_kind=True)
    text.setdefault("rope_scaling", None)
    assert text["layer_types"], "transformers 4.53 saved Gemma 3n's layer_types"
    # Equal to the class default, which 4.53's to_diff_dict leaves out of a sub-config.
    assert text.pop("tie_word_embeddings") is True
    text.update(GEMMA3N_UNREAD, torch_dtype=dtype)
    cfg["text_config"] = text
    for sub in ("audio_config", "vision_config"):
        cfg[sub] = dict(cfg[sub], torch_dtype=dtype)
    # 4.53's Gemma3nConfig had no use_cache, and tie_word_embeddings only as the base class's default.
    assert cfg.pop("use_cache") is True and cfg.pop("tie_word_embeddings") is True
    # The instruction-tuned checkpoints stop on <eos> and <end_of_turn> (the conversion's include_chat_template).
    cfg["eos_token_id"] = text["eos_token_id"]
    return cfg


def hub_config(name: str, cfg: dict) -> dict:
    cfg = dict(cfg)
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    if name in TEXT:
        return text_form(cfg)
    if name == "molmo2":
        return molmo2_hub_config(cfg)
    if name == "gemma3n":
        return gemma3n_hub_config(cfg)
    text = text_form(cfg.pop("text_config"))
    if name in ("qwen2_vl", "qwen2_5_vl"):
        # Qwen2-VL-2B and Qwen2.5-VL-3B on the Hub: the text fields flat beside vision_config.
        text.pop("model_type")
        cfg.update(text)
        if name == "qwen2_5_vl":
            # Qwen2.5-VL-3B's vision_config: no rotary parameters (transformers 5 writes the default axial ones),
            # no model_type, the channels as `in_chans` beside `spatial_patch_size`.
            vision = dict(cfg["vision_config"])
            assert vision.pop("rope_parameters") == {"rope_theta": 10000.0, "rope_type": "axial"}, vision
            vision.pop("model_type")
            vision["in_chans"] = vision.pop("in_channels")
            vision["spatial_patch_size"] = vision["patch_size"]
            cfg["vision_config"] = vision
    elif name == "qwen3_vl":
        # Qwen3-VL-2B's config: text_config nested (with rope_scaling), the vision config without rotary parameters
        # and under the old model_type transformers rewrites.
        cfg["text_config"] = text
        vision = dict(cfg["vision_config"])
        assert vision.pop("rope_parameters") == {"rope_theta": 10000.0, "rope_type": "axial"}, vision
        vision["model_type"] = "qwen3_vl"
        cfg["vision_config"] = vision
    elif name == "llava":
        from transformers import LlamaConfig
        cfg["text_config"] = sparse(text, LlamaConfig)
    else:
        cfg["text_config"] = text
    return cfg


def split_processor(fixture: Path, out: Path) -> None:
    proc = json.loads((fixture / "processor_config.json").read_text())
    image = proc.pop("image_processor")
    if "feature_extractor" in proc:
        # Gemma 3n: the feature extractor's and the image processor's fields in one object, as
        # convert_gemma3n_weights.py writes preprocessor_config.json ({**feature_extractor, **image_processor}).
        features = proc.pop("feature_extractor")
        assert not features.keys() & image.keys(), features.keys() & image.keys()
        image = {**features, **image}
    image["processor_class"] = proc["processor_class"]
    (out / "preprocessor_config.json").write_text(json.dumps(image, indent=2, sort_keys=True) + "\n")
    (out / "processor_config.json").write_text(json.dumps(proc, indent=2, sort_keys=True) + "\n")


def build(name: str, out: Path) -> None:
    fixture = common.FIXTURES / name
    out.mkdir(parents=True)
    cfg = json.loads((fixture / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(hub_config(name, cfg), indent=2, sort_keys=True) + "\n")
    for f in ["tokenizer.json", "generation_config.json"]:
        shutil.copy(fixture / f, out / f)
    for d in ["goldens", "inputs"]:
        if (fixture / d).is_dir():
            shutil.copytree(fixture / d, out / d)
    template = (fixture / "chat_template.jinja").read_text()
    tok_cfg = json.loads((fixture / "tokenizer_config.json").read_text())
    if name in VLM:
        split_processor(fixture, out)
        (out / "chat_template.json").write_text(json.dumps({"chat_template": template}, indent=2) + "\n")
    else:
        tok_cfg["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, sort_keys=True) + "\n")
    tensors = load_file(fixture / "model.safetensors")
    old, new = TOWER_RENAMES.get(name, ("", ""))
    if old:
        tensors = {(new + k[len(old):] if k.startswith(old) else k): v for k, v in tensors.items()}
    keys = sorted(tensors)
    if name in VLM:
        # Sharded as the Hub's checkpoints are: two files and model.safetensors.index.json.
        halves = [keys[: len(keys) // 2], keys[len(keys) // 2:]]
        weight_map = {}
        for i, part in enumerate(halves, 1):
            shard = f"model-{i:05d}-of-{len(halves):05d}.safetensors"
            save_file({k: tensors[k] for k in part}, out / shard, metadata={"format": "pt"})
            weight_map.update({k: shard for k in part})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    else:
        save_file({k: tensors[k] for k in keys}, out / "model.safetensors", metadata={"format": "pt"})
    # The fixture's provenance (its reference made the goldens), with what this form is and its own files.
    provenance = json.loads((fixture / "provenance.json").read_text())
    provenance["generator"] = "tools/oracle/gen_hub.py"
    provenance["command"] = "tools/oracle/regen.sh hub  (or: $ORACLE_VENV/bin/python tools/oracle/gen_hub.py)"
    provenance["form_of"] = f"tests/fixtures/{name}"
    provenance["checkpoint_sha256"] = {
        f.name: common.sha256(f) for f in sorted(out.iterdir()) if f.is_file() and f.name != "provenance.json"
    }
    provenance["notes"] = provenance.get("notes", []) + [
        "the Hub form of the fixture: legacy config fields, legacy tensor names, the processor and chat template "
        "where transformers 4 saved them; goldens and inputs are the fixture's, and transformers reads this form "
        "back to them (gen_hub.py --check)"
    ] + NOTES.get(name, [])
    (out / "provenance.json").write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")


def load_back(name: str, hub: Path) -> float:
    """transformers on the Hub form against the fixture's goldens: the largest logit difference."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    worst = 0.0
    goldens = sorted((hub / "goldens").glob("*.json"))
    auto = AutoModelForCausalLM if name in TEXT else AutoModelForImageTextToText
    model, info = auto.from_pretrained(hub, attn_implementation="eager", dtype=torch.float32,
                                       output_loading_info=True)
    model.eval()
    # Every parameter from the checkpoint and every stored tensor used (Molmo2's declared-but-unstored ViT
    # layers are not built).
    unread = {k: sorted(v) for k, v in info.items() if k in ("missing_keys", "unexpected_keys") and v}
    assert not unread, f"{name}_hub: {unread}"
    if name not in TEXT:
        # The fixtures' goldens were made with the PIL image backend.
        processor, _ = common.load_processor(hub)
        if name == "gemma3n":
            # Every feature extractor setting read back from the flat preprocessor_config.json.
            fixture = json.loads((common.FIXTURES / name / "processor_config.json").read_text())["feature_extractor"]
            read = processor.feature_extractor.to_dict()
            differ = {k: (v, read.get(k)) for k, v in fixture.items() if read.get(k) != v}
            assert not differ, f"{name}_hub: the feature extractor reads back otherwise: {differ}"
    for path in goldens:
        meta = json.loads(path.read_text())
        g = load_file(path.with_suffix(".safetensors"))
        if name in TEXT:
            inputs = {"input_ids": g["input_ids"].reshape(1, -1)}
        else:
            prompt = processor.apply_chat_template(meta["messages"], add_generation_prompt=True, tokenize=False)
            assert prompt == meta["prompt"], f"{name}_hub/{path.stem}: the chat template renders another prompt"
            images = [common.load_image(hub, p) for p in meta.get("images", [])]
            clips = [common.load_audio(hub, p) for p in meta.get("audio", [])]
            media = {"audio": clips} if clips else {}
            inputs = dict(processor(text=prompt, images=images or None, return_tensors="pt", **media))
            assert inputs["input_ids"][0].tolist() == meta["input_ids"], f"{name}_hub/{path.stem}: input_ids"
            for key in ("pixel_values", "input_features", "input_features_mask"):
                if key in g:
                    diff = (inputs[key].float() - g[key].float()).abs().max().item()
                    assert diff == 0.0, f"{name}_hub/{path.stem}: {key} differ by {diff}"
        with torch.no_grad():
            logits = model(**inputs).logits[0]
        worst = max(worst, (logits - g["logits"]).abs().max().item())
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="rebuild in memory and compare, write nothing")
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help=f"only these fixtures' Hub forms (default: all of {', '.join(TEXT + VLM)})")
    args = ap.parse_args()
    if unknown := [n for n in args.names if n not in TEXT + VLM]:
        ap.error(f"no Hub form for {', '.join(unknown)} (known: {', '.join(TEXT + VLM)})")
    common.setup_torch()
    failed = []
    for name in args.names or TEXT + VLM:
        target = common.FIXTURES / f"{name}_hub"
        with tempfile.TemporaryDirectory() as tmp:
            built = Path(tmp) / f"{name}_hub"
            build(name, built)
            if args.check:
                for f in sorted(p for p in built.rglob("*") if p.is_file()):
                    rel = f.relative_to(built)
                    if not (target / rel).is_file() or (target / rel).read_bytes() != f.read_bytes():
                        failed.append(f"{name}_hub/{rel} differs from what gen_hub.py writes")
            else:
                if target.exists():
                    shutil.rmtree(target)
                shutil.copytree(built, target)
        worst = load_back(name, target)
        # The Hub form holds the same weights: transformers reads it to the goldens' logits, within the
        # check's float bound.
        ok = worst <= 2e-5
        print(f"  {name}_hub: transformers reads it back to the goldens' logits within {worst:.3e}"
              f"{'' if ok else ' (over 2e-5)'}", flush=True)
        if not ok:
            failed.append(f"{name}_hub: logits differ by {worst:.3e}")
    if failed:
        sys.exit("gen_hub: " + "; ".join(failed))


if __name__ == "__main__":
    main()
